//! Mutation testing's room: which mutants a run judges ([`choose`]),
//! building and judging them ([`judge`], [`compile`]), what was decided
//! and the files that keep it ([`data`]), and the score's Markdown report
//! ([`report`]), KCIDB document ([`kcidb`]) and files written after every
//! mutant, `--from` and `--merge` included ([`sink`]). The mutants
//! themselves (operators, schemata, the C source) are the crate
//! `kloop-mutate`'s; `session::mutants` is the command's entry point.
//!
//! A feature room between `session` and `report`: it imports `report`,
//! `run`, `scenario` and the judge; nothing below it imports it.

pub mod choose;
pub mod compile;
pub mod data;
pub mod judge;
pub mod kcidb;
pub mod report;
pub mod sink;

use std::path::PathBuf;

pub use data::*;
pub use judge::{judge_all, judging_order, Phases, Strategy};

/// What the `mutants` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Mutants(#[from] Box<MutantsError>),
    #[error(transparent)]
    Mutate(#[from] choose::MutateError),
    #[error("unpacking the source: {0}")]
    Source(#[source] kloop_kernels::build::BuildError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Notes(#[from] report::NotesError),
    #[error("no mutant {0} in this tree (see --list --max 1000)")]
    NoSuchMutant(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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

fn io(what: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CommandError {
    let path = path.to_path_buf();
    move |source| CommandError::Io { what, path, source }
}

/// Test fixtures shared by the room's files.
#[cfg(test)]
mod fixtures {
    use std::path::Path;

    use kloop_mutate::Mutant;

    use super::{MutantResult, MutantsBaseline, Outcome};

    pub fn base(kernel_id: &str, run_dir: &Path) -> MutantsBaseline {
        MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: kernel_id.into(),
            release: "6.12.57".into(),
            scenarios: vec!["basic".into()],
            accel: "tcg".into(),
            run_dir: run_dir.to_path_buf(),
            phases: Default::default(),
        }
    }

    pub fn result(id: &str, outcome: Outcome) -> MutantResult {
        MutantResult {
            outcome,
            ..MutantResult::new(&Mutant {
                id: id.into(),
                file: "kernel/events/core.c".into(),
                function: "perf_event_ksymbol".into(),
                line: 1,
                operator: kloop_mutate::Operator::DropCall,
                what: "drop the call".into(),
                patch: format!("patch of {id}"),
            })
        }
    }
}
