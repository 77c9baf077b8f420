"""Record keys framed by a schema registry (key.format avro, jsonschema or protobuf): each key
decoded with its own writer schema into the key's columns (`key.schema`, pinned at start from
the latest schema of the topic's key subject, `<topic>-key` or by the key record's name under
the record strategies: spark/registry_columns.py, kafka.registry_subjects), which join the
value's columns so that a record key field can come from the key.

A key field the value also has keeps the value's (a producer that writes the id in both agrees
with itself); the key's fills the value's nulls. The two must have one type (ConfigError at
start otherwise). A key that is not framed, has an id the registry does not know, or does not
decode or fit the key's columns makes the record a bad record whose reason says it was the key;
so does a record without a key when a key column is required. A key writer schema with a field
the key's columns lack is a bad record too (keys do not evolve the table: a new key field would
be a new record key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import ConfigError
from lakesink.kafka.decoded import Decoded, Deserializer
from lakesink.kafka.registry import RegistryDeserializer, RegistryFormat, RegistrySettings

__all__ = ["RegistryKeys", "decode_with_keys"]


def decode_with_keys(
    deserializer: Deserializer, values: Sequence[bytes | None], keys: Sequence[bytes | None]
) -> Decoded:
    """`deserializer`'s rows for `values`, handing it the records' keys where it reads them."""
    keyed = getattr(deserializer, "decode_keyed", None)
    return keyed(values, keys) if keyed is not None else deserializer.decode(values)


class RegistryKeys:
    """The rows of `inner` (the value's deserializer) joined with the columns of their
    registry-framed keys."""

    def __init__(
        self,
        inner: Deserializer,
        fmt: RegistryFormat,
        key_columns: pa.Schema,
        settings: RegistrySettings,
    ) -> None:
        self.inner = inner
        self._keys = RegistryDeserializer(fmt, key_columns, settings, "off")
        values = inner.value_schema
        for f in key_columns:
            if f.name in values.names and values.field(f.name).type != f.type:
                raise ConfigError(
                    f"key field {f.name!r} is {f.type} in the key's columns but "
                    f"{values.field(f.name).type} in the value's: declare one type in "
                    "key.schema or value.schema"
                )
        self._shared = [f.name for f in key_columns if f.name in values.names]
        self._added = [f for f in key_columns if f.name not in values.names]
        self._schema = pa.schema([*values, *self._added])
        self._required = [f.name for f in key_columns if not f.nullable]

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        return self.decode_keyed(values, [None] * len(values))

    def decode_keyed(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> Decoded:
        decoded = decode_with_keys(self.inner, values, keys)
        # row k of decoded.table is the k-th value that neither failed nor was skipped
        rows = [
            i for i in range(len(values)) if i not in decoded.failures and i not in decoded.skipped
        ]
        failures = dict(decoded.failures)
        framed: list[int] = []  # positions in `rows` whose key is decoded
        for k, i in enumerate(rows):
            if keys[i] is None and self._required:
                failures[i] = (
                    f"the record has no key, and key column {self._required[0]!r} is required "
                    "(key.format reads it from the key)"
                )
            else:
                framed.append(k)
        got = self._keys.decode([keys[rows[k]] for k in framed])
        for j, why in got.failures.items():
            failures[rows[framed[j]]] = f"the record key: {why}"
        kept = [k for j, k in enumerate(framed) if j not in got.failures]
        table = decoded.table
        if len(kept) != table.num_rows:
            table = table.take(pa.array(kept, pa.int64()))
        return Decoded(self._joined(table, got.table), failures, decoded.skipped)

    def _joined(self, values: pa.Table, keys: pa.Table) -> pa.Table:
        columns: dict[str, Any] = {name: values.column(name) for name in values.column_names}
        for name in self._shared:
            columns[name] = pc.coalesce(values.column(name), keys.column(name))
        for f in self._added:
            columns[f.name] = keys.column(f.name)
        return pa.table([columns[name] for name in self._schema.names], schema=self._schema)
