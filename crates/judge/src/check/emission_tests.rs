//! `symbol-state` on the synthetic run of `testrun`, with a watch whose
//! observations are made from the script itself.
use super::testrun::*;
use super::*;
use crate::evidence::KsymbolWatchEvidence;
use kloop_protocol::KsymbolObservation;

const A_TRAMP: u64 = 0xffff_ffff_c000_9000;

fn tramp_name() -> String {
    "bpf_trampoline_6442523898".to_string()
}

/// What `%ps` gives for an address kallsyms cannot resolve.
fn raw(addr: u64) -> String {
    format!("{addr:#x}")
}

/// One observation per KSYMBOL of `script`, in time order, symbolized as
/// the source promises: programs and a registered trampoline resolve, an
/// unregistered trampoline and OOL pages do not; kprobe pages are listed.
fn watch_of(script: &Script) -> KsymbolWatchEvidence {
    let mut events: Vec<&(u32, u64, Ev)> = script.iter().collect();
    events.sort_by_key(|(_, t, _)| *t);
    let observations = events
        .into_iter()
        .filter_map(|(_, _, e)| match e {
            Ev::Reg(a, l, ty, n) => Some((*a, *l, *ty, false, n.clone())),
            Ev::Unreg(a, l, ty, n) => Some((*a, *l, *ty, true, n.clone())),
            _ => None,
        })
        .map(|(addr, len, ksym_type, unregister, name)| {
            let resolves =
                ksym_type == KSYM_TYPE_BPF && (name.starts_with("bpf_prog_") || !unregister);
            let symbolized = if resolves { name.clone() } else { raw(addr) };
            KsymbolObservation {
                listed: (ksym_type == KSYM_TYPE_OOL).then_some(true),
                ksym_type,
                unregister,
                addr,
                len,
                snprintf_ret: symbolized.len() as i64,
                name,
                symbolized,
            }
        })
        .collect();
    KsymbolWatchEvidence {
        observations,
        dropped: 0,
    }
}

/// The good script with a trampoline image registered and unregistered.
fn script_with_trampoline() -> Script {
    let mut s = good_script();
    s.push((0, 120, Ev::Reg(A_TRAMP, 4096, KSYM_TYPE_BPF, tramp_name())));
    s.push((
        0,
        130,
        Ev::Unreg(A_TRAMP, 4096, KSYM_TYPE_BPF, tramp_name()),
    ));
    s
}

fn analyse_with(script: &Script, watch: KsymbolWatchEvidence) -> Analysis {
    let mut ev = evidence(script);
    ev.ksymbol_watch = Some(watch);
    analyse(&ev)
}

fn messages(a: &Analysis) -> Vec<String> {
    a.violations.iter().map(|v| v.to_string()).collect()
}

fn observation(
    w: &mut KsymbolWatchEvidence,
    addr: u64,
    unregister: bool,
) -> &mut KsymbolObservation {
    w.observations
        .iter_mut()
        .find(|o| o.addr == addr && o.unregister == unregister)
        .expect("the script has this record")
}

#[test]
fn watched_good_run_has_no_violations() {
    let s = script_with_trampoline();
    let a = analyse_with(&s, watch_of(&s));
    assert!(a.violations.is_empty(), "{:?}", messages(&a));
}

#[test]
fn trampoline_registered_before_its_symbol_is_added() {
    // bpf_image_ksym_add with its two calls swapped.
    let s = script_with_trampoline();
    let mut w = watch_of(&s);
    observation(&mut w, A_TRAMP, false).symbolized = raw(A_TRAMP);
    let a = analyse_with(&s, w);
    let m = messages(&a);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].starts_with("[symbol-state] bpf_trampoline_6442523898 did not resolve when its register was emitted"), "{m:?}");
    assert_eq!(a.violations[0].records.len(), 1);
}

#[test]
fn trampoline_unregistered_while_still_listed() {
    let s = script_with_trampoline();
    let mut w = watch_of(&s);
    observation(&mut w, A_TRAMP, true).symbolized = tramp_name();
    let m = messages(&analyse_with(&s, w));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains("still resolved when its unregister was emitted"),
        "{m:?}"
    );
}

#[test]
fn program_unregister_that_no_longer_resolves() {
    // What a BPF symbol tree emptied under a live program looks like.
    let s = good_script();
    let mut w = watch_of(&s);
    observation(&mut w, A_BASIC, true).symbolized = raw(A_BASIC);
    let m = messages(&analyse_with(&s, w));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains(&format!(
            "{} did not resolve when its unregister was emitted",
            name_basic()
        )),
        "{m:?}"
    );
    assert!(m[0].contains("__bpf_prog_put_noref"), "{m:?}");
}

#[test]
fn a_subprogram_may_resolve_to_another_name_at_its_address() {
    // The main program and its first function share an address and may
    // carry different tags: resolving to either is resolving.
    let s = good_script();
    let mut w = watch_of(&s);
    observation(&mut w, A_F0, false).symbolized = "bpf_prog_1122334455667788_kloop_subprogs".into();
    let a = analyse_with(&s, w);
    assert!(a.violations.is_empty(), "{:?}", messages(&a));
}

#[test]
fn a_record_without_its_observation() {
    let s = good_script();
    let mut w = watch_of(&s);
    w.observations
        .retain(|o| !(o.addr == A_OOL && o.unregister));
    let m = messages(&analyse_with(&s, w.clone()));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains("no perf_event_ksymbol call the watch observed emitted this record"),
        "{m:?}"
    );
    // A watch that dropped calls cannot say which record it missed.
    w.dropped = 1;
    let a = analyse_with(&s, w);
    assert!(a.violations.is_empty(), "{:?}", messages(&a));
}

#[test]
fn an_observation_serves_one_record_only() {
    let mut s = good_script();
    // The OOL page registered twice but observed once.
    s.push((
        0,
        300,
        Ev::Reg(A_OOL, 4096, KSYM_TYPE_OOL, "kprobe_insn_page".into()),
    ));
    let w = watch_of(&good_script());
    let a = analyse_with(&s, w);
    assert!(
        a.of_rule(rule::SYMBOL_STATE)
            .any(|v| v.message.contains("no perf_event_ksymbol call")),
        "{:?}",
        messages(&a)
    );
}

#[test]
fn a_name_the_watch_cut_still_matches() {
    let long = format!("bpf_trampoline_{}", "9".repeat(60));
    let mut s = good_script();
    s.push((0, 120, Ev::Reg(A_TRAMP, 4096, KSYM_TYPE_BPF, long.clone())));
    let mut w = watch_of(&s);
    let o = observation(&mut w, A_TRAMP, false);
    o.name.truncate(63);
    o.symbolized.truncate(63);
    let a = analyse_with(&s, w);
    assert!(a.violations.is_empty(), "{:?}", messages(&a));
}

#[test]
fn a_failed_symbolization_is_reported() {
    let s = good_script();
    let mut w = watch_of(&s);
    let o = observation(&mut w, A_BASIC, false);
    o.snprintf_ret = -22;
    o.symbolized.clear();
    let m = messages(&analyse_with(&s, w));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains("could not symbolize") && m[0].contains("returned -22"),
        "{m:?}"
    );
}

#[test]
fn without_a_watch_the_rule_does_not_run() {
    let a = analyse(&evidence(&good_script()));
    assert!(a.of_rule(rule::SYMBOL_STATE).next().is_none());
}

#[test]
fn kprobe_page_unregistered_after_leaving_its_list() {
    // collect_one_slot with list_del_rcu moved before the unregister.
    let s = good_script();
    let mut w = watch_of(&s);
    observation(&mut w, A_OOL, true).listed = Some(false);
    let m = messages(&analyse_with(&s, w.clone()));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains("kprobe_insn_page at 0xffffffffc0005000 was not on its list (a kprobe cache's pages, ftrace's trampolines) when its unregister was emitted"),
        "{m:?}"
    );
    // A page the watch did not look up is an oracle failure, not a pass.
    observation(&mut w, A_OOL, true).listed = None;
    let m = messages(&analyse_with(&s, w));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].contains("could not look kprobe_insn_page"), "{m:?}");
}

#[test]
fn ftrace_trampolines_are_held_to_their_list_and_other_ool_symbols_are_not() {
    const TRAMPOLINE: u64 = 0xffff_ffff_c000_b000;
    const OTHER: u64 = 0xffff_ffff_c000_c000;
    let mut s = good_script();
    s.push((
        0,
        300,
        Ev::Reg(TRAMPOLINE, 4096, KSYM_TYPE_OOL, "ftrace_trampoline".into()),
    ));
    s.push((
        0,
        310,
        Ev::Reg(OTHER, 4096, KSYM_TYPE_OOL, "some_other_ool".into()),
    ));
    let mut w = watch_of(&s);
    observation(&mut w, TRAMPOLINE, false).listed = Some(true);
    observation(&mut w, OTHER, false).listed = None;
    let a = analyse_with(&s, w.clone());
    assert!(a.violations.is_empty(), "{:?}", messages(&a));
    // ftrace_update_trampoline with the perf event moved before
    // ftrace_add_trampoline_to_kallsyms.
    observation(&mut w, TRAMPOLINE, false).listed = Some(false);
    let m = messages(&analyse_with(&s, w));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].contains("ftrace_trampoline at 0xffffffffc000b000 was not on its list")
            && m[0].contains("Add to kallsyms before the perf events"),
        "{m:?}"
    );
}
