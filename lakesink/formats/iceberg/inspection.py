"""`lakesink status` and `lakesink table show|files|timeline` for Iceberg tables.

`table` commands take a path: an Iceberg table's location (the folder holding `metadata/`,
local or on an object store) is read catalog-free from its newest metadata file; a warehouse
folder (holding the SQLite `catalog.db`) is answered with the locations of the tables in it.
The Hudi table services (`table clean|cluster|archive|rollback`) and `backfill` refuse Iceberg
tables, naming the Iceberg maintenance commands.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lakesink.console import emit_json, say, table
from lakesink.errors import ConfigError, TableNotFoundError
from lakesink.formats.status import add_pending, print_head
from lakesink.protocol.offsets import TopicPartition
from lakesink.settings import Settings, StorageAccess
from lakesink.storage import Storage

ICEBERG_MAINTENANCE = "lakesink iceberg expire-snapshots|rewrite-data-files|remove-orphan-files"
_VERSION = re.compile(r"^(?:v)?(\d+)(?:-[^.]*)?\.metadata\.json$")


def refuse_iceberg(command: str) -> ConfigError:
    """The error of a Hudi-only command given an Iceberg table."""
    return ConfigError(f"{command}: not for Iceberg tables; see {ICEBERG_MAINTENANCE}")


def local_path(path: str) -> Path | None:
    """`path` as a local folder (a plain path or a file: URI), None for object stores."""
    if "://" in path and not path.startswith("file://"):
        return None
    return Path(path.removeprefix("file://"))


def newest_metadata(storage: Storage) -> str | None:
    """The key of the newest `metadata/*.metadata.json` of an Iceberg table location (None if
    none): the highest version, the newest write between two of one version."""
    found = []
    for meta in storage.list_folder("metadata").objects:
        m = _VERSION.match(meta.key.rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), meta.modified, meta.key))
    return max(found)[2] if found else None


def iceberg_kind(path: str, access: StorageAccess) -> str | None:
    """ "table" for an Iceberg table location (local or on an object store), "warehouse" for a
    local folder with `catalog.db`, None for anything else (a Hudi table, no table)."""
    local = local_path(path)
    if local is not None and (local / "catalog.db").is_file():
        return "warehouse"
    if local is not None and (not local.is_dir() or (local / ".hoodie").exists()):
        return None
    storage = access.open(path)
    if local is None and storage.exists(".hoodie/hoodie.properties"):
        return None
    if newest_metadata(storage) is not None:
        return "table"
    return None


def warehouse_tables(path: Path, access: StorageAccess) -> list[Path]:
    """The Iceberg table locations under a warehouse folder (namespace.db/table/metadata)."""
    return sorted(
        m.parent for m in path.glob("*/*/metadata") if newest_metadata(access.open(str(m.parent)))
    )


def open_static(path: str, access: StorageAccess) -> Any:
    """The pyiceberg table at an Iceberg table location, read from its newest metadata; on an
    object store with the storage.* settings of the environment (LAKESINK_STORAGE_S3_...)."""
    from pyiceberg.table import StaticTable

    from lakesink.formats.iceberg.catalog import file_io_properties

    storage = access.open(path)
    key = newest_metadata(storage)
    if key is None:
        raise TableNotFoundError(f"no Iceberg metadata under {path}/metadata")
    if storage.is_local:
        return StaticTable.from_metadata(str(Path(storage.uri.removeprefix("file://")) / key))
    properties = file_io_properties(access.options, storage.uri)
    return StaticTable.from_metadata(f"{storage.uri}/{key}", properties)


def snapshot_rows(tbl: Any, limit: int | None = None) -> list[dict[str, Any]]:
    """The snapshots of a pyiceberg table, oldest first: id, parent, time, operation, writer
    (lakesink's summary key), records and data files added, totals (the live rows)."""
    from lakesink.formats.iceberg.snapshots import KEY_COMMIT_ID, KEY_VTTS, KEY_WRITER_ID

    out = []
    for s in tbl.metadata.snapshots:
        summary = s.summary
        extra = dict(summary.additional_properties) if summary is not None else {}
        out.append(
            {
                "snapshot_id": s.snapshot_id,
                "parent_id": s.parent_snapshot_id,
                "timestamp_ms": s.timestamp_ms,
                "operation": summary.operation.value if summary is not None else "",
                "writer": extra.get(KEY_WRITER_ID, ""),
                "commit_id": extra.get(KEY_COMMIT_ID, ""),
                "vtts_ms": int(extra[KEY_VTTS]) if KEY_VTTS in extra else None,
                "added_records": int(extra.get("added-records", 0)),
                "added_files": int(extra.get("added-data-files", 0)),
                "total_records": snapshot_counts(extra)["records"],  # live: less deletes
                "total_files": int(extra.get("total-data-files", 0)),
            }
        )
    return out[-limit:] if limit else out


def _when(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def run_table_command(command: str, path: str, as_json: bool, access: StorageAccess) -> int:
    """`table show|files|timeline` of an Iceberg table location or warehouse."""
    if iceberg_kind(path, access) == "warehouse":
        local = local_path(path)
        assert local is not None
        found = [str(p) for p in warehouse_tables(local, access)]
        raise ConfigError(
            f"table {command}: {path} is an Iceberg warehouse; give one table's location: "
            + (", ".join(found) if found else "(no tables in it yet)")
        )
    tbl = open_static(path, access)
    if command == "show":
        return _show(tbl, path, as_json)
    if command == "timeline":
        rows = snapshot_rows(tbl)
        if as_json:
            emit_json(rows)
            return 0
        say(
            table(
                ["snapshot", "time", "operation", "writer", "records", "files"],
                [
                    [
                        r["snapshot_id"],
                        _when(r["timestamp_ms"]),
                        r["operation"],
                        r["writer"],
                        r["added_records"],
                        r["added_files"],
                    ]
                    for r in rows
                ],
            )
        )
        return 0
    files = [
        {
            "partition": str(t.file.partition) if len(t.file.partition) else "",
            "path": t.file.file_path,
            "records": t.file.record_count,
            "bytes": t.file.file_size_in_bytes,
            # the delete files that apply to it (merge-on-read), until a rewrite applies them
            "delete_files": len(t.delete_files),
        }
        for t in tbl.scan().plan_files()
    ]
    if as_json:
        emit_json(files)
        return 0
    say(
        table(
            ["partition", "file", "records", "bytes", "delete files"],
            [
                [f["partition"], f["path"], f["records"], f["bytes"], f["delete_files"]]
                for f in files
            ],
        )
    )
    return 0


def snapshot_counts(summary: Mapping[str, str]) -> dict[str, int]:
    """A snapshot's table, from its summary's totals: `records`, the live rows (the rows of its
    data files, `records_in_files`, less those its position deletes remove: exact for lakesink's
    writes, which never delete a position twice), `files` (data files), `bytes`, and the delete
    files that wait for a rewrite (`delete_files`, holding `position_deletes`; lakesink iceberg
    rewrite-data-files applies them). `equality_deletes` only when there are some: lakesink
    never writes them, and the rows they remove cannot be counted from the totals."""
    stored = int(summary.get("total-records", 0))
    positions = int(summary.get("total-position-deletes", 0))
    out = {
        "records": max(0, stored - positions),
        "records_in_files": stored,
        "files": int(summary.get("total-data-files", 0)),
        "bytes": int(summary.get("total-files-size", 0)),
        "delete_files": int(summary.get("total-delete-files", 0)),
        "position_deletes": positions,
    }
    equality = int(summary.get("total-equality-deletes", 0))
    if equality:
        out["equality_deletes"] = equality
    return out


def _show(tbl: Any, path: str, as_json: bool) -> int:
    md = tbl.metadata
    current = tbl.current_snapshot()
    summary = dict(current.summary.additional_properties) if current and current.summary else {}
    counts = snapshot_counts(summary)
    info = {
        "path": path,
        "format": "iceberg",
        "format_version": md.format_version,
        "table_uuid": str(md.table_uuid),
        "location": md.location,
        "metadata": tbl.metadata_location,
        "schema": [f.name for f in tbl.schema().fields],
        "partition_spec": str(tbl.spec()),
        "snapshots": len(md.snapshots),
        "current_snapshot": current.snapshot_id if current else None,
        **counts,
        "properties": dict(md.properties),
    }
    if as_json:
        emit_json(info)
        return 0
    for k, v in info.items():
        if k != "properties":
            say(f"{k:18} {v}")
    if counts["delete_files"]:
        say(pending_deletes(counts))
    return 0


def pending_deletes(counts: Mapping[str, int]) -> str:
    """The line saying what the delete files of `snapshot_counts` wait for."""
    return (
        f"{counts['delete_files']} delete files ({counts['position_deletes']:,} position "
        f"deletes) wait for a rewrite: lakesink iceberg rewrite-data-files applies them"
    )


def collect_iceberg_status(
    settings: Settings,
    *,
    high_watermarks: Callable[[], Mapping[TopicPartition, int]],
    add_metrics: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """`lakesink status` of an Iceberg table (IcebergPlugin.status): the writer's committed
    offsets from the snapshot lineage, high watermarks and lag, and the recent snapshots."""
    from lakesink.formats.iceberg.errors import CatalogNotFoundError
    from lakesink.formats.iceberg.format import open_iceberg_table

    try:
        tbl = open_iceberg_table(settings, create=False)
    except (TableNotFoundError, CatalogNotFoundError):  # nothing ingested yet
        tbl = None
    committed = tbl.committed_offsets(settings.writer_id).to_json() if tbl is not None else {}
    marks = {tp.key(): hi for tp, hi in high_watermarks().items()}
    partitions = []
    for key in sorted(set(marks) | set(committed)):
        pos, hi = committed.get(key), marks.get(key)
        lag = None if hi is None else hi - (pos or 0)
        partitions.append({"partition": key, "committed": pos, "high_watermark": hi, "lag": lag})
    out: dict[str, Any] = {
        "writer_id": settings.writer_id,
        "format": "iceberg",
        "partitions": partitions,
    }
    add_pending(settings.commit, out)
    if settings.dead_letters.table:
        out["dead_letter_table"] = _dead_letter_status(settings)
    if tbl is None:
        out["table"] = None
        add_metrics(out)
        return out
    py = tbl.pyiceberg
    current = py.current_snapshot()
    summary = dict(current.summary.additional_properties) if current and current.summary else {}
    counts = snapshot_counts(summary)
    out["table"] = {
        "name": tbl.name,
        "location": tbl.location,
        "snapshots": len(py.metadata.snapshots),
        "current_snapshot": current.snapshot_id if current else None,
        "records": counts["records"],
        "files": counts["files"],
        "delete_files": counts["delete_files"],
        "position_deletes": counts["position_deletes"],
        "recent": snapshot_rows(py, limit=10),
    }
    add_metrics(out)
    return out


def _dead_letter_status(settings: Settings) -> dict[str, Any] | None:
    """The Iceberg dead-letter table's name, records and snapshots, and the offsets its writer
    (`<writer id>.deadletters`) has committed; None while it does not exist yet."""
    from lakesink.formats.iceberg.errors import CatalogNotFoundError
    from lakesink.formats.iceberg.format import open_dead_letter_table

    try:
        dead = open_dead_letter_table(settings, create=False)
    except (TableNotFoundError, CatalogNotFoundError):
        return None
    current = dead.pyiceberg.current_snapshot()
    summary = dict(current.summary.additional_properties) if current and current.summary else {}
    writer = settings.dead_letters.writer_id
    return {
        "name": dead.name,
        "records": int(summary.get("total-records", 0)),
        "snapshots": len(dead.pyiceberg.metadata.snapshots),
        "writer_id": writer,
        "committed": dead.committed_offsets(writer).to_json(),
    }


def print_iceberg_status(st: dict[str, Any]) -> None:
    """`collect_iceberg_status`'s status as text."""
    print_head(st)
    if "dead_letter_table" in st:
        d = st["dead_letter_table"]
        say(
            "dead-letter table: not created yet (no record has failed to decode)"
            if d is None
            else f"dead-letter table {d['name']}: {d['records']:,} records, "
            f"{d['snapshots']} snapshots (writer {d['writer_id']})"
        )
    t = st["table"]
    if t is None:
        say("Iceberg table: not created yet")
        return
    say(
        f"\nIceberg table {t['name']} at {t['location']}: {t['records']:,} records in "
        f"{t['files']} data files, {t['snapshots']} snapshots"
    )
    if t.get("delete_files"):
        say(pending_deletes(t))
    say("recent snapshots:")
    say(
        table(
            ["snapshot", "time", "operation", "writer", "records", "files"],
            [
                [
                    r["snapshot_id"],
                    _when(r["timestamp_ms"]),
                    r["operation"],
                    r["writer"],
                    r["added_records"],
                    r["added_files"],
                ]
                for r in t["recent"]
            ],
        )
    )
