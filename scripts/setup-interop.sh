#!/usr/bin/env bash
# Build, once and cached, the environment the Java Hudi interop tests read tables in:
#   $LAKESINK_CACHE/interop-venv   Python 3.11 with jvm/interop/requirements.txt (pyspark 3.5)
#   $LAKESINK_CACHE/hudi-jars      the Hudi Spark bundle, hadoop-aws and the AWS SDK bundle (s3a)
#                                  resolved by jvm/hudi/pom.xml
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: a second run
# checks two stamp files and returns. Prints nothing but errors unless something is built.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
mkdir -p "$CACHE"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v java >/dev/null 2>&1 || { echo "the interop environment needs Java 17: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if ! command -v mvn >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null
fi

venv="$CACHE/interop-venv"
want_venv="$(sha256sum jvm/interop/requirements.txt | cut -d' ' -f1)"
if [ "$(cat "$venv/.lakesink-stamp" 2>/dev/null || true)" != "$want_venv" ]; then
  echo "setup-interop: creating $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r jvm/interop/requirements.txt
  echo "$want_venv" > "$venv/.lakesink-stamp"
fi

jars="$CACHE/hudi-jars"
want_jars="$(sha256sum jvm/hudi/pom.xml | cut -d' ' -f1)"
if [ "$(cat "$jars/.lakesink-stamp" 2>/dev/null || true)" != "$want_jars" ]; then
  echo "setup-interop: resolving jvm/hudi/pom.xml into $jars" >&2
  rm -rf "$jars"
  mvn -q -B -Dstyle.color=never -f jvm/hudi/pom.xml -Dmaven.repo.local="$CACHE/m2" \
    dependency:copy-dependencies -DoutputDirectory="$jars"
  ls "$jars"/*.jar >/dev/null
  echo "$want_jars" > "$jars/.lakesink-stamp"
fi
