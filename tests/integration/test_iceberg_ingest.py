"""`lakesink ingest` into Iceberg tables (table.format=iceberg) on the shared broker and Spark:
every Kafka record once across reruns, a deleted checkpoint, retried tasks, two writers on one
table; the audit reads the table with pyiceberg (and DuckDB) against Kafka, and the snapshot
summaries carry the writer's offsets. (The driver killed with SIGKILL at each commit step:
test_ingest_crashes.py, side by side with the Hudi chains.)"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file
from integration.table_stores import table_at

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.errors import ConfigError
from lakesink.formats.iceberg.format import open_iceberg_table
from lakesink.formats.iceberg.snapshots import KEY_WRITER_ID, WriterCommit
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def _config(bootstrap: str, topic: str, warehouse: Path, **overrides: Any) -> LakesinkConfig:
    return ingest_config(
        bootstrap,
        topic,
        warehouse,
        table__format="iceberg",
        table__name=overrides.pop("name", "events"),
        **overrides,
    )


def _audited_rows(cfg: LakesinkConfig) -> int:
    report = audit_config(cfg)
    assert report.ok, report.problems
    readers = report.to_json()["readers"]
    assert len(set(readers.values())) == 1, readers  # every reader sees the same rows
    return int(readers["pyiceberg"])


def _summaries(cfg: LakesinkConfig) -> list[dict[str, str]]:
    table = open_iceberg_table(cfg.settings, create=False)
    return [
        dict(s.summary.additional_properties)
        for s in table.pyiceberg.metadata.snapshots
        if s.summary is not None
    ]


@pytest.mark.parametrize("store", ["local", "azure"])
def test_ingest_lands_every_record_once_across_reruns_and_a_deleted_checkpoint(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    """Also with the warehouse on Azure Blob (Azurite; the SQLite catalog on local disk): the
    tasks' data files, the metadata and pyiceberg's audit go through pyarrow's AzureFileSystem
    with the storage.azure.* settings."""
    topic = topic_factory("ice-once")
    counts = produce_sample_events(kafka_bootstrap, topic, 600, 3)
    where = table_at(store, tmp_path, request, "wh")
    overrides = dict(where.overrides)
    if store != "local":
        overrides["iceberg__catalog__uri"] = f"sqlite:///{tmp_path / 'catalog.db'}"
    cfg = _config(
        kafka_bootstrap, topic, where.path, kafka__max__records__per__batch=200, **overrides
    )
    first = run_ingestion(cfg, spark)
    assert first.records == 600
    assert _audited_rows(cfg) == 600
    location = open_iceberg_table(cfg.settings, create=False).location
    assert location.startswith("abfss://" if store == "azure" else "file://"), location
    summaries = _summaries(cfg)
    assert len(summaries) >= 3  # one snapshot per batch of at most 200 records
    last = WriterCommit.from_summary(summaries[-1])
    assert last is not None and last.writer_id == cfg.writer_id
    assert {tp.key(): n for tp, n in last.offsets.next_offsets.items()} == {
        tp.key(): n for tp, n in counts.items()
    }
    assert last.vtts_ms is not None  # every partition had records in the last batch
    # nothing new: no snapshot
    again = run_ingestion(cfg, spark)
    assert again.nothing_new and len(_summaries(cfg)) == len(summaries)
    # more records, and Spark's checkpoint lost: the table's offsets say where to go on
    produce_sample_events(kafka_bootstrap, topic, 300, 3)
    shutil.rmtree(cfg.checkpoint_location)
    more = run_ingestion(cfg, spark)
    assert more.records == 300
    assert _audited_rows(cfg) == 900


def test_two_writers_share_one_iceberg_table_and_each_finds_its_own_offsets(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    a_topic, b_topic = topic_factory("ice-a"), topic_factory("ice-b")
    produce_sample_events(kafka_bootstrap, a_topic, 120, 2)
    produce_sample_events(kafka_bootstrap, b_topic, 80, 2)
    a = _config(kafka_bootstrap, a_topic, tmp_path / "wh", writer__id="writer-a")
    b = _config(kafka_bootstrap, b_topic, tmp_path / "wh", writer__id="writer-b")
    assert run_ingestion(a, spark).records == 120
    assert run_ingestion(b, spark).records == 80
    # writer a's offsets lie behind writer b's snapshot: found by walking back the lineage
    produce_sample_events(kafka_bootstrap, a_topic, 60, 2)
    assert run_ingestion(a, spark).records == 60
    assert run_ingestion(b, spark).nothing_new
    writers = [s.get(KEY_WRITER_ID) for s in _summaries(a)]
    assert writers.count("writer-a") == 2 and writers.count("writer-b") == 1, writers
    table = open_iceberg_table(a.settings, create=False)
    assert table.pyiceberg.scan().to_arrow().num_rows == 260


def test_iceberg_refuses_what_it_cannot_do_yet_by_name(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    topic = topic_factory("ice-refuse")
    produce_sample_events(kafka_bootstrap, topic, 3, 1)
    for overrides, named in (
        (
            {"errors__tolerance": "all", "errors__deadletter__table": str(tmp_path / "dlq")},
            "errors.deadletter.table=.*iceberg.namespace",
        ),
    ):
        cfg = _config(kafka_bootstrap, topic, tmp_path / "wh", **overrides)
        with pytest.raises(ConfigError, match=named):
            run_ingestion(cfg, spark)


def test_retried_tasks_commit_only_the_successful_attempts_files(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("ice-retry")
    produce_sample_events(kafka_bootstrap, topic, 90, 3)
    cfg = _config(kafka_bootstrap, topic, tmp_path / "wh", spark__master="local[2,2]")
    conf = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(["ingest", "--config", str(conf), "--once"], env={"LAKESINK_FAIL_TASK_ATTEMPTS": "1"})
    assert run.returncode == 0, run.stdout[-3000:]
    assert _audited_rows(cfg) == 90
    table = open_iceberg_table(cfg.settings, create=False)
    referenced = {t.file.file_path for t in table.pyiceberg.scan().plan_files()}
    written = {p.as_uri() for p in Path(table.location.removeprefix("file://")).rglob("*.parquet")}
    # the failed first attempts' files stay unreferenced (orphans for remove-orphan-files)
    assert referenced and referenced < written
