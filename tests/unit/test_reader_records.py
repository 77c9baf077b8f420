"""The range reader's handling of decoded records, without a broker: records built as
confluent-kafka Messages go through `_emit` as consumed records would."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message

from lakesink.errors import RecordError
from lakesink.kafka.dead_letters import FailedRecord
from lakesink.kafka.deserializers import Deserializer, JsonDeserializer, RawDeserializer
from lakesink.kafka.reader import UNREADABLE_HEADERS, RangeReadStats, _RangeReader, output_schema
from lakesink.protocol.offsets import OffsetRange, TopicPartition


class _BadHeaderKeyMessage(Message):  # type: ignore[misc]
    """confluent-kafka raises this way for a record whose header key is not valid UTF-8."""

    def headers(self) -> Any:
        raise SystemError("<method 'headers'> returned a result with an exception set")


def _reader(d: Deserializer, tolerance: str, dead: list[FailedRecord]) -> _RangeReader:
    r = OffsetRange(TopicPartition("t", 3), 0, 100)
    return _RangeReader(
        "unused:9092", r, d, output_schema(d), {}, 100, tolerance, dead.append,  # type: ignore[arg-type]
        RangeReadStats(), 0.1, 1.0,
    )  # fmt: skip


def _msg(offset: int, value: bytes | None, cls: type[Message] = Message, **kw: Any) -> Message:
    return cls(topic="t", partition=3, offset=offset, value=value, timestamp=(1, 1000), **kw)


def test_a_record_whose_header_keys_cannot_be_read_is_a_dead_letter_and_rows_stay_aligned() -> None:
    dead: list[FailedRecord] = []
    msgs = [
        _msg(10, b'{"id": 1}', headers=[("h", b"1")]),
        _msg(11, b'{"id": 2}', _BadHeaderKeyMessage),
        _msg(12, b"garbage"),
        _msg(13, b'{"id": 4}', key=b"\xff"),
    ]
    (batch,) = _reader(JsonDeserializer("id BIGINT"), "all", dead)._emit(msgs)
    assert batch.column("kafka_offset").to_pylist() == [10, 13]
    assert batch.column("id").to_pylist() == [1, 4]
    assert batch.column("kafka_key").to_pylist() == [None, b"\xff"]
    assert batch.column("kafka_headers").to_pylist()[0] == [{"key": "h", "value": b"1"}]
    assert [(f.offset, f.error == UNREADABLE_HEADERS, f.headers) for f in dead] == [
        (11, True, ()),
        (12, False, ()),
    ]
    assert dead[0].value == b'{"id": 2}'


def test_unreadable_header_keys_fail_the_batch_under_tolerance_none() -> None:
    msgs = [_msg(5, b"raw", _BadHeaderKeyMessage)]
    with pytest.raises(RecordError, match=r"record t:3 offset 5 .*header key is not valid UTF-8"):
        list(_reader(RawDeserializer(), "none", [])._emit(msgs))


def test_a_tombstone_for_a_required_column_names_topic_partition_and_offset() -> None:
    msgs = [_msg(0, b'{"id": 1}'), _msg(1, None)]
    with pytest.raises(RecordError) as e:
        list(_reader(JsonDeserializer("id BIGINT NOT NULL"), "none", [])._emit(msgs))
    assert str(e.value).startswith(
        "record t:3 offset 1 could not be deserialized: tombstone (null value) for a schema "
        "with required column id"
    )


def test_failure_reasons_holding_lone_surrogates_become_valid_text() -> None:
    class Lone:
        value_schema = RawDeserializer.SCHEMA

        def decode(self, values: Any) -> Any:
            from lakesink.kafka.decoded import Decoded

            return Decoded(RawDeserializer.SCHEMA.empty_table(), {0: "bad \ud800 text"})

    dead: list[FailedRecord] = []
    assert list(_reader(Lone(), "all", dead)._emit([_msg(0, b"x")])) == []
    assert dead[0].error == "bad \\ud800 text"
    dead[0].error.encode("utf-8")
