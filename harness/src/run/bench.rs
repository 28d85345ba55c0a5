//! Measuring kloop itself: where a trial's time goes, and how fast the data
//! channel carries records. `cargo xtask bench` prints these; the load test
//! (`harness/tests/load.rs`) asserts on the same storm at a larger size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop_protocol::{ListenerSpec, Message, Plan, Step};

use crate::judge::evidence::RunEvidence;

use crate::run::suite::{self, PlannedTrial};
use crate::run::trial::{KernelUnderTest, LocalKernel, TrialEnv, TrialResult};
use crate::run::validate::Timing;
use crate::scenario::Scenario;

/// `PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU`, the recording
/// listeners' trailer in every scenario.
const TID_TIME_CPU: u64 = kloop_records::PERF_SAMPLE_TID
    | kloop_records::PERF_SAMPLE_TIME
    | kloop_records::PERF_SAMPLE_CPU;

/// A scenario (built here, not read from `scenarios/`) that pushes
/// `cycles` load/unload cycles of the 32-function fixture through one
/// listener per CPU, draining every `drain_every` cycles: 66 records per
/// cycle. `base` supplies the VM options; `dir` is where its (never
/// compared) snapshots would live, so keep it out of the source tree.
pub fn storm_scenario(
    base: &Scenario,
    name: &str,
    dir: &Path,
    cycles: u32,
    drain_every: u32,
) -> Scenario {
    let steps = vec![
        Step::SnapshotKallsyms,
        Step::OpenListeners {
            listener: ListenerSpec {
                sample_type: TID_TIME_CPU,
                ksymbol: true,
                bpf_event: true,
                ring_pages: 64,
                scope: Default::default(),
                inherit: false,
                cpus: None,
                side_band: Vec::new(),
                disabled: false,
                backward: false,
                poll: false,
                poll_watermark: 0,
                sample_id_all: true,
            },
        },
        Step::Storm {
            fixture: "funcs32".into(),
            program: "kloop_funcs32".into(),
            cycles,
            drain_every,
            lookup: false,
        },
        Step::WaitUnloaded { timeout_ms: 5000 },
        Step::Drain,
    ];
    Scenario {
        name: name.into(),
        dir: dir.to_path_buf(),
        description: format!("channel storm: {cycles} cycles of funcs32"),
        plan: Plan {
            scenario: name.into(),
            requires: Vec::new(),
            params: Vec::new(),
            steps,
        },
        ..base.clone()
    }
}

/// Why a measurement could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BenchError {
    /// A file the measurement reads could not be read.
    #[error("reading {path}: {why}")]
    Read { path: PathBuf, why: String },
    /// A file holds something else than the measurement needs.
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    /// A listener's stream did not parse.
    #[error("records of listener {listener}: {why}")]
    Records { listener: u32, why: String },
    /// A process the bench runs could not be run, or left nothing to read.
    #[error("{0}")]
    Process(String),
    /// The storm trial's messages lack a step the throughput is timed by.
    #[error("{0}")]
    Storm(&'static str),
}

/// A finished trial read back from its artefacts, as a user would:
/// `messages.jsonl` and every listener's `records-<n>.bin`.
pub struct TrialArtefacts {
    pub messages: Vec<Message>,
    pub evidence: RunEvidence,
}

impl TrialArtefacts {
    pub fn read(dir: &Path) -> Result<TrialArtefacts, BenchError> {
        let path = dir.join("messages.jsonl");
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Read {
            path: path.clone(),
            why: e.to_string(),
        })?;
        let messages: Vec<Message> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .map_err(|e| BenchError::Invalid {
                path: path.clone(),
                why: e.to_string(),
            })?;
        let listeners = RunEvidence::from_messages(&messages, BTreeMap::new()).listeners;
        let mut streams = BTreeMap::new();
        for l in &listeners {
            let path = dir.join(format!("records-{}.bin", l.index));
            streams.insert(l.index, std::fs::read(&path).unwrap_or_default());
        }
        let evidence = RunEvidence::from_messages(&messages, streams);
        Ok(TrialArtefacts { messages, evidence })
    }
}

/// What a storm trial carried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    pub records: usize,
    pub bytes: usize,
    pub lost: u64,
    /// Guest time of the storm step and the final drain (every write to the
    /// port included).
    pub secs: f64,
}

impl Throughput {
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.secs
    }
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }

    /// Counts the records of a finished storm trial (every stream must
    /// parse) and times its storm and last steps.
    pub fn of(trial: &TrialArtefacts) -> Result<Throughput, BenchError> {
        let (mut records, mut bytes, mut lost) = (0, 0, 0u64);
        for l in &trial.evidence.listeners {
            let raw = trial
                .evidence
                .streams
                .get(&l.index)
                .map_or(&[][..], Vec::as_slice);
            let recs = kloop_records::parse_stream(l, raw).map_err(|e| BenchError::Records {
                listener: l.index,
                why: format!("{e:?}"),
            })?;
            lost += recs
                .iter()
                .map(|r| match r.body {
                    kloop_records::RecordBody::Lost { lost, .. } => lost,
                    _ => 0,
                })
                .sum::<u64>();
            records += recs.len();
            bytes += raw.len();
        }
        let messages = &trial.messages;
        // Steps are numbered in plan order; the storm and the last drain
        // are the ones that write records to the port.
        let mut storm_index = None;
        let mut last_index = 0;
        for m in messages {
            if let Message::StepStart { index, what } = m {
                if what.contains("\"op\":\"storm\"") {
                    storm_index = Some(*index);
                }
                last_index = last_index.max(*index);
            }
        }
        let storm_index = storm_index.ok_or(BenchError::Storm("no storm step in the messages"))?;
        let step_ns = |i: u32| {
            messages.iter().find_map(|m| match m {
                // The channel's time: a drain's final read of
                // /proc/kallsyms is not the storm's.
                Message::StepDone {
                    index,
                    elapsed_ns,
                    kallsyms_ns,
                    ..
                } if *index == i => Some(elapsed_ns.saturating_sub(*kallsyms_ns)),
                _ => None,
            })
        };
        let ns = step_ns(storm_index).ok_or(BenchError::Storm("the storm step never finished"))?
            + step_ns(last_index).unwrap_or(0);
        Ok(Throughput {
            records,
            bytes,
            lost,
            secs: ns as f64 / 1e9,
        })
    }
}

/// Median and range of a handful of timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} ({:.2}-{:.2})", self.median, self.min, self.max)
    }
}

/// Median and range of each phase over a set of results of one trial.
#[derive(Debug, Clone, Default)]
pub struct PhaseSpreads {
    pub before_kernel_clock: Option<Spread>,
    pub kernel_to_hello: Option<Spread>,
    pub agent: Option<Spread>,
    pub shutdown: Option<Spread>,
    pub host_checks: Option<Spread>,
    pub prepare: Option<Spread>,
    pub qemu_cpu_to_hello: Option<Spread>,
    pub qemu_cpu_agent: Option<Spread>,
}

impl PhaseSpreads {
    pub fn of(results: &[TrialResult]) -> PhaseSpreads {
        let phases: Vec<_> = results.iter().filter_map(|r| r.phases).collect();
        let col = |f: &dyn Fn(&crate::run::trial::Phases) -> Option<f64>| {
            let v: Vec<f64> = phases.iter().filter_map(f).collect();
            Spread::of(&v)
        };
        PhaseSpreads {
            before_kernel_clock: col(&|p| p.before_kernel_clock()),
            kernel_to_hello: col(&|p| p.guest_uptime_at_hello),
            agent: col(&|p| p.agent),
            shutdown: col(&|p| p.shutdown),
            host_checks: col(&|p| Some(p.host_checks)),
            prepare: col(&|p| Some(p.prepare)),
            qemu_cpu_to_hello: col(&|p| p.qemu_cpu_to_hello),
            qemu_cpu_agent: col(&|p| p.qemu_cpu_agent),
        }
    }
}

/// One `vm-test` run over the matrix, read back from its `results.jsonl`
/// (as a user's script would): where its trials' time went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatrixRun {
    pub trials: usize,
    /// Trials restored from a saved VM (`saved_vm.restored`).
    pub restored: usize,
    /// Restores whose saved VM this run made (their boot and save are in
    /// the trial's `prepare`).
    pub saved_now: usize,
    /// Sums over the trials, seconds.
    pub prepare: f64,
    pub to_hello: f64,
    pub agent: f64,
    pub shutdown: f64,
    pub host_checks: f64,
    pub trial_wall: f64,
    /// QEMU's CPU seconds (user + sys) from its start to the agent's done,
    /// summed over the trials: what the guests cost, which a busy host
    /// stretches much less than wall time.
    pub qemu_cpu: f64,
    /// Per pin: host-measured QEMU start → hello of the restored trials.
    pub restore_to_hello: BTreeMap<String, Vec<f64>>,
    /// Per scenario: the agent phase summed over pins.
    pub agent_by_scenario: BTreeMap<String, f64>,
}

impl MatrixRun {
    /// Reads `<run_dir>/results.jsonl`.
    pub fn read(run_dir: &Path) -> Result<MatrixRun, BenchError> {
        let path = run_dir.join("results.jsonl");
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Read {
            path: path.clone(),
            why: e.to_string(),
        })?;
        let mut run = MatrixRun::default();
        for (n, line) in text.lines().enumerate() {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| BenchError::Invalid {
                    path: path.clone(),
                    why: format!("line {}: {e}", n + 1),
                })?;
            run.add(&v);
        }
        Ok(run)
    }

    fn add(&mut self, v: &serde_json::Value) {
        let num = |p: &serde_json::Value, k: &str| p.get(k).and_then(|x| x.as_f64());
        self.trials += 1;
        self.trial_wall += num(v, "wall_secs").unwrap_or(0.0);
        let used = |k: &str| {
            v.get("saved_vm")
                .and_then(|s| s.get(k))
                .and_then(|b| b.as_bool())
                .unwrap_or(false)
        };
        let restored = used("restored");
        if restored {
            self.restored += 1;
            if used("made_now") {
                self.saved_now += 1;
            }
        }
        let Some(p) = v.get("phases").filter(|p| p.is_object()) else {
            return;
        };
        let kernel = v.get("kernel").and_then(|k| k.as_str()).unwrap_or("?");
        let scenario = v.get("scenario").and_then(|k| k.as_str()).unwrap_or("?");
        self.prepare += num(p, "prepare").unwrap_or(0.0);
        let to_hello = num(p, "to_hello").unwrap_or(0.0);
        self.to_hello += to_hello;
        let agent = num(p, "agent").unwrap_or(0.0);
        self.agent += agent;
        *self
            .agent_by_scenario
            .entry(scenario.to_string())
            .or_default() += agent;
        self.shutdown += num(p, "shutdown").unwrap_or(0.0);
        self.host_checks += num(p, "host_checks").unwrap_or(0.0);
        self.qemu_cpu +=
            num(p, "qemu_cpu_to_hello").unwrap_or(0.0) + num(p, "qemu_cpu_agent").unwrap_or(0.0);
        if restored {
            self.restore_to_hello
                .entry(kernel.to_string())
                .or_default()
                .push(to_hello);
        }
    }
}

/// One trial's figures over `cargo xtask bench`'s runs of it.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub id: String,
    /// QEMU start (or restore) to the agent's hello, seconds.
    pub hello: Option<Spread>,
    pub wall: Option<Spread>,
    pub rss_mib: Option<Spread>,
    /// Runs whose verdict fails a run.
    pub failed: usize,
    pub phases: PhaseSpreads,
}

impl BenchRow {
    /// Runs `t` `runs` times (`jobs` at once) and takes the spreads of its
    /// figures.
    pub fn measure(env: &TrialEnv, t: &PlannedTrial, runs: usize, jobs: usize) -> BenchRow {
        let repeated = vec![t.clone(); runs];
        let results = suite::run_all(env, &repeated, suite::Parallel::jobs(jobs), &|_| {});
        BenchRow::of(t.id(), &results)
    }

    /// The figures of `results`, runs of one trial.
    pub fn of(id: String, results: &[TrialResult]) -> BenchRow {
        let hello: Vec<f64> = results
            .iter()
            .filter_map(|r| r.boot_to_hello_secs)
            .collect();
        let wall: Vec<f64> = results.iter().map(|r| r.wall_secs).collect();
        let rss_mib: Vec<f64> = results
            .iter()
            .filter_map(|r| r.qemu_peak_rss_kib)
            .map(|k| k as f64 / 1024.0)
            .collect();
        BenchRow {
            id,
            hello: Spread::of(&hello),
            wall: Spread::of(&wall),
            rss_mib: Spread::of(&rss_mib),
            failed: results.iter().filter(|r| r.verdict.fails_run()).count(),
            phases: PhaseSpreads::of(results),
        }
    }
}

/// What the channel bench's storm came to.
#[derive(Debug, Clone)]
pub enum ChannelOutcome {
    /// The storm passed; its throughput on `kernel`.
    Measured { kernel: String, tp: Throughput },
    /// The storm passed but its artefacts could not be read.
    Unreadable(BenchError),
    /// The storm trial did not pass: its verdict.
    TrialFailed(crate::run::trial::Verdict),
}

/// The data channel's throughput: a storm of `cycles` programs on `t`'s
/// kernel, its pin's image without snapshots (the storm has none, its
/// verdict is the invariants alone). `None`: the trial gave no result.
pub fn channel(
    env: &TrialEnv,
    t: &PlannedTrial,
    cycles: u32,
) -> Result<Option<ChannelOutcome>, kloop_kernels::KernelError> {
    let storm = storm_scenario(
        &t.scenario,
        "bench-channel",
        &env.run_dir.join("no-snapshots"),
        cycles,
        4,
    );
    let kernel = match &t.kernel {
        KernelUnderTest::Pin(pin) => KernelUnderTest::Image(LocalKernel::from_pin_image(
            env.cache.ensure_image(pin, &env.fetch)?,
            env.cache.ensure_config(pin, &env.fetch).ok(),
        )),
        other => other.clone(),
    };
    let trial = PlannedTrial {
        scenario: storm,
        kernel,
    };
    let results = suite::run_all(env, &[trial], suite::Parallel::jobs(1), &|_| {});
    Ok(results.first().map(|r| {
        if r.verdict != crate::run::trial::Verdict::Ok {
            return ChannelOutcome::TrialFailed(r.verdict.clone());
        }
        match TrialArtefacts::read(&r.artefacts).and_then(|a| Throughput::of(&a)) {
            Ok(tp) => ChannelOutcome::Measured {
                kernel: t.kernel.id(),
                tp,
            },
            Err(e) => ChannelOutcome::Unreadable(e),
        }
    }))
}

/// How `bench --matrix` runs `vm-test` over the whole matrix.
#[derive(Debug, Clone)]
pub struct MatrixBench {
    /// The xtask binary to run `vm-test` with (the bench's own).
    pub exe: PathBuf,
    /// Where the runs' directories appear.
    pub runs_root: PathBuf,
    pub accel: String,
    /// `--jobs N`, or `None` for vm-test's own default (one VM per core,
    /// more while the host idles).
    pub jobs: Option<usize>,
    /// `--append` words for the kernel command line.
    pub append: Vec<String>,
    /// `--arch`: the guests' architecture (vm-test's default: x86-64).
    pub arch: kloop_protocol::Arch,
}

/// One whole-matrix round: its label, wall seconds, exit code (`None`:
/// a signal) and the run it left, or why that could not be read.
#[derive(Debug, Clone)]
pub struct MatrixRound {
    /// The round's name, with the guests' architecture when it is not
    /// x86-64's (`saved VMs, warm (arm64)`).
    pub label: String,
    pub secs: f64,
    pub exit: Option<i32>,
    pub run: Result<MatrixRun, BenchError>,
}

/// The three rounds `bench --matrix` runs: cold boots, saved VMs made on
/// the way, saved VMs warm. The cold/saved ratio is what counts on a noisy
/// machine: both runs meet the same host.
pub const MATRIX_ROUNDS: [(&str, &str); 3] = [
    ("cold boots", "cold"),
    ("saved VMs, first", "saved"),
    ("saved VMs, warm", "saved"),
];

impl MatrixBench {
    /// Runs `vm-test` over the whole matrix once with `--boot boot`, as a
    /// user runs it, and reads the run it left back from its directory.
    pub fn round(&self, label: &'static str, boot: &str) -> std::io::Result<MatrixRound> {
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.args(["vm-test", "--accel", &self.accel, "--boot", boot]);
        cmd.args(["--arch", self.arch.as_str()]);
        let label = match self.arch {
            kloop_protocol::Arch::X86_64 => label.to_string(),
            arch => format!("{label} ({arch})"),
        };
        if let Some(jobs) = self.jobs {
            cmd.arg("--jobs").arg(jobs.to_string());
        }
        for w in &self.append {
            cmd.arg("--append").arg(w);
        }
        let done = Finished::run(&mut cmd, &self.runs_root)?;
        Ok(MatrixRound {
            label,
            secs: done.secs,
            exit: done.exit,
            run: done.run_dir("vm-test").and_then(|d| MatrixRun::read(&d)),
        })
    }
}

/// How `bench --fresh` times a new user's first run: the committed tree
/// cloned into a scratch directory, with an empty kloop cache
/// (`KLOOP_CACHE_DIR`) and a target directory of its own, then the
/// README's main job: `ci/setup.sh`, the host build (`cargo build -p
/// xtask`, which `cargo xtask` runs first) and `vm-test` over the whole
/// matrix, which builds the agent, fetches and verifies the pins' kernels,
/// probes the accelerator and makes every saved VM. Cargo's registry
/// (`CARGO_HOME`) is shared: crate downloads are not timed, and packages
/// `ci/setup.sh` finds installed take no time.
#[derive(Debug, Clone)]
pub struct FreshBench {
    /// The checkout whose committed HEAD is cloned.
    pub workspace: PathBuf,
    /// Where the clone and its cache go (removed by the caller).
    pub scratch: PathBuf,
}

/// One fresh round: each part's wall seconds, `vm-test`'s exit code and its
/// own phase split (`phases.json`) with the trials it ran.
#[derive(Debug, Clone)]
pub struct FreshRound {
    pub setup_secs: f64,
    pub host_build_secs: f64,
    pub vm_test_secs: f64,
    pub exit: Option<i32>,
    pub phases: Result<crate::run::phases::Phases, BenchError>,
    pub run: Result<MatrixRun, BenchError>,
}

impl FreshRound {
    /// What the user waited for: set-up, host build and the matrix.
    pub fn total_secs(&self) -> f64 {
        self.setup_secs + self.host_build_secs + self.vm_test_secs
    }
}

impl FreshBench {
    /// Clones, sets up, builds and runs the matrix once.
    pub fn round(&self) -> Result<FreshRound, BenchError> {
        let clone = self.scratch.join("kloop");
        let cache = self.scratch.join("cache");
        let step = |what: &str, cmd: &mut std::process::Command| -> Result<f64, BenchError> {
            let started = std::time::Instant::now();
            let out = cmd
                .stdout(std::process::Stdio::null())
                .output()
                .map_err(|e| BenchError::Process(format!("{what}: {e}")))?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(5).collect();
                return Err(BenchError::Process(format!(
                    "{what} failed ({}): {}",
                    out.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                )));
            }
            Ok(started.elapsed().as_secs_f64())
        };
        step(
            "git clone",
            std::process::Command::new("git")
                .args(["clone", "--quiet"])
                .arg(&self.workspace)
                .arg(&clone),
        )?;
        let in_clone = |program: &str| {
            let mut c = std::process::Command::new(program);
            c.current_dir(&clone)
                .env_remove("CARGO_TARGET_DIR")
                .env(kloop_kernels::CACHE_DIR_ENV, &cache);
            c
        };
        let setup_secs = step("ci/setup.sh", in_clone("bash").arg("ci/setup.sh"))?;
        let host_build_secs = step(
            "cargo build -p xtask",
            in_clone("cargo").args(["build", "-p", "xtask"]),
        )?;
        let runs_root = clone.join("target/kloop/runs");
        let mut vm_test = in_clone(&clone.join("target/debug/xtask").to_string_lossy());
        vm_test.arg("vm-test");
        let done = Finished::run(&mut vm_test, &runs_root)
            .map_err(|e| BenchError::Process(format!("vm-test: {e}")))?;
        let dir = done.run_dir("vm-test");
        Ok(FreshRound {
            setup_secs,
            host_build_secs,
            vm_test_secs: done.secs,
            exit: done.exit,
            phases: dir.clone().and_then(|d| {
                crate::run::phases::Phases::read(&d).map_err(|e| BenchError::Read {
                    path: d.join(crate::run::phases::Phases::FILE),
                    why: e.to_string(),
                })
            }),
            run: dir.and_then(|d| MatrixRun::read(&d)),
        })
    }
}

/// A kloop command the bench ran as a user runs it (its output to
/// nowhere): its wall time seen from outside, its exit code, and the run
/// directory it made, found by its pid (run directories are named
/// `<seconds>-<pid>`).
struct Finished {
    secs: f64,
    exit: Option<i32>,
    pid: u32,
    run_dir: Option<PathBuf>,
    runs_root: PathBuf,
}

impl Finished {
    fn run(cmd: &mut std::process::Command, runs_root: &Path) -> std::io::Result<Finished> {
        let started = std::time::Instant::now();
        let mut child = cmd.stdout(std::process::Stdio::null()).spawn()?;
        let pid = child.id();
        let status = child.wait()?;
        Ok(Finished {
            secs: started.elapsed().as_secs_f64(),
            exit: status.code(),
            pid,
            run_dir: crate::workspace::run_dirs::of_process(runs_root, pid),
            runs_root: runs_root.to_path_buf(),
        })
    }

    /// The run directory, or why there is none (`what`: the command).
    fn run_dir(&self, what: &str) -> Result<PathBuf, BenchError> {
        self.run_dir.clone().ok_or_else(|| {
            BenchError::Process(format!(
                "{what} (pid {}) left no run directory under {} (exit {:?})",
                self.pid,
                self.runs_root.display(),
                self.exit
            ))
        })
    }
}

/// One `validate` of a new one-line patch, run as a user runs it: its
/// wall time seen from outside, its exit code and the timing it left in
/// its run directory.
#[derive(Debug, Clone)]
pub struct ValidateRound {
    pub secs: f64,
    pub exit: Option<i32>,
    pub timing: Result<Timing, BenchError>,
}

/// A one-line patch no earlier run validated: a comment at the top of
/// kernel/events/core.c naming `stamp`, so the candidate is a real
/// incremental rebuild of one file every time.
pub fn one_line_patch(stamp: u128) -> String {
    format!(
        "--- a/kernel/events/core.c\n+++ b/kernel/events/core.c\n@@ -1,3 +1,4 @@\n+/* kloop bench: validate of a new one-line patch, {stamp} */\n // SPDX-License-Identifier: GPL-2.0\n /*\n  * Performance events core code:\n"
    )
}

/// Runs `<exe> validate --source <source> --patch <patch>` and reads its
/// [`Timing`] back from the run directory it made.
pub fn validate_round(
    exe: &Path,
    runs_root: &Path,
    source: &str,
    patch: &Path,
) -> std::io::Result<ValidateRound> {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["validate", "--source", source, "--patch"])
        .arg(patch);
    let done = Finished::run(&mut cmd, runs_root)?;
    Ok(ValidateRound {
        secs: done.secs,
        exit: done.exit,
        timing: done
            .run_dir("validate (a failed build ends it before its A/B)")
            .and_then(|d| validate_timing(&d)),
    })
}

/// The [`Timing`] a `validate` left in its run directory.
pub fn validate_timing(run_dir: &Path) -> Result<Timing, BenchError> {
    let path = run_dir.join(Timing::FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Read {
        path: path.clone(),
        why: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| BenchError::Invalid {
        path,
        why: e.to_string(),
    })
}

/// `check-perf-data` on a big file, run as a user runs it (a process of
/// its own, so its peak memory is its own).
#[derive(Debug, Clone)]
pub struct PerfDataRun {
    pub file_bytes: u64,
    pub secs: f64,
    /// Records read, and KSYMBOL + BPF_EVENT among them.
    pub records: u64,
    pub side_band: u64,
    /// The check process's peak resident memory (`getrusage`'s
    /// `RUSAGE_CHILDREN` after it was reaped: the largest child so far).
    pub max_rss_kib: u64,
    pub exit: Option<i32>,
}

impl PerfDataRun {
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.secs
    }
    pub fn mb_per_sec(&self) -> f64 {
        self.file_bytes as f64 / 1e6 / self.secs
    }
}

/// Runs `<exe> check-perf-data <file> --json` and reads its counts back
/// from its JSON.
pub fn check_perf_data(exe: &Path, file: &Path) -> Result<PerfDataRun, BenchError> {
    let file_bytes = std::fs::metadata(file)
        .map_err(|e| BenchError::Read {
            path: file.to_path_buf(),
            why: e.to_string(),
        })?
        .len();
    let started = std::time::Instant::now();
    let out = std::process::Command::new(exe)
        .arg("check-perf-data")
        .arg(file)
        .arg("--json")
        .output()
        .map_err(|e| BenchError::Process(format!("running {}: {e}", exe.display())))?;
    let secs = started.elapsed().as_secs_f64();
    // SAFETY: getrusage fills the struct it is given.
    let max_rss_kib = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss as u64
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        BenchError::Process(format!(
            "check-perf-data printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    })?;
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    Ok(PerfDataRun {
        file_bytes,
        secs,
        records: n("records"),
        side_band: n("ksymbol") + n("bpf_event"),
        max_rss_kib,
        exit: out.status.code(),
    })
}

/// Where one scenario's agent phase went in a run, summed over its
/// kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSteps {
    pub scenario: String,
    /// Trials that reached the agent.
    pub trials: usize,
    /// Their agent phases (hello to done, host-measured).
    pub agent: f64,
    /// Guest seconds per step kind, the longest first.
    pub steps: Vec<(String, f64)>,
    /// Of the steps' guest seconds, those spent reading `/proc/kallsyms`
    /// (whichever step read it).
    pub kallsyms: f64,
    /// Where the steps' guest CPU time went, summed over the steps that
    /// reported it.
    pub cpu: CpuSplit,
}

/// Guest CPU-seconds of a set of steps: `capacity` is each step's wall
/// time times its online CPUs; `user` and `sys` the agent's (and perf's),
/// `idle` the CPUs' idle time; the rest is the kernel's own threads and
/// interrupts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSplit {
    pub capacity: f64,
    pub user: f64,
    pub sys: f64,
    pub idle: f64,
}

impl CpuSplit {
    fn add(&mut self, secs: f64, cpu: &kloop_protocol::StepCpu) {
        self.capacity += secs * f64::from(cpu.cpus);
        self.user += cpu.user_ns as f64 / 1e9;
        self.sys += cpu.sys_ns as f64 / 1e9;
        self.idle += cpu.idle_ns as f64 / 1e9;
    }

    /// Neither the agent's nor idle: kernel threads, interrupts, softirqs
    /// (never below 0: the idle clock has 10 ms steps).
    pub fn other(&self) -> f64 {
        (self.capacity - self.user - self.sys - self.idle).max(0.0)
    }

    pub fn plus(&self, o: &CpuSplit) -> CpuSplit {
        CpuSplit {
            capacity: self.capacity + o.capacity,
            user: self.user + o.user,
            sys: self.sys + o.sys,
            idle: self.idle + o.idle,
        }
    }
}

/// Every scenario's [`ScenarioSteps`] of the run in `run_dir`, the
/// longest agent phase first.
pub fn agent_steps(run_dir: &Path) -> Result<Vec<ScenarioSteps>, BenchError> {
    let path = run_dir.join("results.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Read {
        path: path.clone(),
        why: e.to_string(),
    })?;
    type Sums = (usize, f64, BTreeMap<String, f64>, f64, CpuSplit);
    let mut by: BTreeMap<String, Sums> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let r: TrialResult = serde_json::from_str(line).map_err(|e| BenchError::Invalid {
            path: path.clone(),
            why: format!("line {}: {e}", n + 1),
        })?;
        let Some(agent) = r.phases.and_then(|p| p.agent) else {
            continue;
        };
        let e = by.entry(r.scenario.clone()).or_default();
        e.0 += 1;
        e.1 += agent;
        for s in &r.steps {
            *e.2.entry(s.op.clone()).or_default() += s.secs;
            e.3 += s.kallsyms_secs;
            if let Some(cpu) = &s.cpu {
                e.4.add(s.secs, cpu);
            }
        }
    }
    let mut out: Vec<ScenarioSteps> = by
        .into_iter()
        .map(|(scenario, (trials, agent, steps, kallsyms, cpu))| {
            let mut steps: Vec<(String, f64)> = steps.into_iter().collect();
            steps.sort_by(|a, b| b.1.total_cmp(&a.1));
            ScenarioSteps {
                scenario,
                trials,
                agent,
                steps,
                kallsyms,
                cpu,
            }
        })
        .collect();
    out.sort_by(|a, b| b.agent.total_cmp(&a.agent));
    Ok(out)
}

/// `bench --perf-data-gib N`: a real recording (`template`, pipe mode)
/// stretched to `gib` GiB in `dir` (kept for the next bench: made only
/// when missing or short), then `check-perf-data` on it in a process of
/// its own (`exe`). `on_note` hears what is being written.
pub fn perf_data(
    exe: &Path,
    template: &Path,
    dir: &Path,
    gib: f64,
    on_note: &mut dyn FnMut(String),
) -> Result<PerfDataRun, BenchError> {
    let target = (gib * (1u64 << 30) as f64) as u64;
    let file = dir.join(format!("perf-data-{gib}gib.pipe.data"));
    if std::fs::metadata(&file).map_or(true, |m| m.len() < target) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::Read {
            path: dir.to_path_buf(),
            why: e.to_string(),
        })?;
        on_note(format!(
            "writing {} from {} …",
            file.display(),
            template.display()
        ));
        let g = crate::perf_data::generate::stretch(template, &file, target).map_err(|e| {
            BenchError::Invalid {
                path: template.to_path_buf(),
                why: e.to_string(),
            }
        })?;
        on_note(format!(
            "{} bytes, {} KSYMBOL/BPF_EVENT records in {} rounds",
            g.bytes, g.side_band_records, g.rounds
        ));
    }
    check_perf_data(exe, &file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_run_sums_phases_and_restores() {
        let lines = [
            serde_json::json!({"kernel": "6.1", "scenario": "basic", "wall_secs": 2.0,
                "saved_vm": {"key": "0123", "made_now": true, "restored": true},
                "phases": {"prepare": 3.0, "to_hello": 0.2, "agent": 1.0, "shutdown": 0.1, "host_checks": 0.05}}),
            serde_json::json!({"kernel": "6.1", "scenario": "overhead", "wall_secs": 9.0,
                "saved_vm": {"key": "4567", "made_now": false, "restored": true},
                "phases": {"prepare": 0.1, "to_hello": 0.3, "agent": 8.0, "shutdown": 0.1, "host_checks": 0.2,
                    "qemu_cpu_to_hello": 0.25, "qemu_cpu_agent": 7.5}}),
            serde_json::json!({"kernel": "5.10", "scenario": "basic", "wall_secs": 3.0,
                "saved_vm": {"key": "89ab", "made_now": false, "restored": false},
                "phases": {"prepare": 0.1, "to_hello": 1.8, "agent": 1.0, "shutdown": 0.1, "host_checks": 0.05}}),
            serde_json::json!({"kernel": "5.10", "scenario": "probes", "wall_secs": 0.0,
                "verdict": {"class": "skipped"}, "phases": null}),
        ];
        let mut run = MatrixRun::default();
        for l in &lines {
            run.add(l);
        }
        assert_eq!((run.trials, run.restored, run.saved_now), (4, 2, 1));
        assert!((run.agent - 10.0).abs() < 1e-9);
        assert!((run.to_hello - 2.3).abs() < 1e-9);
        assert_eq!(run.restore_to_hello["6.1"], vec![0.2, 0.3]);
        assert!(!run.restore_to_hello.contains_key("5.10"));
        assert!((run.agent_by_scenario["overhead"] - 8.0).abs() < 1e-9);
        assert!((run.trial_wall - 14.0).abs() < 1e-9);
        // Only the trial that reported QEMU's CPU time counts.
        assert!((run.qemu_cpu - 7.75).abs() < 1e-9);
    }

    #[test]
    fn spread_median_even_and_odd() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(Spread::of(&[]).is_none());
        assert_eq!(
            Spread::of(&[1.0, 2.0]).unwrap().to_string(),
            "1.50 (1.00-2.00)"
        );
    }

    /// Steps are summed per kind over a scenario's kernels, from the agent
    /// messages' own times; trials that never reached the agent count for
    /// nothing; the longest agent phase comes first.
    #[test]
    fn agent_steps_sum_by_scenario_and_kind() {
        use crate::run::trial::{Phases, StepTime, Verdict};
        use kloop_protocol::Message;
        let msgs = |load_ns: u64| {
            vec![
                Message::StepStart {
                    index: 0,
                    what: r#"{"op":"load","fixture":"basic"}"#.into(),
                },
                Message::StepDone {
                    index: 0,
                    elapsed_ns: load_ns,
                    kallsyms_ns: load_ns / 2,
                    cpu: None,
                },
                Message::StepStart {
                    index: 1,
                    what: r#"{"op":"wait-kallsyms"}"#.into(),
                },
                Message::StepDone {
                    index: 1,
                    elapsed_ns: 2_000_000_000,
                    kallsyms_ns: 0,
                    // Two CPUs for 2 s: 4 CPU-seconds, 1.5 of them idle.
                    cpu: Some(kloop_protocol::StepCpu {
                        user_ns: 1_000_000_000,
                        sys_ns: 500_000_000,
                        idle_ns: 1_500_000_000,
                        cpus: 2,
                    }),
                },
            ]
        };
        let trial = |kernel: &str, scenario: &str, agent: Option<f64>, load_ns: u64| {
            let mut r = TrialResult::for_test(kernel, scenario, Verdict::Ok, "/tmp/x");
            r.phases = agent.map(|a| Phases {
                agent: Some(a),
                ..Phases::default()
            });
            r.steps = StepTime::of_messages(&msgs(load_ns));
            serde_json::to_string(&r).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            trial("6.1", "trampolines", Some(3.0), 500_000_000),
            trial("6.12", "trampolines", Some(4.0), 1_500_000_000),
            trial("6.1", "basic", Some(1.0), 100_000_000),
            trial("5.10", "basic", None, 0),
        ];
        std::fs::write(dir.path().join("results.jsonl"), lines.join("\n")).unwrap();
        let rows = agent_steps(dir.path()).unwrap();
        assert_eq!(rows[0].scenario, "trampolines");
        assert_eq!((rows[0].trials, rows[0].agent), (2, 7.0));
        assert_eq!(rows[0].steps[0].0, "wait-kallsyms");
        assert!((rows[0].steps[0].1 - 4.0).abs() < 1e-9);
        assert!((rows[0].steps[1].1 - 2.0).abs() < 1e-9);
        // Half of each load step was its read of /proc/kallsyms.
        assert!((rows[0].kallsyms - 1.0).abs() < 1e-9);
        // The wait-kallsyms steps' split, twice; the loads reported none.
        let cpu = rows[0].cpu;
        assert!((cpu.capacity - 8.0).abs() < 1e-9);
        assert!((cpu.user - 2.0).abs() < 1e-9 && (cpu.sys - 1.0).abs() < 1e-9);
        assert!((cpu.idle - 3.0).abs() < 1e-9 && (cpu.other() - 2.0).abs() < 1e-9);
        assert_eq!((rows[1].scenario.as_str(), rows[1].trials), ("basic", 1));
        assert!((rows[1].kallsyms - 0.05).abs() < 1e-9);
    }
}
