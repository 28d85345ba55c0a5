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

/// The out-of-line code whose lifetime the kernel announces around every
/// write into it, by its KSYMBOL name:
///
/// - `ftrace_trampoline`: `ftrace_update_trampoline()` registers it, then
///   records the TEXT_POKE of its text; `ftrace_trampoline_free()` records
///   the poke of its removal, then unregisters it (kernel/trace/ftrace.c);
/// - `kprobe_insn_page`, `kprobe_optinsn_page`: `__get_insn_slot()`
///   registers a new page before it hands out its first slot, the
///   architecture records a slot's copy and its removal as TEXT_POKEs while
///   the kprobe holds the slot (`arch_copy_kprobe()` / `arch_remove_kprobe()`
///   on x86, the optprobe buffer likewise), and `collect_one_slot()`
///   unregisters the page only once its last slot was freed
///   (kernel/kprobes.c).
///
/// BPF code (programs, trampolines, dispatchers, KSYMBOL type BPF) is not
/// held to this: a prog_array update patches tail-call sites with
/// `bpf_arch_text_poke()` (`prog_array_map_poke_run()`) on any program the
/// map tracks, and a program is tracked from its verification until its
/// free, before its register and after its unregister alike.
const OOL_LIFETIMES: &[&str] = &[FTRACE_TRAMPOLINE, KPROBE_INSN_PAGE, "kprobe_optinsn_page"];

/// `code-lifetime`: a TEXT_POKE is a write into live code. Every TEXT_POKE
/// that falls inside an out-of-line range ([`OOL_LIFETIMES`]) announced in
/// this set's stream must lie, at that moment, inside one registered and not
/// yet unregistered: never before the range's register (when the stream
/// shows its register first), never after its unregister until it is
/// registered again. Pokes at addresses no such range covered (vmlinux
/// text, a module's, BPF code) are not judged here. Order is the stream's
/// for one listener; across CPUs a poke is after an unregister only when its
/// time is later (equal times are no order).
pub(super) fn check_code_lifetime<'r>(merged: &'r [Record], label: &str) -> Vec<Found<'r>> {
    let at = label_prefix(label);
    // Every announced range, with its events in stream order.
    struct Range<'r> {
        addr: u64,
        len: u64,
        events: Vec<(usize, bool, &'r Record)>,
    }
    let mut ranges: Vec<Range<'r>> = Vec::new();
    for (i, r) in merged.iter().enumerate() {
        for sym in OOL_LIFETIMES {
            let Some((addr, len, unregister)) = ool_symbol(r, sym) else {
                continue;
            };
            let len = u64::from(len);
            match ranges.iter_mut().find(|g| g.addr == addr && g.len == len) {
                Some(g) => g.events.push((i, unregister, r)),
                None => ranges.push(Range {
                    addr,
                    len,
                    events: vec![(i, unregister, r)],
                }),
            }
        }
    }
    let strictly_after = |a: &Record, b: &Record| {
        a.listener == b.listener || matches!((a.time(), b.time()), (Some(x), Some(y)) if x > y)
    };
    let mut found = Vec::new();
    for (i, r) in merged.iter().enumerate() {
        let RecordBody::TextPoke { addr, .. } = &r.body else {
            continue;
        };
        let covering: Vec<&Range> = ranges
            .iter()
            .filter(|g| *addr >= g.addr && *addr < g.addr.saturating_add(g.len))
            .collect();
        if covering.is_empty() {
            continue;
        }
        // Live in one of them: the last event before the poke is a register,
        // or the first event after it is an unregister (live since before).
        let live = covering
            .iter()
            .any(|g| match g.events.iter().rev().find(|(j, _, _)| *j < i) {
                Some((_, unregister, _)) => !unregister,
                None => g
                    .events
                    .first()
                    .is_some_and(|(_, unregister, _)| *unregister),
            });
        if live {
            continue;
        }
        let gone = covering.iter().find_map(|g| {
            let (_, _, u) = g.events.iter().rev().find(|(j, _, _)| *j < i)?;
            strictly_after(r, u).then_some(*u)
        });
        let coming = covering.iter().find_map(|g| {
            let (_, _, reg) = g.events.iter().find(|(j, u, _)| *j > i && !*u)?;
            strictly_after(reg, r).then_some(*reg)
        });
        match (gone, coming) {
            (Some(u), _) => found.push(quoting(
                format!(
                    "{at}{r}: a write into code announced gone by {u} and not registered again \
                     (the kernel unregisters out-of-line code only after its last write)"
                ),
                [r, u],
            )),
            (None, Some(reg)) => found.push(quoting(
                format!(
                    "{at}{r}: a write into code announced only later, by {reg} (the kernel \
                     registers out-of-line code before its first write)"
                ),
                [r, reg],
            )),
            (None, None) => {}
        }
    }
    found
}

#[cfg(test)]
mod lifetime_tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};
    use kloop_records::{parse_stream, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    const PAGE: u64 = 0xffff_ffff_c000_0000;

    enum E {
        Reg(&'static str),
        Unreg(&'static str),
        Poke(u64),
    }

    fn stream(events: &[E]) -> Vec<Record> {
        let l = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let mut b = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let t = Tr {
                time: 10 + i as u64,
                ..Tr::default()
            };
            b.extend(match e {
                E::Reg(n) => testutil::ksymbol(&l, PAGE, 4096, KSYM_TYPE_OOL, false, n, t),
                E::Unreg(n) => testutil::ksymbol(&l, PAGE, 4096, KSYM_TYPE_OOL, true, n, t),
                E::Poke(a) => testutil::text_poke(&l, *a, 0, 6, t),
            });
        }
        parse_stream(&l, &b).unwrap()
    }

    fn messages(events: &[E]) -> Vec<String> {
        let recs = stream(events);
        check_code_lifetime(&recs, "")
            .into_iter()
            .map(|f| f.message)
            .collect()
    }

    #[test]
    fn writes_fall_inside_live_out_of_line_code() {
        use E::*;
        // A page's life: register, slot copies, removal, unregister; an
        // int3 in vmlinux text outside it; a new page at the same address.
        let ok = [
            Poke(0xffff_ffff_8100_0005),
            Reg(KPROBE_INSN_PAGE),
            Poke(PAGE),
            Poke(PAGE + 16),
            Unreg(KPROBE_INSN_PAGE),
            Reg(KPROBE_INSN_PAGE),
            Poke(PAGE + 32),
            Unreg(KPROBE_INSN_PAGE),
        ];
        assert!(messages(&ok).is_empty(), "{:?}", messages(&ok));
        // A page there since before the recording: live until its unregister.
        assert!(messages(&[Poke(PAGE + 16), Unreg(KPROBE_INSN_PAGE)]).is_empty());
        // Used after it was announced gone.
        let m = messages(&[
            Reg(KPROBE_INSN_PAGE),
            Unreg(KPROBE_INSN_PAGE),
            Poke(PAGE + 16),
        ]);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("announced gone by"), "{m:?}");
        // Written before it was announced.
        let m = messages(&[Poke(PAGE), Reg(FTRACE_TRAMPOLINE), Unreg(FTRACE_TRAMPOLINE)]);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("announced only later"), "{m:?}");
        // BPF code is not held to it (tail-call pokes may race its life).
        assert!(messages(&[Reg("bpf_prog_x"), Unreg("bpf_prog_x"), Poke(PAGE)]).is_empty());
    }
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
