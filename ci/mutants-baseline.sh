#!/usr/bin/env bash
# The mutation run's shared start: `ci/mutants-baseline.sh pack FILE` builds
# the unmutated kernel and packs it with the compiler cache into FILE;
# `ci/mutants-baseline.sh unpack FILE` puts them back on a shard's runner,
# whose own builds (the mutated files, its schema kernel) then hit ccache.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: ci/mutants-baseline.sh pack|unpack FILE}
file=${2:?usage: ci/mutants-baseline.sh pack|unpack FILE}
case "$mode" in
  pack)
    cargo xtask kernels build --source linux-source-6.12
    dirs=(.cache/kloop/build/kernels)
    [ -d "$HOME/.cache/ccache" ] && dirs+=(.cache/ccache)
    tar -C "$HOME" -cf "$file" "${dirs[@]}"
    ;;
  unpack)
    tar -C "$HOME" -xf "$file"
    ;;
  *)
    echo "ci/mutants-baseline.sh: pack or unpack, not $mode" >&2
    exit 2
    ;;
esac
