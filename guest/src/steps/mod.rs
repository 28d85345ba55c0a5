//! The plan's steps, one module per family. A step module builds on the
//! shared [`crate::context::StepContext`], the [`crate::fixtures`] and the
//! low layers (channel, sys, perf, bpf, kallsyms); the runner's dispatcher
//! calls into these modules, never the other way round.

pub mod concurrent;
pub mod fail_nth;
pub mod fault;
pub mod files;
pub mod hooks;
pub mod inventory;
pub mod kallsyms;
pub mod ksymwatch;
pub mod listeners;
pub mod load;
pub mod measure;
pub mod net;
pub mod pack_boundary;
pub mod perf_attribution;
pub mod perf_tool;
pub mod probes;
pub mod program;
pub mod spin_read;
pub mod storm;
pub mod struct_ops;
pub mod unprivileged;
