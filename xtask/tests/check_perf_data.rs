//! `cargo xtask check-perf-data` as a user runs it: every kind of input
//! with its message and exit status (0 clean or known bugs only, 1 news,
//! 2 unreadable, cut short or nothing to judge). The inputs are perf.data
//! files the real perf wrote on this project's host (kernel 6.18.44,
//! Debian's perf 6.1.187; see crates/perf-data/testdata/README.md), and
//! copies of them damaged the way files get damaged: cut short, a flag
//! cleared, a record's bit flipped.

use std::path::{Path, PathBuf};

use kloop_test_support::workspace_root;

fn testdata(name: &str) -> PathBuf {
    workspace_root()
        .join("crates/perf-data/testdata")
        .join(name)
}

const FILE: &str = "host-6.18.44-perf-6.1.187-header-size.data";
const PIPE: &str = "host-6.18.44-perf-6.1.187-header-size.pipe.data";
const KNOWN: &str = "KNOWN (ksymbol-bpf-event-header-size-accumulates)";

fn check(file: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["check-perf-data", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &workspace_root(), &args)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Offset of the first KSYMBOL register record in a pipe-mode file's
/// stream (type 17, then misc, then a size that fits).
fn first_ksymbol(bytes: &[u8]) -> usize {
    (16..bytes.len() - 8)
        .step_by(8)
        .find(|&i| {
            // type 17, misc 0, ksym_type 1 (BPF), flags 0 (register)
            bytes[i..i + 6] == [17, 0, 0, 0, 0, 0] && bytes[i + 20..i + 24] == [1, 0, 0, 0]
        })
        .expect("the recording has a KSYMBOL register")
}

#[test]
fn a_real_file_with_a_ledger_bug_is_known_and_exits_0() {
    for name in [FILE, PIPE] {
        let (code, out) = check(&testdata(name), &[]);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("kernel 6.18.44-fc-v657, written by perf 6.1.187"),
            "{out}"
        );
        assert!(out.contains("2 KSYMBOL, 2 BPF_EVENT, 0 LOST"), "{out}");
        assert!(
            out.contains("4 finding(s)") && out.contains("[header-size]"),
            "{out}"
        );
        assert!(out.trim_end().ends_with(KNOWN), "{out}");
    }
}

#[test]
fn json_carries_the_findings_and_their_ledger_entry() {
    let (code, out) = check(&testdata(FILE), &["--json"]);
    assert_eq!(code, 0, "{out}");
    let start = out.find('{').unwrap();
    let end = out.rfind('}').unwrap();
    let v: serde_json::Value = serde_json::from_str(&out[start..=end]).unwrap();
    assert_eq!(v["os_release"], "6.18.44-fc-v657");
    assert_eq!(v["ksymbol"], 2);
    assert_eq!(v["bpf_event_requested"], true);
    let findings = v["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 4);
    assert!(findings.iter().all(|f| f["rule"] == "header-size"
        && f["known_issue"] == "ksymbol-bpf-event-header-size-accumulates"));
}

#[test]
fn a_file_without_bpf_event_is_judged_and_says_what_is_missing() {
    let (code, out) = check(
        &testdata("host-6.18.44-perf-6.1.187-no-bpf-event.data"),
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 KSYMBOL, 0 BPF_EVENT"), "{out}");
    assert!(
        out.contains("note: no event asked for BPF_EVENT records (`perf record --no-bpf-event`)"),
        "{out}"
    );
    assert!(out.trim_end().ends_with(KNOWN), "{out}");
}

#[test]
fn a_file_without_any_side_band_request_exits_2_and_says_how_to_record() {
    let mut bytes = std::fs::read(testdata(FILE)).unwrap();
    // perf_file_header: attrs section {offset, size} at 24; each entry is a
    // perf_event_attr (attr_size at 16) and an ids section; the attr's
    // flags word is at 40, ksymbol bit 29, bpf_event bit 30.
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    // The same attribute is in HEADER_EVENT_DESC too: clear every copy.
    let (attrs, attrs_len) = (u64_at(&bytes, 24), u64_at(&bytes, 32));
    assert_eq!(attrs_len, u64_at(&bytes, 16), "one attribute");
    let attr = bytes[attrs..attrs + 40].to_vec();
    let copies: Vec<usize> = (0..bytes.len() - 48)
        .filter(|&i| bytes[i..i + 40] == attr[..])
        .collect();
    assert!(copies.len() >= 2, "{copies:?}");
    for a in copies {
        let flags = u64_at(&bytes, a + 40) & !(1 << 29 | 1 << 30);
        bytes[a + 40..a + 48].copy_from_slice(&(flags as u64).to_le_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = check(&write(dir.path(), "no-side-band.data", &bytes), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("no event in this file asked for KSYMBOL or BPF_EVENT records"),
        "{out}"
    );
    assert!(out.contains("`perf record -e dummy -a`"), "{out}");
}

#[test]
fn a_damaged_record_is_news_and_exits_1() {
    let mut bytes = std::fs::read(testdata(PIPE)).unwrap();
    // The program's register now says unregister: two unregisters of a
    // symbol never registered.
    let k = first_ksymbol(&bytes);
    bytes[k + 22] = 1;
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = check(&write(dir.path(), "flipped.data", &bytes), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[unregister-without-register]"), "{out}");
    assert!(out.contains("2 finding(s); also KNOWN"), "{out}");
}

#[test]
fn a_pipe_file_cut_short_is_judged_up_to_the_cut_and_exits_2() {
    let bytes = std::fs::read(testdata(PIPE)).unwrap();
    let cut = first_ksymbol(&bytes) + 40;
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = check(&write(dir.path(), "cut.pipe.data", &bytes[..cut]), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("TRUNCATED: the record at offset 33744 (type 17, 160 bytes) ends past the file's 33784 bytes"),
        "{out}"
    );
    assert!(
        out.trim_end()
            .ends_with("kloop: cut short; clean up to the cut"),
        "{out}"
    );
    assert!(out.contains("was perf killed, or the disk full?"), "{out}");
}

#[test]
fn a_file_cut_short_a_stranger_and_a_missing_file_exit_2() {
    let bytes = std::fs::read(testdata(FILE)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // File mode keeps its feature sections after the records: cut in the
    // records, the header points past the end.
    let (code, out) = check(
        &write(dir.path(), "cut.data", &bytes[..bytes.len() / 2]),
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("is cut short: its header says the records end at byte"),
        "{out}"
    );
    let (code, out) = check(&write(dir.path(), "text.data", b"# not perf.data\n"), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not a readable perf.data file"), "{out}");
    let (code, out) = check(&dir.path().join("absent.data"), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("error: opening "), "{out}");
}
