//! The records of one listener set taken together: the address space a
//! profiler builds from them. A consumer (perf's
//! `machine__process_ksymbol_register`, any tool on a KSYMBOL subscription)
//! turns each KSYMBOL register into a map `[addr, addr + len)` and each
//! unregister into its removal; two live ranges that overlap make samples
//! land on the wrong symbol. Every other rule judges one record against
//! the truth about one symbol; these judge the records against each other.
//!
//! - `ksymbol-overlap`: live KSYMBOL ranges are pairwise disjoint at every
//!   moment of the set's stream (its listeners' rings merged by time: one
//!   CPU's ring alone shows a symbol unregistered on another CPU as still
//!   live).
//! - `ksymbol-unregister-range`: an unregister names a range that is live,
//!   with the length it was registered with (`perf_event_ksymbol()` is
//!   called with the same `bpf_ksym` at add and at del).
//! - `ksymbol-extent`: a trampoline's range is its image's, a struct_ops
//!   trampoline's its own part of its image page (`bpf_struct_ops_ksym_init()`
//!   gives each `bpf__<type>_<member>` symbol its trampoline's size; the
//!   `struct-ops` step reads `ksym.start`/`ksym.end` off `bpf_kallsyms`),
//!   (`bpf_image_ksym_init()`, kernel/bpf/trampoline.c 6.2 on, sets
//!   `ksym->end = start + size`, and /proc/kallsyms shows that extent; the
//!   agent reads `im->size` off `bpf_kallsyms`). A program's range against
//!   `jited_func_lens` is `load-symbols`'.
//!
//! A set that lost records (LOST, or a stream cut short) says nothing
//! about what it did not see: the rules stop at its first LOST record and
//! say so in a note. A symbol registered before the set opened is not in
//! its map: an unregister of it is another rule's (`unregister-without-
//! register` with the initial kallsyms).

use std::collections::BTreeMap;

use kloop_records::{Record, RecordBody, KSYMBOL_FLAGS_UNREGISTER};

use super::detail::{KsymbolExtent, KsymbolOverlap};
use super::{rule, Detail, Violation};

/// At most this many violations of one rule per set are spelled out (each
/// with its typed fields, which the ledger matches; the rest are counted
/// in one line no entry excuses).
const MAX: usize = 64;

/// How a struct_ops trampoline is named: `bpf__<type>_<member>`
/// (bpf_struct_ops_ksym_init(), kernel/bpf/bpf_struct_ops.c; Debian's 6.12
/// and the 7.x pins have it); no other BPF symbol starts so (`bpf_prog_`,
/// `bpf_trampoline_`, `bpf_dispatcher_`).
pub const STRUCT_OPS_PREFIX: &str = "bpf__";

/// What a symbol's name says it is: `trampoline`, `dispatcher`,
/// `struct-ops` (a struct_ops trampoline), `program`,
/// or `ool` for an out-of-line KSYMBOL (`other` for the rest).
pub fn symbol_kind(ksym_type: u16, name: &str) -> &'static str {
    if ksym_type == kloop_records::KSYM_TYPE_OOL {
        "ool"
    } else if name.starts_with("bpf_trampoline_") {
        "trampoline"
    } else if name.starts_with("bpf_dispatcher_") {
        "dispatcher"
    } else if name.starts_with(STRUCT_OPS_PREFIX) {
        "struct-ops"
    } else if name.starts_with("bpf_prog_") {
        "program"
    } else {
        "other"
    }
}

struct Live<'r> {
    len: u32,
    name: &'r str,
    kind: &'static str,
    rec: &'r Record,
}

/// Up to when a set's stream is whole: a ring that lost records dropped
/// them after the last record it kept before its LOST record (the LOST
/// record is written once there is room again, `perf_output_begin()`
/// kernel/events/ring_buffer.c), so the earliest such last-kept time over
/// the set's listeners bounds what the set saw; with the LOST record
/// quoted. `None`: nothing lost.
pub(super) fn lost_cutoff(merged: &[Record]) -> Option<(u64, String)> {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    let mut cut: Option<(u64, String)> = None;
    for r in merged {
        if matches!(r.body, RecordBody::Lost { .. }) {
            let t = last.get(&r.listener).copied().unwrap_or(0);
            if cut.as_ref().is_none_or(|(c, _)| t < *c) {
                cut = Some((t, r.to_string()));
            }
        } else if let Some(t) = r.time() {
            last.insert(r.listener, t);
        }
    }
    cut
}

/// A KSYMBOL record's fields.
struct Ksym<'r> {
    rec: &'r Record,
    addr: u64,
    len: u32,
    name: &'r str,
    kind: &'static str,
}

/// The address space as the set's records built it so far, and the
/// violations found.
struct Space<'r, 'o> {
    label: &'o str,
    live: BTreeMap<u64, Live<'r>>,
    out: &'o mut Vec<Violation>,
    /// Violations per rule, for the cap.
    counts: BTreeMap<&'static str, usize>,
}

impl<'r> Space<'r, '_> {
    /// Pushes `v` unless its rule's cap is reached (counted either way).
    fn push(&mut self, v: Violation) {
        let n = self.counts.entry(v.rule).or_default();
        *n += 1;
        if *n <= MAX {
            self.out.push(v);
        }
    }

    /// An unregister: the range it names leaves the map, and must have been
    /// registered with its length. One registered before the set opened is
    /// not in the map, and not this rule's (`unregister-without-register`).
    fn unregister(&mut self, k: &Ksym<'r>) {
        let label = self.label;
        let Some(l) = self.live.remove(&k.addr) else {
            return;
        };
        if l.len == k.len {
            return;
        }
        let (r, name, len, addr) = (k.rec, k.name, k.len, k.addr);
        self.push(
            Violation::new(
                rule::KSYMBOL_UNREGISTER_RANGE,
                format!(
                    "{label}{r}: unregisters {name:?} with len {len}, but it was registered \
                     with len {} ({}): a consumer's map keeps [{addr:#x}, +{}) or drops more \
                     than was announced",
                    l.len, l.rec, l.len
                ),
            )
            .quoting([r, l.rec]),
        );
    }

    /// A register: its range must meet no live one. Live ranges are
    /// disjoint, so only the one starting at or before `addr` and those
    /// starting inside `[addr, end)` can intersect it.
    fn register(&mut self, k: &Ksym<'r>) {
        let label = self.label;
        let end = k.addr.saturating_add(u64::from(k.len));
        let mut found = Vec::new();
        if k.len > 0 {
            let before = self.live.range(..=k.addr).next_back();
            let inside = self.live.range(k.addr.saturating_add(1)..end);
            for (&a, l) in before.into_iter().chain(inside) {
                let l_end = a.saturating_add(u64::from(l.len));
                if l.len == 0 || !(a < end && k.addr < l_end) {
                    continue;
                }
                let (lo, hi) = (a.max(k.addr), l_end.min(end));
                found.push(
                    Violation::new(
                        rule::KSYMBOL_OVERLAP,
                        format!(
                            "{label}{}: registers {} {:?} over [{:#x}, {end:#x}) while {} {:?} \
                             is live over [{a:#x}, {l_end:#x}) (registered by {}): both cover \
                             [{lo:#x}, {hi:#x}), {} bytes, so a sample there is filed under either",
                            k.rec,
                            k.kind,
                            k.name,
                            k.addr,
                            l.kind,
                            l.name,
                            l.rec,
                            hi - lo
                        ),
                    )
                    .quoting([k.rec, l.rec])
                    .with(Detail::KsymbolOverlap(KsymbolOverlap {
                        registered: k.kind.to_string(),
                        registered_len: k.len,
                        live: l.kind.to_string(),
                        live_len: l.len,
                    })),
                );
            }
        }
        for v in found {
            self.push(v);
        }
        self.live.insert(
            k.addr,
            Live {
                len: k.len,
                name: k.name,
                kind: k.kind,
                rec: k.rec,
            },
        );
    }

    /// A trampoline's range against its image (`im->size`), when the agent
    /// read that image between this register and `next`, the next register
    /// at the same address (an earlier or later image of the same
    /// trampoline may use the address with another size). "Between" is
    /// read from the rings, not a clock: each reading carries every ring's
    /// `data_head` when it was taken, and a record was written before it
    /// when its stream offset is below that head. A reading without heads
    /// (an older agent) stands for the register only when it is the one
    /// register at that address. Otherwise not known, not judged.
    fn extent(
        &mut self,
        k: &Ksym<'r>,
        images: &[kloop_protocol::ImageReading],
        (next, only_register): (Option<&Record>, bool),
    ) {
        let label = self.label;
        if k.kind != "trampoline" && k.kind != "struct-ops" {
            return;
        }
        let here: Vec<&kloop_protocol::ImageReading> = images
            .iter()
            .filter(|i| i.start == k.addr && i.name == k.name && i.size.is_some())
            .collect();
        let head_on = |i: &kloop_protocol::ImageReading, listener: u32| {
            kloop_protocol::exec::head_of(&i.seen_at, listener)
        };
        let in_window = here.iter().find(|i| {
            let after = head_on(i, k.rec.listener).is_some_and(|h| k.rec.offset < h);
            let before_next =
                next.is_none_or(|n| head_on(i, n.listener).is_some_and(|h| h <= n.offset));
            after && before_next
        });
        let size = match in_window {
            Some(i) => i.size,
            None if only_register && here.len() == 1 && here[0].seen_at.is_empty() => here[0].size,
            None => None,
        };
        let Some(size) = size else {
            return;
        };
        if size == k.len {
            return;
        }
        let (r, name, len) = (k.rec, k.name, k.len);
        let (what, holder) = if k.kind == "struct-ops" {
            (
                format!(
                    "struct_ops trampoline {name:?} with len {len}, but it is {size} bytes of its \
                 image page (bpf_kallsyms: bpf_struct_ops_ksym_init() sets ksym->end = start + \
                 the trampoline's size)"
                ),
                "the trampoline",
            )
        } else {
            (
                format!(
                    "trampoline {name:?} with len {len}, but its image is {size} bytes (im->size; \
                 bpf_image_ksym_init() sets ksym->end = start + size, and /proc/kallsyms shows \
                 that)"
                ),
                "the image",
            )
        };
        self.push(
            Violation::new(
                rule::KSYMBOL_EXTENT,
                format!(
                    "{label}{r}: announces {what}: the record claims {} bytes {holder} does not \
                     hold",
                    i64::from(len) - i64::from(size)
                ),
            )
            .quoting([r])
            .with(Detail::KsymbolExtent(KsymbolExtent {
                kind: k.kind.to_string(),
                len,
                extent: size,
            })),
        );
    }
}

/// What the `ksymbol-extent` rule holds symbols to: the trampoline images
/// the agent read (`JitBooks`), and each struct_ops trampoline's extent,
/// which has no image of its own: its `bpf_ksym`'s, read off
/// `bpf_kallsyms` by the `struct-ops` step while it was registered (one
/// register per address in a step).
pub fn images(ev: &crate::evidence::RunEvidence) -> Vec<kloop_protocol::ImageReading> {
    let mut images: Vec<kloop_protocol::ImageReading> = ev
        .jit_books
        .as_ref()
        .map(|b| b.images.clone())
        .unwrap_or_default();
    images.extend(ev.struct_ops.iter().flat_map(|s| {
        s.extents.iter().map(|e| kloop_protocol::ImageReading {
            name: e.name.clone(),
            start: e.start,
            end: e.end,
            size: u32::try_from(e.end.saturating_sub(e.start)).ok(),
            seen_at: Vec::new(),
        })
    }));
    images
}

/// The violations of one set's `merged` records (time order), and a note
/// when a LOST record ended what the set can claim. `images` are the
/// trampoline images the agent read (`start`, `size`), for the extent.
pub fn check(
    label: &str,
    merged: &[Record],
    images: &[kloop_protocol::ImageReading],
    out: &mut Vec<Violation>,
) -> Option<String> {
    let mut space = Space {
        label,
        live: BTreeMap::new(),
        out,
        counts: BTreeMap::new(),
    };
    let cutoff = lost_cutoff(merged);
    let mut note = None;
    // Each address's registers, in stream order (indexes into `merged`).
    let mut registers_at: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (n, r) in merged.iter().enumerate() {
        if let RecordBody::Ksymbol { addr, flags, .. } = &r.body {
            if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
                registers_at.entry(*addr).or_default().push(n);
            }
        }
    }
    for (n, r) in merged.iter().enumerate() {
        if let Some((t, lost)) = &cutoff {
            if r.time().is_none_or(|rt| rt > *t) {
                note = Some(format!(
                    "{label}rules {}, {}, {}: not claimed after t={t}: the set lost records \
                     ({lost}), and a ring drops them after the last record it kept before its \
                     LOST record, so what was registered or unregistered past that is not known",
                    rule::KSYMBOL_OVERLAP,
                    rule::KSYMBOL_UNREGISTER_RANGE,
                    rule::KSYMBOL_EXTENT
                ));
                break;
            }
        }
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
        let k = Ksym {
            rec: r,
            addr: *addr,
            len: *len,
            name: name.as_str(),
            kind: symbol_kind(*ksym_type, name),
        };
        if flags & KSYMBOL_FLAGS_UNREGISTER != 0 {
            space.unregister(&k);
        } else {
            let at = registers_at.get(addr).map(Vec::as_slice).unwrap_or(&[]);
            let next = at.iter().find(|m| **m > n).and_then(|m| merged.get(*m));
            let only_register = at.len() == 1;
            space.register(&k);
            space.extent(&k, images, (next, only_register));
        }
    }
    let counts = std::mem::take(&mut space.counts);
    for (rule, n) in counts {
        if n > MAX {
            space.out.push(Violation::new(
                rule,
                format!(
                    "{label}… {} more violation(s) of {rule} in this set",
                    n - MAX
                ),
            ));
        }
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};
    use kloop_records::{parse_stream, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    /// (time, addr, len, unregister, name) records on one listener.
    fn stream(recs: &[(u64, u64, u32, bool, &str)]) -> Vec<Record> {
        let l = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let mut b = Vec::new();
        for &(t, addr, len, unreg, name) in recs {
            b.extend(testutil::ksymbol(
                &l,
                addr,
                len,
                kloop_records::KSYM_TYPE_BPF,
                unreg,
                name,
                Tr {
                    time: t,
                    ..Tr::default()
                },
            ));
        }
        parse_stream(&l, &b).unwrap()
    }

    const PROG: &str = "bpf_prog_6deef7357e7b4530_kloop_fentry";
    const TRAMP: &str = "bpf_trampoline_6442523898";

    #[test]
    fn a_trampoline_announced_as_a_page_over_live_code_overlaps_it() {
        // As 6.12.107 wrote them in pack-boundary: the image is carved out
        // of the pack with its own size, the record says PAGE_SIZE.
        let recs = stream(&[
            (10, 0xffffffffc0000794, 96, false, PROG),
            (20, 0xffffffffc00006c0, 4096, false, TRAMP),
            (30, 0xffffffffc00006c0, 4096, true, TRAMP),
            (40, 0xffffffffc0000794, 96, true, PROG),
        ]);
        let image = kloop_protocol::ImageReading {
            name: TRAMP.into(),
            start: 0xffffffffc00006c0,
            end: 0xffffffffc00006c0 + 180,
            size: Some(180),
            // Read after the trampoline's register (L0@...: the second
            // record) was written.
            seen_at: vec![(0, 1 << 20)],
        };
        let mut v = Vec::new();
        assert_eq!(check("", &recs, std::slice::from_ref(&image), &mut v), None);
        assert_eq!(v.len(), 2, "{v:#?}");
        assert_eq!(v[0].rule, rule::KSYMBOL_OVERLAP);
        assert!(
            v[0].message.contains(PROG) && v[0].message.contains(TRAMP),
            "{}",
            v[0].message
        );
        assert!(
            v[0].message
                .contains("[0xffffffffc0000794, 0xffffffffc00007f4)"),
            "{}",
            v[0].message
        );
        assert_eq!(
            v[0].detail,
            Some(Detail::KsymbolOverlap(KsymbolOverlap {
                registered: "trampoline".into(),
                registered_len: 4096,
                live: "program".into(),
                live_len: 96,
            }))
        );
        assert_eq!(v[1].rule, rule::KSYMBOL_EXTENT);
        assert!(
            v[1].message.contains("its image is 180 bytes"),
            "{}",
            v[1].message
        );
    }

    #[test]
    fn ranges_that_follow_each_other_or_come_after_an_unregister_do_not_overlap() {
        let recs = stream(&[
            (10, 0x1000, 64, false, "bpf_prog_a_f"),
            (11, 0x1040, 64, false, "bpf_prog_b_g"),
            (12, 0x1000, 64, true, "bpf_prog_a_f"),
            (13, 0x1000, 64, false, "bpf_prog_c_h"),
            // A zero-length symbol covers nothing (another rule's business).
            (14, 0x1010, 0, false, ""),
        ]);
        let mut v = Vec::new();
        check("", &recs, &[], &mut v);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn an_unregister_of_another_length_is_named() {
        let recs = stream(&[
            (10, 0x1000, 64, false, "bpf_prog_a_f"),
            (12, 0x1000, 4096, true, "bpf_prog_a_f"),
            // Registered before the set opened: not this rule's.
            (13, 0x9000, 64, true, "bpf_prog_z_f"),
        ]);
        let mut v = Vec::new();
        check("", &recs, &[], &mut v);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].rule, rule::KSYMBOL_UNREGISTER_RANGE);
    }

    #[test]
    fn nothing_is_claimed_past_the_last_record_a_ring_kept_before_it_lost() {
        let l0 = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let l1 = testutil::listener(1, 1, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let ks = |l: &kloop_protocol::ListenerInfo, t, addr, unreg, name: &str| {
            testutil::ksymbol(
                l,
                addr,
                64,
                kloop_records::KSYM_TYPE_BPF,
                unreg,
                name,
                Tr {
                    time: t,
                    ..Tr::default()
                },
            )
        };
        // Listener 1 keeps a register at t=10, then loses the unregister
        // (its LOST at t=40); listener 0 sees a new symbol at the same
        // place at t=30. Judged naively, 0x1000 looks live twice.
        let mut b1 = ks(&l1, 10, 0x1000, false, "bpf_prog_a_f");
        b1.extend(testutil::lost(
            &l1,
            1,
            1,
            Tr {
                time: 40,
                ..Tr::default()
            },
        ));
        let b0 = ks(&l0, 30, 0x1000, false, "bpf_prog_b_g");
        let merged = kloop_records::merge_by_time(vec![
            parse_stream(&l0, &b0).unwrap(),
            parse_stream(&l1, &b1).unwrap(),
        ]);
        let mut v = Vec::new();
        let note = check("", &merged, &[], &mut v).expect("a note");
        assert!(v.is_empty(), "{v:#?}");
        assert!(note.contains("not claimed after t=10"), "{note}");
    }

    #[test]
    fn an_address_a_later_image_reuses_is_judged_against_the_image_seen_in_its_window() {
        // A fail-nth sweep: one image at 0xa40 of 248 bytes, freed, then
        // another of 384 at the same address; the agent read each while it
        // was live, after its register was written.
        let recs = stream(&[
            (10, 0xa40, 248, false, TRAMP),
            (20, 0xa40, 248, true, TRAMP),
            (30, 0xa40, 384, false, TRAMP),
            (40, 0xa40, 384, true, TRAMP),
        ]);
        let after = |k: usize| recs[k].offset + 1;
        let image = |size, head: u64| kloop_protocol::ImageReading {
            name: TRAMP.into(),
            start: 0xa40,
            end: 0xa40 + u64::from(size),
            size: Some(size),
            seen_at: vec![(0, head)],
        };
        let mut v = Vec::new();
        check(
            "",
            &recs,
            &[image(248, after(0)), image(384, after(2))],
            &mut v,
        );
        assert!(v.is_empty(), "{v:#?}");
        // The 384-byte image read before the first register (an earlier
        // image at that address): the first register's window has no
        // reading, so it is not judged; the second register claims a page
        // and its image, read in its window, says 384.
        let recs = stream(&[
            (10, 0xa40, 248, false, TRAMP),
            (20, 0xa40, 248, true, TRAMP),
            (30, 0xa40, 4096, false, TRAMP),
        ]);
        let mut v = Vec::new();
        check(
            "",
            &recs,
            &[image(384, 0), image(384, recs[2].offset + 1)],
            &mut v,
        );
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(
            v[0].message.contains("with len 4096, but its image is 384"),
            "{}",
            v[0].message
        );
        assert_eq!(v[0].records[0].offset, recs[2].offset);
    }
}
