//! `cargo xtask`: a thin CLI over the `kloop` library.

// The ratchet on long functions (issue 49; threshold in clippy.toml).
#![warn(clippy::too_many_lines)]

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use kloop::workspace::Layout;

mod audit_cmd;
mod bench_cmd;
mod bisect_cmd;
mod clean_cmd;
#[cfg(test)]
mod docs_check;
mod doctor_cmd;
mod flags;
mod kernels_cmd;
mod merge_cmd;
mod mutants_cmd;
mod report_bug_cmd;
mod repro_cmd;
#[cfg(test)]
mod session_check;
mod skips_cmd;
mod validate_cmd;
mod view;
mod vm_shell_cmd;
mod vm_test_cmd;

pub(crate) use flags::*;

use bench_cmd::bench;
use bisect_cmd::{bisect, bisect_step, bisect_tree};
use kernels_cmd::{build_kernel, kernels};
use validate_cmd::{ab_test, validate};
use vm_test_cmd::vm_test;

/// Exit status of a run whose kernel did not build (vs 1: a trial failed,
/// 2: kloop could not run).
pub(crate) const EXIT_BUILD: u8 = 3;

/// 0 for a run that passed, 1 for one that did not.
pub(crate) fn exit_code(passed: bool) -> ExitCode {
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub(crate) use kloop::session::start_trials;

/// `check-perf-data FILE`: exit 0 clean (or known bugs only), 1 news,
/// 2 unreadable, cut short or nothing to judge.
fn check_perf_data(file: &std::path::Path, json: bool) -> Result<ExitCode> {
    let mut c = match kloop::perf_data::check(file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    kloop::perf_data::recognise(&mut c, &kloop::workspace::load_ledger(&layout())?);
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", kloop::report::perf_data::text(file, &c));
    }
    Ok(ExitCode::from(c.exit_code()))
}

pub(crate) fn layout() -> Layout {
    Layout::from_root(kloop::workspace::workspace_root())
}

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
        Cmd::VmTest(a) => vm_test(a, false, Default::default()),
        Cmd::Bless(a) => vm_test_cmd::bless(a),
        Cmd::Kernels { cmd } => kernels(cmd),
        Cmd::Validate(a) => validate(a),
        Cmd::Bisect(a) if a.tree.is_some() => bisect_tree(a),
        Cmd::Bisect(a) => bisect(a),
        Cmd::BisectStep(a) => bisect_step(a),
        Cmd::Bench(a) => bench(a),
        Cmd::Merge(a) => merge_cmd::merge(a),
        Cmd::CheckPerfData { file, json } => check_perf_data(&file, json),
        Cmd::Clean(a) => clean_cmd::clean(a),
        Cmd::Mutants(a) => mutants_cmd::mutants(a),
        Cmd::Repro(a) => repro_cmd::repro(a),
        Cmd::Audit(a) => audit_cmd::audit(a),
        Cmd::ReportBug(a) => report_bug_cmd::report_bug(a),
        Cmd::Doctor(a) => doctor_cmd::doctor(a),
        Cmd::VmShell(a) => vm_shell_cmd::vm_shell(a),
        Cmd::Skips(a) => skips_cmd::skips(a),
    }
}

/// `- line` / `+ line` for every line that differs between `old` and
/// `new` (the judge's minimal diff).
pub(crate) fn judge_diff(old: &str, new: &str) -> Vec<String> {
    kloop::judge::ab::stream_diff(old, new)
}
