//! Feature probes for a plan's `requires`.
//!
//! They run before any listener opens, so nothing they load is recorded;
//! still, each undoes what it did (sysctl restored, program and link closed,
//! kprobe and tracefs instance removed) and the fentry probe waits until the
//! kernel has dropped every symbol it created, so that no unregister of a
//! probe's symbol can reach a listener opened later.
//!
//! An unmet requirement is not an error: its reason (one line naming the
//! file, the errno and the config option it implies) ends the run as
//! `Unsupported`. An error is a probe that could not be carried out at all.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use aya_obj::generated::{bpf_attach_type, bpf_prog_type};
use kloop_protocol::Requirement;

use crate::bpf::{bpf_cmd, sys_bpf_fd, zeroed_attr, PROG_LOAD_SIZE, RAW_TRACEPOINT_OPEN_SIZE};
use crate::channel::log;
use crate::perf::{event_attr, perf_event_open};
use crate::steps::fail_nth::{FAILSLAB, FAIL_NTH, FAIL_PAGE_ALLOC};
use crate::steps::net;
use crate::sys::{self, Errno};

/// The outcome of one probe: `Err(reason)` when the kernel lacks the feature.
/// A string: the reason goes to the host as the `Unsupported` text, as-is.
type Probe = std::result::Result<(), String>;

/// Probe outcomes found while a VM was being booted to be saved, by
/// requirement: `Ok(outcome)` or the error text of a probe that could not be
/// carried out, with how long it took then.
///
/// A restored guest is the saved memory image, so its kernel, command line
/// and devices are the ones these answers were found on: asking again would
/// only repeat the work in every trial (the fentry probe alone waits about
/// a second under TCG for RCU-tasks to free its trampoline).
static AT_SAVE: OnceLock<HashMap<Requirement, SavedAnswer>> = OnceLock::new();

/// One requirement's answer from before the save: the outcome, or the text
/// of the error that kept the probe from running; and its milliseconds.
/// A string: kept across the save and said as-is, like [`Probe`]'s.
type SavedAnswer = (std::result::Result<Probe, String>, u128);

/// Requirements [`probe_before_save`] answers: every one whose probe leaves
/// nothing behind that a trial would see differently from a cold boot that
/// probed it. `veth` is probed in the trial that asks for it: it loads a
/// module, which stays loaded. `kprobes` is answered here although its
/// probe leaves a trace: the probe's kprobe is armed through ftrace (perf
/// registers a trace event's probe when the event is opened, disabled or
/// not), which gives the kprobe ftrace ops a trampoline that outlives the
/// probe (an `ftrace_trampoline` symbol, never freed for a static ops). A
/// trial that needs kprobes had that symbol before its first step anyway,
/// and to any other trial it is one more symbol that was there before its
/// listeners opened, listed by `snapshot-kallsyms` like the rest; probing
/// in the trial cost every kprobes trial the probe and a second read of
/// /proc/kallsyms (0.1 + 0.3 s under TCG), and the verdicts and
/// snapshots of all pins were the same either way.
const PROBED_BEFORE_SAVE: &[Requirement] = &[
    Requirement::Btf,
    Requirement::Jit,
    Requirement::JitOptional,
    Requirement::Fentry,
    Requirement::LsmBpf,
    Requirement::FtraceInstances,
    Requirement::Kprobes,
    Requirement::PerfTool,
    Requirement::Threads,
    Requirement::SyscallTracepoints,
    Requirement::FaultInjection,
    Requirement::BpfSnprintf,
    Requirement::LongSymbolNames,
    Requirement::SideBandWalkKprobe,
    Requirement::TwoCpus,
    Requirement::StructOps,
    Requirement::StructOpsKsyms,
    Requirement::Optprobes,
    Requirement::FtraceTrampolines,
];

/// Runs every probe of [`PROBED_BEFORE_SAVE`] once, in a guest about to be
/// saved, and keeps the answers for the trials restored from it. Returns
/// a note for the host.
pub fn probe_before_save() -> String {
    let started = Instant::now();
    let mut answers = HashMap::new();
    for &r in PROBED_BEFORE_SAVE {
        let t = Instant::now();
        let outcome = probe(r).map_err(|e| sys::describe_chain(&e));
        answers.insert(r, (outcome, t.elapsed().as_millis()));
    }
    let _ = AT_SAVE.set(answers);
    format!(
        "probed {} requirement(s) before the save, {} ms",
        PROBED_BEFORE_SAVE.len(),
        started.elapsed().as_millis()
    )
}

/// The first requirement the running kernel does not meet, with the reason,
/// and whether every answer came from [`probe_before_save`] (so no probe
/// touched the kernel since the save).
pub fn first_unmet(requires: &[Requirement]) -> Result<(Option<(Requirement, String)>, bool)> {
    let mut all_from_save = true;
    for &r in requires {
        let (outcome, how) = match AT_SAVE.get().and_then(|a| a.get(&r)) {
            Some((Ok(outcome), ms)) => (outcome.clone(), format!("{ms} ms, before the save")),
            Some((Err(e), _)) => bail!("probe {r:?} (before the save): {e}"),
            None => {
                all_from_save = false;
                let started = Instant::now();
                let outcome = probe(r)?;
                (outcome, format!("{} ms", started.elapsed().as_millis()))
            }
        };
        log(format!(
            "probe {r:?}: {} ({how})",
            match &outcome {
                Ok(()) => "met".to_string(),
                Err(reason) => format!("unmet: {reason}"),
            },
        ))?;
        if let Err(reason) = outcome {
            return Ok((Some((r, reason)), all_from_save));
        }
    }
    Ok((None, all_from_save))
}

fn probe(r: Requirement) -> Result<Probe> {
    match r {
        Requirement::Btf => Ok(btf()),
        Requirement::Jit => Ok(jit()),
        Requirement::JitOptional => jit_optional(),
        Requirement::Fentry => fentry(),
        Requirement::LsmBpf => lsm_bpf(),
        Requirement::Kprobes => kprobes(),
        Requirement::FtraceInstances => ftrace_instances(),
        Requirement::Veth => Ok(net::veth_probe()),
        Requirement::PerfTool => Ok(perf_tool()),
        Requirement::Threads => Ok(threads()),
        Requirement::SyscallTracepoints => Ok(syscall_tracepoints()),
        Requirement::FaultInjection => Ok(fault_injection()),
        Requirement::BpfSnprintf => Ok(bpf_snprintf()),
        Requirement::LongSymbolNames => Ok(long_symbol_names()),
        Requirement::SideBandWalkKprobe => side_band_walk_kprobe(),
        // Read from the JIT's books, found once per boot (after the save's
        // kallsyms read), so not probed before the save.
        Requirement::TrampolinePacks => Ok(crate::jit_books::Books::get()
            .map(|_| ())
            .map_err(|e| e.to_string())),
        Requirement::TwoCpus => two_cpus(),
        Requirement::StructOps => struct_ops(),
        Requirement::StructOpsKsyms => crate::steps::struct_ops::names_trampolines(),
        Requirement::Optprobes => Ok(optprobes()),
        // What the architecture implements: the host's preflight says it
        // from the config (CONFIG_X86_64) before any boot.
        Requirement::FtraceTrampolines => Ok(match kloop_protocol::Arch::OF_THIS_BUILD {
            kloop_protocol::Arch::X86_64 => Ok(()),
            other => Err(format!(
                "{other} has no ftrace ops trampolines (arch_ftrace_update_trampoline() is x86's)"
            )),
        }),
    }
}

/// kernel/kprobes.c registers `debug.kprobes-optimization` under
/// `CONFIG_OPTPROBES` only.
const KPROBES_OPTIMIZATION: &str = "/proc/sys/debug/kprobes-optimization";

fn optprobes() -> Probe {
    match std::fs::metadata(KPROBES_OPTIMIZATION) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{KPROBES_OPTIMIZATION}: {}: no optimized kprobes (CONFIG_OPTPROBES; HAVE_OPTPROBES \
             is x86, arm and powerpc's only)",
            sys::Errno(&e)
        )),
    }
}

/// `bpf_snprintf` came in 5.13 (commit "bpf: Add a bpf_snprintf helper");
/// the kernel's release says whether it has it. Loading the watch itself
/// would tell too, but a refused load names no cause.
fn bpf_snprintf() -> Probe {
    let release = sys::uname().release;
    match kernel_version(&release) {
        Some(v) if v >= (5, 13) => Ok(()),
        Some(_) => Err(format!(
            "kernel {release} predates 5.13, which added the bpf_snprintf helper \
             (%ps symbolization in BPF programs) that the ksymbol watch needs"
        )),
        None => Err(format!(
            "cannot read a version from kernel release {release:?}"
        )),
    }
}

/// KSYM_NAME_LEN went from 128 to 512 in 6.1 ("kallsyms: increase maximum
/// kernel symbol length to 512", include/linux/kallsyms.h); before it the
/// kernel refuses a BTF function name of 128 bytes or more.
fn long_symbol_names() -> Probe {
    let release = sys::uname().release;
    match kernel_version(&release) {
        Some(v) if v >= (6, 1) => Ok(()),
        Some(_) => Err(format!(
            "kernel {release} predates 6.1, where KSYM_NAME_LEN grew from 128 to 512 \
             (include/linux/kallsyms.h): its symbols and BTF names stay under 128 bytes"
        )),
        None => Err(format!(
            "cannot read a version from kernel release {release:?}"
        )),
    }
}

/// CPUs 0 and 1 online: `spin-read` writes on one and reads on the other.
/// A guest with one CPU has no second one to watch from, which is a reason
/// to skip, not a kernel that passed.
fn two_cpus() -> Result<Probe> {
    let cpus = sys::online_cpus()
        .map_err(|e| anyhow::anyhow!("reading /sys/devices/system/cpu/online: {e}"))?;
    Ok(if cpus.contains(&0) && cpus.contains(&1) {
        Ok(())
    } else {
        Err(format!(
            "CPUs {cpus:?} online: a reader on CPU 1 must watch the ring CPU 0 writes \
             (run the guest with at least 2 vCPUs; [vm] cpus = 2)"
        ))
    })
}

/// vmlinux BTF has the struct_ops value type of `tcp_congestion_ops`, the
/// JIT is on (a struct_ops trampoline is arch code; with the JIT off the
/// map update fails) and a struct_ops program for it loads. Like the
/// fentry probe, it waits until the program's symbol is gone, so its
/// unregister reaches no listener opened later.
fn struct_ops() -> Result<Probe> {
    let types = match crate::steps::struct_ops::types()? {
        Ok(t) => t,
        Err(reason) => return Ok(Err(reason)),
    };
    if let Err(reason) = jit() {
        return Ok(Err(reason));
    }
    let before = bpf_symbols()?;
    let outcome = crate::steps::struct_ops::loads(&types);
    wait_symbols_gone(&before, "struct-ops probe", "its program")?;
    Ok(outcome)
}

/// Waits (at most 30 s) until every `[bpf]` symbol not in `before` has
/// left /proc/kallsyms: a probe's program goes when its last reference
/// does, a trampoline image after RCU-tasks grace periods
/// (kernel/bpf/trampoline.c), and an unregister still to come would
/// reach a listener opened later.
fn wait_symbols_gone(before: &HashSet<(u64, String)>, probe: &str, closed: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = bpf_symbols()?;
        let left: Vec<&(u64, String)> = now.difference(before).collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{probe}: the kernel still lists {left:?} 30 s after the probe closed {closed}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `(major, minor)` of a release such as `6.12.5-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Rust's threads park and join on `futex(2)`; a kernel without it
/// (`CONFIG_FUTEX` off, as tinyconfig leaves it) kills a multi-threaded
/// agent with SIGSEGV on the first contended wait. `FUTEX_WAKE` on a
/// private word wakes nobody and has no effect; ENOSYS says it is missing.
/// Whether the agent may start threads and join them here: [`threads`]
/// asked once. Steps that only use threads to go faster ask this and do
/// their work on one thread otherwise, so that they need no `threads`
/// requirement.
pub fn threads_work() -> bool {
    static WORK: OnceLock<bool> = OnceLock::new();
    *WORK.get_or_init(|| threads().is_ok())
}

fn threads() -> Probe {
    let word: u32 = 0;
    // SAFETY: FUTEX_WAKE reads nothing through the pointer beyond its
    // address; the word outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            &word as *const u32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "futex(FUTEX_WAKE): {}: the kernel has no futexes (CONFIG_FUTEX), which the agent's threads need",
            Errno(&e)
        ));
    }
    Ok(())
}

const SYSCALL_TRACEPOINT: &str = "/sys/kernel/tracing/events/syscalls/sys_enter_nanosleep/id";

fn syscall_tracepoints() -> Probe {
    match std::fs::metadata(SYSCALL_TRACEPOINT) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{SYSCALL_TRACEPOINT}: {}: no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)",
            Errno(&e)
        )),
    }
}

/// What a `fail-nth` sweep arms and sets, each with the options that make
/// it: fail-nth is in fs/proc/base.c under `CONFIG_FAULT_INJECTION`, the
/// knobs in mm/failslab.c and mm/fail_page_alloc.c under
/// `CONFIG_FAULT_INJECTION_DEBUG_FS`. Only looked at, never written.
fn fault_injection() -> Probe {
    let failslab = format!("{FAILSLAB}/ignore-gfp-wait");
    let fail_page_alloc = format!("{FAIL_PAGE_ALLOC}/ignore-gfp-wait");
    for (path, options) in [
        (FAIL_NTH, "CONFIG_FAULT_INJECTION"),
        (
            failslab.as_str(),
            "CONFIG_FAILSLAB, CONFIG_FAULT_INJECTION_DEBUG_FS",
        ),
        (
            fail_page_alloc.as_str(),
            "CONFIG_FAIL_PAGE_ALLOC, CONFIG_FAULT_INJECTION_DEBUG_FS",
        ),
    ] {
        if let Err(e) = std::fs::metadata(path) {
            return Err(format!(
                "{path}: {}: no allocation-failure injection ({options})",
                Errno(&e)
            ));
        }
    }
    Ok(())
}

const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const JIT_ENABLE: &str = "/proc/sys/net/core/bpf_jit_enable";

fn btf() -> Probe {
    match std::fs::metadata(BTF_VMLINUX) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{BTF_VMLINUX}: {}: the kernel has no BTF (CONFIG_DEBUG_INFO_BTF)",
            Errno(&e)
        )),
    }
}

fn jit() -> Probe {
    match sys::read_trimmed(JIT_ENABLE) {
        Ok(v) if v == "0" => Err(format!(
            "{JIT_ENABLE} is 0: programs run in the interpreter"
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{JIT_ENABLE}: {}: the kernel has no BPF JIT (CONFIG_BPF_JIT)",
            Errno(&e)
        )),
    }
}

fn jit_optional() -> Result<Probe> {
    let original = match sys::read_trimmed(JIT_ENABLE) {
        Ok(v) => v,
        Err(e) => {
            return Ok(Err(format!(
                "{JIT_ENABLE}: {}: the kernel has no BPF JIT (CONFIG_BPF_JIT)",
                Errno(&e)
            )))
        }
    };
    if let Err(e) = std::fs::write(JIT_ENABLE, "0") {
        // net/core/sysctl_net_core.c: with CONFIG_BPF_JIT_ALWAYS_ON the
        // sysctl's minimum is 1, so 0 is out of range (EINVAL).
        return Ok(Err(format!(
            "writing 0 to {JIT_ENABLE} (was {original}): {}: the JIT cannot be turned off (CONFIG_BPF_JIT_ALWAYS_ON=y)",
            Errno(&e)
        )));
    }
    let now = sys::read_trimmed(JIT_ENABLE);
    if let Err(e) = std::fs::write(JIT_ENABLE, &original) {
        bail!(
            "jit-optional probe: restoring {JIT_ENABLE} to {original} after writing 0: {}",
            Errno(&e)
        );
    }
    Ok(match now {
        Ok(v) if v == "0" => Ok(()),
        Ok(v) => Err(format!(
            "wrote 0 to {JIT_ENABLE} (was {original}) but it reads back {v}: the JIT cannot be turned off"
        )),
        Err(e) => Err(format!(
            "reading {JIT_ENABLE} back after writing 0: {}",
            Errno(&e)
        )),
    })
}

const SECURITYFS: &str = "/sys/kernel/security";
const LSM_LIST: &str = "/sys/kernel/security/lsm";

fn lsm_bpf() -> Result<Probe> {
    let mut mounted_here = false;
    if !std::path::Path::new(LSM_LIST).exists() {
        match sys::mount("securityfs", SECURITYFS) {
            Ok(fresh) => mounted_here = fresh,
            Err(e) => {
                return Ok(Err(format!(
                    "mounting securityfs on {SECURITYFS}: {}: the kernel has no securityfs (CONFIG_SECURITYFS)",
                    Errno(&e)
                )))
            }
        }
    }
    let list = sys::read_trimmed(LSM_LIST);
    if mounted_here {
        // The agent mounted it only to look: leave the mount table as it was.
        let target = CString::new(SECURITYFS).expect("no NUL");
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), 0) };
    }
    Ok(match list {
        Ok(l) if l.split(',').any(|m| m.trim() == "bpf") => Ok(()),
        Ok(l) => Err(format!(
            "{LSM_LIST} is {l:?}, without bpf: BPF LSM needs CONFIG_BPF_LSM=y and bpf in the lsm= boot parameter"
        )),
        Err(e) => Err(format!(
            "{LSM_LIST}: {}: no LSM list (CONFIG_SECURITY)",
            Errno(&e)
        )),
    })
}

const KPROBES_LIST: &str = "/sys/kernel/debug/kprobes/list";
const KPROBES_ENABLED: &str = "/sys/kernel/debug/kprobes/enabled";
const KPROBE_PMU_TYPE: &str = "/sys/bus/event_source/devices/kprobe/type";
/// A function every x86-64 kernel since 4.17 has, with an ftrace call site
/// (so the kprobe needs no out-of-line instruction slot), and that the agent
/// never calls while the probe is registered.
#[cfg(not(target_arch = "aarch64"))]
const KPROBE_FUNCTION: &str = "__x64_sys_getppid";
/// arm64's syscall wrapper of the same (ARCH_HAS_SYSCALL_WRAPPER since
/// 4.19, arch/arm64/include/asm/syscall_wrapper.h). arm64 has no
/// KPROBES_ON_FTRACE: its kprobe steps the probed instruction in a slot of
/// a `kprobe_insn_page` (or simulates it), announced like x86's.
#[cfg(target_arch = "aarch64")]
const KPROBE_FUNCTION: &str = "__arm64_sys_getppid";

/// A disabled kprobe perf event on `perf_iterate_sb` (or its one clone)
/// opens and closes.
fn side_band_walk_kprobe() -> Result<Probe> {
    if let Err(e) = kprobes()? {
        return Ok(Err(e));
    }
    let function = match crate::kallsyms::resolve_clone("perf_iterate_sb") {
        Ok(f) => f,
        Err(e) => return Ok(Err(format!("{e:#}"))),
    };
    let pmu: u32 = sys::read_trimmed(KPROBE_PMU_TYPE)?
        .parse()
        .map_err(|_| anyhow::anyhow!("{KPROBE_PMU_TYPE} is not a number"))?;
    let func = CString::new(function.as_str()).expect("no NUL");
    let mut attr = event_attr(pmu, 0);
    attr.__bindgen_anon_3.kprobe_func = func.as_ptr() as u64;
    // Whether the kernel takes a kprobe in the walk at all: on arm64 at a
    // branch, so the probe leaves no instruction page behind.
    attr.__bindgen_anon_4.probe_offset = crate::arm64_insn::slot_free_offset(&function)?;
    attr.set_disabled(1);
    match perf_event_open(&attr, -1, 0) {
        Ok(fd) => {
            drop(fd);
            Ok(Ok(()))
        }
        Err(e) => Ok(Err(format!(
            "perf_event_open(kprobe PMU {pmu}, {function}): {}: this kernel refuses a kprobe on \
             the side-band walk",
            Errno(&e)
        ))),
    }
}

fn kprobes() -> Result<Probe> {
    let before = match std::fs::read_to_string(KPROBES_LIST) {
        Ok(l) => l,
        Err(e) => {
            return Ok(Err(format!(
                "{KPROBES_LIST}: {}: no kprobes (CONFIG_KPROBES) or no debugfs",
                Errno(&e)
            )))
        }
    };
    match sys::read_trimmed(KPROBES_ENABLED) {
        Ok(v) if v == "1" => {}
        Ok(v) => {
            return Ok(Err(format!(
                "{KPROBES_ENABLED} is {v}: kprobes are disarmed"
            )))
        }
        Err(e) => return Ok(Err(format!("{KPROBES_ENABLED}: {}", Errno(&e)))),
    }
    let pmu: u32 = match sys::read_trimmed(KPROBE_PMU_TYPE) {
        Ok(t) => match t.parse() {
            Ok(t) => t,
            Err(_) => bail!("kprobes probe: {KPROBE_PMU_TYPE} holds {t:?}, not a number"),
        },
        Err(e) => {
            return Ok(Err(format!(
                "{KPROBE_PMU_TYPE}: {}: no kprobe PMU (CONFIG_KPROBE_EVENTS)",
                Errno(&e)
            )))
        }
    };
    let func = CString::new(KPROBE_FUNCTION).expect("no NUL");
    let mut attr = event_attr(pmu, 0);
    // The function name, which outlives the call.
    attr.__bindgen_anon_3.kprobe_func = func.as_ptr() as u64;
    // arm64 steps most instructions in a slot of a kprobe_insn_page, which
    // the kernel keeps once made: a probe that took one before the save
    // would leave the scenarios that count the page's KSYMBOL register
    // without one. On a branch, which it simulates, it takes none.
    attr.__bindgen_anon_4.probe_offset = crate::arm64_insn::slot_free_offset(KPROBE_FUNCTION)?;
    // Registered but never armed, so it never fires.
    attr.set_disabled(1);
    let fd = match perf_event_open(&attr, -1, 0) {
        Ok(fd) => fd,
        Err(e) => {
            return Ok(Err(format!(
                "perf_event_open(kprobe PMU {pmu}, {KPROBE_FUNCTION}): {}: a kprobe cannot be registered",
                Errno(&e)
            )))
        }
    };
    // The list names a probe by the first kallsyms name at its address
    // (`__do_sys_getppid` for the syscall wrapper), so count lines instead.
    let listed = std::fs::read_to_string(KPROBES_LIST).unwrap_or_default();
    drop(fd);
    if listed.lines().count() != before.lines().count() + 1 {
        return Ok(Err(format!(
            "a kprobe perf event on {KPROBE_FUNCTION} opened but {KPROBES_LIST} did not gain a line: {:?}",
            listed.lines().take(3).collect::<Vec<_>>()
        )));
    }
    // Closing the event unregisters the kprobe synchronously.
    let after = std::fs::read_to_string(KPROBES_LIST).unwrap_or_default();
    if after != before {
        bail!("kprobes probe: {KPROBES_LIST} differs after closing the probe's perf event on {KPROBE_FUNCTION}:\nbefore:\n{before}\nafter:\n{after}");
    }
    Ok(Ok(()))
}

const TRACEFS_INSTANCES: &str = "/sys/kernel/tracing/instances";

fn ftrace_instances() -> Result<Probe> {
    let dir = format!("{TRACEFS_INSTANCES}/kloop-probe");
    if let Err(e) = std::fs::create_dir(&dir) {
        return Ok(Err(format!(
            "mkdir {dir}: {}: no tracefs instances (CONFIG_TRACING, tracefs mounted on /sys/kernel/tracing)",
            Errno(&e)
        )));
    }
    let tracers = std::fs::read_to_string(format!("{dir}/available_tracers"));
    if let Err(e) = std::fs::remove_dir(&dir) {
        bail!("ftrace-instances probe: rmdir {dir}: {}", Errno(&e));
    }
    Ok(match tracers {
        Ok(t) if t.split_whitespace().any(|t| t == "function") => Ok(()),
        Ok(t) => Err(format!(
            "{dir}/available_tracers is {:?}, without function: no function tracer (CONFIG_FUNCTION_TRACER)",
            t.trim()
        )),
        Err(e) => Err(format!("{dir}/available_tracers: {}", Errno(&e))),
    })
}

const PERF_BINARY: &str = "/usr/bin/perf";

fn perf_tool() -> Probe {
    if let Err(e) = std::fs::metadata(PERF_BINARY) {
        return Err(format!(
            "{PERF_BINARY}: {}: the host did not ship perf into the initramfs",
            Errno(&e)
        ));
    }
    match std::process::Command::new(PERF_BINARY)
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{PERF_BINARY} --version {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )),
        Err(e) => Err(format!(
            "running {PERF_BINARY} --version: {} (missing libraries in the initramfs?)",
            Errno(&e)
        )),
    }
}

/// The kernel function the fentry probe's program is verified against:
/// `net/bpf/test_run.c` keeps it for exactly this kind of test.
const FENTRY_TARGET: &str = "bpf_fentry_test1";

/// `[bpf]` symbols in /proc/kallsyms (programs and trampolines).
fn bpf_symbols() -> Result<HashSet<(u64, String)>> {
    Ok(
        crate::kallsyms::read_filtered(|e| e.module.as_deref() == Some("bpf"))?
            .into_iter()
            .map(|e| (e.addr, e.name))
            .collect(),
    )
}

fn fentry() -> Result<Probe> {
    let raw = match std::fs::read(BTF_VMLINUX) {
        Ok(b) => b,
        Err(e) => {
            return Ok(Err(format!(
                "{BTF_VMLINUX}: {}: fentry needs kernel BTF (CONFIG_DEBUG_INFO_BTF)",
                Errno(&e)
            )))
        }
    };
    let btf_id = match crate::btf::func_id(&raw, FENTRY_TARGET) {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Ok(Err(format!(
                "{BTF_VMLINUX} has no FUNC {FENTRY_TARGET} (net/bpf/test_run.c, CONFIG_NET)"
            )))
        }
        Err(e) => bail!("fentry probe: parsing {BTF_VMLINUX}: {e}"),
    };
    let before = bpf_symbols()?;
    let outcome = fentry_load_attach(btf_id);
    wait_symbols_gone(&before, "fentry probe", "its program and link")?;
    Ok(outcome)
}

/// Loads `r0 = 0; exit` as fentry on BTF FUNC `btf_id`, attaches it and
/// closes both (the link first).
fn fentry_load_attach(btf_id: u32) -> Probe {
    let insns: [u64; 2] = [
        0x0000_0000_0000_00b7, // BPF_ALU64 | BPF_MOV | BPF_K: r0 = 0
        0x0000_0000_0000_0095, // BPF_JMP | BPF_EXIT
    ];
    let mut log = vec![0u8; 64 * 1024];
    let mut attr =
        crate::bpf::prog_load_attr(bpf_prog_type::BPF_PROG_TYPE_TRACING, &insns, "kloop_probe");
    attr.__bindgen_anon_3.expected_attach_type = bpf_attach_type::BPF_TRACE_FENTRY as u32;
    attr.__bindgen_anon_3.attach_btf_id = btf_id;
    let prog = match sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE) {
        Ok(fd) => fd,
        Err(e) => {
            // Again with the verifier log, for the reason.
            attr.__bindgen_anon_3.log_level = 1;
            attr.__bindgen_anon_3.log_size = log.len() as u32;
            attr.__bindgen_anon_3.log_buf = log.as_mut_ptr() as u64;
            let _ = sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE);
            let text = String::from_utf8_lossy(&log);
            let last = text
                .trim_end_matches('\0')
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            return Err(format!(
                "BPF_PROG_LOAD of a fentry program for {FENTRY_TARGET} (BTF id {btf_id}): {}; verifier: {last:?}",
                Errno(&e)
            ));
        }
    };
    let mut tp = zeroed_attr();
    // No name: a tracing program attaches where it was loaded for.
    tp.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    let link = sys_bpf_fd(
        bpf_cmd::BPF_RAW_TRACEPOINT_OPEN,
        &mut tp,
        RAW_TRACEPOINT_OPEN_SIZE,
    );
    let outcome = match &link {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "attaching a fentry program to {FENTRY_TARGET} (BPF_RAW_TRACEPOINT_OPEN): {}: no BPF trampolines",
            Errno(e)
        )),
    };
    drop(link);
    drop(prog);
    outcome
}
