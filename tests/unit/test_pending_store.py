"""PendingCommitStore semantics on SQLite (seed 001's pending_sink_state)."""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakesink.engine.pending.factory import make_pending_store
from lakesink.engine.pending.sqlite import SqlitePendingCommitStore
from lakesink.engine.pending.store import (
    PendingCommit,
    PendingEntryConflictError,
    PendingStatus,
    PendingStoreUnavailableError,
    epochs_to_prune,
)
from lakesink.errors import ConfigError, PendingStoreError
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus

W = "writer-1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlitePendingCommitStore]:
    s = SqlitePendingCommitStore(tmp_path / "pending.db")
    yield s
    s.close()


def test_pre_commit_is_pending_and_readable_back(store: SqlitePendingCommitStore) -> None:
    assert store.pre_commit(W, 1, b"m1") is True
    entry = store.get(W, 1)
    assert entry is not None
    assert (entry.writer_id, entry.epoch, entry.status, entry.metadata) == (
        W, 1, PendingStatus.PENDING, b"m1",
    )  # fmt: skip
    assert entry.created_at.tzinfo is not None and entry.updated_at >= entry.created_at
    assert store.get(W, 2) is None and store.get("other", 1) is None


def test_pre_commit_same_content_is_idempotent(store: SqlitePendingCommitStore) -> None:
    store.pre_commit(W, 1, b"m1")
    assert store.pre_commit(W, 1, b"m1") is False
    store.mark_committed(W, 1)
    assert store.pre_commit(W, 1, b"m1") is False  # a replay after the commit
    assert store.get(W, 1).status is PendingStatus.COMMITTED  # type: ignore[union-attr]


def test_pre_commit_other_content_for_pending_or_committed_epoch_conflicts(
    store: SqlitePendingCommitStore,
) -> None:
    store.pre_commit(W, 1, b"m1")
    with pytest.raises(PendingEntryConflictError, match="epoch 1 of writer 'writer-1'") as e:
        store.pre_commit(W, 1, b"other")
    assert isinstance(e.value, PendingStoreError) and not e.value.retriable
    store.mark_committed(W, 1)
    with pytest.raises(PendingEntryConflictError, match="Committed"):
        store.pre_commit(W, 1, b"other")
    assert store.get(W, 1).metadata == b"m1"  # type: ignore[union-attr]


def test_aborted_epoch_is_replaced_by_a_new_pre_commit(store: SqlitePendingCommitStore) -> None:
    store.pre_commit(W, 3, b"dirty")
    store.mark_aborted(W, 3)
    assert store.pre_commit(W, 3, b"replayed") is True
    entry = store.get(W, 3)
    assert entry is not None and entry.status is PendingStatus.PENDING
    assert entry.metadata == b"replayed"


def test_transitions_and_their_conflicts(store: SqlitePendingCommitStore) -> None:
    store.pre_commit(W, 1, b"a")
    store.pre_commit(W, 2, b"b")
    store.mark_committed(W, 1)
    store.mark_committed(W, 1)  # idempotent
    store.mark_aborted(W, 2)
    store.mark_aborted(W, 2)  # idempotent
    with pytest.raises(PendingEntryConflictError, match="Committed; it cannot become Aborted"):
        store.mark_aborted(W, 1)
    with pytest.raises(PendingEntryConflictError, match="Aborted; it cannot become Committed"):
        store.mark_committed(W, 2)
    with pytest.raises(PendingEntryConflictError, match="not in the pending-commit store"):
        store.mark_committed(W, 9)


def test_pending_in_epoch_order_counts_and_latest_committed(
    store: SqlitePendingCommitStore,
) -> None:
    for epoch in (5, 2, 9, 7):
        store.pre_commit(W, epoch, f"m{epoch}".encode())
    store.pre_commit("other", 1, b"x")
    assert store.latest_committed_epoch(W) is None
    store.mark_committed(W, 2)
    store.mark_committed(W, 5)
    assert [e.epoch for e in store.pending(W)] == [7, 9]
    assert store.count_pending(W) == 2 and store.count_pending("other") == 1
    assert store.latest_committed_epoch(W) == 5


def test_recovery_aborts_dirty_epochs_above_the_committed_one(
    store: SqlitePendingCommitStore,
) -> None:
    for epoch in range(1, 6):
        store.pre_commit(W, epoch, b"m")
    store.mark_committed(W, 1)
    store.mark_committed(W, 2)
    assert store.abort_pending_above(W, 3) == [4, 5]
    assert [e.epoch for e in store.pending(W)] == [3]


def test_prune_keeps_the_newest_committed_and_every_pending(
    store: SqlitePendingCommitStore,
) -> None:
    for epoch in range(1, 8):
        store.pre_commit(W, epoch, b"m")
    for epoch in (1, 2, 4, 5):
        store.mark_committed(W, epoch)
    store.mark_aborted(W, 3)
    # Committed 1 2 4 5, Aborted 3, Pending 6 7; keep the 2 newest committed (4, 5)
    assert store.prune_committed(W, keep_last=2) == 3
    assert [e for e in range(1, 8) if store.get(W, e) is not None] == [4, 5, 6, 7]
    assert store.prune_committed(W, keep_last=2) == 0


def test_epochs_to_prune_edges() -> None:
    c, p, a = PendingStatus.COMMITTED, PendingStatus.PENDING, PendingStatus.ABORTED
    assert epochs_to_prune([(1, c), (2, a), (3, p)], keep_last=0) == [1]  # 2 is above
    assert epochs_to_prune([(1, a), (2, c), (3, p)], keep_last=0) == [1, 2]
    assert epochs_to_prune([(1, c)], keep_last=1) == []
    with pytest.raises(ConfigError):
        epochs_to_prune([], keep_last=-1)


def test_store_survives_pickling_and_reopening(tmp_path: Path) -> None:
    s = SqlitePendingCommitStore(tmp_path / "p.db")
    s.pre_commit(W, 1, b"m")
    copy = pickle.loads(pickle.dumps(s))
    assert copy._conn is None  # connects lazily, in its own process
    assert copy.get(W, 1) is not None
    s.close()
    copy.close()
    assert SqlitePendingCommitStore(tmp_path / "p.db").count_pending(W) == 1


def test_database_is_wal_with_full_sync(store: SqlitePendingCommitStore) -> None:
    store.pre_commit(W, 1, b"m")
    conn = store._connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_unopenable_database_is_unavailable_and_retriable(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(PendingStoreUnavailableError, match="cannot be opened") as e:
        SqlitePendingCommitStore(tmp_path / "dir.db").count_pending(W)
    assert e.value.retriable


def test_negative_epoch_is_refused(store: SqlitePendingCommitStore) -> None:
    with pytest.raises(PendingEntryConflictError, match="non-negative"):
        store.pre_commit(W, -1, b"m")


def test_factory_and_table_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'sqlite', 'postgres'"):
        make_pending_store("redis")
    with pytest.raises(ConfigError, match="path"):
        make_pending_store("sqlite")
    with pytest.raises(ConfigError, match="DSN"):
        make_pending_store("postgres")
    with pytest.raises(ConfigError, match="table name"):
        SqlitePendingCommitStore(tmp_path / "x.db", table="x; drop table y")
    s = make_pending_store("sqlite", path=str(tmp_path / "f.db"), table="custom_pending")
    s.pre_commit(W, 1, b"m")
    s.close()
    rows = sqlite3.connect(tmp_path / "f.db").execute("SELECT count(*) FROM custom_pending")
    assert rows.fetchone()[0] == 1


def test_pending_commit_metadata_round_trips_deterministically() -> None:
    tp = TopicPartition("orders", 3)
    status = WriteStatus(
        instant_time="20250101000000000",
        task_attempt="0.0",
        offset_range=OffsetRange(tp, 10, 20),
        files=(FileWrite("p=1", "fg1", "p=1/fg1_0-1-0_20250101000000000.parquet", 10, 999),),
        records_read=10,
        records_written=10,
    )
    commit = PendingCommit(
        InstantTime("20250101000000000"), (status,), WriterOffsets({tp: 20}), {"batch_id": 7}
    )
    data = commit.to_bytes()
    assert data == commit.to_bytes()
    back = PendingCommit.from_bytes(data)
    assert back.instant_time == commit.instant_time
    assert back.statuses == commit.statuses and back.offsets == commit.offsets
    assert back.extra == {"batch_id": 7}
    with pytest.raises(PendingEntryConflictError, match="corrupted"):
        PendingCommit.from_bytes(b"{}")
