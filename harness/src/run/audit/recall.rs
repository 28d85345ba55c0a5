//! An audit answered from kept answers alone: no download, no boot.
//!
//! `report-bug --backport` needs the audit's table for one bug, and the
//! audit's run directories are pruned (`KLOOP_KEEP_RUNS`) long before its
//! answers go stale, so the table is recomputed here from what outlives
//! them: the kept (build × reproducer) answers ([`super::kept`]), replayed
//! through the same decisions ([`super::plan::audit_series`]) over the
//! same listing of served builds. What comes out is what a warm
//! `cargo xtask audit ID` would print, or, where a build the decisions ask
//! has no kept answer, the series named with the command that answers it:
//! a missing answer is never guessed (the search would skip it as a build
//! that gave none, and draw another table than the audit would).

use std::collections::BTreeMap;

use kloop_kernels::FetchOptions;

use super::kept::Kept;
use super::plan::{self, Answer};
use super::{AuditError, AuditedReproducer, AuditedSeries, BootRecord, BuildRef};
use crate::workspace::Layout;

/// The kept answers of one reproducer, as an audit.
#[derive(Debug, Clone)]
pub struct Recalled {
    /// The audit a warm `cargo xtask audit ID` would write: every series
    /// whose decisions the kept answers settle, its gaps, and each build
    /// asked as a [`BootRecord`] with no boot (`dir` none, all kept).
    /// `run_dir` is empty: no run made it.
    pub audit: super::Audit,
    /// Series the kept answers do not settle, each with the builds asked
    /// that have no kept answer (newest first).
    pub not_kept: Vec<NotKept>,
    /// The audit runs that booted the builds the table stands on.
    pub runs: Vec<std::path::PathBuf>,
}

/// A series the kept answers do not settle for the reproducer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotKept {
    pub series: String,
    /// Versions asked with no kept answer.
    pub versions: Vec<String>,
}

/// The reproducer of ledger entry `id` over every series the mirror
/// serves (the cached listing while it is fresh, as `audit` takes it),
/// answered from the kept answers of the kernel cache alone.
pub fn recall(layout: &Layout, id: &str, fetch: &FetchOptions) -> Result<Recalled, AuditError> {
    let (found, _) = super::reproducers(layout, &[id.to_string()])?;
    let r = found.into_iter().next().ok_or(AuditError::NothingToAudit)?;
    let cache = kloop_kernels::KernelCache::default_location()?;
    let (served, notes) = kloop_kernels::available::list_cloud_builds(&cache, fetch, false)?;
    // The listing's notes (a suite not asked) are the audit's to print;
    // a series they hide shows here as one not served.
    let _ = notes;
    let text = r.single_file()?;
    let reproducer = AuditedReproducer {
        name: r.name.clone(),
        ids: r.issues.iter().map(|i| i.id.clone()).collect(),
        upstream: super::upstream_of(&layout.kernels(), &r),
    };
    let kept = Kept::in_cache(cache.root());
    let (by_series, names) = super::by_series(served);
    Ok(replay(&reproducer, &names, &by_series, &|b: &BuildRef| {
        kept.get(&Kept::key(&b.identity(), &text))
    }))
}

/// The audit's decisions over `lookup`'s answers: a series is settled
/// when every build the decisions ask has one.
pub(crate) fn replay(
    reproducer: &AuditedReproducer,
    names: &[String],
    by_series: &BTreeMap<String, Vec<kloop_kernels::available::AvailableBuild>>,
    lookup: &dyn Fn(&BuildRef) -> Option<super::kept::KeptAnswer>,
) -> Recalled {
    let mut series = Vec::new();
    let mut not_kept = Vec::new();
    let mut boots = Vec::new();
    let mut runs: Vec<std::path::PathBuf> = Vec::new();
    for name in names {
        let builds: Vec<BuildRef> = by_series[name].iter().map(BuildRef::of).collect();
        let mut missing = Vec::new();
        let mut asked: BTreeMap<usize, super::kept::KeptAnswer> = BTreeMap::new();
        let finding = plan::audit_series(builds.len(), &mut |i| match lookup(&builds[i]) {
            Some(k) => {
                let a = k.answer.clone();
                asked.insert(i, k);
                a
            }
            None => {
                missing.push(i);
                Answer::NoAnswer("no kept answer".into())
            }
        });
        let mut findings = BTreeMap::new();
        if missing.is_empty() {
            findings.insert(reproducer.name.clone(), finding);
            for (i, k) in asked {
                if !runs.contains(&k.run) {
                    runs.push(k.run.clone());
                }
                boots.push(BootRecord {
                    series: name.clone(),
                    version: builds[i].version.clone(),
                    release: k.release,
                    answers: BTreeMap::from([(reproducer.name.clone(), k.answer)]),
                    kept: vec![reproducer.name.clone()],
                    dir: None,
                    secs: 0.0,
                    image_sha256: k.image_sha256,
                    pinned_without: Vec::new(),
                });
            }
        } else {
            missing.sort_unstable_by(|a, b| b.cmp(a));
            missing.dedup();
            not_kept.push(NotKept {
                series: name.clone(),
                versions: missing.iter().map(|&i| builds[i].version.clone()).collect(),
            });
        }
        series.push(AuditedSeries {
            series: name.clone(),
            builds,
            findings,
        });
    }
    let reproducers = vec![reproducer.clone()];
    let gaps = super::all_gaps(&reproducers, &series);
    let unanswered_series = super::all_unanswered(&reproducers, &series);
    runs.sort();
    Recalled {
        audit: super::Audit {
            reproducers,
            without_reproducer: Vec::new(),
            series,
            unserved_series: Vec::new(),
            gaps,
            unanswered_series,
            boots,
            secs: 0.0,
            run_dir: std::path::PathBuf::new(),
            accel: String::new(),
        },
        not_kept,
        runs,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::run::audit::kept::KeptAnswer;
    use kloop_kernels::available::AvailableBuild;

    /// Served builds of `series`, one per version, oldest first (also the
    /// backport mail's tests' catalog).
    pub(crate) fn served(series: &str, versions: &[&str]) -> Vec<AvailableBuild> {
        versions
            .iter()
            .map(|v| AvailableBuild {
                version: v.to_string(),
                package: format!("linux-image-{v}-cloud-amd64"),
                suite: "bookworm".into(),
                release: format!("{v}-cloud-amd64"),
                series: series.into(),
                deb_sha256: Some(format!("sha-{v}")),
            })
            .collect()
    }

    fn reproducer() -> AuditedReproducer {
        AuditedReproducer {
            name: "hdr".into(),
            ids: vec!["hdr".into()],
            upstream: Some("b9d1fdc6f4ac (\"perf: x\")".into()),
        }
    }

    /// Kept answers by version; a version absent was never kept.
    fn lookup(
        answers: &'static [(&'static str, Answer)],
    ) -> impl Fn(&BuildRef) -> Option<KeptAnswer> {
        move |b: &BuildRef| {
            answers
                .iter()
                .find(|(v, _)| *v == b.version)
                .map(|(v, a)| KeptAnswer {
                    answer: a.clone(),
                    version: v.to_string(),
                    release: Some(format!("{v}-cloud-amd64")),
                    image_sha256: None,
                    run: format!("/runs/r-{}", &v[..1]).into(),
                })
        }
    }

    #[test]
    fn kept_answers_replay_into_the_audits_table_and_gaps() {
        let mut all = served("6.1", &["6.1.1", "6.1.2", "6.1.3"]);
        all.extend(served("6.12", &["6.12.1", "6.12.2", "6.12.3", "6.12.4"]));
        let (by, names) = crate::run::audit::by_series(all);
        static ANSWERS: &[(&str, Answer)] = &[
            ("6.1.1", Answer::Affected),
            ("6.1.3", Answer::Affected),
            ("6.12.1", Answer::Affected),
            ("6.12.2", Answer::Affected),
            ("6.12.3", Answer::Clean),
            ("6.12.4", Answer::Clean),
        ];
        let r = replay(&reproducer(), &names, &by, &lookup(ANSWERS));
        assert!(r.not_kept.is_empty(), "{:?}", r.not_kept);
        assert_eq!(r.audit.gaps.len(), 1);
        let g = &r.audit.gaps[0];
        assert_eq!(g.series, "6.1");
        assert_eq!(g.fixed_in[0].first_fixed.as_deref(), Some("6.12.3"));
        // Every build the decisions asked is a boot record with no boot.
        assert!(r
            .audit
            .boots
            .iter()
            .all(|b| b.dir.is_none() && b.kept == ["hdr"]));
        assert_eq!(r.runs, vec![std::path::PathBuf::from("/runs/r-6")]);
    }

    /// A build the decisions ask without a kept answer is never guessed:
    /// the series is left out of the table and named.
    #[test]
    fn a_series_with_a_missing_answer_is_named_not_guessed() {
        let mut all = served("6.1", &["6.1.1", "6.1.2"]);
        all.extend(served("6.18", &["6.18.1", "6.18.2"]));
        let (by, names) = crate::run::audit::by_series(all);
        static ANSWERS: &[(&str, Answer)] =
            &[("6.1.1", Answer::Affected), ("6.1.2", Answer::Affected)];
        let r = replay(&reproducer(), &names, &by, &lookup(ANSWERS));
        assert_eq!(
            r.not_kept,
            vec![NotKept {
                series: "6.18".into(),
                versions: vec!["6.18.2".into(), "6.18.1".into()],
            }]
        );
        let s618 = r.audit.series.iter().find(|s| s.series == "6.18").unwrap();
        assert!(s618.findings.is_empty());
        assert!(r.audit.gaps.is_empty());
    }
}
