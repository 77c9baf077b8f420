"""The JSON value rules (json_values.py): each edge value has one outcome, whatever the schema's
other columns, on the bulk path and the per-value reference alike; row i is always value i."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from lakesink.errors import ConfigError
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.deserializers import Decoded, JsonDeserializer
from lakesink.kafka.json_values import MAX_DEPTH, BadValue, JsonValueDecoder

BASE = "id BIGINT, d DOUBLE, f FLOAT, s STRING, b BINARY, t TIMESTAMP, n TIMESTAMP_NTZ, day DATE"
# the same columns, plus a column that pyarrow.json cannot fill (so the schema takes another path)
SCHEMAS = {
    "plain": BASE,
    "with a map": BASE + ", m MAP<STRING, STRING>",
    "with a date in a struct": BASE + ", st STRUCT<day: DATE>",
    "with a decimal": BASE + ", dec DECIMAL(6, 2)",
}


def reference(ddl: str, values: list[bytes | None]) -> Decoded:
    """Value by value through the rules, as a Decoded."""
    rules = JsonValueDecoder(ddl_to_arrow(ddl))
    rows: list[dict[str, Any]] = []
    failures: dict[int, str] = {}
    for i, v in enumerate(values):
        try:
            rows.append(rules.decode_one(v))
        except BadValue as e:
            failures[i] = str(e)
    return Decoded(pa.Table.from_pylist(rows, schema=ddl_to_arrow(ddl)), failures)


def test_issue_repro_two_documents_and_an_empty_value_never_shift_rows() -> None:
    out = JsonDeserializer("id BIGINT").decode([b'{"id":5}', b"", b'{"id":1}\n{"id":9}'])
    assert out.table.column("id").to_pylist() == [5]
    assert out.failures[1] == "value is empty"
    assert "Extra data" in out.failures[2]
    assert sorted(out.failures) == [1, 2]


def test_a_document_spanning_two_values_and_two_documents_in_a_third_are_all_refused() -> None:
    """pyarrow.json reads across line feeds: joined, these give 3 rows for 3 values, shifted."""
    values: list[bytes | None] = [b'{"x":', b'{"id":1}}', b'{"id":2} {"id":3}', b'{"id":4}']
    out = JsonDeserializer("id BIGINT").decode(values)
    assert sorted(out.failures) == [0, 1, 2]
    assert out.table.column("id").to_pylist() == [4]


def test_a_raw_line_break_inside_a_string_is_refused_not_altered() -> None:
    out = JsonDeserializer("s STRING").decode([b'{"s":"a\nb"}', b'{"s":"a\\nb"}'])
    assert list(out.failures) == [0] and "Invalid control character" in out.failures[0]
    assert out.table.column("s").to_pylist() == ["a\nb"]


def test_map_column_does_not_change_how_a_float_into_bigint_decodes() -> None:
    for ddl in ("id BIGINT", "id BIGINT, m MAP<STRING,STRING>", "id BIGINT, s STRUCT<d: DATE>"):
        out = JsonDeserializer(ddl).decode([b'{"id": 1.5}'])
        assert list(out.failures) == [0], ddl
        assert "expected an integer" in out.failures[0]


UTC_2024 = datetime(2024, 1, 1, tzinfo=UTC)

# (value, expected row subset) or (value, failure fragment)
EDGES: list[tuple[bytes | None, dict[str, Any] | str]] = [
    (b'{"id": 5}', {"id": 5}),
    (b'{"id": -0}', {"id": 0}),
    (b'{"id": 1e3}', "expected an integer"),
    (b'{"id": -0.0}', "expected an integer"),
    (b'{"id": 1.0}', "expected an integer"),
    (b'{"id": 9223372036854775807}', {"id": 2**63 - 1}),
    (b'{"id": 9223372036854775808}', "out of range"),
    (b'{"id": 1' + b"0" * 60 + b"}", "out of range"),
    (b'{"id": "5"}', "expected an integer"),
    (b'{"id": true}', "expected an integer"),
    (b'{"id": 1, "id": 2}', "appears twice"),
    (b'{"x": 1, "x": 2, "id": 3}', {"id": 3}),  # a repeated name that is no column is ignored
    (b'{"d": 1e400}', "out of range"),
    (b'{"d": -1e400}', "out of range"),
    (b'{"d": 1e-400}', {"d": 0.0}),
    (b'{"d": -0}', {"d": -0.0}),
    (b'{"d": 5}', {"d": 5.0}),
    (b'{"d": NaN}', "NaN"),
    (b'{"d": Infinity}', "Infinity"),
    (b'{"d": -Infinity}', "Infinity"),
    (b'{"x": NaN, "id": 1}', "NaN"),  # invalid JSON anywhere in the value
    (b'{"d": "1.5"}', "expected a number"),
    (b'{"f": 1e39}', "out of range"),
    (b'{"f": 0.5}', {"f": 0.5}),
    (b'{"s": 5}', "expected a string"),
    (b'{"s": "\\ud800"}', "lone surrogate"),
    (b'{"s": "\\udc00x"}', "lone surrogate"),
    (b'{"s": "\\ud83d\\ude00"}', {"s": "\U0001f600"}),
    (b'{"s": "\xff"}', "not valid UTF-8"),
    (b'{"x": "\xed\xa0\x80", "id": 1}', "not valid UTF-8"),  # an encoded surrogate, anywhere
    (b'{"s": "caf\xc3\xa9"}', {"s": "caf\u00e9"}),
    (b'{"s": "a\\u0000b"}', {"s": "a\x00b"}),
    (b'{"s": "a\tb"}', "Invalid control character"),
    (b'{"b": "\\u00e9"}', {"b": b"\xc3\xa9"}),
    (b'{"b": "\\udfff"}', "lone surrogate"),
    (b"\xef\xbb\xbf" + b'{"id": 1}', "byte order mark"),
    (b'{"id": 1}\xef\xbb\xbf', "Extra data"),
    (b"", "value is empty"),
    (b"  \n", "value is empty"),
    (b'{"id": 1}{"id": 2}', "Extra data"),
    (b'{"id": 1}\n{"id": 2}', "Extra data"),
    (b'{"id": 1} x', "Extra data"),
    (b'\n {"id": 7} \r\n', {"id": 7}),  # JSON whitespace around the document
    (b'{"id": 7}\x0b', "Extra data"),  # vertical tab is no JSON whitespace
    (b'{"id": 1, }', "Expecting property name"),
    (b'{"id": 1 /* c */}', "Expecting"),
    (b"null", "not a JSON object"),
    (b"[1]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (b"x" * 3, "not one valid JSON document"),
    (b'{"x": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b', "id": 1}', "deeper"),
    (b'{"x": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b', "id": 1}', {"id": 1}),
    (b'{"t": "2024-01-01T00:00:00Z"}', {"t": UTC_2024}),
    (b'{"t": "2024-01-01 02:00:00+02:00"}', {"t": UTC_2024}),
    (b'{"t": "2024-01-01T00:00:00"}', {"t": UTC_2024}),
    (b'{"t": "2024-01-01T00:00:00.5Z"}', {"t": UTC_2024.replace(microsecond=500000)}),
    (b'{"t": "2024-01-01T00:00:00.123456789Z"}', "not a timestamp"),
    (b'{"t": "20240101T000000Z"}', "not a timestamp"),
    (b'{"t": "2024-01-01"}', "not a timestamp"),
    (b'{"t": "2024-01-01T00:00Z"}', "not a timestamp"),
    (b'{"t": "2024-01-01t00:00:00z"}', "not a timestamp"),
    (b'{"t": "2024-12-31T23:59:60Z"}', "not a timestamp"),
    (b'{"t": "2024-02-30T00:00:00Z"}', "not a date"),
    (b'{"t": " 2024-01-01T00:00:00Z"}', "not a timestamp"),
    (b'{"t": 1704067200}', "expected a timestamp string"),
    (b'{"n": "2024-01-01T00:00:00"}', {"n": datetime(2024, 1, 1)}),
    (b'{"n": "2024-01-01T00:00:00Z"}', "not a timestamp"),
    (b'{"day": "2024-02-29"}', {"day": date(2024, 2, 29)}),
    (b'{"day": "2023-02-29"}', "not a date"),
    (b'{"day": "20240229"}', "expected a date string"),
    (b'{"day": "0000-01-01"}', "not a date"),
    ('{"day": "\u0662\u0660\u0662\u0664-01-01"}'.encode(), "expected a date string"),
    ('{"t": "2024-01-01T\u0661\u0662:00:00Z"}'.encode(), "not a timestamp"),
    (None, {"id": None, "s": None}),
]


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize(("value", "expected"), EDGES)
def test_each_edge_value_has_one_outcome_whatever_the_other_columns(
    schema: str, value: bytes | None, expected: dict[str, Any] | str
) -> None:
    ddl = SCHEMAS[schema]
    # alone, and between good values (so the bulk path sees it inside a batch)
    for values, at in (([value], 0), ([b'{"id": 0}', value, b'{"id": 2}'], 1)):
        out = JsonDeserializer(ddl).decode(values)
        ref = reference(ddl, values)
        assert out.failures.keys() == ref.failures.keys()
        assert out.table.equals(ref.table)
        if isinstance(expected, str):
            assert list(out.failures) == [at] and expected in out.failures[at], out.failures
        else:
            assert not out.failures, out.failures
            row = out.table.to_pylist()[at]
            for k, v in expected.items():
                assert row[k] == v and type(row[k]) is type(v), (k, row[k])
                if isinstance(v, float):
                    assert str(row[k]) == str(v)  # -0.0 stays -0.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b'{"dec": 12.5}', Decimal("12.50")),
        (b'{"dec": "12.5"}', Decimal("12.50")),
        (b'{"dec": 12.500}', Decimal("12.50")),
        (b'{"dec": 1e2}', Decimal("100.00")),
        (b'{"dec": -0}', Decimal("0.00")),
        (b'{"dec": 12.345}', "fractional digits"),
        (b'{"dec": 12345}', "does not fit"),
        (b'{"dec": " 12.5"}', "not a number in JSON syntax"),
        (b'{"dec": "012.5"}', "not a number in JSON syntax"),
        (b'{"dec": "+1"}', "not a number in JSON syntax"),
        (b'{"dec": "NaN"}', "not a number in JSON syntax"),
        (b'{"dec": 1e-999999999}', "fractional digits"),
        (b'{"dec": 1e999999999}', "does not fit"),
        (b'{"dec": true}', "expected a number"),
    ],
)
def test_decimal_rules(value: bytes, expected: Decimal | str) -> None:
    out = JsonDeserializer("dec DECIMAL(6, 2)").decode([value])
    if isinstance(expected, str):
        assert expected in out.failures[0]
    else:
        assert not out.failures and out.table.column("dec").to_pylist() == [expected]


def test_maps_refuse_repeated_keys_and_nested_rules_apply() -> None:
    d = JsonDeserializer("m MAP<STRING, BIGINT>, st STRUCT<a: INT NOT NULL, day: DATE>")
    out = d.decode(
        [
            b'{"m": {"a": 1, "a": 2}}',
            b'{"m": {"\\ud800": 1}}',
            b'{"m": {"a": 1.5}}',
            b'{"st": {"day": "2024-01-01"}}',
            b'{"st": {"a": 1, "a": 1}}',
            b'{"m": {"a": 1, "b": null}, "st": {"a": 7, "day": "2024-01-02"}}',
        ]
    )
    assert "appears twice" in out.failures[0]
    assert "lone surrogate" in out.failures[1]
    assert "expected an integer" in out.failures[2]
    assert "required (NOT NULL)" in out.failures[3] and "st.a" in out.failures[3]
    assert "appears twice" in out.failures[4]
    assert out.table.to_pylist() == [
        {"m": [("a", 1), ("b", None)], "st": {"a": 7, "day": date(2024, 1, 2)}}
    ]


def test_required_columns_and_tombstones() -> None:
    d = JsonDeserializer("id BIGINT NOT NULL, s STRING")
    out = d.decode([None, b'{"s": "x"}', b'{"id": null}', b'{"id": 3}'])
    assert out.failures[0] == "tombstone (null value) for a schema with required column id"
    assert "required (NOT NULL)" in out.failures[1]
    assert "required (NOT NULL)" in out.failures[2]
    assert out.table.column("id").to_pylist() == [3]
    assert JsonDeserializer("s STRING").decode([None]).table.to_pylist() == [{"s": None}]


def test_a_map_with_non_string_keys_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="MAP<STRING"):
        JsonDeserializer("m MAP<INT, STRING>")


def test_good_rows_of_a_large_batch_keep_their_positions_around_odd_values() -> None:
    d = JsonDeserializer("id BIGINT, s STRING")
    values: list[bytes | None] = [b'{"id": %d, "s": "v"}' % i for i in range(2000)]
    odd = {
        7: b' {"id": 7}',  # leading space: decoded by the rules, accepted
        100: b'{"id": 100}\n',  # trailing line feed: accepted
        500: b'{"id": 500, "s": "\\ud800"}',
        501: b'{"id": 501.5}',
        1500: None,
        1999: b'{"id": 1999} {"id": -1}',
    }
    for i, v in odd.items():
        values[i] = v
    out = JsonDeserializer("id BIGINT, s STRING").decode(values)
    assert sorted(out.failures) == [500, 501, 1999]
    ids = out.table.column("id").to_pylist()
    assert ids == [None if i == 1500 else i for i in range(2000) if i not in (500, 501, 1999)]
    assert d.decode(values).table.equals(out.table)
