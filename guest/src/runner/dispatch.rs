//! Which step module runs each kind of plan step.

use anyhow::Result;
use kloop_protocol::Step;

use crate::context::StepContext;
use crate::steps::{
    concurrent, fail_nth, fault, files, hooks, inventory, kallsyms, ksymwatch, listeners, load,
    measure, net, pack_boundary, perf_attribution, perf_tool, program, spin_read, storm,
    struct_ops,
};

/// Runs one step of the plan against the plan's shared `context`.
#[expect(clippy::too_many_lines)]
pub(super) fn run_step(context: &mut StepContext, index: u32, step: &Step) -> Result<()> {
    match step {
        Step::SnapshotKallsyms => kallsyms::snapshot(context.kallsyms_at_save.take()),
        Step::OpenListeners { listener } => listeners::open(context, listener, index),
        Step::CloseListeners { step } => listeners::close(context, *step),
        Step::Drain => listeners::drain(context),
        Step::PauseOutput { paused } => listeners::pause(context, *paused),
        Step::Load {
            fixture,
            program,
            label,
            btf_target: None,
        } => load::load(context, fixture, program, label),
        Step::Load {
            fixture,
            program,
            label,
            btf_target: Some(target),
        } => load::load_against_btf(context, fixture, program, label, target),
        Step::LoadUnnamed { label } => load::load_unnamed(context, label),
        Step::Unload { label } => load::unload(context, label),
        Step::WaitUnloaded { timeout_ms } => load::wait_unloaded(context, *timeout_ms),
        Step::Fault { fault } => fault::inject(*fault),
        Step::FailNth {
            target,
            max_attempts,
            page_allocations,
        } => fail_nth::run(context, target, *max_attempts, *page_allocations),
        Step::PackBoundary {
            fixture,
            program,
            btf_target,
            fail_nth,
        } => pack_boundary::run(context, fixture, program, btf_target, *fail_nth),
        Step::PerfAttribution {
            fixture,
            program,
            btf_target,
            perf_args,
            run_ms,
        } => perf_attribution::run(fixture, program, btf_target, perf_args, *run_ms),
        Step::StructOps { name, timeout_ms } => struct_ops::run(context, name, *timeout_ms),
        Step::Measure {
            fixture,
            program,
            listeners_per_cpu,
            iterations,
            warmup,
        } => measure::run(fixture, program, *listeners_per_cpu, *iterations, *warmup),
        Step::Storm {
            fixture,
            program,
            cycles,
            drain_every,
            lookup,
        } => {
            context.records_bytes += storm::run(
                &mut context.rings,
                fixture,
                program,
                *cycles,
                *drain_every,
                *lookup,
            )?;
            Ok(())
        }
        Step::LoadObject { fixture, label } => hooks::load_object(context, fixture, label),
        Step::Attach {
            label,
            link,
            target,
        } => hooks::attach(context, label, link, target),
        Step::Detach { link } => hooks::detach(context, link),
        Step::Trigger {
            nanosleeps,
            sleep_ms,
        } => {
            hooks::trigger(*nanosleeps, *sleep_ms);
            Ok(())
        }
        Step::ReadCounter { label, map, key } => hooks::read_counter(context, label, map, *key),
        Step::WaitKallsyms {
            prefix,
            present,
            count,
            timeout_ms,
        } => kallsyms::wait(prefix, *present, *count, *timeout_ms),
        Step::Write {
            path,
            text,
            may_fail,
        } => files::write(path, text, *may_fail),
        Step::Mkdir { path } => files::mkdir(path),
        Step::Rmdir { path } => files::rmdir(path),
        Step::ReadFile { path, label } => files::read_file(path, label),
        Step::Veth { name, peer } => net::veth(name, peer),
        Step::Modprobe { name } => net::modprobe(name),
        Step::Inventory => inventory::run(),
        Step::KprobeFill {
            label,
            link,
            prefix,
            optinsn_pages,
            max_probes,
        } => hooks::kprobe_fill(context, label, link, prefix, *optinsn_pages, *max_probes),
        Step::WatchKsymbols => ksymwatch::watch(context),
        Step::ReadKsymbolWatch => ksymwatch::read(context),
        Step::FailedLoad => ksymwatch::failed_load(),
        Step::UnprivilegedAttach { label, over_limit } => {
            crate::steps::unprivileged::attach(context, label, *over_limit)
        }
        Step::Concurrent {
            fixture,
            program,
            cycles,
            churn,
        } => concurrent::run(fixture, program, *cycles, *churn),
        Step::SpinRead {
            listener,
            fixture,
            program,
            cycles,
            waiters,
        } => spin_read::run(listener, fixture, program, *cycles, *waiters),
        Step::PerfRecordStart { args } => perf_tool::start(args),
        Step::PerfRecordStop => perf_tool::stop(),
        Step::RunProgram {
            path,
            args,
            timeout_ms,
        } => program::run(path, args, *timeout_ms),
    }
}
