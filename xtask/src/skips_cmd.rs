//! `cargo xtask skips`: which pin × scenario is expected to be SKIPPED
//! (`kernels/expected-skips.toml`), derived from each scenario's
//! `requires` and each pin's config and release
//! (`kloop::scenario::skips`).

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::flags::*;
use crate::shared::*;

impl Run for SkipsArgs {
    fn run(self) -> Result<ExitCode> {
        skips(self)
    }
}

/// Exit 0 when the file holds the derived list (or was rewritten), 1 when
/// it differs, 2 on a setup error.
fn skips(a: SkipsArgs) -> Result<ExitCode> {
    let layout = layout();
    let d = kloop::session::skips::derive(&layout, &a.fetch.options())?;
    for p in &d.problems {
        println!("skips: {p}");
    }
    let path = layout.kernels().join(kloop::scenario::skips::FILE);
    if a.write {
        if !d.problems.is_empty() {
            println!(
                "skips: {} problem(s) above: fix them by hand first",
                d.problems.len()
            );
            return Ok(ExitCode::from(1));
        }
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, d.text()).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("renaming onto {}", path.display()))?;
        println!(
            "skips: wrote {} expected skip(s) into {}",
            d.expected.skips.len(),
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if d.matches() {
        println!(
            "skips: {} holds the {} expected skip(s) the pins' configs and releases derive",
            path.display(),
            d.expected.skips.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for line in judge_diff(&d.committed.render(), &d.text()) {
        println!("{line}");
    }
    println!(
        "skips: {} differs from what the pins' configs and releases derive (- file, + derived); \
         `cargo xtask skips --write` rewrites it",
        path.display()
    );
    Ok(ExitCode::from(1))
}
