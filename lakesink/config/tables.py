"""Many tables from one ingestion (`tables.<name>.*`, `route.default`): each table's own keys
and the route that picks its records.

A configuration names its tables in one section, a table per name, e.g. in TOML

    [tables.orders]
    table.path = "/data/orders"
    route.topics = ["orders"]

    [tables.eu_payments]
    table.path = "/data/eu"
    table.format = "iceberg"
    route.field = "region"
    route.regex = "eu-.*"

Under `tables.<name>.` go the keys of the table (`table.*`, `iceberg.*`, `write.operation`,
`transform.*`) and its route (`route.*`, `TABLE_ROUTE_KEYS`). The top-level keys are the
defaults of every table; the keys of the ingestion (Kafka, records, commit, Spark) stay at the
top. The section is kept as one value, the `tables` key: a mapping of table name to its keys,
dotted (`{"orders": {"table.path": "/data/orders", "route.topics": ["orders"]}}`), which the
Spark source receives with the rest of the configuration.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakesink.config.parsers import Key, optional_str, str_list

TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# The keys a table may set under `tables.<name>.`: what describes one table and its writes.
# The others (Kafka, record decoding, dead letters, commit mode, Spark) belong to the ingestion.
TABLE_SCOPED_PREFIXES = ("table.", "iceberg.", "transform.")
TABLE_SCOPED_KEYS = frozenset({"write.operation"})

KAFKA_KEY_FIELD = "kafka_key"
DYNAMIC_ALLOW_DEFAULT = TABLE_NAME_RE.pattern.strip("^$")
DYNAMIC_SLOT = "/{table}"
HEADER_PREFIX = "header:"


def _regex(v: Any) -> str | None:
    text = optional_str(v)
    if text is not None:
        try:
            # a pattern Python takes with a FutureWarning (`[[]`: "possible nested set") is
            # valid today: a warning is no reason to refuse the configuration
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                re.compile(text)
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
    return text


def _route_field(v: Any) -> str | None:
    text = optional_str(v)
    if text is not None and text.startswith(HEADER_PREFIX) and not text[len(HEADER_PREFIX) :]:
        raise ValueError("expected header:<name> with the header's name")
    return text


# Documented as `tables.<name>.<key>` (docs/configuration.md, docs/many-tables.md).
TABLE_ROUTE_KEYS: tuple[Key, ...] = (
    Key(
        "route.topics",
        str_list,
        (),
        "The topics whose records this table takes (comma-separated, or a list). A table "
        "that names no route takes every record.",
    ),
    Key(
        "route.topic.pattern",
        _regex,
        None,
        "A regular expression a record's topic must match in full (instead of route.topics).",
    ),
    Key(
        "route.field",
        _route_field,
        None,
        "A value column (or kafka_key, or header:<name> for a Kafka header) whose text must "
        "match route.regex in full; a null value matches nothing.",
    ),
    Key(
        "route.regex",
        _regex,
        None,
        "The regular expression route.field must match in full (needs route.field).",
    ),
)
ROUTE_KEYS_BY_NAME: Mapping[str, Key] = {k.name: k for k in TABLE_ROUTE_KEYS}

TABLES_KEYS: tuple[Key, ...] = (
    Key(
        "tables",
        lambda v: v,  # checked with the rest of the configuration: parse_tables
        {},
        "Many tables from one ingestion: a section per table, tables.<name>.<key>, holding "
        "the table's own table.*, iceberg.*, transform.* and write.operation keys (the "
        "top-level ones are every table's defaults) and its route.* keys "
        "(docs/many-tables.md). Unset: one table, table.path.",
    ),
    Key(
        "route.dynamic.field",
        _route_field,
        None,
        "With tables: a value column (or kafka_key, or header:<name>) whose text names the "
        "table a record goes to, created on its first record (at route.dynamic.path, in the "
        "top-level table.format); a name route.dynamic.allow refuses, or a null, is a record "
        "no route takes.",
    ),
    Key(
        "route.dynamic.allow",
        _regex,
        DYNAMIC_ALLOW_DEFAULT,
        "The regular expression a dynamic table name must match in full.",
    ),
    Key(
        "route.dynamic.path",
        optional_str,
        None,
        "Where dynamic tables are: a path or URI ending in /{table}, the table's name in place "
        "of {table} (e.g. s3://bucket/tables/{table}); for Iceberg tables the folder before "
        "/{table} is the warehouse and {table} the table's name in iceberg.namespace.",
    ),
    Key(
        "route.default",
        optional_str,
        None,
        "With tables: the table that takes a record no table's route matches (a table name); "
        "unset, such a record is a dead letter (errors.deadletter.table) or, without one, "
        "fails the batch.",
    ),
)


@dataclass(frozen=True, slots=True)
class Route:
    """Which records a table takes: a topic among `topics` or matching `topic_pattern`, and
    the text of `field` matching `regex`; every record when nothing is set."""

    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    field: str | None = None
    regex: str | None = None

    @property
    def takes_everything(self) -> bool:
        return not (self.topics or self.topic_pattern or self.field)

    def takes_topic(self, topic: str) -> bool:
        """Whether records of `topic` can reach this table (its field test aside)."""
        if self.topics:
            return topic in self.topics
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return True


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table of the `tables` section: its name, its keys (dotted, unparsed: they are
    parsed with the top-level ones into the table's own configuration) and its route."""

    name: str
    overrides: Mapping[str, Any]
    route: Route


def gather_table_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with every `tables.<name>.<key>` key (a flat source: `--set`, a file's dotted
    keys) folded into the one `tables` value, by name, dotted keys inside."""
    out: dict[str, Any] = {}
    section: dict[str, dict[str, Any]] = {}
    given = raw.get("tables")
    if isinstance(given, Mapping):
        for name, keys in given.items():
            section[str(name)] = dict(_dotted(keys)) if isinstance(keys, Mapping) else keys
    elif given is not None:
        out["tables"] = given  # refused by parse_tables, naming what is expected
    for key, value in raw.items():
        if key == "tables":
            continue
        if key.startswith("tables."):
            name, _, rest = key[len("tables.") :].partition(".")
            if not rest:
                raise ValueError(
                    f"{key!r}: expected tables.<name>.<key>, e.g. tables.orders.table.path"
                )
            target = section.setdefault(name, {})
            if isinstance(target, dict):
                target.update(_dotted({rest: value}))
            continue
        out[key] = value
    if section:
        out["tables"] = section
    return out


def _dotted(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; a key whose value is a mapping and whose name is a
    known key stays whole (none of the table keys takes a mapping)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_dotted(v, name + "."))
        else:
            out[name] = v
    return out


def parse_tables(value: Any, known: frozenset[str]) -> tuple[TableSpec, ...]:
    """The table specs of the `tables` value (by name, in name order); ValueError naming the
    table and the key for a bad name, a key a table may not set, or a bad route."""
    if not value:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(
            "expected a section per table: tables.<name>.<key> = value (e.g. "
            "tables.orders.table.path)"
        )
    specs = []
    for name in sorted(value):
        keys = value[name]
        if not TABLE_NAME_RE.match(str(name)):
            raise ValueError(f"table name {name!r}: expected 1 to 64 letters, digits, '_' or '-'")
        if not isinstance(keys, Mapping):
            raise ValueError(f"tables.{name}: expected its keys, e.g. tables.{name}.table.path")
        overrides: dict[str, Any] = {}
        route: dict[str, Any] = {}
        for key, raw in keys.items():
            full = f"tables.{name}.{key}"
            if key in ROUTE_KEYS_BY_NAME:
                try:
                    route[key] = ROUTE_KEYS_BY_NAME[key].parse(raw)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{full}={raw!r} is not valid: {e}") from None
            elif key in known and (
                key.startswith(TABLE_SCOPED_PREFIXES) or key in TABLE_SCOPED_KEYS
            ):
                overrides[key] = raw
            elif key in known:
                raise ValueError(
                    f"{full}: {key} is a key of the whole ingestion, not of one table; set it "
                    "at the top level (a table takes table.*, iceberg.*, transform.*, "
                    "write.operation and route.*)"
                )
            else:
                raise ValueError(
                    f"{full}: unknown key {key!r}; a table takes table.*, iceberg.*, "
                    "transform.*, write.operation and route.* keys"
                )
        specs.append(TableSpec(str(name), overrides, _route(name, route)))
    return tuple(specs)


def _route(name: str, keys: Mapping[str, Any]) -> Route:
    route = Route(
        topics=keys.get("route.topics", ()),
        topic_pattern=keys.get("route.topic.pattern"),
        field=keys.get("route.field"),
        regex=keys.get("route.regex"),
    )
    if route.topics and route.topic_pattern:
        raise ValueError(f"tables.{name}: set only one of route.topics and route.topic.pattern")
    if (route.field is None) != (route.regex is None):
        raise ValueError(
            f"tables.{name}: route.field and route.regex go together (the field's text must "
            "match the regex)"
        )
    return route


def dynamic_spec(field: str, name: str, template: str, table_format: str = "hudi") -> TableSpec:
    """The spec of dynamic table `name`, taking the records whose `field` text is its name: a
    Hudi table at the template's path; an Iceberg table named `name` in the warehouse the
    template's folder is (its catalog and namespace: the top-level iceberg.* keys)."""
    where = (
        {"table.path": dynamic_parent(template), "table.name": name}
        if table_format == "iceberg"
        else {"table.path": dynamic_path(template, name)}
    )
    return TableSpec(name, where, Route(field=field, regex=re.escape(name)))


def dynamic_path(template: str, name: str) -> str:
    return template[: -len(DYNAMIC_SLOT)] + "/" + name


def dynamic_parent(template: str) -> str:
    """The folder that holds the dynamic tables (the template less its /{table})."""
    return template[: -len(DYNAMIC_SLOT)]


def check_dynamic_template(template: str | None) -> str:
    if not template or not template.endswith(DYNAMIC_SLOT) or template.count("{table}") != 1:
        raise ValueError(
            f"route.dynamic.path={template!r}: expected a path or URI ending in /{{table}} "
            "(e.g. /data/tables/{table}), where each dynamic table is created"
        )
    return template
