//! `clean`: run directories, and on request saved VMs and fetched kernels.

use std::process::ExitCode;

use anyhow::Result;
use kloop::run::run_dirs;
use kloop_kernels::KernelCache;

use crate::{layout, CleanArgs};

pub(crate) fn clean(a: CleanArgs) -> Result<ExitCode> {
    let layout = layout();
    let report_dir = layout.root.join("target/kloop/report");
    let before = run_dirs::list(&layout.runs());
    let pruned = run_dirs::prune(&layout.runs(), a.keep, &report_dir);
    let live = before.iter().filter(|r| r.live).count();
    println!(
        "kloop: removed {} run director{} ({:.1} MB) under {}; kept {}{}",
        pruned.removed.len(),
        if pruned.removed.len() == 1 {
            "y"
        } else {
            "ies"
        },
        pruned.bytes as f64 / 1e6,
        layout.runs().display(),
        before.len() - pruned.removed.len(),
        if live > 0 {
            format!(" ({live} still running)")
        } else {
            String::new()
        }
    );
    for (path, e) in &pruned.failed {
        eprintln!("kloop: could not remove {}: {e}", path.display());
    }
    let cache = KernelCache::default_location()?;
    let mut cache_dirs = Vec::new();
    if a.saved_vms {
        cache_dirs.push("saved-vms");
    }
    if a.kernels {
        // What a fetch makes again from the mirror; built kernels and
        // unpacked sources (hours of compiling) stay.
        cache_dirs.extend(["debs", "images", "vmlinux", "configs", "tmp", "rejected"]);
    }
    let users = kloop_kernels::lock::live_users(cache.root());
    if !cache_dirs.is_empty() && !users.is_empty() {
        eprintln!(
            "kloop: not removing {} from {}: in use by {}; run `cargo xtask clean` again when they end",
            cache_dirs.join(", "),
            cache.root().display(),
            users.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    for d in cache_dirs {
        let path = cache.root().join(d);
        if !path.exists() {
            continue;
        }
        let bytes = run_dirs::dir_bytes(&path);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => println!(
                "kloop: removed {} ({:.1} MB)",
                path.display(),
                bytes as f64 / 1e6
            ),
            Err(e) => eprintln!("kloop: could not remove {}: {e}", path.display()),
        }
    }
    Ok(if pruned.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
