#!/usr/bin/env bash
# Build, once and cached, the environments of the benchmark's peers (benchmarks/peers.py):
#   $LAKESINK_CACHE/peers-venv        Python 3.11, jvm/peers/requirements.txt (pyspark 4.1, Delta, delta-rs)
#   $LAKESINK_CACHE/peers-jars        spark-sql-kafka + Delta for Spark 4.1 (jvm/peers/pom.xml)
#   $LAKESINK_CACHE/peers-hudi-jars   spark-sql-kafka for Spark 3.5 (jvm/peers/hudi/pom.xml)
#   $LAKESINK_CACHE/interop-venv, hudi-jars   pyspark 3.5.8 + Hudi 1.2.0 (scripts/setup-interop.sh)
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# the hash of what each part was built from; a second run returns without building anything.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-peers "the peers"

bash scripts/setup-interop.sh

setup_venv "$CACHE/peers-venv" jvm/peers/requirements.txt
setup_jars jvm/peers/pom.xml "$CACHE/peers-jars"
setup_jars jvm/peers/hudi/pom.xml "$CACHE/peers-hudi-jars"
