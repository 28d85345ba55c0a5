#!/usr/bin/env bash
# Installs the system packages kloop needs on a Debian or Ubuntu host:
# QEMU to boot kernels, clang to compile the BPF fixtures, dpkg-deb and
# apt-get (present on every Debian and Ubuntu) to fetch and unpack kernel
# packages, the static libc the guest agent links (libc6-dev), python3 for
# the import-cycle and test-tier checks (ci/module-cycles.py,
# ci/test-tiers.py, run by harness/tests/layout.rs), Debian's archive keyring
# (kloop verifies Debian's signed index with it; Ubuntu does not ship it by
# default), and perf, which the perf-tool scenario ships into the guest with
# its libraries as a second reader of the records: Debian's `linux-perf`, or
# on Ubuntu `linux-tools-common` plus the running kernel's
# `linux-tools-$(uname -r)` (`linux-tools-generic` when the archive has no
# package for the running kernel).
# And busybox-static, whose static busybox is the shell of `cargo xtask
# vm-shell`'s guest.
# With --kernel-build it also installs what `cargo xtask kernels build` and
# `cargo xtask validate` need to compile kernels from source: gcc, make,
# flex, bison, bc, libelf-dev, libssl-dev, pahole (dwarves, for BTF), patch,
# xz-utils, zstd, lz4 (kloop.config compresses its kernels with lz4) and
# ccache (optional; cached objects make rebuilds cheap).
# With --arch arm64 it also installs what arm64 guests need: QEMU's aarch64
# system emulator (qemu-system-arm), and Debian's own Rust with the arm64
# standard library (rustc-web, libstd-rust-web-dev:arm64, after
# `dpkg --add-architecture arm64`), the aarch64 cross linker and glibc
# (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) that build the static
# arm64 guest agent; the cross compiler also builds arm64 kernels
# (`validate --arch arm64`). rustup cannot fetch another target's std
# everywhere kloop runs; Debian's can be had from the mirror.
# Idempotent: packages already installed are left alone.
#
# The kernels themselves come from a Debian mirror: on Debian the host's own
# apt sources name it; on Ubuntu set KLOOP_MIRROR to a Debian mirror's URL
# (`cargo xtask doctor` says what kloop will use).
set -euo pipefail

os_id=""
os_like=""
if [ -r /etc/os-release ]; then
  # shellcheck source=/dev/null # the host's, not ours
  os_id=$(. /etc/os-release && echo "${ID:-}")
  # shellcheck source=/dev/null
  os_like=$(. /etc/os-release && echo "${ID_LIKE:-}")
fi
ubuntu=false
case " $os_id $os_like " in *" ubuntu "*) ubuntu=true ;; esac

# A perf binary kloop can ship: Debian's /usr/bin/perf (or a versioned one
# behind its wrapper script), or one of Ubuntu's per-release binaries
# (/usr/bin/perf there is a wrapper that fails without them).
have_perf() {
  if $ubuntu; then
    compgen -G '/usr/lib/linux-tools/*/perf' >/dev/null
  else
    [ -x /usr/bin/perf ]
  fi
}

kernel_build=false
arm64=false
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel-build) kernel_build=true ;;
    --arch)
      case "${2:-}" in
        arm64) arm64=true ;;
        x86_64 | amd64) ;;
        all) arm64=true ;;
        *) echo "kloop setup: --arch takes x86_64, arm64 or all, not '${2:-}'" >&2; exit 2 ;;
      esac
      shift ;;
    *) echo "kloop setup: unknown argument '$1' (--kernel-build, --arch arm64)" >&2; exit 2 ;;
  esac
  shift
done

need=()
add_arm64_arch=false
if $arm64; then
  command -v qemu-system-aarch64 >/dev/null 2>&1 || need+=(qemu-system-arm)
  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
  [ -e /usr/aarch64-linux-gnu/lib/libc.a ] || need+=(libc6-dev-arm64-cross)
  [ -x /usr/bin/rustc ] || need+=(rustc-web)
  if [ ! -d /usr/lib/rustlib/aarch64-unknown-linux-gnu/lib ]; then
    need+=(libstd-rust-web-dev:arm64)
    dpkg --print-foreign-architectures | grep -qx arm64 || add_arm64_arch=true
  fi
fi
if $kernel_build; then
  for tool_pkg in gcc:gcc make:make flex:flex bison:bison bc:bc pahole:dwarves patch:patch xz:xz-utils zstd:zstd lz4:lz4 ccache:ccache cpio:cpio; do
    command -v "${tool_pkg%%:*}" >/dev/null 2>&1 || need+=("${tool_pkg#*:}")
  done
  [ -e /usr/include/libelf.h ] || need+=(libelf-dev)
  [ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
fi
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
# Stand-alone reproducers and scenario [[programs]]: gcc -static with the
# kernel's uapi headers.
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -e /usr/include/linux/perf_event.h ] || need+=(linux-libc-dev)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v python3 >/dev/null 2>&1 || need+=(python3)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
perf_missing=false
if ! have_perf; then
  perf_missing=true
  $ubuntu || need+=(linux-perf)
fi

if [ ${#need[@]} -eq 0 ] && ! $perf_missing; then
  echo "kloop setup: all system packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    $perf_missing && $ubuntu && need+=("perf (linux-tools-*)")
    echo "kloop setup: need root (or sudo) to install: ${need[*]}" >&2
    exit 1
  fi
  SUDO="sudo"
fi
if $add_arm64_arch; then
  echo "kloop setup: adding the arm64 architecture to dpkg (for libstd-rust-web-dev:arm64)"
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -q
if $perf_missing && $ubuntu; then
  # Ubuntu builds perf per kernel release; a runner's kernel may be newer
  # than the archive's packages, then the generic kernel's perf serves
  # (kloop ships any recent perf into guests of every pinned kernel).
  tools="linux-tools-$(uname -r)"
  if ! apt-cache policy "$tools" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -qv '(none)'; then
    tools=linux-tools-generic
  fi
  need+=(linux-tools-common "$tools")
fi
echo "kloop setup: installing ${need[*]}"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
