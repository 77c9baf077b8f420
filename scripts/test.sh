#!/usr/bin/env bash
# The README's second command: install what the tests need, then lint, type-check and run the
# whole suite (unit, property and integration: real broker, real Spark, real PostgreSQL).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup-venv.sh
bash scripts/install-postgres.sh
bash scripts/setup-kafka.sh
bash scripts/setup-interop.sh   # Java Hudi (pyspark 3.5, Hudi Spark bundle) for the interop tests
. .venv/bin/activate
echo "== ruff"; ruff check lakesink tests benchmarks && ruff format --check lakesink tests benchmarks
echo "== mypy"; mypy lakesink
echo "== pytest"; python -m pytest -q -p no:cacheprovider "$@"
