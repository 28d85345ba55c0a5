//! Judging mutants: each mutant's patch is built incrementally by the
//! source builder, and its kernel is run against the unmutated build's
//! results, scenario by scenario, the way `validate` compares a patch with
//! its baseline. A scenario that comes out CHANGED, BROKEN or INCOMPARABLE
//! (which covers an overhead figure out of its band) kills the mutant; the
//! remaining scenarios are then not run, since one killer is enough. A
//! mutant no scenario kills survived: the suite is blind there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_kernels::{Catalog, KernelCache};
use serde::{Deserialize, Serialize};

use crate::judge::ab::{self, Side};
use crate::mutate::{schema, Mutant};
use crate::run::suite::{self, EnvOptions, PlannedTrial};
use crate::run::trial::{BootMode, KernelUnderTest, LocalKernel, TrialEnv};
use crate::scenario::Scenario;
use crate::workspace::Layout;

#[derive(Debug, thiserror::Error)]
pub enum MutantsError {
    #[error("building the unmutated kernel: {0}")]
    Baseline(kloop_kernels::build::BuildError),
    #[error(transparent)]
    Suite(#[from] suite::SuiteError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error("the unmutated kernel does not pass scenario {scenario} ({verdict}): a mutant cannot be judged against it; fix that first (cargo xtask vm-test --kernel built:{id} --scenario {scenario})")]
    BaselineFails {
        scenario: String,
        verdict: String,
        id: String,
    },
    #[error("interrupted while the unmutated kernel ran its scenarios: nothing judged")]
    Interrupted,
    #[error("reading {path}: {why}")]
    Read { path: PathBuf, why: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How one mutant came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "kebab-case")]
pub enum Outcome {
    /// A scenario told it from the unmutated kernel: `scenario: CLASS: why`.
    Killed(String),
    /// Every scenario came out SAME.
    Survived,
    /// The compiler (or `patch`) refused it: the first error lines.
    BuildFailed(String),
    /// Trivial Compiler Equivalence: the mutated file compiled to the same
    /// code as the unmutated one (`kloop_kernels::build::objects`), so no
    /// run can tell them apart; not run.
    CompilerEquivalent,
    /// Its object code is that of an earlier mutant (the id): the same
    /// kernel, so the same outcome ([`MutantResult::resolved`]); not run.
    Duplicate(String),
    /// Not judged (interrupted, or the build machinery failed): why.
    NotJudged(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Killed(_) => "killed",
            Outcome::Survived => "survived",
            Outcome::BuildFailed(_) => "failed to build",
            Outcome::CompilerEquivalent => "equivalent (same object code)",
            Outcome::Duplicate(_) => "duplicate",
            Outcome::NotJudged(_) => "not judged",
        }
    }
}

/// How a scenario told a mutant from the unmutated kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KillKind {
    /// A rule broke (or the kernel did not finish the scenario): what a
    /// user sees on this kernel alone, with no baseline (`vm-test
    /// --kernel-image`, CI on a new kernel).
    Rule,
    /// Only the normalised stream (or whether the scenario runs) differs
    /// from the unmutated kernel's: visible against a baseline only.
    Diff,
    /// Only overhead figures left their band.
    Overhead,
}

impl KillKind {
    /// How `o`, a rejecting A/B outcome, rejects.
    pub fn of(o: &ab::AbOutcome) -> KillKind {
        // A fix flips a ledger rule's state: a rule saw it, not the diff.
        if matches!(o.class, ab::AbClass::Broken | ab::AbClass::Fixed) {
            KillKind::Rule
        } else if o.diff.is_empty() && o.figures.iter().any(|f| !f.within) {
            KillKind::Overhead
        } else {
            KillKind::Diff
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            KillKind::Rule => "rule",
            KillKind::Diff => "diff only",
            KillKind::Overhead => "overhead only",
        }
    }
}

/// A mutant and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MutantResult {
    pub mutant: Mutant,
    pub outcome: Outcome,
    pub build_secs: f64,
    /// Wall seconds of its trials.
    pub judge_secs: f64,
    /// Scenarios run before the verdict.
    pub scenarios_run: usize,
    /// Overhead figures out of band were measured again on both kernels
    /// (the verdict is the second comparison's).
    pub confirmed_figures: bool,
    /// A kill by the diff only was confirmed: the unmutated kernel ran the
    /// scenario again and matched its first run, and the mutant ran it
    /// again and still differed. Results from before this check are judged
    /// again by `--resume`.
    #[serde(default)]
    pub confirmed_diff: bool,
    /// Overhead figures left their band on the schema kernel, and nothing
    /// else differed: no kill. A schema kernel's copies of a function are
    /// compiled side by side in one body, so the compiler inlines and lays
    /// out the mutant's copy differently from the unmutated one (its
    /// inlining budget is the whole switch's): on a hot path
    /// (`__perf_output_begin`, `perf_event_ksymbol`) that moves the
    /// `-icount` figures whatever the mutation, so only a kernel built
    /// alone could tell. The first such finding, for the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_overhead: Option<String>,
    /// How it was killed: by a rule when any scenario broke one (judging
    /// goes on past a kill by the diff or by overhead figures, looking for
    /// a rule that sees the mutant without a baseline), else the first
    /// kill's kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub killed_by: Option<KillKind>,
    /// The scenario whose verdict killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub killed_in: Option<String>,
    /// sha256 of the mutated file's object code, when it was compared
    /// (Trivial Compiler Equivalence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_digest: Option<String>,
}

/// Results judged before a schema kernel's overhead figures stopped
/// killing (see [`MutantResult::schema_overhead`]), settled as they would be
/// judged now: a mutant of the schema kernel killed by overhead figures
/// alone ran every scenario (such a kill goes on looking for a rule) and
/// no rule or diff saw it, so it survived.
pub fn settle_schema_overhead(base: &MutantsBaseline, results: &mut [MutantResult]) {
    if base.phases.strategy != Strategy::Schemata {
        return;
    }
    for r in results.iter_mut() {
        let alone = base.phases.was_built_alone(&r.mutant.id);
        if r.killed_by == Some(KillKind::Overhead) && !alone {
            if let Outcome::Killed(why) = &r.outcome {
                r.schema_overhead = Some(why.clone());
            }
            r.outcome = Outcome::Survived;
            r.killed_by = None;
            r.killed_in = None;
        }
    }
}

/// Results that an interruption decided, from before interrupted trials
/// stopped the judging (an interrupted candidate counted as "did not
/// complete where the baseline did"): not judged, so `--resume` judges them
/// again. Such data holds the verdict only as the outcome's text, so the
/// text is what is read.
pub fn unsettle_interrupted(results: &mut [MutantResult]) {
    for r in results.iter_mut() {
        let interrupted =
            matches!(&r.outcome, Outcome::Killed(why) if why.contains(": INTERRUPTED: "));
        if interrupted {
            r.outcome = Outcome::NotJudged("interrupted (judged again)".into());
            r.killed_by = None;
            r.killed_in = None;
        }
    }
}

/// How many of `results` their object code decided without a run: the
/// unmutated build's code, and an earlier mutant's.
pub fn decided_by_code(results: &[MutantResult]) -> (usize, usize) {
    let same = results
        .iter()
        .filter(|r| r.outcome == Outcome::CompilerEquivalent)
        .count();
    let dups = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Duplicate(_)))
        .count();
    (same, dups)
}

impl MutantResult {
    /// `m`, not judged yet (survived until a scenario kills it).
    pub fn new(m: &Mutant) -> MutantResult {
        MutantResult {
            mutant: m.clone(),
            outcome: Outcome::Survived,
            build_secs: 0.0,
            judge_secs: 0.0,
            scenarios_run: 0,
            confirmed_figures: false,
            confirmed_diff: false,
            schema_overhead: None,
            killed_by: None,
            killed_in: None,
            code_digest: None,
        }
    }

    /// What a duplicate stands for: the outcome of the mutant it
    /// duplicates (looked up in `all`), else its own.
    pub fn resolved<'a>(&'a self, all: &'a [MutantResult]) -> &'a Outcome {
        match &self.outcome {
            Outcome::Duplicate(of) => all
                .iter()
                .find(|r| &r.mutant.id == of)
                .map(|r| &r.outcome)
                .unwrap_or(&self.outcome),
            o => o,
        }
    }
}

/// What the whole run had in common.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MutantsBaseline {
    pub source: String,
    pub kernel_id: String,
    pub release: String,
    pub scenarios: Vec<String>,
    pub accel: String,
    pub run_dir: PathBuf,
    /// How the mutants were built and what that took (empty for a run
    /// from before schemata).
    #[serde(default)]
    pub phases: Phases,
}

/// Beside `mutants.json` in a run directory: the run's [`MutantsBaseline`].
pub const BASELINE_FILE: &str = "mutants-baseline.json";
/// The results of a run, rewritten after every mutant.
pub const RESULTS_FILE: &str = "mutants.json";

/// A run's baseline and results in one file, which `mutants --report`
/// writes beside the report (`mutation-score.json` beside
/// `mutation-score.md`): run directories are pruned to the newest few, and
/// this keeps what a report is written from, so that notes added later can
/// still be applied with `mutants --from`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedRun {
    pub baseline: MutantsBaseline,
    pub results: Vec<MutantResult>,
}

/// Where [`SavedRun`] goes for a report at `report`.
pub fn data_beside(report: &Path) -> PathBuf {
    report.with_extension("json")
}

/// Writes `base` and `results` as a [`SavedRun`] to `path`.
pub fn write_saved(
    path: &Path,
    base: &MutantsBaseline,
    results: &[MutantResult],
) -> Result<(), MutantsError> {
    let saved = SavedRun {
        baseline: base.clone(),
        results: results.to_vec(),
    };
    let json = serde_json::to_vec_pretty(&saved).expect("the run serialises");
    // Rewritten after every mutant: a run killed while writing must leave
    // the previous version, never half of one.
    // A temporary name of this process's own, so that two runs writing
    // the same report never write into one file.
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| MutantsError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// The [`SavedRun`] at `path`, as [`write_saved`] wrote it.
pub fn read_saved(path: &Path) -> Result<(MutantsBaseline, Vec<MutantResult>), MutantsError> {
    let bytes = std::fs::read(path).map_err(|e| MutantsError::Read {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let saved: SavedRun = serde_json::from_slice(&bytes).map_err(|e| MutantsError::Read {
        path: path.to_path_buf(),
        why: format!("not the data a mutants report is written from: {e}"),
    })?;
    Ok((saved.baseline, saved.results))
}

/// The baseline and the results of the mutants run in `run_dir`, for a
/// report written again without judging (new notes, say); `run_dir` may
/// also be the [`SavedRun`] file written beside a report. A run from
/// before [`BASELINE_FILE`] existed has its baseline put together from
/// what it left: the unmutated kernel `base_req` builds (a cache hit), the
/// scenarios whose baseline trials are in the run directory, in judging
/// order, and the accelerator their results name.
pub fn read_run(
    layout: &Layout,
    base_req: &BuildRequest,
    run_dir: &Path,
) -> Result<(MutantsBaseline, Vec<MutantResult>), MutantsError> {
    if run_dir.is_file() {
        return read_saved(run_dir);
    }
    let read = |name: &str| {
        let path = run_dir.join(name);
        std::fs::read(&path).map_err(|e| MutantsError::Read {
            path: path.clone(),
            why: e.to_string(),
        })
    };
    let parse_error = |name: &str, e: serde_json::Error| MutantsError::Read {
        path: run_dir.join(name),
        why: e.to_string(),
    };
    let results: Vec<MutantResult> =
        serde_json::from_slice(&read(RESULTS_FILE)?).map_err(|e| parse_error(RESULTS_FILE, e))?;
    if run_dir.join(BASELINE_FILE).is_file() {
        let mut base: MutantsBaseline = serde_json::from_slice(&read(BASELINE_FILE)?)
            .map_err(|e| parse_error(BASELINE_FILE, e))?;
        base.run_dir = run_dir.to_path_buf();
        return Ok((base, results));
    }
    let cache = KernelCache::default_location()?;
    let baseline = kloop_kernels::build::build(&cache, base_req, &mut |_| {})
        .map_err(MutantsError::Baseline)?;
    let trials = run_dir.join(format!("built-{}", baseline.record.id));
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(suite::SuiteError::from)?;
    let ran: Vec<Scenario> = all
        .into_iter()
        .filter(|s| trials.join(&s.name).join("result.json").is_file())
        .collect();
    if ran.is_empty() {
        return Err(MutantsError::Read {
            path: trials,
            why: "no baseline trial results: not the run directory of this source's mutants".into(),
        });
    }
    let scenarios: Vec<String> = judging_order(ran).into_iter().map(|s| s.name).collect();
    let first = trials.join(&scenarios[0]).join("result.json");
    let accel = std::fs::read(&first)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["accel"].as_str().map(str::to_owned))
        .ok_or_else(|| MutantsError::Read {
            path: first.clone(),
            why: "no accel in the baseline trial's result".into(),
        })?;
    let base = MutantsBaseline {
        source: baseline.record.source.clone(),
        kernel_id: baseline.record.id.clone(),
        release: baseline.record.release.clone(),
        scenarios,
        accel,
        run_dir: run_dir.to_path_buf(),
        phases: Phases::default(),
    };
    Ok((base, results))
}

/// The order scenarios are tried in: cheap ones first (one killer is
/// enough), the icount overhead measurement and the real perf last.
pub fn judging_order(mut scenarios: Vec<Scenario>) -> Vec<Scenario> {
    let cost = |s: &Scenario| match s.name.as_str() {
        "overhead" => 2,
        "perf-tool" => 1,
        _ => 0,
    };
    scenarios.sort_by_key(|s| (cost(s), s.name.clone()));
    scenarios
}

/// How the mutants' kernels are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Each mutant's file compiled alone first (Trivial Compiler
    /// Equivalence, duplicates and build failures decided with no kernel
    /// build), then every mutant left in one schema kernel
    /// ([`crate::mutate::schema`]), switched per trial; a mutant the
    /// schema cannot hold is built on its own.
    #[default]
    Schemata,
    /// A kernel per mutant, its patch built incrementally.
    BuildEach,
}

/// What a run's phases took, for the report. A run from before schemata
/// has none in its data: it built each mutant ([`Phases::default`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phases {
    pub strategy: Strategy,
    /// Compiling each mutated file alone (both cores).
    pub compile_secs: f64,
    /// Building the schema kernel.
    pub schema_build_secs: f64,
    /// The schema kernel's build id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_kernel: Option<String>,
    /// Mutants the schema kernel held.
    pub in_schema: usize,
    /// Mutants built on their own, and why (`id: why`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub built_alone: Vec<String>,
    /// Scenarios whose unmutated runs differed from each other (scenario:
    /// the first differing line): their diff kills nothing, only their
    /// rules do.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub noisy: BTreeMap<String, String>,
    /// How many results, first in the run's list, were carried over from
    /// an earlier stretch (`--resume`): the figures above are not theirs.
    #[serde(default)]
    pub carried: usize,
}

impl Phases {
    /// Whether mutant `id` was built on its own kernel: no schema kernel
    /// was built, or the schema could not hold it (`built_alone`).
    pub fn was_built_alone(&self, id: &str) -> bool {
        self.schema_kernel.is_none()
            || self
                .built_alone
                .iter()
                .any(|a| a.split(": ").next() == Some(id))
    }
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            strategy: Strategy::BuildEach,
            compile_secs: 0.0,
            schema_build_secs: 0.0,
            schema_kernel: None,
            in_schema: 0,
            built_alone: Vec::new(),
            noisy: BTreeMap::new(),
            carried: 0,
        }
    }
}

/// A kernel as a trial runs it: a schema kernel carries the switch value
/// its plans set.
#[derive(Clone)]
struct Subject {
    kernel: KernelUnderTest,
    switch: Option<u32>,
    /// Per scenario, the deadline of a whole trial (seconds): a few times
    /// the unmutated kernel's run of it. Empty: the accelerator's default.
    deadlines: BTreeMap<String, u64>,
}

impl Subject {
    fn plain(kernel: KernelUnderTest) -> Subject {
        Subject {
            kernel,
            switch: None,
            deadlines: BTreeMap::new(),
        }
    }

    fn trial(&self, s: &Scenario) -> PlannedTrial {
        let mut scenario = s.clone();
        if let Some(&secs) = self.deadlines.get(&s.name) {
            scenario.vm.total_secs = Some(secs);
        }
        if let Some(n) = self.switch {
            scenario.plan.params.push(kloop_protocol::ParamWrite {
                module: "kernel".into(),
                name: schema::SWITCH.into(),
                value: n.to_string(),
            });
        }
        PlannedTrial {
            kernel: self.kernel.clone(),
            scenario,
        }
    }
}

/// Per scenario: the reference run's side, and the deadline (seconds) of a
/// mutant's run of it.
type References = (BTreeMap<String, Side>, BTreeMap<String, u64>);

/// Runs `chosen` on `subject`: each scenario's side and a deadline for a
/// mutant's run of it; the first
/// that fails the run is an error (a mutant cannot be judged against it).
fn reference_sides(
    env: &TrialEnv,
    subject: &Subject,
    chosen: &[Scenario],
    jobs: usize,
    id: &str,
) -> Result<References, MutantsError> {
    let trials: Vec<PlannedTrial> = chosen.iter().map(|s| subject.trial(s)).collect();
    let mut sides = BTreeMap::new();
    let mut deadlines = BTreeMap::new();
    for r in suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {}) {
        if matches!(r.verdict, crate::run::trial::Verdict::Interrupted(_)) {
            return Err(MutantsError::Interrupted);
        }
        if r.verdict.fails_run() {
            return Err(MutantsError::BaselineFails {
                scenario: r.scenario.clone(),
                verdict: r.verdict.label().to_string(),
                id: id.to_string(),
            });
        }
        sides.insert(r.scenario.clone(), crate::run::ab::side_of(&r));
        // Six times the unmutated run and half a minute: a mutant that
        // hangs its kernel times out here, killed by the rule that a
        // scenario the baseline completes completes.
        deadlines.insert(r.scenario.clone(), (r.wall_secs * 6.0) as u64 + 30);
    }
    Ok((sides, deadlines))
}

/// Builds the unmutated kernel, then judges each mutant in turn
/// (`on_result` as each is decided) against the scenarios' runs on the
/// unmutated code: with [`Strategy::Schemata`], the schema kernel with its
/// switch at 0; otherwise (and for a mutant built alone) the unmutated
/// kernel. Mutant kernels are removed from the cache once judged (their
/// patch rebuilds them).
#[allow(clippy::too_many_arguments)] // the source, the mutants, how to run, two callbacks
#[expect(clippy::too_many_lines)]
pub fn judge_all(
    layout: &Layout,
    base_req: &BuildRequest,
    mutants: &[Mutant],
    scenarios: &[String],
    opts: &EnvOptions,
    jobs: usize,
    strategy: Strategy,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
    on_result: &mut dyn FnMut(&MutantsBaseline, &[MutantResult]),
) -> Result<(MutantsBaseline, Vec<MutantResult>), MutantsError> {
    let cache = KernelCache::default_location()?;
    let catalog = Catalog::load(&layout.kernels())?;
    let baseline = kloop_kernels::build::build(&cache, base_req, &mut |e| on_build("unmutated", e))
        .map_err(MutantsError::Baseline)?;
    let local = |k: &BuiltKernel| KernelUnderTest::Image(LocalKernel::built(k, None, &catalog));
    let base_kernel = local(&baseline);
    let mut env = suite::prepare_env(layout, opts, std::slice::from_ref(&base_kernel))?;
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(suite::SuiteError::from)?;
    let chosen =
        judging_order(crate::scenario::select(&all, scenarios).map_err(suite::SuiteError::from)?);
    let patch_dir = env.run_dir.join("mutants");
    std::fs::create_dir_all(&patch_dir).map_err(|source| MutantsError::Write {
        path: patch_dir.clone(),
        source,
    })?;
    let mut phases = Phases {
        strategy,
        ..Phases::default()
    };

    // Compiled alone: what the code alone decides, and the schema.
    let mut decided: BTreeMap<usize, MutantResult> = BTreeMap::new();
    let mut in_schema: BTreeMap<usize, u32> = BTreeMap::new();
    let mut digests: BTreeMap<usize, String> = BTreeMap::new();
    let mut compile_secs: BTreeMap<usize, f64> = BTreeMap::new();
    let mut schema_kernel = None;
    if strategy == Strategy::Schemata {
        let total = mutants.len();
        let mut progress = |done: usize| {
            // A line every tenth, not one per mutant.
            if done == total || done.is_multiple_of((total / 10).max(1)) {
                on_build(
                    "compile-alone",
                    kloop_kernels::build::BuildEvent::Phase(format!(
                        "compiled {done} of {total} mutated files alone"
                    )),
                );
            }
        };
        match compile_phase(&cache, base_req, &baseline, mutants, jobs, &mut progress) {
            Ok((secs, outcomes)) => {
                phases.compile_secs = secs;
                let mut left = Vec::new();
                for (n, (outcome, digest, secs)) in outcomes.into_iter().enumerate() {
                    match outcome {
                        Some(outcome) => {
                            decided.insert(
                                n,
                                MutantResult {
                                    build_secs: secs,
                                    code_digest: digest,
                                    outcome,
                                    ..MutantResult::new(&mutants[n])
                                },
                            );
                        }
                        None => {
                            compile_secs.insert(n, secs);
                            left.push((n, digest));
                        }
                    }
                }
                let to_switch: Vec<usize> = left.iter().map(|(n, _)| *n).collect();
                match schema_build(&cache, base_req, mutants, &to_switch, &patch_dir, on_build) {
                    Ok((built, included, left_out, secs)) => {
                        phases.schema_build_secs = secs;
                        phases.schema_kernel = Some(built.record.id.clone());
                        phases.in_schema = included.len();
                        phases.built_alone = left_out;
                        for n in included {
                            in_schema.insert(n, n as u32 + 1);
                        }
                        schema_kernel = Some(built);
                    }
                    Err(why) => {
                        tracing::warn!("no schema kernel, every mutant built alone: {why}");
                        phases.built_alone.push(format!("all: {why}"));
                    }
                }
                digests.extend(left.into_iter().filter_map(|(n, d)| Some((n, d?))));
            }
            Err(why) => {
                tracing::warn!("no compile-alone phase, every mutant built alone: {why}");
                phases.built_alone.push(format!("all: {why}"));
            }
        }
    }

    let schema_subject = schema_kernel.as_ref().map(|k| {
        let KernelUnderTest::Image(mut lk) = local(k) else {
            unreachable!("a built kernel is an image")
        };
        lk.name = format!("schema-{}", k.record.id);
        Subject {
            kernel: KernelUnderTest::Image(lk),
            switch: Some(0),
            deadlines: BTreeMap::new(),
        }
    });
    // The reference runs: on the schema kernel (a saved VM per shape, since
    // it serves every trial), and on the unmutated kernel when any mutant is
    // built alone (cold boots: a mutant kernel boots a handful of trials).
    let (schema_sides, deadlines) = match (&schema_subject, &schema_kernel) {
        (Some(s), Some(k)) => {
            let (sides, deadlines) = reference_sides(&env, s, &chosen, jobs, &k.record.id)?;
            (Some(sides), deadlines)
        }
        _ => (None, BTreeMap::new()),
    };
    let alone_needed =
        (0..mutants.len()).any(|n| !decided.contains_key(&n) && !in_schema.contains_key(&n));
    env.boot = BootMode::Cold;
    let base_sides = if alone_needed || schema_sides.is_none() {
        reference_sides(
            &env,
            &Subject::plain(base_kernel.clone()),
            &chosen,
            jobs,
            &baseline.record.id,
        )?
        .0
    } else {
        BTreeMap::new()
    };
    env.boot = opts.boot;
    let mut base = MutantsBaseline {
        source: baseline.record.source.clone(),
        kernel_id: baseline.record.id.clone(),
        release: baseline.record.release.clone(),
        scenarios: chosen.iter().map(|s| s.name.clone()).collect(),
        accel: env.accel.accel.clone(),
        run_dir: env.run_dir.clone(),
        phases,
    };
    let base_file = env.run_dir.join(BASELINE_FILE);
    let json = serde_json::to_vec_pretty(&base).expect("the baseline serialises");
    std::fs::write(&base_file, json).map_err(|source| MutantsError::Write {
        path: base_file,
        source,
    })?;
    let mut tce = Tce::new(&cache, base_req, &baseline, mutants);
    let mut results = Vec::new();
    for (n, m) in mutants.iter().enumerate() {
        let r = if let Some(r) = decided.remove(&n) {
            r
        } else if let (Some(&switch), Some(subject), Some(sides)) =
            (in_schema.get(&n), &schema_subject, &schema_sides)
        {
            let mut r = MutantResult::new(m);
            r.code_digest = digests.get(&n).cloned();
            // Its share of the build: the compile alone (the schema
            // kernel's build is the run's, in `phases`).
            r.build_secs = compile_secs.get(&n).copied().unwrap_or(0.0);
            if crate::run::signals::interrupted() {
                r.outcome = Outcome::NotJudged("interrupted".into());
            } else {
                let KernelUnderTest::Image(mut lk) = subject.kernel.clone() else {
                    unreachable!("a schema kernel is an image")
                };
                lk.name = format!("{}-m{switch:03}", lk.name);
                let mutant = Subject {
                    kernel: KernelUnderTest::Image(lk),
                    switch: Some(switch),
                    deadlines: deadlines.clone(),
                };
                let order = learned_order(&chosen, m, &results);
                judge_on(
                    &env,
                    (subject, sides),
                    &mutant,
                    (&order, &mut base.phases.noisy),
                    jobs,
                    &mut r,
                );
            }
            r
        } else {
            env.boot = BootMode::Cold;
            let r = judge_one(
                &env,
                (&cache, &catalog),
                base_req,
                m,
                n,
                &patch_dir,
                (&base_kernel, &base_sides),
                (&chosen, &mut base.phases.noisy),
                jobs,
                &mut tce,
                on_build,
            );
            env.boot = opts.boot;
            r
        };
        if let (Some(d), Outcome::Killed(_) | Outcome::Survived) = (&r.code_digest, &r.outcome) {
            tce.judged
                .entry((m.file.clone(), d.clone()))
                .or_insert_with(|| m.id.clone());
        }
        results.push(r);
        // After each mutant, so a run stopped halfway keeps its findings.
        on_result(&base, &results);
    }
    if let Some(k) = &schema_kernel {
        forget_kernel(&cache, k);
    }
    Ok((base, results))
}

/// The order to try `chosen` in for `m`: first the scenarios that killed
/// mutants of the same function by a rule (most recent first), then those
/// that killed mutants of the same file, then those that killed any by a
/// rule (most kills first), then the rest as `chosen` has them (cheap
/// first). A killed mutant stops at its first rule kill, so
/// a scenario that already reaches this code saves the ones before it; a
/// survivor runs every scenario whatever the order, so no kill is lost.
fn learned_order(chosen: &[Scenario], m: &Mutant, judged: &[MutantResult]) -> Vec<Scenario> {
    let mut first: Vec<&str> = Vec::new();
    for same_function in [true, false] {
        for r in judged.iter().rev() {
            let near = if same_function {
                r.mutant.file == m.file && r.mutant.function == m.function
            } else {
                r.mutant.file == m.file
            };
            if let (true, Some(KillKind::Rule), Some(s)) = (near, r.killed_by, &r.killed_in) {
                if !first.contains(&s.as_str()) {
                    first.push(s);
                }
            }
        }
    }
    // Then, for code no mutant of its file reached yet, the scenarios that
    // killed most by a rule anywhere (cheap ones first among equals).
    let mut kills: BTreeMap<&str, usize> = BTreeMap::new();
    for r in judged {
        if let (Some(KillKind::Rule), Some(s)) = (r.killed_by, &r.killed_in) {
            *kills.entry(s.as_str()).or_default() += 1;
        }
    }
    let mut by_kills: Vec<(&str, usize)> = chosen
        .iter()
        .filter_map(|s| kills.get(s.name.as_str()).map(|&k| (s.name.as_str(), k)))
        .collect();
    // A stable sort keeps `chosen`'s order among equal counts.
    by_kills.sort_by_key(|&(_, k)| std::cmp::Reverse(k));
    for (name, _) in by_kills {
        if !first.contains(&name) {
            first.push(name);
        }
    }
    let mut order: Vec<Scenario> = first
        .iter()
        .filter_map(|name| chosen.iter().find(|s| s.name == *name).cloned())
        .collect();
    order.extend(
        chosen
            .iter()
            .filter(|s| !first.contains(&s.name.as_str()))
            .cloned(),
    );
    order
}

/// Per mutant: its outcome when its code decides it (`None`: it must be
/// run), its code digest, and the seconds its compile took.
type CompileOutcome = (Option<Outcome>, Option<String>, f64);

/// Compiles every mutant's file alone, `jobs` at a time, as kbuild
/// compiled the unmutated file in the unmutated build's output directory:
/// a compiler error is a build failure, the unmutated code is equivalence,
/// an earlier mutant's code a duplicate (of the earlier one, in order).
#[expect(clippy::too_many_lines)]
fn compile_phase(
    cache: &KernelCache,
    req: &BuildRequest,
    baseline: &BuiltKernel,
    mutants: &[Mutant],
    jobs: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<(f64, Vec<CompileOutcome>), String> {
    use kloop_kernels::build::objects::{compile_alone, CompileError};
    let out = kloop_kernels::build::objects_of(cache, req, baseline)
        .map_err(|e| e.to_string())?
        .ok_or("the unmutated build's output directory holds another build since")?;
    let tree = kloop_kernels::build::source_tree(cache, &req.source, &req.fetch)
        .map_err(|e| e.to_string())?;
    let tmp = cache.root().join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    // One path for every run (ccache keys on it; see compile_alone).
    let work = tmp.join("compile-alone");
    let started = Instant::now();
    let mut originals: BTreeMap<String, (String, String)> = BTreeMap::new();
    for m in mutants {
        if originals.contains_key(&m.file) {
            continue;
        }
        let path = tree.join(&m.file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let digest = compile_alone(&out, &m.file, &text, &work)
            .map_err(|e| format!("compiling the unmutated {} alone: {e}", m.file))?;
        originals.insert(m.file.clone(), (text, digest));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    type Compiled = Option<(Result<String, CompileError>, f64)>;
    let compiled: std::sync::Mutex<Vec<Compiled>> =
        std::sync::Mutex::new((0..mutants.len()).map(|_| None).collect());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            let tx = tx.clone();
            let (next, originals, compiled, out, work) =
                (&next, &originals, &compiled, &out, &work);
            scope.spawn(move || loop {
                if crate::run::signals::interrupted() {
                    break;
                }
                let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(m) = mutants.get(n) else { break };
                let t = Instant::now();
                let (original, _) = &originals[&m.file];
                let r = match schema::mutated_text(original, m) {
                    Ok(text) => compile_alone(out, &m.file, &text, work),
                    Err(e) => Err(CompileError::Refused(format!("kloop's own patch: {e}"))),
                };
                compiled.lock().unwrap_or_else(|p| p.into_inner())[n] =
                    Some((r, t.elapsed().as_secs_f64()));
                let _ = tx.send(());
            });
        }
        drop(tx);
        // Here, not in the workers: `progress` is the caller's.
        for (done, ()) in rx.iter().enumerate() {
            progress(done + 1);
        }
    });
    let compiled = compiled.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for (m, c) in mutants.iter().zip(compiled) {
        outcomes.push(match c {
            None => (Some(Outcome::NotJudged("interrupted".into())), None, 0.0),
            Some((Err(CompileError::Refused(why)), secs)) => {
                (Some(Outcome::BuildFailed(why)), None, secs)
            }
            Some((Err(e), secs)) => (
                Some(Outcome::NotJudged(format!("compiling alone: {e}"))),
                None,
                secs,
            ),
            Some((Ok(d), secs)) => {
                let outcome = if d == originals[&m.file].1 {
                    Some(Outcome::CompilerEquivalent)
                } else if let Some(first) = seen.get(&(m.file.clone(), d.clone())) {
                    Some(Outcome::Duplicate(first.clone()))
                } else {
                    seen.insert((m.file.clone(), d.clone()), m.id.clone());
                    None
                };
                (outcome, Some(d), secs)
            }
        });
    }
    Ok((started.elapsed().as_secs_f64(), outcomes))
}

/// Builds one kernel holding the mutants `numbers` (indices into
/// `mutants`; the switch value of each is its index + 1). Returns the
/// kernel, the indices it holds, the mutants it cannot hold (`id: why`)
/// and the build's seconds.
fn schema_build(
    cache: &KernelCache,
    req: &BuildRequest,
    mutants: &[Mutant],
    numbers: &[usize],
    patch_dir: &Path,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
) -> Result<(BuiltKernel, Vec<usize>, Vec<String>, f64), String> {
    let tree = kloop_kernels::build::source_tree(cache, &req.source, &req.fetch)
        .map_err(|e| e.to_string())?;
    let mut by_file: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &n in numbers {
        by_file.entry(mutants[n].file.as_str()).or_default().push(n);
    }
    let mut patch = String::new();
    let mut included = Vec::new();
    let mut left_out = Vec::new();
    for (i, (file, ns)) in by_file.iter().enumerate() {
        let path = tree.join(file);
        let original = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let mut texts = Vec::new();
        for &n in ns {
            match schema::mutated_text(&original, &mutants[n]) {
                Ok(t) => texts.push((n, t)),
                Err(e) => left_out.push(format!("{}: {e}", mutants[n].id)),
            }
        }
        let variants: Vec<schema::Variant> = texts
            .iter()
            .map(|(n, t)| schema::Variant {
                number: *n as u32 + 1,
                function: &mutants[*n].function,
                mutated: t,
            })
            .collect();
        let s = schema::file_schema(&original, &variants, i == 0);
        included.extend(s.included.iter().map(|k| *k as usize - 1));
        left_out.extend(
            s.left_out
                .iter()
                .map(|(k, why)| format!("{}: {why}", mutants[*k as usize - 1].id)),
        );
        patch.push_str(&crate::mutate::file_patch(file, &original, &s.text));
    }
    if included.is_empty() {
        return Err("no mutant fits a schema".into());
    }
    let path = patch_dir.join("schema.patch");
    std::fs::write(&path, &patch).map_err(|e| format!("writing {}: {e}", path.display()))?;
    let req = req.with_patches(vec![path]);
    let started = Instant::now();
    let built = kloop_kernels::build::build(cache, &req, &mut |e| on_build("schema", e))
        .map_err(|e| format!("building the schema kernel: {e}"))?;
    included.sort_unstable();
    Ok((built, included, left_out, started.elapsed().as_secs_f64()))
}

/// Trivial Compiler Equivalence: the unmutated build's object code of
/// each mutated file, and the object code of the mutants judged so far.
struct Tce {
    /// file → digest of its unmutated object; empty when the unmutated
    /// build's objects are gone (its output directory was reused), and
    /// then every mutant is run.
    base: BTreeMap<String, String>,
    /// (file, digest) → the first mutant judged with that code.
    judged: BTreeMap<(String, String), String>,
}

impl Tce {
    fn new(
        cache: &KernelCache,
        req: &BuildRequest,
        baseline: &BuiltKernel,
        mutants: &[Mutant],
    ) -> Tce {
        let mut base = BTreeMap::new();
        match kloop_kernels::build::objects_of(cache, req, baseline) {
            Ok(Some(out)) => {
                for m in mutants {
                    if base.contains_key(&m.file) {
                        continue;
                    }
                    match kloop_kernels::build::objects::code_digest(&out.join(object_of(&m.file))) {
                        Ok(d) => {
                            base.insert(m.file.clone(), d);
                        }
                        Err(e) => tracing::warn!("no compiler-equivalence check for {}: {e}", m.file),
                    }
                }
            }
            Ok(None) => tracing::warn!(
                "the unmutated build's objects were rebuilt since: every mutant is run (no compiler-equivalence check)"
            ),
            Err(e) => tracing::warn!("no compiler-equivalence check: {e}"),
        }
        Tce {
            base,
            judged: BTreeMap::new(),
        }
    }
}

/// `kernel/events/core.o` for `kernel/events/core.c`.
fn object_of(file: &str) -> String {
    match file.strip_suffix(".c") {
        Some(stem) => format!("{stem}.o"),
        None => file.to_string(),
    }
}

/// An outcome that rejects only because overhead figures left their band
/// (the streams and the rules agree).
fn figures_only(o: &ab::AbOutcome) -> bool {
    o.class == ab::AbClass::Changed && o.diff.is_empty() && o.figures.iter().any(|f| !f.within)
}

/// Runs `scenario` once more on both kernels and compares those runs.
fn confirm_figures(
    env: &TrialEnv,
    base: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    jobs: usize,
) -> Option<ab::AbOutcome> {
    let (base_side, mutant) = run_again(env, base, subject, scenario, jobs)?;
    Some(ab::compare(&scenario.name, &base_side, &mutant))
}

/// Both kernels run `scenario` once more, side by side: their sides.
fn run_again(
    env: &TrialEnv,
    reference: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    jobs: usize,
) -> Option<(Side, Side)> {
    let trials = [reference, subject].map(|k| k.trial(scenario));
    let results = suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {});
    let side = |k: &Subject| {
        results
            .iter()
            .find(|r| r.kernel == k.kernel.id())
            .map(crate::run::ab::side_of)
    };
    Some((side(reference)?, side(subject)?))
}

/// What running a scenario again said of a kill by the diff only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DiffCheck {
    /// The unmutated kernel repeated its run, the mutant its difference.
    Confirmed,
    /// The unmutated kernel's two runs differ: this scenario's diff is no
    /// evidence (recorded in `noisy`, so it is not asked again).
    Noisy,
    /// The mutant's second run matched the unmutated kernel's.
    NotAgain,
}

/// Confirms a kill by the diff only in `scenario`: a scenario whose
/// stream can legitimately differ between runs (how many attempts a
/// fault-injection sweep takes depends on what else allocates, say) must
/// not kill by one differing run. Both kernels run it again; the kill
/// stands when the unmutated kernel matches its first run and the mutant
/// still differs from it.
fn confirm_diff(
    env: &TrialEnv,
    reference: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    base: &Side,
    noisy: &mut BTreeMap<String, String>,
    jobs: usize,
) -> DiffCheck {
    if noisy.contains_key(&scenario.name) {
        return DiffCheck::Noisy;
    }
    let Some((again, mutant)) = run_again(env, reference, subject, scenario, jobs) else {
        return DiffCheck::NotAgain;
    };
    let itself = ab::compare(&scenario.name, base, &again);
    if itself.class.differs() {
        let why = itself.diff.first().or(itself.details.first());
        noisy.insert(
            scenario.name.clone(),
            why.and_then(|d| d.lines().find(|l| l.starts_with(['-', '+'])))
                .unwrap_or("the verdict differs")
                .to_string(),
        );
        return DiffCheck::Noisy;
    }
    if ab::compare(&scenario.name, base, &mutant).class.differs() {
        DiffCheck::Confirmed
    } else {
        DiffCheck::NotAgain
    }
}

#[allow(clippy::too_many_arguments)] // everything judge_all shares with each mutant
fn judge_one(
    env: &TrialEnv,
    (cache, catalog): (&KernelCache, &Catalog),
    base_req: &BuildRequest,
    m: &Mutant,
    n: usize,
    patch_dir: &Path,
    (base_kernel, base_sides): (&KernelUnderTest, &BTreeMap<String, Side>),
    (chosen, noisy): (&[Scenario], &mut BTreeMap<String, String>),
    jobs: usize,
    tce: &mut Tce,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
) -> MutantResult {
    let mut result = MutantResult::new(m);
    if crate::run::signals::interrupted() {
        result.outcome = Outcome::NotJudged("interrupted".into());
        return result;
    }
    let patch = patch_dir.join(format!("{n:03}.patch"));
    if let Err(e) = std::fs::write(&patch, &m.patch) {
        result.outcome = Outcome::NotJudged(format!("writing {}: {e}", patch.display()));
        return result;
    }
    let req = base_req.with_patches(vec![patch]);
    let started = Instant::now();
    let built = kloop_kernels::build::build(cache, &req, &mut |e| on_build(&m.id, e));
    result.build_secs = started.elapsed().as_secs_f64();
    let built = match built {
        Ok(k) => k,
        Err(e) if e.is_build_failure() => {
            let text = e.to_string();
            let first: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .collect();
            result.outcome = Outcome::BuildFailed(first.join(" / "));
            return result;
        }
        Err(e) => {
            result.outcome = Outcome::NotJudged(format!("build: {e}"));
            return result;
        }
    };
    // The mutated file's object code, read before the next mutant's build
    // reuses the output directory: the unmutated code (or an earlier
    // mutant's) decides without a run.
    if let Some(base_digest) = tce.base.get(&m.file) {
        let digest = kloop_kernels::build::objects_of(cache, &req, &built)
            .ok()
            .flatten()
            .and_then(|out| {
                kloop_kernels::build::objects::code_digest(&out.join(object_of(&m.file))).ok()
            });
        if let Some(d) = digest {
            result.code_digest = Some(d.clone());
            let decided = if &d == base_digest {
                Some(Outcome::CompilerEquivalent)
            } else {
                tce.judged
                    .get(&(m.file.clone(), d))
                    .map(|id| Outcome::Duplicate(id.clone()))
            };
            if let Some(outcome) = decided {
                result.outcome = outcome;
                forget_kernel(cache, &built);
                return result;
            }
        }
    }
    let kernel = Subject::plain(KernelUnderTest::Image(LocalKernel::built(
        &built, None, catalog,
    )));
    judge_on(
        env,
        (&Subject::plain(base_kernel.clone()), base_sides),
        &kernel,
        (chosen, noisy),
        jobs,
        &mut result,
    );
    forget_kernel(cache, &built);
    result
}

/// Runs `chosen` on `subject` until a rule kills it (or all ran), each
/// compared with `base`'s run of the scenario; the verdict in `result`.
#[expect(clippy::too_many_lines)]
fn judge_on(
    env: &TrialEnv,
    (reference, base_sides): (&Subject, &BTreeMap<String, Side>),
    subject: &Subject,
    (chosen, noisy): (&[Scenario], &mut BTreeMap<String, String>),
    jobs: usize,
    result: &mut MutantResult,
) {
    let started = Instant::now();
    'batches: for batch in chosen.chunks(jobs.max(1)) {
        let trials: Vec<PlannedTrial> = batch.iter().map(|s| subject.trial(s)).collect();
        let results = suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {});
        result.scenarios_run += results.len();
        // A trial cut short by Ctrl-C or SIGTERM says nothing of the
        // mutant: it is not judged, whatever came before.
        if results
            .iter()
            .any(|r| matches!(r.verdict, crate::run::trial::Verdict::Interrupted(_)))
        {
            result.outcome = Outcome::NotJudged("interrupted".into());
            result.killed_by = None;
            result.killed_in = None;
            break 'batches;
        }
        for r in &results {
            let Some(base) = base_sides.get(&r.scenario) else {
                continue;
            };
            let mut outcome = ab::compare(&r.scenario, base, &crate::run::ab::side_of(r));
            if outcome.class.differs() && figures_only(&outcome) {
                // A figure a hair outside its band in one pair of runs is
                // as likely noise as a change: both kernels measure again,
                // and only a change that shows twice kills.
                if let Some(scenario) = chosen.iter().find(|s| s.name == r.scenario) {
                    if let Some(again) = confirm_figures(env, reference, subject, scenario, jobs) {
                        result.confirmed_figures = true;
                        result.scenarios_run += 1;
                        outcome = again;
                    }
                }
            }
            if outcome.class.differs() && KillKind::of(&outcome) == KillKind::Diff {
                let Some(scenario) = chosen.iter().find(|s| s.name == r.scenario) else {
                    continue;
                };
                match confirm_diff(env, reference, subject, scenario, base, noisy, jobs) {
                    DiffCheck::Confirmed => result.confirmed_diff = true,
                    DiffCheck::Noisy | DiffCheck::NotAgain => continue,
                }
                result.scenarios_run += 2;
            }
            if outcome.class.differs()
                && subject.switch.is_some()
                && KillKind::of(&outcome) == KillKind::Overhead
            {
                if result.schema_overhead.is_none() {
                    result.schema_overhead = Some(format!(
                        "{}: {}",
                        r.scenario,
                        outcome
                            .details
                            .first()
                            .map_or("", |d| d.lines().next().unwrap_or(""))
                    ));
                }
                continue;
            }
            if outcome.class.differs() {
                let kind = KillKind::of(&outcome);
                let why = outcome
                    .details
                    .first()
                    .or(outcome.diff.first())
                    .cloned()
                    .unwrap_or_default();
                let text = format!(
                    "{}: {}: {}{}",
                    r.scenario,
                    outcome.class.label(),
                    why.lines().next().unwrap_or(""),
                    if result.confirmed_figures {
                        " (out of band in a second pair of runs too)"
                    } else {
                        ""
                    }
                );
                // The first kill stands until a rule kills it: a kill by
                // a rule ends the judging, one by the diff or the figures
                // only goes on looking for a rule.
                if result.killed_by.is_none_or(|k| kind < k) {
                    result.killed_by = Some(kind);
                    result.killed_in = Some(r.scenario.clone());
                    result.outcome = Outcome::Killed(text);
                }
                if kind == KillKind::Rule {
                    break 'batches;
                }
            }
        }
        if crate::run::signals::interrupted() {
            result.outcome = Outcome::NotJudged("interrupted".into());
            break;
        }
    }
    result.judge_secs = started.elapsed().as_secs_f64();
}

/// The mutant's kernel and its PVH ELF are not worth their disk: its patch
/// rebuilds them.
fn forget_kernel(cache: &KernelCache, built: &BuiltKernel) {
    let _ = std::fs::remove_file(
        cache
            .root()
            .join("vmlinux")
            .join(&built.record.image_sha256),
    );
    let _ = std::fs::remove_dir_all(&built.dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::Operator;

    /// What `mutants --report` leaves beside the report reads back as the
    /// run it was written from, and a file that is something else is
    /// refused naming what it should have been.
    #[test]
    fn saved_run_reads_back_and_other_json_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("mutation-score.md");
        let data = data_beside(&report);
        assert_eq!(data, dir.path().join("mutation-score.json"));
        let base = MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: "53e347db1de9".into(),
            release: "6.12.57".into(),
            scenarios: vec!["basic".into(), "symbol-state".into()],
            accel: "tcg".into(),
            run_dir: dir.path().join("runs/1-2"),
            phases: Default::default(),
        };
        let result = MutantResult {
            mutant: Mutant {
                id: "bpf/core.c:bpf_prog_kallsyms_add:702:constant".into(),
                file: "kernel/bpf/core.c".into(),
                function: "bpf_prog_kallsyms_add".into(),
                line: 702,
                operator: Operator::DropCall,
                what: "drop the call".into(),
                patch: "--- a\n+++ b\n".into(),
            },
            outcome: Outcome::Killed("basic: CHANGED: one record fewer".into()),
            build_secs: 32.0,
            judge_secs: 12.5,
            scenarios_run: 1,
            confirmed_figures: false,
            confirmed_diff: false,
            schema_overhead: None,
            killed_by: Some(KillKind::Diff),
            killed_in: None,
            code_digest: None,
        };
        write_saved(&data, &base, std::slice::from_ref(&result)).unwrap();
        let (read_base, read_results) = read_saved(&data).unwrap();
        assert_eq!(read_base.kernel_id, base.kernel_id);
        assert_eq!(read_base.scenarios, base.scenarios);
        assert_eq!(read_base.run_dir, base.run_dir);
        assert_eq!(read_results.len(), 1);
        assert_eq!(read_results[0].mutant.id, result.mutant.id);
        assert_eq!(read_results[0].outcome, result.outcome);

        let other = dir.path().join("results.json");
        std::fs::write(&other, b"[]").unwrap();
        let err = read_saved(&other).unwrap_err().to_string();
        assert!(
            err.contains("not the data a mutants report is written from"),
            "{err}"
        );
    }

    fn killed(file: &str, function: &str, kind: KillKind, scenario: &str) -> MutantResult {
        let mut r = MutantResult::new(&Mutant {
            id: format!("{file}:{function}"),
            file: file.into(),
            function: function.into(),
            line: 1,
            operator: Operator::DropCall,
            what: String::new(),
            patch: String::new(),
        });
        r.outcome = Outcome::Killed(format!("{scenario}: BROKEN"));
        r.killed_by = Some(kind);
        r.killed_in = Some(scenario.into());
        r
    }

    /// Scenarios that killed the same function by a rule come first (most
    /// recent first), then those of the same file, then the other rule
    /// killers by count; diff kills teach nothing; every scenario is still
    /// tried, once.
    #[test]
    fn schema_overhead_kills_settle_as_survivors() {
        let m = |id: &str| Mutant {
            id: id.into(),
            file: "kernel/events/ring_buffer.c".into(),
            function: "__perf_output_begin".into(),
            line: 1,
            operator: crate::mutate::Operator::DropCall,
            what: "drop".into(),
            patch: String::new(),
        };
        let killed = |id: &str, kind: KillKind| MutantResult {
            outcome: Outcome::Killed(format!("overhead: CHANGED: {id}")),
            killed_by: Some(kind),
            killed_in: Some("overhead".into()),
            ..MutantResult::new(&m(id))
        };
        let mut base = MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: "k".into(),
            release: "6.12.117".into(),
            scenarios: vec!["overhead".into()],
            accel: "tcg".into(),
            run_dir: PathBuf::from("/nonexistent"),
            phases: Phases {
                strategy: Strategy::Schemata,
                schema_kernel: Some("b153c3773b45".into()),
                built_alone: vec!["alone: a static local".into()],
                ..Phases::default()
            },
        };
        let fresh = vec![
            killed("schema", KillKind::Overhead),
            killed("alone", KillKind::Overhead),
            killed("rule", KillKind::Rule),
        ];
        let mut results = fresh.clone();
        settle_schema_overhead(&base, &mut results);
        assert_eq!(results[0].outcome, Outcome::Survived);
        assert_eq!(results[0].killed_by, None);
        assert!(results[0]
            .schema_overhead
            .as_deref()
            .unwrap()
            .contains("schema"));
        // Built alone, its figures are the mutation's; a rule kill stands.
        assert_eq!(results[1].killed_by, Some(KillKind::Overhead));
        assert_eq!(results[2].killed_by, Some(KillKind::Rule));
        // Kernels built one per mutant: every figure is the mutation's.
        base.phases.strategy = Strategy::BuildEach;
        let mut results = fresh.clone();
        settle_schema_overhead(&base, &mut results);
        assert_eq!(results[0].killed_by, Some(KillKind::Overhead));
    }

    #[test]
    fn kills_by_an_interruption_are_judged_again() {
        let m = Mutant {
            id: "x".into(),
            file: "kernel/bpf/dispatcher.c".into(),
            function: "f".into(),
            line: 1,
            operator: crate::mutate::Operator::DropCall,
            what: "drop".into(),
            patch: String::new(),
        };
        let kill = |why: &str| MutantResult {
            outcome: Outcome::Killed(why.into()),
            killed_by: Some(KillKind::Rule),
            killed_in: Some("concurrent-load".into()),
            ..MutantResult::new(&m)
        };
        let mut results = vec![
            kill("concurrent-load: BROKEN: the candidate did not complete where the baseline did: INTERRUPTED: interrupted by SIGINT/SIGTERM during the trial"),
            kill("basic: BROKEN: 1 violation(s) of rule(s) that hold on the baseline:"),
        ];
        unsettle_interrupted(&mut results);
        assert!(matches!(results[0].outcome, Outcome::NotJudged(_)));
        assert_eq!(results[0].killed_by, None);
        assert!(matches!(results[1].outcome, Outcome::Killed(_)));
    }

    #[test]
    fn scenarios_that_killed_nearby_mutants_go_first() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let chosen = judging_order(crate::scenario::load_all(&root).unwrap());
        let judged = vec![
            killed(
                "kernel/bpf/core.c",
                "bpf_ksym_del",
                KillKind::Rule,
                "subprogs",
            ),
            killed(
                "kernel/bpf/syscall.c",
                "bpf_prog_load",
                KillKind::Rule,
                "basic",
            ),
            killed(
                "kernel/bpf/core.c",
                "bpf_ksym_add",
                KillKind::Rule,
                "subprogs",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_ksymbol",
                KillKind::Rule,
                "kprobes",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Diff,
                "overflow",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Rule,
                "ksymbol-only",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Rule,
                "task-only",
            ),
        ];
        let m = &judged[6].mutant;
        let order: Vec<String> = learned_order(&chosen, m, &judged)
            .into_iter()
            .map(|s| s.name)
            .collect();
        let learned = ["task-only", "ksymbol-only", "kprobes", "subprogs", "basic"];
        assert_eq!(order[..5], learned);
        assert_eq!(order.len(), chosen.len());
        let rest: Vec<&String> = order[5..].iter().collect();
        let expected: Vec<&String> = chosen
            .iter()
            .map(|s| &s.name)
            .filter(|n| !learned.contains(&n.as_str()))
            .collect();
        assert_eq!(rest, expected);
    }
}
