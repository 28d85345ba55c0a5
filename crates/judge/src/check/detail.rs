//! A violation's typed fields: what a ledger signature
//! ([`crate::known_issues::Signature`]) is matched against, so a known bug
//! excuses only violations that look like it, never everything its rule
//! reports. Each variant is one fault class a rule can report; a violation
//! without a detail can be excused by no entry.

use serde::{Deserialize, Serialize};

/// The typed fields of one violation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Detail {
    /// `parse` (kloop's listener) or `second-reader` (perf's copy): a
    /// record read whole — body, then its `sample_id` trailer — whose
    /// `header.size` claims `excess` more bytes, all zero
    /// ([`kloop_records::Oversized`]); reading went on after it.
    OversizedRecord(OversizedRecord),
    /// `load-symbols` / `unload-symbols`: a KSYMBOL at the address
    /// `bpf_prog_info` gives for a program the kernel did not JIT-compile.
    InterpretedSymbol(InterpretedSymbol),
    /// `second-reader`: a KSYMBOL perf synthesised at start for a program
    /// alive then, differing from the kernel's own record of it.
    SynthesisedKsymbol(SynthesisedKsymbol),
    /// `kasan`, `ubsan`, `lockdep`, `kmemleak`: a report of the kernel's
    /// own checks ([`crate::kernel_log`]).
    KernelReport(KernelReport),
    /// `fault-recovery`: a fail-nth sweep whose attempt without an
    /// injected fault failed after injected failures
    /// ([`crate::fault_recovery`]).
    FaultRecovery(FaultRecovery),
    /// `ksymbol-overlap`: a KSYMBOL register over a range another live
    /// symbol of the set covers.
    KsymbolOverlap(KsymbolOverlap),
    /// `ksymbol-extent`: a KSYMBOL whose length is not its code's extent.
    KsymbolExtent(KsymbolExtent),
    /// `exec-area-kept` / `exec-area-missing`: executable memory no symbol
    /// explains, or a symbol where no executable memory is.
    ExecArea(ExecAreaFault),
    /// `perf-attribution`: samples inside a live program's image that perf
    /// filed under another symbol.
    MisattributedSample(MisattributedSample),
}

/// See [`Detail::ExecArea`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAreaFault {
    /// The area's allocating function as /proc/vmallocinfo names it,
    /// without its offset (`alloc_insn_page`, `bpf_prog_pack_alloc`);
    /// empty when there is no area (`exec-area-missing`).
    pub caller: String,
    /// What the symbol is (`check::ranges::symbol_kind`, or the
    /// kallsyms module part: `__builtin__kprobes`); empty when no symbol
    /// is involved (`exec-area-kept`).
    pub symbol: String,
}

/// See [`Detail::MisattributedSample`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MisattributedSample {
    /// What perf named instead (`trampoline`, `program`, `unknown`,
    /// `other`: `perf_script::attribution::kind_of`).
    pub attributed: String,
    /// The lowest and highest sample IP, as offsets from the start of the
    /// symbol perf named, when its image is known (a trampoline the agent
    /// read off `bpf_kallsyms`).
    pub offsets: Option<(u64, u64)>,
    /// That symbol's real extent in bytes (a trampoline's `im->size`).
    pub extent: Option<u32>,
    /// Samples filed under it.
    pub samples: u64,
    /// Samples inside the program's image in all.
    pub inside: u64,
}

/// See [`Detail::KsymbolOverlap`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KsymbolOverlap {
    /// What the registered symbol is (`trampoline`, `program`,
    /// `dispatcher`, `ool`, `other`: `check::ranges::symbol_kind`).
    pub registered: String,
    /// The register's len.
    pub registered_len: u32,
    /// What the live symbol it overlaps is.
    pub live: String,
    /// The live symbol's len.
    pub live_len: u32,
}

/// See [`Detail::KsymbolExtent`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KsymbolExtent {
    /// What the symbol is (`trampoline`).
    pub kind: String,
    /// The record's len.
    pub len: u32,
    /// The code's real extent in bytes (a trampoline's `im->size`).
    pub extent: u32,
}

/// See [`Detail::FaultRecovery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecovery {
    /// The sweep's target kind as the plan spells it (`attach`,
    /// `xdp-attach`, `kprobe-slot`).
    pub target: String,
    /// The errno's name the clean attempt failed with (`EBUSY`).
    pub errno: String,
    /// What was swept, as the agent named it (`attach fentry
    /// (BPF_RAW_TRACEPOINT_OPEN)`).
    pub swept: String,
    /// Attempts, the clean one last.
    pub attempts: u32,
    /// The injected failures before it whose syscall failed.
    pub failed: u32,
}

/// See [`Detail::KernelReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelReport {
    /// The rule: `kasan`, `ubsan`, `lockdep`, `kmemleak`.
    pub check: String,
    /// The report's header without addresses or offsets (`BUG: KASAN:
    /// slab-use-after-free in perf_event_ksymbol`, `unreferenced object
    /// (size 64)`).
    pub title: String,
    /// The first functions of its stack outside the reporting and
    /// allocating machinery (for kmemleak, the allocation's backtrace).
    pub frames: Vec<String>,
}

/// See [`Detail::OversizedRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OversizedRecord {
    /// Who read it: `L<n>` (kloop's listener n) or `perf`.
    pub reader: String,
    /// `KSYMBOL`, `BPF_EVENT`, … (perf's name of the record type).
    pub record_type: String,
    /// `header.size`.
    pub size: u32,
    /// The reader's `sample_id` trailer length.
    pub trailer_len: u32,
    /// Bytes after the trailer.
    pub excess: u32,
    /// How the other copies of the same kernel write account for the
    /// excess; `None` until [`crate::emissions::annotate`] looked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation: Option<Accumulation>,
}

impl OversizedRecord {
    /// The fields of `o` as `reader` (`L<n>`, `perf`) read it; its
    /// accumulation is for [`crate::emissions::annotate`] to fill in.
    pub fn of(reader: impl Into<String>, o: &kloop_records::Oversized) -> OversizedRecord {
        OversizedRecord {
            reader: reader.into(),
            record_type: kloop_records::record_type_label(o.record_type),
            size: u32::from(o.size),
            trailer_len: o.trailer_len,
            excess: o.excess,
            accumulation: None,
        }
    }
}

/// One kernel write's copies (the same record the kernel wrote to every
/// matching event, `perf_iterate_sb()`), as they bear on one oversized copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accumulation {
    /// The copies with less excess (written before it, if the excess
    /// accumulates), as `(reader, trailer length)`, in that order.
    pub before: Vec<(String, u32)>,
    /// Trailer lengths of events that asked for this record on its CPU but
    /// have no copy to show (no ring, a ring nobody reads).
    pub unseen: Vec<u32>,
    /// Every copy's excess is the sum of the trailers of the copies before
    /// it, plus trailers of `unseen` events, each used once per write and
    /// never fewer than before: what `perf_event_header__init_id()`
    /// growing one shared header produces, and nothing else does.
    pub explained: bool,
}

/// See [`Detail::InterpretedSymbol`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterpretedSymbol {
    /// `register` or `unregister`.
    pub event: String,
    /// The record's `addr`.
    pub addr: u64,
    /// The record's `len`.
    pub len: u32,
    /// The record's `name`.
    pub name: String,
    /// `addr` is the kernel's own text (`__bpf_prog_run32`), not code of
    /// its own: on x86-64 it lies in the kernel image mapping
    /// ([`KERNEL_IMAGE`]), below the module area where JITed code lives;
    /// on arm64 (no fixed mapping) /proc/kallsyms lists a vmlinux text
    /// symbol there.
    pub kernel_text: bool,
    /// The `/proc/kallsyms` symbol the agent read at `addr`, when it read
    /// one that is no module's (most readings skip the core kernel's lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_symbol: Option<String>,
}

/// The x86-64 kernel image mapping, `__START_KERNEL_map` to
/// `__START_KERNEL_map + KERNEL_IMAGE_SIZE` (1 GiB with
/// CONFIG_RANDOMIZE_BASE; arch/x86/include/asm/page_64_types.h):
/// vmlinux's text; modules, BPF JIT images and trampolines come from the
/// module area above it (`MODULES_VADDR`).
pub const KERNEL_IMAGE: std::ops::Range<u64> = 0xffff_ffff_8000_0000..0xffff_ffff_c000_0000;

/// See [`Detail::SynthesisedKsymbol`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynthesisedKsymbol {
    /// The fields perf's record differs in (`addr`, `len`, `type`,
    /// `flags`, `name`).
    pub fields: Vec<String>,
    /// perf's name.
    pub perf_name: String,
    /// The kernel's name (its `/proc/kallsyms` line).
    pub kernel_name: String,
    /// perf's name is `bpf_prog_<prog_tags[0]>_<rest of the kernel's
    /// name>`: the first function's tag where the kernel used the
    /// program's (perf's synthesize_bpf_prog_name()).
    pub first_function_tag: bool,
}
