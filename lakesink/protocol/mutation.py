"""What a change of one row is, whatever stream it came from (Debezium, an operation field).

A `RowChange` is one version of one key: the operation, the key columns' values, the row as
it is after the change (for a delete: the last row the source knew, or only the key), the
ordering value that decides which of two versions of a key wins, and the columns whose value
the source did not send (PostgreSQL's unchanged TOAST values), which keep the stored value.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from lakesink.errors import RecordError

# What an ordering value may be: it must compare with the other versions of its key.
Ordering = int | float | str | bytes | Decimal

OPERATION_COLUMN = "_lakesink_op"
"""The rows of a change stream carry each version's operation here (int8, `RowOperation.code`);
the writer drops the column (a winning delete removes its key). Rows without it are upserts."""
UNAVAILABLE_COLUMN = "_lakesink_unavailable"
"""Optional list<string>: the columns whose value a version did not carry (PostgreSQL's
unchanged TOAST values); the writer keeps the stored value and drops the column."""
SOURCE_POSITION_COLUMN = "_source_position"
"""The ordering column of a Debezium stream when `table.ordering.field` names none: the
source's position of the change (PostgreSQL: source.sequence / lsn, as fixed-width hex text,
so text order is the source's order). A table column: Hudi's readers order versions by it."""
CHANGE_COLUMNS = (OPERATION_COLUMN, UNAVAILABLE_COLUMN)
"""Columns of a change stream's rows that are never written to the table."""


class RowOperation(enum.Enum):
    """What a change does to its key. `code` is the value of the operation column (int8) in
    the Arrow tables the fold works on."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"

    @property
    def code(self) -> int:
        return _CODES[self]

    @property
    def is_delete(self) -> bool:
        return self is RowOperation.DELETE

    @classmethod
    def from_code(cls, code: int) -> RowOperation:
        for op, c in _CODES.items():
            if c == code:
                return op
        raise RecordError(
            f"operation code {code!r} is not one of 0 (insert), 1 (update), 2 (delete)"
        )

    @classmethod
    def parse(cls, text: str) -> RowOperation:
        """`insert`, `update` or `delete`, in any case (the values of an op-field mapping)."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise RecordError(
                f"row operation {text!r} is not one of insert, update, delete"
            ) from None


_CODES: dict[RowOperation, int] = {
    RowOperation.INSERT: 0,
    RowOperation.UPDATE: 1,
    RowOperation.DELETE: 2,
}


@dataclass(frozen=True, slots=True)
class RowChange:
    """One version of one key. `row` maps column names to values (a delete's row may hold only
    the key); `ordering` is None when the stream carries none (it then orders lowest, ties going
    to the later Kafka offset); `unavailable` names columns whose value was not sent: `row` has
    None there and a merge keeps the stored value."""

    operation: RowOperation
    key: tuple[tuple[str, Any], ...]
    row: Mapping[str, Any]
    ordering: Ordering | None = None
    unavailable: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.key:
            raise RecordError("a row change needs at least one key column")
        for name, value in self.key:
            if value is None:
                raise RecordError(f"key column {name!r} has no value")
            if name in self.unavailable:
                raise RecordError(f"key column {name!r} is marked unavailable")
        # A read-only view: the value is frozen, its row must not change under a holder.
        object.__setattr__(self, "row", MappingProxyType(dict(self.row)))

    @property
    def key_values(self) -> tuple[Any, ...]:
        return tuple(v for _, v in self.key)
