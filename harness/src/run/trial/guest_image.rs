//! What the guest boots: the kernel file QEMU gets, the modules and payload
//! the scenario needs, the initramfs with the agent and its plan, and the
//! VM configuration.

use std::path::{Path, PathBuf};

use kloop_kernels::ModuleSet;
use kloop_qemu::{Deadlines, VmConfig};

use super::{BootMode, KernelUnderTest, LocalKernel, TrialEnv, Verdict};
use crate::run::initramfs::Initramfs;
use crate::run::payload::Payload;
use crate::scenario::Scenario;

/// What a guest is made of, before it is decided whether it boots cold or
/// comes from a saved VM.
pub(crate) struct GuestParts {
    /// The VM without its initramfs: kernel file, shape, deadlines.
    pub vm: VmConfig,
    pub modules: Option<ModuleSet>,
    pub payload: Payload,
    /// How the kernel file was chosen, for `boot.txt`.
    pub boot_note: String,
}

impl GuestParts {
    /// The initramfs: the agent, the scenario's modules and payload, and,
    /// for a cold boot, the plan (a VM that is saved gets its plan later,
    /// over the data channel).
    pub fn initramfs(
        &self,
        agent: &Path,
        plan: Option<&kloop_protocol::Plan>,
    ) -> std::io::Result<Initramfs> {
        let mut i = Initramfs::skeleton();
        i.add_file("init", 0o755, std::fs::read(agent)?);
        if let Some(plan) = plan {
            let plan = serde_json::to_vec_pretty(plan).map_err(std::io::Error::other)?;
            i.add_file(kloop_protocol::PLAN_PATH, 0o644, plan);
        }
        if let Some(modules) = &self.modules {
            i.add_dir(kloop_protocol::MODULES_DIR);
            for (path, data) in modules.initramfs_files()? {
                i.add_file(&path, 0o644, data);
            }
        }
        for d in self.payload.dirs() {
            i.add_dir(&d);
        }
        for f in &self.payload.files {
            let bytes = std::fs::read(&f.host_path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("payload file {}: {e}", f.host_path.display()),
                )
            })?;
            i.add_file(&f.guest_path, f.mode, bytes);
        }
        Ok(i)
    }

    /// The cold boot's configuration. Its initramfs is two archives end
    /// to end, which the kernel's unpacker reads as one: the plan-less base
    /// (agent, modules, payload: up to tens of MB with perf), written once
    /// per run under `<run>/initramfs/<sha256>.cpio` and shared by every
    /// trial that boots the same content, and the trial's own `plan.cpio`
    /// (one file) in its directory. QEMU takes a single `-initrd` file, so
    /// the two are joined in a temporary file that lives as long as the
    /// returned [`JoinedInitramfs`]; `boot.txt` names both parts.
    pub fn cold_config(
        &self,
        env: &TrialEnv,
        scenario: &Scenario,
        artefacts: &Path,
    ) -> Result<(VmConfig, JoinedInitramfs), Verdict> {
        let infra = |what: String| Verdict::Infrastructure(what);
        let base = self
            .initramfs(&env.agent, None)
            .and_then(|i| archive_bytes(&i))
            .map_err(|e| infra(format!("building the initramfs: {e}")))?;
        let base_path = shared_base(&env.run_dir, &base)
            .map_err(|e| infra(format!("writing the run's base initramfs: {e}")))?;
        let mut plan_archive = Initramfs::default();
        let plan = serde_json::to_vec_pretty(&scenario.plan)
            .map_err(|e| infra(format!("encoding the plan: {e}")))?;
        plan_archive.add_file(kloop_protocol::PLAN_PATH, 0o644, plan);
        let plan_path = artefacts.join("plan.cpio");
        let plan_bytes = archive_bytes(&plan_archive)
            .and_then(|b| std::fs::write(&plan_path, &b).map(|()| b))
            .map_err(|e| infra(format!("writing {}: {e}", plan_path.display())))?;
        let joined = tempfile::Builder::new()
            .prefix("kloop-initramfs-")
            .suffix(".cpio")
            .tempfile()
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(&base)?;
                f.write_all(&plan_bytes)?;
                f.flush()?;
                Ok(f)
            })
            .map_err(|e| infra(format!("joining the initramfs in $TMPDIR: {e}")))?;
        let config = VmConfig {
            initramfs: Some(joined.path().to_path_buf()),
            ..self.vm.clone()
        };
        Ok((
            config,
            JoinedInitramfs {
                note: format!(
                    "initramfs: {} (shared by the run's trials of this content) + {}",
                    base_path.display(),
                    plan_path.display()
                ),
                _file: joined,
            },
        ))
    }
}

/// The joined initramfs QEMU reads; removed when dropped, after the VM.
pub(crate) struct JoinedInitramfs {
    /// `boot.txt`'s line: the two parts it was joined from.
    pub note: String,
    _file: tempfile::NamedTempFile,
}

/// `archive` as bytes, padded with zeros to a multiple of 512 so another
/// archive can follow it (the kernel's unpacker skips zeros between
/// archives and wants each to start 4-byte aligned).
pub(crate) fn archive_bytes(archive: &Initramfs) -> std::io::Result<Vec<u8>> {
    let mut bytes = archive.write_to(Vec::new())?;
    bytes.resize(bytes.len().div_ceil(512) * 512, 0);
    Ok(bytes)
}

/// `<run_dir>/initramfs/<sha256>.cpio` holding `bytes`, written once
/// (atomically, so parallel trials never read half a file).
fn shared_base(run_dir: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    use sha2::Digest;
    let dir = run_dir.join("initramfs");
    let path = dir.join(format!("{}.cpio", hex::encode(sha2::Sha256::digest(bytes))));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// A trial as a reproducer boots it with QEMU alone: the bzImage, the whole
/// initramfs (agent, modules, payload and plan in one archive) and the VM.
pub struct StandaloneGuest {
    pub kernel_file: PathBuf,
    pub initramfs: Vec<u8>,
    pub vm: VmConfig,
}

/// `kernel` × `scenario` for a reproducer (`env.boot` should be
/// [`BootMode::BzImage`]: the bzImage boots with any QEMU and firmware).
/// `scratch` is a directory the preparation may write into.
pub fn standalone_guest(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    scratch: &Path,
) -> Result<StandaloneGuest, Verdict> {
    // Another architecture's agent and QEMU.
    let env = &*env
        .for_arch(kernel.arch())
        .map_err(Verdict::Infrastructure)?;
    let parts = prepare_guest(env, kernel, scenario, scratch)?;
    let initramfs = parts
        .initramfs(&env.agent, Some(&scenario.plan))
        .and_then(|i| archive_bytes(&i))
        .map_err(|e| Verdict::Infrastructure(format!("building the initramfs: {e}")))?;
    Ok(StandaloneGuest {
        kernel_file: parts.vm.kernel.clone(),
        initramfs,
        vm: parts.vm,
    })
}

/// Everything a trial needs before QEMU starts; `Err` is the trial's
/// (infrastructure) verdict when something cannot be had.
pub(crate) fn prepare_guest(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    artefacts: &Path,
) -> Result<GuestParts, Verdict> {
    if let Err(e) = std::fs::create_dir_all(artefacts) {
        return Err(Verdict::Infrastructure(format!(
            "cannot create artefact directory {}: {e}",
            artefacts.display()
        )));
    }
    let image = kernel_image(env, kernel)?;
    let modules = guest_modules(env, kernel, scenario)?;
    let verified_sha = match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => {
            Some(pin.image_sha256.as_str())
        }
        KernelUnderTest::Image(_) => None,
    };
    let kasan = match kernel {
        KernelUnderTest::Image(k) => k
            .config
            .as_ref()
            .is_some_and(|c| c.is_builtin("CONFIG_KASAN")),
        _ => false,
    };
    let (image, boot_note) = boot_file(env, &image, verified_sha, kasan);
    if let Some(why) = perf_unavailable_for(kernel.arch(), scenario) {
        return Err(Verdict::Skipped(why));
    }
    let payload =
        match scenario_payload(scenario, &env.cache.root().join("programs"), kernel.arch()) {
            Ok(p) => p,
            Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
        };
    let accel = env.accel.accel();
    let arch = kernel.arch();
    let vm = VmConfig {
        qemu: env.qemu.clone(),
        arch,
        kernel: image,
        initramfs: None,
        accel,
        cpus: scenario.vm.cpus.unwrap_or(env.cpus),
        memory_mib: env.memory_mib,
        cmdline: scenario
            .vm
            .cmdline_words()
            .into_iter()
            .chain(env.extra_cmdline.iter().cloned())
            .collect(),
        artefacts: artefacts.to_path_buf(),
        deadlines: {
            // A kernel with its own runtime checks is slower: its
            // deadlines grow with them (a test's own deadlines stand).
            let slowdown = kernel.checks(env).slowdown() * arch_slowdown(arch);
            let mut d = env
                .deadlines
                .unwrap_or_else(|| Deadlines::for_accel(accel).scaled(slowdown));
            if let Some(secs) = scenario.vm.total_secs {
                d.total = d.total.min(std::time::Duration::from_secs(secs));
            }
            d
        },
        data_channel: true,
        icount: scenario.vm.icount,
        channel_limit: kloop_qemu::channel_limit(),
        start: Default::default(),
        console: Default::default(),
    };
    Ok(GuestParts {
        vm,
        modules,
        payload,
        boot_note,
    })
}

/// The bzImage to boot: a pin's from the cache (fetched when missing), a
/// local kernel's where it was said to be.
fn kernel_image(env: &TrialEnv, kernel: &KernelUnderTest) -> Result<PathBuf, Verdict> {
    match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => env
            .cache
            .ensure_image(pin, &env.fetch)
            .map_err(|e| Verdict::Infrastructure(e.to_string())),
        KernelUnderTest::Image(k) => {
            if !k.path.is_file() {
                return Err(Verdict::Infrastructure(format!(
                    "kernel image {} does not exist (expected a bzImage, e.g. arch/x86/boot/bzImage)",
                    k.path.display()
                )));
            }
            Ok(k.path.clone())
        }
    }
}

/// The modules a trial's guest ships ([`modules_shipped`]). A scenario
/// that needs none still runs when a catalog pin's shared ones cannot be
/// had, on a VM shape of its own.
fn guest_modules(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
) -> Result<Option<ModuleSet>, Verdict> {
    let shipped = modules_shipped(&env.pin_modules, kernel, scenario);
    if shipped.is_empty() {
        return Ok(None);
    }
    let boot = crate::scenario::needs::boot_modules(kernel.arch());
    Ok(Some(match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => {
            match env.cache.ensure_modules(pin, &shipped, &env.fetch) {
                Ok(set) => set,
                Err(e) if scenario.modules.is_empty() && boot.is_empty() => {
                    tracing::debug!("{}: shipping no modules ({e})", pin.id);
                    return Ok(None);
                }
                Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
            }
        }
        KernelUnderTest::Image(k) => builtin_modules(k, kernel.arch(), scenario)?,
    }))
}

/// The modules a trial's guest ships: on a catalog pin its scenario's and
/// every other scenario's (`pin_modules`, [`TrialEnv::pin_modules`]),
/// sorted, once, so the scenarios share one VM shape; on any other kernel
/// its scenario's alone.
pub fn modules_shipped(
    pin_modules: &[String],
    kernel: &KernelUnderTest,
    scenario: &Scenario,
) -> Vec<String> {
    let boot = crate::scenario::needs::boot_modules(kernel.arch())
        .iter()
        .map(|m| m.to_string());
    if !matches!(kernel, KernelUnderTest::Pin(_)) {
        let mut own: Vec<String> = boot.chain(scenario.modules.iter().cloned()).collect();
        own.dedup();
        return own;
    }
    let mut all: Vec<String> = pin_modules
        .iter()
        .chain(&scenario.modules)
        .cloned()
        .chain(boot)
        .collect();
    all.sort();
    all.dedup();
    all
}

/// A local kernel has no package to take modules from: every module the
/// scenario loads must be built in, as its `.config` tells; the guest's
/// `modprobe` then finds it marked built in.
fn builtin_modules(
    k: &LocalKernel,
    kernel_arch: kloop_protocol::Arch,
    scenario: &Scenario,
) -> Result<ModuleSet, Verdict> {
    let Some(config) = &k.config else {
        return Err(Verdict::Skipped(format!(
            "kernel modules {:?}: {} has no .config to tell whether they are built in (no build \
             tree around it, no IKCONFIG) and no package to take them from; build them in and \
             with CONFIG_IKCONFIG, or run the scenario on a pin",
            scenario.modules,
            k.path.display()
        )));
    };
    // Modules built with the kernel (a checked build's controls) ship as
    // files; every other one must be built in.
    let wanted: Vec<String> = crate::scenario::needs::boot_modules(kernel_arch)
        .iter()
        .map(|m| m.to_string())
        .chain(scenario.modules.iter().cloned())
        .collect();
    let (own, rest): (Vec<&String>, Vec<&String>) = wanted
        .iter()
        .partition(|m| k.modules.iter().any(|(name, _)| name == *m));
    let own: Vec<(String, std::path::PathBuf)> = k
        .modules
        .iter()
        .filter(|(name, _)| own.contains(&name))
        .cloned()
        .collect();
    for m in rest.iter().copied() {
        let Some(option) = crate::scenario::needs::module_option(m) else {
            return Err(Verdict::Infrastructure(format!(
                "scenario {} loads module {m}, whose config option kloop does not know \
                 (scenario::needs::module_option): add it there",
                scenario.name
            )));
        };
        if !config.is_builtin(option) {
            let state = config
                .value(option)
                .map_or(" not set".to_string(), |v| format!("={v}"));
            return Err(Verdict::Skipped(format!(
                "{option}{state} in {}: module {m} must be built in (=y), since kloop takes \
                 modules only from a pinned kernel's package",
                config.source
            )));
        }
    }
    let builtin: Vec<String> = rest.into_iter().cloned().collect();
    if own.is_empty() {
        return Ok(ModuleSet::builtin_only(builtin));
    }
    // Built in the kernel's own tree, for it alone: no release to check.
    ModuleSet::local("", &own, builtin)
        .map_err(|e| Verdict::Infrastructure(format!("shipping the kernel's own modules: {e}")))
}

/// The file QEMU's `-kernel` gets for `image`, and the line `boot.txt`
/// says about it. A PVH failure is not the trial's: the bzImage boots
/// instead, and the line says why.
///
/// A KASAN kernel boots from its bzImage: the PVH entry (arch/x86/platform/
/// pvh/head.S) calls `xen_prepare_pvh()` before `startup_64`, and
/// arch/x86/platform/pvh/enlighten.c is instrumented (its Makefile has no
/// `KASAN_SANITIZE := n`), so its first memory access checks shadow memory
/// that `kasan_early_init()` (head64.c, later) has not mapped yet: the
/// guest triple-faults with an empty console.
pub(super) fn boot_file(
    env: &TrialEnv,
    image: &Path,
    image_sha256: Option<&str>,
    kasan: bool,
) -> (PathBuf, String) {
    if kloop_kernels::is_arm64_image_file(image) {
        // QEMU's `virt` board boots an arm64 `Image` itself: there is no
        // decompressor to skip (Debian's arm64 images are not compressed).
        return (
            image.to_path_buf(),
            format!("arm64 Image: {}", image.display()),
        );
    }
    let note = match env.boot {
        BootMode::BzImage => "bzimage (as asked)".to_string(),
        BootMode::Saved | BootMode::Cold if kasan => {
            "bzimage, because a KASAN kernel's PVH entry runs instrumented code before \
             kasan_early_init() (arch/x86/platform/pvh)"
                .to_string()
        }
        BootMode::Saved | BootMode::Cold => {
            match kloop_kernels::pvh::ensure_pvh(env.cache.root(), image, image_sha256) {
                Ok(elf) => {
                    let note = format!("pvh: {} from {}", elf.display(), image.display());
                    return (elf, note);
                }
                Err(e) => format!("bzimage, because PVH is not possible: {e}"),
            }
        }
    };
    (image.to_path_buf(), format!("{note}: {}", image.display()))
}

/// Host programs the scenario needs in the guest: perf and its libraries
/// when it requires `perf-tool` or runs perf, and its `[[programs]]`
/// (built into `programs_cache`).
pub(super) fn scenario_payload(
    scenario: &Scenario,
    programs_cache: &Path,
    arch: kloop_protocol::Arch,
) -> Result<Payload, crate::run::payload::PayloadError> {
    let mut payload =
        crate::run::payload::programs_payload(&scenario.programs, programs_cache, arch)?;
    payload.files.extend(perf_payload_of(scenario)?.files);
    Ok(payload)
}

/// Why a scenario that runs perf cannot on a guest of `arch`: kloop ships
/// the host's own perf and its libraries ([`crate::run::payload::perf_payload`]),
/// x86-64 binaries, and no other architecture's. Said on the host, before
/// a boot, under the requirement's name, as the guest's probe would.
fn perf_unavailable_for(arch: kloop_protocol::Arch, scenario: &Scenario) -> Option<String> {
    if arch == kloop_protocol::Arch::X86_64 || !runs_perf(scenario) {
        return None;
    }
    Some(format!(
        "perf-tool: no {arch} perf to ship: kloop ships the host's own perf and its libraries \
         (x86-64 binaries); Debian's linux-perf:{} with its libraries is not unpacked for the \
         guest yet",
        arch.debian()
    ))
}

/// Whether the scenario runs perf in the guest.
fn runs_perf(scenario: &Scenario) -> bool {
    let plan = &scenario.plan;
    plan.requires
        .contains(&kloop_protocol::Requirement::PerfTool)
        || plan
            .steps
            .iter()
            .any(|s| matches!(s, kloop_protocol::Step::PerfRecordStart { .. }))
}

fn perf_payload_of(scenario: &Scenario) -> Result<Payload, crate::run::payload::PayloadError> {
    if runs_perf(scenario) {
        crate::run::payload::perf_payload()
    } else {
        Ok(Payload::default())
    }
}

/// How many times longer a guest of `arch` takes than an x86-64 one under
/// TCG on an x86-64 host: arm64's instructions are translated, not
/// passed through, and its boot probes more devices.
pub(crate) fn arch_slowdown(arch: kloop_protocol::Arch) -> u32 {
    match arch {
        kloop_protocol::Arch::X86_64 => 1,
        kloop_protocol::Arch::Arm64 => 3,
    }
}
