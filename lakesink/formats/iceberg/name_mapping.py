"""The Iceberg name mapping (`schema.name-mapping.default`, the spec's "Column Projection") of
the tables lakesink creates: for each field id the names a data file without field ids may
give it, so that files written by other tools (or added with `add_files`) resolve by name.

Each field lists its column name, then the names it had in an earlier mapping of the table,
then the source names schema.field.mapping renamed it from (`aliases`: column path -> names,
lakesink.kafka.field_mapping). A name is listed once per level: a field's current name wins
over another field's alias. The mapping is written with the table's creation and again in the
commit that evolves its schema (new fields get entries), never on its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakesink.extras import require

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table.name_mapping import MappedField, NameMapping
    from pyiceberg.types import IcebergType, NestedField

__all__ = ["NAME_MAPPING_PROPERTY", "name_mapping_json"]

NAME_MAPPING_PROPERTY = "schema.name-mapping.default"


def name_mapping_json(
    schema: Schema,
    aliases: Mapping[str, Sequence[str]] | None = None,
    existing: NameMapping | None = None,
) -> str:
    """The name mapping of `schema` as the table property's JSON text: `aliases` by column
    path (dotted), `existing` the table's mapping before (its names are kept)."""
    require("pyiceberg", "Iceberg tables")
    earlier: dict[int, list[str]] = {}
    if existing is not None:
        _index(existing.root, earlier)
    return json.dumps(_fields(schema.fields, "", aliases or {}, earlier))


def _index(fields: Sequence[MappedField], out: dict[int, list[str]]) -> None:
    for f in fields:
        if f.field_id is not None:
            out[f.field_id] = list(f.names)
        _index(f.fields, out)


def _fields(
    fields: Sequence[NestedField],
    where: str,
    aliases: Mapping[str, Sequence[str]],
    earlier: Mapping[int, Sequence[str]],
) -> list[dict[str, Any]]:
    taken = {f.name for f in fields}  # current names first: no alias may shadow a column
    out: list[dict[str, Any]] = []
    for f in fields:
        path = f"{where}{f.name}"
        names = [f.name]
        for extra in (*earlier.get(f.field_id, ()), *aliases.get(path, ())):
            if extra not in taken:
                taken.add(extra)
                names.append(extra)
        children = _children(f.field_type, f"{path}.", aliases, earlier)
        out.append(_entry(f.field_id, names, children))
    return out


def _children(
    t: IcebergType,
    where: str,
    aliases: Mapping[str, Sequence[str]],
    earlier: Mapping[int, Sequence[str]],
) -> list[dict[str, Any]]:
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(t, StructType):
        return _fields(t.fields, where, aliases, earlier)
    if isinstance(t, ListType):  # a dotted path goes through a list to its element's fields
        element = _children(t.element_type, where, aliases, earlier)
        return [_entry(t.element_id, ["element"], element)]
    if isinstance(t, MapType):
        key = _children(t.key_type, f"{where}key.", aliases, earlier)
        value = _children(t.value_type, f"{where}value.", aliases, earlier)
        return [_entry(t.key_id, ["key"], key), _entry(t.value_id, ["value"], value)]
    return []


def _entry(field_id: int, names: list[str], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """One field of the mapping as the spec writes it (`fields` left out when empty)."""
    out: dict[str, Any] = {"names": names, "field-id": field_id}
    if fields:
        out["fields"] = fields
    return out
