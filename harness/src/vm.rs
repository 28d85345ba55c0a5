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

use kloop_protocol::frame::HEADER_LEN;
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
    /// Under TCG, `-icount shift=0,sleep=off`: the guest clock counts
    /// instructions (1 ns each) and idle time is skipped, so timings measured
    /// in the guest repeat from run to run. Ignored under KVM.
    pub icount: bool,
    /// Most bytes the host takes from the data channel in one session
    /// ([`channel_limit`]); past it the session ends as infrastructure.
    pub channel_limit: u64,
}

/// Default for [`VmConfig::channel_limit`]: 256 MiB. The largest stream
/// kloop's own plans send (the 100,000-record load test) is about 15 MiB.
pub const DEFAULT_CHANNEL_LIMIT: u64 = 256 << 20;

/// Environment variable that sets [`VmConfig::channel_limit`] (bytes, or
/// with a `K`, `M` or `G` suffix).
pub const CHANNEL_LIMIT_ENV: &str = "KLOOP_CHANNEL_LIMIT";

/// The per-session channel limit: [`CHANNEL_LIMIT_ENV`] if set and valid,
/// else [`DEFAULT_CHANNEL_LIMIT`].
pub fn channel_limit() -> u64 {
    std::env::var(CHANNEL_LIMIT_ENV)
        .ok()
        .and_then(|v| parse_size(&v))
        .unwrap_or(DEFAULT_CHANNEL_LIMIT)
}

/// `256 MiB`, `1.5 GiB`, `700 KiB`, `12 bytes`.
fn human_bytes(n: u64) -> String {
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

fn parse_size(v: &str) -> Option<u64> {
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

/// After the data channel closes, how long QEMU gets to exit.
pub const EXIT_AFTER_CLOSE: Duration = Duration::from_secs(2);

/// After the agent's last frame (`Done`, `AgentError`), how long it gets
/// to power the VM off before QEMU is shut down.
pub const POWER_OFF_WAIT: Duration = Duration::from_secs(10);

/// How long a QMP `quit` gets before QEMU is killed.
pub const QUIT_WAIT: Duration = Duration::from_secs(2);

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
                if self.icount {
                    push("-icount");
                    push("shift=0,sleep=off");
                }
            }
        }
        if let Some(bios) = firmware() {
            push("-bios");
            a.push(bios.into_os_string());
        }
        let mut push = |s: &str| a.push(s.into());
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
            // The crypto manager's self-tests of every registered algorithm
            // (crypto_algapi_init → crypto_start_tests) are the largest
            // single initcall under TCG: ~0.25 s of QEMU CPU per boot on 6.1.
            // kloop tests no crypto.
            "cryptomgr.notests".to_string(),
            // A preset loops-per-jiffy skips the delay-loop calibration on
            // every CPU. Under TCG the second CPU's calibration fails its
            // consistency check and retries ("Probably due to long
            // platform interrupts. Consider using lpj="): boot→hello on 6.1
            // went 1.97 → 1.58 s with it (5 boots each). udelay() runs on
            // the TSC, so the value (2.5 GHz at HZ=250) only feeds the
            // BogoMIPS line and the loop fallback.
            "lpj=10000000".to_string(),
            // check_timer() panics "IO-APIC + timer doesn't work!" when the
            // PIT's interrupt does not arrive within its busy-wait window,
            // which a loaded host running TCG can make it miss (seen twice
            // in a day of runs with five builds competing for 2 cores).
            "no_timer_check".to_string(),
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
        // For experiments with QEMU options (firmware, devices): appended
        // last, so they override.
        if let Some(extra) = std::env::var_os("KLOOP_QEMU_ARGS") {
            a.extend(
                extra
                    .to_string_lossy()
                    .split_whitespace()
                    .map(OsString::from),
            );
        }
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
        // QEMU gets its own process group: a Ctrl-C at the terminal reaches
        // the harness only, which then ends each trial as interrupted and
        // kills its VM itself (instead of racing QEMU's own SIGINT exit).
        cmd.process_group(0);
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

    /// QEMU's peak resident set so far (`VmHWM` in /proc), while it runs.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        parse_vm_hwm(&status)
    }

    /// CPU time QEMU has used so far (user + system), while it runs. Unlike
    /// wall time this barely moves when other processes compete for the
    /// host's cores, so boot options can be compared on a busy machine.
    pub fn cpu_secs(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        parse_stat_cpu_ticks(&stat).map(|t| t as f64 / ticks.max(1) as f64)
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
            if let Some(s) = self.wait_exit(QUIT_WAIT) {
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
    fn accept_data(
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
            Ok(stream) => self.pump(stream, &mut session, interrupted, total_end),
            Err(end) => end,
        };
        session.qemu_peak_rss_kib = self.peak_rss_kib();
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
        let pump_started = Instant::now();
        loop {
            if interrupted() {
                return SessionEnd::Interrupted;
            }
            match stream.read(&mut buf) {
                Ok(0) => {
                    // QEMU closed the socket: it exited (or is exiting).
                    let salvaged = session.salvage(&mut decoder, self.started);
                    let status = self.wait_exit(EXIT_AFTER_CLOSE);
                    if let Some(end) = salvaged {
                        return end;
                    }
                    return match status {
                        Some(s) => SessionEnd::QemuExited(s),
                        None => SessionEnd::Infrastructure(
                            "QEMU closed the data channel but kept running".into(),
                        ),
                    };
                }
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
            let now = Instant::now();
            if session.hello_at.is_none() && now >= self.started + deadlines.boot {
                return SessionEnd::BootTimeout(deadlines.boot);
            }
            let last_frame = session
                .last_frame_at
                .map_or(pump_started, |d| self.started + d);
            if session.hello_at.is_some() && now.duration_since(last_frame) >= deadlines.silence {
                return SessionEnd::Silent(deadlines.silence);
            }
            if now >= total_end {
                return SessionEnd::TotalTimeout(deadlines.total);
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
    /// Time from QEMU start to the done frame.
    pub done_at: Option<Duration>,
    /// CPU seconds QEMU had used when the hello / done frame arrived.
    pub qemu_cpu_at_hello: Option<f64>,
    pub qemu_cpu_at_done: Option<f64>,
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

/// How a process ended, in words after its name: `exited with code 1`,
/// `was killed by signal 9 (SIGKILL)`.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    if let Some(sig) = status.signal() {
        return format!("was killed by signal {sig} ({})", signal_name(sig));
    }
    format!("ended ({status})")
}

/// `SIGKILL` for 9; `signal N` for numbers without a common name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// utime + stime (clock ticks) from the text of `/proc/<pid>/stat`. The
/// command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Where Debian's qemu-system-data puts qboot.
const QBOOT: &str = "/usr/share/qemu/qboot.rom";

/// The `-bios` image: `KLOOP_FIRMWARE` (`seabios` for QEMU's default, or a
/// path), else qboot when installed. qboot skips SeaBIOS's device probing
/// and option-ROM scan: 0.53 → 0.28 s from QEMU's start to the kernel's
/// clock on 6.1 under TCG (`cargo xtask bench`, 3 boots each).
fn firmware() -> Option<PathBuf> {
    match std::env::var_os("KLOOP_FIRMWARE") {
        Some(f) if f == "seabios" => None,
        Some(f) if !f.is_empty() => Some(PathBuf::from(f)),
        _ => Some(PathBuf::from(QBOOT)).filter(|p| p.is_file()),
    }
}

/// `VmHWM` in kB from the text of `/proc/<pid>/status`.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The last `n` lines of a console log (lossy UTF-8).
pub fn console_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return format!("(no console log at {})", path.display());
    };
    let lines: Vec<String> = BufReader::new(f)
        .split(b'\n')
        .map_while(Result::ok)
        .map(|l| printable(&String::from_utf8_lossy(&l)))
        .collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// A console line without terminal escape sequences (the firmware clears
/// the screen) or other control characters.
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                // CSI: parameters and intermediates up to a final byte;
                // otherwise a two-character escape such as `ESC c`.
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('\x40'..='\x7e').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The panic lines of a console log, if the kernel panicked.
pub fn console_panic(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<String> = text.lines().map(printable).collect();
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
    let mut out = lines[start..end].to_vec();
    // The firmware's last words often share the kernel's first line: put the
    // panic's timestamp at the start of its own line.
    let panic = &mut out[at - start];
    let p = panic.find("Kernel panic - not syncing").unwrap_or(0);
    if let Some(i) = panic[..p].rfind('[').filter(|&i| i > 0) {
        let rest = panic.split_off(i);
        out.insert(at - start + 1, rest);
    }
    Some(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_protocol::encode_frame;

    #[test]
    fn vm_hwm_is_read_from_proc_status() {
        // From a real /proc/<pid>/stat of QEMU, the name altered to hold
        // the characters that make naive splitting wrong.
        let stat = "4321 (qemu (x) y) S 1 4321 4321 0 -1 4194560 9411 0 0 0 250 37 0 0 20 0 3 0 5511 1 2 3";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(287));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        let status = "Name:\tqemu\nVmPeak:\t 900 kB\nVmHWM:\t  345612 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(345612));
        assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
        // Our own process has one, so the real file parses too.
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_vm_hwm(&own).unwrap() > 0);
    }

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
            icount: false,
            channel_limit: DEFAULT_CHANNEL_LIMIT,
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

    fn hello() -> Message {
        Message::Hello {
            protocol_version: kloop_protocol::PROTOCOL_VERSION,
            agent_version: "t".into(),
            uname: Default::default(),
            online_cpus: vec![0],
            monotonic_ns: 1,
        }
    }

    /// Feeds `stream` in `chunk`-byte reads; returns the session, how it
    /// ended (if it did) and the decoder.
    fn feed_all(stream: &[u8], chunk: usize) -> (GuestSession, Option<SessionEnd>, FrameDecoder) {
        let mut s = GuestSession::default();
        let mut d = FrameDecoder::new();
        let started = Instant::now();
        for c in stream.chunks(chunk) {
            if let Some(end) = s.feed(&mut d, c, started) {
                return (s, Some(end), d);
            }
            assert!(d.pending() < HEADER_LEN + kloop_protocol::MAX_PAYLOAD);
        }
        // A framing error ends the session once its grace period is over.
        let end = s.protocol_error_expired(Instant::now() + PROTOCOL_ERROR_GRACE);
        (s, end, d)
    }

    fn protocol_error(end: Option<SessionEnd>) -> String {
        match end {
            Some(SessionEnd::Protocol(m)) => m,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn session_collects_frames_in_any_read_size() {
        let mut stream = hello().to_frame();
        for f in kloop_protocol::records_frames(0, 0, &[1u8; 100_000]) {
            stream.extend(f);
        }
        stream.extend(
            Message::Done {
                records_bytes: 100_000,
            }
            .to_frame(),
        );
        for chunk in [1, 13, 64 * 1024] {
            let (s, end, _) = feed_all(&stream, chunk);
            assert_eq!(end, Some(SessionEnd::Done), "chunk {chunk}");
            assert_eq!(s.streams[&0].len(), 100_000);
            assert!(s.hello_at.is_some() && s.last_frame_at.is_some());
            assert_eq!(s.bytes as usize, stream.len());
        }
    }

    #[test]
    fn records_with_a_wrong_stream_offset_are_a_protocol_error() {
        let mut stream = hello().to_frame();
        stream.extend(kloop_protocol::records_frames(2, 0, &[1u8; 40]).concat());
        let at = stream.len();
        // A chunk claiming to start at 48 while 40 bytes arrived: a gap.
        stream.extend(kloop_protocol::records_frames(2, 48, &[1u8; 8]).concat());
        let m = protocol_error(feed_all(&stream, 4096).1);
        assert!(
            m.contains(&format!("stream offset {at}"))
                && m.contains("listener 2")
                && m.contains("ring offset 48")
                && m.contains("40 bytes"),
            "{m}"
        );
    }

    #[test]
    fn short_records_and_bad_messages_name_their_offset() {
        let h = hello().to_frame();
        let mut stream = h.clone();
        stream.extend(encode_frame(FrameKind::Records, &[0u8; 5]));
        let m = protocol_error(feed_all(&stream, 4096).1);
        assert!(
            m.contains(&format!("stream offset {}", h.len())) && m.contains("shorter"),
            "{m}"
        );
        for payload in [
            &b"{not json"[..],
            br#"{"msg":"launch-missiles"}"#,
            b"\xff\xfe",
        ] {
            let mut stream = h.clone();
            stream.extend(encode_frame(FrameKind::Message, payload));
            let m = protocol_error(feed_all(&stream, 4096).1);
            assert!(
                m.contains(&format!(
                    "message frame at stream offset {} does not decode",
                    h.len()
                )),
                "{m}"
            );
        }
    }

    #[test]
    fn framing_errors_end_the_session_with_the_offset() {
        let h = hello().to_frame();
        // Garbage, a wrong checksum, an absurd length, an unknown kind.
        let mut bad_crc = Message::Log { text: "x".into() }.to_frame();
        bad_crc[HEADER_LEN] ^= 0x20;
        let mut too_long = Message::Log { text: "x".into() }.to_frame();
        too_long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut unknown = Message::Log { text: "x".into() }.to_frame();
        unknown[4] = 0x7f;
        for (bad, says) in [
            (b"\x00garbage\r\n".to_vec(), "no frame magic"),
            (bad_crc, "checksum mismatch"),
            (too_long, "announces 4294967295 payload bytes"),
            (unknown, "unknown frame kind 127"),
        ] {
            let mut stream = h.clone();
            stream.extend(&bad);
            stream.extend(Message::Done { records_bytes: 0 }.to_frame());
            for chunk in [1, 4096] {
                let m = protocol_error(feed_all(&stream, chunk).1);
                assert!(
                    m.contains(says) && m.contains(&format!("stream offset {}", h.len())),
                    "chunk {chunk}: {m}"
                );
            }
        }
    }

    #[test]
    fn a_frame_cut_short_is_noted_with_its_offset() {
        let h = hello().to_frame();
        let mut stream = h.clone();
        stream.extend(&Message::Log { text: "cut".into() }.to_frame()[..20]);
        let (mut s, end, mut d) = feed_all(&stream, 4096);
        assert_eq!(end, None);
        assert_eq!(s.salvage(&mut d, Instant::now()), None);
        assert_eq!(s.trailing, Some((h.len() as u64, 20)));
    }

    fn agent_panic_frame() -> Vec<u8> {
        Message::AgentError {
            step: Some(3),
            message: "agent panicked: panicked at guest/src/agent.rs:1:1: boom".into(),
        }
        .to_frame()
    }

    #[test]
    fn a_panic_written_over_a_cut_frame_is_the_agents_failure() {
        // The panicking thread had sent a header announcing 4096 bytes and
        // 100 of them; its panic hook then wrote its report over the rest.
        let h = hello().to_frame();
        let mut stream = h.clone();
        let full = encode_frame(FrameKind::Records, &[7u8; 4096]);
        stream.extend(&full[..HEADER_LEN + 100]);
        stream.extend(agent_panic_frame());
        for chunk in [1, 4096] {
            let (mut s, end, mut d) = feed_all(&stream, chunk);
            assert_eq!(end, None, "the cut frame still waits for its bytes");
            match s.salvage(&mut d, Instant::now()) {
                Some(SessionEnd::AgentError(m)) => {
                    assert!(m.starts_with("step 3: agent panicked: "), "{m}");
                    assert!(
                        m.contains(&format!("stream offset {} never completed", h.len())),
                        "{m}"
                    );
                }
                other => panic!("chunk {chunk}: expected the agent's error, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_panic_after_garbage_is_the_agents_failure_and_other_frames_are_not() {
        let h = hello().to_frame();
        let mut stream = h.clone();
        stream.extend(b"\x00half a frame".as_slice());
        stream.extend(Message::Log { text: "x".into() }.to_frame());
        stream.extend(agent_panic_frame());
        let mut s = GuestSession::default();
        let mut d = FrameDecoder::new();
        match s.feed(&mut d, &stream, Instant::now()) {
            Some(SessionEnd::AgentError(m)) => {
                assert!(
                    m.contains("agent panicked") && m.contains("no frame magic"),
                    "{m}"
                )
            }
            other => panic!("expected the agent's error, got {other:?}"),
        }
        // The Log after the error was not taken as evidence.
        assert!(!s.messages.iter().any(|m| matches!(m, Message::Log { .. })));
        // Without last words the error stands, after the grace period only.
        let mut stream = h.clone();
        stream.extend(b"\x00half a frame".as_slice());
        stream.extend(Message::Done { records_bytes: 0 }.to_frame());
        let mut s = GuestSession::default();
        let mut d = FrameDecoder::new();
        assert_eq!(s.feed(&mut d, &stream, Instant::now()), None);
        assert_eq!(s.protocol_error_expired(Instant::now()), None);
        assert!(matches!(
            s.salvage(&mut d, Instant::now()),
            Some(SessionEnd::Protocol(m)) if m.contains("no frame magic")
        ));
    }

    #[test]
    fn a_session_stops_taking_bytes_at_its_channel_limit() {
        let mut s = GuestSession {
            channel_limit: 10_000,
            ..GuestSession::default()
        };
        let mut d = FrameDecoder::new();
        let started = Instant::now();
        assert_eq!(s.feed(&mut d, &hello().to_frame(), started), None);
        let mut end = None;
        for f in kloop_protocol::records_frames(0, 0, &[1u8; 50_000]) {
            end = s.feed(&mut d, &f, started);
            if end.is_some() {
                break;
            }
        }
        match end {
            Some(SessionEnd::Infrastructure(m)) => {
                assert!(
                    m.contains("more than 9.8 KiB") && m.contains(CHANNEL_LIMIT_ENV),
                    "{m}"
                )
            }
            other => panic!("expected the limit, got {other:?}"),
        }
        assert!(s.streams.values().map(Vec::len).sum::<usize>() <= 10_000);
    }

    #[test]
    fn channel_limit_sizes() {
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("300m"), Some(300 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(human_bytes(256 << 20), "256 MiB");
    }

    #[test]
    fn noise_never_panics_the_session() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200 {
            let mut stream = hello().to_frame();
            let len = 1 + (round * 97) % 5000;
            stream.extend((0..len).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }));
            // Either a protocol error or a wait for more bytes; never a panic.
            let (_, end, d) = feed_all(&stream, 1 + round % 300);
            assert!(
                matches!(end, None | Some(SessionEnd::Protocol(_))),
                "{end:?}"
            );
            assert!(d.pending() < HEADER_LEN + kloop_protocol::MAX_PAYLOAD);
        }
    }

    #[test]
    fn exit_statuses_in_words() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(1 << 8)),
            "exited with code 1"
        );
        assert_eq!(signal_name(64), "signal 64");
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
        // As QEMU writes it: SeaBIOS's screen codes, then the kernel, unbroken.
        std::fs::write(
            &p,
            "\x1bc\x1b[?7l\x1b[2J\x1b[0mSeaBIOS\r\nProbing EDD... ok\x1bc\x1b[?7l\x1b[2J[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b\n",
        )
        .unwrap();
        assert_eq!(
            console_panic(&p).unwrap(),
            "SeaBIOS\nProbing EDD... ok\n[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b"
        );
        assert_eq!(console_tail(&p, 2), "SeaBIOS\nProbing EDD... ok[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b");
        std::fs::write(&p, "booting\nall fine\n").unwrap();
        assert!(console_panic(&p).is_none());
        assert_eq!(console_tail(&p, 1), "all fine");
    }
}
