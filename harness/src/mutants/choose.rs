//! Which mutants a run judges: the tree's files read for `kloop-mutate`
//! (the targets of `kernels/mutation-targets.toml`), the mutants named or
//! a balanced sample, a shard's part, less those `--resume` carries over
//! from the data beside the report.

use std::path::Path;

use kloop_mutate::{Generated, Mutant, Sources, Targets};
use kloop_path_io::PathIoExt;

use super::{
    data_beside, read_saved, settle_schema_overhead, unsettle_interrupted, CommandError, KillKind,
    MutantResult, MutateError, Outcome,
};

/// The targets file at `path` (`kernels/mutation-targets.toml`).
pub fn load_targets(path: &Path) -> Result<Targets, MutateError> {
    let text = std::fs::read_to_string(path).at("reading", path)?;
    toml::from_str(&text).map_err(|e| MutateError::Targets {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Every mutant of `targets` in the kernel tree at `tree`: the headers it
/// has and every target file read, in the targets' order (the first that
/// cannot be read is the error), then mutated.
pub fn generate(tree: &Path, targets: &Targets) -> Result<Generated, MutateError> {
    let mut sources = Sources {
        headers: targets
            .headers
            .iter()
            .filter_map(|h| std::fs::read_to_string(tree.join(h)).ok())
            .collect(),
        ..Sources::default()
    };
    for t in &targets.targets {
        if sources.files.contains_key(&t.file) {
            continue;
        }
        let path = tree.join(&t.file);
        let text = std::fs::read_to_string(&path).at("reading", &path)?;
        sources.files.insert(t.file.clone(), text);
    }
    Ok(kloop_mutate::generate(&sources, targets))
}

/// Those named in `named` (each must exist), else a balanced sample of at
/// most `max`.
pub fn named_or_sampled(
    named: &[String],
    max: usize,
    generated: &[Mutant],
) -> Result<Vec<Mutant>, CommandError> {
    if named.is_empty() {
        return Ok(kloop_mutate::sample(generated, max));
    }
    if let Some(id) = named
        .iter()
        .find(|id| !generated.iter().any(|m| &m.id == *id))
    {
        return Err(CommandError::NoSuchMutant(id.clone()));
    }
    Ok(generated
        .iter()
        .filter(|m| named.contains(&m.id))
        .cloned()
        .collect())
}

/// Shard `shard`'s part of `mutants` (by count, in id order), with the
/// note saying so.
pub fn shard_of(mutants: Vec<Mutant>, shard: crate::run::shard::Shard) -> (Vec<Mutant>, String) {
    let ids: Vec<String> = mutants.iter().map(|m| m.id.clone()).collect();
    let (mine, _) = crate::run::shard::select(&ids, shard, &Default::default());
    let note = format!("shard {shard}: {} of {} mutant(s)", mine.len(), ids.len());
    (mine.into_iter().map(|i| mutants[i].clone()).collect(), note)
}

/// `--resume` of `report`: the results in the data beside it that decided
/// a mutant among `chosen` (with `again_survivors`, not the survivors) are
/// taken out of it and returned.
pub fn resumed(
    report: &Path,
    again_survivors: bool,
    chosen: &mut Vec<Mutant>,
    notes: &mut Vec<String>,
) -> Result<Vec<MutantResult>, CommandError> {
    let carried: Vec<MutantResult> = carried_over(report, chosen)?
        .into_iter()
        .filter(|r| !(again_survivors && r.outcome == Outcome::Survived))
        .collect();
    if !carried.is_empty() {
        chosen.retain(|m| !carried.iter().any(|r| r.mutant.id == m.id));
        notes.push(format!(
            "resuming: {} mutant(s) decided in {}, {} left",
            carried.len(),
            data_beside(report).display(),
            chosen.len()
        ));
    }
    Ok(carried)
}

/// The results in the data beside `report` that decided a mutant among
/// `chosen` (not those left not judged); none when there is no data yet.
fn carried_over(report: &Path, chosen: &[Mutant]) -> Result<Vec<MutantResult>, CommandError> {
    let data = data_beside(report);
    if !data.is_file() {
        return Ok(Vec::new());
    }
    let (base, mut results) = read_saved(&data).map_err(|source| CommandError::Resume {
        path: data.clone(),
        source: Box::new(source),
    })?;
    settle_schema_overhead(&base, &mut results);
    unsettle_interrupted(&mut results);
    Ok(results
        .into_iter()
        .filter(|r| !matches!(r.outcome, Outcome::NotJudged(_)))
        // A kill by the diff only from before diffs were confirmed may be
        // a scenario's own noise: judged again.
        .filter(|r| r.killed_by != Some(KillKind::Diff) || r.confirmed_diff)
        .filter(|r| {
            chosen
                .iter()
                .any(|m| m.id == r.mutant.id && m.patch == r.mutant.patch)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{base, result};
    use super::super::write_saved;
    use super::*;
    use kloop_mutate::{Operator, Target};

    /// `--resume` carries what the data beside the report decided for the
    /// chosen mutants with the same patch: not a mutant left not judged,
    /// not a kill by an unconfirmed diff, not one whose patch changed.
    #[test]
    fn resume_carries_only_what_was_decided_for_the_same_patch() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("score.md");
        let mut unconfirmed = result("diff", Outcome::Killed("basic: CHANGED".into()));
        unconfirmed.killed_by = Some(KillKind::Diff);
        let mut by_rule = result("rule", Outcome::Killed("basic: BROKEN".into()));
        by_rule.killed_by = Some(KillKind::Rule);
        let saved = vec![
            result("survived", Outcome::Survived),
            result("not-judged", Outcome::NotJudged("interrupted".into())),
            unconfirmed,
            by_rule,
            result("patch-changed", Outcome::Survived),
        ];
        write_saved(&data_beside(&report), &base("k1", dir.path()), &saved).unwrap();
        let chosen: Vec<Mutant> = saved
            .iter()
            .map(|r| {
                let mut m = r.mutant.clone();
                if m.id == "patch-changed" {
                    m.patch = "another patch".into();
                }
                m
            })
            .collect();
        let carried = carried_over(&report, &chosen).unwrap();
        let ids: Vec<_> = carried.iter().map(|r| r.mutant.id.as_str()).collect();
        assert_eq!(ids, ["survived", "rule"]);
        assert!(carried_over(&dir.path().join("none.md"), &chosen)
            .unwrap()
            .is_empty());
    }

    /// The patches of generated mutants apply with `patch -p1`, and a
    /// target function the tree lacks is reported missing.
    #[test]
    fn patches_apply_with_patch_p1() {
        let tree = tempfile::tempdir().unwrap();
        let file = "kernel/events/x.c";
        std::fs::create_dir_all(tree.path().join("kernel/events")).unwrap();
        let text =
            "static void out(void)\n{\n\tif (!match())\n\t\treturn;\n\tbegin();\n\tend();\n}\n";
        std::fs::write(tree.path().join(file), text).unwrap();
        let targets = Targets {
            headers: vec![],
            targets: vec![Target {
                file: file.into(),
                functions: vec!["out".into(), "gone".into()],
                focus: vec![],
            }],
        };
        let g = generate(tree.path(), &targets).unwrap();
        assert_eq!(g.missing, ["kernel/events/x.c: gone"]);
        let swap = g
            .mutants
            .iter()
            .find(|m| m.operator == Operator::SwapCalls)
            .unwrap();
        assert_eq!(swap.line, 5);
        let status = std::process::Command::new("patch")
            .args(["-p1", "--quiet"])
            .current_dir(tree.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(swap.patch.as_bytes())?;
                c.wait()
            })
            .unwrap();
        assert!(status.success(), "patch refused:\n{}", swap.patch);
        let after = std::fs::read_to_string(tree.path().join(file)).unwrap();
        assert!(after.contains("\tend();\n\tbegin();\n"), "{after}");
    }
}
