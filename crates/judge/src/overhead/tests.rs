use super::samples::*;
use super::*;

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
fn figures_round_to_what_a_budget_keeps() {
    assert_eq!(
        round_figure(&fig("x", FigureKind::Median, 70609.04)),
        70609.0
    );
    assert_eq!(
        round_figure(&fig("x", FigureKind::Ratio, 1.0301234)),
        1.03012
    );
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
    // crates/judge → the workspace.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}
