"""Table-layer timings: publishing one commit (real files on local disk) and building the
FileSystemView for tables of 1k and 10k base files (metadata-only file entries).

Run: python benchmarks/bench_table.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.protocol.instant import Action, InstantTime, TimelineLayout
from lakesink.protocol.write_status import FileWrite

FILES_PER_COMMIT = 100


def _writes(t: InstantTime, n: int) -> tuple[FileWrite, ...]:
    out = []
    for i in range(n):
        fid = new_file_id()
        p = f"day=2024-01-{i % 28 + 1:02d}"
        out.append(
            FileWrite(
                p,
                fid,
                f"{p}/{base_file_name(fid, '0-1-0', t)}",
                1000,
                1 << 20,
                "null",
                1000,
                1 << 20,
            )
        )
    return tuple(out)


def build_fake_table(root: Path, version: int, files: int) -> HudiTable:
    table = HudiTable.create(
        root / f"v{version}_{files}", TableConfig("bench", ("id",), ("day",), version=version)
    )  # type: ignore[arg-type]
    base = 1_700_000_000_000
    for c in range(files // FILES_PER_COMMIT):
        t = InstantTime.from_epoch_ms(base + c * 1000)
        inst = table.timeline().begin(Action.COMMIT, t)
        table.timeline().publish(
            inst,
            CommitMetadata("BULK_INSERT", _writes(t, FILES_PER_COMMIT), schema="{}"),
            completion_time=InstantTime.from_epoch_ms(base + c * 1000 + 500)
            if version == 8
            else None,
        )
    return table


def time_publish(table: HudiTable, repeats: int = 20) -> list[float]:
    out = []
    for _ in range(repeats):
        t = InstantTime.from_epoch_ms(int(time.time() * 1000) + 10_000)
        tl = table.timeline()
        inst = tl.begin(Action.COMMIT, t)
        md = CommitMetadata(
            "BULK_INSERT", _writes(t, 10), schema="{}", extra={"lakesink.commit_id": "x"}
        )
        start = time.perf_counter()
        table.timeline().publish(inst, md)
        out.append(time.perf_counter() - start)
        time.sleep(0.002)
    return out


def time_view(table: HudiTable, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        view = FileSystemView(table)
        n = len(view.latest_base_files())
        best = min(best, time.perf_counter() - start)
    assert n > 0
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for version in (6, 8):
            layout = TimelineLayout.V2 if version == 8 else TimelineLayout.V1
            for files in (1_000, 10_000):
                table = build_fake_table(root, version, files)
                view_s = time_view(table)
                pub = time_publish(table)
                commits = files // FILES_PER_COMMIT
                median = statistics.median(pub) * 1000
                p95 = sorted(pub)[int(len(pub) * 0.95) - 1] * 1000
                print(
                    f"v{version} (layout {int(layout)}) {files:>6} files / {commits} commits: "
                    f"view {view_s * 1000:7.1f} ms | publish median {median:5.2f} ms "
                    f"p95 {p95:5.2f} ms"
                )


if __name__ == "__main__":
    main()
