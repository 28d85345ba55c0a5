//! `symbol-state`: the state of the kernel's symbol tables at the moment
//! each KSYMBOL record was emitted, as the `watch-ksymbols` kprobe on
//! `perf_event_ksymbol` saw it (`%ps` of the address at the call's entry).
//!
//! Every KSYMBOL record of the first CPU-wide set is matched to the
//! observation of the call that emitted it (same type, direction, address,
//! length and name; observations are used once each, in order), which also
//! checks the watch itself. Then each record is held to what the kernel's
//! source promises for its kind (6.12; the order has not changed since
//! these emitters exist):
//!
//! | kind | register | unregister |
//! |------|----------|------------|
//! | program / subprogram (`bpf_prog_…`) | resolves: `bpf_prog_load` runs `bpf_prog_kallsyms_add` (subprograms: `jit_subprogs`) before `perf_event_bpf_event(PROG_LOAD)` emits the registers | resolves: `bpf_prog_put_deferred` emits PROG_UNLOAD and the unregisters before `__bpf_prog_put_noref` deletes the symbols |
//! | trampoline / dispatcher image (`bpf_trampoline_…`, `bpf_dispatcher_…`) | resolves: `bpf_image_ksym_add` calls `bpf_ksym_add` first | no longer resolves to it: `bpf_image_ksym_del` calls `bpf_ksym_del` first |
//!
//! | kprobe instruction page (OOL `kprobe_insn_page`, `kprobe_optinsn_page`) | on its cache's page list: `__get_insn_slot` runs `list_add_rcu` first | still on it: `collect_one_slot` emits the unregister "before removing the page" (`list_del_rcu`) |
//!
//! | ftrace trampoline (OOL `ftrace_trampoline`) | on `ftrace_ops_trampoline_list`: `ftrace_update_trampoline` adds it "to kallsyms before the perf events" | still on it: `ftrace_trampoline_free` removes it "from kallsyms after the perf events" |
//!
//! kallsyms does not resolve kprobe pages or ftrace trampolines through
//! `%ps`; the watch walks their lists instead.

use kloop_protocol::KsymbolObservation;

use super::*;
use crate::evidence::KsymbolWatchEvidence;

/// What the source promises about a symbol when its record is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Promise {
    /// `%ps` of the address resolves (to some symbol, not `0x…`).
    Resolves(&'static str),
    /// `%ps` of the address no longer gives the record's name.
    Gone(&'static str),
    /// The kprobe page is on its cache's page list.
    Listed(&'static str),
    /// No order is promised (or kloop cannot see it).
    Nothing,
}

fn promise(ksym_type: u16, unregister: bool, name: &str) -> Promise {
    if ksym_type == KSYM_TYPE_OOL && matches!(name, "kprobe_insn_page" | "kprobe_optinsn_page") {
        return Promise::Listed(if unregister {
            "collect_one_slot emits a page's unregister before list_del_rcu removes it"
        } else {
            "__get_insn_slot adds a new page to its cache's list before it emits the register"
        });
    }
    if ksym_type == KSYM_TYPE_OOL && name == "ftrace_trampoline" {
        return Promise::Listed(if unregister {
            "ftrace_trampoline_free emits the unregister before it removes the trampoline \
             from ftrace_ops_trampoline_list (\"Remove from kallsyms after the perf events\")"
        } else {
            "ftrace_update_trampoline adds the trampoline to ftrace_ops_trampoline_list before \
             it emits the register (\"Add to kallsyms before the perf events\")"
        });
    }
    if ksym_type != KSYM_TYPE_BPF {
        return Promise::Nothing;
    }
    if name.starts_with("bpf_prog_") {
        return Promise::Resolves(if unregister {
            "a program's unregisters are emitted with its PROG_UNLOAD \
             (bpf_prog_put_deferred) before __bpf_prog_put_noref deletes its symbols"
        } else {
            "bpf_prog_load adds a program's symbols (bpf_prog_kallsyms_add; subprograms in \
             jit_subprogs) before perf_event_bpf_event(PROG_LOAD) emits its registers"
        });
    }
    if name.starts_with("bpf_trampoline_") || name.starts_with("bpf_dispatcher_") {
        return if unregister {
            Promise::Gone(
                "bpf_image_ksym_del deletes the image's symbol before it emits the unregister",
            )
        } else {
            Promise::Resolves(
                "bpf_image_ksym_add adds the image's symbol before it emits the register",
            )
        };
    }
    Promise::Nothing
}

/// Whether `%ps` resolved the address: kallsyms prints `0x<hex>` for an
/// address it finds no symbol for (`__sprint_symbol`).
fn resolved(o: &KsymbolObservation) -> bool {
    o.snprintf_ret >= 0 && !o.symbolized.is_empty() && !o.symbolized.starts_with("0x")
}

/// The watch reads at most this many bytes of a name (63 and a NUL).
const WATCH_NAME_MAX: usize = 63;

/// Whether observation `o` is of the call that emitted this KSYMBOL.
fn describes(
    o: &KsymbolObservation,
    addr: u64,
    len: u32,
    ksym_type: u16,
    unregister: bool,
    name: &str,
) -> bool {
    let name_ok = if o.name.len() >= WATCH_NAME_MAX {
        name.starts_with(&o.name)
    } else {
        name == o.name
    };
    o.addr == addr
        && o.len == len
        && o.ksym_type == ksym_type
        && o.unregister == unregister
        && name_ok
}

/// What KSYMBOL record `r`, observed as `o`, broke of its kind's
/// promise about the symbol's state at emission, if anything.
fn broken_promise<'r>(
    o: &KsymbolObservation,
    r: &'r Record,
    addr: u64,
    ksym_type: u16,
    unregister: bool,
    name: &str,
) -> Option<Found<'r>> {
    let promised = promise(ksym_type, unregister, name);
    // Only the kinds held to a %ps result need one.
    if o.snprintf_ret < 0 && matches!(promised, Promise::Resolves(_) | Promise::Gone(_)) {
        return Some(quoting(
            format!(
                "the watch could not symbolize {addr:#x} (bpf_snprintf returned {}): {r}",
                o.snprintf_ret
            ),
            [r],
        ));
    }
    let event = if unregister { "unregister" } else { "register" };
    match promised {
        Promise::Listed(why) => match o.listed {
            Some(true) => None,
            Some(false) => Some(quoting(
                format!(
                    "{name} at {addr:#x} was not on its list (a kprobe cache's pages, \
                     ftrace's trampolines) when its {event} was emitted; {why}: {r}"
                ),
                [r],
            )),
            None => Some(quoting(
                format!(
                    "the watch could not look {name} at {addr:#x} up on its list (no list \
                     address from /proc/kallsyms, or the call's sym is no cache's): {r}"
                ),
                [r],
            )),
        },
        Promise::Resolves(why) if !resolved(o) => Some(quoting(
            format!(
                "{name} did not resolve when its {event} was emitted (%ps gave {:?}); {why}: {r}",
                o.symbolized
            ),
            [r],
        )),
        Promise::Gone(why) if o.symbolized == *name => Some(quoting(
            format!("{name} still resolved when its unregister was emitted; {why}: {r}"),
            [r],
        )),
        _ => None,
    }
}

/// `symbol-state` over the first CPU-wide set's merged records.
pub(super) fn check_symbol_state(
    watch: &KsymbolWatchEvidence,
    merged: &[Record],
    out: &mut Vec<Violation>,
) {
    let mut used = vec![false; watch.observations.len()];
    let mut unmatched: Vec<Found<'_>> = Vec::new();
    let mut broken: Vec<Found<'_>> = Vec::new();
    for r in merged {
        let RecordBody::Ksymbol {
            addr,
            len,
            ksym_type,
            flags,
            name,
        } = &r.body
        else {
            continue;
        };
        let unregister = flags & KSYMBOL_FLAGS_UNREGISTER != 0;
        let found =
            watch.observations.iter().enumerate().find(|(i, o)| {
                !used[*i] && describes(o, *addr, *len, *ksym_type, unregister, name)
            });
        let Some((i, o)) = found else {
            // A full ring leaves calls unobserved: then no record can be
            // said to lack its observation.
            if watch.dropped == 0 {
                unmatched.push(quoting(
                    format!(
                        "no perf_event_ksymbol call the watch observed emitted this record \
                         ({} observations): {r}",
                        watch.observations.len()
                    ),
                    [r],
                ));
            }
            continue;
        };
        used[i] = true;
        broken.extend(broken_promise(o, r, *addr, *ksym_type, unregister, name));
    }
    push_capped(
        out,
        rule::SYMBOL_STATE,
        "records whose emission the watch did not observe",
        unmatched,
    );
    push_capped(
        out,
        rule::SYMBOL_STATE,
        "records emitted in the wrong symbol state",
        broken,
    );
}
