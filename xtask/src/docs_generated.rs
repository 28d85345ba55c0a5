//! The docs' generated sections are what `cargo xtask docs` writes now
//! (`kloop::session::docs`), and the list of environment variables they
//! are written from names exactly the `KLOOP_` variables the source reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    kloop::workspace::workspace_root()
}

#[test]
fn the_generated_sections_are_current() {
    let layout = kloop::workspace::Layout::from_root(root());
    let stale = kloop::session::docs::stale(&layout, &crate::shared::exits::sections())
        .expect("the sections can be generated");
    let lines: Vec<String> = stale
        .iter()
        .map(|(path, names, _)| format!("{}: {}", path.display(), names.join(", ")))
        .collect();
    assert!(
        lines.is_empty(),
        "generated sections differ from the code; run `cargo xtask docs` (and review the diff):\n{}",
        lines.join("\n")
    );
}

/// Every planted drift of a generated section, of each kind there is (a
/// changed number, a new row, a row gone), is found and would be rewritten.
#[test]
fn a_drift_in_any_generated_section_is_found() {
    use kloop::session::docs::{begin_marker, end_marker, replace_section, sections};
    let layout = kloop::workspace::Layout::from_root(root());
    let mut all = sections(&layout).unwrap();
    all.extend(crate::shared::exits::sections());
    assert!(all.len() >= 5, "{all:?}");
    for s in &all {
        let current = format!(
            "{}\n{}\n{}\n",
            begin_marker(s.name),
            s.body.trim_end(),
            end_marker(s.name)
        );
        let drifts = [
            // A number changed (the first digit that has one).
            s.body
                .replacen(|c: char| c.is_ascii_digit(), "9", 1)
                .replacen('9', "98", 1),
            // A row (or item) more.
            format!("{}\n| `new` | 1 |", s.body.trim_end()),
            // The last line gone.
            s.body
                .trim_end()
                .rsplit_once('\n')
                .map_or(String::new(), |(a, _)| a.to_string()),
        ];
        for drift in drifts {
            let planted = format!(
                "{}\n{}\n{}\n",
                begin_marker(s.name),
                drift.trim_end(),
                end_marker(s.name)
            );
            if planted == current {
                continue;
            }
            let rewritten = replace_section(&planted, s.file, s.name, &s.body).unwrap();
            assert_eq!(
                rewritten, current,
                "{} {}: the drift is not rewritten",
                s.file, s.name
            );
        }
    }
}

/// The `KLOOP_` names the source under `root` reads or sets: string
/// literals that are exactly a name in Rust (`"KLOOP_X"`, outside
/// comments), and `$KLOOP_X` / `${KLOOP_X…}` in shell scripts.
fn variables_in(root: &Path) -> BTreeSet<String> {
    fn name_at(text: &str) -> String {
        text.chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    }
    fn walk(path: &Path, out: &mut BTreeSet<String>) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if matches!(name, "target" | ".git" | "testdata") {
                return;
            }
            for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
                walk(&e.path(), out);
            }
            return;
        }
        // This file's planted names are test data, not reads.
        if path.ends_with("xtask/src/docs_generated.rs") {
            return;
        }
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        if name.ends_with(".rs") {
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (at, _) in line.match_indices("\"KLOOP_") {
                    let n = name_at(&line[at + 1..]);
                    if line[at + 1 + n.len()..].starts_with('"') {
                        out.insert(n);
                    }
                }
            }
        } else if name.ends_with(".sh") || name == "run" {
            for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                for pat in ["${KLOOP_", "$KLOOP_"] {
                    for (at, _) in line.match_indices(pat) {
                        out.insert(name_at(&line[at + pat.len() - "KLOOP_".len()..]));
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for dir in ["crates", "harness", "xtask", "guest", "fuzz", "ci", ".ci"] {
        walk(&root.join(dir), &mut out);
    }
    out
}

#[test]
fn the_environment_list_names_exactly_the_variables_the_source_reads() {
    let listed: BTreeSet<String> = kloop::session::docs::env_vars::vars()
        .iter()
        .map(|v| v.name.to_string())
        .collect();
    let read = variables_in(&root());
    let unlisted: Vec<&String> = read.difference(&listed).collect();
    let unread: Vec<&String> = listed.difference(&read).collect();
    assert!(
        unlisted.is_empty() && unread.is_empty(),
        "read but not in harness/src/session/docs/env_vars.rs: {unlisted:?}; listed there but \
         read nowhere: {unread:?} (then run `cargo xtask docs`)"
    );
}

/// The planted case: a new variable read in Rust or a script is seen, one
/// in a comment or inside a longer message is not.
#[test]
fn a_new_variable_read_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("crates/x/src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(dir.path().join("ci")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "// std::env::var(\"KLOOP_IN_A_COMMENT\")\n\
         fn f() { std::env::var(\"KLOOP_NEW_ONE\"); }\n\
         const M: &str = \"set KLOOP_IN_A_MESSAGE to 1\";\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("ci/x.sh"),
        "# $KLOOP_IN_A_SHELL_COMMENT\nn=\"${KLOOP_SCRIPT_ONE:-3}\"\n",
    )
    .unwrap();
    assert_eq!(
        variables_in(dir.path()).into_iter().collect::<Vec<_>>(),
        ["KLOOP_NEW_ONE", "KLOOP_SCRIPT_ONE"]
    );
}

/// The statuses a command's file returns by number (`ExitCode::from(N)`,
/// `EXIT_BUILD` and a kernel build's, `exit_code(..)`'s and
/// `ExitCode::FAILURE`'s 1), besides 0 and 2.
fn statuses_in(text: &str) -> BTreeSet<u8> {
    let mut out = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("ExitCode::from(") {
            let n: String = line[at + "ExitCode::from(".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(n) = n.parse() {
                out.insert(n);
            }
        }
        if line.contains("EXIT_BUILD") || line.contains("build_kernel(") {
            out.insert(crate::shared::EXIT_BUILD);
        }
        if line.contains("exit_code(") || line.contains("ExitCode::FAILURE") {
            out.insert(1);
        }
    }
    out.retain(|&n| n != 0 && n != 2);
    out
}

/// Every status a command's file returns by number is in its row of
/// `EXIT_STATUSES` (commands one file serves share their rows).
#[test]
fn every_exit_status_a_command_returns_is_listed() {
    use crate::shared::exits::EXIT_STATUSES;
    let src = root().join("xtask/src");
    let file_of = |cmd: &str| match cmd {
        "bless" => "vm_test".to_string(),
        "bisect-step" => "bisect".to_string(),
        other => other.replace('-', "_"),
    };
    let mut problems = Vec::new();
    for (cmd, _) in EXIT_STATUSES {
        let file = file_of(cmd);
        let text = std::fs::read_to_string(src.join(format!("{file}_cmd.rs"))).unwrap();
        let listed: BTreeSet<u8> = EXIT_STATUSES
            .iter()
            .filter(|(c, _)| file_of(c) == file)
            .flat_map(|(_, s)| s.iter().map(|(n, _)| *n))
            .collect();
        for n in statuses_in(&text) {
            if !listed.contains(&n) {
                problems.push(format!(
                    "xtask/src/{file}_cmd.rs returns {n}, which `{cmd}`'s row lacks"
                ));
            }
        }
    }
    let commands: BTreeSet<String> = {
        use clap::CommandFactory;
        crate::flags::Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect()
    };
    let rows: BTreeSet<String> = EXIT_STATUSES.iter().map(|(c, _)| c.to_string()).collect();
    assert_eq!(rows, commands, "EXIT_STATUSES has one row per command");
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "exit statuses not in xtask/src/shared/exits.rs (then run `cargo xtask docs`):\n{}",
        problems.join("\n")
    );
}

/// The planted case: a new `ExitCode::from(N)` is seen.
#[test]
fn a_new_exit_status_is_seen() {
    let text = "fn f() -> ExitCode {\n    // ExitCode::from(9)\n    ExitCode::from(77)\n}\n";
    assert_eq!(statuses_in(text).into_iter().collect::<Vec<_>>(), [77]);
    assert_eq!(
        statuses_in("Err(ExitCode::from(EXIT_BUILD))\nOk(exit_code(ok))\n")
            .into_iter()
            .collect::<Vec<_>>(),
        [1, 3]
    );
}

/// `ci/durations.jsonl`: per trial of the last whole-matrix runs, its
/// verdict class (`ci/durations-from-runs.py` writes it).
fn recorded_matrix() -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("ci/durations.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            (
                v["id"].as_str().expect("an id").to_string(),
                v["class"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Every trial the matrix plans: each architecture's pins × scenarios.
fn planned_trials() -> BTreeSet<String> {
    let layout = kloop::workspace::Layout::from_root(root());
    let scenarios = kloop::scenario::load_all(&layout.scenarios()).unwrap();
    let catalog = kloop_kernels::Catalog::load_all(&layout.kernels()).unwrap();
    catalog
        .pins()
        .iter()
        .flat_map(|p| {
            scenarios
                .iter()
                .map(move |s| format!("{}/{}", p.id, s.name))
        })
        .collect()
}

/// The trial lines and totals the docs show as sample output, checked
/// against the recorded runs: `ci/durations.jsonl` covers every planned
/// trial and no other, every excerpted trial line carries its trial's
/// verdict, and every totals line adds up to the x86-64 matrix with that
/// run's counts.
fn excerpt_problems(
    docs: &[(&str, String)],
    recorded: &std::collections::BTreeMap<String, String>,
    planned: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let ids: BTreeSet<String> = recorded.keys().cloned().collect();
    for missing in planned.difference(&ids) {
        problems.push(format!(
            "ci/durations.jsonl lacks the planned trial {missing}"
        ));
    }
    for extra in ids.difference(planned) {
        problems.push(format!(
            "ci/durations.jsonl has {extra}, which no longer is a planned trial"
        ));
    }
    let x86: Vec<&String> = recorded
        .iter()
        .filter(|(id, _)| !id.starts_with("arm64/"))
        .map(|(_, c)| c)
        .collect();
    let count = |class: &str| x86.iter().filter(|c| c.as_str() == class).count();
    let matrix = Matrix {
        recorded,
        trials: x86.len(),
        totals: format!(
            "{} passed, {} failed, {} known bug, {} skipped",
            count("ok"),
            x86.len() - count("ok") - count("known") - count("skipped"),
            count("known"),
            count("skipped")
        ),
    };
    for (name, text) in docs {
        // Lines under a command that sets the environment
        // (`KLOOP_PERF=… cargo xtask vm-test`) are that run's, not the
        // matrix's.
        let mut other_run = false;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if let Some((before, _)) = line.split_once("cargo xtask") {
                other_run = before.contains('=');
            }
            for p in matrix.line_problems(line, other_run) {
                problems.push(format!("{name}:{}: {p}", n + 1));
            }
        }
    }
    problems
}

/// What the recorded x86-64 matrix says a sample line must show.
struct Matrix<'a> {
    recorded: &'a std::collections::BTreeMap<String, String>,
    trials: usize,
    totals: String,
}

impl Matrix<'_> {
    fn line_problems(&self, line: &str, other_run: bool) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(rest) = line.strip_prefix("kloop: ") {
            if rest.contains(" passed, ")
                && rest.contains(" known bug, ")
                && !rest.starts_with(&self.totals)
            {
                out.push(format!(
                    "totals `{rest}`: the recorded x86-64 matrix gives `{}`",
                    self.totals
                ));
            }
            if let Some(r) = rest.strip_prefix("running ") {
                let n: String = r.chars().take_while(char::is_ascii_digit).collect();
                if n.parse::<usize>().ok() != Some(self.trials) {
                    out.push(format!(
                        "`running {n} trial(s)`: the x86-64 matrix is {}",
                        self.trials
                    ));
                }
            }
        }
        // `shard K/N: A of B trial(s)`, wherever it is quoted.
        if let Some((_, rest)) = line.split_once("shard ") {
            if let Some((_, after)) = rest.split_once(" of ").filter(|_| rest.contains(": ")) {
                let b: String = after.chars().take_while(char::is_ascii_digit).collect();
                if after.contains(" trial(s)") && b.parse::<usize>().ok() != Some(self.trials) {
                    out.push(format!(
                        "shard line `{rest}`: the x86-64 matrix is {}",
                        self.trials
                    ));
                }
            }
        }
        // `<pin>/<scenario> ... <VERDICT>`: an excerpted trial line.
        if let Some((id, verdict)) = line.split_once(" ... ").filter(|_| !other_run) {
            match self.recorded.get(id) {
                Some(class) if !verdict.starts_with(verdict_word(class)) => out.push(format!(
                    "`{id}` is {} in the recorded run, not `{verdict}`",
                    verdict_word(class)
                )),
                Some(_) => {}
                None if id.contains('/') && !id.contains(' ') => {
                    out.push(format!("`{id}` is no recorded trial"));
                }
                None => {}
            }
        }
        out
    }
}

/// The word a trial line starts its verdict with, for a verdict class
/// (`Verdict::label` of the kind whose JSON class it is).
fn verdict_word(class: &str) -> &'static str {
    kloop::run::trial::Verdict::one_of_each()
        .iter()
        .find(|v| {
            serde_json::to_value(v)
                .ok()
                .is_some_and(|j| j["class"] == class)
        })
        .map_or("?", kloop::run::trial::Verdict::label)
}

#[test]
fn the_docs_sample_output_is_the_recorded_matrix() {
    let docs: Vec<(&str, String)> = ["README.md", "docs/usage.md"]
        .into_iter()
        .map(|f| (f, std::fs::read_to_string(root().join(f)).unwrap()))
        .collect();
    let problems = excerpt_problems(&docs, &recorded_matrix(), &planned_trials());
    assert!(
        problems.is_empty(),
        "sample output against ci/durations.jsonl (after a new scenario or pin: run the whole \
         matrix, `cargo xtask vm-test --arch all`, and `ci/durations-from-runs.py RUN_DIR > \
         ci/durations.jsonl`; then fix the excerpts):\n{}",
        problems.join("\n")
    );
}

/// The planted cases: a stale total, a wrong verdict, a missing trial.
#[test]
fn a_stale_excerpt_is_found() {
    let recorded: std::collections::BTreeMap<String, String> = [
        ("6.1/basic", "ok"),
        ("6.1/many-listeners", "known"),
        ("arm64/6.1/basic", "ok"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let planned: BTreeSet<String> = [
        "6.1/basic",
        "6.1/many-listeners",
        "6.1/new",
        "arm64/6.1/basic",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let doc = "    6.1/basic ... ok (1 s)\n    6.1/many-listeners ... ok (1 s)\n    kloop: running 3 trial(s)\n    kloop: 2 passed, 0 failed, 0 known bug, 0 skipped in 1 s\n    kloop: 1 passed, 0 failed, 1 known bug, 0 skipped in 1 s\n".to_string();
    let problems = excerpt_problems(&[("d.md", doc)], &recorded, &planned);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].contains("lacks the planned trial 6.1/new"));
    assert!(problems[1].contains("`6.1/many-listeners` is KNOWN"));
    assert!(problems[2].contains("running 3"));
    assert!(problems[3].contains("totals `2 passed"));
}

/// docs/usage.md's hand-written table of what each verdict means has a
/// row for every verdict word the code has (`Verdict::one_of_each`).
#[test]
fn every_verdict_word_has_its_meaning() {
    let usage = std::fs::read_to_string(root().join("docs/usage.md")).unwrap();
    let table = usage
        .split_once("| verdict | meaning | fails the run |")
        .map(|(_, t)| t)
        .expect("docs/usage.md has the verdicts' meaning table");
    let rows: Vec<&str> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let missing: Vec<&str> = kloop::run::trial::Verdict::one_of_each()
        .iter()
        .map(kloop::run::trial::Verdict::label)
        .filter(|w| !rows.iter().any(|r| r.starts_with(&format!("| `{w}"))))
        .collect();
    assert!(
        missing.is_empty(),
        "verdict words without a row in docs/usage.md's meaning table: {missing:?}"
    );
}

/// Every identifier of the workspace's Rust source, and the names of its
/// modules (file stems and folders under a `src/`).
fn source_words() -> (BTreeSet<String>, BTreeSet<String>) {
    fn walk(path: &Path, words: &mut BTreeSet<String>, modules: &mut BTreeSet<String>) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if matches!(name, "target" | ".git" | "testdata") {
                return;
            }
            if path
                .parent()
                .and_then(|p| p.file_name())
                .is_some_and(|p| p == "src")
            {
                modules.insert(name.to_string());
            }
            for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
                walk(&e.path(), words, modules);
            }
            return;
        }
        // This file's planted names are test data, not the source's.
        if path.ends_with("xtask/src/docs_generated.rs") {
            return;
        }
        if let Some(stem) = name.strip_suffix(".rs") {
            modules.insert(stem.to_string());
            if let Ok(text) = std::fs::read_to_string(path) {
                words.extend(
                    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .filter(|w| !w.is_empty())
                        .map(str::to_string),
                );
            }
        }
    }
    let (mut words, mut modules) = (BTreeSet::new(), BTreeSet::new());
    for dir in ["crates", "harness", "xtask", "guest", "fuzz"] {
        walk(&root().join(dir), &mut words, &mut modules);
    }
    (words, modules)
}

/// The Rust paths a document names in backticks (`kloop_judge::judge`,
/// `run::trial::Verdict`) whose first part is one of kloop's crates or
/// modules, and whose parts are no identifier of the source.
fn stale_code_paths(
    text: &str,
    words: &BTreeSet<String>,
    modules: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for span in text.split('`').skip(1).step_by(2) {
        let path = span.trim_end_matches("()").trim_end_matches('!');
        let parts: Vec<&str> = path.split("::").collect();
        let is_path = parts.len() > 1
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !is_path {
            continue;
        }
        let ours = parts[0].starts_with("kloop")
            || matches!(parts[0], "crate" | "super" | "self")
            || modules.contains(parts[0]);
        if !ours {
            continue;
        }
        let missing: Vec<&str> = parts
            .iter()
            .copied()
            .filter(|p| !matches!(*p, "crate" | "super" | "self") && !words.contains(*p))
            .collect();
        if !missing.is_empty() {
            out.push(format!("`{span}`: no {} in the source", missing.join(", ")));
        }
    }
    out
}

#[test]
fn the_code_paths_the_docs_name_exist() {
    let (words, modules) = source_words();
    let mut docs = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    for dir in ["docs", "docs/dev"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                docs.push(format!("{dir}/{name}"));
            }
        }
    }
    let mut problems = Vec::new();
    for d in &docs {
        let text = std::fs::read_to_string(root().join(d)).unwrap();
        for p in stale_code_paths(&text, &words, &modules) {
            problems.push(format!("{d}: {p}"));
        }
    }
    assert!(
        problems.is_empty(),
        "code paths the docs name that the source lacks:\n{}",
        problems.join("\n")
    );
}

/// The planted case: a path of kloop's with a gone part is found; a
/// kernel function and a path of another crate are not kloop's to check.
#[test]
fn a_stale_code_path_is_found() {
    let words: BTreeSet<String> = ["known_issues", "RULE_FAMILIES", "kloop_judge"]
        .map(String::from)
        .into();
    let modules: BTreeSet<String> = ["known_issues"].map(String::from).into();
    let text = "`known_issues::RULE_SOURCES`, `kloop_judge::known_issues::RULE_FAMILIES`, `std::fs::read`, `perf_event_header__init_id()`";
    assert_eq!(
        stale_code_paths(text, &words, &modules),
        ["`known_issues::RULE_SOURCES`: no RULE_SOURCES in the source"]
    );
}

/// A `validate` summary the docs quote (`38 same, 1 fixed, …`) is one a
/// fix's validation recorded in the ledger (`[[issue.fix]]`'s `summary`,
/// with its run and date), not a number typed in.
#[test]
fn every_quoted_validate_summary_is_a_recorded_one() {
    let ledger: toml::Value =
        toml::from_str(&std::fs::read_to_string(root().join("kernels/known-issues.toml")).unwrap())
            .unwrap();
    let recorded: BTreeSet<String> = ledger["issue"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("fix").and_then(|f| f.as_array()))
        .flatten()
        .filter_map(|f| f["summary"].as_str())
        .map(|s| s.split_once(": ").map_or(s, |(_, rest)| rest).to_string())
        .collect();
    let mut problems = Vec::new();
    for doc in ["README.md", "docs/usage.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let quoted = line.contains(" same, ")
                && line.contains(" fixed, ")
                && line.contains(" incomparable");
            if quoted && line.starts_with(|c: char| c.is_ascii_digit()) && !recorded.contains(line)
            {
                problems.push(format!(
                    "{doc}:{}: `{line}` is no fix validation the ledger recorded",
                    n + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
