//! Overhead: what the kernel path that emits KSYMBOL / BPF_EVENT costs, and
//! whether that cost stayed inside its golden budget.
//!
//! The guest's `measure` steps time load and unload of a program with N
//! extra listeners per CPU ([`Timings`]). Here they become statistics
//! ([`Stats`]: median, quartiles, MAD, min, max), then *figures*: the median
//! load / unload time per program × listeners (`basic/load/L0`, ns) and its
//! ratio to the same program with no listener (`basic/load/L8:L0`), plus the
//! program's JITed function count (`funcs32/functions`).
//!
//! Figures are compared with a per-pin budget,
//! `scenarios/<scenario>/budgets/<pin>.toml`, one section per clock: under
//! TCG with `-icount` the guest clock counts instructions and medians repeat
//! within a fraction of a percent, so the band is narrow; under KVM (or TCG
//! without icount) the figures are real time and the band is wide. A figure
//! outside its band fails the trial with a table (figure, golden, now,
//! now/golden). `cargo xtask bless --overhead` rewrites budgets from a run
//! (it sets [`BLESS_ENV`]); nothing else touches them.
//!
//! Each measuring trial leaves `overhead.json` ([`TrialOverhead`]) in its
//! artefact directory; [`write_run_report`] turns those of a run into a
//! Markdown table and an SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kloop_protocol::Step;
use serde::{Deserialize, Serialize};

use crate::evidence::{RunEvidence, Timings};
use crate::scenario::Scenario;
use crate::vm::Accel;

/// Set (to anything) by `cargo xtask bless --overhead`: trials write their
/// budgets from the run instead of comparing with them.
pub const BLESS_ENV: &str = "KLOOP_BLESS_OVERHEAD";

/// Name of the per-trial record of the measurement.
pub const TRIAL_FILE: &str = "overhead.json";

/// Default relative band of a median / ratio under TCG -icount: the 1% two
/// runs of a kernel must agree within. Four boots of each pin (nokaslr)
/// agreed within 0.03-0.40%; one extra listener per CPU moves every unload
/// median by 10% or more (also on top of 8), load medians by 0.3-3%.
pub const ICOUNT_TOLERANCE: f64 = 0.01;
/// Default bands for real-time clocks (KVM, TCG without icount): medians
/// move with the host, ratios to 0 listeners much less.
pub const REAL_TIME_MEDIAN_TOLERANCE: f64 = 0.30;
pub const REAL_TIME_RATIO_TOLERANCE: f64 = 0.10;

// ---------------------------------------------------------------- statistics

/// Summary of one series of durations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    /// First and third quartile (linear interpolation between order statistics).
    pub q1: f64,
    pub q3: f64,
    /// Median absolute deviation from the median (unscaled).
    pub mad: f64,
    pub min: u64,
    pub max: u64,
}

/// The `p`-quantile of sorted `v` (`0 <= p <= 1`), interpolating linearly
/// between the order statistics at `(n - 1) p` (R's type 7).
fn quantile(v: &[f64], p: f64) -> f64 {
    let h = (v.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

impl Stats {
    pub fn of(values: &[u64]) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
        v.sort_by(f64::total_cmp);
        let median = quantile(&v, 0.5);
        let mut dev: Vec<f64> = v.iter().map(|x| (x - median).abs()).collect();
        dev.sort_by(f64::total_cmp);
        Some(Stats {
            n: v.len(),
            median,
            q1: quantile(&v, 0.25),
            q3: quantile(&v, 0.75),
            mad: quantile(&dev, 0.5),
            min: *values.iter().min().expect("not empty"),
            max: *values.iter().max().expect("not empty"),
        })
    }

    pub fn iqr(&self) -> f64 {
        self.q3 - self.q1
    }
}

/// One `measure` step, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub fixture: String,
    pub program: String,
    pub functions: u32,
    pub listeners_per_cpu: u32,
    pub load: Stats,
    pub unload: Stats,
}

impl Point {
    pub fn of(t: &Timings) -> Option<Point> {
        Some(Point {
            fixture: t.fixture.clone(),
            program: t.program.clone(),
            functions: t.functions,
            listeners_per_cpu: t.listeners_per_cpu,
            load: Stats::of(&t.load_ns)?,
            unload: Stats::of(&t.unload_ns)?,
        })
    }
}

// ---------------------------------------------------------------- clocks

/// What the guest's `CLOCK_MONOTONIC` measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Clock {
    /// TCG with `-icount shift=0`: one ns per guest instruction, repeatable.
    Icount,
    /// Real time under KVM.
    Kvm,
    /// Real time under TCG without icount.
    Tcg,
}

impl Clock {
    pub fn of(accel: Accel, icount: bool) -> Clock {
        match (accel, icount) {
            (Accel::Tcg, true) => Clock::Icount,
            (Accel::Tcg, false) => Clock::Tcg,
            (Accel::Kvm, _) => Clock::Kvm,
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Clock::Icount => "icount",
            Clock::Kvm => "kvm",
            Clock::Tcg => "tcg",
        }
    }

    /// How figures measured with this clock are labelled.
    pub fn label(self) -> &'static str {
        match self {
            Clock::Icount => "guest instructions (TCG -icount shift=0: 1 ns = 1 instruction)",
            Clock::Kvm => "real time (KVM)",
            Clock::Tcg => "real time (TCG without -icount)",
        }
    }

    fn default_tolerances(self) -> (f64, f64) {
        match self {
            Clock::Icount => (ICOUNT_TOLERANCE, ICOUNT_TOLERANCE),
            Clock::Kvm | Clock::Tcg => (REAL_TIME_MEDIAN_TOLERANCE, REAL_TIME_RATIO_TOLERANCE),
        }
    }
}

// ---------------------------------------------------------------- figures

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FigureKind {
    /// Median duration in ns.
    Median,
    /// Median with N listeners per CPU over the median with none.
    Ratio,
    /// JITed functions: must match exactly.
    Count,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub name: String,
    pub kind: FigureKind,
    pub value: f64,
}

/// Which duration of a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Load,
    Unload,
}

impl Op {
    pub const ALL: [Op; 2] = [Op::Load, Op::Unload];

    pub fn name(self) -> &'static str {
        match self {
            Op::Load => "load",
            Op::Unload => "unload",
        }
    }

    pub fn of(self, p: &Point) -> &Stats {
        match self {
            Op::Load => &p.load,
            Op::Unload => &p.unload,
        }
    }
}

/// The point with no listener for the same fixture and program.
fn baseline<'a>(points: &'a [Point], p: &Point) -> Option<&'a Point> {
    points
        .iter()
        .find(|b| b.fixture == p.fixture && b.program == p.program && b.listeners_per_cpu == 0)
}

/// Figures of a measurement, in plan order: per fixture its function count,
/// then per point and op the median and (listeners > 0) the ratio to none.
pub fn figures(points: &[Point]) -> Vec<Figure> {
    let mut out: Vec<Figure> = Vec::new();
    for p in points {
        let counted = format!("{}/functions", p.fixture);
        if !out.iter().any(|f| f.name == counted) {
            out.push(Figure {
                name: counted,
                kind: FigureKind::Count,
                value: f64::from(p.functions),
            });
        }
        for op in Op::ALL {
            let median = op.of(p).median;
            out.push(Figure {
                name: format!("{}/{}/L{}", p.fixture, op.name(), p.listeners_per_cpu),
                kind: FigureKind::Median,
                value: median,
            });
            if p.listeners_per_cpu == 0 {
                continue;
            }
            if let Some(b) = baseline(points, p) {
                out.push(Figure {
                    name: format!("{}/{}/L{}:L0", p.fixture, op.name(), p.listeners_per_cpu),
                    kind: FigureKind::Ratio,
                    value: median / op.of(b).median,
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------- budgets

/// `scenarios/<scenario>/budgets/<pin>.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub pin: String,
    /// `uname -r` of the guest the budget was blessed from.
    #[serde(default)]
    pub guest_release: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icount: Option<ClockBudget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<ClockBudget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcg: Option<ClockBudget>,
}

/// The golden figures for one clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockBudget {
    /// What the numbers are (from [`Clock::label`]); informative.
    pub clock: String,
    /// Timed iterations per point when blessed; informative.
    pub iterations: u32,
    /// Allowed relative distance of a median from its golden value.
    pub median_tolerance: f64,
    /// Allowed relative distance of a ratio from its golden value.
    pub ratio_tolerance: f64,
    /// Figure name → golden value.
    pub figures: BTreeMap<String, f64>,
}

impl Budget {
    pub fn path(scenario_dir: &Path, pin: &str) -> PathBuf {
        scenario_dir.join("budgets").join(format!("{pin}.toml"))
    }

    pub fn parse(text: &str) -> Result<Budget, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn for_clock(&self, clock: Clock) -> Option<&ClockBudget> {
        match clock {
            Clock::Icount => self.icount.as_ref(),
            Clock::Kvm => self.kvm.as_ref(),
            Clock::Tcg => self.tcg.as_ref(),
        }
    }

    fn slot(&mut self, clock: Clock) -> &mut Option<ClockBudget> {
        match clock {
            Clock::Icount => &mut self.icount,
            Clock::Kvm => &mut self.kvm,
            Clock::Tcg => &mut self.tcg,
        }
    }

    /// This budget with `clock`'s figures replaced by `figures`; the other
    /// clocks and any hand-set tolerances of `clock` are kept.
    pub fn blessed(
        previous: Option<Budget>,
        pin: &str,
        guest_release: &str,
        clock: Clock,
        iterations: u32,
        figures: &[Figure],
    ) -> Budget {
        let mut b = previous.unwrap_or(Budget {
            pin: pin.to_string(),
            guest_release: String::new(),
            icount: None,
            kvm: None,
            tcg: None,
        });
        b.pin = pin.to_string();
        b.guest_release = guest_release.to_string();
        let (median_tolerance, ratio_tolerance) = b
            .for_clock(clock)
            .map(|c| (c.median_tolerance, c.ratio_tolerance))
            .unwrap_or_else(|| clock.default_tolerances());
        *b.slot(clock) = Some(ClockBudget {
            clock: clock.label().to_string(),
            iterations,
            median_tolerance,
            ratio_tolerance,
            figures: figures
                .iter()
                .map(|f| (f.name.clone(), round_figure(f)))
                .collect(),
        });
        b
    }

    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a budget always serialises");
        format!(
            "# Overhead budget of kernel pin {}: golden medians (ns) and ratios to 0 listeners\n\
             # of the overhead scenario, per clock. Written by `cargo xtask bless --overhead`\n\
             # from a real run; the tolerances (relative) may be edited by hand and survive a bless.\n\n{body}",
            self.pin
        )
    }
}

/// Medians to 0.1 ns, ratios to 5 decimals: stable files, no false precision.
fn round_figure(f: &Figure) -> f64 {
    let scale = match f.kind {
        FigureKind::Median => 10.0,
        FigureKind::Ratio => 100_000.0,
        FigureKind::Count => 1.0,
    };
    (f.value * scale).round() / scale
}

/// One line of the comparison table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub figure: String,
    pub golden: Option<f64>,
    pub now: Option<f64>,
    /// Relative band (0 for exact figures).
    pub tolerance: f64,
    pub ok: bool,
}

/// `now / golden` for a table, `-` when there is none.
fn ratio_text(r: &Row) -> String {
    r.ratio().map_or("-".into(), |x| format!("{x:.4}"))
}

/// A figure's band: `exact`, or `±x%` with `decimals` digits.
fn band_text(r: &Row, decimals: usize) -> String {
    if r.tolerance == 0.0 {
        "exact".to_string()
    } else {
        format!("±{:.*}%", decimals, r.tolerance * 100.0)
    }
}

impl Row {
    /// now / golden.
    pub fn ratio(&self) -> Option<f64> {
        match (self.golden, self.now) {
            (Some(g), Some(n)) if g != 0.0 => Some(n / g),
            _ => None,
        }
    }
}

fn kind_of(name: &str) -> FigureKind {
    if name.ends_with("/functions") {
        FigureKind::Count
    } else if name.contains(':') {
        FigureKind::Ratio
    } else {
        FigureKind::Median
    }
}

/// Every figure of the run and of the budget, in run order (then budget-only
/// figures): a figure is ok when both have it and `now` lies within
/// `golden × (1 ± tolerance)` (exactly equal for counts).
pub fn compare(budget: &ClockBudget, figures: &[Figure]) -> Vec<Row> {
    let mut rows: Vec<Row> = figures
        .iter()
        .map(|f| {
            let golden = budget.figures.get(&f.name).copied();
            let tolerance = match f.kind {
                FigureKind::Median => budget.median_tolerance,
                FigureKind::Ratio => budget.ratio_tolerance,
                FigureKind::Count => 0.0,
            };
            let ok = match golden {
                Some(g) if f.kind == FigureKind::Count => g == f.value,
                // The edge is inside (up to float rounding of the product).
                Some(g) => (f.value - g).abs() <= tolerance * g.abs() * (1.0 + 1e-9),
                None => false,
            };
            Row {
                figure: f.name.clone(),
                golden,
                now: Some(round_figure(f)),
                tolerance,
                ok,
            }
        })
        .collect();
    for (name, &g) in &budget.figures {
        if !figures.iter().any(|f| &f.name == name) {
            rows.push(Row {
                figure: name.clone(),
                golden: Some(g),
                now: None,
                tolerance: match kind_of(name) {
                    FigureKind::Median => budget.median_tolerance,
                    FigureKind::Ratio => budget.ratio_tolerance,
                    FigureKind::Count => 0.0,
                },
                ok: false,
            });
        }
    }
    rows
}

fn show(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.5}"),
    }
}

/// The comparison as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "  {:<22} {:>13} {:>13} {:>10} {:>7}  {}\n",
        "figure", "golden", "now", "now/golden", "band", "verdict"
    );
    for r in rows {
        let verdict = match (r.ok, r.golden, r.now) {
            (true, _, _) => "ok",
            (false, None, _) => "NO GOLDEN",
            (false, _, None) => "NOT MEASURED",
            (false, _, _) => "OUT OF BAND",
        };
        let _ = writeln!(
            out,
            "  {:<22} {:>13} {:>13} {:>10} {:>7}  {verdict}",
            r.figure,
            show(r.golden),
            show(r.now),
            ratio_text(r),
            band_text(r, 1),
        );
    }
    out
}

// ---------------------------------------------------------------- sensitivity

/// How far one extra listener per CPU moves a median, against the band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    pub fixture: String,
    pub op: String,
    /// median(L1) / median(L0) - 1.
    pub first_listener: f64,
    /// (median(Lmax) - median(L0)) / max / median(Lmax): one more listener
    /// on top of the most measured, assuming the cost is linear.
    pub one_more_at_max: Option<(u32, f64)>,
    /// The relative band a median has.
    pub tolerance: f64,
}

impl Sensitivity {
    /// Whether the check flags a change the size of one listener per CPU,
    /// both from none and on top of the most measured.
    pub fn seen(&self) -> bool {
        self.first_listener > self.tolerance
            && self.one_more_at_max.is_none_or(|(_, e)| e > self.tolerance)
    }
}

pub fn sensitivity(points: &[Point], tolerance: f64) -> Vec<Sensitivity> {
    let mut out = Vec::new();
    for b in points.iter().filter(|p| p.listeners_per_cpu == 0) {
        let same: Vec<&Point> = points
            .iter()
            .filter(|p| p.fixture == b.fixture && p.program == b.program)
            .collect();
        let Some(one) = same.iter().find(|p| p.listeners_per_cpu == 1) else {
            continue;
        };
        let most = same
            .iter()
            .max_by_key(|p| p.listeners_per_cpu)
            .filter(|p| p.listeners_per_cpu > 1);
        for op in Op::ALL {
            let base = op.of(b).median;
            out.push(Sensitivity {
                fixture: b.fixture.clone(),
                op: op.name().to_string(),
                first_listener: op.of(one).median / base - 1.0,
                one_more_at_max: most.map(|m| {
                    let n = m.listeners_per_cpu;
                    let at = op.of(m).median;
                    (n, (at - base) / f64::from(n) / at)
                }),
                tolerance,
            });
        }
    }
    out
}

// ---------------------------------------------------------------- trials

/// What one trial measured, as left in its artefacts (`overhead.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialOverhead {
    /// The trial's kernel (pin id, or `image`).
    pub kernel: String,
    /// The pin whose budget applies, if any.
    pub budget_pin: Option<String>,
    pub guest_release: String,
    pub clock: Clock,
    pub points: Vec<Point>,
    pub figures: Vec<Figure>,
    /// The comparison with the budget (empty when not compared).
    pub rows: Vec<Row>,
    pub median_tolerance: f64,
    pub sensitivity: Vec<Sensitivity>,
}

/// The `measure` steps of a plan: (fixture, program, listeners, iterations).
fn planned(scenario: &Scenario) -> Vec<(String, String, u32, u32)> {
    scenario
        .plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Measure {
                fixture,
                program,
                listeners_per_cpu,
                iterations,
                ..
            } => Some((
                fixture.clone(),
                program.clone(),
                *listeners_per_cpu,
                *iterations,
            )),
            _ => None,
        })
        .collect()
}

fn bless_hint(scenario: &Scenario, pin: &str) -> String {
    format!(
        "write it from a real run with `cargo xtask bless --overhead --kernel {pin} --scenario {}`",
        scenario.name
    )
}

/// The trial hook: for a scenario with `measure` steps, checks the timings
/// are complete, writes `overhead.json`, and compares the figures with the
/// budget of `budget_pin` (or, when blessing, rewrites it). `Err` is the
/// failure message. Scenarios without `measure` steps pass untouched.
pub fn check_trial(
    scenario: &Scenario,
    evidence: &RunEvidence,
    kernel: &str,
    budget_pin: Option<&str>,
    accel: Accel,
    artefacts: &Path,
) -> Result<(), String> {
    let planned = planned(scenario);
    if planned.is_empty() && evidence.timings.is_empty() {
        return Ok(());
    }
    let got: Vec<(String, String, u32, u32)> = evidence
        .timings
        .iter()
        .map(|t| {
            (
                t.fixture.clone(),
                t.program.clone(),
                t.listeners_per_cpu,
                t.load_ns.len().min(t.unload_ns.len()) as u32,
            )
        })
        .collect();
    if got != planned {
        return Err(format!(
            "overhead: the plan's measure steps (fixture, program, listeners per CPU, iterations) were {planned:?} but the guest reported timings for {got:?}"
        ));
    }
    let points: Vec<Point> = evidence.timings.iter().filter_map(Point::of).collect();
    let figures = figures(&points);
    let clock = Clock::of(accel, scenario.vm.icount);
    let mut record = TrialOverhead {
        kernel: kernel.to_string(),
        budget_pin: budget_pin.map(str::to_string),
        guest_release: evidence.uname.release.clone(),
        clock,
        points,
        figures,
        rows: Vec::new(),
        median_tolerance: clock.default_tolerances().0,
        sensitivity: Vec::new(),
    };
    let outcome = budget_outcome(scenario, budget_pin, planned[0].3, &mut record);
    record.sensitivity = sensitivity(&record.points, record.median_tolerance);
    if let Ok(json) = serde_json::to_string_pretty(&record) {
        let _ = std::fs::write(artefacts.join(TRIAL_FILE), json);
    }
    outcome
}

fn budget_outcome(
    scenario: &Scenario,
    budget_pin: Option<&str>,
    iterations: u32,
    record: &mut TrialOverhead,
) -> Result<(), String> {
    let Some(pin) = budget_pin else {
        return Ok(());
    };
    let path = Budget::path(&scenario.dir, pin);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => Some(Budget::parse(&text).map_err(|e| format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    if std::env::var_os(BLESS_ENV).is_some() {
        let previous = existing.and_then(Result::ok);
        let budget = Budget::blessed(
            previous,
            pin,
            &record.guest_release,
            record.clock,
            iterations,
            &record.figures,
        );
        if let Some(c) = budget.for_clock(record.clock) {
            record.median_tolerance = c.median_tolerance;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        return std::fs::write(&path, budget.to_toml())
            .map_err(|e| format!("writing {}: {e}", path.display()));
    }
    let Some(budget) = existing else {
        return Err(format!(
            "overhead: no budget for kernel pin {pin} ({} does not exist); {}",
            path.display(),
            bless_hint(scenario, pin)
        ));
    };
    let budget = budget?;
    let Some(golden) = budget.for_clock(record.clock) else {
        return Err(format!(
            "overhead: {} has no [{}] section, so nothing to compare figures measured in {} with; {}",
            path.display(),
            record.clock.key(),
            record.clock.label(),
            bless_hint(scenario, pin)
        ));
    };
    record.median_tolerance = golden.median_tolerance;
    record.rows = compare(golden, &record.figures);
    let bad = record.rows.iter().filter(|r| !r.ok).count();
    if bad == 0 {
        return Ok(());
    }
    Err(format!(
        "overhead: {bad} figure(s) left their band (budget {}, clock: {}):\n{}\
         if the change is intended, {}",
        path.display(),
        record.clock.label(),
        table(&record.rows),
        bless_hint(scenario, pin)
    ))
}

// ---------------------------------------------------------------- run report

/// Every `overhead.json` left by the trials in `artefacts` directories.
pub fn collect(artefacts: &[PathBuf]) -> Vec<TrialOverhead> {
    artefacts
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join(TRIAL_FILE)).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect()
}

fn fmt_ns(v: f64) -> String {
    format!("{v:.0}")
}

/// The run's overhead as Markdown: per trial the medians and spreads, the
/// ratios to no listener, the budget comparison and the sensitivity.
pub fn markdown(run: &str, trials: &[TrialOverhead]) -> String {
    let mut md = format!("# kloop overhead, run {run}\n\n");
    for t in trials {
        let _ = writeln!(
            md,
            "## {} ({})\n\nclock: {}\n",
            t.kernel,
            if t.guest_release.is_empty() {
                "?"
            } else {
                &t.guest_release
            },
            t.clock.label()
        );
        md.push_str(
            "| program | functions | listeners/CPU | n | load median ns | load IQR | load MAD | load min–max | load ×L0 | unload median ns | unload IQR | unload MAD | unload min–max | unload ×L0 |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for p in &t.points {
            let base = baseline(&t.points, p);
            let ratio = |op: Op| {
                base.map_or("-".to_string(), |b| {
                    format!("{:.4}", op.of(p).median / op.of(b).median)
                })
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {}–{} | {} |",
                p.fixture,
                p.functions,
                p.listeners_per_cpu,
                p.load.n,
                fmt_ns(p.load.median),
                fmt_ns(p.load.iqr()),
                fmt_ns(p.load.mad),
                p.load.min,
                p.load.max,
                ratio(Op::Load),
                fmt_ns(p.unload.median),
                fmt_ns(p.unload.iqr()),
                fmt_ns(p.unload.mad),
                p.unload.min,
                p.unload.max,
                ratio(Op::Unload),
            );
        }
        if t.rows.is_empty() {
            let _ = writeln!(
                md,
                "\nNo budget comparison ({}).\n",
                match &t.budget_pin {
                    None => "no pin to take a budget from".to_string(),
                    Some(p) => format!("budget of pin {p} blessed or missing"),
                }
            );
        } else {
            md.push_str(
                "\n| figure | golden | now | now/golden | band | verdict |\n|---|---:|---:|---:|---:|---|\n",
            );
            for r in &t.rows {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    r.figure,
                    show(r.golden),
                    show(r.now),
                    ratio_text(r),
                    band_text(r, 2),
                    if r.ok { "ok" } else { "**OUT**" }
                );
            }
            md.push('\n');
        }
        if !t.sensitivity.is_empty() {
            md.push_str("Sensitivity (one extra listener per CPU against the median band):\n\n");
            for s in &t.sensitivity {
                let more = s
                    .one_more_at_max
                    .map(|(n, e)| {
                        format!(
                            "; one more on top of {n}: {:+.2}% ({:.1}× the band)",
                            e * 100.0,
                            e / s.tolerance
                        )
                    })
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "- {} {}: 0→1 listener {:+.2}% ({:.1}× the ±{:.2}% band){more}: {}",
                    s.fixture,
                    s.op,
                    s.first_listener * 100.0,
                    s.first_listener / s.tolerance,
                    s.tolerance * 100.0,
                    if s.seen() {
                        "flagged"
                    } else {
                        "not always flagged by this figure"
                    }
                );
            }
            let flagged = t.sensitivity.iter().filter(|s| s.seen()).count();
            let _ = writeln!(
                md,
                "\nOne extra listener per CPU, from none and on top of the most measured, moves {flagged} of {} medians out of their band{}.\n",
                t.sensitivity.len(),
                if flagged > 0 {
                    ": the check sees it"
                } else {
                    ": the check does NOT see it"
                }
            );
        }
    }
    md
}

/// One line of the plot: a kernel × program.
struct PlotLine {
    label: String,
    /// Index into [`PALETTE`] (one colour per kernel).
    colour: usize,
    /// Every program after the first is dashed.
    dashed: bool,
    /// (listeners per CPU, median ÷ median with none).
    pts: Vec<(f64, f64)>,
}

const PALETTE: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (148, 103, 189),
    (255, 127, 14),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
];

/// Overhead vs listeners per CPU as SVG: one panel per op (median over the
/// median with no listener), one line per kernel × program (colour: kernel;
/// solid basic-like first program, dashed the others).
pub fn svg(trials: &[TrialOverhead]) -> Result<String, String> {
    use plotters::prelude::*;

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let title = match trials.first().map(|t| t.clock) {
            Some(c) if trials.iter().all(|t| t.clock == c) => {
                format!("BPF load/unload time vs listeners — {}", c.label())
            }
            _ => "BPF load/unload time vs listeners — mixed clocks".to_string(),
        };
        let root = root
            .titled(&title, ("sans-serif", 18))
            .map_err(|e| e.to_string())?;
        let panels = root.split_evenly((1, 2));
        let fixtures: Vec<String> = {
            let mut f: Vec<String> = Vec::new();
            for t in trials {
                for p in &t.points {
                    if !f.contains(&p.fixture) {
                        f.push(p.fixture.clone());
                    }
                }
            }
            f
        };
        for (panel, op) in panels.iter().zip(Op::ALL) {
            let mut lines: Vec<PlotLine> = Vec::new();
            for (ti, t) in trials.iter().enumerate() {
                for (fi, fixture) in fixtures.iter().enumerate() {
                    let mut pts: Vec<(f64, f64)> = t
                        .points
                        .iter()
                        .filter(|p| &p.fixture == fixture)
                        .filter_map(|p| {
                            let b = baseline(&t.points, p)?;
                            Some((
                                f64::from(p.listeners_per_cpu),
                                op.of(p).median / op.of(b).median,
                            ))
                        })
                        .collect();
                    if pts.is_empty() {
                        continue;
                    }
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let functions = t
                        .points
                        .iter()
                        .find(|p| &p.fixture == fixture)
                        .map_or(0, |p| p.functions);
                    lines.push(PlotLine {
                        label: format!("{} {fixture} ({functions} fn)", t.kernel),
                        colour: ti,
                        dashed: fi > 0,
                        pts,
                    });
                }
            }
            let x_max = lines
                .iter()
                .flat_map(|l| l.pts.iter().map(|p| p.0))
                .fold(1.0, f64::max);
            let y_max = lines
                .iter()
                .flat_map(|l| l.pts.iter().map(|p| p.1))
                .fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    format!("{}: median ÷ median with 0 listeners", op.name()),
                    ("sans-serif", 15),
                )
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(0f64..x_max * 1.05, 0.95f64..y_max * 1.05 + 0.05)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("extra listeners per CPU")
                .y_desc("× time with 0 listeners")
                .draw()
                .map_err(|e| e.to_string())?;
            for PlotLine {
                label,
                colour,
                dashed,
                pts,
            } in lines
            {
                let (r, g, b) = PALETTE[colour % PALETTE.len()];
                let color = RGBColor(r, g, b);
                let style = color.stroke_width(2);
                // The first program: solid line and dots; the others dashed
                // with triangles (the legend shows the marker too).
                if dashed {
                    chart
                        .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                        .map_err(|e| e.to_string())?
                        .label(label)
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (6, 0)], style)
                                + PathElement::new(vec![(12, 0), (18, 0)], style)
                                + TriangleMarker::new((9, 0), 4, color.filled())
                        });
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| TriangleMarker::new((x, y), 5, color.filled())),
                        )
                        .map_err(|e| e.to_string())?;
                } else {
                    chart
                        .draw_series(LineSeries::new(pts.clone(), style))
                        .map_err(|e| e.to_string())?
                        .label(label)
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (18, 0)], style)
                                + Circle::new((9, 0), 3, color.filled())
                        });
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                        )
                        .map_err(|e| e.to_string())?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .label_font(("sans-serif", 11))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Writes `overhead-<run>.md` and `overhead-<run>.svg` into `dir` from the
/// `overhead.json` of the trials in `artefacts`; `None` when no trial measured.
pub fn write_run_report(
    dir: &Path,
    run: &str,
    artefacts: &[PathBuf],
) -> std::io::Result<Option<(PathBuf, PathBuf)>> {
    let trials = collect(artefacts);
    if trials.is_empty() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let md = dir.join(format!("overhead-{run}.md"));
    let plot = dir.join(format!("overhead-{run}.svg"));
    std::fs::write(&md, markdown(run, &trials))?;
    std::fs::write(&plot, svg(&trials).map_err(std::io::Error::other)?)?;
    Ok(Some((md, plot)))
}

#[cfg(test)]
mod tests {
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

    fn sample_points() -> Vec<Point> {
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

        // The same figures measured under KVM have no golden: fail with the hint.
        let e = check_trial(&s, &ev, "6.1", Some("6.1"), Accel::Kvm, art.path()).unwrap_err();
        assert!(e.contains("no [kvm] section"), "{e}");

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
    fn report_has_table_and_plot() {
        let points = sample_points();
        let t = TrialOverhead {
            kernel: "6.1".into(),
            budget_pin: Some("6.1".into()),
            guest_release: "6.1.0-x".into(),
            clock: Clock::Icount,
            figures: figures(&points),
            sensitivity: sensitivity(&points, 0.01),
            points,
            rows: Vec::new(),
            median_tolerance: 0.01,
        };
        let md = markdown("r1", std::slice::from_ref(&t));
        assert!(md.contains("| basic | 1 | 8 | 3 | 124 | 3 | 0 | 124–130 | 1.2400 | 90 | 0 | 0 | 90–90 | 9.0000 |"), "{md}");
        assert!(
            md.contains("basic load: 0→1 listener +3.00% (3.0× the ±1.00% band)"),
            "{md}"
        );
        let svg = svg(&[t]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(svg.contains("6.1 basic (1 fn)"));
        let dir = tempfile::tempdir().unwrap();
        assert!(
            write_run_report(dir.path(), "r1", &[dir.path().join("none")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn icount_reaches_qemu_argv_under_tcg_only() {
        use crate::vm::{Deadlines, VmConfig};
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
            channel_limit: crate::vm::DEFAULT_CHANNEL_LIMIT,
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
