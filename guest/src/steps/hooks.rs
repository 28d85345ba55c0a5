//! Hooking programs into the kernel: `attach`, `detach`, `load-object`
//! (load and attach every program of an object by its section names), and
//! the steps around hooks: `trigger` (run the hooked code paths) and
//! `read-counter` (read what the hooked programs counted).
//!
//! Programs are loaded and attached with aya. An `attach` takes the link out
//! of aya (`take_link`) and keeps it in [`StepContext::links`], so the link —
//! and with it the kernel's reference on the program — outlives an `unload`
//! of the program until the plan's `detach`.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::Array;
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{KProbe, PerfEvent, ProbeKind, Program, TracePoint, Xdp};
use kloop_protocol::{AttachTarget, Message, XdpMode};

use crate::channel::{log, send};
use crate::context::{loaded_entry, HeldLink, Loaded, StepContext};
use crate::fixtures::{self, fixture_program, load_program, parse_fixture};
use crate::kallsyms;
use crate::perf::{event_attr, perf_event_open};
use crate::steps::load::report_prog;
use crate::sys::{self, OsContext};

const KPROBE_LIST: &str = "/sys/kernel/debug/kprobes/list";

/// Offsets past a function's entry the `after_entry` search tries: the
/// ftrace call site (5 bytes, 9 with an ENDBR in front) and the first few
/// instructions after it fit well within this.
const MAX_AFTER_ENTRY: u64 = 64;

/// The furthest a function's ftrace call site lies past its entry on
/// x86-64: after an ENDBR64 (4 bytes) when the kernel is built with IBT.
const LAST_FTRACE_SITE: u64 = 4;

/// Attaches the program loaded as `label` to `target` and holds the link
/// as `link` until `detach`.
pub fn attach(
    context: &mut StepContext,
    label: &str,
    link: &str,
    target: &AttachTarget,
) -> Result<()> {
    if context.links.contains_key(link) {
        bail!("link {link:?} is already held");
    }
    let prog = context
        .loaded_mut(label)?
        .program_mut()
        .with_context(|| format!("label {label:?}"))?;
    let (held, detail) = attach_program(prog, target)
        .with_context(|| format!("attaching {label:?} to {target:?}"))?;
    context.links.insert(
        link.to_owned(),
        HeldLink {
            label: label.to_owned(),
            _link: held,
        },
    );
    send(&Message::Attached {
        label: label.to_owned(),
        link: link.to_owned(),
        detail,
    })
}

/// `kprobe-fill`'s candidates: the kernel's text symbols starting with
/// `prefix` whose name is unique, and how many `page` symbols there are
/// now, from one read of /proc/kallsyms.
fn fill_candidates(prefix: &str, page: &str) -> Result<(Vec<String>, usize)> {
    // Names seen more than once are local functions of several files: a
    // probe by name would be ambiguous.
    let mut seen: HashMap<String, u32> = HashMap::new();
    // One read for the candidates and the pages there are now.
    let mut at_start = 0;
    let text = kallsyms::read_all(|e| {
        if e.name == page {
            at_start += 1;
        }
        e.module.is_none() && matches!(e.kind, 't' | 'T') && e.name.starts_with(prefix)
    })?;
    for e in &text {
        *seen.entry(e.name.clone()).or_default() += 1;
    }
    let candidates = text
        .iter()
        .filter(|e| seen[&e.name] == 1)
        .map(|e| e.name.clone())
        .collect();
    Ok((candidates, at_start))
}

/// Refuses `kprobe-fill` probes (`placed`, as `function+offset`) that the
/// kprobes list shows on ftrace, which needs no instruction slot.
fn refuse_on_ftrace(placed: &[String]) -> Result<()> {
    let list = std::fs::read_to_string(KPROBE_LIST).unwrap_or_default();
    let on_ftrace = list
        .lines()
        .filter(|l| l.contains("[FTRACE]"))
        .filter(|l| kprobe_line_place(l).is_some_and(|p| placed.contains(&p)))
        .count();
    if on_ftrace > 0 {
        bail!(
            "kprobe-fill: {on_ftrace} of its probes are on ftrace, which needs no instruction \
             slot: {KPROBE_LIST}:\n{list}"
        );
    }
    Ok(())
}

/// `kprobe-fill`: see [`kloop_protocol::Step::KprobeFill`].
pub fn kprobe_fill(
    context: &mut StepContext,
    label: &str,
    link: &str,
    prefix: &str,
    optinsn_pages: u32,
    max_probes: u32,
) -> Result<()> {
    const PAGE: &str = "kprobe_optinsn_page";
    if context.links.contains_key(link) {
        bail!("link {link:?} is already held");
    }
    let pages = || -> Result<usize> { Ok(kallsyms::read_filtered(|e| e.name == PAGE)?.len()) };
    let (candidates, at_start) = fill_candidates(prefix, PAGE)?;
    let StepContext {
        loaded,
        ksymbol_watch,
        ..
    } = context;
    let p: &mut KProbe = match loaded_entry(loaded, label)?.program_mut()? {
        Program::KProbe(p) if matches!(p.kind(), ProbeKind::Entry) => p,
        _ => bail!("kprobe-fill needs a loaded kprobe program, and {label:?} is not one"),
    };
    let mut held: Vec<KprobeEvent> = Vec::new();
    let mut skipped = 0usize;
    // With the ksymbol watch attached, each new page's register is in its
    // ring, which costs nothing to read; /proc/kallsyms costs 0.2-0.4 s a
    // read under TCG, once per probe otherwise.
    let watch_from = match ksymbol_watch {
        Some(w) => {
            w.collect()?;
            Some(w.observations.len())
        }
        None => None,
    };
    let mut count = || -> Result<usize> {
        match (ksymbol_watch.as_mut(), watch_from) {
            (Some(w), Some(from)) => {
                w.collect()?;
                Ok((at_start as i64 + w.net_registered(from, PAGE)).max(0) as usize)
            }
            _ => pages(),
        }
    };
    let mut now = at_start;
    // Functions of one prefix share a prologue, so the offset that took a
    // probe in one is tried first in the next: scanning from 1 would open
    // (and close again) a probe on each function's ftrace call site, and
    // every close waits out grace periods (0.1 s under TCG).
    let mut hint = None;
    let mut placed = Vec::new();
    for function in &candidates {
        if now >= optinsn_pages as usize || held.len() >= max_probes as usize {
            break;
        }
        match probe_past_entry(p, function, 1, hint) {
            Ok(found) => {
                hint = Some(found.offset);
                placed.push(format!("{function}+{:#x}", found.offset));
                held.push(found.event);
                now = count()?;
            }
            Err(_) => skipped += 1,
        }
    }
    if now < optinsn_pages as usize {
        bail!(
            "kprobe-fill: {} probes past the entry of {prefix}* functions ({skipped} skipped, {} \
             candidates) made {now} {PAGE} symbol(s), not {optinsn_pages}",
            held.len(),
            candidates.len()
        );
    }
    // The count the loop stopped on, checked once against kallsyms.
    let listed = pages()?;
    if listed != now {
        bail!("kprobe-fill: the ksymbol watch counted {now} {PAGE} symbol(s), /proc/kallsyms lists {listed}");
    }
    // And the probes placed without asking the kprobes list, once.
    refuse_on_ftrace(&placed)?;
    let detail = format!(
        "{} kprobes past the entry of {prefix}* functions ({skipped} skipped): {now} {PAGE}",
        held.len()
    );
    context.links.insert(
        link.to_owned(),
        HeldLink {
            label: label.to_owned(),
            _link: Box::new(ClosedInParallel(held)),
        },
    );
    send(&Message::Attached {
        label: label.to_owned(),
        link: link.to_owned(),
        detail,
    })
}

/// Kprobe events that are closed from several threads at once when
/// dropped. Closing a kprobe perf event unregisters its probe, which waits
/// for RCU grace periods (`unregister_kprobe`); waits begun together share
/// their grace periods, so the fill's 40-odd probes go in a fraction of
/// the time of one close after another. What the kernel emits does not
/// depend on the order: the optinsn slots are collected only when the last
/// of them is freed (`nr_garbage > slots_per_page`).
struct ClosedInParallel(Vec<KprobeEvent>);

impl Drop for ClosedInParallel {
    fn drop(&mut self) {
        const THREADS: usize = 8;
        let mut events = std::mem::take(&mut self.0);
        // Without futexes a join would kill the agent: one after another.
        if !crate::steps::probes::threads_work() {
            return;
        }
        let per_thread = events.len().div_ceil(THREADS).max(1);
        std::thread::scope(|scope| {
            while !events.is_empty() {
                let chunk = events.split_off(events.len().saturating_sub(per_thread));
                // Each close's final release runs on the closing thread's
                // way back to user space, so the thread does the waiting.
                scope.spawn(move || drop(chunk));
            }
        });
    }
}

/// Drops the link held as `link`, which detaches it.
pub fn detach(context: &mut StepContext, link: &str) -> Result<()> {
    let held = context
        .links
        .remove(link)
        .ok_or_else(|| anyhow!("detach of link {link:?}, which is not held"))?;
    log(format!(
        "detaching link {link:?} of program {:?}",
        held.label
    ))?;
    drop(held);
    Ok(())
}

fn wrong_type(prog: &Program, target: &AttachTarget) -> anyhow::Error {
    anyhow!(
        "a {:?} program cannot attach to {target:?}",
        prog.prog_type()
    )
}

/// Attaches and takes the link out of aya; returns it with a description
/// of where it went.
fn attach_program(prog: &mut Program, target: &AttachTarget) -> Result<(Box<dyn Any>, String)> {
    Ok(match target {
        AttachTarget::Kprobe {
            function,
            offset,
            after_entry,
            clones,
        } => return attach_kprobe(prog, target, function, *offset, *after_entry, *clones),
        AttachTarget::Kretprobe { function } => {
            let p: &mut KProbe = match prog {
                Program::KProbe(p) if matches!(p.kind(), ProbeKind::Return) => p,
                other => return Err(wrong_type(other, target)),
            };
            let event = KprobeEvent::open(p, function, 0, true)?;
            (Box::new(event), format!("kretprobe {function}"))
        }
        AttachTarget::Tracepoint { category, name } => {
            let p: &mut TracePoint = match prog {
                Program::TracePoint(p) => p,
                other => return Err(wrong_type(other, target)),
            };
            let id = p.attach(category, name)?;
            (
                Box::new(p.take_link(id)?),
                format!("tracepoint {category}/{name}"),
            )
        }
        AttachTarget::Btf => match prog {
            Program::FEntry(p) => {
                let id = p.attach()?;
                (Box::new(p.take_link(id)?), "fentry".to_owned())
            }
            Program::FExit(p) => {
                let id = p.attach()?;
                (Box::new(p.take_link(id)?), "fexit".to_owned())
            }
            Program::Lsm(p) => {
                let id = p.attach()?;
                (Box::new(p.take_link(id)?), "lsm".to_owned())
            }
            other => return Err(wrong_type(other, target)),
        },
        AttachTarget::Xdp { interface, mode } => {
            let p: &mut Xdp = match prog {
                Program::Xdp(p) => p,
                other => return Err(wrong_type(other, target)),
            };
            let aya_mode = match mode {
                XdpMode::Native => aya::programs::XdpMode::Driver,
                XdpMode::Generic => aya::programs::XdpMode::Skb,
            };
            let id = p.attach(interface, aya_mode)?;
            (
                Box::new(p.take_link(id)?),
                format!("xdp {interface} {mode:?}"),
            )
        }
        AttachTarget::PerfEventCpuClock { cpu, sample_period } => {
            let p: &mut PerfEvent = match prog {
                Program::PerfEvent(p) => p,
                other => return Err(wrong_type(other, target)),
            };
            let id = p.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu: *cpu },
                SamplePolicy::Period(*sample_period),
                false,
            )?;
            (
                Box::new(p.take_link(id)?),
                format!("perf-event cpu-clock cpu {cpu} period {sample_period}"),
            )
        }
    })
}

/// [`attach_program`] to a kprobe target: at `function+offset` (of the one
/// clone of `function` with `clones`), or past its entry with `after_entry`.
fn attach_kprobe(
    prog: &mut Program,
    target: &AttachTarget,
    function: &str,
    offset: u64,
    after_entry: bool,
    clones: bool,
) -> Result<(Box<dyn Any>, String)> {
    let p: &mut KProbe = match prog {
        Program::KProbe(p) if matches!(p.kind(), ProbeKind::Entry) => p,
        other => return Err(wrong_type(other, target)),
    };
    let resolved;
    let function: &str = if clones {
        resolved = crate::kallsyms::resolve_clone(function)?;
        &resolved
    } else {
        function
    };
    if after_entry {
        return kprobe_after_entry(p, function, offset);
    }
    let event = KprobeEvent::open(p, function, offset, false)?;
    let place = format!("{function}+{offset:#x}");
    let detail = format!("kprobe {place}{}", kprobe_flags(function, offset));
    Ok((Box::new(event), detail))
}

/// The errno somewhere in an error's source chain.
fn errno_of(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        cur = e.source();
    }
    None
}

/// The flags column of our probe's line in the kprobes list
/// (`[FTRACE]`, `[OPTIMIZED]`, `[DISABLED]`...), empty if none. A probe at
/// offset 0 may be listed at +0x4: the kernel moves it past an ENDBR.
fn kprobe_flags(function: &str, offset: u64) -> String {
    let Ok(list) = std::fs::read_to_string(KPROBE_LIST) else {
        return String::new();
    };
    let at = |o: u64| {
        list.lines()
            .find(|l| kprobe_line_place(l).as_deref() == Some(&format!("{function}+{o:#x}")))
    };
    let line = at(offset).or_else(|| if offset == 0 { at(4) } else { None });
    line.map(|l| {
        let flags: Vec<&str> = l
            .split_whitespace()
            .filter(|w| w.starts_with('['))
            .collect();
        if flags.is_empty() {
            String::new()
        } else {
            format!(" {}", flags.join(" "))
        }
    })
    .unwrap_or_default()
}

/// `function+0xoff` of a kprobes list line (`addr  k  function+0xoff  [FLAGS]`).
fn kprobe_line_place(line: &str) -> Option<String> {
    let sym = line.split_whitespace().nth(2)?;
    let (func, off) = sym.split_once('+')?;
    let off = u64::from_str_radix(off.strip_prefix("0x")?, 16).ok()?;
    Some(format!("{func}+{off:#x}"))
}

/// A kprobe past the function's entry: offsets from `start` (at least 1)
/// up until the kernel accepts one that is not served by ftrace. Offsets
/// inside an instruction are refused (EILSEQ); the ftrace call site is
/// accepted but becomes a kprobe-on-ftrace, which needs no instruction slot,
/// so that one is detached again and the search goes on.
fn kprobe_after_entry(
    p: &mut KProbe,
    function: &str,
    start: u64,
) -> Result<(Box<dyn Any>, String)> {
    let found = probe_past_entry(p, function, start, None)?;
    Ok((
        Box::new(found.event),
        format!("kprobe {function}+{:#x}{}", found.offset, found.flags),
    ))
}

/// A kprobe the kernel placed past a function's entry, off ftrace.
struct PastEntry {
    event: KprobeEvent,
    offset: u64,
    /// Its flags in the kprobes list, as [`kprobe_flags`] gives them.
    flags: String,
}

/// [`kprobe_after_entry`]'s search, trying `hint` first: when the kernel
/// takes a probe there off ftrace, no other offset is opened.
fn probe_past_entry(
    p: &mut KProbe,
    function: &str,
    start: u64,
    hint: Option<u64>,
) -> Result<PastEntry> {
    if let Some(offset) = hint.filter(|o| *o >= start.max(1)) {
        if let Ok(event) = KprobeEvent::open(p, function, offset, false) {
            // With -mfentry the ftrace call is a function's first
            // instruction, or its second after a 4-byte ENDBR64: a probe
            // past offset 4 that the kernel took is never on it, and the
            // kprobes list (0.01-0.05 s a read under TCG, growing with
            // every probe) need not be asked.
            let flags = if offset > LAST_FTRACE_SITE {
                String::new()
            } else {
                kprobe_flags(function, offset)
            };
            if !flags.contains("FTRACE") {
                return Ok(PastEntry {
                    event,
                    offset,
                    flags,
                });
            }
        }
    }
    let mut refused = Vec::new();
    let entry = crate::arm64_insn::entry(function)?;
    for offset in start.max(1)..=MAX_AFTER_ENTRY {
        if let Some(entry) = entry {
            if let Some(why) = crate::arm64_insn::no_slot(entry, offset)? {
                refused.push(format!("{offset:#x} ({why})"));
                continue;
            }
        }
        match KprobeEvent::open(p, function, offset, false) {
            Ok(event) => {
                let flags = kprobe_flags(function, offset);
                if flags.contains("FTRACE") {
                    refused.push(format!("{offset:#x} (on ftrace)"));
                    drop(event);
                    continue;
                }
                log(format!(
                    "kprobe past the entry of {function}: offsets refused before {offset:#x}: {}",
                    refused.join(", ")
                ))?;
                return Ok(PastEntry {
                    event,
                    offset,
                    flags,
                });
            }
            Err(e) => match errno_of(e.root_cause()) {
                // EILSEQ is the answer for an
                // offset inside an instruction.
                Some(libc::EILSEQ) => refused.push(format!("{offset:#x} (EILSEQ)")),
                Some(libc::EINVAL) => refused.push(format!("{offset:#x} (EINVAL)")),
                _ => {
                    return Err(e).with_context(|| {
                        format!("kprobe at {function}+{offset:#x} (refused before: {refused:?})")
                    })
                }
            },
        }
    }
    bail!("no offset in 1..={MAX_AFTER_ENTRY} past the entry of {function} took a kprobe off ftrace: {refused:?}")
}

/// A kprobe (or kretprobe) perf event of the kprobe PMU with a BPF program
/// attached; closing it unregisters the probe.
///
/// aya 0.14 would do the same, but only when it can parse the kernel's
/// version: it reads Debian's from `uname -v`, cannot parse `7.3~rc7`, and
/// then falls back to `kprobe_events` in tracefs, whose events it fails to
/// remove again (seen on the 7.3 pin: [DISABLED] probes left in the kprobes
/// list). The kprobe PMU (4.17+) is what every pinned kernel has.
/// A kprobe event at `function + offset` running the loaded entry program
/// `p`, enabled; dropping it detaches.
pub fn kprobe_event(p: &KProbe, function: &str, offset: u64) -> Result<Box<dyn Any>> {
    Ok(Box::new(KprobeEvent::open(p, function, offset, false)?))
}

struct KprobeEvent {
    _fd: OwnedFd,
}

impl KprobeEvent {
    fn open(p: &KProbe, function: &str, offset: u64, ret: bool) -> Result<KprobeEvent> {
        const PMU: &str = "/sys/bus/event_source/devices/kprobe";
        use aya_obj::generated::{PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF};
        let type_: u32 = sys::read_trimmed(format!("{PMU}/type"))
            .os_ctx(format!("reading {PMU}/type"))?
            .parse()
            .with_context(|| format!("parsing {PMU}/type"))?;
        let mut config = 0u64;
        if ret {
            // `config:<bit>`: which config bit makes it a return probe.
            let format = sys::read_trimmed(format!("{PMU}/format/retprobe"))
                .os_ctx(format!("reading {PMU}/format/retprobe"))?;
            let bit: u32 = format
                .strip_prefix("config:")
                .and_then(|b| b.parse().ok())
                .filter(|b| *b < 64)
                .ok_or_else(|| anyhow!("unexpected {PMU}/format/retprobe {format:?}"))?;
            config |= 1 << bit;
        }
        let func = CString::new(function).context("function name with a NUL")?;
        let mut attr = event_attr(type_, config);
        attr.__bindgen_anon_1.sample_period = 1;
        attr.__bindgen_anon_2.wakeup_events = 1;
        attr.__bindgen_anon_3.kprobe_func = func.as_ptr() as u64;
        attr.__bindgen_anon_4.probe_offset = offset;
        let what = format!(
            "perf_event_open(kprobe PMU, {}{function}+{offset:#x})",
            if ret { "return probe " } else { "" }
        );
        // `func` outlives the call.
        let fd = perf_event_open(&attr, -1, 0)
            .map_err(|e| anyhow::Error::new(e).context(what.clone()))?;
        let prog_fd = p.fd()?.as_fd().as_raw_fd();
        for (req, arg, name) in [
            (
                PERF_EVENT_IOC_SET_BPF as libc::c_ulong,
                prog_fd as libc::c_ulong,
                "PERF_EVENT_IOC_SET_BPF",
            ),
            (
                PERF_EVENT_IOC_ENABLE as libc::c_ulong,
                0,
                "PERF_EVENT_IOC_ENABLE",
            ),
        ] {
            // SAFETY: ioctls on our own perf fd with integer arguments.
            if unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) } < 0 {
                return Err(io::Error::last_os_error()).os_ctx(format!("{name} on {what}"));
            }
        }
        Ok(KprobeEvent { _fd: fd })
    }
}

/// Runs the code paths the fixtures hook: `nanosleeps` raw `nanosleep(0)`
/// syscalls (always `hrtimer_nanosleep` and the `sys_enter_nanosleep`
/// tracepoint, whatever libc does), then `sleep_ms` of idle time.
pub fn trigger(nanosleeps: u32, sleep_ms: u64) {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    for _ in 0..nanosleeps {
        // SAFETY: valid timespec; a null remainder pointer is allowed.
        unsafe {
            libc::syscall(
                libc::SYS_nanosleep,
                &zero as *const libc::timespec,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
    }
    if sleep_ms > 0 {
        std::thread::sleep(Duration::from_millis(sleep_ms));
    }
}

/// Sends `map[key]` of the object loaded as `label` as a `Counter`.
pub fn read_counter(context: &mut StepContext, label: &str, map: &str, key: u32) -> Result<()> {
    // Programs of a `load-object` are labelled `<label>/<program>`; their
    // maps live in the object held under `<label>`.
    let object = if context.loaded.contains_key(label) {
        label
    } else {
        label.split_once('/').map_or(label, |(o, _)| o)
    };
    let entry = context.loaded_mut(object)?;
    let names: Vec<String> = entry.ebpf.maps().map(|(n, _)| n.to_owned()).collect();
    let m = entry
        .ebpf
        .map(map)
        .ok_or_else(|| anyhow!("{label:?} has no map {map:?} (it has {names:?})"))?;
    let array: Array<_, u64> =
        Array::try_from(m).with_context(|| format!("map {map:?} as an array of u64"))?;
    let value = array
        .get(&key, 0)
        .with_context(|| format!("reading {map:?}[{key}]"))?;
    send(&Message::Counter {
        label: label.to_owned(),
        map: map.to_owned(),
        key,
        value,
    })
}

/// The ELF section of every function symbol of a fixture: aya does not
/// keep the part of a section name after the program type.
fn program_sections(bytes: &[u8]) -> Result<HashMap<String, String>> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolSection};
    let file = object::File::parse(bytes).context("parsing the fixture's ELF")?;
    let mut out = HashMap::new();
    for sym in file.symbols() {
        if sym.kind() != SymbolKind::Text {
            continue;
        }
        let SymbolSection::Section(index) = sym.section() else {
            continue;
        };
        let (Ok(name), Ok(section)) = (sym.name(), file.section_by_index(index)) else {
            continue;
        };
        if let Ok(section) = section.name() {
            out.insert(name.to_owned(), section.to_owned());
        }
    }
    Ok(out)
}

/// Where a section name says a program attaches.
fn section_target(section: &str) -> Result<AttachTarget> {
    let mut parts = section.splitn(3, '/');
    Ok(match (parts.next(), parts.next(), parts.next()) {
        (Some("kprobe"), Some(function), None) if !function.is_empty() => AttachTarget::Kprobe {
            function: function.to_owned(),
            offset: 0,
            after_entry: false,
            clones: false,
        },
        (Some("kretprobe"), Some(function), None) if !function.is_empty() => {
            AttachTarget::Kretprobe {
                function: function.to_owned(),
            }
        }
        (Some("tracepoint" | "tp"), Some(category), Some(name)) => AttachTarget::Tracepoint {
            category: category.to_owned(),
            name: name.to_owned(),
        },
        _ => bail!(
            "section {section:?} names no probe point (kprobe/<fn>, kretprobe/<fn>, \
             tracepoint/<category>/<name>)"
        ),
    })
}

/// Loads every program of `fixture` and attaches each where its section
/// says. The links are held with the object, so the `unload` of `label`
/// detaches and unloads them all together.
pub fn load_object(context: &mut StepContext, fixture: &str, label: &str) -> Result<()> {
    if context.loaded.contains_key(label) {
        bail!("label {label:?} is already loaded");
    }
    let sections = program_sections(fixtures::object_bytes(fixture)?)?;
    let mut ebpf = parse_fixture(fixture)?;
    let mut names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_owned()).collect();
    // Section order is the object's order; sort for a stable plan.
    names.sort();
    if names.is_empty() {
        bail!("fixture {fixture:?} has no programs");
    }
    let mut ids = Vec::new();
    let mut held = Vec::new();
    for name in &names {
        let section = sections
            .get(name)
            .ok_or_else(|| anyhow!("no ELF section found for program {name:?} of {fixture:?}"))?;
        let target = section_target(section)?;
        let prog_label = format!("{label}/{name}");
        let prog = fixture_program(&mut ebpf, fixture, name)?;
        load_program(prog)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("loading {fixture}/{name} (section {section:?})"))?;
        let id = report_prog(&prog_label, prog)
            .with_context(|| format!("bpf_prog_info of {fixture}/{name}"))?;
        ids.push((prog_label.clone(), id));
        let (link, detail) = attach_in_place(prog, &target)
            .with_context(|| format!("attaching {prog_label:?} as its section {section:?} says"))?;
        held.push(link);
        send(&Message::Attached {
            label: prog_label,
            link: format!("{label}:{section}"),
            detail,
        })?;
    }
    let (first_label, first_id) = ids.remove(0);
    let first = first_label
        .rsplit_once('/')
        .map(|(_, p)| p.to_owned())
        .unwrap_or_default();
    context.loaded.insert(
        label.to_owned(),
        Loaded {
            ebpf,
            program: first,
            id: first_id,
            others: ids,
            _links: held,
        },
    );
    Ok(())
}

/// Attaches a program of a `load-object`; returns the link (dropping it
/// detaches) and where it went.
fn attach_in_place(prog: &mut Program, target: &AttachTarget) -> Result<(Box<dyn Any>, String)> {
    Ok(match (prog, target) {
        (
            Program::KProbe(p),
            AttachTarget::Kprobe {
                function, offset, ..
            },
        ) if matches!(p.kind(), ProbeKind::Entry) => {
            let event = KprobeEvent::open(p, function, *offset, false)?;
            (Box::new(event), format!("kprobe {function}+{offset:#x}"))
        }
        (Program::KProbe(p), AttachTarget::Kretprobe { function })
            if matches!(p.kind(), ProbeKind::Return) =>
        {
            let event = KprobeEvent::open(p, function, 0, true)?;
            (Box::new(event), format!("kretprobe {function}"))
        }
        (Program::TracePoint(p), AttachTarget::Tracepoint { category, name }) => {
            let id = p.attach(category, name)?;
            (
                Box::new(p.take_link(id)?),
                format!("tracepoint {category}/{name}"),
            )
        }
        (prog, target) => return Err(wrong_type(prog, target)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_name_targets() {
        assert!(matches!(
            section_target("kprobe/hrtimer_nanosleep").unwrap(),
            AttachTarget::Kprobe { function, offset: 0, after_entry: false, .. } if function == "hrtimer_nanosleep"
        ));
        assert!(matches!(
            section_target("kretprobe/f").unwrap(),
            AttachTarget::Kretprobe { function } if function == "f"
        ));
        assert!(matches!(
            section_target("tracepoint/syscalls/sys_enter_nanosleep").unwrap(),
            AttachTarget::Tracepoint { category, name } if category == "syscalls" && name == "sys_enter_nanosleep"
        ));
        assert!(section_target("kprobe").is_err());
        assert!(section_target("socket").is_err());
    }

    #[test]
    fn kprobe_list_lines() {
        assert_eq!(
            kprobe_line_place("ffffffff8110d3a9  k  hrtimer_nanosleep+0x9    [OPTIMIZED]")
                .as_deref(),
            Some("hrtimer_nanosleep+0x9")
        );
        assert_eq!(
            kprobe_line_place("ffffffff8110d3a0  r  hrtimer_nanosleep+0x0    [FTRACE]").as_deref(),
            Some("hrtimer_nanosleep+0x0")
        );
        assert_eq!(kprobe_line_place("garbage"), None);
    }
}
