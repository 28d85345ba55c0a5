//! `bisect` over the builds the mirror serves ([`crate::run::bisect::distro`]),
//! `bisect --tree` over a git tree's commits and `bisect-step`, the one
//! step `git bisect run` calls ([`crate::run::bisect::tree`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use kloop_kernels::build::git::Worktree;
use kloop_kernels::build::BuildError;
use kloop_kernels::KernelCache;

use crate::judge::bisect::{Observation, Predicate, PredicateError};
use crate::run::bisect::distro::{self, DistroBisect, DistroBisection, DistroError};
use crate::run::bisect::tree::{self, StepCommand, StepOutcome, TreeError, TreeEvent, TreeOutcome};
use crate::run::suite::{self, EnvOptions, SuiteError};
use crate::run::trial::KernelUnderTest;
use crate::scenario::ScenarioError;
use crate::workspace::Layout;

/// `bisect` over the builds the mirror serves: every step told through `on`.
pub fn distro(
    layout: &Layout,
    opts: &DistroBisect,
    on: &mut dyn FnMut(distro::Event<'_>),
) -> Result<DistroBisection, DistroError> {
    super::start_trials();
    distro::run(layout, opts, on)
}

/// What `bisect --tree` is asked.
pub struct TreeOptions {
    pub repo: PathBuf,
    /// The old and the new end (any revision git names).
    pub old: String,
    pub new: String,
    pub scenario: String,
    /// The predicate's text and its `--label`.
    pub predicate: String,
    pub label: Option<String>,
    /// `--config` fragments for every build.
    pub fragments: Vec<PathBuf>,
    /// The architecture every build is for (and its guests').
    pub arch: kloop_protocol::Arch,
    pub repeat: usize,
    pub jobs: usize,
    pub env: EnvOptions,
    /// This program as `git bisect run` calls it for a step.
    pub step: StepCommand,
}

/// What the caller hears during a tree bisection.
pub enum Event<'a> {
    /// The environment is ready: the accelerator chosen.
    Accel(&'a kloop_qemu::accel::AccelDecision),
    /// The bisection starts: the scenario, both ends' commits, the tree
    /// and its worktree.
    Started {
        scenario: &'a str,
        old: &'a str,
        new: &'a str,
        repo: &'a Path,
        worktree: &'a Path,
    },
    /// The builds and runs of the ends and the steps.
    Tree(TreeEvent<'a>),
}

/// A tree bisection's end.
#[derive(Debug)]
pub struct TreeBisected {
    pub outcome: TreeOutcome,
    pub run_dir: PathBuf,
    /// From the bisection's start (after the environment) to its end.
    pub secs: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum BisectTreeError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Predicate(#[from] PredicateError),
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// `bisect --tree`: the ends evaluated here, then `git bisect run` with
/// `opts.step` in a worktree.
pub fn tree_bisect(
    layout: &Layout,
    opts: &TreeOptions,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<TreeBisected, BisectTreeError> {
    let repo = opts.repo.canonicalize()?;
    let predicate = Predicate::parse(&opts.predicate, opts.label.as_deref())?;
    let scenario = crate::scenario::load_one(&layout.scenarios(), &opts.scenario)?;
    let (old, new) = (
        tree::commit(&repo, &opts.old)?,
        tree::commit(&repo, &opts.new)?,
    );
    // One worktree location for every bisection: its output directory
    // (keyed by the tree's path) then serves the next bisection too.
    let wt_dir = KernelCache::default_location()?
        .root()
        .join("build/bisect/worktree");
    super::start_trials();
    let worktree = Worktree::add(&repo, &wt_dir, &old)?;
    // The builds come later: their architecture's tools are prepared now.
    let env_opts = EnvOptions {
        arches: vec![opts.arch],
        ..opts.env.clone()
    };
    let env = suite::prepare_env(layout, &env_opts, &[])?;
    on(Event::Accel(&env.accel));
    on(Event::Started {
        scenario: &scenario.name,
        old: &old,
        new: &new,
        repo: &repo,
        worktree: &worktree.dir,
    });
    let bisection = tree::TreeBisection {
        repo: &repo,
        old: &old,
        new: &new,
        fragments: &opts.fragments,
        arch: opts.arch,
        scenario: &scenario,
        predicate: &predicate,
        predicate_text: &opts.predicate,
        repeat: opts.repeat,
        jobs: opts.jobs,
        band: crate::run::bisect::overhead_band(&env, &scenario),
    };
    let started = Instant::now();
    let outcome = bisection.run(layout, &env, &worktree, &opts.step, &mut |e| {
        on(Event::Tree(e));
    })?;
    Ok(TreeBisected {
        outcome,
        run_dir: env.run_dir,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// What `bisect-step` is asked (by `git bisect run`, through the command
/// `bisect --tree` gave it).
#[derive(Debug, Clone)]
pub struct StepOptions {
    /// The worktree git checked the step's commit out in.
    pub tree: PathBuf,
    pub fragments: Vec<PathBuf>,
    pub arch: kloop_protocol::Arch,
    pub scenario: String,
    pub predicate: String,
    pub label: Option<String>,
    /// The old end's observation (JSON).
    pub reference: PathBuf,
    pub repeat: usize,
    pub band: f64,
    /// The log each step's line is appended to.
    pub steps_log: PathBuf,
    pub env: EnvOptions,
}

/// A step's outcome, and whether its line reached the steps log.
pub struct Stepped {
    pub outcome: StepOutcome,
    pub logged: std::io::Result<()>,
}

/// `bisect-step`: builds the checked-out commit and runs the scenario on it.
pub fn step(
    layout: &Layout,
    opts: &StepOptions,
    on: &mut dyn FnMut(TreeEvent<'_>),
) -> Result<Stepped, BisectTreeError> {
    let predicate = Predicate::parse(&opts.predicate, opts.label.as_deref())?;
    let reference: Observation = serde_json::from_str(&std::fs::read_to_string(&opts.reference)?)?;
    let scenario = crate::scenario::load_one(&layout.scenarios(), &opts.scenario)?;
    super::start_trials();
    let step = tree::Step {
        tree: &opts.tree,
        fragments: &opts.fragments,
        arch: opts.arch,
        scenario: &scenario,
        predicate: &predicate,
        reference: &reference,
        repeat: opts.repeat,
        band: opts.band,
    };
    let mut env_for =
        |k: &KernelUnderTest| suite::prepare_env(layout, &opts.env, std::slice::from_ref(k));
    let outcome = tree::step(layout, &step, &mut env_for, on)?;
    let logged = append_line(&opts.steps_log, &outcome.line);
    Ok(Stepped { outcome, logged })
}

fn append_line(log: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    writeln!(log, "{line}")
}
