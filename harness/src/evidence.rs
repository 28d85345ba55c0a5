//! What one trial brought back from the guest, before any interpretation.

use std::collections::BTreeMap;

use kloop_protocol::{KallsymsEntry, ListenerInfo, Message, ProgFacts, Uname};

/// Everything the guest agent reported in one run, as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunEvidence {
    pub uname: Uname,
    pub online_cpus: Vec<u32>,
    /// `(sysctl path, value)` pairs the agent read.
    pub sysctls: Vec<(String, String)>,
    pub cmdline: String,
    pub listeners: Vec<ListenerInfo>,
    /// Raw bytes of each listener's ring, concatenated in stream order,
    /// keyed by `ListenerInfo::index`.
    pub streams: BTreeMap<u32, Vec<u8>>,
    /// Programs the agent loaded, in load order.
    pub progs: Vec<ProgFacts>,
    /// `/proc/kallsyms` before recording started (may be empty).
    pub initial_kallsyms: Vec<KallsymsEntry>,
    /// What each `measure` step timed, in plan order.
    pub timings: Vec<Timings>,
    /// `read-file` results, in plan order.
    pub files: Vec<FileSnapshot>,
    /// `write` steps with `may_fail`: (path, the kernel's refusal if any).
    pub file_writes: Vec<(String, Option<String>)>,
    /// `attach` (and `load-object`) results, in plan order.
    pub attached: Vec<Attachment>,
    /// `read-counter` results, in plan order.
    pub counters: Vec<CounterValue>,
    /// Bytes received per listener stream when each step started (step
    /// index, listener index → length), from the order of frames on the
    /// channel: the records before a mark were drained before that step.
    pub step_marks: Vec<(u32, BTreeMap<u32, u64>)>,
}

/// A file the guest read for a `read-file` step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSnapshot {
    pub label: String,
    pub path: String,
    pub text: String,
}

/// Where an `attach` step hooked a program.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    pub label: String,
    pub link: String,
    pub detail: String,
}

/// One `read-counter` result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub label: String,
    pub map: String,
    pub key: u32,
    pub value: u64,
}

/// One `measure` step's durations (guest `CLOCK_MONOTONIC` ns per timed
/// iteration, warm-up excluded).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timings {
    pub fixture: String,
    pub program: String,
    /// JITed functions of the program (`nr_jited_ksyms`).
    pub functions: u32,
    pub listeners_per_cpu: u32,
    pub load_ns: Vec<u64>,
    pub unload_ns: Vec<u64>,
}

impl RunEvidence {
    /// The evidence in a guest's messages (in the order sent) and the raw
    /// bytes of each listener's ring.
    pub fn from_messages(messages: &[Message], streams: BTreeMap<u32, Vec<u8>>) -> RunEvidence {
        let mut ev = RunEvidence {
            streams,
            ..Default::default()
        };
        for m in messages {
            match m {
                Message::Hello {
                    uname, online_cpus, ..
                } => {
                    ev.uname = uname.clone();
                    ev.online_cpus = online_cpus.clone();
                }
                Message::KernelFacts { sysctls, cmdline } => {
                    ev.sysctls = sysctls.clone();
                    ev.cmdline = cmdline.clone();
                }
                Message::Listener(l) => {
                    // A listener whose ring stayed empty still has a stream.
                    ev.streams.entry(l.index).or_default();
                    ev.listeners.push(l.clone());
                }
                Message::Prog(p) => ev.progs.push(p.clone()),
                Message::InitialKallsyms { entries } => {
                    ev.initial_kallsyms.extend(entries.iter().cloned())
                }
                Message::Timings {
                    fixture,
                    program,
                    functions,
                    listeners_per_cpu,
                    load_ns,
                    unload_ns,
                } => ev.timings.push(Timings {
                    fixture: fixture.clone(),
                    program: program.clone(),
                    functions: *functions,
                    listeners_per_cpu: *listeners_per_cpu,
                    load_ns: load_ns.clone(),
                    unload_ns: unload_ns.clone(),
                }),
                Message::FileSnapshot { label, path, text } => ev.files.push(FileSnapshot {
                    label: label.clone(),
                    path: path.clone(),
                    text: text.clone(),
                }),
                Message::FileWrite { path, error } => {
                    ev.file_writes.push((path.clone(), error.clone()))
                }
                Message::Attached {
                    label,
                    link,
                    detail,
                } => ev.attached.push(Attachment {
                    label: label.clone(),
                    link: link.clone(),
                    detail: detail.clone(),
                }),
                Message::Counter {
                    label,
                    map,
                    key,
                    value,
                } => ev.counters.push(CounterValue {
                    label: label.clone(),
                    map: map.clone(),
                    key: *key,
                    value: *value,
                }),
                _ => {}
            }
        }
        ev
    }
}
