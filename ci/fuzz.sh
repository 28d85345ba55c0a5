#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for N executions each (default
# 1,000,000) and prints executions, exec/s, wall time and findings per target.
#
#   ci/fuzz.sh [RUNS]
#
# Environment: KLOOP_FUZZ_TARGETS (default "records frames analyse"),
# KLOOP_FUZZ_TOOLCHAIN (default "+nightly"; cargo-fuzz needs nightly).
#
# One libFuzzer process per target, one after the other (no -jobs/-workers).
# The working corpus grows in fuzz/corpus/<target>/ (not committed), seeded
# from fuzz/seeds/<target>/ and fuzz/regressions/<target>/; a crash, hang or
# OOM input lands in fuzz/artifacts/<target>/. To keep a finding: fix it, copy
# the input into fuzz/regressions/<target>/ and run
# `cargo test -p kloop-fuzz-support --test fuzz_corpus`. Exits non-zero on any finding.
set -uo pipefail

runs="${1:-1000000}"
targets="${KLOOP_FUZZ_TARGETS:-records frames analyse}"
toolchain="${KLOOP_FUZZ_TOOLCHAIN:-+nightly}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz" || exit 2

if ! cargo "$toolchain" fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz || exit 2
fi

# Safe Rust: no sanitizer (about 3x faster); debug assertions and overflow
# checks stay on (cargo-fuzz's default for release builds).
fuzz_flags=(--sanitizer none)
cargo "$toolchain" fuzz build "${fuzz_flags[@]}" || exit 2

count_findings() {
    find "artifacts/$1" -maxdepth 1 -type f \
        \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l
}

status=0
summary=()
for t in $targets; do
    case "$t" in
        frames) max_len=8192 ;;
        *) max_len=4096 ;;
    esac
    mkdir -p "corpus/$t" "artifacts/$t" logs
    dirs=("corpus/$t" "seeds/$t")
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    before=$(count_findings "$t")
    start=$(date +%s)
    cargo "$toolchain" fuzz run "${fuzz_flags[@]}" "$t" "${dirs[@]}" -- \
        -runs="$runs" -max_len="$max_len" -timeout=10 -rss_limit_mb=1024 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"logs/$t.log" 2>&1
    rc=$?
    wall=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "logs/$t.log" | tail -n1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "logs/$t.log" | tail -n1)
    findings=$(($(count_findings "$t") - before))
    line=$(printf '%-8s executions=%s exec/s=%s wall=%ss findings=%s exit=%s' \
        "$t" "${execs:-?}" "${rate:-?}" "$wall" "$findings" "$rc")
    echo "$line"
    summary+=("$line")
    if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
        status=1
        grep -m1 -A3 'panicked at' "logs/$t.log" || tail -n 20 "logs/$t.log"
        find "artifacts/$t" -maxdepth 1 -type f \
            \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) |
            sed 's|^|  finding: fuzz/|'
    fi
done

echo "== fuzz summary ($runs runs per target; logs in fuzz/logs/) =="
printf '%s\n' "${summary[@]}"
exit "$status"
