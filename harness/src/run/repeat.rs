//! `vm-test --repeat N`: every trial run N times, and each trial judged on
//! whether its runs agreed.
//!
//! A run's *outcome* is its verdict (the headline: class, skip reason,
//! known-bug ids; for a failure also the rules it names) and a digest of its
//! normalised stream (`normalised.txt`, what the snapshots hold). A trial
//! whose N runs all have one outcome keeps that verdict; one with two or
//! more outcomes is [`Verdict::Flaky`], which fails the run and lists every
//! outcome with the runs that gave it, their artefacts (all kept, each run
//! in its own directory) and the first line where the streams differ.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::run::trial::{RuleHit, TrialResult, Verdict};

/// What one run of a trial came to, for comparing runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Outcome {
    /// The verdict's headline; for FAILED also the `[rule]` names its
    /// message cites (the message itself quotes addresses and times that
    /// differ between runs of the same finding).
    pub verdict: String,
    /// sha256 of `normalised.txt`, when the run got that far.
    pub stream_sha256: Option<String>,
}

impl Outcome {
    /// The outcome of a finished run, reading its `normalised.txt`.
    /// `may_show` says which ledger entries only excuse (no scenario
    /// listed: the fault shows where the layout of the run puts it).
    pub fn of(r: &TrialResult, may_show: &dyn Fn(&str) -> bool) -> Outcome {
        let stream = std::fs::read(r.artefacts.join("normalised.txt")).ok();
        Outcome {
            verdict: verdict_key(&r.verdict, &r.violations, may_show),
            stream_sha256: stream.map(|s| hex::encode(Sha256::digest(&s))),
        }
    }
}

/// The verdict's headline, and for a failure the rules its trial broke
/// (the message itself quotes addresses and times that differ between runs
/// of the same finding). For a known bug, the ledger entries it showed
/// that are meant to show (an entry that only excuses, listing no
/// scenario, may show in one run and not the next: which is not a
/// flaky kernel); with none left it is the same outcome as `ok`, which a
/// run where such a fault did not show gets.
fn verdict_key(v: &Verdict, violations: &[RuleHit], may_show: &dyn Fn(&str) -> bool) -> String {
    if matches!(v, Verdict::Known(_) | Verdict::Ok) {
        let ids: BTreeSet<&str> = violations
            .iter()
            .filter_map(|h| h.known_issue.as_deref())
            .filter(|id| !may_show(id))
            .collect();
        if ids.is_empty() {
            return Verdict::Ok.headline();
        }
        return format!("KNOWN ({})", ids.into_iter().collect::<Vec<_>>().join(", "));
    }
    let mut key = v.headline();
    if let Verdict::Failed(_) = v {
        let rules: BTreeSet<&str> = violations.iter().map(|h| h.rule.as_str()).collect();
        if !rules.is_empty() {
            let rules: Vec<&str> = rules.into_iter().collect();
            let _ = write!(key, " [{}]", rules.join(", "));
        }
    }
    key
}

/// The runs of one trial, grouped by outcome.
#[derive(Debug, Clone)]
pub struct RepeatedTrial {
    pub id: String,
    /// Every run, in the order they were started.
    pub runs: Vec<TrialResult>,
    /// Each distinct outcome with the (0-based) runs that gave it, most
    /// frequent first.
    pub outcomes: Vec<(Outcome, Vec<usize>)>,
}

impl RepeatedTrial {
    pub fn is_stable(&self) -> bool {
        self.outcomes.len() <= 1
    }

    /// The trial's result over all its runs: the first run's, with a note
    /// when every run agreed; a [`Verdict::Flaky`] otherwise.
    pub fn combined(&self) -> Option<TrialResult> {
        let first = self.runs.first()?;
        let mut r = first.clone();
        let n = self.runs.len();
        if self.is_stable() {
            r.notes.push(format!(
                "repeat: {n}/{n} runs gave the same verdict and stream"
            ));
            return Some(r);
        }
        r.verdict = Verdict::Flaky(self.flaky_message());
        Some(r)
    }

    fn flaky_message(&self) -> String {
        let n = self.runs.len();
        let mut m = format!("FLAKY: {} outcomes in {n} runs", self.outcomes.len());
        let reference = self
            .outcomes
            .first()
            .and_then(|(_, runs)| runs.first())
            .and_then(|i| self.runs.get(*i));
        for (k, (outcome, runs)) in self.outcomes.iter().enumerate() {
            let _ = write!(
                m,
                "\n  runs {}: {}, stream {}",
                run_list(runs),
                outcome.verdict,
                outcome
                    .stream_sha256
                    .as_deref()
                    .map_or("(none)".to_string(), |s| s[..12.min(s.len())].to_string())
            );
            let Some(first) = runs.first().and_then(|i| self.runs.get(*i)) else {
                continue;
            };
            if let Some(line) = first.verdict.message().and_then(|m| m.lines().nth(1)) {
                let _ = write!(m, "\n    {}", line.trim());
            }
            if let Some(reference) = reference {
                if reference.artefacts != first.artefacts {
                    if let Some(d) = stream_difference(&reference.artefacts, &first.artefacts) {
                        let _ = write!(m, "\n    {d}");
                    }
                }
            }
            // Every run of the rarer outcomes; the most frequent one only
            // needs an example.
            let shown = if k == 0 { &runs[..1] } else { &runs[..] };
            for i in shown {
                if let Some(r) = self.runs.get(*i) {
                    let _ = write!(m, "\n    run {}: {}", i + 1, r.artefacts.display());
                }
            }
            if shown.len() < runs.len() {
                let _ = write!(m, "\n    (and {} more alike)", runs.len() - shown.len());
            }
        }
        m
    }
}

/// `1-5, 7, 9-20` (1-based) for 0-based run indexes.
fn run_list(runs: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while let Some(&start) = runs.get(i) {
        let mut end = start;
        while runs.get(i + 1) == Some(&(end + 1)) {
            end += 1;
            i += 1;
        }
        parts.push(if end == start {
            format!("{}", start + 1)
        } else {
            format!("{}-{}", start + 1, end + 1)
        });
        i += 1;
    }
    parts.join(", ")
}

/// Where two runs' normalised streams first differ, as one line.
fn stream_difference(a: &Path, b: &Path) -> Option<String> {
    let a = std::fs::read_to_string(a.join("normalised.txt")).ok()?;
    let b = std::fs::read_to_string(b.join("normalised.txt")).ok()?;
    first_difference(&a, &b).map(|(line, x, y)| {
        format!("stream differs from the first outcome's at line {line}: {x:?} vs {y:?}")
    })
}

/// The first differing line (1-based) of two texts, with both lines
/// (`<end>` where one text is shorter).
pub fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    let mut la = a.lines();
    let mut lb = b.lines();
    let mut n = 0;
    loop {
        n += 1;
        match (la.next(), lb.next()) {
            (None, None) => return None,
            (x, y) if x == y => continue,
            (x, y) => {
                return Some((
                    n,
                    x.unwrap_or("<end>").to_string(),
                    y.unwrap_or("<end>").to_string(),
                ))
            }
        }
    }
}

/// Groups the results of repeated runs by trial id (first-seen order) and
/// each trial's runs by outcome.
pub fn group(
    results: Vec<TrialResult>,
    ledger: &crate::judge::known_issues::Ledger,
) -> Vec<RepeatedTrial> {
    let may_show = |id: &str| ledger.only_excuses(id);
    let mut trials: Vec<RepeatedTrial> = Vec::new();
    for r in results {
        match trials.iter_mut().find(|t| t.id == r.id) {
            Some(t) => t.runs.push(r),
            None => trials.push(RepeatedTrial {
                id: r.id.clone(),
                runs: vec![r],
                outcomes: Vec::new(),
            }),
        }
    }
    for t in &mut trials {
        let mut outcomes: Vec<(Outcome, Vec<usize>)> = Vec::new();
        for (i, r) in t.runs.iter().enumerate() {
            let o = Outcome::of(r, &may_show);
            match outcomes.iter_mut().find(|(x, _)| *x == o) {
                Some((_, runs)) => runs.push(i),
                None => outcomes.push((o, vec![i])),
            }
        }
        outcomes.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
        t.outcomes = outcomes;
    }
    trials
}

/// The per-trial table printed at the end of a repeated run.
pub fn table(trials: &[RepeatedTrial]) -> String {
    let width = trials.iter().map(|t| t.id.len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:<width$}  runs  outcomes  verdict\n", "trial");
    for t in trials {
        let verdict = match t.combined() {
            Some(r) => r.verdict.headline(),
            None => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:>4}  {:>8}  {verdict}",
            t.id,
            t.runs.len(),
            t.outcomes.len()
        );
    }
    let flaky = trials.iter().filter(|t| !t.is_stable()).count();
    let runs: usize = trials.iter().map(|t| t.runs.len()).sum();
    let _ = write!(
        out,
        "{} trial(s), {runs} run(s), {flaky} flaky",
        trials.len()
    );
    out
}

#[derive(Serialize)]
struct RepeatRecord<'a> {
    id: &'a str,
    stable: bool,
    outcomes: Vec<OutcomeRecord<'a>>,
}

#[derive(Serialize)]
struct OutcomeRecord<'a> {
    outcome: &'a Outcome,
    runs: Vec<String>,
}

/// Writes `repeat.json` (every trial, its outcomes and their runs'
/// artefact directories) into the run directory.
pub fn write_report(dir: &Path, trials: &[RepeatedTrial]) -> std::io::Result<()> {
    let records: Vec<RepeatRecord<'_>> = trials
        .iter()
        .map(|t| RepeatRecord {
            id: &t.id,
            stable: t.is_stable(),
            outcomes: t
                .outcomes
                .iter()
                .map(|(o, runs)| OutcomeRecord {
                    outcome: o,
                    runs: runs
                        .iter()
                        .filter_map(|i| t.runs.get(*i))
                        .map(|r| r.artefacts.display().to_string())
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let json = serde_json::to_string_pretty(&records).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("repeat.json"), json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, name: &str, verdict: Verdict, stream: Option<&str>) -> TrialResult {
        let artefacts = dir.join(name);
        std::fs::create_dir_all(&artefacts).unwrap();
        if let Some(s) = stream {
            std::fs::write(artefacts.join("normalised.txt"), s).unwrap();
        }
        TrialResult {
            wall_secs: 4.0,
            ..TrialResult::for_test("7.3", "short-lived", verdict, artefacts)
        }
    }

    #[test]
    fn identical_runs_keep_their_verdict() {
        let d = tempfile::tempdir().unwrap();
        let rs = (0..3)
            .map(|i| run(d.path(), &format!("r{i}"), Verdict::Ok, Some("a\nb\n")))
            .collect();
        let g = group(rs, &Default::default());
        assert_eq!(g.len(), 1);
        assert!(g[0].is_stable());
        let c = g[0].combined().unwrap();
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(c.notes[0].contains("3/3"));
    }

    #[test]
    fn a_different_verdict_is_flaky_and_names_the_runs() {
        let d = tempfile::tempdir().unwrap();
        let mut rs: Vec<TrialResult> = (0..4)
            .map(|i| run(d.path(), &format!("r{i}"), Verdict::Ok, Some("a\nb\n")))
            .collect();
        let mut bad = run(
            d.path(),
            "bad",
            Verdict::failed(
                crate::run::trial::FailureCause::Unstated,
                "1 violation\n[programs-accounted] id 137: only 0 record(s)",
            ),
            Some("a\nc\n"),
        );
        // The key comes from the violations as data, not from the message.
        bad.violations = vec![RuleHit {
            rule: "programs-accounted".into(),
            message: "id 137: only 0 record(s)".into(),
            listener: None,
            offset: None,
            records: Vec::new(),
            known_issue: None,
            detail: None,
        }];
        rs.insert(2, bad);
        let g = group(rs, &Default::default());
        assert!(!g[0].is_stable());
        let c = g[0].combined().unwrap();
        assert!(c.verdict.fails_run());
        assert_eq!(c.verdict.label(), "FLAKY");
        let m = c.verdict.message().unwrap();
        assert!(m.starts_with("FLAKY: 2 outcomes in 5 runs"), "{m}");
        assert!(m.contains("runs 1-2, 4-5: ok"), "{m}");
        assert!(m.contains("runs 3: FAILED [programs-accounted]"), "{m}");
        assert!(m.contains("line 2: \"b\" vs \"c\""), "{m}");
        assert!(
            m.contains(&d.path().join("bad").display().to_string()),
            "{m}"
        );
        assert!(table(&g).ends_with("1 trial(s), 5 run(s), 1 flaky"));
    }

    #[test]
    fn the_same_verdict_with_another_stream_is_flaky() {
        let d = tempfile::tempdir().unwrap();
        let rs = vec![
            run(d.path(), "a", Verdict::Ok, Some("x\n")),
            run(d.path(), "b", Verdict::Ok, Some("y\n")),
        ];
        assert!(!group(rs, &Default::default())[0].is_stable());
    }

    #[test]
    fn failures_compare_by_rules_not_by_addresses() {
        let d = tempfile::tempdir().unwrap();
        let rs = vec![
            run(
                d.path(),
                "a",
                Verdict::failed(
                    crate::run::trial::FailureCause::Unstated,
                    "x\n[lost] 3 at 0xffff1",
                ),
                None,
            ),
            run(
                d.path(),
                "b",
                Verdict::failed(
                    crate::run::trial::FailureCause::Unstated,
                    "x\n[lost] 3 at 0xffff2",
                ),
                None,
            ),
        ];
        assert!(group(rs, &Default::default())[0].is_stable());
    }

    /// A strict entry (its scenario listed) and one that only excuses.
    const TWO_ENTRIES: &str = r#"
[[issue]]
id = "strict"
rule = "ksymbol-extent"
scenarios = ["short-lived"]
pins = ["7.3"]
summary = "s"
evidence = "e"
upstream_fix = ""
review_by = "2099-01-01"
[[issue.signature]]
fault = "ksymbol-extent"
kind = "trampoline"
len = 4096

[[issue]]
id = "by-layout"
rule = "ksymbol-overlap"
scenarios = []
pins = ["7.3"]
summary = "s"
evidence = "e"
upstream_fix = ""
review_by = "2099-01-01"
[[issue.signature]]
fault = "ksymbol-overlap"
trampoline_len = 4096
"#;

    #[test]
    fn a_fault_an_entry_only_excuses_may_show_in_some_runs_and_not_others() {
        use crate::judge::known_issues::{Ledger, Vocabulary};
        let ledger = Ledger::parse(
            TWO_ENTRIES,
            std::path::Path::new("test"),
            &Vocabulary {
                pins: vec!["7.3".into()],
                rules: crate::judge::known_issues::rule_names()
                    .into_iter()
                    .map(String::from)
                    .collect(),
                scenarios: Vec::new(),
            },
        )
        .unwrap();
        let d = tempfile::tempdir().unwrap();
        let hit = |rule: &str, id: &str| RuleHit {
            rule: rule.into(),
            message: "m".into(),
            listener: None,
            offset: None,
            records: Vec::new(),
            known_issue: Some(id.into()),
            detail: None,
        };
        let known = |name: &str, ids: &[(&str, &str)]| {
            let mut r = run(
                d.path(),
                name,
                Verdict::Known(format!(
                    "known bug: {}",
                    ids.iter().map(|(_, i)| *i).collect::<Vec<_>>().join(", ")
                )),
                Some("a\n"),
            );
            r.violations = ids.iter().map(|(rule, id)| hit(rule, id)).collect();
            r
        };
        let rs = vec![
            known("a", &[("ksymbol-extent", "strict")]),
            known(
                "b",
                &[
                    ("ksymbol-extent", "strict"),
                    ("ksymbol-overlap", "by-layout"),
                ],
            ),
        ];
        assert!(group(rs, &ledger)[0].is_stable());
        // A strict entry that shows in one run and not the next is flaky.
        let rs = vec![
            known("c", &[("ksymbol-extent", "strict")]),
            run(d.path(), "d", Verdict::Ok, Some("a\n")),
        ];
        assert!(!group(rs, &ledger)[0].is_stable());
        // The excuse-only entry alone against ok: the same outcome.
        let rs = vec![
            known("e", &[("ksymbol-overlap", "by-layout")]),
            run(d.path(), "f", Verdict::Ok, Some("a\n")),
        ];
        assert!(group(rs, &ledger)[0].is_stable());
    }

    #[test]
    fn run_lists_and_differences() {
        assert_eq!(run_list(&[0, 1, 2, 4, 6, 7]), "1-3, 5, 7-8");
        assert_eq!(first_difference("a\nb", "a\nb"), None);
        assert_eq!(
            first_difference("a\nb", "a"),
            Some((2, "b".into(), "<end>".into()))
        );
    }
}
