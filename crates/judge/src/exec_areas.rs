//! Books for all executable memory: what the agent read of the kernel's
//! own list of areas (/proc/vmallocinfo, the module mapping space where
//! x86-64 allocates every executable page: modules, BPF JIT images and
//! packs, trampolines and dispatchers, kprobe instruction pages, ftrace
//! trampolines) before the first step, after each step and after the
//! plan ([`kloop_protocol::Message::ExecAreaReading`],
//! [`kloop_protocol::Message::ExecAreasEnd`]). kmemleak does not
//! reliably list an executable page nobody references, and the JIT's
//! books (`crate::jit_books`) cover only the BPF JIT's charge and packs.
//!
//! What the kernel promises, from its sources (5.10 to 7.x):
//! - every executable allocation on these paths is given back when the
//!   code goes, or stays announced: a BPF image with its program or
//!   trampoline (bpf_jit_free, bpf_tramp_image_free), a kprobe instruction
//!   page when its last slot is freed unless it is the cache's last page,
//!   which is kept and stays listed as `kprobe_insn_page`
//!   (collect_one_slot(), kernel/kprobes.c), an ftrace trampoline when its
//!   dynamic ops is shut down (ftrace_shutdown() → ftrace_trampoline_free(),
//!   kernel/trace/ftrace.c; a static ops keeps it, and it stays listed as
//!   `ftrace_trampoline`), the XDP dispatcher's image for good (listed as
//!   `bpf_dispatcher_xdp`, with its staging copy, which is never run and
//!   never announced: `kloop_protocol::exec::DISPATCHER_COPY`). So after the plan, with
//!   everything it made closed and the deferred frees waited for, an area
//!   the kernel did not hold before the first step holds a symbol
//!   /proc/kallsyms lists, or belongs to a listed owner (rule
//!   `exec-area-kept`). Modules' own areas are the module loader's books,
//!   not these: an area that appeared right after a `modprobe` step is a
//!   module's while any module is listed.
//! - a symbol is added after its memory is allocated and deleted before it
//!   is freed, so every symbol /proc/kallsyms lists after the plan in
//!   `[bpf]` or a `[__builtin__*]` part lies in an area the kernel holds
//!   (rule `exec-area-missing`; the records' side of it, per set and per
//!   step, is `check::areas`).
//!
//! What these books cannot see: memory handed out in pieces of a larger
//! area that stays. BPF images on x86 from 6.1 (programs) and 6.7
//! (trampolines) are pieces of a 2 MiB `bpf_prog_pack` (its chunks are the
//! JIT's books, `crate::jit_books`); where x86 enables EXECMEM_ROX_CACHE
//! for kprobes and ftrace (the execmem_alloc_rw() series, 6.17; on the
//! pins 7.2 and 7.3, whose readings show a 512-page `execmem_alloc` area
//! and no area of its own for a kprobe page or an ftrace trampoline), so
//! are those, and the cache's own books (mm/execmem.c) are not read. A
//! leak there keeps no area of its own.

use kloop_protocol::exec::caller_function;
use kloop_protocol::ExecArea;

use crate::check::areas::{covered, usable};
use crate::check::detail::ExecAreaFault;
use crate::check::ranges::symbol_kind;
use crate::check::{rule, Analysis, Detail, Gap, Unchecked, Violation};
use crate::evidence::RunEvidence;
use kloop_records::{RecordBody, KSYMBOL_FLAGS_UNREGISTER};

/// The symbols /proc/kallsyms lists for generated code: `[bpf]` and the
/// `[__builtin__*]` parts (kprobes, ftrace), with what each is.
fn generated(ev: &RunEvidence) -> Vec<(&kloop_protocol::KallsymsEntry, String)> {
    let Some(books) = &ev.exec_areas else {
        return Vec::new();
    };
    books
        .end_symbols
        .iter()
        .filter_map(|e| match e.module.as_deref() {
            Some("bpf") => Some((
                e,
                symbol_kind(kloop_records::KSYM_TYPE_BPF, &e.name).to_string(),
            )),
            Some(m) if m.starts_with("__builtin__") => Some((e, m.to_string())),
            _ => None,
        })
        .collect()
}

/// The last KSYMBOL any listener received for an address inside `a`, for
/// the message: what the records last said of that memory.
fn last_record(analysis: &Analysis, a: &ExecArea) -> Option<String> {
    analysis
        .records_per_listener
        .values()
        .flatten()
        .filter(|r| match &r.body {
            RecordBody::Ksymbol { addr, .. } => (a.start..a.end).contains(addr),
            _ => false,
        })
        .max_by_key(|r| r.time().unwrap_or(0))
        .map(|r| {
            let unreg = matches!(&r.body, RecordBody::Ksymbol { flags, .. }
                if flags & KSYMBOL_FLAGS_UNREGISTER != 0);
            format!(
                "; the records last said of it {r}{}",
                if unreg {
                    " (withdrawn, yet the memory stayed)"
                } else {
                    ""
                }
            )
        })
}

/// Rules `exec-area-kept` and `exec-area-missing` over the end reading.
pub fn check(ev: &RunEvidence, analysis: &Analysis) -> Vec<Violation> {
    let mut out = Vec::new();
    let Some(books) = &ev.exec_areas else {
        return out;
    };
    let (Some(start), Some(end)) = (
        books.readings.iter().find(|r| r.after_step.is_none()),
        &books.end,
    ) else {
        return out;
    };
    if books.unreadable.is_some() {
        return out;
    }
    let symbols = &books.end_symbols;
    let owners = kloop_protocol::exec::owners(
        &start.areas,
        &end.areas,
        &books.readings,
        &|i| ev.steps.get(&i),
        symbols,
        ev.uname.arch(),
    );
    for (a, owner) in owners {
        if owner.is_some() {
            continue;
        }
        let u = usable(a);
        let caller = a.caller.as_deref();
        out.push(
            Violation::new(
                rule::EXEC_AREA_KEPT,
                format!(
                    "after the plan, with everything it made closed (the agent waited {} ms for \
                     deferred frees), [{:#x}, {:#x}) ({} page(s), allocated by {}) is executable \
                     memory the kernel did not hold before the first step, and no symbol \
                     /proc/kallsyms lists lies in it{}: memory kept that no record or symbol \
                     explains",
                    books.settle_ns / 1_000_000,
                    u.start,
                    u.end,
                    a.pages.map_or("?".to_string(), |p| p.to_string()),
                    caller.unwrap_or("a caller the kernel did not print"),
                    last_record(analysis, a).unwrap_or_default()
                ),
            )
            .with(Detail::ExecArea(ExecAreaFault {
                caller: caller_function(caller).to_string(),
                symbol: String::new(),
            })),
        );
    }
    for (s, kind) in generated(ev) {
        if covered(&end.areas, s.addr, 1) {
            continue;
        }
        out.push(
            Violation::new(
                rule::EXEC_AREA_MISSING,
                format!(
                    "after the plan, /proc/kallsyms lists {} {:?} at {:#x} [{}], but no \
                     executable area the kernel holds covers that address: a symbol listed \
                     for memory already freed",
                    kind,
                    s.name,
                    s.addr,
                    s.module.as_deref().unwrap_or("")
                ),
            )
            .with(Detail::ExecArea(ExecAreaFault {
                caller: String::new(),
                symbol: kind,
            })),
        );
    }
    out
}

/// What of the areas' evidence did not arrive.
pub fn unchecked(ev: &RunEvidence) -> Vec<Unchecked> {
    let rules = format!("{}, {}", rule::EXEC_AREA_KEPT, rule::EXEC_AREA_MISSING);
    match &ev.exec_areas {
        // An agent that sent the JIT's books after the plan reads the
        // areas too; one that sent neither did not get that far, which
        // other rules say.
        None if ev.jit_books.is_some() => vec![Unchecked::new(
            rules,
            Gap::Lost,
            "the agent sent the JIT's books but no reading of the executable areas".to_string(),
        )],
        None => Vec::new(),
        Some(books) => {
            if let Some(why) = &books.unreadable {
                vec![Unchecked::new(rules, Gap::Lost, why.clone())]
            } else if !books.ended && ev.jit_books.is_some() {
                vec![Unchecked::new(
                    rules,
                    Gap::Lost,
                    "the executable areas' end reading never arrived".to_string(),
                )]
            } else {
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::ExecAreas;
    use kloop_protocol::{AreaReading, KallsymsEntry, Step};

    const PACK: u64 = 0xffffffffc0000000;
    const TRAMP: u64 = 0xffffffffc0201000;

    fn area(start: u64, pages: u32, caller: &str) -> ExecArea {
        ExecArea {
            start,
            end: start + (u64::from(pages) + 1) * 4096,
            pages: Some(pages),
            caller: Some(caller.into()),
        }
    }

    fn sym(addr: u64, name: &str, module: &str) -> KallsymsEntry {
        KallsymsEntry {
            addr,
            kind: 't',
            name: name.into(),
            module: Some(module.into()),
        }
    }

    /// As 6.12.107+deb13-cloud-amd64 showed them around the ftrace-ool
    /// scenario: the pack from before the plan, and an ftrace trampoline.
    fn books(end: Vec<ExecArea>, symbols: Vec<KallsymsEntry>) -> RunEvidence {
        let pack = area(PACK, 512, "bpf_prog_pack_alloc+0x2b0/0x3c0");
        RunEvidence {
            exec_areas: Some(ExecAreas {
                readings: vec![AreaReading {
                    after_step: None,
                    seen_at: vec![],
                    read_until: vec![],
                    areas: vec![pack.clone()],
                }],
                end: Some(AreaReading {
                    after_step: None,
                    seen_at: vec![],
                    read_until: vec![],
                    areas: [vec![pack], end].concat(),
                }),
                end_symbols: symbols,
                settle_ns: 3_000_000_000,
                unreadable: None,
                ended: true,
            }),
            ..RunEvidence::default()
        }
    }

    fn analysis() -> Analysis {
        crate::check::analyse(&RunEvidence::default())
    }

    #[test]
    fn a_trampoline_kept_with_its_symbol_gone_is_kept_memory() {
        let tramp = area(TRAMP, 1, "arch_ftrace_update_trampoline+0x164/0x340");
        let v = check(&books(vec![tramp.clone()], vec![]), &analysis());
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].rule, rule::EXEC_AREA_KEPT);
        assert!(
            v[0].message.contains("arch_ftrace_update_trampoline"),
            "{}",
            v[0].message
        );
        assert_eq!(
            v[0].detail,
            Some(Detail::ExecArea(ExecAreaFault {
                caller: "arch_ftrace_update_trampoline".into(),
                symbol: String::new()
            }))
        );
        // Still listed (a static ops keeps its trampoline): explained.
        let v = check(
            &books(
                vec![tramp],
                vec![sym(TRAMP, "ftrace_trampoline", "__builtin__ftrace")],
            ),
            &analysis(),
        );
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn the_dispatchers_copy_and_a_modules_areas_have_owners_while_listed() {
        // 6.12.107+deb13-cloud-amd64 after xdp-dispatcher: veth loaded,
        // the dispatcher's image in the pack and its copy beside it.
        // 7.2 names only the allocator: the area is the module's because
        // it appeared in the reading after the modprobe step.
        let module = area(0xffffffffc0207000, 1, "execmem_alloc_rw+0x13/0x60");
        let copy = area(
            0xffffffffc0211000,
            1,
            "bpf_dispatcher_change_prog+0x222/0x330",
        );
        let listed = vec![
            sym(PACK + 0x1000, "bpf_dispatcher_xdp", "bpf"),
            sym(0xffffffffc0213000, "veth_xmit", "veth"),
        ];
        let with_modprobe = |mut ev: RunEvidence, step: Step| {
            let books = ev.exec_areas.as_mut().unwrap();
            books.readings.push(AreaReading {
                after_step: Some(0),
                seen_at: vec![],
                read_until: vec![],
                areas: books.end.as_ref().unwrap().areas.clone(),
            });
            ev.steps.insert(0, step);
            ev
        };
        let modprobe = Step::Modprobe {
            name: "veth".into(),
        };
        let ev = with_modprobe(
            books(vec![module.clone(), copy.clone()], listed.clone()),
            modprobe.clone(),
        );
        let v = check(&ev, &analysis());
        assert!(v.is_empty(), "{v:#?}");
        // The same area after another kind of step is not the module's.
        let ev = with_modprobe(books(vec![module.clone()], listed), Step::Drain);
        assert_eq!(check(&ev, &analysis()).len(), 1);
        // Neither owner listed: both are kept memory.
        let ev = with_modprobe(books(vec![module, copy.clone()], vec![]), modprobe);
        let v = check(&ev, &analysis());
        assert_eq!(v.len(), 2, "{v:#?}");
        // One dispatcher accounts for one copy, not two.
        let second = area(
            0xffffffffc0215000,
            1,
            "bpf_dispatcher_change_prog+0x222/0x330",
        );
        let v = check(
            &books(
                vec![copy, second],
                vec![sym(PACK, "bpf_dispatcher_xdp", "bpf")],
            ),
            &analysis(),
        );
        assert_eq!(v.len(), 1, "{v:#?}");
    }

    #[test]
    fn a_listed_kprobe_page_whose_memory_went_is_missing() {
        let v = check(
            &books(
                vec![],
                vec![sym(TRAMP, "kprobe_insn_page", "__builtin__kprobes")],
            ),
            &analysis(),
        );
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].rule, rule::EXEC_AREA_MISSING);
        assert!(
            v[0].message.contains("kprobe_insn_page"),
            "{}",
            v[0].message
        );
        // A program in the pack is covered.
        let v = check(
            &books(
                vec![],
                vec![sym(PACK + 0x40, "bpf_prog_0123456789abcdef_f", "bpf")],
            ),
            &analysis(),
        );
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn missing_or_unreadable_readings_are_unchecked_not_passed() {
        let mut ev = books(vec![], vec![]);
        ev.exec_areas.as_mut().unwrap().unreadable = Some("hidden".into());
        assert_eq!(unchecked(&ev).len(), 1);
        assert!(check(&ev, &analysis()).is_empty());
        let ev = RunEvidence {
            jit_books: Some(Default::default()),
            ..RunEvidence::default()
        };
        assert_eq!(unchecked(&ev)[0].gap, Gap::Lost);
    }
}
