"""Task side of the sink: write a Spark partition's Arrow batches into one table through the
format's task target (lakesink.formats.task), and count the rows per Kafka topic."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.formats.task import TaskAttempt
from lakesink.protocol.offsets import OffsetRange
from lakesink.protocol.write_status import WriteStatus

if TYPE_CHECKING:
    from pyspark import TaskContext

    from lakesink.formats.task import TaskTarget

STATUS_SCHEMA = "status string"
TOPICS_EXTRA = "topics"
"""WriteStatus.extra key: rows and bytes (Arrow size) written per Kafka topic, for the metrics;
rows without a `kafka_topic` column count under the topic ""."""
TOPIC_COLUMN = "kafka_topic"
_STATUS_ARROW = pa.schema([("status", pa.string())])

DATE_PARTITION_COLUMN = "dt"


def task_attempt(ctx: TaskContext | None) -> TaskAttempt:
    """The attempt of the Spark task `ctx` (outside Spark, in unit tests: one of its own)."""
    if ctx is None:
        return TaskAttempt(0, 0, 0, uuid.uuid4().hex)
    partition, stage, number = ctx.partitionId(), ctx.stageId(), ctx.attemptNumber()
    return TaskAttempt(partition, stage, number, f"{stage}.{partition}.{number}")


@dataclass(frozen=True, slots=True)
class ReadTally:
    """What `TableOutput` counts of rows it is given (records, and rows and Arrow bytes per
    topic), counted where they were read when what reaches the writer is fewer rows."""

    records: int = 0
    topics: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, batches: Iterable[pa.RecordBatch]) -> ReadTally:
        records = 0
        topics: dict[str, tuple[int, int]] = {}
        for batch in batches:
            records += batch.num_rows
            for topic, (n, nbytes) in topic_counts(batch).items():
                had = topics.get(topic, (0, 0))
                topics[topic] = (had[0] + n, had[1] + nbytes)
        return cls(records, topics)

    def to_json(self) -> str:
        return json.dumps({"records": self.records, "topics": self.topics})

    @classmethod
    def from_json(cls, text: str | bytes) -> ReadTally:
        raw = json.loads(text)
        return cls(
            int(raw["records"]), {t: (int(n), int(b)) for t, (n, b) in raw["topics"].items()}
        )


class TableOutput:
    """One table's writer inside a task attempt: the format's writer, and the rows and Arrow
    bytes it was given per Kafka topic (`TOPICS_EXTRA`)."""

    def __init__(self, target: TaskTarget, attempt: TaskAttempt) -> None:
        self.instant_time = target.instant_time
        self.attempt = attempt
        self.writer = target.open(attempt)
        self.records = 0
        self.topics: dict[str, list[int]] = {}

    def write(self, batch: pa.RecordBatch, tally: ReadTally | None = None) -> None:
        """Write `batch`; count its rows, or `tally` instead: the records a read task read
        where `batch` holds what its pre-fold kept of them (lakesink.spark.direct)."""
        self.writer.write(batch)
        counted = topic_counts(batch) if tally is None else tally.topics
        self.records += batch.num_rows if tally is None else tally.records
        for topic, (n, nbytes) in counted.items():
            had = self.topics.setdefault(topic, [0, 0])
            had[0] += n
            had[1] += nbytes

    def close(self) -> WriteStatus:
        files, extra = self.writer.close()
        return WriteStatus(
            instant_time=self.instant_time,
            task_attempt=self.attempt.name,
            files=tuple(files),
            records_read=self.records,
            records_written=sum(f.num_writes for f in files),
            extra={**extra, TOPICS_EXTRA: self.topics},
        )


class TaskWriter:
    """A picklable function for `DataFrame.mapInArrow`: writes the rows it is given into one
    table (`target`, from the format's plugin) and yields one row holding this attempt's
    WriteStatus as JSON. A failed or retried attempt's files are in no returned status."""

    def __init__(self, target: TaskTarget, required: tuple[str, ...] = ()) -> None:
        self.target = target
        # Top-level columns that are non-nullable in the rows as declared: the source relaxes
        # them (dead-letter rows), the writer restores them and refuses a null in them.
        self.required = required

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        out = TableOutput(self.target, task_attempt(ctx))
        for batch in batches:
            if batch.num_rows:
                out.write(with_required(batch, self.required))
        status = out.close()
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield pa.RecordBatch.from_pylist([{"status": json.dumps(status.to_json())}], _STATUS_ARROW)


def topic_counts(batch: pa.RecordBatch) -> dict[str, tuple[int, int]]:
    """Rows and Arrow bytes of `batch` per value of its `kafka_topic` column (one pass over the
    column; a batch of one topic, the usual case, is not split)."""
    import pyarrow.compute as pc

    if TOPIC_COLUMN not in batch.schema.names:
        return {"": (batch.num_rows, batch.nbytes)}
    column = batch.column(TOPIC_COLUMN)
    topics = pc.unique(column).to_pylist()
    if len(topics) == 1:
        return {str(topics[0] or ""): (batch.num_rows, batch.nbytes)}
    out: dict[str, tuple[int, int]] = {}
    for topic in topics:
        part = batch.filter(pc.is_null(column) if topic is None else pc.equal(column, topic))
        out[str(topic or "")] = (part.num_rows, part.nbytes)
    return out


def with_required(batch: pa.RecordBatch, required: Sequence[str]) -> pa.RecordBatch:
    """`batch` with the `required` columns non-nullable, as declared; a null in one of them (a
    tombstone or a transformation's null where the schema allows none) fails the batch naming the
    column and the Kafka record."""
    if not required:
        return batch
    fields = list(batch.schema)
    for i, f in enumerate(fields):
        if f.name not in required or not f.nullable:
            continue
        column = batch.column(i)
        if column.null_count:
            from lakesink.errors import RecordError
            from lakesink.spark.arrow_transform import KEPT_COLUMNS as COORDINATE_COLUMNS

            row = column.is_null().index(True).as_py()
            at = ""
            if all(c in batch.schema.names for c in COORDINATE_COLUMNS):
                topic, partition, offset = (
                    batch.column(c)[row].as_py() for c in COORDINATE_COLUMNS
                )
                at = f" in the row of Kafka record {topic}:{partition} offset {offset}"
            raise RecordError(
                f"column {f.name!r} is declared NOT NULL (non-nullable) but is null{at}; "
                "the batch is refused and nothing of it is published. Declare the column "
                "nullable, or route such records to a dead-letter target (errors.tolerance=all)"
            )
        fields[i] = f.with_nullable(False)
    return pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema(fields))


def parse_statuses(rows: Sequence[Any]) -> list[WriteStatus]:
    return [WriteStatus.from_json(json.loads(row["status"])) for row in rows]


def rows_per_topic(
    statuses: list[WriteStatus], ranges: list[OffsetRange]
) -> dict[str, tuple[int, int]]:
    """Rows and bytes the tasks wrote per Kafka topic. Rows whose topic the tasks could not
    tell (a transformation dropped `kafka_topic`) count for the batch's topic when it read one
    topic, else for `UNKNOWN_TOPIC`."""
    from lakesink.metrics import UNKNOWN_TOPIC

    read = {r.partition.topic for r in ranges}
    out: dict[str, tuple[int, int]] = {}
    for status in statuses:
        for topic, (rows, nbytes) in dict(status.extra.get(TOPICS_EXTRA) or {}).items():
            name = topic or (next(iter(read)) if len(read) == 1 else UNKNOWN_TOPIC)
            had = out.get(name, (0, 0))
            out[name] = (had[0] + int(rows), had[1] + int(nbytes))
    return out
