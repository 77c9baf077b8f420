"""The table's identity and layout, stored in `.hoodie/hoodie.properties`.

One enumeration of property keys (`TableProperty`) is the single source of truth for the
keys lakesink writes and reads; `TableConfig` is the typed value behind them.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from lakesink.errors import CorruptTableError, UnsupportedTableError
from lakesink.formats.hudi.table.bucket import BucketIndex, BucketIndexProperty
from lakesink.protocol.instant import TimelineLayout

TableVersion = Literal[6, 8]
SUPPORTED_VERSIONS: tuple[int, ...] = (6, 8)
SUPPORTED_TABLE_TYPES: tuple[str, ...] = ("COPY_ON_WRITE", "MERGE_ON_READ")


class TableProperty(enum.StrEnum):
    """Keys of `hoodie.properties` that lakesink writes (and, for most, reads back)."""

    NAME = "hoodie.table.name"
    TYPE = "hoodie.table.type"
    VERSION = "hoodie.table.version"
    INITIAL_VERSION = "hoodie.table.initial.version"
    TIMELINE_LAYOUT_VERSION = "hoodie.timeline.layout.version"
    TIMELINE_PATH = "hoodie.timeline.path"
    TIMELINE_HISTORY_PATH = "hoodie.timeline.history.path"
    ARCHIVE_LOG_FOLDER = "hoodie.archivelog.folder"
    TIMELINE_TIMEZONE = "hoodie.table.timeline.timezone"
    PARTITION_FIELDS = "hoodie.table.partition.fields"
    HIVE_STYLE_PARTITIONING = "hoodie.datasource.write.hive_style_partitioning"
    PARTITION_PATH_URLENCODE = "hoodie.datasource.write.partitionpath.urlencode"
    DROP_PARTITION_COLUMNS = "hoodie.datasource.write.drop.partition.columns"
    RECORD_KEY_FIELDS = "hoodie.table.recordkey.fields"
    KEY_GENERATOR_CLASS = "hoodie.table.keygenerator.class"
    KEY_GENERATOR_TYPE = "hoodie.table.keygenerator.type"
    POPULATE_META_FIELDS = "hoodie.populate.meta.fields"
    BASE_FILE_FORMAT = "hoodie.table.base.file.format"
    DATABASE_NAME = "hoodie.database.name"
    CHECKSUM = "hoodie.table.checksum"
    METADATA_PARTITIONS = "hoodie.table.metadata.partitions"
    CDC_ENABLED = "hoodie.table.cdc.enabled"
    PRECOMBINE_FIELD = "hoodie.table.precombine.field"
    """The ordering field of versions 6 and 8 (Hudi 1.2.0's version-9 name,
    `hoodie.table.ordering.fields`, is read as well; its downgrade to 8 writes this key)."""
    ORDERING_FIELDS = "hoodie.table.ordering.fields"
    PAYLOAD_CLASS = "hoodie.compaction.payload.class"
    RECORD_MERGE_MODE = "hoodie.record.merge.mode"  # version 8
    RECORD_MERGE_STRATEGY_ID = "hoodie.record.merge.strategy.id"  # version 8


class RecordMergeMode(enum.StrEnum):
    """How Hudi picks between two versions of a key (`hoodie.record.merge.mode`), with the
    payload class and merge strategy id that Hudi 1.2.0 stores beside it for a version-8 table
    (`HoodieTableConfig.inferMergingConfigsForPreV9Table`); a version-6 table stores only the
    payload class."""

    EVENT_TIME_ORDERING = "EVENT_TIME_ORDERING"
    """The higher ordering value wins (lakesink's rule with an ordering field)."""
    COMMIT_TIME_ORDERING = "COMMIT_TIME_ORDERING"
    """The later write wins (lakesink's rule without one: Kafka order)."""

    @property
    def payload_class(self) -> str:
        if self is RecordMergeMode.EVENT_TIME_ORDERING:
            return "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
        return "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"

    @property
    def strategy_id(self) -> str:
        """`HoodieRecordMerger.EVENT_TIME_BASED_MERGE_STRATEGY_UUID` and
        `COMMIT_TIME_BASED_MERGE_STRATEGY_UUID`."""
        if self is RecordMergeMode.EVENT_TIME_ORDERING:
            return "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5"
        return "ce9acb64-bde0-424c-9b91-f6ebba25356d"


TIMELINE_FOLDER = "timeline"  # layout 2: active timeline under .hoodie/timeline
HISTORY_FOLDER = "history"  # layout 2: archived (LSM) timeline under .hoodie/timeline/history
ARCHIVED_FOLDER = "archived"  # layout 1: archived timeline under .hoodie/archived


def table_checksum(database: str, name: str) -> int:
    """Hudi's `hoodie.table.checksum`: CRC32 of `<database>.<table>` (of the name alone when
    the database is empty)."""
    text = f"{database}.{name}" if database else name
    return zlib.crc32(text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class TableConfig:
    """What a lakesink Hudi table is: its name, format version and keys."""

    name: str
    """Table name (`hoodie.table.name`); letters, digits and `_`."""
    record_key_fields: tuple[str, ...]
    """Columns whose values form `_hoodie_record_key` (Hudi complex key when several)."""
    partition_fields: tuple[str, ...] = ()
    """Columns that partition the table, in folder order; empty for an unpartitioned table."""
    version: TableVersion = 8
    """Hudi table version: 8 (timeline layout 2, completion times) or 6 (layout 1)."""
    table_type: str = "COPY_ON_WRITE"
    """COPY_ON_WRITE, or MERGE_ON_READ (log files over base files: read by lakesink's reader;
    not written by the pipeline yet)."""
    hive_style_partitioning: bool = True
    """Partition folders named `col=value` (True) or `value` (False)."""
    database: str = "default"
    """Database name, part of the table checksum."""
    ordering_field: str | None = None
    """The column whose higher value wins between two versions of a key (Hudi's precombine
    field); None: the later Kafka record wins. Stored with the merge mode it implies."""
    bucket_count: int | None = None
    """Buckets per partition of Hudi's simple bucket index (hashed from the record key): a table
    whose rows change by key (upserts, change streams). None: an append table, no index."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c == "_" for c in self.name):
            raise UnsupportedTableError(
                f"table name {self.name!r} is not valid; use letters, digits and '_'"
            )
        if self.version not in SUPPORTED_VERSIONS:
            raise UnsupportedTableError(
                f"table version {self.version!r} is not supported; valid versions are "
                + ", ".join(str(v) for v in SUPPORTED_VERSIONS)
            )
        if self.table_type not in SUPPORTED_TABLE_TYPES:
            raise UnsupportedTableError(
                f"table type {self.table_type!r} is not supported; valid types are "
                + ", ".join(SUPPORTED_TABLE_TYPES)
            )
        if not self.record_key_fields:
            raise UnsupportedTableError(f"table {self.name!r} needs at least one record key field")
        for f in (*self.record_key_fields, *self.partition_fields):
            if not f or "," in f:
                raise UnsupportedTableError(f"field name {f!r} is not valid in table {self.name!r}")
        if self.ordering_field is not None and not self.ordering_field:
            raise UnsupportedTableError(f"table {self.name!r}: the ordering field name is empty")
        if self.bucket_count is not None:
            self.bucket_index()  # checks the count and the key field names
            if self.ordering_field is not None and "," in self.ordering_field:
                raise UnsupportedTableError(
                    f"table {self.name!r} orders versions by {self.ordering_field!r}; lakesink "
                    "writes by key with one ordering field only"
                )

    @property
    def layout(self) -> TimelineLayout:
        return TimelineLayout.V2 if self.version >= 8 else TimelineLayout.V1

    @property
    def is_partitioned(self) -> bool:
        return bool(self.partition_fields)

    @property
    def merge_mode(self) -> RecordMergeMode:
        if self.ordering_field is None:
            return RecordMergeMode.COMMIT_TIME_ORDERING
        return RecordMergeMode.EVENT_TIME_ORDERING

    def bucket_index(self) -> BucketIndex | None:
        """The table's simple bucket index (hashing every record key field), None without one."""
        if self.bucket_count is None:
            return None
        return BucketIndex(self.bucket_count, self.record_key_fields)

    @property
    def named_record_keys(self) -> bool:
        """Whether `_hoodie_record_key` is `field:value` even for one key field: Hudi 1.2.0's
        ComplexKeyGenerator writes one field so for table versions up to 8 (unless a writer sets
        `hoodie.write.complex.keygen.new.encoding`), and it is the key generator lakesink
        declares for one key field with two or more partition fields."""
        return self._key_generator()[1] == "COMPLEX"

    def timeline_folder(self) -> str:
        """The active timeline's folder relative to the base path."""
        return f".hoodie/{TIMELINE_FOLDER}" if self.layout is TimelineLayout.V2 else ".hoodie"

    def _key_generator(self) -> tuple[str, str]:
        if not self.partition_fields:
            return "org.apache.hudi.keygen.NonpartitionedKeyGenerator", "NON_PARTITION"
        if len(self.record_key_fields) == 1 and len(self.partition_fields) == 1:
            return "org.apache.hudi.keygen.SimpleKeyGenerator", "SIMPLE"
        return "org.apache.hudi.keygen.ComplexKeyGenerator", "COMPLEX"

    def to_properties(self) -> dict[str, str]:
        """The `hoodie.properties` entries for this table, as Hudi and hudi-rs expect them."""
        keygen_class, keygen_type = self._key_generator()
        p = TableProperty
        props: dict[str, str] = {
            p.NAME: self.name,
            p.TYPE: self.table_type,
            p.VERSION: str(self.version),
            p.TIMELINE_LAYOUT_VERSION: str(int(self.layout)),
            p.TIMELINE_TIMEZONE: "UTC",
            p.RECORD_KEY_FIELDS: ",".join(self.record_key_fields),
            p.HIVE_STYLE_PARTITIONING: "true" if self.hive_style_partitioning else "false",
            p.PARTITION_PATH_URLENCODE: "false",
            p.DROP_PARTITION_COLUMNS: "false",
            p.KEY_GENERATOR_CLASS: keygen_class,
            p.POPULATE_META_FIELDS: "true",
            p.BASE_FILE_FORMAT: "PARQUET",
            p.DATABASE_NAME: self.database,
            p.CHECKSUM: str(table_checksum(self.database, self.name)),
        }
        if self.partition_fields:
            props[p.PARTITION_FIELDS] = ",".join(self.partition_fields)
        if self.ordering_field is not None:
            props[p.PRECOMBINE_FIELD] = self.ordering_field
        if (
            self.ordering_field is not None
            or self.bucket_count is not None
            or self.table_type == "MERGE_ON_READ"
        ):
            # A table written by key: how Java Hudi merges two versions of a key
            mode = self.merge_mode
            props[p.PAYLOAD_CLASS] = mode.payload_class
            if self.layout is TimelineLayout.V2:
                props[p.RECORD_MERGE_MODE] = mode.value
                props[p.RECORD_MERGE_STRATEGY_ID] = mode.strategy_id
        index = self.bucket_index()
        if index is not None:
            props.update(index.properties())
        if self.layout is TimelineLayout.V2:
            props[p.INITIAL_VERSION] = str(self.version)
            props[p.TIMELINE_PATH] = TIMELINE_FOLDER
            props[p.TIMELINE_HISTORY_PATH] = HISTORY_FOLDER
            props[p.KEY_GENERATOR_TYPE] = keygen_type
        else:
            props[p.ARCHIVE_LOG_FOLDER] = ARCHIVED_FOLDER
        return {str(k): v for k, v in sorted(props.items())}

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], source: str = "hoodie.properties"
    ) -> TableConfig:
        """Read a config back; UnsupportedTableError for what lakesink does not handle,
        CorruptTableError for missing or malformed entries. `source` names the file."""
        p = TableProperty

        def need(key: str) -> str:
            if key not in props:
                raise CorruptTableError(f"{source} has no {key!r}")
            return props[key]

        name = need(p.NAME)
        raw_version = need(p.VERSION)
        try:
            version = int(raw_version)
        except ValueError:
            raise CorruptTableError(
                f"{source}: {p.VERSION.value}={raw_version!r} is not a number"
            ) from None
        unsupported = _unsupported(props, version)
        if unsupported:
            raise UnsupportedTableError(
                f"{source}: lakesink cannot read and write this table: " + "; ".join(unsupported)
            )
        table_type = props.get(p.TYPE, "COPY_ON_WRITE")
        record_keys = tuple(f for f in props.get(p.RECORD_KEY_FIELDS, "").split(",") if f)
        partitions = tuple(f for f in props.get(p.PARTITION_FIELDS, "").split(",") if f)
        hive = props.get(p.HIVE_STYLE_PARTITIONING, "false").lower() == "true"
        ordering = props.get(p.ORDERING_FIELDS) or props.get(p.PRECOMBINE_FIELD) or None
        index = BucketIndex.from_properties(props, record_keys)  # checked by _unsupported
        return cls(
            name=name,
            record_key_fields=record_keys,
            partition_fields=partitions,
            version=cast(TableVersion, version),
            table_type=table_type,
            hive_style_partitioning=hive,
            database=props.get(p.DATABASE_NAME, ""),
            ordering_field=ordering.strip() if ordering else None,
            bucket_count=index.num_buckets if index is not None else None,
        )


_KEY_GENERATORS = {
    "org.apache.hudi.keygen.SimpleKeyGenerator": "SIMPLE",
    "org.apache.hudi.keygen.ComplexKeyGenerator": "COMPLEX",
    "org.apache.hudi.keygen.NonpartitionedKeyGenerator": "NON_PARTITION",
}


def _unsupported(props: Mapping[str, str], version: int) -> list[str]:
    """Every property of a table (often one another Hudi writer created) that lakesink does not
    support, each named with what would be valid."""
    p = TableProperty
    out: list[str] = []
    if version not in SUPPORTED_VERSIONS:
        out.append(
            f"table version {version} is not supported; lakesink reads and writes "
            + " and ".join(str(v) for v in SUPPORTED_VERSIONS)
        )
    table_type = props.get(p.TYPE, "COPY_ON_WRITE")
    if table_type not in SUPPORTED_TABLE_TYPES:
        out.append(
            f"table type {table_type!r} is not supported; valid types are "
            + ", ".join(SUPPORTED_TABLE_TYPES)
        )
    expected_layout = 2 if version >= 8 else 1
    layout = props.get(p.TIMELINE_LAYOUT_VERSION, str(expected_layout))
    if layout != str(expected_layout):
        out.append(
            f"table version {version} needs timeline layout {expected_layout}, found {layout!r}"
        )
    if version >= 8 and props.get(p.TIMELINE_PATH, TIMELINE_FOLDER) != TIMELINE_FOLDER:
        out.append(
            f"{p.TIMELINE_PATH.value}={props[p.TIMELINE_PATH]!r}; lakesink supports only "
            f"{TIMELINE_FOLDER!r}"
        )
    if props.get(p.DROP_PARTITION_COLUMNS, "false").lower() == "true":
        out.append(f"{p.DROP_PARTITION_COLUMNS.value}=true is not supported")
    if props.get(p.METADATA_PARTITIONS, ""):
        out.append(
            f"the table has a metadata table ({p.METADATA_PARTITIONS.value}="
            f"{props[p.METADATA_PARTITIONS]!r}) that lakesink does not maintain; write it with "
            "hoodie.metadata.enable=false"
        )
    keygen = props.get(p.KEY_GENERATOR_CLASS)
    keys = [f for f in props.get(p.RECORD_KEY_FIELDS, "").split(",") if f]
    parts = [f for f in props.get(p.PARTITION_FIELDS, "").split(",") if f]
    if not parts:
        ours = "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
    elif len(keys) == 1 and len(parts) == 1:
        ours = "org.apache.hudi.keygen.SimpleKeyGenerator"
    else:
        ours = "org.apache.hudi.keygen.ComplexKeyGenerator"
    if keygen is not None and keygen not in _KEY_GENERATORS:
        out.append(
            f"key generator {keygen!r} is not supported; valid: " + ", ".join(_KEY_GENERATORS)
        )
    elif keygen is not None and keygen != ours:
        out.append(
            f"key generator {keygen!r} with record key fields {keys} and partition fields "
            f"{parts}: lakesink makes their record keys and partition paths as {ours} does"
        )
    keygen_type = props.get(p.KEY_GENERATOR_TYPE)
    if keygen_type is not None and keygen_type not in _KEY_GENERATORS.values():
        out.append(
            f"key generator type {keygen_type!r} is not supported; valid: "
            + ", ".join(_KEY_GENERATORS.values())
        )
    if props.get(p.PARTITION_PATH_URLENCODE, "false").lower() == "true":
        out.append(f"{p.PARTITION_PATH_URLENCODE.value}=true is not supported")
    if props.get(p.POPULATE_META_FIELDS, "true").lower() != "true":
        out.append(
            f"{p.POPULATE_META_FIELDS.value}=false (virtual keys) is not supported; lakesink "
            "needs the _hoodie_* meta columns"
        )
    base_format = props.get(p.BASE_FILE_FORMAT, "PARQUET")
    if base_format.upper() != "PARQUET":
        out.append(f"base file format {base_format!r} is not supported; valid: PARQUET")
    if props.get(p.CDC_ENABLED, "false").lower() == "true":
        out.append(
            f"{p.CDC_ENABLED.value}=true is not supported: lakesink does not write change logs"
        )
    out += _unsupported_index(props, tuple(keys))
    return out


def _unsupported_index(props: Mapping[str, str], keys: tuple[str, ...]) -> list[str]:
    """What lakesink cannot keep of a declared bucket index (Java Hudi keeps no index in
    `hoodie.properties`; a table lakesink created with one names it there)."""
    try:
        index = BucketIndex.from_properties(props, keys)
    except (UnsupportedTableError, CorruptTableError) as e:
        return [str(e)]
    if index is None or set(index.effective_hash_fields) == set(keys):
        return []
    return [
        f"{BucketIndexProperty.HASH_FIELD.value}={props[BucketIndexProperty.HASH_FIELD]!r}: "
        f"lakesink hashes every record key field ({','.join(keys)})"
    ]


# --- Java properties text (what Hudi reads and writes) --------------------------------------


def _escape(text: str, is_key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "=:#!" or (ch == " " and (is_key or i == 0)):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return "".join(out)


def render_properties(
    props: Mapping[str, str], header: str = "Properties saved by lakesink"
) -> str:
    """Render `key=value` lines in the Java properties format, keys sorted."""
    lines = [f"#{header}"]
    lines += [f"{_escape(k, True)}={_escape(v, False)}" for k, v in sorted(props.items())]
    return "\n".join(lines) + "\n"


def _split_unescaped(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:":
            return line[:i], line[i + 1 :].lstrip()
        if ch in " \t":
            rest = line[i:].lstrip()
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip()
            return line[:i], rest
        i += 1
    return line, ""


def _unescape(text: str) -> str:
    out: list[str] = []
    it = iter(text)
    for ch in it:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(it, "")
        out.append({"n": "\n", "r": "\r", "t": "\t", "f": "\f"}.get(nxt, nxt))
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """Parse the Java properties format (comments, `=`/`:` separators, escapes, continuations)."""
    props: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # a line ending in an odd number of backslashes continues on the next line
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        key, value = _split_unescaped(line)
        props[_unescape(key)] = _unescape(value)
    return props
