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
//! (the running side writes the budget [`judge_trial`] hands back);
//! nothing else touches them.
//!
//! Each measuring trial leaves `overhead.json` ([`TrialOverhead`]) in its
//! artefact directory (written by the running side); the report turns
//! those of a run into a Markdown table and an SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kloop_protocol::Step;
use serde::{Deserialize, Serialize};

use crate::evidence::{RunEvidence, Timings};

/// Default relative band of a median / ratio under TCG -icount: the 1% two
/// runs of a kernel must agree within. Four boots of each pin (nokaslr)
/// agreed within 0.03-0.40%; one extra listener per CPU moves every unload
/// median by 10% or more (also on top of 8), load medians by 0.3-3%.
pub const ICOUNT_TOLERANCE: f64 = 0.01;
/// Default bands for real-time clocks (KVM, TCG without icount): medians
/// move with the host, ratios to 0 listeners much less.
pub const REAL_TIME_MEDIAN_TOLERANCE: f64 = 0.30;
/// The band for ratios to 0 listeners under a real-time clock.
pub const REAL_TIME_RATIO_TOLERANCE: f64 = 0.10;

mod budget;
mod sensitivity;
mod stats;

pub use budget::*;
pub use sensitivity::*;
pub use stats::*;

// ---------------------------------------------------------------- trials

/// What one trial measured, as left in its artefacts (`overhead.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialOverhead {
    /// The trial's kernel (pin id, or `image`).
    pub kernel: String,
    /// The pin whose budget applies, if any.
    pub budget_pin: Option<String>,
    /// The guest kernel's release.
    pub guest_release: String,
    /// The clock the timings were taken with.
    pub clock: Clock,
    /// Every measured point (fixture, operation, listeners).
    pub points: Vec<Point>,
    /// The figures derived from them (medians, ratios).
    pub figures: Vec<Figure>,
    /// The comparison with the budget (empty when not compared).
    pub rows: Vec<Row>,
    /// The band medians were held to.
    pub median_tolerance: f64,
    /// Whether the figures move with the listeners as they must.
    pub sensitivity: Vec<Sensitivity>,
    /// What the trial line should say about how the figures were judged
    /// (a clock without a budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The `measure` steps of a plan: (fixture, program, listeners, iterations).
fn planned(steps: &[Step]) -> Vec<(String, String, u32, u32)> {
    steps
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

fn bless_hint(scenario: &str, pin: &str) -> String {
    format!(
        "write it from a real run with `cargo xtask bless --overhead --kernel {pin} --scenario {scenario}`"
    )
}

/// The checks that hold on any clock: every function count equals the
/// budget's (any clock's section has them), and more listeners never make
/// the emission path cheaper: each `Ln:L0` ratio is at least 1 minus the
/// real-time ratio band, and `L8` is not below `L1` by more than that band
/// (`perf_iterate_sb()` writes each record once per listener).
pub fn clock_independent(budget: &Budget, figures: &[Figure]) -> Vec<String> {
    let mut problems = Vec::new();
    let reference = [&budget.icount, &budget.kvm, &budget.tcg]
        .into_iter()
        .flatten()
        .next();
    for f in figures {
        match f.kind {
            FigureKind::Count => {
                if let Some(g) = reference.and_then(|r| r.figures.get(&f.name)) {
                    if *g != f.value {
                        problems.push(format!(
                            "{}: {} function(s), the budget says {g}",
                            f.name, f.value
                        ));
                    }
                }
            }
            FigureKind::Ratio => {
                if f.value < 1.0 - REAL_TIME_RATIO_TOLERANCE {
                    problems.push(format!(
                        "{}: {:.3}: with listeners the path ran faster than without",
                        f.name, f.value
                    ));
                }
            }
            FigureKind::Median => {}
        }
    }
    for f in figures
        .iter()
        .filter(|f| f.kind == FigureKind::Median && f.name.ends_with("/L8"))
    {
        let l1 = format!("{}/L1", f.name.trim_end_matches("/L8"));
        if let Some(one) = figures.iter().find(|g| g.name == l1) {
            if f.value < one.value * (1.0 - REAL_TIME_RATIO_TOLERANCE) {
                problems.push(format!(
                    "{}: {} is below {l1} ({}): eight listeners per CPU cost less than one",
                    f.name, f.value, one.value
                ));
            }
        }
    }
    problems
}

/// What judging one trial's timings needs besides its evidence.
#[derive(Debug, Clone)]
pub struct TrialInputs<'a> {
    /// The scenario's name.
    pub scenario: &'a str,
    /// Its plan's steps (the `measure` steps among them).
    pub steps: &'a [Step],
    /// The clock the guest's timings ran on.
    pub clock: Clock,
    /// The trial's kernel (pin id, or `image`).
    pub kernel: &'a str,
    /// The pin whose budget applies, if any.
    pub budget_pin: Option<&'a str>,
    /// That pin's budget file: where it is (for messages) and its text,
    /// `None` when it does not exist. Unused without a budget pin.
    pub budget: Option<(PathBuf, Option<String>)>,
    /// `bless --overhead`: the budget is written from the figures, not
    /// compared with them.
    pub bless: bool,
}

/// How a trial's timings came out.
#[derive(Debug, Clone)]
pub struct TrialJudgement {
    /// The record the running side leaves as `overhead.json` (`None`: the
    /// scenario measured nothing).
    pub record: Option<TrialOverhead>,
    /// `Err`: the failure message; `Ok(Some(note))`: a line for the trial
    /// report (how the figures were judged).
    pub outcome: Result<Option<String>, String>,
    /// When blessing: the budget file's new text, for the running side to
    /// write where [`TrialInputs::budget`] says.
    pub blessed_budget: Option<String>,
}

/// For a scenario with `measure` steps: checks the timings are complete
/// and compares the figures with the budget (or, when blessing, makes the
/// budget). Scenarios without `measure` steps pass untouched.
pub fn judge_trial(inputs: &TrialInputs, evidence: &RunEvidence) -> TrialJudgement {
    let untouched = |outcome| TrialJudgement {
        record: None,
        outcome,
        blessed_budget: None,
    };
    let planned = planned(inputs.steps);
    if planned.is_empty() && evidence.timings.is_empty() {
        return untouched(Ok(None));
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
        return untouched(Err(format!(
            "overhead: the plan's measure steps (fixture, program, listeners per CPU, iterations) were {planned:?} but the guest reported timings for {got:?}"
        )));
    }
    let points: Vec<Point> = evidence.timings.iter().filter_map(Point::of).collect();
    let figures = figures(&points);
    let mut record = TrialOverhead {
        kernel: inputs.kernel.to_string(),
        budget_pin: inputs.budget_pin.map(str::to_string),
        guest_release: evidence.uname.release.clone(),
        clock: inputs.clock,
        points,
        figures,
        rows: Vec::new(),
        median_tolerance: inputs.clock.default_tolerances().0,
        sensitivity: Vec::new(),
        note: None,
    };
    let mut blessed_budget = None;
    let outcome = budget_outcome(inputs, planned[0].3, &mut record, &mut blessed_budget);
    record.sensitivity = sensitivity(&record.points, record.median_tolerance);
    let note = record.note.clone();
    TrialJudgement {
        record: Some(record),
        outcome: outcome.map(|()| note),
        blessed_budget,
    }
}

/// `Err`: the trial's overhead verdict (a string: the report shows it as-is).
fn budget_outcome(
    inputs: &TrialInputs,
    iterations: u32,
    record: &mut TrialOverhead,
    blessed: &mut Option<String>,
) -> Result<(), String> {
    let (Some(pin), Some((path, text))) = (inputs.budget_pin, &inputs.budget) else {
        return Ok(());
    };
    let existing = text
        .as_ref()
        .map(|text| Budget::parse(text).map_err(|e| format!("{}: {e}", path.display())));
    if inputs.bless {
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
        *blessed = Some(budget.to_toml());
        return Ok(());
    }
    let Some(budget) = existing else {
        return Err(format!(
            "overhead: no budget for kernel pin {pin} ({} does not exist); {}",
            path.display(),
            bless_hint(inputs.scenario, pin)
        ));
    };
    let budget = budget?;
    let Some(golden) = budget.for_clock(record.clock) else {
        // No golden figures for this clock (a KVM host, say): judge what
        // does not depend on the clock, and say that the rest was not.
        let problems = clock_independent(&budget, &record.figures);
        if problems.is_empty() {
            record.note = Some(format!(
                "overhead: no [{}] budget for pin {pin}: absolute figures not compared; function counts match the budget and every listener ratio is ≥ {:.2} with L8 ≥ L1",
                record.clock.key(),
                1.0 - REAL_TIME_RATIO_TOLERANCE
            ));
            return Ok(());
        }
        return Err(format!(
            "overhead: {} has no [{}] section, so absolute figures measured in {} are not compared; what does not depend on the clock failed:\n  {}",
            path.display(),
            record.clock.key(),
            record.clock.label(),
            problems.join("\n  ")
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
        bless_hint(inputs.scenario, pin)
    ))
}

#[cfg(any(test, feature = "test-support"))]
pub mod samples;
#[cfg(test)]
mod tests;
