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

use crate::judge::evidence::{RunEvidence, Timings};
use crate::scenario::Scenario;
use kloop_qemu::Accel;

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
    pub guest_release: String,
    pub clock: Clock,
    pub points: Vec<Point>,
    pub figures: Vec<Figure>,
    /// The comparison with the budget (empty when not compared).
    pub rows: Vec<Row>,
    pub median_tolerance: f64,
    pub sensitivity: Vec<Sensitivity>,
    /// What the trial line should say about how the figures were judged
    /// (a clock without a budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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

/// The trial hook: for a scenario with `measure` steps, checks the timings
/// are complete, writes `overhead.json`, and compares the figures with the
/// budget of `budget_pin` (or, when blessing, rewrites it). `Err` is the
/// failure message; `Ok(Some(note))` a line for the trial report (how the
/// figures were judged). Scenarios without `measure` steps pass untouched.
pub fn check_trial(
    scenario: &Scenario,
    evidence: &RunEvidence,
    kernel: &str,
    budget_pin: Option<&str>,
    accel: Accel,
    artefacts: &Path,
) -> Result<Option<String>, String> {
    let planned = planned(scenario);
    if planned.is_empty() && evidence.timings.is_empty() {
        return Ok(None);
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
        note: None,
    };
    let outcome = budget_outcome(scenario, budget_pin, planned[0].3, &mut record);
    record.sensitivity = sensitivity(&record.points, record.median_tolerance);
    if let Ok(json) = serde_json::to_string_pretty(&record) {
        let _ = std::fs::write(artefacts.join(TRIAL_FILE), json);
    }
    outcome.map(|()| record.note.clone())
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

#[cfg(test)]
pub(crate) mod tests;
