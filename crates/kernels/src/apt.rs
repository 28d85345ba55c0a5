//! A private apt state: its own sources list, lists, cache and status file,
//! so fetching kernels never reads or changes the host's package state.
//! Pinned fetches keep one per suite in the cache ([`AptState::kept`]);
//! the rest use a temporary one.
//! Every command is an argv (no shell) with `LC_ALL=C` so messages parse.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::Arch;

use crate::error::KernelError;

/// How much the Release signature matters for this use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trust {
    /// Creating or moving a pin: the index must verify against the keyring.
    RequireSigned,
    /// Fetching a pinned `.deb`: try the keyring first; if the archive key is
    /// unknown or expired for this keyring, use the index unverified, because
    /// the `.deb` is checked against the pin's sha256 afterwards.
    PinnedHash,
}

/// A package paragraph from `apt-cache show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PackageRecord {
    pub package: String,
    pub version: String,
    /// KiB, as in the `Installed-Size` field.
    pub installed_size: u64,
    pub sha256: Option<String>,
}

pub(crate) struct AptState {
    root: Root,
    pub mirror: String,
    pub suite: String,
    pub keyring: PathBuf,
    /// Whose packages the index lists (Debian's name: `amd64`, `arm64`).
    arch: Arch,
}

/// Where an [`AptState`] lives.
enum Root {
    /// A fresh directory, removed when the state is dropped.
    Temp(tempfile::TempDir),
    /// A suite's state kept in the cache between fetches (and between
    /// processes), held under its lock while in use.
    Kept {
        dir: PathBuf,
        _lock: crate::lock::HolderLock,
    },
}

impl Root {
    fn path(&self) -> &Path {
        match self {
            Root::Temp(t) => t.path(),
            Root::Kept { dir, .. } => dir,
        }
    }
}

impl AptState {
    /// Creates the state in a fresh temp dir under `parent` (inside the
    /// cache, so downloads can be renamed into it atomically).
    pub fn new(
        parent: &Path,
        mirror: &str,
        suite: &str,
        keyring: &Path,
    ) -> Result<AptState, KernelError> {
        std::fs::create_dir_all(parent).map_err(|e| werr(parent, e))?;
        let root = tempfile::Builder::new()
            .prefix("apt-")
            .tempdir_in(parent)
            .map_err(|e| werr(parent, e))?;
        AptState::laid_out(Root::Temp(root), mirror, suite, keyring)
    }

    /// The state of `suite` on `mirror` kept under `parent` (one directory
    /// per mirror, suite and keyring), so that the pins of one suite, and
    /// the runs after this one, read its index once
    /// ([`AptState::has_index`]) instead of once per package: 1.6-1.7 s
    /// each here, and a 7.x pin has three packages. A pinned `.deb` is
    /// checked against its sha256 whatever index named it, so an old
    /// index can only fail a download, which the caller answers by reading
    /// the index again. Held under a lock for as long as the state lives;
    /// while another fetch (a thread, another kloop) holds it, a temporary
    /// state under `temp_parent` serves instead.
    pub fn kept(
        parent: &Path,
        temp_parent: &Path,
        mirror: &str,
        suite: &str,
        keyring: &Path,
        arch: Arch,
    ) -> Result<AptState, KernelError> {
        use sha2::Digest;
        let mirror = mirror.trim_end_matches('/');
        // x86-64's key is what it was before other architectures came, so
        // an existing cache keeps its indexes.
        let key = match arch {
            Arch::X86_64 => {
                sha2::Sha256::digest(format!("{mirror}\n{suite}\n{}", keyring.display()))
            }
            _ => sha2::Sha256::digest(format!(
                "{mirror}\n{suite}\n{}\n{}",
                keyring.display(),
                arch.debian()
            )),
        };
        let dir = parent.join(format!("{suite}-{}", &hex::encode(key)[..16]));
        std::fs::create_dir_all(&dir).map_err(|e| werr(&dir, e))?;
        let lock_path = dir.with_extension("lock");
        match crate::lock::HolderLock::try_take(&lock_path).map_err(|e| werr(&lock_path, e))? {
            Some(lock) => {
                AptState::laid_out(Root::Kept { dir, _lock: lock }, mirror, suite, keyring)
                    .map(|a| a.for_arch(arch))
            }
            None => AptState::new(temp_parent, mirror, suite, keyring).map(|a| a.for_arch(arch)),
        }
    }

    fn laid_out(
        root: Root,
        mirror: &str,
        suite: &str,
        keyring: &Path,
    ) -> Result<AptState, KernelError> {
        for d in [
            "state/lists/partial",
            "cache/archives/partial",
            "etc/sources.list.d",
            "etc/preferences.d",
            "etc/trusted.gpg.d",
            "download",
        ] {
            let p = root.path().join(d);
            std::fs::create_dir_all(&p).map_err(|e| werr(&p, e))?;
        }
        let status = root.path().join("state/status");
        std::fs::write(&status, b"").map_err(|e| werr(&status, e))?;
        // What a killed download left behind is not this download's file.
        let download = root.path().join("download");
        for entry in std::fs::read_dir(&download)
            .map_err(|e| werr(&download, e))?
            .flatten()
        {
            let _ = std::fs::remove_file(entry.path());
        }
        Ok(AptState {
            root,
            mirror: mirror.trim_end_matches('/').to_string(),
            suite: suite.to_string(),
            keyring: keyring.to_path_buf(),
            arch: Arch::X86_64,
        })
    }

    /// The same state reading another architecture's packages (before its
    /// first `update`: the sources list is written then).
    pub fn for_arch(mut self, arch: Arch) -> AptState {
        self.arch = arch;
        self
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// Where `apt-get download` puts the file.
    pub fn download_dir(&self) -> PathBuf {
        self.path("download")
    }

    /// The archive root serving `suite`. Debian publishes `<suite>-security`
    /// in a sibling archive named `<archive>-security`.
    pub fn suite_uri(&self) -> String {
        if self.suite.ends_with("-security") && !self.mirror.ends_with("-security") {
            format!("{}-security", self.mirror)
        } else {
            self.mirror.clone()
        }
    }

    /// "suite `<suite>` on <uri>", for messages.
    pub fn source(&self) -> String {
        format!("suite `{}` on {}", self.suite, self.suite_uri())
    }

    fn write_sources(&self, verified: bool) -> Result<(), KernelError> {
        let trust = if verified {
            format!("signed-by={}", self.keyring.display())
        } else {
            "trusted=yes".to_string()
        };
        let line = format!(
            "deb [arch={} target=Packages {trust}] {} {} main\n",
            self.arch.debian(),
            self.suite_uri(),
            self.suite
        );
        let path = self.path("etc/sources.list");
        std::fs::write(&path, line)
            .at("writing", &path)
            .map_err(KernelError::CacheWrite)
    }

    fn options(&self) -> Vec<String> {
        let p = |rel: &str| self.path(rel).display().to_string();
        let mut opts = vec![
            ("Dir::State", p("state")),
            ("Dir::State::Lists", p("state/lists")),
            ("Dir::State::status", p("state/status")),
            ("Dir::Cache", p("cache")),
            ("Dir::Cache::archives", p("cache/archives")),
            ("Dir::Etc::SourceList", p("etc/sources.list")),
            ("Dir::Etc::SourceParts", p("etc/sources.list.d")),
            ("Dir::Etc::Preferences", p("etc/preferences")),
            ("Dir::Etc::PreferencesParts", p("etc/preferences.d")),
            ("Dir::Etc::Trusted", p("etc/trusted.gpg")),
            ("Dir::Etc::TrustedParts", p("etc/trusted.gpg.d")),
            ("APT::Architecture", self.arch.debian().to_string()),
            ("APT::Architectures", self.arch.debian().to_string()),
            ("Acquire::Languages", "none".to_string()),
            ("APT::Get::List-Cleanup", "false".to_string()),
        ];
        // As root, apt would drop to `_apt` for downloads, which cannot enter a
        // private cache under a 0700 home; it then falls back to root with a
        // warning. Say so up front.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            opts.push(("APT::Sandbox::User", "root".to_string()));
        }
        opts.into_iter()
            .flat_map(|(k, v)| ["-o".to_string(), format!("{k}={v}")])
            .collect()
    }

    fn command(&self, tool: &str, args: &[&str], cwd: Option<&Path>) -> Command {
        let mut cmd = Command::new(tool);
        cmd.args(self.options())
            .args(args)
            .env("LC_ALL", "C")
            .env("LANGUAGE", "")
            .env_remove("APT_CONFIG")
            .stdin(Stdio::null());
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        tracing::debug!(suite = %self.suite, "running {tool} {}", args.join(" "));
        cmd
    }

    fn run(
        &self,
        tool: &'static str,
        args: &[&str],
        cwd: Option<&Path>,
    ) -> Result<Output, KernelError> {
        self.command(tool, args, cwd)
            .output()
            .map_err(|e| start_error(tool, args, e))
    }

    /// The suite's `Release` file alone, through apt's own downloader (so
    /// apt's proxy settings apply), killed after `deadline`: enough to tell
    /// whether the mirror answers and serves the suite, without fetching a
    /// package index. Not verified: nothing is trusted from it.
    pub fn fetch_release(&self, deadline: Duration) -> Result<String, KernelError> {
        let url = format!("{}/dists/{}/Release", self.suite_uri(), self.suite);
        let dest = self.path("download/Release");
        let log = self.path("apt-helper.log");
        let secs = deadline.as_secs().max(1).to_string();
        let timeouts = [
            format!("Acquire::http::Timeout={secs}"),
            format!("Acquire::https::Timeout={secs}"),
            "Acquire::Retries=0".to_string(),
        ];
        let dest_s = dest.display().to_string();
        let mut args: Vec<&str> = Vec::new();
        for t in &timeouts {
            args.extend(["-o", t.as_str()]);
        }
        args.extend(["download-file", &url, &dest_s]);
        let log_file = std::fs::File::create(&log)
            .at("creating", &log)
            .map_err(KernelError::CacheWrite)?;
        let log_err = log_file
            .try_clone()
            .at("opening", &log)
            .map_err(KernelError::CacheWrite)?;
        // Output goes to a file, not a pipe: nothing has to be read while
        // waiting, and a killed helper cannot leave a reader blocked.
        let mut child = self
            .command(APT_HELPER, &args, None)
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| start_error(APT_HELPER, &args, e))?;
        let end = Instant::now() + deadline;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(KernelError::IndexUnavailable {
                        suite: self.suite.clone(),
                        mirror: self.suite_uri(),
                        detail: format!(
                            "{url} did not arrive within {:.1} s",
                            deadline.as_secs_f64()
                        ),
                    });
                }
            }
        };
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        if status.success() {
            return std::fs::read_to_string(&dest)
                .at(crate::error::READING, &dest)
                .map_err(KernelError::CacheRead);
        }
        let detail = match first_problem_lines(&output, "") {
            d if d.is_empty() => format!("apt-helper exited with {status}"),
            d => d,
        };
        Err(if output.contains(" 404 ") {
            KernelError::SuiteGone {
                suite: self.suite.clone(),
                mirror: self.suite_uri(),
                detail,
            }
        } else {
            KernelError::IndexUnavailable {
                suite: self.suite.clone(),
                mirror: self.suite_uri(),
                detail,
            }
        })
    }

    /// Like [`AptState::run`], calling `on_bytes` with the bytes under
    /// `dir` about four times a second while the tool runs: what a download
    /// shows while apt writes the `.deb` there.
    fn run_watching_dir(
        &self,
        tool: &'static str,
        args: &[&str],
        dir: &Path,
        on_bytes: impl Fn(u64) + Send + Sync,
    ) -> Result<Output, KernelError> {
        let finished = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut last = 0;
                while !finished.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(250));
                    let now = dir_bytes(dir);
                    if now != last {
                        last = now;
                        on_bytes(now);
                    }
                }
            });
            let out = self.run(tool, args, Some(dir));
            finished.store(true, std::sync::atomic::Ordering::Relaxed);
            out
        })
    }

    /// The size in bytes of `spec` (`package=version`) as the index gives
    /// it, for a download's progress; `None` when apt does not say.
    fn download_size(&self, spec: &str) -> Option<u64> {
        let out = self.run("apt-cache", &["show", spec], None).ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Size:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// `apt-get update` for the one suite. With [`Trust::PinnedHash`] an
    /// index whose signing key the keyring lacks is retried unverified.
    /// Returns whether the Release signature verified.
    pub fn update(&self, trust: Trust) -> Result<bool, KernelError> {
        match self.update_once(true) {
            Ok(()) => Ok(true),
            // Only a key the keyring lacks (or that expired) is bypassed; a bad
            // signature is never.
            Err(KernelError::UnverifiedIndex { detail, .. })
                if trust == Trust::PinnedHash
                    && ["NO_PUBKEY", "EXPKEYSIG", "KEYEXPIRED"]
                        .iter()
                        .any(|m| detail.contains(m))
                    && !detail.contains("BADSIG") =>
            {
                self.update_once(false)?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn update_once(&self, verified: bool) -> Result<(), KernelError> {
        self.write_sources(verified)?;
        let out = self.run("apt-get", &["-q", "update"], None)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let detail = first_problem_lines(&stdout, &stderr);
        // With `trusted=yes` apt still warns about the unknown key; that
        // warning is the very thing this attempt accepts.
        if verified
            && [
                "NO_PUBKEY",
                "EXPKEYSIG",
                "KEYEXPIRED",
                "BADSIG",
                "is not signed",
                "couldn't be verified",
            ]
            .iter()
            .any(|m| stderr.contains(m) || stdout.contains(m))
        {
            return Err(KernelError::UnverifiedIndex {
                suite: self.suite.clone(),
                mirror: self.suite_uri(),
                keyring: self.keyring.clone(),
                detail,
            });
        }
        if stderr.contains("does not have a Release file") {
            return Err(KernelError::SuiteGone {
                suite: self.suite.clone(),
                mirror: self.suite_uri(),
                detail,
            });
        }
        // apt-get update exits 0 when it merely could not reach the mirror
        // ("W: Failed to fetch … ignored"); the Packages list tells the truth.
        if !out.status.success() || !self.has_packages_list() {
            return Err(KernelError::IndexUnavailable {
                suite: self.suite.clone(),
                mirror: self.suite_uri(),
                detail: if detail.is_empty() {
                    format!("apt-get update exited with {}", out.status)
                } else {
                    detail
                },
            });
        }
        Ok(())
    }

    /// Whether the state holds a suite index from an earlier fetch (only a
    /// kept state can): its packages can be downloaded without reading the
    /// index first.
    pub fn has_index(&self) -> bool {
        matches!(self.root, Root::Kept { .. }) && self.has_packages_list()
    }

    fn has_packages_list(&self) -> bool {
        std::fs::read_dir(self.path("state/lists"))
            .map(|d| {
                d.filter_map(Result::ok).any(|e| {
                    e.file_name().to_str().is_some_and(|n| {
                        n.contains(&format!("_binary-{}_Packages", self.arch.debian()))
                    })
                })
            })
            .unwrap_or(false)
    }

    /// Names of real packages starting with `prefix`.
    pub fn pkgnames(&self, prefix: &str) -> Result<Vec<String>, KernelError> {
        let out = self.run("apt-cache", &["pkgnames", prefix], None)?;
        // `apt-cache pkgnames` exits non-zero when nothing matches.
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// `apt-cache show` paragraphs for these packages.
    pub fn show(&self, names: &[String]) -> Result<Vec<PackageRecord>, KernelError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec!["show"];
        args.extend(names.iter().map(String::as_str));
        let out = self.run("apt-cache", &args, None)?;
        if !out.status.success() {
            return Err(KernelError::ToolFailed {
                command: format!("apt-cache show {}", names.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                hint: "run the command again; if it persists, report it with this output",
            });
        }
        Ok(parse_records(&String::from_utf8_lossy(&out.stdout)))
    }

    /// `apt-get download package=version` into [`AptState::download_dir`];
    /// returns the downloaded file. A version the mirror no longer has is
    /// reported as `Ok(None)`.
    pub fn download(&self, package: &str, version: &str) -> Result<Option<PathBuf>, KernelError> {
        let dir = self.download_dir();
        let spec = format!("{package}={version}");
        let task = format!("download {package}");
        let total = self.download_size(&spec);
        crate::status::start(
            &task,
            &format!(
                "downloading {spec}{} from {}",
                total.map_or(String::new(), |t| format!(" ({:.1} MB)", t as f64 / 1e6)),
                self.source()
            ),
        );
        let started = Instant::now();
        let out = self.run_watching_dir("apt-get", &["-q", "download", &spec], &dir, |bytes| {
            crate::status::progress(&task, bytes, total)
        })?;
        if out.status.success() {
            let bytes = dir_bytes(&dir);
            let secs = started.elapsed().as_secs_f64();
            crate::status::done(
                &task,
                &format!(
                    "downloaded {spec}: {:.1} MB in {secs:.1} s ({:.1} MB/s)",
                    bytes as f64 / 1e6,
                    bytes as f64 / 1e6 / secs.max(0.001)
                ),
            );
        } else {
            crate::status::failed(&task, &format!("apt-get download {spec} failed"));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let gone = [
                "was not found",
                "Unable to locate package",
                "Couldn't find any package",
                "Can't find a source to download",
                "has no installation candidate",
            ];
            if gone.iter().any(|m| stderr.contains(m)) {
                return Ok(None);
            }
            return Err(KernelError::ToolFailed {
                command: format!("apt-get download {spec}"),
                status: out.status.to_string(),
                stderr: first_problem_lines("", &stderr),
                hint: "check network access to the mirror or set KLOOP_MIRROR",
            });
        }
        let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .at(crate::error::READING, &dir)
            .map_err(KernelError::CacheRead)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
            .collect();
        match debs.as_slice() {
            [one] => Ok(Some(one.clone())),
            _ => Err(KernelError::ToolFailed {
                command: format!("apt-get download {spec}"),
                status: format!("produced {} .deb files in {}", debs.len(), dir.display()),
                stderr: stderr.trim().to_string(),
                hint: "expected exactly one; run the command again",
            }),
        }
    }
}

fn werr(path: &Path, source: std::io::Error) -> KernelError {
    KernelError::CacheWrite(PathIo::at("writing", path, source))
}

/// apt's single-file downloader (in the `apt` package on every Debian and
/// Ubuntu).
const APT_HELPER: &str = "/usr/lib/apt/apt-helper";

fn start_error(tool: &'static str, args: &[&str], e: std::io::Error) -> KernelError {
    if e.kind() == std::io::ErrorKind::NotFound {
        KernelError::ToolMissing {
            tool,
            package: "apt",
        }
    } else {
        KernelError::ToolFailed {
            command: format!("{tool} {}", args.join(" ")),
            status: "could not start".into(),
            stderr: e.to_string(),
            hint: "check that apt works on this host",
        }
    }
}

/// A field of a Debian control-style paragraph (`Release`, `Packages`).
pub(crate) fn control_field(para: &str, name: &str) -> Option<String> {
    para.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// Bytes in the regular files directly under `dir` (0 when unreadable).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The `E:`/`W:`/`Err:` lines apt printed, joined, for messages.
fn first_problem_lines(stdout: &str, stderr: &str) -> String {
    let mut lines: Vec<&str> = Vec::new();
    let mut in_err = false;
    for line in stdout.lines().chain(stderr.lines()) {
        let t = line.trim();
        if t.starts_with("E:") || t.starts_with("W:") || t.starts_with("Err:") {
            in_err = t.starts_with("Err:");
            lines.push(t);
        } else if in_err && line.starts_with(' ') {
            lines.push(t);
        } else {
            in_err = false;
        }
    }
    lines.dedup();
    lines.truncate(8);
    lines.join(" | ")
}

pub(crate) fn parse_records(text: &str) -> Vec<PackageRecord> {
    let mut out = Vec::new();
    for para in text.split("\n\n") {
        let field = |name: &str| control_field(para, name);
        let (Some(package), Some(version)) = (field("Package"), field("Version")) else {
            continue;
        };
        out.push(PackageRecord {
            package,
            version,
            installed_size: field("Installed-Size")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            sha256: field("SHA256"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A suite's kept state serves one fetch at a time: while it is held,
    /// another gets a temporary state (removed when dropped), and once it
    /// is dropped the next takes the kept one again. A fresh kept state has
    /// no index yet.
    #[test]
    fn a_kept_state_serves_one_fetch_at_a_time() {
        let cache = tempfile::tempdir().unwrap();
        let (kept, tmp) = (cache.path().join("apt"), cache.path().join("tmp"));
        let keyring = Path::new("/usr/share/keyrings/debian-archive-keyring.gpg");
        let kept_state = || {
            AptState::kept(
                &kept,
                &tmp,
                "http://m.invalid/debian/",
                "sid",
                keyring,
                Arch::X86_64,
            )
        };
        let first = kept_state().unwrap();
        assert!(matches!(first.root, Root::Kept { .. }));
        assert!(!first.has_index());
        assert_eq!(first.mirror, "http://m.invalid/debian");
        let second = kept_state().unwrap();
        assert!(matches!(second.root, Root::Temp(_)));
        let temp_dir = second.root.path().to_path_buf();
        assert!(temp_dir.starts_with(&tmp));
        drop(second);
        assert!(!temp_dir.exists());
        let first_dir = first.root.path().to_path_buf();
        drop(first);
        let again = kept_state().unwrap();
        assert!(matches!(again.root, Root::Kept { .. }));
        assert_eq!(again.root.path(), first_dir);
    }

    #[test]
    fn parses_apt_cache_show() {
        let text =
            "Package: linux-binary-7.3-cloud-amd64\nSource: linux-signed-amd64 (7.3~rc7+1~exp1)\n\
                    Version: 7.3~rc7-1~exp1\nInstalled-Size: 13876\nDescription: Linux\n \
                    continued: not a field\nSHA256: abc\n\nPackage: linux-image-7.3-cloud-amd64\n\
                    Version: 7.3~rc7-1~exp1\nInstalled-Size: 13\n\n";
        assert_eq!(
            parse_records(text),
            [
                PackageRecord {
                    package: "linux-binary-7.3-cloud-amd64".into(),
                    version: "7.3~rc7-1~exp1".into(),
                    installed_size: 13876,
                    sha256: Some("abc".into()),
                },
                PackageRecord {
                    package: "linux-image-7.3-cloud-amd64".into(),
                    version: "7.3~rc7-1~exp1".into(),
                    installed_size: 13,
                    sha256: None,
                },
            ]
        );
    }

    #[test]
    fn collects_apt_problem_lines() {
        let stdout = "Get:1 http://mirror.example/debian sid InRelease [193 kB]\n\
                      Err:1 http://mirror.example/debian sid InRelease\n  \
                      The following signatures couldn't be verified: NO_PUBKEY 6ED0E7B82643E131\n\
                      Reading package lists...\n";
        let stderr =
            "E: The repository 'http://mirror.example/debian sid InRelease' is not signed.\n";
        assert_eq!(
            first_problem_lines(stdout, stderr),
            "Err:1 http://mirror.example/debian sid InRelease | The following signatures \
             couldn't be verified: NO_PUBKEY 6ED0E7B82643E131 | E: The repository \
             'http://mirror.example/debian sid InRelease' is not signed."
        );
    }

    #[test]
    fn security_suites_use_the_sibling_archive() {
        let dir = tempfile::tempdir().unwrap();
        let keyring = Path::new("/k.gpg");
        let a = AptState::new(
            dir.path(),
            "http://mirror.example/debian/",
            "bullseye-security",
            keyring,
        )
        .unwrap();
        assert_eq!(a.suite_uri(), "http://mirror.example/debian-security");
        let b = AptState::new(
            dir.path(),
            "http://mirror.example/debian",
            "bookworm",
            keyring,
        )
        .unwrap();
        assert_eq!(b.suite_uri(), "http://mirror.example/debian");
    }
}
