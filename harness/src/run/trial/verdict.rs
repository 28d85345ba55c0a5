//! What a trial comes to: its [`Verdict`] and the [`TrialResult`] around it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{KernelUnderTest, TrialEnv};
use crate::judge::check::{QuotedRecord, Violation};
use crate::scenario::Scenario;

/// How a trial ended. Only `Ok` is a pass; `Skipped` and `Known` are not
/// passes either, but they do not fail a run.
///
/// In JSON a verdict is `{"class": "failed", "message": "…", "cause": …}`:
/// the class in kebab case, the message for all but `ok`, the cause for
/// `failed` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "VerdictRepr", try_from = "VerdictRepr")]
pub enum Verdict {
    Ok,
    /// The kernel's records broke a rule, the snapshot drifted, or the agent
    /// reported an error: a finding about the kernel (or a kloop bug). What
    /// failed it is data ([`FailureCause`]); the message is for people.
    Failed(Failure),
    /// The kernel lacks a feature the scenario `requires` (the guest's probe
    /// said which and why): `<requirement>: <reason>`, one line. Nothing ran.
    Skipped(String),
    /// Every violation is a known bug of this pin in the ledger
    /// (`kernels/known-issues.toml`). First line `known bug: <ids>`,
    /// then the entries and the violations they cover.
    Known(String),
    /// A ledger entry expects its bug in this trial and it did not show: the
    /// ledger is out of date. First line `FIXED? <id> no longer shows on <pin>`.
    Fixed(String),
    /// Something around the test broke: fetch, QEMU, the channel.
    Infrastructure(String),
    Timeout(String),
    Panic(String),
    Interrupted(String),
    /// `--repeat N`: the runs of one trial disagreed (verdict or normalised
    /// stream). First line `FLAKY: <k> outcomes in <n> runs`, then each
    /// outcome with its runs and artefacts. Fails the run.
    Flaky(String),
}

/// Why a trial failed, with the message a reader gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub cause: FailureCause,
    pub message: String,
}

/// What failed a trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FailureCause {
    /// The records broke rules no ledger entry covers: their names, sorted
    /// and once each. The hits themselves are the trial's
    /// [`TrialResult::violations`] without a `known_issue`.
    Rules { rules: Vec<String> },
    /// The normalised stream differs from its golden snapshot
    /// ([`TrialResult::snapshot_drift`]).
    SnapshotDrift,
    /// An overhead figure left its budget.
    OverheadBudget,
    /// The guest agent reported an error and stopped the plan.
    AgentError,
    /// A pin's trial was SKIPPED where `kernels/expected-skips.toml` says
    /// it runs (or for another requirement than listed).
    UnexpectedSkip,
    /// PID 1 died: a kloop agent bug.
    AgentCrash,
    /// The agent said something the scenario makes impossible (an unmet
    /// requirement the scenario does not have): a kloop agent bug.
    AgentBug,
    /// A result written by a kloop that did not record causes.
    Unstated,
}

impl FailureCause {
    /// One line for a report's failure title: `broke lost, programs-accounted`.
    pub fn summary(&self) -> String {
        match self {
            FailureCause::Rules { rules } => format!("broke {}", rules.join(", ")),
            FailureCause::SnapshotDrift => "snapshot drift".into(),
            FailureCause::OverheadBudget => "overhead over budget".into(),
            FailureCause::AgentError => "guest agent error".into(),
            FailureCause::UnexpectedSkip => "skipped where it is expected to run".into(),
            FailureCause::AgentCrash => "guest agent crashed (kloop bug)".into(),
            FailureCause::AgentBug => "guest agent bug".into(),
            FailureCause::Unstated => "test failure".into(),
        }
    }
}

impl Verdict {
    /// One verdict of each kind, in the order docs list them (`cargo xtask
    /// docs` writes the verdict words from these). A new kind fails to
    /// compile in [`Verdict::label`] until it is given a word, and the
    /// docs test then finds its word missing from docs/usage.md's table.
    pub fn one_of_each() -> Vec<Verdict> {
        vec![
            Verdict::Ok,
            Verdict::Skipped(String::new()),
            Verdict::Known(String::new()),
            Verdict::Fixed(String::new()),
            Verdict::failed(FailureCause::Unstated, ""),
            Verdict::Infrastructure(String::new()),
            Verdict::Timeout(String::new()),
            Verdict::Panic(String::new()),
            Verdict::Interrupted(String::new()),
            Verdict::Flaky(String::new()),
        ]
    }

    /// A failure for `cause`.
    pub fn failed(cause: FailureCause, message: impl Into<String>) -> Verdict {
        Verdict::Failed(Failure {
            cause,
            message: message.into(),
        })
    }

    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed(_) => "FAILED",
            Verdict::Skipped(_) => "SKIPPED",
            Verdict::Known(_) => "KNOWN",
            Verdict::Fixed(_) => "FIXED?",
            Verdict::Infrastructure(_) => "INFRA",
            Verdict::Timeout(_) => "TIMEOUT",
            Verdict::Panic(_) => "PANIC",
            Verdict::Interrupted(_) => "INTERRUPTED",
            Verdict::Flaky(_) => "FLAKY",
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::Failed(f) => Some(&f.message),
            Verdict::Skipped(m)
            | Verdict::Known(m)
            | Verdict::Fixed(m)
            | Verdict::Infrastructure(m)
            | Verdict::Timeout(m)
            | Verdict::Panic(m)
            | Verdict::Interrupted(m)
            | Verdict::Flaky(m) => Some(m),
        }
    }

    /// The label with what a reader needs on the trial line itself:
    /// `SKIPPED (jit-optional: …)`, `KNOWN (issue-a, issue-b)`,
    /// `FIXED? issue-a no longer shows on 6.1`.
    pub fn headline(&self) -> String {
        let first = self.message().and_then(|m| m.lines().next()).unwrap_or("");
        match self {
            Verdict::Skipped(_) => format!("SKIPPED ({first})"),
            Verdict::Known(_) => format!(
                "KNOWN ({})",
                first.strip_prefix(KNOWN_PREFIX).unwrap_or(first)
            ),
            Verdict::Fixed(_) | Verdict::Flaky(_) => first.to_string(),
            other => other.label().to_string(),
        }
    }

    /// Did the agent's plan run to its end and its records get judged (a
    /// rule, the ledger, a snapshot or a budget may still have failed it)?
    /// Skips, infrastructure, timeouts and panics did not get that far.
    pub fn records_judged(&self) -> bool {
        matches!(
            self,
            Verdict::Ok | Verdict::Failed(_) | Verdict::Known(_) | Verdict::Fixed(_)
        )
    }

    /// Does this verdict fail a run (exit status, libtest)? Skipped and
    /// known-bug trials do not; they are not passes either.
    pub fn fails_run(&self) -> bool {
        !matches!(self, Verdict::Ok | Verdict::Skipped(_) | Verdict::Known(_))
    }
}

/// [`Verdict`] as JSON has it.
#[derive(Serialize, Deserialize)]
struct VerdictRepr {
    class: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cause: Option<FailureCause>,
}

impl From<Verdict> for VerdictRepr {
    fn from(v: Verdict) -> VerdictRepr {
        let class = match &v {
            Verdict::Ok => "ok",
            Verdict::Failed(_) => "failed",
            Verdict::Skipped(_) => "skipped",
            Verdict::Known(_) => "known",
            Verdict::Fixed(_) => "fixed",
            Verdict::Infrastructure(_) => "infrastructure",
            Verdict::Timeout(_) => "timeout",
            Verdict::Panic(_) => "panic",
            Verdict::Interrupted(_) => "interrupted",
            Verdict::Flaky(_) => "flaky",
        };
        let cause = match &v {
            Verdict::Failed(f) => Some(f.cause.clone()),
            _ => None,
        };
        VerdictRepr {
            class: class.to_string(),
            message: v.message().map(str::to_string),
            cause,
        }
    }
}

/// A stored verdict's class is none kloop writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verdict class `{0}`")]
pub struct UnknownVerdictClass(pub String);

impl TryFrom<VerdictRepr> for Verdict {
    type Error = UnknownVerdictClass;

    fn try_from(r: VerdictRepr) -> Result<Verdict, UnknownVerdictClass> {
        let m = r.message.unwrap_or_default();
        Ok(match r.class.as_str() {
            "ok" => Verdict::Ok,
            "failed" => Verdict::Failed(Failure {
                cause: r.cause.unwrap_or(FailureCause::Unstated),
                message: m,
            }),
            "skipped" => Verdict::Skipped(m),
            "known" => Verdict::Known(m),
            "fixed" => Verdict::Fixed(m),
            "infrastructure" => Verdict::Infrastructure(m),
            "timeout" => Verdict::Timeout(m),
            "panic" => Verdict::Panic(m),
            "interrupted" => Verdict::Interrupted(m),
            "flaky" => Verdict::Flaky(m),
            other => return Err(UnknownVerdictClass(other.to_string())),
        })
    }
}

/// First-line prefix of a [`Verdict::Known`] message.
pub const KNOWN_PREFIX: &str = "known bug: ";

/// The result of one trial, with its environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialResult {
    pub id: String,
    pub kernel: String,
    pub scenario: String,
    pub verdict: Verdict,
    pub wall_secs: f64,
    pub accel: String,
    pub boot_to_hello_secs: Option<f64>,
    /// QEMU's peak resident memory in KiB, when it could be read.
    pub qemu_peak_rss_kib: Option<u64>,
    /// Where the trial's wall time went, for runs that reached the agent.
    pub phases: Option<Phases>,
    pub guest_release: Option<String>,
    pub qemu_version: String,
    pub host_release: String,
    pub artefacts: PathBuf,
    /// How the guest started: `restored: saved VM <key> …`, or the cold
    /// boot's kernel file and, when a saved VM was wanted, why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_from: Option<String>,
    /// What the trial did with its shape's saved VM (`--boot saved`), when
    /// it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_vm: Option<SavedVmUse>,
    /// One-line facts from the analysis the report line shows (side-band
    /// lookup rates, provoked-loss accounting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Every rule the records broke (known bugs included), for A/B runs
    /// and machine-readable reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<RuleHit>,
    /// The rules the evidence did not let the judge decide, with why
    /// (`judge::check::Unchecked`): the reason an `ok` became `INFRA` or
    /// `SKIPPED`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unchecked: Vec<crate::judge::check::Unchecked>,
    /// The snapshot comparison's difference, when the stream drifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_drift: Option<SnapshotDrift>,
    /// Each step of the plan the agent finished, with its time in the
    /// guest: where the agent phase goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTime>,
    /// Not run here: a baseline's kept result reused from the run named
    /// ([`crate::run::reuse`]); its artefacts were copied in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused_from: Option<String>,
}

/// One step of a trial's plan and how long the agent took for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Its place in the plan, from 0.
    pub index: u32,
    /// The step's `op` (`load`, `wait-unloaded`, `perf-record`, …).
    pub op: String,
    /// Guest seconds from its start to its end.
    pub secs: f64,
    /// Of `secs`, the guest seconds spent reading `/proc/kallsyms`.
    #[serde(default)]
    pub kallsyms_secs: f64,
    /// Where the step's guest time went (the agent's CPU, the guest's idle
    /// time), when the agent could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<kloop_protocol::StepCpu>,
}

impl StepTime {
    /// The steps the agent reported finished, in order, their `op` read
    /// from the step it announced at their start.
    pub fn of_messages(messages: &[kloop_protocol::Message]) -> Vec<StepTime> {
        use kloop_protocol::Message;
        let mut ops: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
        let mut out = Vec::new();
        for m in messages {
            match m {
                Message::StepStart { index, what } => {
                    // `what` is the step as the agent parsed it (JSON).
                    let op = serde_json::from_str::<serde_json::Value>(what)
                        .ok()
                        .and_then(|v| v.get("op")?.as_str().map(str::to_string))
                        .unwrap_or_else(|| what.clone());
                    ops.insert(*index, op);
                }
                Message::StepDone {
                    index,
                    elapsed_ns,
                    kallsyms_ns,
                    cpu,
                } => out.push(StepTime {
                    index: *index,
                    op: ops.remove(index).unwrap_or_default(),
                    secs: *elapsed_ns as f64 / 1e9,
                    kallsyms_secs: *kallsyms_ns as f64 / 1e9,
                    cpu: *cpu,
                }),
                _ => {}
            }
        }
        out
    }
}

/// A trial's use of a saved VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedVmUse {
    /// Its key: the directory `saved-vms/<key>/` in the kernel cache.
    pub key: String,
    /// This trial booted and saved it.
    pub made_now: bool,
    /// The restore ran the trial; `false`: it failed and the trial booted
    /// cold.
    pub restored: bool,
}

/// One broken rule: its message, and as data what the judge knew when it
/// wrote it (`judge::check::Violation`), for machine-readable reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleHit {
    pub rule: String,
    pub message: String,
    /// The listener (stream) the violation is at, when it is at one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<u32>,
    /// Byte offset into that listener's stream (`records-<listener>.bin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// The records the message quotes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<QuotedRecord>,
    /// The ledger entry (`kernels/known-issues.toml`) that explains this
    /// violation as a known bug; `None`: nothing does, it is news.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_issue: Option<String>,
    /// The fault's typed fields, which the ledger's signatures match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<crate::judge::check::Detail>,
}

impl RuleHit {
    /// A violation as a report carries it; `known_issue` as the ledger
    /// sorted it.
    pub fn of(v: &Violation, known_issue: Option<&str>) -> RuleHit {
        RuleHit {
            rule: v.rule.to_string(),
            message: v.message.clone(),
            listener: v.listener,
            offset: v.offset,
            records: v.records.clone(),
            known_issue: known_issue.map(str::to_string),
            detail: v.detail.clone(),
        }
    }
}

/// The normalised stream differed from its golden snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDrift {
    /// The golden snapshot compared with.
    pub snapshot: PathBuf,
    /// The new stream written for review, if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PathBuf>,
    /// The first differing lines (`  line N: - old` / `  line N: + new`),
    /// or `no golden snapshot yet`.
    pub diff: String,
}

/// Where one trial's wall time went (seconds). `to_hello` is measured on
/// the host from QEMU's spawn; `guest_uptime_at_hello` is the guest's
/// `CLOCK_MONOTONIC` in the hello, i.e. the kernel's own boot up to the
/// agent's first frame, so `to_hello - guest_uptime_at_hello` is QEMU
/// start-up, firmware and the kernel's decompression (before the guest
/// clock starts).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Phases {
    /// Host: before QEMU's spawn (initramfs, argv).
    pub prepare: f64,
    pub to_hello: f64,
    pub guest_uptime_at_hello: Option<f64>,
    /// Hello to done: the agent's plan, channel included.
    pub agent: Option<f64>,
    /// Done to QEMU's exit (power-off).
    pub shutdown: Option<f64>,
    /// Host: parsing, checks, snapshot, budgets after QEMU exited.
    pub host_checks: f64,
    /// CPU seconds QEMU used up to the hello, and from hello to done: the
    /// emulation work itself, barely disturbed by a busy host.
    pub qemu_cpu_to_hello: Option<f64>,
    pub qemu_cpu_agent: Option<f64>,
    /// Restored from a saved VM: `to_hello` is restore→hello, and the
    /// guest's uptime (which spans the saved boot) is not recorded.
    #[serde(default)]
    pub restored: bool,
}

impl Phases {
    pub(super) fn qemu_total(&self) -> f64 {
        self.to_hello + self.agent.unwrap_or(0.0) + self.shutdown.unwrap_or(0.0)
    }

    /// `to_hello - guest_uptime_at_hello`: QEMU, firmware, decompression.
    pub fn before_kernel_clock(&self) -> Option<f64> {
        self.guest_uptime_at_hello.map(|u| self.to_hello - u)
    }
}

impl TrialResult {
    /// A result for `kernel` × `scenario` before anything ran: the
    /// environment filled in, `verdict` as given, timings empty.
    pub fn new(
        env: &TrialEnv,
        kernel: &KernelUnderTest,
        scenario: &Scenario,
        verdict: Verdict,
        artefacts: PathBuf,
    ) -> TrialResult {
        TrialResult {
            id: format!("{}/{}", kernel.id(), scenario.name),
            kernel: kernel.id(),
            scenario: scenario.name.clone(),
            verdict,
            wall_secs: 0.0,
            accel: env.accel.accel.clone(),
            boot_to_hello_secs: None,
            qemu_peak_rss_kib: None,
            phases: None,
            guest_release: None,
            qemu_version: env.qemu_version.clone(),
            host_release: kloop_qemu::accel::host_release(),
            artefacts,
            started_from: None,
            saved_vm: None,
            notes: Vec::new(),
            violations: Vec::new(),
            unchecked: Vec::new(),
            snapshot_drift: None,
            steps: Vec::new(),
            reused_from: None,
        }
    }
}

#[cfg(test)]
impl TrialResult {
    /// A result for tests of what reads results (reports, repeats): the
    /// common fields filled in plainly; tests set the rest with `..`.
    pub(crate) fn for_test(
        kernel: &str,
        scenario: &str,
        verdict: Verdict,
        artefacts: impl Into<PathBuf>,
    ) -> TrialResult {
        TrialResult {
            id: format!("{kernel}/{scenario}"),
            kernel: kernel.into(),
            scenario: scenario.into(),
            verdict,
            wall_secs: 1.0,
            accel: "tcg".into(),
            boot_to_hello_secs: None,
            qemu_peak_rss_kib: None,
            phases: None,
            guest_release: None,
            qemu_version: "QEMU 7.2".into(),
            host_release: "6.1".into(),
            artefacts: artefacts.into(),
            started_from: None,
            saved_vm: None,
            notes: Vec::new(),
            violations: Vec::new(),
            unchecked: Vec::new(),
            snapshot_drift: None,
            steps: Vec::new(),
            reused_from: None,
        }
    }
}
