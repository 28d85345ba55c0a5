//! Run directories: how many, how big, and how they are pruned.

use super::*;

/// Run directories above this size earn a warning: each run prunes them to
/// the newest `KLOOP_KEEP_RUNS` (default 10), and ten large runs (a
/// mutation run, a `--repeat 20` matrix) still fill a disk.
pub(super) const RUNS_WARN_BYTES: u64 = 20 << 30;

pub(super) fn check_runs(layout: &Layout) -> Check {
    let dir = layout.runs();
    if !dir.is_dir() {
        return Check::ok("runs", format!("{}: none yet", dir.display()));
    }
    let runs = subdirs(&dir).len();
    let size = dir_size(&dir);
    let detail = format!(
        "{}: {runs} run(s), {}",
        dir.display(),
        kloop_qemu::human_bytes(size)
    );
    if size > RUNS_WARN_BYTES {
        Check::warn(
            "runs",
            detail + " (each run keeps the newest KLOOP_KEEP_RUNS, default 10)",
            "cargo xtask clean --keep 3 (or a lower KLOOP_KEEP_RUNS)".to_string(),
        )
    } else {
        Check::ok("runs", detail)
    }
}
