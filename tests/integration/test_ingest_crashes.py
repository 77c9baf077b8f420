"""The crash matrix: the driver is killed with SIGKILL at each step of the commit lifecycle
(its JVM and Python workers die with it); a restart must finish or roll back the inflight
instant, and the exactly-once audit (hudi-rs and lakesink's reader against Kafka) must pass.
On a local table and on S3 the steps run as one chain of restarts on one table, each restart
recovering the previous crash before it is killed at the next step."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, write_config_file
from integration.table_stores import table_at
from interop.compare import assert_java_hudi_agrees

from lakesink.faults import SYNC_CRASH_POINTS
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration

KILLED = -signal.SIGKILL
# (point, batches let through first) in chain order: a crash during the rollback of the
# instant the run before left, before any of it is undone, right after a crash that leaves one
CHAIN = [
    ("before-begin", "1"),
    ("after-begin", "1"),
    ("after-write", "1"),
    ("after-reconcile", "1"),
    ("during-rollback", "0"),
    ("after-publish", "1"),
]
assert {p for p, _ in CHAIN} == set(SYNC_CRASH_POINTS)
LEAVES_INFLIGHT = ("after-begin", "after-write", "after-reconcile", "during-rollback")


# Each store runs the steps as one chain of restarts on one table: N+1 driver starts prove
# what N kill-and-restart pairs would, and every restart also proves it recovers a crash at the
# previous step. Batches take the direct task path (spark/direct.py); the DataFrame path
# (transformations) is killed where a batch's files are written and not yet reconciled, and
# between and after its tables' commits, in test_crashes_between_tables.py.


@pytest.mark.parametrize("store", ["local", "s3"])
def test_driver_killed_at_each_commit_step_in_turn_each_restart_recovers_and_ends_exactly_once(
    store: str,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    """Run N commits one batch and is killed at step N in its second (the rollback run: in
    rolling back what the run before left); run N+1 must first finish or roll back what run N
    left (else it could not commit its own first batch and reach step N+1). After every kill a
    reader sees a consistent table; the last run, without a crash, lands the rest exactly
    once."""
    topic = topic_factory(f"{store}chain")
    records = 1500  # 15 batches of 100: two per killed run, the rest for the last run
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=100,
        write__path="direct",
        **where.overrides,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    for point, after_batches in CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        inflight = HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
        assert bool(inflight) == (point in LEAVES_INFLIGHT), (point, inflight)
        # A reader sees a consistent table before recovery.
        report = audit_config(cfg)
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink < records, point
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    restarted = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records
    assert not HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
    if store == "local":  # rolled-back and replayed instants, read by Java Hudi too
        assert_java_hudi_agrees(request.getfixturevalue("java_hudi"), cfg["table.path"])


def test_broker_restart_between_runs_loses_nothing(
    fresh_broker: Any, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "restart", 500, 2)
    cfg = ingest_config(bootstrap, "restart", tmp_path / "t")
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    assert (
        cli(
            args, env={"LAKESINK_CRASH_AT": "after-write", "LAKESINK_CRASH_AFTER_BATCHES": "0"}
        ).returncode
        == KILLED
    )
    fresh_broker.restart()
    produce_sample_events(bootstrap, "restart", 100, 2, first_event_id=500, create=False)
    run = cli(args)
    assert run.returncode == 0, run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600


def test_replayed_batch_beyond_a_log_end_that_moved_back_fails_in_one_line_or_is_cut_and_recorded(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    """A batch planned, then the broker lost its last acknowledged records (its log end moved
    back; simulated by the batch's planned end moved past the log end in Spark's offset log):
    the restart stops in one line naming the partition, both ends and kafka.fail.on.data.loss;
    with it false the batch ends at the log end, the loss is in the commit and in status, and
    records the broker takes at those offsets later are ingested, not passed over."""
    import json

    from lakesink.formats.hudi.audit import completed_commits
    from lakesink.formats.hudi.writer_state import LOST_KEY

    topic = topic_factory("logend")
    produce_sample_events(kafka_bootstrap, topic, 300, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=100)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    crashed = cli(
        args, env={"LAKESINK_CRASH_AT": "after-begin", "LAKESINK_CRASH_AFTER_BATCHES": "1"}
    )
    assert crashed.returncode == KILLED, crashed.stdout[-3000:]
    planned = cfg.checkpoint_location / "offsets" / "1"
    lines = planned.read_text().splitlines()
    offset = json.loads(lines[2])
    assert offset["ranges"] == {f"{topic}:0": [100, 200]}
    offset["ranges"][f"{topic}:0"] = [100, 304]  # planned when the log held 304 records
    planned.write_text("\n".join([*lines[:2], json.dumps(offset)]) + "\n")
    (planned.parent / ".1.crc").unlink()

    refused = cli(args)
    assert refused.returncode == 5, refused.stdout[-3000:]
    error = [ln for ln in refused.stdout.splitlines() if ln.startswith("lakesink: error:")]
    assert len(error) == 1 and "Traceback" not in refused.stdout, refused.stdout[-3000:]
    assert f"{topic}:0 was planned to end at 304 but the log ends at 300" in error[0]
    assert "kafka.fail.on.data.loss=false" in error[0]

    cut = cli([*args, "--set", "kafka.fail.on.data.loss=false"])
    assert cut.returncode == 0, cut.stdout[-3000:]
    commits = completed_commits(HudiTable.open(cfg.table_storage))
    lost = [json.loads(m.extra[LOST_KEY]) for _, m in commits if LOST_KEY in m.extra]
    assert lost == [[[f"{topic}:0", 300, 304]]]
    status = cli(["status", "--config", str(conf), "--json"])
    assert json.loads(status.stdout)["lost"][0]["records"] == 4, status.stdout[-3000:]
    # the broker takes new records at the offsets it lost: they are read, not passed over
    produce_sample_events(kafka_bootstrap, topic, 10, 1, first_event_id=300, create=False)
    assert cli(args).returncode == 0
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == 310
