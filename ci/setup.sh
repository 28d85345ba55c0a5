#!/usr/bin/env bash
# Installs the system packages kloop needs on a Debian (or Debian-based) host:
# QEMU to boot kernels, clang to compile the BPF fixtures, dpkg-deb and
# apt-get (present on every Debian) to fetch and unpack kernel packages,
# python3 for the import-cycle check (ci/module-cycles.py, run by
# harness/tests/layout.rs), and perf (linux-perf), which the perf-tool scenario ships into the guest
# with its libraries as a second reader of the records, and busybox-static,
# whose static busybox is the shell of `cargo xtask vm-shell`'s guest.
# With --kernel-build it also installs what `cargo xtask kernels build` and
# `cargo xtask validate` need to compile kernels from source: gcc, make,
# flex, bison, bc, libelf-dev, libssl-dev, pahole (dwarves, for BTF), patch,
# xz-utils, zstd and ccache (optional; cached objects make rebuilds cheap).
# Idempotent: packages already installed are left alone.
set -euo pipefail

need=()
if [ "${1:-}" = "--kernel-build" ]; then
  for tool_pkg in gcc:gcc make:make flex:flex bison:bison bc:bc pahole:dwarves patch:patch xz:xz-utils zstd:zstd ccache:ccache cpio:cpio; do
    command -v "${tool_pkg%%:*}" >/dev/null 2>&1 || need+=("${tool_pkg#*:}")
  done
  [ -e /usr/include/libelf.h ] || need+=(libelf-dev)
  [ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
fi
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
[ -x /usr/bin/perf ] || need+=(linux-perf)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v python3 >/dev/null 2>&1 || need+=(python3)

if [ ${#need[@]} -eq 0 ]; then
  echo "kloop setup: all system packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "kloop setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "kloop setup: installing ${need[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
