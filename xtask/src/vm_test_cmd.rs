//! `vm-test` and `bless` (through `vm-test`).

use std::process::ExitCode;

use anyhow::Result;

use crate::*;

/// `vm-test` (and `bless`: `bless` says what the trials write;
/// `new_snapshot_set`: `bless --as`, whose `--snapshot-as` names a set that
/// does not exist yet).
pub(crate) fn vm_test(
    a: VmTestArgs,
    new_snapshot_set: bool,
    bless: kloop::run::trial::Bless,
) -> Result<ExitCode> {
    let layout = layout();
    let opts = a.vm_test_options(new_snapshot_set, bless);
    if let Some(baseline) = &a.baseline {
        return ab_test(&layout, &a, &opts.selection, baseline);
    }
    let planned = kloop::session::vm_test::plan(&layout, &opts)?;
    if let Some(line) = &planned.shard_line {
        println!("kloop: {line}");
    }
    if a.list {
        for t in &planned.trials {
            println!("{}", t.id());
        }
        return Ok(ExitCode::SUCCESS);
    }
    start_trials();
    let run = kloop::session::vm_test::run(&layout, &opts, planned, &crate::view::vm_test_event)?;
    println!();
    for line in kloop::session::vm_test::closing_lines(&run) {
        println!("kloop: {line}");
    }
    Ok(exit_code(run.success()))
}

/// `bless`: the trials' streams become their golden snapshots (and, with
/// `--overhead`, their figures the budgets); only a clean stream can be
/// blessed, since invariant violations still fail.
pub(crate) fn bless(
    BlessArgs {
        run: mut a,
        overhead,
        as_name,
    }: BlessArgs,
) -> Result<ExitCode> {
    let catalog = kloop_kernels::Catalog::load_all(&layout().kernels())?;
    let set = kloop::session::vm_test::bless_set(
        &catalog,
        &a.selection(false),
        as_name.as_deref(),
        a.baseline.is_some(),
        a.repeat as usize,
    )?;
    a.snapshot_as = set.or(a.snapshot_as);
    // insta rewrites the .snap files instead of failing; its environment is
    // its only interface, set here once before any trial thread starts.
    std::env::set_var("INSTA_UPDATE", "always");
    let bless = kloop::run::trial::Bless {
        snapshots: true,
        overhead,
    };
    vm_test(a, as_name.is_some(), bless)
}
