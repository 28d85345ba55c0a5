//! SIGINT / SIGTERM: stop starting trials, end the running ones, kill QEMU.
//!
//! The first signal sets a flag every wait loop polls, so each VM is shut down
//! and its partial result marked interrupted; a second signal restores the
//! default action and kills the harness outright (QEMU then dies through
//! `PR_SET_PDEATHSIG`).

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: signal() and raise() are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Installs the handlers for SIGINT and SIGTERM (idempotent).
pub fn install() {
    // SAFETY: the handler only touches an atomic and async-signal-safe calls.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// Whether a stop was requested.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
