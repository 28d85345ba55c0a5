//! A trial's verdict as a KCIDB test status, for `results.jsonl` (so a CI
//! that submits to KernelCI's common database need not re-derive it).
//!
//! KCIDB's statuses say what a test found out about the tested code
//! (schema v5): FAIL (completed, the code is faulty), ERROR (did not
//! complete because of a failure in the test's own code, the code's
//! status unknown), MISS (did not run because the harness failed, both
//! unknown), PASS (completed, the code is correct), SKIP (did not run:
//! not applicable). Mapped from kloop's verdicts:
//!
//! | verdict | status | why |
//! |---|---|---|
//! | `ok` | PASS | every rule held and the stream matched its snapshot |
//! | `KNOWN` | FAIL, `known: true` | the kernel broke a rule: that is a real kernel bug, found as expected. Not PASS: the code is not correct, and a consumer counting PASS would count a bug as fixed. `known` (and each violation's `known_issue`) says the ledger explains it: it does not fail kloop's run and needs no new triage (KCIDB: an incident of a known issue) |
//! | `FIXED?` | PASS, or FAIL `known: true` while other known bugs still show | the kernel broke no rule the ledger expected it to break: the code behaves correctly; what is out of date is kloop's ledger (or the scenario no longer provokes the bug), which fails kloop's run but says nothing bad about the kernel |
//! | `FAILED` | FAIL | a rule no ledger entry covers, a snapshot drift or an overhead budget: a finding about the kernel. The verdict also covers the guest agent reporting an error or crashing, which can be a kloop bug rather than a kernel finding; the verdict does not tell them apart, so the status does not either (the message does) |
//! | `SKIPPED` | SKIP | the kernel lacks what the scenario requires (config preflight or the guest's probe): not applicable, nothing ran |
//! | `PANIC` | FAIL | the guest kernel panicked: whatever the test did, the kernel is faulty |
//! | `TIMEOUT` | ERROR | no hello within the boot deadline or the agent went silent: the test did not complete, and a starved host and a hung kernel look alike, so the kernel's status is unknown |
//! | `INFRA` | MISS before the agent's hello, ERROR after | before the hello (fetch, checksum, QEMU missing or killed at boot) the test never ran; after it, the test's own machinery (channel, QEMU) broke mid-run |
//! | `INTERRUPTED` | MISS | the user stopped the run: the trial did not run to an end through no fault of test or kernel |
//! | `FLAKY` | ERROR | `--repeat` runs disagreed: kloop promises one verdict per kernel, so the test failed to produce one; each run keeps its own status in `runs.jsonl` |
//!
//! A kernel source build that fails is not a trial: `vm-test` stops before
//! any trial runs and writes no `results.jsonl` (KCIDB would record it as a
//! build whose status is FAIL, not as a test).

use serde::Serialize;

use crate::run::trial::{TrialResult, Verdict};

/// KCIDB's test status (the values kloop produces; it never reports DONE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Fail,
    Error,
    Miss,
    Pass,
    Skip,
}

/// A trial's KCIDB status, and whether a failure is a known bug (see the
/// module docs for the mapping and its reasons).
pub fn status(r: &TrialResult) -> (Status, bool) {
    match &r.verdict {
        Verdict::Ok => (Status::Pass, false),
        Verdict::Known(_) => (Status::Fail, true),
        // Only violations the ledger covers can remain in a FIXED? trial
        // (an uncovered one would have made it FAILED).
        Verdict::Fixed(_) if r.violations.is_empty() => (Status::Pass, false),
        Verdict::Fixed(_) => (Status::Fail, true),
        Verdict::Failed(_) | Verdict::Panic(_) => (Status::Fail, false),
        Verdict::Skipped(_) => (Status::Skip, false),
        Verdict::Timeout(_) | Verdict::Flaky(_) => (Status::Error, false),
        Verdict::Infrastructure(_) if r.boot_to_hello_secs.is_some() => (Status::Error, false),
        Verdict::Infrastructure(_) | Verdict::Interrupted(_) => (Status::Miss, false),
    }
}

/// One line of `results.jsonl` / `runs.jsonl`: the trial as it is, plus
/// its KCIDB status (derived, so it is not kept in [`TrialResult`]).
#[derive(Serialize)]
pub(super) struct JsonLine<'a> {
    #[serde(flatten)]
    pub result: &'a TrialResult,
    pub kcidb_status: Status,
    /// A FAIL that is a known bug of the kernel (the ledger's).
    pub known: bool,
}

impl<'a> JsonLine<'a> {
    pub fn of(result: &'a TrialResult) -> JsonLine<'a> {
        let (kcidb_status, known) = status(result);
        JsonLine {
            result,
            kcidb_status,
            known,
        }
    }
}
