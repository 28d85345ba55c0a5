//! Load (issue 5): one trial on pin 6.1 carries at least 100,000 records
//! through the channel without loss or stall, and how fast.
//!
//! The plan: snapshot-kallsyms, open-listeners (TID|TIME|CPU, ksymbol +
//! bpf_event, 64 pages), `storm` of `funcs32` (32 JITed functions: 33
//! records per load, 33 per unload) for 1,600 cycles draining every 4,
//! wait-unloaded, drain. The kernel is the cached 6.1 image with no snapshot
//! to compare: the verdict is the invariants (LOST included) and the agent's
//! own success. Prints one `load:` line.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::time::{Duration, Instant};

use kloop::run::bench::{Throughput, TrialArtefacts};
use kloop::run::suite::{self, EnvOptions, Selection};
use kloop::run::trial::{KernelUnderTest, TrialEnv, Verdict};
use kloop::scenario::Scenario;
use kloop::workspace::Layout;
use kloop_qemu::Deadlines;

const PIN: &str = "6.1";
const CYCLES: u32 = 1600;
const DRAIN_EVERY: u32 = 4;

#[test]
fn storm_carries_100k_records() {
    let (env, kernel, scenario) = storm_on_cached_pin();

    let started = Instant::now();
    let result = kloop::run::trial::run_trial(&env, &kernel, &scenario);
    let trial_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "load: trial {} in {trial_secs:.1} s ({}), artefacts {}",
        result.verdict.label(),
        env.accel.reason,
        result.artefacts.display()
    );
    assert_eq!(
        result.verdict,
        Verdict::Ok,
        "{:?}",
        result.verdict.message()
    );

    // Read the artefacts back, as a user would.
    let trial = TrialArtefacts::read(&result.artefacts).expect("the trial's artefacts");
    let tp = Throughput::of(&trial).expect("every stream parses");
    assert_eq!(tp.lost, 0, "LOST records in the stream");

    // Host analysis alone, timed (run_trial already did it once).
    let full = &trial.evidence;
    let t0 = Instant::now();
    let analysis = kloop::judge::check::analyse(full);
    let analyse_secs = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let normalised = kloop::judge::normalise::normalise(full, &analysis);
    let normalise_secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "load: host analyse {analyse_secs:.2} s, normalise {normalise_secs:.2} s ({} lines), {} violation(s)",
        normalised.lines().count(),
        analysis.violations.len()
    );

    println!(
        "load: {} records, {} bytes in {:.2} s of channel time (guest time of the \
         storm and final drain steps), {:.0} records/s, {:.2} MB/s; trial wall {trial_secs:.1} s",
        tp.records,
        tp.bytes,
        tp.secs,
        tp.records_per_sec(),
        tp.mb_per_sec()
    );
    assert!(tp.records >= 100_000, "only {} records", tp.records);
}

/// The 6.1 environment with a long total deadline, the cached pin image as a
/// local kernel (no snapshot to compare) and the storm scenario built on the
/// plan's `basic` trial: everything the measured trial needs.
fn storm_on_cached_pin() -> (TrialEnv, KernelUnderTest, Scenario) {
    let layout = Layout::from_root(kloop::workspace::workspace_root());
    let sel = Selection {
        kernels: vec![PIN.into()],
        scenarios: vec!["basic".into()],
        ..Selection::default()
    };
    let t = suite::plan(&layout, &sel)
        .expect("planning")
        .into_iter()
        .next()
        .expect("a 6.1/basic trial");
    let accel = std::env::var("KLOOP_ACCEL")
        .unwrap_or_else(|_| "auto".into())
        .parse()
        .expect("KLOOP_ACCEL");
    let opts = EnvOptions {
        accel,
        ..EnvOptions::default()
    };
    let mut env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&t.kernel))
        .expect("preparing the VM environment");
    let KernelUnderTest::Pin(pin) = &t.kernel else {
        panic!("{PIN} is not a pin")
    };
    let image = env.cache.ensure_image(pin, &env.fetch).expect("6.1 image");
    let kernel = KernelUnderTest::Image(kloop::run::trial::LocalKernel::from_pin_image(
        image,
        env.cache.ensure_config(pin, &env.fetch).ok(),
    ));
    let d = Deadlines::for_accel(env.accel.accel());
    env.deadlines = Some(Deadlines {
        total: d.total.max(Duration::from_secs(1200)),
        ..d
    });

    let scenario = kloop::run::bench::storm_scenario(
        &t.scenario,
        "load-storm",
        &env.run_dir.join("no-snapshots"),
        CYCLES,
        DRAIN_EVERY,
    );
    (env, kernel, scenario)
}
