//! Building the guest agent: a static `kloop-guest` binary for `/init`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The target the agent is built for; glibc with `crt-static` because the
/// musl target cannot be installed everywhere kloop runs.
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-gnu";

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

/// Builds the agent once per process (cargo makes it a no-op when nothing
/// changed) and returns its path. `KLOOP_AGENT` points at a prebuilt one.
pub fn ensure_built(workspace: &Path) -> Result<PathBuf, AgentBuildError> {
    if let Some(p) = std::env::var_os("KLOOP_AGENT") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(AgentBuildError::MissingOverride(p))
        };
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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = [
        "build",
        "--release",
        "--quiet",
        "--package",
        "kloop-guest",
        "--target",
        AGENT_TARGET,
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
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        )
        // An outer cargo (cargo test, cargo run) may have set these for
        // itself; the nested build has its own target dir and flags.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
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
    let bin = target_dir.join(AGENT_TARGET).join("release/kloop-guest");
    if !is_static_elf(&bin) {
        return Err(AgentBuildError::NotStatic(bin));
    }
    Ok(bin)
}

/// True if the file is an x86-64 ELF with no PT_INTERP program header (no
/// dynamic loader).
fn is_static_elf(path: &Path) -> bool {
    std::fs::read(path)
        .ok()
        .is_some_and(|bytes| matches!(crate::run::payload::elf_interpreter(&bytes), Ok(None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_host_binaries_are_not_static() {
        // /bin/sh on any Debian host is dynamically linked.
        assert!(!is_static_elf(Path::new("/bin/sh")));
        assert!(!is_static_elf(Path::new("/etc/hostname")));
    }
}
