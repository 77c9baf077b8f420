"""Unit: a Hudi writer fits rows to the table's latest Avro schema (`SchemaFit`): as they are,
evolved with schema.evolution = add-and-widen, refused naming the key when it is off; and the
Avro text read back as the Arrow schema it was written from."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakesink.errors import SchemaEvolutionError, SchemaMismatchError
from lakesink.formats.hudi.table.avro_schema import (
    arrow_schema_of,
    avro_schema_for,
    with_meta_columns,
)
from lakesink.formats.hudi.table.evolution import SchemaFit

TABLE = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("addr", pa.struct([pa.field("city", pa.string())])),
    ]
)
TEXT = avro_schema_for(with_meta_columns(TABLE), "t_record")
WIDER = pa.table(
    {
        "id": pa.array([2**40], pa.int64()),
        "addr": pa.array([{"city": "Oslo", "zip": "0150"}]),
        "country": pa.array(["NO"]),
    }
)


def test_avro_text_reads_back_as_the_arrow_schema_it_was_written_from() -> None:
    schema = pa.schema(
        [
            *TABLE,
            pa.field("t", pa.timestamp("us", tz="UTC")),
            pa.field("l", pa.list_(pa.int64())),
            pa.field("m", pa.map_(pa.string(), pa.float64())),
            pa.field("d", pa.struct([pa.field("x", pa.date32()), ("p", pa.decimal128(9, 2))])),
        ]
    )
    assert arrow_schema_of(avro_schema_for(with_meta_columns(schema), "r")) == schema


def test_rows_of_the_table_schema_pass_unchanged() -> None:
    rows = pa.Table.from_pylist([{"id": 1, "addr": {"city": "Oslo"}}], schema=TABLE)
    assert SchemaFit(TEXT, "t_record", "add-and-widen").fit(rows, "here") is rows


def test_add_and_widen_conforms_rows_to_the_evolved_schema() -> None:
    out = SchemaFit(TEXT, "t_record", "add-and-widen").fit(WIDER, "here")
    assert out.schema.names == ["id", "addr", "country"]
    # widened, and optional: the rows' id is (required -> optional)
    assert out.schema.field("id") == pa.field("id", pa.int64(), nullable=True)
    assert out.to_pylist() == WIDER.to_pylist()
    # older rows of a batch (columns left out) are null-filled in the same schema
    narrow = pa.Table.from_pylist([{"id": 1, "addr": {"city": "Bergen"}}], schema=TABLE)
    fit = SchemaFit(TEXT, "t_record", "add-and-widen")
    assert fit.fit(narrow, "here") is narrow  # the table's own schema: no change needed


@pytest.mark.parametrize(
    ("evolution", "error", "words"),
    [
        ("off", SchemaMismatchError, ["'country'", "schema.evolution is off"]),
        (None, SchemaMismatchError, ["'country'"]),
    ],
)
def test_without_evolution_the_mismatch_stays_an_error(
    evolution: str | None, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as e:
        SchemaFit(TEXT, "t_record", evolution).fit(WIDER, "rows of instant 1")  # type: ignore[arg-type]
    for word in words:
        assert word in str(e.value)
    if evolution is None:
        assert "schema.evolution" not in str(e.value)  # a caller that never evolves


def test_a_type_change_that_is_not_a_widening_is_refused_naming_the_field() -> None:
    rows = pa.table({"id": pa.array(["x"]), "addr": pa.array([{"city": "Oslo"}])})
    with pytest.raises(SchemaEvolutionError, match="'id'"):
        SchemaFit(TEXT, "t_record", "add-and-widen").fit(rows, "here")
