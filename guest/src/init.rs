//! What PID 1 does around the plan: early setup (mounts, rlimits, sysctls),
//! the panic hook, the fatal-error report and power-off.

use std::sync::atomic::{AtomicI64, Ordering};

use kloop_protocol::Message;

use crate::channel;
use crate::sys;

/// Index of the step being executed, -1 outside steps (for the panic hook).
static CURRENT_STEP: AtomicI64 = AtomicI64::new(-1);

/// Records which step runs (`None` between steps), for the panic hook and
/// for [`fail`].
pub fn set_current_step(step: Option<u32>) {
    CURRENT_STEP.store(step.map_or(-1, i64::from), Ordering::Relaxed);
}

pub fn current_step() -> Option<u32> {
    u32::try_from(CURRENT_STEP.load(Ordering::Relaxed)).ok()
}

/// A panic anywhere in the agent is reported to the host as an
/// `AgentError` naming the step (best effort: see
/// [`channel::send_last_words`]) and powers the VM off.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = format!("agent panicked: {info}");
        eprintln!("kloop-guest: {message}");
        channel::send_last_words(&Message::AgentError {
            step: current_step(),
            message,
        });
        power_off(101);
    }));
}

/// Reports a fatal error to the host and powers off.
pub fn fail(step: Option<u32>, err: &anyhow::Error) -> ! {
    let message = sys::describe_chain(err);
    eprintln!("kloop-guest: step {step:?}: {message}");
    let _ = channel::send_message(&Message::AgentError { step, message });
    let _ = channel::drain();
    power_off(1);
}

/// Mounts, rlimits and sysctls. Returns notes for the host (the port is not
/// open yet, so they travel as `Log` messages after the hello).
pub fn early_setup() -> Vec<String> {
    let mut notes = Vec::new();
    // (fstype, mount point, required)
    let mounts = [
        ("proc", "/proc", true),
        ("sysfs", "/sys", true),
        ("devtmpfs", "/dev", true),
        ("debugfs", "/sys/kernel/debug", false),
        ("tracefs", "/sys/kernel/tracing", false),
        ("bpf", "/sys/fs/bpf", false),
    ];
    for (fstype, target, required) in mounts {
        match sys::mount(fstype, target) {
            Ok(_) => {}
            Err(e)
                if !required
                    && matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) =>
            {
                notes.push(format!(
                    "optional mount {fstype} on {target} unavailable: {}",
                    sys::Errno(&e)
                ));
            }
            Err(e) => notes.push(format!(
                "mount {fstype} on {target} failed: {}",
                sys::Errno(&e)
            )),
        }
    }
    sys::ensure_console();
    if let Err(e) = sys::raise_memlock() {
        notes.push(format!(
            "setrlimit(RLIMIT_MEMLOCK, infinity) failed: {}",
            sys::Errno(&e)
        ));
    }
    let jit_kallsyms = "/proc/sys/net/core/bpf_jit_kallsyms";
    if std::path::Path::new(jit_kallsyms).exists() {
        if let Err(e) = std::fs::write(jit_kallsyms, "1") {
            notes.push(format!(
                "writing 1 to {jit_kallsyms} failed: {}",
                sys::Errno(&e)
            ));
        }
    } else {
        notes.push(format!("{jit_kallsyms} does not exist"));
    }
    notes
}

pub fn is_pid1() -> bool {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() == 1 }
}

/// Syncs and powers the VM off. Outside PID 1 (a developer running the binary
/// by hand) it exits instead, so it can never power off the host.
pub fn power_off(code: i32) -> ! {
    // SAFETY: sync and reboot have no memory preconditions.
    unsafe { libc::sync() };
    if is_pid1() {
        unsafe { libc::reboot(libc::RB_POWER_OFF) };
        // Only reached if reboot failed; PID 1 must never exit.
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    std::process::exit(code)
}
