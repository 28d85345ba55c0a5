//! Two `vm-test`s and a `validate` at once on one kernel cache give the
//! verdicts they give one after the other (issue 28). Both `vm-test`s run
//! pin 6.1's `basic`, so with the pin's saved VMs removed first they race
//! to make the same ones: one makes each, the other waits on its lock
//! (`waiting for the lock on …, held by pid N (…)`) and restores it. The
//! `validate` A/B of `linux-source-6.12` against itself needs its two
//! builds in the cache (a build from a clean cache takes 7–10 minutes, so
//! this is the slow tier):
//!
//! ```text
//! cargo xtask kernels build --source linux-source-6.12   # once
//! cargo test -p xtask --test concurrency -- --ignored --nocapture
//! ```
//!
//! Sequential first, then concurrent; each run's verdicts are read from the
//! files it wrote (`results.jsonl`, `ab.json`), never from its terminal
//! text, and compared class by class. Every run must exit 0, and their run
//! directories must differ.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use kloop_test_support::workspace_root;

const RUNS: [&[&str]; 3] = [
    &[
        "vm-test",
        "--kernel",
        "6.1",
        "--scenario",
        "basic",
        "--scenario",
        "subprogs",
    ],
    &[
        "vm-test",
        "--kernel",
        "6.1",
        "--scenario",
        "basic",
        "--scenario",
        "many-listeners",
    ],
    &[
        "validate",
        "--source",
        "linux-source-6.12",
        "--scenario",
        "basic",
    ],
];

fn xtask(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xtask"));
    c.args(args)
        .current_dir(workspace_root())
        .env("KLOOP_PROGRESS", "plain")
        .stdin(Stdio::null());
    c
}

fn cache_root() -> PathBuf {
    std::env::var_os("KLOOP_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kloop")
        })
}

/// Removes every saved VM of pin 6.1's kernel, so both `vm-test`s have to
/// make them, and returns how many there were.
fn remove_pin_saved_vms() -> usize {
    let catalog = kloop_kernels::Catalog::load(&workspace_root().join("kernels")).unwrap();
    let image = catalog.get("6.1").unwrap().image_sha256.clone();
    let dir = cache_root().join("saved-vms");
    let mut removed = 0;
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let meta = std::fs::read_to_string(e.path().join("meta.json")).unwrap_or_default();
        if meta.contains(&format!("/vmlinux/{image}\"")) {
            std::fs::remove_dir_all(e.path()).unwrap();
            removed += 1;
        }
    }
    removed
}

/// What a run decided, read from its run directory: each trial's verdict
/// class (`results.jsonl`) and, for an A/B, each scenario's class
/// (`ab.json`).
fn verdicts(out: &Output) -> (PathBuf, BTreeMap<String, String>) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The one line a run prints about where it writes; its files are read.
    let dir = stdout
        .lines()
        .find_map(|l| {
            l.split_once("artefacts in ")
                .map(|(_, d)| PathBuf::from(d.trim()))
        })
        .unwrap_or_else(|| panic!("no run directory announced:\n{stdout}"));
    let mut v = BTreeMap::new();
    let results = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    for line in results.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        // The A/B's sides are named after the kernels' ids, which differ
        // between sequential and concurrent runs only by the run: keep the
        // scenario and whether it is the baseline.
        let kernel = r["kernel"].as_str().unwrap();
        let side = if kernel.starts_with("baseline-") {
            "baseline"
        } else {
            kernel
        };
        v.insert(
            format!("{side}/{}", r["scenario"].as_str().unwrap()),
            r["verdict"]["class"].as_str().unwrap().to_string(),
        );
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("ab.json")) {
        let outcomes: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        for o in outcomes {
            v.insert(
                format!("ab/{}", o["scenario"].as_str().unwrap()),
                format!("{}", o["class"]),
            );
        }
    }
    (dir, v)
}

fn check(what: &str, args: &[&str], out: &Output) {
    assert!(
        out.status.success(),
        "{what} `{}` exited {}:\n{}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "slow tier: needs linux-source-6.12 built in the cache; see the module docs"]
fn two_vm_tests_and_a_validate_at_once_agree_with_sequential_runs() {
    let t = Instant::now();
    let mut sequential = Vec::new();
    for args in RUNS {
        let out = xtask(args).output().expect("running xtask");
        check("sequential", args, &out);
        sequential.push(verdicts(&out).1);
    }
    let seq_secs = t.elapsed().as_secs_f64();

    let removed = remove_pin_saved_vms();
    let t = Instant::now();
    let children: Vec<_> = RUNS
        .iter()
        .map(|args| {
            xtask(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting xtask")
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let conc_secs = t.elapsed().as_secs_f64();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut waited = 0;
    for ((args, out), seq) in RUNS.iter().zip(&outs).zip(&sequential) {
        check("concurrent", args, out);
        let (dir, v) = verdicts(out);
        assert_eq!(
            &v,
            seq,
            "`{}` at once with the others decided otherwise than alone",
            args.join(" ")
        );
        assert!(!dirs.contains(&dir), "two runs wrote {}", dir.display());
        dirs.push(dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        waited += stderr.matches("waiting for the lock on").count();
    }
    let made: usize = outs
        .iter()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| l.contains("saved VM") && l.contains(" made: "))
                .count()
        })
        .sum();
    eprintln!(
        "concurrency: sequential {seq_secs:.0} s, concurrent {conc_secs:.0} s; {removed} saved VM(s) of 6.1 removed before, {made} made during the concurrent round, {waited} wait(s) on a lock held by the other run; verdicts equal: {:?}",
        sequential
    );
    assert!(
        !dirs.iter().any(|d| !Path::new(d).is_dir()),
        "a run directory is missing"
    );
}
