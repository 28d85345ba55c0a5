//! Mutants of the kernel code that emits the records: what `cargo xtask
//! mutants` builds and judges to measure what kloop's suite would miss.
//!
//! [`Targets`] (`kernels/mutation-targets.toml`) names the files and
//! functions; [`generate`] applies every operator ([`operators`]) to each
//! function of a kernel tree, one mutant per change, each with its patch
//! (`patch -p1`, kept in the report); [`sample`] picks a balanced subset
//! when there are more than a run can afford. Knows nothing of builds or
//! VMs (the room that runs them is `run::mutants`).

pub mod c_source;
pub mod operators;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use operators::Operator;

#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Targets { path: PathBuf, detail: String },
}

/// The files and functions to mutate.
#[derive(Debug, Clone, Deserialize)]
pub struct Targets {
    #[serde(rename = "target")]
    pub targets: Vec<Target>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    /// Path in the kernel tree.
    pub file: String,
    pub functions: Vec<String>,
    /// When set, only statements and conditions that mention one of these.
    #[serde(default)]
    pub focus: Vec<String>,
}

impl Targets {
    pub fn load(path: &Path) -> Result<Targets, MutateError> {
        let text = std::fs::read_to_string(path).map_err(|source| MutateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| MutateError::Targets {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
    }

    /// Only the targets of these files (`--only`; empty keeps all).
    pub fn only(mut self, files: &[String]) -> Targets {
        if !files.is_empty() {
            self.targets
                .retain(|t| files.iter().any(|f| t.file.ends_with(f.as_str())));
        }
        self
    }
}

/// One mutant: a change to one function, as a patch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mutant {
    /// `core.c:perf_event_ksymbol:9431:drop-call`, unique within a run.
    pub id: String,
    pub file: String,
    pub function: String,
    /// 1-based line of the first change.
    pub line: usize,
    pub operator: Operator,
    pub what: String,
    /// Unified diff against the tree, for `patch -p1`.
    pub patch: String,
}

/// What [`generate`] found.
#[derive(Debug, Default)]
pub struct Generated {
    pub mutants: Vec<Mutant>,
    /// `file: function` the tree does not have (renamed, inlined away).
    pub missing: Vec<String>,
}

/// Every mutant of `targets` in the kernel tree at `tree`.
pub fn generate(tree: &Path, targets: &Targets) -> Result<Generated, MutateError> {
    let mut out = Generated::default();
    for t in &targets.targets {
        let path = tree.join(&t.file);
        let text = std::fs::read_to_string(&path).map_err(|source| MutateError::Read {
            path: path.clone(),
            source,
        })?;
        let mask = c_source::code_mask(&text);
        for function in &t.functions {
            let Some(body) = c_source::function_body(&text, &mask, function) else {
                out.missing.push(format!("{}: {function}", t.file));
                continue;
            };
            for edit in operators::edits(&text, &mask, body, &t.focus) {
                let first = edit.changes.iter().map(|(r, _)| r.start).min().unwrap_or(0);
                let line = text[..first].matches('\n').count() + 1;
                let mut mutated = text.clone();
                let mut changes = edit.changes.clone();
                changes.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
                for (r, new) in changes {
                    mutated.replace_range(r, &new);
                }
                // `events/core.c` and `bpf/core.c` must not share ids.
                let parts: Vec<&str> = t.file.rsplit('/').take(2).collect();
                let short = parts.into_iter().rev().collect::<Vec<_>>().join("/");
                let base_id = format!("{short}:{function}:{line}:{}", edit.operator.name());
                let n = out
                    .mutants
                    .iter()
                    .filter(|m| m.id.starts_with(&base_id))
                    .count();
                out.mutants.push(Mutant {
                    id: if n == 0 {
                        base_id
                    } else {
                        format!("{base_id}#{}", n + 1)
                    },
                    file: t.file.clone(),
                    function: function.clone(),
                    line,
                    operator: edit.operator,
                    what: edit.what,
                    patch: unified_diff(&t.file, &text, &mutated),
                });
            }
        }
    }
    Ok(out)
}

fn unified_diff(file: &str, before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{file}"), &format!("b/{file}"))
        .to_string()
}

/// At most `max` mutants, spread evenly: round-robin over files, and within
/// a file over operators, in source order; deterministic, so a rerun
/// judges the same mutants.
pub fn sample(mutants: &[Mutant], max: usize) -> Vec<Mutant> {
    use std::collections::BTreeMap;
    let mut by_file: BTreeMap<&str, BTreeMap<Operator, std::collections::VecDeque<&Mutant>>> =
        BTreeMap::new();
    for m in mutants {
        by_file
            .entry(m.file.as_str())
            .or_default()
            .entry(m.operator)
            .or_default()
            .push_back(m);
    }
    // Per file, the operators' queues taken in turn.
    let mut per_file: Vec<std::collections::VecDeque<&Mutant>> = by_file
        .into_values()
        .map(|mut ops| {
            let mut order = std::collections::VecDeque::new();
            loop {
                let mut any = false;
                for q in ops.values_mut() {
                    if let Some(m) = q.pop_front() {
                        order.push_back(m);
                        any = true;
                    }
                }
                if !any {
                    break order;
                }
            }
        })
        .collect();
    let mut out = Vec::new();
    while out.len() < max {
        let mut any = false;
        for q in per_file.iter_mut() {
            if out.len() >= max {
                break;
            }
            if let Some(m) = q.pop_front() {
                out.push(m.clone());
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mutant(file: &str, op: Operator, n: usize) -> Mutant {
        Mutant {
            id: format!("{file}:{op:?}:{n}"),
            file: file.into(),
            function: "f".into(),
            line: n,
            operator: op,
            what: String::new(),
            patch: String::new(),
        }
    }

    #[test]
    fn sample_spreads_over_files_and_operators() {
        let mut all = Vec::new();
        for n in 0..10 {
            all.push(mutant("a.c", Operator::DropCall, n));
            all.push(mutant("a.c", Operator::Constant, n));
        }
        all.push(mutant("b.c", Operator::SkipLast, 0));
        let s = sample(&all, 4);
        let ids: Vec<&str> = s.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "a.c:DropCall:0",
                "b.c:SkipLast:0",
                "a.c:Constant:0",
                "a.c:DropCall:1"
            ]
        );
        assert_eq!(sample(&all, 100).len(), all.len());
    }

    #[test]
    fn patches_apply_with_patch_p1() {
        let tree = tempfile::tempdir().unwrap();
        let file = "kernel/events/x.c";
        std::fs::create_dir_all(tree.path().join("kernel/events")).unwrap();
        let text =
            "static void out(void)\n{\n\tif (!match())\n\t\treturn;\n\tbegin();\n\tend();\n}\n";
        std::fs::write(tree.path().join(file), text).unwrap();
        let targets = Targets {
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
