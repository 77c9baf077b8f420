"""The two table formats as the coordinator state machine drives them: how a table is created, a
writer's coordinator opened, a task attempt's files written, and the table read back and checked.

`HudiUnderTest`: a Hudi table (version 6 or 8) whose writers share the fake lock and heartbeats
(`property.fakes`); read by lakesink's reader, and by hudi-rs. `IcebergUnderTest`: an Iceberg table
in a SQL catalog (a SQLite file in the warehouse), each writer process its own `IcebergTable`;
read back with pyiceberg, its snapshot summaries checked.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pyarrow as pa
from property.fakes import FakeServices, World

from lakesink.engine.coordinator import Coordinator
from lakesink.formats import plugin_for
from lakesink.formats.hudi import writer_state as commit_state
from lakesink.formats.hudi.audit import read_with_hudi_rs
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.datafiles import IcebergTarget
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.snapshots import KEY_COMMIT_ID, KEY_OFFSETS, KEY_WRITER_ID
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.formats.task import TaskAttempt
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import WriterOffsets
from lakesink.protocol.write_status import FileWrite

COORDS = ["kafka_topic", "kafka_partition", "kafka_offset"]
ROWS = pa.schema(
    [
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("value", pa.string()),
    ]
)
Coordinates = list[tuple[str, int, int]]


class FormatUnderTest(Protocol):
    """What the state machine needs of a table format."""

    # Hudi's lock, heartbeats and table services: the rules about them need these
    has_lock_and_heartbeats: ClassVar[bool]

    def coordinator(self, writer_id: str, services: FakeServices) -> Coordinator: ...

    def write_attempt(
        self,
        coordinator: Coordinator,
        instant: InstantTime,
        task: int,
        attempt: int,
        rows: pa.Table,
    ) -> tuple[tuple[FileWrite, ...], str, Mapping[str, Any]]:
        """One task attempt's files, the schema it wrote, its status's `extra`."""
        ...

    def live_instants(self) -> set[InstantTime] | None:
        """The instants still in flight (None: nothing rolls a writer's instant back)."""
        ...

    def read_coordinates(self) -> Coordinates: ...

    def committed_offsets(self, writer_id: str) -> WriterOffsets: ...

    def check_commits(self, writer_ids: tuple[str, ...], step: int) -> None:
        """The format's own checks of its commits (`step`: how many checks ran before)."""
        ...

    def check_at_end(self) -> None: ...


class HudiUnderTest:
    """A Hudi table; every writer's coordinator uses its process's fake services."""

    has_lock_and_heartbeats: ClassVar[bool] = True

    def __init__(self, base: Path, version: int) -> None:
        config = TableConfig(name="prop", record_key_fields=tuple(COORDS), version=version)  # type: ignore[arg-type]
        self.table = HudiTable.create(base / "table", config)

    def coordinator(self, writer_id: str, services: FakeServices) -> Coordinator:
        return HudiCoordinator(self.table, writer_id, query_id="q", control=services)

    def write_attempt(
        self,
        coordinator: Coordinator,
        instant: InstantTime,
        task: int,
        attempt: int,
        rows: pa.Table,
    ) -> tuple[tuple[FileWrite, ...], str, Mapping[str, Any]]:
        writer = PartitionedWriter(self.table, instant, f"{task}-1-{attempt}")
        writer.write(rows)  # CommitError when the instant was rolled back under the task
        files = writer.close()
        return tuple(files), writer.avro_schema or "", {}

    def live_instants(self) -> set[InstantTime] | None:
        return {i.time for i in self.table.timeline().inflight_or_requested()}

    def read_coordinates(self) -> Coordinates:
        if not self.table.timeline().completed_data_instants():
            return []
        rows = TableReader(self.table).snapshot(columns=COORDS)
        return list(zip(*(rows.column(c).to_pylist() for c in COORDS), strict=True))

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        return commit_state.committed_offsets(self.table, writer_id)

    def check_commits(self, writer_ids: tuple[str, ...], step: int) -> None:
        if step % 8 == 0:
            self.check_with_hudi_rs()

    def check_at_end(self) -> None:
        self.check_with_hudi_rs()

    def check_with_hudi_rs(self) -> None:
        if not self.table.timeline().completed_data_instants():
            return
        theirs = read_with_hudi_rs(str(self.table.base_path))
        a = sorted(self.read_coordinates())
        b = sorted(zip(*(theirs.column(c).to_pylist() for c in COORDS), strict=True))
        assert a == b, f"hudi-rs reads {len(b)} rows, lakesink {len(a)}"


class IcebergUnderTest:
    """An Iceberg table partitioned by Kafka partition; each writer process opens its own."""

    has_lock_and_heartbeats: ClassVar[bool] = False
    IDENT = ("prop", "events")

    def __init__(self, base: Path, world: World) -> None:
        self.world = world
        self.catalog = open_catalog(CatalogSettings(warehouse=str(base / "warehouse")))
        self.table = self.open_table()
        # one task target per (driver process, transaction), made once as the driver makes it
        self.targets: dict[tuple[Coordinator, str], IcebergTarget] = {}
        self._read: tuple[int | None, Coordinates] = (None, [])  # by current snapshot id

    def open_table(self) -> IcebergTable:
        return IcebergTable.open(
            self.catalog, self.IDENT, ROWS, parse_partition_spec("kafka_partition")
        )

    def coordinator(self, writer_id: str, services: FakeServices) -> Coordinator:
        # lakesink's own transaction ids: writers on the shared fake clock may begin in the
        # same millisecond, and each must still commit its own rows
        fmt = IcebergFormat(self.open_table(), clock_ms=self.world.now_ms)
        return IcebergCoordinator(fmt, writer_id, query_id="q")

    def write_attempt(
        self,
        coordinator: Coordinator,
        instant: InstantTime,
        task: int,
        attempt: int,
        rows: pa.Table,
    ) -> tuple[tuple[FileWrite, ...], str, Mapping[str, Any]]:
        assert isinstance(coordinator, IcebergCoordinator)
        # written as a Spark task writes: through the plugin's task target of the transaction
        key: tuple[Coordinator, str] = (coordinator, instant.value)
        if key not in self.targets:
            self.targets[key] = plugin_for("iceberg").task_target(coordinator, instant.value, 0)
        writer = self.targets[key].open(TaskAttempt(task, 0, attempt, f"0.{task}.{attempt}"))
        for batch in rows.to_batches():
            writer.write(batch)
        files, extra = writer.close()
        return tuple(files), "", extra

    def live_instants(self) -> set[InstantTime] | None:
        return None

    def read_coordinates(self) -> Coordinates:
        self.table.refresh()
        current = self.table.pyiceberg.metadata.current_snapshot_id
        if current != self._read[0]:
            rows = self.table.pyiceberg.scan(selected_fields=tuple(COORDS)).to_arrow()
            coords = list(zip(*(rows.column(c).to_pylist() for c in COORDS), strict=True))
            self._read = (current, coords)
        return list(self._read[1])

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        self.table.refresh()
        return self.table.committed_offsets(writer_id)

    def check_commits(self, writer_ids: tuple[str, ...], step: int) -> None:
        """No commit id, nor one writer's transaction id (its first part), in two snapshots; each
        writer's newest snapshot summary holds the offsets the lineage walk finds."""
        snapshots = sorted(self.table.pyiceberg.metadata.snapshots, key=lambda s: s.sequence_number)
        summaries = [s.summary for s in snapshots if s.summary and KEY_WRITER_ID in s.summary]
        for ids in (
            Counter(s[KEY_COMMIT_ID] for s in summaries),
            # two writers may share a transaction id (begun in one millisecond); one writer never
            Counter((s[KEY_WRITER_ID], s[KEY_COMMIT_ID].split("-")[0]) for s in summaries),
        ):
            assert all(n == 1 for n in ids.values()), f"an id in two snapshots: {ids}"
        for w in writer_ids:
            own = [s for s in summaries if s[KEY_WRITER_ID] == w]
            newest = (
                WriterOffsets.from_json(json.loads(own[-1][KEY_OFFSETS]))
                if own
                else WriterOffsets.empty()
            )
            assert newest == self.table.committed_offsets(w), (w, newest)

    def check_at_end(self) -> None:
        self.table.refresh()
        snapshots = self.table.pyiceberg.metadata.snapshots
        writers = {
            s.summary[KEY_WRITER_ID] for s in snapshots if s.summary and KEY_WRITER_ID in s.summary
        }
        self.check_commits(tuple(sorted(writers)), 0)
