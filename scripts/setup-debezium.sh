#!/usr/bin/env bash
# Resolve Debezium's PostgreSQL connector and Apache Kafka Connect's standalone worker (the change
# events of the change-data-capture tests) with Maven into the cache: jars in
# $LAKESINK_CACHE/debezium/lib, Maven's local repository in $LAKESINK_CACHE/debezium/m2 — a folder
# of its own, not the $LAKESINK_CACHE/maven that setup-kafka.sh and setup-iceberg-*.sh share:
# Maven 3.8 does not lock its local repository, so this may run in the background beside them.
# $LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: when the jars
# of the current jvm/debezium/pom.xml are there already it returns at once, without Maven.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
POM="jvm/debezium/pom.xml"
LIB="$CACHE/debezium/lib"
REPO="$CACHE/debezium/m2"
STAMP="$CACHE/debezium/pom.sha256"
want="$(sha256sum "$POM" | cut -d' ' -f1)"
have_jars() {
  compgen -G "$LIB/debezium-connector-postgres-*.jar" >/dev/null \
    && compgen -G "$LIB/connect-runtime-*.jar" >/dev/null
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && have_jars; then
  exit 0
fi
command -v java >/dev/null 2>&1 || { echo "Debezium needs Java 17: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
if ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Maven from Debian"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  else
    echo "resolving Debezium needs Maven: apt-get install maven" >&2; exit 1
  fi
fi
echo "== resolving Debezium and Kafka Connect with Maven into $LIB"
rm -rf "$LIB" "$STAMP"
mkdir -p "$REPO"
mvn -q -B -Dstyle.color=never -f "$POM" -Dmaven.repo.local="$REPO" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB"
have_jars || { echo "Maven left no Debezium connector or Connect runtime jar in $LIB" >&2; exit 1; }
echo "$want" > "$STAMP"
