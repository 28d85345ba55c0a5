//! Load (issue 5): one trial on pin 6.1 carries at least 100,000 records
//! through the channel without loss or stall, and how fast.
//!
//! The plan: snapshot-kallsyms, open-listeners (TID|TIME|CPU, ksymbol +
//! bpf_event, 64 pages), `storm` of `funcs32` (32 JITed functions: 33
//! records per load, 33 per unload) for 1,600 cycles draining every 4,
//! wait-unloaded, drain. The kernel is the cached 6.1 image with no snapshot
//! to compare: the verdict is the invariants (LOST included) and the agent's
//! own success. Prints one `load:` line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kloop::evidence::RunEvidence;
use kloop::records;
use kloop::scenario::Scenario;
use kloop::suite::{self, EnvOptions, Layout, Selection};
use kloop::trial::{KernelUnderTest, Verdict};
use kloop::vm::Deadlines;
use kloop_protocol::{ListenerSpec, Message, Plan, Step};

const PIN: &str = "6.1";
const CYCLES: u32 = 1600;
const DRAIN_EVERY: u32 = 4;
/// `PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU`.
const TID_TIME_CPU: u64 =
    records::PERF_SAMPLE_TID | records::PERF_SAMPLE_TIME | records::PERF_SAMPLE_CPU;

#[test]
fn storm_carries_100k_records() {
    let layout = Layout::from_root(kloop::agent::workspace_root());
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
    let kernel = KernelUnderTest::Image {
        path: image,
        snapshot_as: None,
    };
    let d = Deadlines::for_accel(env.accel.accel());
    env.deadlines = Some(Deadlines {
        total: d.total.max(Duration::from_secs(1200)),
        ..d
    });

    let name = "load-storm";
    let steps = vec![
        Step::SnapshotKallsyms,
        Step::OpenListeners {
            listener: ListenerSpec {
                sample_type: TID_TIME_CPU,
                ksymbol: true,
                bpf_event: true,
                ring_pages: 64,
                scope: Default::default(),
            },
        },
        Step::Storm {
            fixture: "funcs32".into(),
            program: "kloop_funcs32".into(),
            cycles: CYCLES,
            drain_every: DRAIN_EVERY,
            lookup: false,
        },
        Step::WaitUnloaded { timeout_ms: 5000 },
        Step::Drain,
    ];
    let scenario = Scenario {
        name: name.into(),
        dir: env.run_dir.join("no-snapshots"),
        description: "load: storm of funcs32 load/unload cycles".into(),
        plan: Plan {
            scenario: name.into(),
            requires: Vec::new(),
            steps,
        },
        ..t.scenario.clone()
    };

    let started = Instant::now();
    let result = kloop::trial::run_trial(&env, &kernel, &scenario);
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
    let dir = &result.artefacts;
    let messages: Vec<Message> = std::fs::read_to_string(dir.join("messages.jsonl"))
        .expect("messages.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a message"))
        .collect();
    let ev = RunEvidence::from_messages(&messages, BTreeMap::new());
    let mut total = 0usize;
    let mut bytes = 0usize;
    let mut lost = 0usize;
    for l in &ev.listeners {
        let path = dir.join(format!("records-{}.bin", l.index));
        let raw = std::fs::read(&path).unwrap_or_default();
        let recs =
            records::parse_stream(l, &raw).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        lost += recs
            .iter()
            .filter(|r| matches!(r.body, records::RecordBody::Lost { .. }))
            .count();
        total += recs.len();
        bytes += raw.len();
    }
    assert_eq!(lost, 0, "LOST records in the stream");

    // Guest time of the storm step (every drain's writes to the port
    // included) plus the final drain step.
    let storm_at = scenario
        .plan
        .steps
        .iter()
        .position(|s| matches!(s, Step::Storm { .. }))
        .unwrap() as u32;
    let step_ns = |i: u32| {
        messages
            .iter()
            .find_map(|m| match m {
                Message::StepDone { index, elapsed_ns } if *index == i => Some(*elapsed_ns),
                _ => None,
            })
            .unwrap_or(0)
    };
    let last = scenario.plan.steps.len() as u32 - 1;
    let secs = (step_ns(storm_at) + step_ns(last)) as f64 / 1e9;

    // Host analysis alone, timed (run_trial already did it once).
    let mut streams = BTreeMap::new();
    for l in &ev.listeners {
        streams.insert(
            l.index,
            std::fs::read(dir.join(format!("records-{}.bin", l.index))).unwrap_or_default(),
        );
    }
    let full = RunEvidence::from_messages(&messages, streams);
    let t0 = Instant::now();
    let analysis = kloop::check::analyse(&full);
    let analyse_secs = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let normalised = kloop::normalise::normalise(&full, &analysis);
    let normalise_secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "load: host analyse {analyse_secs:.2} s, normalise {normalise_secs:.2} s ({} lines), {} violation(s)",
        normalised.lines().count(),
        analysis.violations.len()
    );

    println!(
        "load: {total} records, {bytes} bytes in {secs:.2} s of channel time (guest time of the \
         storm and final drain steps), {:.0} records/s, {:.2} MB/s; trial wall {trial_secs:.1} s",
        total as f64 / secs,
        bytes as f64 / secs / 1e6
    );
    assert!(total >= 100_000, "only {total} records");
}
