//! The docs' generated sections are what `cargo xtask docs` writes now
//! (`kloop::session::docs`), and the list of environment variables they
//! are written from names exactly the `KLOOP_` variables the source reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives in the workspace root")
        .to_path_buf()
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
