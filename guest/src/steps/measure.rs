//! The `measure` step: times the kernel path that emits KSYMBOL / BPF_EVENT.
//!
//! What is timed. Load: aya's `load()` on an object parsed once before the
//! loop, so each iteration is one `BPF_PROG_LOAD` (verifier, JIT, kallsyms
//! insertion, one KSYMBOL per JITed function and a BPF_EVENT PROG_LOAD to
//! every listener on the CPU) plus aya's few microseconds of user space
//! (filling `bpf_attr`, cloning func/line info). A raw `bpf()` call would
//! shave that off, but aya 0.14 keeps the relocated instructions private
//! (`ProgramData::obj` is `pub(crate)`), and the kernel's `xlated_prog_insns`
//! are post-verifier rewrites that cannot be loaded again; so the aya call it
//! is, and its user-space share is constant per program and kernel.
//! Unload: aya's `unload()`, which drops the only program fd: `close()` runs
//! the file release before returning to user space, so the last reference
//! goes, and the kernel emits PROG_UNLOAD and one KSYMBOL unregister per
//! function and unlinks the symbols synchronously; only the memory is freed
//! later, through RCU and a workqueue. Each iteration is followed by an
//! untimed pause so that deferred freeing lands between windows, not in them.
//!
//! Both windows are `CLOCK_MONOTONIC` around the call, on a thread pinned to
//! the first online CPU. Under QEMU `-icount shift=0,sleep=off` that clock
//! counts guest instructions (1 ns each) and idle time costs nothing.
//!
//! The step's own listeners (`listeners_per_cpu` dummy events with
//! `ksymbol`, `bpf_event`, `sample_id_all` and the TID|TIME|CPU sample type
//! every scenario's recording listeners use, on every online CPU) are
//! emptied between iterations without being read, and closed at the end.

use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kloop_protocol::{ListenerSpec, Message};

use crate::channel::send;
use crate::fixtures::{fixture_program, load_program, parse_fixture, unload_program};
use crate::sys::{self, OsContext};
use crate::{bpf, perf};

/// `PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU`, the sample type of
/// the recording listeners in every scenario (`sample = ["tid", "time", "cpu"]`).
const SAMPLE_TID_TIME_CPU: u64 = (1 << 1) | (1 << 2) | (1 << 7);

/// The dummy listeners' attr. One iteration of a 32-function program writes
/// 66 records of 88 bytes (KSYMBOL) and 48 (BPF_EVENT) into each listener of
/// the CPU, 5.7 KiB; but kernels that do not restore `header.size` after
/// `perf_event_header__init_id` in the KSYMBOL/BPF_EVENT output grow each
/// record by the id header (24 bytes) for every listener before it on the
/// CPU: 256-byte KSYMBOLs in the first of 8. 16 pages (64 KiB) keep even
/// that below half a ring.
const LISTENER: ListenerSpec = ListenerSpec {
    sample_type: SAMPLE_TID_TIME_CPU,
    ksymbol: true,
    bpf_event: true,
    ring_pages: 16,
    scope: kloop_protocol::ListenerScope::CpuWide,
    inherit: false,
    cpus: None,
    side_band: Vec::new(),
    disabled: false,
    backward: false,
    poll: false,
    poll_watermark: 0,
    sample_id_all: true,
};

/// Untimed pause after each iteration: long enough (5 ticks at HZ=250) for
/// the RCU grace period and the workqueue that free the previous program.
const SETTLE: Duration = Duration::from_millis(20);

/// Runs one `measure` step and sends its `Timings`.
pub fn run(
    fixture: &str,
    program: &str,
    listeners_per_cpu: u32,
    iterations: u32,
    warmup: u32,
) -> Result<()> {
    let cpus = sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?;
    let home = *cpus.first().ok_or_else(|| anyhow!("no online CPU"))?;
    let saved = pin_to(home)?;
    let result = measure(
        fixture,
        program,
        listeners_per_cpu,
        iterations,
        warmup,
        &cpus,
    );
    restore_affinity(&saved)?;
    let timings = result?;
    send(&timings)
}

fn measure(
    fixture: &str,
    program: &str,
    listeners_per_cpu: u32,
    iterations: u32,
    warmup: u32,
    cpus: &[u32],
) -> Result<Message> {
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    let what = format!("{fixture}/{program}");

    // One untimed load before any listener: how many functions the JIT made.
    load_program(prog).with_context(|| format!("loading {what}"))?;
    let info =
        bpf::prog_info(prog.fd()?.as_fd()).with_context(|| format!("bpf_prog_info of {what}"))?;
    let functions = info.info.nr_jited_ksyms;
    unload_program(prog).with_context(|| format!("unloading {what}"))?;

    let mut rings = Vec::new();
    for &cpu in cpus {
        for _ in 0..listeners_per_cpu {
            let index = rings.len() as u32;
            rings.push(perf::Ring::open(index, cpu, &LISTENER)?);
        }
    }
    let mut load_ns = Vec::with_capacity(iterations as usize);
    let mut unload_ns = Vec::with_capacity(iterations as usize);
    let mut bytes_first = None;
    for i in 0..warmup + iterations {
        let t0 = sys::monotonic_ns();
        load_program(prog).with_context(|| format!("loading {what}, iteration {i}"))?;
        let t1 = sys::monotonic_ns();
        unload_program(prog).with_context(|| format!("unloading {what}, iteration {i}"))?;
        let t2 = sys::monotonic_ns();
        if i >= warmup {
            load_ns.push(t1 - t0);
            unload_ns.push(t2 - t1);
        }
        let written = discard(&rings).with_context(|| format!("iteration {i}"))?;
        if bytes_first.is_none() {
            bytes_first = Some(written);
        }
        std::thread::sleep(SETTLE);
    }
    drop(rings);

    let per_ring = bytes_first.unwrap_or_default();
    send(&Message::Log {
        text: format!(
            "measure {what}: {functions} function(s), {listeners_per_cpu} listener(s) per CPU on \
             {} CPU(s), {warmup} warm-up + {iterations} timed iteration(s) on CPU {}; \
             bytes the first iteration wrote into each listener: {per_ring:?}",
            cpus.len(),
            cpus[0]
        ),
    })?;
    Ok(Message::Timings {
        fixture: fixture.to_owned(),
        program: program.to_owned(),
        functions,
        listeners_per_cpu,
        load_ns,
        unload_ns,
    })
}

/// Empties every ring without reading it; returns the bytes thrown away per ring.
/// A ring more than half full may have dropped records (and would then time
/// a different path), so that is an error: the rings are too small.
fn discard(rings: &[perf::Ring]) -> Result<Vec<u64>> {
    let mut sizes = Vec::with_capacity(rings.len());
    for ring in rings {
        let (bytes, head) = ring.unread()?;
        if bytes.len() as u64 > ring.ring_bytes() / 2 {
            bail!(
                "measure: one iteration wrote {} bytes into listener ring of cpu {} ({} bytes): \
                 too close to overflowing; the measure listeners need bigger rings",
                bytes.len(),
                ring.cpu,
                ring.ring_bytes()
            );
        }
        sizes.push(bytes.len() as u64);
        ring.commit(head);
    }
    Ok(sizes)
}

type CpuSet = libc::cpu_set_t;

/// Pins the calling thread to `cpu`; returns the previous mask.
fn pin_to(cpu: u32) -> Result<CpuSet> {
    // SAFETY: cpu_set_t is plain data; the libc macros index inside it.
    unsafe {
        let mut saved: CpuSet = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<CpuSet>(), &mut saved) != 0 {
            return Err(sys::last_os_error()).os_ctx("sched_getaffinity");
        }
        let mut one: CpuSet = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<CpuSet>(), &one) != 0 {
            return Err(sys::last_os_error()).os_ctx(format!("sched_setaffinity(cpu {cpu})"));
        }
        Ok(saved)
    }
}

fn restore_affinity(saved: &CpuSet) -> Result<()> {
    // SAFETY: a mask sched_getaffinity filled.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<CpuSet>(), saved) } != 0 {
        return Err(sys::last_os_error()).os_ctx("restoring the CPU affinity");
    }
    Ok(())
}
