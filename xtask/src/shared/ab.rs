//! The A/B's lines on the terminal, shared by `vm-test --baseline` and
//! `validate`.

use std::process::ExitCode;

use anyhow::Result;
use kloop::run::ab::AbRun;
use kloop::run::trial::KernelUnderTest;
use kloop::session::ab::{AbOptions, Event};
use kloop::workspace::Layout;

use super::{exit_code, start_trials};

pub(crate) fn exit_of(acceptance: &kloop::judge::ab::Acceptance) -> ExitCode {
    print_reasons(acceptance);
    exit_code(acceptance.accepted)
}

/// Why an A/B was not accepted, a line each.
pub(crate) fn print_reasons(acceptance: &kloop::judge::ab::Acceptance) {
    for r in &acceptance.reasons {
        println!("kloop: not accepted: {r}");
    }
}

/// Runs the A/B (which writes its reports) and prints the per-scenario
/// report.
pub(crate) fn run_and_print_ab(
    layout: &Layout,
    baseline: &KernelUnderTest,
    candidate: &KernelUnderTest,
    opts: &AbOptions,
) -> Result<AbRun> {
    start_trials();
    let ab = kloop::session::ab::run(layout, baseline, candidate, opts, &print_event)?;
    print_ab(&ab);
    Ok(ab)
}

/// An A/B's per-scenario report and where it is.
pub(crate) fn print_ab(ab: &AbRun) {
    let colour = kloop::report::ab::Colour::for_stdout();
    let table = kloop::report::ab::render(&ab.baseline, &ab.candidate, &ab.outcomes, colour);
    println!("\n{table}");
    println!(
        "kloop: A/B in {:.1} s ({}); report {}",
        ab.secs,
        ab.accel,
        ab.json.display()
    );
}

/// What an A/B run says, as lines on stdout.
pub(crate) fn print_event(e: Event<'_>) {
    match e {
        Event::Started {
            accel,
            baseline,
            candidate,
            run_dir,
        } => {
            println!("kloop: accelerator: {accel}");
            println!(
                "kloop: A/B: baseline {baseline}, candidate {candidate}; artefacts in {}",
                run_dir.display()
            );
        }
        Event::Note(text) => println!("kloop: {text}"),
        Event::Trial(r) => println!("{}", kloop::report::trial_line(r)),
    }
}
