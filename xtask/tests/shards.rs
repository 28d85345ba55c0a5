//! Slow tier (issue 26): a small matrix run as two shards plus `merge`
//! and as one run gives the same verdict for every trial, and the merged
//! run directory holds every trial's artefacts and the whole run's reports.
//! Boots two pins (saved VMs make it about a minute under TCG):
//!
//! ```text
//! cargo test -p xtask --test shards -- --ignored --nocapture
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop_test_support::workspace_root;

/// Runs xtask; its exit code and what it printed.
fn xtask(args: &[&str]) -> (i32, String) {
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &workspace_root(), args)
}

fn run_dir_of(text: &str) -> PathBuf {
    let line = text
        .lines()
        .find(|l| l.contains("reports: "))
        .expect("a run names its reports directory");
    PathBuf::from(line.rsplit("reports: ").next().unwrap().trim())
}

fn verdicts(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                v["verdict"]["class"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[ignore = "slow tier: boots two pins; see the module docs"]
fn two_shards_and_a_merge_equal_one_run() {
    let matrix = [
        "--kernel",
        "6.1",
        "--kernel",
        "7.3",
        "--scenario",
        "basic",
        "--scenario",
        "subprogs",
        "--scenario",
        "interpreter",
    ];
    let mut dirs = Vec::new();
    for k in ["1/2", "2/2"] {
        let mut args = vec!["vm-test", "--shard", k];
        args.extend(matrix);
        let (_, text) = xtask(&args);
        assert!(
            text.contains(&format!("kloop: shard {k}: 3 of 6 trial(s)")),
            "{text}"
        );
        dirs.push(run_dir_of(&text));
    }
    let out = tempfile::tempdir().unwrap();
    let merged = out.path().join("merged");
    let mut args = vec![
        "merge".to_string(),
        "--out".into(),
        merged.display().to_string(),
    ];
    args.extend(dirs.iter().map(|d| d.display().to_string()));
    let (_, text) = xtask(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(text.contains("kloop: merged 2 shard(s)"), "{text}");
    let mut one = vec!["vm-test"];
    one.extend(matrix);
    let (_, text) = xtask(&one);
    let single = verdicts(&run_dir_of(&text));
    let joined = verdicts(&merged);
    assert_eq!(single.len(), 6);
    assert_eq!(joined, single);
    for id in single.keys() {
        assert!(
            merged.join(id).join("console.log").is_file(),
            "{id}'s artefacts"
        );
    }
    for f in ["junit.xml", "summary.md"] {
        assert!(merged.join(f).is_file(), "{f}");
    }
    // A shard missing is named.
    let (code, text) = xtask(&[
        "merge",
        "--out",
        &out.path().join("x").display().to_string(),
        &dirs[0].display().to_string(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("shard 2/2 is missing"), "{text}");
}
