"""commit.mode=async with table.format=iceberg: each batch is pre-committed to the pending-commit
store (its data file descriptions included) and published in order by the committer; a later
process publishes what an earlier one left Pending, once.

The engine's part runs on a real SQLite catalog and store without Spark; the ingestion's part
runs `lakesink ingest` on the shared broker and Spark, with the SQLite and the PostgreSQL store.
The driver killed with SIGKILL between pre-commit and publish (the rerun publishes the Pending
epoch once and the audit against Kafka finds every record exactly once): the Iceberg chains of
test_async_commit.py, side by side with the Hudi ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import BASE_TS_US, Backend, expected, write
from iceberg_tables import keys as table_keys
from integration.conftest import ingest_config, run_ingestion

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.engine.async_commit import AsyncCommitter, decode
from lakesink.engine.pending.sqlite import SqlitePendingCommitStore
from lakesink.engine.pending.store import PendingStatus
from lakesink.errors import CorruptTableError
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.coordinator import FILES_KEY, MAX_TS_KEY, IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat, open_iceberg_table
from lakesink.formats.iceberg.snapshots import KEY_COMMIT_ID
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus
from lakesink.spark.pipeline import pending_store_for

pytestmark = pytest.mark.integration
pytest_plugins = ["pg_fixture"]

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
WRITER = "w1"


# --- the engine, without Spark ---------------------------------------------------------------
class _Process:
    """One writer process: its own catalog connection, table, coordinator and committer."""

    def __init__(self, backend: Backend, store_path: Path) -> None:
        self.table = backend.table("ns.t")
        self.coordinator = IcebergCoordinator(IcebergFormat(self.table), WRITER)
        self.committer = AsyncCommitter(self.coordinator, SqlitePendingCommitStore(store_path))

    def start(self) -> int:
        """Recovery before the first batch: the Pending epochs published, in order."""
        self.coordinator.start(keep=self.committer.pending_instants())
        return self.committer.recover()

    def precommit(self, batch_id: int, ranges: list[OffsetRange]) -> InstantTime:
        """A batch written by its tasks and pre-committed; the committer thread never runs."""
        t = self.coordinator.begin_batch(batch_id, ranges)
        assert t is not None
        statuses = []
        for r in ranges:
            described = write(self.table, [r])
            statuses.append(
                WriteStatus(
                    t.value,
                    f"attempt-{r.partition.key()}",
                    r,
                    files=tuple(
                        FileWrite("", d.path, d.path, d.record_count, d.size_bytes)
                        for d in described
                    ),
                    records_read=r.end - r.start,
                    records_written=sum(d.record_count for d in described),
                    extra={
                        FILES_KEY: [d.to_json() for d in described],
                        MAX_TS_KEY: {r.partition.key(): BASE_TS_US // 1000 + (r.end - 1) * 1000},
                    },
                )
            )
        prepared = self.coordinator.precommit(t, batch_id, ranges, statuses, "")
        self.committer.submit(prepared)
        return t

    def close(self) -> None:
        self.committer.store.close()


def _commit_ids(fmt_table: Any) -> list[str]:
    fmt_table.refresh()
    return [
        s.summary.additional_properties.get(KEY_COMMIT_ID, "")
        for s in fmt_table.pyiceberg.metadata.snapshots
        if s.summary is not None
    ]


def test_pending_epochs_of_a_lost_process_are_published_once_in_order_by_the_next(
    tmp_path: Path,
) -> None:
    backend = Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    store_path = tmp_path / "pending.sqlite"
    first = _Process(backend, store_path)
    assert first.start() == 0
    batches = [[OffsetRange(P0, 0, 5), OffsetRange(P1, 0, 3)], [OffsetRange(P0, 5, 9)]]
    epochs = [first.precommit(i, ranges) for i, ranges in enumerate(batches)]
    assert epochs[0] < epochs[1]  # transaction ids increase although nothing is published yet
    first.close()  # the process is gone: two Pending epochs, no snapshot
    assert table_keys(backend.table("ns.t")) == []

    second = _Process(backend, store_path)
    assert second.start() == 2
    assert table_keys(second.table) == expected(OffsetRange(P0, 0, 9), OffsetRange(P1, 0, 3))
    ids = _commit_ids(second.table)
    assert [i.split("-")[0] for i in ids] == [t.value for t in epochs]  # in order, each once
    assert second.coordinator.committed == WriterOffsets({P0: 9, P1: 3})
    assert second.committer.store.pending(WRITER) == []
    for t in epochs:
        entry = second.committer.store.get(WRITER, int(t.value))
        assert entry is not None and entry.status is PendingStatus.COMMITTED
    # the writer goes on from the published offsets
    third_batch = second.precommit(2, [OffsetRange(P1, 3, 6)])
    second.committer.start()
    second.committer.drain(timeout_s=60)
    second.committer.close()
    second.close()
    assert _commit_ids(second.table)[-1].startswith(third_batch.value)
    assert table_keys(second.table) == expected(OffsetRange(P0, 0, 9), OffsetRange(P1, 0, 6))


def test_an_epoch_published_but_never_marked_committed_is_only_marked_at_recovery(
    tmp_path: Path,
) -> None:
    backend = Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    store_path = tmp_path / "pending.sqlite"
    first = _Process(backend, store_path)
    first.start()
    t = first.precommit(0, [OffsetRange(P0, 0, 4)])
    (entry,) = first.committer.store.pending(WRITER)
    first.coordinator.commit(decode(entry.metadata), run_hooks=False)  # landed, then the crash
    first.close()
    before = _commit_ids(backend.table("ns.t"))
    assert len(before) == 1 and before[0].startswith(t.value)

    second = _Process(backend, store_path)
    assert second.start() == 1  # settled: marked Committed, nothing appended again
    assert _commit_ids(second.table) == before
    assert table_keys(second.table) == expected(OffsetRange(P0, 0, 4))
    stored = second.committer.store.get(WRITER, int(t.value))
    assert stored is not None and stored.status is PendingStatus.COMMITTED
    second.close()


def test_a_pending_epoch_whose_data_file_is_gone_is_refused_not_published(
    tmp_path: Path,
) -> None:
    backend = Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    store_path = tmp_path / "pending.sqlite"
    first = _Process(backend, store_path)
    first.start()
    first.precommit(0, [OffsetRange(P0, 0, 4)])
    (entry,) = first.committer.store.pending(WRITER)
    first.close()
    for d in decode(entry.metadata).data_files:
        Path(str(d["path"]).removeprefix("file://")).unlink()
    second = _Process(backend, store_path)
    with pytest.raises(CorruptTableError, match="is missing"):
        second.start()
    assert table_keys(second.table) == []
    assert [e.epoch for e in second.committer.store.pending(WRITER)] == [entry.epoch]
    second.close()


# --- `lakesink ingest` -------------------------------------------------------------------------
def _config(
    bootstrap: str, topic: str, warehouse: Path, store: str, dsn: str | None, **more: Any
) -> LakesinkConfig:
    # a writer id of its own: the session's PostgreSQL store is shared by every test
    extra: dict[str, Any] = {
        "commit__mode": "async",
        "commit__pending__store": store,
        "writer__id": topic,
        **more,
    }
    if dsn:
        extra["postgres__dsn"] = dsn
    return ingest_config(
        bootstrap, topic, warehouse, table__format="iceberg", table__name="events", **extra
    )


def _pending(cfg: LakesinkConfig) -> list[bytes]:
    store = pending_store_for(cfg.settings.commit)
    try:
        return [e.metadata for e in store.pending(cfg.writer_id)]
    finally:
        store.close()


def _audited_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    return int(report.to_json()["readers"]["pyiceberg"])


def _snapshot_commit_ids(cfg: LakesinkConfig) -> list[str]:
    return _commit_ids(open_iceberg_table(cfg.settings, create=False))


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("postgres_dsn"))
    return "sqlite", None


def test_async_ingest_into_iceberg_is_exactly_once_and_leaves_nothing_pending(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    store_kind: tuple[str, str | None],
) -> None:
    topic = topic_factory("ice-async")
    produce_sample_events(kafka_bootstrap, topic, 600, 3)
    cfg = _config(
        kafka_bootstrap, topic, tmp_path / "wh", *store_kind, kafka__max__records__per__batch=150
    )
    result = run_ingestion(cfg, spark)
    assert result.records == 600
    assert _audited_rows(cfg) == 600
    assert _pending(cfg) == []
    ids = _snapshot_commit_ids(cfg)
    assert len(ids) == result.batches >= 4  # one snapshot per batch, none twice
    assert len({i.split("-")[0] for i in ids}) == len(ids)
    store = pending_store_for(cfg.settings.commit)
    try:
        assert store.latest_committed_epoch(cfg.writer_id) == int(max(ids).split("-")[0])
    finally:
        store.close()
    if store_kind[0] == "sqlite":  # the default store file, under the warehouse
        assert cfg.pending_store_path.is_file()
        assert cfg.pending_store_path.parent == tmp_path / "wh" / ".lakesink" / "pending"
