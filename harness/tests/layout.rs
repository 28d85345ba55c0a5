//! The rooms import only downwards: `ci/module-cycles.py` finds no import
//! cycle between the modules of any crate (the guest's layers, the
//! library's rooms, the focused crates under `crates/`), at the depth of
//! their folders. And every test target is in a CI tier.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::path::Path;
use std::process::Command;

#[test]
fn no_module_imports_another_in_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut srcs = vec![root.join("guest/src"), root.join("harness/src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            srcs.push(src);
        }
    }
    let out = Command::new("python3")
        .arg(root.join("ci/module-cycles.py"))
        .args(["--depth", "2"])
        .args(&srcs)
        .output()
        .expect("running python3 ci/module-cycles.py (install python3: ci/setup.sh does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import cycles:\n{text}");
    assert_eq!(
        text.matches("no cycle").count(),
        srcs.len(),
        "every crate checked:\n{text}"
    );
}

/// Every test target is in exactly one CI tier (`ci/test-tiers.txt`), so
/// CI's jobs, which run the tiers by name, cannot skip a new test file.
#[test]
fn every_test_target_has_a_ci_tier() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg(root.join("ci/test-tiers.py"))
        .arg("check")
        // The cargo that runs this test lists the targets (`cargo metadata`).
        .env("CARGO", env!("CARGO"))
        .output()
        .expect("running python3 ci/test-tiers.py (install python3: ci/setup.sh does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ci/test-tiers.py check:\n{text}");
}

/// The judge does no I/O because it cannot: its dependencies are the wire
/// types, the record parser and data-format crates, never QEMU, kernels,
/// the filesystem helpers or plotting (a new dependency must be added
/// here on purpose).
#[test]
fn the_judge_depends_on_no_io_crate() {
    assert_depends_only_on(
        "crates/judge",
        &[
            "kloop-protocol",
            "kloop-records",
            "serde",
            "serde_json",
            "thiserror",
            "tracing",
            "toml",
            "hex",
            "similar",
        ],
    );
}

/// Fails unless every `[dependencies]` entry of the crate at `dir` is in
/// `allowed`.
fn assert_depends_only_on(dir: &str, allowed: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap())
            .unwrap();
    let deps: Vec<&str> = manifest["dependencies"]
        .as_table()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let extra: Vec<&&str> = deps.iter().filter(|d| !allowed.contains(d)).collect();
    assert!(extra.is_empty(), "{dir} depends on {extra:?}");
}

/// Architecture invariant: `check-perf-data`, a tool for production hosts,
/// needs kloop's parser, the judge's ledger and a perf.data reader, never
/// QEMU, kernel builds or the harness.
#[test]
fn perf_data_depends_on_the_parser_the_judge_and_its_reader_only() {
    assert_depends_only_on(
        "crates/perf-data",
        &[
            "kloop-protocol",
            "kloop-records",
            "kloop-judge",
            "linux-perf-data",
            "serde",
            "thiserror",
        ],
    );
}

/// Architecture invariant: `kloop-mutate` makes mutants from text (the
/// operators, their schemata, the C source they read): no kernel builds,
/// no processes, no file I/O, so it needs no crate of kloop's and only
/// pure-computation ones (diffs made and applied in memory).
#[test]
fn mutate_depends_on_text_crates_only() {
    assert_depends_only_on("crates/mutate", &["serde", "similar", "diffy", "thiserror"]);
}

/// Architecture invariant: nothing under `crates/` depends on the harness
/// (`kloop`) or the xtask: the focused crates are the ground floor, and
/// what the xtask alone shows (its terminal view) lives in the xtask.
#[test]
fn no_ground_floor_crate_depends_on_the_floors_above() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let manifest_value: toml::Value = toml::from_str(&text).unwrap();
        for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = manifest_value.get(table).and_then(|t| t.as_table()) else {
                continue;
            };
            for up in ["kloop", "xtask"] {
                assert!(
                    !deps.contains_key(up),
                    "{} depends on {up} ({table}): a back arrow",
                    manifest.display()
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 7,
        "only {checked} crates under crates/ were checked"
    );
}

/// `kernels/known-issues.toml` parses and names only pins, rules and
/// scenarios that exist.
#[test]
fn the_committed_ledger_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let layout = kloop::run::suite::Layout::from_root(&root);
    let ledger = kloop::run::suite::load_ledger(&layout).unwrap();
    assert!(ledger.path.is_some(), "kernels/known-issues.toml exists");
    assert!(!ledger.issues.is_empty());
}
