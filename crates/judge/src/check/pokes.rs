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

use super::{label_prefix, quoting, Found};

/// The name ftrace gives its trampolines (`FTRACE_TRAMPOLINE_SYM`).
const FTRACE_TRAMPOLINE: &str = "ftrace_trampoline";

/// An OOL KSYMBOL named `sym` (an ftrace trampoline, a kprobe page):
/// (addr, len, unregister).
fn ool_symbol(r: &Record, sym: &str) -> Option<(u64, u32, bool)> {
    match &r.body {
        RecordBody::Ksymbol {
            addr,
            len,
            ksym_type,
            flags,
            name,
        } if *ksym_type == KSYM_TYPE_OOL && name == sym => Some((
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
    let at = label_prefix(label);
    for (i, r) in merged.iter().enumerate() {
        let Some((addr, len, unregister)) = ool_symbol(r, FTRACE_TRAMPOLINE) else {
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

/// The name kernel/kprobes.c gives the pages of out-of-line single-step
/// slots (`kprobe_insn_slots.sym`).
const KPROBE_INSN_PAGE: &str = "kprobe_insn_page";

/// x86's `MAX_INSN_SIZE` (arch/x86/include/asm/insn.h): the size of one
/// slot of a `kprobe_insn_page` (`kprobe_insn_slots.insn_size`, in
/// `kprobe_opcode_t`s, one byte each on x86).
const KPROBE_INSN_SLOT: u64 = 16;

/// `kprobe-slots`: a kprobe's out-of-line copy is written at the start of
/// its slot. kernel/kprobes.c hands out slot `i` of a page as `kip->insns +
/// i * c->insn_size` (a new page's first slot is `kip->insns` itself), and
/// arch/x86/kernel/kprobes/core.c records the copy as
/// `perf_event_text_poke(p->ainsn.insn, NULL, 0, buf, len)` and its removal
/// as `perf_event_text_poke(p->ainsn.insn, p->ainsn.insn, len, NULL, 0)`.
/// So in a set that asked for ksymbol and text_poke, every TEXT_POKE inside
/// a live `kprobe_insn_page` (between its OOL register and unregister)
/// starts a whole number of slots into the page.
pub(super) fn check_kprobe_slots<'r>(merged: &'r [Record], label: &str) -> Vec<Found<'r>> {
    let at = label_prefix(label);
    let mut live: Vec<(u64, u32, &Record)> = Vec::new();
    let mut found = Vec::new();
    for r in merged {
        if let Some((addr, len, unregister)) = ool_symbol(r, KPROBE_INSN_PAGE) {
            if unregister {
                live.retain(|(a, _, _)| *a != addr);
            } else {
                live.push((addr, len, r));
            }
            continue;
        }
        let RecordBody::TextPoke { addr, .. } = &r.body else {
            continue;
        };
        let page = live
            .iter()
            .find(|(a, len, _)| *addr >= *a && *addr < a.saturating_add(u64::from(*len)));
        if let Some((start, _, reg)) = page {
            let off = addr - start;
            if off % KPROBE_INSN_SLOT != 0 {
                found.push(quoting(
                    format!(
                        "{at}{r}: {off} bytes into the kprobe_insn_page registered by \
                         {reg}, not at the start of a {KPROBE_INSN_SLOT}-byte slot \
                         (__get_insn_slot hands out kip->insns + i * insn_size, and the \
                         copy is recorded at its slot's start)"
                    ),
                    [r, *reg],
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod kprobe_slot_tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};
    use kloop_records::{parse_stream, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    const PAGE: u64 = 0xffff_ffff_c000_0000;

    fn stream(pokes: &[u64]) -> Vec<Record> {
        let l = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let t = |time| Tr {
            time,
            ..Tr::default()
        };
        let mut b = testutil::ksymbol(&l, PAGE, 4096, KSYM_TYPE_OOL, false, KPROBE_INSN_PAGE, t(1));
        for (i, p) in pokes.iter().enumerate() {
            b.extend(testutil::text_poke(&l, *p, 0, 6, t(2 + i as u64)));
        }
        b.extend(testutil::ksymbol(
            &l,
            PAGE,
            4096,
            KSYM_TYPE_OOL,
            true,
            KPROBE_INSN_PAGE,
            t(50),
        ));
        // After the page went, an address in it is no longer held to slots.
        b.extend(testutil::text_poke(&l, PAGE + 3, 0, 6, t(51)));
        parse_stream(&l, &b).unwrap()
    }

    #[test]
    fn copies_sit_at_slot_starts() {
        // Slots 0 and 2 of the page, and a poke outside it (an int3 at the
        // probed function).
        let recs = stream(&[PAGE, PAGE + 32, 0xffff_ffff_8100_0005]);
        assert!(check_kprobe_slots(&recs, "").is_empty());
        // A new page's first slot handed out one byte in.
        let recs = stream(&[PAGE + 1]);
        let f = check_kprobe_slots(&recs, "");
        assert_eq!(f.len(), 1);
        assert!(
            f[0].message.contains("1 bytes into the kprobe_insn_page"),
            "{}",
            f[0].message
        );
        let recs = stream(&[PAGE + 8]);
        assert_eq!(check_kprobe_slots(&recs, "").len(), 1);
    }
}
