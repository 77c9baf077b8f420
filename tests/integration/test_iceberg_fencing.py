"""Zombie fencing by writer incarnation on Iceberg tables: every start of a writer claims the next
incarnation of its writer id in the table (a table property, through the catalog's optimistic
commit) and every commit requires it to be still its own.

Scenarios (one comment each): concurrent claims on real SQL catalogs (a SQLite file; the
session's PostgreSQL) each get a number of their own; an older coordinator's commit after a
newer one started is refused — though it would be the first commit, so the offsets requirement
alone would let it through — and appends nothing, while the newer one commits; a zombie
`lakesink ingest` process whose batch was in flight when a newer incarnation started fails with
a message naming both incarnations, and the audit against Kafka finds every record once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import Backend, expected, keys, write
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.cli.verify import audit_config
from lakesink.errors import FencedError, LakesinkError
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.coordinator import FILES_KEY, IcebergCoordinator
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.format import IcebergFormat, open_iceberg_table
from lakesink.formats.iceberg.snapshots import KEY_WRITER_ID, WriterCommit, incarnation_key
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    else:
        pg = request.getfixturevalue("postgres_server")
        uri = f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres"
        name = "f" + uuid.uuid4().hex[:10]  # one catalog per test in the shared database
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh"), uri=uri, name=name))


def _statuses(t: str, files: list[DataFileDescription]) -> list[WriteStatus]:
    return [
        WriteStatus(
            instant_time=t,
            task_attempt=f"a{i}",
            files=(FileWrite("", f.path, f.path, f.record_count, f.size_bytes),),
            records_read=f.record_count,
            records_written=f.record_count,
            extra={FILES_KEY: [f.to_json()]},
        )
        for i, f in enumerate(files)
    ]


def _on_disk(path: str) -> bool:
    return Path(path.removeprefix("file://").removeprefix("file:")).exists()


def test_concurrent_claims_each_get_an_incarnation_of_their_own(backend: Backend) -> None:
    backend.table("db.events")  # created before the claims race
    starts = 6
    barrier = threading.Barrier(starts)

    def claim(_: int) -> int:
        table = backend.table("db.events", sleep=lambda s: time.sleep(s / 10))
        barrier.wait(30)
        return table.claim_incarnation("w")

    with ThreadPoolExecutor(starts) as pool:
        claimed = sorted(pool.map(claim, range(starts)))
    assert claimed == list(range(1, starts + 1))
    table = backend.table("db.events")
    assert table.pyiceberg.properties[incarnation_key("w")] == str(starts)
    assert table.writer_incarnation("w") == starts and table.writer_incarnation("x") is None


def test_older_incarnation_is_refused_even_when_it_would_commit_first(backend: Backend) -> None:
    ranges = [OffsetRange(P0, 0, 4), OffsetRange(P1, 0, 2)]
    old = IcebergCoordinator(IcebergFormat(backend.table("db.events")), "w")
    old.start()
    t_old = old.begin_batch(0, ranges)
    assert t_old is not None
    old_files = write(old.format.table, ranges)
    # a newer start of the same writer id (the old driver was thought dead)
    new = IcebergCoordinator(IcebergFormat(backend.table("db.events")), "w")
    new.start()
    assert (old.incarnation, new.incarnation) == (1, 2)
    # the old incarnation commits first: its offsets requirement holds (nothing committed),
    # the incarnation does not
    with pytest.raises(FencedError, match=r"incarnation 1 is fenced.* now 2"):
        old.complete_batch(t_old, 0, ranges, _statuses(t_old.value, old_files), "")
    old.abort(t_old)
    assert keys(backend.table("db.events")) == []
    assert not any(_on_disk(f.path) for f in old_files)
    # checked inside the catalog's commit too: a direct append with the old number is refused
    table = backend.table("db.events")
    with pytest.raises(FencedError, match="incarnation 1 is fenced"):
        table.commit_append(
            write(table, ranges), table.begin("w", ranges).requirement, incarnation=1
        )
    # the new incarnation commits the same ranges: each record once
    t_new = new.begin_batch(0, ranges)
    assert t_new is not None
    new_files = write(new.format.table, ranges)
    new.complete_batch(t_new, 0, ranges, _statuses(t_new.value, new_files), "")
    fresh = backend.table("db.events")
    assert keys(fresh) == expected(*ranges)
    last = fresh.last_commit("w")
    assert last is not None and last.incarnation == 2
    assert fresh.committed_offsets("w").next_offsets == {P0: 4, P1: 2}


def test_zombie_ingest_process_is_fenced_and_the_table_holds_every_record_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("ice-zombie")
    produce_sample_events(kafka_bootstrap, topic, 240, 3)
    wh = tmp_path / "wh"
    # the zombie: its batch is written, then its commit waits (a driver paused, thought dead)
    zombie_cfg = ingest_config(
        kafka_bootstrap,
        topic,
        wh,
        table__format="iceberg",
        table__name="events",
        commit__publish__delay__s=8,
    )
    conf = write_config_file(zombie_cfg, tmp_path / "zombie.toml")
    cfg = zombie_cfg.with_overrides({"commit.publish.delay.s": 0})
    with ThreadPoolExecutor(1) as pool:
        zombie = pool.submit(cli, ["ingest", "--config", str(conf), "--once"])
        deadline = time.monotonic() + 120
        while True:  # until the zombie claimed incarnation 1 and its tasks wrote data files
            assert not zombie.done(), zombie.result().stdout[-3000:]
            assert time.monotonic() < deadline, "the zombie never wrote its batch"
            try:
                table = open_iceberg_table(cfg.settings, create=False)
            except LakesinkError:
                table = None
            if table is not None and table.writer_incarnation(cfg.writer_id) == 1:
                data = Path(table.location.removeprefix("file://")) / "data"
                if any(data.rglob("*.parquet")):
                    break
            time.sleep(0.2)
        # a newer incarnation starts while the zombie's batch is in flight
        successor = IcebergCoordinator(IcebergFormat(table), cfg.writer_id)
        successor.start()
        assert successor.incarnation == 2
        out = zombie.result(timeout=180)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "FencedError" in out.stdout or "fenced" in out.stdout, out.stdout[-3000:]
    assert "incarnation 1 is fenced" in out.stdout and "now 2" in out.stdout, out.stdout[-3000:]
    table.refresh()
    writers = [
        s.summary.additional_properties.get(KEY_WRITER_ID)
        for s in table.pyiceberg.metadata.snapshots
        if s.summary is not None
    ]
    assert cfg.writer_id not in writers  # the zombie committed nothing
    # the writer goes on (incarnation 3): every record once, the offsets from its commits
    assert run_ingestion(cfg, spark).records == 240
    report = audit_config(cfg)
    assert report.ok, report.problems
    readers = report.to_json()["readers"]
    assert readers["pyiceberg"] == 240, readers
    table.refresh()
    snaps = [s for s in table.pyiceberg.metadata.snapshots if s.summary is not None]
    commits = [WriterCommit.from_summary(s.summary.additional_properties) for s in snaps]
    assert {c.incarnation for c in commits if c is not None} == {3}
    assert table.writer_incarnation(cfg.writer_id) == 3
