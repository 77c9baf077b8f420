"""The `lakesink-kafka` streaming source: a PySpark Python Data Source reading Kafka offset ranges.

Offsets are planned on the driver with explicit partition assignment (never a consumer group).
The offset Spark stores for a batch is `{"v": 1, "ranges": {"topic:partition": [start, end]}}`:
it carries the batch's start AND end, so the batch's exact ranges can be read back from Spark's
offset log (`offsets/N`) by the committing sink — including empty tails and gaps from transaction
markers, which no record in the data reveals.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from lakesink.config import LakesinkConfig, build_config
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.security import Secret

if TYPE_CHECKING:
    from lakesink.kafka.client import PlanningClients

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink-kafka"
CONFIG_OPTION = (
    "lakesink.config"  # the whole validated config, as JSON (option keys are lower-cased)
)
SECRETS_OPTION = "lakesink.secrets"
"""The config's secrets, as JSON, apart from CONFIG_OPTION: whatever shows the configuration
option never shows a secret (the query plan Spark prints on failure shows neither)."""
OFFSET_FORMAT_VERSION = 1
BROKER_UNAVAILABLE_S = 60.0
"""How long planning asks again while the broker cannot be reached (a broker restart)."""


def encode_config(cfg: LakesinkConfig) -> str:
    """The config without its secrets, as JSON (CONFIG_OPTION); see encode_secrets."""
    return json.dumps(
        {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in cfg.values.items()
            if not isinstance(v, Secret)
        }
    )


def encode_secrets(cfg: LakesinkConfig) -> str:
    """The config's secrets, as JSON (SECRETS_OPTION): tasks on other machines need them."""
    return json.dumps({k: v.reveal() for k, v in cfg.values.items() if isinstance(v, Secret)})


def decode_config(options: Mapping[str, str]) -> LakesinkConfig:
    raw = json.loads(options[CONFIG_OPTION])
    secrets = json.loads(options.get(SECRETS_OPTION) or "{}")
    raw.update({k: Secret(v, "driver") for k, v in secrets.items()})
    return build_config(raw)


def ranges_to_offset(ranges: Mapping[TopicPartition, tuple[int, int]]) -> dict[str, Any]:
    return {
        "v": OFFSET_FORMAT_VERSION,
        "ranges": {tp.key(): [s, e] for tp, (s, e) in sorted(ranges.items())},
    }


def offset_to_ranges(offset: Mapping[str, Any]) -> list[OffsetRange]:
    """The planned ranges of one batch from its stored offset (see the module docstring)."""
    if offset.get("v") != OFFSET_FORMAT_VERSION:
        raise ValueError(f"offset {offset!r} is not a lakesink-kafka offset of version 1")
    return [
        OffsetRange(TopicPartition.parse(k), int(se[0]), int(se[1]))
        for k, se in sorted(offset["ranges"].items())
    ]


def offset_positions(offset: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """Where the next batch starts: the end of every range."""
    return {r.partition: r.end for r in offset_to_ranges(offset)}


class KafkaRangePartition(InputPartition):
    """One Spark task: the offsets [start, end) of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def offset_range(self) -> OffsetRange:
        return OffsetRange(TopicPartition(self.topic, self.partition), self.start, self.end)

    def __repr__(self) -> str:
        return f"KafkaRangePartition({self.topic}:{self.partition} [{self.start}, {self.end}))"


ERROR_COLUMN = "_lakesink_error"
RAW_VALUE_COLUMN = "_lakesink_raw_value"
DEAD_LETTER_COLUMNS = (
    pa.field(ERROR_COLUMN, pa.string()),
    pa.field(RAW_VALUE_COLUMN, pa.binary()),
)


def declared_arrow_schema(cfg: LakesinkConfig) -> pa.Schema:
    """The rows as the user declared them: Kafka metadata columns, then the value columns with
    their declared nullability (a JSON `NOT NULL` column, an Avro field without a null union)."""
    from lakesink.kafka.reader import output_schema

    return output_schema(value_deserializer(cfg))


def source_arrow_schema(cfg: LakesinkConfig) -> pa.Schema:
    """What the source yields to Spark: the declared schema with every top-level value column
    nullable, and with a dead-letter table two more columns set only on records that failed to
    decode. Dead-letter rows carry nulls in the value columns, and Spark refuses a null in a
    non-nullable column before any split; the writer restores the declared nullability on the
    main rows (see `CommittingSink`) and refuses a null there, naming column and record."""
    from lakesink.kafka.reader import METADATA_COLUMNS

    declared = declared_arrow_schema(cfg)
    schema = pa.schema(
        [f if f.name in METADATA_COLUMNS else f.with_nullable(True) for f in declared]
    )
    if cfg["errors.deadletter.table"]:
        schema = pa.schema([*schema, *DEAD_LETTER_COLUMNS])
    return schema


def _dead_letter_rows(schema: pa.Schema, failed: list[Any]) -> pa.RecordBatch:
    """Failed records as source rows: metadata and error set, value columns null."""
    from lakesink.kafka.dead_letters import headers_array, timestamps_array

    given = {
        "kafka_topic": pa.array([f.partition.topic for f in failed], pa.string()),
        "kafka_partition": pa.array([f.partition.partition for f in failed], pa.int32()),
        "kafka_offset": pa.array([f.offset for f in failed], pa.int64()),
        "kafka_timestamp": timestamps_array([f.timestamp_ms for f in failed]),
        "kafka_key": pa.array([f.key for f in failed], pa.binary()),
        "kafka_headers": headers_array([list(f.headers) or None for f in failed]),
        ERROR_COLUMN: pa.array([f.error for f in failed], pa.string()),
        RAW_VALUE_COLUMN: pa.array([f.value for f in failed], pa.binary()),
    }
    columns = [
        given[f.name].cast(f.type) if f.name in given else pa.nulls(len(failed), f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_decoded(cfg: LakesinkConfig, ranges: Iterable[OffsetRange]) -> Iterator[pa.RecordBatch]:
    """The records of `ranges` read and decoded as the tasks read them, in batches with rows
    (what `lakesink verify` expects of a transformation or a route); records that cannot be
    decoded are left out (dead letters, or refused by the ingestion) and sent nowhere."""
    from lakesink.kafka.reader import read_range

    for r in ranges:
        for batch in read_range(
            cfg["kafka.bootstrap.servers"],
            r,
            isolation_level=cfg["kafka.isolation.level"],
            deserializer=value_deserializer(cfg),
            consumer_config=cfg.consumer_config,
            errors_tolerance="all",
            on_dead_letter=lambda _record: None,
        ):
            if batch.num_rows:
                yield batch


def batch_coordinates(batch: pa.RecordBatch | pa.Table) -> Iterator[tuple[str, int, int]]:
    """The (topic, partition, offset) of each row."""
    return zip(
        batch.column("kafka_topic").to_pylist(),
        batch.column("kafka_partition").to_pylist(),
        batch.column("kafka_offset").to_pylist(),
        strict=True,
    )


def value_deserializer(cfg: LakesinkConfig) -> Any:
    """The deserializer of the record values `cfg` declares (imported lazily: a task that
    never decodes pays nothing): with write.operation=cdc, the change-stream deserializer, whose
    rows carry the operation (lakesink.kafka.changes). schema.field.mapping renames the
    decoded fields here, once for every decoder (lakesink.kafka.field_mapping): the decoders
    work in source names, the keys that name columns in mapped names."""
    from lakesink.config.records import registry_settings
    from lakesink.config.table import field_mapping_of
    from lakesink.kafka.field_mapping import mapped_values, source_names

    mapping = field_mapping_of(cfg.values)
    if cfg["write.operation"] == "cdc":
        from lakesink.kafka.changes import ChangeDeserializer

        mutation = cfg.settings.mutation
        registry = registry_settings(cfg.values)
        envelopes = None
        if registry is not None:  # each value's writer schema from the registry
            from lakesink.kafka.registry_changes import registry_envelopes

            envelopes = registry_envelopes(
                registry,
                cdc_format=mutation.cdc_format,
                schema=cfg["value.schema"],
                schema_file=cfg["value.schema.file"],
            )
        ordering = mutation.ordering_field
        changes = ChangeDeserializer.configured(
            value_format=cfg["value.format"],
            schema=cfg["value.schema"],
            schema_file=cfg["value.schema.file"],
            key_columns=source_names(mapping, cfg.settings.table.record_key_fields),
            cdc_format=mutation.cdc_format,
            ordering_field=None if ordering is None else mapping.source(ordering),
            op_field=mapping.source(mutation.op_field),
            op_values=mutation.op_values,
            avro_wire_format=cfg["value.avro.wire.format"],
            avro_schema_ids=cfg["value.avro.schema.ids"],
            envelopes=envelopes,
        )
        return mapped_values(changes, mapping)
    from lakesink.kafka.deserializers import make_deserializer
    from lakesink.spark.registry_columns import registry_evolution

    values = make_deserializer(
        cfg["value.format"],
        schema=cfg["value.schema"],
        schema_file=cfg["value.schema.file"],
        avro_wire_format=cfg["value.avro.wire.format"],
        avro_schema_ids=cfg["value.avro.schema.ids"],
        registry=registry_settings(cfg.values),
        evolution=registry_evolution(cfg),
    )
    registry = registry_settings(cfg.values)
    if cfg["key.format"] != "raw" and registry is not None:  # the key's fields join the row
        from lakesink.errors import ConfigError
        from lakesink.kafka.ddl import ddl_to_arrow
        from lakesink.kafka.registry_keys import RegistryKeys

        if cfg["key.schema"] is None:
            raise ConfigError(
                f"key.format={cfg['key.format']}: the key's columns were not fixed (key.schema); "
                "the ingestion pins them from the key subject when it starts"
            )
        values = RegistryKeys(values, cfg["key.format"], ddl_to_arrow(cfg["key.schema"]), registry)
    values = mapped_values(values, mapping)
    if cfg["write.operation"] == "upsert":  # a record without a key is a dead letter
        from lakesink.kafka.changes import KeyedValues

        return KeyedValues(values, cfg.settings.table.record_key_fields)
    return values


class KafkaStreamReader(DataSourceStreamReader):
    """Plans offset ranges on the driver; reads them in tasks."""

    def __init__(self, cfg: LakesinkConfig) -> None:
        self.cfg = cfg
        self._topic_ids: dict[str, str] | None = None  # Kafka topic ids this query reads
        self._clients: PlanningClients | None = None

    # --- driver side -------------------------------------------------------------------------
    def _kafka(self) -> PlanningClients:
        """The planning clients, kept across batches: this reader lives as long as the query
        (in Spark's source runner process), and new clients per batch cost a connection and
        its metadata three times a batch."""
        from lakesink.kafka.client import PlanningClients

        if self._clients is None:
            self._clients = PlanningClients(
                self.cfg["kafka.bootstrap.servers"],
                isolation_level=self.cfg["kafka.isolation.level"],
                admin_extra=self.cfg.kafka_client_config,
                consumer_extra=self.cfg.consumer_config,
                unavailable_s=BROKER_UNAVAILABLE_S,
            )
        return self._clients

    def _partitions(self) -> list[TopicPartition]:
        from lakesink.kafka.client import list_partitions

        return list_partitions(
            self.cfg["kafka.bootstrap.servers"],
            topics=list(self.cfg["kafka.topics"]) or None,
            pattern=self.cfg["kafka.topic.pattern"],
            extra=self.cfg.kafka_client_config,
            unavailable_s=BROKER_UNAVAILABLE_S,
            admin=self._kafka().admin(),
        )

    def _check_topic_ids(self, partitions: Sequence[TopicPartition]) -> None:
        """Refuse a topic deleted and re-created under the same name: its id differs from the
        one the table's offsets (or this query's earlier batches) belong to."""
        from lakesink.errors import DataLossError
        from lakesink.kafka.client import topic_ids
        from lakesink.spark.table_offsets import committed_topic_ids_of

        current = topic_ids(
            self.cfg["kafka.bootstrap.servers"],
            {tp.topic for tp in partitions},
            extra=self.cfg.kafka_client_config,
            admin=self._kafka().admin(),
        )
        if self._topic_ids is None:
            self._topic_ids = committed_topic_ids_of(self.cfg)
        for topic, now in sorted(current.items()):
            before = self._topic_ids.get(topic)
            if before is not None and before != now:
                raise DataLossError(
                    f"topic {topic!r} was deleted and re-created: writer {self.cfg.writer_id}'s "
                    f"offsets in {self.cfg['table.path']} belong to the topic with id {before}, "
                    f"the topic now has id {now}. Nothing of the new topic is ingested; to "
                    "ingest it from its start, use another writer.id"
                )
        self._topic_ids.update(current)

    def _table_offsets(self) -> WriterOffsets:
        """The writer's committed offsets: its table's, or the lowest over many tables."""
        from lakesink.spark.table_offsets import committed_offsets_of

        return committed_offsets_of(self.cfg)

    def _starts(
        self, known: Mapping[TopicPartition, int], partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Start positions of partitions not in `known`: the table's committed offsets for this
        writer, else kafka.starting.offsets (new partitions found later start at earliest)."""
        from lakesink.kafka.planning import resolve_start

        new = [tp for tp in partitions if tp not in known]
        if not new:
            return {}
        committed = self._table_offsets()
        return resolve_start(
            committed,
            new,
            self.cfg["kafka.starting.offsets"] if not known else "earliest",
            self._kafka().offsets(),
            fail_on_data_loss=self.cfg["kafka.fail.on.data.loss"],
        )

    def initialOffset(self) -> dict[str, Any]:
        try:
            return self._initial_offset()
        except BaseException:
            self._reset_clients()
            raise

    def _initial_offset(self) -> dict[str, Any]:
        partitions = self._partitions()
        self._check_topic_ids(partitions)
        starts = self._starts({}, partitions)
        log.info("lakesink-kafka: writer %s starts at %s", self.cfg.writer_id, starts)
        return ranges_to_offset({tp: (s, s) for tp, s in starts.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.cfg["kafka.max.records.per.batch"]
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        try:
            return self._latest_offset(start, limit)
        except BaseException:
            self._reset_clients()
            raise

    def _reset_clients(self) -> None:
        """After a failed planning call: the next one starts from new clients."""
        if self._clients is not None:
            self._clients.reset()

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        from lakesink.kafka.planning import check_data_loss, plan_ends

        positions = offset_positions(start)
        partitions = self._partitions()
        self._check_topic_ids(partitions)
        positions.update(self._starts(positions, partitions))
        marks = self._kafka().offsets().watermarks(list(positions))
        positions = check_data_loss(
            positions, marks, fail_on_data_loss=self.cfg["kafka.fail.on.data.loss"]
        )
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = plan_ends(positions, {tp: hi for tp, (_lo, hi) in marks.items()}, cap)
        if all(ends[tp] == s for tp, s in positions.items()) and set(positions) == set(
            offset_positions(start)
        ):
            return start  # nothing new: Spark runs no batch
        return ranges_to_offset({tp: (positions[tp], ends[tp]) for tp in positions})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        per_task = self.cfg["kafka.max.records.per.task"]
        return [
            KafkaRangePartition(
                piece.partition.topic, piece.partition.partition, piece.start, piece.end
            )
            for r in offset_to_ranges(end)
            if not r.is_empty
            for piece in r.split(per_task)
        ]

    # --- task side ---------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from lakesink.kafka.reader import read_range
        from lakesink.spark.worker_gc import freeze_worker_heap

        assert isinstance(partition, KafkaRangePartition)
        freeze_worker_heap()
        to_table = bool(self.cfg["errors.deadletter.table"])
        failed: list[Any] = []
        batches = read_range(
            self.cfg["kafka.bootstrap.servers"],
            partition.offset_range(),
            isolation_level=self.cfg["kafka.isolation.level"],
            deserializer=value_deserializer(self.cfg),
            consumer_config=self.cfg.consumer_config,
            producer_config=self.cfg.kafka_client_config,
            errors_tolerance=self.cfg["errors.tolerance"],
            dead_letter_topic=self.cfg["errors.deadletter.topic"],
            on_dead_letter=failed.append if to_table else None,
        )
        schema = source_arrow_schema(self.cfg)
        if not to_table:
            # the same columns; only the value columns' nullability is relaxed (Spark wants
            # the schema exactly)
            for batch in batches:
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
            return
        for batch in batches:  # good rows: the dead-letter columns are null
            extra = [pa.nulls(batch.num_rows, f.type) for f in DEAD_LETTER_COLUMNS]
            yield pa.RecordBatch.from_arrays([*batch.columns, *extra], schema=schema)
        if failed:
            yield _dead_letter_rows(schema, failed)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the table, not Kafka, holds the committed offsets."""

    def stop(self) -> None:
        """The query stopped: close the planning clients."""
        if self._clients is not None:
            self._clients.close()
            self._clients = None


class KafkaDataSource(DataSource):
    """`spark.readStream.format("lakesink-kafka").option("lakesink.config", json)`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(source_arrow_schema(decode_config(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(decode_config(self.options))
