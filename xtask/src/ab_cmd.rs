//! `vm-test --baseline` and `validate`: A/B runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kloop::run::ab::{AbRun, KeptBaseline};
use kloop::run::fixes::Fix;
use kloop::run::suite::{self, EnvOptions, Layout, Selection};
use kloop::run::trial::{KernelUnderTest, LocalKernel};
use kloop::run::validate;
use kloop::session::ab::{AbOptions, Event};
use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_kernels::Catalog;

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
    let candidates = suite::resolve_kernels(layout, sel)?;
    let candidate = match (candidates.as_slice(), sel.kernels.is_empty() && sel.kernel_image.is_none()) {
        ([one], false) => one.clone(),
        _ => bail!("--baseline compares one candidate: name it with one --kernel (a pin, built:ID or a bzImage) or --kernel-image"),
    };
    let catalog = Catalog::load(&layout.kernels())?;
    let baseline = suite::resolve_kernel(&catalog, baseline, None)?;
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
    for r in &acceptance.reasons {
        println!("kloop: not accepted: {r}");
    }
    exit_code(acceptance.accepted)
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
    let colour = kloop::report::ab::Colour::for_stdout();
    let table = kloop::report::ab::render(&ab.baseline, &ab.candidate, &ab.outcomes, colour);
    println!("\n{table}");
    println!(
        "kloop: A/B in {:.1} s ({}); report {}",
        ab.secs,
        ab.accel,
        ab.json.display()
    );
    Ok(ab)
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

/// `validate`: the source built without and with the patches (both
/// cached), then the A/B. While the candidate builds, the baseline's
/// trials that no earlier run kept run and are kept, so the A/B runs only
/// the candidate's.
pub(crate) fn validate(a: ValidateArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let layout = layout();
    let plan = validate_plan(&a, &layout)?;
    let catalog = Catalog::load(&layout.kernels())?;
    let local = |k: &BuiltKernel| KernelUnderTest::Image(LocalKernel::built(k, None, &catalog));
    let opts = validate_ab_options(&a);
    let kernels = match build_both(&layout, &plan, &opts, &local)? {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let ab_started = Instant::now();
    let ab = run_and_print_ab(&layout, &kernels.baseline, &kernels.candidate, &opts)?;
    if ab.interrupted() {
        println!("kloop: validate: INTERRUPTED: the run was stopped before every trial ended; nothing is judged or recorded");
        return Ok(ExitCode::FAILURE);
    }
    let code = conclude(&layout, &a, &plan, &ab)?;
    let timing = validate::Timing::of(
        started.elapsed().as_secs_f64(),
        kernels.builds,
        ab_started.elapsed().as_secs_f64(),
        &ab,
    )
    .with_early_baseline(kernels.early);
    timing.write(&ab.run_dir).with_context(|| {
        format!(
            "writing {} in {}",
            validate::Timing::FILE,
            ab.run_dir.display()
        )
    })?;
    println!("kloop: {}", timing.line());
    Ok(code)
}

/// What `validate` builds and expects: the baseline's build request, the
/// candidate's patches (`--patch`, then the `--fix` folder's) and the
/// ledger ids the candidate must show fixed.
struct ValidatePlan {
    base_req: BuildRequest,
    patches: Vec<PathBuf>,
    fix: Option<Fix>,
    expected: Vec<String>,
}

fn validate_plan(a: &ValidateArgs, layout: &Layout) -> Result<ValidatePlan> {
    let base_req = BuildArgs {
        source: a.source.clone(),
        patches: a.patches.clone(),
        checks: a.checks.clone(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        fetch: a.fetch.clone(),
    }
    .request(layout)?
    .with_patches(Vec::new());
    let (fix, expected) =
        validate::expected_fixes(layout, a.fix.as_deref(), &a.expect_fixed, &base_req.source)?;
    // The fix's base (its folder's fix.toml) goes beneath everything, on
    // both sides: the baseline is the source with the base applied.
    let beneath: Vec<PathBuf> = fix.as_ref().map(|f| f.base.clone()).unwrap_or_default();
    let base_req = base_req.with_patches(beneath.clone());
    let mut patches = beneath.clone();
    patches.extend(a.patches.iter().cloned());
    patches.extend(fix.as_ref().map(|f| f.patch.clone()));
    if !beneath.is_empty() {
        let names: Vec<String> = beneath.iter().map(|p| p.display().to_string()).collect();
        println!(
            "kloop: validate: beneath the baseline and the candidate: {}",
            names.join(" + ")
        );
    }
    if !expected.is_empty() {
        println!("kloop: validate: expecting fixed: {}", expected.join(", "));
    }
    Ok(ValidatePlan {
        base_req,
        patches,
        fix,
        expected,
    })
}

/// The two kernels `validate` compares, and what building them took.
struct ValidateKernels {
    baseline: KernelUnderTest,
    candidate: KernelUnderTest,
    /// The baseline's trials run while the candidate compiled.
    early: KeptBaseline,
    /// Build seconds, and whether the baseline and the candidate came
    /// from the cache, for [`validate::Timing`].
    builds: (f64, bool, bool),
}

/// Builds the baseline, then the candidate while the baseline's missing
/// trials run and are kept; `Err(code)` when a build failed.
fn build_both(
    layout: &Layout,
    plan: &ValidatePlan,
    opts: &AbOptions,
    local: &dyn Fn(&BuiltKernel) -> KernelUnderTest,
) -> Result<std::result::Result<ValidateKernels, ExitCode>> {
    let building = Instant::now();
    let what = plan.base_req.source.label();
    let baseline = match build_kernel(&plan.base_req, &format!("baseline: {what}")) {
        Ok(k) => k,
        Err(code) => return Ok(Err(code)),
    };
    let baseline_kernel = local(&baseline);
    let names: Vec<String> = plan
        .patches
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let cand_req = plan.base_req.with_patches(plan.patches.clone());
    let (candidate, early) = std::thread::scope(|s| {
        let early = opts.reuse_baseline.then(|| {
            s.spawn(|| {
                start_trials();
                kloop::session::ab::keep_baseline(layout, &baseline_kernel, opts, &print_event)
            })
        });
        let candidate = build_kernel(
            &cand_req,
            &format!("candidate: {what} + {}", names.join(" + ")),
        );
        if candidate.is_err() && early.is_some() {
            println!(
                "kloop: validate: waiting for the baseline's trials to end (kept for the next \
                 validate) before reporting the candidate's build"
            );
        }
        let early = early.map(|h| h.join().expect("the baseline's trials do not panic"));
        (candidate, early)
    });
    let candidate = match candidate {
        Ok(k) => k,
        Err(code) => return Ok(Err(code)),
    };
    Ok(Ok(ValidateKernels {
        builds: (
            building.elapsed().as_secs_f64(),
            baseline.cached,
            candidate.cached,
        ),
        baseline: baseline_kernel,
        candidate: local(&candidate),
        early: early.transpose()?.unwrap_or_default(),
    }))
}

/// The A/B judged against the expected fixes: the conclusion printed,
/// `--record`ed in the ledger when asked, and the exit status.
fn conclude(
    layout: &Layout,
    a: &ValidateArgs,
    plan: &ValidatePlan,
    ab: &AbRun,
) -> Result<ExitCode> {
    let acceptance = ab.acceptance(&plan.expected);
    let code = exit_of(&acceptance);
    let conclusion =
        validate::conclusion(acceptance.accepted, plan.patches.is_empty(), &plan.expected);
    println!("kloop: validate: {conclusion}");
    if a.record {
        let fix = plan.fix.as_ref().expect("clap: --record requires --fix");
        let source = plan.base_req.source.label();
        let line = validate::record(layout, fix, &plan.expected, &source, &acceptance, ab)?;
        println!("kloop: {line}");
    }
    Ok(code)
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
