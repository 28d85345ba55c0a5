//! `open-listeners`, `close-listeners`, `pause-output` and `drain`: the
//! plan's perf side-band listeners and the shipping of their ring bytes to
//! the host.

use anyhow::{bail, Result};
use kloop_protocol::{ListenerInfo, ListenerScope, ListenerSpec, Message};

use crate::channel::send;
use crate::context::StepContext;
use crate::perf;
use crate::sys::{self, OsContext};

/// Opens the listeners `spec` describes (one per online CPU, or per CPU of
/// `spec.cpus`, or one for the agent's task) and announces each as a
/// `Listener`; `step` is the plan step that opens them (`close-listeners`
/// names it).
pub fn open(context: &mut StepContext, spec: &ListenerSpec, step: u32) -> Result<()> {
    let cpus = listener_cpus(spec)?;
    let mut opened = Vec::new();
    for cpu in cpus {
        if spec.ring_pages == 0 {
            let pid = if spec.scope == ListenerScope::Task {
                0
            } else {
                -1
            };
            let cpu = if spec.scope == ListenerScope::Task && !spec.inherit {
                -1
            } else {
                cpu as i32
            };
            context
                .unmapped
                .push(perf::open_side_band(pid, cpu, spec)?.0);
            continue;
        }
        let index = context.next_listener;
        context.next_listener += 1;
        let ring = match spec.scope {
            ListenerScope::CpuWide => perf::Ring::open(index, cpu, spec)?,
            ListenerScope::Task if spec.inherit => perf::Ring::open_task_on(index, cpu, spec)?,
            ListenerScope::Task => perf::Ring::open_task(index, spec)?,
        };
        send(&Message::Listener(ListenerInfo {
            index,
            cpu: ring.cpu,
            sample_type: spec.sample_type,
            sample_id_all: spec.sample_id_all,
            ksymbol: spec.ksymbol,
            bpf_event: spec.bpf_event,
            ring_bytes: ring.ring_bytes(),
            inherit: spec.inherit,
            // SAFETY: getpid has no preconditions.
            pid: (spec.scope == ListenerScope::Task).then(|| unsafe { libc::getpid() } as u32),
            cpus: spec.cpus.clone(),
            side_band: spec.side_band.clone(),
            disabled: spec.disabled,
            backward: spec.backward,
            poll_watermark: if spec.poll { spec.poll_watermark } else { 0 },
        }))?;
        context.rings.push(ring);
        opened.push(index);
    }
    if spec.poll {
        let fds = context
            .rings
            .iter()
            .filter(|r| opened.contains(&r.index))
            .map(|r| (r.index, r.raw_fd(), r.head_word()))
            .collect();
        context.waiters.insert(
            step,
            crate::wakeups::Waiter::start(fds, spec.poll_watermark)?,
        );
    }
    context.opened_by.insert(step, opened);
    Ok(())
}

/// The CPUs to open a ring on: every online one or those `spec.cpus`
/// asks for (all online) for a listener per CPU; one pass (CPU 0, unused)
/// for a task listener without inherit.
fn listener_cpus(spec: &ListenerSpec) -> Result<Vec<u32>> {
    let per_cpu = matches!(
        (spec.scope, spec.inherit),
        // An inherited task listener is one per CPU too: perf_mmap()
        // refuses an inherited event bound to no CPU.
        (ListenerScope::CpuWide, _) | (ListenerScope::Task, true)
    );
    Ok(if per_cpu {
        let online = sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?;
        match &spec.cpus {
            None => online,
            Some(asked) => {
                if let Some(c) = asked.iter().find(|c| !online.contains(c)) {
                    bail!(
                        "listener spec asks for CPU {c}, which is not online (online: {online:?})"
                    );
                }
                asked.clone()
            }
        }
    } else {
        if spec.cpus.is_some() {
            bail!("a task listener without inherit is bound to no CPU; `cpus` does not apply");
        }
        // One ring for the whole task: `open`'s loop runs once.
        vec![0]
    })
}

/// Stops every waiter and sends what each saw: before the rings it polls
/// close, and at the plan's end.
pub fn finish_waiters(context: &mut StepContext) -> Result<()> {
    for (_, w) in std::mem::take(&mut context.waiters) {
        w.finish()?;
    }
    Ok(())
}

/// Closes the listeners step `step` opened: sends what their rings hold,
/// then unmaps and closes them.
pub fn close(context: &mut StepContext, step: u32) -> Result<()> {
    let Some(indexes) = context.opened_by.remove(&step) else {
        bail!("close-listeners: step {step} opened no listener that is still open");
    };
    // Its waiter polls the fds about to close.
    if let Some(w) = context.waiters.remove(&step) {
        w.finish()?;
    }
    let (mut closing, keep): (Vec<perf::Ring>, Vec<perf::Ring>) =
        std::mem::take(&mut context.rings)
            .into_iter()
            .partition(|r| indexes.contains(&r.index));
    context.rings = keep;
    context.records_bytes += perf::drain_all(&mut closing)?;
    // Dropping a ring unmaps it and closes its event (the last reference:
    // perf_release() -> unaccount_event()).
    drop(closing);
    Ok(())
}

/// Sends every ring's unread bytes to the host.
pub fn drain(context: &mut StepContext) -> Result<()> {
    context.records_bytes += perf::drain_all(&mut context.rings)?;
    // After the drain: every LOST record drained reports losses the count
    // already holds, so the host can hold the records to it.
    for ring in &context.rings {
        if let Some(lost) = ring.lost_samples()? {
            send(&Message::LostSamples {
                listener: ring.index,
                lost,
            })?;
        }
    }
    Ok(())
}

/// `PERF_EVENT_IOC_PAUSE_OUTPUT` on every open listener.
pub fn pause(context: &mut StepContext, paused: bool) -> Result<()> {
    for ring in &context.rings {
        ring.pause_output(paused)?;
    }
    Ok(())
}
