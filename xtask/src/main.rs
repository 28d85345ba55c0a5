//! `cargo xtask`: a thin CLI over the `kloop` library.

// The ratchet on long functions (issue 49; threshold in clippy.toml).
#![warn(clippy::too_many_lines)]

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

mod audit_cmd;
mod bench_cmd;
mod bisect_cmd;
mod check_perf_data_cmd;
mod clean_cmd;
#[cfg(test)]
mod docs_check;
mod docs_cmd;
#[cfg(test)]
mod docs_generated;
mod doctor_cmd;
mod flags;
mod kernels_cmd;
mod merge_cmd;
mod mutants_cmd;
mod report_bug_cmd;
mod repro_cmd;
#[cfg(test)]
mod session_check;
mod shared;
mod skips_cmd;
mod validate_cmd;
mod view;
mod vm_shell_cmd;
mod vm_test_cmd;

use flags::*;

/// The error and its causes, each cause said once: many messages already
/// quote their cause (`cannot write X (Read-only file system)`), and
/// anyhow's `{:#}` would repeat it.
fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// `cargo xtask vm-test --list | head`: when the reader of stdout goes
/// away, end quietly as a shell tool does (status 141, SIGPIPE's) instead
/// of panicking with a backtrace. SIGPIPE itself stays ignored, so that a
/// write to a QEMU socket that closed is an error kloop handles, not its
/// death.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    crate::view::init(cli.verbose);
    match cli.cmd {
        Cmd::VmTest(a) => a.run(),
        Cmd::Bless(a) => a.run(),
        Cmd::Kernels { cmd } => cmd.run(),
        Cmd::Validate(a) => a.run(),
        Cmd::Bisect(a) => a.run(),
        Cmd::BisectStep(a) => a.run(),
        Cmd::Bench(a) => a.run(),
        Cmd::Merge(a) => a.run(),
        Cmd::CheckPerfData(a) => a.run(),
        Cmd::Clean(a) => a.run(),
        Cmd::Mutants(a) => a.run(),
        Cmd::Repro(a) => a.run(),
        Cmd::Audit(a) => a.run(),
        Cmd::ReportBug(a) => a.run(),
        Cmd::Doctor(a) => a.run(),
        Cmd::Docs(a) => a.run(),
        Cmd::VmShell(a) => a.run(),
        Cmd::Skips(a) => a.run(),
    }
}
