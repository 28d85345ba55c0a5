//! Where a source build's tree comes from, and the trees kloop builds in.
//!
//! A Debian `linux-source-X.Y` package is pinned like a kernel
//! (`kernels/sources/<package>.toml`: suite, version, the `.deb`'s sha256),
//! fetched through the same verified cache, and unpacked once into
//! `build/src/<deb sha256>/` (the pristine tree, never written again). A
//! local tree is used where it is. Neither is ever modified: patches go onto
//! a copy (`build/trees/<identity>/`), which is brought back to the source's
//! state before each new patch set, so an incremental build only recompiles
//! what the patches (old or new) touched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use kloop_path_io::{PathIo, PathIoExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::BuildError;
use crate::cache::{FetchOptions, KernelCache, PinnedDeb};

/// `kernels/sources/<package>.toml`: a source package pinned by sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePin {
    /// `linux-source-6.12`.
    pub package: String,
    pub version: String,
    pub suite: String,
    pub deb_sha256: String,
    /// The tarball inside the package (`usr/src/linux-source-6.12.tar.xz`).
    pub tarball: String,
}

impl SourcePin {
    pub fn load(catalog_dir: &Path, package: &str) -> Result<SourcePin, BuildError> {
        let dir = catalog_dir.join("sources");
        let path = dir.join(format!("{package}.toml"));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            let known = known_sources(&dir);
            BuildError::UnknownSource {
                name: package.to_string(),
                detail: format!("{}: {e}", path.display()),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            }
        })?;
        toml::from_str(&text).map_err(|e| BuildError::Invalid(format!("{}: {e}", path.display())))
    }

    /// The `X.Y` of `linux-source-X.Y`.
    pub fn series(&self) -> &str {
        self.package
            .strip_prefix("linux-source-")
            .unwrap_or(&self.package)
    }
}

fn known_sources(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".toml"))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out
}

/// Pins `package` (`linux-source-X.Y`) at the newest version `suite`
/// serves, from an index that verifies against the archive keyring, and
/// writes `kernels/sources/<package>.toml`.
pub fn pin_source(
    cache: &KernelCache,
    catalog_dir: &Path,
    package: &str,
    suite: &str,
    fetch: &FetchOptions,
) -> Result<SourcePin, BuildError> {
    use crate::apt::{AptState, Trust};
    if !package.starts_with("linux-source-") {
        return Err(BuildError::Invalid(format!(
            "{package} is not a kernel source package (linux-source-X.Y)"
        )));
    }
    let mirror = fetch.resolve_mirror()?;
    let apt = AptState::new(&cache.tmp_dir(), &mirror, suite, &fetch.resolve_keyring())?;
    apt.update(Trust::RequireSigned)?;
    let records = apt.show(&[package.to_string()])?;
    let newest = records
        .iter()
        .filter(|r| r.package == package)
        .max_by(|a, b| crate::version::compare_debian_versions(&a.version, &b.version))
        .ok_or_else(|| {
            BuildError::Invalid(format!("{} serves no package {package}", apt.source()))
        })?;
    let sha256 = newest.sha256.clone().ok_or_else(|| {
        BuildError::Invalid(format!(
            "the index of {} gives no SHA256 for {package}",
            apt.source()
        ))
    })?;
    let pin = SourcePin {
        package: package.to_string(),
        version: newest.version.clone(),
        suite: suite.to_string(),
        deb_sha256: sha256,
        tarball: format!("usr/src/{package}.tar.xz"),
    };
    // Fetch it now: the download is checked against the signed index's
    // hash, which the pin records.
    cache.ensure_pinned_deb(
        &PinnedDeb {
            id: package,
            suite,
            package,
            version: &pin.version,
            sha256: &pin.deb_sha256,
        },
        fetch,
    )?;
    let dir = catalog_dir.join("sources");
    std::fs::create_dir_all(&dir).doing(format!("creating {}", dir.display()))?;
    let text = format!(
        "# Source pin `{package}`: the Debian package `cargo xtask kernels build\n\
         # --source {package}` unpacks. Written by `cargo xtask kernels pin-source`;\n\
         # the sha256 (from the signed index) is the trust anchor.\n{}",
        toml::to_string(&pin).map_err(|e| BuildError::Invalid(e.to_string()))?
    );
    let path = dir.join(format!("{package}.toml"));
    std::fs::write(&path, text).doing(format!("writing {}", path.display()))?;
    Ok(pin)
}

/// What the user asked to build from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A pinned Debian source package.
    Package(SourcePin),
    /// A kernel tree on disk (git or plain).
    Tree(PathBuf),
}

impl SourceSpec {
    /// `linux-source-6.12` (a pin in `kernels/sources/`) or a path to a tree.
    pub fn parse(arg: &str, catalog_dir: &Path) -> Result<SourceSpec, BuildError> {
        let path = Path::new(arg);
        if path.join("Makefile").is_file() && path.join("Kconfig").is_file() {
            let abs = path.canonicalize().doing(format!("resolving {arg}"))?;
            return Ok(SourceSpec::Tree(abs));
        }
        if arg.starts_with("linux-source-") {
            return Ok(SourceSpec::Package(SourcePin::load(catalog_dir, arg)?));
        }
        if path.exists() {
            return Err(BuildError::Invalid(format!(
                "{arg} is not a kernel source tree (no Makefile and Kconfig at its top)"
            )));
        }
        Err(BuildError::UnknownSource {
            name: arg.to_string(),
            detail: "neither a directory with a kernel tree nor a `linux-source-X.Y` package"
                .into(),
            known: known_sources(&catalog_dir.join("sources")).join(", "),
        })
    }

    /// How this source is named in ids and reports.
    pub fn label(&self) -> String {
        match self {
            SourceSpec::Package(p) => format!("{} {}", p.package, p.version),
            SourceSpec::Tree(t) => t.display().to_string(),
        }
    }
}

/// The pristine tree of a source: unpacked from the package once, or the
/// user's tree as it is.
pub(super) fn pristine_tree(
    cache: &KernelCache,
    spec: &SourceSpec,
    fetch: &FetchOptions,
    progress: &mut dyn FnMut(super::BuildEvent),
) -> Result<(PathBuf, String), BuildError> {
    match spec {
        SourceSpec::Tree(dir) => {
            progress(super::BuildEvent::Phase(format!(
                "reading the state of {}",
                dir.display()
            )));
            if dir.join(".config").exists() || dir.join("include/config").exists() {
                return Err(BuildError::Invalid(format!(
                    "{} has in-tree build output (.config or include/config): kloop builds out \
                     of tree (make O=…), which kbuild refuses next to an in-tree build; run \
                     `make mrproper` there (keep your .config as a fragment: --config FILE) or \
                     point kloop at a clean worktree (`git worktree add`)",
                    dir.display()
                )));
            }
            Ok((dir.clone(), format!("tree:{}", tree_stamp(dir)?)))
        }
        SourceSpec::Package(pin) => {
            let root = cache
                .root()
                .join("build/src")
                .join(&pin.deb_sha256[..16.min(pin.deb_sha256.len())]);
            let tree = root.join(&pin.package);
            let done = root.join(".unpacked");
            if !done.is_file() {
                progress(super::BuildEvent::Phase(format!(
                    "fetching {} {}",
                    pin.package, pin.version
                )));
                let deb = cache.ensure_pinned_deb(
                    &PinnedDeb {
                        id: &pin.package,
                        suite: &pin.suite,
                        package: &pin.package,
                        version: &pin.version,
                        sha256: &pin.deb_sha256,
                    },
                    fetch,
                )?;
                progress(super::BuildEvent::Phase(format!(
                    "unpacking {} into {}",
                    pin.tarball,
                    root.display()
                )));
                unpack_source(&deb, &pin.tarball, &root, &tree)?;
                std::fs::write(&done, b"").doing(format!("writing {}", done.display()))?;
            }
            Ok((tree, format!("deb:{}", pin.deb_sha256)))
        }
    }
}

/// `dpkg-deb --fsys-tarfile deb | tar -xO <tarball> | tar -xJ` into `root`,
/// through a temporary directory renamed into place, so a half-unpacked
/// tree is never taken for a whole one.
fn unpack_source(deb: &Path, tarball: &str, root: &Path, tree: &Path) -> Result<(), BuildError> {
    let _ = std::fs::remove_dir_all(root);
    let parent = root.parent().unwrap_or(root);
    std::fs::create_dir_all(parent).doing(format!("creating {}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".unpacking-")
        .tempdir_in(parent)
        .doing(format!("creating a directory in {}", parent.display()))?;
    let xz = tmp.path().join("source.tar.xz");
    let mut found = false;
    crate::extract::walk_deb(deb, |path, entry| {
        if path == Path::new(tarball) {
            let mut out = std::fs::File::create(&xz)
                .at("creating", &xz)
                .map_err(KernelError::CacheWrite)?;
            std::io::copy(entry, &mut out)
                .at("writing", &xz)
                .map_err(KernelError::CacheWrite)?;
            found = true;
        }
        Ok(())
    })?;
    if !found {
        return Err(BuildError::Invalid(format!(
            "{} has no member {tarball}; fix `tarball` in its kernels/sources pin",
            deb.display()
        )));
    }
    let status = Command::new("tar")
        .arg("-xJf")
        .arg(&xz)
        .arg("-C")
        .arg(tmp.path())
        .arg("--no-same-owner")
        .stdin(Stdio::null())
        .status()
        .doing("running tar")?;
    if !status.success() {
        return Err(BuildError::Invalid(format!(
            "tar -xJf {} failed ({status})",
            xz.display()
        )));
    }
    let _ = std::fs::remove_file(&xz);
    let unpacked = tmp.path().join(tree.file_name().unwrap_or_default());
    if !unpacked.join("Makefile").is_file() {
        return Err(BuildError::Invalid(format!(
            "{tarball} did not unpack into {}/ with a Makefile",
            unpacked.display()
        )));
    }
    let kept = tmp.keep();
    std::fs::rename(&kept, root).map_err(|e| {
        PathIo::doing(
            format!("renaming {} to {}", kept.display(), root.display()),
            e,
        )
        .into()
    })
}

use crate::error::KernelError;

/// A cheap stamp of a tree's content: every file's path, size and mtime
/// (`.git` and editor droppings aside). An edit changes the file's mtime,
/// so it changes the stamp.
pub(super) fn tree_stamp(dir: &Path) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    for (rel, meta) in walk_files(dir)? {
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(meta.len().to_le_bytes());
        h.update(mtime_ns(&meta).to_le_bytes());
    }
    Ok(hex::encode(h.finalize()))
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Every regular file and symlink under `dir`, sorted, without `.git`.
fn walk_files(dir: &Path) -> Result<BTreeMap<PathBuf, std::fs::Metadata>, BuildError> {
    let mut out = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let abs = dir.join(&rel);
        let entries = std::fs::read_dir(&abs).doing(format!("listing {}", abs.display()))?;
        for entry in entries {
            let entry = entry.doing(format!("listing {}", abs.display()))?;
            let name = entry.file_name();
            if name == ".git" {
                continue;
            }
            let meta = entry
                .metadata()
                .doing(format!("stat {}", entry.path().display()))?;
            let child = rel.join(&name);
            if meta.is_dir() {
                todo.push(child);
            } else {
                out.insert(child, meta);
            }
        }
    }
    Ok(out)
}

/// The patched copy of `pristine` for `patches`, in `slot`: brought back to
/// the pristine state first (files the last patch set touched are copied
/// back, with a fresh mtime so make rebuilds what used them), then patched.
pub(super) fn patched_tree(
    pristine: &Path,
    slot: &Path,
    tree: &Path,
    source_identity: &str,
    patches: &[PathBuf],
    progress: &mut dyn FnMut(super::BuildEvent),
) -> Result<PathBuf, BuildError> {
    let tree = tree.to_path_buf();
    let marker = slot.join("touched");
    let stamp = slot.join("source");
    let touched_before = std::fs::read_to_string(&marker).unwrap_or_default();
    // A local tree edited since the copy was made is copied again (`cp -a`
    // keeps the edited files' newer mtimes, so make rebuilds them).
    let stale = std::fs::read_to_string(&stamp).ok().as_deref() != Some(source_identity);
    let fresh = stale || !tree.join("Makefile").is_file();
    if fresh {
        progress(super::BuildEvent::Phase(format!(
            "copying {} to {} for patching",
            pristine.display(),
            tree.display()
        )));
        let _ = std::fs::remove_dir_all(&tree);
        let parent = tree.parent().unwrap_or(slot);
        std::fs::create_dir_all(parent).doing(format!("creating {}", parent.display()))?;
        copy_tree(pristine, &tree)?;
        std::fs::write(&stamp, source_identity).doing(format!("writing {}", stamp.display()))?;
        // The copy gave the files the last patch set touched their old
        // mtimes back; objects built from the patched bytes are newer, so
        // touch them or make would keep those objects.
        for rel in touched_before.lines().filter(|l| !l.is_empty()) {
            let p = tree.join(rel);
            if p.is_file() {
                let _ = std::fs::File::options()
                    .append(true)
                    .open(&p)
                    .and_then(|f| f.set_modified(SystemTime::now()));
            }
        }
    } else {
        // Undo the previous patch set: every file it touched goes back to
        // the pristine bytes (or away, if the patch created it).
        for rel in touched_before.lines().filter(|l| !l.is_empty()) {
            restore(pristine, &tree, Path::new(rel))?;
        }
    }
    let _ = std::fs::remove_file(&marker);
    let mut touched = BTreeSet::new();
    for patch in patches {
        let files = apply_patch(&tree, patch)?;
        touched.extend(files);
        // Written after each patch, so a failure part way still lets the
        // next run undo what was applied.
        let list: String = touched.iter().map(|f| format!("{f}\n")).collect();
        std::fs::write(&marker, list).doing(format!("writing {}", marker.display()))?;
    }
    Ok(tree)
}

fn restore(pristine: &Path, tree: &Path, rel: &Path) -> Result<(), BuildError> {
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        return Ok(());
    }
    let src = pristine.join(rel);
    let dst = tree.join(rel);
    let _ = std::fs::remove_file(&dst);
    if src.is_file() {
        // A plain copy gets the current time as mtime: newer than any
        // object built from the patched bytes, so make rebuilds it.
        std::fs::copy(&src, &dst).doing(format!("restoring {}", dst.display()))?;
    }
    Ok(())
}

/// `cp -a --reflink=auto`: the copy keeps mtimes (a fresh build dir has
/// nothing to be newer than) and shares blocks where the filesystem can.
fn copy_tree(from: &Path, to: &Path) -> Result<(), BuildError> {
    let status = Command::new("cp")
        .arg("-a")
        .arg("--reflink=auto")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .status()
        .doing("running cp")?;
    if !status.success() {
        return Err(BuildError::Invalid(format!(
            "copying {} to {} failed ({status}); is there disk space?",
            from.display(),
            to.display()
        )));
    }
    Ok(())
}

/// The files a unified diff names (`+++ b/path`, and `--- a/path` for
/// deletions), without their `a/` `b/` prefix.
pub fn patch_files(text: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let name = line
            .strip_prefix("+++ ")
            .or_else(|| line.strip_prefix("--- "));
        let Some(name) = name else { continue };
        let name = name.split('\t').next().unwrap_or("").trim();
        if name == "/dev/null" {
            continue;
        }
        let stripped = name.split_once('/').map_or(name, |(_, rest)| rest);
        out.insert(stripped.to_string());
    }
    out.into_iter().collect()
}

/// Refuses a file that cannot be a patch before anything is built: empty,
/// binary (not UTF-8, or NUL bytes), or text without a unified diff's
/// `--- a/…` / `+++ b/…` lines. Returns the files it names.
pub fn check_patch(patch: &Path) -> Result<Vec<String>, BuildError> {
    let not = |why: &str| BuildError::NotAPatch {
        patch: patch.to_path_buf(),
        why: why.to_string(),
    };
    let bytes = std::fs::read(patch).doing(format!("reading patch {}", patch.display()))?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(not("it is empty"));
    }
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Err(not("it is binary (not UTF-8 text)"));
    };
    if text.contains('\0') {
        return Err(not("it is binary (NUL bytes)"));
    }
    let files = patch_files(text);
    if files.is_empty() {
        return Err(not(
            "it is not a unified diff (no `--- a/…` / `+++ b/…` lines); make one with `git diff` or `git format-patch`",
        ));
    }
    Ok(files)
}

/// Applies one patch with `patch -p1` (works in any tree, git or not,
/// and names the hunk that failed). Returns the files it names.
fn apply_patch(tree: &Path, patch: &Path) -> Result<Vec<String>, BuildError> {
    let files = patch_names_files(patch)?;
    // A dry run first, so a patch that does not apply leaves no half.
    for dry in [true, false] {
        run_patch(tree, patch, dry)?;
    }
    Ok(files)
}

/// Whether `patch` applies to `tree`, asked exactly as a build applies it
/// (`patch -p1 --forward --dry-run`), changing nothing: `Ok` with what
/// `patch` said (its offsets and fuzz, which a reader of a backport wants
/// to know), `Err(PatchFailed)` with the hunk that failed.
pub fn check_applies(tree: &Path, patch: &Path) -> Result<String, BuildError> {
    patch_names_files(patch)?;
    run_patch(tree, patch, true)
}

fn patch_names_files(patch: &Path) -> Result<Vec<String>, BuildError> {
    let text =
        std::fs::read_to_string(patch).doing(format!("reading patch {}", patch.display()))?;
    let files = patch_files(&text);
    if files.is_empty() {
        return Err(BuildError::PatchFailed {
            patch: patch.to_path_buf(),
            output: "no `--- a/…` / `+++ b/…` lines: not a unified diff".into(),
        });
    }
    Ok(files)
}

/// One `patch -p1` run in `tree` (`dry`: `--dry-run`); its output.
fn run_patch(tree: &Path, patch: &Path, dry: bool) -> Result<String, BuildError> {
    // `patch` runs in the tree: a relative path would name another file.
    let patch = &patch
        .canonicalize()
        .doing(format!("resolving patch {}", patch.display()))?;
    let mut c = Command::new("patch");
    c.arg("-p1")
        .arg("--forward")
        .arg("--batch")
        .arg("--no-backup-if-mismatch")
        .arg("-r")
        .arg("-")
        .arg("-i")
        .arg(patch)
        .current_dir(tree)
        .stdin(Stdio::null())
        .env("LC_ALL", "C");
    if dry {
        c.arg("--dry-run");
    }
    let out = c.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            BuildError::ToolMissing {
                tool: "patch",
                package: "patch",
            }
        } else {
            PathIo::doing("running patch", e).into()
        }
    })?;
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(BuildError::PatchFailed {
            patch: patch.to_path_buf(),
            output: output.trim().to_string(),
        });
    }
    Ok(output.trim().to_string())
}

/// sha256 of a file's bytes.
pub(super) fn file_hash(path: &Path) -> Result<String, BuildError> {
    let bytes = std::fs::read(path).doing(format!("reading {}", path.display()))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_files_reads_both_headers() {
        let text = "diff --git a/kernel/events/core.c b/kernel/events/core.c\n--- a/kernel/events/core.c\n+++ b/kernel/events/core.c\n@@ -1 +1 @@\n-a\n+b\n--- /dev/null\n+++ b/new.c\t2026-01-01\n";
        assert_eq!(patch_files(text), vec!["kernel/events/core.c", "new.c"]);
    }

    /// The backport mail's question, asked as a build applies a patch,
    /// changing nothing either way.
    #[test]
    fn check_applies_is_a_dry_run_that_names_offsets_and_failures() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("src");
        std::fs::create_dir_all(tree.join("kernel")).unwrap();
        let original = "zero\none\ntwo\nthree\n";
        std::fs::write(tree.join("kernel/a.c"), original).unwrap();
        let good = dir.path().join("good.patch");
        // Written against a file without "zero": it applies one line on.
        std::fs::write(
            &good,
            "--- a/kernel/a.c\n+++ b/kernel/a.c\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n",
        )
        .unwrap();
        let said = check_applies(&tree, &good).unwrap();
        assert!(said.contains("offset 1 line"), "{said}");
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/a.c")).unwrap(),
            original
        );
        let bad = dir.path().join("bad.patch");
        std::fs::write(
            &bad,
            "--- a/kernel/a.c\n+++ b/kernel/a.c\n@@ -1,3 +1,3 @@\n one\n-zwei\n+ZWEI\n three\n",
        )
        .unwrap();
        match check_applies(&tree, &bad) {
            Err(BuildError::PatchFailed { output, .. }) => {
                assert!(output.contains("FAILED"), "{output}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/a.c")).unwrap(),
            original
        );
        assert!(!tree.join("kernel/a.c.rej").exists());
    }

    #[test]
    fn patched_copy_is_restored_before_the_next_patch_set() {
        let dir = tempfile::tempdir().unwrap();
        let pristine = dir.path().join("src");
        std::fs::create_dir_all(pristine.join("kernel")).unwrap();
        std::fs::write(pristine.join("Makefile"), "all:\n").unwrap();
        std::fs::write(pristine.join("kernel/a.c"), "one\ntwo\nthree\n").unwrap();
        let p1 = dir.path().join("1.patch");
        std::fs::write(
            &p1,
            "--- a/kernel/a.c\n+++ b/kernel/a.c\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n",
        )
        .unwrap();
        let slot = dir.path().join("slot");
        let mut quiet = |_| {};
        let tree = patched_tree(
            &pristine,
            &slot,
            &slot.join("tree"),
            "id",
            std::slice::from_ref(&p1),
            &mut quiet,
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/a.c")).unwrap(),
            "one\nTWO\nthree\n"
        );
        // The same slot with no patches is the pristine tree again.
        let tree =
            patched_tree(&pristine, &slot, &slot.join("tree"), "id", &[], &mut quiet).unwrap();
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/a.c")).unwrap(),
            "one\ntwo\nthree\n"
        );
        // A patch that does not apply names itself and changes nothing.
        let bad = dir.path().join("bad.patch");
        std::fs::write(
            &bad,
            "--- a/kernel/a.c\n+++ b/kernel/a.c\n@@ -1,3 +1,3 @@\n one\n-zwei\n+ZWEI\n three\n",
        )
        .unwrap();
        let err = patched_tree(
            &pristine,
            &slot,
            &slot.join("tree"),
            "id",
            &[bad],
            &mut quiet,
        )
        .unwrap_err();
        assert!(matches!(err, BuildError::PatchFailed { .. }), "{err}");
        assert!(err.to_string().contains("bad.patch"), "{err}");
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/a.c")).unwrap(),
            "one\ntwo\nthree\n"
        );
        // The pristine tree was never written.
        assert_eq!(
            std::fs::read_to_string(pristine.join("kernel/a.c")).unwrap(),
            "one\ntwo\nthree\n"
        );
    }
}
