//! The check itself: the file read, its side-band records parsed and
//! judged, the findings recognised against the ledger.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::ListenerInfo;
use kloop_records::{parse_stream, RecordBody, KSYM_TYPE_BPF};
use linux_perf_data::{PerfFileReader, PerfFileRecord};

use crate::finding::Finding;
use crate::prog_info;

/// `PERF_RECORD_*` types this check reads.
pub(crate) const KSYMBOL: u32 = 17;
pub(crate) const BPF_EVENT: u32 = 18;
const LOST: u32 = 2;

/// Why a file could not be checked (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PerfDataError {
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path} is not a readable perf.data file: {why}")]
    Unreadable { path: PathBuf, why: String },
    #[error("{path} is cut short: {why} (was perf killed, or the disk full?)")]
    Truncated { path: PathBuf, why: String },
    #[error("{path}: no event in this file asked for KSYMBOL or BPF_EVENT records, so there is nothing to judge; it was written by a perf or on a kernel older than 5.1 (perf switches ksymbol off when the kernel refuses it). Record again with perf 5.1 or later on a 5.1+ kernel: `perf record -e dummy -a`")]
    NoSideBand { path: PathBuf },
}

/// The rules `check-perf-data` holds a file to.
pub const RULES: &[&str] = &[
    "bpf-prog-info",
    "synthesised-name",
    "parse",
    "header-size",
    "bpf-symbol-shape",
    "unregister-without-register",
    "register-twice",
];

/// What the check found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PerfDataCheck {
    /// `HEADER_OSRELEASE`: the recording host's kernel.
    pub os_release: Option<String>,
    /// `HEADER_VERSION`: the perf that wrote the file.
    pub perf_version: Option<String>,
    /// Attributes that asked for KSYMBOL / BPF_EVENT records.
    pub side_band_attrs: usize,
    /// Programs `HEADER_BPF_PROG_INFO` holds (0: no such section).
    pub programs_with_info: usize,
    /// Did any event ask for BPF_EVENT records? Not with
    /// `perf record --no-bpf-event`: then the file has the KSYMBOLs of BPF
    /// programs but not their ids and tags.
    pub bpf_event_requested: bool,
    /// The records stop before the file's end. What was read is judged;
    /// the check exits 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
    /// Records read, and KSYMBOL / BPF_EVENT / LOST among them.
    pub records: u64,
    pub ksymbol: u64,
    pub bpf_event: u64,
    pub lost: u64,
    /// The findings kept: the first [`KEPT_PER_RULE`] of each rule, so a
    /// file of any size is judged in bounded memory.
    pub findings: Vec<Finding>,
    /// Findings past that cap, counted per rule.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub more_findings: BTreeMap<&'static str, u64>,
    /// Findings kept per rule.
    #[serde(skip)]
    kept: BTreeMap<&'static str, usize>,
    /// With [`check_with`]`(…, true)`: each KSYMBOL and BPF_EVENT record's
    /// bytes as the file has them, in the order read.
    #[serde(skip)]
    pub side_band: Vec<Vec<u8>>,
}

/// Why the records stopped before the file's end.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "why", rename_all = "kebab-case")]
pub enum Stopped {
    /// The last record reaches past the end: a killed perf, a full disk.
    CutShort(String),
    /// A record the reader cannot make sense of, inside the file: a file
    /// damaged, or written by a tool that gets the format wrong.
    Unreadable(String),
}

/// Findings kept per rule; the rest are counted.
pub const KEPT_PER_RULE: usize = 1000;

impl PerfDataCheck {
    fn push(&mut self, f: Finding) {
        let kept = self.kept.entry(f.rule).or_default();
        if *kept < KEPT_PER_RULE {
            *kept += 1;
            self.findings.push(f);
        } else {
            *self.more_findings.entry(f.rule).or_default() += 1;
        }
    }
}

impl PerfDataCheck {
    /// No finding the ledger does not explain (exit 0).
    pub fn clean(&self) -> bool {
        self.news().next().is_none()
    }

    /// `check-perf-data`'s exit status: 2 when the file was cut short
    /// (whatever was read), 1 for news, 0 clean or known bugs only.
    pub fn exit_code(&self) -> u8 {
        match (&self.stopped, self.clean()) {
            (Some(_), _) => 2,
            (None, false) => 1,
            (None, true) => 0,
        }
    }

    /// How many findings no ledger entry explains, those past the cap
    /// included (a rule's findings are all known or all news: the ledger's
    /// sign is per rule and kernel).
    pub fn news_count(&self) -> u64 {
        let kept = self.news().count() as u64;
        let more: u64 = self
            .more_findings
            .iter()
            .filter(|(rule, _)| self.news().any(|f| f.rule == **rule))
            .map(|(_, n)| n)
            .sum();
        kept + more
    }

    /// The findings no ledger entry explains.
    pub fn news(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.known_issue.is_none())
    }

    /// The ledger entries that explain findings, once each, in order.
    pub fn known_issues(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = Vec::new();
        for id in self
            .findings
            .iter()
            .filter_map(|f| f.known_issue.as_deref())
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
}

/// Marks the findings a ledger entry's `[issue.perf_data]` sign explains
/// on the file's kernel release. A finding with an entry's sign on a
/// release outside its ranges stays news, and says whose pattern it has.
pub fn recognise(check: &mut PerfDataCheck, ledger: &kloop_judge::known_issues::Ledger) {
    let release = check.os_release.clone().unwrap_or_default();
    let perf = check.perf_version.clone();
    for f in &mut check.findings {
        match ledger.perf_data_sign(f.rule, &release, perf.as_deref()) {
            Some((issue, Some(true))) => f.known_issue = Some(issue.id.clone()),
            Some((issue, affects)) => {
                let ranges = issue
                    .perf_data
                    .as_ref()
                    .map(|s| s.ranges())
                    .unwrap_or_default();
                f.message.push_str(&format!(
                    " (the sign of ledger entry {}, known on {ranges}; {}: news for the ledger)",
                    issue.id,
                    match affects {
                        Some(_) => format!(
                            "kernel {release}, perf {} is outside them",
                            perf.as_deref().unwrap_or("(unknown)")
                        ),
                        None => format!(
                            "kernel release {release:?} or perf version {perf:?} does not read as a version"
                        ),
                    }
                ));
            }
            None => {}
        }
    }
}

/// Reads `path` and judges its side-band records.
pub fn check(path: &Path) -> Result<PerfDataCheck, PerfDataError> {
    check_with(path, false)
}

/// [`check`], keeping every KSYMBOL and BPF_EVENT record's bytes in
/// [`PerfDataCheck::side_band`] when `keep` (for files of a trial's size).
pub fn check_with(path: &Path, keep: bool) -> Result<PerfDataCheck, PerfDataError> {
    let (
        PerfFileReader {
            mut perf_file,
            mut record_iter,
        },
        cut,
    ) = open_reader(path)?;
    let mut out = PerfDataCheck {
        os_release: perf_file.os_release().ok().flatten().map(str::to_string),
        perf_version: perf_file.perf_version().ok().flatten().map(str::to_string),
        ..PerfDataCheck::default()
    };
    let listeners = listeners(&perf_file);
    out.side_band_attrs = listeners
        .iter()
        .filter(|l| l.ksymbol || l.bpf_event)
        .count();
    if out.side_band_attrs == 0 {
        return Err(PerfDataError::NoSideBand {
            path: path.to_path_buf(),
        });
    }
    out.bpf_event_requested = listeners.iter().any(|l| l.bpf_event);
    let mut live: BTreeMap<u64, (u32, String)> = BTreeMap::new();
    let mut seen = Seen::default();
    loop {
        let record = match record_iter.next_record(&mut perf_file) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                out.stopped = Some(Stopped::Unreadable(format!(
                    "after record {} a record cannot be read: {e}",
                    out.records
                )));
                break;
            }
        };
        out.records += 1;
        let PerfFileRecord::EventRecord { attr_index, record } = record else {
            continue;
        };
        let type_ = record.record_type.0;
        if ![KSYMBOL, BPF_EVENT, LOST].contains(&type_) {
            continue;
        }
        let Some(listener) = listeners.get(attr_index) else {
            continue;
        };
        let bytes = record_bytes(type_, record.misc, &record.data.as_slice());
        if keep && type_ != LOST {
            out.side_band.push(bytes.clone());
        }
        match type_ {
            KSYMBOL => out.ksymbol += 1,
            BPF_EVENT => out.bpf_event += 1,
            _ => out.lost += 1,
        }
        let Some(recs) = out.parse_side_band(listener, &bytes, attr_index) else {
            continue;
        };
        for r in recs {
            seen.add(&r);
            let mut found = Vec::new();
            judge_symbol(&r.body, &mut live, &mut found);
            for f in found {
                out.push(f);
            }
        }
    }
    out.judge_prog_info(&perf_file, &seen);
    // linux-perf-data ends a pipe stream quietly at a partial record; a
    // cut also explains a record that cannot be read.
    if let Some(why) = cut {
        out.stopped = Some(Stopped::CutShort(why));
    }
    Ok(out)
}

impl PerfDataCheck {
    /// The records in one side-band record's `bytes`: parsed, or read past
    /// an oversized header (a `header-size` finding); `None` after a
    /// `parse` finding.
    fn parse_side_band(
        &mut self,
        listener: &ListenerInfo,
        bytes: &[u8],
        attr_index: usize,
    ) -> Option<Vec<kloop_records::Record>> {
        let size = bytes.len();
        match parse_stream(listener, bytes) {
            Ok(recs) => Some(recs),
            Err(e) => match oversized(listener, bytes) {
                Some((true_size, recs)) => {
                    self.push(Finding::new(
                        "header-size",
                        format!(
                            "record {} (event {attr_index}, {}): header.size {size} is {} bytes more than its body and sample_id trailer ({true_size}); the extra bytes are zero",
                            self.records,
                            recs.first().and_then(kloop_records::RecordContent::of_record).map(|c| c.to_string()).unwrap_or_default(),
                            size - true_size
                        ),
                    ));
                    Some(recs)
                }
                None => {
                    self.push(Finding::new(
                        "parse",
                        format!("record {} (event {attr_index}): {}", self.records, e.what),
                    ));
                    None
                }
            },
        }
    }

    /// The findings of the file's HEADER_BPF_PROG_INFO, when it has one,
    /// against the records seen.
    fn judge_prog_info(&mut self, perf_file: &linux_perf_data::PerfFile, seen: &Seen) {
        if let Some(section) =
            perf_file.feature_section_data(linux_perf_data::Feature::BPF_PROG_INFO)
        {
            match prog_info::parse(section) {
                Ok(progs) => {
                    self.programs_with_info = progs.len();
                    for f in prog_info::judge(
                        &progs,
                        &seen.registered,
                        &seen.loaded,
                        self.bpf_event_requested,
                    ) {
                        self.push(f);
                    }
                }
                Err(why) => self.push(Finding::new(
                    "bpf-prog-info",
                    format!("HEADER_BPF_PROG_INFO does not read: {why}"),
                )),
            }
        }
    }
}

/// The reader of `path` in whichever mode it is, and why it is cut short
/// if it is.
fn open_reader(
    path: &Path,
) -> Result<
    (
        PerfFileReader<std::io::BufReader<std::fs::File>>,
        Option<String>,
    ),
    PerfDataError,
> {
    let unreadable = |why: String| PerfDataError::Unreadable {
        path: path.to_path_buf(),
        why,
    };
    let file = std::fs::File::open(path).at("opening", path)?;
    let pipe = is_pipe_mode(path).map_err(|e| unreadable(e.to_string()))?;
    let cut = if pipe { pipe_cut(path) } else { file_cut(path) };
    let cut = cut.map_err(|e| unreadable(e.to_string()))?;
    if let (false, Some(why)) = (pipe, &cut) {
        // The feature sections follow the records: nothing reads.
        return Err(PerfDataError::Truncated {
            path: path.to_path_buf(),
            why: why.clone(),
        });
    }
    let reader = std::io::BufReader::new(file);
    let parsed = if pipe {
        PerfFileReader::parse_pipe(reader)
    } else {
        PerfFileReader::parse_file(reader)
    };
    let reader = parsed.map_err(|e| unreadable(e.to_string()))?;
    Ok((reader, cut))
}

/// One record as it is in the file: its 8-byte header (type, misc, size)
/// and body.
fn record_bytes(type_: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let size = 8 + body.len();
    let mut bytes = Vec::with_capacity(size);
    bytes.extend_from_slice(&type_.to_le_bytes());
    bytes.extend_from_slice(&misc.to_le_bytes());
    bytes.extend_from_slice(&(size as u16).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// A file-mode perf.data whose records section (header offset 40: offset
/// and size) reaches past the end of the file.
fn file_cut(path: &Path) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let mut head = [0u8; 56];
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if f.read_exact(&mut head).is_err() {
        return Ok(None); // too short for a header: the reader says so
    }
    let at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"));
    let end = at(40).saturating_add(at(48));
    Ok((end > len).then(|| {
        format!("its header says the records end at byte {end}, the file has {len} bytes")
    }))
}

/// A pipe-mode perf.data whose last record reaches past the end of the
/// file: its records are walked header to header. Two records carry a
/// payload after `header.size` (tools/perf/util/session.c): tracing data
/// (`u32 size` after the header, padded to 8) and AUX trace data (`u64 size`).
fn pipe_cut(path: &Path) -> std::io::Result<Option<String>> {
    const TRACING_DATA: u32 = 66;
    const AUXTRACE: u32 = 71;
    use std::io::{Read, Seek};
    let mut f = std::io::BufReader::new(std::fs::File::open(path)?);
    let len = f.get_ref().metadata()?.len();
    let mut at = 16u64;
    f.seek(std::io::SeekFrom::Start(at))?;
    let mut head = [0u8; 8];
    while at < len {
        if len - at < 8 || f.read_exact(&mut head).is_err() {
            return Ok(Some(format!(
                "{} byte(s) at offset {at} are less than a record header",
                len - at
            )));
        }
        let type_ = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let mut size = u16::from_le_bytes([head[6], head[7]]) as u64;
        if (type_ == TRACING_DATA || type_ == AUXTRACE) && size >= 16 {
            let mut payload = [0u8; 8];
            f.read_exact(&mut payload)?;
            f.seek_relative(-8)?;
            size += if type_ == TRACING_DATA {
                (u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as u64)
                    .next_multiple_of(8)
            } else {
                u64::from_le_bytes(payload)
            };
        }
        if size < 8 {
            return Ok(Some(format!(
                "the record at offset {at} has header.size {size}, less than its header"
            )));
        }
        if at + size > len {
            return Ok(Some(format!(
                "the record at offset {at} (type {type_}, {size} bytes) ends past the file's {len} bytes"
            )));
        }
        f.seek_relative(size as i64 - 8)?;
        at += size;
    }
    Ok(None)
}

/// Each event attribute of the file as kloop's parser knows a listener.
pub(crate) fn listeners(perf_file: &linux_perf_data::PerfFile) -> Vec<ListenerInfo> {
    perf_file
        .event_attributes()
        .iter()
        .enumerate()
        .map(|(i, a)| ListenerInfo {
            index: i as u32,
            cpu: -1,
            sample_type: a.attr.sample_format.bits(),
            sample_id_all: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::SAMPLE_ID_ALL),
            ksymbol: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::KSYMBOL),
            bpf_event: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::BPF_EVENT),
            ..ListenerInfo::default()
        })
        .collect()
}

/// What the BPF_PROG_INFO agreement needs of the stream: the registers per
/// address (a few, as addresses are reused) and each program's PROG_LOAD.
#[derive(Default)]
struct Seen {
    registered: BTreeMap<u64, Vec<prog_info::Registered>>,
    loaded: BTreeMap<u32, prog_info::Loaded>,
}

impl Seen {
    fn add(&mut self, r: &kloop_records::Record) {
        let synthesised = r.time() == Some(0);
        match &r.body {
            RecordBody::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } if *ksym_type == KSYM_TYPE_BPF && flags & 1 == 0 => {
                // An address is reused by later programs: keep a few
                // registers per address (bounded for files of any size).
                let at = self.registered.entry(*addr).or_default();
                if at.len() < 8 && !at.iter().any(|r| r.name == *name && r.len == *len) {
                    at.push(prog_info::Registered {
                        name: name.clone(),
                        len: *len,
                        synthesised,
                    });
                }
            }
            RecordBody::BpfEvent {
                event_type: kloop_records::BPF_EVENT_PROG_LOAD,
                id,
                tag,
                ..
            } => {
                self.loaded.entry(*id).or_insert(prog_info::Loaded {
                    tag: *tag,
                    synthesised,
                });
            }
            _ => {}
        }
    }
}

/// A record that parses once its `header.size` is cut back to a smaller
/// multiple of 8 with only zero bytes cut off: the kernel's accumulated
/// `header.size` (ledger entry ksymbol-bpf-event-header-size-accumulates).
/// The smallest such size is the true one: any smaller cut would take the
/// trailer's time with it, which is never all zero.
pub(crate) fn oversized(
    listener: &ListenerInfo,
    bytes: &[u8],
) -> Option<(usize, Vec<kloop_records::Record>)> {
    (16..bytes.len()).step_by(8).find_map(|size| {
        if bytes[size..].iter().any(|b| *b != 0) {
            return None;
        }
        let mut cut = bytes[..size].to_vec();
        cut[6..8].copy_from_slice(&(size as u16).to_le_bytes());
        parse_stream(listener, &cut).ok().map(|recs| (size, recs))
    })
}

/// `perf record -o -` writes the pipe form: the same magic, then a header
/// of 16 bytes (magic and size) instead of the file header's 104, and the
/// attributes and features as records in the stream.
fn is_pipe_mode(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 16];
    std::fs::File::open(path)?.read_exact(&mut head)?;
    Ok(&head[..8] == b"PERFILE2"
        && u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")) == 16)
}

/// A BPF symbol has a length and a name, is registered once while live and
/// unregistered only while live (perf synthesises the programs alive when
/// it starts, so every BPF symbol has its register in the file).
fn judge_symbol(
    body: &RecordBody,
    live: &mut BTreeMap<u64, (u32, String)>,
    findings: &mut Vec<Finding>,
) {
    let RecordBody::Ksymbol {
        addr,
        len,
        ksym_type,
        flags,
        name,
    } = body
    else {
        return;
    };
    if *ksym_type != KSYM_TYPE_BPF {
        return;
    }
    let unregister = flags & 1 != 0;
    if *len == 0 || name.is_empty() {
        findings.push(Finding::new(
            "bpf-symbol-shape",
            format!(
                "KSYMBOL {} BPF addr={addr:#x} len={len} name=\"{name}\": a BPF symbol with no length or no name (an interpreted program's, see kloop's ledger entry interpreted-prog-ksymbol-register)",
                if unregister { "unregister" } else { "register" }
            ),
        ));
        return;
    }
    if unregister {
        if live.remove(addr).is_none() {
            findings.push(Finding::new(
                "unregister-without-register",
                format!("KSYMBOL unregister BPF addr={addr:#x} len={len} name={name}: no live symbol there"),
            ));
        }
    } else if let Some((l, n)) = live.insert(*addr, (*len, name.clone())) {
        findings.push(Finding::new(
            "register-twice",
            format!("KSYMBOL register BPF addr={addr:#x} name={name} while {n} (len {l}) is still registered there"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed ledger (`kernels/known-issues.toml`) through the
    /// judge's own loader: its pins are the pin files of `kernels/`, its
    /// rules the judge's; scenario names are left unchecked here.
    fn ledger() -> kloop_judge::known_issues::Ledger {
        use kloop_judge::known_issues::{rule_names, Ledger, Vocabulary, FILE_NAME};
        let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let not_pins = ["known-issues", "mutation-notes", "mutation-targets"];
        let pins = std::fs::read_dir(&kernels)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                let stem = p.file_stem()?.to_str()?.to_owned();
                (p.extension()? == "toml" && !not_pins.contains(&stem.as_str())).then_some(stem)
            })
            .collect::<Vec<String>>();
        // And arm64's, `kernels/arm64/<series>.toml` as `arm64/<series>`.
        let arm64 = std::fs::read_dir(kernels.join("arm64"))
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let stem = p.file_stem()?.to_str()?.to_owned();
                (p.extension()? == "toml").then(|| format!("arm64/{stem}"))
            });
        let pins = pins.into_iter().chain(arm64).collect();
        let vocab = Vocabulary {
            pins,
            rules: rule_names().into_iter().map(String::from).collect(),
            scenarios: Vec::new(),
        };
        let path = kernels.join(FILE_NAME);
        let text = std::fs::read_to_string(&path).unwrap();
        Ledger::of_file(&path, Some(&text), &vocab).unwrap()
    }

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    /// Recorded on this project's host (kernel 6.18.44, Debian's perf
    /// 6.1.187) with `perf record -e dummy -a` while kernels/repros'
    /// header-size reproducer loaded and unloaded a program with two
    /// listeners of its own: perf's copies of the KSYMBOL and BPF_EVENT
    /// records are longer than their body and trailer.
    #[test]
    fn a_real_host_file_shows_the_header_size_bug() {
        let c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        assert_eq!(c.os_release.as_deref(), Some("6.18.44-fc-v657"));
        assert!(
            c.perf_version
                .as_deref()
                .is_some_and(|v| v.starts_with("6.1.187")),
            "{c:?}"
        );
        assert_eq!((c.ksymbol, c.bpf_event), (2, 2), "{c:?}");
        // Every record is 64 bytes too long (the reproducer's two listeners'
        // trailers, 24 + 40), and judged further at its true size: the
        // register/unregister pairs match.
        let rules: Vec<&str> = c.findings.iter().map(|f| f.rule).collect();
        assert_eq!(rules, ["header-size"; 4], "{:#?}", c.findings);
        assert!(
            c.findings[0].message.contains("KSYMBOL register BPF")
                && c.findings[0].message.contains("is 64 bytes more than"),
            "{:#?}",
            c.findings
        );
        assert!(!c.clean());
    }

    /// The ledger knows the header-size bug on 6.18.44 (its
    /// `[issue.perf_data]` ranges), so the same file is KNOWN, not news;
    /// a release outside the ranges keeps the findings news and names the
    /// entry whose sign they have.
    #[test]
    fn the_ledger_recognises_the_header_size_bug_by_kernel_release() {
        let ledger = ledger();
        let mut c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        recognise(&mut c, &ledger);
        assert!(c.clean(), "{:#?}", c.findings);
        assert_eq!(
            c.known_issues(),
            ["ksymbol-bpf-event-header-size-accumulates"]
        );
        let mut c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        c.os_release = Some("6.12.117+deb13-cloud-amd64".into());
        recognise(&mut c, &ledger);
        assert!(!c.clean());
        assert!(
            c.findings[0]
                .message
                .contains("the sign of ledger entry ksymbol-bpf-event-header-size-accumulates")
                && c.findings[0].message.contains("news for the ledger"),
            "{:#?}",
            c.findings
        );
    }

    /// The real perf's files from the `perf-tool` scenario on the five
    /// pins (see testdata/README.md): the reader and
    /// `HEADER_BPF_PROG_INFO` agree on every program, and the perf bug the
    /// ledger knows from kloop's own judging of perf's records
    /// (perf-synthesised-main-function-name, on exactly the pins its entry
    /// lists) is what the file shows, KNOWN, and nothing else.
    #[test]
    fn the_real_perf_files_of_every_pin_agree_with_kloops_own_judging() {
        let ledger = ledger();
        let entry = "perf-synthesised-main-function-name";
        let pins = &ledger.issues.iter().find(|i| i.id == entry).unwrap().pins;
        for (pin, release) in [
            ("5.10", "5.10.0-32-cloud-amd64"),
            ("6.1", "6.1.0-50-cloud-amd64"),
            ("6.12", "6.12.107+deb13-cloud-amd64"),
            ("7.2", "7.2.13+deb14-cloud-amd64"),
            ("7.3", "7.3-cloud-amd64"),
        ] {
            let mut c = check(&testdata(&format!(
                "guest-{release}-perf-6.1.187-perf-tool.data"
            )))
            .unwrap();
            assert_eq!(c.os_release.as_deref(), Some(release));
            assert_eq!(
                (c.ksymbol, c.bpf_event, c.programs_with_info),
                (12, 6, 4),
                "{pin}: {c:?}"
            );
            let rules: Vec<&str> = c.findings.iter().map(|f| f.rule).collect();
            let shows = pins.iter().any(|p| p == pin);
            assert_eq!(
                rules,
                if shows {
                    vec!["synthesised-name"]
                } else {
                    vec![]
                },
                "{pin}: {:#?}",
                c.findings
            );
            recognise(&mut c, &ledger);
            assert!(c.clean(), "{pin}: {:#?}", c.findings);
            assert_eq!(
                c.known_issues(),
                if shows { vec![entry] } else { vec![] },
                "{pin}"
            );
        }
    }

    /// perf's own files from kernels with and without the header-size bug
    /// (perf-tool-late-listener): 24 bytes too long on 5.10 and 6.1,
    /// KNOWN by kernel release; exact on 7.3.
    #[test]
    fn the_header_size_bug_in_perfs_own_file_is_known_on_5_10_and_6_1() {
        let ledger = ledger();
        for (release, buggy) in [
            ("5.10.0-32-cloud-amd64", true),
            ("6.1.0-50-cloud-amd64", true),
            ("7.3-cloud-amd64", false),
        ] {
            let mut c = check(&testdata(&format!(
                "guest-{release}-perf-6.1.187-late-listener.data"
            )))
            .unwrap();
            assert_eq!((c.ksymbol, c.bpf_event), (2, 2), "{release}");
            let rules: Vec<&str> = c.findings.iter().map(|f| f.rule).collect();
            assert_eq!(
                rules,
                if buggy {
                    vec!["header-size"; 4]
                } else {
                    vec![]
                },
                "{release}"
            );
            assert!(
                c.findings
                    .iter()
                    .all(|f| f.message.contains("is 24 bytes more than")),
                "{:#?}",
                c.findings
            );
            recognise(&mut c, &ledger);
            assert!(c.clean(), "{release}: {:#?}", c.findings);
            let known: Vec<&str> = if buggy {
                vec!["ksymbol-bpf-event-header-size-accumulates"]
            } else {
                vec![]
            };
            assert_eq!(c.known_issues(), known, "{release}");
        }
    }

    /// The same recording as a pipe (`perf record -o - … > file`).
    #[test]
    fn the_pipe_form_is_read_too() {
        let c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.pipe.data")).unwrap();
        assert_eq!((c.ksymbol, c.bpf_event), (2, 2), "{c:?}");
        assert_eq!(
            c.findings
                .iter()
                .filter(|f| f.rule == "header-size")
                .count(),
            4,
            "{:#?}",
            c.findings
        );
    }

    #[test]
    fn a_file_that_is_not_perf_data_is_unreadable_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a perf.data file at all, just bytes").unwrap();
        let e = check(&junk).unwrap_err().to_string();
        assert!(e.contains("is not a readable perf.data file"), "{e}");
        let e = check(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(e.starts_with("opening "), "{e}");
        // Truncated: the header of a real file alone.
        let real = std::fs::read(testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        let cut = dir.path().join("cut");
        std::fs::write(&cut, &real[..100]).unwrap();
        assert!(check(&cut).is_err());
    }
}
