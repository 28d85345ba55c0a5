//! Faults a user meets through the CLI, driven through the built `xtask`
//! binary (`CARGO_BIN_EXE_xtask`) on a real kernel (pin 6.1, the fastest
//! to boot): QEMU missing, two `vm-test` runs at once, SIGINT and SIGTERM
//! during boot and during a trial, and a reproducer of a known bug. The
//! faults injected through the library are `harness/tests/faults.rs`.
//!
//! The tests take turns (`--test-threads 1` unless given: each watches its
//! own runs' QEMU processes, and the machine has few cores). Every test
//! prints a `fault-table:` line.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kloop::run::suite::{self, EnvOptions, Selection};
use kloop::run::trial::Verdict;
use kloop::workspace::Layout;
use kloop_qemu::accel::{AccelChoice, AccelDecision};
use kloop_qemu::Deadlines;
use kloop_test_support::{
    alive, qemu_children, qemu_guests, read_proc, said_hello, socket_dir, Proc,
};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

const PIN: &str = "6.1";
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

fn xtask() -> Result<PathBuf, Failed> {
    Ok(PathBuf::from(env!("CARGO_BIN_EXE_xtask")))
}

/// The accelerator the runs will get, decided as theirs is (and the agent
/// built and the pin's kernel cached first, so that runs started together
/// start alike).
fn ctx() -> Result<&'static AccelDecision, Failed> {
    static ACCEL: OnceLock<Result<AccelDecision, String>> = OnceLock::new();
    ACCEL
        .get_or_init(|| {
            let layout = Layout::from_root(kloop::workspace::workspace_root());
            let sel = Selection {
                kernels: vec![PIN.into()],
                scenarios: vec!["basic".into()],
                ..Selection::default()
            };
            let planned = suite::plan(&layout, &sel).map_err(|e| e.to_string())?;
            let kernels: Vec<_> = planned.into_iter().map(|t| t.kernel).collect();
            let accel = std::env::var("KLOOP_ACCEL")
                .unwrap_or_else(|_| "auto".into())
                .parse::<AccelChoice>()?;
            let opts = EnvOptions {
                accel,
                ..EnvOptions::default()
            };
            let env = suite::prepare_env(&layout, &opts, &kernels)
                .map_err(|e| format!("preparing the VM environment: {e}"))?;
            Ok(env.accel.clone())
        })
        .as_ref()
        .map_err(|e| Failed::from(e.clone()))
}

fn table(fault: &str, injected: &str, verdict: &Verdict, cleanup: &str, time: String) {
    eprintln!(
        "fault-table: {fault} | {injected} | {} | {cleanup} | {time}",
        verdict.label()
    );
}

fn expect_contains(msg: &str, needles: &[&str]) -> TestResult {
    for n in needles {
        ensure!(msg.contains(n), "message lacks {n:?}:\n{msg}");
    }
    Ok(())
}

fn qemu_missing() -> TestResult {
    let xtask = xtask()?;
    // (what, environment variable set, what the error must say)
    let cases = [
        (
            "KLOOP_QEMU=/nonexistent",
            ("KLOOP_QEMU", "/nonexistent"),
            "KLOOP_QEMU=/nonexistent does not exist",
        ),
        (
            "empty PATH",
            ("PATH", ""),
            "qemu-system-x86_64 is not on PATH",
        ),
    ];
    for (what, (var, value), says) in cases {
        let t = Instant::now();
        let out = Command::new(&xtask)
            .args(["vm-test", "--kernel", PIN, "--scenario", "basic"])
            .env_remove("KLOOP_QEMU")
            .env(var, value)
            .output()
            .map_err(|e| format!("running xtask: {e}"))?;
        let secs = t.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2),
            "{what}: expected exit 2 (setup error), got {}\n{stderr}",
            out.status
        );
        expect_contains(
            &stderr,
            &[says, "apt-get install qemu-system-x86", "KLOOP_QEMU"],
        )
        .map_err(|e| Failed::from(format!("{what}: {}", e.message().unwrap_or(""))))?;
        table(
            &format!("QEMU missing ({what})"),
            "xtask vm-test with that environment",
            &Verdict::Infrastructure(String::new()),
            "exit 2 before any VM or run work",
            format!("{secs:.2} s"),
        );
        eprintln!("    {}", stderr.trim());
    }
    Ok(())
}

// ---------------------------------------------------------------- xtask runs

/// A running `xtask vm-test`, its stdout collected by a thread.
struct XtaskRun {
    child: Child,
    stdout: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl XtaskRun {
    fn spawn(xtask: &Path) -> Result<XtaskRun, Failed> {
        let mut cmd = Command::new(xtask);
        cmd.args(["vm-test", "--kernel", PIN, "--scenario", "basic"])
            .current_dir(kloop::workspace::workspace_root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group, like a foreground job: a group signal
            // stands in for Ctrl-C at a terminal.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| format!("spawning xtask: {e}"))?;
        let out = child.stdout.take().unwrap();
        let stdout = Arc::new(Mutex::new(String::new()));
        let s2 = stdout.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut s = s2.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Ok(XtaskRun {
            child,
            stdout,
            reader: Some(reader),
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// The run directory it announced.
    fn run_dir(&self) -> Option<PathBuf> {
        self.stdout().lines().find_map(|l| {
            l.split_once("artefacts in ")
                .map(|(_, d)| PathBuf::from(d.trim()))
        })
    }

    /// Waits for it to exit; returns exit code and full stdout.
    fn wait(mut self, limit: Duration) -> Result<(Option<i32>, String), Failed> {
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().map_err(|e| e.to_string())? {
                break s;
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(
                    format!("xtask still running after {limit:?}:\n{}", self.stdout()).into(),
                );
            }
            std::thread::sleep(POLL);
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Ok((status.code(), self.stdout()))
    }
}

impl Drop for XtaskRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `until` every 10 ms for at most `limit`.
fn wait_for<T>(limit: Duration, mut until: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = until() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn results_jsonl(run_dir: &Path) -> Result<Vec<serde_json::Value>, Failed> {
    let text = std::fs::read_to_string(run_dir.join("results.jsonl"))
        .map_err(|e| format!("{}/results.jsonl: {e}", run_dir.display()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| Failed::from(e.to_string())))
        .collect()
}

fn two_runs_at_once() -> TestResult {
    let xtask = xtask()?;
    ctx()?; // agent built and kernel cached, so both runs start alike
    let t = Instant::now();
    let runs = [XtaskRun::spawn(&xtask)?, XtaskRun::spawn(&xtask)?];
    // Watch both runs' QEMUs to compare their paths.
    let mut seen: Vec<Proc> = Vec::new();
    let both_done = wait_for(Duration::from_secs(300), || {
        for r in &runs {
            for q in qemu_guests(r.pid()) {
                if !seen.iter().any(|s| s.pid == q.pid) {
                    seen.push(q);
                }
            }
        }
        runs.iter()
            .all(|r| read_proc(r.pid()).is_none_or(|p| p.state == 'Z'))
            .then_some(())
    });
    ensure!(both_done.is_some(), "the two runs did not finish in 300 s");
    let mut dirs = Vec::new();
    for r in runs {
        let pid = r.pid();
        let (code, out) = r.wait(Duration::from_secs(10))?;
        ensure!(code == Some(0), "run {pid} exited {code:?}:\n{out}");
        ensure!(
            out.contains(&format!("{PIN}/basic ... ok")),
            "run {pid}:\n{out}"
        );
        let dir = out
            .lines()
            .find_map(|l| {
                l.split_once("artefacts in ")
                    .map(|(_, d)| PathBuf::from(d.trim()))
            })
            .ok_or("no run directory announced")?;
        let rs = results_jsonl(&dir)?;
        ensure!(
            rs.len() == 1 && rs[0]["verdict"]["class"] == "ok",
            "{}: {rs:?}",
            dir.display()
        );
        dirs.push(dir);
    }
    let secs = t.elapsed().as_secs_f64();
    ensure!(dirs[0] != dirs[1], "both runs used {}", dirs[0].display());
    // One trial QEMU per run; a boot that saves the shared saved VM (its
    // console in the cache's saved-vms/) may come on top, made by one run
    // while the other waits on its lock: never two of them.
    let saving = |q: &Proc| {
        q.cmdline
            .iter()
            .any(|a| a.contains("/saved-vms/") && a.contains("/boot/console.log"))
    };
    let trials = seen.iter().filter(|q| !saving(q)).count();
    let saves = seen.iter().filter(|q| saving(q)).count();
    ensure!(
        trials == 2 && saves <= 1,
        "expected two trial QEMUs and at most one saving boot, saw {seen:?}"
    );
    let sockets: BTreeSet<_> = seen.iter().filter_map(|q| socket_dir(&q.cmdline)).collect();
    ensure!(
        sockets.len() == seen.len(),
        "socket directories collide: {seen:?}"
    );
    for d in &sockets {
        ensure!(!d.exists(), "socket directory {} left behind", d.display());
    }
    table(
        "two vm-test runs at once",
        "target/debug/xtask vm-test --kernel 6.1 --scenario basic, twice in parallel",
        &Verdict::Ok,
        "both exit 0; distinct run dirs and socket dirs; socket dirs removed; a missing saved VM made once",
        format!("{secs:.1} s for both"),
    );
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Boot,
    Trial,
}

fn interrupt(sig: libc::c_int, phase: Phase) -> TestResult {
    let xtask = xtask()?;
    ctx()?;
    let run = XtaskRun::spawn(&xtask)?;
    let pid = run.pid();
    let qemu = wait_for(Duration::from_secs(120), || {
        qemu_guests(pid).into_iter().next()
    })
    .ok_or_else(|| format!("no QEMU started within 120 s:\n{}", run.stdout()))?;
    let run_dir = wait_for(Duration::from_secs(5), || run.run_dir())
        .ok_or("xtask did not announce its run directory")?;
    let data = run_dir.join(PIN).join("basic").join("data.bin");
    let has_hello = || std::fs::read(&data).is_ok_and(|b| said_hello(&b));
    if let Phase::Trial = phase {
        wait_for(Duration::from_secs(60), || has_hello().then_some(()))
            .ok_or("the agent never said hello")?;
    }
    let sockets = socket_dir(&qemu.cmdline).ok_or("no socket dir in QEMU's command line")?;
    let hello_before = has_hello();
    let sent = Instant::now();
    // SIGINT to the process group, as a terminal's Ctrl-C; SIGTERM to the
    // process, as kill(1) or a CI runner.
    let target = if sig == libc::SIGINT { -pid } else { pid };
    // SAFETY: plain kill(2) of our own child (group).
    unsafe { libc::kill(target, sig) };
    match phase {
        Phase::Boot => ensure!(
            !hello_before,
            "the agent said hello before the signal: this run did not test the boot phase"
        ),
        Phase::Trial => ensure!(hello_before, "signal sent before the hello"),
    }
    // An interrupt kills the VM at once (no QMP quit): it must be gone
    // well before the deadline that would otherwise have ended this phase.
    let deadlines = Deadlines::for_accel(ctx()?.accel());
    let limit = match phase {
        Phase::Boot => deadlines.boot,
        Phase::Trial => deadlines.silence,
    };
    let gone = wait_for(limit, || {
        (!alive(qemu.pid) && !sockets.exists()).then(Instant::now)
    });
    let Some(gone_at) = gone else {
        return Err(format!(
            "{limit:?} after the signal: QEMU pid {} alive: {}, socket dir {} exists: {}",
            qemu.pid,
            alive(qemu.pid),
            sockets.display(),
            sockets.exists()
        )
        .into());
    };
    let (code, out) = run.wait(Duration::from_secs(30))?;
    let exited = sent.elapsed().as_secs_f64();
    ensure!(
        code.is_some_and(|c| c != 0),
        "xtask exited {code:?} after the signal:\n{out}"
    );
    ensure!(
        out.contains(&format!("{PIN}/basic ... INTERRUPTED")),
        "no INTERRUPTED trial line:\n{out}"
    );
    let rs = results_jsonl(&run_dir)?;
    ensure!(
        rs.len() == 1 && rs[0]["verdict"]["class"] == "interrupted",
        "results.jsonl: {rs:?}"
    );
    let msg = rs[0]["verdict"]["message"].as_str().unwrap_or("");
    let during = match phase {
        Phase::Boot => "during boot",
        Phase::Trial => "during the trial",
    };
    expect_contains(msg, &[during, "VM killed"])?;
    let left = qemu_children(pid);
    ensure!(left.is_empty(), "QEMU left: {left:?}");
    let name = if sig == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    table(
        &format!("{name} {during}"),
        &format!(
            "{name} to xtask vm-test's {}",
            if sig == libc::SIGINT {
                "process group (Ctrl-C)"
            } else {
                "pid"
            }
        ),
        &Verdict::Interrupted(String::new()),
        &format!("QEMU gone and socket dir removed {:.2} s after the signal; results.jsonl interrupted; exit {}", gone_at.duration_since(sent).as_secs_f64(), code.unwrap_or(-1)),
        format!("xtask exited {exited:.2} s after the signal"),
    );
    Ok(())
}

/// `repro` of a known-bug trial: the directory boots with QEMU alone (no
/// kloop process involved), and the standard-library decoder it ships finds
/// the malformed records kloop's parser found (pin 6.1's
/// `ksymbol-bpf-event-header-size-accumulates` on `many-listeners`).
fn repro_shows_known_bug() -> TestResult {
    let xtask = xtask()?;
    ctx()?;
    let out = Command::new(&xtask)
        .args(["vm-test", "--kernel", PIN, "--scenario", "many-listeners"])
        .output()
        .map_err(|e| format!("running xtask: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        stdout.contains(&format!("{PIN}/many-listeners ... KNOWN")),
        "expected the known bug on {PIN}/many-listeners:\n{stdout}"
    );
    let run = stdout
        .lines()
        .rev()
        .find_map(|l| l.split_once("reports: ").map(|(_, d)| d.trim().to_string()))
        .ok_or("no run directory named")?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let repro = dir.path().join("repro");
    let made = Command::new(&xtask)
        .args(["repro", &format!("{run}/{PIN}/many-listeners"), "--out"])
        .arg(&repro)
        .output()
        .map_err(|e| format!("running xtask repro: {e}"))?;
    ensure!(
        made.status.success(),
        "repro failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    for f in [
        "bzImage",
        "initramfs.cpio",
        "run.sh",
        "show-records.py",
        "report.txt",
    ] {
        ensure!(repro.join(f).is_file(), "{f} missing in the reproducer");
    }
    let report = std::fs::read_to_string(repro.join("report.txt")).unwrap_or_default();
    ensure!(
        report.contains("[parse]") && report.contains("package sha256"),
        "report.txt lacks the rule or the kernel's provenance:\n{report}"
    );
    // Only QEMU: run.sh from a directory of its own, under a deadline.
    let qemu = kloop_qemu::find_qemu().map_err(|e| e.to_string())?;
    let mut child = Command::new("sh")
        .arg(repro.join("run.sh"))
        .env("QEMU", &qemu)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("running run.sh: {e}"))?;
    let status = wait_for(Duration::from_secs(120), || child.try_wait().ok().flatten());
    if status.is_none() {
        // SAFETY: the group run.sh leads.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
        return Err("run.sh did not finish within 120 s".into());
    }
    let decoded = Command::new("python3")
        .arg(repro.join("show-records.py"))
        .arg(repro.join("data.bin"))
        .output()
        .map_err(|e| format!("running show-records.py: {e}"))?;
    let text = String::from_utf8_lossy(&decoded.stdout);
    ensure!(
        decoded.status.code() == Some(1)
            && text.contains("header.size is")
            && text.contains("KSYMBOL register BPF"),
        "the reproducer's run did not show malformed KSYMBOL records:\n{text}"
    );
    Ok(())
}

/// A tmpfs mounted for one test, unmounted and removed after it.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(options: &str) -> Result<Tmpfs, Failed> {
        let dir = tempfile::Builder::new()
            .prefix("kloop-cache-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&dir)
            .status()
            .map_err(|e| format!("running mount: {e}"))?;
        ensure!(
            status.success(),
            "mount -o {options} at {} failed",
            dir.display()
        );
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A kernel cache that cannot be written, or is too small for a run, is
/// refused before anything is fetched or booted, exit 2, naming the
/// directory, what is free and the next step; nothing is left in it.
fn unwritable_or_full_cache() -> TestResult {
    let xtask = xtask()?;
    let cases = [
        (
            "read-only",
            "ro,size=64m",
            vec![
                "must be writable",
                "set KLOOP_CACHE_DIR to a writable directory",
            ],
        ),
        (
            "too small",
            "size=8m",
            vec![
                "MB free; a run needs up to 268 MB",
                "cargo xtask clean --saved-vms",
            ],
        ),
    ];
    for (what, options, says) in cases {
        let cache = Tmpfs::mount(options)?;
        let t = Instant::now();
        let out = Command::new(&xtask)
            .args(["vm-test", "--kernel", PIN, "--scenario", "basic"])
            .env("KLOOP_CACHE_DIR", &cache.0)
            .output()
            .map_err(|e| format!("running xtask: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2),
            "{what}: expected exit 2, got {}\n{stderr}",
            out.status
        );
        ensure!(
            stderr.contains(&cache.0.display().to_string()),
            "{what}: the message must name the cache: {stderr}"
        );
        let mut needles = says.clone();
        needles.retain(|n| !stderr.contains(n));
        ensure!(needles.is_empty(), "{what}: lacks {needles:?}: {stderr}");
        // A registration as the cache's user (`users/<pid>.lock`) is no
        // entry: it is trusted only while its process holds its lock.
        let left: Vec<_> = walk(&cache.0)
            .into_iter()
            .filter(|p| !p.starts_with(cache.0.join("users")))
            .collect();
        ensure!(left.is_empty(), "{what}: files left in the cache: {left:?}");
        table(
            &format!("kernel cache {what}"),
            &format!("KLOOP_CACHE_DIR on a tmpfs mounted -o {options}"),
            &Verdict::Infrastructure(String::new()),
            "exit 2 before any fetch or VM; no file left in the cache",
            format!("{:.2} s", t.elapsed().as_secs_f64()),
        );
        eprintln!("    {}", stderr.trim());
    }
    Ok(())
}

/// The files under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else {
                vec![p]
            }
        })
        .collect()
}

fn main() {
    let mut args = Arguments::from_args();
    // One test at a time: each watches the QEMU processes of its own runs,
    // and parallel boots on a small machine would stretch the timings the
    // tests bound.
    args.test_threads.get_or_insert(1);
    let trials = vec![
        Trial::test("qemu-missing", qemu_missing),
        // Mounting a tmpfs needs root: elsewhere the test is reported
        // ignored with that reason, and fails under KLOOP_ROOT_TESTS=require
        // (`.ci/run`, which runs as root).
        Trial::ignorable_test(
            "unwritable-or-full-cache",
            || match kloop_test_support::root_only("mounts read-only and tiny tmpfs caches")? {
                Some(reason) => Ok(Completion::ignored_with(reason)),
                None => unwritable_or_full_cache().map(|()| Completion::Completed),
            },
        ),
        Trial::test("two-runs-at-once", two_runs_at_once),
        Trial::test("repro-shows-known-bug", repro_shows_known_bug),
        Trial::test("sigint-during-boot", || {
            interrupt(libc::SIGINT, Phase::Boot)
        }),
        Trial::test("sigint-during-trial", || {
            interrupt(libc::SIGINT, Phase::Trial)
        }),
        Trial::test("sigterm-during-boot", || {
            interrupt(libc::SIGTERM, Phase::Boot)
        }),
        Trial::test("sigterm-during-trial", || {
            interrupt(libc::SIGTERM, Phase::Trial)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
