//! Reporting results: a line per trial, a summary, JSON lines, JUnit XML
//! and a Markdown summary for a CI's step summary.

use std::fmt::Write as _;
use std::path::Path;

use crate::run::trial::{TrialResult, Verdict};

pub mod ab;
pub mod audit;
pub mod backport_mail;
pub mod bench;
pub mod bisect;
pub mod bug_mail;
pub mod junit;
pub mod kcidb;
pub mod kernels;
pub mod markdown;
pub mod merge;
pub mod overhead;
pub mod perf_data;
pub mod phases;
pub mod repro;

pub use junit::junit;
pub use markdown::SUMMARY_FILE;

/// `6.12/subprogs ... ok (3.4 s, tcg)`,
/// `6.1/interpreter ... SKIPPED (jit-optional: …) (2.1 s, tcg)`, then the
/// trial's notes if any
/// (`; lookups: 200 ids looked up at once, 3 found, 197 ENOENT (98.5%)`).
pub fn trial_line(r: &TrialResult) -> String {
    let mut line = format!(
        "{} ... {} ({:.1} s, {})",
        r.id,
        r.verdict.headline(),
        r.wall_secs,
        r.accel
    );
    for n in &r.notes {
        let _ = write!(line, "; {n}");
    }
    if let Some(run) = &r.reused_from {
        let _ = write!(
            line,
            "; reused from run {run} (same kernel, scenario and kloop)"
        );
    }
    line
}

/// Details printed under a trial's line: everything but ok and skipped
/// (whose one-line reason is on the trial line already).
pub fn failure_details(r: &TrialResult) -> Option<String> {
    if matches!(r.verdict, Verdict::Skipped(_)) {
        return None;
    }
    let msg = r.verdict.message()?;
    let mut out = String::new();
    for line in msg.lines() {
        let _ = writeln!(out, "    {line}");
    }
    let _ = write!(out, "    artefacts: {}", r.artefacts.display());
    Some(out)
}

/// Counts per class.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub ok: usize,
    pub failed: usize,
    pub skipped: usize,
    pub known: usize,
    pub fixed: usize,
    pub infrastructure: usize,
    pub timeout: usize,
    pub panic: usize,
    pub interrupted: usize,
    pub flaky: usize,
}

impl Summary {
    pub fn of(results: &[TrialResult]) -> Self {
        let mut s = Summary::default();
        for r in results {
            match r.verdict {
                Verdict::Ok => s.ok += 1,
                Verdict::Failed(_) => s.failed += 1,
                Verdict::Skipped(_) => s.skipped += 1,
                Verdict::Known(_) => s.known += 1,
                Verdict::Fixed(_) => s.fixed += 1,
                Verdict::Infrastructure(_) => s.infrastructure += 1,
                Verdict::Timeout(_) => s.timeout += 1,
                Verdict::Panic(_) => s.panic += 1,
                Verdict::Interrupted(_) => s.interrupted += 1,
                Verdict::Flaky(_) => s.flaky += 1,
            }
        }
        s
    }

    fn not_ok(&self) -> usize {
        self.failed
            + self.fixed
            + self.infrastructure
            + self.timeout
            + self.panic
            + self.interrupted
            + self.flaky
    }

    /// Nothing failed: skipped and known-bug trials do not fail a run.
    pub fn all_ok(&self) -> bool {
        self.not_ok() == 0
    }

    /// Trials were planned and every one was skipped: the run tested
    /// nothing. Not a success unless the user said so (`--allow-skipped`):
    /// a CI job must not go green having tested nothing.
    pub fn nothing_ran(&self) -> bool {
        self.skipped > 0 && self.skipped == self.ok + self.not_ok() + self.known + self.skipped
    }

    /// Did the run succeed: nothing failed and, unless `allow_skipped`,
    /// something ran.
    pub fn success(&self, allow_skipped: bool) -> bool {
        self.all_ok() && (allow_skipped || !self.nothing_ran())
    }

    /// Why a run that tested nothing is not a success, for its closing
    /// lines.
    pub const NOTHING_RAN: &'static str = "no trial ran: every trial was SKIPPED (each line above says which kernel feature was missing); a run that tests nothing is not a success. Choose kernels that have the feature, or pass --allow-skipped if skipping all is what you want";

    /// `8 passed, 0 failed` plus the classes that are not zero; skipped and
    /// known bugs are counted apart from both.
    pub fn line(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.ok, self.not_ok());
        let mut parts = Vec::new();
        for (n, what) in [
            (self.failed, "test failure"),
            (
                self.fixed,
                "FIXED? (known issue no longer shows: update the ledger)",
            ),
            (self.infrastructure, "infrastructure"),
            (self.timeout, "timeout"),
            (self.panic, "panic"),
            (self.interrupted, "interrupted"),
            (self.flaky, "flaky"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        if !parts.is_empty() {
            let _ = write!(s, " ({})", parts.join(", "));
        }
        if self.known > 0 {
            let _ = write!(s, ", {} known bug", self.known);
        }
        if self.skipped > 0 {
            let _ = write!(s, ", {} skipped", self.skipped);
        }
        s
    }
}

/// The skipped and known-bug trials, one line each, for the end of a run
/// (they do not fail it, so they must not scroll away unseen).
pub fn not_passed_lines(results: &[TrialResult]) -> Vec<String> {
    results
        .iter()
        .filter_map(|r| match &r.verdict {
            Verdict::Skipped(_) | Verdict::Fixed(_) | Verdict::Flaky(_) => {
                Some(format!("{}: {}", r.id, r.verdict.headline()))
            }
            Verdict::Known(_) => Some(format!("{}: {} (known bug)", r.id, r.verdict.headline())),
            _ => None,
        })
        .collect()
}

/// A trial's line, with what failed under it when it did not pass.
pub fn trial_lines(r: &TrialResult) -> String {
    match failure_details(r) {
        Some(d) => format!("{}\n{d}", trial_line(r)),
        None => trial_line(r),
    }
}

/// One JSON object per line: the [`TrialResult`] (`verdict` as `{"class",
/// "message"}`, `violations` with their rule, message, listener, offset,
/// quoted records and covering ledger entry) plus `kcidb_status` and
/// `known` ([`kcidb`]).
fn jsonl(results: &[TrialResult]) -> std::io::Result<String> {
    let mut out = String::new();
    for r in results {
        out.push_str(
            &serde_json::to_string(&kcidb::JsonLine::of(r)).map_err(std::io::Error::other)?,
        );
        out.push('\n');
    }
    Ok(out)
}

/// Writes `results.jsonl`, `junit.xml` and `summary.md` ([`SUMMARY_FILE`])
/// into `dir`.
pub fn write_files(dir: &Path, results: &[TrialResult]) -> std::io::Result<()> {
    std::fs::write(dir.join("results.jsonl"), jsonl(results)?)?;
    std::fs::write(dir.join("junit.xml"), junit(results))?;
    std::fs::write(dir.join(SUMMARY_FILE), markdown::summary(dir, results))
}

/// Writes `runs.jsonl`: every run of a `--repeat` run, one line each
/// (`results.jsonl` then holds one combined line per trial).
pub fn write_runs(dir: &Path, runs: &[TrialResult]) -> std::io::Result<()> {
    std::fs::write(dir.join("runs.jsonl"), jsonl(runs)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(kernel: &str, verdict: Verdict) -> TrialResult {
        TrialResult {
            wall_secs: 3.44,
            boot_to_hello_secs: Some(1.2),
            qemu_peak_rss_kib: Some(300_000),
            guest_release: Some("6.12.0-cloud-amd64".into()),
            ..TrialResult::for_test(kernel, "basic", verdict, "/tmp/a")
        }
    }

    #[test]
    fn kcidb_status_of_every_verdict() {
        use kcidb::Status::*;
        let m = || "m".to_string();
        let mut known_left = result("6.1", Verdict::Fixed(m()));
        known_left.violations.push(crate::run::trial::RuleHit {
            rule: "lost".into(),
            message: m(),
            listener: None,
            offset: None,
            records: Vec::new(),
            known_issue: Some("x".into()),
            detail: None,
        });
        let mut infra_after_hello = result("6.1", Verdict::Infrastructure(m()));
        infra_after_hello.boot_to_hello_secs = Some(1.0);
        let mut infra_before_hello = result("6.1", Verdict::Infrastructure(m()));
        infra_before_hello.boot_to_hello_secs = None;
        let cases = [
            (result("6.1", Verdict::Ok), (Pass, false)),
            (result("6.1", Verdict::Known(m())), (Fail, true)),
            (result("6.1", Verdict::Fixed(m())), (Pass, false)),
            (known_left, (Fail, true)),
            (
                result(
                    "6.1",
                    Verdict::failed(crate::run::trial::FailureCause::SnapshotDrift, m()),
                ),
                (Fail, false),
            ),
            (result("6.1", Verdict::Skipped(m())), (Skip, false)),
            (result("6.1", Verdict::Panic(m())), (Fail, false)),
            (result("6.1", Verdict::Timeout(m())), (Error, false)),
            (infra_after_hello, (Error, false)),
            (infra_before_hello, (Miss, false)),
            (result("6.1", Verdict::Interrupted(m())), (Miss, false)),
            (result("6.1", Verdict::Flaky(m())), (Error, false)),
        ];
        for (r, want) in &cases {
            assert_eq!(kcidb::status(r), *want, "{:?}", r.verdict);
        }
        // The line keeps every field it had and adds the status.
        let line = jsonl(&[cases[1].0.clone()]).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["verdict"]["class"], "known");
        assert_eq!(v["id"], "6.1/basic");
        assert_eq!(v["wall_secs"], 3.44);
        assert_eq!(v["kcidb_status"], "FAIL");
        assert_eq!(v["known"], true);
    }

    #[test]
    fn line_and_summary() {
        let rs = vec![
            result("6.12", Verdict::Ok),
            result("6.1", Verdict::Panic("Kernel panic <x>".into())),
        ];
        assert_eq!(trial_line(&rs[0]), "6.12/basic ... ok (3.4 s, tcg)");
        let s = Summary::of(&rs);
        assert!(!s.all_ok());
        assert_eq!(s.line(), "1 passed, 1 failed (1 panic)");
        let x = junit(&rs);
        assert!(
            x.contains("<error type=\"panic\" message=\"panic\">Kernel panic &lt;x&gt;</error>")
        );
        assert!(x.contains("tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\""));
    }

    #[test]
    fn skipped_known_and_fixed() {
        let rs = vec![
            result(
                "6.1",
                Verdict::Skipped(
                    "jit-optional: writing 0 to /proc/sys/net/core/bpf_jit_enable: EINVAL".into(),
                ),
            ),
            result(
                "6.12",
                Verdict::Known("known bug: size-grows\n  size-grows (rule parse): …".into()),
            ),
            result(
                "7.3",
                Verdict::Fixed("FIXED? size-grows no longer shows on 7.3\n  details".into()),
            ),
        ];
        assert_eq!(
            trial_line(&rs[0]),
            "6.1/basic ... SKIPPED (jit-optional: writing 0 to /proc/sys/net/core/bpf_jit_enable: EINVAL) (3.4 s, tcg)"
        );
        assert_eq!(
            trial_line(&rs[1]),
            "6.12/basic ... KNOWN (size-grows) (3.4 s, tcg)"
        );
        assert_eq!(
            trial_line(&rs[2]),
            "7.3/basic ... FIXED? size-grows no longer shows on 7.3 (3.4 s, tcg)"
        );
        assert!(failure_details(&rs[0]).is_none());
        assert!(failure_details(&rs[1]).unwrap().contains("rule parse"));
        let s = Summary::of(&rs);
        assert!(!s.all_ok(), "FIXED? fails the run");
        assert_eq!(
            s.line(),
            "0 passed, 1 failed (1 FIXED? (known issue no longer shows: update the ledger)), 1 known bug, 1 skipped"
        );
        let ok = Summary::of(&rs[..2]);
        assert!(ok.all_ok(), "skipped and known do not fail the run");
        assert!(ok.success(false));
        // Only skipped: nothing was tested, not a success unless allowed.
        let none = Summary::of(&rs[..1]);
        assert!(none.all_ok() && none.nothing_ran());
        assert!(!none.success(false) && none.success(true));
        assert!(!Summary::of(&[]).nothing_ran());
        assert_eq!(ok.line(), "0 passed, 0 failed, 1 known bug, 1 skipped");
        let lines = not_passed_lines(&rs);
        assert_eq!(lines.len(), 3);
        assert!(lines[1].ends_with("(known bug)"));
        let x = junit(&rs);
        assert!(x.contains("<skipped message=\"SKIPPED (jit-optional: writing 0 to /proc/sys/net/core/bpf_jit_enable: EINVAL)\">"), "{x}");
        assert!(
            x.contains("<skipped message=\"known bug: KNOWN (size-grows)\">"),
            "{x}"
        );
        assert!(
            x.contains("<failure message=\"FIXED? size-grows no longer shows on 7.3\">"),
            "{x}"
        );
        assert!(
            x.contains("tests=\"1\" failures=\"0\" errors=\"0\" skipped=\"1\""),
            "{x}"
        );
        let json = serde_json::to_string(&rs[0]).unwrap();
        assert!(
            json.contains("\"verdict\":{\"class\":\"skipped\",\"message\":\"jit-optional: "),
            "{json}"
        );
        for r in &rs {
            assert_ne!(r.verdict, Verdict::Ok);
        }
        assert!(
            !rs[0].verdict.fails_run() && !rs[1].verdict.fails_run() && rs[2].verdict.fails_run()
        );
    }
}
