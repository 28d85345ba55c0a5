#![warn(missing_docs)]
//! The perf record parser: `perf_event_header`, `PERF_RECORD_KSYMBOL`,
//! `PERF_RECORD_BPF_EVENT`, `PERF_RECORD_LOST` and the `sample_id_all`
//! trailer.
//!
//! Layouts follow `include/uapi/linux/perf_event.h`; the emitting code is
//! `kernel/events/core.c` (`perf_event_ksymbol`, `perf_event_bpf_event`,
//! `perf_output_begin` for LOST, `__perf_event_header__init_id` /
//! `__perf_event__output_id_sample` for the trailer).
//!
//! The parser is strict: every record must be laid out exactly as the kernel
//! writes it, and any deviation is a [`ParseError`] that names the listener,
//! the stream offset and the bytes there. It never panics, whatever the
//! input: all reads are bounds-checked and nothing is allocated from a length
//! field beyond what the input itself holds.
//!
//! Byte order: records are in the guest's native order; kloop guests are
//! little-endian (x86_64), so the parser reads little-endian.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use kloop_protocol::ListenerInfo;
use thiserror::Error;

/// `PERF_RECORD_LOST`.
pub const PERF_RECORD_LOST: u32 = 2;
/// `PERF_RECORD_KSYMBOL` (Linux 5.1+).
pub const PERF_RECORD_KSYMBOL: u32 = 17;
/// `PERF_RECORD_BPF_EVENT` (Linux 5.1+).
pub const PERF_RECORD_BPF_EVENT: u32 = 18;

/// `PERF_RECORD_TEXT_POKE` (Linux 5.9+).
pub const PERF_RECORD_TEXT_POKE: u32 = 20;
/// `PERF_RECORD_EXIT`: a task exited (attr.task, comm or mmap).
pub const PERF_RECORD_EXIT: u32 = 4;
/// `PERF_RECORD_FORK`: a task was created (attr.task, comm or mmap).
pub const PERF_RECORD_FORK: u32 = 7;

/// `PERF_RECORD_KSYMBOL_TYPE_UNKNOWN`.
pub const KSYM_TYPE_UNKNOWN: u16 = 0;
/// `PERF_RECORD_KSYMBOL_TYPE_BPF`.
pub const KSYM_TYPE_BPF: u16 = 1;
/// `PERF_RECORD_KSYMBOL_TYPE_OOL` (5.9+).
pub const KSYM_TYPE_OOL: u16 = 2;
/// `PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER`.
pub const KSYMBOL_FLAGS_UNREGISTER: u16 = 1 << 0;

/// `PERF_BPF_EVENT_UNKNOWN`.
pub const BPF_EVENT_UNKNOWN: u16 = 0;
/// `PERF_BPF_EVENT_PROG_LOAD`.
pub const BPF_EVENT_PROG_LOAD: u16 = 1;
/// `PERF_BPF_EVENT_PROG_UNLOAD`.
pub const BPF_EVENT_PROG_UNLOAD: u16 = 2;

// `PERF_SAMPLE_*` bits that select `sample_id` trailer fields, in the
// trailer's order.
/// `PERF_SAMPLE_TID`: the trailer's `{pid, tid}`.
pub const PERF_SAMPLE_TID: u64 = 1 << 1;
/// `PERF_SAMPLE_TIME`: the trailer's `time`.
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// `PERF_SAMPLE_ID`: the trailer's `id`.
pub const PERF_SAMPLE_ID: u64 = 1 << 6;
/// `PERF_SAMPLE_CPU`: the trailer's `{cpu, res}`.
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
/// `PERF_SAMPLE_STREAM_ID`: the trailer's `stream_id`.
pub const PERF_SAMPLE_STREAM_ID: u64 = 1 << 9;
/// `PERF_SAMPLE_IDENTIFIER`: the trailer's last `identifier`.
pub const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// Size of `struct perf_event_header`.
pub const HEADER_LEN: usize = 8;
/// Fixed body of a KSYMBOL record before `name[]`: addr, len, ksym_type, flags.
pub const KSYMBOL_FIXED_LEN: usize = 16;
/// Fixed body of a BPF_EVENT record: type, flags, id, tag.
pub const BPF_EVENT_FIXED_LEN: usize = 16;
/// Fixed body of a LOST record: id, lost.
pub const LOST_FIXED_LEN: usize = 16;

/// `enum perf_record_ksymbol_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KsymType {
    /// `PERF_RECORD_KSYMBOL_TYPE_UNKNOWN` (0), which no emitter passes.
    Unknown,
    /// `PERF_RECORD_KSYMBOL_TYPE_BPF`: programs, trampolines, dispatchers.
    Bpf,
    /// `PERF_RECORD_KSYMBOL_TYPE_OOL`: kprobe slots, ftrace trampolines.
    Ool,
}

impl KsymType {
    /// The type of a record's `ksym_type`, if it is one.
    pub fn from_raw(v: u16) -> Option<KsymType> {
        match v {
            KSYM_TYPE_UNKNOWN => Some(KsymType::Unknown),
            KSYM_TYPE_BPF => Some(KsymType::Bpf),
            KSYM_TYPE_OOL => Some(KsymType::Ool),
            _ => None,
        }
    }

    /// The name after `PERF_RECORD_KSYMBOL_TYPE_`.
    pub fn name(self) -> &'static str {
        match self {
            KsymType::Unknown => "UNKNOWN",
            KsymType::Bpf => "BPF",
            KsymType::Ool => "OOL",
        }
    }
}

/// `enum perf_bpf_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BpfEventType {
    /// `PERF_BPF_EVENT_UNKNOWN` (0), which the kernel never emits.
    Unknown,
    /// `PERF_BPF_EVENT_PROG_LOAD`.
    ProgLoad,
    /// `PERF_BPF_EVENT_PROG_UNLOAD`.
    ProgUnload,
}

impl BpfEventType {
    /// The type of a record's `type`, if it is one.
    pub fn from_raw(v: u16) -> Option<BpfEventType> {
        match v {
            BPF_EVENT_UNKNOWN => Some(BpfEventType::Unknown),
            BPF_EVENT_PROG_LOAD => Some(BpfEventType::ProgLoad),
            BPF_EVENT_PROG_UNLOAD => Some(BpfEventType::ProgUnload),
            _ => None,
        }
    }

    /// The name after `PERF_BPF_EVENT_`.
    pub fn name(self) -> &'static str {
        match self {
            BpfEventType::Unknown => "UNKNOWN",
            BpfEventType::ProgLoad => "PROG_LOAD",
            BpfEventType::ProgUnload => "PROG_UNLOAD",
        }
    }
}

/// Symbolic ksym type, or the number for values the ABI does not define.
pub fn ksym_type_name(v: u16) -> String {
    KsymType::from_raw(v)
        .map(|t| t.name().to_string())
        .unwrap_or_else(|| format!("ksym_type={v}"))
}

/// Symbolic BPF event type, or the number for undefined values.
pub fn bpf_event_type_name(v: u16) -> String {
    BpfEventType::from_raw(v)
        .map(|t| t.name().to_string())
        .unwrap_or_else(|| format!("type={v}"))
}

/// Name of a `PERF_RECORD_*` type, `None` if the uapi header does not define it.
pub fn record_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        1 => "MMAP",
        2 => "LOST",
        3 => "COMM",
        4 => "EXIT",
        5 => "THROTTLE",
        6 => "UNTHROTTLE",
        7 => "FORK",
        8 => "READ",
        9 => "SAMPLE",
        10 => "MMAP2",
        11 => "AUX",
        12 => "ITRACE_START",
        13 => "LOST_SAMPLES",
        14 => "SWITCH",
        15 => "SWITCH_CPU_WIDE",
        16 => "NAMESPACES",
        17 => "KSYMBOL",
        18 => "BPF_EVENT",
        19 => "CGROUP",
        20 => "TEXT_POKE",
        21 => "AUX_OUTPUT_HW_ID",
        _ => return None,
    })
}

/// [`record_type_name`], or `type <n>` for a type the uapi does not define.
pub fn record_type_label(t: u32) -> String {
    record_type_name(t).map_or_else(|| format!("type {t}"), str::to_string)
}

/// `perf_event_attr.sample_type` in symbolic form, e.g. `TID|TIME|CPU`
/// (`0` when empty; undefined bits as one hex remainder).
pub fn sample_type_names(sample_type: u64) -> String {
    const NAMES: [&str; 25] = [
        "IP",
        "TID",
        "TIME",
        "ADDR",
        "READ",
        "CALLCHAIN",
        "ID",
        "CPU",
        "PERIOD",
        "STREAM_ID",
        "RAW",
        "BRANCH_STACK",
        "REGS_USER",
        "STACK_USER",
        "WEIGHT",
        "DATA_SRC",
        "IDENTIFIER",
        "TRANSACTION",
        "REGS_INTR",
        "PHYS_ADDR",
        "AUX",
        "CGROUP",
        "DATA_PAGE_SIZE",
        "CODE_PAGE_SIZE",
        "WEIGHT_STRUCT",
    ];
    let mut parts: Vec<String> = Vec::new();
    let mut rest = sample_type;
    for (bit, name) in NAMES.iter().enumerate() {
        let mask = 1u64 << bit;
        if sample_type & mask != 0 {
            parts.push((*name).to_string());
            rest &= !mask;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    if parts.is_empty() {
        "0".to_string()
    } else {
        parts.join("|")
    }
}

/// `struct perf_event_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfHeader {
    /// `PERF_RECORD_*`.
    pub type_: u32,
    /// `PERF_RECORD_MISC_*` bits; 0 for KSYMBOL, BPF_EVENT and LOST.
    pub misc: u16,
    /// The whole record's length, header and trailer included.
    pub size: u16,
}

/// The `sample_id` trailer: only the fields the listener's `sample_type`
/// selected are `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleId {
    /// The emitting task's process id (`PERF_SAMPLE_TID`).
    pub pid: Option<u32>,
    /// The emitting task's thread id (`PERF_SAMPLE_TID`).
    pub tid: Option<u32>,
    /// The event clock at emission (`PERF_SAMPLE_TIME`).
    pub time: Option<u64>,
    /// The listener's (its parent's, if inherited) id (`PERF_SAMPLE_ID`).
    pub id: Option<u64>,
    /// The id of the event that wrote it (`PERF_SAMPLE_STREAM_ID`).
    pub stream_id: Option<u64>,
    /// The CPU it was emitted on (`PERF_SAMPLE_CPU`).
    pub cpu: Option<u32>,
    /// The `res` half of `{cpu, res}`; the kernel writes 0.
    pub cpu_res: Option<u32>,
    /// The listener's id again, last (`PERF_SAMPLE_IDENTIFIER`).
    pub identifier: Option<u64>,
}

/// The body of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    /// `PERF_RECORD_KSYMBOL`: a kernel symbol registered or unregistered
    /// (`flags` has `PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER`).
    Ksymbol {
        /// The symbol's start.
        addr: u64,
        /// Its length in bytes.
        len: u32,
        /// `PERF_RECORD_KSYMBOL_TYPE_*`.
        ksym_type: u16,
        /// `PERF_RECORD_KSYMBOL_FLAGS_*`.
        flags: u16,
        /// The name without its NUL and padding (lossy UTF-8; kernel symbol
        /// names are ASCII).
        name: String,
    },
    /// `PERF_RECORD_BPF_EVENT`: a program loaded or unloaded.
    BpfEvent {
        /// `PERF_BPF_EVENT_*`.
        event_type: u16,
        /// Always 0 so far.
        flags: u16,
        /// The program's id.
        id: u32,
        /// The program's tag.
        tag: [u8; 8],
    },
    /// `PERF_RECORD_LOST`: records the ring could not take.
    Lost {
        /// The id of the event that lost them.
        id: u64,
        /// How many.
        lost: u64,
    },
    /// A change of kernel text (`attr.text_poke`): `old_len` bytes at
    /// `addr` replaced by `new_len` bytes; either may be 0 for a trampoline
    /// added or removed (include/uapi/linux/perf_event.h). The bytes are
    /// checked for their padding and not kept.
    TextPoke {
        /// The first byte changed.
        addr: u64,
        /// How many bytes were there before.
        old_len: u16,
        /// How many bytes are there now.
        new_len: u16,
    },
    /// A task created (FORK) or gone (EXIT), as perf_event_task_output()
    /// writes it (kernel/events/core.c): the task's pid and tid, its
    /// parent's (for EXIT: the task itself, `current`), and the time.
    Task {
        /// EXIT rather than FORK.
        exit: bool,
        /// The task's process id.
        pid: u32,
        /// Its parent's process id.
        ppid: u32,
        /// The task's thread id.
        tid: u32,
        /// Its parent's thread id.
        ptid: u32,
        /// The event clock when it was written.
        time: u64,
    },
    /// A record type kloop does not interpret; its body and trailer are
    /// skipped (only the header size is checked).
    Unknown {
        /// Its `PERF_RECORD_*`.
        type_: u32,
    },
}

/// One parsed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `ListenerInfo::index` of the ring it came from.
    pub listener: u32,
    /// Offset of the record's header in that listener's stream.
    pub offset: u64,
    /// Its header as written.
    pub header: PerfHeader,
    /// What it says.
    pub body: RecordBody,
    /// Its `sample_id` trailer.
    pub sample: SampleId,
}

impl Record {
    /// The trailer's time, if the listener asked for it.
    pub fn time(&self) -> Option<u64> {
        self.sample.time
    }

    /// A KSYMBOL record without the UNREGISTER flag.
    pub fn is_register(&self) -> bool {
        matches!(self.body, RecordBody::Ksymbol { flags, .. } if flags & KSYMBOL_FLAGS_UNREGISTER == 0)
    }

    /// A KSYMBOL record with the UNREGISTER flag.
    pub fn is_unregister(&self) -> bool {
        matches!(self.body, RecordBody::Ksymbol { flags, .. } if flags & KSYMBOL_FLAGS_UNREGISTER != 0)
    }

    /// `(id, tag)` of a BPF_EVENT of the given type.
    pub fn bpf_event(&self, ty: u16) -> Option<(u32, [u8; 8])> {
        match self.body {
            RecordBody::BpfEvent {
                event_type,
                id,
                tag,
                ..
            } if event_type == ty => Some((id, tag)),
            _ => None,
        }
    }
}

/// `register` or `unregister`, from a KSYMBOL record's flags.
pub fn ksymbol_action(flags: u16) -> &'static str {
    if flags & KSYMBOL_FLAGS_UNREGISTER != 0 {
        "unregister"
    } else {
        "register"
    }
}

/// Compact one-line rendering used in violation messages:
/// `L<listener>@<offset> <TYPE> <fields> [t=<time>] [cpu=<cpu>]`.
/// What a KSYMBOL / BPF_EVENT record says, without where and when it was
/// written (no trailer, no stream offset): what two readers or two
/// listeners of the same event must agree on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecordContent {
    /// A KSYMBOL's fields ([`RecordBody::Ksymbol`]).
    Ksymbol {
        /// The symbol's start.
        addr: u64,
        /// Its length.
        len: u32,
        /// `PERF_RECORD_KSYMBOL_TYPE_*`.
        ksym_type: u16,
        /// `PERF_RECORD_KSYMBOL_FLAGS_*`.
        flags: u16,
        /// Its name.
        name: String,
    },
    /// `tag` is `None` only where a reader printed the event without it
    /// (perf's summary line); a parsed record always has it.
    BpfEvent {
        /// `PERF_BPF_EVENT_*`.
        event_type: u16,
        /// Always 0 so far.
        flags: u16,
        /// The program's id.
        id: u32,
        /// The program's tag, when the reader printed it.
        tag: Option<[u8; 8]>,
    },
}

impl RecordContent {
    /// What a KSYMBOL or BPF_EVENT record says; `None` for other records.
    pub fn of_record(r: &Record) -> Option<RecordContent> {
        match &r.body {
            RecordBody::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } => Some(RecordContent::Ksymbol {
                addr: *addr,
                len: *len,
                ksym_type: *ksym_type,
                flags: *flags,
                name: name.clone(),
            }),
            RecordBody::BpfEvent {
                event_type,
                flags,
                id,
                tag,
            } => Some(RecordContent::BpfEvent {
                event_type: *event_type,
                flags: *flags,
                id: *id,
                tag: Some(*tag),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for RecordContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordContent::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } => write!(
                f,
                "KSYMBOL {} {} addr={addr:#x} len={len} name={name:?}{}",
                ksymbol_action(*flags),
                ksym_type_name(*ksym_type),
                if flags & !KSYMBOL_FLAGS_UNREGISTER != 0 {
                    format!(" flags={flags:#x}")
                } else {
                    String::new()
                }
            ),
            RecordContent::BpfEvent {
                event_type,
                flags,
                id,
                tag,
            } => {
                write!(f, "BPF_EVENT {} id={id}", bpf_event_type_name(*event_type))?;
                if let Some(t) = tag {
                    write!(f, " tag={}", hex::encode(t))?;
                }
                if *flags != 0 {
                    write!(f, " flags={flags:#x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}@{} ", self.listener, self.offset)?;
        match &self.body {
            RecordBody::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } => {
                let what = ksymbol_action(*flags);
                write!(
                    f,
                    "KSYMBOL {what} {} addr={addr:#x} len={len} name={name:?}",
                    ksym_type_name(*ksym_type)
                )?;
                let other = flags & !KSYMBOL_FLAGS_UNREGISTER;
                if other != 0 {
                    write!(f, " flags={flags:#x}")?;
                }
            }
            RecordBody::BpfEvent {
                event_type,
                flags,
                id,
                tag,
            } => {
                write!(
                    f,
                    "BPF_EVENT {} id={id} tag={}",
                    bpf_event_type_name(*event_type),
                    hex::encode(tag)
                )?;
                if *flags != 0 {
                    write!(f, " flags={flags:#x}")?;
                }
            }
            RecordBody::Lost { id, lost } => write!(f, "LOST id={id} lost={lost}")?,
            RecordBody::TextPoke {
                addr,
                old_len,
                new_len,
            } => write!(
                f,
                "TEXT_POKE addr={addr:#x} old_len={old_len} new_len={new_len}"
            )?,
            RecordBody::Task {
                exit,
                pid,
                ppid,
                tid,
                ptid,
                time,
            } => write!(
                f,
                "{} pid={pid} tid={tid} ppid={ppid} ptid={ptid} time={time}",
                if *exit { "EXIT" } else { "FORK" }
            )?,
            RecordBody::Unknown { type_ } => match record_type_name(*type_) {
                Some(n) => write!(f, "{n}(type {type_}) size={}", self.header.size)?,
                None => write!(f, "type {type_} size={}", self.header.size)?,
            },
        }
        if self.header.misc != 0 {
            write!(f, " misc={:#x}", self.header.misc)?;
        }
        if let Some(t) = self.sample.time {
            write!(f, " t={t}")?;
        }
        if let Some(c) = self.sample.cpu {
            write!(f, " cpu={c}")?;
        }
        Ok(())
    }
}

/// A stream that does not parse exactly.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("listener {listener}, stream offset {offset}: {what}; bytes at offset: [{bytes_hex}]")]
pub struct ParseError {
    /// The listener whose stream it is.
    pub listener: u32,
    /// Offset of the offending record's header in the listener's stream.
    pub offset: u64,
    /// What does not parse, and why.
    pub what: String,
    /// Up to 64 bytes from `offset`, hex, in groups of 8.
    pub bytes_hex: String,
}

/// Hex of up to 64 bytes of `bytes` from `offset`, in groups of 8 bytes.
fn hex_at(bytes: &[u8], offset: usize) -> String {
    let tail = bytes.get(offset..).unwrap_or(&[]);
    let window = tail.get(..64).unwrap_or(tail);
    window
        .chunks(8)
        .map(hex::encode)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Length of the `sample_id` trailer this listener's records carry.
pub fn sample_id_len(listener: &ListenerInfo) -> usize {
    if !listener.sample_id_all {
        return 0;
    }
    let st = listener.sample_type;
    [
        PERF_SAMPLE_TID,
        PERF_SAMPLE_TIME,
        PERF_SAMPLE_ID,
        PERF_SAMPLE_STREAM_ID,
        PERF_SAMPLE_CPU,
        PERF_SAMPLE_IDENTIFIER,
    ]
    .iter()
    .filter(|bit| st & **bit != 0)
    .count()
        * 8
}

/// Bounds-checked little-endian reads from one record.
struct Reader<'a> {
    rec: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.rec.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Parses one record whose bytes (header included) are exactly `rec`.
/// `Err`: a `ParseError`'s reason, a string as that error carries it.
fn parse_record(listener: &ListenerInfo, rec: &[u8]) -> Result<Parts, String> {
    let mut r = Reader { rec, pos: 0 };
    let type_ = r.u32().ok_or_else(|| short("header"))?;
    let misc = r.u16().ok_or_else(|| short("header"))?;
    let size = r.u16().ok_or_else(|| short("header"))?;
    let header = PerfHeader { type_, misc, size };

    let body = match type_ {
        PERF_RECORD_KSYMBOL => ksymbol_body(&mut r, listener)?,
        PERF_RECORD_BPF_EVENT => {
            let event_type = r.u16().ok_or_else(|| short("BPF_EVENT body"))?;
            let flags = r.u16().ok_or_else(|| short("BPF_EVENT body"))?;
            let id = r.u32().ok_or_else(|| short("BPF_EVENT body"))?;
            let tag: [u8; 8] = r
                .take(8)
                .and_then(|t| t.try_into().ok())
                .ok_or_else(|| short("BPF_EVENT body"))?;
            RecordBody::BpfEvent {
                event_type,
                flags,
                id,
                tag,
            }
        }
        PERF_RECORD_LOST => {
            let id = r.u64().ok_or_else(|| short("LOST body"))?;
            let lost = r.u64().ok_or_else(|| short("LOST body"))?;
            RecordBody::Lost { id, lost }
        }
        PERF_RECORD_TEXT_POKE => text_poke_body(&mut r)?,
        PERF_RECORD_FORK | PERF_RECORD_EXIT => {
            let what = if type_ == PERF_RECORD_EXIT {
                "EXIT body"
            } else {
                "FORK body"
            };
            let pid = r.u32().ok_or_else(|| short(what))?;
            let ppid = r.u32().ok_or_else(|| short(what))?;
            let tid = r.u32().ok_or_else(|| short(what))?;
            let ptid = r.u32().ok_or_else(|| short(what))?;
            let time = r.u64().ok_or_else(|| short(what))?;
            RecordBody::Task {
                exit: type_ == PERF_RECORD_EXIT,
                pid,
                ppid,
                tid,
                ptid,
                time,
            }
        }
        other => {
            // Unknown layout: the header size is all we can check.
            return Ok(Parts {
                header,
                body: RecordBody::Unknown { type_: other },
                sample: SampleId::default(),
                body_end: rec.len(),
                end: rec.len(),
            });
        }
    };

    let body_end = r.pos;
    let s = if listener.sample_id_all {
        read_sample_id(&mut r, listener.sample_type).ok_or_else(|| {
            format!(
                "sample_id trailer ({} bytes for sample_type {}) does not fit: body ends at {body_end}, header.size is {size}",
                sample_id_len(listener),
                sample_type_names(listener.sample_type)
            )
        })?
    } else {
        SampleId::default()
    };
    Ok(Parts {
        header,
        body,
        sample: s,
        body_end,
        end: r.pos,
    })
}

/// "record too short for `what`": a record that ends inside a field.
fn short(what: &str) -> String {
    format!("record too short for {what}")
}

/// A KSYMBOL body after the header: its fields, then its name, NUL
/// terminated and zero-padded to a multiple of 8 bytes. `Err`: as
/// [`parse_record`]'s.
fn ksymbol_body(r: &mut Reader<'_>, listener: &ListenerInfo) -> Result<RecordBody, String> {
    let addr = r.u64().ok_or_else(|| short("KSYMBOL body"))?;
    let len = r.u32().ok_or_else(|| short("KSYMBOL body"))?;
    let ksym_type = r.u16().ok_or_else(|| short("KSYMBOL body"))?;
    let flags = r.u16().ok_or_else(|| short("KSYMBOL body"))?;
    let name_start = r.pos;
    // The name ends before the trailer, whose length the listener's
    // sample_type fixes: a NUL inside the trailer does not count.
    let name_limit = r.rec.len().saturating_sub(sample_id_len(listener));
    let rest = r.rec.get(name_start..name_limit).unwrap_or(&[]);
    let nul = rest.iter().position(|b| *b == 0).ok_or_else(|| {
        format!(
            "KSYMBOL name has no NUL terminator before the {}-byte sample_id trailer (name bytes at record offsets {name_start}..{name_limit})",
            sample_id_len(listener)
        )
    })?;
    // The kernel pads strlen + 1 up to a multiple of 8 with zeros.
    let padded = (nul + 1).div_ceil(8) * 8;
    let region = r.take(padded).ok_or_else(|| {
        format!("KSYMBOL name region (strlen {nul}, padded to {padded}) runs past the record end")
    })?;
    let name_bytes = region.get(..nul).unwrap_or(&[]);
    let padding = region.get(nul..).unwrap_or(&[]);
    if let Some(i) = padding.iter().position(|b| *b != 0) {
        return Err(format!(
            "KSYMBOL name padding byte {} (record offset {}) is {:#04x}, not zero",
            i,
            name_start + nul + i,
            padding.get(i).copied().unwrap_or(0)
        ));
    }
    Ok(RecordBody::Ksymbol {
        addr,
        len,
        ksym_type,
        flags,
        name: String::from_utf8_lossy(name_bytes).into_owned(),
    })
}

/// A TEXT_POKE body after the header: the address, the lengths, both byte
/// strings (skipped) and zero padding. `Err`: as [`parse_record`]'s.
fn text_poke_body(r: &mut Reader<'_>) -> Result<RecordBody, String> {
    let addr = r.u64().ok_or_else(|| short("TEXT_POKE body"))?;
    let old_len = r.u16().ok_or_else(|| short("TEXT_POKE body"))?;
    let new_len = r.u16().ok_or_else(|| short("TEXT_POKE body"))?;
    // perf_event_text_poke(): the lengths and both byte strings,
    // zero-padded to a multiple of 8 (tot, pad).
    let tot = 4 + usize::from(old_len) + usize::from(new_len);
    let pad = tot.div_ceil(8) * 8 - tot;
    r.take(usize::from(old_len) + usize::from(new_len))
        .ok_or_else(|| {
            format!(
                "TEXT_POKE bytes (old_len {old_len} + new_len {new_len}) run past the record end"
            )
        })?;
    let start = r.pos;
    let padding = r
        .take(pad)
        .ok_or_else(|| format!("TEXT_POKE padding ({pad} bytes) runs past the record end"))?;
    if let Some(i) = padding.iter().position(|b| *b != 0) {
        return Err(format!(
            "TEXT_POKE padding byte {i} (record offset {}) is not zero",
            start + i
        ));
    }
    Ok(RecordBody::TextPoke {
        addr,
        old_len,
        new_len,
    })
}

/// The `sample_id` trailer `sample_type` selects, read from `r` in the
/// uapi's order (`__perf_event__output_id_sample()`); `None` if it runs
/// past the bytes.
fn read_sample_id(r: &mut Reader<'_>, st: u64) -> Option<SampleId> {
    let mut s = SampleId::default();
    if st & PERF_SAMPLE_TID != 0 {
        s.pid = Some(r.u32()?);
        s.tid = Some(r.u32()?);
    }
    if st & PERF_SAMPLE_TIME != 0 {
        s.time = Some(r.u64()?);
    }
    if st & PERF_SAMPLE_ID != 0 {
        s.id = Some(r.u64()?);
    }
    if st & PERF_SAMPLE_STREAM_ID != 0 {
        s.stream_id = Some(r.u64()?);
    }
    if st & PERF_SAMPLE_CPU != 0 {
        s.cpu = Some(r.u32()?);
        s.cpu_res = Some(r.u32()?);
    }
    if st & PERF_SAMPLE_IDENTIFIER != 0 {
        s.identifier = Some(r.u64()?);
    }
    Some(s)
}

/// The `sample_id` trailer of `listener` read from `bytes` (at least
/// [`sample_id_len`] of them): what a reader that takes the trailer from
/// wherever it stands — perf reads it from a record's end — finds there.
pub fn sample_id_of(listener: &ListenerInfo, bytes: &[u8]) -> Option<SampleId> {
    read_sample_id(&mut Reader { rec: bytes, pos: 0 }, listener.sample_type)
}

/// A record's fields as [`parse_record`] read them, and where its body and
/// its sample_id trailer end (`end` < the record's length: bytes follow
/// that nothing explains).
struct Parts {
    header: PerfHeader,
    body: RecordBody,
    sample: SampleId,
    body_end: usize,
    end: usize,
}

impl Parts {
    /// The strict reading: every byte of the record explained (`Err`: a
    /// `ParseError`'s reason, as [`parse_record`]'s).
    fn exact(self, listener: &ListenerInfo, rec: &[u8]) -> Result<Self, String> {
        if self.end == rec.len() {
            return Ok(self);
        }
        Err(format!(
            "{} unexplained bytes after the {} (body ends at {}, trailer of {} bytes ends at {}, header.size is {})",
            rec.len() - self.end,
            if listener.sample_id_all { "sample_id trailer" } else { "body (no sample_id_all)" },
            self.body_end,
            self.end - self.body_end,
            self.end,
            self.header.size
        ))
    }
}

/// Parses as much of a stream as is well-formed: the records up to the first
/// error, and that error if there is one.
pub fn parse_prefix(listener: &ListenerInfo, bytes: &[u8]) -> (Vec<Record>, Option<ParseError>) {
    let p = walk(listener, bytes, false);
    (p.records, p.error)
}

/// A record laid out whole — its body, then its `sample_id` trailer, every
/// field where the uapi puts it — whose `header.size` claims more bytes
/// after the trailer, all of them zero. The kernel reserved `size` bytes in
/// the ring (`perf_output_begin()` advances the head by `header.size`), so
/// the next record starts there; what it wrote into the record ends at
/// `end`. This is the shape of a header that was grown and not restored
/// (ksymbol-bpf-event-header-size-accumulates in the ledger); it is still a
/// parse fault, which [`parse_reading_on`] reports and reads past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// The listener whose stream holds it.
    pub listener: u32,
    /// Offset of its header in the stream.
    pub offset: u64,
    /// `header.type`.
    pub record_type: u32,
    /// `header.size`.
    pub size: u16,
    /// Where its body ends (record offset).
    pub body_end: u32,
    /// Length of its `sample_id` trailer ([`sample_id_len`]).
    pub trailer_len: u32,
    /// Bytes after the trailer: `size` − body − trailer.
    pub excess: u32,
}

/// What [`parse_reading_on`] read.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    /// Every record read, oversized ones included (with their trailer read
    /// where the kernel wrote it, right after the body).
    pub records: Vec<Record>,
    /// The oversized records read past, in stream order.
    pub oversized: Vec<Oversized>,
    /// The first fault that could not be read past: reading stopped there.
    pub error: Option<ParseError>,
}

/// Parses a stream like [`parse_prefix`], except that an [`Oversized`]
/// record — body and trailer whole, then only zero bytes up to
/// `header.size` — is kept, reported in [`Parsed::oversized`], and reading
/// goes on at `header.size`, the boundary the kernel reserved. Any other
/// fault, and excess bytes that are not all zero (another record's bytes
/// may hide there, so `header.size` is not trusted), stop reading as in
/// [`parse_prefix`].
pub fn parse_reading_on(listener: &ListenerInfo, bytes: &[u8]) -> Parsed {
    walk(listener, bytes, true)
}

fn walk(listener: &ListenerInfo, bytes: &[u8], read_on: bool) -> Parsed {
    let mut out = Parsed::default();
    let mut pos = 0usize;
    let err = |pos: usize, what: String| ParseError {
        listener: listener.index,
        offset: pos as u64,
        what,
        bytes_hex: hex_at(bytes, pos),
    };
    while pos < bytes.len() {
        let avail = bytes.len() - pos;
        let Some(hdr) = bytes.get(pos..pos.saturating_add(HEADER_LEN)) else {
            out.error = Some(err(
                pos,
                format!("truncated header: {avail} bytes left, need {HEADER_LEN}"),
            ));
            return out;
        };
        let size = usize::from(u16::from_le_bytes([
            hdr.get(6).copied().unwrap_or(0),
            hdr.get(7).copied().unwrap_or(0),
        ]));
        let fault = if size < HEADER_LEN {
            Some(format!("header.size {size} is smaller than the header"))
        } else if size % 8 != 0 {
            Some(format!("header.size {size} is not a multiple of 8"))
        } else if size > avail {
            Some(format!(
                "header.size {size} runs past the end of the stream ({avail} bytes left)"
            ))
        } else {
            None
        };
        if let Some(what) = fault {
            out.error = Some(err(pos, what));
            return out;
        }
        let Some(rec) = bytes.get(pos..pos + size) else {
            out.error = Some(err(pos, "record out of bounds".to_string()));
            return out;
        };
        let parts = match parse_record(listener, rec) {
            Ok(p) => p,
            Err(what) => {
                out.error = Some(err(pos, what));
                return out;
            }
        };
        let padding = rec.get(parts.end..).unwrap_or(&[]);
        let parts = if read_on && !padding.is_empty() && padding.iter().all(|b| *b == 0) {
            out.oversized.push(Oversized {
                listener: listener.index,
                offset: pos as u64,
                record_type: parts.header.type_,
                size: parts.header.size,
                body_end: parts.body_end as u32,
                trailer_len: (parts.end - parts.body_end) as u32,
                excess: padding.len() as u32,
            });
            parts
        } else {
            match parts.exact(listener, rec) {
                Ok(p) => p,
                Err(what) => {
                    out.error = Some(err(pos, what));
                    return out;
                }
            }
        };
        out.records.push(Record {
            listener: listener.index,
            offset: pos as u64,
            header: parts.header,
            body: parts.body,
            sample: parts.sample,
        });
        pos += size;
    }
    out
}

/// Parses one listener's whole stream strictly; see the module docs.
pub fn parse_stream(listener: &ListenerInfo, bytes: &[u8]) -> Result<Vec<Record>, ParseError> {
    match parse_prefix(listener, bytes) {
        (records, None) => Ok(records),
        (_, Some(e)) => Err(e),
    }
}

/// Merges per-listener streams into one, ordered by sample time.
///
/// A k-way merge: each stream's own order is kept even where its times go
/// backwards (that is a `time-order` violation, reported elsewhere). Ties go
/// to the lower listener, then the lower offset. A record without a time
/// (listener without `PERF_SAMPLE_TIME`) sorts at the time of the record
/// before it in its stream (0 at the start), so time-less streams come out
/// concatenated by listener.
pub fn merge_by_time(streams: Vec<Vec<Record>>) -> Vec<Record> {
    let total: usize = streams.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    let mut iters: Vec<std::vec::IntoIter<Record>> =
        streams.into_iter().map(Vec::into_iter).collect();
    let mut heads: Vec<Option<Record>> = Vec::with_capacity(iters.len());
    let mut last_time: Vec<u64> = vec![0; iters.len()];
    let mut heap = BinaryHeap::new();
    for (i, it) in iters.iter_mut().enumerate() {
        let head = it.next();
        if let Some(r) = &head {
            let t = r.time().unwrap_or(0);
            last_time[i] = t;
            heap.push(Reverse((t, r.listener, r.offset, i)));
        }
        heads.push(head);
    }
    while let Some(Reverse((_, _, _, i))) = heap.pop() {
        let (Some(slot), Some(it)) = (heads.get_mut(i), iters.get_mut(i)) else {
            continue;
        };
        if let Some(r) = slot.take() {
            out.push(r);
        }
        if let Some(next) = it.next() {
            let t = next.time().unwrap_or(last_time[i]);
            last_time[i] = t;
            heap.push(Reverse((t, next.listener, next.offset, i)));
            *slot = Some(next);
        }
    }
    out
}

#[cfg(any(test, feature = "build"))]
pub mod testutil {
    //! Synthetic streams, built from the uapi layout in
    //! `include/uapi/linux/perf_event.h` (not recorded from a kernel), for
    //! tests of the parser and of whatever judges its records (feature
    //! `build`).
    use super::*;

    /// A CPU-bound KSYMBOL + BPF_EVENT listener with `sample_id_all`.
    pub fn listener(index: u32, cpu: i32, sample_type: u64) -> ListenerInfo {
        ListenerInfo {
            index,
            cpu,
            sample_type,
            sample_id_all: true,
            ksymbol: true,
            bpf_event: true,
            ring_bytes: 64 * 1024,
            inherit: false,
            pid: None,
            cpus: None,
            side_band: Vec::new(),
            disabled: false,
            backward: false,
            poll_watermark: 0,
        }
    }

    /// The trailer values a test wants; only fields selected by the
    /// listener's sample_type are written.
    #[derive(Clone, Copy, Default)]
    pub struct Tr {
        /// `pid` of `{pid, tid}`.
        pub pid: u32,
        /// `tid` of `{pid, tid}`.
        pub tid: u32,
        /// `time`.
        pub time: u64,
        /// `id`, and `identifier` too.
        pub id: u64,
        /// `stream_id`.
        pub stream_id: u64,
        /// `cpu` of `{cpu, res}`.
        pub cpu: u32,
    }

    /// The `sample_id` trailer `l`'s sample_type selects, with `t`'s values.
    pub fn trailer(l: &ListenerInfo, t: Tr) -> Vec<u8> {
        let mut v = Vec::new();
        if !l.sample_id_all {
            return v;
        }
        let st = l.sample_type;
        if st & PERF_SAMPLE_TID != 0 {
            v.extend_from_slice(&t.pid.to_le_bytes());
            v.extend_from_slice(&t.tid.to_le_bytes());
        }
        if st & PERF_SAMPLE_TIME != 0 {
            v.extend_from_slice(&t.time.to_le_bytes());
        }
        if st & PERF_SAMPLE_ID != 0 {
            v.extend_from_slice(&t.id.to_le_bytes());
        }
        if st & PERF_SAMPLE_STREAM_ID != 0 {
            v.extend_from_slice(&t.stream_id.to_le_bytes());
        }
        if st & PERF_SAMPLE_CPU != 0 {
            v.extend_from_slice(&t.cpu.to_le_bytes());
            v.extend_from_slice(&0u32.to_le_bytes());
        }
        if st & PERF_SAMPLE_IDENTIFIER != 0 {
            v.extend_from_slice(&t.id.to_le_bytes());
        }
        v
    }

    fn with_header(type_: u32, body: Vec<u8>) -> Vec<u8> {
        let size = (body.len() + HEADER_LEN) as u16;
        let mut v = Vec::new();
        v.extend_from_slice(&type_.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&body);
        v
    }

    /// A KSYMBOL as perf_event_ksymbol_output() writes it.
    pub fn ksymbol(
        l: &ListenerInfo,
        addr: u64,
        len: u32,
        ty: u16,
        unregister: bool,
        name: &str,
        t: Tr,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
        let flags = if unregister {
            KSYMBOL_FLAGS_UNREGISTER
        } else {
            0
        };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b.extend_from_slice(&trailer(l, t));
        with_header(PERF_RECORD_KSYMBOL, b)
    }

    /// A BPF_EVENT as perf_event_bpf_output() writes it.
    pub fn bpf_event(l: &ListenerInfo, ty: u16, id: u32, tag: [u8; 8], t: Tr) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&tag);
        b.extend_from_slice(&trailer(l, t));
        with_header(PERF_RECORD_BPF_EVENT, b)
    }

    /// A LOST as __perf_output_begin() writes it.
    pub fn lost(l: &ListenerInfo, id: u64, lost: u64, t: Tr) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&lost.to_le_bytes());
        b.extend_from_slice(&trailer(l, t));
        with_header(PERF_RECORD_LOST, b)
    }

    /// A record of type `type_` with `body` as it is (no trailer).
    pub fn raw(type_: u32, body: Vec<u8>) -> Vec<u8> {
        with_header(type_, body)
    }

    /// A TEXT_POKE as perf_event_text_poke_output() writes it: the bytes
    /// (0xcc here), zero padding to 8, the trailer.
    pub fn text_poke(l: &ListenerInfo, addr: u64, old_len: u16, new_len: u16, t: Tr) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&old_len.to_le_bytes());
        b.extend_from_slice(&new_len.to_le_bytes());
        let n = usize::from(old_len) + usize::from(new_len);
        b.extend(std::iter::repeat_n(0xcc, n));
        b.extend(std::iter::repeat_n(0, (4 + n).div_ceil(8) * 8 - (4 + n)));
        b.extend_from_slice(&trailer(l, t));
        with_header(PERF_RECORD_TEXT_POKE, b)
    }

    /// A FORK or EXIT as perf_event_task_output() writes it: pid, ppid,
    /// tid, ptid, time, the trailer.
    pub fn task(l: &ListenerInfo, exit: bool, (pid, tid): (u32, u32), t: Tr) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, 1, tid, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t.time.to_le_bytes());
        b.extend_from_slice(&trailer(l, t));
        with_header(
            if exit {
                PERF_RECORD_EXIT
            } else {
                PERF_RECORD_FORK
            },
            b,
        )
    }

    /// Sets header.size of the record at `off`.
    pub fn set_size(bytes: &mut [u8], off: usize, size: u16) {
        bytes[off + 6..off + 8].copy_from_slice(&size.to_le_bytes());
    }

    /// xorshift64*: a small deterministic generator for mutation tests and
    /// fuzz-input chunking (not for anything that needs real randomness).
    pub struct XorShift(pub u64);

    impl XorShift {
        /// The next pseudo-random value.
        #[allow(clippy::should_implement_trait)]
        pub fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    const TAG: [u8; 8] = [0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67];
    const TTC: u64 = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
    const IDS: u64 = PERF_SAMPLE_ID | PERF_SAMPLE_IDENTIFIER;

    fn tr(time: u64, cpu: u32) -> Tr {
        Tr {
            pid: 1,
            tid: 2,
            time,
            id: 77,
            stream_id: 0,
            cpu,
        }
    }

    /// Synthetic, built from the uapi layout: KSYMBOL, BPF_EVENT, LOST.
    fn good_stream(l: &ListenerInfo) -> Vec<u8> {
        let mut s = ksymbol(
            l,
            0xffff_ffff_c000_1000,
            0x48,
            KSYM_TYPE_BPF,
            false,
            "bpf_prog_deadbeef01234567_f",
            tr(10, 0),
        );
        s.extend(bpf_event(l, BPF_EVENT_PROG_LOAD, 7, TAG, tr(11, 0)));
        s.extend(lost(l, 77, 3, tr(12, 0)));
        s
    }

    /// FORK / EXIT as perf_event_task_output() writes them: 8 header + 24
    /// body + the trailer; a size that leaves bytes over is refused.
    #[test]
    fn task_records_parse_strictly() {
        let l = listener(0, 0, TTC);
        let t = tr(7, 0);
        let mut s = testutil::task(&l, false, (40, 41), t);
        s.extend(testutil::task(&l, true, (40, 41), t));
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].header.size, 8 + 24 + 24);
        assert_eq!(
            recs[1].body,
            RecordBody::Task {
                exit: true,
                pid: 40,
                ppid: 1,
                tid: 41,
                ptid: 1,
                time: 7
            }
        );
        assert_eq!(recs[1].sample.time, Some(7));
        assert!(
            recs[0].to_string().contains(" FORK pid=40 tid=41"),
            "{}",
            recs[0]
        );
        let mut long = testutil::task(&l, true, (40, 41), t);
        long.extend([0; 8]);
        testutil::set_size(&mut long, 0, 64);
        let e = parse_stream(&l, &long).unwrap_err();
        assert!(e.what.contains("unexplained bytes"), "{}", e.what);
    }

    #[test]
    fn good_records_tid_time_cpu() {
        let l = listener(0, 0, TTC);
        let s = good_stream(&l);
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(recs.len(), 3);
        let r0 = &recs[0];
        assert_eq!(r0.offset, 0);
        assert_eq!(r0.header.type_, PERF_RECORD_KSYMBOL);
        // 8 header + 16 fixed + 32 name ("bpf_prog_" 9 + 16 hex + "_f" 2 = 27 + NUL -> 32) + 24 trailer
        assert_eq!(r0.header.size, 80);
        assert_eq!(
            r0.body,
            RecordBody::Ksymbol {
                addr: 0xffff_ffff_c000_1000,
                len: 0x48,
                ksym_type: KSYM_TYPE_BPF,
                flags: 0,
                name: "bpf_prog_deadbeef01234567_f".into()
            }
        );
        assert_eq!(
            r0.sample,
            SampleId {
                pid: Some(1),
                tid: Some(2),
                time: Some(10),
                cpu: Some(0),
                cpu_res: Some(0),
                ..SampleId::default()
            }
        );
        assert!(r0.is_register());
        assert_eq!(recs[1].offset, 80);
        assert_eq!(recs[1].bpf_event(BPF_EVENT_PROG_LOAD), Some((7, TAG)));
        assert_eq!(recs[1].sample.time, Some(11));
        assert_eq!(recs[2].body, RecordBody::Lost { id: 77, lost: 3 });
        assert_eq!(recs[2].sample.cpu, Some(0));
    }

    #[test]
    fn good_records_id_identifier() {
        let l = listener(3, 1, IDS);
        let s = good_stream(&l);
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(recs.len(), 3);
        for r in &recs {
            assert_eq!(r.listener, 3);
            assert_eq!(r.sample.id, Some(77));
            assert_eq!(r.sample.identifier, Some(77));
            assert_eq!(r.sample.time, None);
            assert_eq!(r.sample.pid, None);
        }
        assert_eq!(recs[1].bpf_event(BPF_EVENT_PROG_LOAD), Some((7, TAG)));
    }

    #[test]
    fn no_sample_id_all_means_no_trailer() {
        let mut l = listener(0, 0, TTC);
        l.sample_id_all = false;
        let s = good_stream(&l);
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(recs[0].header.size, 56);
        assert_eq!(recs[0].sample, SampleId::default());
        // The same bytes read by a listener that expects a trailer are short.
        let l2 = listener(0, 0, TTC);
        assert!(parse_stream(&l2, &s).is_err());
    }

    #[test]
    fn text_poke_parses_with_its_padding_and_trailer() {
        let l = listener(0, 0, TTC);
        // 4 + 0 + 5 bytes: 3 of padding; 4 + 200 + 0: 4.
        let mut s = text_poke(&l, 0xffff_ffff_c000_0000, 0, 5, tr(5, 0));
        s.extend(text_poke(&l, 0xffff_ffff_c000_1000, 200, 0, tr(6, 0)));
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(
            recs[0].body,
            RecordBody::TextPoke {
                addr: 0xffff_ffff_c000_0000,
                old_len: 0,
                new_len: 5
            }
        );
        assert_eq!(recs[1].sample.time, Some(tr(6, 0).time));
        assert_eq!(recs[0].header.size % 8, 0);
        // A non-zero padding byte is refused, as for a KSYMBOL name.
        let mut bad = text_poke(&l, 0xffff_ffff_c000_0000, 0, 5, tr(5, 0));
        bad[HEADER_LEN + 12 + 5] = 1;
        expect_err(&l, &bad, 0, "TEXT_POKE padding byte 0");
        // Lengths that run past the record.
        let mut long = text_poke(&l, 0xffff_ffff_c000_0000, 0, 5, tr(5, 0));
        long[HEADER_LEN + 10] = 200;
        expect_err(&l, &long, 0, "run past the record end");
    }

    /// `rec` grown by `excess` zero bytes, its header.size with it: the
    /// header-size bug's shape (perf_event_header__init_id() adding another
    /// event's id_header_size to the shared record).
    fn grown(mut rec: Vec<u8>, excess: usize) -> Vec<u8> {
        let size = rec.len() + excess;
        rec.resize(size, 0);
        set_size(&mut rec, 0, size as u16);
        rec
    }

    #[test]
    fn an_oversized_zero_padded_record_is_read_past_and_reported() {
        let l = listener(3, 1, TTC);
        let first = grown(
            ksymbol(
                &l,
                0xffff_ffff_c000_1000,
                44,
                1,
                false,
                "bpf_prog_a",
                tr(5, 1),
            ),
            24,
        );
        let mut s = first.clone();
        s.extend(grown(bpf_event(&l, 1, 7, [1; 8], tr(6, 1)), 64));
        s.extend(good_stream(&l));
        // The strict reading stops at the first record.
        let e = expect_err(
            &l,
            &s,
            0,
            "24 unexplained bytes after the sample_id trailer",
        );
        assert!(
            e.what.contains(&format!("header.size is {}", first.len())),
            "{e}"
        );
        // Reading on keeps every record, each trailer read after its body.
        let p = parse_reading_on(&l, &s);
        assert!(p.error.is_none(), "{:?}", p.error);
        assert_eq!(
            p.records.len(),
            2 + parse_stream(&l, &good_stream(&l)).unwrap().len()
        );
        assert_eq!(p.records[0].sample.time, Some(5));
        assert_eq!(p.records[1].sample.time, Some(6));
        assert_eq!(p.records[1].offset, first.len() as u64);
        assert_eq!(
            p.oversized,
            vec![
                Oversized {
                    listener: 3,
                    offset: 0,
                    record_type: PERF_RECORD_KSYMBOL,
                    size: first.len() as u16,
                    body_end: (first.len() - 24 - 24) as u32,
                    trailer_len: 24,
                    excess: 24,
                },
                Oversized {
                    listener: 3,
                    offset: first.len() as u64,
                    record_type: PERF_RECORD_BPF_EVENT,
                    size: (HEADER_LEN + 16 + 24 + 64) as u16,
                    body_end: (HEADER_LEN + 16) as u32,
                    trailer_len: 24,
                    excess: 64,
                },
            ]
        );
    }

    #[test]
    fn excess_bytes_that_are_not_zero_stop_reading() {
        // A record whose size was grown over the next record's bytes: the
        // excess is not padding, so header.size is not trusted.
        let l = listener(0, 0, TTC);
        let a = ksymbol(
            &l,
            0xffff_ffff_c000_1000,
            44,
            1,
            false,
            "bpf_prog_a",
            tr(5, 0),
        );
        let b = bpf_event(&l, 1, 7, [1; 8], tr(6, 0));
        let mut s = a.clone();
        s.extend(&b);
        set_size(&mut s, 0, (a.len() + b.len()) as u16);
        let p = parse_reading_on(&l, &s);
        assert!(p.records.is_empty() && p.oversized.is_empty());
        let e = p.error.expect("a fault");
        assert_eq!(e.offset, 0);
        assert!(
            e.what.contains(&format!("{} unexplained bytes", b.len())),
            "{e}"
        );
        // Any other fault stops it too, after the records before it.
        let mut t = good_stream(&l);
        let n = parse_stream(&l, &t).unwrap().len();
        let at = t.len();
        t.extend(grown(bpf_event(&l, 1, 7, [1; 8], tr(9, 0)), 4));
        let p = parse_reading_on(&l, &t);
        assert_eq!(p.records.len(), n);
        assert!(p.error.unwrap().what.contains("not a multiple of 8"));
        assert_eq!(at as u64, parse_prefix(&l, &t).1.unwrap().offset);
    }

    #[test]
    fn unknown_type_is_not_an_error() {
        let l = listener(0, 0, TTC);
        let mut s = raw(9, vec![0; 16]);
        s.extend(good_stream(&l));
        let recs = parse_stream(&l, &s).unwrap();
        assert_eq!(recs[0].body, RecordBody::Unknown { type_: 9 });
        assert_eq!(recs.len(), 4);
    }

    fn expect_err(l: &ListenerInfo, s: &[u8], offset: u64, needle: &str) -> ParseError {
        let e = parse_stream(l, s).unwrap_err();
        assert_eq!(e.offset, offset, "{e}");
        assert!(e.what.contains(needle), "{e}");
        let shown = e.to_string();
        assert!(shown.contains(&format!("listener {}", l.index)));
        assert!(shown.contains(&e.bytes_hex));
        e
    }

    #[test]
    fn size_not_multiple_of_8() {
        let l = listener(0, 0, TTC);
        let mut s = good_stream(&l);
        set_size(&mut s, 80, 44);
        let e = expect_err(&l, &s, 80, "not a multiple of 8");
        // 64 bytes shown, grouped by 8
        assert_eq!(e.bytes_hex.split(' ').count(), 8);
        assert!(e.bytes_hex.starts_with("12000000"));
    }

    #[test]
    fn size_smaller_than_header() {
        let l = listener(0, 0, TTC);
        let mut s = good_stream(&l);
        set_size(&mut s, 0, 0);
        expect_err(&l, &s, 0, "smaller than the header");
    }

    #[test]
    fn size_beyond_buffer() {
        let l = listener(0, 0, TTC);
        let s = good_stream(&l);
        let cut = &s[..s.len() - 8];
        let e = expect_err(&l, cut, 128, "runs past the end");
        assert!(e.bytes_hex.len() < 64 * 2 + 8);
        // a trailing partial header
        let mut s2 = good_stream(&l);
        s2.extend_from_slice(&[1, 2, 3]);
        expect_err(&l, &s2, s2.len() as u64 - 3, "truncated header");
    }

    #[test]
    fn name_without_nul() {
        // Name bytes fill the name region without a NUL; the trailer that
        // follows has zero bytes, which must not count as the terminator.
        let l = listener(0, 0, TTC);
        let mut body = Vec::new();
        body.extend_from_slice(&0x1000u64.to_le_bytes());
        body.extend_from_slice(&16u32.to_le_bytes());
        body.extend_from_slice(&KSYM_TYPE_BPF.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(b"abcdefgh");
        body.extend(trailer(&l, tr(1, 0)));
        let s = raw(PERF_RECORD_KSYMBOL, body);
        expect_err(&l, &s, 0, "no NUL terminator before the 24-byte");
        // Without sample_id_all: no NUL in the whole record.
        let mut l2 = l.clone();
        l2.sample_id_all = false;
        let mut b2 = s[8..32].to_vec();
        b2.extend_from_slice(b"ijklmnop");
        let s2 = raw(PERF_RECORD_KSYMBOL, b2);
        expect_err(&l2, &s2, 0, "no NUL");
    }

    #[test]
    fn nonzero_padding() {
        let l = listener(0, 0, TTC);
        let mut s = good_stream(&l);
        // name "bpf_prog_deadbeef01234567_f" is 27 bytes at record offset 24;
        // NUL at 51, padding 52..56.
        s[53] = b'x';
        expect_err(&l, &s, 0, "padding byte 2 (record offset 53)");
    }

    #[test]
    fn trailer_longer_than_header_size() {
        // The record's bytes carry a TID|TIME|CPU trailer (24 bytes), but
        // the header says the record ends 8 bytes early: the trailer would
        // extend beyond header.size.
        let l = listener(0, 0, TTC);
        let mut s = bpf_event(&l, BPF_EVENT_PROG_LOAD, 1, TAG, tr(5, 0));
        let size = s.len() as u16;
        set_size(&mut s, 0, size - 8);
        s.truncate(size as usize - 8);
        expect_err(&l, &s, 0, "does not fit");
    }

    #[test]
    fn trailer_shorter_than_header_size() {
        // header.size claims 8 more bytes than body + trailer.
        let l = listener(0, 0, TTC);
        let mut s = lost(&l, 1, 0, tr(5, 0));
        s.extend_from_slice(&[0; 8]);
        let size = s.len() as u16;
        set_size(&mut s, 0, size);
        expect_err(&l, &s, 0, "8 unexplained bytes");
        // and for KSYMBOL, after the padded name
        let mut k = ksymbol(&l, 1, 2, KSYM_TYPE_OOL, false, "x", tr(5, 0));
        k.extend_from_slice(&[0; 16]);
        let size = k.len() as u16;
        set_size(&mut k, 0, size);
        expect_err(&l, &k, 0, "16 unexplained bytes");
    }

    #[test]
    fn merge_orders_by_time_then_listener_then_offset() {
        let l0 = listener(0, 0, TTC);
        let l1 = listener(1, 1, TTC);
        let mut a = lost(&l0, 1, 0, tr(5, 0));
        a.extend(lost(&l0, 1, 0, tr(20, 0)));
        let mut b = lost(&l1, 2, 0, tr(5, 1));
        b.extend(lost(&l1, 2, 0, tr(10, 1)));
        let ra = parse_stream(&l0, &a).unwrap();
        let rb = parse_stream(&l1, &b).unwrap();
        let m = merge_by_time(vec![rb, ra]);
        let got: Vec<(u32, u64)> = m.iter().map(|r| (r.listener, r.time().unwrap())).collect();
        assert_eq!(got, vec![(0, 5), (1, 5), (1, 10), (0, 20)]);
    }

    #[test]
    fn merge_keeps_stream_order_when_time_goes_back() {
        let l0 = listener(0, 0, TTC);
        let mut a = lost(&l0, 1, 0, tr(30, 0));
        a.extend(lost(&l0, 1, 1, tr(5, 0)));
        let ra = parse_stream(&l0, &a).unwrap();
        let m = merge_by_time(vec![ra]);
        assert_eq!(m[0].time(), Some(30));
        assert_eq!(m[1].time(), Some(5));
    }

    #[test]
    fn sample_type_symbolic() {
        assert_eq!(sample_type_names(TTC), "TID|TIME|CPU");
        assert_eq!(
            sample_type_names(IDS | (1 << 40)),
            "ID|IDENTIFIER|0x10000000000"
        );
        assert_eq!(sample_type_names(0), "0");
    }

    use crate::testutil::XorShift;

    #[test]
    fn never_panics_on_prefixes_and_mutations() {
        let listeners = [
            listener(0, 0, TTC),
            listener(1, 1, IDS | PERF_SAMPLE_STREAM_ID),
            ListenerInfo {
                sample_id_all: false,
                ..listener(2, 0, TTC)
            },
        ];
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut ok = 0usize;
        for l in &listeners {
            let mut good = good_stream(l);
            good.extend(ksymbol(l, 0x2000, 8, KSYM_TYPE_OOL, true, "", tr(13, 0)));
            good.extend(raw(21, vec![0; 8]));
            for n in 0..=good.len() {
                let _ = parse_stream(l, &good[..n]);
            }
            for _ in 0..35_000 {
                let mut m = good.clone();
                let edits = 1 + rng.next() % 4;
                for _ in 0..edits {
                    let pos = (rng.next() % m.len() as u64) as usize;
                    match rng.next() % 4 {
                        0 => m[pos] ^= 1 << (rng.next() % 8),
                        1 => m[pos] = rng.next() as u8,
                        2 => {
                            // size fields and padding are the interesting bits
                            let off = pos & !7;
                            if off + 8 <= m.len() {
                                m[off + 6] = rng.next() as u8;
                                m[off + 7] = (rng.next() % 3) as u8;
                            }
                        }
                        _ => {
                            let cut = (rng.next() % (m.len() as u64 + 1)) as usize;
                            m.truncate(cut);
                            if m.is_empty() {
                                m.push(0);
                            }
                        }
                    }
                }
                let (recs, err) = parse_prefix(l, &m);
                if err.is_none() {
                    ok += 1;
                }
                for r in &recs {
                    let _ = r.to_string();
                }
                if let Some(e) = err {
                    let _ = e.to_string();
                }
            }
        }
        // Some mutations are harmless (field values), most are not.
        assert!(ok > 0);
    }
}
