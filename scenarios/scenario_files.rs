//! Checks over the scenario folders themselves (no VM): every scenario file
//! parses, and a scenario that keeps golden snapshots has one for every
//! pinned kernel (except pins where a scenario with `requires` is skipped)
//! and none for kernels the catalog no longer has.
//!
//! This file lives in `scenarios/` on purpose: it makes the folder a target
//! root, which is where `cargo insta review` looks for pending `.snap.new`
//! files.

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
            let body = kloop::judge::snapshot::read_snapshot_body(
                &kloop::judge::snapshot::snapshot_path(&s.snapshot_dir(), pin),
            );
            assert!(
                body.is_some_and(|b| b.starts_with("# kloop normalised record stream")),
                "scenario {} pin {pin}: not a kloop snapshot",
                s.name
            );
        }
    }
}
