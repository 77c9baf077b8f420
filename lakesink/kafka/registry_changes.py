"""Change-stream values framed by a schema registry (write.operation=cdc, value.format=avro,
schema.registry.url): Debezium envelopes as its Avro converter registers them (or, with
cdc.format=field, flat records with an operation field), each decoded with its own writer
schema, fetched by id and cached as registry.py fetches plain values'.

`RegistryEnvelopes` only turns a framed value into the record (and its row's field schemas, for
the units of timestamps); changes.py's `ChangeDeserializer` reads the change from it exactly as
from a record whose schema is given by hand (debezium.py's `DebeziumDecoder.from_avro`, or
`OperationFieldDecoder.from_record`): operations, before/after, the source position, tombstones.

The row's columns are fixed for a run (spark/registry_columns.py pins them from the subject's
latest schema when none are declared). When they are a registered row (value.schema holding
the Avro schema, as pinned, or value.schema.file) a writer schema whose row has a
field the columns cannot hold (a new one, or a type wider than the column's) makes each of its
values a bad record naming the field: a table of keys keeps the columns it was created with,
and the value would lose the field in silence. Declared as a DDL, the columns are the ones to
keep: other fields of the row are ignored, as in every change stream.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from lakesink.errors import RecordError
from lakesink.kafka.avro import BadAvroValue
from lakesink.kafka.changes import (
    CdcFormat,
    avro_field_schemas,
    declared_rows,
    envelope_rows,
    is_avro_schema,
)
from lakesink.kafka.registry import RegistrySettings, UnknownSchemaId, WriterSchemas
from lakesink.kafka.registry_schemas import uncovered

__all__ = ["RegistryEnvelopes", "registry_envelopes"]


class RegistryEnvelopes:
    """Registry-framed Avro change values into envelope records (the `AvroEnvelopes` of
    changes.py). `columns`: the row's columns a writer schema's row must fit (None: any row;
    its fields beyond the columns are ignored)."""

    def __init__(
        self,
        settings: RegistrySettings,
        cdc_format: CdcFormat = "debezium",
        columns: pa.Schema | None = None,
    ) -> None:
        self._settings = settings
        self._cdc_format: CdcFormat = cdc_format
        self._columns = columns
        self._writers: WriterSchemas | None = None
        # per schema id: the row's field schemas, or why the id's values are bad records
        self._rows: dict[int, Mapping[str, Mapping[str, Any]] | RecordError] = {}

    def __getstate__(self) -> dict[str, Any]:  # a task builds its own cache
        return {"settings": self._settings, "cdc": self._cdc_format, "columns": self._columns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"], state["cdc"], state["columns"])  # type: ignore[misc]

    def read(self, value: bytes) -> tuple[Mapping[str, Any], Mapping[str, Mapping[str, Any]]]:
        if len(value) < 5 or value[0] != 0:
            raise RecordError(
                "value does not start with the schema registry's magic byte 0 and a schema id"
            )
        (schema_id,) = struct.unpack(">I", value[1:5])
        if self._writers is None:
            self._writers = WriterSchemas(self._settings, "avro")
        try:
            writer = self._writers.get(schema_id)
        except UnknownSchemaId as e:
            raise RecordError(f"value is framed with {e}") from None
        field_schemas = self._row_of(schema_id, writer)
        try:
            record: Mapping[str, Any] = writer.decoder.decode_one(value)
        except BadAvroValue as e:
            raise RecordError(f"writer schema id {schema_id}: {e}") from None
        return record, field_schemas

    def _row_of(self, schema_id: int, writer: Any) -> Mapping[str, Mapping[str, Any]]:
        """The row's field schemas of a writer schema, checked once per id."""
        known = self._rows.get(schema_id)
        if known is None:
            known = self._check(schema_id, writer)
            self._rows[schema_id] = known
        if isinstance(known, RecordError):
            raise RecordError(str(known))
        return known

    def _check(self, schema_id: int, writer: Any) -> Mapping[str, Mapping[str, Any]] | RecordError:
        row = envelope_rows(pa.struct(list(writer.columns)), self._cdc_format)
        if row is None:
            return RecordError(
                f"writer schema id {schema_id} is not a Debezium envelope: it has no 'after' record"
            )
        if self._columns is not None:
            path = uncovered(list(self._columns), list(row))
            if path is not None:
                return RecordError(
                    f"field {path!r} of the row of writer schema id {schema_id} does not fit "
                    f"the table's columns ({', '.join(self._columns.names)}): a table of keys "
                    "keeps the columns it was created with (write.operation=cdc); declare the "
                    "columns to keep in value.schema (a DDL: other fields are ignored), or "
                    "ingest into a new table, whose columns come from the latest schema"
                )
        return avro_field_schemas(writer.schema, self._cdc_format)


def registry_envelopes(
    settings: RegistrySettings,
    *,
    cdc_format: CdcFormat,
    schema: str | None,
    schema_file: str | None,
) -> RegistryEnvelopes:
    """The envelopes of a change stream whose row's columns are value.schema or
    value.schema.file (the rules in the module doc)."""
    rows = None
    if schema is None or is_avro_schema(schema):  # an envelope's row: fields must fit
        rows = declared_rows("avro", cdc_format, schema, schema_file)
    return RegistryEnvelopes(settings, cdc_format, rows)
