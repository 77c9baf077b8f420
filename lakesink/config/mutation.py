"""The row-mutation keys: whether records append rows or change them by key (write.operation),
which version of a key wins (table.ordering.field), how a change stream says what it does
(cdc.*) and how keys find their file group (table.bucket.count). Their combinations with the
other keys are checked in `check_mutation` (the registry calls it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakesink.config.parsers import Key, choice, non_negative_int, optional_str, positive_int
from lakesink.errors import ConfigError
from lakesink.settings import DEFAULT_OP_VALUES, parse_op_values

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_RECORD_KEY = ("kafka_topic", "kafka_partition", "kafka_offset")
"""table.record.key.fields' default: the Kafka coordinates, which make every record its own
key."""


def op_values(v: Any) -> str:
    """cdc.op.values: 'value=operation,...', checked and written back in one spelling."""
    try:
        mapping = parse_op_values(str(v))
    except ConfigError as e:
        raise ValueError(
            f"{e}; expected value=operation items such as {DEFAULT_OP_VALUES}"
        ) from None
    return ",".join(f"{value}={op.value}" for value, op in mapping.items())


TABLE_TYPES = ("COPY_ON_WRITE", "MERGE_ON_READ")


def table_type(v: Any) -> str:
    """table.type, in Hudi's spelling (upper case) whatever the case given."""
    text = str(v).strip().upper()
    if text not in TABLE_TYPES:
        raise ValueError(f"expected one of {', '.join(TABLE_TYPES)}")
    return text


def _field_name(v: Any) -> str:
    text = str(v).strip()
    if not text:
        raise ValueError("expected a field name")
    return text


MUTATION_KEYS: tuple[Key, ...] = (
    Key(
        "write.operation",
        choice("append", "upsert", "cdc"),
        "append",
        "What a record does to the table: append (a new row, always), upsert (the new version "
        "of its key: table.record.key.fields) or cdc (the record says insert, update or delete: "
        "a Debezium change event, or cdc.format=field). upsert and cdc need "
        "table.record.key.fields; a key finds its file group by a bucket index "
        "(table.bucket.count); on Iceberg tables iceberg.write.mode chooses copy-on-write or "
        "merge-on-read. See the docs pages Change "
        "data capture and Iceberg tables.",
    ),
    Key(
        "table.type",
        table_type,
        "COPY_ON_WRITE",
        "Hudi tables written by key (write.operation upsert or cdc): COPY_ON_WRITE (each batch "
        "rewrites the base files of the buckets it touches) or MERGE_ON_READ (each batch is a "
        "deltacommit adding one log file of its changed rows and deletes to each touched "
        "bucket; readers merge logs over base files). Fixed when the table is created: the "
        "other type on an existing table is refused, naming both. See the docs page Change data "
        "capture.",
    ),
    Key(
        "table.compaction.every.commits",
        non_negative_int,
        5,
        "table.type=MERGE_ON_READ: after this many deltacommits the writer compacts the table "
        "inline (under the table lock, between batches): each file slice with log files is "
        "merged into a new base file, a compaction instant completed as a commit. 0: never "
        "inline (run lakesink table compact). See the docs page Change data capture.",
    ),
    Key(
        "table.ordering.field",
        optional_str,
        None,
        "upsert and cdc: a value column ordering the versions of a key (Hudi's precombine "
        "field): the higher value wins, ties going to the later Kafka offset; a null orders "
        "lowest. Unset: the later Kafka offset wins, except for cdc with cdc.format=debezium, "
        "where the source position orders (column _source_position, added to the table).",
    ),
    Key(
        "cdc.format",
        choice("debezium", "field"),
        "debezium",
        "write.operation=cdc: debezium (Debezium change events: op, before, after, source; "
        "value.schema declares the columns of after/before) or field (a flat record whose "
        "field cdc.op.field says the operation, mapped by cdc.op.values).",
    ),
    Key(
        "cdc.op.field",
        _field_name,
        "op",
        "cdc.format=field: the field holding each record's operation (a column of value.schema).",
    ),
    Key(
        "cdc.op.values",
        op_values,
        DEFAULT_OP_VALUES,
        "cdc.format=field: value=operation items (operations insert, update, delete) mapping "
        "the operation field's values, matched exactly; a number or boolean field matches by "
        "its JSON text (1, true). A record with another value is a bad record. The default "
        "is the one-letter codes of AWS DMS and Oracle GoldenGate.",
    ),
    Key(
        "table.bucket.count",
        positive_int,
        8,
        "upsert and cdc: the buckets (file groups) of each partition; a key's bucket is the "
        "hash of its record key as Hudi's bucket index computes it, so no lookup is needed "
        "(Iceberg: the partition field bucket[N] of the first record key field, unless "
        "iceberg.partition.spec buckets a key field). "
        "Fixed when the table is created: a different count on an existing table is refused, "
        "naming both; another count means another table, filled again from Kafka. More "
        "buckets: more, smaller files and more parallel tasks; fewer: fewer, larger files.",
    ),
)


def check_mutation(cfg: Mapping[str, Any]) -> None:
    """ConfigError for a write.operation the other keys cannot serve, naming the key and what
    would be valid. `cfg`: the parsed values of every key."""
    operation = cfg["write.operation"]
    ordering = cfg["table.ordering.field"]
    if operation == "append":
        if cfg["table.type"] != "COPY_ON_WRITE":
            raise ConfigError(
                f"table.type={cfg['table.type']} writes changes by key: it needs "
                "write.operation=upsert or cdc (append tables are COPY_ON_WRITE)"
            )
        if ordering is not None:
            raise ConfigError(
                f"table.ordering.field={ordering} orders the versions of a key: it needs "
                "write.operation=upsert or cdc (append keeps every record)"
            )
        if cfg["iceberg.write.mode"] != "copy-on-write":
            raise ConfigError(
                f"iceberg.write.mode={cfg['iceberg.write.mode']} writes changes by key: it "
                "needs write.operation=upsert or cdc (appends never delete a row)"
            )
        return
    if cfg["table.format"] == "iceberg" and cfg["table.type"] != "COPY_ON_WRITE":
        raise ConfigError(
            f"table.type={cfg['table.type']} is Hudi's key: an Iceberg table written with "
            f"write.operation={operation} is merge-on-read with "
            "iceberg.write.mode=merge-on-read (position deletes); leave "
            "table.type=COPY_ON_WRITE"
        )
    if cfg["commit.mode"] == "async" and cfg["table.format"] != "iceberg":
        # the next batch would rewrite buckets over slices the pending commit is replacing
        # (Iceberg tables of keys wait for the pending commit before they plan: spark/sink.py)
        raise ConfigError(
            f"write.operation={operation} on a Hudi table commits each batch before the next "
            "one rewrites its buckets: set commit.mode=sync (the default); commit.mode=async "
            "serves Iceberg tables of keys"
        )
    if cfg["write.path"] == "direct" and cfg["table.format"] != "iceberg":
        raise ConfigError(
            f"write.path=direct cannot serve write.operation={operation} on a Hudi table: each "
            "bucket is rewritten by one task, so rows are shuffled on a Spark DataFrame; set "
            "write.path=auto or dataframe"
        )
    keys = tuple(cfg["table.record.key.fields"])
    if keys == DEFAULT_RECORD_KEY:
        raise ConfigError(
            f"write.operation={operation} needs table.record.key.fields set to the columns "
            "that identify a row (e.g. id): the default, the Kafka coordinates, makes every "
            "record its own key"
        )
    transforms = [k for k in ("transform.sql", "transform.python", "transform.arrow") if cfg[k]]
    if operation == "cdc":
        if cfg["value.format"] not in ("json", "avro"):
            raise ConfigError(
                f"write.operation=cdc reads change events from JSON or Avro values: set "
                f"value.format=json or avro (not {cfg['value.format']})"
            )
        if transforms:
            raise ConfigError(
                f"write.operation=cdc cannot apply {transforms[0]}: a transformation would see "
                "the rows of change events without their operation; remove it, or land the "
                "table and transform when reading"
            )
    rows = _row_columns(cfg)
    if rows is None:
        return  # a transformation makes the columns: the writer checks them
    missing = [k for k in keys if k not in rows.names]
    if missing:
        raise ConfigError(
            f"table.record.key.fields names {', '.join(missing)}, not column(s) of the rows: "
            f"use columns of {', '.join(rows.names)}"
        )
    if ordering is not None:
        if ordering not in rows.names:
            raise ConfigError(
                f"table.ordering.field={ordering} is not a column of the rows: use one of "
                f"{', '.join(n for n in rows.names if n not in keys)}"
            )
        if ordering in keys:
            raise ConfigError(
                f"table.ordering.field={ordering} is a record key field: every version of a key "
                "has the same value there; use a column that grows with each version (a "
                "version number, an update time)"
            )
        import pyarrow as pa

        t = rows.field(ordering).type
        if pa.types.is_nested(t) or pa.types.is_boolean(t):
            raise ConfigError(
                f"table.ordering.field={ordering} is of type {t}: use a number, decimal, "
                "string, date or timestamp column"
            )
    if (
        operation == "cdc"
        and cfg["cdc.format"] == "field"
        and cfg["cdc.op.field"] not in rows.names
    ):
        raise ConfigError(
            f"cdc.op.field={cfg['cdc.op.field']} is not a column of the rows: declare it in "
            f"value.schema (columns: {', '.join(rows.names)})"
        )


def _row_columns(cfg: Mapping[str, Any]) -> pa.Schema | None:
    """The columns of the rows a key and an ordering field are taken from: a change stream's
    declared row; for upsert the decoded value's columns with the Kafka metadata columns, or
    None when a transformation makes the columns, or the registry does (no value.schema: the
    subject's registered versions, or a change stream's latest envelope, known only when the
    ingestion starts)."""
    from lakesink.config.table import field_mapping_of
    from lakesink.kafka.changes import check_change_columns, declared_rows

    mapping = field_mapping_of(cfg)  # the keys name columns: the rows' mapped names
    declared = cfg["value.schema"] or cfg["value.schema.file"]
    if cfg["write.operation"] == "cdc":
        if cfg["schema.registry.url"] and not declared:
            return None  # the latest envelope's row, pinned when the ingestion starts
        rows = declared_rows(
            cfg["value.format"], cfg["cdc.format"], cfg["value.schema"], cfg["value.schema.file"]
        )
        with_position = cfg["cdc.format"] == "debezium" and cfg["table.ordering.field"] is None
        rows = mapping.rename_schema(rows)
        check_change_columns(rows, with_source_position=with_position)
        return rows
    if any(cfg[k] for k in ("transform.sql", "transform.python", "transform.arrow")):
        return None
    if cfg["schema.registry.url"] and (not declared or cfg["key.format"] != "raw"):
        return None  # the key's columns (key.format) join the row when the ingestion starts
    from lakesink.config.records import registry_settings
    from lakesink.kafka.deserializers import make_deserializer
    from lakesink.kafka.field_mapping import mapped_values
    from lakesink.kafka.reader import output_schema

    values = make_deserializer(
        cfg["value.format"],
        schema=cfg["value.schema"],
        schema_file=cfg["value.schema.file"],
        avro_wire_format=cfg["value.avro.wire.format"],
        avro_schema_ids=cfg["value.avro.schema.ids"],
        registry=registry_settings(cfg),
    )
    return output_schema(mapped_values(values, mapping))
