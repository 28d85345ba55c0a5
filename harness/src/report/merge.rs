//! `merge`: the run directories of the N shards of one run (`vm-test
//! --shard K/N`) become one run directory with the reports of the whole
//! run, as if it had run on one machine.
//!
//! Each shard leaves `shard.json` ([`ShardManifest`]): the kloop commit,
//! its `K/N`, every trial of the unsharded run in plan order and its own.
//! Merging refuses shards that are not parts of the same run (another
//! commit, another trial list — other pins or scenarios —, another N) and
//! an incomplete or doubled set, naming what differs.

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::run::shard::Shard;
use crate::run::trial::TrialResult;

/// The file a shard's run directory holds.
pub const MANIFEST: &str = "shard.json";

/// What a shard says about itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardManifest {
    /// `git rev-parse HEAD` of the kloop checkout, `+dirty` when it had
    /// changes.
    pub kloop_commit: String,
    pub shard: Shard,
    /// Every trial id of the unsharded run, in plan order.
    pub trials: Vec<String>,
    /// This shard's trial ids.
    pub mine: Vec<String>,
}

/// Why shards could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(
        "{0} is not a shard's run directory (no {MANIFEST}): run `cargo xtask vm-test --shard K/N`"
    )]
    NotAShard(PathBuf),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("the shards are not parts of one run: {0}")]
    Mismatch(String),
    #[error("shard {missing} is missing (given: {given})")]
    Missing { missing: String, given: String },
    #[error("shard {shard} is given twice: {first} and {second}")]
    Twice {
        shard: Shard,
        first: PathBuf,
        second: PathBuf,
    },
}

/// A merged run.
#[derive(Debug)]
pub struct Merged {
    pub results: Vec<TrialResult>,
    pub shards: Vec<PathBuf>,
}

fn read(path: &Path, what: &'static str) -> Result<String, MergeError> {
    Ok(std::fs::read_to_string(path).at(what, path)?)
}

/// Reads and checks the shards, then copies each trial's directory into
/// `out` and returns the results in the unsharded run's plan order (their
/// artefact paths pointing into `out`). Reports are the caller's to write
/// (`report::write_files`, the KCIDB document).
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<Merged, MergeError> {
    let mut shards: Vec<(PathBuf, ShardManifest)> = Vec::new();
    for d in dirs {
        let path = d.join(MANIFEST);
        if !path.is_file() {
            return Err(MergeError::NotAShard(d.clone()));
        }
        let m: ShardManifest =
            serde_json::from_str(&read(&path, "reading")?).map_err(|e| MergeError::Invalid {
                path: path.clone(),
                message: e.to_string(),
            })?;
        shards.push((d.clone(), m));
    }
    check(&shards)?;
    let order = &shards[0].1.trials;
    let mut results: Vec<TrialResult> = Vec::new();
    for (dir, _) in &shards {
        let path = dir.join("results.jsonl");
        for (n, line) in read(&path, "reading")?.lines().enumerate() {
            let r: TrialResult = serde_json::from_str(line).map_err(|e| MergeError::Invalid {
                path: path.clone(),
                message: format!("line {}: {e}", n + 1),
            })?;
            results.push(r);
        }
    }
    results.sort_by_key(|r| order.iter().position(|t| t == &r.id).unwrap_or(usize::MAX));
    std::fs::create_dir_all(out).at("creating", out)?;
    for r in &mut results {
        let to = out.join(&r.kernel).join(&r.scenario);
        copy_dir(&r.artefacts, &to).at("copying the artefacts of", &r.artefacts)?;
        r.artefacts = to;
    }
    Ok(Merged {
        results,
        shards: shards.into_iter().map(|(d, _)| d).collect(),
    })
}

/// A merged run with its reports written.
#[derive(Debug)]
pub struct MergedRun {
    pub merged: Merged,
    /// The shards' A/B outcomes as one (`vm-test --baseline … --shard`).
    pub ab: Option<Vec<crate::judge::ab::AbOutcome>>,
    /// What was not written (a shard without a KCIDB document): told, not
    /// fatal.
    pub notes: Vec<String>,
}

/// [`merge`], then the whole run's reports in `out`: results, JUnit,
/// summary, the shards' KCIDB documents as one (its URLs pointing into
/// `out`) and, when the shards are parts of an A/B, their outcomes as one
/// `ab.json`.
pub fn merge_run(dirs: &[PathBuf], out: &Path) -> Result<MergedRun, MergeError> {
    let merged = merge(dirs, out)?;
    crate::report::write_files(out, &merged.results).at("writing reports into", out)?;
    let mut notes = Vec::new();
    let docs: Vec<crate::report::kcidb::Document> = merged
        .shards
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join(crate::report::kcidb::DOCUMENT_FILE)).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    if docs.len() == merged.shards.len() {
        let mut doc = crate::report::kcidb::merge_documents(&docs);
        let absolute = std::path::absolute(out).at("resolving", out)?;
        crate::report::kcidb::relocate(&mut doc, &absolute);
        let path = out.join(crate::report::kcidb::DOCUMENT_FILE);
        let text = serde_json::to_string_pretty(&doc).expect("a document serialises");
        std::fs::write(&path, text).at("writing", &path)?;
    } else {
        notes.push("a shard has no kcidb.json: the merged run has none".to_string());
    }
    let ab = merge_ab(&merged, out)?;
    Ok(MergedRun { merged, ab, notes })
}

/// Shards of an A/B: their `ab.json` outcomes as one, in the merged
/// trials' scenario order, written into `out`.
fn merge_ab(
    merged: &Merged,
    out: &Path,
) -> Result<Option<Vec<crate::judge::ab::AbOutcome>>, MergeError> {
    let mut docs: Vec<Vec<crate::judge::ab::AbOutcome>> = Vec::new();
    for d in &merged.shards {
        let path = d.join("ab.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        docs.push(
            serde_json::from_str(&text).map_err(|e| MergeError::Invalid {
                path,
                message: e.to_string(),
            })?,
        );
    }
    if docs.is_empty() {
        return Ok(None);
    }
    if docs.len() != merged.shards.len() {
        return Err(MergeError::Mismatch(
            "some shards are A/B runs (ab.json) and some are not".to_string(),
        ));
    }
    let mut outcomes: Vec<_> = docs.into_iter().flatten().collect();
    let order = |s: &str| {
        merged
            .results
            .iter()
            .position(|r| r.scenario == s)
            .unwrap_or(usize::MAX)
    };
    outcomes.sort_by_key(|o| order(&o.scenario));
    crate::report::ab::write_json(out, &outcomes).at("writing ab.json into", out)?;
    Ok(Some(outcomes))
}

/// Same commit, same N, same trial list; each K once; every trial in
/// exactly one shard.
fn check(shards: &[(PathBuf, ShardManifest)]) -> Result<(), MergeError> {
    let (first_dir, first) = shards
        .first()
        .ok_or_else(|| MergeError::Mismatch("no shard directories given".into()))?;
    for (dir, m) in &shards[1..] {
        if m.kloop_commit != first.kloop_commit {
            return Err(MergeError::Mismatch(format!(
                "{} ran kloop {}, {} ran kloop {}",
                first_dir.display(),
                first.kloop_commit,
                dir.display(),
                m.kloop_commit
            )));
        }
        if m.shard.count != first.shard.count {
            return Err(MergeError::Mismatch(format!(
                "{} is one of {} shards, {} one of {}",
                first_dir.display(),
                first.shard.count,
                dir.display(),
                m.shard.count
            )));
        }
        if m.trials != first.trials {
            let only = |a: &[String], b: &[String]| -> Vec<String> {
                a.iter()
                    .filter(|t| !b.contains(t))
                    .take(5)
                    .cloned()
                    .collect()
            };
            return Err(MergeError::Mismatch(format!(
                "{} and {} planned different trials (other pins or scenarios): only in the first: {:?}, only in the second: {:?}",
                first_dir.display(),
                dir.display(),
                only(&first.trials, &m.trials),
                only(&m.trials, &first.trials)
            )));
        }
    }
    let n = first.shard.count;
    for k in 1..=n {
        let with_k: Vec<&PathBuf> = shards
            .iter()
            .filter(|(_, m)| m.shard.index == k)
            .map(|(d, _)| d)
            .collect();
        match with_k.as_slice() {
            [] => {
                let given: Vec<String> = shards.iter().map(|(_, m)| m.shard.to_string()).collect();
                return Err(MergeError::Missing {
                    missing: format!("{k}/{n}"),
                    given: given.join(", "),
                });
            }
            [_] => {}
            [a, b, ..] => {
                return Err(MergeError::Twice {
                    shard: Shard { index: k, count: n },
                    first: (*a).clone(),
                    second: (*b).clone(),
                })
            }
        }
    }
    let mut covered: Vec<&String> = shards.iter().flat_map(|(_, m)| &m.mine).collect();
    covered.sort();
    let mut all: Vec<&String> = first.trials.iter().collect();
    all.sort();
    if covered != all {
        return Err(MergeError::Mismatch(
            "the shards' own trials do not add up to the planned trials (overlap or gap): were they partitioned with different --durations files?".into(),
        ));
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::trial::Verdict;

    fn shard_dir(
        root: &Path,
        k: usize,
        n: usize,
        trials: &[&str],
        mine: &[&str],
        commit: &str,
    ) -> PathBuf {
        let dir = root.join(format!("shard-{k}-of-{n}-{commit}"));
        std::fs::create_dir_all(&dir).unwrap();
        let m = ShardManifest {
            kloop_commit: commit.into(),
            shard: Shard { index: k, count: n },
            trials: trials.iter().map(|s| s.to_string()).collect(),
            mine: mine.iter().map(|s| s.to_string()).collect(),
        };
        std::fs::write(dir.join(MANIFEST), serde_json::to_string(&m).unwrap()).unwrap();
        let mut lines = String::new();
        for id in mine {
            let (kernel, scenario) = id.split_once('/').unwrap();
            let art = dir.join(kernel).join(scenario);
            std::fs::create_dir_all(&art).unwrap();
            std::fs::write(art.join("console.log"), id).unwrap();
            let r = TrialResult::for_test(kernel, scenario, Verdict::Ok, &art);
            lines.push_str(&serde_json::to_string(&r).unwrap());
            lines.push('\n');
        }
        std::fs::write(dir.join("results.jsonl"), lines).unwrap();
        dir
    }

    const ALL: [&str; 4] = ["6.1/basic", "6.1/subprogs", "7.3/basic", "7.3/subprogs"];

    #[test]
    fn two_shards_merge_in_plan_order_with_their_artefacts() {
        let root = tempfile::tempdir().unwrap();
        let a = shard_dir(root.path(), 1, 2, &ALL, &["6.1/basic", "7.3/basic"], "c1");
        let b = shard_dir(
            root.path(),
            2,
            2,
            &ALL,
            &["6.1/subprogs", "7.3/subprogs"],
            "c1",
        );
        let out = root.path().join("merged");
        let m = merge(&[b, a], &out).unwrap();
        let ids: Vec<&str> = m.results.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ALL);
        assert_eq!(
            std::fs::read_to_string(out.join("7.3/subprogs/console.log")).unwrap(),
            "7.3/subprogs"
        );
        assert!(m.results.iter().all(|r| r.artefacts.starts_with(&out)));
    }

    #[test]
    fn incomplete_doubled_and_foreign_shards_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("merged");
        let a = shard_dir(
            root.path(),
            1,
            3,
            &ALL,
            &["6.1/basic", "7.3/subprogs"],
            "c1",
        );
        let b = shard_dir(root.path(), 2, 3, &ALL, &["6.1/subprogs"], "c1");
        let e = merge(&[a.clone(), b.clone()], &out)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "shard 3/3 is missing (given: 1/3, 2/3)");
        let e = merge(&[a.clone(), b.clone(), a.clone()], &out)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("shard 1/3 is given twice"), "{e}");
        let other = shard_dir(root.path(), 3, 3, &ALL, &["7.3/basic"], "c2");
        let e = merge(&[a.clone(), b.clone(), other], &out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ran kloop c1") && e.contains("ran kloop c2"),
            "{e}"
        );
        let fewer = shard_dir(root.path(), 3, 3, &ALL[..3], &["7.3/basic"], "c1");
        let e = merge(&[a.clone(), b.clone(), fewer], &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("planned different trials"), "{e}");
        let e = merge(&[root.path().to_path_buf()], &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a shard's run directory"), "{e}");
    }
}
