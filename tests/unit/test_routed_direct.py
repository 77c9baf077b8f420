"""Routing on the direct task path, its pure pieces (no Spark, no broker): when a many-table
ingestion takes it; the Arrow route masks against a plain Python reference of the route rules
(topics, topic pattern, regex on a value column, `kafka_key`, `header:`, nulls, route.default,
several tables taking a record, the records no table takes); and a task (`RoutedDirectTask`)
over decoded batches writing each table exactly the rows the reference gives it from its own
committed offset on, the dead letters as the DataFrame path makes them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.config import build_config
from lakesink.config.tables import Route
from lakesink.errors import ConfigError
from lakesink.kafka.dead_letters import DEAD_LETTER_SCHEMA, HEADER_TYPE, FailedRecord
from lakesink.protocol.offsets import TopicPartition
from lakesink.spark.direct import uses_direct_path
from lakesink.spark.routing import (
    UNTAKEN_REASON,
    FannedTable,
    RoutedDirectTask,
    route_split,
)

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9",
    "kafka.topics": "a,b",
    "value.format": "json",
    "value.schema": "region STRING, n BIGINT",
    "tables.x.table.path": "/tmp/lakesink-unit-routed/x",
    "tables.x.route.topics": "a",
    "tables.y.table.path": "/tmp/lakesink-unit-routed/y",
    "tables.y.route.field": "region",
    "tables.y.route.regex": "eu-.*",
}


@pytest.mark.parametrize(
    ("more", "direct"),
    [
        ({}, True),
        ({"write.path": "direct"}, True),
        ({"write.path": "dataframe"}, False),
        ({"tables.y.transform.sql": "SELECT * FROM source"}, False),
        ({"transform.arrow": "os.path:join"}, False),  # every table's: not shared by the tasks
        ({"tables.y.table.partition.date.from": "kafka_timestamp"}, False),
        ({"tables.y.table.record.key.fields": "n", "tables.y.write.operation": "upsert"}, False),
        ({"tables.y.route.regex": "(?=eu)e.*"}, False),  # a lookahead: not RE2
        ({"route.dynamic.field": "region", "route.dynamic.path": "/tmp/t/{table}"}, False),
    ],
)
def test_many_tables_take_the_direct_path_when_the_tasks_can_route_them(
    more: dict[str, Any], direct: bool
) -> None:
    assert uses_direct_path(build_config({**BASE, **more})) is direct


def test_a_forced_direct_path_the_tables_cannot_take_is_refused_with_the_reason() -> None:
    cfg = build_config({**BASE, "write.path": "direct", "tables.y.route.regex": "(?=eu)e.*"})
    with pytest.raises(ConfigError, match=r"not RE2 syntax.*set write\.path=auto"):
        uses_direct_path(cfg)


TOPICS = ("a", "b", "ab")
WORDS = ("eu-west", "EU-west", "us", "", "eu-", "xeu-west", "\u00e9u-1", "12", "1")
SCHEMA = pa.schema(
    [
        pa.field("kafka_topic", pa.string(), nullable=False),
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("kafka_key", pa.binary()),
        pa.field("kafka_headers", HEADER_TYPE),
        pa.field("region", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("flag", pa.bool_()),
    ]
)
# Regexes Python's `re` and RE2 (Arrow) read alike, in full
REGEXES = ("eu-.*", "1\\d*", "true", "", ".*", "x|eu-w.*", "[a-z]+", "false|us")

texts = st.one_of(st.none(), st.sampled_from(WORDS))
headers = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["h", "g"]),
                "value": st.one_of(st.none(), st.sampled_from(WORDS).map(str.encode)),
            }
        ),
        max_size=3,
    ),
)
records = st.lists(
    st.fixed_dictionaries(
        {
            "kafka_topic": st.sampled_from(TOPICS),
            "kafka_partition": st.integers(0, 1),
            "kafka_key": st.one_of(
                st.none(), st.sampled_from(WORDS).map(str.encode), st.just(b"\xffeu-")
            ),
            "kafka_headers": headers,
            "region": texts,
            "n": st.one_of(st.none(), st.integers(-3, 30)),
            "flag": st.one_of(st.none(), st.booleans()),
        }
    ),
    max_size=40,
)
routes = st.one_of(
    st.builds(
        Route,
        topics=st.lists(st.sampled_from(TOPICS), max_size=2, unique=True).map(tuple),
        field=st.one_of(
            st.none(), st.sampled_from(["region", "n", "flag", "kafka_key", "header:h"])
        ),
        regex=st.sampled_from(REGEXES),
    ),
    st.builds(
        Route,
        topic_pattern=st.sampled_from(["a", "a.*", "b|ab", "[ab]"]),
        field=st.one_of(st.none(), st.just("region")),
        regex=st.sampled_from(REGEXES),
    ),
)


def _batch(rows: list[dict[str, Any]], first_offset: int = 0) -> pa.RecordBatch:
    """The rows with their offsets (unique, growing) and a timestamp."""
    full = [
        {**r, "kafka_offset": first_offset + i, "kafka_timestamp": 1_700_000_000_000_000 + i}
        for i, r in enumerate(rows)
    ]
    return pa.RecordBatch.from_pylist(full, SCHEMA)


def _text(row: dict[str, Any], field: str) -> str | None:
    """A route field's text as Spark casts it (the DataFrame path's `route_condition`)."""
    if field == "kafka_key":
        key = row["kafka_key"]
        return None if key is None else key.decode("utf-8", "replace")
    if field.startswith("header:"):
        found = [h["value"] for h in row["kafka_headers"] or () if h["key"] == field[7:]]
        last = found[-1] if found else None
        return None if last is None else last.decode("utf-8", "replace")
    value = row[field]
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


def _takes(route: Route, row: dict[str, Any]) -> bool:
    topic = row["kafka_topic"]
    if route.topics and topic not in route.topics:
        return False
    if not route.topics and route.topic_pattern and not re.fullmatch(route.topic_pattern, topic):
        return False
    if route.field is not None and route.regex is not None:
        text = _text(row, route.field)
        return text is not None and re.fullmatch(route.regex, text) is not None
    return True


def _reference(
    rows: list[dict[str, Any]], table_routes: dict[str, Route], default: str | None
) -> tuple[dict[str, list[bool]], list[bool]]:
    """Per table whether it takes each row, and whether no table does (the dead letters):
    a default table takes what the others do not, and its own route's rows if it has one."""
    takes = {name: [_takes(r, row) for row in rows] for name, r in table_routes.items()}
    others = [t for name, t in takes.items() if name != default]
    untaken = [not any(t[i] for t in others) for i in range(len(rows))]
    if default is not None:
        own = table_routes[default]
        takes[default] = [
            u or (t and not own.takes_everything)
            for u, t in zip(untaken, takes[default], strict=True)
        ]
        untaken = [False] * len(rows)
    return takes, untaken


tables_of = st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3"]), routes, min_size=1)


@settings(max_examples=200, deadline=None)
@given(records, tables_of, st.data())
def test_the_tasks_route_masks_take_the_rows_the_route_rules_give(
    rows: list[dict[str, Any]], table_routes: dict[str, Route], data: st.DataObject
) -> None:
    default = data.draw(st.one_of(st.none(), st.sampled_from(sorted(table_routes))))
    batch = _batch(rows)
    masks, untaken = route_split(batch, table_routes, default)
    want, want_untaken = _reference(batch.to_pylist(), table_routes, default)
    assert {n: m.to_pylist() for n, m in masks.items()} == want
    assert untaken.to_pylist() == want_untaken


class _Target:
    """A task target that keeps the rows its writers are given (no files)."""

    def __init__(self, name: str, written: dict[str, list[pa.RecordBatch]]) -> None:
        self.name = name
        self.written = written

    @property
    def instant_time(self) -> str:
        return "20261128000000000"

    def open(self, attempt: Any) -> Any:
        target = self

        class Writer:
            def write(self, batch: pa.RecordBatch) -> None:
                target.written.setdefault(target.name, []).append(batch)

            def close(self) -> tuple[list[Any], dict[str, Any]]:
                return [], {}

        return Writer()


class _Reader:
    """A `DirectTask`'s reading: the decoded batches, and the records that failed to decode
    handed to `failed`."""

    dead_letter_schema = DEAD_LETTER_SCHEMA

    def __init__(
        self, batches: list[pa.RecordBatch], broken: list[FailedRecord], dead_table: bool
    ) -> None:
        self.batches = batches
        self.broken = broken
        self.dead_letter_table = dead_table

    def rows_of(self, pieces: Any, failed: list[Any]) -> Iterator[pa.RecordBatch]:
        failed.extend(self.broken)
        yield from self.batches


def _coordinates(batches: list[pa.RecordBatch]) -> list[tuple[str, int, int]]:
    return sorted(
        (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"])
        for b in batches
        for r in b.to_pylist()
    )


positions = st.dictionaries(
    st.tuples(st.sampled_from(TOPICS), st.integers(0, 1)),
    st.one_of(st.none(), st.integers(0, 45)),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(records, tables_of, st.data())
def test_a_routed_task_writes_each_table_its_routes_rows_from_its_own_offset_on(
    rows: list[dict[str, Any]], table_routes: dict[str, Route], data: st.DataObject
) -> None:
    default = data.draw(st.one_of(st.none(), st.sampled_from(sorted(table_routes))))
    dead_table = data.draw(st.booleans())
    # each table's committed position: per partition, the offset its rows start at (None:
    # none of them), as `_skip_below` gives it; the dead-letter table's too
    skips = {name: data.draw(positions) for name in [*table_routes, "dead"]}
    # two batches of the task's pieces (offsets growing), some records that failed to decode
    batch = _batch(rows)
    half = batch.num_rows // 2
    batches = [batch.slice(0, half), batch.slice(half)]
    broken = [
        FailedRecord(TopicPartition(t, p), 100 + i, None, None, b"{", (), "not JSON")
        for i, (t, p) in enumerate(
            data.draw(st.lists(st.sampled_from(list(skips["dead"]) or [("a", 0)]), max_size=3))
        )
    ]
    written: dict[str, list[pa.RecordBatch]] = {}
    tables = [FannedTable(n, _Target(n, written), (), skips[n]) for n in sorted(table_routes)]
    dead = FannedTable("dead", _Target("dead", written), (), skips["dead"]) if dead_table else None
    task = RoutedDirectTask(
        _Reader(batches, broken, dead_table), tables, dead, table_routes, default
    )
    (out,) = list(task([[]]))
    import json

    result = json.loads(out)

    def after(name: str, t: str, p: int, offset: int) -> bool:
        if (t, p) not in skips[name]:
            return True
        start = skips[name][(t, p)]
        return start is not None and offset >= start

    full = batch.to_pylist()
    want, untaken = _reference(full, table_routes, default)
    at = [(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in full]
    for name in table_routes:
        expected = sorted(c for c, t in zip(at, want[name], strict=True) if t and after(name, *c))
        assert _coordinates(written.get(name, [])) == expected, name
        # a status from each table the task wrote to, none from the others
        assert (name in result["statuses"]) == bool(expected), name
    no_route = [c for c, u in zip(at, untaken, strict=True) if u]
    if default is None and not dead_table:  # nowhere to put them: the first one named
        assert result["untaken"] == (list(no_route[0]) if no_route else None)
        return
    assert result["untaken"] is None
    if not dead_table:
        return
    expected_dead = sorted(
        [c for c in no_route if after("dead", *c)]
        + [
            (f.partition.topic, f.partition.partition, f.offset)
            for f in broken
            if after("dead", f.partition.topic, f.partition.partition, f.offset)
        ]
    )
    got = written.get("dead", [])
    assert _coordinates(got) == expected_dead
    errors = [e for b in got for e in b.column("error").to_pylist()]
    assert errors.count("not JSON") + errors.count(UNTAKEN_REASON) == len(errors)
    for b in got:  # the untaken ones keep no raw value, as the DataFrame path's
        for r in b.to_pylist():
            assert (r["kafka_value"] is None) == (r["error"] == UNTAKEN_REASON)
