//! One trial: a kernel × a scenario, from image to verdict.
//!
//! pin → image → initramfs → VM → agent → evidence → check → normalise →
//! snapshot. Every failure is classified ([`Verdict`]) and every artefact
//! stays in the trial's directory, whose path the verdict names.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kloop_protocol::Message;
use serde::Serialize;

use crate::accel::AccelDecision;
use crate::evidence::RunEvidence;
use crate::initramfs::Initramfs;
use crate::kernel::{KernelCache, KernelPin};
use crate::scenario::Scenario;
use crate::snapshot::{self, SnapshotOutcome};
use crate::vm::{self, Deadlines, SessionEnd, Vm, VmConfig};

/// The kernel a trial boots.
#[derive(Debug, Clone)]
pub enum KernelUnderTest {
    /// A pinned Debian build from the catalog.
    Pin(KernelPin),
    /// A bzImage the user built; `snapshot_as` names the pin whose golden
    /// snapshots it is compared with (none: invariants only).
    Image {
        path: PathBuf,
        snapshot_as: Option<String>,
    },
}

impl KernelUnderTest {
    /// The name used in trial ids: the pin id, or `image`.
    pub fn id(&self) -> String {
        match self {
            KernelUnderTest::Pin(p) => p.id.clone(),
            KernelUnderTest::Image { .. } => "image".to_string(),
        }
    }

    fn snapshot_name(&self) -> Option<String> {
        match self {
            KernelUnderTest::Pin(p) => Some(p.id.clone()),
            KernelUnderTest::Image { snapshot_as, .. } => snapshot_as.clone(),
        }
    }
}

/// How a trial ended. Only `Ok` is a pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "class", content = "message", rename_all = "kebab-case")]
pub enum Verdict {
    Ok,
    /// The kernel's records broke a rule, the snapshot drifted, or the agent
    /// reported an error: a finding about the kernel (or a kloop bug).
    Failed(String),
    /// Something around the test broke: fetch, QEMU, the channel.
    Infrastructure(String),
    Timeout(String),
    Panic(String),
    Interrupted(String),
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed(_) => "FAILED",
            Verdict::Infrastructure(_) => "INFRA",
            Verdict::Timeout(_) => "TIMEOUT",
            Verdict::Panic(_) => "PANIC",
            Verdict::Interrupted(_) => "INTERRUPTED",
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::Failed(m)
            | Verdict::Infrastructure(m)
            | Verdict::Timeout(m)
            | Verdict::Panic(m)
            | Verdict::Interrupted(m) => Some(m),
        }
    }
}

/// The result of one trial, with its environment.
#[derive(Debug, Clone, Serialize)]
pub struct TrialResult {
    pub id: String,
    pub kernel: String,
    pub scenario: String,
    pub verdict: Verdict,
    pub wall_secs: f64,
    pub accel: String,
    pub boot_to_hello_secs: Option<f64>,
    /// QEMU's peak resident memory in KiB, when it could be read.
    pub qemu_peak_rss_kib: Option<u64>,
    pub guest_release: Option<String>,
    pub qemu_version: String,
    pub host_release: String,
    pub artefacts: PathBuf,
}

/// What every trial of one run shares.
pub struct TrialEnv {
    pub qemu: PathBuf,
    pub qemu_version: String,
    pub accel: AccelDecision,
    pub agent: PathBuf,
    pub cache: KernelCache,
    pub fetch: crate::kernel::FetchOptions,
    /// `target/kloop/runs/<run>`.
    pub run_dir: PathBuf,
    pub cpus: u32,
    pub memory_mib: u32,
    pub deadlines: Option<Deadlines>,
}

impl TrialResult {
    /// A result for `kernel` × `scenario` before anything ran: the
    /// environment filled in, `verdict` as given, timings empty.
    pub fn new(
        env: &TrialEnv,
        kernel: &KernelUnderTest,
        scenario: &Scenario,
        verdict: Verdict,
        artefacts: PathBuf,
    ) -> TrialResult {
        TrialResult {
            id: format!("{}/{}", kernel.id(), scenario.name),
            kernel: kernel.id(),
            scenario: scenario.name.clone(),
            verdict,
            wall_secs: 0.0,
            accel: env.accel.accel.clone(),
            boot_to_hello_secs: None,
            qemu_peak_rss_kib: None,
            guest_release: None,
            qemu_version: env.qemu_version.clone(),
            host_release: crate::accel::host_release(),
            artefacts,
        }
    }
}

/// Runs one trial to its verdict. Never panics on guest input; never leaves
/// QEMU running.
pub fn run_trial(env: &TrialEnv, kernel: &KernelUnderTest, scenario: &Scenario) -> TrialResult {
    let artefacts = claim_dir(&env.run_dir.join(kernel.id()).join(&scenario.name));
    let started = Instant::now();
    let mut result = TrialResult::new(env, kernel, scenario, Verdict::Ok, artefacts.clone());
    result.verdict = run_inner(env, kernel, scenario, &artefacts, &mut result);
    result.wall_secs = started.elapsed().as_secs_f64();
    if let Ok(json) = serde_json::to_string_pretty(&result) {
        let _ = std::fs::write(artefacts.join("result.json"), json);
    }
    result
}

fn run_inner(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    artefacts: &Path,
    result: &mut TrialResult,
) -> Verdict {
    if let Err(e) = std::fs::create_dir_all(artefacts) {
        return Verdict::Infrastructure(format!(
            "cannot create artefact directory {}: {e}",
            artefacts.display()
        ));
    }
    let image = match kernel {
        KernelUnderTest::Pin(pin) => match env.cache.ensure_image(pin, &env.fetch) {
            Ok(p) => p,
            Err(e) => return Verdict::Infrastructure(e.to_string()),
        },
        KernelUnderTest::Image { path, .. } => {
            if !path.is_file() {
                return Verdict::Infrastructure(format!(
                    "kernel image {} does not exist (expected a bzImage, e.g. arch/x86/boot/bzImage)",
                    path.display()
                ));
            }
            path.clone()
        }
    };
    let initramfs = artefacts.join("initramfs.cpio");
    if let Err(e) = build_initramfs(&env.agent, scenario, &initramfs) {
        return Verdict::Infrastructure(format!("writing initramfs {}: {e}", initramfs.display()));
    }
    let accel = env.accel.accel();
    let config = VmConfig {
        qemu: env.qemu.clone(),
        kernel: image,
        initramfs: Some(initramfs),
        accel,
        cpus: scenario.vm.cpus.unwrap_or(env.cpus),
        memory_mib: env.memory_mib,
        cmdline: scenario.vm.cmdline.clone(),
        artefacts: artefacts.to_path_buf(),
        deadlines: env.deadlines.unwrap_or_else(|| Deadlines::for_accel(accel)),
        data_channel: true,
        icount: scenario.vm.icount,
    };
    let console = artefacts.join("console.log");
    let mut vm = match Vm::spawn(config) {
        Ok(vm) => vm,
        Err(e) => return Verdict::Infrastructure(e.to_string()),
    };
    let session = vm.run_session(&crate::signals::interrupted);
    drop(vm);
    result.boot_to_hello_secs = session.hello_at.map(|d| d.as_secs_f64());
    result.qemu_peak_rss_kib = session.qemu_peak_rss_kib;
    save_messages(artefacts, &session.messages);
    let tail = || {
        format!(
            "last 30 console lines ({}):\n{}",
            console.display(),
            vm::console_tail(&console, 30)
        )
    };
    let end = session.end.clone().unwrap_or(SessionEnd::Infrastructure(
        "session ended without a reason".into(),
    ));
    // Whatever else happened, a trial the user stopped is interrupted (QEMU
    // may have died of the same signal, e.g. a SIGTERM to the whole cgroup).
    if end != SessionEnd::Done && crate::signals::interrupted() {
        let what = match &end {
            SessionEnd::Interrupted => "VM killed".to_string(),
            SessionEnd::QemuExited(s) => format!("QEMU {}", vm::describe_exit(s)),
            _ => "VM stopped".to_string(),
        };
        return Verdict::Interrupted(format!(
            "interrupted by SIGINT/SIGTERM during {}; {what}; partial artefacts in {}",
            if session.hello_at.is_none() {
                "boot"
            } else {
                "the trial"
            },
            artefacts.display()
        ));
    }
    // A panic explains any other ending, so look for it first.
    if let Some(panic) = vm::console_panic(&console) {
        if end != SessionEnd::Done {
            if let Some(line) = panic.lines().find(|l| l.contains("Attempted to kill init")) {
                return agent_crashed(line.trim(), &session.messages, &console);
            }
            return Verdict::Panic(format!(
                "guest kernel panicked:\n{panic}\nconsole: {}",
                console.display()
            ));
        }
    }
    match end {
        SessionEnd::Done => {}
        SessionEnd::AgentError(m) => {
            return Verdict::Failed(format!(
                "the guest agent failed: {m}\n{}\n{}",
                last_report(&session.messages),
                tail()
            ));
        }
        SessionEnd::BootTimeout(d) => {
            return Verdict::Timeout(format!(
                "boot timeout: the guest agent did not say hello within {} s\n{}",
                d.as_secs_f64(),
                tail()
            ))
        }
        SessionEnd::Silent(d) => {
            return Verdict::Timeout(format!(
                "the guest agent went silent (no frame, not even a heartbeat, for {} s); VM killed\n{}\n{}",
                d.as_secs_f64(),
                last_report(&session.messages),
                tail()
            ))
        }
        SessionEnd::TotalTimeout(d) => {
            return Verdict::Timeout(format!(
                "the trial exceeded its {} s deadline; VM killed\n{}\n{}",
                d.as_secs_f64(),
                last_report(&session.messages),
                tail()
            ))
        }
        SessionEnd::QemuExited(status) => {
            let stderr = std::fs::read_to_string(artefacts.join("qemu.stderr")).unwrap_or_default();
            let qemu_said = if stderr.trim().is_empty() {
                String::new()
            } else {
                format!("\nQEMU said: {}", stderr.trim())
            };
            let why = if std::os::unix::process::ExitStatusExt::signal(&status).is_some() {
                "\nkloop did not send that signal: something outside it did (the OOM killer, \
                 see `dmesg`; a CI job timeout; a user). Not a finding about the kernel: rerun the trial."
            } else {
                ""
            };
            let trailing = match session.trailing {
                Some((offset, len)) => format!(
                    "\nthe data channel ended inside a frame: {len} byte(s) from stream offset {offset} never completed"
                ),
                None => String::new(),
            };
            return Verdict::Infrastructure(format!(
                "QEMU {} before the guest agent finished{}{why}{qemu_said}{trailing}\n{}\n{}",
                vm::describe_exit(&status),
                if session.hello_at.is_none() {
                    " (no hello: the guest crashed or never started the agent)"
                } else {
                    ""
                },
                last_report(&session.messages),
                tail()
            ));
        }
        SessionEnd::Protocol(m) => {
            return Verdict::Infrastructure(format!(
                "data channel protocol error: {m}\nraw channel bytes: {} (stream offsets count from its first byte)\n{}",
                artefacts.join("data.bin").display(),
                last_report(&session.messages),
            ))
        }
        SessionEnd::Infrastructure(m) => {
            return Verdict::Infrastructure(format!("{m}\n{}", tail()))
        }
        SessionEnd::Interrupted => {
            return Verdict::Interrupted("interrupted by signal; VM killed".into())
        }
    }
    let evidence = evidence_from(&session);
    result.guest_release = Some(evidence.uname.release.clone());
    for (idx, bytes) in &evidence.streams {
        let _ = std::fs::write(artefacts.join(format!("records-{idx}.bin")), bytes);
    }
    let mut analysis = crate::check::analyse(&evidence);
    // What this scenario declares on top of the rules every run obeys.
    analysis.violations.extend(crate::expect::check(
        &scenario.expect,
        &scenario.plan,
        &evidence,
        &analysis,
        kernel.snapshot_name().as_deref(),
    ));
    let normalised = crate::normalise::normalise(&evidence, &analysis);
    let normalised_path = artefacts.join("normalised.txt");
    let _ = std::fs::write(&normalised_path, &normalised);
    if !analysis.violations.is_empty() {
        let mut msg = format!(
            "{} invariant violation(s) (normalised stream: {}):",
            analysis.violations.len(),
            normalised_path.display()
        );
        for v in &analysis.violations {
            msg.push_str(&format!("\n  [{}] {}", v.rule, v.message));
        }
        return Verdict::Failed(msg);
    }
    // Timing scenarios: figures against the pin's budget (overhead.rs).
    let overhead = crate::overhead::check_trial(
        scenario,
        &evidence,
        &kernel.id(),
        kernel.snapshot_name().as_deref(),
        accel,
        artefacts,
    );
    let overhead_verdict = || {
        overhead
            .clone()
            .map_or_else(Verdict::Failed, |()| Verdict::Ok)
    };
    let Some(snap_name) = kernel.snapshot_name() else {
        return overhead_verdict();
    };
    match snapshot::compare(
        &scenario.snapshot_dir(),
        &snap_name,
        &format!("{} on kernel pin {snap_name}", scenario.name),
        &normalised,
    ) {
        SnapshotOutcome::Matched => overhead_verdict(),
        SnapshotOutcome::Drift {
            snapshot,
            pending,
            diff,
        } => Verdict::Failed(format!(
            "snapshot drift against {}:\n{diff}\n{}{}",
            snapshot.display(),
            match pending {
                Some(p) => format!(
                    "new stream written to {}; review with `cargo insta review` or accept with `cargo xtask bless`",
                    p.display()
                ),
                None => format!(
                    "new stream in {}; accept with `cargo xtask bless` if the change is intended",
                    normalised_path.display()
                ),
            },
            overhead.err().map(|e| format!("\n{e}")).unwrap_or_default()
        )),
    }
}

/// PID 1 died: the kernel panics "Attempted to kill init". That is the
/// agent crashing (abort, a fatal signal, an exit), not a kernel finding.
fn agent_crashed(line: &str, messages: &[Message], console: &Path) -> Verdict {
    let how = init_exit_code(line)
        .map(|code| {
            if code & 0x7f != 0 {
                format!("killed by {}", vm::signal_name((code & 0x7f) as i32))
            } else {
                format!("exited with status {}", (code >> 8) & 0xff)
            }
        })
        .unwrap_or_else(|| "died".into());
    let text = std::fs::read(console).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("kloop-guest:"))
        .map(str::trim)
        .collect();
    let own = if own.is_empty() {
        "(none)".to_string()
    } else {
        own[own.len().saturating_sub(5)..].join("\n  ")
    };
    Verdict::Failed(format!(
        "the guest agent crashed: PID 1 {how} and the kernel stopped with `{line}`\n\
         a kloop agent bug, not a finding about the kernel; its last report and console output say where it was:\n\
         {}\nagent output on the console:\n  {own}\nconsole: {}",
        last_report(messages),
        console.display()
    ))
}

/// `exitcode=0x00000006` in the "Attempted to kill init" panic line.
fn init_exit_code(line: &str) -> Option<u32> {
    let hex = line.split("exitcode=0x").nth(1)?;
    let hex: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
    u32::from_str_radix(&hex, 16).ok()
}

/// The agent's last step and last log line, for messages about a failure.
fn last_report(messages: &[Message]) -> String {
    let mut step = None;
    let mut done = false;
    let mut logs: Vec<&str> = Vec::new();
    for m in messages {
        match m {
            Message::StepStart { index, what } => {
                step = Some((*index, what.as_str()));
                done = false;
            }
            Message::StepDone { index, .. } if step.is_some_and(|(i, _)| i == *index) => {
                done = true
            }
            Message::Log { text } => logs.push(text),
            _ => {}
        }
    }
    let step = match step {
        Some((i, what)) => format!(
            "step {i} {what} {}",
            if done {
                "finished"
            } else {
                "started, not finished"
            }
        ),
        None => "no step started (the agent was still setting up)".to_string(),
    };
    let short = |l: &str| {
        const MAX: usize = 300;
        if l.len() > MAX {
            let mut end = MAX;
            while !l.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &l[..end])
        } else {
            l.to_string()
        }
    };
    let logs = if logs.is_empty() {
        "(none)".to_string()
    } else {
        logs[logs.len().saturating_sub(3)..]
            .iter()
            .map(|l| short(l))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    format!("agent's last report: {step}\nagent's last logs: {logs}")
}

fn build_initramfs(agent: &Path, scenario: &Scenario, out: &Path) -> std::io::Result<()> {
    let agent_bytes = std::fs::read(agent)?;
    let plan = serde_json::to_vec_pretty(&scenario.plan).map_err(std::io::Error::other)?;
    let mut i = Initramfs::skeleton();
    i.add_file("init", 0o755, agent_bytes);
    i.add_file(kloop_protocol::PLAN_PATH, 0o644, plan);
    i.write_file(out).map(drop)
}

fn save_messages(dir: &Path, messages: &[Message]) {
    if let Ok(mut f) = std::fs::File::create(dir.join("messages.jsonl")) {
        for m in messages {
            if let Ok(line) = serde_json::to_string(m) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// Collects the guest's messages into the evidence the checks read.
pub fn evidence_from(session: &vm::GuestSession) -> RunEvidence {
    let mut ev = RunEvidence::from_messages(&session.messages, session.streams.clone());
    ev.step_marks = session.step_marks.clone();
    ev
}

/// `base`, or `base-2`, `base-3`, … when a trial of the same name already
/// ran in this run (repeats, benches): created atomically, so parallel
/// trials never share a directory.
fn claim_dir(base: &Path) -> PathBuf {
    if let Some(parent) = base.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for n in 1.. {
        let candidate = if n == 1 {
            base.to_path_buf()
        } else {
            base.with_file_name(format!("{name}-{n}"))
        };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            // Reported by run_inner when it cannot create the directory.
            Err(_) => return candidate,
        }
    }
    unreachable!("an unbounded range always yields")
}

/// A unique, sortable run directory name.
pub fn new_run_dir(root: &Path) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let name = format!("{}-{}", stamp.as_secs(), std::process::id());
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
