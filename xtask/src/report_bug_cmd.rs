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
    let out = write_mail(
        &a,
        &layout,
        &mail.warnings,
        &format!("{}-{}.mail", mail.name, mail.source),
        &mail.text,
    )?;
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
    let out = write_mail(
        a,
        &layout,
        &mail.warnings,
        &format!("{}-backport-{}.mail", mail.name, mail.series),
        &mail.text,
    )?;
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

/// Prints the mail's warnings and writes it (atomically) to `--out` or
/// `target/kloop/report-bug/<file_name>`; returns where.
fn write_mail(
    a: &ReportBugArgs,
    layout: &kloop::run::suite::Layout,
    warnings: &[String],
    file_name: &str,
    text: &str,
) -> Result<std::path::PathBuf> {
    for w in warnings {
        eprintln!("kloop: warning: {w}");
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| layout.root.join("target/kloop/report-bug").join(file_name));
    kloop_kernels::write_atomically(&out, text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}
