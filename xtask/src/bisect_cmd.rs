//! `bisect` over Debian builds or a git tree, and `bisect-step`.

use std::process::ExitCode;

use anyhow::Result;
use kloop::judge::bisect::Predicate;
use kloop::report;
use kloop::run::bisect::distro::{self, DistroBisect};
use kloop::run::bisect::tree;
use kloop::run::suite::{self, EnvOptions};
use kloop_kernels::KernelCache;

use crate::*;

/// `bisect` over the builds the mirror serves.
pub(crate) fn bisect(a: BisectArgs) -> Result<ExitCode> {
    let layout = layout();
    start_trials();
    let opts = DistroBisect {
        old: a.old.clone(),
        new: a.new.clone(),
        scenario: a.scenario.clone(),
        predicate: a.predicate.clone(),
        label: a.label.clone(),
        repeat: a.repeat as usize,
        jobs: a.jobs.unwrap_or_else(suite::default_jobs),
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            ..EnvOptions::default()
        },
    };
    let mut step_no = 0;
    let b = kloop::run::bisect::distro::run(&layout, &opts, &mut |e| match e {
        distro::Event::Note(text) => println!("kloop: {text}"),
        distro::Event::Step(s) => {
            step_no += 1;
            println!("{}", report::bisect::step_line(step_no, s));
        }
    })?;
    let (lines, cost) = report::bisect::outcome_lines(&b);
    println!();
    for line in lines {
        println!("{line}");
    }
    println!("kloop: {cost}");
    println!("kloop: report {}", b.report.display());
    Ok(ExitCode::SUCCESS)
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
    let predicate = Predicate::parse(&a.predicate, a.label.as_deref())?;
    let scenario = kloop::scenario::load_one(&layout.scenarios(), &a.scenario)?;
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
        &mut crate::view::views::tree_bisection(),
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
    let predicate = Predicate::parse(&a.predicate, a.label.as_deref())?;
    let reference: Observation = serde_json::from_str(&std::fs::read_to_string(&a.reference)?)?;
    let scenario = kloop::scenario::load_one(&layout.scenarios(), &a.scenario)?;
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
    let outcome = tree::step(
        &layout,
        &step,
        &mut env_for,
        &mut crate::view::views::tree_bisection(),
    )?;
    println!("kloop: step {}", outcome.line);
    use std::io::Write;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.steps_log)?;
    writeln!(log, "{}", outcome.line)?;
    Ok(ExitCode::from(outcome.exit_code()))
}
