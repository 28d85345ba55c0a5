//! Slow tier (issue 12): `cargo xtask bisect --tree` over a small git
//! history made from Debian's `linux-source-6.12` — eight commits, one of
//! which plants `kernels/patches/subprog-ksymbol-len.patch` — must name the
//! planted commit, and leave the repository as it was. The first step
//! builds a kernel cold (≈10 min on two cores); run it with
//!
//! ```text
//! cargo test -p xtask --test bisect_tree -- --ignored --nocapture
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use kloop_test_support::workspace_root;

fn xtask(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("running xtask");
    eprintln!(
        "$ xtask {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "kloop test")
        .env("GIT_AUTHOR_EMAIL", "kloop@localhost")
        .env("GIT_COMMITTER_NAME", "kloop test")
        .env("GIT_COMMITTER_EMAIL", "kloop@localhost")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The unpacked pristine tree of the source pin (unpacking it if needed).
fn pristine() -> PathBuf {
    let pin: toml::Value = toml::from_str(
        &std::fs::read_to_string(workspace_root().join("kernels/sources/linux-source-6.12.toml"))
            .unwrap(),
    )
    .unwrap();
    let sha = pin["deb_sha256"].as_str().unwrap();
    let cache = kloop_kernels::KernelCache::default_location().unwrap();
    let dir = cache
        .root()
        .join("build/src")
        .join(&sha[..16])
        .join("linux-source-6.12");
    if !dir.join("Makefile").is_file() {
        assert!(
            xtask(&["kernels", "build", "--source", "linux-source-6.12"])
                .status
                .success()
        );
    }
    dir
}

#[test]
#[ignore = "slow tier: builds linux-source-6.12 from a git history; see the module docs"]
fn bisect_tree_names_the_planted_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("linux");
    let status = Command::new("cp")
        .arg("-a")
        .arg(pristine())
        .arg(&repo)
        .status()
        .unwrap();
    assert!(status.success());
    git(&repo, &["init", "-q"]);
    // Debian's source package ignores everything at the top level
    // (`/*` in its .gitignore): force the whole tree in.
    git(&repo, &["add", "-A", "-f", "."]);
    git(
        &repo,
        &["commit", "-q", "-m", "import linux-source-6.12 6.12.117"],
    );
    let patch = workspace_root().join("kernels/patches/subprog-ksymbol-len.patch");
    let mut planted = String::new();
    for n in 1..=7 {
        if n == 4 {
            let ok = Command::new("patch")
                .args(["-p1", "-s", "-i"])
                .arg(&patch)
                .current_dir(&repo)
                .status()
                .unwrap()
                .success();
            assert!(ok);
            git(
                &repo,
                &[
                    "commit",
                    "-q",
                    "-a",
                    "-m",
                    "perf/bpf: emit subprogram KSYMBOLs from one length",
                ],
            );
            planted = git(&repo, &["rev-parse", "--short=12", "HEAD"]);
        } else {
            // Harmless commits: a comment in a file the kernel compiles,
            // so steps rebuild something, and a note.
            let f = repo.join("kernel/bpf/disasm.c");
            let mut text = std::fs::read_to_string(&f).unwrap();
            text.push_str(&format!("/* kloop bisect test commit {n} */\n"));
            std::fs::write(&f, text).unwrap();
            git(
                &repo,
                &["commit", "-q", "-a", "-m", &format!("bpf: comment {n}")],
            );
        }
    }
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let started = std::time::Instant::now();
    let out = xtask(&[
        "bisect",
        "--tree",
        repo.to_str().unwrap(),
        "--old",
        "HEAD~7",
        "--new",
        "HEAD",
        "--scenario",
        "subprogs",
        "--predicate",
        "rule:load-symbols",
    ]);
    eprintln!("bisect --tree: {:.0} s", started.elapsed().as_secs_f64());
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("first new commit: "))
        .unwrap_or_else(|| panic!("no answer in:\n{stdout}"));
    assert!(line.contains(&planted), "{line} (planted {planted})");
    assert!(line.contains("one length"), "{line}");
    // The user's repository is as it was: same HEAD, clean, one worktree,
    // no bisection in progress.
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert_eq!(git(&repo, &["worktree", "list"]).lines().count(), 1);
    assert!(!repo.join(".git/BISECT_LOG").exists());
}
