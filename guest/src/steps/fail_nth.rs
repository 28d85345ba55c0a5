//! `fail-nth`: systematic allocation failures in one syscall.
//!
//! The kernel counts the fault points a task passes while
//! `/proc/<pid>/task/<tid>/fail-nth` holds N and fails the N-th
//! (`should_fail_ex` in lib/fault-inject.c, for every capability:
//! failslab's kmalloc/kmem_cache_alloc and fail_page_alloc's page
//! allocations), then reads back 0. Reading back what is left of N means the
//! syscall ended before the N-th point. The counter is the task's own, so
//! the agent's other threads (heartbeat) are not touched, and it is not
//! reset at syscall exit: whatever is left is cleared here before the next
//! syscall that could allocate.
//!
//! A sweep runs N = 1, 2, … until an attempt reaches no injected fault:
//! every fault point the syscall passes on its way to success has then been
//! failed once, among them those this step is aimed at (the trampoline
//! image's `kzalloc` in `bpf_tramp_image_alloc`, the instruction page's
//! `kmalloc` and `execmem_alloc` in `__get_insn_slot`).
//!
//! Between arming and reading back, the thread makes exactly one syscall
//! and must not take a page fault (a user page fault allocates too, and
//! would eat the armed point): the fail-nth fd is opened, the syscall's
//! arguments are built, the code paths run once and the stack is touched
//! before arming.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya_obj::generated::bpf_cmd;
use kloop_protocol::{Message, SweepTarget};

use crate::bpf::{sys_bpf_fd, zeroed_attr, RAW_TRACEPOINT_OPEN_SIZE};
use crate::channel::{log, send};
use crate::context::StepContext;
use crate::perf::{self, event_attr, perf_event_attr, perf_event_open};
use crate::sys::{self, errno_name, OsContext};

/// The calling thread's fail-nth file.
pub const FAIL_NTH: &str = "/proc/thread-self/fail-nth";
/// failslab's debugfs directory (`CONFIG_FAILSLAB` +
/// `CONFIG_FAULT_INJECTION_DEBUG_FS`).
pub const FAILSLAB: &str = "/sys/kernel/debug/failslab";
/// fail_page_alloc's debugfs directory (`CONFIG_FAIL_PAGE_ALLOC` +
/// `CONFIG_FAULT_INJECTION_DEBUG_FS`).
pub const FAIL_PAGE_ALLOC: &str = "/sys/kernel/debug/fail_page_alloc";

/// Knobs set for the sweep and what they are set to. By default both
/// capabilities skip allocations that may sleep (`ignore-gfp-wait`:
/// GFP_KERNEL, which every allocation swept here uses), fail_page_alloc
/// skips order-0 pages (`min-order` 1: an instruction page is order 0) and
/// `__GFP_HIGHMEM` ones (vmalloc asks for its pages with it), and each
/// injected failure prints a stack trace (`verbose`), which would swamp the
/// console.
const KNOBS: &[(&str, &str, &str)] = &[
    (FAILSLAB, "ignore-gfp-wait", "N"),
    (FAILSLAB, "verbose", "0"),
    (FAIL_PAGE_ALLOC, "ignore-gfp-wait", "N"),
    (FAIL_PAGE_ALLOC, "ignore-gfp-highmem", "N"),
    (FAIL_PAGE_ALLOC, "min-order", "0"),
    (FAIL_PAGE_ALLOC, "verbose", "0"),
];

/// Drain the listeners' rings every this many attempts, so that a long
/// sweep (each attempt past the image allocation registers and unregisters
/// a trampoline on every CPU's ring) cannot overflow them.
const DRAIN_EVERY: u32 = 16;

/// Offsets past the ftrace call site a kprobe sweep tries before giving up:
/// the first is the instruction right after the call; the others only if
/// the kernel refuses that one (EILSEQ, EINVAL).
const MAX_SLOT_OFFSETS: u64 = 16;

/// The x86 ftrace call site (`call __fentry__`, or the 5-byte nop that
/// replaces it) is 5 bytes long.
const FTRACE_CALL_LEN: u64 = 5;

const TRAMPOLINE_PREFIX: &str = "bpf_trampoline_";
const KPROBE_LIST: &str = "/sys/kernel/debug/kprobes/list";
const KPROBE_PMU_TYPE: &str = "/sys/bus/event_source/devices/kprobe/type";
/// The kallsyms name of kprobes' out-of-line instruction pages
/// (`KPROBE_INSN_PAGE_SYM`).
const INSN_PAGE_SYM: &str = "kprobe_insn_page";

/// Runs one `fail-nth` step.
pub fn run(
    context: &mut StepContext,
    target: &SweepTarget,
    max_attempts: u32,
    page_allocations: bool,
) -> Result<()> {
    let knobs = Knobs::set(page_allocations)?;
    let outcome = match target {
        SweepTarget::Attach { label } => sweep_attach(context, label, max_attempts),
        SweepTarget::KprobeSlot { function } => sweep_kprobe_slot(context, function, max_attempts),
        SweepTarget::XdpAttach { label, interface } => {
            sweep_xdp_attach(context, label, interface, max_attempts)
        }
    };
    let restored = knobs.restore();
    let (what, summary, detail) = outcome?;
    restored?;
    let errnos: Vec<(String, u32)> = summary.errnos.into_iter().collect();
    let clean_errno = summary.last_errno.map(errno_label);
    log(format!(
        "fail-nth {what}: {} attempts, {} failed ({errnos:?}){}; {detail}",
        summary.attempts,
        summary.failed,
        clean_errno
            .as_deref()
            .map(|e| format!(", the attempt without an injected fault failed with {e}"))
            .unwrap_or_default()
    ))?;
    send(&Message::FailNthSweep {
        target: what,
        attempts: summary.attempts,
        failed: summary.failed,
        errnos,
        detail,
        sweep: Some(target.kind().to_string()),
        clean_errno,
    })
}

/// The debugfs knobs as they were before the sweep.
pub(crate) struct Knobs {
    saved: Vec<(String, String)>,
}

impl Knobs {
    /// Without `page_allocations`, fail_page_alloc keeps its defaults
    /// (GFP_KERNEL pages are no fault points).
    pub(crate) fn set(page_allocations: bool) -> Result<Knobs> {
        let mut knobs = Knobs { saved: Vec::new() };
        for (dir, name, value) in KNOBS
            .iter()
            .filter(|(dir, _, _)| page_allocations || *dir != FAIL_PAGE_ALLOC)
        {
            let path = format!("{dir}/{name}");
            let old = match sys::read_trimmed(&path) {
                Ok(v) => v,
                Err(e) => {
                    // Put back what was already changed before giving up.
                    let _ = knobs.restore();
                    return Err(e).os_ctx(format!("reading {path}"));
                }
            };
            if let Err(e) = std::fs::write(&path, value) {
                let _ = knobs.restore();
                return Err(e).os_ctx(format!("writing {value} to {path} (was {old})"));
            }
            knobs.saved.push((path, old));
        }
        Ok(knobs)
    }

    pub(crate) fn restore(&self) -> Result<()> {
        for (path, old) in self.saved.iter().rev() {
            std::fs::write(path, old).os_ctx(format!("restoring {path} to {old}"))?;
        }
        Ok(())
    }
}

/// The thread's fail-nth file, opened once so that arming it and reading it
/// back need no path lookup between the armed syscall and its neighbours.
pub(crate) struct FailNth {
    fd: std::fs::File,
}

impl FailNth {
    pub(crate) fn open() -> Result<FailNth> {
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(FAIL_NTH)
            .os_ctx(format!("opening {FAIL_NTH}"))?;
        let f = FailNth { fd };
        // Run the arming code once with a count no getpid reaches, so that
        // none of its pages is touched for the first time while armed.
        let (_, injected) = f.armed(u32::MAX / 2, || {
            // SAFETY: getpid has no arguments and cannot fail.
            Ok(unsafe { libc::getpid() })
        })?;
        if injected {
            bail!("{FAIL_NTH}: reads back 0 after a getpid armed at {}: no fault point should be reached", u32::MAX / 2);
        }
        Ok(f)
    }

    /// Runs `op` (one syscall, no allocation, no new page touched) with
    /// the `n`-th fault point of this thread armed; returns its result and
    /// whether the fault was injected. Leaves fail-nth at 0.
    pub(crate) fn armed<T>(
        &self,
        n: u32,
        op: impl FnOnce() -> io::Result<T>,
    ) -> Result<(io::Result<T>, bool)> {
        touch_stack();
        let text = n.to_string();
        let mut back = [0u8; 16];
        let fd = self.fd.as_raw_fd();
        // SAFETY: writes `text`, which outlives the call, to our fd.
        let rc = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
        if rc != text.len() as isize {
            bail!(
                "writing {n} to {FAIL_NTH}: {}",
                sys::Errno(&io::Error::last_os_error())
            );
        }
        let result = op();
        // SAFETY: reads at most `back.len()` bytes into `back`.
        let rc = unsafe { libc::pread(fd, back.as_mut_ptr().cast(), back.len(), 0) };
        let read_error = (rc < 0).then(io::Error::last_os_error);
        // Disarm before anything else can allocate: whatever is left of N
        // would fail a later, unrelated allocation.
        // SAFETY: writes a 1-byte literal to our fd.
        let disarm = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if let Some(e) = read_error {
            bail!(
                "reading {FAIL_NTH} back after the armed syscall: {}",
                sys::Errno(&e)
            );
        }
        if disarm != 1 {
            bail!(
                "writing 0 to {FAIL_NTH}: {}",
                sys::Errno(&io::Error::last_os_error())
            );
        }
        let left = parse_left(&back[..rc as usize]).ok_or_else(|| {
            anyhow!(
                "{FAIL_NTH} read back {:?}, not a count",
                String::from_utf8_lossy(&back[..rc as usize])
            )
        })?;
        Ok((result, left == 0))
    }
}

/// Touches the next 64 KiB of stack, so that the armed window takes no
/// page fault on it (a fault's page allocation is a fault point too).
#[inline(never)]
fn touch_stack() {
    let mut pad = [0u8; 64 * 1024];
    std::hint::black_box(&mut pad);
}

/// The count fail-nth reads back (`"%u\n"`).
fn parse_left(text: &[u8]) -> Option<u32> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// What one attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// fail-nth read back 0: the N-th fault point was reached and failed.
    injected: bool,
    /// The syscall's errno, if it failed.
    errno: Option<i32>,
}

/// A sweep's tally.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) attempts: u32,
    /// Injected attempts whose syscall failed.
    pub(crate) failed: u32,
    /// Those attempts' errnos, by name.
    errnos: BTreeMap<String, u32>,
    /// The errno of the last attempt, the one without an injected fault.
    pub(crate) last_errno: Option<i32>,
    /// Injected attempts whose syscall succeeded anyway (a failure the
    /// kernel tolerates); each success was undone by closing its fd.
    succeeded: u32,
}

fn errno_label(errno: i32) -> String {
    errno_name(errno)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("errno {errno}"))
}

/// The stop rule: attempts N = 1, 2, … until one reaches no injected fault
/// (which ends the sweep, whatever its result: the caller judges it); more
/// than `max_attempts` is an error. `attempt(n)` runs and undoes attempt n.
pub(crate) fn sweep(
    max_attempts: u32,
    mut attempt: impl FnMut(u32) -> Result<Attempt>,
) -> Result<Summary> {
    let mut summary = Summary::default();
    for n in 1..=max_attempts {
        let a = attempt(n).with_context(|| format!("attempt {n}"))?;
        summary.attempts = n;
        if !a.injected {
            summary.last_errno = a.errno;
            return Ok(summary);
        }
        match a.errno {
            Some(errno) => {
                summary.failed += 1;
                *summary.errnos.entry(errno_label(errno)).or_default() += 1;
            }
            None => summary.succeeded += 1,
        }
    }
    bail!(
        "{max_attempts} attempts and the syscall still reached an injected fault every time ({} failed: {:?})",
        summary.failed,
        summary.errnos
    )
}

/// Runs `open` armed at `n`, closes what it opened (then `settle`s) and
/// drains the rings every [`DRAIN_EVERY`] attempts.
pub(crate) fn attempt_fd(
    context: &mut StepContext,
    fail_nth: &FailNth,
    n: u32,
    open: impl FnOnce() -> io::Result<OwnedFd>,
    settle: impl FnOnce() -> Result<()>,
) -> Result<Attempt> {
    let (result, injected) = fail_nth.armed(n, open)?;
    let errno = match result {
        // Undo a success: closing the fd drops the link or the event. A
        // trampoline the success made lives only until then: its image is
        // read now (the host holds its KSYMBOL to it, rule ksymbol-extent).
        Ok(fd) => {
            crate::jit_books::sight_images(&context.ring_heads());
            drop(fd);
            settle().with_context(|| format!("after closing what attempt {n} opened"))?;
            None
        }
        Err(e) => Some(
            e.raw_os_error()
                .ok_or_else(|| anyhow!("the syscall failed without an errno: {e}"))?,
        ),
    };
    if n.is_multiple_of(DRAIN_EVERY) {
        context.records_bytes += perf::drain_all(&mut context.rings)?;
    }
    Ok(Attempt { injected, errno })
}

type Swept = (String, Summary, String);

/// A duplicate of the fd of the loaded program `label`, so that the
/// context can be lent to the attempts (the program is the same).
pub(crate) fn loaded_prog_fd(context: &mut StepContext, label: &str) -> Result<OwnedFd> {
    context
        .loaded_mut(label)?
        .program_mut()
        .with_context(|| format!("label {label:?}"))?
        .fd()
        .with_context(|| format!("the fd of program {label:?}"))?
        .as_fd()
        .try_clone_to_owned()
        .with_context(|| format!("duplicating the fd of program {label:?}"))
}

/// Sweeps the `bpf(cmd, attr)` that returns a new fd (the caller has
/// warmed its call path unarmed); a success's fd is closed again, then
/// `settle` runs; the rings are drained at the end.
///
/// The attempt without an injected fault is expected to succeed, but its
/// failure is left in the summary (`last_errno`) for the host to judge,
/// not turned into the step's error: every earlier attempt was undone (a
/// failed one by the kernel, a success by closing its fd), so a clean
/// attach that fails is the kernel keeping state from an injected failure
/// (rule `fault-recovery`), a finding about the kernel, not the agent.
fn sweep_bpf_fd(
    context: &mut StepContext,
    what: &str,
    (cmd, attr, size): (bpf_cmd, &mut crate::bpf::bpf_attr, u32),
    max_attempts: u32,
    settle: impl Fn() -> Result<()>,
) -> Result<Summary> {
    let fail_nth = FailNth::open()?;
    let mut summary = sweep(max_attempts, |n| {
        attempt_fd(
            context,
            &fail_nth,
            n,
            || sys_bpf_fd(cmd, attr, size),
            &settle,
        )
    })
    .with_context(|| format!("sweeping {what}"))?;
    if let Some(errno) = summary.last_errno {
        if summary.succeeded > 0 {
            // Not the invariant's case: an earlier attempt attached and
            // was detached, and a kernel may refuse to attach a program
            // again after its link was closed (5.10 to 5.12:
            // bpf_tracing_prog_attach() clears prog->aux->dst_trampoline
            // on the first attach and answers ENOENT after; re-attach came
            // with 5.13). Only a clean attempt after nothing but failed
            // ones says the kernel kept state from a failure.
            log(format!(
                "{what}: the attempt without an injected fault (attempt {}) failed with {} after {} attempt(s) that attached despite the injected fault: not judged (a closed link's program may not attach again)",
                summary.attempts,
                errno_label(errno),
                summary.succeeded
            ))?;
            summary.last_errno = None;
        } else {
            log(format!(
                "{what}: the attempt without an injected fault (attempt {}) failed with {}; reported to the host",
                summary.attempts,
                errno_label(errno)
            ))?;
        }
    }
    context.records_bytes += perf::drain_all(&mut context.rings)?;
    Ok(summary)
}

/// Attaches the loaded program `label` with `BPF_RAW_TRACEPOINT_OPEN`
/// (no name: a tracing or LSM program attaches where it was loaded for).
fn sweep_attach(context: &mut StepContext, label: &str, max_attempts: u32) -> Result<Swept> {
    let prog_fd = loaded_prog_fd(context, label)?;
    let what = format!("attach {label} (BPF_RAW_TRACEPOINT_OPEN)");
    let mut attr = zeroed_attr();
    attr.raw_tracepoint.prog_fd = prog_fd.as_raw_fd() as u32;
    // Warm the call path unarmed with an fd that is no program (EBADF).
    let mut bad = zeroed_attr();
    bad.raw_tracepoint.prog_fd = u32::MAX;
    let _ = sys_bpf_fd(
        bpf_cmd::BPF_RAW_TRACEPOINT_OPEN,
        &mut bad,
        RAW_TRACEPOINT_OPEN_SIZE,
    );
    let summary = sweep_bpf_fd(
        context,
        &what,
        (
            bpf_cmd::BPF_RAW_TRACEPOINT_OPEN,
            &mut attr,
            RAW_TRACEPOINT_OPEN_SIZE,
        ),
        max_attempts,
        trampolines_gone,
    )?;
    Ok((what, summary, format!("program {label:?}")))
}

/// `BPF_LINK_CREATE` up to `flags`: the fields an XDP link uses.
const LINK_CREATE_XDP_SIZE: u32 =
    crate::bpf::attr_size(std::mem::offset_of!(crate::bpf::bpf_attr, link_create.flags) + 4);

/// Attaches the loaded XDP program `label` to `interface` in native mode
/// with `BPF_LINK_CREATE`; a success's link is closed again (the program
/// leaves the device, the dispatcher stays).
fn sweep_xdp_attach(
    context: &mut StepContext,
    label: &str,
    interface: &str,
    max_attempts: u32,
) -> Result<Swept> {
    use aya_obj::generated::{bpf_attach_type, XDP_FLAGS_DRV_MODE};
    let prog_fd = loaded_prog_fd(context, label)?;
    let name = CString::new(interface).context("interface name")?;
    // SAFETY: a NUL-terminated name that outlives the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error()).os_ctx(format!("if_nametoindex({interface})"));
    }
    let what = format!("xdp-attach {label} to {interface} (BPF_LINK_CREATE, native)");
    let mut attr = zeroed_attr();
    attr.link_create.__bindgen_anon_1.prog_fd = prog_fd.as_raw_fd() as u32;
    attr.link_create.__bindgen_anon_2.target_ifindex = ifindex;
    attr.link_create.attach_type = bpf_attach_type::BPF_XDP as u32;
    attr.link_create.flags = XDP_FLAGS_DRV_MODE;
    // Warm the call path unarmed with an fd that is no program (EBADF).
    let mut bad = attr;
    bad.link_create.__bindgen_anon_1.prog_fd = u32::MAX;
    let _ = sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut bad, LINK_CREATE_XDP_SIZE);
    let summary = sweep_bpf_fd(
        context,
        &what,
        (bpf_cmd::BPF_LINK_CREATE, &mut attr, LINK_CREATE_XDP_SIZE),
        max_attempts,
        || Ok(()),
    )?;
    Ok((
        what,
        summary,
        format!("program {label:?}, ifindex {ifindex}"),
    ))
}

/// Waits until kallsyms holds no trampoline image. Closing an attached
/// link frees its image only after RCU-tasks grace periods (from a worker);
/// waiting here puts that unregister right after its register in the
/// stream, where a failed attempt's image (freed within the syscall) puts
/// its own, so the stream's order does not depend on grace-period timing.
fn trampolines_gone() -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = crate::kallsyms::read_filtered(|e| e.name.starts_with(TRAMPOLINE_PREFIX))?;
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} {TRAMPOLINE_PREFIX}* symbols still in kallsyms 15 s after the link was closed",
                left.len()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `kprobe_insn_page` symbols in kallsyms.
fn insn_pages() -> Result<Vec<u64>> {
    Ok(crate::kallsyms::read_filtered(|e| e.name == INSN_PAGE_SYM)?
        .into_iter()
        .map(|e| e.addr)
        .collect())
}

/// A disabled kprobe perf event on `function` + `offset`.
fn kprobe_attr(pmu: u32, function: &CString, offset: u64) -> perf_event_attr {
    let mut attr = event_attr(pmu, 0);
    attr.__bindgen_anon_3.kprobe_func = function.as_ptr() as u64;
    attr.__bindgen_anon_4.probe_offset = offset;
    // Registered but never armed: it never fires, and it needs its
    // instruction slot all the same (prepare_kprobe runs at register).
    attr.set_disabled(1);
    attr
}

/// The offset of `function`'s ftrace call site: a kprobe at +0 is moved
/// there (past an ENDBR on IBT kernels) and served by ftrace, without an
/// instruction slot.
fn ftrace_site(pmu: u32, function: &CString) -> Result<u64> {
    let name = function.to_string_lossy();
    let fd = perf_event_open(&kprobe_attr(pmu, function, 0), -1, 0).map_err(|e| {
        anyhow::Error::new(e).context(format!("perf_event_open(kprobe PMU, {name}+0x0)"))
    })?;
    let list = std::fs::read_to_string(KPROBE_LIST).os_ctx(format!("reading {KPROBE_LIST}"));
    drop(fd);
    let list = list?;
    let line = list
        .lines()
        .find(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|s| s.split_once('+'))
                .is_some_and(|(f, _)| f == name)
        })
        .ok_or_else(|| anyhow!("a kprobe on {name}+0x0 is not in {KPROBE_LIST}:\n{list}"))?;
    if !line.contains("[FTRACE]") {
        bail!("the kprobe on {name}+0x0 is not served by ftrace ({line:?}): it took an instruction slot before the sweep; pick a function with an ftrace call site");
    }
    let place = line.split_whitespace().nth(2).unwrap_or_default();
    let off = place
        .split_once('+')
        .and_then(|(_, o)| u64::from_str_radix(o.strip_prefix("0x")?, 16).ok())
        .ok_or_else(|| anyhow!("no +0x offset in {place:?} ({KPROBE_LIST} line {line:?})"))?;
    Ok(off)
}

/// Opens a kprobe just past `function`'s ftrace call site, which needs an
/// out-of-line instruction slot. The first such probe of a boot allocates
/// the instruction page; the kernel keeps the last page for good, so this
/// must run before any other slot-taking probe.
fn sweep_kprobe_slot(
    context: &mut StepContext,
    function: &str,
    max_attempts: u32,
) -> Result<Swept> {
    let pmu: u32 = sys::read_trimmed(KPROBE_PMU_TYPE)
        .os_ctx(format!("reading {KPROBE_PMU_TYPE}"))?
        .parse()
        .with_context(|| format!("parsing {KPROBE_PMU_TYPE}"))?;
    let func = CString::new(function).context("function name with a NUL")?;
    let pages_before = insn_pages()?;
    if !pages_before.is_empty() {
        bail!(
            "{INSN_PAGE_SYM} is already in kallsyms at {pages_before:x?}: an earlier probe allocated the instruction page, so a sweep could not reach its allocation"
        );
    }
    let site = ftrace_site(pmu, &func)?;
    // Warm the call path unarmed with a function that does not exist.
    let nowhere = CString::new("kloop_no_such_function").expect("no NUL");
    let _ = perf_event_open(&kprobe_attr(pmu, &nowhere, 0), -1, 0);
    let fail_nth = FailNth::open()?;
    let mut refused = Vec::new();
    for offset in (site + FTRACE_CALL_LEN)..(site + FTRACE_CALL_LEN + MAX_SLOT_OFFSETS) {
        let attr = kprobe_attr(pmu, &func, offset);
        let what = format!("kprobe {function}+{offset:#x} (perf_event_open)");
        let summary = sweep(max_attempts, |n| {
            // Closing the event unregisters the probe at once; the slot
            // is only marked dirty, the page stays.
            attempt_fd(
                context,
                &fail_nth,
                n,
                || perf_event_open(&attr, -1, 0),
                || Ok(()),
            )
        })
        .with_context(|| format!("sweeping {what}"))?;
        match summary.last_errno {
            None => {}
            // Inside an instruction, or an instruction kprobes refuse: no
            // slot was taken (the checks come before prepare_kprobe).
            Some(e @ (libc::EILSEQ | libc::EINVAL)) => {
                refused.push(format!(
                    "{offset:#x} ({}, after {} attempts)",
                    errno_label(e),
                    summary.attempts
                ));
                continue;
            }
            Some(e) => bail!(
                "{what}: the attempt without an injected fault (attempt {}) failed with {}",
                summary.attempts,
                errno_label(e)
            ),
        }
        let pages_after = insn_pages()?;
        if pages_after.is_empty() {
            bail!("{what} succeeded but no {INSN_PAGE_SYM} is in kallsyms: the probe took no out-of-line slot");
        }
        context.records_bytes += perf::drain_all(&mut context.rings)?;
        let detail = format!(
            "ftrace site at {function}+{site:#x}; {INSN_PAGE_SYM} absent before the sweep, at {pages_after:x?} after it{}",
            if refused.is_empty() {
                String::new()
            } else {
                format!("; offsets refused first: {}", refused.join(", "))
            }
        );
        return Ok((what, summary, detail));
    }
    bail!("no offset past the ftrace site of {function} ({site:#x} + {FTRACE_CALL_LEN}..) took a kprobe: {refused:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injected(errno: Option<i32>) -> Attempt {
        Attempt {
            injected: true,
            errno,
        }
    }

    #[test]
    fn the_sweep_stops_at_the_first_attempt_without_an_injected_fault() {
        let script = [
            injected(Some(libc::ENOMEM)),
            injected(None),
            injected(Some(libc::ENOMEM)),
            injected(Some(libc::EINVAL)),
            Attempt {
                injected: false,
                errno: None,
            },
            injected(Some(libc::ENOMEM)),
        ];
        let mut seen = Vec::new();
        let s = sweep(200, |n| {
            seen.push(n);
            Ok(script[n as usize - 1])
        })
        .unwrap();
        assert_eq!(seen, vec![1, 2, 3, 4, 5]);
        assert_eq!(s.attempts, 5);
        assert_eq!(s.failed, 3, "the success despite a fault is not a failure");
        assert_eq!(
            s.errnos.into_iter().collect::<Vec<_>>(),
            vec![("EINVAL".to_string(), 1), ("ENOMEM".to_string(), 2)]
        );
        assert_eq!(s.last_errno, None);
        assert_eq!(s.succeeded, 1);
    }

    #[test]
    fn the_last_attempts_error_is_left_to_the_caller() {
        let s = sweep(200, |n| {
            Ok(Attempt {
                injected: n < 2,
                errno: Some(libc::EILSEQ),
            })
        })
        .unwrap();
        assert_eq!((s.attempts, s.last_errno), (2, Some(libc::EILSEQ)));
    }

    #[test]
    fn a_sweep_past_its_cap_is_an_error() {
        let e = sweep(3, |_| Ok(injected(Some(libc::ENOMEM)))).unwrap_err();
        assert!(e.to_string().contains("3 attempts"), "{e}");
        let e = sweep(3, |n| {
            if n == 2 {
                bail!("boom")
            } else {
                Ok(injected(None))
            }
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("attempt 2: boom"), "{e:#}");
    }

    #[test]
    fn fail_nth_reads_back_a_count() {
        assert_eq!(parse_left(b"0\n"), Some(0));
        assert_eq!(parse_left(b"17\n"), Some(17));
        assert_eq!(parse_left(b""), None);
        assert_eq!(parse_left(b"x"), None);
    }
}
