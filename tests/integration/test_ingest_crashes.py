"""The crash matrix: the driver is killed with SIGKILL at each step of the commit lifecycle
(its JVM and Python workers die with it); a restart must finish or roll back the inflight
instant, and the exactly-once audit (hudi-rs and lakesink's reader against Kafka; pyiceberg and
DuckDB for Iceberg) must pass. On a local Hudi table of appends, an Iceberg table of appends, a
Hudi table on S3 of keys fed a change stream (write.operation=cdc: the fold audit, the table
equals the fold of the committed records by key), a merge-on-read Iceberg table of keys fed
a change stream (position deletes in row-delta snapshots) and a merge-on-read Hudi table of
keys fed one (deltacommits of log files, inline compactions, killed inside them too) the steps
run as one chain of restarts each, on a table, topic and checkpoint of its own, each restart
recovering the previous crash before it is killed at the next step; the five chains run side
by side. (The S3
chain is the change stream's: the commit steps on S3 are the same for appends and upserts, and
an upsert's rewritten file slices and rollbacks are the heavier S3 case.)"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_side_by_side, write_config_file
from integration.table_stores import TableAt, table_at
from interop.compare import assert_java_hudi_agrees

from lakesink.config import LakesinkConfig
from lakesink.faults import COMPACTION_CRASH_POINTS, SYNC_CRASH_POINTS
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.kafka.producer import produce_sample_events
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes
from lakesink.protocol.instant import Action
from lakesink.protocol.offsets import TopicPartition

pytestmark = pytest.mark.integration

KILLED = -signal.SIGKILL
# (point, batches let through first) in chain order: a crash during the rollback of the
# instant the run before left, before any of it is undone, right after a crash that leaves one
CHAIN = [
    ("before-begin", "1"),
    ("after-begin", "1"),
    ("after-write", "1"),
    ("after-reconcile", "1"),
    ("during-rollback", "0"),
    ("after-publish", "1"),
]
assert {p for p, _ in CHAIN} == set(SYNC_CRASH_POINTS)
LEAVES_INFLIGHT = ("after-begin", "after-write", "after-reconcile", "during-rollback")
# Iceberg has no rollback of its own: every other step, in order (after-publish: after the
# catalog commit, before Spark's commit log)
ICEBERG_CHAIN = [(p, "1") for p in SYNC_CRASH_POINTS if p != "during-rollback"]
# The change stream's chain: the same steps, the kill before begin moved after the one after
# publish: that run replays the batch the crash left unrecorded in Spark's commit log and is
# killed before the next one begins, so the replay must leave the table (rows and latest file
# slices) as it was; one run fewer than a separate replay run
CDC_CHAIN = [*CHAIN[1:], ("before-begin", "0")]
assert {p for p, _ in CDC_CHAIN} == set(SYNC_CRASH_POINTS) and CDC_CHAIN[-2][0] == "after-publish"
# The Iceberg change stream's chain: Iceberg's steps with the replay folded in as CDC_CHAIN's
ICEBERG_CDC_CHAIN = [c for c in CDC_CHAIN if c[0] != "during-rollback"]
assert {p for p, _ in ICEBERG_CDC_CHAIN} == {p for p, _ in ICEBERG_CHAIN}
# The merge-on-read Hudi change stream's chain (a compaction every 2 deltacommits): the steps
# of a deltacommit that leave its log files or publish it, and the inline compaction killed
# once its new base files are written (inflight, not committed); each run lets through the
# deltacommits that reach the next compaction. The replay folded in as CDC_CHAIN's. Left out
# for the CI budget (each kill is a CLI run of its own): after-begin (an inflight deltacommit
# without files) and during-rollback, killed in the other Hudi chains, and the compaction's
# earlier steps (plan requested, marked inflight), unit-tested in test_hudi_compaction.py.
MOR_CHAIN = [
    ("after-write", "1"),
    ("after-reconcile", "1"),
    ("compaction-written", "0"),
    ("after-publish", "1"),
    ("before-begin", "0"),
]
assert {p for p, _ in MOR_CHAIN} == set(SYNC_CRASH_POINTS) - {"after-begin", "during-rollback"} | {
    COMPACTION_CRASH_POINTS[-1]
}


# Each table runs the steps as one chain of restarts: N+1 driver starts prove what N
# kill-and-restart pairs would, and every restart also proves it recovers a crash at the
# previous step. Batches take the direct task path (spark/direct.py); the DataFrame path
# (transformations) is killed where a batch's files are written and not yet reconciled, and
# between and after its tables' commits, in test_crashes_between_tables.py.


def test_driver_killed_at_each_commit_step_in_turn_each_restart_recovers_and_ends_exactly_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    """Run N commits one batch and is killed at step N in its second (Hudi's rollback run: in
    rolling back what the run before left); run N+1 must first finish or roll back what run N
    left (else it could not commit its own first batch and reach step N+1). After every kill a
    reader sees a consistent table; the last run, without a crash, lands the rest exactly
    once. The chains `hudi-local` and `iceberg` run side by side (each CLI run is mostly one
    busy process while its JVM starts), with `hudi-cdc-s3` (a change stream upserted by key into
    a table on S3), `iceberg-cdc-mor` (one into a merge-on-read Iceberg table of keys) and
    `hudi-cdc-mor` (one into a merge-on-read Hudi table, killed inside its compactions too); a
    failure names its chain. The session's Java Hudi starts (if it has not yet) while they
    run."""
    hudi_local = _hudi_config("local", kafka_bootstrap, topic_factory, tmp_path, request)
    cdc_s3 = table_at("s3", tmp_path, request, "accounts")
    java_hudi: list[Any] = []
    run_side_by_side(
        {
            "hudi-local": lambda: _hudi_chain(hudi_local, tmp_path / "hudi-local", cli),
            "iceberg": lambda: _iceberg_chain(kafka_bootstrap, topic_factory, tmp_path, cli),
            "hudi-cdc-s3": lambda: _cdc_chain(
                kafka_bootstrap, topic_factory, tmp_path, cdc_s3, cli
            ),
            "iceberg-cdc-mor": lambda: _iceberg_cdc_chain(
                kafka_bootstrap, topic_factory, tmp_path, cli
            ),
            "hudi-cdc-mor": lambda: _mor_chain(kafka_bootstrap, topic_factory, tmp_path, cli),
        },
        meanwhile=lambda: java_hudi.append(request.getfixturevalue("java_hudi")),
    )
    # rolled-back and replayed instants of the local table, read by Java Hudi too
    assert_java_hudi_agrees(java_hudi[0], hudi_local["table.path"])


HUDI_RECORDS = 1500  # 15 batches of 100: two per killed run, the rest for the last run


def _hudi_config(
    store: str,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> LakesinkConfig:
    topic = topic_factory(f"{store}chain")
    produce_sample_events(kafka_bootstrap, topic, HUDI_RECORDS, 3)
    folder = tmp_path / f"hudi-{store}"
    folder.mkdir()
    where = table_at(store, folder, request)
    return ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=100,
        write__path="direct",
        **where.overrides,
    )


def _hudi_chain(cfg: LakesinkConfig, folder: Path, cli: Callable[..., Any]) -> None:
    records = HUDI_RECORDS
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    for point, after_batches in CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        inflight = HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
        assert bool(inflight) == (point in LEAVES_INFLIGHT), (point, inflight)
        # A reader sees a consistent table before recovery.
        report = audit_config(cfg)
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink < records, point
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    restarted = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records
    assert not HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()


def _cdc_chain(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    where: TableAt,
    cli: Any,
) -> None:
    """One chain of runs on a Hudi table of keys fed a Debezium-shaped change stream
    (write.operation=cdc): after every kill the fold audit passes (both readers read the fold
    of the committed records by key, one row a key); the replay of the batch published before
    Spark recorded it changes nothing on the table; the last run leaves exactly the rows the
    stream leaves."""
    topic = topic_factory("cdc-crash")
    # 2031 records (creates, updates, deletes and their tombstones, key changes) over 2
    # partitions; 100 per batch: two per killed run, the rest for the last run
    stream = produce_sample_changes(kafka_bootstrap, topic, 200, 1500, 2, seed=29)
    folder = tmp_path / "hudi-cdc"
    folder.mkdir()
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        value__schema=ACCOUNTS_DDL,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=2,
        kafka__max__records__per__batch=100,
        writer__id="cdc-writer",
        **where.overrides,
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    published: tuple[dict[int, tuple[Any, ...]], set[str], int] | None = None
    unrecorded = -1  # the batch on the table that Spark's commit log lacks
    for point, after_batches in CDC_CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        table = HudiTable.open(cfg.table_storage)
        inflight = table.timeline().inflight_or_requested()
        assert bool(inflight) == (point in LEAVES_INFLIGHT), (point, inflight)
        report = audit_config(cfg)
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink == report.keys, point
        assert report.keys is not None and report.keys > 0, point
        now = (_account_rows(cfg), _latest_base_files(table), len(table.timeline().completed()))
        if published is not None:
            # the batch was replayed (now in Spark's commit log) and skipped: same rows, same
            # latest slices, no new instant
            assert unrecorded in _spark_log(cfg, "commits"), unrecorded
            assert now[0] == published[0], _differing(published[0], now[0])
            assert now[1:] == published[1:], (published[1:], now[1:])
            published = None
        if point == "after-publish":
            published = now
            unrecorded = max(_spark_log(cfg, "offsets"))
            assert unrecorded not in _spark_log(cfg, "commits"), unrecorded
    assert published is None, "the chain never ran the replay after the crash after publish"
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    restarted = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.keys == report.rows_hudi_rs == report.rows_lakesink == len(stream.rows)
    expected = {k: (r["owner"], r["balance"], r["updated_at"]) for k, r in stream.rows.items()}
    got = _account_rows(cfg)
    assert got == expected, _differing(expected, got)
    assert not HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()


def _account_rows(cfg: LakesinkConfig) -> dict[int, tuple[Any, ...]]:
    """The table's accounts as hudi-rs reads them: id → (owner, balance, updated_at)."""
    import pyarrow as pa

    storage = cfg.table_storage
    batches = hudi_rs_batches(str(cfg["table.path"]), storage.reader_options())
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    out = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in rows}
    assert len(out) == len(rows), "hudi-rs reads two rows of one key"
    return out


def _spark_log(cfg: LakesinkConfig, name: str) -> set[int]:
    """The batch ids in Spark's offset log (`offsets`: planned) or commit log (`commits`)."""
    return {int(p.name) for p in (cfg.checkpoint_location / name).iterdir() if p.name.isdigit()}


def _latest_base_files(table: HudiTable) -> set[str]:
    return {s.path for s in FileSystemView(table).latest_base_files()}


def _differing(
    expected: dict[int, tuple[Any, ...]], got: dict[int, tuple[Any, ...]]
) -> dict[int, tuple[Any, ...]]:
    """A few keys whose rows differ, with both sides (a failure's message)."""
    wrong = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    return {k: (expected.get(k), got.get(k)) for k in wrong[:5]}


def _iceberg_chain(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, cli: Any
) -> None:
    """One chain of runs on one Iceberg table: after every kill the table reads consistently
    (every reader the same rows), the next run recovers and goes on, and the last run lands
    the rest: every record once."""
    topic = topic_factory("ice-crash")
    records = 1200  # 100 per batch: two per killed run, the rest for the last run
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    folder = tmp_path / "iceberg"
    folder.mkdir()
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        folder / "wh",
        table__format="iceberg",
        table__name="events",
        kafka__max__records__per__batch=100,
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    seen = 0
    for point, after_batches in ICEBERG_CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        rows = _iceberg_rows(cfg)
        assert seen < rows < records, (point, seen, rows)
        seen = rows
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    finished = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert finished.returncode == 0, finished.stdout[-3000:]
    assert _iceberg_rows(cfg) == records


def _iceberg_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    readers = report.to_json()["readers"]
    assert len(set(readers.values())) == 1, readers  # every reader sees the same rows
    return int(readers["pyiceberg"])


def _iceberg_cdc_chain(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, cli: Any
) -> None:
    """One chain of runs on a merge-on-read Iceberg table of keys fed a change stream
    (write.operation=cdc, iceberg.write.mode=merge-on-read): after every kill the fold audit
    passes with pyiceberg and DuckDB reading the same row of every key, and every delete file
    the table references exists and names a live data file; the replay of the batch published
    before Spark recorded it commits nothing (the same snapshot, the same rows); the last run
    leaves exactly the rows the stream leaves, its offsets at the end of the topic."""
    from lakesink.kafka.client import watermarks

    topic = topic_factory("ice-cdc-crash")
    # few accounts, many changes: from the second batch on, most versions supersede a stored
    # row (a position delete); 100 records per batch, the rest for the last run
    stream = produce_sample_changes(kafka_bootstrap, topic, 40, 800, 2, seed=31)
    folder = tmp_path / "iceberg-cdc"
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
        writer__id="ice-cdc-writer",
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    published: tuple[dict[int, tuple[Any, ...]], int | None, frozenset[str]] | None = None
    unrecorded = -1  # the batch on the table that Spark's commit log lacks
    deleted = 0  # the most position deletes the table held after a kill
    for point, after_batches in ICEBERG_CDC_CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        now = _iceberg_keyed_state(cfg, point)
        deleted = max(deleted, now[3])
        if published is not None:
            # the batch was replayed (now in Spark's commit log) and skipped: same rows, same
            # current snapshot, same data and delete files
            assert unrecorded in _spark_log(cfg, "commits"), unrecorded
            assert now[0] == published[0], _differing(published[0], now[0])
            assert now[1:3] == published[1:], (published[1:], now[1:3])
            published = None
        if point == "after-publish":
            published = now[:3]
            unrecorded = max(_spark_log(cfg, "offsets"))
            assert unrecorded not in _spark_log(cfg, "commits"), unrecorded
    assert published is None, "the chain never ran the replay after the crash after publish"
    assert deleted > 0, "no kill found position deletes on the table: the chain proves less"
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    finished = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert finished.returncode == 0, finished.stdout[-3000:]
    got, _, _, _, report = _iceberg_keyed_state(cfg, "the end")
    assert report.keys == len(stream.rows)
    expected = {k: (r["owner"], r["balance"], r["updated_at"]) for k, r in stream.rows.items()}
    assert got == expected, _differing(expected, got)
    ends = watermarks(kafka_bootstrap, [TopicPartition(topic, p) for p in range(2)])
    assert report.committed == {tp.key(): hi for tp, (_, hi) in ends.items()}, report.committed


def _mor_chain(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, cli: Any
) -> None:
    """One chain of runs on a merge-on-read Hudi table of keys fed a change stream
    (write.operation=cdc, table.type=MERGE_ON_READ, an inline compaction every 2 deltacommits):
    after every kill the fold audit passes, hudi-rs and lakesink's reader reading one row a key
    alike, and the log files of a deltacommit the kill left inflight are deleted by the next
    run's rollback; a compaction killed before its commit is executed again by the next run (it
    is never rolled back), whose attempt deletes the killed attempt's base files; the replay of
    the batch published before Spark recorded it changes nothing; the last run leaves exactly
    the rows the stream leaves."""
    topic = topic_factory("mor-crash")
    # few accounts, many changes: most versions supersede a stored row in a log file; 100
    # records per batch (a deltacommit), the rest for the last run
    stream = produce_sample_changes(kafka_bootstrap, topic, 40, 700, 2, seed=37)
    folder = tmp_path / "hudi-mor"
    folder.mkdir()
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        folder / "accounts",
        value__schema=ACCOUNTS_DDL,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=2,
        table__type="MERGE_ON_READ",
        table__compaction__every__commits=2,  # compactions between the kills
        kafka__max__records__per__batch=100,
        writer__id="mor-writer",
    )
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    published: tuple[dict[int, tuple[Any, ...]], set[Any], int] | None = None
    unrecorded = -1  # the batch on the table that Spark's commit log lacks
    # the files of the instant the last kill left inflight: a deltacommit's log files (the
    # next run rolls it back) or a compaction attempt's base files (the next attempt deletes
    # them before it writes its own)
    failed: set[Path] = set()
    logged = 0  # the most committed log files a kill found on the table
    for point, after_batches in MOR_CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        # this run began by recovering what the kill before left: none of its files remain
        left = sorted(str(p) for p in failed if p.exists())
        assert not left, (point, "files of a failed instant remain", left)
        table = HudiTable.open(cfg.table_storage)
        inflight = table.timeline().inflight_or_requested()
        if point.startswith("compaction-"):
            assert [i.action for i in inflight] == [Action.COMPACTION], (point, inflight)
        else:
            assert bool(inflight) == (point in LEAVES_INFLIGHT), (point, inflight)
        failed = {
            p
            for i in inflight
            for p in folder.joinpath("accounts").rglob(
                f"*_{i.time.value}.log.*"
                if i.action is Action.DELTA_COMMIT
                else f"*_{i.time.value}.parquet"
            )
        }
        writes = ("after-write", "after-reconcile", "compaction-written")
        assert bool(failed) == (point in writes), (point, inflight, failed)
        report = audit_config(cfg)
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink == report.keys, point
        assert report.keys is not None and report.keys > 0, point
        slices = FileSystemView(table).latest_base_files()
        logged = max(logged, sum(len(s.log_paths) for s in slices))
        now = (
            _account_rows(cfg),
            {(s.path, s.log_paths) for s in slices},
            len(table.timeline().completed()),
        )
        if published is not None:
            # the batch was replayed (now in Spark's commit log) and skipped: same rows, same
            # latest slices (base and log files), no new instant
            assert unrecorded in _spark_log(cfg, "commits"), unrecorded
            assert now[0] == published[0], _differing(published[0], now[0])
            assert now[1:] == published[1:], (published[1:], now[1:])
            published = None
        if point == "after-publish":
            published = now
            unrecorded = max(_spark_log(cfg, "offsets"))
            assert unrecorded not in _spark_log(cfg, "commits"), unrecorded
    assert published is None, "the chain never ran the replay after the crash after publish"
    assert logged > 0, "no kill found a log file on the table: the chain proves less"
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    finished = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert finished.returncode == 0, finished.stdout[-3000:]
    assert not [p for p in failed if p.exists()], "files of a failed instant remain"
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.keys == report.rows_hudi_rs == report.rows_lakesink == len(stream.rows)
    expected = {k: (r["owner"], r["balance"], r["updated_at"]) for k, r in stream.rows.items()}
    got = _account_rows(cfg)
    assert got == expected, _differing(expected, got)
    timeline = HudiTable.open(cfg.table_storage).timeline()
    assert not timeline.inflight_or_requested()
    # the compaction between the kills, the killed one and the last run's: each committed
    assert len(timeline.completed(Action.COMMIT)) >= 3, timeline.completed(Action.COMMIT)


def _iceberg_keyed_state(
    cfg: LakesinkConfig, point: str
) -> tuple[dict[int, tuple[Any, ...]], int | None, frozenset[str], int, Any]:
    """The fold audit of the Iceberg table of keys passed, pyiceberg and DuckDB reading one
    row a key alike (it compares them by key), and every file the current snapshot references
    is there, each delete file naming a live data file. Returns pyiceberg's accounts (id →
    (owner, balance, updated_at)), the current snapshot id, the paths of its data and delete
    files, the position deletes it holds and the report."""
    from lakesink.formats.iceberg.format import open_iceberg_table
    from lakesink.formats.iceberg.rowdelta import PATH_FIELD_ID

    report = audit_config(cfg)
    assert report.ok, (point, report.problems)
    assert report.keys is not None and report.keys > 0, point
    assert report.readers == {"pyiceberg": report.keys, "duckdb": report.keys}, point
    table = open_iceberg_table(cfg.settings, create=False).pyiceberg
    rows = table.scan(selected_fields=("id", "owner", "balance", "updated_at")).to_arrow()
    accounts = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in rows.to_pylist()}
    snapshot = table.current_snapshot()
    assert snapshot is not None, point
    data: set[str] = set()
    deletes: dict[str, str | None] = {}  # delete file -> the data file it names
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            if f.content.value == 0:  # data
                data.add(f.file_path)
            else:
                lower = (f.lower_bounds or {}).get(PATH_FIELD_ID)
                upper = (f.upper_bounds or {}).get(PATH_FIELD_ID)
                deletes[f.file_path] = lower.decode() if lower and lower == upper else None
    stray = {d: named for d, named in deletes.items() if named not in data}
    assert not stray, (point, "delete files naming no live data file", stray)
    missing = [p for p in sorted(data | deletes.keys()) if not table.io.new_input(p).exists()]
    assert not missing, (point, "referenced files missing", missing[:3])
    summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    positions = int(summary.get("total-position-deletes", 0))
    return accounts, snapshot.snapshot_id, frozenset(data | deletes.keys()), positions, report


def test_broker_restart_between_runs_loses_nothing(
    fresh_broker: Any, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "restart", 500, 2)
    cfg = ingest_config(bootstrap, "restart", tmp_path / "t")
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    assert (
        cli(
            args, env={"LAKESINK_CRASH_AT": "after-write", "LAKESINK_CRASH_AFTER_BATCHES": "0"}
        ).returncode
        == KILLED
    )
    fresh_broker.restart()
    produce_sample_events(bootstrap, "restart", 100, 2, first_event_id=500, create=False)
    run = cli(args)
    assert run.returncode == 0, run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600


def test_replayed_batch_beyond_a_log_end_that_moved_back_fails_in_one_line_or_is_cut_and_recorded(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    """A batch planned, then the broker lost its last acknowledged records (its log end moved
    back; simulated by the batch's planned end moved past the log end in Spark's offset log):
    the restart stops in one line naming the partition, both ends and kafka.fail.on.data.loss;
    with it false the batch ends at the log end, the loss is in the commit and in status, and
    records the broker takes at those offsets later are ingested, not passed over."""
    import json

    from lakesink.formats.hudi.audit import completed_commits
    from lakesink.formats.hudi.writer_state import LOST_KEY

    topic = topic_factory("logend")
    produce_sample_events(kafka_bootstrap, topic, 300, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=100)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    crashed = cli(
        args, env={"LAKESINK_CRASH_AT": "after-begin", "LAKESINK_CRASH_AFTER_BATCHES": "1"}
    )
    assert crashed.returncode == KILLED, crashed.stdout[-3000:]
    planned = cfg.checkpoint_location / "offsets" / "1"
    lines = planned.read_text().splitlines()
    offset = json.loads(lines[2])
    assert offset["ranges"] == {f"{topic}:0": [100, 200]}
    offset["ranges"][f"{topic}:0"] = [100, 304]  # planned when the log held 304 records
    planned.write_text("\n".join([*lines[:2], json.dumps(offset)]) + "\n")
    (planned.parent / ".1.crc").unlink()

    refused = cli(args)
    assert refused.returncode == 5, refused.stdout[-3000:]
    error = [ln for ln in refused.stdout.splitlines() if ln.startswith("lakesink: error:")]
    assert len(error) == 1 and "Traceback" not in refused.stdout, refused.stdout[-3000:]
    assert f"{topic}:0 was planned to end at 304 but the log ends at 300" in error[0]
    assert "kafka.fail.on.data.loss=false" in error[0]

    cut = cli([*args, "--set", "kafka.fail.on.data.loss=false"])
    assert cut.returncode == 0, cut.stdout[-3000:]
    commits = completed_commits(HudiTable.open(cfg.table_storage))
    lost = [json.loads(m.extra[LOST_KEY]) for _, m in commits if LOST_KEY in m.extra]
    assert lost == [[[f"{topic}:0", 300, 304]]]
    status = cli(["status", "--config", str(conf), "--json"])
    assert json.loads(status.stdout)["lost"][0]["records"] == 4, status.stdout[-3000:]
    # the broker takes new records at the offsets it lost: they are read, not passed over
    produce_sample_events(kafka_bootstrap, topic, 10, 1, first_event_id=300, create=False)
    assert cli(args).returncode == 0
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == 310
