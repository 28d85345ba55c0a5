//! Fault injection: every failure a user will meet is caught, classified and
//! cleaned up. Real kernels under real QEMU (pin 6.1, the fastest to boot).
//!
//! Each VM test injects one fault, then asserts the trial's `Verdict`
//! variant, what its message says, that no QEMU child of this process is left
//! (zombies included), that the VM's socket directory is gone and that the
//! artefacts exist. Every test prints a `fault-table:` line with the time to
//! its verdict. The faults a user meets through the CLI (QEMU missing, two
//! runs at once, SIGINT/SIGTERM, a reproducer) are `xtask/tests/cli_faults.rs`,
//! which drives the `xtask` binary cargo builds for it.
//!
//! Trials run one at a time (`--test-threads 1` unless given): the cleanup
//! checks look at this process's children, and the machine has few cores.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::collections::BTreeSet;
use std::ffi::OsStr;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kloop::run::suite::{self, EnvOptions, Selection};
use kloop::run::trial::{KernelUnderTest, TrialEnv, TrialResult, Verdict};
use kloop::scenario::Scenario;
use kloop::workspace::Layout;
use kloop_protocol::{Fault, Plan, Step};
use kloop_qemu::accel::AccelChoice;
use kloop_qemu::Deadlines;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

const PIN: &str = "6.1";
/// The bytes the agent's `garbage-frame` fault writes (guest/src/steps/fault.rs).
const GARBAGE: &[u8] = b"\x00kloop-guest fault injection: these bytes are not a frame\r\n";
const POLL: Duration = Duration::from_millis(10);

type TestResult = Result<(), Failed>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        {
            let ok: bool = $cond;
            if !ok {
                return Err(Failed::from(format!($($fmt)+)));
            }
        }
    };
}

// ---------------------------------------------------------------- setup

struct Ctx {
    env: TrialEnv,
    kernel: KernelUnderTest,
    basic: Scenario,
}

static CTX: OnceLock<Result<Ctx, String>> = OnceLock::new();

fn ctx() -> Result<&'static Ctx, Failed> {
    CTX.get_or_init(|| {
        let layout = Layout::from_root(kloop::workspace::workspace_root());
        let sel = Selection {
            kernels: vec![PIN.into()],
            scenarios: vec!["basic".into()],
            ..Selection::default()
        };
        let planned = suite::plan(&layout, &sel).map_err(|e| e.to_string())?;
        let t = planned
            .into_iter()
            .next()
            .ok_or(format!("no trial {PIN}/basic"))?;
        let accel = std::env::var("KLOOP_ACCEL")
            .unwrap_or_else(|_| "auto".into())
            .parse::<AccelChoice>()?;
        let opts = EnvOptions {
            accel,
            ..EnvOptions::default()
        };
        let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&t.kernel))
            .map_err(|e| format!("preparing the VM environment: {e}"))?;
        eprintln!("faults: accelerator: {}", env.accel.reason);
        eprintln!("faults: artefacts in {}", env.run_dir.display());
        Ok(Ctx {
            env,
            kernel: t.kernel,
            basic: t.scenario,
        })
    })
    .as_ref()
    .map_err(|e| Failed::from(e.clone()))
}

impl Ctx {
    fn env_with(&self, deadlines: Option<Deadlines>) -> TrialEnv {
        let e = &self.env;
        TrialEnv {
            qemu: e.qemu.clone(),
            qemu_version: e.qemu_version.clone(),
            accel: e.accel.clone(),
            agent: e.agent.clone(),
            cache: e.cache.clone(),
            fetch: e.fetch.clone(),
            run_dir: e.run_dir.clone(),
            cpus: e.cpus,
            memory_mib: e.memory_mib,
            deadlines,
            extra_cmdline: e.extra_cmdline.clone(),
            boot: e.boot,
            bless: e.bless,
            saved_vms: std::sync::Arc::new(kloop::run::saved_vm::SavedVms::in_cache(
                e.cache.root(),
            )),
            known_issues: e.known_issues.clone(),
            expected_skips: e.expected_skips.clone(),
            pin_modules: e.pin_modules.clone(),
            other_arches: e.other_arches.clone(),
        }
    }

    fn default_deadlines(&self) -> Deadlines {
        Deadlines::for_accel(self.env.accel.accel())
    }

    /// The `basic` scenario with `fault` injected after the load: listeners
    /// are open and a program is loaded when it strikes.
    fn fault_scenario(&self, name: &str, fault: Fault) -> Scenario {
        let mut steps = self.basic.plan.steps.clone();
        let at = steps
            .iter()
            .position(|s| matches!(s, Step::Load { .. }))
            .map_or(steps.len(), |i| i + 1);
        steps.insert(at, Step::Fault { fault });
        Scenario {
            name: name.into(),
            // Never compared with a snapshot: fault trials end before that.
            dir: self.env.run_dir.join("no-snapshots"),
            description: format!("fault injection: {fault:?}"),
            plan: Plan {
                scenario: name.into(),
                requires: Vec::new(),
                params: Vec::new(),
                steps,
            },
            ..self.basic.clone()
        }
    }
}

// ---------------------------------------------------------------- /proc

// Reading /proc for QEMU processes: shared with xtask's tests.
use kloop_test_support::{alive, qemu_children, qemu_guests, said_hello, socket_dir, Proc};

fn contains(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn me() -> i32 {
    std::process::id() as i32
}

// ---------------------------------------------------------------- watcher

/// What a background thread saw of one trial's QEMU and data channel.
#[derive(Debug, Default)]
struct Seen {
    qemu: Vec<Proc>,
    socket_dirs: BTreeSet<PathBuf>,
    hello_at: Option<Instant>,
    /// When `data.bin` last grew.
    last_data_at: Option<Instant>,
    killed: Option<(i32, Instant)>,
}

struct Watcher {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Watches the QEMU children of `parent` and `<artefacts>/data.bin`;
    /// with `kill_at_hello`, SIGKILLs QEMU once the agent's hello arrived.
    fn start(parent: i32, artefacts: PathBuf, kill_at_hello: bool) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let data = artefacts.join("data.bin");
            let mut size = 0;
            while !stop2.load(Ordering::SeqCst) {
                let kids = qemu_guests(parent);
                let bytes = std::fs::read(&data).unwrap_or_default();
                let now = Instant::now();
                let mut s = seen2.lock().unwrap();
                for k in &kids {
                    if !s.qemu.iter().any(|q| q.pid == k.pid) && !k.cmdline.is_empty() {
                        if let Some(d) = socket_dir(&k.cmdline) {
                            s.socket_dirs.insert(d);
                        }
                        s.qemu.push(k.clone());
                    }
                }
                if bytes.len() != size {
                    size = bytes.len();
                    s.last_data_at = Some(now);
                }
                if s.hello_at.is_none() && said_hello(&bytes) {
                    s.hello_at = Some(now);
                }
                if kill_at_hello && s.hello_at.is_some() && s.killed.is_none() {
                    if let Some(q) = kids.iter().find(|k| k.state != 'Z') {
                        // SAFETY: plain kill(2) of our own child.
                        unsafe { libc::kill(q.pid, libc::SIGKILL) };
                        s.killed = Some((q.pid, Instant::now()));
                    }
                }
                drop(s);
                std::thread::sleep(POLL);
            }
        });
        Watcher {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

// ---------------------------------------------------------------- VM trials

struct Outcome {
    result: TrialResult,
    seen: Seen,
    /// When `run_trial` returned.
    verdict_at: Instant,
}

impl Outcome {
    fn message(&self) -> &str {
        self.result.verdict.message().unwrap_or("")
    }

    fn secs_since(&self, t: Instant) -> f64 {
        self.verdict_at.duration_since(t).as_secs_f64()
    }
}

/// Runs `scenario` as one trial while watching it, then checks the cleanup
/// every trial owes: its QEMU (seen running) is gone and reaped, its socket
/// directory removed, its artefacts written.
fn run_watched(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    kill_at_hello: bool,
) -> Result<Outcome, Failed> {
    let artefacts = env.run_dir.join(kernel.id()).join(&scenario.name);
    ensure!(
        !artefacts.exists(),
        "{} exists already: scenario names must be unique in a run",
        artefacts.display()
    );
    let watcher = Watcher::start(me(), artefacts.clone(), kill_at_hello);
    let result = kloop::run::trial::run_trial(env, kernel, scenario);
    let verdict_at = Instant::now();
    let seen = watcher.finish();
    eprintln!("{}", kloop::report::trial_line(&result));
    if let Some(d) = kloop::report::failure_details(&result) {
        eprintln!("{d}");
    }
    ensure!(
        result.artefacts == artefacts,
        "artefacts in {}, expected {}",
        result.artefacts.display(),
        artefacts.display()
    );
    qemu_and_sockets_are_gone(&result, &seen)?;
    artefacts_are_written(&artefacts, &result)?;
    Ok(Outcome {
        result,
        seen,
        verdict_at,
    })
}

/// The QEMU processes a trial owes (seen running, now gone and reaped) and
/// the socket directories it made (removed).
fn qemu_and_sockets_are_gone(result: &TrialResult, seen: &Seen) -> Result<(), Failed> {
    // One QEMU per trial, plus the boot that saved its shape's VM when
    // this trial made it, plus a failed restore's before a cold boot.
    let started_from = result.started_from.clone().unwrap_or_default();
    let saved_vm = result.saved_vm.clone();
    let expected_qemu = 1
        + usize::from(saved_vm.as_ref().is_some_and(|s| s.made_now))
        + usize::from(saved_vm.as_ref().is_some_and(|s| !s.restored));
    ensure!(
        seen.qemu.len() == expected_qemu,
        "expected to watch {expected_qemu} QEMU child(ren) during the trial ({started_from}), saw {:?}",
        seen.qemu
    );
    let left = qemu_children(me());
    ensure!(
        left.is_empty(),
        "QEMU left behind after the verdict: {left:?}"
    );
    for q in &seen.qemu {
        ensure!(!alive(q.pid), "QEMU pid {} still in /proc", q.pid);
    }
    ensure!(
        !seen.socket_dirs.is_empty(),
        "no socket directory seen in the QEMU command line {:?}",
        seen.qemu
    );
    for d in &seen.socket_dirs {
        ensure!(
            !d.exists(),
            "socket directory {} was not removed",
            d.display()
        );
    }
    Ok(())
}

/// Every artefact a trial writes is there, and its `result.json` agrees with
/// the verdict.
fn artefacts_are_written(artefacts: &Path, result: &TrialResult) -> Result<(), Failed> {
    // A restored trial's initramfs is its saved VM's; a cold one's is the
    // run's shared base plus the trial's own plan.cpio.
    let restored = result.saved_vm.as_ref().is_some_and(|s| s.restored);
    for f in [
        "console.log",
        "qemu.stderr",
        "plan.cpio",
        "data.bin",
        "messages.jsonl",
        "result.json",
        "boot.txt",
    ]
    .into_iter()
    .filter(|f| !(restored && *f == "plan.cpio"))
    {
        ensure!(
            artefacts.join(f).is_file(),
            "artefact {f} missing in {}",
            artefacts.display()
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(artefacts.join("result.json")).unwrap())
            .map_err(|e| format!("result.json: {e}"))?;
    ensure!(
        json["verdict"]["class"] == verdict_class(&result.verdict),
        "result.json says {}, the trial said {:?}",
        json["verdict"],
        result.verdict
    );
    Ok(())
}

fn verdict_class(v: &Verdict) -> &'static str {
    match v {
        Verdict::Ok => "ok",
        Verdict::Failed(_) => "failed",
        Verdict::Skipped(_) => "skipped",
        Verdict::Known(_) => "known",
        Verdict::Fixed(_) => "fixed?",
        Verdict::Infrastructure(_) => "infrastructure",
        Verdict::Timeout(_) => "timeout",
        Verdict::Panic(_) => "panic",
        Verdict::Interrupted(_) => "interrupted",
        Verdict::Flaky(_) => "flaky",
    }
}

fn table(fault: &str, injected: &str, verdict: &Verdict, cleanup: &str, time: String) {
    eprintln!(
        "fault-table: {fault} | {injected} | {} | {cleanup} | {time}",
        verdict.label()
    );
}

const VM_CLEANUP: &str = "QEMU reaped, socket dir removed, artefacts kept";

/// How long after the event that decides it a verdict may come, derived
/// from the deadline that would otherwise have ended the trial, not from a
/// quiet machine: the event path (the channel closes, QEMU is reaped within
/// `EXIT_AFTER_CLOSE`, a QMP quit gets `QUIT_WAIT`, a framing error waits
/// `PROTOCOL_ERROR_GRACE` for last words) must beat that deadline. The
/// verdict's class already shows which mechanism ended the trial; the bound
/// catches a harness that noticed the event only when a deadline fired.
/// `extra` is what the path itself waits for on purpose.
fn before_deadline(deadline: Duration, extra: Duration) -> f64 {
    (deadline + extra).as_secs_f64()
}

fn ensure_before_deadline(t: f64, deadline: Duration, extra: Duration, what: &str) -> TestResult {
    let bound = before_deadline(deadline, extra);
    ensure!(
        t < bound,
        "verdict {t:.2} s after {what}: not before the {:.0} s deadline (+{:.0} s the path waits on purpose) that would have ended the trial anyway",
        deadline.as_secs_f64(),
        extra.as_secs_f64()
    );
    Ok(())
}

fn expect_contains(msg: &str, needles: &[&str]) -> TestResult {
    for n in needles {
        ensure!(msg.contains(n), "message lacks {n:?}:\n{msg}");
    }
    Ok(())
}

fn qemu_killed_from_outside() -> TestResult {
    let c = ctx()?;
    // The plan ends in a hang so the trial cannot finish before the kill.
    let s = c.fault_scenario("fault-qemu-killed", Fault::Hang);
    let o = run_watched(&c.env_with(None), &c.kernel, &s, true)?;
    let Some((_, killed_at)) = o.seen.killed else {
        return Err(format!(
            "the agent's hello never arrived, QEMU was not killed:\n{:?}",
            o.result.verdict
        )
        .into());
    };
    ensure!(
        matches!(o.result.verdict, Verdict::Infrastructure(_)),
        "expected INFRA, got {:?}",
        o.result.verdict
    );
    expect_contains(
        o.message(),
        &[
            "QEMU was killed by signal 9 (SIGKILL) before the guest agent finished\n",
            "kloop did not send that signal",
            "agent's last report",
            "console.log",
        ],
    )?;
    let to_verdict = o.secs_since(killed_at);
    ensure_before_deadline(
        to_verdict,
        c.default_deadlines().silence,
        kloop_qemu::EXIT_AFTER_CLOSE,
        "the kill",
    )?;
    // The same environment runs the next trial as if nothing happened.
    let next = run_watched(&c.env_with(None), &c.kernel, &c.basic, false)?;
    ensure!(
        next.result.verdict == Verdict::Ok,
        "the next trial did not pass: {:?}",
        next.result.verdict
    );
    table(
        "QEMU killed from outside",
        "SIGKILL to the QEMU child once its hello frame is complete in data.bin",
        &o.result.verdict,
        &format!("{VM_CLEANUP}; next trial {}", next.result.verdict.label()),
        format!("{to_verdict:.2} s after the kill"),
    );
    Ok(())
}

/// A fault whose verdict comes from an event (QEMU exits, the channel
/// closes), not from a deadline: the verdict class, the words its message
/// must carry, and what the event path waits for on purpose.
struct EventFault {
    scenario: &'static str,
    fault: Fault,
    class: &'static str,
    is_class: fn(&Verdict) -> bool,
    says: &'static [&'static str],
    path_waits: Duration,
    row: &'static str,
    how: &'static str,
}

fn event_fault(f: &EventFault) -> TestResult {
    let c = ctx()?;
    let s = c.fault_scenario(f.scenario, f.fault);
    let o = run_watched(&c.env_with(None), &c.kernel, &s, false)?;
    ensure!(
        (f.is_class)(&o.result.verdict),
        "expected {}, got {:?}",
        f.class,
        o.result.verdict
    );
    expect_contains(o.message(), f.says)?;
    let last = o.seen.last_data_at.ok_or("no data seen")?;
    let t = o.secs_since(last);
    ensure_before_deadline(
        t,
        c.default_deadlines().silence,
        f.path_waits,
        "the last channel byte",
    )?;
    table(
        f.row,
        f.how,
        &o.result.verdict,
        VM_CLEANUP,
        format!(
            "{t:.2} s after the agent's last frame (trial {:.1} s)",
            o.result.wall_secs
        ),
    );
    Ok(())
}

fn kernel_panic() -> TestResult {
    event_fault(&EventFault {
        scenario: "fault-kernel-panic",
        fault: Fault::KernelPanic,
        class: "PANIC",
        is_class: |v| matches!(v, Verdict::Panic(_)),
        says: &[
            "guest kernel panicked",
            "Kernel panic - not syncing: sysrq triggered crash",
            "console.log",
        ],
        path_waits: kloop_qemu::EXIT_AFTER_CLOSE,
        row: "guest kernel panic",
        how: "step fault kernel-panic: echo c > /proc/sysrq-trigger",
    })
}

fn agent_abort() -> TestResult {
    event_fault(&EventFault {
        scenario: "fault-agent-abort",
        fault: Fault::Abort,
        class: "FAILED (agent crash, not a kernel panic)",
        is_class: |v| matches!(v, Verdict::Failed(_)),
        says: &[
            "the guest agent crashed",
            "Attempted to kill init",
            "not a finding about the kernel",
            r#""fault":"abort""#,
            "fault: calling abort() in PID 1",
        ],
        path_waits: kloop_qemu::EXIT_AFTER_CLOSE,
        row: "agent abort (PID 1 dies)",
        how: "step fault abort: libc::abort()",
    })
}

fn agent_panic() -> TestResult {
    event_fault(&EventFault {
        scenario: "fault-agent-panic",
        fault: Fault::AgentPanic,
        class: "FAILED",
        is_class: |v| matches!(v, Verdict::Failed(_)),
        says: &[
            "the guest agent failed",
            "agent panicked",
            "fault injection: deliberate agent panic",
            r#""fault":"agent-panic""#,
        ],
        path_waits: kloop_qemu::POWER_OFF_WAIT,
        row: "agent panic",
        how: "step fault agent-panic: panic!() (hook reports, powers off)",
    })
}

fn panic_mid_frame() -> TestResult {
    event_fault(&EventFault {
        scenario: "fault-panic-mid-frame",
        fault: Fault::PanicMidFrame,
        class: "FAILED (the agent's panic), not a channel protocol error",
        is_class: |v| matches!(v, Verdict::Failed(_)),
        says: &[
            "the guest agent failed",
            "agent panicked",
            "fault injection: panic in the middle of a frame (100 of",
            "its report came after a frame it cut short",
            "never completed",
        ],
        path_waits: kloop_qemu::EXIT_AFTER_CLOSE,
        row: "agent panic in the middle of a frame",
        how: "step fault panic-mid-frame: 100 bytes of a 4 KiB frame, then panic!() holding the port lock",
    })
}

fn hang() -> TestResult {
    let c = ctx()?;
    let silence = Duration::from_secs(4);
    let deadlines = Deadlines {
        silence,
        ..c.default_deadlines()
    };
    let s = c.fault_scenario("fault-hang", Fault::Hang);
    let o = run_watched(&c.env_with(Some(deadlines)), &c.kernel, &s, false)?;
    ensure!(
        matches!(o.result.verdict, Verdict::Timeout(_)),
        "expected TIMEOUT, got {:?}",
        o.result.verdict
    );
    expect_contains(
        o.message(),
        &[
            "went silent",
            "for 4 s",
            "VM killed",
            r#""fault":"hang""#,
            "started, not finished",
            "fault: hanging",
            "last 30 console lines",
        ],
    )?;
    // The verdict comes from the silence deadline: not before it (the
    // trial lasted at least that long; the watcher's view of the last byte
    // can lag on a loaded host, so that lower bound is the trial's own
    // wall time) and before a second silence period on top of the QMP quit
    // that stops the VM.
    let last = o.seen.last_data_at.ok_or("no data seen")?;
    let quiet = o.secs_since(last);
    ensure!(
        o.result.wall_secs >= silence.as_secs_f64(),
        "the trial took {:.2} s, less than the {silence:?} silence deadline that ended it",
        o.result.wall_secs
    );
    ensure_before_deadline(
        quiet,
        silence * 2,
        kloop_qemu::QUIT_WAIT,
        "the last channel byte (twice the silence deadline)",
    )?;
    table(
        "guest hang",
        "step fault hang: agent holds the port lock (no heartbeat) and sleeps",
        &o.result.verdict,
        VM_CLEANUP,
        format!(
            "{quiet:.2} s after the last frame (silence deadline {} s)",
            silence.as_secs()
        ),
    );
    Ok(())
}

fn channel_flood() -> TestResult {
    let c = ctx()?;
    let s = c.fault_scenario("fault-flood", Fault::Flood);
    // A small limit so the test is quick; the mechanism is the same at the
    // default. The fault suite runs one test at a time (test_threads = 1).
    let limit: u64 = 8 << 20;
    std::env::set_var(kloop_qemu::CHANNEL_LIMIT_ENV, limit.to_string());
    let o = run_watched(&c.env_with(None), &c.kernel, &s, false);
    std::env::remove_var(kloop_qemu::CHANNEL_LIMIT_ENV);
    let o = o?;
    ensure!(
        matches!(o.result.verdict, Verdict::Infrastructure(_)),
        "expected INFRA naming the channel limit, got {:?}",
        o.result.verdict
    );
    expect_contains(
        o.message(),
        &["more than 8 MiB", kloop_qemu::CHANNEL_LIMIT_ENV, "runaway"],
    )?;
    let kept = std::fs::metadata(o.result.artefacts.join("data.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    // The pump reads at most 64 KiB past the limit before it stops.
    ensure!(
        kept <= limit + 64 * 1024,
        "data.bin holds {kept} bytes, more than the {limit}-byte limit allows"
    );
    table(
        "runaway agent floods the channel",
        "step fault flood: Records frames without end, KLOOP_CHANNEL_LIMIT=8M",
        &o.result.verdict,
        VM_CLEANUP,
        format!("stopped at {kept} bytes (limit {limit})"),
    );
    Ok(())
}

fn garbage_frame() -> TestResult {
    let c = ctx()?;
    let s = c.fault_scenario("fault-garbage-frame", Fault::GarbageFrame);
    let o = run_watched(&c.env_with(None), &c.kernel, &s, false)?;
    let data = std::fs::read(o.result.artefacts.join("data.bin")).unwrap_or_default();
    // The host stops reading at the error: data.bin may end inside the
    // garbage, but holds at least the 4 bytes the magic check needs.
    let offset = contains(&data, &GARBAGE[..4]).ok_or("the garbage bytes are not in data.bin")?;
    ensure!(
        data[offset..].iter().zip(GARBAGE).all(|(a, b)| a == b),
        "data.bin at {offset} is not the agent's garbage"
    );
    ensure!(
        matches!(o.result.verdict, Verdict::Infrastructure(_)),
        "expected INFRA (protocol error), got {:?}",
        o.result.verdict
    );
    expect_contains(
        o.message(),
        &[
            "data channel protocol error",
            &format!("no frame magic at stream offset {offset}"),
            "data.bin",
        ],
    )?;
    let last = o.seen.last_data_at.ok_or("no data seen")?;
    let t = o.secs_since(last);
    ensure_before_deadline(
        t,
        c.default_deadlines().silence,
        kloop_qemu::PROTOCOL_ERROR_GRACE,
        "the garbage arrived",
    )?;
    table(
        "garbage on the data channel",
        "step fault garbage-frame: non-frame bytes under the port lock",
        &o.result.verdict,
        VM_CLEANUP,
        format!("{t:.2} s after the garbage arrived; names offset {offset}"),
    );
    Ok(())
}

// ---------------------------------------------------------------- tools missing

fn clang_missing() -> TestResult {
    let root = kloop::workspace::workspace_root();
    let scratch = tempfile::Builder::new()
        .prefix("kloop-faults-guest-")
        .tempdir_in(root.join("target"))
        .map_err(|e| format!("scratch dir: {e}"))?;
    let target = scratch.path().join("guest");
    // Start from a copy of the real agent build, so only the build script
    // (which KLOOP_CLANG reruns) runs: fast, and target/kloop/guest untouched.
    let real = root.join("target/kloop/guest");
    let real_bin = real
        .join(kloop::run::agent::AGENT_TARGET)
        .join("release/kloop-guest");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let before = mtime(&real_bin);
    if real.is_dir() {
        let st = Command::new("cp")
            .arg("-a")
            .arg(&real)
            .arg(&target)
            .status()
            .map_err(|e| format!("cp: {e}"))?;
        ensure!(st.success(), "copying {} failed", real.display());
    }
    let t = Instant::now();
    let r = kloop::run::agent::build(
        &root,
        &target,
        &[("KLOOP_CLANG", OsStr::new("/nonexistent/clang"))],
    );
    let secs = t.elapsed().as_secs_f64();
    let err = match r {
        Ok(p) => return Err(format!("the agent built without clang: {}", p.display()).into()),
        Err(e) => e.to_string(),
    };
    expect_contains(
        &err,
        &[
            "building the guest agent failed",
            "`/nonexistent/clang` was not found",
            "install the Debian package `clang`",
            "KLOOP_CLANG",
        ],
    )?;
    ensure!(
        mtime(&real_bin) == before,
        "{} changed during the scratch build",
        real_bin.display()
    );
    let scratch_path = scratch.path().to_path_buf();
    scratch
        .close()
        .map_err(|e| format!("removing the scratch dir: {e}"))?;
    ensure!(!scratch_path.exists(), "{} left", scratch_path.display());
    table(
        "clang missing",
        "kloop::run::agent::build with KLOOP_CLANG=/nonexistent/clang (scratch target dir)",
        &Verdict::Infrastructure(String::new()),
        "scratch target removed; target/kloop/guest untouched",
        format!("{secs:.2} s"),
    );
    Ok(())
}

// ---------------------------------------------------------------- cache

/// Unmounts and removes a tmpfs mount point on every exit path.
struct TmpfsMount(PathBuf);

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Issue 5, item 7: the kernel cache fills up mid-extraction. A tmpfs just big
/// enough for the verified 6.1 .deb leaves no room for its 8 MB image, so the
/// write fails with ENOSPC: the error must name the cache path and the cause,
/// and no partial file may be left looking like a cached image.
fn cache_disk_full() -> TestResult {
    let layout = Layout::from_root(kloop::workspace::workspace_root());
    let catalog = kloop_kernels::Catalog::load(&layout.kernels()).map_err(|e| e.to_string())?;
    let pin = catalog.get("6.1").map_err(|e| e.to_string())?.clone();
    let home = kloop_kernels::KernelCache::default_location().map_err(|e| e.to_string())?;
    let deb = home
        .ensure_deb(&pin, &kloop_kernels::FetchOptions::default())
        .map_err(|e| e.to_string())?;
    let deb_len = std::fs::metadata(&deb).map_err(|e| e.to_string())?.len();
    let mount = TmpfsMount(
        tempfile::Builder::new()
            .prefix("kloop-diskfull-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep(),
    );
    let size_kib = deb_len / 1024 + 1024; // the deb, plus 1 MiB of slack
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size_kib}k"), "tmpfs"])
        .arg(&mount.0)
        .status()
        .map_err(|e| format!("running mount: {e}"))?;
    ensure!(
        status.success(),
        "mounting a tmpfs at {} failed",
        mount.0.display()
    );
    let cache = kloop_kernels::KernelCache::at(&mount.0);
    let cached_deb = cache.deb_path(&pin);
    std::fs::create_dir_all(cached_deb.parent().unwrap()).map_err(|e| e.to_string())?;
    std::fs::copy(&deb, &cached_deb).map_err(|e| format!("seeding the deb: {e}"))?;
    let offline = kloop_kernels::FetchOptions {
        offline: true,
        ..Default::default()
    };
    let started = Instant::now();
    let err = match cache.ensure_image(&pin, &offline) {
        Ok(p) => {
            return Err(format!("extraction into a full tmpfs succeeded: {}", p.display()).into())
        }
        Err(e) => e.to_string(),
    };
    let took = started.elapsed();
    ensure!(
        err.contains(&format!(
            "no space left on the device holding {}",
            mount.0.display()
        )) && err.contains("MB free there")
            && err.contains("cargo xtask clean --saved-vms"),
        "the error must name the cache path, what is free and the command that frees space: {err}"
    );
    let images = mount.0.join("images");
    let left: Vec<String> = std::fs::read_dir(&images)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        left.is_empty(),
        "files left in {}: {left:?}",
        images.display()
    );
    ensure!(
        !cache.is_cached(&pin),
        "a pin must not look cached after a failed write"
    );
    println!(
        "fault-table: cache disk full | tmpfs of {size_kib} KiB holding only the .deb | error naming the path and ENOSPC | no file left in images/ | {:.2} s",
        took.as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------- accel

/// Issue 5, item 9: `--accel auto` with no cached verdict decides within the
/// probe's deadline, says why in one line, and caches the verdict so the next
/// decision costs nothing. On this kind of host (`/dev/kvm` answers, nested
/// KVM crawls) the decision is TCG; where KVM works it is KVM.
fn kvm_probe_decides_and_caches() -> TestResult {
    let layout = Layout::from_root(kloop::workspace::workspace_root());
    let catalog = kloop_kernels::Catalog::load(&layout.kernels()).map_err(|e| e.to_string())?;
    let pin = catalog.get("6.1").map_err(|e| e.to_string())?.clone();
    let home = kloop_kernels::KernelCache::default_location().map_err(|e| e.to_string())?;
    let image = home
        .ensure_image(&pin, &kloop_kernels::FetchOptions::default())
        .map_err(|e| e.to_string())?;
    let qemu = kloop_qemu::find_qemu().map_err(|e| e.to_string())?;
    let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let device = kloop_qemu::accel::kvm_device_usable();
    let started = Instant::now();
    let first = kloop_qemu::accel::choose(
        AccelChoice::Auto,
        &qemu,
        &mut || Some(image.clone()),
        cache.path(),
        scratch.path(),
    )
    .map_err(|e| e.to_string())?;
    let took = started.elapsed();
    ensure!(
        took < kloop_qemu::accel::PROBE_DEADLINE * 2,
        "deciding took {took:?}: the probe's {:?} deadline did not end it (a second probe period passed)",
        kloop_qemu::accel::PROBE_DEADLINE
    );
    ensure!(!first.from_cache, "an empty cache cannot hold a verdict");
    match &device {
        Err(why) => ensure!(
            first.accel == "tcg" && first.reason.contains(&why.to_string()),
            "without a usable /dev/kvm the decision must be TCG naming why: {first:?}"
        ),
        Ok(()) => {
            ensure!(
                first.probe_ms.is_some(),
                "/dev/kvm answers, so a probe must run: {first:?}"
            );
            if first.accel == "tcg" {
                ensure!(
                    first.reason.contains("does not work here"),
                    "a TCG fallback must say KVM does not work: {first:?}"
                );
            }
        }
    }
    let started = Instant::now();
    let mut never = || -> Option<PathBuf> { None };
    let second = kloop_qemu::accel::choose(
        AccelChoice::Auto,
        &qemu,
        &mut never,
        cache.path(),
        scratch.path(),
    )
    .map_err(|e| e.to_string())?;
    let cached_took = started.elapsed();
    if device.is_ok() {
        ensure!(
            second.from_cache && second.accel == first.accel,
            "the second decision must come from the cache: {second:?}"
        );
    }
    let left = qemu_children(me());
    ensure!(
        left.is_empty(),
        "the probe left QEMU behind: {} process(es)",
        left.len()
    );
    println!(
        "fault-table: /dev/kvm present but unusable | --accel auto, empty verdict cache | {} ({}) | probe VM gone, verdict cached | {:.2} s (then {:.3} s from cache)",
        first.accel.to_uppercase(),
        first.reason,
        took.as_secs_f64(),
        cached_took.as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------- saved VMs

/// `env` with another boot mode and its own saved-VM bookkeeping.
fn env_booting(c: &Ctx, boot: kloop::run::trial::BootMode) -> TrialEnv {
    TrialEnv {
        boot,
        ..c.env_with(None)
    }
}

/// A trial restored from a saved VM and a cold-booted one record the same
/// normalised stream and reach the same verdict: the saved VM changes how
/// the guest starts, not what the kernel emits. (The oracle is the cold
/// boot, which has no saved state at all.)
fn saved_and_cold_agree() -> TestResult {
    let c = ctx()?;
    let mut streams = Vec::new();
    for (boot, name) in [
        (kloop::run::trial::BootMode::Saved, "saved-agree-saved"),
        (kloop::run::trial::BootMode::Cold, "saved-agree-cold"),
    ] {
        let s = Scenario {
            name: name.into(),
            ..c.basic.clone()
        };
        let o = run_watched(&env_booting(c, boot), &c.kernel, &s, false)?;
        ensure!(
            o.result.verdict == Verdict::Ok,
            "{name}: {:?}",
            o.result.verdict
        );
        let from = o.result.started_from.clone().unwrap_or_default();
        let saved = boot == kloop::run::trial::BootMode::Saved;
        ensure!(
            from.starts_with("restored") == saved
                && o.result.saved_vm.as_ref().is_some_and(|s| s.restored) == saved,
            "{name} started from: {from} ({:?})",
            o.result.saved_vm
        );
        let text = std::fs::read_to_string(o.result.artefacts.join("normalised.txt"))
            .map_err(|e| format!("{name}: normalised.txt: {e}"))?;
        streams.push(text);
    }
    ensure!(
        streams[0] == streams[1],
        "restored and cold-booted basic differ:\n--- saved\n{}\n--- cold\n{}",
        streams[0],
        streams[1]
    );
    Ok(())
}

/// A saved VM whose state QEMU cannot load (its header overwritten in
/// place, the length kept, so it still looks complete) is restored, fails, is
/// removed, and the trial boots cold with the reason in `boot.txt`; the
/// verdict is the scenario's own.
fn saved_vm_corrupt() -> TestResult {
    let c = ctx()?;
    let env = env_booting(c, kloop::run::trial::BootMode::Saved);
    let s = Scenario {
        name: "saved-corrupt-first".into(),
        ..c.basic.clone()
    };
    let first = run_watched(&env, &c.kernel, &s, false)?;
    let key = match &first.result.saved_vm {
        Some(s) if s.restored => s.key.clone(),
        other => {
            return Err(format!(
                "first trial was not restored: {other:?}, {:?}",
                first.result.started_from
            )
            .into())
        }
    };
    let dir = env.saved_vms.root().join(&key);
    let state = dir.join("vmstate");
    let mut bytes = std::fs::read(&state).map_err(|e| format!("{}: {e}", state.display()))?;
    // The stream's header (QEMU's magic and version): QEMU refuses it at
    // once. (RAM pages carry no checksum, so bytes flipped inside them
    // would load.)
    bytes[..64].fill(0xa5);
    std::fs::write(&state, &bytes).map_err(|e| format!("{}: {e}", state.display()))?;
    // A fresh bookkeeping: this run has not seen the key yet.
    let env = env_booting(c, kloop::run::trial::BootMode::Saved);
    let s = Scenario {
        name: "saved-corrupt-second".into(),
        ..c.basic.clone()
    };
    let started = Instant::now();
    let o = run_watched(&env, &c.kernel, &s, false)?;
    ensure!(
        o.result.verdict == Verdict::Ok,
        "after the failed restore the cold boot should pass: {:?}",
        o.result.verdict
    );
    ensure!(
        o.result
            .saved_vm
            .as_ref()
            .is_some_and(|s| s.key == key && !s.restored),
        "the second trial should name saved VM {key} as not restored: {:?}",
        o.result.saved_vm
    );
    ensure!(
        o.result
            .notes
            .iter()
            .any(|n| n.starts_with("booted cold: restoring saved VM")),
        "the trial line should say it booted cold and why: {:?}",
        o.result.notes
    );
    let boot_txt = std::fs::read_to_string(o.result.artefacts.join("boot.txt")).unwrap_or_default();
    expect_contains(
        &boot_txt,
        &["cold boot, because restoring saved VM", &key, "failed"],
    )?;
    ensure!(
        !dir.exists(),
        "the unusable saved VM {} was not removed",
        dir.display()
    );
    ensure!(
        o.result
            .artefacts
            .join("restore-failed-qemu.stderr")
            .is_file(),
        "the failed restore's stderr was not kept"
    );
    table(
        "saved VM unloadable",
        "vmstate header overwritten in place",
        &o.result.verdict,
        "restore QEMU gone, saved VM removed, cold boot",
        format!(
            "{:.2} s (restore attempt + cold boot)",
            o.secs_since(started)
        ),
    );
    Ok(())
}

// ---------------------------------------------------------------- main

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    kloop::run::signals::install();
    let vm = |name: &str, f: fn() -> TestResult| Trial::test(name, f).with_kind("vm");
    let trials = vec![
        vm("vm/qemu-killed-from-outside", qemu_killed_from_outside),
        vm("vm/kernel-panic", kernel_panic),
        vm("vm/hang", hang),
        vm("vm/agent-abort", agent_abort),
        vm("vm/agent-panic", agent_panic),
        vm("vm/garbage-frame", garbage_frame),
        vm("vm/panic-mid-frame", panic_mid_frame),
        vm("vm/channel-flood", channel_flood),
        vm("vm/saved-and-cold-agree", saved_and_cold_agree),
        vm("vm/saved-vm-corrupt", saved_vm_corrupt),
        Trial::test("setup/clang-missing", clang_missing),
        vm("accel/kvm-probe", kvm_probe_decides_and_caches),
        // Mounting a tmpfs needs root: elsewhere the test is reported
        // ignored with that reason, and fails under KLOOP_ROOT_TESTS=require
        // (`.ci/run`, which runs as root).
        Trial::ignorable_test("cache/disk-full", || {
            match kloop_test_support::root_only("mounts a small tmpfs as the kernel cache")? {
                Some(reason) => Ok(Completion::ignored_with(reason)),
                None => cache_disk_full().map(|()| Completion::Completed),
            }
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
