//! Bisection over a git tree's commits (`bisect --tree`): the two ends are
//! built and observed here, then `git bisect run` drives the xtask's
//! `bisect-step` in a worktree, and each step builds, boots and runs one
//! commit ([`step`]). Git does the search (it knows merges and skips);
//! kloop supplies the verdict of a commit.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kloop_kernels::build::git::{git, Worktree};
use kloop_kernels::build::{BuildError, BuildEvent, BuildRequest, BuiltKernel, SourceSpec};
use kloop_kernels::{Catalog, KernelCache};
use kloop_path_io::{PathIo, PathIoExt};

use crate::judge::bisect::{classify, decide, Observation, Predicate, RunClass, StepVerdict};
use crate::run::trial::{KernelUnderTest, LocalKernel, TrialEnv, TrialResult};
use crate::scenario::Scenario;
use crate::workspace::Layout;

/// What a tree bisection tells the person waiting, as it happens.
pub enum TreeEvent<'a> {
    /// A build of the tree at `dir` starts; [`TreeEvent::Build`] events
    /// follow until [`TreeEvent::BuildEnded`].
    BuildStarted {
        dir: &'a Path,
    },
    Build(BuildEvent),
    BuildEnded,
    /// An end built: its commit, the built kernel's id, the seconds it took.
    Built {
        rev: &'a str,
        id: &'a str,
        secs: f64,
    },
    /// One run of the scenario on an end.
    Trial(&'a TrialResult),
}

/// Why a tree bisection could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// git, or the build around it, could not be run.
    #[error(transparent)]
    Git(Box<BuildError>),
    #[error("the end {rev} must build: {source}")]
    EndBuild {
        rev: String,
        source: Box<BuildError>,
    },
    #[error("the old end {0} reached no verdict")]
    OldEnd(String),
    #[error("the new end {rev} is not new under {predicate}: nothing to bisect")]
    NewEnd { rev: String, predicate: String },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Kernels(#[from] kloop_kernels::KernelError),
    /// The trial environment of a step could not be prepared.
    #[error(transparent)]
    Env(Box<crate::run::suite::SuiteError>),
}

// Boxed: a build error is large, and these errors travel up every step.
impl From<BuildError> for TreeError {
    fn from(e: BuildError) -> TreeError {
        TreeError::Git(Box::new(e))
    }
}

impl From<crate::run::suite::SuiteError> for TreeError {
    fn from(e: crate::run::suite::SuiteError) -> TreeError {
        TreeError::Env(Box::new(e))
    }
}

/// A tree bisection's inputs, as the user gave them.
pub struct TreeBisection<'a> {
    pub repo: &'a Path,
    pub old: &'a str,
    pub new: &'a str,
    /// Config fragments merged after `kernels/configs/kloop.config`.
    pub fragments: &'a [PathBuf],
    /// The architecture every build is for.
    pub arch: kloop_protocol::Arch,
    pub scenario: &'a Scenario,
    pub predicate: &'a Predicate,
    /// The predicate as the user wrote it (for messages).
    pub predicate_text: &'a str,
    /// Runs per step.
    pub repeat: usize,
    /// Parallel VMs for an end's runs.
    pub jobs: usize,
    /// The relative band an overhead figure may move in.
    pub band: f64,
}

/// How git is to call the step: the program and the arguments before
/// `--tree`, `--reference`, `--band`, `--steps-log` (which [`run`] adds).
pub struct StepCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// A finished `git bisect run`.
#[derive(Debug)]
pub struct TreeOutcome {
    /// git's exit status, when it was not a success (a step that could not
    /// run at all, or a search git gave up on).
    pub git_failed: Option<std::process::ExitStatus>,
    /// `<abbrev> <subject>` of the first new commit, when git found one.
    pub first_new: Option<String>,
    /// One line per step (`bisect-steps.log`) and git's log (`bisect.log`).
    pub steps_log: PathBuf,
    pub git_log: PathBuf,
}

/// Builds the tree at `dir` with `fragments` (kernel builds are cached by
/// their inputs' hash, so an end built before is not built again).
pub fn build_tree(
    layout: &Layout,
    dir: &Path,
    fragments: &[PathBuf],
    arch: kloop_protocol::Arch,
    on_event: &mut dyn FnMut(TreeEvent<'_>),
) -> Result<BuiltKernel, BuildError> {
    let req = BuildRequest {
        fragments: fragments.to_vec(),
        ..BuildRequest::new(SourceSpec::Tree(dir.to_path_buf()), &layout.kernels()).for_arch(arch)
    };
    let cache = KernelCache::default_location()?;
    on_event(TreeEvent::BuildStarted { dir });
    let r = kloop_kernels::build::build(&cache, &req, &mut |e| on_event(TreeEvent::Build(e)));
    on_event(TreeEvent::BuildEnded);
    r
}

/// The kernel under test a tree build gives (its series' ledger entries
/// apply, as for a pin of the same series).
pub fn tree_kernel(
    layout: &Layout,
    k: &BuiltKernel,
) -> Result<KernelUnderTest, kloop_kernels::KernelError> {
    // Every architecture's pins: an arm64 build is judged by arm64's.
    let catalog = Catalog::load_all(&layout.kernels())?;
    Ok(KernelUnderTest::Image(LocalKernel::built(
        k, None, &catalog,
    )))
}

/// Resolves `rev` in `repo` to a full commit id.
pub fn commit(repo: &Path, rev: &str) -> Result<String, BuildError> {
    git(
        repo,
        &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
    )
}

impl TreeBisection<'_> {
    /// Observes both ends in `worktree` (the old end must reach a verdict,
    /// the new end must be new under the predicate), then runs
    /// `git bisect run` with `step` between them.
    pub fn run(
        &self,
        layout: &Layout,
        env: &TrialEnv,
        worktree: &Worktree,
        step: &StepCommand,
        on_event: &mut dyn FnMut(TreeEvent<'_>),
    ) -> Result<TreeOutcome, TreeError> {
        let old_obs = self.observe(layout, env, &worktree.dir, self.old, on_event)?;
        let reference = old_obs
            .iter()
            .find(|o| !matches!(o, Observation::NoVerdict(_)))
            .cloned()
            .ok_or_else(|| TreeError::OldEnd(short(self.old).into()))?;
        let new_obs = self.observe(layout, env, &worktree.dir, self.new, on_event)?;
        if !new_obs
            .iter()
            .any(|o| classify(&reference, o, self.band) == RunClass::New)
        {
            return Err(TreeError::NewEnd {
                rev: short(self.new).into(),
                predicate: self.predicate_text.to_string(),
            });
        }
        self.git_bisect_run(env, &worktree.dir, step, &reference)
    }

    /// Checks `rev` out in the worktree, builds it (an end must build) and
    /// runs the scenario on it `repeat` times.
    fn observe(
        &self,
        layout: &Layout,
        env: &TrialEnv,
        worktree: &Path,
        rev: &str,
        on_event: &mut dyn FnMut(TreeEvent<'_>),
    ) -> Result<Vec<Observation>, TreeError> {
        git(worktree, &["checkout", "--quiet", "--detach", rev])?;
        let t = Instant::now();
        let built = build_tree(layout, worktree, self.fragments, self.arch, on_event).map_err(
            |source| TreeError::EndBuild {
                rev: rev.to_string(),
                source: Box::new(source),
            },
        )?;
        on_event(TreeEvent::Built {
            rev: short(rev),
            id: &built.record.id,
            secs: t.elapsed().as_secs_f64(),
        });
        let kernel = tree_kernel(layout, &built)?;
        let (obs, results) = super::observe_kernel(
            env,
            self.scenario,
            &kernel,
            self.predicate,
            self.repeat,
            self.jobs,
        );
        for r in &results {
            on_event(TreeEvent::Trial(r));
        }
        Ok(obs)
    }

    /// Writes the reference observation, drives `git bisect run` with the
    /// step between the ends, keeps git's log and names the first new commit.
    fn git_bisect_run(
        &self,
        env: &TrialEnv,
        worktree: &Path,
        step: &StepCommand,
        reference: &Observation,
    ) -> Result<TreeOutcome, TreeError> {
        let reference_path = env.run_dir.join("bisect-reference.json");
        let json = serde_json::to_string(reference).expect("an observation serialises");
        std::fs::write(&reference_path, json).doing("writing the reference")?;
        let steps_log = env.run_dir.join("bisect-steps.log");
        let (old, new) = (self.old, self.new);
        git(
            worktree,
            &[
                "bisect",
                "start",
                "--term-old=old",
                "--term-new=new",
                new,
                old,
            ],
        )?;
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(worktree)
            .args(["bisect", "run"])
            .arg(&step.program)
            .args(&step.args)
            .arg("--tree")
            .arg(worktree)
            .arg("--reference")
            .arg(&reference_path)
            .args(["--band", &self.band.to_string()])
            .arg("--steps-log")
            .arg(&steps_log)
            .status()
            .doing("running git bisect run")?;
        let git_log = env.run_dir.join("bisect.log");
        let log = git(worktree, &["bisect", "log"]).unwrap_or_default();
        std::fs::write(&git_log, log).doing("writing git's bisect log")?;
        let first_new = match git(worktree, &["rev-parse", "refs/bisect/new"]) {
            Ok(first) => Some(git(
                self.repo,
                &["log", "-1", "--abbrev=12", "--format=%h %s", &first],
            )?),
            Err(_) => None,
        };
        Ok(TreeOutcome {
            git_failed: (!status.success()).then_some(status),
            first_new,
            steps_log,
            git_log,
        })
    }
}

/// One step's inputs (what `git bisect run` passes to `bisect-step`).
pub struct Step<'a> {
    /// The worktree git has checked the step's commit out in.
    pub tree: &'a Path,
    pub fragments: &'a [PathBuf],
    pub arch: kloop_protocol::Arch,
    pub scenario: &'a Scenario,
    pub predicate: &'a Predicate,
    pub reference: &'a Observation,
    pub repeat: usize,
    pub band: f64,
}

/// What a step came to, with the line for the steps log.
pub struct StepOutcome {
    pub verdict: StepVerdict,
    /// `<abbrev> <subject> → old|new|skip (…)`.
    pub line: String,
}

impl StepOutcome {
    /// `git bisect run`'s exit codes: 0 old, 1 new, 125 skip.
    pub fn exit_code(&self) -> u8 {
        match self.verdict {
            StepVerdict::Old => 0,
            StepVerdict::New => 1,
            StepVerdict::Skip(_) => 125,
        }
    }
}

/// Builds the checked-out commit and runs the scenario on it; a commit
/// that does not build is a skip (git then tests a neighbour).
/// `env_for` prepares the trial environment for the built kernel.
pub fn step(
    layout: &Layout,
    s: &Step<'_>,
    env_for: &mut dyn FnMut(&KernelUnderTest) -> Result<TrialEnv, crate::run::suite::SuiteError>,
    on_event: &mut dyn FnMut(TreeEvent<'_>),
) -> Result<StepOutcome, TreeError> {
    let head = git(s.tree, &["log", "-1", "--abbrev=12", "--format=%h %s"])?;
    let t = Instant::now();
    let built = match build_tree(layout, s.tree, s.fragments, s.arch, on_event) {
        Ok(k) => k,
        Err(e) => {
            let why = if e.is_build_failure() {
                "build failed"
            } else {
                "build"
            };
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            return Ok(StepOutcome {
                verdict: StepVerdict::Skip(format!("{why}: {first}")),
                line: format!("{head} → skip ({why}: {first})"),
            });
        }
    };
    let build_secs = t.elapsed().as_secs_f64();
    let kernel = tree_kernel(layout, &built)?;
    // No trial environment (QEMU, the agent) is no verdict on the commit:
    // the step fails, and the caller aborts the search.
    let env = env_for(&kernel)?;
    let t = Instant::now();
    let (obs, _) = super::observe_kernel(
        &env,
        s.scenario,
        &kernel,
        s.predicate,
        s.repeat,
        crate::run::suite::default_jobs(),
    );
    let classes: Vec<_> = obs
        .iter()
        .map(|o| classify(s.reference, o, s.band))
        .collect();
    let verdict = decide(&classes);
    let word = match &verdict {
        StepVerdict::Old => "old".to_string(),
        StepVerdict::New => "new".to_string(),
        StepVerdict::Skip(why) => format!("skip ({why})"),
    };
    let line = format!(
        "{head} → {word} (build {build_secs:.0} s, built:{}; runs {:.1} s)",
        built.record.id,
        t.elapsed().as_secs_f64()
    );
    Ok(StepOutcome { verdict, line })
}

/// A commit id's first 12 characters, as git abbreviates them here.
fn short(rev: &str) -> &str {
    &rev[..rev.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_git_bisect_runs() {
        let code = |verdict| {
            StepOutcome {
                verdict,
                line: String::new(),
            }
            .exit_code()
        };
        assert_eq!(code(StepVerdict::Old), 0);
        assert_eq!(code(StepVerdict::New), 1);
        assert_eq!(code(StepVerdict::Skip("x".into())), 125);
    }

    #[test]
    fn short_commit_never_panics_on_short_revisions() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        assert_eq!(short("HEAD"), "HEAD");
    }
}
