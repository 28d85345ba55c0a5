//! KVM: the probe runs use, its cached verdict and what it means here.

use super::*;

pub(super) fn check_kvm(
    qemu: Option<&Path>,
    cache: Option<&KernelCache>,
    catalog: Option<&Catalog>,
    recheck: bool,
) -> Check {
    if !Path::new("/dev/kvm").exists() {
        return Check::warn(
            "kvm",
            "no /dev/kvm: guests run under TCG (correct, several times slower)",
            "enable (nested) hardware virtualisation for this machine and load kvm_intel or \
             kvm_amd (modprobe kvm_intel); kloop works without it",
        );
    }
    if let Err(e) = accel::kvm_device_usable() {
        return Check::warn(
            "kvm",
            format!("TCG: {e}"),
            "sudo usermod -aG kvm $USER and log in again (on a CI runner: the udev rule step \
             in .github/workflows/vm-test.yml)",
        );
    }
    let (Some(qemu), Some(cache)) = (qemu, cache) else {
        return Check::warn(
            "kvm",
            "/dev/kvm answers, but without QEMU and a kernel cache no probe guest can tell \
             whether KVM works",
            "fix the qemu and cache lines above, then cargo xtask doctor",
        );
    };
    if recheck {
        if let Err(e) = accel::forget_verdict(cache.root(), qemu) {
            return Check::warn(
                "kvm",
                format!(
                    "cannot remove the cached verdict {}: {e}",
                    accel::verdict_file(cache.root(), qemu).display()
                ),
                "remove that file by hand, then cargo xtask doctor --recheck",
            );
        }
    }
    // Only a kernel already in the cache: the doctor downloads nothing.
    let offline = FetchOptions {
        offline: true,
        ..FetchOptions::default()
    };
    let mut probe_kernel = || {
        catalog?
            .pins()
            .iter()
            .find_map(|p| cache.ensure_image(p, &offline).ok())
    };
    let scratch = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            return Check::warn(
                "kvm",
                format!("no temporary directory for the probe guest: {e}"),
                "free space in $TMPDIR, then cargo xtask doctor",
            )
        }
    };
    let decision = match accel::choose(
        AccelChoice::Auto,
        qemu,
        &mut probe_kernel,
        cache.root(),
        scratch.path(),
    ) {
        Ok(d) => d,
        Err(e) => return Check::warn("kvm", e.to_string(), "cargo xtask doctor --recheck"),
    };
    decision_check(&decision, &accel::verdict_file(cache.root(), qemu))
}

/// What the accelerator decision means here: where it came from, and the fix
/// that fits how it was reached when it is not KVM.
fn decision_check(decision: &accel::AccelDecision, verdict_path: &Path) -> Check {
    let verdict = match (decision.from_cache, decision.probe_ms) {
        // A TCG verdict's reason names its file already.
        (true, _) if decision.reason.contains(&*verdict_path.to_string_lossy()) => {
            " [cached verdict]".to_string()
        }
        (true, _) => format!(" [cached verdict {}]", verdict_path.display()),
        (false, Some(ms)) => format!(" [probed now, {:.1} s]", ms as f64 / 1000.0),
        (false, None) => String::new(),
    };
    if decision.accel == "kvm" {
        return Check::ok("kvm", format!("{}{verdict}", decision.reason));
    }
    let fix = if decision.probe_ms.is_none() && !decision.from_cache {
        // No verdict was reached: nothing to probe with.
        "cargo xtask kernels fetch 6.1 (a kernel for the probe guest), then cargo xtask doctor"
    } else if decision.from_cache {
        "after fixing (nested) virtualisation: cargo xtask doctor --recheck"
    } else {
        "enable (nested) hardware virtualisation for this machine, then cargo xtask doctor \
         --recheck; kloop works under TCG meanwhile"
    };
    Check::warn("kvm", format!("{}{verdict}", decision.reason), fix)
}
