//! What one guest is run with (accelerator, deadlines, limits, the VM
//! configuration) and where the QEMU binary is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Debian package that provides the x86-64 QEMU binary.
pub const QEMU_PACKAGE: &str = "qemu-system-x86";

/// The QEMU binary of a guest architecture and the Debian package that has it.
pub fn qemu_binary(arch: kloop_protocol::Arch) -> (&'static str, &'static str) {
    match arch {
        kloop_protocol::Arch::X86_64 => ("qemu-system-x86_64", QEMU_PACKAGE),
        kloop_protocol::Arch::Arm64 => ("qemu-system-aarch64", "qemu-system-arm"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long each phase of a guest's life may take.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// From QEMU start to the agent's hello.
    pub boot: Duration,
    /// Longest silence on the data channel once the agent said hello.
    pub silence: Duration,
    /// The whole run, boot included.
    pub total: Duration,
}

impl Deadlines {
    /// Defaults scaled for the accelerator: TCG is several times slower.
    pub fn for_accel(accel: Accel) -> Self {
        let scale = match accel {
            Accel::Kvm => 1,
            Accel::Tcg => 3,
        };
        let scale_env = std::env::var("KLOOP_DEADLINE_SCALE")
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(1)
            .max(1);
        let s = scale * scale_env;
        Deadlines {
            boot: Duration::from_secs(20 * u64::from(s)),
            silence: Duration::from_secs(10 * u64::from(s)),
            total: Duration::from_secs(120 * u64::from(s)),
        }
    }

    /// Every deadline `k` times as long (a kernel built with its own
    /// runtime checks runs several times slower than its plain build).
    pub fn scaled(self, k: u32) -> Self {
        let k = k.max(1);
        Deadlines {
            boot: self.boot * k,
            silence: self.silence * k,
            total: self.total * k,
        }
    }

    /// Each deadline the longer of the two.
    pub fn at_least(self, other: Deadlines) -> Self {
        Deadlines {
            boot: self.boot.max(other.boot),
            silence: self.silence.max(other.silence),
            total: self.total.max(other.total),
        }
    }
}

/// Everything needed to boot one guest.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub qemu: PathBuf,
    /// The guest's architecture: the board, console and data channel.
    pub arch: kloop_protocol::Arch,
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Extra kernel command line words.
    pub cmdline: Vec<String>,
    /// Where console.log and data.bin are written; kept after the run.
    pub artefacts: PathBuf,
    pub deadlines: Deadlines,
    /// Whether the guest uses the data channel (the KVM probe does not).
    pub data_channel: bool,
    /// Under TCG, `-icount shift=0,sleep=off`: the guest clock counts
    /// instructions (1 ns each) and idle time is skipped, so timings measured
    /// in the guest repeat from run to run. Ignored under KVM.
    pub icount: bool,
    /// Most bytes the host takes from the data channel in one session
    /// ([`channel_limit`]); past it the session ends as infrastructure.
    pub channel_limit: u64,
    /// Boot, boot and save, or restore a saved VM.
    pub start: GuestStart,
    /// Where the guest console goes: `console.log`, or also the
    /// harness's terminal (`vm-shell`).
    pub console: Console,
}

/// Where the guest's console (its first serial port) goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Console {
    /// `console.log` in the artefacts directory, nothing else.
    #[default]
    File,
    /// The harness's own stdin and stdout, for a person at the guest's
    /// console: QEMU puts the terminal in raw mode with signals off (a
    /// Ctrl-C reaches the guest) behind its multiplexer (Ctrl-A X quits
    /// QEMU, Ctrl-A A sends a Ctrl-A), and still logs every byte the guest
    /// writes to `console.log`. QEMU is made the terminal's foreground
    /// process group while it runs; the terminal's settings and
    /// foreground group are restored when the [`crate::Vm`] ends, even if
    /// QEMU was killed.
    Terminal,
}

/// How a guest comes to life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GuestStart {
    /// A cold boot: firmware (or PVH entry), kernel, initramfs, agent.
    #[default]
    Boot,
    /// A cold boot of an initramfs without a plan, saved when the agent
    /// says it awaits its plan ([`crate::Vm::save_when_awaiting`]): the
    /// guest's RAM is the file `ram` (created, mapped shared, so it holds
    /// the memory as the guest left it), `vmstate` the device state (QMP
    /// `getfd` with the file, `stop`, `migrate` with `x-ignore-shared`,
    /// which leaves the shared RAM out of the stream).
    BootAndSave { vmstate: PathBuf, ram: PathBuf },
    /// QEMU maps `ram` private (the guest's writes stay in this QEMU, the
    /// file is never written) and loads `vmstate` (`-incoming defer`, then
    /// `migrate-incoming` with `x-ignore-shared`, same argv otherwise as
    /// the save's); once the guest runs again, the host writes `to_guest`
    /// (the plan frame) to the data channel. The console log is appended
    /// to, so the trial's `console.log` can start with the saved boot's.
    Restore {
        vmstate: PathBuf,
        ram: PathBuf,
        to_guest: Vec<u8>,
    },
}

impl GuestStart {}

/// The descriptor number a restoring QEMU reads the saved VM from.
pub const VMSTATE_FD: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("QEMU not found ({0}); install it with `apt-get install {QEMU_PACKAGE}` or point KLOOP_QEMU at a qemu-system-x86_64 binary")]
    QemuMissing(String),
    #[error("{binary} not found on PATH, which arm64 guests run on; install it with `apt-get install {package}` (or `ci/setup.sh --arch arm64`), or point KLOOP_QEMU_AARCH64 at one")]
    QemuMissingFor {
        binary: &'static str,
        package: &'static str,
    },
    #[error(transparent)]
    Io(#[from] kloop_path_io::PathIo),
}

/// Finds the QEMU binary: `KLOOP_QEMU`, else `qemu-system-x86_64` on PATH.
pub fn find_qemu() -> Result<PathBuf, VmError> {
    if let Some(named) = named_qemu("KLOOP_QEMU") {
        return named;
    }
    find_in_path("qemu-system-x86_64")
        .ok_or_else(|| VmError::QemuMissing("qemu-system-x86_64 is not on PATH".into()))
}

/// The QEMU binary for guests of `arch`: x86-64's as [`find_qemu`] finds
/// it; another architecture's `KLOOP_QEMU_AARCH64`, else its binary on PATH.
pub fn find_qemu_for(arch: kloop_protocol::Arch) -> Result<PathBuf, VmError> {
    if arch == kloop_protocol::Arch::X86_64 {
        return find_qemu();
    }
    let (binary, package) = qemu_binary(arch);
    if let Some(named) = named_qemu("KLOOP_QEMU_AARCH64") {
        return named;
    }
    find_in_path(binary).ok_or(VmError::QemuMissingFor { binary, package })
}

/// The QEMU binary the variable `var` names, if it names one.
fn named_qemu(var: &str) -> Option<Result<PathBuf, VmError>> {
    let p = PathBuf::from(std::env::var_os(var)?);
    Some(if p.is_file() {
        Ok(p)
    } else {
        Err(VmError::QemuMissing(format!(
            "{var}={} does not exist",
            p.display()
        )))
    })
}

/// `name` as the shell would find it: a name with a `/` is a path, any
/// other is looked up on `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `qemu-system-x86_64 --version`, first line.
pub fn qemu_version(qemu: &Path) -> Option<String> {
    let out = Command::new(qemu).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|s| s.trim().to_string())
}

/// After the data channel closes, how long QEMU gets to exit.
pub const EXIT_AFTER_CLOSE: Duration = Duration::from_secs(2);

/// After the agent's last frame (`Done`, `AgentError`), how long it gets
/// to power the VM off before QEMU is shut down.
pub const POWER_OFF_WAIT: Duration = Duration::from_secs(10);

/// How long a QMP `quit` gets before QEMU is killed.
pub const QUIT_WAIT: Duration = Duration::from_secs(2);
