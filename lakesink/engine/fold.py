"""The fold by key: of all versions of a key, the one the ordering rule makes the winner.

The rule (issue 29), the same inside one batch, across batches, and on replay:

1. the higher ordering value wins; a null ordering value orders below every value (a stream
   without ordering values is ordered by its Kafka coordinates alone);
2. on equal ordering values, the later Kafka offset wins;
3. on equal offsets, the higher partition number wins. Offsets of two partitions say nothing
   about which record came first, so this step is arbitrary, but it is fixed: every run, replay
   and reader picks the same winner. It does not arise for Debezium, whose keys all land in one
   partition (the record key decides the partition);
4. the same record twice (equal partition and offset): the later row of the input wins (they
   are the same version).

A delete is a version like any other: when it wins, it stays in the result, its operation column
saying delete, so that a writer drops the key. The operation column (`OPERATION_COLUMN`) holds
`RowOperation.code` (int8: 0 insert, 1 update, 2 delete): a writer derives Hudi's
`_hoodie_is_deleted` from it, and it stays readable in a dead letter.

Unavailable values (PostgreSQL's unchanged TOAST columns): the optional list<string> column
`UNAVAILABLE_COLUMN` names the columns whose value a version did not carry. A winner takes each
such value from the highest earlier version of its key that carries it, looking back no further
than the last delete of the key (a row after a delete is a new row); a name with no such version
stays in the list and the value stays null, for `merge_over` to take from the stored row.

`fold_by_key` is the Arrow implementation (one sort, vectorised group ends; a loop only over the
distinct unavailable column names); `fold_by_key_reference` the obviously correct one in plain
Python, which a property test compares it with. Neither supports NaN in the ordering column, and
float key columns are compared by value (NaN never equals NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import RecordError
from lakesink.protocol.mutation import OPERATION_COLUMN, UNAVAILABLE_COLUMN, RowOperation

__all__ = [
    "OFFSET_COLUMN",
    "OPERATION_COLUMN",
    "PARTITION_COLUMN",
    "UNAVAILABLE_COLUMN",
    "FoldColumns",
    "fold_by_key",
    "fold_by_key_reference",
    "merge_over",
    "prefold_mask",
]
PARTITION_COLUMN = "kafka_partition"
OFFSET_COLUMN = "kafka_offset"
_DELETE = RowOperation.DELETE.code


@dataclass(frozen=True, slots=True)
class FoldColumns:
    """The columns the rule reads: the key, the ordering value (None: none), the Kafka
    coordinates, the operation and the unavailable column names (absent: none)."""

    key: tuple[str, ...]
    ordering: str | None
    partition: str = PARTITION_COLUMN
    offset: str = OFFSET_COLUMN
    operation: str = OPERATION_COLUMN
    unavailable: str = UNAVAILABLE_COLUMN

    def check(self, rows: pa.Table) -> None:
        if not self.key:
            raise RecordError("the fold needs at least one key column")
        names = set(rows.column_names)
        needed = [*self.key, self.partition, self.offset, self.operation]
        if self.ordering is not None:
            needed.append(self.ordering)
        missing = [n for n in needed if n not in names]
        if missing:
            raise RecordError(f"the rows have no column {', '.join(map(repr, missing))}")
        for name in (self.partition, self.offset, self.operation):
            if rows.column(name).null_count:
                raise RecordError(f"column {name!r} has nulls; every version needs a value")
        if self.ordering is not None:
            ordering = rows.column(self.ordering)
            if pa.types.is_floating(ordering.type) and pc.any(pc.is_nan(ordering)).as_py():
                raise RecordError(f"ordering column {self.ordering!r} holds NaN")


def fold_by_key(
    rows: pa.Table,
    key_columns: Sequence[str],
    ordering_column: str | None,
    *,
    partition_column: str = PARTITION_COLUMN,
    offset_column: str = OFFSET_COLUMN,
    operation_column: str = OPERATION_COLUMN,
    unavailable_column: str = UNAVAILABLE_COLUMN,
) -> pa.Table:
    """One row per key, the winner under the rule, with its unavailable values taken from
    earlier versions where they exist; the winners in the order of the input rows."""
    cols = FoldColumns(
        tuple(key_columns),
        ordering_column,
        partition_column,
        offset_column,
        operation_column,
        unavailable_column,
    )
    cols.check(rows)
    if rows.num_rows == 0:
        return rows
    order, same_as_next = _ranked(rows, cols)
    last_of_group = np.append(~same_as_next, True)
    winners = np.flatnonzero(last_of_group)  # positions in sorted order
    winners = winners[np.argsort(order[winners], kind="stable")]  # input order of winners
    result = rows.take(order[winners])
    if cols.unavailable in rows.column_names:
        result = _fill_unavailable(rows, cols, order, same_as_next, winners, result)
    return result


def _ranked(rows: pa.Table, cols: FoldColumns) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The rows' positions sorted by key, then by rank under the rule (lowest first), and for
    each sorted position but the last whether the next one holds the same key (`rows` not
    empty)."""
    n = rows.num_rows
    index = pa.array(np.arange(n, dtype=np.int64))
    # A null ordering value orders lowest: the validity column sorts before the value, so the
    # value's own null placement never matters (nulls of key columns only need to be adjacent).
    sort_columns = [rows.column(c) for c in cols.key]
    if cols.ordering is not None:
        ordering = rows.column(cols.ordering)
        sort_columns += [pc.is_valid(ordering), ordering]
    sort_columns += [rows.column(cols.offset), rows.column(cols.partition), index]
    ranked = pa.table(sort_columns, names=[f"c{i}" for i in range(len(sort_columns))])
    order = pc.sort_indices(
        ranked, sort_keys=[(c, "ascending") for c in ranked.column_names]
    ).to_numpy()
    same_as_next = np.ones(n - 1, dtype=bool)
    for name in cols.key:
        column = rows.column(name).take(order)
        a, b = column.slice(0, n - 1), column.slice(1)
        equal = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        same_as_next &= pc.or_(equal, both_null).to_numpy(zero_copy_only=False)
    return order, same_as_next


def prefold_mask(
    rows: pa.Table,
    key_columns: Sequence[str],
    ordering_column: str | None,
    *,
    partition_column: str = PARTITION_COLUMN,
    offset_column: str = OFFSET_COLUMN,
    operation_column: str = OPERATION_COLUMN,
    unavailable_column: str = UNAVAILABLE_COLUMN,
) -> np.ndarray[Any, Any]:
    """Which of `rows` (one part of a batch: a read task's records) the fold of the whole batch
    can need: a map-side combine before the rows are shuffled to the task that folds them.

    Per key, the versions from its highest-ranked *full stop* upwards, where a full stop is a
    delete or a version with no unavailable value. A version below a full stop of the same part
    never wins (the full stop ranks above it) and is never looked back at for an unavailable
    value (the look-back from any version above stops at the full stop: it carries every value,
    or it is a delete, past which nothing is taken). So the fold of any set of versions that
    holds these rows equals the fold with the rest too, whatever the other parts hold and
    whichever ranks their versions have: the parts can be folded apart, then together.

    Folding each part to its winners instead is wrong with unavailable values: a part's winner
    would take a value from its own earlier version where a version of another part ranks in
    between (the TOAST rule is not associative), so the versions above the full stop stay
    as they are, unfolded. Without the operation column no version is a delete; without the
    unavailable column every version is a full stop, and only each key's winner stays. The
    same columns as `fold_by_key` are checked (RecordError)."""
    cols = FoldColumns(
        tuple(key_columns),
        ordering_column,
        partition_column,
        offset_column,
        operation_column,
        unavailable_column,
    )
    names = set(rows.column_names)
    has_operation = cols.operation in names  # without it, a stream of upserts
    # the columns the fold reads are checked as it checks them, the operation only if there
    (cols if has_operation else replace(cols, operation=cols.offset)).check(rows)
    n = rows.num_rows
    keep = np.zeros(n, dtype=bool)
    if n == 0:
        return keep
    order, same_as_next = _ranked(rows, cols)
    take = pa.array(order)
    if cols.unavailable in names:  # stop: a version with every value (in sorted order)
        lists = rows.column(cols.unavailable).combine_chunks().take(take)
        stop = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False) == 0
    else:
        stop = np.ones(n, dtype=bool)
    if has_operation:  # and a delete
        ops = rows.column(cols.operation).take(take).to_numpy(zero_copy_only=False)
        stop |= ops == _DELETE
    positions = np.arange(n)
    starts = np.flatnonzero(np.concatenate(([True], ~same_as_next)))
    last_stop = np.maximum.reduceat(np.where(stop, positions, -1), starts)  # -1: none
    group = np.cumsum(np.concatenate(([0], ~same_as_next)))
    keep[order[positions >= last_stop[group]]] = True
    return keep


def _fill_unavailable(
    rows: pa.Table,
    cols: FoldColumns,
    order: np.ndarray[Any, Any],
    same_as_next: np.ndarray[Any, Any],
    winners: np.ndarray[Any, Any],
    result: pa.Table,
) -> pa.Table:
    """Each winner's unavailable values from the latest earlier version of its key that
    carries them (not reaching back past a delete); vectorised per column name."""
    lists = rows.column(cols.unavailable).combine_chunks().take(pa.array(order))
    flat = pc.list_flatten(lists)
    if len(flat) == 0:
        return result
    n = rows.num_rows
    parents = pc.list_parent_indices(lists).to_numpy()
    flat_names = flat.to_numpy(zero_copy_only=False)
    group = np.concatenate(([0], np.cumsum(~same_as_next)))
    is_delete = rows.column(cols.operation).take(pa.array(order)).to_numpy(zero_copy_only=False)
    is_delete = is_delete == _DELETE
    positions = np.arange(n)
    resolved_by_name: dict[str, np.ndarray[Any, Any]] = {}
    for name in sorted({str(x) for x in flat_names if x is not None}):
        if name not in rows.column_names or name in cols.key:
            continue
        missing = np.zeros(n, dtype=bool)
        missing[parents[flat_names == name]] = True
        # The last row at or before each position that carries the value or is a delete.
        stop = is_delete | ~missing
        last = np.maximum.accumulate(np.where(stop, positions, -1))
        need = missing[winners] & ~is_delete[winners]
        source = last[winners]
        ok = need & (source >= 0)
        ok[ok] &= (group[source[ok]] == group[winners[ok]]) & ~is_delete[source[ok]]
        if not ok.any():
            continue
        take_from = np.where(ok, source, winners)
        values = rows.column(name).take(pa.array(order[take_from]))
        result = result.set_column(result.schema.get_field_index(name), name, values)
        resolved_by_name[name] = ok
    if not resolved_by_name:
        return result
    return result.set_column(
        result.schema.get_field_index(cols.unavailable),
        cols.unavailable,
        _without_resolved(lists.take(pa.array(winners)), resolved_by_name),
    )


def _without_resolved(
    lists: pa.Array, resolved_by_name: dict[str, np.ndarray[Any, Any]]
) -> pa.Array:
    """The winners' lists of unavailable names less the names now resolved (null stays null)."""
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    names = flat.to_numpy(zero_copy_only=False)
    keep = np.ones(len(names), dtype=bool)
    for name, ok in resolved_by_name.items():
        keep &= ~((names == name) & ok[parents])
    counts = np.bincount(parents[keep], minlength=len(lists))
    offsets = pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32))
    mask = pc.is_null(lists)
    return pa.ListArray.from_arrays(
        offsets, flat.filter(pa.array(keep)), type=lists.type, mask=mask
    )


def fold_by_key_reference(
    rows: pa.Table,
    key_columns: Sequence[str],
    ordering_column: str | None,
    *,
    partition_column: str = PARTITION_COLUMN,
    offset_column: str = OFFSET_COLUMN,
    operation_column: str = OPERATION_COLUMN,
    unavailable_column: str = UNAVAILABLE_COLUMN,
) -> pa.Table:
    """The same as `fold_by_key`, one Python step at a time: the reference it is tested with."""
    cols = FoldColumns(
        tuple(key_columns),
        ordering_column,
        partition_column,
        offset_column,
        operation_column,
        unavailable_column,
    )
    cols.check(rows)
    data = rows.to_pylist()
    has_unavailable = cols.unavailable in rows.column_names

    def rank(i: int) -> tuple[Any, ...]:
        row = data[i]
        value = row[cols.ordering] if cols.ordering is not None else None
        return (value is not None, value, row[cols.offset], row[cols.partition], i)

    versions: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(data):
        versions.setdefault(tuple(row[k] for k in cols.key), []).append(i)
    out: list[tuple[int, dict[str, Any]]] = []
    for indexes in versions.values():
        ranked = sorted(indexes, key=rank)
        winner = dict(data[ranked[-1]])
        names = winner[cols.unavailable] if has_unavailable else None
        if names and winner[cols.operation] != _DELETE:
            still: list[str] = []
            for name in names:
                if name not in winner or name in cols.key:
                    still.append(name)
                    continue
                for earlier in reversed(ranked[:-1]):
                    version = data[earlier]
                    if version[cols.operation] == _DELETE:
                        still.append(name)
                        break
                    if name not in (version[cols.unavailable] or ()):
                        winner[name] = version[name]
                        break
                else:
                    still.append(name)
            winner[cols.unavailable] = still
        out.append((ranked[-1], winner))
    out.sort(key=lambda p: p[0])
    return pa.Table.from_pylist([row for _, row in out], schema=rows.schema)


def merge_over(
    stored: pa.Table,
    incoming: pa.Table,
    key_columns: Sequence[str],
    ordering_column: str | None,
    *,
    partition_column: str = PARTITION_COLUMN,
    offset_column: str = OFFSET_COLUMN,
    operation_column: str = OPERATION_COLUMN,
    unavailable_column: str = UNAVAILABLE_COLUMN,
) -> pa.Table:
    """The rows of a table after applying a later batch: `stored` holds one row per key, with
    its ordering value and Kafka coordinates; `incoming` the batch's versions (the stored columns
    plus the operation and, optionally, the unavailable column).

    A stored row is replaced only by a version that wins over it under the rule; an unavailable
    value keeps the stored value (a key never stored leaves it null); a winning delete removes the
    key, and a delete of a key never stored changes nothing. The result has the stored schema;
    the order of its rows is not meaningful. The stored rows are one more version per key, so
    this is the fold of both together, deletes dropped.

    A delete that removed a key leaves nothing behind, its ordering value included (as Hudi's
    hard delete): a version in a later batch that ranks below that delete inserts the key again.
    Folding batch by batch therefore equals folding them at once when no later batch holds a
    version older than an earlier batch's delete of its key: true of a Debezium topic read in
    order; a connector's re-emitted events after a crash can bring the key back until the
    re-emitted delete follows. Remembering deletes (their key and rank) across batches would
    close that window; it is not done here."""
    names = stored.column_names
    missing = [n for n in [*names, operation_column] if n not in incoming.column_names]
    if missing:
        raise RecordError(f"the incoming rows have no column {', '.join(map(repr, missing))}")
    list_type = pa.list_(pa.string())
    if unavailable_column in incoming.column_names:
        list_type = incoming.schema.field(unavailable_column).type
        unavailable = incoming.column(unavailable_column)
    else:
        unavailable = pa.nulls(incoming.num_rows, list_type)
    op_type = incoming.schema.field(operation_column).type
    before = pa.table(
        [
            *stored.columns,
            pa.array(np.full(stored.num_rows, RowOperation.UPDATE.code), op_type),
            pa.nulls(stored.num_rows, list_type),
        ],
        names=[*names, operation_column, unavailable_column],
    )
    after = pa.table(
        [
            *(incoming.column(n).cast(stored.schema.field(n).type) for n in names),
            incoming.column(operation_column),
            unavailable,
        ],
        schema=before.schema,
    )
    folded = fold_by_key(
        pa.concat_tables([before, after]),
        key_columns,
        ordering_column,
        partition_column=partition_column,
        offset_column=offset_column,
        operation_column=operation_column,
        unavailable_column=unavailable_column,
    )
    kept = folded.filter(pc.not_equal(folded.column(operation_column), _DELETE))
    return kept.select(names)
