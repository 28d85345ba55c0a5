//! `vm-test` (and `bless`) as one entry point: the planned trials (a
//! shard's part of them), the shared environment, the rounds of trials on
//! parallel VMs, `--repeat`'s comparison, and every file the run leaves
//! (results, JUnit, summary, KCIDB, the overhead report).
//!
//! What happens along the way reaches the caller as [`Event`]s, typed, for
//! it to draw; what the run decided comes back as a [`VmTestRun`].

use std::path::PathBuf;

use kloop_path_io::{PathIo, PathIoExt};

use crate::report::merge::ShardManifest;
use crate::run::phases::{KernelsPhase, Laps, Phases, SavedVmMade, SetupPhases, TrialsPhase};
use crate::run::suite::{self, EnvOptions, PlannedTrial, Selection, SuiteError};
use crate::run::trial::{TrialEnv, TrialResult, Verdict};
use crate::workspace::Layout;

/// What `vm-test` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct VmTestOptions {
    pub selection: Selection,
    pub env: EnvOptions,
    /// Every trial this many times, round after round (`--repeat`).
    pub repeat: usize,
    /// Parallel VMs; none: one per core.
    pub jobs: Option<usize>,
    /// `--shard K/N`: only this shard's part of the planned trials.
    pub shard: Option<crate::run::shard::Shard>,
    /// `--durations`: the results.jsonl the shards are balanced by.
    pub durations: Option<PathBuf>,
    /// `--kcidb`: a second place for the run's KCIDB document.
    pub kcidb: Option<PathBuf>,
    /// `--allow-skipped`: a run in which every trial was skipped passes.
    pub allow_skipped: bool,
}

/// What the caller hears while the run goes on.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line for the person running kloop (the accelerator, configuration
    /// notes, the ledger's warnings, what is about to run, the files
    /// written): for reading, never parsed.
    Note(String),
    /// The trials start: this many runs in all.
    TrialsStarted(usize),
    /// One run of a trial ended.
    TrialEnded(&'a TrialResult),
    /// Every run ended.
    TrialsFinished,
    /// `--repeat`: the table of each trial's runs.
    RepeatTable(String),
    /// `--repeat`: a trial whose runs disagreed, combined (FLAKY).
    Flaky(&'a TrialResult),
}

#[derive(Debug, thiserror::Error)]
pub enum VmTestError {
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error("no trials selected")]
    NoTrials,
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("preparing the test environment: {0}")]
    Environment(#[source] SuiteError),
}

/// The planned trials and, with a shard, this shard's part and the
/// manifest `merge` checks.
#[derive(Debug)]
pub struct Planned {
    pub trials: Vec<PlannedTrial>,
    pub manifest: Option<ShardManifest>,
    /// How the shard was chosen, for the user.
    pub shard_line: Option<String>,
}

/// A finished run.
#[derive(Debug)]
pub struct VmTestRun {
    /// One result per trial (with `--repeat`, the runs combined).
    pub results: Vec<TrialResult>,
    pub run_dir: PathBuf,
    /// The ledger's warnings (entries past their review date, …), said
    /// before the trials and again at the end.
    pub ledger_warnings: Vec<String>,
    pub secs: f64,
    /// `kvm` or `tcg`.
    pub accel: String,
    pub allow_skipped: bool,
    /// kloop's own peak resident memory when the run ended, in KiB.
    pub peak_rss_kib: Option<u64>,
    /// Where the wall time went (also in the run directory's
    /// [`Phases::FILE`]).
    pub phases: Phases,
}

impl VmTestRun {
    pub fn summary(&self) -> crate::report::Summary {
        crate::report::Summary::of(&self.results)
    }

    /// Whether the run passes: no failure, and (unless allowed) not every
    /// trial skipped.
    pub fn success(&self) -> bool {
        self.summary().success(self.allow_skipped)
    }
}

/// Why `bless` refuses what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlessError {
    #[error("a kernel that is not a pin is blessed as a snapshot set of its own: add `--as <name>` (then compare with `vm-test --snapshot-as <name>`); it never rewrites a pin's snapshots")]
    LocalNeedsName,
    #[error("--as names the snapshot set of a kernel that is not a pin (--kernel built:ID or --kernel-image); a pin is blessed under its own id")]
    PinTakesNoName,
    #[error("--as {0} is a pin's id: a local kernel's stream never overwrites a pin's golden snapshots; choose a new name")]
    NameIsAPin(String),
    #[error("bless does not take --baseline")]
    Baseline,
    #[error("bless writes each snapshot from one run; check that a trial is stable with `cargo xtask vm-test --repeat N` first, then bless it once")]
    Repeat,
}

/// What `bless` may write: a pin's own snapshots, or (`as_name`) the
/// snapshot set of a kernel that is not a pin, never a pin's under another
/// kernel's stream. Returns the snapshot set to compare with (`Some` for
/// `--as`).
pub fn bless_set(
    catalog: &kloop_kernels::Catalog,
    selection: &Selection,
    as_name: Option<&str>,
    baseline: bool,
    repeat: usize,
) -> Result<Option<String>, BlessError> {
    let local = selection.kernel_image.is_some()
        || selection.kernels.iter().any(|k| catalog.get(k).is_err());
    let set = match (as_name, local) {
        (None, true) => return Err(BlessError::LocalNeedsName),
        (Some(_), false) => return Err(BlessError::PinTakesNoName),
        (Some(name), true) if catalog.get(name).is_ok() => {
            return Err(BlessError::NameIsAPin(name.to_string()))
        }
        (Some(_), true) if baseline => return Err(BlessError::Baseline),
        (Some(name), true) => Some(name.to_string()),
        (None, false) => None,
    };
    if repeat > 1 {
        return Err(BlessError::Repeat);
    }
    Ok(set)
}

/// The closing lines of a `vm-test` run (without the `kloop: ` each is
/// printed with): the trials that did not pass, the ledger's warnings
/// again, where the step summary is, where the time went (its phases and
/// the saved VMs made), the totals and where the reports are, and why a
/// run of skipped trials alone fails.
pub fn closing_lines(run: &VmTestRun) -> Vec<String> {
    let summary = run.summary();
    let mut lines = crate::report::not_passed_lines(&run.results);
    lines.extend(run.ledger_warnings.iter().cloned());
    lines.push(format!(
        "step summary: {}",
        run.run_dir.join(crate::report::SUMMARY_FILE).display()
    ));
    lines.extend(crate::report::phases::lines(&run.phases));
    lines.push(format!(
        "{} in {:.1} s ({}); reports: {}",
        summary.line(),
        run.secs,
        run.accel,
        run.run_dir.display()
    ));
    if let Some(memory) = peak_memory(run) {
        lines.push(memory);
    }
    if summary.nothing_ran() && !run.allow_skipped {
        lines.push(crate::report::Summary::NOTHING_RAN.to_string());
    }
    lines
}

/// The run's peak memory: kloop's own and the largest QEMU's (with its
/// trial), the figures that show a long run stays bounded.
fn peak_memory(run: &VmTestRun) -> Option<String> {
    let qemu = run
        .results
        .iter()
        .filter_map(|r| Some((r.qemu_peak_rss_kib?, &r.id)))
        .max();
    let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);
    match (run.peak_rss_kib, qemu) {
        (Some(own), Some((q, id))) => Some(format!(
            "peak memory: kloop {}, largest QEMU {} ({id})",
            mib(own),
            mib(q)
        )),
        (Some(own), None) => Some(format!("peak memory: kloop {}", mib(own))),
        _ => None,
    }
}

/// The trials `opts` selects: the plan, cut to the shard when one is asked.
pub fn plan(layout: &Layout, opts: &VmTestOptions) -> Result<Planned, VmTestError> {
    let planned = suite::plan(layout, &opts.selection)?;
    let Some(shard) = opts.shard else {
        return Ok(Planned {
            trials: planned,
            manifest: None,
            shard_line: None,
        });
    };
    let durations = match &opts.durations {
        Some(f) => crate::run::shard::durations_from_results(
            &std::fs::read_to_string(f).at("reading --durations", f)?,
        ),
        None => Default::default(),
    };
    let ids: Vec<String> = planned.iter().map(PlannedTrial::id).collect();
    let (mine, expected) = crate::run::shard::select(&ids, shard, &durations);
    let balance = match (expected, &opts.durations) {
        (Some(s), Some(d)) => format!(", ~{s:.0} s expected (durations from {})", d.display()),
        _ => ", balanced by count".to_string(),
    };
    let shard_line = format!(
        "shard {shard}: {} of {} trial(s){balance}",
        mine.len(),
        ids.len()
    );
    let manifest = ShardManifest {
        kloop_commit: crate::run::agent::kloop_commit(&layout.root),
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
    Ok(Planned {
        trials,
        manifest: Some(manifest),
        shard_line: Some(shard_line),
    })
}

/// Runs `planned`: prepares the environment, runs every trial
/// `opts.repeat` times and writes the run's files.
pub fn run(
    layout: &Layout,
    opts: &VmTestOptions,
    planned: Planned,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<VmTestRun, VmTestError> {
    if planned.trials.is_empty() {
        return Err(VmTestError::NoTrials);
    }
    let trials = planned.trials;
    let repeat = opts.repeat.max(1);
    let mut laps = Laps::new();
    let kernels: Vec<_> = trials.iter().map(|t| t.kernel.clone()).collect();
    let (env, setup) =
        suite::prepare_env_timed(layout, &opts.env, &kernels).map_err(VmTestError::Environment)?;
    // The setup phases are inside this lap.
    laps.lap();
    if let Some(m) = &planned.manifest {
        let path = env.run_dir.join(crate::report::merge::MANIFEST);
        let text = serde_json::to_string_pretty(m).expect("a manifest serialises");
        std::fs::write(&path, text).at("writing", &path)?;
    }
    let (ledger_warnings, kernels_phase) = announce(&env, &trials, repeat, on, &setup);
    laps.lap();
    let all_runs = run_rounds(&env, &trials, repeat, opts.jobs, on);
    let trials_phase = TrialsPhase {
        secs: laps.lap(),
        runs: all_runs.len(),
        saved_vms: env
            .saved_vms
            .made()
            .into_iter()
            .map(|m| SavedVmMade {
                kernel: m.kernel,
                key: m.key,
                pin: m.pin,
                secs: m.secs,
            })
            .collect(),
        saved_vms_removed: env.saved_vms.removed(),
    };
    let artefacts: Vec<PathBuf> = all_runs.iter().map(|r| r.artefacts.clone()).collect();
    let results = combine_repeats(&env, all_runs, repeat, on)?;
    crate::report::write_files(&env.run_dir, &results).at("writing reports into", &env.run_dir)?;
    for problem in crate::report::kcidb::write_run_document(
        &layout.root,
        &env.run_dir,
        &kernels,
        &results,
        opts.kcidb.as_deref(),
    ) {
        on(Event::Note(problem));
    }
    if let Some(note) = overhead_report(layout, &env, &artefacts) {
        on(Event::Note(note));
    }
    let reports_secs = laps.lap();
    let phases = Phases {
        wall_secs: laps.total(),
        setup_secs: setup.setup_secs,
        agent_build_secs: setup.agent_build_secs,
        agent_build_beside_secs: setup.agent_build_beside_secs,
        accel_secs: setup.accel_secs,
        kernels: kernels_phase,
        trials: trials_phase,
        reports_secs,
    };
    if let Err(e) = phases.write(&env.run_dir) {
        on(Event::Note(format!(
            "writing {} into {}: {e}",
            Phases::FILE,
            env.run_dir.display()
        )));
    }
    Ok(VmTestRun {
        results,
        run_dir: env.run_dir.clone(),
        ledger_warnings,
        secs: phases.wall_secs,
        accel: env.accel.accel.clone(),
        // A shard may hold only trials its kernels skip; `merge` judges the run.
        allow_skipped: opts.allow_skipped || opts.shard.is_some(),
        peak_rss_kib: kloop_qemu::own_peak_rss_kib(),
        phases,
    })
}

/// The accelerator, the kernels fetched, configuration notes, the
/// ledger's warnings and what is about to run; returns the warnings,
/// repeated at the end, and the kernels' phase (with the probe kernel's
/// fetch, timed in `setup`).
fn announce(
    env: &TrialEnv,
    trials: &[PlannedTrial],
    repeat: usize,
    on: &(dyn Fn(Event<'_>) + Sync),
    setup: &SetupPhases,
) -> (Vec<String>, KernelsPhase) {
    on(Event::Note(format!("accelerator: {}", env.accel)));
    let started = std::time::Instant::now();
    let fetched = suite::prefetch(env, trials);
    let mut distinct: Vec<String> = trials.iter().map(|t| t.kernel.id()).collect();
    distinct.sort();
    distinct.dedup();
    let kernels = KernelsPhase {
        secs: started.elapsed().as_secs_f64() + setup.probe_fetch_secs,
        kernels: distinct.len(),
        fetched: fetched.len() + setup.probe_fetched.len(),
    };
    for note in suite::config_notes(env, trials) {
        on(Event::Note(note));
    }
    let ledger_warnings = env
        .known_issues
        .warnings(crate::judge::known_issues::Date::today());
    for w in &ledger_warnings {
        on(Event::Note(w.clone()));
    }
    on(Event::Note(if repeat > 1 {
        format!(
            "running {} trial(s) {repeat} times each ({} runs), artefacts in {}",
            trials.len(),
            trials.len() * repeat,
            env.run_dir.display()
        )
    } else {
        format!(
            "running {} trial(s), artefacts in {}",
            trials.len(),
            env.run_dir.display()
        )
    }));
    (ledger_warnings, kernels)
}

/// Runs every trial `repeat` times, round after round, so each trial's
/// runs meet different neighbours and host load.
fn run_rounds(
    env: &TrialEnv,
    trials: &[PlannedTrial],
    repeat: usize,
    jobs: Option<usize>,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Vec<TrialResult> {
    let runs: Vec<_> = (0..repeat).flat_map(|_| trials.iter().cloned()).collect();
    let jobs = suite::Parallel::from_flag(jobs);
    on(Event::TrialsStarted(runs.len()));
    // One round: longest trials first, by the last runs' times, so that the
    // parallel VMs finish together. Rounds of a repeat keep their order.
    let order = if repeat > 1 {
        (0..runs.len()).collect()
    } else {
        let runs_root = env.run_dir.parent().unwrap_or(&env.run_dir);
        suite::longest_first(
            &runs,
            &crate::workspace::run_dirs::past_wall_times(runs_root, &env.run_dir),
        )
    };
    let all_runs = suite::run_in_order(env, &runs, &order, jobs, &|r| on(Event::TrialEnded(r)));
    on(Event::TrialsFinished);
    all_runs
}

/// With `--repeat`: writes every run and the per-trial comparison, tells
/// the table and the FLAKY trials, and returns one combined result per
/// trial; otherwise the runs as they are.
fn combine_repeats(
    env: &TrialEnv,
    all_runs: Vec<TrialResult>,
    repeat: usize,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<TrialResult>, VmTestError> {
    if repeat <= 1 {
        return Ok(all_runs);
    }
    crate::report::write_runs(&env.run_dir, &all_runs)
        .at("writing runs.jsonl into", &env.run_dir)?;
    let grouped = crate::run::repeat::group(all_runs, &env.known_issues);
    crate::run::repeat::write_report(&env.run_dir, &grouped)
        .at("writing repeat.json into", &env.run_dir)?;
    on(Event::RepeatTable(crate::run::repeat::table(&grouped)));
    let combined: Vec<_> = grouped.iter().filter_map(|t| t.combined()).collect();
    for r in combined
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Flaky(_)))
    {
        on(Event::Flaky(r));
    }
    Ok(combined)
}

/// The run's overhead table and plot under target/kloop/report, if it
/// measured any; a failure to write them is told, not fatal.
fn overhead_report(layout: &Layout, env: &TrialEnv, artefacts: &[PathBuf]) -> Option<String> {
    let run_name = env
        .run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let report_dir = layout.root.join("target/kloop/report");
    match crate::report::overhead::write_run_report(&report_dir, &run_name, artefacts) {
        Ok(Some((md, svg))) => Some(format!(
            "overhead table {} and plot {}",
            md.display(),
            svg.display()
        )),
        Ok(None) => None,
        Err(e) => Some(format!(
            "writing the overhead report into {}: {e}",
            report_dir.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::trial::TrialResult;

    fn result(kernel: &str, verdict: Verdict) -> TrialResult {
        TrialResult::for_test(kernel, "basic", verdict, "/tmp/a")
    }

    /// The closing lines name what did not pass, repeat the ledger's
    /// warnings and give the totals; a run of skipped trials alone ends by
    /// saying why it fails, unless skipping was allowed.
    #[test]
    fn closing_lines_of_a_run() {
        let run = |results: Vec<TrialResult>, allow_skipped: bool| VmTestRun {
            results,
            run_dir: "/tmp/runs/1-2".into(),
            ledger_warnings: vec!["entry x is past its review date".into()],
            secs: 12.34,
            accel: "tcg".into(),
            allow_skipped,
            peak_rss_kib: None,
            phases: Phases {
                wall_secs: 12.34,
                ..Phases::default()
            },
        };
        let mixed = run(
            vec![
                result("6.1", Verdict::Ok),
                result("5.10", Verdict::Skipped("CONFIG_BPF_JIT is not set".into())),
            ],
            false,
        );
        let lines = closing_lines(&mixed);
        assert!(lines[0].starts_with("5.10/basic: SKIPPED"), "{lines:?}");
        assert_eq!(lines[1], "entry x is past its review date");
        assert_eq!(lines[2], "step summary: /tmp/runs/1-2/summary.md");
        assert_eq!(lines[3..5], crate::report::phases::lines(&mixed.phases));
        assert!(
            lines[5].ends_with("in 12.3 s (tcg); reports: /tmp/runs/1-2"),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 6);
        assert!(mixed.success());
        let skipped = || {
            vec![result(
                "5.10",
                Verdict::Skipped("CONFIG_BPF_JIT is not set".into()),
            )]
        };
        let nothing = run(skipped(), false);
        assert_eq!(
            closing_lines(&nothing).last().unwrap(),
            crate::report::Summary::NOTHING_RAN
        );
        assert!(!nothing.success());
        let allowed = run(skipped(), true);
        assert_ne!(
            closing_lines(&allowed).last().unwrap(),
            crate::report::Summary::NOTHING_RAN
        );
        assert!(allowed.success());
    }

    /// A pin is blessed under its own id, a local kernel only under a new
    /// name of its own; never with --baseline or --repeat.
    #[test]
    fn what_bless_may_write() {
        let root = crate::workspace::workspace_root();
        let catalog = kloop_kernels::Catalog::load(&root.join("kernels")).unwrap();
        let pin = catalog.pins()[0].id.clone();
        let sel = |kernels: &[&str], image: bool| Selection {
            kernels: kernels.iter().map(|k| k.to_string()).collect(),
            kernel_image: image.then(|| "/boot/vmlinuz".into()),
            ..Selection::default()
        };
        assert_eq!(
            bless_set(&catalog, &sel(&[&pin], false), None, false, 1),
            Ok(None)
        );
        assert_eq!(
            bless_set(&catalog, &sel(&[&pin], false), Some("mine"), false, 1),
            Err(BlessError::PinTakesNoName)
        );
        assert_eq!(
            bless_set(&catalog, &sel(&["built:abc"], false), None, false, 1),
            Err(BlessError::LocalNeedsName)
        );
        assert_eq!(
            bless_set(&catalog, &sel(&[], true), Some("mine"), false, 1),
            Ok(Some("mine".to_string()))
        );
        assert_eq!(
            bless_set(&catalog, &sel(&[], true), Some(&pin), false, 1),
            Err(BlessError::NameIsAPin(pin.clone()))
        );
        assert_eq!(
            bless_set(&catalog, &sel(&[], true), Some("mine"), true, 1),
            Err(BlessError::Baseline)
        );
        assert_eq!(
            bless_set(&catalog, &sel(&[&pin], false), None, false, 3),
            Err(BlessError::Repeat)
        );
    }
}
