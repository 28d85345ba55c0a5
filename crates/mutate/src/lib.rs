#![warn(missing_docs)]
//! Mutants of the kernel code that emits the records: what `cargo xtask
//! mutants` builds and judges to measure what kloop's suite would miss.
//!
//! [`Targets`] (`kernels/mutation-targets.toml`) names the files and
//! functions; [`generate`] applies every operator ([`operators`]) to each
//! function of the files' texts ([`Sources`]), one mutant per change, each
//! with its patch (`patch -p1`, kept in the report); [`sample`] picks a
//! balanced subset when there are more than a run can afford. Text in,
//! mutants out: reading the tree, builds and VMs are the harness's
//! (`harness/src/mutants/`).

pub mod c_source;
pub mod operands;
pub mod operators;
pub mod schema;

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

pub use operators::Operator;

/// The files and functions to mutate.
#[derive(Debug, Clone, Deserialize)]
pub struct Targets {
    /// Headers (paths in the tree) whose enums are the constant families
    /// of `replace-constant`; a header the tree lacks is skipped.
    #[serde(default)]
    pub headers: Vec<String>,
    /// The files and their functions (`[[target]]`).
    #[serde(rename = "target")]
    pub targets: Vec<Target>,
}

/// One file to mutate and the functions in it.
#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    /// Path in the kernel tree.
    pub file: String,
    /// The functions of `file` to mutate.
    pub functions: Vec<String>,
    /// When set, only statements and conditions that mention one of these.
    #[serde(default)]
    pub focus: Vec<String>,
}

impl Targets {
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
    /// Path in the kernel tree.
    pub file: String,
    /// The function it changes.
    pub function: String,
    /// 1-based line of the first change.
    pub line: usize,
    /// The operator that made it.
    pub operator: Operator,
    /// The change, in words (`a → b in `…``).
    pub what: String,
    /// Unified diff against the tree, for `patch -p1`.
    pub patch: String,
}

/// What [`generate`] found.
#[derive(Debug, Default)]
pub struct Generated {
    /// In target order, ids unique.
    pub mutants: Vec<Mutant>,
    /// `file: function` the tree does not have (renamed, inlined away).
    pub missing: Vec<String>,
}

/// The texts [`generate`] mutates, read from the kernel tree by the caller.
#[derive(Debug, Default)]
pub struct Sources {
    /// The texts of the [`Targets::headers`] the tree has.
    pub headers: Vec<String>,
    /// Each target file's text, by its path in the tree.
    pub files: BTreeMap<String, String>,
}

/// Every mutant of `targets` in `sources`. Two edits that
/// make the same file are one mutant (the first operator's): the operand
/// operators overlap the older constant operator in places. A file
/// `sources` lacks has none of its functions ([`Generated::missing`]).
pub fn generate(sources: &Sources, targets: &Targets) -> Generated {
    let mut out = Generated::default();
    let mut scope = operands::Scope::with_headers(sources.headers.iter().map(String::as_str));
    let mut work = file_work(sources, targets, &mut out.missing);
    // The operand operators draw their replacements from every target, so
    // the scope is complete before any edit is made.
    for w in &mut work {
        let per_function: Vec<_> = w.functions.iter().map(|f| f.2.clone()).collect();
        w.scope = operands::FileScope::new(&w.text, &w.mask, &per_function);
        scope.add_used(&w.scope);
    }
    let mut seen = std::collections::HashSet::new();
    for w in &work {
        let text = &w.text;
        for (n, (function, body, spans, focus)) in w.functions.iter().enumerate() {
            let mut edits = operators::edits(text, &w.mask, body.clone(), focus);
            edits.extend(operands::edits(
                text,
                &w.mask,
                (n, body.clone()),
                spans,
                &scope,
                &w.scope,
            ));
            for edit in edits {
                let first = edit.changes.iter().map(|(r, _)| r.start).min().unwrap_or(0);
                let line = text[..first].matches('\n').count() + 1;
                let mutated = apply_keeping_lines(text, &edit.changes);
                if mutated == *text || !seen.insert((w.file.clone(), mutated.clone())) {
                    continue;
                }
                let base_id = format!(
                    "{}:{function}:{line}:{}",
                    short_path(&w.file),
                    edit.operator.name()
                );
                out.mutants.push(Mutant {
                    id: unique_id(&out.mutants, base_id),
                    file: w.file.clone(),
                    function: function.clone(),
                    line,
                    operator: edit.operator,
                    what: edit.what,
                    patch: unified_diff(&w.file, text, &mutated),
                });
            }
        }
    }
    out
}

/// One target file: its text, and per target function its body and its
/// code in scope.
struct FileWork {
    file: String,
    text: String,
    mask: Vec<bool>,
    /// Name, body, code in scope, focus.
    functions: Vec<Function>,
    scope: operands::FileScope,
}

type Function = (String, Range<usize>, Vec<Range<usize>>, Vec<String>);

/// Each file of `targets` once, with the bodies of its target functions;
/// those it lacks go to `missing` (`file: function`).
fn file_work(sources: &Sources, targets: &Targets, missing: &mut Vec<String>) -> Vec<FileWork> {
    let mut work: Vec<FileWork> = Vec::new();
    for t in &targets.targets {
        // Several targets may name one file (with different focus): one
        // scope for the file.
        let at = match work.iter().position(|w| w.file == t.file) {
            Some(at) => at,
            None => {
                let text = sources.files.get(&t.file).cloned().unwrap_or_default();
                let mask = c_source::code_mask(&text);
                work.push(FileWork {
                    file: t.file.clone(),
                    text,
                    mask,
                    functions: Vec::new(),
                    scope: operands::FileScope::default(),
                });
                work.len() - 1
            }
        };
        let w = &mut work[at];
        for function in &t.functions {
            let Some(body) = c_source::function_body(&w.text, &w.mask, function) else {
                missing.push(format!("{}: {function}", t.file));
                continue;
            };
            let spans = operands::focused_spans(&w.text, &w.mask, body.clone(), &t.focus);
            w.functions
                .push((function.clone(), body, spans, t.focus.clone()));
        }
    }
    work
}

/// The last two components of `file`: `events/core.c` and `bpf/core.c`
/// must not share ids.
fn short_path(file: &str) -> String {
    let parts: Vec<&str> = file.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// `base_id`, or `base_id#N` when `mutants` already has N - 1 of it.
fn unique_id(mutants: &[Mutant], base_id: String) -> String {
    let n = mutants
        .iter()
        .filter(|m| m.id == base_id || m.id.starts_with(&format!("{base_id}#")))
        .count();
    if n == 0 {
        base_id
    } else {
        format!("{base_id}#{}", n + 1)
    }
}

/// `text` with `changes` made, every line after them where it was: a
/// change that takes lines away is padded with newlines, and a moved
/// statement (`swap-calls`) is put on one line when it would add lines.
/// `__LINE__` (WARN_ON's bug table) then stays the same in the rest of
/// the file, so an object file that differs from the original's differs
/// in code (the compiler-equivalence check compares them).
pub fn apply_keeping_lines(text: &str, changes: &[(Range<usize>, String)]) -> String {
    let mut changes = changes.to_vec();
    changes.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = text.to_string();
    for (r, new) in changes {
        let had = text[r.clone()].matches('\n').count();
        let mut new = new;
        if new.matches('\n').count() > had && !new.contains("//") {
            new = new.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        let has = new.matches('\n').count();
        if has < had {
            new.push_str(&"\n".repeat(had - has));
        }
        out.replace_range(r, &new);
    }
    out
}

/// `text` with each of `changes` made (byte ranges of `text`, which do
/// not overlap), the last first so that the earlier ranges stay valid.
pub fn apply(text: &str, changes: &[(Range<usize>, String)]) -> String {
    let mut changes = changes.to_vec();
    changes.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = text.to_string();
    for (r, new) in changes {
        out.replace_range(r, &new);
    }
    out
}

/// The patch (`patch -p1`) that makes `before` into `after` for `file`.
pub fn file_patch(file: &str, before: &str, after: &str) -> String {
    unified_diff(file, before, after)
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
}
