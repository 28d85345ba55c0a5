//! A/B runs: the same scenarios on a baseline kernel and a candidate,
//! interleaved on the same VMs, then each pair compared by
//! [`crate::judge::ab`].

use std::path::Path;

use crate::judge::ab::{self, AbOutcome, Side};
use crate::run::suite::PlannedTrial;
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
/// the normalised stream and the overhead figures from its artefacts.
pub fn side_of(r: &TrialResult) -> Side {
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
        rules: r
            .violations
            .iter()
            .map(|v| (v.rule.clone(), v.message.clone()))
            .collect(),
        interrupted: matches!(r.verdict, Verdict::Interrupted(_)),
        ledger_ids: {
            let mut ids: Vec<String> = r
                .violations
                .iter()
                .filter_map(|v| v.known_issue.clone())
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
pub fn compare(trials: &[PlannedTrial], results: &[TrialResult]) -> Vec<AbOutcome> {
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
        out.push(ab::compare(name, &side_of(b), &side_of(c)));
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

/// What an A/B run is asked to do besides its two kernels.
#[derive(Debug, Clone, Default)]
pub struct AbOptions {
    /// Scenario names; empty: all.
    pub scenarios: Vec<String>,
    pub env: crate::run::suite::EnvOptions,
    pub jobs: usize,
    /// `--shard K/N` of an A/B: a part of its scenarios, both kernels each.
    pub shard: Option<crate::run::shard::Shard>,
}

/// What the caller hears.
#[derive(Debug)]
pub enum Event<'a> {
    /// The environment is ready: the accelerator, the two sides' names,
    /// the run directory.
    Started {
        accel: &'a kloop_qemu::accel::AccelDecision,
        baseline: &'a str,
        candidate: &'a str,
        run_dir: &'a Path,
    },
    /// A line for the person running kloop (a shard's part, what could not
    /// be written), for reading only.
    Note(String),
    /// A trial ended.
    Trial(&'a TrialResult),
}

#[derive(Debug, thiserror::Error)]
pub enum AbError {
    #[error(transparent)]
    Suite(#[from] crate::run::suite::SuiteError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs every chosen scenario (a shard's part of them) on both kernels,
/// compares each pair, and writes the run's reports: results, JUnit,
/// summary, the KCIDB document, `ab.json` and, for a shard, the manifest
/// `merge` checks.
pub fn run(
    layout: &crate::run::suite::Layout,
    baseline: &KernelUnderTest,
    candidate: &KernelUnderTest,
    opts: &AbOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<AbRun, AbError> {
    use crate::run::suite;
    let started = std::time::Instant::now();
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(suite::SuiteError::from)?;
    let mut chosen =
        crate::scenario::select(&all, &opts.scenarios).map_err(suite::SuiteError::from)?;
    let mut manifest = None;
    if let Some(shard) = opts.shard {
        let planned: Vec<String> = trials(baseline, candidate, &chosen)
            .iter()
            .map(|t| t.id())
            .collect();
        let names: Vec<String> = chosen.iter().map(|s| s.name.clone()).collect();
        let (mine, _) = crate::run::shard::select(&names, shard, &Default::default());
        on(Event::Note(format!(
            "shard {shard}: {} of {} scenario(s) of the A/B",
            mine.len(),
            names.len()
        )));
        chosen = mine.into_iter().map(|i| chosen[i].clone()).collect();
        manifest = Some(crate::report::merge::ShardManifest {
            kloop_commit: crate::run::agent::kloop_commit(&layout.root),
            shard,
            mine: planned
                .iter()
                .filter(|id| chosen.iter().any(|s| id.ends_with(&format!("/{}", s.name))))
                .cloned()
                .collect(),
            trials: planned,
        });
    }
    let trials = trials(baseline, candidate, &chosen);
    let env = suite::prepare_env(layout, &opts.env, &[baseline.clone(), candidate.clone()])?;
    let (base_name, cand_name) = (trials[0].kernel.id(), trials[1].kernel.id());
    on(Event::Started {
        accel: &env.accel,
        baseline: &base_name,
        candidate: &cand_name,
        run_dir: &env.run_dir,
    });
    let results = suite::run_all(&env, &trials, opts.jobs, &|r| on(Event::Trial(r)));
    let outcomes = compare(&trials, &results);
    let mut ab = AbRun {
        baseline: base_name,
        candidate: cand_name,
        results,
        outcomes,
        run_dir: env.run_dir.clone(),
        accel: env.accel.accel.clone(),
        planned: chosen.len(),
        json: env.run_dir.join("ab.json"),
        secs: 0.0,
    };
    write_reports(
        layout,
        &ab,
        &[baseline.clone(), candidate.clone()],
        manifest,
        on,
    )?;
    ab.secs = started.elapsed().as_secs_f64();
    Ok(ab)
}

/// The reports of a finished A/B in its run directory.
fn write_reports(
    layout: &crate::run::suite::Layout,
    ab: &AbRun,
    kernels: &[KernelUnderTest],
    manifest: Option<crate::report::merge::ShardManifest>,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<(), AbError> {
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| AbError::Io { what, path, source }
    };
    crate::report::write_files(&ab.run_dir, &ab.results)
        .map_err(io("writing reports into", &ab.run_dir))?;
    for problem in crate::report::kcidb::write_run_document(
        &layout.root,
        &ab.run_dir,
        kernels,
        &ab.results,
        None,
    ) {
        on(Event::Note(problem));
    }
    crate::report::ab::write_json(&ab.run_dir, &ab.outcomes)
        .map_err(io("writing ab.json into", &ab.run_dir))?;
    if let Some(m) = manifest {
        let path = ab.run_dir.join(crate::report::merge::MANIFEST);
        let text = serde_json::to_string_pretty(&m).expect("a manifest serialises");
        std::fs::write(&path, text).map_err(io("writing", &path))?;
    }
    Ok(())
}
