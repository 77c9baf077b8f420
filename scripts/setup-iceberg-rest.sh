#!/usr/bin/env bash
# Resolve, once and cached, Apache Iceberg's REST catalog server that the REST catalog tests run
# (org.apache.iceberg.rest.RESTCatalogServer from the iceberg-open-api test fixtures and its
# runtime classpath, jvm/iceberg-rest/pom.xml): jars in $LAKESINK_CACHE/iceberg-rest/lib, Maven's
# local repository in $LAKESINK_CACHE/maven. LAKESINK_CACHE defaults to .cache/ in the repository
# (gitignored). Idempotent: when the jars of the current pom are there it returns without Maven.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-iceberg-rest "the Iceberg REST catalog server"

setup_jars jvm/iceberg-rest/pom.xml "$CACHE/iceberg-rest/lib"
compgen -G "$CACHE/iceberg-rest/lib/iceberg-open-api-*-test-fixtures.jar" >/dev/null || {
  echo "setup-iceberg-rest: Maven left no iceberg-open-api test-fixtures jar in $CACHE/iceberg-rest/lib" >&2
  exit 1
}
