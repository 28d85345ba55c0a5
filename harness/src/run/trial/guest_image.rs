//! What the guest boots: the kernel file QEMU gets, the modules and payload
//! the scenario needs, the initramfs with the agent and its plan, and the
//! VM configuration.

use std::path::{Path, PathBuf};

use kloop_kernels::ModuleSet;
use kloop_qemu::{Deadlines, VmConfig};

use super::{BootEntry, KernelUnderTest, LocalKernel, TrialEnv, Verdict};
use crate::run::initramfs::Initramfs;
use crate::run::payload::Payload;
use crate::scenario::Scenario;

/// Everything a trial needs before QEMU starts; `Err` is the trial's
/// (infrastructure) verdict when something cannot be had.
pub(super) fn prepare_guest(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &Scenario,
    artefacts: &Path,
) -> Result<VmConfig, Verdict> {
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
    let image = boot_file(env, &image, verified_sha, artefacts);
    let initramfs = artefacts.join("initramfs.cpio");
    let payload = match scenario_payload(scenario) {
        Ok(p) => p,
        Err(e) => return Err(Verdict::Infrastructure(e.to_string())),
    };
    if let Err(e) = build_initramfs(&env.agent, scenario, modules.as_ref(), &payload, &initramfs) {
        return Err(Verdict::Infrastructure(format!(
            "writing initramfs {}: {e}",
            initramfs.display()
        )));
    }
    let accel = env.accel.accel();
    let config = VmConfig {
        qemu: env.qemu.clone(),
        kernel: image,
        initramfs: Some(initramfs),
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
    };
    Ok(config)
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

/// The file QEMU's `-kernel` gets for `image`. A PVH failure is not the
/// trial's: the bzImage boots instead, and `boot.txt` says why.
pub(super) fn boot_file(
    env: &TrialEnv,
    image: &Path,
    image_sha256: Option<&str>,
    artefacts: &Path,
) -> PathBuf {
    let note = match env.boot {
        BootEntry::BzImage => "bzimage (as asked)".to_string(),
        BootEntry::Pvh => {
            match kloop_kernels::pvh::ensure_pvh(env.cache.root(), image, image_sha256) {
                Ok(elf) => {
                    let _ = std::fs::write(
                        artefacts.join("boot.txt"),
                        format!("pvh: {} from {}\n", elf.display(), image.display()),
                    );
                    return elf;
                }
                Err(e) => format!("bzimage, because PVH is not possible: {e}"),
            }
        }
    };
    let _ = std::fs::write(
        artefacts.join("boot.txt"),
        format!("{note}: {}\n", image.display()),
    );
    image.to_path_buf()
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

pub(super) fn build_initramfs(
    agent: &Path,
    scenario: &Scenario,
    modules: Option<&ModuleSet>,
    payload: &Payload,
    out: &Path,
) -> std::io::Result<()> {
    let agent_bytes = std::fs::read(agent)?;
    let plan = serde_json::to_vec_pretty(&scenario.plan).map_err(std::io::Error::other)?;
    let mut i = Initramfs::skeleton();
    i.add_file("init", 0o755, agent_bytes);
    i.add_file(kloop_protocol::PLAN_PATH, 0o644, plan);
    if let Some(modules) = modules {
        i.add_dir(kloop_protocol::MODULES_DIR);
        for (path, data) in modules.initramfs_files()? {
            i.add_file(&path, 0o644, data);
        }
    }
    for d in payload.dirs() {
        i.add_dir(&d);
    }
    for f in &payload.files {
        let bytes = std::fs::read(&f.host_path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("payload file {}: {e}", f.host_path.display()),
            )
        })?;
        i.add_file(&f.guest_path, f.mode, bytes);
    }
    i.write_file(out).map(drop)
}
