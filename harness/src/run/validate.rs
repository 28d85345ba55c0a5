//! `validate`'s decisions around its A/B: which fix and which ledger ids
//! a run must show fixed, what the run concluded, and `--record`.
//!
//! The builds and the A/B itself are [`kloop_kernels::build`] and
//! [`crate::run::ab`]; the caller draws their progress.

use kloop_kernels::build::SourceSpec;

use crate::judge::ab::Acceptance;
use crate::run::ab::AbRun;
use crate::run::fixes::{self, Fix, FixError};
use crate::run::suite::{Layout, SuiteError};

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
    let ledger = crate::run::suite::load_ledger(layout)?;
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
/// cache or built now), the A/B, and in it each side's trial-seconds (the
/// baseline's reused trials cost none).
pub fn timing_line(total: f64, builds: (f64, bool, bool), ab: &AbRun) -> String {
    let (build_secs, base_cached, cand_cached) = builds;
    let how = |cached: bool| if cached { "cached" } else { "built" };
    let side = |name: &str| {
        let of: Vec<_> = ab.results.iter().filter(|r| r.kernel == name).collect();
        let reused = of.iter().filter(|r| r.reused_from.is_some()).count();
        let secs: f64 = of
            .iter()
            .filter(|r| r.reused_from.is_none())
            .map(|r| r.wall_secs)
            .sum::<f64>()
            + 0.0; // an empty sum is -0.0
        (of.len(), reused, secs)
    };
    let (bn, breused, bsecs) = side(&ab.baseline);
    let (cn, _, csecs) = side(&ab.candidate);
    format!(
        "validate took {total:.1} s: builds {build_secs:.1} s (baseline {}, candidate {}), A/B {:.1} s (baseline: {breused} of {bn} trials reused, {bsecs:.1} trial-s run; candidate: {cn} trials, {csecs:.1} trial-s)",
        how(base_cached),
        how(cand_cached),
        ab.secs
    )
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
