//! A/B runs: the same scenarios on a baseline kernel and a candidate,
//! interleaved on the same VMs, then each pair compared by
//! [`crate::judge::ab`].

use std::path::Path;

use crate::judge::ab::{self, AbOutcome, Side};
use crate::run::suite::{self, PlannedTrial};
use crate::run::trial::{KernelUnderTest, TrialResult, Verdict};
use crate::scenario::Scenario;

/// The trials of an A/B run: for each scenario, baseline then candidate,
/// so both meet the same host load. Two local kernels with the same name
/// are told apart by a `baseline-` prefix on the baseline's.
pub fn trials(
    baseline: &KernelUnderTest,
    candidate: &KernelUnderTest,
    scenarios: &[Scenario],
) -> Vec<PlannedTrial> {
    let mut baseline = baseline.clone();
    if baseline.id() == candidate.id() {
        if let KernelUnderTest::Image(k) = &mut baseline {
            k.name = format!("baseline-{}", k.name);
        }
    }
    scenarios
        .iter()
        .flat_map(|s| {
            [
                PlannedTrial {
                    kernel: baseline.clone(),
                    scenario: s.clone(),
                },
                PlannedTrial {
                    kernel: candidate.clone(),
                    scenario: s.clone(),
                },
            ]
        })
        .collect()
}

/// What a trial left, as the comparison reads it: verdict, broken rules,
/// the normalised stream and the overhead figures from its artefacts. The
/// ledger entries it showed leave out those that only excuse (no scenario
/// listed: a fault whose showing depends on the run's layout), so that
/// one gone from a run is no fix, nor its showing a change.
pub fn side_of(r: &TrialResult, ledger: &crate::judge::known_issues::Ledger) -> Side {
    let may_show = |id: &str| ledger.only_excuses(id);
    let normalised = read(&r.artefacts.join("normalised.txt"));
    let overhead = read(&r.artefacts.join(crate::run::trial::overhead::TRIAL_FILE))
        .and_then(|t| serde_json::from_str(&t).ok());
    let skipped = match &r.verdict {
        Verdict::Skipped(m) => Some(m.lines().next().unwrap_or("").to_string()),
        _ => None,
    };
    // Judged: the plan ran to its end and the records were read (a rule,
    // the ledger, a snapshot or a budget may still have failed it).
    let judged = normalised.is_some() && r.verdict.records_judged();
    Side {
        label: r.verdict.label().to_string(),
        headline: match r.verdict.message() {
            Some(m) => format!("{}: {}", r.verdict.label(), m.lines().next().unwrap_or("")),
            None => r.verdict.label().to_string(),
        },
        judged,
        skipped,
        findings: r
            .violations
            .iter()
            .map(|v| ab::Finding::new(&v.rule, &v.message, v.detail.as_ref()))
            .collect(),
        interrupted: matches!(r.verdict, Verdict::Interrupted(_)),
        ledger_ids: {
            let mut ids: Vec<String> = r
                .violations
                .iter()
                .filter_map(|v| v.known_issue.clone())
                .filter(|id| !may_show(id))
                .collect();
            ids.sort();
            ids.dedup();
            ids
        },
        normalised,
        overhead,
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// Pairs the results of [`trials`]'s output (in any order) and compares
/// each pair.
pub fn compare(
    trials: &[PlannedTrial],
    results: &[TrialResult],
    ledger: &crate::judge::known_issues::Ledger,
) -> Vec<AbOutcome> {
    let id = |i: usize| trials.get(i).map(|t| t.kernel.id()).unwrap_or_default();
    let (base_id, cand_id) = (id(0), id(1));
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for t in trials {
        let name = &t.scenario.name;
        if seen.contains(name) {
            continue;
        }
        seen.push(name.clone());
        let find = |kernel: &str| {
            results
                .iter()
                .find(|r| r.kernel == kernel && &r.scenario == name)
        };
        let (Some(b), Some(c)) = (find(&base_id), find(&cand_id)) else {
            continue;
        };
        out.push(ab::compare(name, &side_of(b, ledger), &side_of(c, ledger)));
    }
    out
}

/// What an A/B run found.
pub struct AbRun {
    pub baseline: String,
    pub candidate: String,
    pub results: Vec<TrialResult>,
    pub outcomes: Vec<AbOutcome>,
    pub run_dir: std::path::PathBuf,
    pub accel: String,
    /// How many scenarios were to be compared.
    pub planned: usize,
    /// `ab.json`, the outcomes.
    pub json: std::path::PathBuf,
    pub secs: f64,
}

impl AbRun {
    /// Ctrl-C or SIGTERM stopped some trial: the run proves nothing.
    pub fn interrupted(&self) -> bool {
        self.results
            .iter()
            .any(|r| matches!(r.verdict, Verdict::Interrupted(_)))
    }
}

impl AbRun {
    /// Whether the run accepts the candidate: every scenario compared,
    /// none changed, broke or could not be compared, and with
    /// `expect_fixed` exactly those ledger entries fixed ([`ab::accept`]).
    pub fn acceptance(&self, expect_fixed: &[String]) -> ab::Acceptance {
        ab::accept(&self.outcomes, self.planned, expect_fixed)
    }
}

/// Runs every scenario of `scenarios` on both kernels, interleaved on
/// `jobs` parallel VMs, and compares each pair. With `reuse_baseline`, a
/// baseline trial whose kernel, scenario and kloop are unchanged since a
/// run kept it ([`crate::run::reuse`]) is not run again, and the baseline
/// trials that run are kept for the next. `on_start` hears the
/// environment and the two sides' names, `on_result` each trial (a reused
/// one too, with a note saying so).
#[allow(clippy::too_many_arguments)] // two kernels, what to run, how, and two callbacks
pub fn run(
    layout: &crate::workspace::Layout,
    baseline: &KernelUnderTest,
    candidate: &KernelUnderTest,
    scenarios: &[Scenario],
    opts: &crate::run::suite::EnvOptions,
    (jobs, reuse_baseline): (suite::Parallel, bool),
    on_start: &dyn Fn(&crate::run::trial::TrialEnv, &str, &str),
    on_result: &(dyn Fn(&TrialResult) + Sync),
) -> Result<AbRun, crate::run::suite::SuiteError> {
    use crate::run::suite;
    let started = std::time::Instant::now();
    let trials = trials(baseline, candidate, scenarios);
    let env = suite::prepare_env(layout, opts, &[baseline.clone(), candidate.clone()])?;
    let (base_name, cand_name) = (trials[0].kernel.id(), trials[1].kernel.id());
    on_start(&env, &base_name, &cand_name);
    let results = if reuse_baseline {
        run_reusing_baseline(layout, &env, &trials, jobs, on_result)
    } else {
        suite::run_all(&env, &trials, jobs, on_result)
    };
    let outcomes = compare(&trials, &results, &env.known_issues);
    Ok(AbRun {
        baseline: base_name,
        candidate: cand_name,
        results,
        outcomes,
        json: env.run_dir.join("ab.json"),
        run_dir: env.run_dir.clone(),
        accel: env.accel.accel.clone(),
        planned: scenarios.len(),
        secs: started.elapsed().as_secs_f64(),
    })
}

/// What [`keep_baseline`] did: how many of the baseline's trials were
/// kept already, how many ran now (and were kept when settled), and their
/// wall time.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct KeptBaseline {
    pub already: usize,
    pub ran: usize,
    pub secs: f64,
}

/// Runs the trials of `scenarios` on `baseline` whose results are not kept
/// yet ([`crate::run::reuse`]) and keeps the settled ones, so that an A/B
/// started afterwards with the same kloop, kernel and scenarios reuses
/// them. `validate` calls it while the candidate compiles: the baseline's
/// trials need only the baseline's kernel, and its serial link steps leave
/// a core free. The trials run in a run directory of their own; `on_start`
/// hears its environment when there is anything to run.
pub fn keep_baseline(
    layout: &crate::workspace::Layout,
    baseline: &KernelUnderTest,
    scenarios: &[Scenario],
    opts: &crate::run::suite::EnvOptions,
    jobs: suite::Parallel,
    on_start: &dyn Fn(&crate::run::trial::TrialEnv),
    on_result: &(dyn Fn(&TrialResult) + Sync),
) -> Result<KeptBaseline, crate::run::suite::SuiteError> {
    let started = std::time::Instant::now();
    let env = crate::run::suite::prepare_env(layout, opts, std::slice::from_ref(baseline))?;
    let (store, base) = reuse_of(layout, &env, baseline);
    let Some(base) = base else {
        // Nothing can be kept (a blessing run, an unreadable input): the
        // A/B runs the baseline itself.
        return Ok(KeptBaseline::default());
    };
    let mut to_run = Vec::new();
    let mut already = 0;
    for s in scenarios {
        let Some(key) = base.for_scenario(s) else {
            continue;
        };
        if store.holds(&key) {
            already += 1;
        } else {
            to_run.push((
                PlannedTrial {
                    kernel: baseline.clone(),
                    scenario: s.clone(),
                },
                key,
            ));
        }
    }
    if !to_run.is_empty() {
        on_start(&env);
        let planned: Vec<PlannedTrial> = to_run.iter().map(|(t, _)| t.clone()).collect();
        let ran = crate::run::suite::run_all(&env, &planned, jobs, on_result);
        for ((_, key), r) in to_run.iter().zip(&ran) {
            store.keep(key, r);
        }
    }
    Ok(KeptBaseline {
        already,
        ran: to_run.len(),
        secs: started.elapsed().as_secs_f64(),
    })
}

/// The store of kept baseline results and `kernel`'s part of their keys on
/// `env` (none when nothing can be kept: a blessing run, an unreadable
/// input), with the ledger as it is now.
fn reuse_of(
    layout: &crate::workspace::Layout,
    env: &crate::run::trial::TrialEnv,
    kernel: &KernelUnderTest,
) -> (
    crate::run::reuse::ReuseStore,
    Option<crate::run::reuse::KernelKey>,
) {
    let store = crate::run::reuse::ReuseStore::beside(&layout.runs());
    let ledger = layout.kernels().join(crate::judge::known_issues::FILE_NAME);
    let ledger_text = std::fs::read_to_string(ledger).unwrap_or_default();
    let key = crate::run::reuse::KernelKey::of(env, &ledger_text, kernel);
    (store, key)
}

/// [`run`]'s trials with the baseline's kept results reused (the baseline
/// trials are the even ones of [`trials`]); the results in `trials`' order.
fn run_reusing_baseline(
    layout: &crate::workspace::Layout,
    env: &crate::run::trial::TrialEnv,
    trials: &[PlannedTrial],
    jobs: suite::Parallel,
    on_result: &(dyn Fn(&TrialResult) + Sync),
) -> Vec<TrialResult> {
    let mut done: Vec<Option<TrialResult>> = vec![None; trials.len()];
    let mut keep: Vec<(usize, String)> = Vec::new();
    // Every baseline trial has the same kernel: its part of the key once.
    let Some(first) = trials.first() else {
        return Vec::new();
    };
    let (store, base) = reuse_of(layout, env, &first.kernel);
    for (i, t) in trials.iter().enumerate().step_by(2) {
        let Some(key) = base.as_ref().and_then(|b| b.for_scenario(&t.scenario)) else {
            continue;
        };
        let artefacts = env.run_dir.join(t.kernel.id()).join(&t.scenario.name);
        match store.take(&key, &artefacts) {
            Some(mut r) => {
                // The kept result may have run under another side's name.
                r.kernel = t.kernel.id();
                r.id = t.id();
                on_result(&r);
                done[i] = Some(r);
            }
            None => keep.push((i, key)),
        }
    }
    let to_run: Vec<usize> = (0..trials.len()).filter(|&i| done[i].is_none()).collect();
    let planned: Vec<PlannedTrial> = to_run.iter().map(|&i| trials[i].clone()).collect();
    // The slowest first, so that two VMs end together: a candidate has no
    // past of its own, and its scenario's reused baseline trial is the
    // best guess of its length (trials without one go first).
    let past: std::collections::HashMap<String, f64> = planned
        .iter()
        .filter_map(|t| {
            let reused = done
                .iter()
                .flatten()
                .find(|r| r.scenario == t.scenario.name)?;
            Some((t.id(), reused.wall_secs))
        })
        .collect();
    let order = crate::run::suite::longest_first(&planned, &past);
    let ran = crate::run::suite::run_in_order(env, &planned, &order, jobs, on_result);
    for (i, r) in to_run.into_iter().zip(ran) {
        done[i] = Some(r);
    }
    let results: Vec<TrialResult> = done.into_iter().flatten().collect();
    for (i, key) in keep {
        if let Some(r) = results.get(i) {
            store.keep(&key, r);
        }
    }
    results
}
