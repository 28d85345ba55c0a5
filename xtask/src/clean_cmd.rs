//! `clean`: run directories, and on request saved VMs and fetched kernels.

use std::process::ExitCode;

use anyhow::Result;
use kloop::session::clean::{CacheCleaning, CleanOptions};

use crate::flags::*;
use crate::shared::*;

impl Run for CleanArgs {
    fn run(self) -> Result<ExitCode> {
        clean(self)
    }
}

fn clean(a: CleanArgs) -> Result<ExitCode> {
    let layout = layout();
    let opts = CleanOptions {
        keep: a.keep,
        cache: kloop_kernels::CleanParts {
            saved_vms: a.saved_vms,
            kernels: a.kernels,
        },
    };
    let c = kloop::session::clean::run(&layout, &opts);
    let (before, pruned) = (&c.before, &c.pruned);
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
    let cleaned = match c.cache {
        CacheCleaning::Cleaned(c) => c,
        CacheCleaning::InUse(in_use) => {
            eprintln!("kloop: {in_use}");
            return Ok(ExitCode::FAILURE);
        }
        CacheCleaning::NoCache(e) => return Err(e.into()),
    };
    for (path, bytes) in &cleaned.removed {
        println!(
            "kloop: removed {} ({:.1} MB)",
            path.display(),
            *bytes as f64 / 1e6
        );
    }
    for (path, e) in &cleaned.failed {
        eprintln!("kloop: could not remove {}: {e}", path.display());
    }
    Ok(exit_code(
        pruned.failed.is_empty() && cleaned.failed.is_empty(),
    ))
}
