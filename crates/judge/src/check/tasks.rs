//! `task-records`: the FORK and EXIT records of a set whose listeners asked
//! for them (attr.task, comm or mmap: perf_event_task_match()).
//!
//! kernel/events/core.c (6.12; the same since 5.10):
//!
//! - A new task's FORK is emitted once, by its parent: `perf_event_fork()`
//!   → `perf_event_task(task, NULL, 1)` → `perf_iterate_sb()` offers it to
//!   the listeners on the parent's CPU (`perf_iterate_sb_cpu()`) and to the
//!   parent's own task-bound listeners (`current->perf_event_ctxp`). A set
//!   with a listener on every online CPU therefore holds it once.
//! - A task's EXIT is emitted twice, to two disjoint audiences, by
//!   `perf_event_exit_task()`: first `perf_event_exit_task_context()`
//!   detaches the task's context and calls `perf_event_task(child,
//!   child_ctx, 0)`, which goes to that context alone ("The task_ctx is set
//!   only for EXIT events before releasing task context"): the listeners
//!   the task inherited (attr.inherit), each of which writes to its
//!   parent's ring, filtered to the CPU it runs on (`event_filter_match`).
//!   Then `perf_event_task(child, NULL, 0)` goes to the CPU-wide listeners
//!   of that CPU (the task's context pointer is already NULL).
//!
//! So per set: no task has two FORKs or two EXITs. A thread the agent's
//! `concurrent` step ran (pinned to one CPU, gone before the step ends) has
//! exactly one EXIT in a CPU-wide set with a listener on its CPU and in an
//! inherited task set with one there, none in a task set without inherit
//! (the thread has no context of its own), and exactly one FORK in every
//! set that covers all online CPUs.

use std::collections::{BTreeMap, BTreeSet};

use kloop_protocol::ListenerInfo;
use kloop_records::{Record, RecordBody, PERF_RECORD_EXIT};

use super::{label_prefix, quoting, Found};

/// One thread of a `concurrent` step: its tid and the CPU it was pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loader {
    pub tid: u32,
    pub cpu: u32,
}

/// What a set is, for these rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Audience {
    /// Listeners bound to CPUs (`pid = -1`).
    CpuWide,
    /// Listeners on the agent's task that its threads inherit.
    Inherited,
    /// A listener on the agent's task alone.
    TaskOnly,
}

/// Whether every listener of the set asks for FORK / EXIT.
pub(super) fn asks_for_tasks(set: &[&ListenerInfo]) -> bool {
    !set.is_empty()
        && set
            .iter()
            .all(|l| super::listener::asked_for(l, PERF_RECORD_EXIT))
}

/// A task with two FORKs or two EXITs in one set, by tid.
fn twice<'r>(
    at: &str,
    forks: &BTreeMap<u32, Vec<&'r Record>>,
    exits: &BTreeMap<u32, Vec<&'r Record>>,
) -> Vec<Found<'r>> {
    let mut found = Vec::new();
    for (kind, by_tid, why) in [
        (
            "FORK",
            forks,
            "perf_event_fork() emits a task's FORK once, on its parent's CPU",
        ),
        (
            "EXIT",
            exits,
            "perf_event_exit_task() emits a task's EXIT once to its inherited listeners and \
             once to the CPU-wide ones, never twice to either",
        ),
    ] {
        for (tid, recs) in by_tid {
            if recs.len() > 1 {
                found.push(quoting(
                    format!(
                        "{at}{} {kind} records of tid {tid} in one set ({why}): {}",
                        recs.len(),
                        recs.iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(" / ")
                    ),
                    recs.iter().copied(),
                ));
            }
        }
    }
    found
}

/// Checks one set's time-merged stream. `all_cpus`: the set has a
/// listener on every online CPU (or one bound to none). `loaders` are
/// checked only when the set was open for the whole run.
pub(super) fn check_task_records<'r>(
    merged: &'r [Record],
    label: &str,
    audience: Audience,
    set_cpus: &BTreeSet<i64>,
    all_cpus: bool,
    loaders: &[Loader],
) -> Vec<Found<'r>> {
    let at = label_prefix(label);
    let mut forks: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    let mut exits: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in merged {
        if let RecordBody::Task { exit, tid, .. } = &r.body {
            if *exit { &mut exits } else { &mut forks }
                .entry(*tid)
                .or_default()
                .push(r);
        }
    }
    let mut found = twice(&at, &forks, &exits);
    for l in loaders {
        let on_its_cpu = set_cpus.contains(&i64::from(l.cpu)) || set_cpus.contains(&-1);
        let (want, because) = match audience {
            Audience::CpuWide if on_its_cpu => (
                1,
                "perf_event_task(child, NULL, 0) writes it to the CPU-wide listener of the CPU \
                 the thread exits on",
            ),
            Audience::Inherited if on_its_cpu => (
                1,
                "perf_event_exit_task_context() writes it to the listener the thread inherited \
                 for the CPU it exits on",
            ),
            Audience::TaskOnly => (
                0,
                "a listener without attr.inherit is not in the thread's context, and the \
                 CPU-wide pass does not offer it",
            ),
            _ => continue,
        };
        let got = exits.get(&l.tid).map_or(0, Vec::len);
        if got != want && !(want == 1 && got > 1) {
            found.push(quoting(
                format!(
                    "{at}{got} EXIT records of loader thread {} (pinned to CPU {}), expected \
                     {want}: {because}",
                    l.tid, l.cpu
                ),
                exits.get(&l.tid).into_iter().flatten().copied(),
            ));
        }
        if all_cpus {
            let got = forks.get(&l.tid).map_or(0, Vec::len);
            if got == 0 {
                found.push(
                    format!(
                    "{at}no FORK record of loader thread {} (pinned to CPU {}), though the set \
                     covers every online CPU: perf_event_fork() writes it to the listener of \
                     the CPU its parent runs on and to the parent's task-bound listeners",
                    l.tid, l.cpu
                )
                    .into(),
                );
            }
        }
    }
    found
}
