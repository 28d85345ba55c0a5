//! Reading the text of `perf report -D --header` strictly: the header's
//! `sample_type`, each record's summary line and its raw bytes.

use super::*;

/// A `perf report -D --header` text that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("perf report -D output, line {line}: {what}")]
pub struct PerfTextError {
    /// The line it stopped at (1-based).
    pub line: usize,
    /// What was wrong with it.
    pub what: String,
}

/// What perf printed after `PERF_RECORD_<NAME>` on a summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Printed {
    /// `PERF_RECORD_KSYMBOL`'s fields.
    Ksymbol(RecordContent),
    /// `PERF_RECORD_BPF_EVENT`'s fields.
    BpfEvent(RecordContent),
    /// Any other record type: its name and the rest of the line.
    Other {
        /// The name after `PERF_RECORD_`.
        name: String,
        /// The rest of the line.
        rest: String,
    },
}

/// One summary line: `<cpu> <time> 0x<offset> [0x<size>]: PERF_RECORD_…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The numbers before the offset (`cpu`, `time` when the events sample
    /// them; `-1 -1` without `sample_id_all`).
    pub stamps: Vec<i64>,
    /// What perf printed of the record.
    pub printed: Printed,
    /// The text line, for messages.
    pub line: String,
}

/// One record of perf's dump: its raw bytes and perf's summary of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpEvent {
    /// Offset in perf.data (pairs the raw dump with its summary line).
    pub offset: u64,
    /// Its header's size.
    pub size: u32,
    /// Its header's type.
    pub type_: u32,
    /// Its bytes as perf dumped them.
    pub raw: Vec<u8>,
    /// perf's summary line of it, if printed.
    pub summary: Option<Summary>,
}

/// A parsed `perf report -D --header` text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfDump {
    /// `# perf version :`.
    pub perf_version: Option<String>,
    /// `# os release :`.
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

impl PerfDump {
    /// perf's events as one listener that asked for KSYMBOL and BPF_EVENT
    /// records: what the records in perf's file are parsed against (their
    /// `sample_id` trailer from the first event's `sample_type`).
    pub fn listener(&self) -> kloop_protocol::ListenerInfo {
        kloop_protocol::ListenerInfo {
            index: u32::MAX,
            cpu: -1,
            sample_type: self.sample_types.first().copied().unwrap_or(0),
            sample_id_all: self.sample_id_all,
            ksymbol: true,
            bpf_event: true,
            ..kloop_protocol::ListenerInfo::default()
        }
    }
}

pub(super) fn err(line: usize, what: impl Into<String>) -> PerfTextError {
    PerfTextError {
        line: line + 1,
        what: what.into(),
    }
}

pub(super) fn hex_u64(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// `sample_type = IP|TID|TIME|CPU|PERIOD` back into bits.
pub(super) fn sample_type_bits(names: &str) -> Option<u64> {
    let mut bits = 0u64;
    for name in names.split('|').map(str::trim) {
        let bit = (0..64).find(|b| kloop_records::sample_type_names(1u64 << b) == name)?;
        bits |= 1u64 << bit;
    }
    Some(bits)
}

/// `.  0010:  2d 00 00 00 …  ascii`: the bytes of one hex dump line.
pub(super) fn hex_line(line: &str) -> Option<Vec<u8>> {
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

pub(super) fn parse_printed(name: &str, rest: &str, line: usize) -> Result<Printed, PerfTextError> {
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
            any_event_line |= header_line(&mut dump, h, line, i)?;
            i += 1;
            continue;
        }
        if line == "Aggregated stats:" {
            in_stats = true;
            i += 1;
            continue;
        }
        if in_stats {
            stats_line(&mut dump, line, i)?;
            i += 1;
            continue;
        }
        if let Some((raw, next)) = raw_event(&lines, i)? {
            raws.push(raw);
            i = next;
            continue;
        }
        if let Some((offset, summary)) = summary_line(line, i)? {
            if summaries.insert(offset, summary).is_some() {
                return Err(err(i, format!("second summary for offset {offset:#x}")));
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
    pair_summaries(&mut dump, raws, summaries)?;
    Ok(dump)
}

/// A `# ` header line: perf's version, the kernel's release, an event's
/// attributes. Returns whether it was an `event :` line.
fn header_line(dump: &mut PerfDump, h: &str, line: &str, i: usize) -> Result<bool, PerfTextError> {
    if let Some(v) = h.strip_prefix("perf version : ") {
        dump.perf_version = Some(v.trim().to_string());
    } else if let Some(v) = h.strip_prefix("os release : ") {
        dump.os_release = Some(v.trim().to_string());
    } else if let Some(v) = h.strip_prefix("event : ") {
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
        return Ok(true);
    }
    Ok(false)
}

/// A line of the `Aggregated stats:` section:
/// "         KSYMBOL events:         12  (46.2%)".
fn stats_line(dump: &mut PerfDump, line: &str, i: usize) -> Result<(), PerfTextError> {
    if let Some((name, rest)) = line.trim().split_once(" events:") {
        let n = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| err(i, format!("unreadable stats line `{line}`")))?;
        dump.stats.insert(name.trim().to_string(), n);
    }
    Ok(())
}

/// A record's raw dump, "0x1e8@/tmp/perf.data [0x58]: event: 17" and its
/// `.`-lines from line `i`: the record and the line after its dump, or
/// `None` when line `i` opens none.
fn raw_event(lines: &[&str], i: usize) -> Result<Option<(DumpEvent, usize)>, PerfTextError> {
    let line = lines[i];
    let Some((off, rest)) = line.split_once('@') else {
        return Ok(None);
    };
    let (Some(offset), Some((size, ty))) = (
        hex_u64(off),
        rest.split_once(" [")
            .and_then(|(_, r)| r.split_once("]: event: ")),
    ) else {
        return Ok(None);
    };
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
            let b = hex_line(l).ok_or_else(|| err(j, format!("unreadable hex dump line `{l}`")))?;
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
    let event = DumpEvent {
        offset,
        size,
        type_,
        raw,
        summary: None,
    };
    Ok(Some((event, j)))
}

/// A summary line, "<cpu> <time> 0x400 [0x60]: PERF_RECORD_KSYMBOL addr …":
/// its file offset and what it says, or `None` for any other line.
fn summary_line(line: &str, i: usize) -> Result<Option<(u64, Summary)>, PerfTextError> {
    let Some(pos) = line.find(": PERF_RECORD_") else {
        return Ok(None);
    };
    let head = &line[..pos];
    let tail = &line[pos + ": PERF_RECORD_".len()..];
    let toks: Vec<&str> = head.split_whitespace().collect();
    let n = toks.len();
    if n < 2 || !toks[n - 1].starts_with('[') {
        return Ok(None);
    }
    let Some(offset) = hex_u64(toks[n - 2]) else {
        return Ok(None);
    };
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
    let summary = Summary {
        stamps,
        printed,
        line: line.to_string(),
    };
    Ok(Some((offset, summary)))
}

/// Gives each raw dump its summary (by file offset) into `dump.events`:
/// a KSYMBOL or BPF_EVENT needs one, and none of theirs may be left over.
fn pair_summaries(
    dump: &mut PerfDump,
    raws: Vec<DumpEvent>,
    mut summaries: BTreeMap<u64, Summary>,
) -> Result<(), PerfTextError> {
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
    Ok(())
}
