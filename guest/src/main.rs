//! kloop guest agent: PID 1 inside the test VM.
//!
//! Mounts the pseudo file systems, opens the data port, runs the plan from
//! [`kloop_protocol::PLAN_PATH`] and streams frames to the host, then powers
//! the VM off. It never returns from `main` (PID 1 exiting panics the kernel)
//! and never interprets perf records: the host owns that knowledge.
//!
//! Layers, each importing only those below it:
//! - [`runner`]: reads the plan, runs the probes and the aya warm-up, and
//!   dispatches each step to [`steps`];
//! - [`steps`]: one module per step family, built on [`context`] (what steps
//!   share) and [`fixtures`] (the embedded BPF objects);
//! - [`perf`], [`bpf`], [`kallsyms`]: the kernel interfaces the steps use;
//! - [`init`] (early setup, power-off, the panic hook), [`channel`] (the data
//!   port to the host) and [`sys`] (errno names, mounts, small syscalls).
//!
//! `ci/module-cycles.py guest/src` checks that no module imports another
//! that imports it back.

mod bpf;
mod channel;
mod context;
mod fixtures;
mod init;
mod kallsyms;
mod perf;
mod runner;
mod steps;
mod sys;

use kloop_protocol::DATA_PORT;

fn main() {
    if !init::is_pid1() && std::env::var_os("KLOOP_GUEST_NOT_PID1").is_none() {
        eprintln!(
            "kloop-guest is the init of a kloop test VM and mounts file systems and powers off; \
             it refuses to run as an ordinary process (set KLOOP_GUEST_NOT_PID1=1 to force)"
        );
        std::process::exit(2);
    }
    init::install_panic_hook();

    let notes = init::early_setup();

    let port_note = match channel::open(DATA_PORT) {
        Ok(note) => note,
        Err(e) => {
            eprintln!(
                "kloop-guest: cannot open data port {DATA_PORT}: {}",
                sys::Errno(&e)
            );
            for n in &notes {
                eprintln!("kloop-guest: {n}");
            }
            init::power_off(1);
        }
    };

    let result = runner::run(notes, port_note);
    match result {
        Ok(()) => {
            let _ = channel::drain();
            init::power_off(0);
        }
        Err(err) => init::fail(init::current_step(), &err),
    }
}
