//! `vm-test --baseline` and `validate`: A/B runs.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report;
use kloop::run::suite::{self, EnvOptions, Layout, Selection};
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
    let opts = a.env_options();
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    run_ab(layout, &baseline, &candidate, &a.scenarios, &opts, jobs)
}

/// Runs an A/B and prints its report; exit 0 only when no scenario
/// changed, broke or could not be compared.
pub(crate) fn run_ab(
    layout: &Layout,
    baseline: &kloop::run::trial::KernelUnderTest,
    candidate: &kloop::run::trial::KernelUnderTest,
    scenarios: &[String],
    opts: &EnvOptions,
    jobs: usize,
) -> Result<ExitCode> {
    start_trials();
    let started = std::time::Instant::now();
    let ab = kloop::run::ab::run(
        layout,
        baseline,
        candidate,
        scenarios,
        opts,
        jobs,
        &|env, base, cand| {
            println!("kloop: accelerator: {}", accel_line(&env.accel));
            println!(
                "kloop: A/B: baseline {base}, candidate {cand}; artefacts in {}",
                env.run_dir.display()
            );
        },
        &|r| println!("{}", report::trial_line(r)),
    )
    .context("preparing the A/B run")?;
    report::write_files(&ab.run_dir, &ab.results)
        .with_context(|| format!("writing reports into {}", ab.run_dir.display()))?;
    let json = kloop::report::ab::write_json(&ab.run_dir, &ab.outcomes)
        .with_context(|| format!("writing ab.json into {}", ab.run_dir.display()))?;
    println!();
    println!(
        "{}",
        kloop::report::ab::render(
            &ab.baseline,
            &ab.candidate,
            &ab.outcomes,
            kloop::report::ab::Colour::for_stdout()
        )
    );
    println!(
        "kloop: A/B in {:.1} s ({}); report {}",
        started.elapsed().as_secs_f64(),
        ab.accel,
        json.display()
    );
    Ok(if ab.accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `validate`: the source built without and with the patches (both
/// cached), then the A/B.
pub(crate) fn validate(a: ValidateArgs) -> Result<ExitCode> {
    let layout = layout();
    let build = BuildArgs {
        source: a.source.clone(),
        patches: Vec::new(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        fetch: a.fetch.clone(),
    };
    let base_req = build.request(&layout)?;
    let cand_req = base_req.with_patches(a.patches.clone());
    let what = base_req.source.label();
    let baseline = match build_kernel(&base_req, &format!("baseline: {what}")) {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let candidate = match build_kernel(
        &cand_req,
        &format!(
            "candidate: {what} + {}",
            a.patches
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + ")
        ),
    ) {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let catalog = Catalog::load(&layout.kernels())?;
    let local = |k: &kloop_kernels::build::BuiltKernel| {
        kloop::run::trial::KernelUnderTest::Image(kloop::run::trial::LocalKernel::built(
            k, None, &catalog,
        ))
    };
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let code = run_ab(
        &layout,
        &local(&baseline),
        &local(&candidate),
        &a.scenarios,
        &opts,
        jobs,
    )?;
    let verdict = match (code == ExitCode::SUCCESS, a.patches.is_empty()) {
        (true, false) => "the patches change nothing kloop checks",
        (false, false) => "REJECTED: the patches change or break the records (see above)",
        (true, true) => "no patches: the source against itself is the same (the A/B's noise floor holds)",
        (false, true) => "no patches, yet the source differs from itself: runs of this kernel are not reproducible (see above)",
    };
    println!("kloop: validate: {verdict}");
    Ok(code)
}
