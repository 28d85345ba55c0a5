#!/usr/bin/env python3
"""Validate KCIDB I/O documents with KernelCI's own validator.

Usage: ci/kcidb-validate.py FILE...

Each FILE is checked against the latest schema the installed `kcidb-io`
package knows (the validator KernelCI's tools use, with its format
checker), and must hold at least one test. Exit 1 names the first problem.
"""
import json
import sys

import kcidb_io


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    schema = kcidb_io.schema.LATEST
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        try:
            schema.validate(data)
        except Exception as e:  # jsonschema's ValidationError, and the like
            print(f"{path}: not a valid KCIDB v{schema.major}.{schema.minor} document: {e}",
                  file=sys.stderr)
            return 1
        tests = len(data.get("tests", []))
        if tests == 0:
            print(f"{path}: valid, but holds no test", file=sys.stderr)
            return 1
        print(f"{path}: valid KCIDB v{schema.major}.{schema.minor}: "
              f"{len(data.get('checkouts', []))} checkout(s), "
              f"{len(data.get('builds', []))} build(s), {tests} test(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
