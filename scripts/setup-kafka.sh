#!/usr/bin/env bash
# Resolve Apache Kafka (the broker of the tests, benchmarks and soak) with Maven into the cache:
# jars in $LAKESINK_CACHE/kafka/lib, Maven's local repository in $LAKESINK_CACHE/maven.
# $LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: when the jars
# of the current jvm/kafka/pom.xml are there already it returns at once, without Maven.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
POM="jvm/kafka/pom.xml"
LIB="$CACHE/kafka/lib"
STAMP="$CACHE/kafka/pom.sha256"
want="$(sha256sum "$POM" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null; then
  exit 0
fi
command -v java >/dev/null 2>&1 || { echo "Apache Kafka needs Java 17: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Maven from Debian"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  else
    echo "resolving Apache Kafka needs Maven: apt-get install maven" >&2; exit 1
  fi
fi
echo "== resolving Apache Kafka with Maven into $LIB"
rm -rf "$LIB" "$STAMP"
mkdir -p "$CACHE/maven"
mvn -q -B -Dstyle.color=never -f "$POM" -Dmaven.repo.local="$CACHE/maven" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB"
compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null || { echo "Maven left no kafka_2.13 jar in $LIB" >&2; exit 1; }
echo "$want" > "$STAMP"
