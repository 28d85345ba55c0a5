//! Differential judging: one scenario on a baseline kernel and on a
//! candidate (the baseline with a patch), compared.
//!
//! What counts, in order:
//! - `BROKEN`: the candidate has a violation the baseline lacks, or more of
//!   one than the baseline has, or its run did not complete (panic,
//!   timeout, agent error) where the baseline's did. Violations are
//!   compared by content, never by rule name alone ([`Finding`]): a new
//!   fault of a rule the baseline already breaks is still new, and a
//!   kernel report the baseline has once and the candidate many times is
//!   new many times less once. The rule's own message says what broke.
//! - `CHANGED`: the normalised streams differ (a minimal diff, baseline
//!   `-`, candidate `+`), an overhead figure left the band around the
//!   baseline's, or the scenario ran on one side only.
//! - `FIXED`: a ledger entry (`kernels/known-issues.toml`) shows on the
//!   baseline and no longer on the candidate, the candidate has no
//!   violation the baseline lacks (by content and count) and no overhead
//!   figure left its band. The stream may
//!   differ (a fix removes or adds the records the bug got wrong); the
//!   diff is shown, and the rules, not the diff, judge the rest of the
//!   scenario's stream.
//! - `BASELINE-ONLY`: the same on both sides, but the baseline itself
//!   breaks rules (known bugs, say): shown apart, not the patch's doing.
//! - `SAME`, `SKIPPED` (on both, same reason), `INCOMPARABLE` (the
//!   baseline did not complete, so there is nothing to compare with).

use serde::{Deserialize, Serialize};

use crate::overhead::{FigureKind, TrialOverhead};

/// What one side's trial left, as the comparison needs it.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// `ok`, `FAILED`, `KNOWN`, `SKIPPED`, `PANIC`, … and its first line.
    pub label: String,
    /// The verdict's line as the trial printed it.
    pub headline: String,
    /// The agent's plan ran to its end and the records were judged.
    pub judged: bool,
    /// The skip reason, when skipped.
    pub skipped: Option<String>,
    /// Every violation the trial found, each once per occurrence.
    pub findings: Vec<Finding>,
    /// The ledger entries those violations are known bugs of.
    pub ledger_ids: Vec<String>,
    /// The run was interrupted (Ctrl-C, SIGTERM): it says nothing about
    /// the kernel.
    pub interrupted: bool,
    /// The normalised stream.
    pub normalised: Option<String>,
    /// Its overhead figures, for a scenario that measures.
    pub overhead: Option<TrialOverhead>,
}

/// One violation as the A/B compares it: its rule, its message, and the
/// content that tells it from another violation of the same rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The rule's name.
    pub rule: String,
    /// What a reader sees.
    pub message: String,
    /// What the violation is, without what changes from run to run: its
    /// typed detail as JSON where it has one (the fields a ledger signature
    /// matches: a kernel report's title and frames, an oversized record's
    /// reader, type and excess, …), else its message with addresses, ids,
    /// stream offsets, times and CPUs replaced ([`normalised_message`]).
    pub signature: String,
}

impl Finding {
    /// The finding of a violation of `rule` saying `message`, with its
    /// typed detail when it has one.
    pub fn new(
        rule: impl Into<String>,
        message: impl Into<String>,
        detail: Option<&crate::check::Detail>,
    ) -> Finding {
        let message = message.into();
        let signature = match detail.map(detail_signature) {
            Some(sig) => sig,
            None => normalised_message(&message),
        };
        Finding {
            rule: rule.into(),
            message,
            signature,
        }
    }

    fn key(&self) -> (&str, &str) {
        (&self.rule, &self.signature)
    }
}

/// A detail's fields as JSON, without the fields another copy of the same
/// write fills in after the rules ran (an oversized record's
/// accumulation: an account of the fault, not the fault).
fn detail_signature(d: &crate::check::Detail) -> String {
    let mut d = d.clone();
    if let crate::check::Detail::OversizedRecord(o) = &mut d {
        o.accumulation = None;
    }
    serde_json::to_string(&d).unwrap_or_default()
}

/// `message` with what differs between two runs of the same fault
/// replaced: hex numbers (addresses, flags) by `0x_`, a stream offset
/// (`L1@4096`) by `L1@_`, the value after `id=`, `id `, `t=`, `time=`,
/// `cpu=`, `pid=`, `tid=`, `ppid=`, `ptid=` by `_`, and any other decimal
/// number of six or more digits (a timestamp, a duration in ns) by `N`.
/// Lengths, sizes, counts and names stay: they are the fault.
pub fn normalised_message(message: &str) -> String {
    const VARYING: &[&str] = &[
        "id=", "id ", "t=", "time=", "cpu=", "pid=", "tid=", "ppid=", "ptid=", "@",
    ];
    let b = message.as_bytes();
    let mut out = String::with_capacity(message.len());
    let mut i = 0;
    while i < b.len() {
        // Hex numbers.
        if b[i] == b'0'
            && b.get(i + 1) == Some(&b'x')
            && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
        {
            let mut j = i + 2;
            while j < b.len() && b[j].is_ascii_hexdigit() {
                j += 1;
            }
            out.push_str("0x_");
            i = j;
            continue;
        }
        if b[i].is_ascii_digit()
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric() && b[i - 1] != b'_')
        {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let before = &message[..i];
            if VARYING.iter().any(|v| before.ends_with(v)) {
                out.push('_');
            } else if j - i >= 6 {
                out.push('N');
            } else {
                out.push_str(&message[i..j]);
            }
            i = j;
            continue;
        }
        let ch = message[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// What a scenario comes to between the baseline and the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbClass {
    /// The same verdict, rules, stream and figures.
    Same,
    /// Both judged, no new broken rule, but the stream or a figure differs.
    Changed,
    /// The candidate breaks a rule the baseline holds, or did not finish.
    Broken,
    /// Ledger entries that show on the baseline no longer show on the
    /// candidate, and nothing else broke or left its band.
    Fixed,
    /// Only the baseline broke rules, and the same on the candidate.
    BaselineOnly,
    /// Skipped on one side or both.
    Skipped,
    /// The baseline did not finish: nothing to compare with.
    Incomparable,
}

impl AbClass {
    /// How reports print it (`SAME`, `CHANGED`, …).
    pub fn label(self) -> &'static str {
        match self {
            AbClass::Same => "SAME",
            AbClass::Changed => "CHANGED",
            AbClass::Broken => "BROKEN",
            AbClass::Fixed => "FIXED",
            AbClass::BaselineOnly => "BASELINE-ONLY",
            AbClass::Skipped => "SKIPPED",
            AbClass::Incomparable => "INCOMPARABLE",
        }
    }

    /// Does this outcome reject the candidate (`validate`'s exit status)?
    /// A fix does not; which fixes were expected is [`accept`]'s to judge.
    pub fn rejects(self) -> bool {
        matches!(
            self,
            AbClass::Changed | AbClass::Broken | AbClass::Incomparable
        )
    }

    /// Did the candidate behave differently at all (a mutant, which is
    /// meant to fix nothing, is caught by a fix as much as by a break)?
    pub fn differs(self) -> bool {
        self.rejects() || self == AbClass::Fixed
    }
}

/// One overhead figure on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureChange {
    /// The figure's name (`basic/unload/L1`).
    pub figure: String,
    /// Its value on the baseline.
    pub baseline: f64,
    /// Its value on the candidate.
    pub candidate: f64,
    /// candidate / baseline.
    pub ratio: f64,
    /// Allowed relative distance.
    pub band: f64,
    /// The candidate lies within the band.
    pub within: bool,
}

/// The comparison of one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AbOutcome {
    /// The scenario compared.
    pub scenario: String,
    /// What it comes to.
    pub class: AbClass,
    /// Why: broken rules with their messages, the stream diff, figures.
    pub details: Vec<String>,
    /// Diff lines of the normalised streams: `-` baseline, `+` candidate.
    pub diff: Vec<String>,
    /// Every overhead figure on both sides.
    pub figures: Vec<FigureChange>,
    /// What the baseline itself broke, shown apart.
    #[serde(default)]
    pub baseline_issues: Vec<String>,
    /// The ledger entries the baseline's violations are known bugs of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_known: Vec<String>,
    /// With [`AbClass::Fixed`]: those that no longer show on the candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixed: Vec<String>,
}

const MAX_DIFF_LINES: usize = 40;
const MAX_RULE_LINES: usize = 8;

/// The outcomes decided before anything is compared: a skip on either
/// side, an interrupted or incomplete trial. Returns whether `out` is
/// final.
fn settled_before_comparing(base: &Side, cand: &Side, out: &mut AbOutcome) -> bool {
    match (&base.skipped, &cand.skipped) {
        (Some(b), Some(c)) => {
            out.class = if b == c {
                AbClass::Skipped
            } else {
                AbClass::Changed
            };
            out.details.push(format!("skipped on the baseline: {b}"));
            if b != c {
                out.details.push(format!("skipped on the candidate: {c}"));
            }
            return true;
        }
        (None, Some(c)) if base.judged => {
            out.class = AbClass::Changed;
            out.details.push(format!(
                "ran on the baseline but is skipped on the candidate: {c}"
            ));
            return true;
        }
        (Some(b), None) => {
            out.class = AbClass::Changed;
            out.details.push(format!(
                "skipped on the baseline ({b}) but runs on the candidate ({})",
                cand.headline
            ));
            return true;
        }
        _ => {}
    }
    if base.interrupted || cand.interrupted {
        out.class = AbClass::Incomparable;
        out.details.push(format!(
            "interrupted: baseline {}, candidate {}",
            base.headline, cand.headline
        ));
        return true;
    }
    if !base.judged {
        out.class = AbClass::Incomparable;
        out.details.push(format!(
            "the baseline did not complete ({}): nothing to compare the candidate ({}) with",
            base.headline, cand.headline
        ));
        return true;
    }
    if !cand.judged {
        out.class = AbClass::Broken;
        out.details.push(format!(
            "the candidate did not complete where the baseline did: {}",
            cand.headline
        ));
        return true;
    }
    false
}

/// BROKEN when the candidate has a violation the baseline lacks, by
/// content and count: for each (rule, signature), the candidate's
/// occurrences beyond the baseline's are new. A ledger entry covering the
/// baseline's violations of that rule excuses none of them: the ledger
/// speaks of the baseline, and a candidate that trades one fault for
/// another of the same rule has a new fault.
fn new_faults(base: &Side, cand: &Side, out: &mut AbOutcome) {
    use std::collections::BTreeMap;
    let count = |side: &'_ Side| {
        let mut n: BTreeMap<(String, String), usize> = BTreeMap::new();
        for f in &side.findings {
            *n.entry((f.rule.clone(), f.signature.clone())).or_default() += 1;
        }
        n
    };
    let (base_count, cand_count) = (count(base), count(cand));
    // Each new (rule, signature) once, in the candidate's order, quoted by
    // its first occurrence.
    let mut named: Vec<&Finding> = Vec::new();
    let mut extra = 0usize;
    for (key, &c) in &cand_count {
        let b = base_count.get(key).copied().unwrap_or(0);
        if c > b {
            extra += c - b;
            if let Some(f) = cand.findings.iter().find(|f| f.key() == (&key.0, &key.1)) {
                named.push(f);
            }
        }
    }
    if named.is_empty() {
        return;
    }
    let order = |f: &Finding| cand.findings.iter().position(|g| std::ptr::eq(g, f));
    named.sort_by_key(|f| order(f));
    out.class = AbClass::Broken;
    out.details.push(format!(
        "{extra} violation(s) the baseline does not have (compared by rule and content, with counts):"
    ));
    for f in named.iter().take(MAX_RULE_LINES) {
        let key = (f.rule.clone(), f.signature.clone());
        let c = cand_count.get(&key).copied().unwrap_or(0);
        let b = base_count.get(&key).copied().unwrap_or(0);
        let times = if c > 1 || b > 0 {
            format!(" (×{c} on the candidate, ×{b} on the baseline)")
        } else {
            String::new()
        };
        out.details
            .push(format!("  [{}] {}{times}", f.rule, f.message));
    }
    if named.len() > MAX_RULE_LINES {
        out.details
            .push(format!("  … {} more", named.len() - MAX_RULE_LINES));
    }
}

/// CHANGED when an overhead figure left its band around the baseline's.
fn figures_moved(b: &TrialOverhead, c: &TrialOverhead, out: &mut AbOutcome) {
    out.figures = figure_changes(b, c);
    let moved: Vec<&FigureChange> = out.figures.iter().filter(|f| !f.within).collect();
    if !moved.is_empty() {
        if out.class == AbClass::Same {
            out.class = AbClass::Changed;
        }
        out.details.push(format!(
            "{} overhead figure(s) left the band around the baseline's ({}):",
            moved.len(),
            b.clock.label()
        ));
        for f in moved {
            out.details.push(format!(
                "  {}: {} → {} (×{:.3}, band ±{:.1}%)",
                f.figure,
                figure_text(f.baseline),
                figure_text(f.candidate),
                f.ratio,
                f.band * 100.0
            ));
        }
    }
}

/// Compares one scenario's trial on the baseline with the candidate's.
pub fn compare(scenario: &str, base: &Side, cand: &Side) -> AbOutcome {
    let mut out = AbOutcome {
        scenario: scenario.to_string(),
        class: AbClass::Same,
        details: Vec::new(),
        diff: Vec::new(),
        figures: Vec::new(),
        baseline_issues: base
            .findings
            .iter()
            .map(|f| format!("[{}] {}", f.rule, f.message))
            .collect(),
        baseline_known: base.ledger_ids.clone(),
        fixed: Vec::new(),
    };
    if settled_before_comparing(base, cand, &mut out) {
        return out;
    }
    new_faults(base, cand, &mut out);
    if let (Some(b), Some(c)) = (&base.normalised, &cand.normalised) {
        out.diff = stream_diff(b, c);
        if !out.diff.is_empty() && out.class == AbClass::Same {
            out.class = AbClass::Changed;
            out.details
                .push("the normalised streams differ (- baseline, + candidate)".into());
        }
    }
    if let (Some(b), Some(c)) = (&base.overhead, &cand.overhead) {
        figures_moved(b, c, &mut out);
    }
    let fixed: Vec<String> = base
        .ledger_ids
        .iter()
        .filter(|id| !cand.ledger_ids.contains(id))
        .cloned()
        .collect();
    let figures_moved = out.figures.iter().any(|f| !f.within);
    if !fixed.is_empty() && out.class != AbClass::Broken && !figures_moved {
        out.class = AbClass::Fixed;
        out.details.insert(
            0,
            format!(
                "known bug(s) of the baseline no longer show: {}",
                fixed.join(", ")
            ),
        );
        out.fixed = fixed;
    }
    if out.class == AbClass::Same && !out.baseline_issues.is_empty() {
        out.class = AbClass::BaselineOnly;
    }
    out
}

/// `40 scenario(s): 38 same, 1 fixed, 0 changed, …` of an A/B run.
pub fn counts(outcomes: &[AbOutcome]) -> String {
    format!("{} scenario(s): {}", outcomes.len(), class_counts(outcomes))
}

/// `38 same, 1 fixed, 0 changed, …`: how many outcomes of each class.
pub fn class_counts(outcomes: &[AbOutcome]) -> String {
    let count = |c: AbClass| outcomes.iter().filter(|o| o.class == c).count();
    format!(
        "{} same, {} fixed, {} changed, {} broken, {} baseline-only, {} skipped, {} incomparable",
        count(AbClass::Same),
        count(AbClass::Fixed),
        count(AbClass::Changed),
        count(AbClass::Broken),
        count(AbClass::BaselineOnly),
        count(AbClass::Skipped),
        count(AbClass::Incomparable)
    )
}

/// Whether an A/B run accepts the candidate, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acceptance {
    /// Exit 0.
    pub accepted: bool,
    /// One line per reason it is not (empty when accepted).
    pub reasons: Vec<String>,
}

/// Judges a whole A/B run: every scenario compared (`compared` of
/// `planned`), none rejecting, and, with `expect_fixed` (`validate
/// --expect-fixed`), exactly those ledger entries fixed: each in at least
/// one scenario, and no other entry (a fix that ends more than it says is
/// a change to look at, not a bonus).
pub fn accept(outcomes: &[AbOutcome], planned: usize, expect_fixed: &[String]) -> Acceptance {
    let mut reasons = Vec::new();
    // An A/B in which no scenario ran on both sides proves nothing about
    // the patches: it is not a pass.
    if !outcomes.iter().any(|o| o.class != AbClass::Skipped) {
        let why = outcomes
            .iter()
            .flat_map(|o| o.details.first())
            .next()
            .map(|d| format!(" (first: {d})"))
            .unwrap_or_default();
        reasons.push(format!(
            "nothing was compared: none of the {planned} scenario(s) ran on both kernels{why}; \
             pick scenarios these kernels can run (`cargo xtask vm-test --list`) or a kernel \
             config that has what they require"
        ));
    }
    if outcomes.len() != planned {
        reasons.push(format!(
            "{} of {planned} scenario(s) compared: a trial of the other(s) is missing",
            outcomes.len()
        ));
    }
    for o in outcomes.iter().filter(|o| o.class.rejects()) {
        reasons.push(format!("{}: {}", o.scenario, o.class.label()));
    }
    if !expect_fixed.is_empty() {
        for id in expect_fixed {
            if !outcomes.iter().any(|o| o.fixed.contains(id)) {
                let showed: Vec<String> = outcomes
                    .iter()
                    .filter(|o| o.baseline_known.contains(id))
                    .map(|o| format!("{} ({})", o.scenario, o.class.label()))
                    .collect();
                reasons.push(if showed.is_empty() {
                    format!("{id} is not fixed: it never showed on the baseline (run the scenarios its ledger entry names)")
                } else {
                    format!("{id} is not fixed: it showed on the baseline in {} and the candidate did not end it there", showed.join(", "))
                });
            }
        }
        for o in outcomes {
            for id in o.fixed.iter().filter(|id| !expect_fixed.contains(id)) {
                reasons.push(format!(
                    "{}: {id} no longer shows either, which --expect-fixed does not name (add --expect-fixed {id} if the fix is meant to end it)",
                    o.scenario
                ));
            }
        }
    }
    Acceptance {
        accepted: reasons.is_empty(),
        reasons,
    }
}

/// A median in whole instructions or ns, a ratio to four places.
fn figure_text(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

/// `- line` / `+ line` for every line that differs (Myers, minimal), at
/// most [`MAX_DIFF_LINES`].
pub fn stream_diff(base: &str, cand: &str) -> Vec<String> {
    let base = base.trim_end_matches('\n');
    let cand = cand.trim_end_matches('\n');
    if base == cand {
        return Vec::new();
    }
    let diff = similar::TextDiff::from_lines(base, cand);
    let mut out = Vec::new();
    for change in diff.iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Equal => continue,
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
        };
        if out.len() == MAX_DIFF_LINES {
            out.push("… (see the two normalised.txt files)".into());
            break;
        }
        out.push(format!("{sign} {}", change.value().trim_end_matches('\n')));
    }
    out
}

/// Every figure of both runs, candidate against baseline. The band is the
/// clock's: under `-icount` a guest's instruction counts repeat within
/// 0.4% from boot to boot (see `overhead::ICOUNT_TOLERANCE`), so 1% is the
/// baseline's own run-to-run spread with room; real-time clocks get their
/// wider bands. Counts must match exactly.
pub fn figure_changes(base: &TrialOverhead, cand: &TrialOverhead) -> Vec<FigureChange> {
    let (median_band, ratio_band) = base.clock.default_tolerances();
    let mut out = Vec::new();
    for b in &base.figures {
        let Some(c) = cand.figures.iter().find(|c| c.name == b.name) else {
            continue;
        };
        let band = match b.kind {
            FigureKind::Median => median_band,
            FigureKind::Ratio => ratio_band,
            FigureKind::Count => 0.0,
        };
        let ratio = if b.value == 0.0 {
            if c.value == 0.0 {
                1.0
            } else {
                f64::INFINITY
            }
        } else {
            c.value / b.value
        };
        out.push(FigureChange {
            figure: b.name.clone(),
            baseline: b.value,
            candidate: c.value,
            ratio,
            band,
            within: (ratio - 1.0).abs() <= band * (1.0 + 1e-9),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overhead::Clock;

    fn side(rules: &[(&str, &str)], stream: &str) -> Side {
        Side {
            label: "ok".into(),
            headline: "ok".into(),
            judged: true,
            skipped: None,
            findings: rules
                .iter()
                .map(|(r, m)| Finding::new(*r, *m, None))
                .collect(),
            normalised: Some(stream.into()),
            overhead: None,
            ledger_ids: Vec::new(),
            interrupted: false,
        }
    }

    /// A side whose violations are all the known bug `id`.
    fn known(id: &str, rules: &[(&str, &str)], stream: &str) -> Side {
        Side {
            ledger_ids: vec![id.to_string()],
            ..side(rules, stream)
        }
    }

    // The interpreter scenario as 6.12.117 built without and with the
    // interpreted-prog-ksymbol fix gave it: the baseline's two nameless
    // KSYMBOLs at __bpf_prog_run32 are known bugs, the candidate has none.
    const INTERP_BASE: &str = "PROG_LOAD interpreted\nKSYMBOL register BPF len=0 name=\"\"\nPROG_UNLOAD interpreted\nKSYMBOL unregister BPF len=0 name=\"\"\n";
    const INTERP_FIXED: &str = "PROG_LOAD interpreted\nPROG_UNLOAD interpreted\n";

    fn interpreter_base() -> Side {
        Side {
            ledger_ids: vec![
                "interpreted-prog-ksymbol-register".into(),
                "interpreted-prog-ksymbol-unregister".into(),
            ],
            ..side(
                &[
                    ("load-symbols", "KSYMBOL register with len 0"),
                    (
                        "unload-symbols",
                        "KSYMBOL unregister of an unregistered address",
                    ),
                ],
                INTERP_BASE,
            )
        }
    }

    fn report(title: &str, frames: &[&str]) -> Finding {
        let r = crate::check::detail::KernelReport {
            check: "kmemleak".into(),
            title: title.into(),
            frames: frames.iter().map(|f| f.to_string()).collect(),
        };
        let message = format!("{title} ← {}", frames.join(" ← "));
        Finding::new(
            "kmemleak",
            message,
            Some(&crate::check::Detail::KernelReport(r)),
        )
    }

    fn with_findings(findings: Vec<Finding>) -> Side {
        Side {
            findings,
            ..side(&[], "s")
        }
    }

    #[test]
    fn a_kernel_report_the_baseline_also_has_is_not_blamed_and_a_new_one_is() {
        let noise = report("unreferenced object (size 32)", &["acpi_os_map"]);
        let leak = report(
            "unreferenced object (size 64)",
            &["perf_event_ksymbol", "bpf_prog_load"],
        );
        let base = with_findings(vec![noise.clone()]);
        // The same report on both sides: not the candidate's.
        let o = compare("basic", &base, &with_findings(vec![noise.clone()]));
        assert!(!o.class.rejects(), "{o:?}");
        // A new report of a rule the baseline breaks too: the candidate's.
        let o = compare("basic", &base, &with_findings(vec![noise.clone(), leak]));
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
        assert!(
            o.details.iter().any(|d| d.contains("perf_event_ksymbol")),
            "{o:?}"
        );
        // The same title from other code is another report.
        let elsewhere = report(
            "unreferenced object (size 32)",
            &["bpf_trampoline_link_prog"],
        );
        let o = compare("basic", &base, &with_findings(vec![elsewhere]));
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
    }

    #[test]
    fn a_report_the_baseline_has_once_and_the_candidate_many_times_is_broken() {
        let leak = report("unreferenced object (size 64)", &["perf_event_ksymbol"]);
        let base = with_findings(vec![leak.clone()]);
        let o = compare("basic", &base, &with_findings(vec![leak.clone(); 1000]));
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
        assert!(
            o.details[0].starts_with("999 violation(s)"),
            "{:?}",
            o.details
        );
        assert!(
            o.details
                .iter()
                .any(|d| d.contains("(×1000 on the candidate, ×1 on the baseline)")),
            "{o:?}"
        );
        // Fewer than the baseline is not new.
        let o = compare("basic", &with_findings(vec![leak.clone(); 3]), &base);
        assert!(!o.class.rejects(), "{o:?}");
    }

    #[test]
    fn other_rules_compare_by_content_not_by_name() {
        // Two parse faults at different places: another fault.
        let o = compare(
            "basic",
            &side(&[("parse", "listener 1: size 24 too short")], "s"),
            &side(&[("parse", "listener 1: size 64 past the record")], "s"),
        );
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
        // The same fault at another address, id, offset and time: the same.
        let a = "L0@128 KSYMBOL register BPF addr=0xffffffffc0000794 len=96 name=\"x\" t=81234567 cpu=0 (prog id=12)";
        let b = "L0@4096 KSYMBOL register BPF addr=0xffffffffc0003000 len=96 name=\"x\" t=99234567 cpu=1 (prog id=14)";
        let o = compare(
            "basic",
            &side(&[("load-symbols", a)], "s"),
            &side(&[("load-symbols", b)], "s"),
        );
        assert_eq!(o.class, AbClass::BaselineOnly, "{o:?}");
        // A different length is a different fault.
        let c = b.replace("len=96", "len=4096");
        let o = compare(
            "basic",
            &side(&[("load-symbols", a)], "s"),
            &side(&[("load-symbols", &c)], "s"),
        );
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
    }

    #[test]
    fn a_fix_that_trades_a_known_bug_for_another_fault_of_its_rule_is_broken() {
        // The baseline's load-symbols fault is a ledger entry; the
        // candidate no longer shows that entry but breaks load-symbols
        // another way: no entry covers it, and it is new.
        let cand = side(
            &[(
                "load-symbols",
                "KSYMBOL register at 0xffffffffc0001000 names no program loaded",
            )],
            INTERP_FIXED,
        );
        let o = compare("interpreter", &interpreter_base(), &cand);
        assert_eq!(o.class, AbClass::Broken, "{o:?}");
        assert!(o.fixed.is_empty(), "{o:?}");
        assert!(
            o.details
                .iter()
                .any(|d| d.contains("names no program loaded")),
            "{o:?}"
        );
        let ids = vec!["interpreted-prog-ksymbol-register".to_string()];
        assert!(!accept(std::slice::from_ref(&o), 1, &ids).accepted);
    }

    #[test]
    fn an_ab_in_which_nothing_ran_on_both_sides_is_not_accepted() {
        let skip = Side {
            skipped: Some("fentry: CONFIG_DEBUG_INFO_BTF is not set".into()),
            ..Side::default()
        };
        let outcomes = vec![compare("trampolines", &skip, &skip)];
        let a = accept(&outcomes, 1, &[]);
        assert!(!a.accepted);
        assert!(a.reasons[0].starts_with("nothing was compared"), "{a:?}");
        assert!(a.reasons[0].contains("CONFIG_DEBUG_INFO_BTF"), "{a:?}");
        assert!(!accept(&[], 0, &[]).accepted);
        // One scenario compared beside the skipped one is a comparison.
        let same = compare("basic", &side(&[], "a\n"), &side(&[], "a\n"));
        assert!(accept(&[outcomes[0].clone(), same], 2, &[]).accepted);
    }

    #[test]
    fn a_known_bug_gone_on_the_candidate_is_fixed_with_the_diff_shown() {
        let o = compare("interpreter", &interpreter_base(), &side(&[], INTERP_FIXED));
        assert_eq!(o.class, AbClass::Fixed);
        assert_eq!(
            o.fixed,
            vec![
                "interpreted-prog-ksymbol-register",
                "interpreted-prog-ksymbol-unregister"
            ]
        );
        assert!(!o.class.rejects() && o.class.differs());
        let removed = o.diff.iter().filter(|l| l.starts_with("- ")).count();
        let added = o.diff.iter().filter(|l| l.starts_with("+ ")).count();
        assert_eq!(removed - added, 2, "{o:?}");
        assert!(
            !o.diff
                .iter()
                .any(|l| l.starts_with("+ ") && l.contains("KSYMBOL")),
            "{o:?}"
        );
    }

    #[test]
    fn one_entry_gone_and_another_still_showing_fixes_only_the_gone_one() {
        let base = interpreter_base();
        let cand = known(
            "interpreted-prog-ksymbol-unregister",
            &[(
                "unload-symbols",
                "KSYMBOL unregister of an unregistered address",
            )],
            INTERP_BASE,
        );
        let o = compare("interpreter", &base, &cand);
        assert_eq!(o.class, AbClass::Fixed);
        assert_eq!(o.fixed, vec!["interpreted-prog-ksymbol-register"]);
    }

    #[test]
    fn a_fix_that_breaks_another_rule_is_broken_not_fixed() {
        let cand = side(
            &[("ksymbol-len", "len 0 for a JITed program")],
            INTERP_FIXED,
        );
        let o = compare("interpreter", &interpreter_base(), &cand);
        assert_eq!(o.class, AbClass::Broken);
        assert!(o.fixed.is_empty());
    }

    #[test]
    fn a_fix_whose_figures_leave_the_band_is_changed() {
        use crate::overhead::Figure;
        let oh = |v: f64| TrialOverhead {
            kernel: "k".into(),
            budget_pin: None,
            guest_release: "r".into(),
            clock: Clock::Icount,
            points: vec![],
            figures: vec![Figure {
                name: "interpreter/load/L1".into(),
                kind: FigureKind::Median,
                value: v,
            }],
            rows: vec![],
            median_tolerance: 0.01,
            sensitivity: vec![],
            note: None,
        };
        let mut base = interpreter_base();
        base.overhead = Some(oh(4930.0));
        let mut cand = side(&[], INTERP_FIXED);
        cand.overhead = Some(oh(4940.0));
        assert_eq!(compare("interpreter", &base, &cand).class, AbClass::Fixed);
        cand.overhead = Some(oh(9860.0));
        let o = compare("interpreter", &base, &cand);
        assert_eq!(o.class, AbClass::Changed, "{o:?}");
        assert!(o.fixed.is_empty());
    }

    #[test]
    fn expect_fixed_accepts_exactly_the_named_entries() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let fixed = compare("interpreter", &interpreter_base(), &side(&[], INTERP_FIXED));
        let same = compare("basic", &side(&[], "a\n"), &side(&[], "a\n"));
        let outcomes = vec![fixed, same];
        let both = ids(&[
            "interpreted-prog-ksymbol-register",
            "interpreted-prog-ksymbol-unregister",
        ]);
        assert!(accept(&outcomes, 2, &both).accepted);
        // Without --expect-fixed a fix is no rejection.
        assert!(accept(&outcomes, 2, &[]).accepted);
        // Naming one of the two: the other ended too, unannounced.
        let one = accept(&outcomes, 2, &ids(&["interpreted-prog-ksymbol-register"]));
        assert!(!one.accepted);
        assert!(
            one.reasons[0].contains("interpreted-prog-ksymbol-unregister no longer shows either"),
            "{one:?}"
        );
        // An entry the run never showed cannot be proven fixed.
        let other = accept(
            &outcomes,
            2,
            &ids(&["ksymbol-bpf-event-header-size-accumulates"]),
        );
        assert!(!other.accepted);
        assert!(
            other
                .reasons
                .iter()
                .any(|r| r.contains("never showed on the baseline")),
            "{other:?}"
        );
        // A scenario that changed rejects whatever was fixed.
        let changed = compare("basic", &side(&[], "a\n"), &side(&[], "b\n"));
        let with_change = vec![outcomes[0].clone(), changed];
        let r = accept(&with_change, 2, &both);
        assert_eq!(r.reasons, vec!["basic: CHANGED"]);
        // A missing comparison rejects.
        assert!(!accept(&outcomes[..1], 2, &both).accepted);
    }

    #[test]
    fn same_streams_and_rules_are_same() {
        let o = compare("s", &side(&[], "a\nb\n"), &side(&[], "a\nb"));
        assert_eq!(o.class, AbClass::Same);
        assert!(!o.class.rejects());
    }

    #[test]
    fn a_rule_new_on_the_candidate_is_broken_with_its_message() {
        let base = side(&[("load-symbols", "known on both")], "a\n");
        let cand = side(
            &[
                ("load-symbols", "known on both"),
                ("ksymbol-len", "len 45 but jited_func_lens says 12"),
            ],
            "a\n",
        );
        let o = compare("s", &base, &cand);
        assert_eq!(o.class, AbClass::Broken);
        assert!(
            o.details.iter().any(|d| d.contains("[ksymbol-len] len 45")),
            "{o:?}"
        );
        assert!(
            !o.details.iter().any(|d| d.contains("known on both")),
            "{o:?}"
        );
        assert_eq!(o.baseline_issues, vec!["[load-symbols] known on both"]);
    }

    #[test]
    fn a_different_stream_is_changed_with_a_minimal_diff() {
        let o = compare("s", &side(&[], "a\nb\nc\n"), &side(&[], "a\nX\nb\nc\n"));
        assert_eq!(o.class, AbClass::Changed);
        assert_eq!(o.diff, vec!["+ X"]);
    }

    #[test]
    fn baseline_issues_alone_are_baseline_only() {
        let b = side(&[("parse", "bad size")], "a\n");
        let c = side(&[("parse", "bad size")], "a\n");
        let o = compare("s", &b, &c);
        assert_eq!(o.class, AbClass::BaselineOnly);
        assert!(!o.class.rejects());
    }

    #[test]
    fn a_candidate_that_panics_is_broken_and_a_baseline_that_panics_is_incomparable() {
        let ok = side(&[], "a\n");
        let panic = Side {
            label: "PANIC".into(),
            headline: "PANIC".into(),
            ..Side::default()
        };
        assert_eq!(compare("s", &ok, &panic).class, AbClass::Broken);
        assert_eq!(compare("s", &panic, &ok).class, AbClass::Incomparable);
    }

    #[test]
    fn an_interrupted_side_is_incomparable_never_broken() {
        let cand = Side {
            judged: false,
            interrupted: true,
            headline: "INTERRUPTED: interrupted by SIGINT/SIGTERM".into(),
            ..side(&[], "a\n")
        };
        assert_eq!(
            compare("s", &side(&[], "a\n"), &cand).class,
            AbClass::Incomparable
        );
    }

    #[test]
    fn skips_compare_by_reason() {
        let skip = |r: &str| Side {
            skipped: Some(r.into()),
            ..Side::default()
        };
        assert_eq!(compare("s", &skip("A"), &skip("A")).class, AbClass::Skipped);
        assert_eq!(compare("s", &skip("A"), &skip("B")).class, AbClass::Changed);
        assert_eq!(
            compare("s", &side(&[], "a"), &skip("CONFIG_FUTEX not set")).class,
            AbClass::Changed
        );
    }

    #[test]
    fn an_overhead_figure_out_of_band_is_changed_and_named() {
        use crate::overhead::Figure;
        let oh = |v: f64| TrialOverhead {
            kernel: "k".into(),
            budget_pin: None,
            guest_release: "r".into(),
            clock: Clock::Icount,
            points: vec![],
            figures: vec![
                Figure {
                    name: "basic/unload/L1".into(),
                    kind: FigureKind::Median,
                    value: v,
                },
                Figure {
                    name: "basic/functions".into(),
                    kind: FigureKind::Count,
                    value: 1.0,
                },
            ],
            rows: vec![],
            median_tolerance: 0.01,
            sensitivity: vec![],
            note: None,
        };
        let mut b = side(&[], "a");
        let mut c = side(&[], "a");
        b.overhead = Some(oh(4930.0));
        c.overhead = Some(oh(4960.0));
        assert_eq!(compare("s", &b, &c).class, AbClass::Same);
        c.overhead = Some(oh(9860.0));
        let o = compare("s", &b, &c);
        assert_eq!(o.class, AbClass::Changed);
        assert!(
            o.details
                .iter()
                .any(|d| d.contains("basic/unload/L1: 4930 → 9860 (×2.000")),
            "{o:?}"
        );
    }
}
