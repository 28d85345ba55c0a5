//! The plan interpreter: hello, facts, steps, done.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya::programs::{Program, ProgramError};
use aya::{Ebpf, EbpfLoader};
use kloop_protocol::{
    Fault, ListenerInfo, ListenerScope, ListenerSpec, Message, Plan, Step, PLAN_PATH,
    PROTOCOL_VERSION,
};

use crate::sys::{self, OsContext};
use crate::{bpf, fixtures, kallsyms, perf, port, CURRENT_STEP};

const SYSCTLS: &[&str] = &[
    "kernel/perf_event_paranoid",
    "kernel/kptr_restrict",
    "net/core/bpf_jit_enable",
    "net/core/bpf_jit_harden",
    "net/core/bpf_jit_kallsyms",
    "kernel/unprivileged_bpf_disabled",
];

pub(crate) fn send(msg: &Message) -> Result<()> {
    port::send(msg).os_ctx("writing to the data port")
}

pub(crate) fn log(text: impl Into<String>) -> Result<()> {
    send(&Message::Log { text: text.into() })
}

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
    crate::start_heartbeat();

    let plan = read_plan()?;
    if let Some((requirement, reason)) = crate::probe::first_unmet(&plan.requires)? {
        send(&Message::Unsupported {
            requirement,
            reason,
        })?;
        return send(&Message::Done { records_bytes: 0 });
    }
    warm_up_aya(&plan_fixtures(&plan))?;

    let mut state = State::default();
    for (index, step) in plan.steps.iter().enumerate() {
        let index = index as u32;
        CURRENT_STEP.store(index as i64, Ordering::Relaxed);
        send(&Message::StepStart {
            index,
            what: serde_json::to_string(step).expect("steps serialise"),
        })?;
        let started = Instant::now();
        state.step(step)?;
        send(&Message::StepDone {
            index,
            elapsed_ns: started.elapsed().as_nanos() as u64,
        })?;
        CURRENT_STEP.store(-1, Ordering::Relaxed);
    }
    send(&Message::Done {
        records_bytes: state.records_bytes,
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

pub(crate) fn fixture(name: &str) -> Result<&'static [u8]> {
    fixtures::FIXTURES
        .iter()
        .find(|(stem, _)| *stem == name)
        .map(|(_, bytes)| *bytes)
        .ok_or_else(|| {
            let known: Vec<&str> = fixtures::FIXTURES.iter().map(|(s, _)| *s).collect();
            anyhow!("no embedded fixture {name:?} (the agent has {known:?})")
        })
}

pub(crate) fn parse_fixture(name: &str) -> Result<Ebpf> {
    // No kernel BTF: the fixtures need no CO-RE, and parsing vmlinux BTF is slow under TCG.
    EbpfLoader::new()
        .btf(None)
        .load(fixture(name)?)
        .with_context(|| format!("aya could not load the object of fixture {name:?}"))
}

/// The program `program` of a parsed fixture, or an error naming those it has.
pub(crate) fn fixture_program<'a>(
    ebpf: &'a mut Ebpf,
    fixture: &str,
    program: &str,
) -> Result<&'a mut Program> {
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_owned()).collect();
    ebpf.program_mut(program)
        .ok_or_else(|| anyhow!("fixture {fixture:?} has no program {program:?} (it has {names:?})"))
}

/// Loads a program of any type that needs no attach target at load time.
pub(crate) fn load_program(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::SocketFilter(p) => p.load(),
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        Program::TracePoint(p) => p.load(),
        Program::KProbe(p) => p.load(),
        Program::RawTracePoint(p) => p.load(),
        Program::CgroupSkb(p) => p.load(),
        Program::PerfEvent(p) => p.load(),
        Program::SockOps(p) => p.load(),
        Program::SkMsg(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

/// The fixtures the plan's steps load, in first-use order.
fn plan_fixtures(plan: &Plan) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for step in &plan.steps {
        let fixture = match step {
            Step::Load { fixture, .. }
            | Step::LoadObject { fixture, .. }
            | Step::Measure { fixture, .. }
            | Step::Storm { fixture, .. }
            | Step::Concurrent { fixture, .. } => fixture.as_str(),
            _ => continue,
        };
        if !out.contains(&fixture) {
            out.push(fixture);
        }
    }
    out
}

/// aya probes kernel features by loading throw-away programs the first time
/// it needs them. Those loads would be recorded as KSYMBOL/BPF_EVENT records,
/// so force them now, before any listener exists: `aya::features()` runs the
/// whole detection (a `LazyLock` in aya 0.14), and loading every program of
/// every fixture the plan uses once exercises whatever else the real loads
/// will touch (only those: parsing and loading all of them cost about half a
/// second per boot under TCG). Then wait until the kernel has freed it all.
fn warm_up_aya(fixtures: &[&str]) -> Result<()> {
    let started = Instant::now();
    let before: HashSet<u32> = bpf::prog_ids()?.into_iter().collect();
    let features = aya::features();
    let mut loaded = 0;
    for stem in fixtures {
        let mut ebpf = match parse_fixture(stem) {
            Ok(ebpf) => ebpf,
            Err(e) => {
                log(format!("aya warm-up: {}", sys::describe_chain(&e)))?;
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
                Err(e) => log(format!(
                    "aya warm-up: loading {stem}/{name} failed: {}",
                    sys::describe_chain(&e.into())
                ))?,
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
    log(format!(
        "aya warm-up before any listener: {} program(s) present at start, features probed, \
         {loaded} fixture program(s) loaded and dropped, {} ms; features: {features:?}",
        before.len(),
        started.elapsed().as_millis()
    ))?;
    if !leftover.is_empty() {
        log(format!(
            "aya warm-up: programs {leftover:?} still visible 5 s after the warm-up; \
             their unload may show up in the records"
        ))?;
    }
    Ok(())
}

/// Bytes the `garbage-frame` fault writes: no frame magic anywhere in them,
/// so the host must report a framing error at their first byte.
const GARBAGE: &[u8] = b"\x00kloop-guest fault injection: these bytes are not a frame\r\n";

/// Breaks something on purpose (fault-injection tests only).
fn inject(fault: Fault) -> Result<()> {
    match fault {
        Fault::KernelPanic => {
            // sysrq may be restricted by the kernel's default mask; 1 allows all.
            std::fs::write("/proc/sys/kernel/sysrq", "1")
                .os_ctx("enabling sysrq (/proc/sys/kernel/sysrq)")?;
            log("fault: triggering a kernel crash through /proc/sysrq-trigger")?;
            port::drain().os_ctx("draining the data port")?;
            std::fs::write("/proc/sysrq-trigger", "c")
                .os_ctx("writing c to /proc/sysrq-trigger")?;
            bail!("the kernel survived `echo c > /proc/sysrq-trigger`")
        }
        Fault::Hang => {
            log("fault: hanging: no heartbeat or other frame from now on")?;
            port::silence_forever()
        }
        Fault::Abort => {
            log("fault: calling abort() in PID 1")?;
            port::drain().os_ctx("draining the data port")?;
            // SAFETY: abort has no preconditions; it does not return.
            unsafe { libc::abort() }
        }
        Fault::AgentPanic => panic!("fault injection: deliberate agent panic"),
        Fault::GarbageFrame => {
            port::send_frame(GARBAGE).os_ctx("writing garbage to the data port")?;
            log("fault: wrote non-frame bytes to the data port")
        }
        Fault::PanicMidFrame => {
            log("fault: panicking in the middle of a frame")?;
            port::drain().os_ctx("draining the data port")?;
            let frame = Message::Log {
                text: "x".repeat(4000),
            }
            .to_frame();
            port::panic_mid_frame(&frame, 100)
        }
        Fault::Flood => {
            log("fault: flooding the data channel with records")?;
            let chunk = vec![0u8; 64 * 1024];
            let mut offset = 0u64;
            loop {
                for f in kloop_protocol::records_frames(u32::MAX, offset, &chunk) {
                    port::send_frame(&f).os_ctx("flooding the data port")?;
                }
                offset += chunk.len() as u64;
            }
        }
    }
}

/// Reads a loaded program's `bpf_prog_info` and kallsyms lines and sends
/// them as `ProgFacts` under `label`; returns its id.
pub(crate) fn report_prog(label: &str, prog: &Program) -> Result<u32> {
    let info = bpf::prog_info(prog.fd()?.as_fd())?;
    let kallsyms = kallsyms::read_filtered(|e| info.jited_ksyms.contains(&e.addr))?;
    send(&Message::Prog(info.facts(label.to_owned(), &kallsyms)))?;
    Ok(info.info.id)
}

pub(crate) struct Loaded {
    /// Owns the program fd (and the object's BTF fd); dropping it unloads.
    pub(crate) ebpf: Ebpf,
    /// The program's name in `ebpf`.
    pub(crate) program: String,
    pub(crate) id: u32,
    /// The other programs of a `load-object` (label, id): `ebpf` holds
    /// them, and their links, too.
    pub(crate) others: Vec<(String, u32)>,
    /// Links of a `load-object`'s programs: dropped (detached) with it.
    pub(crate) _links: Vec<Box<dyn std::any::Any>>,
}

#[derive(Default)]
pub(crate) struct State {
    rings: Vec<perf::Ring>,
    pub(crate) loaded: HashMap<String, Loaded>,
    /// Links taken out of aya by `attach` steps, by link name: they keep
    /// the program attached (and alive) until `detach`.
    pub(crate) links: HashMap<String, crate::hooks::HeldLink>,
    /// Programs unloaded by the plan and not yet confirmed gone.
    unloaded: Vec<(String, u32)>,
    records_bytes: u64,
}

impl State {
    fn step(&mut self, step: &Step) -> Result<()> {
        match step {
            Step::SnapshotKallsyms => {
                let entries = kallsyms::read_filtered(kallsyms::is_side_band_symbol)?;
                send(&Message::InitialKallsyms { entries })
            }
            Step::OpenListeners { listener } => self.open_listeners(listener),
            Step::Load {
                fixture,
                program,
                label,
                btf_target: None,
            } => self.load(fixture, program, label),
            Step::Unload { label } => {
                let prog = self
                    .loaded
                    .remove(label)
                    .ok_or_else(|| anyhow!("unload of {label:?}, which is not loaded"))?;
                self.unloaded.push((label.clone(), prog.id));
                self.unloaded.extend(prog.others.iter().cloned());
                drop(prog);
                Ok(())
            }
            Step::WaitUnloaded { timeout_ms } => self.wait_unloaded(*timeout_ms),
            Step::Drain => self.drain(),
            Step::Fault { fault } => inject(*fault),
            Step::Measure { .. } => crate::measure::run(step),
            Step::Storm { .. } => {
                self.records_bytes += crate::storm::run(step, &mut self.rings)?;
                Ok(())
            }
            Step::Load {
                btf_target: Some(_),
                ..
            }
            | Step::LoadObject { .. }
            | Step::Attach { .. }
            | Step::Detach { .. }
            | Step::Trigger { .. }
            | Step::ReadCounter { .. }
            | Step::WaitKallsyms { .. }
            | Step::Write { .. }
            | Step::Mkdir { .. }
            | Step::Rmdir { .. }
            | Step::ReadFile { .. } => crate::hooks::run(self, step),
            Step::Veth { .. } | Step::Modprobe { .. } => crate::net::run(step),
            Step::Inventory => crate::inventory::run(),
            Step::Concurrent { .. } => crate::concurrent::run(step),
            Step::PerfRecordStart { .. } | Step::PerfRecordStop => crate::perf_tool::run(step),
        }
    }

    fn open_listeners(&mut self, spec: &ListenerSpec) -> Result<()> {
        let cpus = match spec.scope {
            ListenerScope::CpuWide => {
                sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?
            }
            // One ring for the whole task: the loop below runs once.
            ListenerScope::Task => vec![0],
        };
        for cpu in cpus {
            let index = self.rings.len() as u32;
            let ring = match spec.scope {
                ListenerScope::CpuWide => perf::Ring::open(index, cpu, spec)?,
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
            }))?;
            self.rings.push(ring);
        }
        Ok(())
    }

    fn load(&mut self, fixture: &str, program: &str, label: &str) -> Result<()> {
        self.load_with(fixture, program, label, load_program)
    }

    /// Loads `program` of `fixture` with `load` (which knows what the
    /// program type needs at load time), reports its facts under `label` and
    /// keeps it.
    pub(crate) fn load_with(
        &mut self,
        fixture: &str,
        program: &str,
        label: &str,
        load: impl FnOnce(&mut Program) -> Result<(), ProgramError>,
    ) -> Result<()> {
        if self.loaded.contains_key(label) {
            bail!("label {label:?} is already loaded");
        }
        let mut ebpf = parse_fixture(fixture)?;
        let prog = fixture_program(&mut ebpf, fixture, program)?;
        load(prog)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("loading {fixture}/{program} (label {label:?})"))?;
        let id = report_prog(label, prog)
            .with_context(|| format!("bpf_prog_info of {fixture}/{program}"))?;
        self.loaded.insert(
            label.to_owned(),
            Loaded {
                ebpf,
                program: program.to_owned(),
                id,
                others: Vec::new(),
                _links: Vec::new(),
            },
        );
        Ok(())
    }

    fn wait_unloaded(&mut self, timeout_ms: u64) -> Result<()> {
        if !self.loaded.is_empty() {
            let mut held: Vec<&String> = self.loaded.keys().collect();
            held.sort();
            log(format!(
                "wait-unloaded waits for the programs unloaded so far; still held: {held:?}"
            ))?;
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let ids: HashSet<u32> = bpf::prog_ids()?.into_iter().collect();
            let left: Vec<&(String, u32)> = self
                .unloaded
                .iter()
                .filter(|(_, id)| ids.contains(id))
                .collect();
            if left.is_empty() {
                self.unloaded.clear();
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("after {timeout_ms} ms these unloaded programs are still visible by id (label, id): {left:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn drain(&mut self) -> Result<()> {
        self.records_bytes += perf::drain_all(&mut self.rings)?;
        Ok(())
    }
}
