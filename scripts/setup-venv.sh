#!/usr/bin/env bash
# Create ./.venv with Python 3.11 and install lakesink (editable) with the `demo` and `verify`
# extras the README's commands use, plus EXTRAS (EXTRAS="test" adds what the test suite needs),
# at the versions requirements/lock.txt pins (scripts/lock.sh regenerates it). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "lakesink needs Python 3.11"'
command -v java >/dev/null 2>&1 || { echo "lakesink needs Java 17 (Spark): apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extras="demo,verify${EXTRAS:+,${EXTRAS}}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -c requirements/lock.txt -e ".[${extras}]"
