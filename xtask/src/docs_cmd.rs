//! `docs`: the reference sections the code knows, written into the docs
//! (`kloop::session::docs`).

use std::process::ExitCode;

use anyhow::Result;

use crate::flags::*;
use crate::shared::exits;
use crate::shared::*;

impl Run for DocsArgs {
    fn run(self) -> Result<ExitCode> {
        docs(&self)
    }
}

/// Exit 0 when every section is current (or was rewritten), 1 with
/// --check when one is stale.
fn docs(a: &DocsArgs) -> Result<ExitCode> {
    let layout = layout();
    if a.check {
        let stale = kloop::session::docs::stale(&layout, &exits::sections())?;
        for (path, names, _) in &stale {
            println!(
                "kloop docs: {} is stale: {}",
                path.display(),
                names.join(", ")
            );
        }
        if stale.is_empty() {
            println!("kloop docs: every generated section is current");
        } else {
            println!("kloop docs: run `cargo xtask docs` to write them");
        }
        return Ok(exit_code(stale.is_empty()));
    }
    let written = kloop::session::docs::write(&layout, &exits::sections())?;
    for (path, names) in &written {
        println!(
            "kloop docs: wrote {} ({})",
            path.display(),
            names.join(", ")
        );
    }
    if written.is_empty() {
        println!("kloop docs: every generated section is current");
    }
    Ok(ExitCode::SUCCESS)
}
