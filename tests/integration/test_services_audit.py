"""A streamed table after clustering, cleaning and archival (inline by default, then by hand):
the exactly-once audit (which reads archived commits' ranges), hudi-rs and lakesink's reader
still agree, and ingestion resumes from the archived offsets."""

from __future__ import annotations

from collections.abc import Callable
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
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("svc")
    produce_sample_events(kafka_bootstrap, topic, 1200, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=100)
    run_ingestion(cfg, spark)
    table = HudiTable.open(cfg["table.path"])
    # maintenance is on by default: every N commits the writer clustered the small files
    every = cfg.settings.services.inline_every_commits
    commits = len(table.timeline().completed(Action.COMMIT))
    assert 0 < every <= commits
    replaced = table.timeline().completed(Action.REPLACE_COMMIT)
    assert len(replaced) == commits // every, [str(i.time) for i in replaced]
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
