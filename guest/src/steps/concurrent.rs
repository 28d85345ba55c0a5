//! The `concurrent` step: one loader thread pinned to each online CPU, all
//! loading and unloading at once.
//!
//! Side-band records go to the listeners of the CPU where the kernel emits
//! them, so a CPU-wide recorder has to merge its rings. Here every CPU
//! emits at the same time: each thread is pinned with `sched_setaffinity`
//! and checks with `sched_getcpu` before and after every load that it
//! really ran there, so the host can demand that a load's records are in
//! that CPU's ring. The threads start together behind a barrier; each
//! parses its own copy of the object, and reports the ids it loaded (each
//! unloaded right after its load) as one `Loads` message.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kloop_protocol::{ListenerScope, ListenerSpec, Message};

use crate::bpf;
use crate::channel::send;
use crate::fixtures::{fixture_program, load_program, parse_fixture, unload_program};
use crate::sys::{self, pin_to, OsContext};

/// Runs `cycles` load/unload cycles of `fixture`/`program` on every online
/// CPU at once and sends each loader's `Loads`; with `churn`, opens and
/// closes that many side-band events per CPU meanwhile.
pub fn run(fixture: &str, program: &str, cycles: u32, churn: u32) -> Result<()> {
    let cpus = sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?;
    let barrier = Barrier::new(cpus.len());
    let running = AtomicUsize::new(cpus.len());
    let mut churned = Ok(0u64);
    let results: Vec<Result<Message>> = std::thread::scope(|s| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let (barrier, running) = (&barrier, &running);
                std::thread::Builder::new()
                    .name(format!("loader-cpu{cpu}"))
                    .spawn_scoped(s, move || {
                        let r = loader(cpu, fixture, program, cycles, barrier);
                        running.fetch_sub(1, Ordering::SeqCst);
                        r
                    })
            })
            .collect();
        if churn > 0 {
            churned = churn_until_done(&cpus, churn, &running);
        }
        handles
            .into_iter()
            .zip(&cpus)
            .map(|(h, cpu)| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("loader thread for CPU {cpu} panicked"))),
                Err(e) => Err(anyhow!("spawning the loader thread for CPU {cpu}: {e}")),
            })
            .collect()
    });
    let messages: Vec<Message> = results.into_iter().collect::<Result<_>>()?;
    let rounds = churned?;
    if churn > 0 {
        crate::channel::log(format!(
            "concurrent: {rounds} rounds of opening and closing {churn} side-band event(s) per CPU \
             while the loaders ran"
        ))?;
    }
    for m in &messages {
        if let Message::Loads { tid: Some(tid), .. } = m {
            wait_gone(*tid)?;
        }
    }
    for m in &messages {
        send(m)?;
    }
    Ok(())
}

/// Opens `churn` CPU-wide ksymbol + bpf_event events (no ring) on each of
/// `cpus` and closes them, round after round, until no loader is
/// `running`; returns the rounds made.
fn churn_until_done(cpus: &[u32], churn: u32, running: &AtomicUsize) -> Result<u64> {
    let spec = ListenerSpec {
        sample_type: 0,
        ksymbol: true,
        bpf_event: true,
        ring_pages: 0,
        scope: ListenerScope::CpuWide,
        inherit: false,
        cpus: None,
        side_band: Vec::new(),
        disabled: false,
        sample_id_all: true,
        backward: false,
        poll: false,
        poll_watermark: 0,
    };
    let mut rounds = 0;
    while running.load(Ordering::SeqCst) > 0 {
        let mut open = Vec::with_capacity(cpus.len() * churn as usize);
        for &cpu in cpus {
            for _ in 0..churn {
                open.push(crate::perf::open_side_band(-1, cpu as i32, &spec)?.0);
            }
        }
        drop(open);
        rounds += 1;
    }
    Ok(rounds)
}

/// How long a joined thread may take to leave /proc/self/task.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// Waits until thread `tid` is gone from /proc/self/task. A join returns
/// once the thread has cleared its tid word (exit_mm() -> mm_release(),
/// early in do_exit()), before perf_event_exit_task() emits its EXIT; the
/// /proc entry goes only in release_task(), after it. Waiting for that lets
/// the host hold every listener set to the thread's EXIT.
fn wait_gone(tid: u32) -> Result<()> {
    let path = format!("/proc/self/task/{tid}");
    let start = Instant::now();
    while Path::new(&path).exists() {
        if start.elapsed() > GONE_WITHIN {
            bail!(
                "loader thread {tid} was joined but is still in /proc/self/task after {:?}",
                GONE_WITHIN
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// One pinned loader. A thread that fails before the barrier would leave
/// the others waiting forever, so errors before it are carried past it.
fn loader(
    cpu: u32,
    fixture: &str,
    program: &str,
    cycles: u32,
    barrier: &Barrier,
) -> Result<Message> {
    let prepared = pin_to(cpu).and_then(|_| parse_fixture(fixture));
    barrier.wait();
    let mut ebpf = prepared?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    let what = format!("{fixture}/{program} on CPU {cpu}");
    let mut ids = Vec::with_capacity(cycles as usize);
    let mut functions = None;
    for i in 0..cycles {
        let before = current_cpu()?;
        load_program(prog).with_context(|| format!("loading {what}, cycle {i}"))?;
        let after = current_cpu()?;
        if before != cpu || after != cpu {
            bail!(
                "loader pinned to CPU {cpu} ran on CPU {before} before and CPU {after} after \
                 its load in cycle {i}: the affinity did not hold"
            );
        }
        let info = bpf::prog_info(prog.fd()?.as_fd())
            .with_context(|| format!("bpf_prog_info of {what}, cycle {i}"))?;
        ids.push(info.info.id);
        let n = info.info.nr_jited_ksyms;
        if *functions.get_or_insert(n) != n {
            bail!("{what}: {n} JITed functions in cycle {i}, {functions:?} before");
        }
        unload_program(prog).with_context(|| format!("unloading {what}, cycle {i}"))?;
    }
    Ok(Message::Loads {
        cpu,
        fixture: fixture.to_owned(),
        program: program.to_owned(),
        functions: functions.unwrap_or(0),
        ids,
        tid: Some(sys::gettid()),
    })
}

fn current_cpu() -> Result<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu)
        .map_err(|_| sys::last_os_error())
        .os_ctx("sched_getcpu")
}
