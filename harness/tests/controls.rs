//! Slow tier (issue 57, item 4): the checks' positive controls through the
//! real path on linux-source-6.12 built with `--checks memory,locking,ub`
//! (the build `cargo xtask kernels build --source linux-source-6.12 --checks
//! memory,locking,ub` makes, with kloop's control modules from
//! `kernels/controls/`): each control boots the kernel, inserts its module,
//! and must come out FAILED with its rule and a report naming the module's
//! own function; booted with `kmemleak=off`, the kmemleak control must say
//! the memory check is blind instead of passing. It builds a kernel (tens
//! of minutes cold on two cores, seconds once cached) and boots five VMs,
//! so it is `#[ignore]`d in the default `cargo test`:
//!
//! ```text
//! cargo test -p kloop --test controls -- --ignored --test-threads 1
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use kloop::run::controls::{self, ControlsError};
use kloop::run::suite::{self, EnvOptions};
use kloop::run::trial::{KernelUnderTest, LocalKernel};
use kloop::workspace::Layout;
use kloop_kernels::build::{self, BuildRequest, Check, SourceSpec};
use kloop_kernels::{Catalog, KernelCache};

fn layout() -> Layout {
    Layout::from_root(kloop::workspace::workspace_root())
}

/// The checked 6.12 kernel as `kernels build --checks memory,locking,ub`
/// asks for it.
fn checked_kernel() -> KernelUnderTest {
    let layout = layout();
    let req = BuildRequest {
        fragments: Check::ALL
            .iter()
            .map(|c| c.fragment(&layout.kernels()))
            .collect(),
        controls: Some(layout.kernels().join("controls")),
        ..BuildRequest::new(
            SourceSpec::parse("linux-source-6.12", &layout.kernels()).expect("source pin"),
            &layout.kernels(),
        )
    };
    let cache = KernelCache::default_location().expect("cache");
    let k = build::build(&cache, &req, &mut |e| {
        if let build::BuildEvent::Phase(p) = e {
            eprintln!("build: {p}");
        }
    })
    .unwrap_or_else(|e| panic!("building the checked linux-source-6.12: {e}"));
    assert_eq!(k.controls().len(), 4, "{:?}", k.controls());
    let catalog = Catalog::load(&layout.kernels()).expect("catalog");
    KernelUnderTest::Image(LocalKernel::built(&k, None, &catalog))
}

fn run_controls(
    kernel: &KernelUnderTest,
    append: &[&str],
) -> Result<Vec<controls::ControlOutcome>, ControlsError> {
    let layout = layout();
    let opts = EnvOptions {
        accel: std::env::var("KLOOP_ACCEL")
            .unwrap_or_else(|_| "auto".into())
            .parse()
            .expect("KLOOP_ACCEL"),
        extra_cmdline: append.iter().map(|s| (*s).to_string()).collect(),
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(kernel)).expect("env");
    // Asked afresh: not what an earlier run kept.
    let _ = std::fs::remove_dir_all(env.cache.root().join("controls").join(kernel.id()));
    controls::run(&env, kernel, &layout.kernels().join("controls"), &|o, _| {
        eprintln!("{}", o.line());
    })
}

#[test]
#[ignore = "slow tier: builds the checked linux-source-6.12; see the module docs"]
fn every_control_comes_out_failed_with_its_rule_and_own_frames() {
    let kernel = checked_kernel();
    let outcomes = run_controls(&kernel, &[]).unwrap_or_else(|e| panic!("{e}"));
    let rules: Vec<&str> = outcomes.iter().map(|o| o.control.as_str()).collect();
    assert_eq!(rules, ["kasan", "kmemleak", "lockdep", "ubsan"]);
    for (o, c) in outcomes.iter().zip(controls::CONTROLS) {
        assert!(
            o.verdict.starts_with("FAILED"),
            "{}: {}",
            o.control,
            o.verdict
        );
        let r = o.report.as_ref().expect("a passed control has its report");
        assert_eq!(r.check, c.rule);
        assert!(
            c.functions
                .iter()
                .any(|f| r.frames.iter().any(|fr| fr == f)),
            "{}: frames {:?} name none of {:?}",
            o.control,
            r.frames,
            c.functions
        );
    }
}

#[test]
#[ignore = "slow tier: builds the checked linux-source-6.12; see the module docs"]
fn with_kmemleak_off_the_memory_check_is_blind() {
    let kernel = checked_kernel();
    let Err(ControlsError::Blind(lines)) = run_controls(&kernel, &["kmemleak=off"]) else {
        panic!("with kmemleak=off the controls passed");
    };
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(
            "the memory check is blind on this kernel: the kmemleak control \
             (kloop_control_kmemleak) came out "
        ),
        "{}",
        lines[0]
    );
    // And why: kmemleak's file refuses the scan (kmemleak_write() in
    // mm/kmemleak.c answers EPERM once kmemleak is off).
    assert!(lines[0].contains("could not be scanned"), "{}", lines[0]);
}
