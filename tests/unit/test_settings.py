"""The typed settings (lakesink.settings) the layers below spark/ take: built once from a
configuration, each field the value of its key, secrets kept out of their repr."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.config import build_config, storage_access_from_env
from lakesink.errors import ConfigError
from lakesink.settings import Settings, StorageAccess, parse_kv
from lakesink.storage import LocalStorage


def _config(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.topics": "orders,refunds",
        "table.path": str(tmp_path / "orders"),
        "value.schema": "id BIGINT",
        **extra,
    }


def test_settings_are_built_once_per_configuration(tmp_path: Path) -> None:
    cfg = build_config(_config(tmp_path))
    assert isinstance(cfg.settings, Settings)
    assert cfg.settings is cfg.settings
    assert cfg.with_overrides({"writer.id": "other"}).settings.writer_id == "other"


def test_each_field_holds_its_keys_value(tmp_path: Path) -> None:
    cfg = build_config(
        _config(
            tmp_path,
            **{
                "table.format": "iceberg",
                "table.partition.by": "region",
                "iceberg.namespace": "sales.eu",
                "errors.tolerance": "all",
                "errors.deadletter.table": "orders_dead",
                "commit.mode": "async",
                "lock.timeout.s": 7,
                "table.services.inline": "clean",
                "table.services.inline.every.commits": 3,
                "storage.retry.max": 2,
                "kafka.consumer.config": "fetch.max.bytes=1000",
            },
        )
    )
    s = cfg.settings
    assert (s.table.format, s.table.name, s.table.partition_by) == (
        "iceberg",
        "orders",
        ("region",),
    )
    assert s.table.path == cfg["table.path"]
    assert s.iceberg.namespace == "sales.eu" and s.iceberg.catalog_name == "lakesink"
    assert s.kafka.topics == ("orders", "refunds")
    assert s.kafka.consumer_config == cfg.consumer_config
    assert s.kafka.client_config == cfg.kafka_client_config
    assert s.dead_letters.table == "orders_dead"
    assert s.dead_letters.writer_id == cfg.dead_letter_writer_id
    assert s.writer_id == s.commit.writer_id == cfg.writer_id
    assert s.commit.mode == "async" and s.commit.lock_timeout_s == 7.0
    assert s.commit.pending_store_path == cfg.pending_store_path
    assert s.services.inline == ("clean",) and s.services.inline_every_commits == 3
    assert s.storage.max_retries == 2
    assert s.table_storage().uri == cfg.table_storage.uri


def test_settings_repr_shows_no_secret(tmp_path: Path) -> None:
    cfg = build_config(
        _config(
            tmp_path,
            **{
                "postgres.dsn": "postgresql://u:hunter2@db/x",
                "lock.provider": "postgres",
                "storage.s3.secret.access.key": "hunter3",
                "iceberg.catalog.uri": "sqlite:////tmp/hunter4.db",
            },
        )
    )
    shown = repr(cfg.settings)
    assert "hunter" not in shown
    assert cfg.settings.commit.postgres_dsn == "postgresql://u:hunter2@db/x"


def test_storage_access_opens_paths_and_names_what_it_cannot_open(tmp_path: Path) -> None:
    access = storage_access_from_env({"LAKESINK_STORAGE_RETRY_MAX": "3"})
    assert access.options.max_retries == 3
    assert isinstance(StorageAccess().open(str(tmp_path)), LocalStorage)
    with pytest.raises(ConfigError, match="unsupported storage scheme"):
        access.open("ftp://host/table")


def test_settings_lists_keep_commas_inside_values() -> None:
    assert parse_kv("spark.jars=a.jar,b.jar,spark.x=1") == {
        "spark.jars": "a.jar,b.jar",
        "spark.x": "1",
    }
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_kv("novalue")
