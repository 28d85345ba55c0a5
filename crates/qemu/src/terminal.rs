//! The harness's terminal while a guest console is on it
//! ([`crate::Console::Terminal`]).
//!
//! QEMU runs in a process group of its own (so a signal meant for the
//! harness never reaches it first), which would make it a background job
//! of the terminal: its raw-mode `tcsetattr` and its reads would stop it
//! with SIGTTOU / SIGTTIN. So the child makes its group the terminal's
//! foreground group before it executes QEMU, and [`TerminalGuard`] gives
//! the foreground back and restores the settings QEMU changed when the VM
//! ends, also when QEMU was killed and could not restore them itself.

use std::io;

/// The file descriptor the terminal is reached through: stdin.
const TERMINAL_FD: libc::c_int = 0;

/// The terminal's settings and foreground process group before QEMU took
/// it; restored on drop.
pub(crate) struct TerminalGuard {
    saved: libc::termios,
    foreground: libc::pid_t,
}

impl TerminalGuard {
    /// `None` when stdin is not a terminal (a pipe, `/dev/null`): then
    /// QEMU's stdio console needs no foreground and has no modes to undo.
    pub(crate) fn take() -> Option<TerminalGuard> {
        // SAFETY: termios is plain data filled by tcgetattr; both calls
        // only read.
        unsafe {
            if libc::isatty(TERMINAL_FD) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(TERMINAL_FD, &mut saved) != 0 {
                return None;
            }
            let foreground = libc::tcgetpgrp(TERMINAL_FD);
            if foreground < 0 {
                return None;
            }
            Some(TerminalGuard { saved, foreground })
        }
    }

    /// Gives the foreground back to the group that had it and restores
    /// the settings. The harness may be a background job at this point,
    /// so SIGTTOU is blocked around the calls that would raise it.
    pub(crate) fn restore(&self) {
        with_sigttou_blocked(|| {
            // SAFETY: a valid fd and the termios read in `take`.
            unsafe {
                libc::tcsetpgrp(TERMINAL_FD, self.foreground);
                libc::tcsetattr(TERMINAL_FD, libc::TCSADRAIN, &self.saved);
            }
        });
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        self.restore();
    }
}

/// In the child between fork and exec (async-signal-safe calls only):
/// makes the child's own process group the terminal's foreground group.
pub(crate) fn become_foreground() -> io::Result<()> {
    let mut result = Ok(());
    with_sigttou_blocked(|| {
        // SAFETY: getpgrp and tcsetpgrp are async-signal-safe.
        if unsafe { libc::tcsetpgrp(TERMINAL_FD, libc::getpgrp()) } != 0 {
            result = Err(io::Error::last_os_error());
        }
    });
    result
}

/// Runs `f` with SIGTTOU blocked: a background process group may then
/// change the terminal (POSIX: the call succeeds instead of stopping it).
fn with_sigttou_blocked(f: impl FnOnce()) {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; the old
    // mask is put back as it was.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        f();
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}
