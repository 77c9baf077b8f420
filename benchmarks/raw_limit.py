"""The raw limit: what plain Python does with the same records on the same cores — consume a
set of partitions with confluent-kafka, decode the JSON values into Arrow with pyarrow.json,
write Parquet (zstd) with pyarrow. No Spark, no table format, no commit protocol."""

from __future__ import annotations

import io
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

CHUNK = 50_000


def raw_table(msgs: list[Any], topic: str, value_schema: Any) -> tuple[Any, int]:
    """Messages → one Arrow table (Kafka metadata columns, then the decoded values) and the
    values' bytes: the raw limit's whole work per record between the fetch and the write."""
    import pyarrow as pa
    import pyarrow.json as pj
    from confluent_kafka import Message

    values = list(map(Message.value, msgs))
    decoded = pj.read_json(
        io.BytesIO(b"\n".join(values)),
        read_options=pj.ReadOptions(use_threads=False, block_size=64 << 20),
        parse_options=pj.ParseOptions(explicit_schema=value_schema),
    )
    n = len(msgs)
    meta = {
        "kafka_topic": pa.repeat(topic, n),
        "kafka_partition": pa.array(list(map(Message.partition, msgs)), pa.int32()),
        "kafka_offset": pa.array(list(map(Message.offset, msgs)), pa.int64()),
        "kafka_timestamp": pa.array(
            [t[1] * 1000 for t in map(Message.timestamp, msgs)], pa.int64()
        ).cast(pa.timestamp("us", tz="UTC")),
        "kafka_key": pa.array(list(map(Message.key, msgs)), pa.binary()),
    }
    table = pa.Table.from_arrays(
        [*meta.values(), *decoded.columns], names=[*meta, *decoded.column_names]
    )
    return table, sum(map(len, values))


def read_partitions(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    value_ddl: str,
    out_path: str,
) -> dict[str, Any]:
    """Read every partition of `ends` from offset 0 to its end; return counts and timings."""
    import pyarrow.parquet as pq
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CkTp

    from lakesink.kafka.ddl import ddl_to_arrow

    value_schema = ddl_to_arrow(value_ddl)
    started = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-raw",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "receive.message.max.bytes": 1_000_000_000,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([CkTp(topic, p, 0) for p, end in ends.items() if end > 0])
    remaining = {p: end for p, end in ends.items() if end > 0}
    writer: pq.ParquetWriter | None = None
    buf: list[Any] = []
    rows = 0
    value_bytes = 0

    def flush() -> None:
        nonlocal writer, rows, value_bytes, buf
        if not buf:
            return
        msgs, buf = buf, []
        table, nbytes = raw_table(msgs, topic, value_schema)
        value_bytes += nbytes
        if writer is None:
            writer = pq.ParquetWriter(out_path, table.schema, compression="zstd")
        writer.write_table(table)
        rows += len(msgs)

    while remaining:
        for m in consumer.consume(10_000, 0.5):
            if m.error() is not None:
                continue
            p = m.partition()
            end = remaining.get(p)
            if end is None or m.offset() >= end:
                continue
            buf.append(m)
            if m.offset() + 1 >= end:
                del remaining[p]
        if len(buf) >= CHUNK:
            flush()
    flush()
    if writer is not None:
        writer.close()
    consumer.close()
    return {
        "records": rows,
        "value_bytes": value_bytes,
        "elapsed_s": time.perf_counter() - started,
        "end_time": time.time(),
    }


def _child(args: tuple[str, str, dict[int, int], str, str], q: Any) -> None:
    q.put(read_partitions(*args))


def run_raw(
    bootstrap: str, topic: str, ends: dict[int, int], value_ddl: str, out_dir: Path, cores: int
) -> dict[str, Any]:
    """`cores` processes, partitions dealt round-robin; the limit is records / slowest process."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    start = time.time()
    for i in range(cores):
        mine = {p: e for p, e in ends.items() if p % cores == i}
        args = (bootstrap, topic, mine, value_ddl, str(out_dir / f"raw-{i}.parquet"))
        pr = ctx.Process(target=_child, args=(args, q))
        pr.start()
        procs.append(pr)
    results = [q.get() for _ in procs]
    for pr in procs:
        pr.join()
    wall = max(r["end_time"] for r in results) - start
    return {
        "records": sum(r["records"] for r in results),
        "value_bytes": sum(r["value_bytes"] for r in results),
        "wall_s": wall,
        "steady_s": max(r["elapsed_s"] for r in results),
        "pids": [pr.pid for pr in procs],
    }
