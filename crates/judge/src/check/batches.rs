//! `programs-accounted` and `load-cpu` for the programs of `storm` and
//! `concurrent` batches, which the agent reports by id only.
//!
//! A set is held to the batches it could see: those whose step ran while
//! it was open and, for a set on a CPU subset, those of loaders pinned to
//! its CPUs (`perf_iterate_sb()` writes a record only to the side-band
//! listeners of the CPU the loader runs on; an unpinned `storm` may run
//! anywhere, so a subset set is not held to it).

use super::*;

/// `programs-accounted` and `load-cpu` for every batch program; returns the
/// indexes of the records accounted to them.
pub(super) fn check_batches(
    ev: &RunEvidence,
    m: &Model<'_>,
    scope: &SetScope,
    out: &mut Vec<Violation>,
) -> BTreeSet<usize> {
    if ev.batches.is_empty() {
        return BTreeSet::new();
    }
    elsewhere(ev, m, scope, out);
    let recs = m.recs;
    let mut books = BatchBooks {
        m,
        life_by_reg: m
            .syms
            .iter()
            .enumerate()
            .filter_map(|(l, s)| s.reg.map(|r| (r, l)))
            .collect(),
        cpu_of: ev.listeners.iter().map(|l| (l.index, l.cpu)).collect(),
        // Whether the set's stream is merged by sample time (every record has one).
        set_timed: !recs.is_empty() && recs.iter().all(|r| r.time().is_some()),
        accounted: BTreeSet::new(),
        acc: Vec::new(),
        cpus: Vec::new(),
    };
    for b in ev.batches.iter().filter(|b| in_scope(b, scope)) {
        if b.functions == 0 && !b.ids.is_empty() {
            books.acc.push(
                format!(
                    "{}: reports {} programs with 0 JITed functions",
                    b.what(),
                    b.ids.len()
                )
                .into(),
            );
            continue;
        }
        for &id in &b.ids {
            books.program(b, id);
        }
    }
    push_findings(out, books.acc, books.cpus);
    books.accounted
}

/// Both accountings' findings: programs not accounted, then records on the
/// wrong CPU.
fn push_findings(out: &mut Vec<Violation>, acc: Vec<Found<'_>>, cpus: Vec<Found<'_>>) {
    push_capped(
        out,
        rule::PROGRAMS_ACCOUNTED,
        "batch programs not accounted",
        acc,
    );
    push_capped(out, rule::LOAD_CPU, "records on the wrong CPU", cpus);
}

/// The accounting of one set's batch programs as it goes.
struct BatchBooks<'m, 'a> {
    m: &'m Model<'a>,
    /// Symbol lifetime by the index of its register.
    life_by_reg: BTreeMap<usize, usize>,
    /// Each listener's CPU.
    cpu_of: BTreeMap<u32, i32>,
    /// The set's stream is merged by sample time (every record has one).
    set_timed: bool,
    /// Records accounted to batch programs.
    accounted: BTreeSet<usize>,
    /// `programs-accounted` findings.
    acc: Vec<Found<'a>>,
    /// `load-cpu` findings.
    cpus: Vec<Found<'a>>,
}

/// What is wrong with one batch program's records, and the records that
/// show it.
#[derive(Default)]
struct Problems<'a> {
    said: Vec<String>,
    quoted: Vec<&'a Record>,
}

impl<'a> BatchBooks<'_, 'a> {
    /// Batch `b`'s program `id`: one PROG_LOAD, its registers right before
    /// it, each unregistered between it and its PROG_UNLOAD; a pinned
    /// loader's records on its CPU.
    fn program(&mut self, b: &Batch, id: u32) {
        let (m, recs) = (self.m, self.m.recs);
        let f = b.functions as usize;
        let who = format!("{} program id {id}", b.what());
        let loads = m.loads_of(id);
        let Some(life) = loads.first().and_then(|l| m.progs.get(*l)) else {
            self.acc
                .push(format!("{who}: no PROG_LOAD in the stream").into());
            return;
        };
        if loads.len() > 1 {
            self.acc
                .push(format!("{who}: {} PROG_LOAD records", loads.len()).into());
        }
        let Some(load) = life.load else { return };
        let Some(load_rec) = recs.get(load) else {
            return;
        };
        self.accounted.insert(load);
        let (regs, by_time) = self.registers_of(b, load, load_rec);
        let mut problems = Problems::default();
        if regs.len() < f {
            let place = match (by_time, load_rec.sample.tid) {
                (true, Some(t)) => {
                    format!("from its loading task (tid {t}) in the merged stream")
                }
                (true, None) => "in the merged stream".to_string(),
                (false, Some(t)) => format!("from its loading task (tid {t}) in its ring"),
                (false, None) => "in its ring".to_string(),
            };
            problems.said.push(format!(
                "only {} record(s) before its PROG_LOAD {place}, {f} register(s) expected",
                regs.len()
            ));
        }
        let unregs = self.registers(&regs, load_rec, f, &mut problems);
        self.unload(life, load_rec, load, &unregs, &mut problems);
        if !problems.said.is_empty() {
            self.acc.push(quoting(
                format!("{who}: {}", problems.said.join("; ")),
                problems.quoted,
            ));
        }
        if let Some(cpu) = b.cpu {
            self.load_cpu(&who, cpu, load, &regs);
        }
    }

    /// Where program `load`'s registers are: the indexes of at most
    /// `b.functions` candidates, nearest first, and whether they were
    /// looked for in the merged stream (else in the PROG_LOAD's ring).
    fn registers_of(&self, b: &Batch, load: usize, load_rec: &Record) -> (Vec<usize>, bool) {
        let recs = self.m.recs;
        // perf_event_bpf_event() (kernel/events/core.c) emits them, one
        // per function, right before the PROG_LOAD, from the loading task;
        // but each record is a perf_iterate_sb() of its own, preemption is
        // disabled only while one record is written, and each goes to the
        // side-band listeners of the CPU the task runs on at that moment. A task that is not pinned may migrate between two of
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
        let by_time = b.cpu.is_none() && self.set_timed;
        let loader_tid = load_rec.sample.tid;
        let regs = (0..load)
            .rev()
            .filter(|i| {
                recs.get(*i).is_some_and(|r| {
                    (by_time || r.listener == load_rec.listener)
                        && (loader_tid.is_none() || r.sample.tid == loader_tid)
                })
            })
            .take(b.functions as usize)
            .collect();
        (regs, by_time)
    }

    /// Each candidate must be a BPF register named after the program
    /// (after its tag when it has one function), later unregistered.
    /// Returns the (register, unregister) pairs.
    fn registers(
        &mut self,
        regs: &[usize],
        load_rec: &Record,
        f: usize,
        problems: &mut Problems<'a>,
    ) -> Vec<(usize, usize)> {
        let (m, recs) = (self.m, self.m.recs);
        let tag = load_rec
            .bpf_event(BPF_EVENT_PROG_LOAD)
            .map(|(_, t)| t)
            .unwrap_or_default();
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
                problems.quoted.push(r);
                problems.said.push(format!(
                    "{r} is not a BPF register named after the program where one of its {f} register(s) belongs"
                ));
                continue;
            }
            self.accounted.insert(i);
            match self
                .life_by_reg
                .get(&i)
                .and_then(|l| m.syms.get(*l))
                .and_then(|s| s.unreg)
            {
                None => {
                    problems.quoted.push(r);
                    problems.said.push(format!("{r} is never unregistered"));
                }
                Some(u) => {
                    self.accounted.insert(u);
                    unregs.push((i, u));
                }
            }
        }
        unregs
    }

    /// The program's PROG_UNLOAD, with every unregister between its
    /// PROG_LOAD and it.
    fn unload(
        &mut self,
        life: &ProgLife,
        load_rec: &'a Record,
        load: usize,
        unregs: &[(usize, usize)],
        problems: &mut Problems<'a>,
    ) {
        let recs = self.m.recs;
        let Some(q) = life.unload else {
            problems.quoted.push(load_rec);
            problems
                .said
                .push(format!("no PROG_UNLOAD after {load_rec}"));
            return;
        };
        self.accounted.insert(q);
        for (i, u) in unregs {
            if before(recs, load, *u) == Some(false) || before(recs, *u, q) == Some(false) {
                problems.quoted.extend(
                    [Some(*u), Some(*i), Some(load), Some(q)]
                        .into_iter()
                        .flatten()
                        .filter_map(|x| recs.get(x)),
                );
                problems.said.push(format!(
                    "unregister {} of {} is not between PROG_LOAD {load_rec} and PROG_UNLOAD {}",
                    fmt_idx(recs, Some(*u)),
                    fmt_idx(recs, Some(*i)),
                    fmt_idx(recs, Some(q))
                ));
            }
        }
    }

    /// `load-cpu`: a pinned loader's PROG_LOAD and registers are in the
    /// ring of its CPU, with that sample cpu.
    fn load_cpu(&mut self, who: &str, cpu: u32, load: usize, regs: &[usize]) {
        let recs = self.m.recs;
        for i in std::iter::once(load).chain(regs.iter().copied()) {
            let Some(r) = recs.get(i) else { continue };
            let lcpu = self.cpu_of.get(&r.listener).copied().unwrap_or(-1);
            let scpu = r.sample.cpu;
            if i64::from(lcpu) != i64::from(cpu) || scpu.is_some_and(|c| c != cpu) {
                self.cpus.push(quoting(
                    format!(
                        "{who}: loaded on CPU {cpu} but {r} is in the ring of CPU {lcpu}{}",
                        scpu.map(|c| format!(" with sample cpu {c}"))
                            .unwrap_or_default()
                    ),
                    [r],
                ));
            }
        }
    }
}

/// Whether set `scope` saw batch `b` come and go.
pub(super) fn in_scope(b: &Batch, scope: &SetScope) -> bool {
    let step_ok = b.step.is_none_or(|s| scope.window.covers(s));
    let cpu_ok = match (&scope.cpus, b.cpu) {
        (None, _) => true,
        (Some(cpus), Some(c)) => cpus.contains(&c),
        (Some(_), None) => false,
    };
    step_ok && cpu_ok
}

/// A set on a CPU subset must hold no PROG_LOAD of a loader pinned to a
/// CPU outside it (`load-cpu`): the kernel wrote that record to that CPU's
/// listeners only.
fn elsewhere(ev: &RunEvidence, m: &Model<'_>, scope: &SetScope, out: &mut Vec<Violation>) {
    let Some(cpus) = &scope.cpus else { return };
    if !scope.has_bpf {
        return;
    }
    let mut msgs: Vec<Found<'_>> = Vec::new();
    for b in &ev.batches {
        let Some(c) = b.cpu.filter(|c| !cpus.contains(c)) else {
            continue;
        };
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
                            "{} program id {id}: loaded on CPU {c}, outside this set's CPUs {cpus:?}, yet its PROG_LOAD is here: {r}",
                            b.what()
                        ),
                        [r],
                    ));
                }
            }
        }
    }
    push_capped(out, rule::LOAD_CPU, "records from other CPUs", msgs);
}

/// `programs-accounted` and `load-cpu` for a set that asked for one record
/// kind only. BPF_EVENT alone: every batch program's PROG_LOAD (in its
/// loader's ring when pinned) and a later PROG_UNLOAD with its tag, by id.
/// KSYMBOL alone (no id to tie a symbol to its program): the BPF program
/// registers (`bpf_prog_<tag>…` names) number the batches' programs ×
/// functions plus the functions of the `load` steps' programs the set saw
/// load; with PERF_SAMPLE_TID, the agent's threads' registers (tid != pid:
/// the `concurrent` loaders) in each CPU's ring number exactly what the
/// loader pinned there loaded, each unregistered later. Both as
/// `perf_event_bpf_event()` promises for a set that asked for the kind
/// (`nr_ksymbol_events` gates the registers, `nr_bpf_events` the
/// BPF_EVENT, independently).
///
/// Returns the indexes of the records it accounted to batch programs (the
/// normaliser summarises them: two loaders' records interleave differently
/// from run to run).
pub(super) fn check_batches_one_kind(
    ev: &RunEvidence,
    m: &Model<'_>,
    scope: &SetScope,
    out: &mut Vec<Violation>,
) -> BTreeSet<usize> {
    if ev.batches.is_empty() {
        return BTreeSet::new();
    }
    elsewhere(ev, m, scope, out);
    let batches: Vec<&Batch> = ev.batches.iter().filter(|b| in_scope(b, scope)).collect();
    let mut books = OneKindBooks {
        m,
        cpu_of: ev.listeners.iter().map(|l| (l.index, l.cpu)).collect(),
        accounted: BTreeSet::new(),
        acc: Vec::new(),
        cpus: Vec::new(),
    };
    if scope.has_bpf {
        for b in &batches {
            for &id in &b.ids {
                books.events(b, id);
            }
        }
    }
    if scope.has_ksym {
        books.registers(ev, scope, &batches);
    }
    push_findings(out, books.acc, books.cpus);
    books.accounted
}

/// The accounting of one set's batch programs when the set asked for one
/// record kind only.
struct OneKindBooks<'m, 'a> {
    m: &'m Model<'a>,
    /// Each listener's CPU.
    cpu_of: BTreeMap<u32, i32>,
    /// Records accounted to batch programs.
    accounted: BTreeSet<usize>,
    /// `programs-accounted` findings.
    acc: Vec<Found<'a>>,
    /// `load-cpu` findings.
    cpus: Vec<Found<'a>>,
}

impl OneKindBooks<'_, '_> {
    /// BPF_EVENT alone: batch `b`'s program `id` has one PROG_LOAD (in its
    /// loader's ring when pinned) and a PROG_UNLOAD.
    fn events(&mut self, b: &Batch, id: u32) {
        let (m, recs) = (self.m, self.m.recs);
        let who = format!("{} program id {id}", b.what());
        let loads = m.loads_of(id);
        let Some(life) = loads.first().and_then(|l| m.progs.get(*l)) else {
            self.acc
                .push(format!("{who}: no PROG_LOAD in the stream").into());
            return;
        };
        if loads.len() > 1 {
            self.acc
                .push(format!("{who}: {} PROG_LOAD records", loads.len()).into());
        }
        let Some(load_rec) = life.load.and_then(|p| recs.get(p)) else {
            return;
        };
        self.accounted.extend(life.load);
        self.accounted.extend(life.unload);
        if life.unload.is_none() {
            self.acc.push(quoting(
                format!("{who}: no PROG_UNLOAD after {load_rec}"),
                [load_rec],
            ));
        }
        if let Some(cpu) = b.cpu {
            let lcpu = self.cpu_of.get(&load_rec.listener).copied().unwrap_or(-1);
            if i64::from(lcpu) != i64::from(cpu) || load_rec.sample.cpu.is_some_and(|c| c != cpu) {
                self.cpus.push(quoting(
                    format!(
                        "{who}: loaded on CPU {cpu} but {load_rec} is in the ring of CPU {lcpu}"
                    ),
                    [load_rec],
                ));
            }
        }
    }

    /// KSYMBOL alone: the BPF program registers, counted.
    fn registers(&mut self, ev: &RunEvidence, scope: &SetScope, batches: &[&Batch]) {
        let recs = self.m.recs;
        // Every BPF program register (`bpf_prog_<tag>…`; trampolines and
        // interpreted programs have other names): the batches' and those
        // of the `load` steps' programs this set saw load. Identical
        // programs share names and, once one is freed, addresses, so the
        // two are told apart by task: a `concurrent` loader is a thread of
        // the agent (sample tid != pid), a `load` step runs in its main
        // task.
        let regs: Vec<usize> = recs
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                matches!(&r.body, RecordBody::Ksymbol { ksym_type, flags, name, .. }
                    if flags & KSYMBOL_FLAGS_UNREGISTER == 0
                        && *ksym_type == KSYM_TYPE_BPF
                        && has_some_tag_prefix(name))
            })
            .map(|(i, _)| i)
            .collect();
        let tids_known = regs.iter().all(|i| {
            recs.get(*i)
                .is_some_and(|r| r.sample.tid.is_some() && r.sample.pid.is_some())
        });
        let by_thread = |i: &usize| {
            recs.get(*i).is_some_and(
                |r| matches!((r.sample.pid, r.sample.tid), (Some(p), Some(t)) if p != t),
            )
        };
        self.register_count(ev, scope, batches, regs.len());
        let threads: Vec<usize> = if tids_known {
            regs.iter().copied().filter(by_thread).collect()
        } else {
            Vec::new()
        };
        self.registers_per_cpu(batches, &regs, &threads, tids_known);
        let unreg_of: BTreeMap<usize, Option<usize>> = self
            .m
            .syms
            .iter()
            .filter_map(|s| s.reg.map(|r| (r, s.unreg)))
            .collect();
        for &i in &threads {
            self.accounted.insert(i);
            self.accounted.extend(unreg_of.get(&i).copied().flatten());
            if unreg_of.get(&i).copied().flatten().is_none() {
                if let Some(r) = recs.get(i) {
                    self.acc.push(quoting(
                        format!("{r}: a batch program's register never unregistered"),
                        [r],
                    ));
                }
            }
        }
    }

    /// The `n` BPF program registers number the batches' programs ×
    /// functions plus the functions of the `load` steps' programs the set
    /// saw load (at least that many on a CPU subset with such programs).
    fn register_count(&mut self, ev: &RunEvidence, scope: &SetScope, batches: &[&Batch], n: usize) {
        let caused: usize = batches
            .iter()
            .map(|b| b.ids.len() * b.functions as usize)
            .sum();
        // The `load` steps' programs: held to this set only on every CPU.
        let facts: Vec<&ProgFacts> = ev
            .progs
            .iter()
            .filter(|f| !ev.preexisting.contains(&f.id) && !is_interpreted(f))
            .collect();
        let exact = scope.cpus.is_none() || facts.is_empty();
        let from_facts: usize = if scope.cpus.is_none() {
            facts
                .iter()
                .filter(|f| seen_by(ev, scope, f).0)
                .map(|f| f.jited_ksyms.len())
                .sum()
        } else {
            0
        };
        let want = caused + from_facts;
        if n < want || (exact && n > want) {
            self.acc.push(format!(
                "{} BPF program register(s) in the stream, but the batches ({}) loaded {caused} JITed function(s) and the load steps' programs {from_facts}",
                n,
                batches.iter().map(|b| format!("{}: {} x {}", b.what(), b.ids.len(), b.functions)).collect::<Vec<_>>().join(", ")
            ).into());
        }
    }

    /// Each CPU's ring holds the registers of the loaders pinned there:
    /// with tids, exactly their threads' registers (`threads`); without,
    /// at least that many registers.
    fn registers_per_cpu(
        &mut self,
        batches: &[&Batch],
        regs: &[usize],
        threads: &[usize],
        tids_known: bool,
    ) {
        let recs = self.m.recs;
        let mut by_cpu: BTreeMap<u32, usize> = BTreeMap::new();
        for b in batches.iter().filter(|b| b.cpu.is_some()) {
            *by_cpu.entry(b.cpu.unwrap_or_default()).or_default() +=
                b.ids.len() * b.functions as usize;
        }
        for (&cpu, &want) in &by_cpu {
            let in_ring = |i: &&usize| {
                recs.get(**i)
                    .and_then(|r| self.cpu_of.get(&r.listener))
                    .is_some_and(|c| i64::from(*c) == i64::from(cpu))
            };
            let (here, ok) = if tids_known {
                let n = threads.iter().filter(in_ring).count();
                (n, n == want)
            } else {
                let n = regs.iter().filter(in_ring).count();
                (n, n >= want)
            };
            if !ok {
                self.cpus.push(format!(
                    "the loaders pinned to CPU {cpu} loaded {want} JITed function(s), but the ring of CPU {cpu} holds {here} BPF program register(s){}",
                    if tids_known { " of the agent's threads" } else { "" }
                ).into());
            }
        }
    }
}
