//! The tools a run needs: QEMU and its firmware, clang that compiles for
//! BPF, the static libc the agent links, perf, the Debian tools and the
//! archive keyring.

use super::*;

pub(super) fn check_qemu() -> (Check, Option<PathBuf>) {
    let qemu = match kloop_qemu::find_qemu() {
        Ok(q) => q,
        Err(e) => {
            let fix = if std::env::var_os("KLOOP_QEMU").is_some() {
                "unset KLOOP_QEMU, or point it at a qemu-system-x86_64 binary".to_string()
            } else {
                install_fix(kloop_qemu::QEMU_PACKAGE)
            };
            return (Check::fail("qemu", e.to_string(), fix), None);
        }
    };
    let line = kloop_qemu::qemu_version(&qemu);
    match line.as_deref().and_then(version_in) {
        Some(v) => (
            Check::ok("qemu", format!("{} (QEMU {v})", qemu.display())),
            Some(qemu),
        ),
        None => (
            Check::fail(
                "qemu",
                format!(
                    "{} does not answer --version with a version ({})",
                    qemu.display(),
                    line.unwrap_or_else(|| "no output".into())
                ),
                install_fix(kloop_qemu::QEMU_PACKAGE),
            ),
            None,
        ),
    }
}

/// Where SeaBIOS, QEMU's default firmware, is installed on Debian and Ubuntu.
pub(super) const SEABIOS: [&str; 2] = [
    "/usr/share/qemu/bios-256k.bin",
    "/usr/share/seabios/bios-256k.bin",
];

pub(super) fn check_firmware() -> Check {
    let requested = std::env::var("KLOOP_FIRMWARE")
        .ok()
        .filter(|f| !f.is_empty());
    match kloop_qemu::firmware() {
        Some(p) if p.is_file() => Check::ok(
            "firmware",
            match requested {
                Some(_) => format!("{} (KLOOP_FIRMWARE)", p.display()),
                None => format!("qboot {}", p.display()),
            },
        ),
        Some(p) => Check::fail(
            "firmware",
            format!("KLOOP_FIRMWARE={} does not exist", p.display()),
            "unset KLOOP_FIRMWARE (qboot when installed, else SeaBIOS), or point it at a -bios image",
        ),
        None => {
            let seabios = SEABIOS.iter().map(Path::new).find(|p| p.exists());
            match (seabios, requested.is_some()) {
                (Some(p), true) => Check::ok(
                    "firmware",
                    format!("SeaBIOS {} (KLOOP_FIRMWARE=seabios)", p.display()),
                ),
                (Some(p), false) => Check::warn(
                    "firmware",
                    format!(
                        "qboot is not installed ({}): guests start through SeaBIOS ({}), \
                         about 0.25 s slower a boot",
                        kloop_qemu::QBOOT,
                        p.display()
                    ),
                    install_fix("qemu-system-data"),
                ),
                (None, _) => Check::fail(
                    "firmware",
                    format!(
                        "neither qboot ({}) nor SeaBIOS (bios-256k.bin) is installed: QEMU \
                         cannot start a guest",
                        kloop_qemu::QBOOT
                    ),
                    install_fix("qemu-system-data seabios"),
                ),
            }
        }
    }
}

pub(super) fn check_clang() -> Check {
    let name = std::env::var("KLOOP_CLANG").unwrap_or_else(|_| "clang".into());
    let fix = install_fix("clang");
    let Some(clang) = kloop_qemu::find_in_path(&name) else {
        return Check::fail(
            "clang",
            format!("`{name}` not found: the guest agent's BPF fixtures cannot be compiled"),
            fix,
        );
    };
    let version = first_line(&clang, "--version")
        .as_deref()
        .and_then(version_in)
        .unwrap_or_else(|| "version unknown".into());
    // The real question is whether this clang has the BPF back end: compile
    // a one-line program the way guest/build.rs compiles the fixtures.
    match compiles_for_bpf(&clang) {
        Ok(()) => Check::ok(
            "clang",
            format!("{} ({version}), compiles for -target bpf", clang.display()),
        ),
        Err(why) => Check::fail(
            "clang",
            format!(
                "{} ({version}) cannot compile for -target bpf: {why}",
                clang.display()
            ),
            fix,
        ),
    }
}

/// Why clang did not compile for `-target bpf`.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoBpfBackEnd {
    #[error("no temporary directory: {0}")]
    NoTempDir(std::io::Error),
    #[error("{0}")]
    Run(#[from] std::io::Error),
    /// The first line clang wrote.
    #[error("{0}")]
    Refused(String),
}

pub(super) fn compiles_for_bpf(clang: &Path) -> Result<(), NoBpfBackEnd> {
    use std::io::Write;
    let dir = tempfile::tempdir().map_err(NoBpfBackEnd::NoTempDir)?;
    let mut child = Command::new(clang)
        .args(["-target", "bpf", "-O2", "-c", "-x", "c", "-", "-o"])
        .arg(dir.path().join("probe.o"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"int kloop_doctor(void *ctx) { return 0; }\n");
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(NoBpfBackEnd::Refused(
            stderr
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message")
                .trim()
                .to_string(),
        ))
    }
}

/// The agent is linked statically (`crt-static`) against glibc.
pub(super) const STATIC_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.a";

pub(super) fn check_static_libc() -> Check {
    if Path::new(STATIC_LIBC).is_file() {
        Check::ok(
            "libc.a",
            format!("{STATIC_LIBC} (the agent links statically)"),
        )
    } else {
        Check::fail(
            "libc.a",
            format!("{STATIC_LIBC} is missing: the static guest agent cannot be linked"),
            install_fix("libc6-dev"),
        )
    }
}

pub(super) fn check_perf(os: &HostOs) -> Check {
    let from_env = std::env::var_os("KLOOP_PERF").is_some();
    match payload::host_perf() {
        Ok(perf) => {
            let how = if from_env {
                "; from KLOOP_PERF".to_string()
            } else if perf == Path::new(payload::HOST_PERF) {
                String::new()
            } else if Path::new(payload::HOST_PERF).exists() {
                format!("; behind {}, a wrapper script", payload::HOST_PERF)
            } else {
                format!("; {} does not exist", payload::HOST_PERF)
            };
            match first_line(&perf, "--version")
                .as_deref()
                .and_then(version_in)
            {
                Some(v) => Check::ok("perf", format!("{} (perf {v}{how})", perf.display())),
                None => Check::fail(
                    "perf",
                    format!(
                        "{}{how} does not run `--version`: the perf-tool scenario's trials \
                         will be INFRA",
                        perf.display()
                    ),
                    perf_fix(os),
                ),
            }
        }
        Err(e) => {
            let detail = match &e {
                PayloadError::PerfMissing { path } => format!(
                    "{} does not exist{}: the perf-tool scenario's trials will be INFRA",
                    path.display(),
                    if from_env { " (KLOOP_PERF)" } else { "" }
                ),
                PayloadError::NoRealPerf { wrapper } => format!(
                    "{} is a wrapper script with no perf binary behind it: the perf-tool \
                     scenario's trials will be INFRA",
                    wrapper.display()
                ),
                other => other.to_string(),
            };
            Check::fail("perf", detail, perf_fix(os))
        }
    }
}

pub(super) fn check_tool(
    item: &'static str,
    name: &str,
    version_arg: &str,
    package: &str,
) -> Check {
    let Some(path) = kloop_qemu::find_in_path(name) else {
        return Check::fail(item, format!("`{name}` not found"), install_fix(package));
    };
    match first_line(&path, version_arg)
        .as_deref()
        .and_then(version_in)
    {
        Some(v) => Check::ok(item, format!("{} ({v})", path.display())),
        None => Check::fail(
            item,
            format!("{} does not run `{version_arg}`", path.display()),
            install_fix(package),
        ),
    }
}

pub(super) fn check_keyring(fetch: &FetchOptions) -> Check {
    let keyring = fetch.resolve_keyring();
    let from_env = std::env::var_os(KEYRING_ENV).is_some_and(|k| !k.is_empty());
    if keyring.is_file() {
        Check::ok(
            "keyring",
            format!(
                "{}{}",
                keyring.display(),
                if from_env { " (KLOOP_KEYRING)" } else { "" }
            ),
        )
    } else {
        Check::warn(
            "keyring",
            format!(
                "{} is missing: pinned kernels still fetch (their sha256 pins them), but \
                 `kernels update`, `pin-build` and `pin-source` need Debian's signed index",
                keyring.display()
            ),
            format!(
                "{}, or export KLOOP_KEYRING=<a keyring with Debian's archive keys>",
                install_fix("debian-archive-keyring")
            ),
        )
    }
}

/// What arm64 guests need (`--arch arm64`): QEMU's aarch64 emulator and
/// Debian's Rust with the arm64 std and the cross linker, which build the
/// arm64 agent. Optional: a WARN naming what is missing, since the x86-64
/// matrix runs without any of it.
pub(super) fn check_arm64() -> Check {
    use kloop_protocol::Arch;
    let mut missing = Vec::new();
    let qemu = kloop_qemu::find_qemu_for(Arch::Arm64).ok();
    if qemu.is_none() {
        missing.push("qemu-system-aarch64 (qemu-system-arm)".to_string());
    }
    let rustc = Path::new(crate::run::agent::DEBIAN_RUSTC);
    let rustc_version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if rustc_version.is_none() {
        missing.push(format!("{} (rustc-web)", rustc.display()));
    }
    let std_dir = crate::run::agent::debian_std_dir(Arch::Arm64);
    if !std_dir.join("lib").is_dir() {
        missing.push(format!("{} (libstd-rust-web-dev:arm64)", std_dir.display()));
    }
    if kloop_qemu::find_in_path(crate::run::agent::AARCH64_LINKER).is_none() {
        missing.push(format!(
            "{} (gcc-aarch64-linux-gnu)",
            crate::run::agent::AARCH64_LINKER
        ));
    }
    if !Path::new("/usr/aarch64-linux-gnu/lib/libc.a").is_file() {
        missing.push("/usr/aarch64-linux-gnu/lib/libc.a (libc6-dev-arm64-cross)".to_string());
    }
    if missing.is_empty() {
        let qemu_line = qemu
            .as_deref()
            .and_then(kloop_qemu::qemu_version)
            .and_then(|l| version_in(&l))
            .unwrap_or_else(|| "?".into());
        return Check::ok(
            "arm64",
            format!(
                "QEMU {qemu_line} (aarch64), {}, arm64 std in {}",
                rustc_version.unwrap_or_default(),
                std_dir.display()
            ),
        );
    }
    Check::warn(
        "arm64",
        format!(
            "arm64 guests (--arch arm64) cannot run: missing {}",
            missing.join(", ")
        ),
        "ci/setup.sh --arch arm64",
    )
}
