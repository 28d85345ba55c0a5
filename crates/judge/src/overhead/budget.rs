//! Golden budgets (`scenarios/<scenario>/budgets/<pin>.toml`) and the
//! comparison of a run's figures with them.

use super::*;

/// `scenarios/<scenario>/budgets/<pin>.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The pin it is for.
    pub pin: String,
    /// `uname -r` of the guest the budget was blessed from.
    #[serde(default)]
    pub guest_release: String,
    /// The figures under TCG with `-icount` (instruction counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icount: Option<ClockBudget>,
    /// The figures under KVM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<ClockBudget>,
    /// The figures under TCG without `-icount`.
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
    /// Where a scenario keeps `pin`'s budget.
    pub fn path(scenario_dir: &Path, pin: &str) -> PathBuf {
        scenario_dir.join("budgets").join(format!("{pin}.toml"))
    }

    /// A budget file's contents.
    pub fn parse(text: &str) -> Result<Budget, toml::de::Error> {
        toml::from_str(text)
    }

    /// The figures for `clock`, if blessed.
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

    /// The file, with its explaining header.
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
pub(super) fn round_figure(f: &Figure) -> f64 {
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
    /// The figure's name.
    pub figure: String,
    /// Its golden value, if the budget has one.
    pub golden: Option<f64>,
    /// Its value in this trial, if measured.
    pub now: Option<f64>,
    /// Relative band (0 for exact figures).
    pub tolerance: f64,
    /// Within its band.
    pub ok: bool,
}

/// `now / golden` for a table, `-` when there is none.
pub fn ratio_text(r: &Row) -> String {
    r.ratio().map_or("-".into(), |x| format!("{x:.4}"))
}

/// A figure's band: `exact`, or `±x%` with `decimals` digits.
pub fn band_text(r: &Row, decimals: usize) -> String {
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

pub(super) fn kind_of(name: &str) -> FigureKind {
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

/// A figure for a table, `-` when there is none.
pub fn show(v: Option<f64>) -> String {
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
