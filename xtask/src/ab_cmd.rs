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
    let Some(shard) = a.shard else {
        return run_ab(layout, &baseline, &candidate, &a.scenarios, &opts, jobs);
    };
    // A shard of an A/B is a part of its scenarios, both kernels each.
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let chosen = kloop::scenario::select(&all, &a.scenarios)?;
    let planned: Vec<String> = kloop::run::ab::trials(&baseline, &candidate, &chosen)
        .iter()
        .map(|t| t.id())
        .collect();
    let names: Vec<String> = chosen.iter().map(|s| s.name.clone()).collect();
    let (mine, _) = kloop::run::shard::select(&names, shard, &Default::default());
    let mine: Vec<String> = mine.into_iter().map(|i| names[i].clone()).collect();
    println!(
        "kloop: shard {shard}: {} of {} scenario(s) of the A/B",
        mine.len(),
        names.len()
    );
    let ab = run_and_print_ab(layout, &baseline, &candidate, &mine, &opts, jobs)?;
    let manifest = kloop::report::merge::ShardManifest {
        kloop_commit: kloop::run::agent::kloop_commit(&layout.root),
        shard,
        mine: planned
            .iter()
            .filter(|id| mine.iter().any(|s| id.ends_with(&format!("/{s}"))))
            .cloned()
            .collect(),
        trials: planned,
    };
    std::fs::write(
        ab.run_dir.join(kloop::report::merge::MANIFEST),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(exit_of(&ab.acceptance(&[])))
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
    let ab = run_and_print_ab(layout, baseline, candidate, scenarios, opts, jobs)?;
    Ok(exit_of(&ab.acceptance(&[])))
}

fn exit_of(acceptance: &kloop::judge::ab::Acceptance) -> ExitCode {
    for r in &acceptance.reasons {
        println!("kloop: not accepted: {r}");
    }
    if acceptance.accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the A/B, writes its reports, prints the per-scenario report.
fn run_and_print_ab(
    layout: &Layout,
    baseline: &kloop::run::trial::KernelUnderTest,
    candidate: &kloop::run::trial::KernelUnderTest,
    scenarios: &[String],
    opts: &EnvOptions,
    jobs: usize,
) -> Result<kloop::run::ab::AbRun> {
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
            println!("kloop: accelerator: {}", env.accel);
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
    for problem in kloop::report::kcidb::write_run_document(
        &layout.root,
        &ab.run_dir,
        &[baseline.clone(), candidate.clone()],
        &ab.results,
        None,
    ) {
        eprintln!("kloop: {problem}");
    }
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
    Ok(ab)
}

/// `--fix` resolved against the source and the ledger, and the ids the
/// run must fix.
fn resolve_fix(
    layout: &Layout,
    a: &ValidateArgs,
    source: &kloop_kernels::build::SourceSpec,
) -> Result<(Option<kloop::run::fixes::Fix>, Vec<String>)> {
    let ledger = suite::load_ledger(layout)?;
    kloop::run::fixes::check_ids(&ledger, &a.expect_fixed)?;
    let Some(name) = &a.fix else {
        return Ok((None, a.expect_fixed.clone()));
    };
    let kloop_kernels::build::SourceSpec::Package(pin) = source else {
        bail!("--fix takes the fix's patch for a pinned source (linux-source-X.Y); for a tree, pass the patch with --patch and the ids with --expect-fixed");
    };
    let fix = kloop::run::fixes::resolve(&layout.kernels(), &ledger, name, &pin.package)?;
    let expected = if a.expect_fixed.is_empty() {
        fix.ids.clone()
    } else {
        a.expect_fixed.clone()
    };
    Ok((Some(fix), expected))
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
    for p in &a.patches {
        kloop_kernels::build::check_patch(p)?;
    }
    let base_req = build.request(&layout)?;
    let (fix, expected) = resolve_fix(&layout, &a, &base_req.source)?;
    let mut patches = a.patches.clone();
    patches.extend(fix.as_ref().map(|f| f.patch.clone()));
    if !expected.is_empty() {
        println!("kloop: validate: expecting fixed: {}", expected.join(", "));
    }
    let what = base_req.source.label();
    let (baseline, candidate) = match build_pair(&base_req, &patches) {
        Ok(pair) => pair,
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
    let ab = run_and_print_ab(
        &layout,
        &local(&baseline),
        &local(&candidate),
        &a.scenarios,
        &opts,
        jobs,
    )?;
    if ab.interrupted() {
        println!("kloop: validate: INTERRUPTED: the run was stopped before every trial ended; nothing is judged or recorded");
        return Ok(ExitCode::FAILURE);
    }
    let acceptance = ab.acceptance(&expected);
    let code = exit_of(&acceptance);
    println!(
        "kloop: validate: {}",
        validate_verdict(acceptance.accepted, patches.is_empty(), &expected)
    );
    if a.record {
        let fix = fix.as_ref().expect("clap: --record requires --fix");
        record_fix(&layout, fix, &expected, &what, &acceptance, &ab)?;
    }
    Ok(code)
}

/// The source built without and with `patches` (each cached by its
/// inputs); `Err`: the exit code of the build that failed.
fn build_pair(
    base_req: &kloop_kernels::build::BuildRequest,
    patches: &[std::path::PathBuf],
) -> std::result::Result<
    (
        kloop_kernels::build::BuiltKernel,
        kloop_kernels::build::BuiltKernel,
    ),
    ExitCode,
> {
    let what = base_req.source.label();
    let baseline = build_kernel(base_req, &format!("baseline: {what}"))?;
    let names: Vec<String> = patches.iter().map(|p| p.display().to_string()).collect();
    let candidate = build_kernel(
        &base_req.with_patches(patches.to_vec()),
        &format!("candidate: {what} + {}", names.join(" + ")),
    )?;
    Ok((baseline, candidate))
}

/// validate's closing line.
fn validate_verdict(accepted: bool, no_patches: bool, expected: &[String]) -> String {
    match (accepted, no_patches, expected.is_empty()) {
        (true, false, false) => format!("FIXED: the patches fix {} and change nothing else kloop checks", expected.join(", ")),
        (true, false, true) => "the patches change nothing kloop checks".to_string(),
        (false, false, _) => "REJECTED: the patches do not do what was expected (see above)".to_string(),
        (true, true, _) => "no patches: the source against itself is the same (the A/B's noise floor holds)".to_string(),
        (false, true, _) => "no patches, yet the source differs from itself: runs of this kernel are not reproducible (see above)".to_string(),
    }
}

/// `validate --record`: the result under each expected ledger entry.
fn record_fix(
    layout: &Layout,
    fix: &kloop::run::fixes::Fix,
    expected: &[String],
    source: &str,
    acceptance: &kloop::judge::ab::Acceptance,
    ab: &kloop::run::ab::AbRun,
) -> Result<()> {
    let rel = |p: &std::path::Path| {
        p.strip_prefix(&layout.root)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    let ledger = layout.kernels().join(kloop::judge::known_issues::FILE_NAME);
    let v = kloop::run::fixes::Validated {
        patch: rel(&fix.patch),
        source: source.to_string(),
        accepted: acceptance.accepted,
        outcomes: &ab.outcomes,
        date: kloop::judge::known_issues::Date::today().to_string(),
        run_dir: rel(&ab.run_dir),
    };
    kloop::run::fixes::record(&ledger, expected, &v)?;
    println!(
        "kloop: recorded in {}: {} {} for {}",
        ledger.display(),
        v.patch,
        if v.accepted { "FIXED" } else { "REJECTED" },
        expected.join(", ")
    );
    Ok(())
}
