//! The rooms import only downwards: `ci/module-cycles.py` finds no import
//! cycle between the modules of any crate (the guest's layers, the
//! library's rooms, the focused crates under `crates/`), at the depth of
//! their folders. And every test target is in a CI tier.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::path::Path;
use std::process::Command;

#[test]
fn no_module_imports_another_in_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut srcs = vec![root.join("guest/src"), root.join("harness/src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            srcs.push(src);
        }
    }
    let out = Command::new("python3")
        .arg(root.join("ci/module-cycles.py"))
        .args(["--depth", "2"])
        .args(&srcs)
        .output()
        .expect("running python3 ci/module-cycles.py (install python3: ci/setup.sh does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import cycles:\n{text}");
    assert_eq!(
        text.matches("no cycle").count(),
        srcs.len(),
        "every crate checked:\n{text}"
    );
}

/// Every test target is in exactly one CI tier (`ci/test-tiers.txt`), so
/// CI's jobs, which run the tiers by name, cannot skip a new test file.
#[test]
fn every_test_target_has_a_ci_tier() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg(root.join("ci/test-tiers.py"))
        .arg("check")
        // The cargo that runs this test lists the targets (`cargo metadata`).
        .env("CARGO", env!("CARGO"))
        .output()
        .expect("running python3 ci/test-tiers.py (install python3: ci/setup.sh does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ci/test-tiers.py check:\n{text}");
}

/// The judge does no I/O because it cannot: its dependencies are the wire
/// types, the record parser and data-format crates, never QEMU, kernels,
/// the filesystem helpers or plotting (a new dependency must be added
/// here on purpose).
#[test]
fn the_judge_depends_on_no_io_crate() {
    assert_depends_only_on(
        "crates/judge",
        &[
            "kloop-protocol",
            "kloop-records",
            "serde",
            "serde_json",
            "thiserror",
            "tracing",
            "toml",
            "hex",
            "similar",
        ],
    );
}

/// Fails unless every `[dependencies]` entry of the crate at `dir` is in
/// `allowed`.
fn assert_depends_only_on(dir: &str, allowed: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap())
            .unwrap();
    let deps: Vec<&str> = manifest["dependencies"]
        .as_table()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let extra: Vec<&&str> = deps.iter().filter(|d| !allowed.contains(d)).collect();
    assert!(extra.is_empty(), "{dir} depends on {extra:?}");
}

/// Architecture invariant: `check-perf-data`, a tool for production hosts,
/// needs kloop's parser, the judge's ledger and a perf.data reader (and
/// the one path-I/O error, which needs `thiserror` alone), never QEMU,
/// kernel builds or the harness.
#[test]
fn perf_data_depends_on_the_parser_the_judge_and_its_reader_only() {
    assert_depends_only_on(
        "crates/perf-data",
        &[
            "kloop-path-io",
            "kloop-protocol",
            "kloop-records",
            "kloop-judge",
            "linux-perf-data",
            "serde",
            "thiserror",
        ],
    );
}

/// Architecture invariant: the one path-I/O error sits under every crate
/// that reads or writes files (`kloop-kernels`, `kloop-qemu`, the
/// harness), so it depends on nothing of kloop's and on `thiserror` alone.
#[test]
fn path_io_depends_on_thiserror_only() {
    assert_depends_only_on("crates/path-io", &["thiserror"]);
}

/// Architecture invariant: `kloop-mutate` makes mutants from text (the
/// operators, their schemata, the C source they read): no kernel builds,
/// no processes, no file I/O, so it needs no crate of kloop's and only
/// pure-computation ones (diffs made and applied in memory).
#[test]
fn mutate_depends_on_text_crates_only() {
    assert_depends_only_on("crates/mutate", &["serde", "similar", "diffy", "thiserror"]);
}

/// Architecture invariant: nothing under `crates/` depends on the harness
/// (`kloop`) or the xtask: the focused crates are the ground floor, and
/// what the xtask alone shows (its terminal view) lives in the xtask.
#[test]
fn no_ground_floor_crate_depends_on_the_floors_above() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let manifest_value: toml::Value = toml::from_str(&text).unwrap();
        for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = manifest_value.get(table).and_then(|t| t.as_table()) else {
                continue;
            };
            for up in ["kloop", "xtask"] {
                assert!(
                    !deps.contains_key(up),
                    "{} depends on {up} ({table}): a back arrow",
                    manifest.display()
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 7,
        "only {checked} crates under crates/ were checked"
    );
}

/// `kernels/known-issues.toml` parses and names only pins, rules and
/// scenarios that exist.
#[test]
fn the_committed_ledger_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let layout = kloop::workspace::Layout::from_root(&root);
    let ledger = kloop::workspace::load_ledger(&layout).unwrap();
    assert!(ledger.path.is_some(), "kernels/known-issues.toml exists");
    assert!(!ledger.issues.is_empty());
}

/// The harness's rooms and the rooms each may import (`crate::<room>`):
/// the map ARCHITECTURE.md draws. `judge` and `perf_data` are the ground
/// floor crates' re-exports and open to every room.
const ROOMS: &[(&str, &[&str])] = &[
    ("scenario", &[]),
    ("workspace", &["scenario"]),
    ("run", &["workspace", "scenario"]),
    ("doctor", &["run", "workspace"]),
    ("report", &["run", "workspace", "scenario"]),
    ("mutants", &["report", "run", "workspace", "scenario"]),
    (
        "session",
        &[
            "mutants",
            "report",
            "run",
            "doctor",
            "workspace",
            "scenario",
        ],
    ),
];

/// The `crate::<room>` paths the code under `path` (a file, or a folder
/// read through) names, with the file naming each (comments left out: a
/// doc link may point anywhere).
fn rooms_named_in(path: &Path, found: &mut Vec<(String, String)>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rooms_named_in(&entry.unwrap().path(), found);
        }
        return;
    }
    if path.extension().is_none_or(|e| e != "rs") {
        return;
    }
    let text = std::fs::read_to_string(path).unwrap();
    for line in text.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let module = |text: &str| -> String {
            text.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        };
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            match rest.strip_prefix('{') {
                // `crate::{a, b::c}`: each path's first module (a group
                // on one line; rustfmt keeps short ones so).
                Some(group) => {
                    let group = group.split('}').next().unwrap_or("");
                    for part in group.split(',').filter(|p| !p.trim().is_empty()) {
                        found.push((module(part), path.display().to_string()));
                    }
                }
                None => found.push((module(rest), path.display().to_string())),
            }
        }
    }
}

/// Architecture invariant: each room of the harness imports only the
/// rooms below it (`ROOMS`), and every room is on that map: a new folder
/// under `harness/src` fails here until its place is decided.
#[test]
fn rooms_import_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut on_disk = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let room = if path.is_dir() {
            name != "testdata"
        } else {
            path.extension().is_some_and(|e| e == "rs") && name != "lib"
        };
        if room {
            on_disk.push(name);
        }
    }
    on_disk.sort();
    let mut mapped: Vec<String> = ROOMS.iter().map(|(r, _)| r.to_string()).collect();
    mapped.sort();
    assert_eq!(on_disk, mapped, "rooms under harness/src against ROOMS");

    let mut back_arrows = Vec::new();
    for (room, below) in ROOMS {
        let dir = src.join(room);
        let path = if dir.is_dir() {
            dir
        } else {
            src.join(format!("{room}.rs"))
        };
        let mut found = Vec::new();
        rooms_named_in(&path, &mut found);
        for (name, file) in found {
            let allowed = name == *room
                || name == "judge"
                || name == "perf_data"
                || below.contains(&name.as_str());
            if !allowed {
                back_arrows.push(format!("{file}: {room} imports crate::{name}"));
            }
        }
    }
    assert!(
        back_arrows.is_empty(),
        "imports against the room order:\n{}",
        back_arrows.join("\n")
    );
}

/// The planted case for `rooms_import_only_downwards`: the scan sees a
/// `crate::` path in code and not in a comment.
#[test]
fn the_room_scan_sees_code_and_skips_comments() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.rs"),
        "//! see [`crate::session`]\nuse crate::report::x;\n    // crate::run\nfn f() { crate::run::g() }\n",
    )
    .unwrap();
    let mut found = Vec::new();
    rooms_named_in(dir.path(), &mut found);
    let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["report", "run"]);
}

/// The modules of one binary's `src` by floor, top first: a module may
/// import (`crate::<module>`) only modules on a floor below its own, never
/// one beside it or above, nor the crate root's own items (`crate::X`,
/// `crate::*`: the dispatch's). `main` is the root and above every floor.
/// Every module on disk must be on a floor, so a new one fails here until
/// its place is decided. Returns the back arrows found.
fn back_arrows_in(src: &Path, floors: &[Vec<String>]) -> Vec<String> {
    let mut on_disk = Vec::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if (path.is_dir() || path.extension().is_some_and(|e| e == "rs")) && name != "main" {
            on_disk.push(name);
        }
    }
    on_disk.sort();
    let mut mapped: Vec<String> = floors.iter().flatten().cloned().collect();
    mapped.sort();
    assert_eq!(
        on_disk,
        mapped,
        "modules under {} against their floors",
        src.display()
    );
    let mut arrows = Vec::new();
    for (level, floor) in floors.iter().enumerate() {
        let below: Vec<&String> = floors[level + 1..].iter().flatten().collect();
        for module in floor {
            let dir = src.join(module);
            let path = if dir.is_dir() {
                dir
            } else {
                src.join(format!("{module}.rs"))
            };
            let mut found = Vec::new();
            rooms_named_in(&path, &mut found);
            for (name, file) in found {
                if name != *module && !below.iter().any(|b| **b == name) {
                    let what = if name.is_empty() {
                        "the crate root's items".to_string()
                    } else {
                        format!("crate::{name}")
                    };
                    arrows.push(format!("{file}: {module} imports {what}"));
                }
            }
        }
    }
    arrows
}

fn floor(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Architecture invariant: inside the xtask, each command's file
/// (`<command>_cmd.rs`) imports only the shared helpers, the flags and
/// the view below it: never `main.rs` (the dispatch) or another command.
#[test]
fn the_xtask_imports_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/src");
    let mut commands: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix("_cmd.rs").map(|c| format!("{c}_cmd")))
        .collect();
    // The checks of the xtask's own tree sit beside the commands.
    commands.extend(floor(&["docs_check", "docs_generated", "session_check"]));
    let floors = [commands, floor(&["shared"]), floor(&["flags", "view"])];
    let arrows = back_arrows_in(&src, &floors);
    assert!(
        arrows.is_empty(),
        "back arrows in the xtask:\n{}",
        arrows.join("\n")
    );
}

/// Architecture invariant: the guest's modules are layered, from the
/// system calls up to the runner; a module imports only those below it.
#[test]
fn the_guest_imports_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/src");
    let floors = [
        floor(&["by_hand"]),
        floor(&["runner", "shell"]),
        floor(&["steps"]),
        floor(&["context"]),
        floor(&["arm64_insn"]),
        floor(&["bpf", "perf", "init", "jit_books", "exec_areas", "wakeups"]),
        floor(&["channel", "kallsyms"]),
        floor(&["modules", "btf", "fixtures", "kernel_log"]),
        floor(&["sys"]),
    ];
    let arrows = back_arrows_in(&src, &floors);
    assert!(
        arrows.is_empty(),
        "back arrows in the guest:\n{}",
        arrows.join("\n")
    );
}

/// The planted case for the floors: a module importing one beside it, one
/// above it and the root's items is caught; one below is not.
#[test]
fn the_floor_check_sees_sideways_upward_and_root_imports() {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    w("main.rs", "mod a_cmd; mod b_cmd; mod shared;\n");
    w(
        "a_cmd.rs",
        "use crate::shared::x;\nuse crate::b_cmd::y;\nuse crate::*;\n",
    );
    w("b_cmd.rs", "use crate::shared::x;\n");
    w("shared.rs", "fn f() { crate::a_cmd::g() }\n");
    let floors = [floor(&["a_cmd", "b_cmd"]), floor(&["shared"])];
    let mut arrows = back_arrows_in(dir.path(), &floors);
    arrows
        .iter_mut()
        .for_each(|a| *a = a.rsplit_once(": ").unwrap().1.to_string());
    arrows.sort();
    assert_eq!(
        arrows,
        [
            "a_cmd imports crate::b_cmd",
            "a_cmd imports the crate root's items",
            "shared imports crate::a_cmd"
        ]
    );
}

/// Architecture invariant: a failed file-system operation on a path is
/// said by the one `kloop_path_io::PathIo` (`crates/path-io`): no enum
/// variant anywhere in the workspace holds a `path` field of its own
/// beside an `io::Error` `source`.
#[test]
fn no_error_variant_holds_a_path_beside_an_io_error() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["crates", "harness", "xtask", "guest", "fuzz"] {
        rust_files_under(&root.join(dir), &mut files);
    }
    assert!(files.len() > 200, "only {} .rs files found", files.len());
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in path_and_io_variants(&text) {
            let shown = file.strip_prefix(&root).unwrap_or(file);
            offences.push(format!("{}:{line}", shown.display()));
        }
    }
    assert!(
        offences.is_empty(),
        "enum variants holding their own `path` and `source: io::Error`; use \
         kloop_path_io::PathIo instead (`#[error(transparent)] Io(#[from] PathIo)`, built \
         with `.at(what, path)` at the failing call; or `Variant(#[source] PathIo)` when its \
         message adds a next step):\n{}",
        offences.join("\n")
    );
}

/// The planted cases for `no_error_variant_holds_a_path_beside_an_io_error`:
/// a variant over several lines or on one, with `#[source]` or not, is
/// seen; a struct literal, `path::` in a type, or one of the two fields
/// alone is not. (Each fixture line starts with a quote, so that this file
/// does not hold such a variant itself.)
#[test]
fn the_path_io_scan_sees_a_hand_written_variant() {
    let planted = concat!(
        "/// Why.\n#[derive(Debug, thiserror::Error)]\npub enum E {\n",
        "    #[error(\"reading {path}: {source}\")]\n",
        "    Read {\n        /// The file.\n        path: std::path::PathBuf,\n",
        "        #[source]\n        source: std::io::Error,\n    },\n",
        "    Write { path: String, #[source] source: io::Error },\n",
        "    Both { path: PathBuf, map: BTreeMap<String, u8>, source: std::io::Error },\n",
        "}\n",
    );
    assert_eq!(path_and_io_variants(planted), [5, 11, 12]);
    let innocent = concat!(
        "pub enum E {\n",
        "    Io(#[from] PathIo),\n",
        "    Step { what: &'static str, source: std::io::Error },\n",
        "    Spawn { qemu: std::path::PathBuf, source: io::Error },\n",
        "    Parse { path: PathBuf, source: toml::de::Error },\n",
        "    // Old { path: PathBuf, source: io::Error },\n",
        "}\n",
        "fn f() -> E {\n",
        "    E::Read {\n        path: p,\n        source: std::io::Error::new(k, \"gone\"),\n    }\n",
        "}\n",
        "pub struct PathIo {\n    pub path: Option<PathBuf>,\n    pub source: std::io::Error,\n}\n",
    );
    assert_eq!(path_and_io_variants(innocent), Vec::<usize>::new());
}

/// Every `.rs` file under `dir`, build output (`target/`) and hidden
/// folders left out.
fn rust_files_under(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files_under(&path, files);
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
}

/// The lines (1-based) of the enum variants in `text` with both a `path`
/// field and a `source` field of type `io::Error` or `std::io::Error`: a
/// capitalised name, then a `{`, and the fields up to its `}` on however
/// many lines (comments left out).
fn path_and_io_variants(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().map(code_of).collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(open) = line.find('{') else {
            continue;
        };
        let name = line[..open].trim();
        let variant = name.starts_with(|c: char| c.is_ascii_uppercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !variant {
            continue;
        }
        let fields = fields_of(&body_from(&lines[i..], open));
        let has = |wanted: &str, types: &[&str]| {
            fields
                .iter()
                .any(|(n, t)| n == wanted && (types.is_empty() || types.contains(&t.as_str())))
        };
        if has("path", &[]) && has("source", &["io::Error", "std::io::Error"]) {
            found.push(i + 1);
        }
    }
    found
}

/// A line without its `//` comment (one outside a string).
fn code_of(line: &str) -> &str {
    let mut in_string = false;
    let mut prev = ' ';
    for (at, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_string = !in_string,
            '/' if prev == '/' && !in_string => return &line[..at - 1],
            _ => {}
        }
        prev = c;
    }
    line
}

/// What lies between the `{` at byte `open` of `lines[0]` and the `}`
/// that closes it.
fn body_from(lines: &[&str], open: usize) -> String {
    let mut body = String::new();
    let mut depth = 0usize;
    for (j, line) in lines.iter().enumerate() {
        let from = if j == 0 { open } else { 0 };
        for c in line[from..].chars() {
            match c {
                '{' => {
                    depth += 1;
                    if depth == 1 {
                        continue;
                    }
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return body;
                    }
                }
                _ => {}
            }
            body.push(c);
        }
        body.push('\n');
    }
    body
}

/// The `name: type` fields of a braced body, attributes left out, the
/// type without spaces: split at the commas outside `<>`, `()` and `[]`.
fn fields_of(body: &str) -> Vec<(String, String)> {
    let mut parts = Vec::new();
    let (mut depth, mut part, mut prev) = (0i32, String::new(), ' ');
    for c in body.chars() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' if prev != '-' => depth -= 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut part));
                prev = c;
                continue;
            }
            _ => {}
        }
        part.push(c);
        prev = c;
    }
    parts.push(part);
    parts
        .iter()
        .filter_map(|part| {
            let field = without_attributes(part);
            let (name, ty) = field.trim().split_once(':')?;
            let name = name.trim().trim_start_matches("pub ").trim();
            let ident =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let ty: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
            ident.then(|| (name.to_string(), ty))
        })
        .collect()
}

/// `text` without its `#[...]` attributes.
fn without_attributes(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[") {
        out.push_str(&rest[..at]);
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest[at + 1..].char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + 1 + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Architecture invariant: the library crates print nothing (clippy's
/// `print_stdout` / `print_stderr` are denied in `[workspace.lints]`), so
/// each takes the workspace's lints; the binaries (guest, xtask) and the
/// fuzz targets' support print by design.
#[test]
fn every_library_crate_takes_the_workspace_lints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.push(root.join("harness"));
    // Test support for `cargo fuzz`, never linked into kloop: it keeps
    // its own `#![warn]` set (see its lib.rs).
    let exempt = ["fuzz-support"];
    let mut checked = 0;
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if exempt.contains(&name.as_str()) {
            continue;
        }
        let manifest: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
        let workspace = manifest
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(toml::Value::as_bool);
        assert_eq!(
            workspace,
            Some(true),
            "{}: no `[lints] workspace = true`",
            dir.display()
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} library crates checked");
}

/// Architecture invariant: the judge, the record parser and the wire
/// types do no I/O: no file, environment, process or socket outside their
/// tests (a dependency test cannot see `std`).
#[test]
fn the_pure_crates_touch_no_file_environment_process_or_socket() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let forbidden = [
        "std::fs",
        "std::env",
        "std::process",
        "std::net",
        "File::",
        "Command::new",
    ];
    let mut offences = Vec::new();
    let mut files = 0;
    for krate in ["crates/judge", "crates/records", "crates/protocol"] {
        let mut stack = vec![root.join(krate).join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.file_name().unwrap().to_string_lossy();
                if !name.ends_with(".rs") || name == "tests.rs" {
                    continue;
                }
                files += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                // A file's unit tests sit after its `#[cfg(test)]`.
                let code = text.split("#[cfg(test)]").next().unwrap();
                for word in forbidden {
                    if code.contains(word) {
                        offences.push(format!("{}: {word}", path.display()));
                    }
                }
            }
        }
    }
    assert!(files > 30, "only {files} files read");
    assert!(
        offences.is_empty(),
        "I/O in a pure crate:\n{}",
        offences.join("\n")
    );
}

/// Architecture invariant: the guest agent shares only the wire types, the
/// record parser and the one path-I/O error (`thiserror` alone) with the
/// host: no harness, judge, QEMU or kernel crate reaches PID 1.
#[test]
fn the_guest_shares_only_the_protocol_and_the_parser() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("guest/Cargo.toml")).unwrap()).unwrap();
    let kloop: Vec<&String> = manifest["dependencies"]
        .as_table()
        .unwrap()
        .keys()
        .filter(|d| d.starts_with("kloop"))
        .collect();
    assert_eq!(kloop, ["kloop-path-io", "kloop-protocol", "kloop-records"]);
}

/// ARCHITECTURE.md's code map: every room's "Architecture invariant:" is
/// backed by a test it names (a `fn` of that name under `harness/tests/`
/// or `xtask/src/`) or says it is kept by review, and every test it names
/// exists, so the map cannot claim a check that is not there.
#[test]
fn the_code_maps_invariants_name_real_tests_or_review() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let map = doc
        .split("## Code map")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("ARCHITECTURE.md has a `## Code map` section");
    let mut sources = String::new();
    for dir in ["harness/tests", "xtask/src"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                sources.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    // Each bullet of the map is one room.
    let rooms: Vec<&str> = map.split("\n- ").skip(1).collect();
    assert!(
        rooms.len() >= 10,
        "only {} rooms in the code map",
        rooms.len()
    );
    let mut problems = Vec::new();
    for room in &rooms {
        let title = room.lines().next().unwrap_or_default();
        if !room.contains("Architecture invariant:") && !room.starts_with("**Every library crate**")
        {
            problems.push(format!("no invariant: {title}"));
            continue;
        }
        // A test name: a backticked snake_case word.
        let names: Vec<&str> = room
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|w| w.split(':').next().unwrap_or(w))
            .filter(|w| {
                w.matches('_').count() >= 3 && w.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
            .collect();
        for name in &names {
            if !sources.contains(&format!("fn {name}(")) {
                problems.push(format!(
                    "names a test that does not exist: {name} ({title})"
                ));
            }
        }
        if names.is_empty() && !room.contains("review") {
            problems.push(format!("neither a test nor review: {title}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
