"""The table keys (table.* but the services): where the table is, its format, name, version,
partitioning, record key and file size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakesink.config.parsers import (
    Key,
    choice,
    optional_str,
    positive_int,
    str_list,
    table_uri,
    table_version,
)

if TYPE_CHECKING:
    from lakesink.kafka.field_mapping import FieldMapping


def field_mapping(v: Any) -> str | None:
    """schema.field.mapping: 'source=column,...', checked and written back in one spelling."""
    from lakesink.errors import ConfigError
    from lakesink.kafka.field_mapping import FieldMapping

    if v is None:
        return None
    try:
        mapping = FieldMapping.parse(str(v))
    except ConfigError as e:
        raise ValueError(str(e).removeprefix("schema.field.mapping: ")) from None
    return mapping.text() or None


def field_mapping_of(values: Mapping[str, Any]) -> FieldMapping:
    """The parsed schema.field.mapping of a configuration's values (empty when unset)."""
    from lakesink.kafka.field_mapping import FieldMapping

    return FieldMapping.parse(values["schema.field.mapping"])


TABLE_KEYS: tuple[Key, ...] = (
    Key(
        "table.path",
        table_uri,
        None,
        "Where the Hudi table is (created if missing): a local path, file:///path, "
        "s3://bucket/prefix, gs://bucket/prefix or abfss://container@account/prefix.",
        required=True,
    ),
    Key(
        "table.format",
        choice("hudi", "iceberg"),
        "hudi",
        "The table format lakesink writes: hudi (table.path is the table) or iceberg "
        "(table.path is the warehouse; the table is iceberg.namespace.table.name in the "
        "iceberg.catalog.* catalog).",
    ),
    Key("table.name", optional_str, None, "Table name (default: the last folder of table.path)."),
    Key("table.version", table_version, 8, "Hudi table version to create: 6 or 8."),
    Key("table.partition.by", str_list, (), "Columns to partition by, comma-separated."),
    Key(
        "table.partition.date.from",
        optional_str,
        None,
        "A timestamp column; rows are partitioned by its UTC date in column 'dt'.",
    ),
    Key(
        "table.record.key.fields",
        str_list,
        ("kafka_topic", "kafka_partition", "kafka_offset"),
        "Columns forming the Hudi record key; with write.operation upsert or cdc, the columns "
        "that identify a row (required: the default, the Kafka coordinates, makes every "
        "record its own key).",
    ),
    Key(
        "table.target.file.size.bytes",
        positive_int,
        128 * 1024 * 1024,
        "Base files roll over at about this size.",
    ),
    Key(
        "schema.evolution",
        choice("add-and-widen", "off"),
        "add-and-widen",
        "add-and-widen: a batch whose rows add optional columns (nested too), widen a type "
        "(int to long, float to double) or make a required column optional changes the table "
        "schema in the batch's own commit; columns the rows lack are written as null; a type "
        "change that is not a widening or a new required column stops with an error naming "
        "the field. off: any change of the table schema is an error.",
    ),
    Key(
        "schema.field.mapping",
        field_mapping,
        None,
        "source=column items renaming record fields to table columns, e.g. "
        "'userId=user_id,address.zip=postcode' (a nested field by its dotted path through "
        "structs and lists of structs; the target is the field's new name at its level). "
        "Applies to every value format and to the key's fields (key.format); value.schema and "
        "the registry's schemas keep the source names, every key naming a column "
        "(table.record.key.fields, table.ordering.field, cdc.op.field, partitioning) takes the "
        "column name. A target must be a letter or _ then letters, digits or _; two fields "
        "landing on one column are refused; a mapped field the rows lack is a warning (a "
        "later schema may bring it). Iceberg tables lakesink creates list the source names "
        "as aliases in schema.name-mapping.default. See the docs page Schemas.",
    ),
)
