//! Room in the kernel cache: what a write that failed for want of space or
//! permission tells the user, and the check a run makes before it writes.

use std::path::Path;

use kloop_path_io::{PathIo, PathIoExt};

/// What a run may write into the cache before it ends, at most: one saved
/// VM (about 100 MB here: the guest's memory as QEMU migrates it, mostly
/// zero pages) and one kernel's `.deb`, image and decompressed ELF (about
/// 110 MB for a cloud build), with room to spare.
pub const RUN_NEEDS: u64 = 256 << 20;

/// The bytes free to an unprivileged writer on the filesystem holding
/// `path` (the nearest existing ancestor), if it can be asked.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the struct it is given from a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as u64 * s.f_frsize as u64)
}

/// Megabytes, for messages.
pub fn mb(bytes: u64) -> String {
    format!("{:.0} MB", bytes as f64 / 1e6)
}

/// The clean-up a user can do to make room, and the way around it.
pub const FREE_SPACE_HINT: &str = "free space with `cargo xtask clean --saved-vms` (saved VMs, remade on demand) or `cargo xtask clean --kernels` (fetched kernels, fetched again), or set KLOOP_CACHE_DIR to a directory on a larger disk";

/// Why a write into the cache failed, and the next step: no space (with
/// what is free there), a read-only or forbidden directory, or the error
/// as it is. Each says the OS error.
pub fn write_problem(e: &PathIo) -> String {
    use std::io::ErrorKind;
    let source = &e.source;
    let Some(path) = e.path.as_deref() else {
        // `what` names the path itself.
        return format!(
            "{e}; make the kernel cache writable and free disk space there, or set \
             KLOOP_CACHE_DIR to another directory"
        );
    };
    // By kind, not errno: a write through `tempfile` wraps the OS error
    // with its path, which keeps the kind and loses the raw errno.
    match source.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => format!(
            "no space left on the device holding {} ({source}; {} free there, a run needs up to {}): {FREE_SPACE_HINT}",
            path.display(),
            free_bytes(path).map_or("nothing".to_string(), mb),
            mb(RUN_NEEDS)
        ),
        ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => format!(
            "cannot write {} ({source}): the kernel cache must be writable; set KLOOP_CACHE_DIR to a writable directory",
            path.display()
        ),
        _ => format!(
            "cannot write to the kernel cache at {}: {source}; make that directory writable and free disk space there, or set KLOOP_CACHE_DIR to another directory",
            path.display()
        ),
    }
}

/// Why the cache cannot take a run.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    /// A probe file could not be written (read-only, forbidden, full).
    /// The message quotes the OS error, so the `PathIo` is not its
    /// `source`.
    #[error("{}", write_problem(.0))]
    CannotWrite(PathIo),
    /// Less free than a run may need.
    #[error(
        "the kernel cache at {} has {} free; a run needs up to {} (a saved VM, a kernel's package, image and ELF): {FREE_SPACE_HINT}",
        path.display(), mb(*free), mb(*needed)
    )]
    NoRoom {
        path: std::path::PathBuf,
        free: u64,
        needed: u64,
    },
}

/// Before a run writes anything: the cache can be written (a file made
/// and removed in its `tmp/`) and has [`RUN_NEEDS`] free.
pub fn check_room(cache_root: &Path) -> Result<(), RoomError> {
    let tmp = cache_root.join("tmp");
    let probe = tmp.join(format!(".write-probe-{}", std::process::id()));
    let written = std::fs::create_dir_all(&tmp).and_then(|()| std::fs::write(&probe, b"kloop"));
    let _ = std::fs::remove_file(&probe);
    written
        .at("writing a probe file in", &tmp)
        .map_err(RoomError::CannotWrite)?;
    match free_bytes(cache_root) {
        Some(free) if free < RUN_NEEDS => Err(RoomError::NoRoom {
            path: cache_root.to_path_buf(),
            free,
            needed: RUN_NEEDS,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of failed write names its cause and the next step, also
    /// when the OS error comes wrapped with its path (as `tempfile` does).
    #[test]
    fn write_problems_say_what_to_do() {
        let wrapped = std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "No space left on device (os error 28) at path \"/x\"",
        );
        assert!(write_problem(&PathIo::at("writing", "/x", wrapped))
            .starts_with("no space left on the device holding /x"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("images/x");
        let failed = |errno| PathIo::at("writing", &path, std::io::Error::from_raw_os_error(errno));
        let full = write_problem(&failed(libc::ENOSPC));
        assert!(
            full.starts_with(&format!(
                "no space left on the device holding {}",
                path.display()
            )),
            "{full}"
        );
        assert!(
            full.contains("MB free there") && full.contains("cargo xtask clean --saved-vms"),
            "{full}"
        );
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC).to_string();
        assert!(full.contains(&enospc), "{full}");
        let ro = write_problem(&failed(libc::EROFS));
        assert!(
            ro.contains("Read-only file system")
                && ro.contains("KLOOP_CACHE_DIR to a writable directory"),
            "{ro}"
        );
        let other = write_problem(&failed(libc::EIO));
        assert!(
            other.starts_with("cannot write to the kernel cache at"),
            "{other}"
        );
        // A `PathIo` whose `what` names the path is said as it is, with
        // the next step.
        let unnamed = write_problem(&PathIo::doing(
            "creating /c/x",
            std::io::Error::from_raw_os_error(libc::EIO),
        ));
        assert!(
            unnamed.starts_with("creating /c/x: ") && unnamed.contains("KLOOP_CACHE_DIR"),
            "{unnamed}"
        );
    }

    /// A writable directory with room passes, and the probe file is gone.
    #[test]
    fn a_writable_cache_with_room_passes() {
        let dir = tempfile::tempdir().unwrap();
        check_room(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
        assert!(free_bytes(&dir.path().join("not/yet/made")).is_some());
    }
}
