//! Each command one room: every command of `cargo xtask` (clap's tree of
//! [`crate::Cli`]) has its entry in `harness/src/session/<command>.rs`
//! (`-` → `_`), and the xtask module its dispatch in `main.rs` calls names
//! `kloop::session::<that module>`, so the orchestration lives in the
//! library and the xtask keeps only flags, one call and drawing.

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

/// `VmTest` → `vm-test`, as clap names a subcommand.
fn kebab(variant: &str) -> String {
    let mut out = String::new();
    for (i, c) in variant.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Each command's xtask module, from `main.rs`'s dispatch: the module of
/// the function a `Cmd::X` arm calls, named by path or by its `use`.
fn dispatch_modules(main_rs: &str) -> Vec<(String, String)> {
    let body = &main_rs[main_rs.find("fn run()").expect("main.rs has fn run()")..];
    let mut out = Vec::new();
    for line in body.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("Cmd::") else {
            continue;
        };
        let variant: String = rest
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        let Some((_, call)) = line.split_once("=>") else {
            continue;
        };
        let callee: String = call
            .trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let module = match callee.rsplit_once("::") {
            Some((module, _)) => module.to_string(),
            None => main_rs
                .lines()
                .filter_map(|l| l.trim().strip_prefix("use "))
                .find(|l| {
                    l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .any(|w| w == callee)
                })
                .and_then(|l| l.split("::").next())
                .map_or_else(|| "main".to_string(), str::to_string),
        };
        out.push((kebab(&variant), module));
    }
    out
}

/// What is wrong with the checkout at `root` for `commands`: a command
/// without its session file, or whose xtask module does not call it.
fn problems(root: &Path, commands: &[String]) -> Vec<String> {
    let main_rs = std::fs::read_to_string(root.join("xtask/src/main.rs")).unwrap_or_default();
    let modules = dispatch_modules(&main_rs);
    let mut problems = Vec::new();
    for cmd in commands {
        if EXEMPT.iter().any(|(c, _)| c == cmd) {
            continue;
        }
        let session = SERVED_BY
            .iter()
            .find(|(c, _)| c == cmd)
            .map_or_else(|| cmd.replace('-', "_"), |(_, s)| s.to_string());
        if !root
            .join(format!("harness/src/session/{session}.rs"))
            .is_file()
        {
            problems.push(format!(
                "`{cmd}` has no harness/src/session/{session}.rs (nor a place in EXEMPT)"
            ));
        }
        let arms: Vec<&String> = modules
            .iter()
            .filter(|(c, _)| c == cmd)
            .map(|(_, m)| m)
            .collect();
        if arms.is_empty() {
            problems.push(format!("`{cmd}` has no arm in main.rs's dispatch"));
        }
        for module in arms {
            let path = root.join(format!("xtask/src/{module}.rs"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if !text.contains(&format!("kloop::session::{session}")) {
                problems.push(format!(
                    "`{cmd}`: xtask/src/{module}.rs does not call kloop::session::{session}"
                ));
            }
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
    let commands: Vec<String> = crate::Cli::command()
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
    std::fs::write(
        root.join("xtask/src/main.rs"),
        "use foo_cmd::foo;\nfn run() {\n    match cli.cmd {\n        Cmd::Foo(a) => foo(a),\n        Cmd::BarBaz(a) => bar_cmd::bar(a),\n        Cmd::Bless(a) => bar_cmd::bless(a),\n    }\n}\n",
    )
    .unwrap();
    std::fs::write(root.join("harness/src/session/foo.rs"), "").unwrap();
    std::fs::write(root.join("harness/src/session/vm_test.rs"), "").unwrap();
    std::fs::write(root.join("xtask/src/foo_cmd.rs"), "kloop::run::foo()").unwrap();
    std::fs::write(
        root.join("xtask/src/bar_cmd.rs"),
        "kloop::session::vm_test::x()",
    )
    .unwrap();
    let commands: Vec<String> = ["foo", "bar-baz", "bless", "check-perf-data", "bisect-step"]
        .map(String::from)
        .into();
    assert_eq!(
        problems(root, &commands),
        [
            "`foo`: xtask/src/foo_cmd.rs does not call kloop::session::foo",
            "`bar-baz` has no harness/src/session/bar_baz.rs (nor a place in EXEMPT)",
            "`bar-baz`: xtask/src/bar_cmd.rs does not call kloop::session::bar_baz",
            "`bisect-step` has no harness/src/session/bisect.rs (nor a place in EXEMPT)",
            "`bisect-step` has no arm in main.rs's dispatch",
        ]
    );
}

#[test]
fn dispatch_is_read_by_module() {
    let main_rs = "use ab_cmd::{ab_test, validate};\nfn run() {\n    match x {\n        Cmd::VmTest(a) => vm_test_cmd::bless(a),\n        Cmd::Validate(a) => validate(a),\n        Cmd::Bisect(a) if a.tree.is_some() => bisect_tree(a),\n    }\n}\n";
    assert_eq!(
        dispatch_modules(main_rs),
        vec![
            ("vm-test".to_string(), "vm_test_cmd".to_string()),
            ("validate".to_string(), "ab_cmd".to_string()),
            ("bisect".to_string(), "main".to_string()),
        ]
    );
}
