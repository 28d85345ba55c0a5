//! Running: one trial from kernel image to verdict,
//! suites of trials on parallel VMs, repeats, and the signals that stop
//! them. Uses the judging room and the crates below; reports nothing itself.
//!
//! - [`agent`]: builds the static guest agent;
//! - [`initramfs`] and [`payload`]: what goes into the guest;
//! - [`trial`]: one kernel × scenario → [`trial::Verdict`];
//! - [`saved_vm`]: one boot per kernel × VM shape, saved and restored for
//!   every trial;
//! - [`suite`]: planning and running many trials;
//! - [`repeat`]: `--repeat N` and the FLAKY verdict;
//! - [`reuse`]: a baseline's trial results kept for the next A/B;
//! - [`shard`]: `--shard K/N`, the partition of a run among N machines;
//! - [`signals`]: SIGINT/SIGTERM for every wait loop;
//! - [`bench`]: what `cargo xtask bench` measures;
//! - [`ab`]: A/B runs of a baseline and a candidate kernel;
//! - [`bisect`]: bisection steps over an ordered list of kernels, and over
//!   a git tree's commits ([`bisect::tree`]);
//! - [`validate`]: `validate`'s expected fixes, conclusion and `--record`;
//! - [`fixes`]: `kernels/fixes/`: which ledger entries a fix ends, its
//!   patch per source, `validate --record`;
//! - [`standalone`]: stand-alone C reproducers of known bugs, written as
//!   one file and proven in the guest per kernel;
//! - [`shell`]: `vm-shell`, a guest's console on the user's terminal, with
//!   `kloop-run` reports parsed on the host.
pub mod ab;
pub mod agent;
pub mod audit;
pub mod bench;
pub mod bisect;
pub mod controls;
pub mod fixes;

pub mod initramfs;
pub mod parallel;
pub mod payload;
pub mod phases;
pub mod repeat;
pub mod reuse;
pub mod saved_vm;
pub mod shard;
pub mod shell;
pub mod signals;
pub mod standalone;
pub mod suite;
pub mod trial;
pub mod validate;

/// Status events for the person waiting (see [`kloop_kernels::status`]).
pub use kloop_kernels::status;
