//! The QEMU child process: spawned in its own process group with
//! `PR_SET_PDEATHSIG`, reaped and killed on drop; its peak RSS and CPU time
//! from `/proc`; how it ended, in words.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kloop_path_io::PathIoExt;

use crate::config::*;
use crate::terminal::{self, TerminalGuard};

/// A running QEMU. Dropping it kills QEMU and reaps it.
pub struct Vm {
    pub(crate) child: Option<Child>,
    // Sockets live in a short private directory (sun_path is 108 bytes).
    pub(crate) _sockets: tempfile::TempDir,
    pub(crate) qmp_path: PathBuf,
    pub(crate) data_listener: Option<UnixListener>,
    pub started: Instant,
    pub config: VmConfig,
    /// With [`Console::Terminal`] on a terminal: how to give it back.
    /// Declared last, so a drop restores it after QEMU is killed.
    pub(crate) terminal: Option<TerminalGuard>,
}

impl Vm {
    pub fn spawn(config: VmConfig) -> Result<Vm, VmError> {
        std::fs::create_dir_all(&config.artefacts).doing(format!(
            "creating artefact directory {}",
            config.artefacts.display()
        ))?;
        let sockets = tempfile::Builder::new()
            .prefix("kloop-vm-")
            .tempdir()
            .doing("creating a socket directory under $TMPDIR")?;
        let qmp_path = sockets.path().join("qmp.sock");
        let data_path = sockets.path().join("data.sock");
        let data_listener = data_listener(&config, &data_path)?;
        let argv = config.argv(&qmp_path, &data_path);
        tracing::debug!(
            artefacts = %config.artefacts.display(),
            "starting {} {}",
            config.qemu.display(),
            argv.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut cmd = Command::new(&config.qemu);
        let on_terminal = config.console == Console::Terminal;
        let (stdin, stdout) = if on_terminal {
            (Stdio::inherit(), Stdio::inherit())
        } else {
            (Stdio::null(), Stdio::null())
        };
        let terminal = on_terminal.then(TerminalGuard::take).flatten();
        let take_foreground = terminal.is_some();
        cmd.args(&argv).stdin(stdin).stdout(stdout).stderr(
            File::create(config.artefacts.join("qemu.stderr"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        );
        // A restore reads the saved VM through descriptor 3 (`-incoming
        // fd:3`): no shell, no path quoting. (A save hands QEMU its file
        // over QMP instead: QEMU 7.2's outgoing `fd:` takes only named
        // descriptors.)
        let vmstate = match &config.start {
            GuestStart::Boot | GuestStart::BootAndSave { .. } => None,
            GuestStart::Restore { vmstate, .. } => {
                Some(File::open(vmstate).doing(format!("opening saved VM {}", vmstate.display()))?)
            }
        };
        let vmstate_fd = vmstate.as_ref().map(|f| f.as_raw_fd());
        child_setup(&mut cmd, take_foreground, vmstate_fd);
        let started = Instant::now();
        let child = cmd
            .spawn()
            .doing(format!("starting QEMU `{}`", config.qemu.display()))?;
        // QEMU holds its own copy now.
        drop(vmstate);
        Ok(Vm {
            child: Some(child),
            _sockets: sockets,
            qmp_path,
            data_listener,
            started,
            config,
            terminal,
        })
    }

    /// Gives the terminal back (foreground group and settings) now rather
    /// than when the VM is dropped, e.g. before printing after the guest
    /// console; a no-op without [`Console::Terminal`] on a terminal.
    pub fn restore_terminal(&mut self) {
        // Its drop restores.
        self.terminal.take();
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
}

/// The data channel's socket, listening before QEMU starts.
fn data_listener(config: &VmConfig, data_path: &Path) -> Result<Option<UnixListener>, VmError> {
    // We listen, QEMU connects as a client at start-up: nothing the guest
    // writes can be lost before the host is ready.
    Ok(if config.data_channel {
        let l = UnixListener::bind(data_path)
            .doing(format!("binding data socket {}", data_path.display()))?;
        l.set_nonblocking(true)
            .doing("setting data socket non-blocking")?;
        Some(l)
    } else {
        None
    })
}

/// What the child does between fork and exec: its own process group, death
/// with the harness, the terminal's foreground, the saved VM on `VMSTATE_FD`.
fn child_setup(cmd: &mut Command, take_foreground: bool, vmstate_fd: Option<RawFd>) {
    // QEMU gets its own process group: a Ctrl-C at the terminal reaches
    // the harness only, which then ends each trial as interrupted and
    // kills its VM itself (instead of racing QEMU's own SIGINT exit).
    cmd.process_group(0);
    // SAFETY: prctl, fcntl and dup2 are async-signal-safe; nothing else runs
    // in pre_exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if take_foreground {
                terminal::become_foreground()?;
            }
            if let Some(fd) = vmstate_fd {
                // dup2 onto itself would leave close-on-exec set.
                if fd == VMSTATE_FD {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, VMSTATE_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
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
pub(crate) fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// This process's peak resident set (`VmHWM` of `/proc/self/status`), in
/// kB: what a long run (`--repeat 20`) reports to show its memory stays
/// bounded.
pub fn own_peak_rss_kib() -> Option<u64> {
    parse_vm_hwm(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// `VmHWM` in kB from the text of `/proc/<pid>/status`.
pub(crate) fn parse_vm_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}
