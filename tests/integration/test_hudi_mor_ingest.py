"""A change stream ingested into a merge-on-read Hudi table (write.operation=cdc,
table.type=MERGE_ON_READ) through the real pipeline (the session's broker and Spark): every batch
is a deltacommit whose log files hold the changed rows and the deletes, and every second one is
followed by an inline compaction (table.compaction.every.commits=2) and the inline clean and
archival (table.services.inline.every.commits=2), each of which runs. Then the stream's last
records race a `lakesink table compact` process: the compaction plans (holding the table lock)
and the ingestion, started then, waits for the lock; once it waits, the compaction completes,
and the ingestion's deltacommit lands over the compacted slices (pauses of lakesink.faults
order the two processes: no sleeps). hudi-rs and lakesink's reader (and Spark through
format("lakesink")) read the rows the stream leaves, and `lakesink verify`'s fold audit passes
over the archived deltacommits and the active ones."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.config import LakesinkConfig
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.services.archival import archived_instants
from lakesink.formats.hudi.services.compaction import plan_operations
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import make_producer
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, ChangeRecord, sample_changes
from lakesink.protocol.instant import Action, Instant

BATCH = 55  # four batches of the stream's first 177 records: two inline runs of the services
RACE = 40  # the stream's last records: two runs of 20, one of them racing a compaction process


def _accounts(rows: pa.Table) -> dict[int, tuple[Any, ...]]:
    out = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in rows.to_pylist()}
    assert len(out) == rows.num_rows, "two rows of one key"
    return out


def test_a_change_stream_lands_as_deltacommits_that_every_reader_folds_alike(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    topic = topic_factory("mor-cdc")
    stream = sample_changes(30, 150, 2, seed=31)
    assert stream.counts["d"] > 0 and stream.counts["u"] > 0
    create_topic(kafka_bootstrap, topic, 2)
    first = stream.records[:-RACE]
    _produce(kafka_bootstrap, topic, first)
    settings: dict[str, Any] = dict(
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
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "accounts", **settings)
    run_ingestion(cfg, spark)
    table = HudiTable.open(cfg.table_storage)
    assert table.config.table_type == "MERGE_ON_READ"
    timeline = table.timeline()
    done = timeline.completed()
    archived = archived_instants(table)
    deltas = timeline.completed(Action.DELTA_COMMIT)
    batches_ = [i for i in (*archived, *deltas) if i.action is Action.DELTA_COMMIT]
    assert len(batches_) >= -(-len(first) // BATCH) >= 4  # one per batch
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

    # the race: no inline compaction now, the compaction process's alone
    settings["table__compaction__every__commits"] = 0
    raced = ingest_config(kafka_bootstrap, topic, tmp_path / "accounts", **settings)
    _produce(kafka_bootstrap, topic, stream.records[-RACE : -RACE // 2])
    run_ingestion(raced, spark)  # a deltacommit of log files: something to compact
    assert plan_operations(table)
    _produce(kafka_bootstrap, topic, stream.records[-RACE // 2 :])
    compaction = _race_a_compaction_process(raced, spark, tmp_path / "pause")
    timeline = table.timeline()
    everything = (*archived_instants(table), *timeline.instants)  # inline archival ran too
    after = [i for i in timeline.completed(Action.DELTA_COMMIT) if i.time > compaction.time]
    assert after, "no deltacommit after the compaction"
    assert not timeline.inflight_or_requested()
    assert Action.ROLLBACK not in {i.action for i in everything}, "a deltacommit failed"
    batches_ = [i for i in everything if i.action is Action.DELTA_COMMIT]

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


def _produce(bootstrap: str, topic: str, records: Sequence[ChangeRecord]) -> None:
    producer = make_producer(bootstrap)
    for r in records:
        producer.produce(topic, r.value, r.key, partition=r.partition)
    assert producer.flush(60) == 0, "records not delivered"


def _wait_for(marker: Path, *running: Callable[[], bool]) -> None:
    """Until `marker` exists (a pause point's), failing as soon as a process it waits on ends."""
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert all(alive() for alive in running), f"a process ended before {marker.name}"
        assert time.monotonic() < deadline, f"no {marker.name} in 120 s"
        time.sleep(0.02)


def _race_a_compaction_process(cfg: LakesinkConfig, spark: Any, pause: Path) -> Instant:
    """`lakesink table compact` in a process of its own plans a compaction and, holding the
    table lock, waits until an ingestion of `cfg` (started then) waits for that lock; then both
    go on. The completed compaction."""
    pause.mkdir()
    (pause / "waiting-for-lock.go").touch()  # the ingestion only marks that it waits
    command = ["table", "compact", str(cfg["table.path"]), "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lakesink.cli.main", *command],
        env={
            **os.environ,
            "LAKESINK_PAUSE_AT": "compaction-requested",
            "LAKESINK_PAUSE_DIR": str(pause),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(pause / "compaction-requested.reached", lambda: proc.poll() is None)
        with (
            pytest.MonkeyPatch.context() as patch,
            ThreadPoolExecutor(1) as pool,
        ):
            patch.setenv("LAKESINK_PAUSE_AT", "waiting-for-lock")
            patch.setenv("LAKESINK_PAUSE_DIR", str(pause))
            ingestion: Future[Any] = pool.submit(run_ingestion, cfg, spark)
            try:
                _wait_for(pause / "waiting-for-lock.reached", lambda: not ingestion.done())
            finally:  # on a failure too: the ingestion must not wait for a paused lock holder
                (pause / "compaction-requested.go").touch()
            out, err = proc.communicate(timeout=120)
            ingestion.result(timeout=180)
    finally:
        (pause / "compaction-requested.go").touch()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    done = json.loads(out)
    assert done["instant"] and done["file_groups"] > 0, done
    table = HudiTable.open(cfg.table_storage)
    (compaction,) = [  # the compaction commit completed (and may be archived since)
        i
        for i in (*archived_instants(table), *table.timeline().instants)
        if str(i.time) == done["instant"]
    ]
    assert compaction.action is Action.COMMIT and compaction.is_completed, compaction
    return compaction
