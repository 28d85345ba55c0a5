//! `cargo xtask bench`'s tables, rendered from the figures
//! [`crate::run::bench`] measured.

use std::fmt::Write as _;

use crate::run::bench::{BenchRow, ChannelOutcome, MatrixRound, Spread};

fn show(s: &Option<Spread>) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
}

/// The bench's three tables: boot and wall time, QEMU CPU time, phases.
pub fn trial_tables(rows: &[BenchRow], runs: usize) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
        "trial",
        "runs",
        "start→hello s (med min-max)",
        "trial wall s (med min-max)",
        "QEMU peak RSS MiB (med min-max)",
        "failed"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
            r.id,
            runs,
            show(&r.hello),
            show(&r.wall),
            show(&r.rss_mib),
            r.failed
        );
    }
    o.push_str(
        "(start→hello: QEMU's start to the agent's hello; restore→hello for trials restored from \
         a saved VM, whose kernel-boot columns below then show -)\n\n",
    );
    o.push_str(
        "QEMU CPU seconds (user+sys; steady on a busy host, unlike wall time), median (min-max):\n",
    );
    let _ = writeln!(
        o,
        "{:<16} {:>22} {:>22}",
        "trial", "start→hello", "hello→done"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<16} {:>22} {:>22}",
            r.id,
            show(&r.phases.qemu_cpu_to_hello),
            show(&r.phases.qemu_cpu_agent)
        );
    }
    o.push_str("\nwhere the time goes, seconds, median (min-max):\n");
    let heads = [
        "trial",
        "host prepare",
        "QEMU+fw+decompress",
        "kernel boot→hello",
        "agent plan",
        "power-off",
        "host checks",
    ];
    row7(&mut o, &heads.map(str::to_string));
    for r in rows {
        let p = &r.phases;
        row7(
            &mut o,
            &[
                r.id.clone(),
                show(&p.prepare),
                show(&p.before_kernel_clock),
                show(&p.kernel_to_hello),
                show(&p.agent),
                show(&p.shutdown),
                show(&p.host_checks),
            ],
        );
    }
    o
}

fn row7(o: &mut String, c: &[String; 7]) {
    let _ = writeln!(
        o,
        "{:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    );
}

/// The channel bench's line.
pub fn channel_line(outcome: &ChannelOutcome) -> String {
    match outcome {
        ChannelOutcome::Measured { kernel, tp } => format!(
            "channel ({kernel}): {} records, {} bytes, {} lost in {:.2} s of guest time \
             (storm of funcs32 + final drain): {:.0} records/s, {:.2} MB/s",
            tp.records,
            tp.bytes,
            tp.lost,
            tp.secs,
            tp.records_per_sec(),
            tp.mb_per_sec()
        ),
        ChannelOutcome::Unreadable(e) => format!("channel: cannot read the storm's artefacts: {e}"),
        ChannelOutcome::TrialFailed(v) => format!(
            "channel: storm trial {}: {}",
            v.label(),
            v.message().unwrap_or_default()
        ),
    }
}

/// The matrix table, the cold/warm ratio, restore→hello per pin and the
/// agent phase per scenario.
pub fn matrix_tables(rounds: &[MatrixRound]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
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
    for round in rounds {
        let r = round.run.clone().unwrap_or_default();
        let _ = writeln!(
            o,
            "{:<18} {:>8.1} {:>6} {:>7} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            round.label,
            round.secs,
            round.exit.map_or("signal".into(), |c| c.to_string()),
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
    o.push_str(
        "(phase columns: seconds summed over the trials; wall: the whole command; QEMU CPU: \
         its user+sys seconds to the agent's done, summed, which a busy host stretches far \
         less than wall time)\n",
    );
    let three = rounds.len() == 3;
    if let (Some(cold), Some(warm)) = (rounds.first().filter(|_| three), rounds.get(2)) {
        let _ = writeln!(
            o,
            "cold / saved-warm wall-time ratio: {:.2} ({:.1} s / {:.1} s)",
            cold.secs / warm.secs,
            cold.secs,
            warm.secs
        );
    }
    let Some(Ok(warm)) = rounds
        .last()
        .filter(|_| three || rounds.len() == 1)
        .map(|r| &r.run)
    else {
        return o;
    };
    o.push_str(
        "\nrestore→hello per pin (host: QEMU start to the agent's hello), s, median (min-max):\n",
    );
    for (pin, v) in &warm.restore_to_hello {
        if let Some(spread) = Spread::of(v) {
            let _ = writeln!(o, "  {pin:<8} {spread} over {} trials", spread.n);
        }
    }
    if let Some(Ok(cold)) = rounds.first().map(|r| &r.run) {
        o.push_str("\nagent phase per scenario, s summed over pins (cold / saved-warm):\n");
        for (scenario, secs) in &warm.agent_by_scenario {
            let c = cold.agent_by_scenario.get(scenario).copied().unwrap_or(0.0);
            let _ = writeln!(o, "  {scenario:<18} {c:>7.1} {secs:>7.1}");
        }
    }
    o
}

/// `bench --perf-data-gib`'s line: size, records, throughput, peak memory,
/// exit code.
pub fn perf_data_line(r: &crate::run::bench::PerfDataRun) -> String {
    format!(
        "check-perf-data: {:.2} GB, {} records ({} KSYMBOL/BPF_EVENT) in {:.1} s: {:.0} records/s, {:.0} MB/s; peak RSS {:.1} MiB; exit {}",
        r.file_bytes as f64 / 1e9,
        r.records,
        r.side_band,
        r.secs,
        r.records_per_sec(),
        r.mb_per_sec(),
        r.max_rss_kib as f64 / 1024.0,
        r.exit.map_or("signal".into(), |c| c.to_string())
    )
}

/// `bench --steps`: per scenario, its agent phase summed over the
/// kernels, the guest seconds of it spent reading /proc/kallsyms, where the
/// guest CPUs' time went (the agent's user and system time, the kernel's
/// own threads, idle: CPU-seconds, summed over each VM's CPUs) and the
/// steps that took it (the five longest step kinds), then the total.
pub fn steps_table(rows: &[crate::run::bench::ScenarioSteps]) -> String {
    let mut out = format!(
        "{:<28} {:>6} {:>9} {:>10} {:>7} {:>7} {:>7} {:>7}  steps (guest seconds, summed over the kernels)\n",
        "scenario", "trials", "agent s", "kallsyms s", "user", "sys", "other", "idle"
    );
    let cpu_cols = |c: &crate::run::bench::CpuSplit| {
        format!(
            "{:>7.1} {:>7.1} {:>7.1} {:>7.1}",
            c.user,
            c.sys,
            c.other(),
            c.idle
        )
    };
    for r in rows {
        let steps: Vec<String> = r
            .steps
            .iter()
            .take(5)
            .map(|(op, s)| format!("{op} {s:.1}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<28} {:>6} {:>9.1} {:>10.1} {}  {}",
            r.scenario,
            r.trials,
            r.agent,
            r.kallsyms,
            cpu_cols(&r.cpu),
            steps.join(", ")
        );
    }
    let total: f64 = rows.iter().map(|r| r.agent).sum();
    let kallsyms: f64 = rows.iter().map(|r| r.kallsyms).sum();
    let cpu = rows
        .iter()
        .fold(crate::run::bench::CpuSplit::default(), |a, r| {
            a.plus(&r.cpu)
        });
    let _ = writeln!(
        out,
        "{:<28} {:>6} {total:>9.1} {kallsyms:>10.1} {}  ({:.0}% of the agent phase read /proc/kallsyms; \
         user/sys: the agent and perf, other: the kernel's threads and interrupts, idle: waiting; \
         CPU-seconds over each VM's CPUs)",
        "all",
        rows.iter().map(|r| r.trials).sum::<usize>(),
        cpu_cols(&cpu),
        if total > 0.0 { 100.0 * kallsyms / total } else { 0.0 }
    );
    out
}

/// `bench --validate`: each run's wall split (builds, the A/B's trials
/// and each side's trial-seconds, reports) and the spread of the walls.
pub fn validate_table(rounds: &[crate::run::bench::ValidateRound]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<4} {:>8} {:>5} {:>8} {:>10} {:>14} {:>8} {:>20} {:>12} {:>9}",
        "run",
        "wall s",
        "exit",
        "build s",
        "candidate",
        "baseline",
        "A/B s",
        "baseline",
        "candidate",
        "report s"
    );
    let _ = writeln!(
        o,
        "{:<4} {:>8} {:>5} {:>8} {:>10} {:>14} {:>8} {:>20} {:>12} {:>9}",
        "", "", "", "", "build", "during build", "", "trial-s", "trial-s", ""
    );
    for (i, r) in rounds.iter().enumerate() {
        let exit = r.exit.map_or("signal".to_string(), |c| c.to_string());
        match &r.timing {
            Ok(t) => {
                let _ = writeln!(
                    o,
                    "{:<4} {:>8.1} {:>5} {:>8.1} {:>10} {:>14} {:>8.1} {:>20} {:>12} {:>9.1}",
                    i + 1,
                    r.secs,
                    exit,
                    t.build_secs,
                    if t.candidate_cached {
                        "cached"
                    } else {
                        "built"
                    },
                    format!("{} in {:.1} s", t.early_baseline.ran, t.early_baseline.secs),
                    t.ab_secs,
                    format!(
                        "{:.1} ({}/{} reused)",
                        t.baseline.trial_secs, t.baseline.reused, t.baseline.trials
                    ),
                    format!("{:.1} ({})", t.candidate.trial_secs, t.candidate.trials),
                    t.report_secs
                );
            }
            Err(e) => {
                let _ = writeln!(o, "{:<4} {:>8.1} {:>5} ({e})", i + 1, r.secs, exit);
            }
        }
    }
    let walls: Vec<f64> = rounds.iter().map(|r| r.secs).collect();
    if let Some(s) = Spread::of(&walls) {
        let _ = writeln!(
            o,
            "wall over {} run(s): min {:.1} s, median {:.1} s, max {:.1} s",
            s.n, s.min, s.median, s.max
        );
    }
    o
}

/// `bench --fresh`: one line per round, each part of a new user's first
/// run, then vm-test's own split.
pub fn fresh_tables(
    rounds: &[Result<crate::run::bench::FreshRound, crate::run::bench::BenchError>],
) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<6} {:>8} {:>8} {:>10} {:>8} {:>13} {:>16} {:>8} {:>9} {:>6}  verdicts",
        "round",
        "total s",
        "setup",
        "host build",
        "vm-test",
        "agent",
        "kernels (fetched)",
        "saved VMs",
        "trials",
        "exit"
    );
    for (i, r) in rounds.iter().enumerate() {
        match r {
            Err(e) => {
                let _ = writeln!(o, "{:<6} failed: {e}", i + 1);
            }
            Ok(r) => {
                let p = r.phases.clone().unwrap_or_default();
                let run = r.run.clone().unwrap_or_default();
                let _ = writeln!(
                    o,
                    "{:<6} {:>8.1} {:>8.1} {:>10.1} {:>8.1} {:>13} {:>16} {:>8} {:>9.1} {:>6}  {} trials",
                    i + 1,
                    r.total_secs(),
                    r.setup_secs,
                    r.host_build_secs,
                    r.vm_test_secs,
                    format!("{:.1} (+{:.1})", p.agent_build_secs, p.agent_build_beside_secs),
                    format!("{:.1} ({})", p.kernels.secs, p.kernels.fetched),
                    format!("{} ({:.0} VM-s)", p.trials.saved_vms.len(), p.trials.saved_vm_secs()),
                    p.trials.secs,
                    r.exit.map_or("signal".into(), |c| c.to_string()),
                    run.trials
                );
                for e in [&r.phases.as_ref().err(), &r.run.as_ref().err()]
                    .into_iter()
                    .flatten()
                {
                    let _ = writeln!(o, "       {e}");
                }
            }
        }
    }
    o.push_str(
        "(total: set-up + host build + vm-test, what a user waits for; agent, kernels, saved VMs \
         and trials are vm-test's own phases: the agent build (the wait for it, + the part hidden \
         beside the downloads), the pins fetched and verified, \
         the saved VMs made on the way with the VM seconds they took, and the trials' wall)\n",
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::bench::MatrixRun;

    #[test]
    fn matrix_tables_give_the_ratio_and_leave_out_unread_rounds() {
        let run = |agent: f64| MatrixRun {
            trials: 2,
            agent,
            agent_by_scenario: [("basic".to_string(), agent)].into(),
            restore_to_hello: [("6.1".to_string(), vec![0.2, 0.4])].into(),
            ..MatrixRun::default()
        };
        let rounds = [
            MatrixRound {
                label: "cold boots".into(),
                secs: 300.0,
                exit: Some(0),
                run: Ok(run(9.0)),
            },
            MatrixRound {
                label: "saved VMs, first".into(),
                secs: 250.0,
                exit: None,
                run: Err(crate::run::bench::BenchError::Process("x".into())),
            },
            MatrixRound {
                label: "saved VMs, warm".into(),
                secs: 200.0,
                exit: Some(1),
                run: Ok(run(3.0)),
            },
        ];
        let t = matrix_tables(&rounds);
        assert!(
            t.contains("cold / saved-warm wall-time ratio: 1.50 (300.0 s / 200.0 s)"),
            "{t}"
        );
        assert!(t.contains("signal"), "{t}");
        assert!(
            t.contains("  6.1      0.30 (0.20-0.40) over 2 trials"),
            "{t}"
        );
        assert!(t.contains("  basic                  9.0     3.0"), "{t}");
    }

    #[test]
    fn a_fresh_round_adds_up_what_the_user_waited_for_and_a_failed_one_says_why() {
        use crate::run::bench::{BenchError, FreshRound};
        use crate::run::phases::{KernelsPhase, Phases, SavedVmMade, TrialsPhase};
        let phases = Phases {
            agent_build_secs: 55.0,
            kernels: KernelsPhase {
                secs: 20.0,
                kernels: 5,
                fetched: 5,
            },
            trials: TrialsPhase {
                secs: 160.0,
                runs: 250,
                saved_vms: vec![SavedVmMade {
                    secs: 6.5,
                    ..SavedVmMade::default()
                }],
                saved_vms_removed: 0,
            },
            ..Phases::default()
        };
        let ok = FreshRound {
            setup_secs: 15.0,
            host_build_secs: 110.0,
            vm_test_secs: 240.0,
            exit: Some(0),
            phases: Ok(phases),
            run: Err(BenchError::Process("no results".into())),
        };
        assert_eq!(ok.total_secs(), 365.0);
        let t = fresh_tables(&[Ok(ok), Err(BenchError::Process("git clone failed".into()))]);
        let first = t.lines().nth(1).expect("a row");
        assert!(
            first.contains("365.0") && first.contains("20.0 (5)") && first.contains("1 (6 VM-s)"),
            "{t}"
        );
        assert!(t.contains("no results"), "{t}");
        assert!(
            t.lines()
                .nth(3)
                .is_some_and(|l| l.contains("failed: git clone failed")),
            "{t}"
        );
    }
}
