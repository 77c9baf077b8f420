"""The `lakesink` command as a user runs it: the demo, status, verify (and its failure exit code),
table inspection, config errors without tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.formats.hudi.audit import COORDINATES, read_with_hudi_rs
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def test_status_verify_and_table_commands_after_an_async_ingestion(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("cli")
    produce_sample_events(kafka_bootstrap, topic, 200, 2)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        commit__mode="async",
        kafka__max__records__per__batch=50,
    )
    run_ingestion(cfg, spark)
    produce_sample_events(kafka_bootstrap, topic, 10, 2, first_event_id=200, create=False)
    conf = str(write_config_file(cfg, tmp_path / "c.toml"))

    status = cli(["status", "--config", conf, "--json"])
    assert status.returncode == 0, status.stdout
    st = json.loads(status.stdout[status.stdout.index("{") :])
    assert sum(p["lag"] for p in st["partitions"]) == 10
    assert st["pending"]["pending_epochs"] == []

    verify = cli(["verify", "--config", conf])
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout

    timeline = cli(["table", "timeline", cfg["table.path"], "--json"])
    assert timeline.returncode == 0
    rows = json.loads(timeline.stdout[timeline.stdout.index("[") :])
    assert sum(int(r["records"] or 0) for r in rows) == 200

    # archival from the command line: status shows it, verify reads the archived commits
    archived = cli(
        ["table", "archive", cfg["table.path"], "--min-instants", "1", "--max-instants", "1"]
    )
    assert archived.returncode == 0 and "archive: moved" in archived.stdout, archived.stdout
    status = cli(["status", "--config", conf, "--json"])
    st = json.loads(status.stdout[status.stdout.index("{") :])
    assert st["table"]["archived_up_to"] is not None
    assert st["table"]["active_instants"] < len(rows)
    verify = cli(["verify", "--config", conf])
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout

    # Damage the table behind lakesink's back: verify must fail and say where.
    victim = next(Path(cfg["table.path"]).rglob("*.parquet"))
    victim.unlink()
    broken = cli(["verify", "--config", conf])
    assert broken.returncode != 0
    assert str(victim.name) in broken.stdout or "missing" in broken.stdout, broken.stdout


def test_bad_config_value_is_one_clear_line(tmp_path: Path, cli: Callable[..., Any]) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(
        '"kafka.bootstrap.servers" = "x:1"\n"kafka.topics" = "t"\n'
        '"value.schema" = "id BIGINT"\n"table.path" = "/tmp/x"\n"commit.mode" = "later"\n'
    )
    run = cli(["ingest", "--config", str(conf)])
    assert run.returncode == 2
    assert "commit.mode='later' is not valid" in run.stdout
    assert "Traceback" not in run.stdout


def test_demo_ingests_its_sample_events_exactly_once(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    # the README's first command on embedded defaults: its own broker, sample events, Spark
    # ingestion into a Hudi table, the audit's verdict
    run = cli(["demo", "--events", "3000", "--dir", str(tmp_path / "lake")])
    assert run.returncode == 0, run.stdout[-3000:]
    assert "hudi-rs reads 3,000 rows" in run.stdout and "PASS" in run.stdout, run.stdout[-3000:]
    rows = read_with_hudi_rs(str(tmp_path / "lake" / "demo_events"))
    assert rows.num_rows == 3000
    assert len(set(zip(*(rows.column(c).to_pylist() for c in COORDINATES), strict=True))) == 3000


@pytest.mark.parametrize("fmt", ["hudi", "iceberg"])
def test_demo_cdc_lands_the_change_stream_as_one_row_per_key(
    fmt: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    # `lakesink demo --cdc`: a Debezium-shaped change stream of accounts (creates, updates,
    # deletes, tombstones) folded into a table of keys, the fold audit's verdict
    args = ["demo", "--cdc", "--changes", "300", "--dir", str(tmp_path / "lake")]
    run = cli([*args, "--format", fmt], timeout_s=480)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "accounts that differ: 0" in run.stdout, run.stdout[-3000:]
    verdict = "PASS: " if fmt == "hudi" else "PASS (pyiceberg, duckdb, spark): "
    assert verdict + "the table equals the fold of the committed records by key" in run.stdout


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if "error" in ln.lower()]


def _assert_one_quiet_line(run: Any, code: int, *expected: str) -> None:
    """The command failed with the class's exit code and said why in one line: no traceback,
    no Java frames, no librdkafka log lines."""
    assert run.returncode == code, run.stdout[-3000:]
    errors = _error_lines(run.stdout)
    assert len(errors) == 1 and errors[0].startswith("lakesink: error: "), run.stdout[-3000:]
    for text in expected:
        assert text in errors[0], errors[0]
    for noise in ("Traceback", "\tat ", "rdkafka", "FAIL|", "Py4JJavaError"):
        assert noise not in run.stdout, run.stdout[-3000:]


def _ingest_args(bootstrap: str, topic: str, table: Path, *sets: str) -> list[str]:
    args = [
        "ingest",
        "--once",
        "--set",
        f"kafka.bootstrap.servers={bootstrap}",
        "--set",
        f"kafka.topics={topic}",
        "--set",
        "value.schema=event_id BIGINT, amount DOUBLE",
        "--set",
        f"table.path={table}",
    ]
    for item in sets:
        args += ["--set", item]
    return args


@pytest.mark.parametrize(
    ("setting", "valid"),
    [
        ("kafka.max.records.per.batch=2.5", "positive whole number"),
        ("table.version=8.5", "6 or 8"),
    ],
)
def test_non_integral_value_for_an_integer_key_is_refused_before_anything_is_written(
    setting: str, valid: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    table = tmp_path / "t"
    key, _, value = setting.partition("=")
    run = cli(_ingest_args("127.0.0.1:1", "t", table, setting), timeout_s=60)
    _assert_one_quiet_line(run, 2, f"{key}={value!r} is not valid", valid)
    assert not table.exists()


def test_refused_bootstrap_servers_end_in_one_line_before_anything_is_written(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    from lakesink.kafka.embedded_broker import free_port

    table = tmp_path / "t"
    bootstrap = f"127.0.0.1:{free_port()}"
    run = cli(_ingest_args(bootstrap, "events", table), timeout_s=60)
    _assert_one_quiet_line(run, 7, bootstrap, "kafka.bootstrap.servers")
    assert len(run.stdout.strip().splitlines()) == 1, run.stdout
    assert not table.exists()


def test_missing_topic_is_named_before_anything_is_written(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    table = tmp_path / "t"
    topic = topic_factory("absent")
    run = cli(_ingest_args(kafka_bootstrap, topic, table), timeout_s=60)
    _assert_one_quiet_line(run, 7, topic, "do not exist")
    assert not table.exists()


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FORM source", "PARSE_SYNTAX_ERROR"),
        ("SELECT *, amount_cents * 2 AS c FROM source", "amount_cents"),
    ],
    ids=["syntax", "unknown-column"],
)
def test_transform_sql_mistake_is_found_at_start_before_anything_is_written(
    sql: str,
    expected: str,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("badsql")
    produce_sample_events(kafka_bootstrap, topic, 5, 1)
    table = tmp_path / "t"
    run = cli(_ingest_args(kafka_bootstrap, topic, table, f"transform.sql={sql}"))
    _assert_one_quiet_line(run, 2, "transform.sql", expected)
    assert not table.exists()


def test_ingest_once_with_nothing_new_exits_zero_and_says_so(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("nothingnew")
    produce_sample_events(kafka_bootstrap, topic, 5, 1)
    table = tmp_path / "t"
    run = cli(_ingest_args(kafka_bootstrap, topic, table, "kafka.starting.offsets=latest"))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "nothing new to ingest" in run.stdout, run.stdout[-3000:]


def test_required_column_with_a_bad_record_fails_in_one_line_then_dead_letters_it_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.reader import TableReader
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.producer import produce_values

    topic = topic_factory("required")
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topic, [b'{"id":1}', b"garbage"])
    table, dead = tmp_path / "t", tmp_path / "dead"
    args = _ingest_args(kafka_bootstrap, topic, table, "value.schema=id BIGINT NOT NULL")

    refused = cli(args)
    _assert_one_quiet_line(refused, 8, topic, "offset 1")

    run = cli([*args, "--set", "errors.tolerance=all", "--set", f"errors.deadletter.table={dead}"])
    assert run.returncode == 0, run.stdout[-3000:]
    main = TableReader(HudiTable.open(table)).snapshot(columns=["kafka_offset", "id"])
    assert main.to_pylist() == [{"kafka_offset": 0, "id": 1}]
    letters = TableReader(HudiTable.open(dead)).snapshot(columns=["kafka_offset", "kafka_value"])
    assert letters.to_pylist() == [{"kafka_offset": 1, "kafka_value": b"garbage"}]


def test_ctrl_c_stops_a_streaming_ingest_after_its_batch_in_one_line_like_sigterm(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    """Ctrl-C in a terminal reaches the whole foreground process group (the driver, Spark's
    JVM and Python workers): the ingestion stops after the batch in flight, with no traceback,
    and exits 0 as after SIGTERM; everything it committed is exactly once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from integration.conftest import SHORT_LIVED_DRIVER_JVM, audit_config

    topic = topic_factory("ctrlc")
    produce_sample_events(kafka_bootstrap, topic, 300, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", trigger__interval__s=1)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    log = tmp_path / "ingest.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SHORT_LIVED_DRIVER_JVM},
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    try:
        deadline = time.monotonic() + 120
        while b"batch 0: instant" not in log.read_bytes() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "stopping after the batch in flight" in text, text[-3000:]
    assert "Traceback" not in text and "py4j" not in text.lower(), text[-3000:]
    report = audit_config(cfg)
    assert report.ok and report.rows_hudi_rs == 300, report.problems


def test_broker_command_serves_a_topic_of_sample_events_until_ctrl_c(tmp_path: Path) -> None:
    """`lakesink broker` as a user runs it in a terminal: the embedded broker with a topic of
    sample events; Ctrl-C (to the process group) stops it in one line, exit 0."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from lakesink.kafka.client import watermarks
    from lakesink.kafka.embedded_broker import free_port
    from lakesink.protocol.offsets import TopicPartition

    port = free_port()
    log = tmp_path / "broker.log"
    args = ["broker", "--port", str(port), "--topic", "t", "--partitions", "2", "--events", "30"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lakesink.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while b"Ctrl-C stops it" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        bootstrap = f"127.0.0.1:{port}"
        assert bootstrap in log.read_text()
        marks = watermarks(bootstrap, [TopicPartition("t", p) for p in (0, 1)])
        assert sum(high - low for low, high in marks.values()) == 30
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert code == 0 and text.rstrip().endswith("lakesink broker: stopped"), text
    assert "Traceback" not in text, text
