//! `report-bug ID`: the mail for a known kernel bug with its fix, from the
//! ledger, the fix folder, validate's and the reproducer's runs.
//! `report-bug --backport ID --series X.Y`: the stable-list mail for a
//! backport gap, from the audit's kept answers.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::{layout, ReportBugArgs};

pub(crate) fn report_bug(a: ReportBugArgs) -> Result<ExitCode> {
    if let (Some(id), Some(series)) = (&a.backport, &a.series) {
        return backport(&a, id, series);
    }
    let id = a.id.as_deref().context("a ledger id, or --backport ID")?;
    let layout = layout();
    let mail = kloop::report::bug_mail::compose(&layout, id, a.source.as_deref())?;
    for w in &mail.warnings {
        eprintln!("kloop: warning: {w}");
    }
    let out = a.out.clone().unwrap_or_else(|| {
        layout
            .root
            .join("target/kloop/report-bug")
            .join(format!("{}-{}.mail", mail.name, mail.source))
    });
    kloop_kernels::write_atomically(&out, mail.text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "kloop: the mail for {} ({}) is in {}",
        mail.ids.join(", "),
        mail.patch,
        out.display()
    );
    println!(
        "kloop: add your Signed-off-by, read it, then send it with `git send-email {}`",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Exit 2 for an unknown id (the ids listed), a series with no served
/// build, a series the kept answers do not settle (the audit command
/// named), a series that is not affected or has no gap.
fn backport(a: &ReportBugArgs, id: &str, series: &str) -> Result<ExitCode> {
    let layout = layout();
    let mail = match kloop::report::backport_mail::compose(&layout, id, series, &a.fetch.options())
    {
        Ok(m) => m,
        Err(e) if e.is_bad_input() => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    for w in &mail.warnings {
        eprintln!("kloop: warning: {w}");
    }
    let out = a.out.clone().unwrap_or_else(|| {
        layout
            .root
            .join("target/kloop/report-bug")
            .join(format!("{}-backport-{}.mail", mail.name, mail.series))
    });
    kloop_kernels::write_atomically(&out, mail.text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "kloop: the backport request for {id} on {}.y is in {}",
        mail.series,
        out.display()
    );
    println!("kloop: {}", mail.check);
    if mail.carries_patch {
        // The DCO is a person's statement, not a tool's (as for `report-bug ID`).
        println!("kloop: add your Signed-off-by to the patch below the `-- >8 --` line");
    }
    println!(
        "kloop: read it, then send it with `git send-email {}`",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
