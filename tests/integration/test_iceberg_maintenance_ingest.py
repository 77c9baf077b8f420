"""Iceberg maintenance beside and inside real ingestion: the shared broker, `lakesink ingest`
processes and the `lakesink iceberg` commands on one table, audited with pyiceberg (and DuckDB)
against Kafka.

Scenarios (one comment each): expire-snapshots, rewrite-data-files and remove-orphan-files run
as processes, all three at once, again and again while an ingest process commits batch after
batch to the same table (next to another writer's older commit): every record once, and each
writer's offsets still read after expiry; inline maintenance after every commit of an
ingestion with an orphan file in the table: every record once, no orphan left; orphan removal
in a writer's post-commit hook spares a batch of the same writer still in flight, with no
safety window at all; an inline rewrite that keeps losing to concurrent commits gives up, says
so in the log, and the batch it followed stands.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import Backend, expected, keys, write
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig, load_config
from lakesink.engine import writer_state
from lakesink.engine.transaction import TableTransaction
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.format import IcebergFormat, open_iceberg_table
from lakesink.formats.iceberg.maintenance import referenced_files
from lakesink.formats.iceberg.services import MaintenanceRun, iceberg_maintenance_hook
from lakesink.formats.iceberg.snapshots import KEY_MAINTENANCE
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration


def _config(bootstrap: str, topic: str, warehouse: Path, **overrides: Any) -> LakesinkConfig:
    return ingest_config(
        bootstrap, topic, warehouse, table__format="iceberg", table__name="events", **overrides
    )


def _audited_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    readers = report.to_json()["readers"]
    assert len(set(readers.values())) == 1, readers  # every reader sees the same rows
    return int(readers["pyiceberg"])


def _data_files_on_disk(table: IcebergTable) -> set[str]:
    root = Path(table.location.removeprefix("file://")) / "data"
    return {str(p) for p in root.rglob("*.parquet")}


def _json_of(output: str) -> dict[str, Any]:
    """The JSON object a `--json` command printed; its output also carries the log lines of
    pyiceberg's retries (stderr goes to the same capture)."""
    start = re.search(r"^\{", output, re.MULTILINE)
    assert start is not None, output[-3000:]
    value, _ = json.JSONDecoder().raw_decode(output[start.start() :])
    assert isinstance(value, dict)
    return value


def _plain(location: str) -> str:
    """A local file location as a path (`file:///x`, `file:/x` and `/x` alike)."""
    return "/" + location.removeprefix("file:").lstrip("/")


def test_maintenance_commands_while_an_ingest_process_commits_lose_and_duplicate_nothing(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    cli: Callable[..., Any],
) -> None:
    wh = tmp_path / "wh"
    small = {"table__services__clustering__small__file__bytes": 1 << 20}
    # another writer's commit, older than every snapshot the ingest process makes
    other_topic = topic_factory("ice-m-other")
    produce_sample_events(kafka_bootstrap, other_topic, 30, 1)
    other = _config(kafka_bootstrap, other_topic, wh, writer__id="other", **small)
    assert run_ingestion(other, spark).records == 30

    topic = topic_factory("ice-m-live")
    counts = produce_sample_events(kafka_bootstrap, topic, 900, 3)
    cfg = _config(kafka_bootstrap, topic, wh, kafka__max__records__per__batch=30, **small)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    # a file no snapshot references, older than the safety window (a failed attempt's, long ago)
    table = open_iceberg_table(cfg.settings, create=False)
    stale = Path(table.location.removeprefix("file://")) / "data" / "stale-attempt.parquet"
    stale.write_bytes(b"PAR1 left by a task attempt that failed long ago")
    os.utime(stale, (time.time() - 86_400, time.time() - 86_400))

    commands = [
        ["iceberg", "expire-snapshots", "-c", str(conf), "--older-than-hours", "0", "--json"],
        ["iceberg", "rewrite-data-files", "-c", str(conf), "--json"],
        # the window spares the files of the batch the ingest process is writing
        ["iceberg", "remove-orphan-files", "-c", str(conf), "--older-than-hours", "1", "--json"],
    ]
    runs: list[tuple[str, dict[str, Any]]] = []

    def committed() -> int:
        table.refresh()
        return sum(table.committed_offsets(cfg.writer_id).next_offsets.values())

    overlapped = 0  # rounds of the three commands that ran while the writer committed
    with ThreadPoolExecutor(1) as pool, ThreadPoolExecutor(len(commands)) as crew:
        ingest = pool.submit(cli, ["ingest", "--config", str(conf), "--once"], None, 480)
        deadline = time.monotonic() + 300  # Spark's start in a process of its own
        while not committed():  # its first commit landed
            assert not ingest.done(), ingest.result().stdout[-3000:]
            assert time.monotonic() < deadline, "the ingest process committed nothing"
            time.sleep(0.2)
        while not ingest.done():
            before = committed()
            for args, out in zip(commands, list(crew.map(cli, commands)), strict=True):
                if out.returncode != 0:  # a maintenance commit may give up, and say so
                    assert "lost to concurrent commits" in out.stdout, (args, out.stdout[-3000:])
                    continue
                runs.append((args[1], _json_of(out.stdout)))
            overlapped += not ingest.done() and committed() > before
        done = ingest.result()
    assert done.returncode == 0, done.stdout[-3000:]
    # the three commands ran at once, and beside the writer's commits, with work to do
    assert overlapped >= 1, runs
    assert any(r["expired"] for name, r in runs if name == "expire-snapshots"), runs
    assert any(r["snapshot_id"] for name, r in runs if name == "rewrite-data-files"), runs
    removed = {_plain(p) for n, r in runs if n == "remove-orphan-files" for p in r["deleted"]}
    assert str(stale) in removed and not stale.exists()
    for args in commands:  # and once more at rest
        assert cli(args).returncode == 0
    assert _audited_rows(cfg) == 900
    assert _audited_rows(other) == 30
    fresh = open_iceberg_table(cfg.settings, create=False)
    assert {tp.key(): n for tp, n in fresh.committed_offsets(cfg.writer_id).next_offsets.items()} \
        == {tp.key(): n for tp, n in counts.items()}  # fmt: skip
    assert sum(fresh.committed_offsets("other").next_offsets.values()) == 30
    # each writer's offsets still say where to go on: nothing is read twice
    assert run_ingestion(cfg, spark).nothing_new
    assert run_ingestion(other, spark).nothing_new
    assert fresh.pyiceberg.scan().to_arrow().num_rows == 930


def test_inline_maintenance_after_every_commit_keeps_every_record_once_and_no_orphan(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    topic = topic_factory("ice-inline")
    produce_sample_events(kafka_bootstrap, topic, 30, 3)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "wh",
        kafka__max__records__per__batch=60,
        table__services__inline__every__commits=1,
        table__services__inline="cluster,clean",
        table__services__clustering__small__file__bytes=1 << 20,
        table__services__clustering__tier__ratio=0,  # every small file at every run
        table__services__clean__retain__hours=1e-7,
        table__services__orphans__retain__hours=0,
        table__services__orphans__every__hours=0,  # at every run, not at most hourly
    )
    first = run_ingestion(cfg, spark)
    assert first.records == 30 and first.batches == 1
    # a file no snapshot references (a task attempt that failed)
    table = open_iceberg_table(cfg.settings, create=False)
    stray = Path(table.location.removeprefix("file://")) / "data" / "failed-attempt.parquet"
    stray.write_bytes(b"PAR1 left by a failed task attempt")
    produce_sample_events(kafka_bootstrap, topic, 210, 3)
    rest = run_ingestion(cfg, spark)
    assert rest.records == 210 and rest.batches >= 3
    assert _audited_rows(cfg) == 240
    assert not stray.exists()
    table.refresh()
    snaps = table.pyiceberg.metadata.snapshots
    # expiry ran after the last commit: the current snapshot (the last rewrite's) and the
    # writer's newest commit are what is left
    assert len(snaps) == 2, [s.summary for s in snaps]
    current = table.pyiceberg.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary[KEY_MAINTENANCE] == "rewrite-data-files"
    assert int(
        json.loads(table.pyiceberg.properties["lakesink.maintenance.last-expire"])["expired"]
    )
    # the files the rewrites replaced are gone with their snapshots: every data file on disk is
    # one the table references
    referenced = {_plain(p) for p in referenced_files(table.pyiceberg)}
    on_disk = _data_files_on_disk(table)
    assert on_disk and on_disk <= referenced, sorted(on_disk - referenced)[:3]
    assert len(list(table.pyiceberg.scan().plan_files())) == 1  # one file after the rewrite
    assert run_ingestion(cfg, spark).nothing_new  # the writer's offsets survived the expiry


def test_inline_orphan_removal_spares_the_writers_batch_in_flight(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    table = Backend(CatalogSettings(warehouse=str(wh))).table("lakesink.events")
    cfg = load_config(
        None,
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "kafka.topics": "events",
            "value.format": "raw",
            "table.path": str(wh),
            "table.format": "iceberg",
            "table.services.inline.every.commits": "1",
            "table.services.inline": "remove-orphan-files",
            "table.services.orphans.retain.hours": "0",  # no safety window at all
        },
    )
    fmt = IcebergFormat(table)
    ran: list[MaintenanceRun | None] = []
    hook = iceberg_maintenance_hook(table, cfg.settings, in_flight=fmt.in_flight_files)
    p0, p1 = TopicPartition("events", 0), TopicPartition("events", 1)

    def begin(ranges: list[OffsetRange]) -> TableTransaction:
        tx = TableTransaction(
            fmt,
            CommitControl(),
            writer_id="w",
            hooks=[lambda t: ran.append(hook(t))],
        )
        t = tx.begin()
        files = write(table, ranges)
        fmt.add_files(t, files)
        tx.stage({f.path for f in files})
        return tx

    def commit(tx: TableTransaction, ranges: list[OffsetRange]) -> None:
        extra = {
            writer_state.WRITER_ID_KEY: "w",
            writer_state.COMMIT_ID_KEY: f"c{tx.instant_time}",
            writer_state.RANGES_KEY: json.dumps(
                [[r.partition.key(), r.start, r.end] for r in ranges]
            ),
        }
        assert tx.commit(CommitMetadata("INSERT", (), {}, "", extra)).published

    # batch one is in flight (written, staged) while batch two of the same writer commits —
    # the overlap an asynchronous commit gives; a stray file of a failed attempt is not
    in_flight = [OffsetRange(p0, 0, 5)]
    first = begin(in_flight)
    first_files = fmt.files(first.instant_time)
    stray = write(table, [OffsetRange(p0, 0, 5)])
    second = [OffsetRange(p1, 0, 3)]
    commit(begin(second), second)
    assert ran and ran[-1] is not None and ran[-1].orphans is not None
    deleted = set(ran[-1].orphans.deleted)
    assert {_plain(f.path) for f in stray} <= {_plain(p) for p in deleted}
    assert all(Path(_plain(f.path)).exists() for f in first_files)
    commit(first, in_flight)
    assert keys(table) == expected(*in_flight, *second)
    assert fmt.in_flight_files() == []


def test_inline_rewrite_that_keeps_losing_gives_up_without_failing_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pyiceberg.exceptions import CommitFailedException

    from lakesink.formats.iceberg import services as maint

    wh = tmp_path / "wh"
    table = Backend(CatalogSettings(warehouse=str(wh))).table("lakesink.events")
    cfg = load_config(
        None,
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "kafka.topics": "events",
            "value.format": "raw",
            "table.path": str(wh),
            "table.format": "iceberg",
            "table.services.inline.every.commits": "2",
            "table.services.inline": "cluster",
            "table.services.clustering.small.file.bytes": str(1 << 20),
            "table.services.clustering.tier.ratio": "0",
        },
    )
    lost: list[int] = []

    def always_beaten(*args: Any, **kwargs: Any) -> Any:
        lost.append(1)  # a concurrent commit won every time
        raise CommitFailedException("Table has been updated by another process")

    monkeypatch.setattr(maint, "replace_files", always_beaten)
    hook = iceberg_maintenance_hook(table, cfg.settings)
    p0 = TopicPartition("events", 0)
    fmt = IcebergFormat(table)
    runs: list[MaintenanceRun | None] = []
    for i in range(2):
        ranges = [OffsetRange(p0, i * 3, i * 3 + 3)]
        tx = TableTransaction(
            fmt,
            CommitControl(),
            writer_id="w",
            hooks=[lambda t: runs.append(hook(t))],
        )
        t = tx.begin()
        files = write(table, ranges)
        fmt.add_files(t, files)
        tx.stage({f.path for f in files})
        extra = {
            writer_state.WRITER_ID_KEY: "w",
            writer_state.COMMIT_ID_KEY: f"c{t}",
            writer_state.RANGES_KEY: json.dumps([[p0.key(), r.start, r.end] for r in ranges]),
        }
        with caplog.at_level("INFO", logger="lakesink.formats.iceberg.services"):
            assert tx.commit(CommitMetadata("INSERT", (), {}, "", extra)).published
    assert runs[0] is None and runs[1] is not None  # ran after the second commit
    assert len(lost) == 5 and runs[1].rewrite is None
    assert runs[1].errors and "lost to concurrent commits 5 times" in runs[1].errors[0]
    assert "planning again" in caplog.text and "gave up" in caplog.text
    assert keys(table) == expected(OffsetRange(p0, 0, 6))
    assert table.committed_offsets("w").next_offsets == {p0: 6}
