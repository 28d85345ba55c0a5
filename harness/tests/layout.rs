//! The rooms import only downwards: `ci/module-cycles.py` finds no import
//! cycle between the modules of any crate (the guest's layers, the
//! library's rooms, the focused crates under `crates/`), at the depth of
//! their folders.

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
