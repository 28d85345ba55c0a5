//! kloop guest agent: PID 1 inside the test VM.
//!
//! Mounts the pseudo file systems, opens the data port, runs the plan from
//! [`kloop_protocol::PLAN_PATH`] and streams frames to the host, then powers
//! the VM off. It never returns from `main` (PID 1 exiting panics the kernel)
//! and never interprets perf records: the host owns that knowledge.

mod agent;
mod bpf;
mod concurrent;
mod hooks;
mod inventory;
mod kallsyms;
mod measure;
mod net;
mod perf;
mod perf_tool;
mod port;
mod probe;
mod storm;
mod sys;

mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));
}

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use kloop_protocol::{Message, DATA_PORT, HEARTBEAT_INTERVAL_MS};

/// Index of the step being executed, -1 outside steps (for the panic hook).
pub static CURRENT_STEP: AtomicI64 = AtomicI64::new(-1);

fn current_step() -> Option<u32> {
    u32::try_from(CURRENT_STEP.load(Ordering::Relaxed)).ok()
}

fn main() {
    if !sys::is_pid1() && std::env::var_os("KLOOP_GUEST_NOT_PID1").is_none() {
        eprintln!(
            "kloop-guest is the init of a kloop test VM and mounts file systems and powers off; \
             it refuses to run as an ordinary process (set KLOOP_GUEST_NOT_PID1=1 to force)"
        );
        std::process::exit(2);
    }
    std::panic::set_hook(Box::new(|info| {
        let message = format!("agent panicked: {info}");
        eprintln!("kloop-guest: {message}");
        port::send_last_words(&Message::AgentError {
            step: current_step(),
            message,
        });
        sys::power_off(101);
    }));

    let notes = early_setup();

    let port_note = match port::open(DATA_PORT) {
        Ok(note) => note,
        Err(e) => {
            eprintln!(
                "kloop-guest: cannot open data port {DATA_PORT}: {}",
                sys::Errno(&e)
            );
            for n in &notes {
                eprintln!("kloop-guest: {n}");
            }
            sys::power_off(1);
        }
    };

    let result = agent::run(notes, port_note);
    match result {
        Ok(()) => {
            let _ = port::drain();
            sys::power_off(0);
        }
        Err(err) => fail(current_step(), &err),
    }
}

/// Reports a fatal error to the host and powers off.
fn fail(step: Option<u32>, err: &anyhow::Error) -> ! {
    let message = sys::describe_chain(err);
    eprintln!("kloop-guest: step {step:?}: {message}");
    let _ = port::send(&Message::AgentError { step, message });
    let _ = port::drain();
    sys::power_off(1);
}

/// Mounts, rlimits and sysctls. Returns notes for the host (the port is not
/// open yet, so they travel as `Log` messages after the hello).
fn early_setup() -> Vec<String> {
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

/// Sends a heartbeat every [`HEARTBEAT_INTERVAL_MS`] until power-off.
fn start_heartbeat() {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(|| {
            let mut seq = 0u64;
            loop {
                std::thread::sleep(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
                seq += 1;
                if let Err(e) = port::send(&Message::Heartbeat { seq }) {
                    eprintln!("kloop-guest: heartbeat {seq}: {}", sys::Errno(&e));
                }
            }
        })
        .expect("spawn heartbeat thread");
}
