"""How a Hudi writer fits a batch's rows to the table's schema (`schema.evolution`).

Hudi keeps a table's schema in each commit (`extraMetadata.schema`, the Avro text): its
`TableSchemaResolver` takes the latest completed commit's, and `hoodie.table.create.schema` in
hoodie.properties stays as the table was created. So a batch evolves a Hudi table by writing
its files in the evolved schema: the commit records the schema of the files it wrote, which
becomes the table's. The files of one instant share that schema (each task evolves the latest
schema by the same declared rows, and conforms its rows to the result), unless another writer's
evolution committed while the tasks resolved it: then the commit records their schemas unified
(`commit_schema_text`). Older base files keep theirs, and readers null-fill and widen them
(`TableReader`, `spark.read.format("lakesink")`, the audit's hudi-rs read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from lakesink.engine.evolution import conform, evolve, unify
from lakesink.errors import SchemaMismatchError
from lakesink.formats.hudi.table.avro_schema import (
    arrow_schema_of,
    avro_schema_for,
    check_matches,
    with_meta_columns,
)
from lakesink.settings import SchemaEvolutionMode

__all__ = ["SchemaFit", "commit_schema_text"]


def commit_schema_text(texts: Iterable[str]) -> str | None:
    """The Avro schema a commit records for the files of its tasks, whose statuses carry the
    schemas (`texts`) they wrote in: each task resolves the table's latest schema itself, so if
    another writer's evolution committed while they ran, two tasks can write in two schemas.
    The commit records them unified, so no column of either is lost from the table's latest
    schema (the widest first, then by name: the same text whatever order the tasks end in).
    None when no task wrote a schema."""
    distinct = sorted(set(t for t in texts if t))
    if len(distinct) <= 1:
        return distinct[0] if distinct else None
    schemas = sorted((arrow_schema_of(t) for t in distinct), key=len, reverse=True)
    record_name = str(json.loads(distinct[0])["name"])
    return avro_schema_for(with_meta_columns(unify(schemas)), record_name)


@dataclass(slots=True)
class SchemaFit:
    """Fits rows to the table's latest schema `table_schema` (Avro text): rows of that schema
    pass as they are; others, with `evolution` add-and-widen, are conformed to the evolved
    schema; else the mismatch is an error (naming the key when `evolution` is off)."""

    table_schema: str
    record_name: str
    evolution: SchemaEvolutionMode | None = None  # None: the writer's caller never evolves
    _evolved: dict[pa.Schema, pa.Schema] = field(default_factory=dict)

    def fit(self, data: pa.Table, where: str) -> pa.Table:
        """`data` (no meta columns) as the table takes it; SchemaMismatchError otherwise."""
        try:
            check_matches(self.table_schema, data.schema, self.record_name, where)
            return data
        except SchemaMismatchError as e:
            if self.evolution is None:
                raise
            if self.evolution == "off":
                raise SchemaMismatchError(
                    f"{e} (schema.evolution is off: set schema.evolution = add-and-widen to "
                    "evolve the table with the batch)"
                ) from e
        return conform(data, self.evolved(data.schema))

    def evolved(self, rows: pa.Schema) -> pa.Schema:
        """The table's schema evolved by `rows` (SchemaEvolutionError naming the field)."""
        out = self._evolved.get(rows)
        if out is None:
            out = evolve(arrow_schema_of(self.table_schema), rows, "add-and-widen").schema
            self._evolved[rows] = out
        return out
