"""The pending entry of a prepared commit (commit.mode=async): what `encode` stores is what
`decode` gives back, for Hudi and for Iceberg (with its data file descriptions), and an entry
written before Iceberg was supported still decodes and encodes to the same bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lakesink.config import build_config
from lakesink.engine import writer_state as keys
from lakesink.engine.async_commit import DATA_FILES_KEY, REWRITE_KEY, decode, encode, ranges_of
from lakesink.engine.change import TableChange
from lakesink.engine.coordinator import PreparedCommit
from lakesink.engine.pending.store import PendingCommit, PendingEntryConflictError
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.format import VTTS_KEY
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "pending" / "hudi_epoch_v1.json"
P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)


def _iceberg_prepared() -> PreparedCommit:
    """A batch as IcebergCoordinator.precommit prepares it: tasks' files as FileWrites named by
    their URI, the VTTS and commit id in the metadata, the descriptions beside it."""
    described = [
        DataFileDescription(
            path=f"file:///wh/lakesink.db/events/data/kafka_partition={p}/00000-{p}-a.parquet",
            size_bytes=2048 + p,
            record_count=10 + p,
            spec_id=0,
            partition=(p, "2026-01-01", None, 1.5, True, b"\x00\xff"),
            column_sizes={1: 100, 2: 200},
            value_counts={1: 10 + p},
            null_value_counts={1: 0},
            nan_value_counts={},
            lower_bounds={1: b"\x00\x00\x00\x00"},
            upper_bounds={1: b"\x09\x00\x00\x00"},
            split_offsets=(4,),
        )
        for p in (0, 1)
    ]
    metadata = TableChange(
        operation_type="INSERT",
        writes=tuple(
            FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in described
        ),
        schema="",
        extra={
            keys.WRITER_ID_KEY: "w",
            keys.QUERY_ID_KEY: "q",
            keys.BATCH_ID_KEY: "3",
            keys.COMMIT_ID_KEY: "0b4e",
            keys.OFFSETS_KEY: json.dumps({P0.key(): 30, P1.key(): 31}),
            keys.RANGES_KEY: json.dumps([[P0.key(), 20, 30], [P1.key(), 20, 31]]),
            VTTS_KEY: "1767225600000",
        },
    )
    return PreparedCommit(
        instant_time=InstantTime.from_epoch_ms(1_767_225_600_123),
        batch_id=3,
        metadata=metadata,
        base_offsets=WriterOffsets({P0: 20, P1: 20}),
        next_offsets=WriterOffsets({P0: 30, P1: 31}),
        records=21,
        files=2,
        data_files=tuple(d.to_json() for d in described),
    )


def test_iceberg_prepared_commit_round_trips_with_its_data_files() -> None:
    prepared = _iceberg_prepared()
    data = encode(prepared)
    back = decode(data)
    assert back == prepared
    assert back.metadata.extra[VTTS_KEY] == "1767225600000"
    assert back.metadata.extra[keys.COMMIT_ID_KEY] == "0b4e"
    originals = [DataFileDescription.from_json(d) for d in prepared.data_files]
    assert [DataFileDescription.from_json(d) for d in back.data_files] == originals
    assert encode(back) == data  # deterministic: a replayed pre-commit is the same content


def test_entry_written_before_iceberg_support_decodes_and_encodes_to_the_same_bytes() -> None:
    stored = GOLDEN.read_bytes()
    prepared = decode(stored)
    assert prepared.instant_time == InstantTime("20260101000000000")
    assert (prepared.batch_id, prepared.records, prepared.files) == (7, 3, 1)
    assert prepared.base_offsets == WriterOffsets({P0: 10, P1: 5})
    assert prepared.next_offsets == WriterOffsets({P0: 13, P1: 5})
    assert [w.path for w in prepared.metadata.writes] == [
        "kafka_partition=0/f0_0-1-0_20260101000000000.parquet"
    ]
    assert prepared.metadata.extra[keys.COMMIT_ID_KEY] == "c0ffee"
    assert prepared.data_files == ()
    assert encode(prepared) == stored
    assert DATA_FILES_KEY not in json.loads(stored)["extra"]


def test_a_hudi_entry_has_no_data_files_key() -> None:
    hudi = decode(GOLDEN.read_bytes())
    assert DATA_FILES_KEY not in PendingCommit.from_bytes(encode(hudi)).extra
    assert DATA_FILES_KEY in PendingCommit.from_bytes(encode(_iceberg_prepared())).extra
    # nor a rewrite key, nor an append of Iceberg's: only a batch of a table of keys has one
    assert REWRITE_KEY not in PendingCommit.from_bytes(encode(hudi)).extra
    assert REWRITE_KEY not in PendingCommit.from_bytes(encode(_iceberg_prepared())).extra


def test_a_batch_of_keys_round_trips_with_what_its_snapshot_replaces() -> None:
    reports = (
        {
            "iceberg.buckets": {"0": ["s3://wh/t/data/b0-a.parquet"], "3": []},
            "iceberg.replaced": [{"path": "s3://wh/t/data/b0-a.parquet", "record_count": 4}],
        },
    )
    prepared = replace(_iceberg_prepared(), rewrite=reports)
    data = encode(prepared)
    assert PendingCommit.from_bytes(data).extra[REWRITE_KEY] == [dict(r) for r in reports]
    back = decode(data)
    assert back == prepared and back.rewrite == reports
    assert encode(back) == data
    assert ranges_of(back) == (OffsetRange(P0, 20, 30), OffsetRange(P1, 20, 31))


def test_an_entry_missing_its_commit_fields_is_reported_as_corrupted() -> None:
    doc = json.loads(encode(_iceberg_prepared()))
    del doc["extra"]["base_offsets"]
    with pytest.raises(PendingEntryConflictError, match="cannot be decoded"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "{t}/.hoodie/.lakesink/pending-commits.sqlite"),
        (
            {"table.format": "iceberg", "table.name": "events"},
            "{t}/.lakesink/pending/lakesink.events.sqlite",
        ),
        (
            {"table.format": "iceberg", "table.name": "events", "iceberg.namespace": "a.b"},
            "{t}/.lakesink/pending/a.b.events.sqlite",
        ),
        (
            {"table.format": "iceberg", "commit.pending.store.path": "{t}/mine.sqlite"},
            "{t}/mine.sqlite",
        ),
    ],
)
def test_default_pending_store_file_lies_beside_the_table(
    tmp_path: Path, overrides: dict[str, str], expected: str
) -> None:
    table = tmp_path / "wh"
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "kafka.topics": "events",
            "value.format": "json",
            "value.schema": "id BIGINT",
            "table.path": str(table),
            **{k: v.format(t=table) for k, v in overrides.items()},
        }
    )
    assert cfg.pending_store_path == Path(expected.format(t=table))
