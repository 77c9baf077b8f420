"""The two Spark pipelines of the throughput benchmark, on the same lakesink-kafka source:

- `lakesink`: `Ingestion.run(once=True)`, exactly once into a Hudi table (instant, markers,
  reconcile, publish per micro-batch);
- `alo`: the same source and micro-batches, each written by `mapInArrow` with plain pyarrow
  Parquet files and no instant, marker or commit (at-least-once: a replayed batch duplicates).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

_STATUS = pa.schema([("rows", pa.int64())])


class PlainParquetWriter:
    """mapInArrow function: the task's rows into one zstd Parquet file; yields the row count."""

    def __init__(self, out_dir: str, batch_id: int) -> None:
        self.out_dir = out_dir
        self.batch_id = batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        path = Path(self.out_dir) / f"batch={self.batch_id}" / f"part-{uuid.uuid4().hex}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        writer: pq.ParquetWriter | None = None
        rows = 0
        for b in batches:
            if not b.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(str(path), b.schema, compression="zstd")
            writer.write_batch(b)
            rows += b.num_rows
        if writer is not None:
            writer.close()
        yield pa.RecordBatch.from_pylist([{"rows": rows}], _STATUS)


def run_spark(mode: str, cfg_values: dict[str, Any], expected: int) -> dict[str, Any]:
    from lakesink.config import build_config
    from lakesink.spark.session import get_spark, ingestion_spark_start

    cfg = build_config(cfg_values)
    # at-least-once sends its rows through a DataFrame (mapInArrow): its JVM starts as a
    # lakesink ingestion on the DataFrame path would (spark.driver.jit=auto: full)
    kind = cfg if mode == "lakesink" else cfg.with_overrides({"write.path": "dataframe"})
    t_session = time.time()
    spark = get_spark(cfg["spark.master"], cfg.spark_conf, start=ingestion_spark_start(kind))
    batches: list[tuple[float, int]] = []  # (time a batch finished, records)
    publish_s: list[float] = []  # each batch's publish on the driver, the table lock held
    t_start = time.time()
    if mode == "lakesink":
        from lakesink.spark.pipeline import Ingestion, Progress

        def on_progress(p: Progress) -> None:
            batches.append((time.time(), p.outcome.records))
            publish_s.append(p.outcome.publish_s)
            if p.outcome.records:  # the SIGKILL correctness run kills on these lines
                print(f"BENCH-BATCH {len(batches)} {p.outcome.records}", flush=True)

        result = Ingestion(cfg, spark, on_progress=on_progress).run(once=True)
        records = result.records
    else:
        records = _run_alo(spark, cfg, expected, batches)
    t_end = time.time()
    return {
        "mode": mode,
        "records": records,
        "session_s": t_start - t_session,
        "t_start": t_start,
        "t_end": t_end,
        "batches": batches,
        "publish_s": publish_s,
    }


def _run_alo(spark: Any, cfg: Any, expected: int, batches: list[tuple[float, int]]) -> int:
    import sys

    from pyspark import cloudpickle

    from lakesink.spark.source import CONFIG_OPTION, SOURCE_NAME, encode_config

    # the benchmarks folder is not importable in Spark's workers: ship the writer by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    out_dir = str(Path(cfg["table.path"]))
    total = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows = df.mapInArrow(PlainParquetWriter(out_dir, batch_id), "rows long").collect()
        n = sum(r["rows"] for r in rows)
        total[0] += n
        batches.append((time.time(), n))

    stream = spark.readStream.format(SOURCE_NAME).option(CONFIG_OPTION, encode_config(cfg)).load()
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(Path(out_dir) / "_checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while query.isActive and total[0] < expected and query.exception() is None:
            query.awaitTermination(0.2)
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"at-least-once query failed: {query.exception()}")
    return total[0]


def main(argv: list[str]) -> None:
    mode, cfg_json, expected = argv[0], argv[1], int(argv[2])
    out = run_spark(mode, json.loads(cfg_json), expected)
    print("BENCH-RESULT " + json.dumps(out), flush=True)
