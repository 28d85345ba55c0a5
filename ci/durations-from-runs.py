#!/usr/bin/env python3
"""Writes ci/durations.jsonl from the results.jsonl of whole-matrix runs.

Usage: ci/durations-from-runs.py RUN_DIR... > ci/durations.jsonl

One row per trial: its id, wall seconds (what `vm-test --shard K/N
--durations` balances the shards by), verdict class, the saved VM it was
restored from (its VM shape's key; none for a trial SKIPPED before a
boot) and the run it comes from. The docs test (xtask/src/docs_generated.rs) holds the README's and
docs/usage.md's sample output to these rows and checks that they cover
every planned trial of every architecture, so a new scenario or pin means
a new whole-matrix run (`cargo xtask vm-test --arch all`) and this script.
"""
import json
import os
import sys


def main(run_dirs):
    rows = {}
    for d in run_dirs:
        run = os.path.basename(os.path.normpath(d))
        with open(os.path.join(d, "results.jsonl"), encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                rows[r["id"]] = {
                    "id": r["id"],
                    "wall_secs": round(r["wall_secs"], 2),
                    "class": r["verdict"]["class"],
                    "saved_vm": (r.get("saved_vm") or {}).get("key"),
                    "run": run,
                }
    for id_ in sorted(rows):
        print(json.dumps(rows[id_]))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
