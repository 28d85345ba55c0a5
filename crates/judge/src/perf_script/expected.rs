//! What perf must have written: each of its records read both ways (its
//! summary and kloop's parse of its raw bytes), and the records the plan's
//! loads and unloads imply, from the programs' facts.

use super::*;

/// A side-band record of perf's, read both ways.
#[derive(Debug, Clone)]
pub(super) struct PerfRecord {
    pub(super) offset: u64,
    /// What perf printed (with the tag from the raw bytes when parsed).
    pub(super) side: RecordContent,
    pub(super) cpu: Option<u32>,
    pub(super) time: Option<u64>,
    pub(super) line: String,
}

impl PerfRecord {
    pub(super) fn synthesised(&self) -> bool {
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
pub(super) enum Phase {
    Before,
    During,
    After,
}

#[derive(Debug, Clone)]
pub(super) struct Life<'a> {
    pub(super) facts: &'a ProgFacts,
    pub(super) load: Phase,
    pub(super) unload: Option<Phase>,
}

/// Load and unload phases of every program the agent loaded, from the plan.
pub(super) fn lives<'a>(
    steps: &[Step],
    progs: &'a [ProgFacts],
    out: &mut Vec<String>,
) -> Vec<Life<'a>> {
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
pub(super) fn kernel_name(f: &ProgFacts, fi: usize) -> Option<String> {
    let addr = f.jited_ksyms.get(fi)?;
    f.kallsyms
        .iter()
        .find(|e| e.addr == *addr)
        .map(|e| e.name.clone())
}

pub(super) fn expected_records(f: &ProgFacts, unregister: bool) -> Vec<RecordContent> {
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

/// The `sample_id` trailer fields perf prints, each when the events
/// sample it: as perf printed them, or as read from a record's end.
struct Stamps {
    cpu: Option<u32>,
    time: Option<u64>,
}

/// The `sample_id` trailer fields perf prints, read from the last
/// `trailer_len` bytes of `raw` as perf reads them
/// (`perf_evsel__parse_id_sample()` walks the trailer backwards from the
/// record's end).
fn stamps_from_end(listener: &ListenerInfo, raw: &[u8], trailer_len: usize) -> Stamps {
    raw.len()
        .checked_sub(trailer_len)
        .and_then(|start| kloop_records::sample_id_of(listener, &raw[start..]))
        .map_or(
            Stamps {
                cpu: None,
                time: None,
            },
            |s| Stamps {
                cpu: s.cpu,
                time: s.time,
            },
        )
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Reads perf's side-band records, comparing its parse with kloop's.
/// A copy kloop reads past as oversized ([`kloop_records::Oversized`])
/// becomes one violation in `faults`, with its typed fields; its cpu and
/// time are then the trailer's (where the kernel wrote it), not what perf
/// printed when that is what perf reads from the record's end.
pub(super) fn perf_records(
    dump: &PerfDump,
    bad: &mut Vec<String>,
    faults: &mut Vec<Violation>,
) -> Vec<PerfRecord> {
    let faults_before = faults.len();
    let mut out: Vec<PerfRecord> = {
        let mut reader = PerfReader::new(dump, bad, faults);
        dump.events
            .iter()
            .filter_map(|e| reader.record(e))
            .collect()
    };
    // perf delivers records in time order; an oversized copy's time as
    // perf read it (0) put it among the synthesised ones. Ordered by the
    // times the trailers hold, as perf would have delivered them.
    if faults.len() > faults_before {
        out.sort_by_key(|r| r.time.unwrap_or(0));
    }
    out
}

/// Reads perf's records one by one, as a listener with perf's attributes
/// would receive them, noting disagreements.
struct PerfReader<'o> {
    /// A listener with perf's events' attributes, for kloop's parser.
    listener: ListenerInfo,
    /// Its sample_id trailer's length.
    trailer_len: usize,
    bad: &'o mut Vec<String>,
    faults: &'o mut Vec<Violation>,
}

impl<'o> PerfReader<'o> {
    fn new(dump: &PerfDump, bad: &'o mut Vec<String>, faults: &'o mut Vec<Violation>) -> Self {
        let listener = dump.listener();
        let trailer_len = kloop_records::sample_id_len(&listener);
        PerfReader {
            listener,
            trailer_len,
            bad,
            faults,
        }
    }

    /// Event `e` as a record perf read, or `None` when it is not a
    /// KSYMBOL or BPF_EVENT with a summary that says so.
    fn record(&mut self, e: &DumpEvent) -> Option<PerfRecord> {
        if !matches!(
            e.type_,
            PERF_RECORD_KSYMBOL | PERF_RECORD_BPF_EVENT | PERF_RECORD_LOST
        ) {
            return None;
        }
        let (parsed, oversized) = self.parse_raw(e);
        let summary = e.summary.as_ref()?;
        if e.type_ == PERF_RECORD_LOST {
            self.bad.push(format!(
                "perf lost records: `{}`{}",
                summary.line,
                parsed
                    .as_ref()
                    .map(|r| format!(" (kloop reads {r})"))
                    .unwrap_or_default()
            ));
            return None;
        }
        let (Printed::Ksymbol(printed) | Printed::BpfEvent(printed)) = &summary.printed else {
            self.bad.push(format!(
                "perf@{:#x}: raw type {} but perf printed `{}`",
                e.offset, e.type_, summary.line
            ));
            return None;
        };
        // perf prints the cpu first, then the time, when the events sample them.
        let (sample_type, id_all) = (self.listener.sample_type, self.listener.sample_id_all);
        let mut stamps = summary.stamps.iter().copied();
        let mut cpu = if sample_type & PERF_SAMPLE_CPU != 0 && id_all {
            stamps.next().and_then(|c| u32::try_from(c).ok())
        } else {
            None
        };
        let mut time = if sample_type & PERF_SAMPLE_TIME != 0 && id_all {
            stamps.next().and_then(|t| u64::try_from(t).ok())
        } else {
            None
        };
        let mut side = printed.clone();
        if let Some(r) = &parsed {
            if let Some(s) = self.compare(e, summary, printed, r) {
                side = s;
            }
            // An oversized copy: perf took the record's last bytes for
            // its trailer. What it printed is then explained by that, and
            // the record belongs where its real trailer puts it.
            let from_end = stamps_from_end(&self.listener, &e.raw, self.trailer_len);
            let explained_stamps = oversized.is_some()
                && cpu.is_none_or(|c| from_end.cpu == Some(c))
                && time.is_none_or(|t| from_end.time == Some(t));
            if let Some(o) = &oversized {
                let printed_stamps = Stamps { cpu, time };
                let fault = oversized_fault(e, summary, o, printed_stamps, explained_stamps, r);
                self.faults.push(fault);
            }
            if explained_stamps {
                cpu = cpu.and(r.sample.cpu);
                time = time.and(r.sample.time);
            }
            self.check_stamps(e, r, cpu, time);
        }
        Some(PerfRecord {
            offset: e.offset,
            side,
            cpu,
            time,
            line: summary.line.clone(),
        })
    }

    /// kloop's parse of the raw dump: the one record in it, and the
    /// excess it read past when oversized.
    fn parse_raw(&mut self, e: &DumpEvent) -> (Option<Record>, Option<kloop_records::Oversized>) {
        let read = kloop_records::parse_reading_on(&self.listener, &e.raw);
        let parsed = match (read.error, read.records.len()) {
            (None, 1) => read.records.into_iter().next(),
            (None, n) => {
                self.bad.push(format!(
                    "perf@{:#x}: kloop's parser reads {n} records in perf's raw dump of one",
                    e.offset,
                ));
                None
            }
            (Some(pe), _) => {
                self.bad.push(format!(
                    "perf@{:#x}: kloop's parser rejects the record perf wrote: {pe}",
                    e.offset
                ));
                None
            }
        };
        let oversized = read
            .oversized
            .into_iter()
            .next()
            .filter(|_| parsed.is_some());
        (parsed, oversized)
    }

    /// What perf printed against kloop's parse `r` of the raw bytes (the
    /// tag aside: perf does not print it); kloop's reading when they agree.
    fn compare(
        &mut self,
        e: &DumpEvent,
        summary: &Summary,
        printed: &RecordContent,
        r: &Record,
    ) -> Option<RecordContent> {
        let ours = RecordContent::of_record(r);
        let mut comparable = ours.clone();
        if let Some(RecordContent::BpfEvent { tag, .. }) = comparable.as_mut() {
            *tag = None;
        }
        if comparable.as_ref() != Some(printed) {
            self.bad.push(format!(
                "perf@{:#x}: perf printed `{}` but kloop's parser reads its raw bytes as {}",
                e.offset,
                summary.line.trim(),
                r
            ));
            return None;
        }
        ours
    }

    /// The cpu and time perf printed against the trailer kloop read.
    fn check_stamps(&mut self, e: &DumpEvent, r: &Record, cpu: Option<u32>, time: Option<u64>) {
        if cpu.is_some() && r.sample.cpu != cpu {
            self.bad.push(format!(
                "perf@{:#x}: perf printed cpu {cpu:?}, the trailer says {:?} ({r})",
                e.offset, r.sample.cpu
            ));
        }
        if time.is_some() && r.sample.time != time {
            self.bad.push(format!(
                "perf@{:#x}: perf printed time {time:?}, the trailer says {:?} ({r})",
                e.offset, r.sample.time
            ));
        }
    }
}

/// The violation of an oversized copy `o` of record `r` in perf's file,
/// placed by its perf.data offset (perf's copies have no listener).
/// `printed`: the cpu and time perf printed for it.
fn oversized_fault(
    e: &DumpEvent,
    summary: &Summary,
    o: &kloop_records::Oversized,
    printed: Stamps,
    explained_stamps: bool,
    r: &Record,
) -> Violation {
    let mut fault = Violation::new(
            RULE,
            format!(
                "perf@{:#x} `{}`: perf's copy is {} bytes longer (header.size {}) than its body and \
                 {}-byte sample_id trailer, zero-filled; perf reads the trailer from the record's end, \
                 so it printed cpu {} time {}{}; kloop reads the trailer after the body: cpu {} time {}",
                e.offset,
                summary.line.trim(),
                o.excess,
                o.size,
                o.trailer_len,
                opt(printed.cpu),
                opt(printed.time),
                if explained_stamps {
                    " (the zero bytes there)"
                } else {
                    ", which is not what the record's last bytes say either"
                },
                opt(r.sample.cpu),
                opt(r.sample.time),
            ),
        )
        .with(crate::check::Detail::OversizedRecord(
            crate::check::detail::OversizedRecord::of("perf", o),
        ));
    fault.offset = Some(e.offset);
    fault
}
