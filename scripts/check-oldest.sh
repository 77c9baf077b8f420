#!/usr/bin/env bash
# Prove the lower bounds of pyproject.toml: install requirements/lock-oldest.txt (the lowest
# version of every direct dependency: pyspark 4.2.0, pyarrow 18.0.0, ...) into a separate venv,
# cached under $LAKESINK_CACHE/oldest-venv and rebuilt only when the lock changes, then run the
# unit tests and one small real ingestion (`lakesink demo`: embedded broker, Spark local[2],
# the Hudi table read back with hudi-rs and the exactly-once audit) in it.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
venv="$CACHE/oldest-venv"
want="$(cat requirements/lock-oldest.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$venv/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "check-oldest: creating $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
    -r requirements/lock-oldest.txt
  echo "$want" > "$venv/.lakesink-stamp"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# lakesink itself from this checkout, no dependency resolution (the lock has them all)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e . \
  > "$work/install.log" 2>&1 || { cat "$work/install.log" >&2; exit 1; }
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
print("check-oldest:", ", ".join(f"{d} {md.version(d)}" for d in (
    "pyspark", "pyarrow", "pandas", "confluent-kafka", "fastavro", "pyyaml", "hudi", "noida-db")))
PY
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit -x
PATH="$venv/bin:$PATH" PYSPARK_PYTHON="$venv/bin/python" \
  "$venv/bin/lakesink" demo --events 2000 --partitions 2 --dir "$work/lake" > "$work/demo.log" 2>&1 \
  || { cat "$work/demo.log" >&2; echo "check-oldest: lakesink demo failed on the oldest pins" >&2; exit 1; }
grep -E "records in|hudi-rs reads|exactly once|OK|audit" "$work/demo.log" | head -5
