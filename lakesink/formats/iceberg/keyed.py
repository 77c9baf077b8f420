"""Iceberg tables of keys (write.operation upsert or cdc): the layout that lets a batch find the
data files holding its keys without an index to look up or keep.

A table of keys has
- identifier fields: the record key (table.record.key.fields), as required columns;
- a partition field `bucket[N](col)` on one key column: Iceberg's own bucket transform (Murmur3 of
  the value, modulo N, as every Iceberg engine computes it), so every version of a key lands in
  one bucket. The partition spec's other fields (iceberg.partition.spec, table.partition.by) stay;
- the table properties `lakesink.row-mutations` (`copy-on-write` or `merge-on-read`,
  iceberg.write.mode) and, when versions are ordered by a column, `lakesink.ordering-field`.

The key -> data file mapping is therefore the bucket value in each data file's partition tuple,
kept by Iceberg itself in the manifests: a bucket's files are the current snapshot's data files
whose partition holds that bucket (in any value of the other partition fields). lakesink keeps
nothing beside the table; each batch rebuilds the mapping by planning the current snapshot
(`bucket_files`). A rewrite that keeps partitions (lakesink iceberg rewrite-data-files, Spark's
rewrite_data_files) keeps the layout: it never puts rows of two buckets in one file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from lakesink.errors import ConfigError, RecordError, UnsupportedTableError
from lakesink.formats.iceberg.datafiles import DataFileDescription, describe
from lakesink.formats.iceberg.schema import PartitionFieldSetting

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

__all__ = [
    "MUTATIONS_PROPERTY",
    "ORDERING_PROPERTY",
    "KeyedLayout",
    "bucket_files",
    "buckets_of",
    "keyed_partition_fields",
    "keyed_properties",
    "layout_of",
    "planned_once",
    "required_keys",
]

T = TypeVar("T")

MUTATIONS_PROPERTY = "lakesink.row-mutations"
"""Table property of a table of keys: how a batch lands (`copy-on-write`: it rewrites the data
files of the buckets its keys fall in; `merge-on-read`: it adds position deletes and new data
files, lakesink.formats.iceberg.rowdelta)."""
ORDERING_PROPERTY = "lakesink.ordering-field"
"""Table property: the column ordering two versions of a key (absent: the Kafka offset alone)."""
COPY_ON_WRITE = "copy-on-write"
MERGE_ON_READ = "merge-on-read"
# Iceberg's own properties naming the row-level mode, so other engines' writes match it
_ICEBERG_MODE_PROPERTIES = ("write.update.mode", "write.delete.mode", "write.merge.mode")


@dataclass(frozen=True, slots=True)
class KeyedLayout:
    """How a table of keys is laid out: its record key (identifier fields), ordering column,
    and the bucket partition field (its source column, count and position in the spec)."""

    key: tuple[str, ...]
    ordering: str | None
    bucket_column: str
    bucket_count: int
    spec_id: int
    bucket_position: int
    mode: str = COPY_ON_WRITE
    """`copy-on-write` or `merge-on-read` (iceberg.write.mode when the table was created)."""

    def bucket_of_partition(self, partition: Sequence[Any]) -> int:
        """The bucket of a data file, from its partition tuple."""
        return int(partition[self.bucket_position])


def required_keys(rows: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """`rows` with the key columns non-nullable: Iceberg's identifier fields are required."""
    missing = [k for k in key if k not in rows.names]
    if missing:
        raise ConfigError(
            f"table.record.key.fields names {', '.join(missing)}, not column(s) of the rows: "
            f"use columns of {', '.join(rows.names)}"
        )
    return pa.schema([f.with_nullable(False) if f.name in key else f for f in rows])


def keyed_partition_fields(
    fields: Sequence[PartitionFieldSetting], key: Sequence[str], bucket_count: int
) -> tuple[PartitionFieldSetting, ...]:
    """The partition fields of a new table of keys: the configured ones, plus
    `bucket[bucket_count](first key column)` unless one of them already buckets a key column
    (then that one is the table's bucket field)."""
    if any(f.transform == "bucket" and f.column in key for f in fields):
        return tuple(fields)
    return (*fields, PartitionFieldSetting("bucket", key[0], bucket_count))


def keyed_properties(ordering: str | None, mode: str = COPY_ON_WRITE) -> dict[str, str]:
    """The table properties a new table of keys is created with (`mode`: iceberg.write.mode)."""
    out = {MUTATIONS_PROPERTY: mode}
    if mode == MERGE_ON_READ:
        out.update(dict.fromkeys(_ICEBERG_MODE_PROPERTIES, MERGE_ON_READ))
    if ordering is not None:
        out[ORDERING_PROPERTY] = ordering
    return out


def with_identifier_fields(schema: Schema, key: Sequence[str]) -> Schema:
    """`schema` with the key columns as its identifier fields (they must be required)."""
    from pyiceberg.schema import Schema as IcebergSchema

    ids = []
    for name in key:
        field = schema.find_field(name)
        if not field.required:
            raise ConfigError(f"record key column {name!r} must be required (never null)")
        ids.append(field.field_id)
    return IcebergSchema(*schema.fields, schema_id=schema.schema_id, identifier_field_ids=ids)


def layout_of(metadata: TableMetadata, table: str) -> KeyedLayout | None:
    """The layout of a table of keys; None for a table lakesink did not create for keys.
    UnsupportedTableError when the marker is there but the layout is not (identifier fields,
    a bucket field on one of them in the current spec)."""
    if metadata.properties.get(MUTATIONS_PROPERTY) is None:
        return None
    mode = metadata.properties[MUTATIONS_PROPERTY]
    if mode not in (COPY_ON_WRITE, MERGE_ON_READ):
        raise UnsupportedTableError(
            f"table {table}: {MUTATIONS_PROPERTY}={mode!r}; this lakesink writes only "
            f"{COPY_ON_WRITE!r} and {MERGE_ON_READ!r} tables of keys"
        )
    from pyiceberg.transforms import BucketTransform

    schema = metadata.schema()
    key = tuple(_identifier_names_in_order(schema))
    spec = metadata.spec()
    for i, field in enumerate(spec.fields):
        source = schema.find_column_name(field.source_id)
        if isinstance(field.transform, BucketTransform) and source in key:
            return KeyedLayout(
                key,
                metadata.properties.get(ORDERING_PROPERTY),
                str(source),
                int(field.transform.num_buckets),
                spec.spec_id,
                i,
                mode,
            )
    raise UnsupportedTableError(
        f"table {table} is a table of keys ({MUTATIONS_PROPERTY}) but its partition spec has no "
        f"bucket field on a record key column ({', '.join(key) or 'no identifier fields'}); was "
        "its spec or schema changed by another engine?"
    )


def _identifier_names_in_order(schema: Schema) -> list[str]:
    """The identifier fields' names in the order of their ids as declared (the record key's
    order when lakesink created the table)."""
    return [str(schema.find_column_name(i)) for i in schema.identifier_field_ids]


def check_layout(
    layout: KeyedLayout,
    key: Sequence[str],
    ordering: str | None,
    fields: Sequence[PartitionFieldSetting],
    bucket_count: int,
    table: str,
) -> None:
    """ConfigError naming both values when the settings of a writer (`fields`: its partition
    fields, `bucket_count`: table.bucket.count) do not match the table of keys it opens: the
    record key, the ordering field, the bucket field."""
    if tuple(layout.key) != tuple(key):
        raise ConfigError(
            f"table.record.key.fields={','.join(key)}, but table {table} is keyed by "
            f"{','.join(layout.key)}: set table.record.key.fields={','.join(layout.key)}"
        )
    if layout.ordering != ordering:
        raise ConfigError(
            f"table.ordering.field={ordering}, but table {table} orders versions by "
            f"{layout.ordering}: a table keeps the ordering it was created with"
        )
    wanted = keyed_partition_fields(fields, key, bucket_count)
    bucket = next(f for f in wanted if f.transform == "bucket" and f.column in key)
    if bucket.column != layout.bucket_column or bucket.buckets != layout.bucket_count:
        raise ConfigError(
            f"the settings bucket the keys by bucket[{bucket.buckets}]({bucket.column}), but "
            f"table {table} has bucket[{layout.bucket_count}]({layout.bucket_column}): the "
            "buckets are fixed when a table is created; another count means another table"
        )


_PLANNED: OrderedDict[tuple[str, int, Hashable], Mapping[int, Any]] = OrderedDict()
_PLANNED_MAX = 8  # a writer needs its table's newest one or two; a process may write several


def planned_once(
    table: Table, what: Hashable, plan: Callable[[], Mapping[int, T]]
) -> Mapping[int, T]:
    """`plan()` of the table's current snapshot, planned once per snapshot in this process (a
    read-only view: it is shared). A snapshot never changes (its id names one manifest list
    of immutable manifests), so a batch that planned its buckets at its start checks them at
    commit without reading every manifest again while `main` has not moved; after any other
    commit the new snapshot is planned afresh."""
    snapshot = table.metadata.current_snapshot_id
    if snapshot is None:
        return MappingProxyType({})
    key = (str(table.metadata.table_uuid), snapshot, what)
    found = _PLANNED.get(key)
    if found is None:
        found = MappingProxyType(dict(plan()))
        _PLANNED[key] = found
        while len(_PLANNED) > _PLANNED_MAX:
            _PLANNED.popitem(last=False)
    else:
        _PLANNED.move_to_end(key)
    return found


def bucket_files(
    table: Table, layout: KeyedLayout
) -> Mapping[int, tuple[DataFileDescription, ...]]:
    """The data files of each bucket in the table's current snapshot (buckets without files
    absent), each as its description, planned once per snapshot (`planned_once`).
    UnsupportedTableError for a file of another partition spec or one with delete files:
    lakesink writes neither into a table of keys."""
    return planned_once(table, ("data files", layout), lambda: _plan_bucket_files(table, layout))


def _plan_bucket_files(
    table: Table, layout: KeyedLayout
) -> dict[int, tuple[DataFileDescription, ...]]:
    name = ".".join(table.name())
    out: dict[int, list[DataFileDescription]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if task.delete_files:
            raise UnsupportedTableError(
                f"table {name}: data file {f.file_path} has delete files; lakesink rewrites "
                "the buckets of a table of keys only while none has"
            )
        if f.spec_id != layout.spec_id:
            raise UnsupportedTableError(
                f"table {name}: data file {f.file_path} was written under partition spec "
                f"{f.spec_id}, not the table's bucket spec {layout.spec_id}; rewrite it first"
            )
        partition = tuple(f.partition[i] for i in range(len(f.partition)))
        bucket = layout.bucket_of_partition(partition)
        out.setdefault(bucket, []).append(describe(f, f.spec_id))
    return {b: tuple(sorted(files, key=lambda d: d.path)) for b, files in out.items()}


def live_paths(
    found: Mapping[int, Iterable[DataFileDescription]], buckets: Iterable[int]
) -> dict[int, frozenset[str]]:
    """The paths of the files of each of `buckets` (an empty set for a bucket without files)."""
    return {b: frozenset(d.path for d in found.get(b, ())) for b in buckets}


def buckets_of(rows: pa.Table, layout: KeyedLayout, schema: Schema) -> np.ndarray[Any, Any]:
    """The bucket of every row (int32): Iceberg's bucket transform of its bucket column, as
    pyiceberg computes it when it splits the rows into partitions. RecordError for a null."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.transforms import BucketTransform

    field = schema.find_field(layout.bucket_column)
    column = rows.column(layout.bucket_column)
    if column.null_count:
        raise RecordError(
            f"record key column {layout.bucket_column!r} has {column.null_count} null(s); a row "
            "written by key needs a key"
        )
    column = column.cast(schema_to_pyarrow(field.field_type))
    transform = BucketTransform(layout.bucket_count).pyarrow_transform(field.field_type)
    out = transform(column)
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    return np.asarray(out.to_numpy(zero_copy_only=False), dtype=np.int32)
