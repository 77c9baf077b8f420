#!/usr/bin/env bash
# The README's first command: set up, then run the demo on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/lakesink demo "$@"
