#!/usr/bin/env bash
# Install, once and cached, the object-store emulators the GCS and Azure tests start on loopback:
#   $LAKESINK_CACHE/azurite          Azurite (Microsoft's Azure Storage emulator), `npm ci` of
#                                    scripts/azurite/package-lock.json (3.35.0: the last
#                                    release that runs on Node.js 20, these machines' Node)
#   $LAKESINK_CACHE/fake-gcs-server  fake-gcs-server (a GCS emulator), built from its Go module
#                                    at the version pinned below with the machine's Go
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# what each part was built from (the lock file's hash, the module version); a second run returns
# without building anything.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-emulators "the storage emulators"

FAKE_GCS_MODULE=github.com/fsouza/fake-gcs-server
FAKE_GCS_VERSION=v1.55.1

azurite="$CACHE/azurite"
if ! stamp_current "$azurite" scripts/azurite/package-lock.json; then
  command -v npm >/dev/null 2>&1 || { echo "setup-emulators: Azurite needs Node.js and npm (apt-get install nodejs npm)" >&2; exit 1; }
  echo "setup-emulators: installing Azurite into $azurite" >&2
  rm -rf "$azurite"
  mkdir -p "$azurite"
  cp scripts/azurite/package.json scripts/azurite/package-lock.json "$azurite/"
  (cd "$azurite" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  [ -f "$azurite/node_modules/azurite/dist/src/blob/main.js" ] || {
    echo "setup-emulators: npm left no Azurite blob service in $azurite" >&2
    exit 1
  }
  echo "$STAMP_WANT" > "$azurite/.lakesink-stamp"
fi

gcs="$CACHE/fake-gcs-server"
want="$FAKE_GCS_MODULE@$FAKE_GCS_VERSION"
if [ "$(cat "$gcs/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  command -v go >/dev/null 2>&1 || { echo "setup-emulators: fake-gcs-server needs Go (apt-get install golang-go)" >&2; exit 1; }
  echo "setup-emulators: building $want into $gcs" >&2
  rm -rf "$gcs"
  mkdir -p "$gcs/bin"
  # modules and build cache of their own in the cache: nothing of the user's Go set-up is touched
  GOBIN="$gcs/bin" GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" \
    GOFLAGS="-buildvcs=false -modcacherw" CGO_ENABLED=0 go install "$want"
  [ -x "$gcs/bin/fake-gcs-server" ] || { echo "setup-emulators: go left no fake-gcs-server in $gcs/bin" >&2; exit 1; }
  # only the binary is kept: the modules and build cache (over 1 GB) serve this one build
  rm -rf "$CACHE/go"
  echo "$want" > "$gcs/.lakesink-stamp"
fi
