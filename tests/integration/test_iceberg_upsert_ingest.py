"""A Debezium change stream ingested into an Iceberg table of keys (table.format=iceberg,
write.operation=cdc) through the real pipeline (the session's broker and Spark): each batch is
one overwrite snapshot of the buckets it touches, and pyiceberg and DuckDB read exactly the rows
the stream leaves; the fold audit (lakesink verify) passes, and names a key another engine
deleted. (Replays, conflicts and the fold rule: tests/unit/test_iceberg_upsert.py.)"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from pyiceberg.expressions import EqualTo

from lakesink.formats.iceberg.format import open_iceberg_table
from lakesink.formats.iceberg.keyed import layout_of
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes

pytestmark = pytest.mark.integration


def _accounts(rows: pa.Table) -> dict[int, tuple[Any, ...]]:
    out = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in rows.to_pylist()}
    assert len(out) == rows.num_rows, "two rows of one key"
    return out


def _duckdb_rows(metadata_location: str) -> pa.Table:
    """The table's rows as DuckDB's iceberg extension scans them (loaded from its PyPI
    package, no network)."""
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    try:
        for name in ("avro", "iceberg"):
            package = Path(importlib.import_module(f"duckdb_extension_{name}").__file__ or "")
            (binary,) = package.parent.glob(
                f"extensions/v{duckdb.__version__}/{name}.duckdb_extension"
            )
            con.execute(f"LOAD '{binary}'")
        return con.execute(
            "SELECT id, owner, balance, updated_at FROM iceberg_scan(?)", [metadata_location]
        ).to_arrow_table()
    finally:
        con.close()


# each mode on one write path: the direct path's two-stage keyed job (its one-task job of a
# small batch runs in the crash, async and Debezium tests), and the DataFrame path's shuffle
@pytest.mark.parametrize(
    ("mode", "write_path"), [("copy-on-write", "dataframe"), ("merge-on-read", "auto")]
)
def test_a_change_stream_lands_in_an_iceberg_table_of_keys_that_every_reader_reads_alike(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    mode: str,
    write_path: str,
) -> None:
    topic = topic_factory(f"ice-cdc-{mode}")
    stream = produce_sample_changes(kafka_bootstrap, topic, 20, 90, 2, seed=7)
    assert stream.counts["d"] > 0 and stream.counts["u"] > 0
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "wh",
        table__format="iceberg",
        table__name="accounts",
        value__schema=ACCOUNTS_DDL,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=2,
        kafka__max__records__per__batch=60,
        iceberg__write__mode=mode,
        write__path=write_path,
        write__keyed__single__task__max__records=0,  # batches of 60: two stages all the same
        write__keyed__prefold__max__distinct=1,  # every read task folds before the shuffle
    )
    result = run_ingestion(cfg, spark)
    # the records read, not the rows a pre-folding read task hands on (tombstones are no rows)
    assert result.records == len(stream.records) - stream.counts["tombstone"]
    table = open_iceberg_table(cfg.settings, create=False)
    metadata = table.pyiceberg.metadata
    layout = layout_of(metadata, table.name)
    assert layout is not None and layout.key == ("id",) and layout.bucket_count == 2
    assert layout.mode == mode
    operations = [s.summary.operation.value for s in metadata.snapshots if s.summary]
    assert operations.count("overwrite") >= 2, operations  # one per batch of at most 60
    # merge-on-read: the batches' position deletes are live, read by every reader below
    deletes = [d for t in table.pyiceberg.scan().plan_files() for d in t.delete_files]
    assert (len(deletes) > 0) == (mode == "merge-on-read")
    expected = {
        k: (r["owner"], Decimal(r["balance"]), r["updated_at"]) for k, r in stream.rows.items()
    }
    assert _accounts(table.pyiceberg.scan().to_arrow()) == expected
    local = table.pyiceberg.metadata_location.removeprefix("file://")
    assert _accounts(_duckdb_rows(local)) == expected
    # lakesink verify's fold audit: the table equals the fold of the committed records by key
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.keys == len(expected) and report.wrong_keys == 0
    assert report.readers == {"pyiceberg": len(expected), "duckdb": len(expected)}
    assert report.kafka_records == len(stream.records)
    writes = ("overwrite", "append", "delete")  # a merge-on-read batch of deletes: delete
    assert report.commits == sum(operations.count(op) for op in writes)
    if mode == "merge-on-read":
        return  # the audit of a key deleted behind lakesink's back: once, copy-on-write below
    # another engine deletes a key behind lakesink's back: the audit names it missing
    gone = min(expected)
    table.pyiceberg.delete(EqualTo("id", gone))
    report = audit_config(cfg)
    assert report.wrong_keys == 1 and not report.ok, report.problems
    assert f"key ({gone},)" in report.problems[0] and "(0 extra, 1 missing)" in report.problems[0]
