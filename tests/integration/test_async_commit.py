"""commit.mode=async: the writer pre-commits each batch to a durable pending-commit store and a
committer publishes in order. The driver is killed at every point between pre-commit and
publish, and during recovery itself, with both stores (SQLite and a real PostgreSQL server);
after a restart the exactly-once audit must pass and no epoch may stay Pending."""

from __future__ import annotations

import functools
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import (
    audit_config,
    ingest_config,
    run_side_by_side,
    write_config_file,
)
from interop.compare import assert_java_hudi_agrees

from lakesink.config import LakesinkConfig
from lakesink.engine import writer_state as keys
from lakesink.engine.async_commit import decode
from lakesink.engine.pending.store import PendingStatus
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.iceberg.format import open_iceberg_table
from lakesink.formats.iceberg.snapshots import KEY_COMMIT_ID
from lakesink.kafka.producer import produce_sample_events
from lakesink.spark.pipeline import pending_store_for

pytestmark = pytest.mark.integration
pytest_plugins = ["pg_fixture"]

KILLED = -signal.SIGKILL


def async_config(
    bootstrap: str, topic: str, tmp_path: Path, store: str, dsn: str | None, **overrides: Any
) -> LakesinkConfig:
    extra: dict[str, Any] = {"commit__mode": "async", "commit__pending__store": store, **overrides}
    if dsn:
        extra["postgres__dsn"] = dsn
    return ingest_config(bootstrap, topic, tmp_path / "t", **extra)


def pending_epochs(cfg: LakesinkConfig) -> list[int]:
    store = pending_store_for(cfg.settings.commit)
    try:
        return [e.epoch for e in store.pending(cfg.writer_id)]
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("postgres_dsn"))
    return "sqlite", None


def test_async_ingestion_is_exactly_once_and_leaves_nothing_pending(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    store_kind: tuple[str, str | None],
) -> None:
    from integration.conftest import run_ingestion

    topic = topic_factory("async")
    produce_sample_events(kafka_bootstrap, topic, 1000, 2)
    cfg = async_config(kafka_bootstrap, topic, tmp_path, *store_kind)
    result = run_ingestion(cfg, spark)
    assert result.records == 1000
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 1000
    assert pending_epochs(cfg) == []


# One chain of restarts per store and format, the chains side by side: each run commits a batch
# (recovering what the run before left), then is killed at its point; N+1 driver starts prove
# what N kill-and-restart pairs would. (point, batches let through first)
ASYNC_CHAIN = [
    ("after-reconcile", "1"),  # written and reconciled, never pre-committed: dirty
    ("after-precommit", "1"),  # durable Pending, not published: recovery publishes it
    ("during-recovery", "0"),  # killed while publishing that Pending epoch: the next run does
    ("after-publish", "1"),  # published, never marked Committed: recovery is idempotent
]
# On PostgreSQL the points where its store holds an epoch to recover (the SQLite chain runs every
# point; marking a published epoch Committed twice is the store contract's, in
# test_pending_store_backends.py)
STORE_POINTS = ("after-precommit", "during-recovery")
# Iceberg (table.format=iceberg), (points, store, lose Spark's checkpoint after each kill):
ICEBERG_CHAINS = {
    # One chain of restarts on SQLite: killed with a durable Pending epoch not published (the
    # rerun's recovery publishes it, Spark's replay of the batch commits nothing), then, after
    # that recovery and a batch of its own, killed with an epoch published and never marked
    # Committed (recovery only marks it).
    "iceberg-sqlite-chain": (("after-precommit", "after-publish"), "sqlite", False),
    # Pending on PostgreSQL and without Spark's checkpoint: the source starts after the
    # published epoch
    "iceberg-postgres-without-checkpoint": (("after-precommit",), "postgres", True),
}
# An Iceberg table of keys (write.operation=cdc, merge-on-read): a Pending batch of keys whose
# bucket a foreign rewrite replaced meanwhile is dropped by the next run and read from Kafka
# again over the new files; one Pending is published by the next run as its row delta (its
# position deletes kept by the entry); one published and never marked is only marked; the fold
# audit after every kill. (point, a foreign rewrite of every bucket after the kill)
ICEBERG_KEYED_CHAIN = (
    ("after-precommit", True),
    ("after-precommit", False),
    ("after-publish", False),
)


def test_killed_between_precommit_and_publish_and_in_recovery_each_restart_ends_exactly_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    postgres_dsn: str,
    request: pytest.FixtureRequest,
) -> None:
    """The Hudi chain on the SQLite and on the PostgreSQL store, and the Iceberg chains, side by
    side (each CLI run is mostly one busy process while its JVM starts); a failure names its
    chain. The session's Java Hudi starts (if it has not yet) while they run."""
    hudi_sqlite = tmp_path / "hudi-sqlite"
    chains: dict[str, Callable[[], None]] = {
        f"hudi-{store}": functools.partial(
            _hudi_chain,
            kafka_bootstrap,
            topic_factory("async-chain"),
            tmp_path / f"hudi-{store}",
            store,
            dsn,
            cli,
        )
        for store, dsn in (("sqlite", None), ("postgres", postgres_dsn))
    }
    for name, (points, store, lose_checkpoint) in ICEBERG_CHAINS.items():
        chains[name] = functools.partial(
            _iceberg_chain,
            points,
            lose_checkpoint,
            store,
            postgres_dsn if store == "postgres" else None,
            kafka_bootstrap,
            topic_factory(f"ice-kill-{store}"),
            tmp_path / name,
            cli,
        )
    chains["iceberg-keyed-sqlite"] = functools.partial(
        _iceberg_keyed_chain, kafka_bootstrap, topic_factory("ice-kill-keyed"), tmp_path, cli
    )
    java_hudi: list[Any] = []
    run_side_by_side(
        chains, meanwhile=lambda: java_hudi.append(request.getfixturevalue("java_hudi"))
    )
    # epochs published by recovery, read by Java Hudi too
    assert_java_hudi_agrees(java_hudi[0], str(hudi_sqlite / "t"))


def _hudi_chain(
    kafka_bootstrap: str,
    topic: str,
    folder: Path,
    store: str,
    dsn: str | None,
    cli: Callable[..., Any],
) -> None:
    folder.mkdir()
    records = 1200  # batches of 100: at most two per killed run, the rest for the last run
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    cfg = async_config(
        kafka_bootstrap, topic, folder, store, dsn, kafka__max__records__per__batch=100
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    # On PostgreSQL, only the points where the store holds an epoch to recover: a kill before
    # pre-commit leaves the store untouched, whichever it is (the SQLite chain runs it)
    chain = ASYNC_CHAIN if store == "sqlite" else [c for c in ASYNC_CHAIN if c[0] in STORE_POINTS]
    for point, after_batches in chain:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        if point in ("after-precommit", "during-recovery"):
            assert pending_epochs(cfg), f"{point}: the pre-committed epoch is not Pending"
        report = audit_config(cfg)  # readers see a consistent table before recovery
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink < records, point
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    restarted = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records
    assert pending_epochs(cfg) == []
    assert not HudiTable.open(cfg["table.path"]).timeline().inflight_or_requested()


def _iceberg_config(
    bootstrap: str, topic: str, folder: Path, store: str, dsn: str | None
) -> LakesinkConfig:
    # a writer id of its own: the session's PostgreSQL store is shared by every test
    extra: dict[str, Any] = {
        "commit__mode": "async",
        "commit__pending__store": store,
        "writer__id": topic,
        "kafka__max__records__per__batch": 150,
    }
    if dsn:
        extra["postgres__dsn"] = dsn
    return ingest_config(
        bootstrap, topic, folder / "wh", table__format="iceberg", table__name="events", **extra
    )


def _iceberg_chain(
    points: tuple[str, ...],
    lose_checkpoint: bool,
    store: str,
    dsn: str | None,
    kafka_bootstrap: str,
    topic: str,
    folder: Path,
    cli: Callable[..., Any],
) -> None:
    """Killed between pre-commit and publish (and after publish): the rerun publishes each
    Pending epoch once and the audit against Kafka (pyiceberg's scan) finds every record
    exactly once."""
    folder.mkdir()
    records = 900  # batches of 150: at most two per killed run, the rest for the rerun
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    cfg = _iceberg_config(kafka_bootstrap, topic, folder, store, dsn)
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    pending: list[Any] = []
    for point in points:
        crashed = cli(args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"})
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        published_before = _snapshot_commit_ids(cfg)
        rows_before = _iceberg_rows(cfg)  # the table reads consistently before recovery
        assert rows_before < records, point
        left = [decode(e.metadata) for e in _pending_entries(cfg)]
        assert left, f"{point}: the killed writer left its pre-committed epoch Pending"
        pending += left
        if point == "after-precommit":
            # the killed batch's snapshot does not exist yet, and `status` shows it waiting
            last = left[-1]
            assert not any(i.startswith(f"{last.instant_time.value}-") for i in published_before)
            status = cli(["status", "-c", str(conf), "--json"])
            assert status.returncode == 0, status.stdout[-3000:]
            shown = json.loads(status.stdout)["pending"]["pending_epochs"]
            assert shown == [int(p.instant_time.value) for p in left]
        if lose_checkpoint:
            shutil.rmtree(cfg.checkpoint_location)

    rerun = cli([*args, "--set", "kafka.max.records.per.batch=5000"])  # the rest at once
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert _iceberg_rows(cfg) == records
    assert _pending_entries(cfg) == []
    ids = _snapshot_commit_ids(cfg)
    for p in pending:  # each Pending epoch published exactly once, under its own commit id
        commit_id = p.metadata.extra[keys.COMMIT_ID_KEY]
        assert ids.count(f"{p.instant_time.value}-{commit_id}") == 1, (p.instant_time, ids)
    assert len({i.split("-")[0] for i in ids}) == len(ids)


def _iceberg_keyed_chain(
    kafka_bootstrap: str, topic: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """A change stream into a merge-on-read Iceberg table of keys, killed with a batch Pending
    (its snapshot not there yet) whose buckets another process then rewrites, again with one
    Pending, then with one published and never marked Committed: after every kill the fold
    audit passes (pyiceberg and DuckDB read the fold of the committed ranges by key, every
    referenced file exists); the epoch that lost its buckets is dropped (Aborted, never
    published, its files gone) and its batch read again; each other Pending epoch is published
    once as its row delta; the last run leaves the stream's final rows, its offsets at the
    topic's end."""
    from integration.test_ingest_crashes import _differing, _iceberg_keyed_state

    from lakesink.kafka.client import watermarks
    from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes
    from lakesink.protocol.offsets import TopicPartition

    # few accounts, many changes: most versions after the first batch supersede a stored row
    stream = produce_sample_changes(kafka_bootstrap, topic, 40, 800, 2, seed=37)
    folder = tmp_path / "iceberg-keyed"
    folder.mkdir()
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        folder / "wh",
        table__format="iceberg",
        table__name="accounts",
        value__schema=ACCOUNTS_DDL,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=2,
        iceberg__write__mode="merge-on-read",
        kafka__max__records__per__batch=100,
        commit__mode="async",
        commit__pending__store="sqlite",
        writer__id=topic,
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    pending: list[Any] = []
    dropped: list[Any] = []
    for point, rewrite in ICEBERG_KEYED_CHAIN:
        crashed = cli(args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"})
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        _iceberg_keyed_state(cfg, point)  # the fold audit, before recovery
        left = [decode(e.metadata) for e in _pending_entries(cfg)]
        assert len(left) == 1, (point, left)  # a batch of keys waits for the one before
        assert left[0].rewrite, point  # the entry keeps the row delta's reads and deletes
        if point == "after-precommit":
            ids = _snapshot_commit_ids(cfg)
            assert not any(i.startswith(f"{left[0].instant_time.value}-") for i in ids)
        if rewrite:  # another process rewrites every bucket: the epoch can never land
            _rewrite_every_data_file(cfg)
            _iceberg_keyed_state(cfg, f"{point}, rewritten")
            dropped += left
        else:
            pending += left
    finished = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert finished.returncode == 0, finished.stdout[-3000:]
    got, _, _, positions, report = _iceberg_keyed_state(cfg, "the end")
    assert _pending_entries(cfg) == []
    ids = _snapshot_commit_ids(cfg)
    store = pending_store_for(cfg.settings.commit)
    try:
        for p in dropped:  # dropped, never published, its files gone
            epoch = int(p.instant_time.value)
            entry = store.get(cfg.writer_id, epoch)
            assert entry is not None and entry.status is PendingStatus.ABORTED, entry
            assert not any(i.startswith(f"{p.instant_time.value}-") for i in ids)
            gone = [str(d["path"]) for d in p.data_files]
            assert gone and not any(Path(local_path(f)).exists() for f in gone), gone
    finally:
        store.close()
    for p in pending:  # each Pending epoch published exactly once, under its own commit id
        commit_id = p.metadata.extra[keys.COMMIT_ID_KEY]
        assert ids.count(f"{p.instant_time.value}-{commit_id}") == 1, (p.instant_time, ids)
    assert len({i.split("-")[0] for i in ids}) == len(ids)
    assert positions > 0, "no position deletes: the chain proves less than merge-on-read"
    expected = {k: (r["owner"], r["balance"], r["updated_at"]) for k, r in stream.rows.items()}
    assert got == expected, _differing(expected, got)
    ends = watermarks(kafka_bootstrap, [TopicPartition(topic, p) for p in range(2)])
    assert report.committed == {tp.key(): hi for tp, (_, hi) in ends.items()}, report.committed


def _rewrite_every_data_file(cfg: LakesinkConfig) -> None:
    """Another process's maintenance: every live data file rewritten alone into a new one
    (the table has no position deletes yet), one REPLACE snapshot."""
    from lakesink.formats.iceberg.rewrite import RewriteGroup, RewriteOptions, replace_files

    table = open_iceberg_table(cfg.settings, create=False).pyiceberg
    tasks = list(table.scan().plan_files())
    assert tasks and not any(t.delete_files for t in tasks)
    groups = [
        RewriteGroup(
            t.file.spec_id,
            tuple(t.file.partition[i] for i in range(len(t.file.partition))),
            (t.file,),
        )
        for t in tasks
    ]
    replace_files(table, groups, RewriteOptions(1 << 30, 1 << 30), {"test": "foreign rewrite"})


def local_path(uri: str) -> str:
    return "/" + uri.removeprefix("file:").lstrip("/")


def _pending_entries(cfg: LakesinkConfig) -> list[Any]:
    store = pending_store_for(cfg.settings.commit)
    try:
        return list(store.pending(cfg.writer_id))
    finally:
        store.close()


def _iceberg_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    return int(report.to_json()["readers"]["pyiceberg"])


def _snapshot_commit_ids(cfg: LakesinkConfig) -> list[str]:
    table = open_iceberg_table(cfg.settings, create=False)
    table.refresh()
    return [
        s.summary.additional_properties.get(KEY_COMMIT_ID, "")
        for s in table.pyiceberg.metadata.snapshots
        if s.summary is not None
    ]


def test_postgres_store_down_gives_clear_error_and_loses_nothing(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    postgres_server: Any,
) -> None:
    topic = topic_factory("pgdown")
    produce_sample_events(kafka_bootstrap, topic, 500, 2)
    cfg = async_config(kafka_bootstrap, topic, tmp_path, "postgres", postgres_server.dsn)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    postgres_server.stop()
    try:
        down = cli(args, timeout_s=120)
    finally:
        postgres_server.start()
    assert down.returncode not in (0, KILLED)
    assert "unreachable" in down.stdout or "PendingStore" in down.stdout, down.stdout[-3000:]
    assert audit_config(cfg).ok
    up = cli(args)
    assert up.returncode == 0, up.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 500
