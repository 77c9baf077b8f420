"""A Python worker's stages, lakesink against the raw limit, on the same records in memory: no
broker, no Spark, one process. For each event size it makes `--events` Kafka messages (sample
events, as `confluent_kafka.Message` objects) and times, in CPU per record (the least of
`--repeats`):

- decode + metadata columns: lakesink's `read_range` batch (`_RangeReader._emit`: the values
  decoded by the JSON rules' bulk path, the Kafka metadata columns) against the raw limit's
  (`raw_limit.raw_table`: `pyarrow.json` with an explicit schema, the same metadata columns);
- write: lakesink's base-file writer (`PartitionedWriter`: the Hudi meta columns, the marker, a
  zstd Parquet file, its fsync) against the raw limit's (`pyarrow.parquet`, zstd).

What neither side does here (the Kafka fetch, Spark's worker loop and the JVM) is measured end
to end by run.py and profile_ingest.py; this isolates what lakesink's own code adds per record.

    python benchmarks/bench_stages.py
    python benchmarks/bench_stages.py --events 200000 --sizes 250,1024 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Message
from raw_limit import raw_table

from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.writer import COORDINATE_COLUMNS, PartitionedWriter
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.json_bulk import JsonDeserializer
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, sample_event_bytes
from lakesink.kafka.reader import RangeReadStats, _RangeReader, output_schema
from lakesink.protocol.offsets import OffsetRange, TopicPartition

TOPIC = "events"
INSTANT = "20261126000000000"
RESULTS = Path(__file__).parent / "results"


def messages(events: int, size: int) -> list[Any]:
    base_ms = 1_700_000_000_000
    return [
        Message(
            topic=TOPIC,
            partition=3,
            offset=1_000_000 + i,
            value=sample_event_bytes(i, payload_bytes=size),
            key=None,
            timestamp=(1, base_ms + i),
            headers=None,
        )
        for i in range(events)
    ]


def cpu_us_per_record(fn: Callable[[], object], records: int, repeats: int) -> float:
    fn()  # imports and first-call costs out of the figure
    times = []
    for _ in range(repeats):
        started = time.process_time()
        fn()
        times.append(time.process_time() - started)
    return min(times) / records * 1e6


def measure(events: int, size: int, repeats: int, work: Path) -> dict[str, float]:
    msgs = messages(events, size)
    end = 1_000_000 + events
    deserializer = JsonDeserializer(SAMPLE_EVENT_DDL)
    reader = _RangeReader(
        "unused:9092",
        OffsetRange(TopicPartition(TOPIC, 3), 1_000_000, end),
        deserializer,
        output_schema(deserializer),
        config={},
        batch_size=events,
        errors_tolerance="none",
        on_dead_letter=lambda _: None,
        stats=RangeReadStats(),
        poll_timeout_s=1.0,
        stall_timeout_s=60.0,
    )
    value_schema = ddl_to_arrow(SAMPLE_EVENT_DDL)

    def lakesink_read() -> pa.RecordBatch:
        (batch,) = reader._emit(msgs)
        return batch

    def raw_read() -> pa.Table:
        return raw_table(msgs, TOPIC, value_schema)[0]

    batch, table = lakesink_read(), raw_read()
    config = TableConfig(name="events", record_key_fields=COORDINATE_COLUMNS, partition_fields=())
    hudi = HudiTable.create(work / f"table-{size}", config)
    attempts = iter(range(1_000_000))

    def lakesink_write() -> None:
        writer = PartitionedWriter(
            hudi, INSTANT, f"{next(attempts)}-1-0", config=config, check_schema=False
        )
        writer.write(batch)
        writer.close()

    def raw_write() -> None:
        with pq.ParquetWriter(work / f"raw-{size}.parquet", table.schema, compression="zstd") as w:
            w.write_table(table)

    figures = {
        "lakesink read": cpu_us_per_record(lakesink_read, events, repeats),
        "raw read": cpu_us_per_record(raw_read, events, repeats),
        "lakesink write": cpu_us_per_record(lakesink_write, events, repeats),
        "raw write": cpu_us_per_record(raw_write, events, repeats),
    }
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="messages per size")
    ap.add_argument("--sizes", default="250,1024", help="event sizes in bytes, comma-separated")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per stage (least kept)")
    ap.add_argument("--out", default=None, help="JSON file (default results/stages-<time>.json)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="lakesink-stages-") as tmp:
        for size in sizes:
            results[str(size)] = measure(args.events, size, args.repeats, Path(tmp))
    print(f"CPU µs per record, least of {args.repeats} runs, {args.events:,} records per size")
    print(f"{'stage':<32} {'size':>5} {'lakesink':>9} {'raw':>7} {'÷ raw':>6}")
    for size, fig in results.items():
        for stage in ("read", "write"):
            ls, raw = fig[f"lakesink {stage}"], fig[f"raw {stage}"]
            label = {"read": "decode + metadata columns", "write": "write (Parquet, zstd)"}[stage]
            print(f"{label:<32} {size:>5} {ls:>9.2f} {raw:>7.2f} {ls / raw:>6.2f}")
        ls = fig["lakesink read"] + fig["lakesink write"]
        raw = fig["raw read"] + fig["raw write"]
        print(f"{'both':<32} {size:>5} {ls:>9.2f} {raw:>7.2f} {ls / raw:>6.2f}")
    out = Path(args.out) if args.out else RESULTS / f"stages-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"events": args.events, "stages": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
