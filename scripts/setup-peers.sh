#!/usr/bin/env bash
# Build, once and cached, the environments of the benchmark's peers (benchmarks/peers.py):
#   $LAKESINK_CACHE/peers-venv        Python 3.11, jvm/peers/requirements.txt (pyspark 4.1, Delta, delta-rs)
#   $LAKESINK_CACHE/peers-jars        spark-sql-kafka + Delta for Spark 4.1 (jvm/peers/pom.xml)
#   $LAKESINK_CACHE/peers-hudi-jars   spark-sql-kafka for Spark 3.5 (jvm/peers/hudi/pom.xml)
#   $LAKESINK_CACHE/interop-venv, hudi-jars   pyspark 3.5.8 + Hudi 1.2.0 (scripts/setup-interop.sh)
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# the hash of what each part was built from; a second run returns without building anything.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
mkdir -p "$CACHE"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v java >/dev/null 2>&1 || { echo "the peers need Java 17: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if ! command -v mvn >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null
fi

bash scripts/setup-interop.sh

venv="$CACHE/peers-venv"
want="$(sha256sum jvm/peers/requirements.txt | cut -d' ' -f1)"
if [ "$(cat "$venv/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup-peers: creating $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r jvm/peers/requirements.txt
  echo "$want" > "$venv/.lakesink-stamp"
fi

resolve() {  # pom, output folder
  local pom="$1" out="$2" want
  want="$(sha256sum "$pom" | cut -d' ' -f1)"
  if [ "$(cat "$out/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "setup-peers: resolving $pom into $out" >&2
    rm -rf "$out"
    mkdir -p "$CACHE/maven"
    mvn -q -B -Dstyle.color=never -f "$pom" -Dmaven.repo.local="$CACHE/maven" \
      dependency:copy-dependencies -DoutputDirectory="$out"
    ls "$out"/*.jar >/dev/null
    echo "$want" > "$out/.lakesink-stamp"
  fi
}
resolve jvm/peers/pom.xml "$CACHE/peers-jars"
resolve jvm/peers/hudi/pom.xml "$CACHE/peers-hudi-jars"
