//! `docs/mutation-score.md`: what the mutants run found, per file and per
//! operator, with every survivor's diff and what was done about it.
//!
//! What was done about a survivor is a reviewed judgement, kept in
//! `kernels/mutation-notes.toml`: a survivor with an `equivalent` note
//! (one line: why no record can show it) counts as equivalent, one with an
//! `action` note says which scenario now kills it or why it is left.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use kloop_path_io::PathIo;
use serde::Deserialize;

use crate::mutants::{MutantResult, MutantsBaseline, Outcome};

/// `kernels/mutation-notes.toml`.
#[derive(Debug, Default, Deserialize)]
pub struct Notes {
    #[serde(default, rename = "note")]
    pub notes: Vec<Note>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Note {
    /// The mutant's id.
    pub mutant: String,
    /// Why the mutant cannot change a record (it then counts as equivalent).
    pub equivalent: Option<String>,
    /// What was done about it.
    pub action: Option<String>,
    /// With `equivalent`: the mutant is still a defect, of this kind
    /// (`memory`, `accounting`, `speed`, `race`, `wakeups`), that no record
    /// shows. Kept apart so that the report says how many of the
    /// equivalents are the records' blind spot rather than no change at all.
    pub defect: Option<String>,
}

/// Why `kernels/mutation-notes.toml` could not be had.
#[derive(Debug, thiserror::Error)]
pub enum NotesError {
    #[error("{path}: {source}")]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error(transparent)]
    Io(#[from] PathIo),
}

impl Notes {
    /// The notes file, or none when it does not exist.
    pub fn load(path: &Path) -> Result<Notes, NotesError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|source| NotesError::Parse {
                path: path.to_path_buf(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Notes::default()),
            Err(source) => Err(PathIo::at("reading", path, source).into()),
        }
    }

    fn get(&self, id: &str) -> Option<&Note> {
        self.notes.iter().find(|n| n.mutant == id)
    }
}

/// A result's class in the tables (a duplicate's is that of the mutant
/// whose object code it has, among `all`).
fn class(r: &MutantResult, all: &[MutantResult], notes: &Notes) -> &'static str {
    let outcome = r.resolved(all);
    let id = match &r.outcome {
        Outcome::Duplicate(of) => of,
        _ => &r.mutant.id,
    };
    match outcome {
        Outcome::Killed(_) => "killed",
        Outcome::CompilerEquivalent => "equivalent",
        // A duplicate of a mutant that is missing from the run.
        Outcome::Duplicate(_) => "not judged",
        // Argued to change no record but still a defect (a leak, a lost
        // wakeup, …): the records are blind to it, the score must not be.
        Outcome::Survived
            if notes
                .get(id)
                .is_some_and(|n| n.equivalent.is_some() && n.defect.is_some()) =>
        {
            "unseen defect"
        }
        Outcome::Survived if notes.get(id).is_some_and(|n| n.equivalent.is_some()) => "equivalent",
        Outcome::Survived => "survived",
        Outcome::BuildFailed(_) => "failed to build",
        Outcome::NotJudged(_) => "not judged",
    }
}

const CLASSES: [&str; 6] = [
    "killed",
    "survived",
    "unseen defect",
    "equivalent",
    "failed to build",
    "not judged",
];

fn table(rows: &BTreeMap<String, BTreeMap<&'static str, usize>>, first: &str) -> String {
    let mut s = format!(
        "| {first} | killed | survived | unseen defect | equivalent | failed to build | not judged | score |\n|---|---|---|---|---|---|---|---|\n"
    );
    let mut total: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, counts) in rows {
        let _ = write!(s, "| `{name}` ");
        for c in CLASSES {
            let n = counts.get(c).copied().unwrap_or(0);
            *total.entry(c).or_default() += n;
            let _ = write!(s, "| {n} ");
        }
        let _ = writeln!(s, "| {} |", score(counts));
        let _ = &total;
    }
    let _ = write!(s, "| **all** ");
    for c in CLASSES {
        let _ = write!(s, "| **{}** ", total.get(c).copied().unwrap_or(0));
    }
    let _ = writeln!(s, "| **{}** |", score(&total));
    s
}

/// Killed over the non-equivalent mutants that were built and judged.
/// Which scenario killed what: per scenario, its kills per file (the
/// scenario whose verdict decided each killed mutant; a duplicate counts
/// with the mutant it duplicates).
fn killers(results: &[MutantResult]) -> String {
    let mut files: Vec<String> = Vec::new();
    let mut by_scenario: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for r in results {
        let decided = match &r.outcome {
            Outcome::Duplicate(of) => results.iter().find(|o| &o.mutant.id == of),
            Outcome::Killed(_) => Some(r),
            _ => None,
        };
        let Some(scenario) = decided.and_then(|d| d.killed_in.as_deref()) else {
            continue;
        };
        // `bpf/core.c` and `events/core.c` apart.
        let parts: Vec<&str> = r.mutant.file.rsplit('/').take(2).collect();
        let file = parts.into_iter().rev().collect::<Vec<_>>().join("/");
        if !files.contains(&file) {
            files.push(file.clone());
        }
        *by_scenario
            .entry(scenario)
            .or_default()
            .entry(file)
            .or_default() += 1;
    }
    if by_scenario.is_empty() {
        return String::new();
    }
    files.sort();
    let mut s = String::from(
        "## Which scenario killed what\n\nThe scenario whose verdict decided each killed \
         mutant (tried in the learned order: the killers of the same function first), per file.\n\n",
    );
    let _ = writeln!(s, "| scenario | {} | all |", files.join(" | "));
    let _ = writeln!(s, "|---|{}---|", "---|".repeat(files.len()));
    let mut rows: Vec<(&str, &BTreeMap<String, usize>)> =
        by_scenario.iter().map(|(k, v)| (*k, v)).collect();
    rows.sort_by_key(|(_, v)| std::cmp::Reverse(v.values().sum::<usize>()));
    for (scenario, per_file) in rows {
        let cells: Vec<String> = files
            .iter()
            .map(|f| per_file.get(f).map_or("–".to_string(), |n| n.to_string()))
            .collect();
        let _ = writeln!(
            s,
            "| `{scenario}` | {} | {} |",
            cells.join(" | "),
            per_file.values().sum::<usize>()
        );
    }
    s
}

/// Killed over every mutant that changed the kernel's behaviour and was
/// built and judged: survivors, and argued equivalents that are still
/// defects no record shows ("unseen defect"), count against it; only
/// equivalents that are no defect stay out.
fn score(counts: &BTreeMap<&str, usize>) -> String {
    let killed = counts.get("killed").copied().unwrap_or(0);
    let survived = counts.get("survived").copied().unwrap_or(0)
        + counts.get("unseen defect").copied().unwrap_or(0);
    match killed + survived {
        0 => "–".into(),
        // Rounded down to a tenth: a score just under a target must not
        // print as the target (367/376 is 97.6 %, not 98 %).
        n => format!(
            "{:.1} % ({killed}/{n})",
            (1000.0 * killed as f64 / n as f64).floor() / 10.0
        ),
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The Markdown report.
/// The cost of a stretch per mutant it decided, saying what it leaves out.
fn amortised(secs: f64, decided: usize, carried: usize) -> String {
    let each = if decided == 0 {
        "nothing decided in this stretch".to_string()
    } else {
        format!(
            "{:.1} s a mutant over the {decided} this stretch decided",
            secs / decided as f64
        )
    };
    if carried == 0 {
        each
    } else {
        format!(
            "{each} (the {carried} carried over from earlier stretches with `--resume` paid \
             their phases there, and are not counted)"
        )
    }
}

/// `docs/mutation-score.md` for `results` judged against `base`: how the
/// run was made, the scores per file and per operator, how the killed were
/// killed and by which scenarios, every survivor with its note and diff,
/// and every mutant.
pub fn markdown(
    base: &MutantsBaseline,
    results: &[MutantResult],
    generated: usize,
    missing: &[String],
    notes: &Notes,
    command: &str,
) -> String {
    let mut by_file: BTreeMap<String, BTreeMap<&'static str, usize>> = BTreeMap::new();
    let mut by_op: BTreeMap<String, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for r in results {
        let c = class(r, results, notes);
        *by_file
            .entry(r.mutant.file.clone())
            .or_default()
            .entry(c)
            .or_default() += 1;
        *by_op
            .entry(r.mutant.operator.name().to_string())
            .or_default()
            .entry(c)
            .or_default() += 1;
    }
    let mut s = String::new();
    intro(&mut s, base, results, generated, missing, command);
    time_per_mutant(&mut s, results);
    phases(&mut s, base, results);
    decided_without_a_run(&mut s, base, results, notes);
    defects(&mut s, results, notes);
    let _ = writeln!(s, "## Per file\n\n{}", table(&by_file, "file"));
    let _ = writeln!(s, "## Per operator\n\n{}", table(&by_op, "operator"));

    how_killed(&mut s, results);
    let _ = writeln!(s, "{}", killers(results));
    survivors(&mut s, results, notes);
    every_mutant(&mut s, results, notes);
    s
}

/// The title, where the report comes from, and how many mutants.
fn intro(
    s: &mut String,
    base: &MutantsBaseline,
    results: &[MutantResult],
    generated: usize,
    missing: &[String],
    command: &str,
) {
    let _ = writeln!(s, "# Mutation score\n");
    let _ = writeln!(
        s,
        "Generated by `{command}`: mutants of the kernel code that emits \
         `PERF_RECORD_KSYMBOL` and `PERF_RECORD_BPF_EVENT` \
         (`kernels/mutation-targets.toml`), each run against the unmutated code, \
         scenario by scenario, like `validate`: a \
         scenario that comes out CHANGED, BROKEN or INCOMPARABLE (an overhead \
         figure out of its band included) kills the mutant. Survivors are where \
         the suite is blind; what was done about each is in \
         `kernels/mutation-notes.toml`.\n"
    );
    let _ = writeln!(
        s,
        "Source: {} (unmutated build `built:{}`, {}); {} under {}; scenarios, in \
         the order tried: {}.\n",
        base.source,
        base.kernel_id,
        base.release,
        results.len(),
        base.accel,
        base.scenarios.join(", ")
    );
    // Mutants judged again after the run, in a run of their own with new
    // scenarios, and merged into this data: their scenarios are not in
    // the list above.
    let later: BTreeSet<&str> = results
        .iter()
        .filter_map(|r| r.killed_in.as_deref())
        .filter(|k| !base.scenarios.iter().any(|b| b == k))
        .collect();
    if !later.is_empty() {
        let n = results
            .iter()
            .filter(|r| r.killed_in.as_deref().is_some_and(|k| later.contains(k)))
            .count();
        let _ = writeln!(
            s,
            "{n} mutants were killed by scenarios added after this run (judged again with \
             `--mutant … --scenario …`, their results merged into this data): {}.\n",
            later.iter().copied().collect::<Vec<_>>().join(", ")
        );
    }
    let _ = writeln!(
        s,
        "{} mutants generated, {} judged here{}.{}\n",
        generated,
        results.len(),
        if results.len() >= generated {
            " (all of them)"
        } else {
            " (a sample: round-robin over files, then operators, or the mutants named)"
        },
        if missing.is_empty() {
            String::new()
        } else {
            format!(" Functions not found in this tree: {}.", missing.join("; "))
        }
    );
}

/// The median build and judge time of a mutant.
fn time_per_mutant(s: &mut String, results: &[MutantResult]) {
    let build = median(
        results
            .iter()
            .filter(|r| r.build_secs > 0.0)
            .map(|r| r.build_secs)
            .collect(),
    );
    let judge = median(
        results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Killed(_) | Outcome::Survived))
            .map(|r| r.judge_secs)
            .collect(),
    );
    let _ = writeln!(
        s,
        "Time per mutant on this machine (median): build {}, judge {}.\n",
        build.map_or("–".into(), |b| format!("{b:.0} s")),
        judge.map_or("–".into(), |j| format!("{j:.0} s"))
    );
}

/// How the kernels were made, with each phase's time.
fn phases(s: &mut String, base: &MutantsBaseline, results: &[MutantResult]) {
    let p = &base.phases;
    // The phases are this stretch's; results carried over from earlier
    // stretches (`--resume`) come first and paid for their phases there.
    let here = &results[p.carried.min(results.len())..];
    let decided_here = here
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::NotJudged(_)))
        .count();
    let judged_secs: f64 = here.iter().map(|r| r.judge_secs).sum();
    // The builds of mutants the schema could not hold (all of them when
    // there was no schema kernel).
    let alone_secs: f64 = here
        .iter()
        .filter(|r| p.was_built_alone(&r.mutant.id))
        .map(|r| r.build_secs)
        .sum();
    match p.strategy {
        crate::mutants::Strategy::Schemata => {
            let _ = writeln!(
                s,
                "How the kernels were made (mutant schemata): every mutated file compiled \
                 alone first ({:.0} s on both cores), then the {} mutants left in one \
                 schema kernel{} ({:.0} s to build), each chosen per trial by the \
                 `kloop_mutant` switch on a saved VM; {} built alone{}. Trials took {:.0} s \
                 in all. Amortised: {}.\n",
                p.compile_secs,
                p.in_schema,
                p.schema_kernel
                    .as_ref()
                    .map_or(String::new(), |k| format!(" (`built:{k}`)")),
                p.schema_build_secs,
                p.built_alone.len(),
                if p.built_alone.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", p.built_alone.join("; "))
                },
                judged_secs,
                amortised(
                    p.compile_secs + p.schema_build_secs + judged_secs + alone_secs,
                    decided_here,
                    p.carried
                ),
            );
        }
        crate::mutants::Strategy::BuildEach => {
            let _ = writeln!(
                s,
                "How the kernels were made: a kernel per mutant, its patch built \
                 incrementally (`--build-each`).\n"
            );
        }
    }
}

/// Confirmed diff kills, noisy scenarios, and what the object code decided.
fn decided_without_a_run(
    s: &mut String,
    base: &MutantsBaseline,
    results: &[MutantResult],
    notes: &Notes,
) {
    let p = &base.phases;
    let confirmed_diffs = results.iter().filter(|r| r.confirmed_diff).count();
    let _ = writeln!(
        s,
        "A kill by the diff only stands when both kernels ran the scenario again, the \
         unmutated one matched its first run and the mutant still differed ({confirmed_diffs} \
         confirmed here). {}\n",
        if p.noisy.is_empty() {
            "No scenario's unmutated runs differed from each other.".to_string()
        } else {
            format!(
                "Scenarios whose unmutated runs differed from each other, so that only their \
                 rules kill: {}.",
                p.noisy
                    .iter()
                    .map(|(k, why)| format!("`{k}` (`{}`)", why.replace('`', "'")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    let (tce, dups) = crate::mutants::decided_by_code(results);
    let compared = results.iter().filter(|r| r.code_digest.is_some()).count();
    // The hand-argued equivalents the object code can check.
    let argued: Vec<&MutantResult> = results
        .iter()
        .filter(|r| {
            notes
                .get(&r.mutant.id)
                .is_some_and(|n| n.equivalent.is_some())
        })
        .collect();
    let confirmed = argued
        .iter()
        .filter(|r| r.outcome == Outcome::CompilerEquivalent)
        .count();
    let _ = writeln!(
        s,
        "Decided without a run (Trivial Compiler Equivalence, {compared} mutants' object \
         code compared with the unmutated build's and with each other's): {tce} \
         equivalent (the same object code as the unmutated build), {dups} duplicates \
         (the object code of an earlier mutant, whose outcome they share). Of the {} \
         equivalents argued in `kernels/mutation-notes.toml` among these mutants, {confirmed} \
         compile to the unmutated code; the others rest on their argument.\n",
        argued.len()
    );
}

/// Defects no record shows, by kind: killed by another oracle, or unseen.
fn defects(s: &mut String, results: &[MutantResult], notes: &Notes) {
    // Defects no record shows, by kind: still unseen (argued equivalent,
    // survived), and those a later rule or scenario killed (their note
    // keeps the kind beside the `action` that says what kills them).
    let mut defects: BTreeMap<&str, usize> = BTreeMap::new();
    let mut defects_killed: BTreeMap<&str, usize> = BTreeMap::new();
    for r in results {
        let Some(d) = notes.get(&r.mutant.id).and_then(|n| n.defect.as_deref()) else {
            continue;
        };
        match class(r, results, notes) {
            "unseen defect" => *defects.entry(d).or_default() += 1,
            "killed" => *defects_killed.entry(d).or_default() += 1,
            _ => {}
        }
    }
    let per_kind = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .map(|(d, n)| format!("{n} {d}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !defects.is_empty() || !defects_killed.is_empty() {
        let _ = writeln!(
            s,
            "Defects that change no record (a leak, a charge not returned, a walk no listener \
             needs, a lost wakeup, a race window): {} are killed by oracles beyond the records \
             — the JIT's books and limit (`jit-charge`, `jit-chunks`, `jit-images`, `jit-limit`), the side-band gates \
             (`sideband-gating`, `sideband-quiet`), a polled listener (`wakeups`), a reader \
             spinning on `data_head` (`published-bytes`), the kernel's own WARNs (a panic with \
             `panic_on_warn`), a checked kernel's reports (`--checks`: `kasan`, `kmemleak`, `lockdep`, `ubsan`) — each \
             listed with its rule under the kills below ({}); {} are still unseen ({}): they \
             count against the score as survivors (column `unseen defect`) and are listed with \
             their argument below.\n",
            defects_killed.values().sum::<usize>(),
            if defects_killed.is_empty() {
                "none".to_string()
            } else {
                per_kind(&defects_killed)
            },
            defects.values().sum::<usize>(),
            if defects.is_empty() {
                "none".to_string()
            } else {
                per_kind(&defects)
            },
        );
    }
}

/// Per operator: killed by a rule, by the diff only, by overhead only.
fn how_killed(s: &mut String, results: &[MutantResult]) {
    // Killed by a rule is what a user without a baseline sees.
    let mut how: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    for r in results {
        let kind = match &r.outcome {
            Outcome::Duplicate(of) => results
                .iter()
                .find(|o| &o.mutant.id == of)
                .and_then(|o| o.killed_by),
            Outcome::Killed(_) => r.killed_by,
            _ => None,
        };
        if let Some(k) = kind {
            let row = how.entry(r.mutant.operator.name().to_string()).or_default();
            row[k as usize] += 1;
        }
    }
    let _ = writeln!(
        s,
        "## How the killed were killed\n\nBy a rule (or a kernel that did not finish the \
         scenario): what `vm-test` on this kernel alone reports, with no baseline. By the \
         diff only: the normalised stream differs from the unmutated kernel's and no rule \
         broke in any scenario (judging goes on past such a kill, looking for a rule). By \
         overhead only: figures out of their band.\n\n\
         | operator | rule | diff only | overhead only |\n|---|---|---|---|"
    );
    let mut total = [0usize; 3];
    for (op, row) in &how {
        let _ = writeln!(s, "| `{op}` | {} | {} | {} |", row[0], row[1], row[2]);
        for i in 0..3 {
            total[i] += row[i];
        }
    }
    let _ = writeln!(
        s,
        "| **all** | **{}** | **{}** | **{}** |\n",
        total[0], total[1], total[2]
    );
}

/// Every survivor with what was done about it and its diff.
fn survivors(s: &mut String, results: &[MutantResult], notes: &Notes) {
    let _ = writeln!(s, "## Survivors\n");
    let survivors: Vec<&MutantResult> = results
        .iter()
        .filter(|r| r.outcome == Outcome::Survived)
        .collect();
    if survivors.is_empty() {
        let _ = writeln!(s, "None.\n");
    }
    let schema_overhead = survivors
        .iter()
        .filter(|r| r.schema_overhead.is_some())
        .count();
    if schema_overhead > 0 {
        let _ = writeln!(
            s,
            "{schema_overhead} of them moved only overhead figures, and only on the schema \
             kernel, whose copies of a function are compiled side by side: the compiler \
             inlines and lays out a mutant's copy of a hot function differently from the \
             unmutated one, so such figures are no evidence of the mutation and do not kill \
             (a kernel built alone, `--build-each --mutant ID`, could tell).\n"
        );
    }
    for r in survivors {
        let m = &r.mutant;
        let _ = writeln!(s, "### `{}`\n", m.id);
        let _ = writeln!(
            s,
            "{} in `{}` ({}:{}).\n",
            m.what, m.function, m.file, m.line
        );
        if let Some(o) = &r.schema_overhead {
            let _ = writeln!(s, "Schema kernel's overhead only: {o}\n");
        }
        match notes.get(&m.id) {
            Some(n) => {
                match (&n.equivalent, &n.defect) {
                    (Some(e), Some(d)) => {
                        let _ = writeln!(
                            s,
                            "**Equivalent for the records, a {d} defect none shows:** {e}\n"
                        );
                    }
                    (Some(e), None) => {
                        let _ = writeln!(s, "**Equivalent:** {e}\n");
                    }
                    _ => {}
                }
                if let Some(a) = &n.action {
                    let _ = writeln!(s, "**Done:** {a}\n");
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "**Open:** no note yet in `kernels/mutation-notes.toml`.\n"
                );
            }
        }
        let _ = writeln!(s, "```diff\n{}```\n", m.patch);
    }
}

/// One table row per mutant.
fn every_mutant(s: &mut String, results: &[MutantResult], notes: &Notes) {
    let _ = writeln!(s, "## Every mutant\n");
    let _ = writeln!(
        s,
        "| mutant | what | outcome | build s | judge s |\n|---|---|---|---|---|"
    );
    for r in results {
        let detail = match &r.outcome {
            Outcome::Killed(why) => {
                format!("killed ({}): {why}", r.killed_by.map_or("?", |k| k.label()))
            }
            Outcome::BuildFailed(why) | Outcome::NotJudged(why) => {
                format!("{}: {}", class(r, results, notes), why)
            }
            Outcome::Survived => class(r, results, notes).to_string(),
            Outcome::CompilerEquivalent => {
                "equivalent: the same object code as the unmutated build (not run)".into()
            }
            Outcome::Duplicate(of) => format!(
                "{}: the object code of `{of}` (not run)",
                class(r, results, notes)
            ),
        };
        let cell = |t: &str| t.replace('|', "\\|").replace('\n', " ");
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {:.0} | {:.0} |",
            r.mutant.id,
            cell(&r.mutant.what),
            cell(&detail),
            r.build_secs,
            r.judge_secs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_mutate::{Mutant, Operator};

    fn result(id: &str, file: &str, op: Operator, outcome: Outcome) -> MutantResult {
        MutantResult {
            mutant: Mutant {
                id: id.into(),
                file: file.into(),
                function: "f".into(),
                line: 1,
                operator: op,
                what: "drop `x()` | y".into(),
                patch: "--- a/f\n+++ b/f\n".into(),
            },
            outcome,
            build_secs: 30.0,
            judge_secs: 10.0,
            scenarios_run: 1,
            confirmed_figures: false,
            confirmed_diff: false,
            schema_overhead: None,
            killed_by: None,
            killed_in: None,
            code_digest: None,
        }
    }

    #[test]
    fn scores_count_equivalents_apart_and_show_survivors() {
        let base = MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: "abc".into(),
            release: "6.12.117".into(),
            scenarios: vec!["basic".into()],
            accel: "tcg".into(),
            phases: Default::default(),
            run_dir: "/r".into(),
        };
        let results = vec![
            result(
                "a:1",
                "kernel/a.c",
                Operator::DropCall,
                Outcome::Killed("basic: CHANGED: x".into()),
            ),
            result("a:2", "kernel/a.c", Operator::DropCall, Outcome::Survived),
            result("a:3", "kernel/a.c", Operator::Constant, Outcome::Survived),
            result(
                "b:1",
                "kernel/b.c",
                Operator::Constant,
                Outcome::BuildFailed("error".into()),
            ),
        ];
        let notes: Notes =
            toml::from_str("[[note]]\nmutant = \"a:3\"\nequivalent = \"the flag is never read\"\n")
                .unwrap();
        // A survivor argued to change no record but still a leak counts
        // against the score: a.c 1 killed of 2 survived-or-unseen.
        let defect: Notes = toml::from_str(
            "[[note]]\nmutant = \"a:3\"\nequivalent = \"no record\"\ndefect = \"memory\"\n",
        )
        .unwrap();
        let md_defect = markdown(&base, &results, 10, &[], &defect, "cargo xtask mutants");
        assert!(
            md_defect.contains("| `kernel/a.c` | 1 | 1 | 1 | 0 | 0 | 0 | 33.3 % (1/3) |"),
            "{md_defect}"
        );
        assert!(md_defect.contains("count against the score as survivors"));
        let md = markdown(&base, &results, 10, &[], &notes, "cargo xtask mutants");
        // a.c: 1 killed of 2 non-equivalent judged.
        assert!(
            md.contains("| `kernel/a.c` | 1 | 1 | 0 | 1 | 0 | 0 | 50.0 % (1/2) |"),
            "{md}"
        );
        assert!(
            md.contains("| `kernel/b.c` | 0 | 0 | 0 | 0 | 1 | 0 | – |"),
            "{md}"
        );
        assert!(md.contains("### `a:2`") && md.contains("**Open:**"));
        assert!(md.contains("### `a:3`") && md.contains("**Equivalent:** the flag is never read"));
        assert!(
            md.contains("drop `x()` \\| y"),
            "pipes in cells are escaped"
        );
    }

    /// `mutants --from` writes the report again from a run's mutants.json:
    /// what a run writes must read back as it was.
    /// Mutants decided by their object code count where their code puts
    /// them: the unmutated code is equivalent, a duplicate shares the
    /// outcome of the mutant it duplicates; the report says how many.
    #[test]
    fn object_code_decides_equivalents_and_duplicates() {
        let base = MutantsBaseline {
            source: "linux-source-6.12".into(),
            kernel_id: "k".into(),
            release: "6.12".into(),
            scenarios: vec!["basic".into()],
            accel: "tcg".into(),
            phases: Default::default(),
            run_dir: "/tmp/x".into(),
        };
        let results = vec![
            MutantResult {
                killed_by: Some(crate::mutants::KillKind::Rule),
                ..result(
                    "a:1",
                    "kernel/a.c",
                    Operator::ReplaceGlobal,
                    Outcome::Killed("basic: BROKEN: x".into()),
                )
            },
            result(
                "a:2",
                "kernel/a.c",
                Operator::Relational,
                Outcome::Duplicate("a:1".into()),
            ),
            result(
                "a:3",
                "kernel/a.c",
                Operator::Arithmetic,
                Outcome::CompilerEquivalent,
            ),
            result(
                "a:4",
                "kernel/a.c",
                Operator::ReplaceField,
                Outcome::Survived,
            ),
        ];
        let md = markdown(&base, &results, 4, &[], &Notes::default(), "cmd");
        // 2 killed (one a duplicate), 1 survived, 1 equivalent: 2/3.
        assert!(
            md.contains("| `kernel/a.c` | 2 | 1 | 0 | 1 | 0 | 0 | 66.6 % (2/3) |"),
            "{md}"
        );
        assert!(
            md.contains("1 equivalent (the same object code as the unmutated build), 1 duplicates"),
            "{md}"
        );
        assert!(
            md.contains("killed: the object code of `a:1` (not run)"),
            "{md}"
        );
    }

    #[test]
    fn results_read_back_from_their_json() {
        let results = vec![
            result(
                "a:1",
                "kernel/a.c",
                Operator::SwapCalls,
                Outcome::Killed("basic: CHANGED: x".into()),
            ),
            result("a:2", "kernel/a.c", Operator::DropReturn, Outcome::Survived),
            result(
                "b:1",
                "kernel/b.c",
                Operator::OffByOne,
                Outcome::NotJudged("interrupted".into()),
            ),
        ];
        let json = serde_json::to_vec_pretty(&results).unwrap();
        let back: Vec<MutantResult> = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&results).unwrap()
        );
        assert_eq!(back[0].outcome, Outcome::Killed("basic: CHANGED: x".into()));
        assert_eq!(back[1].mutant.operator, Operator::DropReturn);
    }

    /// Each killed mutant counts for the scenario that decided it, by
    /// file, and a duplicate with the mutant it duplicates.
    #[test]
    fn killers_are_counted_per_scenario_and_file() {
        let mut a = result(
            "a:1",
            "kernel/bpf/core.c",
            Operator::DropCall,
            Outcome::Killed("x".into()),
        );
        a.killed_in = Some("symbol-state".into());
        let mut b = result(
            "b:1",
            "kernel/events/core.c",
            Operator::DropCall,
            Outcome::Killed("y".into()),
        );
        b.killed_in = Some("symbol-state".into());
        let c = result(
            "c:1",
            "kernel/events/core.c",
            Operator::SwapCalls,
            Outcome::Duplicate("b:1".into()),
        );
        let d = result(
            "d:1",
            "kernel/events/core.c",
            Operator::SwapCalls,
            Outcome::Survived,
        );
        let table = killers(&[a, b, c, d]);
        assert!(
            table.contains("| scenario | bpf/core.c | events/core.c | all |"),
            "{table}"
        );
        assert!(table.contains("| `symbol-state` | 1 | 2 | 3 |"), "{table}");
    }

    #[test]
    fn amortised_counts_only_what_the_stretch_decided() {
        assert_eq!(
            amortised(100.0, 4, 0),
            "25.0 s a mutant over the 4 this stretch decided"
        );
        let resumed = amortised(100.0, 4, 190);
        assert!(
            resumed.starts_with("25.0 s a mutant over the 4"),
            "{resumed}"
        );
        assert!(resumed.contains("190 carried over"), "{resumed}");
        assert_eq!(
            amortised(100.0, 0, 3).split(" (").next(),
            Some("nothing decided in this stretch")
        );
    }
}
