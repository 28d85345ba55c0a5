//! Judging: from what the guest sent to findings. Knows nothing of QEMU or
//! of how a trial is run.
//!
//! - [`evidence`]: the guest's messages and raw streams, before interpretation;
//! - [`check`]: the invariants every run obeys, one module per rule family;
//! - [`expect`]: a scenario's own `[[expect]]` tables;
//! - [`perf_script`]: the real perf as a second reader (`second-reader`);
//! - [`normalise`]: the stream with addresses, ids and times abstracted, for
//!   snapshots;
//! - [`snapshot`]: comparison with the golden snapshots (insta);
//! - [`known_issues`]: the ledger of known bugs and the sorting of violations;
//! - [`overhead`]: the emission path's cost against its budgets;
//! - [`ab`]: one scenario on a baseline and a candidate kernel, compared;
//! - [`bisect`]: predicates, step decisions and the search of a bisection.
pub mod ab;
pub mod bisect;
pub mod check;
pub mod evidence;
pub mod expect;
pub mod known_issues;
pub mod normalise;
pub mod overhead;
pub mod perf_script;
pub mod snapshot;
