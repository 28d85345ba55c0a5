//! Choosing the accelerator: KVM only when it demonstrably works.
//!
//! `/dev/kvm` existing and answering `KVM_GET_API_VERSION` is not enough: under
//! broken nested virtualisation a guest can crawl through decompression for
//! minutes. So `auto` boots a real kernel under KVM with a short deadline and
//! keeps KVM only if that guest gets through early boot in time. The verdict
//! is cached per host kernel and QEMU version.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Accel, Deadlines, VmConfig};
use crate::process::Vm;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelChoice {
    Auto,
    Kvm,
    Tcg,
}

impl AccelChoice {
    /// Every spelling `--accel` takes, for help texts and parsers.
    pub const NAMES: [&'static str; 3] = ["auto", "kvm", "tcg"];
}

impl std::str::FromStr for AccelChoice {
    // A string: clap shows a value parser's error as-is, never matched.
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            other => Err(format!(
                "unknown accelerator `{other}`: use kvm, tcg or auto"
            )),
        }
    }
}

impl std::fmt::Display for AccelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccelChoice::Auto => "auto",
            AccelChoice::Kvm => "kvm",
            AccelChoice::Tcg => "tcg",
        })
    }
}

/// The accelerator kloop will use, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelDecision {
    pub accel: String,
    /// One line for the user.
    pub reason: String,
    /// How long the functional probe took, if one ran (not from cache).
    pub probe_ms: Option<u64>,
    pub from_cache: bool,
}

/// The decision for the user: its reason, and how long the KVM probe took
/// if one ran (or that the verdict was cached).
impl std::fmt::Display for AccelDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.probe_ms {
            Some(ms) => write!(
                f,
                "{} [KVM probe took {:.1} s]",
                self.reason,
                ms as f64 / 1000.0
            ),
            None if self.from_cache => write!(f, "{} [cached verdict]", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl AccelDecision {
    pub fn accel(&self) -> Accel {
        if self.accel == "kvm" {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    }

    fn new(accel: Accel, reason: impl Into<String>) -> Self {
        AccelDecision {
            accel: accel.as_str().into(),
            reason: reason.into(),
            probe_ms: None,
            from_cache: false,
        }
    }
}

/// How long the probe guest may take to get through early boot. A working
/// KVM needs well under a second; the broken nested case needs minutes.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(6);

const KVM_API_VERSION: i32 = 12;
vmm_sys_util::ioctl_io_nr!(KVM_GET_API_VERSION, 0xAE, 0x00);

/// Why `/dev/kvm` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("cannot open /dev/kvm: {0}")]
    Open(#[source] std::io::Error),
    #[error("/dev/kvm answers KVM_GET_API_VERSION with {0}, expected {KVM_API_VERSION}")]
    ApiVersion(i32),
}

/// Why no accelerator could be chosen (`auto` always ends with one: TCG
/// when KVM does not work).
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    #[error("--accel kvm was requested but {0}; use --accel auto or tcg")]
    KvmRequested(#[source] KvmError),
}

/// Why the probe guest did not show that KVM works.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("{0}")]
    Spawn(#[from] crate::config::VmError),
    #[error("QEMU exited ({0}) before early boot finished")]
    Exited(std::process::ExitStatus),
    #[error("probe guest still {} after {secs} s", if *.decompressing { "decompressing" } else { "silent" })]
    Stuck { decompressing: bool, secs: u64 },
}

/// Whether `/dev/kvm` can be opened and speaks the stable API.
pub fn kvm_device_usable() -> Result<(), KvmError> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(KvmError::Open)?;
    // SAFETY: KVM_GET_API_VERSION takes no argument and only returns an int.
    let v = unsafe { vmm_sys_util::ioctl::ioctl(&dev, KVM_GET_API_VERSION()) };
    if v != KVM_API_VERSION {
        return Err(KvmError::ApiVersion(v));
    }
    Ok(())
}

/// The host kernel's release (`uname -r`), `unknown` if unreadable.
pub fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn probe_cache_file(cache_dir: &Path, qemu_version: &str) -> PathBuf {
    let key = format!("{}|{}", host_release(), qemu_version);
    let mut h = sha2::Sha256::default();
    sha2::Digest::update(&mut h, key.as_bytes());
    let digest = hex::encode(sha2::Digest::finalize(h));
    cache_dir
        .join("kvm-probe")
        .join(format!("{}.json", &digest[..16]))
}

/// Where `choose` keeps its verdict for this host kernel and `qemu`'s
/// version (whether or not one is there).
pub fn verdict_file(cache_dir: &Path, qemu: &Path) -> PathBuf {
    probe_cache_file(
        cache_dir,
        &crate::config::qemu_version(qemu).unwrap_or_default(),
    )
}

/// Forgets the cached verdict, so the next `auto` choice probes again
/// (after a BIOS, module or nested-virtualisation change the host kernel
/// and QEMU version, the cache key, stay the same). Returns whether there
/// was one.
pub fn forget_verdict(cache_dir: &Path, qemu: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(verdict_file(cache_dir, qemu)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Decides the accelerator. `probe_kernel` yields any bootable bzImage; it
/// is called only when a probe has to run (no cached verdict).
pub fn choose(
    choice: AccelChoice,
    qemu: &Path,
    probe_kernel: &mut dyn FnMut() -> Option<PathBuf>,
    cache_dir: &Path,
    scratch: &Path,
) -> Result<AccelDecision, AccelError> {
    match choice {
        AccelChoice::Tcg => {
            return Ok(AccelDecision::new(
                Accel::Tcg,
                "TCG (requested with --accel tcg)",
            ))
        }
        AccelChoice::Kvm => {
            kvm_device_usable().map_err(AccelError::KvmRequested)?;
            return Ok(AccelDecision::new(
                Accel::Kvm,
                "KVM (requested with --accel kvm, not probed)",
            ));
        }
        AccelChoice::Auto => {}
    }
    if let Err(e) = kvm_device_usable() {
        return Ok(AccelDecision::new(Accel::Tcg, format!("TCG: {e}")));
    }
    let qemu_version = crate::config::qemu_version(qemu).unwrap_or_default();
    let cache_file = probe_cache_file(cache_dir, &qemu_version);
    if let Ok(text) = std::fs::read_to_string(&cache_file) {
        if let Ok(mut d) = serde_json::from_str::<AccelDecision>(&text) {
            d.from_cache = true;
            d.probe_ms = None;
            return Ok(d);
        }
    }
    let Some(kernel) = probe_kernel() else {
        return Ok(AccelDecision::new(
            Accel::Tcg,
            "TCG: /dev/kvm answers, but no kernel image was available to probe whether KVM works",
        ));
    };
    let started = Instant::now();
    let works = probe_boot(qemu, &kernel, scratch);
    let took = started.elapsed();
    let mut decision = match works {
        Ok(()) => AccelDecision::new(
            Accel::Kvm,
            format!("KVM (a probe guest got through early boot in {:.1} s)", took.as_secs_f64()),
        ),
        Err(why) => AccelDecision::new(
            Accel::Tcg,
            format!(
                "TCG: /dev/kvm answers but KVM does not work here ({why}); falling back to TCG, verdict cached in {}",
                cache_file.display()
            ),
        ),
    };
    decision.probe_ms = Some(took.as_millis() as u64);
    if let Some(parent) = cache_file.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    if let Ok(text) = serde_json::to_string_pretty(&decision) {
        // A name of this process's own: two kloop processes probing at
        // once must not write into one temporary file.
        let tmp = cache_file.with_extension(format!("{}.tmp", std::process::id()));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &cache_file);
        }
    }
    Ok(decision)
}

/// Boots `kernel` under KVM without an initramfs. Early boot ends in the
/// "unable to mount root" panic, which with `panic=-1` and `-no-reboot` makes
/// QEMU exit: that exit (or the panic line) within the deadline means KVM
/// executes guest code at a useful speed.
fn probe_boot(qemu: &Path, kernel: &Path, scratch: &Path) -> Result<(), ProbeError> {
    let config = VmConfig {
        arch: kloop_protocol::Arch::X86_64,
        qemu: qemu.to_path_buf(),
        kernel: kernel.to_path_buf(),
        initramfs: None,
        accel: Accel::Kvm,
        cpus: 1,
        memory_mib: 256,
        cmdline: vec!["earlyprintk=serial,ttyS0".into()],
        artefacts: scratch.to_path_buf(),
        deadlines: Deadlines {
            boot: PROBE_DEADLINE,
            silence: PROBE_DEADLINE,
            total: PROBE_DEADLINE,
        },
        data_channel: false,
        icount: false,
        channel_limit: crate::session::DEFAULT_CHANNEL_LIMIT,
        start: Default::default(),
        console: Default::default(),
    };
    let mut vm = Vm::spawn(config)?;
    let console = vm.console_path();
    let end = Instant::now() + PROBE_DEADLINE;
    loop {
        let text = std::fs::read(&console).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        if text.contains("Unable to mount root") || text.contains("Run /init") {
            vm.kill();
            return Ok(());
        }
        if let Some(status) = vm.try_wait() {
            return if text.contains("Kernel panic") {
                Ok(())
            } else {
                Err(ProbeError::Exited(status))
            };
        }
        if Instant::now() >= end {
            let decompressing = text.contains("Decompressing");
            vm.kill();
            return Err(ProbeError::Stuck {
                decompressing,
                secs: PROBE_DEADLINE.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
