"""`lakesink backfill` asks the format of the table at `--table` (else the configured one)
whether it can backfill with what it was given, and refuses before Spark starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.cli.main import main

KAFKA = [
    "--set",
    "kafka.bootstrap.servers=127.0.0.1:1",
    "--set",
    "kafka.topics=events",
    "--set",
    "value.schema=id INT",
]


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        # an Iceberg table's commits go through its catalog, which the path alone does not name
        ([], "is an Iceberg table; give the configuration of its catalog"),
        # a configuration of another format does not name it either
        ([*KAFKA, "--set", "table.format=hudi"], "is an Iceberg table; give the configuration"),
        # the catalog orders the commits: a lock is Hudi's
        (
            [*KAFKA, "--set", "table.format=iceberg", "--lock-provider", "filesystem"],
            "--lock-provider and --postgres-dsn are for Hudi tables",
        ),
    ],
    ids=["no-configuration", "hudi-configuration", "lock-options"],
)
def test_backfill_into_an_iceberg_warehouse_refuses_what_it_cannot_honour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str], refusal: str
) -> None:
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    (warehouse / "catalog.db").write_bytes(b"")  # what marks a local Iceberg warehouse
    code = main(["backfill", "--table", str(warehouse), "--from", str(tmp_path), *given])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"backfill: {warehouse}" in err or "backfill: --lock-provider" in err, err
    assert refusal in err and "Traceback" not in err, err
