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

/// Reads perf's side-band records, comparing its parse with kloop's.
pub(super) fn perf_records(dump: &PerfDump, bad: &mut Vec<String>) -> Vec<PerfRecord> {
    let mut out = Vec::new();
    let sample_type = dump.sample_types.first().copied().unwrap_or(0);
    let listener = ListenerInfo {
        index: u32::MAX,
        cpu: -1,
        sample_type,
        sample_id_all: dump.sample_id_all,
        ksymbol: true,
        bpf_event: true,
        ..ListenerInfo::default()
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
