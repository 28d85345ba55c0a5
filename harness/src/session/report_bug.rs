//! `report-bug ID`: the mail for a known kernel bug with its fix
//! ([`crate::report::bug_mail`]); `report-bug --backport ID --series X.Y`:
//! the stable-list mail for a backport gap
//! ([`crate::report::backport_mail`]). Each is written (atomically) to
//! `--out` or `target/kloop/report-bug/`.

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::report::backport_mail::{BackportError, ComposedBackport};
use crate::report::bug_mail::{BugMailError, Composed};
use crate::workspace::Layout;

/// A mail composed and where it was written.
#[derive(Debug)]
pub struct Written<M> {
    pub mail: M,
    pub out: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportBugError {
    #[error(transparent)]
    Bug(#[from] BugMailError),
    #[error(transparent)]
    Backport(#[from] BackportError),
    #[error(transparent)]
    Io(#[from] PathIo),
}

impl ReportBugError {
    /// Bad input (an unknown id, a series with no served build or not
    /// settled, affected or gapped), not a failure of kloop's.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, ReportBugError::Backport(e) if e.is_bad_input())
    }
}

/// The mail for ledger `id` (and `source`, when its fix has several);
/// `warn` hears what the reader of the mail must check first.
pub fn bug(
    layout: &Layout,
    id: &str,
    source: Option<&str>,
    out: Option<&Path>,
    warn: &mut dyn FnMut(&str),
) -> Result<Written<Composed>, ReportBugError> {
    let mail = crate::report::bug_mail::compose(layout, id, source)?;
    let file_name = format!("{}-{}.mail", mail.name, mail.source);
    let out = write_mail(layout, out, &mail.warnings, &file_name, &mail.text, warn)?;
    Ok(Written { mail, out })
}

/// The backport request for ledger `id` on `series`.
pub fn backport(
    layout: &Layout,
    id: &str,
    series: &str,
    fetch: &kloop_kernels::FetchOptions,
    out: Option<&Path>,
    warn: &mut dyn FnMut(&str),
) -> Result<Written<ComposedBackport>, ReportBugError> {
    let mail = crate::report::backport_mail::compose(layout, id, series, fetch)?;
    let file_name = format!("{}-backport-{}.mail", mail.name, mail.series);
    let out = write_mail(layout, out, &mail.warnings, &file_name, &mail.text, warn)?;
    Ok(Written { mail, out })
}

/// Tells the mail's warnings and writes it (atomically) to `out` or
/// `target/kloop/report-bug/<file_name>`; returns where.
fn write_mail(
    layout: &Layout,
    out: Option<&Path>,
    warnings: &[String],
    file_name: &str,
    text: &str,
    warn: &mut dyn FnMut(&str),
) -> Result<PathBuf, ReportBugError> {
    for w in warnings {
        warn(w);
    }
    let out = out.map_or_else(
        || layout.root.join("target/kloop/report-bug").join(file_name),
        Path::to_path_buf,
    );
    kloop_kernels::write_atomically(&out, text.as_bytes()).at("writing", &out)?;
    Ok(out)
}
