//! The BPF JIT's books as oracles: what the agent read of
//! `bpf_jit_current` and the `bpf_prog_pack` bitmaps before the first step
//! and after the plan ([`kloop_protocol::Message::JitBooks`]). A charge
//! not returned or a chunk never given back shows in no record, only
//! here. (The records of a trampoline report PAGE_SIZE whatever its
//! image's size: a kernel bug, which `check::ranges` holds against the
//! image read here, rule `ksymbol-extent`; ledger
//! `trampoline-ksymbol-page-len-*`.)
//!
//! What the kernel promises, from kernel/bpf/core.c and
//! kernel/bpf/trampoline.c (5.10 to 7.x):
//! - every bpf_jit_charge_modmem(size) is matched by a
//!   bpf_jit_uncharge_modmem() of the same size when the image goes (JIT
//!   images: bpf_jit_binary_free / bpf_jit_binary_pack_free with the
//!   header's size; trampolines: bpf_tramp_image_free with `im->size`,
//!   the size charged; the error paths uncharge what they charged). With
//!   every program, link and listener the plan made closed and the
//!   deferred frees run, the counter is back where it started
//!   (rule `jit-charge`).
//! - bpf_prog_pack_free(ptr, size) clears exactly the chunks
//!   bpf_prog_pack_alloc(size) set for that pointer. After the plan no
//!   chunk is used that was free before it, unless code still listed in
//!   /proc/kallsyms lies in it (the XDP dispatcher keeps its image for
//!   good); and no `[bpf]` symbol still listed lies in a free chunk
//!   (rule `jit-chunks`).
//!
//! The chunk check is by runs of used chunks: a leaked chunk right next to
//! a live image (the dispatcher's) is not told apart from it.

use std::collections::BTreeSet;

// A page is a trampoline image's size where `bpf_tramp_image` has no
// `size` (before 6.2, bpf_image_ksym_add() spans PAGE_SIZE).
use kloop_protocol::exec::X86_64_PAGE_SIZE as PAGE_SIZE;
use kloop_protocol::PackReading;

use crate::check::{Gap, Unchecked, Violation};
use crate::evidence::{JitBooks, RunEvidence};

/// The rules this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[CHARGE, CHUNKS, LIMIT, IMAGES];
/// `bpf_jit_current` back at its start value after the plan.
pub const CHARGE: &str = "jit-charge";
/// No pack chunk kept that no live code explains, none freed under it.
pub const CHUNKS: &str = "jit-chunks";
/// A caller that is not `bpf_capable()` is held to `bpf_jit_limit`.
pub const LIMIT: &str = "jit-limit";
/// A trampoline image's symbol spans the image.
pub const IMAGES: &str = "jit-images";

/// Every trampoline image seen: its symbol spans exactly the image,
/// `ksym.end - ksym.start == im->size` (bpf_image_ksym_init(image, size,
/// ksym) with the size charged and allocated, kernel/bpf/trampoline.c, 6.2
/// on), or a page before `size` existed. A longer span makes kallsyms
/// lookups (`%ps`, bpf_ksym_find) of the bytes past the image name the
/// trampoline.
pub fn check_images(books: &JitBooks) -> Vec<Violation> {
    books
        .images
        .iter()
        .filter_map(|i| {
            let want = i.size.map_or(PAGE_SIZE, u64::from);
            let span = i.end.wrapping_sub(i.start);
            (span != want).then(|| {
                Violation::new(
                    IMAGES,
                    format!(
                        "{} at {:#x}: its symbol spans {span} bytes, the image {want} ({}): \
                         bpf_image_ksym_init() must span exactly the image",
                        i.name,
                        i.start,
                        if i.size.is_some() {
                            "im->size"
                        } else {
                            "a page, before im->size"
                        }
                    ),
                )
            })
        })
        .collect()
}

/// Every `unprivileged-attach` held to what bpf_jit_charge_modmem()
/// promises: a caller without CAP_BPF and CAP_SYS_ADMIN whose charge passes
/// `net.core.bpf_jit_limit` is refused with EPERM (the charge taken back).
/// The same attach within the limit must succeed, or the refusal over it
/// could have come from elsewhere and would prove nothing.
pub fn check_limit(ev: &RunEvidence) -> Vec<Violation> {
    let mut out = Vec::new();
    for (label, over_limit, errno) in &ev.unprivileged_attaches {
        match (over_limit, errno.as_deref()) {
            (true, Some("EPERM")) | (false, None) => {}
            (true, None) => out.push(Violation::new(
                LIMIT,
                format!(
                    "{label}: a thread without any capability attached past \
                     net.core.bpf_jit_limit (1 byte): its trampoline image was charged and \
                     built, where bpf_jit_charge_modmem() refuses a caller that is not \
                     bpf_capable() with EPERM"
                ),
            )),
            (true, Some(e)) => out.push(Violation::new(
                LIMIT,
                format!(
                    "{label}: the attach past net.core.bpf_jit_limit by a thread without \
                     capabilities failed with {e}, not the EPERM of bpf_jit_charge_modmem()"
                ),
            )),
            (false, Some(e)) => out.push(Violation::new(
                LIMIT,
                format!(
                    "{label}: the attach within net.core.bpf_jit_limit by a thread without \
                     capabilities failed with {e}: the kernel refuses such a caller before the \
                     charge, so the limit's own refusal cannot be told apart"
                ),
            )),
        }
    }
    out
}

/// `jit-chunks` while code is live: every byte of a symbol on
/// `bpf_kallsyms` lies in chunks its pack marks used. The kernel adds a
/// symbol only after its memory is allocated (bpf_prog_kallsyms_add() after
/// the JIT, bpf_image_ksym_add() after arch_alloc_bpf_trampoline()) and
/// deletes it before the memory goes back (bpf_prog_kallsyms_del_all()
/// before bpf_jit_free(); bpf_image_ksym_del() before
/// arch_free_bpf_trampoline()), so a symbol seen in the walks before and
/// after a bitmap reading was allocated throughout it. A chunk marked free
/// under it was cleared by someone else's free: `bpf_prog_pack_free()`
/// clears `BPF_PROG_SIZE_TO_NBITS(size)` chunks from the pointer, so a
/// size larger than the allocation's frees its neighbour's first chunk,
/// which the next allocation is then handed.
pub fn check_moments(ev: &RunEvidence) -> Vec<Violation> {
    let mut out = Vec::new();
    for pb in &ev.pack_boundaries {
        for m in &pb.moments {
            for k in m.before.iter().filter(|k| m.after.contains(k)) {
                let Some((pack, first)) = m
                    .packs
                    .iter()
                    .find_map(|p| p.chunk_of(k.start).map(|c| (p, c)))
                else {
                    continue;
                };
                let size = u64::from(pack.chunk_size);
                let last = ((k.end.max(k.start + 1) - 1 - pack.base) / size) as u32;
                let free: Vec<u32> = (first..=last).filter(|&c| !pack.is_used(c)).collect();
                if free.is_empty() {
                    continue;
                }
                out.push(Violation::new(
                    CHUNKS,
                    format!(
                        "{} ({:#x}..{:#x}), live before and after the reading {}, lies in \
                         chunk(s) {free:?} of the bpf_prog_pack at {:#x}, which the allocator \
                         marks free: a free cleared chunks it was not given (bpf_prog_pack_free() \
                         clears round_up(size, 64) / 64 chunks; the boundary image was {} bytes \
                         at {:#x}), and the next allocation may be handed this code's memory",
                        k.name, k.start, k.end, m.what, pack.base, pb.boundary.1, pb.boundary.0
                    ),
                ));
            }
        }
    }
    out
}

/// Every violation of the books in a run; none when they were not read
/// (said by [`not_read`]).
pub fn check(ev: &RunEvidence) -> Vec<Violation> {
    let mut out = check_limit(ev);
    out.extend(check_moments(ev));
    let Some(books) = &ev.jit_books else {
        return out;
    };
    out.extend(check_images(books));
    if books.unreadable.is_some() {
        return out;
    }
    if let (Some(start), Some(end)) = (books.start.current, books.end.current) {
        // Code from before the plan whose chunks were given back during it
        // lowers the counter by exactly their bytes; anything else is the
        // plan's charge not coming back.
        let freed = books.end.chunk_bytes_freed_since(&books.start);
        if end != start - freed {
            out.push(Violation::new(
                CHARGE,
                format!(
                    "bpf_jit_current is {end} bytes after the plan, with everything it made closed, \
                     and was {start} before its first step ({:+} bytes{}; the agent waited {} ms for \
                     the deferred frees): a bpf_jit_charge_modmem() without its uncharge, or an \
                     uncharge of another size than the charge",
                    end - start,
                    if freed == 0 {
                        String::new()
                    } else {
                        format!(
                            ", of which -{freed} are chunks used before the plan and freed during it, \
                             {:+} unexplained",
                            end - start + freed
                        )
                    },
                    books.settle_ns / 1_000_000
                ),
            ));
        }
    }
    if let (Some(start), Some(end)) = (&books.start.packs, &books.end.packs) {
        out.extend(chunks(books, start, end));
    }
    out
}

/// The book rules this run could not judge, and why: the kernel lacks
/// what they read ([`Gap::NotInKernel`], the guest names the option or
/// release), or a reading failed ([`Gap::Lost`]), or the layout a
/// `pack-boundary` step met leaves nothing to see (the chunk after the
/// boundary image is used by code whose symbol starts later).
pub fn unchecked(ev: &RunEvidence) -> Vec<Unchecked> {
    let mut out = Vec::new();
    if let Some(pb) = ev.pack_boundaries.iter().find(|pb| pb.neighbour.is_none()) {
        out.push(Unchecked::new(
            CHUNKS,
            Gap::Lost,
            format!(
                "next to the {}-byte image at {:#x}, the chunk after it is used by code whose \
                 symbol starts later, so a free that clears it shows in no live symbol",
                pb.boundary.1, pb.boundary.0
            ),
        ));
    }
    let Some(books) = ev.jit_books.as_ref() else {
        return out;
    };
    let gap = |in_kernel: bool| {
        if in_kernel {
            Gap::NotInKernel
        } else {
            Gap::Lost
        }
    };
    if let Some(why) = &books.unreadable {
        out.push(Unchecked::new(
            format!("{CHARGE}, {CHUNKS}"),
            gap(books.unreadable_in_kernel),
            why.clone(),
        ));
    } else if let Some(why) = &books.images_unreadable {
        out.push(Unchecked::new(
            IMAGES,
            gap(books.images_unreadable_in_kernel),
            why.clone(),
        ));
    }
    out
}

fn used_set(p: &PackReading) -> BTreeSet<u32> {
    p.used
        .iter()
        .flat_map(|&(first, len)| first..first + len)
        .collect()
}

fn chunks(books: &JitBooks, start: &[PackReading], end: &[PackReading]) -> Vec<Violation> {
    let mut out = Vec::new();
    for pack in end {
        let size = u64::from(pack.chunk_size);
        let before = start
            .iter()
            .find(|p| p.base == pack.base)
            .map(used_set)
            .unwrap_or_default();
        let live_in = |first: u32, len: u32| {
            let lo = pack.base + u64::from(first) * size;
            let hi = lo + u64::from(len) * size;
            books.live.iter().any(|&a| a >= lo && a < hi)
        };
        let mut kept = Vec::new();
        for &(first, len) in &pack.used {
            let new: Vec<u32> = (first..first + len)
                .filter(|c| !before.contains(c))
                .collect();
            if !new.is_empty() && !live_in(first, len) {
                kept.push((new[0], new.len()));
            }
        }
        if !kept.is_empty() {
            let listed: Vec<String> = kept
                .iter()
                .map(|(c, n)| {
                    format!(
                        "{n} from chunk {c} ({:#x})",
                        pack.base + u64::from(*c) * size
                    )
                })
                .collect();
            out.push(Violation::new(
                CHUNKS,
                format!(
                    "the bpf_prog_pack at {:#x} keeps chunks used after the plan that were free before \
                     it and hold no code /proc/kallsyms still lists: {} — an image freed with fewer \
                     chunks than it was allocated with, or never freed",
                    pack.base,
                    listed.join(", ")
                ),
            ));
        }
        for &addr in &books.live {
            let Some(chunk) = pack.chunk_of(addr) else {
                continue;
            };
            if !pack.is_used(chunk) {
                out.push(Violation::new(
                    CHUNKS,
                    format!(
                        "code at {addr:#x}, still listed in /proc/kallsyms, lies in chunk {chunk} of \
                         the bpf_prog_pack at {:#x}, which the allocator marks free: another image \
                         was freed with more chunks than it was allocated with",
                        pack.base
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use kloop_protocol::JitReading;

    use super::*;

    const BASE: u64 = 0xffff_ffff_c000_0000;

    fn pack(used: &[(u32, u32)]) -> PackReading {
        PackReading {
            base: BASE,
            chunk_size: 64,
            chunks: 32768,
            used: used.to_vec(),
        }
    }

    fn run(start: JitReading, end: JitReading, live: &[u64]) -> Vec<Violation> {
        let ev = RunEvidence {
            jit_books: Some(JitBooks {
                start,
                end,
                settle_ns: 30_000_000,
                live: live.to_vec(),
                ..JitBooks::default()
            }),
            ..RunEvidence::default()
        };
        check(&ev)
    }

    fn reading(current: i64, packs: Option<Vec<PackReading>>) -> JitReading {
        JitReading {
            current: Some(current),
            packs,
        }
    }

    #[test]
    fn a_counter_back_where_it_started_passes_and_any_difference_fails() {
        assert!(run(reading(4096, None), reading(4096, None), &[]).is_empty());
        for end in [4095, 4097, 4096 + (1 << 32)] {
            let v = run(reading(4096, None), reading(end, None), &[]);
            assert_eq!(v.len(), 1);
            assert_eq!(v[0].rule, CHARGE);
            assert!(
                v[0].message.contains(&format!("{:+}", end - 4096)),
                "{}",
                v[0].message
            );
        }
    }

    #[test]
    fn a_chunk_kept_with_no_live_code_fails_and_the_dispatchers_image_passes() {
        let start = reading(0, Some(vec![]));
        // Everything given back: the pack itself went.
        assert!(run(start.clone(), reading(0, Some(vec![])), &[]).is_empty());
        // The dispatcher's 64 chunks, its symbol listed: kept for good.
        let dispatcher = BASE + 10 * 64;
        let end = reading(0, Some(vec![pack(&[(10, 64)])]));
        assert!(run(start.clone(), end.clone(), &[dispatcher]).is_empty());
        // The same chunks with nothing listed in them: leaked.
        let v = run(start.clone(), end, &[]);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, CHUNKS);
        assert!(
            v[0].message.contains("64 from chunk 10"),
            "{}",
            v[0].message
        );
        // A chunk used before the plan and still used is not the plan's.
        let before = reading(0, Some(vec![pack(&[(0, 2)])]));
        assert!(run(before, reading(0, Some(vec![pack(&[(0, 2)])])), &[]).is_empty());
    }

    #[test]
    fn live_code_in_a_free_chunk_fails() {
        let start = reading(0, Some(vec![]));
        let end = reading(0, Some(vec![pack(&[(10, 63)])]));
        // The dispatcher's first chunk was cleared by another image's free.
        let v = run(start, end, &[BASE + 10 * 64, BASE + 9 * 64]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("chunk 9 "), "{}", v[0].message);
    }

    #[test]
    fn an_unprivileged_attach_past_the_limit_must_fail_eperm_and_within_it_succeed() {
        let run = |over: bool, errno: Option<&str>| {
            check(&RunEvidence {
                unprivileged_attaches: vec![("f".into(), over, errno.map(str::to_owned))],
                ..RunEvidence::default()
            })
        };
        assert!(run(true, Some("EPERM")).is_empty());
        assert!(run(false, None).is_empty());
        for (over, errno) in [(true, None), (true, Some("EBUSY")), (false, Some("EPERM"))] {
            let v = run(over, errno);
            assert_eq!(v.len(), 1, "{over} {errno:?}");
            assert_eq!(v[0].rule, LIMIT);
        }
    }

    #[test]
    fn a_trampoline_symbol_spans_exactly_its_image() {
        let image = |end: u64, size: Option<u32>| kloop_protocol::ImageReading {
            name: "bpf_trampoline_6442".into(),
            start: BASE,
            end: BASE + end,
            size,
            seen_at: Vec::new(),
        };
        let books = |images| JitBooks {
            images,
            ..JitBooks::default()
        };
        assert!(check_images(&books(vec![image(301, Some(301)), image(4096, None)])).is_empty());
        for bad in [
            image(302, Some(301)),
            image(309, Some(301)),
            image(301, None),
        ] {
            let v = check_images(&books(vec![bad]));
            assert_eq!(v.len(), 1);
            assert_eq!(v[0].rule, IMAGES);
        }
    }

    #[test]
    fn unreadable_books_are_unchecked_never_quiet() {
        let ev = |in_kernel: bool| RunEvidence {
            jit_books: Some(JitBooks {
                unreadable: Some("/proc/kcore: No such file (CONFIG_PROC_KCORE)".into()),
                unreadable_in_kernel: in_kernel,
                ..JitBooks::default()
            }),
            ..RunEvidence::default()
        };
        // The kernel lacks /proc/kcore: the rules are not this kernel's.
        assert!(check(&ev(true)).is_empty());
        let u = unchecked(&ev(true));
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].gap, Gap::NotInKernel);
        assert_eq!(u[0].rule, "jit-charge, jit-chunks");
        assert!(u[0].reason.contains("CONFIG_PROC_KCORE"));
        // A reading that failed: evidence lost.
        assert_eq!(unchecked(&ev(false))[0].gap, Gap::Lost);
        // Books read whole: nothing unchecked.
        let whole = RunEvidence {
            jit_books: Some(JitBooks::default()),
            ..RunEvidence::default()
        };
        assert!(unchecked(&whole).is_empty());
    }

    fn moment_over(
        used: &[(u32, u32)],
        before: &[(u64, u64)],
        after: &[(u64, u64)],
    ) -> Vec<Violation> {
        let ksym = |&(s, e): &(u64, u64)| kloop_protocol::KsymReading {
            name: format!("sym_{s:x}"),
            start: s,
            end: e,
        };
        let ev = RunEvidence {
            pack_boundaries: vec![crate::evidence::PackBoundary {
                sizes: vec![576, 640],
                boundary: (BASE + 64 * 10, 640),
                neighbour: None,
                moments: vec![kloop_protocol::BooksMoment {
                    what: "after the boundary image was freed".into(),
                    before: before.iter().map(ksym).collect(),
                    packs: vec![pack(used)],
                    after: after.iter().map(ksym).collect(),
                }],
                ..Default::default()
            }],
            ..RunEvidence::default()
        };
        check_moments(&ev)
    }

    #[test]
    fn live_code_over_a_chunk_marked_free_fails_and_marked_or_gone_code_passes() {
        // The neighbour: one chunk at 20, code from +8 to +40.
        let neighbour = (BASE + 20 * 64 + 8, BASE + 20 * 64 + 40);
        // Its chunk cleared by the boundary image's free: a violation.
        let v = moment_over(&[(0, 10)], &[neighbour], &[neighbour]);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, CHUNKS);
        assert!(v[0].message.contains("[20]"), "{}", v[0].message);
        // Marked: fine.
        assert!(moment_over(&[(0, 10), (20, 1)], &[neighbour], &[neighbour]).is_empty());
        // Gone by the second walk (deleted, then freed): not judged.
        assert!(moment_over(&[(0, 10)], &[neighbour], &[]).is_empty());
        // A symbol over two chunks with its second free: the chunk is named.
        let wide = (BASE + 30 * 64 + 60, BASE + 31 * 64 + 4);
        let v = moment_over(&[(30, 1)], &[wide], &[wide]);
        assert!(v.len() == 1 && v[0].message.contains("[31]"), "{v:?}");
        // Code outside every pack is not the allocator's.
        let away = (BASE - 4096, BASE - 4000);
        assert!(moment_over(&[], &[away], &[away]).is_empty());
    }

    #[test]
    fn code_from_before_the_plan_freed_during_it_explains_exactly_its_chunks() {
        // Recorded on a 6.12 build: the saved VM still owed the frees of
        // four chunks of the warm-up's programs when the plan began.
        let start = reading(1856, Some(vec![pack(&[(0, 29)])]));
        assert!(run(
            start.clone(),
            reading(1600, Some(vec![pack(&[(0, 25)])])),
            &[]
        )
        .is_empty());
        // One byte more or less is not explained by chunks.
        for end in [1599, 1601] {
            let v = run(
                start.clone(),
                reading(end, Some(vec![pack(&[(0, 25)])])),
                &[],
            );
            assert_eq!(v.len(), 1, "{end}: {v:?}");
            assert_eq!(v[0].rule, CHARGE);
            assert!(v[0].message.contains("-256 are chunks"), "{}", v[0].message);
        }
    }
}
