"""The peers of the freshness benchmark (freshness.py), run in the peers' Pythons
(scripts/setup-peers.sh): Spark Structured Streaming with Spark's Kafka source appending a
topic's Kafka coordinates and append times to Delta Lake (Spark 4.1), Hudi 1.2.0's streaming
sink (Spark 3.5, copy-on-write insert) or Iceberg 1.11 (Spark 4.1, a Hadoop catalog), at a
given processing-time trigger, until stopped. Imports nothing from lakesink.

    python freshness_peer.py run CONFIG_JSON       # streams until SIGTERM
    python freshness_peer.py read-delta PATH POLL  # polls a Delta table with delta-rs

`read-delta` is the independent reader of the Delta peer (lakesink's Python has no Delta
reader): every `POLL` seconds it reads the table's current version and prints one line per
poll that saw new records, `SEEN <time> <json [[partition, offset, append time µs], ...]>`.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

from peer_job import SESSION_CONF, hudi_options

MODES = ("delta", "hudi", "iceberg")
ICEBERG_TABLE = "bench.bench.fresh"  # catalog bench, namespace bench, table fresh


def _session(cfg: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    conf = dict(SESSION_CONF) | {"spark.jars": ",".join(cfg["jars"])}
    if cfg["mode"] == "delta":
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    elif cfg["mode"] == "hudi":
        conf["spark.serializer"] = "org.apache.spark.serializer.KryoSerializer"
        conf["spark.sql.extensions"] = "org.apache.spark.sql.hudi.HoodieSparkSessionExtension"
        conf["spark.kryo.registrator"] = "org.apache.spark.HoodieSparkKryoRegistrar"
    else:
        conf["spark.sql.extensions"] = (
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
        )
        conf["spark.sql.catalog.bench"] = "org.apache.iceberg.spark.SparkCatalog"
        conf["spark.sql.catalog.bench.type"] = "hadoop"
        conf["spark.sql.catalog.bench.warehouse"] = cfg["path"]
    b = SparkSession.builder.master(cfg["master"]).appName(f"fresh-{cfg['mode']}")
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run(cfg: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    mode = cfg["mode"]
    if mode not in MODES:
        raise SystemExit(f"unknown peer mode {mode!r}; valid: {', '.join(MODES)}")
    spark = _session(cfg)
    rows = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cfg["bootstrap"])
        .option("subscribe", cfg["topic"])
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.col("topic").alias("kafka_topic"),
            F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
            F.col("timestamp").alias("kafka_timestamp"),
            F.col("value").alias("value"),
        )
    )
    w = (
        rows.writeStream.option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime=f"{cfg['trigger_s']} seconds")
        .outputMode("append")
    )
    if mode == "delta":
        query = w.format("delta").start(cfg["path"] + "/table")
    elif mode == "hudi":
        query = w.format("hudi").options(**hudi_options("insert")).start(cfg["path"] + "/table")
    else:
        spark.sql("CREATE NAMESPACE IF NOT EXISTS bench.bench")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {ICEBERG_TABLE} (kafka_topic string, kafka_partition "
            "int, kafka_offset bigint, kafka_timestamp timestamp, value binary) USING iceberg "
            "TBLPROPERTIES ('format-version'='2')"
        )
        query = w.format("iceberg").toTable(ICEBERG_TABLE)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print("FRESH-STARTED", flush=True)
    while not stopping and query.isActive:
        query.awaitTermination(0.2)
    if query.exception() is not None:
        raise SystemExit(f"{mode} query failed: {query.exception()}")
    query.stop()


def read_delta(path: str, poll_s: float) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    seen: set[tuple[int, int]] = set()
    table: DeltaTable | None = None
    version = -1
    while True:
        start = time.time()
        try:
            if table is None:
                table = DeltaTable(path)
            else:
                table.update_incremental()
        except Exception:  # not created yet
            table = None
        if table is not None and table.version() != version:
            version = table.version()
            data = table.to_pyarrow_table(
                columns=["kafka_partition", "kafka_offset", "kafka_timestamp"]
            )
            now = time.time()
            stamps = pc.cast(
                pc.cast(data["kafka_timestamp"], pa.timestamp("us", tz="UTC")), pa.int64()
            ).to_pylist()
            new = [
                [p, o, t]
                for p, o, t in zip(
                    data["kafka_partition"].to_pylist(),
                    data["kafka_offset"].to_pylist(),
                    stamps,
                    strict=True,
                )
                if (p, o) not in seen
            ]
            seen.update((p, o) for p, o, _ in new)
            if new:
                print(f"SEEN {now} {json.dumps(new)}", flush=True)
        time.sleep(max(0.0, poll_s - (time.time() - start)))


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"]:
        run(json.loads(argv[1]))
    elif argv[:1] == ["read-delta"]:
        read_delta(argv[1], float(argv[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
