use super::testrun::*;
use super::*;

fn rules(a: &Analysis) -> BTreeSet<&'static str> {
    a.violations.iter().map(|v| v.rule).collect()
}

fn dump(a: &Analysis) -> String {
    a.violations.iter().map(|v| format!("{v}\n")).collect()
}

/// Runs the mutated script and asserts exactly `rule` fired.
fn only(script: &Script, rule: &str) -> Analysis {
    let a = analyse(&evidence(script));
    assert_eq!(rules(&a), BTreeSet::from([rule]), "{}", dump(&a));
    a
}

fn find(script: &Script, pred: impl Fn(&Ev) -> bool) -> usize {
    script.iter().position(|(_, _, e)| pred(e)).unwrap()
}

#[test]
fn good_run_has_no_violations() {
    let a = analyse(&evidence(&good_script()));
    assert!(a.violations.is_empty(), "{}", dump(&a));
    assert_eq!(a.sets, vec![vec![0, 1]]);
    assert_eq!(a.merged.len(), 14);
    assert_eq!(a.lost, 0);
    let times: Vec<u64> = a.merged.iter().map(|r| r.time().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted);
}

#[test]
fn missing_unregister() {
    let mut s = good_script();
    let i = find(&s, |e| matches!(e, Ev::Unreg(a, ..) if *a == A_F1));
    s.remove(i);
    let a = only(&s, rule::UNLOAD_SYMBOLS);
    assert!(
        a.violations[0].message.contains("f1: never unregistered"),
        "{}",
        dump(&a)
    );
    assert!(a.violations[0].message.contains(&format!("addr={A_F1:#x}")));
}

#[test]
fn wrong_tag() {
    let mut s = good_script();
    for (_, _, e) in &mut s {
        match e {
            Ev::Load(42, t) | Ev::Unload(42, t) => t[0] ^= 0xff,
            _ => {}
        }
    }
    let a = only(&s, rule::LOAD_MATCHES_INFO);
    assert!(
        a.violations[0]
            .message
            .contains("!= bpf_prog_info.tag 1122334455667788"),
        "{}",
        dump(&a)
    );
}

#[test]
fn wrong_tag_on_unload_only() {
    let mut s = good_script();
    let i = find(&s, |e| matches!(e, Ev::Unload(42, _)));
    if let Ev::Unload(_, t) = &mut s[i].2 {
        t[7] ^= 1;
    }
    only(&s, rule::UNLOAD_MATCHES_LOAD);
}

#[test]
fn wrong_len() {
    let mut s = good_script();
    for (_, _, e) in &mut s {
        match e {
            Ev::Reg(a, len, ..) | Ev::Unreg(a, len, ..) if *a == A_BASIC => *len = 0x50,
            _ => {}
        }
    }
    let a = only(&s, rule::LOAD_SYMBOLS);
    assert!(
        a.violations[0]
            .message
            .contains("len 80 != jited_func_lens[0] 72"),
        "{}",
        dump(&a)
    );
}

#[test]
fn unregister_len_differs_from_register() {
    let mut s = good_script();
    let i = find(&s, |e| matches!(e, Ev::Unreg(a, ..) if *a == A_OOL));
    if let Ev::Unreg(_, len, ..) = &mut s[i].2 {
        *len = 8192;
    }
    // The per-symbol rule and the address-space one both see it: the
    // consumer's map would keep (or drop) another range than announced.
    let a = analyse(&evidence(&s));
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::UNLOAD_SYMBOLS, rule::KSYMBOL_UNREGISTER_RANGE]),
        "{}",
        dump(&a)
    );
}

#[test]
fn unregister_of_unknown_symbol() {
    let mut s = good_script();
    s.push((
        1,
        230,
        Ev::Unreg(
            0xffff_ffff_c00d_0000,
            64,
            KSYM_TYPE_BPF,
            "bpf_prog_0000000000000000_x".into(),
        ),
    ));
    only(&s, rule::UNREGISTER_WITHOUT_REGISTER);
}

#[test]
fn time_going_backwards() {
    let mut s = good_script();
    let i = find(&s, |e| matches!(e, Ev::Unreg(a, ..) if *a == A_F1));
    s[i].1 = 150; // after PROG_LOAD (102) on CPU 0, before CPU 1's previous record (200)
    let a = only(&s, rule::TIME_ORDER);
    assert!(a.violations[0].message.contains("t=200"));
    assert!(a.violations[0].message.contains("t=150"));
}

#[test]
fn lost_records() {
    let mut s = good_script();
    s.insert(3, (0, 103, Ev::Lost(3)));
    let a = only(&s, rule::LOST);
    assert_eq!(a.lost, 3);
    assert!(a.violations[0]
        .message
        .starts_with("3 records lost in total"));
}

/// The LOST records of a listener never report more than the event's
/// lost_samples read after the drain; as many or fewer is fine (losses not
/// yet handed on by a LOST record).
#[test]
fn lost_records_never_exceed_lost_samples() {
    let mut s = good_script();
    s.insert(3, (0, 103, Ev::Lost(3)));
    let mut ev = evidence(&s);
    ev.lost_samples.insert(0, 3);
    ev.lost_samples.insert(1, 0);
    let a = analyse(&ev);
    assert_eq!(
        a.of_rule(rule::LOST_SAMPLES).count(),
        0,
        "{:?}",
        a.violations
    );
    ev.lost_samples.insert(0, 5);
    assert_eq!(analyse(&ev).of_rule(rule::LOST_SAMPLES).count(), 0);
    // A kernel that dropped a loss from lost_samples but not from rb->lost.
    ev.lost_samples.insert(0, 2);
    let a = analyse(&ev);
    let v: Vec<_> = a.of_rule(rule::LOST_SAMPLES).collect();
    assert_eq!(v.len(), 1, "{:?}", a.violations);
    assert!(v[0].message.contains("report 3 lost"), "{}", v[0].message);
    assert!(v[0].message.contains("is 2"), "{}", v[0].message);
}

/// `paused-silent`: a program a batch loaded and unloaded between a pause
/// and a resume (with a wait for the unloads in between) has no BPF_EVENT.
#[test]
fn paused_rings_stay_silent() {
    use kloop_protocol::Step;
    let mut ev = evidence(&good_script());
    ev.steps.insert(1, Step::PauseOutput { paused: true });
    ev.steps.insert(
        2,
        Step::Storm {
            fixture: "subprogs".into(),
            program: "kloop_subprogs".into(),
            cycles: 1,
            drain_every: 0,
            lookup: false,
        },
    );
    ev.steps.insert(3, Step::WaitUnloaded { timeout_ms: 5000 });
    ev.steps.insert(4, Step::PauseOutput { paused: false });
    let mut b = super::stream_tests::batch(vec![999], None);
    b.step = Some(2);
    ev.batches.push(b);
    assert_eq!(analyse(&ev).of_rule(rule::PAUSED_SILENT).count(), 0);
    // A kernel that wrote to the paused rings: program 42's records came.
    ev.batches[0].ids = vec![42];
    let a = analyse(&ev);
    let v: Vec<_> = a.of_rule(rule::PAUSED_SILENT).collect();
    assert_eq!(v.len(), 1, "{:?}", a.violations);
    assert!(v[0].message.contains("steps 1 to 4"), "{}", v[0].message);
}

/// `overwrite-never-full`: an overwrite (backward, read-only) ring loses
/// nothing it counts unless paused.
#[test]
fn overwrite_rings_never_lose() {
    let overwrite = |mut ev: RunEvidence| {
        for l in &mut ev.listeners {
            l.backward = true;
        }
        ev
    };
    let ev = overwrite(evidence(&good_script()));
    assert!(analyse(&ev).violations.is_empty());
    let mut counted = ev.clone();
    counted.lost_samples.insert(1, 4);
    let a = analyse(&counted);
    let v: Vec<_> = a.of_rule(rule::OVERWRITE_NEVER_FULL).collect();
    assert_eq!(v.len(), 1, "{:?}", a.violations);
    assert!(v[0].message.contains("lost_samples 4"), "{}", v[0].message);
    let mut s = good_script();
    s.insert(3, (0, 103, Ev::Lost(3)));
    let a = analyse(&overwrite(evidence(&s)));
    assert!(
        a.of_rule(rule::OVERWRITE_NEVER_FULL)
            .any(|v| v.message.contains("1 LOST record(s) reporting 3")),
        "{:?}",
        a.violations
    );
}

#[test]
fn register_after_load_is_causal_order() {
    let mut s = good_script();
    // f1's register lands on CPU 1 after PROG_LOAD on CPU 0.
    let i = find(&s, |e| matches!(e, Ev::Reg(a, ..) if *a == A_F1));
    let (_, _, e) = s.remove(i);
    s.insert(5, (1, 103, e));
    only(&s, rule::CAUSAL_ORDER);
}

#[test]
fn never_unloaded_program() {
    let mut s = good_script();
    let i = find(&s, |e| matches!(e, Ev::Unload(43, _)));
    s.remove(i);
    let a = only(&s, rule::UNLOAD_MATCHES_LOAD);
    assert!(a.violations[0].message.contains("never unloaded"));
}

#[test]
fn name_must_match_kallsyms_and_tag() {
    let mut s = good_script();
    for (_, _, e) in &mut s {
        match e {
            Ev::Reg(a, _, _, n) | Ev::Unreg(a, _, _, n) if *a == A_BASIC => {
                *n = "bpf_prog_0000000000000000_x".into()
            }
            _ => {}
        }
    }
    let a = only(&s, rule::LOAD_SYMBOLS);
    let m = &a.violations[0].message;
    assert!(
        m.contains("name does not start with bpf_prog_ba51c00000000001"),
        "{m}"
    );
    assert!(m.contains("kallsyms has"), "{m}");
}

#[test]
fn subprogram_named_after_another_functions_tag() {
    // Swap the two functions' names: each still has a valid tag shape,
    // but not its own `prog_tags` entry.
    let mut s = good_script();
    for (_, _, e) in &mut s {
        match e {
            Ev::Reg(a, _, _, n) | Ev::Unreg(a, _, _, n) if *a == A_F1 => {
                *n = format!("bpf_prog_{T_MAIN_F0}_helper")
            }
            _ => {}
        }
    }
    let a = analyse(&evidence(&s));
    let m: Vec<_> = a
        .of_rule(rule::LOAD_SYMBOLS)
        .map(|v| v.message.clone())
        .collect();
    assert!(
        m.iter()
            .any(|m| m.contains(&format!("name does not start with bpf_prog_{T_MAIN_F1}"))),
        "{m:?}"
    );
}

#[test]
fn parse_error_is_reported_with_bytes() {
    let mut ev = evidence(&good_script());
    let s = ev.streams.get_mut(&1).unwrap();
    s[6] = 0x41; // header.size of the first record: 0x..41, not a multiple of 8
    let a = analyse(&ev);
    let p: Vec<_> = a.of_rule(rule::PARSE).collect();
    assert_eq!(p.len(), 1);
    assert!(p[0].message.contains("listener 1, stream offset 0"));
    assert!(p[0].message.contains("bytes at offset: [11000000"));
    assert_eq!((p[0].listener, p[0].offset), (Some(1), Some(0)));
    assert!(p[0].records.is_empty(), "no record parsed to quote");
}

#[test]
fn unknown_type_is_record_type() {
    let mut ev = evidence(&good_script());
    ev.streams
        .get_mut(&0)
        .unwrap()
        .extend(kloop_records::testutil::raw(5, vec![0; 40]));
    let a = analyse(&ev);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::RECORD_TYPE]),
        "{}",
        dump(&a)
    );
    assert!(a.violations[0].message.contains("THROTTLE"));
}

#[test]
fn wrong_cpu_in_trailer_is_sample_id() {
    let mut ev = evidence(&good_script());
    ev.listeners[1].cpu = 3;
    ev.online_cpus = vec![0, 3];
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::SAMPLE_ID]), "{}", dump(&a));
}

#[test]
fn uncovered_cpu_is_listeners() {
    let mut ev = evidence(&good_script());
    ev.online_cpus = vec![0, 1, 2];
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::LISTENERS]), "{}", dump(&a));
}

#[test]
fn every_rule_name_is_listed() {
    let all: BTreeSet<&str> = rule::ALL.iter().copied().collect();
    assert_eq!(all.len(), rule::ALL.len());
}

/// The XDP dispatcher announced before its image was set up (a mutant of
/// bpf_dispatcher_change_prog that registers, then initialises, found by
/// `cargo xtask mutants`): address 0 is not code in kernel memory.
#[test]
fn a_ksymbol_outside_kernel_memory_is_a_record_type_violation() {
    use Ev::*;
    let mut script = good_script();
    script.insert(
        0,
        (
            0,
            5,
            Reg(0, 4096, KSYM_TYPE_BPF, "bpf_dispatcher_xdp".into()),
        ),
    );
    let a = analyse(&evidence(&script));
    let found: Vec<&Violation> = a
        .violations
        .iter()
        .filter(|v| v.rule == rule::RECORD_TYPE)
        .collect();
    assert_eq!(found.len(), 1, "{}", dump(&a));
    assert!(found[0]
        .message
        .contains("addr 0x0 (len 4096) is not in kernel memory"));
    // The same symbol at its real address is fine as far as record-type goes.
    let mut script = good_script();
    let at = 0xffff_ffff_c000_0000;
    script.insert(
        0,
        (
            0,
            5,
            Reg(at, 4096, KSYM_TYPE_BPF, "bpf_dispatcher_xdp".into()),
        ),
    );
    let a = analyse(&evidence(&script));
    assert!(!rules(&a).contains(rule::RECORD_TYPE), "{}", dump(&a));
}

/// Inherited task listeners (attr.inherit, one per CPU) carry, together,
/// the set's records of their process; one that lost a record the kernel
/// should have redirected to it (a mutant of __perf_output_begin that drops
/// the `event->parent` redirect, found by `cargo xtask mutants`) disagrees.
#[test]
fn inherited_listeners_agree_with_the_set_on_their_process() {
    let script = good_script();
    let a = analyse(&with_inherited(evidence(&script), &script, &[]));
    assert!(a.violations.is_empty(), "{}", dump(&a));
    // The records the thread (tid 33, listener 1's) caused never reached
    // the inherited listener.
    let unload = find(&script, |e| matches!(e, Ev::Unload(42, _)));
    let a = analyse(&with_inherited(evidence(&script), &script, &[unload]));
    // The inherited set is also held to its process's programs on its
    // own: the program it saw loaded was never unloaded there.
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LISTENERS_AGREE, rule::UNLOAD_MATCHES_LOAD]),
        "{}",
        dump(&a)
    );
    assert!(
        dump(&a).contains("inherited task listeners [2, 3] (pid 1)"),
        "{}",
        dump(&a)
    );
}

/// Rule `announced`: the final kallsyms read holds what the run left
/// (symbols registered in the run pass, whatever the read before the
/// listeners held passes); a symbol that appeared unannounced, such as a
/// dispatcher image added with bpf_ksym_add instead of bpf_image_ksym_add,
/// fails, and only that rule fails.
#[test]
fn a_symbol_that_appeared_without_a_register_is_not_announced() {
    let mut ev = evidence(&good_script());
    ev.initial_snapshot = true;
    let kept = |addr: u64, name: &str| KallsymsEntry {
        addr,
        kind: 't',
        name: name.into(),
        module: Some("bpf".into()),
    };
    ev.final_kallsyms = Some(vec![
        kept(A_OLD, &name_old()),
        kept(A_BASIC, &name_basic()),
        kept(A_OOL, "kprobe_insn_page"),
    ]);
    let a = analyse(&ev);
    assert!(a.violations.is_empty(), "{}", dump(&a));

    let dispatcher = 0xffff_ffff_c000_9000;
    ev.final_kallsyms
        .as_mut()
        .unwrap()
        .push(kept(dispatcher, "bpf_dispatcher_xdp"));
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::ANNOUNCED]), "{}", dump(&a));
    assert!(dump(&a).contains("bpf_dispatcher_xdp at 0xffffffffc0009000 ([bpf])"));

    // A register at another address does not announce it; without the
    // snapshot before the listeners there is nothing to compare with.
    let mut s = good_script();
    s.insert(
        0,
        (
            0,
            99,
            Ev::Reg(
                dispatcher + 8,
                4096,
                KSYM_TYPE_BPF,
                "bpf_dispatcher_xdp".into(),
            ),
        ),
    );
    let mut ev2 = evidence(&s);
    ev2.initial_snapshot = true;
    ev2.final_kallsyms = ev.final_kallsyms.clone();
    assert!(rules(&analyse(&ev2)).contains(rule::ANNOUNCED));
    ev.initial_snapshot = false;
    assert!(!rules(&analyse(&ev)).contains(rule::ANNOUNCED));
}

/// Rule `withdrawn`: a symbol the set saw registered (or that was there
/// when it opened) and that is gone from the final read needs its
/// unregister; a mutant that drops collect_one_slot's unregister of a
/// kprobe page, or a program whose unload forgot its functions, fails only
/// this rule. BPF images (removed before they are announced) are left out.
#[test]
fn a_symbol_that_left_kallsyms_without_an_unregister_is_not_withdrawn() {
    // collect_one_slot's unregister of the kprobe page dropped.
    let mut script = good_script();
    script.retain(|(_, _, e)| !matches!(e, Ev::Unreg(a, ..) if *a == A_OOL));
    let mut ev = evidence(&script);
    ev.initial_snapshot = true;
    let kept = |addr: u64, name: &str| KallsymsEntry {
        addr,
        kind: 't',
        name: name.into(),
        module: Some("bpf".into()),
    };
    let all = vec![kept(A_OLD, &name_old()), kept(A_OOL, "kprobe_insn_page")];
    ev.final_kallsyms = Some(all.clone());
    // The page kept, as the kernel keeps its last one: nothing to say.
    assert!(
        analyse(&ev).violations.is_empty(),
        "{}",
        dump(&analyse(&ev))
    );
    // The page gone without its unregister.
    ev.final_kallsyms = Some(vec![all[0].clone()]);
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::WITHDRAWN]), "{}", dump(&a));
    assert!(
        dump(&a).contains("kprobe_insn_page") && dump(&a).contains("registered in the run"),
        "{}",
        dump(&a)
    );
    // A symbol there before the listeners opened and gone at the end; a BPF
    // image is left out.
    let mut initial = ev.initial_kallsyms.clone();
    initial.push(kept(0xffff_ffff_c000_a000, "kprobe_optinsn_page"));
    initial.push(kept(0xffff_ffff_c000_b000, "bpf_trampoline_6442468932"));
    ev.initial_kallsyms = initial;
    ev.final_kallsyms = Some(all);
    let a = analyse(&ev);
    assert_eq!(rules(&a), BTreeSet::from([rule::WITHDRAWN]), "{}", dump(&a));
    let d = dump(&a);
    assert!(
        d.contains("kprobe_optinsn_page") && d.contains("there when the listeners opened"),
        "{d}"
    );
    assert!(!d.contains("bpf_trampoline_"), "{d}");
}
