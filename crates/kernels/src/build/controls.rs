//! The positive controls of a checked kernel (`--checks`): kloop's own
//! modules in `kernels/controls/`, one per check, each doing one thing its
//! check must report. They are built here, against the kernel just
//! compiled, while its output directory still holds it (the slot is
//! shared by every patch set of a source and config, so later is too
//! late), and kept beside its image in `kernels/<id>/controls/`.
//!
//! Why modules, not code built into the kernel: a control must run in the
//! checked kernel itself, as the kernel under test was built, and at a
//! moment of the plan's choosing (a lockdep report turns lockdep off for
//! the rest of the boot, a KASAN report may panic it), which a built-in
//! self-test (KASAN's KUnit suite, lockdep's boot-time selftests) does not
//! allow; putting kloop's code into the tree would need a patch, which
//! would make it another kernel. An out-of-tree module is compiled with
//! the tree's own flags (`scripts/Makefile.kasan`, `scripts/Makefile.ubsan`
//! apply to every object kbuild builds), so its accesses are checked as the
//! kernel's are. The checks' fragments turn `CONFIG_MODULES` on for it.

use std::path::{Path, PathBuf};

use kloop_path_io::PathIoExt;
use sha2::{Digest, Sha256};

use super::make::Make;
use super::{BuildError, BuildEvent};

/// The directory inside a finished kernel's directory holding its controls.
pub const CONTROLS_DIR: &str = "controls";

/// The files of the controls' source directory that go into the build:
/// `Kbuild` and the C sources, sorted by name.
fn sources(dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .doing(format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| n == "Kbuild")
                || p.extension().is_some_and(|e| e == "c" || e == "h")
        })
        .collect();
    files.sort();
    if !files
        .iter()
        .any(|p| p.file_name().is_some_and(|n| n == "Kbuild"))
    {
        return Err(BuildError::Invalid(format!(
            "{} has no Kbuild: it is not the controls' source directory",
            dir.display()
        )));
    }
    Ok(files)
}

/// A hash of the controls' sources (names and bytes), part of a checked
/// kernel's id: changed controls make another kernel directory.
pub fn sources_hash(dir: &Path) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    for f in sources(dir)? {
        let bytes = std::fs::read(&f).doing(format!("reading {}", f.display()))?;
        h.update(f.file_name().unwrap_or_default().as_encoded_bytes());
        h.update([0]);
        h.update(&bytes);
    }
    Ok(hex::encode(h.finalize()))
}

/// The controls `req` asks for, built against the kernel `make` just
/// compiled with `config`; none when it asks for none. They need the
/// module loader: a config without it (the fragments' `CONFIG_MODULES=y`
/// overridden by a later `--config`) gets none, and the controls' run
/// says the checks are blind for want of them.
pub(super) fn build_if_asked(
    make: &Make<'_>,
    req: &super::BuildRequest,
    config: &crate::config::KernelConfig,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<Vec<PathBuf>, BuildError> {
    match &req.controls {
        Some(dir) if config.is_builtin("CONFIG_MODULES") => build(make, dir, progress),
        _ => Ok(Vec::new()),
    }
}

/// Copies `modules` into the staged kernel directory `tmp`.
pub(super) fn stage(tmp: &Path, modules: &[PathBuf]) -> Result<(), BuildError> {
    if modules.is_empty() {
        return Ok(());
    }
    let dest = tmp.join(CONTROLS_DIR);
    std::fs::create_dir_all(&dest).doing(format!("creating {}", dest.display()))?;
    for ko in modules {
        std::fs::copy(ko, dest.join(ko.file_name().unwrap_or_default()))
            .map(drop)
            .doing(format!("copying {}", ko.display()))?;
    }
    Ok(())
}

/// Builds the controls in `src_dir` against the kernel in `make`'s output
/// directory and returns the modules (`.ko` paths), sorted.
fn build(
    make: &Make<'_>,
    src_dir: &Path,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<Vec<PathBuf>, BuildError> {
    progress(BuildEvent::Phase(format!(
        "building the checks' controls ({}) against this kernel",
        src_dir.display()
    )));
    // An external module is built in a directory of its own (M=), written
    // into: a fresh copy in the output directory, never the checkout.
    let work = make.out.join("kloop-controls");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).doing(format!("creating {}", work.display()))?;
    for f in sources(src_dir)? {
        let to = work.join(f.file_name().unwrap_or_default());
        std::fs::copy(&f, &to)
            .map(drop)
            .doing(format!("copying {}", f.display()))?;
    }
    // modpost resolves an external module's symbols from the tree's
    // Module.symvers, which `make bzImage` does not write (only the
    // `modules` target does: scripts/Makefile.modpost, `output-symdump`);
    // without it every kernel symbol the module uses is an error.
    if !make.out.join("Module.symvers").is_file() {
        make.run(&["modules"], progress)?;
    }
    let m = format!("M={}", work.display());
    make.run(&[m.as_str(), "modules"], progress)?;
    let mut kos: Vec<PathBuf> = std::fs::read_dir(&work)
        .doing(format!("reading {}", work.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ko"))
        .collect();
    kos.sort();
    if kos.is_empty() {
        return Err(BuildError::Invalid(format!(
            "building the controls in {} made no module",
            work.display()
        )));
    }
    Ok(kos)
}

/// The control modules of a finished kernel directory, as (module name,
/// path), sorted by name; empty when it has none.
pub fn modules_in(kernel_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(kernel_dir.join(CONTROLS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ko"))
        .filter_map(|p| {
            let name = p.file_stem()?.to_string_lossy().replace('-', "_");
            Some((name, p))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sources_hash_covers_names_and_bytes_and_needs_a_kbuild() {
        let dir = tempfile::tempdir().unwrap();
        assert!(sources_hash(dir.path()).is_err());
        std::fs::write(dir.path().join("Kbuild"), "obj-m += a.o\n").unwrap();
        std::fs::write(dir.path().join("a.c"), "int a;\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a source").unwrap();
        let one = sources_hash(dir.path()).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "changed").unwrap();
        assert_eq!(sources_hash(dir.path()).unwrap(), one);
        std::fs::write(dir.path().join("a.c"), "int b;\n").unwrap();
        assert_ne!(sources_hash(dir.path()).unwrap(), one);
    }

    #[test]
    fn modules_are_found_by_their_ko_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(modules_in(dir.path()).is_empty());
        std::fs::create_dir(dir.path().join(CONTROLS_DIR)).unwrap();
        for f in ["kloop_control_ubsan.ko", "kloop_control_kasan.ko", "x.o"] {
            std::fs::write(dir.path().join(CONTROLS_DIR).join(f), "").unwrap();
        }
        let names: Vec<String> = modules_in(dir.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["kloop_control_kasan", "kloop_control_ubsan"]);
    }
}
