//! Golden snapshots of the normalised stream, one per scenario × kernel pin,
//! kept by `insta` under `scenarios/<name>/snapshots/<pin>.snap`.
//!
//! `insta` decides, from `INSTA_UPDATE` and `CI`, whether a mismatch writes a
//! `.snap.new` for `cargo insta review` (the default on a workstation), writes
//! the snapshot directly (`cargo xtask bless`), or only fails (CI).

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;

thread_local! {
    static COMPARING: Cell<bool> = const { Cell::new(false) };
}

/// insta reports a mismatch by panicking; the verdict already carries the
/// diff, so the panic message (and backtrace) of a comparison is not printed.
/// Panics anywhere else still reach the previous hook.
fn quiet_comparison_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !COMPARING.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotOutcome {
    Matched,
    /// The stream differs from the golden snapshot (or there is none yet).
    Drift {
        snapshot: PathBuf,
        /// The `.snap.new` insta wrote for review, if it wrote one.
        pending: Option<PathBuf>,
        /// A short excerpt of the difference.
        diff: String,
    },
}

/// Path of the snapshot file for `name` in `dir`.
pub fn snapshot_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.snap"))
}

/// The body of an insta snapshot file (after its front matter).
pub fn read_snapshot_body(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text.strip_prefix("---\n")?;
    let end = rest.find("\n---\n")?;
    Some(rest[end + 5..].trim_end_matches('\n').to_string())
}

/// Compares `text` with the snapshot `name` in `dir` through insta.
pub fn compare(dir: &Path, name: &str, description: &str, text: &str) -> SnapshotOutcome {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(description);
    let pending = dir.join(format!("{name}.snap.new"));
    let _ = std::fs::remove_file(&pending);
    quiet_comparison_panics();
    COMPARING.with(|c| c.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        settings.bind(|| insta::assert_snapshot!(name.to_string(), text));
    }));
    COMPARING.with(|c| c.set(false));
    match result {
        Ok(()) => SnapshotOutcome::Matched,
        Err(_) => {
            let snapshot = snapshot_path(dir, name);
            let old = read_snapshot_body(&snapshot);
            SnapshotOutcome::Drift {
                diff: short_diff(old.as_deref(), text),
                pending: pending.is_file().then_some(pending),
                snapshot,
            }
        }
    }
}

/// The first few differing lines, `-` golden and `+` now.
pub fn short_diff(old: Option<&str>, new: &str) -> String {
    let Some(old) = old else {
        return "no golden snapshot yet".to_string();
    };
    minimal_diff(old, new, 12)
}

/// A minimal line diff (Myers, through `similar`) of `old` → `new`: each
/// changed line as `  line N: - old` / `  line N: + new` (N in the file
/// it comes from), at most `max` lines, then `  ...`. Trailing newlines do
/// not count. Empty when the texts are equal.
pub fn minimal_diff(old: &str, new: &str, max: usize) -> String {
    let old = old.trim_end_matches('\n');
    let new = new.trim_end_matches('\n');
    let diff = similar::TextDiff::from_lines(old, new);
    let mut out = Vec::new();
    for change in diff.iter_all_changes() {
        let (sign, line) = match change.tag() {
            similar::ChangeTag::Equal => continue,
            similar::ChangeTag::Delete => ("-", change.old_index()),
            similar::ChangeTag::Insert => ("+", change.new_index()),
        };
        if out.len() >= max {
            out.push("  ...".to_string());
            break;
        }
        out.push(format!(
            "  line {}: {sign} {}",
            line.map_or(0, |i| i + 1),
            change.value().trim_end_matches('\n')
        ));
    }
    out.join("\n")
}

/// Compares `text` with the snapshot `name` in `dir` without writing
/// there: for kernels that are not pins, whose stream must never become a
/// pending `.snap.new` beside the pin's golden one. A differing stream is
/// written to `pending_dir/<name>.snap.new` instead.
pub fn compare_read_only(
    dir: &Path,
    name: &str,
    text: &str,
    pending_dir: &Path,
) -> SnapshotOutcome {
    let snapshot = snapshot_path(dir, name);
    let old = read_snapshot_body(&snapshot);
    if old.as_deref() == Some(text.trim_end_matches('\n')) {
        return SnapshotOutcome::Matched;
    }
    let pending = pending_dir.join(format!("{name}.snap.new"));
    let written = std::fs::write(&pending, text).is_ok();
    SnapshotOutcome::Drift {
        diff: short_diff(old.as_deref(), text),
        pending: written.then_some(pending),
        snapshot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_diff_names_lines() {
        let d = short_diff(Some("a\nb\nc"), "a\nB\nc\n");
        assert_eq!(d, "  line 2: - b\n  line 2: + B");
        assert_eq!(short_diff(None, "x"), "no golden snapshot yet");
        assert_eq!(short_diff(Some("x"), "x\n"), "");
        // An inserted line shifts nothing else: the diff is minimal.
        assert_eq!(minimal_diff("a\nb\nc", "a\nX\nb\nc", 10), "  line 2: + X");
    }

    #[test]
    fn body_is_read_after_front_matter() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.snap");
        std::fs::write(
            &p,
            "---\nsource: a.rs\ndescription: d\n---\nline 1\nline 2\n",
        )
        .unwrap();
        assert_eq!(read_snapshot_body(&p).unwrap(), "line 1\nline 2");
    }
}
