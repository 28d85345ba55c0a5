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

    /// The cold boot's configuration: the full initramfs, plan included,
    /// written into the trial's directory.
    pub fn cold_config(
        &self,
        env: &TrialEnv,
        scenario: &Scenario,
        artefacts: &Path,
    ) -> Result<VmConfig, Verdict> {
        let initramfs = artefacts.join("initramfs.cpio");
        self.initramfs(&env.agent, Some(&scenario.plan))
            .and_then(|i| i.write_file(&initramfs))
            .map_err(|e| {
                Verdict::Infrastructure(format!("writing initramfs {}: {e}", initramfs.display()))
            })?;
        Ok(VmConfig {
            initramfs: Some(initramfs),
            ..self.vm.clone()
        })
    }
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
    let image = match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::Build { pin, .. } => {
            match env.cache.ensure_image(pin, &env.fetch) {
                Ok(p) => p,
                Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
            }
        }
        KernelUnderTest::Image(k) => {
            if !k.path.is_file() {
                return Err(Verdict::Infrastructure(format!(
                    "kernel image {} does not exist (expected a bzImage, e.g. arch/x86/boot/bzImage)",
                    k.path.display()
                )));
            }
            k.path.clone()
        }
    };
    let modules = match (kernel, scenario.modules.is_empty()) {
        (_, true) => None,
        (KernelUnderTest::Pin(pin) | KernelUnderTest::Build { pin, .. }, false) => {
            match env.cache.ensure_modules(pin, &scenario.modules, &env.fetch) {
                Ok(set) => Some(set),
                Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
            }
        }
        (KernelUnderTest::Image(k), false) => Some(builtin_modules(k, scenario)?),
    };
    let verified_sha = match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::Build { pin, .. } => {
            Some(pin.image_sha256.as_str())
        }
        KernelUnderTest::Image(_) => None,
    };
    let (image, boot_note) = boot_file(env, &image, verified_sha);
    let payload = match scenario_payload(scenario) {
        Ok(p) => p,
        Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
    };
    let accel = env.accel.accel();
    let vm = VmConfig {
        qemu: env.qemu.clone(),
        kernel: image,
        initramfs: None,
        accel,
        cpus: scenario.vm.cpus.unwrap_or(env.cpus),
        memory_mib: env.memory_mib,
        cmdline: scenario
            .vm
            .cmdline
            .iter()
            .chain(&env.extra_cmdline)
            .cloned()
            .collect(),
        artefacts: artefacts.to_path_buf(),
        deadlines: env.deadlines.unwrap_or_else(|| Deadlines::for_accel(accel)),
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

/// A local kernel has no package to take modules from: every module the
/// scenario loads must be built in, as its `.config` tells; the guest's
/// `modprobe` then finds it marked built in.
fn builtin_modules(k: &LocalKernel, scenario: &Scenario) -> Result<ModuleSet, Verdict> {
    let Some(config) = &k.config else {
        return Err(Verdict::Skipped(format!(
            "kernel modules {:?}: {} has no .config to tell whether they are built in (no build \
             tree around it, no IKCONFIG) and no package to take them from; build them in and \
             with CONFIG_IKCONFIG, or run the scenario on a pin",
            scenario.modules,
            k.path.display()
        )));
    };
    for m in &scenario.modules {
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
    Ok(ModuleSet::builtin_only(scenario.modules.clone()))
}

/// The file QEMU's `-kernel` gets for `image`, and the line `boot.txt`
/// says about it. A PVH failure is not the trial's: the bzImage boots
/// instead, and the line says why.
pub(super) fn boot_file(
    env: &TrialEnv,
    image: &Path,
    image_sha256: Option<&str>,
) -> (PathBuf, String) {
    let note = match env.boot {
        BootMode::BzImage => "bzimage (as asked)".to_string(),
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
/// when it requires `perf-tool` or runs perf.
pub(super) fn scenario_payload(
    scenario: &Scenario,
) -> Result<Payload, crate::run::payload::PayloadError> {
    let plan = &scenario.plan;
    if plan
        .requires
        .contains(&kloop_protocol::Requirement::PerfTool)
        || plan
            .steps
            .iter()
            .any(|s| matches!(s, kloop_protocol::Step::PerfRecordStart { .. }))
    {
        crate::run::payload::perf_payload()
    } else {
        Ok(Payload::default())
    }
}
