#!/usr/bin/env bash
# The README's second command: install what the tests need, then lint, type-check and run the
# whole suite (unit, property and integration: real broker, real Spark, real PostgreSQL), build
# the docs site strictly, and prove the packaging (the wheel in a clean venv, the oldest pins).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup-venv.sh
bash scripts/install-postgres.sh
bash scripts/setup-kafka.sh
bash scripts/setup-interop.sh   # Java Hudi (pyspark 3.5, Hudi Spark bundle) for the interop tests
bash scripts/setup-iceberg-reader.sh   # Java Iceberg (pyspark 4.1, Iceberg Spark runtime) for its reader test
bash scripts/setup-iceberg-rest.sh     # Apache Iceberg's REST catalog server for the REST catalog tests
. .venv/bin/activate
echo "== ruff"; ruff check lakesink tests benchmarks; ruff format --check lakesink tests benchmarks
echo "== mypy"; mypy lakesink
echo "== docs site"; bash scripts/build-docs.sh
if [ $# -eq 0 ]; then   # the whole run (CI); with pytest arguments only the tests asked for
  echo "== wheel"; bash scripts/check-wheel.sh       # build, install in a clean venv, run the demo
  echo "== oldest pins"; bash scripts/check-oldest.sh # lower bounds: unit tests + a real ingestion
fi
echo "== pytest"; python -m pytest -q -p no:cacheprovider --durations=25 "$@"
