"""Build the golden fixture tables beside this script (tiny, deterministic names and times):

    cow_v6/  table version 6 (timeline layout 1, JSON commit metadata)
    cow_v8/  table version 8 (timeline layout 2, Avro commit metadata, completion times)

Each holds two commits into two partitions (`day=2024-01-01`, `day=2024-01-02`), one
replacecommit clustering `day=2024-01-01`, and one rolled-back instant. Rows: ids 1-6.
Run: `python tests/golden/build_golden.py` (rewrites both tables).

Beside them: `iceberg/`, an Iceberg warehouse (SQLite catalog and one table) written by lakesink
before issue 28, built by `build_iceberg_golden.py` against a worktree of that commit. Its
metadata holds absolute paths: it reads from /tmp/lakesink-golden-iceberg/warehouse only, where
tests/integration/test_golden_resume.py copies it (see that script).
"""

from __future__ import annotations

import shutil
import sys
from itertools import count
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parents[1]))

from lakesink.protocol.instant import Action, InstantTime  # noqa: E402
from lakesink.formats.hudi.table.config import TableConfig  # noqa: E402
from lakesink.formats.hudi.table.hudi_table import HudiTable  # noqa: E402
from lakesink.formats.hudi.table.metadata import CommitMetadata  # noqa: E402
from lakesink.formats.hudi.table.reader import TableReader  # noqa: E402
from lakesink.formats.hudi.table.rollback import rollback  # noqa: E402
from lakesink.formats.hudi.table.writer import BaseFileWriter  # noqa: E402

TIMES = [InstantTime(f"2024010100000{i}000") for i in range(1, 8)]
SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("name", pa.string())])


def _rows(ids: list[int], day: str) -> pa.Table:
    return pa.table({"id": ids, "day": [day] * len(ids), "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def build(version: int) -> Path:
    path = ROOT / f"cow_v{version}"
    shutil.rmtree(path, ignore_errors=True)
    table = HudiTable.create(path, TableConfig("golden", ("id",), ("day",), version=version))  # type: ignore[arg-type]
    ids = count(1)

    def factory() -> str:
        return f"0000000{next(ids)}-aaaa-bbbb-cccc-000000000000-0"

    def write(t: InstantTime, parts: dict[str, pa.Table], keep_time: bool = False) -> tuple[list, str]:
        writes, schema = [], ""
        for day, rows in parts.items():
            w = BaseFileWriter(table, f"day={day}", t, "0-1-0", file_id_factory=factory,
                               preserve_commit_time=keep_time)
            w.write(rows)
            writes += w.close()
            schema = w.avro_schema or schema
        return writes, schema

    def complete_time(i: int) -> InstantTime:
        return InstantTime.from_epoch_ms(TIMES[i].to_epoch_ms() + 500)

    for i, parts in enumerate([
        {"2024-01-01": _rows([1, 2], "2024-01-01"), "2024-01-02": _rows([3], "2024-01-02")},
        {"2024-01-01": _rows([4], "2024-01-01"), "2024-01-02": _rows([5, 6], "2024-01-02")},
    ]):
        inst = table.timeline().begin(Action.COMMIT, TIMES[i])
        writes, schema = write(TIMES[i], parts)
        table.timeline().publish(inst, CommitMetadata("BULK_INSERT", tuple(writes), schema=schema,
                                                     extra={"lakesink.commit_id": f"golden-{i}"}),
                                 completion_time=complete_time(i))
    # a failed write, rolled back
    inst = table.timeline().begin(Action.COMMIT, TIMES[2])
    write(TIMES[2], {"2024-01-02": _rows([99], "2024-01-02")})
    rollback(table, inst, rollback_time=TIMES[3])
    # clustering of day=2024-01-01 into one file group
    inst = table.timeline().begin(Action.REPLACE_COMMIT, TIMES[4])
    old = [w for w in TableReader(table).snapshot(partition_filter={"day": "2024-01-01"}).column("_hoodie_file_name").to_pylist()]
    old_ids = sorted({n.split("_")[0] for n in old})
    rows = TableReader(table).snapshot(partition_filter={"day": "2024-01-01"})
    writes, schema = write(TIMES[4], {"2024-01-01": rows.sort_by("id")}, keep_time=True)
    table.timeline().publish(
        inst,
        CommitMetadata("CLUSTER", tuple(writes), replaced_file_ids={"day=2024-01-01": tuple(old_ids)}, schema=schema),
        completion_time=complete_time(4),
    )
    shutil.rmtree(path / ".hoodie" / ".aux" / "lakesink", ignore_errors=True)
    return path


if __name__ == "__main__":
    for v in (6, 8):
        print("built", build(v))
