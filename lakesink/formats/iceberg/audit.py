"""The exactly-once audit of an Iceberg table: does it hold every record of the writer's
committed Kafka ranges exactly once, and nothing else?

The writer's offsets come from the snapshot summaries (`lakesink.offsets`, lakesink/formats/iceberg/
snapshots.py): walking the current snapshot's lineage oldest first, the writer's offsets never
move back, and its newest commit's offsets are where each partition's committed range ends. A
partition's range starts at the lowest offset the table holds for it (Iceberg summaries carry
end offsets only). The table is read by every reader that is installed — pyiceberg's scan
always, DuckDB's iceberg extension when its PyPI packages are there — and each reader's rows
are checked: no duplicate (topic, partition, offset), none beyond the committed offsets, every
Kafka record of the committed ranges present (or dead-lettered), and the readers agree.
A reader that is not installed is named in `not_run` with what would install it: it never
passes silently.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.errors import ReaderError
from lakesink.formats.audit import (
    COORDINATES,
    Coordinate,
    DeadLetters,
    KeptByTransform,
    compare_with_kafka,
    coordinates_in,
)
from lakesink.formats.iceberg.catalog import SQLITE_FILE, CatalogSettings, warehouse_uri
from lakesink.formats.iceberg.snapshots import WriterCommit, lineage
from lakesink.formats.iceberg.table import IcebergTable, snapshot_infos
from lakesink.protocol.offsets import TopicPartition
from lakesink.storage import is_remote_uri

log = logging.getLogger(__name__)

SPARK_NOT_IN_AUDIT = (
    "Spark (iceberg-spark-runtime-4.1_2.13): not run; it reads in the Iceberg reader "
    "environment (pyspark 4.1 with Iceberg's Spark runtime), which a source checkout builds: "
    "see 'The audit' on the docs page 'Apache Iceberg tables'"
)
SPARK_READ_SCRIPT = Path(__file__).resolve().parent / "spark_read.py"
SPARK_READ_TIMEOUT_S = 600.0


def spark_environment() -> tuple[Path, list[Path]] | str:
    """The Python (pyspark 4.1) and the jars (Iceberg's Spark runtime, sqlite-jdbc) of the
    Iceberg reader environment in lakesink's cache, or why there are none."""
    from lakesink.kafka.kafka_server import cache_dir

    cache = cache_dir()
    python = cache / "peers-venv" / "bin" / "python"
    jars = sorted((cache / "iceberg-jars").glob("*.jar"))
    if not python.exists() or not any(j.name.startswith("iceberg-spark-runtime") for j in jars):
        return f"{SPARK_NOT_IN_AUDIT}; not found under {cache}"
    return python, jars


def spark_catalog_properties(settings: CatalogSettings) -> dict[str, str] | str:
    """The properties of Iceberg's Java catalog that open the same catalog in Spark (they hold
    credentials: never log them), or why Spark cannot: a SQL catalog (SQLite file or
    PostgreSQL) through Iceberg's JdbcCatalog, a REST catalog through its RESTCatalog; a
    warehouse on local disk or S3 (Iceberg's S3FileIO with the storage settings)."""
    props: dict[str, str] = {}
    if settings.kind == "rest":
        props.update(settings.properties)  # token, credential, ...: the same names in Java
        props.update({"type": "rest", "uri": str(settings.uri)})
    else:
        uri = settings.uri or ""
        if not uri:
            catalog_file = Path(settings.warehouse.removeprefix("file://")).resolve() / SQLITE_FILE
            uri = f"sqlite:///{catalog_file}"
        parts = urlsplit(uri)
        scheme = parts.scheme.lower().partition("+")[0]
        if scheme == "sqlite":
            jdbc = "jdbc:sqlite:" + uri.split(":///", 1)[1]
        elif scheme in ("postgresql", "postgres"):
            jdbc = f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"
            if parts.username:
                props["jdbc.user"] = unquote(parts.username)
            if parts.password:
                props["jdbc.password"] = unquote(parts.password)
        else:
            return f"Spark: cannot open a SQL catalog of scheme {scheme!r} in this audit"
        props.update(
            {
                "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                "uri": jdbc,
                "jdbc.schema-version": "V1",
            }
        )
    props["warehouse"] = warehouse_uri(settings.warehouse)
    remote = is_remote_uri(settings.warehouse)
    if remote and not settings.warehouse.lower().startswith(("s3://", "s3a://")):
        return "Spark: reads local and S3 warehouses only in this audit"
    if remote:
        storage = settings.storage
        props["io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        props["s3.path-style-access"] = "true" if storage.path_style else "false"
        given = {
            "s3.endpoint": storage.endpoint,
            "client.region": storage.region,
            "s3.access-key-id": storage.access_key_id,
            "s3.secret-access-key": storage.secret_access_key,
            "s3.session-token": storage.session_token,
        }
        props.update({k: v for k, v in given.items() if v})
    return props


def spark_reader(settings: CatalogSettings) -> Callable[[IcebergTable], pa.Table] | str:
    """A reader of the table's current snapshot by Spark with Iceberg's Java runtime, run in
    the Iceberg reader environment (a subprocess; lakesink's own Spark is newer than Iceberg
    supports), or why there is none. Spark opens the same catalog (`spark_catalog_properties`)."""
    env = spark_environment()
    if isinstance(env, str):
        return env
    python, jars = env
    catalog = spark_catalog_properties(settings)
    if isinstance(catalog, str):
        return catalog

    def read(table: IcebergTable) -> pa.Table:
        with tempfile.TemporaryDirectory(prefix="lakesink-verify-spark-") as work:
            out = Path(work) / "rows.parquet"
            request = {
                "jars": [str(j) for j in jars],
                "catalog": settings.name,
                "catalog_properties": catalog,
                "table": f"{settings.name}.{table.name}",
                "columns": list(COORDINATES),
                "out": str(out),
            }
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
            env.pop("VIRTUAL_ENV", None)
            log.info("reading %s with Spark (Iceberg's Java runtime)", table.name)
            done = subprocess.run(
                [str(python), str(SPARK_READ_SCRIPT)],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                env=env,
                cwd=work,
                timeout=SPARK_READ_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                said = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
                raise ReaderError(
                    (said[-1] if said else done.stderr.strip()[-500:]).removeprefix("error: ")
                )
            return pq.read_table(out)

    return read


@dataclass
class IcebergAuditReport:
    """What the audit of an Iceberg table found; `ok` is True only when nothing is wrong."""

    writer_id: str
    table: str
    snapshots: int = 0
    commits: int = 0
    readers: dict[str, int] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)
    kafka_records: int = 0
    dead_letters: int = 0
    filtered: int = 0
    rows_below_log_start: int = 0
    committed: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    keys: int | None = None  # a table of keys (upsert, cdc): the keys the fold leaves
    wrong_keys: int = 0  # of a table of keys: keys that differ from the fold

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "format": "iceberg",
            "writer_id": self.writer_id,
            "table": self.table,
            "snapshots": self.snapshots,
            "commits": self.commits,
            "readers": self.readers,
            "not_run": self.not_run,
            "kafka_records": self.kafka_records,
            "dead_letters": self.dead_letters,
            "filtered": self.filtered,
            "rows_below_log_start": self.rows_below_log_start,
            "committed": self.committed,
            "problems": self.problems,
            **({"keys": self.keys, "wrong_keys": self.wrong_keys} if self.keys is not None else {}),
        }


def distinct_coordinates(
    name: str, rows: list[Coordinate], report: IcebergAuditReport
) -> set[Coordinate]:
    """The distinct coordinates `name` read; a record read twice is a problem in `report`."""
    counts = Counter(rows)
    dupes = sorted(c for c, n in counts.items() if n > 1)
    if dupes:
        report.problems.append(f"{name}: {len(dupes)} duplicated records, e.g. {dupes[:3]}")
    return set(counts)


def writer_commits(table: IcebergTable, writer_id: str) -> list[tuple[int, WriterCommit]]:
    """The writer's commits in the current snapshot's lineage, oldest first; past an expiry
    gap too (expiry keeps each writer's newest commit behind it, and a writer whose commits all
    lie there must still be audited)."""
    snaps, current = snapshot_infos(table.pyiceberg.metadata)
    out = []
    for s in reversed(lineage(snaps, current)):
        c = WriterCommit.from_summary(s.summary, s.snapshot_id)
        if c is not None and c.writer_id == writer_id:
            out.append((s.snapshot_id, c))
    return out


def read_with_pyiceberg(table: IcebergTable) -> pa.Table:
    """The coordinates of every row of the current snapshot, by pyiceberg's scan."""
    return table.pyiceberg.scan(selected_fields=tuple(COORDINATES)).to_arrow()


def duckdb_reader(columns: Sequence[str] | None = COORDINATES) -> Callable[[str], pa.Table] | str:
    """A reader of a metadata file (its `columns`, None: every column) with DuckDB's iceberg
    extension loaded from its PyPI package (no network), or why there is none."""
    try:
        import duckdb

        binaries = []
        for name in ("avro", "iceberg"):
            module = importlib.import_module(f"duckdb_extension_{name}")
            package = Path(module.__file__ or "").parent
            found = sorted(
                package.glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
            )
            if not found:
                return (
                    f"DuckDB: duckdb_extension_{name} has no build for DuckDB {duckdb.__version__}"
                )
            binaries.append(found[0])
    except ImportError as e:
        return (
            f"DuckDB: not installed ({e.name}); pip install duckdb duckdb-extension-iceberg "
            "duckdb-extension-avro"
        )

    def read(metadata_location: str) -> pa.Table:
        con = duckdb.connect(
            config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
        )
        try:
            for binary in binaries:
                con.execute(f"LOAD '{binary}'")
            cols = ", ".join(columns) if columns is not None else "*"
            return con.execute(
                f"SELECT {cols} FROM iceberg_scan(?)", [metadata_location]
            ).to_arrow_table()
        finally:
            con.close()

    return read


def read_with_duckdb(
    table: IcebergTable, columns: Sequence[str] | None, not_run: list[str]
) -> pa.Table | None:
    """`columns` (None: every column) of the current snapshot by DuckDB's iceberg extension;
    None when it cannot run here (why goes to `not_run`). ReaderError when it fails."""
    duck = duckdb_reader(columns)
    if isinstance(duck, str):
        not_run.append(duck)
        return None
    if not table.pyiceberg.metadata_location.startswith(("file:", "/")):
        not_run.append("DuckDB: reads local warehouses only in this audit")
        return None
    try:
        return duck(table.pyiceberg.metadata_location.removeprefix("file://"))
    except Exception as e:  # duckdb raises its own error types
        raise ReaderError(f"DuckDB cannot read {table.name}: {e}") from e


def read_with_extra_readers(
    table: IcebergTable,
    extra_readers: Mapping[str, Callable[[IcebergTable], pa.Table] | str] | None,
    not_run: list[str],
) -> list[tuple[str, pa.Table]]:
    """What each of `extra_readers` read, by name. A reader given as text (why it cannot run)
    goes to `not_run`, and so does how to get Spark when no reader is named "spark".
    ReaderError naming a reader that fails."""
    out: list[tuple[str, pa.Table]] = []
    for name, reader in (extra_readers or {}).items():
        if isinstance(reader, str):
            not_run.append(reader)
            continue
        try:
            out.append((name, reader(table)))
        except Exception as e:  # each engine raises its own error types
            raise ReaderError(f"{name} cannot read {table.name}: {e}") from e
    if "spark" not in (extra_readers or {}):
        not_run.append(SPARK_NOT_IN_AUDIT)
    return out


def offsets_moved_back(
    last: Mapping[str, int], commit: WriterCommit, where: str, problems: list[str]
) -> dict[str, int]:
    """The writer's offsets after `commit` (its offsets over `last`, the ones before it); a
    partition whose offset it moves back is a problem naming `where`."""
    now = commit.offsets.to_json()
    back = [k for k, pos in last.items() if now.get(k, pos) < pos]
    if back:
        problems.append(f"{where}: offsets of {', '.join(back)} moved back")
    return {**last, **now}


def audit_iceberg(
    table: IcebergTable,
    writer_id: str,
    *,
    bootstrap: str | None,
    isolation_level: str = "read_committed",
    consumer_config: Mapping[str, str] | None = None,
    dead_letters: DeadLetters | None = None,
    from_log_start: bool = False,
    extra_readers: Mapping[str, Callable[[IcebergTable], pa.Table] | str] | None = None,
    kept_by_transform: KeptByTransform | None = None,
) -> IcebergAuditReport:
    """Run the audit. With `bootstrap=None` the Kafka comparison is skipped; the snapshot
    offsets, the readers' agreement and the committed bounds are always checked.
    `from_log_start`: the writer began at each partition's log start (starting offsets
    `earliest`), so its ranges start there rather than at the lowest offset the table holds.
    `extra_readers`: further readers by name (each returns the coordinate columns of the
    current snapshot), checked like the built-in ones, or why that reader cannot run (named in
    `not_run`); without a reader named "spark", `not_run` says how to get one.
    `kept_by_transform`: the table's transformation, whose filtered records are not missing."""
    table.refresh()
    report = IcebergAuditReport(writer_id, table.name)
    report.snapshots = len(table.pyiceberg.metadata.snapshots)
    commits = writer_commits(table, writer_id)
    report.commits = len(commits)
    last: dict[str, int] = {}
    for sid, c in commits:
        last = offsets_moved_back(last, c, f"snapshot {sid}", report.problems)
    report.committed = dict(sorted(last.items()))
    ends = {TopicPartition.parse(k): v for k, v in last.items()}
    topics = {tp.topic for tp in ends}

    readers: dict[str, set[Coordinate]] = {}
    try:
        rows = coordinates_in(read_with_pyiceberg(table), topics)
    except Exception as e:  # pyiceberg and pyarrow raise their own error types
        raise ReaderError(f"pyiceberg cannot read {table.name}: {e}") from e
    report.readers["pyiceberg"] = len(rows)
    readers["pyiceberg"] = distinct_coordinates("pyiceberg", rows, report)
    got = read_with_duckdb(table, COORDINATES, report.not_run)
    if got is not None:
        drows = coordinates_in(got, topics)
        report.readers["duckdb"] = len(drows)
        readers["duckdb"] = distinct_coordinates("duckdb", drows, report)
    for name, got in read_with_extra_readers(table, extra_readers, report.not_run):
        xrows = coordinates_in(got, topics)
        report.readers[name] = len(xrows)
        readers[name] = distinct_coordinates(name, xrows, report)
    base = readers["pyiceberg"]
    for name, got_set in readers.items():
        if got_set != base:
            report.problems.append(
                f"readers disagree: {len(base - got_set)} rows only in pyiceberg, "
                f"{len(got_set - base)} only in {name}"
            )

    starts: dict[TopicPartition, int] = {}
    for t, p, o in base:
        tp = TopicPartition(t, p)
        starts[tp] = min(starts.get(tp, o), o)
    beyond = sorted(c for c in base if c[2] >= ends.get(TopicPartition(c[0], c[1]), -1))
    if beyond:
        report.problems.append(
            f"{len(beyond)} rows lie beyond the writer's committed offsets (or in partitions "
            f"it never committed), e.g. {beyond[:3]}"
        )
    if bootstrap is not None and ends:
        spans = {
            tp: (0 if from_log_start else min(starts.get(tp, end), end), end)
            for tp, end in ends.items()
        }
        found = compare_with_kafka(
            base,
            spans,
            bootstrap=bootstrap,
            isolation_level=isolation_level,
            consumer_config=consumer_config or {},
            dead_letters=dead_letters,
            kept_by_transform=kept_by_transform,
            problems=report.problems,
        )
        report.kafka_records = found.kafka_records
        report.rows_below_log_start = found.rows_below_log_start
        report.dead_letters = found.dead_letters
        report.filtered = found.filtered
    return report
