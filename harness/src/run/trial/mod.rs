//! One trial: a kernel × a scenario, from image to verdict.
//!
//! pin → image → initramfs → VM → agent → evidence → check → normalise →
//! snapshot. Every failure is classified ([`Verdict`]) and every artefact
//! stays in the trial's directory, whose path the verdict names.

mod ending;
pub(crate) mod guest_image;
mod judging;
pub mod overhead;
pub mod snapshot;
mod verdict;

pub use guest_image::{standalone_guest, StandaloneGuest};
pub use judging::requirement_name;
pub use verdict::*;
// Callers choosing per trial (`suite::run_in_order`) name it from here.
pub use crate::run::saved_vm::MakeSavedVm;
use crate::run::saved_vm::SavedVmKernel;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kloop_protocol::{Arch, Message};
use kloop_qemu::{Deadlines, GuestSession, SessionEnd, Vm, VmConfig};

use crate::judge::evidence::RunEvidence;
use crate::run::saved_vm::{NoSavedVm, SavedVms};
use crate::scenario::Scenario;
use kloop_kernels::{KernelCache, KernelConfig, KernelPin};
use kloop_qemu::accel::AccelDecision;

/// Set (to anything) to skip the config preflight, so the guest's own
/// probes meet a kernel that lacks a feature (checking the probes).
pub const NO_PREFLIGHT_ENV: &str = "KLOOP_NO_PREFLIGHT";

/// The kernel a trial boots.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a handful per run, never stored in bulk
pub enum KernelUnderTest {
    /// A pinned Debian build from the catalog.
    Pin(KernelPin),
    /// A bzImage the user built, or a source build (`built:<id>`).
    Image(LocalKernel),
    /// A Debian build pinned for bisection (`kernels/bisect.lock`): a pin's
    /// image, config and modules, but no golden snapshot of its own, and
    /// judged by the ledger entries of `series_pin`, the catalog pin of its
    /// series (an entry that does not show is not `FIXED?`).
    DistroBuild {
        pin: KernelPin,
        series_pin: Option<String>,
    },
}

/// A kernel image that is not a pin.
#[derive(Debug, Clone)]
pub struct LocalKernel {
    /// The name in trial ids and artefact paths: `image`, `built-<id>`.
    pub name: String,
    pub path: PathBuf,
    /// The snapshot set it is compared with (a pin's, or one blessed with
    /// `bless --as`); none: invariants only.
    pub snapshot_as: Option<String>,
    /// Its `.config`, when one was found: the preflight reads it.
    pub config: Option<Arc<KernelConfig>>,
    /// The pin of the same series, whose known-bug ledger entries apply.
    pub ledger_pin: Option<String>,
    /// Modules built with this kernel, which its guest ships when a
    /// scenario loads them, as (name, path): a checked build's controls
    /// ([`kloop_kernels::build::controls`], [`crate::run::controls`]).
    pub modules: Vec<(String, PathBuf)>,
}

impl LocalKernel {
    /// A user's bzImage: its config from the build tree around it, else
    /// from its own IKCONFIG, else none (the guest's probes decide alone).
    pub fn image(path: PathBuf, snapshot_as: Option<String>) -> LocalKernel {
        let config = kloop_kernels::config::tree_config_for_image(&path)
            .and_then(|c| KernelConfig::from_file(&c).ok())
            .or_else(|| kloop_kernels::config::ikconfig_from_image(&path));
        LocalKernel {
            name: "image".into(),
            path,
            snapshot_as,
            config: config.map(Arc::new),
            ledger_pin: None,
            modules: Vec::new(),
        }
    }

    /// A kernel `cargo xtask kernels build` made, judged by the ledger of
    /// the pin of its series (from the release it was built as).
    pub fn built(
        kernel: &kloop_kernels::build::BuiltKernel,
        snapshot_as: Option<String>,
        catalog: &kloop_kernels::Catalog,
    ) -> LocalKernel {
        LocalKernel {
            name: format!("built-{}", kernel.record.id),
            path: kernel.image(),
            snapshot_as,
            config: kernel.config().ok().map(Arc::new),
            ledger_pin: None,
            modules: kernel.controls(),
        }
        .with_series_of(&kernel.record.release, catalog)
    }

    /// A pin's image run as a plain image (no snapshots, no ledger), with
    /// the pin's config.
    pub fn from_pin_image(path: PathBuf, config: Option<KernelConfig>) -> LocalKernel {
        LocalKernel {
            name: "image".into(),
            path,
            snapshot_as: None,
            config: config.map(Arc::new),
            ledger_pin: None,
            modules: Vec::new(),
        }
    }
}

impl LocalKernel {
    /// Sets [`LocalKernel::ledger_pin`] to the catalog's pin of the series
    /// `release` belongs to (`6.12.117` → the pin with series `6.12`).
    pub fn with_series_of(mut self, release: &str, catalog: &kloop_kernels::Catalog) -> Self {
        let series: Vec<&str> = release.split(['.', '-', '+']).take(2).collect();
        let series = series.join(".");
        // The pin of the same series and architecture (an arm64 image is
        // judged by the arm64 pin's entries).
        let arch = if kloop_kernels::is_arm64_image_file(&self.path) {
            Arch::Arm64
        } else {
            Arch::X86_64
        };
        self.ledger_pin = catalog
            .pins()
            .iter()
            .find(|p| p.series == series && p.arch() == arch)
            .map(|p| p.id.clone());
        self
    }
}

/// Where a kernel under test came from, as a KCIDB checkout and build say
/// (`report::kcidb` renders it).
#[derive(Debug, Clone, PartialEq)]
pub enum Provenance {
    /// A Debian binary package (a pin, or a build pinned for bisection).
    DebianBuild {
        package: String,
        version: String,
        suite: String,
        deb_sha256: String,
        image_sha256: String,
        release: String,
    },
    /// Built by kloop from a source package or tree, with patches.
    SourceBuild {
        /// `built:<id>`'s id.
        id: String,
        /// `linux-source-6.12 6.12.117-1~deb12u1`, or the tree's path.
        source: String,
        source_identity: String,
        /// (file name, absolute path, sha256).
        patches: Vec<(String, String, String)>,
        config_sha256: String,
        compiler: String,
        image_sha256: String,
        release: String,
    },
    /// A bzImage the user gave.
    Image { path: String, sha256: String },
}

impl Provenance {
    /// The architecture the kernel was built for: a Debian build's from its
    /// release (`…-cloud-arm64`), a source build's from the compiler it
    /// records (the cross gcc), an image's from its header.
    pub fn arch(&self) -> Arch {
        match self {
            Provenance::DebianBuild { release, .. } if release.ends_with("arm64") => Arch::Arm64,
            // The build record's compiler line: `aarch64-linux-gnu-gcc (Debian …)`.
            Provenance::SourceBuild { compiler, .. } if compiler.starts_with("aarch64-") => {
                Arch::Arm64
            }
            Provenance::Image { path, .. }
                if kloop_kernels::is_arm64_image_file(std::path::Path::new(path)) =>
            {
                Arch::Arm64
            }
            _ => Arch::X86_64,
        }
    }
}

impl KernelUnderTest {
    /// The architecture the kernel runs on: a pin's from its id, an
    /// image's from its header (an arm64 `Image` says `ARM\x64` at 56).
    pub fn arch(&self) -> Arch {
        match self {
            KernelUnderTest::Pin(p) | KernelUnderTest::DistroBuild { pin: p, .. } => p.arch(),
            KernelUnderTest::Image(k) if kloop_kernels::is_arm64_image_file(&k.path) => Arch::Arm64,
            KernelUnderTest::Image(_) => Arch::X86_64,
        }
    }

    /// Where this kernel came from, for the KCIDB document: the Debian
    /// package, the source build's record (from the kernel cache), or the
    /// image file and its sha256.
    pub fn provenance(&self, cache: &kloop_kernels::KernelCache) -> Provenance {
        match self {
            KernelUnderTest::Pin(p) | KernelUnderTest::DistroBuild { pin: p, .. } => {
                Provenance::DebianBuild {
                    package: p.package.clone(),
                    version: p.version.clone(),
                    suite: p.suite.clone(),
                    deb_sha256: p.deb_sha256.clone(),
                    image_sha256: p.image_sha256.clone(),
                    release: p.release.clone(),
                }
            }
            KernelUnderTest::Image(k) => {
                let built = k
                    .name
                    .strip_prefix("built-")
                    .and_then(|id| kloop_kernels::build::lookup(cache, id).ok());
                match built {
                    Some(b) => Provenance::SourceBuild {
                        id: b.record.id.clone(),
                        source: b.record.source.clone(),
                        source_identity: b.record.source_identity.clone(),
                        patches: b
                            .record
                            .patches
                            .iter()
                            .map(|f| {
                                (
                                    f.path
                                        .file_name()
                                        .map(|n| n.to_string_lossy().into_owned())
                                        .unwrap_or_default(),
                                    f.path.display().to_string(),
                                    f.sha256.clone(),
                                )
                            })
                            .collect(),
                        config_sha256: b.record.config_sha256.clone(),
                        compiler: b.record.compiler.clone(),
                        image_sha256: b.record.image_sha256.clone(),
                        release: b.record.release.clone(),
                    },
                    None => Provenance::Image {
                        path: k.path.display().to_string(),
                        sha256: image_sha256(&k.path),
                    },
                }
            }
        }
    }

    /// A Debian build outside the catalog (pinned on demand for a
    /// bisection), judged with the ledger of `catalog`'s pin of its series.
    pub fn distro_build(pin: KernelPin, catalog: &kloop_kernels::Catalog) -> KernelUnderTest {
        let series_pin = catalog
            .pins()
            .iter()
            .find(|p| p.series == pin.series && p.arch() == pin.arch())
            .map(|p| p.id.clone());
        KernelUnderTest::DistroBuild { pin, series_pin }
    }

    /// The Debian pin behind this kernel (a catalog pin or a bisection build).
    pub fn pin(&self) -> Option<&KernelPin> {
        match self {
            KernelUnderTest::Pin(p) | KernelUnderTest::DistroBuild { pin: p, .. } => Some(p),
            KernelUnderTest::Image(_) => None,
        }
    }

    /// The name used in trial ids: the pin id (a Debian version for a
    /// bisection build), `image`, or `built-<id>`.
    pub fn id(&self) -> String {
        match self {
            KernelUnderTest::Pin(p) | KernelUnderTest::DistroBuild { pin: p, .. } => p.id.clone(),
            KernelUnderTest::Image(k) => k.name.clone(),
        }
    }

    /// The file stem of the kernel's snapshots: a pin's id, with an arm64
    /// pin's `/` made a `-` (`arm64-6.12.snap` beside `6.12.snap`: insta
    /// would spell it `arm64__6.12`).
    fn snapshot_name(&self) -> Option<String> {
        match self {
            KernelUnderTest::Pin(p) => Some(p.id.replace('/', "-")),
            KernelUnderTest::DistroBuild { .. } => None,
            KernelUnderTest::Image(k) => k.snapshot_as.clone(),
        }
    }

    /// The runtime checks the kernel was built with (KASAN, kmemleak,
    /// lockdep, UBSAN), from its config; none known without one.
    pub fn checks(&self, env: &TrialEnv) -> crate::judge::kernel_log::KernelChecks {
        self.config(env)
            .map(|c| crate::judge::kernel_log::KernelChecks::from_config(|o| c.is_builtin(o)))
            .unwrap_or_default()
    }

    /// The kernel's `.config` for the preflight: the pin's package's, or
    /// the one found with the image. `Err`: why there is none.
    pub fn config(&self, env: &TrialEnv) -> Result<Arc<KernelConfig>, String> {
        match self {
            KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => env
                .cache
                .ensure_config(pin, &env.fetch)
                .map(Arc::new)
                .map_err(|e| e.to_string()),
            KernelUnderTest::Image(k) => k.config.clone().ok_or_else(|| {
                format!(
                    "no .config for {}: no build tree around it and no IKCONFIG in it",
                    k.path.display()
                )
            }),
        }
    }
}

/// What every trial of one run shares.
/// What `cargo xtask bless` asks the trials to write from this run rather
/// than compare with (a setting passed as a value; the environment is read
/// only at the command line's edge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bless {
    /// The golden snapshots (insta writes them: `INSTA_UPDATE=always`,
    /// which insta reads itself, is set with this).
    pub snapshots: bool,
    /// The overhead budgets (`bless --overhead`).
    pub overhead: bool,
}

/// What runs guests of one architecture: its QEMU and the agent built
/// for it.
#[derive(Debug, Clone)]
pub struct ArchTools {
    pub qemu: PathBuf,
    pub qemu_version: String,
    pub agent: PathBuf,
    /// `kernels/`: where the pins of its guest tools are
    /// ([`kloop_kernels::guest_tool`]), fetched only by what needs them.
    pub kernels_dir: PathBuf,
}

#[derive(Clone)]
pub struct TrialEnv {
    /// x86-64's QEMU; another architecture's is in [`TrialEnv::other_arches`].
    pub qemu: PathBuf,
    pub qemu_version: String,
    pub accel: AccelDecision,
    pub agent: PathBuf,
    pub cache: KernelCache,
    pub fetch: kloop_kernels::FetchOptions,
    /// `target/kloop/runs/<run>`.
    pub run_dir: PathBuf,
    pub cpus: u32,
    pub memory_mib: u32,
    pub deadlines: Option<Deadlines>,
    /// Appended to every guest's kernel command line (`--append`).
    pub extra_cmdline: Vec<String>,
    pub boot: BootMode,
    pub bless: Bless,
    /// The saved VMs trials restore (with [`BootMode::Saved`]).
    pub saved_vms: Arc<SavedVms>,
    /// The known-issues ledger trials on pins are judged by.
    pub known_issues: crate::judge::known_issues::Ledger,
    /// Which pin × scenario is expected to be SKIPPED
    /// (`kernels/expected-skips.toml`).
    pub expected_skips: crate::scenario::skips::ExpectedSkips,
    /// The modules every trial on a catalog pin ships: the union of every
    /// scenario's `modules` ([`crate::scenario::shipped_modules`]). A
    /// shipped module's file sits unused in the initramfs until a
    /// `modprobe` step loads it, so the scenarios that need one share the
    /// pin's other saved VMs instead of a VM shape of their own.
    pub pin_modules: Vec<String>,
    /// The tools of every other architecture a kernel under test needs,
    /// or why they could not be had (its trials are INFRA with that).
    pub other_arches: std::collections::BTreeMap<Arch, Result<ArchTools, String>>,
}

impl TrialEnv {
    /// busybox for a guest of `arch` (the host's for x86-64, else the
    /// pinned Debian package of `arch`, fetched on first use).
    pub fn busybox(
        &self,
        arch: Arch,
    ) -> Result<(crate::run::payload::Payload, Vec<String>), crate::run::payload::PayloadError>
    {
        let kernels_dir = match self.other_arches.get(&arch) {
            Some(Ok(t)) => Ok(t.kernels_dir.as_path()),
            Some(Err(why)) => Err(why.clone()),
            None => Err("no tools of it were prepared for this run".to_string()),
        };
        crate::run::payload::busybox_payload_for(arch, &self.cache, kernels_dir, &self.fetch)
    }

    /// The environment a trial of `arch` runs in: this one for x86-64;
    /// for another architecture, its QEMU and agent in place of x86-64's,
    /// under TCG (KVM runs only the host's own architecture).
    pub fn for_arch(&self, arch: Arch) -> Result<std::borrow::Cow<'_, TrialEnv>, String> {
        if arch == Arch::X86_64 {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let tools = match self.other_arches.get(&arch) {
            Some(Ok(t)) => t,
            Some(Err(why)) => return Err(why.clone()),
            None => {
                return Err(format!(
                    "no {arch} QEMU or agent was prepared for this run (a kernel of {arch} \
                     reached a run set up for others)"
                ))
            }
        };
        let mut env = self.clone();
        env.qemu = tools.qemu.clone();
        env.qemu_version = tools.qemu_version.clone();
        env.agent = tools.agent.clone();
        env.accel = kloop_qemu::accel::AccelDecision {
            accel: "tcg".into(),
            reason: format!("{arch} guest on an x86-64 host: TCG (KVM runs only the host's own)"),
            probe_ms: None,
            from_cache: false,
        };
        Ok(std::borrow::Cow::Owned(env))
    }
}

/// How a trial's guest starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BootMode {
    /// Restore the VM of this kernel × VM shape saved where the agent
    /// awaits its plan ([`crate::run::saved_vm`]), made by one cold PVH
    /// boot when there is none; a cold boot when saving or restoring fails.
    #[default]
    Saved,
    /// A cold boot through the kernel's PVH entry: its own ELF, decompressed
    /// once on the host ([`kloop_kernels::pvh`]); the bzImage when that fails.
    Cold,
    /// A cold boot of the bzImage as is: firmware, real-mode setup, the
    /// decompressor.
    BzImage,
}

impl BootMode {
    /// The values `--boot` takes.
    pub const NAMES: [&'static str; 3] = ["saved", "cold", "bzimage"];
}

/// `--boot`'s value names no boot mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown boot mode `{0}`: use saved, cold or bzimage")]
pub struct UnknownBootMode(pub String);

impl std::str::FromStr for BootMode {
    type Err = UnknownBootMode;
    fn from_str(s: &str) -> Result<Self, UnknownBootMode> {
        match s {
            "saved" => Ok(BootMode::Saved),
            // `pvh` was the name of the cold PVH boot before saved VMs.
            "cold" | "pvh" => Ok(BootMode::Cold),
            "bzimage" => Ok(BootMode::BzImage),
            other => Err(UnknownBootMode(other.to_string())),
        }
    }
}

/// Runs one trial to its verdict. Never panics on guest input; never leaves
/// QEMU running.
pub fn run_trial(env: &TrialEnv, kernel: &KernelUnderTest, scenario: &Scenario) -> TrialResult {
    run_trial_with(env, kernel, scenario, MakeSavedVm::Always)
}

/// [`run_trial`], told whether to make a missing saved VM.
pub fn run_trial_with(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    make: MakeSavedVm,
) -> TrialResult {
    let env = match env.for_arch(kernel.arch()) {
        Ok(env) => env,
        Err(why) => {
            let artefacts = claim_dir(&env.run_dir.join(kernel.id()).join(&scenario.name));
            return TrialResult::new(
                env,
                kernel,
                scenario,
                Verdict::Infrastructure(why),
                artefacts,
            );
        }
    };
    let env = &*env;
    let artefacts = claim_dir(&env.run_dir.join(kernel.id()).join(&scenario.name));
    let started = Instant::now();
    let mut result = TrialResult::new(env, kernel, scenario, Verdict::Ok, artefacts.clone());
    result.verdict = run_inner(env, kernel, make, scenario, &artefacts, &mut result);
    result.verdict = skip_as_expected(
        env,
        kernel,
        scenario,
        result.verdict.clone(),
        &mut result.notes,
    );
    result.wall_secs = started.elapsed().as_secs_f64();
    if let Some(p) = result.phases.as_mut() {
        p.host_checks = (result.wall_secs - p.prepare - p.qemu_total()).max(0.0);
    }
    if let Ok(json) = serde_json::to_string_pretty(&result) {
        let _ = std::fs::write(artefacts.join("result.json"), json);
    }
    result
}

/// A pin's skip is an expectation (`crate::scenario::skips`): a `SKIPPED`
/// trial the list does not name fails, and a listed one that ran says so
/// in its notes. Other kernels' skips are the guest's probe's word.
fn skip_as_expected(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    verdict: Verdict,
    notes: &mut Vec<String>,
) -> Verdict {
    let KernelUnderTest::Pin(pin) = kernel else {
        return verdict;
    };
    // Interrupted, timed out or broken trials say nothing about a skip.
    let skipped = match &verdict {
        Verdict::Skipped(why) => Some(why.as_str()),
        Verdict::Ok | Verdict::Known(_) | Verdict::Failed(_) | Verdict::Fixed(_) => None,
        _ => return verdict,
    };
    match crate::scenario::skips::judge(&env.expected_skips, &pin.id, &scenario.name, skipped) {
        Ok(None) => verdict,
        Ok(Some(note)) => {
            notes.push(note);
            verdict
        }
        Err(message) => Verdict::failed(FailureCause::UnexpectedSkip, message),
    }
}

fn run_inner(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    make: MakeSavedVm,
    scenario: &Scenario,
    artefacts: &Path,
    result: &mut TrialResult,
) -> Verdict {
    let trial_started = Instant::now();
    // Preflight: a need the kernel's .config lacks skips the trial before
    // any boot; without a config the guest's probes decide alone.
    let preflight = std::env::var_os(NO_PREFLIGHT_ENV).is_none();
    if let Some(config) = kernel.config(env).ok().filter(|_| preflight) {
        if let Some(reason) = crate::scenario::needs::preflight(scenario, &config) {
            return Verdict::Skipped(reason);
        }
    }
    let parts = match guest_image::prepare_guest(env, kernel, scenario, artefacts) {
        Ok(parts) => parts,
        Err(verdict) => return verdict,
    };
    let mut boot_lines = vec![parts.boot_note.clone()];
    let mut session = None;
    if env.boot == BootMode::Saved {
        let pin = matches!(kernel, KernelUnderTest::Pin(_));
        match restore(
            env,
            SavedVmFrom {
                parts: &parts,
                pin,
                make,
            },
            scenario,
            artefacts,
            trial_started,
            result,
        ) {
            Ok((restored, line)) => {
                boot_lines.push(line);
                session = Some(restored);
            }
            // Chosen: said in boot.txt only.
            Err(why @ NoSavedVm::NotMade { .. }) => {
                boot_lines.push(format!("cold boot, because {why}"));
            }
            Err(why) => {
                // On the trial's line too: a run that silently lost its
                // saved VMs would only be slower, and nobody would know why.
                result.notes.push(format!("booted cold: {why}"));
                boot_lines.push(format!("cold boot, because {why}"));
            }
        }
    }
    let mut initramfs_note = None;
    let (session, prepare) = match session {
        Some(s) => s,
        None => {
            let (config, initramfs) = match parts.cold_config(env, scenario, artefacts) {
                Ok(cold) => cold,
                Err(verdict) => return verdict,
            };
            initramfs_note = Some(initramfs.note.clone());
            match boot(config, trial_started) {
                Ok(s) => s,
                Err(verdict) => return verdict,
            }
        }
    };
    result.started_from = Some(boot_lines.last().cloned().unwrap_or_default());
    boot_lines.extend(initramfs_note);
    let _ = std::fs::write(artefacts.join("boot.txt"), boot_lines.join("\n") + "\n");
    let restored = result.saved_vm.as_ref().is_some_and(|s| s.restored);
    note_timings(&session, prepare, restored, result);
    save_messages(artefacts, &session.messages);
    if let Some(verdict) = ending::session_verdict(&session, artefacts) {
        return verdict;
    }
    judging::judge(env, kernel, scenario, artefacts, &session, result)
}

/// Spawns `config`'s QEMU and runs its session: the session and the host's
/// preparation time before the spawn.
fn boot(config: VmConfig, trial_started: Instant) -> Result<(GuestSession, f64), Verdict> {
    let mut vm = Vm::spawn(config).map_err(|e| Verdict::Infrastructure(e.to_string()))?;
    let prepare = trial_started.elapsed().as_secs_f64();
    let session = vm.run_session(&crate::run::signals::interrupted);
    drop(vm);
    Ok((session, prepare))
}

/// What [`restore`] boots from: the guest's parts, whether the kernel is
/// a pin, and whether a missing saved VM is made.
struct SavedVmFrom<'a> {
    parts: &'a guest_image::GuestParts,
    pin: bool,
    make: MakeSavedVm,
}

/// The trial from its shape's saved VM (made now if there is none): the
/// session and `boot.txt`'s line; which saved VM it used goes into
/// `result`. `Err`: why it boots cold instead.
fn restore(
    env: &TrialEnv,
    from: SavedVmFrom<'_>,
    scenario: &Scenario,
    artefacts: &Path,
    trial_started: Instant,
    result: &mut TrialResult,
) -> Result<((GuestSession, f64), String), NoSavedVm> {
    use NoSavedVm::Failed;
    let SavedVmFrom { parts, pin, make } = from;
    let inputs = format!(
        "agent {} | modules {:?} | payload {:?}",
        env.agent.display(),
        parts.modules,
        parts.payload
    );
    let initramfs = || {
        parts
            .initramfs(&env.agent, None)
            .and_then(|i| i.write_to(Vec::new()))
    };
    let saved = env.saved_vms.ensure(
        SavedVmKernel {
            label: &result.kernel.clone(),
            pin,
            make,
        },
        &parts.vm,
        &env.qemu_version,
        &inputs,
        &initramfs,
        &crate::run::signals::interrupted,
    )?;
    let mut used = SavedVmUse {
        key: saved.key().to_string(),
        made_now: saved.created_now,
        restored: false,
    };
    let config = env
        .saved_vms
        .restore_config(&saved, &parts.vm, &scenario.plan, artefacts)
        .map_err(|e| Failed(format!("saved VM {} unusable: {e}", saved.key())))?;
    let (session, prepare) = boot(config, trial_started)
        .map_err(|v| Failed(v.message().unwrap_or("QEMU did not start").to_string()))?;
    if let Some(SessionEnd::RestoreFailed(why)) = &session.end {
        result.saved_vm = Some(used);
        env.saved_vms.forget(&saved, why);
        // The restore's own console and stderr stay for the curious.
        for f in ["console.log", "qemu.stderr", "data.bin"] {
            let _ = std::fs::rename(
                artefacts.join(f),
                artefacts.join(format!("restore-failed-{f}")),
            );
        }
        return Err(Failed(format!(
            "restoring saved VM {} failed: {why}",
            saved.key()
        )));
    }
    let line = format!(
        "restored: saved VM {} ({}){}",
        saved.key(),
        saved.dir.display(),
        if saved.created_now {
            format!(
                ", saved by this trial: boot to awaiting plan {:.2} s, save {:.2} s",
                saved.meta.boot_to_ready_secs, saved.meta.save_secs
            )
        } else {
            String::new()
        }
    );
    used.restored = true;
    result.saved_vm = Some(used);
    Ok(((session, prepare), line))
}

/// Where the trial's time went and QEMU's peak memory, into `result`.
fn note_timings(session: &GuestSession, prepare: f64, restored: bool, result: &mut TrialResult) {
    result.boot_to_hello_secs = session.hello_at.map(|d| d.as_secs_f64());
    if let Some(hello) = session.hello_at {
        let uptime = session
            .messages
            .iter()
            .find_map(|m| match m {
                Message::Hello { monotonic_ns, .. } => Some(*monotonic_ns as f64 / 1e9),
                _ => None,
            })
            .filter(|_| !restored);
        result.phases = Some(Phases {
            prepare,
            to_hello: hello.as_secs_f64(),
            guest_uptime_at_hello: uptime,
            agent: session.done_at.map(|d| (d - hello).as_secs_f64()),
            shutdown: session
                .done_at
                .map(|d| session.wall.saturating_sub(d).as_secs_f64()),
            host_checks: 0.0,
            qemu_cpu_to_hello: session.qemu_cpu_at_hello,
            qemu_cpu_agent: session
                .qemu_cpu_at_done
                .zip(session.qemu_cpu_at_hello)
                .map(|(d, h)| d - h),
            restored,
        });
    }
    result.qemu_peak_rss_kib = session.qemu_peak_rss_kib;
    result.steps = crate::run::trial::StepTime::of_messages(&session.messages);
}

fn save_messages(dir: &Path, messages: &[Message]) {
    if let Ok(mut f) = std::fs::File::create(dir.join("messages.jsonl")) {
        for m in messages {
            // perf's file is kept whole as perf.data, not as hex here.
            let piece;
            let m = match m {
                Message::PerfData { offset, total, .. } => {
                    piece = Message::PerfData {
                        offset: *offset,
                        total: *total,
                        hex: String::new(),
                    };
                    &piece
                }
                other => other,
            };
            if let Ok(line) = serde_json::to_string(m) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// Collects the guest's messages into the evidence the checks read.
pub fn evidence_from(session: &kloop_qemu::GuestSession) -> RunEvidence {
    let mut ev = RunEvidence::from_messages(&session.messages, session.streams.clone());
    ev.step_marks = session.step_marks.clone();
    ev
}

/// `base`, or `base-2`, `base-3`, … when a trial of the same name already
/// ran in this run (repeats, benches): created atomically, so parallel
/// trials never share a directory.
fn claim_dir(base: &Path) -> PathBuf {
    if let Some(parent) = base.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for n in 1.. {
        let candidate = if n == 1 {
            base.to_path_buf()
        } else {
            base.with_file_name(format!("{name}-{n}"))
        };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            // Reported by run_inner when it cannot create the directory.
            Err(_) => return candidate,
        }
    }
    unreachable!("an unbounded range always yields")
}

#[cfg(test)]
mod tests;

/// The sha256 of a file, empty when it cannot be read.
fn image_sha256(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    std::fs::read(path)
        .map(|b| hex::encode(Sha256::digest(&b)))
        .unwrap_or_default()
}
