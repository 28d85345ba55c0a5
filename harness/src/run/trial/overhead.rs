//! The files around a trial's overhead judging: the pin's budget is read
//! (and, under `bless --overhead`, written), the trial's `overhead.json`
//! left in its artefacts, and a run's records collected for the report.
//! The judging itself is `kloop_judge::overhead::judge_trial`, which does no
//! I/O.

use std::path::{Path, PathBuf};

use kloop_judge::evidence::RunEvidence;
use kloop_judge::overhead::{judge_trial, Budget, Clock, TrialInputs, TrialOverhead};
use kloop_qemu::Accel;

use crate::scenario::Scenario;

/// Name of the per-trial record of the measurement.
pub const TRIAL_FILE: &str = "overhead.json";

/// The clock a guest's timings count in.
pub fn clock(accel: Accel, icount: bool) -> Clock {
    match (accel, icount) {
        (Accel::Tcg, true) => Clock::Icount,
        (Accel::Tcg, false) => Clock::Tcg,
        (Accel::Kvm, _) => Clock::Kvm,
    }
}

/// The trial hook: for a scenario with `measure` steps, judges the timings
/// against the budget of `budget_pin` (or, when `bless`, rewrites it) and
/// leaves `overhead.json` in `artefacts`. `Err` is the failure message;
/// `Ok(Some(note))` a line for the trial report.
pub fn check_trial(
    scenario: &Scenario,
    evidence: &RunEvidence,
    kernel: &str,
    budget_pin: Option<&str>,
    accel: Accel,
    bless: bool,
    artefacts: &Path,
) -> Result<Option<String>, String> {
    let budget = match budget_pin {
        Some(pin) => {
            let path = Budget::path(&scenario.dir, pin);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => Some(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("reading {}: {e}", path.display())),
            };
            Some((path, text))
        }
        None => None,
    };
    let inputs = TrialInputs {
        scenario: &scenario.name,
        steps: &scenario.plan.steps,
        clock: clock(accel, scenario.vm.icount),
        kernel,
        budget_pin,
        budget,
        bless,
    };
    let judged = judge_trial(&inputs, evidence);
    if let (Some(text), Some((path, _))) = (&judged.blessed_budget, &inputs.budget) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(record) = &judged.record {
        if let Ok(json) = serde_json::to_string_pretty(record) {
            let _ = std::fs::write(artefacts.join(TRIAL_FILE), json);
        }
    }
    judged.outcome
}

/// Every `overhead.json` left by the trials in `artefacts` directories.
pub fn collect(artefacts: &[PathBuf]) -> Vec<TrialOverhead> {
    artefacts
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join(TRIAL_FILE)).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_judge::overhead::samples::timings;

    #[test]
    fn clocks() {
        assert_eq!(clock(Accel::Tcg, true), Clock::Icount);
        assert_eq!(clock(Accel::Tcg, false), Clock::Tcg);
        assert_eq!(clock(Accel::Kvm, true), Clock::Kvm);
    }

    fn scenario(dir: &Path, steps: &str) -> Scenario {
        std::fs::write(
            dir.join("scenario.toml"),
            format!("description = \"t\"\n[vm]\nicount = true\ncpus = 1\n{steps}"),
        )
        .unwrap();
        Scenario::load(dir).unwrap()
    }

    const MEASURE: &str = "[[steps]]\nop = \"measure\"\nfixture = \"basic\"\nprogram = \"kloop_basic\"\nlisteners_per_cpu = 0\nwarmup = 1\niterations = 3\n[[steps]]\nop = \"measure\"\nfixture = \"basic\"\nprogram = \"kloop_basic\"\nlisteners_per_cpu = 1\nwarmup = 1\niterations = 3\n";

    fn evidence() -> RunEvidence {
        RunEvidence {
            timings: vec![
                timings("basic", 1, 0, &[100, 100, 102], &[10, 10, 10]),
                timings("basic", 1, 1, &[103, 103, 104], &[20, 20, 21]),
            ],
            ..RunEvidence::default()
        }
    }

    #[test]
    fn trial_hook_fails_without_budget_then_blesses_and_compares() {
        let dir = tempfile::tempdir().unwrap();
        let s = scenario(dir.path(), MEASURE);
        assert!(s.vm.icount);
        assert_eq!(s.vm.cpus, Some(1));
        let art = tempfile::tempdir().unwrap();
        let ev = evidence();
        let e =
            check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, false, art.path()).unwrap_err();
        assert!(e.contains("no budget for kernel pin 6.1"), "{e}");
        assert!(
            e.contains("cargo xtask bless --overhead --kernel 6.1 --scenario"),
            "{e}"
        );
        let record: TrialOverhead =
            serde_json::from_str(&std::fs::read_to_string(art.path().join(TRIAL_FILE)).unwrap())
                .unwrap();
        assert_eq!(record.clock, Clock::Icount);
        assert_eq!(record.points.len(), 2);

        // Bless (what `cargo xtask bless --overhead` does), then compare.
        let blessed = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, true, art.path());
        blessed.unwrap();
        let budget =
            Budget::parse(&std::fs::read_to_string(dir.path().join("budgets/6.1.toml")).unwrap())
                .unwrap();
        assert_eq!(
            budget.icount.as_ref().unwrap().figures["basic/load/L1:L0"],
            1.03
        );
        check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, false, art.path()).unwrap();

        // The same figures measured under KVM have no golden: what does not
        // depend on the clock is judged, and the note says the rest was not.
        let note = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Kvm, false, art.path())
            .unwrap()
            .expect("a note");
        assert!(
            note.contains("no [kvm] budget for pin 6.1: absolute figures not compared"),
            "{note}"
        );
        let mut cheaper_with_listeners = ev.clone();
        cheaper_with_listeners.timings[1].load_ns = vec![50, 50, 51];
        let e = check_trial(
            &s,
            &cheaper_with_listeners,
            "6.1",
            Some("6.1"),
            Accel::Kvm,
            false,
            art.path(),
        )
        .unwrap_err();
        assert!(e.contains("no [kvm] section, so absolute figures"), "{e}");
        assert!(e.contains("basic/load/L1:L0"), "{e}");

        // One listener more: L0 load now costs what L1 did.
        let mut slower = ev.clone();
        slower.timings[0].load_ns = vec![103, 103, 104];
        let e = check_trial(
            &s,
            &slower,
            "6.1",
            Some("6.1"),
            Accel::Tcg,
            false,
            art.path(),
        )
        .unwrap_err();
        assert!(e.contains("2 figure(s) left their band"), "{e}");
        assert!(
            e.contains("basic/load/L0") && e.contains("basic/load/L1:L0"),
            "{e}"
        );

        // Missing iterations are a failure of their own.
        let mut short = ev;
        short.timings[1].unload_ns.pop();
        let e = check_trial(
            &s,
            &short,
            "6.1",
            Some("6.1"),
            Accel::Tcg,
            false,
            art.path(),
        )
        .unwrap_err();
        assert!(e.contains("measure steps"), "{e}");
    }

    #[test]
    fn scenarios_without_measure_steps_pass_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let s = scenario(dir.path(), "[[steps]]\nop = \"drain\"\n");
        let art = tempfile::tempdir().unwrap();
        check_trial(
            &s,
            &RunEvidence::default(),
            "6.1",
            Some("6.1"),
            Accel::Tcg,
            false,
            art.path(),
        )
        .unwrap();
        assert!(!art.path().join(TRIAL_FILE).exists());
    }

    #[test]
    fn icount_reaches_qemu_argv_under_tcg_only() {
        use kloop_qemu::{Deadlines, VmConfig};
        let mut cfg = VmConfig {
            arch: kloop_protocol::Arch::X86_64,
            qemu: "/q".into(),
            kernel: "/k".into(),
            initramfs: None,
            accel: Accel::Tcg,
            cpus: 1,
            memory_mib: 256,
            cmdline: vec![],
            artefacts: "/a".into(),
            deadlines: Deadlines::for_accel(Accel::Tcg),
            data_channel: false,
            icount: true,
            channel_limit: kloop_qemu::DEFAULT_CHANNEL_LIMIT,
            start: Default::default(),
            console: Default::default(),
        };
        let argv = |c: &VmConfig| -> Vec<String> {
            c.argv(Path::new("/q.sock"), Path::new("/d.sock"))
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        let a = argv(&cfg);
        let at = a.iter().position(|x| x == "-icount").unwrap();
        assert_eq!(a[at + 1], "shift=0,sleep=off");
        cfg.icount = false;
        assert!(!argv(&cfg).contains(&"-icount".to_string()));
        cfg.icount = true;
        cfg.accel = Accel::Kvm;
        assert!(!argv(&cfg).contains(&"-icount".to_string()));
    }
}
