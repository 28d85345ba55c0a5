//! `merge`: the shards' run directories as one.

use std::process::ExitCode;

use anyhow::Result;
use kloop::report::Summary;

use crate::flags::*;
use crate::shared::*;

impl Run for MergeArgs {
    fn run(self) -> Result<ExitCode> {
        merge(self)
    }
}

/// `merge DIR…`: the shards' run directories as one run directory.
fn merge(a: MergeArgs) -> Result<ExitCode> {
    let opts = kloop::session::merge::MergeOptions {
        dirs: a.dirs.clone(),
        out: a.out.clone(),
    };
    let kloop::session::merge::Merge { out, run, summary } =
        kloop::session::merge::run(&layout(), &opts)?;
    for note in &run.notes {
        eprintln!("kloop: {note}");
    }
    let results = &run.merged.results;
    if let Some(outcomes) = &run.ab {
        let kernels = |i: usize| results.get(i).map(|r| r.kernel.clone()).unwrap_or_default();
        let colour = kloop::report::ab::Colour::for_stdout();
        let table = kloop::report::ab::render(&kernels(0), &kernels(1), outcomes, colour);
        println!("{table}");
    }
    println!(
        "kloop: merged {} shard(s) into {}: {}",
        run.merged.shards.len(),
        out.display(),
        summary.line()
    );
    if summary.nothing_ran() && !a.allow_skipped {
        println!("kloop: {}", Summary::NOTHING_RAN);
    }
    Ok(exit_code(summary.success(a.allow_skipped)))
}
