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
mod error;
pub mod judge;
pub mod kcidb;
pub mod report;
pub mod sink;

pub use data::*;
pub use error::{CommandError, MutateError};
pub use judge::{judge_all, judging_order};

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
