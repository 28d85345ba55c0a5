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
use crate::run::suite::Layout;

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

/// `1.2 GiB`, `350 MiB`, `12 KiB`, `0 B`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v < 10.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

/// The first line a command prints with `arg` (stdout, else stderr), or
/// `None` when it cannot run or fails.
fn first_line(program: &Path, arg: &str) -> Option<String> {
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

/// `name` as the shell would find it (a name with a `/` is a path).
fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| p.is_file());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn check_qemu() -> (Check, Option<PathBuf>) {
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
const SEABIOS: [&str; 2] = [
    "/usr/share/qemu/bios-256k.bin",
    "/usr/share/seabios/bios-256k.bin",
];

fn check_firmware() -> Check {
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

fn check_clang() -> Check {
    let name = std::env::var("KLOOP_CLANG").unwrap_or_else(|_| "clang".into());
    let fix = install_fix("clang");
    let Some(clang) = which(&name) else {
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

fn compiles_for_bpf(clang: &Path) -> Result<(), String> {
    use std::io::Write;
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let mut child = Command::new(clang)
        .args(["-target", "bpf", "-O2", "-c", "-x", "c", "-", "-o"])
        .arg(dir.path().join("probe.o"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"int kloop_doctor(void *ctx) { return 0; }\n");
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .trim()
            .to_string())
    }
}

/// The agent is linked statically (`crt-static`) against glibc.
const STATIC_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.a";

fn check_static_libc() -> Check {
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

fn check_perf(os: &HostOs) -> Check {
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

fn check_tool(item: &'static str, name: &str, version_arg: &str, package: &str) -> Check {
    let Some(path) = which(name) else {
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

fn check_keyring(fetch: &FetchOptions) -> Check {
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

/// Bytes under `dir`, symlinks not followed, unreadable parts skipped.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

fn check_cache(catalog: Option<&Catalog>) -> (Check, Option<KernelCache>) {
    let cache = match KernelCache::default_location() {
        Ok(c) => c,
        Err(e) => {
            return (
                Check::fail(
                    "cache",
                    e.to_string(),
                    "export KLOOP_CACHE_DIR=<a writable directory>",
                ),
                None,
            )
        }
    };
    let root = cache.root().to_path_buf();
    let writable = std::fs::create_dir_all(&root).and_then(|()| tempfile::tempfile_in(&root));
    if let Err(e) = writable {
        return (
            Check::fail(
                "cache",
                format!("{} is not writable: {e}", root.display()),
                "export KLOOP_CACHE_DIR=<a writable directory>",
            ),
            Some(cache),
        );
    }
    let pins = catalog.map(Catalog::pins).unwrap_or_default();
    // Verified (hashed), as a run would: a truncated image is not cached.
    let cached: Vec<&str> = pins
        .iter()
        .filter(|p| cache.is_cached(p))
        .map(|p| p.id.as_str())
        .collect();
    let missing: Vec<&str> = pins
        .iter()
        .map(|p| p.id.as_str())
        .filter(|id| !cached.contains(id))
        .collect();
    let saved = subdirs(&root.join("saved-vms"));
    let saved_size: u64 = saved.iter().map(|d| dir_size(d)).sum();
    let built = kloop_kernels::build::list(&cache).len();
    let mut detail = format!(
        "{}: {}; {} of {} pinned kernels cached",
        root.display(),
        human_size(dir_size(&root)),
        cached.len(),
        pins.len()
    );
    if !missing.is_empty() {
        detail += &format!(
            " (not yet: {}; fetched on first use, or by `cargo xtask kernels fetch`)",
            missing.join(", ")
        );
    }
    detail += &format!(
        "; {} saved VM{} ({}); {} built kernel{}",
        saved.len(),
        if saved.len() == 1 { "" } else { "s" },
        human_size(saved_size),
        built,
        if built == 1 { "" } else { "s" }
    );
    (Check::ok("cache", detail), Some(cache))
}

fn check_kvm(
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
        Err(e) => return Check::warn("kvm", e, "cargo xtask doctor --recheck"),
    };
    let verdict_path = accel::verdict_file(cache.root(), qemu);
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

fn mirror_fix() -> String {
    format!(
        "export {MIRROR_ENV}=<URL of a Debian mirror: the archive root that holds dists/ and \
         pool/> (in GitHub Actions: a repository variable {MIRROR_ENV})"
    )
}

fn check_mirror(
    opts: &DoctorOptions,
    cache: Option<&KernelCache>,
    catalog: Option<&Catalog>,
    uncached: &[String],
) -> Vec<Check> {
    // Without network a run still works from the cache; only kernels not
    // yet cached make an unreachable mirror a failure.
    let needed = |detail: String, fix: String| {
        if uncached.is_empty() {
            Check::warn("mirror", detail + " (every pinned kernel is cached)", fix)
        } else {
            Check::fail(
                "mirror",
                format!("{detail}; kernels not cached yet: {}", uncached.join(", ")),
                fix,
            )
        }
    };
    let mirror = match opts.fetch.locate_mirror() {
        Ok(m) => m,
        Err(e) => return vec![needed(e.to_string(), mirror_fix())],
    };
    let Some(cache) = cache else {
        return vec![Check::warn(
            "mirror",
            format!(
                "{} (from {}); not asked: no kernel cache for apt's state",
                mirror.url, mirror.origin
            ),
            "fix the cache line above, then cargo xtask doctor",
        )];
    };
    if opts.fetch.offline {
        return vec![Check::ok(
            "mirror",
            format!(
                "{} (from {}); not asked (--offline)",
                mirror.url, mirror.origin
            ),
        )];
    }
    // Reachability: the suite of the first pin (the one a run needs first).
    let first = catalog
        .and_then(|c| c.pins().first())
        .map_or("sid", |p| p.suite.as_str());
    let reach = probe_suites(cache, &mirror.url, &[first], opts.mirror_deadline)
        .into_iter()
        .next()
        .map_or_else(
            || Err("no answer".to_string()),
            |(_, r)| r.map_err(|e| e.to_string()),
        );
    let release = match reach {
        Ok(release) => release,
        Err(why) => {
            return vec![needed(
                format!(
                    "{} (from {}) did not answer: {why}",
                    mirror.url, mirror.origin
                ),
                format!(
                    "check the network or the proxy apt uses, or {}",
                    mirror_fix()
                ),
            )]
        }
    };
    let mut checks = vec![Check::ok(
        "mirror",
        format!(
            "{} (from {}); {first}'s Release in {:.1} s{}",
            mirror.url,
            mirror.origin,
            release.took.as_secs_f64(),
            release
                .date
                .map(|d| format!(", dated {d}"))
                .unwrap_or_default()
        ),
    )];
    let suites = probe_suites(cache, &mirror.url, DEBIAN_SUITES, opts.mirror_deadline);
    let served: Vec<&str> = suites
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(s, _)| s.as_str())
        .collect();
    let missing: Vec<&str> = suites
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(s, _)| s.as_str())
        .collect();
    let mut detail = format!(
        "{} of {} served: {}",
        served.len(),
        suites.len(),
        if served.is_empty() {
            "none".to_string()
        } else {
            served.join(", ")
        }
    );
    if !missing.is_empty() {
        detail += &format!("; not served: {}", missing.join(", "));
    }
    // A pin whose suite is gone can still run from the cache, but cannot
    // be fetched on a new machine.
    let stranded: Vec<String> = catalog
        .map(|c| {
            c.pins()
                .iter()
                .filter(|p| missing.contains(&p.suite.as_str()))
                .map(|p| format!("{} ({})", p.id, p.suite))
                .collect()
        })
        .unwrap_or_default();
    checks.push(if stranded.is_empty() {
        Check::ok("suites", detail)
    } else {
        let stranded_uncached = stranded
            .iter()
            .any(|s| uncached.iter().any(|u| s.starts_with(&format!("{u} "))));
        let detail = format!(
            "{detail}; pins from a suite not served: {}",
            stranded.join(", ")
        );
        let fix = format!(
            "re-pin with cargo xtask kernels update <id>, or {}",
            mirror_fix()
        );
        if stranded_uncached {
            Check::fail("suites", detail, fix)
        } else {
            Check::warn("suites", detail + " (cached here)", fix)
        }
    });
    checks
}

/// Run directories above this size earn a warning: they are never pruned.
const RUNS_WARN_BYTES: u64 = 20 << 30;

fn check_runs(layout: &Layout) -> Check {
    let dir = layout.runs();
    if !dir.is_dir() {
        return Check::ok("runs", format!("{}: none yet", dir.display()));
    }
    let runs = subdirs(&dir).len();
    let size = dir_size(&dir);
    let detail = format!("{}: {runs} run(s), {}", dir.display(), human_size(size));
    if size > RUNS_WARN_BYTES {
        Check::warn(
            "runs",
            detail + " (never pruned by kloop)",
            format!("rm -rf {}/* (keep the runs you still need)", dir.display()),
        )
    } else {
        Check::ok("runs", detail)
    }
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
    fn sizes_read_like_du() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(12 * 1024), "12 KiB");
        assert_eq!(human_size(1536 * 1024), "1.5 MiB");
        assert_eq!(human_size(350 << 20), "350 MiB");
        assert_eq!(human_size(5 << 40), "5.0 TiB");
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
        assert!(c.detail.ends_with(": 2 run(s), 2.0 KiB"), "{}", c.detail);
    }
}
