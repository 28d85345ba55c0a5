//! A command's whole session, above `run/` and `report/`: the options a
//! command is asked with, the trials run (`run/`), the files written
//! (`report/`), typed events on the way and a typed result. The xtask
//! builds the options from its flags, calls one entry point and prints.
//!
//! - [`vm_test`]: `vm-test` and `bless`: plan, shard, rounds, repeats and
//!   the run's files;
//! - [`ab`]: an A/B run (`vm-test --baseline`, `validate`) with its
//!   reports and, for a shard, its manifest;
//! - [`mutants`]: `mutants`: its options, events and totals over the
//!   `mutants/` room (which mutants, judging them, `--from`, `--merge`,
//!   the report rewritten after every mutant).
pub mod ab;
pub mod mutants;
pub mod vm_test;
