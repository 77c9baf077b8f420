"""Java Hudi (Spark with the Hudi bundle, in the interop environment) returns exactly the rows
hudi-rs and lakesink's reader return, for every kind of table lakesink writes: versions 6 and 8,
many commits and partitions, unpartitioned and two-level partitioned, a rollback, an inflight
instant with its files, clustering (done and pending), clean, archival into packs, a late
backfill, and the golden fixtures. Queries: snapshot with the metadata table on and off, Spark
SQL, time travel to every retained instant, incremental reads between instants. The tables are
built once and all reads go to the JVM in one round trip."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from integration.test_hudi_rs_compat import _Clock, _rows, build_table
from integration.test_multi_writer import commit_one_batch, services_for
from interop.compare import Query, check_tables, plan_reads
from interop.java_hudi import JavaHudi

from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import (
    ClusteringOptions,
    cluster,
    schedule_clustering,
)
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TABLES = [
    "compat_v6",
    "compat_v8",
    "golden_v6",
    "golden_v8",
    "services_v6",
    "services_v8",
    "backfill_v8",
    "unpartitioned_v8",
    "two_levels_v6",
]
LIGHT = {"unpartitioned_v8", "two_levels_v6"}  # incremental reads from the start only


def _svc_table(path: Path, version: int) -> HudiTable:
    cfg = TableConfig(
        name=path.name,
        record_key_fields=("kafka_topic", "kafka_partition", "kafka_offset"),
        partition_fields=("kafka_partition",),
        version=8 if version == 8 else 6,
    )
    return HudiTable.create(path, cfg)


def _services_table(path: Path, version: int) -> set[tuple[str, str]]:
    """Streamed batches, clustering, clean, more batches, archival into small packs, more
    batches and a second archival: the table services' instants all on one timeline; last, a
    clustering scheduled and left pending (its writer died). Returns that plan's file groups."""
    table = _svc_table(path, version)
    services = services_for(path, "filesystem", None, "w-a")
    coord = HudiCoordinator(table, "w-a", control=services)
    coord.start()
    for b in range(8):
        commit_one_batch(coord, "topic-a", b)
    cluster(table, services, ClusteringOptions(min_files=2))
    clean(table, services, RetainPolicy(commits=1))
    for b in range(8, 14):
        commit_one_batch(coord, "topic-a", b)
    policy = ArchivePolicy(min_instants=3, max_instants=4, pack_files=2, pack_fan_in=2)
    assert archive(table, services, policy).archived
    for b in range(14, 18):
        commit_one_batch(coord, "topic-a", b)
    clean(table, services, RetainPolicy(commits=2))
    archive(table, services, policy)
    commit_one_batch(coord, "topic-a", 18)
    commit_one_batch(coord, "topic-a", 19)
    pending = schedule_clustering(table, services, ClusteringOptions(min_files=2))
    assert pending is not None
    services.stop_heartbeat(table, pending.instant_time)
    return set(pending.file_groups)


def _layout_table(path: Path, version: int, partition_fields: tuple[str, ...]) -> None:
    """Three commits into a table with another layout: unpartitioned (lakesink's default) or
    partitioned by two columns (a complex key generator)."""
    keys = ("id",) if len(partition_fields) < 2 else ("id", "day")
    cfg = TableConfig(path.name, keys, partition_fields, version=version)  # type: ignore[arg-type]
    table = HudiTable.create(path, cfg)
    clock = _Clock()
    for c in range(1, 4):
        t = clock.next()
        inst = table.timeline().begin(Action.COMMIT, t)
        data = _rows(c, 12)
        data = data.set_column(2, "name", pa.array([f"g{i % 2}" for i in range(12)]))
        writer = PartitionedWriter(table, t, "0-1-0")
        writer.write(data)
        writes = writer.close()
        md = CommitMetadata("BULK_INSERT", tuple(writes), schema=writer.avro_schema or "")
        table.timeline().publish(inst, md)


def _backfill_table(path: Path) -> None:
    """A backfill that begins before a streaming commit and completes after it (version 8:
    its instant time is older than the commit it completes after)."""
    table = _svc_table(path, 8)
    services = services_for(path, "filesystem", None, "w-a")
    stream = HudiCoordinator(table, "w-a", control=services)
    stream.start()
    commit_one_batch(stream, "topic-a", 0)
    backfill = HudiCoordinator(table, "backfill-1", control=services)
    rng = OffsetRange(TopicPartition("history", 0), 0, 30)
    t_b = backfill.begin_batch(0, [rng])
    assert t_b is not None
    commit_one_batch(stream, "topic-a", 1)
    writer = PartitionedWriter(table, t_b, write_token(0, 0, 0))
    from integration.test_multi_writer import rows

    writer.write(rows("history", 0, 0, 30))
    files = writer.close()
    status = WriteStatus(t_b.value, "b", rng, tuple(files), 30, 30)
    backfill.complete_batch(t_b, 0, [rng], [status], schema=writer.avro_schema or "")
    commit_one_batch(stream, "topic-a", 2)


@dataclass
class Built:
    paths: dict[str, Path] = field(default_factory=dict)
    pending_clustering: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def built(java_hudi: JavaHudi, tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("java-hudi-compat")
    out = Built()
    paths = out.paths
    for v in (6, 8):
        paths[f"compat_v{v}"] = build_table(root / f"compat_v{v}", v).table.base_path
        paths[f"golden_v{v}"] = GOLDEN / f"cow_v{v}"
        paths[f"services_v{v}"] = root / f"services_v{v}"
        out.pending_clustering[f"services_v{v}"] = _services_table(paths[f"services_v{v}"], v)
    _backfill_table(root / "backfill_v8")
    paths["backfill_v8"] = root / "backfill_v8"
    paths["unpartitioned_v8"] = root / "unpartitioned_v8"
    _layout_table(paths["unpartitioned_v8"], 8, ())
    paths["two_levels_v6"] = root / "two_levels_v6"
    _layout_table(paths["two_levels_v6"], 6, ("day", "name"))
    queries: dict[str, list[Query]] = {
        name: plan_reads(paths[name], incremental_pairs=name not in LIGHT) for name in TABLES
    }
    everything = [q for name in TABLES for q in queries[name]]
    found = check_tables(java_hudi, everything)
    out.problems = {n: [p for p in found if p.startswith(f"{paths[n].name}:")] for n in TABLES}
    return out


@pytest.mark.parametrize("name", TABLES)
def test_java_hudi_reads_the_table_as_lakesink_and_hudi_rs_do(built: Built, name: str) -> None:
    assert built.problems[name] == []


@pytest.mark.parametrize("name", ["services_v6", "services_v8"])
def test_java_hudi_sees_the_file_groups_a_pending_lakesink_clustering_rewrites(
    java_hudi: JavaHudi, built: Built, name: str
) -> None:
    """The replacecommit.requested of a lakesink clustering holds Hudi's clustering plan, so
    Java Hudi writers keep their updates away from the file groups it rewrites."""
    table = HudiTable.open(built.paths[name])
    (pending,) = table.timeline().inflight_or_requested(Action.REPLACE_COMMIT)
    seen = java_hudi.pending_clustering(built.paths[name])
    assert seen == {str(pending.time): built.pending_clustering[name]}
    assert len(built.pending_clustering[name]) >= 2
