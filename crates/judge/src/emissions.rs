//! One kernel write, all its copies: `perf_event_ksymbol()` and
//! `perf_event_bpf_event()` (kernel/events/core.c) build one record and
//! hand it to `perf_iterate_sb()`, which writes it to every matching
//! side-band event in turn: first the CPU's `pmu_sb` list, newest event
//! first, then the current task's contexts. Each output function calls
//! `perf_event_header__init_id()`, which adds that event's
//! `id_header_size` to the shared header. Where the kernel does not
//! restore `header.size` (ksymbol-bpf-event-header-size-accumulates), the
//! n-th copy written is too long by the trailers of the n−1 written before
//! it — whether or not those events had a ring to receive them.
//!
//! [`annotate`] gathers, for each KSYMBOL / BPF_EVENT the kernel wrote, the
//! copies kloop's listeners received and the copy perf's file holds, and
//! says of each oversized copy whether that accumulation accounts for its
//! excess byte for byte ([`Accumulation::explained`]). A ledger signature
//! that names this shape excuses only copies it explains: a size fault of
//! any other shape stays a failure.

use std::collections::BTreeMap;

use kloop_protocol::ListenerInfo;
use kloop_records::{Record, RecordContent, PERF_RECORD_BPF_EVENT, PERF_RECORD_KSYMBOL};

use crate::check::detail::{Accumulation, OversizedRecord};
use crate::check::{Analysis, Detail, Violation};
use crate::evidence::RunEvidence;

/// One copy of a kernel write, as one reader received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Copy {
    /// `L<n>` or `perf`.
    reader: String,
    /// Where it sits in the reader's stream (`perf`: its file offset).
    offset: u64,
    /// The CPU it was written on, when known (the listener's CPU, or the
    /// trailer's).
    cpu: Option<i64>,
    /// Its trailer's time, when sampled.
    time: Option<u64>,
    trailer_len: u32,
    excess: u32,
}

/// How far apart in time two copies of one write may lie. The kernel
/// writes them in one `perf_iterate_sb()` pass under `preempt_disable()`
/// (kernel/events/core.c), each reading the clock in
/// `perf_event_header__init_id()`: microseconds apart, a little more
/// under TCG or with an interrupt in between. Two writes of the same record
/// content on one CPU are a program's load and a later one's, far apart.
const ONE_PASS_NS: u64 = 20_000_000;

/// One write's copies, with the content they carry.
struct Write {
    content: RecordContent,
    copies: Vec<Copy>,
}

/// Sorts copies into writes: the same content, on the same CPU (or one a
/// task-bound reader without a CPU in its trailer cannot name), and either
/// within [`ONE_PASS_NS`] of the write's first copy or — without times —
/// the same occurrence of that content in each reader's stream; never two
/// copies of one reader in one write.
fn writes_of(mut copies: Vec<(RecordContent, Copy)>) -> Vec<Write> {
    copies.sort_by_key(|(_, c)| (c.time.is_none(), c.time, c.cpu.is_none()));
    let mut writes: Vec<Write> = Vec::new();
    let mut occurrence: BTreeMap<(String, RecordContent, Option<i64>), usize> = BTreeMap::new();
    let mut first_time: Vec<Option<u64>> = Vec::new();
    let mut nth: Vec<usize> = Vec::new();
    for (content, copy) in copies {
        let n = {
            let e = occurrence
                .entry((copy.reader.clone(), content.clone(), copy.cpu))
                .or_default();
            *e += 1;
            *e - 1
        };
        let fits = |w: &Write, t0: Option<u64>, wn: usize| {
            w.content == content
                && !w.copies.iter().any(|c| c.reader == copy.reader)
                && match (copy.cpu, w.copies.iter().find_map(|c| c.cpu)) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
                && match (copy.time, t0) {
                    (Some(t), Some(t0)) => t.abs_diff(t0) <= ONE_PASS_NS,
                    _ => wn == n,
                }
        };
        match (0..writes.len()).find(|&i| fits(&writes[i], first_time[i], nth[i])) {
            Some(i) => writes[i].copies.push(copy),
            None => {
                first_time.push(copy.time);
                nth.push(n);
                writes.push(Write {
                    content: content.clone(),
                    copies: vec![copy],
                });
            }
        }
    }
    writes
}

/// Fills in [`OversizedRecord::accumulation`] of every oversized-record
/// violation in `violations` (kloop's `parse` ones, perf's `second-reader`
/// ones), and adds to its message what the other copies show.
pub fn annotate(ev: &RunEvidence, analysis: &Analysis, violations: &mut [Violation]) {
    let excess_at = |reader: &str, offset: u64| {
        violations.iter().find_map(|v| match &v.detail {
            Some(Detail::OversizedRecord(o)) if o.reader == reader && v.offset == Some(offset) => {
                Some(o.excess)
            }
            _ => None,
        })
    };
    let mut copies: Vec<(RecordContent, Copy)> = Vec::new();
    for l in &ev.listeners {
        let Some(recs) = analysis.records_per_listener.get(&l.index) else {
            continue;
        };
        let reader = format!("L{}", l.index);
        for r in recs.iter().filter(|r| is_side_band(r)) {
            let Some(content) = RecordContent::of_record(r) else {
                continue;
            };
            let cpu = (l.cpu >= 0)
                .then_some(i64::from(l.cpu))
                .or(r.sample.cpu.map(i64::from));
            copies.push((
                content,
                Copy {
                    offset: r.offset,
                    cpu,
                    time: r.sample.time,
                    trailer_len: kloop_records::sample_id_len(l) as u32,
                    excess: excess_at(&reader, r.offset).unwrap_or(0),
                    reader: reader.clone(),
                },
            ));
        }
    }
    for (content, copy) in perf_copies(ev) {
        let excess = excess_at("perf", copy.offset).unwrap_or(0);
        copies.push((content, Copy { excess, ..copy }));
    }
    let writes = writes_of(copies);

    for v in violations.iter_mut() {
        let offset = v.offset;
        let Some(Detail::OversizedRecord(o)) = &mut v.detail else {
            continue;
        };
        let Some(w) = writes.iter().find(|w| {
            w.copies
                .iter()
                .any(|c| c.reader == o.reader && Some(c.offset) == offset)
        }) else {
            continue;
        };
        let (content, copies) = (&w.content, &w.copies);
        let ksymbol = matches!(content, RecordContent::Ksymbol { .. });
        let acc = accumulation(o, copies, ev, ksymbol);
        v.message.push_str(&describe(&acc));
        o.accumulation = Some(acc);
    }
}

fn is_side_band(r: &Record) -> bool {
    matches!(r.header.type_, PERF_RECORD_KSYMBOL | PERF_RECORD_BPF_EVENT)
}

/// The copies perf's file holds of records the kernel wrote while perf
/// recorded (the ones perf synthesised at start carry a zeroed trailer and
/// are no copies of a kernel write).
fn perf_copies(ev: &RunEvidence) -> Vec<(RecordContent, Copy)> {
    let Some(script) = ev.perf_scripts.first() else {
        return Vec::new();
    };
    let Ok(dump) = crate::perf_script::parse(&script.text) else {
        return Vec::new();
    };
    let listener = dump.listener();
    let trailer_len = kloop_records::sample_id_len(&listener) as u32;
    let mut out = Vec::new();
    for e in &dump.events {
        if !matches!(e.type_, PERF_RECORD_KSYMBOL | PERF_RECORD_BPF_EVENT) {
            continue;
        }
        let read = kloop_records::parse_reading_on(&listener, &e.raw);
        let [r] = read.records.as_slice() else {
            continue;
        };
        if r.sample.time == Some(0) || (r.sample.time.is_none() && r.sample.pid == Some(0)) {
            continue; // synthesised by perf
        }
        let Some(content) = RecordContent::of_record(r) else {
            continue;
        };
        out.push((
            content,
            Copy {
                reader: "perf".into(),
                offset: e.offset,
                cpu: r.sample.cpu.map(i64::from),
                time: r.sample.time,
                trailer_len,
                excess: 0,
            },
        ));
    }
    out
}

/// How `copies` (one write's) account for `o`'s excess.
fn accumulation(
    o: &OversizedRecord,
    copies: &[Copy],
    ev: &RunEvidence,
    ksymbol: bool,
) -> Accumulation {
    let mut sorted: Vec<&Copy> = copies.iter().collect();
    sorted.sort_by_key(|c| c.excess);
    let pos = sorted
        .iter()
        .position(|c| c.reader == o.reader && c.excess == o.excess)
        .unwrap_or(0);
    let before = sorted[..pos]
        .iter()
        .map(|c| (c.reader.clone(), c.trailer_len))
        .collect();
    // Events on the write's CPU (or bound to a task) that asked for this
    // kind and show no copy: unmapped rings, or readers kloop did not get.
    let cpu = copies.iter().find_map(|c| c.cpu);
    let has_copy = |l: &ListenerInfo| copies.iter().any(|c| c.reader == format!("L{}", l.index));
    let mut unseen: Vec<u32> = ev
        .listeners
        .iter()
        .filter(|l| !l.disabled && if ksymbol { l.ksymbol } else { l.bpf_event })
        .filter(|l| l.cpu < 0 || cpu.is_none_or(|c| c == i64::from(l.cpu)))
        .filter(|l| !has_copy(l))
        .map(|l| kloop_records::sample_id_len(l) as u32)
        .filter(|t| *t > 0)
        .collect();
    // Events opened without a ring are never announced as listeners, but
    // the kernel matches them (and grows the header) all the same: one per
    // CPU of a CPU-wide spec that covers the write's CPU, one for a task's.
    for step in ev.steps.values() {
        let kloop_protocol::Step::OpenListeners { listener: spec } = step else {
            continue;
        };
        let asked = if ksymbol {
            spec.ksymbol
        } else {
            spec.bpf_event
        };
        let on_cpu = match (&spec.cpus, cpu) {
            (Some(cpus), Some(c)) => cpus.iter().any(|x| i64::from(*x) == c),
            _ => true,
        };
        if spec.ring_pages != 0 || spec.disabled || !asked || !on_cpu {
            continue;
        }
        let info = ListenerInfo {
            sample_type: spec.sample_type,
            sample_id_all: spec.sample_id_all,
            ..ListenerInfo::default()
        };
        let t = kloop_records::sample_id_len(&info) as u32;
        if t > 0 {
            unseen.push(t);
        }
    }
    Accumulation {
        before,
        explained: chain_explained(&sorted, &unseen),
        unseen,
    }
}

/// Copies ordered by excess: the k-th must be too long by exactly the
/// trailers of the k−1 before it plus a sum of unseen events' trailers,
/// that part never shrinking along the chain and each unseen event counted
/// once.
fn chain_explained(sorted: &[&Copy], unseen: &[u32]) -> bool {
    let mut before: i64 = 0;
    let mut gaps = Vec::new();
    let mut last_unseen: i64 = 0;
    for c in sorted {
        let rest = i64::from(c.excess) - before;
        if rest < last_unseen {
            return false;
        }
        gaps.push(rest - last_unseen);
        last_unseen = rest;
        before += i64::from(c.trailer_len);
    }
    let mut pool: Vec<u32> = unseen.to_vec();
    gaps.iter().all(|g| take_sum(&mut pool, *g))
}

/// Removes from `pool` some elements summing to `want` (any, if several
/// ways exist); false when none do.
fn take_sum(pool: &mut Vec<u32>, want: i64) -> bool {
    if want == 0 {
        return true;
    }
    let n = pool.len().min(20);
    for mask in 1u32..(1 << n) {
        let sum: i64 = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| i64::from(pool[i]))
            .sum();
        if sum == want {
            let mut i = n;
            while i > 0 {
                i -= 1;
                if mask & (1 << i) != 0 {
                    pool.remove(i);
                }
            }
            return true;
        }
    }
    false
}

fn describe(a: &Accumulation) -> String {
    let before: Vec<String> = a
        .before
        .iter()
        .map(|(r, t)| format!("{r} ({t}-byte trailer)"))
        .collect();
    format!(
        "; copies of the same write with less excess: {}{}; {}",
        if before.is_empty() {
            "none".to_string()
        } else {
            before.join(", ")
        },
        if a.unseen.is_empty() {
            String::new()
        } else {
            format!("; events with no copy to show, trailers {:?}", a.unseen)
        },
        if a.explained {
            "the excess is their trailers, accumulated (perf_event_header__init_id() on one shared header)"
        } else {
            "the excess is not the trailers of the copies written before it"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(reader: &str, trailer_len: u32, excess: u32) -> Copy {
        Copy {
            reader: reader.into(),
            offset: 0,
            cpu: Some(1),
            time: None,
            trailer_len,
            excess,
        }
    }

    fn explained(copies: &[Copy], unseen: &[u32]) -> bool {
        let mut s: Vec<&Copy> = copies.iter().collect();
        s.sort_by_key(|c| c.excess);
        chain_explained(&s, unseen)
    }

    #[test]
    fn accumulated_trailers_explain_the_excess_and_nothing_else_does() {
        // 6.1's many-listeners KSYMBOL on the loading CPU (the ledger's
        // evidence): the ksymbol-only set first (24-byte trailer), then the
        // 40-byte one, the first set (24), the task-bound listener (16).
        let ok = [
            c("L5", 24, 0),
            c("L3", 40, 24),
            c("L1", 24, 64),
            c("L8", 16, 88),
        ];
        assert!(explained(&ok, &[]));
        // Another 8 bytes on one copy: no longer the trailers before it.
        let plus8 = [
            c("L5", 24, 0),
            c("L3", 40, 32),
            c("L1", 24, 72),
            c("L8", 16, 96),
        ];
        assert!(!explained(&plus8, &[]));
        // The first copy written grown too: nothing was written before it.
        assert!(!explained(&[c("L5", 24, 24), c("L3", 40, 48)], &[]));
        // ... unless an event without a ring was written before it.
        assert!(explained(&[c("L5", 24, 24), c("L3", 40, 48)], &[24]));
        // Each unseen event counts once per write.
        assert!(!explained(&[c("L1", 24, 48)], &[24]));
        assert!(explained(&[c("L1", 24, 48)], &[24, 24]));
        // Two copies with the same excess: one cannot precede the other.
        assert!(!explained(&[c("L1", 24, 24), c("L2", 24, 24)], &[24]));
        // perf's copy in the chain: perf started second (its copy first,
        // exact), kloop's 24 too long.
        assert!(explained(&[c("perf", 24, 0), c("L0", 24, 24)], &[]));
        // A late listener after perf: L1 exact, perf +24, L0 +48.
        assert!(explained(
            &[c("L1", 24, 0), c("perf", 24, 24), c("L0", 24, 48)],
            &[]
        ));
    }

    #[test]
    fn copies_group_into_writes_by_content_cpu_and_time() {
        let k = |addr| RecordContent::Ksymbol {
            addr,
            len: 8,
            ksym_type: 1,
            flags: 0,
            name: "bpf_prog_x".into(),
        };
        let at = |reader: &str, cpu: Option<i64>, time: u64, excess: u32| Copy {
            reader: reader.into(),
            offset: time,
            cpu,
            time: Some(time),
            trailer_len: 24,
            excess,
        };
        // The same record content written on CPU 0 and, later, on CPU 1
        // (a program loaded twice at one reused address): CPU-wide L0/L1,
        // per-CPU inherited L2/L3, and a task listener L8 with no CPU.
        let copies = vec![
            (k(1), at("L0", Some(0), 1_000, 0)),
            (k(1), at("L2", Some(0), 1_010, 24)),
            (k(1), at("L8", None, 1_020, 40)),
            (k(1), at("L1", Some(1), 900_000_000, 0)),
            (k(1), at("L3", Some(1), 900_000_010, 24)),
            (k(2), at("L0", Some(0), 1_005, 0)),
        ];
        let w = writes_of(copies);
        let readers: Vec<Vec<&str>> = w
            .iter()
            .map(|w| w.copies.iter().map(|c| c.reader.as_str()).collect())
            .collect();
        assert_eq!(
            readers,
            [vec!["L0", "L2", "L8"], vec!["L0"], vec!["L1", "L3"]]
        );
        // Without times, the n-th occurrence in each reader's stream.
        let untimed = |reader: &str, cpu, n: u64| Copy {
            time: None,
            ..at(reader, cpu, n, 0)
        };
        let w = writes_of(vec![
            (k(1), untimed("L0", Some(0), 0)),
            (k(1), untimed("L0", Some(0), 1)),
            (k(1), untimed("L2", Some(0), 0)),
            (k(1), untimed("L2", Some(0), 1)),
        ]);
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|w| w.copies.len() == 2));
    }
}
