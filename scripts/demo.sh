#!/usr/bin/env bash
# The README's first command: set up, then run the demo on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
iceberg=false
case " $* " in  # the Iceberg demo needs the iceberg extra (pyiceberg)
  *" --format iceberg "* | *" --format=iceberg "*) iceberg=true; export EXTRAS="${EXTRAS:+${EXTRAS},}iceberg" ;;
esac
bash scripts/setup-venv.sh
# its audit also reads the table with Spark and Iceberg's Java runtime, in a second environment
# (pyspark 4.1: released Iceberg supports Spark up to 4.1); built once into .cache/
if [ "$iceberg" = true ]; then bash scripts/setup-iceberg-reader.sh; fi
exec .venv/bin/lakesink demo "$@"
