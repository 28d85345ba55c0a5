//! The recorder-side rules (batches, load-cpu, provoked loss,
//! inventory, listeners-agree, lookups) over synthetic streams built
//! from the uapi layout (not recorded from a kernel).
use super::testrun::{hex_tag, Ev};
use super::*;
use crate::evidence::{Batch, Lookups};
use kloop_records::testutil::{self, Tr};
use kloop_records::{PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

const ST: u64 = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
const TAG_S: &str = "5151515151515151";

fn name(tag: &str) -> String {
    format!("bpf_prog_{tag}_kloop_basic")
}

/// A storm-like program `id` on listener `li` at time `t`: register,
/// PROG_LOAD, unregister, PROG_UNLOAD.
pub fn cycle(li: u32, t: u64, id: u32, addr: u64) -> Vec<(u32, u64, Ev)> {
    let tag = hex_tag(TAG_S);
    vec![
        (li, t, Ev::Reg(addr, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (li, t + 1, Ev::Load(id, tag)),
        (li, t + 2, Ev::Unreg(addr, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (li, t + 3, Ev::Unload(id, tag)),
    ]
}

/// Evidence with `listeners` (index, cpu) of one spec and the script's
/// records, tid 1 everywhere.
pub fn ev_of(listeners: &[(u32, i32)], script: &[(u32, u64, Ev)]) -> RunEvidence {
    let with_tids: Vec<(u32, u64, u32, Ev)> = script
        .iter()
        .map(|(li, t, e)| (*li, *t, 1, e.clone()))
        .collect();
    ev_of_tasks(listeners, &with_tids)
}

/// As [`ev_of`], each record written by the task `tid`.
pub fn ev_of_tasks(listeners: &[(u32, i32)], script: &[(u32, u64, u32, Ev)]) -> RunEvidence {
    let ls: Vec<ListenerInfo> = listeners
        .iter()
        .map(|(i, c)| testutil::listener(*i, *c, ST))
        .collect();
    let mut streams: BTreeMap<u32, Vec<u8>> = ls.iter().map(|l| (l.index, Vec::new())).collect();
    for (li, time, tid, e) in script {
        let l = ls.iter().find(|l| l.index == *li).unwrap();
        let t = Tr {
            pid: *tid,
            tid: *tid,
            time: *time,
            cpu: l.cpu.max(0) as u32,
            ..Tr::default()
        };
        let bytes = match e {
            Ev::Reg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, false, n, t),
            Ev::Unreg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, true, n, t),
            Ev::Load(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_LOAD, *id, *tag, t),
            Ev::Unload(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_UNLOAD, *id, *tag, t),
            Ev::Lost(n) => testutil::lost(l, 0, *n, t),
        };
        streams.get_mut(li).unwrap().extend(bytes);
    }
    RunEvidence {
        online_cpus: vec![0, 1],
        listeners: ls,
        streams,
        ..RunEvidence::default()
    }
}

pub fn batch(ids: Vec<u32>, cpu: Option<u32>) -> Batch {
    Batch {
        fixture: "basic".into(),
        program: "kloop_basic".into(),
        functions: 1,
        ids,
        cpu,
        tid: None,
        lookups: None,
        step: None,
    }
}

pub fn storm_script() -> Vec<(u32, u64, Ev)> {
    let mut s = cycle(0, 100, 50, 0xffff_ffff_c000_1000);
    s.extend(cycle(1, 200, 51, 0xffff_ffff_c000_1000));
    s.extend(cycle(0, 300, 52, 0xffff_ffff_c000_2000));
    s
}

fn rules(a: &Analysis) -> BTreeSet<&'static str> {
    a.violations.iter().map(|v| v.rule).collect()
}

fn dump(a: &Analysis) -> String {
    a.violations.iter().map(|v| format!("{v}\n")).collect()
}

/// `programs-accounted` fired with a message containing `needle`.
fn assert_unaccounted(a: &Analysis, needle: &str) {
    assert!(
        a.of_rule(rule::PROGRAMS_ACCOUNTED)
            .any(|v| v.message.contains(needle)),
        "{}",
        dump(a)
    );
}

#[test]
fn storm_programs_are_accounted() {
    let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.accounted.len(), 12);
}

/// A storm cycle whose loader migrated from CPU `from` to CPU `to`
/// between the KSYMBOL register and the PROG_LOAD: the kernel emits
/// each record with its own perf_iterate_sb() on the current CPU.
fn migrated_cycle(from: u32, to: u32, t: u64, id: u32, addr: u64) -> Vec<(u32, u64, Ev)> {
    let mut c = cycle(to, t, id, addr);
    c[0].0 = from;
    c
}

#[test]
fn unpinned_loader_migrating_between_register_and_load_is_accounted() {
    // The 7.3/short-lived flake: the register in CPU 1's ring, the
    // PROG_LOAD (and the rest) in CPU 0's.
    let mut s = cycle(0, 100, 50, 0xffff_ffff_c000_1000);
    s.extend(migrated_cycle(1, 0, 200, 51, 0xffff_ffff_c000_2000));
    s.extend(migrated_cycle(0, 1, 300, 52, 0xffff_ffff_c000_3000));
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.accounted.len(), 12);
}

#[test]
fn unpinned_loader_missing_register_still_fails() {
    // Migration must not excuse a register that is nowhere.
    let mut s = cycle(0, 100, 50, 0xffff_ffff_c000_1000);
    let mut m = migrated_cycle(1, 0, 200, 51, 0xffff_ffff_c000_2000);
    m.remove(0);
    m.remove(1); // and its unregister, so only the program records remain
    s.extend(m);
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51], None)];
    let a = analyse(&ev);
    assert!(
        a.of_rule(rule::PROGRAMS_ACCOUNTED)
            .any(|v| v.message.contains("program id 51")
                && v.message.contains("is not a BPF register")),
        "{}",
        dump(&a)
    );
}

#[test]
fn another_tasks_unload_between_register_and_load_is_accounted() {
    // The 6.12 and 7.2 short-lived flakes: the side-band thread (tid
    // 104) held the last reference to program 50 and unloaded it between
    // program 51's register and PROG_LOAD (storm loader, tid 1).
    let tag = hex_tag(TAG_S);
    let (a50, a51) = (0xffff_ffff_c000_1000, 0xffff_ffff_c000_2000);
    let s = vec![
        (0, 100, 1, Ev::Reg(a50, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (0, 101, 1, Ev::Load(50, tag)),
        (1, 200, 1, Ev::Reg(a51, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (
            0,
            201,
            104,
            Ev::Unreg(a50, 0x40, KSYM_TYPE_BPF, name(TAG_S)),
        ),
        (0, 202, 104, Ev::Unload(50, tag)),
        (1, 203, 1, Ev::Load(51, tag)),
        (1, 204, 1, Ev::Unreg(a51, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (1, 205, 1, Ev::Unload(51, tag)),
    ];
    let mut ev = ev_of_tasks(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51], None)];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // The same interleaving with the loader's register gone fails.
    let mut ev = ev_of_tasks(
        &[(0, 0), (1, 1)],
        &[&s[..2], &s[3..5], &s[5..6], &s[7..]].concat(),
    );
    ev.batches = vec![batch(vec![50, 51], None)];
    let a = analyse(&ev);
    assert_unaccounted(&a, "program id 51");
}

#[test]
fn pinned_loader_split_across_rings_fails() {
    // A loader pinned to CPU 0 cannot migrate: a register in CPU 1's
    // ring is a kernel bug (load-cpu) and the program is unaccounted.
    let s = migrated_cycle(1, 0, 100, 50, 0xffff_ffff_c000_1000);
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50], Some(0))];
    let a = analyse(&ev);
    assert_unaccounted(
        &a,
        "only 0 record(s) before its PROG_LOAD from its loading task (tid 1) in its ring",
    );
}

#[test]
fn storm_program_without_records_is_a_violation() {
    let mut s = storm_script();
    s.retain(|(_, t, _)| *t < 200 || *t >= 300); // id 51 vanished
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    let a = analyse(&ev);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::PROGRAMS_ACCOUNTED]),
        "{}",
        dump(&a)
    );
    assert!(a.violations[0]
        .message
        .contains("program id 51: no PROG_LOAD"));
}

#[test]
fn storm_program_missing_its_unload_is_a_violation() {
    let mut s = storm_script();
    s.retain(|(_, t, _)| *t != 303);
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    let a = analyse(&ev);
    assert!(rules(&a).contains(rule::PROGRAMS_ACCOUNTED), "{}", dump(&a));
    assert_unaccounted(&a, "id 52: no PROG_UNLOAD");
}

#[test]
fn unreported_program_in_a_batch_run_is_a_violation() {
    let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
    ev.batches = vec![batch(vec![50, 52], None)];
    let a = analyse(&ev);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::PROGRAMS_ACCOUNTED]),
        "{}",
        dump(&a)
    );
    assert!(a.violations[0]
        .message
        .contains("no step of the run reported"));
    // The record the message quotes travels with it as data, and places
    // the violation in its stream.
    let v = &a.violations[0];
    let q = &v.records[0];
    assert_eq!((q.type_name.as_str(), q.id), ("BPF_EVENT", Some(51)));
    assert_eq!(q.event.as_deref(), Some("PROG_LOAD"));
    assert_eq!(q.tag.as_deref(), Some(TAG_S));
    assert!(v.message.contains(&q.text), "{} / {}", v.message, q.text);
    assert_eq!((v.listener, v.offset), (Some(q.listener), Some(q.offset)));
}

#[test]
fn concurrent_load_on_another_cpu_is_load_cpu() {
    let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
    // 51's records are in CPU 1's ring, but the loader says CPU 0.
    ev.batches = vec![batch(vec![50, 51, 52], Some(0))];
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::LOAD_CPU]), "{}", dump(&a));
    assert!(a.violations[0].message.contains("in the ring of CPU 1"));
    let q = &a.violations[0].records[0];
    assert_eq!((q.listener, q.cpu), (1, Some(1)), "{q:?}");
    ev.batches = vec![batch(vec![50, 52], Some(0)), batch(vec![51], Some(1))];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
}

#[test]
fn provoked_loss_must_add_up_exactly() {
    // Three programs cause 12 records; listener 0 kept 4 and lost 8.
    let mut s = cycle(1, 200, 51, 0xffff_ffff_c000_1000);
    s.push((0, 150, Ev::Lost(8)));
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    ev.provoked_loss = true;
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.loss[0].caused, 12);
    assert_eq!(a.loss[0].received + a.loss[0].lost, 12);
    // One lost record unaccounted for.
    let mut s2 = s.clone();
    s2.retain(|(_, _, e)| !matches!(e, Ev::Lost(_)));
    s2.push((0, 150, Ev::Lost(7)));
    let mut ev2 = ev_of(&[(0, 0), (1, 1)], &s2);
    ev2.batches = ev.batches.clone();
    ev2.provoked_loss = true;
    let a = analyse(&ev2);
    assert_eq!(rules(&a), BTreeSet::from([rule::LOST]), "{}", dump(&a));
    assert!(a.violations[0]
        .message
        .contains("4 records received + 7 lost = 11 != 12"));
    // Without the declaration, any loss is a violation.
    ev.provoked_loss = false;
    assert!(rules(&analyse(&ev)).contains(rule::LOST));
}

#[test]
fn preexisting_unload_split_across_rings_is_explained() {
    // A program from before the recording whose symbol is named after
    // a function tag, not the program tag: only the unregister right
    // before its PROG_UNLOAD explains the unload. The unloading task
    // migrated between the two records (each is its own
    // perf_iterate_sb() on the current CPU).
    let ftag = "6262626262626262";
    let addr = 0xffff_ffff_c000_4000;
    let s = vec![
        (1, 10, Ev::Unreg(addr, 0x40, KSYM_TYPE_BPF, name(ftag))),
        (0, 11, Ev::Unload(78, hex_tag(TAG_S))),
    ];
    let analysed = |script: &[(u32, u64, Ev)]| {
        let mut ev = ev_of(&[(0, 0), (1, 1)], script);
        ev.initial_kallsyms = vec![KallsymsEntry {
            addr,
            kind: 't',
            name: name(ftag),
            module: Some("bpf".into()),
        }];
        analyse(&ev)
    };
    let a = analysed(&s);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // Without that unregister nothing explains the PROG_UNLOAD.
    let a = analysed(&s[1..]);
    assert!(
        rules(&a).contains(rule::UNLOAD_MATCHES_LOAD),
        "{}",
        dump(&a)
    );
}

#[test]
fn inventoried_program_unload_must_match_the_inventory() {
    let tag = hex_tag(TAG_S);
    let addr = 0xffff_ffff_c000_3000;
    let s = vec![
        (1, 10, Ev::Unreg(addr, 0x40, KSYM_TYPE_BPF, name(TAG_S))),
        (1, 11, Ev::Unload(77, tag)),
    ];
    let facts = ProgFacts {
        label: "early".into(),
        id: 77,
        tag,
        name: "kloop_basic".into(),
        prog_type: 1,
        jited_ksyms: vec![addr],
        jited_func_lens: vec![0x40],
        func_tags: vec![tag],
        func_names: Vec::new(),
        kallsyms: vec![KallsymsEntry {
            addr,
            kind: 't',
            name: name(TAG_S),
            module: Some("bpf".into()),
        }],
    };
    let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
    ev.progs = vec![facts.clone()];
    ev.preexisting = BTreeSet::from([77]);
    // No inventory: nothing explains the unregister.
    let a = analyse(&ev);
    assert!(rules(&a).contains(rule::INVENTORY), "{}", dump(&a));
    assert!(
        rules(&a).contains(rule::UNREGISTER_WITHOUT_REGISTER),
        "{}",
        dump(&a)
    );
    ev.inventory = vec![facts.clone()];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // The inventory says a different length.
    let mut other = facts;
    other.jited_func_lens = vec![0x48];
    ev.inventory = vec![other];
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::INVENTORY]), "{}", dump(&a));
    assert!(a.violations[0]
        .message
        .contains("len 64 != inventoried jited_func_lens[0] 72"));
}

#[test]
fn listeners_must_agree() {
    let mut s = storm_script();
    // A second set (listeners 2 and 3, another ring size) with the same records.
    let copy: Vec<_> = s.iter().map(|(l, t, e)| (l + 2, *t, e.clone())).collect();
    s.extend(copy);
    let mut ev = ev_of(&[(0, 0), (1, 1), (2, 0), (3, 1)], &s);
    for l in &mut ev.listeners {
        if l.index >= 2 {
            l.ring_bytes *= 2;
        }
    }
    ev.batches = vec![batch(vec![50, 51, 52], None)];
    assert!(analyse(&ev).violations.is_empty());
    // Set#1 misses one unregister.
    s.retain(|(l, t, _)| !(*l == 3 && *t == 202));
    let mut ev2 = ev_of(&[(0, 0), (1, 1), (2, 0), (3, 1)], &s);
    ev2.listeners = ev.listeners.clone();
    ev2.batches = ev.batches.clone();
    let a = analyse(&ev2);
    assert!(rules(&a).contains(rule::LISTENERS_AGREE), "{}", dump(&a));
    let m = &a.of_rule(rule::LISTENERS_AGREE).next().unwrap().message;
    assert!(m.contains("only in the first: [L"), "{m}");
    assert!(m.contains("only in the second: []"), "{m}");
    assert!(m.contains("KSYMBOL unregister"), "{m}");
}

#[test]
fn task_listener_must_see_its_task_records() {
    let mut s = storm_script();
    let copy: Vec<_> = s.iter().map(|(_, t, e)| (2, *t, e.clone())).collect();
    s.extend(copy);
    let ev = ev_of(&[(0, 0), (1, 1), (2, -1)], &s);
    assert!(analyse(&ev)
        .violations
        .iter()
        .all(|v| v.rule != rule::LISTENERS_AGREE));
    s.retain(|(l, t, _)| !(*l == 2 && *t == 301));
    let ev = ev_of(&[(0, 0), (1, 1), (2, -1)], &s);
    let a = analyse(&ev);
    // The task set's own pairing sees the PROG_UNLOAD without its load.
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LISTENERS_AGREE, rule::UNLOAD_MATCHES_LOAD]),
        "{}",
        dump(&a)
    );
    assert!(
        a.of_rule(rule::LISTENERS_AGREE)
            .any(|v| v.message.contains("PROG_LOAD id=52")),
        "{}",
        dump(&a)
    );
}

#[test]
fn lookups_must_cover_the_storm() {
    let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
    let mut b = batch(vec![50, 51, 52], None);
    b.lookups = Some(Lookups {
        seen: 3,
        found: 1,
        enoent: 2,
        other_errors: vec![],
    });
    ev.batches = vec![b.clone()];
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(
        a.notes,
        vec!["lookups: 3 ids looked up at once, 1 found, 2 ENOENT (66.7%)".to_string()]
    );
    b.lookups = Some(Lookups {
        seen: 2,
        found: 0,
        enoent: 1,
        other_errors: vec!["id 9: EPERM".into()],
    });
    ev.batches = vec![b];
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::LOOKUPS]), "{}", dump(&a));
    assert_eq!(a.violations.len(), 2, "{}", dump(&a));
}
