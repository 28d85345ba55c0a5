//! `cargo xtask doctor`: is this machine ready to run kloop?
//!
//! One check per thing a run needs — QEMU, its firmware, KVM, clang, the
//! static libc the agent links, perf, python3, dpkg-deb and apt-get, the
//! archive keyring, the kernel cache, the mirror and the suites it serves,
//! the run directories — each `OK`, `WARN` (runs work, slower or with less)
//! or `FAIL` (some runs cannot work), and every problem names the command
//! that fixes it. The checks reuse what runs use (`find_qemu`, the KVM probe
//! and its cached verdict, `host_perf`, the mirror discovery and the apt
//! state of `kloop-kernels`), so the doctor and a run never disagree.
//!
//! It changes nothing but the cached KVM verdict (`--recheck`, or a first
//! probe) and creates the kernel cache directory if there is none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kloop_kernels::available::{probe_suites, DEBIAN_SUITES};
use kloop_kernels::{Catalog, FetchOptions, HostOs, KernelCache, KEYRING_ENV, MIRROR_ENV};
use kloop_qemu::accel::{self, AccelChoice};

use crate::run::payload::{self, PayloadError};
use crate::workspace::Layout;

mod disk;
mod kvm;
mod mirror;
mod runs;
mod tools;

use disk::*;
use kvm::*;
use mirror::*;
use runs::*;
use tools::*;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Ready.
    Ok,
    /// Runs work, but slower or with less (TCG instead of KVM, say).
    Warn,
    /// Some runs cannot work until it is fixed.
    Fail,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One line of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked (`qemu`, `kvm`, `mirror`, …).
    pub item: &'static str,
    pub status: Status,
    /// What was found: paths, versions, sizes, or what is wrong.
    pub detail: String,
    /// For `WARN` and `FAIL`: the command that fixes it.
    pub fix: Option<String>,
}

impl Check {
    fn ok(item: &'static str, detail: impl Into<String>) -> Check {
        Check {
            item,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(item: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            item,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(item: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            item,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:<4}  {:<9} {}", self.status, self.item, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n      {:<9} fix: {fix}", "")?;
        }
        Ok(())
    }
}

/// What the doctor may do.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// Forget the cached KVM verdict and probe again.
    pub recheck_kvm: bool,
    /// The mirror (`--mirror`, else `KLOOP_MIRROR`, else the apt sources);
    /// `offline` skips the mirror's checks.
    pub fetch: FetchOptions,
    /// How long one suite's `Release` file may take to arrive.
    pub mirror_deadline: Duration,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            recheck_kvm: false,
            fetch: FetchOptions::default(),
            mirror_deadline: Duration::from_secs(5),
        }
    }
}

/// Runs every check, handing each to `report` as soon as it is done (the
/// KVM probe and the mirror take seconds), and returns them all.
pub fn run(layout: &Layout, opts: &DoctorOptions, report: &mut dyn FnMut(&Check)) -> Vec<Check> {
    let os = HostOs::read().unwrap_or_default();
    let mut checks = Vec::new();
    let mut add = |c: Check, checks: &mut Vec<Check>| {
        report(&c);
        checks.push(c);
    };
    let (qemu_check, qemu) = check_qemu();
    add(qemu_check, &mut checks);
    add(check_firmware(), &mut checks);
    add(check_clang(), &mut checks);
    add(check_static_libc(), &mut checks);
    add(check_perf(&os), &mut checks);
    add(check_arm64(), &mut checks);
    add(
        check_tool("python3", "python3", "--version", "python3"),
        &mut checks,
    );
    add(
        check_tool("dpkg-deb", "dpkg-deb", "--version", "dpkg"),
        &mut checks,
    );
    add(
        check_tool("apt-get", "apt-get", "--version", "apt"),
        &mut checks,
    );
    add(check_keyring(&opts.fetch), &mut checks);
    let catalog = Catalog::load(&layout.kernels());
    let (cache_check, cache) = check_cache(catalog.as_ref().ok());
    add(cache_check, &mut checks);
    let uncached: Vec<String> = match (&catalog, &cache) {
        (Ok(catalog), Some(cache)) => catalog
            .pins()
            .iter()
            .filter(|p| !cache.image_path(p).is_file())
            .map(|p| p.id.clone())
            .collect(),
        _ => Vec::new(),
    };
    add(
        check_kvm(
            qemu.as_deref(),
            cache.as_ref(),
            catalog.as_ref().ok(),
            opts.recheck_kvm,
        ),
        &mut checks,
    );
    for c in check_mirror(opts, cache.as_ref(), catalog.as_ref().ok(), &uncached) {
        add(c, &mut checks);
    }
    add(check_runs(layout), &mut checks);
    checks
}

/// True when a check failed: `cargo xtask doctor` exits 1.
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// `12 OK, 2 WARN, 0 FAIL`.
pub fn summary(checks: &[Check]) -> String {
    let n = |s| checks.iter().filter(|c| c.status == s).count();
    format!(
        "{} OK, {} WARN, {} FAIL",
        n(Status::Ok),
        n(Status::Warn),
        n(Status::Fail)
    )
}

/// The fix for a missing distribution package: the setup script, which
/// knows the package names of Debian and Ubuntu, or the package itself.
pub fn install_fix(package: &str) -> String {
    format!("ci/setup.sh (or: apt-get install {package})")
}

/// The fix for a missing perf, by distribution: Debian's `linux-perf`;
/// Ubuntu's perf comes per kernel release from `linux-tools-*`.
pub fn perf_fix(os: &HostOs) -> String {
    let packages = if os.is_ubuntu_like() {
        "linux-tools-common linux-tools-$(uname -r)"
    } else {
        "linux-perf"
    };
    format!(
        "{}, or export KLOOP_PERF=<path of a perf binary>",
        install_fix(packages)
    )
}

/// The version in a tool's `--version` line: its first word that starts
/// with a digit (`QEMU emulator version 7.2.22 (Debian …)` → `7.2.22`,
/// `perf version 6.1.187` → `6.1.187`, `apt 2.6.1 (amd64)` → `2.6.1`).
pub fn version_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map(|w| w.trim_end_matches(['.', ',', ';']).to_string())
}

/// The first line a command prints with `arg` (stdout, else stderr), or
/// `None` when it cannot run or fails.
pub(super) fn first_line(program: &Path, arg: &str) -> Option<String> {
    let out = Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_version_lines() {
        let qemu = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)";
        assert_eq!(version_in(qemu).as_deref(), Some("7.2.22"));
        assert_eq!(
            version_in("QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1.4)").as_deref(),
            Some("8.2.2")
        );
        assert_eq!(
            version_in("perf version 6.1.187").as_deref(),
            Some("6.1.187")
        );
        assert_eq!(version_in("apt 2.6.1 (amd64)").as_deref(), Some("2.6.1"));
        assert_eq!(
            version_in("Debian 'dpkg-deb' package archive backend version 1.21.22 (amd64).")
                .as_deref(),
            Some("1.21.22")
        );
        assert_eq!(version_in("Python 3.11.7").as_deref(), Some("3.11.7"));
        assert_eq!(version_in("qemu: no version here"), None);
    }

    #[test]
    fn fixes_name_the_packages_of_the_hosts_distribution() {
        let debian = HostOs::parse("ID=debian\nVERSION_CODENAME=bookworm\n");
        let ubuntu = HostOs::parse("ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n");
        assert_eq!(
            perf_fix(&debian),
            "ci/setup.sh (or: apt-get install linux-perf), or export KLOOP_PERF=<path of a \
             perf binary>"
        );
        assert!(
            perf_fix(&ubuntu)
                .contains("apt-get install linux-tools-common linux-tools-$(uname -r)"),
            "{}",
            perf_fix(&ubuntu)
        );
        assert_eq!(
            install_fix("qemu-system-x86"),
            "ci/setup.sh (or: apt-get install qemu-system-x86)"
        );
        let fix = mirror_fix();
        assert!(
            fix.starts_with("export KLOOP_MIRROR=<URL of a Debian mirror"),
            "{fix}"
        );
    }

    #[test]
    fn lines_show_status_item_detail_and_fix() {
        let ok = Check::ok("qemu", "/usr/bin/qemu-system-x86_64 (QEMU 7.2.22)");
        assert_eq!(
            ok.to_string(),
            "OK    qemu      /usr/bin/qemu-system-x86_64 (QEMU 7.2.22)"
        );
        let fail = Check::fail("clang", "`clang` not found", install_fix("clang"));
        assert_eq!(
            fail.to_string(),
            "FAIL  clang     `clang` not found\n                \
             fix: ci/setup.sh (or: apt-get install clang)"
        );
    }

    #[test]
    fn any_failure_fails_the_doctor_and_warnings_do_not() {
        let mut checks = vec![
            Check::ok("qemu", "x"),
            Check::warn("kvm", "TCG", "cargo xtask doctor --recheck"),
        ];
        assert!(!any_failed(&checks));
        assert_eq!(summary(&checks), "1 OK, 1 WARN, 0 FAIL");
        checks.push(Check::fail("perf", "missing", "ci/setup.sh"));
        assert!(any_failed(&checks));
        assert_eq!(summary(&checks), "1 OK, 1 WARN, 1 FAIL");
    }

    #[test]
    fn run_directories_are_counted_and_sized() {
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::from_root(root.path());
        assert!(check_runs(&layout).detail.ends_with("none yet"));
        let run = layout.runs().join("1-1/basic");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("console.log"), vec![b'x'; 2048]).unwrap();
        std::fs::create_dir_all(layout.runs().join("2-2")).unwrap();
        let c = check_runs(&layout);
        assert_eq!(c.status, Status::Ok);
        assert!(c.detail.ends_with(": 2 run(s), 2 KiB"), "{}", c.detail);
    }
}
