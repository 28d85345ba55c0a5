//! `vm-test --baseline` and `validate`: A/B runs.

use std::process::ExitCode;

use anyhow::{bail, Result};
use kloop::run::ab::AbRun;
use kloop::run::suite::{self, EnvOptions, Selection};
use kloop::run::trial::KernelUnderTest;
use kloop::session::ab::{AbOptions, Event};
use kloop::session::validate::{self, ValidateOptions, Validated};
use kloop::workspace::Layout;

use crate::*;

/// `vm-test --baseline`: the candidate (the one kernel --kernel or
/// --kernel-image names) against the baseline, scenario by scenario.
pub(crate) fn ab_test(
    layout: &Layout,
    a: &VmTestArgs,
    sel: &Selection,
    baseline: &str,
) -> Result<ExitCode> {
    if a.repeat > 1 {
        bail!("--baseline compares one run of each side; check stability with --repeat on each kernel first");
    }
    let (baseline, candidate) = kloop::session::ab::sides(layout, sel, baseline)?;
    let opts = AbOptions {
        scenarios: a.scenarios.clone(),
        env: a.env_options(),
        jobs: suite::Parallel::from_flag(a.jobs),
        shard: a.shard,
        reuse_baseline: !a.rerun_baseline,
    };
    let ab = run_and_print_ab(layout, &baseline, &candidate, &opts)?;
    Ok(exit_of(&ab.acceptance(&[])))
}

fn exit_of(acceptance: &kloop::judge::ab::Acceptance) -> ExitCode {
    print_reasons(acceptance);
    exit_code(acceptance.accepted)
}

/// Why an A/B was not accepted, a line each.
fn print_reasons(acceptance: &kloop::judge::ab::Acceptance) {
    for r in &acceptance.reasons {
        println!("kloop: not accepted: {r}");
    }
}

/// Runs the A/B (which writes its reports) and prints the per-scenario
/// report.
fn run_and_print_ab(
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
fn print_ab(ab: &AbRun) {
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
fn print_event(e: Event<'_>) {
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

/// `validate`: the source built without and with the patches, then the
/// A/B judged against the expected fixes (`kloop::session::validate`).
pub(crate) fn validate(a: ValidateArgs) -> Result<ExitCode> {
    let layout = layout();
    let opts = ValidateOptions {
        base: BuildArgs {
            source: a.source.clone(),
            patches: a.patches.clone(),
            checks: a.checks.clone(),
            fragments: a.fragments.clone(),
            base: a.base,
            jobs: a.jobs,
            arch: a.arch,
            fetch: a.fetch.clone(),
        }
        .request(&layout)?
        .with_patches(Vec::new()),
        patches: a.patches.clone(),
        fix: a.fix.clone(),
        expect_fixed: a.expect_fixed.clone(),
        record: a.record,
        ab: validate_ab_options(&a),
    };
    let validated = kloop::session::validate::run(
        &layout,
        &opts,
        &mut |req, what| build_kernel(req, what),
        &print_validate_event,
    )?;
    Ok(match validated {
        Validated::BuildFailed(code) => code,
        Validated::Blind(lines) => {
            for l in lines {
                eprintln!("kloop: validate: {l}");
            }
            ExitCode::FAILURE
        }
        Validated::Interrupted => {
            println!("kloop: validate: INTERRUPTED: the run was stopped before every trial ended; nothing is judged or recorded");
            ExitCode::FAILURE
        }
        Validated::Judged { accepted, timing } => {
            println!("kloop: {}", timing.line());
            exit_code(accepted)
        }
    })
}

/// What `validate` says, as lines on stdout.
fn print_validate_event(e: validate::Event<'_>) {
    match e {
        validate::Event::Beneath(patches) => {
            let names: Vec<String> = patches.iter().map(|p| p.display().to_string()).collect();
            println!(
                "kloop: validate: beneath the baseline and the candidate: {}",
                names.join(" + ")
            );
        }
        validate::Event::ExpectingFixed(ids) => {
            println!("kloop: validate: expecting fixed: {}", ids.join(", "));
        }
        validate::Event::WaitingForBaseline => println!(
            "kloop: validate: waiting for the baseline's trials to end (kept for the next \
             validate) before reporting the candidate's build"
        ),
        validate::Event::Ab(e) => print_event(e),
        validate::Event::AbDone(ab) => print_ab(ab),
        validate::Event::Judged {
            acceptance,
            conclusion,
        } => {
            print_reasons(acceptance);
            println!("kloop: validate: {conclusion}");
        }
        validate::Event::Recorded(line) => println!("kloop: {line}"),
        validate::Event::Control(o, kept) => crate::kernels_cmd::print_control(o, kept),
    }
}

/// The A/B `validate` runs: every scenario asked for, one run per
/// side, the baseline's kept results reused unless `--rerun-baseline`.
fn validate_ab_options(a: &ValidateArgs) -> AbOptions {
    AbOptions {
        scenarios: a.scenarios.clone(),
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            ..EnvOptions::default()
        },
        jobs: suite::Parallel::from_flag(a.jobs),
        shard: None,
        reuse_baseline: !a.rerun_baseline,
    }
}
