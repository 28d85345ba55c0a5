//! `open-listeners`, `pause-output` and `drain`: the plan's perf side-band
//! listeners and the shipping of their ring bytes to the host.

use anyhow::Result;
use kloop_protocol::{ListenerInfo, ListenerScope, ListenerSpec, Message};

use crate::channel::send;
use crate::context::StepContext;
use crate::perf;
use crate::sys::{self, OsContext};

/// Opens the listeners `spec` describes (one per online CPU, or one for
/// the agent's task) and announces each as a `Listener`.
pub fn open(context: &mut StepContext, spec: &ListenerSpec) -> Result<()> {
    let cpus = match (spec.scope, spec.inherit) {
        // An inherited task listener is one per CPU too: perf_mmap()
        // refuses an inherited event bound to no CPU.
        (ListenerScope::CpuWide, _) | (ListenerScope::Task, true) => {
            sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?
        }
        // One ring for the whole task: the loop below runs once.
        (ListenerScope::Task, false) => vec![0],
    };
    for cpu in cpus {
        if spec.ring_pages == 0 {
            let pid = if spec.scope == ListenerScope::Task {
                0
            } else {
                -1
            };
            let cpu = if spec.scope == ListenerScope::Task {
                -1
            } else {
                cpu as i32
            };
            context.unmapped.push(perf::open_side_band(pid, cpu, spec)?);
            continue;
        }
        let index = context.rings.len() as u32;
        let ring = match spec.scope {
            ListenerScope::CpuWide => perf::Ring::open(index, cpu, spec)?,
            ListenerScope::Task if spec.inherit => perf::Ring::open_task_on(index, cpu, spec)?,
            ListenerScope::Task => perf::Ring::open_task(index, spec)?,
        };
        send(&Message::Listener(ListenerInfo {
            index,
            cpu: ring.cpu,
            sample_type: spec.sample_type,
            sample_id_all: true,
            ksymbol: spec.ksymbol,
            bpf_event: spec.bpf_event,
            ring_bytes: ring.ring_bytes(),
            inherit: spec.inherit,
            // SAFETY: getpid has no preconditions.
            pid: (spec.scope == ListenerScope::Task).then(|| unsafe { libc::getpid() } as u32),
        }))?;
        context.rings.push(ring);
    }
    Ok(())
}

/// Sends every ring's unread bytes to the host.
pub fn drain(context: &mut StepContext) -> Result<()> {
    context.records_bytes += perf::drain_all(&mut context.rings)?;
    Ok(())
}

/// `PERF_EVENT_IOC_PAUSE_OUTPUT` on every open listener.
pub fn pause(context: &mut StepContext, paused: bool) -> Result<()> {
    for ring in &context.rings {
        ring.pause_output(paused)?;
    }
    Ok(())
}
