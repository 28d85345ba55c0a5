//! The Debian mirror, taken from the host's own apt sources at run time.
//!
//! No mirror name is compiled in: the URI comes from the `deb` entry that
//! serves the host's own codename with component `main` (not the `-security`,
//! `-updates` or `-backports` ones), or from `KLOOP_MIRROR`.

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

/// The Debian mirror to fetch from: `KLOOP_MIRROR` if set, else the host's
/// apt configuration (`/etc/apt/sources.list`, `/etc/apt/sources.list.d/*.list`
/// and `*.sources`) for the codename in `/etc/os-release`.
pub fn host_mirror() -> Result<String, KernelError> {
    if let Some(m) = env_mirror() {
        return Ok(m);
    }
    let os_release =
        std::fs::read_to_string("/etc/os-release").map_err(|e| KernelError::NoMirror {
            detail: format!("cannot read /etc/os-release to learn the host's codename: {e}"),
        })?;
    let codename = os_release_codename(&os_release).ok_or_else(|| KernelError::NoMirror {
        detail: "/etc/os-release has no VERSION_CODENAME".into(),
    })?;
    let files = read_host_sources(Path::new("/etc/apt"))?;
    mirror_from_apt_sources(&codename, &files)
}

pub(crate) fn env_mirror() -> Option<String> {
    std::env::var(MIRROR_ENV)
        .ok()
        .map(|m| m.trim().trim_end_matches('/').to_string())
        .filter(|m| !m.is_empty())
}

fn os_release_codename(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("VERSION_CODENAME=")?;
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
    let entries: Vec<Entry> = files
        .iter()
        .flat_map(|f| {
            if f.path.extension().is_some_and(|e| e == "sources") {
                parse_deb822(&f.text)
            } else {
                parse_one_line(&f.text)
            }
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
            .map(|e| e.uri.trim_end_matches('/').to_string())
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

/// `deb [options] uri suite component…`, one entry a line.
fn parse_one_line(text: &str) -> Vec<Entry> {
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
        out.push(Entry {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
        });
    }
    out
}

/// deb822 stanzas: `Types`, `URIs`, `Suites`, `Components`, `Enabled`.
fn parse_deb822(text: &str) -> Vec<Entry> {
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
                out.push(Entry {
                    uri,
                    suites: words("Suites"),
                    components: words("Components"),
                });
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
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(os_release_codename(text).as_deref(), Some("bookworm"));
        assert_eq!(os_release_codename("ID=debian\n"), None);
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
