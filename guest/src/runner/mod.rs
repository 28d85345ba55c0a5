//! The plan runner: hello, facts, probes, warm-up, steps, done.
//!
//! It owns the [`StepContext`] the steps share and hands every step to
//! [`dispatch`]; the steps themselves never call back into the runner.

mod dispatch;
mod warm_up;

use std::time::Instant;

use anyhow::{Context, Result};
use kloop_protocol::{Message, Plan, Step, PLAN_PATH, PROTOCOL_VERSION};

use crate::channel::{self, log, send};
use crate::context::StepContext;
use crate::init;
use crate::steps::{load, probes};
use crate::sys::{self, OsContext};

const SYSCTLS: &[&str] = &[
    "kernel/perf_event_paranoid",
    "kernel/kptr_restrict",
    "net/core/bpf_jit_enable",
    "net/core/bpf_jit_harden",
    "net/core/bpf_jit_kallsyms",
    "kernel/unprivileged_bpf_disabled",
];

/// Runs the whole session on an open data port. `notes` are early-setup
/// remarks and `port_note` the port's line settings, both sent as `Log`s.
///
/// With a plan in the initramfs (a cold boot) the plan's own fixtures are
/// warmed up after the probes. Without one the agent is being booted to be
/// saved: it warms every fixture up, runs the probes that leave no trace
/// and reads the generated symbols (both kept for the restored copies),
/// says [`Message::AwaitingPlan`] and
/// waits for the host's plan; the host saves the VM at that point and
/// every restored copy continues here with its own plan. Either way the
/// host then sees the same session: hello, facts, logs, steps, done.
pub fn run(notes: Vec<String>, port_note: String) -> Result<()> {
    let mut notes = notes;
    notes.insert(0, format!("data port {port_note}"));
    let (plan, saved) = if std::path::Path::new(PLAN_PATH).exists() {
        (read_plan()?, None)
    } else {
        let (mut warm_notes, loaded) = warm_up::warm_up_aya(&warm_up::saved_vm_fixtures())?;
        // Whatever does not depend on the plan is done once, here, and
        // every restored copy starts with it done: the probes, then (last,
        // so that it sees what the probes left) the generated symbols.
        warm_notes.push(probes::probe_before_save());
        let core_names: Vec<&str> = crate::steps::ksymwatch::CACHES
            .iter()
            .chain(&crate::jit_books::CORE_NAMES)
            .copied()
            .collect();
        let (kallsyms, kallsyms_note) = crate::kallsyms::read_before_save(&core_names)
            .context("reading /proc/kallsyms before the save")?;
        warm_notes.push(kallsyms_note);
        crate::jit_books::locate();
        send(&Message::AwaitingPlan {
            monotonic_ns: sys::monotonic_ns(),
            warmed_up: loaded,
        })?;
        // Nothing may be in flight when the host saves the VM.
        channel::drain().os_ctx("draining the data port before the save")?;
        let plan = channel::receive_plan()?;
        notes.push("restored from a saved VM: the plan came over the data port".into());
        notes.extend(warm_notes);
        (plan, Some(kallsyms))
    };
    hello(notes)?;
    run_steps(&plan, saved)
}

/// Writes the plan's module parameters (`/sys/module/<module>/parameters/
/// <name>`), logging each.
fn set_params(plan: &Plan) -> Result<()> {
    for p in &plan.params {
        let path = p.path().ok_or_else(|| {
            anyhow::anyhow!(
                "plan parameter {}/{} is not a parameter's name",
                p.module,
                p.name
            )
        })?;
        std::fs::write(&path, &p.value).os_ctx(format!(
            "writing {} to {path} (a kernel without this parameter cannot run this plan)",
            p.value
        ))?;
        log(format!("set {path} = {}", p.value))?;
    }
    Ok(())
}

/// The session after its hello, for `plan`: heartbeats, the probes, the
/// aya warm-up, every step, done. `saved` is `Some` in a guest restored
/// from a saved VM, which warmed up before the save, holding the generated
/// symbols as they were then.
pub fn run_steps(plan: &Plan, saved: Option<Vec<kloop_protocol::KallsymsEntry>>) -> Result<()> {
    channel::start_heartbeat();

    // Before the probes: a mutant schema's switch decides which code every
    // later step (and probe) runs.
    set_params(plan)?;

    let (unmet, all_from_save) = probes::first_unmet(&plan.requires)?;
    if let Some((requirement, reason)) = unmet {
        send(&Message::Unsupported {
            requirement,
            reason,
        })?;
        return send(&Message::Done { records_bytes: 0 });
    }
    let warmed = saved.is_some();
    let mut context = StepContext {
        // Valid only while the kernel is as it was saved: no probe ran
        // since, and (cleared below) no step.
        kallsyms_at_save: saved.filter(|_| all_from_save),
        ..StepContext::default()
    };
    if !warmed {
        let (warm_notes, _) = warm_up::warm_up_aya(&warm_up::plan_fixtures(plan))?;
        for note in warm_notes {
            log(note)?;
        }
    }

    // Right before the last drain of a plan that snapshotted kallsyms, the
    // generated symbols are read once more (rule `announced`): every
    // register emitted before this read is then in the drained stream.
    let last_drain = plan.steps.iter().rposition(|s| matches!(s, Step::Drain));
    let snapshots = plan
        .steps
        .iter()
        .position(|s| matches!(s, Step::SnapshotKallsyms));
    // The kernel's own checks (a checked kernel's KASAN, lockdep, UBSAN,
    // kmemleak) speak in its log: watched from the first step to the last.
    let kernel_log = crate::kernel_log::Watch::start();
    let jit_books = crate::jit_books::Watch::start();
    let exec_areas = crate::exec_areas::Watch::start();
    for (index, step) in plan.steps.iter().enumerate() {
        let final_read = Some(index) == last_drain && snapshots.is_some_and(|s| s < index);
        let index = index as u32;
        init::set_current_step(Some(index));
        send(&Message::StepStart {
            index,
            what: serde_json::to_string(step).expect("steps serialise"),
        })?;
        let started = Instant::now();
        let kallsyms_before = crate::kallsyms::read_ns();
        let clocks_before = crate::sys::CpuClocks::now();
        // Inside the drain's window, so that every second of the agent
        // phase is some step's (the benchmark's per-step split adds up).
        if final_read {
            send(&Message::FinalKallsyms {
                entries: crate::steps::kallsyms::read_side_band()?,
            })?;
        }
        dispatch::run_step(&mut context, index, step)?;
        sight_after(&context, index, step);
        context.kallsyms_at_save = None;
        // The facts of a run of loads wait for its last load, read from
        // one /proc/kallsyms; a failed load between two loads touches no
        // loaded program and does not end the run.
        if !matches!(
            plan.steps.get(index as usize + 1),
            Some(Step::Load { .. } | Step::FailedLoad)
        ) {
            load::send_pending_facts(&mut context)?;
        }
        send(&Message::StepDone {
            index,
            elapsed_ns: started.elapsed().as_nanos() as u64,
            kallsyms_ns: crate::kallsyms::read_ns() - kallsyms_before,
            cpu: clocks_before
                .zip(crate::sys::CpuClocks::now())
                .map(|(before, after)| before.until(&after)),
        })?;
        init::set_current_step(None);
    }
    crate::steps::listeners::finish_waiters(&mut context)?;
    // Everything the plan made goes (programs, links, listeners, the
    // ksymbol watch) before the books are read again: the kernel is then
    // owed back every charge and chunk (rules jit-charge, jit-chunks), and
    // kmemleak's last scans come after the frees it would otherwise miss.
    let records_bytes = context.records_bytes;
    drop(context);
    let plan_ended = Instant::now();
    let (books, symbols) = jit_books.finish();
    send(&books)?;
    // After the JIT books' settle: the deferred frees they waited for are
    // the executable areas' too.
    send(&exec_areas.finish(symbols, &plan.steps))?;
    send(&kernel_log.finish(plan_ended))?;
    send(&Message::Done { records_bytes })
}

/// What the books read right after step `index`. A trampoline image lives
/// between an attach and the next change of its trampoline: read right
/// after the steps that make one. The executable areas: after every step
/// that may make or free code.
fn sight_after(context: &StepContext, index: u32, step: &Step) {
    if matches!(
        step,
        Step::Attach { .. } | Step::UnprivilegedAttach { .. } | Step::FailNth { .. }
    ) {
        crate::jit_books::sight_images(&context.ring_heads());
    }
    if !reads_only(step) {
        crate::exec_areas::sight(index, &|| context.ring_heads());
    }
}

/// Steps that only read (the rings, files, kallsyms, counters) and make
/// or free no code: the executable areas are read after every other step.
fn reads_only(step: &Step) -> bool {
    matches!(
        step,
        Step::Drain
            | Step::SnapshotKallsyms
            | Step::ReadFile { .. }
            | Step::ReadCounter { .. }
            | Step::Inventory
            | Step::OpenListeners { .. }
            | Step::CloseListeners { .. }
            | Step::ReadKsymbolWatch
    )
}

/// Hello, the kernel's facts and the notes, in that order: the host's
/// first frames of every session. Returns the hello's `monotonic_ns`,
/// which names the session (the host's report to a by-hand run carries it
/// back).
pub fn hello(notes: Vec<String>) -> Result<u64> {
    let (online_cpus, cpu_note) = match sys::online_cpus() {
        Ok(cpus) => (cpus, None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "reading /sys/devices/system/cpu/online: {}",
                sys::Errno(&e)
            )),
        ),
    };
    let monotonic_ns = sys::monotonic_ns();
    send(&Message::Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        uname: sys::uname(),
        online_cpus,
        monotonic_ns,
    })?;
    send(&kernel_facts())?;
    for note in notes.into_iter().chain(cpu_note) {
        log(note)?;
    }
    Ok(monotonic_ns)
}

fn kernel_facts() -> Message {
    let sysctls = SYSCTLS
        .iter()
        .filter_map(|name| {
            let path = format!("/proc/sys/{name}");
            sys::read_trimmed(&path).ok().map(|v| (path, v))
        })
        .collect();
    Message::KernelFacts {
        sysctls,
        cmdline: sys::read_trimmed("/proc/cmdline").unwrap_or_default(),
    }
}

fn read_plan() -> Result<Plan> {
    let text = std::fs::read(PLAN_PATH).os_ctx(format!("reading the plan {PLAN_PATH}"))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing the plan {PLAN_PATH}"))
}
