//! The build's `.config`: a base (`make tinyconfig`), kloop's own fragment
//! and the user's fragments merged onto it, resolved by `make
//! olddefconfig`, then checked: every option a fragment asked for must
//! have survived, or the build stops naming it and what removed it.
//!
//! Kconfig drops a requested `=y` silently when a `depends on` is unmet,
//! and keeps a requested `is not set` on when another option `select`s it.
//! To name the culprit, this reads the tree's Kconfig files just enough:
//! each `config NAME` block's `depends on` lines, and every `select NAME`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kloop_path_io::PathIoExt;

use crate::config::KernelConfig;

/// One option a fragment asked for: `Some(value)`, or `None` for
/// `# CONFIG_X is not set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub name: String,
    pub value: Option<String>,
    /// The fragment that asked (the last one wins, as in merge_config.sh).
    pub from: PathBuf,
}

/// Reads fragments in order; a later fragment overrides an earlier one.
pub fn read_fragments(fragments: &[PathBuf]) -> Result<Vec<Requested>, super::BuildError> {
    let mut by_name: BTreeMap<String, Requested> = BTreeMap::new();
    let mut order = Vec::new();
    for f in fragments {
        let text =
            std::fs::read_to_string(f).doing(format!("reading config fragment {}", f.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let parsed = if let Some(rest) = line.strip_prefix("# CONFIG_") {
                rest.strip_suffix(" is not set")
                    .map(|name| (format!("CONFIG_{name}"), None))
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                line.split_once('=')
                    .filter(|(k, _)| k.starts_with("CONFIG_"))
                    .map(|(k, v)| (k.to_string(), Some(v.to_string())))
            };
            let Some((name, value)) = parsed else {
                if line.starts_with('#') {
                    continue;
                }
                return Err(super::BuildError::Invalid(format!(
                    "{}:{}: `{line}` is neither `CONFIG_X=value` nor `# CONFIG_X is not set`",
                    f.display(),
                    n + 1
                )));
            };
            if !by_name.contains_key(&name) {
                order.push(name.clone());
            }
            by_name.insert(
                name.clone(),
                Requested {
                    name,
                    value,
                    from: f.clone(),
                },
            );
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|n| by_name.remove(&n))
        .collect())
}

/// Writes `base` with every requested option replaced or appended: what
/// `scripts/kconfig/merge_config.sh -m` does, without the shell.
pub fn merge(base: &str, requested: &[Requested]) -> String {
    let names: BTreeSet<&str> = requested.iter().map(|r| r.name.as_str()).collect();
    let mut out = String::new();
    for line in base.lines() {
        let name = line
            .strip_prefix("# ")
            .and_then(|l| l.strip_suffix(" is not set"))
            .or_else(|| line.split_once('=').map(|(k, _)| k));
        if name.is_some_and(|n| names.contains(n)) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    for r in requested {
        match &r.value {
            Some(v) => out.push_str(&format!("{}={v}\n", r.name)),
            None => out.push_str(&format!("# {} is not set\n", r.name)),
        }
    }
    out
}

/// What Kconfig says about the symbols this build asked for.
#[derive(Debug, Default)]
pub struct KconfigIndex {
    /// `depends on` expressions per symbol (without `CONFIG_`).
    depends: BTreeMap<String, Vec<String>>,
    /// Who `select`s each symbol.
    selected_by: BTreeMap<String, Vec<String>>,
    /// Every symbol declared by `config` / `menuconfig`.
    declared: BTreeSet<String>,
}

impl KconfigIndex {
    /// Indexes every `Kconfig*` file among `inputs` (arch/ only for x86).
    pub fn of(inputs: &KconfigInputs) -> KconfigIndex {
        let mut index = KconfigIndex::default();
        for (path, bytes) in &inputs.files {
            let is_kconfig = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("Kconfig"));
            if let (true, Ok(text)) = (is_kconfig, std::str::from_utf8(bytes)) {
                index.add(text);
            }
        }
        index
    }

    fn add(&mut self, text: &str) {
        let mut current: Option<String> = None;
        let mut continued = String::new();
        for raw in text.lines() {
            // Kconfig continues a line ending in a backslash.
            if let Some(head) = raw.strip_suffix('\\') {
                continued.push_str(head);
                continue;
            }
            let line_owned = std::mem::take(&mut continued) + raw;
            let line = line_owned.trim();
            let starts_block = !raw.starts_with(char::is_whitespace) && !raw.trim().is_empty();
            if let Some(name) = line
                .strip_prefix("config ")
                .or_else(|| line.strip_prefix("menuconfig "))
            {
                let name = name.trim().to_string();
                self.declared.insert(name.clone());
                current = Some(name);
                continue;
            }
            if starts_block {
                current = None;
                continue;
            }
            let Some(sym) = &current else { continue };
            if let Some(expr) = line.strip_prefix("depends on ") {
                self.depends
                    .entry(sym.clone())
                    .or_default()
                    .push(expr.trim().to_string());
            } else if let Some(target) = line.strip_prefix("select ") {
                let target = target.split_whitespace().next().unwrap_or("").to_string();
                self.selected_by
                    .entry(target)
                    .or_default()
                    .push(sym.clone());
            }
        }
    }
}

/// Symbols a Kconfig expression mentions (identifiers in upper case).
fn symbols(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty() && w.chars().any(|c| c.is_ascii_uppercase()))
        .filter(|w| {
            w.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_string)
        .collect()
}

/// One requested option that did not survive olddefconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub requested: Requested,
    /// What the resolved config has (`None`: not set).
    pub got: Option<String>,
    /// Why, as far as Kconfig tells: the unmet dependencies, or who
    /// selects it, or that this tree has no such option.
    pub why: String,
    /// The tree has no such option at all (renamed, or newer than it).
    pub unknown: bool,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let asked = match &self.requested.value {
            Some(v) => format!("{}={v}", self.requested.name),
            None => format!("{} off", self.requested.name),
        };
        let got = match &self.got {
            Some(v) => format!("={v}"),
            None => " not set".into(),
        };
        write!(
            f,
            "{asked} (from {}) ended up{got}: {}",
            self.requested.from.display(),
            self.why
        )
    }
}

/// The requested options the resolved config does not honour.
pub fn check_survival(
    requested: &[Requested],
    resolved: &KernelConfig,
    index: &KconfigIndex,
) -> Vec<Dropped> {
    let all_symbols = &index.declared;
    let mut out = Vec::new();
    for r in requested {
        let got = resolved.value(&r.name).map(str::to_string);
        let wanted = r.value.as_deref().filter(|v| *v != "n");
        if got.as_deref() == wanted {
            continue;
        }
        let bare = r.name.trim_start_matches("CONFIG_");
        let unknown = !all_symbols.contains(bare);
        let why = if unknown {
            "this tree's Kconfig has no such option (renamed, removed, or newer than this kernel)"
                .to_string()
        } else if wanted.is_none() {
            let by: Vec<String> = index
                .selected_by
                .get(bare)
                .into_iter()
                .flatten()
                .filter(|s| resolved.is_enabled(s))
                .map(|s| format!("CONFIG_{s}"))
                .collect();
            if by.is_empty() {
                "it cannot be turned off here (no prompt, or a `default y` without a question)"
                    .into()
            } else {
                format!("selected by {}", by.join(", "))
            }
        } else {
            let unmet: Vec<String> = index
                .depends
                .get(bare)
                .into_iter()
                .flatten()
                .flat_map(|e| symbols(e))
                .filter(|s| all_symbols.contains(s.as_str()) && !resolved.is_enabled(s))
                .map(|s| format!("CONFIG_{s}"))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let exprs: Vec<&String> = index.depends.get(bare).into_iter().flatten().collect();
            if !unmet.is_empty() {
                format!(
                    "it depends on {} and {} not set",
                    exprs
                        .iter()
                        .map(|e| format!("`{e}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    unmet.join(", ")
                )
            } else if !exprs.is_empty() {
                format!(
                    "its dependencies {} are not met",
                    exprs
                        .iter()
                        .map(|e| format!("`{e}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                "Kconfig chose otherwise (a `choice`, a range, or a value the option does not take)"
                    .into()
            }
        };
        out.push(Dropped {
            requested: r.clone(),
            got,
            why,
            unknown,
        });
    }
    out
}

/// The files of `tree` that decide what `make <base>` and `olddefconfig`
/// write into `.config` for x86, read once: every `Kconfig*` file outside
/// other architectures, `Documentation/` and `tools/`, kconfig itself
/// (`scripts/kconfig/`), the configuration fragments the base targets
/// merge (`kernel/configs/`, `arch/x86/configs/`) and the top `Makefile`
/// (the version in `.config`'s header), sorted by path. `build` hashes
/// them into its configure stamp ([`KconfigInputs::stamp`]) and indexes
/// the `Kconfig*` ones for the survival check ([`KconfigIndex::of`]);
/// configuring changes none of them.
pub struct KconfigInputs {
    tree: PathBuf,
    files: Vec<(PathBuf, Vec<u8>)>,
}

impl KconfigInputs {
    #[cfg(test)]
    pub fn read(tree: &Path) -> KconfigInputs {
        Self::read_for(tree, "x86")
    }

    /// [`KconfigInputs::read`] for a build of the kernel architecture
    /// directory `arch_dir` (`x86`, `arm64`).
    pub fn read_for(tree: &Path, arch_dir: &str) -> KconfigInputs {
        let mut paths = Vec::new();
        let mut todo = vec![(tree.to_path_buf(), false)];
        while let Some((dir, all)) = todo.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name();
                let name = name.to_string_lossy();
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    let skip = name.starts_with('.')
                        || name == "Documentation"
                        || name == "tools"
                        || (dir.ends_with("arch") && name != arch_dir);
                    let whole = all
                        || path.ends_with("scripts/kconfig")
                        || path.ends_with("kernel/configs")
                        || path.ends_with(format!("arch/{arch_dir}/configs"));
                    if !skip {
                        todo.push((path, whole));
                    }
                } else if all || name.starts_with("Kconfig") || (dir == tree && name == "Makefile")
                {
                    paths.push(path);
                }
            }
        }
        paths.sort();
        let files = paths
            .into_iter()
            .filter_map(|p| Some((std::fs::read(&p).ok()?, p)))
            .map(|(bytes, p)| (p, bytes))
            .collect();
        KconfigInputs {
            tree: tree.to_path_buf(),
            files,
        }
    }

    /// What a configured output directory was configured from: these
    /// files (paths relative to the tree, and contents) and `settings`
    /// (the base target, the fragments' hashes, the versions of the tools
    /// whose answers Kconfig records). Equal stamps give the same
    /// `.config` (kconfig reads nothing else), so `build` need not run the
    /// two configuring `make`s again in that directory; a patch that
    /// touches a Kconfig file changes the stamp.
    pub fn stamp(&self, settings: &[&str]) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for s in settings {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        for (path, bytes) in &self.files {
            let rel = path.strip_prefix(&self.tree).unwrap_or(path);
            h.update(rel.to_string_lossy().as_bytes());
            h.update([0]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        hex::encode(h.finalize())
    }
}

#[cfg(test)]
mod tests {
    /// The stamp follows every input kconfig reads and nothing else: a
    /// Kconfig anywhere (but another architecture's), kconfig's own
    /// sources, the base fragments, the top Makefile and the settings.
    #[test]
    fn the_config_stamp_follows_what_kconfig_reads() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let write = |rel: &str, text: &str| {
            let p = t.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("Kconfig", "source \"kernel/Kconfig.x\"");
        write("Makefile", "VERSION = 6");
        write("kernel/Kconfig.x", "config A");
        write("kernel/events/core.c", "int x;");
        write("scripts/kconfig/conf.c", "int main;");
        write("kernel/configs/tiny.config", "CONFIG_A=y");
        write("arch/x86/Kconfig", "config X86");
        write("arch/arm64/Kconfig", "config ARM64");
        write("Documentation/Kconfig", "doc");
        let base = KconfigInputs::read(t).stamp(&["tinyconfig", "gcc 12"]);
        assert_eq!(
            base,
            KconfigInputs::read(t).stamp(&["tinyconfig", "gcc 12"])
        );
        // Not read by an x86 configure: no change.
        for (rel, text) in [
            ("kernel/events/core.c", "int y;"),
            ("arch/arm64/Kconfig", "config ARM64_2"),
            ("Documentation/Kconfig", "doc 2"),
            ("kernel/Makefile", "obj-y += x.o"),
        ] {
            write(rel, text);
            assert_eq!(
                KconfigInputs::read(t).stamp(&["tinyconfig", "gcc 12"]),
                base,
                "{rel}"
            );
        }
        assert_ne!(KconfigInputs::read(t).stamp(&["defconfig", "gcc 12"]), base);
        assert_ne!(
            KconfigInputs::read(t).stamp(&["tinyconfig", "gcc 13"]),
            base
        );
        let mut seen = vec![base];
        for (rel, text) in [
            ("kernel/Kconfig.x", "config B"),
            ("arch/x86/Kconfig", "config X86_64"),
            ("scripts/kconfig/conf.c", "int main2;"),
            ("kernel/configs/tiny.config", "CONFIG_A=n"),
            ("Makefile", "VERSION = 7"),
            ("net/Kconfig.new", "config NEW"),
        ] {
            write(rel, text);
            let now = KconfigInputs::read(t).stamp(&["tinyconfig", "gcc 12"]);
            assert!(!seen.contains(&now), "{rel} did not change the stamp");
            seen.push(now);
        }
    }

    use super::*;

    const KCONFIG: &str = "config FTRACE_SYSCALLS\n\tbool \"Trace syscalls\"\n\tdepends on HAVE_SYSCALL_TRACEPOINTS\n\tselect GENERIC_TRACER\n\nconfig GENERIC_TRACER\n\tbool\n\nconfig VETH\n\ttristate \"Virtual ethernet pair device\"\n\tdepends on NET && \\\n\t\tNETDEVICES\n";

    fn index() -> KconfigIndex {
        let mut i = KconfigIndex::default();
        i.add(KCONFIG);
        i
    }

    fn req(name: &str, value: Option<&str>) -> Requested {
        Requested {
            name: name.into(),
            value: value.map(str::to_string),
            from: "frag.config".into(),
        }
    }

    #[test]
    fn fragments_later_wins_and_not_set_is_a_request() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.config");
        let b = dir.path().join("b.config");
        std::fs::write(&a, "# comment\nCONFIG_FUTEX=y\nCONFIG_VETH=y\n").unwrap();
        std::fs::write(&b, "# CONFIG_FUTEX is not set\n").unwrap();
        let r = read_fragments(&[a, b.clone()]).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].name, "CONFIG_FUTEX");
        assert_eq!(r[0].value, None);
        assert_eq!(r[0].from, b);
        let bad = dir.path().join("bad.config");
        std::fs::write(&bad, "FUTEX=y\n").unwrap();
        let err = read_fragments(&[bad]).unwrap_err().to_string();
        assert!(err.contains("bad.config:1"), "{err}");
    }

    #[test]
    fn merge_replaces_and_appends() {
        let base = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=m\n";
        let merged = merge(base, &[req("CONFIG_B", Some("y")), req("CONFIG_C", None)]);
        assert_eq!(merged, "CONFIG_A=y\nCONFIG_B=y\n# CONFIG_C is not set\n");
    }

    #[test]
    fn a_dropped_option_names_its_unmet_dependency() {
        let resolved = KernelConfig::parse(
            "CONFIG_NET=y\nCONFIG_GENERIC_TRACER=y\nCONFIG_FTRACE_SYSCALLS=y\n",
            "t",
        );
        let mut index = index();
        index.add("config NET\n\tbool\nconfig NETDEVICES\n\tbool\nconfig HAVE_SYSCALL_TRACEPOINTS\n\tbool\n");
        let dropped = check_survival(
            &[
                req("CONFIG_VETH", Some("y")),
                req("CONFIG_GENERIC_TRACER", None),
                req("CONFIG_NO_SUCH", Some("y")),
                req("CONFIG_NET", Some("y")),
            ],
            &resolved,
            &index,
        );
        assert_eq!(dropped.len(), 3, "{dropped:?}");
        assert!(
            dropped[0].why.contains("CONFIG_NETDEVICES not set"),
            "{}",
            dropped[0]
        );
        assert!(!dropped[0].why.contains("CONFIG_NET,"), "{}", dropped[0]);
        assert!(
            dropped[1]
                .why
                .contains("selected by CONFIG_FTRACE_SYSCALLS"),
            "{}",
            dropped[1]
        );
        assert!(dropped[2].unknown);
    }
}
