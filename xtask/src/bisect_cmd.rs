//! `bisect` over Debian builds or a git tree, and `bisect-step`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report;
use kloop::run::suite::{self, EnvOptions, Layout};
use kloop_kernels::{Catalog, KernelCache};

use crate::*;

/// `bisect` over the builds the mirror serves.
pub(crate) fn bisect(a: BisectArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::Predicate;
    let layout = layout();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let cache = KernelCache::default_location()?;
    let catalog = Catalog::load(&layout.kernels())?;
    let (old, new, range) = build_range(&a, &cache, &catalog)?;
    let names: Vec<String> = range.iter().map(|b| b.version.clone()).collect();
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    start_trials();
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    // The first end that can be had probes KVM.
    let first = catalog
        .pins()
        .iter()
        .find(|p| p.version == old)
        .cloned()
        .map(kloop::run::trial::KernelUnderTest::Pin);
    let env = suite::prepare_env(&layout, &opts, first.as_slice())?;
    let band = overhead_band(&env, &scenario);
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    println!(
        "kloop: bisect {} over {} build(s) from {old} (old) to {new} (new), predicate {}, {} run(s) per step; artefacts in {}",
        scenario.name,
        names.len(),
        a.predicate,
        a.repeat,
        env.run_dir.display()
    );
    let mut lock = kloop_kernels::available::BisectLock::load(&layout.kernels())?;
    let fetch = a.fetch.options();
    let mut kernel_at = |i: usize| -> std::result::Result<
        kloop::run::trial::KernelUnderTest,
        kloop::run::bisect::KernelUnavailable,
    > {
        let b = &range[i];
        if let Some(p) = catalog.pins().iter().find(|p| p.version == b.version) {
            return Ok(kloop::run::trial::KernelUnderTest::Pin(p.clone()));
        }
        lock.ensure(&cache, &layout.kernels(), b, &fetch)
            .map(|pin| kloop::run::trial::KernelUnderTest::distro_build(pin, &catalog))
            .map_err(|e| {
                kloop::run::bisect::KernelUnavailable::Infrastructure(format!(
                    "pinning {}: {e}",
                    b.version
                ))
            })
    };
    let started = std::time::Instant::now();
    let mut step_no = 0;
    let outcome = kloop::run::bisect::bisect(
        &env,
        &scenario,
        &names,
        &mut kernel_at,
        &predicate,
        a.repeat as usize,
        a.jobs.unwrap_or_else(suite::default_jobs),
        band,
        &mut |s| {
            step_no += 1;
            println!("{}", step_line(step_no, s));
        },
    );
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bisect: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    print_outcome(&outcome, &names, &range, started);
    let path = env.run_dir.join("bisect.json");
    std::fs::write(&path, serde_json::to_string_pretty(&outcome)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("kloop: report {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// The builds from `--old` to `--new` (pin ids name their builds), in
/// search order: old first, also when old is the later build (a fix
/// searched backwards). Returns the two versions and the range.
fn build_range(
    a: &BisectArgs,
    cache: &KernelCache,
    catalog: &Catalog,
) -> Result<(
    String,
    String,
    Vec<kloop_kernels::available::AvailableBuild>,
)> {
    let (builds, _) = available_builds(cache, &a.fetch, false)?;
    let version_of = |end: &str| -> String {
        catalog
            .get(end)
            .map(|p| p.version.clone())
            .unwrap_or_else(|_| end.to_string())
    };
    let (old, new) = (version_of(&a.old), version_of(&a.new));
    let index_of = |v: &str| {
        builds.iter().position(|b| b.version == v).with_context(|| {
            format!("{v} is not a build the mirror serves; see `cargo xtask kernels available`")
        })
    };
    let (i_old, i_new) = (index_of(&old)?, index_of(&new)?);
    let range: Vec<_> = if i_old <= i_new {
        builds[i_old..=i_new].to_vec()
    } else {
        builds[i_new..=i_old].iter().rev().cloned().collect()
    };
    Ok((old, new, range))
}

/// One step's line: the build, its verdict, its time and its runs' first
/// lines.
fn step_line(step_no: usize, s: &kloop::run::bisect::StepReport) -> String {
    use kloop::judge::bisect::StepVerdict;
    let verdict = match &s.verdict {
        StepVerdict::Old => "old".to_string(),
        StepVerdict::New => "new".to_string(),
        StepVerdict::Skip(why) => format!("skip ({why})"),
    };
    format!(
        "step {step_no}: {} → {verdict} ({:.1} s; {})",
        s.kernel,
        s.secs,
        s.runs
            .iter()
            .map(|r| r.1.split('\n').next().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// The answer: first new and last old build, what is ambiguous, the
/// difference, and the cost.
fn print_outcome(
    outcome: &kloop::run::bisect::BisectOutcome,
    names: &[String],
    range: &[kloop_kernels::available::AvailableBuild],
    started: std::time::Instant,
) {
    let s = &outcome.search;
    println!();
    println!(
        "first new build: {} ({})",
        names[s.first_new], range[s.first_new].package
    );
    println!(
        "last old build:  {} ({})",
        names[s.last_old], range[s.last_old].package
    );
    if !s.skipped_between.is_empty() {
        println!(
            "ambiguous: skipped build(s) between them: {}",
            s.skipped_between
                .iter()
                .map(|&i| names[i].clone())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for line in &outcome.difference {
        println!("  {line}");
    }
    println!(
        "kloop: {} step(s) ({} runs), {:.0} s, confidence {:.0}%",
        outcome.steps.len(),
        outcome.steps.iter().map(|s| s.runs.len()).sum::<usize>(),
        started.elapsed().as_secs_f64(),
        outcome.confidence * 100.0
    );
}

/// Builds the tree at `dir` (kloop.config + fragments) quietly, printing
/// phases.
pub(crate) fn build_tree(
    layout: &Layout,
    dir: &std::path::Path,
    fragments: &[PathBuf],
) -> std::result::Result<kloop_kernels::build::BuiltKernel, kloop_kernels::build::BuildError> {
    let req = kloop_kernels::build::BuildRequest {
        fragments: fragments.to_vec(),
        ..kloop_kernels::build::BuildRequest::new(
            kloop_kernels::build::SourceSpec::Tree(dir.to_path_buf()),
            &layout.kernels(),
        )
    };
    let cache = KernelCache::default_location()?;
    let mut progress = build_progress::BuildProgress::new(&dir.display().to_string());
    let r = kloop_kernels::build::build(&cache, &req, &mut |e| progress.event(e));
    progress.finish();
    r
}

pub(crate) fn tree_kernel(
    layout: &Layout,
    k: &kloop_kernels::build::BuiltKernel,
) -> Result<kloop::run::trial::KernelUnderTest> {
    let catalog = Catalog::load(&layout.kernels())?;
    Ok(kloop::run::trial::KernelUnderTest::Image(
        kloop::run::trial::LocalKernel::built(k, None, &catalog),
    ))
}

/// `bisect --tree`: the ends evaluated here, then `git bisect run` with
/// `bisect-step` in a worktree.
pub(crate) fn bisect_tree(a: BisectArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::{classify, Observation, Predicate, RunClass};
    use kloop_kernels::build::git::{git, Worktree};
    let layout = layout();
    let repo = a
        .tree
        .clone()
        .expect("checked by the caller")
        .canonicalize()?;
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    let commit = |rev: &str| {
        git(
            &repo,
            &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
        )
    };
    let (old, new) = (commit(&a.old)?, commit(&a.new)?);
    let cache = KernelCache::default_location()?;
    // One worktree location for every bisection: its output directory
    // (keyed by the tree's path) then serves the next bisection too.
    let wt_dir = cache.root().join("build/bisect/worktree");
    start_trials();
    let worktree = Worktree::add(&repo, &wt_dir, &old)?;
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, &[])?;
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    println!(
        "kloop: bisect {} over {}..{} in a worktree of {} ({}); predicate {}, {} run(s) per step",
        scenario.name,
        &old[..12],
        &new[..12],
        repo.display(),
        worktree.dir.display(),
        a.predicate,
        a.repeat
    );
    let band = overhead_band(&env, &scenario);
    let started = std::time::Instant::now();
    let end = TreeEnd {
        layout: &layout,
        env: &env,
        worktree: &worktree.dir,
        fragments: &a.fragments,
        scenario: &scenario,
        predicate: &predicate,
        repeat: a.repeat as usize,
        jobs: a.jobs.unwrap_or_else(suite::default_jobs),
    };
    let old_obs = end.observe(&old)?;
    let reference = old_obs
        .iter()
        .find(|o| !matches!(o, Observation::NoVerdict(_)))
        .cloned()
        .with_context(|| format!("the old end {} reached no verdict", &old[..12]))?;
    let new_obs = end.observe(&new)?;
    if !new_obs
        .iter()
        .any(|o| classify(&reference, o, band) == RunClass::New)
    {
        bail!(
            "the new end {} is not new under {}: nothing to bisect",
            &new[..12],
            a.predicate
        );
    }
    run_git_bisect(&a, &repo, &end, (&old, &new), &reference, band)?;
    println!(
        "kloop: {:.0} s; steps in {}, git's log in {}",
        started.elapsed().as_secs_f64(),
        env.run_dir.join("bisect-steps.log").display(),
        env.run_dir.join("bisect.log").display()
    );
    drop(worktree);
    Ok(ExitCode::SUCCESS)
}

/// What observing one end of a tree bisection needs.
struct TreeEnd<'a> {
    layout: &'a suite::Layout,
    env: &'a kloop::run::trial::TrialEnv,
    worktree: &'a std::path::Path,
    fragments: &'a [PathBuf],
    scenario: &'a kloop::scenario::Scenario,
    predicate: &'a kloop::judge::bisect::Predicate,
    repeat: usize,
    jobs: usize,
}

impl TreeEnd<'_> {
    /// Checks `rev` out in the worktree, builds it (an end must build) and
    /// runs the scenario on it `repeat` times.
    fn observe(&self, rev: &str) -> Result<Vec<kloop::judge::bisect::Observation>> {
        use kloop_kernels::build::git::git;
        git(self.worktree, &["checkout", "--quiet", "--detach", rev])?;
        let t = std::time::Instant::now();
        let built = build_tree(self.layout, self.worktree, self.fragments)
            .map_err(|e| anyhow::anyhow!("the end {rev} must build: {e}"))?;
        println!(
            "kloop: {} built as built:{} in {:.0} s",
            &rev[..12],
            built.record.id,
            t.elapsed().as_secs_f64()
        );
        let kernel = tree_kernel(self.layout, &built)?;
        let (obs, results) = kloop::run::bisect::observe_kernel(
            self.env,
            self.scenario,
            &kernel,
            self.predicate,
            self.repeat,
            self.jobs,
        );
        for r in &results {
            println!("{}", report::trial_line(r));
        }
        Ok(obs)
    }
}

/// Writes the reference observation, drives `git bisect run` with
/// `bisect-step` between `old` and `new` in the worktree, keeps git's log
/// and prints the first new commit.
fn run_git_bisect(
    a: &BisectArgs,
    repo: &std::path::Path,
    end: &TreeEnd<'_>,
    (old, new): (&str, &str),
    reference: &kloop::judge::bisect::Observation,
    band: f64,
) -> Result<()> {
    use kloop_kernels::build::git::git;
    let env = end.env;
    let reference_path = env.run_dir.join("bisect-reference.json");
    std::fs::write(&reference_path, serde_json::to_string(reference)?)?;
    let steps_log = env.run_dir.join("bisect-steps.log");
    git(
        end.worktree,
        &[
            "bisect",
            "start",
            "--term-old=old",
            "--term-new=new",
            new,
            old,
        ],
    )?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new("git");
    cmd.arg("-C")
        .arg(end.worktree)
        .args(["bisect", "run"])
        .arg(&exe)
        .arg("bisect-step")
        .arg("--tree")
        .arg(end.worktree)
        .args([
            "--scenario",
            &end.scenario.name,
            "--predicate",
            &a.predicate,
        ])
        .args([
            "--repeat",
            &a.repeat.to_string(),
            "--band",
            &band.to_string(),
        ])
        .arg("--reference")
        .arg(&reference_path)
        .arg("--steps-log")
        .arg(&steps_log)
        .args(["--accel", &a.accel.to_string()]);
    if let Some(l) = &a.label {
        cmd.args(["--label", l]);
    }
    for f in &a.fragments {
        cmd.arg("--config")
            .arg(f.canonicalize().unwrap_or_else(|_| f.clone()));
    }
    let status = cmd.status().context("running git bisect run")?;
    let log = git(end.worktree, &["bisect", "log"]).unwrap_or_default();
    std::fs::write(env.run_dir.join("bisect.log"), &log)?;
    let first = git(end.worktree, &["rev-parse", "refs/bisect/new"]).ok();
    println!();
    if !status.success() {
        println!(
            "kloop: git bisect run ended with {status}; see {}",
            env.run_dir.display()
        );
    }
    if let Some(first) = first {
        let subject = git(
            repo,
            &["log", "-1", "--abbrev=12", "--format=%h %s", &first],
        )?;
        println!("first new commit: {subject}");
    }
    Ok(())
}

/// `bisect-step`: what `git bisect run` calls. Exit 0 old, 1 new, 125 skip.
pub(crate) fn bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::{classify, decide, Observation, Predicate, StepVerdict};
    use kloop_kernels::build::git::git;
    let layout = layout();
    let head = git(&a.tree, &["log", "-1", "--abbrev=12", "--format=%h %s"])?;
    let log_line = |line: &str| {
        use std::io::Write;
        println!("kloop: step {line}");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&a.steps_log)
        {
            let _ = writeln!(f, "{line}");
        }
    };
    let t = std::time::Instant::now();
    let built = match build_tree(&layout, &a.tree, &a.fragments) {
        Ok(k) => k,
        Err(e) => {
            log_line(&format!(
                "{head} → skip ({}: {})",
                if e.is_build_failure() {
                    "build failed"
                } else {
                    "build"
                },
                e.to_string().lines().next().unwrap_or("")
            ));
            return Ok(ExitCode::from(125));
        }
    };
    let build_secs = t.elapsed().as_secs_f64();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let reference: Observation = serde_json::from_str(&std::fs::read_to_string(&a.reference)?)?;
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    let kernel = tree_kernel(&layout, &built)?;
    let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&kernel))?;
    start_trials();
    let t = std::time::Instant::now();
    let (obs, _) = kloop::run::bisect::observe_kernel(
        &env,
        &scenario,
        &kernel,
        &predicate,
        a.repeat as usize,
        suite::default_jobs(),
    );
    let classes: Vec<_> = obs
        .iter()
        .map(|o| classify(&reference, o, a.band))
        .collect();
    let verdict = decide(&classes);
    let (word, code) = match &verdict {
        StepVerdict::Old => ("old".to_string(), 0),
        StepVerdict::New => ("new".to_string(), 1),
        StepVerdict::Skip(why) => (format!("skip ({why})"), 125),
    };
    log_line(&format!(
        "{head} → {word} (build {build_secs:.0} s, built:{}; runs {:.1} s)",
        built.record.id,
        t.elapsed().as_secs_f64()
    ));
    Ok(ExitCode::from(code))
}

/// The band an overhead figure of `scenario` may move in on this run's
/// clock (1 % under TCG -icount, the real-time band otherwise).
fn overhead_band(env: &kloop::run::trial::TrialEnv, scenario: &kloop::scenario::Scenario) -> f64 {
    kloop::run::trial::overhead::clock(env.accel.accel(), scenario.vm.icount)
        .default_tolerances()
        .0
}
