"""One ingestion writing many tables (`tables.<name>.*`, docs/many-tables.md): each batch is
read from Kafka once, and every table takes the rows its route picks (by topic, by a field's
text against a regex; a record no route picks goes to `route.default`, else is a dead letter,
else fails the batch), written by the table's own coordinator and committed with its own
offsets requirement, concurrently with the others (spark/batch.py: the first table alone,
then the rest on a bounded pool of driver threads).

Recovery per table: each table holds its own committed offsets. Spark's checkpoint replays an
unfinished batch with its exact ranges, and a table that committed them begins nothing. Without
the checkpoint, the source starts at the lowest offsets committed over the tables
(lakesink.spark.table_offsets), and a table ahead of the others takes each range from its own
position on (`BatchTables(skip_committed=True)`): its rows below that position are filtered out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakesink.config import LakesinkConfig
from lakesink.config.tables import HEADER_PREFIX, KAFKA_KEY_FIELD, Route, TableSpec
from lakesink.engine.coordinator import BatchOutcome, Coordinator
from lakesink.engine.schema import TableSchema
from lakesink.errors import ConfigError, LakesinkError
from lakesink.formats import FormatPlugin
from lakesink.formats.task import TaskTarget
from lakesink.protocol.commit import Verdict
from lakesink.protocol.offsets import OffsetRange
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark.batch import DEAD_LETTERS, BatchTable, BatchTables, Instants
from lakesink.spark.direct import (
    DirectTask,
    dead_letter_batch,
    read_groups,
    routed_direct_obstacle,
    task_pieces,
)
from lakesink.spark.sink import (
    CommittingSink,
    commit_schema_of,
    dead_letters_of,
    prepare_rows,
    rows_arrow,
)
from lakesink.spark.source import ERROR_COLUMN, RAW_VALUE_COLUMN
from lakesink.spark.task_writer import TableOutput, task_attempt, with_required

log = logging.getLogger(__name__)

__all__ = [
    "RoutedTable",
    "RoutingError",
    "RoutingSink",
    "route_condition",
    "route_mask",
    "routed_coordinates",
]


class RoutingError(LakesinkError):
    """A record that no table's route takes, with no route.default and no dead-letter table."""


@dataclass(frozen=True, slots=True)
class RoutedTable:
    """One table of a many-table ingestion: its spec (name, route), its own configuration,
    its format's plugin, its coordinator and the rows' declared schema for it."""

    spec: TableSpec
    cfg: LakesinkConfig
    plugin: FormatPlugin
    coordinator: Coordinator
    output_schema: StructType
    partition_fields: tuple[str, ...]
    transform: Callable[[DataFrame], DataFrame] | None

    @property
    def name(self) -> str:
        return self.spec.name


def route_condition(route: Route) -> Column:
    """The rows `route` takes, as a Spark condition (null: not taken)."""
    conditions: list[Column] = []
    if route.topics:
        conditions.append(F.col("kafka_topic").isin(list(route.topics)))
    elif route.topic_pattern is not None:
        conditions.append(F.col("kafka_topic").rlike(_full(route.topic_pattern)))
    if route.field is not None and route.regex is not None:
        conditions.append(_field_text(route.field).rlike(_full(route.regex)))
    if not conditions:
        return F.lit(True)
    return F.coalesce(reduce(lambda a, b: a & b, conditions), F.lit(False))


def _full(regex: str) -> str:
    """A regex matched in full, as route.regex and route.topic.pattern are."""
    return f"^(?:{regex})$"


def _field_text(name: str) -> Column:
    if name == KAFKA_KEY_FIELD:
        return F.col(KAFKA_KEY_FIELD).cast("string")  # the key's bytes as UTF-8 text
    if name.startswith(HEADER_PREFIX):
        header = name[len(HEADER_PREFIX) :].replace("'", "\\'")
        # the last header of that name, as Kafka clients read a header map
        found = F.expr(f"filter(kafka_headers, h -> h.key = '{header}')")
        # try_: no such header is null, not an error (ANSI mode)
        return F.try_element_at(found, F.lit(-1)).getField("value").cast("string")
    return F.col(name).cast("string")


def _rows_from(skip_below: Mapping[tuple[str, int], int | None]) -> Column | None:
    """`_skip_below` as a Spark filter: the rows a table takes of the batch (None: all)."""
    if not skip_below:
        return None
    skipped: list[Column] = []
    for (topic, partition), start in skip_below.items():
        at = (F.col("kafka_topic") == topic) & (F.col("kafka_partition") == partition)
        skipped.append(at if start is None else at & (F.col("kafka_offset") < start))
    return ~reduce(lambda a, b: a | b, skipped)


class RoutingSink(CommittingSink):
    """`foreachBatch` of a many-table ingestion: the batch's rows read once (cached), each
    table's taken by its route, written by its plugin and committed after the dead-letter table
    (else the first by name), the others concurrently."""

    def __init__(
        self,
        cfg: LakesinkConfig,
        tables: Sequence[RoutedTable],
        dead_letters: Coordinator | None = None,
        *,
        open_dynamic: Callable[[str], RoutedTable] | None = None,
        direct: bool = False,
    ) -> None:
        """`open_dynamic(name)`: creates dynamic table `name` (`route.dynamic.*`); `direct`:
        the batches' tasks read, route and write the rows (`RoutedDirectTask`) when the
        tables' rows allow it (`_direct_obstacle`), else the DataFrame fan-out, its reason
        logged once."""
        first = tables[0]
        super().__init__(cfg, first.coordinator, None, dead_letters)
        self.dead_letter_coordinator = dead_letters
        self.routed: dict[str, RoutedTable] = {}
        self.default_table: str | None = cfg["route.default"]
        self.dynamic_field: str | None = cfg["route.dynamic.field"]
        self.dynamic_allow: str = cfg["route.dynamic.allow"]
        self.open_dynamic = open_dynamic
        # names that are tables of the tables section under another name: never dynamic
        self._not_dynamic: set[str] = set()
        self._set_tables(tables)
        if direct:
            why_not = self._direct_obstacle()
            if why_not is not None and cfg["write.path"] == "direct":
                raise ConfigError(
                    f"write.path=direct is not possible: {why_not}; set write.path=auto"
                )
            if why_not is not None:
                log.info("the routed tables take the DataFrame path: %s", why_not)
            self.direct = why_not is None
        elif cfg["write.path"] != "dataframe":
            log.info("the routed tables take the DataFrame path: %s", routed_direct_obstacle(cfg))

    def _direct_obstacle(self) -> str | None:
        """Why the tasks cannot route this ingestion's rows (None: they can): the tables' rows
        differ, or a route's field is of a type whose text Arrow and Spark write differently
        (`DIRECT_ROUTE_TYPES`)."""
        tables = list(self.routed.values())
        schema = tables[0].output_schema
        for table in tables:
            if table.output_schema != schema:
                return f"table {table.name}'s rows differ from table {tables[0].name}'s"
            field = table.spec.route.field
            if field is None or field == KAFKA_KEY_FIELD or field.startswith(HEADER_PREFIX):
                continue
            if field not in schema.fieldNames():
                return f"table {table.name}'s route.field {field!r} is not a column of the rows"
            kind = schema[field].dataType.typeName()
            if kind not in DIRECT_ROUTE_TYPES:
                return (
                    f"table {table.name}'s route.field {field!r} is a {kind} column; the tasks "
                    f"route by {', '.join(DIRECT_ROUTE_TYPES)} columns"
                )
        return None

    def _set_tables(self, tables: Sequence[RoutedTable]) -> None:
        """The tables every batch writes: the dead letters first, then by name."""
        self.routed = {t.name: t for t in sorted(tables, key=lambda t: t.name)}
        dead = self.dead_letter_coordinator
        self.tables = BatchTables(
            [
                *([BatchTable(DEAD_LETTERS, dead)] if dead is not None else []),
                *(BatchTable(name, t.coordinator) for name, t in self.routed.items()),
            ],
            skip_committed=True,
            parallelism=self.cfg["commit.tables.parallelism"],
        )

    def _commit_batch_once(
        self, batch_df: DataFrame, batch_id: int, ranges: list[OffsetRange]
    ) -> BatchOutcome | None:
        if self.direct:  # the tasks read Kafka: the DataFrame is not read
            return super()._commit_batch_once(batch_df, batch_id, ranges)
        # the batch is read once: the names of dynamic tables, then every table's rows
        cached = batch_df.persist()
        try:
            if self.dynamic_field is not None:
                self._add_dynamic_tables(cached)
            return super()._commit_batch_once(cached, batch_id, ranges)
        finally:
            cached.unpersist()

    def _add_dynamic_tables(self, batch_df: DataFrame) -> None:
        """Create the dynamic tables this batch's records name for the first time."""
        assert self.dynamic_field is not None and self.open_dynamic is not None
        rows = batch_df
        if DEAD_LETTERS in self.tables:
            rows = rows.where(F.col(ERROR_COLUMN).isNull())
        names = (
            rows.select(_field_text(self.dynamic_field).alias("name"))
            .where(F.col("name").rlike(_full(self.dynamic_allow)))
            .distinct()
            .collect()
        )
        from lakesink.spark.table_offsets import is_named_table, named_tables

        new = sorted({r["name"] for r in names} - set(self.routed) - self._not_dynamic)
        if not new:
            return
        named = named_tables(self.cfg)
        opened = []
        for name in new:
            if is_named_table(self.cfg.dynamic_table_config(name)[1], name, named):
                self._not_dynamic.add(name)  # records no dynamic table takes
                continue
            opened.append(self.open_dynamic(name))
        if opened:
            self._set_tables([*self.routed.values(), *opened])

    def _writes_by_key(self) -> bool:
        """Any table written by key, not only the first (a conflict in any is retried)."""
        return any(t.coordinator.operation_type == "UPSERT" for t in self.routed.values())

    def _row_statuses(
        self, statuses: Mapping[str, list[WriteStatus]]
    ) -> dict[str, list[WriteStatus]]:
        return {name: statuses[name] for name in self.routed if name in statuses}

    def _batch_outcome(
        self, batch_id: int, outcomes: Mapping[str, BatchOutcome]
    ) -> BatchOutcome | None:
        """The tables' outcomes as one: their records, files and publish time summed."""
        published = [outcomes[name] for name in self.routed if name in outcomes]
        if not published:
            return None
        return BatchOutcome(
            batch_id,
            Verdict.PUBLISH,
            published[0].instant_time,
            records=sum(o.records for o in published),
            files=sum(o.files for o in published),
            publish_s=sum(o.publish_s for o in published),
            published_at=max(o.published_at for o in published),
        )

    def _write_tables(
        self, batch_df: DataFrame, ranges: list[OffsetRange], instants: Instants
    ) -> dict[str, list[WriteStatus]]:
        """Each begun table's rows written by its own task writers; the records no route
        takes to route.default, the dead-letter table, or a RoutingError before any write.
        `batch_df` is persisted (`_commit_batch_once`): each job reads it, not Kafka. On the
        direct path one job's tasks do it all (`_write_direct`)."""
        if self.direct:
            return self._write_direct(batch_df, ranges, instants)
        dead_table = DEAD_LETTERS in self.tables
        good = (
            batch_df.where(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN, RAW_VALUE_COLUMN)
            if dead_table
            else batch_df
        )
        taken = {name: route_condition(t.spec.route) for name, t in self.routed.items()}
        default = self.default_table
        others = [c for name, c in taken.items() if name != default] or [F.lit(False)]
        untaken = ~reduce(lambda a, b: a | b, others)
        if default is not None:  # without a route of its own it takes only the rest
            own = self.routed[default].spec.route
            taken[default] = untaken if own.takes_everything else taken[default] | untaken
        elif not dead_table:
            self._refuse_untaken(good, untaken)
        statuses: dict[str, list[WriteStatus]] = {}
        dead_instant = instants.get(DEAD_LETTERS)
        if dead_instant is not None:
            dead = dead_letters_of(batch_df)
            if self.default_table is None:
                dead = dead.unionByName(self._untaken_dead_letters(batch_df, untaken))
            # a dead-letter table ahead of the others skips what it has, as they do
            after = _rows_from(
                _skip_below(self.tables.ranges_of(self.tables[DEAD_LETTERS], ranges), ranges)
            )
            if after is not None:
                dead = dead.where(after)
            statuses[DEAD_LETTERS] = self._write(
                self.tables[DEAD_LETTERS].coordinator, dead, dead_instant
            )
        fanned = [
            name
            for name, table in self.routed.items()
            if instants.get(name) is not None and self._fans_out(table)
        ]
        if len(fanned) > 1:  # one Spark job writes them all
            statuses.update(self._write_fanned(good, fanned, instants, ranges))
        for name, table in self.routed.items():
            instant = instants.get(name)
            if instant is None or name in statuses:
                continue  # committed there already, or written by the fan-out job
            rows = good.where(taken[name])
            after = _rows_from(
                _skip_below(self.tables.ranges_of(self.tables[name], ranges), ranges)
            )
            if after is not None:
                rows = rows.where(after)
            statuses[name] = self._write_table(table, rows, instant)
        return statuses

    def _write_direct(
        self, batch_df: DataFrame, ranges: list[OffsetRange], instants: Instants
    ) -> dict[str, list[WriteStatus]]:
        """One Spark job whose tasks read and decode each piece of the batch's ranges once and
        write every begun table's rows (`RoutedDirectTask`); a record no route takes, with no
        route.default and no dead-letter table, is a RoutingError after the job (the begun
        instants are aborted, their files with them)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from lakesink.spark.direct import _relaxed, dead_letter_rows, spark_arrow_schema
        from lakesink.spark.source import encode_config, encode_secrets

        spark = batch_df.sparkSession
        first = next(iter(self.routed.values()))
        schema = spark_arrow_schema(spark, first.output_schema)
        required = tuple(f.name for f in first.output_schema.fields if not f.nullable)
        dead_schema = spark_arrow_schema(spark, from_arrow_schema(dead_letter_rows(self.cfg)))
        reader = DirectTask(
            encode_config(self.cfg),
            encode_secrets(self.cfg),
            rows=None,
            dead_letters=None,
            dead_letter_table=DEAD_LETTERS in self.tables,
            rows_schema=_relaxed(schema, required),
            dead_letter_schema=dead_schema,
            required=(),  # restored per table, on the rows it takes (`with_required`)
        )
        tables = []
        for name, table in self.routed.items():
            instant = instants.get(name)
            if instant is None:
                continue
            size = table.cfg["table.target.file.size.bytes"]
            tables.append(
                FannedTable(
                    name,
                    table.plugin.task_target(table.coordinator, instant.value, size),
                    required,
                    _skip_below(self.tables.ranges_of(self.tables[name], ranges), ranges),
                )
            )
        dead = None
        dead_instant = instants.get(DEAD_LETTERS)
        if dead_instant is not None:
            coordinator = self.tables[DEAD_LETTERS].coordinator
            size = self.cfg["table.target.file.size.bytes"]
            dead = FannedTable(
                DEAD_LETTERS,
                self.plugin.task_target(coordinator, dead_instant.value, size),
                (),
                _skip_below(self.tables.ranges_of(self.tables[DEAD_LETTERS], ranges), ranges),
            )
        routes = {name: t.spec.route for name, t in self.routed.items()}
        task = RoutedDirectTask(reader, tables, dead, routes, self.default_table)
        per_task = self.cfg["kafka.max.records.per.task"]
        pieces = task_pieces(ranges, per_task)
        statuses: dict[str, list[WriteStatus]] = {t.name: [] for t in tables}
        if dead is not None:
            statuses[DEAD_LETTERS] = []
        if not pieces:
            return statuses
        sc = spark.sparkContext
        # the pieces gathered into as few tasks as keep every core busy (`read_groups`): a
        # table per topic means a piece per table, and each task is a fixed cost
        groups = read_groups(pieces, per_task, max(1, sc.defaultParallelism))
        sc.setJobDescription(
            f"lakesink: read, decode, route and write {len(pieces)} Kafka range(s) into "
            f"{len(statuses)} table(s) in {len(groups)} task(s)"
        )
        try:
            results = sc.parallelize(groups, len(groups)).mapPartitions(task).collect()
        finally:
            sc.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
        untaken: list[tuple[str, int, int]] = []
        for text in results:
            result = json.loads(text)
            for name, status in result["statuses"].items():
                statuses[name].append(WriteStatus.from_json(status))
            if result["untaken"] is not None:
                untaken.append(tuple(result["untaken"]))
        if untaken:
            topic, partition, offset = min(untaken)
            raise RoutingError(_untaken_message(topic, partition, offset))
        return statuses

    def _fans_out(self, table: RoutedTable) -> bool:
        """Whether `table`'s rows can be written by the one fan-out job: appended, prepared as
        the ingestion's (no transformation or date partition of its own)."""
        own = ("transform.sql", "transform.python", "transform.arrow", "table.partition.date.from")
        return table.cfg["write.operation"] == "append" and all(
            table.cfg[k] == self.cfg[k] for k in own
        )

    def _write_fanned(
        self, good: DataFrame, names: Sequence[str], instants: Instants, ranges: list[OffsetRange]
    ) -> dict[str, list[WriteStatus]]:
        """The tables `names` written by one Spark job (`FanOutTaskWriter`)."""
        fields = tuple(dict.fromkeys(f for n in names for f in self.routed[n].partition_fields))
        prepared = prepare_rows(good, self.cfg, self.transform, fields)
        tables = []
        for name in names:
            table = self.routed[name]
            instant = instants[name]
            assert instant is not None
            size = table.cfg["table.target.file.size.bytes"]
            tables.append(
                FannedTable(
                    name,
                    table.plugin.task_target(table.coordinator, instant.value, size),
                    tuple(f.name for f in table.output_schema.fields if not f.nullable),
                    _skip_below(self.tables.ranges_of(self.tables[name], ranges), ranges),
                )
            )
        routes = {name: t.spec.route for name, t in self.routed.items()}
        writer = FanOutTaskWriter(tables, routes, self.default_table)
        statuses: dict[str, list[WriteStatus]] = {name: [] for name in names}
        for row in prepared.mapInArrow(writer, "table string, status string").collect():
            statuses[row["table"]].append(WriteStatus.from_json(json.loads(row["status"])))
        return statuses

    def _refuse_untaken(self, good: DataFrame, untaken: Column) -> None:
        first = good.where(untaken).select("kafka_topic", "kafka_partition", "kafka_offset")
        found = first.limit(1).collect()
        if found:
            topic, partition, offset = found[0]
            raise RoutingError(_untaken_message(topic, partition, offset))

    @staticmethod
    def _untaken_dead_letters(cached: DataFrame, untaken: Column) -> DataFrame:
        """The decoded records no route takes, as dead letters with the reason."""
        rows = cached.where(F.col(ERROR_COLUMN).isNull() & untaken)
        return dead_letters_of(rows.withColumn(ERROR_COLUMN, F.lit(UNTAKEN_REASON)))

    def _write_table(self, table: RoutedTable, rows: DataFrame, instant: Any) -> list[WriteStatus]:
        prepared = prepare_rows(rows, table.cfg, table.transform, table.partition_fields)
        required = tuple(f.name for f in table.output_schema.fields if not f.nullable)
        return self._write(
            table.coordinator,
            prepared,
            instant,
            required,
            plugin=table.plugin,
            size=table.cfg["table.target.file.size.bytes"],
        )

    def _schema_for(self, role: str, statuses: Sequence[WriteStatus], df: DataFrame) -> TableSchema:
        """The schema table `role`'s commit records, as for one table with its own plugin."""
        if role == DEAD_LETTERS:
            return super()._schema_for(role, statuses, df)
        table = self.routed[role]
        return commit_schema_of(
            table.plugin,
            table.coordinator,
            statuses,
            lambda: rows_arrow(df, table.output_schema),
        )


def _untaken_message(topic: str, partition: int, offset: int) -> str:
    return (
        f"record {topic}:{partition}@{offset} matches no table's route; set "
        "route.default to a table, or errors.tolerance=all with "
        "errors.deadletter.table to keep such records as dead letters"
    )


UNTAKEN_REASON = "no table's route matches this record"
"""The error of a dead letter no table's route takes."""

DIRECT_ROUTE_TYPES = ("string", "byte", "short", "integer", "long", "boolean")
"""The Spark types of a route.field the direct path's tasks route by: their text is the same in
Arrow and in Spark (a float's or a timestamp's is not: those batches take the DataFrame)."""


def check_routes_cover(tables: Sequence[RoutedTable], topics: Sequence[str]) -> None:
    """Warn about a topic no table's route can take (its records go to route.default, the
    dead letters, or fail the batch)."""
    for topic in topics:
        if not any(t.spec.route.takes_topic(topic) for t in tables):
            log.warning("no table's route takes records of topic %s", topic)


def route_mask(batch: pa.RecordBatch | pa.Table, route: Route) -> pa.Array:
    """`route_condition` on decoded Arrow rows (what `lakesink verify` expects in a table):
    per row whether the route takes it."""
    n = batch.num_rows
    taken = pa.array(np.ones(n, dtype=bool))
    topic = batch.column("kafka_topic")
    if route.topics:
        taken = pc.and_(taken, pc.is_in(topic, value_set=pa.array(list(route.topics))))
    elif route.topic_pattern is not None:
        taken = pc.and_(taken, pc.match_substring_regex(topic, _full(route.topic_pattern)))
    if route.field is not None and route.regex is not None:
        text = _arrow_field_text(batch, route.field)
        taken = pc.and_(taken, pc.match_substring_regex(text, _full(route.regex)))
    return pc.fill_null(taken, False)


def _arrow_field_text(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    if name == KAFKA_KEY_FIELD:
        keys = batch.column(KAFKA_KEY_FIELD).to_pylist()
        # typed: a batch whose keys are all null is still text (else Arrow's null type)
        texts = [None if k is None else k.decode("utf-8", "replace") for k in keys]
        return pa.array(texts, pa.string())
    if name.startswith(HEADER_PREFIX):
        header = name[len(HEADER_PREFIX) :]
        values = []
        for headers in batch.column("kafka_headers").to_pylist():
            found = [h["value"] for h in headers or () if h["key"] == header]
            last = found[-1] if found else None
            values.append(None if last is None else last.decode("utf-8", "replace"))
        return pa.array(values, pa.string())
    column = batch.column(name)
    if pa.types.is_boolean(column.type):  # as Spark casts a boolean to text
        return pc.if_else(column, "true", "false")
    return column.cast(pa.string())


def route_masks(
    batch: pa.RecordBatch | pa.Table, routes: Mapping[str, Route], default: str | None
) -> dict[str, pa.Array]:
    """Per table, the rows of `batch` it takes: its route's (`route_mask`); the route.default
    table also takes what no other table's route takes (only that, without a route of its
    own), as the Spark side does (`RoutingSink._write_tables`)."""
    masks = {name: route_mask(batch, route) for name, route in routes.items()}
    if default is not None:
        others = [m for name, m in masks.items() if name != default]
        untaken = (
            pc.invert(reduce(pc.or_, others)) if others else pa.array(np.ones(batch.num_rows, bool))
        )
        own = masks[default]
        masks[default] = untaken if routes[default].takes_everything else pc.or_(own, untaken)
    return masks


def route_split(
    batch: pa.RecordBatch | pa.Table, routes: Mapping[str, Route], default: str | None
) -> tuple[dict[str, pa.Array], pa.Array]:
    """Per table the rows of `batch` it takes (`route_masks`), and the rows no table takes:
    without route.default, the dead letters (or the RoutingError) of the DataFrame path's
    `untaken`; with it, none."""
    masks = route_masks(batch, routes, default)
    if not masks:
        return masks, pa.array(np.ones(batch.num_rows, bool))
    return masks, pc.invert(reduce(pc.or_, masks.values()))


def routed_coordinates(
    cfg: LakesinkConfig, name: str, ranges: Sequence[OffsetRange]
) -> set[tuple[str, int, int]]:
    """The Kafka records of `ranges` that table `name` of the many-table ingestion `cfg`
    takes (`route_masks`), read and decoded as the tasks read them: what `lakesink verify`
    expects in that table."""
    from lakesink.spark.source import batch_coordinates, read_decoded
    from lakesink.spark.table_offsets import all_table_configs

    routes = {spec.name: spec.route for spec, _ in all_table_configs(cfg)}
    out: set[tuple[str, int, int]] = set()
    for batch in read_decoded(cfg, ranges):
        mask = route_masks(batch, routes, cfg["route.default"])[name]
        out.update(batch_coordinates(batch.filter(mask)))
    return out


@dataclass(frozen=True, slots=True)
class FannedTable:
    """A table the fan-out writer writes: its name, task target, required columns, and the
    partitions whose rows below an offset it has committed already (`ranges_after`: None,
    the whole partition)."""

    name: str
    target: TaskTarget
    required: tuple[str, ...]
    skip_below: Mapping[tuple[str, int], int | None]


class FanOutTaskWriter:
    """A picklable `mapInArrow` function writing each row into every table whose route takes
    it, in one Spark job for many tables (`RoutingSink`): the routes evaluated on the task's
    Arrow batches (`route_masks`), one table writer per table and task attempt, one status row
    per table."""

    def __init__(
        self, tables: Sequence[FannedTable], routes: Mapping[str, Route], default: str | None
    ) -> None:
        self.tables = tuple(tables)
        self.routes = dict(routes)
        self.default = default

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        attempt = task_attempt(ctx)
        outputs = {t.name: TableOutput(t.target, attempt) for t in self.tables}
        for batch in batches:
            if not batch.num_rows:
                continue
            masks = route_masks(batch, self.routes, self.default)
            for table in self.tables:
                mask = _after_committed(batch, masks[table.name], table.skip_below)
                rows = batch.filter(mask)
                if rows.num_rows:
                    outputs[table.name].write(with_required(rows, table.required))
        statuses = [
            {"table": name, "status": json.dumps(out.close().to_json())}
            for name, out in outputs.items()
        ]
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield pa.RecordBatch.from_pylist(statuses, _FANNED_STATUS)


_FANNED_STATUS = pa.schema([("table", pa.string()), ("status", pa.string())])


def _after_committed(
    batch: pa.RecordBatch, mask: pa.Array, skip_below: Mapping[tuple[str, int], int | None]
) -> pa.Array:
    """`mask` less the rows `_skip_below` skips (as Arrow, in the fan-out job's tasks)."""
    for (topic, partition), start in skip_below.items():
        here = pc.and_(
            pc.equal(batch.column("kafka_topic"), topic),
            pc.equal(batch.column("kafka_partition"), partition),
        )
        if start is not None:
            here = pc.and_(here, pc.less(batch.column("kafka_offset"), start))
        mask = pc.and_(mask, pc.invert(here))
    return mask


def _skip_below(
    ranges: Sequence[OffsetRange], planned: Sequence[OffsetRange]
) -> dict[tuple[str, int], int | None]:
    """The rows a table takes of the batch's `planned` ranges, `ranges` being its own (after
    its committed offsets): per planned partition it does not take whole, the offset its rows
    start at (None: none of them); empty when it takes them all. Applied by Spark
    (`_rows_from`) and in the fan-out job's tasks (`_after_committed`)."""
    starts = {r.partition: r.start for r in ranges}
    out: dict[tuple[str, int], int | None] = {}
    for r in planned:
        start = starts.get(r.partition)
        if start != r.start:
            out[(r.partition.topic, r.partition.partition)] = start
    return out


class RoutedDirectTask:
    """Routing on the direct task path (`RDD.mapPartitions`, `RoutingSink._write_direct`):
    reads and decodes the Kafka ranges of its Spark partition once (a group of the batch's
    pieces, `read_groups`; `reader`: a `DirectTask`'s reading), routes each Arrow batch
    (`route_split`) and writes every table's rows from its own committed offset on
    (`skip_below`, as `BatchTables(skip_committed=True)` begins it), the records that fail to
    decode and those no route takes into the dead-letter table (`dead`, None: no instant
    there). A table's writer opens on its first row: a table no row of this task reaches gets
    no status from it. Yields one JSON object: the statuses by table, and the first record no
    route takes when there is nowhere to put it (`untaken`, else None)."""

    def __init__(
        self,
        reader: DirectTask,
        tables: Sequence[FannedTable],
        dead: FannedTable | None,
        routes: Mapping[str, Route],
        default: str | None,
    ) -> None:
        self.reader = reader
        self.tables = tuple(tables)
        self.dead = dead
        self.routes = dict(routes)
        self.default = default
        self._takers: dict[str, frozenset[str]] = {}  # per topic, the routes taking it

    def __call__(self, groups: Iterable[Sequence[OffsetRange]]) -> Iterator[str]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        attempt = task_attempt(ctx)
        pieces = [piece for group in groups for piece in group]
        outputs: dict[str, TableOutput] = {}

        def write(table: FannedTable, rows: pa.RecordBatch) -> None:
            out = outputs.get(table.name)
            if out is None:
                out = outputs[table.name] = TableOutput(table.target, attempt)
            out.write(rows)

        # no route.default and no dead-letter table: a record no route takes fails the batch
        refuse = self.default is None and not self.reader.dead_letter_table
        untaken_at: list[Any] | None = None
        failed: list[Any] = []
        for batch in self.reader.rows_of(pieces, failed):
            # only the routes that can take the batch's topics (a range's batch has one):
            # with a table per topic, one route a batch rather than every table's
            routes = self._routes_for(pc.unique(batch.column("kafka_topic")).to_pylist())
            masks, untaken = route_split(batch, routes, self.default)
            for table in self.tables:
                if table.name not in masks:
                    continue  # its route takes none of these topics
                rows = batch.filter(_after_committed(batch, masks[table.name], table.skip_below))
                if rows.num_rows:
                    write(table, with_required(rows, table.required))
            if self.default is not None:
                continue
            if refuse:
                if untaken_at is None and pc.any(untaken).as_py():
                    first = batch.filter(untaken).slice(0, 1).to_pylist()[0]
                    untaken_at = [first[c] for c in _COORDINATES]
            elif self.dead is not None:
                rows = batch.filter(_after_committed(batch, untaken, self.dead.skip_below))
                if rows.num_rows:
                    write(self.dead, untaken_dead_letters(rows, self.reader.dead_letter_schema))
        if self.dead is not None:
            kept = [f for f in failed if _kept(f.partition, f.offset, self.dead.skip_below)]
            if kept:
                write(self.dead, dead_letter_batch(kept, self.reader.dead_letter_schema))
        statuses = {name: out.close().to_json() for name, out in outputs.items()}
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield json.dumps({"statuses": statuses, "untaken": untaken_at})

    def _routes_for(self, topics: Sequence[str]) -> dict[str, Route]:
        """The routes whose topic test takes one of `topics` (evaluated as `route_mask` does,
        once per topic), and route.default's: the others' masks are all false, so leaving
        them out changes no table's rows and not the rows no route takes."""
        names: set[str] = set() if self.default is None else {self.default}
        for topic in topics:
            takers = self._takers.get(topic)
            if takers is None:
                one = pa.table({"kafka_topic": pa.array([topic], pa.string())})
                takers = self._takers[topic] = frozenset(
                    name
                    for name, route in self.routes.items()
                    if route_mask(one, replace(route, field=None, regex=None))[0].as_py()
                )
            names |= takers
        return {name: route for name, route in self.routes.items() if name in names}


_COORDINATES = ("kafka_topic", "kafka_partition", "kafka_offset")


def _kept(partition: Any, offset: int, skip_below: Mapping[tuple[str, int], int | None]) -> bool:
    """Whether the record at `offset` of `partition` is one a table takes by `skip_below`."""
    key = (partition.topic, partition.partition)
    if key not in skip_below:
        return True
    start = skip_below[key]
    return start is not None and offset >= start


def untaken_dead_letters(rows: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Decoded rows no route takes as dead letters (`schema`), as the DataFrame path makes
    them (`_untaken_dead_letters`): their Kafka columns, no raw value (only records that
    failed to decode keep theirs), the reason."""
    n = rows.num_rows
    columns = []
    for f in schema:
        if f.name == "kafka_value":
            columns.append(pa.nulls(n, f.type))
        elif f.name == "error":
            columns.append(pa.array([UNTAKEN_REASON] * n, f.type))
        else:
            columns.append(rows.column(f.name).cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
