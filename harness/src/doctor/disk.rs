//! The kernel cache: where it is, what it holds, its saved VMs.

use super::*;

/// Bytes under `dir`, symlinks not followed, unreadable parts skipped.
pub(super) fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

pub(super) fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

pub(super) fn check_cache(catalog: Option<&Catalog>) -> (Check, Option<KernelCache>) {
    let cache = match KernelCache::default_location() {
        Ok(c) => c,
        Err(e) => {
            return (
                Check::fail(
                    "cache",
                    e.to_string(),
                    "export KLOOP_CACHE_DIR=<a writable directory>",
                ),
                None,
            )
        }
    };
    let root = cache.root().to_path_buf();
    let writable = std::fs::create_dir_all(&root).and_then(|()| tempfile::tempfile_in(&root));
    if let Err(e) = writable {
        return (
            Check::fail(
                "cache",
                format!("{} is not writable: {e}", root.display()),
                "export KLOOP_CACHE_DIR=<a writable directory>",
            ),
            Some(cache),
        );
    }
    let pins = catalog.map(Catalog::pins).unwrap_or_default();
    // Verified (hashed), as a run would: a truncated image is not cached.
    let cached: Vec<&str> = pins
        .iter()
        .filter(|p| cache.is_cached(p))
        .map(|p| p.id.as_str())
        .collect();
    let missing: Vec<&str> = pins
        .iter()
        .map(|p| p.id.as_str())
        .filter(|id| !cached.contains(id))
        .collect();
    let saved = subdirs(&root.join("saved-vms"));
    let saved_size: u64 = saved.iter().map(|d| dir_size(d)).sum();
    let built = kloop_kernels::build::list(&cache).len();
    let mut detail = format!(
        "{}: {}; {} of {} pinned kernels cached",
        root.display(),
        kloop_qemu::human_bytes(dir_size(&root)),
        cached.len(),
        pins.len()
    );
    if !missing.is_empty() {
        detail += &format!(
            " (not yet: {}; fetched on first use, or by `cargo xtask kernels fetch`)",
            missing.join(", ")
        );
    }
    detail += &format!(
        "; {} saved VM{} ({}); {} built kernel{}",
        saved.len(),
        if saved.len() == 1 { "" } else { "s" },
        kloop_qemu::human_bytes(saved_size),
        built,
        if built == 1 { "" } else { "s" }
    );
    (Check::ok("cache", detail), Some(cache))
}
