//! `KernelPin` and the catalog of pins in `kernels/*.toml`.

use std::cmp::Ordering;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::Arch;

use crate::error::KernelError;

/// One pinned Debian kernel build: which package, which exact bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelPin {
    /// Catalog id, also the file stem of `kernels/<id>.toml` (e.g. `6.1`).
    pub id: String,
    /// Upstream series, `major.minor` (e.g. `6.12`); orders the catalog.
    pub series: String,
    /// Debian suite the package comes from (`bookworm`, `sid`, `bullseye-security`, …).
    pub suite: String,
    /// Debian binary package whose data holds the image.
    pub package: String,
    /// Exact Debian version of `package`.
    pub version: String,
    /// sha256 of the `.deb` file.
    pub deb_sha256: String,
    /// Path of the bzImage inside the package's data tarball (no leading `./`).
    pub image_path: String,
    /// sha256 of the extracted bzImage.
    pub image_sha256: String,
    /// What `uname -r` reports when this kernel runs.
    pub release: String,
    /// Config fragment for source builds, relative to the catalog directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
    /// From 7.x Debian ships the modules of `release` in a package of their
    /// own (`linux-modules-<release>`, same version as `package`); absent
    /// when `package` carries them itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules_package: Option<String>,
    /// sha256 of the `modules_package` `.deb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules_deb_sha256: Option<String>,
    /// From 7.x the kernel's `.config` is in another package too
    /// (`linux-base-<release>`, as `usr/lib/modules/<release>/config`);
    /// absent when `package` carries `boot/config-<release>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_package: Option<String>,
    /// sha256 of the `config_package` `.deb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_deb_sha256: Option<String>,
    /// Companion packages (`modules_package`, `config_package`) the mirror
    /// did not serve when this build was pinned for a caller that needs
    /// neither (the audit's plain init): named, without a hash. What needs
    /// one of them on this pin fails with
    /// [`KernelError::CompanionUnserved`]; it is never looked for in the
    /// image package instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unserved: Vec<String>,
}

/// Where a pin's modules or `.config` come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageOf<'a> {
    /// The image package holds them (up to 6.x).
    Image,
    /// A package of their own, pinned with its hash (7.x).
    Companion { package: &'a str, sha256: &'a str },
    /// A package of their own that the mirror did not serve when the
    /// build was pinned: there are none to be had.
    Unserved { package: &'a str },
}

/// Which of a split build's companion packages a caller cannot do
/// without when it pins the build (7.x: `linux-modules-<release>`,
/// `linux-base-<release>`). One not needed is still downloaded and
/// pinned when the mirror serves it; when it does not, the pin names it
/// in [`KernelPin::unserved`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// The modules package (a scenario with `modules`).
    pub modules: bool,
    /// The `.config` package.
    pub config: bool,
}

impl Needs {
    /// Everything: a pin of the catalog, `kernels pin-build`.
    pub const ALL: Needs = Needs {
        modules: true,
        config: true,
    };
    /// The image alone: a plain init with no modules and no config
    /// preflight (the audit).
    pub const IMAGE_ONLY: Needs = Needs {
        modules: false,
        config: false,
    };
}

impl Default for Needs {
    fn default() -> Needs {
        Needs::ALL
    }
}

impl KernelPin {
    /// Where the modules come from.
    pub fn modules_of(&self) -> PackageOf<'_> {
        self.package_of(&self.modules_package, &self.modules_deb_sha256)
    }

    /// Where the `.config` comes from.
    pub fn config_of(&self) -> PackageOf<'_> {
        self.package_of(&self.config_package, &self.config_deb_sha256)
    }

    fn package_of<'a>(
        &'a self,
        package: &'a Option<String>,
        sha256: &'a Option<String>,
    ) -> PackageOf<'a> {
        match (package, sha256) {
            (Some(package), Some(sha256)) => PackageOf::Companion { package, sha256 },
            (Some(package), None) => PackageOf::Unserved { package },
            (None, _) => PackageOf::Image,
        }
    }

    /// The companion packages `needs` asks for that this pin lacks (the
    /// mirror did not serve them when it was pinned).
    pub fn lacks(&self, needs: Needs) -> Vec<&str> {
        [
            (needs.modules, self.modules_of()),
            (needs.config, self.config_of()),
        ]
        .into_iter()
        .filter_map(|(needed, of)| match of {
            PackageOf::Unserved { package } if needed => Some(package),
            _ => None,
        })
        .collect()
    }

    /// The error of something that needs `package`, which this pin names
    /// in `unserved`.
    pub fn unserved_error(&self, package: &str, what: &'static str) -> KernelError {
        KernelError::CompanionUnserved {
            id: self.id.clone(),
            package: package.to_string(),
            version: self.version.clone(),
            what,
        }
    }

    /// Numeric sort key of [`KernelPin::series`] (`6.12` → `[6, 12]`).
    pub fn series_key(&self) -> Vec<u64> {
        series_key(&self.series).unwrap_or_default()
    }

    /// Checks the fields a fetch relies on; `file` is only used in messages.
    pub fn validate(&self, file: &Path) -> Result<(), KernelError> {
        let invalid = |message: String| KernelError::PinInvalid {
            file: file.to_path_buf(),
            message,
        };
        for (name, value) in [
            ("id", &self.id),
            ("suite", &self.suite),
            ("package", &self.package),
            ("version", &self.version),
            ("release", &self.release),
        ] {
            if value.trim().is_empty() || value.chars().any(char::is_whitespace) {
                return Err(invalid(format!(
                    "`{name}` must be a non-empty word, got {value:?}"
                )));
            }
        }
        if series_key(&self.series).is_none() {
            return Err(invalid(format!(
                "`series` must look like `6.1`, got {:?}",
                self.series
            )));
        }
        for (name, value) in [
            ("deb_sha256", &self.deb_sha256),
            ("image_sha256", &self.image_sha256),
        ] {
            if !is_sha256_hex(value) {
                return Err(invalid(format!(
                    "`{name}` must be 64 lowercase hex digits, got {value:?}"
                )));
            }
        }
        if let Some(message) = self.companions_problem() {
            return Err(invalid(message));
        }
        if !is_contained_relative(Path::new(&self.image_path)) {
            return Err(invalid(format!(
                "`image_path` must be a relative path inside the package, got {:?}",
                self.image_path
            )));
        }
        let (arch, bare_id) = Arch::of_id(&self.id);
        if let Some(stem) = file.file_stem().and_then(|s| s.to_str()) {
            if file.extension().is_some_and(|e| e == "toml") && stem != bare_id {
                return Err(invalid(format!(
                    "`id` is {:?} but the file is named {stem}.toml; they must match",
                    self.id
                )));
            }
        }
        // An arm64 pin lives in `kernels/arm64/` and its id says so; the
        // package must be that architecture's, or the guest would boot a
        // kernel the agent was not built for.
        let in_arm64_dir = file
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|d| d == "arm64");
        if file.extension().is_some_and(|e| e == "toml") && in_arm64_dir != (arch == Arch::Arm64) {
            return Err(invalid(format!(
                "`id` {:?} and the file's directory disagree on the architecture: arm64 pins \
                 are `kernels/arm64/<series>.toml` with id `arm64/<series>`",
                self.id
            )));
        }
        if !self.release.ends_with(arch.debian()) {
            return Err(invalid(format!(
                "`release` {:?} is not an {} build (Debian's {} flavours end in `{}`)",
                self.release,
                arch,
                arch,
                arch.debian()
            )));
        }
        Ok(())
    }

    /// What is wrong with the companion packages (`modules_package`,
    /// `config_package`), their hashes and `unserved`, if anything.
    fn companions_problem(&self) -> Option<String> {
        for (package_field, sha_field, package, sha) in [
            (
                "modules_package",
                "modules_deb_sha256",
                &self.modules_package,
                &self.modules_deb_sha256,
            ),
            (
                "config_package",
                "config_deb_sha256",
                &self.config_package,
                &self.config_deb_sha256,
            ),
        ] {
            match (package, sha) {
                (None, None) => {}
                (Some(package), None) if self.unserved.contains(package) => {}
                (Some(package), Some(sha)) => {
                    if package.trim().is_empty() || package.chars().any(char::is_whitespace) {
                        return Some(format!(
                            "`{package_field}` must be a non-empty word, got {package:?}"
                        ));
                    }
                    if !is_sha256_hex(sha) {
                        return Some(format!(
                            "`{sha_field}` must be 64 lowercase hex digits, got {sha:?}"
                        ));
                    }
                }
                _ => {
                    return Some(format!(
                        "`{package_field}` and `{sha_field}` go together: give both or neither \
                         (or name the package in `unserved`)"
                    ))
                }
            }
        }
        for u in &self.unserved {
            let names_it = [&self.modules_package, &self.config_package]
                .iter()
                .any(|p| p.as_deref() == Some(u.as_str()));
            if !names_it || self.lacks(Needs::ALL).iter().all(|l| l != u) {
                return Some(format!(
                    "`unserved` names {u:?}, which is not a `modules_package` or \
                     `config_package` of this pin without its hash"
                ));
            }
        }
        None
    }

    /// The architecture this build runs on (from its id: `arm64/6.12`).
    pub fn arch(&self) -> Arch {
        Arch::of_id(&self.id).0
    }

    /// The pin as TOML, with the header comment saying how it was made.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a KernelPin always serialises");
        format!(
            "# Kernel pin `{id}`. Pinned by `cargo xtask kernels update {id}`; re-run it to \
             move the pin,\n# do not edit the hashes by hand.\n{body}",
            id = self.id
        )
    }

    /// Writes `<dir>/<id>.toml` atomically (temp file + rename).
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf, KernelError> {
        let path = dir.join(format!("{}.toml", self.id));
        self.validate(&path)?;
        let dir = path.parent().expect("a pin file has a directory");
        if !dir.is_dir() {
            std::fs::create_dir_all(dir)
                .at("creating the directory of the pin file", &path)
                .map_err(KernelError::PinWrite)?;
        }
        let werr =
            |source| KernelError::PinWrite(PathIo::at("writing the pin file", &path, source));
        let mut tmp = tempfile::Builder::new()
            .prefix(".pin-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(werr)?;
        tmp.write_all(self.to_toml().as_bytes()).map_err(werr)?;
        tmp.as_file().sync_all().map_err(werr)?;
        tmp.persist(&path).map_err(|e| werr(e.error))?;
        Ok(path)
    }
}

/// The pins of a catalog directory, sorted by series (5.10 < 6.1 < 6.12 < 7.2).
#[derive(Debug, Clone)]
pub struct Catalog {
    dir: PathBuf,
    pins: Vec<KernelPin>,
}

impl Catalog {
    /// Reads every `*.toml` in `dir` that is a pin. Files that are TOML but not
    /// pins (e.g. `known-issues.toml`) are skipped; a file that looks like a
    /// pin (has `package`, `deb_sha256`, `image_sha256` or `image_path`) but
    /// fails to parse or validate is an error naming it.
    pub fn load(dir: &Path) -> Result<Catalog, KernelError> {
        Self::load_for(dir, &[Arch::X86_64])
    }

    /// Every architecture's pins (the ledger, the expected skips: what a pin
    /// id may name).
    pub fn load_all(dir: &Path) -> Result<Catalog, KernelError> {
        Self::load_for(dir, &Arch::ALL)
    }

    /// The pins of `arches`: x86-64's in `dir`, arm64's in `dir/arm64/`
    /// (ids `arm64/<series>`), each architecture's oldest series first.
    pub fn load_for(dir: &Path, arches: &[Arch]) -> Result<Catalog, KernelError> {
        let mut pins = Vec::new();
        for &arch in arches {
            let sub = match arch {
                Arch::X86_64 => dir.to_path_buf(),
                Arch::Arm64 => dir.join("arm64"),
            };
            // Another architecture's directory is optional when every one
            // is asked for (a checkout that pins x86-64 only).
            if arch != Arch::X86_64 && arches.len() > 1 && !sub.is_dir() {
                continue;
            }
            let mut these = Self::load_dir(&sub)?;
            pins.append(&mut these);
        }
        Ok(Catalog {
            dir: dir.to_path_buf(),
            pins,
        })
    }

    /// The pins of one directory, sorted; none is an error.
    fn load_dir(dir: &Path) -> Result<Vec<KernelPin>, KernelError> {
        let read_err = |what: &'static str, path: &Path, source| {
            KernelError::CatalogRead(PathIo::at(what, path, source))
        };
        let catalog = "reading the kernel catalog";
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| read_err(catalog, dir, e))? {
            let path = entry.map_err(|e| read_err(catalog, dir, e))?.path();
            if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();

        let mut pins = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| read_err("reading the kernel pin", &file, e))?;
            if let Some(pin) = parse_pin_file(&file, &text)? {
                pins.push(pin);
            }
        }
        if pins.is_empty() {
            return Err(KernelError::EmptyCatalog {
                dir: dir.to_path_buf(),
            });
        }
        pins.sort_by(compare_pins);
        Ok(pins)
    }

    /// The directory the catalog was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// All pins, oldest series first.
    pub fn pins(&self) -> &[KernelPin] {
        &self.pins
    }

    /// The pin with this id; the error lists the valid ids.
    pub fn get(&self, id: &str) -> Result<&KernelPin, KernelError> {
        self.pins
            .iter()
            .find(|p| p.id == id)
            .ok_or_else(|| KernelError::UnknownPin {
                id: id.to_string(),
                valid: self.ids().join(", "),
            })
    }

    /// The ids, in catalog order.
    pub fn ids(&self) -> Vec<&str> {
        self.pins.iter().map(|p| p.id.as_str()).collect()
    }
}

const PIN_MARKERS: [&str; 4] = ["package", "deb_sha256", "image_sha256", "image_path"];

/// `Ok(None)` for TOML files that are not pins.
pub(crate) fn parse_pin_file(file: &Path, text: &str) -> Result<Option<KernelPin>, KernelError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| KernelError::PinParse {
        file: file.to_path_buf(),
        message: e.message().to_string(),
    })?;
    if !PIN_MARKERS.iter().any(|k| table.contains_key(*k)) {
        return Ok(None);
    }
    let pin: KernelPin = toml::from_str(text).map_err(|e| KernelError::PinParse {
        file: file.to_path_buf(),
        message: e.message().to_string(),
    })?;
    pin.validate(file)?;
    Ok(Some(pin))
}

fn compare_pins(a: &KernelPin, b: &KernelPin) -> Ordering {
    a.series_key()
        .cmp(&b.series_key())
        .then_with(|| a.id.cmp(&b.id))
}

pub(crate) fn series_key(series: &str) -> Option<Vec<u64>> {
    let key: Option<Vec<u64>> = series
        .split('.')
        .map(|p| {
            (!p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        })
        .collect();
    key.filter(|k| k.len() >= 2)
}

pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// True for a non-empty relative path with no `..`, root or prefix components.
pub(crate) fn is_contained_relative(path: &Path) -> bool {
    let mut normal = 0;
    for c in path.components() {
        match c {
            Component::Normal(_) => normal += 1,
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    normal > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin_toml(id: &str, series: &str) -> String {
        format!(
            r#"# comment
id = "{id}"
series = "{series}"
suite = "bookworm"
package = "linux-image-{series}.0-1-cloud-amd64"
version = "{series}.1-1"
deb_sha256 = "{h}"
image_path = "boot/vmlinuz-{series}.0-1-cloud-amd64"
image_sha256 = "{h}"
release = "{series}.0-1-cloud-amd64"
"#,
            h = "ab".repeat(32)
        )
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// arm64 pins live in `arm64/` with ids `arm64/<series>` and arm64
    /// releases; `load` stays x86-64's, `load_all` has both, and a pin in
    /// the wrong place or of the wrong architecture is refused.
    #[test]
    fn arm64_pins_load_from_their_directory_with_their_id() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "6.12.toml", &pin_toml("6.12", "6.12"));
        std::fs::create_dir(dir.path().join("arm64")).unwrap();
        let arm = pin_toml("arm64/6.12", "6.12").replace("amd64", "arm64");
        write(&dir.path().join("arm64"), "6.12.toml", &arm);
        assert_eq!(Catalog::load(dir.path()).unwrap().ids(), ["6.12"]);
        let all = Catalog::load_all(dir.path()).unwrap();
        assert_eq!(all.ids(), ["6.12", "arm64/6.12"]);
        assert_eq!(all.get("arm64/6.12").unwrap().arch(), Arch::Arm64);
        // An x86-64 build under an arm64 id, or an arm64 pin at the top.
        write(
            &dir.path().join("arm64"),
            "6.12.toml",
            &pin_toml("arm64/6.12", "6.12"),
        );
        let err = Catalog::load_all(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is not an arm64 build"), "{err}");
        write(&dir.path().join("arm64"), "6.12.toml", &arm);
        write(dir.path(), "7.2.toml", &arm.replace("6.12", "7.2"));
        let err = Catalog::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("disagree on the architecture"), "{err}");
    }

    #[test]
    fn loads_sorted_by_series_and_skips_non_pins() {
        let dir = tempfile::tempdir().unwrap();
        for (id, series) in [
            ("7.2", "7.2"),
            ("6.12", "6.12"),
            ("5.10", "5.10"),
            ("6.1", "6.1"),
        ] {
            write(dir.path(), &format!("{id}.toml"), &pin_toml(id, series));
        }
        write(
            dir.path(),
            "known-issues.toml",
            "[[issue]]\nkernel = \"6.1\"\nnote = \"x\"\n",
        );
        write(dir.path(), "README.md", "not toml at all = = =");
        let catalog = Catalog::load(dir.path()).unwrap();
        assert_eq!(catalog.ids(), ["5.10", "6.1", "6.12", "7.2"]);
        assert_eq!(catalog.get("6.12").unwrap().series, "6.12");
        assert_eq!(catalog.pins()[0].release, "5.10.0-1-cloud-amd64");
    }

    #[test]
    fn unknown_id_lists_valid_ids() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "6.1.toml", &pin_toml("6.1", "6.1"));
        write(dir.path(), "5.10.toml", &pin_toml("5.10", "5.10"));
        let catalog = Catalog::load(dir.path()).unwrap();
        let err = catalog.get("4.19").unwrap_err();
        assert!(matches!(err, KernelError::UnknownPin { .. }));
        assert_eq!(
            err.to_string(),
            "no kernel pin with id `4.19`; valid ids: 5.10, 6.1"
        );
    }

    #[test]
    fn broken_pin_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "6.1.toml", &pin_toml("6.1", "6.1"));
        // Looks like a pin (has `package`) but misses `deb_sha256`.
        write(
            dir.path(),
            "6.12.toml",
            "id = \"6.12\"\nseries = \"6.12\"\npackage = \"linux-image-x\"\n",
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        let KernelError::PinParse { file, message } = &err else {
            panic!("expected PinParse, got {err:?}");
        };
        assert!(file.ends_with("6.12.toml"), "{file:?}");
        assert!(message.contains("missing field"), "{message}");
        assert!(err.to_string().contains("6.12.toml"));
    }

    #[test]
    fn unknown_field_and_bad_hash_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "6.1.toml",
            &format!("{}imgae_path = \"typo\"\n", pin_toml("6.1", "6.1")),
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("imgae_path"), "{err}");

        write(
            dir.path(),
            "6.1.toml",
            &pin_toml("6.1", "6.1").replace(&"ab".repeat(32), &"AB".repeat(32)),
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(
            matches!(&err, KernelError::PinInvalid { message, .. } if message.contains("deb_sha256")),
            "{err}"
        );
    }

    #[test]
    fn modules_package_needs_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let with = |extra: &str| format!("{}{extra}", pin_toml("7.2", "7.2"));
        write(
            dir.path(),
            "7.2.toml",
            &with(&format!(
                "modules_package = \"linux-modules-x\"\nmodules_deb_sha256 = \"{}\"\n",
                "cd".repeat(32)
            )),
        );
        let catalog = Catalog::load(dir.path()).unwrap();
        let pin = catalog.get("7.2").unwrap();
        assert_eq!(pin.modules_package.as_deref(), Some("linux-modules-x"));
        let round = parse_pin_file(Path::new("7.2.toml"), &pin.to_toml())
            .unwrap()
            .unwrap();
        assert_eq!(&round, pin);

        write(
            dir.path(),
            "7.2.toml",
            &with("modules_package = \"linux-modules-x\"\n"),
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("go together"), "{err}");
    }

    /// A split build pinned for a caller that needs neither companion,
    /// which the mirror does not serve: named without a hash and listed in
    /// `unserved`, never taken as inside the image package.
    #[test]
    fn unserved_companions_are_named_not_taken_as_present() {
        let dir = tempfile::tempdir().unwrap();
        let with = |extra: &str| format!("{}{extra}", pin_toml("7.1", "7.1"));
        write(
            dir.path(),
            "7.1.toml",
            &with(&format!(
                "modules_package = \"linux-modules-x\"\nconfig_package = \"linux-base-x\"\n\
                 config_deb_sha256 = \"{}\"\nunserved = [\"linux-modules-x\"]\n",
                "ef".repeat(32)
            )),
        );
        let catalog = Catalog::load(dir.path()).unwrap();
        let pin = catalog.get("7.1").unwrap();
        assert_eq!(
            pin.modules_of(),
            PackageOf::Unserved {
                package: "linux-modules-x"
            }
        );
        assert!(matches!(
            pin.config_of(),
            PackageOf::Companion {
                package: "linux-base-x",
                ..
            }
        ));
        assert_eq!(pin.lacks(Needs::ALL), vec!["linux-modules-x"]);
        assert_eq!(
            pin.lacks(Needs {
                modules: false,
                config: true
            }),
            Vec::<&str>::new()
        );
        assert!(pin.lacks(Needs::IMAGE_ONLY).is_empty());
        let e = pin.unserved_error("linux-modules-x", "modules");
        assert!(e.is_unserved());
        assert!(
            e.to_string().contains("pinned without linux-modules-x="),
            "{e}"
        );
        let round = parse_pin_file(Path::new("7.1.toml"), &pin.to_toml())
            .unwrap()
            .unwrap();
        assert_eq!(&round, pin);

        // A package without its hash that `unserved` does not name, and an
        // `unserved` entry that is not a companion without a hash: refused.
        for bad in [
            "modules_package = \"linux-modules-x\"\nunserved = [\"linux-base-x\"]\n".to_string(),
            format!(
                "modules_package = \"linux-modules-x\"\nmodules_deb_sha256 = \"{}\"\n\
                 unserved = [\"linux-modules-x\"]\n",
                "cd".repeat(32)
            ),
        ] {
            write(dir.path(), "7.1.toml", &with(&bad));
            let err = Catalog::load(dir.path()).unwrap_err();
            assert!(
                matches!(err, KernelError::PinInvalid { .. }),
                "{bad}: {err}"
            );
        }
        // A 6.x pin (companions in the image package) lacks nothing.
        write(dir.path(), "7.1.toml", &with(""));
        let pin = Catalog::load(dir.path())
            .unwrap()
            .get("7.1")
            .unwrap()
            .clone();
        assert_eq!(
            (pin.modules_of(), pin.config_of()),
            (PackageOf::Image, PackageOf::Image)
        );
        assert!(pin.lacks(Needs::ALL).is_empty());
    }

    #[test]
    fn config_package_needs_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let with = |extra: &str| format!("{}{extra}", pin_toml("7.3", "7.3"));
        write(
            dir.path(),
            "7.3.toml",
            &with(&format!(
                "config_package = \"linux-base-x\"\nconfig_deb_sha256 = \"{}\"\n",
                "ef".repeat(32)
            )),
        );
        let catalog = Catalog::load(dir.path()).unwrap();
        let pin = catalog.get("7.3").unwrap();
        assert_eq!(pin.config_package.as_deref(), Some("linux-base-x"));
        let round = parse_pin_file(Path::new("7.3.toml"), &pin.to_toml())
            .unwrap()
            .unwrap();
        assert_eq!(&round, pin);

        write(
            dir.path(),
            "7.3.toml",
            &with(&format!("config_deb_sha256 = \"{}\"\n", "ef".repeat(32))),
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("`config_package` and `config_deb_sha256` go together"),
            "{err}"
        );
    }

    #[test]
    fn id_must_match_file_name_and_image_path_must_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "6.2.toml", &pin_toml("6.1", "6.1"));
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("6.2.toml"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "6.1.toml",
            &pin_toml("6.1", "6.1").replace("boot/vmlinuz", "../boot/vmlinuz"),
        );
        let err = Catalog::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("image_path"), "{err}");
    }

    #[test]
    fn empty_catalog_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Catalog::load(dir.path()),
            Err(KernelError::EmptyCatalog { .. })
        ));
        assert!(matches!(
            Catalog::load(&dir.path().join("missing")),
            Err(KernelError::CatalogRead { .. })
        ));
    }

    #[test]
    fn written_pin_round_trips_with_header() {
        let dir = tempfile::tempdir().unwrap();
        let pin: KernelPin = toml::from_str(&pin_toml("6.1", "6.1")).unwrap();
        let path = pin.write_to(dir.path()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# Kernel pin `6.1`. Pinned by `cargo xtask kernels update 6.1`"));
        let catalog = Catalog::load(dir.path()).unwrap();
        assert_eq!(catalog.pins(), [pin]);
        // Only the pin itself is left: no temp file.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// The committed catalog loads and covers the four series we test.
    #[test]
    fn committed_catalog_has_the_four_series() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let catalog = Catalog::load(&dir).unwrap();
        let series: Vec<&str> = catalog.pins().iter().map(|p| p.series.as_str()).collect();
        for want in ["5.10", "6.1", "6.12"] {
            assert!(series.contains(&want), "missing series {want}: {series:?}");
        }
        assert!(
            series.iter().any(|s| s.starts_with("7.")),
            "no 7.x series: {series:?}"
        );
        for pin in catalog.pins() {
            assert!(pin.package.ends_with("-cloud-amd64"), "{}", pin.package);
            assert!(pin.release.ends_with("-cloud-amd64"), "{}", pin.release);
            assert!(pin.release.starts_with(&pin.series), "{pin:?}");
        }
    }
}
