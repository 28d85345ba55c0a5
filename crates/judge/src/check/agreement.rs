//! Rules across listener sets: provoked-loss accounting (`lost`),
//! `listeners-agree`, and the side-band `lookups`.

use super::*;

/// The provoked-loss accounting of one set: what the run's programs caused
/// that this set asked for, against what arrived and what LOST counted.
pub(super) fn loss_account(
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
pub(super) type KeyBag<'a> = BTreeMap<RecordContent, (usize, &'a Record)>;

pub(super) fn bag<'a>(recs: impl Iterator<Item = &'a Record>, ksym: bool, bpf: bool) -> KeyBag<'a> {
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

/// The records in `a` more often than in `b`, quoted, each with the first
/// record that said it.
pub(super) fn surplus<'a>(a: &KeyBag<'a>, b: &KeyBag<'_>) -> Vec<(String, &'a Record)> {
    a.iter()
        .filter_map(|(k, (n, r))| {
            let m = b.get(k).map_or(0, |(m, _)| *m);
            (*n > m).then(|| {
                let text = if *n - m > 1 {
                    format!("{r} (x{})", n - m)
                } else {
                    r.to_string()
                };
                (text, *r)
            })
        })
        .collect()
}

/// The first [`MAX_PER_KIND`] of a surplus, joined for a message.
fn shown(surplus: &[(String, &Record)]) -> String {
    surplus
        .iter()
        .take(MAX_PER_KIND)
        .map(|(t, _)| t.as_str())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The records of two surpluses a message shows.
fn shown_records<'a>(x: &[(String, &'a Record)], y: &[(String, &'a Record)]) -> Vec<&'a Record> {
    x.iter()
        .take(MAX_PER_KIND)
        .chain(y.iter().take(MAX_PER_KIND))
        .map(|(_, r)| *r)
        .collect()
}

/// One CPU-wide set, as `listeners-agree` compares it.
struct Member<'a> {
    name: String,
    ksym: bool,
    bpf: bool,
    /// The CPUs it listens on, when a subset.
    cpus: Option<BTreeSet<u32>>,
    window: Window,
    recs: Vec<&'a Record>,
}

/// What `listeners-agree` compares: the whole (not cut) CPU-wide sets and
/// the listeners bound to tasks.
struct Agreement<'a> {
    ev: &'a RunEvidence,
    a: &'a Analysis,
    listeners: &'a BTreeMap<u32, &'a ListenerInfo>,
    cut: &'a BTreeSet<u32>,
    cpu_of: BTreeMap<u32, i32>,
    sets: Vec<Member<'a>>,
}

impl<'a> Agreement<'a> {
    fn new(
        ev: &'a RunEvidence,
        a: &'a Analysis,
        listeners: &'a BTreeMap<u32, &'a ListenerInfo>,
        cut: &'a BTreeSet<u32>,
    ) -> Self {
        let mut me = Agreement {
            ev,
            a,
            listeners,
            cut,
            cpu_of: listeners.values().map(|l| (l.index, l.cpu)).collect(),
            sets: Vec::new(),
        };
        for (k, set) in a.sets.iter().enumerate() {
            if set.iter().any(|i| cut.contains(i)) {
                continue;
            }
            let Some(first) = set.first().and_then(|i| listeners.get(i)) else {
                continue;
            };
            let member = Member {
                name: format!("set#{k} (listeners {set:?})"),
                ksym: first.ksymbol,
                bpf: first.bpf_event,
                cpus: first.cpus.as_ref().map(|c| c.iter().copied().collect()),
                window: ev.window(first.index),
                recs: set.iter().flat_map(|i| me.recs_of(i)).collect(),
            };
            me.sets.push(member);
        }
        me
    }

    fn recs_of(&self, i: &u32) -> impl Iterator<Item = &'a Record> + 'a {
        self.a.records_per_listener.get(i).into_iter().flatten()
    }

    /// Two listeners saw the same programs come and go when no step that
    /// makes records ran between their opens or between their closes.
    fn same_life(&self, x: Window, y: Window) -> bool {
        !self.ev.records_made_between(x.opened, y.opened, false)
            && !self.ev.records_made_between(x.closed, y.closed, true)
    }

    /// Whether record `r` was emitted on one of `cpus` (`None`: all).
    fn on(&self, cpus: &Option<BTreeSet<u32>>, r: &&Record) -> bool {
        match cpus {
            None => true,
            Some(c) => self
                .cpu_of
                .get(&r.listener)
                .is_some_and(|l| u32::try_from(*l).is_ok_and(|l| c.contains(&l))),
        }
    }

    /// The first set on every CPU that asked for the kinds asked for and
    /// saw the same programs as `window`.
    fn reference(&self, ksymbol: bool, bpf_event: bool, window: Window) -> Option<&Member<'a>> {
        self.sets.iter().find(|s| {
            (s.ksym || !ksymbol)
                && (s.bpf || !bpf_event)
                && s.cpus.is_none()
                && self.same_life(s.window, window)
        })
    }

    /// Every pair of sets over the record kinds both asked for, the
    /// records emitted on the CPUs both listen on (perf_iterate_sb_cpu()
    /// writes to the emitting CPU's listeners only), when both were open
    /// for the same programs.
    fn sets(&self, msgs: &mut Vec<Found<'a>>) {
        for (x, sx) in self.sets.iter().enumerate() {
            for sy in self.sets.iter().skip(x + 1) {
                let (k, b) = (sx.ksym && sy.ksym, sx.bpf && sy.bpf);
                if !k && !b || !self.same_life(sx.window, sy.window) {
                    continue;
                }
                let bx = bag(
                    sx.recs.iter().copied().filter(|r| self.on(&sy.cpus, r)),
                    k,
                    b,
                );
                let by = bag(
                    sy.recs.iter().copied().filter(|r| self.on(&sx.cpus, r)),
                    k,
                    b,
                );
                let (only_x, only_y) = (surplus(&bx, &by), surplus(&by, &bx));
                if !only_x.is_empty() || !only_y.is_empty() {
                    msgs.push(quoting(
                        format!(
                            "{} and {} disagree: only in the first: [{}]; only in the second: [{}]",
                            sx.name,
                            sy.name,
                            shown(&only_x),
                            shown(&only_y)
                        ),
                        shown_records(&only_x, &only_y),
                    ));
                }
            }
        }
    }

    /// Inherited task listeners (one per CPU, following the agent's
    /// process and the threads it creates), together, against the first
    /// set that covers their kinds, restricted to that process.
    fn inherited(&self, msgs: &mut Vec<Found<'a>>) {
        let mut inherited: BTreeMap<(u64, bool, bool, u32), Vec<u32>> = BTreeMap::new();
        for l in self
            .listeners
            .values()
            .filter(|l| l.inherit && !l.disabled && !self.cut.contains(&l.index))
        {
            if let Some(pid) = l.pid {
                inherited
                    .entry((l.sample_type, l.ksymbol, l.bpf_event, pid))
                    .or_default()
                    .push(l.index);
            }
        }
        for ((_, ksymbol, bpf_event, pid), members) in inherited {
            let window = members
                .first()
                .map(|i| self.ev.window(*i))
                .unwrap_or_default();
            let Some(reference) = self.reference(ksymbol, bpf_event, window) else {
                continue;
            };
            let mine: Vec<&Record> = members.iter().flat_map(|i| self.recs_of(i)).collect();
            let foreign = mine
                .iter()
                .filter(|r| r.sample.pid.is_some_and(|p| p != pid))
                .count();
            let theirs = reference
                .recs
                .iter()
                .copied()
                .filter(|r| r.sample.pid.is_none_or(|p| p == pid));
            let bx = bag(mine.iter().copied(), ksymbol, bpf_event);
            let by = bag(theirs, ksymbol, bpf_event);
            let (only_x, only_y) = (surplus(&bx, &by), surplus(&by, &bx));
            if foreign > 0 || !only_x.is_empty() || !only_y.is_empty() {
                msgs.push(quoting(
                    format!(
                        "inherited task listeners {members:?} (pid {pid}) and {} (its records of pid {pid}) disagree: only in the task listeners: [{}]; only in the set: [{}]{}",
                        reference.name,
                        shown(&only_x),
                        shown(&only_y),
                        if foreign == 0 {
                            String::new()
                        } else {
                            format!("; {foreign} record(s) of other processes")
                        }
                    ),
                    shown_records(&only_x, &only_y),
                ));
            }
        }
    }

    /// A task-bound listener against the first set that covers its kinds,
    /// restricted to the task its records name.
    fn task_bound(&self, msgs: &mut Vec<Found<'a>>) {
        for l in self
            .listeners
            .values()
            .filter(|l| l.cpu < 0 && !l.inherit && !l.disabled && !self.cut.contains(&l.index))
        {
            // Its KSYMBOL / BPF_EVENT records (other side-band bits bring other
            // tasks' FORK, COMM, ... records). One task's, with or without a set
            // to compare them with: perf_iterate_sb() offers a record to the
            // current task's contexts only, and without inherit no thread gets
            // a copy of the event.
            let mine: Vec<&Record> = self
                .recs_of(&l.index)
                .filter(|r| {
                    matches!(
                        r.body,
                        RecordBody::Ksymbol { .. } | RecordBody::BpfEvent { .. }
                    )
                })
                .collect();
            let tids: BTreeSet<(Option<u32>, Option<u32>)> =
                mine.iter().map(|r| (r.sample.pid, r.sample.tid)).collect();
            if tids.len() > 1 {
                msgs.push(
                    format!(
                        "task-bound listener {} has records of {} tasks (pid, tid): {tids:?}",
                        l.index,
                        tids.len()
                    )
                    .into(),
                );
                continue;
            }
            let Some(reference) = self.reference(l.ksymbol, l.bpf_event, self.ev.window(l.index))
            else {
                continue;
            };
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
                msgs.push(quoting(
                    format!(
                        "task-bound listener {} and {}{} disagree: only in the task listener: [{}]; only in the set: [{}]",
                        l.index,
                        reference.name,
                        task.map(|t| format!(" (records of tid {t})")).unwrap_or_default(),
                        shown(&only_x),
                        shown(&only_y)
                    ),
                    shown_records(&only_x, &only_y),
                ));
            }
        }
    }
}

/// `listeners-agree`: see the module docs.
pub(super) fn check_agreement(
    ev: &RunEvidence,
    a: &Analysis,
    listeners: &BTreeMap<u32, &ListenerInfo>,
    cut: &BTreeSet<u32>,
    out: &mut Vec<Violation>,
) {
    let agreement = Agreement::new(ev, a, listeners, cut);
    let mut msgs: Vec<Found<'_>> = Vec::new();
    agreement.sets(&mut msgs);
    agreement.inherited(&mut msgs);
    agreement.task_bound(&mut msgs);
    push_capped(out, rule::LISTENERS_AGREE, "disagreements", msgs);
}

/// `lookups`; returns the report notes.
pub(super) fn check_lookups(
    ev: &RunEvidence,
    a: &Analysis,
    out: &mut Vec<Violation>,
) -> Vec<String> {
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
