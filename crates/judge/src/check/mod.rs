//! Invariants over one run (ABI.md, "Invariants kloop checks in every run",
//! 1–5), each a named rule whose message quotes the offending records.
//!
//! # Rules
//!
//! | rule | what it checks |
//! |------|----------------|
//! | `listeners` | listener bookkeeping: unique indexes, no stream without a listener, every CPU-wide set covers every online CPU (or every CPU of the subset its spec asked for), some set (CPU-wide or task-bound) that asked for a record kind exists when programs were loaded |
//! | `parse` | every stream parses exactly ([`kloop_records::parse_stream`]); records before the first error are still checked |
//! | `record-type` | only types the kernel may send such a listener: KSYMBOL (if `ksymbol`), BPF_EVENT (if `bpf_event`), LOST, and the unparsed types its other side-band bits ask for (`side_band`: FORK/EXIT, COMM, MMAP, NAMESPACES, CGROUP, TEXT_POKE); defined ksym/bpf-event types; no undefined flag bits; a KSYMBOL's `addr` in the kernel half of the address space (every caller passes code in kernel memory); `misc` 0 |
//! | `sample-id` | trailer contents: `cpu` is the listener's CPU, `res` is 0, `id` == `identifier`, one id per listener |
//! | `facts` | the `bpf_prog_info` facts are usable: as many lens as ksyms, non-zero distinct addresses, unique ids |
//! | `load-symbols` | per loaded program: a KSYMBOL register for each JITed function with addr/len of `jited_ksyms`/`jited_func_lens`, type BPF, a `bpf_prog_<tag>` name equal to kallsyms, followed by nothing or `_` and a BTF function or program name (never nothing for a subprogram, nor for the main function of a named program: `bpf_prog_ksym_set_name`, `jit_subprogs`); no symbol registered twice while live; none at all for an interpreted program (`jited_func_lens` all 0) |
//! | `load-matches-info` | exactly one PROG_LOAD per program, id == `bpf_prog_info.id`, tag == `bpf_prog_info.tag` |
//! | `unload-symbols` | each function of a loaded program unregistered; every unregister has the addr/len/name/type of its register; no double unregister; none for an interpreted program |
//! | `unload-matches-load` | every PROG_LOAD has one later PROG_UNLOAD with the same id and tag; no PROG_UNLOAD of a program never loaded (unless it predates the run); no double load |
//! | `unregister-without-register` | no unregister of a symbol neither registered in the run nor in `initial_kallsyms` |
//! | `lost` | LOST records total zero (the total is in [`Analysis::lost`]); in a run that provokes loss (a `storm` with `drain_every = 0`, or `pause-output` that pauses the rings) instead, per listener set: records received + records lost = records the run caused (per program 2 per function + 2), exactly ([`Analysis::loss`]) |
//! | `time-order` | sample times non-decreasing within each listener's stream |
//! | `causal-order` | per program: registers before PROG_LOAD, unregisters after PROG_LOAD and before PROG_UNLOAD |
//! | `listeners-agree` | every listener set, and every task-bound listener, carries exactly the KSYMBOL / BPF_EVENT records the others saw, restricted to what it asked for (a task-bound listener: to the records its task caused; two sets on CPU subsets: to the CPUs both listen on), between listeners open for the same programs (no step that makes records ran between their opens or their closes) |
//! | `programs-accounted` | per program of a `storm` / `concurrent` batch the set could see (its step ran while the set was open; on a CPU subset, its loader pinned to one of those CPUs) (ids only, no facts): one PROG_LOAD with one KSYMBOL register per function right before it from the same task (in its ring for a pinned loader; in the set's time-merged stream for an unpinned one, which may migrate between records; other tasks' records, such as an unload by the task that dropped a program's last reference, may come in between), each unregistered after it, then one PROG_UNLOAD with its tag; no PROG_LOAD of a program no step reported. A set that asked for one kind: BPF_EVENT alone, every batch id's PROG_LOAD and PROG_UNLOAD; KSYMBOL alone, as many BPF program registers as the batches and the `load` steps' programs loaded functions, the loader threads' (tid != pid) each later unregistered. A task listener without inherit: no `concurrent` loader's PROG_LOAD |
//! | `load-cpu` | a `concurrent` loader's records (registers and PROG_LOAD) are in the ring of the CPU it was pinned to, with that `cpu` in their trailer; a set on a CPU subset holds no PROG_LOAD of a loader pinned elsewhere, and a KSYMBOL-only set in each CPU's ring exactly the registers of the loader threads pinned there |
//! | `inventory` | programs loaded before recording (`preexisting`) are in the inventory; each inventoried program unloaded in the stream unregisters exactly its inventoried functions (addr, len, kallsyms name) before a PROG_UNLOAD with its tag |
//! | `lookups` | a side-band reader looked up at least every PROG_LOAD of its storm, and got nothing but success or ENOENT |
//! | `announced` | every generated symbol in `/proc/kallsyms` at the end of the run (read before the last drain) that was not there before the listeners opened has a KSYMBOL register in the first CPU-wide set ([`announced`]) |
//! | `withdrawn` | the other half of `announced`: every generated symbol there when the set opened or registered in its stream, and gone from `/proc/kallsyms` at the end, has a KSYMBOL unregister in the set (`bpf_trampoline_*` / `bpf_dispatcher_*` aside: `bpf_image_ksym_del` removes before it announces) ([`announced`]) |
//! | `trampoline-pokes` | in a CPU-wide set that asked for `ksymbol` and `text_poke`: an ftrace trampoline's KSYMBOL register is followed by a TEXT_POKE of its whole text at its address (old_len 0, new_len its length), and its unregister preceded by one (old_len its length, new_len 0), as `ftrace_update_trampoline()` / `ftrace_trampoline_free()` promise ([`pokes`]) |
//! | `code-lifetime` | in a CPU-wide set that asked for `ksymbol` and `text_poke`: every TEXT_POKE inside an out-of-line range announced in the stream (`ftrace_trampoline`, `kprobe_insn_page`, `kprobe_optinsn_page`) falls while that range is registered — never before its register, never after its unregister until registered again, as `ftrace_update_trampoline()` / `ftrace_trampoline_free()` and `__get_insn_slot()` / `collect_one_slot()` promise; BPF code aside (tail-call pokes may race a program's life) ([`pokes`]) |
//! | `wakeups` | a polled listener (`poll`: a 1-byte wakeup watermark, CLOCK_MONOTONIC times) has its waiter's `poll(2)` return readable within 1 s after each record, as `perf_output_put_handle()` → `perf_output_wakeup()` promises ([`wakeups`]) |
//! | `symbol-state` | with a `watch-ksymbols` step: every KSYMBOL of the first set matches an observed `perf_event_ksymbol` call, and each kind's symbol was resolvable (or gone) at emission as the source promises ([`emission`]) |
//!
//! # Listener sets and merging
//!
//! CPU-bound listeners are grouped into *sets*: listeners opened with the
//! same attributes (sample_type, sample_id_all, ksymbol, bpf_event, ring
//! size), at most one per CPU; each set is one CPU-wide recorder. Every set
//! is checked on its own (rules `load-*`, `unload-*`,
//! `unregister-without-register`, `causal-order`); [`Analysis::merged`] is
//! the set holding the lowest listener index (the first spec opened).
//! Task-bound listeners form *task sets*: the inherited listeners of one
//! spec (one per CPU, following the agent's process), or one listener bound
//! to the agent's task on any CPU. `perf_iterate_sb()` (kernel/events/core.c)
//! offers every side-band record to the current task's contexts after the
//! CPU's list, and the agent's task is current for its own loads and for
//! the last `bpf_prog_put()` of a program it closes, so a task set gets the
//! set rules for the `load` steps' programs (and, inherited, for the
//! `concurrent` loaders, threads created after it opened); a task listener
//! without inherit is held to no batch.
//!
//! A set's [`SetScope`] bounds what it is held to: the record kinds it asked
//! for (a set that asked for one kind is held to every record of that kind),
//! its CPU subset (`cpus`: only loaders pinned to those CPUs; a record goes
//! only to the listeners of the CPU it is emitted on), and its window (the
//! steps it was open for, from the agent's step order: a program loaded
//! before a set opened shows only its unload there, one unloaded after a set
//! closed only its load).
//!
//! Symbols and programs that predate the recording are explained by the
//! initial kallsyms snapshot and by the `inventory` (what `perf record`
//! synthesises at start); programs the agent loaded before the first
//! listener opened get no load rules, only the `inventory` rule.
//!
//! A set whose stream does not parse to the end is reported by `parse`; the
//! set rules are not run on what is left of it (a cut stream would only
//! repeat that finding as missing records), and `listeners-agree` leaves it
//! out. A set that lost records in a run that provokes loss gets the exact
//! accounting of `lost` instead of the pairing rules, which cannot hold for
//! records that never arrived.
//!
//! Order between two records is taken from the stream when both come from
//! one listener, from sample times otherwise (equal times are not a
//! violation); without `PERF_SAMPLE_TIME`, cross-CPU order is unknown and not
//! checked.
//!
//! # Record types a ksymbol/bpf_event listener may receive
//!
//! From `kernel/events/core.c`: KSYMBOL goes to events with `attr.ksymbol`
//! (`perf_event_ksymbol_match`), BPF_EVENT to events with `attr.bpf_event`
//! (`perf_event_bpf_match`), and `perf_output_begin` writes LOST into any
//! ring that dropped records. Every other side-band type needs its own attr
//! bit (mmap, comm, task, namespaces, cgroup, context_switch, text_poke);
//! SAMPLE/THROTTLE/UNTHROTTLE need a counting event that overflows, which
//! `PERF_COUNT_SW_DUMMY` never does; AUX/ITRACE_START/LOST_SAMPLES/
//! AUX_OUTPUT_HW_ID need an AUX area; READ needs `inherit_stat`. So any
//! other type is a `record-type` violation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kloop_protocol::{KallsymsEntry, ListenerInfo, ProgFacts};

use crate::evidence::{Batch, RunEvidence, Window};
use kloop_records::{
    self, merge_by_time, parse_reading_on, Oversized, Record, RecordBody, RecordContent,
    BPF_EVENT_PROG_LOAD, BPF_EVENT_PROG_UNLOAD, KSYMBOL_FLAGS_UNREGISTER, KSYM_TYPE_BPF,
    KSYM_TYPE_OOL,
};

mod agreement;
mod announced;
pub mod areas;
mod batches;
pub mod detail;
mod emission;
mod inventory;
mod listener;
mod model;
mod pokes;
mod programs;
pub mod ranges;
mod tasks;
mod wakeups;

use agreement::*;
use announced::*;
use batches::*;
pub use detail::Detail;
use emission::*;
use inventory::*;
use listener::*;
pub use model::*;
pub use programs::*;

/// Rule names.
pub mod rule {
    /// Every listener a set asked for was opened, and some set recorded the programs.
    pub const LISTENERS: &str = "listeners";
    /// Every stream parses exactly, record by record (crates/records).
    pub const PARSE: &str = "parse";
    /// A listener receives only the record types it asked for, with the misc bits the kernel writes.
    pub const RECORD_TYPE: &str = "record-type";
    /// The sample_id trailer agrees with the listener (its CPU, its id).
    pub const SAMPLE_ID: &str = "sample-id";
    /// The agent's bpf_prog_info facts are whole (addresses shown, none twice).
    pub const FACTS: &str = "facts";
    /// A load registers one KSYMBOL per JITed function, at its address, length and name.
    pub const LOAD_SYMBOLS: &str = "load-symbols";
    /// A PROG_LOAD carries the id and tag bpf_prog_info gives.
    pub const LOAD_MATCHES_INFO: &str = "load-matches-info";
    /// An unload unregisters every symbol its load registered.
    pub const UNLOAD_SYMBOLS: &str = "unload-symbols";
    /// Every PROG_UNLOAD follows its PROG_LOAD, and every loaded program is unloaded.
    pub const UNLOAD_MATCHES_LOAD: &str = "unload-matches-load";
    /// No symbol is unregistered that was not registered (or there before).
    pub const UNREGISTER_WITHOUT_REGISTER: &str = "unregister-without-register";
    /// No record is lost, except in runs that provoke it, where received + lost = caused.
    pub const LOST: &str = "lost";
    /// Time never goes backwards within one listener's stream.
    pub const TIME_ORDER: &str = "time-order";
    /// A program's registers come before its PROG_LOAD, its unregisters with its PROG_UNLOAD.
    pub const CAUSAL_ORDER: &str = "causal-order";
    /// Sets that saw the same events hold the same records.
    pub const LISTENERS_AGREE: &str = "listeners-agree";
    /// Every program a batch step loaded has its records.
    pub const PROGRAMS_ACCOUNTED: &str = "programs-accounted";
    /// A pinned loader's records are on its CPU's listener.
    pub const LOAD_CPU: &str = "load-cpu";
    /// Programs loaded before recording are reconciled with the inventory.
    pub const INVENTORY: &str = "inventory";
    /// A storm's side-band lookups of PROG_LOAD ids come out as the kernel allows.
    pub const LOOKUPS: &str = "lookups";
    /// Each KSYMBOL matches its perf_event_ksymbol call and the symbol state at emission.
    pub const SYMBOL_STATE: &str = "symbol-state";
    /// A generated symbol that appeared in /proc/kallsyms had its KSYMBOL register.
    pub const ANNOUNCED: &str = "announced";
    /// An ftrace trampoline's KSYMBOLs are paired with TEXT_POKEs of its whole text.
    pub const TRAMPOLINE_POKES: &str = "trampoline-pokes";
    /// A generated symbol that left /proc/kallsyms had its KSYMBOL unregister.
    pub const WITHDRAWN: &str = "withdrawn";
    /// FORK / EXIT reach exactly the sets perf_iterate_sb routes them to, once.
    pub const TASK_RECORDS: &str = "task-records";
    /// A listener opened disabled and never enabled receives nothing.
    pub const DISABLED_SILENT: &str = "disabled-silent";
    /// LOST records never report more than the event's lost_samples.
    pub const LOST_SAMPLES: &str = "lost-samples";
    /// A kprobe's out-of-line copy is poked at a slot start of its kprobe_insn_page.
    pub const KPROBE_SLOTS: &str = "kprobe-slots";
    /// No BPF_EVENT of a program loaded and unloaded while every ring was paused.
    pub const PAUSED_SILENT: &str = "paused-silent";
    /// A TEXT_POKE into out-of-line code falls while that code is registered.
    pub const CODE_LIFETIME: &str = "code-lifetime";
    /// A polled listener's waiter wakes after every record, within a deadline.
    pub const WAKEUPS: &str = "wakeups";
    /// An overwrite (backward, read-only) ring never loses a record it counts.
    pub const OVERWRITE_NEVER_FULL: &str = "overwrite-never-full";
    /// A program a `run-program` step ran (a stand-alone reproducer, a
    /// scenario's own test program) exited 0 (or 77: it could not run).
    pub const PROGRAM_EXIT: &str = "program-exit";

    /// Live KSYMBOL ranges of a set are pairwise disjoint at every moment.
    pub const KSYMBOL_OVERLAP: &str = "ksymbol-overlap";
    /// An unregister names a live range with the length it was registered with.
    pub const KSYMBOL_UNREGISTER_RANGE: &str = "ksymbol-unregister-range";
    /// A trampoline's KSYMBOL range is its image's (im->size).
    pub const KSYMBOL_EXTENT: &str = "ksymbol-extent";
    /// Executable memory present after the plan that was not before it
    /// holds a symbol /proc/kallsyms lists (crate::exec_areas).
    pub const EXEC_AREA_KEPT: &str = "exec-area-kept";
    /// Every symbol a set's records (or /proc/kallsyms after the plan) show
    /// live lies in executable memory the kernel holds (check::areas,
    /// crate::exec_areas).
    pub const EXEC_AREA_MISSING: &str = "exec-area-missing";

    /// Every rule name, in the order reports list them.
    pub const ALL: &[&str] = &[
        LISTENERS,
        PARSE,
        RECORD_TYPE,
        SAMPLE_ID,
        FACTS,
        LOAD_SYMBOLS,
        LOAD_MATCHES_INFO,
        UNLOAD_SYMBOLS,
        UNLOAD_MATCHES_LOAD,
        UNREGISTER_WITHOUT_REGISTER,
        LOST,
        TIME_ORDER,
        CAUSAL_ORDER,
        LISTENERS_AGREE,
        PROGRAMS_ACCOUNTED,
        LOAD_CPU,
        INVENTORY,
        LOOKUPS,
        SYMBOL_STATE,
        ANNOUNCED,
        TRAMPOLINE_POKES,
        WITHDRAWN,
        TASK_RECORDS,
        DISABLED_SILENT,
        LOST_SAMPLES,
        KPROBE_SLOTS,
        PAUSED_SILENT,
        CODE_LIFETIME,
        WAKEUPS,
        PROGRAM_EXIT,
        OVERWRITE_NEVER_FULL,
        KSYMBOL_OVERLAP,
        KSYMBOL_UNREGISTER_RANGE,
        KSYMBOL_EXTENT,
        EXEC_AREA_KEPT,
        EXEC_AREA_MISSING,
    ];
}

/// At most this many violations of one kind per listener are spelled out.
const MAX_PER_KIND: usize = 5;

/// One broken invariant: the rule, the message a reader sees, and what the
/// judge knew when it wrote the message (where in which stream, the records
/// it quotes), so reports can carry that as data rather than only as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule's name (one of [`rule::ALL`] or an expectation's).
    pub rule: &'static str,
    /// What a reader sees.
    pub message: String,
    /// The listener the violation is about: the first quoted record's, or
    /// the stream's for a finding about a whole stream (a parse error,
    /// LOST). `None` for findings about no one stream (facts, counts).
    pub listener: Option<u32>,
    /// Byte offset into that listener's stream: the first quoted record's
    /// header, or where a parse error stopped reading.
    pub offset: Option<u64>,
    /// The records the message quotes, in the order it quotes them.
    pub records: Vec<QuotedRecord>,
    /// The fault's typed fields, for the rules that report a fault class
    /// a ledger entry can name ([`Detail`]); `None` for the others.
    pub detail: Option<Detail>,
}

impl Violation {
    /// A violation that quotes no record and is about no one stream.
    pub fn new(rule: &'static str, message: impl Into<String>) -> Violation {
        Violation {
            rule,
            message: message.into(),
            listener: None,
            offset: None,
            records: Vec::new(),
            detail: None,
        }
    }

    /// Gives the violation its typed fields.
    pub fn with(mut self, detail: Detail) -> Violation {
        self.detail = Some(detail);
        self
    }

    /// Adds the records the message quotes; the first one places the
    /// violation unless [`Violation::at`] already did.
    pub fn quoting<'r>(mut self, recs: impl IntoIterator<Item = &'r Record>) -> Violation {
        self.records.extend(recs.into_iter().map(QuotedRecord::of));
        if self.listener.is_none() {
            if let Some(first) = self.records.first() {
                self.listener = Some(first.listener);
                self.offset = Some(first.offset);
            }
        }
        self
    }

    /// Places the violation in a stream without quoting a record.
    pub fn at(mut self, listener: u32, offset: Option<u64>) -> Violation {
        self.listener = Some(listener);
        self.offset = offset;
        self
    }
}

/// A rule this run could not judge: the evidence it needs did not arrive.
/// Never a pass: the trial says which rule, why, and what kind of gap it
/// is ([`Gap`]), instead of `ok` beside a note.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unchecked {
    /// The rule (or rules, `jit-charge, jit-chunks`) left unjudged.
    pub rule: String,
    /// Why, naming the missing option, file or reading, and what to do.
    pub reason: String,
    /// What kind of gap it is.
    pub gap: Gap,
}

/// Why evidence is missing, which decides the trial's verdict when nothing
/// else failed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Gap {
    /// This kernel lacks what the rule reads (a config option, a feature
    /// of a later release): `SKIPPED`, naming it.
    NotInKernel,
    /// The evidence should have arrived and did not (a read failed, a log
    /// overran, a check the kernel was built with is off): `INFRA`.
    Lost,
}

impl Unchecked {
    /// A rule left unjudged.
    pub fn new(rule: impl Into<String>, gap: Gap, reason: impl Into<String>) -> Unchecked {
        Unchecked {
            rule: rule.into(),
            reason: reason.into(),
            gap,
        }
    }

    /// `rule <rule> not checked: <reason>`, as a verdict's line says it.
    pub fn line(&self) -> String {
        format!("rule {} not checked: {}", self.rule, self.reason)
    }
}

/// A record as a violation quotes it: its place, its fields, and the text
/// the message shows. Fields a record's type or its listener's
/// `sample_type` does not have are `None`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuotedRecord {
    /// The listener whose stream holds it.
    pub listener: u32,
    /// Offset of the record's header in the listener's stream.
    pub offset: u64,
    /// `KSYMBOL`, `BPF_EVENT`, `LOST`, or the perf name of another type
    /// (`type <n>` when it has none).
    #[serde(rename = "type")]
    pub type_name: String,
    /// The trailer's time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<u64>,
    /// The trailer's CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// The trailer's thread id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// KSYMBOL: `register` / `unregister`; BPF_EVENT: `PROG_LOAD` /
    /// `PROG_UNLOAD` (or the raw type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// KSYMBOL fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    /// KSYMBOL: the symbol's length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub len: Option<u32>,
    /// KSYMBOL: `BPF`, `OOL` (or the raw type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ksym_type: Option<String>,
    /// KSYMBOL: the symbol's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// BPF_EVENT fields: the program id and its tag in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// BPF_EVENT: the program's tag in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// LOST: how many records the ring dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    /// The record as messages quote it (`L0@128 KSYMBOL register BPF …`).
    pub text: String,
}

impl QuotedRecord {
    /// How a violation quotes `r`.
    pub fn of(r: &Record) -> QuotedRecord {
        let mut q = QuotedRecord {
            listener: r.listener,
            offset: r.offset,
            type_name: kloop_records::record_type_label(r.header.type_),
            time: r.sample.time,
            cpu: r.sample.cpu,
            tid: r.sample.tid,
            event: None,
            addr: None,
            len: None,
            ksym_type: None,
            name: None,
            id: None,
            tag: None,
            lost: None,
            text: r.to_string(),
        };
        match &r.body {
            RecordBody::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } => {
                q.event = Some(
                    if flags & KSYMBOL_FLAGS_UNREGISTER != 0 {
                        "unregister"
                    } else {
                        "register"
                    }
                    .to_string(),
                );
                q.addr = Some(*addr);
                q.len = Some(*len);
                q.ksym_type = Some(kloop_records::ksym_type_name(*ksym_type));
                q.name = Some(name.clone());
            }
            RecordBody::BpfEvent {
                event_type,
                id,
                tag,
                ..
            } => {
                q.event = Some(kloop_records::bpf_event_type_name(*event_type));
                q.id = Some(*id);
                q.tag = Some(hex::encode(tag));
            }
            RecordBody::Lost { lost, .. } => q.lost = Some(*lost),
            RecordBody::TextPoke { addr, .. } => q.addr = Some(*addr),
            RecordBody::Unknown { .. } | RecordBody::Task { .. } => {}
        }
        q
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.rule, self.message)
    }
}

/// The result of checking one run.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    /// Parsed records of every listener (up to its first parse error).
    pub records_per_listener: BTreeMap<u32, Vec<Record>>,
    /// CPU-wide listener sets (listener indexes), lowest index first.
    pub sets: Vec<Vec<u32>>,
    /// `sets[0]` merged by time; without a CPU-wide set, `task_sets[0]`
    /// (empty if there is neither).
    pub merged: Vec<Record>,
    /// The listeners `merged` comes from.
    pub merged_from: Vec<u32>,
    /// Task-bound listener sets (listener indexes): the inherited
    /// listeners of one spec (one per CPU), or one listener bound to the
    /// agent's task on any CPU.
    pub task_sets: Vec<Vec<u32>>,
    /// Sum of `lost` over every LOST record of every listener.
    pub lost: u64,
    /// Indexes into `merged` of the records accounted to `storm` /
    /// `concurrent` batch programs (the normaliser summarises those).
    pub accounted: BTreeSet<usize>,
    /// The provoked-loss accounting of every listener set (empty unless the
    /// run provoked loss).
    pub loss: Vec<LossAccount>,
    /// One-line facts for the trial report (lookup rates, loss accounting).
    pub notes: Vec<String>,
    /// Every broken rule, in the order the checks found them.
    pub violations: Vec<Violation>,
}

/// Records of one listener set in a run that provokes loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossAccount {
    /// Index into [`Analysis::sets`].
    pub set: usize,
    /// Records the run's programs caused that this set asked for.
    pub caused: u64,
    /// KSYMBOL and BPF_EVENT records received.
    pub received: u64,
    /// Sum of the LOST records' counts.
    pub lost: u64,
}

impl Analysis {
    /// Violations of one rule.
    pub fn of_rule<'a>(&'a self, rule: &'a str) -> impl Iterator<Item = &'a Violation> + 'a {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}

/// The `parse` violation of a record read past ([`Oversized`]): the
/// stream's other records are judged in full, and a ledger entry can excuse
/// this one only by its [`Detail::OversizedRecord`] fields.
fn oversized_violation(l: &ListenerInfo, o: &Oversized, recs: &[Record]) -> Violation {
    let detail = detail::OversizedRecord::of(format!("L{}", o.listener), o);
    let rec = recs.iter().find(|r| r.offset == o.offset);
    Violation::new(
        rule::PARSE,
        format!(
            "listener {} ({}), stream offset {}: {} header.size {} is {} bytes more than its header \
             and body ({} bytes) and sample_id trailer ({} bytes) take, and those bytes are zero; read on \
             at header.size, where the kernel's next record starts",
            o.listener,
            if l.cpu < 0 { "task-bound".to_string() } else { format!("cpu {}", l.cpu) },
            o.offset,
            detail.record_type,
            o.size,
            o.excess,
            o.body_end,
            o.trailer_len,
        ),
    )
    .at(o.listener, Some(o.offset))
    .quoting(rec)
    .with(Detail::OversizedRecord(detail))
}

/// A message and the records it quotes, before it gets its rule
/// ([`push_capped`]).
pub(crate) struct Found<'r> {
    message: String,
    records: Vec<&'r Record>,
}

impl From<String> for Found<'_> {
    fn from(message: String) -> Self {
        Found {
            message,
            records: Vec::new(),
        }
    }
}

/// `<label>: ` to start a set's messages with, or nothing for an unnamed
/// (the only) set.
pub(super) fn label_prefix(label: &str) -> String {
    if label.is_empty() {
        String::new()
    } else {
        format!("{label}: ")
    }
}

/// `message`, which quotes `records`.
pub(crate) fn quoting<'r>(
    message: String,
    records: impl IntoIterator<Item = &'r Record>,
) -> Found<'r> {
    Found {
        message,
        records: records.into_iter().collect(),
    }
}

fn push_capped<'r>(
    out: &mut Vec<Violation>,
    rule: &'static str,
    what: &str,
    msgs: Vec<impl Into<Found<'r>>>,
) {
    let n = msgs.len();
    for m in msgs.into_iter().take(MAX_PER_KIND) {
        let f: Found<'r> = m.into();
        out.push(Violation::new(rule, f.message).quoting(f.records));
    }
    if n > MAX_PER_KIND {
        out.push(Violation::new(
            rule,
            format!("... and {} more {what}", n - MAX_PER_KIND),
        ));
    }
}

/// `bpf_prog_<hex tag>`.
pub fn tag_prefix(tag: &[u8; 8]) -> String {
    format!("bpf_prog_{}", hex::encode(tag))
}

/// Whether `name` starts with `bpf_prog_` and 16 lowercase hex digits.
pub fn has_some_tag_prefix(name: &str) -> bool {
    name.strip_prefix("bpf_prog_")
        .and_then(|rest| rest.get(..16))
        .is_some_and(|h| {
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Whether a symbol name fits one of a program's functions. Functions are
/// named `bpf_prog_<tag>…`: a subprogram after its own tag
/// (`bpf_prog_info.prog_tags[i]`, `func[i]->tag`), the main function after
/// either `prog_tags[0]` (5.10) or the whole program's `bpf_prog_info.tag`
/// (6.1 on) — both seen on real kernels. Without `prog_tags` (older agents) a
/// multi-function program is held only to the `bpf_prog_<16 hex digits>` shape.
pub(crate) fn facts_name_ok(facts: &ProgFacts, name: &str) -> bool {
    if facts.func_tags.is_empty() && facts.jited_ksyms.len() > 1 {
        return has_some_tag_prefix(name);
    }
    std::iter::once(&facts.tag)
        .chain(&facts.func_tags)
        .any(|t| name.starts_with(&tag_prefix(t)))
}

/// The name prefixes function `fi` may carry, when the facts say.
fn func_prefixes(facts: &ProgFacts, fi: usize) -> Vec<String> {
    match (fi, facts.func_tags.get(fi)) {
        (0, Some(t)) => vec![tag_prefix(&facts.tag), tag_prefix(t)],
        (_, Some(t)) => vec![tag_prefix(t)],
        (0, None) if facts.jited_ksyms.len() == 1 => vec![tag_prefix(&facts.tag)],
        _ => vec![],
    }
}

/// What one listener set can see, and so which records it is held to.
#[derive(Debug, Clone, Default)]
pub(crate) struct SetScope {
    pub has_ksym: bool,
    pub has_bpf: bool,
    /// The CPUs it listens on when its spec asked for a subset (`None`:
    /// every online CPU). `perf_iterate_sb_cpu()` writes a record only to
    /// the side-band listeners of the CPU it is emitted on.
    pub cpus: Option<BTreeSet<u32>>,
    /// The plan steps it was open for.
    pub window: Window,
    /// Bound to the agent's task rather than to CPUs.
    pub task: TaskScope,
}

/// Whose records a task-bound set receives (`perf_iterate_sb()` iterates
/// the current task's contexts after the CPU's side-band list).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum TaskScope {
    /// A CPU-wide set: every task's.
    #[default]
    CpuWide,
    /// One listener on the agent's task (`pid = 0, cpu = -1`, no
    /// inherit): only what that task itself does.
    Task,
    /// Inherited listeners (one per CPU): the agent's task and the threads
    /// it created after they opened (their child events' output goes to
    /// the parent's ring).
    Process,
}

/// The set scope of listeners `set`, or `None` for an empty set.
fn scope_of(
    ev: &RunEvidence,
    listeners: &BTreeMap<u32, &ListenerInfo>,
    set: &[u32],
) -> Option<SetScope> {
    let first = set.first().and_then(|i| listeners.get(i))?;
    Some(SetScope {
        has_ksym: first.ksymbol,
        has_bpf: first.bpf_event,
        cpus: first
            .cpus
            .as_ref()
            .map(|c| c.iter().copied().collect::<BTreeSet<u32>>())
            .filter(|c| {
                let online: BTreeSet<u32> = ev.online_cpus.iter().copied().collect();
                online.is_empty() || !online.is_subset(c)
            }),
        window: ev.window(first.index),
        task: match (first.pid, first.inherit) {
            (None, _) => TaskScope::CpuWide,
            (Some(_), true) => TaskScope::Process,
            (Some(_), false) => TaskScope::Task,
        },
    })
}

/// Groups task-bound listeners into sets: inherited ones like CPU-wide
/// listeners (same attributes, one per CPU), each listener bound to no CPU
/// alone.
fn task_listener_sets(ev: &RunEvidence, listeners: &BTreeMap<u32, &ListenerInfo>) -> Vec<Vec<u32>> {
    let mut out = group_sets(
        ev,
        listeners
            .values()
            .filter(|l| l.cpu >= 0 && l.pid.is_some() && !l.disabled)
            .copied(),
    );
    out.extend(
        listeners
            .values()
            .filter(|l| l.cpu < 0 && !l.disabled)
            .map(|l| vec![l.index]),
    );
    out
}

/// Groups CPU-bound listeners into CPU-wide sets; see the module docs.
fn listener_sets(ev: &RunEvidence, listeners: &BTreeMap<u32, &ListenerInfo>) -> Vec<Vec<u32>> {
    // A task-bound listener per CPU (an inherited one) is not CPU-wide.
    group_sets(
        ev,
        listeners
            .values()
            .filter(|l| l.cpu >= 0 && l.pid.is_none() && !l.disabled)
            .copied(),
    )
}

/// Listeners of one spec opened by one step, at most one per CPU.
fn group_sets<'l>(ev: &RunEvidence, ls: impl Iterator<Item = &'l ListenerInfo>) -> Vec<Vec<u32>> {
    type Key = (
        u64,
        bool,
        bool,
        bool,
        u64,
        Option<u32>,
        Option<Vec<u32>>,
        Vec<kloop_protocol::SideBand>,
        Window,
    );
    let mut sets: Vec<(Key, Vec<u32>, BTreeSet<i32>)> = Vec::new();
    for l in ls {
        let key = (
            l.sample_type,
            l.sample_id_all,
            l.ksymbol,
            l.bpf_event,
            l.ring_bytes,
            l.pid,
            l.cpus.clone(),
            l.side_band.clone(),
            ev.window(l.index),
        );
        match sets
            .iter_mut()
            .find(|(k, _, cpus)| *k == key && !cpus.contains(&l.cpu))
        {
            Some((_, idx, cpus)) => {
                idx.push(l.index);
                cpus.insert(l.cpu);
            }
            None => sets.push((key, vec![l.index], BTreeSet::from([l.cpu]))),
        }
    }
    sets.into_iter().map(|(_, idx, _)| idx).collect()
}

/// `program-exit`: what a shipped program says is its own verdict; 77 (it
/// could not run here) is the harness's to turn into a skip.
fn check_program_exits(ev: &RunEvidence, v: &mut Vec<Violation>) {
    for p in ev
        .program_runs
        .iter()
        .filter(|p| !p.passed() && !p.skipped())
    {
        v.push(m_find(
            rule::PROGRAM_EXIT,
            format!(
                "{} {}; its output:\n{}",
                p.path,
                p.ending(),
                p.output.trim_end()
            ),
        ));
    }
}

/// The reported listeners by index (the first of a twice-reported index);
/// a second report and a stream of an unreported listener are `listeners`
/// violations.
fn index_listeners<'e>(
    ev: &'e RunEvidence,
    v: &mut Vec<Violation>,
) -> BTreeMap<u32, &'e ListenerInfo> {
    let mut listeners: BTreeMap<u32, &ListenerInfo> = BTreeMap::new();
    for l in &ev.listeners {
        match listeners.entry(l.index) {
            std::collections::btree_map::Entry::Occupied(_) => v.push(
                m_find(
                    rule::LISTENERS,
                    format!(
                        "listener index {} reported twice; the first is used",
                        l.index
                    ),
                )
                .at(l.index, None),
            ),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(l);
            }
        }
    }
    for (idx, bytes) in &ev.streams {
        if !listeners.contains_key(idx) {
            v.push(
                m_find(
                    rule::LISTENERS,
                    format!(
                        "{} stream bytes for listener {idx}, which was never reported",
                        bytes.len()
                    ),
                )
                .at(*idx, None),
            );
        }
    }
    listeners
}

/// What reading every listener's stream leaves for the set rules.
#[derive(Default)]
struct Readings {
    /// One phrase per listener with LOST records, for the `lost` messages.
    lost_parts: Vec<String>,
    /// The first LOST record of each of those listeners, quoted.
    first_losts: Vec<Record>,
    /// Records lost per listener, as its LOST records report.
    lost_by: BTreeMap<u32, u64>,
    /// Listeners whose stream could not be parsed to its end.
    cut: BTreeSet<u32>,
}

impl Readings {
    /// Parses every listener's stream into `a.records_per_listener` and
    /// checks the per-listener rules: parse, record-type, sample-id,
    /// time-order, disabled-silent, lost-samples, overwrite-never-full,
    /// and lost over the whole run.
    fn read(
        ev: &RunEvidence,
        listeners: &BTreeMap<u32, &ListenerInfo>,
        a: &mut Analysis,
        v: &mut Vec<Violation>,
    ) -> Readings {
        let paused = ev
            .steps
            .values()
            .any(|s| matches!(s, kloop_protocol::Step::PauseOutput { paused: true }));
        let mut r = Readings::default();
        for (idx, l) in listeners {
            let bytes = ev.streams.get(idx).map(Vec::as_slice).unwrap_or(&[]);
            let parsed = parse_reading_on(l, bytes);
            let recs = parsed.records;
            for o in &parsed.oversized {
                v.push(oversized_violation(l, o, &recs));
            }
            if let Some(e) = parsed.error {
                r.cut.insert(*idx);
                v.push(
                    m_find(
                        rule::PARSE,
                        format!(
                            "{e} ({} records before it are kept for the per-record rules; the set rules \
                             and listeners-agree leave this listener's set out)",
                            recs.len()
                        ),
                    )
                    .at(e.listener, Some(e.offset)),
                );
            }
            check_listener(l, &recs, v);
            // A disabled listener is in no set: it is held to silence alone.
            if l.disabled && !recs.is_empty() {
                v.push(
                    Violation::new(
                        rule::DISABLED_SILENT,
                        format!(
                            "listener {idx}, opened disabled and never enabled, received {} record(s), \
                             first {}: perf_iterate_sb_cpu() and perf_iterate_ctx() skip events below \
                             PERF_EVENT_STATE_INACTIVE",
                            recs.len(),
                            recs[0]
                        ),
                    )
                    .quoting(recs.iter().take(3)),
                );
            }
            let lost = r.losses(ev, l, &recs, paused, v);
            r.lost_by.insert(*idx, lost);
            a.lost = a.lost.saturating_add(lost);
            a.records_per_listener.insert(*idx, recs);
        }
        if !ev.provoked_loss && (a.lost > 0 || !r.lost_parts.is_empty()) {
            v.push(
                m_find(
                    rule::LOST,
                    format!(
                        "{} records lost in total; {}",
                        a.lost,
                        r.lost_parts.join("; ")
                    ),
                )
                .quoting(&r.first_losts),
            );
        }
        r
    }

    /// Listener `l`'s LOST records: noted for the `lost` messages and held
    /// to its lost_samples read (`lost-samples`) and, for an overwrite
    /// ring, to none at all (`overwrite-never-full`). Returns how many
    /// records they report lost.
    fn losses(
        &mut self,
        ev: &RunEvidence,
        l: &ListenerInfo,
        recs: &[Record],
        paused: bool,
        v: &mut Vec<Violation>,
    ) -> u64 {
        let idx = &l.index;
        let lost: u64 = recs
            .iter()
            .map(|r| match r.body {
                RecordBody::Lost { lost, .. } => lost,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        let n = recs
            .iter()
            .filter(|r| matches!(r.body, RecordBody::Lost { .. }))
            .count();
        if n > 0 {
            let first_rec = recs
                .iter()
                .find(|r| matches!(r.body, RecordBody::Lost { .. }));
            let first = first_rec.map(|r| r.to_string()).unwrap_or_default();
            self.first_losts.extend(first_rec.cloned());
            self.lost_parts.push(format!(
                "listener {idx}: {n} LOST record(s), {lost} lost (first: {first})"
            ));
        }
        // __perf_output_begin() counts every record it cannot write in
        // both rb->lost and the event's lost_samples (the paused branch
        // and the no-space one alike), and a LOST record hands on rb->lost
        // (local_xchg) when the next write succeeds. So the LOST records
        // drained before the count was read never report more than it.
        if let Some(&count) = ev.lost_samples.get(idx) {
            if lost > count {
                v.push(
                    Violation::new(
                        rule::LOST_SAMPLES,
                        format!(
                            "listener {idx}: its LOST records report {lost} lost, but the \
                             event's lost_samples (read with PERF_FORMAT_LOST after the drain) \
                             is {count}: __perf_output_begin() counts each loss in both"
                        ),
                    )
                    .at(*idx, None),
                );
            }
        }
        // An overwrite ring (mapped read-only: the backward listeners)
        // never refuses a record for want of space: __perf_output_begin()
        // checks for space only `if (!rb->overwrite)`, so it loses nothing
        // (no LOST, lost_samples 0) unless its output was paused.
        if l.backward && !paused {
            let counted = ev.lost_samples.get(idx).copied().unwrap_or(0);
            if lost > 0 || n > 0 || counted > 0 {
                v.push(
                    Violation::new(
                        rule::OVERWRITE_NEVER_FULL,
                        format!(
                            "listener {idx}, an overwrite ring (backward, mapped read-only), lost \
                             records: {n} LOST record(s) reporting {lost}, lost_samples {counted}; \
                             __perf_output_begin() checks for space only `if (!rb->overwrite)`, \
                             so an overwrite ring overwrites its oldest records instead"
                        ),
                    )
                    .at(*idx, None),
                );
            }
        }
        lost
    }
}

/// What judging one listener set (CPU-wide or task-bound) needs of the run.
struct SetJudge<'a> {
    ev: &'a RunEvidence,
    listeners: &'a BTreeMap<u32, &'a ListenerInfo>,
    readings: &'a Readings,
    online: BTreeSet<i64>,
    /// More than one CPU-wide set: messages name theirs.
    multi: bool,
}

impl SetJudge<'_> {
    /// An overwrite set in a run that provoked loss drops its oldest
    /// records by design, uncounted: it keeps only the newest.
    fn overwritten(&self, set: &[u32]) -> bool {
        self.ev.provoked_loss
            && set
                .iter()
                .filter_map(|i| self.listeners.get(i))
                .any(|l| l.backward)
    }

    /// A listener of `set` could not be parsed to its end.
    fn is_cut(&self, set: &[u32]) -> bool {
        set.iter().any(|i| self.readings.cut.contains(i))
    }

    /// The CPUs of `set`'s listeners (-1: bound to none).
    fn cpus(&self, set: &[u32]) -> BTreeSet<i64> {
        set.iter()
            .filter_map(|i| self.listeners.get(i))
            .map(|l| i64::from(l.cpu))
            .collect()
    }

    /// Checks set `k` (`sets` first, then `task_sets`) against every set
    /// rule; the first set's merged stream becomes `a.merged`.
    fn judge(
        &self,
        k: usize,
        is_task: bool,
        set: &[u32],
        a: &mut Analysis,
        v: &mut Vec<Violation>,
    ) {
        let ev = self.ev;
        let Some(scope) = scope_of(ev, self.listeners, set) else {
            return;
        };
        let label = if is_task {
            format!("task set (listeners {set:?})")
        } else if self.multi {
            format!("set#{k} (listeners {set:?})")
        } else {
            String::new()
        };
        let cpus = self.cpus(set);
        self.check_coverage(set, &scope, &cpus, v);
        let streams: Vec<Vec<Record>> = set
            .iter()
            .map(|i| a.records_per_listener.get(i).cloned().unwrap_or_default())
            .collect();
        let merged = merge_by_time(streams);
        let set_lost: u64 = set
            .iter()
            .filter_map(|i| self.readings.lost_by.get(i))
            .sum();
        // An overwrite set that wrote more than its rings hold gets no loss
        // accounting and no completeness rules, only the per-record ones
        // and overwrite-never-full.
        let overwrite_set = self.overwritten(set);
        if ev.provoked_loss && !is_task && !overwrite_set {
            let account = self.account_loss(&label, &merged, &scope, set_lost, k, v);
            a.notes.push(self.loss_note(k, &account));
            a.loss.push(account);
        }
        // Task sets in a run that provokes loss are left to the per-record
        // rules: the loss accounting is per CPU-wide set.
        // A storm with lookups lets its side-band thread drop a program's
        // last reference now and then, so its unload comes from that
        // thread, outside a listener on the agent's task alone.
        let skip_task = is_task
            && (ev.provoked_loss
                || (scope.task == TaskScope::Task
                    && ev.batches.iter().any(|b| b.lookups.is_some())));
        // A set that asked for neither kind (other side-band bits only) is
        // held by record-type alone: no KSYMBOL, no BPF_EVENT.
        let no_kind = !scope.has_ksym && !scope.has_bpf;
        if !self.is_cut(set) && !skip_task && !no_kind && !overwrite_set {
            let (found, accounted) = check_set(
                ev,
                &merged,
                &scope,
                &label,
                ev.provoked_loss && set_lost > 0,
            );
            v.extend(found);
            if k == 0 {
                a.accounted = accounted;
            }
        }
        // The address space the set's KSYMBOLs describe: CPU-wide sets
        // that asked for KSYMBOL, read whole (a task-bound set does not
        // see symbols other tasks register or unregister).
        if !is_task && scope.has_ksym && !self.is_cut(set) && !overwrite_set {
            let images = ranges::images(ev);
            let label = if label.is_empty() {
                String::new()
            } else {
                format!("{label}: ")
            };
            if let Some(note) = ranges::check(&label, &merged, &images, v) {
                a.notes.push(note);
            }
            if let Some(books) = &ev.exec_areas {
                if let Some(note) = areas::check(&label, &merged, set, &books.readings, v) {
                    a.notes.push(note);
                }
            }
        }
        self.check_pokes(set, is_task, &merged, &label, v);
        self.check_tasks(set, is_task, &cpus, &merged, &label, v);
        if k == 0 {
            a.merged = merged;
            a.merged_from = set.to_vec();
        }
    }

    /// Every CPU the set asked for (every online one unless its spec
    /// names a subset) must have its listener; a task listener bound to
    /// no CPU covers them all.
    fn check_coverage(
        &self,
        set: &[u32],
        scope: &SetScope,
        cpus: &BTreeSet<i64>,
        v: &mut Vec<Violation>,
    ) {
        let wanted: BTreeSet<i64> = match &scope.cpus {
            Some(c) => c.iter().map(|c| i64::from(*c)).collect(),
            None => self.online.clone(),
        };
        let missing: Vec<i64> = wanted.difference(cpus).copied().collect();
        if !cpus.contains(&-1) && !self.online.is_empty() && !missing.is_empty() {
            v.push(m_find(
                rule::LISTENERS,
                format!("listener set {set:?} has no listener on {} CPU(s) {missing:?}: records emitted there are not seen", if scope.cpus.is_some() { "its" } else { "online" }),
            ));
        }
    }

    /// The provoked-loss accounting of CPU-wide set `k`: received + lost
    /// must equal what its programs caused (`lost`).
    fn account_loss(
        &self,
        label: &str,
        merged: &[Record],
        scope: &SetScope,
        set_lost: u64,
        k: usize,
        v: &mut Vec<Violation>,
    ) -> LossAccount {
        let lost_parts = &self.readings.lost_parts;
        let account = loss_account(self.ev, k, merged, scope.has_ksym, scope.has_bpf, set_lost);
        if account.received + account.lost != account.caused {
            v.push(m_find(
                rule::LOST,
                format!(
                    "{}the run provoked loss, but {} records received + {} lost = {} != {} \
                     records its programs caused{}",
                    if self.multi {
                        format!("{label}: ")
                    } else {
                        String::new()
                    },
                    account.received,
                    account.lost,
                    account.received + account.lost,
                    account.caused,
                    if lost_parts.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", lost_parts.join("; "))
                    }
                ),
            ));
        }
        account
    }

    /// The report's note of set `k`'s loss accounting.
    fn loss_note(&self, k: usize, account: &LossAccount) -> String {
        format!(
            "loss{}: caused {} = received {} + lost {}{}",
            if self.multi {
                format!(" set#{k}")
            } else {
                String::new()
            },
            account.caused,
            account.received,
            account.lost,
            if account.received + account.lost == account.caused {
                ""
            } else {
                " (MISMATCH)"
            }
        )
    }

    /// trampoline-pokes, kprobe-slots, code-lifetime: for a whole CPU-wide
    /// set that asked for KSYMBOL and TEXT_POKE both.
    fn check_pokes(
        &self,
        set: &[u32],
        is_task: bool,
        merged: &[Record],
        label: &str,
        v: &mut Vec<Violation>,
    ) {
        let pokes = set
            .iter()
            .filter_map(|i| self.listeners.get(i))
            .all(|l| l.ksymbol && l.side_band.contains(&kloop_protocol::SideBand::TextPoke));
        if !pokes || is_task || self.ev.provoked_loss || self.is_cut(set) {
            return;
        }
        push_capped(
            v,
            rule::TRAMPOLINE_POKES,
            "trampolines",
            pokes::check_trampoline_pokes(merged, label),
        );
        push_capped(
            v,
            rule::KPROBE_SLOTS,
            "kprobe slot pokes",
            pokes::check_kprobe_slots(merged, label),
        );
        push_capped(
            v,
            rule::CODE_LIFETIME,
            "writes outside live code",
            pokes::check_code_lifetime(merged, label),
        );
    }

    /// task-records, for a whole set that asked for task records.
    fn check_tasks(
        &self,
        set: &[u32],
        is_task: bool,
        cpus: &BTreeSet<i64>,
        merged: &[Record],
        label: &str,
        v: &mut Vec<Violation>,
    ) {
        let ev = self.ev;
        let members: Vec<&ListenerInfo> = set
            .iter()
            .filter_map(|i| self.listeners.get(i).copied())
            .collect();
        if !tasks::asks_for_tasks(&members) || ev.provoked_loss || self.is_cut(set) {
            return;
        }
        let audience = if !is_task {
            tasks::Audience::CpuWide
        } else if members.iter().all(|l| l.inherit) {
            tasks::Audience::Inherited
        } else {
            tasks::Audience::TaskOnly
        };
        // Only a set open through the whole run saw the threads come
        // and go.
        let loaders: Vec<tasks::Loader> = if whole_run(ev, set) {
            ev.batches
                .iter()
                .filter_map(|b| {
                    Some(tasks::Loader {
                        tid: b.tid?,
                        cpu: b.cpu?,
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let online = &self.online;
        let all_cpus = cpus.contains(&-1) || (!online.is_empty() && online.is_subset(cpus));
        push_capped(
            v,
            rule::TASK_RECORDS,
            "task record problems",
            tasks::check_task_records(merged, label, audience, cpus, all_cpus, &loaders),
        );
    }

    /// announced and withdrawn, against the agent's final kallsyms read:
    /// only for a first set that saw the whole run on every CPU, all of
    /// it: one that lost records or was cut cannot be held to every
    /// register.
    fn check_final_kallsyms(&self, a: &Analysis, v: &mut Vec<Violation>) {
        let ev = self.ev;
        let (Some(final_read), Some(set)) = (&ev.final_kallsyms, a.sets.first()) else {
            return;
        };
        let first = set.first().and_then(|i| self.listeners.get(i));
        let cpus = self.cpus(set);
        let lost: u64 = set
            .iter()
            .filter_map(|i| self.readings.lost_by.get(i))
            .sum();
        if ev.initial_snapshot
            && !self.overwritten(set)
            && first.is_some_and(|l| l.ksymbol)
            && self.online.is_subset(&cpus)
            && lost == 0
            && !self.is_cut(set)
            && whole_run(ev, set)
        {
            check_announced(&ev.initial_kallsyms, final_read, &a.merged, v);
            check_withdrawn(&ev.initial_kallsyms, final_read, &a.merged, v);
        }
    }
}

/// Parses every stream and checks every rule.
pub fn analyse(ev: &RunEvidence) -> Analysis {
    let mut a = Analysis::default();
    let mut v: Vec<Violation> = Vec::new();

    check_program_exits(ev, &mut v);
    let listeners = index_listeners(ev, &mut v);
    let readings = Readings::read(ev, &listeners, &mut a, &mut v);

    v.extend(wakeups::check(
        &ev.listeners,
        &a.records_per_listener,
        &ev.wakeups,
    ));

    check_facts(&ev.progs, &mut v);

    a.sets = listener_sets(ev, &listeners);
    a.task_sets = task_listener_sets(ev, &listeners);
    // A task-bound set of the loading task records its programs too
    // (perf_iterate_sb() iterates the current task's contexts).
    let kinds = |set: &Vec<u32>| {
        set.first()
            .and_then(|i| listeners.get(i))
            .is_some_and(|l| l.ksymbol || l.bpf_event)
    };
    if !a.sets.iter().chain(&a.task_sets).any(kinds) && !ev.progs.is_empty() {
        v.push(m_find(
            rule::LISTENERS,
            "programs were loaded but no listener recorded them".to_string(),
        ));
    }
    let judge = SetJudge {
        ev,
        listeners: &listeners,
        readings: &readings,
        online: ev.online_cpus.iter().map(|c| i64::from(*c)).collect(),
        multi: a.sets.len() > 1,
    };
    let all_sets: Vec<(bool, Vec<u32>)> = a
        .sets
        .iter()
        .map(|s| (false, s.clone()))
        .chain(a.task_sets.iter().map(|s| (true, s.clone())))
        .collect();
    for (k, (is_task, set)) in all_sets.iter().enumerate() {
        judge.judge(k, *is_task, set, &mut a, &mut v);
    }
    if let Some(watch) = &ev.ksymbol_watch {
        if a.sets.first().is_some_and(|s| !judge.is_cut(s)) {
            check_symbol_state(watch, &a.merged, &mut v);
        }
    }
    judge.check_final_kallsyms(&a, &mut v);
    check_agreement(ev, &a, &listeners, &readings.cut, &mut v);
    check_paused_silent(ev, &a.records_per_listener, &mut v);
    let notes = check_lookups(ev, &a, &mut v);
    a.notes.extend(notes);
    a.violations = v;
    a
}

/// `paused-silent`: a `pause-output` step pauses every open ring, and
/// __perf_output_begin() (kernel/events/ring_buffer.c) writes nothing to a
/// paused ring (`if (unlikely(rb->paused)) { ... goto out; }`, counting the
/// record lost). So a program that a batch step (storm, concurrent) loaded
/// and unloaded between the pause and the resume, with the plan waiting
/// for its unload before the resume, has no BPF_EVENT in any ring.
fn check_paused_silent(
    ev: &RunEvidence,
    per_listener: &BTreeMap<u32, Vec<Record>>,
    out: &mut Vec<Violation>,
) {
    use kloop_protocol::Step;
    let mut paused_from = None;
    let mut windows = Vec::new();
    for (&i, step) in &ev.steps {
        match step {
            Step::PauseOutput { paused: true } => paused_from = paused_from.or(Some(i)),
            Step::PauseOutput { paused: false } => {
                if let Some(p) = paused_from.take() {
                    windows.push((p, i));
                }
            }
            _ => {}
        }
    }
    for (from, to) in windows {
        // The resume must come after a wait for the unloads.
        if !ev
            .steps
            .range(from..to)
            .any(|(_, s)| matches!(s, Step::WaitUnloaded { .. }))
        {
            continue;
        }
        let ids: BTreeSet<u32> = ev
            .batches
            .iter()
            .filter(|b| b.step.is_some_and(|s| s > from && s < to))
            .flat_map(|b| b.ids.iter().copied())
            .collect();
        let seen: Vec<&Record> = per_listener
            .values()
            .flatten()
            .filter(|r| matches!(&r.body, RecordBody::BpfEvent { id, .. } if ids.contains(id)))
            .collect();
        if let Some(first) = seen.first() {
            out.push(
                Violation::new(
                    rule::PAUSED_SILENT,
                    format!(
                        "{} BPF_EVENT record(s) of programs loaded and unloaded while every ring \
                         was paused (steps {from} to {to}) reached a ring, first {first}: \
                         __perf_output_begin() writes nothing to a paused ring",
                        seen.len()
                    ),
                )
                .quoting(seen.iter().copied().take(3)),
            );
        }
    }
}

/// Runs under the interpreter (`scenarios/interpreter`), synthetic: no
/// pinned kernel can turn its JIT off (`CONFIG_BPF_JIT_ALWAYS_ON`).
#[cfg(test)]
mod config_tests;
#[cfg(test)]
mod emission_tests;
#[cfg(test)]
mod interpreter_tests;
#[cfg(test)]
pub(crate) mod stream_tests;
#[cfg(test)]
pub(crate) mod testrun;
#[cfg(test)]
mod tests;
