//! `mutants`: what kloop's suite would miss in the kernel's emission paths.

use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::mutate::{self, Targets};
use kloop::run::mutants::Outcome;
use kloop::run::suite::{self, EnvOptions};

use crate::{layout, start_trials, BuildArgs, MutantsArgs};

pub(crate) fn mutants(a: MutantsArgs) -> Result<ExitCode> {
    let layout = layout();
    start_trials();
    let build = BuildArgs {
        source: a.source.clone(),
        patches: Vec::new(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        fetch: a.fetch.clone(),
    };
    let base_req = build.request(&layout)?;
    let cache = kloop_kernels::KernelCache::default_location()?;
    let tree = kloop_kernels::build::source_tree(&cache, &base_req.source, &base_req.fetch)
        .context("unpacking the source")?;
    let targets = Targets::load(&layout.kernels().join("mutation-targets.toml"))?.only(&a.only);
    let generated = mutate::generate(&tree, &targets)?;
    for m in &generated.missing {
        eprintln!("kloop: not in this tree: {m}");
    }
    let chosen = if a.mutants.is_empty() {
        mutate::sample(&generated.mutants, a.max)
    } else {
        let picked: Vec<_> = generated
            .mutants
            .iter()
            .filter(|m| a.mutants.contains(&m.id))
            .cloned()
            .collect();
        for id in &a.mutants {
            if !picked.iter().any(|m| &m.id == id) {
                anyhow::bail!("no mutant {id} in this tree (see --list --max 1000)");
            }
        }
        picked
    };
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
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let total = chosen.len();
    let started = std::time::Instant::now();
    let notes = kloop::report::mutants::Notes::load(&layout.kernels().join("mutation-notes.toml"))
        .map_err(anyhow::Error::msg)?;
    let mut command = format!("cargo xtask mutants --source {} --max {}", a.source, a.max);
    for f in &a.only {
        command.push_str(&format!(" --only {f}"));
    }
    for m in &a.mutants {
        command.push_str(&format!(" --mutant {m}"));
    }
    let report_path = |base: &kloop::run::mutants::MutantsBaseline| {
        a.report
            .clone()
            .unwrap_or_else(|| base.run_dir.join("mutation-score.md"))
    };
    // The data that outlives the run directory: beside a --report, else
    // the run directory's own mutants.json.
    let data_path = |base: &kloop::run::mutants::MutantsBaseline| match &a.report {
        Some(report) => kloop::run::mutants::data_beside(report),
        None => base.run_dir.join(kloop::run::mutants::RESULTS_FILE),
    };
    // Made before any mutant is judged: a report that cannot be written
    // is found now, not after the run.
    if let Some(parent) = a
        .report
        .as_deref()
        .and_then(std::path::Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}, where --report goes", parent.display()))?;
    }
    // The report and the data, rewritten after every mutant.
    let write = |base: &kloop::run::mutants::MutantsBaseline,
                 results: &[kloop::run::mutants::MutantResult]|
     -> Result<()> {
        let md = kloop::report::mutants::markdown(
            base,
            results,
            generated.mutants.len(),
            &generated.missing,
            &notes,
            &command,
        );
        // A run directory is there while its run judges; --from a
        // report's data file may name one long pruned.
        if base.run_dir.is_dir() {
            let json = base.run_dir.join(kloop::run::mutants::RESULTS_FILE);
            std::fs::write(&json, serde_json::to_vec_pretty(results)?)
                .with_context(|| format!("writing {}", json.display()))?;
        }
        if a.report.is_some() {
            kloop::run::mutants::write_saved(&data_path(base), base, results)?;
        }
        let report = report_path(base);
        std::fs::write(&report, md).with_context(|| format!("writing {}", report.display()))
    };
    if let Some(run_dir) = &a.from {
        let (base, results) = kloop::run::mutants::read_run(&layout, &base_req, run_dir)
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
        write(&base, &results)?;
        return Ok(summarise(
            &results,
            &notes,
            &report_path(&base),
            &data_path(&base),
            None,
        ));
    }
    // The live line of the kernel being built (the unmutated one, then
    // each mutant's), ended when its mutant is decided.
    let building: std::cell::RefCell<Option<(String, crate::build_progress::BuildProgress)>> =
        std::cell::RefCell::new(None);
    let (base, results) = kloop::run::mutants::judge_all(
        &layout,
        &base_req,
        &chosen,
        &a.scenarios,
        &opts,
        jobs,
        if a.build_each {
            kloop::run::mutants::Strategy::BuildEach
        } else {
            kloop::run::mutants::Strategy::Schemata
        },
        &mut |what, e| {
            let mut current = building.borrow_mut();
            if current.as_ref().is_none_or(|(w, _)| w != what) {
                if let Some((_, done)) = current.take() {
                    done.finish();
                }
                let label = if what == "unmutated" {
                    format!("the unmutated {}", base_req.source.label())
                } else if what == "compile-alone" {
                    "every mutated file, compiled alone".to_string()
                } else if what == "schema" {
                    "the schema kernel (every mutant behind its switch)".to_string()
                } else {
                    format!("mutant {what}")
                };
                *current = Some((
                    what.to_string(),
                    crate::build_progress::BuildProgress::new(&label),
                ));
            }
            if let Some((_, progress)) = current.as_mut() {
                progress.event(e);
            }
        },
        &mut |base, results| {
            if let Some((_, done)) = building.borrow_mut().take() {
                done.finish();
            }
            let Some(r) = results.last() else { return };
            crate::ui::line(format!(
                "[{}/{total} {:>5.0} s] {} ... {}{} (build {:.0} s, judge {:.0} s)",
                results.len(),
                started.elapsed().as_secs_f64(),
                r.mutant.id,
                r.outcome.label(),
                match &r.outcome {
                    Outcome::Killed(why) | Outcome::BuildFailed(why) | Outcome::NotJudged(why) =>
                        format!(": {why}"),
                    Outcome::Survived | Outcome::CompilerEquivalent =>
                        format!(": {}", r.mutant.what),
                    Outcome::Duplicate(of) => format!(" of {of}: {}", r.resolved(results).label()),
                },
                r.build_secs,
                r.judge_secs
            ));
            if let Err(e) = write(base, results) {
                eprintln!("kloop: {e:#}");
            }
        },
    )?;
    write(&base, &results)?;
    Ok(summarise(
        &results,
        &notes,
        &report_path(&base),
        &data_path(&base),
        Some(started.elapsed().as_secs_f64()),
    ))
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
