//! Every kernel build the mirror serves, and the bisection catalog.
//!
//! `list_available` asks each Debian suite (the mirror comes from the
//! host's apt sources or `--mirror`, as for pins) which packages of a
//! flavour it serves, through the same private, signature-checked apt
//! state pins are made with, and orders them by Debian version (upstream
//! version first, then the Debian revision). The listing is cached for an
//! hour in `<cache>/available.json`.
//!
//! The bisection catalog, `kernels/bisect.lock`, holds builds pinned on
//! demand (sha256 of the package and of the image, as for pins) without
//! joining the default matrix: one reviewable file instead of a hundred
//! loose pins.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::Arch;

use crate::apt::{control_field, AptState, Trust};
use crate::cache::{FetchOptions, KernelCache};
use crate::error::KernelError;
use crate::pin::{KernelPin, Needs};
use crate::settings::DEFAULT_KEYRING;
use crate::update::{flavour_of, PinSpec};
use crate::version::compare_debian_versions;

/// The Debian suites kloop asks, oldest first.
pub const DEBIAN_SUITES: &[&str] = &[
    "bullseye",
    "bullseye-security",
    "bullseye-backports",
    "bookworm",
    "bookworm-security",
    "bookworm-backports",
    "trixie",
    "trixie-security",
    "trixie-backports",
    "forky",
    "sid",
    "experimental",
];

/// How long a listing is reused without asking the mirror again.
const LISTING_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// One build a suite serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AvailableBuild {
    /// The Debian version: what `bisect --old/--new` and the bisection
    /// catalog name a build by.
    pub version: String,
    pub package: String,
    pub suite: String,
    /// `uname -r` (`6.12.43+deb13-cloud-amd64`).
    pub release: String,
    /// `major.minor`.
    pub series: String,
    pub deb_sha256: Option<String>,
}

impl AvailableBuild {
    /// The architecture it runs on, from its release's flavour
    /// (`…-cloud-arm64`).
    pub fn arch(&self) -> Arch {
        Arch::ALL
            .into_iter()
            .find(|a| self.release.ends_with(a.debian()))
            .unwrap_or(Arch::X86_64)
    }

    /// Its id in the bisection lock: the Debian version, with the
    /// architecture's prefix (`arm64/6.12.43-1`) where it is not x86-64's,
    /// as one version is built for every architecture.
    pub fn pin_id(&self) -> String {
        format!("{}{}", self.arch().id_prefix(), self.version)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Listing {
    mirror: String,
    flavour: String,
    suites: Vec<String>,
    written_unix: u64,
    builds: Vec<AvailableBuild>,
    notes: Vec<String>,
}

/// What one suite's `Release` file said: the mirror serves the suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteRelease {
    /// The suite asked for (`sid`, `bookworm-security`, …).
    pub suite: String,
    /// Its `Codename:` field.
    pub codename: Option<String>,
    /// Its `Date:` field: how fresh the mirror is.
    pub date: Option<String>,
    /// How long the file took to arrive.
    pub took: Duration,
}

impl SuiteRelease {
    fn parse(suite: &str, text: &str, took: Duration) -> SuiteRelease {
        // The hash lists are continuation lines (they start with a space),
        // so a file name in them never reads as a field.
        SuiteRelease {
            suite: suite.to_string(),
            codename: control_field(text, "Codename"),
            date: control_field(text, "Date"),
            took,
        }
    }
}

/// Whether `mirror` serves each of `suites`: every suite's `Release` file,
/// fetched at once (one apt downloader each, in a private apt state), each
/// given at most `deadline`. No index is downloaded and nothing is
/// trusted: this answers "does the mirror answer, and with what", which
/// `cargo xtask doctor` reports.
pub fn probe_suites(
    cache: &KernelCache,
    mirror: &str,
    suites: &[&str],
    deadline: Duration,
) -> Vec<(String, Result<SuiteRelease, KernelError>)> {
    std::thread::scope(|s| {
        let probes: Vec<_> = suites
            .iter()
            .map(|suite| {
                s.spawn(move || {
                    let started = Instant::now();
                    let apt =
                        AptState::new(&cache.tmp_dir(), mirror, suite, Path::new(DEFAULT_KEYRING))?;
                    let text = apt.fetch_release(deadline)?;
                    Ok(SuiteRelease::parse(suite, &text, started.elapsed()))
                })
            })
            .collect();
        suites
            .iter()
            .zip(probes)
            .map(|(suite, p)| {
                let result = p.join().unwrap_or_else(|_| {
                    Err(KernelError::IndexUnavailable {
                        suite: suite.to_string(),
                        mirror: mirror.to_string(),
                        detail: "the probe thread panicked".into(),
                    })
                });
                (suite.to_string(), result)
            })
            .collect()
    })
}

/// `major.minor` of a release (`6.12.43+deb13-cloud-amd64` → `6.12`).
pub fn series_of(release: &str) -> String {
    release
        .split(['.', '-', '+', '~'])
        .take(2)
        .collect::<Vec<_>>()
        .join(".")
}

/// Every `cloud-amd64` build the Debian suites serve (what bisection and
/// `kernels available` walk), and the suites that could not be asked.
pub fn list_cloud_builds(
    cache: &KernelCache,
    fetch: &FetchOptions,
    refresh: bool,
) -> Result<(Vec<AvailableBuild>, Vec<String>), KernelError> {
    list_cloud_builds_for(cache, fetch, refresh, Arch::X86_64)
}

/// [`list_cloud_builds`] of another architecture (`cloud-arm64`).
pub fn list_cloud_builds_for(
    cache: &KernelCache,
    fetch: &FetchOptions,
    refresh: bool,
    arch: Arch,
) -> Result<(Vec<AvailableBuild>, Vec<String>), KernelError> {
    let suites: Vec<String> = DEBIAN_SUITES.iter().map(|s| s.to_string()).collect();
    list_available(cache, &suites, arch.cloud_flavour(), fetch, refresh, arch)
}

/// Every build of `flavour` the suites serve, oldest first, and one note
/// per suite that could not be asked (gone from the mirror, say).
/// `refresh`: ask the mirror even if the cached listing is fresh.
pub fn list_available(
    cache: &KernelCache,
    suites: &[String],
    flavour: &str,
    fetch: &FetchOptions,
    refresh: bool,
    arch: Arch,
) -> Result<(Vec<AvailableBuild>, Vec<String>), KernelError> {
    let mirror = fetch.resolve_mirror()?;
    // One listing per architecture (x86-64's kept its name).
    let path = match arch {
        Arch::X86_64 => cache.root().join("available.json"),
        other => cache.root().join(format!("available-{other}.json")),
    };
    if !refresh {
        if let Some(l) = read_listing(&path) {
            let fresh = now_unix().saturating_sub(l.written_unix) < LISTING_TTL.as_secs();
            if (fresh || fetch.offline)
                && l.mirror == mirror
                && l.flavour == flavour
                && l.suites == suites
            {
                return Ok((l.builds, l.notes));
            }
        }
    }
    if fetch.offline {
        return Err(KernelError::NotCached {
            id: "the list of available builds".into(),
            path,
        });
    }
    let mut builds: Vec<AvailableBuild> = Vec::new();
    let mut notes = Vec::new();
    for suite in suites {
        let apt = AptState::new(&cache.tmp_dir(), &mirror, suite, &fetch.resolve_keyring())?
            .for_arch(arch);
        if let Err(e) = apt.update(Trust::RequireSigned) {
            notes.push(format!("suite {suite}: not asked: {e}"));
            continue;
        }
        let names = kernel_packages(&apt, flavour)?;
        for r in apt.show(&names)? {
            let release = r
                .package
                .strip_prefix("linux-image-")
                .or_else(|| r.package.strip_prefix("linux-binary-"))
                .unwrap_or("")
                .to_string();
            // Meta-packages and signed-template stubs are not kernels.
            if r.installed_size < 2048 {
                continue;
            }
            if builds.iter().any(|b| b.version == r.version) {
                continue;
            }
            builds.push(AvailableBuild {
                series: series_of(&release),
                version: r.version,
                package: r.package,
                suite: suite.clone(),
                release,
                deb_sha256: r.sha256,
            });
        }
    }
    builds.sort_by(|a, b| compare_debian_versions(&a.version, &b.version));
    let listing = Listing {
        mirror,
        flavour: flavour.to_string(),
        suites: suites.to_vec(),
        written_unix: now_unix(),
        builds,
        notes,
    };
    write_listing(&path, &listing);
    Ok((listing.builds, listing.notes))
}

/// The suite's kernel image packages of `flavour` (`linux-image-<release>`
/// or, for the signed-template era, `linux-binary-<release>`); versioned
/// releases only, not the `linux-image-cloud-amd64` meta-package.
fn kernel_packages(apt: &AptState, flavour: &str) -> Result<Vec<String>, KernelError> {
    let mut names = Vec::new();
    for prefix in ["linux-image-", "linux-binary-"] {
        for name in apt.pkgnames(prefix)? {
            let release = name
                .strip_prefix("linux-image-")
                .or_else(|| name.strip_prefix("linux-binary-"))
                .unwrap_or("");
            if flavour_of(release) == Some(flavour)
                && release.starts_with(|c: char| c.is_ascii_digit())
            {
                names.push(name);
            }
        }
    }
    Ok(names)
}

/// Caches the listing; best effort, as a listing that cannot be written is
/// only asked again next time.
fn write_listing(path: &Path, listing: &Listing) {
    if let Ok(text) = serde_json::to_string_pretty(listing) {
        let tmp = path.with_extension("json.partial");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

fn read_listing(path: &Path) -> Option<Listing> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `kernels/bisect.lock`: builds pinned for bisection, by Debian version.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BisectLock {
    #[serde(default, rename = "build")]
    pub builds: Vec<KernelPin>,
    #[serde(skip)]
    path: PathBuf,
}

impl BisectLock {
    pub const FILE: &'static str = "bisect.lock";

    /// The lock in `catalog_dir` (empty when there is none yet).
    pub fn load(catalog_dir: &Path) -> Result<BisectLock, KernelError> {
        let path = catalog_dir.join(Self::FILE);
        let mut lock: BisectLock = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).map_err(|e| KernelError::PinParse {
                file: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BisectLock::default(),
            Err(source) => {
                return Err(KernelError::CatalogRead(PathIo::at(
                    "reading the bisect lock",
                    path,
                    source,
                )))
            }
        };
        for b in &lock.builds {
            b.validate(&path)?;
        }
        lock.path = path;
        Ok(lock)
    }

    /// The locked build `id` names ([`AvailableBuild::pin_id`]).
    pub fn get(&self, id: &str) -> Option<&KernelPin> {
        self.builds.iter().find(|b| b.id == id)
    }

    /// The build `b` as a pin: from the lock, or pinned now (downloaded,
    /// checked against the signed index, image extracted and hashed) and
    /// added to the lock. `needs` names the companion packages the caller
    /// cannot do without (a scenario with `modules` needs the modules
    /// package); one it can do without that the mirror does not serve is
    /// named in the pin's `unserved`. A locked build that lacks one the
    /// caller needs is pinned again (the mirror may serve it now) or
    /// refused.
    pub fn ensure(
        &mut self,
        cache: &KernelCache,
        catalog_dir: &Path,
        b: &AvailableBuild,
        fetch: &FetchOptions,
        needs: Needs,
    ) -> Result<KernelPin, KernelError> {
        if let Some(p) = self.get(&b.pin_id()) {
            if p.lacks(needs).is_empty() {
                return Ok(p.clone());
            }
        }
        let spec = PinSpec {
            id: b.pin_id(),
            series: b.series.clone(),
            suite: b.suite.clone(),
            flavour: flavour_of(&b.release).unwrap_or_default().to_string(),
            config: None,
            version: Some(b.version.clone()),
            needs,
        };
        let pin = cache.resolve_pin(catalog_dir, &spec, fetch)?;
        self.builds.retain(|p| p.id != pin.id);
        self.builds.push(pin.clone());
        self.builds
            .sort_by(|a, b| compare_debian_versions(&a.version, &b.version));
        self.save()?;
        Ok(pin)
    }

    fn save(&self) -> Result<(), KernelError> {
        let body = toml::to_string(self).map_err(|e| KernelError::PinParse {
            file: self.path.clone(),
            message: e.to_string(),
        })?;
        let text = format!(
            "# Kernel builds pinned for bisection (`cargo xtask bisect`, `cargo xtask kernels\n\
             # pin-build`): the same hashes as kernels/<id>.toml pins, by Debian version.\n\
             # They are not in the default vm-test matrix. `unserved` names a companion package\n\
             # (modules, .config) the mirror did not serve when a build was pinned for a caller\n\
             # that needs neither (`cargo xtask audit`). Written by kloop; review the diff.\n\n{body}"
        );
        let tmp = self.path.with_extension("lock.partial");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .at("writing the bisect lock", &self.path)
            .map_err(KernelError::PinWrite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_fields_ignore_the_hash_lists() {
        let text = "Origin: Debian\nSuite: oldstable\nMD5Sum:\n Codename: 12 main/x\n\
                    Codename: bookworm\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n";
        let r = SuiteRelease::parse("bookworm", text, Duration::from_millis(250));
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert_eq!(r.date.as_deref(), Some("Sat, 11 Jul 2026 10:16:37 UTC"));
        assert_eq!(r.suite, "bookworm");
    }

    #[test]
    fn series_comes_from_the_release() {
        assert_eq!(series_of("6.12.43+deb13-cloud-amd64"), "6.12");
        assert_eq!(series_of("6.1.0-50-cloud-amd64"), "6.1");
        assert_eq!(series_of("7.3-cloud-amd64"), "7.3");
        assert_eq!(series_of("7.3~rc7-cloud-amd64"), "7.3");
    }

    /// One Debian version is built for every architecture: the lock tells
    /// them apart by the id's prefix, taken from the release's flavour.
    #[test]
    fn a_build_names_its_architecture_in_its_lock_id() {
        let build = |release: &str| AvailableBuild {
            version: "6.12.43-1".into(),
            package: format!("linux-image-{release}"),
            suite: "trixie".into(),
            release: release.into(),
            series: "6.12".into(),
            deb_sha256: None,
        };
        let x86 = build("6.12.43+deb13-cloud-amd64");
        let arm = build("6.12.43+deb13-cloud-arm64");
        assert_eq!(
            (x86.arch(), x86.pin_id()),
            (Arch::X86_64, "6.12.43-1".into())
        );
        assert_eq!(
            (arm.arch(), arm.pin_id()),
            (Arch::Arm64, "arm64/6.12.43-1".into())
        );
    }

    /// A locked build pinned without its modules serves a caller that
    /// needs none as it is; one that needs them gets it pinned again (here
    /// offline, so refused) and never the build without them.
    #[test]
    fn a_locked_build_without_modules_serves_only_who_needs_none() {
        let dir = tempfile::tempdir().unwrap();
        let h = "ab".repeat(32);
        let lock = format!(
            "[[build]]\nid = \"7.1.13-1\"\nseries = \"7.1\"\nsuite = \"trixie-backports\"\n\
             package = \"linux-binary-7.1.13+deb13-cloud-amd64\"\nversion = \"7.1.13-1\"\n\
             deb_sha256 = \"{h}\"\nimage_path = \"usr/lib/modules/7.1.13+deb13-cloud-amd64/vmlinuz\"\n\
             image_sha256 = \"{h}\"\nrelease = \"7.1.13+deb13-cloud-amd64\"\n\
             modules_package = \"linux-modules-7.1.13+deb13-cloud-amd64\"\n\
             config_package = \"linux-base-7.1.13+deb13-cloud-amd64\"\n\
             unserved = [\"linux-modules-7.1.13+deb13-cloud-amd64\", \"linux-base-7.1.13+deb13-cloud-amd64\"]\n"
        );
        std::fs::write(dir.path().join(BisectLock::FILE), lock).unwrap();
        let mut lock = BisectLock::load(dir.path()).unwrap();
        let b = AvailableBuild {
            version: "7.1.13-1".into(),
            package: "linux-binary-7.1.13+deb13-cloud-amd64".into(),
            suite: "trixie-backports".into(),
            release: "7.1.13+deb13-cloud-amd64".into(),
            series: "7.1".into(),
            deb_sha256: None,
        };
        let cache = KernelCache::at(dir.path().join("cache"));
        let offline = FetchOptions {
            offline: true,
            mirror: Some("http://kloop-test.invalid/debian".into()),
            keyring: None,
        };
        let pin = lock
            .ensure(&cache, dir.path(), &b, &offline, Needs::IMAGE_ONLY)
            .unwrap();
        assert_eq!(pin.unserved.len(), 2);
        let err = lock
            .ensure(&cache, dir.path(), &b, &offline, Needs::ALL)
            .unwrap_err();
        assert!(matches!(err, KernelError::NotCached { .. }), "{err:?}");
        let err = lock
            .ensure(
                &cache,
                dir.path(),
                &b,
                &offline,
                Needs {
                    modules: true,
                    config: false,
                },
            )
            .unwrap_err();
        assert!(matches!(err, KernelError::NotCached { .. }), "{err:?}");
    }
}
