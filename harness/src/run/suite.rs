//! A run of many trials: which ones, and the environment they share.
//!
//! Planning is cheap (catalog + scenario files) so `--list` and libtest-mimic
//! can enumerate trials without touching QEMU; preparing the environment
//! builds the agent, finds QEMU and decides the accelerator once per run.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

pub use crate::run::parallel::Parallel;
use crate::run::trial::guest_image::modules_shipped;
use crate::run::trial::{BootMode, KernelUnderTest, LocalKernel, MakeSavedVm, TrialEnv};
use crate::scenario::{self, Scenario};
use crate::workspace::Layout;
use kloop_kernels::{Catalog, FetchOptions, KernelCache};
use kloop_qemu::accel::{self, AccelChoice};

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Vm(#[from] kloop_qemu::VmError),
    #[error(transparent)]
    Agent(#[from] crate::run::agent::AgentBuildError),
    #[error("choosing the accelerator: {0}")]
    Accel(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Ledger(#[from] crate::judge::known_issues::LedgerError),
    #[error(transparent)]
    ExpectedSkips(#[from] scenario::skips::SkipsError),
    #[error("--snapshot-as {0} names no kernel pin and no snapshot set blessed with `bless --as {0}`; known pins: {1}")]
    UnknownSnapshotPin(String, String),
    #[error(transparent)]
    Build(#[from] kloop_kernels::build::BuildError),
    #[error("`{spec}` is neither a kernel pin ({pins}), nor `built:<id>` (see `cargo xtask kernels built`), nor a bzImage file")]
    UnknownKernel { spec: String, pins: String },
    #[error("{path} is not a kernel QEMU can boot: not a bzImage ({bzimage}), not a vmlinux ELF with a PVH entry ({elf}); pass arch/x86/boot/bzImage of a kernel build, a distribution's /boot/vmlinuz-*, or a pin id")]
    NotAKernel {
        path: PathBuf,
        bzimage: String,
        elf: String,
    },
}

/// The ledger's load errors, said as the suite says them (each is
/// transparent on both sides, so the text is the cause's own).
impl From<crate::workspace::LoadLedgerError> for SuiteError {
    fn from(e: crate::workspace::LoadLedgerError) -> Self {
        use crate::workspace::LoadLedgerError;
        match e {
            LoadLedgerError::Kernel(e) => SuiteError::Kernel(e),
            LoadLedgerError::Scenario(e) => SuiteError::Scenario(e),
            LoadLedgerError::Io(e) => SuiteError::Io(e),
            LoadLedgerError::Ledger(e) => SuiteError::Ledger(e),
        }
    }
}

/// Which trials to run.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Pin ids; empty = all of `arches`.
    pub kernels: Vec<String>,
    /// The architectures whose pins run when `kernels` names none (empty:
    /// x86-64's).
    pub arches: Vec<kloop_protocol::Arch>,
    /// Scenario names; empty = all.
    pub scenarios: Vec<String>,
    /// Run a user-built bzImage instead of the pins.
    pub kernel_image: Option<PathBuf>,
    pub snapshot_as: Option<String>,
    /// `snapshot_as` names a set being blessed now (`bless --as`): it
    /// need not exist yet.
    pub new_snapshot_set: bool,
}

/// One planned trial.
#[derive(Debug, Clone)]
pub struct PlannedTrial {
    pub kernel: KernelUnderTest,
    pub scenario: Scenario,
}

impl PlannedTrial {
    pub fn id(&self) -> String {
        format!("{}/{}", self.kernel.id(), self.scenario.name)
    }
}

/// The trials a selection names, in catalog × scenario order.
pub fn plan(layout: &Layout, sel: &Selection) -> Result<Vec<PlannedTrial>, SuiteError> {
    let all_scenarios = scenario::load_all(&layout.scenarios())?;
    let scenarios = scenario::select(&all_scenarios, &sel.scenarios)?;
    let kernels = resolve_kernels(layout, sel)?;
    let mut out = Vec::new();
    for k in &kernels {
        for s in &scenarios {
            out.push(PlannedTrial {
                kernel: k.clone(),
                scenario: s.clone(),
            });
        }
    }
    Ok(out)
}

/// The kernels a selection names: every pin by default; else each
/// `--kernel` as a pin id, `built:<id>` (a source build) or the path of a
/// bzImage; `--kernel-image` alone.
pub fn resolve_kernels(
    layout: &Layout,
    sel: &Selection,
) -> Result<Vec<KernelUnderTest>, SuiteError> {
    let arches = if sel.arches.is_empty() {
        vec![kloop_protocol::Arch::X86_64]
    } else {
        sel.arches.clone()
    };
    // A `--kernel` id is looked up among every architecture's pins (and a
    // built kernel judged by the pin of its series and architecture); with
    // no `--kernel`, the pins of `arches` run.
    let catalog = Catalog::load_all(&layout.kernels())?;
    if let Some(name) = sel.snapshot_as.as_ref().filter(|_| !sel.new_snapshot_set) {
        check_snapshot_set(layout, &catalog, name)?;
    }
    if let Some(path) = &sel.kernel_image {
        return Ok(vec![KernelUnderTest::Image(image_kernel(
            &catalog,
            path.clone(),
            sel.snapshot_as.clone(),
        )?)]);
    }
    if sel.kernels.is_empty() {
        return Ok(catalog
            .pins()
            .iter()
            .filter(|p| arches.contains(&p.arch()))
            .cloned()
            .map(KernelUnderTest::Pin)
            .collect());
    }
    // `--arch arm64 --kernel 6.12` names arm64's 6.12, not x86-64's.
    let arch = match arches.as_slice() {
        [one] => *one,
        _ => kloop_protocol::Arch::X86_64,
    };
    sel.kernels
        .iter()
        .map(|spec| {
            resolve_kernel(
                &catalog,
                &pin_id_for(&catalog, spec, arch),
                sel.snapshot_as.clone(),
            )
        })
        .collect()
}

/// `spec` as `arch`'s pin id where it is a bare one of that architecture's
/// pins (`6.12` with arm64 → `arm64/6.12`); any other spec as it is.
pub fn pin_id_for(catalog: &Catalog, spec: &str, arch: kloop_protocol::Arch) -> String {
    if arch != kloop_protocol::Arch::X86_64
        && kloop_protocol::Arch::of_id(spec).0 == kloop_protocol::Arch::X86_64
    {
        let id = format!("{}{spec}", arch.id_prefix());
        if catalog.get(&id).is_ok() {
            return id;
        }
    }
    spec.to_string()
}

/// One kernel spec: a pin id, `built:<id>`, or a path to a bzImage.
pub fn resolve_kernel(
    catalog: &Catalog,
    spec: &str,
    snapshot_as: Option<String>,
) -> Result<KernelUnderTest, SuiteError> {
    if let Ok(pin) = catalog.get(spec) {
        return Ok(KernelUnderTest::Pin(pin.clone()));
    }
    if let Some(id) = spec.strip_prefix("built:") {
        let cache = KernelCache::default_location()?;
        let built = kloop_kernels::build::lookup(&cache, id)?;
        return Ok(KernelUnderTest::Image(LocalKernel::built(
            &built,
            snapshot_as,
            catalog,
        )));
    }
    let path = PathBuf::from(spec);
    if path.is_file() {
        return Ok(KernelUnderTest::Image(image_kernel(
            catalog,
            path,
            snapshot_as,
        )?));
    }
    Err(SuiteError::UnknownKernel {
        spec: spec.to_string(),
        pins: catalog.ids().join(", "),
    })
}

/// A bzImage, judged by the ledger of the pin of its series (read from
/// its boot header), or a vmlinux with a PVH entry. Anything else is
/// refused before a VM starts: it would only end as INFRA.
fn image_kernel(
    catalog: &Catalog,
    path: PathBuf,
    snapshot_as: Option<String>,
) -> Result<LocalKernel, SuiteError> {
    let release = match kloop_kernels::bzimage_release(&path)
        .or_else(|bz| kloop_kernels::arm64_image_release(&path).map_err(|_| bz))
    {
        Ok(r) => Some(r),
        Err(bz) => match kloop_kernels::pvh::verify_elf(&path) {
            Ok(()) => None,
            Err(elf) => {
                let bzimage = match bz {
                    kloop_kernels::KernelError::BadImage { reason, .. } => reason,
                    other => other.to_string(),
                };
                let elf = elf.to_string();
                return Err(SuiteError::NotAKernel { path, bzimage, elf });
            }
        },
    };
    let k = LocalKernel::image(path, snapshot_as);
    Ok(match release {
        Some(r) => k.with_series_of(&r, catalog),
        None => k,
    })
}

/// `--snapshot-as NAME` must name a pin or a snapshot set blessed with
/// `bless --as NAME`.
fn check_snapshot_set(layout: &Layout, catalog: &Catalog, name: &str) -> Result<(), SuiteError> {
    if catalog.get(name).is_ok() {
        return Ok(());
    }
    let blessed = scenario::load_all(&layout.scenarios())?
        .iter()
        .any(|s| crate::run::trial::snapshot::snapshot_path(&s.snapshot_dir(), name).is_file());
    if blessed {
        return Ok(());
    }
    Err(SuiteError::UnknownSnapshotPin(
        name.to_string(),
        catalog.ids().join(", "),
    ))
}

/// One line per kernel of `trials` whose `.config` cannot be found, so the
/// config preflight cannot run for it: said once, before the run.
pub fn config_notes(env: &TrialEnv, trials: &[PlannedTrial]) -> Vec<String> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for t in trials {
        let id = t.kernel.id();
        if seen.contains(&id) {
            continue;
        }
        seen.push(id.clone());
        if let Err(why) = t.kernel.config(env) {
            out.push(format!(
                "{id}: {why}; no config preflight, the guest's probes decide what runs"
            ));
        }
    }
    out
}

/// How the shared environment is prepared.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    pub accel: AccelChoice,
    pub fetch: FetchOptions,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Appended to every guest's kernel command line.
    pub extra_cmdline: Vec<String>,
    pub boot: crate::run::trial::BootMode,
    /// `bless`: what the trials write instead of comparing.
    pub bless: crate::run::trial::Bless,
    /// Architectures whose QEMU and agent to prepare besides those of the
    /// kernels known beforehand: a run whose kernels come later (a
    /// bisection's builds) names its own.
    pub arches: Vec<kloop_protocol::Arch>,
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            accel: AccelChoice::Auto,
            fetch: FetchOptions::default(),
            cpus: 2,
            memory_mib: 512,
            extra_cmdline: Vec::new(),
            boot: Default::default(),
            bless: Default::default(),
            arches: Vec::new(),
        }
    }
}

/// Builds the agent, finds QEMU, and decides the accelerator (probing KVM
/// with the first of `probe_kernels` that can be had, when `auto`).
pub fn prepare_env(
    layout: &Layout,
    opts: &EnvOptions,
    probe_kernels: &[KernelUnderTest],
) -> Result<TrialEnv, SuiteError> {
    prepare_env_timed(layout, opts, probe_kernels).map(|(env, _)| env)
}

/// [`prepare_env`], and how long each of its phases took (for a run's
/// [`crate::run::phases::Phases`]).
///
/// The guest agent builds on a thread of its own while this one checks the
/// cache, makes the run directory, chooses the accelerator and downloads
/// `probe_kernels`' packages: on a fresh checkout the agent's cargo build
/// (about 30 s) and the pins' downloads (about 25 s) are independent, and
/// one after the other they were a minute of the first run.
pub fn prepare_env_timed(
    layout: &Layout,
    opts: &EnvOptions,
    probe_kernels: &[KernelUnderTest],
) -> Result<(TrialEnv, crate::run::phases::SetupPhases), SuiteError> {
    let mut laps = crate::run::phases::Laps::new();
    // A broken ledger is a setup error, found before anything is built.
    let known_issues = crate::workspace::load_ledger(layout)?;
    let expected_skips = scenario::skips::ExpectedSkips::load(&layout.kernels())?;
    let qemu = kloop_qemu::find_qemu()?;
    let qemu_version = kloop_qemu::qemu_version(&qemu).unwrap_or_else(|| "unknown".into());
    // A scenario folder that does not load fails its own trials (and the
    // planning before them); here it only ships nothing.
    let pin_modules = scenario::load_all(&layout.scenarios())
        .map(|all| scenario::shipped_modules(&all))
        .unwrap_or_default();
    let setup_secs = laps.lap();
    // Other architectures' kernels need their QEMU and agent; a missing
    // one fails those trials (INFRA, naming the package), not the run.
    let mut other: Vec<kloop_protocol::Arch> = probe_kernels
        .iter()
        .map(KernelUnderTest::arch)
        .chain(opts.arches.iter().copied())
        .filter(|a| *a != kloop_protocol::Arch::X86_64)
        .collect();
    other.sort();
    other.dedup();
    let (rest, agent, agent_own_secs, other_arches) = std::thread::scope(|s| {
        let build = s.spawn(|| {
            let started = std::time::Instant::now();
            let agent = crate::run::agent::ensure_built(&layout.root);
            // After x86-64's: two cargo builds at once on two cores are no
            // faster than one after the other.
            let others: std::collections::BTreeMap<_, _> = other
                .iter()
                .map(|&arch| (arch, arch_tools(layout, arch)))
                .collect();
            (agent, started.elapsed().as_secs_f64(), others)
        });
        let rest =
            beside_the_agent_build(layout, opts, probe_kernels, &pin_modules, &qemu, &mut laps);
        let (agent, own, others) = build
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (rest, agent, own, others)
    });
    // The agent's failure first: the next step it names (a build error)
    // comes before anything the rest may have met.
    let agent = agent?;
    let mut rest = rest?;
    // The lap since the rest ended is the wait for the agent: the part of
    // its build no other work hid.
    let agent_build_secs = laps.lap();
    rest.phases.setup_secs += setup_secs;
    rest.phases.agent_build_secs = agent_build_secs;
    rest.phases.agent_build_beside_secs = (agent_own_secs - agent_build_secs).max(0.0);
    let saved_vms =
        std::sync::Arc::new(crate::run::saved_vm::SavedVms::in_cache(rest.cache.root()));
    let env = TrialEnv {
        qemu,
        qemu_version,
        accel: rest.accel,
        agent,
        cache: rest.cache,
        fetch: opts.fetch.clone(),
        run_dir: rest.run_dir,
        cpus: opts.cpus,
        memory_mib: opts.memory_mib,
        deadlines: None,
        extra_cmdline: opts.extra_cmdline.clone(),
        boot: opts.boot,
        bless: opts.bless,
        saved_vms,
        known_issues,
        expected_skips,
        pin_modules,
        other_arches,
    };
    Ok((env, rest.phases))
}

/// The QEMU and agent of `arch`'s guests, or why they cannot be had.
fn arch_tools(
    layout: &Layout,
    arch: kloop_protocol::Arch,
) -> Result<crate::run::trial::ArchTools, String> {
    let qemu = kloop_qemu::find_qemu_for(arch).map_err(|e| e.to_string())?;
    let qemu_version = kloop_qemu::qemu_version(&qemu).unwrap_or_else(|| "unknown".into());
    let agent =
        crate::run::agent::ensure_built_for(&layout.root, arch).map_err(|e| e.to_string())?;
    Ok(crate::run::trial::ArchTools {
        qemu,
        qemu_version,
        agent,
        kernels_dir: layout.kernels(),
    })
}

/// What [`prepare_env_timed`] does while the agent builds.
struct Beside {
    cache: KernelCache,
    run_dir: PathBuf,
    accel: kloop_qemu::accel::AccelDecision,
    phases: crate::run::phases::SetupPhases,
}

/// The cache's room, the run directory (old ones pruned), then every
/// kernel of `probe_kernels` prepared one at a time as [`prefetch`] would
/// (downloaded, verified, its config, module package and PVH ELF; a kernel
/// that cannot be had is left to its trials, which fail with its message),
/// while the accelerator is chosen beside them (probing KVM with the first
/// of them that can be had, when `auto`). On a fresh cache all of it hides
/// behind the agent's build, which takes longer.
fn beside_the_agent_build(
    layout: &Layout,
    opts: &EnvOptions,
    probe_kernels: &[KernelUnderTest],
    pin_modules: &[String],
    qemu: &Path,
    laps: &mut crate::run::phases::Laps,
) -> Result<Beside, SuiteError> {
    let cache = KernelCache::default_location()?;
    // A read-only or full cache is said now, naming the next step, not as
    // a failed write halfway through a download or a saved VM.
    kloop_kernels::space::check_room(cache.root()).map_err(kloop_kernels::KernelError::from)?;
    let run_dir = crate::workspace::new_run_dir(&layout.runs()).doing(format!(
        "creating a run directory under {}",
        layout.runs().display()
    ))?;
    prune_old_runs(layout);
    let setup_secs = laps.lap();
    // A kernel that cannot be fetched fails its own trials later, with its
    // own message.
    let fetch = crate::run::phases::Within::default();
    let mut fetched = Vec::new();
    let mut ensure = |pin: &kloop_kernels::KernelPin| {
        let missing = !cache.image_path(pin).exists();
        let image = fetch.time(|| cache.ensure_image(pin, &opts.fetch).ok());
        if missing && image.is_some() {
            fetched.push(pin.id.clone());
        }
        image
    };
    // The KVM probe (when no verdict is cached: about 6 s where KVM hangs
    // silently) runs on its own thread, booting the first kernel that can
    // be had while this one fetches the others.
    let (first_image, probe_image) = std::sync::mpsc::channel::<Option<PathBuf>>();
    let accel_task = "accelerator";
    let (cache_root, probe_dir) = (cache.root(), run_dir.join("kvm-probe"));
    let accel = std::thread::scope(|s| {
        let chooser = s.spawn(move || {
            crate::run::status::start(
                accel_task,
                &format!("choosing the accelerator (--accel {})", opts.accel),
            );
            let mut probe = || probe_image.recv().ok().flatten();
            let accel = accel::choose(opts.accel, qemu, &mut probe, cache_root, &probe_dir)
                .map_err(|e| e.to_string());
            match &accel {
                Ok(_) => crate::run::status::done(accel_task, ""),
                Err(e) => crate::run::status::failed(accel_task, e),
            }
            accel
        });
        let mut first_image = Some(first_image);
        for k in probe_kernels {
            let image = match k {
                KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => ensure(pin),
                KernelUnderTest::Image(k) => k.path.is_file().then(|| k.path.clone()),
            };
            let Some(image) = image else { continue };
            if let Some(tx) = first_image.take() {
                let _ = tx.send(Some(image.clone()));
            }
            // The rest of what `prefetch` and the first trials prepare,
            // while the agent still builds: the config, a catalog pin's
            // module set (the sorted union every trial on it ships,
            // `modules_shipped`) and the PVH ELF. A failure is left to
            // `prefetch` and the trials, which say it.
            let modules = match k {
                KernelUnderTest::Pin(_) if !pin_modules.is_empty() => Modules::Set(pin_modules),
                _ => Modules::None,
            };
            let _ = fetch
                .time(|| prepare_beyond_image(&cache, &opts.fetch, opts.boot, k, &image, modules));
        }
        // No kernel could be had: the probe learns it from the closed channel.
        drop(first_image);
        chooser
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
    .map_err(SuiteError::Accel)?;
    // What the downloads did not hide of the accelerator's choice; the
    // downloads themselves are the kernels' phase (`fetch`), not setup's.
    let accel_secs = (laps.lap() - fetch.secs()).max(0.0);

    Ok(Beside {
        cache,
        run_dir,
        accel,
        phases: crate::run::phases::SetupPhases {
            setup_secs,
            agent_build_secs: 0.0,
            agent_build_beside_secs: 0.0,
            accel_secs,
            probe_fetch_secs: fetch.secs(),
            probe_fetched: fetched,
        },
    })
}

/// Which of a Debian kernel's modules [`prepare_beyond_image`] prepares.
enum Modules<'a> {
    None,
    /// Its module package, downloaded and verified.
    Package,
    /// This set, extracted from the package (what trials ship).
    Set(&'a [String]),
}

/// What `kernel`'s trials need beyond its `image`, prepared now: a Debian
/// kernel's config (one without is said once by `config_notes`; its trials
/// still run) and `modules`, then the image's PVH ELF (cached by the
/// image's hash; without it the trials boot the bzImage). Only the
/// modules' failure is returned, before the PVH ELF is made.
fn prepare_beyond_image(
    cache: &KernelCache,
    fetch: &kloop_kernels::FetchOptions,
    boot: BootMode,
    kernel: &KernelUnderTest,
    image: &Path,
    modules: Modules<'_>,
) -> Result<(), kloop_kernels::KernelError> {
    let sha = match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => {
            let _ = cache.ensure_config(pin, fetch);
            match modules {
                Modules::None => {}
                Modules::Package => {
                    cache.ensure_modules_deb(pin, fetch)?;
                }
                Modules::Set(names) => {
                    cache.ensure_modules(pin, names, fetch)?;
                }
            }
            Some(pin.image_sha256.as_str())
        }
        KernelUnderTest::Image(_) => None,
    };
    let arm64 = kloop_kernels::is_arm64_image_file(image);
    if boot != BootMode::BzImage && !arm64 {
        if let Err(e) = kloop_kernels::pvh::ensure_pvh(cache.root(), image, sha) {
            tracing::debug!(
                "{}: no PVH ELF ({e}); its trials boot the bzImage",
                kernel.id()
            );
        }
    }
    Ok(())
}

/// Removes run directories past `KLOOP_KEEP_RUNS` (on a thread; see
/// `workspace::run_dirs`).
fn prune_old_runs(layout: &Layout) {
    let keep = crate::workspace::run_dirs::keep_from_env();
    if keep == 0 {
        return;
    }
    let pruned = crate::workspace::run_dirs::prune(
        &layout.runs(),
        keep,
        &layout.root.join("target/kloop/report"),
        crate::workspace::run_dirs::Removal::Background,
    );
    if !pruned.removed.is_empty() {
        tracing::info!(
            "removed {} old run directories ({:.1} MB); {} keeps the newest {keep}",
            pruned.removed.len(),
            pruned.bytes as f64 / 1e6,
            crate::workspace::run_dirs::KEEP_ENV
        );
    }
}

/// Fetches, verifies and prepares every kernel `trials` need, once and one
/// kernel at a time, before any trial starts: parallel trials of one kernel
/// then never download it side by side, and the person waiting sees each
/// download and extraction as it happens. A kernel that cannot be had is
/// only reported here: its trials fail later with their own message.
/// Returns the ids of the pins whose image was not in the cache (fetched
/// or extracted now).
pub fn prefetch(env: &TrialEnv, trials: &[PlannedTrial]) -> Vec<String> {
    let mut fetched = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for t in trials {
        let id = t.kernel.id();
        if seen.contains(&id) {
            continue;
        }
        seen.push(id.clone());
        let needs_modules = trials.iter().any(|o| {
            o.kernel.id() == id
                && !modules_shipped(&env.pin_modules, &o.kernel, &o.scenario).is_empty()
        });
        let image = match &t.kernel {
            KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => {
                if !env.cache.image_path(pin).exists() {
                    fetched.push(id.clone());
                }
                env.cache.ensure_image(pin, &env.fetch)
            }
            KernelUnderTest::Image(k) => Ok(k.path.clone()),
        };
        let modules = if needs_modules {
            Modules::Package
        } else {
            Modules::None
        };
        let ready = image.and_then(|image| {
            prepare_beyond_image(&env.cache, &env.fetch, env.boot, &t.kernel, &image, modules)
        });
        if let Err(e) = ready {
            fetched.retain(|f| f != &id);
            crate::run::status::failed(
                &format!("kernel {id}"),
                &format!("{id}: {e}; its trials will fail"),
            );
        }
    }
    fetched
}

/// The order to start `trials` in so that `jobs` parallel VMs finish
/// together: longest first by `past` wall times (`run_dirs::
/// past_wall_times`), trials never timed before ahead of all (they may be
/// long, and the first trial of a kernel × VM shape makes its saved VM),
/// ties in catalog order. Started in catalog order, a matrix ends with one
/// VM running a pin's last slow trials while the other idles.
pub fn longest_first(trials: &[PlannedTrial], past: &HashMap<String, f64>) -> Vec<usize> {
    let ids: Vec<String> = trials.iter().map(PlannedTrial::id).collect();
    longest_first_by_id(&ids, past)
}

fn longest_first_by_id(ids: &[String], past: &HashMap<String, f64>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    let cost = |i: usize| past.get(&ids[i]).copied().unwrap_or(f64::INFINITY);
    order.sort_by(|&a, &b| cost(b).total_cmp(&cost(a)).then(a.cmp(&b)));
    order
}

/// Runs `trials` on parallel VMs (`par`), calling `on_result` as each ends.
/// Trials not started when an interrupt arrives are reported interrupted.
pub fn run_all(
    env: &TrialEnv,
    trials: &[PlannedTrial],
    par: Parallel,
    on_result: &(dyn Fn(&crate::run::trial::TrialResult) + Sync),
) -> Vec<crate::run::trial::TrialResult> {
    let order: Vec<usize> = (0..trials.len()).collect();
    run_in_order(env, trials, &order, par, on_result)
}

/// [`run_all`], starting the trials in `order` (indices into `trials`,
/// e.g. from [`longest_first`]); the results still come back in `trials`'
/// order.
pub fn run_in_order(
    env: &TrialEnv,
    trials: &[PlannedTrial],
    order: &[usize],
    par: Parallel,
    on_result: &(dyn Fn(&crate::run::trial::TrialResult) + Sync),
) -> Vec<crate::run::trial::TrialResult> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Condvar, Mutex};
    let shapes = shape_keys(env.cpus, &env.pin_modules, trials);
    let make = saved_vm_hints(trials, &shapes);
    let schedule = Mutex::new(Schedule {
        queue: Queue::new(order, &shapes, &make),
        running: 0,
        last_extra: None,
    });
    // Signalled when a trial ends (a slot frees) and on every idle sample.
    let changed = Condvar::new();
    let idle = Mutex::new(crate::run::parallel::IdleSampler::new());
    let workers_left = AtomicBool::new(true);
    let results: Mutex<Vec<(usize, crate::run::trial::TrialResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        if par.extra > 0 {
            s.spawn(|| {
                while workers_left.load(Ordering::Relaxed) {
                    locked(&idle).sample();
                    changed.notify_all();
                    std::thread::sleep(crate::run::parallel::TICK);
                }
            });
        }
        let workers: Vec<_> = (0..par.max_vms().min(trials.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    while let Some((i, t)) = admit(&schedule, &changed, &idle, par)
                        .and_then(|i| Some((i, trials.get(i)?)))
                    {
                        let r = if crate::run::signals::interrupted() {
                            interrupted_result(env, t)
                        } else {
                            let task = format!("trial {}", t.id());
                            crate::run::status::start(&task, &t.id());
                            let r = crate::run::trial::run_trial_with(
                                env,
                                &t.kernel,
                                &t.scenario,
                                make[i],
                            );
                            // The trial's line is the caller's to print (`on_result`).
                            crate::run::status::done(&task, "");
                            r
                        };
                        {
                            let mut sched = locked(&schedule);
                            sched.queue.ended(i);
                            sched.running -= 1;
                        }
                        changed.notify_all();
                        on_result(&r);
                        results
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((i, r));
                    }
                })
            })
            .collect();
        let mut panicked = None;
        for w in workers {
            if let Err(payload) = w.join() {
                panicked.get_or_insert(payload);
            }
        }
        workers_left.store(false, Ordering::Relaxed);
        // As an unjoined worker's would: the run does not go on as if
        // its trial had ended.
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// The queue and how many of its trials run.
struct Schedule<'a> {
    queue: Queue<'a>,
    running: usize,
    /// When the last trial beyond `par.vms` started.
    last_extra: Option<std::time::Instant>,
}

/// Blocks until a trial may start ([`crate::run::parallel::may_start`]) and
/// takes it from the queue; `None` once the queue is empty. A trial beyond
/// `par.vms` is never one that would wait for a saved VM being made.
fn admit(
    schedule: &std::sync::Mutex<Schedule<'_>>,
    changed: &std::sync::Condvar,
    idle: &std::sync::Mutex<crate::run::parallel::IdleSampler>,
    par: Parallel,
) -> Option<usize> {
    let mut sched = locked(schedule);
    loop {
        if sched.queue.is_empty() {
            return None;
        }
        let extra = sched.running >= par.vms;
        let idle_cores = extra.then(|| locked(idle).idle_cores()).flatten();
        let last_extra = sched.last_extra.map(|at| at.elapsed());
        if crate::run::parallel::may_start(sched.running, par, idle_cores, last_extra) {
            let next = if extra {
                sched.queue.next_without_waiting()
            } else {
                sched.queue.next()
            };
            if let Some(i) = next {
                sched.running += 1;
                if extra {
                    sched.last_extra = Some(std::time::Instant::now());
                }
                return Some(i);
            }
        }
        sched = changed
            .wait_timeout(sched, crate::run::parallel::TICK)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// `m`, also after a thread panicked holding it (what it guards stays
/// consistent: every change is one call).
fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The trials not started yet, in the order asked for, except that a
/// trial does not start while the first trial of its VM shape, which may
/// be making the shape's saved VM, still runs, as long as another trial
/// can start instead: otherwise a second VM would sit in the saved VM's
/// lock for the whole boot and save (4-15 s under TCG) that the first one
/// pays, which is most of a fresh kernel's first trials (a `validate`
/// candidate's, a first matrix's). Only order changes, never a trial.
struct Queue<'a> {
    waiting: Vec<usize>,
    shapes: &'a [String],
    /// Shapes whose first trial has started.
    seen: HashSet<&'a str>,
    /// Shapes whose first trial runs now, which may be making their saved
    /// VM (only those whose trials may make one: [`MakeSavedVm::Always`]).
    making: HashMap<&'a str, usize>,
    make: &'a [MakeSavedVm],
}

impl<'a> Queue<'a> {
    fn new(order: &[usize], shapes: &'a [String], make: &'a [MakeSavedVm]) -> Queue<'a> {
        Queue {
            waiting: order.to_vec(),
            shapes,
            seen: HashSet::new(),
            making: HashMap::new(),
            make,
        }
    }

    /// The trial to start next: the first waiting one whose shape is not
    /// being made, else the first waiting one.
    fn next(&mut self) -> Option<usize> {
        let at = self.first_free().or_else(|| {
            // Everything left waits for a saved VM being made: one more
            // waiter costs no more than an idle VM.
            (!self.waiting.is_empty()).then_some(0)
        })?;
        Some(self.take(at))
    }

    /// [`Queue::next`] without the waiting one: for a VM beyond one per
    /// core, which should add work, not another waiter.
    fn next_without_waiting(&mut self) -> Option<usize> {
        let at = self.first_free()?;
        Some(self.take(at))
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn first_free(&self) -> Option<usize> {
        self.waiting.iter().position(|i| {
            self.shapes
                .get(*i)
                .is_none_or(|s| !self.making.contains_key(s.as_str()))
        })
    }

    fn take(&mut self, at: usize) -> usize {
        let i = self.waiting.remove(at);
        if let Some(shape) = self.shapes.get(i) {
            if self.seen.insert(shape) && self.make.get(i) == Some(&MakeSavedVm::Always) {
                self.making.insert(shape, i);
            }
        }
        i
    }

    /// Trial `i` ended: its shape's saved VM is made (or will not be).
    fn ended(&mut self, i: usize) {
        self.making.retain(|_, first| *first != i);
    }
}

/// One VM per core, at least one: for runs that keep a fixed count
/// (mutants, bisection steps); a matrix fills idle time too
/// ([`Parallel::host_default`]).
pub fn default_jobs() -> usize {
    Parallel::host_default().vms
}

/// Per trial, what the scenario sets of its VM shape (its kernel, `[vm]`,
/// modules and programs): trials with equal keys share a saved VM. Not the
/// saved VM's key, which needs the guest image built: a grouping that
/// differs from the keys only costs time, never a verdict.
fn shape_keys(cpus: u32, pin_modules: &[String], trials: &[PlannedTrial]) -> Vec<String> {
    let shape = |t: &PlannedTrial| {
        let vm = &t.scenario.vm;
        format!(
            "{} | icount {} | cpus {} | cmdline {:?} | modules {:?} | programs {:?}",
            t.kernel.id(),
            vm.icount,
            vm.cpus.unwrap_or(cpus),
            vm.cmdline_words(),
            modules_shipped(pin_modules, &t.kernel, &t.scenario),
            t.scenario.programs
        )
    };
    trials.iter().map(shape).collect()
}

/// Per trial, whether it may make its shape's saved VM (`shapes` from
/// [`shape_keys`]): not when its kernel is a throwaway one (not a pin, so
/// no later run restores what is saved) with fewer than
/// [`FEW_TRIALS_FOR_A_SAVED_VM`] trials in `trials` on what will be one
/// saved VM.
///
/// [`FEW_TRIALS_FOR_A_SAVED_VM`]: crate::run::saved_vm::FEW_TRIALS_FOR_A_SAVED_VM
fn saved_vm_hints(trials: &[PlannedTrial], shapes: &[String]) -> Vec<MakeSavedVm> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for s in shapes {
        *counts.entry(s).or_default() += 1;
    }
    trials
        .iter()
        .zip(shapes)
        .map(|(t, s)| {
            let n = counts[s.as_str()];
            let pin = matches!(t.kernel, KernelUnderTest::Pin(_));
            if pin || n >= crate::run::saved_vm::FEW_TRIALS_FOR_A_SAVED_VM {
                MakeSavedVm::Always
            } else {
                MakeSavedVm::NotForFew(n)
            }
        })
        .collect()
}

fn interrupted_result(env: &TrialEnv, t: &PlannedTrial) -> crate::run::trial::TrialResult {
    crate::run::trial::TrialResult::new(
        env,
        &t.kernel,
        &t.scenario,
        crate::run::trial::Verdict::Interrupted("not started: interrupted".into()),
        env.run_dir.clone(),
    )
}

#[cfg(test)]
mod order_tests {
    use super::*;
    use std::path::Path;

    /// `--arch arm64 --kernel 6.12` names arm64's 6.12; anything that is
    /// not a bare pin id of that architecture stays as given.
    #[test]
    fn a_bare_pin_id_names_the_chosen_architectures_pin() {
        use kloop_protocol::Arch;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let catalog = Catalog::load_all(&root.join("kernels")).unwrap();
        assert_eq!(pin_id_for(&catalog, "6.12", Arch::Arm64), "arm64/6.12");
        assert_eq!(pin_id_for(&catalog, "6.12", Arch::X86_64), "6.12");
        assert_eq!(pin_id_for(&catalog, "arm64/6.1", Arch::Arm64), "arm64/6.1");
        assert_eq!(pin_id_for(&catalog, "built:abc", Arch::Arm64), "built:abc");
        assert_eq!(pin_id_for(&catalog, "9.9", Arch::Arm64), "9.9");
    }

    /// A validate candidate's shapes with fewer than four trials boot cold
    /// (told how many); its larger shape and every pin's make saved VMs.
    #[test]
    fn only_a_throwaway_kernels_small_shapes_skip_the_saved_vm() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let catalog = kloop_kernels::Catalog::load(&root.join("kernels")).unwrap();
        let pin = KernelUnderTest::Pin(catalog.pins()[0].clone());
        let built = KernelUnderTest::Image(LocalKernel {
            name: "built-0123".into(),
            path: "/nonexistent/bzImage".into(),
            snapshot_as: None,
            config: None,
            ledger_pin: None,
            modules: Vec::new(),
        });
        let scenario = |name: &str, vm: &str| {
            let text = format!("description = \"x\"\n{vm}\n[[steps]]\nop = \"drain\"\n");
            crate::scenario::Scenario::parse(name, Path::new("/s"), &text).unwrap()
        };
        let plain = ["a", "b", "c", "d"].map(|n| scenario(n, ""));
        // `cpus = 2` is the run's default: the same shape as no [vm].
        let two = scenario("e", "[vm]\ncpus = 2");
        let icount = scenario("f", "[vm]\nicount = true");
        let one_cpu = ["g", "h"].map(|n| scenario(n, "[vm]\ncpus = 1"));
        let mut trials = Vec::new();
        for kernel in [&built, &pin] {
            for s in plain.iter().chain([&two, &icount]).chain(&one_cpu) {
                trials.push(PlannedTrial {
                    kernel: kernel.clone(),
                    scenario: s.clone(),
                });
            }
        }
        let hints = saved_vm_hints(&trials, &shape_keys(2, &[], &trials));
        let (built_hints, pin_hints) = hints.split_at(8);
        assert_eq!(built_hints[..5], [MakeSavedVm::Always; 5]);
        assert_eq!(built_hints[5], MakeSavedVm::NotForFew(1));
        assert_eq!(built_hints[6..], [MakeSavedVm::NotForFew(2); 2]);
        assert_eq!(pin_hints, [MakeSavedVm::Always; 8]);
    }

    /// A second VM does not queue behind a saved VM being made while
    /// trials of other shapes wait; with nothing else left it does; a
    /// shape whose trials may not make one (a throwaway kernel's few) and a
    /// shape whose first trial ended hold nothing back.
    #[test]
    fn trials_do_not_wait_on_a_saved_vm_being_made_while_others_can_start() {
        let shapes: Vec<String> = ["a", "a", "b", "a", "c", "c"].map(String::from).to_vec();
        let mut make = vec![MakeSavedVm::Always; 6];
        make[4] = MakeSavedVm::NotForFew(2);
        make[5] = MakeSavedVm::NotForFew(2);
        let mut q = Queue::new(&[0, 1, 2, 3, 4, 5], &shapes, &make);
        assert_eq!(q.next(), Some(0), "a's first trial may make a's saved VM");
        assert_eq!(q.next(), Some(2), "not 1: a is being made; b's first");
        assert_eq!(q.next(), Some(4), "c boots cold: nothing to wait for");
        assert_eq!(q.next(), Some(5), "and its second does not wait either");
        assert_eq!(q.next(), Some(1), "only a's trials are left: one waits");
        q.ended(0);
        assert_eq!(q.next(), Some(3));
        assert_eq!(q.next(), None);
        // Once a shape's first trial ended, its others go in order.
        let mut q = Queue::new(&[1, 0, 3], &shapes, &make);
        assert_eq!(q.next(), Some(1));
        q.ended(1);
        assert_eq!((q.next(), q.next()), (Some(0), Some(3)));
    }

    #[test]
    fn longest_first_puts_untimed_trials_first_then_the_slowest() {
        let ids: Vec<String> = [
            "6.1/basic",
            "6.1/overhead",
            "6.1/new",
            "7.3/basic",
            "7.3/trampolines",
        ]
        .map(String::from)
        .to_vec();
        let past: HashMap<String, f64> = [
            ("6.1/basic", 1.0),
            ("6.1/overhead", 5.0),
            ("7.3/basic", 1.0),
            ("7.3/trampolines", 7.0),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
        // Untimed first; equal times keep catalog order.
        assert_eq!(longest_first_by_id(&ids, &past), [2, 4, 1, 0, 3]);
        assert_eq!(longest_first_by_id(&ids, &HashMap::new()), [0, 1, 2, 3, 4]);
    }
}
