//! `kernels …`: the catalog (`kernels/*.toml`) and its cache, source
//! builds, the builds the mirror serves and the pins made from them. The
//! work is `kloop-kernels`'; each subcommand is one entry here, the
//! tables are [`crate::report::kernels`]'.

use kloop_kernels::available::{AvailableBuild, BisectLock};
use kloop_kernels::build::{BuildError, BuildEvent, BuildRequest, BuiltKernel, SourcePin};
use kloop_kernels::{Catalog, FetchOptions, Fetched, KernelCache, KernelError, KernelPin};

use crate::workspace::Layout;

/// `kernels list`: the pins, and the cache that says which are fetched.
#[derive(Debug)]
pub struct Pins {
    pub catalog: Catalog,
    pub cache: KernelCache,
}

pub fn list(layout: &Layout) -> Result<Pins, KernelError> {
    Ok(Pins {
        catalog: Catalog::load_all(&layout.kernels())?,
        cache: KernelCache::default_location()?,
    })
}

/// `kernels fetch`: the images (and .config and modules packages) of the
/// pins `ids` (empty: every pin), `on` hearing each package fetched.
pub fn fetch(
    layout: &Layout,
    ids: &[String],
    fetch: &FetchOptions,
    on: &mut dyn FnMut(&KernelPin, &Fetched),
) -> Result<(), KernelError> {
    // Any architecture's pin by id; all of x86-64's by default.
    let catalog = Catalog::load_all(&layout.kernels())?;
    let cache = KernelCache::default_location()?;
    let pins: Vec<_> = if ids.is_empty() {
        catalog
            .pins()
            .iter()
            .filter(|p| p.arch() == kloop_protocol::Arch::X86_64)
            .cloned()
            .collect()
    } else {
        ids.iter()
            .map(|id| catalog.get(id).cloned())
            .collect::<Result<_, _>>()?
    };
    for p in pins {
        for f in cache.fetch_pin(&p, fetch)? {
            on(&p, &f);
        }
    }
    Ok(())
}

/// Why a kernel was not built.
#[derive(Debug, thiserror::Error)]
pub enum KernelBuildError {
    /// The kernel cache's location is unknown.
    #[error(transparent)]
    NoCache(KernelError),
    #[error(transparent)]
    Build(BuildError),
}

/// What a caller hears of a build.
#[derive(Debug)]
pub enum BuildStep {
    /// The cache is found; the build starts.
    Started,
    /// The build's own progress.
    Build(BuildEvent),
}

/// `kernels build` (and every command that builds a source): `req` built
/// into the cache, `progress` hearing the build's start and events.
pub fn build(
    req: &BuildRequest,
    progress: &mut dyn FnMut(BuildStep),
) -> Result<BuiltKernel, KernelBuildError> {
    let cache = KernelCache::default_location().map_err(KernelBuildError::NoCache)?;
    progress(BuildStep::Started);
    kloop_kernels::build::build(&cache, req, &mut |e| progress(BuildStep::Build(e)))
        .map_err(KernelBuildError::Build)
}

/// `kernels built`: the kernels built so far.
pub fn built() -> Result<Vec<BuiltKernel>, KernelError> {
    let cache = KernelCache::default_location()?;
    Ok(kloop_kernels::build::list(&cache))
}

/// `kernels available`: every build the Debian suites serve, with what
/// the table marks them by (the pins, the bisection lock, the cache).
#[derive(Debug)]
pub struct Available {
    pub builds: Vec<AvailableBuild>,
    /// What the listing could not settle, a line each.
    pub notes: Vec<String>,
    pub catalog: Catalog,
    pub lock: BisectLock,
    pub cache: KernelCache,
}

pub fn available(
    layout: &Layout,
    arch: kloop_protocol::Arch,
    refresh: bool,
    fetch: &FetchOptions,
) -> Result<Available, KernelError> {
    let cache = KernelCache::default_location()?;
    let (builds, notes) =
        kloop_kernels::available::list_cloud_builds_for(&cache, fetch, refresh, arch)?;
    let catalog = Catalog::load_for(&layout.kernels(), &[arch])?;
    let lock = BisectLock::load(&layout.kernels())?;
    Ok(Available {
        builds,
        notes,
        catalog,
        lock,
        cache,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum PinBuildError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("no build {0} in `cargo xtask kernels available`")]
    NotServed(String),
}

/// `kernels pin-build`: each build of `versions` pinned into the
/// bisection lock, `on` hearing each pin.
pub fn pin_build(
    layout: &Layout,
    versions: &[String],
    arch: kloop_protocol::Arch,
    fetch: &FetchOptions,
    on: &mut dyn FnMut(&KernelPin),
) -> Result<(), PinBuildError> {
    let cache = KernelCache::default_location()?;
    let (builds, _) = kloop_kernels::available::list_cloud_builds_for(&cache, fetch, false, arch)?;
    let mut lock = BisectLock::load(&layout.kernels())?;
    for v in versions {
        let b = builds
            .iter()
            .find(|b| &b.version == v)
            .ok_or_else(|| PinBuildError::NotServed(v.clone()))?;
        let pin = lock.ensure(
            &cache,
            &layout.kernels(),
            b,
            fetch,
            kloop_kernels::Needs::ALL,
        )?;
        on(&pin);
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum PinSourceError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// `kernels pin-source`: a kernel source package pinned.
pub fn pin_source(
    layout: &Layout,
    package: &str,
    suite: &str,
    fetch: &FetchOptions,
) -> Result<SourcePin, PinSourceError> {
    let cache = KernelCache::default_location()?;
    Ok(kloop_kernels::build::pin_source(
        &cache,
        &layout.kernels(),
        package,
        suite,
        fetch,
    )?)
}

/// `kernels update`: a pin moved (to the newest build of its package, or
/// re-pinned at the same version).
pub fn update(
    layout: &Layout,
    id: &str,
    same_version: bool,
    fetch: &FetchOptions,
) -> Result<KernelPin, KernelError> {
    kloop_kernels::update_pin(&layout.kernels(), id, same_version, fetch)
}

/// Why the checks' controls did not give their answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlsRunError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Setup(#[from] crate::run::suite::SuiteError),
    /// A check is blind, or which checks the kernel has is unknown.
    #[error(transparent)]
    Controls(#[from] crate::run::controls::ControlsError),
}

/// `kernels build --checks` and `validate --checks`: each check's positive
/// control on the checked kernel `built` ([`crate::run::controls`]), before
/// any other trial of it; kept per kernel once every check sees. `on`
/// hears each control's outcome and whether it was kept from an earlier
/// run.
pub fn controls(
    layout: &Layout,
    built: &BuiltKernel,
    env: &crate::run::suite::EnvOptions,
    on: &dyn Fn(&crate::run::controls::ControlOutcome, bool),
) -> Result<Vec<crate::run::controls::ControlOutcome>, ControlsRunError> {
    let catalog = Catalog::load_all(&layout.kernels())?;
    let kernel = crate::run::trial::KernelUnderTest::Image(crate::run::trial::LocalKernel::built(
        built, None, &catalog,
    ));
    // Kept answers need no agent, accelerator or run directory.
    let cache = KernelCache::default_location()?;
    if let Some(kept) = built.config().ok().and_then(|config| {
        crate::run::controls::kept(cache.root(), &kernel.id(), &env.extra_cmdline, &config)
    }) {
        for o in &kept {
            on(o, true);
        }
        return Ok(kept);
    }
    super::start_trials();
    let env = crate::run::suite::prepare_env(layout, env, std::slice::from_ref(&kernel))?;
    Ok(crate::run::controls::run(
        &env,
        &kernel,
        &layout.kernels().join("controls"),
        on,
    )?)
}
