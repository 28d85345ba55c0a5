//! Each command one room: every command of `cargo xtask` (clap's list,
//! [`crate::flags::Cli`]) has its file `xtask/src/<command>_cmd.rs`
//! (`-` → `_`; the files the dispatch reaches through [`crate::flags::Run`],
//! which each command's file implements for its flags) and its entry in
//! `harness/src/session/<command>.rs`, which that file calls, so the
//! orchestration lives in the library and the xtask keeps only flags, one
//! call and drawing.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

/// Commands without a session, and why.
const EXEMPT: &[(&str, &str)] = &[(
    "check-perf-data",
    "the kloop-perf-data crate's tool, meant for production hosts: one \
     file read and judged by that crate, nothing of a session's",
)];

/// Commands another command's session serves.
const SERVED_BY: &[(&str, &str)] = &[("bless", "vm_test"), ("bisect-step", "bisect")];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives in the workspace root")
        .to_path_buf()
}

/// What is wrong with the checkout at `root` for `commands`: a command
/// without its xtask file, without its session file, or whose xtask file
/// does not call its session.
fn problems(root: &Path, commands: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for cmd in commands {
        // A command another serves lives in that command's file.
        let own = SERVED_BY
            .iter()
            .find(|(c, _)| c == cmd)
            .map_or_else(|| cmd.replace('-', "_"), |(_, s)| s.to_string());
        let file = format!("xtask/src/{own}_cmd.rs");
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
            problems.push(format!("`{cmd}` has no {file}"));
            continue;
        };
        if EXEMPT.iter().any(|(c, _)| c == cmd) {
            continue;
        }
        let session = SERVED_BY
            .iter()
            .find(|(c, _)| c == cmd)
            .map_or_else(|| cmd.replace('-', "_"), |(_, s)| s.to_string());
        let session_dir = root.join("harness/src/session");
        if !session_dir.join(format!("{session}.rs")).is_file()
            && !session_dir.join(session.as_str()).join("mod.rs").is_file()
        {
            problems.push(format!(
                "`{cmd}` has no harness/src/session/{session}.rs (nor a place in EXEMPT)"
            ));
        }
        if !text.contains(&format!("kloop::session::{session}")) {
            problems.push(format!(
                "`{cmd}`: {file} does not call kloop::session::{session}"
            ));
        }
    }
    for (c, _) in EXEMPT.iter().chain(SERVED_BY) {
        if !commands.iter().any(|x| x == c) {
            problems.push(format!("`{c}` is listed here but is no command"));
        }
    }
    problems
}

#[test]
fn every_command_has_its_session() {
    let commands: Vec<String> = crate::flags::Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(commands.len() > 10, "clap's commands: {commands:?}");
    let problems = problems(&root(), &commands);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_command_without_its_session_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("xtask/src")).unwrap();
    std::fs::create_dir_all(root.join("harness/src/session")).unwrap();
    std::fs::write(root.join("harness/src/session/foo.rs"), "").unwrap();
    std::fs::write(root.join("harness/src/session/vm_test.rs"), "").unwrap();
    std::fs::write(root.join("xtask/src/foo_cmd.rs"), "kloop::run::foo()").unwrap();
    std::fs::write(
        root.join("xtask/src/bar_baz_cmd.rs"),
        "kloop::session::vm_test::x()",
    )
    .unwrap();
    std::fs::write(root.join("xtask/src/check_perf_data_cmd.rs"), "").unwrap();
    std::fs::write(root.join("xtask/src/vm_test_cmd.rs"), "kloop::run::suite()").unwrap();
    let commands: Vec<String> = ["foo", "bar-baz", "bless", "check-perf-data", "bisect-step"]
        .map(String::from)
        .into();
    assert_eq!(
        problems(root, &commands),
        [
            "`foo`: xtask/src/foo_cmd.rs does not call kloop::session::foo",
            "`bar-baz` has no harness/src/session/bar_baz.rs (nor a place in EXEMPT)",
            "`bar-baz`: xtask/src/bar_baz_cmd.rs does not call kloop::session::bar_baz",
            "`bless`: xtask/src/vm_test_cmd.rs does not call kloop::session::vm_test",
            "`bisect-step` has no xtask/src/bisect_cmd.rs",
        ]
    );
}
