//! `bisect` over the builds the mirror serves, as one entry point: the
//! range from `--old` to `--new` (a pin's id names its build), the
//! environment, the search ([`super::bisect`]) with each build pinned when
//! a step needs it, and `bisect.json`.

use std::path::PathBuf;

use kloop_kernels::available::AvailableBuild;
use kloop_kernels::{Catalog, KernelCache};
use kloop_path_io::{PathIo, PathIoExt};

use super::{BisectError, BisectOutcome, DistroBuilds, Search, StepReport};
use crate::judge::bisect::{Predicate, PredicateError};
use crate::run::suite::{self, EnvOptions, SuiteError};
use crate::workspace::Layout;

/// What `bisect` over distro builds is asked to do.
#[derive(Debug, Clone)]
pub struct DistroBisect {
    /// The old and the new end: a build's version or a pin's id. The old
    /// end may be the later build (a fix searched backwards).
    pub old: String,
    pub new: String,
    /// The builds' architecture (`cloud-arm64` ones for arm64).
    pub arch: kloop_protocol::Arch,
    pub scenario: String,
    /// The predicate as given (`rule:parse`, …), and its program label.
    pub predicate: String,
    pub label: Option<String>,
    /// Runs per step.
    pub repeat: usize,
    pub jobs: usize,
    pub env: EnvOptions,
}

/// What the caller hears.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line for the person running kloop, for reading only.
    Note(String),
    /// A step ended.
    Step(&'a StepReport),
}

#[derive(Debug, thiserror::Error)]
pub enum DistroError {
    #[error(transparent)]
    Predicate(#[from] PredicateError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error("{0} is not a build the mirror serves; see `cargo xtask kernels available`")]
    NotServed(String),
    /// The search could not start (an end gave no reference, or is not new).
    #[error("bisect: {0}")]
    Search(#[from] BisectError),
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// A finished bisection over distro builds.
#[derive(Debug)]
pub struct DistroBisection {
    pub outcome: BisectOutcome,
    /// The builds searched, in search order (old end first).
    pub range: Vec<AvailableBuild>,
    pub secs: f64,
    /// `bisect.json` in the run directory.
    pub report: PathBuf,
}

/// The builds from `old` to `new` among `builds`, in search order: old
/// first, also when old is the later build.
pub fn range(
    builds: &[AvailableBuild],
    old: &str,
    new: &str,
) -> Result<Vec<AvailableBuild>, DistroError> {
    let index_of = |v: &str| {
        builds
            .iter()
            .position(|b| b.version == v)
            .ok_or_else(|| DistroError::NotServed(v.to_string()))
    };
    let (i_old, i_new) = (index_of(old)?, index_of(new)?);
    Ok(if i_old <= i_new {
        builds[i_old..=i_new].to_vec()
    } else {
        builds[i_new..=i_old].iter().rev().cloned().collect()
    })
}

/// Runs the bisection `opts` asks for.
pub fn run(
    layout: &Layout,
    opts: &DistroBisect,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<DistroBisection, DistroError> {
    let predicate = Predicate::parse(&opts.predicate, opts.label.as_deref())?;
    let cache = KernelCache::default_location()?;
    // The architecture's pins only: a pin stands for a build of the range
    // when it is that build, which another architecture's never is.
    let catalog = Catalog::load_for(&layout.kernels(), &[opts.arch])?;
    let version_of = |end: &str| {
        catalog
            .get(&suite::pin_id_for(&catalog, end, opts.arch))
            .map(|p| p.version.clone())
            .unwrap_or_else(|_| end.to_string())
    };
    let (old, new) = (version_of(&opts.old), version_of(&opts.new));
    let (served, _) =
        kloop_kernels::available::list_cloud_builds_for(&cache, &opts.env.fetch, false, opts.arch)?;
    let range = range(&served, &old, &new)?;
    let names: Vec<String> = range.iter().map(|b| b.version.clone()).collect();
    let scenario =
        crate::scenario::load_one(&layout.scenarios(), &opts.scenario).map_err(SuiteError::from)?;
    // The first end that can be had probes KVM.
    let first = catalog
        .pins()
        .iter()
        .find(|p| p.version == old)
        .cloned()
        .map(crate::run::trial::KernelUnderTest::Pin);
    let env_opts = EnvOptions {
        arches: vec![opts.arch],
        ..opts.env.clone()
    };
    let env = suite::prepare_env(layout, &env_opts, first.as_slice())?;
    on(Event::Note(format!("accelerator: {}", env.accel)));
    on(Event::Note(format!(
        "bisect {} over {} build(s) from {old} (old) to {new} (new), predicate {}, {} run(s) per step; artefacts in {}",
        scenario.name,
        names.len(),
        opts.predicate,
        opts.repeat,
        env.run_dir.display()
    )));
    let kernels_dir = layout.kernels();
    let mut builds = DistroBuilds {
        builds: &range,
        catalog: &catalog,
        cache: &cache,
        kernels_dir: &kernels_dir,
        lock: kloop_kernels::available::BisectLock::load(&kernels_dir)?,
        fetch: opts.env.fetch.clone(),
        needs: super::needs_of(&scenario),
    };
    let search = Search::new(&env, &scenario, &predicate, opts.repeat, opts.jobs);
    let started = std::time::Instant::now();
    let outcome = super::bisect(&search, &names, &mut |i| builds.kernel_at(i), &mut |s| {
        on(Event::Step(s))
    })?;
    let report = env.run_dir.join("bisect.json");
    let text = serde_json::to_string_pretty(&outcome).expect("an outcome serialises");
    kloop_kernels::write_atomically(&report, text.as_bytes()).at("writing", &report)?;
    Ok(DistroBisection {
        outcome,
        range,
        secs: started.elapsed().as_secs_f64(),
        report,
    })
}
