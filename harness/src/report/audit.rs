//! `audit`'s table: per reproducer, one row per series (builds affected,
//! clean, cannot run, the first fixed build), then the backport gaps.

use crate::run::audit::plan::{Answer, Gap, Unanswerable, Unanswered};
use crate::run::audit::{Audit, AuditedSeries};

/// One line per build as it was asked, for the live output.
pub fn boot_line(b: &crate::run::audit::BootRecord) -> String {
    let answers: Vec<String> = b
        .answers
        .iter()
        .map(|(name, a)| {
            let kept = if b.kept.contains(name) { " (kept)" } else { "" };
            format!("{name} {}{kept}", a.label())
        })
        .collect();
    let how = match &b.dir {
        Some(_) => format!("booted in {:.1} s", b.secs),
        None if b.kept.is_empty() => "not booted".to_string(),
        None => "kept answers".to_string(),
    };
    let without = if b.pinned_without.is_empty() {
        String::new()
    } else {
        format!("; without {}: not served", b.pinned_without.join(", "))
    };
    let mut line = format!(
        "{}/{}: {} ({how}{without})",
        b.series,
        b.version,
        answers.join(", ")
    );
    for (name, a) in &b.answers {
        if let Answer::NoAnswer(why) | Answer::NotServed(why) | Answer::CannotRun(why) = a {
            line.push_str(&format!("\n    {name}: {why}"));
        }
    }
    line
}

fn row(s: &AuditedSeries, name: &str) -> Option<[String; 9]> {
    let f = s.findings.get(name)?;
    let c = f.counts();
    let version = |i: usize| s.builds.get(i).map_or("-".into(), |b| b.version.clone());
    let newest = f
        .newest_answered
        .or(f.builds.checked_sub(1))
        .map_or("-".into(), version);
    let first_fixed = match &f.change {
        Some(ch) if f.first_fixed().is_some() => {
            let mut v = version(ch.first_after);
            if !ch.undecided_between.is_empty() {
                v.push_str(&format!(" (or {} before it)", ch.undecided_between.len()));
            }
            v
        }
        _ => "-".into(),
    };
    Some([
        s.series.clone(),
        f.builds.to_string(),
        newest,
        f.newest().map_or("-", Answer::label).to_string(),
        c.affected.to_string(),
        c.clean.to_string(),
        c.cannot_run.to_string(),
        first_fixed,
        f.probed.len().to_string(),
    ])
}

/// The gap's line.
pub fn gap_line(g: &Gap, audit: &Audit) -> String {
    let newest = audit
        .series
        .iter()
        .find(|s| s.series == g.series)
        .and_then(|s| {
            let f = s.findings.get(&g.reproducer)?;
            s.builds.get(f.newest_answered?)
        })
        .map_or(String::new(), |b| format!(" (newest {})", b.version));
    let fixed: Vec<String> = g
        .fixed_in
        .iter()
        .map(|f| match &f.first_fixed {
            Some(v) => format!("{} fixed from {v}", f.series),
            None => format!("{} clean throughout", f.series),
        })
        .collect();
    let mut line = format!(
        "backport gap: {} {}{} is affected; {}",
        g.reproducer,
        g.series,
        newest,
        fixed.join(", ")
    );
    if let Some(u) = &g.upstream {
        line.push_str(&format!("; upstream commit {u}"));
    }
    line
}

/// One reproducer's rows (a line per series), notes, unanswered series
/// and gaps, as `table` prints them under its name.
pub fn reproducer_table(audit: &Audit, name: &str) -> String {
    let header = [
        "series",
        "builds",
        "newest",
        "now",
        "affected",
        "clean",
        "cannot run",
        "first fixed",
        "asked",
    ];
    let mut out = String::new();
    let rows: Vec<[String; 9]> = audit.series.iter().filter_map(|s| row(s, name)).collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut l = String::from(" ");
        for (cell, w) in cells.iter().zip(widths) {
            l.push_str(&format!(" {cell:<w$}"));
        }
        format!("{}\n", l.trim_end())
    };
    out.push_str(&line(header.to_vec()));
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    for s in &audit.series {
        let Some(f) = s.findings.get(name) else {
            continue;
        };
        if let Some(note) = &f.note {
            out.push_str(&format!("  note: {}: {note}\n", s.series));
        }
        if let Some(ch) = &f.change {
            if f.first_fixed().is_none() {
                out.push_str(&format!(
                    "  note: {}: {} up to {}, {} from {} (a regression inside the series)\n",
                    s.series,
                    ch.from.label(),
                    s.builds[ch.last_before].version,
                    ch.to.label(),
                    s.builds[ch.first_after].version
                ));
            }
        }
        if let Some(Answer::CannotRun(why)) = f.newest() {
            out.push_str(&format!("  note: {}: newest build: {why}\n", s.series));
        }
    }
    for u in audit
        .unanswered_series
        .iter()
        .filter(|u| u.reproducer == name)
    {
        out.push_str(&unanswered_lines(u, audit));
    }
    for g in audit.gaps.iter().filter(|g| g.reproducer == name) {
        out.push_str(&format!("  {}\n", gap_line(g, audit)));
    }
    out
}

/// The whole table: per reproducer its series rows, notes and gaps.
pub fn table(audit: &Audit) -> String {
    let mut out = String::new();
    for r in &audit.reproducers {
        out.push_str(&format!("{} ({})\n", r.name, r.ids.join(", ")));
        out.push_str(&reproducer_table(audit, &r.name));
        out.push('\n');
    }
    if !audit.without_reproducer.is_empty() {
        out.push_str(&format!(
            "not audited (no stand-alone reproducer in kernels/repros/): {}\n",
            audit.without_reproducer.join(", ")
        ));
    }
    if !audit.unserved_series.is_empty() {
        out.push_str(&format!(
            "series of the catalog's pins the mirror serves no build of: {}\n",
            audit.unserved_series.join(", ")
        ));
    }
    out
}

/// A series left without an answer: the cause (each build asked and why
/// it did not answer) and the next step.
pub fn unanswered_lines(u: &Unanswered, audit: &Audit) -> String {
    let (what, next) = match u.cause {
        Unanswerable::NotServed => (
            "the mirror does not serve the builds asked".to_string(),
            format!(
                "`cargo xtask kernels available --series {s} --refresh` lists what it serves \
                 now; audit again (`--series {s}`) once it serves a build of the series, or with \
                 KLOOP_MIRROR (or --mirror) set to an archive that still serves these",
                s = u.series
            ),
        ),
        Unanswerable::NoAnswer => (
            "a build that could be had gave no answer".to_string(),
            format!(
                "read the boots' consoles ({}/boots/<version>/console.log), then audit again \
                 (`--series {}`); a build that panics or hangs on every boot is worth a report",
                audit.run_dir.display(),
                u.series
            ),
        ),
    };
    let mut out = format!("  unanswered: {}: {what}\n", u.series);
    for (version, why) in &u.builds {
        out.push_str(&format!("    {version}: {why}\n"));
    }
    out.push_str(&format!("    next: {next}\n"));
    out
}

/// The closing line.
pub fn summary(audit: &Audit) -> String {
    let kept: usize = audit.boots.iter().map(|b| b.kept.len()).sum();
    let failed = audit.failed_series().len();
    let unanswered = match (audit.unanswered_series.len(), failed) {
        (0, _) => "every series answered".to_string(),
        (n, 0) => format!(
            "{n} series × reproducer unanswered, all because the mirror does not serve the builds"
        ),
        (n, f) => {
            format!("{n} series × reproducer unanswered, {f} of them not because of the mirror")
        }
    };
    format!(
        "kloop: audit of {} reproducer(s) over {} series: {} build(s) asked, {} booted, {} answer(s) kept from earlier audits, {} without an answer; {unanswered}; {} backport gap(s); in {:.0} s ({}); {}",
        audit.reproducers.len(),
        audit.series.len(),
        audit.boots.len(),
        audit.booted(),
        kept,
        audit.unanswered(),
        audit.gaps.len(),
        audit.secs,
        audit.accel,
        audit.run_dir.join(crate::run::audit::AUDIT_FILE).display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::audit::plan::audit_series;
    use crate::run::audit::{all_unanswered, AuditedReproducer, AuditedSeries, BuildRef};

    fn series(name: &str, answers: &[Answer]) -> AuditedSeries {
        let builds: Vec<BuildRef> = (0..answers.len())
            .map(|i| BuildRef {
                version: format!("{name}.{i}-1"),
                package: format!("linux-binary-{name}.{i}+deb13-cloud-amd64"),
                suite: "trixie-backports".into(),
                release: format!("{name}.{i}+deb13-cloud-amd64"),
                deb_sha256: None,
            })
            .collect();
        let finding = audit_series(answers.len(), &mut |i| answers[i].clone());
        AuditedSeries {
            series: name.into(),
            builds,
            findings: [("hs".to_string(), finding)].into_iter().collect(),
        }
    }

    fn audit(series: Vec<AuditedSeries>) -> Audit {
        let reproducers = vec![AuditedReproducer {
            name: "hs".into(),
            ids: vec!["ksymbol-bpf-event-header-size-accumulates".into()],
            upstream: None,
        }];
        Audit {
            unanswered_series: all_unanswered(&reproducers, &series),
            reproducers,
            without_reproducer: vec![],
            series,
            unserved_series: vec![],
            gaps: vec![],
            boots: vec![],
            secs: 1.0,
            run_dir: "/runs/r".into(),
            accel: "tcg".into(),
        }
    }

    fn gone() -> Answer {
        Answer::NotServed("pinning x: the mirror no longer serves linux-binary-x".into())
    }

    /// A series whose builds the mirror does not serve is listed with the
    /// cause and the next step and does not fail the audit; one whose
    /// build panicked does.
    #[test]
    fn unanswered_series_are_listed_and_only_the_mirror_passes() {
        let served = series("7.1", &[Answer::Affected, Answer::Affected]);
        let unserved = series("7.0", &[gone(), gone()]);
        let a = audit(vec![served.clone(), unserved.clone()]);
        assert!(a.passed(), "{:?}", a.unanswered_series);
        let t = table(&a);
        assert!(
            t.contains("  unanswered: 7.0: the mirror does not serve the builds asked\n"),
            "{t}"
        );
        assert!(
            t.contains("    7.0.1-1: pinning x: the mirror no longer serves"),
            "{t}"
        );
        assert!(
            t.contains("kernels available --series 7.0 --refresh"),
            "{t}"
        );
        assert!(!t.contains("unanswered: 7.1"), "{t}");
        assert!(summary(&a).contains("all because the mirror does not serve the builds"));

        let panicked = series(
            "6.19",
            &[gone(), Answer::NoAnswer("the kernel panicked".into())],
        );
        let a = audit(vec![served, unserved, panicked]);
        assert!(!a.passed());
        assert_eq!(a.failed_series().len(), 1);
        let t = table(&a);
        assert!(
            t.contains("  unanswered: 6.19: a build that could be had gave no answer\n"),
            "{t}"
        );
        assert!(t.contains("/runs/r/boots/<version>/console.log"), "{t}");
        assert!(summary(&a).contains("1 of them not because of the mirror"));
    }
}
