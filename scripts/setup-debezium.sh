#!/usr/bin/env bash
# Resolve Debezium's PostgreSQL connector and Debezium's embedded engine (the change
# events of the change-data-capture tests) with Maven into the cache: jars in
# $LAKESINK_CACHE/debezium/lib, Maven's local repository in $LAKESINK_CACHE/debezium/m2 — a folder
# of its own, not the $LAKESINK_CACHE/maven that setup-kafka.sh and setup-iceberg-*.sh share:
# Maven 3.8 does not lock its local repository, so this may run in the background beside them.
# $LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: when the jars
# of the current jvm/debezium/pom.xml are there already it returns at once, without Maven.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-debezium "Debezium"

setup_jars jvm/debezium/pom.xml "$CACHE/debezium/lib" "$CACHE/debezium/m2" runtime
require_jar "$CACHE/debezium/lib" "debezium-connector-postgres-*.jar" "Debezium connector jar"
require_jar "$CACHE/debezium/lib" "debezium-embedded-*.jar" "Debezium embedded engine jar"
