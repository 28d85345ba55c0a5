//! `report-bug ID`: the mail for a known kernel bug with its fix, from the
//! ledger, the fix folder, validate's and the reproducer's runs.
//! `report-bug --backport ID --series X.Y`: the stable-list mail for a
//! backport gap, from the audit's kept answers.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::flags::*;
use crate::shared::*;

impl Run for ReportBugArgs {
    fn run(self) -> Result<ExitCode> {
        report_bug(self)
    }
}

fn report_bug(a: ReportBugArgs) -> Result<ExitCode> {
    if let (Some(id), Some(series)) = (&a.backport, &a.series) {
        return backport(&a, id, series);
    }
    let id = a.id.as_deref().context("a ledger id, or --backport ID")?;
    let written = kloop::session::report_bug::bug(
        &layout(),
        id,
        a.source.as_deref(),
        a.out.as_deref(),
        &mut warn,
    )?;
    let (mail, out) = (&written.mail, &written.out);
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
    let written = match kloop::session::report_bug::backport(
        &layout(),
        id,
        series,
        &a.fetch.options(),
        a.out.as_deref(),
        &mut warn,
    ) {
        Ok(w) => w,
        Err(e) if e.is_bad_input() => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    let (mail, out) = (&written.mail, &written.out);
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

/// A warning of the mail's, on stderr before it is written.
fn warn(w: &str) {
    eprintln!("kloop: warning: {w}");
}
