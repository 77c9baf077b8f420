"""One peer of the throughput benchmark, run in the peer's own Python (scripts/setup-peers.sh):
Spark Structured Streaming with Spark's Kafka source (spark-sql-kafka-0-10) into Delta Lake,
plain Parquet (Spark's file sink) or Hudi (Hudi's streaming sink, copy-on-write, insert or
bulk_insert); for the upsert benchmark (upsert.py), Hudi's sink with upsert and Delta's MERGE in
foreachBatch, keyed by `record_key` and ordered by `ordering` of the config. Imports nothing
from lakesink: the peers' Pythons do not have it.

    python peer_job.py run MODE CONFIG_JSON       # prints BENCH-BATCH lines, then BENCH-RESULT
    python peer_job.py audit FORMAT PATH ENDS_JSON  # counts (partition, offset) pairs in a table
    python peer_job.py export delta PATH COLUMNS OUT  # a Delta table's COLUMNS (a,b) as Parquet

The query runs until its Kafka offsets reach the end offsets given in the config (the same stop
condition for a first run and a restart after SIGKILL: it resumes from its checkpoint).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MODES = ("delta", "parquet", "hudi-insert", "hudi-bulk_insert", "hudi-upsert", "delta-merge")

# the same Spark settings lakesink's session starts with, where they apply to a JVM-only query
SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.parquet.compression.codec": "zstd",
}


def _session(cfg: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    b = SparkSession.builder.master(cfg["master"]).appName(f"peer-{cfg['mode']}")
    conf = dict(SESSION_CONF)
    conf["spark.jars"] = ",".join(cfg["jars"])
    if cfg["mode"].startswith("delta"):
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if cfg["mode"].startswith("hudi"):
        conf["spark.serializer"] = "org.apache.spark.serializer.KryoSerializer"
        conf["spark.sql.extensions"] = "org.apache.spark.sql.hudi.HoodieSparkSessionExtension"
        conf["spark.kryo.registrator"] = "org.apache.spark.HoodieSparkKryoRegistrar"
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def hudi_options(
    operation: str, record_key: str | None = None, ordering: str | None = None
) -> dict[str, str]:
    """Hudi's streaming sink: copy-on-write, non-partitioned, keyed by the Kafka coordinates
    like lakesink's tables (or by `record_key`, the higher `ordering` value winning: upserts);
    everything else at Hudi 1.2.0's defaults (metadata table on, its default index)."""
    options = {
        "hoodie.table.name": "peer_bench",
        "hoodie.datasource.write.table.type": "COPY_ON_WRITE",
        "hoodie.datasource.write.operation": operation,
        "hoodie.datasource.write.recordkey.field": (
            record_key or "kafka_topic,kafka_partition,kafka_offset"
        ),
        "hoodie.datasource.write.partitionpath.field": "",
        "hoodie.datasource.write.keygenerator.class": (
            "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
        ),
        "hoodie.parquet.compression.codec": "zstd",
    }
    if ordering:
        options["hoodie.datasource.write.precombine.field"] = ordering
        options["hoodie.record.merge.mode"] = "EVENT_TIME_ORDERING"
    return options


def delta_merge_batch(path: str, key: str, ordering: str) -> Any:
    """foreachBatch function: the batch folded by key (the highest `ordering` value of each key),
    then MERGEd into the Delta table at `path`, a row replaced only by a higher `ordering` value
    (a batch replayed after a crash changes nothing). The first batch creates the table."""
    from pyspark.sql import functions as F

    def merge(df: Any, batch_id: int) -> None:
        cols = [c for c in df.columns if not c.startswith("kafka_")] + ["kafka_partition"]
        cols += ["kafka_offset"]
        latest = (
            df.groupBy(key)
            .agg(F.max_by(F.struct(*[c for c in cols if c != key]), F.col(ordering)).alias("r"))
            .select(key, "r.*")
        )
        spark = df.sparkSession
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, path):
            latest.write.format("delta").mode("append").save(path)
            return
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(latest.alias("s"), f"t.{key} = s.{key}")
            .whenMatchedUpdateAll(condition=f"s.{ordering} > t.{ordering}")
            .whenNotMatchedInsertAll()
            .execute()
        )

    return merge


def _progress_dicts(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        out.append(json.loads(p.json) if hasattr(p, "json") else dict(p))
    return out


def _end_reached(progress: dict[str, Any], topic: str, ends: dict[str, int]) -> bool:
    for s in progress.get("sources", []):
        end = s.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if not isinstance(end, dict) or topic not in end:
            continue
        got = end[topic]
        return all(int(got.get(p, -1)) >= n for p, n in ends.items())
    return False


def _finished_at(progress: dict[str, Any]) -> float:
    start = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + progress["durationMs"].get("triggerExecution", 0) / 1000.0


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    mode = cfg["mode"]
    if mode not in MODES:
        raise SystemExit(f"unknown peer mode {mode!r}; valid: {', '.join(MODES)}")
    ends = {str(p): int(n) for p, n in cfg["ends"].items()}
    t_session = time.time()
    spark = _session(cfg)
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
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("kafka_key"),
    ).select(
        "v.*", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key"
    )
    out = cfg["path"]
    w = (
        df.writeStream.option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime="0 seconds")
        .outputMode("append")
    )
    if mode == "delta":
        query = w.format("delta").start(out)
    elif mode == "delta-merge":
        merge = delta_merge_batch(out, cfg["record_key"], cfg["ordering"])
        query = w.foreachBatch(merge).start()
    elif mode == "parquet":
        query = w.format("parquet").start(out)
    else:
        options = hudi_options(mode.split("-", 1)[1], cfg.get("record_key"), cfg.get("ordering"))
        query = w.format("hudi").options(**options).start(out)
    seen: set[int] = set()
    batches: list[tuple[float, int]] = []
    done = False
    try:
        while not done:
            if query.exception() is not None:
                raise RuntimeError(f"{mode} query failed: {query.exception()}")
            for p in _progress_dicts(query):
                if p["batchId"] in seen:
                    continue
                seen.add(p["batchId"])
                n = int(p.get("numInputRows", 0))
                if n:
                    batches.append((_finished_at(p), n))
                    print(f"BENCH-BATCH {p['batchId']} {n}", flush=True)
                if _end_reached(p, cfg["topic"], ends):
                    done = True
            if not done:
                query.awaitTermination(0.1)
    finally:
        query.stop()
    t_end = max([b[0] for b in batches], default=time.time())
    return {
        "mode": mode,
        "records": sum(n for _, n in batches),
        "session_s": t_start - t_session,
        "t_start": t_start,
        "t_end": t_end,
        "batches": sorted(batches),
        "spark": spark.version,
    }


def count_coordinates(
    partitions: Iterable[int], offsets: Iterable[int], ends: dict[int, int]
) -> dict[str, int]:
    """Rows, duplicates and missing records of a table against Kafka: every offset in
    [0, end) of every partition once."""
    seen: dict[tuple[int, int], int] = {}
    rows = 0
    for p, o in zip(partitions, offsets, strict=True):
        rows += 1
        seen[(p, o)] = seen.get((p, o), 0) + 1
    expected = sum(ends.values())
    present = sum(1 for (p, o) in seen if 0 <= o < ends.get(p, 0))
    return {
        "rows": rows,
        "expected": expected,
        "duplicates": rows - len(seen),
        "missing": expected - present,
        "unexpected": len(seen) - present,
    }


def _spark_metadata_files(path: Path) -> list[Path]:
    """The files Spark's file sink committed: its _spark_metadata log (compacted or not)."""
    log = path / "_spark_metadata"
    names: set[str] = set()
    entries = sorted(
        (f for f in log.iterdir() if f.name.split(".")[0].isdigit()),
        key=lambda f: int(f.name.split(".")[0]),
    )
    last_compact = max((i for i, f in enumerate(entries) if f.name.endswith(".compact")), default=0)
    for f in entries[last_compact:]:
        for line in f.read_text().splitlines()[1:]:
            if line.strip():
                names.add(json.loads(line)["path"])
    return [Path(n.removeprefix("file:")) for n in sorted(names)]


def audit(fmt: str, path: str, ends_json: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    ends = {int(p): int(n) for p, n in json.loads(ends_json).items()}
    cols = ["kafka_partition", "kafka_offset"]
    res: dict[str, Any] = {"format": fmt}
    if fmt == "delta":
        from deltalake import DeltaTable

        t = DeltaTable(path).to_pyarrow_table(columns=cols)
        res.update(
            count_coordinates(t["kafka_partition"].to_pylist(), t["kafka_offset"].to_pylist(), ends)
        )
        res["reader"] = "deltalake (delta-rs)"
    elif fmt == "parquet":
        root = Path(path)
        every = sorted(p for p in root.rglob("*.parquet") if "_spark_metadata" not in p.parts)
        committed = _spark_metadata_files(root)
        for name, files in (("all_files", every), ("spark_metadata", committed)):
            ps: list[int] = []
            os_: list[int] = []
            unreadable = 0
            for f in files:
                try:
                    t = pq.read_table(f, columns=cols)
                except (OSError, ValueError):  # a file the SIGKILL cut short: no footer
                    unreadable += 1
                    continue
                ps += t["kafka_partition"].to_pylist()
                os_ += t["kafka_offset"].to_pylist()
            res[name] = count_coordinates(ps, os_, ends)
            res[name]["files"] = len(files)
            res[name]["unreadable_files"] = unreadable
        # the figure for the table: what a reader that lists the folder (pyarrow, not Spark) sees
        res.update(res["all_files"])
        res["reader"] = "pyarrow (all files); spark_metadata: the files Spark's sink log lists"
    else:
        raise SystemExit(f"unknown audit format {fmt!r}; valid: delta, parquet")
    return res


def export(fmt: str, path: str, columns: str, out: str) -> dict[str, Any]:
    """A table's `columns` written to the Parquet file `out` (the upsert benchmark's fold audit
    compares them in lakesink's Python, which has no Delta reader)."""
    import pyarrow.parquet as pq

    if fmt != "delta":
        raise SystemExit(f"unknown export format {fmt!r}; valid: delta")
    from deltalake import DeltaTable

    t = DeltaTable(path).to_pyarrow_table(columns=columns.split(","))
    pq.write_table(t, out)
    return {"format": fmt, "rows": t.num_rows, "reader": "deltalake (delta-rs)"}


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"]:
        out = run(json.loads(argv[2]) | {"mode": argv[1]})
    elif argv[:1] == ["audit"]:
        out = audit(argv[1], argv[2], argv[3])
    elif argv[:1] == ["export"]:
        out = export(argv[1], argv[2], argv[3], argv[4])
    else:
        raise SystemExit(__doc__)
    print("BENCH-RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
