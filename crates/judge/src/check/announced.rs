//! Rule `announced`: a generated symbol that appears in `/proc/kallsyms`
//! while the first CPU-wide KSYMBOL listener set records must have had its
//! KSYMBOL register in that set's stream.
//!
//! Why the kernel promises it (6.12, the other pins alike): every path that
//! adds generated code to kallsyms announces it right after, in the same
//! call chain: `bpf_prog_load` → `bpf_prog_kallsyms_add` then
//! `perf_event_bpf_event(PROG_LOAD)` (a KSYMBOL per JITed function);
//! `bpf_image_ksym_add` (trampolines, the XDP dispatcher) → `bpf_ksym_add`
//! then `perf_event_ksymbol`; `__get_insn_slot` → `list_add_rcu` of the
//! kprobe page then `perf_event_ksymbol`; `ftrace_update_trampoline` →
//! `ftrace_add_trampoline_to_kallsyms` then `perf_event_ksymbol`. A symbol
//! added without its register (`bpf_ksym_add` in place of
//! `bpf_image_ksym_add`) is invisible to a profiler, and until this rule
//! only a baseline's diff could see it.
//!
//! Evidence: `initial_kallsyms` (the generated symbols before the first
//! listener opened) and `final_kallsyms` (read by the agent right before
//! the plan's last drain, so every register emitted before that read is in
//! the drained stream). A symbol of the final read that the initial one
//! lacks (same name and address) needs a KSYMBOL register with its name
//! and address anywhere in the set's stream.

use super::*;

pub(super) fn check_announced(
    initial: &[KallsymsEntry],
    final_read: &[KallsymsEntry],
    merged: &[Record],
    out: &mut Vec<Violation>,
) {
    let before: BTreeSet<(u64, &str)> = initial.iter().map(|e| (e.addr, e.name.as_str())).collect();
    let registered: BTreeSet<(u64, &str)> = merged
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Ksymbol {
                addr, flags, name, ..
            } if flags & KSYMBOL_FLAGS_UNREGISTER == 0 => Some((*addr, name.as_str())),
            _ => None,
        })
        .collect();
    for e in final_read {
        let key = (e.addr, e.name.as_str());
        if before.contains(&key) || registered.contains(&key) {
            continue;
        }
        out.push(Violation::new(
            rule::ANNOUNCED,
            format!(
                "{} at {:#x} ({}) appeared in /proc/kallsyms during the run without a KSYMBOL \
                 register: the kernel announces generated code right after adding it to \
                 kallsyms (bpf_prog_kallsyms_add + perf_event_bpf_event, bpf_image_ksym_add, \
                 __get_insn_slot, ftrace_update_trampoline)",
                e.name,
                e.addr,
                e.module
                    .as_deref()
                    .map_or("core".to_string(), |m| format!("[{m}]"))
            ),
        ));
    }
}

/// Rule `withdrawn`, the other half: a generated symbol that was in
/// `/proc/kallsyms` when the set began (the initial snapshot) or that the
/// set saw registered, and is gone from the final read, must have had its
/// KSYMBOL unregister in the set's stream. The removal paths announce
/// first and remove after: `perf_event_bpf_event(PROG_UNLOAD)` unregisters
/// a program's functions before `__bpf_prog_put_noref` →
/// `bpf_prog_kallsyms_del_all`; `collect_one_slot` "Record[s] perf ksymbol
/// unregister event before removing the page"; `ftrace_trampoline_free`
/// removes from kallsyms "after the perf events". So a symbol gone at the
/// final read had its unregister emitted before the read, and the last
/// drain (after the read) holds it. `bpf_image_ksym_del` (BPF trampolines,
/// the XDP dispatcher) removes first and unregisters right after, so a
/// concurrent free could fall between the read and the drain: those names
/// are left to `unload`-side rules and the scenarios' own waits.
pub(super) fn check_withdrawn(
    initial: &[KallsymsEntry],
    final_read: &[KallsymsEntry],
    merged: &[Record],
    out: &mut Vec<Violation>,
) {
    let after: BTreeSet<(u64, &str)> = final_read
        .iter()
        .map(|e| (e.addr, e.name.as_str()))
        .collect();
    let mut unregistered: BTreeSet<(u64, &str)> = BTreeSet::new();
    let mut known: BTreeMap<(u64, &str), Option<&Record>> = initial
        .iter()
        .map(|e| ((e.addr, e.name.as_str()), None))
        .collect();
    for r in merged {
        if let RecordBody::Ksymbol {
            addr, flags, name, ..
        } = &r.body
        {
            if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
                known.entry((*addr, name.as_str())).or_insert(Some(r));
            } else {
                unregistered.insert((*addr, name.as_str()));
            }
        }
    }
    for (key @ (addr, name), reg) in known {
        let image = name.starts_with("bpf_trampoline_") || name.starts_with("bpf_dispatcher_");
        if after.contains(&key) || unregistered.contains(&key) || image {
            continue;
        }
        let v = Violation::new(
            rule::WITHDRAWN,
            format!(
                "{name} at {addr:#x} ({}) left /proc/kallsyms during the run without a KSYMBOL \
                 unregister: the kernel announces the removal of generated code before it \
                 removes it (perf_event_bpf_event before bpf_prog_kallsyms_del_all, \
                 collect_one_slot, ftrace_trampoline_free)",
                if reg.is_some() {
                    "registered in the run"
                } else {
                    "there when the listeners opened"
                }
            ),
        );
        out.push(match reg {
            Some(r) => v.quoting([r]),
            None => v,
        });
    }
}

/// Whether the listeners of `set` saw the whole run after the initial
/// snapshot: never closed, and opened with nothing but other
/// `open-listeners` steps between the last `snapshot-kallsyms` before
/// them and their own (a program loaded in between would be in neither the
/// snapshot nor the set's stream, and is not the kernel's fault).
pub(super) fn whole_run(ev: &RunEvidence, set: &[u32]) -> bool {
    set.iter().all(|i| {
        let w = ev.window(*i);
        if w.closed.is_some() {
            return false;
        }
        let Some(opened) = w.opened else {
            // The agent did not say: open from the start (older runs).
            return true;
        };
        let before: Vec<&kloop_protocol::Step> = ev.steps.range(..opened).map(|(_, s)| s).collect();
        let Some(snap) = before
            .iter()
            .rposition(|s| matches!(s, kloop_protocol::Step::SnapshotKallsyms))
        else {
            return false;
        };
        before[snap + 1..]
            .iter()
            .all(|s| matches!(s, kloop_protocol::Step::OpenListeners { .. }))
    })
}
