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

/// `text` up to the line `header` (exclusive), the whole of it without one.
pub fn before_section<'a>(text: &'a str, header: &str) -> &'a str {
    if text.starts_with(header) {
        return "";
    }
    match text.find(&format!("\n{header}")) {
        Some(at) => &text[..=at],
        None => text,
    }
}

/// Compares `text` with the snapshot `name` in `dir` without writing
/// there, both cut before their `header` section: for a stream whose
/// last section comes from a tool other than the one the snapshot was
/// taken with (perf's view, under `KLOOP_PERF`). A differing stream is
/// written whole to `pending_dir/<name>.snap.new`.
pub fn compare_read_only_before(
    dir: &Path,
    name: &str,
    text: &str,
    pending_dir: &Path,
    header: &str,
) -> SnapshotOutcome {
    let snapshot = snapshot_path(dir, name);
    let old = read_snapshot_body(&snapshot);
    let old_part = old.as_deref().map(|o| before_section(o, header));
    let new_part = before_section(text, header);
    if old_part.map(|o| o.trim_end_matches('\n')) == Some(new_part.trim_end_matches('\n')) {
        return SnapshotOutcome::Matched;
    }
    let pending = pending_dir.join(format!("{name}.snap.new"));
    let written = std::fs::write(&pending, text).is_ok();
    SnapshotOutcome::Drift {
        diff: short_diff(old_part, new_part),
        pending: written.then_some(pending),
        snapshot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_and_what_follows_it_are_left_out() {
        let h = "perf (second reader):";
        assert_eq!(
            before_section("a\nb\nperf (second reader):\n  x\n", h),
            "a\nb\n"
        );
        assert_eq!(before_section("a\nb\n", h), "a\nb\n");
        assert_eq!(before_section("perf (second reader):\n", h), "");
        // Only a line that is the header counts.
        assert_eq!(
            before_section("a perf (second reader):\n", h),
            "a perf (second reader):\n"
        );
    }

    #[test]
    fn only_the_part_before_the_section_is_compared() {
        let dir = tempfile::tempdir().unwrap();
        let snap = "---\nsource: x\n---\nk1\nk2\nperf (second reader):\n  old view\n";
        std::fs::write(dir.path().join("6.1.snap"), snap).unwrap();
        let h = "perf (second reader):";
        let same = compare_read_only_before(
            dir.path(),
            "6.1",
            "k1\nk2\nperf (second reader):\n  new view\n",
            dir.path(),
            h,
        );
        assert_eq!(same, SnapshotOutcome::Matched);
        let SnapshotOutcome::Drift { diff, pending, .. } = compare_read_only_before(
            dir.path(),
            "6.1",
            "k1\nK2\nperf (second reader):\n  new view\n",
            dir.path(),
            h,
        ) else {
            panic!()
        };
        assert_eq!(diff, "  line 2: - k2\n  line 2: + K2");
        assert!(std::fs::read_to_string(pending.unwrap())
            .unwrap()
            .contains("new view"));
    }

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
