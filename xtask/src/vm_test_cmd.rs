//! `vm-test`, `bless` (through `vm-test`) and `bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report::{self, Summary};
use kloop::run::bench;
use kloop::run::suite::{self, EnvOptions, Selection};

use crate::*;

pub(crate) fn bench(a: BenchArgs) -> Result<ExitCode> {
    if let Some(gib) = a.perf_data_gib {
        return perf_data_bench(gib);
    }
    let layout = layout();
    let sel = Selection {
        kernels: a.kernels.clone(),
        scenarios: vec![a.scenario.clone()],
        ..Selection::default()
    };
    let planned = suite::plan(&layout, &sel)?;
    start_trials();
    let opts = EnvOptions {
        accel: a.accel,
        extra_cmdline: a.append.clone(),
        boot: a.boot,
        ..EnvOptions::default()
    };
    let kernels: Vec<_> = planned.iter().map(|t| t.kernel.clone()).collect();
    let env = suite::prepare_env(&layout, &opts, &kernels)?;
    println!("kloop bench: accelerator: {}", accel_line(&env.accel));
    if !a.append.is_empty() {
        println!(
            "kloop bench: appended to the kernel command line: {}",
            a.append.join(" ")
        );
    }
    let rows: Vec<_> = planned
        .iter()
        .map(|t| bench::BenchRow::measure(&env, t, a.runs, a.jobs))
        .collect();
    print!("{}", report::bench::trial_tables(&rows, a.runs));
    if a.channel_cycles > 0 {
        if let Some(t) = planned.first() {
            if let Some(outcome) = bench::channel(&env, t, a.channel_cycles)? {
                println!("\n{}", report::bench::channel_line(&outcome));
            }
        }
    }
    if a.matrix {
        println!();
        matrix_bench(&a)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench --perf-data-gib N`: a real recording stretched to N GiB (kept
/// for the next bench), then `check-perf-data` on it in a process of its
/// own.
fn perf_data_bench(gib: f64) -> Result<ExitCode> {
    let layout = layout();
    let dir = layout.root.join("target/kloop/bench");
    std::fs::create_dir_all(&dir)?;
    let target = (gib * (1u64 << 30) as f64) as u64;
    let file = dir.join(format!("perf-data-{gib}gib.pipe.data"));
    if std::fs::metadata(&file).map_or(true, |m| m.len() < target) {
        let template = layout
            .root
            .join("harness/src/testdata/perf-data/host-6.18.44-perf-6.1.187-header-size.pipe.data");
        println!(
            "kloop bench: writing {} from {} …",
            file.display(),
            template.display()
        );
        let g = kloop::perf_data::generate::stretch(&template, &file, target)?;
        println!(
            "kloop bench: {} bytes, {} KSYMBOL/BPF_EVENT records in {} rounds",
            g.bytes, g.side_band_records, g.rounds
        );
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let r = bench::check_perf_data(&exe, &file).map_err(anyhow::Error::msg)?;
    println!(
        "check-perf-data: {:.2} GB, {} records ({} KSYMBOL/BPF_EVENT) in {:.1} s: {:.0} records/s, {:.0} MB/s; peak RSS {:.1} MiB; exit {}",
        r.file_bytes as f64 / 1e9,
        r.records,
        r.side_band,
        r.secs,
        r.records_per_sec(),
        r.mb_per_sec(),
        r.max_rss_kib as f64 / 1024.0,
        r.exit.map_or("signal".into(), |c| c.to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// Times `cargo xtask vm-test` over the whole matrix (all pins × scenarios,
/// `--jobs` from the bench's own flag or one VM per core) as a user runs
/// it, on the kernel cache as it is: cold boots, then saved VMs twice (the
/// first makes whatever saved VM is missing, the second is the warm figure).
pub(crate) fn matrix_bench(a: &BenchArgs) -> Result<()> {
    let m = bench::MatrixBench {
        exe: std::env::current_exe().context("locating the xtask binary")?,
        runs_root: layout().runs(),
        accel: a.accel.to_string(),
        jobs: if a.jobs > 1 {
            a.jobs
        } else {
            suite::default_jobs()
        },
        append: a.append.clone(),
    };
    let mut rounds = Vec::new();
    for (label, boot) in bench::MATRIX_ROUNDS {
        println!(
            "kloop bench: matrix, {label} (--boot {boot} --jobs {}) …",
            m.jobs
        );
        let round = m.round(label, boot).context("running vm-test")?;
        if let Err(e) = &round.run {
            println!("kloop bench: {e}");
        }
        rounds.push(round);
    }
    print!("\n{}", report::bench::matrix_tables(&rounds));
    Ok(())
}

/// `vm-test`; `new_snapshot_set`: `bless --as`, whose `--snapshot-as`
/// names a set that does not exist yet.
/// `vm-test` (and `bless`, whose `bless` says what the trials write).
pub(crate) fn vm_test(
    a: VmTestArgs,
    new_snapshot_set: bool,
    bless: kloop::run::trial::Bless,
) -> Result<ExitCode> {
    let layout = layout();
    let sel = Selection {
        kernels: a.kernels.clone(),
        scenarios: a.scenarios.clone(),
        kernel_image: a.kernel_image.clone(),
        snapshot_as: a.snapshot_as.clone(),
        new_snapshot_set,
    };
    if let Some(baseline) = &a.baseline {
        return ab_test(&layout, &a, &sel, baseline);
    }
    let planned = suite::plan(&layout, &sel)?;
    let (trials, manifest) = shard_of(&layout, &a, planned)?;
    if a.list {
        for t in &trials {
            println!("{}", t.id());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if trials.is_empty() {
        bail!("no trials selected");
    }
    start_trials();
    let opts = EnvOptions {
        bless,
        ..a.env_options()
    };
    let started = std::time::Instant::now();
    let kernels: Vec<_> = trials.iter().map(|t| t.kernel.clone()).collect();
    let env =
        suite::prepare_env(&layout, &opts, &kernels).context("preparing the test environment")?;
    if let Some(m) = &manifest {
        let path = env.run_dir.join(kloop::report::merge::MANIFEST);
        std::fs::write(&path, serde_json::to_string_pretty(m)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let ledger_warnings = announce(&env, &trials, a.repeat as usize);
    // A shard may hold only trials its kernels skip; `merge` judges the run.
    let allow_skipped = a.allow_skipped || a.shard.is_some();
    let all_runs = run_rounds(&env, &trials, a.repeat as usize, a.jobs);
    let artefacts: Vec<PathBuf> = all_runs.iter().map(|r| r.artefacts.clone()).collect();
    let results = combine_repeats(&env, all_runs, a.repeat as usize)?;
    report::write_files(&env.run_dir, &results)
        .with_context(|| format!("writing reports into {}", env.run_dir.display()))?;
    write_kcidb(&env.run_dir, &kernels, &results, a.kcidb.as_deref());
    write_overhead_report(&layout, &env, &artefacts);
    Ok(print_summary(
        &env,
        &results,
        &ledger_warnings,
        started,
        allow_skipped,
    ))
}

/// With `--shard K/N`: this shard's part of the planned trials, announced,
/// and the manifest `merge` checks; otherwise every trial.
fn shard_of(
    layout: &Layout,
    a: &VmTestArgs,
    planned: Vec<suite::PlannedTrial>,
) -> Result<(
    Vec<suite::PlannedTrial>,
    Option<kloop::report::merge::ShardManifest>,
)> {
    let Some(shard) = a.shard else {
        return Ok((planned, None));
    };
    let durations = match &a.durations {
        Some(f) => kloop::run::shard::durations_from_results(
            &std::fs::read_to_string(f)
                .with_context(|| format!("reading --durations {}", f.display()))?,
        ),
        None => Default::default(),
    };
    let ids: Vec<String> = planned.iter().map(|t| t.id()).collect();
    let (mine, expected) = kloop::run::shard::select(&ids, shard, &durations);
    println!(
        "kloop: shard {shard}: {} of {} trial(s){}",
        mine.len(),
        ids.len(),
        match expected {
            Some(s) => format!(
                ", ~{s:.0} s expected (durations from {})",
                a.durations
                    .as_ref()
                    .map_or(String::new(), |d| d.display().to_string())
            ),
            None => ", balanced by count".to_string(),
        }
    );
    let manifest = kloop::report::merge::ShardManifest {
        kloop_commit: kloop_commit(&layout.root),
        shard,
        mine: mine.iter().map(|&i| ids[i].clone()).collect(),
        trials: ids,
    };
    let trials = planned
        .into_iter()
        .enumerate()
        .filter(|(i, _)| mine.contains(i))
        .map(|(_, t)| t)
        .collect();
    Ok((trials, Some(manifest)))
}

/// The checkout's commit, `+dirty` with uncommitted changes, `unknown`
/// outside git: shards of different kloop code must not merge.
pub(crate) fn kloop_commit(root: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(s) if !s.is_empty() => format!("{head}+dirty"),
            _ => head,
        },
        None => "unknown".to_string(),
    }
}

/// `merge DIR…`: the shards' run directories as one run directory.
pub(crate) fn merge(a: MergeArgs) -> Result<ExitCode> {
    let layout = layout();
    let out = match &a.out {
        Some(o) => o.clone(),
        None => kloop::run::trial::new_run_dir(&layout.runs())?,
    };
    let merged = kloop::report::merge::merge(&a.dirs, &out)?;
    report::write_files(&out, &merged.results)
        .with_context(|| format!("writing reports into {}", out.display()))?;
    let docs: Vec<kloop::report::kcidb::Document> = merged
        .shards
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join(kloop::report::kcidb::DOCUMENT_FILE)).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    if docs.len() == merged.shards.len() {
        let mut doc = kloop::report::kcidb::merge_documents(&docs);
        kloop::report::kcidb::relocate(&mut doc, &std::path::absolute(&out)?);
        std::fs::write(
            out.join(kloop::report::kcidb::DOCUMENT_FILE),
            serde_json::to_string_pretty(&doc)?,
        )?;
    } else {
        eprintln!("kloop: a shard has no kcidb.json: the merged run has none");
    }
    merge_ab(&merged.shards, &out, &merged.results)?;
    let summary = Summary::of(&merged.results);
    println!(
        "kloop: merged {} shard(s) into {}: {}",
        merged.shards.len(),
        out.display(),
        summary.line()
    );
    if summary.nothing_ran() && !a.allow_skipped {
        println!("kloop: {}", Summary::NOTHING_RAN);
    }
    Ok(if summary.success(a.allow_skipped) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Shards of an A/B (`vm-test --baseline … --shard`): their `ab.json`
/// outcomes as one, in the merged trials' scenario order, and the report.
fn merge_ab(
    shards: &[PathBuf],
    out: &std::path::Path,
    results: &[kloop::run::trial::TrialResult],
) -> Result<()> {
    let docs: Vec<Vec<kloop::judge::ab::AbOutcome>> = shards
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("ab.json")).ok())
        .map(|t| serde_json::from_str(&t))
        .collect::<std::result::Result<_, _>>()?;
    if docs.is_empty() {
        return Ok(());
    }
    if docs.len() != shards.len() {
        bail!("some shards are A/B runs (ab.json) and some are not: not parts of one run");
    }
    let mut outcomes: Vec<kloop::judge::ab::AbOutcome> = docs.into_iter().flatten().collect();
    let order = |s: &str| {
        results
            .iter()
            .position(|r| r.scenario == s)
            .unwrap_or(usize::MAX)
    };
    outcomes.sort_by_key(|o| order(&o.scenario));
    kloop::report::ab::write_json(out, &outcomes)?;
    let kernels = |i: usize| results.get(i).map(|r| r.kernel.clone()).unwrap_or_default();
    println!(
        "{}",
        kloop::report::ab::render(
            &kernels(0),
            &kernels(1),
            &outcomes,
            kloop::report::ab::Colour::for_stdout()
        )
    );
    Ok(())
}

/// The accelerator, configuration notes, the ledger's warnings and what
/// is about to run; returns the warnings, repeated at the end.
fn announce(
    env: &kloop::run::trial::TrialEnv,
    trials: &[suite::PlannedTrial],
    repeat: usize,
) -> Vec<String> {
    crate::ui::line(format!("kloop: accelerator: {}", accel_line(&env.accel)));
    suite::prefetch(env, trials);
    for note in suite::config_notes(env, trials) {
        crate::ui::line(format!("kloop: {note}"));
    }
    let ledger_warnings = env
        .known_issues
        .warnings(kloop::judge::known_issues::Date::today());
    for w in &ledger_warnings {
        println!("kloop: {w}");
    }
    if repeat > 1 {
        println!(
            "kloop: running {} trial(s) {repeat} times each ({} runs), artefacts in {}",
            trials.len(),
            trials.len() * repeat,
            env.run_dir.display()
        );
    } else {
        println!(
            "kloop: running {} trial(s), artefacts in {}",
            trials.len(),
            env.run_dir.display()
        );
    }
    ledger_warnings
}

/// Runs every trial `repeat` times, printing each trial's line as it ends.
fn run_rounds(
    env: &kloop::run::trial::TrialEnv,
    trials: &[suite::PlannedTrial],
    repeat: usize,
    jobs: Option<usize>,
) -> Vec<kloop::run::trial::TrialResult> {
    // Round after round, so each trial's runs meet different neighbours
    // and host load.
    let runs: Vec<_> = (0..repeat).flat_map(|_| trials.iter().cloned()).collect();
    let jobs = jobs.unwrap_or_else(suite::default_jobs);
    crate::ui::trials_started(runs.len());
    // One round: longest trials first, by the last runs' times, so that the
    // parallel VMs finish together. Rounds of a repeat keep their order.
    let order = if repeat > 1 {
        (0..runs.len()).collect()
    } else {
        let runs_root = env.run_dir.parent().unwrap_or(&env.run_dir);
        suite::longest_first(
            &runs,
            &kloop::run::run_dirs::past_wall_times(runs_root, &env.run_dir),
        )
    };
    let all_runs = suite::run_in_order(env, &runs, &order, jobs, &|r| {
        let mut text = report::trial_line(r);
        if let Some(d) = report::failure_details(r) {
            text = format!("{text}\n{d}");
        }
        crate::ui::line(text);
        crate::ui::trial_ended(r.verdict.fails_run());
    });
    crate::ui::trials_finished();
    all_runs
}

/// With `--repeat`: writes every run and the per-trial comparison, prints
/// the table and the FLAKY trials, and returns one combined result per
/// trial; otherwise the runs as they are.
fn combine_repeats(
    env: &kloop::run::trial::TrialEnv,
    all_runs: Vec<kloop::run::trial::TrialResult>,
    repeat: usize,
) -> Result<Vec<kloop::run::trial::TrialResult>> {
    if repeat <= 1 {
        return Ok(all_runs);
    }
    report::write_runs(&env.run_dir, &all_runs)
        .with_context(|| format!("writing runs.jsonl into {}", env.run_dir.display()))?;
    let grouped = kloop::run::repeat::group(all_runs);
    kloop::run::repeat::write_report(&env.run_dir, &grouped)
        .with_context(|| format!("writing repeat.json into {}", env.run_dir.display()))?;
    println!();
    println!("{}", kloop::run::repeat::table(&grouped));
    let combined: Vec<_> = grouped.iter().filter_map(|t| t.combined()).collect();
    for r in combined
        .iter()
        .filter(|r| matches!(r.verdict, kloop::run::trial::Verdict::Flaky(_)))
    {
        println!("{}", report::trial_line(r));
        if let Some(d) = report::failure_details(r) {
            println!("{d}");
        }
    }
    Ok(combined)
}

/// The run's overhead table and plot under target/kloop/report, if it
/// measured any; a failure to write them is reported, not fatal.
fn write_overhead_report(
    layout: &Layout,
    env: &kloop::run::trial::TrialEnv,
    artefacts: &[PathBuf],
) {
    let run_name = env
        .run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let report_dir = layout.root.join("target/kloop/report");
    match kloop::report::overhead::write_run_report(&report_dir, &run_name, artefacts) {
        Ok(Some((md, svg))) => println!(
            "kloop: overhead table {} and plot {}",
            md.display(),
            svg.display()
        ),
        Ok(None) => {}
        Err(e) => eprintln!(
            "kloop: writing the overhead report into {}: {e}",
            report_dir.display()
        ),
    }
}

/// The closing lines (trials that did not pass, the ledger's warnings, the
/// summary) and the exit code.
fn print_summary(
    env: &kloop::run::trial::TrialEnv,
    results: &[kloop::run::trial::TrialResult],
    ledger_warnings: &[String],
    started: std::time::Instant,
    allow_skipped: bool,
) -> ExitCode {
    let summary = Summary::of(results);
    println!();
    // Skipped and known-bug trials do not fail the run: list them at the end
    // so they are seen anyway.
    for line in report::not_passed_lines(results) {
        println!("kloop: {line}");
    }
    for w in ledger_warnings {
        println!("kloop: {w}");
    }
    println!(
        "kloop: step summary: {}",
        env.run_dir.join(report::SUMMARY_FILE).display()
    );
    println!(
        "kloop: {} in {:.1} s ({}); reports: {}",
        summary.line(),
        started.elapsed().as_secs_f64(),
        env.accel.accel,
        env.run_dir.display()
    );
    if summary.nothing_ran() && !allow_skipped {
        println!("kloop: {}", Summary::NOTHING_RAN);
    }
    if summary.success(allow_skipped) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
