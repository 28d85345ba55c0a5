//! `bench`: the benchmarks (`cargo xtask bench …`).

use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::report;
use kloop::run::bench;
use kloop::run::suite::{self, EnvOptions};
use kloop::session::bench::Event as BenchEvent;

use crate::flags::*;
use crate::shared::*;

impl Run for BenchArgs {
    fn run(self) -> Result<ExitCode> {
        bench(self)
    }
}

fn bench(a: BenchArgs) -> Result<ExitCode> {
    if let Some(gib) = a.perf_data_gib {
        return perf_data_bench(gib);
    }
    if let Some(run) = &a.steps {
        return steps_bench(run);
    }
    if let Some(source) = &a.validate {
        return validate_bench(source, a.runs);
    }
    if a.fresh {
        return fresh_bench(a.runs);
    }
    let opts = kloop::session::bench::TrialsOptions {
        kernels: a.kernels.clone(),
        scenario: a.scenario.clone(),
        env: EnvOptions {
            accel: a.accel,
            extra_cmdline: a.append.clone(),
            boot: a.boot,
            ..EnvOptions::default()
        },
        runs: a.runs,
        jobs: a.jobs,
        channel_cycles: a.channel_cycles,
    };
    let channel = kloop::session::bench::trials(&layout(), &opts, &mut |e| match e {
        BenchEvent::Accel(accel) => {
            println!("kloop bench: accelerator: {accel}");
            if !a.append.is_empty() {
                println!(
                    "kloop bench: appended to the kernel command line: {}",
                    a.append.join(" ")
                );
            }
        }
        BenchEvent::Rows(rows) => print!("{}", report::bench::trial_tables(rows, a.runs)),
        _ => {}
    })?;
    if let Some(outcome) = channel {
        println!("\n{}", report::bench::channel_line(&outcome));
    }
    if a.matrix {
        println!();
        matrix_bench(&a)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench --fresh`: a new user's first run, `runs` times, each in a
/// scratch directory removed afterwards.
fn fresh_bench(runs: usize) -> Result<ExitCode> {
    let rounds = kloop::session::bench::fresh(&layout().root, runs, &mut |e| {
        match e {
        BenchEvent::FreshStarting {
            round,
            runs,
            scratch,
        } => println!(
            "kloop bench: fresh run {round}/{runs} in {} (clone, ci/setup.sh, cargo build -p xtask, vm-test) …",
            scratch.display()
        ),
        BenchEvent::FreshRound(Ok(r)) => println!("kloop bench: {:.1} s in all", r.total_secs()),
        _ => {}
    }
    })?;
    print!("\n{}", report::bench::fresh_tables(&rounds));
    Ok(ExitCode::SUCCESS)
}

/// `bench --validate SOURCE`: `validate` of a new one-line patch, `runs`
/// times, each run's wall split.
fn validate_bench(source: &str, runs: usize) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let rounds = kloop::session::bench::validate(&layout(), &exe, source, runs, &mut |e| {
        match e {
        BenchEvent::ValidateStarting { round, runs } => println!(
            "kloop bench: validate {round}/{runs}: --source {source} --patch <a new one-line patch> …"
        ),
        BenchEvent::ValidateRound(round) => {
            if let Ok(t) = &round.timing {
                println!("kloop bench: {}", t.line());
            }
        }
        _ => {}
    }
    })?;
    print!("\n{}", report::bench::validate_table(&rounds));
    Ok(ExitCode::SUCCESS)
}

/// `bench --steps [RUN_DIR]`: where a finished run's agent phase went.
fn steps_bench(run: &std::path::Path) -> Result<ExitCode> {
    let steps = kloop::session::bench::steps(&layout(), run)?;
    println!(
        "kloop bench: agent phase of the run in {}",
        steps.run_dir.display()
    );
    print!("{}", report::bench::steps_table(&steps.rows));
    Ok(ExitCode::SUCCESS)
}

/// `bench --perf-data-gib N`: a real recording stretched to N GiB, then
/// `check-perf-data` on it in a process of its own.
fn perf_data_bench(gib: f64) -> Result<ExitCode> {
    let r = kloop::session::bench::perf_data(
        &layout(),
        &std::env::current_exe().context("locating the xtask binary")?,
        gib,
        &mut |note| println!("kloop bench: {note}"),
    )?;
    println!("{}", report::bench::perf_data_line(&r));
    Ok(ExitCode::SUCCESS)
}

/// Times `cargo xtask vm-test` over the whole matrix (all pins × scenarios,
/// `--jobs` from the bench's own flag or vm-test's default) as a user runs
/// it, on the kernel cache as it is: cold boots, then saved VMs twice (the
/// first makes whatever saved VM is missing, the second is the warm figure).
pub(crate) fn matrix_bench(a: &BenchArgs) -> Result<()> {
    let mut rounds = Vec::new();
    for arch in a.arch.arches() {
        rounds.extend(matrix_rounds(a, arch)?);
    }
    print!("\n{}", report::bench::matrix_tables(&rounds));
    Ok(())
}

/// [`matrix_bench`]'s rounds for the guests of one architecture.
fn matrix_rounds(a: &BenchArgs, arch: kloop::Arch) -> Result<Vec<bench::MatrixRound>> {
    let m = bench::MatrixBench {
        exe: std::env::current_exe().context("locating the xtask binary")?,
        runs_root: layout().runs(),
        accel: a.accel.to_string(),
        // The bench's `--jobs` defaults to 1 for single scenarios; the
        // matrix is timed as a user runs it unless asked otherwise.
        jobs: (a.jobs > 1).then_some(a.jobs),
        append: a.append.clone(),
        arch,
    };
    let jobs = m.jobs.map_or_else(
        || suite::Parallel::host_default().to_string(),
        |n| format!("--jobs {n}"),
    );
    let rounds = kloop::session::bench::matrix(&m, a.warm, &mut |e| match e {
        BenchEvent::MatrixStarting { label, boot } => {
            println!("kloop bench: matrix, {label} (--arch {arch}, --boot {boot}, {jobs}) …");
        }
        BenchEvent::MatrixRound(round) => {
            if let Err(e) = &round.run {
                println!("kloop bench: {e}");
            }
        }
        _ => {}
    })?;
    Ok(rounds)
}
