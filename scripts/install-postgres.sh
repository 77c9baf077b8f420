#!/usr/bin/env bash
# Install the PostgreSQL server from Debian's packages, for the lock provider and the
# pending-commit store tests (tests/integration/pg_fixture.py starts its own server).
# Idempotent: does nothing when initdb and pg_ctl are already installed.
set -euo pipefail

have_server() {
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null \
        && compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}

if have_server; then
    echo "postgresql: already installed ($(ls -d /usr/lib/postgresql/*/bin | tr '\n' ' '))"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# The Debian package creates and starts a default cluster; the tests do not use it.
if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r ver name _; do
        $SUDO pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
    done
fi
have_server
echo "postgresql: installed ($(ls -d /usr/lib/postgresql/*/bin | tr '\n' ' '))"
