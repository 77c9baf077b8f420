"""The schema a commit records, as a typed value the table change carries.

A `TableSchema` is the Arrow schema of the rows, the format's field ids (Iceberg's, by column
name; None where the format has none: Hudi) and the format's encoded text (Avro JSON with the
meta columns for Hudi, "" for Iceberg, whose table metadata keeps its schema). The text is what
goes on disk: commit files, snapshot summaries and pending entries hold it and nothing else,
so their bytes do not depend on the other two halves.

A schema read back from disk (a commit, a pending entry) has its text only: the Arrow half and
the field ids cannot be rebuilt without the format (`from_text`). Two schemas are equal when
they encode the same text with the same field ids; the Arrow half does not take part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NO_SCHEMA", "TableSchema"]


@dataclass(frozen=True, slots=True)
class TableSchema:
    """The rows' schema as one commit records it (see the module's docstring)."""

    text: str = ""  # the format's encoding, written as is
    arrow: pa.Schema | None = field(default=None, compare=False)  # None once read back
    field_ids: Mapping[str, int] | None = None  # column name -> the format's field id

    def __post_init__(self) -> None:
        if self.field_ids is not None:
            object.__setattr__(self, "field_ids", MappingProxyType(dict(self.field_ids)))

    @classmethod
    def from_text(cls, text: str) -> TableSchema:
        """A schema as read back from a commit or a pending entry: its text only."""
        return cls(text=text)

    @classmethod
    def of(cls, schema: TableSchema | str) -> TableSchema:
        """`schema`, or its text alone taken as `from_text` (a caller holding the encoding)."""
        return cls.from_text(schema) if isinstance(schema, str) else schema

    def encode(self) -> str:
        """The text a commit records ("" when the format records none)."""
        return self.text

    def with_field_ids(self, ids: Mapping[str, int] | None) -> TableSchema:
        """This schema with the format's field ids (the text unchanged)."""
        return TableSchema(self.text, self.arrow, ids)

    def __bool__(self) -> bool:
        """True when the commit records a schema text."""
        return bool(self.text)


NO_SCHEMA = TableSchema()
"""A commit that records no schema (Iceberg's data commits, a clean)."""
