//! An A/B run as `vm-test --baseline` and `validate` make it: the chosen
//! scenarios (a shard's part of them) on both kernels
//! ([`crate::run::ab::run`]), then the run's reports: results, JUnit,
//! summary, the KCIDB document, `ab.json` and, for a shard, the manifest
//! `merge` checks.

use std::path::Path;

use kloop_path_io::{PathIo, PathIoExt};

use crate::run::ab::AbRun;
use crate::run::trial::{KernelUnderTest, TrialResult};

/// What an A/B run is asked to do besides its two kernels.
#[derive(Debug, Clone, Default)]
pub struct AbOptions {
    /// Scenario names; empty: all.
    pub scenarios: Vec<String>,
    pub env: crate::run::suite::EnvOptions,
    pub jobs: crate::run::suite::Parallel,
    /// `--shard K/N` of an A/B: a part of its scenarios, both kernels each.
    pub shard: Option<crate::run::shard::Shard>,
    /// Reuse the baseline's kept results whose inputs are unchanged
    /// ([`crate::run::reuse`]); `--rerun-baseline` turns it off.
    pub reuse_baseline: bool,
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
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// Why `vm-test --baseline` has no two sides to compare.
#[derive(Debug, thiserror::Error)]
pub enum SidesError {
    #[error(transparent)]
    Suite(#[from] crate::run::suite::SuiteError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error("--baseline compares one candidate: name it with one --kernel (a pin, built:ID or a bzImage) or --kernel-image")]
    NotOneCandidate,
}

/// `vm-test --baseline`'s two kernels: the baseline `baseline` names (a
/// pin, `built:ID` or a bzImage) and the one candidate the selection
/// names with one `--kernel` or `--kernel-image`.
pub fn sides(
    layout: &crate::workspace::Layout,
    sel: &crate::run::suite::Selection,
    baseline: &str,
) -> Result<(KernelUnderTest, KernelUnderTest), SidesError> {
    use crate::run::suite;
    let candidates = suite::resolve_kernels(layout, sel)?;
    let candidate = match (
        candidates.as_slice(),
        sel.kernels.is_empty() && sel.kernel_image.is_none(),
    ) {
        ([one], false) => one.clone(),
        _ => return Err(SidesError::NotOneCandidate),
    };
    let catalog = kloop_kernels::Catalog::load_all(&layout.kernels())?;
    let baseline = suite::resolve_kernel(&catalog, baseline, None)?;
    Ok((baseline, candidate))
}

/// Runs every chosen scenario (a shard's part of them) on both kernels,
/// compares each pair, and writes the run's reports: results, JUnit,
/// summary, the KCIDB document, `ab.json` and, for a shard, the manifest
/// `merge` checks.
pub fn run(
    layout: &crate::workspace::Layout,
    baseline: &KernelUnderTest,
    candidate: &KernelUnderTest,
    opts: &AbOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<AbRun, AbError> {
    let mut chosen = chosen_scenarios(layout, &opts.scenarios)?;
    let mut manifest = None;
    if let Some(shard) = opts.shard {
        let planned: Vec<String> = crate::run::ab::trials(baseline, candidate, &chosen)
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
    let ab = crate::run::ab::run(
        layout,
        baseline,
        candidate,
        &chosen,
        &opts.env,
        (opts.jobs, opts.reuse_baseline),
        &|env, baseline, candidate| {
            on(Event::Started {
                accel: &env.accel,
                baseline,
                candidate,
                run_dir: &env.run_dir,
            })
        },
        &|r| on(Event::Trial(r)),
    )?;
    write_reports(
        layout,
        &ab,
        &[baseline.clone(), candidate.clone()],
        manifest,
        on,
    )?;
    Ok(ab)
}

/// The baseline's trials of the chosen scenarios that are not kept yet,
/// run and kept ([`crate::run::ab::keep_baseline`]) so that the A/B started
/// next reuses them; `validate` runs this while the candidate compiles.
/// Ignores `opts.shard` and `opts.reuse_baseline` (the caller asks only
/// when reusing).
pub fn keep_baseline(
    layout: &crate::workspace::Layout,
    baseline: &KernelUnderTest,
    opts: &AbOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<crate::run::ab::KeptBaseline, AbError> {
    let chosen = chosen_scenarios(layout, &opts.scenarios)?;
    let name = baseline.id();
    Ok(crate::run::ab::keep_baseline(
        layout,
        baseline,
        &chosen,
        &opts.env,
        opts.jobs,
        &|env| {
            on(Event::Note(format!(
                "running the baseline's trials that no earlier run kept while the candidate \
                 builds ({name}; artefacts in {})",
                env.run_dir.display()
            )))
        },
        &|r| on(Event::Trial(r)),
    )?)
}

/// The scenarios `names` asks for (empty: all), from the layout's folder.
fn chosen_scenarios(
    layout: &crate::workspace::Layout,
    names: &[String],
) -> Result<Vec<crate::scenario::Scenario>, AbError> {
    use crate::run::suite::SuiteError;
    let all = crate::scenario::load_all(&layout.scenarios()).map_err(SuiteError::from)?;
    Ok(crate::scenario::select(&all, names).map_err(SuiteError::from)?)
}

/// The reports of a finished A/B in its run directory.
fn write_reports(
    layout: &crate::workspace::Layout,
    ab: &AbRun,
    kernels: &[KernelUnderTest],
    manifest: Option<crate::report::merge::ShardManifest>,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<(), AbError> {
    crate::report::write_files(&ab.run_dir, &ab.results).at("writing reports into", &ab.run_dir)?;
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
        .at("writing ab.json into", &ab.run_dir)?;
    if let Some(m) = manifest {
        let path = ab.run_dir.join(crate::report::merge::MANIFEST);
        let text = serde_json::to_string_pretty(&m).expect("a manifest serialises");
        std::fs::write(&path, text).at("writing", &path)?;
    }
    Ok(())
}
