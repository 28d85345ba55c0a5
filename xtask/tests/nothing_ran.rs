//! A run in which every trial was skipped tested nothing and is not a
//! success unless the user says so (issue 28): 5.10's Debian config has no
//! CONFIG_FAULT_INJECTION, so `alloc-failures` is skipped by the config
//! preflight before any VM starts. Needs pin 5.10's package (the kernel
//! cache or the mirror): the `packages` tier.

use kloop_test_support::workspace_root;

fn xtask(args: &[&str]) -> (i32, String) {
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &workspace_root(), args)
}

#[test]
fn a_run_that_skipped_every_trial_fails_unless_allowed() {
    let args = [
        "vm-test",
        "--kernel",
        "5.10",
        "--scenario",
        "alloc-failures",
    ];
    let (code, out) = xtask(&args);
    assert!(
        out.contains("5.10/alloc-failures ... SKIPPED (CONFIG_FAULT_INJECTION not set"),
        "{out}"
    );
    assert!(out.contains("0 passed, 0 failed, 1 skipped"), "{out}");
    assert!(
        out.contains("kloop: no trial ran: every trial was SKIPPED"),
        "{out}"
    );
    assert_eq!(code, 1, "{out}");
    let mut allowed = args.to_vec();
    allowed.push("--allow-skipped");
    let (code, out) = xtask(&allowed);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("no trial ran"), "{out}");
}
