//! Fixes of known kernel bugs (`kernels/fixes/<name>/`): which ledger
//! entries a fix folder ends, which of its patches applies to a source,
//! and `validate --record` writing the result into the ledger.
//!
//! A folder is named after the ledger id it fixes, or after the common
//! prefix of the ids it fixes (`interpreted-prog-ksymbol` ends
//! `interpreted-prog-ksymbol-register` and `-unregister`: one fix in
//! `perf_event_bpf_emit_ksymbols()` ends both). It holds one patch per
//! source it applies to, named after the source package
//! (`linux-source-6.12.patch`), in upstream submission form.
//!
//! A fix that can only be judged on a kernel already carrying another
//! fix says so in the folder's `fix.toml`:
//!
//! ```toml
//! [base]
//! "linux-source-5.10" = ["trampoline-link-failure-not-undone"]   # quoted: a bare key splits at dots
//! ```
//!
//! For that source, the named fixes' patches (their own bases first, in
//! the order given) go beneath this one's, on *both* sides of `validate`:
//! the baseline is the source with the base applied, the candidate the
//! same plus this fix. Without it, a bug elsewhere that makes the unpatched
//! source fail a scenario leaves that scenario with nothing to compare
//! (`INCOMPARABLE`), and the fix cannot be accepted.

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::judge::ab::AbOutcome;
use crate::judge::known_issues::Ledger;

/// Where fix folders live, under the catalog directory (`kernels/`).
pub const FIXES_DIR: &str = "fixes";

/// A fix folder's own settings: which fixes go beneath it.
pub const FIX_TOML: &str = "fix.toml";

/// Why a fix or an expected id could not be resolved, or recorded.
#[derive(Debug, thiserror::Error)]
pub enum FixError {
    #[error("no fix `{name}` in {dir}; the fixes there: {known}")]
    UnknownFix {
        name: String,
        dir: PathBuf,
        known: String,
    },
    #[error("fix {dir} has no patch for {source_package} ({dir}/{source_package}.patch); it has patches for: {known}")]
    NoPatchFor {
        dir: PathBuf,
        source_package: String,
        known: String,
    },
    #[error("no ledger entry is `{name}` or starts with `{name}-`; the ledger's ids: {known}")]
    NoEntry { name: String, known: String },
    #[error("`{id}` is no ledger entry; the ledger's ids: {known}")]
    UnknownId { id: String, known: String },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path} is not TOML the ledger's writer can edit: {message}")]
    Edit { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    FixToml { path: PathBuf, message: String },
    #[error("the bases of fix `{name}` for {source_package} come back to it: {chain}")]
    BaseCycle {
        name: String,
        source_package: String,
        chain: String,
    },
}

/// `fix.toml`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FixToml {
    /// Per source package, the fixes whose patches go beneath this one's.
    #[serde(default)]
    base: std::collections::BTreeMap<String, Vec<String>>,
}

impl FixToml {
    fn read(dir: &Path) -> Result<FixToml, FixError> {
        let path = dir.join(FIX_TOML);
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).map_err(|e| FixError::FixToml {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FixToml::default()),
            Err(source) => Err(PathIo::at("reading", path, source).into()),
        }
    }
}

/// A fix folder resolved for one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    /// The folder (`kernels/fixes/interpreted-prog-ksymbol`).
    pub dir: PathBuf,
    /// Its patch for the source.
    pub patch: PathBuf,
    /// The ledger ids it ends.
    pub ids: Vec<String>,
    /// The patches beneath it on this source (`fix.toml`'s `base`, each
    /// base's own base first): applied to the baseline and the candidate.
    pub base: Vec<PathBuf>,
}

/// The naming rule of fix folders and reproducers: `name` stands for
/// ledger entry `id` when it is the id or a prefix of it up to a `-`.
pub fn names_entry(name: &str, id: &str) -> bool {
    id == name
        || id
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// The ledger ids a folder named `name` ends: the one with that id, or
/// every id starting with `name-`, but for entries that only excuse (no
/// scenario listed): their fault shows where a run's layout puts it, so
/// a fix can neither be held to end them nor blamed when they go.
pub fn ids_named(ledger: &Ledger, name: &str) -> Result<Vec<String>, FixError> {
    let named: Vec<&crate::judge::known_issues::Issue> = ledger
        .issues
        .iter()
        .filter(|i| names_entry(name, &i.id))
        .collect();
    // A folder that names only entries that excuse is held to those.
    let strict = named.iter().any(|i| !i.only_excuses());
    let ids: Vec<String> = named
        .iter()
        .filter(|i| !strict || !i.only_excuses())
        .map(|i| i.id.clone())
        .collect();
    if ids.is_empty() {
        return Err(FixError::NoEntry {
            name: name.to_string(),
            known: known_ids(ledger),
        });
    }
    Ok(ids)
}

/// Checks that every `--expect-fixed` id is a ledger entry.
pub fn check_ids(ledger: &Ledger, ids: &[String]) -> Result<(), FixError> {
    match ids
        .iter()
        .find(|id| !ledger.issues.iter().any(|i| &i.id == *id))
    {
        Some(id) => Err(FixError::UnknownId {
            id: id.clone(),
            known: known_ids(ledger),
        }),
        None => Ok(()),
    }
}

fn known_ids(ledger: &Ledger) -> String {
    let ids: Vec<&str> = ledger.issues.iter().map(|i| i.id.as_str()).collect();
    ids.join(", ")
}

/// Resolves `--fix NAME` (a folder under `kernels/fixes/`, or a path to
/// one) for the source package `source_package`.
pub fn resolve(
    kernels: &Path,
    ledger: &Ledger,
    name: &str,
    source_package: &str,
) -> Result<Fix, FixError> {
    let root = kernels.join(FIXES_DIR);
    let given = Path::new(name);
    let dir = if given.is_dir() {
        given.to_path_buf()
    } else {
        root.join(name)
    };
    if !dir.is_dir() {
        return Err(FixError::UnknownFix {
            name: name.to_string(),
            dir: root.clone(),
            known: list(&root, |p| p.is_dir()).join(", "),
        });
    }
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let patch = dir.join(format!("{source_package}.patch"));
    if !patch.is_file() {
        let known: Vec<String> = list(&dir, |p| p.extension().is_some_and(|e| e == "patch"))
            .into_iter()
            .map(|f| f.trim_end_matches(".patch").to_string())
            .collect();
        return Err(FixError::NoPatchFor {
            dir,
            source_package: source_package.to_string(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        });
    }
    let mut base = Vec::new();
    base_patches(
        &root,
        &dir,
        source_package,
        &mut vec![folder.clone()],
        &mut base,
    )?;
    Ok(Fix {
        ids: ids_named(ledger, &folder)?,
        dir,
        patch,
        base,
    })
}

/// The patches `fix.toml` of the fix folder `dir` puts beneath its patch
/// for `source_package` (each base's own base first).
pub fn base_of(kernels: &Path, dir: &Path, source_package: &str) -> Result<Vec<PathBuf>, FixError> {
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    base_patches(
        &kernels.join(FIXES_DIR),
        dir,
        source_package,
        &mut vec![folder],
        &mut out,
    )?;
    Ok(out)
}

/// Appends the patches `fix.toml` of `dir` puts beneath it on
/// `source_package` to `out`, each base's own bases first; `chain` is the
/// fixes being resolved, to refuse a cycle.
fn base_patches(
    root: &Path,
    dir: &Path,
    source_package: &str,
    chain: &mut Vec<String>,
    out: &mut Vec<PathBuf>,
) -> Result<(), FixError> {
    let names = FixToml::read(dir)?
        .base
        .remove(source_package)
        .unwrap_or_default();
    for name in names {
        if chain.contains(&name) {
            chain.push(name);
            return Err(FixError::BaseCycle {
                name: chain[0].clone(),
                source_package: source_package.to_string(),
                chain: chain.join(" → "),
            });
        }
        let base_dir = root.join(&name);
        if !base_dir.is_dir() {
            return Err(FixError::UnknownFix {
                name,
                dir: root.to_path_buf(),
                known: list(root, |p| p.is_dir()).join(", "),
            });
        }
        let patch = base_dir.join(format!("{source_package}.patch"));
        if !patch.is_file() {
            return Err(FixError::NoPatchFor {
                source_package: source_package.to_string(),
                known: list(&base_dir, |p| p.extension().is_some_and(|e| e == "patch")).join(", "),
                dir: base_dir,
            });
        }
        chain.push(name);
        base_patches(root, &base_dir, source_package, chain, out)?;
        chain.pop();
        if !out.contains(&patch) {
            out.push(patch);
        }
    }
    Ok(())
}

/// The fix folder of ledger entry `id`: the one named `id`, or a prefix of
/// it; `None` when no fix was written for it.
pub fn folder_of(kernels: &Path, id: &str) -> Option<PathBuf> {
    let root = kernels.join(FIXES_DIR);
    list(&root, |p| p.is_dir())
        .into_iter()
        .find(|n| names_entry(n, id))
        .map(|n| root.join(n))
}

/// The patches of a fix folder, by source package, oldest series first
/// (`linux-source-6.1` before `linux-source-6.12`).
pub fn patches_of(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> =
        list(dir, |p| p.extension().is_some_and(|e| e == "patch"))
            .into_iter()
            .map(|f| (f.trim_end_matches(".patch").to_string(), dir.join(&f)))
            .collect();
    let series = |name: &str| -> Vec<u32> {
        name.rsplit('-')
            .next()
            .unwrap_or("")
            .split('.')
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    out.sort_by_key(|(name, _)| series(name));
    out
}

/// The names of `dir`'s entries that pass `keep`, sorted.
pub(crate) fn list(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| keep(&e.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// What `validate --record` writes for one ledger entry.
#[derive(Debug, Clone)]
pub struct Validated<'a> {
    /// The patch, as the ledger names it (relative to the workspace).
    pub patch: String,
    /// `linux-source-6.12 6.12.117-1~deb12u1`.
    pub source: String,
    /// validate accepted the candidate with this entry expected fixed.
    pub accepted: bool,
    pub outcomes: &'a [AbOutcome],
    /// `YYYY-MM-DD`.
    pub date: String,
    pub run_dir: String,
    /// The patches beneath it on both sides (`fix.toml`), as the ledger
    /// names them.
    pub base: Vec<String>,
}

/// Records `v` under every entry in `ids` in the ledger file at `path`,
/// replacing an earlier record of the same patch, keeping the file's
/// comments and layout, and writing it atomically.
pub fn record(path: &Path, ids: &[String], v: &Validated<'_>) -> Result<(), FixError> {
    let text = std::fs::read_to_string(path).at("reading", path)?;
    let edited = record_in(&text, ids, v).map_err(|e| FixError::Edit {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let tmp = path.with_extension(format!("toml.{}.tmp", std::process::id()));
    std::fs::write(&tmp, edited).at("writing", path)?;
    std::fs::rename(&tmp, path).at("replacing", path)?;
    Ok(())
}

/// Why [`record_in`] cannot edit the ledger's text (an `Edit` error's
/// message).
#[derive(Debug, thiserror::Error)]
enum LedgerEdit {
    #[error("{0}")]
    Toml(#[from] toml_edit::TomlError),
    #[error("no [[issue]] tables")]
    NoIssues,
    #[error("no entry {0}")]
    NoEntry(String),
    #[error("{0}: `fix` is not an array of tables")]
    FixNotTables(String),
}

/// [`record`] on the file's text.
fn record_in(text: &str, ids: &[String], v: &Validated<'_>) -> Result<String, LedgerEdit> {
    use toml_edit::{value, Array, ArrayOfTables, DocumentMut, Item, Table};
    let mut doc: DocumentMut = text.parse()?;
    let issues = doc
        .get_mut("issue")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or(LedgerEdit::NoIssues)?;
    for id in ids {
        let entry = issues
            .iter_mut()
            .find(|t| t.get("id").and_then(|i| i.as_str()) == Some(id.as_str()))
            .ok_or_else(|| LedgerEdit::NoEntry(id.clone()))?;
        let mut fix = Table::new();
        fix["patch"] = value(&v.patch);
        fix["source"] = value(&v.source);
        fix["result"] = value(if v.accepted { "FIXED" } else { "REJECTED" });
        if !v.base.is_empty() {
            let mut base = Array::new();
            for b in &v.base {
                base.push(b.as_str());
            }
            fix["base"] = value(base);
        }
        let mut scenarios = Array::new();
        for o in v.outcomes.iter().filter(|o| o.fixed.contains(id)) {
            scenarios.push(o.scenario.as_str());
        }
        fix["scenarios"] = value(scenarios);
        fix["validated"] = value(&v.date);
        fix["run"] = value(&v.run_dir);
        fix["summary"] = value(crate::judge::ab::counts(v.outcomes));
        if !entry.contains_key("fix") {
            entry.insert("fix", Item::ArrayOfTables(ArrayOfTables::new()));
        }
        let fixes = entry
            .get_mut("fix")
            .and_then(Item::as_array_of_tables_mut)
            .ok_or_else(|| LedgerEdit::FixNotTables(id.clone()))?;
        fixes.retain(|t| t.get("patch").and_then(|p| p.as_str()) != Some(v.patch.as_str()));
        fixes.push(fix);
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::ab::AbClass;

    const LEDGER: &str = r#"# a comment that must survive
[[issue]]
id = "interpreted-prog-ksymbol-register"
rule = "load-symbols"
scenarios = ["interpreter"]
pins = ["6.12"]
summary = "s"
evidence = "e"
review_by = "2027-05-21"

[[issue.signature]]
fault = "interpreted-symbol"
len = 0
name = ""
kernel_text = true
[[issue]]
id = "interpreted-prog-ksymbol-unregister"
rule = "unload-symbols"
scenarios = ["interpreter"]
pins = ["6.12"]
summary = "s"
evidence = "e"
review_by = "2027-05-21"

[[issue.signature]]
fault = "interpreted-symbol"
len = 0
name = ""
kernel_text = true
[[issue]]
id = "other"
rule = "parse"
scenarios = []
pins = ["6.12"]
summary = "s"
evidence = "e"
review_by = "2027-05-21"

[[issue.signature]]
fault = "oversized-record"
record_types = ["KSYMBOL"]
readers = ["kloop"]
excess = "accumulated-trailers"
"#;

    fn ledger() -> Ledger {
        let vocab = crate::judge::known_issues::Vocabulary {
            pins: vec!["6.12".into()],
            rules: vec![
                "load-symbols".into(),
                "unload-symbols".into(),
                "parse".into(),
            ],
            scenarios: vec!["interpreter".into()],
        };
        Ledger::parse(LEDGER, Path::new("known-issues.toml"), &vocab)
            .expect("the test ledger parses")
    }

    #[test]
    fn a_folder_named_after_a_prefix_ends_every_id_under_it() {
        let l = ledger();
        assert_eq!(
            ids_named(&l, "interpreted-prog-ksymbol").unwrap(),
            vec![
                "interpreted-prog-ksymbol-register",
                "interpreted-prog-ksymbol-unregister"
            ]
        );
        assert_eq!(ids_named(&l, "other").unwrap(), vec!["other"]);
        // A prefix is whole words: `interpreted-prog-ksym` names nothing.
        let e = ids_named(&l, "interpreted-prog-ksym")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ledger's ids: interpreted-prog-ksymbol-register"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_expected_id_is_an_error_listing_the_ids() {
        let e = check_ids(&ledger(), &["nope".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("`nope` is no ledger entry; the ledger's ids: interpreted-prog-ksymbol-register, interpreted-prog-ksymbol-unregister, other"), "{e}");
        assert!(check_ids(&ledger(), &["other".into()]).is_ok());
    }

    #[test]
    fn resolving_finds_the_sources_patch_or_names_the_ones_there() {
        let kernels = tempfile::tempdir().unwrap();
        let dir = kernels.path().join("fixes/interpreted-prog-ksymbol");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("linux-source-6.12.patch"), "x").unwrap();
        let l = ledger();
        let fix = resolve(
            kernels.path(),
            &l,
            "interpreted-prog-ksymbol",
            "linux-source-6.12",
        )
        .unwrap();
        assert_eq!(fix.patch, dir.join("linux-source-6.12.patch"));
        assert_eq!(fix.ids.len(), 2);
        let e = resolve(
            kernels.path(),
            &l,
            "interpreted-prog-ksymbol",
            "linux-source-6.1",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("has patches for: linux-source-6.12"), "{e}");
        let e = resolve(kernels.path(), &l, "nope", "linux-source-6.12")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the fixes there: interpreted-prog-ksymbol"),
            "{e}"
        );
    }

    #[test]
    fn a_fix_toml_puts_its_bases_patches_beneath_for_that_source_only() {
        let kernels = tempfile::tempdir().unwrap();
        let fixes = kernels.path().join("fixes");
        for (name, sources) in [
            ("interpreted-prog-ksymbol", &["5.10", "6.12"][..]),
            ("other", &["5.10"][..]),
        ] {
            std::fs::create_dir_all(fixes.join(name)).unwrap();
            for s in sources {
                std::fs::write(
                    fixes.join(name).join(format!("linux-source-{s}.patch")),
                    "x",
                )
                .unwrap();
            }
        }
        let toml =
            |name: &str, text: &str| std::fs::write(fixes.join(name).join(FIX_TOML), text).unwrap();
        toml(
            "interpreted-prog-ksymbol",
            "[base]\n\"linux-source-5.10\" = [\"other\"]\n",
        );
        let l = ledger();
        let on = |source: &str| resolve(kernels.path(), &l, "interpreted-prog-ksymbol", source);
        assert_eq!(
            on("linux-source-5.10").unwrap().base,
            vec![fixes.join("other/linux-source-5.10.patch")]
        );
        assert!(on("linux-source-6.12").unwrap().base.is_empty());
        // A base without a patch for the source, an unknown base, a cycle
        // and an unknown key are errors that say so.
        toml(
            "interpreted-prog-ksymbol",
            "[base]\n\"linux-source-6.12\" = [\"other\"]\n",
        );
        let e = on("linux-source-6.12").unwrap_err().to_string();
        assert!(e.contains("has no patch for linux-source-6.12"), "{e}");
        toml(
            "interpreted-prog-ksymbol",
            "[base]\n\"linux-source-5.10\" = [\"nope\"]\n",
        );
        let e = on("linux-source-5.10").unwrap_err().to_string();
        assert!(e.contains("no fix `nope`"), "{e}");
        toml(
            "interpreted-prog-ksymbol",
            "[base]\n\"linux-source-5.10\" = [\"other\"]\n",
        );
        toml(
            "other",
            "[base]\n\"linux-source-5.10\" = [\"interpreted-prog-ksymbol\"]\n",
        );
        let e = on("linux-source-5.10").unwrap_err().to_string();
        assert!(
            e.contains("interpreted-prog-ksymbol → other → interpreted-prog-ksymbol"),
            "{e}"
        );
        toml("other", "requires = []\n");
        let e = on("linux-source-5.10").unwrap_err().to_string();
        assert!(e.contains("fix.toml") && e.contains("requires"), "{e}");
    }

    #[test]
    fn recording_adds_a_fix_table_per_entry_replaces_the_same_patch_and_keeps_comments() {
        let outcomes = vec![AbOutcome {
            scenario: "interpreter".into(),
            class: AbClass::Fixed,
            details: vec![],
            diff: vec![],
            figures: vec![],
            baseline_issues: vec![],
            baseline_known: vec![],
            fixed: vec![
                "interpreted-prog-ksymbol-register".into(),
                "interpreted-prog-ksymbol-unregister".into(),
            ],
            gone: Vec::new(),
        }];
        let v = Validated {
            patch: "kernels/fixes/interpreted-prog-ksymbol/linux-source-6.12.patch".into(),
            source: "linux-source-6.12 6.12.117-1~deb12u1".into(),
            accepted: true,
            outcomes: &outcomes,
            date: "2026-11-26".into(),
            run_dir: "target/kloop/runs/1".into(),
            base: Vec::new(),
        };
        let ids = ids_named(&ledger(), "interpreted-prog-ksymbol").unwrap();
        let once = record_in(LEDGER, &ids, &v).unwrap();
        let twice = record_in(&once, &ids, &v).unwrap();
        assert_eq!(once, twice, "the same patch is recorded once");
        assert!(once.starts_with("# a comment that must survive"));
        let vocab = crate::judge::known_issues::Vocabulary {
            pins: vec!["6.12".into()],
            rules: vec![
                "load-symbols".into(),
                "unload-symbols".into(),
                "parse".into(),
            ],
            scenarios: vec!["interpreter".into()],
        };
        let l =
            Ledger::parse(&once, Path::new("k.toml"), &vocab).expect("the edited ledger parses");
        for i in &l.issues[..2] {
            assert_eq!(i.fixes.len(), 1, "{once}");
            assert_eq!(i.fixes[0].result, "FIXED");
            assert_eq!(i.fixes[0].scenarios, vec!["interpreter"]);
        }
        assert!(l.issues[2].fixes.is_empty());
    }
}
