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
import traceback
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, dict[str, Any]], dict[str, Any]]


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
    """Each statement in order; the last one's DataFrame (None when there are none)."""
    df = None
    for statement in statements:
        df = spark.sql(statement)
    return df


def answer(handle: Handler, spark: Any, op: dict[str, Any]) -> dict[str, Any]:
    try:
        return handle(spark, op)
    except Exception as e:  # every failure goes back to the test that asked
        msg = f"{type(e).__name__}: {e}"[:4000]
        return {"ok": False, "error": msg, "trace": traceback.format_exc()[-4000:]}


def serve(make_session: Callable[[], Any], handle: Handler) -> int:
    """Start Spark with `make_session` (after stdout is kept for replies: nothing the JVM prints
    at start-up can reach it), then answer requests from stdin with `handle` until stdin
    closes; then stop Spark."""
    out = protocol_stream()
    spark = make_session()
    java = spark._jvm.java.lang.System.getProperty("java.version")
    out.write(json.dumps({"ready": True, "spark": spark.version, "java": java}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        results = [answer(handle, spark, op) for op in json.loads(line)["ops"]]
        out.write(json.dumps({"results": results}) + "\n")
    spark.stop()
    return 0
