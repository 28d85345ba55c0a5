//! `bisect` over Debian builds or a git tree, and `bisect-step`.

use std::process::ExitCode;

use anyhow::Result;
use kloop::report;
use kloop::run::bisect::distro::{self, DistroBisect};
use kloop::run::bisect::tree;
use kloop::run::suite::{self, EnvOptions};
use kloop::session::bisect::{Event, StepOptions, TreeOptions};

use crate::flags::*;
use crate::shared::*;

impl Run for BisectArgs {
    fn run(self) -> Result<ExitCode> {
        if self.tree.is_some() {
            bisect_tree(self)
        } else {
            bisect(self)
        }
    }
}

impl Run for BisectStepArgs {
    fn run(self) -> Result<ExitCode> {
        bisect_step(self)
    }
}

/// `bisect` over the builds the mirror serves.
fn bisect(a: BisectArgs) -> Result<ExitCode> {
    let layout = layout();
    let opts = DistroBisect {
        old: a.old.clone(),
        new: a.new.clone(),
        arch: a.arch.one("bisect")?,
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
    let b = kloop::session::bisect::distro(&layout, &opts, &mut |e| match e {
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
fn bisect_tree(a: BisectArgs) -> Result<ExitCode> {
    let opts = TreeOptions {
        repo: a.tree.clone().expect("checked by the caller"),
        old: a.old.clone(),
        new: a.new.clone(),
        scenario: a.scenario.clone(),
        predicate: a.predicate.clone(),
        label: a.label.clone(),
        fragments: a.fragments.clone(),
        arch: a.arch.one("bisect --tree")?,
        repeat: a.repeat as usize,
        jobs: a.jobs.unwrap_or_else(suite::default_jobs),
        env: EnvOptions {
            accel: a.accel,
            ..EnvOptions::default()
        },
        step: step_command(&a)?,
    };
    let mut view = crate::view::views::tree_bisection();
    let bisected = kloop::session::bisect::tree_bisect(&layout(), &opts, &mut |e| {
        match e {
        Event::Accel(accel) => println!("kloop: accelerator: {accel}"),
        Event::Started {
            scenario,
            old,
            new,
            repo,
            worktree,
        } => println!(
            "kloop: bisect {} over {}..{} in a worktree of {} ({}); predicate {}, {} run(s) per step",
            scenario,
            &old[..12],
            &new[..12],
            repo.display(),
            worktree.display(),
            a.predicate,
            a.repeat
        ),
        Event::Tree(e) => view(e),
    }
    })?;
    print_tree_outcome(&bisected.outcome, &bisected.run_dir, bisected.secs);
    Ok(ExitCode::SUCCESS)
}

/// The end of a tree bisection: git's complaint if any, the first new
/// commit, where the logs are.
fn print_tree_outcome(outcome: &tree::TreeOutcome, run_dir: &std::path::Path, secs: f64) {
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
        secs,
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
        "--arch".into(),
        a.arch.one("bisect --tree")?.to_string(),
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
fn bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    match try_bisect_step(a) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("error: {e:#}\nkloop: the step could not run; git bisect stops here");
            Ok(ExitCode::from(128))
        }
    }
}

fn try_bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    let opts = StepOptions {
        tree: a.tree.clone(),
        fragments: a.fragments.clone(),
        arch: a.arch.one("bisect-step")?,
        scenario: a.scenario.clone(),
        predicate: a.predicate.clone(),
        label: a.label.clone(),
        reference: a.reference.clone(),
        repeat: a.repeat as usize,
        band: a.band,
        steps_log: a.steps_log.clone(),
        env: EnvOptions {
            accel: a.accel,
            ..EnvOptions::default()
        },
    };
    let stepped =
        kloop::session::bisect::step(&layout(), &opts, &mut crate::view::views::tree_bisection())?;
    println!("kloop: step {}", stepped.outcome.line);
    stepped.logged?;
    Ok(ExitCode::from(stepped.outcome.exit_code()))
}
