//! Slow tier (issue 25): a fix of a known bug, proven end to end. `validate
//! --fix interpreted-prog-ksymbol` builds `linux-source-6.12` without and
//! with the fix (a cold build is ≈10 min on two cores, a cached one nothing),
//! and must print FIXED for both ledger entries in the interpreter scenario
//! and SAME elsewhere, and exit 0; the fix's stand-alone reproducer must
//! reproduce on a pin and not on the fixed build; and a fix whose patch no
//! longer applies (the 6.1 backport on the 6.12 source) is BUILD FAILED
//! with the hunk, exit 3. Run it with
//!
//! ```text
//! cargo test -p xtask --test fix_validation -- --ignored --nocapture
//! ```

use kloop_test_support::workspace_root;

fn xtask(args: &[&str]) -> (i32, String) {
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &workspace_root(), args)
}

#[test]
#[ignore = "slow tier: builds linux-source-6.12 twice (cached after the first run); see the module docs"]
fn the_interpreter_fix_is_fixed_and_changes_nothing_else() {
    let (code, out) = xtask(&[
        "validate",
        "--source",
        "linux-source-6.12",
        "--fix",
        "interpreted-prog-ksymbol",
        "--scenario",
        "interpreter",
        "--scenario",
        "basic",
        "--scenario",
        "subprogs",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "interpreter          FIXED (interpreted-prog-ksymbol-register, interpreted-prog-ksymbol-unregister)"
        ),
        "{out}"
    );
    assert!(out.contains("basic                SAME"), "{out}");
    assert!(out.contains("subprogs             SAME"), "{out}");
    assert!(out.contains("kloop: validate: FIXED:"), "{out}");
}

#[test]
#[ignore = "slow tier: boots the 6.1 pin"]
fn the_reproducer_reproduces_on_an_affected_pin() {
    let (code, out) = xtask(&[
        "repro",
        "--standalone",
        "interpreted-prog-ksymbol-register",
        "--prove",
        "--kernel",
        "6.1",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("reproduces          (must reproduce)"),
        "{out}"
    );
    // Both environments: kloop's guest and the plain init.
    assert!(out.contains("kloop's guest"), "{out}");
    assert!(out.contains("plain init (memlock"), "{out}");
}

#[test]
#[ignore = "slow tier: needs linux-source-6.12 built (cached after the first test)"]
fn a_patch_that_no_longer_applies_is_build_failed_with_the_hunk() {
    let (code, out) = xtask(&[
        "validate",
        "--source",
        "linux-source-6.12",
        "--patch",
        "kernels/fixes/ksymbol-bpf-event-header-size-accumulates/linux-source-6.1.patch",
    ]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("BUILD FAILED"), "{out}");
    assert!(out.contains("Hunk #1 FAILED"), "{out}");
}
