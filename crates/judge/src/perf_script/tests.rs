use super::*;

/// `perf report -D --header -i perf.data` from perf 6.1.192 (Debian
/// 12's linux-perf) on the 6.1 pin (6.1.0-50-cloud-amd64) under
/// QEMU/TCG, recorded by the perf-tool scenario: `basic` ("early") and
/// `subprogs` ("kept") alive at start, `subprogs` ("inside") and
/// `basic` ("late") loaded while perf recorded, "early" and "inside"
/// unloaded while it recorded.
const REAL_6_1: &str = include_str!("../../testdata/perf-report-D-6.1.192-on-6.1.txt");

#[test]
fn reads_a_real_dump() {
    let d = parse(REAL_6_1).unwrap();
    assert_eq!(d.perf_version.as_deref(), Some("6.1.192"));
    assert_eq!(d.os_release.as_deref(), Some("6.1.0-50-cloud-amd64"));
    assert_eq!(
        kloop_records::sample_type_names(d.sample_types[0]),
        "IP|TID|TIME|CPU|PERIOD"
    );
    assert!(d.sample_id_all);
    assert_eq!(d.stats.get("KSYMBOL"), Some(&12));
    assert_eq!(d.stats.get("BPF_EVENT"), Some(&6));
    let ks = d
        .events
        .iter()
        .filter(|e| e.type_ == PERF_RECORD_KSYMBOL)
        .count();
    let bs = d
        .events
        .iter()
        .filter(|e| e.type_ == PERF_RECORD_BPF_EVENT)
        .count();
    assert_eq!((ks, bs), (12, 6));
    let first = d
        .events
        .iter()
        .find(|e| e.type_ == PERF_RECORD_KSYMBOL)
        .unwrap();
    assert_eq!(first.offset, 0x1e8);
    assert_eq!(first.raw.len(), 0x58);
    let s = first.summary.as_ref().unwrap();
    assert_eq!(s.stamps, vec![0, 0]);
    assert_eq!(
        s.printed,
        Printed::Ksymbol(RecordContent::Ksymbol {
            addr: 0xffffffffc0183658,
            len: 36,
            ksym_type: 1,
            flags: 0,
            name: "bpf_prog_e6d6061d74de6f92_kloop_basic".into()
        })
    );
}

#[test]
fn kloop_reads_every_raw_record_as_perf_printed_it() {
    let d = parse(REAL_6_1).unwrap();
    let mut bad = Vec::new();
    let recs = perf_records(&d, &mut bad, &mut Vec::new());
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!(recs.len(), 18);
    assert_eq!(recs.iter().filter(|r| r.synthesised()).count(), 6);
    // The tag comes from the raw bytes: perf's summary has none.
    let load = recs
        .iter()
        .find(|r| {
            matches!(
                r.side,
                RecordContent::BpfEvent {
                    id: 10,
                    event_type: 1,
                    ..
                }
            )
        })
        .unwrap();
    assert_eq!(
        load.side,
        RecordContent::BpfEvent {
            event_type: 1,
            flags: 0,
            id: 10,
            tag: Some([0x04, 0x0d, 0x2b, 0x83, 0x17, 0x57, 0x65, 0xad]),
        }
    );
    assert_eq!((load.cpu, load.time), (Some(0), Some(11525798501)));
}

#[test]
fn a_summary_that_disagrees_with_its_bytes_is_reported() {
    // Change the printed length of the first KSYMBOL (raw says 36).
    let text = REAL_6_1.replacen(
        "addr ffffffffc0183658 len 36 type 1",
        "addr ffffffffc0183658 len 37 type 1",
        1,
    );
    let d = parse(&text).unwrap();
    let mut bad = Vec::new();
    perf_records(&d, &mut bad, &mut Vec::new());
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(
        bad[0].contains("len 37") && bad[0].contains("len=36"),
        "{}",
        bad[0]
    );
}

#[test]
fn truncated_hex_dump_is_an_error() {
    // Drop the last hex line of the first KSYMBOL's raw dump.
    let needle =
        ".  0050:  00 00 00 00 00 00 00 00                          ........        \n\n0 0 0x1e8";
    assert!(REAL_6_1.contains(needle), "fixture layout changed");
    let text = REAL_6_1.replacen(needle, "\n0 0 0x1e8", 1);
    let e = parse(&text).unwrap_err();
    assert!(e.what.contains("0x1e8"), "{e}");
}

#[test]
fn a_missing_header_is_an_error() {
    let text: String = REAL_6_1
        .lines()
        .filter(|l| !l.starts_with("# event :"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(parse(&text).unwrap_err().what.contains("--header"));
}

/// A whole perf-tool trial on the 7.3 pin (7.3~rc7-1~exp1, one vCPU,
/// perf 6.1.192 from the host): the agent's messages (heartbeats left
/// out) and kloop's listener's ring bytes, as the harness received them,
/// and the perf-tool scenario's plan (`plan.json`, as the harness makes it
/// from `scenarios/perf-tool`).
fn real_7_3() -> (RunEvidence, Vec<Step>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/perf-tool-7.3");
    let messages: Vec<kloop_protocol::Message> =
        std::fs::read_to_string(format!("{dir}/messages.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let ring = std::fs::read(format!("{dir}/records-0.bin")).unwrap();
    let ev = RunEvidence::from_messages(&messages, BTreeMap::from([(0, ring)]));
    let plan: kloop_protocol::Plan =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/plan.json")).unwrap())
            .unwrap();
    (ev, plan.steps)
}

fn second_reader(ev: &RunEvidence, steps: &[Step]) -> Vec<String> {
    let a = crate::check::analyse(ev);
    check(ev, &a, steps)
        .into_iter()
        .map(|v| {
            assert_eq!(v.rule, RULE);
            v.message
        })
        .collect()
}

#[test]
fn real_7_3_run_differs_only_in_perfs_synthesised_main_function_name() {
    let (ev, steps) = real_7_3();
    assert!(crate::check::analyse(&ev).violations.is_empty());
    let v = second_reader(&ev, &steps);
    // perf names the main function of a program alive at its start
    // after prog_tags[0]; the kernel (7.3) after the program's tag.
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].contains("name bpf_prog_0fa433de4695ac69_kloop_subprogs")
            && v[0].contains("name=\"bpf_prog_de24666b53bfdd9f_kloop_subprogs\"")
            && v[0].contains("\"kept\""),
        "{}",
        v[0]
    );
}

/// The same run with perf's text changed by `edit`.
fn with_perf_text(edit: impl Fn(&str) -> String) -> (RunEvidence, Vec<Step>) {
    let (mut ev, steps) = real_7_3();
    let text = edit(&ev.perf_scripts[0].text);
    assert_ne!(text, ev.perf_scripts[0].text, "the edit changed nothing");
    ev.perf_scripts[0].text = text;
    (ev, steps)
}

/// Drops the dump block (raw bytes and summary) of the record at `offset`.
fn drop_block(text: &str, offset: &str) -> String {
    let start = text.find(&format!("\n{offset}@")).unwrap();
    let summary = text[start..].find(&format!(" {offset} [")).unwrap() + start;
    let end = text[summary..].find('\n').unwrap() + summary;
    format!("{}{}", &text[..start], &text[end..])
}

#[test]
fn a_record_perf_missed_is_named() {
    // The PROG_LOAD of "late", recorded while perf ran.
    let (ev, steps) = real_7_3();
    let off = {
        let d = parse(&ev.perf_scripts[0].text).unwrap();
        let late = ev.progs.iter().find(|f| f.label == "late").unwrap();
        let e = d
            .events
            .iter()
            .find(|e| {
                matches!(&e.summary, Some(Summary { printed: Printed::BpfEvent(RecordContent::BpfEvent { id, event_type: 1, .. }), .. }) if *id == late.id)
            })
            .unwrap();
        format!("{:#x}", e.offset)
    };
    let (ev, _) = with_perf_text(|t| drop_block(t, &off));
    let v = second_reader(&ev, &steps);
    assert!(
        v.iter()
            .any(|m| m.starts_with("perf did not record BPF_EVENT PROG_LOAD")
                && m.contains("\"late\"")),
        "{v:#?}"
    );
}

#[test]
fn a_load_perf_should_not_have_seen_is_named() {
    // Pretend "late" was loaded after perf stopped: perf's record of its
    // load is then unexplained.
    let (ev, mut steps) = real_7_3();
    let stop = steps
        .iter()
        .position(|s| matches!(s, Step::PerfRecordStop))
        .unwrap();
    let late = steps
        .iter()
        .position(|s| matches!(s, Step::Load { label, .. } if label == "late"))
        .unwrap();
    let step = steps.remove(late);
    steps.insert(stop, step);
    let v = second_reader(&ev, &steps);
    assert!(
        v.iter().any(
            |m| m.contains("which no load or unload the plan ran while perf recorded explains")
        ),
        "{v:#?}"
    );
}

#[test]
fn a_twin_out_of_time_is_named() {
    // Move the time of kloop's copy of the record after inside's first
    // KSYMBOL (ring index 7) to well before it: perf's copy of that
    // first KSYMBOL no longer lies between its twin's neighbours.
    let (mut ev, steps) = real_7_3();
    let ring = ev.streams.get_mut(&0).unwrap();
    let (off, size) = (560usize, 88usize);
    let time_at = off + size - 16;
    ring[time_at..time_at + 8].copy_from_slice(&17069000000u64.to_le_bytes());
    let v = second_reader(&ev, &steps);
    assert!(
        v.iter()
            .any(|m| m.contains("is not between the neighbours of its twin")),
        "{v:#?}"
    );
}

#[test]
fn every_prefix_of_a_real_dump_parses_or_errs_without_panicking() {
    // Guest text is untrusted input: a dump cut anywhere must be either
    // read or refused, never crash the harness.
    for end in (0..REAL_6_1.len())
        .filter(|e| REAL_6_1.is_char_boundary(*e))
        .step_by(3)
    {
        let text = &REAL_6_1[..end];
        if let Ok(d) = parse(text) {
            let mut bad = Vec::new();
            perf_records(&d, &mut bad, &mut Vec::new());
        }
    }
}

#[test]
fn hex_lines() {
    assert_eq!(
        hex_line(".  0020:  1c 16 23 a7 7a 08 00 00 01 00 00 00 00 00 00 00  ..#.z..........."),
        Some(vec![
            0x1c, 0x16, 0x23, 0xa7, 0x7a, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0
        ])
    );
    assert_eq!(
        hex_line(".  0050:  01 00 00 00 00 00 00 00                          ........        "),
        Some(vec![1, 0, 0, 0, 0, 0, 0, 0])
    );
    // ASCII that looks like hex is never read as bytes.
    assert_eq!(
        hex_line(".  0000:  61 62                                            ab"),
        Some(vec![0x61, 0x62])
    );
}
