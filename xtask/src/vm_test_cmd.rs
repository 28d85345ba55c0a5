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
    kloop::run::signals::install();
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
    let show = |s: &Option<kloop::run::bench::Spread>| {
        s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
    };
    let mut boot_rows = Vec::new();
    let mut phase_rows = Vec::new();
    for t in &planned {
        let repeated = vec![t.clone(); a.runs];
        let results = suite::run_all(&env, &repeated, a.jobs, &|_| {});
        let failed = results.iter().filter(|r| r.verdict.fails_run()).count();
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
        boot_rows.push((
            t.id(),
            kloop::run::bench::Spread::of(&hello),
            kloop::run::bench::Spread::of(&wall),
            kloop::run::bench::Spread::of(&rss_mib),
            failed,
        ));
        phase_rows.push((t.id(), kloop::run::bench::PhaseSpreads::of(&results)));
    }
    println!(
        "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
        "trial",
        "runs",
        "boot→hello s (med min-max)",
        "trial wall s (med min-max)",
        "QEMU peak RSS MiB (med min-max)",
        "failed"
    );
    for (id, hello, wall, rss, failed) in &boot_rows {
        println!(
            "{id:<16} {:>5} {:>26} {:>26} {:>30} {failed:>6}",
            a.runs,
            show(hello),
            show(wall),
            show(rss)
        );
    }
    println!();
    println!(
        "QEMU CPU seconds (user+sys; steady on a busy host, unlike wall time), median (min-max):"
    );
    println!("{:<16} {:>22} {:>22}", "trial", "start→hello", "hello→done");
    for (id, p) in &phase_rows {
        println!(
            "{id:<16} {:>22} {:>22}",
            show(&p.qemu_cpu_to_hello),
            show(&p.qemu_cpu_agent)
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
    for (id, p) in &phase_rows {
        println!(
            "{id:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
            show(&p.prepare),
            show(&p.before_kernel_clock),
            show(&p.kernel_to_hello),
            show(&p.agent),
            show(&p.shutdown),
            show(&p.host_checks)
        );
    }

    if a.channel_cycles > 0 {
        if let Some(t) = planned.first() {
            let storm = kloop::run::bench::storm_scenario(
                &t.scenario,
                "bench-channel",
                &env.run_dir.join("no-snapshots"),
                a.channel_cycles,
                4,
            );
            // The pin's image without its snapshots: the storm has none,
            // its verdict is the invariants alone.
            let kernel = match &t.kernel {
                kloop::run::trial::KernelUnderTest::Pin(pin) => {
                    kloop::run::trial::KernelUnderTest::Image(
                        kloop::run::trial::LocalKernel::from_pin_image(
                            env.cache.ensure_image(pin, &env.fetch)?,
                            env.cache.ensure_config(pin, &env.fetch).ok(),
                        ),
                    )
                }
                other => other.clone(),
            };
            let trial = suite::PlannedTrial {
                scenario: storm,
                kernel,
            };
            let r = suite::run_all(&env, &[trial], 1, &|_| {});
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
        }
    }

    if a.matrix {
        println!();
        matrix_bench(&a)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Times `cargo xtask vm-test` over the whole matrix twice, as a user runs
/// it: cold (a fresh, empty kernel cache: every pin fetched, verified and
/// extracted, the KVM probe run again) and then warm (the same cache).
pub(crate) fn matrix_bench(a: &BenchArgs) -> Result<()> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let cold_cache = tempfile::Builder::new()
        .prefix("kloop-bench-cache-")
        .tempdir()
        .context("creating an empty cache directory for the cold run")?;
    let mut rows = Vec::new();
    for (label, cache) in [
        ("cold (empty cache)", Some(cold_cache.path())),
        ("warm", Some(cold_cache.path())),
    ] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("vm-test").arg("--accel").arg(a.accel.to_string());
        for w in &a.append {
            cmd.arg("--append").arg(w);
        }
        if a.boot == kloop::run::trial::BootEntry::BzImage {
            cmd.arg("--boot").arg("bzimage");
        }
        if let Some(c) = cache {
            cmd.env(kloop_kernels::CACHE_DIR_ENV, c);
        }
        cmd.stdout(std::process::Stdio::null());
        println!("kloop bench: matrix, {label} …");
        let started = std::time::Instant::now();
        let status = cmd.status().context("running vm-test")?;
        let secs = started.elapsed().as_secs_f64();
        rows.push((label, secs, status));
    }
    println!("{:<20} {:>10} {:>10}", "whole matrix", "wall s", "exit");
    for (label, secs, status) in rows {
        println!(
            "{label:<20} {secs:>10.1} {:>10}",
            status.code().map_or("signal".into(), |c| c.to_string())
        );
    }
    Ok(())
}

/// `vm-test`; `new_snapshot_set`: `bless --as`, whose `--snapshot-as`
/// names a set that does not exist yet.
pub(crate) fn vm_test(a: VmTestArgs, new_snapshot_set: bool) -> Result<ExitCode> {
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
    let trials = suite::plan(&layout, &sel)?;
    if a.list {
        for t in &trials {
            println!("{}", t.id());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if trials.is_empty() {
        bail!("no trials selected");
    }
    kloop::run::signals::install();
    if std::env::var_os("INSTA_OUTPUT").is_none() {
        // Each failing trial prints its own short diff; insta's full diff
        // would interleave between parallel trials (`cargo insta review`
        // shows it on demand).
        std::env::set_var("INSTA_OUTPUT", "none");
    }
    let opts = a.env_options();
    let started = std::time::Instant::now();
    let kernels: Vec<_> = trials.iter().map(|t| t.kernel.clone()).collect();
    let env =
        suite::prepare_env(&layout, &opts, &kernels).context("preparing the test environment")?;
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    for note in suite::config_notes(&env, &trials) {
        println!("kloop: {note}");
    }
    let ledger_warnings = env
        .known_issues
        .warnings(kloop::judge::known_issues::Date::today());
    for w in &ledger_warnings {
        println!("kloop: {w}");
    }
    let repeat = a.repeat as usize;
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
    // Round after round, so each trial's runs meet different neighbours
    // and host load.
    let runs: Vec<_> = (0..repeat).flat_map(|_| trials.iter().cloned()).collect();
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let all_runs = suite::run_all(&env, &runs, jobs, &|r| {
        println!("{}", report::trial_line(r));
        if let Some(d) = report::failure_details(r) {
            println!("{d}");
        }
    });
    let artefacts: Vec<PathBuf> = all_runs.iter().map(|r| r.artefacts.clone()).collect();
    let results = if repeat > 1 {
        report::write_runs(&env.run_dir, &all_runs)
            .with_context(|| format!("writing runs.jsonl into {}", env.run_dir.display()))?;
        let grouped = kloop::run::repeat::group(all_runs);
        kloop::run::repeat::write_report(&env.run_dir, &grouped)
            .with_context(|| format!("writing repeat.json into {}", env.run_dir.display()))?;
        println!();
        println!("{}", kloop::run::repeat::table(&grouped));
        let combined: Vec<_> = grouped.iter().filter_map(|t| t.combined()).collect();
        for r in combined.iter().filter(|r| r.verdict.label() == "FLAKY") {
            println!("{}", report::trial_line(r));
            if let Some(d) = report::failure_details(r) {
                println!("{d}");
            }
        }
        combined
    } else {
        all_runs
    };
    report::write_files(&env.run_dir, &results)
        .with_context(|| format!("writing reports into {}", env.run_dir.display()))?;
    let run_name = env
        .run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let report_dir = layout.root.join("target/kloop/report");
    match kloop::report::overhead::write_run_report(&report_dir, &run_name, &artefacts) {
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
    let summary = Summary::of(&results);
    println!();
    // Skipped and known-bug trials do not fail the run: list them at the end
    // so they are seen anyway.
    for line in report::not_passed_lines(&results) {
        println!("kloop: {line}");
    }
    for w in &ledger_warnings {
        println!("kloop: {w}");
    }
    println!(
        "kloop: {} in {:.1} s ({}); reports: {}",
        summary.line(),
        started.elapsed().as_secs_f64(),
        env.accel.accel,
        env.run_dir.display()
    );
    Ok(if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
