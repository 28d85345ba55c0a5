//! `bench`: kloop timing itself ([`crate::run::bench`] measures,
//! [`crate::report::bench`] draws the tables). One entry per kind:
//! [`trials`] (boot→hello and trial wall time per pin, and the channel
//! storm), [`matrix`] (`vm-test` over the whole matrix as a user runs it),
//! [`fresh`] (a new user's first run), [`validate`] (`validate` of a new
//! one-line patch), [`steps`] (a finished run's agent phase) and
//! [`perf_data`] (`check-perf-data` on a recording stretched to N GiB).

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::run::bench::{
    self, BenchError, BenchRow, ChannelOutcome, FreshRound, MatrixBench, MatrixRound, PerfDataRun,
    ScenarioSteps, ValidateRound,
};
use crate::run::suite::{self, EnvOptions, Selection, SuiteError};
use crate::workspace::Layout;

/// What the caller hears while a bench works.
#[derive(Debug)]
pub enum Event<'a> {
    /// The environment is ready: the accelerator chosen.
    Accel(&'a kloop_qemu::accel::AccelDecision),
    /// The trials were measured (before the channel storm).
    Rows(&'a [BenchRow]),
    /// Fresh round `round` of `runs` starts in `scratch`.
    FreshStarting {
        round: usize,
        runs: usize,
        scratch: &'a Path,
    },
    /// A fresh round ended.
    FreshRound(&'a Result<FreshRound, BenchError>),
    /// `validate` round `round` of `runs` starts.
    ValidateStarting { round: usize, runs: usize },
    /// A `validate` round ended.
    ValidateRound(&'a ValidateRound),
    /// A whole-matrix round starts (its label and `--boot`).
    MatrixStarting { label: &'a str, boot: &'a str },
    /// A whole-matrix round ended.
    MatrixRound(&'a MatrixRound),
}

#[derive(Debug, thiserror::Error)]
pub enum BenchRunError {
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// A step around the measurement (a scratch directory, a process).
    #[error("{what}")]
    Step {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("no finished run under {}", .0.display())]
    NoFinishedRun(PathBuf),
}

fn step(what: &'static str) -> impl FnOnce(std::io::Error) -> BenchRunError {
    move |source| BenchRunError::Step { what, source }
}

/// What `bench` is asked for the trials of one scenario.
#[derive(Debug, Clone)]
pub struct TrialsOptions {
    /// Pin ids; empty: every pin.
    pub kernels: Vec<String>,
    pub scenario: String,
    pub env: EnvOptions,
    /// Runs per trial, and how many VMs at once.
    pub runs: usize,
    pub jobs: usize,
    /// Cycles of the channel storm (0: none).
    pub channel_cycles: u32,
}

/// Measures the scenario's trial on each kernel `opts.runs` times
/// ([`Event::Rows`]), then the channel storm on the first; returns the
/// storm's outcome (`None`: not asked, or it gave no result).
pub fn trials(
    layout: &Layout,
    opts: &TrialsOptions,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Option<ChannelOutcome>, BenchRunError> {
    let sel = Selection {
        kernels: opts.kernels.clone(),
        scenarios: vec![opts.scenario.clone()],
        ..Selection::default()
    };
    let planned = suite::plan(layout, &sel)?;
    super::start_trials();
    let kernels: Vec<_> = planned.iter().map(|t| t.kernel.clone()).collect();
    let env = suite::prepare_env(layout, &opts.env, &kernels)?;
    on(Event::Accel(&env.accel));
    let rows: Vec<_> = planned
        .iter()
        .map(|t| BenchRow::measure(&env, t, opts.runs, opts.jobs))
        .collect();
    on(Event::Rows(&rows));
    if opts.channel_cycles == 0 {
        return Ok(None);
    }
    match planned.first() {
        Some(t) => Ok(bench::channel(&env, t, opts.channel_cycles)?),
        None => Ok(None),
    }
}

/// `bench --matrix`: `vm-test` over the whole matrix, once per
/// [`bench::MATRIX_ROUNDS`].
pub fn matrix(
    m: &MatrixBench,
    warm_only: bool,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<MatrixRound>, BenchRunError> {
    let mut rounds = Vec::new();
    // `--warm`: the warm round alone, on saved VMs as they are.
    let which: &[(&str, &str)] = if warm_only {
        &bench::MATRIX_ROUNDS[2..]
    } else {
        &bench::MATRIX_ROUNDS
    };
    for &(label, boot) in which {
        on(Event::MatrixStarting { label, boot });
        let round = m.round(label, boot).map_err(step("running vm-test"))?;
        on(Event::MatrixRound(&round));
        rounds.push(round);
    }
    Ok(rounds)
}

/// `bench --fresh`: a new user's first run of the checkout at `workspace`,
/// `runs` times, each in a scratch directory removed afterwards.
pub fn fresh(
    workspace: &Path,
    runs: usize,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<Result<FreshRound, BenchError>>, BenchRunError> {
    let mut rounds = Vec::new();
    for i in 0..runs {
        let scratch = tempfile::Builder::new()
            .prefix("kloop-fresh-")
            .tempdir()
            .map_err(step("a scratch directory for the fresh clone"))?;
        on(Event::FreshStarting {
            round: i + 1,
            runs,
            scratch: scratch.path(),
        });
        let round = bench::FreshBench {
            workspace: workspace.to_path_buf(),
            scratch: scratch.path().to_path_buf(),
        }
        .round();
        on(Event::FreshRound(&round));
        rounds.push(round);
    }
    Ok(rounds)
}

/// `bench --validate SOURCE`: `exe validate` of a new one-line patch,
/// `runs` times, each run's wall split.
pub fn validate(
    layout: &Layout,
    exe: &Path,
    source: &str,
    runs: usize,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<ValidateRound>, BenchRunError> {
    let runs_root = layout.runs();
    let dir = tempfile::tempdir().map_err(step("a directory for the patches"))?;
    let mut rounds = Vec::new();
    for i in 0..runs {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let patch = dir.path().join(format!("one-line-{i}.patch"));
        std::fs::write(&patch, bench::one_line_patch(stamp)).at("writing", &patch)?;
        on(Event::ValidateStarting { round: i + 1, runs });
        let round = bench::validate_round(exe, &runs_root, source, &patch)
            .map_err(step("running validate"))?;
        on(Event::ValidateRound(&round));
        rounds.push(round);
    }
    Ok(rounds)
}

/// A finished run's agent phase, scenario by scenario.
#[derive(Debug)]
pub struct Steps {
    pub run_dir: PathBuf,
    pub rows: Vec<ScenarioSteps>,
}

/// `bench --steps RUN_DIR`: where a finished run's agent phase went;
/// `latest`: the newest finished run.
pub fn steps(layout: &Layout, run: &Path) -> Result<Steps, BenchRunError> {
    let run_dir = if run.as_os_str() == "latest" {
        let runs = crate::workspace::run_dirs::list(&layout.runs());
        match runs
            .into_iter()
            .filter(|r| !r.live)
            .max_by_key(|r| r.started)
        {
            Some(r) => r.path,
            None => return Err(BenchRunError::NoFinishedRun(layout.runs())),
        }
    } else {
        run.to_path_buf()
    };
    let rows = bench::agent_steps(&run_dir)?;
    Ok(Steps { run_dir, rows })
}

/// `bench --perf-data-gib N`: the checkout's real recording stretched to
/// `gib` GiB under `target/kloop/bench`, then `exe check-perf-data` on it
/// in a process of its own.
pub fn perf_data(
    layout: &Layout,
    exe: &Path,
    gib: f64,
    on_note: &mut dyn FnMut(String),
) -> Result<PerfDataRun, BenchError> {
    let root = &layout.root;
    bench::perf_data(
        exe,
        &root.join("crates/perf-data/testdata/host-6.18.44-perf-6.1.187-header-size.pipe.data"),
        &root.join("target/kloop/bench"),
        gib,
        on_note,
    )
}
