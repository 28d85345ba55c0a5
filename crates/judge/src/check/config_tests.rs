//! Listener configurations (issue 31): sets that asked for one record kind,
//! CPU subsets, task-bound sets with no CPU-wide listener, and sets opened
//! or closed between a program's load and its unload. Synthetic streams
//! routed the way `perf_iterate_sb()` routes records (kernel/events/core.c):
//! a record emitted on CPU c by task t goes to the CPU-wide listeners of c
//! (`perf_iterate_sb_cpu()`), to t's own task listeners (`current`'s
//! contexts; an inherited one only on its CPU), and only to those that
//! asked for its kind (`perf_event_ksymbol_match()`,
//! `perf_event_bpf_match()`) and are open at that moment.
use super::stream_tests::batch;
use super::testrun::{evidence, good_script, hex_tag, Ev, A_BASIC, A_F0, A_F1, T_BASIC, T_MAIN};
use super::*;
use crate::evidence::Window;
use kloop_protocol::Step;
use kloop_records::testutil::{self, Tr};
use kloop_records::{PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

const ST: u64 = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
/// The agent's main task (the `load` steps' loader).
const MAIN: u32 = 1;

fn rules(a: &Analysis) -> BTreeSet<&'static str> {
    a.violations.iter().map(|v| v.rule).collect()
}

fn dump(a: &Analysis) -> String {
    a.violations.iter().map(|v| format!("{v}\n")).collect()
}

/// A listener as the agent announces it.
fn listener(index: u32, cpu: i32, ksym: bool, bpf: bool) -> ListenerInfo {
    ListenerInfo {
        ksymbol: ksym,
        bpf_event: bpf,
        ..testutil::listener(index, cpu, ST)
    }
}

fn task_listener(index: u32, cpu: i32, inherit: bool) -> ListenerInfo {
    ListenerInfo {
        pid: Some(MAIN),
        inherit,
        ..listener(index, cpu, true, true)
    }
}

/// One record the kernel emits: on `cpu`, by task `tid`, at `time`.
type Emitted = (u32, u64, u32, Ev);

/// Evidence with `listeners`, each open for the times `live` gives it
/// (all times when absent), fed the records it would receive.
fn routed(
    listeners: Vec<ListenerInfo>,
    live: &BTreeMap<u32, (u64, u64)>,
    script: &[Emitted],
) -> RunEvidence {
    let mut streams: BTreeMap<u32, Vec<u8>> =
        listeners.iter().map(|l| (l.index, Vec::new())).collect();
    for (cpu, time, tid, e) in script {
        let is_k = matches!(e, Ev::Reg(..) | Ev::Unreg(..));
        for l in &listeners {
            let kind = if is_k { l.ksymbol } else { l.bpf_event };
            let place = match (l.pid, l.inherit) {
                (None, _) => l.cpu == *cpu as i32,
                (Some(_), false) => *tid == MAIN,
                (Some(_), true) => l.cpu == *cpu as i32,
            };
            let open = live
                .get(&l.index)
                .is_none_or(|(a, b)| *a <= *time && *time < *b);
            if !(kind && place && open) {
                continue;
            }
            let t = Tr {
                pid: MAIN,
                tid: *tid,
                time: *time,
                cpu: *cpu,
                ..Tr::default()
            };
            let bytes = match e {
                Ev::Reg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, false, n, t),
                Ev::Unreg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, true, n, t),
                Ev::Load(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_LOAD, *id, *tag, t),
                Ev::Unload(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_UNLOAD, *id, *tag, t),
                Ev::Lost(n) => testutil::lost(l, 0, *n, t),
            };
            streams.entry(l.index).or_default().extend(bytes);
        }
    }
    RunEvidence {
        listeners,
        streams,
        ..evidence(&Vec::new())
    }
}

/// `good_script`'s programs as the main task emits them: everything on
/// CPU 0 except the unload of "main", which migrated to CPU 1.
fn main_task_script() -> Vec<Emitted> {
    good_script()
        .into_iter()
        .filter(|(_, _, e)| {
            // Only the two `load` programs: no OOL page, no old program.
            !matches!(e, Ev::Reg(a, ..) | Ev::Unreg(a, ..) if ![A_F0, A_F1, A_BASIC].contains(a))
                && !matches!(e, Ev::Unload(5, _))
        })
        .map(|(l, t, e)| (l, t, MAIN, e))
        .collect()
}

/// What a kernel that gated one record kind on the other kind's counter
/// would send a single-kind set: nothing.
fn without(script: &[Emitted], ksym: bool) -> Vec<Emitted> {
    script
        .iter()
        .filter(|(_, _, _, e)| matches!(e, Ev::Reg(..) | Ev::Unreg(..)) != ksym)
        .cloned()
        .collect()
}

#[test]
fn a_ksymbol_only_set_is_held_to_every_register_and_unregister() {
    let ls = || vec![listener(0, 0, true, false), listener(1, 1, true, false)];
    let a = analyse(&routed(ls(), &BTreeMap::new(), &main_task_script()));
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // KSYMBOL gated on nr_bpf_events: no register reaches a system that
    // holds only KSYMBOL listeners.
    let a = analyse(&routed(
        ls(),
        &BTreeMap::new(),
        &without(&main_task_script(), true),
    ));
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LOAD_SYMBOLS]),
        "{}",
        dump(&a)
    );
    assert_eq!(a.of_rule(rule::LOAD_SYMBOLS).count(), 3, "{}", dump(&a));
}

#[test]
fn a_bpf_event_only_set_is_held_to_every_load_and_unload() {
    let ls = || vec![listener(0, 0, false, true), listener(1, 1, false, true)];
    let a = analyse(&routed(ls(), &BTreeMap::new(), &main_task_script()));
    assert!(a.violations.is_empty(), "{}", dump(&a));
    let a = analyse(&routed(
        ls(),
        &BTreeMap::new(),
        &without(&main_task_script(), false),
    ));
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LOAD_MATCHES_INFO]),
        "{}",
        dump(&a)
    );
}

/// `concurrent`: loader thread 10 + cpu pinned to each CPU, one
/// one-function program per cycle.
fn pinned_script(cycles: u32) -> (Vec<Emitted>, Vec<Batch>) {
    let tag = hex_tag("5151515151515151");
    let name = "bpf_prog_5151515151515151_kloop_basic".to_string();
    let mut s = Vec::new();
    let mut batches = Vec::new();
    for cpu in 0..2u32 {
        let mut ids = Vec::new();
        for k in 0..cycles {
            let id = 100 + cpu * 10 + k;
            let addr = 0xffff_ffff_c010_0000 + u64::from(id) * 0x1000;
            let t = 1000 + u64::from(k) * 10 + u64::from(cpu);
            let tid = 10 + cpu;
            s.push((
                cpu,
                t,
                tid,
                Ev::Reg(addr, 0x40, KSYM_TYPE_BPF, name.clone()),
            ));
            s.push((cpu, t + 1, tid, Ev::Load(id, tag)));
            s.push((
                cpu,
                t + 2,
                tid,
                Ev::Unreg(addr, 0x40, KSYM_TYPE_BPF, name.clone()),
            ));
            s.push((cpu, t + 3, tid, Ev::Unload(id, tag)));
            ids.push(id);
        }
        batches.push(batch(ids, Some(cpu)));
    }
    (s, batches)
}

fn with_batches(mut ev: RunEvidence, batches: Vec<Batch>) -> RunEvidence {
    ev.progs.clear();
    ev.batches = batches;
    ev
}

#[test]
fn single_kind_sets_account_for_batch_programs() {
    let (s, b) = pinned_script(3);
    for (k, bpf) in [(true, false), (false, true)] {
        let ls = vec![listener(0, 0, k, bpf), listener(1, 1, k, bpf)];
        let a = analyse(&with_batches(
            routed(ls.clone(), &BTreeMap::new(), &s),
            b.clone(),
        ));
        assert!(a.violations.is_empty(), "{}", dump(&a));
        // Every record is a batch program's: summarised in the snapshot
        // (two loaders interleave differently from run to run).
        assert_eq!(a.accounted.len(), 12, "ksym={k}");
        // One program of CPU 1's loader left no record of this kind.
        let mut lossy = s.clone();
        lossy.retain(|(cpu, t, _, e)| {
            !(*cpu == 1 && (*t == 1011 || *t == 1012) && matches!(e, Ev::Reg(..) | Ev::Load(..)))
        });
        let a = analyse(&with_batches(
            routed(ls, &BTreeMap::new(), &lossy),
            b.clone(),
        ));
        assert!(
            rules(&a).contains(rule::PROGRAMS_ACCOUNTED),
            "ksym={k}: {}",
            dump(&a)
        );
    }
}

fn on_cpus(l: ListenerInfo, cpus: &[u32]) -> ListenerInfo {
    ListenerInfo {
        cpus: Some(cpus.to_vec()),
        ..l
    }
}

#[test]
fn a_kind_per_cpu_subset_sees_only_its_cpus_loaders() {
    let (s, b) = pinned_script(3);
    // KSYMBOL on CPU 0, BPF_EVENT on CPU 1.
    let ls = vec![
        on_cpus(listener(0, 0, true, false), &[0]),
        on_cpus(listener(1, 1, false, true), &[1]),
    ];
    let ev = with_batches(routed(ls.clone(), &BTreeMap::new(), &s), b.clone());
    let a = analyse(&ev);
    assert_eq!(a.sets, vec![vec![0], vec![1]]);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // A subset set missing from one of its own CPUs still fails.
    let mut ev2 = ev.clone();
    ev2.listeners[0].cpus = Some(vec![0, 1]);
    ev2.online_cpus = vec![0, 1, 2];
    let a = analyse(&ev2);
    assert!(
        a.of_rule(rule::LISTENERS)
            .any(|v| v.message.contains("no listener on its CPU(s) [1]")),
        "{}",
        dump(&a)
    );
    // A kernel that wrote CPU 0's PROG_LOAD to CPU 1's listener.
    let mut leaky = s.clone();
    leaky.push((1, 1001, 10, Ev::Load(100, hex_tag("5151515151515151"))));
    leaky.sort_by_key(|(_, t, _, _)| *t);
    let a = analyse(&with_batches(
        routed(ls.clone(), &BTreeMap::new(), &leaky),
        b.clone(),
    ));
    assert!(rules(&a).contains(rule::LOAD_CPU), "{}", dump(&a));
    // One that wrote CPU 1's registers to CPU 0's listener as well.
    let mut extra = s.clone();
    extra.push((
        0,
        1002,
        11,
        Ev::Reg(
            0xffff_ffff_c020_0000,
            0x40,
            KSYM_TYPE_BPF,
            "bpf_prog_5151515151515151_kloop_basic".into(),
        ),
    ));
    extra.push((
        0,
        1004,
        11,
        Ev::Unreg(
            0xffff_ffff_c020_0000,
            0x40,
            KSYM_TYPE_BPF,
            "bpf_prog_5151515151515151_kloop_basic".into(),
        ),
    ));
    extra.sort_by_key(|(_, t, _, _)| *t);
    let a = analyse(&with_batches(routed(ls, &BTreeMap::new(), &extra), b));
    assert!(rules(&a).contains(rule::LOAD_CPU), "{}", dump(&a));
}

#[test]
fn a_task_listener_alone_is_held_to_its_tasks_programs() {
    let ls = || vec![task_listener(0, -1, false)];
    let a = analyse(&routed(ls(), &BTreeMap::new(), &main_task_script()));
    assert!(a.sets.is_empty());
    assert_eq!(a.task_sets, vec![vec![0]]);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.merged_from, vec![0]);
    // Its task's unregister of "main" f1 never reached it.
    let mut s = main_task_script();
    s.retain(|(_, _, _, e)| !matches!(e, Ev::Unreg(a, ..) if *a == A_F1));
    let a = analyse(&routed(ls(), &BTreeMap::new(), &s));
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::UNLOAD_SYMBOLS]),
        "{}",
        dump(&a)
    );
}

#[test]
fn inherited_listeners_alone_are_held_to_their_process() {
    let (s, b) = pinned_script(2);
    let mut all = main_task_script();
    all.extend(s);
    all.sort_by_key(|(_, t, _, _)| *t);
    let ls = || vec![task_listener(0, 0, true), task_listener(1, 1, true)];
    let mut ev = routed(ls(), &BTreeMap::new(), &all);
    ev.batches = b.clone();
    let a = analyse(&ev);
    assert_eq!(a.task_sets, vec![vec![0, 1]]);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // A thread's PROG_LOAD that was not redirected to the parent's ring.
    all.retain(|(_, t, tid, e)| !(*tid == 11 && *t == 1002 && matches!(e, Ev::Load(..))));
    let mut ev = routed(ls(), &BTreeMap::new(), &all);
    ev.batches = b;
    let a = analyse(&ev);
    assert!(rules(&a).contains(rule::PROGRAMS_ACCOUNTED), "{}", dump(&a));
}

/// Steps: 0 snapshot, 1 open (set A), 2 load main, 3 load basic,
/// 4 open (set B), 5 close A, 6 unload main, 7 unload basic.
fn windowed(script: &[Emitted]) -> RunEvidence {
    let ls = vec![
        listener(0, 0, true, true),
        listener(1, 1, true, true),
        listener(2, 0, true, true),
        listener(3, 1, true, true),
    ];
    // In time: loads at 100..111, B opens at 150, A closes at 160,
    // unloads at 200..211.
    let live = BTreeMap::from([
        (0, (0, 160)),
        (1, (0, 160)),
        (2, (150, u64::MAX)),
        (3, (150, u64::MAX)),
    ]);
    let mut ev = routed(ls, &live, script);
    let label = |l: &str| l.to_string();
    ev.steps = BTreeMap::from([
        (0, Step::SnapshotKallsyms),
        (1, Step::Drain),
        (
            2,
            Step::Load {
                fixture: "subprogs".into(),
                program: "p".into(),
                label: label("main"),
                btf_target: None,
            },
        ),
        (
            3,
            Step::Load {
                fixture: "basic".into(),
                program: "p".into(),
                label: label("basic"),
                btf_target: None,
            },
        ),
        (4, Step::Drain),
        (5, Step::CloseListeners { step: 1 }),
        (
            6,
            Step::Unload {
                label: label("main"),
            },
        ),
        (
            7,
            Step::Unload {
                label: label("basic"),
            },
        ),
    ]);
    for i in [0, 1] {
        ev.windows.insert(
            i,
            Window {
                opened: Some(1),
                closed: Some(5),
            },
        );
    }
    for i in [2, 3] {
        ev.windows.insert(
            i,
            Window {
                opened: Some(4),
                closed: None,
            },
        );
    }
    ev
}

#[test]
fn a_set_opened_late_sees_unloads_and_one_closed_early_loads() {
    let a = analyse(&windowed(&main_task_script()));
    assert_eq!(a.sets, vec![vec![0, 1], vec![2, 3]]);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // The late set must still see every unload: drop basic's PROG_UNLOAD
    // and main's f0 unregister.
    let mut s = main_task_script();
    s.retain(|(_, _, _, e)| {
        !matches!(e, Ev::Unload(43, _)) && !matches!(e, Ev::Unreg(a, ..) if *a == A_F0)
    });
    let a = analyse(&windowed(&s));
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::UNLOAD_MATCHES_LOAD, rule::UNLOAD_SYMBOLS]),
        "{}",
        dump(&a)
    );
    assert!(
        dump(&a).contains("loaded before this set opened"),
        "{}",
        dump(&a)
    );
    // The early-closed set must still have seen every load.
    let mut s = main_task_script();
    s.retain(|(_, _, _, e)| !matches!(e, Ev::Load(42, _)));
    let a = analyse(&windowed(&s));
    assert!(rules(&a).contains(rule::LOAD_MATCHES_INFO), "{}", dump(&a));
    let _ = (T_MAIN, T_BASIC);
}

/// A listener with only other side-band bits (here `mmap` and
/// `namespaces`, which put a CPU-wide event on the CPU's side-band list):
/// the records those bits ask for (FORK on every fork for `mmap`,
/// NAMESPACES) are left alone, a KSYMBOL or BPF_EVENT is a `record-type`
/// violation, and another unasked-for type still is.
#[test]
fn other_side_band_listeners_get_no_ksymbol_or_bpf_event() {
    use kloop_protocol::SideBand;
    let side = |index, cpu| ListenerInfo {
        side_band: vec![SideBand::Mmap, SideBand::Namespaces, SideBand::TextPoke],
        disabled: false,
        backward: false,
        ..listener(index, cpu, false, false)
    };
    let ls = vec![
        listener(0, 0, true, true),
        listener(1, 1, true, true),
        side(2, 0),
        side(3, 1),
    ];
    let mut ev = routed(ls.clone(), &BTreeMap::new(), &main_task_script());
    let fork = testutil::task(
        &side(2, 0),
        false,
        (300, 301),
        Tr {
            cpu: 0,
            time: 1,
            ..Tr::default()
        },
    );
    // TEXT_POKE with PERF_RECORD_MISC_KERNEL, as 6.12 and 7.2 sent one
    // (misc 0x1) while programs loaded: a 5-byte call site rewritten.
    let t = Tr {
        cpu: 1,
        time: 1,
        ..Tr::default()
    };
    let mut poke = testutil::text_poke(&side(3, 1), 0xffff_ffff_8100_0000, 5, 5, t);
    poke[4] = 1;
    let namespaces = testutil::raw(16, vec![0; 16]);
    ev.streams.get_mut(&2).unwrap().extend(fork.clone());
    ev.streams.get_mut(&3).unwrap().extend(namespaces);
    ev.streams.get_mut(&3).unwrap().extend(poke);
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // A kernel whose perf_event_ksymbol_match() took every side-band event.
    let mut leaky: Vec<ListenerInfo> = ls.clone();
    leaky[2].ksymbol = true;
    let mut ev2 = routed(leaky, &BTreeMap::new(), &main_task_script());
    ev2.listeners = ls.clone();
    let a = analyse(&ev2);
    assert!(
        a.of_rule(rule::RECORD_TYPE).any(|v| v
            .message
            .contains("KSYMBOL on a listener opened without ksymbol")),
        "{}",
        dump(&a)
    );
    // A COMM record was not asked for by mmap / namespaces.
    ev.streams
        .get_mut(&2)
        .unwrap()
        .extend(testutil::raw(3, vec![0; 16]));
    let a = analyse(&ev);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::RECORD_TYPE]),
        "{}",
        dump(&a)
    );
}

/// The windows come from the order of the agent's messages: a `Listener`
/// belongs to the step whose `StepStart` came last, a `close-listeners`
/// closes what its named step opened, and programs' steps from their
/// `load` / `unload` steps.
#[test]
fn windows_follow_the_agents_step_order() {
    use kloop_protocol::{ListenerSpec, Message};
    let start = |index: u32, step: Step| Message::StepStart {
        index,
        what: serde_json::to_string(&step).unwrap(),
    };
    let spec = ListenerSpec {
        sample_type: ST,
        ksymbol: true,
        bpf_event: true,
        ring_pages: 16,
        scope: Default::default(),
        inherit: false,
        cpus: None,
        side_band: Vec::new(),
        disabled: false,
        backward: false,
        poll: false,
        poll_watermark: 0,
        sample_id_all: true,
    };
    let load = Step::Load {
        fixture: "basic".into(),
        program: "p".into(),
        label: "x".into(),
        btf_target: None,
    };
    let msgs = vec![
        start(
            0,
            Step::OpenListeners {
                listener: spec.clone(),
            },
        ),
        Message::Listener(listener(0, 0, true, true)),
        start(1, load),
        start(2, Step::CloseListeners { step: 0 }),
        start(3, Step::OpenListeners { listener: spec }),
        Message::Listener(listener(1, 0, true, true)),
        start(4, Step::Unload { label: "x".into() }),
    ];
    let ev = RunEvidence::from_messages(&msgs, BTreeMap::new());
    assert_eq!(
        ev.window(0),
        Window {
            opened: Some(0),
            closed: Some(2)
        }
    );
    assert_eq!(
        ev.window(1),
        Window {
            opened: Some(3),
            closed: None
        }
    );
    assert_eq!(ev.prog_steps("x"), (Some(1), Some(4)));
    assert!(ev.window(0).covers(1) && !ev.window(0).covers(4));
    assert!(!ev.window(1).covers(1) && ev.window(1).covers(4));
    // A load ran between the two opens; nothing between open 0 and close 2
    // but the load.
    assert!(ev.records_made_between(Some(0), Some(3), false));
    assert!(!ev.records_made_between(Some(2), Some(3), false));
}

/// A listener on the agent's task without inherit sees none of the
/// `concurrent` loader threads' records, whether or not a CPU-wide set is
/// there to compare with.
#[test]
fn a_task_listener_alone_sees_no_other_threads_records() {
    let (s, b) = pinned_script(2);
    let mut all = main_task_script();
    all.extend(s.clone());
    all.sort_by_key(|(_, t, _, _)| *t);
    let ls = || vec![task_listener(0, -1, false)];
    let mut ev = routed(ls(), &BTreeMap::new(), &all);
    ev.batches = b.clone();
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // A kernel that offered records to every task's contexts.
    let mut leaky = all.clone();
    for e in &mut leaky {
        e.2 = MAIN;
    }
    let mut ev = routed(ls(), &BTreeMap::new(), &leaky);
    ev.batches = b;
    let a = analyse(&ev);
    assert!(rules(&a).contains(rule::PROGRAMS_ACCOUNTED), "{}", dump(&a));
}

/// 7.2 reuses a freed program's JIT memory: a `concurrent` loader's
/// program registered at the address a `load` step's program had before
/// (the first ksymbol-only run counted 28 of 30 registers when the rule
/// left out every register at a `load` program's address). The loader
/// threads' registers are told apart by task, not by address.
#[test]
fn a_ksymbol_only_set_counts_batch_registers_at_reused_addresses() {
    let (mut s, b) = pinned_script(2);
    for e in &mut s {
        if let Ev::Reg(a, ..) | Ev::Unreg(a, ..) = &mut e.3 {
            if *a == 0xffff_ffff_c010_0000 + 100 * 0x1000 {
                *a = A_BASIC;
            }
        }
    }
    let mut all = main_task_script();
    all.extend(s);
    all.sort_by_key(|(_, t, _, _)| *t);
    let ls = vec![listener(0, 0, true, false), listener(1, 1, true, false)];
    let mut ev = routed(ls.clone(), &BTreeMap::new(), &all);
    ev.batches = b.clone();
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.accounted.len(), 8);
    // A register of CPU 0's loader that never came is still missed.
    all.retain(|(cpu, t, _, e)| !(*cpu == 0 && *t == 1010 && matches!(e, Ev::Reg(..))));
    all.retain(|(cpu, t, _, e)| !(*cpu == 0 && *t == 1012 && matches!(e, Ev::Unreg(..))));
    let mut ev = routed(ls, &BTreeMap::new(), &all);
    ev.batches = b;
    let a = analyse(&ev);
    assert!(rules(&a).contains(rule::PROGRAMS_ACCOUNTED), "{}", dump(&a));
    assert!(rules(&a).contains(rule::LOAD_CPU), "{}", dump(&a));
}

/// The ftrace trampoline the poke tests write: its address and length.
const TRAMPOLINE: u64 = 0xffff_ffff_c010_0000;
const TRAMPOLINE_LEN: u32 = 330;

/// One record of an ftrace trampoline's life on CPU 0.
#[derive(Clone, Copy)]
enum P {
    Reg,
    Unreg,
    Poke(u64, u16, u16),
}

/// `seq` on CPU 0 of a set of two listeners that asked for KSYMBOL and
/// TEXT_POKE (the other CPU's ring empty), analysed.
fn trampoline_run(seq: &[P]) -> Analysis {
    use kloop_protocol::SideBand;
    use kloop_records::KSYM_TYPE_OOL;
    const A: u64 = TRAMPOLINE;
    const L: u32 = TRAMPOLINE_LEN;
    let poking = |index, cpu| ListenerInfo {
        side_band: vec![SideBand::TextPoke],
        disabled: false,
        backward: false,
        ..listener(index, cpu, true, false)
    };
    let ls = vec![poking(0, 0), poking(1, 1)];
    let l = &ls[0];
    let mut bytes = Vec::new();
    for (n, p) in seq.iter().enumerate() {
        let t = Tr {
            time: 10 + n as u64,
            cpu: 0,
            pid: MAIN,
            tid: MAIN,
            ..Tr::default()
        };
        bytes.extend(match *p {
            P::Reg => testutil::ksymbol(l, A, L, KSYM_TYPE_OOL, false, "ftrace_trampoline", t),
            P::Unreg => testutil::ksymbol(l, A, L, KSYM_TYPE_OOL, true, "ftrace_trampoline", t),
            P::Poke(a, o, n) => testutil::text_poke(l, a, o, n, t),
        });
    }
    let ev = RunEvidence {
        listeners: ls.clone(),
        streams: BTreeMap::from([(0, bytes), (1, Vec::new())]),
        progs: Vec::new(),
        ..evidence(&Vec::new())
    };
    analyse(&ev)
}

/// `trampoline-pokes` on a set that asked for KSYMBOL and TEXT_POKE: the
/// order ftrace.c writes (register, poke of the whole text; a retarget
/// inside it; poke of the whole text, unregister) holds; each mutant the
/// catching-power run left alive breaks it: the removal poke dropped
/// (ftrace_trampoline_free:3035 drop-call), written after the unregister
/// (its swap-calls), or one byte long (3037 / 7949 off-by-one).
#[test]
fn ftrace_trampolines_are_poked_in_the_order_ftrace_promises() {
    use kloop_records::RecordBody;
    const A: u64 = TRAMPOLINE;
    let run = trampoline_run;
    let len = TRAMPOLINE_LEN as u16;
    let good = [
        P::Reg,
        P::Poke(A, 0, len),
        P::Poke(A + 0x40, 5, 5),
        P::Poke(A, len, 0),
        P::Unreg,
    ];
    let a = run(&good);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert!(a
        .merged
        .iter()
        .any(|r| matches!(r.body, RecordBody::TextPoke { new_len: 330, .. })));
    let dropped = [
        P::Reg,
        P::Poke(A, 0, len),
        P::Poke(A + 0x40, 5, 5),
        P::Unreg,
    ];
    let swapped = [P::Reg, P::Poke(A, 0, len), P::Unreg, P::Poke(A, len, 0)];
    let longer_free = [P::Reg, P::Poke(A, 0, len), P::Poke(A, len + 1, 0), P::Unreg];
    let longer_new = [P::Reg, P::Poke(A, 0, len + 1), P::Poke(A, len, 0), P::Unreg];
    for (what, seq, needle) in [
        (
            "removal poke dropped",
            &dropped[..],
            "not the TEXT_POKE old_len=330 new_len=0",
        ),
        (
            "removal poke after the unregister",
            &swapped[..],
            "not the TEXT_POKE old_len=330 new_len=0",
        ),
        (
            "removal poke one byte long",
            &longer_free[..],
            "old_len=331",
        ),
        (
            "creation poke one byte long",
            &longer_new[..],
            "new_len=331",
        ),
    ] {
        let a = run(seq);
        // A removal poke after the unregister also writes into code
        // announced gone.
        let mut want = BTreeSet::from([rule::TRAMPOLINE_POKES]);
        if std::ptr::eq(seq, &swapped[..]) {
            want.insert(rule::CODE_LIFETIME);
        }
        assert_eq!(rules(&a), want, "{what}: {}", dump(&a));
        assert!(
            a.of_rule(rule::TRAMPOLINE_POKES)
                .any(|v| v.message.contains(needle)),
            "{what}: {}",
            dump(&a)
        );
    }
}

/// A set that did not ask for TEXT_POKE is not held to `trampoline-pokes`.
#[test]
fn ftrace_trampolines_without_poke_listeners_are_not_held_to_pokes() {
    use kloop_records::KSYM_TYPE_OOL;
    const A: u64 = TRAMPOLINE;
    const L: u32 = TRAMPOLINE_LEN;
    let plain = vec![listener(0, 0, true, false), listener(1, 1, true, false)];
    let mut bytes = Vec::new();
    for (n, unregister) in [false, true].into_iter().enumerate() {
        let t = Tr {
            time: 10 + n as u64,
            cpu: 0,
            pid: MAIN,
            tid: MAIN,
            ..Tr::default()
        };
        bytes.extend(testutil::ksymbol(
            &plain[0],
            A,
            L,
            KSYM_TYPE_OOL,
            unregister,
            "ftrace_trampoline",
            t,
        ));
    }
    let ev = RunEvidence {
        listeners: plain,
        streams: BTreeMap::from([(0, bytes), (1, Vec::new())]),
        progs: Vec::new(),
        ..evidence(&Vec::new())
    };
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
}

/// A task record of the loader-thread tests: (listener, exit, thread,
/// cpu, time).
type TaskRec = (u32, bool, u32, u32, u64);

/// The listeners of the loader-thread tests: a CPU-wide set (L0, L1), an
/// inherited task set (L2, L3) and a task listener without inherit (L4),
/// all with attr.task.
fn task_listeners() -> Vec<ListenerInfo> {
    use kloop_protocol::SideBand;
    let tasky = |l: ListenerInfo| ListenerInfo {
        side_band: vec![SideBand::Task],
        ..l
    };
    vec![
        tasky(listener(0, 0, true, true)),
        tasky(listener(1, 1, true, true)),
        tasky(task_listener(2, 0, true)),
        tasky(task_listener(3, 1, true)),
        tasky(ListenerInfo {
            pid: Some(MAIN),
            ..listener(4, -1, false, false)
        }),
    ]
}

/// The records the kernel routes for two loader threads (501 pinned to
/// CPU 0, 502 to CPU 1) forked from the main task on CPU 0.
fn loader_task_records() -> Vec<TaskRec> {
    vec![
        (0, false, 501, 0, 1),
        (2, false, 501, 0, 1),
        (4, false, 501, 0, 1),
        (0, false, 502, 0, 2),
        (2, false, 502, 0, 2),
        (4, false, 502, 0, 2),
        (0, true, 501, 0, 3),
        (2, true, 501, 0, 3),
        (1, true, 502, 1, 4),
        (3, true, 502, 1, 4),
    ]
}

/// The evidence of `recs` over [`task_listeners`], with the two loader
/// threads' batches.
fn loader_tasks_run(recs: &[TaskRec]) -> RunEvidence {
    let ls = task_listeners();
    let tr = |cpu: u32, time: u64, tid: u32| Tr {
        pid: MAIN,
        tid,
        time,
        cpu,
        ..Tr::default()
    };
    let mut ev = routed(ls.clone(), &BTreeMap::new(), &[]);
    for (li, exit, tid, cpu, time) in recs {
        let l = &ls[*li as usize];
        // A thread's record carries its own tid; a FORK is emitted by
        // the parent.
        let by = if *exit { *tid } else { MAIN };
        ev.streams.get_mut(li).unwrap().extend(testutil::task(
            l,
            *exit,
            (MAIN, *tid),
            tr(*cpu, *time, by),
        ));
    }
    for (tid, cpu) in [(501, 0), (502, 1)] {
        let mut b = batch(Vec::new(), Some(cpu));
        b.tid = Some(tid);
        ev.batches.push(b);
    }
    ev
}

/// Task records (`task-records`): two loader threads, one pinned to each
/// CPU, fork from the main task on CPU 0 and exit on their own CPUs. A
/// CPU-wide set with attr.task gets both FORKs on CPU 0 and each EXIT on
/// the thread's CPU; an inherited task set the same (the FORKs through the
/// parent's context, the EXITs through the thread's inherited copy); a
/// task listener without inherit only the FORKs.
#[test]
fn task_records_follow_fork_and_exit_routing() {
    let good = loader_task_records();
    let build = |recs: &[TaskRec]| analyse(&loader_tasks_run(recs));
    let a = build(&good);
    assert!(!rules(&a).contains(rule::TASK_RECORDS), "{}", dump(&a));
    // perf_iterate_sb() without its `goto done`: the CPU-wide pass after
    // the task context's sends the EXIT twice.
    let mut twice = good.clone();
    twice.push((0, true, 501, 0, 5));
    let a = build(&twice);
    assert!(
        a.of_rule(rule::TASK_RECORDS)
            .any(|v| v.message.contains("2 EXIT records of tid 501")),
        "{}",
        dump(&a)
    );
    // Without the task context's pass the inherited set has no EXIT.
    let no_task_ctx: Vec<_> = good
        .iter()
        .copied()
        .filter(|r| r.0 != 2 && r.0 != 3 || !r.1)
        .collect();
    let a = build(&no_task_ctx);
    assert!(
        a.of_rule(rule::TASK_RECORDS)
            .any(|v| v.message.contains("0 EXIT records of loader thread 501")),
        "{}",
        dump(&a)
    );
    // A listener without inherit is not in the thread's context.
    let mut leaked = good.clone();
    leaked.push((4, true, 502, 1, 4));
    let a = build(&leaked);
    assert!(
        a.of_rule(rule::TASK_RECORDS).any(|v| v
            .message
            .contains("1 EXIT records of loader thread 502")
            && v.message.contains("expected 0")),
        "{}",
        dump(&a)
    );
}

/// A kernel thread started on CPU 0 (a kworker, forked by kthreadd, as a
/// workqueue adds one when the guest runs slowly): the CPU-wide set hears
/// it, no rule minds, and the normalised stream, which keeps the loaders'
/// FORK and EXIT records, is the same as without it.
#[test]
fn a_kernel_threads_task_records_are_the_systems_business() {
    let good = loader_task_records();
    let plain = loader_tasks_run(&good);
    let mut kworker = loader_tasks_run(&good);
    kworker.streams.get_mut(&0).unwrap().extend(testutil::task(
        &task_listeners()[0],
        false,
        (40, 40),
        Tr {
            pid: 2,
            tid: 2,
            time: 5,
            cpu: 0,
            ..Tr::default()
        },
    ));
    let (a_plain, a_kworker) = (analyse(&plain), analyse(&kworker));
    assert_eq!(rules(&a_kworker), rules(&a_plain), "{}", dump(&a_kworker));
    assert!(!rules(&a_kworker).contains(rule::TASK_RECORDS));
    assert_eq!(
        crate::normalise::normalise(&kworker, &a_kworker),
        crate::normalise::normalise(&plain, &a_plain)
    );
    assert!(crate::normalise::normalise(&plain, &a_plain).contains("type=7(FORK)"));
}

/// A listener opened disabled and never enabled receives nothing
/// (`disabled-silent`), and is in no set, so its silence breaks no set rule.
#[test]
fn disabled_listeners_stay_silent() {
    let off = |index, cpu| ListenerInfo {
        disabled: true,
        ..listener(index, cpu, true, true)
    };
    let ls = vec![
        listener(0, 0, true, true),
        listener(1, 1, true, true),
        off(2, 0),
        off(3, 1),
    ];
    let mut ev = routed(ls[..2].to_vec(), &BTreeMap::new(), &main_task_script());
    ev.listeners = ls.clone();
    ev.streams.insert(2, Vec::new());
    ev.streams.insert(3, Vec::new());
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // A kernel that wrote side-band records to an OFF event.
    let ev = routed(ls, &BTreeMap::new(), &main_task_script());
    let a = analyse(&ev);
    assert!(
        a.of_rule(rule::DISABLED_SILENT)
            .any(|v| v.message.contains("opened disabled and never enabled")),
        "{}",
        dump(&a)
    );
}
