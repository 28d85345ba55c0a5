//! A command's whole session, above `run/` and `report/`: the options a
//! command is asked with, the trials run (`run/`), the files written
//! (`report/`), typed events on the way and a typed result. The xtask
//! builds the options from its flags, calls one entry point and prints.
//! Every command of `cargo xtask` has its file here, named after it (the
//! xtask's `session_check` test checks it), but `check-perf-data`, the
//! `kloop-perf-data` crate's tool for production hosts.
//!
//! - [`vm_test`]: `vm-test` and `bless`: plan, shard, rounds, repeats and
//!   the run's files;
//! - [`ab`]: an A/B run (`vm-test --baseline`, `validate`) with its
//!   reports and, for a shard, its manifest;
//! - [`validate`]: `validate`: both builds, the baseline's trials kept
//!   while the candidate builds, the A/B, the conclusion, `--record` and
//!   the wall split;
//! - [`mutants`]: `mutants`: its options, events and totals over the
//!   `mutants/` room (which mutants, judging them, `--from`, `--merge`,
//!   the report rewritten after every mutant);
//! - [`bench`]: `bench`'s kinds of measurement;
//! - [`bisect`]: `bisect` over served builds, `bisect --tree` and
//!   `bisect-step`;
//! - [`repro`]: `repro`: a trial's reproducer directory, a known bug's
//!   stand-alone reproducer and its proof;
//! - [`merge`]: `merge`: shards' run directories as one run;
//! - [`audit`]: `audit` and its KCIDB document;
//! - [`report_bug`]: `report-bug`: a fix's mail, a backport request;
//! - [`vm_shell`]: `vm-shell`: a guest's console on the user's terminal;
//! - [`kernels`]: `kernels …`: the catalog, source builds, served builds;
//! - [`clean`]: `clean`: old run directories and parts of the cache;
//! - [`doctor`]: `doctor`: this machine's checks.
pub mod ab;
pub mod audit;
pub mod bench;
pub mod bisect;
pub mod clean;
pub mod docs;
pub mod doctor;
pub mod kernels;
pub mod merge;
pub mod mutants;
pub mod report_bug;
pub mod repro;
pub mod skips;
pub mod validate;
pub mod vm_shell;
pub mod vm_test;

/// What every command that runs trials does first: SIGINT/SIGTERM stop
/// every wait, and insta prints no diff of its own (`INSTA_OUTPUT`, which
/// insta reads, unless the user set it): each failing trial prints its
/// own short diff, and insta's full one would interleave between parallel
/// trials (`cargo insta review` shows it on demand).
pub fn start_trials() {
    crate::run::signals::install();
    // Registered as a user of the kernel cache for the rest of the
    // process, so that `clean` leaves alone what this run may be using.
    static CACHE_USER: std::sync::OnceLock<Option<kloop_kernels::lock::HolderLock>> =
        std::sync::OnceLock::new();
    CACHE_USER.get_or_init(|| {
        kloop_kernels::KernelCache::default_location()
            .ok()
            .and_then(|c| kloop_kernels::lock::register_user(c.root()).ok())
    });
    if std::env::var_os("INSTA_OUTPUT").is_none() {
        std::env::set_var("INSTA_OUTPUT", "none");
    }
}
