//! Pairing of one merged stream: each symbol's register … unregister and each
//! program's PROG_LOAD … PROG_UNLOAD, and the order of two records.

use super::*;

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
    /// The symbol's address.
    pub addr: u64,
    /// Index of the register record; `None` for symbols that predate the run.
    pub reg: Option<usize>,
    /// Index of the unregister record; `None` while it lives.
    pub unreg: Option<usize>,
}

/// Lifetime of one program id: PROG_LOAD … PROG_UNLOAD.
#[derive(Debug, Clone)]
pub struct ProgLife {
    /// The program's id.
    pub id: u32,
    /// `None` for programs that predate the run.
    pub load: Option<usize>,
    /// Index of its PROG_UNLOAD; `None` while it is loaded.
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

/// What is live while [`Model::build`] walks the stream.
#[derive(Default)]
struct Live {
    /// The symbol lifetime (index into `syms`) registered at each address.
    syms: BTreeMap<u64, usize>,
    /// The program lifetime (index into `progs`) loaded under each id.
    progs: BTreeMap<u32, usize>,
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
        let mut live = Live::default();
        for (i, r) in recs.iter().enumerate() {
            match &r.body {
                RecordBody::Ksymbol {
                    addr, flags, name, ..
                } => {
                    if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
                        m.register(&mut live, i, *addr);
                    } else if let Some(l) = live.syms.remove(addr) {
                        m.unregister(l, i);
                    } else {
                        m.unregister_unpaired(i, *addr, name, initial);
                    }
                }
                RecordBody::BpfEvent {
                    event_type,
                    id,
                    tag,
                    ..
                } => match *event_type {
                    BPF_EVENT_PROG_LOAD => m.prog_load(&mut live, i, *id),
                    BPF_EVENT_PROG_UNLOAD => m.prog_unload(&mut live, i, *id, tag, initial),
                    _ => {} // `record-type` reports undefined event types.
                },
                _ => {}
            }
        }
        m.never_unloaded();
        m
    }

    /// KSYMBOL register `i` at `addr` opens a lifetime; one still live
    /// there is a `load-symbols` finding.
    fn register(&mut self, live: &mut Live, i: usize, addr: u64) {
        let recs = self.recs;
        let r = &recs[i];
        if let Some(prev) = live
            .syms
            .get(&addr)
            .and_then(|l| self.syms.get(*l))
            .and_then(|l| l.reg)
            .and_then(|p| recs.get(p))
        {
            self.findings.push(
                m_find(
                    rule::LOAD_SYMBOLS,
                    format!("symbol registered again while still registered: {prev} then {r}"),
                )
                .quoting([prev, r]),
            );
        }
        let l = self.syms.len();
        self.syms.push(SymLife {
            addr,
            reg: Some(i),
            unreg: None,
        });
        self.sym_by_addr.entry(addr).or_default().push(l);
        live.syms.insert(addr, l);
    }

    /// KSYMBOL unregister `i` closes live lifetime `l`; it must repeat its
    /// register's length, name and type (`unload-symbols`).
    fn unregister(&mut self, l: usize, i: usize) {
        let recs = self.recs;
        let r = &recs[i];
        let reg = self
            .syms
            .get(l)
            .and_then(|s| s.reg)
            .and_then(|p| recs.get(p));
        if let Some(s) = self.syms.get_mut(l) {
            s.unreg = Some(i);
        }
        let (
            Some(
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
            ),
            RecordBody::Ksymbol {
                len,
                ksym_type,
                name,
                ..
            },
        ) = (reg, &r.body)
        else {
            return;
        };
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
                kloop_records::ksym_type_name(*ksym_type),
                kloop_records::ksym_type_name(*rtype)
            ));
        }
        if !diffs.is_empty() {
            self.findings.push(
                m_find(
                    rule::UNLOAD_SYMBOLS,
                    format!(
                        "unregister differs from its register ({}): {reg} / {r}",
                        diffs.join(", ")
                    ),
                )
                .quoting([reg, r]),
            );
        }
    }

    /// KSYMBOL unregister `i` at `addr` with no live register: a second
    /// unregister (`unload-symbols`), a symbol from before the run (its
    /// lifetime opens and closes here), or one from nowhere
    /// (`unregister-without-register`).
    fn unregister_unpaired(&mut self, i: usize, addr: u64, name: &str, initial: &[KallsymsEntry]) {
        let recs = self.recs;
        let r = &recs[i];
        if let Some(last) = self
            .sym_by_addr
            .get(&addr)
            .and_then(|v| v.last())
            .and_then(|l| self.syms.get(*l))
        {
            let prev = last
                .unreg
                .and_then(|u| recs.get(u))
                .map(|p| p.to_string())
                .unwrap_or_else(|| "?".into());
            let quoted = last.unreg.and_then(|u| recs.get(u)).into_iter().chain([r]);
            self.findings.push(
                m_find(
                    rule::UNLOAD_SYMBOLS,
                    format!(
                        "symbol unregistered again without a register in between: {prev} then {r}"
                    ),
                )
                .quoting(quoted),
            );
        } else if initial.iter().any(|e| e.addr == addr && e.name == name) {
            let l = self.syms.len();
            self.syms.push(SymLife {
                addr,
                reg: None,
                unreg: Some(i),
            });
            self.sym_by_addr.entry(addr).or_default().push(l);
        } else {
            let hint = initial
                .iter()
                .filter(|e| e.addr == addr)
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
            self.findings.push(m_find(
                rule::UNREGISTER_WITHOUT_REGISTER,
                format!("{r} unregisters a symbol neither registered in this run nor in the initial kallsyms{hint}"),
            ).quoting([r]));
        }
    }

    /// PROG_LOAD `i` of program `id` opens a lifetime; one still live under
    /// that id is an `unload-matches-load` finding.
    fn prog_load(&mut self, live: &mut Live, i: usize, id: u32) {
        let recs = self.recs;
        let r = &recs[i];
        if let Some(prev) = live
            .progs
            .get(&id)
            .and_then(|l| self.progs.get(*l))
            .and_then(|p| p.load)
            .and_then(|p| recs.get(p))
        {
            self.findings.push(
                m_find(
                    rule::UNLOAD_MATCHES_LOAD,
                    format!("program id loaded again while still loaded: {prev} then {r}"),
                )
                .quoting([prev, r]),
            );
        }
        let l = self.progs.len();
        self.progs.push(ProgLife {
            id,
            load: Some(i),
            unload: None,
        });
        self.prog_by_id.entry(id).or_default().push(l);
        live.progs.insert(id, l);
    }

    /// PROG_UNLOAD `i` of program `id`: closes its live lifetime (with its
    /// PROG_LOAD's tag), or is a second unload, or that of a program from
    /// before the run, or of one from nowhere (`unload-matches-load`).
    fn prog_unload(
        &mut self,
        live: &mut Live,
        i: usize,
        id: u32,
        tag: &[u8; 8],
        initial: &[KallsymsEntry],
    ) {
        let recs = self.recs;
        let r = &recs[i];
        if let Some(l) = live.progs.remove(&id) {
            if let Some(p) = self.progs.get_mut(l) {
                p.unload = Some(i);
            }
            let load = self
                .progs
                .get(l)
                .and_then(|p| p.load)
                .and_then(|p| recs.get(p));
            if let Some(load) = load {
                if load.bpf_event(BPF_EVENT_PROG_LOAD).map(|(_, t)| t) != Some(*tag) {
                    self.findings.push(
                        m_find(
                            rule::UNLOAD_MATCHES_LOAD,
                            format!("PROG_UNLOAD tag differs from its PROG_LOAD: {load} / {r}"),
                        )
                        .quoting([load, r]),
                    );
                }
            }
        } else if self.prog_by_id.contains_key(&id) {
            self.findings.push(
                m_find(
                    rule::UNLOAD_MATCHES_LOAD,
                    format!("program unloaded again without a load in between: {r}"),
                )
                .quoting([r]),
            );
        } else if predates_run(self, recs, i, tag, initial) {
            let l = self.progs.len();
            self.progs.push(ProgLife {
                id,
                load: None,
                unload: Some(i),
            });
            self.prog_by_id.entry(id).or_default().push(l);
        } else {
            self.findings.push(m_find(
                rule::UNLOAD_MATCHES_LOAD,
                format!(
                    "{r}: PROG_UNLOAD of a program never loaded in this run and not in the initial kallsyms"
                ),
            ).quoting([r]));
        }
    }

    /// A program loaded but never unloaded is an `unload-matches-load`
    /// finding (after every finding of the walk).
    fn never_unloaded(&mut self) {
        let recs = self.recs;
        for p in &self.progs {
            if let (Some(load), None) = (p.load, p.unload) {
                if let Some(load) = recs.get(load) {
                    self.findings.push(
                        m_find(
                            rule::UNLOAD_MATCHES_LOAD,
                            format!("program loaded but never unloaded in the stream: {load}"),
                        )
                        .quoting([load]),
                    );
                }
            }
        }
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

pub(super) fn m_find(rule: &'static str, message: String) -> Violation {
    Violation::new(rule, message)
}

/// A PROG_UNLOAD without a PROG_LOAD is fine for a program that existed
/// before recording started: its tag names a symbol in the initial kallsyms
/// (single-function programs), or the record before it in its listener is
/// the unregister of a symbol from the initial kallsyms (the kernel emits
/// the unregisters right before PROG_UNLOAD; subprogram names carry
/// per-function tags).
pub(super) fn predates_run(
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

pub(super) fn fmt_idx(recs: &[Record], i: Option<usize>) -> String {
    i.and_then(|i| recs.get(i))
        .map(|r| r.to_string())
        .unwrap_or_else(|| "(none)".into())
}
