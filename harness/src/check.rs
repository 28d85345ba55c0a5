//! Invariants over one run (ABI.md, "Invariants kloop checks in every run",
//! 1–5), each a named rule whose message quotes the offending records.
//!
//! # Rules
//!
//! | rule | what it checks |
//! |------|----------------|
//! | `listeners` | listener bookkeeping: unique indexes, no stream without a listener, every CPU-wide set covers every online CPU, some set exists when programs were loaded |
//! | `parse` | every stream parses exactly ([`crate::records::parse_stream`]); records before the first error are still checked |
//! | `record-type` | only types the kernel may send such a listener: KSYMBOL (if `ksymbol`), BPF_EVENT (if `bpf_event`), LOST; defined ksym/bpf-event types; no undefined flag bits; `misc` 0 |
//! | `sample-id` | trailer contents: `cpu` is the listener's CPU, `res` is 0, `id` == `identifier`, one id per listener |
//! | `facts` | the `bpf_prog_info` facts are usable: as many lens as ksyms, non-zero distinct addresses, unique ids |
//! | `load-symbols` | per loaded program: a KSYMBOL register for each JITed function with addr/len of `jited_ksyms`/`jited_func_lens`, type BPF, a `bpf_prog_<tag>` name equal to kallsyms; no symbol registered twice while live; none at all for an interpreted program (`jited_func_lens` all 0) |
//! | `load-matches-info` | exactly one PROG_LOAD per program, id == `bpf_prog_info.id`, tag == `bpf_prog_info.tag` |
//! | `unload-symbols` | each function of a loaded program unregistered; every unregister has the addr/len/name/type of its register; no double unregister; none for an interpreted program |
//! | `unload-matches-load` | every PROG_LOAD has one later PROG_UNLOAD with the same id and tag; no PROG_UNLOAD of a program never loaded (unless it predates the run); no double load |
//! | `unregister-without-register` | no unregister of a symbol neither registered in the run nor in `initial_kallsyms` |
//! | `lost` | LOST records total zero (the total is in [`Analysis::lost`]); in a run that provokes loss (a `storm` with `drain_every = 0`) instead, per listener set: records received + records lost = records the run caused (per program 2 per function + 2), exactly ([`Analysis::loss`]) |
//! | `time-order` | sample times non-decreasing within each listener's stream |
//! | `causal-order` | per program: registers before PROG_LOAD, unregisters after PROG_LOAD and before PROG_UNLOAD |
//! | `listeners-agree` | every listener set, and every task-bound listener, carries exactly the KSYMBOL / BPF_EVENT records the others saw, restricted to what it asked for (a task-bound listener: to the records its task caused) |
//! | `programs-accounted` | per program of a `storm` / `concurrent` batch (ids only, no facts): one PROG_LOAD with one KSYMBOL register per function right before it from the same task (in its ring for a pinned loader; in the set's time-merged stream for an unpinned one, which may migrate between records; other tasks' records, such as an unload by the task that dropped a program's last reference, may come in between), each unregistered after it, then one PROG_UNLOAD with its tag; no PROG_LOAD of a program no step reported |
//! | `load-cpu` | a `concurrent` loader's records (registers and PROG_LOAD) are in the ring of the CPU it was pinned to, with that `cpu` in their trailer |
//! | `inventory` | programs loaded before recording (`preexisting`) are in the inventory; each inventoried program unloaded in the stream unregisters exactly its inventoried functions (addr, len, kallsyms name) before a PROG_UNLOAD with its tag |
//! | `lookups` | a side-band reader looked up at least every PROG_LOAD of its storm, and got nothing but success or ENOENT |
//!
//! # Listener sets and merging
//!
//! CPU-bound listeners are grouped into *sets*: listeners opened with the
//! same attributes (sample_type, sample_id_all, ksymbol, bpf_event, ring
//! size), at most one per CPU; each set is one CPU-wide recorder. Every set
//! is checked on its own (rules `load-*`, `unload-*`,
//! `unregister-without-register`, `causal-order`); [`Analysis::merged`] is
//! the set holding the lowest listener index (the first spec opened).
//! Task-bound listeners (cpu -1) only see their own task's records, so they
//! get the per-record rules (`parse`, `record-type`, `sample-id`, `lost`,
//! `time-order`) but no program rules.
//!
//! Symbols and programs that predate the recording are explained by the
//! initial kallsyms snapshot and by the `inventory` (what `perf record`
//! synthesises at start); programs the agent loaded before the first
//! listener opened get no load rules, only the `inventory` rule.
//!
//! A set whose stream does not parse to the end is reported by `parse`; the
//! set rules are not run on what is left of it (a cut stream would only
//! repeat that finding as missing records), and `listeners-agree` leaves it
//! out. A set that lost records in a run that provokes loss gets the exact
//! accounting of `lost` instead of the pairing rules, which cannot hold for
//! records that never arrived.
//!
//! Order between two records is taken from the stream when both come from
//! one listener, from sample times otherwise (equal times are not a
//! violation); without `PERF_SAMPLE_TIME`, cross-CPU order is unknown and not
//! checked.
//!
//! # Record types a ksymbol/bpf_event listener may receive
//!
//! From `kernel/events/core.c`: KSYMBOL goes to events with `attr.ksymbol`
//! (`perf_event_ksymbol_match`), BPF_EVENT to events with `attr.bpf_event`
//! (`perf_event_bpf_match`), and `perf_output_begin` writes LOST into any
//! ring that dropped records. Every other side-band type needs its own attr
//! bit (mmap, comm, task, namespaces, cgroup, context_switch, text_poke);
//! SAMPLE/THROTTLE/UNTHROTTLE need a counting event that overflows, which
//! `PERF_COUNT_SW_DUMMY` never does; AUX/ITRACE_START/LOST_SAMPLES/
//! AUX_OUTPUT_HW_ID need an AUX area; READ needs `inherit_stat`. So any
//! other type is a `record-type` violation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kloop_protocol::{KallsymsEntry, ListenerInfo, ProgFacts};

use crate::evidence::RunEvidence;
use crate::records::{
    self, merge_by_time, parse_prefix, Record, RecordBody, RecordContent, BPF_EVENT_PROG_LOAD,
    BPF_EVENT_PROG_UNLOAD, KSYMBOL_FLAGS_UNREGISTER, KSYM_TYPE_BPF, KSYM_TYPE_OOL,
};

/// Rule names.
pub mod rule {
    pub const LISTENERS: &str = "listeners";
    pub const PARSE: &str = "parse";
    pub const RECORD_TYPE: &str = "record-type";
    pub const SAMPLE_ID: &str = "sample-id";
    pub const FACTS: &str = "facts";
    pub const LOAD_SYMBOLS: &str = "load-symbols";
    pub const LOAD_MATCHES_INFO: &str = "load-matches-info";
    pub const UNLOAD_SYMBOLS: &str = "unload-symbols";
    pub const UNLOAD_MATCHES_LOAD: &str = "unload-matches-load";
    pub const UNREGISTER_WITHOUT_REGISTER: &str = "unregister-without-register";
    pub const LOST: &str = "lost";
    pub const TIME_ORDER: &str = "time-order";
    pub const CAUSAL_ORDER: &str = "causal-order";
    pub const LISTENERS_AGREE: &str = "listeners-agree";
    pub const PROGRAMS_ACCOUNTED: &str = "programs-accounted";
    pub const LOAD_CPU: &str = "load-cpu";
    pub const INVENTORY: &str = "inventory";
    pub const LOOKUPS: &str = "lookups";

    pub const ALL: &[&str] = &[
        LISTENERS,
        PARSE,
        RECORD_TYPE,
        SAMPLE_ID,
        FACTS,
        LOAD_SYMBOLS,
        LOAD_MATCHES_INFO,
        UNLOAD_SYMBOLS,
        UNLOAD_MATCHES_LOAD,
        UNREGISTER_WITHOUT_REGISTER,
        LOST,
        TIME_ORDER,
        CAUSAL_ORDER,
        LISTENERS_AGREE,
        PROGRAMS_ACCOUNTED,
        LOAD_CPU,
        INVENTORY,
        LOOKUPS,
    ];
}

/// At most this many violations of one kind per listener are spelled out.
const MAX_PER_KIND: usize = 5;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.rule, self.message)
    }
}

/// The result of checking one run.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    /// Parsed records of every listener (up to its first parse error).
    pub records_per_listener: BTreeMap<u32, Vec<Record>>,
    /// CPU-wide listener sets (listener indexes), lowest index first.
    pub sets: Vec<Vec<u32>>,
    /// `sets[0]` merged by time (empty if there is no CPU-wide set).
    pub merged: Vec<Record>,
    /// Sum of `lost` over every LOST record of every listener.
    pub lost: u64,
    /// Indexes into `merged` of the records accounted to `storm` /
    /// `concurrent` batch programs (the normaliser summarises those).
    pub accounted: BTreeSet<usize>,
    /// The provoked-loss accounting of every listener set (empty unless the
    /// run provoked loss).
    pub loss: Vec<LossAccount>,
    /// One-line facts for the trial report (lookup rates, loss accounting).
    pub notes: Vec<String>,
    pub violations: Vec<Violation>,
}

/// Records of one listener set in a run that provokes loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossAccount {
    /// Index into [`Analysis::sets`].
    pub set: usize,
    /// Records the run's programs caused that this set asked for.
    pub caused: u64,
    /// KSYMBOL and BPF_EVENT records received.
    pub received: u64,
    /// Sum of the LOST records' counts.
    pub lost: u64,
}

impl Analysis {
    /// Violations of one rule.
    pub fn of_rule<'a>(&'a self, rule: &'a str) -> impl Iterator<Item = &'a Violation> + 'a {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}

fn push_capped(out: &mut Vec<Violation>, rule: &'static str, what: &str, msgs: Vec<String>) {
    let n = msgs.len();
    for m in msgs.into_iter().take(MAX_PER_KIND) {
        out.push(Violation { rule, message: m });
    }
    if n > MAX_PER_KIND {
        out.push(Violation {
            rule,
            message: format!("... and {} more {what}", n - MAX_PER_KIND),
        });
    }
}

/// `bpf_prog_<hex tag>`.
pub fn tag_prefix(tag: &[u8; 8]) -> String {
    format!("bpf_prog_{}", hex::encode(tag))
}

/// Whether `name` starts with `bpf_prog_` and 16 lowercase hex digits.
pub fn has_some_tag_prefix(name: &str) -> bool {
    name.strip_prefix("bpf_prog_")
        .and_then(|rest| rest.get(..16))
        .is_some_and(|h| {
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Whether a symbol name fits one of a program's functions. Functions are
/// named `bpf_prog_<tag>…`: a subprogram after its own tag
/// (`bpf_prog_info.prog_tags[i]`, `func[i]->tag`), the main function after
/// either `prog_tags[0]` (5.10) or the whole program's `bpf_prog_info.tag`
/// (6.1 on) — both seen on real kernels. Without `prog_tags` (older agents) a
/// multi-function program is held only to the `bpf_prog_<16 hex digits>` shape.
pub(crate) fn facts_name_ok(facts: &ProgFacts, name: &str) -> bool {
    if facts.func_tags.is_empty() && facts.jited_ksyms.len() > 1 {
        return has_some_tag_prefix(name);
    }
    std::iter::once(&facts.tag)
        .chain(&facts.func_tags)
        .any(|t| name.starts_with(&tag_prefix(t)))
}

/// The name prefixes function `fi` may carry, when the facts say.
fn func_prefixes(facts: &ProgFacts, fi: usize) -> Vec<String> {
    match (fi, facts.func_tags.get(fi)) {
        (0, Some(t)) => vec![tag_prefix(&facts.tag), tag_prefix(t)],
        (_, Some(t)) => vec![tag_prefix(t)],
        (0, None) if facts.jited_ksyms.len() == 1 => vec![tag_prefix(&facts.tag)],
        _ => vec![],
    }
}

/// Order of two records of one merged stream: from the stream when they
/// share a listener, from sample times otherwise (ties count as in order);
/// `None` when it cannot be known.
pub(crate) fn before(recs: &[Record], i: usize, j: usize) -> Option<bool> {
    let a = recs.get(i)?;
    let b = recs.get(j)?;
    if a.listener == b.listener {
        return Some(a.offset < b.offset);
    }
    match (a.time(), b.time()) {
        (Some(x), Some(y)) => Some(x <= y),
        _ => None,
    }
}

/// Lifetime of one symbol at one address: register … unregister.
#[derive(Debug, Clone)]
pub struct SymLife {
    pub addr: u64,
    /// Index of the register record; `None` for symbols that predate the run.
    pub reg: Option<usize>,
    pub unreg: Option<usize>,
}

/// Lifetime of one program id: PROG_LOAD … PROG_UNLOAD.
#[derive(Debug, Clone)]
pub struct ProgLife {
    pub id: u32,
    /// `None` for programs that predate the run.
    pub load: Option<usize>,
    pub unload: Option<usize>,
}

/// Pairing of register/unregister and load/unload over one merged stream.
pub(crate) struct Model<'a> {
    pub recs: &'a [Record],
    pub syms: Vec<SymLife>,
    pub sym_by_addr: BTreeMap<u64, Vec<usize>>,
    pub progs: Vec<ProgLife>,
    pub prog_by_id: BTreeMap<u32, Vec<usize>>,
    /// Pairing violations found while walking the stream.
    pub findings: Vec<Violation>,
}

impl<'a> Model<'a> {
    pub fn build(recs: &'a [Record], initial: &[KallsymsEntry]) -> Model<'a> {
        let mut m = Model {
            recs,
            syms: Vec::new(),
            sym_by_addr: BTreeMap::new(),
            progs: Vec::new(),
            prog_by_id: BTreeMap::new(),
            findings: Vec::new(),
        };
        let mut live_sym: BTreeMap<u64, usize> = BTreeMap::new();
        let mut live_prog: BTreeMap<u32, usize> = BTreeMap::new();
        let mut findings = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            match &r.body {
                RecordBody::Ksymbol {
                    addr,
                    len,
                    ksym_type,
                    flags,
                    name,
                } => {
                    if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
                        if let Some(prev) = live_sym
                            .get(addr)
                            .and_then(|l| m.syms.get(*l))
                            .and_then(|l| l.reg)
                            .and_then(|p| recs.get(p))
                        {
                            findings.push(m_find(
                                rule::LOAD_SYMBOLS,
                                format!("symbol registered again while still registered: {prev} then {r}"),
                            ));
                        }
                        let l = m.syms.len();
                        m.syms.push(SymLife {
                            addr: *addr,
                            reg: Some(i),
                            unreg: None,
                        });
                        m.sym_by_addr.entry(*addr).or_default().push(l);
                        live_sym.insert(*addr, l);
                    } else if let Some(l) = live_sym.remove(addr) {
                        let reg = m.syms.get(l).and_then(|s| s.reg).and_then(|p| recs.get(p));
                        if let Some(s) = m.syms.get_mut(l) {
                            s.unreg = Some(i);
                        }
                        if let Some(
                            reg @ Record {
                                body:
                                    RecordBody::Ksymbol {
                                        len: rlen,
                                        ksym_type: rtype,
                                        name: rname,
                                        ..
                                    },
                                ..
                            },
                        ) = reg
                        {
                            let mut diffs = Vec::new();
                            if rlen != len {
                                diffs.push(format!("len {len} vs {rlen}"));
                            }
                            if rname != name {
                                diffs.push(format!("name {name:?} vs {rname:?}"));
                            }
                            if rtype != ksym_type {
                                diffs.push(format!(
                                    "type {} vs {}",
                                    records::ksym_type_name(*ksym_type),
                                    records::ksym_type_name(*rtype)
                                ));
                            }
                            if !diffs.is_empty() {
                                findings.push(m_find(
                                    rule::UNLOAD_SYMBOLS,
                                    format!(
                                        "unregister differs from its register ({}): {reg} / {r}",
                                        diffs.join(", ")
                                    ),
                                ));
                            }
                        }
                    } else if let Some(last) = m
                        .sym_by_addr
                        .get(addr)
                        .and_then(|v| v.last())
                        .and_then(|l| m.syms.get(*l))
                    {
                        let prev = last
                            .unreg
                            .and_then(|u| recs.get(u))
                            .map(|p| p.to_string())
                            .unwrap_or_else(|| "?".into());
                        findings.push(m_find(
                            rule::UNLOAD_SYMBOLS,
                            format!("symbol unregistered again without a register in between: {prev} then {r}"),
                        ));
                    } else if initial.iter().any(|e| e.addr == *addr && e.name == *name) {
                        let l = m.syms.len();
                        m.syms.push(SymLife {
                            addr: *addr,
                            reg: None,
                            unreg: Some(i),
                        });
                        m.sym_by_addr.entry(*addr).or_default().push(l);
                    } else {
                        let hint = initial
                            .iter()
                            .filter(|e| e.addr == *addr)
                            .map(|e| e.name.as_str())
                            .collect::<Vec<_>>();
                        let hint = if hint.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " (the initial kallsyms has {} at that address)",
                                hint.join(", ")
                            )
                        };
                        findings.push(m_find(
                            rule::UNREGISTER_WITHOUT_REGISTER,
                            format!("{r} unregisters a symbol neither registered in this run nor in the initial kallsyms{hint}"),
                        ));
                    }
                }
                RecordBody::BpfEvent {
                    event_type,
                    id,
                    tag,
                    ..
                } => match *event_type {
                    BPF_EVENT_PROG_LOAD => {
                        if let Some(prev) = live_prog
                            .get(id)
                            .and_then(|l| m.progs.get(*l))
                            .and_then(|p| p.load)
                            .and_then(|p| recs.get(p))
                        {
                            findings.push(m_find(
                                rule::UNLOAD_MATCHES_LOAD,
                                format!(
                                    "program id loaded again while still loaded: {prev} then {r}"
                                ),
                            ));
                        }
                        let l = m.progs.len();
                        m.progs.push(ProgLife {
                            id: *id,
                            load: Some(i),
                            unload: None,
                        });
                        m.prog_by_id.entry(*id).or_default().push(l);
                        live_prog.insert(*id, l);
                    }
                    BPF_EVENT_PROG_UNLOAD => {
                        if let Some(l) = live_prog.remove(id) {
                            if let Some(p) = m.progs.get_mut(l) {
                                p.unload = Some(i);
                            }
                            let load = m
                                .progs
                                .get(l)
                                .and_then(|p| p.load)
                                .and_then(|p| recs.get(p));
                            if let Some(load) = load {
                                if load.bpf_event(BPF_EVENT_PROG_LOAD).map(|(_, t)| t) != Some(*tag)
                                {
                                    findings.push(m_find(
                                        rule::UNLOAD_MATCHES_LOAD,
                                        format!("PROG_UNLOAD tag differs from its PROG_LOAD: {load} / {r}"),
                                    ));
                                }
                            }
                        } else if m.prog_by_id.contains_key(id) {
                            findings.push(m_find(
                                rule::UNLOAD_MATCHES_LOAD,
                                format!("program unloaded again without a load in between: {r}"),
                            ));
                        } else if predates_run(&m, recs, i, tag, initial) {
                            let l = m.progs.len();
                            m.progs.push(ProgLife {
                                id: *id,
                                load: None,
                                unload: Some(i),
                            });
                            m.prog_by_id.entry(*id).or_default().push(l);
                        } else {
                            findings.push(m_find(
                                rule::UNLOAD_MATCHES_LOAD,
                                format!(
                                    "{r}: PROG_UNLOAD of a program never loaded in this run and not in the initial kallsyms"
                                ),
                            ));
                        }
                    }
                    _ => {} // `record-type` reports undefined event types.
                },
                _ => {}
            }
        }
        for p in &m.progs {
            if let (Some(load), None) = (p.load, p.unload) {
                if let Some(load) = recs.get(load) {
                    findings.push(m_find(
                        rule::UNLOAD_MATCHES_LOAD,
                        format!("program loaded but never unloaded in the stream: {load}"),
                    ));
                }
            }
        }
        m.findings = findings;
        m
    }

    /// The lifetime of the symbol at `addr` that belongs to a program whose
    /// PROG_LOAD is record `load` and PROG_UNLOAD is `unload`: the one live
    /// at the load, else one registered after the load but before the unload
    /// (a causal-order violation). Without a load record: the first whose
    /// name satisfies `name_ok`, else the first.
    pub fn select_sym(
        &self,
        addr: u64,
        load: Option<usize>,
        unload: Option<usize>,
        name_ok: impl Fn(&str) -> bool,
    ) -> Option<usize> {
        let cands: Vec<usize> = self
            .sym_by_addr
            .get(&addr)
            .map(|v| {
                v.iter()
                    .copied()
                    .filter(|l| self.syms.get(*l).is_some_and(|s| s.reg.is_some()))
                    .collect()
            })
            .unwrap_or_default();
        let reg_of = |l: usize| self.syms.get(l).and_then(|s| s.reg).unwrap_or(usize::MAX);
        match load {
            Some(p) => {
                if let Some(&l) = cands.iter().rev().find(|l| reg_of(**l) < p) {
                    let unreg = self.syms.get(l).and_then(|s| s.unreg);
                    if unreg.is_none_or(|u| u > p) {
                        return Some(l);
                    }
                }
                cands
                    .iter()
                    .copied()
                    .find(|l| reg_of(*l) > p && unload.is_none_or(|q| reg_of(*l) < q))
            }
            None => cands
                .iter()
                .copied()
                .find(|l| {
                    self.recs.get(reg_of(*l)).is_some_and(
                        |r| matches!(&r.body, RecordBody::Ksymbol { name, .. } if name_ok(name)),
                    )
                })
                .or_else(|| cands.first().copied()),
        }
    }

    /// The PROG_LOAD lifetimes of a program id.
    pub fn loads_of(&self, id: u32) -> Vec<usize> {
        self.prog_by_id
            .get(&id)
            .map(|v| {
                v.iter()
                    .copied()
                    .filter(|l| self.progs.get(*l).is_some_and(|p| p.load.is_some()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn m_find(rule: &'static str, message: String) -> Violation {
    Violation { rule, message }
}

/// A PROG_UNLOAD without a PROG_LOAD is fine for a program that existed
/// before recording started: its tag names a symbol in the initial kallsyms
/// (single-function programs), or the record before it in its listener is
/// the unregister of a symbol from the initial kallsyms (the kernel emits
/// the unregisters right before PROG_UNLOAD; subprogram names carry
/// per-function tags).
fn predates_run(
    m: &Model<'_>,
    recs: &[Record],
    i: usize,
    tag: &[u8; 8],
    initial: &[KallsymsEntry],
) -> bool {
    let prefix = tag_prefix(tag);
    if initial.iter().any(|e| e.name.starts_with(&prefix)) {
        return true;
    }
    let Some(r) = recs.get(i) else { return false };
    // The unregisters and the PROG_UNLOAD are separate perf_iterate_sb()
    // calls of the unloading task (perf_event_bpf_event): a task that
    // migrated between them left the unregister in another CPU's ring, so
    // the record before this one is looked for in its own ring and in the
    // set's stream merged by time.
    let prev_in_ring = recs
        .get(..i)
        .unwrap_or(&[])
        .iter()
        .rposition(|p| p.listener == r.listener);
    let prev_merged = i.checked_sub(1).filter(|_| r.time().is_some());
    [prev_in_ring, prev_merged]
        .into_iter()
        .flatten()
        .any(|prev| {
            m.syms
                .iter()
                .any(|s| s.reg.is_none() && s.unreg == Some(prev))
        })
}

fn fmt_idx(recs: &[Record], i: Option<usize>) -> String {
    i.and_then(|i| recs.get(i))
        .map(|r| r.to_string())
        .unwrap_or_else(|| "(none)".into())
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

/// Checks one CPU-wide set's merged stream; returns its violations and
/// the indexes of the records accounted to batch programs.
fn check_set(
    ev: &RunEvidence,
    merged: &[Record],
    has_ksym: bool,
    has_bpf: bool,
    label: &str,
    lossy: bool,
) -> (Vec<Violation>, BTreeSet<usize>) {
    let initial = known_at_start(ev);
    let m = Model::build(merged, &initial);
    let mut out: Vec<Violation> = Vec::new();
    let mut accounted = BTreeSet::new();
    if lossy {
        foreign_programs(ev, merged, &mut out);
        prefix_label(&mut out, label);
        return (out, accounted);
    }
    for f in &m.findings {
        let keep = if f.rule == rule::UNLOAD_MATCHES_LOAD {
            has_bpf
        } else {
            has_ksym
        };
        if keep {
            out.push(f.clone());
        }
    }
    let bad = |out: &mut Vec<Violation>, rule: &'static str, message: String| {
        out.push(Violation { rule, message })
    };

    for facts in &ev.progs {
        if ev.preexisting.contains(&facts.id) {
            continue; // loaded before recording: the `inventory` rule's.
        }
        let who = format!(
            "program {:?} (id {}, {})",
            facts.label, facts.id, facts.name
        );
        let mut load: Option<usize> = None;
        let mut unload: Option<usize> = None;
        if has_bpf {
            let loads = m.loads_of(facts.id);
            if loads.is_empty() {
                let any_tag = merged
                    .iter()
                    .filter(|r| {
                        r.bpf_event(BPF_EVENT_PROG_LOAD)
                            .is_some_and(|(_, t)| t == facts.tag)
                    })
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>();
                let hint = if any_tag.is_empty() {
                    String::new()
                } else {
                    format!("; PROG_LOAD with its tag: {}", any_tag.join(" / "))
                };
                bad(
                    &mut out,
                    rule::LOAD_MATCHES_INFO,
                    format!(
                        "{who}: no PROG_LOAD with bpf_prog_info.id {}{hint}",
                        facts.id
                    ),
                );
            }
            if loads.len() > 1 {
                let all = loads
                    .iter()
                    .map(|l| fmt_idx(merged, m.progs.get(*l).and_then(|p| p.load)))
                    .collect::<Vec<_>>();
                bad(
                    &mut out,
                    rule::LOAD_MATCHES_INFO,
                    format!(
                        "{who}: {} PROG_LOAD records for one program: {}",
                        loads.len(),
                        all.join(" / ")
                    ),
                );
            }
            if let Some(life) = loads.first().and_then(|l| m.progs.get(*l)) {
                load = life.load;
                unload = life.unload;
                if let Some(r) = load.and_then(|p| merged.get(p)) {
                    if let Some((_, tag)) = r.bpf_event(BPF_EVENT_PROG_LOAD) {
                        if tag != facts.tag {
                            bad(
                                &mut out,
                                rule::LOAD_MATCHES_INFO,
                                format!(
                                    "{who}: PROG_LOAD tag {} != bpf_prog_info.tag {}: {r}",
                                    hex::encode(tag),
                                    hex::encode(facts.tag)
                                ),
                            );
                        }
                    }
                }
                if let (Some(p), Some(q)) = (load, unload) {
                    if before(merged, p, q) == Some(false) {
                        bad(
                            &mut out,
                            rule::CAUSAL_ORDER,
                            format!(
                                "{who}: PROG_UNLOAD before PROG_LOAD: {} / {}",
                                fmt_idx(merged, Some(q)),
                                fmt_idx(merged, Some(p))
                            ),
                        );
                    }
                }
            }
        }
        if !has_ksym || facts.jited_ksyms.len() != facts.jited_func_lens.len() {
            continue; // `facts` reports the inconsistency.
        }
        if is_interpreted(facts) {
            continue; // `interpreted_symbols` below.
        }
        let name_ok = |name: &str| facts_name_ok(facts, name);
        for (fi, (&addr, &flen)) in facts
            .jited_ksyms
            .iter()
            .zip(&facts.jited_func_lens)
            .enumerate()
        {
            let Some(life) = m
                .select_sym(addr, load, unload, name_ok)
                .and_then(|l| m.syms.get(l))
            else {
                let elsewhere = merged
                    .iter()
                    .filter(|r| matches!(r.body, RecordBody::Ksymbol { addr: a, .. } if a == addr))
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>();
                let hint = if elsewhere.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; KSYMBOL records at that address: {}",
                        elsewhere.join(" / ")
                    )
                };
                bad(
                    &mut out,
                    rule::LOAD_SYMBOLS,
                    format!("{who} f{fi}: no KSYMBOL register at jited_ksyms[{fi}] = {addr:#x} (len {flen}){hint}"),
                );
                continue;
            };
            let Some(reg) = life.reg.and_then(|p| merged.get(p)) else {
                continue;
            };
            if let RecordBody::Ksymbol {
                len,
                ksym_type,
                name,
                ..
            } = &reg.body
            {
                let mut diffs = Vec::new();
                if *len != flen {
                    diffs.push(format!("len {len} != jited_func_lens[{fi}] {flen}"));
                }
                if *ksym_type != KSYM_TYPE_BPF {
                    diffs.push(format!(
                        "type {} is not BPF",
                        records::ksym_type_name(*ksym_type)
                    ));
                }
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
                let ks: Vec<&KallsymsEntry> =
                    facts.kallsyms.iter().filter(|e| e.addr == addr).collect();
                if !ks.is_empty() && !ks.iter().any(|e| e.name == *name) {
                    let names = ks
                        .iter()
                        .map(|e| format!("{:?}", e.name))
                        .collect::<Vec<_>>();
                    diffs.push(format!("kallsyms has {} at that address", names.join(", ")));
                }
                if !diffs.is_empty() {
                    bad(
                        &mut out,
                        rule::LOAD_SYMBOLS,
                        format!("{who} f{fi}: {}: {reg}", diffs.join("; ")),
                    );
                }
            }
            if let (Some(r), Some(p)) = (life.reg, load) {
                if before(merged, r, p) == Some(false) {
                    bad(
                        &mut out,
                        rule::CAUSAL_ORDER,
                        format!(
                            "{who} f{fi}: registered after its PROG_LOAD: {} / {}",
                            fmt_idx(merged, Some(r)),
                            fmt_idx(merged, Some(p))
                        ),
                    );
                }
            }
            match life.unreg {
                None => bad(
                    &mut out,
                    rule::UNLOAD_SYMBOLS,
                    format!("{who} f{fi}: never unregistered: {reg}"),
                ),
                Some(u) => {
                    if let Some(p) = load {
                        if before(merged, p, u) == Some(false) {
                            bad(
                                &mut out,
                                rule::CAUSAL_ORDER,
                                format!(
                                    "{who} f{fi}: unregistered before its PROG_LOAD: {} / {}",
                                    fmt_idx(merged, Some(u)),
                                    fmt_idx(merged, Some(p))
                                ),
                            );
                        }
                    }
                    if let Some(q) = unload {
                        if before(merged, u, q) == Some(false) {
                            bad(
                                &mut out,
                                rule::CAUSAL_ORDER,
                                format!(
                                    "{who} f{fi}: PROG_UNLOAD before the unregister: {} / {}",
                                    fmt_idx(merged, Some(q)),
                                    fmt_idx(merged, Some(u))
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
    if has_ksym {
        out.extend(interpreted_symbols(&ev.progs, merged));
    }
    if has_ksym && has_bpf {
        accounted = check_batches(ev, &m, &mut out);
        foreign_programs(ev, merged, &mut out);
    }
    check_inventory(ev, &m, has_ksym, has_bpf, &mut out);
    prefix_label(&mut out, label);
    (out, accounted)
}

fn prefix_label(out: &mut [Violation], label: &str) {
    if !label.is_empty() {
        for v in out {
            v.message = format!("{label}: {}", v.message);
        }
    }
}

/// In a run with batches, every PROG_LOAD / PROG_UNLOAD must belong to a
/// program some step reported (a batch, the facts, the inventory) or to a
/// program that predates the run: otherwise the counts prove nothing.
fn foreign_programs(ev: &RunEvidence, merged: &[Record], out: &mut Vec<Violation>) {
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
    let msgs: Vec<String> = merged
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
                (!old).then(|| format!("{r}: a program no step of the run reported"))
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

/// `programs-accounted` and `load-cpu` for every batch program; returns the
/// indexes of the records accounted to them.
fn check_batches(ev: &RunEvidence, m: &Model<'_>, out: &mut Vec<Violation>) -> BTreeSet<usize> {
    let recs = m.recs;
    let mut accounted = BTreeSet::new();
    if ev.batches.is_empty() {
        return accounted;
    }
    let life_by_reg: BTreeMap<usize, usize> = m
        .syms
        .iter()
        .enumerate()
        .filter_map(|(l, s)| s.reg.map(|r| (r, l)))
        .collect();
    let cpu_of: BTreeMap<u32, i32> = ev.listeners.iter().map(|l| (l.index, l.cpu)).collect();
    // Whether the set's stream is merged by sample time (every record has one).
    let set_timed = !recs.is_empty() && recs.iter().all(|r| r.time().is_some());
    let mut acc = Vec::new();
    let mut cpus = Vec::new();
    for b in &ev.batches {
        let f = b.functions as usize;
        if f == 0 && !b.ids.is_empty() {
            acc.push(format!(
                "{}: reports {} programs with 0 JITed functions",
                b.what(),
                b.ids.len()
            ));
            continue;
        }
        for &id in &b.ids {
            let who = format!("{} program id {id}", b.what());
            let loads = m.loads_of(id);
            let Some(life) = loads.first().and_then(|l| m.progs.get(*l)) else {
                acc.push(format!("{who}: no PROG_LOAD in the stream"));
                continue;
            };
            if loads.len() > 1 {
                acc.push(format!("{who}: {} PROG_LOAD records", loads.len()));
            }
            let Some(load) = life.load else { continue };
            let Some(load_rec) = recs.get(load) else {
                continue;
            };
            let tag = load_rec
                .bpf_event(BPF_EVENT_PROG_LOAD)
                .map(|(_, t)| t)
                .unwrap_or_default();
            accounted.insert(load);
            // Where this program's registers are. perf_event_bpf_event()
            // (kernel/events/core.c) emits them, one per function, right
            // before the PROG_LOAD, from the loading task; but each record
            // is a perf_iterate_sb() of its own, preemption is disabled
            // only while one record is written, and each goes to the
            // side-band listeners of the CPU the task runs on at that
            // moment. A task that is not pinned may migrate between two of
            // them, so the records of one load can be split across rings.
            // - Pinned loader (`concurrent`, b.cpu): it cannot migrate; its
            //   registers are the f records right before its PROG_LOAD in
            //   that CPU's ring (and `load-cpu` checks the ring).
            // - Unpinned loader (`storm`): one task loading one program at a
            //   time, so its registers are the f records right before its
            //   PROG_LOAD in the set's stream merged by sample time (as
            //   perf orders side-band records of several CPUs). Without
            //   PERF_SAMPLE_TIME cross-ring order is unknown and only its
            //   ring can be searched.
            // - Other tasks' records can come in between on any CPU: an
            //   unload is emitted by whichever task drops the last
            //   reference (the side-band thread of `short-lived`, whose
            //   BPF_PROG_GET_FD_BY_ID outlived the storm's close, unloads
            //   an earlier program between this one's register and its
            //   PROG_LOAD). So with PERF_SAMPLE_TID only the loading task's
            //   records (the PROG_LOAD's tid) are candidates.
            let by_time = b.cpu.is_none() && set_timed;
            let loader_tid = load_rec.sample.tid;
            let regs: Vec<usize> = (0..load)
                .rev()
                .filter(|i| {
                    recs.get(*i).is_some_and(|r| {
                        (by_time || r.listener == load_rec.listener)
                            && (loader_tid.is_none() || r.sample.tid == loader_tid)
                    })
                })
                .take(f)
                .collect();
            let mut problems = Vec::new();
            if regs.len() < f {
                let place = match (by_time, loader_tid) {
                    (true, Some(t)) => {
                        format!("from its loading task (tid {t}) in the merged stream")
                    }
                    (true, None) => "in the merged stream".to_string(),
                    (false, Some(t)) => format!("from its loading task (tid {t}) in its ring"),
                    (false, None) => "in its ring".to_string(),
                };
                problems.push(format!(
                    "only {} record(s) before its PROG_LOAD {place}, {f} register(s) expected",
                    regs.len()
                ));
            }
            let mut unregs = Vec::new();
            for &i in regs.iter().rev() {
                let Some(r) = recs.get(i) else { continue };
                let ok_reg = match &r.body {
                    RecordBody::Ksymbol {
                        ksym_type,
                        flags,
                        name,
                        ..
                    } => {
                        flags & KSYMBOL_FLAGS_UNREGISTER == 0
                            && *ksym_type == KSYM_TYPE_BPF
                            && if f == 1 {
                                name.starts_with(&tag_prefix(&tag))
                            } else {
                                has_some_tag_prefix(name)
                            }
                    }
                    _ => false,
                };
                if !ok_reg {
                    problems.push(format!(
                        "{r} is not a BPF register named after the program where one of its {f} register(s) belongs"
                    ));
                    continue;
                }
                accounted.insert(i);
                match life_by_reg
                    .get(&i)
                    .and_then(|l| m.syms.get(*l))
                    .and_then(|s| s.unreg)
                {
                    None => problems.push(format!("{r} is never unregistered")),
                    Some(u) => {
                        accounted.insert(u);
                        unregs.push((i, u));
                    }
                }
            }
            match life.unload {
                None => problems.push(format!("no PROG_UNLOAD after {load_rec}")),
                Some(q) => {
                    accounted.insert(q);
                    for (i, u) in &unregs {
                        if before(recs, load, *u) == Some(false)
                            || before(recs, *u, q) == Some(false)
                        {
                            problems.push(format!(
                                "unregister {} of {} is not between PROG_LOAD {load_rec} and PROG_UNLOAD {}",
                                fmt_idx(recs, Some(*u)),
                                fmt_idx(recs, Some(*i)),
                                fmt_idx(recs, Some(q))
                            ));
                        }
                    }
                }
            }
            if !problems.is_empty() {
                acc.push(format!("{who}: {}", problems.join("; ")));
            }
            if let Some(cpu) = b.cpu {
                for i in std::iter::once(load).chain(regs.iter().copied()) {
                    let Some(r) = recs.get(i) else { continue };
                    let lcpu = cpu_of.get(&r.listener).copied().unwrap_or(-1);
                    let scpu = r.sample.cpu;
                    if i64::from(lcpu) != i64::from(cpu) || scpu.is_some_and(|c| c != cpu) {
                        cpus.push(format!(
                            "{who}: loaded on CPU {cpu} but {r} is in the ring of CPU {lcpu}{}",
                            scpu.map(|c| format!(" with sample cpu {c}"))
                                .unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    push_capped(
        out,
        rule::PROGRAMS_ACCOUNTED,
        "batch programs not accounted",
        acc,
    );
    push_capped(out, rule::LOAD_CPU, "records on the wrong CPU", cpus);
    accounted
}

/// `inventory`: programs that predate the recording and their unloads.
fn check_inventory(
    ev: &RunEvidence,
    m: &Model<'_>,
    has_ksym: bool,
    has_bpf: bool,
    out: &mut Vec<Violation>,
) {
    let recs = m.recs;
    let mut msgs = Vec::new();
    for f in ev.progs.iter().filter(|f| ev.preexisting.contains(&f.id)) {
        if !ev.inventory.iter().any(|p| p.id == f.id) {
            msgs.push(format!(
                "program {:?} (id {}, {}) was loaded before recording but no inventory lists it",
                f.label, f.id, f.name
            ));
        }
    }
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
                None if ours => msgs.push(format!(
                    "{who}: the agent unloaded it but the stream has no PROG_UNLOAD for it"
                )),
                None => continue,
                Some(r) => {
                    if r.bpf_event(BPF_EVENT_PROG_UNLOAD).map(|(_, t)| t) != Some(p.tag) {
                        msgs.push(format!(
                            "{who}: PROG_UNLOAD tag differs from the inventoried tag {}: {r}",
                            hex::encode(p.tag)
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
                    ));
                }
                continue;
            };
            let Some(r) = recs.get(u) else { continue };
            if let RecordBody::Ksymbol {
                len,
                ksym_type,
                name,
                ..
            } = &r.body
            {
                let mut diffs = Vec::new();
                if *len != flen {
                    diffs.push(format!(
                        "len {len} != inventoried jited_func_lens[{fi}] {flen}"
                    ));
                }
                if *ksym_type != KSYM_TYPE_BPF {
                    diffs.push(format!(
                        "type {} is not BPF",
                        records::ksym_type_name(*ksym_type)
                    ));
                }
                let ks: Vec<&str> = p
                    .kallsyms
                    .iter()
                    .filter(|e| e.addr == addr)
                    .map(|e| e.name.as_str())
                    .collect();
                if ks.is_empty() {
                    diffs.push("the inventory has no kallsyms line at that address".into());
                } else if !ks.contains(&name.as_str()) {
                    diffs.push(format!("the inventory's kallsyms names it {ks:?}"));
                }
                if !facts_name_ok(p, name) {
                    diffs.push("name does not carry one of its inventoried tags".into());
                }
                if let Some(q) = unload {
                    if before(recs, u, q) == Some(false) {
                        diffs.push(format!("after its PROG_UNLOAD {}", fmt_idx(recs, Some(q))));
                    }
                }
                if !diffs.is_empty() {
                    msgs.push(format!("{who} f{fi}: {}: {r}", diffs.join("; ")));
                }
            }
        }
    }
    push_capped(out, rule::INVENTORY, "inventory mismatches", msgs);
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
fn interpreted_symbols(progs: &[ProgFacts], merged: &[Record]) -> Vec<Violation> {
    let interpreted: Vec<&ProgFacts> = progs.iter().filter(|f| is_interpreted(f)).collect();
    let mut out = Vec::new();
    for r in merged {
        let RecordBody::Ksymbol { addr, flags, .. } = &r.body else {
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
        out.push(Violation {
            rule,
            message: format!(
                "KSYMBOL {what} at {addr:#x}, where interpreted program(s) {} run (jited_func_lens all 0: not JIT-compiled, no symbol of their own): {r}",
                whose.join(", ")
            ),
        });
    }
    out
}

/// Per-record rules of one listener: record-type, sample-id, time-order.
fn check_listener(l: &ListenerInfo, recs: &[Record], out: &mut Vec<Violation>) {
    let mut types = Vec::new();
    let mut sids = Vec::new();
    let mut times = Vec::new();
    let mut first_id: Option<(u64, &Record)> = None;
    let mut prev: Option<&Record> = None;
    for r in recs {
        if r.header.misc != 0 {
            types.push(format!(
                "{r}: header.misc is not 0 (the kernel writes 0 for side-band records)"
            ));
        }
        match &r.body {
            RecordBody::Unknown { type_ } => types.push(format!(
                "{r}: record type {} is not one a ksymbol/bpf_event dummy listener receives",
                records::record_type_name(*type_).unwrap_or("(undefined)")
            )),
            RecordBody::Ksymbol {
                ksym_type, flags, ..
            } => {
                if !l.ksymbol {
                    types.push(format!("{r}: KSYMBOL on a listener opened without ksymbol"));
                }
                if *ksym_type != KSYM_TYPE_BPF && *ksym_type != KSYM_TYPE_OOL {
                    types.push(format!("{r}: ksym_type {ksym_type} (the kernel refuses UNKNOWN and undefined types)"));
                }
                if flags & !KSYMBOL_FLAGS_UNREGISTER != 0 {
                    types.push(format!(
                        "{r}: undefined KSYMBOL flag bits {:#x}",
                        flags & !KSYMBOL_FLAGS_UNREGISTER
                    ));
                }
            }
            RecordBody::BpfEvent {
                event_type, flags, ..
            } => {
                if !l.bpf_event {
                    types.push(format!(
                        "{r}: BPF_EVENT on a listener opened without bpf_event"
                    ));
                }
                if *event_type != BPF_EVENT_PROG_LOAD && *event_type != BPF_EVENT_PROG_UNLOAD {
                    types.push(format!("{r}: BPF_EVENT type {event_type} (the kernel emits only PROG_LOAD and PROG_UNLOAD)"));
                }
                if *flags != 0 {
                    types.push(format!("{r}: undefined BPF_EVENT flags {flags:#x}"));
                }
            }
            RecordBody::Lost { .. } => {}
        }
        if !matches!(r.body, RecordBody::Unknown { .. }) {
            let s = &r.sample;
            if let (Some(cpu), true) = (s.cpu, l.cpu >= 0) {
                if i64::from(cpu) != i64::from(l.cpu) {
                    sids.push(format!(
                        "{r}: sample cpu {cpu} on the listener bound to CPU {}",
                        l.cpu
                    ));
                }
            }
            if let Some(res) = s.cpu_res.filter(|v| *v != 0) {
                sids.push(format!(
                    "{r}: the res half of {{cpu, res}} is {res:#x}, not 0"
                ));
            }
            if let (Some(a), Some(b)) = (s.id, s.identifier) {
                if a != b {
                    sids.push(format!("{r}: sample id {a} != identifier {b}"));
                }
            }
            if let Some(id) = s.id.or(s.identifier) {
                match first_id {
                    None => first_id = Some((id, r)),
                    Some((first, fr)) if first != id => {
                        sids.push(format!("{r}: sample id {id} differs from the listener's first record's {first} ({fr})"))
                    }
                    _ => {}
                }
            }
        }
        if let (Some(p), Some(t)) = (prev.and_then(|p| p.time().map(|t| (p, t))), r.time()) {
            if t < p.1 {
                times.push(format!(
                    "time goes backwards within listener {}: {} then {r}",
                    l.index, p.0
                ));
            }
        }
        if r.time().is_some() {
            prev = Some(r);
        }
    }
    push_capped(
        out,
        rule::RECORD_TYPE,
        "unexpected records on this listener",
        types,
    );
    push_capped(
        out,
        rule::SAMPLE_ID,
        "sample_id problems on this listener",
        sids,
    );
    push_capped(
        out,
        rule::TIME_ORDER,
        "backward steps on this listener",
        times,
    );
}

fn check_facts(progs: &[ProgFacts], out: &mut Vec<Violation>) {
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

/// Groups CPU-bound listeners into CPU-wide sets; see the module docs.
fn listener_sets(listeners: &BTreeMap<u32, &ListenerInfo>) -> Vec<Vec<u32>> {
    type Key = (u64, bool, bool, bool, u64);
    let mut sets: Vec<(Key, Vec<u32>, BTreeSet<i32>)> = Vec::new();
    for l in listeners.values().filter(|l| l.cpu >= 0) {
        let key = (
            l.sample_type,
            l.sample_id_all,
            l.ksymbol,
            l.bpf_event,
            l.ring_bytes,
        );
        match sets
            .iter_mut()
            .find(|(k, _, cpus)| *k == key && !cpus.contains(&l.cpu))
        {
            Some((_, idx, cpus)) => {
                idx.push(l.index);
                cpus.insert(l.cpu);
            }
            None => sets.push((key, vec![l.index], BTreeSet::from([l.cpu]))),
        }
    }
    sets.into_iter().map(|(_, idx, _)| idx).collect()
}

/// The provoked-loss accounting of one set: what the run's programs caused
/// that this set asked for, against what arrived and what LOST counted.
fn loss_account(
    ev: &RunEvidence,
    set: usize,
    merged: &[Record],
    ksym: bool,
    bpf: bool,
    lost: u64,
) -> LossAccount {
    // Per program: a register and an unregister per function, a PROG_LOAD
    // and a PROG_UNLOAD; a program loaded before recording only unloads.
    let per = |functions: u64, whole: bool| -> u64 {
        let k = if ksym { functions } else { 0 };
        let b = u64::from(bpf);
        if whole {
            2 * k + 2 * b
        } else {
            k + b
        }
    };
    let mut caused = 0u64;
    for b in &ev.batches {
        caused += b.ids.len() as u64 * per(u64::from(b.functions), true);
    }
    for f in &ev.progs {
        let n = f.jited_ksyms.len() as u64;
        caused += per(n, !ev.preexisting.contains(&f.id));
    }
    let received = merged
        .iter()
        .filter(|r| {
            matches!(
                r.body,
                RecordBody::Ksymbol { .. } | RecordBody::BpfEvent { .. }
            )
        })
        .count() as u64;
    LossAccount {
        set,
        caused,
        received,
        lost,
    }
}

/// Multiset of what records say (`RecordContent`: everything but where and
/// when they were written), each with the first record that said it.
type KeyBag<'a> = BTreeMap<RecordContent, (usize, &'a Record)>;

fn bag<'a>(recs: impl Iterator<Item = &'a Record>, ksym: bool, bpf: bool) -> KeyBag<'a> {
    let mut out: KeyBag<'a> = BTreeMap::new();
    for r in recs {
        if let Some(key) = RecordContent::of_record(r) {
            let is_k = matches!(key, RecordContent::Ksymbol { .. });
            if (is_k && ksym) || (!is_k && bpf) {
                out.entry(key).or_insert((0, r)).0 += 1;
            }
        }
    }
    out
}

/// The records in `a` more often than in `b`, quoted.
fn surplus(a: &KeyBag<'_>, b: &KeyBag<'_>) -> Vec<String> {
    a.iter()
        .filter_map(|(k, (n, r))| {
            let m = b.get(k).map_or(0, |(m, _)| *m);
            (*n > m).then(|| {
                if *n - m > 1 {
                    format!("{r} (x{})", n - m)
                } else {
                    r.to_string()
                }
            })
        })
        .collect()
}

/// `listeners-agree`: see the module docs.
fn check_agreement(
    a: &Analysis,
    listeners: &BTreeMap<u32, &ListenerInfo>,
    cut: &BTreeSet<u32>,
    out: &mut Vec<Violation>,
) {
    let recs_of = |i: &u32| a.records_per_listener.get(i).into_iter().flatten();
    struct Member<'a> {
        name: String,
        ksym: bool,
        bpf: bool,
        recs: Vec<&'a Record>,
    }
    let mut sets: Vec<Member<'_>> = Vec::new();
    for (k, set) in a.sets.iter().enumerate() {
        if set.iter().any(|i| cut.contains(i)) {
            continue;
        }
        let Some(first) = set.first().and_then(|i| listeners.get(i)) else {
            continue;
        };
        sets.push(Member {
            name: format!("set#{k} (listeners {set:?})"),
            ksym: first.ksymbol,
            bpf: first.bpf_event,
            recs: set.iter().flat_map(recs_of).collect(),
        });
    }
    let mut msgs = Vec::new();
    // Every pair of sets over the record kinds both asked for.
    for (x, sx) in sets.iter().enumerate() {
        for sy in sets.iter().skip(x + 1) {
            let (k, b) = (sx.ksym && sy.ksym, sx.bpf && sy.bpf);
            if !k && !b {
                continue;
            }
            let bx = bag(sx.recs.iter().copied(), k, b);
            let by = bag(sy.recs.iter().copied(), k, b);
            let (only_x, only_y) = (surplus(&bx, &by), surplus(&by, &bx));
            if !only_x.is_empty() || !only_y.is_empty() {
                msgs.push(format!(
                    "{} and {} disagree: only in the first: [{}]; only in the second: [{}]",
                    sx.name,
                    sy.name,
                    only_x
                        .iter()
                        .take(MAX_PER_KIND)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" / "),
                    only_y
                        .iter()
                        .take(MAX_PER_KIND)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" / ")
                ));
            }
        }
    }
    // A task-bound listener against the first set that covers its kinds,
    // restricted to the task its records name.
    for l in listeners
        .values()
        .filter(|l| l.cpu < 0 && !cut.contains(&l.index))
    {
        let Some(reference) = sets
            .iter()
            .find(|s| (s.ksym || !l.ksymbol) && (s.bpf || !l.bpf_event))
        else {
            continue;
        };
        let mine: Vec<&Record> = recs_of(&l.index).collect();
        let tids: BTreeSet<(Option<u32>, Option<u32>)> =
            mine.iter().map(|r| (r.sample.pid, r.sample.tid)).collect();
        if tids.len() > 1 {
            msgs.push(format!(
                "task-bound listener {} has records of {} tasks (pid, tid): {tids:?}",
                l.index,
                tids.len()
            ));
            continue;
        }
        let task = tids.into_iter().next().and_then(|(_, t)| t);
        let theirs = reference
            .recs
            .iter()
            .copied()
            .filter(|r| match (task, r.sample.tid) {
                (Some(t), Some(rt)) => t == rt,
                _ => true,
            });
        let bx = bag(mine.iter().copied(), l.ksymbol, l.bpf_event);
        let by = bag(theirs, l.ksymbol, l.bpf_event);
        let (only_x, only_y) = (surplus(&bx, &by), surplus(&by, &bx));
        if !only_x.is_empty() || !only_y.is_empty() {
            msgs.push(format!(
                "task-bound listener {} and {}{} disagree: only in the task listener: [{}]; only in the set: [{}]",
                l.index,
                reference.name,
                task.map(|t| format!(" (records of tid {t})")).unwrap_or_default(),
                only_x.iter().take(MAX_PER_KIND).cloned().collect::<Vec<_>>().join(" / "),
                only_y.iter().take(MAX_PER_KIND).cloned().collect::<Vec<_>>().join(" / ")
            ));
        }
    }
    push_capped(out, rule::LISTENERS_AGREE, "disagreements", msgs);
}

/// `lookups`; returns the report notes.
fn check_lookups(ev: &RunEvidence, a: &Analysis, out: &mut Vec<Violation>) -> Vec<String> {
    let loads_in_streams = a
        .records_per_listener
        .values()
        .flatten()
        .filter(|r| r.bpf_event(BPF_EVENT_PROG_LOAD).is_some())
        .count() as u64;
    let mut notes = Vec::new();
    let mut msgs = Vec::new();
    for b in &ev.batches {
        let Some(l) = &b.lookups else { continue };
        let n = b.ids.len() as u64;
        let seen = u64::from(l.seen);
        if seen < n {
            msgs.push(format!(
                "{}: the side-band thread saw {seen} PROG_LOAD records but the storm loaded {n} programs",
                b.what()
            ));
        }
        if seen > loads_in_streams {
            msgs.push(format!(
                "{}: the side-band thread saw {seen} PROG_LOAD records, more than the {loads_in_streams} the host received",
                b.what()
            ));
        }
        if !l.other_errors.is_empty() {
            msgs.push(format!(
                "{}: lookups failed other than with ENOENT: {}",
                b.what(),
                l.other_errors.join("; ")
            ));
        } else if u64::from(l.found) + u64::from(l.enoent) != seen {
            msgs.push(format!(
                "{}: {} found + {} ENOENT != {seen} looked up",
                b.what(),
                l.found,
                l.enoent
            ));
        }
        let pct = if l.seen == 0 {
            0.0
        } else {
            100.0 * f64::from(l.enoent) / f64::from(l.seen)
        };
        notes.push(format!(
            "lookups: {} ids looked up at once, {} found, {} ENOENT ({pct:.1}%)",
            l.seen, l.found, l.enoent
        ));
    }
    push_capped(out, rule::LOOKUPS, "lookup problems", msgs);
    notes
}

/// Parses every stream and checks every rule.
pub fn analyse(ev: &RunEvidence) -> Analysis {
    let mut a = Analysis::default();
    let mut v: Vec<Violation> = Vec::new();

    let mut listeners: BTreeMap<u32, &ListenerInfo> = BTreeMap::new();
    for l in &ev.listeners {
        match listeners.entry(l.index) {
            std::collections::btree_map::Entry::Occupied(_) => v.push(m_find(
                rule::LISTENERS,
                format!(
                    "listener index {} reported twice; the first is used",
                    l.index
                ),
            )),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(l);
            }
        }
    }
    for (idx, bytes) in &ev.streams {
        if !listeners.contains_key(idx) {
            v.push(m_find(
                rule::LISTENERS,
                format!(
                    "{} stream bytes for listener {idx}, which was never reported",
                    bytes.len()
                ),
            ));
        }
    }

    // Per listener: parse, record-type, sample-id, time-order, lost.
    let mut lost_parts = Vec::new();
    let mut lost_by: BTreeMap<u32, u64> = BTreeMap::new();
    let mut cut: BTreeSet<u32> = BTreeSet::new();
    for (idx, l) in &listeners {
        let bytes = ev.streams.get(idx).map(Vec::as_slice).unwrap_or(&[]);
        let (recs, err) = parse_prefix(l, bytes);
        if let Some(e) = err {
            cut.insert(*idx);
            v.push(m_find(
                rule::PARSE,
                format!(
                    "{e} ({} records before it are kept for the per-record rules; the set rules \
                     and listeners-agree leave this listener's set out)",
                    recs.len()
                ),
            ));
        }
        check_listener(l, &recs, &mut v);
        let lost: u64 = recs
            .iter()
            .map(|r| match r.body {
                RecordBody::Lost { lost, .. } => lost,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        let n = recs
            .iter()
            .filter(|r| matches!(r.body, RecordBody::Lost { .. }))
            .count();
        if n > 0 {
            let first = recs
                .iter()
                .find(|r| matches!(r.body, RecordBody::Lost { .. }))
                .map(|r| r.to_string())
                .unwrap_or_default();
            lost_parts.push(format!(
                "listener {idx}: {n} LOST record(s), {lost} lost (first: {first})"
            ));
        }
        lost_by.insert(*idx, lost);
        a.lost = a.lost.saturating_add(lost);
        a.records_per_listener.insert(*idx, recs);
    }
    if !ev.provoked_loss && (a.lost > 0 || !lost_parts.is_empty()) {
        v.push(m_find(
            rule::LOST,
            format!(
                "{} records lost in total; {}",
                a.lost,
                lost_parts.join("; ")
            ),
        ));
    }

    check_facts(&ev.progs, &mut v);

    a.sets = listener_sets(&listeners);
    let online: BTreeSet<i64> = ev.online_cpus.iter().map(|c| i64::from(*c)).collect();
    if a.sets.is_empty() && !ev.progs.is_empty() {
        v.push(m_find(
            rule::LISTENERS,
            "programs were loaded but no CPU-wide listener recorded them".to_string(),
        ));
    }
    let multi = a.sets.len() > 1;
    for (k, set) in a.sets.iter().enumerate() {
        let label = if multi {
            format!("set#{k} (listeners {set:?})")
        } else {
            String::new()
        };
        let cpus: BTreeSet<i64> = set
            .iter()
            .filter_map(|i| listeners.get(i))
            .map(|l| i64::from(l.cpu))
            .collect();
        let missing: Vec<i64> = online.difference(&cpus).copied().collect();
        if !online.is_empty() && !missing.is_empty() {
            v.push(m_find(
                rule::LISTENERS,
                format!("listener set {set:?} has no listener on online CPU(s) {missing:?}: records emitted there are not seen"),
            ));
        }
        let Some(first) = set.first().and_then(|i| listeners.get(i)) else {
            continue;
        };
        let streams: Vec<Vec<Record>> = set
            .iter()
            .map(|i| a.records_per_listener.get(i).cloned().unwrap_or_default())
            .collect();
        let merged = merge_by_time(streams);
        let set_lost: u64 = set.iter().filter_map(|i| lost_by.get(i)).sum();
        if ev.provoked_loss {
            let account = loss_account(ev, k, &merged, first.ksymbol, first.bpf_event, set_lost);
            if account.received + account.lost != account.caused {
                v.push(m_find(
                    rule::LOST,
                    format!(
                        "{}the run provoked loss, but {} records received + {} lost = {} != {} \
                         records its programs caused{}",
                        if multi {
                            format!("{label}: ")
                        } else {
                            String::new()
                        },
                        account.received,
                        account.lost,
                        account.received + account.lost,
                        account.caused,
                        if lost_parts.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", lost_parts.join("; "))
                        }
                    ),
                ));
            }
            a.notes.push(format!(
                "loss{}: caused {} = received {} + lost {}{}",
                if multi {
                    format!(" set#{k}")
                } else {
                    String::new()
                },
                account.caused,
                account.received,
                account.lost,
                if account.received + account.lost == account.caused {
                    ""
                } else {
                    " (MISMATCH)"
                }
            ));
            a.loss.push(account);
        }
        if !set.iter().any(|i| cut.contains(i)) {
            let (found, accounted) = check_set(
                ev,
                &merged,
                first.ksymbol,
                first.bpf_event,
                &label,
                ev.provoked_loss && set_lost > 0,
            );
            v.extend(found);
            if k == 0 {
                a.accounted = accounted;
            }
        }
        if k == 0 {
            a.merged = merged;
        }
    }
    check_agreement(&a, &listeners, &cut, &mut v);
    let notes = check_lookups(ev, &a, &mut v);
    a.notes.extend(notes);
    a.violations = v;
    a
}

#[cfg(test)]
pub(crate) mod testrun {
    //! A synthetic run, built from the uapi layout (not recorded from a
    //! kernel): two programs (one with two JITed functions, one with one)
    //! loaded on CPU 0 and unloaded by a worker on CPU 1, an OOL symbol,
    //! and the unload of a program that predates the recording.
    use super::*;
    use crate::records::testutil::{self, Tr};
    use crate::records::{KSYM_TYPE_OOL, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    pub const T_MAIN: [u8; 8] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
    pub const T_MAIN_F0: &str = "0102030405060708";
    pub const T_MAIN_F1: &str = "a1a2a3a4a5a6a7a8";
    pub const T_BASIC: [u8; 8] = [0xba, 0x51, 0xc0, 0, 0, 0, 0, 1];
    pub const T_OLD: [u8; 8] = [0x99; 8];
    pub const A_F0: u64 = 0xffff_ffff_c000_0800;
    pub const A_F1: u64 = 0xffff_ffff_c000_0900;
    pub const A_BASIC: u64 = 0xffff_ffff_c000_2000;
    pub const A_OOL: u64 = 0xffff_ffff_c000_5000;
    pub const A_OLD: u64 = 0xffff_ffff_c000_7000;

    #[derive(Clone, Debug)]
    pub enum Ev {
        Reg(u64, u32, u16, String),
        Unreg(u64, u32, u16, String),
        Load(u32, [u8; 8]),
        Unload(u32, [u8; 8]),
        Lost(u64),
    }

    /// (listener, time, event)
    pub type Script = Vec<(u32, u64, Ev)>;

    /// The 8 tag bytes a 16-digit hex string spells.
    pub fn hex_tag(s: &str) -> [u8; 8] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    pub fn name_main_f0() -> String {
        format!("bpf_prog_{T_MAIN_F0}_kloop_subprogs")
    }
    pub fn name_main_f1() -> String {
        format!("bpf_prog_{T_MAIN_F1}_helper")
    }
    pub fn name_basic() -> String {
        format!("bpf_prog_{}_kloop_basic", hex::encode(T_BASIC))
    }
    pub fn name_old() -> String {
        format!("bpf_prog_{}_old", hex::encode(T_OLD))
    }

    pub fn good_script() -> Script {
        use Ev::*;
        vec![
            (0, 100, Reg(A_F0, 0x90, KSYM_TYPE_BPF, name_main_f0())),
            (0, 101, Reg(A_F1, 0x38, KSYM_TYPE_BPF, name_main_f1())),
            (0, 102, Load(42, T_MAIN)),
            (
                0,
                105,
                Reg(A_OOL, 4096, KSYM_TYPE_OOL, "kprobe_insn_page".into()),
            ),
            (0, 110, Reg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
            (0, 111, Load(43, T_BASIC)),
            (1, 200, Unreg(A_F0, 0x90, KSYM_TYPE_BPF, name_main_f0())),
            (1, 201, Unreg(A_F1, 0x38, KSYM_TYPE_BPF, name_main_f1())),
            (1, 202, Unload(42, T_MAIN)),
            (
                1,
                205,
                Unreg(A_OOL, 4096, KSYM_TYPE_OOL, "kprobe_insn_page".into()),
            ),
            (1, 210, Unreg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
            (1, 211, Unload(43, T_BASIC)),
            (1, 220, Unreg(A_OLD, 0x40, KSYM_TYPE_BPF, name_old())),
            (1, 221, Unload(5, T_OLD)),
        ]
    }

    fn entry(addr: u64, name: String) -> KallsymsEntry {
        KallsymsEntry {
            addr,
            kind: 't',
            name,
            module: Some("bpf".into()),
        }
    }

    pub fn evidence(script: &Script) -> RunEvidence {
        let st = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
        let listeners = vec![testutil::listener(0, 0, st), testutil::listener(1, 1, st)];
        let mut streams: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        for (li, time, ev) in script {
            let l = &listeners[*li as usize];
            let t = Tr {
                pid: 1,
                tid: if *li == 0 { 1 } else { 33 },
                time: *time,
                id: 0,
                stream_id: 0,
                cpu: l.cpu as u32,
            };
            let bytes = match ev {
                Ev::Reg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, false, n, t),
                Ev::Unreg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, true, n, t),
                Ev::Load(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_LOAD, *id, *tag, t),
                Ev::Unload(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_UNLOAD, *id, *tag, t),
                Ev::Lost(n) => testutil::lost(l, 0, *n, t),
            };
            streams.entry(*li).or_default().extend(bytes);
        }
        RunEvidence {
            online_cpus: vec![0, 1],
            listeners,
            streams,
            progs: vec![
                ProgFacts {
                    label: "main".into(),
                    id: 42,
                    tag: T_MAIN,
                    name: "kloop_subprogs".into(),
                    prog_type: 1,
                    jited_ksyms: vec![A_F0, A_F1],
                    jited_func_lens: vec![0x90, 0x38],
                    func_tags: vec![hex_tag(T_MAIN_F0), hex_tag(T_MAIN_F1)],
                    kallsyms: vec![entry(A_F0, name_main_f0()), entry(A_F1, name_main_f1())],
                },
                ProgFacts {
                    label: "basic".into(),
                    id: 43,
                    tag: T_BASIC,
                    name: "kloop_basic".into(),
                    prog_type: 6,
                    jited_ksyms: vec![A_BASIC],
                    jited_func_lens: vec![0x48],
                    func_tags: vec![T_BASIC],
                    kallsyms: vec![entry(A_BASIC, name_basic())],
                },
            ],
            initial_kallsyms: vec![entry(A_OLD, name_old())],
            ..RunEvidence::default()
        }
    }
}

#[cfg(test)]
mod tests {
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
        only(&s, rule::UNLOAD_SYMBOLS);
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
    }

    #[test]
    fn unknown_type_is_record_type() {
        let mut ev = evidence(&good_script());
        ev.streams
            .get_mut(&0)
            .unwrap()
            .extend(crate::records::testutil::raw(5, vec![0; 40]));
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
}

#[cfg(test)]
pub(crate) mod stream_tests {
    //! The recorder-side rules (batches, load-cpu, provoked loss,
    //! inventory, listeners-agree, lookups) over synthetic streams built
    //! from the uapi layout (not recorded from a kernel).
    use super::testrun::{hex_tag, Ev};
    use super::*;
    use crate::evidence::{Batch, Lookups};
    use crate::records::testutil::{self, Tr};
    use crate::records::{PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

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
        let mut streams: BTreeMap<u32, Vec<u8>> =
            ls.iter().map(|l| (l.index, Vec::new())).collect();
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
            lookups: None,
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
        assert!(
            a.of_rule(rule::PROGRAMS_ACCOUNTED)
                .any(|v| v.message.contains("program id 51")),
            "{}",
            dump(&a)
        );
    }

    #[test]
    fn pinned_loader_split_across_rings_fails() {
        // A loader pinned to CPU 0 cannot migrate: a register in CPU 1's
        // ring is a kernel bug (load-cpu) and the program is unaccounted.
        let s = migrated_cycle(1, 0, 100, 50, 0xffff_ffff_c000_1000);
        let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
        ev.batches = vec![batch(vec![50], Some(0))];
        let a = analyse(&ev);
        assert!(
            a.of_rule(rule::PROGRAMS_ACCOUNTED).any(|v| v
                .message
                .contains("only 0 record(s) before its PROG_LOAD from its loading task (tid 1) in its ring")),
            "{}",
            dump(&a)
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
        assert!(
            a.of_rule(rule::PROGRAMS_ACCOUNTED)
                .any(|v| v.message.contains("id 52: no PROG_UNLOAD")),
            "{}",
            dump(&a)
        );
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
    }

    #[test]
    fn concurrent_load_on_another_cpu_is_load_cpu() {
        let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
        // 51's records are in CPU 1's ring, but the loader says CPU 0.
        ev.batches = vec![batch(vec![50, 51, 52], Some(0))];
        let a = analyse(&ev);
        assert_eq!(rules(&a), BTreeSet::from([rule::LOAD_CPU]), "{}", dump(&a));
        assert!(a.violations[0].message.contains("in the ring of CPU 1"));
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
        assert_eq!(
            rules(&a),
            BTreeSet::from([rule::LISTENERS_AGREE]),
            "{}",
            dump(&a)
        );
        assert!(
            a.violations[0].message.contains("PROG_LOAD id=52"),
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
}

/// Runs under the interpreter (`scenarios/interpreter`), synthetic: no
/// pinned kernel can turn its JIT off (`CONFIG_BPF_JIT_ALWAYS_ON`).
#[cfg(test)]
mod interpreter_tests {
    use super::testrun::*;
    use super::*;

    /// `__bpf_prog_run32`: what `bpf_prog_info.jited_ksyms[0]` holds for a
    /// program the interpreter runs.
    const A_INTERP: u64 = 0xffff_ffff_8120_3a40;
    const T_I1: [u8; 8] = [0x1e; 8];
    const T_I2: [u8; 8] = [0x2e; 8];

    fn interpreted(label: &str, id: u32, tag: [u8; 8]) -> ProgFacts {
        ProgFacts {
            label: label.into(),
            id,
            tag,
            name: "kloop_basic".into(),
            prog_type: 6,
            jited_ksyms: vec![A_INTERP],
            jited_func_lens: vec![0],
            func_tags: vec![tag],
            kallsyms: vec![KallsymsEntry {
                addr: A_INTERP,
                kind: 't',
                name: "__bpf_prog_run32".into(),
                module: None,
            }],
        }
    }

    /// The synthetic run's JITed program "basic", plus interpreted programs.
    fn run(script: &Script, interp: Vec<ProgFacts>) -> Analysis {
        let mut ev = evidence(script);
        ev.progs.retain(|p| p.label == "basic");
        ev.progs.extend(interp);
        analyse(&ev)
    }

    fn jited_basic() -> Script {
        use Ev::*;
        vec![
            (0, 300, Reg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
            (0, 301, Load(43, T_BASIC)),
            (1, 310, Unreg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
            (1, 311, Unload(43, T_BASIC)),
        ]
    }

    fn rules(a: &Analysis) -> BTreeSet<&'static str> {
        a.violations.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn interpreted_programs_with_only_bpf_events_pass() {
        use Ev::*;
        let mut script = vec![
            (0, 100, Load(50, T_I1)),
            (0, 110, Load(51, T_I2)),
            (1, 200, Unload(50, T_I1)),
            (1, 210, Unload(51, T_I2)),
        ];
        script.extend(jited_basic());
        let a = run(
            &script,
            vec![interpreted("i1", 50, T_I1), interpreted("i2", 51, T_I2)],
        );
        assert!(a.violations.is_empty(), "{:#?}", a.violations);
    }

    #[test]
    fn a_symbol_for_an_interpreted_program_is_a_violation() {
        // What perf_event_bpf_emit_ksymbols sends for a program that is not
        // JITed: prog->bpf_func, jited_len 0 and the empty aux->ksym.name.
        use Ev::*;
        let mut script = vec![
            (0, 100, Reg(A_INTERP, 0, KSYM_TYPE_BPF, String::new())),
            (0, 101, Load(50, T_I1)),
            (1, 200, Unreg(A_INTERP, 0, KSYM_TYPE_BPF, String::new())),
            (1, 201, Unload(50, T_I1)),
        ];
        script.extend(jited_basic());
        let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
        assert_eq!(
            rules(&a),
            BTreeSet::from([rule::LOAD_SYMBOLS, rule::UNLOAD_SYMBOLS]),
            "{:#?}",
            a.violations
        );
        assert_eq!(a.violations.len(), 2, "{:#?}", a.violations);
        for v in &a.violations {
            assert!(
                v.message.contains("interpreted program(s) \"i1\" (id 50)"),
                "{v}"
            );
            assert!(v.message.contains("not JIT-compiled"), "{v}");
        }
    }

    #[test]
    fn bpf_events_of_interpreted_programs_are_still_checked() {
        use Ev::*;
        let mut script = vec![
            (0, 100, Load(50, [0xee; 8])),
            (1, 200, Unload(50, [0xee; 8])),
        ];
        script.extend(jited_basic());
        let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
        assert_eq!(
            rules(&a),
            BTreeSet::from([rule::LOAD_MATCHES_INFO]),
            "{:#?}",
            a.violations
        );
        let mut script = vec![(0, 100, Load(50, T_I1))];
        script.extend(jited_basic());
        let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
        assert_eq!(
            rules(&a),
            BTreeSet::from([rule::UNLOAD_MATCHES_LOAD]),
            "{:#?}",
            a.violations
        );
    }

    #[test]
    fn a_jited_program_without_its_symbol_still_fails() {
        use Ev::*;
        let script = vec![(0, 301, Load(43, T_BASIC)), (1, 311, Unload(43, T_BASIC))];
        let a = run(&script, vec![]);
        assert_eq!(rules(&a), BTreeSet::from([rule::LOAD_SYMBOLS]));
        assert!(!is_interpreted(&evidence(&script).progs[1]));
    }
}
