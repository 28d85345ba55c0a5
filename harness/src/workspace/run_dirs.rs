//! Run directories under `target/kloop/runs/`: made one per run, locked
//! while their run lives, and pruned to the newest few.
//!
//! A run directory is named `<unix seconds>-<pid>`. Its process holds an
//! exclusive `flock` on `<dir>/.lock` until it exits (the kernel drops the
//! lock with the process, however it ends), so pruning, which may happen in
//! another kloop process at the same moment, never removes a live run.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How many run directories to keep (the newest), default [`DEFAULT_KEEP`].
pub const KEEP_ENV: &str = "KLOOP_KEEP_RUNS";
pub const DEFAULT_KEEP: usize = 10;

/// The lock files of this process's run directories, held until it exits.
static HELD: Mutex<Vec<(PathBuf, File)>> = Mutex::new(Vec::new());

/// A run directory found under the runs root.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
    /// Seconds since the epoch when it was made (from its name).
    pub started: u64,
    pub bytes: u64,
    /// Some process still runs in it.
    pub live: bool,
}

/// What a prune removed.
#[derive(Debug, Default)]
pub struct Pruned {
    pub removed: Vec<PathBuf>,
    pub bytes: u64,
    /// Directories that could not be removed, and why.
    pub failed: Vec<(PathBuf, io::Error)>,
    /// With [`Removal::Background`]: the thread deleting what was moved
    /// aside (joined by tests; a run lets it finish on its own).
    pub deleting: Option<std::thread::JoinHandle<()>>,
}

/// How [`prune`] removes the directories it prunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Deleted before `prune` returns (`clean`).
    Now,
    /// Renamed aside at once (`.removing-<name>`, which no listing takes
    /// for a run) and deleted by a thread while the run goes on: deleting
    /// a whole matrix's directory (thousands of files) took ~1.5-3 s of the
    /// start of every warm `vm-test` once the newest ten were kept. A
    /// directory left aside by a process that exited first is deleted by
    /// the next prune.
    Background,
}

/// The prefix of a pruned run directory not yet deleted.
const REMOVING: &str = ".removing-";

/// `KLOOP_KEEP_RUNS`, else [`DEFAULT_KEEP`]; 0 keeps every run.
pub fn keep_from_env() -> usize {
    std::env::var(KEEP_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_KEEP)
}

/// A new run directory under `root`, locked for this process's life.
pub fn create(root: &Path) -> io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let dir = root.join(format!("{}-{}", stamp.as_secs(), std::process::id()));
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    // Two environments of one process within a second share a directory
    // (their trials' paths differ), as they always did.
    if held.iter().any(|(d, _)| *d == dir) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let lock = File::create(dir.join(".lock"))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    held.push((dir.clone(), lock));
    Ok(dir)
}

/// The run directories under `root`, newest first.
pub fn list(root: &Path) -> Vec<RunDir> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<RunDir> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (secs, pid) = name.split_once('-')?;
            let started = secs.parse().ok()?;
            pid.parse::<u32>().ok()?;
            let path = e.path();
            Some(RunDir {
                live: is_live(&path),
                bytes: dir_bytes(&path),
                started,
                path,
            })
        })
        .collect();
    dirs.sort_by(|a, b| b.started.cmp(&a.started).then(b.path.cmp(&a.path)));
    dirs
}

/// The newest run directory process `pid` made under `root` (run
/// directories are named `<seconds>-<pid>`): how a command that ran
/// `vm-test` as a child finds its run without reading its output.
pub fn of_process(root: &Path, pid: u32) -> Option<PathBuf> {
    let suffix = format!("-{pid}");
    list(root)
        .into_iter()
        .find(|r| {
            r.path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(&suffix))
        })
        .map(|r| r.path)
}

/// Removes all but the newest `keep` run directories under `root` (0
/// keeps none), never one that is live, and the overhead reports named
/// after them in `report_dir`.
pub fn prune(root: &Path, keep: usize, report_dir: &Path, removal: Removal) -> Pruned {
    let mut pruned = Pruned::default();
    for run in list(root).into_iter().skip(keep) {
        if run.live {
            continue;
        }
        let removed = match removal {
            Removal::Now => std::fs::remove_dir_all(&run.path),
            Removal::Background => match run.path.file_name() {
                Some(name) => std::fs::rename(
                    &run.path,
                    root.join(format!("{REMOVING}{}", name.to_string_lossy())),
                ),
                None => continue,
            },
        };
        match removed {
            Ok(()) => {
                pruned.bytes += run.bytes;
                if let Some(name) = run.path.file_name().and_then(|n| n.to_str()) {
                    for ext in ["md", "svg"] {
                        let report = report_dir.join(format!("overhead-{name}.{ext}"));
                        pruned.bytes += std::fs::metadata(&report).map_or(0, |m| m.len());
                        let _ = std::fs::remove_file(report);
                    }
                }
                pruned.removed.push(run.path);
            }
            Err(e) => pruned.failed.push((run.path, e)),
        }
    }
    let root = root.to_path_buf();
    match removal {
        Removal::Now => delete_set_aside(&root),
        Removal::Background => {
            pruned.deleting = std::thread::Builder::new()
                .name("kloop-prune".into())
                .spawn(move || delete_set_aside(&root))
                .ok();
        }
    }
    pruned
}

/// Deletes the directories pruning renamed aside under `root`. Best
/// effort: what stays is tried again by the next prune.
fn delete_set_aside(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(REMOVING) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// How long each trial took (wall seconds, by trial id such as
/// `6.12/trampolines`) in the newest finished runs under `root`, newest
/// first wins; `current` (this run's own directory) is skipped. Read from
/// their `results.jsonl`; a run without one, or a line that is not a
/// result, is passed over: the figures only order trials.
pub fn past_wall_times(root: &Path, current: &Path) -> HashMap<String, f64> {
    /// Enough runs to cover a full matrix after a few filtered ones.
    const RUNS_READ: usize = 5;
    let mut times = HashMap::new();
    let finished = list(root)
        .into_iter()
        .filter(|r| !r.live && r.path != current)
        .filter_map(|r| std::fs::read_to_string(r.path.join("results.jsonl")).ok())
        .take(RUNS_READ);
    for text in finished {
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let (Some(id), Some(wall)) = (v["id"].as_str(), v["wall_secs"].as_f64()) {
                times.entry(id.to_owned()).or_insert(wall);
            }
        }
    }
    times
}

/// True if some process holds `dir`'s lock (a directory without one is
/// from before locks, or half made: not live).
fn is_live(dir: &Path) -> bool {
    let Ok(lock) = File::open(dir.join(".lock")) else {
        return false;
    };
    // A separate open file description conflicts with a lock held through
    // another, in this process too.
    // SAFETY: flock on a descriptor we own; released when `lock` closes.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// The bytes under a directory (the kernel cache's own count).
pub use kloop_kernels::dir_bytes;

#[cfg(test)]
mod tests {
    use super::*;

    fn make_run(root: &Path, secs: u64, bytes: usize) -> PathBuf {
        let dir = root.join(format!("{secs}-1"));
        std::fs::create_dir_all(dir.join("6.1/basic")).unwrap();
        std::fs::write(dir.join("6.1/basic/data.bin"), vec![0u8; bytes]).unwrap();
        dir
    }

    #[test]
    fn prune_keeps_the_newest_and_every_live_run() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runs");
        let reports = tmp.path().join("report");
        std::fs::create_dir_all(&reports).unwrap();
        let old = make_run(&root, 100, 10);
        let older = make_run(&root, 50, 20);
        std::fs::write(reports.join("overhead-50-1.md"), "x").unwrap();
        let newer = make_run(&root, 200, 30);
        // Not a run directory: left alone whatever its age.
        std::fs::create_dir_all(root.join("notes")).unwrap();
        // A live run, older than all: this process holds its lock.
        let live = create(&root).unwrap();
        let live_renamed = root.join("10-2");
        std::fs::rename(&live, &live_renamed).unwrap();

        let listed: Vec<u64> = list(&root).iter().map(|r| r.started).collect();
        assert_eq!(listed, [200, 100, 50, 10]);
        assert!(list(&root).iter().any(|r| r.started == 10 && r.live));

        // A directory a process set aside and did not delete before it
        // exited goes with this prune.
        let leftover = root.join(format!("{REMOVING}5-1"));
        std::fs::create_dir_all(leftover.join("6.1/basic")).unwrap();
        let pruned = prune(&root, 1, &reports, Removal::Now);
        assert_eq!(pruned.removed, [old.clone(), older.clone()]);
        assert_eq!(pruned.bytes, 10 + 20 + 1);
        assert!(newer.is_dir() && live_renamed.is_dir() && root.join("notes").is_dir());
        assert!(!reports.join("overhead-50-1.md").exists());
        assert!(!old.exists() && !older.exists() && !leftover.exists());
    }

    /// In the background, the pruned directories leave the listing before
    /// `prune` returns and are gone once its thread ends; the newest and
    /// what is not a run stay.
    #[test]
    fn background_pruning_sets_aside_then_deletes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runs");
        let reports = tmp.path().join("report");
        let old = make_run(&root, 100, 10);
        let newer = make_run(&root, 200, 20);
        std::fs::create_dir_all(root.join("notes")).unwrap();
        let pruned = prune(&root, 1, &reports, Removal::Background);
        assert_eq!(pruned.removed, std::slice::from_ref(&old));
        assert_eq!(pruned.bytes, 10);
        assert!(!old.exists(), "renamed aside before prune returned");
        let listed: Vec<u64> = list(&root).iter().map(|r| r.started).collect();
        assert_eq!(listed, [200]);
        pruned.deleting.expect("a deleting thread").join().unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["200-1", "notes"]);
        assert!(newer.is_dir());
    }

    #[test]
    fn a_process_finds_its_newest_run() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runs");
        for name in ["100-7", "200-7", "300-17", "150-70"] {
            std::fs::create_dir_all(root.join(name)).unwrap();
        }
        assert_eq!(of_process(&root, 7), Some(root.join("200-7")));
        assert_eq!(of_process(&root, 17), Some(root.join("300-17")));
        assert_eq!(of_process(&root, 70), Some(root.join("150-70")));
        assert_eq!(of_process(&root, 8), None);
    }

    #[test]
    fn past_wall_times_takes_the_newest_finished_runs_figure() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("runs");
        let older = make_run(&root, 100, 0);
        std::fs::write(
            older.join("results.jsonl"),
            "{\"id\":\"6.1/basic\",\"wall_secs\":9.0}\n{\"id\":\"6.1/kprobes\",\"wall_secs\":3.5}\n",
        )
        .unwrap();
        let newer = make_run(&root, 200, 0);
        std::fs::write(
            newer.join("results.jsonl"),
            "not json\n{\"id\":\"6.1/basic\",\"wall_secs\":1.25}\n{\"id\":\"6.1/x\"}\n",
        )
        .unwrap();
        // The run asking is skipped, even though it is the newest.
        let current = make_run(&root, 300, 0);
        std::fs::write(
            current.join("results.jsonl"),
            "{\"id\":\"6.1/basic\",\"wall_secs\":100.0}\n",
        )
        .unwrap();
        let times = past_wall_times(&root, &current);
        assert_eq!(times.get("6.1/basic"), Some(&1.25));
        assert_eq!(times.get("6.1/kprobes"), Some(&3.5));
        assert_eq!(times.len(), 2);
    }
}
