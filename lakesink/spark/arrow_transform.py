"""`transform.arrow`: a user function over Arrow record batches, applied inside the Spark tasks.

The function ('module:function') takes a `pyarrow.RecordBatch` of the decoded Kafka records and
returns a `pyarrow.RecordBatch` (or `pyarrow.Table`). Unlike `transform.sql` and
`transform.python`, which work on a Spark DataFrame, it needs no JVM: the direct task path
applies it to each decoded batch in the task that read it, and the DataFrame path
(`write.path=dataframe`) applies it with `mapInArrow`. Both give it the same input schema and
hold its output to the same schema, so both write the same rows.

The driver learns the output schema before any task runs by calling the function once on an
empty batch of the input schema (`plan_arrow_transform`); every later call must return exactly
those columns (types are cast where the cast is safe). The function must therefore be a pure
per-record function that takes an empty batch; it may filter rows and add or drop columns, but
must keep the Kafka coordinate columns (`KEPT_COLUMNS`, and the Hudi record key columns) as it
got them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.config import LakesinkConfig
from lakesink.errors import ConfigError, RecordError
from lakesink.formats import plugin_of
from lakesink.protocol.offsets import OffsetRange

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

KEY = "transform.arrow"
KEPT_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset")
"""Coordinates the function must keep unchanged: `lakesink verify` checks every Kafka record by
them, a refused record is named by them, and they are the Hudi record key by default."""
EXPECTED = (
    "expected 'module:function' importable on the driver and executors, a function taking a "
    "pyarrow.RecordBatch and returning a pyarrow.RecordBatch or pyarrow.Table"
)

ArrowFunction = Callable[[pa.RecordBatch], Any]
Coordinate = tuple[str, int, int]
_loaded: dict[str, ArrowFunction] = {}  # per process: a task imports the function once


def load_arrow_function(spec: str) -> ArrowFunction:
    """The function `spec` ('module:function') names; a ConfigError when it cannot be had."""
    if spec in _loaded:
        return _loaded[spec]
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{KEY}={spec!r} is not 'module:function'; {EXPECTED}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{KEY}={spec!r} cannot be loaded: {e}; {EXPECTED}") from e
    if not callable(fn):
        raise ConfigError(f"{KEY}={spec!r} is a {type(fn).__name__}, not a function; {EXPECTED}")
    _loaded[spec] = fn
    return fn  # type: ignore[no-any-return]


def input_arrow_schema(cfg: LakesinkConfig, zone: str = "UTC", large: bool = False) -> pa.Schema:
    """What the function is given: the source's rows (Kafka coordinates, metadata and the
    decoded value columns, without dead-letter columns) as Spark hands them to `mapInArrow`:
    the session's time zone, Spark's list field names, value columns nullable."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from lakesink.spark.source import DEAD_LETTER_COLUMNS, source_arrow_schema

    dead = {f.name for f in DEAD_LETTER_COLUMNS}
    rows = pa.schema([f for f in source_arrow_schema(cfg) if f.name not in dead])
    schema: pa.Schema = to_arrow_schema(
        from_arrow_schema(rows), timezone=zone, prefers_large_types=large
    )
    return schema


def session_arrow_options(spark: SparkSession) -> tuple[str, bool]:
    """The session's time zone and whether it asks for large string types in Arrow."""
    zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    return zone, large


@dataclass(frozen=True, slots=True)
class ArrowTransform:
    """The `transform.arrow` function with the schema it is given and the one it must return
    (Spark's Arrow form of its output for an empty batch). Picklable: tasks get the spec and
    import the function themselves."""

    spec: str
    input_schema: pa.Schema
    output_schema: pa.Schema

    def spark_schema(self) -> StructType:
        """The output as Spark rows (the `mapInArrow` result type)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        result: StructType = from_arrow_schema(self.output_schema)
        return result

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The function applied to one batch of decoded records (any schema that casts to the
        input schema), its result cast to the output schema. A failure refuses the batch
        with a RecordError naming the records (nothing of the batch is published)."""
        if batch.schema != self.input_schema:
            batch = _conform(batch, self.input_schema, f"the rows given to {KEY}")
        fn = load_arrow_function(self.spec)
        try:
            result = fn(batch)
        except Exception as e:
            raise RecordError(
                f"{KEY}={self.spec!r} failed on {_records(batch)}: {type(e).__name__}: "
                f"{_first_line(e)}; the batch is refused and nothing of it is published"
            ) from e
        out = _as_batch(result)
        if out is None:
            raise RecordError(
                f"{KEY}={self.spec!r} returned a {type(result).__name__} for {_records(batch)}; "
                "expected a pyarrow.RecordBatch or pyarrow.Table"
            )
        return _conform(out, self.output_schema, f"{KEY}={self.spec!r} on {_records(batch)}")

    def map_batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The function as `DataFrame.mapInArrow` takes it (the DataFrame path)."""
        for batch in batches:
            yield self(batch)


def plan_arrow_transform(
    cfg: LakesinkConfig, zone: str = "UTC", large: bool = False
) -> ArrowTransform:
    """The driver's check of `transform.arrow`, before any task runs: the function is
    imported and called on an empty batch of the input schema; its result must be Arrow, have
    columns Spark can hold, and keep the Kafka coordinates (`KEPT_COLUMNS`, and for a Hudi
    table `table.record.key.fields`) with their types. Each failure is a one-line ConfigError."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
    from pyspark.sql.types import StructField, StructType

    spec = str(cfg[KEY])
    fn = load_arrow_function(spec)
    given = input_arrow_schema(cfg, zone, large)
    empty = pa.RecordBatch.from_pylist([], schema=given)
    try:
        result = fn(empty)
    except Exception as e:
        raise ConfigError(
            f"{KEY}={spec!r} fails on an empty batch of the source columns "
            f"({', '.join(given.names)}): {type(e).__name__}: {_first_line(e)}; it must be a "
            "pure per-record function that also takes an empty batch"
        ) from None
    out = _as_batch(result)
    if out is None:
        raise ConfigError(f"{KEY}={spec!r} returned a {type(result).__name__}; {EXPECTED}")
    names = out.schema.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{KEY}={spec!r} returns the column(s) {', '.join(twice)} twice")
    kept = list(KEPT_COLUMNS)
    keys = plugin_of(cfg.settings).record_key_columns(cfg.settings)
    kept += [c for c in keys if c not in kept]
    lost = [
        c
        for c in kept
        if c not in names or (c in given.names and out.schema.field(c).type != given.field(c).type)
    ]
    if lost:
        raise ConfigError(
            f"{KEY}={spec!r} drops or changes the column(s) {', '.join(lost)}; the function "
            f"must return {', '.join(kept)} as it got them (lakesink checks and keys every "
            "Kafka record by them)"
        )
    fields = []
    for f in out.schema:
        try:
            kind = from_arrow_type(f.type)
        except Exception as e:  # pyspark's own type errors: the column Spark cannot hold
            raise ConfigError(
                f"{KEY}={spec!r} returns column {f.name!r} of type {f.type}, which Spark "
                f"cannot hold ({_first_line(e)}); cast it in the function, e.g. to int64 or string"
            ) from None
        fields.append(StructField(f.name, kind, f.nullable))
    output: pa.Schema = to_arrow_schema(
        StructType(fields), timezone=zone, prefers_large_types=large
    )
    return ArrowTransform(spec, given, output)


def _as_batch(result: Any) -> pa.RecordBatch | None:
    if isinstance(result, pa.RecordBatch):
        return result
    if isinstance(result, pa.Table):
        batches = result.combine_chunks().to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=result.schema) if not batches else None
    return None


def _conform(batch: pa.RecordBatch, schema: pa.Schema, what: str) -> pa.RecordBatch:
    """`batch` with exactly `schema`: its columns by name, each cast where the types differ and
    the cast is safe; else a RecordError naming the column."""
    names = batch.schema.names
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra or len(names) != len(schema.names):
        raise RecordError(
            f"{what}: the columns are {', '.join(names) or 'none'}; expected "
            f"{', '.join(schema.names)} (the columns returned for an empty batch)"
        )
    columns = []
    for f in schema:
        column = batch.column(f.name)
        if column.type != f.type:
            try:
                column = column.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise RecordError(
                    f"{what}: column {f.name!r} is {column.type}, which does not cast safely to "
                    f"{f.type} (its type for an empty batch): {_first_line(e)}"
                ) from None
        if not f.nullable and column.null_count:
            raise RecordError(
                f"{what}: column {f.name!r} holds nulls but was non-nullable for an empty batch"
            )
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _records(batch: pa.RecordBatch) -> str:
    """The Kafka records of `batch`, for an error message: 'records t:0 offsets 10-19'."""
    import pyarrow.compute as pc

    names = batch.schema.names
    if not batch.num_rows or not all(c in names for c in KEPT_COLUMNS):
        return f"a batch of {batch.num_rows} records"
    pairs = (
        pa.table({"t": batch.column("kafka_topic"), "p": batch.column("kafka_partition")})
        .group_by(["t", "p"])
        .aggregate([])
    )
    where = ", ".join(
        f"{t}:{p}" for t, p in zip(pairs["t"].to_pylist(), pairs["p"].to_pylist(), strict=True)
    )
    bounds = pc.min_max(batch.column("kafka_offset")).as_py()
    return f"{batch.num_rows} records of {where} (offsets {bounds['min']}-{bounds['max']})"


def _first_line(error: BaseException) -> str:
    text = str(error)
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)


def kept_coordinates(cfg: LakesinkConfig, ranges: Iterable[OffsetRange]) -> set[Coordinate]:
    """The Kafka records of `ranges` that `transform.arrow` keeps, read and decoded as the tasks
    read them and given to the function in batches: what `lakesink verify` expects in the
    table. Records that cannot be decoded are not the function's (they are dead letters, or
    the ingestion refused them); nothing is produced to a dead-letter topic."""
    from lakesink.spark.source import batch_coordinates, read_decoded

    transform = plan_arrow_transform(cfg)
    out: set[Coordinate] = set()
    for batch in read_decoded(cfg, ranges):
        out.update(batch_coordinates(transform(batch)))
    return out
