#!/usr/bin/env bash
# Resolve Apache Kafka (the broker of the tests, benchmarks and soak) with Maven into the cache:
# jars in $LAKESINK_CACHE/kafka/lib, Maven's local repository in $LAKESINK_CACHE/maven.
# $LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: when the jars
# of the current jvm/kafka/pom.xml are there already it returns at once, without Maven.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-kafka "Apache Kafka"

setup_jars jvm/kafka/pom.xml "$CACHE/kafka/lib" "$CACHE/maven" runtime
require_jar "$CACHE/kafka/lib" "kafka_2.13-*.jar" "kafka_2.13 jar"
