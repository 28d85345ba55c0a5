//! `mutants` as one entry point: which mutants (generated from the tree,
//! sampled or named, a shard's part, less those `--resume` carries over:
//! [`crate::mutants::choose`]), judging them
//! ([`crate::mutants::judge_all`]), and the report with its data and KCIDB
//! document rewritten after every mutant ([`crate::mutants::sink`]); or,
//! without judging, an earlier run's report written again (`--from`) or the
//! shards' data merged (`--merge`).
//!
//! What happens along the way reaches the caller as [`Event`]s; the
//! totals come back as [`Totals`].

use std::path::PathBuf;

use kloop_kernels::build::BuildRequest;
use kloop_mutate::Mutant;

use crate::mutants::report::Notes;
use crate::mutants::sink::{self, Sink};
use crate::mutants::{
    choose, decided_by_code, judge_all, CommandError, MutantResult, MutantsBaseline, Outcome,
    Strategy,
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
pub fn choose(layout: &Layout, opts: &MutantsOptions) -> Result<Chosen, CommandError> {
    let cache = kloop_kernels::KernelCache::default_location()?;
    let tree = kloop_kernels::build::source_tree(&cache, &opts.base.source, &opts.base.fetch)
        .map_err(CommandError::Source)?;
    let targets =
        choose::load_targets(&layout.kernels().join("mutation-targets.toml"))?.only(&opts.only);
    let generated = choose::generate(&tree, &targets)?;
    let mut notes = Vec::new();
    let mut mutants = choose::named_or_sampled(&opts.mutants, opts.max, &generated.mutants)?;
    if let Some(shard) = opts.shard {
        let (mine, note) = choose::shard_of(mutants, shard);
        notes.push(note);
        mutants = mine;
    }
    let carried = match (&opts.report, opts.resume) {
        (Some(report), true) => {
            choose::resumed(report, opts.again_survivors, &mut mutants, &mut notes)?
        }
        _ => Vec::new(),
    };
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

/// Runs what `opts` asks for on `chosen`: the report of `--from`, the
/// merge of `--merge`, or the judging of every chosen mutant.
pub fn run(
    layout: &Layout,
    opts: &MutantsOptions,
    chosen: Chosen,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Totals, CommandError> {
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
        let (base, all) = sink::merge_shards(&opts.merge)?;
        on(Event::Note(format!(
            "merged {} shard(s): {} mutant(s)",
            opts.merge.len(),
            all.len()
        )));
        sink.write(&base, &all)?;
        return Ok(totals(&sink, &base, &all, None));
    }
    if let Some(run_dir) = &opts.from {
        let (base, results) = sink::from_run(layout, &opts.base, run_dir)?;
        sink.write(&base, &results)?;
        return Ok(totals(&sink, &base, &results, None));
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
) -> Result<Totals, CommandError> {
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
    Ok(totals(
        sink,
        &base,
        &results,
        Some(started.elapsed().as_secs_f64()),
    ))
}

/// The run's [`Totals`] from what `sink` wrote.
fn totals(
    sink: &Sink<'_>,
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
            .filter(|r| !sink.notes.notes.iter().any(|n| n.mutant == r.mutant.id))
            .map(|r| r.mutant.id.clone())
            .collect(),
        secs,
        report: sink.report_path(base),
        data: sink.data_path(base),
    }
}
