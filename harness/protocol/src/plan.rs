//! The plan a guest agent executes, built by the host from `scenario.toml`.

use serde::{Deserialize, Serialize};

/// One perf listener configuration. The host computes the bits; the guest
/// passes them to `perf_event_open` unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerSpec {
    /// `perf_event_attr.sample_type`.
    pub sample_type: u64,
    pub ksymbol: bool,
    pub bpf_event: bool,
    /// Data pages per ring (power of two).
    pub ring_pages: u32,
}

/// One step. The agent runs them in order and reports each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Step {
    /// Read `/proc/kallsyms` before recording starts.
    SnapshotKallsyms,
    /// Open one listener of this spec on every online CPU.
    OpenListeners { listener: ListenerSpec },
    /// Load `program` from the embedded fixture object `fixture` and report
    /// its `bpf_prog_info` and kallsyms lines under `label`.
    Load {
        fixture: String,
        program: String,
        label: String,
    },
    /// Drop every reference the agent holds on the program `label`.
    Unload { label: String },
    /// Wait until no program the agent loaded is visible by id any more
    /// (unloads can be deferred to a worker), at most `timeout_ms`.
    WaitUnloaded { timeout_ms: u64 },
    /// Read every ring to its head and send the bytes.
    Drain,
    /// Time the kernel path that emits KSYMBOL / BPF_EVENT: load and unload
    /// `program` of `fixture` `warmup + iterations` times with
    /// `listeners_per_cpu` extra listeners open on every CPU (opened for this
    /// step and closed after it), and report every iteration's duration.
    Measure {
        fixture: String,
        program: String,
        listeners_per_cpu: u32,
        iterations: u32,
        warmup: u32,
    },
    /// Load and unload `program` of `fixture` `cycles` times while the plan's
    /// listeners (opened by an earlier `open-listeners`) record, draining
    /// every ring to the host every `drain_every` cycles (and once at the
    /// end) so that none overflows. Reports nothing else: the programs get
    /// no `ProgFacts`, only their records travel.
    Storm {
        fixture: String,
        program: String,
        cycles: u32,
        drain_every: u32,
    },
    /// Deliberately break something, to prove the host catches it. Only the
    /// fault-injection tests use this.
    Fault { fault: Fault },
}

/// A fault the agent can inject on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Crash the guest kernel (`echo c > /proc/sysrq-trigger`).
    KernelPanic,
    /// Stop heartbeats and every other frame, and block forever.
    Hang,
    /// `abort()` the agent (PID 1 dies: the kernel panics "Attempted to kill init").
    Abort,
    /// Panic inside the agent (its panic hook reports and powers off).
    AgentPanic,
    /// Write bytes that are not a valid frame, then carry on.
    GarbageFrame,
}

/// Everything the agent needs to run one trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub scenario: String,
    pub steps: Vec<Step>,
}
