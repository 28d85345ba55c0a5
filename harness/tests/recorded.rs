//! Parser, checks and normalisation over byte streams recorded from real
//! kernels (see `src/testdata/real/README.md`): no VM needed, and the result
//! must equal the golden snapshot the VM suite compares against.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop::judge::evidence::RunEvidence;
use kloop_protocol::Message;
use kloop_records::{parse_stream, RecordBody};

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
    let analysis = kloop::judge::check::analyse(&ev);
    assert!(analysis.violations.is_empty(), "{:#?}", analysis.violations);
    let text = kloop::judge::normalise::normalise(&ev, &analysis);
    let golden = kloop::run::trial::snapshot::read_snapshot_body(
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
    let a = kloop::judge::check::analyse(&ev);
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

/// The ledger as the trials read it.
fn ledger() -> kloop::judge::known_issues::Ledger {
    use kloop::judge::known_issues::{rule_names, Ledger, Vocabulary};
    let scenarios = kloop::scenario::load_all(&root().join("../scenarios")).unwrap();
    let vocab = Vocabulary {
        pins: kloop_kernels::Catalog::load_all(&root().join("../kernels"))
            .unwrap()
            .ids()
            .into_iter()
            .map(String::from)
            .collect(),
        rules: rule_names().into_iter().map(String::from).collect(),
        scenarios: scenarios.iter().map(|s| s.name.clone()).collect(),
    };
    let path = root().join("../kernels/known-issues.toml");
    Ledger::parse(&std::fs::read_to_string(&path).unwrap(), &path, &vocab).unwrap()
}

/// Every violation of a run, the oversized copies annotated, as a trial
/// judges them (`run::trial::judging`).
fn violations(
    ev: &RunEvidence,
) -> (
    kloop::judge::check::Analysis,
    Vec<kloop::judge::check::Violation>,
) {
    let a = kloop::judge::check::analyse(ev);
    let mut v = a.violations.clone();
    kloop::judge::emissions::annotate(ev, &a, &mut v);
    (a, v)
}

/// 6.1 (6.1.0-50-cloud-amd64), `many-listeners`, recorded by
/// `cargo xtask vm-test` (TCG, 2 vCPUs; the program was loaded on CPU 1):
/// the kernel grows every KSYMBOL/BPF_EVENT record by the id header of each
/// listener it wrote before (known issue
/// `ksymbol-bpf-event-header-size-accumulates`). The strict parser must keep
/// saying so, on exactly the three listeners that got grown records; read
/// past, every stream is judged whole and holds what 7.3's does.
#[test]
fn recorded_6_1_many_listeners_header_size_grows_per_listener() {
    use kloop::judge::check::Detail;
    let ev = recorded(&root().join("src/testdata/known-issues/6.1-many-listeners"));
    assert_eq!(ev.listeners.len(), 9);
    let strict: Vec<(u32, String)> = ev
        .listeners
        .iter()
        .filter_map(|l| {
            let e = parse_stream(l, &ev.streams[&l.index]).err()?;
            Some((
                l.index,
                e.what
                    .split("header.size is ")
                    .nth(1)?
                    .trim_end_matches(')')
                    .to_string(),
            ))
        })
        .collect();
    // L1: TID|TIME|CPU (24-byte trailer) + 24 (ksymbol-only set) + 40
    // (TID|TIME|ID|CPU|IDENTIFIER set); L3: its 40 + 24; L8 (task, 16) + 88.
    assert_eq!(
        strict,
        vec![(1, "160".into()), (3, "136".into()), (8, "176".into())]
    );
    let (a, vs) = violations(&ev);
    let rules: std::collections::BTreeSet<&str> = vs.iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["parse"].into(), "{vs:#?}");
    // Every grown copy read past, each explained by the copies written
    // before it: 3 registers, 3 unregisters, PROG_LOAD, PROG_UNLOAD on L1
    // and L8 (which asked for both), the KSYMBOLs on L3 (ksymbol only... as
    // its set asked) — whatever each asked for, none left out.
    let mut per_listener: BTreeMap<u32, usize> = BTreeMap::new();
    for v in &vs {
        let Some(Detail::OversizedRecord(o)) = &v.detail else {
            panic!("a parse violation without its fields: {v:#?}");
        };
        let acc = o.accumulation.as_ref().expect("annotated");
        assert!(acc.explained, "{v:#?}");
        *per_listener.entry(v.listener.unwrap()).or_default() += 1;
    }
    assert_eq!(
        per_listener.keys().copied().collect::<Vec<_>>(),
        vec![1, 3, 8]
    );
    for (l, n) in &per_listener {
        assert_eq!(
            *n,
            a.records_per_listener[l].len(),
            "L{l}: every record grown, every one read"
        );
    }
    // Judged whole: the ledger knows each of them; nothing else broke.
    let ledger = ledger();
    let j = ledger.judge("6.1", "many-listeners", &vs);
    assert!(j.uncovered.is_empty(), "{:#?}", j.uncovered);
    assert_eq!(j.known.len(), 1);
    assert_eq!(j.known[0].0.id, "ksymbol-bpf-event-header-size-accumulates");
    // Per listener set, the records 7.3's recording holds.
    let healthy = recorded(&root().join("src/testdata/real/7.3-many-listeners"));
    let h = kloop::judge::check::analyse(&healthy);
    let counts = |a: &kloop::judge::check::Analysis| -> Vec<usize> {
        a.sets
            .iter()
            .chain(&a.task_sets)
            .map(|set| set.iter().map(|i| a.records_per_listener[i].len()).sum())
            .collect()
    };
    assert_eq!(counts(&a), counts(&h));
    assert!(counts(&a).iter().all(|n| *n > 0));
}

/// The known bug and a second fault on the same streams: the second is
/// FAILED, named, beside the known one — a known bug excuses only itself.
#[test]
fn recorded_6_1_many_listeners_second_fault_is_not_excused() {
    let ev = recorded(&root().join("src/testdata/known-issues/6.1-many-listeners"));
    let ledger = ledger();
    let listener = |i: u32| ev.listeners.iter().find(|l| l.index == i).unwrap().clone();
    let read = |ev: &RunEvidence, i: u32| {
        kloop_records::parse_reading_on(&listener(i), &ev.streams[&i]).records
    };
    let judged = |ev: &RunEvidence| {
        let (_, vs) = violations(ev);
        let j = ledger.judge("6.1", "many-listeners", &vs);
        let uncovered: Vec<(String, String)> = j
            .uncovered
            .iter()
            .map(|v| (v.rule.to_string(), v.message.clone()))
            .collect();
        let known: Vec<String> = j.known.iter().map(|(i, _)| i.id.clone()).collect();
        (uncovered, known)
    };
    let known = vec!["ksymbol-bpf-event-header-size-accumulates".to_string()];

    // A wrong name in a grown copy (L1, the first set): the first listener
    // cut at its first record before, so nothing compared its names.
    let mut wrong_name = ev.clone();
    let reg = read(&ev, 1)
        .into_iter()
        .find(|r| matches!(r.body, RecordBody::Ksymbol { .. }))
        .unwrap();
    let name_at = reg.offset as usize + 8 + 16 + "bpf_prog_".len();
    let b = &mut wrong_name.streams.get_mut(&1).unwrap()[name_at];
    *b = if *b == b'0' { b'1' } else { b'0' };
    let (uncovered, k) = judged(&wrong_name);
    assert_eq!(k, known);
    assert!(
        uncovered
            .iter()
            .any(|(r, m)| r == "load-symbols" && m.contains("name")),
        "{uncovered:#?}"
    );
    assert!(
        uncovered.iter().any(|(r, _)| r == "listeners-agree"),
        "{uncovered:#?}"
    );

    // A missing unregister in the task listener (L8, grown by 88).
    let mut missing = ev.clone();
    let unreg = read(&ev, 8)
        .into_iter()
        .find(|r| r.is_unregister())
        .unwrap();
    let (start, end) = (
        unreg.offset as usize,
        unreg.offset as usize + usize::from(unreg.header.size),
    );
    missing.streams.get_mut(&8).unwrap().drain(start..end);
    let (uncovered, k) = judged(&missing);
    assert_eq!(k, known);
    assert!(
        uncovered
            .iter()
            .any(|(r, _)| r == "unload-symbols" || r == "listeners-agree"),
        "{uncovered:#?}"
    );

    // Another size fault: one of L3's copies 8 bytes longer still.
    let mut bigger = ev.clone();
    let rec = read(&ev, 3).into_iter().next().unwrap();
    let s = bigger.streams.get_mut(&3).unwrap();
    let at = rec.offset as usize + usize::from(rec.header.size);
    s.splice(at..at, [0u8; 8]);
    let size = rec.header.size + 8;
    s[rec.offset as usize + 6..rec.offset as usize + 8].copy_from_slice(&size.to_le_bytes());
    let (uncovered, k) = judged(&bigger);
    assert_eq!(k, known);
    assert!(
        uncovered
            .iter()
            .any(|(r, m)| r == "parse"
                && m.contains("not the trailers of the copies written before it")),
        "{uncovered:#?}"
    );
}

/// The real perf next to a listener opened after it, on 6.1: perf's copy
/// and kloop's first listener's copy are grown (the known bug), perf read
/// its trailer from the zero padding (time 0). Read past, perf's records
/// are the ones it recorded while recording, each the twin of kloop's, and
/// the only violations are the two entries' signatures.
#[test]
fn recorded_6_1_perf_tool_late_listener_is_judged_whole() {
    use kloop::judge::check::Detail;
    let ev = recorded(&root().join("src/testdata/known-issues/6.1-perf-tool-late-listener"));
    let scenarios = kloop::scenario::load_all(&root().join("../scenarios")).unwrap();
    let plan = &scenarios
        .iter()
        .find(|s| s.name == "perf-tool-late-listener")
        .unwrap()
        .plan;
    let a = kloop::judge::check::analyse(&ev);
    let mut vs = a.violations.clone();
    vs.extend(kloop::judge::perf_script::check(&ev, &a, &plan.steps));
    kloop::judge::emissions::annotate(&ev, &a, &mut vs);
    let readers: Vec<(&str, String, u32, bool)> = vs
        .iter()
        .map(|v| match &v.detail {
            Some(Detail::OversizedRecord(o)) => (
                v.rule,
                o.reader.clone(),
                o.excess,
                o.accumulation.as_ref().is_some_and(|a| a.explained),
            ),
            _ => panic!("a violation that is not an oversized copy: {v:#?}"),
        })
        .collect();
    // perf's four copies 24 bytes long (L1's trailer), L0's four 48 (L1's
    // and perf's), each explained by the copies written before it.
    assert_eq!(readers.len(), 8, "{readers:#?}");
    for (rule, reader, excess, explained) in &readers {
        assert!(explained, "{readers:#?}");
        match reader.as_str() {
            "perf" => assert_eq!((*rule, *excess), ("second-reader", 24)),
            "L0" => assert_eq!((*rule, *excess), ("parse", 48)),
            other => panic!("{other}"),
        }
    }
    let ledger = ledger();
    let j = ledger.judge("6.1", "perf-tool-late-listener", &vs);
    assert!(j.uncovered.is_empty(), "{:#?}", j.uncovered);
    let mut ids: Vec<&str> = j.known.iter().map(|(i, _)| i.id.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "ksymbol-bpf-event-header-size-accumulates",
            "ksymbol-bpf-event-header-size-accumulates-perf-copy"
        ]
    );
    // The perf-copy signature is no excuse for a perf copy whose excess is
    // not explained: without listener L1 (no event the kernel could have
    // written before perf's), perf's 24 bytes and L0's 48 no longer add up.
    let mut no_l1 = ev.clone();
    no_l1.streams.remove(&1);
    no_l1.listeners.retain(|l| l.index != 1);
    let a = kloop::judge::check::analyse(&no_l1);
    let mut vs = a.violations.clone();
    vs.extend(kloop::judge::perf_script::check(&no_l1, &a, &plan.steps));
    kloop::judge::emissions::annotate(&no_l1, &a, &mut vs);
    let j = ledger.judge("6.1", "perf-tool-late-listener", &vs);
    assert!(
        j.uncovered.iter().any(|v| v.rule == "second-reader"
            && matches!(&v.detail, Some(Detail::OversizedRecord(o)) if o.reader == "perf")),
        "{:#?}",
        j.uncovered
    );
}

/// The per-CPU inherited listeners of a checked 6.1 build, where the same
/// record content was written on both CPUs at different times: every grown
/// copy is explained by the copies of its own write (same CPU, one pass),
/// so the trial is the known bug and nothing else, and the kernel's own
/// checks (KASAN, kmemleak, lockdep, UBSAN) reported nothing.
#[test]
fn recorded_checked_6_1_inherited_listener_copies_group_by_cpu_and_time() {
    use kloop::judge::check::Detail;
    let ev =
        recorded(&root().join("src/testdata/known-issues/6.1-built-checked-inherited-listener"));
    let log = ev
        .kernel_log
        .as_ref()
        .expect("the agent sent the kernel log");
    assert!(
        log.kmemleak.is_some(),
        "kmemleak is built in and was scanned"
    );
    assert!(kloop::judge::kernel_log::check(&ev).is_empty());
    let (_, vs) = violations(&ev);
    assert!(!vs.is_empty());
    for v in &vs {
        let Some(Detail::OversizedRecord(o)) = &v.detail else {
            panic!("{v:#?}");
        };
        assert!(
            o.accumulation.as_ref().is_some_and(|a| a.explained),
            "{v:#?}"
        );
    }
    let ledger = ledger();
    let j = ledger.judge("6.1", "inherited-listener", &vs);
    assert!(j.uncovered.is_empty(), "{:#?}", j.uncovered);
}

/// A polled listener on 6.12: every record woke its waiter within the
/// deadline; without the waiter's last wake-up (the unload's) the rule
/// names the unload's records.
#[test]
fn recorded_6_12_wakeups_follow_every_record() {
    let ev = recorded(&root().join("src/testdata/real/6.12-wakeups"));
    assert!(
        ev.wakeups.values().any(|w| !w.is_empty()),
        "the waiter woke"
    );
    let a = kloop::judge::check::analyse(&ev);
    assert!(a.violations.is_empty(), "{:#?}", a.violations);
    let mut lost = ev.clone();
    for w in lost.wakeups.values_mut() {
        w.pop();
    }
    let a = kloop::judge::check::analyse(&lost);
    let wake: Vec<&str> = a
        .of_rule(kloop::judge::check::rule::WAKEUPS)
        .map(|v| v.message.as_str())
        .collect();
    assert!(!wake.is_empty());
    assert!(
        wake.iter().all(
            |m| m.contains("never woke after it") && m.contains("unregister")
                || m.contains("PROG_UNLOAD")
        ),
        "{wake:#?}"
    );
}

/// 7.3 writes exact sizes: every stream parses, every listener set and the
/// task-bound listener agree, and the result equals the golden snapshot.
#[test]
fn recorded_7_3_many_listeners_agree() {
    let ev = recorded(&root().join("src/testdata/real/7.3-many-listeners"));
    for l in &ev.listeners {
        parse_stream(l, &ev.streams[&l.index]).expect("real bytes parse exactly");
    }
    let a = kloop::judge::check::analyse(&ev);
    assert!(a.violations.is_empty(), "{:#?}", a.violations);
    assert_eq!(a.sets.len(), 4);
    let text = kloop::judge::normalise::normalise(&ev, &a);
    let golden = kloop::run::trial::snapshot::read_snapshot_body(
        &root().join("../scenarios/many-listeners/snapshots/7.3.snap"),
    )
    .unwrap();
    assert_eq!(text.trim_end(), golden);

    // Drop one unregister from the ksymbol-only set: listeners-agree names it.
    let mut cut = ev.clone();
    let l5 = cut.listeners.iter().find(|l| l.index == 5).unwrap().clone();
    let recs = parse_stream(&l5, &cut.streams[&5]).unwrap();
    let victim = recs.iter().find(|r| r.is_unregister()).unwrap();
    let start = victim.offset as usize;
    let end = start + victim.header.size as usize;
    cut.streams.get_mut(&5).unwrap().drain(start..end);
    let a = kloop::judge::check::analyse(&cut);
    assert!(
        a.violations
            .iter()
            .any(|v| v.rule == "listeners-agree" && v.message.contains("KSYMBOL unregister")),
        "{:#?}",
        a.violations
    );
}

/// Two `short-lived` runs that failed `programs-accounted` before the rule
/// knew that another task's records can come between a program's KSYMBOL
/// register and its PROG_LOAD: the side-band thread held the last reference
/// to an earlier program (its BPF_PROG_GET_FD_BY_ID outlived the storm's
/// close), so *it* unloaded that program, on the other CPU, in between
/// (7.2: program 172 and the unload of 169 by tid 104; 6.12: program 100
/// and the unload of 97 by tid 130). The streams are complete and must
/// check clean and equal the golden snapshot; with the loader's register
/// taken out, the rule must still fail.
#[test]
fn recorded_short_lived_unload_by_another_task_is_accounted() {
    for (pin, program) in [("7.2", 172u32), ("6.12", 100)] {
        let ev = recorded(&root().join(format!(
            "src/testdata/real/{pin}-short-lived-sideband-unload"
        )));
        let a = kloop::judge::check::analyse(&ev);
        assert!(a.violations.is_empty(), "{pin}: {:#?}", a.violations);
        let text = kloop::judge::normalise::normalise(&ev, &a);
        let golden = kloop::run::trial::snapshot::read_snapshot_body(
            &root().join(format!("../scenarios/short-lived/snapshots/{pin}.snap")),
        )
        .unwrap();
        assert_eq!(text.trim_end(), golden, "{pin}");

        // Remove the register right before the program's PROG_LOAD in the
        // loader's ring: the program is no longer accounted.
        let mut cut = ev.clone();
        let (listener, start, end) = ev
            .listeners
            .iter()
            .find_map(|l| {
                let recs = parse_stream(l, &ev.streams[&l.index]).unwrap();
                let load = recs.iter().position(|r| {
                    matches!(r.body, RecordBody::BpfEvent { event_type: 1, id, .. } if id == program)
                })?;
                let reg = recs[..load]
                    .iter()
                    .rev()
                    .find(|r| matches!(r.body, RecordBody::Ksymbol { .. }))?;
                Some((
                    l.index,
                    reg.offset as usize,
                    reg.offset as usize + reg.header.size as usize,
                ))
            })
            .unwrap();
        cut.streams.get_mut(&listener).unwrap().drain(start..end);
        let a = kloop::judge::check::analyse(&cut);
        assert!(
            a.violations.iter().any(|v| v.rule == "programs-accounted"
                && v.message.contains(&format!("program id {program}"))),
            "{pin}: {:#?}",
            a.violations
        );
    }
}

/// The `symbol-state` violations of a capture of that scenario on a build
/// of linux-source-6.12 (`cargo xtask mutants --scenario symbol-state`).
fn symbol_state_violations(capture: &str) -> Vec<String> {
    let ev = recorded(&root().join(format!("src/testdata/real/{capture}")));
    assert!(
        ev.ksymbol_watch
            .as_ref()
            .is_some_and(|w| !w.observations.is_empty() && w.dropped == 0),
        "{capture}: the watch observed the run"
    );
    let analysis = kloop::judge::check::analyse(&ev);
    let other: Vec<_> = analysis
        .violations
        .iter()
        .filter(|v| v.rule != kloop::judge::check::rule::SYMBOL_STATE)
        .collect();
    assert!(other.is_empty(), "{capture}: {other:#?}");
    analysis
        .of_rule(kloop::judge::check::rule::SYMBOL_STATE)
        .map(|v| v.message.clone())
        .collect()
}

#[test]
fn recorded_symbol_state_holds_on_the_unmutated_build() {
    let v = symbol_state_violations("6.12-built-symbol-state-unmutated");
    assert!(v.is_empty(), "{v:#?}");
}

#[test]
fn recorded_symbol_state_sees_a_trampoline_announced_before_it_resolves() {
    // bpf/trampoline.c:bpf_image_ksym_add:126:swap-calls
    let v = symbol_state_violations("6.12-built-symbol-state-mutant-trampoline-add");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].starts_with("bpf_trampoline_") && v[0].contains("did not resolve when its register"),
        "{v:#?}"
    );
}

#[test]
fn recorded_symbol_state_sees_a_kprobe_page_unlisted_before_its_unregister() {
    // kernel/kprobes.c:collect_one_slot:221:swap-calls
    let v = symbol_state_violations("6.12-built-symbol-state-mutant-kprobe-slot");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].starts_with("kprobe_optinsn_page at ")
            && v[0].contains("was not on its list (a kprobe cache's pages, ftrace's trampolines) when its unregister"),
        "{v:#?}"
    );
}

#[test]
fn recorded_symbol_state_sees_the_symbol_tree_emptied_by_a_failed_load() {
    // bpf/core.c:__bpf_ksym_del:676:drop-return: program "a"'s three
    // functions no longer resolve when they are unregistered.
    let v = symbol_state_violations("6.12-built-symbol-state-mutant-ksym-del");
    assert_eq!(v.len(), 3, "{v:#?}");
    assert!(
        v.iter()
            .all(|m| m.contains("did not resolve when its unregister") && m.contains("kloop_sub")),
        "{v:#?}"
    );
}

/// The A/B of a real fix, from recorded streams: the unfixed build's
/// interpreter trial breaks load-symbols and unload-symbols, which the
/// ledger (series 6.12) knows as the two interpreted-prog entries; the fixed
/// build's breaks nothing; the judge calls it FIXED for exactly those two.
#[test]
fn recorded_interpreter_fix_is_fixed() {
    use kloop::judge::ab::{accept, compare, AbClass, Side};
    let ledger = ledger();
    let side = |dir: &str| {
        let ev = recorded(&root().join("src/testdata/real").join(dir));
        let analysis = kloop::judge::check::analyse(&ev);
        let judgement = ledger.judge("6.12", "interpreter", &analysis.violations);
        assert!(
            judgement.uncovered.is_empty(),
            "{dir}: {:#?}",
            judgement.uncovered
        );
        let mut ledger_ids: Vec<String> =
            judgement.known.iter().map(|(i, _)| i.id.clone()).collect();
        ledger_ids.sort();
        Side {
            label: if analysis.violations.is_empty() {
                "ok"
            } else {
                "KNOWN"
            }
            .into(),
            headline: String::new(),
            judged: true,
            skipped: None,
            findings: analysis
                .violations
                .iter()
                .map(|v| kloop::judge::ab::Finding::new(v.rule, &v.message, v.detail.as_ref()))
                .collect(),
            ledger_ids,
            interrupted: false,
            normalised: Some(kloop::judge::normalise::normalise(&ev, &analysis)),
            overhead: None,
        }
    };
    let (base, cand) = (
        side("6.12-built-interpreter-unfixed"),
        side("6.12-built-interpreter-fixed"),
    );
    assert_eq!(
        base.ledger_ids,
        [
            "interpreted-prog-ksymbol-register",
            "interpreted-prog-ksymbol-unregister"
        ]
    );
    assert!(cand.findings.is_empty(), "{:#?}", cand.findings);
    let o = compare("interpreter", &base, &cand);
    assert_eq!(o.class, AbClass::Fixed, "{o:#?}");
    assert_eq!(o.fixed, base.ledger_ids);
    // Every removed line is a nameless zero-length KSYMBOL; nothing is added
    // but the counts line.
    for line in &o.diff {
        assert!(
            line.contains("len=0 name=") || line.contains("counts:"),
            "a fix of the interpreter's KSYMBOLs changed more: {line}"
        );
    }
    let ids = base.ledger_ids.clone();
    assert!(accept(std::slice::from_ref(&o), 1, &ids).accepted);
    assert!(!accept(std::slice::from_ref(&o), 1, &ids[..1]).accepted);
}

/// The checks' positive controls on linux-source-6.12 built with `--checks
/// memory,locking,ub` (`src/testdata/real/6.12-built-control-*`, the
/// messages the agent sent in each control's trial): the kernel log and
/// kmemleak's list the agent read must make each control's report, of its
/// rule, naming the control module's own functions, which
/// `run::controls::judge` takes as the check seeing.
#[test]
fn recorded_6_12_checked_controls_report_their_rule_and_own_frames() {
    use kloop::judge::check::Detail;
    use kloop::run::controls::{judge, CONTROLS};
    use kloop::run::trial::{FailureCause, Verdict};
    for control in CONTROLS {
        let dir = root().join(format!(
            "src/testdata/real/6.12-built-control-{}",
            control.rule
        ));
        let ev = recorded(&dir);
        let reports: Vec<_> = kloop::judge::kernel_log::check(&ev)
            .into_iter()
            .filter_map(|v| match v.detail {
                Some(Detail::KernelReport(r)) => Some(r),
                _ => None,
            })
            .collect();
        let failed = Verdict::failed(
            FailureCause::Rules {
                rules: vec![control.rule.to_string()],
            },
            "",
        );
        let report = judge(&control, &failed, &reports)
            .unwrap_or_else(|blind| panic!("{}: {blind}; reports: {reports:?}", control.rule));
        assert_eq!(report.check, control.rule);
        let own: Vec<&String> = report
            .frames
            .iter()
            .filter(|f| control.functions.contains(&f.as_str()))
            .collect();
        assert!(
            !own.is_empty(),
            "{}: frames {:?} name none of {:?}",
            control.rule,
            report.frames,
            control.functions
        );
        eprintln!(
            "{}: {} ← {}",
            control.rule,
            report.title,
            report.frames.join(" ← ")
        );
    }
}
