//! The real perf as a second, independent reader of the side-band records.
//!
//! A `perf-tool` scenario runs `perf record` in the guest next to kloop's
//! own listeners; the agent sends the text of `perf report -D --header` on
//! its data as a `PerfScript` message. That text is the only perf output
//! with every field of every record: the summary line perf prints for a
//! BPF_EVENT has no tag, but `-D` also dumps each record's raw bytes, and
//! `--header` names the events' `sample_type`, which says how to read the
//! `sample_id` trailer.
//!
//! [`parse`] reads that text strictly. [`check`] then holds perf's view to
//! three others, under the rule [`RULE`] (`second-reader`):
//!
//! 1. **perf's parse against kloop's.** Every KSYMBOL / BPF_EVENT / LOST raw
//!    dump is parsed by kloop's record parser ([`kloop_records`]) with
//!    perf's `sample_type`; the fields must equal the ones perf printed
//!    (addr, len, type, flags, name; type, flags, id; cpu and time).
//! 2. **Synthesis against the facts.** At start perf walks
//!    `BPF_PROG_GET_NEXT_ID` and writes, per program alive, one KSYMBOL per
//!    JITed function and one PROG_LOAD, all with time 0 (perf zeroes the
//!    trailer). Which programs are alive then follows from the plan: loaded
//!    before `perf-record-start` and not unloaded (with a `wait-unloaded`)
//!    before it. Their records must be exactly those, in `BPF_PROG_GET_NEXT_ID`
//!    order, with `jited_ksyms` / `jited_func_lens` / the kernel's own
//!    kallsyms name / id / tag from the program's facts. A program perf
//!    synthesises that the agent did not load must be one kloop saw in
//!    `/proc/kallsyms` before recording (same address and name).
//! 3. **Recording against the kernel's and kloop's records.** The agent
//!    enables perf's events through perf's control FIFO and waits for the
//!    ack before its next step, and stops perf only after a
//!    `wait-unloaded`, so the records perf must have seen are exactly those
//!    of the loads and unloads the plan ran between the two steps: per
//!    function a register (unregister) with the facts' address, length and
//!    kallsyms name, then PROG_LOAD (PROG_UNLOAD) with the facts' id and
//!    tag. Nothing else may appear. Each record perf recorded must also be
//!    the twin of a record kloop's CPU-wide listener on the same CPU
//!    received — same fields, same relative order — and lie in time between
//!    that twin's neighbours in kloop's ring: the kernel writes one record to
//!    every listening event of the CPU in one preemption-disabled pass,
//!    reading the clock once per event, so no other record of that CPU can
//!    fall between the two copies.
//!
//! Where kloop's own stream of a CPU stops at a parse error (rule `parse`,
//! already a violation), records perf saw on that CPU after the last record
//! kloop parsed are not twinned; [`normalise`] says how many.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use kloop_protocol::{ListenerInfo, ProgFacts, Step};
use thiserror::Error;

use crate::judge::check::{Analysis, Violation};
use crate::judge::evidence::RunEvidence;
use crate::judge::normalise::mask_tags;
use kloop_records::{
    self, Record, RecordContent, BPF_EVENT_PROG_LOAD, BPF_EVENT_PROG_UNLOAD,
    KSYMBOL_FLAGS_UNREGISTER, KSYM_TYPE_BPF, PERF_RECORD_BPF_EVENT, PERF_RECORD_KSYMBOL,
    PERF_RECORD_LOST, PERF_SAMPLE_CPU, PERF_SAMPLE_TIME,
};

/// The rule this module checks.
pub const RULE: &str = "second-reader";

/// Every rule this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[RULE];

/// At most this many violations of one kind are spelled out.
const MAX_PER_KIND: usize = 8;

/// A `perf report -D --header` text that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("perf report -D output, line {line}: {what}")]
pub struct PerfTextError {
    pub line: usize,
    pub what: String,
}

/// What perf printed after `PERF_RECORD_<NAME>` on a summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Printed {
    Ksymbol(RecordContent),
    BpfEvent(RecordContent),
    /// Any other record type: its name and the rest of the line.
    Other {
        name: String,
        rest: String,
    },
}

/// One summary line: `<cpu> <time> 0x<offset> [0x<size>]: PERF_RECORD_…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The numbers before the offset (`cpu`, `time` when the events sample
    /// them; `-1 -1` without `sample_id_all`).
    pub stamps: Vec<i64>,
    pub printed: Printed,
    /// The text line, for messages.
    pub line: String,
}

/// One record of perf's dump: its raw bytes and perf's summary of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpEvent {
    /// Offset in perf.data (pairs the raw dump with its summary line).
    pub offset: u64,
    pub size: u32,
    pub type_: u32,
    pub raw: Vec<u8>,
    pub summary: Option<Summary>,
}

/// A parsed `perf report -D --header` text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfDump {
    pub perf_version: Option<String>,
    pub os_release: Option<String>,
    /// `sample_type` of each `# event :` line.
    pub sample_types: Vec<u64>,
    /// Whether every event has `sample_id_all = 1`.
    pub sample_id_all: bool,
    /// In the order perf delivered them (time order; synthesised first).
    pub events: Vec<DumpEvent>,
    /// `Aggregated stats:` counts by record name.
    pub stats: BTreeMap<String, u64>,
}

fn err(line: usize, what: impl Into<String>) -> PerfTextError {
    PerfTextError {
        line: line + 1,
        what: what.into(),
    }
}

fn hex_u64(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// `sample_type = IP|TID|TIME|CPU|PERIOD` back into bits.
fn sample_type_bits(names: &str) -> Option<u64> {
    let mut bits = 0u64;
    for name in names.split('|').map(str::trim) {
        let bit = (0..64).find(|b| kloop_records::sample_type_names(1u64 << b) == name)?;
        bits |= 1u64 << bit;
    }
    Some(bits)
}

/// `.  0010:  2d 00 00 00 …  ascii`: the bytes of one hex dump line.
fn hex_line(line: &str) -> Option<Vec<u8>> {
    let rest = line.strip_prefix('.')?.trim_start();
    let (off, data) = rest.split_once(": ")?;
    if off.len() != 4 || !off.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = Vec::new();
    let bytes = data.as_bytes();
    // Each byte is " hh"; missing bytes of a short line are "   ", then two
    // spaces and the ASCII column.
    let mut pos = 0;
    while out.len() < 16 && pos + 3 <= bytes.len() {
        let t = &bytes[pos..pos + 3];
        if t[0] != b' ' || !t[1].is_ascii_hexdigit() || !t[2].is_ascii_hexdigit() {
            break;
        }
        let s = std::str::from_utf8(&t[1..]).ok()?;
        out.push(u8::from_str_radix(s, 16).ok()?);
        pos += 3;
    }
    Some(out)
}

fn parse_printed(name: &str, rest: &str, line: usize) -> Result<Printed, PerfTextError> {
    let toks: Vec<&str> = rest.split_whitespace().collect();
    match name {
        // " addr %llx len %u type %u flags 0x%x name %s"
        "KSYMBOL" => {
            let bad = || err(line, format!("unreadable KSYMBOL summary `{rest}`"));
            if toks.len() < 9
                || toks[0] != "addr"
                || toks[2] != "len"
                || toks[4] != "type"
                || toks[6] != "flags"
                || toks[8] != "name"
            {
                return Err(bad());
            }
            let name_at = rest.find(" name ").ok_or_else(bad)? + " name ".len();
            Ok(Printed::Ksymbol(RecordContent::Ksymbol {
                addr: u64::from_str_radix(toks[1], 16).map_err(|_| bad())?,
                len: toks[3].parse().map_err(|_| bad())?,
                ksym_type: toks[5].parse().map_err(|_| bad())?,
                flags: toks[7]
                    .strip_prefix("0x")
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
                    .ok_or_else(bad)?,
                name: rest[name_at..].trim_end().to_string(),
            }))
        }
        // " type %u, flags %u, id %u"
        "BPF_EVENT" => {
            let bad = || err(line, format!("unreadable BPF_EVENT summary `{rest}`"));
            if toks.len() != 6 || toks[0] != "type" || toks[2] != "flags" || toks[4] != "id" {
                return Err(bad());
            }
            Ok(Printed::BpfEvent(RecordContent::BpfEvent {
                event_type: toks[1].trim_end_matches(',').parse().map_err(|_| bad())?,
                flags: toks[3].trim_end_matches(',').parse().map_err(|_| bad())?,
                id: toks[5].parse().map_err(|_| bad())?,
                tag: None,
            }))
        }
        _ => Ok(Printed::Other {
            name: name.to_string(),
            rest: rest.trim().to_string(),
        }),
    }
}

/// Parses `perf report -D --header` output; see the module docs.
pub fn parse(text: &str) -> Result<PerfDump, PerfTextError> {
    let mut dump = PerfDump {
        sample_id_all: true,
        ..Default::default()
    };
    let mut any_event_line = false;
    // Raw dumps by file offset, summaries by file offset.
    let mut raws: Vec<DumpEvent> = Vec::new();
    let mut summaries: BTreeMap<u64, Summary> = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    let mut in_stats = false;
    while i < lines.len() {
        let line = lines[i];
        if let Some(h) = line.strip_prefix("# ") {
            if let Some(v) = h.strip_prefix("perf version : ") {
                dump.perf_version = Some(v.trim().to_string());
            } else if let Some(v) = h.strip_prefix("os release : ") {
                dump.os_release = Some(v.trim().to_string());
            } else if let Some(v) = h.strip_prefix("event : ") {
                any_event_line = true;
                let st = v
                    .split(", ")
                    .find_map(|kv| kv.strip_prefix("sample_type = "))
                    .ok_or_else(|| err(i, format!("event line without sample_type: `{line}`")))?;
                let bits = sample_type_bits(st)
                    .ok_or_else(|| err(i, format!("unknown sample_type names `{st}`")))?;
                dump.sample_types.push(bits);
                if !v.split(", ").any(|kv| kv == "sample_id_all = 1") {
                    dump.sample_id_all = false;
                }
            }
            i += 1;
            continue;
        }
        if line == "Aggregated stats:" {
            in_stats = true;
            i += 1;
            continue;
        }
        if in_stats {
            // "         KSYMBOL events:         12  (46.2%)"
            if let Some((name, rest)) = line.trim().split_once(" events:") {
                let n = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| err(i, format!("unreadable stats line `{line}`")))?;
                dump.stats.insert(name.trim().to_string(), n);
            }
            i += 1;
            continue;
        }
        // "0x1e8@/tmp/perf.data [0x58]: event: 17"
        if let Some((off, rest)) = line.split_once('@') {
            if let (Some(offset), Some((size, ty))) = (
                hex_u64(off),
                rest.split_once(" [")
                    .and_then(|(_, r)| r.split_once("]: event: ")),
            ) {
                let size = hex_u64(size)
                    .and_then(|s| u32::try_from(s).ok())
                    .ok_or_else(|| err(i, format!("bad size in `{line}`")))?;
                let type_: u32 = ty
                    .trim()
                    .parse()
                    .map_err(|_| err(i, format!("bad event type in `{line}`")))?;
                let mut raw = Vec::new();
                let mut declared = None;
                let mut j = i + 1;
                while j < lines.len() && lines[j].starts_with('.') {
                    let l = lines[j];
                    if let Some(n) = l
                        .strip_prefix(". ... raw event: size ")
                        .and_then(|r| r.strip_suffix(" bytes"))
                    {
                        declared = Some(
                            n.parse::<usize>()
                                .map_err(|_| err(j, format!("bad raw size `{l}`")))?,
                        );
                    } else if l.trim() != "." {
                        let b = hex_line(l)
                            .ok_or_else(|| err(j, format!("unreadable hex dump line `{l}`")))?;
                        raw.extend(b);
                    }
                    j += 1;
                }
                if declared != Some(raw.len()) || raw.len() != size as usize {
                    return Err(err(
                        i,
                        format!(
                            "raw dump of the record at {offset:#x} has {} bytes; it declares {declared:?} and the header says {size}",
                            raw.len()
                        ),
                    ));
                }
                raws.push(DumpEvent {
                    offset,
                    size,
                    type_,
                    raw,
                    summary: None,
                });
                i = j;
                continue;
            }
        }
        // "<cpu> <time> 0x400 [0x60]: PERF_RECORD_KSYMBOL addr …"
        if let Some(pos) = line.find(": PERF_RECORD_") {
            let head = &line[..pos];
            let tail = &line[pos + ": PERF_RECORD_".len()..];
            let toks: Vec<&str> = head.split_whitespace().collect();
            let n = toks.len();
            if n >= 2 && toks[n - 1].starts_with('[') {
                if let Some(offset) = hex_u64(toks[n - 2]) {
                    let stamps = toks[..n - 2]
                        .iter()
                        .map(|t| t.parse::<i64>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| err(i, format!("bad cpu/time in `{line}`")))?;
                    let (name, rest) = tail
                        .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                        .map(|p| tail.split_at(p))
                        .unwrap_or((tail, ""));
                    let printed = parse_printed(name, rest, i)?;
                    if summaries
                        .insert(
                            offset,
                            Summary {
                                stamps,
                                printed,
                                line: line.to_string(),
                            },
                        )
                        .is_some()
                    {
                        return Err(err(i, format!("second summary for offset {offset:#x}")));
                    }
                }
            }
        }
        i += 1;
    }
    if !any_event_line {
        return Err(err(
            0,
            "no `# event :` header line (was perf report run with --header?)",
        ));
    }
    for mut e in raws {
        e.summary = summaries.remove(&e.offset);
        if e.summary.is_none() && matches!(e.type_, PERF_RECORD_KSYMBOL | PERF_RECORD_BPF_EVENT) {
            return Err(err(
                0,
                format!(
                    "record at {:#x} (type {}) has a raw dump but no summary line",
                    e.offset, e.type_
                ),
            ));
        }
        dump.events.push(e);
    }
    if let Some((off, s)) = summaries
        .into_iter()
        .find(|(_, s)| matches!(s.printed, Printed::Ksymbol(_) | Printed::BpfEvent(_)))
    {
        return Err(err(
            0,
            format!("summary without a raw dump at {off:#x}: `{}`", s.line),
        ));
    }
    Ok(dump)
}

/// A side-band record of perf's, read both ways.
#[derive(Debug, Clone)]
struct PerfRecord {
    offset: u64,
    /// What perf printed (with the tag from the raw bytes when parsed).
    side: RecordContent,
    cpu: Option<u32>,
    time: Option<u64>,
    line: String,
}

impl PerfRecord {
    fn synthesised(&self) -> bool {
        self.time == Some(0)
    }
}

impl fmt::Display for PerfRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "perf@{:#x} `{}`", self.offset, self.line.trim())?;
        if let RecordContent::BpfEvent { tag: Some(t), .. } = &self.side {
            write!(f, " (tag {} from the raw bytes)", hex::encode(t))?;
        }
        Ok(())
    }
}

/// Where the plan put a program's load and unload relative to perf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Before,
    During,
    After,
}

#[derive(Debug, Clone)]
struct Life<'a> {
    facts: &'a ProgFacts,
    load: Phase,
    unload: Option<Phase>,
}

/// Load and unload phases of every program the agent loaded, from the plan.
fn lives<'a>(steps: &[Step], progs: &'a [ProgFacts], out: &mut Vec<String>) -> Vec<Life<'a>> {
    let mut phase = Phase::Before;
    let mut used = vec![false; progs.len()];
    let mut live: BTreeMap<String, usize> = BTreeMap::new();
    let mut lives: Vec<Life<'a>> = Vec::new();
    // Unloads not yet confirmed by a wait-unloaded (their records may come later).
    let mut pending: Vec<usize> = Vec::new();
    for step in steps {
        match step {
            Step::PerfRecordStart { .. } | Step::PerfRecordStop => {
                if !pending.is_empty() {
                    let labels: Vec<&str> = pending
                        .iter()
                        .map(|k| lives[*k].facts.label.as_str())
                        .collect();
                    out.push(format!(
                        "the plan unloads {labels:?} and reaches {} without a wait-unloaded in between: \
                         the kernel may emit their unload records on either side of it, so the comparison \
                         cannot say where they belong (add a wait-unloaded step)",
                        if matches!(step, Step::PerfRecordStart { .. }) { "perf-record-start" } else { "perf-record-stop" }
                    ));
                    pending.clear();
                }
                phase = if matches!(step, Step::PerfRecordStart { .. }) {
                    Phase::During
                } else {
                    Phase::After
                };
            }
            Step::Load { label, .. } => {
                let Some(k) = progs
                    .iter()
                    .enumerate()
                    .position(|(k, f)| !used[k] && f.label == *label)
                else {
                    continue;
                };
                used[k] = true;
                live.insert(label.clone(), lives.len());
                lives.push(Life {
                    facts: &progs[k],
                    load: phase,
                    unload: None,
                });
            }
            Step::Unload { label } => {
                if let Some(l) = live.remove(label) {
                    lives[l].unload = Some(phase);
                    pending.push(l);
                }
            }
            Step::WaitUnloaded { .. } => pending.clear(),
            _ => {}
        }
    }
    lives
}

/// The kernel's name for function `fi` of a program: its `/proc/kallsyms`
/// line at that address.
fn kernel_name(f: &ProgFacts, fi: usize) -> Option<String> {
    let addr = f.jited_ksyms.get(fi)?;
    f.kallsyms
        .iter()
        .find(|e| e.addr == *addr)
        .map(|e| e.name.clone())
}

fn expected_records(f: &ProgFacts, unregister: bool) -> Vec<RecordContent> {
    let mut out = Vec::new();
    for (fi, (addr, len)) in f.jited_ksyms.iter().zip(&f.jited_func_lens).enumerate() {
        out.push(RecordContent::Ksymbol {
            addr: *addr,
            len: *len,
            ksym_type: KSYM_TYPE_BPF,
            flags: if unregister {
                KSYMBOL_FLAGS_UNREGISTER
            } else {
                0
            },
            name: kernel_name(f, fi).unwrap_or_else(|| "(not in /proc/kallsyms)".into()),
        });
    }
    out.push(RecordContent::BpfEvent {
        event_type: if unregister {
            BPF_EVENT_PROG_UNLOAD
        } else {
            BPF_EVENT_PROG_LOAD
        },
        flags: 0,
        id: f.id,
        tag: Some(f.tag),
    });
    out
}

fn push_capped(out: &mut Vec<Violation>, msgs: Vec<String>, what: &str) {
    let n = msgs.len();
    for m in msgs.into_iter().take(MAX_PER_KIND) {
        out.push(Violation {
            rule: RULE,
            message: m,
        });
    }
    if n > MAX_PER_KIND {
        out.push(Violation {
            rule: RULE,
            message: format!("... and {} more {what}", n - MAX_PER_KIND),
        });
    }
}

/// Reads perf's side-band records, comparing its parse with kloop's.
fn perf_records(dump: &PerfDump, bad: &mut Vec<String>) -> Vec<PerfRecord> {
    let mut out = Vec::new();
    let sample_type = dump.sample_types.first().copied().unwrap_or(0);
    let listener = ListenerInfo {
        index: u32::MAX,
        cpu: -1,
        sample_type,
        sample_id_all: dump.sample_id_all,
        ksymbol: true,
        bpf_event: true,
        ring_bytes: 0,
    };
    for e in &dump.events {
        if !matches!(
            e.type_,
            PERF_RECORD_KSYMBOL | PERF_RECORD_BPF_EVENT | PERF_RECORD_LOST
        ) {
            continue;
        }
        let parsed = match kloop_records::parse_stream(&listener, &e.raw) {
            Ok(mut v) if v.len() == 1 => v.pop(),
            Ok(v) => {
                bad.push(format!(
                    "perf@{:#x}: kloop's parser reads {} records in perf's raw dump of one",
                    e.offset,
                    v.len()
                ));
                None
            }
            Err(pe) => {
                bad.push(format!(
                    "perf@{:#x}: kloop's parser rejects the record perf wrote: {pe}",
                    e.offset
                ));
                None
            }
        };
        let Some(summary) = &e.summary else {
            continue;
        };
        if e.type_ == PERF_RECORD_LOST {
            bad.push(format!(
                "perf lost records: `{}`{}",
                summary.line,
                parsed
                    .as_ref()
                    .map(|r| format!(" (kloop reads {r})"))
                    .unwrap_or_default()
            ));
            continue;
        }
        let (Printed::Ksymbol(printed) | Printed::BpfEvent(printed)) = &summary.printed else {
            bad.push(format!(
                "perf@{:#x}: raw type {} but perf printed `{}`",
                e.offset, e.type_, summary.line
            ));
            continue;
        };
        // perf prints the cpu first, then the time, when the events sample them.
        let mut stamps = summary.stamps.iter().copied();
        let cpu = if sample_type & PERF_SAMPLE_CPU != 0 && dump.sample_id_all {
            stamps.next().and_then(|c| u32::try_from(c).ok())
        } else {
            None
        };
        let time = if sample_type & PERF_SAMPLE_TIME != 0 && dump.sample_id_all {
            stamps.next().and_then(|t| u64::try_from(t).ok())
        } else {
            None
        };
        let mut side = printed.clone();
        if let Some(r) = &parsed {
            let ours = RecordContent::of_record(r);
            let mut comparable = ours.clone();
            if let Some(RecordContent::BpfEvent { tag, .. }) = comparable.as_mut() {
                *tag = None;
            }
            if comparable.as_ref() != Some(printed) {
                bad.push(format!(
                    "perf@{:#x}: perf printed `{}` but kloop's parser reads its raw bytes as {}",
                    e.offset,
                    summary.line.trim(),
                    r
                ));
            } else if let Some(s) = ours {
                side = s;
            }
            if cpu.is_some() && r.sample.cpu != cpu {
                bad.push(format!(
                    "perf@{:#x}: perf printed cpu {cpu:?}, the trailer says {:?} ({r})",
                    e.offset, r.sample.cpu
                ));
            }
            if time.is_some() && r.sample.time != time {
                bad.push(format!(
                    "perf@{:#x}: perf printed time {time:?}, the trailer says {:?} ({r})",
                    e.offset, r.sample.time
                ));
            }
        }
        out.push(PerfRecord {
            offset: e.offset,
            side,
            cpu,
            time,
            line: summary.line.clone(),
        });
    }
    out
}

/// The second-reader comparison for one run; see the module docs. `steps`
/// is the plan the agent ran.
pub fn check(ev: &RunEvidence, analysis: &Analysis, steps: &[Step]) -> Vec<Violation> {
    let mut v = Vec::new();
    let runs_perf = steps
        .iter()
        .any(|s| matches!(s, Step::PerfRecordStart { .. }));
    if !runs_perf && ev.perf_scripts.is_empty() {
        return v;
    }
    let script = match ev.perf_scripts.as_slice() {
        [one] => one,
        [] => {
            v.push(Violation {
                rule: RULE,
                message: "the plan runs perf but the agent sent no perf output".into(),
            });
            return v;
        }
        more => {
            v.push(Violation {
                rule: RULE,
                message: format!(
                    "{} perf outputs; a plan may record with perf once",
                    more.len()
                ),
            });
            return v;
        }
    };
    let dump = match parse(&script.text) {
        Ok(d) => d,
        Err(e) => {
            v.push(Violation {
                rule: RULE,
                message: format!("{e} (command: {})", script.command),
            });
            return v;
        }
    };
    let distinct: BTreeSet<u64> = dump.sample_types.iter().copied().collect();
    if distinct.len() != 1 {
        v.push(Violation {
            rule: RULE,
            message: format!(
                "perf's events have sample_types {:?}: one side-band record cannot be assigned to one of them",
                distinct.iter().map(|s| kloop_records::sample_type_names(*s)).collect::<Vec<_>>()
            ),
        });
        return v;
    }

    let mut parse_bad = Vec::new();
    let recs = perf_records(&dump, &mut parse_bad);
    push_capped(&mut v, parse_bad, "disagreements between perf and kloop");

    let mut plan_bad = Vec::new();
    let lives = lives(steps, &ev.progs, &mut plan_bad);
    push_capped(&mut v, plan_bad, "plan problems");

    // 2. Synthesis.
    let synth: Vec<&PerfRecord> = recs.iter().filter(|r| r.synthesised()).collect();
    let mut alive: Vec<&Life> = lives
        .iter()
        .filter(|l| l.load == Phase::Before && l.unload != Some(Phase::Before))
        .collect();
    alive.sort_by_key(|l| l.facts.id);
    let mut expected: Vec<(RecordContent, String)> = Vec::new();
    for l in &alive {
        for s in expected_records(l.facts, false) {
            expected.push((s, l.facts.label.clone()));
        }
    }
    // Records of programs the agent did not load (by id, or by an address
    // none of its programs has) are checked against /proc/kallsyms instead.
    let ours = |r: &PerfRecord| match &r.side {
        RecordContent::BpfEvent { id, .. } => ev.progs.iter().any(|f| f.id == *id),
        RecordContent::Ksymbol { addr, .. } => {
            ev.progs.iter().any(|f| f.jited_ksyms.contains(addr))
        }
    };
    let mut synth_bad = Vec::new();
    let (mine, foreign): (Vec<&PerfRecord>, Vec<&PerfRecord>) =
        synth.iter().copied().partition(|r| ours(r));
    for i in 0..mine.len().max(expected.len()) {
        match (mine.get(i), expected.get(i)) {
            (Some(r), Some((e, _))) if same(e, &r.side) => {}
            (Some(r), Some((e, label))) => synth_bad.push(format!(
                "perf synthesised {r} where the kernel's facts for {label:?} (alive when perf started) give {e}"
            )),
            (Some(r), None) => synth_bad.push(format!(
                "perf synthesised {r}, beyond the records of the programs alive when it started"
            )),
            (None, Some((e, label))) => synth_bad.push(format!(
                "perf did not synthesise {e} of {label:?}, which was alive when perf started"
            )),
            (None, None) => {}
        }
    }
    for r in &foreign {
        let known = match &r.side {
            RecordContent::Ksymbol { addr, name, .. } => ev
                .initial_kallsyms
                .iter()
                .any(|e| e.addr == *addr && e.name == *name),
            // Its symbols are checked on their own; its id has no other witness.
            RecordContent::BpfEvent { .. } => true,
        };
        if !known {
            synth_bad.push(format!(
                "perf synthesised {r} for a program the agent did not load and kloop did not see in /proc/kallsyms before recording"
            ));
        }
    }
    push_capped(&mut v, synth_bad, "synthesis differences");

    // 3. Recording.
    let recorded: Vec<&PerfRecord> = recs.iter().filter(|r| !r.synthesised()).collect();
    let mut want: Vec<(RecordContent, String)> = Vec::new();
    for l in &lives {
        if l.load == Phase::During {
            for s in expected_records(l.facts, false) {
                want.push((s, l.facts.label.clone()));
            }
        }
        if l.unload == Some(Phase::During) {
            for s in expected_records(l.facts, true) {
                want.push((s, l.facts.label.clone()));
            }
        }
    }
    let mut rec_bad = Vec::new();
    let mut taken = vec![false; want.len()];
    for r in &recorded {
        match want
            .iter()
            .enumerate()
            .position(|(i, (s, _))| !taken[i] && same(s, &r.side))
        {
            Some(i) => taken[i] = true,
            None => rec_bad.push(format!(
                "perf recorded {r}, which no load or unload the plan ran while perf recorded explains"
            )),
        }
    }
    for (i, (s, label)) in want.iter().enumerate() {
        if !taken[i] {
            rec_bad.push(format!(
                "perf did not record {s} of {label:?}, loaded or unloaded while perf recorded"
            ));
        }
    }
    push_capped(&mut v, rec_bad, "recording differences");

    // Twins in kloop's own rings.
    let twin_bad = twins(ev, analysis, &recorded).violations;
    push_capped(&mut v, twin_bad, "twin mismatches");
    v
}

/// Equal content; a tag missing on either side is not compared.
fn same(a: &RecordContent, b: &RecordContent) -> bool {
    match (a, b) {
        (
            RecordContent::BpfEvent {
                event_type: t1,
                flags: f1,
                id: i1,
                tag: g1,
            },
            RecordContent::BpfEvent {
                event_type: t2,
                flags: f2,
                id: i2,
                tag: g2,
            },
        ) => t1 == t2 && f1 == f2 && i1 == i2 && (g1.is_none() || g2.is_none() || g1 == g2),
        _ => a == b,
    }
}

struct TwinResult {
    violations: Vec<String>,
    /// Per CPU: perf records not twinned because kloop's stream of that CPU
    /// stopped at a parse error before them.
    untwinned_after_parse_error: BTreeMap<u32, usize>,
}

/// Pairs each record perf recorded with its copy in kloop's first CPU-wide
/// listener set; see the module docs.
fn twins(ev: &RunEvidence, analysis: &Analysis, recorded: &[&PerfRecord]) -> TwinResult {
    let mut out = TwinResult {
        violations: Vec::new(),
        untwinned_after_parse_error: BTreeMap::new(),
    };
    let Some(set) = analysis.sets.first() else {
        if !recorded.is_empty() {
            out.violations.push(
                "perf recorded side-band records but kloop had no CPU-wide listener to compare them with"
                    .into(),
            );
        }
        return out;
    };
    let mut by_cpu: BTreeMap<u32, (u32, &[Record], bool)> = BTreeMap::new();
    for idx in set {
        let Some(l) = ev.listeners.iter().find(|l| l.index == *idx) else {
            continue;
        };
        let Ok(cpu) = u32::try_from(l.cpu) else {
            continue;
        };
        let recs = analysis
            .records_per_listener
            .get(idx)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // The analysis keeps the records before a parse error; a stream that
        // holds more bytes than those records did not parse to its end.
        let bytes = ev.streams.get(idx).map(Vec::len).unwrap_or(0) as u64;
        let parsed_to = recs
            .last()
            .map(|r| r.offset + u64::from(r.header.size))
            .unwrap_or(0);
        by_cpu.insert(cpu, (*idx, recs, parsed_to < bytes));
    }
    let mut used: BTreeSet<(u32, usize)> = BTreeSet::new();
    let mut last_index: BTreeMap<u32, usize> = BTreeMap::new();
    for r in recorded {
        let Some(cpu) = r.cpu else {
            out.violations.push(format!(
                "{r}: perf's events do not sample the cpu, so its record cannot be matched to kloop's listener of that CPU"
            ));
            continue;
        };
        let Some((idx, krecs, truncated)) = by_cpu.get(&cpu) else {
            out.violations.push(format!(
                "{r}: kloop had no listener on cpu {cpu} in its first CPU-wide set"
            ));
            continue;
        };
        let found = krecs.iter().enumerate().position(|(j, k)| {
            !used.contains(&(*idx, j))
                && RecordContent::of_record(k).is_some_and(|s| same(&s, &r.side))
        });
        let Some(j) = found else {
            if *truncated {
                *out.untwinned_after_parse_error.entry(cpu).or_default() += 1;
            } else {
                out.violations.push(format!(
                    "{r}: kloop's listener L{idx} on cpu {cpu} has no record with these fields"
                ));
            }
            continue;
        };
        used.insert((*idx, j));
        let k = &krecs[j];
        if let Some(prev) = last_index.insert(cpu, j) {
            if j < prev {
                out.violations.push(format!(
                    "{r} comes after {} in perf's stream but its twin {k} comes before it in kloop's ring",
                    krecs[prev]
                ));
            }
        }
        if let Some(t) = r.time {
            let lo = j
                .checked_sub(1)
                .and_then(|p| krecs.get(p))
                .and_then(Record::time);
            let hi = krecs.get(j + 1).and_then(Record::time);
            let after_lo = lo.is_none_or(|lo| lo <= t);
            let before_hi = hi.is_none_or(|hi| t <= hi);
            if !(after_lo && before_hi) {
                out.violations.push(format!(
                    "{r} at time {t} is not between the neighbours of its twin {k} in kloop's ring (times {lo:?} and {hi:?}): the kernel writes both copies in one pass"
                ));
            }
        }
    }
    out
}

/// Text for the trial's normalised stream (appended after kloop's own):
/// perf's view with addresses, ids and tags named after the agent's
/// programs. Empty when the run has no perf output.
pub fn normalise(ev: &RunEvidence, analysis: &Analysis) -> String {
    let Some(script) = ev.perf_scripts.first() else {
        return String::new();
    };
    let mut out = String::from("perf (second reader):\n");
    let dump = match parse(&script.text) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(out, "  unreadable: {e}");
            return out;
        }
    };
    let _ = writeln!(
        out,
        "  sample_type={}{}",
        dump.sample_types
            .iter()
            .map(|s| kloop_records::sample_type_names(*s))
            .collect::<Vec<_>>()
            .join(","),
        if dump.sample_id_all {
            " sample_id_all"
        } else {
            ""
        }
    );
    // Tags are named after the program the record belongs to (its address
    // or id), so two loads of one fixture, which share tags, stay apart.
    let owner_of = |side: &RecordContent| -> Option<&ProgFacts> {
        ev.progs.iter().find(|f| match side {
            RecordContent::Ksymbol { addr, .. } => f.jited_ksyms.contains(addr),
            RecordContent::BpfEvent { id, .. } => f.id == *id,
        })
    };
    let tag_name = |t: &[u8; 8], owner: Option<&ProgFacts>| -> String {
        if let Some(f) = owner {
            if f.tag == *t {
                return format!("tag({})", f.label);
            }
            if let Some(fi) = f.func_tags.iter().position(|x| x == t) {
                return format!("ftag({}.f{fi})", f.label);
            }
        }
        format!("tag({})", hex::encode(t))
    };
    let name_of = |n: &str, owner: Option<&ProgFacts>| -> String {
        if let Some(rest) = n.strip_prefix("bpf_prog_") {
            if let Some(t) = rest
                .get(..16)
                .and_then(|h| hex::decode(h).ok())
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
            {
                return format!(
                    "bpf_prog_<{}>{}",
                    tag_name(&t, owner),
                    mask_tags(&rest[16..])
                );
            }
        }
        mask_tags(n)
    };
    let label_of = |side: &RecordContent| -> String {
        match (side, owner_of(side)) {
            (RecordContent::Ksymbol { addr, .. }, Some(f)) => {
                let fi = f.jited_ksyms.iter().position(|a| a == addr).unwrap_or(0);
                format!("{}.f{fi}", f.label)
            }
            (RecordContent::BpfEvent { .. }, Some(f)) => f.label.clone(),
            (RecordContent::Ksymbol { .. }, None) => "addr#?".into(),
            (RecordContent::BpfEvent { .. }, None) => "prog#?".into(),
        }
    };
    let mut ignored = Vec::new();
    let recs = perf_records(&dump, &mut ignored);
    for (title, synth) in [("synthesised", true), ("recorded", false)] {
        let _ = writeln!(out, "  {title}:");
        for r in recs.iter().filter(|r| r.synthesised() == synth) {
            out.push_str("    ");
            let owner = owner_of(&r.side);
            match &r.side {
                RecordContent::Ksymbol {
                    len,
                    ksym_type,
                    flags,
                    name,
                    ..
                } => {
                    let _ = write!(
                        out,
                        "KSYMBOL {} {} {} len={len} name={}",
                        kloop_records::ksymbol_action(*flags),
                        kloop_records::ksym_type_name(*ksym_type),
                        label_of(&r.side),
                        name_of(name, owner)
                    );
                }
                RecordContent::BpfEvent {
                    event_type,
                    flags,
                    tag,
                    ..
                } => {
                    let tag = tag
                        .map(|t| tag_name(&t, owner))
                        .unwrap_or_else(|| "tag(?)".into());
                    let _ = write!(
                        out,
                        "BPF_EVENT {} {} {tag}",
                        kloop_records::bpf_event_type_name(*event_type),
                        label_of(&r.side)
                    );
                    if *flags != 0 {
                        let _ = write!(out, " flags={flags:#x}");
                    }
                }
            }
            out.push('\n');
        }
    }
    let recorded: Vec<&PerfRecord> = recs.iter().filter(|r| !r.synthesised()).collect();
    let t = twins(ev, analysis, &recorded);
    for (cpu, n) in &t.untwinned_after_parse_error {
        let _ = writeln!(
            out,
            "  not twinned: {n} record(s) on cpu {cpu}, after the point where kloop's own stream of that CPU failed to parse"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `perf report -D --header -i perf.data` from perf 6.1.192 (Debian
    /// 12's linux-perf) on the 6.1 pin (6.1.0-50-cloud-amd64) under
    /// QEMU/TCG, recorded by the perf-tool scenario: `basic` ("early") and
    /// `subprogs` ("kept") alive at start, `subprogs` ("inside") and
    /// `basic` ("late") loaded while perf recorded, "early" and "inside"
    /// unloaded while it recorded.
    const REAL_6_1: &str = include_str!("../testdata/perf-report-D-6.1.192-on-6.1.txt");

    #[test]
    fn reads_a_real_dump() {
        let d = parse(REAL_6_1).unwrap();
        assert_eq!(d.perf_version.as_deref(), Some("6.1.192"));
        assert_eq!(d.os_release.as_deref(), Some("6.1.0-50-cloud-amd64"));
        assert_eq!(
            kloop_records::sample_type_names(d.sample_types[0]),
            "IP|TID|TIME|CPU|PERIOD"
        );
        assert!(d.sample_id_all);
        assert_eq!(d.stats.get("KSYMBOL"), Some(&12));
        assert_eq!(d.stats.get("BPF_EVENT"), Some(&6));
        let ks = d
            .events
            .iter()
            .filter(|e| e.type_ == PERF_RECORD_KSYMBOL)
            .count();
        let bs = d
            .events
            .iter()
            .filter(|e| e.type_ == PERF_RECORD_BPF_EVENT)
            .count();
        assert_eq!((ks, bs), (12, 6));
        let first = d
            .events
            .iter()
            .find(|e| e.type_ == PERF_RECORD_KSYMBOL)
            .unwrap();
        assert_eq!(first.offset, 0x1e8);
        assert_eq!(first.raw.len(), 0x58);
        let s = first.summary.as_ref().unwrap();
        assert_eq!(s.stamps, vec![0, 0]);
        assert_eq!(
            s.printed,
            Printed::Ksymbol(RecordContent::Ksymbol {
                addr: 0xffffffffc0183658,
                len: 36,
                ksym_type: 1,
                flags: 0,
                name: "bpf_prog_e6d6061d74de6f92_kloop_basic".into()
            })
        );
    }

    #[test]
    fn kloop_reads_every_raw_record_as_perf_printed_it() {
        let d = parse(REAL_6_1).unwrap();
        let mut bad = Vec::new();
        let recs = perf_records(&d, &mut bad);
        assert!(bad.is_empty(), "{bad:#?}");
        assert_eq!(recs.len(), 18);
        assert_eq!(recs.iter().filter(|r| r.synthesised()).count(), 6);
        // The tag comes from the raw bytes: perf's summary has none.
        let load = recs
            .iter()
            .find(|r| {
                matches!(
                    r.side,
                    RecordContent::BpfEvent {
                        id: 10,
                        event_type: 1,
                        ..
                    }
                )
            })
            .unwrap();
        assert_eq!(
            load.side,
            RecordContent::BpfEvent {
                event_type: 1,
                flags: 0,
                id: 10,
                tag: Some([0x04, 0x0d, 0x2b, 0x83, 0x17, 0x57, 0x65, 0xad]),
            }
        );
        assert_eq!((load.cpu, load.time), (Some(0), Some(11525798501)));
    }

    #[test]
    fn a_summary_that_disagrees_with_its_bytes_is_reported() {
        // Change the printed length of the first KSYMBOL (raw says 36).
        let text = REAL_6_1.replacen(
            "addr ffffffffc0183658 len 36 type 1",
            "addr ffffffffc0183658 len 37 type 1",
            1,
        );
        let d = parse(&text).unwrap();
        let mut bad = Vec::new();
        perf_records(&d, &mut bad);
        assert_eq!(bad.len(), 1, "{bad:#?}");
        assert!(
            bad[0].contains("len 37") && bad[0].contains("len=36"),
            "{}",
            bad[0]
        );
    }

    #[test]
    fn truncated_hex_dump_is_an_error() {
        // Drop the last hex line of the first KSYMBOL's raw dump.
        let needle = ".  0050:  00 00 00 00 00 00 00 00                          ........        \n\n0 0 0x1e8";
        assert!(REAL_6_1.contains(needle), "fixture layout changed");
        let text = REAL_6_1.replacen(needle, "\n0 0 0x1e8", 1);
        let e = parse(&text).unwrap_err();
        assert!(e.what.contains("0x1e8"), "{e}");
    }

    #[test]
    fn a_missing_header_is_an_error() {
        let text: String = REAL_6_1
            .lines()
            .filter(|l| !l.starts_with("# event :"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(parse(&text).unwrap_err().what.contains("--header"));
    }

    /// A whole perf-tool trial on the 7.3 pin (7.3~rc7-1~exp1, one vCPU,
    /// perf 6.1.192 from the host): the agent's messages (heartbeats left
    /// out) and kloop's listener's ring bytes, as the harness received them.
    fn real_7_3() -> (RunEvidence, Vec<Step>) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/testdata/perf-tool-7.3");
        let messages: Vec<kloop_protocol::Message> =
            std::fs::read_to_string(format!("{dir}/messages.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let ring = std::fs::read(format!("{dir}/records-0.bin")).unwrap();
        let ev = RunEvidence::from_messages(&messages, BTreeMap::from([(0, ring)]));
        let scenario = crate::run::scenario::Scenario::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scenarios/perf-tool"
        )))
        .unwrap();
        (ev, scenario.plan.steps)
    }

    fn second_reader(ev: &RunEvidence, steps: &[Step]) -> Vec<String> {
        let a = crate::judge::check::analyse(ev);
        check(ev, &a, steps)
            .into_iter()
            .map(|v| {
                assert_eq!(v.rule, RULE);
                v.message
            })
            .collect()
    }

    #[test]
    fn real_7_3_run_differs_only_in_perfs_synthesised_main_function_name() {
        let (ev, steps) = real_7_3();
        assert!(crate::judge::check::analyse(&ev).violations.is_empty());
        let v = second_reader(&ev, &steps);
        // perf names the main function of a program alive at its start
        // after prog_tags[0]; the kernel (7.3) after the program's tag.
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(
            v[0].contains("name bpf_prog_0fa433de4695ac69_kloop_subprogs")
                && v[0].contains("name=\"bpf_prog_de24666b53bfdd9f_kloop_subprogs\"")
                && v[0].contains("\"kept\""),
            "{}",
            v[0]
        );
    }

    /// The same run with perf's text changed by `edit`.
    fn with_perf_text(edit: impl Fn(&str) -> String) -> (RunEvidence, Vec<Step>) {
        let (mut ev, steps) = real_7_3();
        let text = edit(&ev.perf_scripts[0].text);
        assert_ne!(text, ev.perf_scripts[0].text, "the edit changed nothing");
        ev.perf_scripts[0].text = text;
        (ev, steps)
    }

    /// Drops the dump block (raw bytes and summary) of the record at `offset`.
    fn drop_block(text: &str, offset: &str) -> String {
        let start = text.find(&format!("\n{offset}@")).unwrap();
        let summary = text[start..].find(&format!(" {offset} [")).unwrap() + start;
        let end = text[summary..].find('\n').unwrap() + summary;
        format!("{}{}", &text[..start], &text[end..])
    }

    #[test]
    fn a_record_perf_missed_is_named() {
        // The PROG_LOAD of "late", recorded while perf ran.
        let (ev, steps) = real_7_3();
        let off = {
            let d = parse(&ev.perf_scripts[0].text).unwrap();
            let late = ev.progs.iter().find(|f| f.label == "late").unwrap();
            let e = d
                .events
                .iter()
                .find(|e| {
                    matches!(&e.summary, Some(Summary { printed: Printed::BpfEvent(RecordContent::BpfEvent { id, event_type: 1, .. }), .. }) if *id == late.id)
                })
                .unwrap();
            format!("{:#x}", e.offset)
        };
        let (ev, _) = with_perf_text(|t| drop_block(t, &off));
        let v = second_reader(&ev, &steps);
        assert!(
            v.iter()
                .any(|m| m.starts_with("perf did not record BPF_EVENT PROG_LOAD")
                    && m.contains("\"late\"")),
            "{v:#?}"
        );
    }

    #[test]
    fn a_load_perf_should_not_have_seen_is_named() {
        // Pretend "late" was loaded after perf stopped: perf's record of its
        // load is then unexplained.
        let (ev, mut steps) = real_7_3();
        let stop = steps
            .iter()
            .position(|s| matches!(s, Step::PerfRecordStop))
            .unwrap();
        let late = steps
            .iter()
            .position(|s| matches!(s, Step::Load { label, .. } if label == "late"))
            .unwrap();
        let step = steps.remove(late);
        steps.insert(stop, step);
        let v = second_reader(&ev, &steps);
        assert!(
            v.iter()
                .any(|m| m
                    .contains("which no load or unload the plan ran while perf recorded explains")),
            "{v:#?}"
        );
    }

    #[test]
    fn a_twin_out_of_time_is_named() {
        // Move the time of kloop's copy of the record after inside's first
        // KSYMBOL (ring index 7) to well before it: perf's copy of that
        // first KSYMBOL no longer lies between its twin's neighbours.
        let (mut ev, steps) = real_7_3();
        let ring = ev.streams.get_mut(&0).unwrap();
        let (off, size) = (560usize, 88usize);
        let time_at = off + size - 16;
        ring[time_at..time_at + 8].copy_from_slice(&17069000000u64.to_le_bytes());
        let v = second_reader(&ev, &steps);
        assert!(
            v.iter()
                .any(|m| m.contains("is not between the neighbours of its twin")),
            "{v:#?}"
        );
    }

    #[test]
    fn every_prefix_of_a_real_dump_parses_or_errs_without_panicking() {
        // Guest text is untrusted input: a dump cut anywhere must be either
        // read or refused, never crash the harness.
        for end in (0..REAL_6_1.len())
            .filter(|e| REAL_6_1.is_char_boundary(*e))
            .step_by(3)
        {
            let text = &REAL_6_1[..end];
            if let Ok(d) = parse(text) {
                let mut bad = Vec::new();
                perf_records(&d, &mut bad);
            }
        }
    }

    #[test]
    fn hex_lines() {
        assert_eq!(
            hex_line(".  0020:  1c 16 23 a7 7a 08 00 00 01 00 00 00 00 00 00 00  ..#.z..........."),
            Some(vec![
                0x1c, 0x16, 0x23, 0xa7, 0x7a, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0
            ])
        );
        assert_eq!(
            hex_line(".  0050:  01 00 00 00 00 00 00 00                          ........        "),
            Some(vec![1, 0, 0, 0, 0, 0, 0, 0])
        );
        // ASCII that looks like hex is never read as bytes.
        assert_eq!(
            hex_line(".  0000:  61 62                                            ab"),
            Some(vec![0x61, 0x62])
        );
    }
}
