//! Which executable areas the kernel may keep after a plan without a
//! symbol of their own in them: what the agent waits for after the plan
//! (an area nothing accounts for may still be freed by a deferred worker)
//! and what the host's rule `exec-area-kept` excuses are one definition.

use crate::plan::Step;
use crate::{Arch, AreaReading, ExecArea, KallsymsEntry};

/// The XDP dispatcher's staging copy: bpf_dispatcher_change_prog()
/// (kernel/bpf/dispatcher.c, 6.1 on) allocates `d->rw_image` with
/// bpf_jit_alloc_exec(PAGE_SIZE) beside `d->image` (from the pack, listed
/// as `bpf_dispatcher_<name>`) and keeps both for the dispatcher's life;
/// the dispatcher is built in the copy and moved into the image with
/// bpf_arch_text_copy(), so the copy never runs and nothing announces it.
pub const DISPATCHER_COPY: &str = "bpf_dispatcher_change_prog";

/// The callers /proc/vmallocinfo names for the dispatcher's copy. On x86-64
/// bpf_jit_alloc_exec() is module_alloc()/execmem_alloc(), which pass on
/// their caller's caller: [`DISPATCHER_COPY`]. On arm64 bpf_jit_alloc_exec()
/// calls vmalloc() (5.17 on) or execmem_alloc() (6.10 on) itself, so the copy
/// is named after it, like every other BPF allocation there; the owner is
/// still held to one area per listed dispatcher.
pub fn dispatcher_copy_callers(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &[DISPATCHER_COPY],
        Arch::Arm64 => &[DISPATCHER_COPY, "bpf_jit_alloc_exec"],
    }
}

/// `PAGE_SIZE` of x86-64: a vmalloc area's guard page, the unit of its
/// `pages=` count, and what bpf_image_ksym_add() announces.
pub const X86_64_PAGE_SIZE: u64 = 4096;

/// The functions /proc/vmallocinfo names as the caller of an arm64 area
/// that holds code: `%pS` of the `caller` the allocation was given, which
/// is `__builtin_return_address(0)` of the function that called the
/// vmalloc API. Read from each pinned series' source:
/// - BPF images and packs, trampolines, dispatchers:
///   `bpf_jit_alloc_exec` (arch/arm64/net/bpf_jit_comp.c: vmalloc() from
///   5.17, execmem_alloc(EXECMEM_BPF) from 6.10, both called there);
///   `bpf_jit_binary_alloc` and `bpf_jit_alloc_exec_page` (5.10, whose
///   bpf_jit_alloc_exec() passes its own return address to
///   __vmalloc_node_range() in the 128 MiB BPF_JIT_REGION: programs, and
///   the trampoline and dispatcher pages of kernel/bpf/trampoline.c), and
///   the callers that page allocator is inlined into: `bpf_trampoline_update`
///   (seen on the 5.10 pin), `bpf_dispatcher_change_prog`,
///   `bpf_struct_ops_map_alloc`; from 6.10 a pack's 2 MiB come from
///   alloc_new_pack(), inlined into `bpf_prog_pack_alloc` (seen on 7.3);
/// - kprobe instruction pages: `__get_insn_slot` (5.10 to 6.x:
///   arch/arm64/kernel/probes/kprobes.c alloc_insn_page() passes its own
///   return address), `alloc_insn_page` (execmem_alloc(EXECMEM_KPROBES),
///   6.10 on);
/// - module memory: `module_alloc`'s callers `move_module` and
///   `load_module` (5.10 to 6.3, `module_memory_alloc` 6.4 to 6.9),
///   `execmem_alloc` and `execmem_alloc_rw` (6.10 on; 7.x's modules).
///
/// A code area whose caller is not listed is not read, so the records'
/// side of `exec-area-missing` says it holds no area: a missing name fails
/// loudly, never passes quietly.
pub const ARM64_CODE_ALLOCATORS: &[&str] = &[
    "bpf_jit_alloc_exec",
    "bpf_jit_binary_alloc",
    "bpf_jit_alloc_exec_page",
    "bpf_trampoline_update",
    "bpf_dispatcher_change_prog",
    "bpf_struct_ops_map_alloc",
    "bpf_prog_pack_alloc",
    "alloc_new_pack",
    "__get_insn_slot",
    "alloc_insn_page",
    "module_alloc",
    "move_module",
    "load_module",
    "module_memory_alloc",
    "execmem_alloc",
    "execmem_alloc_rw",
];

/// Whether an arm64 area of this `%pS` caller holds code
/// ([`ARM64_CODE_ALLOCATORS`]).
pub fn arm64_allocates_code(caller: Option<&str>) -> bool {
    ARM64_CODE_ALLOCATORS.contains(&caller_function(caller))
}

/// What accounts for an area new since the plan's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A symbol /proc/kallsyms lists lies in it.
    Symbol,
    /// A module's part (text, data, read-only: some hold no symbol
    /// kallsyms lists), while a module is listed. Which areas are a
    /// module's is read from when they appeared (in the reading after a
    /// `modprobe` step), not from their caller, which names the module
    /// loader on some kernels (`load_module`, `move_module`) and only the
    /// allocator on others (`execmem_alloc_rw`, 6.17 on).
    Module,
    /// The dispatcher's copy ([`DISPATCHER_COPY`]), one per listed
    /// dispatcher.
    DispatcherCopy,
}

/// The function of a `%pS` caller (`alloc_insn_page+0x1a/0x40` →
/// `alloc_insn_page`).
pub fn caller_function(caller: Option<&str>) -> &str {
    caller
        .map(|c| c.split('+').next().unwrap_or(c))
        .unwrap_or("")
}

/// The bytes of `a` that can hold code: its mapped pages, without the
/// guard page after them (`page_size`: x86-64's 4096).
pub fn usable(a: &ExecArea, page_size: u64) -> std::ops::Range<u64> {
    let end = match a.pages {
        Some(p) => a.start + u64::from(p) * page_size,
        None => a.end.saturating_sub(page_size),
    };
    a.start..end.max(a.start)
}

/// For each area of `end` not in `start` (same start and end), what
/// accounts for it (`None`: nothing). `readings` are the per-step
/// readings in order (the first one an area is in says when it
/// appeared), `steps` gives a step by its index, `symbols` are
/// /proc/kallsyms' module-part lines read after the plan.
pub fn owners<'a, 's>(
    start: &[ExecArea],
    end: &'a [ExecArea],
    readings: &[AreaReading],
    steps: &dyn Fn(u32) -> Option<&'s Step>,
    symbols: &[KallsymsEntry],
    arch: Arch,
) -> Vec<(&'a ExecArea, Option<Owner>)> {
    let page_size = arch.page_size();
    let same = |a: &ExecArea, b: &ExecArea| a.start == b.start && a.end == b.end;
    let module_listed = symbols.iter().any(|s| {
        s.module
            .as_deref()
            .is_some_and(|m| m != "bpf" && !m.starts_with("__builtin__"))
    });
    let mut copies_left = symbols
        .iter()
        .filter(|s| s.module.as_deref() == Some("bpf") && s.name.starts_with("bpf_dispatcher_"))
        .count();
    end.iter()
        .filter(|a| !start.iter().any(|s| same(s, a)))
        .map(|a| {
            let u = usable(a, page_size);
            if symbols.iter().any(|s| u.contains(&s.addr)) {
                return (a, Some(Owner::Symbol));
            }
            let first_seen = readings
                .iter()
                .find(|r| r.areas.iter().any(|b| same(a, b)))
                .and_then(|r| r.after_step);
            let after_modprobe = first_seen
                .and_then(steps)
                .is_some_and(|s| matches!(s, Step::Modprobe { .. }));
            if after_modprobe && module_listed {
                return (a, Some(Owner::Module));
            }
            let copy_caller =
                dispatcher_copy_callers(arch).contains(&caller_function(a.caller.as_deref()));
            if copy_caller && copies_left > 0 {
                copies_left -= 1;
                return (a, Some(Owner::DispatcherCopy));
            }
            (a, None)
        })
        .collect()
}

/// The ring head of `listener` among `heads` (listener index, `data_head`)
/// that a reading was taken at, if the reading knew that ring.
pub fn head_of(heads: &[(u32, u64)], listener: u32) -> Option<u64> {
    heads.iter().find(|(l, _)| *l == listener).map(|(_, h)| *h)
}
