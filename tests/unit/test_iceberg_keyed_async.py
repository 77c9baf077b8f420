"""Iceberg tables of keys (write.operation upsert or cdc) under commit.mode=async and under
zombie fencing, on a real pyiceberg table (SQLite catalog) and pending store, without Spark.

- A pending entry of a batch of keys keeps what its snapshot replaces (the tasks' reports of the
  bucket files they read, replaced or deleted rows of), so the next process publishes it as the
  same overwrite or row delta; one published before the crash but never marked is only marked.
  Both write modes; the table reads back as the fold of every version.
- A batch whose bucket changed since its tasks read it is refused before its pending entry
  (CommitConflictError: the sink writes it again), never pre-committed. A Pending one whose
  bucket changed after it was stored is dropped at the next start once the source is rewound
  to read its batch again, its files deleted; without a rewind it stays Pending (CommitError).
- An older incarnation of the writer id cannot commit its rewrite or row delta (FencedError),
  even as the first commit of its ranges; the table keeps the newer incarnation's rows.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_hudi_upsert import DELETE, INSERT, UPDATE, reference
from test_iceberg_merge_on_read import delete_files, local
from test_iceberg_upsert import (
    Offsets,
    _replace_bucket_files,
    changes,
    commit,
    complete,
    open_table,
    ranges_of,
    reopen,
    table_rows,
    write,
)

from lakesink.engine.async_commit import AsyncCommitter, Rewind, decode
from lakesink.engine.async_commit import ranges_of as committed_ranges
from lakesink.engine.pending.sqlite import SqlitePendingCommitStore
from lakesink.engine.pending.store import PendingStatus
from lakesink.errors import CommitConflictError, CommitError, FencedError
from lakesink.formats import plugin_for
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.keyed import COPY_ON_WRITE, MERGE_ON_READ
from lakesink.formats.iceberg.keyed_writer import BUCKETS_KEY
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.mutation import CHANGE_COLUMNS
from lakesink.protocol.write_status import WriteStatus

WRITER = "w1"


class Process:
    """One writer process on a table of keys: its table, coordinator and async committer (its
    thread runs only between `start_committer` and `stop_committer`)."""

    def __init__(self, table: IcebergTable, store: Path, rewind: Rewind | None = None) -> None:
        self.table = table
        self.coordinator = IcebergCoordinator(IcebergFormat(table), WRITER, query_id="q")
        self.coordinator.operation_type = "UPSERT"  # as the plugin opens a table of keys
        self.committer = AsyncCommitter(
            self.coordinator, SqlitePendingCommitStore(store), rewind=rewind
        )

    def start(self) -> int:
        """Recovery before the first batch, as the pipeline does it."""
        self.coordinator.start(keep=self.committer.pending_instants())
        return self.committer.recover()

    def write(self, batch_id: int, rows: pa.Table) -> tuple[InstantTime, list[WriteStatus]]:
        t = self.coordinator.begin_batch(batch_id, ranges_of(rows))
        assert t is not None
        return t, write(self.coordinator, t, rows)

    def submit(
        self, t: InstantTime, batch_id: int, rows: pa.Table, statuses: list[WriteStatus]
    ) -> None:
        data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
        schema = plugin_for("iceberg").commit_schema(data, "orders")
        prepared = self.coordinator.precommit(t, batch_id, ranges_of(rows), statuses, schema)
        self.committer.submit(prepared)

    def publish_all(self) -> None:
        """The committer thread publishes what is pending, then stops (the sink's gate: the
        next batch of keys plans only after this)."""
        self.committer.start()
        self.committer.drain(timeout_s=60)
        self.committer.close()

    def close(self) -> None:
        self.committer.close()
        self.committer.store.close()


def _snapshot_ids(table: IcebergTable) -> list[int]:
    table.refresh()
    return [s.snapshot_id for s in table.pyiceberg.metadata.snapshots]


@pytest.mark.parametrize("landed", [False, True], ids=["pending", "published-not-marked"])
@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_pending_batch_of_keys_is_published_by_the_next_process_as_its_rewrite(
    tmp_path: Path, mode: str, landed: bool
) -> None:
    store = tmp_path / "pending.sqlite"
    first = Process(open_table(tmp_path / "wh", 2, "ts", mode=mode), store)
    assert first.start() == 0
    o = Offsets()
    batches = [
        changes([o.row(k, INSERT, 1) for k in (1, 2, 3, 4)]),
        # updates and deletes of the first batch's keys: its buckets' files are replaced
        # (copy-on-write) or get position deletes (merge-on-read)
        changes([o.row(1, UPDATE, 2), o.row(2, DELETE, 2), o.row(5, INSERT, 2)]),
        changes([o.row(3, UPDATE, 3), o.row(5, DELETE, 3), o.row(1, UPDATE, 3)]),
    ]
    first.submit(*_written(first, 1, batches[0]))
    first.publish_all()
    first.submit(*_written(first, 2, batches[1]))  # pre-committed; then the process is lost
    (entry,) = first.committer.store.pending(WRITER)
    prepared = decode(entry.metadata)
    assert prepared.rewrite and all(BUCKETS_KEY in r for r in prepared.rewrite)
    if landed:  # published, then killed before the store marked it
        first.coordinator.commit(prepared, run_hooks=False)
    first.close()
    before = _snapshot_ids(reopen(tmp_path / "wh"))
    assert len(before) == (2 if landed else 1)

    second = Process(reopen(tmp_path / "wh"), store)
    assert second.start() == 1
    stored = second.committer.store.get(WRITER, entry.epoch)
    assert stored is not None and stored.status is PendingStatus.COMMITTED
    after = _snapshot_ids(second.table)
    assert after[: len(before)] == before and len(after) == 2  # published once
    assert table_rows(second.table) == reference([b.to_pylist() for b in batches[:2]], "ts")
    if mode == MERGE_ON_READ:  # the row delta's position deletes came from the entry
        assert delete_files(second.table)
    # the writer goes on over the published rewrite
    second.submit(*_written(second, 3, batches[2]))
    second.publish_all()
    assert table_rows(second.table) == reference([b.to_pylist() for b in batches], "ts")
    assert second.committer.store.pending(WRITER) == []
    second.close()


def test_a_batch_of_keys_begins_only_after_the_batch_before_is_published(tmp_path: Path) -> None:
    p = Process(open_table(tmp_path / "wh", 2, "ts"), tmp_path / "pending.sqlite")
    p.start()
    o = Offsets()
    p.submit(*_written(p, 1, changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1)])))
    # an append batch only needs room (commit.max.pending); a batch of keys waits for the
    # publish, which the committer thread does once it runs
    p.committer.wait_before_batch(by_key=False)
    waiting = threading.Thread(target=p.committer.wait_before_batch, kwargs={"by_key": True})
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and _snapshot_ids(p.table) == []
    p.committer.start()
    waiting.join(60)
    assert not waiting.is_alive()
    assert len(_snapshot_ids(p.table)) == 1 and p.committer.store.pending(WRITER) == []
    p.close()


def _written(
    p: Process, batch_id: int, rows: pa.Table
) -> tuple[InstantTime, int, pa.Table, list[WriteStatus]]:
    t, statuses = p.write(batch_id, rows)
    return t, batch_id, rows, statuses


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_batch_whose_bucket_changed_is_refused_before_its_pending_entry(
    tmp_path: Path, mode: str
) -> None:
    p = Process(open_table(tmp_path / "wh", 1, "ts", mode=mode), tmp_path / "pending.sqlite")
    p.start()
    o = Offsets()
    first = changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1)])
    p.submit(*_written(p, 1, first))
    p.publish_all()
    batch = changes([o.row(1, UPDATE, 5), o.row(2, DELETE, 5)])
    t, statuses = p.write(2, batch)
    _replace_bucket_files(p.table)  # a maintenance rewrite lands meanwhile
    before = table_rows(p.table)
    with pytest.raises(CommitConflictError, match="bucket 0 changed since the batch read it"):
        p.submit(t, 2, batch, statuses)
    assert p.committer.store.pending(WRITER) == []  # nothing durable: it can be written again
    assert not p.coordinator.is_precommitted(t)
    p.coordinator.abort(t)
    assert table_rows(p.table) == before
    p.submit(*_written(p, 2, batch))  # the sink's conflict retry, over the rewrite's files
    p.publish_all()
    assert table_rows(p.table) == reference([first.to_pylist(), batch.to_pylist()], "ts")
    p.close()


@pytest.mark.parametrize("rewound", [True, False], ids=["rewound", "cannot-rewind"])
@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_pending_batch_whose_bucket_changed_after_it_was_stored_is_dropped_and_read_again(
    tmp_path: Path, mode: str, rewound: bool
) -> None:
    store = tmp_path / "pending.sqlite"
    first = Process(open_table(tmp_path / "wh", 1, "ts", mode=mode), store)
    first.start()
    o = Offsets()
    batches = [
        changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1)]),
        changes([o.row(1, UPDATE, 5), o.row(2, DELETE, 5), o.row(3, INSERT, 5)]),
    ]
    first.submit(*_written(first, 1, batches[0]))
    first.publish_all()
    first.submit(*_written(first, 2, batches[1]))  # Pending, then the process is lost
    (entry,) = first.committer.store.pending(WRITER)
    prepared = decode(entry.metadata)
    written = [d["path"] for r in prepared.rewrite for d in r.get("iceberg.position-deletes", ())]
    written += [str(d["path"]) for d in prepared.data_files]
    first.close()
    _replace_bucket_files(reopen(tmp_path / "wh"))  # a foreign rewrite lands before the publish
    rows = table_rows(reopen(tmp_path / "wh"))

    asked: list[tuple[int, tuple[Any, ...]]] = []

    def rewind(p: Any) -> bool:
        asked.append((p.batch_id, committed_ranges(p)))
        return rewound

    second = Process(reopen(tmp_path / "wh"), store, rewind)
    if not rewound:  # the source cannot read it again: it stays Pending, nothing is lost
        with pytest.raises(CommitError, match=r"cannot be published.*bucket 0 changed"):
            second.start()
        assert [e.epoch for e in second.committer.store.pending(WRITER)] == [entry.epoch]
        assert all(Path(local(p)).exists() for p in written)
        assert table_rows(second.table) == rows
        second.close()
        return
    assert second.start() == 0
    assert asked == [(2, committed_ranges(prepared))]
    stored = second.committer.store.get(WRITER, entry.epoch)
    assert stored is not None and stored.status is PendingStatus.ABORTED
    assert written and not any(Path(local(p)).exists() for p in written)
    assert table_rows(second.table) == rows == reference([batches[0].to_pylist()], "ts")
    # the source reads the batch again: it lands over the rewrite's files
    second.submit(*_written(second, 2, batches[1]))
    second.publish_all()
    assert table_rows(second.table) == reference([b.to_pylist() for b in batches], "ts")
    second.close()


def _writer(table: IcebergTable) -> IcebergCoordinator:
    coordinator = IcebergCoordinator(IcebergFormat(table), WRITER, query_id="q")
    coordinator.operation_type = "UPSERT"
    coordinator.start()
    return coordinator


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_an_older_incarnation_cannot_commit_its_rewrite_and_the_newer_rows_stay(
    tmp_path: Path, mode: str
) -> None:
    o = Offsets()
    first = changes([o.row(k, INSERT, 1) for k in (1, 2, 3)])
    batch = changes([o.row(1, UPDATE, 5), o.row(2, DELETE, 5), o.row(4, INSERT, 5)])
    old = _writer(open_table(tmp_path / "wh", 2, "ts", mode=mode))
    commit(old, 1, first)
    t_old = old.begin_batch(2, ranges_of(batch))
    assert t_old is not None
    zombie = write(old, t_old, batch)  # its tasks rewrote the buckets; then it paused
    new = _writer(reopen(tmp_path / "wh"))  # a newer start of the same writer id
    assert (old.incarnation, new.incarnation) == (1, 2)
    # first to commit these ranges, so the offsets requirement alone would let it through
    with pytest.raises(FencedError, match=r"incarnation 1 is fenced.* now 2"):
        complete(old, t_old, 2, batch, zombie)
    old.abort(t_old)
    assert table_rows(new.format.table) == reference([first.to_pylist()], "ts")
    # the newer incarnation writes the same ranges; the zombie, trying again, is still fenced
    commit(new, 2, batch)
    snapshots = _snapshot_ids(new.format.table)
    t_again = old.begin_batch(2, ranges_of(batch))
    assert t_again is not None  # it still thinks the ranges are its own to commit
    again = write(old, t_again, batch)
    with pytest.raises(FencedError, match="incarnation 1 is fenced"):
        complete(old, t_again, 2, batch, again)
    old.abort(t_again)
    # the fold of the committed ranges: each version once, the newer incarnation's commit
    table = reopen(tmp_path / "wh")
    assert _snapshot_ids(table) == snapshots
    assert table_rows(table) == reference([first.to_pylist(), batch.to_pylist()], "ts")
    last = table.last_commit(WRITER)
    assert last is not None and last.incarnation == 2
    # nothing the zombie wrote is left: data files, and its position-delete files
    zombie_files = [
        d["path"]
        for s in (*zombie, *again)
        for key in ("iceberg.position-deletes", "files")
        for d in _described(s, key)
    ]
    assert zombie_files and not any(Path(local(p)).exists() for p in zombie_files)


def _described(status: WriteStatus, key: str) -> list[dict[str, Any]]:
    if key == "files":
        return [{"path": f.path} for f in status.files]
    return list(status.extra.get(key, ()))
