//! `inventory`: programs loaded before the recording and their unloads.

use super::*;

/// Programs the agent loaded before recording that no inventory lists.
fn uninventoried<'r>(ev: &RunEvidence) -> Vec<Found<'r>> {
    let mut msgs: Vec<Found<'r>> = Vec::new();
    // A program the plan unloaded before its first CPU-wide listener opened
    // was gone when recording began: no inventory can list it (perf's own
    // synthesis reads only what is loaded), and the stream shows nothing
    // of it.
    let recording_from = ev
        .listeners
        .iter()
        .filter(|l| l.cpu >= 0)
        .filter_map(|l| ev.window(l.index).opened)
        .min();
    let gone_before = |label: &str| match (ev.prog_steps(label).1, recording_from) {
        (Some(unload), Some(from)) => unload < from,
        _ => false,
    };
    for f in ev
        .progs
        .iter()
        .filter(|f| ev.preexisting.contains(&f.id) && !gone_before(&f.label))
    {
        if !ev.inventory.iter().any(|p| p.id == f.id) {
            msgs.push(
                format!(
                "program {:?} (id {}, {}) was loaded before recording but no inventory lists it",
                f.label, f.id, f.name
            )
                .into(),
            );
        }
    }
    msgs
}

/// What an inventoried function's KSYMBOL unregister `r` (named `name`)
/// has wrong against the inventory: length, type, kallsyms name, tag.
fn inventoried_diffs(
    p: &ProgFacts,
    fi: usize,
    addr: u64,
    flen: u32,
    r: &Record,
    name: &str,
) -> Vec<String> {
    let RecordBody::Ksymbol { len, ksym_type, .. } = &r.body else {
        return Vec::new();
    };
    let mut diffs = len_and_type_diffs(
        *len,
        *ksym_type,
        flen,
        &format!("inventoried jited_func_lens[{fi}]"),
    );
    let ks: Vec<&str> = p
        .kallsyms
        .iter()
        .filter(|e| e.addr == addr)
        .map(|e| e.name.as_str())
        .collect();
    if ks.is_empty() {
        diffs.push("the inventory has no kallsyms line at that address".into());
    } else if !ks.contains(&name) {
        diffs.push(format!("the inventory's kallsyms names it {ks:?}"));
    }
    if !facts_name_ok(p, name) {
        diffs.push("name does not carry one of its inventoried tags".into());
    }
    diffs
}

/// `inventory`: programs that predate the recording and their unloads.
pub(super) fn check_inventory(
    ev: &RunEvidence,
    m: &Model<'_>,
    has_ksym: bool,
    has_bpf: bool,
    out: &mut Vec<Violation>,
) {
    let recs = m.recs;
    let mut msgs = uninventoried(ev);
    for p in &ev.inventory {
        let ours = ev.progs.iter().any(|f| f.id == p.id);
        let who = format!("inventoried program id {} ({})", p.id, p.name);
        let unload = m
            .prog_by_id
            .get(&p.id)
            .into_iter()
            .flatten()
            .filter_map(|l| m.progs.get(*l))
            .find(|l| l.load.is_none())
            .and_then(|l| l.unload);
        if has_bpf {
            match unload.and_then(|q| recs.get(q)) {
                None if ours => msgs.push(
                    format!(
                        "{who}: the agent unloaded it but the stream has no PROG_UNLOAD for it"
                    )
                    .into(),
                ),
                None => continue,
                Some(r) => {
                    if r.bpf_event(BPF_EVENT_PROG_UNLOAD).map(|(_, t)| t) != Some(p.tag) {
                        msgs.push(quoting(
                            format!(
                                "{who}: PROG_UNLOAD tag differs from the inventoried tag {}: {r}",
                                hex::encode(p.tag)
                            ),
                            [r],
                        ));
                    }
                }
            }
        }
        if !has_ksym {
            continue;
        }
        for (fi, (&addr, &flen)) in p.jited_ksyms.iter().zip(&p.jited_func_lens).enumerate() {
            let unreg = m
                .sym_by_addr
                .get(&addr)
                .into_iter()
                .flatten()
                .filter_map(|l| m.syms.get(*l))
                .find(|s| s.reg.is_none())
                .and_then(|s| s.unreg);
            let Some(u) = unreg else {
                if ours || unload.is_some() {
                    msgs.push(format!(
                        "{who} f{fi}: no unregister of its inventoried symbol at {addr:#x} (len {flen})"
                    ).into());
                }
                continue;
            };
            let Some(r) = recs.get(u) else { continue };
            if let RecordBody::Ksymbol { name, .. } = &r.body {
                let mut diffs = inventoried_diffs(p, fi, addr, flen, r, name);
                if let Some(q) = unload {
                    if before(recs, u, q) == Some(false) {
                        diffs.push(format!("after its PROG_UNLOAD {}", fmt_idx(recs, Some(q))));
                    }
                }
                if !diffs.is_empty() {
                    msgs.push(quoting(
                        format!("{who} f{fi}: {}: {r}", diffs.join("; ")),
                        [r],
                    ));
                }
            }
        }
    }
    push_capped(out, rule::INVENTORY, "inventory mismatches", msgs);
}
