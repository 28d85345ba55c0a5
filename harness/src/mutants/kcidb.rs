//! The mutation run's KCIDB document: each mutant's resolved outcome as
//! the status of its test in `report::kcidb`'s mutation document.

use crate::report::kcidb::{mutation_document, Document, MutantEntry, RunContext, Status};

use super::{MutantResult, MutantsBaseline, Outcome};

/// The mutation run's KCIDB document (`report::kcidb::mutation_document`):
/// each mutant's resolved outcome as its test's status.
pub fn mutation_run_document(
    base: &MutantsBaseline,
    results: &[MutantResult],
    source_identity: &str,
    ctx: &RunContext,
) -> Document {
    let entries: Vec<MutantEntry<'_>> = results
        .iter()
        .map(|r| {
            let outcome = r.resolved(results);
            let (status, detail) = match outcome {
                Outcome::Killed(why) => {
                    (Status::Fail, why.lines().next().unwrap_or("").to_string())
                }
                Outcome::Survived => (Status::Pass, "every scenario came out SAME".to_string()),
                Outcome::BuildFailed(why) => {
                    (Status::Miss, why.lines().next().unwrap_or("").to_string())
                }
                Outcome::CompilerEquivalent => {
                    (Status::Skip, "the unmutated object code".to_string())
                }
                Outcome::Duplicate(of) => (Status::Skip, format!("the object code of {of}")),
                Outcome::NotJudged(why) => {
                    (Status::Miss, why.lines().next().unwrap_or("").to_string())
                }
            };
            MutantEntry {
                id: &r.mutant.id,
                what: &r.mutant.what,
                patch: &r.mutant.patch,
                outcome: outcome.label(),
                detail,
                status,
                build_failed: matches!(outcome, Outcome::BuildFailed(_)),
                secs: r.build_secs + r.judge_secs,
            }
        })
        .collect();
    mutation_document(
        &base.source,
        source_identity,
        &base.kernel_id,
        &entries,
        ctx,
    )
}

#[cfg(test)]
mod tests {
    /// The KCIDB document of the real mutation run in
    /// docs/mutation-score.json (502 mutants of linux-source-6.12): one test
    /// per mutant, ids unique, killed mutants FAIL. Written to
    /// target/kloop/kcidb-samples/ for `.ci/run`'s kcidb-io validation.
    #[test]
    fn the_real_mutation_runs_document() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let (base, results) =
            crate::mutants::read_saved(&root.join("docs/mutation-score.json")).unwrap();
        let ctx = super::RunContext {
            kloop_commit: "0123456789abcdef0123456789abcdef01234567".into(),
            run: "mutation-score".into(),
        };
        let doc = super::mutation_run_document(
            &base,
            &results,
            "e849faf31ca3555757f3a8877cb01af92122f744f75d1f3102734651c4e14703",
            &ctx,
        );
        assert_eq!(doc.tests.len(), results.len());
        let mut ids: Vec<&str> = doc
            .tests
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), results.len(), "test ids are unique");
        let fails = doc.tests.iter().filter(|t| t["status"] == "FAIL").count();
        assert_eq!(
            fails, 407,
            "the killed mutants (docs/mutation-score.md's 407, duplicates with their original)"
        );
        let dir = root.join("target/kloop/kcidb-samples");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("mutation.json"),
            serde_json::to_string(&doc).unwrap(),
        )
        .unwrap();
    }
}
