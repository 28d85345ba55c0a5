//! `check-perf-data`: the KSYMBOL, BPF_EVENT and LOST records of a
//! perf.data written anywhere (a production host, a CI runner), judged with
//! kloop's strict record parser and the rules that need no guest evidence.
//!
//! `linux-perf-data` reads the file (header, attributes, feature sections,
//! records in time order); each side-band record's bytes are put back
//! together (header and body) and parsed by `kloop-records` against the
//! attribute it belongs to, so a `header.size` that does not match the body
//! and that attribute's `sample_id` trailer is a finding, as in kloop's own
//! rings. First slice of issue 30: strict layout, BPF symbol shape and
//! register/unregister pairing over the time-ordered stream; the
//! `HEADER_BPF_PROG_INFO` agreement and the ledger's recognition are next.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kloop_protocol::ListenerInfo;
use kloop_records::{parse_stream, RecordBody, KSYM_TYPE_BPF};
use linux_perf_data::{PerfFileReader, PerfFileRecord};

/// `PERF_RECORD_*` types this check reads.
const KSYMBOL: u32 = 17;
const BPF_EVENT: u32 = 18;
const LOST: u32 = 2;

/// Why a file could not be checked (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PerfDataError {
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a readable perf.data file: {why}")]
    Unreadable { path: PathBuf, why: String },
}

/// One finding: the rule and what broke it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub message: String,
}

/// What the check found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PerfDataCheck {
    /// `HEADER_OSRELEASE`: the recording host's kernel.
    pub os_release: Option<String>,
    /// `HEADER_VERSION`: the perf that wrote the file.
    pub perf_version: Option<String>,
    /// Attributes that asked for KSYMBOL / BPF_EVENT records.
    pub side_band_attrs: usize,
    /// Records read, and KSYMBOL / BPF_EVENT / LOST among them.
    pub records: u64,
    pub ksymbol: u64,
    pub bpf_event: u64,
    pub lost: u64,
    pub findings: Vec<Finding>,
}

impl PerfDataCheck {
    /// 0 clean, 1 findings.
    pub fn clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Reads `path` and judges its side-band records.
pub fn check(path: &Path) -> Result<PerfDataCheck, PerfDataError> {
    let unreadable = |why: String| PerfDataError::Unreadable {
        path: path.to_path_buf(),
        why,
    };
    let file = std::fs::File::open(path).map_err(|source| PerfDataError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let pipe = is_pipe_mode(path).map_err(|e| unreadable(e.to_string()))?;
    let reader = std::io::BufReader::new(file);
    let parsed = if pipe {
        PerfFileReader::parse_pipe(reader)
    } else {
        PerfFileReader::parse_file(reader)
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = parsed.map_err(|e| unreadable(e.to_string()))?;
    let mut out = PerfDataCheck {
        os_release: perf_file.os_release().ok().flatten().map(str::to_string),
        perf_version: perf_file.perf_version().ok().flatten().map(str::to_string),
        ..PerfDataCheck::default()
    };
    let listeners: Vec<ListenerInfo> = perf_file
        .event_attributes()
        .iter()
        .enumerate()
        .map(|(i, a)| ListenerInfo {
            index: i as u32,
            cpu: -1,
            sample_type: a.attr.sample_format.bits(),
            sample_id_all: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::SAMPLE_ID_ALL),
            ksymbol: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::KSYMBOL),
            bpf_event: a
                .attr
                .flags
                .contains(linux_perf_data::linux_perf_event_reader::AttrFlags::BPF_EVENT),
            ..ListenerInfo::default()
        })
        .collect();
    out.side_band_attrs = listeners
        .iter()
        .filter(|l| l.ksymbol || l.bpf_event)
        .count();
    if out.side_band_attrs == 0 {
        out.findings.push(Finding {
            rule: "no-side-band",
            message: "no event in this file asked for KSYMBOL or BPF_EVENT records: it was recorded with `perf record --no-bpf-event` (or by a perf before 5.1); record again without it".into(),
        });
    }
    let mut live: BTreeMap<u64, (u32, String)> = BTreeMap::new();
    loop {
        let record = match record_iter.next_record(&mut perf_file) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                out.findings.push(Finding {
                    rule: "parse",
                    message: format!("the file ends in a record that cannot be read: {e}"),
                });
                break;
            }
        };
        out.records += 1;
        let PerfFileRecord::EventRecord { attr_index, record } = record else {
            continue;
        };
        let type_ = record.record_type.0;
        if ![KSYMBOL, BPF_EVENT, LOST].contains(&type_) {
            continue;
        }
        let Some(listener) = listeners.get(attr_index) else {
            continue;
        };
        let body = record.data.as_slice();
        let size = 8 + body.len();
        let mut bytes = Vec::with_capacity(size);
        bytes.extend_from_slice(&type_.to_le_bytes());
        bytes.extend_from_slice(&record.misc.to_le_bytes());
        bytes.extend_from_slice(&(size as u16).to_le_bytes());
        bytes.extend_from_slice(&body);
        match type_ {
            KSYMBOL => out.ksymbol += 1,
            BPF_EVENT => out.bpf_event += 1,
            _ => out.lost += 1,
        }
        match parse_stream(listener, &bytes) {
            Err(e) => out.findings.push(Finding {
                rule: "parse",
                message: format!("record {} (event {attr_index}): {}", out.records, e.what),
            }),
            Ok(recs) => {
                for r in recs {
                    judge_symbol(&r.body, &mut live, &mut out.findings);
                }
            }
        }
    }
    Ok(out)
}

/// `perf record -o -` writes the pipe form: the same magic, then a header
/// of 16 bytes (magic and size) instead of the file header's 104, and the
/// attributes and features as records in the stream.
fn is_pipe_mode(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 16];
    std::fs::File::open(path)?.read_exact(&mut head)?;
    Ok(&head[..8] == b"PERFILE2"
        && u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")) == 16)
}

/// A BPF symbol has a length and a name, is registered once while live and
/// unregistered only while live (perf synthesises the programs alive when
/// it starts, so every BPF symbol has its register in the file).
fn judge_symbol(
    body: &RecordBody,
    live: &mut BTreeMap<u64, (u32, String)>,
    findings: &mut Vec<Finding>,
) {
    let RecordBody::Ksymbol {
        addr,
        len,
        ksym_type,
        flags,
        name,
    } = body
    else {
        return;
    };
    if *ksym_type != KSYM_TYPE_BPF {
        return;
    }
    let unregister = flags & 1 != 0;
    if *len == 0 || name.is_empty() {
        findings.push(Finding {
            rule: "bpf-symbol-shape",
            message: format!(
                "KSYMBOL {} BPF addr={addr:#x} len={len} name=\"{name}\": a BPF symbol with no length or no name (an interpreted program's, see kloop's ledger entry interpreted-prog-ksymbol-register)",
                if unregister { "unregister" } else { "register" }
            ),
        });
        return;
    }
    if unregister {
        if live.remove(addr).is_none() {
            findings.push(Finding {
                rule: "unregister-without-register",
                message: format!("KSYMBOL unregister BPF addr={addr:#x} len={len} name={name}: no live symbol there"),
            });
        }
    } else if let Some((l, n)) = live.insert(*addr, (*len, name.clone())) {
        findings.push(Finding {
            rule: "register-twice",
            message: format!("KSYMBOL register BPF addr={addr:#x} name={name} while {n} (len {l}) is still registered there"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/testdata/perf-data")
            .join(name)
    }

    /// Recorded on this project's host (kernel 6.18.44, Debian's perf
    /// 6.1.187) with `perf record -e dummy -a` while kernels/repros'
    /// header-size reproducer loaded and unloaded a program with two
    /// listeners of its own: perf's copies of the KSYMBOL and BPF_EVENT
    /// records are longer than their body and trailer.
    #[test]
    fn a_real_host_file_shows_the_header_size_bug() {
        let c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        assert_eq!(c.os_release.as_deref(), Some("6.18.44-fc-v657"));
        assert!(
            c.perf_version
                .as_deref()
                .is_some_and(|v| v.starts_with("6.1.187")),
            "{c:?}"
        );
        assert_eq!((c.ksymbol, c.bpf_event), (2, 2), "{c:?}");
        let parse: Vec<&Finding> = c.findings.iter().filter(|f| f.rule == "parse").collect();
        assert_eq!(parse.len(), 4, "{:#?}", c.findings);
        assert!(
            parse[0]
                .message
                .contains("unexplained bytes after the sample_id trailer"),
            "{:#?}",
            parse
        );
    }

    /// The same recording as a pipe (`perf record -o - … > file`).
    #[test]
    fn the_pipe_form_is_read_too() {
        let c = check(&testdata("host-6.18.44-perf-6.1.187-header-size.pipe.data")).unwrap();
        assert_eq!((c.ksymbol, c.bpf_event), (2, 2), "{c:?}");
        assert_eq!(
            c.findings.iter().filter(|f| f.rule == "parse").count(),
            4,
            "{:#?}",
            c.findings
        );
    }

    #[test]
    fn a_file_that_is_not_perf_data_is_unreadable_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a perf.data file at all, just bytes").unwrap();
        let e = check(&junk).unwrap_err().to_string();
        assert!(e.contains("is not a readable perf.data file"), "{e}");
        let e = check(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(e.starts_with("opening "), "{e}");
        // Truncated: the header of a real file alone.
        let real = std::fs::read(testdata("host-6.18.44-perf-6.1.187-header-size.data")).unwrap();
        let cut = dir.path().join("cut");
        std::fs::write(&cut, &real[..100]).unwrap();
        assert!(check(&cut).is_err());
    }
}
