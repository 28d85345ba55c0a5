//! Slow tier (issue 48): `cargo xtask audit --fresh` of the header-size
//! bug over one real series, 6.12 (35 Debian cloud builds, the ledger's
//! bisected bounds: last affected 6.12.111-1, first fixed
//! 6.12.113-1~deb12u1), booting every build it asks, then the same audit
//! without `--fresh`, which must boot nothing (every (build × reproducer)
//! answer is kept). Downloads the builds it boots when they
//! are not cached (about 8, 20–60 MB each); run it with
//!
//! ```text
//! cargo test -p xtask --test audit -- --ignored --nocapture
//! ```

use std::process::Command;

use kloop_test_support::workspace_root;

const ID: &str = "ksymbol-bpf-event-header-size-accumulates";

fn audit(fresh: bool) -> (serde_json::Value, String) {
    let mut args = vec!["audit", "--series", "6.12", ID];
    if fresh {
        args.push("--fresh");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(&args)
        .current_dir(workspace_root())
        .output()
        .expect("running xtask");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "audit exit {:?}", out.status.code());
    let run = stdout
        .lines()
        .last()
        .and_then(|l| l.rsplit("; ").next())
        .expect("the closing line names audit.json")
        .to_string();
    let json = serde_json::from_str(&std::fs::read_to_string(&run).unwrap()).unwrap();
    (json, stdout)
}

#[test]
#[ignore = "slow tier: boots Debian 6.12 builds (downloads those not cached)"]
fn the_612_series_is_fixed_from_6_12_113() {
    let (a, stdout) = audit(true);
    let boots = a["boots"].as_array().unwrap();
    assert!(
        boots.iter().all(|b| !b["dir"].is_null()),
        "--fresh boots every build it asks"
    );
    let s = &a["series"][0];
    assert_eq!(s["series"], "6.12");
    let builds: Vec<&str> = s["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["version"].as_str().unwrap())
        .collect();
    let f = &s["findings"]["ksymbol-bpf-event-header-size-accumulates"];
    let change = &f["change"];
    assert_eq!(change["from"]["answer"], "affected");
    assert_eq!(change["to"]["answer"], "clean");
    let first = builds[change["first_after"].as_u64().unwrap() as usize];
    let last = builds[change["last_before"].as_u64().unwrap() as usize];
    assert_eq!(
        (last, first),
        ("6.12.111-1", "6.12.113-1~deb12u1"),
        "the ledger's bounds"
    );
    let probed = f["probed"].as_object().unwrap().len();
    let bound = 2 + (builds.len() as f64).log2().ceil() as usize;
    assert!(
        probed <= bound,
        "{probed} builds asked, O(log n) is {bound}"
    );
    assert!(stdout.contains("first fixed"), "the table");
    // The KCIDB document beside it: one test per build asked.
    let dir = std::path::Path::new(a["run_dir"].as_str().unwrap());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("kcidb.json")).unwrap()).unwrap();
    assert_eq!(doc["tests"].as_array().unwrap().len(), probed);

    // Warm: the same question again boots nothing.
    let (again, _) = audit(false);
    let booted = again["boots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| !b["dir"].is_null())
        .count();
    assert_eq!(booted, 0, "every answer was kept");
    assert_eq!(again["series"], a["series"], "the same answer");
}
