//! `validate`'s decisions around its A/B: which fix and which ledger ids
//! a run must show fixed, what the run concluded, and `--record`.
//!
//! The builds and the A/B itself are [`kloop_kernels::build`] and
//! [`crate::run::ab`]; the caller draws their progress.

use kloop_kernels::build::SourceSpec;

use crate::judge::ab::Acceptance;
use crate::run::ab::AbRun;
use crate::run::fixes::{self, Fix, FixError};
use crate::run::suite::SuiteError;
use crate::workspace::Layout;

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(transparent)]
    Fix(#[from] FixError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error("--fix takes the fix's patch for a pinned source (linux-source-X.Y); for a tree, pass the patch with --patch and the ids with --expect-fixed")]
    FixNeedsPinnedSource,
}

/// The fix `fix` names for `source` (a folder under `kernels/fixes/` or a
/// path to one) and the ledger ids the run must show fixed:
/// `expect_fixed` when given (each must be a ledger id), else the fix's.
pub fn expected_fixes(
    layout: &Layout,
    fix: Option<&str>,
    expect_fixed: &[String],
    source: &SourceSpec,
) -> Result<(Option<Fix>, Vec<String>), ValidateError> {
    let ledger =
        crate::workspace::load_ledger(layout).map_err(crate::run::suite::SuiteError::from)?;
    fixes::check_ids(&ledger, expect_fixed)?;
    let Some(name) = fix else {
        return Ok((None, expect_fixed.to_vec()));
    };
    let SourceSpec::Package(pin) = source else {
        return Err(ValidateError::FixNeedsPinnedSource);
    };
    let fix = fixes::resolve(&layout.kernels(), &ledger, name, &pin.package)?;
    let expected = if expect_fixed.is_empty() {
        fix.ids.clone()
    } else {
        expect_fixed.to_vec()
    };
    Ok((Some(fix), expected))
}

/// validate's closing line (after `validate: `).
pub fn conclusion(accepted: bool, no_patches: bool, expected: &[String]) -> String {
    match (accepted, no_patches, expected.is_empty()) {
        (true, false, false) => format!(
            "FIXED: the patches fix {} and change nothing else kloop checks",
            expected.join(", ")
        ),
        (true, false, true) => "the patches change nothing kloop checks".to_string(),
        (false, false, _) => {
            "REJECTED: the patches do not do what was expected (see above)".to_string()
        }
        (true, true, _) => {
            "no patches: the source against itself is the same (the A/B's noise floor holds)"
                .to_string()
        }
        (false, true, _) => "no patches, yet the source differs from itself: runs of this kernel are not reproducible (see above)".to_string(),
    }
}

/// Where a `validate`'s wall time went: the two builds (each from the
/// cache or built now), the A/B's trials, its reports, and in the A/B each
/// side's trial-seconds (the baseline's reused trials cost none). The run
/// leaves it as [`Timing::FILE`] in its directory, which `cargo xtask bench
/// --validate` reads back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    pub total_secs: f64,
    pub build_secs: f64,
    pub baseline_cached: bool,
    pub candidate_cached: bool,
    /// The A/B's trials and their comparison.
    pub ab_secs: f64,
    /// After the trials: the A/B's reports (and the ledger, `--record`).
    pub report_secs: f64,
    pub baseline: SideTiming,
    pub candidate: SideTiming,
    /// The baseline's trials that ran while the candidate built (part of
    /// `build_secs`), kept for the A/B, which then reused them.
    #[serde(default)]
    pub early_baseline: crate::run::ab::KeptBaseline,
}

/// One side of the A/B: its trials, how many were reused from an earlier
/// run, and the trial-seconds of the others.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SideTiming {
    pub trials: usize,
    pub reused: usize,
    pub trial_secs: f64,
}

impl SideTiming {
    fn of(ab: &AbRun, kernel: &str) -> SideTiming {
        let of: Vec<_> = ab.results.iter().filter(|r| r.kernel == kernel).collect();
        SideTiming {
            trials: of.len(),
            reused: of.iter().filter(|r| r.reused_from.is_some()).count(),
            trial_secs: of
                .iter()
                .filter(|r| r.reused_from.is_none())
                .map(|r| r.wall_secs)
                .sum::<f64>()
                + 0.0, // an empty sum is -0.0
        }
    }
}

impl Timing {
    /// The file a `validate` leaves in its run directory.
    pub const FILE: &'static str = "validate-timing.json";

    /// `total` and `since_ab` (from the A/B's start to now: its trials,
    /// then its reports) in seconds; `builds`: their seconds and whether
    /// each side came from the cache.
    pub fn of(total: f64, builds: (f64, bool, bool), since_ab: f64, ab: &AbRun) -> Timing {
        let (build_secs, baseline_cached, candidate_cached) = builds;
        Timing {
            total_secs: total,
            build_secs,
            baseline_cached,
            candidate_cached,
            ab_secs: ab.secs,
            report_secs: (since_ab - ab.secs).max(0.0),
            baseline: SideTiming::of(ab, &ab.baseline),
            candidate: SideTiming::of(ab, &ab.candidate),
            early_baseline: Default::default(),
        }
    }

    /// With what ran of the baseline while the candidate built.
    pub fn with_early_baseline(self, early: crate::run::ab::KeptBaseline) -> Timing {
        Timing {
            early_baseline: early,
            ..self
        }
    }

    /// The line `validate` prints.
    pub fn line(&self) -> String {
        let how = |cached: bool| if cached { "cached" } else { "built" };
        format!(
            "validate took {:.1} s: builds {:.1} s (baseline {}, candidate {}; meanwhile {} baseline trial(s) ran, {:.1} s), A/B {:.1} s (baseline: {} of {} trials reused, {:.1} trial-s run; candidate: {} trials, {:.1} trial-s), reports {:.1} s",
            self.total_secs,
            self.build_secs,
            how(self.baseline_cached),
            how(self.candidate_cached),
            self.early_baseline.ran,
            self.early_baseline.secs,
            self.ab_secs,
            self.baseline.reused,
            self.baseline.trials,
            self.baseline.trial_secs,
            self.candidate.trials,
            self.candidate.trial_secs,
            self.report_secs,
        )
    }

    /// Writes [`Timing::FILE`] into `run_dir`, atomically.
    pub fn write(&self, run_dir: &std::path::Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("timings serialise");
        kloop_kernels::write_atomically(&run_dir.join(Timing::FILE), text.as_bytes())
    }
}

/// `validate --record`: the result under each expected ledger entry, in
/// the ledger file; returns the line that says so.
pub fn record(
    layout: &Layout,
    fix: &Fix,
    expected: &[String],
    source: &str,
    acceptance: &Acceptance,
    ab: &AbRun,
) -> Result<String, ValidateError> {
    let rel = |p: &std::path::Path| {
        p.strip_prefix(&layout.root)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    let ledger = layout.kernels().join(crate::judge::known_issues::FILE_NAME);
    let v = fixes::Validated {
        patch: rel(&fix.patch),
        source: source.to_string(),
        accepted: acceptance.accepted,
        outcomes: &ab.outcomes,
        date: crate::judge::known_issues::Date::today().to_string(),
        run_dir: rel(&ab.run_dir),
        base: fix.base.iter().map(|p| rel(p)).collect(),
    };
    fixes::record(&ledger, expected, &v)?;
    Ok(format!(
        "recorded in {}: {} {} for {}",
        ledger.display(),
        v.patch,
        if v.accepted { "FIXED" } else { "REJECTED" },
        expected.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    /// Each combination of outcome, patches and expectations has its own
    /// conclusion, and only an accepted run with expectations says FIXED.
    #[test]
    fn conclusions() {
        let ids = ["a-bug".to_string()];
        let c = super::conclusion;
        assert!(c(true, false, &ids).starts_with("FIXED: the patches fix a-bug"));
        assert!(c(true, false, &[]).starts_with("the patches change nothing"));
        assert!(c(false, false, &ids).starts_with("REJECTED"));
        assert!(c(true, true, &[]).starts_with("no patches: the source against itself is the same"));
        assert!(c(false, true, &[]).contains("not reproducible"));
    }
}

#[cfg(test)]
mod timing_tests {
    use super::*;

    #[test]
    fn the_timing_file_reads_back_as_written_and_its_line_names_every_part() {
        let t = Timing {
            total_secs: 61.5,
            build_secs: 30.25,
            baseline_cached: true,
            candidate_cached: false,
            ab_secs: 29.0,
            report_secs: 1.5,
            baseline: SideTiming {
                trials: 41,
                reused: 41,
                trial_secs: 0.0,
            },
            candidate: SideTiming {
                trials: 41,
                reused: 0,
                trial_secs: 55.5,
            },
            early_baseline: crate::run::ab::KeptBaseline {
                already: 38,
                ran: 3,
                secs: 4.25,
            },
        };
        let dir = tempfile::tempdir().unwrap();
        t.write(dir.path()).unwrap();
        let read = crate::run::bench::validate_timing;
        assert_eq!(read(dir.path()).unwrap(), t);
        assert_eq!(
            t.line(),
            "validate took 61.5 s: builds 30.2 s (baseline cached, candidate built; meanwhile 3 \
             baseline trial(s) ran, 4.2 s), A/B 29.0 s \
             (baseline: 41 of 41 trials reused, 0.0 trial-s run; candidate: 41 trials, 55.5 trial-s), reports 1.5 s"
        );
        // A file from before the early baseline reads with none.
        let mut old: serde_json::Value = serde_json::to_value(&t).unwrap();
        old.as_object_mut().unwrap().remove("early_baseline");
        std::fs::write(dir.path().join(Timing::FILE), old.to_string()).unwrap();
        assert_eq!(read(dir.path()).unwrap().early_baseline, Default::default());
        std::fs::write(dir.path().join(Timing::FILE), "{").unwrap();
        assert!(matches!(
            read(dir.path()),
            Err(crate::run::bench::BenchError::Invalid { path, .. }) if path.ends_with(Timing::FILE)
        ));
    }
}
