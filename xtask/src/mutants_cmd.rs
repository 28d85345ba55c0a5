//! `mutants`: what kloop's suite would miss in the kernel's emission paths.

use std::process::ExitCode;

use anyhow::Result;
use kloop::mutants::Strategy;
use kloop::run::suite::{self, EnvOptions};
use kloop::session::mutants::{self, MutantsOptions, Totals};

use crate::flags::*;
use crate::shared::*;

impl Run for MutantsArgs {
    fn run(self) -> Result<ExitCode> {
        mutants(self)
    }
}

fn mutants(a: MutantsArgs) -> Result<ExitCode> {
    let layout = layout();
    start_trials();
    let opts = options(&a, &layout)?;
    let chosen = mutants::choose(&layout, &opts)?;
    for m in &chosen.missing {
        eprintln!("kloop: not in this tree: {m}");
    }
    for note in &chosen.notes {
        println!("kloop: {note}");
    }
    println!(
        "kloop: {} mutants of {} file(s) in {}; {}",
        chosen.generated,
        chosen.target_files,
        chosen.tree.display(),
        match &a.from {
            Some(run) => format!("the report of the run in {}", run.display()),
            None => format!("judging {}", chosen.mutants.len()),
        }
    );
    if a.list {
        for m in &chosen.mutants {
            println!("{}  {}", m.id, m.what);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut lines = crate::view::views::MutantsView::new(opts.base.source.label());
    let totals = mutants::run(&layout, &opts, chosen, &mut |e| lines.event(e))?;
    lines.finish();
    Ok(summarise(&totals))
}

fn options(a: &MutantsArgs, layout: &kloop::workspace::Layout) -> Result<MutantsOptions> {
    let base = BuildArgs {
        source: a.source.clone(),
        patches: Vec::new(),
        checks: a.checks.clone(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        arch: crate::flags::ArchChoice::One(a.arch.one("mutants")?),
        fetch: a.fetch.clone(),
    }
    .request(layout)?;
    // The checks' controls run on `kernels build --checks` and `validate
    // --checks` kernels; a mutant's build would only pay for building them.
    let base = kloop_kernels::build::BuildRequest {
        controls: None,
        ..base
    };
    Ok(MutantsOptions {
        base,
        source_arg: a.source.clone(),
        only: a.only.clone(),
        mutants: a.mutants.clone(),
        max: a.max,
        shard: a.shard,
        resume: a.resume,
        again_survivors: a.again_survivors,
        report: a.report.clone(),
        from: a.from.clone(),
        merge: a.merge.clone(),
        scenarios: a.scenarios.clone(),
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            ..EnvOptions::default()
        },
        jobs: a.jobs.unwrap_or_else(suite::default_jobs),
        strategy: if a.build_each {
            Strategy::BuildEach
        } else {
            Strategy::Schemata
        },
    })
}

/// Prints the totals and the survivors without a note; the exit code:
/// 130 when interrupted, 1 while a survivor has no note.
fn summarise(t: &Totals) -> ExitCode {
    println!(
        "kloop: {} killed, {} survived, {} the unmutated object code, {} duplicates, {} failed to build, of {}{}; report {}; data {}",
        t.killed,
        t.survived,
        t.same_code,
        t.duplicates,
        t.build_failed,
        t.judged,
        t.secs.map_or(String::new(), |s| format!(" in {s:.0} s")),
        t.report.display(),
        t.data.display()
    );
    if !t.unexplained.is_empty() {
        println!(
            "kloop: survivors without a note in kernels/mutation-notes.toml: {}",
            t.unexplained.join(", ")
        );
    }
    if kloop::run::signals::interrupted() {
        println!("kloop: interrupted; the report holds the mutants judged so far");
        return ExitCode::from(130);
    }
    exit_code(t.unexplained.is_empty())
}
