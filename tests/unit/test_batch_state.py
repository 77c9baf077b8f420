"""The checked states of the commit engine: a streaming batch's in the coordinator
(lakesink.engine.batch_state) and a transaction's (lakesink.engine.transaction). Every legal
move is taken, every illegal one is an InternalError naming both states and changes nothing;
on a local Hudi table, the coordinator's state agrees with the pre-commit mark on storage."""

from __future__ import annotations

import time
from itertools import product
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from lakesink.engine.batch_state import BatchState, OpenBatch
from lakesink.engine.change import TableChange
from lakesink.engine.schema import TableSchema
from lakesink.engine.transaction import TableTransaction, TxState
from lakesink.errors import InternalError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.recovery import is_precommitted
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

B = BatchState
LEGAL_BATCH_MOVES = {
    (B.BEGUN, B.PREPARED),
    (B.BEGUN, B.ABORTED),
    (B.PREPARED, B.PRECOMMITTED),
    (B.PREPARED, B.PUBLISHED),  # sync mode: no pending store
    (B.PREPARED, B.ABORTED),
    (B.PRECOMMITTED, B.PUBLISHED),  # durable: only a publish ends it
}
T = TxState
LEGAL_TX_MOVES = {
    (T.NEW, T.ACTIVE),
    (T.NEW, T.ABORTED),
    (T.ACTIVE, T.STAGED),
    (T.ACTIVE, T.COMMITTED),
    (T.ACTIVE, T.ABORTED),
    (T.STAGED, T.COMMITTED),
    (T.STAGED, T.ABORTED),
}
T0 = InstantTime.from_epoch_ms(1_767_225_600_000)


@pytest.mark.parametrize(("start", "to"), list(product(BatchState, BatchState)))
def test_batch_moves_are_checked(start: BatchState, to: BatchState) -> None:
    batch = OpenBatch(T0, cast(TableTransaction, None), start)
    if (start, to) in LEGAL_BATCH_MOVES:
        batch.move(to)
        assert batch.state is to
        return
    with pytest.raises(InternalError, match=f"from {start.value} to {to.value}"):
        batch.move(to)
    assert batch.state is start


@pytest.mark.parametrize(("start", "to"), list(product(TxState, TxState)))
def test_transaction_moves_are_checked(tmp_path: Path, start: TxState, to: TxState) -> None:
    tx = TableTransaction.resume(
        HudiFormat(_table(tmp_path)), CommitControl(), T0, writer_id="w", state=start
    )
    if (start, to) in LEGAL_TX_MOVES:
        tx._move(to)
        assert tx.state is to
        return
    with pytest.raises(InternalError, match=f"from {start.value} to {to.value}"):
        tx._move(to)
    assert tx.state is start


def test_transaction_refuses_a_second_begin_and_a_commit_after_abort(tmp_path: Path) -> None:
    table = _table(tmp_path)
    tx = TableTransaction(HudiFormat(table), CommitControl(), writer_id="w")
    t = tx.begin()
    with pytest.raises(InternalError, match="from active to active"):
        tx.begin()
    assert [i.time for i in table.timeline().inflight_or_requested()] == [t]
    assert tx.abort()
    with pytest.raises(InternalError, match="from aborted to committed"):
        tx.commit(TableChange("INSERT"))
    with pytest.raises(InternalError, match="from aborted to staged"):
        tx.stage(set())
    assert not table.timeline().completed_data_instants()


# --- the coordinator's batches on a local Hudi table -------------------------------------------
P0 = TopicPartition("events", 0)


def test_sync_batch_goes_begun_prepared_published(tmp_path: Path) -> None:
    table = _table(tmp_path)
    c = _coordinator(table)
    t, statuses = _begin_and_write(c, table, OffsetRange(P0, 0, 5))
    assert c.batch_state(t) is BatchState.BEGUN
    prepared = c.precommit(t, 0, [OffsetRange(P0, 0, 5)], statuses, _schema())
    assert c.batch_state(t) is BatchState.PREPARED and not c.is_precommitted(t)
    with pytest.raises(InternalError, match="from prepared to prepared"):
        c.precommit(t, 0, [OffsetRange(P0, 0, 5)], statuses, _schema())
    before = time.time()
    outcome = c.commit(prepared)
    assert outcome.instant_time == t
    assert before <= outcome.published_at <= time.time()  # when it was published, for the steps
    assert c.batch_state(t) is None  # over: the record is gone
    assert [i.time for i in table.timeline().completed_data_instants()] == [t]


def test_precommitted_batch_agrees_with_the_mark_and_is_never_aborted(tmp_path: Path) -> None:
    table = _table(tmp_path)
    c = _coordinator(table)
    r = OffsetRange(P0, 0, 5)
    t, statuses = _begin_and_write(c, table, r)
    with pytest.raises(InternalError, match="from begun to precommitted"):
        c.mark_precommitted(t)  # not prepared yet: no mark written either
    assert not is_precommitted(table, t)
    prepared = c.precommit(t, 0, [r], statuses, _schema())
    c.mark_precommitted(t)
    assert c.batch_state(t) is BatchState.PRECOMMITTED
    assert c.is_precommitted(t) and is_precommitted(table, t)
    with pytest.raises(InternalError, match="from precommitted to aborted"):
        c.abort(t)
    assert [i.time for i in table.timeline().inflight_or_requested()] == [t]  # not rolled back
    c.commit(prepared)
    assert c.batch_state(t) is None
    assert [i.time for i in table.timeline().completed_data_instants()] == [t]


def test_recovered_epoch_is_published_as_precommitted(tmp_path: Path) -> None:
    """A batch an earlier process pre-committed: this coordinator never held it."""
    table = _table(tmp_path)
    first = _coordinator(table)
    r = OffsetRange(P0, 0, 5)
    t, statuses = _begin_and_write(first, table, r)
    prepared = first.precommit(t, 0, [r], statuses, _schema())
    first.mark_precommitted(t)
    restarted = _coordinator(table)
    assert restarted.batch_state(t) is None and restarted.is_precommitted(t)
    assert restarted.commit(prepared).instant_time == t
    assert restarted.batch_state(t) is None


def test_aborted_batch_is_rolled_back_and_over(tmp_path: Path) -> None:
    table = _table(tmp_path)
    c = _coordinator(table)
    t, _ = _begin_and_write(c, table, OffsetRange(P0, 0, 5))
    c.abort(t)
    assert c.batch_state(t) is None
    assert not table.timeline().inflight_or_requested()
    c.abort(t)  # best effort, repeatable: nothing left to roll back


def test_batch_whose_commit_failed_after_the_publish_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step after the publish failed (markers not deleted): the batch is over, and the
    abort the failure leads to rolls nothing back."""
    table = _table(tmp_path)
    c = _coordinator(table)
    r = OffsetRange(P0, 0, 5)
    t, statuses = _begin_and_write(c, table, r)
    prepared = c.precommit(t, 0, [r], statuses, _schema())

    def fail(self: HudiFormat, instant_time: InstantTime) -> None:
        raise OSError("storage went away")

    monkeypatch.setattr(HudiFormat, "finish", fail)
    with pytest.raises(OSError, match="storage went away"):
        c.commit(prepared)
    assert c.batch_state(t) is None
    c.abort(t)
    assert [i.time for i in table.timeline().completed_data_instants()] == [t]


# --- helpers ------------------------------------------------------------------------------------
def _table(tmp_path: Path) -> HudiTable:
    coords = ("kafka_topic", "kafka_partition", "kafka_offset")
    return HudiTable.create(tmp_path / "t", TableConfig("t", coords, (), version=8))


def _coordinator(table: HudiTable) -> HudiCoordinator:
    return HudiCoordinator(table, "w", control=CommitControl())


def _begin_and_write(
    c: HudiCoordinator, table: HudiTable, r: OffsetRange
) -> tuple[InstantTime, list[WriteStatus]]:
    t = c.begin_batch(0, [r])
    assert t is not None
    writer = PartitionedWriter(table, t, "0-1-0")
    n = r.end - r.start
    writer.write(
        pa.table(
            {
                "kafka_topic": pa.array([r.partition.topic] * n, pa.string()),
                "kafka_partition": pa.array([r.partition.partition] * n, pa.int32()),
                "kafka_offset": pa.array(range(r.start, r.end), pa.int64()),
            }
        )
    )
    files = writer.close()
    return t, [WriteStatus(t.value, "1.0.0", None, tuple(files), n, n)]


def _schema() -> TableSchema:
    return TableSchema('{"type": "record", "name": "t_record", "fields": []}')
