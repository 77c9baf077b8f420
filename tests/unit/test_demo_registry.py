"""`lakesink demo --registry` (lakesink.cli.demo_registry): its schema versions evolve a table
by lakesink's rules, each visit fits its version, and a missing registry app is one line naming
the setup script."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.cli.demo_registry import VERSIONS, run_registry_demo, visit
from lakesink.cli.main import build_parser
from lakesink.engine.evolution import evolve
from lakesink.errors import ConfigError
from lakesink.kafka.avro import AvroDeserializer, avro_to_arrow_type


def test_the_demo_versions_evolve_the_table_and_each_visit_fits_its_version() -> None:
    import fastavro

    columns = pa.schema(list(avro_to_arrow_type(VERSIONS[0][1])))
    changes = []
    for number, (_label, schema) in enumerate(VERSIONS, start=1):
        evolved = evolve(columns, pa.schema(list(avro_to_arrow_type(schema))), "add-and-widen")
        changes.append(len(evolved.changes))
        columns = evolved.schema
        parsed = fastavro.parse_schema(json.loads(json.dumps(schema)))
        assert fastavro.validate(visit(number * 7, number), parsed, raise_errors=True)
    # version 1 changes nothing; each later version changes the table
    assert changes[0] == 0 and all(changes[1:])
    assert columns.names == ["id", "visits", "address", "country"]
    assert columns.field("visits").type == pa.int64()
    assert AvroDeserializer(schema=VERSIONS[-1][1], wire_format="plain").value_schema == columns


@pytest.mark.parametrize("fmt", ["hudi", "iceberg"])
def test_demo_registry_without_the_registry_app_is_one_line(
    fmt: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = build_parser().parse_args(
        ["demo", "--registry", "--format", fmt, "--dir", str(tmp_path)]
    )
    assert args.registry and args.format == fmt
    monkeypatch.setenv("LAKESINK_REGISTRY_APP", str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match=r"scripts/setup-registry\.sh"):
        run_registry_demo(args)
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
