//! The Debian mirror, taken from the host's own apt sources at run time.
//!
//! No mirror name is compiled in: the URI comes from the `deb` entry that
//! serves the host's own codename with component `main` (not the `-security`,
//! `-updates` or `-backports` ones), or from `KLOOP_MIRROR`. Only a Debian
//! host's sources name Debian's archive: on any other distribution (Ubuntu,
//! say, whose sources name its own archive with its own kernels) the mirror
//! must come from `KLOOP_MIRROR`.

use std::path::{Path, PathBuf};

use crate::error::KernelError;
use crate::settings::MIRROR_ENV;

/// One apt sources file: its path (for messages and to tell the format by
/// extension: `.sources` is deb822, anything else one-line) and its text.
#[derive(Debug, Clone)]
pub struct AptSourceFile {
    pub path: PathBuf,
    pub text: String,
}

/// Where a mirror URL came from, so a user can tell which setting to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorOrigin {
    /// `--mirror` on the command line.
    Option,
    /// The `KLOOP_MIRROR` environment variable.
    Env,
    /// The host's apt sources: the file that holds the chosen `deb` entry.
    AptSources(PathBuf),
}

impl std::fmt::Display for MirrorOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MirrorOrigin::Option => f.write_str("--mirror"),
            MirrorOrigin::Env => write!(f, "{MIRROR_ENV}"),
            MirrorOrigin::AptSources(p) => write!(f, "apt sources {}", p.display()),
        }
    }
}

/// The Debian mirror kloop fetches from, and where that choice came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The archive root (holds `dists/` and `pool/`), without a trailing `/`.
    pub url: String,
    pub origin: MirrorOrigin,
}

/// The fields of `/etc/os-release` that decide where kernels come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostOs {
    /// `ID` (`debian`, `ubuntu`, …).
    pub id: String,
    /// `ID_LIKE`, split (`ubuntu` has `debian`; derivatives of Ubuntu have both).
    pub id_like: Vec<String>,
    /// `VERSION_CODENAME`.
    pub codename: Option<String>,
    /// `PRETTY_NAME`, else `ID`: for messages.
    pub name: String,
}

impl HostOs {
    /// This host's `/etc/os-release`.
    pub fn read() -> Result<HostOs, KernelError> {
        let text =
            std::fs::read_to_string("/etc/os-release").map_err(|e| KernelError::NoMirror {
                detail: format!("cannot read /etc/os-release to learn the host's codename: {e}"),
            })?;
        Ok(HostOs::parse(&text))
    }

    pub fn parse(text: &str) -> HostOs {
        let id = os_release_field(text, "ID").unwrap_or_default();
        HostOs {
            id_like: os_release_field(text, "ID_LIKE")
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            codename: os_release_field(text, "VERSION_CODENAME"),
            name: os_release_field(text, "PRETTY_NAME").unwrap_or_else(|| id.clone()),
            id,
        }
    }

    /// Debian itself, whose apt sources name Debian's archive.
    pub fn is_debian(&self) -> bool {
        self.id == "debian"
    }

    /// Ubuntu or a derivative of it (its perf comes from `linux-tools-*`).
    pub fn is_ubuntu_like(&self) -> bool {
        self.id == "ubuntu" || self.id_like.iter().any(|l| l == "ubuntu")
    }
}

/// The Debian mirror to fetch from: `KLOOP_MIRROR` if set, else the host's
/// apt configuration (`/etc/apt/sources.list`, `/etc/apt/sources.list.d/*.list`
/// and `*.sources`) for the codename in `/etc/os-release`.
pub fn host_mirror() -> Result<String, KernelError> {
    locate_host_mirror().map(|m| m.url)
}

/// [`host_mirror`] with where it came from.
pub fn locate_host_mirror() -> Result<Mirror, KernelError> {
    if let Some(url) = env_mirror() {
        return Ok(Mirror {
            url,
            origin: MirrorOrigin::Env,
        });
    }
    let os = HostOs::read()?;
    if !os.is_debian() {
        return Err(KernelError::NotDebianHost { name: os.name });
    }
    let codename = os.codename.ok_or_else(|| KernelError::NoMirror {
        detail: "/etc/os-release has no VERSION_CODENAME".into(),
    })?;
    let files = read_host_sources(Path::new("/etc/apt"))?;
    locate_in_apt_sources(&codename, &files)
}

fn env_mirror() -> Option<String> {
    std::env::var(MIRROR_ENV)
        .ok()
        .map(|m| m.trim().trim_end_matches('/').to_string())
        .filter(|m| !m.is_empty())
}

fn os_release_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix(key)?.strip_prefix('=')?;
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// Reads the sources files apt itself reads, in apt's order.
fn read_host_sources(etc_apt: &Path) -> Result<Vec<AptSourceFile>, KernelError> {
    let mut paths = vec![etc_apt.join("sources.list")];
    if let Ok(dir) = std::fs::read_dir(etc_apt.join("sources.list.d")) {
        let mut parts: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect();
        parts.sort();
        paths.extend(parts);
    }
    let mut files = Vec::new();
    for path in paths {
        match std::fs::read_to_string(&path) {
            Ok(text) => files.push(AptSourceFile { path, text }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(KernelError::NoMirror {
                    detail: format!("cannot read {}: {e}", path.display()),
                })
            }
        }
    }
    Ok(files)
}

#[derive(Debug, PartialEq)]
struct Entry {
    /// The sources file the entry was read from.
    file: PathBuf,
    uri: String,
    suites: Vec<String>,
    components: Vec<String>,
}

/// Picks the mirror URI from apt sources text: the first `deb` entry whose
/// suite is `codename` and whose components include `main`. If none names
/// the codename (a testing/sid host whose sources say `sid` or `testing`),
/// the first `deb … main` entry for an alias suite (`stable`, `testing`,
/// `unstable`, `sid`, …) is taken. Comments and disabled entries are ignored.
pub fn mirror_from_apt_sources(
    codename: &str,
    files: &[AptSourceFile],
) -> Result<String, KernelError> {
    locate_in_apt_sources(codename, files).map(|m| m.url)
}

/// [`mirror_from_apt_sources`] with the file the entry came from.
fn locate_in_apt_sources(codename: &str, files: &[AptSourceFile]) -> Result<Mirror, KernelError> {
    let entries: Vec<Entry> = files
        .iter()
        .flat_map(|f| {
            let entries = if f.path.extension().is_some_and(|e| e == "sources") {
                parse_deb822(&f.text)
            } else {
                parse_one_line(&f.text)
            };
            entries.into_iter().map(|(uri, suites, components)| Entry {
                file: f.path.clone(),
                uri,
                suites,
                components,
            })
        })
        .filter(|e| !e.uri.starts_with("cdrom:"))
        .filter(|e| e.components.iter().any(|c| c == "main"))
        .collect();
    const ALIASES: [&str; 6] = [
        "stable",
        "testing",
        "unstable",
        "sid",
        "oldstable",
        "oldoldstable",
    ];
    let pick = |accept: &dyn Fn(&str) -> bool| {
        entries
            .iter()
            .find(|e| e.suites.iter().any(|s| accept(s)))
            .map(|e| Mirror {
                url: e.uri.trim_end_matches('/').to_string(),
                origin: MirrorOrigin::AptSources(e.file.clone()),
            })
    };
    pick(&|s| s == codename)
        .or_else(|| pick(&|s| ALIASES.contains(&s)))
        .ok_or_else(|| {
            let seen: Vec<String> = entries
                .iter()
                .flat_map(|e| e.suites.iter().map(move |s| format!("{} {s}", e.uri)))
                .collect();
            KernelError::NoMirror {
                detail: format!(
                    "no `deb` entry with component `main` serves suite `{codename}` (read {}; \
                     `deb … main` entries seen: {})",
                    if files.is_empty() {
                        "no sources files".to_string()
                    } else {
                        files
                            .iter()
                            .map(|f| f.path.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                    if seen.is_empty() {
                        "none".to_string()
                    } else {
                        seen.join("; ")
                    }
                ),
            }
        })
}

/// A `deb` entry as parsed: URI, suites, components.
type RawEntry = (String, Vec<String>, Vec<String>);

/// `deb [options] uri suite component…`, one entry a line.
fn parse_one_line(text: &str) -> Vec<RawEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("deb") else {
            continue;
        };
        // `deb-src` and friends are not binary sources.
        if !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let mut rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                continue;
            };
            rest = after[end + 1..].trim_start();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push((
            uri.to_string(),
            vec![suite.to_string()],
            words.map(str::to_string).collect(),
        ));
    }
    out
}

/// deb822 stanzas: `Types`, `URIs`, `Suites`, `Components`, `Enabled`.
fn parse_deb822(text: &str) -> Vec<RawEntry> {
    let mut out = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut flush = |fields: &mut Vec<(String, String)>| {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let words = |name: &str| -> Vec<String> {
            get(name)
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let enabled = get("Enabled").is_none_or(|v| !v.trim().eq_ignore_ascii_case("no"));
        if enabled && words("Types").iter().any(|t| t == "deb") {
            for uri in words("URIs") {
                out.push((uri, words("Suites"), words("Components")));
            }
        }
        fields.clear();
    };
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut fields);
        } else if line.starts_with(char::is_whitespace) {
            if let Some((_, value)) = fields.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    flush(&mut fields);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> AptSourceFile {
        AptSourceFile {
            path: PathBuf::from(name),
            text: text.to_string(),
        }
    }

    #[test]
    fn one_line_format_skips_comments_security_and_src() {
        let files = [file(
            "/etc/apt/sources.list",
            "# deb http://old.example/debian bookworm main\n\
             deb-src http://src.mirror.example/debian bookworm main\n\
             deb http://security.mirror.example/debian-security bookworm-security main\n\
             deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian/ bookworm main contrib # trailing\n\
             deb http://later.mirror.example/debian bookworm main\n",
        )];
        assert_eq!(
            mirror_from_apt_sources("bookworm", &files).unwrap(),
            "http://mirror.example/debian"
        );
    }

    #[test]
    fn deb822_format_with_comments_disabled_and_folded_fields() {
        let files = [
            file(
                "/etc/apt/sources.list.d/debian.sources",
                "Types: deb\n\
                 # http://snapshot.mirror.example/archive/debian/20250520T000000Z\n\
                 URIs: http://disabled.mirror.example/debian\n\
                 Suites: bookworm\n\
                 Components: main\n\
                 Enabled: no\n\
                 \n\
                 Types: deb-src deb\n\
                 URIs: http://mirror.example/debian\n\
                 Suites: bookworm-updates\n bookworm\n\
                 Components: contrib\n main\n\
                 Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
                 \n\
                 Types: deb\n\
                 URIs: http://mirror.example/debian-security\n\
                 Suites: bookworm-security\n\
                 Components: main\n",
            ),
            file(
                "/etc/apt/sources.list.d/other.sources",
                "Types: deb\nURIs: http://vendor.example/apt\nSuites: nodistro\nComponents: main\n",
            ),
        ];
        assert_eq!(
            mirror_from_apt_sources("bookworm", &files).unwrap(),
            "http://mirror.example/debian"
        );
    }

    #[test]
    fn security_only_or_foreign_sources_are_an_error_that_says_what_was_seen() {
        let files = [
            file(
                "/etc/apt/sources.list",
                "deb http://mirror.example/debian-security bookworm-security main\n",
            ),
            file(
                "/etc/apt/sources.list.d/vendor.list",
                "deb https://vendor.example/apt cloud-sdk-bookworm main\n",
            ),
        ];
        let err = mirror_from_apt_sources("bookworm", &files).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KernelError::NoMirror { .. }));
        assert!(msg.contains("bookworm-security"), "{msg}");
        assert!(msg.contains("KLOOP_MIRROR"), "{msg}");
    }

    #[test]
    fn sid_host_falls_back_to_alias_suite() {
        let files = [file(
            "/etc/apt/sources.list.d/debian.sources",
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: sid\nComponents: main\n",
        )];
        assert_eq!(
            mirror_from_apt_sources("forky", &files).unwrap(),
            "http://mirror.example/debian"
        );
    }

    #[test]
    fn reads_codename_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n";
        let os = HostOs::parse(text);
        assert_eq!(os.codename.as_deref(), Some("bookworm"));
        assert_eq!(os.name, "Debian GNU/Linux 12 (bookworm)");
        assert!(os.is_debian() && !os.is_ubuntu_like());
        assert_eq!(HostOs::parse("ID=debian\n").codename, None);
    }

    #[test]
    fn ubuntu_is_not_debian_and_its_derivatives_are_ubuntu_like() {
        let ubuntu = HostOs::parse(
            "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n\
             VERSION_CODENAME=noble\n",
        );
        assert!(!ubuntu.is_debian() && ubuntu.is_ubuntu_like());
        let mint = HostOs::parse("ID=linuxmint\nID_LIKE=\"ubuntu debian\"\n");
        assert!(!mint.is_debian() && mint.is_ubuntu_like());
        assert_eq!(mint.name, "linuxmint");
    }

    #[test]
    fn a_foreign_host_is_told_to_set_kloop_mirror() {
        let msg = KernelError::NotDebianHost {
            name: "Ubuntu 24.04.1 LTS".into(),
        }
        .to_string();
        assert!(msg.contains("Ubuntu 24.04.1 LTS"), "{msg}");
        assert!(
            msg.contains("set KLOOP_MIRROR to the URL of a Debian mirror"),
            "{msg}"
        );
    }

    #[test]
    fn the_chosen_entry_names_its_file() {
        let files = [
            file("/etc/apt/sources.list", "deb http://other.example/x nodistro main\n"),
            file(
                "/etc/apt/sources.list.d/debian.sources",
                "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n",
            ),
        ];
        assert_eq!(
            locate_in_apt_sources("bookworm", &files).unwrap(),
            Mirror {
                url: "http://mirror.example/debian".into(),
                origin: MirrorOrigin::AptSources("/etc/apt/sources.list.d/debian.sources".into()),
            }
        );
    }

    #[test]
    fn reads_sources_files_apt_reads_and_ignores_others() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("sources.list.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("vendor.list.disabled"),
            "deb http://wrong.example/debian bookworm main\n",
        )
        .unwrap();
        std::fs::write(
            d.join("debian.sources"),
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n",
        )
        .unwrap();
        let files = read_host_sources(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            mirror_from_apt_sources("bookworm", &files).unwrap(),
            "http://mirror.example/debian"
        );
    }
}
