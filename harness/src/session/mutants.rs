//! `mutants` as one entry point: which mutants (generated from the tree,
//! sampled or named, a shard's part, less those `--resume` carries over),
//! judging them ([`crate::run::mutants::judge_all`]), and the report with its data and
//! KCIDB document rewritten after every mutant; or, without judging, an
//! earlier run's report written again (`--from`) or the shards' data
//! merged (`--merge`).
//!
//! What happens along the way reaches the caller as [`Event`]s; the
//! totals come back as [`Totals`].

use std::path::{Path, PathBuf};

use kloop_kernels::build::BuildRequest;
use kloop_path_io::{PathIo, PathIoExt};

use crate::mutate::{self, Mutant, Targets};
use crate::report::mutants::Notes;
use crate::run::mutants::{
    data_beside, decided_by_code, judge_all, read_run, read_saved, settle_schema_overhead,
    unsettle_interrupted, write_saved, KillKind, MutantResult, MutantsBaseline, MutantsError,
    Outcome, Strategy, RESULTS_FILE,
};
use crate::run::suite::EnvOptions;
use crate::workspace::Layout;

/// What `mutants` is asked to do.
#[derive(Debug, Clone)]
pub struct MutantsOptions {
    /// The unmutated kernel's build.
    pub base: BuildRequest,
    /// `--source` as the user gave it, for the command line the report
    /// quotes.
    pub source_arg: String,
    /// `--only`: the target files kept (suffixes); empty: all.
    pub only: Vec<String>,
    /// `--mutant`: these mutants, each of which must exist; empty: a
    /// balanced sample of at most `max`.
    pub mutants: Vec<String>,
    pub max: usize,
    pub shard: Option<crate::run::shard::Shard>,
    /// `--resume` (with `report`): what the data beside the report decided
    /// stays decided, but for its survivors with `again_survivors`.
    pub resume: bool,
    pub again_survivors: bool,
    /// `--report`: the Markdown file, its data beside it; none: the run
    /// directory's `mutation-score.md` and `mutants.json`.
    pub report: Option<PathBuf>,
    /// `--from`: write an earlier run's report again, judging nothing.
    pub from: Option<PathBuf>,
    /// `--merge`: the shards' data as one report.
    pub merge: Vec<PathBuf>,
    pub scenarios: Vec<String>,
    pub env: EnvOptions,
    pub jobs: usize,
    pub strategy: Strategy,
}

/// What the caller hears.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line for the person running kloop, for reading only.
    Note(String),
    /// A kernel build moved on: `what` is `unmutated`, `compile-alone`,
    /// `schema` or a mutant's id.
    Build(&'a str, kloop_kernels::build::BuildEvent),
    /// A mutant was decided: the last of `results` (the carried-over ones
    /// first), of `total`.
    Decided {
        results: &'a [MutantResult],
        total: usize,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Mutants(#[from] Box<MutantsError>),
    #[error(transparent)]
    Mutate(#[from] crate::mutate::MutateError),
    #[error("unpacking the source: {0}")]
    Source(#[source] kloop_kernels::build::BuildError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Notes(#[from] crate::report::mutants::NotesError),
    #[error("no mutant {0} in this tree (see --list --max 1000)")]
    NoSuchMutant(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("reading the mutants run in {path}: {source} (a run directory past the newest KLOOP_KEEP_RUNS, default 10, is removed when a run starts; a run given --report left its data beside the report, e.g. docs/mutation-score.json for docs/mutation-score.md: pass that to --from, or judge the mutants again without --from)")]
    From {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("--resume reads {path}: {source}")]
    Resume {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("reading the shard data {path}: {source}")]
    Shard {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("{path} judged against {kernel} ({source_id}), the first shard against {first_kernel} ({first_source}): not one mutation run")]
    ShardMismatch {
        path: PathBuf,
        kernel: String,
        source_id: String,
        first_kernel: String,
        first_source: String,
    },
    #[error("mutant {mutant} is in two shards ({path} and an earlier one)")]
    ShardTwice { mutant: String, path: PathBuf },
    #[error("no shard data given")]
    NoShards,
}

/// The mutants of the tree and those chosen for this run.
#[derive(Debug)]
pub struct Chosen {
    pub tree: PathBuf,
    /// How many the tree has, and the target files they come from.
    pub generated: usize,
    pub target_files: usize,
    /// `file: function` the targets name and the tree lacks.
    pub missing: Vec<String>,
    /// To judge now.
    pub mutants: Vec<Mutant>,
    /// Decided by an earlier run (`--resume`), written first.
    pub carried: Vec<MutantResult>,
    /// What the choice was, for the user (the shard, the resumed data).
    pub notes: Vec<String>,
}

/// Generates the tree's mutants and chooses this run's.
pub fn choose(layout: &Layout, opts: &MutantsOptions) -> Result<Chosen, SessionError> {
    let cache = kloop_kernels::KernelCache::default_location()?;
    let tree = kloop_kernels::build::source_tree(&cache, &opts.base.source, &opts.base.fetch)
        .map_err(SessionError::Source)?;
    let targets = Targets::load(&layout.kernels().join("mutation-targets.toml"))?.only(&opts.only);
    let generated = mutate::generate(&tree, &targets)?;
    let mut notes = Vec::new();
    let mut mutants = named_or_sampled(opts, &generated.mutants)?;
    if let Some(shard) = opts.shard {
        let ids: Vec<String> = mutants.iter().map(|m| m.id.clone()).collect();
        let (mine, _) = crate::run::shard::select(&ids, shard, &Default::default());
        notes.push(format!(
            "shard {shard}: {} of {} mutant(s)",
            mine.len(),
            ids.len()
        ));
        mutants = mine.into_iter().map(|i| mutants[i].clone()).collect();
    }
    let carried = resumed(opts, &mut mutants, &mut notes)?;
    Ok(Chosen {
        tree,
        generated: generated.mutants.len(),
        target_files: targets.targets.len(),
        missing: generated.missing,
        mutants,
        carried,
        notes,
    })
}

/// Those named with `--mutant` (each must exist), else a balanced sample
/// of at most `--max`.
fn named_or_sampled(
    opts: &MutantsOptions,
    generated: &[Mutant],
) -> Result<Vec<Mutant>, SessionError> {
    if opts.mutants.is_empty() {
        return Ok(mutate::sample(generated, opts.max));
    }
    if let Some(id) = opts
        .mutants
        .iter()
        .find(|id| !generated.iter().any(|m| &m.id == *id))
    {
        return Err(SessionError::NoSuchMutant(id.clone()));
    }
    Ok(generated
        .iter()
        .filter(|m| opts.mutants.contains(&m.id))
        .cloned()
        .collect())
}

/// `--resume`: the results in the data beside the report that decided a
/// mutant among `chosen` are taken out of it and returned.
fn resumed(
    opts: &MutantsOptions,
    chosen: &mut Vec<Mutant>,
    notes: &mut Vec<String>,
) -> Result<Vec<MutantResult>, SessionError> {
    let (Some(report), true) = (&opts.report, opts.resume) else {
        return Ok(Vec::new());
    };
    let carried: Vec<MutantResult> = carried_over(report, chosen)?
        .into_iter()
        .filter(|r| !(opts.again_survivors && r.outcome == Outcome::Survived))
        .collect();
    if !carried.is_empty() {
        chosen.retain(|m| !carried.iter().any(|r| r.mutant.id == m.id));
        notes.push(format!(
            "resuming: {} mutant(s) decided in {}, {} left",
            carried.len(),
            data_beside(report).display(),
            chosen.len()
        ));
    }
    Ok(carried)
}

/// The results in the data beside `report` that decided a mutant among
/// `chosen` (not those left not judged); none when there is no data yet.
fn carried_over(report: &Path, chosen: &[Mutant]) -> Result<Vec<MutantResult>, SessionError> {
    let data = data_beside(report);
    if !data.is_file() {
        return Ok(Vec::new());
    }
    let (base, mut results) = read_saved(&data).map_err(|source| SessionError::Resume {
        path: data.clone(),
        source: Box::new(source),
    })?;
    settle_schema_overhead(&base, &mut results);
    unsettle_interrupted(&mut results);
    Ok(results
        .into_iter()
        .filter(|r| !matches!(r.outcome, Outcome::NotJudged(_)))
        // A kill by the diff only from before diffs were confirmed may be
        // a scenario's own noise: judged again.
        .filter(|r| r.killed_by != Some(KillKind::Diff) || r.confirmed_diff)
        .filter(|r| {
            chosen
                .iter()
                .any(|m| m.id == r.mutant.id && m.patch == r.mutant.patch)
        })
        .collect())
}

/// The command line the report names as its source.
pub fn command_line(opts: &MutantsOptions) -> String {
    let mut command = format!(
        "cargo xtask mutants --source {} --max {}",
        opts.source_arg, opts.max
    );
    for f in &opts.only {
        command.push_str(&format!(" --only {f}"));
    }
    for m in &opts.mutants {
        command.push_str(&format!(" --mutant {m}"));
    }
    command
}

/// The run's counts, and where its report and data are.
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    pub killed: usize,
    pub survived: usize,
    /// Compiled to the unmutated object code.
    pub same_code: usize,
    pub duplicates: usize,
    pub build_failed: usize,
    pub judged: usize,
    /// The survivors without a note in `kernels/mutation-notes.toml`: the
    /// run fails while there is one.
    pub unexplained: Vec<String>,
    pub secs: Option<f64>,
    pub report: PathBuf,
    pub data: PathBuf,
}

/// Where the report and its data go, and what the report says besides the
/// results.
struct Sink<'a> {
    root: &'a Path,
    report: Option<PathBuf>,
    generated: usize,
    missing: Vec<String>,
    notes: Notes,
    command: String,
}

/// Runs what `opts` asks for on `chosen`: the report of `--from`, the
/// merge of `--merge`, or the judging of every chosen mutant.
pub fn run(
    layout: &Layout,
    opts: &MutantsOptions,
    chosen: Chosen,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Totals, SessionError> {
    let sink = Sink {
        root: &layout.root,
        report: opts.report.clone(),
        generated: chosen.generated,
        missing: chosen.missing.clone(),
        notes: Notes::load(&layout.kernels().join("mutation-notes.toml"))?,
        command: command_line(opts),
    };
    sink.prepare()?;
    if !opts.merge.is_empty() {
        let (base, all) = merge_shards(&opts.merge)?;
        on(Event::Note(format!(
            "merged {} shard(s): {} mutant(s)",
            opts.merge.len(),
            all.len()
        )));
        sink.write(&base, &all)?;
        return Ok(sink.totals(&base, &all, None));
    }
    if let Some(run_dir) = &opts.from {
        let (base, mut results) =
            read_run(layout, &opts.base, run_dir).map_err(|source| SessionError::From {
                path: run_dir.clone(),
                source: Box::new(source),
            })?;
        settle_schema_overhead(&base, &mut results);
        unsettle_interrupted(&mut results);
        sink.write(&base, &results)?;
        return Ok(sink.totals(&base, &results, None));
    }
    judge(layout, opts, &chosen, &sink, on)
}

/// Judges the chosen mutants, writing the report after every one with the
/// carried results first.
fn judge(
    layout: &Layout,
    opts: &MutantsOptions,
    chosen: &Chosen,
    sink: &Sink<'_>,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Totals, SessionError> {
    let carried = &chosen.carried;
    let total = chosen.mutants.len() + carried.len();
    let started = std::time::Instant::now();
    let with_carried = |results: &[MutantResult]| -> Vec<MutantResult> {
        carried.iter().chain(results).cloned().collect()
    };
    let stretch = |base: &MutantsBaseline| -> MutantsBaseline {
        let mut base = base.clone();
        base.phases.carried = carried.len();
        base
    };
    // Both callbacks tell the caller; judge_all calls one at a time.
    let on = std::cell::RefCell::new(on);
    let (base, results) = judge_all(
        layout,
        &opts.base,
        &chosen.mutants,
        &opts.scenarios,
        &opts.env,
        opts.jobs,
        opts.strategy,
        &mut |what, e| (on.borrow_mut())(Event::Build(what, e)),
        &mut |base, results| {
            let all = with_carried(results);
            (on.borrow_mut())(Event::Decided {
                results: &all,
                total,
            });
            // Told and carried on: the next mutant's write tries again,
            // and the last one's failure ends the run.
            if let Err(e) = sink.write(&stretch(base), &all) {
                (on.borrow_mut())(Event::Note(e.to_string()));
            }
        },
    )
    .map_err(Box::new)?;
    let results = with_carried(&results);
    let base = stretch(&base);
    sink.write(&base, &results)?;
    Ok(sink.totals(&base, &results, Some(started.elapsed().as_secs_f64())))
}

/// `--merge`: the shards' data as one. The shards must have judged against
/// one baseline (same source, same unmutated kernel, same scenarios) and
/// no mutant twice; shard order, as given: a report's "carried" count and
/// its phases are the first shard's (each shard built its own schema
/// kernel).
fn merge_shards(data: &[PathBuf]) -> Result<(MutantsBaseline, Vec<MutantResult>), SessionError> {
    let mut base: Option<MutantsBaseline> = None;
    let mut all: Vec<MutantResult> = Vec::new();
    for path in data {
        let (b, results) = read_saved(path).map_err(|source| SessionError::Shard {
            path: path.clone(),
            source: Box::new(source),
        })?;
        if let Some(first) = &base {
            if (&first.source, &first.kernel_id, &first.scenarios)
                != (&b.source, &b.kernel_id, &b.scenarios)
            {
                return Err(SessionError::ShardMismatch {
                    path: path.clone(),
                    kernel: b.kernel_id,
                    source_id: b.source,
                    first_kernel: first.kernel_id.clone(),
                    first_source: first.source.clone(),
                });
            }
        }
        for r in results {
            if all.iter().any(|x| x.mutant.id == r.mutant.id) {
                return Err(SessionError::ShardTwice {
                    mutant: r.mutant.id,
                    path: path.clone(),
                });
            }
            all.push(r);
        }
        base.get_or_insert(b);
    }
    Ok((base.ok_or(SessionError::NoShards)?, all))
}

impl Sink<'_> {
    /// Made before any mutant is judged: a report that cannot be written
    /// is found now, not after the run.
    fn prepare(&self) -> Result<(), SessionError> {
        if let Some(parent) = self
            .report
            .as_deref()
            .and_then(Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).at("creating (where --report goes)", parent)?;
        }
        Ok(())
    }

    fn report_path(&self, base: &MutantsBaseline) -> PathBuf {
        self.report
            .clone()
            .unwrap_or_else(|| base.run_dir.join("mutation-score.md"))
    }

    /// The data that outlives the run directory: beside a --report, else
    /// the run directory's own mutants.json.
    fn data_path(&self, base: &MutantsBaseline) -> PathBuf {
        match &self.report {
            Some(report) => data_beside(report),
            None => base.run_dir.join(RESULTS_FILE),
        }
    }

    /// The report, the data and the KCIDB document, rewritten after every
    /// mutant.
    fn write(&self, base: &MutantsBaseline, results: &[MutantResult]) -> Result<(), SessionError> {
        let md = crate::report::mutants::markdown(
            base,
            results,
            self.generated,
            &self.missing,
            &self.notes,
            &self.command,
        );
        // A run directory is there while its run judges; --from a
        // report's data file may name one long pruned.
        if base.run_dir.is_dir() {
            let json = base.run_dir.join(RESULTS_FILE);
            let text = serde_json::to_vec_pretty(results).expect("results serialise");
            std::fs::write(&json, text).at("writing", &json)?;
        }
        if self.report.is_some() {
            write_saved(&self.data_path(base), base, results).map_err(Box::new)?;
        }
        let report = self.report_path(base);
        std::fs::write(&report, md).at("writing", &report)?;
        self.write_kcidb(base, results, &report)
    }

    /// The run's KCIDB document beside the report (`<report>.kcidb.json`).
    fn write_kcidb(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
        report: &Path,
    ) -> Result<(), SessionError> {
        let identity = kloop_kernels::KernelCache::default_location()
            .ok()
            .and_then(|c| kloop_kernels::build::lookup(&c, &base.kernel_id).ok())
            .map(|k| k.record.source_identity)
            .unwrap_or_else(|| base.source.clone());
        let ctx = crate::report::kcidb::RunContext::of_run(self.root, &base.run_dir);
        let doc = crate::report::kcidb::mutation_run_document(base, results, &identity, &ctx);
        let path = report.with_extension("kcidb.json");
        let text = serde_json::to_string(&doc).expect("a document serialises");
        std::fs::write(&path, text).at("writing", &path)?;
        Ok(())
    }

    fn totals(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
        secs: Option<f64>,
    ) -> Totals {
        let resolved = |r: &MutantResult| r.resolved(results).clone();
        let survivors: Vec<&MutantResult> = results
            .iter()
            .filter(|r| resolved(r) == Outcome::Survived)
            .collect();
        let (same_code, duplicates) = decided_by_code(results);
        Totals {
            killed: results
                .iter()
                .filter(|r| matches!(resolved(r), Outcome::Killed(_)))
                .count(),
            survived: survivors.len(),
            same_code,
            duplicates,
            build_failed: results
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::BuildFailed(_)))
                .count(),
            judged: results.len(),
            // A survivor is fine once someone looked at it: argued
            // equivalent, or left with a reason.
            unexplained: survivors
                .iter()
                .filter(|r| r.outcome == Outcome::Survived)
                .filter(|r| !self.notes.notes.iter().any(|n| n.mutant == r.mutant.id))
                .map(|r| r.mutant.id.clone())
                .collect(),
            secs,
            report: self.report_path(base),
            data: self.data_path(base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(kernel_id: &str, run_dir: &Path) -> MutantsBaseline {
        MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: kernel_id.into(),
            release: "6.12.57".into(),
            scenarios: vec!["basic".into()],
            accel: "tcg".into(),
            run_dir: run_dir.to_path_buf(),
            phases: Default::default(),
        }
    }

    fn result(id: &str, outcome: Outcome) -> MutantResult {
        MutantResult {
            outcome,
            ..MutantResult::new(&Mutant {
                id: id.into(),
                file: "kernel/events/core.c".into(),
                function: "perf_event_ksymbol".into(),
                line: 1,
                operator: crate::mutate::Operator::DropCall,
                what: "drop the call".into(),
                patch: format!("patch of {id}"),
            })
        }
    }

    /// Shards of one run merge in the order given; shards judged against
    /// another unmutated kernel, or holding one mutant twice, are refused
    /// naming the shard.
    #[test]
    fn merging_shards_checks_they_are_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let shard = |name: &str, kernel: &str, ids: &[&str]| {
            let path = dir.path().join(name);
            let results: Vec<_> = ids.iter().map(|i| result(i, Outcome::Survived)).collect();
            write_saved(&path, &base(kernel, dir.path()), &results).unwrap();
            path
        };
        let a = shard("a.json", "k1", &["m1", "m2"]);
        let b = shard("b.json", "k1", &["m3"]);
        let (merged_base, all) = merge_shards(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(merged_base.kernel_id, "k1");
        let ids: Vec<_> = all.iter().map(|r| r.mutant.id.as_str()).collect();
        assert_eq!(ids, ["m1", "m2", "m3"]);

        let other = shard("c.json", "k2", &["m4"]);
        let err = merge_shards(&[a.clone(), other]).unwrap_err();
        assert!(
            matches!(err, SessionError::ShardMismatch { ref path, .. } if path.ends_with("c.json")),
            "{err}"
        );
        let twice = shard("d.json", "k1", &["m2"]);
        let err = merge_shards(&[a, twice]).unwrap_err();
        assert!(
            matches!(err, SessionError::ShardTwice { ref mutant, .. } if mutant == "m2"),
            "{err}"
        );
        assert!(matches!(
            merge_shards(&[]).unwrap_err(),
            SessionError::NoShards
        ));
    }

    /// `--resume` carries what the data beside the report decided for the
    /// chosen mutants with the same patch: not a mutant left not judged,
    /// not a kill by an unconfirmed diff, not one whose patch changed.
    #[test]
    fn resume_carries_only_what_was_decided_for_the_same_patch() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("score.md");
        let mut unconfirmed = result("diff", Outcome::Killed("basic: CHANGED".into()));
        unconfirmed.killed_by = Some(KillKind::Diff);
        let mut by_rule = result("rule", Outcome::Killed("basic: BROKEN".into()));
        by_rule.killed_by = Some(KillKind::Rule);
        let saved = vec![
            result("survived", Outcome::Survived),
            result("not-judged", Outcome::NotJudged("interrupted".into())),
            unconfirmed,
            by_rule,
            result("patch-changed", Outcome::Survived),
        ];
        write_saved(&data_beside(&report), &base("k1", dir.path()), &saved).unwrap();
        let chosen: Vec<Mutant> = saved
            .iter()
            .map(|r| {
                let mut m = r.mutant.clone();
                if m.id == "patch-changed" {
                    m.patch = "another patch".into();
                }
                m
            })
            .collect();
        let carried = carried_over(&report, &chosen).unwrap();
        let ids: Vec<_> = carried.iter().map(|r| r.mutant.id.as_str()).collect();
        assert_eq!(ids, ["survived", "rule"]);
        assert!(carried_over(&dir.path().join("none.md"), &chosen)
            .unwrap()
            .is_empty());
    }
}
