#!/usr/bin/env bash
# One shard of a mutation run: `ci/mutants-shard.sh K/N [mutants args…]`.
# Judges shard K of N of the mutants of linux-source-6.12 and keeps its
# report and data in target/kloop/mutants/shard-K-of-N.{md,json} (what a
# CI job uploads and `ci/mutants-merge.sh` joins). MUTANTS_MAX (default
# 1000: every generated mutant) bounds the sample.
set -euo pipefail
cd "$(dirname "$0")/.."
shard=${1:?usage: ci/mutants-shard.sh K/N [mutants args...]}
shift
out="target/kloop/mutants/shard-${shard/\//-of-}"
mkdir -p "$(dirname "$out")"
status=0
cargo xtask mutants --source linux-source-6.12 --max "${MUTANTS_MAX:-1000}" \
  --shard "$shard" --report "$out.md" "$@" || status=$?
# 1: survivors without a note, which the merged report judges; a --list
# judges nothing, so anything but 0 is a failure there.
case " $* " in
  *" --list "*) [ "$status" -eq 0 ] ;;
  *) [ "$status" -le 1 ] ;;
esac
