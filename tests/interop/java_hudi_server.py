"""A Java Hudi read server, run by tests/interop/java_hudi.py in the interop environment
(scripts/setup-interop.sh: pyspark 3.5 and the Hudi Spark bundle) — never in lakesink's own.

One Spark session for the whole process. Requests come one per line on stdin as JSON:

    {"ops": [{"op": "read", "path": P, "options": {...}, "out": DIR},
             {"op": "sql", "statements": [SQL, ...], "out": DIR},
             {"op": "write", "source": PARQUET, "path": P, "options": {...}, "mode": "append"},
             {"op": "s3a", "bucket": B, "endpoint": URL, "region": R, "access_key": K,
              "secret_key": S}]}

A read writes the rows Java Hudi returns as Parquet under DIR; a write loads Parquet and writes
it to a Hudi table with Java Hudi; s3a points `s3a://B/...` paths at an S3-compatible endpoint
(path-style, http when the URL says so) with the given credentials, which are never echoed.
The reply is one JSON line on the protocol descriptor:
{"results": [{"ok": true} | {"ok": false, "error": "..."}]}. Everything else Spark or the JVM
prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any


def _protocol_stream() -> Any:
    # replies go to a private copy of stdout; fd 1 then points at stderr so nothing the JVM or
    # py4j prints can interleave with a reply
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


HOODIE_CATALOG = "org.apache.spark.sql.hudi.catalog.HoodieCatalog"


def _session(jars: str, warehouse: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("lakesink-java-hudi-interop")
        .config("spark.jars", jars)
        .config("spark.driver.memory", os.environ.get("JAVA_HUDI_DRIVER_MEMORY", "1g"))
        .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
        .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.hudi.catalog.HoodieCatalog"
        )
        .config("spark.kryo.registrator", "org.apache.spark.HoodieSparkKryoRegistrar")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .getOrCreate()
    )


def _pending_clustering(spark: Any, path: str) -> dict[str, list[list[str]]]:
    """Java Hudi's own view of the table's pending clustering plans: instant time ->
    [partition path, file id] of every file group it rewrites."""
    jvm = spark._jvm
    conf = jvm.org.apache.hudi.storage.hadoop.HadoopStorageConfiguration(
        spark._jsc.hadoopConfiguration()
    )
    meta = (
        jvm.org.apache.hudi.common.table.HoodieTableMetaClient.builder()
        .setConf(conf)
        .setBasePath(path)
        .build()
    )
    plans = jvm.org.apache.hudi.common.util.ClusteringUtils.getAllPendingClusteringPlans(meta)
    out: dict[str, list[list[str]]] = {}
    it = plans.iterator()
    while it.hasNext():
        pair = it.next()
        groups = out.setdefault(str(pair.getLeft().requestedTime()), [])
        for group in pair.getRight().getInputGroups():
            for s in group.getSlices():
                groups.append([str(s.getPartitionPath()), str(s.getFileId())])
    return out


def _configure_s3a(spark: Any, op: dict[str, Any]) -> None:
    """Per-bucket s3a settings (fs.s3a.bucket.B.*), so buckets on different endpoints coexist
    in one session; Hadoop caches one filesystem per bucket."""
    conf = spark._jsc.hadoopConfiguration()
    endpoint = str(op["endpoint"])
    prefix = f"fs.s3a.bucket.{op['bucket']}."
    settings = {
        "endpoint": endpoint,
        "endpoint.region": str(op.get("region") or "us-east-1"),
        "path.style.access": "true",
        "connection.ssl.enabled": str(endpoint.startswith("https://")).lower(),
        "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "access.key": str(op["access_key"]),
        "secret.key": str(op["secret_key"]),
        "attempts.maximum": "3",
        "retry.limit": "3",
        "connection.establish.timeout": "5000",
        "connection.timeout": "20000",
    }
    for key, value in settings.items():
        conf.set(prefix + key, value)


def _run(spark: Any, op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "s3a":
        _configure_s3a(spark, op)
        return {"ok": True}
    if kind == "read":
        df = spark.read.format("hudi").options(**op.get("options", {})).load(op["path"])
        df.coalesce(1).write.mode("overwrite").parquet(op["out"])
        return {"ok": True}
    if kind == "sql":
        df = None
        for statement in op["statements"]:
            df = spark.sql(statement)
        if op.get("out") and df is not None:
            df.coalesce(1).write.mode("overwrite").parquet(op["out"])
        return {"ok": True}
    if kind == "time":
        # materialise every row (Spark's noop sink) `repeat` times; seconds of each run
        seconds = []
        for _ in range(int(op.get("repeat", 1))):
            start = time.perf_counter()
            df = spark.read.format("hudi").options(**op.get("options", {})).load(op["path"])
            df.write.format("noop").mode("overwrite").save()
            seconds.append(time.perf_counter() - start)
        return {"ok": True, "seconds": seconds, "rows": df.count()}
    if kind == "pending_clustering":
        return {"ok": True, "plans": _pending_clustering(spark, op["path"])}
    if kind == "write":
        df = spark.read.parquet(op["source"])
        df.write.format("hudi").options(**op.get("options", {})).mode(
            op.get("mode", "append")
        ).save(op["path"])
        return {"ok": True}
    valid = "read, sql, time, pending_clustering, write, s3a"
    return {"ok": False, "error": f"unknown op {kind!r} (valid: {valid})"}


def _answer(spark: Any, op: dict[str, Any]) -> dict[str, Any]:
    try:
        return _run(spark, op)
    except Exception as e:  # every failure goes back to the test that asked
        msg = f"{type(e).__name__}: {e}"
        return {"ok": False, "error": msg, "trace": traceback.format_exc()[-4000:]}


def main() -> int:
    out = _protocol_stream()
    jars, warehouse = sys.argv[1], sys.argv[2]
    spark = _session(jars, warehouse)
    spark.sparkContext.setLogLevel("ERROR")
    java = spark._jvm.java.lang.System.getProperty("java.version")
    out.write(json.dumps({"ready": True, "spark": spark.version, "java": java}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        results = [_answer(spark, op) for op in request["ops"]]
        out.write(json.dumps({"results": results}) + "\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
