"""A streamed table after clustering, cleaning and archival (inline by default, then by hand):
the exactly-once audit (which reads archived commits' ranges), hudi-rs and lakesink's reader
still agree, and ingestion resumes from the archived offsets. The writer's own clustering runs
beside its batches (table.services.run=beside, the default): held mid-way (a pause point), it
holds no batch back, and lands after them."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive, archived_instants
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import cluster
from lakesink.formats.hudi.table.archive import ARCHIVE_DIR
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.instant import Action

pytestmark = pytest.mark.integration


def test_audit_passes_after_cluster_clean_archive_and_ingestion_resumes(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = topic_factory("svc")
    produce_sample_events(kafka_bootstrap, topic, 1200, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=100)
    every = cfg.settings.services.inline_every_commits
    assert cfg.settings.services.run == "beside" and every == 10  # the defaults
    # the writer's clustering (due after its 10th commit) stops before its replacecommit
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    monkeypatch.setenv("LAKESINK_PAUSE_AT", "clustering-written")
    monkeypatch.setenv("LAKESINK_PAUSE_DIR", str(pauses))
    with ThreadPoolExecutor(1) as pool:
        ingestion = pool.submit(run_ingestion, cfg, spark, 300)
        deadline = time.monotonic() + 240
        while not (pauses / "clustering-written.reached").exists():
            assert not ingestion.done(), ingestion.result()
            assert time.monotonic() < deadline, "no clustering began"
            time.sleep(0.05)
        table = HudiTable.open(cfg["table.path"])
        # while the clustering waits, the batches after the 10th commit (1200 records in
        # batches of 100: 12) go on: every record is committed, the clustering not yet
        while len((timeline := table.timeline()).completed(Action.COMMIT)) < 12:
            assert time.monotonic() < deadline, [str(i.time) for i in timeline.completed()]
            time.sleep(0.05)
        assert not timeline.completed(Action.REPLACE_COMMIT)
        (pending,) = timeline.inflight_or_requested(Action.REPLACE_COMMIT)
        assert not ingestion.done()  # the ingestion's end waits for the clustering
        (pauses / "clustering-written.go").touch()
        assert ingestion.result().records == 1200
    monkeypatch.delenv("LAKESINK_PAUSE_AT")
    # then the clustering landed, after the batches it did not hold (no conflict: appends
    # write new file groups)
    timeline = table.timeline()
    commits = len(timeline.completed(Action.COMMIT))
    assert commits == 12
    replaced = timeline.completed(Action.REPLACE_COMMIT)
    assert [i.time for i in replaced] == [pending.time], [str(i.time) for i in replaced]
    last_batch = timeline.completed(Action.COMMIT)[-1].completion_time
    assert replaced[0].completion_time is not None and last_batch is not None
    assert replaced[0].completion_time > last_batch
    services = LockedCommitControl(cfg["table.path"])
    clustered = cluster(table, services)
    assert clustered.instant is not None and clustered.files_after < clustered.files_before
    clean(table, services, RetainPolicy(commits=1))
    # packs of 6 archived files, merged two by two: the audit reads archived commits from packs
    archive(
        table, services, ArchivePolicy(min_instants=2, max_instants=3, pack_files=6, pack_fan_in=2)
    )
    assert archived_instants(table), "nothing was archived"
    packs = list((Path(cfg["table.path"]) / ARCHIVE_DIR / "timeline").glob("pack-L*.parquet"))
    assert packs, "nothing was packed"
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 1200
    produce_sample_events(kafka_bootstrap, topic, 100, 2, first_event_id=1200, create=False)
    assert run_ingestion(cfg, spark).records == 100
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 1300
