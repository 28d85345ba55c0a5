//! Bisection judging: what "changed" means (the predicate), what one run
//! of a step showed, how the runs of a step become old / new / skip, and
//! the binary search over an ordered list of kernels.
//!
//! The decision follows the spirit of syzkaller's `pkg/bisect`: a run
//! that did not reach a verdict (INFRA, TIMEOUT, a boot that never said
//! hello) is never evidence either way; a step whose usable runs disagree
//! is skipped rather than guessed, and a step with too few usable runs is
//! skipped too. The answer carries a confidence from how clean its steps
//! were.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::check::Analysis;
use crate::evidence::RunEvidence;
use kloop_records::RecordContent;

/// What "changed" means between the old and the new end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Predicate {
    /// The normalised stream differs from the old end's.
    Snapshot,
    /// The named rule's state (holds / breaks) differs from the old end's.
    Rule(String),
    /// A raw field of program `label`'s records (`fields.json` key, e.g.
    /// `bpf_event.tag`, `ksymbol.name`, `ksymbol.len`, `info.tag`) differs.
    Field {
        /// The `fields.json` key.
        key: String,
        /// The program's label in the scenario.
        label: String,
    },
    /// An overhead figure (`basic/unload/L1`) leaves the old end's band.
    Overhead(String),
}

/// Why a predicate's text names no predicate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PredicateError {
    /// `field:` names no key of `fields.json`.
    #[error("unknown field `{key}`; known: {}", FIELD_KEYS.join(", "))]
    UnknownField {
        /// The key given.
        key: String,
    },
    /// A field predicate without the program it is about.
    #[error("a field predicate needs --label <program label>")]
    NoLabel,
    /// No known form.
    #[error("unknown predicate `{0}`: use snapshot, rule:NAME, field:<record>.<field> or overhead:<figure>")]
    Unknown(String),
}

impl Predicate {
    /// `snapshot`, `rule:NAME`, `field:<record>.<field>` (with `label`),
    /// `overhead:<figure>`.
    pub fn parse(text: &str, label: Option<&str>) -> Result<Predicate, PredicateError> {
        if text == "snapshot" {
            return Ok(Predicate::Snapshot);
        }
        if let Some(rule) = text.strip_prefix("rule:") {
            return Ok(Predicate::Rule(rule.to_string()));
        }
        if let Some(key) = text.strip_prefix("field:") {
            if !FIELD_KEYS.contains(&key) {
                return Err(PredicateError::UnknownField {
                    key: key.to_string(),
                });
            }
            let label = label.ok_or(PredicateError::NoLabel)?;
            return Ok(Predicate::Field {
                key: key.to_string(),
                label: label.to_string(),
            });
        }
        if let Some(fig) = text.strip_prefix("overhead:") {
            return Ok(Predicate::Overhead(fig.to_string()));
        }
        Err(PredicateError::Unknown(text.to_string()))
    }
}

/// Where a trial leaves its raw fields (see [`fields`]).
pub const FIELDS_FILE: &str = "fields.json";

/// Raw fields `fields.json` records per program label.
pub const FIELD_KEYS: &[&str] = &[
    "bpf_event.tag",
    "bpf_event.flags",
    "ksymbol.name",
    "ksymbol.len",
    "ksymbol.flags",
    "info.tag",
    "info.name",
    "info.func_lens",
];

/// Raw record fields per program label, before normalisation: what a
/// field predicate compares (`fields.json` in a trial's artefacts).
pub fn fields(
    evidence: &RunEvidence,
    analysis: &Analysis,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in &evidence.progs {
        let mut f: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut push = |k: &str, v: String| f.entry(k.to_string()).or_default().push(v);
        for r in &analysis.merged {
            match RecordContent::of_record(r) {
                Some(RecordContent::BpfEvent {
                    event_type,
                    flags,
                    id,
                    tag,
                }) if id == p.id => {
                    push(
                        "bpf_event.tag",
                        format!("{event_type}:{}", tag.map(hex::encode).unwrap_or_default()),
                    );
                    push("bpf_event.flags", format!("{event_type}:{flags}"));
                }
                Some(RecordContent::Ksymbol {
                    addr,
                    len,
                    flags,
                    name,
                    ..
                }) if p.jited_ksyms.contains(&addr) => {
                    push("ksymbol.name", name);
                    push("ksymbol.len", len.to_string());
                    push("ksymbol.flags", flags.to_string());
                }
                _ => {}
            }
        }
        push("info.tag", hex::encode(p.tag));
        push("info.name", p.name.clone());
        push(
            "info.func_lens",
            p.jited_func_lens
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
        out.insert(
            p.label.clone(),
            f.into_iter().map(|(k, v)| (k, v.join(" "))).collect(),
        );
    }
    out
}

/// What one run of a step showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Observation {
    /// A value compared for equality (stream, rule state, field).
    Text(String),
    /// An overhead figure.
    Figure(f64),
    /// The run reached no verdict: infrastructure, timeout, no boot.
    NoVerdict(String),
}

/// One run of a step, against the old end's observation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum RunClass {
    /// Like the old end.
    Old,
    /// Unlike the old end.
    New,
    /// The run reached no verdict (infrastructure, timeout, a kernel that
    /// did not boot): why.
    NoVerdict(String),
}

/// `obs` against the old end's `reference`. Figures are new outside
/// `band` (relative) around the reference.
pub fn classify(reference: &Observation, obs: &Observation, band: f64) -> RunClass {
    match (reference, obs) {
        (_, Observation::NoVerdict(why)) => RunClass::NoVerdict(why.clone()),
        (Observation::Figure(r), Observation::Figure(v)) => {
            if (v - r).abs() <= band * r.abs() * (1.0 + 1e-9) {
                RunClass::Old
            } else {
                RunClass::New
            }
        }
        (a, b) if a == b => RunClass::Old,
        _ => RunClass::New,
    }
}

/// A step's decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum StepVerdict {
    /// The step's build behaves like the old end.
    Old,
    /// It behaves like the new end.
    New,
    /// Its runs did not agree or reached no verdict: why.
    Skip(String),
}

/// The runs of one step to a decision: at least half the runs must have
/// reached a verdict and all of those must agree; otherwise skip (a
/// flaky or broken build is never a verdict).
pub fn decide(runs: &[RunClass]) -> StepVerdict {
    let usable: Vec<&RunClass> = runs
        .iter()
        .filter(|r| !matches!(r, RunClass::NoVerdict(_)))
        .collect();
    if usable.is_empty() {
        let why = runs
            .iter()
            .find_map(|r| match r {
                RunClass::NoVerdict(w) => Some(w.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "no runs".into());
        return StepVerdict::Skip(format!("no run reached a verdict: {why}"));
    }
    if usable.len() * 2 < runs.len() {
        return StepVerdict::Skip(format!(
            "only {} of {} runs reached a verdict",
            usable.len(),
            runs.len()
        ));
    }
    let new = usable.iter().filter(|r| ***r == RunClass::New).count();
    match new {
        0 => StepVerdict::Old,
        n if n == usable.len() => StepVerdict::New,
        n => StepVerdict::Skip(format!("runs disagree: {n} new, {} old", usable.len() - n)),
    }
}

/// How sure the answer is, 0..1: each decided step contributes the share
/// of its runs that reached a verdict (all agreed, or it was skipped); an
/// untested build left between the last old and the first new one makes
/// the answer a range and halves the confidence for each.
pub fn confidence(steps: &[(StepVerdict, usize, usize)], ambiguous: usize) -> f64 {
    let mut c = 1.0;
    for (v, usable, total) in steps {
        if matches!(v, StepVerdict::Old | StepVerdict::New) && *total > 0 {
            c *= *usable as f64 / *total as f64;
        }
    }
    c * 0.5f64.powi(ambiguous as i32)
}

/// The result of a binary search over `0..n` (0 old, n-1 new).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResult {
    /// Index of the last build that is old and the first that is new.
    pub last_old: usize,
    /// See `last_old`.
    pub first_new: usize,
    /// Builds between them that were skipped: the change is in one of
    /// them or in `first_new`.
    pub skipped_between: Vec<usize>,
    /// Every step in order: (index, verdict).
    pub steps: Vec<(usize, StepVerdict)>,
}

/// Binary search for the first new build, the ends known (index 0 old,
/// `n - 1` new). A skipped build is set aside and the nearest untested
/// build to the middle is tried instead, as `git bisect skip` does.
pub fn search(n: usize, mut step: impl FnMut(usize) -> StepVerdict) -> SearchResult {
    let (mut lo, mut hi) = (0usize, n.saturating_sub(1));
    let mut skipped = Vec::new();
    let mut steps = Vec::new();
    while hi > lo + 1 {
        let mid = lo + (hi - lo) / 2;
        // The untested build nearest the middle.
        let candidate = (0..hi - lo)
            .flat_map(|d| [mid.checked_sub(d), mid.checked_add(d)])
            .flatten()
            .find(|&i| i > lo && i < hi && !skipped.contains(&i));
        let Some(i) = candidate else { break };
        let v = step(i);
        steps.push((i, v.clone()));
        match v {
            StepVerdict::Old => lo = i,
            StepVerdict::New => hi = i,
            StepVerdict::Skip(_) => skipped.push(i),
        }
    }
    SearchResult {
        last_old: lo,
        first_new: hi,
        skipped_between: skipped.into_iter().filter(|&i| i > lo && i < hi).collect(),
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Observation {
        Observation::Text(s.into())
    }

    #[test]
    fn predicates_parse() {
        assert_eq!(Predicate::parse("snapshot", None), Ok(Predicate::Snapshot));
        assert_eq!(
            Predicate::parse("rule:parse", None),
            Ok(Predicate::Rule("parse".into()))
        );
        assert!(Predicate::parse("field:bpf_event.tag", None).is_err());
        assert_eq!(
            Predicate::parse("field:bpf_event.tag", Some("main")),
            Ok(Predicate::Field {
                key: "bpf_event.tag".into(),
                label: "main".into()
            })
        );
        assert!(Predicate::parse("field:nope", Some("main")).is_err());
        assert!(Predicate::parse("vibes", None).is_err());
    }

    #[test]
    fn runs_are_classified_against_the_old_end() {
        assert_eq!(classify(&text("a"), &text("a"), 0.0), RunClass::Old);
        assert_eq!(classify(&text("a"), &text("b"), 0.0), RunClass::New);
        let fig = Observation::Figure;
        assert_eq!(classify(&fig(1000.0), &fig(1009.0), 0.01), RunClass::Old);
        assert_eq!(classify(&fig(1000.0), &fig(1011.0), 0.01), RunClass::New);
        assert!(matches!(
            classify(&text("a"), &Observation::NoVerdict("INFRA".into()), 0.0),
            RunClass::NoVerdict(_)
        ));
    }

    // Recorded step outcomes: what repeated runs of real steps look like.
    #[test]
    fn a_step_is_decided_only_by_agreeing_runs_that_reached_a_verdict() {
        use RunClass::*;
        let infra = || NoVerdict("INFRA: QEMU exited".into());
        assert_eq!(decide(&[Old, Old, Old]), StepVerdict::Old);
        assert_eq!(decide(&[New, New, New]), StepVerdict::New);
        assert_eq!(decide(&[New, infra(), New]), StepVerdict::New);
        assert!(matches!(decide(&[Old, New, Old]), StepVerdict::Skip(m) if m.contains("disagree")));
        assert!(matches!(decide(&[infra(), infra()]), StepVerdict::Skip(m) if m.contains("INFRA")));
        assert!(
            matches!(decide(&[infra(), infra(), New]), StepVerdict::Skip(m) if m.contains("only 1 of 3"))
        );
        assert!(matches!(decide(&[]), StepVerdict::Skip(_)));
    }

    #[test]
    fn confidence_falls_with_unusable_runs_and_ambiguity() {
        let clean = [(StepVerdict::Old, 3, 3), (StepVerdict::New, 3, 3)];
        assert_eq!(confidence(&clean, 0), 1.0);
        let one_infra = [(StepVerdict::Old, 2, 3), (StepVerdict::New, 3, 3)];
        assert!((confidence(&one_infra, 0) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(confidence(&clean, 1), 0.5);
    }

    #[test]
    fn search_finds_the_first_new_build_and_steps_around_skips() {
        // Builds 0..10, the change at 6.
        let r = search(10, |i| {
            if i >= 6 {
                StepVerdict::New
            } else {
                StepVerdict::Old
            }
        });
        assert_eq!((r.last_old, r.first_new), (5, 6));
        assert!(r.steps.len() <= 4, "{:?}", r.steps);
        // Build 5 does not boot: the answer is "5 or 6", and says so.
        let r = search(10, |i| match i {
            5 => StepVerdict::Skip("INFRA".into()),
            i if i >= 6 => StepVerdict::New,
            _ => StepVerdict::Old,
        });
        assert_eq!((r.last_old, r.first_new), (4, 6));
        assert_eq!(r.skipped_between, vec![5]);
        // Adjacent ends: nothing to test.
        let r = search(2, |_| panic!("no step between adjacent ends"));
        assert_eq!((r.last_old, r.first_new, r.steps.len()), (0, 1, 0));
    }
}
