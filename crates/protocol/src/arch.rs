//! The machine a guest kernel runs on: what its pins, agent, QEMU and
//! rules are chosen by. The guest knows its own ([`Arch::OF_THIS_BUILD`]);
//! the host reads it from the kernel under test.

use serde::{Deserialize, Serialize};

/// A guest architecture kloop runs; x86-64 where none is named (every
/// command's `--arch` default).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    #[default]
    X86_64,
    Arm64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Arm64];

    /// The architecture this binary was built for (the guest agent's own).
    #[cfg(target_arch = "aarch64")]
    pub const OF_THIS_BUILD: Arch = Arch::Arm64;
    #[cfg(not(target_arch = "aarch64"))]
    pub const OF_THIS_BUILD: Arch = Arch::X86_64;

    /// The name on the command line (`--arch`), in trial names and pin ids:
    /// the kernel's own `ARCH=` spelling but for x86, whose `uname -m` it
    /// keeps (`x86_64`; the kernel says `x86`).
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Parses `--arch`: the names of [`Arch::as_str`] and Debian's and
    /// `uname -m`'s spellings.
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "x86_64" | "amd64" | "x86-64" => Some(Arch::X86_64),
            "arm64" | "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// Debian's architecture name (`dpkg --print-architecture`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The kernel flavour kloop pins: Debian's cloud build, made for VMs.
    pub fn cloud_flavour(self) -> &'static str {
        match self {
            Arch::X86_64 => "cloud-amd64",
            Arch::Arm64 => "cloud-arm64",
        }
    }

    /// `make ARCH=…` for a source build.
    pub fn kbuild_arch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target the guest agent is built for: glibc with
    /// `crt-static`, since Debian ships no musl std for other targets.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// KCIDB's `architecture` field (the kernel's `ARCH=` names).
    pub fn kcidb(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The prefix of a pin id, trial name or file of this architecture:
    /// empty for x86-64, which kept its names from before arm64 came.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Arch::X86_64 => "",
            Arch::Arm64 => "arm64/",
        }
    }

    /// Debian's C compiler for programs of this architecture, run on an
    /// x86-64 host: the host's own, or the cross compiler
    /// (`gcc-aarch64-linux-gnu`, glibc's static archives from
    /// `libc6-dev-arm64-cross`).
    pub const fn c_compiler(self) -> &'static str {
        match self {
            Arch::X86_64 => "gcc",
            Arch::Arm64 => "aarch64-linux-gnu-gcc",
        }
    }

    /// The architecture a pin id names (`arm64/6.12` → arm64, `6.12` →
    /// x86-64) and the id without it.
    pub fn of_id(id: &str) -> (Arch, &str) {
        match id.strip_prefix("arm64/") {
            Some(rest) => (Arch::Arm64, rest),
            None => (Arch::X86_64, id),
        }
    }

    /// `PAGE_SIZE` of the kernels kloop pins for this architecture: a
    /// vmalloc area's guard page, the unit of its `pages=` count, and what
    /// bpf_image_ksym_add() announces. Debian builds arm64 with 4 KiB pages
    /// (`CONFIG_ARM64_4K_PAGES`, `CONFIG_ARM64_PAGE_SHIFT=12`).
    pub fn page_size(self) -> u64 {
        match self {
            Arch::X86_64 | Arch::Arm64 => 4096,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ids_carry_the_arch() {
        for arch in Arch::ALL {
            assert_eq!(Arch::parse(arch.as_str()), Some(arch));
            assert_eq!(Arch::parse(arch.debian()), Some(arch));
            let id = format!("{}6.12", arch.id_prefix());
            assert_eq!(Arch::of_id(&id), (arch, "6.12"));
        }
        assert_eq!(Arch::parse("riscv64"), None);
    }
}
