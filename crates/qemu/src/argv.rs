//! QEMU's command line for one guest (never a shell string) and the firmware
//! it boots with.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use kloop_protocol::Arch;

use crate::config::*;

/// The kernel command line every guest starts from; the trial's own
/// parameters follow.
const BASE_CMDLINE: &[&str] = &[
    // A panic reboots at once and -no-reboot turns that into a QEMU
    // exit, so a panicking guest never sits until a deadline.
    "panic=-1",
    "oops=panic",
    // A WARN is the kernel saying it is in a state its authors
    // call a bug (include/asm-generic/bug.h: "WARN_ON() ... for
    // conditions that should never happen"), and at loglevel=4 its
    // pr_warn line never reaches the console: panicking turns it
    // into a PANIC verdict with the warning's stack, as syzkaller
    // runs its kernels.
    "panic_on_warn=1",
    "loglevel=4",
    // The crypto manager's self-tests of every registered algorithm
    // (crypto_algapi_init → crypto_start_tests) are the largest
    // single initcall under TCG: ~0.25 s of QEMU CPU per boot on 6.1.
    // kloop tests no crypto.
    "cryptomgr.notests",
];

/// x86-64's own command line words after the common ones: what its
/// emulated PC needs under TCG.
const X86_64_CMDLINE: &[&str] = &[
    // A preset loops-per-jiffy skips the delay-loop calibration on
    // every CPU. Under TCG the second CPU's calibration fails its
    // consistency check and retries ("Probably due to long
    // platform interrupts. Consider using lpj="): boot→hello on 6.1
    // went 1.97 → 1.58 s with it (5 boots each). udelay() runs on
    // the TSC, so the value (2.5 GHz at HZ=250) only feeds the
    // BogoMIPS line and the loop fallback.
    "lpj=10000000",
    // check_timer() panics "IO-APIC + timer doesn't work!" when the
    // PIT's interrupt does not arrive within its busy-wait window,
    // which a loaded host running TCG can make it miss (seen twice
    // in a day of runs with five builds competing for 2 cores).
    "no_timer_check",
];

/// arm64's: none. The architected timer needs no calibration and there is
/// no PIT to miss.
const ARM64_CMDLINE: &[&str] = &[];

/// The name the data channel's virtio-serial port has on an arm64 guest
/// (`/sys/class/virtio-ports/*/name`): the `virt` board has one UART, the
/// console's.
pub use kloop_protocol::VIRTIO_DATA_PORT_NAME;

impl VmConfig {
    /// The QEMU argv (without the binary) for this guest, given the paths of
    /// the QMP and data sockets.
    pub fn argv(&self, qmp_sock: &Path, data_sock: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(s.into());
        push("-nodefaults");
        push("-no-user-config");
        push("-nographic");
        push("-no-reboot");
        // A saved VM's RAM is a file of its own (see [`GuestStart`]): the
        // save writes it through a shared mapping instead of copying it
        // into the migration stream, and a restore maps it private instead
        // of reading it back (~85 MB per restore under QEMU 7.2).
        let ram_file = match &self.start {
            GuestStart::Boot => None,
            GuestStart::BootAndSave { ram, .. } => Some((ram, "on")),
            GuestStart::Restore { ram, .. } => Some((ram, "off")),
        };
        let machine = match self.arch {
            Arch::X86_64 => "pc",
            // `virt` boots an arm64 Image without firmware: QEMU's own boot
            // code hands it the device tree.
            Arch::Arm64 => "virt",
        };
        push("-machine");
        push(&if ram_file.is_some() {
            format!("{machine},memory-backend=kloop-ram")
        } else {
            machine.to_string()
        });
        a.extend(self.accel_args().into_iter().map(OsString::from));
        if let Some(bios) = firmware().filter(|_| self.arch == Arch::X86_64) {
            a.push("-bios".into());
            a.push(bios.into_os_string());
        }
        let mut push = |s: &str| a.push(s.into());
        push("-m");
        push(&self.memory_mib.to_string());
        if let Some((ram, share)) = ram_file {
            a.push("-object".into());
            let mut backend = chardev_arg(
                &format!(
                    "memory-backend-file,id=kloop-ram,size={}M,mem-path=",
                    self.memory_mib
                ),
                ram,
            );
            backend.push(format!(",share={share}"));
            a.push(backend);
        }
        let mut push = |s: &str| a.push(s.into());
        push("-smp");
        push(&self.cpus.to_string());
        let cmdline = self.kernel_cmdline();
        a.push("-kernel".into());
        a.push(self.kernel.clone().into_os_string());
        if let Some(initrd) = &self.initramfs {
            a.push("-initrd".into());
            a.push(initrd.clone().into_os_string());
        }
        a.push("-append".into());
        a.push(cmdline.join(" ").into());
        a.push("-chardev".into());
        a.push(self.console_chardev());
        a.push("-serial".into());
        a.push("chardev:console".into());
        a.extend(self.data_channel_args(data_sock));
        a.push("-qmp".into());
        let mut qmp = chardev_arg("unix:", qmp_sock);
        qmp.push(",server=on,wait=off");
        a.push(qmp);
        if matches!(self.start, GuestStart::Restore { .. }) {
            // The saved VM comes in on the descriptor Vm::spawn set up, once
            // QMP has set the capability the save was made with
            // (`x-ignore-shared` has no command-line form in QEMU 7.2); the
            // guest runs as soon as it is loaded (no -S).
            a.push("-incoming".into());
            a.push("defer".into());
        }
        // For experiments with QEMU options (firmware, devices): appended
        // last, so they override.
        if let Some(extra) = std::env::var_os("KLOOP_QEMU_ARGS") {
            a.extend(
                extra
                    .to_string_lossy()
                    .split_whitespace()
                    .map(OsString::from),
            );
        }
        a
    }

    /// The kernel command line: the console first (x86's first UART, the
    /// `virt` board's PL011), the common words, the architecture's own,
    /// then the trial's.
    fn kernel_cmdline(&self) -> Vec<String> {
        let (console, own) = match self.arch {
            Arch::X86_64 => ("console=ttyS0", X86_64_CMDLINE),
            Arch::Arm64 => ("console=ttyAMA0", ARM64_CMDLINE),
        };
        std::iter::once(&console)
            .chain(BASE_CMDLINE)
            .chain(own)
            .map(|s| s.to_string())
            .chain(self.cmdline.iter().cloned())
            .collect()
    }

    /// The data channel's arguments: a socket chardev behind x86's second
    /// UART, or behind a virtio-serial port on arm64.
    fn data_channel_args(&self, data_sock: &Path) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        if self.data_channel {
            out.push("-chardev".into());
            out.push(chardev_arg("socket,id=data,server=off,path=", data_sock));
            match self.arch {
                Arch::X86_64 => {
                    out.push("-serial".into());
                    out.push("chardev:data".into());
                }
                // One UART on `virt`: the data channel is a virtio-serial
                // port on the board's virtio-mmio transports, named so the
                // agent finds it whatever number the kernel gives it.
                Arch::Arm64 => {
                    out.push("-device".into());
                    out.push("virtio-serial-device".into());
                    out.push("-device".into());
                    out.push(
                        format!("virtserialport,chardev=data,name={VIRTIO_DATA_PORT_NAME}").into(),
                    );
                }
            }
        }
        out
    }

    /// The console's `-chardev` value: into `console.log`, and on the
    /// terminal with [`Console::Terminal`].
    fn console_chardev(&self) -> OsString {
        let console = self.artefacts.join("console.log");
        let mut console_arg = match self.console {
            Console::File => chardev_arg("file,id=console,path=", &console),
            // signal=off: raw mode without ISIG, so Ctrl-C is a byte for
            // the guest, not a SIGINT for QEMU; mux=on gives the Ctrl-A
            // escapes (Ctrl-A X quits) without a monitor on the line.
            Console::Terminal => {
                chardev_arg("stdio,id=console,mux=on,signal=off,logfile=", &console)
            }
        };
        if matches!(self.start, GuestStart::Restore { .. }) {
            // The trial's console.log already holds the saved boot's.
            console_arg.push(match self.console {
                Console::File => ",append=on",
                Console::Terminal => ",logappend=on",
            });
        }
        console_arg
    }

    /// The accelerator and CPU model arguments.
    fn accel_args(&self) -> Vec<&'static str> {
        let mut args = Vec::new();
        if self.arch == Arch::Arm64 {
            // Another architecture than the host's: TCG whatever `accel`
            // says (KVM runs only the host's own).
            args.push("-accel");
            args.push("tcg,thread=single");
            args.push("-cpu");
            // Every feature TCG emulates (BTI, pointer authentication, LSE
            // atomics, which the arm64 JIT emits when it finds them), with
            // QEMU's own cheap PAC function instead of QARMA, which under
            // TCG costs more than anything else a guest does.
            args.push("max,pauth-impdef=on");
            if self.icount {
                args.push("-icount");
                args.push("shift=0,sleep=off");
            }
            return args;
        }
        match self.accel {
            Accel::Kvm => {
                args.push("-accel");
                args.push("kvm");
                args.push("-cpu");
                args.push("host");
            }
            Accel::Tcg => {
                args.push("-accel");
                // One thread round-robins the vCPUs: scheduling is
                // reproducible, and it is what -icount measurement runs need.
                // With 2 host cores kloop runs VMs in parallel instead.
                args.push("tcg,thread=single");
                args.push("-cpu");
                // QEMU 7.2's TCG computes EFLAGS after CMPXCHG16B from stale
                // lazy-flag state: a kernel pointer lands in RFLAGS (TF, NT,
                // AC set at random) and 6.12's SLUB fast path
                // (`cmpxchg16b %gs:`) panicked about one boot in three. Without
                // the feature, kernels take their software path: 0 panics in 51
                // boots of 6.12.
                args.push("max,-cx16");
                if self.icount {
                    args.push("-icount");
                    args.push("shift=0,sleep=off");
                }
            }
        }
        args
    }
}

impl VmConfig {
    /// The argv of this guest for a reproducer that runs QEMU by hand,
    /// without kloop: the console on QEMU's stdio, the data port into the
    /// file `data_file`, no QMP, and QEMU's default firmware (qboot may not
    /// be installed where the reproducer runs). Everything that shapes the
    /// guest (accelerator, CPU model, memory, vCPUs, command line) is the
    /// trial's.
    pub fn standalone_argv(&self, data_file: &Path) -> Vec<OsString> {
        let boot = VmConfig {
            start: GuestStart::Boot,
            ..self.clone()
        };
        let placeholder = Path::new("/kloop-placeholder");
        let full = boot.argv(placeholder, placeholder);
        let mut out = Vec::with_capacity(full.len());
        let mut args = full.into_iter();
        while let Some(arg) = args.next() {
            match arg.to_str() {
                Some("-qmp") | Some("-bios") => {
                    args.next();
                }
                Some("-chardev") => {
                    let value = args.next().unwrap_or_default();
                    let value_str = value.to_string_lossy();
                    out.push(arg);
                    if value_str.contains("id=console") {
                        out.push("stdio,id=console".into());
                    } else if value_str.contains("id=data") {
                        out.push(chardev_arg("file,id=data,path=", data_file));
                    } else {
                        out.push(value);
                    }
                }
                _ => out.push(arg),
            }
        }
        out
    }
}

/// QEMU option values are comma-separated: a comma in a path must be doubled.
pub(crate) fn chardev_arg(prefix: &str, path: &Path) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(path.to_string_lossy().replace(',', ",,"));
    s
}

/// Where Debian's qemu-system-data puts qboot.
pub const QBOOT: &str = "/usr/share/qemu/qboot.rom";

/// The `-bios` image: `KLOOP_FIRMWARE` (`seabios` for QEMU's default, or a
/// path), else qboot when installed. qboot skips SeaBIOS's device probing
/// and option-ROM scan: 0.53 → 0.28 s from QEMU's start to the kernel's
/// clock on 6.1 under TCG (`cargo xtask bench`, 3 boots each).
pub fn firmware() -> Option<PathBuf> {
    match std::env::var_os("KLOOP_FIRMWARE") {
        Some(f) if f == "seabios" => None,
        Some(f) if !f.is_empty() => Some(PathBuf::from(f)),
        _ => Some(PathBuf::from(QBOOT)).filter(|p| p.is_file()),
    }
}
