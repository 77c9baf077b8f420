"""One ingestion writing many tables (`tables.<name>.*`, lakesink.spark.routing): three topics
routed to five tables of both formats — by topic, by a field's regex, dynamically by a field
naming the table, and the default for what no route takes — read from Kafka once per batch,
each table committing its own offsets. The tables that take the rows as they are share one Spark
job (the fan-out writer); one with a transformation of its own gets its own job.

The driver is killed (SIGKILL) at each point around the tables' commits (before any, between
the first and the others, after all before Spark records the batch) and once more at a random
moment of a continuous ingestion; the last restart runs without Spark's checkpoint, so the
source starts at the lowest offsets committed over the tables and the tables ahead skip what
they have. Each table is read back by readers lakesink did not write (hudi-rs and Java Hudi for
Hudi, pyiceberg for Iceberg): every record in exactly the tables its route names, once."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.conftest import SHORT_LIVED_DRIVER_JVM, run_ingestion, write_config_file
from rich.console import Console

from lakesink.cli.watch import render_tables
from lakesink.config import LakesinkConfig, build_config
from lakesink.errors import LakesinkError
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.kafka.producer import produce_values
from lakesink.metrics import value_of
from lakesink.spark.direct import uses_direct_path
from lakesink.spark.pipeline import Ingestion
from lakesink.spark.table_offsets import all_table_configs

pytestmark = pytest.mark.integration

PER_TOPIC = 120
Topics = tuple[str, ...]
REGIONS = ("eu-west", "us-east", "eu-north", "ap-south")
# the tenant naming a dynamic table: acme and globex are created on their first record; a
# name route.dynamic.allow refuses, or none, is taken by no dynamic table
TENANTS = ("acme", "globex", "not/allowed", None, None)


def _value(i: int, topic: str) -> bytes:
    return json.dumps(
        {"id": i, "region": REGIONS[i % 4], "source": topic, "tenant": TENANTS[i % 5]}
    ).encode()


def _config(
    bootstrap: str, topics: Topics, folder: Path, dynamic: str = "hudi", **more: Any
) -> LakesinkConfig:
    """`dynamic`: the format of the dynamic tables (the top-level table.format); Iceberg ones
    are made in the europe table's warehouse and catalog."""
    template = folder / ("warehouse" if dynamic == "iceberg" else "tenants") / "{table}"
    return build_config(
        {
            "kafka.bootstrap.servers": bootstrap,
            "table.format": dynamic,
            "kafka.topics": ",".join(topics),
            "value.format": "json",
            "value.schema": "id BIGINT, region STRING, source STRING, tenant STRING",
            "kafka.max.records.per.batch": 100,
            "writer.id": "routing",
            "heartbeat.interval.s": 1,
            "heartbeat.tolerance.s": 10,
            "lock.lease.s": 10,
            # every record of the orders topic
            "tables.orders.table.path": str(folder / "orders"),
            "tables.orders.table.format": "hudi",
            "tables.orders.route.topics": topics[0],
            # the European records of both topics, in an Iceberg table
            "tables.europe.table.path": str(folder / "warehouse"),
            "tables.europe.table.format": "iceberg",
            "tables.europe.table.name": "europe",
            "tables.europe.route.field": "region",
            "tables.europe.route.regex": "eu-.*",
            # a transformation of its own: its rows written by a Spark job of their own (the
            # other tables' by one fan-out job)
            "tables.europe.transform.sql": "SELECT *, upper(region) AS area FROM source",
            # a table per tenant, created on its first record
            "route.dynamic.field": "tenant",
            "route.dynamic.path": str(template),
            # what no route takes: payments and refunds outside Europe without a tenant
            "tables.rest.table.path": str(folder / "rest"),
            "tables.rest.table.format": "hudi",
            "route.default": "rest",
            **more,
        }
    )


def _expected(topics: Topics) -> dict[str, list[tuple[str, int]]]:
    want: dict[str, list[tuple[str, int]]] = {
        "acme": [],
        "europe": [],
        "globex": [],
        "orders": [],
        "rest": [],
    }
    for topic in topics:
        for i in range(PER_TOPIC):
            takers = [
                *(["orders"] if topic == topics[0] else []),
                *(["europe"] if REGIONS[i % 4].startswith("eu-") else []),
                *([t] if (t := TENANTS[i % 5]) in ("acme", "globex") else []),
            ]
            for name in takers or ["rest"]:
                want[name].append((topic, i))
    return {name: sorted(rows) for name, rows in want.items()}


def _read(cfg: LakesinkConfig) -> dict[str, list[tuple[str, int]]]:
    """Each table's (source topic, id) rows, by readers lakesink did not write."""
    from lakesink.formats.iceberg.format import open_iceberg_table
    from lakesink.spark.table_offsets import all_table_configs

    out = {}
    for spec, table in all_table_configs(cfg):
        if table["table.format"] == "iceberg":
            rows = open_iceberg_table(table.settings, create=False).pyiceberg.scan().to_arrow()
        else:
            batches = hudi_rs_batches(str(table["table.path"]))
            if not batches:  # a table with no commit yet
                out[spec.name] = []
                continue
            rows = pa.Table.from_batches(batches)
        out[spec.name] = sorted(
            zip(rows["source"].to_pylist(), rows["id"].to_pylist(), strict=True)
        )
    return out


@pytest.fixture
def topics(kafka_bootstrap: str, topic_factory: Callable[[str], str]) -> Topics:
    """orders, payments, refunds: one partition each."""
    made = tuple(topic_factory(f"route-{t}") for t in ("orders", "payments", "refunds"))
    for topic in made:
        produce_values(kafka_bootstrap, topic, [_value(i, topic) for i in range(PER_TOPIC)])
    return made


def test_a_record_no_route_takes_fails_the_batch_without_a_default(
    kafka_bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    spark: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = _config(kafka_bootstrap, topics, tmp_path)
    values = {k: v for k, v in cfg.values.items() if k != "route.default"}
    tables = {n: t for n, t in cfg["tables"].items() if n != "rest"}
    strict = build_config({**values, "tables": tables})
    caplog.set_level("INFO", logger="lakesink.spark.routing")
    with pytest.raises(LakesinkError, match=r"matches no table's route; set route.default"):
        run_ingestion(strict, spark)
    # dynamic tables: the batches take the DataFrame path, and the ingestion says why
    assert not uses_direct_path(strict)
    assert any(
        "take the DataFrame path: route.dynamic.field" in r.getMessage() for r in caplog.records
    )
    from lakesink.spark.table_offsets import all_table_configs, committed_offsets_of

    # the dynamic Hudi tables the batch named were created before it failed, and are found
    # again as a restart finds them (the folders holding a Hudi table)
    tables = all_table_configs(strict)
    assert [spec.name for spec, _ in tables] == ["europe", "orders", "acme", "globex"]
    for spec, table in tables:  # nothing of the failed batch committed
        assert committed_offsets_of(table).to_json() == {}, spec.name


def test_killed_around_the_tables_commits_and_at_random_each_table_takes_its_records_once(
    kafka_bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    spark: Any,
    cli: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    # the dynamic tables in Iceberg, beside the europe table (the named ones in Hudi: both
    # formats' dynamic tables are covered, Hudi's by the test above)
    cfg = _config(
        kafka_bootstrap, topics, tmp_path, dynamic="iceberg", **{"kafka.max.records.per.batch": 50}
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    want = _expected(topics)

    def behind_but_never_twice(after: str) -> dict[str, list[tuple[str, int]]]:
        tables = _read(cfg)
        for name, rows in tables.items():  # a part of each table's records, none twice
            assert len(set(rows)) == len(rows) and set(rows) <= set(want[name]), (after, name)
        return tables

    # each killed run resumes from Spark's checkpoint and dies in its second batch (the first
    # may be the replay of the batch the last kill cut short)
    for point in ("before-table-commits", "between-table-commits", "after-table-commits"):
        killed = cli(
            ["ingest", "--config", str(conf), "--once"],
            env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"},
        )
        assert killed.returncode == -signal.SIGKILL, (point, killed.stdout[-3000:])
        behind_but_never_twice(point)
        if point == "between-table-commits":
            # the first table by name (acme) committed the batch, no other table began to
            tables = all_table_configs(cfg)
            at = {s.name: json.dumps(_committed(t), sort_keys=True) for s, t in tables}
            others = {p for n, p in at.items() if n != "acme"}
            assert len(others) == 1 and at["acme"] not in others, at
    # a continuous ingestion killed at a random moment (the seed is in the test's report)
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(4.0, 14.0)
    _kill_at_random(conf, delay)
    behind = behind_but_never_twice(f"the kill {delay:.1f}s after the start (seed {seed})")
    ahead = {spec.name: _committed(table) for spec, table in all_table_configs(cfg)}
    assert sorted(ahead) == sorted(want)  # the dynamic Iceberg tables found in the catalog
    # Spark's checkpoint lost: the source starts at the lowest offsets over the tables, and
    # the tables ahead skip what they have
    shutil.rmtree(cfg.checkpoint_location)
    ingestion = Ingestion(cfg, spark)
    result = ingestion.run(once=True, timeout_s=120)
    assert _read(cfg) == want
    # the metrics per table: the rows each table took in this run, a commit in each table
    # that was behind
    end = {f"{topic}:0": PER_TOPIC for topic in topics}
    snap = ingestion.metrics.snapshot()
    for name, rows in want.items():
        taken = value_of(snap, "lakesink_records_ingested_total", table=name)
        assert taken == len(rows) - len(behind[name]), name
        commits = value_of(snap, "lakesink_commit_duration_seconds_count", table=name)
        assert (commits > 0) == (ahead[name] != end), (name, commits, ahead[name])
    # every table committed every offset of the writer: the lowest over them is the end
    assert result.committed == end
    again = run_ingestion(cfg, spark)
    assert again.nothing_new and _read(cfg) == want
    # lakesink verify: each table holds the records its route takes, every one once
    from lakesink.cli.verify import audit_tables

    audits = dict(audit_tables(cfg))
    assert list(audits) == ["europe", "orders", "rest", "acme", "globex"]
    for name, report in audits.items():
        assert report.ok, (name, report.problems)
    # Java Hudi reads the Hudi tables as hudi-rs and lakesink's reader do
    from interop.compare import check_tables, plan_reads

    hudi_tables = [t["table.path"] for _, t in cfg.table_configs() if t["table.format"] == "hudi"]
    queries = [q for p in hudi_tables for q in plan_reads(Path(p), incremental_pairs=False)]
    assert check_tables(request.getfixturevalue("java_hudi"), queries) == []
    # the audit checks the route: the rest table against the orders route fails
    from lakesink.cli.verify import audit_config
    from lakesink.spark.routing import routed_coordinates

    rest = dict((spec.name, table) for spec, table in cfg.table_configs())["rest"]
    wrong = audit_config(rest, route=lambda ranges: routed_coordinates(cfg, "orders", ranges))
    assert not wrong.ok
    # lakesink status: each table's committed offsets, all at the end of both topics
    from lakesink.cli.status import run_status

    capsys.readouterr()
    assert run_status(cfg, as_json=True) == 0
    statuses = json.loads(capsys.readouterr().out)
    assert sorted(statuses) == ["acme", "europe", "globex", "orders", "rest"]
    for name, st in statuses.items():
        assert {p["committed"] for p in st["partitions"]} == {PER_TOPIC}, name
        # its metrics: its own table's samples
        lag = st["metrics"]["lakesink_partition_committed_offset"]
        assert {(s["labels"]["table"], s["value"]) for s in lag} == {(name, PER_TOPIC)}, name
    # status --watch: a row per table (table, format, lag, rates, last commit, state)
    frame = io.StringIO()
    Console(file=frame, width=160, color_system=None).print(render_tables(statuses, {}, 1.0))
    for name in statuses:
        row = next(ln for ln in frame.getvalue().splitlines() if f" {name} " in ln)
        cells = row.replace("│", " ").split()
        fmt = "iceberg" if name in ("europe", "acme", "globex") else "hudi"
        assert cells[1:3] == [fmt, "0"] and cells[-2:] == ["ago", "ok"], row


def _kill_at_random(conf: Path, after_s: float) -> None:
    """`lakesink ingest` (continuous) SIGKILLed with its process group `after_s` seconds after
    it started: wherever its batches and commits are then."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(conf)],
        env={**os.environ, **SHORT_LIVED_DRIVER_JVM},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=after_s)
        assert proc.returncode is None, f"the ingestion ended by itself: {proc.returncode}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _committed(table: LakesinkConfig) -> dict[str, int]:
    from lakesink.spark.table_offsets import committed_offsets_of

    return committed_offsets_of(table).to_json()


def test_the_routes_spark_and_arrow_forms_take_the_same_rows(spark: Any) -> None:
    """What a batch writes (the Spark condition) and what `lakesink verify` expects (the Arrow
    mask) agree on the same rows: topics, patterns, value fields, keys, headers and nulls."""
    import random

    from lakesink.config.tables import Route
    from lakesink.kafka.dead_letters import HEADER_TYPE
    from lakesink.spark.routing import route_condition, route_mask

    rng = random.Random(7)
    words = ["eu-west", "EU-west", "us", "", "eu-", "xeu-west", None]
    rows = [
        {
            "kafka_topic": rng.choice(["orders", "payments", "orders2"]),
            "kafka_key": None if (k := rng.choice(words)) is None else k.encode(),
            "kafka_headers": rng.choice(
                [
                    None,
                    [],
                    [{"key": "region", "value": b"eu-1"}],
                    [{"key": "region", "value": None}],
                ]
            ),
            "region": rng.choice(words),
            "flag": rng.choice([True, False, None]),
            "n": rng.choice([1, 10, None]),
        }
        for _ in range(200)
    ]
    schema = pa.schema(
        [
            ("kafka_topic", pa.string()),
            ("kafka_key", pa.binary()),
            ("kafka_headers", HEADER_TYPE),
            ("region", pa.string()),
            ("flag", pa.bool_()),
            ("n", pa.int64()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema).append_column(
        "i", pa.array(range(len(rows)), pa.int64())
    )
    df = spark.createDataFrame(table)  # Arrow types kept (pandas would make n a float)
    routes = [
        Route(topics=("orders",)),
        Route(topic_pattern="orders.*"),
        Route(field="region", regex="eu-.*"),
        Route(topics=("payments",), field="kafka_key", regex="eu-.*|"),
        Route(field="header:region", regex="eu-\\d"),
        Route(field="flag", regex="true"),
        Route(field="n", regex="1\\d*"),
        Route(),
    ]
    for route in routes:
        by_spark = sorted(r["i"] for r in df.where(route_condition(route)).select("i").collect())
        by_arrow = table.filter(route_mask(table, route)).column("i").to_pylist()
        assert by_spark == sorted(by_arrow), route


def test_routed_tables_on_the_direct_path_each_take_their_rows_from_their_own_offset(
    kafka_bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    spark: Any,
    cli: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    topic_factory: Callable[[str], str],
) -> None:
    """Tables that append the rows as read (no dynamic table, no transformation of their own)
    take the direct path (spark/routing.py `RoutedDirectTask`): one job's tasks read each Kafka
    range once and write every table. A record no route takes fails the batch without a
    default or a dead-letter table, else is a dead letter beside the records that failed to
    decode; tables added later start at the first offsets while the others skip what they
    have (no checkpoint: the source starts at the lowest offsets over the tables), through
    SIGKILLs before, between and after the tables' commits."""
    from lakesink.spark.routing import UNTAKEN_REASON, RoutingError

    dead_path = tmp_path / "dead"
    base = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "table.format": "hudi",
        "kafka.topics": ",".join(topics),
        "value.format": "json",
        "value.schema": "id BIGINT, region STRING, source STRING, tenant STRING",
        "kafka.max.records.per.batch": 1000,
        "writer.id": "routing-direct",
        "tables.orders.table.path": str(tmp_path / "orders"),
        "tables.orders.route.topics": topics[0],
    }
    europe = {
        "tables.europe.table.path": str(tmp_path / "warehouse"),
        "tables.europe.table.format": "iceberg",
        "tables.europe.table.name": "europe",
        "tables.europe.route.field": "region",
        "tables.europe.route.regex": "eu-.*",
    }
    caplog.set_level("INFO", logger="lakesink.spark.routing")
    # no route.default and no dead-letter table: the tasks name the first record no route takes
    strict = build_config({**base, **europe})
    assert Ingestion(strict, spark).direct
    with pytest.raises(RoutingError, match=r"record .*:0@\d+ matches no table's route; set"):
        run_ingestion(strict, spark)
    assert all(_committed(t) == {} for _, t in all_table_configs(strict))
    # the orders table alone, with a dead-letter table: what it does not take is a dead
    # letter, as are the records that are not JSON
    produce_values(kafka_bootstrap, topics[1], [b'{"id": not json'] * 3)
    dead = {"errors.tolerance": "all", "errors.deadletter.table": str(dead_path)}
    run_ingestion(build_config({**base, **dead}), spark)
    # more records; europe and a default table added, the records not JSON to a topic: the
    # new tables start at the first offsets, the orders table after its own
    for topic in topics:
        produce_values(kafka_bootstrap, topic, [_value(i, topic) for i in range(PER_TOPIC, 240)])
    rest = {"tables.rest.table.path": str(tmp_path / "rest"), "route.default": "rest"}
    to_topic = {"errors.tolerance": "all", "errors.deadletter.topic": topic_factory("dlq")}
    small = {"kafka.max.records.per.batch": 150}  # 723 records: 5 batches at least
    later = build_config({**base, **europe, **rest, **to_topic, **small})
    assert Ingestion(later, spark).direct
    shutil.rmtree(later.checkpoint_location)

    def eu(i: int) -> bool:
        return REGIONS[i % 4].startswith("eu-")

    everything = [(topic, i) for topic in topics for i in range(240)]
    want = {
        "europe": sorted((t, i) for t, i in everything if eu(i)),
        "orders": sorted((t, i) for t, i in everything if t == topics[0]),
        "rest": sorted((t, i) for t, i in everything if t != topics[0] and not eu(i)),
    }
    # killed at each point around the tables' commits on the direct path: each run resumes
    # from the checkpoint, finishes the batch the last kill cut short and dies in its second
    conf = write_config_file(later, tmp_path / "later.toml")
    for point in ("before-table-commits", "between-table-commits", "after-table-commits"):
        killed = cli(
            ["ingest", "--config", str(conf), "--once"],
            env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"},
        )
        assert killed.returncode == -signal.SIGKILL, (point, killed.stdout[-3000:])
        for name, rows in _read(later).items():  # a part of each table's records, none twice
            assert len(set(rows)) == len(rows) and set(rows) <= set(want[name]), (point, name)
    run_ingestion(later, spark)
    assert not [r for r in caplog.records if "DataFrame path" in r.getMessage()]
    assert _read(later) == want
    # the dead letters of the second run: what the orders table did not take (offset = id),
    # and the three records not JSON after them, once each, with their reasons
    letters = pa.Table.from_batches(hudi_rs_batches(str(dead_path)))
    got = sorted(
        zip(
            letters["kafka_topic"].to_pylist(),
            letters["kafka_offset"].to_pylist(),
            [e == UNTAKEN_REASON for e in letters["error"].to_pylist()],
            strict=True,
        )
    )
    untaken = [(t, i, True) for t in topics[1:] for i in range(PER_TOPIC)]
    assert got == sorted([*untaken, *((topics[1], PER_TOPIC + k, False) for k in range(3))])
    # every table at the end of every topic
    end = {f"{t}:0": 243 if t == topics[1] else 240 for t in topics}
    for spec, table in all_table_configs(later):
        assert _committed(table) == end, spec.name
