//! `vm-test`, `bless` (through `vm-test`) and `bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report::{self, Summary};
use kloop::run::suite::{self, EnvOptions, Selection};

use crate::*;

pub(crate) fn bench(a: BenchArgs) -> Result<ExitCode> {
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
    let rows: Vec<BenchRow> = planned
        .iter()
        .map(|t| BenchRow::measure(&env, t, a.runs, a.jobs))
        .collect();
    print_bench_rows(&rows, a.runs);
    if a.channel_cycles > 0 {
        if let Some(t) = planned.first() {
            channel_bench(&env, t, a.channel_cycles)?;
        }
    }
    if a.matrix {
        println!();
        matrix_bench(&a)?;
    }
    Ok(ExitCode::SUCCESS)
}

type Spread = Option<kloop::run::bench::Spread>;

fn show(s: &Spread) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
}

/// One trial's figures over its runs.
struct BenchRow {
    id: String,
    hello: Spread,
    wall: Spread,
    rss_mib: Spread,
    failed: usize,
    phases: kloop::run::bench::PhaseSpreads,
}

impl BenchRow {
    /// Runs `t` `runs` times and takes the spreads of its figures.
    fn measure(
        env: &kloop::run::trial::TrialEnv,
        t: &suite::PlannedTrial,
        runs: usize,
        jobs: usize,
    ) -> BenchRow {
        let repeated = vec![t.clone(); runs];
        let results = suite::run_all(env, &repeated, jobs, &|_| {});
        let hello: Vec<f64> = results
            .iter()
            .filter_map(|r| r.boot_to_hello_secs)
            .collect();
        let wall: Vec<f64> = results.iter().map(|r| r.wall_secs).collect();
        let rss_mib: Vec<f64> = results
            .iter()
            .filter_map(|r| r.qemu_peak_rss_kib)
            .map(|k| k as f64 / 1024.0)
            .collect();
        BenchRow {
            id: t.id(),
            hello: kloop::run::bench::Spread::of(&hello),
            wall: kloop::run::bench::Spread::of(&wall),
            rss_mib: kloop::run::bench::Spread::of(&rss_mib),
            failed: results.iter().filter(|r| r.verdict.fails_run()).count(),
            phases: kloop::run::bench::PhaseSpreads::of(&results),
        }
    }
}

/// The bench's three tables: boot and wall time, QEMU CPU time, phases.
fn print_bench_rows(rows: &[BenchRow], runs: usize) {
    println!(
        "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
        "trial",
        "runs",
        "start→hello s (med min-max)",
        "trial wall s (med min-max)",
        "QEMU peak RSS MiB (med min-max)",
        "failed"
    );
    for r in rows {
        println!(
            "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
            r.id,
            runs,
            show(&r.hello),
            show(&r.wall),
            show(&r.rss_mib),
            r.failed
        );
    }
    println!(
        "(start→hello: QEMU's start to the agent's hello; restore→hello for trials restored from a \
         saved VM, whose kernel-boot columns below then show -)"
    );
    println!();
    println!(
        "QEMU CPU seconds (user+sys; steady on a busy host, unlike wall time), median (min-max):"
    );
    println!("{:<16} {:>22} {:>22}", "trial", "start→hello", "hello→done");
    for r in rows {
        println!(
            "{:<16} {:>22} {:>22}",
            r.id,
            show(&r.phases.qemu_cpu_to_hello),
            show(&r.phases.qemu_cpu_agent)
        );
    }
    println!();
    println!("where the time goes, seconds, median (min-max):");
    println!(
        "{:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "trial",
        "host prepare",
        "QEMU+fw+decompress",
        "kernel boot→hello",
        "agent plan",
        "power-off",
        "host checks"
    );
    for r in rows {
        let p = &r.phases;
        println!(
            "{:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
            r.id,
            show(&p.prepare),
            show(&p.before_kernel_clock),
            show(&p.kernel_to_hello),
            show(&p.agent),
            show(&p.shutdown),
            show(&p.host_checks)
        );
    }
}

/// The data channel's throughput: a storm of `cycles` programs on `t`'s
/// kernel, its pin's image without snapshots (the storm has none, its
/// verdict is the invariants alone).
fn channel_bench(
    env: &kloop::run::trial::TrialEnv,
    t: &suite::PlannedTrial,
    cycles: u32,
) -> Result<()> {
    let storm = kloop::run::bench::storm_scenario(
        &t.scenario,
        "bench-channel",
        &env.run_dir.join("no-snapshots"),
        cycles,
        4,
    );
    let kernel = match &t.kernel {
        kloop::run::trial::KernelUnderTest::Pin(pin) => kloop::run::trial::KernelUnderTest::Image(
            kloop::run::trial::LocalKernel::from_pin_image(
                env.cache.ensure_image(pin, &env.fetch)?,
                env.cache.ensure_config(pin, &env.fetch).ok(),
            ),
        ),
        other => other.clone(),
    };
    let trial = suite::PlannedTrial {
        scenario: storm,
        kernel,
    };
    let r = suite::run_all(env, &[trial], 1, &|_| {});
    println!();
    match r.first() {
        Some(r) if r.verdict == kloop::run::trial::Verdict::Ok => {
            match kloop::run::bench::TrialArtefacts::read(&r.artefacts)
                .and_then(|t| kloop::run::bench::Throughput::of(&t))
            {
                Ok(tp) => println!(
                    "channel ({}): {} records, {} bytes, {} lost in {:.2} s of guest time \
                     (storm of funcs32 + final drain): {:.0} records/s, {:.2} MB/s",
                    t.kernel.id(),
                    tp.records,
                    tp.bytes,
                    tp.lost,
                    tp.secs,
                    tp.records_per_sec(),
                    tp.mb_per_sec()
                ),
                Err(e) => println!("channel: cannot read the storm's artefacts: {e}"),
            }
        }
        Some(r) => println!(
            "channel: storm trial {}: {}",
            r.verdict.label(),
            r.verdict.message().unwrap_or_default()
        ),
        None => {}
    }
    Ok(())
}

/// Times `cargo xtask vm-test` over the whole matrix (all pins × scenarios,
/// `--jobs` from the bench's own flag or one VM per core) as a user runs
/// it, on the kernel cache as it is: with cold boots, then from saved VMs
/// twice (the first makes whatever saved VM is missing, the second is the
/// warm figure). The cold/saved ratio is what counts on a noisy machine: both
/// runs meet the same host.
pub(crate) fn matrix_bench(a: &BenchArgs) -> Result<()> {
    let rows = run_matrix_rounds(a)?;
    print_matrix_rows(&rows);
    Ok(())
}

/// One whole-matrix round's figures: its label, wall seconds, exit code
/// and the run it left (if it could be read).
type MatrixRow = (
    &'static str,
    f64,
    Option<i32>,
    Option<kloop::run::bench::MatrixRun>,
);

/// Runs `vm-test` over the whole matrix three times: cold boots, saved VMs
/// made on the way, saved VMs warm.
fn run_matrix_rounds(a: &BenchArgs) -> Result<Vec<MatrixRow>> {
    use kloop::run::bench::MatrixRun;
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let runs_root = layout().runs();
    let jobs = if a.jobs > 1 {
        a.jobs
    } else {
        suite::default_jobs()
    };
    let mut rows: Vec<MatrixRow> = Vec::new();
    for (label, boot) in [
        ("cold boots", "cold"),
        ("saved VMs, first", "saved"),
        ("saved VMs, warm", "saved"),
    ] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("vm-test")
            .arg("--accel")
            .arg(a.accel.to_string())
            .arg("--jobs")
            .arg(jobs.to_string())
            .arg("--boot")
            .arg(boot);
        for w in &a.append {
            cmd.arg("--append").arg(w);
        }
        cmd.stdout(std::process::Stdio::null());
        println!("kloop bench: matrix, {label} (--boot {boot} --jobs {jobs}) …");
        let started = std::time::Instant::now();
        let mut child = cmd.spawn().context("running vm-test")?;
        let pid = child.id();
        let status = child.wait().context("waiting for vm-test")?;
        let secs = started.elapsed().as_secs_f64();
        // The child's run directory is named after its pid.
        let run = kloop::run::run_dirs::of_process(&runs_root, pid).map(|d| MatrixRun::read(&d));
        let run = match run {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                println!("kloop bench: {e}");
                None
            }
            None => {
                println!(
                    "kloop bench: vm-test (pid {pid}) left no run directory under {}",
                    runs_root.display()
                );
                None
            }
        };
        rows.push((label, secs, status.code(), run));
    }
    Ok(rows)
}

/// The matrix table, the cold/warm ratio, restore→hello per pin and the
/// agent phase per scenario.
fn print_matrix_rows(rows: &[MatrixRow]) {
    use kloop::run::bench::Spread;
    println!();
    println!(
        "{:<18} {:>8} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "whole matrix",
        "wall s",
        "exit",
        "trials",
        "restored",
        "prepare",
        "to hello",
        "agent",
        "power-off",
        "checks",
        "QEMU CPU"
    );
    for (label, secs, code, run) in rows {
        let r = run.clone().unwrap_or_default();
        println!(
            "{label:<18} {secs:>8.1} {:>6} {:>7} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            code.map_or("signal".into(), |c| c.to_string()),
            r.trials,
            format!("{} ({} new)", r.restored, r.saved_now),
            r.prepare,
            r.to_hello,
            r.agent,
            r.shutdown,
            r.host_checks,
            r.qemu_cpu
        );
    }
    println!(
        "(phase columns: seconds summed over the trials; wall: the whole command; QEMU CPU: \
         its user+sys seconds to the agent's done, summed, which a busy host stretches far \
         less than wall time)"
    );
    if let (Some(cold), Some(warm)) = (rows.first(), rows.get(2)) {
        println!(
            "cold / saved-warm wall-time ratio: {:.2} ({:.1} s / {:.1} s)",
            cold.1 / warm.1,
            cold.1,
            warm.1
        );
    }
    if let Some((_, _, _, Some(warm))) = rows.get(2) {
        println!();
        println!(
            "restore→hello per pin (host: QEMU start to the agent's hello), s, median (min-max):"
        );
        for (pin, v) in &warm.restore_to_hello {
            if let Some(spread) = Spread::of(v) {
                println!("  {pin:<8} {spread} over {} trials", spread.n);
            }
        }
        if let Some((_, _, _, Some(cold))) = rows.first() {
            println!();
            println!("agent phase per scenario, s summed over pins (cold / saved-warm):");
            for (scenario, secs) in &warm.agent_by_scenario {
                let c = cold.agent_by_scenario.get(scenario).copied().unwrap_or(0.0);
                println!("  {scenario:<18} {c:>7.1} {secs:>7.1}");
            }
        }
    }
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
    let all_runs = run_rounds(&env, &trials, a.repeat as usize, a.jobs);
    let artefacts: Vec<PathBuf> = all_runs.iter().map(|r| r.artefacts.clone()).collect();
    let results = combine_repeats(&env, all_runs, a.repeat as usize)?;
    report::write_files(&env.run_dir, &results)
        .with_context(|| format!("writing reports into {}", env.run_dir.display()))?;
    write_kcidb(&env.run_dir, &kernels, &results, a.kcidb.as_deref());
    write_overhead_report(&layout, &env, &artefacts);
    Ok(print_summary(&env, &results, &ledger_warnings, started))
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
    Ok(if summary.all_ok() {
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
    if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
