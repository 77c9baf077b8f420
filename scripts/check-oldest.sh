#!/usr/bin/env bash
# Prove the lower bounds of pyproject.toml: install requirements/lock-oldest.txt (the lowest
# version of every direct dependency: pyspark 4.2.0, pyarrow 18.0.0, ...) into a venv of their
# own, then run the unit tests and one small real ingestion (`lakesink demo`: embedded broker,
# Spark local[2], the Hudi table read back with hudi-rs and the exactly-once audit) against them.
# The dependencies' venv is keyed by the lock file and the interpreter and kept outside the
# checkout, in $LAKESINK_CACHE or else ~/.cache/lakesink (beside pip's own cache), so a fresh
# clone reuses it and it is rebuilt only when the lock changes. lakesink itself never goes into
# it: each run installs this checkout into a throwaway venv that sees the dependencies through a
# .pth file, so checkouts sharing the cache cannot see each other's code.
#
# Usage: check-oldest.sh [all|demo|unit] (default all). scripts/test.sh runs `demo` in its
# set-up (which also makes the venv) and `unit` in the background during the integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
case "$part" in
  all|demo|unit) ;;
  *) echo "check-oldest: unknown part '$part' (valid: all, demo, unit)" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
CACHE="${LAKESINK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lakesink}"
mkdir -p "$CACHE"
want="$( (cat requirements/lock-oldest.txt; "$PYTHON" -VV) | sha256sum | cut -c1-16)"
deps="$CACHE/oldest-venv-$want"
exec 9>"$deps.lock"
flock 9   # one creator per key; a second run waits for it and then reuses the venv
if [ "$(cat "$deps/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "check-oldest: creating $deps" >&2
  rm -rf "$deps"
  "$PYTHON" -m venv "$deps"
  "$deps/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
    -r requirements/lock-oldest.txt
  echo "$want" > "$deps/.lakesink-stamp"
fi
flock -u 9
# venvs of older locks, unused for two weeks, go
find "$CACHE" -maxdepth 1 -name 'oldest-venv-*' ! -name "oldest-venv-$want*" -mtime +14 \
  -exec rm -rf {} + 2>/dev/null || true
touch "$deps/.lakesink-stamp"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="$work/venv"
"$PYTHON" -m venv --without-pip "$venv"
# lakesink itself from this checkout, no dependency resolution (the lock has them all); built
# before the dependencies are linked in, so the build sees only its own isolated setuptools
"$deps/bin/python" -m pip --python "$venv/bin/python" install --quiet \
  --disable-pip-version-check --no-deps -e . > "$work/install.log" 2>&1 \
  || { cat "$work/install.log" >&2; exit 1; }
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
deps_site="$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
echo "import site; site.addsitedir('$deps_site')" > "$site/lakesink-oldest-deps.pth"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import lakesink
print("check-oldest:", ", ".join(f"{d} {md.version(d)}" for d in (
    "pyspark", "pyarrow", "pandas", "confluent-kafka", "fastavro", "pyyaml", "hudi", "noida-db")),
    "; lakesink from", lakesink.__file__)
PY
if [ "$part" != demo ]; then
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit -x
fi
[ "$part" != unit ] || exit 0
# the demo's Spark start cache (class archive) in the work folder, not the user's home; its
# short-lived driver on the JIT's first tier and the serial collector (far less CPU, the same
# semantics: as in scripts/check-wheel.sh), unless SPARK_SUBMIT_OPTS says otherwise
SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}" \
  PATH="$venv/bin:$PATH" PYSPARK_PYTHON="$venv/bin/python" LAKESINK_SPARK_START_CACHE_DIR="$work/spark-start" \
  "$venv/bin/lakesink" demo --events 2000 --partitions 2 --dir "$work/lake" > "$work/demo.log" 2>&1 \
  || { cat "$work/demo.log" >&2; echo "check-oldest: lakesink demo failed on the oldest pins" >&2; exit 1; }
grep -E "records in|hudi-rs reads|exactly once|OK|audit" "$work/demo.log" | head -5
