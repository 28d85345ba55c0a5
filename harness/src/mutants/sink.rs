//! The files a mutants run writes after every mutant (the Markdown
//! report, its data, the KCIDB document) and the runs it writes them
//! again from without judging: an earlier run (`--from`) or the shards'
//! data merged (`--merge`).

use std::path::{Path, PathBuf};

use kloop_kernels::build::BuildRequest;
use kloop_kernels::KernelCache;
use kloop_path_io::PathIoExt;

use super::report::Notes;
use super::{
    data_beside, judging_order, read_saved, settle_schema_overhead, unsettle_interrupted,
    write_saved, CommandError, MutantResult, MutantsBaseline, MutantsError, Phases, BASELINE_FILE,
    RESULTS_FILE,
};
use crate::run::suite;
use crate::scenario::Scenario;
use crate::workspace::Layout;

/// Where the report and its data go, and what the report says besides the
/// results.
pub struct Sink<'a> {
    pub root: &'a Path,
    pub report: Option<PathBuf>,
    pub generated: usize,
    pub missing: Vec<String>,
    pub notes: Notes,
    pub command: String,
}

/// The baseline and the results of the mutants run in `run_dir`, for a
/// report written again without judging (new notes, say); `run_dir` may
/// also be the [`SavedRun`] file written beside a report. A run from
/// before [`BASELINE_FILE`] existed has its baseline put together from
/// what it left: the unmutated kernel `base_req` builds (a cache hit), the
/// scenarios whose baseline trials are in the run directory, in judging
/// order, and the accelerator their results name.
pub fn read_run(
    layout: &Layout,
    base_req: &BuildRequest,
    run_dir: &Path,
) -> Result<(MutantsBaseline, Vec<MutantResult>), MutantsError> {
    if run_dir.is_file() {
        return read_saved(run_dir);
    }
    let read = |name: &str| {
        let path = run_dir.join(name);
        std::fs::read(&path).map_err(|e| MutantsError::Read {
            path: path.clone(),
            why: e.to_string(),
        })
    };
    let parse_error = |name: &str, e: serde_json::Error| MutantsError::Read {
        path: run_dir.join(name),
        why: e.to_string(),
    };
    let results: Vec<MutantResult> =
        serde_json::from_slice(&read(RESULTS_FILE)?).map_err(|e| parse_error(RESULTS_FILE, e))?;
    if run_dir.join(BASELINE_FILE).is_file() {
        let mut base: MutantsBaseline = serde_json::from_slice(&read(BASELINE_FILE)?)
            .map_err(|e| parse_error(BASELINE_FILE, e))?;
        base.run_dir = run_dir.to_path_buf();
        return Ok((base, results));
    }
    let cache = KernelCache::default_location()?;
    let baseline = kloop_kernels::build::build(&cache, base_req, &mut |_| {})
        .map_err(MutantsError::Baseline)?;
    let trials = run_dir.join(format!("built-{}", baseline.record.id));
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(suite::SuiteError::from)?;
    let ran: Vec<Scenario> = all
        .into_iter()
        .filter(|s| trials.join(&s.name).join("result.json").is_file())
        .collect();
    if ran.is_empty() {
        return Err(MutantsError::Read {
            path: trials,
            why: "no baseline trial results: not the run directory of this source's mutants".into(),
        });
    }
    let scenarios: Vec<String> = judging_order(ran).into_iter().map(|s| s.name).collect();
    let first = trials.join(&scenarios[0]).join("result.json");
    let accel = std::fs::read(&first)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["accel"].as_str().map(str::to_owned))
        .ok_or_else(|| MutantsError::Read {
            path: first.clone(),
            why: "no accel in the baseline trial's result".into(),
        })?;
    let base = MutantsBaseline {
        source: baseline.record.source.clone(),
        kernel_id: baseline.record.id.clone(),
        release: baseline.record.release.clone(),
        scenarios,
        accel,
        run_dir: run_dir.to_path_buf(),
        phases: Phases::default(),
    };
    Ok((base, results))
}

/// `--from`: the results of the run in `run_dir` (or of the data a
/// report left), settled as a report shows them.
pub fn from_run(
    layout: &Layout,
    base_req: &BuildRequest,
    run_dir: &Path,
) -> Result<(MutantsBaseline, Vec<MutantResult>), CommandError> {
    let (base, mut results) =
        read_run(layout, base_req, run_dir).map_err(|source| CommandError::From {
            path: run_dir.to_path_buf(),
            source: Box::new(source),
        })?;
    settle_schema_overhead(&base, &mut results);
    unsettle_interrupted(&mut results);
    Ok((base, results))
}

/// `--merge`: the shards' data as one. The shards must have judged against
/// one baseline (same source, same unmutated kernel, same scenarios) and
/// no mutant twice; shard order, as given: a report's "carried" count and
/// its phases are the first shard's (each shard built its own schema
/// kernel).
pub fn merge_shards(
    data: &[PathBuf],
) -> Result<(MutantsBaseline, Vec<MutantResult>), CommandError> {
    let mut base: Option<MutantsBaseline> = None;
    let mut all: Vec<MutantResult> = Vec::new();
    for path in data {
        let (b, results) = read_saved(path).map_err(|source| CommandError::Shard {
            path: path.clone(),
            source: Box::new(source),
        })?;
        if let Some(first) = &base {
            if (&first.source, &first.kernel_id, &first.scenarios)
                != (&b.source, &b.kernel_id, &b.scenarios)
            {
                return Err(CommandError::ShardMismatch {
                    path: path.clone(),
                    kernel: b.kernel_id,
                    source_id: b.source,
                    first_kernel: first.kernel_id.clone(),
                    first_source: first.source.clone(),
                });
            }
        }
        for r in results {
            if all.iter().any(|x| x.mutant.id == r.mutant.id) {
                return Err(CommandError::ShardTwice {
                    mutant: r.mutant.id,
                    path: path.clone(),
                });
            }
            all.push(r);
        }
        base.get_or_insert(b);
    }
    Ok((base.ok_or(CommandError::NoShards)?, all))
}

impl Sink<'_> {
    /// Made before any mutant is judged: a report that cannot be written
    /// is found now, not after the run.
    pub fn prepare(&self) -> Result<(), CommandError> {
        if let Some(parent) = self
            .report
            .as_deref()
            .and_then(Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).at("creating (where --report goes)", parent)?;
        }
        Ok(())
    }

    pub fn report_path(&self, base: &MutantsBaseline) -> PathBuf {
        self.report
            .clone()
            .unwrap_or_else(|| base.run_dir.join("mutation-score.md"))
    }

    /// The data that outlives the run directory: beside a --report, else
    /// the run directory's own mutants.json.
    pub fn data_path(&self, base: &MutantsBaseline) -> PathBuf {
        match &self.report {
            Some(report) => data_beside(report),
            None => base.run_dir.join(RESULTS_FILE),
        }
    }

    /// The report, the data and the KCIDB document, rewritten after every
    /// mutant.
    pub fn write(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
    ) -> Result<(), CommandError> {
        let md = super::report::markdown(
            base,
            results,
            self.generated,
            &self.missing,
            &self.notes,
            &self.command,
        );
        // A run directory is there while its run judges; --from a
        // report's data file may name one long pruned.
        if base.run_dir.is_dir() {
            let json = base.run_dir.join(RESULTS_FILE);
            let text = serde_json::to_vec_pretty(results).expect("results serialise");
            std::fs::write(&json, text).at("writing", &json)?;
        }
        if self.report.is_some() {
            write_saved(&self.data_path(base), base, results).map_err(Box::new)?;
        }
        let report = self.report_path(base);
        std::fs::write(&report, md).at("writing", &report)?;
        self.write_kcidb(base, results, &report)
    }

    /// The run's KCIDB document beside the report (`<report>.kcidb.json`).
    fn write_kcidb(
        &self,
        base: &MutantsBaseline,
        results: &[MutantResult],
        report: &Path,
    ) -> Result<(), CommandError> {
        let identity = kloop_kernels::KernelCache::default_location()
            .ok()
            .and_then(|c| kloop_kernels::build::lookup(&c, &base.kernel_id).ok())
            .map(|k| k.record.source_identity)
            .unwrap_or_else(|| base.source.clone());
        let ctx = crate::report::kcidb::RunContext::of_run(self.root, &base.run_dir);
        let doc = super::kcidb::mutation_run_document(base, results, &identity, &ctx);
        let path = report.with_extension("kcidb.json");
        let text = serde_json::to_string(&doc).expect("a document serialises");
        std::fs::write(&path, text).at("writing", &path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{base, result};
    use super::super::Outcome;
    use super::*;

    /// Shards of one run merge in the order given; shards judged against
    /// another unmutated kernel, or holding one mutant twice, are refused
    /// naming the shard.
    #[test]
    fn merging_shards_checks_they_are_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let shard = |name: &str, kernel: &str, ids: &[&str]| {
            let path = dir.path().join(name);
            let results: Vec<_> = ids.iter().map(|i| result(i, Outcome::Survived)).collect();
            write_saved(&path, &base(kernel, dir.path()), &results).unwrap();
            path
        };
        let a = shard("a.json", "k1", &["m1", "m2"]);
        let b = shard("b.json", "k1", &["m3"]);
        let (merged_base, all) = merge_shards(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(merged_base.kernel_id, "k1");
        let ids: Vec<_> = all.iter().map(|r| r.mutant.id.as_str()).collect();
        assert_eq!(ids, ["m1", "m2", "m3"]);

        let other = shard("c.json", "k2", &["m4"]);
        let err = merge_shards(&[a.clone(), other]).unwrap_err();
        assert!(
            matches!(err, CommandError::ShardMismatch { ref path, .. } if path.ends_with("c.json")),
            "{err}"
        );
        let twice = shard("d.json", "k1", &["m2"]);
        let err = merge_shards(&[a, twice]).unwrap_err();
        assert!(
            matches!(err, CommandError::ShardTwice { ref mutant, .. } if mutant == "m2"),
            "{err}"
        );
        assert!(matches!(
            merge_shards(&[]).unwrap_err(),
            CommandError::NoShards
        ));
    }
}
