"""The Iceberg keys (iceberg.*, table.format=iceberg): namespace, catalog, partition spec."""

from __future__ import annotations

from lakesink.config.parsers import (
    Key,
    choice,
    non_negative_int,
    optional_secret,
    optional_str,
    str_list,
)

ICEBERG_KEYS: tuple[Key, ...] = (
    Key(
        "iceberg.namespace",
        optional_str,
        "lakesink",
        "Iceberg: the namespace of the table (dots nest namespaces); created on first use.",
    ),
    Key(
        "iceberg.catalog.kind",
        choice("sql", "rest"),
        "sql",
        "Iceberg catalog: sql (a SQLite file or PostgreSQL database) or rest (a REST catalog "
        "server).",
    ),
    Key(
        "iceberg.catalog.uri",
        optional_secret,
        None,
        "Iceberg catalog location: sqlite:////abs/catalog.db or "
        "postgresql://user:password@host:port/db for kind sql (default: catalog.db in a local "
        "warehouse), the server's http(s) URL for kind rest; env:NAME and file:/path work.",
        secret=True,
    ),
    Key(
        "iceberg.catalog.name",
        optional_str,
        "lakesink",
        "Iceberg catalog name (the SQL catalog keeps it in every row; readers must use it).",
    ),
    Key(
        "iceberg.catalog.properties",
        optional_secret,
        None,
        "Further pyiceberg catalog properties, key=value comma-separated (e.g. a REST "
        "catalog's token=...); env:NAME and file:/path work.",
        secret=True,
    ),
    Key(
        "iceberg.partition.spec",
        str_list,
        (),
        "Iceberg partition fields, comma-separated: col or identity(col), day(ts), hour(ts), "
        "`bucket[N](col)`. Used when the table is created; default: identity fields of "
        "table.partition.by.",
    ),
    Key(
        "iceberg.write.mode",
        choice("copy-on-write", "merge-on-read"),
        "copy-on-write",
        "write.operation upsert or cdc on Iceberg (Iceberg's write.update.mode and "
        "write.delete.mode values): copy-on-write (each batch rewrites the data files of the "
        "buckets it touches) or merge-on-read (each batch adds position-delete files for the "
        "rows it supersedes and data files of its new rows, one row-delta snapshot; lakesink "
        "iceberg rewrite-data-files applies the deletes). Fixed when the table is created: the "
        "other mode on an existing table is refused, naming both. See the docs page Iceberg "
        "tables.",
    ),
    Key(
        "iceberg.services.rewrite.delete.files",
        non_negative_int,
        0,
        "Merge-on-read tables of keys: after a commit that leaves at least this many "
        "position-delete files live in the table (its snapshot summary's total-delete-files), "
        "the writer runs rewrite-data-files inline, which applies the deletes (each batch "
        "reads its buckets' delete files, so their number drives its cost); on top of "
        "table.services.inline's schedule, and also when table.services.inline.every.commits "
        "is 0. 0: only that schedule.",
    ),
)
