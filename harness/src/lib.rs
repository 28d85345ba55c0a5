//! kloop: kernel-in-the-loop tests of the KSYMBOL / BPF_EVENT record stream.
//!
//! Data flows one way: pin → image → VM → agent → raw records → parse →
//! judge → report. The crates below this one do one job each: the record
//! parser (`kloop-records`), kernels (`kloop-kernels`), running QEMU
//! (`kloop-qemu`), the wire protocol (`kloop-protocol`), mutants of the
//! kernel's emission paths (`kloop-mutate`). This library holds
//! the rooms that use them, each importing only from the rooms below
//! it (see ARCHITECTURE.md):
//! - [`scenario`]: what a scenario runs and expects
//!   (`scenarios/<name>/scenario.toml` → a plan), shared by the rooms above;
//! - [`judge`]: the crate `kloop-judge` (what the guest sent judged against
//!   the rules, the scenario's expectations, the known-issues ledger and
//!   the overhead budgets, with no I/O), under the name the rooms here use;
//! - [`workspace`]: the checkout (`Layout`: kernels, scenarios, runs), its
//!   root, the known-issues ledger read from it and the run directories
//!   made under it, the floor `run`, `report` and `session` stand on;
//! - [`run`]: scenarios, trials from image to verdict, suites of trials,
//!   repeats, signals, the guest agent's build and what goes into its
//!   initramfs;
//! - [`report`]: trial lines, summaries, JSON lines, JUnit, the overhead
//!   report;
//! - [`mutants`]: mutation testing, a feature room between `session` and
//!   `report`: choosing `kloop-mutate`'s mutants, building and judging
//!   them, the score's report and data;
//! - [`session`]: each command's one entry point over `run` and `report`:
//!   options in, typed events on the way, a typed result out.
pub use kloop_judge as judge;
/// The guest architectures (`--arch`), which the xtask names without depending on the wire crate.
pub use kloop_protocol::Arch;
pub mod doctor;
pub mod mutants;
pub use kloop_perf_data as perf_data;
pub mod report;
pub mod run;
pub mod scenario;
pub mod session;
pub mod workspace;
