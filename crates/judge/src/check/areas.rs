//! A set's records against the kernel's executable memory
//! (`exec-area-missing`): every symbol the records show live when the agent
//! read /proc/vmallocinfo after a step lies in an area of the module
//! mapping space the kernel held then. Code is announced after its memory
//! is allocated and withdrawn before it is freed, on every path these
//! records come from (kernel/bpf/core.c: bpf_prog_kallsyms_add() after the
//! JIT, perf_event_bpf_event(PROG_UNLOAD) before bpf_prog_free();
//! kernel/bpf/trampoline.c: bpf_image_ksym_add() after the image's
//! allocation, bpf_image_ksym_del() before its free; kernel/kprobes.c:
//! the kprobe_insn_page register after `cache->alloc()`, its unregister
//! before `cache->free()`; kernel/trace/ftrace.c: the ftrace_trampoline
//! register after create_trampoline(), its unregister in
//! ftrace_trampoline_free() before arch_ftrace_trampoline_free()). So a
//! record that announces code where no memory is, is a freed (or never
//! allocated) image still announced.
//!
//! "Live at the reading" is read from the rings, not a clock: a register
//! below the heads taken right before the read was written before it, so
//! its memory was allocated then; an unregister below the heads taken
//! right after the read may have been written while the file was read,
//! and its memory freed before the read saw the area, so such a symbol is
//! not claimed. A symbol registered before the set opened is not in its
//! map (the end reading holds /proc/kallsyms' symbols to the areas:
//! `crate::exec_areas`).

use std::collections::{BTreeMap, BTreeSet};

use kloop_protocol::{AreaReading, ExecArea};
use kloop_records::{Record, RecordBody, KSYMBOL_FLAGS_UNREGISTER};

use super::detail::ExecAreaFault;
use super::ranges::{lost_cutoff, symbol_kind};
use super::{rule, Detail, Violation};

use kloop_protocol::exec::head_of;
pub use kloop_protocol::exec::X86_64_PAGE_SIZE as PAGE_SIZE;

/// The bytes of `a` that can hold code: its mapped pages, without the
/// guard page after them.
pub fn usable(a: &ExecArea) -> std::ops::Range<u64> {
    kloop_protocol::exec::usable(a, PAGE_SIZE)
}

/// Whether `[addr, addr + len)` lies inside one area's usable bytes.
pub fn covered(areas: &[ExecArea], addr: u64, len: u64) -> bool {
    areas.iter().any(|a| {
        let u = usable(a);
        u.start <= addr && addr.saturating_add(len.max(1)) <= u.end
    })
}

/// The symbols `merged` shows live at a reading whose rings' heads were
/// `heads` (listener, before the read, after it): a register counts when
/// it lies below the head taken before the read, an unregister when it
/// lies below the one taken after it.
fn live_at<'r>(
    merged: &'r [Record],
    heads: &[(u32, u64, u64)],
) -> BTreeMap<u64, (u32, &'r Record)> {
    let below = |r: &Record, after_read: bool| {
        heads.iter().any(|&(l, before, after)| {
            l == r.listener && r.offset < if after_read { after } else { before }
        })
    };
    let mut live = BTreeMap::new();
    for r in merged {
        let RecordBody::Ksymbol {
            addr, len, flags, ..
        } = &r.body
        else {
            continue;
        };
        if flags & KSYMBOL_FLAGS_UNREGISTER != 0 {
            if below(r, true) {
                live.remove(addr);
            }
        } else if below(r, false) {
            live.insert(*addr, (*len, r));
        }
    }
    live
}

/// The violations of one set's `merged` records (time order) against the
/// area `readings`; a note when the set cannot be judged.
pub fn check(
    label: &str,
    merged: &[Record],
    set: &[u32],
    readings: &[AreaReading],
    out: &mut Vec<Violation>,
) -> Option<String> {
    if let Some((t, lost)) = lost_cutoff(merged) {
        return Some(format!(
            "{label}rule {}: not claimed: the set lost records ({lost}, last whole at \
             t={t}), so which symbols were live at a reading is not known",
            rule::EXEC_AREA_MISSING
        ));
    }
    // Each symbol is reported once, at the first reading that misses it.
    let mut reported: BTreeSet<(u64, u32)> = BTreeSet::new();
    for reading in readings {
        let Some(step) = reading.after_step else {
            continue;
        };
        // A set some of whose rings the agent did not know at the reading
        // (opened or closed around it) is not judged there.
        let heads: Option<Vec<(u32, u64, u64)>> = set
            .iter()
            .map(|&l| {
                Some((
                    l,
                    head_of(&reading.seen_at, l)?,
                    head_of(&reading.read_until, l)?,
                ))
            })
            .collect();
        let Some(heads) = heads else {
            continue;
        };
        let live = live_at(merged, &heads);
        for (&addr, &(len, r)) in &live {
            if len == 0 || covered(&reading.areas, addr, u64::from(len)) {
                continue;
            }
            if !reported.insert((addr, len)) {
                continue;
            }
            let RecordBody::Ksymbol {
                name, ksym_type, ..
            } = &r.body
            else {
                continue;
            };
            let kind = symbol_kind(*ksym_type, name);
            let end = addr.saturating_add(u64::from(len));
            let near = reading
                .areas
                .iter()
                .filter(|a| a.start <= addr)
                .max_by_key(|a| a.start)
                .map(|a| {
                    let u = usable(a);
                    format!(
                        "; the nearest area below is [{:#x}, {:#x}) ({}){}",
                        u.start,
                        u.end,
                        a.caller.as_deref().unwrap_or("no caller printed"),
                        if u.end > addr {
                            format!(", which ends {} bytes short", end - u.end)
                        } else {
                            String::new()
                        }
                    )
                })
                .unwrap_or_default();
            out.push(
                Violation::new(
                    rule::EXEC_AREA_MISSING,
                    format!(
                        "{label}{r}: {kind} {name:?} is live over [{addr:#x}, {end:#x}) when the \
                         agent read /proc/vmallocinfo after step {step}, but no executable area \
                         the kernel held then covers it{near}: the record announces code in \
                         memory already freed (or never allocated)"
                    ),
                )
                .quoting([r])
                .with(Detail::ExecArea(ExecAreaFault {
                    caller: String::new(),
                    symbol: kind.to_string(),
                })),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};
    use kloop_records::{parse_stream, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    /// (time, addr, len, unregister, name) records on one listener.
    fn stream(recs: &[(u64, u64, u32, bool, &str)]) -> (Vec<Record>, Vec<u64>) {
        let l = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let mut b = Vec::new();
        let mut offsets = Vec::new();
        for &(t, addr, len, unreg, name) in recs {
            offsets.push(b.len() as u64);
            b.extend(testutil::ksymbol(
                &l,
                addr,
                len,
                kloop_records::KSYM_TYPE_OOL,
                unreg,
                name,
                Tr {
                    time: t,
                    ..Tr::default()
                },
            ));
        }
        offsets.push(b.len() as u64);
        (parse_stream(&l, &b).unwrap(), offsets)
    }

    const PAGE: u64 = 0xffffffffc0203000;

    fn area(start: u64, pages: u32, caller: &str) -> ExecArea {
        ExecArea {
            start,
            end: start + (u64::from(pages) + 1) * PAGE_SIZE,
            pages: Some(pages),
            caller: Some(caller.into()),
        }
    }

    fn reading(step: u32, before: u64, after: u64, areas: Vec<ExecArea>) -> AreaReading {
        AreaReading {
            after_step: Some(step),
            seen_at: vec![(0, before)],
            read_until: vec![(0, after)],
            areas,
        }
    }

    #[test]
    fn a_kprobe_page_announced_after_its_memory_went_is_missing() {
        let (recs, at) = stream(&[(10, PAGE, 4096, false, "kprobe_insn_page")]);
        // After step 3 the page is still announced (no unregister), and
        // the kernel holds no area there.
        let r = reading(
            3,
            at[1],
            at[1],
            vec![area(
                0xffffffffc0000000,
                512,
                "bpf_prog_pack_alloc+0x2b0/0x3c0",
            )],
        );
        let mut v = Vec::new();
        assert_eq!(check("", &recs, &[0], &[r], &mut v), None);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].rule, rule::EXEC_AREA_MISSING);
        assert!(
            v[0].message.contains("\"kprobe_insn_page\""),
            "{}",
            v[0].message
        );
        assert!(v[0].message.contains("after step 3"), "{}", v[0].message);
        // With its page held, nothing.
        let r = reading(
            3,
            at[1],
            at[1],
            vec![area(PAGE, 1, "alloc_insn_page+0x1/0x2")],
        );
        let mut v = Vec::new();
        check("", &recs, &[0], &[r], &mut v);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn an_unregister_written_while_the_file_was_read_is_not_claimed() {
        let (recs, at) = stream(&[
            (10, PAGE, 4096, false, "kprobe_insn_page"),
            (20, PAGE, 4096, true, "kprobe_insn_page"),
        ]);
        // The unregister lies between the two heads: the page may have
        // been freed before the read reached it.
        let r = reading(3, at[1], at[2], vec![]);
        let mut v = Vec::new();
        check("", &recs, &[0], &[r], &mut v);
        assert!(v.is_empty(), "{v:#?}");
        // A register written while the file was read is not claimed
        // either: its memory may be younger than the read.
        let r = reading(3, at[0], at[1], vec![]);
        check("", &recs, &[0], &[r], &mut v);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn a_set_whose_ring_the_reading_does_not_know_is_not_judged() {
        let (recs, at) = stream(&[(10, PAGE, 4096, false, "kprobe_insn_page")]);
        let mut r = reading(3, at[1], at[1], vec![]);
        r.seen_at.clear();
        let mut v = Vec::new();
        check("", &recs, &[0], &[r], &mut v);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn the_guard_page_holds_no_code() {
        // A page area is two pages long with its guard; a symbol in the
        // guard page is not in memory the kernel holds.
        let a = area(PAGE, 1, "alloc_insn_page+0x1/0x2");
        assert!(covered(std::slice::from_ref(&a), PAGE, 4096));
        assert!(!covered(std::slice::from_ref(&a), PAGE + 4096, 16));
        assert!(!covered(std::slice::from_ref(&a), PAGE + 4000, 200));
    }
}
