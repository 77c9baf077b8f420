"""Where a test's table lives: on the local file system or on the session's S3 server (moto over
HTTP). Tests parametrized with `STORES` run the same body against both."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from s3_server import S3Server

STORES = ("local", "s3")


@dataclass(frozen=True)
class TableAt:
    """A table location and the configuration overrides that reach it (`ingest_config` keys
    with `__` for `.`)."""

    path: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def is_s3(self) -> bool:
        return self.path.startswith("s3://")


def table_at(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "t"
) -> TableAt:
    """A fresh table location in `store` ("local" or "s3"); S3 tables keep Spark's checkpoint
    under tmp_path."""
    if store == "local":
        return TableAt(str(tmp_path / name))
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    overrides = {k.replace(".", "__"): v for k, v in server.storage_config().items()}
    overrides["checkpoint__location"] = str(tmp_path / f"{name}-checkpoint")
    return TableAt(f"s3://{bucket}/{name}", overrides)


def table_uri_in_env(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "t"
) -> str:
    """A fresh table location in `store` that a bare path or URI reaches, also from spawned
    processes: an S3 table's storage.* settings go into LAKESINK_STORAGE_* variables."""
    if store == "local":
        return str(tmp_path / name)
    server: S3Server = request.getfixturevalue("s3_server")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for key, value in server.storage_config().items():
        var = "LAKESINK_" + key.upper().replace(".", "_")
        monkeypatch.setenv(var, str(value).lower() if isinstance(value, bool) else str(value))
    return f"s3://{server.new_bucket()}/{name}"
