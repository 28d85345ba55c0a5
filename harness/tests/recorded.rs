//! Parser, checks and normalisation over byte streams recorded from real
//! kernels (see `src/testdata/real/README.md`): no VM needed, and the result
//! must equal the golden snapshot the VM suite compares against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop::evidence::RunEvidence;
use kloop::records::{parse_stream, RecordBody};
use kloop_protocol::Message;

fn recorded(dir: &Path) -> RunEvidence {
    let messages: Vec<Message> = std::fs::read_to_string(dir.join("messages.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut streams = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(idx) = name
            .strip_prefix("records-")
            .and_then(|n| n.strip_suffix(".bin"))
        {
            streams.insert(idx.parse::<u32>().unwrap(), std::fs::read(&p).unwrap());
        }
    }
    RunEvidence::from_messages(&messages, streams)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn check_pin(pin: &str) {
    let ev = recorded(&root().join(format!("src/testdata/real/{pin}-subprogs")));
    assert_eq!(ev.listeners.len(), 2, "one listener per vCPU");
    let mut ksyms = 0;
    for l in &ev.listeners {
        let recs = parse_stream(l, &ev.streams[&l.index]).expect("real bytes parse exactly");
        ksyms += recs
            .iter()
            .filter(|r| matches!(r.body, RecordBody::Ksymbol { .. }))
            .count();
    }
    assert_eq!(ksyms, 6, "3 functions registered and unregistered");
    let analysis = kloop::check::analyse(&ev);
    assert!(analysis.violations.is_empty(), "{:#?}", analysis.violations);
    let text = kloop::normalise::normalise(&ev, &analysis);
    let golden = kloop::snapshot::read_snapshot_body(
        &root().join(format!("../scenarios/subprogs/snapshots/{pin}.snap")),
    )
    .unwrap();
    assert_eq!(text.trim_end(), golden);
}

#[test]
fn recorded_5_10_subprogs() {
    check_pin("5.10");
}

#[test]
fn recorded_6_1_subprogs() {
    check_pin("6.1");
}

#[test]
fn recorded_7_3_subprogs() {
    check_pin("7.3");
}

#[test]
fn recorded_stream_with_a_flipped_tag_fails_load_matches_info() {
    let mut ev = recorded(&root().join("src/testdata/real/6.1-subprogs"));
    ev.progs[0].tag[0] ^= 0xff;
    let a = kloop::check::analyse(&ev);
    assert!(
        a.violations.iter().any(|v| v.rule == "load-matches-info"),
        "{:#?}",
        a.violations
    );
}

#[test]
fn every_truncation_of_a_real_stream_is_an_error_not_a_panic() {
    let ev = recorded(&root().join("src/testdata/real/7.3-subprogs"));
    let l = &ev.listeners[0];
    let bytes = ev.streams.values().max_by_key(|b| b.len()).unwrap();
    let l = ev
        .listeners
        .iter()
        .find(|x| ev.streams[&x.index].len() == bytes.len())
        .unwrap_or(l);
    let mut errors = 0;
    for cut in 1..bytes.len() {
        if parse_stream(l, &bytes[..cut]).is_err() {
            errors += 1;
        }
    }
    // Only cuts at record boundaries parse.
    let boundaries = parse_stream(l, bytes).unwrap().len();
    assert_eq!(errors, bytes.len() - boundaries);
}
