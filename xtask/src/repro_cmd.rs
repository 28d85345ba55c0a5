//! `repro RUN/TRIAL`: a reproducer directory for one trial.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::report::repro;

use crate::layout;

pub(crate) fn repro(trial: String, out: Option<PathBuf>) -> Result<ExitCode> {
    let layout = layout();
    let dir = repro::trial_dir(&layout, &trial)?;
    let out = out.unwrap_or_else(|| {
        let name: Vec<String> = dir
            .components()
            .rev()
            .take(3)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        layout.root.join("target/kloop/repro").join(name.join("-"))
    });
    let written = repro::write(&layout, &dir, &out)
        .with_context(|| format!("writing a reproducer of {}", dir.display()))?;
    println!(
        "kloop: reproducer of {} in {}: {}",
        dir.display(),
        written.dir.display(),
        written.files.join(", ")
    );
    println!(
        "kloop: run it with {}/run.sh (needs only qemu-system-x86_64), then ./show-records.py data.bin; report.txt is the text for a mailing list",
        written.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
