use super::*;

fn timings(fixture: &str, functions: u32, l: u32, load: &[u64], unload: &[u64]) -> Timings {
    Timings {
        fixture: fixture.into(),
        program: format!("kloop_{fixture}"),
        functions,
        listeners_per_cpu: l,
        load_ns: load.to_vec(),
        unload_ns: unload.to_vec(),
    }
}

#[test]
fn stats_median_quartiles_mad() {
    let s = Stats::of(&[7, 1, 3, 5, 9]).unwrap();
    assert_eq!(
        (s.n, s.median, s.q1, s.q3, s.mad, s.min, s.max),
        (5, 5.0, 3.0, 7.0, 2.0, 1, 9)
    );
    assert_eq!(s.iqr(), 4.0);
    // Even count: interpolated median and quartiles.
    let s = Stats::of(&[10, 20, 30, 40]).unwrap();
    assert_eq!((s.median, s.q1, s.q3), (25.0, 17.5, 32.5));
    // |x - 25| = 15, 5, 5, 15 -> median 10.
    assert_eq!(s.mad, 10.0);
    let s = Stats::of(&[42]).unwrap();
    assert_eq!((s.median, s.q1, s.q3, s.mad), (42.0, 42.0, 42.0, 0.0));
    assert!(Stats::of(&[]).is_none());
    // An outlier moves neither the median nor the MAD.
    let s = Stats::of(&[100, 101, 102, 103, 1_000_000]).unwrap();
    assert_eq!((s.median, s.mad, s.max), (102.0, 1.0, 1_000_000));
}

pub(crate) fn sample_points() -> Vec<Point> {
    [
        timings("basic", 1, 0, &[100, 100, 102], &[10, 10, 10]),
        timings("basic", 1, 1, &[103, 103, 104], &[20, 20, 21]),
        timings("basic", 1, 8, &[124, 124, 130], &[90, 90, 90]),
    ]
    .iter()
    .filter_map(Point::of)
    .collect()
}

#[test]
fn figures_are_medians_ratios_and_counts() {
    let f = figures(&sample_points());
    let got: Vec<(&str, f64)> = f.iter().map(|f| (f.name.as_str(), f.value)).collect();
    assert_eq!(
        got,
        vec![
            ("basic/functions", 1.0),
            ("basic/load/L0", 100.0),
            ("basic/unload/L0", 10.0),
            ("basic/load/L1", 103.0),
            ("basic/load/L1:L0", 1.03),
            ("basic/unload/L1", 20.0),
            ("basic/unload/L1:L0", 2.0),
            ("basic/load/L8", 124.0),
            ("basic/load/L8:L0", 1.24),
            ("basic/unload/L8", 90.0),
            ("basic/unload/L8:L0", 9.0),
        ]
    );
}

fn golden(figures: &[(&str, f64)]) -> ClockBudget {
    ClockBudget {
        clock: Clock::Icount.label().into(),
        iterations: 3,
        median_tolerance: 0.01,
        ratio_tolerance: 0.02,
        figures: figures.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
    }
}

fn fig(name: &str, kind: FigureKind, value: f64) -> Figure {
    Figure {
        name: name.into(),
        kind,
        value,
    }
}

#[test]
fn compare_uses_relative_bands_and_exact_counts() {
    let budget = golden(&[
        ("basic/functions", 1.0),
        ("basic/load/L0", 1000.0),
        ("basic/load/L1", 1000.0),
        ("basic/load/L1:L0", 1.5),
        ("basic/unload/L0", 50.0),
    ]);
    let now = vec![
        fig("basic/functions", FigureKind::Count, 2.0),
        // Exactly on the edge of ±1%: inside.
        fig("basic/load/L0", FigureKind::Median, 1010.0),
        // 1.1% off: outside.
        fig("basic/load/L1", FigureKind::Median, 989.0),
        // Ratio band is ±2%: 1.5 × 1.02 = 1.53.
        fig("basic/load/L1:L0", FigureKind::Ratio, 1.53),
        fig("basic/load/L8", FigureKind::Median, 7.0),
    ];
    let rows = compare(&budget, &now);
    let verdicts: Vec<(&str, bool)> = rows.iter().map(|r| (r.figure.as_str(), r.ok)).collect();
    assert_eq!(
        verdicts,
        vec![
            ("basic/functions", false),
            ("basic/load/L0", true),
            ("basic/load/L1", false),
            ("basic/load/L1:L0", true),
            ("basic/load/L8", false),
            ("basic/unload/L0", false),
        ]
    );
    assert_eq!(rows[1].ratio(), Some(1.01));
    assert_eq!(rows[0].tolerance, 0.0);
    assert_eq!(rows[3].tolerance, 0.02);
    assert_eq!(rows[4].golden, None);
    assert_eq!((rows[5].now, rows[5].tolerance), (None, 0.01));
    let t = table(&rows);
    assert!(t.contains("basic/load/L1"), "{t}");
    assert!(
        t.lines().any(|l| l.contains("basic/load/L1 ")
            && l.contains("989")
            && l.contains("0.9890")
            && l.contains("OUT OF BAND")),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.contains("basic/load/L8") && l.ends_with("NO GOLDEN")),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.contains("basic/unload/L0") && l.ends_with("NOT MEASURED")),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.contains("basic/functions") && l.contains("exact")),
        "{t}"
    );
}

#[test]
fn one_extra_listener_leaves_the_band() {
    // Golden from a run; then the same kernel measured with one listener
    // per CPU more everywhere (L0 behaves like L1): the L0 medians must
    // fall out of a ±1% band, since one listener costs 3% here.
    let points = sample_points();
    let budget = golden(
        &figures(&points)
            .iter()
            .map(|f| (f.name.as_str(), f.value))
            .collect::<Vec<_>>(),
    );
    let shifted: Vec<Figure> = figures(&points)
        .into_iter()
        .map(|mut f| {
            if f.name == "basic/load/L0" {
                f.value = 103.0;
            }
            f
        })
        .collect();
    let bad: Vec<String> = compare(&budget, &shifted)
        .into_iter()
        .filter(|r| !r.ok)
        .map(|r| r.figure)
        .collect();
    assert_eq!(bad, vec!["basic/load/L0".to_string()]);
    let s = sensitivity(&points, 0.01);
    let load = s.iter().find(|s| s.op == "load").unwrap();
    assert!((load.first_listener - 0.03).abs() < 1e-12);
    let (n, more) = load.one_more_at_max.unwrap();
    assert_eq!(n, 8);
    // (124 - 100) / 8 / 124
    assert!((more - 3.0 / 124.0).abs() < 1e-12);
    assert!(load.seen());
    let tight = sensitivity(&points, 0.05);
    assert!(!tight[0].seen());
}

#[test]
fn budget_round_trips_and_bless_keeps_tolerances() {
    let figures = figures(&sample_points());
    let b = Budget::blessed(None, "6.1", "6.1.0-x", Clock::Icount, 3, &figures);
    let icount = b.icount.as_ref().unwrap();
    assert_eq!(icount.median_tolerance, ICOUNT_TOLERANCE);
    assert_eq!(icount.figures["basic/load/L8:L0"], 1.24);
    assert!(b.kvm.is_none());
    let text = b.to_toml();
    assert!(
        text.starts_with("# Overhead budget of kernel pin 6.1"),
        "{text}"
    );
    let parsed = Budget::parse(&text).unwrap();
    assert_eq!(parsed, b);
    // Hand-set tolerance survives; another clock's section is added.
    let mut edited = parsed;
    edited.icount.as_mut().unwrap().median_tolerance = 0.02;
    let again = Budget::blessed(Some(edited), "6.1", "6.1.0-y", Clock::Icount, 3, &figures);
    assert_eq!(again.icount.as_ref().unwrap().median_tolerance, 0.02);
    assert_eq!(again.guest_release, "6.1.0-y");
    let kvm = Budget::blessed(Some(again), "6.1", "6.1.0-y", Clock::Kvm, 3, &figures);
    assert_eq!(
        kvm.kvm.as_ref().unwrap().median_tolerance,
        REAL_TIME_MEDIAN_TOLERANCE
    );
    assert_eq!(kvm.kvm.as_ref().unwrap().clock, "real time (KVM)");
    assert!(kvm.icount.is_some());
    assert!(Budget::parse("pin = \"6.1\"\nbogus = 1\n").is_err());
}

#[test]
fn clocks_and_rounding() {
    assert_eq!(Clock::of(Accel::Tcg, true), Clock::Icount);
    assert_eq!(Clock::of(Accel::Tcg, false), Clock::Tcg);
    assert_eq!(Clock::of(Accel::Kvm, true), Clock::Kvm);
    assert_eq!(
        round_figure(&fig("x", FigureKind::Median, 70609.04)),
        70609.0
    );
    assert_eq!(
        round_figure(&fig("x", FigureKind::Ratio, 1.0301234)),
        1.03012
    );
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
    let e = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, art.path()).unwrap_err();
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
    std::env::set_var(BLESS_ENV, "1");
    let blessed = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, art.path());
    std::env::remove_var(BLESS_ENV);
    blessed.unwrap();
    let budget =
        Budget::parse(&std::fs::read_to_string(dir.path().join("budgets/6.1.toml")).unwrap())
            .unwrap();
    assert_eq!(
        budget.icount.as_ref().unwrap().figures["basic/load/L1:L0"],
        1.03
    );
    check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Tcg, art.path()).unwrap();

    // The same figures measured under KVM have no golden: what does not
    // depend on the clock is judged, and the note says the rest was not.
    let note = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Kvm, art.path())
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
        art.path(),
    )
    .unwrap_err();
    assert!(e.contains("no [kvm] section, so absolute figures"), "{e}");
    assert!(e.contains("basic/load/L1:L0"), "{e}");

    // One listener more: L0 load now costs what L1 did.
    let mut slower = ev.clone();
    slower.timings[0].load_ns = vec![103, 103, 104];
    let e = check_trial(&s, &slower, "6.1", Some("6.1"), Accel::Tcg, art.path()).unwrap_err();
    assert!(e.contains("2 figure(s) left their band"), "{e}");
    assert!(
        e.contains("basic/load/L0") && e.contains("basic/load/L1:L0"),
        "{e}"
    );

    // Missing iterations are a failure of their own.
    let mut short = ev;
    short.timings[1].unload_ns.pop();
    let e = check_trial(&s, &short, "6.1", Some("6.1"), Accel::Tcg, art.path()).unwrap_err();
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
        art.path(),
    )
    .unwrap();
    assert!(!art.path().join(TRIAL_FILE).exists());
}

#[test]
fn icount_reaches_qemu_argv_under_tcg_only() {
    use kloop_qemu::{Deadlines, VmConfig};
    let mut cfg = VmConfig {
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

#[test]
fn a_clock_without_a_budget_judges_only_what_does_not_depend_on_the_clock() {
    // The real 6.1 budget has only [icount]: a KVM run is compared with it
    // for function counts and the direction of the listener ratios only.
    let root = kloop_root();
    let budget = Budget::parse(
        &std::fs::read_to_string(root.join("scenarios/overhead/budgets/6.1.toml")).unwrap(),
    )
    .unwrap();
    assert!(budget.for_clock(Clock::Kvm).is_none());
    let kvm_figures = vec![
        fig("basic/functions", FigureKind::Count, 1.0),
        fig("funcs32/functions", FigureKind::Count, 32.0),
        fig("basic/unload/L1", FigureKind::Median, 900.0),
        fig("basic/unload/L8", FigureKind::Median, 2500.0),
        fig("basic/unload/L1:L0", FigureKind::Ratio, 1.4),
    ];
    assert_eq!(
        clock_independent(&budget, &kvm_figures),
        Vec::<String>::new()
    );
    let mut wrong = kvm_figures.clone();
    wrong[1].value = 31.0;
    wrong[3].value = 500.0;
    wrong[4].value = 0.5;
    let problems = clock_independent(&budget, &wrong);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("funcs32/functions: 31 function(s), the budget says 32"));
    assert!(problems.iter().any(|p| p.contains("basic/unload/L1:L0")));
    assert!(problems
        .iter()
        .any(|p| p.contains("eight listeners per CPU cost less than one")));
}

fn kloop_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}
