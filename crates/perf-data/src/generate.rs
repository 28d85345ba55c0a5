//! A perf.data of any size for `cargo xtask bench --perf-data-gib N`: a
//! real pipe-mode recording stretched. Its start (attributes, features,
//! what perf synthesised) and end are kept byte for byte; its KSYMBOL and
//! BPF_EVENT records, cut to their true size, are repeated with rising
//! timestamps, each round closed by a `FINISHED_ROUND` as perf writes them,
//! until the file has the size asked for. A clean file: every repetition
//! registers, loads, unregisters and unloads the program again.

use std::io::Write;
use std::path::Path;

use kloop_protocol::ListenerInfo;
use kloop_records::{parse_stream, sample_id_len, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

use crate::check::{oversized, BPF_EVENT, KSYMBOL};

/// `PERF_RECORD_FINISHED_ROUND`: perf's "everything before this is in
/// time order" marker.
const FINISHED_ROUND: u32 = 68;

/// Why a file could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the template {path} cannot serve: {why}")]
    Template { path: String, why: String },
}

/// What was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generated {
    pub bytes: u64,
    /// KSYMBOL and BPF_EVENT records, and rounds.
    pub side_band_records: u64,
    pub rounds: u64,
}

/// One side-band record of the template at its true size, and where its
/// timestamp is.
struct Proto {
    bytes: Vec<u8>,
    time_at: usize,
    time: u64,
}

/// Writes at least `target` bytes to `out` (through a temporary file
/// beside it) from the pipe-mode `template`, whose side-band records all
/// belong to one event that has `sample_id_all` with `TIME`.
pub fn stretch(template: &Path, out: &Path, target: u64) -> Result<Generated, GenerateError> {
    let bad = |why: &str| GenerateError::Template {
        path: template.display().to_string(),
        why: why.to_string(),
    };
    let bytes = std::fs::read(template)?;
    let listener = side_band_listener(template).map_err(|e| bad(&e.to_string()))?;
    if !listener.sample_id_all || listener.sample_type & PERF_SAMPLE_TIME == 0 {
        return Err(bad(
            "its side-band event has no timestamp in a sample_id trailer",
        ));
    }
    let SideBand { first, end, protos } = side_band(&bytes, &listener, &bad)?;
    let span = protos.last().map_or(0, |p| p.time) - protos[0].time + 1;
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
    w.write_all(&bytes[..first])?;
    let mut g = Generated {
        bytes: (first + bytes.len() - end) as u64,
        side_band_records: 0,
        rounds: 0,
    };
    let round_marker = {
        let mut m = FINISHED_ROUND.to_le_bytes().to_vec();
        m.extend_from_slice(&[0, 0, 8, 0]);
        m
    };
    while g.bytes < target {
        for p in &protos {
            let mut b = p.bytes.clone();
            let t = p.time + g.rounds * span;
            b[p.time_at..p.time_at + 8].copy_from_slice(&t.to_le_bytes());
            w.write_all(&b)?;
            g.bytes += b.len() as u64;
            g.side_band_records += 1;
        }
        w.write_all(&round_marker)?;
        g.bytes += 8;
        g.rounds += 1;
    }
    w.write_all(&bytes[end..])?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, out)?;
    Ok(g)
}

/// The template's side-band records: where the first starts, where the last
/// ends, and each as a prototype to repeat.
struct SideBand {
    first: usize,
    end: usize,
    protos: Vec<Proto>,
}

/// Walks the template's records after its 16-byte pipe header and keeps
/// the side-band ones, each cut to the size that parses (an oversized
/// record's padding is not repeated).
fn side_band(
    bytes: &[u8],
    listener: &ListenerInfo,
    bad: &dyn Fn(&str) -> GenerateError,
) -> Result<SideBand, GenerateError> {
    let trailer = sample_id_len(listener);
    // The trailer's order (perf_event__output_id_sample): TID, then TIME.
    let time_in_trailer = if listener.sample_type & PERF_SAMPLE_TID != 0 {
        8
    } else {
        0
    };
    let (mut first, mut end, mut protos) = (None, 0, Vec::new());
    let mut at = 16;
    while at + 8 <= bytes.len() {
        let type_ = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let size = u16::from_le_bytes([bytes[at + 6], bytes[at + 7]]) as usize;
        if size < 8 || at + size > bytes.len() {
            return Err(bad("its records do not walk to its end"));
        }
        if type_ == KSYMBOL || type_ == BPF_EVENT {
            let rec = &bytes[at..at + size];
            let true_size = match parse_stream(listener, rec) {
                Ok(_) => size,
                Err(_) => oversized(listener, rec)
                    .map(|(s, _)| s)
                    .ok_or_else(|| bad("a side-band record does not parse"))?,
            };
            let mut b = rec[..true_size].to_vec();
            b[6..8].copy_from_slice(&(true_size as u16).to_le_bytes());
            let time_at = true_size - trailer + time_in_trailer;
            let time = u64::from_le_bytes(b[time_at..time_at + 8].try_into().expect("8 bytes"));
            protos.push(Proto {
                bytes: b,
                time_at,
                time,
            });
            first.get_or_insert(at);
            end = at + size;
        }
        at += size;
    }
    let Some(first) = first else {
        return Err(bad("it has no KSYMBOL or BPF_EVENT record"));
    };
    Ok(SideBand { first, end, protos })
}

/// Why the template has no one side-band event (a `Template` error's why).
#[derive(Debug, thiserror::Error)]
enum NoSideBandEvent {
    #[error("{0}")]
    Open(#[from] std::io::Error),
    #[error("{0}")]
    Read(#[from] linux_perf_data::Error),
    #[error("{0} events asked for side-band records, not one")]
    NotOne(usize),
}

/// The one event of the template that asked for side-band records.
fn side_band_listener(template: &Path) -> Result<ListenerInfo, NoSideBandEvent> {
    let file = std::fs::File::open(template)?;
    let reader = linux_perf_data::PerfFileReader::parse_pipe(std::io::BufReader::new(file))?;
    let listeners = crate::check::listeners(&reader.perf_file);
    let mut side: Vec<ListenerInfo> = listeners
        .into_iter()
        .filter(|l| l.ksymbol || l.bpf_event)
        .collect();
    match side.len() {
        1 => Ok(side.remove(0)),
        n => Err(NoSideBandEvent::NotOne(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stretched to ~1 MB, the host recording reads back as a clean file
    /// with every repetition counted (the bench does the same at 1 GiB).
    #[test]
    fn a_stretched_real_recording_is_clean_and_counted() {
        let template = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/host-6.18.44-perf-6.1.187-header-size.pipe.data");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("big.data");
        let g = stretch(&template, &out, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), g.bytes);
        assert!(g.bytes >= 1 << 20);
        assert_eq!(g.side_band_records, 4 * g.rounds);
        let c = crate::check::check(&out).unwrap();
        assert_eq!(c.ksymbol + c.bpf_event, g.side_band_records, "{c:?}");
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
        assert!(c.stopped.is_none());
    }
}
