//! kloop guest agent: PID 1 inside the test VM.
//!
//! Mounts the pseudo file systems, opens the data port, runs the plan from
//! [`kloop_protocol::PLAN_PATH`] and streams frames to the host, then powers
//! the VM off. It never returns from `main` (PID 1 exiting panics the kernel)
//! and never interprets perf records: the host owns that knowledge.
//!
//! Run as `kloop-run` (a link in a `cargo xtask vm-shell` guest) it is an
//! ordinary process that runs a scenario's steps by hand ([`by_hand`]); as
//! PID 1 with [`kloop_protocol::SHELL_SETUP_PATH`] in the initramfs it
//! starts that interactive shell instead of a plan ([`shell`]).
//!
//! Layers, each importing only those below it:
//! - [`shell`] and [`by_hand`]: the interactive guest and `kloop-run`;
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

// The ratchet on long functions (issue 49; threshold in clippy.toml).
#![warn(clippy::too_many_lines)]

mod arm64_insn;
mod bpf;
mod btf;
mod by_hand;
mod channel;
mod context;
mod exec_areas;
mod fixtures;
mod init;
mod jit_books;
mod kallsyms;
mod kernel_log;
mod modules;
mod perf;
mod runner;
mod shell;
mod steps;
mod sys;
mod wakeups;

use kloop_protocol::{RUN_BY_HAND, SHELL_SETUP_PATH};

fn main() {
    let mut args = std::env::args();
    let invoked_as = args.next().unwrap_or_default();
    if std::path::Path::new(&invoked_as).file_name() == Some(RUN_BY_HAND.as_ref()) {
        // An ordinary process under the vm-shell's PID 1: its panics are
        // reported like the agent's, and power_off only exits.
        init::install_panic_hook();
        let args: Vec<String> = args.collect();
        std::process::exit(by_hand::main(&args));
    }
    if !init::is_pid1() && std::env::var_os("KLOOP_GUEST_NOT_PID1").is_none() {
        eprintln!(
            "kloop-guest is the init of a kloop test VM and mounts file systems and powers off; \
             it refuses to run as an ordinary process (set KLOOP_GUEST_NOT_PID1=1 to force)"
        );
        std::process::exit(2);
    }
    init::install_panic_hook();

    let notes = init::early_setup();
    if std::path::Path::new(SHELL_SETUP_PATH).exists() {
        shell::run(notes);
    }

    let port_note = match channel::open_data_port() {
        Ok((path, note)) => format!("{path}: {note}"),
        Err(e) => {
            eprintln!("kloop-guest: cannot open the data port: {}", sys::Errno(&e));
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
