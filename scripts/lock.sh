#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml with uv (pinned below), for CPython 3.11:
#   requirements/lock.txt         the newest versions inside the declared ranges, every extra:
#                                 the constraints of scripts/setup-venv.sh (development and CI)
#   requirements/lock-oldest.txt  the lowest version of every direct dependency (uv's
#                                 lowest-direct resolution) with the test extras: what
#                                 scripts/check-oldest.sh installs to prove the lower bounds
# Run it after changing a dependency in pyproject.toml; `--upgrade` moves the newest lock on.
# uv keeps a package's pin from the existing lock: after a new direct dependency or a new lower
# bound, `--upgrade-package NAME` re-resolves that package in both locks.
# A unit test fails when pyproject.toml changed and the locks were not regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
UV_VERSION=0.13.8
tools="$CACHE/tools-venv"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ "$("$tools/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  rm -rf "$tools"
  "$PYTHON" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
upgrade=()
both=()
case "${1:-}" in
  --upgrade) upgrade=(--upgrade) ;;
  --upgrade-package) both=(--upgrade-package "${2:?--upgrade-package needs a package name}") ;;
esac
common=(--quiet --python-version 3.11 --universal --custom-compile-command "bash scripts/lock.sh")
"$tools/bin/uv" pip compile pyproject.toml "${common[@]}" "${upgrade[@]}" "${both[@]}" --all-extras \
  -o requirements/lock.txt
"$tools/bin/uv" pip compile pyproject.toml "${common[@]}" --resolution lowest-direct \
  "${both[@]}" --extra test -o requirements/lock-oldest.txt
# Record what the locks were resolved from; tests/unit/test_packaging.py recomputes it.
digest="$("$PYTHON" -c 'import hashlib, json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
keys = ("requires-python", "dependencies", "optional-dependencies")
print(hashlib.sha256(json.dumps({k: p.get(k) for k in keys}, sort_keys=True).encode()).hexdigest())')"
for f in requirements/lock.txt requirements/lock-oldest.txt; do
  echo "# resolved from pyproject.toml dependencies sha256 $digest" >> "$f"
done
