# Shared by the scripts/setup-*.sh that build cached environments outside lakesink's own venv.
# Source it after `set -euo pipefail`, with the script's name as $1:
#   . "$(dirname "$0")/lib/setup-common.sh" setup-interop "the interop environment"
# It changes into the repository, sets CACHE ($LAKESINK_CACHE, default .cache/) and PYTHON
# (python3.11, else python3), checks Java 17 and installs Maven when it is missing. Each part it
# builds carries a stamp file with the sha256 of what it was built from; a matching stamp skips it.
SETUP_NAME="$1"
SETUP_NEEDS="${2:-$1}"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CACHE="${LAKESINK_CACHE:-$PWD/.cache}"
mkdir -p "$CACHE"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v java >/dev/null 2>&1 || {
  echo "$SETUP_NEEDS needs Java 17: apt-get install openjdk-17-jre-headless" >&2
  exit 1
}
if ! command -v mvn >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null
fi

# stamp_current FOLDER SOURCE: true when FOLDER was built from this SOURCE (sets STAMP_WANT).
stamp_current() {
  STAMP_WANT="$(sha256sum "$2" | cut -d' ' -f1)"
  [ "$(cat "$1/.lakesink-stamp" 2>/dev/null || true)" = "$STAMP_WANT" ]
}

# setup_venv FOLDER REQUIREMENTS: a venv of $PYTHON with the pinned requirements, once.
setup_venv() {
  local venv="$1" requirements="$2"
  stamp_current "$venv" "$requirements" && return 0
  echo "$SETUP_NAME: creating $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$STAMP_WANT" > "$venv/.lakesink-stamp"
}

# setup_jars POM FOLDER [MAVEN_REPO [SCOPE]]: the POM's dependencies copied into FOLDER, once
# (MAVEN_REPO defaults to $CACHE/maven: Maven 3.8 does not lock it, so scripts that may run at
# the same time use repositories of their own; SCOPE, e.g. runtime, limits what is copied).
setup_jars() {
  local pom="$1" out="$2" repo="${3:-$CACHE/maven}" scope="${4:-}"
  stamp_current "$out" "$pom" && return 0
  echo "$SETUP_NAME: resolving $pom into $out" >&2
  rm -rf "$out"
  mkdir -p "$repo"
  mvn -q -B -Dstyle.color=never -f "$pom" -Dmaven.repo.local="$repo" \
    dependency:copy-dependencies ${scope:+-DincludeScope="$scope"} -DoutputDirectory="$out"
  ls "$out"/*.jar >/dev/null
  echo "$STAMP_WANT" > "$out/.lakesink-stamp"
}

# require_jar FOLDER GLOB WHAT: fail, naming WHAT, unless FOLDER holds a jar matching GLOB.
require_jar() {
  compgen -G "$1/$2" >/dev/null || { echo "$SETUP_NAME: Maven left no $3 in $1" >&2; exit 1; }
}
