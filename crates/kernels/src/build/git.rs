//! A git worktree kloop bisects in, so the user's tree (its checkout, its
//! index, its bisect state) is never touched. Removed when dropped, also
//! after an error or Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kloop_path_io::{PathIo, PathIoExt};

use super::BuildError;

/// `git -C dir args…`, failing with git's own words.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, BuildError> {
    let out = run(dir, args)?;
    if !out.status.success() {
        return Err(BuildError::Invalid(format!(
            "`git {}` in {} failed ({}): {}",
            args.join(" "),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn run(dir: &Path, args: &[&str]) -> Result<Output, BuildError> {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                BuildError::ToolMissing {
                    tool: "git",
                    package: "git",
                }
            } else {
                PathIo::doing("running git", e).into()
            }
        })
}

/// A detached worktree of `repo` at `dir`, held under an exclusive lock
/// (`<dir>.lock`) so two bisections never share it.
pub struct Worktree {
    repo: PathBuf,
    pub dir: PathBuf,
    _lock: crate::lock::HolderLock,
}

impl Worktree {
    /// Adds a detached worktree of `repo` at `rev` in `dir` (a stale one
    /// left by a killed run is removed first).
    pub fn add(repo: &Path, dir: &Path, rev: &str) -> Result<Worktree, BuildError> {
        git(repo, &["rev-parse", "--git-dir"]).map_err(|_| {
            BuildError::Invalid(format!("{} is not a git repository", repo.display()))
        })?;
        let lock = lock_beside(dir)?;
        if dir.exists() {
            let _ = git(
                repo,
                &["worktree", "remove", "--force", &dir.display().to_string()],
            );
            let _ = std::fs::remove_dir_all(dir);
        }
        let _ = git(repo, &["worktree", "prune"]);
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).doing(format!("creating {}", parent.display()))?;
        }
        git(
            repo,
            &[
                "worktree",
                "add",
                "--detach",
                &dir.display().to_string(),
                rev,
            ],
        )?;
        Ok(Worktree {
            repo: repo.to_path_buf(),
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }
}

fn lock_beside(dir: &Path) -> Result<crate::lock::HolderLock, BuildError> {
    let path = dir.with_extension("lock");
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).doing(format!("creating {}", parent.display()))?;
    }
    crate::lock::HolderLock::try_take(&path)
        .doing(format!("locking {}", path.display()))?
        .ok_or_else(|| {
            BuildError::Invalid(format!(
                "another `bisect --tree` is using {}: {} holds its lock {}; wait for it to finish",
                dir.display(),
                crate::lock::holder(&path).unwrap_or_else(|| "another process".into()),
                path.display()
            ))
        })
}

impl Drop for Worktree {
    fn drop(&mut self) {
        // Ends a bisection running here and removes the worktree; the
        // user's repository keeps only its objects.
        let _ = run(&self.dir, &["bisect", "reset"]);
        let _ = run(
            &self.repo,
            &[
                "worktree",
                "remove",
                "--force",
                &self.dir.display().to_string(),
            ],
        );
        let _ = run(&self.repo, &["worktree", "prune"]);
    }
}
