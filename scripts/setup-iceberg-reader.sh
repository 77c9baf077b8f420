#!/usr/bin/env bash
# Build, once and cached, the environment the Java Iceberg interop tests read tables in:
#   $LAKESINK_CACHE/peers-venv      Python 3.11 with pyspark 4.1 (jvm/peers/requirements.txt; the
#                                   same environment scripts/setup-peers.sh builds, shared)
#   $LAKESINK_CACHE/iceberg-jars    Iceberg's Spark 4.1 runtime and the SQLite JDBC driver
#                                   (jvm/iceberg/pom.xml)
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# the hash of what each part was built from; a second run returns without building anything.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
mkdir -p "$CACHE"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v java >/dev/null 2>&1 || { echo "the Iceberg reader needs Java 17: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if ! command -v mvn >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null
fi

venv="$CACHE/peers-venv"
want="$(sha256sum jvm/peers/requirements.txt | cut -d' ' -f1)"
if [ "$(cat "$venv/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup-iceberg-reader: creating $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r jvm/peers/requirements.txt
  echo "$want" > "$venv/.lakesink-stamp"
fi

jars="$CACHE/iceberg-jars"
want="$(sha256sum jvm/iceberg/pom.xml | cut -d' ' -f1)"
if [ "$(cat "$jars/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup-iceberg-reader: resolving jvm/iceberg/pom.xml into $jars" >&2
  rm -rf "$jars"
  mkdir -p "$CACHE/maven"
  mvn -q -B -Dstyle.color=never -f jvm/iceberg/pom.xml -Dmaven.repo.local="$CACHE/maven" \
    dependency:copy-dependencies -DoutputDirectory="$jars"
  ls "$jars"/*.jar >/dev/null
  echo "$want" > "$jars/.lakesink-stamp"
fi
