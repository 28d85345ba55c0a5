//! The plan a guest agent executes, built by the host from `scenario.toml`.

use serde::{Deserialize, Serialize};

/// One perf listener configuration. The host computes the bits; the guest
/// passes them to `perf_event_open` unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSpec {
    /// `perf_event_attr.sample_type`.
    pub sample_type: u64,
    pub ksymbol: bool,
    pub bpf_event: bool,
    /// Data pages per ring (power of two). 0: no ring at all (the events
    /// are opened but never mmapped, so the kernel finds no buffer to write
    /// to and must skip them); such listeners are not announced and send
    /// nothing.
    pub ring_pages: u32,
    /// Where the listener looks: one per online CPU (the default), or one
    /// bound to the agent's own task on any CPU (`pid = 0, cpu = -1`).
    #[serde(default)]
    pub scope: ListenerScope,
    /// `attr.inherit`: a task-bound listener also follows the threads and
    /// children the task creates after it is opened; their records go to
    /// its ring (the kernel redirects an inherited event's output to its
    /// parent).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherit: bool,
    /// CPU-wide (and inherited task) listeners: open one on each of these
    /// CPUs only (every one must be online) instead of on every online
    /// CPU. The kernel writes a side-band record only to the listeners of
    /// the CPU it is emitted on (`perf_iterate_sb_cpu()` walks that CPU's
    /// `pmu_sb_events` list), so such a set sees only what happens there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
    /// Other side-band attributes to set on the event (`attr.mmap`,
    /// `attr.namespaces`, …), each asking for its own record type. They put
    /// a CPU-wide event on the CPU's side-band list (`is_sb_event()` in
    /// kernel/events/core.c: mmap, comm, task, ksymbol, bpf_event,
    /// context_switch, text_poke) even without `ksymbol` / `bpf_event`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_band: Vec<SideBand>,
    /// `attr.disabled`, never enabled: the event stays OFF, and the kernel
    /// writes no side-band record to it (`perf_iterate_sb_cpu()` and
    /// `perf_iterate_ctx()` skip events below PERF_EVENT_STATE_INACTIVE).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// `attr.sample_id_all` (default on): off, the records carry no
    /// sample_id trailer, as `perf record` on kernels before 2.6.38 wrote
    /// them; the kernel must then reserve no trailer either (the LOST
    /// record `__perf_output_begin()` prepends included).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub sample_id_all: bool,
    /// `attr.write_backward` with the ring mapped read-only: an overwrite
    /// ring the kernel fills downwards, as `perf record --overwrite` uses.
    /// The agent reads the records written since its last read and sends
    /// them oldest first, so the host sees one forward stream; the ring
    /// must hold everything between two drains.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backward: bool,
    /// A waiter in `poll(2)` on the listener's rings, from its open to the
    /// plan's end: the events get `attr.watermark` with a
    /// `wakeup_watermark` of 1 byte, so that every record wakes the waiter
    /// (`ring_buffer_init()` takes it as the ring's watermark;
    /// `perf_output_put_handle()` calls `perf_output_wakeup()` whenever
    /// the head passed it), and `use_clockid` with CLOCK_MONOTONIC, so the
    /// records' times and the waiter's wake-ups share one clock. The agent
    /// sends when each `poll` returned readable (`Wakeups`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poll: bool,
    /// With `poll`: the `wakeup_watermark` in bytes instead of 1. The
    /// kernel then wakes the poller only each time the head passed the
    /// last wake-up point by more than that (`__perf_output_begin()`
    /// moves `rb->wakeup` on by the watermark), so a waiter woken far more
    /// often than the bytes written allow sees a kernel that wakes early.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub poll_watermark: u32,
}

fn is_yes(b: &bool) -> bool {
    *b
}

/// A side-band attribute bit of `perf_event_attr` other than `ksymbol` and
/// `bpf_event`. kloop's parser knows only KSYMBOL, BPF_EVENT and LOST, so
/// a scenario that sets one must make sure the kernel has nothing of that
/// kind to report while it records (the `record-type` rule treats any
/// other record as a violation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SideBand {
    /// `attr.mmap`: PERF_RECORD_MMAP for executable mappings.
    Mmap,
    /// `attr.comm`: PERF_RECORD_COMM when a task is (re)named.
    Comm,
    /// `attr.task`: PERF_RECORD_FORK / EXIT.
    Task,
    /// `attr.namespaces`: PERF_RECORD_NAMESPACES on unshare / setns /
    /// clone with new namespaces.
    Namespaces,
    /// `attr.cgroup`: PERF_RECORD_CGROUP when a cgroup is created.
    Cgroup,
    /// `attr.text_poke`: PERF_RECORD_TEXT_POKE when kernel text changes.
    TextPoke,
}

/// What a listener is bound to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListenerScope {
    /// One listener per online CPU, `pid = -1`.
    #[default]
    CpuWide,
    /// One listener for the agent's own task (the loader), `cpu = -1`.
    Task,
}

/// How an attach step hooks a loaded program into the kernel. The program's
/// type must fit the target (aya checks and the agent reports the mismatch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AttachTarget {
    /// kprobe on `function` + `offset`. With `offset = "first-insn-after-entry"`
    /// semantics (`after_entry = true`) the agent tries offsets 1.. until the
    /// kernel accepts one: that probe sits past the ftrace call site, so it
    /// needs an out-of-line instruction slot.
    ///
    /// With `clones`, a function the compiler cloned in this build
    /// (`perf_iterate_sb.constprop.0`, `.isra.0`: gcc's interprocedural
    /// clones keep the body under a suffixed name) is probed under that
    /// name when the plain name is not in /proc/kallsyms; more than one
    /// clone is refused, since a probe on one would miss the others' calls.
    Kprobe {
        function: String,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        after_entry: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        clones: bool,
    },
    Kretprobe {
        function: String,
    },
    Tracepoint {
        category: String,
        name: String,
    },
    /// fentry/fexit/LSM programs attach where they were loaded for (the
    /// load step's `btf_target`).
    Btf,
    /// XDP on `interface` (created by an earlier `veth` step or existing).
    Xdp {
        interface: String,
        #[serde(default)]
        mode: XdpMode,
    },
    /// A software `cpu-clock` sampling event on `cpu` with this period (ns);
    /// the program runs as its overflow handler.
    PerfEventCpuClock {
        cpu: u32,
        sample_period: u64,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdpMode {
    #[default]
    Native,
    Generic,
}

/// One step. The agent runs them in order and reports each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// A misspelt field of a step in scenario.toml (`timout_ms`) is refused,
// naming it, rather than silently left at its default.
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Read `/proc/kallsyms` before recording starts.
    SnapshotKallsyms,
    /// Open one listener of this spec on every online CPU.
    OpenListeners {
        listener: ListenerSpec,
    },
    /// Close the listeners the plan's step `step` (an `open-listeners`)
    /// opened: their rings are read to the head and sent first, then
    /// unmapped and their events closed, so the kernel's side-band lists
    /// and counters (`unaccount_event()`) no longer hold them.
    CloseListeners {
        step: u32,
    },
    /// Load `program` from the embedded fixture object `fixture` and report
    /// its `bpf_prog_info` and kallsyms lines under `label`.
    Load {
        fixture: String,
        program: String,
        label: String,
        /// For fentry/fexit/LSM programs: the kernel function (or LSM hook)
        /// they are verified against, resolved in the kernel's BTF.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        btf_target: Option<String>,
    },
    /// Load every program of fixture `fixture` and attach each where its ELF
    /// section name says (`kprobe/<fn>`, `kretprobe/<fn>`,
    /// `tracepoint/<category>/<name>`), as `perf bpf record --object` did.
    /// Programs get facts labelled `<label>/<program>`; `unload` of `label`
    /// detaches and unloads them all.
    LoadObject {
        fixture: String,
        label: String,
    },
    /// Attach the loaded program `label`; the link is held under `link` and
    /// outlives an `unload` of the program until `detach`.
    Attach {
        label: String,
        link: String,
        target: AttachTarget,
    },
    /// Attach the loaded kprobe program `label` past the entry (off the
    /// ftrace site) of successive functions whose name starts with
    /// `prefix`, in /proc/kallsyms order, until /proc/kallsyms lists
    /// `optinsn_pages` `kprobe_optinsn_page` symbols (every optimizable
    /// probe takes a slot of one at registration), with at most
    /// `max_probes` probes; functions that take no probe are skipped. All
    /// are held as link `link`: its `detach` unregisters them together,
    /// which frees enough slots for the kernel to free a page that is not
    /// the last (`collect_one_slot` keeps the last one).
    KprobeFill {
        label: String,
        link: String,
        prefix: String,
        optinsn_pages: u32,
        max_probes: u32,
    },
    /// Drop the link `link` (closes its perf event / bpf_link / netlink hook).
    Detach {
        link: String,
    },
    /// Enumerate every loaded program as `perf record` does at start
    /// (`BPF_PROG_GET_NEXT_ID` + `BPF_OBJ_GET_INFO_BY_FD`) and report them
    /// as an `Inventory`.
    Inventory,
    /// Wait until no `/proc/kallsyms` symbol starting with `prefix` is
    /// (`present = false`) or some is (`present = true`), at most `timeout_ms`.
    /// With `count`, until exactly that many are (e.g. 1: a replaced
    /// trampoline image is gone and only its successor is left).
    WaitKallsyms {
        prefix: String,
        present: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u32>,
        timeout_ms: u64,
    },
    /// Write `text` to `path` (sysctls, tracefs). With `may_fail`, a refusal
    /// is reported as a `FileWrite` message instead of failing the step.
    Write {
        path: String,
        text: String,
        #[serde(default)]
        may_fail: bool,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    /// Read `path` and report it as a `FileSnapshot` under `label`.
    ReadFile {
        path: String,
        label: String,
    },
    /// Make the kernel run code paths that attached programs hook:
    /// `count` calls of `nanosleep(0)`, `getpid` etc., or `sleep_ms` of idle
    /// time (cpu-clock samples need time to pass).
    Trigger {
        #[serde(default)]
        nanosleeps: u32,
        #[serde(default)]
        sleep_ms: u64,
    },
    /// Read the `u64` at index `key` of array map `map` of the loaded
    /// program `label`'s object and report it as a `Counter`.
    ReadCounter {
        label: String,
        map: String,
        key: u32,
    },
    /// Create a veth pair `name` / `peer` and bring both up (needs the veth
    /// module, inserted from the initramfs by `modprobe`).
    Veth {
        name: String,
        peer: String,
    },
    /// Insert kernel module `name` (shipped in the initramfs by the host
    /// because the scenario's `modules` list names it).
    Modprobe {
        name: String,
    },
    /// On every online CPU, one thread pinned to it loads and unloads
    /// `program` of `fixture` `cycles` times, all at once; each reports the
    /// ids it loaded as a `Loads` message.
    ///
    /// With `churn` > 0 the agent's main thread meanwhile opens `churn`
    /// CPU-wide ksymbol + bpf_event events on every online CPU (no ring)
    /// and closes them again, over and over until the loaders are done:
    /// the side-band lists and counters change under the emitters' walks
    /// (`perf_iterate_sb()` under RCU against `list_add_rcu()` /
    /// `list_del_rcu()` in account/unaccount), which must never hide a
    /// record from a listener that stays open throughout.
    Concurrent {
        fixture: String,
        program: String,
        cycles: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        churn: u32,
    },
    /// Load `r0 = 0; exit` as a socket filter with the bpf syscall alone:
    /// no program name and no BTF, which no loader library sends (aya, like
    /// libbpf, names every program after its function). The kernel names
    /// its symbol `bpf_prog_<tag>` with nothing after the tag
    /// (bpf_prog_ksym_set_name: no func_info, empty aux->name).
    LoadUnnamed {
        label: String,
    },
    /// Drop every reference the agent holds on the program `label`.
    Unload {
        label: String,
    },
    /// Wait until no program the agent loaded is visible by id any more
    /// (unloads can be deferred to a worker), at most `timeout_ms`.
    WaitUnloaded {
        timeout_ms: u64,
    },
    /// Pause (`paused = true`) or resume the output of every listener
    /// opened so far (`PERF_EVENT_IOC_PAUSE_OUTPUT`). While a ring is
    /// paused the kernel drops each record it would write there and counts
    /// it as lost (`__perf_output_begin`); the first record written after
    /// the resume is preceded by a `PERF_RECORD_LOST` with that count. A
    /// plan that pauses provokes loss, and its records are accounted like a
    /// storm's that never drains.
    PauseOutput {
        paused: bool,
    },
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
    ///
    /// `drain_every = 0` never drains during the storm (overflow scenario).
    /// With `lookup`, a side-band thread reads the rings while the storm
    /// runs and opens each PROG_LOAD id with `BPF_PROG_GET_FD_BY_ID` right
    /// away, as perf's side-band thread does, and reports a `Lookups`.
    /// Either way the storm ends with a `StormDone`.
    Storm {
        fixture: String,
        program: String,
        cycles: u32,
        drain_every: u32,
        #[serde(default)]
        lookup: bool,
    },
    /// Start the real `perf` (shipped in the initramfs) as
    /// `perf record <args>` in the background, writing `/tmp/perf.data`;
    /// waits until it has opened its events.
    PerfRecordStart {
        args: Vec<String>,
    },
    /// Run the program at `path` (shipped in the initramfs: a scenario's
    /// `[[programs]]`, such as a stand-alone reproducer) with `args`, its
    /// stdout and stderr captured, killed after `timeout_ms`; reports a
    /// `ProgramRun`. Exit 0 passes, 77 skips (automake's convention: the
    /// program could not run here), anything else fails the trial.
    RunProgram {
        path: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default = "default_program_timeout_ms")]
        timeout_ms: u64,
    },
    /// Stop `perf record` (SIGINT), wait for it, run
    /// `perf report -D --header` on its data (the only perf output with every
    /// field: `perf script --show-bpf-events` prints no BPF_EVENT tag) and
    /// report the text as a `PerfScript`.
    PerfRecordStop,
    /// Systematic allocation failures in one syscall (the fail-nth
    /// technique, Documentation/fault-injection/fault-injection.rst): for
    /// N = 1, 2, …, arm `/proc/thread-self/fail-nth` with N, run the
    /// `target`'s syscall once, read fail-nth back (0: the N-th fault point
    /// failed; otherwise the syscall ended before reaching N points), undo
    /// what a successful attempt did, and stop at the first attempt that
    /// reached no injected fault. GFP_KERNEL allocations are made eligible in
    /// debugfs (failslab, fail_page_alloc) for the sweep and restored after.
    /// An attempt that failed must fail with an errno; more than
    /// `max_attempts` attempts is an error. Reports a `FailNthSweep`.
    ///
    /// With `page_allocations = false`, only slab allocations are made
    /// fault points: a page allocation whose presence depends on timing
    /// (kfree_rcu's batching takes a page now and then) would change the
    /// number of attempts, and so the records, from run to run.
    FailNth {
        target: SweepTarget,
        #[serde(default = "default_max_attempts")]
        max_attempts: u32,
        #[serde(default = "yes")]
        page_allocations: bool,
    },
    /// Load the `ksymwatch` fixture and attach it as a kprobe on
    /// `perf_event_ksymbol`: from now on every KSYMBOL the kernel emits is
    /// observed at emission, with how the kernel's own symbolizer resolves
    /// its address at that instant. Its own load and attach are not
    /// reported as a program (run it before `snapshot-kallsyms` and
    /// `open-listeners`, so nothing of it is recorded).
    WatchKsymbols,
    /// Read out what `watch-ksymbols` observed so far and report it as a
    /// `KsymbolWatch`.
    ReadKsymbolWatch,
    /// A `BPF_PROG_LOAD` that must fail after the JIT: a socket filter with
    /// a BPF-to-BPF subprogram, loaded with a verifier log too small for
    /// its level-2 output, so `bpf_check` returns ENOSPC once
    /// `jit_subprogs` has JITed (and added to kallsyms) the subprograms.
    /// Any other outcome fails the step.
    FailedLoad,
    /// Attach the loaded tracing program `label` (fentry/fexit/LSM, which
    /// `BPF_RAW_TRACEPOINT_OPEN` takes with no name) from a thread that has
    /// dropped every capability (`capset`), so the trampoline image it
    /// makes is charged by a caller that is not `bpf_capable()`; detach
    /// again on success. With `over_limit`, `net.core.bpf_jit_limit` is
    /// set to 1 byte around the attach: bpf_jit_charge_modmem() must then
    /// refuse the charge with EPERM (kernel/bpf/core.c), where a root
    /// caller would be let past. `unprivileged_bpf_disabled` is set to 0
    /// around it when it is 2 (5.10 refuses every bpf() command to such a
    /// caller otherwise). Reported as `UnprivilegedAttach` (rule
    /// `jit-limit`).
    UnprivilegedAttach {
        label: String,
        #[serde(default)]
        over_limit: bool,
    },
    /// Build a trampoline image whose size is a whole number of the JIT
    /// pack's 64-byte chunks, with live code in the chunk right after it,
    /// and free it: the size an image is allocated, freed and (on the
    /// error path) given back with must agree to the byte there, or a
    /// chunk leaks or a neighbour's chunk is freed under it. Loads copies
    /// of `fixture`/`program` against `btf_target` and attaches each with
    /// `BPF_LINK_CREATE` and a chosen `bpf_cookie`, whose immediate is the
    /// one part of a trampoline's code whose length the caller picks
    /// (emit_mov_imm64 in arch/x86/net/bpf_jit_comp.c: 2, 5, 7 or 10
    /// bytes); loads `r0 = 0` socket filters until the next chunk holds
    /// one; reads the allocator (`BooksMoment`) with it live, after the
    /// image is freed and, with `fail_nth`, after every attempt of a
    /// slab-only fail-nth sweep over the attach that rebuilds it (its
    /// percpu_ref_init failing frees the image on bpf_tramp_image_alloc's
    /// error path). Closes everything it made; reports a `PackBoundary`
    /// and the programs as two `StormDone` batches.
    PackBoundary {
        fixture: String,
        program: String,
        btf_target: String,
        #[serde(default)]
        fail_nth: bool,
    },
    /// The real perf as a consumer of the side band (rule
    /// `perf-attribution`): loads `program` of `fixture` (fentry, against
    /// `btf_target`), fills the JIT pack's holes with one-chunk socket
    /// filters, then starts `perf record <perf_args>`; while it records,
    /// loads a hole-maker and right after it the workload (a straight-line
    /// socket filter), unloads the hole-maker and attaches the fentry
    /// program, whose trampoline image the pack hands the hole: right
    /// below the workload (checked against the books, and said where the
    /// kernel gives an image a page of its own). Runs the workload with
    /// BPF_PROG_TEST_RUN for `run_ms`, stops perf, runs `perf script -F
    /// ip,sym` and reports a `PerfAttribution`; closes everything.
    PerfAttribution {
        fixture: String,
        program: String,
        btf_target: String,
        perf_args: Vec<String>,
        run_ms: u64,
    },
    /// Register a `tcp_congestion_ops` through a `BPF_MAP_TYPE_STRUCT_OPS`
    /// map and unregister it again, with raw `bpf(2)` (aya cannot load
    /// struct_ops programs or create struct_ops maps). Three
    /// `BPF_PROG_TYPE_STRUCT_OPS` programs (`r0 = 0; exit`) are loaded for
    /// the members `ssthresh`, `cong_avoid` and `undo_cwnd` (what
    /// tcp_validate_congestion_control() asks for), each with
    /// `attach_btf_id` the vmlinux BTF id of `tcp_congestion_ops` and
    /// `expected_attach_type` its member index; the map's value
    /// (`bpf_struct_ops_tcp_congestion_ops`) is laid out from vmlinux BTF
    /// with `data.name` = `name` and each member its program's fd.
    /// `BPF_MAP_UPDATE_ELEM` registers it (kernel/bpf/bpf_struct_ops.c:
    /// bpf_struct_ops_map_update_elem() writes one trampoline per member
    /// into one image page and, where the kernel names them, adds a
    /// `bpf__tcp_congestion_ops_<member>` symbol for each),
    /// `BPF_MAP_DELETE_ELEM` unregisters it and closing the map frees it
    /// (deferred: bpf_struct_ops_map_free() deletes the symbols, waits for
    /// RCU and RCU-tasks grace periods, then frees the image and puts the
    /// programs). The step waits up to `timeout_ms` for the symbols to
    /// leave /proc/kallsyms, closes the programs (`wait-unloaded` waits
    /// for them) and reports `StructOps` and each program's facts.
    StructOps {
        name: String,
        #[serde(default = "default_struct_ops_timeout_ms")]
        timeout_ms: u64,
    },
    /// Check that the kernel writes a record's bytes before it publishes
    /// them (rule `published-bytes`): one `listener` (ksymbol / bpf_event,
    /// `sample_id_all`) is opened on CPU 0 alone and mapped writable (a
    /// non-overwrite ring: the reader owns `data_tail`); a reader thread
    /// pinned to CPU 1 spins on its `data_head` and, each time it moves,
    /// checks the new records' sample_id trailers against what the kernel
    /// must have written there (see `SpinReading`); meanwhile the agent's
    /// main thread, pinned to CPU 0, loads and unloads `program` of
    /// `fixture` `cycles` times. Reports a `SpinRead`. Needs two CPUs
    /// (`two-cpus`).
    SpinRead {
        listener: ListenerSpec,
        fixture: String,
        program: String,
        cycles: u32,
        /// Epoll instances to register on the listener's fd: the wake-up
        /// each record queues right after its `data_head` store (a 1-byte
        /// watermark, `poll`) calls every one's callback, which lengthens
        /// the kernel's path between publishing a record and leaving
        /// `perf_output_end()`.
        #[serde(default, skip_serializing_if = "is_zero")]
        waiters: u32,
    },
    /// Deliberately break something, to prove the host catches it. Only the
    /// fault-injection tests use this.
    Fault {
        fault: Fault,
    },
}

fn default_max_attempts() -> u32 {
    200
}

fn yes() -> bool {
    true
}

/// The one syscall a `fail-nth` step sweeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum SweepTarget {
    /// Attach the loaded fentry/fexit/LSM program `label` where it was
    /// loaded for (`BPF_RAW_TRACEPOINT_OPEN` on its fd): the attach builds
    /// a BPF trampoline image (`bpf_tramp_image_alloc`). A successful
    /// attempt's link is closed again.
    Attach { label: String },
    /// Open a disabled kprobe perf event (kprobe PMU) on `function` just
    /// past its ftrace call site: a probe that needs an out-of-line
    /// instruction slot, so the first one of a boot allocates the
    /// `kprobe_insn_page` (`__get_insn_slot`). A successful attempt's event
    /// is closed again (the kernel keeps the page).
    KprobeSlot { function: String },
    /// Attach the loaded XDP program `label` to `interface` in native mode
    /// with `BPF_LINK_CREATE` (`BPF_XDP`, `XDP_FLAGS_DRV_MODE`): the
    /// boot's first XDP attach builds the XDP dispatcher
    /// (`bpf_dispatcher_change_prog`: its image from a program pack, its
    /// read-write copy from `bpf_jit_alloc_exec`). A successful attempt's
    /// link is closed again; the kernel keeps the dispatcher.
    XdpAttach { label: String, interface: String },
}

impl SweepTarget {
    /// The target's `kind`, as the plan spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            SweepTarget::Attach { .. } => "attach",
            SweepTarget::KprobeSlot { .. } => "kprobe-slot",
            SweepTarget::XdpAttach { .. } => "xdp-attach",
        }
    }
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
    /// Start a frame under the port lock, write part of it, and panic
    /// while still holding the lock: the panic hook's report lands in the
    /// middle of the cut frame.
    PanicMidFrame,
    /// Send well-formed `Records` frames without end: a runaway agent the
    /// host must stop at its channel limit.
    Flood,
}

/// Everything the agent needs to run one trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub scenario: String,
    /// Feature probes the kernel must pass, run by the agent before any
    /// step; the first that fails ends the run with `Unsupported`.
    #[serde(default)]
    pub requires: Vec<Requirement>,
    /// Kernel parameters the agent sets before anything else, even the
    /// probes: a mutant schema kernel's `kloop_mutant`, which picks the
    /// mutant a restored VM runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamWrite>,
    pub steps: Vec<Step>,
}

/// `value` written to `/sys/module/<module>/parameters/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamWrite {
    pub module: String,
    pub name: String,
    pub value: String,
}

impl ParamWrite {
    /// The sysfs file, or `None` when a part could leave the parameters
    /// directory (a `/` or `..`).
    pub fn path(&self) -> Option<String> {
        let ok = |p: &str| !p.is_empty() && !p.contains('/') && p != "." && p != "..";
        (ok(&self.module) && ok(&self.name))
            .then(|| format!("/sys/module/{}/parameters/{}", self.module, self.name))
    }
}

/// A kernel feature a scenario needs, probed in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Requirement {
    /// `/sys/kernel/btf/vmlinux` exists.
    Btf,
    /// `net.core.bpf_jit_enable` is not 0.
    Jit,
    /// `net.core.bpf_jit_enable` can be set to 0 (not `BPF_JIT_ALWAYS_ON`).
    JitOptional,
    /// fentry/fexit programs load (BTF + trampolines).
    Fentry,
    /// `bpf` is in `/sys/kernel/security/lsm`.
    LsmBpf,
    /// kprobes can be registered and `/sys/kernel/debug/kprobes/list` exists.
    Kprobes,
    /// A function tracer instance can be created in tracefs.
    FtraceInstances,
    /// The veth module loads and a veth pair can be made.
    Veth,
    /// `perf` runs in the guest (the host shipped it).
    PerfTool,
    /// The agent can run threads: `futex(2)` exists (`CONFIG_FUTEX`).
    /// Implied by steps that run threads (concurrent, a storm with
    /// lookups, perf).
    Threads,
    /// Syscall tracepoints exist in tracefs (`CONFIG_FTRACE_SYSCALLS`).
    SyscallTracepoints,
    /// `/proc/thread-self/fail-nth` and the failslab / fail_page_alloc
    /// knobs in debugfs exist (`CONFIG_FAULT_INJECTION`, `CONFIG_FAILSLAB`,
    /// `CONFIG_FAIL_PAGE_ALLOC`, `CONFIG_FAULT_INJECTION_DEBUG_FS`).
    FaultInjection,
    /// `bpf_snprintf` (5.13) can symbolize an address with `%ps` in a
    /// kprobe program: the `watch-ksymbols` step needs it.
    BpfSnprintf,
    /// Kernel symbols may be 511 bytes long: `KSYM_NAME_LEN` is 512 from
    /// 6.1 on (128 before), and a BTF function name may be as long
    /// (`btf_name_valid_identifier()` in kernel/bpf/btf.c), so a program's
    /// `bpf_prog_<tag>_<function>` symbol can pass 256 bytes.
    LongSymbolNames,
    /// A kprobe can sit on `perf_iterate_sb()` (or its one compiler
    /// clone), the walk of the side-band lists every emitter goes through:
    /// the `sideband-quiet` scenario counts its calls. Kprobes first.
    SideBandWalkKprobe,
    /// Trampoline images are carved out of `bpf_prog_pack` with their
    /// exact size (`arch_alloc_bpf_trampoline()`, x86 since 6.7, where
    /// `struct bpf_tramp_image` has `size`), and the JIT's books can be
    /// read through /proc/kcore (`CONFIG_PROC_KCORE`).
    TrampolinePacks,
    /// A `tcp_congestion_ops` can be registered from BPF: vmlinux BTF
    /// has `bpf_struct_ops_tcp_congestion_ops` (kernel/bpf/bpf_struct_ops.c
    /// emits it for each struct_ops type; net/ipv4/bpf_tcp_ca.c, with
    /// `CONFIG_INET`) and the JIT is on (a struct_ops trampoline is arch
    /// code: arch_prepare_bpf_trampoline(), `CONFIG_BPF_JIT`).
    StructOps,
    /// The kernel names each struct_ops trampoline
    /// (`bpf__<type>_<member>`, bpf_struct_ops_ksym_init() in
    /// kernel/bpf/bpf_struct_ops.c, announced by bpf_image_ksym_add()):
    /// vmlinux BTF's `struct bpf_struct_ops_map` has the member `ksyms`
    /// that came with it. A stable backport can bring it into an older
    /// series, so the probe decides, not the release.
    StructOpsKsyms,
    /// CPUs 0 and 1 are online: a reader on one watches a ring the other
    /// writes (`spin-read`).
    TwoCpus,
    /// Kprobes are optimized into jumps to `kprobe_optinsn_page` slots
    /// (`CONFIG_OPTPROBES`, which only x86, arm and powerpc can select:
    /// `HAVE_OPTPROBES`): `/proc/sys/debug/kprobes-optimization` exists
    /// (kernel/kprobes.c). The `kprobe-fill` step fills optinsn pages.
    Optprobes,
    /// A dynamically allocated `ftrace_ops` gets a trampoline of its own
    /// (an OOL `ftrace_trampoline` symbol): only where the architecture
    /// implements arch_ftrace_update_trampoline(), which x86 does
    /// (arch/x86/kernel/ftrace.c) and arm64 does not (its ops are called
    /// from ftrace_caller, or through the call-ops literal from 6.8).
    FtraceTrampolines,
}

impl Requirement {
    /// Every requirement, in declaration order (the docs list them from
    /// here; `name_every_variant` keeps it whole).
    pub const ALL: &'static [Requirement] = &[
        Requirement::Btf,
        Requirement::Jit,
        Requirement::JitOptional,
        Requirement::Fentry,
        Requirement::LsmBpf,
        Requirement::Kprobes,
        Requirement::FtraceInstances,
        Requirement::Veth,
        Requirement::PerfTool,
        Requirement::Threads,
        Requirement::SyscallTracepoints,
        Requirement::FaultInjection,
        Requirement::BpfSnprintf,
        Requirement::LongSymbolNames,
        Requirement::SideBandWalkKprobe,
        Requirement::TrampolinePacks,
        Requirement::StructOps,
        Requirement::StructOpsKsyms,
        Requirement::TwoCpus,
        Requirement::Optprobes,
        Requirement::FtraceTrampolines,
    ];

    /// Its name in `scenario.toml`'s `requires` (`jit-optional`).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// A new variant fails to compile here until it is in [`Requirement::ALL`]
/// too (the index is its place there).
#[allow(dead_code)]
const fn name_every_variant(r: Requirement) -> usize {
    match r {
        Requirement::Btf => 0,
        Requirement::Jit => 1,
        Requirement::JitOptional => 2,
        Requirement::Fentry => 3,
        Requirement::LsmBpf => 4,
        Requirement::Kprobes => 5,
        Requirement::FtraceInstances => 6,
        Requirement::Veth => 7,
        Requirement::PerfTool => 8,
        Requirement::Threads => 9,
        Requirement::SyscallTracepoints => 10,
        Requirement::FaultInjection => 11,
        Requirement::BpfSnprintf => 12,
        Requirement::LongSymbolNames => 13,
        Requirement::SideBandWalkKprobe => 14,
        Requirement::TrampolinePacks => 15,
        Requirement::StructOps => 16,
        Requirement::StructOpsKsyms => 17,
        Requirement::TwoCpus => 18,
        Requirement::Optprobes => 19,
        Requirement::FtraceTrampolines => 20,
    }
}

// Every variant's index names its own place in ALL, and ALL has no more.
const _: () = {
    let mut i = 0;
    while i < Requirement::ALL.len() {
        assert!(name_every_variant(Requirement::ALL[i]) == i);
        i += 1;
    }
    assert!(Requirement::ALL.len() == name_every_variant(Requirement::FtraceTrampolines) + 1);
};

impl Step {
    /// The step on one line, `op key=value …`, from its JSON form: how a
    /// person is shown it (`kloop-run --list`, the by-hand report).
    pub fn one_line(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        let Some(map) = value.as_object() else {
            return value.to_string();
        };
        let mut line = map
            .get("op")
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string();
        for (k, v) in map.iter().filter(|(k, _)| k.as_str() != "op") {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            line.push_str(&format!(" {k}={v}"));
        }
        line
    }
}

fn default_program_timeout_ms() -> u64 {
    60_000
}

fn default_struct_ops_timeout_ms() -> u64 {
    15_000
}

/// For `skip_serializing_if`: a zero count is the field's default.
fn is_zero(n: &u32) -> bool {
    *n == 0
}
