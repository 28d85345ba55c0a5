//! `merge DIR…`: the run directories of one run's shards joined into one
//! run directory with the whole run's reports ([`crate::report::merge`]).

use std::path::PathBuf;

use crate::report::merge::{MergeError, MergedRun};
use crate::report::Summary;
use crate::workspace::Layout;

/// What `merge` is asked.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// The shards' run directories.
    pub dirs: Vec<PathBuf>,
    /// Where the merged run goes; `None`: a new run directory.
    pub out: Option<PathBuf>,
}

/// The merged run: where it is, what it holds, and its summary.
#[derive(Debug)]
pub struct Merge {
    pub out: PathBuf,
    pub run: MergedRun,
    pub summary: Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum MergeRunError {
    /// No new run directory could be made.
    #[error(transparent)]
    RunDir(std::io::Error),
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// Joins the shards into `opts.out` (or a new run directory).
pub fn run(layout: &Layout, opts: &MergeOptions) -> Result<Merge, MergeRunError> {
    let out = match &opts.out {
        Some(o) => o.clone(),
        None => crate::workspace::new_run_dir(&layout.runs()).map_err(MergeRunError::RunDir)?,
    };
    let run = crate::report::merge::merge_run(&opts.dirs, &out)?;
    let summary = Summary::of(&run.merged.results);
    Ok(Merge { out, run, summary })
}
