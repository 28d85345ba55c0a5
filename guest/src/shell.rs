//! Shell mode (`cargo xtask vm-shell`): PID 1 after the same early setup as
//! for a plan, but with [`kloop_protocol::SHELL_SETUP_PATH`] in the
//! initramfs. It writes the embedded fixtures out, tells the host the boot
//! is over ([`Message::ShellReady`], which ends the host's boot deadline),
//! prints a banner and runs busybox's shell on the console as its child,
//! with the console as the shell's controlling terminal (so Ctrl-C and job
//! control work). PID 1 reaps orphans while it waits, and powers the VM
//! off when the shell exits or when busybox's `poweroff`, `reboot` or
//! `halt` signal it (they signal PID 1 and expect an init to act).

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use kloop_protocol::{
    Message, ShellSetup, FIXTURES_DIR, MODULES_DIR, RUN_BY_HAND, SHELL_SETUP_PATH,
};

use crate::channel;
use crate::fixtures;
use crate::init;
use crate::sys;

/// The shell busybox provides; the host links its applets next to it.
const SHELL: &str = "/bin/sh";

/// Runs the interactive session and powers off after it. `notes` are early
/// setup's remarks, shown in the banner.
pub fn run(mut notes: Vec<String>) -> ! {
    let setup: ShellSetup = match std::fs::read(SHELL_SETUP_PATH)
        .map_err(|e| format!("reading: {}", sys::Errno(&e)))
        .and_then(|text| serde_json::from_slice(&text).map_err(|e| format!("parsing: {e}")))
    {
        Ok(setup) => setup,
        Err(e) => {
            eprintln!("kloop-guest: {SHELL_SETUP_PATH}: {e}");
            init::power_off(1);
        }
    };
    if let Err(e) = write_fixtures() {
        notes.push(format!("writing the fixtures to {FIXTURES_DIR}: {e}"));
    }
    let _ = std::fs::create_dir_all("/root");
    let _ = std::fs::create_dir_all("/tmp");
    let console = console_device();
    let tty = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&console)
    {
        Ok(tty) => tty,
        Err(e) => {
            eprintln!(
                "kloop-guest: opening the console {console}: {}",
                sys::Errno(&e)
            );
            init::power_off(1);
        }
    };
    set_window_size(&tty, setup.rows, setup.cols);
    block_stop_signals();
    // The host's deadline is for the boot: from here on the shell may run
    // as long as the user likes. Without a data port there is no host to
    // tell (and no kloop-run); the shell still runs.
    match channel::open_data_port() {
        Ok(_) => {
            let ready = Message::ShellReady {
                monotonic_ns: sys::monotonic_ns(),
            };
            if let Err(e) = channel::send_message(&ready).and_then(|()| channel::drain()) {
                notes.push(format!(
                    "telling the host the shell is ready: {}",
                    sys::Errno(&e)
                ));
            }
            // arm64's virtio-serial port opens once at a time: PID 1 lets
            // go of it so that kloop-run can have it (a serial port is
            // shared, and x86-64's PID 1 keeps it for its panic report).
            if kloop_protocol::Arch::OF_THIS_BUILD != kloop_protocol::Arch::X86_64 {
                if let Err(e) = channel::release() {
                    notes.push(format!(
                        "letting go of the data port: {} ({RUN_BY_HAND} will find it busy)",
                        sys::Errno(&e)
                    ));
                }
            }
        }
        Err(e) => notes.push(format!(
            "data port: {} ({RUN_BY_HAND} will not work)",
            sys::Errno(&e)
        )),
    }
    print!("{}", banner(&setup, &notes));
    let shell = match spawn_shell(&tty, &setup) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("kloop-guest: starting {SHELL}: {}", sys::Errno(&e));
            init::power_off(1);
        }
    };
    drop(tty);
    let why = supervise(shell);
    eprintln!("kloop-guest: {why}: powering off");
    init::power_off(0);
}

/// What the user can do, printed before the first prompt.
fn banner(setup: &ShellSetup, notes: &[String]) -> String {
    let plan = &setup.plan;
    let uname = sys::uname();
    let mut b = String::new();
    b.push_str("\n=== kloop vm-shell ===\n");
    b.push_str(&format!(
        "kernel     {} ({})\n",
        uname.release, uname.version
    ));
    b.push_str(&format!(
        "scenario   {} ({} steps){}\n",
        plan.scenario,
        plan.steps.len(),
        if plan.requires.is_empty() {
            String::new()
        } else {
            format!(", requires {:?}", plan.requires)
        }
    ));
    b.push_str(&format!(
        "run it     {RUN_BY_HAND} --list   the steps, numbered\n\
         \x20          {RUN_BY_HAND}          every step; the host parses the records and prints them here\n\
         \x20          {RUN_BY_HAND} 2 4-5    only those steps (plus listeners and a drain if they have none)\n"
    ));
    b.push_str(&format!(
        "fixtures   {FIXTURES_DIR}/*.bpf.o (the BPF objects the steps load)\n"
    ));
    if !setup.modules.is_empty() {
        b.push_str(&format!(
            "modules    {MODULES_DIR} ({}; the scenario's modprobe steps insert them)\n",
            setup.modules.join(", ")
        ));
    }
    b.push_str(
        "set up     /proc /sys /dev /sys/kernel/debug /sys/kernel/tracing /sys/fs/bpf mounted,\n\
         \x20          bpf_jit_kallsyms=1, RLIMIT_MEMLOCK unlimited; busybox applets on PATH\n\
         leave      exit, Ctrl-D or poweroff (the VM powers off); Ctrl-A X kills it from the host,\n\
         \x20          Ctrl-A A sends a Ctrl-A\n",
    );
    for n in notes {
        b.push_str(&format!("note       {n}\n"));
    }
    b.push('\n');
    b
}

/// Every embedded fixture as `FIXTURES_DIR/<stem>.bpf.o`.
fn write_fixtures() -> std::io::Result<()> {
    std::fs::create_dir_all(FIXTURES_DIR)?;
    for stem in fixtures::all_stems() {
        let bytes = fixtures::object_bytes(stem).map_err(std::io::Error::other)?;
        std::fs::write(format!("{FIXTURES_DIR}/{stem}.bpf.o"), bytes)?;
    }
    Ok(())
}

/// The console's tty (`/dev/ttyS0` with `console=ttyS0`): `/dev/console`
/// itself cannot be a controlling terminal, and busybox's shell turns job
/// control off without one.
fn console_device() -> String {
    sys::read_trimmed("/sys/class/tty/console/active")
        .ok()
        .and_then(|active| active.split_whitespace().last().map(str::to_owned))
        .map_or_else(|| "/dev/ttyS0".to_owned(), |tty| format!("/dev/{tty}"))
}

/// The host terminal's size on the guest console (0 × 0: left alone).
fn set_window_size(tty: &std::fs::File, rows: u16, cols: u16) {
    if rows == 0 || cols == 0 {
        return;
    }
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: a valid fd and a valid winsize.
    unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &size) };
}

/// busybox's `poweroff` sends PID 1 SIGUSR2, `halt` SIGUSR1, `reboot`
/// SIGTERM. PID 1 blocks them and takes them with `sigtimedwait` between
/// reaps, so none is lost between a check and a wait.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

fn block_stop_signals() {
    let set = stop_signals();
    // SAFETY: a valid set; the old mask is not wanted.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Starts the shell in a session of its own with `tty` as its controlling
/// terminal and stdio.
fn spawn_shell(tty: &std::fs::File, setup: &ShellSetup) -> std::io::Result<u32> {
    let term = setup.term.clone().unwrap_or_else(|| "vt100".into());
    let mut cmd = Command::new(SHELL);
    cmd.arg("-i")
        .env_clear()
        .env("PATH", "/bin:/sbin:/usr/bin:/usr/sbin")
        .env("HOME", "/root")
        .env("TERM", term)
        .env("SHELL", SHELL)
        .env("PS1", "kloop:\\w# ")
        .env("KLOOP_SCENARIO", &setup.plan.scenario)
        .current_dir("/")
        .stdin(Stdio::from(tty.try_clone()?))
        .stdout(Stdio::from(tty.try_clone()?))
        .stderr(Stdio::from(tty.try_clone()?));
    let stop = stop_signals();
    // SAFETY: sigprocmask, setsid and ioctl are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // PID 1's blocked signals would stay blocked across exec.
            libc::sigprocmask(libc::SIG_UNBLOCK, &stop, std::ptr::null_mut());
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // stdin is the tty by now: make it the new session's
            // controlling terminal (1: take it from whoever had it).
            if libc::ioctl(0, libc::TIOCSCTTY, 1) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = child.id();
    // PID 1 reaps it (and every orphan) itself in `supervise`.
    std::mem::forget(child);
    Ok(pid)
}

/// Reaps children until the shell exits or a stop signal arrives; says
/// which.
fn supervise(shell: u32) -> String {
    let stop = stop_signals();
    let poll = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    loop {
        loop {
            let mut status = 0;
            // SAFETY: a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == shell as i32 {
                return "the shell exited".to_string();
            }
            if pid <= 0 {
                break;
            }
        }
        // SAFETY: a valid set and timeout; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(&stop, std::ptr::null_mut(), &poll) };
        if sig > 0 {
            return format!("PID 1 got signal {sig} (poweroff, halt or reboot)");
        }
    }
}
