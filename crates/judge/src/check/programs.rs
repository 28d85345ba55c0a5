//! The per-program rules of one CPU-wide set: `load-symbols`,
//! `load-matches-info`, `unload-symbols`, `unload-matches-load`, `causal-order`
//! against the `bpf_prog_info` facts, interpreted programs, unreported
//! programs (`programs-accounted`) and `facts`.

use super::*;

/// What a program function's KSYMBOL has wrong against its facts: a
/// length other than `flen` (named `lens` in the message, e.g.
/// `jited_func_lens[1]`) or a type other than BPF.
pub(super) fn len_and_type_diffs(len: u32, ksym_type: u16, flen: u32, lens: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    if len != flen {
        diffs.push(format!("len {len} != {lens} {flen}"));
    }
    if ksym_type != KSYM_TYPE_BPF {
        diffs.push(format!(
            "type {} is not BPF",
            kloop_records::ksym_type_name(ksym_type)
        ));
    }
    diffs
}

/// Checks one CPU-wide set's merged stream.
/// Symbols a recorder knows from before its stream starts: the initial
/// kallsyms snapshot and every inventoried program's kallsyms lines.
pub(crate) fn known_at_start(ev: &RunEvidence) -> Vec<KallsymsEntry> {
    let mut all = ev.initial_kallsyms.clone();
    for p in &ev.inventory {
        all.extend(p.kallsyms.iter().cloned());
    }
    all
}

/// How a program's life lies against a set's window: whether the set was
/// open while the step that loaded it ran, and while the one that unloaded
/// it ran. Programs whose steps the agent did not echo (synthetic runs)
/// count as inside.
pub(super) fn seen_by(ev: &RunEvidence, scope: &SetScope, facts: &ProgFacts) -> (bool, bool) {
    let (load, unload) = ev.prog_steps(&facts.label);
    (
        load.is_none_or(|l| scope.window.covers(l)),
        unload.is_none_or(|u| scope.window.covers(u)),
    )
}

/// Checks one listener set's merged stream; returns its violations and
/// the indexes of the records accounted to batch programs.
///
/// What the set is held to depends on its [`SetScope`]:
/// - the record kinds it asked for (`has_ksym`, `has_bpf`): a set that
///   asked for one kind is held to every record of that kind;
/// - its window: a program loaded before the set opened (an earlier
///   `open-listeners` step than its `load`) predates the set, which must
///   show its unload alone (its kallsyms lines join the symbols the set
///   knows at start); a program unloaded after the set closed
///   (`close-listeners`) must show its load alone; one loaded after the
///   close, nothing;
/// - a CPU subset: only the programs of loaders pinned to its CPUs
///   (`concurrent`); programs of `load` steps, run by the unpinned agent,
///   may be emitted on any CPU and are not held;
/// - a task-bound set: no batch programs unless inherited (a `concurrent`
///   loader is another task).
pub(super) fn check_set(
    ev: &RunEvidence,
    merged: &[Record],
    scope: &SetScope,
    label: &str,
    lossy: bool,
) -> (Vec<Violation>, BTreeSet<usize>) {
    let (has_ksym, has_bpf) = (scope.has_ksym, scope.has_bpf);
    let (held, initial) = held_programs(ev, scope);
    let m = Model::build(merged, &initial);
    let mut out: Vec<Violation> = Vec::new();
    let mut accounted = BTreeSet::new();
    if lossy {
        foreign_programs(ev, merged, &mut out);
        prefix_label(&mut out, label);
        return (out, accounted);
    }
    model_findings(ev, &m, &held, scope, &mut out);
    let rules = ProgramRules {
        merged,
        m: &m,
        has_ksym,
        has_bpf,
    };
    for held in &held {
        rules.check(held, &mut out);
    }
    if has_ksym {
        out.extend(interpreted_symbols(
            &ev.progs,
            &ev.initial_kallsyms,
            merged,
            ev.uname.arch(),
        ));
    }
    // A task listener without inherit follows the agent's main task alone,
    // which runs no batch: no batch program may show in it.
    if scope.task == TaskScope::Task {
        not_my_batches(ev, &m, &mut out);
    } else {
        if has_ksym && has_bpf {
            accounted = check_batches(ev, &m, scope, &mut out);
            if scope.cpus.is_none() {
                foreign_programs(ev, merged, &mut out);
            }
        } else if has_ksym || has_bpf {
            accounted = check_batches_one_kind(ev, &m, scope, &mut out);
        }
    }
    if scope.cpus.is_none() {
        check_inventory(ev, &m, has_ksym, has_bpf, &mut out);
    }
    prefix_label(&mut out, label);
    (out, accounted)
}

/// A program of a `load` step that a set is held to, and how its window
/// saw it.
struct Held<'a> {
    facts: &'a ProgFacts,
    /// The set was open when the step that loaded it ran.
    load_in: bool,
    /// The set was open when the step that unloaded it ran.
    unload_in: bool,
}

/// Programs of `load` steps this set can be held to, and the symbols it
/// knows at start: [`known_at_start`] and the kallsyms lines of programs
/// loaded before the set opened and unloaded while it was open.
fn held_programs<'e>(ev: &'e RunEvidence, scope: &SetScope) -> (Vec<Held<'e>>, Vec<KallsymsEntry>) {
    let mut initial = known_at_start(ev);
    let mut held = Vec::new();
    for facts in &ev.progs {
        if ev.preexisting.contains(&facts.id) {
            continue; // loaded before recording: the `inventory` rule's.
        }
        if scope.cpus.is_some() {
            continue;
        }
        let (load_in, unload_in) = seen_by(ev, scope, facts);
        if !load_in && unload_in {
            initial.extend(facts.kallsyms.iter().cloned());
        }
        held.push(Held {
            facts,
            load_in,
            unload_in,
        });
    }
    (held, initial)
}

/// The pairing violations of the model the set is held to: KSYMBOL ones
/// when it asked for KSYMBOL, BPF_EVENT ones when it asked for BPF_EVENT.
fn model_findings(
    ev: &RunEvidence,
    m: &Model<'_>,
    held: &[Held<'_>],
    scope: &SetScope,
    out: &mut Vec<Violation>,
) {
    // Programs whose unload the set closed before: their "never
    // unloaded" is what the window promises.
    let load_only: BTreeSet<u32> = held
        .iter()
        .filter(|h| h.load_in && !h.unload_in)
        .map(|h| h.facts.id)
        .collect();
    // A KSYMBOL at an interpreted program's address must not exist at all,
    // and interpreted_symbols() reports each one as such (below); pairing
    // two of them (registered again, unregistered again) would report the
    // same records a second time as a fault of another shape.
    let interpreted_addrs: BTreeSet<u64> = ev
        .progs
        .iter()
        .filter(|f| is_interpreted(f))
        .flat_map(|f| f.jited_ksyms.iter().copied())
        .collect();
    let only_interpreted = |f: &Violation| {
        !f.records.is_empty()
            && f.records.iter().all(|q| {
                q.type_name == "KSYMBOL" && q.addr.is_some_and(|a| interpreted_addrs.contains(&a))
            })
    };
    for f in &m.findings {
        if only_interpreted(f) {
            continue;
        }
        let keep = if f.rule == rule::UNLOAD_MATCHES_LOAD {
            scope.has_bpf
                && !(f.records.len() == 1
                    && f.records[0].event.as_deref() == Some("PROG_LOAD")
                    && f.records[0].id.is_some_and(|id| load_only.contains(&id))
                    && f.message.starts_with("program loaded but never unloaded"))
        } else {
            scope.has_ksym
        };
        if keep {
            out.push(f.clone());
        }
    }
}

/// What a violation adds about the records that are there instead:
/// `; <what>: <record> / <record>`, nothing when there are none.
fn records_hint(what: &str, records: &[&Record]) -> String {
    if records.is_empty() {
        return String::new();
    }
    let listed: Vec<String> = records.iter().map(|r| r.to_string()).collect();
    format!("; {what}: {}", listed.join(" / "))
}

/// Pushes a violation quoting the records that are there.
fn bad(
    out: &mut Vec<Violation>,
    rule: &'static str,
    message: String,
    quoted: Vec<Option<&Record>>,
) {
    out.push(Violation::new(rule, message).quoting(quoted.into_iter().flatten()));
}

/// The per-program rules over one set's merged stream and its model.
struct ProgramRules<'a> {
    merged: &'a [Record],
    m: &'a Model<'a>,
    has_ksym: bool,
    has_bpf: bool,
}

/// A held program's load and unload in the merged stream, as far as the
/// set shows them.
struct Life<'h> {
    held: &'h Held<'h>,
    /// How messages name it.
    who: String,
    /// Index of its PROG_LOAD.
    load: Option<usize>,
    /// Index of its PROG_UNLOAD.
    unload: Option<usize>,
}

impl ProgramRules<'_> {
    /// Every rule of one held program: its BPF_EVENTs, then each JITed
    /// function's KSYMBOLs.
    fn check(&self, held: &Held<'_>, out: &mut Vec<Violation>) {
        let facts = held.facts;
        if !held.load_in {
            if held.unload_in {
                unload_only(facts, self.m, self.has_ksym, self.has_bpf, out);
            }
            return;
        }
        let mut life = Life {
            held,
            who: format!(
                "program {:?} (id {}, {})",
                facts.label, facts.id, facts.name
            ),
            load: None,
            unload: None,
        };
        if self.has_bpf {
            self.check_events(&mut life, out);
        }
        if !self.has_ksym || facts.jited_ksyms.len() != facts.jited_func_lens.len() {
            return; // `facts` reports the inconsistency.
        }
        if is_interpreted(facts) {
            return; // `interpreted_symbols` below.
        }
        for (fi, (&addr, &flen)) in facts
            .jited_ksyms
            .iter()
            .zip(&facts.jited_func_lens)
            .enumerate()
        {
            self.check_function(&life, fi, addr, flen, out);
        }
    }

    /// load-matches-info and causal-order of the program's PROG_LOAD and
    /// PROG_UNLOAD; sets `life`'s load and unload from the first load.
    fn check_events(&self, life: &mut Life<'_>, out: &mut Vec<Violation>) {
        let (merged, m, facts, who) = (self.merged, self.m, life.held.facts, &life.who);
        let loads = m.loads_of(facts.id);
        self.check_load_count(life, &loads, out);
        let Some(first) = loads.first().and_then(|l| m.progs.get(*l)) else {
            return;
        };
        life.load = first.load;
        life.unload = first.unload;
        if let Some(r) = life.load.and_then(|p| merged.get(p)) {
            if let Some((_, tag)) = r.bpf_event(BPF_EVENT_PROG_LOAD) {
                if tag != facts.tag {
                    bad(
                        out,
                        rule::LOAD_MATCHES_INFO,
                        format!(
                            "{who}: PROG_LOAD tag {} != bpf_prog_info.tag {}: {r}",
                            hex::encode(tag),
                            hex::encode(facts.tag)
                        ),
                        vec![Some(r)],
                    );
                }
            }
        }
        if let (Some(p), Some(q)) = (life.load, life.unload) {
            if before(merged, p, q) == Some(false) {
                bad(
                    out,
                    rule::CAUSAL_ORDER,
                    format!(
                        "{who}: PROG_UNLOAD before PROG_LOAD: {} / {}",
                        fmt_idx(merged, Some(q)),
                        fmt_idx(merged, Some(p))
                    ),
                    vec![merged.get(q), merged.get(p)],
                );
            }
        }
    }

    /// load-matches-info: exactly one PROG_LOAD with the program's id.
    fn check_load_count(&self, life: &Life<'_>, loads: &[usize], out: &mut Vec<Violation>) {
        let (merged, m, facts, who) = (self.merged, self.m, life.held.facts, &life.who);
        if loads.is_empty() {
            let any_tag = merged
                .iter()
                .filter(|r| {
                    r.bpf_event(BPF_EVENT_PROG_LOAD)
                        .is_some_and(|(_, t)| t == facts.tag)
                })
                .collect::<Vec<_>>();
            let hint = records_hint("PROG_LOAD with its tag", &any_tag);
            bad(
                out,
                rule::LOAD_MATCHES_INFO,
                format!(
                    "{who}: no PROG_LOAD with bpf_prog_info.id {}{hint}",
                    facts.id
                ),
                any_tag.iter().map(|r| Some(*r)).collect(),
            );
        }
        if loads.len() > 1 {
            let all_recs = loads
                .iter()
                .map(|l| {
                    m.progs
                        .get(*l)
                        .and_then(|p| p.load)
                        .and_then(|p| merged.get(p))
                })
                .collect::<Vec<_>>();
            let all = loads
                .iter()
                .map(|l| fmt_idx(merged, m.progs.get(*l).and_then(|p| p.load)))
                .collect::<Vec<_>>();
            bad(
                out,
                rule::LOAD_MATCHES_INFO,
                format!(
                    "{who}: {} PROG_LOAD records for one program: {}",
                    loads.len(),
                    all.join(" / ")
                ),
                all_recs,
            );
        }
    }

    /// Function `fi` (at `addr`, `flen` bytes): its register against the
    /// facts (load-symbols), its order against the program's BPF_EVENTs
    /// (causal-order) and its unregister (unload-symbols).
    fn check_function(
        &self,
        life: &Life<'_>,
        fi: usize,
        addr: u64,
        flen: u32,
        out: &mut Vec<Violation>,
    ) {
        let (merged, m, facts, who) = (self.merged, self.m, life.held.facts, &life.who);
        let (load, unload) = (life.load, life.unload);
        let name_ok = |name: &str| facts_name_ok(facts, name);
        let Some(sym) = m
            .select_sym(addr, load, unload, name_ok)
            .and_then(|l| m.syms.get(l))
        else {
            let elsewhere = merged
                .iter()
                .filter(|r| matches!(r.body, RecordBody::Ksymbol { addr: a, .. } if a == addr))
                .collect::<Vec<_>>();
            let hint = records_hint("KSYMBOL records at that address", &elsewhere);
            bad(
                out,
                rule::LOAD_SYMBOLS,
                format!("{who} f{fi}: no KSYMBOL register at jited_ksyms[{fi}] = {addr:#x} (len {flen}){hint}"), elsewhere.iter().map(|r| Some(*r)).collect());
            return;
        };
        let Some(reg) = sym.reg.and_then(|p| merged.get(p)) else {
            return;
        };
        let diffs = register_diffs(facts, fi, addr, flen, reg);
        if !diffs.is_empty() {
            bad(
                out,
                rule::LOAD_SYMBOLS,
                format!("{who} f{fi}: {}: {reg}", diffs.join("; ")),
                vec![Some(reg)],
            );
        }
        if let (Some(r), Some(p)) = (sym.reg, load) {
            if before(merged, r, p) == Some(false) {
                bad(
                    out,
                    rule::CAUSAL_ORDER,
                    format!(
                        "{who} f{fi}: registered after its PROG_LOAD: {} / {}",
                        fmt_idx(merged, Some(r)),
                        fmt_idx(merged, Some(p))
                    ),
                    vec![merged.get(r), merged.get(p)],
                );
            }
        }
        match sym.unreg {
            None if life.held.unload_in => bad(
                out,
                rule::UNLOAD_SYMBOLS,
                format!("{who} f{fi}: never unregistered: {reg}"),
                vec![Some(reg)],
            ),
            // Unloaded after the set closed: its load is all it saw.
            None => {}
            Some(u) => self.check_unregister_order(life, fi, u, out),
        }
    }

    /// causal-order of function `fi`'s unregister (record `u`): after the
    /// program's PROG_LOAD, before its PROG_UNLOAD.
    fn check_unregister_order(
        &self,
        life: &Life<'_>,
        fi: usize,
        u: usize,
        out: &mut Vec<Violation>,
    ) {
        let (merged, who) = (self.merged, &life.who);
        if let Some(p) = life.load {
            if before(merged, p, u) == Some(false) {
                bad(
                    out,
                    rule::CAUSAL_ORDER,
                    format!(
                        "{who} f{fi}: unregistered before its PROG_LOAD: {} / {}",
                        fmt_idx(merged, Some(u)),
                        fmt_idx(merged, Some(p))
                    ),
                    vec![merged.get(u), merged.get(p)],
                );
            }
        }
        if let Some(q) = life.unload {
            if before(merged, u, q) == Some(false) {
                bad(
                    out,
                    rule::CAUSAL_ORDER,
                    format!(
                        "{who} f{fi}: PROG_UNLOAD before the unregister: {} / {}",
                        fmt_idx(merged, Some(q)),
                        fmt_idx(merged, Some(u))
                    ),
                    vec![merged.get(q), merged.get(u)],
                );
            }
        }
    }
}

/// What function `fi`'s KSYMBOL register `reg` has wrong against the
/// facts: length, type, name prefix and suffix, BTF name, kallsyms name.
fn register_diffs(facts: &ProgFacts, fi: usize, addr: u64, flen: u32, reg: &Record) -> Vec<String> {
    let RecordBody::Ksymbol {
        len,
        ksym_type,
        name,
        ..
    } = &reg.body
    else {
        return Vec::new();
    };
    let mut diffs = len_and_type_diffs(*len, *ksym_type, flen, &format!("jited_func_lens[{fi}]"));
    let prefixes = func_prefixes(facts, fi);
    if prefixes.is_empty() {
        if !has_some_tag_prefix(name) {
            diffs.push("name does not start with bpf_prog_<16 hex digits>".to_string());
        }
    } else if !prefixes.iter().any(|p| name.starts_with(p.as_str())) {
        diffs.push(format!(
            "name does not start with {}",
            prefixes.join(" or ")
        ));
    }
    diffs.extend(name_suffix_diff(name, fi, &facts.name));
    diffs.extend(btf_name_diff(
        name,
        fi,
        &facts.func_names,
        facts.jited_ksyms.len(),
    ));
    let ks: Vec<&KallsymsEntry> = facts.kallsyms.iter().filter(|e| e.addr == addr).collect();
    if !ks.is_empty() && !ks.iter().any(|e| e.name == *name) {
        let names = ks
            .iter()
            .map(|e| format!("{:?}", e.name))
            .collect::<Vec<_>>();
        diffs.push(format!("kallsyms has {} at that address", names.join(", ")));
    }
    diffs
}

/// A task listener without inherit: the `concurrent` / `storm` programs
/// are loaded by other threads (the storm's own loads excepted: the storm
/// runs in the agent's task, and so may show), so none of a `concurrent`
/// loader's PROG_LOADs may be in its stream (`programs-accounted`).
fn not_my_batches(ev: &RunEvidence, m: &Model<'_>, out: &mut Vec<Violation>) {
    let mut msgs: Vec<Found<'_>> = Vec::new();
    for b in ev.batches.iter().filter(|b| b.cpu.is_some()) {
        for &id in &b.ids {
            for l in m.loads_of(id) {
                if let Some(r) = m
                    .progs
                    .get(l)
                    .and_then(|p| p.load)
                    .and_then(|p| m.recs.get(p))
                {
                    msgs.push(quoting(
                        format!(
                            "{} program id {id}: loaded by another thread, yet its PROG_LOAD is in a listener bound to the agent's task without inherit: {r}",
                            b.what()
                        ),
                        [r],
                    ));
                }
            }
        }
    }
    push_capped(
        out,
        rule::PROGRAMS_ACCOUNTED,
        "other threads' programs",
        msgs,
    );
}

/// A program loaded before the set opened and unloaded while it was open
/// (`perf_event_bpf_event()` at the last `bpf_prog_put()` emits the
/// unregisters, then PROG_UNLOAD, whoever listens by then): each JITed
/// function unregistered with its `jited_ksyms` / `jited_func_lens` and
/// its kallsyms name, and one PROG_UNLOAD with its id and tag after them;
/// no PROG_LOAD and no register of it (those came before the set).
fn unload_only(
    facts: &ProgFacts,
    m: &Model<'_>,
    has_ksym: bool,
    has_bpf: bool,
    out: &mut Vec<Violation>,
) {
    let merged = m.recs;
    let who = format!(
        "program {:?} (id {}, {}), loaded before this set opened",
        facts.label, facts.id, facts.name
    );
    let unload = if has_bpf {
        unload_event(facts, m, &who, out)
    } else {
        None
    };
    if !has_ksym || is_interpreted(facts) {
        return;
    }
    for (fi, (&addr, &flen)) in facts
        .jited_ksyms
        .iter()
        .zip(&facts.jited_func_lens)
        .enumerate()
    {
        let lives: Vec<&SymLife> = m
            .sym_by_addr
            .get(&addr)
            .into_iter()
            .flatten()
            .filter_map(|l| m.syms.get(*l))
            .collect();
        if let Some(reg) = lives.iter().find_map(|l| l.reg).and_then(|p| merged.get(p)) {
            out.push(
                Violation::new(
                    rule::LOAD_SYMBOLS,
                    format!("{who} f{fi}: registered in a set opened after its load: {reg}"),
                )
                .quoting([reg]),
            );
        }
        let Some(u) = lives.iter().find(|l| l.reg.is_none()).and_then(|l| l.unreg) else {
            out.push(Violation::new(
                rule::UNLOAD_SYMBOLS,
                format!(
                    "{who} f{fi}: no KSYMBOL unregister at jited_ksyms[{fi}] = {addr:#x} (len {flen})"
                ),
            ));
            continue;
        };
        let Some(r) = merged.get(u) else { continue };
        let diffs = unregister_diffs(facts, fi, addr, flen, r);
        if !diffs.is_empty() {
            out.push(
                Violation::new(
                    rule::UNLOAD_SYMBOLS,
                    format!("{who} f{fi}: {}: {r}", diffs.join("; ")),
                )
                .quoting([r]),
            );
        }
        if let Some(q) = unload {
            if before(merged, u, q) == Some(false) {
                out.push(
                    Violation::new(
                        rule::CAUSAL_ORDER,
                        format!(
                            "{who} f{fi}: PROG_UNLOAD before the unregister: {} / {r}",
                            fmt_idx(merged, Some(q))
                        ),
                    )
                    .quoting(merged.get(q).into_iter().chain([r])),
                );
            }
        }
    }
}

/// The PROG_UNLOAD of a program loaded before the set opened, held to its
/// facts (unload-matches-load); no PROG_LOAD of it may be in the set.
/// Returns its index in the model's records.
fn unload_event(
    facts: &ProgFacts,
    m: &Model<'_>,
    who: &str,
    out: &mut Vec<Violation>,
) -> Option<usize> {
    let merged = m.recs;
    let lives: Vec<&ProgLife> = m
        .prog_by_id
        .get(&facts.id)
        .into_iter()
        .flatten()
        .filter_map(|l| m.progs.get(*l))
        .collect();
    for life in lives.iter().filter(|l| l.load.is_some()) {
        let r = life.load.and_then(|p| merged.get(p));
        out.push(
            Violation::new(
                rule::UNLOAD_MATCHES_LOAD,
                format!(
                    "{who}: a PROG_LOAD in a set opened after its load: {}",
                    fmt_idx(merged, life.load)
                ),
            )
            .quoting(r),
        );
    }
    let Some(q) = lives
        .iter()
        .find(|l| l.load.is_none())
        .and_then(|l| l.unload)
    else {
        out.push(Violation::new(
            rule::UNLOAD_MATCHES_LOAD,
            format!("{who}: no PROG_UNLOAD with bpf_prog_info.id {}", facts.id),
        ));
        return None;
    };
    if let Some(r) = merged.get(q) {
        if r.bpf_event(BPF_EVENT_PROG_UNLOAD).map(|(_, t)| t) != Some(facts.tag) {
            out.push(
                Violation::new(
                    rule::UNLOAD_MATCHES_LOAD,
                    format!(
                        "{who}: PROG_UNLOAD tag differs from bpf_prog_info.tag {}: {r}",
                        hex::encode(facts.tag)
                    ),
                )
                .quoting([r]),
            );
        }
    }
    Some(q)
}

/// What function `fi`'s KSYMBOL unregister `r` has wrong against the
/// facts: length, type, kallsyms name.
fn unregister_diffs(facts: &ProgFacts, fi: usize, addr: u64, flen: u32, r: &Record) -> Vec<String> {
    let RecordBody::Ksymbol {
        len,
        ksym_type,
        name,
        ..
    } = &r.body
    else {
        return Vec::new();
    };
    let mut diffs = len_and_type_diffs(*len, *ksym_type, flen, &format!("jited_func_lens[{fi}]"));
    if !facts
        .kallsyms
        .iter()
        .any(|e| e.addr == addr && e.name == *name)
    {
        diffs.push("name is not its kallsyms name at that address".to_string());
    }
    diffs
}

pub(super) fn prefix_label(out: &mut [Violation], label: &str) {
    if !label.is_empty() {
        for v in out {
            v.message = format!("{label}: {}", v.message);
        }
    }
}

/// In a run with batches, every PROG_LOAD / PROG_UNLOAD must belong to a
/// program some step reported (a batch, the facts, the inventory) or to a
/// program that predates the run: otherwise the counts prove nothing.
pub(super) fn foreign_programs(ev: &RunEvidence, merged: &[Record], out: &mut Vec<Violation>) {
    if ev.batches.is_empty() {
        return;
    }
    let known: BTreeSet<u32> = ev
        .batches
        .iter()
        .flat_map(|b| b.ids.iter().copied())
        .chain(ev.progs.iter().map(|p| p.id))
        .chain(ev.inventory.iter().map(|p| p.id))
        .collect();
    let initial = known_at_start(ev);
    let msgs: Vec<Found<'_>> = merged
        .iter()
        .filter_map(|r| match r.body {
            RecordBody::BpfEvent {
                event_type,
                id,
                tag,
                ..
            } if !known.contains(&id) => {
                let old = event_type == BPF_EVENT_PROG_UNLOAD
                    && initial
                        .iter()
                        .any(|e| e.name.starts_with(&tag_prefix(&tag)));
                (!old).then(|| quoting(format!("{r}: a program no step of the run reported"), [r]))
            }
            _ => None,
        })
        .collect();
    push_capped(
        out,
        rule::PROGRAMS_ACCOUNTED,
        "records of unreported programs",
        msgs,
    );
}

/// A program the kernel did not JIT-compile: every `jited_func_lens` entry
/// is 0 (`bpf_prog_info` reports `prog->bpf_func`, the shared interpreter
/// `__bpf_prog_run<N>`, with `jited_len` 0; JITed code is never empty).
pub fn is_interpreted(facts: &ProgFacts) -> bool {
    !facts.jited_func_lens.is_empty() && facts.jited_func_lens.iter().all(|&l| l == 0)
}

/// Interpreted programs have no code of their own, so no symbol to announce
/// (`bpf_prog_kallsyms_add` in kernel/bpf/core.c skips them: they are not in
/// kallsyms either); their BPF_EVENTs are checked like any other. Every
/// KSYMBOL at an interpreted program's address is a violation: a register
/// of `load-symbols`, an unregister of `unload-symbols`.
pub(super) fn interpreted_symbols(
    progs: &[ProgFacts],
    kallsyms: &[KallsymsEntry],
    merged: &[Record],
    arch: kloop_protocol::Arch,
) -> Vec<Violation> {
    let interpreted: Vec<&ProgFacts> = progs.iter().filter(|f| is_interpreted(f)).collect();
    let mut out = Vec::new();
    for r in merged {
        let RecordBody::Ksymbol {
            addr,
            len,
            flags,
            name,
            ..
        } = &r.body
        else {
            continue;
        };
        let whose: Vec<String> = interpreted
            .iter()
            .filter(|f| f.jited_ksyms.contains(addr))
            .map(|f| format!("{:?} (id {})", f.label, f.id))
            .collect();
        if whose.is_empty() {
            continue;
        }
        let (rule, what) = if flags & KSYMBOL_FLAGS_UNREGISTER != 0 {
            (rule::UNLOAD_SYMBOLS, "unregister")
        } else {
            (rule::LOAD_SYMBOLS, "register")
        };
        // The kernel's own text at that address, as a /proc/kallsyms read
        // names it (a vmlinux symbol: no module column), when one did.
        let kernel_symbol = kallsyms
            .iter()
            .chain(interpreted.iter().flat_map(|f| &f.kallsyms))
            .find(|e| e.addr == *addr && e.module.is_none())
            .map(|e| e.name.clone());
        // x86-64 maps the kernel image at a fixed range; arm64 maps it
        // anywhere in its vmalloc space (KASLR), so there the kernel's text
        // is where /proc/kallsyms lists a vmlinux text symbol.
        let kernel_text = match arch {
            kloop_protocol::Arch::X86_64 => detail::KERNEL_IMAGE.contains(addr),
            kloop_protocol::Arch::Arm64 => kallsyms
                .iter()
                .chain(interpreted.iter().flat_map(|f| &f.kallsyms))
                .any(|e| e.addr == *addr && e.module.is_none() && matches!(e.kind, 't' | 'T')),
        };
        out.push(
            Violation::new(
                rule,
                format!(
                    "KSYMBOL {what} at {addr:#x}{}{}, where interpreted program(s) {} run (jited_func_lens all 0: not JIT-compiled, no symbol of their own): {r}",
                    if kernel_text { " (kernel text)" } else { "" },
                    kernel_symbol.as_deref().map(|s| format!(" ({s} in /proc/kallsyms)")).unwrap_or_default(),
                    whose.join(", ")
                ),
            )
            .quoting([r])
            .with(Detail::InterpretedSymbol(detail::InterpretedSymbol {
                event: what.to_string(),
                addr: *addr,
                len: *len,
                name: name.clone(),
                kernel_text,
                kernel_symbol,
            })),
        );
    }
    out
}

pub(super) fn check_facts(progs: &[ProgFacts], out: &mut Vec<Violation>) {
    let mut ids: BTreeMap<u32, &str> = BTreeMap::new();
    for f in progs {
        let who = format!("program {:?} (id {}, {})", f.label, f.id, f.name);
        if let Some(other) = ids.insert(f.id, &f.label) {
            out.push(m_find(
                rule::FACTS,
                format!("{who}: id also reported for {other:?}"),
            ));
        }
        if f.jited_ksyms.len() != f.jited_func_lens.len() {
            out.push(m_find(
                rule::FACTS,
                format!(
                    "{who}: {} jited_ksyms but {} jited_func_lens",
                    f.jited_ksyms.len(),
                    f.jited_func_lens.len()
                ),
            ));
        }
        if f.jited_ksyms.is_empty() {
            out.push(m_find(
                rule::FACTS,
                format!("{who}: no jited_ksyms (not JITed?)"),
            ));
        }
        if f.jited_ksyms.contains(&0) {
            out.push(m_find(
                rule::FACTS,
                format!("{who}: jited_ksyms contains 0 (addresses hidden from the agent: bpf_dump_raw_ok() / kptr_restrict)"),
            ));
        }
        let distinct: BTreeSet<u64> = f.jited_ksyms.iter().copied().collect();
        if distinct.len() != f.jited_ksyms.len() {
            out.push(m_find(
                rule::FACTS,
                format!(
                    "{who}: duplicate addresses in jited_ksyms {:x?}",
                    f.jited_ksyms
                ),
            ));
        }
    }
}

/// What is wrong with the part of function `fi`'s symbol name after
/// `bpf_prog_<16 hex digits>`, if anything. bpf_prog_ksym_set_name()
/// (kernel/bpf/core.c) appends `_` and the function's BTF name when the
/// program has func_info (BTF FUNC names are identifiers), else `_` and
/// `aux->name` when that is set (bpf_obj_name_cpy() admits only
/// alphanumerics, `_` and `.`), else nothing; jit_subprogs()
/// (kernel/bpf/verifier.c) names every subprogram, `F` without BTF. So the
/// rest is empty or `_` and such characters, a subprogram's never empty,
/// and the main function's not empty when the program has a name.
pub(super) fn name_suffix_diff(name: &str, fi: usize, prog_name: &str) -> Option<String> {
    let rest = name.get(25..).filter(|_| has_some_tag_prefix(name))?;
    if rest.is_empty() {
        return if fi > 0 {
            Some("a subprogram's name ends at its tag (jit_subprogs names every subprogram)".into())
        } else if !prog_name.is_empty() {
            Some(format!(
                "name ends at the tag though the program is named {prog_name:?}"
            ))
        } else {
            None
        };
    }
    let word = rest.strip_prefix('_').unwrap_or("");
    if word.is_empty()
        || !word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return Some(format!(
            "{rest:?} after the tag is not `_` and a BTF function name or program name"
        ));
    }
    None
}

/// The longest symbol name: KSYM_NAME_LEN (512 since 6.1) less its NUL.
/// Before 6.1 it was 127, but the kernel refuses longer BTF names there.
const MAX_SYMBOL: usize = 511;

/// What is wrong with function `fi`'s symbol name given the BTF FUNC
/// names of the program's functions (read from its func_info and BTF), if
/// anything. With func_info, bpf_prog_ksym_set_name() writes `_` and the
/// function's own BTF name after the tag ("prog->aux->name will be ignored
/// if full btf name is available"), cut only at KSYM_NAME_LEN.
pub(super) fn btf_name_diff(
    name: &str,
    fi: usize,
    names: &[String],
    functions: usize,
) -> Option<String> {
    if names.len() != functions || !has_some_tag_prefix(name) {
        return None;
    }
    let fname = names.get(fi)?;
    let want = format!("_{fname}");
    let rest = name.get(25..).unwrap_or("");
    let ok = if 25 + want.len() <= MAX_SYMBOL {
        rest == want
    } else {
        name.len() == MAX_SYMBOL && want.starts_with(rest)
    };
    (!ok).then(|| {
        format!(
            "{rest:?} after the tag is not `_` and the function's BTF name {fname:?} \
             (bpf_prog_ksym_set_name() uses the BTF name when the program has func_info)"
        )
    })
}

#[cfg(test)]
mod name_tests {
    use super::{btf_name_diff, name_suffix_diff};

    #[test]
    fn names_follow_the_btf_names_when_there_are_some() {
        let n = |s: &str| format!("bpf_prog_0123456789abcdef{s}");
        let names = vec!["main_fn".to_string(), "helper".to_string()];
        assert_eq!(btf_name_diff(&n("_main_fn"), 0, &names, 2), None);
        assert_eq!(btf_name_diff(&n("_helper"), 1, &names, 2), None);
        // The aux->name branch: a subprogram called F, a main cut at 15.
        assert!(btf_name_diff(&n("_F"), 1, &names, 2).is_some());
        assert!(btf_name_diff(&n("_main"), 0, &names, 2).is_some());
        // No func_info (or not one per function): nothing to hold it to.
        assert_eq!(btf_name_diff(&n("_F"), 1, &[], 2), None);
        // A name cut at KSYM_NAME_LEN is whole up to 511 bytes.
        let long = vec!["x".repeat(600)];
        let cut = n(&format!("_{}", "x".repeat(511 - 26)));
        assert_eq!(cut.len(), 511);
        assert_eq!(btf_name_diff(&cut, 0, &long, 1), None);
        assert!(btf_name_diff(&n(&format!("_{}", "x".repeat(200))), 0, &long, 1).is_some());
    }

    const TAG: &str = "bpf_prog_0123456789abcdef";

    #[test]
    fn names_after_the_tag_follow_bpf_prog_ksym_set_name() {
        let n = |s: &str| format!("{TAG}{s}");
        // The kernel's own shapes: a BTF name, aux->name with a dot, a
        // subprogram without BTF ("F"), a nameless main function.
        assert_eq!(
            name_suffix_diff(&n("_kloop_subprogs"), 0, "kloop_subprogs"),
            None
        );
        assert_eq!(name_suffix_diff(&n("_sub.isra.0"), 1, "p"), None);
        assert_eq!(name_suffix_diff(&n("_F"), 2, ""), None);
        assert_eq!(name_suffix_diff(&n(""), 0, ""), None);
        // What the mutants of bpf_prog_ksym_set_name wrote.
        assert!(name_suffix_diff(&n(""), 0, "kloop_subprogs")
            .unwrap()
            .contains("named \"kloop_subprogs\""));
        assert!(name_suffix_diff(&n("_(null)"), 1, "kloop_subprogs")
            .unwrap()
            .contains("\"_(null)\""));
        assert!(name_suffix_diff(&n(""), 1, "")
            .unwrap()
            .contains("subprogram"));
        assert!(name_suffix_diff(&n("_"), 0, "x").is_some());
        assert!(name_suffix_diff(&n("junk"), 0, "x").is_some());
        // Not a tag name at all: the prefix check says so, not this one.
        assert_eq!(name_suffix_diff("", 0, "x"), None);
    }
}
