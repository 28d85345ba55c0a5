//! `wakeups`: a polled listener's waiter is woken for every record.
//!
//! A listener opened with `watermark` and a `wakeup_watermark` of 1 byte
//! (`ListenerSpec::poll`) has a ring watermark of 1 (`ring_buffer_init()`,
//! kernel/events/ring_buffer.c): `__perf_output_begin()` moves `rb->wakeup`
//! on as soon as the head passed it, so `perf_output_put_handle()` calls
//! `perf_output_wakeup()` for every record it commits. That sets
//! `rb->poll` and queues the event's irq_work, whose handler wakes the
//! event's wait queue (`perf_event_wakeup()`); `perf_poll()` then returns
//! EPOLLIN once. So after each record's time, the waiter (in `poll(2)`
//! from the listener's open to the plan's end) returns readable within a
//! scheduling delay. A wake-up the kernel forgets still ends a wait at the
//! waiter's timeout (1.5 s: `do_poll()` looks once more when it expires),
//! so the rule's deadline is below that: 1 s, generous for a TCG guest,
//! where the agent's other threads share two vCPUs.
//!
//! The records' times are CLOCK_MONOTONIC (`use_clockid`), as are the
//! waiter's; the kernel reads its clock for the trailer before it commits
//! the record, so a wake-up is never before the record it follows.

use std::collections::BTreeMap;

use kloop_protocol::ListenerInfo;
use kloop_records::Record;

use super::{rule, Violation};

/// How long after a record its wake-up may come.
pub const DEADLINE_NS: u64 = 1_000_000_000;

/// The violations of one polled listener's `records` against the times its
/// waiter woke (`woke`, sorted or not).
pub fn check_listener(listener: u32, records: &[Record], woke: &[u64]) -> Vec<Violation> {
    let mut woke = woke.to_vec();
    woke.sort_unstable();
    let mut out = Vec::new();
    for r in records {
        let Some(t) = r.time() else {
            continue;
        };
        let next = woke.iter().find(|w| **w >= t);
        let late = match next {
            None => Some(format!(
                "{r}: its waiter, in poll(2) until the plan's end, never woke after it \
                 ({} wake-up(s), the last at {:?})",
                woke.len(),
                woke.last()
            )),
            Some(w) if w - t > DEADLINE_NS => Some(format!(
                "{r}: its waiter woke only {} ms after it (at {w}): past the {} ms a \
                 wake-up may take, near the waiter's 1.5 s poll timeout, which ends a wait \
                 the kernel forgot to wake",
                (w - t) / 1_000_000,
                DEADLINE_NS / 1_000_000
            )),
            Some(_) => None,
        };
        if let Some(m) = late {
            out.push(
                Violation::new(
                    rule::WAKEUPS,
                    format!(
                        "listener {listener} (watermark 1 byte: every record wakes its poller, \
                         perf_output_put_handle() -> perf_output_wakeup()): {m}"
                    ),
                )
                .quoting([r]),
            );
        }
    }
    out
}

/// The records after which the kernel decided to wake a listener polled
/// with a ring watermark of `watermark` bytes, read from
/// kernel/events/ring_buffer.c: `__perf_output_begin()` reserves a
/// record (the head moves on by its size) and then, `if (head -
/// local_read(&rb->wakeup) > rb->watermark)`, moves `rb->wakeup` on by one
/// watermark; `perf_output_put_handle()` calls `perf_output_wakeup()` for
/// that record because `handle->wakeup` no longer equals `rb->wakeup`.
/// Both start at 0 in a new ring. Every byte of the ring is a record's,
/// so the records' sizes, in stream order, replay the head. With a 1-byte
/// watermark every record decides.
pub fn decisions(watermark: u64, records: &[Record]) -> Vec<&Record> {
    let (mut head, mut wakeup) = (0u64, 0u64);
    let mut out = Vec::new();
    for r in records {
        head += u64::from(r.header.size);
        if head - wakeup > watermark {
            wakeup += watermark;
            out.push(r);
        }
    }
    out
}

/// A listener polled with a wakeup watermark of `watermark` bytes (more
/// than 1) in a ring of `ring_bytes`: the kernel takes
/// `min(watermark, ring_bytes)` as the ring's watermark
/// (`ring_buffer_init()`), and wakes the poller after exactly the records
/// [`decisions`] finds. Both ways are held:
/// - at most one wake-up per decision, plus one for the listener's close:
///   a waiter woken more often was woken before the watermark was passed;
/// - after each decision, a wake-up within [`DEADLINE_NS`]: several
///   decisions may share one wake-up (`rb->poll` is a flag the waiter's
///   `perf_poll()` consumes once), but none may go without one.
pub fn check_watermark(
    listener: u32,
    watermark: u64,
    ring_bytes: u64,
    records: &[Record],
    woke: &[u64],
) -> Vec<Violation> {
    let watermark = watermark.min(ring_bytes.max(1));
    let bytes: u64 = records.iter().map(|r| u64::from(r.header.size)).sum();
    let owed = decisions(watermark, records);
    let allowed = owed.len() as u64 + 1;
    let mut out = Vec::new();
    if woke.len() as u64 > allowed {
        out.push(Violation::new(
            rule::WAKEUPS,
            format!(
                "listener {listener} (wakeup watermark {watermark} bytes): its poller woke {} \
                 times for {bytes} bytes of records, more than the {allowed} the watermark allows \
                 ({} wake-up decision(s) + 1 for the close): __perf_output_begin() moves \
                 rb->wakeup on, and perf_output_put_handle() wakes the poller, only when the head \
                 passed the last wake-up point by more than the watermark",
                woke.len(),
                owed.len()
            ),
        ));
    }
    let owned: Vec<Record> = owed.into_iter().cloned().collect();
    out.extend(
        check_listener(listener, &owned, woke)
            .into_iter()
            .map(|mut v| {
                v.message = v.message.replacen(
                    "(watermark 1 byte: every record wakes its poller, \
                     perf_output_put_handle() -> perf_output_wakeup())",
                    &format!(
                        "(wakeup watermark {watermark} bytes: this record passed the ring's \
                         wake-up point, so perf_output_put_handle() -> perf_output_wakeup())"
                    ),
                    1,
                );
                v
            }),
    );
    out
}

/// Every polled listener's violations (`listeners` gives each one's
/// watermark).
pub fn check(
    listeners: &[ListenerInfo],
    records: &BTreeMap<u32, Vec<Record>>,
    wakeups: &BTreeMap<u32, Vec<u64>>,
) -> Vec<Violation> {
    wakeups
        .iter()
        .flat_map(|(l, woke)| {
            let recs = records.get(l).map(Vec::as_slice).unwrap_or(&[]);
            match listeners.iter().find(|i| i.index == *l) {
                Some(i) if i.poll_watermark > 1 => {
                    check_watermark(*l, u64::from(i.poll_watermark), i.ring_bytes, recs, woke)
                }
                _ => check_listener(*l, recs, woke),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};
    use kloop_records::{parse_stream, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

    fn records(times: &[u64]) -> Vec<Record> {
        let l = testutil::listener(0, 0, PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU);
        let mut b = Vec::new();
        for t in times {
            b.extend(testutil::bpf_event(
                &l,
                1,
                7,
                [1; 8],
                Tr {
                    time: *t,
                    ..Tr::default()
                },
            ));
        }
        parse_stream(&l, &b).unwrap()
    }

    #[test]
    fn a_watermark_bounds_the_wakeups_by_the_bytes_written() {
        let ms = 1_000_000;
        let recs = records(&(1..=40).map(|i| i * ms).collect::<Vec<_>>());
        let bytes: u64 = recs.iter().map(|r| u64::from(r.header.size)).sum();
        let owed = decisions(512, &recs);
        // The sizes replay the head: one decision per 512 bytes passed.
        assert_eq!(owed.len() as u64, (bytes - 1) / 512);
        // A wake-up right after each decision.
        let woke: Vec<u64> = owed.iter().map(|r| r.time().unwrap() + 1).collect();
        assert!(check_watermark(0, 512, 65536, &recs, &woke).is_empty());
        // One wake-up may serve decisions that came close together.
        let last = *woke.last().unwrap();
        let merged: Vec<u64> = woke
            .iter()
            .copied()
            .skip(1)
            .step_by(2)
            .chain([last])
            .collect();
        assert!(check_watermark(0, 512, 65536, &recs, &merged).is_empty());
        // No wake-up at all, where the bytes owe some: a lower bound.
        let v = check_watermark(0, 512, 65536, &recs, &[]);
        assert!(!v.is_empty());
        assert!(
            v.iter().all(|v| v.message.contains("never woke after it")
                && v.message.contains("wakeup watermark 512 bytes")),
            "{v:?}"
        );
        // One wake-up per record: woken before the watermark was passed.
        let every: Vec<u64> = (1..=40).map(|i| i * ms).collect();
        let v = check_watermark(0, 512, 65536, &recs, &every);
        assert_eq!(v.len(), 1);
        assert!(v[0].message.contains("woke 40 times"), "{}", v[0].message);
        // The kernel caps the watermark at the ring's size: a 1 MiB
        // watermark on a 64-byte ring is a 64-byte one.
        let capped = check_watermark(0, 1 << 20, 64, &recs, &every);
        assert_eq!(capped.len(), usize::from(40 > bytes / 64 + 1));
        assert!(capped
            .iter()
            .all(|v| v.message.contains("watermark 64 bytes")));
    }

    #[test]
    fn every_record_is_followed_by_a_wakeup_within_the_deadline() {
        let ms = 1_000_000;
        let recs = records(&[100 * ms, 101 * ms, 900 * ms]);
        // One wake-up may serve records written before the waiter ran.
        assert!(check_listener(0, &recs, &[102 * ms, 905 * ms]).is_empty());
        // The last record never woke it.
        let v = check_listener(0, &recs, &[102 * ms]);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].message.contains("never woke after it"),
            "{}",
            v[0].message
        );
        // Woken only at the poll timeout: a lost wake-up.
        let v = check_listener(0, &recs, &[102 * ms, 2_400 * ms]);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].message.contains("woke only 1500 ms after it"),
            "{}",
            v[0].message
        );
        // Unpolled listeners are not held to it.
        let none = BTreeMap::from([(0u32, recs)]);
        assert!(check(&[], &none, &BTreeMap::new()).is_empty());
    }
}
