//! `report-bug ID`: the mail for a known kernel bug with its fix, from the
//! ledger, the fix folder, validate's and the reproducer's runs.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::{layout, ReportBugArgs};

pub(crate) fn report_bug(a: ReportBugArgs) -> Result<ExitCode> {
    let layout = layout();
    let mail = kloop::report::bug_mail::compose(&layout, &a.id, a.source.as_deref())?;
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
