//! One QEMU guest: command line, accelerator, QMP, the data channel, deadlines.
//!
//! QEMU is always started from an argv, never a shell string. It is killed
//! when the [`Vm`] is dropped, and — through `PR_SET_PDEATHSIG` — when the
//! harness itself dies, so no QEMU outlives the process that started it.

pub mod accel;
mod argv;
mod config;
mod console;
mod process;
mod qmp;
mod saved_vm;
mod session;
mod terminal;

pub use argv::{firmware, QBOOT};
pub use config::*;
pub use console::*;
pub use process::*;
pub use saved_vm::*;
pub use session::*;

#[cfg(test)]
mod tests;
