//! `audit [ID…] [--series X.Y]`: which served builds of which series still
//! carry each ledger bug with a stand-alone reproducer
//! ([`crate::run::audit`]), and the audit's KCIDB document
//! ([`crate::report::kcidb::audit_document`]) beside its `audit.json`.

use std::path::PathBuf;

use crate::report::kcidb;
use crate::run::audit::{self, Audit, AuditError, AuditOptions, Event};
use crate::workspace::Layout;

/// The audit and its KCIDB document.
#[derive(Debug)]
pub struct Audited {
    pub audit: Audit,
    /// Where the KCIDB document went, or why it could not be written
    /// (the audit itself stands).
    pub kcidb: Result<PathBuf, KcidbWriteError>,
}

#[derive(Debug, thiserror::Error)]
pub enum KcidbWriteError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Runs the audit (its builds and boots told through `on`), then writes
/// its KCIDB document into its run directory.
pub fn run(
    layout: &Layout,
    opts: &AuditOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Audited, AuditError> {
    super::start_trials();
    let audit = audit::run(layout, opts, on)?;
    let kcidb = write_kcidb(layout, &audit);
    Ok(Audited { audit, kcidb })
}

fn write_kcidb(layout: &Layout, audit: &Audit) -> Result<PathBuf, KcidbWriteError> {
    let ctx = kcidb::RunContext::of_run(&layout.root, &audit.run_dir);
    let doc = kcidb::audit_document(audit, &ctx);
    let path = audit.run_dir.join(kcidb::DOCUMENT_FILE);
    kloop_kernels::write_atomically(&path, serde_json::to_string_pretty(&doc)?.as_bytes())?;
    Ok(path)
}
