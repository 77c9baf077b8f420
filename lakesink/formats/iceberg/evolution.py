"""Schema evolution on an Iceberg table: the schema update and the batch's append in one
catalog commit.

The engine's rule (`lakesink.engine.evolution.evolve`) says what the table's next schema is;
Iceberg gives its new columns field ids. The ids are chosen once, on the driver, before the
tasks write (`plan_evolution`: pyiceberg's `UpdateSchema.union_by_name` applied to the current
metadata, not committed): the tasks write their data files with them (`WriteContext` carries
the evolved schema as current, and the rows' evolved Arrow schema to conform rows to). The
commit stages the same update in the append's transaction (`stage_schema`), so the catalog
takes both or neither: a crash between can never leave a schema without its data or data
without its schema. If the table's schema moved meanwhile (another writer evolved it), the
update would hand out other ids than the files carry: the commit is refused, nothing lands.

The evolved schema travels to the commit as the text of the commit's `TableSchema` (pyiceberg's
JSON of the schema, "" when the batch changes nothing), so a pending entry of the async
committer carries it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from lakesink.engine.evolution import EvolutionMode, evolve
from lakesink.errors import CommitError
from lakesink.extras import require
from lakesink.formats.iceberg.schema import iceberg_schema

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

__all__ = ["PlannedEvolution", "plan_evolution", "schema_from_text", "stage_schema", "with_schema"]


@dataclass(frozen=True, slots=True)
class PlannedEvolution:
    """A batch's schema change, planned on the table's current metadata: the Iceberg schema
    with its new field ids, the Arrow schema the rows are conformed to, and what changed."""

    schema: Schema
    rows: pa.Schema
    changes: tuple[str, ...]

    def text(self) -> str:
        """The schema as the commit's `TableSchema` text carries it."""
        return self.schema.model_dump_json()


def plan_evolution(
    table: Table, rows: pa.Schema, mode: EvolutionMode, name: str
) -> PlannedEvolution | None:
    """The schema change `rows` bring to `table` (at its loaded metadata), None when they fit
    as is; SchemaEvolutionError (from `evolve`) for a change `mode` does not allow."""
    require("pyiceberg", "Iceberg tables")
    evolved = evolve(table.schema().as_arrow(), rows, mode)
    if not evolved.changed:
        return None
    # pyiceberg's own evolution by name, applied and never committed: new columns get the
    # next field ids, types widen, required columns become optional
    update = table.transaction().update_schema()
    update.union_by_name(iceberg_schema(evolved.schema))
    schema = update._apply()
    log.info(
        "table %s: the batch evolves the schema (%s) to schema %d",
        name, "; ".join(str(c) for c in evolved.changes), schema.schema_id,
    )  # fmt: skip
    return PlannedEvolution(schema, evolved.schema, tuple(str(c) for c in evolved.changes))


def with_schema(metadata: TableMetadata, schema: Schema) -> TableMetadata:
    """`metadata` with `schema` added and current, as the tasks write with it (never
    committed: the catalog's commit adds the schema through `stage_schema`)."""
    last = max(metadata.last_column_id, schema.highest_field_id)
    return metadata.model_copy(
        update={
            "schemas": [*metadata.schemas, schema],
            "current_schema_id": schema.schema_id,
            "last_column_id": last,
        }
    )


def schema_from_text(text: str) -> Schema | None:
    """The evolved schema a commit's `TableSchema` text carries; None for "" (no change)."""
    if not text:
        return None
    require("pyiceberg", "Iceberg tables")
    from pyiceberg.schema import Schema

    return Schema.model_validate_json(text)


def stage_schema(
    tx: Transaction,
    schema: Schema,
    table: str,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Stage the update to `schema` in the append's transaction `tx`: pyiceberg's update
    requires the current schema id it was built on, so the catalog takes it with the append or
    refuses both. CommitError when, on this base, the update would give other field ids than
    the data files carry (the table's schema moved since the batch began). A table with a name
    mapping gets it for the new schema in the same commit, new fields listing their `aliases`
    (schema.field.mapping's source names: name_mapping.py)."""
    before = tx.table_metadata.name_mapping()
    update = tx.update_schema()
    update.union_by_name(schema)
    update.commit()
    staged = tx.table_metadata.schema()
    if staged.as_struct() != schema.as_struct():
        raise CommitError(
            f"table {table}: its schema changed while the batch was written (schema "
            f"{staged.schema_id} now); the batch's files carry the field ids of the schema it "
            "planned, so nothing was appended: retrying the batch writes it again with the "
            "table's new schema"
        )
    if before is not None:
        from lakesink.formats.iceberg.name_mapping import NAME_MAPPING_PROPERTY, name_mapping_json

        tx.set_properties({NAME_MAPPING_PROPERTY: name_mapping_json(staged, aliases, before)})
