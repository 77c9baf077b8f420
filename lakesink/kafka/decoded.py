"""What a deserializer returns, and the pieces every format shares."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Decoded:
    """The result of decoding N values: `table` holds the N - len(failures) - len(skipped) good
    rows in input order; `failures` maps the index of each bad value to the reason; `skipped`
    holds the indexes of values that intentionally carry no row (a change stream's tombstone
    after a delete): neither rows nor failures, never dead-lettered."""

    table: pa.Table
    failures: dict[int, str] = field(default_factory=dict)
    skipped: frozenset[int] = frozenset()


@runtime_checkable
class Deserializer(Protocol):
    """Turns record values into Arrow columns of `value_schema`."""

    @property
    def value_schema(self) -> pa.Schema: ...

    def decode(self, values: Sequence[bytes | None]) -> Decoded: ...


# A Python object's default repr, "<_io.BytesIO object at 0x7f...>", and the word before it
_OBJECT_REPR = re.compile(r"\s*(?:\b(?:from|in|of|for)\s+)?<[^<>]*\bat 0x[0-9a-fA-F]+>")


def reason(e: BaseException) -> str:
    """A failure reason of at most 500 characters, the same on every run: object addresses
    that libraries put in their messages are left out (a dead letter's reason is data)."""
    text = _OBJECT_REPR.sub("", str(e)).strip() or type(e).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def rows_to_table(
    rows: Sequence[tuple[int, dict[str, Any]]],
    schema: pa.Schema,
    failures: dict[int, str],
    what: str,
) -> list[tuple[int, pa.Table]]:
    """(index, row) pairs, sorted by index, as tables of `schema`: one table per run of
    consecutive indexes, tagged with its first index. A row Arrow refuses becomes a failure of its
    index (found by bisection, so a good run costs one conversion)."""
    out: list[tuple[int, pa.Table]] = []

    def build(part: Sequence[tuple[int, dict[str, Any]]]) -> None:
        if not part:
            return
        try:
            out.append((part[0][0], pa.Table.from_pylist([r for _, r in part], schema=schema)))
            return
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
            if len(part) == 1:
                failures[part[0][0]] = f"{what}: {reason(e)}"
                return
        mid = len(part) // 2
        build(part[:mid])
        build(part[mid:])

    run_start = 0
    for k in range(1, len(rows) + 1):
        if k == len(rows) or rows[k][0] != rows[k - 1][0] + 1:
            build(rows[run_start:k])
            run_start = k
    return out


def concat_in_order(pieces: list[tuple[int, pa.Table]], schema: pa.Schema) -> pa.Table:
    """Tables tagged with the index of their first row, concatenated in index order."""
    if not pieces:
        return schema.empty_table()
    if len(pieces) == 1:
        return pieces[0][1]
    pieces.sort(key=lambda p: p[0])
    return pa.concat_tables([t for _, t in pieces])


def bisect_parse(
    parse: Callable[[Sequence[Any]], pa.Table],
    items: Sequence[Any],
    start: int,
    on_single_failure: Callable[[int, BaseException], None],
    out: list[tuple[int, pa.Table]],
) -> None:
    """Parse `items` (indexes start..); on failure split in halves until each item that fails on
    its own is handed to `on_single_failure`."""
    try:
        out.append((start, parse(items)))
        return
    except Exception as e:
        if len(items) == 1:
            on_single_failure(start, e)
            return
    mid = len(items) // 2
    bisect_parse(parse, items[:mid], start, on_single_failure, out)
    bisect_parse(parse, items[mid:], start + mid, on_single_failure, out)
