//! What one trial brought back from the guest, before any interpretation.

use std::collections::{BTreeMap, BTreeSet};

use kloop_protocol::{
    JitReading, KallsymsEntry, ListenerInfo, Message, ProgFacts, Requirement, Step, Uname,
};

/// What the kernel said about itself while a plan ran
/// ([`kloop_protocol::Message::KernelLog`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelLog {
    /// The log's messages from the first step on, one per record (a
    /// stack frame is a record of its own, starting with a space).
    pub kmsg: Vec<String>,
    /// The agent's cap cut the records after the last in `kmsg`.
    pub truncated: bool,
    /// Records the log overwrote before the agent read them.
    pub overrun: u32,
    /// Why /dev/kmsg could not be watched; `kmsg` then proves nothing.
    pub kmsg_error: Option<String>,
    /// kmemleak's list after the final scans; `None` without kmemleak.
    pub kmemleak: Option<String>,
    /// Why kmemleak could not be scanned where it exists.
    pub kmemleak_error: Option<String>,
    /// kmemleak's list was cut at the agent's cap.
    pub kmemleak_truncated: bool,
    /// lockdep's `debug_locks` after the plan; `None` without lockdep.
    pub lockdep_on: Option<bool>,
}

/// The JIT's books as the agent read them
/// ([`kloop_protocol::Message::JitBooks`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JitBooks {
    /// Before the first step.
    pub start: JitReading,
    /// After the plan, everything it made closed.
    pub end: JitReading,
    /// How long the end reading waited for the counter.
    pub settle_ns: u64,
    /// The `[bpf]` symbols in /proc/kallsyms at the end reading.
    pub live: Vec<u64>,
    /// Why the books could not be read.
    pub unreadable: Option<String>,
    /// `unreadable` is the kernel's lack (a config option, a structure of
    /// a later release), not a reading that failed.
    pub unreadable_in_kernel: bool,
    /// Trampoline images seen after the attaching steps.
    pub images: Vec<kloop_protocol::ImageReading>,
    /// Why those could not be read.
    pub images_unreadable: Option<String>,
    /// `images_unreadable` is the kernel's lack.
    pub images_unreadable_in_kernel: bool,
}

/// The kernel's executable areas as the agent read them
/// ([`kloop_protocol::Message::ExecAreaReading`],
/// [`kloop_protocol::Message::ExecAreasEnd`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecAreas {
    /// Before the first step (`after_step` `None`) and after each step.
    pub readings: Vec<kloop_protocol::AreaReading>,
    /// After the plan; `None` when it could not be read.
    pub end: Option<kloop_protocol::AreaReading>,
    /// /proc/kallsyms' module-part lines right before `end`.
    pub end_symbols: Vec<KallsymsEntry>,
    /// How long the end reading waited for deferred frees.
    pub settle_ns: u64,
    /// Why the areas could not be read.
    pub unreadable: Option<String>,
    /// Whether the end message arrived.
    pub ended: bool,
}

/// What a `pack-boundary` step built and read
/// ([`kloop_protocol::Message::PackBoundary`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackBoundary {
    /// `im->size` of every image it made, in order.
    pub sizes: Vec<u32>,
    /// The boundary image's start and size.
    pub boundary: (u64, u32),
    /// The live symbol over the chunk right after it.
    pub neighbour: Option<kloop_protocol::KsymReading>,
    /// Filler programs loaded to put it there.
    pub fillers: u32,
    /// The fail-nth sweep's attempts (0 without a sweep).
    pub sweep_attempts: u32,
    /// Its attempts whose attach failed.
    pub sweep_failed: u32,
    /// The allocator read with code live.
    pub moments: Vec<kloop_protocol::BooksMoment>,
}

/// What a `struct-ops` step registered and saw
/// ([`kloop_protocol::Message::StructOps`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StructOpsRun {
    /// The congestion control's name.
    pub name: String,
    /// The map's value type, from vmlinux BTF.
    pub value_type: String,
    /// Its size, from vmlinux BTF (the map's `value_size`).
    pub value_size: u32,
    /// Each function member filled, with its program's id.
    pub members: Vec<(String, u32)>,
    /// The trampolines' /proc/kallsyms lines while registered.
    pub trampolines: Vec<KallsymsEntry>,
    /// Their extents as `bpf_kallsyms` holds them (empty where the JIT's
    /// books cannot be read).
    pub extents: Vec<kloop_protocol::KsymReading>,
    /// The available congestion controls listed it while registered.
    pub listed: bool,
    /// They still listed it after the unregister.
    pub listed_after: bool,
    /// How long the trampolines' symbols took to leave /proc/kallsyms
    /// after the map was closed.
    pub gone_after_ms: u64,
}

/// Everything the guest agent reported in one run, as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunEvidence {
    /// The guest kernel's `uname`.
    pub uname: Uname,
    /// The CPUs online in the guest.
    pub online_cpus: Vec<u32>,
    /// `(sysctl path, value)` pairs the agent read.
    pub sysctls: Vec<(String, String)>,
    /// The guest kernel's command line.
    pub cmdline: String,
    /// Every listener the agent announced, in index order.
    pub listeners: Vec<ListenerInfo>,
    /// Raw bytes of each listener's ring, concatenated in stream order,
    /// keyed by `ListenerInfo::index`.
    pub streams: BTreeMap<u32, Vec<u8>>,
    /// Programs the agent loaded, in load order.
    pub progs: Vec<ProgFacts>,
    /// `/proc/kallsyms` before recording started (may be empty).
    pub initial_kallsyms: Vec<KallsymsEntry>,
    /// Whether a `snapshot-kallsyms` step sent `initial_kallsyms` (an
    /// empty list is then a real reading).
    pub initial_snapshot: bool,
    /// The generated symbols the agent read right before the plan's last
    /// drain (rule `announced`).
    pub final_kallsyms: Option<Vec<KallsymsEntry>>,
    /// What the kernel logged (and kmemleak listed) while the steps ran
    /// (`crate::kernel_log`); `None` from an agent that sent none.
    pub kernel_log: Option<KernelLog>,
    /// The JIT's books before the first step and after the plan
    /// (`crate::jit_books`); `None` from an agent that sent none.
    pub jit_books: Option<JitBooks>,
    /// The executable areas read before, during and after the plan
    /// (`crate::exec_areas`); `None` from an agent that sent none.
    pub exec_areas: Option<ExecAreas>,
    /// What `pack-boundary` steps built and read, in step order.
    pub pack_boundaries: Vec<PackBoundary>,
    /// What `struct-ops` steps registered and saw, in step order.
    pub struct_ops: Vec<StructOpsRun>,
    /// `unprivileged-attach` results, in plan order: (label, over_limit,
    /// errno name or `None` for a success).
    pub unprivileged_attaches: Vec<(String, bool, Option<String>)>,
    /// Per polled listener (`ListenerSpec::poll`): when its waiter's
    /// `poll(2)` returned readable, CLOCK_MONOTONIC ns (rule `wakeups`).
    pub wakeups: BTreeMap<u32, Vec<u64>>,
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
    /// Per listener, its last `LostSamples` count (kernels that take
    /// `PERF_FORMAT_LOST`: 6.0 on; the 5.10 pin, 5.10.223, does too).
    pub lost_samples: BTreeMap<u32, u64>,
    /// Bytes received per listener stream when each step started (step
    /// index, listener index → length), from the order of frames on the
    /// channel: the records before a mark were drained before that step.
    pub step_marks: Vec<(u32, BTreeMap<u32, u64>)>,
    /// The first `requires` probe the kernel failed, with the agent's
    /// reason: the run stopped before any step.
    pub unsupported: Option<(Requirement, String)>,
    /// Ids of `progs` whose facts arrived before the first CPU-wide
    /// listener was reported: loaded before recording started, so the
    /// stream can only show their unload.
    pub preexisting: BTreeSet<u32>,
    /// Every program an `inventory` step found (all such steps, in order).
    pub inventory: Vec<ProgFacts>,
    /// Programs loaded and unloaded without facts: one entry per `storm`
    /// step (`StormDone`) and per `concurrent` loader thread (`Loads`).
    pub batches: Vec<Batch>,
    /// What each `storm` with `lookup` found, in plan order.
    pub lookups: Vec<Lookups>,
    /// Whether the plan, as the agent echoed it step by step, provoked
    /// record loss: a `storm` with `drain_every = 0`, or a `pause-output`
    /// that pauses the rings. Only then may LOST
    /// records appear, and only in exactly accounted numbers.
    pub provoked_loss: bool,
    /// perf's own output for the plan's `perf record` run (perf_script.rs).
    pub perf_scripts: Vec<PerfScript>,
    /// What each `perf-attribution` step arranged and what perf made of
    /// its samples, in plan order (rule `perf-attribution`).
    pub perf_attributions: Vec<kloop_protocol::PerfAttribution>,
    /// The `perf.data` the plan's `perf record` wrote, put together from
    /// its `PerfData` pieces; `Err`: the pieces did not make the file.
    pub perf_data: Option<Result<Vec<u8>, String>>,
    /// What each `fail-nth` step's sweep came to, in plan order.
    pub fail_nth: Vec<FailNthSweep>,
    /// What each `run-program` step's program did, in plan order.
    pub program_runs: Vec<ProgramRun>,
    /// The last `read-ksymbol-watch` (each sends every observation so far).
    pub ksymbol_watch: Option<KsymbolWatchEvidence>,
    /// What each `spin-read` step's reader found, in plan order (rule
    /// `published-bytes`).
    pub spin_reads: Vec<kloop_protocol::SpinReading>,
    /// Every step the agent started, by plan index, as it echoed it.
    pub steps: BTreeMap<u32, Step>,
    /// Per listener: the plan step that opened it (the step whose
    /// `StepStart` came last before its `Listener`) and the
    /// `close-listeners` step that closed it, if any.
    pub windows: BTreeMap<u32, Window>,
}

/// The plan steps between which a listener was open: opened during step
/// `opened` (`None`: before any step, which only a synthetic run does),
/// closed during step `closed` (`None`: open to the end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    /// The step that opened it.
    pub opened: Option<u32>,
    /// The step that closed it.
    pub closed: Option<u32>,
}

impl Window {
    /// Whether the listener was open while step `step` ran.
    pub fn covers(&self, step: u32) -> bool {
        self.opened.is_none_or(|o| o < step) && self.closed.is_none_or(|c| step < c)
    }
}

impl RunEvidence {
    /// The window of listener `index` (open for the whole run when the
    /// agent did not say).
    pub fn window(&self, index: u32) -> Window {
        self.windows.get(&index).copied().unwrap_or_default()
    }

    /// The plan step that loaded the program labelled `label`, and the one
    /// that unloaded it (`load` / `unload` steps only).
    pub fn prog_steps(&self, label: &str) -> (Option<u32>, Option<u32>) {
        let mut load = None;
        let mut unload = None;
        for (i, s) in &self.steps {
            match s {
                Step::Load { label: l, .. } if l == label && load.is_none() => load = Some(*i),
                Step::Unload { label: l } if l == label && unload.is_none() => unload = Some(*i),
                _ => {}
            }
        }
        (load, unload)
    }

    /// Whether any step that can make a program's records ran strictly
    /// between steps `a` and `b` (in either order; `None` is before the
    /// first step, or after the last for a close): two listeners whose
    /// opens and closes are separated only by quiet steps saw the same
    /// programs come and go.
    pub fn records_made_between(&self, a: Option<u32>, b: Option<u32>, end: bool) -> bool {
        let edge = if end { u32::MAX } else { 0 };
        let (a, b) = (a.unwrap_or(edge), b.unwrap_or(edge));
        let (lo, hi) = (a.min(b), a.max(b));
        self.steps.range(lo.saturating_add(1)..hi).any(|(_, s)| {
            !matches!(
                s,
                Step::SnapshotKallsyms
                    | Step::OpenListeners { .. }
                    | Step::CloseListeners { .. }
                    | Step::Drain
                    | Step::PauseOutput { .. }
                    | Step::WaitUnloaded { .. }
                    | Step::ReadFile { .. }
                    | Step::ReadCounter { .. }
                    | Step::Inventory
            )
        })
    }
}

/// What the `watch-ksymbols` kprobe saw of `perf_event_ksymbol` calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KsymbolWatchEvidence {
    /// Every call, in the order they were seen.
    pub observations: Vec<kloop_protocol::KsymbolObservation>,
    /// Calls it could not keep (its ring was full).
    pub dropped: u64,
}

/// A `FailNthSweep` message: one `fail-nth` step's attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailNthSweep {
    /// What was swept (`attach fentry (BPF_RAW_TRACEPOINT_OPEN)`, …).
    pub target: String,
    /// Attempts made, the last one without an injected fault.
    pub attempts: u32,
    /// Attempts with an injected fault whose syscall failed.
    pub failed: u32,
    /// Their errnos by name, with counts.
    pub errnos: Vec<(String, u32)>,
    /// The agent's note on the sweep (the program, the probe's site).
    pub detail: String,
    /// The plan's target kind (`attach`, `kprobe-slot`, `xdp-attach`);
    /// `None` from an agent before protocol 14.
    pub sweep: Option<String>,
    /// The errno's name when the attempt without an injected fault failed
    /// as well (rule `fault-recovery`); `None` when it succeeded.
    pub clean_errno: Option<String>,
}

impl FailNthSweep {
    /// The failed attempts' errnos, `ENOMEM×5, EINVAL×1`, or `none`.
    pub fn errno_summary(&self) -> String {
        if self.errnos.is_empty() {
            return "none".to_string();
        }
        self.errnos
            .iter()
            .map(|(e, n)| format!("{e}×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A file the guest read for a `read-file` step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSnapshot {
    /// The step's label.
    pub label: String,
    /// The file read.
    pub path: String,
    /// Its contents.
    pub text: String,
}

/// Where an `attach` step hooked a program.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    /// The program's label.
    pub label: String,
    /// The link's name.
    pub link: String,
    /// How it was attached (the kprobe offset the kernel took, …).
    pub detail: String,
}

/// One `read-counter` result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterValue {
    /// The program's label.
    pub label: String,
    /// Its map.
    pub map: String,
    /// The key read.
    pub key: u32,
    /// The value.
    pub value: u64,
}

/// Programs one `storm` step or one `concurrent` loader thread loaded and
/// unloaded (each unloaded before the next load).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The fixture its programs came from.
    pub fixture: String,
    /// The program of the fixture.
    pub program: String,
    /// JITed functions of every program of the batch.
    pub functions: u32,
    /// Program ids, in load order.
    pub ids: Vec<u32>,
    /// For a `concurrent` thread: the CPU it was pinned to (and ran on).
    pub cpu: Option<u32>,
    /// For a `concurrent` thread: its tid (agents before it was sent: none).
    pub tid: Option<u32>,
    /// For a `storm` with `lookup`: its side-band thread's lookups.
    pub lookups: Option<Lookups>,
    /// The plan step that ran it (`None` when the agent did not say).
    pub step: Option<u32>,
}

impl Batch {
    /// `storm` or `concurrent cpu N`.
    /// A batch as a `StormDone` or `Loads` message reports it.
    fn new(
        fixture: &str,
        program: &str,
        functions: u32,
        ids: &[u32],
        cpu: Option<u32>,
        lookups: Option<Lookups>,
        step: Option<u32>,
    ) -> Batch {
        Batch {
            fixture: fixture.to_string(),
            program: program.to_string(),
            functions,
            ids: ids.to_vec(),
            cpu,
            tid: None,
            lookups,
            step,
        }
    }

    /// `storm <fixture>/<program>` or `concurrent … on CPU <n>`.
    pub fn what(&self) -> String {
        match self.cpu {
            Some(c) => format!("concurrent {}/{} on CPU {c}", self.fixture, self.program),
            None => format!("storm {}/{}", self.fixture, self.program),
        }
    }
}

/// A side-band reader's lookups (`Message::Lookups`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookups {
    /// PROG_LOAD records the reader saw.
    pub seen: u32,
    /// Ids it could open (`BPF_PROG_GET_FD_BY_ID`).
    pub found: u32,
    /// Ids already gone (ENOENT).
    pub enoent: u32,
    /// Any other errors, as the agent wrote them.
    pub other_errors: Vec<String>,
}

/// A `ProgramRun` message: a shipped program's exit and output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProgramRun {
    /// Its path in the guest.
    pub path: String,
    /// Its exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// The agent killed it at the step's timeout.
    pub timed_out: bool,
    /// stdout, then stderr after a `[stderr]` line.
    pub output: String,
}

/// Exit status a program uses to say it could not run here (automake's
/// convention); the trial is skipped with the program's words.
pub const PROGRAM_SKIP: i32 = 77;

impl ProgramRun {
    /// It exited 77: it could not run on this kernel.
    pub fn skipped(&self) -> bool {
        self.exit_code == Some(PROGRAM_SKIP) && !self.timed_out
    }

    /// It exited 0.
    pub fn passed(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// How it ended, in words: `exited 1`, `killed by signal 9 after the timeout`.
    pub fn ending(&self) -> String {
        match (self.exit_code, self.signal, self.timed_out) {
            (_, _, true) => "was killed at the step's timeout".to_string(),
            (Some(c), _, _) => format!("exited {c}"),
            (None, Some(s), _) => format!("was killed by signal {s}"),
            (None, None, _) => "ended without a status".to_string(),
        }
    }
}

/// A `PerfScript` message: the command the agent ran, its text and stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfScript {
    /// The command line.
    pub command: String,
    /// Its standard output.
    pub text: String,
    /// Its standard error.
    pub stderr: String,
}

/// One `measure` step's durations (guest `CLOCK_MONOTONIC` ns per timed
/// iteration, warm-up excluded).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timings {
    /// The fixture measured.
    pub fixture: String,
    /// Its program.
    pub program: String,
    /// JITed functions of the program (`nr_jited_ksyms`).
    pub functions: u32,
    /// Listeners open on each CPU while it was measured.
    pub listeners_per_cpu: u32,
    /// Each timed load, in ns.
    pub load_ns: Vec<u64>,
    /// Each timed unload, in ns.
    pub unload_ns: Vec<u64>,
}

impl RunEvidence {
    /// The evidence in a guest's messages (in the order sent) and the raw
    /// bytes of each listener's ring.
    pub fn from_messages(messages: &[Message], streams: BTreeMap<u32, Vec<u8>>) -> RunEvidence {
        let mut reader = Reader {
            ev: RunEvidence {
                streams,
                ..Default::default()
            },
            pending_lookups: None,
            current_step: None,
        };
        for m in messages {
            reader.take(m);
        }
        reader.ev
    }

    /// Takes a message that is a fact about the kernel as the agent found
    /// it; `false` for any other.
    fn take_kernel_fact(&mut self, m: &Message) -> bool {
        match m {
            Message::Hello {
                uname, online_cpus, ..
            } => {
                self.uname = uname.clone();
                self.online_cpus = online_cpus.clone();
            }
            Message::KernelFacts { sysctls, cmdline } => {
                self.sysctls = sysctls.clone();
                self.cmdline = cmdline.clone();
            }
            Message::Prog(p) => self.progs.push(p.clone()),
            Message::InitialKallsyms { entries } => {
                self.initial_snapshot = true;
                self.initial_kallsyms.extend(entries.iter().cloned())
            }
            Message::FinalKallsyms { entries } => {
                self.final_kallsyms = Some(entries.clone());
            }
            Message::Inventory { progs } => self.inventory.extend(progs.iter().cloned()),
            Message::KsymbolWatch {
                observations,
                dropped,
            } => {
                self.ksymbol_watch = Some(KsymbolWatchEvidence {
                    observations: observations.clone(),
                    dropped: *dropped,
                })
            }
            Message::KernelLog {
                kmsg,
                truncated,
                overrun,
                kmsg_error,
                kmemleak,
                kmemleak_error,
                kmemleak_truncated,
                lockdep_on,
            } => {
                self.kernel_log = Some(KernelLog {
                    kmsg: kmsg.clone(),
                    truncated: *truncated,
                    overrun: *overrun,
                    kmsg_error: kmsg_error.clone(),
                    kmemleak: kmemleak.clone(),
                    kmemleak_error: kmemleak_error.clone(),
                    kmemleak_truncated: *kmemleak_truncated,
                    lockdep_on: *lockdep_on,
                })
            }
            Message::LostSamples { listener, lost } => {
                self.lost_samples.insert(*listener, *lost);
            }
            Message::Wakeups { listener, times_ns } => {
                self.wakeups.insert(*listener, times_ns.clone());
            }
            _ => return false,
        }
        true
    }

    /// Takes a message that reports the executable areas; `false` for any
    /// other.
    fn take_exec_areas(&mut self, m: &Message) -> bool {
        match m {
            Message::ExecAreaReading { reading } => self
                .exec_areas
                .get_or_insert_with(ExecAreas::default)
                .readings
                .push(reading.clone()),
            Message::ExecAreasEnd {
                end,
                end_symbols,
                settle_ns,
                unreadable,
            } => {
                let books = self.exec_areas.get_or_insert_with(ExecAreas::default);
                books.end = end.clone();
                books.end_symbols = end_symbols.clone();
                books.settle_ns = *settle_ns;
                books.unreadable = unreadable.clone();
                books.ended = true;
            }
            _ => return false,
        }
        true
    }

    /// Takes a `struct-ops` step's report; `false` for any other message.
    fn take_struct_ops(&mut self, m: &Message) -> bool {
        let Message::StructOps {
            name,
            value_type,
            value_size,
            members,
            trampolines,
            extents,
            listed,
            listed_after,
            gone_after_ms,
        } = m
        else {
            return false;
        };
        self.struct_ops.push(StructOpsRun {
            name: name.clone(),
            value_type: value_type.clone(),
            value_size: *value_size,
            members: members.clone(),
            trampolines: trampolines.clone(),
            extents: extents.clone(),
            listed: *listed,
            listed_after: *listed_after,
            gone_after_ms: *gone_after_ms,
        });
        true
    }

    /// Takes a message that reports what a BPF JIT step saw; `false` for
    /// any other.
    fn take_jit_fact(&mut self, m: &Message) -> bool {
        match m {
            Message::UnprivilegedAttach {
                label,
                over_limit,
                errno,
            } => self
                .unprivileged_attaches
                .push((label.clone(), *over_limit, errno.clone())),
            Message::PackBoundary {
                sizes,
                boundary,
                neighbour,
                fillers,
                sweep_attempts,
                sweep_failed,
                moments,
            } => self.pack_boundaries.push(PackBoundary {
                sizes: sizes.clone(),
                boundary: *boundary,
                neighbour: neighbour.clone(),
                fillers: *fillers,
                sweep_attempts: *sweep_attempts,
                sweep_failed: *sweep_failed,
                moments: moments.clone(),
            }),
            Message::JitBooks {
                start,
                end,
                settle_ns,
                live,
                unreadable,
                unreadable_in_kernel,
                images,
                images_unreadable,
                images_unreadable_in_kernel,
            } => {
                self.jit_books = Some(JitBooks {
                    start: start.clone(),
                    end: end.clone(),
                    settle_ns: *settle_ns,
                    live: live.clone(),
                    unreadable: unreadable.clone(),
                    unreadable_in_kernel: *unreadable_in_kernel,
                    images: images.clone(),
                    images_unreadable: images_unreadable.clone(),
                    images_unreadable_in_kernel: *images_unreadable_in_kernel,
                })
            }
            Message::Attached {
                label,
                link,
                detail,
            } => self.attached.push(Attachment {
                label: label.clone(),
                link: link.clone(),
                detail: detail.clone(),
            }),
            Message::FailNthSweep {
                target,
                attempts,
                failed,
                errnos,
                detail,
                sweep,
                clean_errno,
            } => self.fail_nth.push(FailNthSweep {
                target: target.clone(),
                attempts: *attempts,
                failed: *failed,
                errnos: errnos.clone(),
                detail: detail.clone(),
                sweep: sweep.clone(),
                clean_errno: clean_errno.clone(),
            }),
            _ => return false,
        }
        true
    }

    /// Takes a message that carries a step's output (timings, files,
    /// counters, programs' and perf's output); `false` for any other.
    fn take_step_output(&mut self, m: &Message) -> bool {
        match m {
            Message::Timings {
                fixture,
                program,
                functions,
                listeners_per_cpu,
                load_ns,
                unload_ns,
            } => self.timings.push(Timings {
                fixture: fixture.clone(),
                program: program.clone(),
                functions: *functions,
                listeners_per_cpu: *listeners_per_cpu,
                load_ns: load_ns.clone(),
                unload_ns: unload_ns.clone(),
            }),
            Message::FileSnapshot { label, path, text } => self.files.push(FileSnapshot {
                label: label.clone(),
                path: path.clone(),
                text: text.clone(),
            }),
            Message::FileWrite { path, error } => {
                self.file_writes.push((path.clone(), error.clone()))
            }
            Message::Counter {
                label,
                map,
                key,
                value,
            } => self.counters.push(CounterValue {
                label: label.clone(),
                map: map.clone(),
                key: *key,
                value: *value,
            }),
            Message::Unsupported {
                requirement,
                reason,
            } => {
                // The agent stops at the first; should it send more, the
                // first is the one that ended the run.
                self.unsupported
                    .get_or_insert_with(|| (*requirement, reason.clone()));
            }
            Message::ProgramRun {
                path,
                exit_code,
                signal,
                timed_out,
                output,
                ..
            } => self.program_runs.push(ProgramRun {
                path: path.clone(),
                exit_code: *exit_code,
                signal: *signal,
                timed_out: *timed_out,
                output: output.clone(),
            }),
            Message::PerfScript {
                command,
                text,
                stderr,
            } => self.perf_scripts.push(PerfScript {
                command: command.clone(),
                text: text.clone(),
                stderr: stderr.clone(),
            }),
            Message::SpinRead(r) => self.spin_reads.push(r.clone()),
            Message::PerfAttribution(a) => self.perf_attributions.push(a.clone()),
            _ => return false,
        }
        true
    }

    /// Appends a piece of the perf.data file the agent sends in order; a
    /// piece out of order, not hex or past the announced size spoils the
    /// file (kept as the error).
    fn take_perf_data(&mut self, offset: u64, total: u64, hex: &str) {
        let file = self.perf_data.get_or_insert_with(|| Ok(Vec::new()));
        if let Ok(bytes) = file {
            let piece = match ::hex::decode(hex) {
                Ok(p) if offset == bytes.len() as u64 => p,
                Ok(_) => {
                    *file = Err(format!(
                        "a piece at offset {offset} after {} bytes",
                        bytes.len()
                    ));
                    return;
                }
                Err(e) => {
                    *file = Err(format!("the piece at {offset} is not hex: {e}"));
                    return;
                }
            };
            bytes.extend_from_slice(&piece);
            if bytes.len() as u64 > total {
                *file = Err(format!("more than the {total} bytes announced"));
            }
        }
    }
}

/// Reads the guest's messages in order: some depend on those before them
/// (the step a listener opened or a batch ran in, a storm's lookups).
struct Reader {
    ev: RunEvidence,
    /// A storm's lookups, sent right before its StormDone.
    pending_lookups: Option<Lookups>,
    /// The step the agent last said it started.
    current_step: Option<u32>,
}

impl Reader {
    fn take(&mut self, m: &Message) {
        let ev = &mut self.ev;
        match m {
            Message::Listener(l) => self.listener(l),
            Message::StepStart { index, what } => self.step_start(*index, what),
            Message::StormDone {
                fixture,
                program,
                functions,
                ids,
            } => ev.batches.push(Batch::new(
                fixture,
                program,
                *functions,
                ids,
                None,
                // A storm with lookups sends them right before its StormDone.
                self.pending_lookups.take(),
                self.current_step,
            )),
            Message::Loads {
                cpu,
                fixture,
                program,
                functions,
                ids,
                tid,
            } => {
                let mut b = Batch::new(
                    fixture,
                    program,
                    *functions,
                    ids,
                    Some(*cpu),
                    None,
                    self.current_step,
                );
                b.tid = *tid;
                ev.batches.push(b);
            }
            Message::Lookups {
                seen,
                found,
                enoent,
                other_errors,
            } => {
                let l = Lookups {
                    seen: *seen,
                    found: *found,
                    enoent: *enoent,
                    other_errors: other_errors.clone(),
                };
                ev.lookups.push(l.clone());
                self.pending_lookups = Some(l);
            }
            Message::PerfData { offset, total, hex } => ev.take_perf_data(*offset, *total, hex),
            _ => {
                let _ = ev.take_kernel_fact(m)
                    || ev.take_jit_fact(m)
                    || ev.take_struct_ops(m)
                    || ev.take_exec_areas(m)
                    || ev.take_step_output(m);
            }
        }
    }

    fn listener(&mut self, l: &ListenerInfo) {
        let ev = &mut self.ev;
        if l.cpu >= 0 && ev.listeners.iter().all(|o| o.cpu < 0) {
            ev.preexisting = ev.progs.iter().map(|p| p.id).collect();
        }
        ev.windows.insert(
            l.index,
            Window {
                opened: self.current_step,
                closed: None,
            },
        );
        // A listener whose ring stayed empty still has a stream.
        ev.streams.entry(l.index).or_default();
        ev.listeners.push(l.clone());
    }

    fn step_start(&mut self, index: u32, what: &str) {
        let ev = &mut self.ev;
        self.current_step = Some(index);
        let step = serde_json::from_str::<Step>(what);
        if let Ok(Step::Storm { drain_every: 0, .. } | Step::PauseOutput { paused: true }) = step {
            ev.provoked_loss = true;
        }
        if let Ok(Step::CloseListeners { step: opener }) = step {
            for w in ev.windows.values_mut() {
                if w.opened == Some(opener) && w.closed.is_none() {
                    w.closed = Some(index);
                }
            }
        }
        if let Ok(step) = step {
            ev.steps.insert(index, step);
        }
    }
}
