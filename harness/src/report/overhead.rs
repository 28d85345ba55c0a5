//! The run's overhead report: a Markdown table (medians, spreads, ratios to
//! no listener, the budget comparison, sensitivity) and an SVG plot of time
//! against listeners per CPU, from the trials' `overhead.json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::judge::overhead::*;

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
        points_table(&mut md, t);
        budget_table(&mut md, t);
        sensitivity_lines(&mut md, t);
    }
    md
}

/// The trial's measured points: medians, spreads and the ratio to the same
/// program with no listener.
fn points_table(md: &mut String, t: &TrialOverhead) {
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
}

/// The trial's figures against its pin's budget, or why there is none.
fn budget_table(md: &mut String, t: &TrialOverhead) {
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
}

/// How far one extra listener per CPU moves each median, against its band:
/// whether the budget check would see that much overhead.
fn sensitivity_lines(md: &mut String, t: &TrialOverhead) {
    if t.sensitivity.is_empty() {
        return;
    }
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

/// Why the overhead plot could not be drawn: the SVG backend's error.
pub type PlotError = plotters::drawing::DrawingAreaErrorKind<std::io::Error>;

/// Overhead vs listeners per CPU as SVG: one panel per op (median over the
/// median with no listener), one line per kernel × program (colour: kernel;
/// solid basic-like first program, dashed the others).
pub fn svg(trials: &[TrialOverhead]) -> Result<String, PlotError> {
    use plotters::prelude::*;

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = match trials.first().map(|t| t.clock) {
            Some(c) if trials.iter().all(|t| t.clock == c) => {
                format!("BPF load/unload time vs listeners — {}", c.label())
            }
            _ => "BPF load/unload time vs listeners — mixed clocks".to_string(),
        };
        let root = root.titled(&title, ("sans-serif", 18))?;
        let panels = root.split_evenly((1, 2));
        let fixtures = fixtures_of(trials);
        for (panel, op) in panels.iter().zip(Op::ALL) {
            draw_panel(panel, op, plot_lines(trials, &fixtures, op))?;
        }
        root.present()?;
    }
    Ok(out)
}

/// Every program measured, in first-seen order: its place is its line style.
fn fixtures_of(trials: &[TrialOverhead]) -> Vec<String> {
    let mut f: Vec<String> = Vec::new();
    for t in trials {
        for p in &t.points {
            if !f.contains(&p.fixture) {
                f.push(p.fixture.clone());
            }
        }
    }
    f
}

/// One line per kernel × program that has points with a baseline: `op`'s
/// median over the same program's with no listener.
fn plot_lines(trials: &[TrialOverhead], fixtures: &[String], op: Op) -> Vec<PlotLine> {
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
    lines
}

/// One panel of the plot: the area an op's chart is drawn on.
type Panel<'a> =
    plotters::drawing::DrawingArea<plotters::prelude::SVGBackend<'a>, plotters::coord::Shift>;

/// The chart of one panel: `f64` listeners per CPU against `f64` ratios.
type Chart<'a, 'b> = plotters::chart::ChartContext<
    'a,
    plotters::prelude::SVGBackend<'b>,
    plotters::prelude::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// One op's panel: axes fitted to its lines, the lines, their legend.
fn draw_panel(panel: &Panel<'_>, op: Op, lines: Vec<PlotLine>) -> Result<(), PlotError> {
    use plotters::prelude::*;
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
        .build_cartesian_2d(0f64..x_max * 1.05, 0.95f64..y_max * 1.05 + 0.05)?;
    chart
        .configure_mesh()
        .x_desc("extra listeners per CPU")
        .y_desc("× time with 0 listeners")
        .draw()?;
    for line in lines {
        draw_line(&mut chart, line)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}

/// One plot line on `chart`, in its kernel's colour.
fn draw_line<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, line: PlotLine) -> Result<(), PlotError> {
    use plotters::prelude::*;
    let PlotLine {
        label,
        colour,
        dashed,
        pts,
    } = line;
    let (r, g, b) = PALETTE[colour % PALETTE.len()];
    let color = RGBColor(r, g, b);
    let style = color.stroke_width(2);
    // The first program: solid line and dots; the others dashed
    // with triangles (the legend shows the marker too).
    if dashed {
        chart
            .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
            .label(label)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (6, 0)], style)
                    + PathElement::new(vec![(12, 0), (18, 0)], style)
                    + TriangleMarker::new((9, 0), 4, color.filled())
            });
        chart.draw_series(
            pts.iter()
                .map(|&(x, y)| TriangleMarker::new((x, y), 5, color.filled())),
        )?;
    } else {
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(label)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (18, 0)], style)
                    + Circle::new((9, 0), 3, color.filled())
            });
        chart.draw_series(
            pts.iter()
                .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
        )?;
    }
    Ok(())
}

/// Writes `overhead-<run>.md` and `overhead-<run>.svg` into `dir` from the
/// `overhead.json` of the trials in `artefacts`; `None` when no trial measured.
pub fn write_run_report(
    dir: &Path,
    run: &str,
    artefacts: &[PathBuf],
) -> std::io::Result<Option<(PathBuf, PathBuf)>> {
    let trials = crate::run::trial::overhead::collect(artefacts);
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
    use crate::judge::overhead::samples::sample_points;

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
            note: None,
        };
        let md = markdown("r1", std::slice::from_ref(&t));
        assert!(
            md.contains(
                "| basic | 1 | 8 | 3 | 124 | 3 | 0 | 124–130 | 1.2400 | 90 | 0 | 0 | 90–90 | 9.0000 |"
            ),
            "{md}"
        );
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
}
