"""`lakesink verify`, `status` and `table show|files|timeline` on Iceberg tables written through
IcebergTable (the shape `lakesink ingest` writes): the audit passes on a table holding every
Kafka record of the writer's committed ranges once (with another writer's snapshot between
its commits), and fails naming the fault on a duplicate and on a gap; the Hudi-only commands
refuse an Iceberg table by name."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import ROWS, ingest, write
from integration.conftest import ingest_config, run_side_by_side, write_config_file
from rich.console import Console

from lakesink.cli.status import collect_status
from lakesink.cli.verify import audit_config
from lakesink.cli.watch import watch_status
from lakesink.config import LakesinkConfig
from lakesink.formats.iceberg.format import open_iceberg_table
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration
pytest_plugins = ["pg_fixture"]


def _config(bootstrap: str, topic: str, warehouse: Path, name: str) -> LakesinkConfig:
    return ingest_config(bootstrap, topic, warehouse, table__format="iceberg", table__name=name)


@pytest.fixture(scope="module")
def produced(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[TopicPartition, int]]:
    topic = "iceberg-verify-" + tmp_path_factory.mktemp("t").name.replace("_", "-")
    return topic, produce_sample_events(kafka_bootstrap, topic, 40, 2)


def test_verify_passes_on_every_record_once_and_fails_on_duplicate_and_gap(
    kafka_bootstrap: str,
    produced: tuple[str, dict[TopicPartition, int]],
    tmp_path: Path,
) -> None:
    topic, counts = produced
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    n0, n1 = counts[p0], counts[p1]
    good = _config(kafka_bootstrap, topic, tmp_path / "wh", "good")
    table = open_iceberg_table(good.settings, ROWS)
    ingest(table, good.writer_id, [OffsetRange(p0, 0, 7), OffsetRange(p1, 0, 5)])
    ingest(table, "other-writer", [OffsetRange(TopicPartition("elsewhere", 0), 0, 3)])
    ingest(table, good.writer_id, [OffsetRange(p0, 7, n0), OffsetRange(p1, 5, n1)])
    report = audit_config(good)  # Spark only where asked (lakesink verify, below)
    assert report.ok, report.problems
    js = report.to_json()
    assert js["readers"] == {"pyiceberg": n0 + n1, "duckdb": n0 + n1}
    assert js["kafka_records"] == n0 + n1 and js["commits"] == 2 and js["snapshots"] == 3
    assert js["committed"] == {p0.key(): n0, p1.key(): n1}
    assert any("Spark" in why for why in js["not_run"])

    dup = _config(kafka_bootstrap, topic, tmp_path / "wh", "dup")
    dtable = open_iceberg_table(dup.settings, ROWS)
    ingest(dtable, dup.writer_id, [OffsetRange(p0, 0, n0), OffsetRange(p1, 0, n1)])
    ingest(dtable, "other-writer", [OffsetRange(p0, 2, 4)])  # the same records again
    report = audit_config(dup)
    assert not report.ok
    assert any("pyiceberg: 2 duplicated records" in p for p in report.problems), report.problems

    gap = _config(kafka_bootstrap, topic, tmp_path / "wh", "gap")
    gtable = open_iceberg_table(gap.settings, ROWS)
    ingest(gtable, gap.writer_id, [OffsetRange(p0, 0, 3), OffsetRange(p1, 0, n1)])
    append = gtable.begin(gap.writer_id, [OffsetRange(p0, 3, n0)])
    append.stage(write(gtable, [OffsetRange(p0, 3, 5)]))  # offsets 5.. never written
    append.commit(vtts_ms=None)
    report = audit_config(gap)
    assert any(
        f"{n0 - 5} Kafka records of committed ranges are not in the table" in p
        for p in report.problems
    ), report.problems


def test_cli_verify_status_and_table_commands_on_an_iceberg_table(
    kafka_bootstrap: str,
    produced: tuple[str, dict[TopicPartition, int]],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic, counts = produced
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    cfg = _config(kafka_bootstrap, topic, tmp_path / "wh", "events")
    table = open_iceberg_table(cfg.settings, ROWS)
    ingest(table, cfg.writer_id, [OffsetRange(p0, 0, counts[p0]), OffsetRange(p1, 0, 4)])
    conf = str(write_config_file(cfg, tmp_path / "ingest.toml"))
    # every command below only reads the table: the verify (a Spark start in the Iceberg
    # reader environment, the longest by far) runs beside the others
    run_side_by_side(
        {
            "verify": lambda: _verify_reads_with_spark(cli, conf, counts[p0] + 4),
            "status and table commands": lambda: _status_and_table_commands(
                cli, cfg, conf, table, (p0, p1), counts, tmp_path
            ),
        }
    )


def _verify_reads_with_spark(cli: Callable[..., Any], conf: str, rows: int) -> None:
    verify = cli(["verify", "-c", conf])
    assert verify.returncode == 0, verify.stdout  # partition 1's committed range: [0, 4)
    # Spark with Iceberg's Java runtime reads it too, in the Iceberg reader environment
    assert f"rows read by spark:{' ' * 17}{rows:,}" in verify.stdout, verify.stdout
    assert "PASS (pyiceberg, duckdb, spark)" in verify.stdout, verify.stdout


def _status_and_table_commands(
    cli: Callable[..., Any],
    cfg: LakesinkConfig,
    conf: str,
    table: Any,
    partitions: tuple[TopicPartition, TopicPartition],
    counts: dict[TopicPartition, int],
    tmp_path: Path,
) -> None:
    p0, p1 = partitions
    status = cli(["status", "-c", conf, "--json"])
    assert status.returncode == 0, status.stdout
    st = json.loads(status.stdout)
    lags = {p["partition"]: (p["committed"], p["lag"]) for p in st["partitions"]}
    assert lags == {p0.key(): (counts[p0], 0), p1.key(): (4, counts[p1] - 4)}
    async_status = cli(["status", "-c", conf, "--set", "commit.mode=async"])
    assert async_status.returncode == 0, async_status.stdout
    assert "async commit: 0 pending epochs" in async_status.stdout, async_status.stdout
    fresh = cli(["status", "-c", conf, "--set", f"table.path={tmp_path / 'none'}"])
    assert fresh.returncode == 0 and "Iceberg table: not created yet" in fresh.stdout, fresh.stdout
    (recent,) = st["table"]["recent"]
    assert (recent["writer"], recent["added_records"]) == (cfg.writer_id, counts[p0] + 4)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    frames = watch_status(cfg, interval_s=0.1, collect=collect_status, console=console, refreshes=1)
    frame = out.getvalue()
    assert frames == 1 and f"total lag {counts[p1] - 4}" in frame, frame
    assert str(recent["snapshot_id"]) in frame and "recent snapshots" in frame, frame
    assert f"{counts[p0] + 4:,} records in " in frame, frame

    location = table.location.removeprefix("file://")
    show = cli(["table", "show", location, "--json"])
    assert show.returncode == 0, show.stdout
    assert json.loads(show.stdout)["records"] == counts[p0] + 4
    timeline = cli(["table", "timeline", location, "--json"])
    assert [r["writer"] for r in json.loads(timeline.stdout)] == [cfg.writer_id]
    files = cli(["table", "files", location, "--json"])
    assert sum(f["records"] for f in json.loads(files.stdout)) == counts[p0] + 4
    warehouse = cli(["table", "show", str(tmp_path / "wh")])
    assert warehouse.returncode != 0 and location in warehouse.stdout, warehouse.stdout
    refused = cli(["table", "clean", location])
    assert refused.returncode != 0
    assert "not for Iceberg tables; see lakesink iceberg expire-snapshots" in refused.stdout, (
        refused.stdout
    )
    refused = cli(["backfill", "--table", location, "--from", str(tmp_path)])
    assert refused.returncode != 0
    assert f"backfill: {location} is an Iceberg table; give the configuration" in refused.stdout, (
        refused.stdout
    )


def test_demo_with_iceberg_ingests_its_sample_events_exactly_once(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    # `lakesink demo --format iceberg`: its own broker, sample events, Spark ingestion into an
    # Iceberg table of a SQLite-catalog warehouse, read back with pyiceberg, the audit's verdict
    lake = str(tmp_path / "lake")  # two Spark sessions: the ingest and the audit's reader
    run = cli(["demo", "--format", "iceberg", "--events", "2000", "--dir", lake], timeout_s=480)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "pyiceberg reads 2,000 rows" in run.stdout, run.stdout[-3000:]
    assert "rows read by spark:" in run.stdout, run.stdout[-3000:]
    assert "PASS (pyiceberg, duckdb, spark)" in run.stdout, run.stdout[-3000:]
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path / "lake" / "iceberg"
    catalog = SqlCatalog(
        "lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    rows = catalog.load_table("lakesink.demo_events").scan().to_arrow()
    partitions, offsets = rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist()
    coords = set(zip(partitions, offsets, strict=True))
    assert rows.num_rows == len(coords) == 2000


def test_verify_names_a_snapshot_summary_of_another_layout(
    kafka_bootstrap: str,
    produced: tuple[str, dict[TopicPartition, int]],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    from iceberg_tables import rows

    topic, _ = produced
    p0 = TopicPartition(topic, 0)
    cfg = _config(kafka_bootstrap, topic, tmp_path / "wh", "layout")
    table = open_iceberg_table(cfg.settings, ROWS)
    ingest(table, cfg.writer_id, [OffsetRange(p0, 0, 3)])
    table.pyiceberg.append(
        rows(p0, 3, 5),
        snapshot_properties={"lakesink.layout": "9", "lakesink.writer-id": cfg.writer_id},
    )
    conf = str(write_config_file(cfg, tmp_path / "ingest.toml"))
    run = cli(["verify", "-c", conf])
    assert run.returncode not in (0, 10), run.stdout
    assert "lakesink summary of layout '9'" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout


@pytest.mark.parametrize("where", ["postgres-catalog", "s3-warehouse"])
def test_verify_reads_with_spark_from_a_postgres_catalog_and_an_s3_warehouse(
    where: str,
    kafka_bootstrap: str,
    produced: tuple[str, dict[TopicPartition, int]],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Spark opens the catalog lakesink wrote (Iceberg's JdbcCatalog on PostgreSQL, or the
    SQLite catalog of a warehouse on S3 through Iceberg's S3FileIO) and reads what pyiceberg
    reads; the credentials reach Spark on its stdin only."""
    topic, counts = produced
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    if where == "postgres-catalog":
        pg = request.getfixturevalue("postgres_server")
        name = "v" + uuid.uuid4().hex[:10]  # one catalog per test in the shared database
        overrides = {
            "iceberg.catalog.uri": f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres",
            "iceberg.catalog.name": name,
        }
        warehouse: Any = tmp_path / "wh"
    else:
        s3 = request.getfixturevalue("s3_server")
        overrides = {
            **s3.storage_config(),
            "storage.s3.path.style": True,
            "iceberg.catalog.uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        }
        warehouse = f"s3://{s3.new_bucket('verify')}/wh"
    cfg = ingest_config(
        kafka_bootstrap, topic, warehouse, table__format="iceberg", table__name="events",
        **{k.replace(".", "__"): v for k, v in overrides.items()},
    )  # fmt: skip
    table = open_iceberg_table(cfg.settings, ROWS)
    ingest(table, cfg.writer_id, [OffsetRange(p0, 0, counts[p0]), OffsetRange(p1, 0, 6)])
    report = audit_config(cfg, spark=True)
    assert report.ok, report.problems
    total = counts[p0] + 6
    assert report.to_json()["readers"]["spark"] == total, report.to_json()
    assert not any("Spark" in why for why in report.to_json()["not_run"]), report.to_json()
