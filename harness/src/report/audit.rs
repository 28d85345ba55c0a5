//! `audit`'s table: per reproducer, one row per series (builds affected,
//! clean, cannot run, the first fixed build), then the backport gaps.

use crate::run::audit::plan::{Answer, Gap};
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
    let mut line = format!("{}/{}: {} ({how})", b.series, b.version, answers.join(", "));
    for (name, a) in &b.answers {
        if let Answer::NoAnswer(why) | Answer::CannotRun(why) = a {
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

/// The whole table: per reproducer its series rows, notes and gaps.
pub fn table(audit: &Audit) -> String {
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
    for r in &audit.reproducers {
        out.push_str(&format!("{} ({})\n", r.name, r.ids.join(", ")));
        let rows: Vec<[String; 9]> = audit
            .series
            .iter()
            .filter_map(|s| row(s, &r.name))
            .collect();
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
            let Some(f) = s.findings.get(&r.name) else {
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
            if let Some(Answer::CannotRun(why) | Answer::NoAnswer(why)) = f.newest() {
                out.push_str(&format!("  note: {}: newest build: {why}\n", s.series));
            }
        }
        for g in audit.gaps.iter().filter(|g| g.reproducer == r.name) {
            out.push_str(&format!("  {}\n", gap_line(g, audit)));
        }
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

/// The closing line.
pub fn summary(audit: &Audit) -> String {
    let kept: usize = audit.boots.iter().map(|b| b.kept.len()).sum();
    format!(
        "kloop: audit of {} reproducer(s) over {} series: {} build(s) asked, {} booted, {} answer(s) kept from earlier audits, {} without an answer; {} backport gap(s); in {:.0} s ({}); {}",
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
