//! `summary.md`: a run in Markdown, for a CI to show as its step summary
//! (GitHub's `$GITHUB_STEP_SUMMARY`): the totals, a table of trials, and
//! for each trial that failed the run what a reader needs first — the rules
//! it broke, the normalised-stream diff, the console's last lines.

use std::fmt::Write as _;
use std::path::Path;

use super::Summary;
use crate::run::trial::TrialResult;

/// The file's name in the run directory.
pub const SUMMARY_FILE: &str = "summary.md";

/// Console lines shown per failing trial.
const CONSOLE_LINES: usize = 20;

/// Lines of a verdict message shown, at most (timeouts and agent errors
/// carry a console tail of their own).
const MESSAGE_LINES: usize = 40;

/// The Markdown summary of a run whose reports are in `run_dir`.
pub fn summary(run_dir: &Path, results: &[TrialResult]) -> String {
    let mut md = String::new();
    let totals = Summary::of(results);
    let _ = writeln!(md, "## kloop: {}\n", cell(&totals.line()));
    let mut accels: Vec<&str> = Vec::new();
    for r in results {
        if !accels.contains(&r.accel.as_str()) {
            accels.push(&r.accel);
        }
    }
    let _ = writeln!(
        md,
        "{} trial(s), accelerator {}; reports and artefacts in {}\n",
        results.len(),
        cell(&accels.join(", ")),
        code_span(&run_dir.display().to_string())
    );
    md.push_str("| kernel | scenario | verdict | time |\n|---|---|---|---:|\n");
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} s |",
            cell(&r.kernel),
            cell(&r.scenario),
            cell(&r.verdict.headline()),
            r.wall_secs
        );
    }
    let failing: Vec<&TrialResult> = results.iter().filter(|r| r.verdict.fails_run()).collect();
    if !failing.is_empty() {
        md.push_str("\n### What failed\n\n");
    }
    for r in failing {
        failure(&mut md, r);
    }
    md
}

/// One failing trial's section.
fn failure(md: &mut String, r: &TrialResult) {
    let _ = writeln!(
        md,
        "#### {}: {}\n",
        code_span(&r.id),
        cell(&r.verdict.headline())
    );
    if !r.violations.is_empty() {
        // Rules in first-seen order, with counts.
        let mut rules: Vec<(&str, usize)> = Vec::new();
        for v in &r.violations {
            match rules.iter_mut().find(|(rule, _)| *rule == v.rule) {
                Some((_, n)) => *n += 1,
                None => rules.push((&v.rule, 1)),
            }
        }
        let listed: Vec<String> = rules
            .iter()
            .map(|(rule, n)| match n {
                1 => code_span(rule),
                n => format!("{} ×{n}", code_span(rule)),
            })
            .collect();
        let _ = writeln!(md, "Rules broken: {}\n", listed.join(", "));
        let lines: Vec<String> = r
            .violations
            .iter()
            .map(|v| {
                let known = v
                    .known_issue
                    .as_ref()
                    .map(|i| format!(" (known bug {i})"))
                    .unwrap_or_default();
                format!("[{}]{known} {}", v.rule, v.message)
            })
            .collect();
        fenced(md, "text", &lines.join("\n"));
    }
    if let Some(d) = &r.snapshot_drift {
        let _ = writeln!(
            md,
            "Normalised-stream diff against {}{}:\n",
            code_span(&d.snapshot.display().to_string()),
            d.pending
                .as_ref()
                .map(|p| format!(" (new stream: {})", code_span(&p.display().to_string())))
                .unwrap_or_default()
        );
        fenced(md, "diff", &d.diff);
    }
    // The message says what the data above does not (a panic, a timeout,
    // the agent's error, an overhead budget, the ledger, flaky runs).
    if r.violations.is_empty() && r.snapshot_drift.is_none() {
        if let Some(m) = r.verdict.message() {
            let lines: Vec<&str> = m.lines().collect();
            let mut shown = lines
                .iter()
                .take(MESSAGE_LINES)
                .copied()
                .collect::<Vec<_>>()
                .join("\n");
            if lines.len() > MESSAGE_LINES {
                let _ = write!(
                    shown,
                    "\n… {} more line(s) in results.jsonl",
                    lines.len() - MESSAGE_LINES
                );
            }
            fenced(md, "text", &shown);
        }
    }
    let console = r.artefacts.join("console.log");
    if console.is_file() {
        let _ = writeln!(
            md,
            "Console, last {CONSOLE_LINES} lines ({}):\n",
            code_span(&console.display().to_string())
        );
        fenced(
            md,
            "text",
            &kloop_qemu::console_tail(&console, CONSOLE_LINES),
        );
    }
}

/// Characters Markdown (or the terminal that shows the file) would not
/// show as themselves, written as Rust writes them (`\u{1b}`); tab and LF
/// stay.
fn visible(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if (c.is_control() && c != '\n' && c != '\t') || c == '\u{fffe}' || c == '\u{ffff}' {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A table cell (or a heading's text): `|` would end the cell and a
/// backtick open a code span, so both are escaped; a line break would end
/// the row, and `<` can start HTML, which GitHub renders.
fn cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in visible(s).chars() {
        match c {
            '|' => out.push_str("\\|"),
            '`' => out.push_str("\\`"),
            '<' => out.push_str("&lt;"),
            '\n' | '\r' | '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The longest run of backticks in `s`.
fn longest_backtick_run(s: &str) -> usize {
    s.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// Inline code that holds `s` whatever backticks it contains (a longer
/// fence, and spaces where `s` touches a backtick).
fn code_span(s: &str) -> String {
    let s = visible(s).replace(['\n', '\r'], " ");
    let fence = "`".repeat(longest_backtick_run(&s) + 1);
    if s.starts_with('`') || s.ends_with('`') {
        format!("{fence} {s} {fence}")
    } else {
        format!("{fence}{s}{fence}")
    }
}

/// A fenced code block whose fence is longer than any backtick run in
/// `body`, so the body cannot close it.
fn fenced(md: &mut String, lang: &str, body: &str) {
    let body = visible(body);
    let fence = "`".repeat((longest_backtick_run(&body) + 1).max(3));
    let _ = writeln!(
        md,
        "{fence}{lang}\n{}\n{fence}\n",
        body.trim_end_matches('\n')
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::trial::{RuleHit, SnapshotDrift, Verdict};

    fn result(dir: &Path, kernel: &str, scenario: &str, verdict: Verdict) -> TrialResult {
        let artefacts = dir.join(format!("{kernel}-{scenario}"));
        std::fs::create_dir_all(&artefacts).unwrap();
        TrialResult {
            wall_secs: 3.44,
            boot_to_hello_secs: Some(1.2),
            ..TrialResult::for_test(kernel, scenario, verdict, artefacts)
        }
    }

    #[test]
    fn totals_table_and_failures() {
        let dir = tempfile::tempdir().unwrap();
        let ok = result(dir.path(), "6.12", "basic", Verdict::Ok);
        let skipped = result(
            dir.path(),
            "6.1",
            "probes",
            Verdict::Skipped("lsm-bpf: lsm is `lockdown|yama`\u{1b}[0m".into()),
        );
        let failed = failed_with_evidence(dir.path());
        let panicked = result(
            dir.path(),
            "7.3",
            "storm",
            Verdict::Panic("guest kernel panicked:\nKernel panic - not syncing: x".into()),
        );
        let md = summary(dir.path(), &[ok, skipped, failed, panicked]);

        assert!(
            md.starts_with("## kloop: 1 passed, 2 failed (1 test failure, 1 panic), 1 skipped\n"),
            "{md}"
        );
        assert!(
            md.contains("| kernel | scenario | verdict | time |"),
            "{md}"
        );
        assert!(md.contains("| 6.12 | basic | ok | 3.4 s |"), "{md}");
        // `|` and backticks cannot break the table; the escape shows.
        assert!(
            md.contains("| 6.1 | probes | SKIPPED (lsm-bpf: lsm is \\`lockdown\\|yama\\`\\u{1b}[0m) | 3.4 s |"),
            "{md}"
        );
        // Only the trials that fail the run get a section.
        assert!(md.contains("#### `6.1/basic`: FAILED"), "{md}");
        assert!(md.contains("#### `7.3/storm`: PANIC"), "{md}");
        assert!(!md.contains("#### `6.1/probes`"), "{md}");
        assert!(md.contains("Rules broken: `load-symbols` ×2"), "{md}");
        assert!(
            md.contains("[load-symbols] program \"a\" f0: len 64 != 72: L0@128 KSYMBOL register"),
            "{md}"
        );
        assert!(
            md.contains("[load-symbols] (known bug size-grows) a message with ``` inside"),
            "{md}"
        );
        // A message with a fence in it gets a longer fence.
        assert!(md.contains("````text\n[load-symbols]"), "{md}");
        assert!(
            md.contains("```diff\n  line 3: - KSYMBOL register len=64\n  line 3: + KSYMBOL register len=72\n```"),
            "{md}"
        );
        // The console's last 20 lines, not the first 5.
        assert!(md.contains("console line 6\n"), "{md}");
        assert!(md.contains("console line 25\n```"), "{md}");
        assert!(!md.contains("console line 5\n"), "{md}");
        // A panic has no violations or diff: its message is shown.
        assert!(
            md.contains("```text\nguest kernel panicked:\nKernel panic - not syncing: x\n```"),
            "{md}"
        );
    }

    /// A failed 6.1/basic with all a failure section shows: two violations
    /// (one known, one with a fence in its message), a snapshot drift and a
    /// console longer than the 20 lines shown.
    fn failed_with_evidence(dir: &Path) -> TrialResult {
        let mut failed = result(
            dir,
            "6.1",
            "basic",
            Verdict::failed(
                crate::run::trial::FailureCause::Rules {
                    rules: vec!["lost".into()],
                },
                "2 invariant violation(s) …",
            ),
        );
        failed.violations = vec![
            RuleHit {
                rule: "load-symbols".into(),
                message: "program \"a\" f0: len 64 != 72: L0@128 KSYMBOL register".into(),
                listener: Some(0),
                offset: Some(128),
                records: Vec::new(),
                known_issue: None,
                detail: None,
            },
            RuleHit {
                rule: "load-symbols".into(),
                message: "a message with ``` inside".into(),
                listener: None,
                offset: None,
                records: Vec::new(),
                known_issue: Some("size-grows".into()),
                detail: None,
            },
        ];
        failed.snapshot_drift = Some(SnapshotDrift {
            snapshot: "scenarios/basic/snapshots/6.1.snap".into(),
            pending: None,
            diff: "  line 3: - KSYMBOL register len=64\n  line 3: + KSYMBOL register len=72".into(),
        });
        let console: String = (1..=25).map(|i| format!("console line {i}\n")).collect();
        std::fs::write(failed.artefacts.join("console.log"), console).unwrap();
        failed
    }

    #[test]
    fn code_spans_hold_backticks() {
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("`a"), "`` `a ``");
        assert_eq!(cell("a|b\nc<d"), "a\\|b c&lt;d");
    }
}
