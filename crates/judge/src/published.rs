//! Rule `published-bytes`: every byte below `data_head` is written when a
//! reader sees `data_head`.
//!
//! What the kernel promises. include/uapi/linux/perf_event.h, on
//! `data_head`: user space reads it, issues `smp_rmb()`, and may then read
//! the data up to it. kernel/events/ring_buffer.c,
//! `perf_output_put_handle()`: the kernel writes the record, then
//! `smp_wmb()` ("B" in its comment, paired with the reader's "C"), then
//! stores `data_head`; every emitter goes `perf_output_begin()` → write the
//! whole record, its sample_id trailer (`perf_event__output_id_sample()`)
//! included → `perf_output_end()`, which is what publishes it. So a record
//! a reader finds below the head it read is whole.
//!
//! The evidence ([`kloop_protocol::SpinReading`], from a `spin-read` step):
//! a reader on another CPU than the listener's spun on `data_head`,
//! checked every record as soon as the head covered it, and found the
//! sample_id trailer words that did not hold what the kernel writes there
//! (`id` / `identifier` not the event's id, `cpu` not the listener's, a
//! `time` still what the ring held before: zeros in a fresh ring, whose
//! pages the kernel allocates zeroed). Such a word is one the kernel
//! published before writing it: a torn record
//! (`perf_event__output_id_sample()` moved past `perf_output_end()` tears
//! the trailer). A reader that lost records, or stopped walking the
//! stream, checked less than the run made, which is said, not passed over.

use kloop_protocol::{SpinReading, TornWord};

use crate::check::Violation;
use crate::evidence::RunEvidence;

/// A record below `data_head` already holds its whole sample_id trailer, as a reader spinning on the head from another CPU sees it.
pub const PUBLISHED_BYTES: &str = "published-bytes";

/// The rules this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[PUBLISHED_BYTES];

/// What the kernel promises, for the messages.
const PROMISE: &str = "perf_output_put_handle() (kernel/events/ring_buffer.c) stores data_head \
    only after the record is written and smp_wmb(), and include/uapi/linux/perf_event.h lets a \
    reader that read data_head and issued smp_rmb() read every byte below it; \
    perf_event__output_id_sample() must come before perf_output_end()";

/// Every violation of every `spin-read` step's reading.
pub fn check(ev: &RunEvidence) -> Vec<Violation> {
    ev.spin_reads.iter().flat_map(check_reading).collect()
}

/// The violations of one reading: each torn record (the first few spelled
/// out), records lost, a stream the reader could not walk to the end.
pub fn check_reading(r: &SpinReading) -> Vec<Violation> {
    let mut out: Vec<Violation> = r
        .torn
        .iter()
        .map(|t| {
            Violation::new(
                PUBLISHED_BYTES,
                format!(
                    "listener on CPU {} read from CPU {}: {} at stream offset {} ({} bytes) was \
                     below data_head {} when the reader looked, but its {} did not hold what \
                     the kernel writes there yet (the ring's old bytes): the kernel published \
                     the record before writing {} ({}); {PROMISE}",
                    r.listener_cpu,
                    r.reader_cpu,
                    type_name(t.record_type),
                    t.offset,
                    t.size,
                    t.head,
                    words(&t.words),
                    if t.words.len() == 1 { "it" } else { "them" },
                    if t.written_later {
                        "written a moment later"
                    } else {
                        "still not written 200 ms later"
                    },
                ),
            )
        })
        .collect();
    let spelled = r.torn.len() as u64;
    if r.torn_total > spelled {
        out.push(Violation::new(
            PUBLISHED_BYTES,
            format!(
                "... and {} more torn records of {} checked",
                r.torn_total - spelled,
                r.records
            ),
        ));
    }
    if r.lost > 0 {
        out.push(Violation::new(
            PUBLISHED_BYTES,
            format!(
                "the spin reader lost {} record(s) (LOST records in its ring): it fell a whole \
                 ring behind the kernel, so those records were never checked; give the \
                 listener more ring_pages",
                r.lost
            ),
        ));
    }
    if let Some(why) = &r.stopped {
        out.push(Violation::new(
            PUBLISHED_BYTES,
            format!(
                "the spin reader stopped checking after {} record(s): {why}",
                r.records
            ),
        ));
    }
    out
}

/// A spin reader that saw no record checked nothing: each load/unload
/// cycle of its plan writes KSYMBOL and BPF_EVENT records to the ring it
/// watches, so none seen is evidence lost, never a pass.
pub fn unchecked(ev: &RunEvidence) -> Vec<crate::check::Unchecked> {
    ev.spin_reads
        .iter()
        .filter(|r| r.records == 0)
        .map(|r| {
            crate::check::Unchecked::new(
                PUBLISHED_BYTES,
                crate::check::Gap::Lost,
                format!(
                    "the spin reader on CPU {} saw no record on CPU {}'s listener in {} \
                     load/unload cycle(s), each of which writes records there",
                    r.reader_cpu, r.listener_cpu, r.cycles
                ),
            )
        })
        .collect()
}

/// What the rule checked, for the trial's notes.
pub fn notes(ev: &RunEvidence) -> Vec<String> {
    ev.spin_reads
        .iter()
        .filter(|r| r.records > 0)
        .map(|r| {
            format!(
                "{PUBLISHED_BYTES}: {} records ({} bytes) checked at {} head advances over \
                 {} load/unload cycles of a {}-function program, {} torn",
                r.records, r.bytes, r.head_advances, r.cycles, r.functions, r.torn_total
            )
        })
        .collect()
}

fn type_name(t: u32) -> String {
    match t {
        2 => "LOST".into(),
        17 => "KSYMBOL".into(),
        18 => "BPF_EVENT".into(),
        t => format!("record type {t}"),
    }
}

fn words(w: &[TornWord]) -> String {
    let names: Vec<String> = w
        .iter()
        .map(|w| match w {
            TornWord::Header => "header".to_string(),
            TornWord::Time => "trailer time".to_string(),
            TornWord::Id => "trailer id".to_string(),
            TornWord::StreamId => "trailer stream_id".to_string(),
            TornWord::Cpu => "trailer cpu".to_string(),
            TornWord::Identifier => "trailer identifier".to_string(),
        })
        .collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_protocol::TornRecord;

    fn clean() -> SpinReading {
        SpinReading {
            listener_cpu: 0,
            reader_cpu: 1,
            cycles: 300,
            functions: 3,
            head_advances: 2000,
            records: 2400,
            bytes: 240_000,
            ..SpinReading::default()
        }
    }

    #[test]
    fn a_reading_without_torn_records_passes_and_says_what_it_checked() {
        let ev = RunEvidence {
            spin_reads: vec![clean()],
            ..Default::default()
        };
        assert!(check(&ev).is_empty());
        let n = notes(&ev);
        assert_eq!(n.len(), 1);
        assert!(n[0].contains("2400 records"), "{}", n[0]);
        assert!(n[0].contains("0 torn"), "{}", n[0]);
    }

    /// The 6.12 mutant perf_event_ksymbol_output:9415:swap-calls: the
    /// trailer written after perf_output_end() published the record.
    #[test]
    fn a_trailer_written_after_data_head_is_a_violation() {
        let mut r = clean();
        r.torn = vec![TornRecord {
            offset: 4096,
            head: 4200,
            record_type: 17,
            size: 104,
            words: vec![TornWord::Cpu, TornWord::Identifier],
            written_later: true,
        }];
        r.torn_total = 1;
        let ev = RunEvidence {
            spin_reads: vec![r.clone()],
            ..Default::default()
        };
        let v = check(&ev);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, PUBLISHED_BYTES);
        assert!(
            v[0].message.contains(
                "KSYMBOL at stream offset 4096 (104 bytes) was below data_head 4200 when the \
                 reader looked, but its trailer cpu, trailer identifier did not hold what the \
                 kernel writes there yet (the ring's old bytes): the kernel published the \
                 record before writing them (written a moment later)"
            ),
            "{}",
            v[0].message
        );
        assert!(v[0].message.contains("ring_buffer.c"), "{}", v[0].message);
    }

    #[test]
    fn torn_records_past_the_cap_are_counted() {
        let mut r = clean();
        r.torn = vec![
            TornRecord {
                offset: 0,
                head: 96,
                record_type: 18,
                size: 96,
                words: vec![TornWord::Identifier],
                written_later: false,
            };
            2
        ];
        r.torn_total = 7;
        let v = check_reading(&r);
        assert_eq!(v.len(), 3);
        assert!(v[0].message.contains("still not written 200 ms later"));
        assert!(
            v[2].message.contains("5 more torn records of 2400 checked"),
            "{}",
            v[2].message
        );
    }

    #[test]
    fn lost_records_and_a_stopped_reader_are_reported_not_hidden() {
        let mut r = clean();
        r.lost = 12;
        r.stopped = Some("data_head 9000 is 9000 bytes past data_tail 0".into());
        let v = check_reading(&r);
        assert_eq!(v.len(), 2);
        assert!(
            v[0].message.contains("lost 12 record(s)"),
            "{}",
            v[0].message
        );
        assert!(
            v[1].message.contains("stopped checking after 2400"),
            "{}",
            v[1].message
        );
    }

    #[test]
    fn a_reader_that_saw_nothing_is_unchecked_never_quiet() {
        let mut r = clean();
        r.records = 0;
        r.head_advances = 0;
        let ev = RunEvidence {
            spin_reads: vec![r],
            ..Default::default()
        };
        assert!(check(&ev).is_empty());
        assert!(notes(&ev).is_empty());
        let u = unchecked(&ev);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].rule, PUBLISHED_BYTES);
        assert_eq!(u[0].gap, crate::check::Gap::Lost);
        assert!(u[0].reason.contains("saw no record"), "{u:?}");
        // A reader that saw records checked them.
        let seen = RunEvidence {
            spin_reads: vec![clean()],
            ..Default::default()
        };
        assert!(unchecked(&seen).is_empty());
        assert_eq!(notes(&seen).len(), 1);
        // A run without a spin-read step says nothing at all.
        assert!(notes(&RunEvidence::default()).is_empty());
        assert!(unchecked(&RunEvidence::default()).is_empty());
    }
}
