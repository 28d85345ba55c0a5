//! `cargo xtask vm-shell`: a kernel booted with the agent's environment and
//! a scenario's fixtures and modules, and an interactive busybox shell on
//! its console, on the user's terminal.
//!
//! The guest is a trial's guest image ([`crate::run::trial::guest_image`]:
//! kernel file, modules, payload, agent) plus busybox with its applet
//! links, `kloop-run` (a link to the agent) and the
//! [`kloop_protocol::ShellSetup`] that puts PID 1 in shell mode. QEMU's
//! console is the terminal ([`kloop_qemu::Console::Terminal`]); the host
//! meanwhile pumps the data channel: the agent's `ShellReady` ends the boot
//! deadline, and every `kloop-run` session is parsed and checked here
//! ([`report`]) and its report sent back for the guest to print, so the
//! guest never needs the perf ABI.

mod report;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::{
    FrameDecoder, FrameKind, Message, ShellSetup, ToGuest, RUN_BY_HAND, SHELL_SETUP_PATH,
};
use kloop_qemu::{Console, SessionEnd, Vm, VmConfig};

use crate::run::initramfs::Initramfs;
use crate::run::payload::{self, PayloadError};
use crate::run::trial::guest_image::{prepare_guest, GuestParts};
use crate::run::trial::{KernelUnderTest, TrialEnv};
use crate::scenario::Scenario;
use report::{ByHandRun, RunEnd};

/// Largest report text sent to the guest: one frame holds 1 MiB; the
/// report file on the host has everything.
const REPORT_MAX: usize = 512 * 1024;

/// How long a report may take to go into the data socket before the host
/// gives up on it (a guest that stopped reading).
const REPORT_WRITE_WAIT: Duration = Duration::from_secs(10);

/// Applets not linked: `/init` is the agent, and busybox's init would
/// take PID 1's place.
const APPLETS_LEFT_OUT: [&str; 2] = ["init", "linuxrc"];

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error(transparent)]
    Payload(#[from] PayloadError),
    #[error("preparing the guest: {0}")]
    Guest(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Vm(#[from] kloop_qemu::VmError),
    #[error(
        "no shell within {secs} s of QEMU's start (the boot deadline under {accel}; \
         KLOOP_DEADLINE_SCALE multiplies it); QEMU was killed. The console's last lines \
         ({console}):\n{tail}"
    )]
    BootTimeout {
        secs: u64,
        accel: String,
        console: PathBuf,
        tail: String,
    },
    #[error("the guest kernel panicked before the shell came up:\n{0}")]
    Panic(String),
    #[error(
        "QEMU {status} before the shell came up. The console's last lines ({console}):\n{tail}"
    )]
    NoShell {
        status: String,
        console: PathBuf,
        tail: String,
    },
    #[error("{0}")]
    Channel(String),
    #[error("interrupted: QEMU was killed")]
    Interrupted,
}

/// How a shell session ended, once the shell had come up.
#[derive(Debug)]
pub struct ShellOutcome {
    /// How QEMU ended, in words (`exited with code 0`).
    pub qemu_exit: String,
    /// The guest kernel's panic lines, if it panicked during the session.
    pub panic: Option<String>,
    /// How many `kloop-run` sessions the host reported on.
    pub by_hand_runs: u32,
    /// The session's directory: `console.log`, `initramfs.cpio`, one
    /// `kloop-run-<n>/` per by-hand run.
    pub artefacts: PathBuf,
}

/// Boots `kernel` with `scenario`'s guest and the shell, and returns when
/// QEMU has ended. `say` gets the lines meant for the user before the
/// console takes the terminal (notes, what to press).
#[expect(clippy::too_many_lines)]
pub fn run_shell(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    say: &dyn Fn(&str),
) -> Result<ShellOutcome, ShellError> {
    let artefacts = env.run_dir.join("shell");
    let arch = kernel.arch();
    // Another architecture's QEMU and agent (TCG); its busybox is Debian's
    // of that architecture.
    let env = &*env.for_arch(arch).map_err(ShellError::Guest)?;
    // Before any kernel is fetched: without busybox there is no shell.
    let busybox = env.busybox(arch)?;
    // The checks the kernel was built with: a by-hand run's report holds
    // their evidence to the same door as a trial's.
    let kernel_checks = kernel.checks(env);
    if let Ok(config) = kernel.config(env) {
        if let Some(reason) = crate::scenario::needs::preflight(scenario, &config) {
            say(&format!(
                "note: the scenario's trial would be {reason}; the shell starts anyway, and \
                 {RUN_BY_HAND} will say what fails"
            ));
        }
    }
    let parts = prepare_guest(env, kernel, scenario, &artefacts)
        .map_err(|v| ShellError::Guest(v.message().unwrap_or("failed").to_string()))?;
    let (rows, cols) = terminal_size();
    let setup = ShellSetup {
        plan: scenario.plan.clone(),
        modules: scenario.modules.clone(),
        rows,
        cols,
        term: std::env::var("TERM").ok().filter(|t| !t.is_empty()),
    };
    let initramfs_path = artefacts.join("initramfs.cpio");
    shell_initramfs(&parts, &env.agent, busybox, &setup)?
        .write_file(&initramfs_path)
        .doing(format!("writing {}", initramfs_path.display()))?;
    let config = VmConfig {
        initramfs: Some(initramfs_path),
        console: Console::Terminal,
        ..parts.vm.clone()
    };
    let boot = config.deadlines.boot;
    let accel = config.accel.to_string();
    say(&format!(
        "booting {} with scenario {} ({accel}); the shell comes up on this terminal within {} s. \
         Leave with `exit` or `poweroff`; Ctrl-A X kills the VM",
        kernel.id(),
        scenario.name,
        boot.as_secs()
    ));
    let mut vm = Vm::spawn(config)?;
    let console = vm.console_path();
    let connect_by = vm.started + boot;
    let stream = match vm.accept_data(connect_by, &crate::run::signals::interrupted) {
        Ok(stream) => stream,
        Err(end) => {
            vm.kill();
            vm.restore_terminal();
            return Err(match end {
                SessionEnd::Interrupted => ShellError::Interrupted,
                SessionEnd::QemuExited(status) => ShellError::NoShell {
                    status: kloop_qemu::describe_exit(&status),
                    tail: kloop_qemu::console_tail(&console, 30),
                    console,
                },
                SessionEnd::Infrastructure(why) => ShellError::Channel(why),
                other => ShellError::Channel(format!("{other:?}")),
            });
        }
    };

    let ready = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let runs = AtomicU32::new(0);
    let limit = vm.config.channel_limit;
    let ended = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut pump = Pump {
                stream,
                ready: &ready,
                stop: &stop,
                runs: &runs,
                artefacts: &artefacts,
                limit,
                kernel_checks,
            };
            pump.run();
        });
        let boot_end = vm.started + boot;
        let ended = loop {
            if let Some(status) = vm.try_wait() {
                break Ended::Exited(status);
            }
            if crate::run::signals::interrupted() {
                break Ended::Interrupted;
            }
            if !ready.load(Ordering::SeqCst) && Instant::now() >= boot_end {
                break Ended::BootTimeout;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        stop.store(true, Ordering::SeqCst);
        ended
    });
    vm.kill();
    vm.restore_terminal();
    let panic = kloop_qemu::console_panic(&console);
    let shell_came_up = ready.load(Ordering::SeqCst);
    match ended {
        Ended::Interrupted => Err(ShellError::Interrupted),
        Ended::BootTimeout => Err(ShellError::BootTimeout {
            secs: boot.as_secs(),
            accel,
            tail: kloop_qemu::console_tail(&console, 30),
            console,
        }),
        Ended::Exited(_) if !shell_came_up && panic.is_some() => {
            Err(ShellError::Panic(panic.unwrap_or_default()))
        }
        Ended::Exited(status) if !shell_came_up => Err(ShellError::NoShell {
            status: kloop_qemu::describe_exit(&status),
            tail: kloop_qemu::console_tail(&console, 30),
            console,
        }),
        Ended::Exited(status) => Ok(ShellOutcome {
            qemu_exit: kloop_qemu::describe_exit(&status),
            panic,
            by_hand_runs: runs.load(Ordering::SeqCst),
            artefacts,
        }),
    }
}

enum Ended {
    Exited(std::process::ExitStatus),
    BootTimeout,
    Interrupted,
}

/// The trial's initramfs without a plan, plus busybox and its applet
/// links, `kloop-run` and the shell setup.
fn shell_initramfs(
    parts: &GuestParts,
    agent: &Path,
    (busybox, applets): (payload::Payload, Vec<String>),
    setup: &ShellSetup,
) -> Result<Initramfs, ShellError> {
    let mut i = parts
        .initramfs(agent, None)
        .doing("building the guest's initramfs")?;
    for dir in busybox.dirs() {
        i.add_dir(&dir);
    }
    for f in &busybox.files {
        let bytes =
            std::fs::read(&f.host_path).doing(format!("reading {}", f.host_path.display()))?;
        i.add_file(&f.guest_path, f.mode, bytes);
    }
    for applet in &applets {
        let path = Path::new(applet);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if APPLETS_LEFT_OUT.contains(&name) || i.contains(applet) {
            continue;
        }
        if let Some(dir) = path.parent().and_then(|d| d.to_str()) {
            // Parents first: the kernel's unpacker creates none.
            let mut prefix = String::new();
            for part in dir.split('/').filter(|p| !p.is_empty()) {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                i.add_dir(&prefix);
            }
        }
        i.add_symlink(applet, payload::GUEST_BUSYBOX);
    }
    i.add_symlink(&format!("bin/{RUN_BY_HAND}"), "/init");
    let json = serde_json::to_vec_pretty(setup)
        .map_err(io::Error::other)
        .doing("encoding the shell setup")?;
    i.add_file(SHELL_SETUP_PATH, 0o644, json);
    Ok(i)
}

/// The host terminal's rows and columns (0, 0 when there is none).
fn terminal_size() -> (u16, u16) {
    // SAFETY: winsize is plain data filled by the ioctl.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    for fd in [1, 0, 2] {
        // SAFETY: a valid pointer to a winsize.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) } == 0 && size.ws_col > 0 {
            return (size.ws_row, size.ws_col);
        }
    }
    (0, 0)
}

/// The host end of the data channel while the shell runs.
struct Pump<'a> {
    stream: UnixStream,
    ready: &'a AtomicBool,
    stop: &'a AtomicBool,
    runs: &'a AtomicU32,
    artefacts: &'a Path,
    /// Most channel bytes one by-hand session may send.
    limit: u64,
    /// What the kernel was built to check (its config).
    kernel_checks: crate::judge::kernel_log::KernelChecks,
}

impl Pump<'_> {
    fn run(&mut self) {
        if self
            .stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .and_then(|()| self.stream.set_write_timeout(Some(REPORT_WRITE_WAIT)))
            .is_err()
        {
            return;
        }
        let mut decoder = FrameDecoder::new();
        let mut current: Option<ByHandRun> = None;
        let mut buf = vec![0u8; 64 * 1024];
        while !self.stop.load(Ordering::SeqCst) {
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            };
            decoder.push(&buf[..n]);
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => self.frame(frame, &mut current),
                    Ok(None) => break,
                    // The decoder skips to the next magic: a kloop-run
                    // killed in the middle of a frame leaves such a cut.
                    Err(e) => {
                        if let Some(run) = current.as_mut() {
                            run.channel_notes.push(e.to_string());
                        }
                    }
                }
            }
        }
    }

    fn frame(&mut self, frame: kloop_protocol::RawFrame, current: &mut Option<ByHandRun>) {
        match frame.kind {
            FrameKind::Records => {
                if let Some(run) = current.as_mut() {
                    run.bytes += frame.payload.len() as u64;
                    if run.bytes > self.limit {
                        if !run
                            .channel_notes
                            .iter()
                            .any(|n| n.contains("channel limit"))
                        {
                            run.channel_notes.push(format!(
                                "more than {} bytes: past the channel limit \
                                 (KLOOP_CHANNEL_LIMIT), later records were dropped",
                                self.limit
                            ));
                        }
                        return;
                    }
                    run.records(&frame.payload);
                }
            }
            FrameKind::Message => {
                let Ok(msg) = serde_json::from_slice::<Message>(&frame.payload) else {
                    if let Some(run) = current.as_mut() {
                        run.channel_notes.push(format!(
                            "a message frame at stream offset {} does not decode",
                            frame.offset
                        ));
                    }
                    return;
                };
                match msg {
                    Message::ShellReady { .. } => self.ready.store(true, Ordering::SeqCst),
                    Message::Hello { monotonic_ns, .. } => {
                        // An earlier run that never finished (Ctrl-C in
                        // the guest) is dropped: nobody waits for it.
                        let mut run = ByHandRun::new(monotonic_ns, self.kernel_checks);
                        run.message(msg);
                        *current = Some(run);
                    }
                    msg => {
                        let Some(run) = current.as_mut() else { return };
                        if let Some(end) = run.message(msg) {
                            let run = current.take().expect("a run is current");
                            self.finish(&run, &end);
                        }
                    }
                }
            }
        }
    }

    /// Keeps the run's evidence and full report on the host and sends the
    /// guest its report.
    fn finish(&mut self, run: &ByHandRun, end: &RunEnd) {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let dir = self.artefacts.join(format!("{RUN_BY_HAND}-{n}"));
        let kept = keep(&dir, run, end);
        let mut text = report::render(run, end, false);
        match kept {
            Ok(()) => text.push_str(&format!(
                "host: the full report, messages and raw streams are in {}\n",
                dir.display()
            )),
            Err(e) => text.push_str(&format!("host: could not keep the run: {e}\n")),
        }
        if text.len() > REPORT_MAX {
            let cut = (0..=REPORT_MAX)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            text.truncate(cut);
            text.push_str(&format!(
                "\n… cut at {REPORT_MAX} bytes; the rest is in {}/report.txt\n",
                dir.display()
            ));
        }
        let frame = ToGuest::Report {
            run: run.hello_ns,
            text,
        }
        .to_frame();
        // A guest that stopped waiting (Ctrl-C) does not read it: the
        // write timeout bounds that, and the next kloop-run discards it.
        let _ = self.stream.write_all(&frame);
    }
}

/// `report.txt` (every record), `messages.jsonl` and `records-<n>.bin` of
/// one by-hand run in `dir`.
fn keep(dir: &Path, run: &ByHandRun, end: &RunEnd) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.txt"), report::render(run, end, true))?;
    let mut messages = String::new();
    for m in &run.messages {
        messages.push_str(&serde_json::to_string(m).map_err(io::Error::other)?);
        messages.push('\n');
    }
    std::fs::write(dir.join("messages.jsonl"), messages)?;
    for (listener, bytes) in &run.streams {
        std::fs::write(dir.join(format!("records-{listener}.bin")), bytes)?;
    }
    Ok(())
}
