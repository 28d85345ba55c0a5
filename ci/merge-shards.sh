#!/usr/bin/env bash
# Join the shards of one run: `ci/merge-shards.sh OUT SHARD_DIR…`.
# `cargo xtask merge` writes OUT (results.jsonl, junit.xml, summary.md,
# kcidb.json and every trial's artefacts); the KCIDB document is checked
# with KernelCI's validator (kcidb-io, from the venv CI_TOOLS, default
# target/ci-tools); on GitHub the summary goes to the step summary. Exits
# as the merged run does: 0 every trial passed, 1 some failed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: ci/merge-shards.sh OUT SHARD_DIR...}
shift
tools=${CI_TOOLS:-target/ci-tools}
rm -rf "$out"
status=0
cargo xtask merge --out "$out" "$@" || status=$?
[ "$status" -le 1 ] || exit "$status"
"$tools/bin/python" ci/kcidb-validate.py "$out/kcidb.json"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$out/summary.md" >> "$GITHUB_STEP_SUMMARY"
fi
exit "$status"
