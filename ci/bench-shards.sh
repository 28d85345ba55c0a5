#!/usr/bin/env bash
# The figure of issue 26: wall time of the whole matrix as 1, 2 and 4
# local shards run side by side on this machine (each shard with its share
# of the cores as --jobs), and of their merge; then the mutation run's
# projected wall time on N runners from the per-mutant times measured in
# docs/mutation-score.json. `ci/bench-shards.sh [SHARDS…]` (default 1 2 4).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p xtask
xtask=target/debug/xtask
cores=$(nproc)
out=target/kloop/bench-shards
rm -rf "$out"
mkdir -p "$out"
printf '%-8s %-10s %-10s %s\n' shards wall_s merge_s verdicts
for n in "${@:-1 2 4}"; do
  jobs=$(( cores / n )); [ "$jobs" -ge 1 ] || jobs=1
  start=$(date +%s%N)
  pids=()
  for k in $(seq 1 "$n"); do
    "$xtask" vm-test --shard "$k/$n" --jobs "$jobs" > "$out/$n-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  wall=$(( ($(date +%s%N) - start) / 1000000000 ))
  dirs=()
  for k in $(seq 1 "$n"); do
    dirs+=("$(sed -n 's/^kloop: .* reports: //p' "$out/$n-$k.log" | tail -n 1)")
  done
  mstart=$(date +%s%N)
  "$xtask" merge --out "$out/merged-$n" "${dirs[@]}" > "$out/merge-$n.log" 2>&1 || true
  merge_ms=$(( ($(date +%s%N) - mstart) / 1000000 ))
  printf '%-8s %-10s %-10s %s\n' "$n" "$wall" "$((merge_ms / 1000)).$((merge_ms % 1000 / 100))" "$(sed -n 's/^kloop: merged [0-9]* shard(s) into [^:]*: //p' "$out/merge-$n.log")"
done
python3 - <<'PY'
import json
d = json.load(open("docs/mutation-score.json"))
secs = sorted((r["build_secs"] + r["judge_secs"] for r in d["results"]), reverse=True)
phases = d["baseline"].get("phases", {})
fixed = phases.get("compile_secs", 0) + phases.get("schema_build_secs", 0)
print(f"mutation run: {len(secs)} mutants, {sum(secs):.0f} s of per-mutant build+trials measured "
      f"(+{fixed:.0f} s compile and schema kernel per runner)")
for n in (1, 2, 4, 8, 16):
    load = [0.0] * n
    for s in secs:
        i = load.index(min(load))
        load[i] += s
    print(f"  {n:>2} runner(s): ~{(max(load) + fixed) / 60:.1f} min")
PY
