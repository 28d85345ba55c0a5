#!/usr/bin/env bash
# Join the shards of one mutation run: `ci/mutants-merge.sh OUT.md DATA.json…`
# (each shard's data file, beside its report) into one report with one
# score; on GitHub it goes to the step summary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: ci/mutants-merge.sh OUT.md DATA.json...}
shift
status=0
cargo xtask mutants --source linux-source-6.12 --max "${MUTANTS_MAX:-1000}" \
  --report "$out" --merge "$@" || status=$?
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  sed -n '1,/^## Which scenario/p' "$out" >> "$GITHUB_STEP_SUMMARY"
fi
exit "$status"
