//! What a mutants run decided, and the files that keep it: each
//! mutant's [`Outcome`] and [`MutantResult`], the run's
//! [`MutantsBaseline`], the data beside a report ([`SavedRun`]) and a
//! run directory read back for `--from`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};
use serde::{Deserialize, Serialize};

use crate::judge::ab::{self};
use crate::run::suite;
use kloop_mutate::Mutant;

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
    #[error(transparent)]
    Io(#[from] PathIo),
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
        .at("writing", path)
        .map_err(MutantsError::from)
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

/// How the mutants' kernels are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Each mutant's file compiled alone first (Trivial Compiler
    /// Equivalence, duplicates and build failures decided with no kernel
    /// build), then every mutant left in one schema kernel
    /// ([`kloop_mutate::schema`]), switched per trial; a mutant the
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

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_mutate::Operator;

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

    #[test]
    fn schema_overhead_kills_settle_as_survivors() {
        let m = |id: &str| Mutant {
            id: id.into(),
            file: "kernel/events/ring_buffer.c".into(),
            function: "__perf_output_begin".into(),
            line: 1,
            operator: kloop_mutate::Operator::DropCall,
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
            operator: kloop_mutate::Operator::DropCall,
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
}
