//! Rule `fault-recovery`: a kernel undoes what an injected allocation
//! failure interrupted.
//!
//! A `fail-nth` step runs one syscall with its N-th fault point failed,
//! for N = 1, 2, … until an attempt reaches no injected fault, and undoes
//! every attempt that succeeded (closing its fd) before the next
//! (guest/src/steps/fail_nth.rs). A syscall that fails must leave the
//! kernel as it found it: that is what every error path's unwinding is
//! for (`bpf_trampoline_link_prog()` takes the program off the
//! trampoline's list again, `bpf_tramp_image_alloc()` frees what it
//! allocated, …). So the last attempt, which meets no injected fault,
//! starts from the state the first one did and must succeed; when it fails,
//! some earlier failure was not undone, and its errno says which check
//! found the leftover (EBUSY: "already linked").
//!
//! The agent reports that errno (`FailNthSweep.clean_errno`) for the
//! sweeps whose failure is a finding (the attach sweeps), and only when
//! every earlier attempt failed: when one attached despite its injected
//! fault and was detached, the kernel may refuse the program a second
//! attach by design (5.10 to 5.12 answer ENOENT: bpf_tracing_prog_attach()
//! keeps no target after the first), which says nothing about undoing a
//! failure. A kprobe sweep's clean EILSEQ/EINVAL is the probe's offset
//! refused, which the agent handles itself.

use crate::check::detail::FaultRecovery;
use crate::check::{Detail, Violation};
use crate::evidence::{FailNthSweep, RunEvidence};

/// Every attempt of a fail-nth sweep fails with an errno and leaves records that obey the run's rules, or succeeds.
pub const FAULT_RECOVERY: &str = "fault-recovery";

/// The rules this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[FAULT_RECOVERY];

/// One violation per sweep whose attempt without an injected fault failed.
pub fn check(ev: &RunEvidence) -> Vec<Violation> {
    ev.fail_nth.iter().filter_map(violation).collect()
}

fn violation(f: &FailNthSweep) -> Option<Violation> {
    let errno = f.clean_errno.clone()?;
    let injected = f.attempts.saturating_sub(1);
    let message = format!(
        "{}: the attempt without an injected fault (attempt {}) failed with {errno} after {injected} \
         injected failure(s) ({} of them failed the syscall: {}): the kernel did not undo an \
         injected failure",
        f.target,
        f.attempts,
        f.failed,
        f.errno_summary()
    );
    Some(
        Violation::new(FAULT_RECOVERY, message).with(Detail::FaultRecovery(FaultRecovery {
            target: f
                .sweep
                .clone()
                // An agent before protocol 14 never reports a clean
                // failure, so this is a synthetic sweep: name it by its
                // words.
                .unwrap_or_else(|| f.target.split_whitespace().next().unwrap_or("").into()),
            errno,
            swept: f.target.clone(),
            attempts: f.attempts,
            failed: f.failed,
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fentry sweep of `alloc-failures` on linux-source-5.10 without
    /// the fix: after the trampoline update failed, every attach is EBUSY
    /// (`hlist_unhashed()` on a node `hlist_del()` left hashed).
    fn stuck() -> FailNthSweep {
        FailNthSweep {
            target: "attach fentry (BPF_RAW_TRACEPOINT_OPEN)".into(),
            attempts: 9,
            failed: 8,
            errnos: vec![("EBUSY".into(), 3), ("ENOMEM".into(), 5)],
            detail: "program \"fentry\"".into(),
            sweep: Some("attach".into()),
            clean_errno: Some("EBUSY".into()),
        }
    }

    #[test]
    fn a_clean_attempt_that_failed_is_a_violation_with_typed_fields() {
        let ev = RunEvidence {
            fail_nth: vec![stuck()],
            ..Default::default()
        };
        let v = check(&ev);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, FAULT_RECOVERY);
        assert_eq!(
            v[0].detail,
            Some(Detail::FaultRecovery(FaultRecovery {
                target: "attach".into(),
                errno: "EBUSY".into(),
                swept: "attach fentry (BPF_RAW_TRACEPOINT_OPEN)".into(),
                attempts: 9,
                failed: 8,
            }))
        );
        assert!(
            v[0].message.contains(
                "failed with EBUSY after 8 injected failure(s) (8 of them failed the syscall: EBUSY×3, ENOMEM×5): the kernel did not undo an injected failure"
            ),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn a_clean_attempt_that_succeeded_is_no_violation() {
        let ev = RunEvidence {
            fail_nth: vec![FailNthSweep {
                clean_errno: None,
                ..stuck()
            }],
            ..Default::default()
        };
        assert!(check(&ev).is_empty());
    }

    #[test]
    fn an_older_agents_sweep_is_named_by_its_first_word() {
        let v = violation(&FailNthSweep {
            sweep: None,
            ..stuck()
        })
        .unwrap();
        let Some(Detail::FaultRecovery(f)) = v.detail else {
            panic!("{v:?}")
        };
        assert_eq!(f.target, "attach");
    }
}
