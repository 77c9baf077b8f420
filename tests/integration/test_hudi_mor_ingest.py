"""A change stream ingested into a merge-on-read Hudi table (write.operation=cdc,
table.type=MERGE_ON_READ) through the real pipeline (the session's broker and Spark): every batch
is a deltacommit whose log files hold the changed rows and the deletes, and every second one is
followed by an inline compaction (table.compaction.every.commits=2) and the inline clean and
archival (table.services.inline.every.commits=2), each of which runs; hudi-rs and lakesink's
reader (and Spark through format("lakesink")) read the rows the stream leaves, and `lakesink
verify`'s fold audit passes over the archived deltacommits and the active ones."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.services.archival import archived_instants
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes
from lakesink.protocol.instant import Action

BATCH = 55  # four batches of the stream's 217 records: two inline runs of the services


def _accounts(rows: pa.Table) -> dict[int, tuple[Any, ...]]:
    out = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in rows.to_pylist()}
    assert len(out) == rows.num_rows, "two rows of one key"
    return out


def test_a_change_stream_lands_as_deltacommits_that_every_reader_folds_alike(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    topic = topic_factory("mor-cdc")
    stream = produce_sample_changes(kafka_bootstrap, topic, 30, 150, 2, seed=31)
    assert stream.counts["d"] > 0 and stream.counts["u"] > 0
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "accounts",
        value__schema=ACCOUNTS_DDL,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=2,
        table__type="MERGE_ON_READ",
        kafka__max__records__per__batch=BATCH,
        writer__id="mor-writer",
        table__compaction__every__commits=2,  # inline compactions among the batches
        # and the inline clean and archival, small enough that each runs
        table__services__inline__every__commits=2,
        table__services__clean__retain__commits=1,
        table__services__archive__min__instants=2,
        table__services__archive__max__instants=4,
    )
    run_ingestion(cfg, spark)
    table = HudiTable.open(cfg.table_storage)
    assert table.config.table_type == "MERGE_ON_READ"
    timeline = table.timeline()
    done = timeline.completed()
    archived = archived_instants(table)
    deltas = timeline.completed(Action.DELTA_COMMIT)
    batches_ = [i for i in (*archived, *deltas) if i.action is Action.DELTA_COMMIT]
    assert len(batches_) >= -(-len(stream.records) // BATCH) >= 4  # one per batch
    compactions = [i for i in (*archived, *done) if i.action is Action.COMMIT]
    assert len(compactions) == len(batches_) // 2  # every 2nd deltacommit, inline
    assert {i.action for i in done} <= {Action.DELTA_COMMIT, Action.COMMIT, Action.CLEAN}
    assert Action.CLEAN in {i.action for i in (*archived, *done)}, "no inline clean ran"
    assert {Action.DELTA_COMMIT, Action.COMMIT} <= {i.action for i in archived}, (
        "the inline archival moved no deltacommit and compaction"
    )
    assert not timeline.inflight_or_requested()
    compactions = timeline.completed(Action.COMMIT)
    compacted = {
        (w.partition_path, w.file_id) for w in timeline.commit_metadata(compactions[-1]).writes
    }
    assert compacted, "the compaction rewrote no slice"
    slices = FileSystemView(table).latest_base_files()
    assert any(s.log_paths for s in slices) or len(batches_) % 2 == 0, "no log after it"
    expected = {
        k: (r["owner"], Decimal(r["balance"]), r["updated_at"]) for k, r in stream.rows.items()
    }
    batches = hudi_rs_batches(str(cfg["table.path"]), cfg.table_storage.reader_options())
    assert _accounts(pa.Table.from_batches(batches)) == expected
    assert _accounts(TableReader(table).snapshot()) == expected
    # spark.read.format("lakesink"): one task per slice, its log files merged
    read = spark.read.format("lakesink").load(str(cfg["table.path"]))
    assert _accounts(pa.Table.from_pylist([r.asDict() for r in read.collect()])) == expected
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.keys == report.rows_hudi_rs == report.rows_lakesink == len(expected)
    assert report.commits == len(batches_)  # the archived deltacommits' ranges too
