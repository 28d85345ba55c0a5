//! What a bisection tells: each step's line and the answer.

use crate::judge::bisect::StepVerdict;
use crate::run::bisect::distro::DistroBisection;
use crate::run::bisect::StepReport;

/// One step's line: the build, its verdict, its time and its runs' first
/// lines.
pub fn step_line(step_no: usize, s: &StepReport) -> String {
    let verdict = match &s.verdict {
        StepVerdict::Old => "old".to_string(),
        StepVerdict::New => "new".to_string(),
        StepVerdict::Skip(why) => format!("skip ({why})"),
    };
    format!(
        "step {step_no}: {} → {verdict} ({:.1} s; {})",
        s.kernel,
        s.secs,
        s.runs
            .iter()
            .map(|r| r.1.split('\n').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// The answer (first new and last old build with their packages, the
/// builds skipped between them, the difference) and, last, the cost line
/// (which the caller prints as kloop's).
pub fn outcome_lines(b: &DistroBisection) -> (Vec<String>, String) {
    let o = &b.outcome;
    let s = &o.search;
    let name = |i: usize| &o.kernels[i];
    let mut lines = vec![
        format!(
            "first new build: {} ({})",
            name(s.first_new),
            b.range[s.first_new].package
        ),
        format!(
            "last old build:  {} ({})",
            name(s.last_old),
            b.range[s.last_old].package
        ),
    ];
    if !s.skipped_between.is_empty() {
        lines.push(format!(
            "ambiguous: skipped build(s) between them: {}",
            s.skipped_between
                .iter()
                .map(|&i| name(i).as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    lines.extend(o.difference.iter().map(|l| format!("  {l}")));
    let cost = format!(
        "{} step(s) ({} runs), {:.0} s, confidence {:.0}%",
        o.steps.len(),
        o.steps.iter().map(|s| s.runs.len()).sum::<usize>(),
        b.secs,
        o.confidence * 100.0
    );
    (lines, cost)
}
