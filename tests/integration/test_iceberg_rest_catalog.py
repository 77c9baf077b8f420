"""Iceberg tables through a REST catalog: Apache Iceberg's own REST catalog server (the
iceberg-open-api test fixtures, tests/integration/rest_catalog.py) on loopback, pyiceberg's
RestCatalog as lakesink's client.

The server knows only the REST spec's commit requirements, so lakesink's append asserts that
`main` is still the snapshot it checked the writer's offsets on; a commit whose base moved is
refused by the server, and lakesink refreshes and checks the offsets again. Scenarios: a stale
base refused and rebased, a stale incarnation's replay refused by the server and never
duplicated, writers committing at once, a lost commit response, the maintenance actions, and
`lakesink ingest` end to end
(the CLI, then a rerun without its Spark checkpoint, two writers on one table), audited against
Kafka with lakesink's audit and with a plain pyiceberg scan; the catalog token never printed.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import Backend, expected, ingest, keys, write
from integration.conftest import ingest_config, run_ingestion, write_config_file
from rest_catalog import RestCatalogServer

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.errors import OffsetError
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.format import open_iceberg_table
from lakesink.formats.iceberg.snapshots import KEY_WRITER_ID, WriterCommit
from lakesink.formats.iceberg.table import CommitOutcome
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

P0 = TopicPartition("events", 0)
OTHER = TopicPartition("clicks", 0)
TOKEN = "lakesink-rest-token-" + uuid.uuid4().hex  # what must never be printed


def R(tp: TopicPartition, start: int, end: int) -> OffsetRange:
    return OffsetRange(tp, start, end)


@pytest.fixture(scope="session")
def rest_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalogServer]:
    """One REST catalog server for the session (a free port, stopped by its PID)."""
    server = RestCatalogServer(tmp_path_factory.mktemp("iceberg-rest"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own in the session's catalog."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def rest(rest_server: RestCatalogServer, tmp_path: Path) -> Backend:
    return Backend(
        CatalogSettings(
            warehouse=str(tmp_path / "wh"),
            kind="rest",
            uri=rest_server.uri,
            properties={"token": TOKEN},
        )
    )


def test_a_commit_on_a_stale_base_is_refused_by_the_server_and_lands_on_the_new_one(
    rest: Backend, namespace: str
) -> None:
    name = f"{namespace}.events"
    a, b = rest.table(name), rest.table(name)
    ingest(a, "wa", [R(P0, 0, 3)])
    b.refresh()
    base = b.pyiceberg.metadata.current_snapshot_id
    ingest(a, "wa", [R(P0, 3, 6)])  # b's view is stale now
    landed = ingest(b, "wb", [R(OTHER, 0, 4)])
    # the first attempt asserted main == base; the server refused it, the second one landed
    assert landed.outcome is CommitOutcome.COMMITTED and landed.attempts == 2
    snap = b.pyiceberg.metadata.snapshot_by_id(landed.snapshot_id)
    assert snap is not None and snap.parent_snapshot_id != base
    fresh = rest.table(name)
    assert keys(fresh) == expected(R(P0, 0, 6), R(OTHER, 0, 4))
    assert fresh.committed_offsets("wa").next_offsets == {P0: 6}
    assert fresh.committed_offsets("wb").next_offsets == {OTHER: 4}


def test_a_stale_incarnation_is_refused_by_the_server_and_never_duplicates(
    rest: Backend, namespace: str
) -> None:
    name = f"{namespace}.events"
    zombie, current = rest.table(name), rest.table(name)
    ingest(current, "w1", [R(P0, 0, 10)])
    # the zombie planned the same batch on the old base: its offsets check passed there, the
    # server refused the commit (main moved), the re-check on the new base finds the replay
    replay = ingest(zombie, "w1", [R(P0, 0, 10)])
    assert replay.outcome is CommitOutcome.REPLAYED and replay.attempts == 2
    with pytest.raises(OffsetError, match=r"events:0 expected 0 found 10"):
        ingest(zombie, "w1", [R(P0, 0, 4)])
    assert keys(rest.table(name)) == expected(R(P0, 0, 10))
    assert len(rest.table(name).pyiceberg.metadata.snapshots) == 1


def test_writers_committing_at_once_each_land_every_batch_once(
    rest: Backend, namespace: str
) -> None:
    name = f"{namespace}.events"
    rest.table(name)  # created before the writers start
    topics = {"wa": TopicPartition("a", 0), "wb": TopicPartition("b", 0)}
    errors: list[BaseException] = []
    attempts: list[int] = []
    barrier = threading.Barrier(len(topics))

    def run(writer: str, tp: TopicPartition) -> None:
        try:
            table = rest.table(name, sleep=lambda s: time.sleep(s / 10))
            for i in range(4):
                table.refresh()
                ranges = [R(tp, i * 3, i * 3 + 3)]
                files = write(table, ranges)
                barrier.wait()  # both commit on the same base
                result = table.commit_append(files, table.begin(writer, ranges).requirement)
                assert result.outcome is CommitOutcome.COMMITTED, result
                attempts.append(result.attempts)
        except BaseException as e:  # reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=item) for item in topics.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    fresh = rest.table(name)
    assert keys(fresh) == expected(R(topics["wa"], 0, 12), R(topics["wb"], 0, 12))
    assert fresh.committed_offsets("wa").next_offsets == {topics["wa"]: 12}
    assert fresh.committed_offsets("wb").next_offsets == {topics["wb"]: 12}
    assert len(fresh.pyiceberg.metadata.snapshots) == 8
    # each round started both on one base: one of the two was refused and retried
    assert sum(attempts) >= len(attempts) + 4, attempts


def test_a_lost_commit_response_is_recognised_by_its_commit_id(
    rest: Backend, namespace: str
) -> None:
    from pyiceberg.exceptions import CommitStateUnknownException

    name = f"{namespace}.events"
    rest.table(name)
    catalog = rest.catalog()
    real, lost = catalog.commit_table, [0]

    def commit_table(table: Any, requirements: Any, updates: Any) -> Any:
        response = real(table, requirements, updates)
        if lost[0] == 0:  # the server committed; the answer never arrives
            lost[0] += 1
            raise CommitStateUnknownException("connection reset after the commit was sent")
        return response

    catalog.commit_table = commit_table  # type: ignore[method-assign]
    from lakesink.formats.iceberg.table import IcebergTable

    table = IcebergTable.open(catalog, name, sleep=lambda s: None)
    result = ingest(table, "w1", [R(P0, 0, 5)], commit_id="c-1")
    assert lost == [1]
    assert result.outcome is CommitOutcome.LANDED_EARLIER and result.attempts == 2
    assert keys(rest.table(name)) == expected(R(P0, 0, 5))


def test_two_starts_at_the_same_moment_share_an_incarnation_and_land_each_batch_once(
    rest: Backend, namespace: str
) -> None:
    """The REST spec has no requirement on a table property: the claim is not atomic there. The
    worst case, forced here: both starts read incarnation n and both set n + 1 (each one's
    commit waits until the other has read). Safe all the same: each append asserts that `main`
    is the snapshot its offsets were checked on, so of two writers with one incarnation each
    batch lands once; a later start fences both."""
    from lakesink.errors import FencedError
    from lakesink.formats.iceberg.table import IcebergTable

    name = f"{namespace}.events"
    rest.table(name)
    both_read = threading.Barrier(2, timeout=60)
    claiming = [True]

    def start() -> IcebergTable:
        catalog = rest.catalog()
        real = catalog.commit_table

        def commit_table(table: Any, requirements: Any, updates: Any) -> Any:
            if claiming[0]:
                both_read.wait()  # the other start has read n too
            return real(table, requirements, updates)

        catalog.commit_table = commit_table  # type: ignore[method-assign]
        return IcebergTable.open(catalog, name, sleep=lambda s: None)

    a, b = start(), start()
    claimed: dict[str, int] = {}
    errors: list[BaseException] = []

    def claim(who: str, table: IcebergTable) -> None:
        try:
            claimed[who] = table.claim_incarnation("w")
        except BaseException as e:  # reported below
            errors.append(e)
            both_read.abort()

    threads = [threading.Thread(target=claim, args=item) for item in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claiming[0] = False
    assert not errors, errors[0]
    assert claimed["a"] == claimed["b"], claimed  # the race the REST catalog cannot refuse

    # both write the same batch, on the same base, with the same incarnation: it lands once
    results = []
    for table in (a, b):
        table.refresh()
    for table in (a, b):
        append = table.begin("w", [R(P0, 0, 10)])
        append.stage(write(table, [R(P0, 0, 10)]))
        results.append((table, append))
    outcomes = [
        table.commit_append(append.files, append.requirement, incarnation=claimed["a"]).outcome
        for table, append in results
    ]
    assert outcomes == [CommitOutcome.COMMITTED, CommitOutcome.REPLAYED], outcomes
    # a start after them fences both
    newest = rest.table(name).claim_incarnation("w")
    assert newest == claimed["a"] + 1
    for table in (a, b):
        with pytest.raises(FencedError, match=f"incarnation {claimed['a']} is fenced"):
            ingest_as(table, R(P0, 10, 20), claimed["a"])
    fresh = rest.table(name)
    assert keys(fresh) == expected(R(P0, 0, 10))
    assert len(fresh.pyiceberg.metadata.snapshots) == 1


def ingest_as(table: Any, r: OffsetRange, incarnation: int) -> Any:
    """One batch of `r` committed as incarnation `incarnation` of writer w, on the table as
    it is now (a transaction's begin refreshes it)."""
    table.refresh()
    append = table.begin("w", [r])
    append.stage(write(table, [r]))
    return table.commit_append(append.files, append.requirement, incarnation=incarnation)


# -- lakesink ingest through the REST catalog ---------------------------------------------------


def _config(
    bootstrap: str, topic: str, folder: Path, server: RestCatalogServer, namespace: str, **kw: Any
) -> LakesinkConfig:
    return ingest_config(
        bootstrap,
        topic,
        folder,
        table__format="iceberg",
        table__name="events",
        iceberg__namespace=namespace,
        iceberg__catalog__kind="rest",
        iceberg__catalog__uri=server.uri,
        iceberg__catalog__properties=f"token={TOKEN}",
        **kw,
    )


def _scan_against_kafka(server: RestCatalogServer, namespace: str, counts: dict[Any, int]) -> None:
    """A plain reference: pyiceberg's own RestCatalog (no lakesink code) scans the table; every
    Kafka offset of every partition is there exactly once."""
    from pyiceberg.catalog.rest import RestCatalog

    table = RestCatalog("reader", uri=server.uri).load_table(f"{namespace}.events")
    rows = table.scan(selected_fields=("kafka_partition", "kafka_offset")).to_arrow()
    got = sorted(
        zip(
            rows.column("kafka_partition").to_pylist(),
            rows.column("kafka_offset").to_pylist(),
            strict=True,
        )
    )
    assert got == sorted((tp.partition, o) for tp, n in counts.items() for o in range(n))


def _audited_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    return int(report.to_json()["readers"]["pyiceberg"])


def test_ingest_through_the_rest_catalog_lands_every_record_once_across_reruns(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    rest_server: RestCatalogServer,
    namespace: str,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("ice-rest")
    counts = produce_sample_events(kafka_bootstrap, topic, 450, 3)
    cfg = _config(
        kafka_bootstrap, topic, tmp_path / "t", rest_server, namespace,
        kafka__max__records__per__batch=200,
    )  # fmt: skip
    conf = write_config_file(cfg, tmp_path / "ingest.toml")
    run = cli(["--debug", "ingest", "--config", str(conf), "--once"])
    assert run.returncode == 0, run.stdout[-3000:]
    assert TOKEN not in run.stdout
    assert _audited_rows(cfg) == 450
    _scan_against_kafka(rest_server, namespace, dict(counts))
    table = open_iceberg_table(cfg.settings, create=False)
    # the server decides where a new table goes: its own warehouse
    assert table.location.startswith(rest_server.warehouse.as_uri())
    assert len(table.pyiceberg.metadata.snapshots) >= 3  # batches of at most 200 records
    current = table.pyiceberg.current_snapshot()
    assert current is not None and current.summary is not None
    last = WriterCommit.from_summary(current.summary.additional_properties)
    assert last is not None and last.offsets.next_offsets == dict(counts)
    # nothing new: no snapshot; more records and Spark's checkpoint lost: the table's offsets
    assert run_ingestion(cfg, spark).nothing_new
    more = produce_sample_events(kafka_bootstrap, topic, 150, 3)
    shutil.rmtree(cfg.checkpoint_location)
    assert run_ingestion(cfg, spark).records == 150
    assert _audited_rows(cfg) == 600
    verify = cli(["verify", "--config", str(conf)])
    assert verify.returncode == 0, verify.stdout[-3000:]
    # Spark opens the same REST catalog (Iceberg's RESTCatalog, with the token) and reads it
    assert "PASS (pyiceberg, duckdb, spark)" in verify.stdout, verify.stdout[-3000:]
    assert TOKEN not in verify.stdout
    _scan_against_kafka(rest_server, namespace, {tp: n + more[tp] for tp, n in counts.items()})


def test_two_writers_share_one_table_through_the_rest_catalog(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    rest_server: RestCatalogServer,
    namespace: str,
) -> None:
    a_topic, b_topic = topic_factory("ice-rest-a"), topic_factory("ice-rest-b")
    produce_sample_events(kafka_bootstrap, a_topic, 120, 2)
    produce_sample_events(kafka_bootstrap, b_topic, 80, 2)
    a = _config(kafka_bootstrap, a_topic, tmp_path / "a", rest_server, namespace, writer__id="a")
    b = _config(kafka_bootstrap, b_topic, tmp_path / "b", rest_server, namespace, writer__id="b")
    assert run_ingestion(a, spark).records == 120
    assert run_ingestion(b, spark).records == 80
    # writer a's offsets lie behind writer b's snapshot: found by walking back the lineage
    produce_sample_events(kafka_bootstrap, a_topic, 60, 2)
    assert run_ingestion(a, spark).records == 60
    assert run_ingestion(b, spark).nothing_new
    table = open_iceberg_table(a.settings, create=False)
    writers = [
        s.summary.additional_properties.get(KEY_WRITER_ID)
        for s in table.pyiceberg.metadata.snapshots
        if s.summary is not None
    ]
    assert writers.count("a") == 2 and writers.count("b") == 1, writers
    assert _audited_rows(a) == 180 and _audited_rows(b) == 80
    assert table.pyiceberg.scan().to_arrow().num_rows == 260


def test_maintenance_through_the_rest_catalog_keeps_rows_and_every_writers_offsets(
    rest: Backend, namespace: str
) -> None:
    """rewrite-data-files, expire-snapshots and remove-orphan-files commit through the REST
    catalog like appends do (the server checks `main` is still the snapshot they planned on):
    rows, each writer's offsets and replay detection survive them."""
    from lakesink.formats.iceberg import services as maint
    from lakesink.formats.iceberg.rewrite import RewriteOptions

    table = rest.table(f"{namespace}.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 4, i * 4 + 4)])
    ingest(table, "wb", [R(OTHER, 0, 2)])
    failed = write(table, [R(P0, 12, 15)])  # a task attempt whose batch was given up
    small = RewriteOptions(small_file_bytes=1 << 20, target_file_bytes=64 << 20)
    result = maint.rewrite_data_files(table, small)
    assert (result.files_before, result.rows) == (4, 14) and result.files_after < 4
    expired = maint.expire_snapshots(table, 0, now_ms=int(time.time() * 1000) + 60_000)
    assert expired.expired and expired.retained >= 1
    gone = maint.remove_orphan_files(table, 0.0, now=time.time() + 3600).deleted
    assert {Path(f.path.removeprefix("file://")).name for f in failed} <= {
        Path(p).name for p in gone
    }
    fresh = rest.table(f"{namespace}.events")
    assert fresh.committed_offsets("wa").next_offsets == {P0: 12}
    assert fresh.committed_offsets("wb").next_offsets == {OTHER: 2}
    assert keys(fresh) == expected(R(P0, 0, 12), R(OTHER, 0, 2))
    assert ingest(fresh, "wa", [R(P0, 8, 12)]).outcome is CommitOutcome.REPLAYED
    assert ingest(fresh, "wa", [R(P0, 12, 13)]).outcome is CommitOutcome.COMMITTED
    assert keys(fresh) == expected(R(P0, 0, 13), R(OTHER, 0, 2))
