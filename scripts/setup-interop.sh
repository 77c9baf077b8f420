#!/usr/bin/env bash
# Build, once and cached, the environment the Java Hudi interop tests read tables in:
#   $LAKESINK_CACHE/interop-venv   Python 3.11 with jvm/interop/requirements.txt (pyspark 3.5)
#   $LAKESINK_CACHE/hudi-jars      the Hudi Spark bundle, hadoop-aws and the AWS SDK bundle (s3a)
#                                  resolved by jvm/hudi/pom.xml
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: a second run
# checks two stamp files and returns. Prints nothing but errors unless something is built.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-interop "the interop environment"

setup_venv "$CACHE/interop-venv" jvm/interop/requirements.txt
setup_jars jvm/hudi/pom.xml "$CACHE/hudi-jars" "$CACHE/m2"
