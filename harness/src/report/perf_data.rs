//! `check-perf-data`'s report for people: what the file is, its counts,
//! each finding (news first, then the known bugs) and the verdict line.

use std::fmt::Write as _;
use std::path::Path;

use crate::perf_data::PerfDataCheck;

/// The whole report; the last line is the verdict: `clean`, `KNOWN (<ids>)`
/// or `<n> finding(s)`.
pub fn text(file: &Path, c: &PerfDataCheck) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "kloop: {}: kernel {}, written by perf {}; {} record(s): {} KSYMBOL, {} BPF_EVENT, {} LOST; {} event(s) asked for them",
        file.display(),
        c.os_release.as_deref().unwrap_or("(unknown)"),
        c.perf_version.as_deref().unwrap_or("(unknown)"),
        c.records,
        c.ksymbol,
        c.bpf_event,
        c.lost,
        c.side_band_attrs
    );
    if !c.bpf_event_requested {
        o.push_str(
            "  note: no event asked for BPF_EVENT records (`perf record --no-bpf-event`): the KSYMBOLs of BPF programs are judged, their load/unload ids and tags are not in this file; record without --no-bpf-event to have them\n",
        );
    }
    for f in c.news() {
        let _ = writeln!(o, "  [{}] {}", f.rule, f.message);
    }
    for id in c.known_issues() {
        let hits: Vec<_> = c
            .findings
            .iter()
            .filter(|f| f.known_issue.as_deref() == Some(id))
            .collect();
        let _ = writeln!(
            o,
            "  known bug {id} (kernels/known-issues.toml), {} finding(s):",
            hits.len()
        );
        for f in hits.iter().take(3) {
            let _ = writeln!(o, "    [{}] {}", f.rule, f.message);
        }
        if hits.len() > 3 {
            let _ = writeln!(o, "    … and {} more", hits.len() - 3);
        }
    }
    for (rule, n) in &c.more_findings {
        let _ = writeln!(
            o,
            "  … and {n} more [{rule}] finding(s), counted, not kept (the first {} of each rule are)",
            crate::perf_data::KEPT_PER_RULE
        );
    }
    let news = c.news_count();
    let known = c.known_issues();
    let verdict = match (news, known.is_empty()) {
        (0, true) => "clean".to_string(),
        (0, false) => format!("KNOWN ({})", known.join(", ")),
        (n, true) => format!("{n} finding(s)"),
        (n, false) => format!("{n} finding(s); also KNOWN ({})", known.join(", ")),
    };
    use crate::perf_data::Stopped;
    match &c.stopped {
        Some(Stopped::CutShort(why)) => {
            let _ = writeln!(
                o,
                "  TRUNCATED: {why}; the records before it are judged above (was perf killed, or the disk full?)"
            );
            let _ = writeln!(o, "kloop: cut short; {verdict} up to the cut");
        }
        Some(Stopped::Unreadable(why)) => {
            let _ = writeln!(
                o,
                "  UNREADABLE: {why}; the records before it are judged above (does `perf report -D -i` read the file? If not, the tool that wrote it got the format wrong)"
            );
            let _ = writeln!(o, "kloop: stopped early; {verdict} up to there");
        }
        None => {
            let _ = writeln!(o, "kloop: {verdict}");
        }
    }
    o
}
