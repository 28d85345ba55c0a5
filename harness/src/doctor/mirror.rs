//! The mirror kloop derives from the host's apt sources, and the suites
//! it serves.

use super::*;

pub(super) fn mirror_fix() -> String {
    format!(
        "export {MIRROR_ENV}=<URL of a Debian mirror: the archive root that holds dists/ and \
         pool/> (in GitHub Actions: a repository variable {MIRROR_ENV})"
    )
}

pub(super) fn check_mirror(
    opts: &DoctorOptions,
    cache: Option<&KernelCache>,
    catalog: Option<&Catalog>,
    uncached: &[String],
) -> Vec<Check> {
    // Without network a run still works from the cache; only kernels not
    // yet cached make an unreachable mirror a failure.
    let needed = |detail: String, fix: String| {
        if uncached.is_empty() {
            Check::warn("mirror", detail + " (every pinned kernel is cached)", fix)
        } else {
            Check::fail(
                "mirror",
                format!("{detail}; kernels not cached yet: {}", uncached.join(", ")),
                fix,
            )
        }
    };
    let mirror = match opts.fetch.locate_mirror() {
        Ok(m) => m,
        Err(e) => return vec![needed(e.to_string(), mirror_fix())],
    };
    let Some(cache) = cache else {
        return vec![Check::warn(
            "mirror",
            format!(
                "{} (from {}); not asked: no kernel cache for apt's state",
                mirror.url, mirror.origin
            ),
            "fix the cache line above, then cargo xtask doctor",
        )];
    };
    if opts.fetch.offline {
        return vec![Check::ok(
            "mirror",
            format!(
                "{} (from {}); not asked (--offline)",
                mirror.url, mirror.origin
            ),
        )];
    }
    // Reachability: the suite of the first pin (the one a run needs first).
    let first = catalog
        .and_then(|c| c.pins().first())
        .map_or("sid", |p| p.suite.as_str());
    let release = match first_release(cache, &mirror.url, first, opts.mirror_deadline) {
        Ok(release) => release,
        Err(why) => {
            return vec![needed(
                format!(
                    "{} (from {}) did not answer: {why}",
                    mirror.url, mirror.origin
                ),
                format!(
                    "check the network or the proxy apt uses, or {}",
                    mirror_fix()
                ),
            )]
        }
    };
    let mut checks = vec![Check::ok(
        "mirror",
        format!(
            "{} (from {}); {first}'s Release in {:.1} s{}",
            mirror.url,
            mirror.origin,
            release.took.as_secs_f64(),
            release
                .date
                .map(|d| format!(", dated {d}"))
                .unwrap_or_default()
        ),
    )];
    checks.push(suites_check(
        cache,
        &mirror.url,
        opts.mirror_deadline,
        catalog,
        uncached,
    ));
    checks
}

/// Why the mirror's first suite gave no Release file.
#[derive(Debug, thiserror::Error)]
enum NoRelease {
    #[error("no answer")]
    NoAnswer,
    #[error(transparent)]
    Probe(#[from] kloop_kernels::KernelError),
}

/// The Release file of `suite` on the mirror, or why it did not come.
fn first_release(
    cache: &KernelCache,
    mirror_url: &str,
    suite: &str,
    deadline: Duration,
) -> Result<kloop_kernels::available::SuiteRelease, NoRelease> {
    probe_suites(cache, mirror_url, &[suite], deadline)
        .into_iter()
        .next()
        .map_or(Err(NoRelease::NoAnswer), |(_, r)| Ok(r?))
}

/// Which Debian suites the mirror serves, and whether a pin's suite is gone
/// (a failure only for a pin not cached yet).
fn suites_check(
    cache: &KernelCache,
    mirror_url: &str,
    deadline: Duration,
    catalog: Option<&Catalog>,
    uncached: &[String],
) -> Check {
    let suites = probe_suites(cache, mirror_url, DEBIAN_SUITES, deadline);
    let served: Vec<&str> = suites
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(s, _)| s.as_str())
        .collect();
    let missing: Vec<&str> = suites
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(s, _)| s.as_str())
        .collect();
    let mut detail = format!(
        "{} of {} served: {}",
        served.len(),
        suites.len(),
        if served.is_empty() {
            "none".to_string()
        } else {
            served.join(", ")
        }
    );
    if !missing.is_empty() {
        detail += &format!("; not served: {}", missing.join(", "));
    }
    // A pin whose suite is gone can still run from the cache, but cannot
    // be fetched on a new machine.
    let stranded: Vec<String> = catalog
        .map(|c| {
            c.pins()
                .iter()
                .filter(|p| missing.contains(&p.suite.as_str()))
                .map(|p| format!("{} ({})", p.id, p.suite))
                .collect()
        })
        .unwrap_or_default();
    if stranded.is_empty() {
        Check::ok("suites", detail)
    } else {
        let stranded_uncached = stranded
            .iter()
            .any(|s| uncached.iter().any(|u| s.starts_with(&format!("{u} "))));
        let detail = format!(
            "{detail}; pins from a suite not served: {}",
            stranded.join(", ")
        );
        let fix = format!(
            "re-pin with cargo xtask kernels update <id>, or {}",
            mirror_fix()
        );
        if stranded_uncached {
            Check::fail("suites", detail, fix)
        } else {
            Check::warn("suites", detail + " (cached here)", fix)
        }
    }
}
