//! Wire protocol between the kloop host harness and the guest agent.
//!
//! The guest writes *frames* to its data port (the second serial port); the
//! host decodes them. A frame is
//!
//! ```text
//! magic  b"KLF1"   4 bytes
//! kind   u8        FrameKind
//! pad    [u8; 3]   zero
//! len    u32 LE    payload length (<= MAX_PAYLOAD)
//! crc    u32 LE    CRC-32 (IEEE) of kind || len || payload
//! payload          len bytes
//! ```
//!
//! `Message` frames carry one JSON-encoded [`Message`]; `Records` frames carry
//! raw perf ring bytes behind a small binary [`RecordsHeader`]. The guest never
//! interprets perf records: the host owns the ABI knowledge.
//!
//! The plan the guest executes ([`Plan`]) travels the other way: as a JSON
//! file inside the initramfs ([`PLAN_PATH`]) on a cold boot, or, when the
//! guest was restored from a saved VM, as one [`ToGuest::Plan`] frame the host
//! writes to the same port once the restored guest runs. An agent whose
//! initramfs has no plan announces [`Message::AwaitingPlan`] and waits: that
//! moment is where the host saves the VM.

use serde::{Deserialize, Serialize};

pub mod arch;
pub mod exec;
pub mod frame;
pub mod plan;

pub use arch::Arch;
pub use frame::{encode_frame, FrameDecoder, FrameError, FrameKind, RawFrame, MAX_PAYLOAD};
pub use plan::{
    AttachTarget, Fault, ListenerScope, ListenerSpec, ParamWrite, Plan, Requirement, SideBand,
    Step, SweepTarget, XdpMode,
};

/// Bumped whenever a frame layout, a message or a plan step changes
/// incompatibly (4: the ksymbol watch's steps and messages, kprobe-fill,
/// fail-nth and failed-load; 5: a listener's CPU subset and other
/// side-band attributes, and `close-listeners`; 6: `FinalKallsyms`; 7: the plan's `params`;
/// 8: `ProgramRun`; 9: `PerfData`; 10: `StepDone.kallsyms_ns`, and
/// `FinalKallsyms` inside the last drain's step; 11: `KernelLog`; 12: polled
/// listeners and `Wakeups`; 13: `JitBooks`, `unprivileged-attach`, a
/// listener's `poll_watermark`; 14: `FailNthSweep.sweep` and
/// `.clean_errno`; 15: `spin-read`, `SpinRead` and the `two-cpus`
/// requirement, `pack-boundary`, `PackBoundary` and the `trampoline-packs`
/// requirement; 16: `perf-attribution` and `PerfAttribution`; 17:
/// `ExecAreaReading`, `ExecAreasEnd`; 18: `struct-ops`, `StructOps` and
/// the `struct-ops` and `struct-ops-ksyms` requirements; 19: arm64 guests,
/// their virtio-serial data port, and the `optprobes` requirement).
pub const PROTOCOL_VERSION: u32 = 19;

/// The most bytes of kernel log one [`Message::KernelLog`] carries (its
/// JSON fits a frame).
pub const MAX_KERNEL_LOG: usize = 256 * 1024;

/// Raw bytes of one [`Message::PerfData`] piece: its hex fits a frame.
pub const PERF_DATA_PIECE: usize = 384 * 1024;

/// What a `ProgramRun` carries of a program's output.
pub const MAX_PROGRAM_OUTPUT: usize = 64 * 1024;

/// Where the agent finds its plan inside the initramfs.
pub const PLAN_PATH: &str = "/kloop/plan.json";

/// Where the host puts the kernel modules a scenario asks for, with the file
/// `order` beside them: one line per module, dependencies first,
/// `name<TAB>file<TAB>how<TAB>depends` (`how`: `plain`, or the compression
/// the kernel itself undoes (`xz`, `zstd`, `gzip`), or `builtin` with file
/// `-`; `depends`: comma-separated names, maybe empty).
pub const MODULES_DIR: &str = "/kloop/modules";

/// Where `cargo xtask vm-shell` puts its [`ShellSetup`] in the initramfs.
/// Its presence makes PID 1 start an interactive shell on the console
/// instead of running a plan.
pub const SHELL_SETUP_PATH: &str = "/kloop/shell.json";

/// Where the agent in shell mode writes its embedded BPF fixtures, one
/// `<stem>.bpf.o` each, for the developer to look at.
pub const FIXTURES_DIR: &str = "/kloop/fixtures";

/// The name under which the agent runs a scenario's steps by hand from the
/// guest shell (a link to `/init` on the shell's `PATH`).
pub const RUN_BY_HAND: &str = "kloop-run";

/// What an interactive guest (`cargo xtask vm-shell`) is set up with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellSetup {
    /// The scenario whose steps [`RUN_BY_HAND`] runs.
    pub plan: Plan,
    /// The kernel modules the host shipped under [`MODULES_DIR`].
    #[serde(default)]
    pub modules: Vec<String>,
    /// The host terminal's size, given to the guest console so line
    /// editing and pagers wrap where the user's terminal does.
    #[serde(default)]
    pub rows: u16,
    #[serde(default)]
    pub cols: u16,
    /// The host's `TERM`.
    #[serde(default)]
    pub term: Option<String>,
}

/// The guest device the agent writes frames to on x86-64 (second 8250 UART).
pub const DATA_PORT: &str = "/dev/ttyS1";

/// On arm64 the `virt` board has one UART, the console's: the data channel
/// is the virtio-serial port of this name.
pub const VIRTIO_DATA_PORT_NAME: &str = "kloop.data";

/// Interval between guest heartbeats; the host allows several missed ones.
pub const HEARTBEAT_INTERVAL_MS: u64 = 250;

/// Where a step's guest time went, beside its wall time (`elapsed_ns`):
/// the agent's own CPU time and that of the children it reaped during the
/// step (`perf`), and the idle time of the guest's CPUs (summed over them,
/// from `/proc/uptime`, 10 ms resolution). Under TCG a vCPU that idles
/// leaves its host core unused, so idle time is waiting (RCU grace periods,
/// deferred frees, timers), not work; what is neither is the kernel's own
/// threads and interrupts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepCpu {
    pub user_ns: u64,
    pub sys_ns: u64,
    pub idle_ns: u64,
    /// The CPUs online during the step: `elapsed_ns × cpus` is the guest
    /// CPU time the other three share.
    pub cpus: u32,
}

/// `uname(2)` of the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Uname {
    pub sysname: String,
    pub release: String,
    pub version: String,
    pub machine: String,
}

impl Uname {
    /// The architecture the guest ran (`machine`: `aarch64` or `x86_64`);
    /// x86-64 for an agent that said nothing (older tests' evidence).
    pub fn arch(&self) -> Arch {
        Arch::parse(&self.machine).unwrap_or(Arch::X86_64)
    }
}

/// One reading of the JIT's books ([`Message::JitBooks`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JitReading {
    /// `bpf_jit_current`: bytes charged by bpf_jit_charge_modmem() and not
    /// yet uncharged.
    pub current: Option<i64>,
    /// Every `bpf_prog_pack` on `pack_list`, in list order; `None` on a
    /// kernel without the pack allocator (before 5.18).
    pub packs: Option<Vec<PackReading>>,
}

impl JitReading {
    /// Bytes of the chunks used in `start` and free in `self`: code that
    /// was live (or waiting for its deferred free) before the plan and was
    /// given back during it. A program's charge is its pack allocation,
    /// whole chunks (bpf_jit_binary_pack_alloc() charges the rounded
    /// size), so such frees lower `bpf_jit_current` by exactly this much;
    /// the VM saved right after the agent's warm-up may still owe the frees
    /// of its throw-away programs (an RCU grace period, then a worker).
    pub fn chunk_bytes_freed_since(&self, start: &JitReading) -> i64 {
        let (Some(before), Some(now)) = (&start.packs, &self.packs) else {
            return 0;
        };
        let mut bytes = 0i64;
        for p in before {
            let now_pack = now.iter().find(|n| n.base == p.base);
            let is_used = |c: u32| now_pack.is_some_and(|n| n.is_used(c));
            for &(first, len) in &p.used {
                let freed = (first..first + len).filter(|&c| !is_used(c)).count() as i64;
                bytes += freed * i64::from(p.chunk_size);
            }
        }
        bytes
    }
}

/// A trampoline image as `bpf_kallsyms` and its `bpf_tramp_image` hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageReading {
    /// The symbol's name (`bpf_trampoline_<key>`).
    pub name: String,
    /// `ksym.start` and `ksym.end`.
    pub start: u64,
    pub end: u64,
    /// `im->size` (6.2 on); `None` where the struct has no size (the image
    /// is a page).
    pub size: Option<u32>,
    /// Where each listener's ring was (`data_head`, which is the stream
    /// offset the next record gets) when the agent first read this image
    /// (start, name and size): a record below it was written before the
    /// reading, one at or above it after. So the host can tell which of
    /// two images at one address a KSYMBOL was about, without a clock.
    /// Empty from an agent that did not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen_at: Vec<(u32, u64)>,
}

/// One vmalloc area of the module mapping space, where every executable
/// allocation of x86-64 lives (module_alloc() before 6.10, execmem_alloc()
/// from then: BPF JIT images and packs, trampolines, kprobe instruction
/// pages, ftrace trampolines, modules), as one line of /proc/vmallocinfo
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecArea {
    /// `vm->addr`.
    pub start: u64,
    /// `vm->addr + vm->size`: the guard page included.
    pub end: u64,
    /// `pages=`: the pages mapped (`None` when the line has no count, an
    /// area that is not vmalloc'ed). The bytes that can hold code are
    /// `[start, start + pages * PAGE_SIZE)`.
    pub pages: Option<u32>,
    /// The allocating caller as the kernel prints it (`%pS`,
    /// `bpf_prog_pack_alloc+0x2b0/0x3c0`), if it printed one.
    pub caller: Option<String>,
}

/// The module mapping space's areas at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AreaReading {
    /// The step after which it was read; `None` before the first step.
    pub after_step: Option<u32>,
    /// Every ring's `data_head` (listener index, head) right before the
    /// file was read: a record below it was written before the reading
    /// began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen_at: Vec<(u32, u64)>,
    /// The heads right after the file was read: a record at or above
    /// them was written after the reading ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_until: Vec<(u32, u64)>,
    pub areas: Vec<ExecArea>,
}

/// One `bpf_prog_pack`: its executable area and which of its chunks the
/// allocator marks used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackReading {
    /// `pack->ptr`, the first chunk's address.
    pub base: u64,
    /// Bytes per chunk (`BPF_PROG_CHUNK_SIZE`).
    pub chunk_size: u32,
    /// Chunks in the pack (`BPF_PROG_CHUNK_COUNT`).
    pub chunks: u32,
    /// Runs of used chunks: (first chunk, how many).
    pub used: Vec<(u32, u32)>,
}

impl PackReading {
    /// The chunk holding `addr`, or `None` outside the pack's area.
    pub fn chunk_of(&self, addr: u64) -> Option<u32> {
        let size = u64::from(self.chunk_size);
        let end = self.base + u64::from(self.chunks) * size;
        (self.base..end)
            .contains(&addr)
            .then(|| ((addr - self.base) / size) as u32)
    }

    /// Whether the allocator marks chunk `c` used.
    pub fn is_used(&self, c: u32) -> bool {
        self.used
            .iter()
            .any(|&(first, len)| c >= first && c < first + len)
    }
}

/// A symbol on `bpf_kallsyms` (a program's function, a trampoline image, a
/// dispatcher), as `struct bpf_ksym` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KsymReading {
    pub name: String,
    /// `ksym.start` and `ksym.end`: the code's bytes.
    pub start: u64,
    pub end: u64,
}

/// One look at the JIT's allocator while code is live: `bpf_kallsyms`
/// walked, the pack bitmaps read, `bpf_kallsyms` walked again (the
/// readings are not atomic; a symbol in both walks was live during the
/// bitmap read, since a symbol is deleted before its chunks are freed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BooksMoment {
    /// When, in the step's words ("after the boundary image was freed").
    pub what: String,
    pub before: Vec<KsymReading>,
    pub packs: Vec<PackReading>,
    pub after: Vec<KsymReading>,
}

/// One line of `/proc/kallsyms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KallsymsEntry {
    pub addr: u64,
    pub kind: char,
    pub name: String,
    /// The `[module]` column without brackets (`bpf` for BPF programs).
    pub module: Option<String>,
}

/// What `BPF_OBJ_GET_INFO_BY_FD` said about one program the agent loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgFacts {
    /// The scenario's label for this program (`main`, `worker3`, ...).
    pub label: String,
    pub id: u32,
    /// `bpf_prog_info.tag`, 8 bytes.
    pub tag: [u8; 8],
    /// `bpf_prog_info.name` (truncated to 15 bytes by the kernel).
    pub name: String,
    pub prog_type: u32,
    /// `jited_ksyms`: start address of every JITed function, main first.
    pub jited_ksyms: Vec<u64>,
    /// `jited_func_lens`, same order as `jited_ksyms`.
    pub jited_func_lens: Vec<u32>,
    /// `prog_tags`: each function's own tag, same order as `jited_ksyms`
    /// (subprogram symbols are named after these, not after `tag`).
    #[serde(default)]
    pub func_tags: Vec<[u8; 8]>,
    /// The BTF FUNC name of each function, same order as `jited_ksyms`,
    /// read from the program's func_info and its BTF object; empty when it
    /// was loaded without func_info.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub func_names: Vec<String>,
    /// `/proc/kallsyms` lines whose address is one of `jited_ksyms`.
    pub kallsyms: Vec<KallsymsEntry>,
}

/// The most observations one `KsymbolWatch` carries: about 250 bytes of
/// JSON each keeps the message well inside one frame ([`MAX_PAYLOAD`]),
/// and far more than a scenario causes (the watch's ring holds about 400
/// between two readings).
pub const MAX_KSYMBOL_OBSERVATIONS: usize = 1024;

/// One `perf_event_ksymbol(ksym_type, addr, len, unregister, sym)` call, seen
/// at its entry by the `watch-ksymbols` kprobe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KsymbolObservation {
    pub ksym_type: u16,
    pub unregister: bool,
    pub addr: u64,
    pub len: u32,
    /// `sym`, read from kernel memory (cut at 63 bytes).
    pub name: String,
    /// What `bpf_snprintf("%ps", addr)` printed at that instant: the symbol
    /// kallsyms resolved the address to, or `0x<hex>` when it resolved
    /// none (cut at 63 bytes).
    pub symbolized: String,
    /// `bpf_snprintf`'s return: the length it needed, or a negative errno.
    pub snprintf_ret: i64,
    /// For a kprobe instruction page (OOL): whether the page was on its
    /// cache's page list at that instant; `None` when the watch did not
    /// look (another kind, or the cache's address was unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed: Option<bool>,
}

/// The most distinct (ip, symbol) pairs one [`PerfAttribution`] carries:
/// about 80 bytes of JSON each keeps the message well inside one frame.
pub const MAX_ATTRIBUTED_IPS: usize = 8192;

/// What a `perf-attribution` step did ([`Message::PerfAttribution`]): the
/// real `perf record` sampled a workload program while a trampoline image
/// lay right below it, and `perf script` said which symbol each sample's
/// IP belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfAttribution {
    /// `perf record …; perf script …` as run.
    pub command: String,
    /// The workload's program id.
    pub workload: u32,
    /// The facts of the programs live from the start of the recording to
    /// its end (the workload and the fentry program), read while they
    /// were: a sample inside one of their images is that program's. Kept
    /// here, not sent as `Prog`: the step opens no listener of kloop's to
    /// hold their records to.
    pub live: Vec<ProgFacts>,
    /// The trampoline images live while the workload ran, read off
    /// `bpf_kallsyms` (empty where the books cannot be read).
    pub images: Vec<ImageReading>,
    /// How the trampoline image lay against the workload: `None` when it
    /// lies right below it (within a page), else why it does not (the
    /// kernel gives a trampoline a page of its own, before 6.7).
    pub not_arranged: Option<String>,
    /// BPF_PROG_TEST_RUN calls of the workload, and how long they took.
    pub runs: u32,
    pub run_ns: u64,
    /// perf script's samples: (ip, perf's symbol, how many samples), one
    /// per distinct pair, at most [`MAX_ATTRIBUTED_IPS`].
    pub samples: Vec<(u64, String, u32)>,
    /// Samples past that cap, not sent.
    pub samples_dropped: u64,
    /// Lines of perf script's output that are no sample line (at most a
    /// few, quoted).
    pub unparsed: Vec<String>,
    /// perf record's and perf script's stderr.
    pub stderr: String,
}

/// One perf listener the agent opened.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerInfo {
    /// Index used by `RecordsHeader::listener`.
    pub index: u32,
    /// CPU the listener is bound to, or -1 for a task-bound listener.
    pub cpu: i32,
    /// `perf_event_attr.sample_type` as opened.
    pub sample_type: u64,
    pub sample_id_all: bool,
    pub ksymbol: bool,
    pub bpf_event: bool,
    /// Size of the data area of its ring buffer in bytes.
    pub ring_bytes: u64,
    /// Opened with `attr.inherit`: its records come from the task and the
    /// threads it created later (one pid, several tids).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherit: bool,
    /// For a task-bound listener: the process it follows (`getpid()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The CPUs its spec asked for (`ListenerSpec::cpus`); `None`: every
    /// online CPU. A set of such listeners covers only these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
    /// The other side-band attributes it was opened with
    /// (`ListenerSpec::side_band`): the record types they ask for may
    /// arrive besides KSYMBOL / BPF_EVENT / LOST.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_band: Vec<SideBand>,
    /// Opened disabled and never enabled (`ListenerSpec::disabled`): it
    /// must stay empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// A backward overwrite ring (`ListenerSpec::backward`): its stream is
    /// the agent's forward reordering of what the kernel wrote downwards.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backward: bool,
    /// A polled listener's wakeup watermark in bytes (0: not polled, or
    /// polled with the 1-byte watermark).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub poll_watermark: u32,
}

/// Messages from the guest agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum Message {
    /// First frame of every run.
    Hello {
        protocol_version: u32,
        agent_version: String,
        uname: Uname,
        online_cpus: Vec<u32>,
        /// Guest monotonic clock at the moment of the hello, in ns.
        monotonic_ns: u64,
    },
    /// Sent every [`HEARTBEAT_INTERVAL_MS`] while the agent is alive.
    Heartbeat {
        seq: u64,
    },
    /// Kernel knobs that change what the records look like.
    KernelFacts {
        /// `(path, value)` of sysctls read from /proc/sys (trimmed).
        sysctls: Vec<(String, String)>,
        /// Kernel command line.
        cmdline: String,
    },
    /// A step of the plan starts.
    StepStart {
        index: u32,
        what: String,
    },
    /// A step of the plan finished.
    StepDone {
        index: u32,
        elapsed_ns: u64,
        /// Of `elapsed_ns`, the time spent reading `/proc/kallsyms` (the
        /// facts of loaded programs, waits on symbols, the last drain's
        /// final read): the kernel's own formatting of the file, which
        /// dominates short trials under TCG.
        #[serde(default)]
        kallsyms_ns: u64,
        /// What the guest's CPUs did during the step, when the agent could
        /// read it: tells a step that computes from one that waits.
        #[serde(default)]
        cpu: Option<StepCpu>,
    },
    Listener(ListenerInfo),
    Prog(ProgFacts),
    /// Symbols present at the start of recording (for reconciling
    /// unregisters of symbols the run never saw registered).
    InitialKallsyms {
        entries: Vec<KallsymsEntry>,
    },
    /// The generated symbols read right before the plan's last `drain`, in
    /// a plan that took a `snapshot-kallsyms` (rule `announced`: whatever
    /// appeared was announced).
    FinalKallsyms {
        entries: Vec<KallsymsEntry>,
    },
    /// When the waiter of a polled listener (`ListenerSpec::poll`) saw its
    /// ring readable: CLOCK_MONOTONIC ns after each `poll(2)` that returned
    /// POLLIN for it, sent at the plan's end.
    Wakeups {
        listener: u32,
        times_ns: Vec<u64>,
    },
    /// What an `unprivileged-attach` step's attach did: `errno` its
    /// failure (by name), `None` a success.
    UnprivilegedAttach {
        label: String,
        over_limit: bool,
        errno: Option<String>,
    },
    /// The BPF JIT's own books (kernel/bpf/core.c), read through
    /// /proc/kcore before the first step and again after the plan, once
    /// the agent has closed every program, link and listener and the
    /// kernel's deferred frees have run (or `settle_ns` ran out): the
    /// charge counter `bpf_jit_current` and the bitmap of every
    /// `bpf_prog_pack`. Collected only; rules `jit-charge` and
    /// `jit-chunks` judge them on the host.
    JitBooks {
        start: JitReading,
        end: JitReading,
        /// How long the agent waited after the plan for the counter to come
        /// back to its start value (it stops waiting when it does).
        settle_ns: u64,
        /// Addresses of the `[bpf]` symbols in /proc/kallsyms at the end
        /// reading (code that is meant to stay: the XDP dispatcher's image).
        live: Vec<u64>,
        /// Why the books could not be read on this kernel (the config
        /// option or symbol missing); the readings are then empty.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unreadable: Option<String>,
        /// `unreadable` says the kernel lacks what the books are read
        /// through (a config option, a structure of a later release), not
        /// that a reading failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unreadable_in_kernel: bool,
        /// Every trampoline image seen on `bpf_kallsyms` after the plan's
        /// steps that attach (once per image), with its symbol's span.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageReading>,
        /// Why the images could not be read (the other readings stand).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        images_unreadable: Option<String>,
        /// `images_unreadable` says the kernel lacks what they are read
        /// through.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        images_unreadable_in_kernel: bool,
    },
    /// The kernel's own list of executable memory at one moment:
    /// /proc/vmallocinfo's areas in the module mapping space, read with
    /// `kptr_restrict` 1 so that root sees real addresses, before the
    /// first step and after every step (with the rings' heads). One
    /// message per reading, sent as it is taken. Collected only: rules
    /// `exec-area-kept` and `exec-area-missing` judge them on the host.
    ExecAreaReading {
        reading: AreaReading,
    },
    /// The last reading of the executable areas, after the plan: everything
    /// it made closed and the deferred frees waited for up to `settle_ns`,
    /// with the lines of module parts /proc/kallsyms listed right before
    /// it (`[bpf]`, `[__builtin__kprobes]`, `[__builtin__ftrace]`,
    /// modules). `unreadable`: why the areas could not be read (this or an
    /// earlier reading; the readings sent stand).
    ExecAreasEnd {
        end: Option<AreaReading>,
        end_symbols: Vec<KallsymsEntry>,
        settle_ns: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unreadable: Option<String>,
    },
    /// What the kernel said about itself while the plan's steps ran, sent
    /// after the last step: the kernel log's records from the first step on
    /// (`/dev/kmsg`, every level, whatever the console shows), and, on a
    /// kernel with kmemleak, what `/sys/kernel/debug/kmemleak` lists after
    /// two scans (the leaks it knew of before the first step cleared). The
    /// host reads the checks' reports out of them (KASAN, UBSAN, lockdep,
    /// kmemleak); the guest only collects.
    KernelLog {
        /// The log's messages, one per record (continuation lines kept
        /// after a newline), at most [`MAX_KERNEL_LOG`] bytes in all.
        kmsg: Vec<String>,
        /// Whether the cap ([`MAX_KERNEL_LOG`]) cut the records after
        /// `kmsg`'s last.
        truncated: bool,
        /// How many times the log overwrote records before the agent read
        /// them (`read` on /dev/kmsg failed with EPIPE, printk/printk.c
        /// `devkmsg_read`): what they said is lost.
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        overrun: u32,
        /// Why /dev/kmsg could not be watched (opened, positioned or read):
        /// `kmsg` then says nothing about the kernel.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kmsg_error: Option<String>,
        /// Whether kmemleak's list was longer than [`MAX_KERNEL_LOG`] and
        /// cut there.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        kmemleak_truncated: bool,
        /// kmemleak's list; `None`: the kernel has no kmemleak (or its
        /// debugfs file could not be used, said in `kmemleak_error`).
        kmemleak: Option<String>,
        /// Why kmemleak could not be scanned on a kernel that has it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kmemleak_error: Option<String>,
        /// On a kernel with lockdep (`/proc/lockdep_stats`), its
        /// `debug_locks` after the plan: lockdep turns itself off for good
        /// after its first report or when its tables fill
        /// (kernel/locking/lockdep.c, `debug_locks_off()`), so 0 means the
        /// plan's locking was not (or not wholly) checked. `None` without
        /// lockdep.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lockdep_on: Option<bool>,
    },
    /// Durations measured by a `Measure` step, guest `CLOCK_MONOTONIC` ns per
    /// iteration after the warm-up (under `-icount` the clock counts
    /// instructions).
    Timings {
        fixture: String,
        program: String,
        /// JITed functions of the program (1 + subprograms).
        functions: u32,
        listeners_per_cpu: u32,
        load_ns: Vec<u64>,
        unload_ns: Vec<u64>,
    },
    /// Free-form diagnostics, shown to the user on failure.
    Log {
        text: String,
    },
    /// The agent could not carry out a step; it powers off after this.
    AgentError {
        step: Option<u32>,
        message: String,
    },
    /// Every step ran and every ring was drained.
    Done {
        records_bytes: u64,
    },
    /// A `requires` probe failed: the run stops here (no steps ran) and the
    /// trial is reported skipped with `reason`.
    Unsupported {
        requirement: Requirement,
        reason: String,
    },
    /// Every program loaded when an `inventory` step ran, as `perf record`
    /// synthesises them at start.
    Inventory {
        progs: Vec<ProgFacts>,
    },
    /// A `write` step with `may_fail` whose write the kernel refused
    /// (`error` is `None` when it succeeded).
    FileWrite {
        path: String,
        error: Option<String>,
    },
    FileSnapshot {
        label: String,
        path: String,
        text: String,
    },
    /// An attach step's result: which link and how (e.g. the kprobe offset
    /// the kernel accepted).
    Attached {
        label: String,
        link: String,
        detail: String,
    },
    Counter {
        label: String,
        map: String,
        key: u32,
        value: u64,
    },
    /// A listener's `lost_samples` count, read (`read(2)` with
    /// `PERF_FORMAT_LOST`, Linux 6.0+) right after a drain: how many of
    /// its records the kernel could not write (`__perf_output_begin()`
    /// counts them where it counts `rb->lost`). Not sent where the kernel
    /// refuses the read format.
    LostSamples {
        listener: u32,
        lost: u64,
    },
    /// One `concurrent` loader thread: the CPU it was pinned to (and ran
    /// on, checked with `getcpu` around every load) and the ids it loaded,
    /// in order; each was unloaded right after.
    Loads {
        cpu: u32,
        fixture: String,
        program: String,
        functions: u32,
        ids: Vec<u32>,
        /// The loader thread's tid; the step ends only once the thread is
        /// gone from /proc/self/task, so its EXIT has been emitted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<u32>,
    },
    /// A storm's end: how many programs it loaded and unloaded, their ids,
    /// and the JITed function count of each.
    StormDone {
        fixture: String,
        program: String,
        functions: u32,
        ids: Vec<u32>,
    },
    /// What a `pack-boundary` step built and saw: the trampoline images it
    /// made (`im->size`, in order), the one whose size is a whole number of
    /// 64-byte chunks, the code right after it, and the JIT's allocator
    /// read at the moments that matter (rule `jit-chunks`).
    PackBoundary {
        sizes: Vec<u32>,
        /// The boundary image's start and `im->size`.
        boundary: (u64, u32),
        /// The live symbol overlapping the chunk right after the boundary
        /// image, if one could be put there.
        neighbour: Option<KsymReading>,
        /// Programs loaded to fill the pack up to that chunk.
        fillers: u32,
        /// Attempts of the fail-nth sweep over the attach that rebuilds the
        /// boundary image, and how many failed (none without a sweep).
        sweep_attempts: u32,
        sweep_failed: u32,
        moments: Vec<BooksMoment>,
    },
    /// What a `struct-ops` step registered and saw: the congestion
    /// control's `name`, the map's value type and size (from vmlinux BTF),
    /// each function member with its program's id, the struct_ops
    /// trampolines' lines of /proc/kallsyms while it was registered
    /// (`bpf__tcp_congestion_ops_<member>`; none on a kernel that does not
    /// name them), their extents as `bpf_kallsyms` holds them (`ksym.start`
    /// and `ksym.end`, bpf_struct_ops_ksym_init(); empty where the JIT's
    /// books cannot be read), whether
    /// `/proc/sys/net/ipv4/tcp_available_congestion_control` listed `name`
    /// while registered and after the unregister, and how long the
    /// trampolines' symbols took to leave /proc/kallsyms after the map
    /// was closed.
    StructOps {
        name: String,
        value_type: String,
        value_size: u32,
        members: Vec<(String, u32)>,
        trampolines: Vec<KallsymsEntry>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        extents: Vec<KsymReading>,
        listed: bool,
        listed_after: bool,
        gone_after_ms: u64,
    },
    /// A `fail-nth` step's sweep: `attempts` runs of the swept syscall,
    /// the last of which reached no injected fault; of the others,
    /// `failed` returned an error (`errnos`: each errno's name and how many
    /// attempts returned it) and the rest succeeded despite the injected
    /// failure (an allocation with a fallback). `detail` says what was
    /// swept (the kprobe's offset, whether the instruction page existed).
    ///
    /// `sweep` is the plan's target kind ([`SweepTarget::kind`]), and
    /// `clean_errno` the errno's name when the last attempt, the one
    /// without an injected fault, failed too: an attach sweep reports that
    /// as evidence (the kernel did not undo an earlier injected failure)
    /// instead of failing the step. Both are absent from agents before
    /// protocol 14.
    FailNthSweep {
        target: String,
        attempts: u32,
        failed: u32,
        errnos: Vec<(String, u32)>,
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sweep: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clean_errno: Option<String>,
    },
    /// The side-band lookups of a `storm` with `lookup`: PROG_LOAD ids seen
    /// in the rings while the storm ran and what `BPF_PROG_GET_FD_BY_ID`
    /// said for each.
    Lookups {
        seen: u32,
        found: u32,
        enoent: u32,
        other_errors: Vec<String>,
    },
    /// What a `run-program` step's program did.
    ProgramRun {
        path: String,
        /// Its exit status, when it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, when one did (SIGKILL after a timeout).
        signal: Option<i32>,
        timed_out: bool,
        /// stdout then stderr, at most [`MAX_PROGRAM_OUTPUT`] bytes.
        output: String,
        elapsed_ns: u64,
    },
    /// One piece of the `perf.data` the plan's `perf record` wrote, sent
    /// before its dump: `offset` into the file of `total` bytes, the piece's
    /// bytes in hex (at most [`PERF_DATA_PIECE`] of them).
    PerfData {
        offset: u64,
        total: u64,
        hex: String,
    },
    /// perf's dump (`perf report -D --header`) of the plan's `perf record`
    /// run.
    PerfScript {
        command: String,
        text: String,
        stderr: String,
    },
    /// What a `perf-attribution` step arranged and what perf made of its
    /// samples.
    PerfAttribution(PerfAttribution),
    /// What `watch-ksymbols` saw, in the order the calls reserved their
    /// place in its ring: one observation per `perf_event_ksymbol` call
    /// since the watch was attached (at most [`MAX_KSYMBOL_OBSERVATIONS`]).
    KsymbolWatch {
        observations: Vec<KsymbolObservation>,
        /// Calls whose observation did not fit (ring full, or past the cap).
        dropped: u64,
    },
    /// The initramfs carried no plan: early setup and the aya warm-up are
    /// done, nothing else will be written until a [`ToGuest::Plan`]
    /// arrives, so the channel is quiet at a frame boundary and the VM can
    /// be saved here. The agent's first frame then; it says hello only
    /// once the plan came.
    AwaitingPlan {
        /// Guest monotonic clock when the agent started waiting, in ns.
        monotonic_ns: u64,
        /// BPF programs the warm-up loaded and dropped.
        warmed_up: u32,
    },
    /// What a `spin-read` step's reader found: every record it checked the
    /// moment `data_head` covered it, and the ones whose bytes were not
    /// yet written then.
    SpinRead(SpinReading),
    /// Shell mode (`vm-shell`): early setup is done and PID 1 is starting
    /// the interactive shell on the console. Every run of [`RUN_BY_HAND`]
    /// after it is a session of its own: hello … done.
    ShellReady {
        /// Guest monotonic clock at that moment, in ns.
        monotonic_ns: u64,
    },
}

/// What the reader of a `spin-read` step saw (rule `published-bytes`).
///
/// User space cannot write a ring's data pages (the kernel maps them
/// read-only and refuses a write fault on any page but the control page:
/// `perf_mmap_pfn_mkwrite()`, before 6.11 `perf_mmap_fault()`), so the
/// reader cannot poison them itself; what a word held before the kernel
/// wrote there is known all the same. A fresh ring's pages come zeroed
/// (`perf_mmap_alloc_page()` allocates with `__GFP_ZERO`), and past a lap
/// the word holds what the reader read there one lap earlier. So a trailer
/// word whose value the kernel fixes (`id`, `identifier`: the event's id;
/// `cpu`: the listener's CPU with `res` 0) and that holds anything else,
/// or a `time` (always newer than any time written before) that still
/// holds what lay there before, is a word the kernel had not written when
/// `data_head` covered it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpinReading {
    /// The CPU the listener was opened on (and the loader pinned to).
    pub listener_cpu: u32,
    /// The CPU the reader thread was pinned to.
    pub reader_cpu: u32,
    /// Load/unload cycles the loader ran while the reader read.
    pub cycles: u32,
    /// JITed functions of the program (each load registers a KSYMBOL per
    /// function, and its unload unregisters each).
    pub functions: u32,
    /// Times the reader saw `data_head` move.
    pub head_advances: u64,
    /// Records checked.
    pub records: u64,
    /// Bytes those records span.
    pub bytes: u64,
    /// The sum of the LOST records' counts: records the kernel dropped
    /// because the reader fell a ring behind.
    pub lost: u64,
    /// Why the reader stopped checking before the end (a head more than a
    /// ring ahead of the tail, a record whose size does not fit), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The torn records, at most [`MAX_TORN`] of them.
    pub torn: Vec<TornRecord>,
    /// All torn records, those past [`MAX_TORN`] included.
    pub torn_total: u64,
}

/// At most this many torn records are described one by one.
pub const MAX_TORN: usize = 64;

/// One record that `data_head` covered before all of its words were
/// written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TornRecord {
    /// Its offset in the ring's stream (the `data_head` space).
    pub offset: u64,
    /// The `data_head` the reader had read when it looked.
    pub head: u64,
    /// `perf_event_header.type` (as written later, when the header itself
    /// was the torn word and the kernel wrote it at last).
    pub record_type: u32,
    /// `perf_event_header.size`.
    pub size: u16,
    /// The words that did not hold what the kernel writes there.
    pub words: Vec<TornWord>,
    /// Whether every torn word held what the kernel writes there when the
    /// reader looked again right after: the kernel wrote it late.
    pub written_later: bool,
}

/// Which word of a record was torn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TornWord {
    /// `perf_event_header` (type, misc, size), still zero in a fresh ring.
    Header,
    /// The sample_id trailer's `time`.
    Time,
    /// The trailer's `id`.
    Id,
    /// The trailer's `stream_id`.
    StreamId,
    /// The trailer's `cpu, res`.
    Cpu,
    /// The trailer's `identifier`.
    Identifier,
}

/// Frames the host writes to the guest (kind [`FrameKind::Message`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum ToGuest {
    /// The plan for a guest restored from a saved VM.
    Plan { plan: Plan },
    /// Shell mode: what the host made of one [`RUN_BY_HAND`] session (its
    /// steps, the records parsed, the rules checked), for the guest to
    /// print. `run` is the `monotonic_ns` of that session's `Hello`, so a
    /// report meant for an earlier, interrupted run is never taken for the
    /// current one's.
    Report { run: u64, text: String },
}

impl ToGuest {
    /// Encodes this message as a complete frame.
    pub fn to_frame(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("host messages always serialise");
        encode_frame(FrameKind::Message, &json)
    }
}

/// Binary header in front of raw ring bytes in a `Records` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordsHeader {
    pub listener: u32,
    /// Offset of these bytes in the listener's stream (sum of earlier chunks).
    pub stream_offset: u64,
}

impl RecordsHeader {
    pub const LEN: usize = 12;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&self.listener.to_le_bytes());
        out[4..].copy_from_slice(&self.stream_offset.to_le_bytes());
        out
    }

    /// Splits a `Records` payload into its header and the raw bytes.
    pub fn split(payload: &[u8]) -> Option<(RecordsHeader, &[u8])> {
        if payload.len() < Self::LEN {
            return None;
        }
        let listener = u32::from_le_bytes(payload[..4].try_into().ok()?);
        let stream_offset = u64::from_le_bytes(payload[4..12].try_into().ok()?);
        Some((
            RecordsHeader {
                listener,
                stream_offset,
            },
            &payload[Self::LEN..],
        ))
    }
}

impl Message {
    /// Encodes this message as a complete frame.
    pub fn to_frame(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("messages always serialise");
        encode_frame(FrameKind::Message, &json)
    }
}

/// Encodes raw ring bytes as one or more `Records` frames.
pub fn records_frames(listener: u32, mut stream_offset: u64, bytes: &[u8]) -> Vec<Vec<u8>> {
    const CHUNK: usize = 64 * 1024;
    let mut frames = Vec::new();
    for chunk in bytes.chunks(CHUNK) {
        let mut payload = Vec::with_capacity(RecordsHeader::LEN + chunk.len());
        payload.extend_from_slice(
            &RecordsHeader {
                listener,
                stream_offset,
            }
            .encode(),
        );
        payload.extend_from_slice(chunk);
        frames.push(encode_frame(FrameKind::Records, &payload));
        stream_offset += chunk.len() as u64;
    }
    frames
}

/// For `skip_serializing_if`.
fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ksymbol_watch_fits_one_frame() {
        // The longest fields the watch can send: names cut at 63 bytes of
        // characters JSON escapes, the largest numbers.
        let o = KsymbolObservation {
            ksym_type: u16::MAX,
            unregister: true,
            addr: u64::MAX,
            len: u32::MAX,
            name: "\u{1}".repeat(63),
            symbolized: "\u{1}".repeat(63),
            snprintf_ret: i64::MIN,
            listed: Some(false),
        };
        let m = Message::KsymbolWatch {
            observations: vec![o; MAX_KSYMBOL_OBSERVATIONS],
            dropped: u64::MAX,
        };
        let json = serde_json::to_vec(&m).unwrap();
        assert!(json.len() <= MAX_PAYLOAD, "{} bytes", json.len());
    }

    #[test]
    fn a_fail_nth_sweep_of_an_older_agent_still_decodes() {
        // Protocol 13's form: no sweep kind, no clean attempt's errno.
        let old = r#"{"msg":"fail-nth-sweep","target":"attach fentry (BPF_RAW_TRACEPOINT_OPEN)","attempts":9,"failed":8,"errnos":[["ENOMEM",8]],"detail":"program \"fentry\""}"#;
        let m: Message = serde_json::from_str(old).unwrap();
        let Message::FailNthSweep {
            sweep, clean_errno, ..
        } = &m
        else {
            panic!("{m:?}")
        };
        assert_eq!((sweep, clean_errno), (&None, &None));
        // And a clean sweep writes neither field, as before.
        assert_eq!(serde_json::to_string(&m).unwrap(), old);
    }

    #[test]
    fn a_plan_frame_decodes_to_the_same_plan() {
        let plan = Plan {
            scenario: "basic".into(),
            requires: vec![Requirement::Btf],
            params: Vec::new(),
            steps: vec![
                Step::Drain,
                Step::Trigger {
                    nanosleeps: 3,
                    sleep_ms: 0,
                },
            ],
        };
        let frame = ToGuest::Plan { plan: plan.clone() }.to_frame();
        let mut d = FrameDecoder::new();
        d.push(&frame);
        let raw = d.next_frame().unwrap().unwrap();
        assert_eq!(raw.kind, FrameKind::Message);
        let back: ToGuest = serde_json::from_slice(&raw.payload).unwrap();
        assert_eq!(back, ToGuest::Plan { plan });
    }

    #[test]
    fn a_pack_names_the_chunk_of_an_address_and_whether_it_is_used() {
        let p = PackReading {
            base: 0x1000,
            chunk_size: 64,
            chunks: 4,
            used: vec![(0, 1), (2, 2)],
        };
        assert_eq!(p.chunk_of(0xfff), None);
        assert_eq!(p.chunk_of(0x1000), Some(0));
        assert_eq!(p.chunk_of(0x1000 + 64), Some(1));
        assert_eq!(p.chunk_of(0x1000 + 4 * 64 - 1), Some(3));
        assert_eq!(p.chunk_of(0x1000 + 4 * 64), None);
        let used: Vec<bool> = (0..4).map(|c| p.is_used(c)).collect();
        assert_eq!(used, [true, false, true, true]);
    }
}
