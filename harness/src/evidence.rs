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
                _ => {}
            }
        }
        ev
    }
}
