#!/usr/bin/env bash
# Resolve, once and cached, Apicurio Registry (jvm/registry/pom.xml), the schema registry server
# the registry tests start on loopback: Maven fetches its `all` tar.gz into a local repository of
# its own, $LAKESINK_CACHE/registry/m2 (Maven 3.8 does not lock a repository against a second
# Maven), and it is unpacked into $LAKESINK_CACHE/registry/app (a runner jar and lib/).
# 2.6.13.Final runs on Java 17, the Java the suite already needs. $LAKESINK_CACHE defaults to
# .cache/ in the repository (gitignored). Idempotent: when the app of the current pom is there it
# returns at once, without Maven.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-registry "Apicurio Registry"

app="$CACHE/registry/app"
stamp_current "$app" jvm/registry/pom.xml && exit 0
echo "setup-registry: resolving jvm/registry/pom.xml into $app" >&2
download="$CACHE/registry/download"
rm -rf "$app" "$download"
mkdir -p "$CACHE/registry/m2" "$app"
mvn -q -B -Dstyle.color=never -f jvm/registry/pom.xml -Dmaven.repo.local="$CACHE/registry/m2" \
  dependency:copy-dependencies -DoutputDirectory="$download"
archive="$(compgen -G "$download/apicurio-registry-app-*-all.tar.gz" | head -n1 || true)"
[ -n "$archive" ] || { echo "setup-registry: Maven left no Apicurio Registry tar.gz in $download" >&2; exit 1; }
tar -xzf "$archive" -C "$app"
rm -rf "$download"
compgen -G "$app/apicurio-registry-app-*-runner.jar" >/dev/null || {
  echo "setup-registry: $archive holds no apicurio-registry-app runner jar" >&2
  exit 1
}
echo "$STAMP_WANT" > "$app/.lakesink-stamp"
