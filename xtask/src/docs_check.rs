//! The docs test: README.md, ARCHITECTURE.md, docs/*.md, docs/dev/*.md,
//! ci/test-tiers.txt and the comments of kernels/known-issues.toml may name
//! only what exists.
//!
//! It fails on
//! - a repository path that does not exist: any word whose first component
//!   is a top-level folder of the repository (`harness/src/…`, `.ci/run`),
//!   and in backticks a `.rs` file named by its tail (`steps/load.rs`) that
//!   no file ends with, or an upper-case `NAME.md` that is not at the top;
//!   run-time paths (`target/…`, `~/.cache/…`, absolute ones) and
//!   placeholders (`<name>`, `NAME`, `…`) are not checked, globs only up to
//!   their first wildcard;
//! - a Markdown link to a file that does not exist, or to a heading
//!   (`#anchor`) the document does not have, and `README "Section"`;
//! - `cargo xtask CMD --flag` (or `CMD --flag` in backticks) whose command
//!   or flag the CLI does not define: asked of clap's command tree;
//! - a rule (`rule:NAME`, ``rule `NAME` ``, a table whose first column is
//!   `rule`), scenario (`--scenario NAME`, ``scenario `NAME` ``, a trial id
//!   `PIN/NAME`), pin (`--kernel X.Y`, `pin X.Y`) or ledger id (``ledger
//!   `ID` ``, `KNOWN (ID)`, `FIXED (ID, …)`, `report-bug ID`, `--standalone
//!   ID`, `--expect-fixed ID`, `--fix NAME`) that does not exist;
//! - a test named in `cargo test … NAME` (`--test TARGET` and the filter) or
//!   in a table's `test` column that is no test of the tree;
//! - a scenario table (first column `scenario`) naming a folder that is not
//!   under `scenarios/`; README's must list every scenario exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;

/// One document, line by line.
struct Doc {
    /// Its path from the workspace root (for messages).
    name: String,
    /// `(line number, text)`; for the ledger, its comment lines only.
    lines: Vec<(usize, String)>,
    /// Markdown: code blocks, tables and links mean something.
    markdown: bool,
}

impl Doc {
    fn markdown(name: &str, text: &str) -> Doc {
        Doc {
            name: name.into(),
            lines: text
                .lines()
                .map(String::from)
                .enumerate()
                .map(|(i, l)| (i + 1, l))
                .collect(),
            markdown: true,
        }
    }

    fn plain(name: &str, lines: Vec<(usize, String)>) -> Doc {
        Doc {
            name: name.into(),
            lines,
            markdown: false,
        }
    }

    /// The line numbers and texts of its code: indented or fenced code
    /// blocks of Markdown.
    fn code_lines(&self) -> Vec<(usize, &str)> {
        let mut out = Vec::new();
        let mut fenced = false;
        for (n, l) in &self.lines {
            if !self.markdown {
                continue;
            }
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced || l.starts_with("    ") {
                out.push((*n, l.as_str()));
            }
        }
        out
    }

    /// Every backtick span, with its line number.
    fn spans(&self) -> Vec<(usize, &str)> {
        let mut out = Vec::new();
        for (n, l) in &self.lines {
            if self.markdown && l.starts_with("    ") {
                continue;
            }
            for (i, part) in l.split('`').enumerate() {
                if i % 2 == 1 && !part.is_empty() {
                    out.push((*n, part));
                }
            }
        }
        out
    }

    /// Spans and code lines: where commands are written.
    fn command_texts(&self) -> Vec<(usize, &str)> {
        let mut out = self.spans();
        out.extend(self.code_lines());
        out
    }

    /// Markdown tables: `(header cells, rows of (line, cells))`.
    fn tables(&self) -> Vec<Table> {
        let mut out: Vec<Table> = Vec::new();
        let mut in_table = false;
        for (n, l) in &self.lines {
            let t = l.trim();
            if !self.markdown || !t.starts_with('|') {
                in_table = false;
                continue;
            }
            let cells = split_row(t);
            if cells.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
                continue;
            }
            if in_table {
                out.last_mut().expect("a table").1.push((*n, cells));
            } else {
                out.push((cells, Vec::new()));
                in_table = true;
            }
        }
        out
    }

    /// The anchors of its headings, as GitHub makes them.
    fn anchors(&self) -> BTreeSet<String> {
        self.lines
            .iter()
            .filter(|(_, l)| l.starts_with('#'))
            .map(|(_, l)| slug(l.trim_start_matches('#').trim()))
            .collect()
    }
}

/// A Markdown table: its header cells, and its rows as (line, cells).
type Table = (Vec<String>, Vec<(usize, Vec<String>)>);

/// The cells of a table row, `\|` kept inside a cell.
fn split_row(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut chars = row.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cur).trim().to_string()),
            c => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        cells.push(cur.trim().to_string());
    }
    cells
}

fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The backtick spans of a text.
fn spans_of(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// What the documents may name.
struct Known {
    root: PathBuf,
    /// Every file and folder of the tree, relative (`harness/src/lib.rs`,
    /// `harness/src`).
    paths: BTreeSet<String>,
    /// The top-level folders (`ci`, `.ci`, `harness`, …).
    top: BTreeSet<String>,
    cli: clap::Command,
    rules: BTreeSet<String>,
    scenarios: BTreeSet<String>,
    pins: BTreeSet<String>,
    ledger: BTreeSet<String>,
    /// Folders of `kernels/fixes/`: what `--fix` takes.
    fixes: BTreeSet<String>,
    /// `kernels/sources/*.toml`: what `--source` takes by name.
    sources: BTreeSet<String>,
    /// Test targets (`ci/test-tiers.txt`, which `ci/test-tiers.py check`
    /// holds to cargo's list).
    targets: BTreeSet<String>,
    /// Test paths as libtest filters match them (`update::network_tests::
    /// seed_missing_pins`), libtest-mimic trial names and VM trial ids.
    tests: BTreeSet<String>,
}

const SKIP_DIRS: &[&str] = &["target", ".git", "node_modules"];

fn walk(root: &Path, rel: &str, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if SKIP_DIRS.contains(&name.as_str()) {
            continue;
        }
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let dir = e.file_type().is_ok_and(|t| t.is_dir());
        out.insert(path.clone());
        if dir {
            walk(root, &path, out);
        }
    }
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

impl Known {
    fn of(root: &Path) -> Known {
        let mut paths = BTreeSet::new();
        walk(root, "", &mut paths);
        let top = paths
            .iter()
            .filter(|p| !p.contains('/') && root.join(p).is_dir())
            .cloned()
            .collect();
        let names_in = |dir: &str, ext: &str| -> BTreeSet<String> {
            paths
                .iter()
                .filter_map(|p| p.strip_prefix(dir)?.strip_suffix(ext))
                .filter(|n| !n.contains('/'))
                .map(String::from)
                .collect()
        };
        let scenarios = paths
            .iter()
            .filter_map(|p| p.strip_prefix("scenarios/")?.strip_suffix("/scenario.toml"))
            .map(String::from)
            .collect();
        let pins: BTreeSet<String> = names_in("kernels/", ".toml")
            .into_iter()
            .filter(|n| n.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .collect();
        let ledger = read(root, "kernels/known-issues.toml")
            .lines()
            .filter_map(|l| l.strip_prefix("id = \""))
            .map(|l| l.trim_end_matches('"').to_string())
            .collect();
        let fixes = paths
            .iter()
            .filter_map(|p| p.strip_prefix("kernels/fixes/"))
            .filter(|n| !n.contains('/'))
            .map(String::from)
            .collect();
        let mut rules: BTreeSet<String> = kloop::judge::known_issues::rule_names()
            .into_iter()
            .map(String::from)
            .collect();
        rules.extend(kloop::perf_data::RULES.iter().map(|r| r.to_string()));
        let targets = read(root, "ci/test-tiers.txt")
            .lines()
            .filter_map(|l| {
                let words: Vec<&str> = l.split('#').next()?.split_whitespace().collect();
                (words.len() == 2).then(|| words[1].to_string())
            })
            .collect();
        let mut cli = crate::flags::Cli::command();
        cli.build();
        let mut known = Known {
            root: root.to_path_buf(),
            sources: names_in("kernels/sources/", ".toml"),
            paths,
            top,
            cli,
            rules,
            scenarios,
            pins,
            ledger,
            fixes,
            targets,
            tests: BTreeSet::new(),
        };
        known.tests = known.test_names();
        known
    }

    /// Every test of the tree as libtest's filter sees it, every
    /// libtest-mimic trial, every VM trial id.
    fn test_names(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for p in &self.paths {
            if !p.ends_with(".rs") || p.starts_with("fuzz/") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(self.root.join(p)) else {
                continue;
            };
            let module = module_path(p);
            let mut inner = String::new();
            let mut is_test = false;
            for line in text.lines() {
                let t = line.trim_start();
                if let Some(m) = t
                    .strip_prefix("mod ")
                    .or_else(|| t.strip_prefix("pub(crate) mod "))
                {
                    inner = m.trim_end_matches(['{', ' ', ';']).to_string();
                }
                if t.starts_with("#[test]") {
                    is_test = true;
                } else if is_test && (t.starts_with("fn ") || t.starts_with("async fn ")) {
                    let name = t
                        .split("fn ")
                        .nth(1)
                        .unwrap_or("")
                        .split('(')
                        .next()
                        .unwrap_or("");
                    let full = [module.as_str(), inner.as_str(), name]
                        .iter()
                        .filter(|s| !s.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join("::");
                    out.insert(full);
                    is_test = false;
                } else if is_test && !t.starts_with("#[") && !t.starts_with("//") && !t.is_empty() {
                    is_test = false;
                }
                for prefix in ["Trial::test(\"", "Trial::ignorable_test(\"", "vm(\""] {
                    if let Some(rest) = line.split(prefix).nth(1) {
                        out.insert(rest.split('"').next().unwrap_or("").to_string());
                    }
                }
            }
        }
        out.extend(self.targets.iter().cloned());
        for pin in &self.pins {
            for s in &self.scenarios {
                out.insert(format!("{pin}/{s}"));
            }
        }
        out
    }

    fn exists(&self, rel: &str) -> bool {
        self.paths.contains(rel.trim_end_matches('/'))
    }

    /// A file named by its tail (`steps/load.rs`, `mod.rs`).
    fn some_file_ends_with(&self, tail: &str) -> bool {
        self.exists(tail) || self.paths.iter().any(|p| p.ends_with(&format!("/{tail}")))
    }

    fn is_test(&self, filter: &str) -> bool {
        self.tests.iter().any(|t| t.contains(filter))
    }
}

/// A source file's module path as libtest prints it (`crates/kernels/src/
/// update.rs` → `update`; a tests/ file is its own crate: empty).
fn module_path(rel: &str) -> String {
    let Some((_, inner)) = rel.split_once("/src/") else {
        return String::new();
    };
    let inner = inner.trim_end_matches(".rs");
    let parts: Vec<&str> = inner
        .split('/')
        .filter(|p| !matches!(*p, "mod" | "lib" | "main"))
        .collect();
    if rel.contains("/src/bin/") {
        return String::new();
    }
    parts.join("::")
}

/// One thing a document names that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Finding {
    doc: String,
    line: usize,
    what: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.doc, self.line, self.what)
    }
}

/// The findings of one document.
struct Report<'a> {
    doc: &'a Doc,
    out: BTreeSet<Finding>,
}

impl<'a> Report<'a> {
    fn new(doc: &'a Doc) -> Report<'a> {
        Report {
            doc,
            out: BTreeSet::new(),
        }
    }

    fn add(&mut self, line: usize, what: String) {
        self.out.insert(Finding {
            doc: self.doc.name.clone(),
            line,
            what,
        });
    }
}

/// A word that stands for something to fill in, or is not one name.
fn placeholder(word: &str) -> bool {
    word.is_empty()
        || word.contains(['<', '>', '…', '$', '{', '}', '~', '|', '='])
        || word.contains("...")
        || (word.chars().any(|c| c.is_ascii_uppercase())
            && word.chars().all(|c| !c.is_ascii_lowercase()))
}

fn trim_word(w: &str) -> &str {
    w.trim_start_matches(['(', '[', '"', '\'', '*', '`'])
        .trim_end_matches([',', '.', ';', ':', ')', ']', '"', '\'', '*', '!', '?', '`'])
}

// ------------------------------------------------------------------ paths

fn check_paths(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    for (n, line) in &doc.lines {
        for raw in line.split_whitespace() {
            for piece in raw.split("](") {
                check_rooted(piece, *n, known, r);
            }
        }
    }
    for (n, span) in doc.spans() {
        let word = span.trim();
        if word.contains(char::is_whitespace) || placeholder(word) {
            continue;
        }
        let word = word.strip_prefix("./").unwrap_or(word);
        let first = word.split('/').next().unwrap_or("");
        if known.top.contains(first) || word.starts_with('/') || word.starts_with("target/") {
            continue;
        }
        if word.ends_with(".rs") && !word.contains(['*', ':']) && !known.some_file_ends_with(word) {
            r.add(
                n,
                format!("`{word}`: no file of the repository is (or ends with) this path"),
            );
        }
        let stem = word.strip_suffix(".md").unwrap_or("");
        if !stem.is_empty()
            && !word.contains('/')
            && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            && !known.exists(word)
        {
            r.add(n, format!("`{word}` does not exist"));
        }
    }
    if doc.markdown {
        check_links(doc, known, r);
    }
    check_sections(doc, known, r);
    // Upper-case documents named in prose (`DESIGN.md`), outside
    // backticks (where `FILE.md` is a placeholder).
    for (n, line) in &doc.lines {
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for w in prose.split_whitespace() {
            let w = trim_word(w);
            if let Some(stem) = w.strip_suffix(".md") {
                if stem.len() > 2
                    && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && !known.exists(w)
                    && !known.exists(&format!("docs/{w}"))
                {
                    r.add(*n, format!("{w} does not exist"));
                }
            }
        }
    }
}

/// A word whose first component is a top-level folder must exist.
fn check_rooted(raw: &str, n: usize, known: &Known, r: &mut Report<'_>) {
    let raw = raw.strip_suffix("'s").unwrap_or(raw);
    let word = trim_word(raw.trim_matches('`'));
    let word = word.strip_prefix("./").unwrap_or(word);
    let Some((first, _)) = word.split_once('/') else {
        return;
    };
    let placeholder_part = word
        .split('/')
        .any(|c| placeholder(c.split('.').next().unwrap_or(c)));
    if !known.top.contains(first) || placeholder(word) || placeholder_part || word.contains("://") {
        return;
    }
    // `path:123` and `path#anchor` name the path.
    let word = word.split('#').next().unwrap_or(word);
    let word = match word.rsplit_once(':') {
        Some((p, l)) if l.chars().all(|c| c.is_ascii_digit()) => p,
        _ => word,
    };
    // A glob: the folder before its first wildcard.
    let word = match word.find(['*', '?', '[']) {
        Some(i) => word[..i].rsplit_once('/').map_or("", |(d, _)| d),
        None => word,
    };
    if !word.is_empty() && !known.exists(word) {
        r.add(n, format!("{word} does not exist"));
    }
}

fn check_links(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    let anchors = doc.anchors();
    let doc_dir = Path::new(&doc.name).parent().unwrap_or(Path::new(""));
    for (n, line) in &doc.lines {
        for part in line.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            if file.is_empty() {
                if !anchor.is_empty() && !anchors.contains(anchor) {
                    r.add(*n, format!("link to #{anchor}: no such heading here"));
                }
                continue;
            }
            let rel = normalise(&doc_dir.join(file));
            if !known.exists(&rel) {
                r.add(*n, format!("link to {file}: {rel} does not exist"));
            } else if !anchor.is_empty() && rel.ends_with(".md") {
                let other = Doc::markdown(&rel, &read(&known.root, &rel));
                if !other.anchors().contains(anchor) {
                    r.add(
                        *n,
                        format!("link to {file}#{anchor}: no such heading there"),
                    );
                }
            }
        }
    }
}

/// `README "Verdicts"`: a section by its title.
fn check_sections(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    for (n, line) in &doc.lines {
        for (doc_name, file) in [("README", "README.md"), ("ARCHITECTURE", "ARCHITECTURE.md")] {
            check_section_refs(line, *n, doc_name, file, known, r);
        }
    }
}

fn check_section_refs(
    line: &str,
    n: usize,
    name: &str,
    file: &str,
    known: &Known,
    r: &mut Report<'_>,
) {
    for part in line.split(name).skip(1) {
        let part = part.trim_start_matches(".md").trim_start_matches("'s");
        let Some(rest) = part
            .strip_prefix(" \"")
            .or_else(|| part.strip_prefix(" section \""))
        else {
            continue;
        };
        let title = rest.split('"').next().unwrap_or("");
        let target = Doc::markdown(file, &read(&known.root, file));
        if !target.anchors().contains(&slug(title)) {
            r.add(n, format!("{name} has no section \"{title}\""));
        }
    }
}

fn normalise(p: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into()),
            _ => {}
        }
    }
    parts.join("/")
}

// -------------------------------------------------------------- commands

/// The words of a command line up to its end (a pipe, `&&`, `;`, `#`, a
/// redirection).
fn command_words(rest: &str) -> Vec<&str> {
    rest.split_whitespace()
        .take_while(|w| {
            !matches!(*w, "|" | "&&" | "||" | ";" | "#" | ">" | "2>&1" | "<") && !w.starts_with('>')
        })
        .collect()
}

fn check_xtask(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    let subcommands: BTreeSet<String> = known
        .cli
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for (n, text) in doc.command_texts() {
        for rest in text.split("cargo xtask").skip(1) {
            check_xtask_words(&command_words(rest), n, known, r);
        }
        // `vm-test --boot cold` in backticks: a command without its prefix.
        let words = command_words(text.trim());
        if !text.contains("cargo xtask")
            && words.first().is_some_and(|w| subcommands.contains(*w))
            && words.iter().any(|w| w.starts_with("--"))
        {
            check_xtask_words(&words, n, known, r);
        }
    }
}

fn check_xtask_words(words: &[&str], n: usize, known: &Known, r: &mut Report<'_>) {
    let mut cmd = &known.cli;
    let mut path = vec!["cargo xtask".to_string()];
    let mut i = 0;
    while let Some(w) = words.get(i) {
        let w = trim_word(w);
        match cmd.find_subcommand(w) {
            Some(sub) => {
                cmd = sub;
                path.push(w.to_string());
                i += 1;
            }
            None if i == 0 && cmd.has_subcommands() && !w.starts_with('-') => {
                if !placeholder(w) && w.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                    r.add(n, format!("`cargo xtask {w}`: no such command"));
                }
                return;
            }
            None if cmd.has_subcommands() && path.len() > 1 && !w.starts_with('-') => {
                if !placeholder(w) && w.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                    r.add(n, format!("`{} {w}`: no such command", path.join(" ")));
                }
                return;
            }
            None => break,
        }
    }
    let mut prev: Option<&str> = None;
    for raw in &words[i..] {
        let w = raw
            .trim_start_matches(['[', '('])
            .trim_end_matches([']', ')', ',', '.', '…', ';', ':']);
        if let Some(long) = w.strip_prefix("--") {
            let long = long.split('=').next().unwrap_or("");
            if long.is_empty() || placeholder(long) {
                prev = None;
                continue;
            }
            let defined = cmd.get_arguments().any(|a| {
                a.get_long() == Some(long)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&long))
            });
            if !defined {
                r.add(n, format!("`{} --{long}`: no such flag", path.join(" ")));
            }
            prev = Some(long);
            continue;
        }
        if let Some(short) = w.strip_prefix('-') {
            if short.len() == 1 && short.chars().all(|c| c.is_ascii_alphabetic()) {
                let c = short.chars().next().expect("one char");
                if !cmd.get_arguments().any(|a| a.get_short() == Some(c)) {
                    r.add(n, format!("`{} -{short}`: no such flag", path.join(" ")));
                }
            }
            prev = None;
            continue;
        }
        let value = w;
        match (prev, path.get(1).map(String::as_str)) {
            (Some("scenario"), _) => check_name(value, &known.scenarios, "scenario", n, r),
            (Some("kernel") | Some("baseline"), _) if is_pin_like(value) => {
                check_name(value, &known.pins, "pin", n, r)
            }
            (Some("fix"), _) => check_name(value, &known.fixes, "fix (kernels/fixes/)", n, r),
            (Some("expect-fixed") | Some("standalone"), _) => {
                check_name(value, &known.ledger, "ledger id", n, r)
            }
            (Some("source"), _) if value.starts_with("linux-source-") => check_name(
                value,
                &known.sources,
                "pinned source (kernels/sources/)",
                n,
                r,
            ),
            (None, Some("report-bug")) => check_name(value, &known.ledger, "ledger id", n, r),
            _ => {}
        }
        prev = None;
    }
}

fn is_pin_like(w: &str) -> bool {
    let mut parts = w.split('.');
    parts.clone().count() == 2
        && parts.all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

fn check_name(value: &str, set: &BTreeSet<String>, what: &str, n: usize, r: &mut Report<'_>) {
    let value = trim_word(value);
    let a_name = value
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if placeholder(value)
        || !a_name
        || value.starts_with('-')
        || (value.contains('.') && !is_pin_like(value))
    {
        return;
    }
    if !set.contains(value) {
        r.add(n, format!("{what} `{value}` does not exist"));
    }
}

fn check_cargo_test(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    const TAKES_VALUE: &[&str] = &[
        "-p",
        "--package",
        "--test",
        "--features",
        "-F",
        "--bin",
        "--target-dir",
        "-j",
        "--jobs",
        "--exclude",
        "--test-threads",
        "--skip",
        "--format",
        "--color",
    ];
    for (n, text) in doc.command_texts() {
        for rest in text.split("cargo test").skip(1) {
            let words = command_words(rest);
            let mut after_dashes = false;
            let mut filter_seen = false;
            let mut i = 0;
            while i < words.len() {
                let w = trim_word(words[i]);
                if w == "--" {
                    after_dashes = true;
                } else if w == "--test" {
                    if let Some(t) = words.get(i + 1).map(|t| trim_word(t)) {
                        if !placeholder(t) && !known.targets.contains(t) {
                            r.add(n, format!("`cargo test --test {t}`: no such test target"));
                        }
                    }
                    i += 1;
                } else if TAKES_VALUE.contains(&w) {
                    i += 1;
                } else if w.starts_with('-') {
                } else if !filter_seen {
                    filter_seen = true;
                    if !placeholder(w) && !known.is_test(w) {
                        r.add(
                            n,
                            format!(
                                "`cargo test {}{w}`: no test matches",
                                if after_dashes { "-- " } else { "" }
                            ),
                        );
                    }
                }
                i += 1;
            }
        }
    }
}

// ------------------------------------------------ rules, ids, scenarios

/// The word after each occurrence of `marker` (a backtick span right
/// after it, or the next word).
fn words_after<'t>(text: &'t str, marker: &str) -> Vec<&'t str> {
    text.match_indices(marker)
        .filter(|(i, _)| {
            *i == 0 || !text[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '-')
        })
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let rest = rest.strip_prefix('`').map_or(rest, |r| r);
            rest.split(|c: char| c == '`' || c.is_whitespace()).next()
        })
        .collect()
}

fn check_names(doc: &Doc, known: &Known, r: &mut Report<'_>) {
    for (n, line) in &doc.lines {
        for w in words_after(line, "rule `")
            .into_iter()
            .chain(words_after(line, "rules `"))
        {
            check_name(w, &known.rules, "rule", *n, r);
        }
        for span in spans_of(line)
            .into_iter()
            .chain(std::iter::once(line.as_str()).filter(|l| l.starts_with("    ")))
        {
            for w in words_after(span, "rule:") {
                check_name(trim_word(w), &known.rules, "rule", *n, r);
            }
            for marker in ["KNOWN (", "FIXED ("] {
                for part in span.split(marker).skip(1) {
                    for id in part.split(')').next().unwrap_or("").split([',', ' ']) {
                        if !id.is_empty()
                            && id
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        {
                            check_name(id, &known.ledger, "ledger id", *n, r);
                        }
                    }
                }
            }
            for trial in span.split_whitespace() {
                check_trial_id(trim_word(trial), known, *n, r);
            }
        }
        for marker in ["ledger `", "ledger entry `", "ledger id `"] {
            for w in words_after(line, marker) {
                check_name(w, &known.ledger, "ledger id", *n, r);
            }
        }
        for w in words_after(line, "scenario `") {
            check_name(w, &known.scenarios, "scenario", *n, r);
        }
        for marker in ["pin `", "pin "] {
            for w in words_after(line, marker) {
                let w = trim_word(w);
                if is_pin_like(w) {
                    check_name(w, &known.pins, "pin", *n, r);
                }
            }
        }
    }
    for (header, rows) in doc.tables() {
        if header.first().map(String::as_str) == Some("rule") {
            for (n, cells) in &rows {
                for span in spans_of(&cells[0]) {
                    check_name(span, &known.rules, "rule", *n, r);
                }
            }
        }
    }
}

/// `6.1/many-listeners`: a pin and a scenario.
fn check_trial_id(w: &str, known: &Known, n: usize, r: &mut Report<'_>) {
    let Some((pin, scenario)) = w.split_once('/') else {
        return;
    };
    if !is_pin_like(pin) || scenario.is_empty() || scenario.contains('/') || placeholder(scenario) {
        return;
    }
    if !scenario
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return;
    }
    check_name(pin, &known.pins, "pin", n, r);
    check_name(scenario, &known.scenarios, "scenario", n, r);
}

fn check_tables(doc: &Doc, known: &Known, r: &mut Report<'_>, every_scenario: bool) {
    for (header, rows) in doc.tables() {
        if header.last().map(String::as_str) == Some("test") {
            for (n, cells) in &rows {
                for span in spans_of(cells.last().expect("a cell")) {
                    check_test_name(span, known, *n, r);
                }
            }
        }
        if header.first().map(String::as_str) == Some("scenario") {
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            for (n, cells) in &rows {
                for span in spans_of(&cells[0]) {
                    check_name(span, &known.scenarios, "scenario", *n, r);
                    *seen.entry(span.to_string()).or_default() += 1;
                }
            }
            if every_scenario {
                let line = rows.first().map_or(0, |(n, _)| *n);
                for s in &known.scenarios {
                    match seen.get(s) {
                        None => r.add(line, format!("the scenario table lacks `{s}`")),
                        Some(k) if *k > 1 => {
                            r.add(line, format!("the scenario table lists `{s}` {k} times"))
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// A span in a `test` column: a test path (`pvh::tests::a_damaged_…`, a
/// test function) or a libtest-mimic trial (`vm/kernel-panic`); files are
/// the path check's.
fn check_test_name(span: &str, known: &Known, n: usize, r: &mut Report<'_>) {
    let span = span.trim();
    if placeholder(span) || span.contains(char::is_whitespace) || span.contains('.') {
        return;
    }
    let is_path = span.split("::").all(|p| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    let is_trial = span.split_once('/').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && span
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-/".contains(c))
    });
    let named = (is_path && (span.contains('_') || span.contains("::"))) || is_trial;
    if named && !known.is_test(span) {
        r.add(n, format!("test `{span}` does not exist"));
    }
}

// ------------------------------------------------------------- the test

fn check(doc: &Doc, known: &Known, every_scenario: bool) -> Vec<Finding> {
    let mut r = Report::new(doc);
    check_paths(doc, known, &mut r);
    check_xtask(doc, known, &mut r);
    check_cargo_test(doc, known, &mut r);
    check_names(doc, known, &mut r);
    check_tables(doc, known, &mut r, every_scenario);
    r.out.into_iter().collect()
}

/// The documents the test reads.
fn documents(root: &Path) -> Vec<Doc> {
    let mut docs = vec![
        Doc::markdown("README.md", &read(root, "README.md")),
        Doc::markdown("ARCHITECTURE.md", &read(root, "ARCHITECTURE.md")),
    ];
    // docs/ and the developer docs under docs/dev/ (what ARCHITECTURE.md
    // leaves out).
    for dir in ["docs", "docs/dev"] {
        let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}/: {e}"))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".md"))
            .collect();
        names.sort();
        for name in names {
            let rel = format!("{dir}/{name}");
            docs.push(Doc::markdown(&rel, &read(root, &rel)));
        }
    }
    let tiers = read(root, "ci/test-tiers.txt");
    docs.push(Doc::plain(
        "ci/test-tiers.txt",
        tiers
            .lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with('#'))
            .map(|(i, l)| (i + 1, l.to_string()))
            .collect(),
    ));
    let ledger = read(root, "kernels/known-issues.toml");
    docs.push(Doc::plain(
        "kernels/known-issues.toml",
        ledger
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with('#'))
            .map(|(i, l)| (i + 1, l.to_string()))
            .collect(),
    ));
    docs
}

fn root() -> PathBuf {
    kloop::workspace::workspace_root()
}

#[test]
fn the_docs_name_only_what_exists() {
    let root = root();
    let known = Known::of(&root);
    let findings: Vec<Finding> = documents(&root)
        .iter()
        .flat_map(|d| check(d, &known, d.name == "README.md"))
        .collect();
    assert!(
        findings.is_empty(),
        "{} stale name(s) in the docs:\n{}",
        findings.len(),
        findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn architecture_names_every_test_target() {
    let root = root();
    let known = Known::of(&root);
    let arch = read(&root, "ARCHITECTURE.md");
    let missing: Vec<&String> = known
        .targets
        .iter()
        .filter(|t| !arch.contains(&format!("`{t}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's tier list lacks these targets of ci/test-tiers.txt: {missing:?}"
    );
}

#[cfg(test)]
mod planted {
    //! Tests of the test: each checker reports a planted stale name and
    //! lets the real one through.
    use super::*;

    fn findings(text: &str) -> Vec<String> {
        let known = Known::of(&root());
        check(&Doc::markdown("planted.md", text), &known, false)
            .into_iter()
            .map(|f| f.what)
            .collect()
    }

    fn reports(text: &str, needle: &str) {
        let f = findings(text);
        assert!(
            f.iter().any(|w| w.contains(needle)),
            "{needle:?} not reported for {text:?}: {f:#?}"
        );
    }

    fn clean(text: &str) {
        let f = findings(text);
        assert!(f.is_empty(), "{text:?}: {f:#?}");
    }

    #[test]
    fn a_stale_path_is_reported() {
        reports(
            "the ledger is read by `harness/src/judge/known_issues.rs`.",
            "harness/src/judge/known_issues.rs",
        );
        reports(
            "see harness/src/known_issues.rs for the format",
            "harness/src/known_issues.rs",
        );
        reports("`steps/no_such_step.rs` runs it", "steps/no_such_step.rs");
        reports("Decisions that differ from DESIGN.md", "DESIGN.md");
        reports("[more](docs/no-such-page.md)", "docs/no-such-page.md");
        reports("see [there](#no-such-heading)", "#no-such-heading");
        reports("see README \"Verdicts\"", "no section \"Verdicts\"");
        clean("`crates/judge/src/known_issues.rs`, `steps/load.rs`, `kernels/*.toml`, `scenarios/<name>/`, `target/kloop/runs/`, [ARCHITECTURE.md](ARCHITECTURE.md)");
    }

    #[test]
    fn a_stale_command_or_flag_is_reported() {
        reports("    cargo xtask vm-test --no-such-flag", "--no-such-flag");
        reports("`cargo xtask vm-tests --kernel 6.1`", "no such command");
        reports("`cargo xtask kernels rebuild`", "no such command");
        reports("`validate --patchs my.patch`", "--patchs");
        reports("`cargo xtask vm-test --kernel 9.9`", "pin `9.9`");
        reports(
            "`cargo xtask vm-test --scenario no-such-scenario`",
            "scenario `no-such-scenario`",
        );
        clean("`cargo xtask vm-test --kernel 6.1 --scenario basic --jobs 2 -v`, `cargo xtask kernels build --source linux-source-6.12 --patch F`, `cargo xtask --help`, `vm-test --boot cold`");
    }

    #[test]
    fn a_stale_rule_scenario_pin_or_ledger_id_is_reported() {
        reports("(rule `no-such-rule`)", "rule `no-such-rule`");
        reports("`--predicate rule:no-such-rule`", "rule `no-such-rule`");
        reports(
            "| rule | what |\n|---|---|\n| `no-such-rule` | x |",
            "rule `no-such-rule`",
        );
        reports(
            "the ledger entry `no-such-bug` says",
            "ledger id `no-such-bug`",
        );
        reports(
            "    6.1/basic ... KNOWN (no-such-bug)",
            "ledger id `no-such-bug`",
        );
        reports(
            "`cargo xtask report-bug no-such-bug`",
            "ledger id `no-such-bug`",
        );
        reports("    9.9/basic ... ok", "pin `9.9`");
        reports(
            "    6.1/no-such-scenario ... ok",
            "scenario `no-such-scenario`",
        );
        reports("on pin 9.9 only", "pin `9.9`");
        clean("(rule `announced`), rule:parse, ledger entry `ksymbol-bpf-event-header-size-accumulates`, pin 6.1, `6.12/basic`");
    }

    #[test]
    fn a_stale_test_name_is_reported() {
        reports(
            "    cargo test -p xtask --test no_such_target",
            "no such test target",
        );
        reports(
            "    cargo test -p kloop-kernels --lib no_such_test_at_all -- --ignored",
            "no test matches",
        );
        reports(
            "| fault | test |\n|---|---|\n| x | `cli_faults.rs` `two_vm_test_runs_at_once` |",
            "two_vm_test_runs_at_once",
        );
        reports(
            "| fault | test |\n|---|---|\n| x | `vm/no-such-trial` |",
            "vm/no-such-trial",
        );
        clean("    cargo test -p kloop-kernels --lib network_tests -- --ignored\n\n| fault | test |\n|---|---|\n| x | `pvh::tests::a_damaged_cached_elf_is_made_again`, `vm/kernel-panic`, `two-runs-at-once` |");
    }

    #[test]
    fn the_scenario_table_must_list_every_scenario_once() {
        let known = Known::of(&root());
        let table =
            "| scenario | what |\n|---|---|\n| `basic`, `basic` | x |\n| `no-such-scenario` | y |";
        let f: Vec<String> = check(&Doc::markdown("README.md", table), &known, true)
            .into_iter()
            .map(|f| f.what)
            .collect();
        assert!(
            f.iter().any(|w| w.contains("lists `basic` 2 times")),
            "{f:#?}"
        );
        assert!(f.iter().any(|w| w.contains("lacks `overflow`")), "{f:#?}");
        assert!(
            f.iter().any(|w| w.contains("scenario `no-such-scenario`")),
            "{f:#?}"
        );
    }
}
