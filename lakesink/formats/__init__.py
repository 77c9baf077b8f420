"""The table formats, one plugin each, looked up by `table.format`: the one place above the
formats that knows which formats exist. spark/ and cli/ ask the plugin of a configuration for
what differs between formats instead of testing the format themselves (tests/layering.py, rule
`registry`), so a third format is one more package here and one more line in `_LOADERS`.

Plugins are imported on first use: importing this package imports no format (and no pyiceberg).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.engine.coordinator import Coordinator
    from lakesink.engine.format import CommitControl, TableFormat
    from lakesink.engine.schema import TableSchema
    from lakesink.formats.audit import DeadLetters, FoldAudit, KeptByTransform
    from lakesink.formats.backfill import Backfill
    from lakesink.formats.task import TaskTarget
    from lakesink.metrics import IngestionMetrics
    from lakesink.protocol.offsets import TopicPartition, WriterOffsets
    from lakesink.settings import Settings, StorageAccess
    from lakesink.storage import Storage

# The configuration key that names the format (defined and validated by the configuration).
FORMAT_KEY = "table.format"


class AuditResult(Protocol):
    """What `lakesink verify` needs of a format's audit report."""

    @property
    def ok(self) -> bool: ...

    @property
    def problems(self) -> list[str]: ...

    def to_json(self) -> dict[str, Any]: ...


class FormatPlugin(Protocol):
    """What spark/ and cli/ need of a table format."""

    @property
    def name(self) -> str:
        """The format's `table.format` value."""
        ...

    @property
    def tasks_write_data_files(self) -> bool:
        """Whether the tasks write data files that the coordinator describes in its commit and
        the table keeps its own schema and partitioning (Iceberg), rather than base files with
        markers under a table config and an Avro schema per commit (Hudi)."""
        ...

    @property
    def keyed_writes_by_task(self) -> bool:
        """Whether writes by key (write.operation=upsert|cdc) can take the direct task path:
        each bucket's rows as Arrow through Spark's shuffle to one writer task (Iceberg), rather
        than a shuffle of a Spark DataFrame (Hudi)."""
        ...

    @property
    def task_modules(self) -> tuple[str, ...]:
        """The modules a Spark task imports to write the format's files (the task target's),
        which Spark's Python workers import ahead of the first batch (spark/worker_warmup.py)."""
        ...

    def check_options(self, settings: Settings) -> None:
        """Refuse (ConfigError) options the format cannot honour, before anything is written."""
        ...

    def record_key_columns(self, settings: Settings) -> tuple[str, ...]:
        """The columns the table keys records by, which a transformation must keep as given."""
        ...

    def liveness_key(self, settings: Settings) -> str:
        """Where the writer's liveness file is on the table's storage."""
        ...

    def committed_offsets(self, settings: Settings) -> WriterOffsets:
        """The writer's committed offsets, read from the table."""
        ...

    def table_identity(self, settings: Settings) -> tuple[str, ...]:
        """What makes two configurations of this format the same table (Hudi: the path;
        Iceberg: the warehouse, namespace and name)."""
        ...

    def table_names(self, settings: Settings) -> list[str]:
        """The names of the tables of this format at `settings`' table.path (none when it
        does not exist yet): how a many-table ingestion finds its dynamic tables again."""
        ...

    def committed_topic_ids(self, settings: Settings) -> dict[str, str]:
        """The Kafka topic ids the writer's newest commit recorded (none when not recorded)."""
        ...

    def commit_schema(self, rows: pa.Schema, table_name: str) -> TableSchema:
        """The schema a commit of rows of schema `rows` records in the table `table_name`."""
        ...

    def written_schema(self, texts: Sequence[str]) -> str | None:
        """The schema text a commit records for the files its tasks wrote, of the schema texts
        their statuses carry (tasks that resolved the table's schema apart may differ); None
        when they carry none."""
        ...

    def dead_letter_table_records(self, settings: Settings) -> DeadLetters:
        """The records in the writer's dead-letter table (errors.deadletter.table)."""
        ...

    def audit(
        self,
        settings: Settings,
        *,
        dead_letters: DeadLetters | None,
        kept_by_transform: KeptByTransform | None,
        spark: bool,
        fold: FoldAudit | None = None,
    ) -> AuditResult:
        """The exactly-once audit of the writer; `spark`: read the table with Spark as well,
        where the format has such a reader."""
        ...

    def audit_lines(self, report: Any) -> list[str]:
        """`report` (of this plugin's `audit`) as `lakesink verify` prints it."""
        ...

    def read_back(self, settings: Settings) -> tuple[pa.Table, str, str]:
        """Every row of the table as a reader of the format's own ecosystem reads it (the demo
        shows them): the rows, the reader's name and what it read (" of <table> ..." or "")."""
        ...

    def writer_control(self, settings: Settings) -> CommitControl:
        """The writer's concurrency control as configured, which its coordinator commits under
        (Hudi: the table lock, heartbeats and fencing; Iceberg: none of its own)."""
        ...

    def open_table(
        self,
        settings: Settings,
        *,
        partition_fields: Sequence[str],
        rows: Callable[[], pa.Schema],
    ) -> object:
        """The writer's table (the format's table object, for `open_coordinator`), created on
        first use, partitioned by `partition_fields` (table.partition.by and the date column)
        where the format takes them from the writer. `rows`: the Arrow schema of the rows the
        writer commits, asked for only by a format whose table keeps its own schema."""
        ...

    def open_dead_letter_coordinator(
        self, settings: Settings, *, rows: Callable[[], pa.Schema], query_id: str
    ) -> Coordinator:
        """The commit coordinator of errors.deadletter.table (not started), its table created on
        first use: the writer `<writer.id>.deadletters`, committing the main table's ranges.
        `rows`: the dead-letter rows' Arrow schema, as for `open_table`."""
        ...

    def table_format(self, table: object) -> TableFormat:
        """The commit engine's view (lakesink.engine.format) of the format's table object, for
        a `TableTransaction` over it."""
        ...

    def open_coordinator(
        self,
        settings: Settings,
        table: object,
        control: CommitControl,
        *,
        query_id: str,
        publish_delay_s: float = 0.0,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
    ) -> Coordinator:
        """The writer's commit coordinator over `table` (the format's table object, as the
        pipeline opened it for `settings`), under `control`, with the configured conflict rules
        and the format's post-commit hooks (Hudi: inline table services; Iceberg:
        maintenance)."""
        ...

    def table_partition_fields(self, coordinator: Coordinator) -> tuple[str, ...] | None:
        """The partition columns the coordinator's table declares itself (Hudi: its config),
        or None where the configuration gives them (Iceberg)."""
        ...

    def task_target(
        self, coordinator: Coordinator, instant_time: str, target_file_size: int
    ) -> TaskTarget:
        """Where Spark tasks write on the coordinator's table for `instant_time`, to pickle into
        them (lakesink.formats.task)."""
        ...

    def snapshot_files(self, storage: Storage, as_of: str | None) -> list[str]:
        """The Parquet files (relative to the table's root) that hold the rows of the table at
        `storage` as of the instant `as_of` (None: the latest), for `spark.read`."""
        ...

    def snapshot_schema(self, storage: Storage, as_of: str | None) -> pa.Schema:
        """The schema of those rows."""
        ...

    def snapshot_slices(self, storage: Storage, as_of: str | None) -> list[tuple[str, ...]]:
        """What `spark.read` reads, one Spark task each: a Parquet file then the files merged
        over it (a merge-on-read slice's log files; none for a copy-on-write table), relative
        to the table's root, as of `as_of` (None: the latest)."""
        ...

    def read_slice(self, storage: Storage, files: tuple[str, ...]) -> pa.Table:
        """The rows of one of `snapshot_slices`' entries with files to merge."""
        ...

    @property
    def cli_commands(self) -> tuple[str, ...]:
        """The format's own top-level `lakesink` commands."""
        ...

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """Add `cli_commands` to the subparsers `sub`."""
        ...

    def run_cli(self, args: argparse.Namespace, settings: Settings) -> int:
        """Run one of the commands `add_cli_commands` added; the exit code."""
        ...

    def status(
        self,
        settings: Settings,
        *,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        add_metrics: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """`lakesink status` of the writer and its table, as JSON-able data: committed offsets,
        high watermarks (read by `high_watermarks`) and lag per partition, pending epochs, the
        table's state; `add_metrics` adds the metrics once the partitions are in."""
        ...

    def print_status(self, st: dict[str, Any]) -> None:
        """`status`'s data as text."""
        ...

    def recognizes_table(self, path: str, access: StorageAccess) -> bool:
        """Whether `path` holds a table (or a warehouse) of this format that another format's
        `table` commands must not open. The default format answers False: it takes the paths
        no format recognizes (and says when no table is there)."""
        ...

    def run_table_command(self, args: argparse.Namespace, access: StorageAccess) -> int:
        """Run `lakesink table <command> <path>` (lakesink.cli.table_commands parses it) on a
        table of this format; the exit code."""
        ...

    def backfill_control(
        self, args: argparse.Namespace, settings: Settings | None, access: StorageAccess
    ) -> Any:
        """The commit control of `lakesink backfill` (`args`: its lock options; `settings`: of
        the configuration given, if any; `access`: how to reach the table by its path);
        ConfigError for options the format cannot honour."""
        ...

    def open_backfill(
        self,
        settings: Settings | None,
        table: str,
        control: object,
        *,
        writer_id: str | None,
        backfill_id: str,
        sources: Sequence[str],
    ) -> Backfill:
        """A backfill (lakesink.formats.backfill) of the source files `sources`, whose digest
        is `backfill_id`, into the table at `table` (the configuration's `settings`, if any, say
        more), committed under `control` (`backfill_control`'s) by `writer_id` (None:
        `backfill-<backfill_id>`)."""
        ...


def _hudi() -> FormatPlugin:
    from lakesink.formats.hudi.plugin import PLUGIN

    return PLUGIN


def _iceberg() -> FormatPlugin:
    from lakesink.formats.iceberg.plugin import PLUGIN

    return PLUGIN


_LOADERS: dict[str, Callable[[], FormatPlugin]] = {"hudi": _hudi, "iceberg": _iceberg}
FORMAT_NAMES: tuple[str, ...] = tuple(_LOADERS)


def plugin_for(name: str) -> FormatPlugin:
    """The plugin of the format `name`; a ConfigError naming the formats for another name."""
    loader = _LOADERS.get(name)
    if loader is None:
        raise ConfigError(
            f"{FORMAT_KEY}={name!r} is not a table format; use one of {', '.join(FORMAT_NAMES)}"
        )
    return loader()


def plugin_of(settings: Settings) -> FormatPlugin:
    """The plugin of the configured table format."""
    return plugin_for(settings.table.format)


def all_plugins() -> tuple[FormatPlugin, ...]:
    """Every format's plugin (imports every format: for the command line's parser)."""
    return tuple(load() for load in _LOADERS.values())


def plugin_with_command(command: str) -> FormatPlugin | None:
    """The plugin whose own `lakesink` command `command` is (None for the common commands)."""
    return next((p for p in all_plugins() if command in p.cli_commands), None)


def default_plugin() -> FormatPlugin:
    """The plugin of `table.format`'s default (the first format): `lakesink table create`."""
    return plugin_for(FORMAT_NAMES[0])


def plugin_at(path: str, access: StorageAccess) -> FormatPlugin:
    """The plugin of the table at `path` (reached by `access`): the format that recognizes it,
    else the default."""
    return next((p for p in all_plugins() if p.recognizes_table(path, access)), default_plugin())
