//! `kill -9` of `cargo xtask validate` at any moment loses nothing (issue
//! 28): `validate --source linux-source-6.12 --patch P --scenario basic`
//! with a one-line patch, its candidate build removed from the kernel cache
//! before each kill so that every run builds it again (incrementally, in
//! the patched tree's output directory, through ccache), is killed with
//! SIGKILL at a seeded random moment (the build, the A/B's trials, the
//! reports) within the length of an undisturbed run (timed after a warm-up
//! run; a draw that falls after the run ended is said and not counted),
//! then run again to the end. The rerun must conclude as the
//! undisturbed run did (exit status, the A/B's classes from `ab.json`),
//! and every finished kernel in the cache must be whole (its `kernel.toml`
//! reads and its `bzImage` hashes to the recorded sha256).
//!
//! It runs on the user's kernel cache (the pristine source and the
//! unpatched build must be there: `cargo xtask kernels build --source
//! linux-source-6.12`) and is slow (a rebuild per kill):
//!
//! ```text
//! KLOOP_VALIDATE_KILLS=30 cargo test -p xtask --test validate_kills -- --ignored --nocapture
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use kloop_test_support::workspace_root;
use sha2::{Digest, Sha256};

/// A one-line change that compiles to the same behaviour: the candidate
/// is a real, different build of the same source.
const PATCH: &str = "\
--- a/kernel/events/core.c
+++ b/kernel/events/core.c
@@ -1,3 +1,4 @@
+/* kloop validate kill test: a comment, built as a candidate */
 // SPDX-License-Identifier: GPL-2.0
 /*
  * Performance events core code:
";

fn cache_root() -> PathBuf {
    std::env::var_os("KLOOP_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kloop")
        })
}

fn validate(patch: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xtask"));
    c.args([
        "validate",
        "--source",
        "linux-source-6.12",
        "--scenario",
        "basic",
    ])
    .arg("--patch")
    .arg(patch)
    // The baseline's trial runs each time: a reused one would leave
    // the A/B's first half out of the kill window.
    .arg("--rerun-baseline")
    .current_dir(workspace_root())
    .env("KLOOP_PROGRESS", "plain")
    .stdin(Stdio::null());
    c
}

/// Removes the finished candidate builds (those whose record carries the
/// patch's sha256, whatever its path was), so the next run builds it again.
fn remove_candidate() {
    let sha = hex::encode(Sha256::digest(PATCH.as_bytes()));
    let dir = cache_root().join("build/kernels");
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let record = std::fs::read_to_string(e.path().join("kernel.toml")).unwrap_or_default();
        if record.contains(&sha) {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
}

/// The run's conclusion: its exit status and the A/B's classes, read from
/// the `ab.json` of the run directory it announced.
fn conclusion(stdout: &str, code: i32) -> (i32, String) {
    let dir = stdout.lines().find_map(|l| {
        l.split_once("artefacts in ")
            .map(|(_, d)| PathBuf::from(d.trim()))
    });
    let classes = dir
        .and_then(|d| std::fs::read_to_string(d.join("ab.json")).ok())
        .and_then(|t| serde_json::from_str::<Vec<serde_json::Value>>(&t).ok())
        .map(|v| {
            v.iter()
                .map(|o| format!("{}={}", o["scenario"], o["class"]))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("(no ab.json)\n{stdout}"));
    (code, classes)
}

fn run_to_end(patch: &Path) -> (i32, String) {
    let out = validate(patch).output().expect("running xtask");
    conclusion(
        &String::from_utf8_lossy(&out.stdout),
        out.status.code().unwrap_or(-1),
    )
}

/// Finished kernels whose record does not read or whose image does not
/// hash to it.
fn damaged_builds() -> Vec<String> {
    let mut bad = Vec::new();
    for e in std::fs::read_dir(cache_root().join("build/kernels"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = e.path();
        if dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue; // a build's temporary directory, never looked up
        }
        let record: Option<toml::Value> = std::fs::read_to_string(dir.join("kernel.toml"))
            .ok()
            .and_then(|t| toml::from_str(&t).ok());
        let want = record
            .as_ref()
            .and_then(|r| r.get("image_sha256"))
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let have = std::fs::File::open(dir.join("bzImage")).ok().map(|mut f| {
            let mut h = Sha256::new();
            std::io::copy(&mut f, &mut h).unwrap();
            hex::encode(h.finalize())
        });
        if want.is_none() || want != have {
            bad.push(format!(
                "{}: record {want:?}, image {have:?}",
                dir.display()
            ));
        }
    }
    bad
}

#[test]
#[ignore = "slow tier: a kernel rebuild per kill; see the module docs"]
fn validate_killed_at_random_moments_loses_nothing() {
    let n: usize = std::env::var("KLOOP_VALIDATE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut moments = kloop_test_support::KillMoments::from_env();
    let seed = moments.seed;
    println!("validate kills: seed {seed} (KLOOP_KILL_SEED={seed} replays it), {n} kills");
    let dir = tempfile::tempdir().unwrap();
    let patch = dir.path().join("comment.patch");
    std::fs::write(&patch, PATCH).unwrap();

    // A first run makes what every later run finds (the agent, the pins'
    // saved VMs, the baseline's reused trials); the second, undisturbed
    // like every rerun after it, is the reference and the length the kill
    // moments are drawn from, so that they land inside a run.
    remove_candidate();
    let warm_up = run_to_end(&patch);
    assert_eq!(warm_up.0, 0, "the warm-up run: {}", warm_up.1);
    remove_candidate();
    let started = Instant::now();
    let reference = run_to_end(&patch);
    let undisturbed = started.elapsed();
    assert_eq!(reference.0, 0, "the undisturbed run: {}", reference.1);
    println!(
        "validate kills: undisturbed run {:.0} s (candidate built): {}",
        undisturbed.as_secs_f64(),
        reference.1
    );
    // A draw can still land after a run that went faster than the
    // reference: it is not a kill, said so and not counted.
    let (mut landed, mut draws) = (0, 0);
    while landed < n {
        draws += 1;
        assert!(
            draws <= 3 * n,
            "{draws} draws gave only {landed} kills: the runs end long before {undisturbed:?}"
        );
        let i = landed;
        let at = moments.next(undisturbed);
        remove_candidate();
        let err = dir.path().join("killed.err");
        let killed = kloop_test_support::kill_after(
            validate(&patch)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&err).unwrap()),
            at,
        );
        if !killed {
            println!(
                "validate kills: draw {draws}: the run ended before {:.1} s; not a kill",
                at.as_secs_f64()
            );
            continue;
        }
        landed += 1;
        let doing: String = kloop_test_support::last_status(&err)
            .as_deref()
            .unwrap_or("(before its first status line)")
            .chars()
            .take(90)
            .collect();
        let rerun = run_to_end(&patch);
        let bad = damaged_builds();
        println!(
            "validate kills: #{i:<2} SIGKILL at {:>5.1} s while `{doing}` → rerun exit {}, {}; damaged builds: {}",
            at.as_secs_f64(),
            rerun.0,
            rerun.1,
            bad.len()
        );
        assert_eq!(rerun, reference, "kill #{i} at {at:?} while {doing}");
        assert!(bad.is_empty(), "kill #{i} at {at:?}: {bad:#?}");
    }
    println!("validate kills: {landed} kills in {draws} draws");
    remove_candidate();
}
