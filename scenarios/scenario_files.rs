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
    // Every architecture's pins; an arm64 pin's snapshot is
    // `arm64-<series>.snap` (its id's `/` made a `-`).
    let catalog = Catalog::load_all(&root().join("kernels")).unwrap();
    let pins: BTreeSet<String> = catalog
        .pins()
        .iter()
        .map(|p| p.id.replace('/', "-"))
        .collect();
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
    let mut blind = Vec::new();
    let mut compared = 0;
    // Each architecture's pins against its own newest.
    for arch in kloop_protocol::Arch::ALL {
        let Ok(catalog) = Catalog::load_for(&root().join("kernels"), &[arch]) else {
            continue;
        };
        blind_snapshots(&catalog, &mut blind, &mut compared);
    }
    assert!(compared > 100, "only {compared} snapshots compared");
    assert!(blind.is_empty(), "blind snapshots:\n{}", blind.join("\n"));
}

/// [`no_snapshot_is_blind_where_the_newest_pin_sees_records`] over one
/// architecture's pins.
fn blind_snapshots(catalog: &Catalog, blind: &mut Vec<String>, compared: &mut usize) {
    let file = |id: &str| id.replace('/', "-");
    let newest = file(&catalog.pins().last().unwrap().id);
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
    for s in &scenarios {
        let dir = s.snapshot_dir();
        let Some((ref_sets, ref_records)) = read(&newest, &dir) else {
            continue;
        };
        for pin in catalog.pins().iter().map(|p| file(&p.id)) {
            let pin = pin.as_str();
            let Some((sets, records)) = read(pin, &dir) else {
                continue;
            };
            *compared += 1;
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
}

/// What an arm64 snapshot may show that the x86-64 snapshot of the same
/// scenario and series does not, and the reverse: each line a pattern and
/// why, as docs/scenarios.md ("arm64 and x86-64 snapshots") explains.
/// Every other difference fails this test, so a new one is explained (or
/// found to be a fault) before its snapshot is blessed.
const ARCH_DIFFERENCES: &[(&str, &str)] = &[
    (
        "kprobe_optinsn_page",
        "no optimized kprobes on arm64 (HAVE_OPTPROBES: x86, arm, powerpc)",
    ),
    (
        "TEXT_POKE",
        "outside ftrace trampolines only x86 calls perf_event_text_poke() (arch/x86/kernel/alternative.c, kprobes/core.c, kprobes/opt.c; 6.12)",
    ),
    (
        "name=ftrace_trampoline",
        "no ftrace ops trampolines on arm64 (arch_ftrace_update_trampoline() is x86's)",
    ),
    (
        "name=kprobe_insn_page",
        "an arm64 kprobe at a function's entry is stepped in a slot; x86's sits on the ftrace site (KPROBES_ON_FTRACE)",
    ),
    (
        "counts: ",
        "the totals of the lines above",
    ),
];

/// Scenarios whose arm64 and x86-64 streams may differ in how many
/// programs they load and in the order of their records: `pack-boundary`
/// attaches links until the trampoline image fills whole pack chunks and
/// loads fillers until one lands after it, and both counts follow from each
/// JIT's code sizes.
const SIZE_DRIVEN: &[&str] = &["pack-boundary"];

#[test]
fn arm64_snapshots_differ_from_x86_64_only_as_explained() {
    let scenarios = scenario::load_all(&root().join("scenarios")).unwrap();
    let mut unexplained = Vec::new();
    let mut compared = 0;
    for s in &scenarios {
        let dir = s.snapshot_dir();
        for series in ["5.10", "6.1", "6.12", "7.2", "7.3"] {
            let read = |name: &str| {
                kloop::run::trial::snapshot::read_snapshot_body(
                    &kloop::run::trial::snapshot::snapshot_path(&dir, name),
                )
            };
            let (Some(x86), Some(arm)) = (read(series), read(&format!("arm64-{series}"))) else {
                continue;
            };
            compared += 1;
            let size_driven = SIZE_DRIVEN.contains(&s.name.as_str());
            let keep = |body: &str| -> Vec<String> {
                let mut lines: Vec<String> = body
                    .lines()
                    .filter(|l| !ARCH_DIFFERENCES.iter().any(|(p, _)| l.contains(p)))
                    .filter(|l| {
                        !(size_driven
                            && (l.trim_start().starts_with("storm ")
                                || l.trim_start().starts_with("records accounted")))
                    })
                    .map(neutral)
                    .collect();
                if size_driven {
                    lines.sort();
                    lines.dedup();
                }
                lines
            };
            let (a, b) = (keep(&x86), keep(&arm));
            if a != b {
                let only_x86: Vec<_> = a.iter().filter(|l| !b.contains(l)).take(3).collect();
                let only_arm: Vec<_> = b.iter().filter(|l| !a.contains(l)).take(3).collect();
                unexplained.push(format!(
                    "{}/{series}: x86-64 only {only_x86:?}, arm64 only {only_arm:?}",
                    s.name
                ));
            }
        }
    }
    assert!(compared > 100, "only {compared} pairs compared");
    assert!(
        unexplained.is_empty(),
        "arm64 snapshots differ from x86-64's where docs/scenarios.md does not say why:\n{}",
        unexplained.join("\n")
    );
}

/// A snapshot line with its JIT lengths (`len=`) and the stream's own
/// address numbers (`addr#`) made neutral: each JIT emits other code for
/// the same program, and a record the other architecture lacks renumbers
/// the addresses after it.
fn neutral(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find(['=', '#']) {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        let key_len = head.ends_with("len=") || head.ends_with("addr#");
        if key_len {
            let digits = tail.chars().take_while(char::is_ascii_digit).count();
            if digits > 0 {
                out.push('N');
                rest = &tail[digits..];
                continue;
            }
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}
