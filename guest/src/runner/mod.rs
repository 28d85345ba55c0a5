//! The plan runner: hello, facts, probes, warm-up, steps, done.
//!
//! It owns the [`StepContext`] the steps share and hands every step to
//! [`dispatch`]; the steps themselves never call back into the runner.

mod dispatch;
mod warm_up;

use std::time::Instant;

use anyhow::{Context, Result};
use kloop_protocol::{Message, Plan, PLAN_PATH, PROTOCOL_VERSION};

use crate::channel::{self, log, send};
use crate::context::StepContext;
use crate::init;
use crate::steps::probes;
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
pub fn run(notes: Vec<String>, port_note: String) -> Result<()> {
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
    send(&Message::Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        uname: sys::uname(),
        online_cpus,
        monotonic_ns: sys::monotonic_ns(),
    })?;
    send(&kernel_facts())?;
    log(format!(
        "data port {}: {port_note}",
        kloop_protocol::DATA_PORT
    ))?;
    for note in notes.into_iter().chain(cpu_note) {
        log(note)?;
    }
    channel::start_heartbeat();

    let plan = read_plan()?;
    if let Some((requirement, reason)) = probes::first_unmet(&plan.requires)? {
        send(&Message::Unsupported {
            requirement,
            reason,
        })?;
        return send(&Message::Done { records_bytes: 0 });
    }
    warm_up::warm_up_aya(&warm_up::plan_fixtures(&plan))?;

    let mut context = StepContext::default();
    for (index, step) in plan.steps.iter().enumerate() {
        let index = index as u32;
        init::set_current_step(Some(index));
        send(&Message::StepStart {
            index,
            what: serde_json::to_string(step).expect("steps serialise"),
        })?;
        let started = Instant::now();
        dispatch::run_step(&mut context, step)?;
        send(&Message::StepDone {
            index,
            elapsed_ns: started.elapsed().as_nanos() as u64,
        })?;
        init::set_current_step(None);
    }
    send(&Message::Done {
        records_bytes: context.records_bytes,
    })
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
