"""The crash matrix between a batch's two tables: with `errors.tolerance=all` and a dead-letter
table, a batch commits the dead-letter table first and the main table second. The driver is
killed with SIGKILL before the first commit, between the two and after the second, on both
write paths and both formats; each restart must finish the replayed batch (the main table
commits its rows; its bad records, already in the dead-letter table, are not written again)
and after every kill each Kafka record is in at most one of the two tables, once — at the
end in exactly one. The dead-letter table is read by hudi-rs (Hudi) or pyiceberg (Iceberg),
the main table by the audit's readers, both against Kafka.

One chain of restarts per format (the two side by side), on one table and one checkpoint: each
run replays the batch the run before it was killed in, on another (write path, commit mode), so
a batch left between the two commits is finished by each of the four (direct and DataFrame, sync
and async)."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_side_by_side, write_config_file

from lakesink.cli.verify import audit_config
from lakesink.faults import TABLE_CRASH_POINTS
from lakesink.kafka.producer import produce_values, sample_event_bytes

pytestmark = pytest.mark.integration

KILLED = -signal.SIGKILL
RECORDS = 1300  # batches of 100: each killed run passes one or two, the rest at the end
BAD_EVERY = 7  # every 7th record is not JSON: each batch has dead letters
FORMATS = ("hudi", "iceberg")
# (write path, commit mode, crash point), in chain order. The runs killed between the two
# commits (the last one not killed) replay a batch left there, each on another path and mode.
# The kills before and after both commits (one batch each, nothing left between) run on one
# path per format: each (path, point) on one of the two formats.
BETWEEN = [
    ("direct", "sync", "between-table-commits"),
    ("dataframe", "async", "between-table-commits"),
    ("direct", "async", "between-table-commits"),
    ("dataframe", "sync", "between-table-commits"),
]
CHAINS = {
    "hudi": [
        ("direct", "sync", "before-table-commits"),
        ("dataframe", "sync", "after-table-commits"),
        *BETWEEN,
    ],
    "iceberg": [
        ("dataframe", "sync", "before-table-commits"),
        ("direct", "sync", "after-table-commits"),
        *BETWEEN,
    ],
}
assert all({p for _, _, p in c} == set(TABLE_CRASH_POINTS) for c in CHAINS.values())
assert {c[:3:2] for chain in CHAINS.values() for c in chain[:2]} == {
    (w, p) for w in ("direct", "dataframe") for p in ("before-table-commits", "after-table-commits")
}


def _values() -> list[bytes]:
    return [
        b'{"event_id": not json' if i % BAD_EVERY == 3 else sample_event_bytes(i)
        for i in range(RECORDS)
    ]


def test_driver_killed_around_the_two_tables_commits_each_restart_finishes_the_batch(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    """The chain for each format; the two chains run side by side (each CLI run is mostly one
    busy process while its JVM starts: two share the machine's cores); a failure names its
    format."""
    run_side_by_side(
        {
            fmt: functools.partial(
                _chain, fmt, kafka_bootstrap, topic_factory(f"between-{fmt}"), tmp_path / fmt, cli
            )
            for fmt in FORMATS
        }
    )


def _chain(
    fmt: str, kafka_bootstrap: str, topic: str, folder: Path, cli: Callable[..., Any]
) -> None:
    values = _values()
    produce_values(kafka_bootstrap, topic, values)
    bad = [i for i in range(RECORDS) if i % BAD_EVERY == 3]
    where: dict[str, Any] = (
        # a table of the same catalog
        {"table__format": "iceberg", "table__name": "events"} if fmt == "iceberg" else {}
    )
    where["errors__deadletter__table"] = (
        "events_dead_letters" if fmt == "iceberg" else str(folder / "dead_letters")
    )
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        folder / "table",
        kafka__max__records__per__batch=100,
        errors__tolerance="all",
        **where,
    )
    folder.mkdir(parents=True, exist_ok=True)
    conf = write_config_file(cfg, folder / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    main_end = 0
    for path, mode, point in CHAINS[fmt]:
        crashed = cli(
            [*args, "--set", f"write.path={path}", "--set", f"commit.mode={mode}"],
            env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"},
        )
        step = (fmt, path, mode, point)
        assert crashed.returncode == KILLED, (step, crashed.stdout[-3000:])
        report = audit_config(cfg)  # also: no record twice, none in both tables
        assert report.ok, (step, report.problems)
        # the replayed batch landed (async: it may still be in the pending store, published
        # by the next start's recovery)
        committed = report.committed[f"{topic}:0"]
        assert main_end < committed if mode == "sync" else main_end <= committed, step
        main_end = committed
        dead = _dead_letter_offsets(cfg, fmt)
        # killed between the commits, the dead-letter table is one batch ahead; else level
        ahead = [o for o in dead if o >= main_end]
        assert bool(ahead) == (point == "between-table-commits"), (step, main_end, ahead)
        assert [o for o in dead if o < main_end] == [o for o in bad if o < main_end], step
        if fmt == "hudi":  # the main table's instant is left inflight until it commits
            inflight = _inflight(cfg["table.path"])
            assert bool(inflight) == (point != "after-table-commits"), (step, inflight)
    finished = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert finished.returncode == 0, (fmt, finished.stdout[-3000:])
    report = audit_config(cfg)
    assert report.ok, (fmt, report.problems)
    assert report.kafka_records == RECORDS and report.dead_letters == len(bad), fmt
    rows = report.rows_hudi_rs if fmt == "hudi" else report.to_json()["readers"]["pyiceberg"]
    assert rows == RECORDS - len(bad), fmt
    assert _dead_letter_offsets(cfg, fmt) == bad, fmt
    if fmt == "hudi":  # every instant a kill left was rolled back or finished
        assert not _inflight(cfg["table.path"]) and not _inflight(
            where["errors__deadletter__table"]
        )


def _inflight(path: str) -> Any:
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    return HudiTable.open(path).timeline().inflight_or_requested()


def _dead_letter_offsets(cfg: Any, fmt: str) -> list[int]:
    """The offsets in the dead-letter table, one per row (hudi-rs or pyiceberg)."""
    if fmt == "iceberg":
        from lakesink.formats.iceberg.format import dead_letter_coordinates_of

        return [o for _, _, o in dead_letter_coordinates_of(cfg.settings)]
    from lakesink.formats.hudi.audit import dead_letter_table_coordinates

    return [o for _, _, o in dead_letter_table_coordinates(cfg["errors.deadletter.table"])]
