//! Checks over the scenario folders themselves (no VM): every scenario file
//! parses, and a scenario that keeps golden snapshots has one for every
//! pinned kernel (except pins where a scenario with `requires` is skipped)
//! and none for kernels the catalog no longer has.
//!
//! This file lives in `scenarios/` on purpose: it makes the folder a target
//! root, which is where `cargo insta review` looks for pending `.snap.new`
//! files.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::collections::BTreeSet;
use std::path::Path;

use kloop::scenario;
use kloop_kernels::Catalog;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn snapshots_cover_exactly_the_catalog() {
    let catalog = Catalog::load(&root().join("kernels")).unwrap();
    let pins: BTreeSet<String> = catalog.pins().iter().map(|p| p.id.clone()).collect();
    let scenarios = scenario::load_all(&root().join("scenarios")).unwrap();
    assert!(!scenarios.is_empty());
    for s in &scenarios {
        let snaps: BTreeSet<String> = std::fs::read_dir(s.snapshot_dir())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.strip_suffix(".snap").map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if snaps.is_empty() {
            continue;
        }
        let missing: Vec<_> = pins.difference(&snaps).collect();
        let stale: Vec<_> = snaps.difference(&pins).collect();
        // A scenario with `requires` is skipped on pins without the feature,
        // and a skipped trial has no stream to keep.
        assert!(
            missing.is_empty() || !s.plan.requires.is_empty(),
            "scenario {}: no golden snapshot for pins {missing:?}; run `cargo xtask bless --scenario {}`",
            s.name,
            s.name
        );
        assert!(
            stale.is_empty(),
            "scenario {}: snapshots for pins not in the catalog: {stale:?}; delete them",
            s.name
        );
        for pin in &snaps {
            let body = kloop::run::trial::snapshot::read_snapshot_body(
                &kloop::run::trial::snapshot::snapshot_path(&s.snapshot_dir(), pin),
            );
            assert!(
                body.is_some_and(|b| b.starts_with("# kloop normalised record stream")),
                "scenario {} pin {pin}: not a kloop snapshot",
                s.name
            );
        }
    }
}

/// The single-kind scenarios promise that no listener of the other kind
/// exists anywhere in the guest while they record: the agent opens side-band
/// listeners only in `open-listeners`, `measure` and `spin-read`, and the
/// shipped perf in `perf-record-start` (its probes and aya warm-up open none). If one did,
/// `nr_ksymbol_events` / `nr_bpf_events` would both be non-zero and a kernel
/// that gates one record kind on the other counter would pass unseen.
#[test]
fn single_kind_scenarios_hold_only_their_kind() {
    use kloop_protocol::Step;
    let scenarios = scenario::load_all(&root().join("scenarios")).unwrap();
    for (name, ksym, bpf) in [
        ("ksymbol-only", true, false),
        ("bpf-event-only", false, true),
    ] {
        let s = scenarios
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("scenario {name} is missing"));
        let mut opened = 0;
        for step in &s.plan.steps {
            match step {
                Step::OpenListeners { listener } => {
                    opened += 1;
                    assert!(
                        listener.ksymbol == ksym && listener.bpf_event == bpf,
                        "{name}: a listener with ksymbol={} bpf_event={}",
                        listener.ksymbol,
                        listener.bpf_event
                    );
                }
                Step::Measure { .. }
                | Step::SpinRead { .. }
                | Step::PerfRecordStart { .. }
                | Step::WatchKsymbols
                | Step::ReadKsymbolWatch => {
                    panic!("{name}: step {step:?} opens listeners or watches emission")
                }
                _ => {}
            }
        }
        assert!(opened > 0, "{name}: no listener at all");
    }
}

/// A known bug must not blind a snapshot: where a pin's listener set, task
/// listener or record list is empty, the newest pin's (which has none of
/// the ledger's stream faults) must be empty too. Before the parser read
/// past the header-size bug's zero-filled excess, the 5.10, 6.1 and 6.12
/// snapshots of many-listeners, perf-tool-late-listener and
/// unmapped-listeners held empty sets and record lists that 7.3's did not,
/// and any second fault there went unseen.
#[test]
fn no_snapshot_is_blind_where_the_newest_pin_sees_records() {
    let catalog = Catalog::load(&root().join("kernels")).unwrap();
    let newest = catalog.pins().last().unwrap().id.clone();
    let scenarios = scenario::load_all(&root().join("scenarios")).unwrap();
    // Per snapshot: each set's total record count by its label, and the
    // number of lines under `records:`.
    let read = |pin: &str, dir: &Path| {
        let body = kloop::run::trial::snapshot::read_snapshot_body(
            &kloop::run::trial::snapshot::snapshot_path(dir, pin),
        )?;
        let mut sets = std::collections::BTreeMap::new();
        let mut records = 0usize;
        let mut in_records = false;
        for line in body.lines() {
            let t = line.trim_start();
            if line == "records:" {
                in_records = true;
                continue;
            }
            if in_records {
                if line.starts_with("  ") {
                    records += 1;
                    continue;
                }
                in_records = false;
            }
            if (t.starts_with("set#") || t.starts_with("task L")) && t.contains("): ") {
                let label = t.split(" (").next().unwrap_or(t).to_string();
                let total: u64 = t
                    .split_whitespace()
                    .filter_map(|w| w.split_once('=').and_then(|(_, n)| n.parse::<u64>().ok()))
                    .sum();
                sets.insert(label, total);
            }
        }
        Some((sets, records))
    };
    let mut blind = Vec::new();
    let mut compared = 0;
    for s in &scenarios {
        let dir = s.snapshot_dir();
        let Some((ref_sets, ref_records)) = read(&newest, &dir) else {
            continue;
        };
        for pin in catalog.pins().iter().map(|p| p.id.as_str()) {
            let Some((sets, records)) = read(pin, &dir) else {
                continue;
            };
            compared += 1;
            for (label, n) in &ref_sets {
                if *n > 0 && sets.get(label).copied().unwrap_or(0) == 0 {
                    blind.push(format!(
                        "{}/{pin}: {label} empty, {n} records on {newest}",
                        s.name
                    ));
                }
            }
            if ref_records > 0 && records == 0 {
                blind.push(format!(
                    "{}/{pin}: no records, {ref_records} on {newest}",
                    s.name
                ));
            }
        }
    }
    assert!(compared > 100, "only {compared} snapshots compared");
    assert!(blind.is_empty(), "blind snapshots:\n{}", blind.join("\n"));
}
