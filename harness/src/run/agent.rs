//! Building the guest agent: a static `kloop-guest` binary for `/init`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The target the x86-64 agent is built for; glibc with `crt-static`
/// because the musl target cannot be installed everywhere kloop runs
/// ([`Arch::rust_target`] for the others).
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-gnu";

use kloop_protocol::Arch;

#[derive(Debug, thiserror::Error)]
pub enum AgentBuildError {
    #[error("KLOOP_AGENT={0} does not exist")]
    MissingOverride(PathBuf),
    #[error("could not run cargo to build the guest agent: {0}")]
    Cargo(std::io::Error),
    #[error("building the guest agent failed (`{command}`):\n{stderr_tail}")]
    Failed {
        command: String,
        stderr_tail: String,
    },
    #[error("the guest agent at {0} is not statically linked; it cannot run as /init")]
    NotStatic(PathBuf),
    #[error(
        "no Rust standard library for {target} at {std_dir}: the {arch} agent is built with \
         Debian's own Rust (rustup cannot fetch other targets' std here); run \
         `ci/setup.sh --arch {arch}` (or `dpkg --add-architecture arm64 && apt-get install \
         rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross`)"
    )]
    NoCrossToolchain {
        arch: Arch,
        target: &'static str,
        std_dir: PathBuf,
    },
}

/// Debian's own rustc, which with `libstd-rust-web-dev:<arch>` has the std
/// of another architecture's target (rustup's toolchains cannot use it:
/// another compiler version).
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

/// The C cross-compiler that links an aarch64 agent (Debian's
/// `gcc-aarch64-linux-gnu`), with glibc's static archives from
/// `libc6-dev-arm64-cross`.
pub const AARCH64_LINKER: &str = kloop_protocol::Arch::Arm64.c_compiler();

/// Where Debian's rustc keeps a target's std.
pub fn debian_std_dir(arch: Arch) -> PathBuf {
    PathBuf::from("/usr/lib/rustlib").join(arch.rust_target())
}

/// The checkout's commit, `+dirty` with uncommitted changes, `unknown`
/// outside git: what a KCIDB document and a shard's manifest name as the
/// kloop that ran (shards of different kloop code must not merge).
pub fn kloop_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(s) if !s.is_empty() => format!("{head}+dirty"),
            _ => head,
        },
        None => "unknown".to_string(),
    }
}

static BUILD_LOCK: Mutex<Option<PathBuf>> = Mutex::new(None);
static OTHER_BUILDS: Mutex<Vec<(Arch, PathBuf)>> = Mutex::new(Vec::new());

/// [`ensure_built`] for a guest of `arch`: x86-64's is that agent; an
/// arm64 agent is cross-built with Debian's Rust into
/// `target/kloop/guest-arm64` (`KLOOP_AGENT_ARM64` points at a prebuilt one).
pub fn ensure_built_for(workspace: &Path, arch: Arch) -> Result<PathBuf, AgentBuildError> {
    if arch == Arch::X86_64 {
        return ensure_built(workspace);
    }
    if let Some(prebuilt) = prebuilt("KLOOP_AGENT_ARM64") {
        return prebuilt;
    }
    let mut built = OTHER_BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(a, _)| *a == arch) {
        return Ok(p.clone());
    }
    let std_dir = debian_std_dir(arch);
    if !std_dir.join("lib").is_dir() || !Path::new(DEBIAN_RUSTC).is_file() {
        return Err(AgentBuildError::NoCrossToolchain {
            arch,
            target: arch.rust_target(),
            std_dir,
        });
    }
    let task = "agent build (arm64)";
    crate::run::status::start(
        task,
        &format!(
            "cross-building the {arch} guest agent with Debian's rustc ({DEBIAN_RUSTC} --target \
             {}); a no-op when nothing changed",
            arch.rust_target()
        ),
    );
    let started = std::time::Instant::now();
    let bin = build_for(
        workspace,
        &workspace.join(format!("target/kloop/guest-{arch}")),
        &[],
        arch,
    )
    .inspect_err(|e| crate::run::status::failed(task, &e.to_string()))?;
    crate::run::status::done(
        task,
        &format!(
            "{arch} guest agent ready in {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            bin.display()
        ),
    );
    built.push((arch, bin.clone()));
    Ok(bin)
}

/// The prebuilt agent the variable `var` names, if it names one.
fn prebuilt(var: &str) -> Option<Result<PathBuf, AgentBuildError>> {
    let p = PathBuf::from(std::env::var_os(var)?);
    Some(if p.is_file() {
        Ok(p)
    } else {
        Err(AgentBuildError::MissingOverride(p))
    })
}

/// Builds the agent once per process (cargo makes it a no-op when nothing
/// changed) and returns its path. `KLOOP_AGENT` points at a prebuilt one.
pub fn ensure_built(workspace: &Path) -> Result<PathBuf, AgentBuildError> {
    if let Some(prebuilt) = prebuilt("KLOOP_AGENT") {
        return prebuilt;
    }
    let mut built = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return Ok(p.clone());
    }
    let task = "agent build";
    crate::run::status::start(
        task,
        "building the guest agent and its BPF fixtures (cargo build --release -p kloop-guest; \
         clang -target bpf); a no-op when nothing changed",
    );
    let started = std::time::Instant::now();
    let bin = build(workspace, &workspace.join("target/kloop/guest"), &[])
        .inspect_err(|e| crate::run::status::failed(task, &e.to_string()))?;
    crate::run::status::done(
        task,
        &format!(
            "guest agent ready in {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            bin.display()
        ),
    );
    *built = Some(bin.clone());
    Ok(bin)
}

/// Builds the agent into `target_dir` with extra environment variables for
/// the build (e.g. `KLOOP_CLANG`) and returns the binary's path.
pub fn build(
    workspace: &Path,
    target_dir: &Path,
    extra_env: &[(&str, &std::ffi::OsStr)],
) -> Result<PathBuf, AgentBuildError> {
    build_for(workspace, target_dir, extra_env, Arch::X86_64)
}

/// [`build`] for a guest of `arch`.
pub fn build_for(
    workspace: &Path,
    target_dir: &Path,
    extra_env: &[(&str, &std::ffi::OsStr)],
    arch: Arch,
) -> Result<PathBuf, AgentBuildError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = arch.rust_target();
    let args = [
        "build",
        "--release",
        "--quiet",
        "--package",
        "kloop-guest",
        "--target",
        target,
        "--target-dir",
    ];
    tracing::debug!(
        "running {} {} {}",
        cargo.to_string_lossy(),
        args.join(" "),
        target_dir.display()
    );
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(workspace)
        .args(args)
        .arg(target_dir)
        .envs(extra_env.iter().copied())
        .env(
            format!(
                "CARGO_TARGET_{}_RUSTFLAGS",
                target.to_uppercase().replace('-', "_")
            ),
            "-C target-feature=+crt-static",
        )
        // An outer cargo (cargo test, cargo run) may have set these for
        // itself; the nested build has its own target dir and flags.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if arch != Arch::X86_64 {
        // Debian's compiler, whose std has the target, for the agent and
        // its build script alike (one compiler for the whole build), and the
        // cross linker; its own target directory keeps it from rebuilding
        // the host's artefacts each time the other compiler ran.
        cmd.env("RUSTC", DEBIAN_RUSTC)
            .env_remove("RUSTC_WRAPPER")
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                AARCH64_LINKER,
            );
    }
    let out = cmd.output().map_err(AgentBuildError::Cargo)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n");
        return Err(AgentBuildError::Failed {
            command: format!(
                "{} {} {}",
                cargo.to_string_lossy(),
                args.join(" "),
                target_dir.display()
            ),
            stderr_tail: tail,
        });
    }
    let bin = target_dir.join(target).join("release/kloop-guest");
    if !is_static_elf(&bin, arch) {
        return Err(AgentBuildError::NotStatic(bin));
    }
    Ok(bin)
}

/// True if the file is an ELF of `arch` with no PT_INTERP program header (no
/// dynamic loader).
fn is_static_elf(path: &Path, arch: Arch) -> bool {
    std::fs::read(path).ok().is_some_and(|bytes| {
        matches!(
            crate::run::payload::elf_interpreter_of(&bytes, arch),
            Ok(None)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_host_binaries_are_not_static() {
        // /bin/sh on any Debian host is dynamically linked.
        assert!(!is_static_elf(Path::new("/bin/sh"), Arch::X86_64));
        assert!(!is_static_elf(Path::new("/etc/hostname"), Arch::X86_64));
    }
}
