//! What several commands share, below every `*_cmd.rs` (which import it
//! and `flags`, never `main.rs` or one another): the workspace's layout,
//! exit statuses, a kernel build drawn on the terminal and its controls.

use std::process::ExitCode;

use anyhow::Result;
use kloop::session::kernels::{self, BuildStep, KernelBuildError};
use kloop::workspace::Layout;

use crate::flags::FetchArgs;

pub(crate) mod ab;
pub(crate) mod exits;

pub(crate) use exits::EXIT_BUILD;

/// 0 for a run that passed, 1 for one that did not.
pub(crate) fn exit_code(passed: bool) -> ExitCode {
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub(crate) use kloop::session::start_trials;

pub(crate) fn layout() -> Layout {
    Layout::from_root(kloop::workspace::workspace_root())
}

/// `- line` / `+ line` for every line that differs between `old` and
/// `new` (the judge's minimal diff).
pub(crate) fn judge_diff(old: &str, new: &str) -> Vec<String> {
    kloop::judge::ab::stream_diff(old, new)
}

/// Builds `req`, showing progress; `Err(code)` after printing a BUILD or
/// setup failure.
pub(crate) fn build_kernel(
    req: &kloop_kernels::build::BuildRequest,
    what: &str,
) -> std::result::Result<kloop_kernels::build::BuiltKernel, ExitCode> {
    let mut progress = None;
    let result = kernels::build(req, &mut |step| match step {
        BuildStep::Started => progress = Some(crate::view::build::BuildProgress::new(what)),
        BuildStep::Build(e) => {
            if let Some(p) = progress.as_mut() {
                p.event(e);
            }
        }
    });
    let result = match result {
        Err(KernelBuildError::NoCache(e)) => {
            eprintln!("error: {e}");
            return Err(ExitCode::from(2));
        }
        Err(KernelBuildError::Build(e)) => Err(e),
        Ok(k) => Ok(k),
    };
    if let Some(p) = progress {
        p.finish();
    }
    match result {
        Ok(k) => {
            for line in kloop::report::kernels::built_lines(&k) {
                println!("kloop: {line}");
            }
            Ok(k)
        }
        Err(e) if e.is_build_failure() => {
            eprintln!("BUILD FAILED ({what}): {e}");
            Err(ExitCode::from(EXIT_BUILD))
        }
        Err(e) => {
            eprintln!("error ({what}): {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// `kernels build --checks` (and `validate --checks`): each check's
/// positive control on the checked kernel `k`, a line each; `false` when a
/// check is blind (its sentences on stderr), which stops the command.
pub(crate) fn run_controls(
    layout: &Layout,
    k: &kloop_kernels::build::BuiltKernel,
    fetch: &FetchArgs,
) -> Result<bool> {
    let env = kloop::run::suite::EnvOptions {
        fetch: fetch.options(),
        ..Default::default()
    };
    match kernels::controls(layout, k, &env, &print_control) {
        Ok(_) => Ok(true),
        Err(kernels::ControlsRunError::Controls(kloop::run::controls::ControlsError::Blind(
            lines,
        ))) => {
            for l in lines {
                eprintln!("kloop: {l}");
            }
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// One control's outcome, a line on stdout (a blind one's sentence comes
/// at the end, on stderr).
pub(crate) fn print_control(o: &kloop::run::controls::ControlOutcome, kept: bool) {
    let from = if kept {
        " (kept from an earlier run)"
    } else {
        ""
    };
    match &o.blind {
        None => println!("kloop: control: {}{from}", o.line()),
        Some(_) => println!(
            "kloop: control: the {} control came out {} (artefacts: {})",
            o.control,
            o.verdict,
            o.artefacts.display()
        ),
    }
}
