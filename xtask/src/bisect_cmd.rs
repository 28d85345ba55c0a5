//! `bisect` over Debian builds or a git tree, and `bisect-step`.

use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::judge::bisect::Predicate;
use kloop::report;
use kloop::run::bisect::tree::{self, TreeEvent};
use kloop::run::bisect::Search;
use kloop::run::suite::{self, EnvOptions, Layout};
use kloop_kernels::{Catalog, KernelCache};

use crate::*;

/// `bisect` over the builds the mirror serves.
pub(crate) fn bisect(a: BisectArgs) -> Result<ExitCode> {
    let layout = layout();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let cache = KernelCache::default_location()?;
    let catalog = Catalog::load(&layout.kernels())?;
    let (old, new, range) = build_range(&a, &cache, &catalog)?;
    let names: Vec<String> = range.iter().map(|b| b.version.clone()).collect();
    let scenario = one_scenario(&layout, &a.scenario)?;
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
    println!("kloop: accelerator: {}", env.accel);
    println!(
        "kloop: bisect {} over {} build(s) from {old} (old) to {new} (new), predicate {}, {} run(s) per step; artefacts in {}",
        scenario.name,
        names.len(),
        a.predicate,
        a.repeat,
        env.run_dir.display()
    );
    let kernels_dir = layout.kernels();
    let mut builds = kloop::run::bisect::DistroBuilds {
        builds: &range,
        catalog: &catalog,
        cache: &cache,
        kernels_dir: &kernels_dir,
        lock: kloop_kernels::available::BisectLock::load(&kernels_dir)?,
        fetch: a.fetch.options(),
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let search = Search::new(&env, &scenario, &predicate, a.repeat as usize, jobs);
    let started = std::time::Instant::now();
    let mut step_no = 0;
    let outcome =
        kloop::run::bisect::bisect(&search, &names, &mut |i| builds.kernel_at(i), &mut |s| {
            step_no += 1;
            println!("{}", step_line(step_no, s));
        });
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bisect: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    print_outcome(&outcome, &names, &range, started);
    let path = env.run_dir.join("bisect.json");
    write_atomically(&path, &serde_json::to_string_pretty(&outcome)?)?;
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

/// Draws a tree bisection's events: the build's live line, the end's
/// build time, each run's trial line.
fn tree_events() -> impl FnMut(TreeEvent<'_>) {
    let mut progress: Option<build_progress::BuildProgress> = None;
    move |e| match e {
        TreeEvent::BuildStarted { dir } => {
            progress = Some(build_progress::BuildProgress::new(
                &dir.display().to_string(),
            ))
        }
        TreeEvent::Build(e) => {
            if let Some(p) = progress.as_mut() {
                p.event(e)
            }
        }
        TreeEvent::BuildEnded => {
            if let Some(p) = progress.take() {
                p.finish()
            }
        }
        TreeEvent::Built { rev, id, secs } => {
            println!("kloop: {rev} built as built:{id} in {secs:.0} s")
        }
        TreeEvent::Trial(r) => println!("{}", report::trial_line(r)),
    }
}

/// `bisect --tree`: the ends evaluated here, then `git bisect run` with
/// `bisect-step` in a worktree.
pub(crate) fn bisect_tree(a: BisectArgs) -> Result<ExitCode> {
    use kloop_kernels::build::git::Worktree;
    let layout = layout();
    let repo = a
        .tree
        .clone()
        .expect("checked by the caller")
        .canonicalize()?;
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let scenario = one_scenario(&layout, &a.scenario)?;
    let (old, new) = (tree::commit(&repo, &a.old)?, tree::commit(&repo, &a.new)?);
    // One worktree location for every bisection: its output directory
    // (keyed by the tree's path) then serves the next bisection too.
    let wt_dir = KernelCache::default_location()?
        .root()
        .join("build/bisect/worktree");
    start_trials();
    let worktree = Worktree::add(&repo, &wt_dir, &old)?;
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, &[])?;
    println!("kloop: accelerator: {}", env.accel);
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
    let bisection = tree::TreeBisection {
        repo: &repo,
        old: &old,
        new: &new,
        fragments: &a.fragments,
        scenario: &scenario,
        predicate: &predicate,
        predicate_text: &a.predicate,
        repeat: a.repeat as usize,
        jobs: a.jobs.unwrap_or_else(suite::default_jobs),
        band: kloop::run::bisect::overhead_band(&env, &scenario),
    };
    let started = std::time::Instant::now();
    let outcome = bisection.run(
        &layout,
        &env,
        &worktree,
        &step_command(&a)?,
        &mut tree_events(),
    )?;
    print_tree_outcome(&outcome, &env.run_dir, started);
    drop(worktree);
    Ok(ExitCode::SUCCESS)
}

/// The end of a tree bisection: git's complaint if any, the first new
/// commit, where the logs are.
fn print_tree_outcome(
    outcome: &tree::TreeOutcome,
    run_dir: &std::path::Path,
    started: std::time::Instant,
) {
    println!();
    if let Some(status) = outcome.git_failed {
        println!(
            "kloop: git bisect run ended with {status}; see {}",
            run_dir.display()
        );
    }
    if let Some(first) = &outcome.first_new {
        println!("first new commit: {first}");
    }
    println!(
        "kloop: {:.0} s; steps in {}, git's log in {}",
        started.elapsed().as_secs_f64(),
        outcome.steps_log.display(),
        outcome.git_log.display()
    );
}

/// This program as `git bisect run` calls it for a step (the library adds
/// the worktree, the reference, the band and the steps log).
fn step_command(a: &BisectArgs) -> Result<tree::StepCommand> {
    let mut args: Vec<String> = [
        "bisect-step",
        "--scenario",
        &a.scenario,
        "--predicate",
        &a.predicate,
    ]
    .map(String::from)
    .into();
    args.extend([
        "--repeat".into(),
        a.repeat.to_string(),
        "--accel".into(),
        a.accel.to_string(),
    ]);
    if let Some(l) = &a.label {
        args.extend(["--label".into(), l.clone()]);
    }
    for f in &a.fragments {
        let f = f.canonicalize().unwrap_or_else(|_| f.clone());
        args.extend(["--config".into(), f.display().to_string()]);
    }
    Ok(tree::StepCommand {
        program: std::env::current_exe()?,
        args,
    })
}

fn one_scenario(layout: &Layout, name: &str) -> Result<kloop::scenario::Scenario> {
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    Ok(kloop::scenario::select(&all, &[name.to_string()])?.remove(0))
}

/// `bisect-step`: what `git bisect run` calls. Exit 0 old, 1 new, 125 skip;
/// a step that cannot run at all exits 128, which makes git abort the
/// search (any other code from 1 to 127 would mark the commit new).
pub(crate) fn bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    match try_bisect_step(a) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("error: {e:#}\nkloop: the step could not run; git bisect stops here");
            Ok(ExitCode::from(128))
        }
    }
}

fn try_bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::Observation;
    let layout = layout();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let reference: Observation = serde_json::from_str(&std::fs::read_to_string(&a.reference)?)?;
    let scenario = one_scenario(&layout, &a.scenario)?;
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    start_trials();
    let step = tree::Step {
        tree: &a.tree,
        fragments: &a.fragments,
        scenario: &scenario,
        predicate: &predicate,
        reference: &reference,
        repeat: a.repeat as usize,
        band: a.band,
    };
    let mut env_for = |k: &kloop::run::trial::KernelUnderTest| {
        suite::prepare_env(&layout, &opts, std::slice::from_ref(k))
    };
    let outcome = tree::step(&layout, &step, &mut env_for, &mut tree_events())?;
    println!("kloop: step {}", outcome.line);
    use std::io::Write;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.steps_log)?;
    writeln!(log, "{}", outcome.line)?;
    Ok(ExitCode::from(outcome.exit_code()))
}
