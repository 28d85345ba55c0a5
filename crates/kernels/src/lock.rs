//! Locks between kloop processes that say who holds them.
//!
//! An exclusive `flock` on a file beside the entry it guards (released when
//! the holder drops it or dies, so a killed run never leaves a lock
//! behind), and in the file the holder's pid and command line, so that a
//! process that has to wait, or gives up, can name it: `held by pid 4242
//! (xtask vm-test --kernel 6.1)`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// A held lock; released when dropped.
#[derive(Debug)]
pub struct HolderLock {
    _file: File,
    pub path: PathBuf,
}

impl HolderLock {
    /// Takes the lock at `path` if it is free (creating the file), and
    /// writes this process into it. `Ok(None)`: another process holds it.
    pub fn try_take(path: &Path) -> std::io::Result<Option<HolderLock>> {
        // Never truncate on open: the file says who holds it.
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        // SAFETY: a valid fd owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(e);
        }
        f.set_len(0)?;
        f.rewind()?;
        let _ = writeln!(f, "{}", this_process());
        Ok(Some(HolderLock {
            _file: f,
            path: path.to_path_buf(),
        }))
    }
}

/// Who holds (or last held) the lock at `path`: `pid N (command line)`.
pub fn holder(path: &Path) -> Option<String> {
    let mut s = String::new();
    File::open(path).ok()?.read_to_string(&mut s).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// `pid N (argv0's file name and its arguments)`, at most 120 characters.
fn this_process() -> String {
    let mut args = std::env::args();
    let exe = args
        .next()
        .map(|a| {
            Path::new(&a)
                .file_name()
                .map_or(a.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let cmd: String = std::iter::once(exe)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(120)
        .collect();
    format!("pid {} ({cmd})", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second taker is refused while the first holds it and can name the
    /// holder; the lock is free again once dropped. (flock locks belong to
    /// the open file, so two opens in one process contend like two
    /// processes.)
    #[test]
    fn a_held_lock_names_its_holder_and_frees_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.lock");
        let first = HolderLock::try_take(&path).unwrap().expect("free");
        assert!(HolderLock::try_take(&path).unwrap().is_none());
        let who = holder(&path).unwrap();
        assert!(
            who.starts_with(&format!("pid {} (", std::process::id())),
            "{who}"
        );
        // The refused taker did not wipe what the holder wrote.
        assert_eq!(holder(&path).unwrap(), who);
        drop(first);
        assert!(HolderLock::try_take(&path).unwrap().is_some());
    }
}
