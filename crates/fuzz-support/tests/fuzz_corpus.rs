//! Corpus replay for the `cargo fuzz` targets in `fuzz/`: every committed seed
//! (`fuzz/seeds/<target>/`) and every input a fuzzer found
//! (`fuzz/regressions/<target>/`) goes through the same check function the
//! fuzz target calls (`kloop_fuzz_support`), on stable Rust, without cargo-fuzz.
//!
//! Regenerate the seeds from `harness/src/testdata/real/` with
//! `cargo test -p kloop-fuzz-support --test fuzz_corpus -- --ignored write_seeds`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use kloop_fuzz_support::{self as fuzzing, CountingAlloc, TARGETS};

// Same allocator as the fuzz targets, so the allocation bounds are checked here too.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn real_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../harness/src/testdata/real")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    v.sort();
    v
}

/// Runs `check` on every input, collecting the ones that panic.
fn replay(inputs: Vec<(String, Vec<u8>)>, check: fn(&[u8])) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, bytes) in inputs {
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| check(&bytes))) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{name}: {why}"));
        }
    }
    failures
}

fn replay_target(target: &str) {
    let check = TARGETS
        .iter()
        .find(|(t, _)| *t == target)
        .map(|(_, c)| *c)
        .unwrap();
    let seeds = files(&fuzz_dir().join("seeds").join(target));
    assert!(!seeds.is_empty(), "no seeds for {target}: run write_seeds");
    let regressions = files(&fuzz_dir().join("regressions").join(target));
    let inputs = seeds
        .iter()
        .chain(&regressions)
        .map(|p| (p.display().to_string(), std::fs::read(p).unwrap()))
        .collect();
    let failures = replay(inputs, check);
    assert!(failures.is_empty(), "{target}:\n{}", failures.join("\n"));
}

#[test]
fn replay_records() {
    replay_target("records");
}

#[test]
fn replay_frames() {
    replay_target("frames");
}

#[test]
fn replay_analyse() {
    replay_target("analyse");
}

/// The seeds regenerated from the recorded runs pass too (even before
/// `write_seeds` commits them), and real streams really parse.
#[test]
fn generated_seeds_pass() {
    let seeds = fuzzing::seeds(&real_dir()).unwrap();
    for (target, check) in TARGETS {
        let inputs: Vec<(String, Vec<u8>)> = seeds
            .iter()
            .filter(|s| s.target == target)
            .map(|s| (s.name.clone(), s.bytes.clone()))
            .collect();
        assert!(!inputs.is_empty(), "no {target} seeds");
        let failures = replay(inputs, check);
        assert!(failures.is_empty(), "{target}:\n{}", failures.join("\n"));
    }
    for s in seeds.iter().filter(|s| s.target == "records") {
        let l = fuzzing::records_listener(s.bytes[0]);
        kloop_records::parse_stream(&l, &s.bytes[1..])
            .unwrap_or_else(|e| panic!("seed {} does not parse: {e}", s.name));
    }
}

/// The allocation bound is live: the counting allocator is installed here.
#[test]
fn counting_allocator_is_installed() {
    let (v, peak) = fuzzing::peak_alloc(|| vec![0u8; 100_000]);
    assert_eq!(v.len(), 100_000);
    assert!(peak.is_some_and(|p| p >= 100_000), "{peak:?}");
}

/// Rewrites `fuzz/seeds/<target>/` from `harness/src/testdata/real/`.
#[test]
#[ignore = "writes fuzz/seeds; run explicitly"]
fn write_seeds() {
    let seeds = fuzzing::seeds(&real_dir()).unwrap();
    for (target, _) in TARGETS {
        let dir = fuzz_dir().join("seeds").join(target);
        for old in files(&dir) {
            std::fs::remove_file(old).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
    }
    for s in &seeds {
        let path = fuzz_dir().join("seeds").join(s.target).join(&s.name);
        std::fs::write(&path, &s.bytes).unwrap();
    }
    let total: usize = seeds.iter().map(|s| s.bytes.len()).sum();
    eprintln!("wrote {} seeds, {total} bytes", seeds.len());
}
