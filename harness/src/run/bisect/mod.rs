//! Running a bisection over an ordered list of kernels: each step boots a
//! kernel `repeat` times with one scenario, turns each run into an
//! observation for the predicate ([`observe`]), and the runs into a
//! verdict ([`crate::judge::bisect::decide`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::judge::bisect::{
    self, classify, decide, Observation, Predicate, RunClass, SearchResult, StepVerdict,
};
use crate::run::suite::{run_all, PlannedTrial};
use crate::run::trial::{KernelUnderTest, TrialEnv, TrialResult};
use crate::scenario::Scenario;

pub use crate::judge::bisect::FIELDS_FILE;

pub mod distro;
pub mod tree;

/// What one run showed for `pred`.
pub fn observe(pred: &Predicate, r: &TrialResult) -> Observation {
    let normalised = read(&r.artefacts.join("normalised.txt"));
    if !r.verdict.records_judged() || normalised.is_none() {
        return Observation::NoVerdict(r.verdict.headline());
    }
    match pred {
        Predicate::Snapshot => Observation::Text(normalised.unwrap_or_default()),
        Predicate::Rule(rule) => {
            Observation::Text(if r.violations.iter().any(|v| &v.rule == rule) {
                format!("{rule} breaks")
            } else {
                format!("{rule} holds")
            })
        }
        Predicate::Field { key, label } => {
            let fields: Option<
                std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
            > = read(&r.artefacts.join(FIELDS_FILE)).and_then(|t| serde_json::from_str(&t).ok());
            match fields.as_ref().and_then(|f| f.get(label)) {
                Some(f) => Observation::Text(f.get(key).cloned().unwrap_or_default()),
                None => {
                    Observation::NoVerdict(format!("no program labelled `{label}` in this run"))
                }
            }
        }
        Predicate::Overhead(figure) => {
            let oh: Option<crate::judge::overhead::TrialOverhead> =
                read(&r.artefacts.join(crate::run::trial::overhead::TRIAL_FILE))
                    .and_then(|t| serde_json::from_str(&t).ok());
            match oh.and_then(|o| o.figures.into_iter().find(|f| &f.name == figure)) {
                Some(f) => Observation::Figure(f.value),
                None => {
                    Observation::NoVerdict(format!("no overhead figure `{figure}` in this run"))
                }
            }
        }
    }
}

/// Runs `scenario` on `kernel` `repeat` times (on `jobs` VMs) and
/// observes each run for `pred`.
pub fn observe_kernel(
    env: &TrialEnv,
    scenario: &Scenario,
    kernel: &KernelUnderTest,
    pred: &Predicate,
    repeat: usize,
    jobs: usize,
) -> (Vec<Observation>, Vec<TrialResult>) {
    let trials: Vec<PlannedTrial> = (0..repeat.max(1))
        .map(|_| PlannedTrial {
            kernel: kernel.clone(),
            scenario: scenario.clone(),
        })
        .collect();
    let results = run_all(
        env,
        &trials,
        crate::run::suite::Parallel::jobs(jobs),
        &|_| {},
    );
    (results.iter().map(|r| observe(pred, r)).collect(), results)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// One step as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub index: usize,
    pub kernel: String,
    pub verdict: StepVerdict,
    /// Each run: its class, its verdict line, its artefacts.
    pub runs: Vec<(RunClass, String, PathBuf)>,
    pub secs: f64,
}

impl StepReport {
    pub fn usable(&self) -> usize {
        self.runs
            .iter()
            .filter(|(c, _, _)| !matches!(c, RunClass::NoVerdict(_)))
            .count()
    }
}

/// A finished bisection.
#[derive(Debug, Clone, Serialize)]
pub struct BisectOutcome {
    pub predicate: Predicate,
    pub kernels: Vec<String>,
    pub search: SearchResult,
    pub steps: Vec<StepReport>,
    pub confidence: f64,
    /// What differs between the last old and the first new build (stream
    /// diff, rule messages, field values, figures).
    pub difference: Vec<String>,
}

/// Why a bisection could not start.
#[derive(Debug, thiserror::Error)]
pub enum BisectError {
    #[error("the old end {kernel} gave no usable reference: {why}")]
    OldEnd { kernel: String, why: String },
    #[error("the new end {kernel} is not new under this predicate ({why}); nothing to bisect")]
    NewEnd { kernel: String, why: String },
    #[error("bisecting needs at least the two ends; got {0} kernel(s)")]
    TooFew(usize),
}

/// Why a step's kernel could not be had: that step has no verdict (and
/// the search treats it as a skip).
#[derive(Debug, thiserror::Error)]
pub enum KernelUnavailable {
    /// Fetching or pinning it failed.
    #[error("INFRA: {0}")]
    Infrastructure(String),
    /// Building it failed (the compiler's or the linker's error).
    #[error("BUILD FAILED: {0}")]
    Build(String),
}

/// The distro builds a bisection walks, in search order, each obtained
/// when a step needs it: a pin's build as that pin, any other build pinned
/// on the way (`kernels/bisect.lock`).
pub struct DistroBuilds<'a> {
    pub builds: &'a [kloop_kernels::available::AvailableBuild],
    pub catalog: &'a kloop_kernels::Catalog,
    pub cache: &'a kloop_kernels::KernelCache,
    /// Where the catalog and the lock live (`kernels/`).
    pub kernels_dir: &'a Path,
    pub lock: kloop_kernels::available::BisectLock,
    pub fetch: kloop_kernels::FetchOptions,
    /// The companion packages the scenario needs ([`needs_of`]).
    pub needs: kloop_kernels::Needs,
}

/// What a bisection of `scenario` needs of a split build besides its
/// image: the modules package when the scenario loads modules, and the
/// `.config` package (the preflight), as a catalog pin has them.
pub fn needs_of(scenario: &Scenario) -> kloop_kernels::Needs {
    kloop_kernels::Needs {
        modules: !scenario.modules.is_empty(),
        config: true,
    }
}

impl DistroBuilds<'_> {
    /// The `i`th build as a kernel under test.
    pub fn kernel_at(&mut self, i: usize) -> Result<KernelUnderTest, KernelUnavailable> {
        let b = &self.builds[i];
        if let Some(p) = self
            .catalog
            .pins()
            .iter()
            .find(|p| p.version == b.version && p.arch() == b.arch())
        {
            return Ok(KernelUnderTest::Pin(p.clone()));
        }
        self.lock
            .ensure(self.cache, self.kernels_dir, b, &self.fetch, self.needs)
            .map(|pin| KernelUnderTest::distro_build(pin, self.catalog))
            .map_err(|e| KernelUnavailable::Infrastructure(format!("pinning {}: {e}", b.version)))
    }
}

/// The band an overhead figure of `scenario` may move in on this run's
/// clock (1 % under TCG -icount, the real-time band otherwise).
pub fn overhead_band(env: &TrialEnv, scenario: &Scenario) -> f64 {
    crate::run::trial::overhead::clock(env.accel.accel(), scenario.vm.icount)
        .default_tolerances()
        .0
}

/// What one bisection searches with: the scenario on the run's
/// environment, the predicate, runs per step and their parallelism, and
/// the band an overhead figure may move in.
#[derive(Clone, Copy)]
pub struct Search<'a> {
    pub env: &'a TrialEnv,
    pub scenario: &'a Scenario,
    pub pred: &'a Predicate,
    /// Runs per step.
    pub repeat: usize,
    pub jobs: usize,
    /// Relative band of an overhead figure.
    pub band: f64,
}

impl<'a> Search<'a> {
    /// A search whose overhead band is the default of `scenario`'s clock on
    /// this run (1 % under TCG -icount, the real-time band otherwise).
    pub fn new(
        env: &'a TrialEnv,
        scenario: &'a Scenario,
        pred: &'a Predicate,
        repeat: usize,
        jobs: usize,
    ) -> Search<'a> {
        Search {
            env,
            scenario,
            pred,
            repeat,
            jobs,
            band: overhead_band(env, scenario),
        }
    }
}

/// Bisects `names.len()` kernels (index 0 the old end, the last the new
/// end), obtaining each with `kernel_at` when a step needs it (a fetch
/// that fails is a skip).
#[expect(clippy::too_many_lines)]
pub fn bisect(
    search: &Search<'_>,
    names: &[String],
    kernel_at: &mut dyn FnMut(usize) -> Result<KernelUnderTest, KernelUnavailable>,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<BisectOutcome, BisectError> {
    let Search {
        env,
        scenario,
        pred,
        repeat,
        jobs,
        band,
    } = *search;
    let n = names.len();
    if n < 2 {
        return Err(BisectError::TooFew(n));
    }
    let mut steps: Vec<StepReport> = Vec::new();
    let mut run_step = |i: usize,
                        reference: Option<&Observation>|
     -> (StepReport, Vec<Observation>, Vec<TrialResult>) {
        let started = Instant::now();
        let (observations, results) = match kernel_at(i) {
            Ok(kernel) => observe_kernel(env, scenario, &kernel, pred, repeat, jobs),
            Err(why) => (vec![Observation::NoVerdict(why.to_string())], Vec::new()),
        };
        let classes: Vec<RunClass> = match reference {
            Some(reference) => observations
                .iter()
                .map(|o| classify(reference, o, band))
                .collect(),
            None => observations
                .iter()
                .map(|o| match o {
                    Observation::NoVerdict(w) => RunClass::NoVerdict(w.clone()),
                    _ => RunClass::Old,
                })
                .collect(),
        };
        let verdict = decide(&classes);
        let runs = classes
            .into_iter()
            .enumerate()
            .map(|(k, c)| {
                let (line, dir) = results
                    .get(k)
                    .map(|r| (r.verdict.headline(), r.artefacts.clone()))
                    .unwrap_or_else(|| {
                        (
                            match &observations[k] {
                                Observation::NoVerdict(w) => w.clone(),
                                _ => String::new(),
                            },
                            PathBuf::new(),
                        )
                    });
                (c, line, dir)
            })
            .collect();
        let report = StepReport {
            index: i,
            kernel: names[i].clone(),
            verdict,
            runs,
            secs: started.elapsed().as_secs_f64(),
        };
        (report, observations, results)
    };

    // The old end sets the reference: its usable runs must agree.
    let (old_report, old_obs, old_results) = run_step(0, None);
    on_step(&old_report);
    let usable: Vec<&Observation> = old_obs
        .iter()
        .filter(|o| !matches!(o, Observation::NoVerdict(_)))
        .collect();
    let Some(reference) = usable.first().map(|o| (*o).clone()) else {
        return Err(BisectError::OldEnd {
            kernel: names[0].clone(),
            why: old_report
                .runs
                .first()
                .map(|r| r.1.clone())
                .unwrap_or_default(),
        });
    };
    if usable
        .iter()
        .any(|o| classify(&reference, o, band) != RunClass::Old)
    {
        return Err(BisectError::OldEnd {
            kernel: names[0].clone(),
            why: "its runs disagree with each other: the scenario is not reproducible there".into(),
        });
    }
    let old_artefacts = old_results.first().map(|r| r.artefacts.clone());
    steps.push(old_report);

    let (new_report, _, _) = run_step(n - 1, Some(&reference));
    on_step(&new_report);
    if new_report.verdict != StepVerdict::New {
        return Err(BisectError::NewEnd {
            kernel: names[n - 1].clone(),
            why: format!("{:?}", new_report.verdict),
        });
    }
    steps.push(new_report);

    let mut artefacts: std::collections::BTreeMap<usize, PathBuf> =
        std::collections::BTreeMap::new();
    if let Some(a) = old_artefacts {
        artefacts.insert(0, a);
    }
    if let Some((_, _, dir)) = steps[1].runs.iter().find(|(c, _, _)| *c == RunClass::New) {
        artefacts.insert(n - 1, dir.clone());
    }
    let search = bisect::search(n, |i| {
        let (report, _, _) = run_step(i, Some(&reference));
        on_step(&report);
        if let Some((_, _, dir)) = report
            .runs
            .iter()
            .find(|(c, _, _)| !matches!(c, RunClass::NoVerdict(_)))
        {
            artefacts.insert(i, dir.clone());
        }
        let v = report.verdict.clone();
        steps.push(report);
        v
    });
    let confidence = bisect::confidence(
        &steps
            .iter()
            .map(|s| (s.verdict.clone(), s.usable(), s.runs.len()))
            .collect::<Vec<_>>(),
        search.skipped_between.len(),
    );
    let difference = match (
        artefacts.get(&search.last_old),
        artefacts.get(&search.first_new),
    ) {
        (Some(old), Some(new)) => difference(pred, old, new),
        _ => Vec::new(),
    };
    Ok(BisectOutcome {
        predicate: pred.clone(),
        kernels: names.to_vec(),
        search,
        steps,
        confidence,
        difference,
    })
}

/// What differs between two runs' artefacts, for the predicate.
fn difference(pred: &Predicate, old: &Path, new: &Path) -> Vec<String> {
    match pred {
        Predicate::Snapshot => crate::judge::ab::stream_diff(
            &read(&old.join("normalised.txt")).unwrap_or_default(),
            &read(&new.join("normalised.txt")).unwrap_or_default(),
        ),
        Predicate::Rule(rule) => {
            let hits = |dir: &Path| -> Vec<String> {
                read(&dir.join("result.json"))
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v.get("violations").cloned())
                    .and_then(|v| v.as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter(|v| v.get("rule").and_then(|r| r.as_str()) == Some(rule))
                    .filter_map(|v| {
                        v.get("message")
                            .and_then(|m| m.as_str())
                            .map(str::to_string)
                    })
                    .take(5)
                    .collect()
            };
            let (o, n) = (hits(old), hits(new));
            let mut out = vec![format!(
                "last old: {rule} {}; first new: {rule} {}",
                if o.is_empty() { "holds" } else { "breaks" },
                if n.is_empty() { "holds" } else { "breaks" }
            )];
            out.extend(o.into_iter().map(|m| format!("- [{rule}] {m}")));
            out.extend(n.into_iter().map(|m| format!("+ [{rule}] {m}")));
            out
        }
        Predicate::Field { key, label } => {
            let value = |dir: &Path| -> String {
                read(&dir.join(FIELDS_FILE))
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v.get(label)?.get(key)?.as_str().map(str::to_string))
                    .unwrap_or_default()
            };
            vec![
                format!("- {label} {key} = {}", value(old)),
                format!("+ {label} {key} = {}", value(new)),
            ]
        }
        Predicate::Overhead(figure) => {
            let value = |dir: &Path| -> String {
                read(&dir.join(crate::run::trial::overhead::TRIAL_FILE))
                    .and_then(|t| {
                        serde_json::from_str::<crate::judge::overhead::TrialOverhead>(&t).ok()
                    })
                    .and_then(|o| o.figures.into_iter().find(|f| &f.name == figure))
                    .map_or("-".into(), |f| f.value.to_string())
            };
            vec![
                format!("- {figure} = {}", value(old)),
                format!("+ {figure} = {}", value(new)),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bisection of a scenario that loads modules needs each build's
    /// modules package; one that loads none does not (the `.config`
    /// package, for the preflight, is needed either way).
    #[test]
    fn a_scenario_needs_the_modules_package_only_when_it_loads_modules() {
        let dir = std::path::Path::new("/nonexistent");
        let step = "[[steps]]\nop = \"snapshot-kallsyms\"\n";
        let plain = Scenario::parse("plain", dir, &format!("description = \"x\"\n{step}")).unwrap();
        let veth = Scenario::parse(
            "veth",
            dir,
            &format!("description = \"x\"\nmodules = [\"veth\"]\n{step}"),
        )
        .unwrap();
        assert_eq!(
            needs_of(&plain),
            kloop_kernels::Needs {
                modules: false,
                config: true
            }
        );
        assert_eq!(needs_of(&veth), kloop_kernels::Needs::ALL);
    }
}
