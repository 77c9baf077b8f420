"""The storage layer under the table format: one interface (`Storage`), a local filesystem
implementation and an object-store implementation (S3 and S3-compatible stores, GCS, Azure).

`open_storage(uri, config)` is the one way to build a storage from a table URI and lakesink's
configuration keys (`storage.s3.*`, `storage.azure.*`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lakesink.storage.base import (
    Listing,
    ObjectChangedError,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    Storage,
    StorageError,
    StorageUnsupportedError,
    join,
)
from lakesink.storage.local import LAKESINK_TMP_FOLDER, TMP_FOLDER, LocalStorage
from lakesink.storage.objectstore import (
    OBJECT_STORE_SCHEMES,
    ObjectStoreOptions,
    ObjectStoreStorage,
    with_environment_endpoint,
)

__all__ = [
    "LAKESINK_TMP_FOLDER",
    "OBJECT_STORE_SCHEMES",
    "Listing",
    "LocalStorage",
    "ObjectChangedError",
    "ObjectExistsError",
    "ObjectMeta",
    "ObjectNotFoundError",
    "ObjectStoreOptions",
    "ObjectStoreStorage",
    "Storage",
    "StorageError",
    "StorageUnsupportedError",
    "as_storage",
    "is_remote_uri",
    "join",
    "open_storage",
    "options_from_config",
    "settings_from_env",
]


def is_remote_uri(uri: str | Path) -> bool:
    """Whether `uri` names an object store (s3://, gs://, abfss://, az://), not a local path."""
    if isinstance(uri, Path):
        return False
    scheme = urlsplit(uri).scheme.lower()
    return scheme in OBJECT_STORE_SCHEMES


def _reveal(v: Any) -> str | None:
    if v is None:
        return None
    reveal = getattr(v, "reveal", None)
    return str(reveal()) if callable(reveal) else str(v)


def options_from_config(
    config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> ObjectStoreOptions:
    """ObjectStoreOptions from lakesink's `storage.s3.*` and `storage.azure.*` keys (missing
    keys keep defaults); without `storage.s3.endpoint`, the endpoint of the AWS environment
    (`environ`, default os.environ: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL), resolved here once
    so that every client and reader built from the options uses the same address."""
    c = config or {}

    def get(key: str, default: Any) -> Any:
        v = c.get(key)
        return default if v is None else v

    def flag(key: str) -> bool:
        v = c.get(key)
        if isinstance(v, str):
            return v.strip().lower() in ("true", "1", "yes", "on")
        return bool(v)

    d = ObjectStoreOptions()
    given = ObjectStoreOptions(
        endpoint=get("storage.s3.endpoint", None),
        region=get("storage.s3.region", None),
        allow_http=flag("storage.s3.allow.http"),
        path_style=flag("storage.s3.path.style"),
        access_key_id=_reveal(c.get("storage.s3.access.key.id")),
        secret_access_key=_reveal(c.get("storage.s3.secret.access.key")),
        session_token=_reveal(c.get("storage.s3.session.token")),
        azure_endpoint=get("storage.azure.endpoint", None),
        azure_account_key=_reveal(c.get("storage.azure.account.key")),
        max_retries=int(get("storage.retry.max", d.max_retries)),
        retry_timeout_s=float(get("storage.retry.timeout.s", d.retry_timeout_s)),
        init_backoff_s=float(get("storage.retry.backoff.initial.s", d.init_backoff_s)),
        max_backoff_s=float(get("storage.retry.backoff.max.s", d.max_backoff_s)),
        connect_timeout_s=float(get("storage.connect.timeout.s", d.connect_timeout_s)),
        request_timeout_s=float(get("storage.request.timeout.s", d.request_timeout_s)),
    )
    return with_environment_endpoint(given, environ)


_STORAGE_KEYS = (
    "storage.s3.endpoint",
    "storage.s3.region",
    "storage.s3.allow.http",
    "storage.s3.path.style",
    "storage.s3.access.key.id",
    "storage.s3.secret.access.key",
    "storage.s3.session.token",
    "storage.azure.endpoint",
    "storage.azure.account.key",
    "storage.retry.max",
    "storage.retry.timeout.s",
    "storage.retry.backoff.initial.s",
    "storage.retry.backoff.max.s",
    "storage.connect.timeout.s",
    "storage.request.timeout.s",
)


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The storage.* settings of the environment (`LAKESINK_STORAGE_S3_ENDPOINT`, ...): what a
    table path opened without a configuration uses. `env:NAME` values are read from NAME."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key in _STORAGE_KEYS:
        value = env.get("LAKESINK_" + key.upper().replace(".", "_"))
        if value is None:
            continue
        if value.startswith("env:") and value[4:] in env:
            value = env[value[4:]]
        out[key] = value
    return out


def as_storage(where: Storage | str | os.PathLike[str]) -> Storage:
    """`where` as a Storage: a Storage as is, a path or URI opened with default options."""
    if isinstance(where, Storage):
        return where
    if isinstance(where, str):
        return open_storage(where)
    return LocalStorage(os.fspath(where))


def open_storage(
    uri: str | Path,
    config: Mapping[str, Any] | ObjectStoreOptions | None = None,
    *,
    tmp_folder: str = TMP_FOLDER,
) -> Storage:
    """The storage of a table root: `s3://bucket/prefix`, `gs://…`, `abfss://…`, `file:///path`
    or a plain path. `config` is lakesink's configuration (its `storage.*` keys) or ready options.
    `tmp_folder`: where a local root stages whole-object writes (the table format says where
    its readers never look; LAKESINK_TMP_FOLDER for a root that is no Hudi table).
    Builds no client and sends no request: call `probe()` to check the store at start."""
    if isinstance(uri, Path):
        return LocalStorage(uri, tmp_folder=tmp_folder)
    text = str(uri)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in OBJECT_STORE_SCHEMES:
        if config is None:
            config = settings_from_env()
        options = config if isinstance(config, ObjectStoreOptions) else options_from_config(config)
        return ObjectStoreStorage(text, options)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{text!r}: file:// URIs name a local path (file:///path)")
        return LocalStorage(unquote(parts.path), tmp_folder=tmp_folder)
    if scheme and len(scheme) > 1:  # "c:" would be a drive letter
        raise StorageError(
            f"{text!r}: unsupported storage scheme {scheme!r}; use a local path, file://, "
            f"or one of {', '.join(s + '://' for s in OBJECT_STORE_SCHEMES)}"
        )
    return LocalStorage(text, tmp_folder=tmp_folder)
