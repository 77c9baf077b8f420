"""Iceberg maintenance without a table: maintenance snapshots in the lineage walk, the rewrite's
options, the options drawn from configuration, and the inline action names. Pure values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lakesink.config import load_config
from lakesink.errors import ConfigError
from lakesink.formats.iceberg.errors import SummaryLayoutError
from lakesink.formats.iceberg.rewrite import RewriteOptions
from lakesink.formats.iceberg.services import (
    DEFAULT_EXPIRE_HOURS,
    EXPIRE,
    ORPHANS,
    REWRITE,
    IcebergMaintenanceOptions,
    inline_actions,
)
from lakesink.formats.iceberg.snapshots import (
    KEY_LAYOUT,
    KEY_MAINTENANCE,
    LAYOUT,
    SnapshotInfo,
    WriterCommit,
    find_writer_commit,
    last_commit_by_writer,
)
from lakesink.protocol.offsets import TopicPartition, WriterOffsets

A0 = TopicPartition("a", 0)
REPLACE = {KEY_LAYOUT: LAYOUT, KEY_MAINTENANCE: "rewrite-data-files"}


def base_config(**extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.topics": "a",
        "value.format": "raw",
        "table.path": "/tmp/wh",
        "table.format": "iceberg",
        **extra,
    }


def test_maintenance_summary_is_no_writers_commit() -> None:
    assert WriterCommit.from_summary(REPLACE, 7) is None


def test_maintenance_summary_of_another_layout_is_still_refused() -> None:
    with pytest.raises(SummaryLayoutError):
        WriterCommit.from_summary({KEY_LAYOUT: "9", "lakesink.writer-id": "w"}, 7)


def test_lineage_walk_passes_replace_snapshots_to_the_writers_commit() -> None:
    wa = WriterCommit("wa", "c1", WriterOffsets({A0: 5})).to_summary()
    snaps = {
        1: SnapshotInfo(1, None, 1, 100, wa),
        2: SnapshotInfo(2, 1, 2, 200, REPLACE),
        3: SnapshotInfo(3, 2, 3, 300, REPLACE),
    }
    found = find_writer_commit(snaps, 3, "wa")
    assert found is not None and found.offsets.next_offsets == {A0: 5}
    assert last_commit_by_writer(snaps, 3) == {"wa": 1}


@pytest.mark.parametrize(
    ("small", "target", "min_files", "named"),
    [
        (0, 10, 2, "small_file_bytes"),  # nothing is smaller than 0 bytes
        (10, -1, 2, "target_file_bytes"),  # no size to cut at
        (10, 10, 1, "min_files"),  # a single file rewritten alone gains nothing
    ],
)
def test_rewrite_options_name_the_bad_value(
    small: int, target: int, min_files: int, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        RewriteOptions(small, target, min_files)


def test_options_come_from_the_table_services_keys() -> None:
    cfg = load_config(
        None,
        base_config(
            **{
                "table.services.clean.retain.hours": "6",
                "table.services.clustering.small.file.bytes": "1000",
                "table.services.clustering.min.files": "3",
                "table.target.file.size.bytes": "5000",
                "table.services.clustering.tier.ratio": "4",
            }
        ),
    )
    options = IcebergMaintenanceOptions.from_settings(cfg.settings)
    assert options.expire_older_than_hours == 6.0
    assert options.rewrite == RewriteOptions(1000, 5000, 3, tier_ratio=4)
    unset = IcebergMaintenanceOptions.from_settings(load_config(None, base_config()).settings)
    assert unset.expire_older_than_hours == DEFAULT_EXPIRE_HOURS


def test_negative_window_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="orphan_older_than_hours"):
        IcebergMaintenanceOptions(orphan_older_than_hours=-1)


@pytest.mark.parametrize(
    ("names", "actions"),
    [
        (("clean", "cluster", "archive"), (EXPIRE, ORPHANS, REWRITE)),
        (("cluster",), ("rewrite-data-files",)),
        (("rewrite-data-files", "expire-snapshots"), ("rewrite-data-files", "expire-snapshots")),
        (("archive",), ()),  # no Iceberg counterpart
    ],
)  # fmt: skip
def test_inline_names_map_to_iceberg_actions(
    names: tuple[str, ...], actions: tuple[str, ...]
) -> None:
    assert inline_actions(names) == actions


def test_unknown_inline_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'compact'.*rewrite-data-files.*cluster"):
        inline_actions(("compact",))


def test_inline_maintenance_is_on_by_default_every_n_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakesink.formats.iceberg import services as maint
    from lakesink.protocol.instant import InstantTime

    settings = load_config(None, base_config()).settings  # no table.services.* key
    ran: list[tuple[str, ...]] = []

    def record(table: object, options: object, which: tuple[str, ...], **kw: object) -> object:
        ran.append(which)
        return maint.MaintenanceRun()

    monkeypatch.setattr(maint, "run_iceberg_maintenance", record)
    table = SimpleNamespace(name="lakesink.events")  # never touched: the run is recorded
    hook = maint.iceberg_maintenance_hook(table, settings)  # type: ignore[arg-type]
    every = settings.services.inline_every_commits
    assert every > 1
    outcomes = [hook(InstantTime(f"20260101000000{n:03d}")) for n in range(2 * every)]
    ran_at = [n + 1 for n, out in enumerate(outcomes) if out is not None]
    assert ran_at == [every, 2 * every]
    # clean then cluster, by default; orphan removal at most hourly (the first run's)
    assert ran == [(EXPIRE, ORPHANS, REWRITE), (EXPIRE, REWRITE)]


def test_default_small_file_threshold_follows_the_target_size() -> None:
    # a file clustering wrote, near the target, is not small again: no endless rewrites
    for target in (8 << 20, 128 << 20, 1 << 30):
        settings = load_config(
            None, base_config(**{"table.target.file.size.bytes": str(target)})
        ).settings
        small = IcebergMaintenanceOptions.from_settings(settings).rewrite.small_file_bytes
        assert target // 2 < small < target
        assert settings.services.clustering_small_file_bytes == small  # Hudi's clustering too
