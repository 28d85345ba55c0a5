//! `clean`: old run directories ([`crate::workspace::run_dirs`], never a
//! running one), and on request the kernel cache's saved VMs and fetched
//! kernels ([`kloop_kernels::KernelCache::clean`]).

use kloop_kernels::{CacheInUse, CleanParts, Cleaned, KernelCache, KernelError};

use crate::workspace::run_dirs::{self, Pruned, RunDir};
use crate::workspace::Layout;

/// What `clean` is asked.
#[derive(Debug, Clone, Copy)]
pub struct CleanOptions {
    /// How many of the newest run directories stay.
    pub keep: usize,
    /// Which parts of the kernel cache go too.
    pub cache: CleanParts,
}

/// What `clean` removed.
#[derive(Debug)]
pub struct Clean {
    /// The run directories there were before.
    pub before: Vec<RunDir>,
    pub pruned: Pruned,
    /// The kernel cache's part.
    pub cache: CacheCleaning,
}

/// The kernel cache's part of `clean`.
#[derive(Debug)]
pub enum CacheCleaning {
    Cleaned(Cleaned),
    /// Refused: a kloop process is using the cache.
    InUse(CacheInUse),
    /// There is no kernel cache to clean (its location is unknown).
    NoCache(KernelError),
}

/// Prunes the run directories to the newest `opts.keep` (deleting before
/// it returns), then cleans the asked parts of the kernel cache.
pub fn run(layout: &Layout, opts: &CleanOptions) -> Clean {
    let report_dir = layout.root.join("target/kloop/report");
    let before = run_dirs::list(&layout.runs());
    let pruned = run_dirs::prune(
        &layout.runs(),
        opts.keep,
        &report_dir,
        run_dirs::Removal::Now,
    );
    let cache = match KernelCache::default_location() {
        Err(e) => CacheCleaning::NoCache(e),
        Ok(cache) => match cache.clean(opts.cache) {
            Ok(c) => CacheCleaning::Cleaned(c),
            Err(in_use) => CacheCleaning::InUse(in_use),
        },
    };
    Clean {
        before,
        pruned,
        cache,
    }
}
