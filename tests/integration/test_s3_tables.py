"""Tables on S3 (moto's server over HTTP): ingestion end to end, how many requests a commit
costs, table services with archive packs, two writers with the object-store lease lock, and
faults that must end in one clear line."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from integration.table_stores import table_at
from s3_server import S3Server

from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
from lakesink.formats.hudi.table.archive import ARCHIVE_KEY
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def _moto_requests(server: S3Server) -> list[dict[str, Any]]:
    """Every request moto's server recorded so far (its request log API)."""
    with urllib.request.urlopen(server.endpoint_url + "/moto-api/data.json", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_s3_ingest_resume_then_cluster_clean_archive_with_packs_stays_exactly_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    where = table_at("s3", tmp_path, request)
    topic = topic_factory("s3")
    produce_sample_events(kafka_bootstrap, topic, 600, 3)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=100,
        **where.overrides,
    )
    assert run_ingestion(cfg, spark).records == 600
    produce_sample_events(kafka_bootstrap, topic, 200, 3, first_event_id=600, create=False)
    assert run_ingestion(cfg, spark).records == 200
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == 800
    table = HudiTable.open(cfg.table_storage)
    commits = table.timeline().completed()
    assert len(commits) >= 8 and not table.timeline().inflight_or_requested()
    assert not (tmp_path / "t").exists()  # nothing of the table on local disk

    # table services on S3: clustering rewrites the small files, the cleaner deletes the
    # replaced ones, archival moves old instants into packs; readers and Kafka still agree
    services = LockedCommitControl(cfg.table_storage, writer_id="svc", lock_lease_s=10)
    clustered = cluster(table, services, ClusteringOptions(min_files=2))
    assert clustered.files_after < clustered.files_before
    assert clean(table, services, RetainPolicy(commits=1)).deleted
    produce_sample_events(kafka_bootstrap, topic, 150, 3, first_event_id=800, create=False)
    assert run_ingestion(cfg, spark).records == 150
    policy = ArchivePolicy(min_instants=2, max_instants=3, pack_files=4, pack_fan_in=2)
    assert archive(table, services, policy).archived
    packs = [m.key for m in cfg.table_storage.list_prefix(f"{ARCHIVE_KEY}/timeline")]
    assert any(k.rsplit("/", 1)[-1].startswith("pack-L") for k in packs), packs
    produce_sample_events(kafka_bootstrap, topic, 50, 3, first_event_id=950, create=False)
    assert run_ingestion(cfg, spark).records == 50  # resumes from the archived offsets
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == 1000


def _per_commit(requests: list[tuple[str, str]], commits: int) -> dict[str, float]:
    kinds = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")
    return {k: round(sum(1 for kind, _ in requests if kind == k) / commits, 1) for k in kinds}


def test_s3_requests_per_commit_do_not_grow_with_the_timeline(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    s3_server: S3Server,
) -> None:
    """Two recorded runs of the same number of commits, the second on a table with more
    commits: LIST requests per commit stay flat (the timeline is listed, never data folders)."""
    where = table_at("s3", tmp_path, request)
    bucket = where.path.split("/")[2]
    topic = topic_factory("reqs")
    produce_sample_events(kafka_bootstrap, topic, 100, 2)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=50,
        # the commit's own requests: no inline services run in the middle of a recorded run
        table__services__inline__every__commits=0,
        **where.overrides,
    )
    run_ingestion(cfg, spark)  # creates the table; not recorded
    figures = []
    for run in range(2):
        produce_sample_events(
            kafka_bootstrap, topic, 300, 2, first_event_id=100 + 300 * run, create=False
        )
        before = len(HudiTable.open(cfg.table_storage).timeline().completed())
        s3_server.start_recording()
        assert run_ingestion(cfg, spark).records == 300
        recorded = s3_server.stop_recording(bucket)
        commits = len(HudiTable.open(cfg.table_storage).timeline().completed()) - before
        assert commits >= 6
        figures.append({"commits": commits, **_per_commit(recorded, commits)})
    print("requests per commit:", json.dumps(figures))  # the figures the docs quote
    first, second = figures
    assert second["LIST"] <= first["LIST"] * 1.25 + 1, figures
    assert audit_config(cfg).ok


def _table_show(cli: Callable[..., Any], uri: str, settings: dict[str, Any]) -> Any:
    env = {
        "LAKESINK_" + k.upper().replace(".", "_"): str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in settings.items()
    }
    return cli(["table", "show", uri], env=env, timeout_s=60)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("unreachable endpoint", "cannot reach the store"),
        ("missing bucket", "does not exist; create it first"),
        ("wrong credentials", "refused the credentials"),
    ],
)
def test_s3_store_fault_ends_in_one_line_without_the_secret(
    fault: str,
    expected: str,
    s3_server: S3Server,
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    settings: dict[str, Any] = {
        **s3_server.storage_config(),
        "storage.s3.secret.access.key": "s3cr3t-never-shown",
        "storage.retry.max": 1,
        "storage.retry.timeout.s": 2,
    }
    uri = f"s3://{s3_server.new_bucket()}/t"
    if fault == "unreachable endpoint":
        from s3_server import free_port

        settings["storage.s3.endpoint"] = f"http://127.0.0.1:{free_port()}"
        run = _table_show(cli, uri, settings)
    elif fault == "missing bucket":
        run = _table_show(cli, uri.replace("/t", "-gone/t"), settings)
    else:
        with S3Server(tmp_path, authenticate=True) as strict:
            settings["storage.s3.endpoint"] = strict.endpoint_url
            run = _table_show(cli, "s3://lakesink-any/t", settings)
    lines = [ln for ln in run.stdout.splitlines() if ln.strip()]
    assert run.returncode == 3, run.stdout[-2000:]
    assert len(lines) == 1 and lines[0].startswith("lakesink: error:"), lines
    assert expected in lines[0] and "s3cr3t-never-shown" not in run.stdout


def test_store_that_ignores_conditional_creates_is_refused_at_start(s3_server: S3Server) -> None:
    """A client that drops If-None-Match stands in for a store without conditional writes."""
    from lakesink.storage import ObjectStoreStorage, StorageUnsupportedError, open_storage

    class NoConditionalCreate(ObjectStoreStorage):
        def create(self, key: str, data: bytes) -> str:
            self.write(key, data)
            return ""

    real = open_storage(f"s3://{s3_server.new_bucket()}/t", s3_server.storage_config())
    assert isinstance(real, ObjectStoreStorage)
    store = NoConditionalCreate(real.uri, real.options)
    with pytest.raises(StorageUnsupportedError, match="ignores If-None-Match"):
        store.probe()
