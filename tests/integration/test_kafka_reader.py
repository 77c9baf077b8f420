"""Range reading against a real broker: exact records, transaction gaps, tails, bad records."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pyarrow as pa
import pytest

from lakesink.errors import ConfigError, DataLossError, InternalError, KafkaError, RecordError
from lakesink.kafka.client import (
    OffsetClient,
    create_topic,
    list_partitions,
    offsets_for_times,
    watermarks,
)
from lakesink.kafka.dead_letters import (
    ERROR_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    FailedRecord,
    dead_letter_batch,
)
from lakesink.kafka.deserializers import JsonDeserializer, RawDeserializer
from lakesink.kafka.planning import plan_ranges, resolve_start
from lakesink.kafka.producer import (
    SAMPLE_EVENT_DDL,
    encode_event,
    produce_sample_events,
    produce_transactional,
    produce_values,
    sample_event,
)
from lakesink.kafka.reader import RangeReadStats, output_schema, read_range
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

pytestmark = pytest.mark.integration

TopicFactory = Callable[[str], str]


def _read_all(bootstrap: str, r: OffsetRange, **kwargs: object) -> pa.Table:
    deserializer = kwargs.pop("deserializer", RawDeserializer())
    batches = list(read_range(bootstrap, r, deserializer=deserializer, **kwargs))  # type: ignore[arg-type]
    schema = output_schema(deserializer)  # type: ignore[arg-type]
    for b in batches:
        assert b.schema == schema
    return pa.Table.from_batches(batches, schema=schema)


def test_produce_plan_read_gives_every_record_once(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("events")
    counts = produce_sample_events(kafka_bootstrap, topic, 3000, 3, seed=7)
    parts = list_partitions(kafka_bootstrap, [topic])
    assert parts == [TopicPartition(topic, p) for p in range(3)]
    marks = watermarks(kafka_bootstrap, parts)
    assert {tp: hi - lo for tp, (lo, hi) in marks.items()} == counts
    starts = resolve_start(WriterOffsets.empty(), parts, "earliest", OffsetClient(kafka_bootstrap))
    ranges = plan_ranges(starts, {tp: hi for tp, (_, hi) in marks.items()}, None, 400)
    assert len(ranges) == 9  # 1000 offsets a partition, tasks of 400
    deserializer = JsonDeserializer(SAMPLE_EVENT_DDL)
    tables = [_read_all(kafka_bootstrap, r, deserializer=deserializer) for r in ranges]
    table = pa.concat_tables(tables)
    assert table.num_rows == 3000
    ids = table.column("event_id").to_pylist()
    assert sorted(ids) == list(range(3000))
    for row in table.slice(0, 50).to_pylist() + table.slice(2950, 50).to_pylist():
        want = sample_event(row["event_id"], seed=7)
        assert row["kafka_partition"] == want["event_id"] % 3
        assert row["kafka_key"] == str(want["event_id"]).encode()
        assert (row["user_id"], row["payload"]) == (want["user_id"], want["payload"])
    for p in range(3):
        offsets = [
            o
            for o, part in zip(
                table.column("kafka_offset").to_pylist(),
                table.column("kafka_partition").to_pylist(),
                strict=True,
            )
            if part == p
        ]
        assert offsets == list(range(1000))


def test_batches_respect_batch_size_and_stats(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("sizes")
    produce_sample_events(kafka_bootstrap, topic, 2500, 1)
    stats = RangeReadStats()
    batches = list(
        read_range(
            kafka_bootstrap,
            OffsetRange(TopicPartition(topic, 0), 100, 2100),
            deserializer=RawDeserializer(),
            batch_size=700,
            stats=stats,
        )
    )
    assert [b.num_rows for b in batches] == [700, 700, 600]
    assert batches[0].column("kafka_offset")[0].as_py() == 100
    assert batches[-1].column("kafka_offset")[-1].as_py() == 2099
    assert (stats.records_read, stats.records_emitted, stats.position) == (2000, 2000, 2100)


def _recent_whole_second_ms() -> int:
    """A record timestamp an hour old: older ones fall to the broker's 7-day time retention,
    which the test broker checks every second, so they could vanish before they are read."""
    return (int(time.time()) - 3600) * 1000


def test_empty_range_reads_nothing_without_contacting_the_broker() -> None:
    r = OffsetRange(TopicPartition("whatever", 0), 5, 5)
    assert list(read_range("127.0.0.1:1", r, deserializer=RawDeserializer())) == []


def test_keys_headers_and_timestamps_land_in_metadata_columns(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("meta")
    create_topic(kafka_bootstrap, topic, 1)
    base_ms = _recent_whole_second_ms()
    produce_values(
        kafka_bootstrap,
        topic,
        [b"a", None, b"c"],
        keys=[b"k1", None, b"k3"],
        headers=[[("h", b"1"), ("h", b"2")], None, [("x", b"")]],
        timestamps_ms=[base_ms, base_ms + 1, base_ms + 2],
    )
    t = _read_all(kafka_bootstrap, OffsetRange(TopicPartition(topic, 0), 0, 3))
    rows = t.to_pylist()
    assert [r["value"] for r in rows] == [b"a", None, b"c"]
    assert [r["kafka_key"] for r in rows] == [b"k1", None, b"k3"]
    assert rows[0]["kafka_headers"] == [{"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}]
    assert rows[1]["kafka_headers"] in (None, [])
    assert rows[0]["kafka_timestamp"].timestamp() == base_ms / 1000
    assert rows[2]["kafka_topic"] == topic and rows[2]["kafka_partition"] == 0


def test_offsets_for_times_finds_first_record_at_or_after(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("times")
    create_topic(kafka_bootstrap, topic, 1)
    base = _recent_whole_second_ms()
    produce_values(
        kafka_bootstrap, topic, [b"x"] * 5, timestamps_ms=[base + 10 * i for i in range(5)]
    )
    tp = TopicPartition(topic, 0)
    found = offsets_for_times(kafka_bootstrap, {tp: base + 15})
    assert found == {tp: 2}
    assert offsets_for_times(kafka_bootstrap, {tp: base + 1000}) == {tp: None}
    starts = resolve_start(
        WriterOffsets.empty(), [tp], str(base + 15), OffsetClient(kafka_bootstrap)
    )
    assert starts == {tp: 2}


def test_aborted_transactions_leave_gaps_that_read_committed_skips(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("tx")
    create_topic(kafka_bootstrap, topic, 1)
    committed, producer = produce_transactional(
        kafka_bootstrap, topic, [(3, True), (4, False), (2, True), (5, False), (1, True)]
    )
    del producer
    tp = TopicPartition(topic, 0)
    (low, lso) = watermarks(kafka_bootstrap, [tp])[tp]
    assert low == 0 and lso > len(committed)  # markers and aborted records take offsets
    t = _read_all(kafka_bootstrap, OffsetRange(tp, 0, lso), deserializer=JsonDeserializer("n INT"))
    assert t.column("n").to_pylist() == committed == [0, 1, 2, 7, 8, 14]
    offsets = t.column("kafka_offset").to_pylist()
    assert offsets == sorted(offsets) and offsets[-1] < lso
    all_records = _read_all(
        kafka_bootstrap,
        OffsetRange(tp, 0, watermarks(kafka_bootstrap, [tp], "read_uncommitted")[tp][1]),
        deserializer=JsonDeserializer("n INT"),
        isolation_level="read_uncommitted",
    )
    assert all_records.column("n").to_pylist() == list(range(15))


def test_range_whose_tail_is_only_markers_and_aborted_records_ends_promptly(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("tail")
    create_topic(kafka_bootstrap, topic, 1)
    _, producer = produce_transactional(kafka_bootstrap, topic, [(2, True), (3, False)])
    del producer
    tp = TopicPartition(topic, 0)
    lso = watermarks(kafka_bootstrap, [tp])[tp][1]
    # split so that the second range holds no visible record at all
    first, second = OffsetRange(tp, 0, 3), OffsetRange(tp, 3, lso)
    started = time.monotonic()
    assert _read_all(kafka_bootstrap, first).num_rows == 2
    stats = RangeReadStats()
    assert _read_all(kafka_bootstrap, second, stats=stats, stall_timeout_s=10).num_rows == 0
    assert stats.position == lso
    assert time.monotonic() - started < 8


def test_open_transaction_holds_the_last_stable_offset(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("open")
    create_topic(kafka_bootstrap, topic, 1)
    _committed, producer = produce_transactional(kafka_bootstrap, topic, [(3, True)], leave_open=2)
    tp = TopicPartition(topic, 0)
    try:
        lso = watermarks(kafka_bootstrap, [tp])[tp][1]
        high = watermarks(kafka_bootstrap, [tp], "read_uncommitted")[tp][1]
        assert lso == 4 and high == 6  # 3 records + commit marker; 2 open records after
        assert _read_all(kafka_bootstrap, OffsetRange(tp, 0, lso)).num_rows == 3
        # a range planned beyond the last stable offset cannot finish: a clear error, not a hang
        with pytest.raises(KafkaError) as e:
            _read_all(kafka_bootstrap, OffsetRange(tp, 0, high), stall_timeout_s=2)
        text = str(e.value)
        assert f"{topic}:0" in text and "[0, 6)" in text and "reached offset 4" in text
    finally:
        producer.abort_transaction(10)


def test_non_existent_topic_errors_name_the_topic(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    missing = topic_factory("missing")
    with pytest.raises(KafkaError, match=missing):
        list_partitions(kafka_bootstrap, [missing])
    # asking did not create it (some brokers auto-create topics on metadata requests)
    with pytest.raises(KafkaError, match=missing):
        list_partitions(kafka_bootstrap, [missing], wait_timeout_s=0.5)
    assert list_partitions(kafka_bootstrap, pattern=f"{missing}.*") == []
    with pytest.raises(ConfigError):
        list_partitions(kafka_bootstrap, pattern="(")


def test_list_partitions_can_wait_for_a_topic_to_appear(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    import threading

    topic = topic_factory("later")
    timer = threading.Timer(0.5, create_topic, args=(kafka_bootstrap, topic, 2))
    timer.start()
    try:
        assert len(list_partitions(kafka_bootstrap, [topic], wait_timeout_s=20)) == 2
    finally:
        timer.join()


def test_create_topic_is_idempotent(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory("idem")
    assert create_topic(kafka_bootstrap, topic, 2) is True
    assert create_topic(kafka_bootstrap, topic, 2) is False
    assert len(list_partitions(kafka_bootstrap, [topic])) == 2


def test_deleted_records_are_data_loss_for_planning_and_reading(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    from confluent_kafka import TopicPartition as CkTopicPartition
    from confluent_kafka.admin import AdminClient

    topic = topic_factory("loss")
    produce_sample_events(kafka_bootstrap, topic, 100, 1)
    tp = TopicPartition(topic, 0)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # keep it alive for the futures
    futures = admin.delete_records([CkTopicPartition(topic, 0, 40)])
    for f in futures.values():
        f.result(timeout=10)
    assert watermarks(kafka_bootstrap, [tp])[tp] == (40, 100)
    with pytest.raises(DataLossError) as e:
        resolve_start(WriterOffsets({tp: 25}), [tp], "earliest", OffsetClient(kafka_bootstrap))
    assert f"{topic}:0" in str(e.value) and "25" in str(e.value) and "40" in str(e.value)
    with pytest.raises(DataLossError, match=f"{topic}:0"):
        _read_all(kafka_bootstrap, OffsetRange(tp, 25, 60), stall_timeout_s=10)
    starts = resolve_start(
        WriterOffsets({tp: 25}),
        [tp],
        "earliest",
        OffsetClient(kafka_bootstrap),
        fail_on_data_loss=False,
    )
    assert starts == {tp: 40}
    assert _read_all(kafka_bootstrap, OffsetRange(tp, 40, 100)).num_rows == 60


def _mixed_values(n: int, bad: set[int]) -> list[bytes]:
    return [b"{not json" if i in bad else encode_event(sample_event(i)) for i in range(n)]


def test_bad_record_with_tolerance_none_names_topic_partition_offset(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("bad")
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topic, _mixed_values(30, {17}))
    with pytest.raises(RecordError) as e:
        _read_all(
            kafka_bootstrap,
            OffsetRange(TopicPartition(topic, 0), 0, 30),
            deserializer=JsonDeserializer(SAMPLE_EVENT_DDL),
        )
    assert f"{topic}:0 offset 17" in str(e.value)


def test_bad_records_with_tolerance_all_become_dead_letters(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("dlq-src")
    create_topic(kafka_bootstrap, topic, 1)
    bad = {0, 5, 29}
    produce_values(
        kafka_bootstrap, topic, _mixed_values(30, bad), keys=[b"k%d" % i for i in range(30)]
    )
    letters: list[FailedRecord] = []
    stats = RangeReadStats()
    t = _read_all(
        kafka_bootstrap,
        OffsetRange(TopicPartition(topic, 0), 0, 30),
        deserializer=JsonDeserializer(SAMPLE_EVENT_DDL),
        errors_tolerance="all",
        on_dead_letter=letters.append,
        stats=stats,
    )
    assert t.column("event_id").to_pylist() == [i for i in range(30) if i not in bad]
    assert [d.offset for d in letters] == sorted(bad)
    assert letters[0].value == b"{not json" and letters[0].key == b"k0"
    assert (stats.records_read, stats.records_emitted, stats.dead_letters) == (30, 27, 3)
    batch = dead_letter_batch(letters)
    assert batch.column("kafka_offset").to_pylist() == [0, 5, 29]
    assert letters[1].to_dead_letter().offset == 5


def test_dead_letters_go_to_a_kafka_topic_with_source_headers(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic, dlq = topic_factory("dlq-src"), topic_factory("dlq")
    create_topic(kafka_bootstrap, topic, 1)
    create_topic(kafka_bootstrap, dlq, 1)
    produce_values(kafka_bootstrap, topic, _mixed_values(20, {3, 11}))
    t = _read_all(
        kafka_bootstrap,
        OffsetRange(TopicPartition(topic, 0), 0, 20),
        deserializer=JsonDeserializer(SAMPLE_EVENT_DDL),
        errors_tolerance="all",
        dead_letter_topic=dlq,
    )
    assert t.num_rows == 18
    dlq_tp = TopicPartition(dlq, 0)
    end = watermarks(kafka_bootstrap, [dlq_tp])[dlq_tp][1]
    dead = _read_all(kafka_bootstrap, OffsetRange(dlq_tp, 0, end)).to_pylist()
    assert [d["value"] for d in dead] == [b"{not json", b"{not json"]
    headers = [{h["key"]: h["value"] for h in d["kafka_headers"]} for d in dead]
    assert [h[SOURCE_OFFSET_HEADER] for h in headers] == [b"3", b"11"]
    assert headers[0][SOURCE_TOPIC_HEADER] == topic.encode()
    assert headers[0][SOURCE_PARTITION_HEADER] == b"0"
    assert b"JSON" in headers[0][ERROR_HEADER] or b"json" in headers[0][ERROR_HEADER].lower()


def test_tolerance_all_without_a_destination_is_lakesinks_bug_not_a_config_error() -> None:
    """The configuration is checked where it is built (errors.tolerance=all needs one
    dead-letter target); a caller passing none is an internal error, never "your config"."""
    with pytest.raises(InternalError, match="never dropped"):
        list(
            read_range(
                "127.0.0.1:1",
                OffsetRange(TopicPartition("t", 0), 0, 1),
                deserializer=RawDeserializer(),
                errors_tolerance="all",
            )
        )


def test_json_payload_values_round_trip_exactly(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("exact")
    create_topic(kafka_bootstrap, topic, 1)
    docs = [
        {"id": i, "name": "é\u00fc\n" * (i % 3), "tags": ["a", "b"][: i % 3]} for i in range(10)
    ]
    produce_values(kafka_bootstrap, topic, [json.dumps(d).encode() for d in docs])
    t = _read_all(
        kafka_bootstrap,
        OffsetRange(TopicPartition(topic, 0), 0, 10),
        deserializer=JsonDeserializer("id BIGINT, name STRING, tags ARRAY<STRING>"),
    )
    assert t.select(["id", "name", "tags"]).to_pylist() == docs
