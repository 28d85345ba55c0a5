//! One QEMU guest: command line, accelerator, QMP, the data channel, deadlines.
//!
//! QEMU is always started from an argv, never a shell string. It is killed
//! when the [`Vm`] is dropped, and — through `PR_SET_PDEATHSIG` — when the
//! harness itself dies, so no QEMU outlives the process that started it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kloop_protocol::{FrameDecoder, FrameKind, Message, RecordsHeader};

/// Debian package that provides the QEMU binary.
pub const QEMU_PACKAGE: &str = "qemu-system-x86";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long each phase of a guest's life may take.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// From QEMU start to the agent's hello.
    pub boot: Duration,
    /// Longest silence on the data channel once the agent said hello.
    pub silence: Duration,
    /// The whole run, boot included.
    pub total: Duration,
}

impl Deadlines {
    /// Defaults scaled for the accelerator: TCG is several times slower.
    pub fn for_accel(accel: Accel) -> Self {
        let scale = match accel {
            Accel::Kvm => 1,
            Accel::Tcg => 3,
        };
        let scale_env = std::env::var("KLOOP_DEADLINE_SCALE")
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(1)
            .max(1);
        let s = scale * scale_env;
        Deadlines {
            boot: Duration::from_secs(20 * u64::from(s)),
            silence: Duration::from_secs(10 * u64::from(s)),
            total: Duration::from_secs(120 * u64::from(s)),
        }
    }
}

/// Everything needed to boot one guest.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Extra kernel command line words.
    pub cmdline: Vec<String>,
    /// Where console.log and data.bin are written; kept after the run.
    pub artefacts: PathBuf,
    pub deadlines: Deadlines,
    /// Whether the guest uses the data channel (the KVM probe does not).
    pub data_channel: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("QEMU not found ({0}); install it with `apt-get install {QEMU_PACKAGE}` or point KLOOP_QEMU at a qemu-system-x86_64 binary")]
    QemuMissing(String),
    #[error("could not start QEMU `{qemu}`: {source}")]
    Spawn {
        qemu: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// Finds the QEMU binary: `KLOOP_QEMU`, else `qemu-system-x86_64` on PATH.
pub fn find_qemu() -> Result<PathBuf, VmError> {
    if let Some(p) = std::env::var_os("KLOOP_QEMU") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(VmError::QemuMissing(format!(
                "KLOOP_QEMU={} does not exist",
                p.display()
            )))
        };
    }
    find_in_path("qemu-system-x86_64")
        .ok_or_else(|| VmError::QemuMissing("qemu-system-x86_64 is not on PATH".into()))
}

pub(crate) fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `qemu-system-x86_64 --version`, first line.
pub fn qemu_version(qemu: &Path) -> Option<String> {
    let out = Command::new(qemu).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|s| s.trim().to_string())
}

impl VmConfig {
    /// The QEMU argv (without the binary) for this guest, given the paths of
    /// the QMP and data sockets.
    pub fn argv(&self, qmp_sock: &Path, data_sock: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(s.into());
        push("-nodefaults");
        push("-no-user-config");
        push("-nographic");
        push("-no-reboot");
        push("-machine");
        push("pc");
        match self.accel {
            Accel::Kvm => {
                push("-accel");
                push("kvm");
                push("-cpu");
                push("host");
            }
            Accel::Tcg => {
                push("-accel");
                // One thread round-robins the vCPUs: scheduling is
                // reproducible, and it is what -icount measurement runs need.
                // With 2 host cores kloop runs VMs in parallel instead.
                push("tcg,thread=single");
                push("-cpu");
                // QEMU 7.2's TCG computes EFLAGS after CMPXCHG16B from stale
                // lazy-flag state: a kernel pointer lands in RFLAGS (TF, NT,
                // AC set at random) and 6.12's SLUB fast path
                // (`cmpxchg16b %gs:`) panicked about one boot in three. Without
                // the feature, kernels take their software path: 0 panics in 51
                // boots of 6.12.
                push("max,-cx16");
            }
        }
        push("-m");
        push(&self.memory_mib.to_string());
        push("-smp");
        push(&self.cpus.to_string());
        let mut cmdline = vec![
            "console=ttyS0".to_string(),
            // A panic reboots at once and -no-reboot turns that into a QEMU
            // exit, so a panicking guest never sits until a deadline.
            "panic=-1".to_string(),
            "oops=panic".to_string(),
            "loglevel=4".to_string(),
        ];
        cmdline.extend(self.cmdline.iter().cloned());
        a.push("-kernel".into());
        a.push(self.kernel.clone().into_os_string());
        if let Some(initrd) = &self.initramfs {
            a.push("-initrd".into());
            a.push(initrd.clone().into_os_string());
        }
        a.push("-append".into());
        a.push(cmdline.join(" ").into());
        let console = self.artefacts.join("console.log");
        a.push("-chardev".into());
        a.push(chardev_arg("file,id=console,path=", &console));
        a.push("-serial".into());
        a.push("chardev:console".into());
        if self.data_channel {
            a.push("-chardev".into());
            a.push(chardev_arg("socket,id=data,server=off,path=", data_sock));
            a.push("-serial".into());
            a.push("chardev:data".into());
        }
        a.push("-qmp".into());
        let mut qmp = chardev_arg("unix:", qmp_sock);
        qmp.push(",server=on,wait=off");
        a.push(qmp);
        a
    }
}

/// QEMU option values are comma-separated: a comma in a path must be doubled.
fn chardev_arg(prefix: &str, path: &Path) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(path.to_string_lossy().replace(',', ",,"));
    s
}

/// A running QEMU. Dropping it kills QEMU and reaps it.
pub struct Vm {
    child: Option<Child>,
    // Sockets live in a short private directory (sun_path is 108 bytes).
    _sockets: tempfile::TempDir,
    qmp_path: PathBuf,
    data_listener: Option<UnixListener>,
    pub started: Instant,
    pub config: VmConfig,
}

impl Vm {
    pub fn spawn(config: VmConfig) -> Result<Vm, VmError> {
        std::fs::create_dir_all(&config.artefacts).map_err(io_err(format!(
            "creating artefact directory {}",
            config.artefacts.display()
        )))?;
        let sockets = tempfile::Builder::new()
            .prefix("kloop-vm-")
            .tempdir()
            .map_err(io_err("creating a socket directory under $TMPDIR"))?;
        let qmp_path = sockets.path().join("qmp.sock");
        let data_path = sockets.path().join("data.sock");
        // We listen, QEMU connects as a client at start-up: nothing the guest
        // writes can be lost before the host is ready.
        let data_listener = if config.data_channel {
            let l = UnixListener::bind(&data_path).map_err(io_err(format!(
                "binding data socket {}",
                data_path.display()
            )))?;
            l.set_nonblocking(true)
                .map_err(io_err("setting data socket non-blocking"))?;
            Some(l)
        } else {
            None
        };
        let mut cmd = Command::new(&config.qemu);
        cmd.args(config.argv(&qmp_path, &data_path))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                File::create(config.artefacts.join("qemu.stderr"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        // SAFETY: prctl is async-signal-safe; nothing else runs in pre_exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let child = cmd.spawn().map_err(|source| VmError::Spawn {
            qemu: config.qemu.clone(),
            source,
        })?;
        Ok(Vm {
            child: Some(child),
            _sockets: sockets,
            qmp_path,
            data_listener,
            started,
            config,
        })
    }

    pub fn console_path(&self) -> PathBuf {
        self.config.artefacts.join("console.log")
    }

    /// `Some(status)` once QEMU has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `limit` for QEMU to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks QEMU to quit over QMP, then kills it if it lingers.
    pub fn shutdown(&mut self) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            let _ = self.qmp_quit();
            if let Some(s) = self.wait_exit(Duration::from_secs(2)) {
                return Some(s);
            }
        }
        self.kill()
    }

    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        let _ = child.kill();
        child.wait().ok()
    }

    fn qmp_connect(&self) -> io::Result<UnixStream> {
        let s = UnixStream::connect(&self.qmp_path)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.set_write_timeout(Some(Duration::from_secs(3)))?;
        Ok(s)
    }

    /// Which accelerator QEMU really runs with, asked over QMP.
    pub fn qmp_query_kvm(&self) -> io::Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let stream = loop {
            match self.qmp_connect() {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut qmp = qapi::Qmp::from_stream(&stream);
        qmp.handshake().map_err(qmp_io)?;
        let info = qmp.execute(&qapi::qmp::query_kvm {}).map_err(qmp_io)?;
        Ok(info.enabled && info.present)
    }

    fn qmp_quit(&self) -> io::Result<()> {
        let stream = self.qmp_connect()?;
        let mut qmp = qapi::Qmp::from_stream(&stream);
        qmp.handshake().map_err(qmp_io)?;
        // QEMU may close the socket before answering; either is fine.
        let _ = qmp.execute(&qapi::qmp::quit {});
        Ok(())
    }

    /// Waits for QEMU to connect to the data socket.
    fn accept_data(&mut self, deadline: Instant) -> Result<UnixStream, SessionEnd> {
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
        let mut session = GuestSession::default();
        let deadlines = self.config.deadlines;
        let total_end = self.started + deadlines.total;
        let end = match self.accept_data(self.started + deadlines.boot) {
            Ok(stream) => self.pump(stream, &mut session, interrupted, total_end),
            Err(end) => end,
        };
        let end = match end {
            SessionEnd::Done | SessionEnd::AgentError(_) => {
                // The agent powers off after its last frame.
                match self.wait_exit(Duration::from_secs(10)) {
                    Some(_) => end,
                    None => {
                        self.shutdown();
                        end
                    }
                }
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

    fn pump(
        &mut self,
        mut stream: UnixStream,
        session: &mut GuestSession,
        interrupted: &dyn Fn() -> bool,
        total_end: Instant,
    ) -> SessionEnd {
        let deadlines = self.config.deadlines;
        if let Err(e) = stream.set_read_timeout(Some(Duration::from_millis(50))) {
            return SessionEnd::Infrastructure(format!("data socket: {e}"));
        }
        let mut raw = File::create(self.config.artefacts.join("data.bin")).ok();
        let mut decoder = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_frame = Instant::now();
        loop {
            if interrupted() {
                return SessionEnd::Interrupted;
            }
            match stream.read(&mut buf) {
                Ok(0) => {
                    // QEMU closed the socket: it exited (or is exiting).
                    let status = self.wait_exit(Duration::from_secs(2));
                    return match status {
                        Some(s) => SessionEnd::QemuExited(s),
                        None => SessionEnd::Infrastructure(
                            "QEMU closed the data channel but kept running".into(),
                        ),
                    };
                }
                Ok(n) => {
                    session.bytes += n as u64;
                    if let Some(f) = raw.as_mut() {
                        let _ = f.write_all(&buf[..n]);
                    }
                    decoder.push(&buf[..n]);
                    loop {
                        match decoder.next_frame() {
                            Ok(Some(frame)) => {
                                last_frame = Instant::now();
                                if let Some(end) = session.accept(frame, self.started) {
                                    return end;
                                }
                            }
                            Ok(None) => break,
                            Err(e) => return SessionEnd::Protocol(e.to_string()),
                        }
                    }
                    if decoder.pending() > 2 * kloop_protocol::MAX_PAYLOAD {
                        return SessionEnd::Protocol(format!(
                            "{} undecodable bytes buffered at stream offset {}",
                            decoder.pending(),
                            decoder.consumed()
                        ));
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
                continue_drain(&mut stream, &mut decoder, session, self.started);
                if let Some(end) = session.terminal.take() {
                    return end;
                }
                return SessionEnd::QemuExited(status);
            }
            let now = Instant::now();
            if session.hello_at.is_none() && now >= self.started + deadlines.boot {
                return SessionEnd::BootTimeout(deadlines.boot);
            }
            if session.hello_at.is_some() && now.duration_since(last_frame) >= deadlines.silence {
                return SessionEnd::Silent(deadlines.silence);
            }
            if now >= total_end {
                return SessionEnd::TotalTimeout(deadlines.total);
            }
        }
    }
}

fn continue_drain(
    stream: &mut UnixStream,
    decoder: &mut FrameDecoder,
    session: &mut GuestSession,
    started: Instant,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        decoder.push(&buf[..n]);
        while let Ok(Some(frame)) = decoder.next_frame() {
            if let Some(end) = session.accept(frame, started) {
                session.terminal = Some(end);
                return;
            }
        }
    }
}

fn qmp_io(e: qapi::ExecuteError) -> io::Error {
    io::Error::other(format!("QMP: {e}"))
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
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
}

/// What the guest sent, in order, plus timing.
#[derive(Debug, Default)]
pub struct GuestSession {
    pub messages: Vec<Message>,
    pub streams: BTreeMap<u32, Vec<u8>>,
    /// Time from QEMU start to the hello frame.
    pub hello_at: Option<Duration>,
    pub wall: Duration,
    pub bytes: u64,
    pub end: Option<SessionEnd>,
    pub exit_status: Option<ExitStatus>,
    terminal: Option<SessionEnd>,
}

impl GuestSession {
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
                    Message::Done { .. } => Some(SessionEnd::Done),
                    Message::AgentError { step, message } => {
                        Some(SessionEnd::AgentError(match step {
                            Some(s) => format!("step {s}: {message}"),
                            None => message.clone(),
                        }))
                    }
                    _ => None,
                };
                if !matches!(msg, Message::Heartbeat { .. }) {
                    self.messages.push(msg);
                }
                end
            }
        }
    }
}

/// The last `n` lines of a console log (lossy UTF-8).
pub fn console_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return format!("(no console log at {})", path.display());
    };
    let lines: Vec<String> = BufReader::new(f)
        .split(b'\n')
        .map_while(Result::ok)
        .map(|l| {
            String::from_utf8_lossy(&l)
                .trim_end_matches('\r')
                .to_string()
        })
        .collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// The panic lines of a console log, if the kernel panicked.
pub fn console_panic(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("Kernel panic - not syncing"))?;
    // Oops details come before the panic line; keep some context.
    let start = lines[..at]
        .iter()
        .rposition(|l| {
            l.contains("BUG:") || l.contains("Oops") || l.contains("------------[ cut here")
        })
        .unwrap_or(at.saturating_sub(5));
    let end = (at + 3).min(lines.len());
    Some(lines[start..end].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_has_no_shell_and_escapes_commas() {
        let cfg = VmConfig {
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            kernel: "/k/vmlinuz".into(),
            initramfs: Some("/k/init.cpio".into()),
            accel: Accel::Tcg,
            cpus: 2,
            memory_mib: 256,
            cmdline: vec![],
            artefacts: "/runs/a,b".into(),
            deadlines: Deadlines::for_accel(Accel::Tcg),
            data_channel: true,
        };
        let argv: Vec<String> = cfg
            .argv(Path::new("/s/qmp.sock"), Path::new("/s/data.sock"))
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(argv.contains(&"file,id=console,path=/runs/a,,b/console.log".to_string()));
        assert!(argv.contains(&"socket,id=data,server=off,path=/s/data.sock".to_string()));
        assert!(argv.contains(&"unix:/s/qmp.sock,server=on,wait=off".to_string()));
        let append = argv.iter().position(|a| a == "-append").unwrap();
        assert!(argv[append + 1].starts_with("console=ttyS0 panic=-1"));
        assert_eq!(argv.iter().filter(|a| *a == "-serial").count(), 2);
    }

    #[test]
    fn console_panic_finds_the_panic_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("console.log");
        std::fs::write(
            &p,
            "booting\nok\nsysrq: Trigger a crash\nKernel panic - not syncing: sysrq triggered crash\nCPU: 0 PID: 1\n",
        )
        .unwrap();
        let panic = console_panic(&p).unwrap();
        assert!(panic.contains("Kernel panic - not syncing: sysrq triggered crash"));
        std::fs::write(&p, "booting\nall fine\n").unwrap();
        assert!(console_panic(&p).is_none());
        assert_eq!(console_tail(&p, 1), "all fine");
    }
}
