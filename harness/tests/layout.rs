//! The rooms import only downwards: `ci/module-cycles.py` finds no import
//! cycle between the modules of any crate (the guest's layers, the
//! library's rooms, the focused crates under `crates/`), at the depth of
//! their folders. And every test target is in a CI tier.

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
