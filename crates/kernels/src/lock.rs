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

    /// Whether the file this lock holds is still the one at its path. A
    /// process that removes an entry with its lock file (saved-VM pruning)
    /// unlinks the file while holding it; a waiter that had opened it
    /// before then holds a lock nobody else can see, and must take the
    /// lock again at the path (a new file) instead.
    pub fn is_current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self._file.metadata(), std::fs::metadata(&self.path)) {
            (Ok(held), Ok(at_path)) => held.dev() == at_path.dev() && held.ino() == at_path.ino(),
            _ => false,
        }
    }
}

/// Where the processes using a kernel cache register.
const USERS_DIR: &str = "users";

/// Registers this process as a user of the kernel cache at `cache_root`
/// until the returned lock is dropped (or the process dies): `clean` does
/// not remove what a registered process may be using.
pub fn register_user(cache_root: &Path) -> std::io::Result<HolderLock> {
    let dir = cache_root.join(USERS_DIR);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{}.lock", std::process::id()));
    HolderLock::try_take(&path)?
        .ok_or_else(|| std::io::Error::other(format!("{} is held already", path.display())))
}

/// The processes using the cache at `cache_root` now (`pid N (command
/// line)` each); the registrations of processes that are gone are removed.
pub fn live_users(cache_root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(cache_root.join(USERS_DIR)) else {
        return Vec::new();
    };
    let mut users = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        match HolderLock::try_take(&path) {
            Ok(Some(free)) => {
                drop(free);
                let _ = std::fs::remove_file(&path);
            }
            Ok(None) => users.push(holder(&path).unwrap_or_else(|| path.display().to_string())),
            Err(_) => {}
        }
    }
    users.sort();
    users
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

    /// A lock whose file was unlinked (and perhaps made anew) by another
    /// holder is not current: its holder must take the lock again.
    #[test]
    fn a_lock_on_an_unlinked_file_is_not_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.lock");
        let held = HolderLock::try_take(&path).unwrap().expect("free");
        assert!(held.is_current());
        std::fs::remove_file(&path).unwrap();
        assert!(!held.is_current(), "the file is gone");
        let fresh = HolderLock::try_take(&path)
            .unwrap()
            .expect("a new file, free");
        assert!(fresh.is_current());
        assert!(!held.is_current(), "another file is at the path now");
    }

    /// A registered user is listed while registered; a registration whose
    /// process is gone (its lock free) is removed, not listed.
    #[test]
    fn cache_users_are_listed_while_they_live() {
        let dir = tempfile::tempdir().unwrap();
        assert!(live_users(dir.path()).is_empty());
        let me = register_user(dir.path()).unwrap();
        let users = live_users(dir.path());
        assert_eq!(users.len(), 1, "{users:?}");
        assert!(users[0].starts_with(&format!("pid {} (", std::process::id())));
        // A dead process's file: its lock is free.
        std::fs::write(dir.path().join("users/999999.lock"), "pid 999999 (gone)").unwrap();
        assert_eq!(live_users(dir.path()).len(), 1);
        assert!(!dir.path().join("users/999999.lock").exists());
        drop(me);
        assert!(live_users(dir.path()).is_empty());
    }
}
