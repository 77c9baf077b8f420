"""The commit engine's `TableTransaction` over an Iceberg table (`IcebergFormat`) on a real SQLite
catalog: one fast append per transaction with the writer's offsets, a replay refused, an abort
deleting the batch's files, a commit recognised as published after it landed."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from iceberg_tables import Backend, expected, write
from iceberg_tables import keys as table_keys

from lakesink.engine import writer_state as keys
from lakesink.engine.requirements import OffsetsUnchanged
from lakesink.engine.transaction import TableTransaction, TxState
from lakesink.errors import CommitError, OffsetError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
WRITER = "w1"


def _metadata(
    ranges: list[OffsetRange], files: list[DataFileDescription], commit_id: str = ""
) -> CommitMetadata:
    return CommitMetadata(
        operation_type="INSERT",
        writes=(),
        replaced_file_ids={},
        schema="",
        extra={
            keys.WRITER_ID_KEY: WRITER,
            keys.COMMIT_ID_KEY: commit_id or str(uuid.uuid4()),
            keys.RANGES_KEY: json.dumps([[r.partition.key(), r.start, r.end] for r in ranges]),
        },
    )


def _batch(fmt: IcebergFormat, ranges: list[OffsetRange]) -> TableTransaction:
    tx = TableTransaction(fmt, CommitControl(), writer_id=WRITER)
    t = tx.begin()
    files = write(fmt.table, ranges)
    fmt.add_files(t, files)
    tx.stage({f.path for f in files})
    return tx


def _commit(fmt: IcebergFormat, tx: TableTransaction, ranges: list[OffsetRange]) -> bool:
    base = fmt.committed_offsets(WRITER)
    result = tx.commit(
        _metadata(ranges, fmt.files(tx.instant_time)),
        (OffsetsUnchanged(WRITER, base, tx.instant_time),),
    )
    return result.published


def test_iceberg_transaction_appends_each_batch_once_with_the_writers_offsets(
    tmp_path: Path,
) -> None:
    fmt = IcebergFormat(Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).table("ns.t"))
    first = [OffsetRange(P0, 0, 5), OffsetRange(P1, 0, 3)]
    tx = _batch(fmt, first)
    assert _commit(fmt, tx, first)
    assert tx.state is TxState.COMMITTED
    assert fmt.committed_offsets(WRITER) == WriterOffsets({P0: 5, P1: 3})
    assert fmt.is_published(tx.instant_time)
    # the same transaction again (its change, with its commit id, as the pending store keeps
    # it): recognised on the table, not appended twice
    landed = fmt.table.last_commit(WRITER)
    assert landed is not None
    commit_id = landed.commit_id.removeprefix(f"{tx.instant_time}-")
    again = TableTransaction.resume(fmt, CommitControl(), tx.instant_time, writer_id=WRITER)
    assert not again.commit(_metadata(first, [], commit_id), ()).published
    # another change under the same transaction id (another process of the writer began in
    # the same millisecond) is not taken for the published one: its append is refused
    other = TableTransaction.resume(fmt, CommitControl(), tx.instant_time, writer_id=WRITER)
    with pytest.raises(CommitError, match="committed by another commit"):
        other.commit(_metadata(first, []), ())
    assert fmt.committed_offsets(WRITER) == WriterOffsets({P0: 5, P1: 3})

    second = [OffsetRange(P0, 5, 9)]
    tx2 = _batch(fmt, second)
    assert tx2.instant_time > tx.instant_time
    assert _commit(fmt, tx2, second)
    assert table_keys(fmt.table) == expected(OffsetRange(P0, 0, 9), OffsetRange(P1, 0, 3))

    # a replay of the first batch under a new transaction: the catalog's requirement refuses it
    replay = _batch(fmt, first)
    replay_files = fmt.files(replay.instant_time)
    with pytest.raises(OffsetError, match="moved since this batch"), replay:
        replay.commit(_metadata(first, replay_files), ())
    assert replay.state is TxState.ABORTED
    assert not any(Path(f.path.removeprefix("file://")).exists() for f in replay_files)
    assert table_keys(fmt.table) == expected(OffsetRange(P0, 0, 9), OffsetRange(P1, 0, 3))


def test_iceberg_transaction_abort_deletes_the_batches_files_and_commits_nothing(
    tmp_path: Path,
) -> None:
    fmt = IcebergFormat(Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).table("ns.t"))
    ranges = [OffsetRange(P0, 0, 4)]
    tx = _batch(fmt, ranges)
    files = fmt.files(tx.instant_time)
    assert files and all(Path(f.path.removeprefix("file://")).exists() for f in files)
    assert tx.abort()
    assert not any(Path(f.path.removeprefix("file://")).exists() for f in files)
    assert fmt.committed_offsets(WRITER) == WriterOffsets.empty()
    assert table_keys(fmt.table) == []


def test_iceberg_stage_refuses_a_reported_file_without_a_description(tmp_path: Path) -> None:
    fmt = IcebergFormat(Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).table("ns.t"))
    tx = _batch(fmt, [OffsetRange(P0, 0, 2)])
    with pytest.raises(CommitError, match="differ"):
        fmt.stage(tx.instant_time, {"file:///nowhere.parquet"})


def test_iceberg_commit_records_offsets_the_broker_lost_in_its_snapshot_summary(
    tmp_path: Path,
) -> None:
    """A batch cut at the log end at a restart (spark/replay_check.py) keeps the lost span in
    its snapshot, as a Hudi commit keeps it in its metadata."""
    from lakesink.formats.iceberg.snapshots import KEY_LOST

    fmt = IcebergFormat(Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).table("ns.t"))
    ranges = [OffsetRange(P0, 0, 5)]
    tx = _batch(fmt, ranges)
    lost = json.dumps([[P0.key(), 5, 9]])
    plain = _metadata(ranges, fmt.files(tx.instant_time))
    metadata = dataclasses.replace(plain, extra={**plain.extra, keys.LOST_KEY: lost})
    base = fmt.committed_offsets(WRITER)
    assert tx.commit(metadata, (OffsetsUnchanged(WRITER, base, tx.instant_time),)).published
    snapshot = fmt.table.pyiceberg.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.additional_properties[KEY_LOST] == lost
    assert fmt.committed_offsets(WRITER) == WriterOffsets({P0: 5})
