"""The Spark + Iceberg peer of bench_iceberg_upsert.py, run in the peers' Python (Spark 4.1,
scripts/setup-peers.sh) with Iceberg's Spark runtime 1.11 (scripts/setup-iceberg-reader.sh):
Structured Streaming with Spark's Kafka source, `foreachBatch` folding the batch by key (the
highest `ordering` value) and `MERGE INTO` an Iceberg table of a Hadoop catalog in
`warehouse` (`bench.upserts`), a row replaced only by a higher `ordering` value. Imports nothing
from lakesink.

    python iceberg_peer_job.py CONFIG_JSON      # prints BENCH-BATCH lines, then BENCH-RESULT
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from peer_job import SESSION_CONF, _end_reached, _finished_at, _progress_dicts

TABLE = "bench.bench.upserts"  # catalog bench, namespace bench, table upserts


def _session(cfg: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    b = SparkSession.builder.master(cfg["master"]).appName("peer-iceberg-merge")
    conf = dict(SESSION_CONF)
    conf["spark.jars"] = ",".join(cfg["jars"])
    conf["spark.sql.extensions"] = (
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    )
    conf["spark.sql.catalog.bench"] = "org.apache.iceberg.spark.SparkCatalog"
    conf["spark.sql.catalog.bench.type"] = "hadoop"
    conf["spark.sql.catalog.bench.warehouse"] = cfg["warehouse"]
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def merge_batch(key: str, ordering: str) -> Any:
    """foreachBatch function: the batch folded by key, then MERGE INTO the table (the first batch
    creates it: identifier field `key`, Iceberg's default copy-on-write)."""
    from pyspark.sql import functions as F

    def merge(df: Any, batch_id: int) -> None:
        cols = [c for c in df.columns if c != key]
        latest = (
            df.groupBy(key)
            .agg(F.max_by(F.struct(*cols), F.col(ordering)).alias("r"))
            .select(key, "r.*")
        )
        spark = df.sparkSession
        if not spark.catalog.tableExists(TABLE):
            latest.writeTo(TABLE).using("iceberg").tableProperty("format-version", "2").create()
            return
        # MERGE scans its source more than once (the files to rewrite, then the rows): cached,
        # the batch is read from Kafka and decoded once, as a tuned job would do
        latest.persist().createOrReplaceTempView("batch_rows")
        spark.sql(
            f"MERGE INTO {TABLE} t USING batch_rows s ON t.{key} = s.{key} "
            f"WHEN MATCHED AND s.{ordering} > t.{ordering} THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        latest.unpersist()

    return merge


def _records_read(progress: dict[str, Any], topic: str) -> int:
    """The batch's records by its Kafka offsets: numInputRows counts every scan of the batch's
    DataFrame, and the fold plus MERGE INTO read it more than once."""
    n = 0
    for s in progress.get("sources", []):
        start, end = s.get("startOffset"), s.get("endOffset")
        start = json.loads(start) if isinstance(start, str) else start
        end = json.loads(end) if isinstance(end, str) else end
        if not isinstance(end, dict) or topic not in end:
            continue
        first = start.get(topic, {}) if isinstance(start, dict) else {}
        n += sum(int(o) - int(first.get(p, 0)) for p, o in end[topic].items())
    return n


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    ends = {str(p): int(n) for p, n in cfg["ends"].items()}
    t_session = time.time()
    spark = _session(cfg)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bench.bench")
    t_start = time.time()
    src = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cfg["bootstrap"])
        .option("subscribe", cfg["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(cfg["per_batch"]))
        .load()
    )
    df = src.select(
        F.from_json(F.col("value").cast("string"), cfg["value_ddl"]).alias("v"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    ).select("v.*", "kafka_partition", "kafka_offset")
    query = (
        df.writeStream.option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime="0 seconds")
        .foreachBatch(merge_batch(cfg["record_key"], cfg["ordering"]))
        .start()
    )
    seen: set[int] = set()
    batches: list[tuple[float, int]] = []
    done = False
    try:
        while not done:
            if query.exception() is not None:
                raise RuntimeError(f"iceberg merge query failed: {query.exception()}")
            for p in _progress_dicts(query):
                if p["batchId"] in seen:
                    continue
                seen.add(p["batchId"])
                n = _records_read(p, cfg["topic"])
                if n:
                    batches.append((_finished_at(p), n))
                    print(f"BENCH-BATCH {p['batchId']} {n}", flush=True)
                if _end_reached(p, cfg["topic"], ends):
                    done = True
            if not done:
                query.awaitTermination(0.1)
    finally:
        query.stop()
    return {
        "mode": "spark-merge",
        "records": sum(n for _, n in batches),
        "session_s": t_start - t_session,
        "t_start": t_start,
        "t_end": max([b[0] for b in batches], default=time.time()),
        "batches": sorted(batches),
        "spark": spark.version,
    }


if __name__ == "__main__":
    print("BENCH-RESULT " + json.dumps(run(json.loads(sys.argv[1]))), flush=True)
