"""`transform.arrow` end to end (shared broker and Spark session): a function that filters
records and derives columns, applied on the direct task path, lands every kept Kafka record
exactly once with the values of a plain Python reference, across a replayed batch, into Hudi
and Iceberg tables; the DataFrame path (`mapInArrow`) writes the same rows; a function failing
on real records publishes nothing and a rerun then lands every record once; a task attempt
that fails after writing leaves only its retry's files committed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from arrow_functions import KEEP_ALL, PAID_IN_CENTS, REFUSE_PURCHASES, paid_in_cents_reference
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.errors import RecordError
from lakesink.kafka.client import watermarks
from lakesink.kafka.deserializers import make_deserializer
from lakesink.kafka.producer import produce_sample_events
from lakesink.kafka.reader import read_range
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.spark.direct import uses_direct_path

pytestmark = pytest.mark.integration

FUNCTIONS = Path(__file__).with_name("arrow_functions.py")
Coordinate = tuple[str, int, int]
VALUES = ("event_id", "user_id", "event_type", "cents", "kind", "dt")
# a run's first batch starts Python workers that import pyiceberg: slow on a loaded machine
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def shipped(spark: Any) -> Any:
    """The session, with the functions' module shipped to its Python workers."""
    spark.sparkContext.addPyFile(str(FUNCTIONS))
    return spark


def _config(
    bootstrap: str,
    topic: str,
    table: Path,
    table_format: str,
    function: str = PAID_IN_CENTS,
    **overrides: Any,
) -> LakesinkConfig:
    iceberg = {"table__format": "iceberg"}
    return ingest_config(
        bootstrap,
        topic,
        table,
        table__name="events",  # one name on both paths: the Hudi schema's record name
        transform__arrow=function,
        table__partition__by="kind",  # a column the function derives
        table__partition__date__from="ts",  # `dt` after the function, as on the DataFrame path
        **(iceberg if table_format == "iceberg" else {}),
        **overrides,
    )


def _expected(bootstrap: str, topic: str, partitions: int) -> dict[Coordinate, dict[str, Any]]:
    """The reference over every record Kafka holds in the topic now, by coordinates."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[Coordinate, dict[str, Any]] = {}
    for tp, (low, high) in watermarks(bootstrap, tps).items():
        for batch in read_range(
            bootstrap, OffsetRange(tp, low, high), deserializer=make_deserializer("raw")
        ):
            rows = batch.to_pydict()
            for offset, value in zip(rows["kafka_offset"], rows["value"], strict=True):
                event = json.loads(value)
                kept = paid_in_cents_reference(event)
                if kept is not None:
                    out[(tp.topic, tp.partition, int(offset))] = {**kept, "dt": event["ts"][:10]}
    return out


def _table(cfg: LakesinkConfig) -> pa.Table:
    """The table's rows (hudi-rs for Hudi, pyiceberg for Iceberg), by Kafka coordinates."""
    if cfg["table.format"] == "iceberg":
        from lakesink.formats.iceberg.format import open_iceberg_table

        table = open_iceberg_table(cfg.settings, create=False).pyiceberg.scan().to_arrow()
    else:
        import hudi

        batches = hudi.HudiTableBuilder.from_base_uri(cfg["table.path"]).build().read()
        table = pa.Table.from_batches(batches)
    data = [c for c in table.column_names if not c.startswith("_hoodie_")]
    order = [(c, "ascending") for c in ("kafka_topic", "kafka_partition", "kafka_offset")]
    return table.select(data).sort_by(order)


def _by_coordinate(table: pa.Table) -> dict[Coordinate, dict[str, Any]]:
    rows = table.to_pylist()
    got = {(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]): r for r in rows}
    assert len(got) == len(rows), "a Kafka record is in the table twice"
    return {at: {k: r[k] for k in VALUES} for at, r in got.items()}


def _committed(cfg: LakesinkConfig) -> dict[str, int]:
    if cfg["table.format"] == "iceberg":
        from lakesink.formats.iceberg.format import committed_offsets_of

        return dict(committed_offsets_of(cfg.settings).to_json())
    from lakesink.formats.hudi.writer_state import committed_offsets_at

    return dict(committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json())


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return {tp.key(): high for tp, (_low, high) in watermarks(bootstrap, tps).items()}


def _replay_last_batch(cfg: LakesinkConfig) -> None:
    """Spark forgets that its last batch committed (commits/N lost): the next run replays it."""
    commits = sorted(
        (cfg.checkpoint_location / "commits").glob("[0-9]*"), key=lambda p: int(p.name)
    )
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("table_format", ["hudi", "iceberg"])
def test_arrow_transform_lands_the_reference_rows_once_on_the_direct_path_as_on_the_dataframe(
    shipped: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    table_format: str,
) -> None:
    topic = topic_factory(f"arrow-{table_format}")
    produce_sample_events(kafka_bootstrap, topic, 240, 3)
    direct = _config(kafka_bootstrap, topic, tmp_path / "direct", table_format)
    assert uses_direct_path(direct)
    first = run_ingestion(direct, shipped, RUN_TIMEOUT_S)
    _replay_last_batch(direct)  # the next run replays it, then reads the new records
    produce_sample_events(kafka_bootstrap, topic, 60, 3, first_event_id=240, create=False)
    second = run_ingestion(direct, shipped, RUN_TIMEOUT_S)

    expected = _expected(kafka_bootstrap, topic, 3)
    assert 0 < len(expected) < 300  # the function filtered some records out
    got = _by_coordinate(_table(direct))
    assert got == expected
    assert first.records + second.records == len(expected)  # the replay added nothing
    # the filtered records are consumed too: the writer's offsets reach the high watermarks
    assert _committed(direct) == _high_watermarks(kafka_bootstrap, topic, 3)
    # the audit applies the function to Kafka: the filtered records are accounted for
    report = audit_config(direct)
    assert report.ok, report.problems
    assert (report.kafka_records, report.filtered) == (300, 300 - len(expected))
    # the same table audited against a function that keeps every record misses the filtered ones
    wrong = audit_config(direct.with_overrides({"transform.arrow": KEEP_ALL}))
    assert wrong.filtered == 0
    assert f"{300 - len(expected)} Kafka records of committed ranges are not in the table" in (
        " ".join(wrong.problems)
    )

    frame = _config(
        kafka_bootstrap, topic, tmp_path / "frame", table_format, write__path="dataframe"
    )
    assert run_ingestion(frame, shipped, RUN_TIMEOUT_S).records == len(expected)
    a, b = _table(direct), _table(frame)
    assert "payload" not in a.column_names and {"cents", "kind", "dt"} <= set(a.column_names)
    assert a.schema == b.schema
    assert a.to_pylist() == b.to_pylist()
    if table_format == "hudi":  # the same files' schema and commit schema on both paths
        from lakesink.formats.hudi.table.hudi_table import HudiTable

        files = [next(Path(c["table.path"]).rglob("*.parquet")) for c in (direct, frame)]
        assert pq.read_schema(files[0]) == pq.read_schema(files[1])
        schemas = [
            HudiTable.open(c["table.path"]).timeline().latest_schema() for c in (direct, frame)
        ]
        assert schemas[0] == schemas[1]
    else:
        from lakesink.formats.iceberg.format import open_iceberg_table

        schemas = [
            open_iceberg_table(c.settings, create=False).pyiceberg.schema() for c in (direct, frame)
        ]
        assert schemas[0] == schemas[1]


def test_a_function_failing_on_records_publishes_nothing_and_a_rerun_lands_each_once(
    shipped: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("arrow-refused")
    produce_sample_events(kafka_bootstrap, topic, 40, 1)
    cfg = _config(kafka_bootstrap, topic, tmp_path / "t", "hudi", REFUSE_PURCHASES)
    with pytest.raises(RecordError, match=r"refuse_purchases' failed on .* purchases are not"):
        run_ingestion(cfg, shipped, RUN_TIMEOUT_S)
    assert _committed(cfg) == {}
    assert not list(Path(cfg["table.path"]).rglob("*.parquet"))  # the failed write's files
    fixed = cfg.with_overrides({"transform.arrow": PAID_IN_CENTS})
    run_ingestion(fixed, shipped, RUN_TIMEOUT_S)
    assert _by_coordinate(_table(fixed)) == _expected(kafka_bootstrap, topic, 1)
    assert _committed(fixed) == _high_watermarks(kafka_bootstrap, topic, 1)


def test_a_direct_task_failing_once_after_writing_commits_only_its_retry(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("arrow-retry")
    produce_sample_events(kafka_bootstrap, topic, 90, 3)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        "hudi",
        write__path="direct",
        spark__master="local[2,2]",
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    path = os.pathsep.join(p for p in (str(FUNCTIONS.parent), os.environ.get("PYTHONPATH")) if p)
    run = cli(
        ["ingest", "--config", str(conf), "--once"],
        env={"LAKESINK_FAIL_TASK_ATTEMPTS": "1", "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert _by_coordinate(_table(cfg)) == _expected(kafka_bootstrap, topic, 3)
    assert _committed(cfg) == _high_watermarks(kafka_bootstrap, topic, 3)
    # the failed first attempts' files were deleted before publishing: only retries' remain
    tokens = {p.name.split("_")[1] for p in Path(cfg["table.path"]).rglob("*.parquet")}
    assert tokens and all(t.endswith("-1") for t in tokens), tokens
