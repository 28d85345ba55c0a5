//! The content-addressed kernel cache.
//!
//! Layout under the root:
//! - `images/<image_sha256>`   verified bzImages
//! - `debs/<deb_sha256>.deb`   verified packages (later work extracts modules)
//! - `rejected/`               downloads that did not match their pin
//! - `tmp/`                    private apt states and partial files
//!
//! Every file is written to a temp name in its final directory and renamed
//! only after its sha256 matched, and every hit is re-hashed before it is
//! returned, so a truncated or altered file is never handed out.

use kloop_path_io::{PathIo, PathIoExt};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use crate::apt::{AptState, Trust};
use crate::error::{KernelError, READING};
use crate::extract::{install_verified, sha256_file, walk_deb, InstallError};
use crate::mirror::{locate_host_mirror, Mirror, MirrorOrigin};
use crate::pin::{KernelPin, PackageOf};
use crate::settings::{CACHE_DIR_ENV, DEFAULT_KEYRING, KEYRING_ENV};

/// How to fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchOptions {
    /// Never touch the network: only verified cache content is used.
    pub offline: bool,
    /// Debian mirror URL; default `KLOOP_MIRROR`, then the host's apt sources.
    pub mirror: Option<String>,
    /// Keyring to verify Release files; default `KLOOP_KEYRING`, then the
    /// host's `debian-archive-keyring.gpg`.
    pub keyring: Option<PathBuf>,
}

impl FetchOptions {
    /// The mirror these options resolve to (option, env, host apt sources).
    pub fn resolve_mirror(&self) -> Result<String, KernelError> {
        self.locate_mirror().map(|m| m.url)
    }

    /// [`FetchOptions::resolve_mirror`] with where the URL came from.
    pub fn locate_mirror(&self) -> Result<Mirror, KernelError> {
        match self
            .mirror
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            Some(m) => Ok(Mirror {
                url: m.trim_end_matches('/').to_string(),
                origin: MirrorOrigin::Option,
            }),
            None => locate_host_mirror(),
        }
    }

    /// The keyring these options resolve to (option, env, host default).
    pub fn resolve_keyring(&self) -> PathBuf {
        self.keyring
            .clone()
            .or_else(|| {
                std::env::var_os(KEYRING_ENV)
                    .filter(|k| !k.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KEYRING))
    }
}

/// A package pinned by its `.deb`'s sha256, and where to fetch it from.
#[derive(Debug, Clone, Copy)]
pub struct PinnedDeb<'a> {
    /// What the pin is called in messages (`6.12`, `linux-source-6.12`).
    pub id: &'a str,
    pub suite: &'a str,
    pub package: &'a str,
    pub version: &'a str,
    pub sha256: &'a str,
}

/// A kernel cache rooted at one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    root: PathBuf,
}

/// What a cache lookup found.
enum Lookup {
    Hit(PathBuf),
    Miss,
    /// A file was there with the wrong hash; it has been removed.
    Corrupt {
        path: PathBuf,
        actual: String,
    },
}

/// One package [`KernelCache::fetch_pin`] made sure of.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub package: String,
    /// What it gave: the image's path, the config's origin, the `.deb`.
    pub got: String,
    pub secs: f64,
}

/// What `clean` removes from the cache (each a directory under its root).
#[derive(Debug, Clone, Copy, Default)]
pub struct CleanParts {
    /// `saved-vms/`.
    pub saved_vms: bool,
    /// What a fetch makes again from the mirror; built kernels and
    /// unpacked sources (hours of compiling) stay.
    pub kernels: bool,
}

impl CleanParts {
    fn dirs(self) -> Vec<&'static str> {
        let mut dirs = Vec::new();
        if self.saved_vms {
            dirs.push("saved-vms");
        }
        if self.kernels {
            dirs.extend([
                "debs", "images", "vmlinux", "configs", "tmp", "rejected", "apt",
            ]);
        }
        dirs
    }
}

/// What [`KernelCache::clean`] did.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Removed directories and their bytes.
    pub removed: Vec<(PathBuf, u64)>,
    /// Directories that could not be removed, and why.
    pub failed: Vec<(PathBuf, std::io::Error)>,
}

/// `clean` refused: kloop processes use the cache.
#[derive(Debug, thiserror::Error)]
#[error("not removing {parts} from {root}: in use by {}; run `cargo xtask clean` again when they end", users.join(", "))]
pub struct CacheInUse {
    pub parts: String,
    pub root: PathBuf,
    /// Each user as `pid N (command line)`.
    pub users: Vec<String>,
}

impl KernelCache {
    /// Removes `parts` of the cache, unless a kloop process registered as
    /// its user lives ([`crate::lock::register_user`]).
    pub fn clean(&self, parts: CleanParts) -> Result<Cleaned, CacheInUse> {
        let dirs = parts.dirs();
        let users = crate::lock::live_users(self.root());
        if !dirs.is_empty() && !users.is_empty() {
            return Err(CacheInUse {
                parts: dirs.join(", "),
                root: self.root().to_path_buf(),
                users,
            });
        }
        let mut done = Cleaned::default();
        for d in dirs {
            let path = self.root().join(d);
            if !path.exists() {
                continue;
            }
            let bytes = dir_bytes(&path);
            match std::fs::remove_dir_all(&path) {
                Ok(()) => done.removed.push((path, bytes)),
                Err(e) => done.failed.push((path, e)),
            }
        }
        Ok(done)
    }

    /// Everything a pin's trials need from the mirror, fetched now so that
    /// later runs work offline: the image, the `.config` (its own package
    /// from 7.x on: the preflight that skips a trial before booting) and the
    /// modules package (scenarios with `modules`). One [`Fetched`] each.
    pub fn fetch_pin(
        &self,
        pin: &KernelPin,
        opts: &FetchOptions,
    ) -> Result<Vec<Fetched>, KernelError> {
        let timed = |package: &str, what: &dyn Fn() -> Result<String, KernelError>| {
            let t = std::time::Instant::now();
            what().map(|got| Fetched {
                package: package.to_string(),
                got,
                secs: t.elapsed().as_secs_f64(),
            })
        };
        let mut out = vec![timed(&pin.package, &|| {
            Ok(self.ensure_image(pin, opts)?.display().to_string())
        })?];
        let unserved = |package: &str| Fetched {
            package: package.to_string(),
            got: "skipped: the mirror did not serve it when this build was pinned".into(),
            secs: 0.0,
        };
        match pin.config_of() {
            PackageOf::Image => {}
            PackageOf::Companion { package, .. } => out.push(timed(package, &|| {
                Ok(self.ensure_config(pin, opts)?.source.to_string())
            })?),
            PackageOf::Unserved { package } => out.push(unserved(package)),
        }
        match pin.modules_of() {
            PackageOf::Image => {}
            PackageOf::Companion { package, .. } => out.push(timed(package, &|| {
                Ok(self.ensure_modules_deb(pin, opts)?.display().to_string())
            })?),
            PackageOf::Unserved { package } => out.push(unserved(package)),
        }
        Ok(out)
    }

    /// `$KLOOP_CACHE_DIR`, else `$XDG_CACHE_HOME/kloop`, else `$HOME/.cache/kloop`.
    pub fn default_location() -> Result<KernelCache, KernelError> {
        cache_root_from(|name| std::env::var_os(name)).map(KernelCache::at)
    }

    /// A cache rooted at `root` (created on first write).
    pub fn at(root: impl Into<PathBuf>) -> KernelCache {
        KernelCache { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the verified image of `pin` lives (whether or not it is there).
    pub fn image_path(&self, pin: &KernelPin) -> PathBuf {
        self.root.join("images").join(&pin.image_sha256)
    }

    /// Where the verified `.deb` of `pin` lives (whether or not it is there).
    pub fn deb_path(&self, pin: &KernelPin) -> PathBuf {
        self.root
            .join("debs")
            .join(format!("{}.deb", pin.deb_sha256))
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// True if the image is cached and its sha256 matches the pin.
    pub fn is_cached(&self, pin: &KernelPin) -> bool {
        let path = self.image_path(pin);
        sha256_file(&path).is_ok_and(|h| h == pin.image_sha256)
    }

    /// The path of `pin`'s bzImage, verified against `image_sha256` right
    /// before returning. A hit costs one hash and no apt call; a miss
    /// extracts from the cached `.deb` or downloads it first.
    pub fn ensure_image(
        &self,
        pin: &KernelPin,
        opts: &FetchOptions,
    ) -> Result<PathBuf, KernelError> {
        pin.validate(Path::new(&format!("kernels/{}.toml", pin.id)))?;
        let dest = self.image_path(pin);
        match lookup(&dest, &pin.image_sha256)? {
            Lookup::Hit(path) => return Ok(path),
            Lookup::Corrupt { path, actual } if opts.offline && !self.deb_path(pin).exists() => {
                return Err(KernelError::CorruptOffline {
                    id: pin.id.clone(),
                    path,
                    expected: pin.image_sha256.clone(),
                    actual,
                })
            }
            Lookup::Corrupt { path, actual } => report_repair(&path, &actual),
            Lookup::Miss => {}
        }
        let deb = self.ensure_deb(pin, opts)?;
        let task = format!("extract {}", pin.id);
        crate::status::start(
            &task,
            &format!("{}: extracting and verifying {}", pin.id, pin.image_path),
        );
        self.extract_image(pin, &deb)
            .inspect_err(|e| crate::status::failed(&task, &e.to_string()))?;
        crate::status::done(&task, &format!("{}: image extracted and verified", pin.id));
        match lookup(&dest, &pin.image_sha256)? {
            Lookup::Hit(path) => Ok(path),
            Lookup::Miss => Err(KernelError::CacheRead(PathIo::at(
                READING,
                dest,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the image vanished right after it was written",
                ),
            ))),
            Lookup::Corrupt { path, actual } => Err(KernelError::ImageHashMismatch {
                id: pin.id.clone(),
                member: format!("{} (from {})", path.display(), deb.display()),
                expected: pin.image_sha256.clone(),
                actual,
            }),
        }
    }

    /// The path of `pin`'s `.deb`, verified against `deb_sha256`;
    /// downloaded with `apt-get download` on a miss (unless offline).
    pub fn ensure_deb(&self, pin: &KernelPin, opts: &FetchOptions) -> Result<PathBuf, KernelError> {
        self.ensure_package(pin, &pin.package, &pin.deb_sha256, opts)
    }

    /// The verified `.deb` that holds `pin`'s modules: the image package up
    /// to 6.x, `modules_package` from 7.x on.
    pub fn ensure_modules_deb(
        &self,
        pin: &KernelPin,
        opts: &FetchOptions,
    ) -> Result<PathBuf, KernelError> {
        match pin.modules_of() {
            PackageOf::Companion { package, sha256 } => {
                self.ensure_package(pin, package, sha256, opts)
            }
            PackageOf::Unserved { package } => Err(pin.unserved_error(package, "modules")),
            PackageOf::Image => self.ensure_deb(pin, opts),
        }
    }

    /// `package` at `pin.version`, cached as `debs/<sha256>.deb`.
    pub(crate) fn ensure_package(
        &self,
        pin: &KernelPin,
        package: &str,
        sha256: &str,
        opts: &FetchOptions,
    ) -> Result<PathBuf, KernelError> {
        self.ensure_pinned_deb(
            &PinnedDeb {
                id: &pin.id,
                suite: &pin.suite,
                package,
                version: &pin.version,
                sha256,
            },
            opts,
        )
    }

    /// A `.deb` pinned by sha256 (a kernel's, a source package's), from the
    /// cache or downloaded now from its suite and verified.
    pub fn ensure_pinned_deb(
        &self,
        deb: &PinnedDeb<'_>,
        opts: &FetchOptions,
    ) -> Result<PathBuf, KernelError> {
        let dest = self.root.join("debs").join(format!("{}.deb", deb.sha256));
        match lookup(&dest, deb.sha256)? {
            Lookup::Hit(path) => return Ok(path),
            Lookup::Corrupt { path, actual } if opts.offline => {
                return Err(KernelError::CorruptOffline {
                    id: deb.id.to_string(),
                    path,
                    expected: deb.sha256.to_string(),
                    actual,
                })
            }
            Lookup::Miss if opts.offline => {
                return Err(KernelError::NotCached {
                    id: deb.id.to_string(),
                    path: dest,
                })
            }
            Lookup::Corrupt { path, actual } => report_repair(&path, &actual),
            Lookup::Miss => {}
        }
        let mirror = opts.resolve_mirror()?;
        let apt = AptState::kept(
            &self.root.join("apt"),
            &self.tmp_dir(),
            &mirror,
            deb.suite,
            &opts.resolve_keyring(),
            // A pin's id names its architecture; a source package's id is
            // x86-64's, whose index lists `Architecture: all` packages too.
            kloop_protocol::Arch::of_id(deb.id).0,
        )?;
        let index_read_before = apt.has_index();
        if !index_read_before {
            read_index(&apt, deb, "")?;
        }
        let mut downloaded = apt.download(deb.package, deb.version);
        if index_read_before && !matches!(downloaded, Ok(Some(_))) {
            // The index kept from an earlier fetch may predate the package
            // (or name a file the mirror has since dropped): read it again.
            read_index(&apt, deb, " again (the kept one did not serve it)")?;
            downloaded = apt.download(deb.package, deb.version);
        }
        let downloaded = downloaded?.ok_or_else(|| KernelError::Vanished {
            id: deb.id.to_string(),
            package: deb.package.to_string(),
            version: deb.version.to_string(),
            origin: apt.source(),
        })?;
        self.adopt_deb_expecting(&downloaded, Some((deb.id, deb.sha256)))
    }

    /// Moves a downloaded `.deb` into `debs/<sha256>.deb` (same filesystem,
    /// so a rename). With a pin, a hash mismatch moves it to `rejected/`
    /// instead and fails naming both hashes.
    pub(crate) fn adopt_deb(
        &self,
        file: &Path,
        pin: Option<&KernelPin>,
    ) -> Result<PathBuf, KernelError> {
        self.adopt_deb_expecting(file, pin.map(|p| (p.id.as_str(), p.deb_sha256.as_str())))
    }

    fn adopt_deb_expecting(
        &self,
        file: &Path,
        expect: Option<(&str, &str)>,
    ) -> Result<PathBuf, KernelError> {
        let actual = sha256_file(file)
            .at(READING, file)
            .map_err(KernelError::CacheRead)?;
        if let Some((id, expected)) = expect {
            if actual != expected {
                let rejected_dir = self.root.join("rejected");
                let kept = rejected_dir.join(file.file_name().unwrap_or_default());
                let kept = std::fs::create_dir_all(&rejected_dir)
                    .and_then(|()| std::fs::rename(file, &kept))
                    .map(|()| kept)
                    .unwrap_or_else(|_| file.to_path_buf());
                return Err(KernelError::DebHashMismatch {
                    id: id.to_string(),
                    file: kept,
                    expected: expected.to_string(),
                    actual,
                });
            }
        }
        let dir = self.root.join("debs");
        mkdir(&dir)?;
        let dest = dir.join(format!("{actual}.deb"));
        std::fs::rename(file, &dest)
            .at("renaming into", &dest)
            .map_err(KernelError::CacheWrite)?;
        Ok(dest)
    }

    /// The pin's `.config`: `boot/config-<release>` in its package up to
    /// 6.x, `usr/lib/modules/<release>/config` in its `config_package` from
    /// 7.x on; cached as `configs/<sha256 of that .deb>.config` after the
    /// first extraction. A package that has neither is remembered too
    /// (`configs/<sha256>.none`), so that every trial of a run does not
    /// unpack it again to find nothing.
    pub fn ensure_config(
        &self,
        pin: &KernelPin,
        opts: &FetchOptions,
    ) -> Result<crate::config::KernelConfig, KernelError> {
        let (package, sha) = match pin.config_of() {
            PackageOf::Companion { package, sha256 } => (package, sha256),
            PackageOf::Unserved { package } => return Err(pin.unserved_error(package, ".config")),
            PackageOf::Image => (pin.package.as_str(), pin.deb_sha256.as_str()),
        };
        let dir = self.root.join("configs");
        let dest = dir.join(format!("{sha}.config"));
        let none = dir.join(format!("{sha}.none"));
        let members = [
            PathBuf::from(format!("boot/config-{}", pin.release)),
            PathBuf::from(format!("usr/lib/modules/{}/config", pin.release)),
        ];
        let missing = |archive: PathBuf| KernelError::MemberMissing {
            archive,
            member: members
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            found: "neither is in the package".into(),
        };
        if none.is_file() && !dest.is_file() {
            return Err(missing(self.root.join("debs").join(format!("{sha}.deb"))));
        }
        let mut found_at = None;
        // The extracted config is trusted only with the hash written beside
        // it: one cut short or damaged would make the preflight skip every
        // trial for options that are really set. Remaking it from the
        // (verified) package is cheap.
        let sum = dir.join(format!("{sha}.config.sha256"));
        if dest.is_file() && !config_intact(&dest, &sum) {
            crate::status::done(
                &format!("config-check {sha}"),
                &format!(
                    "the cached config {} does not match its recorded hash: extracting it again",
                    dest.display()
                ),
            );
            let _ = std::fs::remove_file(&dest);
        }
        if !dest.is_file() {
            let deb = self.ensure_package(pin, package, sha, opts)?;
            let found = read_first_member(&deb, &members)?;
            mkdir(&dir)?;
            let Some((member, text)) = found else {
                let _ = std::fs::write(&none, format!("no {members:?} in {package}\n"));
                return Err(missing(deb));
            };
            found_at = Some(member);
            write_with_sum(&dir, &dest, &sum, &text)?;
        }
        let mut config = crate::config::KernelConfig::from_file(&dest)?;
        let member = found_at.unwrap_or_else(|| {
            if pin.config_package.is_some() {
                members[1].clone()
            } else {
                members[0].clone()
            }
        });
        config.source = format!("/{} of package {package}", member.display());
        Ok(config)
    }

    /// Extracts `pin.image_path` from `deb` into `images/<image_sha256>`,
    /// refusing escaping entries and a hash mismatch.
    fn extract_image(&self, pin: &KernelPin, deb: &Path) -> Result<PathBuf, KernelError> {
        let dir = self.root.join("images");
        mkdir(&dir)?;
        let member = Path::new(&pin.image_path);
        let member = super::extract::normalise_entry_path(member)
            .ok()
            .flatten()
            .unwrap_or_else(|| member.to_path_buf());
        let mut installed = None;
        let mut images_seen = Vec::new();
        walk_deb(deb, |path, entry| {
            if super::extract::image_release_from_path(path).is_some() {
                images_seen.push(path.display().to_string());
            }
            if path != member || installed.is_some() {
                return Ok(());
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                return Ok(());
            }
            let result = install_verified(entry, &dir, None, Some(&pin.image_sha256));
            installed = Some(result.map_err(|e| match e {
                InstallError::Mismatch { actual } => KernelError::ImageHashMismatch {
                    id: pin.id.clone(),
                    member: format!("{} in {}", pin.image_path, deb.display()),
                    expected: pin.image_sha256.clone(),
                    actual,
                },
                InstallError::Write(e) => KernelError::CacheWrite(e),
                InstallError::Read(e) => KernelError::BadImage {
                    path: deb.to_path_buf(),
                    reason: format!("reading {} failed: {e}", pin.image_path),
                },
            }));
            Ok(())
        })?;
        match installed {
            Some(result) => result.map(|(path, _)| path),
            None => Err(KernelError::MemberMissing {
                archive: deb.to_path_buf(),
                member: pin.image_path.clone(),
                found: if images_seen.is_empty() {
                    "none".into()
                } else {
                    images_seen.join(", ")
                },
            }),
        }
    }
}

/// A corrupt cache entry is repaired, not fatal, but the user should know
/// their cache (or disk) lost data.
fn report_repair(path: &Path, actual: &str) {
    tracing::warn!(
        "kloop: cached file {} was corrupt (sha256 {actual}); removed it, fetching again",
        path.display()
    );
}

fn cache_root_from(
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<PathBuf, KernelError> {
    let var = |name| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var(CACHE_DIR_ENV)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("kloop")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/kloop")))
        .ok_or(KernelError::NoCacheDir)
}

fn mkdir(dir: &Path) -> Result<(), KernelError> {
    std::fs::create_dir_all(dir)
        .at("creating", dir)
        .map_err(KernelError::CacheWrite)
}

/// Hashes `path`; removes it if the hash is wrong.
fn lookup(path: &Path, expected: &str) -> Result<Lookup, KernelError> {
    match sha256_file(path) {
        Ok(actual) if actual == expected => Ok(Lookup::Hit(path.to_path_buf())),
        Ok(actual) => {
            std::fs::remove_file(path)
                .at("removing", path)
                .map_err(KernelError::CacheWrite)?;
            Ok(Lookup::Corrupt {
                path: path.to_path_buf(),
                actual,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lookup::Miss),
        Err(source) => Err(KernelError::CacheRead(PathIo::at(READING, path, source))),
    }
}

/// Reads `deb`'s suite index into `apt`, saying so (`again` ends the line).
fn read_index(apt: &AptState, deb: &PinnedDeb<'_>, again: &str) -> Result<(), KernelError> {
    let task = format!("index {} {}", deb.id, deb.package);
    crate::status::start(
        &task,
        &format!(
            "{}: {} is not cached; reading the index of {}{again}",
            deb.id, deb.package, deb.suite
        ),
    );
    apt.update(Trust::PinnedHash)
        .inspect_err(|e| crate::status::failed(&task, &e.to_string()))?;
    crate::status::done(&task, &format!("{}: index of {} read", deb.id, deb.suite));
    Ok(())
}

/// The text of the first entry of `deb` that is one of `members`, and which
/// member it was; `None` when the package has none of them.
fn read_first_member(
    deb: &Path,
    members: &[PathBuf],
) -> Result<Option<(PathBuf, String)>, KernelError> {
    let mut found = None;
    walk_deb(deb, |path, entry| {
        if found.is_none() {
            if let Some(member) = members.iter().find(|m| path == m.as_path()) {
                let mut s = String::new();
                std::io::Read::read_to_string(entry, &mut s)
                    .at(READING, deb)
                    .map_err(KernelError::CacheRead)?;
                found = Some((member.clone(), s));
            }
        }
        Ok(())
    })?;
    Ok(found)
}

/// Writes `text` to `dest` and its sha256 to `sum`, each through a
/// temporary file in `dir`.
fn write_with_sum(dir: &Path, dest: &Path, sum: &Path, text: &str) -> Result<(), KernelError> {
    let tmp = dir.join(format!(".partial-{}", std::process::id()));
    let digest = hex::encode(Sha256::digest(text.as_bytes()));
    // The config first, then its hash: a kill between the two leaves
    // a config without a hash, extracted again next time.
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, dest))
        .and_then(|()| std::fs::write(&tmp, format!("{digest}\n")))
        .and_then(|()| std::fs::rename(&tmp, sum))
        .at("writing", dest)
        .map_err(KernelError::CacheWrite)
}

/// Does the config at `path` have the sha256 recorded beside it at `sum`?
fn config_intact(path: &Path, sum: &Path) -> bool {
    let (Ok(actual), Ok(recorded)) = (sha256_file(path), std::fs::read_to_string(sum)) else {
        return false;
    };
    actual == recorded.trim()
}

/// The bytes of the files under `dir` (symbolic links not followed).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// A mirror that cannot be reached: any apt call fails, so a passing
    /// test proves no network was needed.
    const DEAD_MIRROR: &str = "http://kloop-test.invalid/debian";

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    fn pin_for(image: &[u8], deb: &[u8]) -> KernelPin {
        KernelPin {
            id: "6.1".into(),
            series: "6.1".into(),
            suite: "bookworm".into(),
            package: "linux-image-6.1.0-1-cloud-amd64".into(),
            version: "6.1.1-1".into(),
            deb_sha256: sha(deb),
            image_path: "boot/vmlinuz-6.1.0-1-cloud-amd64".into(),
            image_sha256: sha(image),
            release: "6.1.0-1-cloud-amd64".into(),
            config: None,
            modules_package: None,
            modules_deb_sha256: None,
            config_package: None,
            config_deb_sha256: None,
            unserved: Vec::new(),
        }
    }

    fn dead_mirror(offline: bool) -> FetchOptions {
        FetchOptions {
            offline,
            mirror: Some(DEAD_MIRROR.into()),
            keyring: None,
        }
    }

    fn seed_image(cache: &KernelCache, pin: &KernelPin, bytes: &[u8]) -> PathBuf {
        let path = cache.image_path(pin);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn verified_hit_needs_no_network() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let image = b"a bzImage, as far as the cache cares".to_vec();
        let pin = pin_for(&image, b"deb");
        let seeded = seed_image(&cache, &pin, &image);
        assert!(cache.is_cached(&pin));
        for offline in [true, false] {
            let got = cache.ensure_image(&pin, &dead_mirror(offline)).unwrap();
            assert_eq!(got, seeded);
            assert_eq!(std::fs::read(&got).unwrap(), image);
        }
        assert_eq!(got_layout(&cache), ["images"]);
    }

    /// A config cut short after extraction (a full disk, a crash in an
    /// older kloop) is noticed by its recorded hash and extracted again
    /// from the verified package: trusted on sight, it made the preflight
    /// skip every trial and the run exit 0 having tested nothing. The
    /// package is a real .deb built with dpkg-deb.
    #[test]
    fn a_damaged_config_is_extracted_again() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
        std::fs::create_dir_all(tree.join("boot")).unwrap();
        std::fs::write(
            tree.join("DEBIAN/control"),
            "Package: kloop-test-image\nVersion: 1\nArchitecture: all\nMaintainer: kloop <kloop@invalid>\nDescription: test\n",
        )
        .unwrap();
        let config = "#\n# Automatically generated file; DO NOT EDIT.\nCONFIG_BLK_DEV_INITRD=y\nCONFIG_BPF_JIT=y\n";
        std::fs::write(tree.join("boot/config-6.1.0-1-cloud-amd64"), config).unwrap();
        let built = dir.path().join("x.deb");
        let ok = std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&tree)
            .arg(&built)
            .output()
            .expect("dpkg-deb runs (Debian's dpkg)");
        assert!(ok.status.success(), "{ok:?}");
        let deb = std::fs::read(&built).unwrap();
        let cache = KernelCache::at(dir.path().join("cache"));
        let pin = pin_for(b"image", &deb);
        let debs = cache.root().join("debs");
        std::fs::create_dir_all(&debs).unwrap();
        std::fs::write(debs.join(format!("{}.deb", pin.deb_sha256)), &deb).unwrap();
        let offline = dead_mirror(true);
        let c = cache.ensure_config(&pin, &offline).unwrap();
        assert_eq!(c.state("BLK_DEV_INITRD"), crate::OptionState::BuiltIn);
        let path = cache
            .root()
            .join(format!("configs/{}.config", pin.deb_sha256));
        // Cut short: the option the preflight needs is gone from the file.
        std::fs::write(&path, &config[..50]).unwrap();
        let c = cache.ensure_config(&pin, &offline).unwrap();
        assert_eq!(c.state("BLK_DEV_INITRD"), crate::OptionState::BuiltIn);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), config);
        // A config from before hashes were recorded is extracted again too.
        std::fs::remove_file(path.with_extension("config.sha256")).unwrap();
        assert!(cache.ensure_config(&pin, &offline).is_ok());
        assert!(path.with_extension("config.sha256").is_file());
    }

    fn got_layout(cache: &KernelCache) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(cache.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn corrupt_image_is_named_removed_and_refused_offline() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let pin = pin_for(b"the real image", b"deb");
        let path = seed_image(&cache, &pin, b"the real imagf");
        assert!(!cache.is_cached(&pin));
        let err = cache.ensure_image(&pin, &dead_mirror(true)).unwrap_err();
        let KernelError::CorruptOffline {
            path: named,
            expected,
            actual,
            ..
        } = &err
        else {
            panic!("expected CorruptOffline, got {err:?}");
        };
        assert_eq!(named, &path);
        assert_eq!(expected, &pin.image_sha256);
        assert_eq!(actual, &sha(b"the real imagf"));
        assert!(err.to_string().contains(&path.display().to_string()));
        assert!(!path.exists(), "the corrupt file must be removed");
    }

    #[test]
    fn corrupt_image_online_is_removed_and_refetched() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let pin = pin_for(b"the real image", b"deb");
        let path = seed_image(&cache, &pin, b"truncated");
        // The re-fetch goes to the mirror, which is unreachable here.
        let err = cache.ensure_image(&pin, &dead_mirror(false)).unwrap_err();
        assert!(
            matches!(err, KernelError::IndexUnavailable { .. }),
            "expected the re-fetch to hit the (dead) mirror, got {err:?}"
        );
        assert!(!path.exists());
        // No temporary apt state is left, and the suite's kept one holds
        // no index (the mirror gave none) and no download.
        assert!(std::fs::read_dir(cache.tmp_dir()).map_or(true, |d| d.count() == 0));
        let kept: Vec<_> = std::fs::read_dir(dir.path().join("apt"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(
            std::fs::read_dir(kept[0].join("download")).unwrap().count(),
            0
        );
    }

    #[test]
    fn offline_miss_is_refused_with_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let pin = pin_for(b"img", b"deb");
        let err = cache.ensure_image(&pin, &dead_mirror(true)).unwrap_err();
        assert!(matches!(err, KernelError::NotCached { .. }), "{err:?}");
        assert!(err.to_string().contains("offline"), "{err}");
    }

    #[test]
    fn unwritable_cache_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the cache root's `apt` directory should be.
        std::fs::write(dir.path().join("apt"), b"").unwrap();
        let cache = KernelCache::at(dir.path());
        let pin = pin_for(b"img", b"deb");
        let err = cache.ensure_image(&pin, &dead_mirror(false)).unwrap_err();
        let KernelError::CacheWrite(PathIo {
            path: Some(path), ..
        }) = &err
        else {
            panic!("expected CacheWrite naming a path, got {err:?}");
        };
        assert!(path.starts_with(dir.path()), "{path:?}");
        assert!(err.to_string().contains("KLOOP_CACHE_DIR"), "{err}");
    }

    #[test]
    fn mismatched_download_is_rejected_naming_both_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let pin = pin_for(b"img", b"the pinned deb");
        let dl = dir
            .path()
            .join("linux-image-6.1.0-1-cloud-amd64_6.1.1-1_amd64.deb");
        std::fs::write(&dl, b"other bytes").unwrap();
        let err = cache.adopt_deb(&dl, Some(&pin)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&pin.deb_sha256), "{msg}");
        assert!(msg.contains(&sha(b"other bytes")), "{msg}");
        assert!(msg.contains("`6.1`"), "{msg}");
        assert!(
            msg.contains("rejected/linux-image-6.1.0-1-cloud-amd64_6.1.1-1_amd64.deb"),
            "{msg}"
        );
        assert!(!cache.deb_path(&pin).exists());
    }

    #[test]
    fn cache_root_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            cache_root_from(env(&[
                ("KLOOP_CACHE_DIR", "/k"),
                ("XDG_CACHE_HOME", "/x"),
                ("HOME", "/h")
            ]))
            .unwrap(),
            Path::new("/k")
        );
        assert_eq!(
            cache_root_from(env(&[
                ("KLOOP_CACHE_DIR", ""),
                ("XDG_CACHE_HOME", "/x"),
                ("HOME", "/h")
            ]))
            .unwrap(),
            Path::new("/x/kloop")
        );
        assert_eq!(
            cache_root_from(env(&[("HOME", "/h")])).unwrap(),
            Path::new("/h/.cache/kloop")
        );
        assert!(matches!(
            cache_root_from(env(&[])),
            Err(KernelError::NoCacheDir)
        ));
    }
}
