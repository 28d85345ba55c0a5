//! The aya warm-up before any listener opens.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use aya::programs::Program;
use kloop_protocol::{Plan, Step};

use crate::bpf;
use crate::fixtures::{load_program, parse_fixture};
use crate::sys;

/// The fixtures the plan's steps load, in first-use order.
pub(super) fn plan_fixtures(plan: &Plan) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for step in &plan.steps {
        let fixture = match step {
            Step::Load { fixture, .. }
            | Step::LoadObject { fixture, .. }
            | Step::Measure { fixture, .. }
            | Step::Storm { fixture, .. }
            | Step::Concurrent { fixture, .. }
            | Step::SpinRead { fixture, .. } => fixture.as_str(),
            _ => continue,
        };
        if !out.contains(&fixture) {
            out.push(fixture);
        }
    }
    out
}

/// Fixtures only steps that run before any listener opens load (so
/// nothing of them needs priming), left out of a saved VM's warm-up:
/// `ksymwatch` (`watch-ksymbols`). Loading and dropping its kprobe program
/// and ring buffer before the save changed the kernel state later trials
/// measure from: on 6.12, `overhead`'s funcs32 unload with no listener took
/// 9142 instructions instead of 9040 in every restored run (1.1%, outside
/// the budget's band), while cold boots, which warm up only their plan's
/// fixtures, stayed at 9040.
const NOT_WARMED_IN_SAVED_VMS: &[&str] = &["ksymwatch"];

/// The fixtures a VM booted to be saved warms up: every one but
/// [`NOT_WARMED_IN_SAVED_VMS`].
pub(super) fn saved_vm_fixtures() -> Vec<&'static str> {
    crate::fixtures::all_stems()
        .into_iter()
        .filter(|stem| !NOT_WARMED_IN_SAVED_VMS.contains(stem))
        .collect()
}

/// aya probes kernel features by loading throw-away programs the first time
/// it needs them. Those loads would be recorded as KSYMBOL/BPF_EVENT records,
/// so force them now, before any listener exists: `aya::features()` runs the
/// whole detection (a `LazyLock` in aya 0.14), and loading every program of
/// every fixture the plan uses once exercises whatever else the real loads
/// will touch (on a cold boot only those: parsing and loading all of them
/// cost about half a second per boot under TCG; a VM saved for restoring
/// loads them all, once). Then wait until the kernel has freed it all.
///
/// Returns what happened as notes for the host (sent as `Log`s by the
/// caller: a VM being saved has not said hello yet) and how many programs
/// it loaded.
pub(super) fn warm_up_aya(fixtures: &[&str]) -> Result<(Vec<String>, u32)> {
    let mut notes = Vec::new();
    let started = Instant::now();
    let before: HashSet<u32> = bpf::prog_ids()?.into_iter().collect();
    let features = aya::features();
    let mut loaded = 0u32;
    for stem in fixtures {
        let mut ebpf = match parse_fixture(stem) {
            Ok(ebpf) => ebpf,
            Err(e) => {
                notes.push(format!("aya warm-up: {}", sys::describe_chain(&e)));
                continue;
            }
        };
        for (name, program) in ebpf.programs_mut() {
            // fentry/fexit/LSM programs load only against a target in the
            // kernel's BTF (the `load` step's `btf_target`); aya probes
            // nothing more for them.
            if matches!(
                program,
                Program::FEntry(_) | Program::FExit(_) | Program::Lsm(_)
            ) {
                continue;
            }
            match load_program(program) {
                Ok(()) => loaded += 1,
                Err(e) => notes.push(format!(
                    "aya warm-up: loading {stem}/{name} failed: {}",
                    sys::describe_chain(&e.into())
                )),
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let leftover = loop {
        let left: Vec<u32> = bpf::prog_ids()?
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    notes.push(format!(
        "aya warm-up before any listener: {} program(s) present at start, features probed, \
         {loaded} fixture program(s) loaded and dropped, {} ms; features: {features:?}",
        before.len(),
        started.elapsed().as_millis()
    ));
    if !leftover.is_empty() {
        notes.push(format!(
            "aya warm-up: programs {leftover:?} still visible 5 s after the warm-up; \
             their unload may show up in the records"
        ));
    }
    Ok((notes, loaded))
}
