use kloop_protocol::{ImageReading, KallsymsEntry, PerfAttribution, ProgFacts};

use super::*;
use crate::check::Gap;
use crate::known_issues::Signature;

const WORK: &str = "bpf_prog_6deef7357e7b4530_kloop_work";
const TRAMP: &str = "bpf_trampoline_6442523898";
const WORK_AT: u64 = 0xffff_ffff_c000_0150;
const TRAMP_AT: u64 = 0xffff_ffff_c000_0000;

fn facts(id: u32, name: &str, start: u64, len: u32, kallsyms: bool) -> ProgFacts {
    ProgFacts {
        label: name.into(),
        id,
        tag: [0; 8],
        name: name.into(),
        prog_type: 1,
        jited_ksyms: vec![start],
        jited_func_lens: vec![len],
        func_tags: vec![[0; 8]],
        func_names: vec![],
        kallsyms: if kallsyms {
            vec![KallsymsEntry {
                addr: start,
                kind: 't',
                name: name.into(),
                module: Some("bpf".into()),
            }]
        } else {
            vec![]
        },
    }
}

/// A run with the workload (id 7, 2800 bytes at `WORK_AT`) and a
/// trampoline image of 180 bytes right below it, and `samples`.
fn run(samples: Vec<(u64, &str, u32)>) -> RunEvidence {
    RunEvidence {
        perf_attributions: vec![PerfAttribution {
            command: "perf record …; perf script -F ip,sym".into(),
            workload: 7,
            live: vec![facts(7, WORK, WORK_AT, 2800, true)],
            images: vec![ImageReading {
                name: TRAMP.into(),
                start: TRAMP_AT,
                end: TRAMP_AT + 180,
                size: Some(180),
                seen_at: vec![],
            }],
            not_arranged: None,
            runs: 10,
            run_ns: 2_000_000_000,
            samples: samples
                .into_iter()
                .map(|(ip, s, n)| (ip, s.to_owned(), n))
                .collect(),
            samples_dropped: 0,
            unparsed: vec![],
            stderr: String::new(),
        }],
        ..RunEvidence::default()
    }
}

fn page_len_signature() -> Signature {
    toml::from_str("fault = \"misattributed-sample\"\nkind = \"trampoline\"\nlen = 4096\n")
        .expect("a signature")
}

#[test]
fn samples_perf_files_under_the_trampoline_are_a_violation_the_page_len_signature_knows() {
    let ev = run(vec![
        (WORK_AT + 0x10, TRAMP, 30),
        (WORK_AT + 0x400, TRAMP, 12),
        (WORK_AT + 0x20, WORK, 5),
        // Outside every live image: not the rule's to judge.
        (0xffff_ffff_8100_0000, "do_idle", 100),
    ]);
    let v = check(&ev);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].rule, PERF_ATTRIBUTION);
    assert!(
        v[0].message.contains("42 of the 47 samples"),
        "{}",
        v[0].message
    );
    assert!(v[0].message.contains(TRAMP), "{}", v[0].message);
    let Some(Detail::MisattributedSample(m)) = &v[0].detail else {
        panic!("{:?}", v[0].detail);
    };
    assert_eq!(m.attributed, "trampoline");
    assert_eq!(m.offsets, Some((0x160, 0x550)));
    assert_eq!(m.extent, Some(180));
    assert!(page_len_signature().matches(v[0].detail.as_ref()));
    assert!(unchecked(&ev).is_empty());
    let notes = notes(&ev);
    assert!(
        notes[0].contains("47 of 147 samples") && notes[0].contains("42 attributed"),
        "{notes:?}"
    );
}

#[test]
fn the_signature_does_not_cover_what_the_page_does_not_explain() {
    // Past the page the trampoline announces: not this bug.
    let far = run(vec![(TRAMP_AT + 4096 + 8, TRAMP, 1)]);
    let mut far = far;
    far.perf_attributions[0].live = vec![facts(7, WORK, TRAMP_AT + 4000, 2800, true)];
    let v = check(&far);
    assert_eq!(v.len(), 1);
    assert!(!page_len_signature().matches(v[0].detail.as_ref()));
    // Filed under a kernel function or under nothing.
    for sym in ["do_idle", "[unknown]"] {
        let v = check(&run(vec![(WORK_AT + 0x10, sym, 3)]));
        assert_eq!(v.len(), 1);
        assert!(!page_len_signature().matches(v[0].detail.as_ref()), "{sym}");
    }
}

#[test]
fn every_sample_under_its_own_symbol_passes_with_the_figure_in_the_note() {
    let ev = run(vec![(WORK_AT, WORK, 9), (WORK_AT + 2799, WORK, 1)]);
    assert!(check(&ev).is_empty());
    assert!(unchecked(&ev).is_empty());
    assert!(
        notes(&ev)[0].contains("10 of 10 samples"),
        "{:?}",
        notes(&ev)
    );
    // One byte past its image is not the program's.
    let past = run(vec![(WORK_AT + 2800, "other", 1), (WORK_AT, WORK, 1)]);
    assert!(check(&past).is_empty());
}

#[test]
fn no_sample_in_the_workload_or_no_truth_is_unchecked_never_a_pass() {
    let none = run(vec![(0xffff_ffff_8100_0000, "do_idle", 100)]);
    let u = unchecked(&none);
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].gap, Gap::Lost);
    assert!(u[0].reason.contains("no sample"), "{}", u[0].reason);

    let mut nameless = run(vec![(WORK_AT, WORK, 1)]);
    nameless.perf_attributions[0].live = vec![facts(7, WORK, WORK_AT, 2800, false)];
    let u = unchecked(&nameless);
    assert!(u.iter().any(|u| u.reason.contains("named none")), "{u:?}");

    let mut factless = run(vec![(WORK_AT, WORK, 1)]);
    factless.perf_attributions[0].live.clear();
    assert!(unchecked(&factless)
        .iter()
        .any(|u| u.reason.contains("no facts")));
}

#[test]
fn lines_perf_script_printed_that_are_no_sample_are_a_violation() {
    let mut ev = run(vec![(WORK_AT, WORK, 1)]);
    ev.perf_attributions[0].unparsed = vec!["Warning: x".into()];
    let v = check(&ev);
    assert_eq!(v.len(), 1);
    assert!(v[0].detail.is_none());
}
