"""Read one planned offset range `[start, end)` of one partition into Arrow record batches.

The reader assigns the partition at `start` (no consumer group), consumes in bulk and stops when
the consumer position reaches `end` — never by counting records, since offsets have gaps
(transaction markers, aborted records under read_committed, compaction). Every row carries the
Kafka metadata columns, then the deserialized value columns.

Records that fail to deserialize: with errors_tolerance="none" a RecordError names topic,
partition, offset and reason; with "all" they leave the data batches and go to `on_dead_letter`
as FailedRecords (counted in `RangeReadStats.dead_letters`, never silently dropped). Records the
deserializer skips by design (`Decoded.skipped`: a change stream's tombstones) leave without a
row and without a dead letter, counted in `RangeReadStats.records_skipped`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from lakesink.errors import ConfigError, DataLossError, InternalError, KafkaError, RecordError
from lakesink.kafka.client import consumer_config as build_consumer_config
from lakesink.kafka.dead_letters import (
    HEADER_TYPE,
    DeadLetterSink,
    FailedRecord,
    headers_array,
    timestamps_array,
)
from lakesink.kafka.deserializers import Deserializer
from lakesink.kafka.security import ClientErrors, new_client, security_error
from lakesink.protocol.offsets import OffsetRange

log = logging.getLogger(__name__)

ErrorsTolerance = Literal["none", "all"]
ERRORS_TOLERANCES: tuple[ErrorsTolerance, ...] = ("none", "all")

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field("kafka_topic", pa.string(), nullable=False),
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
    pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("kafka_key", pa.binary()),
    pa.field("kafka_headers", HEADER_TYPE),
)
"""The Kafka metadata columns every row starts with."""

METADATA_COLUMNS: tuple[str, ...] = tuple(f.name for f in METADATA_FIELDS)


def output_schema(deserializer: Deserializer) -> pa.Schema:
    """The schema of the batches `read_range` yields: metadata columns, then value columns."""
    clash = set(METADATA_COLUMNS) & set(deserializer.value_schema.names)
    if clash:
        raise ConfigError(
            f"value column(s) {', '.join(sorted(clash))} clash with Kafka metadata columns"
        )
    return pa.schema([*METADATA_FIELDS, *deserializer.value_schema])


record_schema = output_schema


@dataclass
class RangeReadStats:
    """What a read_range call saw: filled in while it runs, final once the iterator is done."""

    records_read: int = 0
    records_emitted: int = 0
    dead_letters: int = 0
    records_skipped: int = 0
    """Records that intentionally carry no row (a change stream's tombstones): read, neither
    emitted nor dead-lettered."""
    batches: int = 0
    position: int = -1
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def read_range(
    bootstrap: str,
    r: OffsetRange,
    *,
    deserializer: Deserializer,
    isolation_level: str = "read_committed",
    consumer_config: Mapping[str, Any] | None = None,
    producer_config: Mapping[str, Any] | None = None,
    batch_size: int = 10_000,
    errors_tolerance: str = "none",
    dead_letter_topic: str | None = None,
    on_dead_letter: Callable[[FailedRecord], None] | None = None,
    stats: RangeReadStats | None = None,
    poll_timeout_s: float = 0.5,
    stall_timeout_s: float = 60.0,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of `r` as record batches of at most `batch_size` rows, schema
    `output_schema(deserializer)`. Exactly the records with start <= offset < end that the
    isolation level shows are yielded (or dead-lettered), each once, in offset order.

    Bad records: errors_tolerance="none" raises RecordError; "all" hands each to `on_dead_letter`
    and/or produces it to `dead_letter_topic` (flushed before the iterator ends: a dead letter the
    broker did not acknowledge raises KafkaError). `consumer_config` adds librdkafka settings
    of the consumer, `producer_config` those of the dead-letter producer (security settings
    belong in both: `KafkaSettings.consumer_config` and `.client_config`).

    Raises KafkaError when no progress is made for `stall_timeout_s` (the message names the
    partition, the range and the offset reached), DataLossError when offsets of the range were
    deleted from the log before they were read."""
    if errors_tolerance not in ERRORS_TOLERANCES:
        raise ConfigError(
            f"errors tolerance {errors_tolerance!r} is not valid; use one of "
            f"{', '.join(ERRORS_TOLERANCES)}"
        )
    if errors_tolerance == "all" and on_dead_letter is None and not dead_letter_topic:
        # The configuration is checked where it is built (errors.tolerance=all needs one
        # dead-letter target): a caller passing neither is lakesink's bug, not the user's.
        raise InternalError(
            f"reading {r.partition} [{r.start}, {r.end}) with errors.tolerance=all was given "
            "no dead-letter target; bad records are never dropped"
        )
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    schema = output_schema(deserializer)
    st = stats if stats is not None else RangeReadStats()
    st.position = r.start
    if r.is_empty:
        return
    sink: DeadLetterSink | None = None

    def dead_letter(record: FailedRecord) -> None:
        nonlocal sink
        if on_dead_letter is not None:
            on_dead_letter(record)
        if dead_letter_topic:
            if sink is None:
                sink = DeadLetterSink(bootstrap, dead_letter_topic, producer_config=producer_config)
            sink.send(record)

    reader = _RangeReader(
        bootstrap,
        r,
        deserializer,
        schema,
        build_consumer_config(bootstrap, isolation_level, consumer_config),
        batch_size,
        errors_tolerance,
        dead_letter,
        st,
        poll_timeout_s,
        stall_timeout_s,
    )
    yield from reader.run()
    if sink is not None:
        sink.flush()


class _RangeReader:
    def __init__(
        self,
        bootstrap: str,
        r: OffsetRange,
        deserializer: Deserializer,
        schema: pa.Schema,
        config: dict[str, Any],
        batch_size: int,
        errors_tolerance: ErrorsTolerance,
        on_dead_letter: Callable[[FailedRecord], None],
        stats: RangeReadStats,
        poll_timeout_s: float,
        stall_timeout_s: float,
    ) -> None:
        self.bootstrap = bootstrap
        self.r = r
        self.deserializer = deserializer
        self.schema = schema
        self.config = config
        self.batch_size = batch_size
        self.errors_tolerance = errors_tolerance
        self.on_dead_letter = on_dead_letter
        self.stats = stats
        self.poll_timeout_s = poll_timeout_s
        self.stall_timeout_s = stall_timeout_s

    def describe(self) -> str:
        return f"{self.r.partition} range [{self.r.start}, {self.r.end})"

    def run(self) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Consumer
        from confluent_kafka import KafkaError as CkError
        from confluent_kafka import TopicPartition as CkTopicPartition

        r = self.r
        tp = r.partition
        started = time.monotonic()
        errors = ClientErrors(self.bootstrap, self.config)
        consumer = new_client(Consumer, self.config, errors)
        try:
            consumer.assign([CkTopicPartition(tp.topic, tp.partition, r.start)])
            position = r.start
            last_progress = time.monotonic()
            last_error: str | None = None
            msgs_buf: list[Any] = []
            done = False
            while not done:
                want = self.batch_size - len(msgs_buf)
                # consume(n, timeout) waits for n messages or the whole timeout, even after the
                # end of the partition: take what is queued, and block only for the next one
                msgs: list[Any] = consumer.consume(want, 0)
                if not msgs:
                    first = consumer.poll(self.poll_timeout_s)
                    msgs = [] if first is None else [first]
                errors.raise_failure()  # a broker that refuses us, or a fatal client error
                got_nothing = not msgs
                if not msgs:
                    pass
                elif (
                    not [m for m in msgs if m.error() is not None]
                    and msgs[0].offset() >= position
                    and msgs[-1].offset() < r.end
                ):
                    # fast path: only records, all new, all inside the range (in offset order)
                    msgs_buf.extend(msgs)
                    position = msgs[-1].offset() + 1
                    last_progress = time.monotonic()
                    msgs = []
                    if position >= r.end:
                        done = True
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        code = err.code()
                        if code == CkError._PARTITION_EOF:
                            if m.offset() >= r.end:
                                done = True
                            continue
                        if code in (CkError._AUTO_OFFSET_RESET, CkError.OFFSET_OUT_OF_RANGE):
                            raise DataLossError(
                                f"offset {position} of {tp} is out of range on the broker "
                                f"(reading {self.describe()}): records were deleted before "
                                f"they were read ({err.str()})"
                            )
                        if code == CkError.GROUP_AUTHORIZATION_FAILED:
                            continue  # assign-only: lakesink never uses the group
                        if code == CkError.TOPIC_AUTHORIZATION_FAILED:
                            raise security_error(self.bootstrap, errors.principal, err)
                        if err.fatal() or code in (
                            CkError.UNKNOWN_TOPIC_OR_PART,
                            CkError._UNKNOWN_PARTITION,
                            CkError._UNKNOWN_TOPIC,
                        ):
                            raise KafkaError(
                                f"reading {self.describe()} failed at offset {position}: "
                                f"{err.str()}"
                            )
                        last_error = err.str()
                        log.debug("transient error reading %s: %s", self.describe(), last_error)
                        continue
                    off = m.offset()
                    if off >= r.end:
                        done = True
                        break
                    if off < position:
                        continue  # a duplicate delivery after a broker reconnect
                    msgs_buf.append(m)
                    position = off + 1
                    last_progress = time.monotonic()  # rare path: cost does not matter
                    if position >= r.end:
                        done = True
                        break
                if not done and got_nothing:
                    # the tail of the range may hold only markers/aborted records: ask the position
                    pos = consumer.position([CkTopicPartition(tp.topic, tp.partition)])[0].offset
                    if pos >= r.end:
                        done = True
                    elif pos > position:
                        position = pos
                        last_progress = time.monotonic()
                if len(msgs_buf) >= self.batch_size or (done and msgs_buf):
                    yield from self._emit(msgs_buf)
                    msgs_buf = []
                self.stats.position = position
                if not done and time.monotonic() - last_progress > self.stall_timeout_s:
                    self._check_log_end(position)
                    raise KafkaError(
                        f"no progress reading {self.describe()} for {self.stall_timeout_s:.0f} s: "
                        f"reached offset {position}, {r.end - position} offsets short of the end"
                        + (
                            f"; last error: {last_error or errors.last}"
                            if last_error or errors.last
                            else ""
                        )
                        + " (broker down, or the range ends beyond the last stable offset?)"
                    )
            self.stats.position = r.end
        finally:
            consumer.close()
            self.stats.elapsed_s += time.monotonic() - started

    def _check_log_end(self, position: int) -> None:
        """A range that stalls below its end: DataLossError if the log now ends below the
        range's end (the broker lost records after the batch was planned); the restart then
        cuts the batch at the log end or refuses it (spark/replay_check.py). The log's end is
        its high watermark, whatever the isolation level: an open transaction holds only the
        last stable offset back, and loses nothing."""
        from lakesink.kafka.client import watermarks

        tp = self.r.partition
        settings = {k: v for k, v in self.config.items() if k != "isolation.level"}
        try:
            high = watermarks(self.bootstrap, [tp], "read_uncommitted", extra=settings)[tp][1]
        except Exception:  # the broker is unreachable: the stall error says so
            return
        if high >= self.r.end:
            return
        raise DataLossError(
            f"{tp} was planned to end at {self.r.end} but the log ends at {high} (reached "
            f"offset {position} reading {self.describe()}): the broker lost acknowledged "
            "records after the batch was planned (an unclean leader election, or a broker that "
            "lost data on a restart); restart to stop in one line, or with "
            "kafka.fail.on.data.loss=false to end the batch at the log end and go on"
        )

    def _emit(self, msgs: list[Any]) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Message

        tp = self.r.partition
        n = len(msgs)
        offsets = list(map(Message.offset, msgs))
        values = list(map(Message.value, msgs))
        headers = list(map(_headers, msgs))
        # a deserializer that reads the records' keys too (key.format) is handed them
        keyed = getattr(self.deserializer, "decode_keyed", None)
        decoded = (
            keyed(values, list(map(Message.key, msgs)))
            if keyed is not None
            else self.deserializer.decode(values)
        )
        failures = decoded.failures
        skipped = decoded.skipped
        table = decoded.table
        unreadable = [i for i, h in enumerate(headers) if h is _UNREADABLE]
        if unreadable:
            failures, table = _fail_unreadable_headers(unreadable, failures, table, n, skipped)
            skipped = skipped - failures.keys()
        self.stats.records_read += n
        if failures:
            self._handle_failures(msgs, headers, failures)
        if failures or skipped:
            # skipped records leave like failures, but no dead letter: they carry no row by design
            self.stats.records_skipped += len(skipped)
            keep = [i for i in range(n) if i not in failures and i not in skipped]
            msgs = [msgs[i] for i in keep]
            offsets = [offsets[i] for i in keep]
            headers = [headers[i] for i in keep]
            n = len(msgs)
        if n == 0:
            return
        timestamps = [t[1] if t[0] else None for t in map(Message.timestamp, msgs)]
        keys = list(map(Message.key, msgs))
        meta = [
            pa.array([tp.topic] * n, pa.string()) if n < 64 else pa.repeat(tp.topic, n),
            pa.repeat(pa.scalar(tp.partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            timestamps_array(timestamps),
            pa.array(keys, pa.binary()),
            headers_array(headers),
        ]
        columns = [
            *meta,
            *(c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in table.columns),
        ]
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.stats.records_emitted += n
        self.stats.batches += 1
        yield batch

    def _handle_failures(
        self, msgs: list[Any], headers: list[Any], failures: Mapping[int, str]
    ) -> None:
        tp = self.r.partition
        for i in sorted(failures):
            m = msgs[i]
            why = failures[i].encode("utf-8", "backslashreplace").decode("utf-8")
            if self.errors_tolerance == "none":
                raise RecordError(
                    f"record {tp.topic}:{tp.partition} offset {m.offset()} could not be "
                    f"deserialized: {why} (set errors.tolerance=all to route bad records "
                    "to a dead-letter queue)"
                )
            t = m.timestamp()
            h = headers[i]
            failed = FailedRecord(
                partition=tp,
                offset=m.offset(),
                timestamp_ms=t[1] if t[0] else None,
                key=m.key(),
                value=m.value(),
                headers=() if h is _UNREADABLE else tuple(h or ()),
                error=why,
            )
            self.on_dead_letter(failed)
            self.stats.dead_letters += 1


_UNREADABLE = object()
"""Stands for the headers of a record whose header keys are not valid UTF-8."""

UNREADABLE_HEADERS = (
    "a header key is not valid UTF-8 (header keys become strings; the record's headers are "
    "left out of its dead letter, its key and value are kept as they are)"
)


def _headers(m: Any) -> Any:
    """A record's headers, or _UNREADABLE. confluent-kafka raises when a header key is not valid
    UTF-8 (and must not be asked again for that record's headers)."""
    try:
        return m.headers()
    except (SystemError, UnicodeDecodeError, ValueError):
        return _UNREADABLE


def _fail_unreadable_headers(
    unreadable: list[int],
    failures: dict[int, str],
    table: pa.Table,
    n: int,
    skipped: frozenset[int] = frozenset(),
) -> tuple[dict[int, str], pa.Table]:
    """Add the records with unreadable headers to the failures (a skipped one too: its
    record is bad all the same) and drop their decoded rows."""
    out = dict(failures)
    drop = [i for i in unreadable if i not in failures and i not in skipped]
    for i in unreadable:
        out[i] = UNREADABLE_HEADERS
    if drop:
        dropped = set(drop)
        # row k of `table` is value rows[k]
        rows = [i for i in range(n) if i not in failures and i not in skipped]
        table = table.filter(pa.array([i not in dropped for i in rows], pa.bool_()))
    return out, table
