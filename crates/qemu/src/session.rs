//! A guest session: the data channel pumped into frames and messages under
//! the boot, silence and total deadlines, the per-session channel limit, and
//! how a session ends (including the agent's last words after a cut frame).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use kloop_protocol::frame::HEADER_LEN;
use kloop_protocol::{FrameDecoder, FrameKind, Message, RecordsHeader};

use crate::config::*;
use crate::process::Vm;

/// Default for [`VmConfig::channel_limit`]: 256 MiB. The largest stream
/// kloop's own plans send (the 100,000-record load test) is about 15 MiB.
pub const DEFAULT_CHANNEL_LIMIT: u64 = 256 << 20;

/// Environment variable that sets [`VmConfig::channel_limit`] (bytes, or
/// with a `K`, `M` or `G` suffix).
pub const CHANNEL_LIMIT_ENV: &str = "KLOOP_CHANNEL_LIMIT";

/// A read shorter than this is followed by a pause of [`COALESCE`] before
/// the next one. The data port is an emulated 16550: QEMU 7.2 sends each
/// byte the guest writes with its own `sendmsg`, so a reader that blocks
/// in `read` is woken for nearly every byte — 26,277 reads for 59.5 KB in
/// one trial of `short-lived`, each with a wake-up, a `waitpid` and a
/// write to data.bin. Two milliseconds let the bytes gather instead; no
/// deadline here is finer than that.
const COALESCE_BELOW: usize = 4096;
const COALESCE: Duration = Duration::from_millis(2);

/// The per-session channel limit: [`CHANNEL_LIMIT_ENV`] if set and valid,
/// else [`DEFAULT_CHANNEL_LIMIT`].
pub fn channel_limit() -> u64 {
    std::env::var(CHANNEL_LIMIT_ENV)
        .ok()
        .and_then(|v| parse_size(&v))
        .unwrap_or(DEFAULT_CHANNEL_LIMIT)
}

/// `256 MiB`, `1.5 GiB`, `700 KiB`, `12 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            let v = n as f64 / size as f64;
            return if n.is_multiple_of(size) {
                format!("{} {unit}", n / size)
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{n} bytes")
}

pub(crate) fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, shift) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 10),
        'm' | 'M' => (&v[..v.len() - 1], 20),
        'g' | 'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// After a framing error the host keeps reading this long for the agent's
/// last words (an `AgentError` from its panic hook, which waits up to 2 s
/// for the port lock before it writes over a frame it cut) before it ends
/// the session as a protocol error.
pub const PROTOCOL_ERROR_GRACE: Duration = Duration::from_secs(3);

impl Vm {
    /// Waits for QEMU to connect to the data socket (once per VM; a
    /// session's own pump does it for [`Vm::run_session`]).
    pub fn accept_data(
        &mut self,
        deadline: Instant,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<UnixStream, SessionEnd> {
        let listener = self
            .data_listener
            .take()
            .expect("accept_data called once on a VM with a data channel");
        loop {
            match listener.accept() {
                Ok((s, _)) => return Ok(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    return Err(SessionEnd::Infrastructure(format!(
                        "accepting QEMU's data connection: {e}"
                    )))
                }
            }
            if interrupted() {
                return Err(SessionEnd::Interrupted);
            }
            if let Some(status) = self.try_wait() {
                return Err(SessionEnd::QemuExited(status));
            }
            if Instant::now() >= deadline {
                return Err(SessionEnd::Infrastructure(
                    "QEMU never connected to the data socket".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs the guest to its end, collecting every frame.
    ///
    /// Returns when the agent said `Done` (or `AgentError`) and QEMU exited,
    /// or when something went wrong; QEMU is dead on every return path.
    pub fn run_session(&mut self, interrupted: &dyn Fn() -> bool) -> GuestSession {
        let mut session = GuestSession {
            channel_limit: self.config.channel_limit,
            ..GuestSession::default()
        };
        let deadlines = self.config.deadlines;
        let total_end = self.started + deadlines.total;
        let end = match self.accept_data(self.started + deadlines.boot, interrupted) {
            Ok(mut stream) => match self.resume_restored(&mut stream, interrupted) {
                Ok(()) => self.pump(stream, &mut session, interrupted, total_end),
                // Ctrl-C while the saved VM loads is the user's, not the
                // saved VM's failure.
                Err(crate::saved_vm::SavedVmError::Interrupted) => SessionEnd::Interrupted,
                Err(why) => SessionEnd::RestoreFailed(why.to_string()),
            },
            Err(end) => end,
        };
        session.qemu_peak_rss_kib = self.peak_rss_kib();
        session.qemu_cpu_at_end = self.cpu_secs();
        let end = match end {
            SessionEnd::Done | SessionEnd::AgentError(_) => {
                // The agent powers off after its last frame.
                match self.wait_exit(POWER_OFF_WAIT) {
                    Some(_) => end,
                    None => {
                        self.shutdown();
                        end
                    }
                }
            }
            // The user wants out now: no polite QMP quit (up to 5 s).
            SessionEnd::Interrupted => {
                self.kill();
                SessionEnd::Interrupted
            }
            other => {
                self.shutdown();
                other
            }
        };
        session.exit_status = self.kill();
        session.wall = self.started.elapsed();
        session.end = Some(end);
        session
    }

    pub(crate) fn pump(
        &mut self,
        mut stream: UnixStream,
        session: &mut GuestSession,
        interrupted: &dyn Fn() -> bool,
        total_end: Instant,
    ) -> SessionEnd {
        if let Err(e) = stream.set_read_timeout(Some(Duration::from_millis(50))) {
            return SessionEnd::Infrastructure(format!("data socket: {e}"));
        }
        let mut raw = File::create(self.config.artefacts.join("data.bin")).ok();
        let mut decoder = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        let pump_started = Instant::now();
        loop {
            if interrupted() {
                return SessionEnd::Interrupted;
            }
            match stream.read(&mut buf) {
                Ok(0) => return self.channel_closed(session, &mut decoder),
                Ok(n) => {
                    // data.bin is capped like memory: feed() ends the
                    // session once the channel limit is passed.
                    if let Some(f) = raw.as_mut() {
                        let _ = f.write_all(&buf[..n]);
                    }
                    let had_hello = session.hello_at.is_some();
                    let end = session.feed(&mut decoder, &buf[..n], self.started);
                    if !had_hello && session.hello_at.is_some() {
                        session.qemu_cpu_at_hello = self.cpu_secs();
                    }
                    if end.is_some() && session.done_at.is_some() {
                        session.qemu_cpu_at_done = self.cpu_secs();
                    }
                    if let Some(end) = end {
                        return end;
                    }
                    if n < COALESCE_BELOW {
                        std::thread::sleep(COALESCE);
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return SessionEnd::Infrastructure(format!("reading data channel: {e}")),
            }
            if let Some(status) = self.try_wait() {
                // Drain what QEMU wrote before it went away.
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Some(f) = raw.as_mut() {
                        let _ = f.write_all(&buf[..n]);
                    }
                    if let Some(end) = session.feed(&mut decoder, &buf[..n], self.started) {
                        return end;
                    }
                }
                if let Some(end) = session.salvage(&mut decoder, self.started) {
                    return end;
                }
                return SessionEnd::QemuExited(status);
            }
            if let Some(end) = session.protocol_error_expired(Instant::now()) {
                return end;
            }
            if let Some(end) = self.deadline_passed(session, pump_started, total_end) {
                return end;
            }
        }
    }

    /// How the session ended when QEMU closed the data socket: it exited
    /// (or is exiting).
    fn channel_closed(
        &mut self,
        session: &mut GuestSession,
        decoder: &mut FrameDecoder,
    ) -> SessionEnd {
        let salvaged = session.salvage(decoder, self.started);
        let status = self.wait_exit(EXIT_AFTER_CLOSE);
        if let Some(end) = salvaged {
            return end;
        }
        match status {
            Some(s) => SessionEnd::QemuExited(s),
            None => {
                SessionEnd::Infrastructure("QEMU closed the data channel but kept running".into())
            }
        }
    }

    /// The deadline that has passed, if any: the boot (no hello yet), the
    /// silence since the last frame (after the hello), the total.
    fn deadline_passed(
        &self,
        session: &GuestSession,
        pump_started: Instant,
        total_end: Instant,
    ) -> Option<SessionEnd> {
        let deadlines = self.config.deadlines;
        let now = Instant::now();
        if session.hello_at.is_none() && now >= self.started + deadlines.boot {
            return Some(SessionEnd::BootTimeout(deadlines.boot));
        }
        let last_frame = session
            .last_frame_at
            .map_or(pump_started, |d| self.started + d);
        if session.hello_at.is_some() && now.duration_since(last_frame) >= deadlines.silence {
            return Some(SessionEnd::Silent(deadlines.silence));
        }
        if now >= total_end {
            return Some(SessionEnd::TotalTimeout(deadlines.total));
        }
        None
    }
}

/// How a guest session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The agent sent `Done`.
    Done,
    /// The agent reported an error of its own.
    AgentError(String),
    /// No hello within the boot deadline.
    BootTimeout(Duration),
    /// The agent went silent (no heartbeat) after its hello.
    Silent(Duration),
    TotalTimeout(Duration),
    /// QEMU exited before the agent finished.
    QemuExited(ExitStatus),
    /// Bad bytes on the data channel.
    Protocol(String),
    Infrastructure(String),
    Interrupted,
    /// A restored guest never ran with its plan (QEMU could not load the
    /// saved VM, or the plan could not be written): nothing of the trial
    /// happened, so the caller boots cold instead.
    RestoreFailed(String),
}

/// What the guest sent, in order, plus timing.
#[derive(Debug, Default)]
pub struct GuestSession {
    pub messages: Vec<Message>,
    pub streams: BTreeMap<u32, Vec<u8>>,
    /// Time from QEMU start to the hello frame.
    pub hello_at: Option<Duration>,
    /// Time from QEMU start to the done frame.
    pub done_at: Option<Duration>,
    /// CPU seconds QEMU had used when the hello / done frame arrived.
    pub qemu_cpu_at_hello: Option<f64>,
    pub qemu_cpu_at_done: Option<f64>,
    /// CPU seconds QEMU had used when the session ended, read before QEMU
    /// is stopped: tells a guest that a loaded host starved (little CPU)
    /// from one that hung (spinning: much; halted: little, with the host idle).
    pub qemu_cpu_at_end: Option<f64>,
    pub wall: Duration,
    pub bytes: u64,
    pub end: Option<SessionEnd>,
    pub exit_status: Option<ExitStatus>,
    /// Time from QEMU start to the last complete frame (heartbeats included).
    pub last_frame_at: Option<Duration>,
    /// An incomplete frame left when the channel closed: (stream offset, bytes).
    pub trailing: Option<(u64, usize)>,
    /// QEMU's peak resident memory (`VmHWM`), read when the session ended
    /// while QEMU was still there to ask.
    pub qemu_peak_rss_kib: Option<u64>,
    /// Bytes received per listener stream when each step started (step
    /// index, listener → length): which records were drained before a step.
    pub step_marks: Vec<(u32, BTreeMap<u32, u64>)>,
    /// Most channel bytes this session takes; 0 means
    /// [`DEFAULT_CHANNEL_LIMIT`]. What the host keeps (streams, messages,
    /// data.bin) is never more than what it took.
    pub channel_limit: u64,
    /// The first framing error and when it was seen: the session waits
    /// [`PROTOCOL_ERROR_GRACE`] for the agent's last words before it ends
    /// with it.
    pub protocol_error: Option<(String, Instant)>,
}

impl GuestSession {
    /// Takes bytes as they arrive from the data channel and decodes every
    /// complete frame; returns how the session ends if these bytes end it.
    /// A framing error ends it with [`SessionEnd::Protocol`] naming the
    /// stream offset. The decoder never holds more than one frame.
    pub fn feed(
        &mut self,
        decoder: &mut FrameDecoder,
        bytes: &[u8],
        started: Instant,
    ) -> Option<SessionEnd> {
        self.bytes += bytes.len() as u64;
        let limit = self.limit();
        if self.bytes > limit {
            return Some(SessionEnd::Infrastructure(format!(
                "the guest sent more than {} on the data channel, the limit of one VM session ({CHANNEL_LIMIT_ENV}, default {}): a runaway agent or plan; kloop stopped reading so the host's memory and disk stay bounded. If the plan really needs more, raise {CHANNEL_LIMIT_ENV} (e.g. {CHANNEL_LIMIT_ENV}=1G)",
                human_bytes(limit),
                human_bytes(DEFAULT_CHANNEL_LIMIT)
            )));
        }
        decoder.push(bytes);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    self.last_frame_at = Some(started.elapsed());
                    let end = if let Some((cut, _)) = &self.protocol_error {
                        let cut = format!("the channel error was: {cut}");
                        self.last_words(&frame, &cut)
                    } else {
                        self.accept(frame, started)
                    };
                    if let Some(end) = end {
                        return Some(end);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The decoder has skipped to the next magic. Keep
                    // reading for a while: an agent that panics in the
                    // middle of a frame still sends its panic message
                    // after the cut frame, and that is the verdict.
                    if self.protocol_error.is_none() {
                        self.protocol_error = Some((
                            format!("{e} (the channel carries only frames: bytes outside them mean the agent wrote around its framing or the channel corrupted them)"),
                            Instant::now(),
                        ));
                    }
                }
            }
        }
        debug_assert!(decoder.pending() < HEADER_LEN + kloop_protocol::MAX_PAYLOAD);
        None
    }

    fn limit(&self) -> u64 {
        if self.channel_limit == 0 {
            DEFAULT_CHANNEL_LIMIT
        } else {
            self.channel_limit
        }
    }

    /// After a framing error only the agent's own error report counts:
    /// everything else that still arrives is dropped unjudged. `cut` says
    /// what broke the channel before it.
    fn last_words(&mut self, frame: &kloop_protocol::RawFrame, cut: &str) -> Option<SessionEnd> {
        if frame.kind != FrameKind::Message {
            return None;
        }
        let msg = serde_json::from_slice::<Message>(&frame.payload).ok()?;
        let Message::AgentError { step, message } = &msg else {
            return None;
        };
        let what = match step {
            Some(s) => format!("step {s}: {message}"),
            None => message.clone(),
        };
        self.messages.push(msg);
        Some(SessionEnd::AgentError(format!(
            "{what}\n(its report came after a frame it cut short: {cut})"
        )))
    }

    /// The pending framing error once its grace period is over.
    pub fn protocol_error_expired(&self, now: Instant) -> Option<SessionEnd> {
        let (e, at) = self.protocol_error.as_ref()?;
        (now.duration_since(*at) >= PROTOCOL_ERROR_GRACE).then(|| SessionEnd::Protocol(e.clone()))
    }

    /// When the channel has ended: looks for the agent's last words inside
    /// an incomplete frame it left (a panic hook that wrote over a frame the
    /// panicking thread had started), then ends with a pending framing
    /// error if there is one. `None`: nothing to report beyond how QEMU
    /// exited (an incomplete frame is noted in `trailing`).
    pub fn salvage(&mut self, decoder: &mut FrameDecoder, started: Instant) -> Option<SessionEnd> {
        if decoder.pending() > 0 {
            let (cut_at, cut_len) = (decoder.consumed(), decoder.pending());
            self.trailing = Some((cut_at, cut_len));
            let cut = format!(
                "the frame at stream offset {cut_at} never completed ({cut_len} byte(s) pending when the channel closed)"
            );
            decoder.abandon_head();
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => {
                        self.last_frame_at = Some(started.elapsed());
                        if let Some(end) = self.last_words(&frame, &cut) {
                            return Some(end);
                        }
                    }
                    Ok(None) => break,
                    // The decoder skipped to the next magic: go on.
                    Err(_) => {}
                }
            }
        }
        self.protocol_error
            .as_ref()
            .map(|(e, _)| SessionEnd::Protocol(e.clone()))
    }

    /// Takes one frame; returns how the session ends if this frame ends it.
    fn accept(&mut self, frame: kloop_protocol::RawFrame, started: Instant) -> Option<SessionEnd> {
        match frame.kind {
            FrameKind::Records => match RecordsHeader::split(&frame.payload) {
                Some((h, bytes)) => {
                    let stream = self.streams.entry(h.listener).or_default();
                    if h.stream_offset != stream.len() as u64 {
                        return Some(SessionEnd::Protocol(format!(
                            "records frame at stream offset {} for listener {} starts at ring offset {} but {} bytes were received before",
                            frame.offset,
                            h.listener,
                            h.stream_offset,
                            stream.len()
                        )));
                    }
                    stream.extend_from_slice(bytes);
                    None
                }
                None => Some(SessionEnd::Protocol(format!(
                    "records frame at stream offset {} is shorter than its header",
                    frame.offset
                ))),
            },
            FrameKind::Message => {
                let msg: Message = match serde_json::from_slice(&frame.payload) {
                    Ok(m) => m,
                    Err(e) => {
                        return Some(SessionEnd::Protocol(format!(
                            "message frame at stream offset {} does not decode: {e}",
                            frame.offset
                        )))
                    }
                };
                let end = match &msg {
                    Message::Hello {
                        protocol_version, ..
                    } => {
                        self.hello_at = Some(started.elapsed());
                        if *protocol_version != kloop_protocol::PROTOCOL_VERSION {
                            Some(SessionEnd::Protocol(format!(
                                "guest agent speaks protocol {protocol_version}, host speaks {}; rebuild the agent",
                                kloop_protocol::PROTOCOL_VERSION
                            )))
                        } else {
                            None
                        }
                    }
                    Message::Done { .. } => {
                        self.done_at = Some(started.elapsed());
                        Some(SessionEnd::Done)
                    }
                    Message::AgentError { step, message } => {
                        Some(SessionEnd::AgentError(match step {
                            Some(s) => format!("step {s}: {message}"),
                            None => message.clone(),
                        }))
                    }
                    _ => None,
                };
                if let Message::StepStart { index, .. } = &msg {
                    let lens = self
                        .streams
                        .iter()
                        .map(|(l, s)| (*l, s.len() as u64))
                        .collect();
                    self.step_marks.push((*index, lens));
                }
                if !matches!(msg, Message::Heartbeat { .. }) {
                    self.messages.push(msg);
                }
                end
            }
        }
    }
}
