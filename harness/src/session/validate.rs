//! `validate`: the source built without and with the patches (both
//! cached), then the A/B ([`super::ab`]) judged against the fixes it must
//! show, `--record`ed when asked, and its wall split left as
//! [`Timing::FILE`]. While the candidate builds, the baseline's trials
//! that no earlier run kept run and are kept, so the A/B runs only the
//! candidate's.
//!
//! The decisions themselves (which fix, the conclusion, the ledger's
//! record) are [`crate::run::validate`]'s; the builds are the caller's
//! (it draws their progress and says what a failed one means).

use std::path::PathBuf;
use std::time::Instant;

use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_kernels::Catalog;
use kloop_path_io::{PathIo, PathIoExt};

use crate::judge::ab::Acceptance;
use crate::run::ab::{AbRun, KeptBaseline};
use crate::run::fixes::Fix;
use crate::run::trial::{KernelUnderTest, LocalKernel};
use crate::run::validate::{self, Timing, ValidateError};
use crate::session::ab::{self, AbError, AbOptions};
use crate::workspace::Layout;

/// What `validate` is asked.
#[derive(Debug, Clone)]
pub struct ValidateOptions {
    /// The source's build request, without patches.
    pub base: BuildRequest,
    /// `--patch`, in order (the `--fix` folder's patch comes after them).
    pub patches: Vec<PathBuf>,
    /// `--fix`: a folder under `kernels/fixes/` or a path to one.
    pub fix: Option<String>,
    pub expect_fixed: Vec<String>,
    /// `--record`: the result into the ledger (needs `fix`).
    pub record: bool,
    /// The A/B: every scenario asked for, one run per side.
    pub ab: AbOptions,
}

/// What the caller hears while `validate` works.
pub enum Event<'a> {
    /// The fix's base patches, beneath the baseline and the candidate.
    Beneath(&'a [PathBuf]),
    /// The ledger ids the candidate must show fixed.
    ExpectingFixed(&'a [String]),
    /// The candidate's build failed; its failure is told once the
    /// baseline's trials running meanwhile have ended.
    WaitingForBaseline,
    /// The A/B's own events (the baseline's early trials included).
    Ab(ab::Event<'a>),
    /// The A/B ended, its reports written.
    AbDone(&'a AbRun),
    /// The A/B judged against the expected fixes (before `--record`).
    Judged {
        acceptance: &'a Acceptance,
        conclusion: &'a str,
    },
    /// `--record` wrote the result into the ledger: the line that says so.
    Recorded(&'a str),
    /// A check's positive control on the baseline or the candidate
    /// (`--checks`), and whether it was kept from an earlier run.
    Control(&'a crate::run::controls::ControlOutcome, bool),
}

/// How `validate` ended.
#[derive(Debug)]
pub enum Validated<E> {
    /// A build failed: what the caller's builder answered.
    BuildFailed(E),
    /// The run was stopped before every trial ended: nothing judged.
    Interrupted,
    /// Judged (see [`Event::Judged`]); the wall split written.
    Judged { accepted: bool, timing: Timing },
    /// A check the kernels were built with is blind on one of them (its
    /// positive control did not come out as it must): a sentence each.
    /// No trial of it ran.
    Blind(Vec<String>),
}

#[derive(Debug, thiserror::Error)]
pub enum ValidateRunError {
    #[error(transparent)]
    Validate(#[from] ValidateError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Ab(#[from] AbError),
    #[error(transparent)]
    Controls(crate::session::kernels::ControlsRunError),
    #[error(transparent)]
    Io(#[from] PathIo),
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

/// Runs `validate`: `build` builds a kernel (its request and a label for
/// its progress) or says why not, which ends the run as
/// [`Validated::BuildFailed`].
pub fn run<E>(
    layout: &Layout,
    opts: &ValidateOptions,
    build: &mut dyn FnMut(&BuildRequest, &str) -> Result<BuiltKernel, E>,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Validated<E>, ValidateRunError> {
    let started = Instant::now();
    let plan = plan(layout, opts, on)?;
    let catalog = Catalog::load_all(&layout.kernels())?;
    let local = |k: &BuiltKernel| KernelUnderTest::Image(LocalKernel::built(k, None, &catalog));
    let kernels = match build_both(layout, &plan, &opts.ab, build, &local, on)? {
        Ok(Ok(k)) => k,
        Ok(Err(blind)) => return Ok(Validated::Blind(blind)),
        Err(e) => return Ok(Validated::BuildFailed(e)),
    };
    let ab_started = Instant::now();
    super::start_trials();
    let ab = ab::run(
        layout,
        &kernels.baseline,
        &kernels.candidate,
        &opts.ab,
        &|e| on(Event::Ab(e)),
    )?;
    on(Event::AbDone(&ab));
    if ab.interrupted() {
        return Ok(Validated::Interrupted);
    }
    let accepted = conclude(layout, opts, &plan, &ab, on)?;
    let timing = Timing::of(
        started.elapsed().as_secs_f64(),
        kernels.builds,
        ab_started.elapsed().as_secs_f64(),
        &ab,
    )
    .with_early_baseline(kernels.early);
    timing
        .write(&ab.run_dir)
        .at("writing", ab.run_dir.join(Timing::FILE))?;
    Ok(Validated::Judged { accepted, timing })
}

fn plan(
    layout: &Layout,
    opts: &ValidateOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<ValidatePlan, ValidateRunError> {
    let (fix, expected) = validate::expected_fixes(
        layout,
        opts.fix.as_deref(),
        &opts.expect_fixed,
        &opts.base.source,
    )?;
    // The fix's base (its folder's fix.toml) goes beneath everything, on
    // both sides: the baseline is the source with the base applied.
    let beneath: Vec<PathBuf> = fix.as_ref().map(|f| f.base.clone()).unwrap_or_default();
    let base_req = opts.base.with_patches(beneath.clone());
    let mut patches = beneath.clone();
    patches.extend(opts.patches.iter().cloned());
    patches.extend(fix.as_ref().map(|f| f.patch.clone()));
    if !beneath.is_empty() {
        on(Event::Beneath(&beneath));
    }
    if !expected.is_empty() {
        on(Event::ExpectingFixed(&expected));
    }
    Ok(ValidatePlan {
        base_req,
        patches,
        fix,
        expected,
    })
}

/// Builds the baseline, then the candidate while the baseline's missing
/// trials run and are kept; `Err(e)` when a build failed. With `--checks`
/// each kernel's controls run first ([`controls_on`]): `Ok(Err(lines))`
/// when a check is blind on one of them.
fn build_both<E>(
    layout: &Layout,
    plan: &ValidatePlan,
    opts: &AbOptions,
    build: &mut dyn FnMut(&BuildRequest, &str) -> Result<BuiltKernel, E>,
    local: &dyn Fn(&BuiltKernel) -> KernelUnderTest,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Result<Result<ValidateKernels, Vec<String>>, E>, ValidateRunError> {
    let building = Instant::now();
    let what = plan.base_req.source.label();
    let baseline = match build(&plan.base_req, &format!("baseline: {what}")) {
        Ok(k) => k,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(blind) = controls_on(layout, plan, opts, &baseline, on)? {
        return Ok(Ok(Err(blind)));
    }
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
                super::start_trials();
                ab::keep_baseline(layout, &baseline_kernel, opts, &|e| on(Event::Ab(e)))
            })
        });
        let candidate = build(
            &cand_req,
            &format!("candidate: {what} + {}", names.join(" + ")),
        );
        if candidate.is_err() && early.is_some() {
            on(Event::WaitingForBaseline);
        }
        let early = early.map(|h| h.join().expect("the baseline's trials do not panic"));
        (candidate, early)
    });
    let candidate = match candidate {
        Ok(k) => k,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(blind) = controls_on(layout, plan, opts, &candidate, on)? {
        return Ok(Ok(Err(blind)));
    }
    Ok(Ok(Ok(ValidateKernels {
        builds: (
            building.elapsed().as_secs_f64(),
            baseline.cached,
            candidate.cached,
        ),
        baseline: baseline_kernel,
        candidate: local(&candidate),
        early: early.transpose()?.unwrap_or_default(),
    })))
}

/// With `--checks` (the request builds the controls), each check's
/// positive control on `kernel` ([`crate::session::kernels::controls`]);
/// `Err(lines)` when a check is blind on it.
fn controls_on(
    layout: &Layout,
    plan: &ValidatePlan,
    opts: &AbOptions,
    kernel: &BuiltKernel,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Result<(), Vec<String>>, ValidateRunError> {
    use crate::run::controls::ControlsError;
    use crate::session::kernels::ControlsRunError;
    if plan.base_req.controls.is_none() {
        return Ok(Ok(()));
    }
    match crate::session::kernels::controls(layout, kernel, &opts.env, &|o, kept| {
        on(Event::Control(o, kept))
    }) {
        Ok(_) => Ok(Ok(())),
        Err(ControlsRunError::Controls(ControlsError::Blind(lines))) => Ok(Err(lines)),
        Err(e) => Err(ValidateRunError::Controls(e)),
    }
}

/// The A/B judged against the expected fixes: the conclusion told,
/// `--record`ed in the ledger when asked; whether it was accepted.
fn conclude(
    layout: &Layout,
    opts: &ValidateOptions,
    plan: &ValidatePlan,
    ab: &AbRun,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<bool, ValidateRunError> {
    let acceptance = ab.acceptance(&plan.expected);
    let conclusion =
        validate::conclusion(acceptance.accepted, plan.patches.is_empty(), &plan.expected);
    on(Event::Judged {
        acceptance: &acceptance,
        conclusion: &conclusion,
    });
    if opts.record {
        let fix = plan.fix.as_ref().expect("clap: --record requires --fix");
        let source = plan.base_req.source.label();
        let line = validate::record(layout, fix, &plan.expected, &source, &acceptance, ab)?;
        on(Event::Recorded(&line));
    }
    Ok(acceptance.accepted)
}
