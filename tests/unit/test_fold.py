"""The fold by key (lakesink.engine.fold): the Arrow fold against the plain reference, and
merge_over against a model that applies versions one by one in the rule's order."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.engine.fold import (
    OPERATION_COLUMN as OP,
)
from lakesink.engine.fold import (
    UNAVAILABLE_COLUMN as UNAVAILABLE,
)
from lakesink.engine.fold import (
    fold_by_key,
    fold_by_key_reference,
    merge_over,
    prefold_mask,
)
from lakesink.errors import RecordError
from lakesink.protocol.mutation import RowOperation

INSERT, UPDATE, DELETE = (op.code for op in RowOperation)
STORED = pa.schema(
    [
        ("id", pa.int64()),
        ("v", pa.string()),
        ("w", pa.int64()),
        ("o", pa.int64()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)
INCOMING = pa.schema([*STORED, (OP, pa.int8()), (UNAVAILABLE, pa.list_(pa.string()))])


def version(
    id: Any,
    o: Any,
    offset: int,
    op: int = UPDATE,
    *,
    v: str | None = "x",
    w: int | None = 0,
    partition: int = 0,
    unavailable: list[str] | None = None,
) -> dict[str, Any]:
    # The decoders' contract: a column named unavailable holds null.
    gone = set(unavailable or ())
    return {
        "id": id,
        "v": None if "v" in gone else v,
        "w": None if "w" in gone else w,
        "o": o,
        "kafka_partition": partition,
        "kafka_offset": offset,
        OP: op,
        UNAVAILABLE: unavailable,
    }


def table(rows: list[dict[str, Any]], schema: pa.Schema = INCOMING) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def both(rows: list[dict[str, Any]], ordering: str | None = "o") -> list[dict[str, Any]]:
    t = table(rows)
    fast = fold_by_key(t, ["id"], ordering).to_pylist()
    assert fast == fold_by_key_reference(t, ["id"], ordering).to_pylist()
    return fast


# --- the rule, case by case -----------------------------------------------------------------


def test_higher_ordering_wins_over_a_later_offset() -> None:
    out = both([version(1, 5, 0, v="new"), version(1, 3, 1, v="old")])
    assert [r["v"] for r in out] == ["new"]


def test_equal_ordering_goes_to_the_later_offset_then_the_higher_partition() -> None:
    assert both([version(1, 5, 1, v="b"), version(1, 5, 0, v="a")])[0]["v"] == "b"
    # Across partitions the offset decides first, then the partition number (fixed, arbitrary).
    rows = [version(1, 5, 7, v="p0", partition=0), version(1, 5, 3, v="p1", partition=1)]
    assert both(rows)[0]["v"] == "p0"
    rows = [version(1, 5, 3, v="p1", partition=1), version(1, 5, 3, v="p0", partition=0)]
    assert both(rows)[0]["v"] == "p1"


def test_the_same_record_twice_goes_to_the_later_row() -> None:
    assert both([version(1, 5, 3, v="first"), version(1, 5, 3, v="second")])[0]["v"] == "second"


def test_null_ordering_orders_lowest_and_no_ordering_column_means_offsets_decide() -> None:
    assert both([version(1, 0, 0, v="zero"), version(1, None, 9, v="null")])[0]["v"] == "zero"
    assert both([version(1, 0, 0, v="a"), version(1, None, 9, v="b")], None)[0]["v"] == "b"


def test_a_winning_delete_stays_with_its_operation_and_winners_keep_input_order() -> None:
    out = both([version(2, 1, 0, INSERT), version(1, 1, 1, INSERT), version(2, 2, 2, DELETE)])
    assert [(r["id"], r[OP]) for r in out] == [(1, INSERT), (2, DELETE)]


def test_unavailable_values_come_from_the_latest_earlier_version_not_past_a_delete() -> None:
    rows = [
        version(1, 1, 0, INSERT, v="v1", w=1),
        version(1, 2, 1, UPDATE, v="v2", w=None, unavailable=["w"]),
        version(1, 3, 2, UPDATE, v=None, w=None, unavailable=["v", "w", "nope"]),
    ]
    (out,) = both(rows)
    assert (out["v"], out["w"], out[UNAVAILABLE]) == ("v2", 1, ["nope"])
    rows = [
        version(1, 1, 0, INSERT, v="v1"),
        version(1, 2, 1, DELETE),
        version(1, 3, 2, UPDATE, v=None, unavailable=["v"]),
    ]
    (out,) = both(rows)
    assert (out["v"], out[UNAVAILABLE]) == (None, ["v"])


def test_missing_columns_and_null_coordinates_are_refused() -> None:
    t = table([version(1, 1, 0)])
    with pytest.raises(RecordError, match="no column 'nope'"):
        fold_by_key(t, ["id"], "nope")
    with pytest.raises(RecordError, match="at least one key column"):
        fold_by_key(t, [], "o")
    bad = t.set_column(5, "kafka_offset", pa.array([None], pa.int64()))
    with pytest.raises(RecordError, match="'kafka_offset' has nulls"):
        fold_by_key(bad, ["id"], "o")
    nan = t.set_column(3, "o", pa.array([float("nan")]))
    with pytest.raises(RecordError, match="NaN"):
        fold_by_key(nan, ["id"], "o")
    assert fold_by_key(t.slice(0, 0), ["id"], "o").num_rows == 0


# --- the Arrow fold equals the reference ----------------------------------------------------

NAMES = st.lists(st.sampled_from(["v", "w", "id", "nope"]), unique=True, max_size=3)


@st.composite
def versions(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 40))
    return [
        version(
            draw(st.one_of(st.none(), st.integers(0, 4))),
            draw(st.one_of(st.none(), st.integers(0, 3))),
            draw(st.integers(0, 5)),
            draw(st.sampled_from([INSERT, UPDATE, DELETE])),
            v=draw(st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))),
            w=draw(st.one_of(st.none(), st.integers(0, 9))),
            partition=draw(st.integers(0, 2)),
            unavailable=draw(st.one_of(st.none(), NAMES)),
        )
        for _ in range(n)
    ]


@settings(max_examples=60, deadline=None)
@given(versions(), st.sampled_from(["o", None]), st.integers(1, 3))
def test_arrow_fold_equals_the_reference(
    rows: list[dict[str, Any]], ordering: str | None, chunks: int
) -> None:
    t = table(rows)
    if chunks > 1 and t.num_rows > chunks:  # several record batches behave as one
        step = t.num_rows // chunks
        t = pa.concat_tables([t.slice(i, step) for i in range(0, t.num_rows, step)])
    expected = fold_by_key_reference(t, ["id"], ordering)
    assert fold_by_key(t, ["id"], ordering).to_pylist() == expected.to_pylist()


@settings(max_examples=30, deadline=None)
@given(versions())
def test_two_key_columns_and_string_ordering_agree_with_the_reference(
    rows: list[dict[str, Any]],
) -> None:
    t = table(rows)
    t = t.set_column(3, "o", t.column("o").cast(pa.string()))  # "10" < "9": string order
    expected = fold_by_key_reference(t, ["id", "w"], "o")
    assert fold_by_key(t, ["id", "w"], "o").to_pylist() == expected.to_pylist()


# --- merge_over against one-by-one application ----------------------------------------------


def model_merge(
    stored: list[dict[str, Any]], incoming: list[dict[str, Any]]
) -> dict[Any, dict[str, Any]]:
    """Every version of a key applied in the rule's order (the stored row ranks by its own
    coordinates, before the batch on full ties): a delete removes the row, an unavailable value
    keeps the current one."""
    tagged = [(0, i, dict(r, **{OP: UPDATE, UNAVAILABLE: None})) for i, r in enumerate(stored)]
    tagged += [(1, i, r) for i, r in enumerate(incoming)]

    def rank(t: tuple[int, int, dict[str, Any]]) -> tuple[Any, ...]:
        side, i, r = t
        return (r["o"] is not None, r["o"], r["kafka_offset"], r["kafka_partition"], side, i)

    state: dict[Any, dict[str, Any]] = {}
    for _, _, r in sorted(tagged, key=rank):
        key = r["id"]
        if r[OP] == DELETE:
            state.pop(key, None)
            continue
        row = {c: r[c] for c in STORED.names}
        for name in r[UNAVAILABLE] or ():
            if name in row and name != "id":
                row[name] = state[key][name] if key in state else None
        state[key] = row
    return state


def as_dict(t: pa.Table) -> dict[Any, dict[str, Any]]:
    rows = t.to_pylist()
    by_key = {r["id"]: r for r in rows}
    assert len(by_key) == len(rows), "one row per key"
    return by_key


@st.composite
def stored_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(st.lists(st.one_of(st.none(), st.integers(0, 4)), unique=True, max_size=5))
    out = []
    for key in keys:
        row = version(
            key,
            draw(st.one_of(st.none(), st.integers(0, 3))),
            draw(st.integers(0, 5)),
            v=draw(st.sampled_from(["s1", "s2"])),
            w=draw(st.integers(0, 9)),
            partition=draw(st.integers(0, 2)),
        )
        out.append({c: row[c] for c in STORED.names})
    return out


@settings(max_examples=40, deadline=None)
@given(stored_rows(), versions())
def test_merge_over_equals_applying_versions_one_by_one(
    stored: list[dict[str, Any]], incoming: list[dict[str, Any]]
) -> None:
    merged = merge_over(table(stored, STORED), table(incoming), ["id"], "o")
    assert merged.schema == STORED
    assert as_dict(merged) == model_merge(stored, incoming)


@settings(max_examples=30, deadline=None)
@given(stored_rows(), versions(), st.integers(0, 40))
def test_merging_two_batches_equals_merging_them_as_one_for_an_ordered_stream(
    stored: list[dict[str, Any]], incoming: list[dict[str, Any]], cut: int
) -> None:
    # A stream in order (one partition, ordering values rising with the offset, as a Debezium
    # topic without re-emitted events): every version of the second batch ranks above the first.
    high = max((r["kafka_offset"] for r in stored), default=0) + 1
    ordered = [
        dict(r, o=high + i, kafka_offset=high + i, kafka_partition=0)
        for i, r in enumerate(incoming)
    ]
    s = table(stored, STORED)
    one = merge_over(s, table(ordered), ["id"], "o")
    two = merge_over(
        merge_over(s, table(ordered[:cut]), ["id"], "o"), table(ordered[cut:]), ["id"], "o"
    )
    assert as_dict(two) == as_dict(one)


def test_a_merged_delete_forgets_its_ordering_value() -> None:
    # Once a delete has removed a key, nothing of it is stored: a version of a later batch that
    # ranks below the delete inserts the key again, where one batch holding both would not.
    empty = table([], STORED)
    both_at_once = merge_over(
        empty, table([version(1, 5, 0, DELETE), version(1, 3, 1)]), ["id"], "o"
    )
    assert both_at_once.num_rows == 0
    first = merge_over(empty, table([version(1, 5, 0, DELETE)]), ["id"], "o")
    assert merge_over(first, table([version(1, 3, 1)]), ["id"], "o").num_rows == 1


def test_merge_cases() -> None:
    stored = table(
        [{"id": 1, "v": "s", "w": 5, "o": 10, "kafka_partition": 0, "kafka_offset": 4}], STORED
    )
    cases = [
        # a lower ordering value loses to the stored row, even at a later offset
        ([version(1, 9, 8, v="late")], {1: ("s", 5)}),
        # a higher one replaces it; an unavailable value keeps the stored one
        ([version(1, 11, 8, v=None, w=6, unavailable=["v"])], {1: ("s", 6)}),
        # a winning delete removes the key
        ([version(1, 11, 8, DELETE)], {}),
        # a losing delete does nothing
        ([version(1, 9, 8, DELETE)], {1: ("s", 5)}),
        # a delete of a key never seen is a no-op; a new key is inserted
        (
            [version(2, 1, 8, DELETE), version(3, 1, 9, INSERT, v="n", w=1)],
            {1: ("s", 5), 3: ("n", 1)},
        ),
        # an unavailable value of a key never stored stays null
        ([version(4, 1, 9, UPDATE, v=None, unavailable=["v"])], {1: ("s", 5), 4: (None, 0)}),
    ]
    for rows, expected in cases:
        merged = as_dict(merge_over(stored, table(rows), ["id"], "o"))
        assert {k: (r["v"], r["w"]) for k, r in merged.items()} == expected, rows


def test_merge_without_unavailable_column_and_missing_columns() -> None:
    stored = table([], STORED)
    incoming = table([version(1, 1, 0, INSERT)]).drop_columns([UNAVAILABLE])
    assert merge_over(stored, incoming, ["id"], "o").num_rows == 1
    with pytest.raises(RecordError, match=f"no column '{OP}'"):
        merge_over(stored, incoming.drop_columns([OP]), ["id"], "o")


# --- the pre-fold of a batch's parts (a map-side combine) ---------------------------------


def by_key(t: pa.Table) -> list[dict[str, Any]]:
    """The rows in key order (the fold keeps input order, which the shuffle does not)."""
    return sorted(t.to_pylist(), key=lambda r: (r["id"] is not None, r["id"]))


@settings(max_examples=80, deadline=None)
@given(
    stored_rows(),
    versions(),
    st.sampled_from(["o", None]),
    st.lists(st.integers(0, 3), min_size=18, max_size=18),
    st.permutations(range(4)),
)
def test_folding_the_prefolded_parts_equals_folding_every_version(
    stored: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    ordering: str | None,
    part_of: list[int],
    arrival: list[int],
) -> None:
    """A batch's records split into parts by their Kafka coordinates (a record in one read
    task; the same record twice stays in one part), each part pre-folded, the parts handed on in
    any order: the fold is the plain fold of every version (winners, unavailable values,
    deletes), and merging it over stored rows the same as merging every version."""
    t = table(rows)

    def part(r: dict[str, Any]) -> int:
        return part_of[r["kafka_offset"] * 3 + r["kafka_partition"]]

    parts = [[i for i, r in enumerate(rows) if part(r) == p] for p in arrival]
    kept = []
    for indexes in parts:
        part = t.take(pa.array(indexes, pa.int64()))
        mask = prefold_mask(part, ["id"], ordering)
        if not any(r[UNAVAILABLE] for r in part.to_pylist()):  # each key's winner only
            assert mask.sum() == len({r["id"] for r in part.to_pylist()})
        kept.append(part.filter(pa.array(mask)))
    folded = pa.concat_tables(kept)
    assert folded.num_rows <= t.num_rows
    expected = fold_by_key_reference(t, ["id"], ordering)
    assert by_key(fold_by_key(folded, ["id"], ordering)) == by_key(expected)
    s = table(stored, STORED)
    assert as_dict(merge_over(s, folded, ["id"], ordering)) == as_dict(
        merge_over(s, t, ["id"], ordering)
    )


def test_a_prefold_keeps_the_versions_above_a_parts_last_full_stop() -> None:
    # Part one: w=4 at o=4, then w unavailable at o=5; part two: w=2 at o=2, w unavailable at
    # o=6. The winner (o=6) looks back past o=5 (w unavailable) to o=4: w=4. Part two folded to
    # its winner with w filled from its own earlier version would win with w=2.
    one = table([version(1, 4, 0, w=4), version(1, 5, 1, unavailable=["w"])])
    two = table(
        [version(1, 2, 0, w=2, partition=1), version(1, 6, 1, unavailable=["w"], partition=1)]
    )
    assert prefold_mask(one, ["id"], "o").tolist() == [True, True]
    assert prefold_mask(two, ["id"], "o").tolist() == [True, True]
    ((winner,),) = [fold_by_key(pa.concat_tables([one, two]), ["id"], "o").to_pylist()]
    assert (winner["o"], winner["w"]) == (6, 4)
    # a delete or a version with every value is a full stop: nothing below it is handed on
    three = table(
        [
            version(2, 1, 0, w=1),
            version(2, 2, 1, DELETE),
            version(2, 3, 2, unavailable=["w"]),
            version(3, 1, 3, w=1),
            version(3, 2, 4, w=2),
            version(3, 0, 5, unavailable=["w"]),  # ranks lowest: below the full stop
        ]
    )
    assert prefold_mask(three, ["id"], "o").tolist() == [False, True, True, False, True, False]
    # a stream of upserts (no operation column) and no unavailable column: the winners
    plain = three.drop_columns([OP, UNAVAILABLE])
    assert prefold_mask(plain, ["id"], "o").tolist() == [False, False, True, False, True, False]
    assert prefold_mask(plain.slice(0, 0), ["id"], "o").tolist() == []
    with pytest.raises(RecordError, match="no column 'nope'"):
        prefold_mask(plain, ["nope"], "o")
