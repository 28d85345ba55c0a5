#![warn(missing_docs)]
//! Judging: from what the guest sent to findings. Knows nothing of QEMU, of
//! kernel builds or of how a trial is run, and does no I/O: files'
//! contents (budgets, the ledger) come in as values, and what is written
//! goes back as values (`Cargo.toml` lists no crate that could do
//! otherwise).
//!
//! - [`entry`]: the one door, [`judge`]: every family below over one run;
//! - [`evidence`]: the guest's messages and raw streams, before interpretation;
//! - [`check`]: the invariants every run obeys, one module per rule family;
//! - [`emissions`]: one kernel write's copies across listeners and perf,
//!   and whether an oversized copy's excess is the others' trailers;
//! - [`expectation`]: a scenario's `[[expect]]` tables as data;
//! - [`expect`]: checking them against a run;
//! - [`perf_script`]: the real perf as a second reader (`second-reader`);
//! - [`normalise`]: the stream with addresses, ids and times abstracted, for
//!   snapshots;
//! - [`kernel_log`]: the reports of a checked kernel's own checks (KASAN,
//!   UBSAN, lockdep, kmemleak) as violations;
//! - [`fault_recovery`]: a fail-nth sweep's clean attempt that failed, an
//!   injected failure the kernel did not undo;
//! - [`published`]: a spin reader's torn records, bytes the kernel
//!   published below `data_head` before it wrote them (`published-bytes`);
//! - [`known_issues`]: the ledger of known bugs and the sorting of violations;
//! - [`overhead`]: the emission path's cost against its budgets;
//! - [`ab`]: one scenario on a baseline and a candidate kernel, compared;
//! - [`bisect`]: predicates, step decisions and the search of a bisection.
pub mod ab;
pub mod bisect;
pub mod check;
pub mod emissions;
pub mod entry;
pub mod evidence;
pub mod exec_areas;
pub mod expect;
pub mod expectation;
pub mod fault_recovery;
pub mod jit_books;
pub mod kernel_log;
pub mod known_issues;
pub mod normalise;
pub mod overhead;
pub mod perf_script;
pub mod published;

pub use entry::{judge, Inputs, Judged};
