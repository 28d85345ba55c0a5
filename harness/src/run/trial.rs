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

use crate::judge::evidence::RunEvidence;
use crate::judge::snapshot::{self, SnapshotOutcome};
use crate::run::initramfs::Initramfs;
use crate::run::payload::Payload;
use crate::run::scenario::Scenario;
use kloop_kernels::{KernelCache, KernelPin, ModuleSet};
use kloop_qemu::accel::AccelDecision;
use kloop_qemu::{Deadlines, SessionEnd, Vm, VmConfig};

/// The kernel a trial boots.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a handful per run, never stored in bulk
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

/// How a trial ended. Only `Ok` is a pass; `Skipped` and `Known` are not
/// passes either, but they do not fail a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "class", content = "message", rename_all = "kebab-case")]
pub enum Verdict {
    Ok,
    /// The kernel's records broke a rule, the snapshot drifted, or the agent
    /// reported an error: a finding about the kernel (or a kloop bug).
    Failed(String),
    /// The kernel lacks a feature the scenario `requires` (the guest's probe
    /// said which and why): `<requirement>: <reason>`, one line. Nothing ran.
    Skipped(String),
    /// Every violation is a known bug of this pin in the ledger
    /// (`kernels/known-issues.toml`). First line `known bug: <ids>`,
    /// then the entries and the violations they cover.
    Known(String),
    /// A ledger entry expects its bug in this trial and it did not show: the
    /// ledger is out of date. First line `FIXED? <id> no longer shows on <pin>`.
    Fixed(String),
    /// Something around the test broke: fetch, QEMU, the channel.
    Infrastructure(String),
    Timeout(String),
    Panic(String),
    Interrupted(String),
    /// `--repeat N`: the runs of one trial disagreed (verdict or normalised
    /// stream). First line `FLAKY: <k> outcomes in <n> runs`, then each
    /// outcome with its runs and artefacts. Fails the run.
    Flaky(String),
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed(_) => "FAILED",
            Verdict::Skipped(_) => "SKIPPED",
            Verdict::Known(_) => "KNOWN",
            Verdict::Fixed(_) => "FIXED?",
            Verdict::Infrastructure(_) => "INFRA",
            Verdict::Timeout(_) => "TIMEOUT",
            Verdict::Panic(_) => "PANIC",
            Verdict::Interrupted(_) => "INTERRUPTED",
            Verdict::Flaky(_) => "FLAKY",
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::Failed(m)
            | Verdict::Skipped(m)
            | Verdict::Known(m)
            | Verdict::Fixed(m)
            | Verdict::Infrastructure(m)
            | Verdict::Timeout(m)
            | Verdict::Panic(m)
            | Verdict::Interrupted(m)
            | Verdict::Flaky(m) => Some(m),
        }
    }

    /// The label with what a reader needs on the trial line itself:
    /// `SKIPPED (jit-optional: …)`, `KNOWN (issue-a, issue-b)`,
    /// `FIXED? issue-a no longer shows on 6.1`.
    pub fn headline(&self) -> String {
        let first = self.message().and_then(|m| m.lines().next()).unwrap_or("");
        match self {
            Verdict::Skipped(_) => format!("SKIPPED ({first})"),
            Verdict::Known(_) => format!(
                "KNOWN ({})",
                first.strip_prefix(KNOWN_PREFIX).unwrap_or(first)
            ),
            Verdict::Fixed(_) | Verdict::Flaky(_) => first.to_string(),
            other => other.label().to_string(),
        }
    }

    /// Does this verdict fail a run (exit status, libtest)? Skipped and
    /// known-bug trials do not; they are not passes either.
    pub fn fails_run(&self) -> bool {
        !matches!(self, Verdict::Ok | Verdict::Skipped(_) | Verdict::Known(_))
    }
}

/// First-line prefix of a [`Verdict::Known`] message.
pub const KNOWN_PREFIX: &str = "known bug: ";

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
    /// Where the trial's wall time went, for runs that reached the agent.
    pub phases: Option<Phases>,
    pub guest_release: Option<String>,
    pub qemu_version: String,
    pub host_release: String,
    pub artefacts: PathBuf,
    /// One-line facts from the analysis the report line shows (side-band
    /// lookup rates, provoked-loss accounting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Where one trial's wall time went (seconds). `to_hello` is measured on
/// the host from QEMU's spawn; `guest_uptime_at_hello` is the guest's
/// `CLOCK_MONOTONIC` in the hello, i.e. the kernel's own boot up to the
/// agent's first frame, so `to_hello - guest_uptime_at_hello` is QEMU
/// start-up, firmware and the kernel's decompression (before the guest
/// clock starts).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Phases {
    /// Host: before QEMU's spawn (initramfs, argv).
    pub prepare: f64,
    pub to_hello: f64,
    pub guest_uptime_at_hello: Option<f64>,
    /// Hello to done: the agent's plan, channel included.
    pub agent: Option<f64>,
    /// Done to QEMU's exit (power-off).
    pub shutdown: Option<f64>,
    /// Host: parsing, checks, snapshot, budgets after QEMU exited.
    pub host_checks: f64,
    /// CPU seconds QEMU used up to the hello, and from hello to done: the
    /// emulation work itself, barely disturbed by a busy host.
    pub qemu_cpu_to_hello: Option<f64>,
    pub qemu_cpu_agent: Option<f64>,
}

impl Phases {
    fn qemu_total(&self) -> f64 {
        self.to_hello + self.agent.unwrap_or(0.0) + self.shutdown.unwrap_or(0.0)
    }

    /// `to_hello - guest_uptime_at_hello`: QEMU, firmware, decompression.
    pub fn before_kernel_clock(&self) -> Option<f64> {
        self.guest_uptime_at_hello.map(|u| self.to_hello - u)
    }
}

/// What every trial of one run shares.
pub struct TrialEnv {
    pub qemu: PathBuf,
    pub qemu_version: String,
    pub accel: AccelDecision,
    pub agent: PathBuf,
    pub cache: KernelCache,
    pub fetch: kloop_kernels::FetchOptions,
    /// `target/kloop/runs/<run>`.
    pub run_dir: PathBuf,
    pub cpus: u32,
    pub memory_mib: u32,
    pub deadlines: Option<Deadlines>,
    /// Appended to every guest's kernel command line (`--append`).
    pub extra_cmdline: Vec<String>,
    pub boot: BootEntry,
    /// The known-issues ledger trials on pins are judged by.
    pub known_issues: crate::judge::known_issues::Ledger,
}

/// How QEMU enters the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BootEntry {
    /// The bzImage's own ELF through its PVH entry, decompressed once on
    /// the host ([`kloop_kernels::pvh`]); the bzImage when that fails.
    #[default]
    Pvh,
    /// The bzImage as is: firmware, real-mode setup, the decompressor.
    BzImage,
}

impl std::str::FromStr for BootEntry {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pvh" => Ok(BootEntry::Pvh),
            "bzimage" => Ok(BootEntry::BzImage),
            other => Err(format!("unknown boot entry `{other}`: use pvh or bzimage")),
        }
    }
}

/// The file QEMU's `-kernel` gets for `image`. A PVH failure is not the
/// trial's: the bzImage boots instead, and `boot.txt` says why.
fn boot_file(
    env: &TrialEnv,
    image: &Path,
    image_sha256: Option<&str>,
    artefacts: &Path,
) -> PathBuf {
    let note = match env.boot {
        BootEntry::BzImage => "bzimage (as asked)".to_string(),
        BootEntry::Pvh => {
            match kloop_kernels::pvh::ensure_pvh(env.cache.root(), image, image_sha256) {
                Ok(elf) => {
                    let _ = std::fs::write(
                        artefacts.join("boot.txt"),
                        format!("pvh: {} from {}\n", elf.display(), image.display()),
                    );
                    return elf;
                }
                Err(e) => format!("bzimage, because PVH is not possible: {e}"),
            }
        }
    };
    let _ = std::fs::write(
        artefacts.join("boot.txt"),
        format!("{note}: {}\n", image.display()),
    );
    image.to_path_buf()
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
            phases: None,
            guest_release: None,
            qemu_version: env.qemu_version.clone(),
            host_release: kloop_qemu::accel::host_release(),
            artefacts,
            notes: Vec::new(),
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
    if let Some(p) = result.phases.as_mut() {
        p.host_checks = (result.wall_secs - p.prepare - p.qemu_total()).max(0.0);
    }
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
    let trial_started = Instant::now();
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
    let modules = match (kernel, scenario.modules.is_empty()) {
        (_, true) => None,
        (KernelUnderTest::Pin(pin), false) => {
            match env.cache.ensure_modules(pin, &scenario.modules, &env.fetch) {
                Ok(set) => Some(set),
                Err(e) => return Verdict::Infrastructure(e.to_string()),
            }
        }
        (KernelUnderTest::Image { path, .. }, false) => {
            return Verdict::Infrastructure(format!(
                "scenario {} needs kernel modules {:?}, but {} comes with no package to take \
                 them from; run it on a pinned kernel",
                scenario.name,
                scenario.modules,
                path.display()
            ))
        }
    };
    let verified_sha = match kernel {
        KernelUnderTest::Pin(pin) => Some(pin.image_sha256.as_str()),
        KernelUnderTest::Image { .. } => None,
    };
    let image = boot_file(env, &image, verified_sha, artefacts);
    let initramfs = artefacts.join("initramfs.cpio");
    let payload = match scenario_payload(scenario) {
        Ok(p) => p,
        Err(e) => return Verdict::Infrastructure(e.to_string()),
    };
    if let Err(e) = build_initramfs(&env.agent, scenario, modules.as_ref(), &payload, &initramfs) {
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
        cmdline: scenario
            .vm
            .cmdline
            .iter()
            .chain(&env.extra_cmdline)
            .cloned()
            .collect(),
        artefacts: artefacts.to_path_buf(),
        deadlines: env.deadlines.unwrap_or_else(|| Deadlines::for_accel(accel)),
        data_channel: true,
        icount: scenario.vm.icount,
        channel_limit: kloop_qemu::channel_limit(),
    };
    let console = artefacts.join("console.log");
    let mut vm = match Vm::spawn(config) {
        Ok(vm) => vm,
        Err(e) => return Verdict::Infrastructure(e.to_string()),
    };
    let prepare = trial_started.elapsed().as_secs_f64();
    let session = vm.run_session(&crate::run::signals::interrupted);
    drop(vm);
    result.boot_to_hello_secs = session.hello_at.map(|d| d.as_secs_f64());
    if let Some(hello) = session.hello_at {
        let uptime = session.messages.iter().find_map(|m| match m {
            Message::Hello { monotonic_ns, .. } => Some(*monotonic_ns as f64 / 1e9),
            _ => None,
        });
        result.phases = Some(Phases {
            prepare,
            to_hello: hello.as_secs_f64(),
            guest_uptime_at_hello: uptime,
            agent: session.done_at.map(|d| (d - hello).as_secs_f64()),
            shutdown: session
                .done_at
                .map(|d| session.wall.saturating_sub(d).as_secs_f64()),
            host_checks: 0.0,
            qemu_cpu_to_hello: session.qemu_cpu_at_hello,
            qemu_cpu_agent: session
                .qemu_cpu_at_done
                .zip(session.qemu_cpu_at_hello)
                .map(|(d, h)| d - h),
        });
    }
    result.qemu_peak_rss_kib = session.qemu_peak_rss_kib;
    save_messages(artefacts, &session.messages);
    let tail = || {
        format!(
            "last 30 console lines ({}):\n{}",
            console.display(),
            kloop_qemu::console_tail(&console, 30)
        )
    };
    let end = session.end.clone().unwrap_or(SessionEnd::Infrastructure(
        "session ended without a reason".into(),
    ));
    // Whatever else happened, a trial the user stopped is interrupted (QEMU
    // may have died of the same signal, e.g. a SIGTERM to the whole cgroup).
    if end != SessionEnd::Done && crate::run::signals::interrupted() {
        let what = match &end {
            SessionEnd::Interrupted => "VM killed".to_string(),
            SessionEnd::QemuExited(s) => format!("QEMU {}", kloop_qemu::describe_exit(s)),
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
    if let Some(panic) = kloop_qemu::console_panic(&console) {
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
                kloop_qemu::describe_exit(&status),
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
    if let Some(v) = unsupported_verdict(scenario, &evidence) {
        return v;
    }
    for (idx, bytes) in &evidence.streams {
        let _ = std::fs::write(artefacts.join(format!("records-{idx}.bin")), bytes);
    }
    let mut analysis = crate::judge::check::analyse(&evidence);
    result.notes = analysis.notes.clone();
    // What this scenario declares on top of the rules every run obeys.
    analysis.violations.extend(crate::judge::expect::check(
        &scenario.expect,
        &scenario.plan,
        &evidence,
        &analysis,
        kernel.snapshot_name().as_deref(),
    ));
    analysis.violations.extend(crate::judge::perf_script::check(
        &evidence,
        &analysis,
        &scenario.plan.steps,
    ));
    for (i, p) in evidence.perf_scripts.iter().enumerate() {
        let _ = std::fs::write(
            artefacts.join(format!("perf-{i}.txt")),
            format!("$ {}\n{}\n--- stderr ---\n{}", p.command, p.text, p.stderr),
        );
    }
    let normalised = crate::judge::normalise::normalise(&evidence, &analysis)
        + &crate::judge::perf_script::normalise(&evidence, &analysis);
    let normalised_path = artefacts.join("normalised.txt");
    let _ = std::fs::write(&normalised_path, &normalised);
    // The ledger judges pinned kernels only: a user-built image is what one
    // boots to see whether a fix works, so every violation counts there.
    let ledger_pin = match kernel {
        KernelUnderTest::Pin(p) => Some(p.id.as_str()),
        KernelUnderTest::Image { .. } => None,
    };
    let ledger_verdict = match ledger_outcome(
        &env.known_issues,
        ledger_pin,
        &scenario.name,
        &analysis.violations,
        &normalised_path,
    ) {
        Ok(v) => v,
        Err(failed) => return failed,
    };
    let ledger_suffix = ledger_verdict
        .as_ref()
        .and_then(|v| v.message())
        .map(|m| format!("\n{m}"))
        .unwrap_or_default();
    // Timing scenarios: figures against the pin's budget (overhead.rs).
    let overhead = crate::judge::overhead::check_trial(
        scenario,
        &evidence,
        &kernel.id(),
        kernel.snapshot_name().as_deref(),
        accel,
        artefacts,
    );
    let overhead_verdict = || match overhead.clone() {
        Err(e) => Verdict::Failed(format!("{e}{ledger_suffix}")),
        Ok(()) => ledger_verdict.clone().unwrap_or(Verdict::Ok),
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
        ) + &ledger_suffix),
    }
}

/// `Skipped` when the agent reported an unmet requirement the scenario
/// asked for; `Failed` when it reported one the scenario did not ask for.
fn unsupported_verdict(scenario: &Scenario, evidence: &RunEvidence) -> Option<Verdict> {
    let (requirement, reason) = evidence.unsupported.as_ref()?;
    let name = requirement_name(*requirement);
    if !scenario.plan.requires.contains(requirement) {
        return Some(Verdict::Failed(format!(
            "the guest agent reported requirement `{name}` unmet ({reason}), but scenario {} does not require it: an agent bug",
            scenario.name
        )));
    }
    Some(Verdict::Skipped(format!("{name}: {}", one_line(reason))))
}

/// What the ledger makes of a trial's violations. `Err`: violations no
/// entry covers, the trial is FAILED (the message also names the known
/// bugs and the FIXED? entries). `Ok(Some)`: KNOWN or FIXED?, the verdict
/// unless a later check (overhead, snapshot) fails. `Ok(None)`: clean.
/// `pin` is `None` for a user-built image, which the ledger never excuses.
fn ledger_outcome(
    ledger: &crate::judge::known_issues::Ledger,
    pin: Option<&str>,
    scenario: &str,
    violations: &[crate::judge::check::Violation],
    normalised_path: &Path,
) -> Result<Option<Verdict>, Verdict> {
    let empty = crate::judge::known_issues::Ledger::default();
    let ledger = if pin.is_some() { ledger } else { &empty };
    let judgement = ledger.judge(pin.unwrap_or(""), scenario, violations);
    let known_note = known_note(&judgement);
    let fixed_note = pin
        .map(|pin| fixed_note(&judgement, pin, ledger))
        .unwrap_or_default();
    if !judgement.uncovered.is_empty() {
        let mut msg = format!(
            "{} invariant violation(s) (normalised stream: {}):",
            judgement.uncovered.len(),
            normalised_path.display()
        );
        for v in &judgement.uncovered {
            msg.push_str(&format!("\n  [{}] {}", v.rule, v.message));
        }
        if !known_note.is_empty() {
            msg.push_str(&format!("\nalso known bugs of this pin:\n{known_note}"));
        }
        if !fixed_note.is_empty() {
            msg.push_str(&format!("\n{fixed_note}"));
        }
        return Err(Verdict::Failed(msg));
    }
    if !fixed_note.is_empty() {
        return Ok(Some(Verdict::Fixed(if known_note.is_empty() {
            fixed_note
        } else {
            format!("{fixed_note}\nstill showing:\n{known_note}")
        })));
    }
    if judgement.known.is_empty() {
        return Ok(None);
    }
    let ids: Vec<&str> = judgement.known.iter().map(|(i, _)| i.id.as_str()).collect();
    Ok(Some(Verdict::Known(format!(
        "{KNOWN_PREFIX}{}\n{known_note}\nnormalised stream (from the records that parsed): {}",
        ids.join(", "),
        normalised_path.display()
    ))))
}

/// The ledger entries that explain violations, with the violations.
fn known_note(j: &crate::judge::known_issues::Judgement) -> String {
    let mut out = String::new();
    for (issue, hits) in &j.known {
        out.push_str(&format!(
            "  {} ({} bug, rule {}): {}\n",
            issue.id,
            issue.component,
            issue.rule,
            one_line(&issue.summary)
        ));
        for v in hits {
            out.push_str(&format!("    [{}] {}\n", v.rule, v.message));
        }
    }
    out.trim_end().to_string()
}

/// `FIXED? <id> no longer shows on <pin>` for every entry that expected its
/// bug here and did not see it.
fn fixed_note(
    j: &crate::judge::known_issues::Judgement,
    pin: &str,
    ledger: &crate::judge::known_issues::Ledger,
) -> String {
    let file = ledger.path.as_ref().map_or_else(
        || "kernels/known-issues.toml".into(),
        |p| p.display().to_string(),
    );
    if j.fixed.is_empty() {
        return String::new();
    }
    let ids: Vec<&str> = j.fixed.iter().map(|i| i.id.as_str()).collect();
    let mut out = format!("FIXED? {} no longer shows on {pin}", ids.join(", "));
    for i in &j.fixed {
        out.push_str(&format!(
            "\n  {}: no `{}` violation in this trial although the ledger expects one here",
            i.id, i.rule
        ));
    }
    out.push_str(&format!(
        "\n  if the kernel was fixed, drop {pin} from the entry (or the entry) in {file}; if not, the scenario no longer provokes the bug: fix the scenario"
    ));
    out
}

/// A probe's reason or a summary on one line, at most 400 bytes.
fn one_line(text: &str) -> String {
    let joined = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    const MAX: usize = 400;
    if joined.len() <= MAX {
        return joined;
    }
    let mut end = MAX;
    while !joined.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &joined[..end])
}

/// `jit-optional` for [`Requirement::JitOptional`]: the name scenario files use.
pub fn requirement_name(r: kloop_protocol::Requirement) -> String {
    match serde_json::to_value(r) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{r:?}"),
    }
}

/// PID 1 died: the kernel panics "Attempted to kill init". That is the
/// agent crashing (abort, a fatal signal, an exit), not a kernel finding.
fn agent_crashed(line: &str, messages: &[Message], console: &Path) -> Verdict {
    let how = init_exit_code(line)
        .map(|code| {
            if code & 0x7f != 0 {
                format!(
                    "killed by {}",
                    kloop_qemu::signal_name((code & 0x7f) as i32)
                )
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

/// Host programs the scenario needs in the guest: perf and its libraries
/// when it requires `perf-tool` or runs perf.
fn scenario_payload(scenario: &Scenario) -> Result<Payload, crate::run::payload::PayloadError> {
    let plan = &scenario.plan;
    if plan
        .requires
        .contains(&kloop_protocol::Requirement::PerfTool)
        || plan
            .steps
            .iter()
            .any(|s| matches!(s, kloop_protocol::Step::PerfRecordStart { .. }))
    {
        crate::run::payload::perf_payload()
    } else {
        Ok(Payload::default())
    }
}

fn build_initramfs(
    agent: &Path,
    scenario: &Scenario,
    modules: Option<&ModuleSet>,
    payload: &Payload,
    out: &Path,
) -> std::io::Result<()> {
    let agent_bytes = std::fs::read(agent)?;
    let plan = serde_json::to_vec_pretty(&scenario.plan).map_err(std::io::Error::other)?;
    let mut i = Initramfs::skeleton();
    i.add_file("init", 0o755, agent_bytes);
    i.add_file(kloop_protocol::PLAN_PATH, 0o644, plan);
    if let Some(modules) = modules {
        i.add_dir(kloop_protocol::MODULES_DIR);
        for (path, data) in modules.initramfs_files()? {
            i.add_file(&path, 0o644, data);
        }
    }
    for d in payload.dirs() {
        i.add_dir(&d);
    }
    for f in &payload.files {
        let bytes = std::fs::read(&f.host_path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("payload file {}: {e}", f.host_path.display()),
            )
        })?;
        i.add_file(&f.guest_path, f.mode, bytes);
    }
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
pub fn evidence_from(session: &kloop_qemu::GuestSession) -> RunEvidence {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::check::{rule, Violation};
    use crate::judge::known_issues::{Ledger, Vocabulary};
    use kloop_protocol::Requirement;

    fn ledger() -> Ledger {
        let text = r#"
[[issue]]
id = "interp-reg"
rule = "load-symbols"
scenarios = ["interpreter"]
pins = ["6.1"]
summary = "registers a symbol\nfor interpreted programs"
evidence = "KSYMBOL len=0"
review_by = "2027-05-21"
"#;
        let vocab = Vocabulary {
            pins: vec!["6.1".into(), "6.12".into()],
            rules: crate::judge::known_issues::rule_names()
                .into_iter()
                .map(String::from)
                .collect(),
            scenarios: vec![],
        };
        Ledger::parse(text, Path::new("kernels/known-issues.toml"), &vocab).unwrap()
    }

    fn v(rule: &'static str) -> Violation {
        Violation {
            rule,
            message: format!("{rule} broken: L0@0 KSYMBOL"),
        }
    }

    fn outcome(pin: Option<&str>, vs: &[Violation]) -> Result<Option<Verdict>, Verdict> {
        ledger_outcome(&ledger(), pin, "interpreter", vs, Path::new("n.txt"))
    }

    #[test]
    fn only_covered_violations_are_known() {
        let vs = [v(rule::LOAD_SYMBOLS), v(rule::LOAD_SYMBOLS)];
        let Ok(Some(k @ Verdict::Known(_))) = outcome(Some("6.1"), &vs) else {
            panic!("{:?}", outcome(Some("6.1"), &vs));
        };
        assert_eq!(k.headline(), "KNOWN (interp-reg)");
        let m = k.message().unwrap();
        assert!(m.starts_with("known bug: interp-reg\n"), "{m}");
        assert!(
            m.contains("registers a symbol; for interpreted programs"),
            "{m}"
        );
        assert_eq!(m.matches("[load-symbols]").count(), 2, "{m}");
        assert!(!k.fails_run());
    }

    #[test]
    fn an_uncovered_violation_fails_and_names_the_known_ones() {
        let vs = [v(rule::LOAD_SYMBOLS), v(rule::LOST)];
        let Err(Verdict::Failed(m)) = outcome(Some("6.1"), &vs) else {
            panic!()
        };
        assert!(m.starts_with("1 invariant violation(s)"), "{m}");
        assert!(m.contains("[lost]"), "{m}");
        assert!(
            m.contains("also known bugs of this pin:\n  interp-reg"),
            "{m}"
        );
        // Another pin: the entry does not apply, both violations fail.
        let Err(Verdict::Failed(m)) = outcome(Some("6.12"), &vs) else {
            panic!()
        };
        assert!(m.starts_with("2 invariant violation(s)"), "{m}");
    }

    #[test]
    fn a_clean_trial_the_ledger_expects_to_fail_is_fixed() {
        let Ok(Some(f @ Verdict::Fixed(_))) = outcome(Some("6.1"), &[]) else {
            panic!()
        };
        assert_eq!(f.headline(), "FIXED? interp-reg no longer shows on 6.1");
        assert!(f.message().unwrap().contains("kernels/known-issues.toml"));
        assert!(f.fails_run());
        // Uncovered violations win over FIXED?, which is still mentioned.
        let Err(Verdict::Failed(m)) = outcome(Some("6.1"), &[v(rule::LOST)]) else {
            panic!()
        };
        assert!(
            m.contains("FIXED? interp-reg no longer shows on 6.1"),
            "{m}"
        );
        assert_eq!(outcome(Some("6.12"), &[]), Ok(None));
    }

    #[test]
    fn a_user_built_image_is_never_excused() {
        let vs = [v(rule::LOAD_SYMBOLS)];
        assert!(matches!(outcome(None, &vs), Err(Verdict::Failed(_))));
        assert_eq!(outcome(None, &[]), Ok(None));
    }

    fn scenario(requires: Vec<Requirement>) -> Scenario {
        Scenario {
            name: "interpreter".into(),
            dir: PathBuf::from("scenarios/interpreter"),
            description: String::new(),
            vm: Default::default(),
            modules: vec![],
            expect: vec![],
            plan: kloop_protocol::Plan {
                scenario: "interpreter".into(),
                requires,
                steps: vec![],
            },
        }
    }

    #[test]
    fn unsupported_requirements() {
        let ev = RunEvidence {
            unsupported: Some((
                Requirement::JitOptional,
                "writing 0: EINVAL\n(CONFIG_BPF_JIT_ALWAYS_ON=y)".into(),
            )),
            ..Default::default()
        };
        let s = unsupported_verdict(
            &scenario(vec![Requirement::Btf, Requirement::JitOptional]),
            &ev,
        )
        .unwrap();
        assert_eq!(
            s,
            Verdict::Skipped(
                "jit-optional: writing 0: EINVAL; (CONFIG_BPF_JIT_ALWAYS_ON=y)".into()
            )
        );
        assert_eq!(
            s.headline(),
            "SKIPPED (jit-optional: writing 0: EINVAL; (CONFIG_BPF_JIT_ALWAYS_ON=y))"
        );
        assert!(!s.fails_run());
        // The guest claiming a requirement the plan never asked for is a bug.
        let f = unsupported_verdict(&scenario(vec![Requirement::Btf]), &ev).unwrap();
        assert!(matches!(&f, Verdict::Failed(m) if m.contains("does not require it")));
        assert!(unsupported_verdict(&scenario(vec![]), &RunEvidence::default()).is_none());
        assert_eq!(
            requirement_name(Requirement::FtraceInstances),
            "ftrace-instances"
        );
        assert_eq!(one_line(&"x".repeat(500)).chars().count(), 401);
    }
}
