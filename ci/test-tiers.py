#!/usr/bin/env python3
"""The CI tier of every cargo test target, from ci/test-tiers.txt.

    ci/test-tiers.py check        every test target is in exactly one tier
    ci/test-tiers.py args TIER    `--test NAME` for each target of TIER

The targets come from `cargo metadata` (CARGO names the cargo binary; the
default is `cargo` on PATH), so a test file added under any crate's tests/
is seen whether or not its author remembered CI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "ci" / "test-tiers.txt"
TIERS = ("unit", "packages", "matrix", "vm", "slow")


def listed():
    """(tier, target, line number) for each entry of the list."""
    out = []
    for n, line in enumerate(LIST.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or words[0] not in TIERS:
            sys.exit(f"{LIST}:{n}: expected `<tier> <target>` with tier one of {', '.join(TIERS)}")
        out.append((words[0], words[1], n))
    return out


def test_targets():
    """Names of the workspace's test targets (kind `test`)."""
    cargo = os.environ.get("CARGO", "cargo")
    meta = subprocess.run(
        [cargo, "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )
    names = set()
    for package in json.loads(meta.stdout)["packages"]:
        for target in package["targets"]:
            if "test" in target["kind"]:
                names.add(target["name"])
    return names


def check():
    entries = listed()
    targets = test_targets()
    problems = []
    seen = {}
    for tier, target, n in entries:
        if target in seen:
            problems.append(f"{LIST}:{n}: `{target}` is already in tier `{seen[target]}`")
        seen[target] = tier
        if target not in targets:
            problems.append(f"{LIST}:{n}: `{target}` is no test target of the workspace any more: remove it")
    for target in sorted(targets - set(seen)):
        problems.append(
            f"test target `{target}` is in no CI tier: add `<tier> {target}` to {LIST.relative_to(ROOT)} "
            f"(unit if it needs no VM and no network)"
        )
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"test tiers: {len(targets)} test targets, each in one tier")
    return 0


def args(tier):
    if tier not in TIERS:
        sys.exit(f"unknown tier `{tier}`: one of {', '.join(TIERS)}")
    print(" ".join(f"--test {target}" for t, target, _ in listed() if t == tier))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        sys.exit(check())
    if len(sys.argv) == 3 and sys.argv[1] == "args":
        sys.exit(args(sys.argv[2]))
    sys.exit(__doc__)
