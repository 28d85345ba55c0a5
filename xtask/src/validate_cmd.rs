//! `validate`: a source built without and with patches, and the A/B of
//! the two kernels.

use std::process::ExitCode;

use anyhow::Result;
use kloop::run::suite::{self, EnvOptions};
use kloop::session::ab::AbOptions;
use kloop::session::validate::{self, ValidateOptions, Validated};

use crate::flags::*;
use crate::shared::ab::*;
use crate::shared::*;

impl Run for ValidateArgs {
    fn run(self) -> Result<ExitCode> {
        validate(self)
    }
}

/// `validate`: the source built without and with the patches, then the
/// A/B judged against the expected fixes (`kloop::session::validate`).
fn validate(a: ValidateArgs) -> Result<ExitCode> {
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
        validate::Event::Control(o, kept) => print_control(o, kept),
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
