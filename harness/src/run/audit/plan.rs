//! The audit's decisions over recorded outcomes, with no VM: which builds
//! of a series to boot (the newest, the oldest, then `bisect`'s search
//! between them when the two ends disagree), what every build of the
//! series is then taken to be, and the backport gaps across series.
//!
//! A build's answer for one reproducer comes from a `probe` closure, so the
//! same code runs over a boot (`super::run`) and over a test's list.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::judge::bisect::{search, SearchResult, StepVerdict};
use crate::run::standalone::ReproOutcome;

/// One reproducer's answer on one build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", content = "why", rename_all = "kebab-case")]
pub enum Answer {
    /// Exit 1: the bug shows.
    Affected,
    /// Exit 0: it does not.
    Clean,
    /// Exit 77: the reproducer cannot run on this kernel (its reason).
    CannotRun(String),
    /// No exit status (a panic, a timeout, the build could not be had):
    /// why. Never kept, so the next audit boots the build again.
    NoAnswer(String),
    /// The mirror does not serve the build's image package (it lists it
    /// without serving it, or it is gone since the listing): why. Not a
    /// failure of the audit; never kept either.
    NotServed(String),
}

impl Answer {
    /// From a stand-alone run's outcome.
    pub fn of(o: &ReproOutcome) -> Answer {
        match o {
            ReproOutcome::Reproduces(_) => Answer::Affected,
            ReproOutcome::DoesNotReproduce => Answer::Clean,
            ReproOutcome::CannotRun(why) => Answer::CannotRun(first_line(why)),
            ReproOutcome::NoAnswer(why) => Answer::NoAnswer(first_line(why)),
        }
    }

    /// Affected or clean: an answer the search can use.
    pub fn decisive(&self) -> bool {
        matches!(self, Answer::Affected | Answer::Clean)
    }

    /// A settled answer is kept for the next audit; a missing one is not.
    pub fn settled(&self) -> bool {
        !matches!(self, Answer::NoAnswer(_) | Answer::NotServed(_))
    }

    /// Why there is no answer, when there is none.
    pub fn why_none(&self) -> Option<&str> {
        match self {
            Answer::NoAnswer(why) | Answer::NotServed(why) => Some(why),
            _ => None,
        }
    }

    /// `affected`, `clean`, `cannot run`, `no answer`.
    pub fn label(&self) -> &'static str {
        match self {
            Answer::Affected => "affected",
            Answer::Clean => "clean",
            Answer::CannotRun(_) => "cannot run",
            Answer::NoAnswer(_) => "no answer",
            Answer::NotServed(_) => "not served",
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// What one series says about one reproducer, from the builds booted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesFinding {
    /// Builds the catalog serves in this series (index 0 the oldest).
    pub builds: usize,
    /// Every build whose answer was asked for, by index.
    pub probed: BTreeMap<usize, Answer>,
    /// The newest build that answered (affected, clean or cannot run):
    /// the series' answer "now".
    pub newest_answered: Option<usize>,
    /// How the series changes between its ends, when the ends disagree.
    pub change: Option<Change>,
    /// Why the series could not be bisected although its newest build
    /// answered (the oldest cannot run, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Where a series changes: the last build that answers like the oldest
/// and the first that answers like the newest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `Affected` → `Clean`: fixed inside the series; the other way: a
    /// regression.
    pub from: Answer,
    pub to: Answer,
    pub last_before: usize,
    pub first_after: usize,
    /// Builds between them that could not answer: the change is in one of
    /// them or in `first_after`.
    pub undecided_between: Vec<usize>,
}

/// How many builds below the newest are tried when the newer ones give
/// no answer (a build the mirror lists but no longer serves whole, say),
/// before the series is left unanswered.
pub const NEWEST_FALLBACKS: usize = 3;

/// Audits one series of `n` builds for one reproducer: the newest build
/// (or, when it gives no answer, the next older, at most
/// [`NEWEST_FALLBACKS`] times), then the oldest, then, when both answered
/// and disagree, `bisect`'s search between them
/// ([`crate::judge::bisect::search`]), so at most about `2 + log2(n)`
/// builds are asked.
pub fn audit_series(n: usize, probe: &mut dyn FnMut(usize) -> Answer) -> SeriesFinding {
    let mut probed = BTreeMap::new();
    let mut finding = SeriesFinding {
        builds: n,
        probed: BTreeMap::new(),
        newest_answered: None,
        change: None,
        note: None,
    };
    let mut top = None;
    for i in (0..n).rev().take(NEWEST_FALLBACKS + 1) {
        let a = probe(i);
        probed.insert(i, a.clone());
        if a.settled() {
            top = Some((i, a));
            break;
        }
    }
    let Some((top, newest)) = top else {
        finding.probed = probed;
        return finding;
    };
    finding.newest_answered = Some(top);
    if top + 1 < n {
        finding.note = Some(format!(
            "the newest {} build(s) gave no answer: the series is judged by the newest that did",
            n - 1 - top
        ));
    }
    if top > 0 && newest.decisive() {
        let oldest = probe(0);
        probed.insert(0, oldest.clone());
        if !oldest.decisive() {
            finding.note = Some(format!(
                "the oldest build answers `{}`: where the series changed is not searched",
                oldest.label()
            ));
        } else if oldest != newest {
            let result: SearchResult = search(top + 1, |i| {
                let a = probe(i);
                probed.insert(i, a.clone());
                if a == oldest {
                    StepVerdict::Old
                } else if a == newest {
                    StepVerdict::New
                } else {
                    StepVerdict::Skip(a.label().to_string())
                }
            });
            finding.change = Some(Change {
                from: oldest,
                to: newest,
                last_before: result.last_old,
                first_after: result.first_new,
                undecided_between: result.skipped_between,
            });
        }
    }
    finding.probed = probed;
    finding
}

/// What a build of the series is taken to be: its own answer when it was
/// booted, else the answer of the side of the change it lies on (a fix
/// found inside a series is assumed to stay, as a bisection assumes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BuildState {
    Affected,
    Clean,
    CannotRun,
    /// Not booted and not between two answers that agree.
    Unknown,
}

impl SeriesFinding {
    /// The answer of the newest build that answered (else the newest's
    /// own, no answer, when none did).
    pub fn newest(&self) -> Option<&Answer> {
        self.newest_answered
            .or(self.builds.checked_sub(1))
            .and_then(|i| self.probed.get(&i))
    }

    /// Every build's state, index 0 the oldest.
    pub fn states(&self) -> Vec<BuildState> {
        let of = |a: &Answer| match a {
            Answer::Affected => BuildState::Affected,
            Answer::Clean => BuildState::Clean,
            Answer::CannotRun(_) => BuildState::CannotRun,
            Answer::NoAnswer(_) | Answer::NotServed(_) => BuildState::Unknown,
        };
        (0..self.builds)
            .map(|i| {
                if let Some(a) = self.probed.get(&i) {
                    return of(a);
                }
                if self.newest_answered.is_some_and(|top| i > top) {
                    return BuildState::Unknown;
                }
                match (&self.change, self.probed.get(&0), self.newest()) {
                    (Some(c), _, _) if c.undecided_between.contains(&i) => BuildState::Unknown,
                    (Some(c), _, _) if i < c.last_before => of(&c.from),
                    (Some(c), _, _) if i > c.first_after => of(&c.to),
                    (Some(_), _, _) => BuildState::Unknown,
                    // Both ends agree: the builds between are taken to agree.
                    (None, Some(old), Some(new)) if old == new && old.decisive() => of(old),
                    _ => BuildState::Unknown,
                }
            })
            .collect()
    }

    /// (affected, clean, cannot run, unknown) builds.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for s in self.states() {
            match s {
                BuildState::Affected => c.affected += 1,
                BuildState::Clean => c.clean += 1,
                BuildState::CannotRun => c.cannot_run += 1,
                BuildState::Unknown => c.unknown += 1,
            }
        }
        c
    }

    /// The first fixed build's index, when the series was fixed inside.
    pub fn first_fixed(&self) -> Option<usize> {
        self.change
            .as_ref()
            .filter(|c| c.from == Answer::Affected && c.to == Answer::Clean)
            .map(|c| c.first_after)
    }
}

/// How many builds of a series are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub affected: usize,
    pub clean: usize,
    pub cannot_run: usize,
    pub unknown: usize,
}

/// A series still affected (its newest build) by a bug another series has
/// not (its newest build is clean): a backport the affected series lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// The reproducer.
    pub reproducer: String,
    /// The affected series.
    pub series: String,
    /// Series whose newest build is clean: each with its first fixed
    /// build when the fix was found inside it (a backport there), none when
    /// every build answered clean (the series has had it all along).
    pub fixed_in: Vec<FixedIn>,
    /// The upstream commit, when the ledger or the fix entry knows it.
    pub upstream: Option<String>,
}

/// A series that has the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedIn {
    pub series: String,
    /// Its first fixed build (a version), when found inside the series.
    pub first_fixed: Option<String>,
}

/// One series' finding for one reproducer, as the gap logic reads it.
pub struct SeriesView<'a> {
    pub series: &'a str,
    /// The series' build versions, oldest first.
    pub versions: &'a [String],
    pub finding: &'a SeriesFinding,
}

/// The backport gaps of one reproducer over every series: each series
/// whose newest build is affected, when some other series' newest is clean.
pub fn gaps(reproducer: &str, series: &[SeriesView<'_>], upstream: Option<&str>) -> Vec<Gap> {
    let fixed_in: Vec<FixedIn> = series
        .iter()
        .filter(|s| s.finding.newest() == Some(&Answer::Clean))
        .map(|s| FixedIn {
            series: s.series.to_string(),
            first_fixed: s
                .finding
                .first_fixed()
                .and_then(|i| s.versions.get(i).cloned()),
        })
        .collect();
    if fixed_in.is_empty() {
        return Vec::new();
    }
    series
        .iter()
        .filter(|s| s.finding.newest() == Some(&Answer::Affected))
        .map(|s| Gap {
            reproducer: reproducer.to_string(),
            series: s.series.to_string(),
            fixed_in: fixed_in.clone(),
            upstream: upstream.map(str::to_string),
        })
        .collect()
}

/// Why a series gave no answer for a reproducer (none of the builds
/// asked answered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unanswerable {
    /// Every build asked was one the mirror does not serve: nothing the
    /// audit can do until the mirror serves one.
    NotServed,
    /// A build that could be had gave no answer (a panic, a timeout, a
    /// reproducer that did not build, a download that failed on the way):
    /// someone has to look.
    NoAnswer,
}

/// A series left without an answer for one reproducer, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unanswered {
    pub reproducer: String,
    pub series: String,
    pub cause: Unanswerable,
    /// The builds asked, newest first, each with why it gave no answer.
    pub builds: Vec<(String, String)>,
}

/// Whether `finding` left its series without an answer, and why: only the
/// mirror (every build asked is [`Answer::NotServed`]) or a build that
/// could be had and still did not answer.
pub fn unanswered(reproducer: &str, view: &SeriesView<'_>) -> Option<Unanswered> {
    let f = view.finding;
    if f.newest_answered.is_some() {
        return None;
    }
    let cause = if f.probed.values().all(|a| matches!(a, Answer::NotServed(_))) {
        Unanswerable::NotServed
    } else {
        Unanswerable::NoAnswer
    };
    let builds = f
        .probed
        .iter()
        .rev()
        .map(|(i, a)| {
            (
                view.versions
                    .get(*i)
                    .cloned()
                    .unwrap_or_else(|| i.to_string()),
                a.why_none().unwrap_or(a.label()).to_string(),
            )
        })
        .collect();
    Some(Unanswered {
        reproducer: reproducer.to_string(),
        series: view.series.to_string(),
        cause,
        builds,
    })
}

/// Orders series names as versions (`5.10` before `6.1` before `6.12`).
pub fn series_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| -> Vec<u64> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    use Answer::{Affected as A, Clean as C};

    /// A series recorded as one answer per build; `probe` counts the boots.
    fn run(answers: &[Answer]) -> (SeriesFinding, Vec<usize>) {
        let mut asked = Vec::new();
        let f = audit_series(answers.len(), &mut |i| {
            asked.push(i);
            answers[i].clone()
        });
        (f, asked)
    }

    /// The 34 Debian 6.12 cloud builds as the ledger's bisection found
    /// them: affected up to 6.12.111-1 (index 23), fixed from 6.12.113
    /// (index 24).
    #[test]
    fn a_fix_inside_a_series_is_found_in_log_n_boots() {
        let answers: Vec<Answer> = (0..34).map(|i| if i < 24 { A } else { C }).collect();
        let (f, asked) = run(&answers);
        assert_eq!(&asked[..2], &[33, 0], "the newest first, then the oldest");
        assert!(asked.len() <= 2 + 6, "O(log n): {asked:?}");
        let c = f.change.clone().unwrap();
        assert_eq!((c.last_before, c.first_after), (23, 24));
        assert_eq!(f.first_fixed(), Some(24));
        assert_eq!(
            f.counts(),
            Counts {
                affected: 24,
                clean: 10,
                cannot_run: 0,
                unknown: 0
            }
        );
    }

    #[test]
    fn agreeing_ends_are_not_bisected() {
        let (f, asked) = run(&[A, A, A, A, A]);
        assert_eq!(asked, vec![4, 0]);
        assert_eq!(f.change, None);
        assert_eq!(f.counts().affected, 5);
        let (f, asked) = run(&[C, C, C]);
        assert_eq!(asked, vec![2, 0]);
        assert_eq!(f.counts().clean, 3);
        assert_eq!(f.first_fixed(), None);
        // One build: only the newest.
        let (f, asked) = run(&[A]);
        assert_eq!(asked, vec![0]);
        assert_eq!(f.counts().affected, 1);
    }

    #[test]
    fn a_build_that_cannot_run_is_skipped_as_bisect_skips() {
        let no = Answer::CannotRun("CANNOT RUN: JIT always on".into());
        // Index 4 would be the first midpoint: it cannot run, a neighbour
        // is asked instead, and the change is still found.
        let answers = vec![A, A, A, A, no.clone(), C, C, C, C];
        let (f, asked) = run(&answers);
        assert!(asked.contains(&4), "{asked:?}");
        let c = f.change.clone().unwrap();
        assert_eq!(c.first_after, 5);
        assert!(c.undecided_between.contains(&4) || c.last_before == 3);
        assert_eq!(f.counts().cannot_run, 1);
        // The newest cannot run: nothing older is booted for this reproducer.
        let (f, asked) = run(&[A, A, no.clone()]);
        assert_eq!(asked, vec![2]);
        assert_eq!(f.counts().cannot_run, 1);
        assert_eq!(f.counts().unknown, 2);
        // The oldest cannot run: no search, and the series says why.
        let (f, asked) = run(&[no, A, C]);
        assert_eq!(asked, vec![2, 0]);
        assert!(f.note.as_deref().unwrap().contains("cannot run"));
    }

    /// The newest builds cannot be had (the mirror lists them but no
    /// longer serves their modules package): the next older answers for
    /// the series, and the search runs below it.
    #[test]
    fn a_newest_build_with_no_answer_falls_back_to_the_next() {
        let gone = Answer::NoAnswer("INFRA: pinning: the mirror no longer serves it".into());
        let (f, asked) = run(&[A, A, A, C, C, gone.clone(), gone.clone()]);
        assert_eq!(&asked[..4], &[6, 5, 4, 0]);
        assert_eq!(f.newest_answered, Some(4));
        assert_eq!(f.newest(), Some(&C));
        assert_eq!(f.first_fixed(), Some(3));
        assert!(f
            .note
            .as_deref()
            .unwrap()
            .contains("newest 2 build(s) gave no answer"));
        let c = f.counts();
        assert_eq!((c.affected, c.clean, c.unknown), (3, 2, 2));
        // Every build gone: at most NEWEST_FALLBACKS + 1 are tried.
        let (f, asked) = run(&vec![gone; 10]);
        assert_eq!(asked.len(), NEWEST_FALLBACKS + 1);
        assert_eq!(f.newest_answered, None);
        assert!(matches!(f.newest(), Some(Answer::NoAnswer(_))));
    }

    #[test]
    fn a_regression_is_bisected_the_other_way() {
        let (f, _) = run(&[C, C, C, A, A]);
        let c = f.change.clone().unwrap();
        assert_eq!((c.from.clone(), c.to.clone(), c.first_after), (C, A, 3));
        assert_eq!(f.first_fixed(), None, "not a fix");
    }

    fn versions(series: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{series}.{i}-1")).collect()
    }

    /// The header-size bug as the ledger bounds it: 5.10 and 6.1 affected,
    /// 6.12 fixed inside the series, 7.x clean throughout; plus a newer
    /// series still affected (what the host's 6.18.44 showed).
    #[test]
    fn a_series_still_affected_while_others_are_fixed_is_a_gap() {
        let f = |answers: &[Answer]| run(answers).0;
        let f510 = f(&[A, A, A]);
        let f61 = f(&[A, A]);
        let f612 = f(&[A, A, A, C, C]);
        let f618 = f(&[A, A]);
        let f73 = f(&[C, C]);
        let v: Vec<(String, Vec<String>)> = [
            ("5.10", 3),
            ("6.1", 2),
            ("6.12", 5),
            ("6.18", 2),
            ("7.3", 2),
        ]
        .iter()
        .map(|(s, n)| (s.to_string(), versions(s, *n)))
        .collect();
        let findings = [&f510, &f61, &f612, &f618, &f73];
        let views: Vec<SeriesView<'_>> = v
            .iter()
            .zip(findings)
            .map(|((s, vs), f)| SeriesView {
                series: s,
                versions: vs,
                finding: f,
            })
            .collect();
        let g = gaps("hs", &views, Some("b9d1fdc6f4ac"));
        let gap_series: Vec<&str> = g.iter().map(|g| g.series.as_str()).collect();
        assert_eq!(gap_series, vec!["5.10", "6.1", "6.18"]);
        assert_eq!(
            g[0].fixed_in,
            vec![
                FixedIn {
                    series: "6.12".into(),
                    first_fixed: Some("6.12.3-1".into())
                },
                FixedIn {
                    series: "7.3".into(),
                    first_fixed: None
                }
            ]
        );
        assert_eq!(g[0].upstream.as_deref(), Some("b9d1fdc6f4ac"));
        // A bug no series has fixed (the interpreter's) has no gap, nor
        // does a series whose newest build cannot run.
        let all_affected = [SeriesView {
            series: "6.1",
            versions: &v[1].1,
            finding: &f61,
        }];
        assert!(gaps("ip", &all_affected, None).is_empty());
        let cannot = f(&[A, Answer::CannotRun("x".into())]);
        let views = [
            SeriesView {
                series: "6.1",
                versions: &v[1].1,
                finding: &cannot,
            },
            SeriesView {
                series: "7.3",
                versions: &v[4].1,
                finding: &f73,
            },
        ];
        assert!(gaps("hs", &views, None).is_empty());
    }

    #[test]
    fn series_sort_as_versions() {
        let mut s = vec!["6.12", "7.3", "5.10", "6.1", "6.18", "6.16"];
        s.sort_by(|a, b| series_order(a, b));
        assert_eq!(s, vec!["5.10", "6.1", "6.12", "6.16", "6.18", "7.3"]);
    }

    fn not_served(v: &str) -> Answer {
        Answer::NotServed(format!("the mirror no longer serves linux-binary-{v}"))
    }

    /// The newest builds of a series the mirror lists without serving: the
    /// next older is asked, and a served one answers for the series.
    #[test]
    fn a_build_not_served_is_passed_over_and_never_kept() {
        let answers = [C, A, not_served("c"), not_served("d")];
        let (f, asked) = run(&answers);
        assert_eq!(f.newest_answered, Some(1));
        assert_eq!(asked, vec![3, 2, 1, 0]);
        assert!(!not_served("x").settled() && !not_served("x").decisive());
        assert_eq!(not_served("x").label(), "not served");
        let versions: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let view = SeriesView {
            series: "6.19",
            versions: &versions,
            finding: &f,
        };
        assert_eq!(unanswered("r", &view), None);
    }

    /// A series whose every build asked is not served is unanswered
    /// because of the mirror; one with a build that was had and did not
    /// answer (a panic) needs a look.
    #[test]
    fn an_unanswered_series_says_whether_only_the_mirror_is_to_blame() {
        let versions: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        let all_gone: Vec<Answer> = versions.iter().map(|v| not_served(v)).collect();
        let (f, asked) = run(&all_gone);
        assert_eq!(asked, vec![4, 3, 2, 1], "the newest and three fallbacks");
        let view = SeriesView {
            series: "7.1",
            versions: &versions,
            finding: &f,
        };
        let u = unanswered("hs", &view).unwrap();
        assert_eq!(u.cause, Unanswerable::NotServed);
        assert_eq!((u.series.as_str(), u.reproducer.as_str()), ("7.1", "hs"));
        assert_eq!(u.builds.len(), 4);
        assert_eq!(u.builds[0].0, "e", "newest first");
        assert!(u.builds[0].1.contains("linux-binary-e"), "{:?}", u.builds);

        let mut mixed = all_gone.clone();
        mixed[3] = Answer::NoAnswer("the kernel panicked".into());
        let (f, _) = run(&mixed);
        let view = SeriesView {
            series: "7.1",
            versions: &versions,
            finding: &f,
        };
        let u = unanswered("hs", &view).unwrap();
        assert_eq!(u.cause, Unanswerable::NoAnswer);
        assert_eq!(
            u.builds[1],
            ("d".to_string(), "the kernel panicked".to_string())
        );
    }
}
