"""A database's change stream landed as a current-state table: Debezium's PostgreSQL connector
(in Debezium's embedded engine, which sends to Kafka) streams inserts, updates, deletes, TOASTed
values left alone, a primary-key change and a transaction over two tables from a real PostgreSQL
into the test's Apache Kafka; lakesink ingests the topics with `write.operation=cdc` into tables
of each kind (`FORMATS`: a Hudi copy-on-write table of each topic, a Hudi merge-on-read table of
the customers compacted inline every 2 deltacommits, an Iceberg table of keys of the customers;
one connector and its topics serve all), and each table equals `SELECT *` of the database row by
row, read with hudi-rs and lakesink's own reader (Hudi) or pyiceberg (Iceberg), after the first
ingestion (the merge-on-read table: compacted slices with log files over them) and again after
more changes and a restart (compacted again); then the fold audit passes (for Iceberg it also
checks that DuckDB reads the rows pyiceberg reads)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from integration.debezium_fixture import (
    DebeziumConnector,
    EmbeddedDebezium,
    PostgresSource,
    debezium_lib_dir,
)

if TYPE_CHECKING:
    from pg_fixture import PostgresServer

pytestmark = pytest.mark.integration
pytest_plugins = ["pg_fixture"]

CUSTOMERS_DDL = (
    "id INT NOT NULL, name STRING, balance DECIMAL(12,2), updated_at STRING, notes STRING"
)
ORDERS_DDL = "id INT NOT NULL, customer_id INT, amount DECIMAL(12,2)"
CUSTOMER_COLUMNS = ["id", "name", "balance", "updated_at", "notes"]
LONG_NOTES = ("notes kept out of line by PostgreSQL " * 70)[:2300]  # TOASTed (EXTERNAL)
# the tables each kind of table lands from the one connector's topics; merge-on-read and Iceberg
# the richer one only (TOAST, a key change, restarts): the CI budget, about 6 s an ingestion
FORMATS = {"hudi": ("customers", "orders"), "hudi-mor": ("customers",), "iceberg": ("customers",)}
# the merge-on-read table's: 20 snapshot rows then ~25 changes in 20-record batches, so the
# first ingestion compacts after its second deltacommit and writes log files over that
MOR = {"table__type": "MERGE_ON_READ", "table__compaction__every__commits": 2}

SETUP = (
    """CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL,
       balance numeric(12,2), updated_at timestamptz NOT NULL, notes text)""",
    "ALTER TABLE customers ALTER COLUMN notes SET STORAGE EXTERNAL",
    """CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL,
       amount numeric(12,2) NOT NULL)""",
)


def customer(i: int, notes: str | None = None) -> tuple[Any, ...]:
    return (
        i,
        f"customer {i}",
        Decimal(i) / 4,
        f"2026-11-27 08:{i // 60:02d}:{i % 60:02d}+00",
        notes,
    )


FIRST_CHANGES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    # inserts, two with TOASTed notes
    *(("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(i)) for i in range(30, 40)),
    ("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(40, LONG_NOTES)),
    ("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(41, LONG_NOTES + "!")),
    # updates, several of one key; one leaves the TOASTed notes alone (the placeholder)
    *(("UPDATE customers SET balance = balance + 1 WHERE id = %s", (i,)) for i in (1, 2, 2, 30)),
    ("UPDATE customers SET name = 'renamed', updated_at = now() WHERE id = 40", ()),
    ("UPDATE customers SET notes = 'short now' WHERE id = 41", ()),
    # deletes (one of a row from the snapshot, one of a row inserted above)
    ("DELETE FROM customers WHERE id = %s", (3,)),
    ("DELETE FROM customers WHERE id = %s", (31,)),
    # a primary-key change: delete of 4, tombstone, create of 400
    ("UPDATE customers SET id = 400 WHERE id = 4", ()),
    ("INSERT INTO orders VALUES (1, 1, 10.00), (2, 400, 20.50)", ()),
)
SECOND_CHANGES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(3)),  # a deleted key again
    ("UPDATE customers SET balance = 0 WHERE id = 400", ()),
    ("UPDATE customers SET name = 'renamed twice' WHERE id = 40", ()),  # TOAST still alone
    ("DELETE FROM customers WHERE id BETWEEN 5 AND 9", ()),
    ("DELETE FROM orders WHERE id = 1", ()),
    ("UPDATE orders SET amount = 99.99 WHERE id = 2", ()),
)


@pytest.fixture
def shop(postgres_server: PostgresServer) -> Iterator[tuple[str, PostgresSource]]:
    """A database of its own in the session's PostgreSQL (wal_level=logical): 20 customers
    before the connector's snapshot. Its DSN and the connector's view of it."""
    import psycopg

    name = f"shop_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = postgres_server.dsn.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(dsn) as conn, conn.transaction():
        for sql in SETUP:
            conn.execute(sql)
        for i in range(1, 21):
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(i))
    yield (
        dsn,
        PostgresSource(
            "127.0.0.1", postgres_server.port, "postgres", postgres_server.password, name
        ),
    )
    with (
        psycopg.connect(postgres_server.dsn, autocommit=True) as admin,
        contextlib.suppress(Exception),
    ):
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def run_sql(dsn: str, statements: tuple[tuple[str, tuple[Any, ...]], ...], marker: int) -> None:
    """Each statement its own transaction, but the order insert and the customer update of the
    last two in one; then a marker customer (`marker`), the last change the topics get."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        for sql, params in statements:
            with conn.transaction():
                conn.execute(sql, params)
        with conn.transaction():  # one transaction over both tables
            conn.execute("UPDATE orders SET amount = amount + 1 WHERE id = 2")
            conn.execute("UPDATE customers SET balance = balance - 1 WHERE id = 400")
        with conn.transaction():
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", customer(marker))


def wait_for_key(bootstrap: str, topic: str, key: int, timeout_s: float = 120) -> None:
    """Until a change of customer `key` is in `topic` (every change before it is too)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error() or msg.value() is None:
                continue
            payload = json.loads(msg.value()).get("payload") or {}
            if (payload.get("after") or {}).get("id") == key:
                return
    finally:
        consumer.close()
    raise AssertionError(f"customer {key} never reached {topic}")


def database_rows(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return {r["id"]: dict(r) for r in conn.execute(f"SELECT * FROM {table}")}


def normalized(rows: dict[int, dict[str, Any]], columns: list[str]) -> dict[int, tuple[Any, ...]]:
    """Rows by key, timestamps as instants (the table keeps Debezium's ISO text)."""

    def value(v: Any) -> Any:
        if isinstance(v, str) and v[:4].isdigit() and "T" in v and v.endswith("Z"):
            return datetime.fromisoformat(v)
        return v

    return {k: tuple(value(r[c]) for c in columns) for k, r in rows.items()}


def by_key(rows: list[dict[str, Any]], reader: str) -> dict[int, dict[str, Any]]:
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), f"{reader} reads two rows of one key"
    return out


def hudi_rs_rows(table: Path) -> dict[int, dict[str, Any]]:
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(str(table)).build().read()
    return by_key(pa.Table.from_batches(batches).to_pylist() if batches else [], "hudi-rs")


def table_rows(cfg: Any) -> dict[str, dict[int, dict[str, Any]]]:
    """The rows of the table `cfg` writes, by key, as each reader of its format reads them:
    hudi-rs and lakesink's own reader (Hudi); pyiceberg (Iceberg: the fold audit at the end
    checks that DuckDB reads the same rows, every column)."""
    if cfg["table.format"] == "iceberg":
        from lakesink.formats.iceberg.format import open_iceberg_table

        table = open_iceberg_table(cfg.settings, create=False).pyiceberg
        return {"pyiceberg": by_key(table.scan().to_arrow().to_pylist(), "pyiceberg")}
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.reader import TableReader

    path = Path(cfg["table.path"])
    own = TableReader(HudiTable.open(path)).snapshot().to_pylist()
    return {"hudi-rs": hudi_rs_rows(path), "lakesink reader": by_key(own, "lakesink's reader")}


def assert_table_equals_database(dsn: str, name: str, cfg: Any, columns: list[str]) -> None:
    expected = normalized(database_rows(dsn, name), columns)
    for reader, rows in table_rows(cfg).items():
        got = normalized(rows, columns)
        wrong = {k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)}
        assert not wrong, (reader, {k: (expected.get(k), got.get(k)) for k in sorted(wrong)[:5]})


def cdc_config(
    bootstrap: str, topic: str, root: Path, name: str, ddl: str, writer: str, kind: str
) -> Any:
    """The ingestion of `topic` into the table `name` of `kind` (a key of `FORMATS`) under
    `root`."""
    where = (
        {"table__format": "iceberg", "table__name": name}
        if kind == "iceberg"
        else {"table__format": "hudi", **(MOR if kind == "hudi-mor" else {})}
    )
    return ingest_config(
        bootstrap,
        topic,
        root / kind / (name if kind != "iceberg" else "warehouse"),
        value__schema=ddl,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=4,
        kafka__max__records__per__batch=20,
        writer__id=writer,
        **where,
    )


def test_debezium_change_stream_lands_as_the_databases_current_rows(
    shop: tuple[str, PostgresSource],
    kafka_bootstrap: str,
    spark: Any,
    tmp_path: Path,
) -> None:
    debezium_lib_dir()  # a clear error when scripts/setup-debezium.sh has not run
    dsn, source = shop
    prefix = f"cdc{uuid.uuid4().hex[:8]}"  # slot names: at most 63 characters
    connector = DebeziumConnector(
        prefix, prefix, tables=("public.customers", "public.orders"), schemas_enable=True
    )
    customers_topic, orders_topic = f"{prefix}.public.customers", f"{prefix}.public.orders"
    tables = [  # (database table, its columns, the ingestion of its topic), every format
        (name, columns, cdc_config(kafka_bootstrap, topic, tmp_path, name, ddl, writer, fmt))
        for fmt, names in FORMATS.items()
        for name, columns, topic, ddl, writer in (
            ("customers", CUSTOMER_COLUMNS, customers_topic, CUSTOMERS_DDL, "c"),
            ("orders", ["id", "customer_id", "amount"], orders_topic, ORDERS_DDL, "o"),
        )
        if name in names
    ]
    with EmbeddedDebezium(tmp_path / "debezium", kafka_bootstrap, source, [connector]) as debezium:
        debezium.wait_streaming(timeout_s=180)
        run_sql(dsn, FIRST_CHANGES, marker=900)
        wait_for_key(kafka_bootstrap, customers_topic, 900)
        for name, columns, cfg in tables:
            run_ingestion(cfg, spark)
            assert_table_equals_database(dsn, name, cfg, columns)

        run_sql(dsn, SECOND_CHANGES, marker=901)
        wait_for_key(kafka_bootstrap, customers_topic, 901)
        # a new ingestion of each table: it resumes after the first one's offsets
        for name, columns, cfg in tables:
            run_ingestion(cfg, spark)
            assert_table_equals_database(dsn, name, cfg, columns)
        assert debezium.running
    # lakesink verify's fold audit: each table equals the fold of its committed records
    for name, _, cfg in tables:
        report = audit_config(cfg)
        assert report.ok, (cfg["table.path"], name, report.problems)
        assert report.keys == len(database_rows(dsn, name)) > 0
        if cfg["table.format"] == "iceberg":
            assert report.readers == {"pyiceberg": report.keys, "duckdb": report.keys}
        else:
            assert report.rows_hudi_rs == report.rows_lakesink == report.keys
        assert report.commits >= 2
    mor = next(cfg for _, _, cfg in tables if cfg["table.type"] == "MERGE_ON_READ")
    assert_log_files_and_compactions(mor)
    hudi_customers = next(
        cfg
        for name, _, cfg in tables
        if name == "customers" and cfg["table.format"] == "hudi" and cfg is not mor
    )
    assert_the_fold_audit_sees_a_changed_row(hudi_customers)


def assert_log_files_and_compactions(cfg: Any) -> None:
    """The merge-on-read table's rows went through log files and compactions: a deltacommit
    wrote log files, and two compactions (after deltacommits 2 and 4) completed."""
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.protocol.instant import Action

    table = HudiTable.open(Path(cfg["table.path"]))
    assert table.config.table_type == "MERGE_ON_READ"
    timeline = table.timeline()
    deltas = timeline.completed(Action.DELTA_COMMIT)
    logs = [
        w.path
        for i in deltas
        for w in timeline.commit_metadata(i).writes
        if ".log." in w.path.rsplit("/", 1)[-1]
    ]
    assert logs, "no deltacommit wrote a log file"
    assert len(deltas) >= 4, deltas  # the first ingestion's 3 batches, the second's one
    compactions = timeline.completed(Action.COMMIT)
    assert len(compactions) == len(deltas) // 2, (deltas, compactions)
    assert not timeline.inflight_or_requested()


def assert_the_fold_audit_sees_a_changed_row(cfg: Any) -> None:
    """The fold audit's comparison, given the table's rows with one value changed and one row
    gone, names both keys."""
    import pyarrow.compute as pc

    from lakesink.cli.verify import fold_audit
    from lakesink.formats.audit import compare_with_fold
    from lakesink.formats.hudi.audit import AuditReport, writer_ranges
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    settings = cfg.settings
    spans = writer_ranges(
        HudiTable.open(settings.table_storage()), settings.writer_id, AuditReport("")
    )
    fold = fold_audit(cfg)
    assert fold is not None
    rows = pa.Table.from_pylist(list(hudi_rs_rows(Path(cfg["table.path"])).values()))
    ids = sorted(rows.column("id").to_pylist())
    rows = rows.filter(pc.not_equal(rows.column("id"), ids[0]))
    names = pc.if_else(pc.equal(rows.column("id"), ids[1]), "tampered", rows.column("name"))
    rows = rows.set_column(rows.column_names.index("name"), "name", names)
    problems: list[str] = []
    found = compare_with_fold(
        rows,
        spans,
        fold,
        bootstrap=cfg["kafka.bootstrap.servers"],
        isolation_level="read_committed",
        consumer_config={},
        problems=problems,
    )
    assert found.wrong_keys == 2, problems
    assert "2 of" in problems[0] and "(0 extra, 1 missing)" in problems[0], problems
