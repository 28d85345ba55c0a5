//! Statistics of one series of durations and the figures made from them:
//! medians per program × listeners, ratios to no listener, function counts.

use super::*;

/// Summary of one series of durations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// How many values.
    pub n: usize,
    /// Their median.
    pub median: f64,
    /// First and third quartile (linear interpolation between order statistics).
    pub q1: f64,
    /// See `q1`.
    pub q3: f64,
    /// Median absolute deviation from the median (unscaled).
    pub mad: f64,
    /// The smallest value.
    pub min: u64,
    /// The largest value.
    pub max: u64,
}

/// The `p`-quantile of sorted `v` (`0 <= p <= 1`), interpolating linearly
/// between the order statistics at `(n - 1) p` (R's type 7).
pub(super) fn quantile(v: &[f64], p: f64) -> f64 {
    let h = (v.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

impl Stats {
    /// The summary of `values`; `None` when there are none.
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

    /// The interquartile range.
    pub fn iqr(&self) -> f64 {
        self.q3 - self.q1
    }
}

/// One `measure` step, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The fixture measured.
    pub fixture: String,
    /// Its program.
    pub program: String,
    /// Its JITed functions.
    pub functions: u32,
    /// Listeners open on each CPU.
    pub listeners_per_cpu: u32,
    /// The load durations.
    pub load: Stats,
    /// The unload durations.
    pub unload: Stats,
}

impl Point {
    /// The point of one `Timings` message; `None` without durations.
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
    /// Its key in budget files (`icount`, `kvm`, `tcg`).
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

    /// The (median, ratio) bands figures of this clock get when nothing
    /// more specific is known: a budget's own, or the baseline's in an A/B.
    pub fn default_tolerances(self) -> (f64, f64) {
        match self {
            Clock::Icount => (ICOUNT_TOLERANCE, ICOUNT_TOLERANCE),
            Clock::Kvm | Clock::Tcg => (REAL_TIME_MEDIAN_TOLERANCE, REAL_TIME_RATIO_TOLERANCE),
        }
    }
}

// ---------------------------------------------------------------- figures

/// What a figure is, which decides how it is compared.
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

/// One named figure (`basic/unload/L1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// `<fixture>/<op>/L<listeners>` (or `…/functions`).
    pub name: String,
    /// What it is.
    pub kind: FigureKind,
    /// Its value.
    pub value: f64,
}

/// Which duration of a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `BPF_PROG_LOAD`.
    Load,
    /// Closing the last reference.
    Unload,
}

impl Op {
    /// Both, in report order.
    pub const ALL: [Op; 2] = [Op::Load, Op::Unload];

    /// `load` or `unload`, as figure names have it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Load => "load",
            Op::Unload => "unload",
        }
    }

    /// The point's durations of this operation.
    pub fn of(self, p: &Point) -> &Stats {
        match self {
            Op::Load => &p.load,
            Op::Unload => &p.unload,
        }
    }
}

/// The point with no listener for the same fixture and program.
pub fn baseline<'a>(points: &'a [Point], p: &Point) -> Option<&'a Point> {
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
