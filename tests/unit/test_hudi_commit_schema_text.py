"""The schema a Hudi commit records when its tasks wrote in two schemas (one resolved the
table's latest schema before another writer's evolution committed, one after): unified, so
neither the other writer's column nor the batch's own is lost."""

from __future__ import annotations

import pyarrow as pa

from lakesink.formats import plugin_for
from lakesink.formats.hudi.table.avro_schema import arrow_schema_of

BASE = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])


def _text(schema: pa.Schema) -> str:
    return plugin_for("hudi").commit_schema(schema, "t").text


def test_tasks_in_two_schemas_record_their_union() -> None:
    ours = BASE.append(pa.field("country", pa.string()))  # the batch's own evolution
    theirs = pa.schema(
        [pa.field("id", pa.int64()), BASE.field("name"), pa.field("region", pa.string())]
    ).append(pa.field("country", pa.string()))  # resolved after the other writer's commit
    written = plugin_for("hudi").written_schema(["", _text(ours), _text(theirs), _text(ours)])
    assert written is not None
    got = arrow_schema_of(written)
    assert set(got.names) == {"id", "name", "region", "country"}
    assert got.field("id").type == pa.int64()
    # the same text whatever order the tasks ended in
    assert plugin_for("hudi").written_schema([_text(theirs), _text(ours)]) == written


def test_tasks_in_one_schema_record_it_as_written() -> None:
    text = _text(BASE)
    assert plugin_for("hudi").written_schema([text, "", text]) == text
    assert plugin_for("hudi").written_schema(["", ""]) is None
    assert plugin_for("iceberg").written_schema([text]) is None
