//! The report of an A/B run: one line per scenario (`SAME`, `CHANGED`,
//! `BROKEN`, …), the details under each that is not the same, the
//! baseline's own issues apart, and `ab.json` for machines.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::judge::ab::{AbClass, AbOutcome};

/// ANSI colours when writing to a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Never,
    Ansi,
}

impl Colour {
    /// ANSI when stdout is a terminal and `NO_COLOR` is not set.
    pub fn for_stdout() -> Colour {
        let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
        if tty && std::env::var_os("NO_COLOR").is_none() {
            Colour::Ansi
        } else {
            Colour::Never
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        match self {
            Colour::Never => text.to_string(),
            Colour::Ansi => format!("\x1b[{code}m{text}\x1b[0m"),
        }
    }
}

/// The whole report, baseline and candidate named in the header.
pub fn render(baseline: &str, candidate: &str, outcomes: &[AbOutcome], colour: Colour) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A/B: baseline {baseline} vs candidate {candidate}");
    for o in outcomes {
        let label = match o.class {
            AbClass::Fixed => format!("FIXED ({})", o.fixed.join(", ")),
            c => c.label().to_string(),
        };
        let painted = match o.class {
            AbClass::Same | AbClass::Skipped | AbClass::Fixed => colour.paint("32", &label),
            AbClass::BaselineOnly => colour.paint("33", &label),
            _ => colour.paint("1;31", &label),
        };
        let _ = writeln!(out, "  {:<20} {painted}", o.scenario);
        if o.class == AbClass::Same {
            continue;
        }
        for d in &o.details {
            let _ = writeln!(out, "      {d}");
        }
        for line in &o.diff {
            let code = if line.starts_with('-') { "31" } else { "32" };
            let _ = writeln!(out, "        {}", colour.paint(code, line));
        }
    }
    let with_issues: Vec<&AbOutcome> = outcomes
        .iter()
        .filter(|o| !o.baseline_issues.is_empty())
        .collect();
    if !with_issues.is_empty() {
        let _ = writeln!(
            out,
            "baseline issues (present before the candidate's change, not counted against it):"
        );
        for o in with_issues {
            let mut rules: Vec<&str> = Vec::new();
            for r in o
                .baseline_issues
                .iter()
                .filter_map(|i| i.strip_prefix('[').and_then(|r| r.split(']').next()))
            {
                if !rules.contains(&r) {
                    rules.push(r);
                }
            }
            let _ = writeln!(
                out,
                "  {:<20} {} violation(s): {}",
                o.scenario,
                o.baseline_issues.len(),
                rules.join(", ")
            );
        }
    }
    out.push_str(&crate::judge::ab::class_counts(outcomes));
    out
}

/// Writes `ab.json` (every outcome, details and figures included).
pub fn write_json(run_dir: &Path, outcomes: &[AbOutcome]) -> std::io::Result<PathBuf> {
    let path = run_dir.join("ab.json");
    let text = serde_json::to_string_pretty(outcomes).map_err(std::io::Error::other)?;
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_classes_details_and_baseline_issues() {
        let o = vec![
            AbOutcome {
                scenario: "basic".into(),
                class: AbClass::Same,
                details: vec![],
                diff: vec![],
                figures: vec![],
                baseline_issues: vec![],
                baseline_known: vec![],
                fixed: vec![],
                gone: Vec::new(),
            },
            AbOutcome {
                scenario: "interpreter".into(),
                class: AbClass::Fixed,
                details: vec!["known bug(s) of the baseline no longer show: interp-reg".into()],
                diff: vec!["- KSYMBOL register BPF len=0".into()],
                figures: vec![],
                baseline_issues: vec!["[load-symbols] len 0".into()],
                baseline_known: vec!["interp-reg".into()],
                fixed: vec!["interp-reg".into()],
                gone: Vec::new(),
            },
            AbOutcome {
                scenario: "subprogs".into(),
                class: AbClass::Broken,
                details: vec!["[ksymbol-len] len 45".into()],
                diff: vec!["- a".into(), "+ b".into()],
                figures: vec![],
                baseline_issues: vec!["[parse] x".into(), "[lost] y".into(), "[parse] z".into()],
                baseline_known: vec![],
                fixed: vec![],
                gone: Vec::new(),
            },
        ];
        let text = render("built:a", "built:b", &o, Colour::Never);
        assert!(text.contains("basic                SAME"), "{text}");
        assert!(text.contains("subprogs             BROKEN"), "{text}");
        assert!(
            text.contains("interpreter          FIXED (interp-reg)"),
            "{text}"
        );
        assert!(text.contains("[ksymbol-len] len 45"), "{text}");
        assert!(text.contains("        - a\n        + b"), "{text}");
        assert!(
            text.contains("subprogs             3 violation(s): parse, lost"),
            "{text}"
        );
        assert!(text.ends_with(
            "1 same, 1 fixed, 0 changed, 1 broken, 0 baseline-only, 0 skipped, 0 incomparable"
        ));
        assert!(render("a", "b", &o, Colour::Ansi).contains("\x1b[1;31mBROKEN\x1b[0m"));
    }
}
