//! `trampoline-pokes`: ftrace announces a trampoline it allocates twice, as
//! a KSYMBOL and as a TEXT_POKE of its whole text, and the same on removal.
//!
//! kernel/trace/ftrace.c (5.9 on, unchanged through the 7.x pins):
//! `ftrace_update_trampoline()` registers the `ftrace_trampoline` OOL
//! KSYMBOL and "Record[s] the perf text poke event after the ksymbol
//! register event": `perf_event_text_poke(tramp, NULL, 0, tramp,
//! trampoline_size)`. `ftrace_trampoline_free()` "Record[s] the text poke
//! event before the ksymbol unregister event": `perf_event_text_poke(tramp,
//! tramp, trampoline_size, NULL, 0)`, then the unregister. The uapi header
//! says the same of TEXT_POKE: "Either 'old_len' or 'new_len' may be zero to
//! indicate, for example, the addition or removal of a trampoline".
//!
//! So in a CPU-wide set that asked for `ksymbol` and `text_poke`, after each
//! register of an ftrace trampoline at A of length L, the next record about
//! A is a TEXT_POKE at A with old_len 0 and new_len L; before each
//! unregister, the last record about A is a TEXT_POKE at A with old_len L
//! and new_len 0. Pokes inside the trampoline (ftrace retargeting its call,
//! text_poke_bp() at A + offset) are about other addresses.

use kloop_records::{Record, RecordBody, KSYM_TYPE_OOL};

use super::{quoting, Found};

/// The name ftrace gives its trampolines (`FTRACE_TRAMPOLINE_SYM`).
const FTRACE_TRAMPOLINE: &str = "ftrace_trampoline";

/// An ftrace trampoline's KSYMBOL: (addr, len, unregister).
fn trampoline(r: &Record) -> Option<(u64, u32, bool)> {
    match &r.body {
        RecordBody::Ksymbol {
            addr,
            len,
            ksym_type,
            flags,
            name,
        } if *ksym_type == KSYM_TYPE_OOL && name == FTRACE_TRAMPOLINE => Some((
            *addr,
            *len,
            flags & kloop_records::KSYMBOL_FLAGS_UNREGISTER != 0,
        )),
        _ => None,
    }
}

/// Whether `r` is a KSYMBOL or TEXT_POKE at exactly `addr`.
fn about(r: &Record, addr: u64) -> bool {
    match &r.body {
        RecordBody::Ksymbol { addr: a, .. } | RecordBody::TextPoke { addr: a, .. } => *a == addr,
        _ => false,
    }
}

/// The poke `r` should be: `(old_len, new_len)` at `addr`.
fn is_poke(r: &Record, addr: u64, want: (u32, u32)) -> bool {
    matches!(&r.body, RecordBody::TextPoke { addr: a, old_len, new_len }
        if *a == addr && (u32::from(*old_len), u32::from(*new_len)) == want)
}

/// Checks `merged`, one set's time-merged stream, against the pairing above.
pub(super) fn check_trampoline_pokes<'r>(merged: &'r [Record], label: &str) -> Vec<Found<'r>> {
    let mut found = Vec::new();
    let at = if label.is_empty() {
        String::new()
    } else {
        format!("{label}: ")
    };
    for (i, r) in merged.iter().enumerate() {
        let Some((addr, len, unregister)) = trampoline(r) else {
            continue;
        };
        if unregister {
            let before = merged[..i].iter().rev().find(|p| about(p, addr));
            if !before.is_some_and(|p| is_poke(p, addr, (len, 0))) {
                found.push(quoting(
                    format!(
                        "{at}{r}: the last record at its address before the unregister is {}, not \
                         the TEXT_POKE old_len={len} new_len=0 ftrace_trampoline_free() records \
                         before it",
                        before.map_or("none".to_string(), |p| p.to_string())
                    ),
                    std::iter::once(r).chain(before),
                ));
            }
        } else {
            let after = merged[i + 1..].iter().find(|p| about(p, addr));
            if !after.is_some_and(|p| is_poke(p, addr, (0, len))) {
                found.push(quoting(
                    format!(
                        "{at}{r}: the next record at its address is {}, not the TEXT_POKE \
                         old_len=0 new_len={len} ftrace_update_trampoline() records after the \
                         register",
                        after.map_or("none".to_string(), |p| p.to_string())
                    ),
                    std::iter::once(r).chain(after),
                ));
            }
        }
    }
    found
}
