//! What the `mutants` command can fail with.

use std::path::PathBuf;

use kloop_path_io::PathIo;

use super::data::MutantsError;

/// Reading the targets file or the tree's files it names.
#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path}: {detail}")]
    Targets { path: PathBuf, detail: String },
}

/// What the `mutants` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Mutants(#[from] Box<MutantsError>),
    #[error(transparent)]
    Mutate(#[from] MutateError),
    #[error("unpacking the source: {0}")]
    Source(#[source] kloop_kernels::build::BuildError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Notes(#[from] super::report::NotesError),
    #[error("no mutant {0} in this tree (see --list --max 1000)")]
    NoSuchMutant(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("reading the mutants run in {path}: {source} (a run directory past the newest KLOOP_KEEP_RUNS, default 10, is removed when a run starts; a run given --report left its data beside the report, e.g. docs/mutation-score.json for docs/mutation-score.md: pass that to --from, or judge the mutants again without --from)")]
    From {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("--resume reads {path}: {source}")]
    Resume {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("reading the shard data {path}: {source}")]
    Shard {
        path: PathBuf,
        #[source]
        source: Box<MutantsError>,
    },
    #[error("{path} judged against {kernel} ({source_id}), the first shard against {first_kernel} ({first_source}): not one mutation run")]
    ShardMismatch {
        path: PathBuf,
        kernel: String,
        source_id: String,
        first_kernel: String,
        first_source: String,
    },
    #[error("mutant {mutant} is in two shards ({path} and an earlier one)")]
    ShardTwice { mutant: String, path: PathBuf },
    #[error("no shard data given")]
    NoShards,
}
