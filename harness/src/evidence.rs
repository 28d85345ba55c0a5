//! What one trial brought back from the guest, before any interpretation.

use std::collections::BTreeMap;

use kloop_protocol::{KallsymsEntry, ListenerInfo, ProgFacts, Uname};

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
