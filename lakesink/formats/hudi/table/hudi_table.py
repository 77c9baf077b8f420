"""A Hudi copy-on-write table on a local filesystem or an object store: its config, timeline
and partitions."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lakesink.errors import SchemaMismatchError, TableError, TableNotFoundError
from lakesink.formats.hudi.table.config import (
    ARCHIVED_FOLDER,
    HISTORY_FOLDER,
    TableConfig,
    parse_properties,
    render_properties,
)
from lakesink.formats.hudi.table.timeline import Timeline, timeline_folder
from lakesink.protocol.instant import InstantTime, TimelineLayout
from lakesink.storage import (
    LocalStorage,
    ObjectExistsError,
    ObjectNotFoundError,
    Storage,
    as_storage,
)

log = logging.getLogger(__name__)

PROPERTIES_FILE = ".hoodie/hoodie.properties"
PARTITION_METADATA_FILE = ".hoodie_partition_metadata"
DEFAULT_PARTITION_VALUE = "__HIVE_DEFAULT_PARTITION__"


def _format_partition_value(value: Any) -> str:
    if value is None:
        return DEFAULT_PARTITION_VALUE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class HudiTable:
    """One table: its storage root holds `.hoodie/` and the partition folders (a local folder
    or `s3://bucket/prefix`). Picklable (a storage and a config), so it can travel to Spark
    executors."""

    __slots__ = ("_config", "_storage")

    def __init__(self, base_path: str | Path | Storage, config: TableConfig) -> None:
        self._storage = _storage_of(base_path)
        self._config = config

    def __getstate__(self) -> tuple[Storage, TableConfig]:
        return self._storage, self._config

    def __setstate__(self, state: tuple[Storage, TableConfig]) -> None:
        self._storage = state[0]
        self._config = state[1]

    def __repr__(self) -> str:
        return f"HudiTable({self._storage.uri!r}, {self._config.name!r}, v{self._config.version})"

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def uri(self) -> str:
        """The table root as a path or URI (no credentials): for messages and logs."""
        return self._storage.uri

    @property
    def is_local(self) -> bool:
        return self._storage.is_local

    @property
    def base_path(self) -> Path:
        """The table folder of a local table; TableError for a table on an object store (use
        `storage`)."""
        if isinstance(self._storage, LocalStorage):
            return self._storage.root
        raise TableError(f"table {self._storage.uri} is on an object store: it has no local folder")

    @property
    def config(self) -> TableConfig:
        return self._config

    @property
    def layout(self) -> TimelineLayout:
        return self._config.layout

    @property
    def timeline_path(self) -> Path:
        return timeline_folder(self.base_path, self.layout)

    # -- create / open -----------------------------------------------------------------------

    @classmethod
    def create(cls, base_path: str | Path | Storage, config: TableConfig) -> HudiTable:
        """Create the table; if one exists with the identical config, return it (restarts are
        safe); TableError if one exists with another config."""
        storage = _storage_of(base_path)
        if storage.exists(PROPERTIES_FILE):
            return cls._open_expecting(storage, config)
        if isinstance(storage, LocalStorage):
            base = storage.root
            if base.exists() and not base.is_dir():
                raise TableError(f"cannot create table at {base}: it is a file")
            hoodie = base / ".hoodie"
            for d in (
                hoodie,
                hoodie / ".temp",
                hoodie / ".aux",
                timeline_folder(base, config.layout),
            ):
                d.mkdir(parents=True, exist_ok=True)
            if config.layout is TimelineLayout.V2:
                (timeline_folder(base, config.layout) / HISTORY_FOLDER).mkdir(exist_ok=True)
            else:
                (hoodie / ARCHIVED_FOLDER).mkdir(exist_ok=True)
        text = render_properties(config.to_properties(), "Properties saved by lakesink")
        try:
            storage.create(PROPERTIES_FILE, text.encode("utf-8"))
        except ObjectExistsError:  # created concurrently
            return cls._open_expecting(storage, config)
        log.info("table %s: created %s (version %d)", storage.uri, config.name, config.version)
        return cls(storage, config)

    @classmethod
    def _open_expecting(cls, storage: Storage, config: TableConfig) -> HudiTable:
        table = cls.open(storage)
        if table.config != config:
            mine, theirs = config.to_properties(), table.config.to_properties()
            diffs = [
                f"{k}: table has {theirs.get(k)!r}, requested {mine.get(k)!r}"
                for k in sorted(set(mine) | set(theirs))
                if mine.get(k) != theirs.get(k)
            ]
            raise TableError(
                f"a different table exists at {storage.uri}; refusing to overwrite it "
                f"({'; '.join(diffs)})"
            )
        return table

    @classmethod
    def open(cls, base_path: str | Path | Storage) -> HudiTable:
        """Open an existing table; TableNotFoundError naming the path if there is none,
        UnsupportedTableError for versions or types lakesink does not handle."""
        storage = _storage_of(base_path)
        where = f"{storage.uri}/{PROPERTIES_FILE}"
        try:
            raw = storage.read(PROPERTIES_FILE)
        except ObjectNotFoundError:
            raise TableNotFoundError(
                f"no Hudi table at {storage.uri}: {where} does not exist"
            ) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        props = parse_properties(text)
        return cls(storage, TableConfig.from_properties(props, where))

    def properties(self) -> dict[str, str]:
        """The raw `hoodie.properties` entries."""
        return parse_properties(self._storage.read(PROPERTIES_FILE).decode("utf-8"))

    # -- timeline ----------------------------------------------------------------------------

    def timeline(self) -> Timeline:
        """A fresh read of the active timeline."""
        return Timeline.load(self._storage, self.layout)

    # -- partitions --------------------------------------------------------------------------

    def partition_path_for(self, values: Mapping[str, Any]) -> str:
        """The relative partition folder for one row's partition values (`col=value/...` in
        hive style); "" for an unpartitioned table."""
        parts: list[str] = []
        for f in self._config.partition_fields:
            if f not in values:
                raise SchemaMismatchError(
                    f"partition column {f!r} is missing; table {self._config.name!r} is "
                    f"partitioned by {', '.join(self._config.partition_fields)}"
                )
            v = _format_partition_value(values[f])
            if "/" in v or v in ("", ".", "..") or v.startswith("."):
                raise SchemaMismatchError(
                    f"partition value {v!r} of column {f!r} cannot name a folder; values must be "
                    "non-empty, contain no '/' and not start with '.'"
                )
            parts.append(f"{f}={v}" if self._config.hive_style_partitioning else v)
        return "/".join(parts)

    def ensure_partition(
        self, partition_path: str, instant_time: InstantTime | None = None
    ) -> None:
        """Write the partition's `.hoodie_partition_metadata` once, atomically."""
        key = (
            f"{partition_path}/{PARTITION_METADATA_FILE}"
            if partition_path
            else (PARTITION_METADATA_FILE)
        )
        if self._storage.exists(key):
            return
        depth = len([p for p in partition_path.split("/") if p]) if partition_path else 0
        commit_time = (
            str(instant_time)
            if instant_time
            else InstantTime.from_epoch_ms(int(datetime.now(UTC).timestamp() * 1000)).value
        )
        stamp = datetime.now(UTC).strftime("%a %b %d %H:%M:%S UTC %Y")
        text = f"#partition metadata\n#{stamp}\ncommitTime={commit_time}\npartitionDepth={depth}\n"
        with contextlib.suppress(ObjectExistsError):
            self._storage.create(key, text.encode("utf-8"))

    def list_partitions_on_storage(self) -> list[str]:
        """Partition folders found on storage (those with partition metadata), for tools.
        Lists folders only, one level per partition column, never the files in them."""
        if not self._config.is_partitioned:
            return [""]
        level = [""]
        for _ in self._config.partition_fields:
            deeper: list[str] = []
            for rel in level:
                listing = self._storage.list_folder(rel)
                deeper += [
                    f"{rel}/{name}" if rel else name
                    for name in listing.folders
                    if not name.startswith(".")
                ]
            level = deeper
        return sorted(r for r in level if self._storage.exists(f"{r}/{PARTITION_METADATA_FILE}"))


def _storage_of(where: str | Path | Storage) -> Storage:
    return as_storage(where)
