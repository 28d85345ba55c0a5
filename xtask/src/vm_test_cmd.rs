//! `vm-test` and `bless` (through `vm-test`), and `vm-test --baseline`'s
//! A/B.

use std::process::ExitCode;

use anyhow::{bail, Result};
use kloop::run::suite::{self, Selection};
use kloop::session::ab::AbOptions;
use kloop::workspace::Layout;

use crate::flags::*;
use crate::shared::ab::*;
use crate::shared::*;

impl Run for VmTestArgs {
    fn run(self) -> Result<ExitCode> {
        vm_test(self, false, Default::default())
    }
}

impl Run for BlessArgs {
    fn run(self) -> Result<ExitCode> {
        bless(self)
    }
}

/// `vm-test` (and `bless`: `bless` says what the trials write;
/// `new_snapshot_set`: `bless --as`, whose `--snapshot-as` names a set that
/// does not exist yet).
fn vm_test(
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
fn bless(
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
    let (baseline, candidate) = kloop::session::ab::sides(layout, sel, baseline)?;
    let opts = AbOptions {
        scenarios: a.scenarios.clone(),
        env: a.env_options(),
        jobs: suite::Parallel::from_flag(a.jobs),
        shard: a.shard,
        reuse_baseline: !a.rerun_baseline,
    };
    let ab = run_and_print_ab(layout, &baseline, &candidate, &opts)?;
    Ok(exit_of(&ab.acceptance(&[])))
}
