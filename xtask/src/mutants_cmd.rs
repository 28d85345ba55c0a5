//! `mutants`: what kloop's suite would miss in the kernel's emission paths.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::mutate::Mutant;
use kloop::mutate::{self, Targets};
use kloop::run::mutants::{KillKind, MutantResult, MutantsBaseline, Outcome};
use kloop::run::suite::{self, EnvOptions};

use crate::{layout, start_trials, BuildArgs, MutantsArgs};

pub(crate) fn mutants(a: MutantsArgs) -> Result<ExitCode> {
    let layout = layout();
    start_trials();
    let base_req = BuildArgs {
        source: a.source.clone(),
        patches: Vec::new(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        fetch: a.fetch.clone(),
    }
    .request(&layout)?;
    let cache = kloop_kernels::KernelCache::default_location()?;
    let tree = kloop_kernels::build::source_tree(&cache, &base_req.source, &base_req.fetch)
        .context("unpacking the source")?;
    let targets = Targets::load(&layout.kernels().join("mutation-targets.toml"))?.only(&a.only);
    let generated = mutate::generate(&tree, &targets)?;
    for m in &generated.missing {
        eprintln!("kloop: not in this tree: {m}");
    }
    let mut chosen = shard_of(&a, choose(&a, &generated.mutants)?);
    let carried = resume(&a, &mut chosen)?;
    println!(
        "kloop: {} mutants of {} file(s) in {}; {}",
        generated.mutants.len(),
        targets.targets.len(),
        tree.display(),
        match &a.from {
            Some(run) => format!("the report of the run in {}", run.display()),
            None => format!("judging {}", chosen.len()),
        }
    );
    if a.list {
        for m in &chosen {
            println!("{}  {}", m.id, m.what);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let sink = Sink {
        report: a.report.clone(),
        generated: generated.mutants.len(),
        missing: generated.missing.clone(),
        notes: kloop::report::mutants::Notes::load(&layout.kernels().join("mutation-notes.toml"))
            .map_err(anyhow::Error::msg)?,
        command: command_line(&a),
    };
    sink.prepare()?;
    if !a.merge.is_empty() {
        return merge_shards(&a.merge, &sink);
    }
    if let Some(run_dir) = &a.from {
        return report_from(&layout, &base_req, run_dir, &sink);
    }
    judge(&a, &layout, &base_req, &chosen, &carried, &sink)
}

/// `--shard K/N`: this shard's part of `chosen`.
fn shard_of(a: &MutantsArgs, chosen: Vec<Mutant>) -> Vec<Mutant> {
    let Some(shard) = a.shard else {
        return chosen;
    };
    let ids: Vec<String> = chosen.iter().map(|m| m.id.clone()).collect();
    let (mine, _) = kloop::run::shard::select(&ids, shard, &Default::default());
    println!(
        "kloop: shard {shard}: {} of {} mutant(s)",
        mine.len(),
        ids.len()
    );
    mine.into_iter().map(|i| chosen[i].clone()).collect()
}

/// `--resume`: what the data beside the report decided stays decided
/// (with `--again-survivors`, but for its survivors); those are taken out
/// of `chosen` and returned.
fn resume(a: &MutantsArgs, chosen: &mut Vec<Mutant>) -> Result<Vec<MutantResult>> {
    let carried: Vec<MutantResult> = match (&a.report, a.resume) {
        (Some(report), true) => carried_over(report, chosen)?
            .into_iter()
            .filter(|r| !(a.again_survivors && r.outcome == Outcome::Survived))
            .collect(),
        _ => Vec::new(),
    };
    if !carried.is_empty() {
        chosen.retain(|m| !carried.iter().any(|r| r.mutant.id == m.id));
        println!(
            "kloop: resuming: {} mutant(s) decided in {}, {} left",
            carried.len(),
            kloop::run::mutants::data_beside(
                a.report.as_deref().expect("--resume requires --report")
            )
            .display(),
            chosen.len()
        );
    }
    Ok(carried)
}

/// `--from`: the report of an earlier run (its directory, or the data
/// beside its report) written again, without judging.
fn report_from(
    layout: &suite::Layout,
    base_req: &kloop_kernels::build::BuildRequest,
    run_dir: &std::path::Path,
    sink: &Sink,
) -> Result<ExitCode> {
    let (base, mut results) = kloop::run::mutants::read_run(layout, base_req, run_dir)
        .with_context(|| {
            format!(
                "reading the mutants run in {} (a run directory past the newest \
                 KLOOP_KEEP_RUNS, default 10, is removed when a run starts; a run \
                 given --report left its data beside the report, e.g. \
                 docs/mutation-score.json for docs/mutation-score.md: pass that \
                 to --from, or judge the mutants again without --from)",
                run_dir.display()
            )
        })?;
    kloop::run::mutants::settle_schema_overhead(&base, &mut results);
    kloop::run::mutants::unsettle_interrupted(&mut results);
    sink.write(&base, &results)?;
    Ok(sink.summarise(&base, &results, None))
}

/// `--merge`: the shards' data as one report. The shards must have judged
/// against one baseline (same source, same unmutated kernel, same
/// scenarios) and no mutant twice.
fn merge_shards(data: &[PathBuf], sink: &Sink) -> Result<ExitCode> {
    let mut base: Option<MutantsBaseline> = None;
    let mut all: Vec<MutantResult> = Vec::new();
    for path in data {
        let (b, results) = kloop::run::mutants::read_saved(path)
            .with_context(|| format!("reading the shard data {}", path.display()))?;
        if let Some(first) = &base {
            if (&first.source, &first.kernel_id, &first.scenarios)
                != (&b.source, &b.kernel_id, &b.scenarios)
            {
                anyhow::bail!(
                    "{} judged against {} ({}), the first shard against {} ({}): not one mutation run",
                    path.display(),
                    b.kernel_id,
                    b.source,
                    first.kernel_id,
                    first.source
                );
            }
        }
        for r in results {
            if all.iter().any(|x| x.mutant.id == r.mutant.id) {
                anyhow::bail!(
                    "mutant {} is in two shards ({} and an earlier one)",
                    r.mutant.id,
                    path.display()
                );
            }
            all.push(r);
        }
        base.get_or_insert(b);
    }
    // Shard order, as given: a report's "carried" count and its phases
    // are the first shard's (each shard built its own schema kernel).
    let base = base.context("no shard data given")?;
    println!(
        "kloop: merged {} shard(s): {} mutant(s)",
        data.len(),
        all.len()
    );
    sink.write(&base, &all)?;
    Ok(sink.summarise(&base, &all, None))
}

/// Judges `chosen`, writing the report after every mutant with the
/// `carried` results first.
fn judge(
    a: &MutantsArgs,
    layout: &suite::Layout,
    base_req: &kloop_kernels::build::BuildRequest,
    chosen: &[Mutant],
    carried: &[MutantResult],
    sink: &Sink,
) -> Result<ExitCode> {
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    let total = chosen.len() + carried.len();
    let started = std::time::Instant::now();
    // The carried-over results first, then this run's, in every write.
    let with_carried = |results: &[MutantResult]| -> Vec<MutantResult> {
        carried.iter().chain(results).cloned().collect()
    };
    let stretch = |base: &MutantsBaseline| -> MutantsBaseline {
        let mut base = base.clone();
        base.phases.carried = carried.len();
        base
    };
    let building = BuildLines::new(base_req.source.label());
    let (base, results) = kloop::run::mutants::judge_all(
        layout,
        base_req,
        chosen,
        &a.scenarios,
        &opts,
        a.jobs.unwrap_or_else(suite::default_jobs),
        if a.build_each {
            kloop::run::mutants::Strategy::BuildEach
        } else {
            kloop::run::mutants::Strategy::Schemata
        },
        &mut |what, e| building.event(what, e),
        &mut |base, results| {
            building.finish();
            let all = with_carried(results);
            if let Some(r) = all.last() {
                crate::ui::line(progress_line(r, &all, total, started));
            }
            if let Err(e) = sink.write(&stretch(base), &all) {
                eprintln!("kloop: {e:#}");
            }
        },
    )?;
    let results = with_carried(&results);
    let base = stretch(&base);
    sink.write(&base, &results)?;
    Ok(sink.summarise(&base, &results, Some(started.elapsed().as_secs_f64())))
}

/// The mutants to judge: those named with `--mutant` (each must exist),
/// else a balanced sample of at most `--max`.
fn choose(a: &MutantsArgs, generated: &[Mutant]) -> Result<Vec<Mutant>> {
    if a.mutants.is_empty() {
        return Ok(mutate::sample(generated, a.max));
    }
    for id in &a.mutants {
        if !generated.iter().any(|m| &m.id == id) {
            anyhow::bail!("no mutant {id} in this tree (see --list --max 1000)");
        }
    }
    Ok(generated
        .iter()
        .filter(|m| a.mutants.contains(&m.id))
        .cloned()
        .collect())
}

/// The results in the data beside `report` that decided a mutant among
/// `chosen` (not those left not judged); none when there is no data yet.
fn carried_over(report: &std::path::Path, chosen: &[Mutant]) -> Result<Vec<MutantResult>> {
    let data = kloop::run::mutants::data_beside(report);
    if !data.is_file() {
        return Ok(Vec::new());
    }
    let (base, mut results) = kloop::run::mutants::read_saved(&data)
        .with_context(|| format!("--resume reads {}", data.display()))?;
    kloop::run::mutants::settle_schema_overhead(&base, &mut results);
    kloop::run::mutants::unsettle_interrupted(&mut results);
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
fn command_line(a: &MutantsArgs) -> String {
    let mut command = format!("cargo xtask mutants --source {} --max {}", a.source, a.max);
    for f in &a.only {
        command.push_str(&format!(" --only {f}"));
    }
    for m in &a.mutants {
        command.push_str(&format!(" --mutant {m}"));
    }
    command
}

/// One decided mutant's line.
fn progress_line(
    r: &MutantResult,
    results: &[MutantResult],
    total: usize,
    started: std::time::Instant,
) -> String {
    format!(
        "[{}/{total} {:>5.0} s] {} ... {}{} (build {:.0} s, judge {:.0} s)",
        results.len(),
        started.elapsed().as_secs_f64(),
        r.mutant.id,
        r.outcome.label(),
        match &r.outcome {
            Outcome::Killed(why) | Outcome::BuildFailed(why) | Outcome::NotJudged(why) =>
                format!(": {why}"),
            Outcome::Survived | Outcome::CompilerEquivalent => format!(": {}", r.mutant.what),
            Outcome::Duplicate(of) => format!(" of {of}: {}", r.resolved(results).label()),
        },
        r.build_secs,
        r.judge_secs
    )
}

/// The live line of the kernel being built (the unmutated one, the
/// compile-alone phase, the schema kernel, a mutant built alone), ended
/// when the next begins or a mutant is decided.
struct BuildLines {
    source: String,
    current: std::cell::RefCell<Option<(String, crate::build_progress::BuildProgress)>>,
}

impl BuildLines {
    fn new(source: String) -> BuildLines {
        BuildLines {
            source,
            current: std::cell::RefCell::new(None),
        }
    }

    fn event(&self, what: &str, e: kloop_kernels::build::BuildEvent) {
        let mut current = self.current.borrow_mut();
        if current.as_ref().is_none_or(|(w, _)| w != what) {
            if let Some((_, done)) = current.take() {
                done.finish();
            }
            let label = match what {
                "unmutated" => format!("the unmutated {}", self.source),
                "compile-alone" => "every mutated file, compiled alone".to_string(),
                "schema" => "the schema kernel (every mutant behind its switch)".to_string(),
                _ => format!("mutant {what}"),
            };
            *current = Some((
                what.to_string(),
                crate::build_progress::BuildProgress::new(&label),
            ));
        }
        if let Some((_, progress)) = current.as_mut() {
            progress.event(e);
        }
    }

    fn finish(&self) {
        if let Some((_, done)) = self.current.borrow_mut().take() {
            done.finish();
        }
    }
}

/// Where the report and its data go, and what the report says besides the
/// results.
struct Sink {
    /// `--report`: the Markdown file (its data beside it); none: the run
    /// directory's `mutation-score.md` and `mutants.json`.
    report: Option<PathBuf>,
    generated: usize,
    missing: Vec<String>,
    notes: kloop::report::mutants::Notes,
    command: String,
}

impl Sink {
    /// Made before any mutant is judged: a report that cannot be written
    /// is found now, not after the run.
    fn prepare(&self) -> Result<()> {
        if let Some(parent) = self
            .report
            .as_deref()
            .and_then(std::path::Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}, where --report goes", parent.display()))?;
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
            Some(report) => kloop::run::mutants::data_beside(report),
            None => base.run_dir.join(kloop::run::mutants::RESULTS_FILE),
        }
    }

    /// The report and the data, rewritten after every mutant.
    fn write(&self, base: &MutantsBaseline, results: &[MutantResult]) -> Result<()> {
        let md = kloop::report::mutants::markdown(
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
            let json = base.run_dir.join(kloop::run::mutants::RESULTS_FILE);
            std::fs::write(&json, serde_json::to_vec_pretty(results)?)
                .with_context(|| format!("writing {}", json.display()))?;
        }
        if self.report.is_some() {
            kloop::run::mutants::write_saved(&self.data_path(base), base, results)?;
        }
        let report = self.report_path(base);
        std::fs::write(&report, md).with_context(|| format!("writing {}", report.display()))?;
        self.write_kcidb(base, results, &report);
        Ok(())
    }

    /// The run's KCIDB document beside the report (`<report>.kcidb.json`);
    /// a failure is told, not fatal.
    fn write_kcidb(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
        report: &std::path::Path,
    ) {
        let identity = kloop_kernels::KernelCache::default_location()
            .ok()
            .and_then(|c| kloop_kernels::build::lookup(&c, &base.kernel_id).ok())
            .map(|k| k.record.source_identity)
            .unwrap_or_else(|| base.source.clone());
        let ctx = kloop::report::kcidb::RunContext {
            kloop_commit: crate::vm_test_cmd::kloop_commit(&crate::layout().root),
            run: base
                .run_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let doc = kloop::report::kcidb::mutation_run_document(base, results, &identity, &ctx);
        let path = report.with_extension("kcidb.json");
        let written = serde_json::to_string(&doc)
            .map_err(std::io::Error::other)
            .and_then(|t| std::fs::write(&path, t));
        if let Err(e) = written {
            eprintln!("kloop: writing {}: {e}", path.display());
        }
    }

    fn summarise(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
        secs: Option<f64>,
    ) -> ExitCode {
        summarise(
            results,
            &self.notes,
            &self.report_path(base),
            &self.data_path(base),
            secs,
        )
    }
}

/// Prints the totals and the survivors without a note; the exit code:
/// 130 when interrupted, 1 while a survivor has no note.
fn summarise(
    results: &[kloop::run::mutants::MutantResult],
    notes: &kloop::report::mutants::Notes,
    report: &std::path::Path,
    data: &std::path::Path,
    secs: Option<f64>,
) -> ExitCode {
    let killed = results
        .iter()
        .filter(|r| matches!(r.resolved(results), Outcome::Killed(_)))
        .count();
    let survived: Vec<_> = results
        .iter()
        .filter(|r| *r.resolved(results) == Outcome::Survived)
        .collect();
    let (same_code, dups) = kloop::run::mutants::decided_by_code(results);
    println!(
        "kloop: {killed} killed, {} survived, {same_code} the unmutated object code, {dups} duplicates, {} failed to build, of {}{}; report {}; data {}",
        survived.len(),
        results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::BuildFailed(_)))
            .count(),
        results.len(),
        secs.map_or(String::new(), |s| format!(" in {s:.0} s")),
        report.display(),
        data.display()
    );
    // A survivor is fine once someone looked at it: argued equivalent, or
    // left with a reason.
    let unexplained: Vec<&str> = survived
        .iter()
        .filter(|r| r.outcome == Outcome::Survived)
        .filter(|r| !notes.notes.iter().any(|n| n.mutant == r.mutant.id))
        .map(|r| r.mutant.id.as_str())
        .collect();
    if !unexplained.is_empty() {
        println!(
            "kloop: survivors without a note in kernels/mutation-notes.toml: {}",
            unexplained.join(", ")
        );
    }
    if kloop::run::signals::interrupted() {
        println!("kloop: interrupted; the report holds the mutants judged so far");
        return ExitCode::from(130);
    }
    if unexplained.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
