"""Iceberg tables through lakesink's format layer, on real catalogs and stores: the SQL catalog on
a SQLite file and on the session's PostgreSQL, warehouses on local disk, on the moto S3 server
and (what lists or deletes files) on Azurite; rows read back with pyiceberg's scan.

Scenarios (one comment each): append with the offsets requirement, replay refused, two writers
interleaving, a concurrent commit retried on the refreshed base, a stale incarnation refused, a
lost commit response recognised by its commit id, recovery by the lineage walk, expiry keeping
each writer's offsets, orphan removal sparing fresh files, and the bad inputs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import Backend, expected, ingest, keys, s3_options, write

from lakesink.errors import CorruptTableError, OffsetError, SchemaMismatchError
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.errors import (
    CatalogNotFoundError,
    CatalogUnavailableError,
    SummaryLayoutError,
)
from lakesink.formats.iceberg.snapshots import KEY_COMMIT_ID, KEY_OFFSETS, KEY_WRITER_ID
from lakesink.formats.iceberg.table import CommitOutcome, IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.storage import ObjectStoreOptions

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
OTHER = TopicPartition("clicks", 0)


def R(tp: TopicPartition, start: int, end: int) -> OffsetRange:
    return OffsetRange(tp, start, end)


@pytest.fixture(params=["sqlite-local", "postgres-local", "sqlite-s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Every backend in turn (see `open_backend`)."""
    yield from open_backend(request, tmp_path, request.param)


@pytest.fixture(params=["sqlite-local", "sqlite-s3", "sqlite-azure"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A local, an S3 and an Azure warehouse (for what lists or deletes files)."""
    yield from open_backend(request, tmp_path, request.param)


def open_backend(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Iterator[Backend]:
    """A fresh catalog: SQLite file + local warehouse, PostgreSQL + local warehouse, or a
    SQLite file + a warehouse on the moto S3 server or on Azurite."""
    if kind == "sqlite-local":
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    elif kind == "postgres-local":
        pg = request.getfixturevalue("postgres_server")
        uri = f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres"
        name = "c" + uuid.uuid4().hex[:10]  # one catalog per test in the shared database
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh"), uri=uri, name=name))
    elif kind == "sqlite-azure":
        azurite = request.getfixturevalue("azurite")
        yield Backend(
            CatalogSettings(
                warehouse=azurite.new_table_uri("wh"),
                uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                storage=ObjectStoreOptions(
                    azure_endpoint=azurite.endpoint, azure_account_key=azurite.account_key
                ),
            )
        )
    else:
        server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket("iceberg")
        yield Backend(
            CatalogSettings(
                warehouse=f"s3://{bucket}/wh",
                uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                storage=s3_options(server),
            )
        )


@pytest.fixture
def local(tmp_path: Path) -> Backend:
    return Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))


def test_append_with_requirement_commits_rows_offsets_and_summary(backend: Backend) -> None:
    table = backend.table("db.events")
    first = ingest(table, "w1", [R(P0, 0, 5), R(P1, 0, 3)])
    assert first.outcome is CommitOutcome.COMMITTED
    second = ingest(table, "w1", [R(P0, 5, 8), R(P1, 3, 3)])
    assert second.outcome is CommitOutcome.COMMITTED
    assert keys(table) == expected(R(P0, 0, 8), R(P1, 0, 3))
    assert table.committed_offsets("w1").next_offsets == {P0: 8, P1: 3}
    # what tasks get does not grow with the history: no snapshots travel to them
    context = table.write_context()
    assert str(first.snapshot_id) not in context.metadata_json
    assert context.metadata().schema() == table.pyiceberg.schema()
    summary = table.pyiceberg.current_snapshot().summary
    assert summary[KEY_WRITER_ID] == "w1" and summary[KEY_OFFSETS] == '{"events:0":8,"events:1":3}'
    assert summary["added-records"] == "3"
    # recovery from a fresh catalog connection reads the same offsets from the lineage
    again = backend.table("db.events")
    assert again.committed_offsets("w1") == table.committed_offsets("w1")


def test_replayed_batch_commits_nothing(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "w1", [R(P0, 0, 5)])
    snapshots = len(table.pyiceberg.metadata.snapshots)
    # Spark re-runs the batch after a restart (new commit id, same ranges): nothing lands
    replay = ingest(table, "w1", [R(P0, 0, 5)])
    assert replay.outcome is CommitOutcome.REPLAYED
    table.refresh()
    assert len(table.pyiceberg.metadata.snapshots) == snapshots
    assert keys(table) == expected(R(P0, 0, 5))


def test_two_writers_interleave_and_each_recovers_its_own_offsets(local: Backend) -> None:
    a, b = local.table("db.events"), local.table("db.events")
    ingest(a, "wa", [R(P0, 0, 4)])
    b.refresh()
    ingest(b, "wb", [R(OTHER, 0, 2)])
    a.refresh()
    ingest(a, "wa", [R(P0, 4, 6)])
    b.refresh()
    ingest(b, "wb", [R(OTHER, 2, 7)])
    fresh = local.table("db.events")
    assert fresh.committed_offsets("wa").next_offsets == {P0: 6}
    assert fresh.committed_offsets("wb").next_offsets == {OTHER: 7}
    assert keys(fresh) == expected(R(P0, 0, 6), R(OTHER, 0, 7))


def test_concurrent_commit_is_retried_on_the_refreshed_base(backend: Backend) -> None:
    a, b = backend.table("db.events"), backend.table("db.events")
    ingest(a, "wa", [R(P0, 0, 3)])
    b.refresh()
    base = b.pyiceberg.metadata.current_snapshot_id
    ingest(a, "wa", [R(P0, 3, 6)])  # b's view is stale now
    landed = ingest(b, "wb", [R(OTHER, 0, 4)])
    assert landed.outcome is CommitOutcome.COMMITTED
    snap = b.pyiceberg.metadata.snapshot_by_id(landed.snapshot_id)
    assert snap is not None and snap.parent_snapshot_id != base  # rebased on a's commit
    assert keys(b) == expected(R(P0, 0, 6), R(OTHER, 0, 4))


def test_stale_incarnation_never_duplicates(local: Backend) -> None:
    zombie, current = local.table("db.events"), local.table("db.events")
    ingest(current, "w1", [R(P0, 0, 10)])
    # the zombie planned the same batch before the new incarnation committed it: the catalog
    # validates the requirement against the metadata it commits on, so nothing lands twice
    replay = ingest(zombie, "w1", [R(P0, 0, 10)])
    assert replay.outcome is CommitOutcome.REPLAYED and replay.attempts == 2
    with pytest.raises(OffsetError, match=r"events:0 expected 0 found 10"):
        ingest(zombie, "w1", [R(P0, 0, 4)])
    assert keys(current) == expected(R(P0, 0, 10))


def _lose_first_response(catalog: Any) -> list[int]:
    """Make the real catalog's first commit land and then lose its response (the connection
    drops after the commit was sent). Returns a counter of lost responses."""
    from pyiceberg.exceptions import CommitStateUnknownException

    real, lost = catalog.commit_table, [0]

    def commit_table(table: Any, requirements: Any, updates: Any) -> Any:
        response = real(table, requirements, updates)
        if lost[0] == 0:
            lost[0] += 1
            raise CommitStateUnknownException("connection reset after the commit was sent")
        return response

    catalog.commit_table = commit_table
    return lost


def test_lost_commit_response_is_recognised_by_its_commit_id(local: Backend) -> None:
    local.table("db.events")  # create it
    catalog = local.catalog()
    lost = _lose_first_response(catalog)
    table = IcebergTable(catalog, catalog.load_table("db.events"), sleep=lambda s: None)
    ranges = [R(P0, 0, 5)]
    files = write(table, ranges)
    result = table.commit_append(files, table.begin("w1", ranges, "c-lost").requirement)
    assert lost == [1]
    assert result.outcome is CommitOutcome.LANDED_EARLIER and result.attempts == 2
    assert result.offsets.next_offsets == {P0: 5}
    fresh = local.table("db.events")
    assert keys(fresh) == expected(R(P0, 0, 5))
    assert fresh.pyiceberg.current_snapshot().summary[KEY_COMMIT_ID] == "c-lost"
    assert all(Path(f.path.removeprefix("file://")).exists() for f in files)


def test_expiry_keeps_each_writers_newest_commit_readable(backend: Backend) -> None:
    table = backend.table("db.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 2, i * 2 + 2)])
    for i in range(3):
        ingest(table, "wb", [R(OTHER, i, i + 1)])
    table.refresh()
    before = {s.snapshot_id for s in table.pyiceberg.metadata.snapshots}
    expired = table.expire_snapshots(older_than_ms=int(time.time() * 1000) + 60_000)
    assert len(expired) == 4 and set(expired) < before
    fresh = backend.table("db.events")
    assert len(fresh.pyiceberg.metadata.snapshots) == 2
    assert fresh.committed_offsets("wa").next_offsets == {P0: 6}
    assert fresh.committed_offsets("wb").next_offsets == {OTHER: 3}
    assert keys(fresh) == expected(R(P0, 0, 6), R(OTHER, 0, 3))
    # and the next batch of each writer still checks against the kept offsets
    assert ingest(fresh, "wa", [R(P0, 6, 7)]).outcome is CommitOutcome.COMMITTED
    with pytest.raises(OffsetError):
        ingest(fresh, "wb", [R(OTHER, 1, 2)])


def test_orphan_removal_spares_fresh_files_and_referenced_ones(store: Backend) -> None:
    backend = store
    table = backend.table("db.events")
    ingest(table, "w1", [R(P0, 0, 4)])
    failed_attempt = write(table, [R(P0, 4, 8)])  # a task attempt whose batch never committed
    opts = backend.settings.storage
    assert table.remove_orphan_files(3600, storage_options=opts) == []  # too fresh to judge
    removed = table.remove_orphan_files(3600, now=time.time() + 7200, storage_options=opts)
    strip = str.removeprefix
    assert {strip(strip(f.path, "file://"), "file:") for f in failed_attempt} <= set(removed)
    assert all("/metadata/" not in p or p.endswith(".avro") for p in removed)
    fresh = backend.table("db.events")
    assert keys(fresh) == expected(R(P0, 0, 4))
    assert ingest(fresh, "w1", [R(P0, 4, 6)]).outcome is CommitOutcome.COMMITTED


def test_abort_deletes_the_described_files(local: Backend) -> None:
    table = local.table("db.events")
    append = table.begin("w1", [R(P0, 0, 3)])
    files = write(table, [R(P0, 0, 3)])
    append.stage(files)
    assert all(Path(f.path.removeprefix("file://")).exists() for f in files)
    append.rollback()
    assert not any(Path(f.path.removeprefix("file://")).exists() for f in files)
    assert table.committed_offsets("w1").next_offsets == {}


def test_missing_catalog_is_a_clear_error(tmp_path: Path) -> None:
    settings = CatalogSettings(
        warehouse=str(tmp_path / "wh"), uri=f"sqlite:///{tmp_path}/nope.db", create=False
    )
    with pytest.raises(CatalogNotFoundError, match=r"no Iceberg catalog at .*nope.db"):
        open_catalog(settings)
    assert not (tmp_path / "nope.db").exists()


def test_unreachable_postgres_catalog_is_a_clear_error_without_the_password(
    tmp_path: Path,
) -> None:
    from s3_server import free_port

    uri = f"postgresql://postgres:s3cret-pw@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    with pytest.raises(CatalogUnavailableError, match="cannot be reached") as e:
        open_catalog(CatalogSettings(warehouse=str(tmp_path), uri=uri))
    assert "s3cret-pw" not in str(e.value) and "postgres:***@" in str(e.value)
    assert e.value.retriable


def test_existing_table_with_a_conflicting_schema_names_the_column(local: Backend) -> None:
    import pyarrow as pa
    from iceberg_tables import ROWS

    local.table("db.events")
    changed = pa.schema(
        [pa.field("amount", pa.string()) if f.name == "amount" else f for f in ROWS]
    )
    with pytest.raises(
        SchemaMismatchError, match=r"column 'amount' is long in the table but string"
    ):
        IcebergTable.open(local.catalog(), "db.events", changed)


def test_corrupted_metadata_file_is_a_clear_error_naming_it(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "w1", [R(P0, 0, 2)])
    metadata = Path(table.pyiceberg.metadata_location.removeprefix("file://"))
    metadata.write_text('{"format-version": 2, "table-uuid": ')
    with pytest.raises(CorruptTableError, match=rf"{metadata.name} cannot be read"):
        local.table("db.events")


def test_summary_of_another_layout_is_refused_on_recovery(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "w1", [R(P0, 0, 2)])
    # a snapshot whose lakesink summary was written in a layout this version does not read
    bad = {"lakesink.layout": "9", "lakesink.writer-id": "w1"}
    table.pyiceberg.append(table.pyiceberg.scan().to_arrow().slice(0, 0), snapshot_properties=bad)
    with pytest.raises(SummaryLayoutError, match=r"layout '9'"):
        local.table("db.events").committed_offsets("w1")


def test_spark_tasks_write_described_files_that_the_driver_commits(
    local: Backend, spark: Any
) -> None:
    from lakesink.formats.iceberg.datafiles import DataFileDescription, write_data_files
    from lakesink.formats.iceberg.snapshots import KEY_VTTS, valid_through

    table = local.table("db.events", partition="kafka_partition, day(kafka_timestamp)")
    context = table.write_context()
    ranges = [R(P0, 0, 40), R(P1, 0, 25), R(OTHER, 0, 10)]

    def write_range(r: tuple[str, int, int, int]) -> list[tuple[dict[str, Any], int]]:
        import pyarrow as pa

        topic, partition, start, end = r
        offsets = list(range(start, end))
        base = 1_700_000_000_000_000
        batch = pa.table(
            {
                "kafka_topic": pa.array([topic] * len(offsets), pa.string()),
                "kafka_partition": pa.array([partition] * len(offsets), pa.int32()),
                "kafka_offset": pa.array(offsets, pa.int64()),
                "kafka_timestamp": pa.array(
                    [base + o * 1_000_000 for o in offsets], pa.timestamp("us", tz="UTC")
                ),
                "amount": pa.array(offsets, pa.int64()),
            }
        )
        table_schema = context.metadata().schema().as_arrow()  # required columns stay so
        batch = batch.cast(pa.schema([table_schema.field(n) for n in batch.column_names]))
        files = write_data_files(context, batch, attempt_id=f"b0-{topic}-{partition}-a0")
        return [(f.to_json(), (base + (end - 1) * 1_000_000) // 1000) for f in files]

    work = [(r.partition.topic, r.partition.partition, r.start, r.end) for r in ranges]
    results = spark.sparkContext.parallelize(work, len(work)).map(write_range).collect()
    files = [DataFileDescription.from_json(d) for per_task in results for d, _ in per_task]
    max_ts = {r.partition: per_task[0][1] for r, per_task in zip(ranges, results, strict=True)}
    vtts = valid_through(max_ts, [r.partition for r in ranges])
    append = table.begin("spark-writer", ranges)
    append.stage(files)
    result = append.commit(vtts_ms=vtts)
    assert result.outcome is CommitOutcome.COMMITTED
    assert keys(table) == expected(*ranges)
    assert table.pyiceberg.current_snapshot().summary[KEY_VTTS] == str(min(max_ts.values()))
    assert len({f.path for f in files}) == len(files) >= len(ranges)


def test_writers_committing_at_once_each_land_every_batch_once(backend: Backend) -> None:
    import threading

    backend.table("db.events")  # created before the writers start
    topics = {"wa": TopicPartition("a", 0), "wb": TopicPartition("b", 0)}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(topics))

    def run(writer: str, tp: TopicPartition) -> None:
        try:
            table = backend.table("db.events", sleep=lambda s: time.sleep(s / 10))
            barrier.wait()
            for i in range(4):
                table.refresh()
                ranges = [R(tp, i * 3, i * 3 + 3)]
                files = write(table, ranges)
                result = table.commit_append(files, table.begin(writer, ranges).requirement)
                assert result.outcome is CommitOutcome.COMMITTED, result
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=item) for item in topics.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    fresh = backend.table("db.events")
    assert keys(fresh) == expected(R(topics["wa"], 0, 12), R(topics["wb"], 0, 12))
    assert fresh.committed_offsets("wa").next_offsets == {topics["wa"]: 12}
    assert fresh.committed_offsets("wb").next_offsets == {topics["wb"]: 12}
    assert len(fresh.pyiceberg.metadata.snapshots) == 8


def test_table_commands_read_a_table_location_on_local_disk_and_on_object_stores(
    store: Backend,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`lakesink table show|timeline|files` take the table's location, catalog-free; on an
    object store with the storage.* settings of the environment, as for Hudi tables."""
    from lakesink.cli.main import main

    table = store.table("db.events")
    ingest(table, "w1", [R(P0, 0, 5), R(P1, 0, 3)])
    ingest(table, "w1", [R(P0, 5, 7)])
    scheme = (
        store.settings.warehouse.split("://", 1)[0] if "://" in store.settings.warehouse else ""
    )
    server = {"s3": "s3_server", "abfss": "azurite"}.get(scheme)
    if server is not None:
        for key, value in request.getfixturevalue(server).storage_config().items():
            env = "LAKESINK_" + key.upper().replace(".", "_")
            monkeypatch.setenv(env, str(value).lower() if isinstance(value, bool) else str(value))
    location = table.location
    assert location.startswith(f"{scheme}://" if server else "file://"), location

    def run(command: str) -> Any:
        assert main(["table", command, location, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    shown = run("show")
    assert (shown["format"], shown["records"]) == ("iceberg", 10), shown
    assert [(r["writer"], r["added_records"]) for r in run("timeline")] == [("w1", 8), ("w1", 2)]
    files = run("files")
    assert sum(f["records"] for f in files) == 10
    assert all(f["path"].startswith(location) for f in files), files
