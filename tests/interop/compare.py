"""Check that Java Hudi and hudi-rs return exactly the rows lakesink's reader returns for one
table: snapshot (metadata table on and off), Spark SQL, time travel to every retained instant
and incremental queries between instants (completion times on version 8, instant times on 6).

`plan_reads` lists the queries with what lakesink's reader returns for each; `check_tables`
sends the Java Hudi reads of many tables to one JVM session in one round trip.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hudi
import pyarrow as pa
from interop.java_hudi import JavaHudi, JavaHudiError, Read, Sql

from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.protocol.instant import TimelineLayout
from lakesink.storage.base import Storage

EPOCH = "19700101000000000"
# a table's metadata table (lakesink writes none; Java Hudi's writers may)
METADATA_TABLE_PROPERTIES = ".hoodie/metadata/.hoodie/hoodie.properties"
log = logging.getLogger(__name__)
_names = itertools.count()


@dataclass(frozen=True)
class Query:
    """One query of one table, in the three readers."""

    table: Path
    name: str
    java: Read | Sql
    ours: Callable[[], pa.Table]
    hudi_rs: Callable[[], pa.Table] | None


@dataclass(frozen=True)
class Remote:
    """Where the readers other than lakesink's find a copy of the table: Java Hudi at
    `java_uri` (`s3a://...`), hudi-rs at `hudi_rs_uri` (`s3://...`) with `storage_options`."""

    java_uri: str
    hudi_rs_uri: str
    storage_options: dict[str, str]


def _hudi_rs(
    path: Path | str,
    options: hudi.HudiReadOptions | None = None,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    builder = hudi.HudiTableBuilder.from_base_uri(str(path))
    if storage_options:
        builder = builder.with_storage_options(storage_options)
    table = builder.build()
    batches = table.read(options) if options is not None else table.read()
    return pa.Table.from_batches(batches) if batches else pa.table({})


def plan_reads(
    path: Path | Storage, *, incremental_pairs: bool = True, remote: Remote | None = None
) -> list[Query]:
    """Every query the interop check runs on the table at `path`; with `remote`, Java Hudi and
    hudi-rs read the copy of the table there while lakesink's reader reads `path`."""
    table = HudiTable.open(path)
    reader = TableReader(table)
    # a table on an object store is named by its last path segment
    p = Path(table.uri.rsplit("/", 1)[-1]) if remote is not None else table.base_path
    jp: Path | str = remote.java_uri if remote is not None else p
    rp: Path | str = remote.hudi_rs_uri if remote is not None else p
    so = remote.storage_options if remote is not None else None
    sql_name = f"lakesink_interop_{next(_names)}"
    create = f"CREATE TABLE IF NOT EXISTS {sql_name} USING hudi LOCATION '{jp}'"
    out = [
        Query(p, "snapshot", Read(jp), reader.snapshot, lambda: _hudi_rs(rp, None, so)),
        Query(
            p,
            "Spark SQL",
            Sql([create, f"SELECT * FROM {sql_name}"]),
            reader.snapshot,
            None,
        ),
    ]
    if table.storage.exists(METADATA_TABLE_PROPERTIES):
        # only where a metadata table exists does turning it off change Java Hudi's read path
        # (without one it lists the files either way: the query would repeat the snapshot)
        out.append(
            Query(
                p,
                "snapshot, metadata table off",
                Read(jp, {"hoodie.metadata.enable": "false"}),
                reader.snapshot,
                None,
            )
        )
    timeline = table.timeline()
    completed = timeline.completed_data_instants()
    if completed:
        first = str(completed[0].time)
        out.append(
            Query(
                p,
                f"Spark SQL, TIMESTAMP AS OF {first}",
                Sql([create, f"SELECT * FROM {sql_name} TIMESTAMP AS OF '{first}'"]),
                lambda t=first: reader.as_of(t),  # type: ignore[misc]
                None,
            )
        )
    for inst in completed:
        t = str(inst.time)
        out.append(
            Query(
                p,
                f"as of {t}",
                Read(jp, {"as.of.instant": t}),
                lambda t=t: reader.as_of(t),  # type: ignore[misc]
                lambda t=t: _hudi_rs(rp, hudi.HudiReadOptions().with_as_of_timestamp(t), so),  # type: ignore[misc]
            )
        )
    v2 = table.layout is TimelineLayout.V2
    bounds = [str((i.completion_time or i.time) if v2 else i.time) for i in completed]
    pairs: list[tuple[str, str]] = []
    if bounds:
        pairs.append((_first_start(table), bounds[-1]))
    if incremental_pairs:
        pairs += list(itertools.pairwise(bounds))
    for start, end in pairs:
        opts = {
            "hoodie.datasource.query.type": "incremental",
            "hoodie.datasource.read.begin.instanttime": start,
            "hoodie.datasource.read.end.instanttime": end,
        }
        rs_opts = (
            hudi.HudiReadOptions()
            .with_query_type(hudi.HudiQueryType.Incremental)
            .with_start_timestamp(start)
            .with_end_timestamp(end)
        )
        out.append(
            Query(
                p,
                f"incremental ({start}, {end}]",
                Read(jp, opts),
                lambda s=start, e=end: reader.incremental(s, e),  # type: ignore[misc]
                lambda o=rs_opts: _hudi_rs(rp, o, so),  # type: ignore[misc]
            )
        )
    return out


def _first_start(table: HudiTable) -> str:
    """The earliest start an incremental read accepts: the epoch, or where the archive ends."""
    from lakesink.formats.hudi.table.archive import load_archived_view

    archived = load_archived_view(table.storage)
    if archived is None:
        return EPOCH
    v2 = table.layout is TimelineLayout.V2
    return str(archived.completed_upto if v2 else archived.upto)


def rows(t: pa.Table, schema: pa.Schema | None = None) -> list[dict[str, object]]:
    """`t`'s rows, sorted; with `schema`, each row without the fields `schema` lacks where they
    are null (see `_as_of`)."""
    if t.num_columns == 0:
        return []
    found = t.to_pylist() if schema is None else [_as_of(r, schema) for r in t.to_pylist()]
    return sorted(found, key=repr)


def _as_of(row: dict[str, Any], fields: pa.Schema | pa.StructType) -> dict[str, Any]:
    """`row` without its null fields that `fields` does not have, nested too. hudi-rs reads a
    time travel in the table's latest schema: a column added after that instant comes back
    null, where lakesink's reader and Java Hudi return the schema as of the instant. A field
    with a value is kept, so the comparison still shows it."""
    types = {f.name: f.type for f in fields}
    out: dict[str, Any] = {}
    for name, value in row.items():
        if name not in types:
            if value is not None:
                out[name] = value
            continue
        kind = types[name]
        out[name] = _as_of(value, kind) if pa.types.is_struct(kind) and value else value
    return out


def _diff(name: str, reader: str, got: pa.Table, want: pa.Table) -> str:
    g, w = rows(got, want.schema), rows(want)
    extra = [r for r in g if r not in w][:2]
    missing = [r for r in w if r not in g][:2]
    return (
        f"{name}: {reader} returned {len(g)} rows, lakesink {len(w)}; "
        f"extra {extra}; missing {missing}"
    )


def check_tables(java_hudi: JavaHudi, queries: Sequence[Query]) -> list[str]:
    """Run every query in the three readers; return one line per disagreement (none: all
    three readers return the same rows)."""
    problems: list[str] = []
    results = java_hudi.run([q.java for q in queries])
    for q, java in zip(queries, results, strict=True):
        name = f"{q.table.name}: {q.name}"
        want = q.ours()
        if isinstance(java, JavaHudiError):
            problems.append(f"{name}: Java Hudi failed: {str(java)[:1500]}")
        elif rows(java) != rows(want):
            problems.append(_diff(name, "Java Hudi", java, want))
        if q.hudi_rs is not None:
            theirs = q.hudi_rs()
            if rows(theirs, want.schema) != rows(want):
                problems.append(_diff(name, "hudi-rs", theirs, want))
    return problems


def assert_java_hudi_agrees(java_hudi: JavaHudi, *paths: Path | str) -> None:
    """Every query of `plan_reads` on each table, in one round trip: Java Hudi and hudi-rs
    return the rows lakesink's reader returns."""
    start = time.perf_counter()
    queries = [q for p in paths for q in plan_reads(Path(p))]
    assert queries
    problems = check_tables(java_hudi, queries)
    log.info("%d interop queries in %.1fs", len(queries), time.perf_counter() - start)
    assert problems == [], "\n".join(problems)
