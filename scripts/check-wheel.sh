#!/usr/bin/env bash
# Build the wheel and sdist with `python -m build` (build pinned below, in a venv cached under
# $LAKESINK_CACHE, else ~/.cache/lakesink, so a fresh clone reuses it) into dist/, fail on any warning of the build, then install the
# wheel into a new, empty venv with nothing but `pip install dist/lakesink-*.whl[demo,verify]`
# and run a small `lakesink demo` there, outside the checkout (so nothing is imported from it),
# then the notebook API example (examples/notebook.py) against the embedded broker, with hudi-rs
# counting what it wrote (scripts/wheel_examples.py); the demo and the example run side by side,
# each with its own broker, Spark and folder. (examples/spark_submit_app.py runs under
# spark-submit on a standalone cluster in the test suite.)
# (PYTHONDONTWRITEBYTECODE is unset for the build: setuptools warns that it skips byte-compiling.)
# pip's own cache keeps the second and later installs fast.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
CACHE="${LAKESINK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lakesink}"
BUILD_VERSION=1.6.1
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
mkdir -p "$CACHE"
bvenv="$CACHE/build-venv-$BUILD_VERSION-$("$PYTHON" -VV | sha256sum | cut -c1-8)"
exec 9>"$bvenv.lock"
flock 9   # one creator per key; a second run waits for it and then reuses the venv
if [ "$(cat "$bvenv/.lakesink-stamp" 2>/dev/null || true)" != "build==$BUILD_VERSION" ]; then
  rm -rf "$bvenv"
  "$PYTHON" -m venv "$bvenv"
  "$bvenv/bin/python" -m pip install --quiet --disable-pip-version-check "build==$BUILD_VERSION"
  echo "build==$BUILD_VERSION" > "$bvenv/.lakesink-stamp"
fi
flock -u 9
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf dist
t0=$SECONDS
env -u PYTHONDONTWRITEBYTECODE "$bvenv/bin/python" -m build --outdir dist . > "$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; echo "check-wheel: python -m build failed" >&2; exit 1; }
if grep -inE "warn" "$work/build.log" >&2; then
  echo "check-wheel: the build printed warnings (above)" >&2
  exit 1
fi
wheel="$(ls dist/lakesink-*.whl)"
ls dist/lakesink-*.tar.gz >/dev/null
echo "check-wheel: built $(basename "$wheel") and the sdist in $((SECONDS - t0))s, no warnings"
t0=$SECONDS
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
  "$PWD/${wheel}[demo,verify]"
echo "check-wheel: installed into a clean venv in $((SECONDS - t0))s"
version=$("$work/venv/bin/lakesink" --version)
[ "$version" = "lakesink $("$work/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("lakesink"))')" ] \
  || { echo "check-wheel: lakesink --version says '$version'" >&2; exit 1; }
t0=$SECONDS
# Spark's start cache (the class archive the first run writes) in the work folder, not the
# user's home: each check's venv is new, so is its archive
export LAKESINK_SPARK_START_CACHE_DIR="$work/spark-start"
# the demo's and the examples' Spark drivers live for a minute or two, side by side on what may be
# a 2-core machine: the JIT's first tier and the serial collector spend far less CPU on them than
# the full tiered compiler (as for the suite's CLI runs: tests/integration/conftest.py); the
# semantics are the JVM's either way, and a SPARK_SUBMIT_OPTS of the caller's own wins
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
# the API examples in the background, beside the demo
(cd "$work" && PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$repo/scripts/wheel_examples.py" \
  "$repo/examples" > "$work/examples.log" 2>&1) &
examples=$!
(cd "$work" && PATH="$work/venv/bin:$PATH" PYSPARK_PYTHON="$work/venv/bin/python" \
  "$work/venv/bin/lakesink" demo --events 2000 --partitions 2 --dir "$work/lake" > "$work/demo.log" 2>&1) \
  || { cat "$work/demo.log" >&2; echo "check-wheel: lakesink demo failed from the wheel" >&2; wait "$examples" || true; exit 1; }
(cd "$work" && "$work/venv/bin/python" -c \
  "import lakesink, sys; assert lakesink.__file__.startswith('$work/venv/'), lakesink.__file__")
echo "check-wheel: lakesink demo from the wheel passed its audit in $((SECONDS - t0))s"
wait "$examples" \
  || { cat "$work/examples.log" >&2; echo "check-wheel: the API examples failed from the wheel" >&2; exit 1; }
tail -1 "$work/examples.log"
echo "check-wheel: the API examples from the wheel passed in $((SECONDS - t0))s (beside the demo)"
