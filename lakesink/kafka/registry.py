"""Record values framed by a schema registry (the Confluent wire format), decoded with their own
writer schema and resolved to the table's columns.

Every value is magic byte 0, a 4-byte big-endian schema id, then the payload. The writer schema
is fetched by that id from the registry (`schema.registry.url`, confluent-kafka's registry client)
and kept in a per-process cache of `schema.registry.cache.capacity` schemas. By format:

- ``avro``: the payload is Avro binary of the writer schema, read by avro.py's Avro-by-id path
  (its rules: no trailing bytes, valid UTF-8, values within their types).
- ``jsonschema``: the payload is one JSON object; it must validate against the writer's JSON
  Schema and then follow lakesink's JSON value rules for the table's columns (json_values.py).
- ``protobuf``: the payload starts with the message indexes (a zigzag-varint count, then that many
  zigzag varints; a single 0 for the file's first message) that pick the message type in the
  writer's file descriptor, which is built at run time from the registered, serialized
  ``FileDescriptorProto`` (and those of its references): no generated classes.

Resolution to the table (the columns, which spark/registry_columns.py fixes for a run from the
declared schema and the subject's registered versions): a column the writer schema lacks is
null (a NOT NULL column is then a failure). A writer schema the columns cannot hold as they are
(a field they lack, nested too, or a wider type: registry_schemas.uncovered) makes each of its
values a dead letter naming the field with `schema.evolution = off`; with `add-and-widen` it
ends the batch with one SchemaEvolutionError naming the id (`NOT_IN_COLUMNS`): the ingestion
notes the id and starts its query again over columns that take it in (a query's columns are
fixed: Spark's source schema is; spark/registry_columns.py, spark/pipeline.py).
A value that is not framed, an id the registry does not know, or a payload
that does not decode with its schema is a bad record with the reason. An unreachable registry is
retried with backoff for `schema.registry.retry.s`, then ends the batch with one
`SchemaRegistryError`; so do wrong credentials (at once).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from lakesink.errors import (
    ConfigError,
    MissingExtraError,
    SchemaEvolutionError,
    SchemaRegistryError,
)
from lakesink.kafka.avro import AvroDeserializer, BadAvroValue, avro_to_arrow_type
from lakesink.kafka.decoded import Decoded, concat_in_order, reason, rows_to_table
from lakesink.kafka.json_values import BadValue, JsonValueDecoder, parse_document
from lakesink.security import Secret

RegistryFormat = Literal["avro", "jsonschema", "protobuf"]
REGISTRY_FORMATS: tuple[RegistryFormat, ...] = ("avro", "jsonschema", "protobuf")

# HTTP statuses worth retrying (the registry is starting, overloaded, or behind a proxy that is)
# how the SchemaEvolutionError for a writer schema the run's columns lack goes on after its id
# (spark/registry_columns.py finds the id by it, in the text Spark forwards from a task)
NOT_IN_COLUMNS = "is not in this run's columns"

_RETRIABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_FIRST_WAIT_S = 0.2
_MAX_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """Where the registry is and how to reach it (the schema.registry.* keys)."""

    url: str
    user_info: Secret | None = None
    """`user:password` for HTTP basic authentication; revealed only to the client."""
    ca_location: str | None = None
    """A PEM file of the certificate authorities to trust for an https URL."""
    cache_capacity: int = 1000
    """How many writer schemas (by id) one process keeps."""
    retry_s: float = 60.0
    """How long an unreachable registry is retried before the batch fails."""

    def client_config(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "url": self.url,
            "cache.capacity": self.cache_capacity,
            "max.retries": 0,  # lakesink's own loop retries, for retry_s in all
        }
        if self.user_info is not None:
            conf["basic.auth.user.info"] = self.user_info.reveal()
        if self.ca_location:
            conf["ssl.ca.location"] = self.ca_location
        return conf


class BadRegistryValue(ValueError):
    """One value cannot be decoded with its writer schema or resolved to the columns."""


class UnknownSchemaId(ValueError):
    """The registry does not know the id a value is framed with."""


_clients: dict[RegistrySettings, Any] = {}
_clients_lock = threading.Lock()


def registry_client(settings: RegistrySettings) -> Any:
    """This process's client of the registry `settings` names (one per registry: every task of a
    Python worker shares its cache). A ``mock://`` URL gives confluent-kafka's in-memory mock,
    for tests."""
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as e:
                raise MissingExtraError(
                    f"schema.registry.url needs confluent-kafka's registry client ({e.name} is not "
                    "installed): pip install 'lakesink[registry]'"
                ) from e
            try:
                if settings.url.startswith("mock://"):
                    # confluent-kafka's in-memory mock (its new_client is newer than our oldest pin)
                    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
                        MockSchemaRegistryClient,
                    )

                    client = MockSchemaRegistryClient(settings.client_config())
                else:
                    client = SchemaRegistryClient(settings.client_config())
            except (ValueError, TypeError) as e:
                raise ConfigError(f"schema.registry.* settings are not valid: {e}") from e
            _clients[settings] = client
        return client


def _fetch(settings: RegistrySettings, fetch: Callable[[Any], Any], what: str) -> Any:
    """`fetch(client)` with the registry's transient failures retried (exponential backoff, for
    settings.retry_s in all); a 404 is UnknownSchemaId, anything else one SchemaRegistryError."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    client = registry_client(settings)
    deadline = time.monotonic() + settings.retry_s
    wait = _FIRST_WAIT_S
    while True:
        try:
            return fetch(client)
        except ClientError as e:
            status = e.http_status_code
            if status == 404:
                raise UnknownSchemaId(f"{what} is not in the registry ({e.error_message})") from e
            if status in (401, 403):
                raise SchemaRegistryError(
                    f"the schema registry {settings.url} refused {what} (HTTP {status}): check "
                    "schema.registry.basic.auth.user.info"
                ) from e
            if status not in _RETRIABLE_STATUS:
                raise SchemaRegistryError(
                    f"the schema registry {settings.url} answered HTTP {status} for {what}: "
                    f"{e.error_message}"
                ) from e
            last = f"HTTP {status}: {e.error_message}"
        except OSError as e:
            last = reason(e)
        except Exception as e:  # the HTTP client's transport errors (refused, TLS, timeouts)
            if type(e).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "ssl"):
                raise
            last = f"{type(e).__name__}: {reason(e)}"
        if time.monotonic() + wait > deadline:
            raise SchemaRegistryError(
                f"the schema registry {settings.url} could not be reached for {what} within "
                f"schema.registry.retry.s={settings.retry_s:g} ({last})"
            )
        time.sleep(wait)
        wait = min(wait * 2, _MAX_WAIT_S)


# --- the writer schemas, parsed once per id ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Writer:
    """A writer schema ready to decode with, and its top-level field names."""

    fields: tuple[str, ...]
    columns: pa.Schema
    decoder: Any
    validator: Any = None
    schema: Any = None
    """The parsed schema (Avro's JSON), for what the columns do not say (`connect.name`)."""


def _avro_writer(schema_id: int, schema_str: str) -> _Writer:
    """The Avro-by-id path of avro.py with this one id accepted: its framing, decoding and
    failure rules, with the writer schema in place of a configured one."""
    raw = json.loads(schema_str)
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise ValueError("the writer schema is not an Avro record")
    try:
        decoder = AvroDeserializer(schema=raw, wire_format="confluent", schema_ids=[schema_id])
    except ConfigError as e:
        raise ValueError(str(e)) from e
    columns = pa.schema(list(avro_to_arrow_type(raw)))
    return _Writer(tuple(f["name"] for f in raw["fields"]), columns, decoder, schema=raw)


def _json_writer(schema_str: str) -> _Writer:
    import jsonschema

    raw = json.loads(schema_str)
    if not isinstance(raw, dict):
        raise ValueError("the writer schema is not a JSON Schema object")
    validator_class = jsonschema.validators.validator_for(raw)
    validator_class.check_schema(raw)
    props = raw.get("properties") or {}
    from lakesink.kafka.registry_schemas import json_schema_columns

    return _Writer(tuple(props), json_schema_columns(raw, lenient=True), None, validator_class(raw))


def _file_descriptor(schema_str: str) -> Any:
    from google.protobuf import descriptor_pb2

    try:
        data = base64.b64decode(schema_str, validate=True)
        fdp = descriptor_pb2.FileDescriptorProto()
        fdp.ParseFromString(data)
    except (binascii.Error, ValueError) as e:
        raise ValueError(
            "the registry returned the Protobuf schema as .proto text, not as a serialized file "
            "descriptor (format=serialized); lakesink decodes Protobuf from file descriptors"
        ) from e
    return fdp


class _ProtobufWriter:
    """A registered Protobuf file (with its references) in a descriptor pool of its own."""

    def __init__(self, settings: RegistrySettings, schema: Any) -> None:
        from google.protobuf import descriptor_pool

        self._pool = descriptor_pool.DescriptorPool()
        self._added: set[str] = set()
        self._add(settings, schema)
        self._file = self._pool.FindFileByName(_file_descriptor(schema.schema_str).name)
        self._classes: dict[tuple[int, ...], Any] = {}

    def _add(self, settings: RegistrySettings, schema: Any) -> None:
        for ref in schema.references or ():
            if ref.name in self._added:
                continue

            def version(client: Any, ref: Any = ref) -> Any:
                return client.get_version(ref.subject, ref.version, fmt="serialized")

            registered = _fetch(
                settings,
                version,
                f"the Protobuf reference {ref.name} (subject {ref.subject} v{ref.version})",
            )
            self._add(settings, registered.schema)
        fdp = _file_descriptor(schema.schema_str)
        if fdp.name not in self._added:
            self._pool.Add(fdp)
            self._added.add(fdp.name)

    def message_named(self, full_name: str) -> Any:
        """The descriptor of message `full_name` (`package.Message`, nested too) of the file;
        ValueError naming the file's messages when it has none of that name."""
        prefix = f"{self._file.package}." if self._file.package else ""
        if full_name.startswith(prefix):
            desc = self._file.message_types_by_name.get(full_name[len(prefix) :].split(".")[0])
            for part in full_name[len(prefix) :].split(".")[1:]:
                desc = desc.nested_types_by_name.get(part) if desc is not None else None
            if desc is not None:
                return desc
        raise ValueError(
            f"{self._file.name} has no message {full_name} (its messages: "
            f"{', '.join(prefix + n for n in self._file.message_types_by_name)})"
        )

    def value_message(self) -> Any:
        """The descriptor of the message a subject of the topic strategy (which names no
        message) holds: the file's only top-level message, or the only one that no message of
        the file uses as a field's type (the others are its parts). ConfigError otherwise:
        taking the first would give another message's columns without a word."""
        top = list(self._file.message_types_by_name.values())
        used: set[str] = set()
        pending = list(top)
        while pending:
            desc = pending.pop()
            pending.extend(desc.nested_types)
            used.update(f.message_type.full_name for f in desc.fields if f.message_type)
        candidates = [d for d in top if d.full_name not in used]
        if len(candidates) == 1:
            return candidates[0]
        raise ConfigError(
            f"{self._file.name} holds the top-level messages "
            f"{', '.join(d.full_name for d in top)}, and the topic name strategy does not say "
            "which one the records are: set schema.registry.subject.strategy=record or "
            "topic-record and name the message in schema.registry.record.name "
            "(schema.registry.key.record.name for the key)"
        )

    def message_class(self, indexes: tuple[int, ...]) -> Any:
        cls = self._classes.get(indexes)
        if cls is None:
            from google.protobuf import message_factory

            try:
                desc = self._file.message_types_by_name[
                    list(self._file.message_types_by_name)[indexes[0]]
                ]
                for i in indexes[1:]:
                    desc = desc.nested_types[i]
            except IndexError:
                raise ValueError(
                    f"message indexes {list(indexes)} name no message of {self._file.name}"
                ) from None
            cls = message_factory.GetMessageClass(desc)
            self._classes[indexes] = cls
        return cls


class WriterSchemas:
    """The writer schemas of one format by id, fetched on first use, at most `capacity` kept."""

    def __init__(self, settings: RegistrySettings, fmt: RegistryFormat) -> None:
        self._settings = settings
        self._format = fmt
        self._cache: OrderedDict[int, Any] = OrderedDict()

    def get(self, schema_id: int) -> Any:
        found = self._cache.get(schema_id)
        if found is not None:
            self._cache.move_to_end(schema_id)
            if isinstance(found, UnknownSchemaId):
                raise found
            return found
        try:
            parsed = self._load(schema_id)
        except UnknownSchemaId as e:
            # kept too: a batch of values framed with an unknown id asks the registry once
            parsed = e
        self._cache[schema_id] = parsed
        while len(self._cache) > self._settings.cache_capacity:
            self._cache.popitem(last=False)
        if isinstance(parsed, UnknownSchemaId):
            raise parsed
        return parsed

    def _load(self, schema_id: int) -> Any:
        fmt = "serialized" if self._format == "protobuf" else None
        schema = _fetch(
            self._settings, lambda c: c.get_schema(schema_id, fmt=fmt), f"schema id {schema_id}"
        )
        kind = (schema.schema_type or "AVRO").upper()
        expected = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}[self._format]
        if kind != expected:
            raise UnknownSchemaId(
                f"schema id {schema_id} is a {kind} schema, not {expected} (value.format="
                f"{self._format})"
            )
        try:
            if self._format == "avro":
                parsed: Any = _avro_writer(schema_id, schema.schema_str)
            elif self._format == "jsonschema":
                parsed = _json_writer(schema.schema_str)
            else:
                parsed = _ProtobufWriter(self._settings, schema)
        except ImportError as e:
            raise MissingExtraError(
                f"value.format={self._format} needs the '{e.name}' package, which is not "
                "installed: pip install 'lakesink[registry]'"
            ) from e
        except (ValueError, TypeError, KeyError) as e:
            raise UnknownSchemaId(f"schema id {schema_id} cannot be used: {reason(e)}") from e
        except Exception as e:  # fastavro's, jsonschema's and protobuf's own schema errors
            if isinstance(e, SchemaRegistryError | MissingExtraError):
                raise
            raise UnknownSchemaId(f"schema id {schema_id} cannot be used: {reason(e)}") from e
        return parsed


# --- values ------------------------------------------------------------------------------------


def _zigzag_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("the Protobuf message indexes are cut off")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def message_indexes(payload: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes at the start of a Protobuf payload and where the message begins."""
    buf = memoryview(payload)
    count, pos = _zigzag_varint(buf, 0)
    if count == 0:
        return (0,), pos
    if count < 0 or count > 64:
        raise ValueError(f"the Protobuf message index count {count} is not valid")
    out = []
    for _ in range(count):
        i, pos = _zigzag_varint(buf, pos)
        if i < 0:
            raise ValueError(f"the Protobuf message index {i} is negative")
        out.append(i)
    return tuple(out), pos


def _repeated(field: Any) -> bool:
    # protobuf 7 has only is_repeated; older releases only label (3: LABEL_REPEATED)
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == 3


def _proto_value(msg: Any, field: Any) -> Any:
    value = getattr(msg, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        vf = field.message_type.fields_by_name["value"]
        return [(k, _proto_scalar(v, vf)) for k, v in value.items()]
    if _repeated(field):
        return [_proto_scalar(v, field) for v in value]
    if field.has_presence and not msg.HasField(field.name):
        return None
    return _proto_scalar(value, field)


def _proto_scalar(value: Any, field: Any) -> Any:
    if field.message_type is not None:
        return {f.name: _proto_value(value, f) for f in field.message_type.fields}
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    return value


class RegistryDeserializer:
    """Registry-framed values of one format into the table's columns (`columns`)."""

    def __init__(
        self,
        fmt: RegistryFormat,
        columns: pa.Schema,
        settings: RegistrySettings,
        evolution: str = "off",
    ) -> None:
        if fmt not in REGISTRY_FORMATS:
            raise ConfigError(
                f"value.format={fmt} cannot be read through a schema registry; use one of "
                f"{', '.join(REGISTRY_FORMATS)}"
            )
        if len(columns) == 0:
            raise ConfigError("a registry-decoded value needs at least one column")
        self._format = fmt
        self._schema = columns
        self._settings = settings
        self._evolution = evolution
        # per (schema id, message indexes): the first writer field the columns cannot hold
        self._uncovered: dict[tuple[int, tuple[int, ...]], str | None] = {}
        self._required = [f.name for f in columns if not f.nullable]
        self._json = JsonValueDecoder(columns) if fmt == "jsonschema" else None
        self._writers: WriterSchemas | None = None

    def __getstate__(self) -> dict[str, Any]:  # a task builds its own cache
        return {
            "fmt": self._format,
            "columns": self._schema,
            "settings": self._settings,
            "evolution": self._evolution,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["fmt"], state["columns"], state["settings"], state["evolution"]
        )

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def _writer(self, schema_id: int) -> Any:
        if self._writers is None:
            self._writers = WriterSchemas(self._settings, self._format)
        return self._writers.get(schema_id)

    def _check_fields(
        self, schema_id: int, writer: Any, indexes: tuple[int, ...] = (0,), message: Any = None
    ) -> None:
        """A writer schema the columns cannot hold: a dead letter (evolution off) or the end of
        the batch, for a restart that evolves the columns (add-and-widen)."""
        key = (schema_id, indexes)
        if key not in self._uncovered:
            from lakesink.kafka import registry_schemas as rs

            if message is not None:
                fields = list(rs.proto_message_struct(message))
            else:
                fields = list(writer.columns)
            self._uncovered[key] = rs.uncovered(list(self._schema), fields)
        path = self._uncovered[key]
        if path is None:
            return
        if self._evolution == "add-and-widen":
            raise SchemaEvolutionError(
                f"field {path!r} of writer schema id {schema_id} {NOT_IN_COLUMNS} "
                f"({', '.join(self._schema.names)}), which were fixed from the registry "
                "when the ingestion started; nothing of this batch was committed, and the "
                "ingestion starts again with the table evolved by this schema"
            )
        raise BadRegistryValue(
            f"field {path!r} of writer schema id {schema_id} does not fit the table's columns "
            f"({', '.join(self._schema.names)}) and schema.evolution is off: set "
            "schema.evolution = add-and-widen to evolve the table with the writer schema"
        )

    def decode_one(self, value: bytes | None) -> dict[str, Any]:
        """One value as a row, or BadRegistryValue with the reason."""
        if value is None:
            if self._required:
                raise BadRegistryValue(
                    f"tombstone (null value) for a schema with required column {self._required[0]}"
                )
            return dict.fromkeys(self._schema.names)
        if len(value) < 5 or value[0] != 0:
            raise BadRegistryValue(
                "value does not start with the schema registry's magic byte 0 and a schema id"
            )
        (schema_id,) = struct.unpack(">I", value[1:5])
        try:
            writer = self._writer(schema_id)
        except UnknownSchemaId as e:
            raise BadRegistryValue(f"value is framed with {e}") from e
        payload = value[5:]
        if self._format == "avro":
            self._check_fields(schema_id, writer)
            rec = self._avro(schema_id, writer, value)
        elif self._format == "jsonschema":
            self._check_fields(schema_id, writer)
            rec = self._jsonschema(schema_id, writer, payload)
        else:
            rec = self._protobuf(schema_id, writer, payload)
        missing = [c for c in self._required if rec.get(c) is None]
        if missing:
            raise BadRegistryValue(
                f"required column {missing[0]!r} has no value in writer schema id {schema_id}"
            )
        return {name: rec.get(name) for name in self._schema.names}

    def _avro(self, schema_id: int, writer: _Writer, value: bytes) -> dict[str, Any]:
        try:
            rec: dict[str, Any] = writer.decoder.decode_one(value)
        except BadAvroValue as e:
            raise BadRegistryValue(f"writer schema id {schema_id}: {e}") from e
        return rec

    def _jsonschema(self, schema_id: int, writer: _Writer, payload: bytes) -> dict[str, Any]:
        assert self._json is not None
        try:
            document = parse_document(payload)
        except BadValue as e:
            raise BadRegistryValue(str(e)) from e
        try:
            error = next(iter(writer.validator.iter_errors(document)), None)
        except Exception as e:  # a $ref it cannot resolve (schema references are not fetched)
            raise BadRegistryValue(
                f"the JSON Schema id {schema_id} cannot be applied: {reason(e)[:300]}"
            ) from e
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the value"
            raise BadRegistryValue(
                f"the value does not match its JSON Schema (id {schema_id}) at {where}: "
                f"{reason(error)[:300]}"
            )
        try:
            return self._json.decode_one(payload)
        except BadValue as e:
            raise BadRegistryValue(str(e)) from e

    def _protobuf(self, schema_id: int, writer: _ProtobufWriter, payload: bytes) -> dict[str, Any]:
        try:
            indexes, start = message_indexes(payload)
            cls = writer.message_class(indexes)
        except ValueError as e:
            raise BadRegistryValue(f"Protobuf value of schema id {schema_id}: {e}") from e
        self._check_fields(schema_id, writer, indexes, cls.DESCRIPTOR)
        msg = cls()
        try:
            msg.ParseFromString(payload[start:])
        except Exception as e:  # google.protobuf.message.DecodeError, and the C++ parser's
            raise BadRegistryValue(
                f"Protobuf decode with writer schema id {schema_id} "
                f"({cls.DESCRIPTOR.full_name}) failed: {reason(e)}"
            ) from e
        return {f.name: _proto_value(msg, f) for f in cls.DESCRIPTOR.fields}

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        failures: dict[int, str] = {}
        rows: list[tuple[int, dict[str, Any]]] = []
        for i, v in enumerate(values):
            try:
                rows.append((i, self.decode_one(v)))
            except BadRegistryValue as e:
                failures[i] = str(e)
        what = "the value does not fit the table's columns"
        pieces = rows_to_table(rows, self._schema, failures, what)
        return Decoded(concat_in_order(pieces, self._schema), failures)
