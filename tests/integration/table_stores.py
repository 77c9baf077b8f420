"""Where a test's table lives: on the local file system, on the session's S3 server (moto over
HTTP) or on its Azure Blob emulator (Azurite). Tests parametrized with `STORES` run the same body
against the first two; the tests that prove a store on an emulator add it (`EMULATED`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from emulators import Azurite
from s3_server import S3Server

STORES = ("local", "s3")
EMULATED = ("azure",)
"""The emulated stores a few tests add: the storage contract, a writer killed mid-commit, an
ingestion read by hudi-rs (GCS: fake-gcs-server and gcp-storage-emulator lack the conditional
writes lakesink needs and are refused, test_storage_contract.py)."""


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
    """A fresh table location in `store` ("local", "s3" or "azure"); tables on an object store
    keep Spark's checkpoint under tmp_path."""
    if store == "local":
        return TableAt(str(tmp_path / name))
    uri, config = _remote(store, request, name)
    overrides = {k.replace(".", "__"): v for k, v in config.items()}
    overrides["checkpoint__location"] = str(tmp_path / f"{name}-checkpoint")
    return TableAt(uri, overrides)


def _remote(store: str, request: pytest.FixtureRequest, name: str) -> tuple[str, dict[str, Any]]:
    """A fresh table URI on the session's server for `store` and the keys that reach it."""
    if store == "azure":
        azurite: Azurite = request.getfixturevalue("azurite")
        return azurite.new_table_uri(name), azurite.storage_config()
    server: S3Server = request.getfixturevalue("s3_server")
    return f"s3://{server.new_bucket()}/{name}", server.storage_config()


def table_uri_in_env(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "t"
) -> str:
    """A fresh table location in `store` that a bare path or URI reaches, also from spawned
    processes: a remote table's storage.* settings go into LAKESINK_STORAGE_* variables."""
    if store == "local":
        return str(tmp_path / name)
    uri, config = _remote(store, request, name)
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for key, value in config.items():
        var = "LAKESINK_" + key.upper().replace(".", "_")
        monkeypatch.setenv(var, str(value).lower() if isinstance(value, bool) else str(value))
    return uri
