//! Judging mutants: each mutant's patch is built incrementally by the
//! source builder, and its kernel is run against the unmutated build's
//! results, scenario by scenario, the way `validate` compares a patch with
//! its baseline. A scenario that comes out CHANGED, BROKEN or INCOMPARABLE
//! (which covers an overhead figure out of its band) kills the mutant; the
//! remaining scenarios are then not run, since one killer is enough. A
//! mutant no scenario kills survived: the suite is blind there.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_kernels::{Catalog, KernelCache};
use kloop_path_io::PathIoExt;

use crate::judge::ab::{self, Side};
use crate::run::suite::{self, EnvOptions, PlannedTrial};
use crate::run::trial::{BootMode, KernelUnderTest, LocalKernel, TrialEnv};
use crate::scenario::Scenario;
use crate::workspace::Layout;
use kloop_mutate::{schema, Mutant};

use super::compile::{compile_phase, object_of, schema_build, Tce};
use super::data::{
    KillKind, MutantResult, MutantsBaseline, MutantsError, Outcome, Phases, Strategy, BASELINE_FILE,
};

/// The order scenarios are tried in: cheap ones first (one killer is
/// enough), the icount overhead measurement and the real perf last.
pub fn judging_order(mut scenarios: Vec<Scenario>) -> Vec<Scenario> {
    let cost = |s: &Scenario| match s.name.as_str() {
        "overhead" => 2,
        "perf-tool" => 1,
        _ => 0,
    };
    scenarios.sort_by_key(|s| (cost(s), s.name.clone()));
    scenarios
}

/// A kernel as a trial runs it: a schema kernel carries the switch value
/// its plans set.
#[derive(Clone)]
struct Subject {
    kernel: KernelUnderTest,
    switch: Option<u32>,
    /// Per scenario, the deadline of a whole trial (seconds): a few times
    /// the unmutated kernel's run of it. Empty: the accelerator's default.
    deadlines: BTreeMap<String, u64>,
}

impl Subject {
    fn plain(kernel: KernelUnderTest) -> Subject {
        Subject {
            kernel,
            switch: None,
            deadlines: BTreeMap::new(),
        }
    }

    fn trial(&self, s: &Scenario) -> PlannedTrial {
        let mut scenario = s.clone();
        if let Some(&secs) = self.deadlines.get(&s.name) {
            scenario.vm.total_secs = Some(secs);
        }
        if let Some(n) = self.switch {
            scenario.plan.params.push(kloop_protocol::ParamWrite {
                module: "kernel".into(),
                name: schema::SWITCH.into(),
                value: n.to_string(),
            });
        }
        PlannedTrial {
            kernel: self.kernel.clone(),
            scenario,
        }
    }
}

/// Per scenario: the reference run's side, and the deadline (seconds) of a
/// mutant's run of it.
type References = (BTreeMap<String, Side>, BTreeMap<String, u64>);

/// Runs `chosen` on `subject`: each scenario's side and a deadline for a
/// mutant's run of it; the first
/// that fails the run is an error (a mutant cannot be judged against it).
fn reference_sides(
    env: &TrialEnv,
    subject: &Subject,
    chosen: &[Scenario],
    jobs: usize,
    id: &str,
) -> Result<References, MutantsError> {
    let trials: Vec<PlannedTrial> = chosen.iter().map(|s| subject.trial(s)).collect();
    let mut sides = BTreeMap::new();
    let mut deadlines = BTreeMap::new();
    for r in suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {}) {
        if matches!(r.verdict, crate::run::trial::Verdict::Interrupted(_)) {
            return Err(MutantsError::Interrupted);
        }
        if r.verdict.fails_run() {
            return Err(MutantsError::BaselineFails {
                scenario: r.scenario.clone(),
                verdict: r.verdict.label().to_string(),
                id: id.to_string(),
            });
        }
        sides.insert(
            r.scenario.clone(),
            crate::run::ab::side_of(&r, &env.known_issues),
        );
        // Six times the unmutated run and half a minute: a mutant that
        // hangs its kernel times out here, killed by the rule that a
        // scenario the baseline completes completes.
        deadlines.insert(r.scenario.clone(), (r.wall_secs * 6.0) as u64 + 30);
    }
    Ok((sides, deadlines))
}

/// Builds the unmutated kernel, then judges each mutant in turn
/// (`on_result` as each is decided) against the scenarios' runs on the
/// unmutated code: with [`Strategy::Schemata`], the schema kernel with its
/// switch at 0; otherwise (and for a mutant built alone) the unmutated
/// kernel. Mutant kernels are removed from the cache once judged (their
/// patch rebuilds them).
#[allow(clippy::too_many_arguments)] // the source, the mutants, how to run, two callbacks
#[expect(clippy::too_many_lines)]
pub fn judge_all(
    layout: &Layout,
    base_req: &BuildRequest,
    mutants: &[Mutant],
    scenarios: &[String],
    opts: &EnvOptions,
    jobs: usize,
    strategy: Strategy,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
    on_result: &mut dyn FnMut(&MutantsBaseline, &[MutantResult]),
) -> Result<(MutantsBaseline, Vec<MutantResult>), MutantsError> {
    let cache = KernelCache::default_location()?;
    // Every architecture's pins: a build is judged by the pin of its
    // series and architecture.
    let catalog = Catalog::load_all(&layout.kernels())?;
    let baseline = kloop_kernels::build::build(&cache, base_req, &mut |e| on_build("unmutated", e))
        .map_err(MutantsError::Baseline)?;
    let local = |k: &BuiltKernel| KernelUnderTest::Image(LocalKernel::built(k, None, &catalog));
    let base_kernel = local(&baseline);
    let mut env = suite::prepare_env(layout, opts, std::slice::from_ref(&base_kernel))?;
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(suite::SuiteError::from)?;
    let chosen =
        judging_order(crate::scenario::select(&all, scenarios).map_err(suite::SuiteError::from)?);
    let patch_dir = env.run_dir.join("mutants");
    std::fs::create_dir_all(&patch_dir).at("creating", &patch_dir)?;
    let mut phases = Phases {
        strategy,
        ..Phases::default()
    };

    // Compiled alone: what the code alone decides, and the schema.
    let mut decided: BTreeMap<usize, MutantResult> = BTreeMap::new();
    let mut in_schema: BTreeMap<usize, u32> = BTreeMap::new();
    let mut digests: BTreeMap<usize, String> = BTreeMap::new();
    let mut compile_secs: BTreeMap<usize, f64> = BTreeMap::new();
    let mut schema_kernel = None;
    if strategy == Strategy::Schemata {
        let total = mutants.len();
        let mut progress = |done: usize| {
            // A line every tenth, not one per mutant.
            if done == total || done.is_multiple_of((total / 10).max(1)) {
                on_build(
                    "compile-alone",
                    kloop_kernels::build::BuildEvent::Phase(format!(
                        "compiled {done} of {total} mutated files alone"
                    )),
                );
            }
        };
        match compile_phase(&cache, base_req, &baseline, mutants, jobs, &mut progress) {
            Ok((secs, outcomes)) => {
                phases.compile_secs = secs;
                let mut left = Vec::new();
                for (n, (outcome, digest, secs)) in outcomes.into_iter().enumerate() {
                    match outcome {
                        Some(outcome) => {
                            decided.insert(
                                n,
                                MutantResult {
                                    build_secs: secs,
                                    code_digest: digest,
                                    outcome,
                                    ..MutantResult::new(&mutants[n])
                                },
                            );
                        }
                        None => {
                            compile_secs.insert(n, secs);
                            left.push((n, digest));
                        }
                    }
                }
                let to_switch: Vec<usize> = left.iter().map(|(n, _)| *n).collect();
                match schema_build(&cache, base_req, mutants, &to_switch, &patch_dir, on_build) {
                    Ok((built, included, left_out, secs)) => {
                        phases.schema_build_secs = secs;
                        phases.schema_kernel = Some(built.record.id.clone());
                        phases.in_schema = included.len();
                        phases.built_alone = left_out;
                        for n in included {
                            in_schema.insert(n, n as u32 + 1);
                        }
                        schema_kernel = Some(built);
                    }
                    Err(why) => {
                        tracing::warn!("no schema kernel, every mutant built alone: {why}");
                        phases.built_alone.push(format!("all: {why}"));
                    }
                }
                digests.extend(left.into_iter().filter_map(|(n, d)| Some((n, d?))));
            }
            Err(why) => {
                tracing::warn!("no compile-alone phase, every mutant built alone: {why}");
                phases.built_alone.push(format!("all: {why}"));
            }
        }
    }

    let schema_subject = schema_kernel.as_ref().map(|k| {
        let KernelUnderTest::Image(mut lk) = local(k) else {
            unreachable!("a built kernel is an image")
        };
        lk.name = format!("schema-{}", k.record.id);
        Subject {
            kernel: KernelUnderTest::Image(lk),
            switch: Some(0),
            deadlines: BTreeMap::new(),
        }
    });
    // The reference runs: on the schema kernel (a saved VM per shape, since
    // it serves every trial), and on the unmutated kernel when any mutant is
    // built alone (cold boots: a mutant kernel boots a handful of trials).
    let (schema_sides, deadlines) = match (&schema_subject, &schema_kernel) {
        (Some(s), Some(k)) => {
            let (sides, deadlines) = reference_sides(&env, s, &chosen, jobs, &k.record.id)?;
            (Some(sides), deadlines)
        }
        _ => (None, BTreeMap::new()),
    };
    let alone_needed =
        (0..mutants.len()).any(|n| !decided.contains_key(&n) && !in_schema.contains_key(&n));
    env.boot = BootMode::Cold;
    let base_subject = Subject::plain(base_kernel.clone());
    let base_sides = if alone_needed || schema_sides.is_none() {
        reference_sides(&env, &base_subject, &chosen, jobs, &baseline.record.id)?.0
    } else {
        BTreeMap::new()
    };
    env.boot = opts.boot;
    let mut base = MutantsBaseline {
        source: baseline.record.source.clone(),
        kernel_id: baseline.record.id.clone(),
        release: baseline.record.release.clone(),
        scenarios: chosen.iter().map(|s| s.name.clone()).collect(),
        accel: env.accel.accel.clone(),
        run_dir: env.run_dir.clone(),
        phases,
    };
    let base_file = env.run_dir.join(BASELINE_FILE);
    let json = serde_json::to_vec_pretty(&base).expect("the baseline serialises");
    std::fs::write(&base_file, json).at("writing", &base_file)?;
    let mut tce = Tce::new(&cache, base_req, &baseline, mutants);
    let alone = AloneBuild {
        cache: &cache,
        catalog: &catalog,
        base_req,
        patch_dir: &patch_dir,
    };
    let mut results = Vec::new();
    for (n, m) in mutants.iter().enumerate() {
        let r = if let Some(r) = decided.remove(&n) {
            r
        } else if let (Some(&switch), Some(subject), Some(sides)) =
            (in_schema.get(&n), &schema_subject, &schema_sides)
        {
            let mut r = MutantResult::new(m);
            r.code_digest = digests.get(&n).cloned();
            // Its share of the build: the compile alone (the schema
            // kernel's build is the run's, in `phases`).
            r.build_secs = compile_secs.get(&n).copied().unwrap_or(0.0);
            if crate::run::signals::interrupted() {
                r.outcome = Outcome::NotJudged("interrupted".into());
            } else {
                let KernelUnderTest::Image(mut lk) = subject.kernel.clone() else {
                    unreachable!("a schema kernel is an image")
                };
                lk.name = format!("{}-m{switch:03}", lk.name);
                let mutant = Subject {
                    kernel: KernelUnderTest::Image(lk),
                    switch: Some(switch),
                    deadlines: deadlines.clone(),
                };
                let order = learned_order(&chosen, m, &results);
                let against = Against {
                    env: &env,
                    reference: subject,
                    sides,
                    chosen: &order,
                    noisy: &mut base.phases.noisy,
                    jobs,
                };
                judge_on(against, &mutant, &mut r);
            }
            r
        } else {
            env.boot = BootMode::Cold;
            let against = Against {
                env: &env,
                reference: &base_subject,
                sides: &base_sides,
                chosen: &chosen,
                noisy: &mut base.phases.noisy,
                jobs,
            };
            let r = judge_one(&alone, against, m, n, &mut tce, on_build);
            env.boot = opts.boot;
            r
        };
        if let (Some(d), Outcome::Killed(_) | Outcome::Survived) = (&r.code_digest, &r.outcome) {
            tce.judged
                .entry((m.file.clone(), d.clone()))
                .or_insert_with(|| m.id.clone());
        }
        results.push(r);
        // After each mutant, so a run stopped halfway keeps its findings.
        on_result(&base, &results);
    }
    if let Some(k) = &schema_kernel {
        forget_kernel(&cache, k);
    }
    Ok((base, results))
}

/// The order to try `chosen` in for `m`: first the scenarios that killed
/// mutants of the same function by a rule (most recent first), then those
/// that killed mutants of the same file, then those that killed any by a
/// rule (most kills first), then the rest as `chosen` has them (cheap
/// first). A killed mutant stops at its first rule kill, so
/// a scenario that already reaches this code saves the ones before it; a
/// survivor runs every scenario whatever the order, so no kill is lost.
fn learned_order(chosen: &[Scenario], m: &Mutant, judged: &[MutantResult]) -> Vec<Scenario> {
    let mut first: Vec<&str> = Vec::new();
    for same_function in [true, false] {
        for r in judged.iter().rev() {
            let near = if same_function {
                r.mutant.file == m.file && r.mutant.function == m.function
            } else {
                r.mutant.file == m.file
            };
            if let (true, Some(KillKind::Rule), Some(s)) = (near, r.killed_by, &r.killed_in) {
                if !first.contains(&s.as_str()) {
                    first.push(s);
                }
            }
        }
    }
    // Then, for code no mutant of its file reached yet, the scenarios that
    // killed most by a rule anywhere (cheap ones first among equals).
    let mut kills: BTreeMap<&str, usize> = BTreeMap::new();
    for r in judged {
        if let (Some(KillKind::Rule), Some(s)) = (r.killed_by, &r.killed_in) {
            *kills.entry(s.as_str()).or_default() += 1;
        }
    }
    let mut by_kills: Vec<(&str, usize)> = chosen
        .iter()
        .filter_map(|s| kills.get(s.name.as_str()).map(|&k| (s.name.as_str(), k)))
        .collect();
    // A stable sort keeps `chosen`'s order among equal counts.
    by_kills.sort_by_key(|&(_, k)| std::cmp::Reverse(k));
    for (name, _) in by_kills {
        if !first.contains(&name) {
            first.push(name);
        }
    }
    let mut order: Vec<Scenario> = first
        .iter()
        .filter_map(|name| chosen.iter().find(|s| s.name == *name).cloned())
        .collect();
    order.extend(
        chosen
            .iter()
            .filter(|s| !first.contains(&s.name.as_str()))
            .cloned(),
    );
    order
}

/// An outcome that rejects only because overhead figures left their band
/// (the streams and the rules agree).
fn figures_only(o: &ab::AbOutcome) -> bool {
    o.class == ab::AbClass::Changed && o.diff.is_empty() && o.figures.iter().any(|f| !f.within)
}

/// Runs `scenario` once more on both kernels and compares those runs.
fn confirm_figures(
    env: &TrialEnv,
    base: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    jobs: usize,
) -> Option<ab::AbOutcome> {
    let (base_side, mutant) = run_again(env, base, subject, scenario, jobs)?;
    Some(ab::compare(&scenario.name, &base_side, &mutant))
}

/// Both kernels run `scenario` once more, side by side: their sides.
fn run_again(
    env: &TrialEnv,
    reference: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    jobs: usize,
) -> Option<(Side, Side)> {
    let trials = [reference, subject].map(|k| k.trial(scenario));
    let results = suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {});
    let side = |k: &Subject| {
        results
            .iter()
            .find(|r| r.kernel == k.kernel.id())
            .map(|r| crate::run::ab::side_of(r, &env.known_issues))
    };
    Some((side(reference)?, side(subject)?))
}

/// What running a scenario again said of a kill by the diff only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DiffCheck {
    /// The unmutated kernel repeated its run, the mutant its difference.
    Confirmed,
    /// The unmutated kernel's two runs differ: this scenario's diff is no
    /// evidence (recorded in `noisy`, so it is not asked again).
    Noisy,
    /// The mutant's second run matched the unmutated kernel's.
    NotAgain,
}

/// Confirms a kill by the diff only in `scenario`: a scenario whose
/// stream can legitimately differ between runs (how many attempts a
/// fault-injection sweep takes depends on what else allocates, say) must
/// not kill by one differing run. Both kernels run it again; the kill
/// stands when the unmutated kernel matches its first run and the mutant
/// still differs from it.
fn confirm_diff(
    env: &TrialEnv,
    reference: &Subject,
    subject: &Subject,
    scenario: &Scenario,
    base: &Side,
    noisy: &mut BTreeMap<String, String>,
    jobs: usize,
) -> DiffCheck {
    if noisy.contains_key(&scenario.name) {
        return DiffCheck::Noisy;
    }
    let Some((again, mutant)) = run_again(env, reference, subject, scenario, jobs) else {
        return DiffCheck::NotAgain;
    };
    let itself = ab::compare(&scenario.name, base, &again);
    if itself.class.differs() {
        let why = itself.diff.first().or(itself.details.first());
        noisy.insert(
            scenario.name.clone(),
            why.and_then(|d| d.lines().find(|l| l.starts_with(['-', '+'])))
                .unwrap_or("the verdict differs")
                .to_string(),
        );
        return DiffCheck::Noisy;
    }
    if ab::compare(&scenario.name, base, &mutant).class.differs() {
        DiffCheck::Confirmed
    } else {
        DiffCheck::NotAgain
    }
}

/// What a mutant's kernel is judged against: the unmutated code's runs
/// (`sides`, per scenario) on `reference`, the scenarios to try in order,
/// those whose diff proved noisy so far (not asked again), and how many
/// trials run at once.
struct Against<'a> {
    env: &'a TrialEnv,
    reference: &'a Subject,
    sides: &'a BTreeMap<String, Side>,
    chosen: &'a [Scenario],
    noisy: &'a mut BTreeMap<String, String>,
    jobs: usize,
}

/// How a mutant is built alone: the cache the unmutated kernel was built
/// into, the catalog its kernel is named by, the unmutated build's request,
/// and the directory the mutants' patches are written to.
struct AloneBuild<'a> {
    cache: &'a KernelCache,
    catalog: &'a Catalog,
    base_req: &'a BuildRequest,
    patch_dir: &'a Path,
}

/// Builds mutant `m` (the `n`th) alone and judges its kernel `against` the
/// unmutated kernel's runs, unless its object code already decides it.
fn judge_one(
    alone: &AloneBuild<'_>,
    against: Against<'_>,
    m: &Mutant,
    n: usize,
    tce: &mut Tce,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
) -> MutantResult {
    let &AloneBuild {
        cache,
        catalog,
        base_req,
        patch_dir,
    } = alone;
    let mut result = MutantResult::new(m);
    if crate::run::signals::interrupted() {
        result.outcome = Outcome::NotJudged("interrupted".into());
        return result;
    }
    let patch = patch_dir.join(format!("{n:03}.patch"));
    if let Err(e) = std::fs::write(&patch, &m.patch) {
        result.outcome = Outcome::NotJudged(format!("writing {}: {e}", patch.display()));
        return result;
    }
    let req = base_req.with_patches(vec![patch]);
    let started = Instant::now();
    let built = kloop_kernels::build::build(cache, &req, &mut |e| on_build(&m.id, e));
    result.build_secs = started.elapsed().as_secs_f64();
    let built = match built {
        Ok(k) => k,
        Err(e) if e.is_build_failure() => {
            let text = e.to_string();
            let first: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .collect();
            result.outcome = Outcome::BuildFailed(first.join(" / "));
            return result;
        }
        Err(e) => {
            result.outcome = Outcome::NotJudged(format!("build: {e}"));
            return result;
        }
    };
    // The mutated file's object code, read before the next mutant's build
    // reuses the output directory: the unmutated code (or an earlier
    // mutant's) decides without a run.
    if let Some(base_digest) = tce.base.get(&m.file) {
        let digest = kloop_kernels::build::objects_of(cache, &req, &built)
            .ok()
            .flatten()
            .and_then(|out| {
                kloop_kernels::build::objects::code_digest(&out.join(object_of(&m.file))).ok()
            });
        if let Some(d) = digest {
            result.code_digest = Some(d.clone());
            let decided = if &d == base_digest {
                Some(Outcome::CompilerEquivalent)
            } else {
                tce.judged
                    .get(&(m.file.clone(), d))
                    .map(|id| Outcome::Duplicate(id.clone()))
            };
            if let Some(outcome) = decided {
                result.outcome = outcome;
                forget_kernel(cache, &built);
                return result;
            }
        }
    }
    let kernel = Subject::plain(KernelUnderTest::Image(LocalKernel::built(
        &built, None, catalog,
    )));
    judge_on(against, &kernel, &mut result);
    forget_kernel(cache, &built);
    result
}

/// Runs `against.chosen` on `subject` until a rule kills it (or all ran),
/// each compared with the reference's run of the scenario; the verdict in
/// `result`.
#[expect(clippy::too_many_lines)]
fn judge_on(against: Against<'_>, subject: &Subject, result: &mut MutantResult) {
    let Against {
        env,
        reference,
        sides: base_sides,
        chosen,
        noisy,
        jobs,
    } = against;
    let started = Instant::now();
    'batches: for batch in chosen.chunks(jobs.max(1)) {
        let trials: Vec<PlannedTrial> = batch.iter().map(|s| subject.trial(s)).collect();
        let results = suite::run_all(env, &trials, suite::Parallel::jobs(jobs), &|_| {});
        result.scenarios_run += results.len();
        // A trial cut short by Ctrl-C or SIGTERM says nothing of the
        // mutant: it is not judged, whatever came before.
        if results
            .iter()
            .any(|r| matches!(r.verdict, crate::run::trial::Verdict::Interrupted(_)))
        {
            result.outcome = Outcome::NotJudged("interrupted".into());
            result.killed_by = None;
            result.killed_in = None;
            break 'batches;
        }
        for r in &results {
            let Some(base) = base_sides.get(&r.scenario) else {
                continue;
            };
            let mut outcome = ab::compare(
                &r.scenario,
                base,
                &crate::run::ab::side_of(r, &env.known_issues),
            );
            if outcome.class.differs() && figures_only(&outcome) {
                // A figure a hair outside its band in one pair of runs is
                // as likely noise as a change: both kernels measure again,
                // and only a change that shows twice kills.
                if let Some(scenario) = chosen.iter().find(|s| s.name == r.scenario) {
                    if let Some(again) = confirm_figures(env, reference, subject, scenario, jobs) {
                        result.confirmed_figures = true;
                        result.scenarios_run += 1;
                        outcome = again;
                    }
                }
            }
            if outcome.class.differs() && KillKind::of(&outcome) == KillKind::Diff {
                let Some(scenario) = chosen.iter().find(|s| s.name == r.scenario) else {
                    continue;
                };
                match confirm_diff(env, reference, subject, scenario, base, noisy, jobs) {
                    DiffCheck::Confirmed => result.confirmed_diff = true,
                    DiffCheck::Noisy | DiffCheck::NotAgain => continue,
                }
                result.scenarios_run += 2;
            }
            if outcome.class.differs()
                && subject.switch.is_some()
                && KillKind::of(&outcome) == KillKind::Overhead
            {
                if result.schema_overhead.is_none() {
                    result.schema_overhead = Some(format!(
                        "{}: {}",
                        r.scenario,
                        outcome
                            .details
                            .first()
                            .map_or("", |d| d.lines().next().unwrap_or(""))
                    ));
                }
                continue;
            }
            if outcome.class.differs() {
                let kind = KillKind::of(&outcome);
                let why = outcome
                    .details
                    .first()
                    .or(outcome.diff.first())
                    .cloned()
                    .unwrap_or_default();
                let text = format!(
                    "{}: {}: {}{}",
                    r.scenario,
                    outcome.class.label(),
                    why.lines().next().unwrap_or(""),
                    if result.confirmed_figures {
                        " (out of band in a second pair of runs too)"
                    } else {
                        ""
                    }
                );
                // The first kill stands until a rule kills it: a kill by
                // a rule ends the judging, one by the diff or the figures
                // only goes on looking for a rule.
                if result.killed_by.is_none_or(|k| kind < k) {
                    result.killed_by = Some(kind);
                    result.killed_in = Some(r.scenario.clone());
                    result.outcome = Outcome::Killed(text);
                }
                if kind == KillKind::Rule {
                    break 'batches;
                }
            }
        }
        if crate::run::signals::interrupted() {
            result.outcome = Outcome::NotJudged("interrupted".into());
            break;
        }
    }
    result.judge_secs = started.elapsed().as_secs_f64();
}

/// The mutant's kernel and its PVH ELF are not worth their disk: its patch
/// rebuilds them.
fn forget_kernel(cache: &KernelCache, built: &BuiltKernel) {
    let _ = std::fs::remove_file(
        cache
            .root()
            .join("vmlinux")
            .join(&built.record.image_sha256),
    );
    let _ = std::fs::remove_dir_all(&built.dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_mutate::Operator;

    fn killed(file: &str, function: &str, kind: KillKind, scenario: &str) -> MutantResult {
        let mut r = MutantResult::new(&Mutant {
            id: format!("{file}:{function}"),
            file: file.into(),
            function: function.into(),
            line: 1,
            operator: Operator::DropCall,
            what: String::new(),
            patch: String::new(),
        });
        r.outcome = Outcome::Killed(format!("{scenario}: BROKEN"));
        r.killed_by = Some(kind);
        r.killed_in = Some(scenario.into());
        r
    }

    /// Scenarios that killed the same function by a rule come first (most
    /// recent first), then those of the same file, then the other rule
    /// killers by count; diff kills teach nothing; every scenario is still
    /// tried, once.
    #[test]
    fn scenarios_that_killed_nearby_mutants_go_first() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let chosen = judging_order(crate::scenario::load_all(&root).unwrap());
        let judged = vec![
            killed(
                "kernel/bpf/core.c",
                "bpf_ksym_del",
                KillKind::Rule,
                "subprogs",
            ),
            killed(
                "kernel/bpf/syscall.c",
                "bpf_prog_load",
                KillKind::Rule,
                "basic",
            ),
            killed(
                "kernel/bpf/core.c",
                "bpf_ksym_add",
                KillKind::Rule,
                "subprogs",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_ksymbol",
                KillKind::Rule,
                "kprobes",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Diff,
                "overflow",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Rule,
                "ksymbol-only",
            ),
            killed(
                "kernel/events/core.c",
                "perf_event_bpf_event",
                KillKind::Rule,
                "task-only",
            ),
        ];
        let m = &judged[6].mutant;
        let order: Vec<String> = learned_order(&chosen, m, &judged)
            .into_iter()
            .map(|s| s.name)
            .collect();
        let learned = ["task-only", "ksymbol-only", "kprobes", "subprogs", "basic"];
        assert_eq!(order[..5], learned);
        assert_eq!(order.len(), chosen.len());
        let rest: Vec<&String> = order[5..].iter().collect();
        let expected: Vec<&String> = chosen
            .iter()
            .map(|s| &s.name)
            .filter(|n| !learned.contains(&n.as_str()))
            .collect();
        assert_eq!(rest, expected);
    }
}
