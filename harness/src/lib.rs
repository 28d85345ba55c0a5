//! kloop: kernel-in-the-loop tests of the KSYMBOL / BPF_EVENT record stream.
//!
//! Data flows one way: pin → image → VM → agent → raw records → parse →
//! check → normalise → compare → report. See ARCHITECTURE.md.
pub mod agent;
pub mod bench;
pub mod check;
pub mod evidence;
pub mod expect;
pub mod initramfs;
pub mod known_issues;
pub mod normalise;
pub mod overhead;
pub mod payload;
pub mod perf_script;
pub mod repeat;
pub mod report;
pub mod scenario;
pub mod signals;
pub mod snapshot;
pub mod suite;
pub mod trial;
