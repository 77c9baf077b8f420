"""Java Hudi (through s3a) and hudi-rs (through object_store) read lakesink tables from a real
S3 server over HTTP, and return exactly the rows lakesink's reader returns for the same table:
snapshot (metadata table on and off), Spark SQL, time travel to every instant, incremental
reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from integration.table_stores import table_at
from integration.test_hudi_rs_compat import build_table
from interop.compare import Query, Remote, check_tables, plan_reads
from interop.java_hudi import JavaHudi
from s3_server import S3Server

from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def upload_tree(client: Any, local: Path, bucket: str, prefix: str) -> int:
    """Copy every file under `local` to `s3://bucket/prefix/...`; the number of objects."""
    n = 0
    for f in sorted(local.rglob("*")):
        if f.is_file():
            client.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(local).as_posix()}")
            n += 1
    return n


def remote_readers(java_hudi: JavaHudi, server: S3Server, bucket: str, prefix: str) -> Remote:
    """Point Java Hudi's s3a and hudi-rs at `s3://bucket/prefix` on the test server."""
    java_hudi.configure_s3a(
        bucket,
        server.endpoint_url,
        server.access_key_id,
        server.secret_access_key,
        server.region,
    )
    options = {
        "aws_endpoint_url": server.endpoint_url,
        "aws_allow_http": "true",
        "aws_access_key_id": server.access_key_id,
        "aws_secret_access_key": server.secret_access_key,
        "aws_region": server.region,
    }
    return Remote(f"s3a://{bucket}/{prefix}", f"s3://{bucket}/{prefix}", options)


def _some(queries: list[Query], wanted: tuple[str, ...]) -> list[Query]:
    """The first query whose name starts with each of `wanted` (every s3a read costs seconds
    on the test server: HEADs, GETs and LISTs of the timeline and the file groups)."""
    out = [next(q for q in queries if q.name.startswith(w)) for w in wanted]
    assert len(out) == len(wanted)
    return out


def test_java_hudi_via_s3a_and_hudi_rs_via_s3_read_uploaded_tables_as_lakesink_reads_them(
    java_hudi: JavaHudi, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    remote = remote_readers(java_hudi, s3_server, s3_bucket, "lake")
    queries = []
    for version, wanted in [
        (8, ("snapshot", "as of", "incremental")),
        (6, ("snapshot",)),
    ]:
        local = tmp_path / f"trips_v{version}"
        build_table(local, version)  # commits, a rollback, clustering, an inflight instant
        prefix = f"lake/{local.name}"
        assert upload_tree(s3_server.client(), local, s3_bucket, prefix) > 10
        at = Remote(
            f"{remote.java_uri}/{local.name}",
            f"{remote.hudi_rs_uri}/{local.name}",
            remote.storage_options,
        )
        queries += _some(plan_reads(local, remote=at), wanted)
    problems = check_tables(java_hudi, queries)
    assert problems == [], "\n".join(problems)


def test_java_hudi_via_s3a_and_hudi_rs_read_a_table_lakesink_ingested_into_s3(
    java_hudi: JavaHudi,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    s3_server: S3Server,
) -> None:
    where = table_at("s3", tmp_path, request)
    topic = topic_factory("s3read")
    produce_sample_events(kafka_bootstrap, topic, 300, 3)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=100,
        **where.overrides,
    )
    assert run_ingestion(cfg, spark).records == 300
    report = audit_config(cfg)
    assert report.ok and report.rows_lakesink == report.kafka_records == 300, report.problems
    bucket, prefix = where.path.removeprefix("s3://").split("/", 1)
    remote = remote_readers(java_hudi, s3_server, bucket, prefix)
    queries = plan_reads(cfg.table_storage, remote=remote)
    queries = _some(queries, ("snapshot", "as of", "incremental"))
    problems = check_tables(java_hudi, queries)
    assert problems == [], "\n".join(problems)
