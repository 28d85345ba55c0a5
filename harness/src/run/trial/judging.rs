//! Judging the evidence of a session that ended with `Done`: the rules,
//! the scenario's expectations, the second reader, the normalised stream,
//! the known-issues ledger, the overhead budget and the snapshot.

use std::path::{Path, PathBuf};

use kloop_qemu::GuestSession;

use super::snapshot::{self, SnapshotOutcome};
use super::FailureCause;
use super::{evidence_from, KernelUnderTest, TrialEnv, TrialResult, Verdict, KNOWN_PREFIX};
use crate::judge::evidence::RunEvidence;
pub use crate::scenario::requirement_name;
use crate::scenario::Scenario;

/// The verdict of a completed session's evidence.
pub(super) fn judge(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    artefacts: &Path,
    session: &GuestSession,
    result: &mut TrialResult,
) -> Verdict {
    let evidence = evidence_from(session);
    result.guest_release = Some(evidence.uname.release.clone());
    if let Some(v) = unsupported_verdict(scenario, &evidence) {
        return v;
    }
    let (ledger_pin, report_fixed) = ledger_pin_of(kernel);
    let judging = Judging {
        env,
        kernel,
        scenario,
        artefacts,
        ledger_pin,
        report_fixed,
        perf_under_test: crate::run::payload::perf_override(),
    };
    let judged = analysed(&judging, &evidence, result);
    let analysis = &judged.analysis;
    result.unchecked = judged.unchecked.clone();
    let verdict = judged_verdict(&judging, &evidence, analysis, result);
    unchecked_verdict(verdict, &judged.unchecked)
}

/// A verdict the evidence decided (`ok`, `KNOWN`) stands only if every
/// rule that applies to this kernel had its evidence: one whose evidence
/// was lost ([`Gap::Lost`]: a log that overran, books whose reading failed,
/// a spin reader that saw nothing, a check the kernel was built with that
/// left no answer) makes the trial `INFRA`, naming the rule and why. A
/// rule this kernel gives nothing to judge ([`Gap::NotInKernel`]: no
/// `bpf_prog_pack` before 5.18, trampolines that are pages of their own
/// before 6.7) does not apply to it: that is kept in the result
/// (`unchecked`), exact and narrow, and changes no verdict. A failure
/// stands as it is.
fn unchecked_verdict(verdict: Verdict, unchecked: &[crate::judge::check::Unchecked]) -> Verdict {
    use crate::judge::check::Gap;
    if !matches!(verdict, Verdict::Ok | Verdict::Known(_)) {
        return verdict;
    }
    let lost: Vec<String> = unchecked
        .iter()
        .filter(|u| u.gap == Gap::Lost)
        .map(|u| u.line())
        .collect();
    if lost.is_empty() {
        return verdict;
    }
    let held = match &verdict {
        Verdict::Known(m) => format!(
            "; of the rules checked, only known bugs broke: {}",
            one_line(m)
        ),
        _ => "; every rule that was checked held".to_string(),
    };
    Verdict::Infrastructure(format!("evidence lost: {}{held}", lost.join("; ")))
}

/// The verdict of the judged evidence: rules and the ledger, overhead,
/// snapshot.
fn judged_verdict(
    judging: &Judging,
    evidence: &RunEvidence,
    analysis: &crate::judge::check::Analysis,
    result: &mut TrialResult,
) -> Verdict {
    let &Judging {
        env,
        kernel,
        scenario,
        artefacts,
        ledger_pin,
        ..
    } = judging;
    let (normalised, normalised_path) = keep_views(evidence, analysis, artefacts);
    result.violations = rule_hits(
        &env.known_issues,
        ledger_pin,
        &scenario.name,
        &analysis.violations,
    );
    not_showing_notes(judging, &analysis.violations, result);
    let (ledger_verdict, ledger_suffix) =
        match ledger_verdict(judging, &analysis.violations, &normalised_path) {
            Ok(v) => v,
            Err(failed) => return failed,
        };
    result.notes.extend(fail_nth_notes(evidence));
    let overhead = overhead_checked(judging, evidence, result);
    let overhead_verdict = || match overhead.clone() {
        Err(e) => Verdict::failed(FailureCause::OverheadBudget, format!("{e}{ledger_suffix}")),
        Ok(_) => ledger_verdict.clone().unwrap_or(Verdict::Ok),
    };
    let Some(snap_name) = kernel.snapshot_name().filter(|_| scenario.snapshot) else {
        return overhead_verdict();
    };
    let Some(drift) = compare_snapshot(judging, &snap_name, &normalised, result) else {
        return overhead_verdict();
    };
    let verdict = drift_verdict(
        kernel,
        &drift,
        &normalised_path,
        overhead.err(),
        &ledger_suffix,
    );
    result.snapshot_drift = Some(drift);
    verdict
}

/// What every phase of [`judge`] reads: the trial's environment, the
/// kernel and scenario, where the artefacts go, the pin whose ledger
/// entries judge the kernel and whether an entry that does not show is
/// reported fixed ([`ledger_pin_of`]), and the perf under test
/// (`KLOOP_PERF`), if any.
struct Judging<'a> {
    env: &'a TrialEnv,
    kernel: &'a KernelUnderTest,
    scenario: &'a Scenario,
    artefacts: &'a Path,
    ledger_pin: Option<&'a str>,
    report_fixed: bool,
    perf_under_test: Option<PathBuf>,
}

/// The session's evidence judged through the judge's one door
/// ([`crate::judge::judge`]): its raw streams and perf's file kept, the
/// checks the kernel was built with read from its config, the raw fields
/// per program written for `bisect --predicate field:…`. The judgement's
/// notes join the trial's.
fn analysed(
    judging: &Judging,
    evidence: &RunEvidence,
    result: &mut TrialResult,
) -> crate::judge::Judged {
    let &Judging {
        env,
        kernel,
        scenario,
        artefacts,
        ledger_pin,
        ..
    } = judging;
    for (idx, bytes) in &evidence.streams {
        let _ = std::fs::write(artefacts.join(format!("records-{idx}.bin")), bytes);
    }
    let perf_file = kept_perf_file(judging, evidence);
    let kernel_checks = kernel.checks(env);
    let snapshot_name = kernel.snapshot_name();
    let judged = crate::judge::judge(&crate::judge::Inputs {
        evidence,
        scenario: Some(crate::judge::entry::ScenarioInputs {
            name: &scenario.name,
            plan: &scenario.plan,
            expect: &scenario.expect,
            pin: snapshot_name.as_deref(),
            ledger_pin,
            ledger: &env.known_issues,
        }),
        kernel_checks,
        perf_file: perf_file.as_ref(),
    });
    result.notes.extend(judged.analysis.notes.iter().cloned());
    // Raw fields per program label, for `bisect --predicate field:…`.
    if let Ok(json) =
        serde_json::to_string_pretty(&crate::judge::bisect::fields(evidence, &judged.analysis))
    {
        let _ = std::fs::write(artefacts.join(crate::judge::bisect::FIELDS_FILE), json);
    }
    judged
}

/// The pin whose ledger entries judge `kernel`, and whether an entry that
/// does not show is reported as fixed. A pin is judged by its own entries. A
/// local kernel is judged by the entries of the pin of its series (same
/// code, same known bugs), but an entry that no longer shows there is news,
/// not a failure: it is what a developer fixing that bug boots to see.
fn ledger_pin_of(kernel: &KernelUnderTest) -> (Option<&str>, bool) {
    match kernel {
        KernelUnderTest::Pin(p) => (Some(p.id.as_str()), true),
        KernelUnderTest::DistroBuild { series_pin, .. } => (series_pin.as_deref(), false),
        KernelUnderTest::Image(k) => (k.ledger_pin.as_deref(), false),
    }
}

/// Keeps what perf printed (`perf-<i>.txt`) and the normalised stream the
/// snapshot holds (`normalised.txt`, whose path is returned with it).
fn keep_views(
    evidence: &RunEvidence,
    analysis: &crate::judge::check::Analysis,
    artefacts: &Path,
) -> (String, std::path::PathBuf) {
    for (i, p) in evidence.perf_scripts.iter().enumerate() {
        let _ = std::fs::write(
            artefacts.join(format!("perf-{i}.txt")),
            format!("$ {}\n{}\n--- stderr ---\n{}", p.command, p.text, p.stderr),
        );
    }
    let normalised = crate::judge::normalise::normalise(evidence, analysis)
        + &crate::judge::perf_script::perf_view(evidence, analysis);
    let normalised_path = artefacts.join("normalised.txt");
    let _ = std::fs::write(&normalised_path, &normalised);
    (normalised, normalised_path)
}

/// Notes for the known bugs that do not show where that is news rather than
/// a failure: a bug of the series' pin on a local kernel, and a perf bug
/// under a perf other than the host's (`KLOOP_PERF`, a build with a fix:
/// what the perf developer runs to see it gone; the trial is judged on
/// everything else).
fn not_showing_notes(
    judging: &Judging,
    violations: &[crate::judge::check::Violation],
    result: &mut TrialResult,
) {
    let &Judging {
        env,
        kernel,
        ledger_pin,
        ..
    } = judging;
    let scenario = judging.scenario.name.as_str();
    let perf_under_test = judging.perf_under_test.as_deref();
    if let (KernelUnderTest::Image(_) | KernelUnderTest::DistroBuild { .. }, Some(pin)) =
        (kernel, ledger_pin)
    {
        let j = env.known_issues.judge(pin, scenario, violations);
        for i in &j.fixed {
            result.notes.push(format!(
                "known bug {} of the {pin} series does not show on this kernel",
                i.id
            ));
        }
    }
    if let (Some(perf), KernelUnderTest::Pin(p)) = (perf_under_test, kernel) {
        let j = env.known_issues.judge(&p.id, scenario, violations);
        for i in j.fixed.iter().filter(|i| i.component == PERF_COMPONENT) {
            result.notes.push(format!(
                "known perf bug {} does not show with KLOOP_PERF={}",
                i.id,
                perf.display()
            ));
        }
    }
}

/// What each fail-nth sweep came to, on the trial's line: how far the
/// sweep went and how the failed attempts failed.
fn fail_nth_notes(evidence: &RunEvidence) -> impl Iterator<Item = String> + '_ {
    evidence.fail_nth.iter().map(|f| {
        format!(
            "fail-nth {}: {} attempts, {} failed ({})",
            f.target,
            f.attempts,
            f.failed,
            f.errno_summary()
        )
    })
}

/// How the normalised stream drifted from the snapshot `snap_name`, if it
/// did. A local kernel's stream is compared read-only (pending stream into
/// its artefacts), except under `bless --as`, which writes a set of its own.
fn compare_snapshot(
    judging: &Judging,
    snap_name: &str,
    normalised: &str,
    result: &mut TrialResult,
) -> Option<super::SnapshotDrift> {
    let &Judging {
        env,
        kernel,
        scenario,
        artefacts,
        ..
    } = judging;
    let perf_under_test = judging.perf_under_test.is_some();
    let blessing = env.bless.snapshots;
    let perf_view = crate::judge::perf_script::PERF_VIEW_HEADER;
    let outcome = match kernel {
        // Another perf (`KLOOP_PERF`) than the one the snapshot was taken
        // with: the snapshot's perf view is that perf's, so only kloop's
        // own stream is compared; the second reader judged this perf's.
        _ if perf_under_test && !blessing => {
            if normalised.contains(&format!("\n{perf_view}")) {
                result.notes.push(
                    "snapshot compared up to perf's view (KLOOP_PERF: the second reader judged it)"
                        .to_string(),
                );
            }
            snapshot::compare_read_only_before(
                &scenario.snapshot_dir(),
                snap_name,
                normalised,
                artefacts,
                perf_view,
            )
        }
        KernelUnderTest::Image(_) if !blessing => {
            snapshot::compare_read_only(&scenario.snapshot_dir(), snap_name, normalised, artefacts)
        }
        _ => snapshot::compare(
            &scenario.snapshot_dir(),
            snap_name,
            &format!("{} on kernel {snap_name}", scenario.name),
            normalised,
        ),
    };
    match outcome {
        SnapshotOutcome::Matched => None,
        SnapshotOutcome::Drift {
            snapshot,
            pending,
            diff,
        } => Some(super::SnapshotDrift {
            snapshot,
            pending,
            diff,
        }),
    }
}

/// The ledger's verdict on the violations (`Err`: the trial fails on it)
/// and the line it adds to any other failure. A perf bug that does not
/// show is reported fixed only with the host's own perf.
fn ledger_verdict(
    judging: &Judging,
    violations: &[crate::judge::check::Violation],
    normalised_path: &Path,
) -> Result<(Option<Verdict>, String), Verdict> {
    let &Judging {
        env,
        ledger_pin,
        report_fixed,
        ..
    } = judging;
    let stock_perf = judging.perf_under_test.is_none();
    let scenario = judging.scenario.name.as_str();
    let report_fixed_of = |i: &crate::judge::known_issues::Issue| {
        report_fixed && (stock_perf || i.component != PERF_COMPONENT)
    };
    let verdict = ledger_outcome(
        &env.known_issues,
        ledger_pin,
        &report_fixed_of,
        scenario,
        violations,
        normalised_path,
    )?;
    let suffix = verdict
        .as_ref()
        .and_then(|v| v.message())
        .map(|m| format!("\n{m}"))
        .unwrap_or_default();
    Ok((verdict, suffix))
}

/// Timing scenarios: figures against the pin's budget (overhead.rs). The
/// check's note joins the trial's.
fn overhead_checked(
    judging: &Judging,
    evidence: &RunEvidence,
    result: &mut TrialResult,
) -> Result<Option<String>, String> {
    let &Judging {
        env,
        kernel,
        scenario,
        artefacts,
        ..
    } = judging;
    let overhead = super::overhead::check_trial(
        scenario,
        evidence,
        &kernel.id(),
        kernel.snapshot_name().as_deref(),
        env.accel.accel(),
        env.bless.overhead,
        artefacts,
    );
    if let Ok(Some(note)) = &overhead {
        result.notes.push(note.clone());
    }
    overhead
}

/// A drifted stream fails the trial: the diff, where the new stream went,
/// and the overhead's and the ledger's failures beside it.
fn drift_verdict(
    kernel: &KernelUnderTest,
    drift: &super::SnapshotDrift,
    normalised_path: &Path,
    overhead_err: Option<String>,
    ledger_suffix: &str,
) -> Verdict {
    let pending_line = pending_line(kernel, drift.pending.as_deref(), normalised_path);
    Verdict::failed(
        FailureCause::SnapshotDrift,
        format!(
            "snapshot drift against {}:\n{}\n{pending_line}{}",
            drift.snapshot.display(),
            drift.diff,
            overhead_err.map(|e| format!("\n{e}")).unwrap_or_default()
        ) + ledger_suffix,
    )
}

/// Where a drifted stream went and what to do with it: a local kernel's
/// gets a snapshot set of its own, a pin's is reviewed or blessed.
fn pending_line(
    kernel: &KernelUnderTest,
    pending: Option<&Path>,
    normalised_path: &Path,
) -> String {
    match pending {
        Some(p) if matches!(kernel, KernelUnderTest::Image(_)) => format!(
            "new stream written to {}; if the change is an intended ABI change, give it a snapshot set of its own with `cargo xtask bless --kernel {} --as <new-id>`",
            p.display(),
            kernel_spec(kernel)
        ),
        Some(p) => format!(
            "new stream written to {}; review with `cargo insta review` or accept with `cargo xtask bless`",
            p.display()
        ),
        None => format!(
            "new stream in {}; accept with `cargo xtask bless` if the change is intended",
            normalised_path.display()
        ),
    }
}

/// Each violation as a report carries it, with the ledger entry that
/// explains it, if any (the same sorting [`ledger_outcome`] makes), so a
/// report can tell known bugs from news without reading messages.
pub(super) fn rule_hits(
    ledger: &crate::judge::known_issues::Ledger,
    pin: Option<&str>,
    scenario: &str,
    violations: &[crate::judge::check::Violation],
) -> Vec<super::RuleHit> {
    let sorted = pin.map(|pin| ledger.judge(pin, scenario, violations));
    violations
        .iter()
        .map(|v| {
            let issue = sorted.as_ref().and_then(|j| {
                j.known
                    .iter()
                    .find(|(_, hits)| hits.iter().any(|h| std::ptr::eq(*h, v)))
                    .map(|(i, _)| i.id.as_str())
            });
            super::RuleHit::of(v, issue)
        })
        .collect()
}

/// perf's own `perf.data` of a plan with a `perf record` step, kept in
/// the artefacts and read with `check-perf-data`'s reader, for the judge
/// to hold to perf's dump and to kloop's second reader (rule
/// `perf-data`). `None` when the plan ran no perf or its file did not
/// arrive whole (the judge says so from the evidence).
fn kept_perf_file(
    judging: &Judging,
    evidence: &RunEvidence,
) -> Option<crate::judge::entry::PerfFile> {
    let Some(Ok(bytes)) = evidence.perf_data.as_ref() else {
        return None;
    };
    let path = judging.artefacts.join("perf.data");
    if let Err(e) = std::fs::write(&path, bytes) {
        return Some(crate::judge::entry::PerfFile {
            bytes: bytes.len(),
            reading: crate::judge::perf_script::FileReading {
                stopped: Some(format!("writing {}: {e}", path.display())),
                ..Default::default()
            },
            file_knows: Vec::new(),
        });
    }
    let (reading, file_knows) = read_perf_file(&path, judging.env);
    Some(crate::judge::entry::PerfFile {
        bytes: bytes.len(),
        reading,
        file_knows,
    })
}

/// What `check-perf-data`'s reader reads in the kept `perf.data`, and the
/// ledger entries it recognises there (none when it cannot read the file).
fn read_perf_file(
    path: &Path,
    env: &TrialEnv,
) -> (crate::judge::perf_script::FileReading, Vec<String>) {
    use crate::judge::perf_script::FileReading;
    match crate::perf_data::check_with(path, true) {
        Ok(mut c) => {
            crate::perf_data::recognise(&mut c, &env.known_issues);
            let file_knows = c.known_issues().into_iter().map(str::to_string).collect();
            let reading = FileReading {
                news: c
                    .news()
                    .map(|f| format!("[{}] {}", f.rule, f.message))
                    .collect(),
                stopped: c.stopped.as_ref().map(|s| format!("{s:?}")),
                side_band: std::mem::take(&mut c.side_band),
            };
            (reading, file_knows)
        }
        Err(e) => (
            FileReading {
                stopped: Some(e.to_string()),
                ..FileReading::default()
            },
            Vec::new(),
        ),
    }
}

/// How a user names `kernel` on the command line.
fn kernel_spec(kernel: &KernelUnderTest) -> String {
    match kernel {
        KernelUnderTest::Pin(p) | KernelUnderTest::DistroBuild { pin: p, .. } => p.id.clone(),
        KernelUnderTest::Image(k) => match k.name.strip_prefix("built-") {
            Some(id) => format!("built:{id}"),
            None => k.path.display().to_string(),
        },
    }
}

/// `Skipped` when the agent reported an unmet requirement the scenario
/// asked for; `Failed` when it reported one the scenario did not ask for.
pub(super) fn unsupported_verdict(scenario: &Scenario, evidence: &RunEvidence) -> Option<Verdict> {
    // A shipped program that could not run here (exit 77) said why.
    if let Some(p) = evidence.program_runs.iter().find(|p| p.skipped()) {
        return Some(Verdict::Skipped(format!(
            "program {}: {}",
            p.path,
            one_line(&p.output)
        )));
    }
    let (requirement, reason) = evidence.unsupported.as_ref()?;
    let name = requirement_name(*requirement);
    if !scenario.plan.requires.contains(requirement) {
        return Some(Verdict::failed(
            FailureCause::AgentBug,
            format!(
            "the guest agent reported requirement `{name}` unmet ({reason}), but scenario {} does not require it: an agent bug",
            scenario.name
        )));
    }
    Some(Verdict::Skipped(format!("{name}: {}", one_line(reason))))
}

/// The component of the ledger's entries for bugs of perf, not the kernel.
pub(super) const PERF_COMPONENT: &str = "perf";

/// What the ledger makes of a trial's violations. `Err`: violations no
/// entry covers, the trial is FAILED (the message also names the known
/// bugs and the FIXED? entries). `Ok(Some)`: KNOWN or FIXED?, the verdict
/// unless a later check (overhead, snapshot) fails. `Ok(None)`: clean.
/// `pin` is `None` for a kernel no ledger entry applies to; `report_fixed`
/// says, per entry that expected its bug here and did not see it, whether
/// that is `FIXED?` (a failure): not on local kernels, where an absent
/// known bug is not a failure, nor for a perf bug when the perf is not the
/// host's (`KLOOP_PERF`).
pub(super) fn ledger_outcome(
    ledger: &crate::judge::known_issues::Ledger,
    pin: Option<&str>,
    report_fixed: &dyn Fn(&crate::judge::known_issues::Issue) -> bool,
    scenario: &str,
    violations: &[crate::judge::check::Violation],
    normalised_path: &Path,
) -> Result<Option<Verdict>, Verdict> {
    let empty = crate::judge::known_issues::Ledger::default();
    let ledger = if pin.is_some() { ledger } else { &empty };
    let mut judgement = ledger.judge(pin.unwrap_or(""), scenario, violations);
    judgement.fixed.retain(|i| report_fixed(i));
    let known_note = known_note(&judgement);
    let fixed_note = pin
        .map(|pin| fixed_note(&judgement, pin, ledger))
        .unwrap_or_default();
    if !judgement.uncovered.is_empty() {
        let mut msg = format!(
            "{} invariant violation(s) (normalised stream: {}):",
            judgement.uncovered.len(),
            normalised_path.display()
        );
        for v in &judgement.uncovered {
            msg.push_str(&format!("\n  [{}] {}", v.rule, v.message));
        }
        if !known_note.is_empty() {
            msg.push_str(&format!("\nalso known bugs of this pin:\n{known_note}"));
        }
        if !fixed_note.is_empty() {
            msg.push_str(&format!("\n{fixed_note}"));
        }
        let rules: std::collections::BTreeSet<String> = judgement
            .uncovered
            .iter()
            .map(|v| v.rule.to_string())
            .collect();
        return Err(Verdict::failed(
            FailureCause::Rules {
                rules: rules.into_iter().collect(),
            },
            msg,
        ));
    }
    if !fixed_note.is_empty() {
        return Ok(Some(Verdict::Fixed(if known_note.is_empty() {
            fixed_note
        } else {
            format!("{fixed_note}\nstill showing:\n{known_note}")
        })));
    }
    if judgement.known.is_empty() {
        return Ok(None);
    }
    let ids: Vec<&str> = judgement.known.iter().map(|(i, _)| i.id.as_str()).collect();
    Ok(Some(Verdict::Known(format!(
        "{KNOWN_PREFIX}{}\n{known_note}\nnormalised stream (every record read): {}",
        ids.join(", "),
        normalised_path.display()
    ))))
}

/// The ledger entries that explain violations, with the violations.
pub(super) fn known_note(j: &crate::judge::known_issues::Judgement) -> String {
    let mut out = String::new();
    for (issue, hits) in &j.known {
        out.push_str(&format!(
            "  {} ({} bug, rule {}): {}\n",
            issue.id,
            issue.component,
            issue.rule,
            one_line(&issue.summary)
        ));
        // Each hit matched the entry's signature; a few say what it
        // looks like, results.jsonl holds them all with their fields.
        const SHOWN: usize = 4;
        for v in hits.iter().take(SHOWN) {
            out.push_str(&format!("    [{}] {}\n", v.rule, v.message));
        }
        if hits.len() > SHOWN {
            out.push_str(&format!(
                "    ... and {} more matching its signature\n",
                hits.len() - SHOWN
            ));
        }
    }
    out.trim_end().to_string()
}

/// `FIXED? <id> no longer shows on <pin>` for every entry that expected its
/// bug here and did not see it.
pub(super) fn fixed_note(
    j: &crate::judge::known_issues::Judgement,
    pin: &str,
    ledger: &crate::judge::known_issues::Ledger,
) -> String {
    let file = ledger.path.as_ref().map_or_else(
        || "kernels/known-issues.toml".into(),
        |p| p.display().to_string(),
    );
    if j.fixed.is_empty() {
        return String::new();
    }
    let ids: Vec<&str> = j.fixed.iter().map(|i| i.id.as_str()).collect();
    let mut out = format!("FIXED? {} no longer shows on {pin}", ids.join(", "));
    for i in &j.fixed {
        out.push_str(&format!(
            "\n  {}: no `{}` violation in this trial although the ledger expects one here",
            i.id, i.rule
        ));
    }
    out.push_str(&format!(
        "\n  if the kernel was fixed, drop {pin} from the entry (or the entry) in {file}; if not, the scenario no longer provokes the bug: fix the scenario"
    ));
    out
}

/// A probe's reason or a summary on one line, at most 400 bytes.
pub(super) fn one_line(text: &str) -> String {
    let joined = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    const MAX: usize = 400;
    if joined.len() <= MAX {
        return joined;
    }
    let mut end = MAX;
    while !joined.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &joined[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::check::{Gap, Unchecked};

    #[test]
    fn lost_evidence_turns_ok_and_known_into_infra_and_a_rule_not_in_the_kernel_does_not() {
        let lost = Unchecked::new(
            "kmemleak",
            Gap::Lost,
            "the kernel is built with CONFIG_DEBUG_KMEMLEAK but /sys/kernel/debug/kmemleak is not there",
        );
        let absent = Unchecked::new(
            "jit-images",
            Gap::NotInKernel,
            "trampoline images are pages of their own here",
        );
        match unchecked_verdict(Verdict::Ok, std::slice::from_ref(&lost)) {
            Verdict::Infrastructure(m) => {
                assert!(
                    m.starts_with("evidence lost: rule kmemleak not checked"),
                    "{m}"
                );
                assert!(m.ends_with("every rule that was checked held"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            unchecked_verdict(
                Verdict::Known("known bug: x".into()),
                std::slice::from_ref(&lost)
            ),
            Verdict::Infrastructure(_)
        ));
        // A failure is a finding whatever else was unchecked.
        let failed = Verdict::failed(FailureCause::AgentError, "boom");
        assert_eq!(
            unchecked_verdict(failed.clone(), std::slice::from_ref(&lost)),
            failed
        );
        // Not in this kernel: the rule does not apply; the verdict stands.
        assert_eq!(
            unchecked_verdict(Verdict::Ok, std::slice::from_ref(&absent)),
            Verdict::Ok
        );
        assert_eq!(unchecked_verdict(Verdict::Ok, &[]), Verdict::Ok);
    }
}
