"""What the interop servers (tests/interop/java_*_server.py) share; imported from their own
Python (the server's folder is first on sys.path), never from lakesink's.

The protocol: one Spark session for the whole process; requests come one per line on stdin as
JSON, {"ops": [{"op": KIND, ...}, ...]}; the first line out is a hello,
{"ready": true, "spark": VERSION, "java": VERSION}, then one JSON line a request,
{"results": [{"ok": true, ...} | {"ok": false, "error": "...", "trace": "..."}]}, on a private
copy of stdout. Everything else Spark or the JVM prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

Handler = Callable[[Any, dict[str, Any]], dict[str, Any]]
# statements of concurrent ops (see `serve`) take turns: the session's catalog is shared
SQL_LOCK = threading.Lock()


def protocol_stream() -> Any:
    """Replies go to a private copy of stdout; fd 1 then points at stderr so nothing the JVM or
    py4j prints can interleave with a reply."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


def session_builder(app: str, jars: str, memory_variable: str) -> Any:
    """local[2] with `jars`, the driver memory from $`memory_variable` (default 1g), two
    partitions, no UI, UTC and microsecond Parquet timestamps; the caller adds its format's
    settings and calls getOrCreate()."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.jars", jars)
        .config("spark.driver.memory", os.environ.get(memory_variable, "1g"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
    )


def run_sql(spark: Any, statements: list[str]) -> Any:
    """Each statement in order, under SQL_LOCK (the session's catalog is shared by the threads
    of `serve`); the last one's DataFrame (None when there are none)."""
    df = None
    with SQL_LOCK:
        for statement in statements:
            df = spark.sql(statement)
    return df


def answer(handle: Handler, spark: Any, op: dict[str, Any]) -> dict[str, Any]:
    try:
        return handle(spark, op)
    except Exception as e:  # every failure goes back to the test that asked
        msg = f"{type(e).__name__}: {e}"[:4000]
        return {"ok": False, "error": msg, "trace": traceback.format_exc()[-4000:]}


def serve(
    make_session: Callable[[], Any], handle: Handler, concurrent: Collection[str] = ()
) -> int:
    """Start Spark with `make_session` (after stdout is kept for replies: nothing the JVM prints
    at start-up can reach it), then answer requests from stdin with `handle` until stdin
    closes; then stop Spark. Ops whose kind is in `concurrent` (reads: they change nothing)
    run as Spark jobs side by side, $LAKESINK_INTEROP_THREADS at a time (default 3): most of a
    small table's read is the driver planning it on one core, so a batch of reads takes about
    half the time; every other op runs alone, after the ops before it and before the ones after
    it. SQL statements of concurrent ops run under one lock (`CREATE TABLE IF NOT EXISTS` of one
    name from two threads would race), the jobs they start do not."""
    out = protocol_stream()
    spark = make_session()
    java = spark._jvm.java.lang.System.getProperty("java.version")
    out.write(json.dumps({"ready": True, "spark": spark.version, "java": java}) + "\n")
    threads = int(os.environ.get("LAKESINK_INTEROP_THREADS", "3"))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for line in sys.stdin:
            if not line.strip():
                continue
            ops = json.loads(line)["ops"]
            results: list[dict[str, Any]] = []
            group: list[dict[str, Any]] = []  # consecutive concurrent ops, not yet run
            for op in [*ops, None]:
                if op is not None and op.get("op") in concurrent:
                    group.append(op)
                    continue
                results += pool.map(lambda o: answer(handle, spark, o), group)
                group = []
                if op is not None:
                    results.append(answer(handle, spark, op))
            out.write(json.dumps({"results": results}) + "\n")
    spark.stop()
    return 0
