//! perf's own file read by a second reader: `check-perf-data`'s reading of
//! the `perf.data` perf wrote in the guest (linux-perf-data and kloop's
//! strict parser) held to perf's dump of the same file (`perf report -D`).
//! Two independent readers of the same bytes must see the same KSYMBOL and
//! BPF_EVENT records, and the file reader's rules (layout, BPF symbol
//! shape, register/unregister pairing) must hold on a file whose records
//! perf's own parse and kloop's second-reader rule accept.

use std::collections::BTreeMap;

use crate::check::Violation;

use super::dump::PerfDump;
use super::MAX_PER_KIND;

/// perf's own `perf.data` arrives whole and its KSYMBOL and BPF_EVENT records read strictly.
pub const FILE_RULE: &str = "perf-data";

/// What the file reader made of perf's file.
#[derive(Debug, Clone, Default)]
pub struct FileReading {
    /// Each KSYMBOL / BPF_EVENT record's bytes, in the order read.
    pub side_band: Vec<Vec<u8>>,
    /// Its findings no ledger entry explains, as `[rule] message`.
    pub news: Vec<String>,
    /// Why it stopped before the file's end, if it did.
    pub stopped: Option<String>,
}

/// The violations of [`FILE_RULE`]: the reader's news, a read that
/// stopped early, and every record one reader has and the other has not
/// (compared as multisets: both order by time, and perf's synthesised
/// records all carry time 0, which either may order differently).
pub fn agree(dump: &PerfDump, file: &FileReading) -> Vec<Violation> {
    let mut out = Vec::new();
    if let Some(why) = &file.stopped {
        out.push(Violation::new(
            FILE_RULE,
            format!("check-perf-data stopped reading perf's file: {why}"),
        ));
    }
    for n in file.news.iter().take(MAX_PER_KIND) {
        out.push(Violation::new(
            FILE_RULE,
            format!("check-perf-data on perf's file: {n}"),
        ));
    }
    let side_band = |t: u32| {
        t == kloop_records::PERF_RECORD_KSYMBOL || t == kloop_records::PERF_RECORD_BPF_EVENT
    };
    let mut count: BTreeMap<&[u8], i64> = BTreeMap::new();
    for e in dump.events.iter().filter(|e| side_band(e.type_)) {
        *count.entry(e.raw.as_slice()).or_default() += 1;
    }
    for r in &file.side_band {
        *count.entry(r.as_slice()).or_default() -= 1;
    }
    let differ: Vec<String> = count
        .iter()
        .filter(|(_, n)| **n != 0)
        .map(|(raw, n)| {
            format!(
                "{} {} record(s) {} only: {}",
                n.abs(),
                kloop_records::record_type_name(u32::from_le_bytes(
                    raw.get(..4)
                        .and_then(|b| b.try_into().ok())
                        .unwrap_or([0; 4])
                ))
                .unwrap_or("?"),
                if *n > 0 {
                    "perf's dump has"
                } else {
                    "check-perf-data read"
                },
                hex_head(raw)
            )
        })
        .collect();
    for d in differ.iter().take(MAX_PER_KIND) {
        out.push(Violation::new(
            FILE_RULE,
            format!("perf's dump and check-perf-data disagree on perf's file: {d}"),
        ));
    }
    out
}

/// Up to the first 32 bytes, hex, for a message.
fn hex_head(raw: &[u8]) -> String {
    raw.iter().take(32).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::super::dump::DumpEvent;
    use super::*;

    fn event(type_: u32, raw: &[u8]) -> DumpEvent {
        DumpEvent {
            offset: 0,
            size: raw.len() as u32,
            type_,
            raw: raw.to_vec(),
            summary: None,
        }
    }

    #[test]
    fn the_same_records_in_any_order_agree_and_a_missing_one_does_not() {
        let k = [17, 0, 0, 0, 0, 0, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8].to_vec();
        let b = [18, 0, 0, 0, 0, 0, 16, 0, 9, 9, 9, 9, 9, 9, 9, 9].to_vec();
        let dump = PerfDump {
            events: vec![event(17, &k), event(9, &[9; 8]), event(18, &b)],
            ..PerfDump::default()
        };
        let same = FileReading {
            side_band: vec![b.clone(), k.clone()],
            ..FileReading::default()
        };
        assert!(agree(&dump, &same).is_empty());
        let short = FileReading {
            side_band: vec![k.clone()],
            news: vec!["[register-twice] x".into()],
            stopped: Some("cut".into()),
        };
        let v: Vec<String> = agree(&dump, &short)
            .into_iter()
            .map(|v| v.message)
            .collect();
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].contains("stopped reading perf's file: cut"));
        assert!(v[1].contains("[register-twice] x"));
        assert!(
            v[2].contains("1 BPF_EVENT record(s) perf's dump has only: 1200000000001000"),
            "{v:?}"
        );
    }
}
