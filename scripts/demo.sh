#!/usr/bin/env bash
# The README's first command: set up, then run the demo on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
case " $* " in  # the Iceberg demo needs the iceberg extra (pyiceberg)
  *" --format iceberg "* | *" --format=iceberg "*) export EXTRAS="${EXTRAS:+${EXTRAS},}iceberg" ;;
esac
bash scripts/setup-venv.sh
exec .venv/bin/lakesink demo "$@"
