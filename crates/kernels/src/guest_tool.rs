//! Programs another architecture's guest needs from Debian: the host's own
//! (its static busybox, say) are x86-64 binaries, and an arm64 guest's
//! `vm-shell` and stock boot need arm64 ones. Each is a package pinned by
//! sha256 in `kernels/tools/<arch>/<package>.toml`, fetched through the
//! verified cache as a kernel is ([`KernelCache::ensure_pinned_deb`]), and
//! the one file the guest runs unpacked once into `tools/<deb sha256>/`.

use std::io::Read;
use std::path::{Path, PathBuf};

use kloop_path_io::PathIo;
use kloop_protocol::Arch;
use serde::{Deserialize, Serialize};

use crate::cache::{FetchOptions, KernelCache, PinnedDeb};
use crate::KernelError;

/// `kernels/tools/<arch>/<package>.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPin {
    pub package: String,
    pub version: String,
    pub suite: String,
    pub deb_sha256: String,
    /// The file the guest runs, as the package holds it (`bin/busybox`).
    pub file: String,
}

impl ToolPin {
    /// Where the pin of `package` for `arch` lives.
    pub fn path(catalog_dir: &Path, arch: Arch, package: &str) -> PathBuf {
        catalog_dir
            .join("tools")
            .join(arch.as_str())
            .join(format!("{package}.toml"))
    }

    pub fn load(catalog_dir: &Path, arch: Arch, package: &str) -> Result<ToolPin, KernelError> {
        let path = Self::path(catalog_dir, arch, package);
        let text = std::fs::read_to_string(&path).map_err(|e| KernelError::NoToolPin {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let pin: ToolPin = toml::from_str(&text).map_err(|e| KernelError::NoToolPin {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        // The file is joined to a cache directory: a path that climbs out
        // of it is refused here, as a package entry that does is by the
        // unpacking.
        if pin.file.starts_with('/') || pin.file.split('/').any(|c| c == "..") {
            return Err(KernelError::NoToolPin {
                path,
                detail: format!(
                    "`file` {:?} must be a relative path inside the package",
                    pin.file
                ),
            });
        }
        Ok(pin)
    }
}

/// The file of `package`'s pin for `arch`, from the cache or fetched,
/// verified and unpacked now. Written under a temporary name and renamed,
/// so a killed fetch leaves nothing a later one takes for the file.
pub fn guest_tool(
    cache: &KernelCache,
    catalog_dir: &Path,
    arch: Arch,
    package: &str,
    fetch: &FetchOptions,
) -> Result<PathBuf, KernelError> {
    let pin = ToolPin::load(catalog_dir, arch, package)?;
    let name = Path::new(&pin.file)
        .file_name()
        .map_or_else(|| package.to_string(), |n| n.to_string_lossy().into_owned());
    let dest = cache.root().join("tools").join(&pin.deb_sha256).join(&name);
    if dest.is_file() {
        return Ok(dest);
    }
    // The id names the architecture, so the index read is arm64's.
    let id = format!("{}{package}", arch.id_prefix());
    let deb = cache.ensure_pinned_deb(
        &PinnedDeb {
            id: &id,
            suite: &pin.suite,
            package: &pin.package,
            version: &pin.version,
            sha256: &pin.deb_sha256,
        },
        fetch,
    )?;
    let mut bytes = None;
    crate::extract::walk_deb(&deb, |path, entry| {
        if path == Path::new(&pin.file) && entry.header().entry_type().is_file() {
            let mut b = Vec::new();
            entry
                .read_to_end(&mut b)
                .map_err(|e| KernelError::BadToolPackage {
                    path: deb.clone(),
                    reason: format!("reading {}: {e}", pin.file),
                })?;
            bytes = Some(b);
        }
        Ok(())
    })?;
    let bytes = bytes.ok_or_else(|| KernelError::BadToolPackage {
        path: deb.clone(),
        reason: format!(
            "the package holds no file {} (the pin {} names it)",
            pin.file,
            ToolPin::path(catalog_dir, arch, package).display()
        ),
    })?;
    let write = |source| KernelError::CacheWrite(PathIo::at("writing", &dest, source));
    crate::write_atomically(&dest, &bytes).map_err(write)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755)).map_err(write)?;
    }
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_pins_load_and_stay_inside_their_package() {
        let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let pin = ToolPin::load(&kernels, Arch::Arm64, "busybox-static").unwrap();
        assert_eq!(pin.file, "bin/busybox");
        assert_eq!(pin.deb_sha256.len(), 64, "{pin:?}");
    }

    #[test]
    fn a_pin_naming_a_file_outside_the_package_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = ToolPin::path(dir.path(), Arch::Arm64, "x");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            "package = \"x\"\nversion = \"1\"\nsuite = \"bookworm\"\ndeb_sha256 = \"00\"\nfile = \"../../etc/passwd\"\n",
        )
        .unwrap();
        let err = ToolPin::load(dir.path(), Arch::Arm64, "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("relative path inside the package"), "{err}");
        let err = ToolPin::load(dir.path(), Arch::Arm64, "missing")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }
}
