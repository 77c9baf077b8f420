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

import sys
import time
from typing import Any

from jvm_server import run_sql, serve, session_builder

HOODIE_CATALOG = "org.apache.spark.sql.hudi.catalog.HoodieCatalog"


def _session(jars: str, warehouse: str) -> Any:
    return (
        session_builder("lakesink-java-hudi-interop", jars, "JAVA_HUDI_DRIVER_MEMORY")
        .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
        .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", HOODIE_CATALOG)
        .config("spark.kryo.registrator", "org.apache.spark.HoodieSparkKryoRegistrar")
        .config("spark.sql.warehouse.dir", warehouse)
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
        df = run_sql(spark, op["statements"])
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


def _quiet_session() -> Any:
    spark = _session(sys.argv[1], sys.argv[2])
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    return serve(_quiet_session, _run, concurrent={"read", "sql"})


if __name__ == "__main__":
    sys.exit(main())
