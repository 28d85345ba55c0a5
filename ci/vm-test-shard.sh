#!/usr/bin/env bash
# One shard of the VM matrix: `ci/vm-test-shard.sh K/N [vm-test args…]`.
# Runs `cargo xtask vm-test --shard K/N` and copies its run directory to
# target/kloop/shards/shard-K-of-N (what a CI job uploads and `ci/merge-
# shards.sh` joins). Balanced by ci/durations.jsonl when it exists (every
# shard reads the same file, so the partition is the same everywhere).
# The trials' own verdicts decide nothing here: the merge job does.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
shard=${1:?usage: ci/vm-test-shard.sh K/N [vm-test args...]}
shift
durations=()
[ -f ci/durations.jsonl ] && durations=(--durations ci/durations.jsonl)
log=$(mktemp)
cargo xtask vm-test --shard "$shard" "${durations[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
run_dir=$(sed -n 's/^kloop: .* reports: //p' "$log" | tail -n 1)
rm -f "$log"
if [ -z "$run_dir" ] || [ ! -f "$run_dir/shard.json" ]; then
  echo "ci/vm-test-shard.sh: shard $shard wrote no run directory (vm-test exited $status)" >&2
  exit 2
fi
dest="target/kloop/shards/shard-${shard/\//-of-}"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -r "$run_dir" "$dest"
echo "ci/vm-test-shard.sh: shard $shard in $dest (vm-test exited $status)"
# 0 or 1 (trials failed): the merge judges; anything else is a broken run.
[ "$status" -le 1 ]
