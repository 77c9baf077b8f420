#!/usr/bin/env bash
# Build, once and cached, the environment the Java Iceberg interop tests read tables in:
#   $LAKESINK_CACHE/peers-venv      Python 3.11 with pyspark 4.1 (jvm/peers/requirements.txt; the
#                                   same environment scripts/setup-peers.sh builds, shared)
#   $LAKESINK_CACHE/iceberg-jars    Iceberg's Spark 4.1 runtime, the SQLite and PostgreSQL JDBC
#                                   drivers, iceberg-aws-bundle (S3FileIO)
#                                   (jvm/iceberg/pom.xml)
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# the hash of what each part was built from; a second run returns without building anything.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-iceberg-reader "the Iceberg reader"

setup_venv "$CACHE/peers-venv" jvm/peers/requirements.txt
setup_jars jvm/iceberg/pom.xml "$CACHE/iceberg-jars"
