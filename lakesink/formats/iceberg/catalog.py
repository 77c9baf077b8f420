"""Opening an Iceberg catalog from typed settings.

Three kinds: the SQL catalog on a SQLite file (the embedded default, `<warehouse>/catalog.db`
when no `uri` is given), the SQL catalog on PostgreSQL (`postgresql://user:pw@host:port/db`,
through SQLAlchemy's psycopg 3 dialect: the `postgres` extra), and a REST catalog. The warehouse
(where new tables' files go) is a local folder or an object-store prefix (`s3://bucket/prefix`,
`abfss://container@account.dfs.core.windows.net/prefix`), reached with the project's storage
options (endpoint, region, credentials, path style; Azure's account, key and endpoint).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from lakesink.errors import ConfigError
from lakesink.extras import require
from lakesink.formats.iceberg.errors import CatalogNotFoundError, CatalogUnavailableError
from lakesink.storage import ObjectStoreOptions, is_remote_uri
from lakesink.storage.objectstore import (
    AZURE_SCHEMES,
    PYICEBERG_KEYS,
    azure_arrow_options,
    s3_options,
    split_uri,
    virtual_hosted,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

__all__ = [
    "CatalogKind",
    "CatalogSettings",
    "file_io_properties",
    "open_catalog",
    "options_property",
    "redact_uri",
    "storage_options",
    "warehouse_uri",
]

CatalogKind = Literal["sql", "rest"]
CATALOG_KINDS: tuple[CatalogKind, ...] = ("sql", "rest")
SQLITE_FILE = "catalog.db"
FILE_IO_IMPL = "lakesink.formats.iceberg.fileio.LakesinkFileIO"
OPTIONS_PROPERTY = "lakesink.storage-options"
"""FileIO property: lakesink's storage options without the secrets (JSON): retries, timeouts,
plain http. Endpoint, region, credentials and addressing come from pyiceberg's own `s3.*`
properties, the ones pyarrow is given too."""
_SECRET_FIELDS = frozenset(
    {"access_key_id", "secret_access_key", "session_token", "azure_account_key"}
)
_FROM_PYICEBERG = frozenset({"endpoint", "region", "path_style"})


@dataclass(frozen=True, slots=True)
class CatalogSettings:
    """Where the Iceberg catalog is and where the files of new tables go."""

    warehouse: str
    """Local folder or object-store prefix (`s3://bucket/prefix`) under which tables are made."""
    kind: CatalogKind = "sql"
    """`sql` (SQLite file or PostgreSQL) or `rest`."""
    uri: str | None = field(default=None, repr=False)
    """sql: `sqlite:////abs/catalog.db` or `postgresql://user:pw@host:port/db`; default: a
    SQLite file `catalog.db` in a local warehouse. rest: the server's `http(s)://` URL."""
    name: str = "lakesink"
    """The catalog's name (the SQL catalog keeps it in every row)."""
    create: bool = True
    """Create a missing SQLite catalog file (and the SQL catalog's tables); off: a missing
    catalog is an error."""
    storage: ObjectStoreOptions = field(default_factory=ObjectStoreOptions)
    """How to reach an object-store warehouse."""
    properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Further pyiceberg catalog properties (e.g. a REST catalog's `token`)."""

    def __post_init__(self) -> None:
        if self.kind not in CATALOG_KINDS:
            raise ConfigError(
                f"iceberg catalog kind {self.kind!r} is not valid; use one of "
                f"{', '.join(CATALOG_KINDS)}"
            )
        if not self.warehouse:
            raise ConfigError("iceberg catalog: warehouse must name a folder or s3:// prefix")
        if self.kind == "rest" and not self.uri:
            raise ConfigError("iceberg catalog kind 'rest' needs uri (the server's http URL)")


def warehouse_uri(warehouse: str) -> str:
    """The warehouse as a URI pyiceberg and other readers take: `file:///abs/path` for a
    local folder, an object-store URI as it is (`s3a://` as `s3://`)."""
    if is_remote_uri(warehouse):
        scheme, _, rest = warehouse.partition("://")
        return ("s3" if scheme.lower() == "s3a" else scheme.lower()) + "://" + rest.rstrip("/")
    if warehouse.startswith("file://"):
        return warehouse.rstrip("/")
    return Path(os.path.abspath(warehouse)).as_uri()


ADLS_KEYS = {
    "account_name": "adls.account-name",
    "account_key": "adls.account-key",
    "blob_storage_authority": "adls.blob-storage-authority",
    "dfs_storage_authority": "adls.dfs-storage-authority",
    "blob_storage_scheme": "adls.blob-storage-scheme",
    "dfs_storage_scheme": "adls.dfs-storage-scheme",
}
"""pyiceberg's FileIO properties for pyarrow's AzureFileSystem arguments."""


def file_io_properties(storage: ObjectStoreOptions, location: str | None = None) -> dict[str, str]:
    """pyiceberg FileIO properties (pyarrow's filesystems; small metadata objects on S3 in one
    PUT, Azure paths without their account: `fileio.LakesinkFileIO`) for the storage options;
    for a `location` (a warehouse, a table) on Azure also its account, key and endpoint
    (`adls.*`), which pyiceberg takes from nowhere else. They hold credentials: never log
    them."""
    props = {
        "py-io-impl": FILE_IO_IMPL,
        OPTIONS_PROPERTY: options_property(storage),
    }
    if location is not None and split_uri(location)[0] in AZURE_SCHEMES:
        for name, value in azure_arrow_options(location, storage).items():
            props[ADLS_KEYS[name]] = value
    props.update(s3_options(storage, PYICEBERG_KEYS))
    props["s3.force-virtual-addressing"] = "true" if virtual_hosted(storage) else "false"
    props["s3.connect-timeout"] = str(storage.connect_timeout_s)
    props["s3.request-timeout"] = str(storage.request_timeout_s)
    return props


def options_property(options: ObjectStoreOptions) -> str:
    """The non-secret storage options as the FileIO property's JSON."""
    kept = {
        k: v
        for k, v in asdict(options).items()
        if k not in _SECRET_FIELDS | _FROM_PYICEBERG and v is not None
    }
    return json.dumps(kept, sort_keys=True)


def storage_options(properties: Mapping[str, str]) -> ObjectStoreOptions:
    """The storage options a FileIO's properties describe: pyiceberg's `s3.*` keys (what
    pyarrow reaches the store with) and lakesink's own property for the rest."""
    known = {f.name for f in fields(ObjectStoreOptions)}
    raw = json.loads(properties.get(OPTIONS_PROPERTY) or "{}")
    values: dict[str, Any] = {k: v for k, v in raw.items() if k in known - _SECRET_FIELDS}
    for f in fields(PYICEBERG_KEYS):
        value = properties.get(getattr(PYICEBERG_KEYS, f.name))
        if value:
            values[f.name] = value
    virtual = str(properties.get("s3.force-virtual-addressing", "")).lower()
    values["path_style"] = virtual == "false"
    endpoint = str(values.get("endpoint") or "")
    if endpoint.lower().startswith("http://"):
        values["allow_http"] = True
    return ObjectStoreOptions(**values)


def redact_uri(uri: str) -> str:
    """`uri` with any password replaced by `***` (safe to print)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _sql_uri(settings: CatalogSettings) -> str:
    uri = settings.uri
    if uri is None:
        if is_remote_uri(settings.warehouse):
            raise ConfigError(
                "iceberg catalog: a warehouse on an object store needs uri (a PostgreSQL "
                "catalog, or a SQLite file on local disk: sqlite:////abs/catalog.db)"
            )
        folder = Path(settings.warehouse.removeprefix("file://"))
        if settings.create:
            folder.mkdir(parents=True, exist_ok=True)
        uri = "sqlite:///" + str(folder.resolve() / SQLITE_FILE)
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg" + uri[len(scheme) :]
    if scheme in ("postgresql+psycopg", "sqlite"):
        return uri
    raise ConfigError(
        f"iceberg catalog uri {redact_uri(uri)!r} is not valid for kind 'sql'; use "
        "sqlite:////abs/catalog.db or postgresql://user:password@host:port/database"
    )


def open_catalog(settings: CatalogSettings) -> Catalog:
    """The catalog the settings name. CatalogNotFoundError when it does not exist (and
    `create` is off), CatalogUnavailableError when it cannot be reached; a missing extra
    names it."""
    require("pyiceberg", "Iceberg tables")
    props = dict(file_io_properties(settings.storage, warehouse_uri(settings.warehouse)))
    props["warehouse"] = warehouse_uri(settings.warehouse)
    props.update(settings.properties)
    if settings.kind == "rest":
        return _open_rest(settings, props)
    uri = _sql_uri(settings)
    if uri.startswith("postgresql+psycopg"):
        require("psycopg", "an Iceberg SQL catalog on PostgreSQL")
    elif not settings.create:
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise CatalogNotFoundError(
                f"no Iceberg catalog at {path}: the SQLite file does not exist; point uri at "
                "the catalog, or allow create"
            )
    props["uri"] = uri
    props["init_catalog_tables"] = "true" if settings.create else "false"
    return _open_sql(settings, props)


def _open_sql(settings: CatalogSettings, props: dict[str, str]) -> Catalog:
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

    shown = redact_uri(props["uri"])
    try:
        catalog = SqlCatalog(settings.name, **props)
    except (OperationalError, DBAPIError) as e:
        raise CatalogUnavailableError(
            f"the Iceberg SQL catalog at {shown} cannot be reached: "
            f"{str(e.orig if e.orig is not None else e).splitlines()[0]}"
        ) from e
    if not settings.create:
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        try:
            with Session(catalog.engine) as session:
                session.execute(select(1).select_from(IcebergTables).limit(1))
        except (OperationalError, ProgrammingError) as e:
            raise CatalogNotFoundError(
                f"no Iceberg catalog at {shown}: its tables do not exist; allow create to make them"
            ) from e
    log.debug("opened Iceberg SQL catalog %s at %s", settings.name, shown)
    return catalog


def _open_rest(settings: CatalogSettings, props: dict[str, str]) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog

    assert settings.uri is not None
    props["uri"] = settings.uri
    shown = redact_uri(settings.uri)
    try:
        return RestCatalog(settings.name, **props)
    except OSError as e:
        raise CatalogUnavailableError(
            f"the Iceberg REST catalog at {shown} cannot be reached: {e}"
        ) from e
    except Exception as e:  # requests' errors and pyiceberg's RESTError subclasses
        if type(e).__module__.startswith(("requests", "urllib3")):
            raise CatalogUnavailableError(
                f"the Iceberg REST catalog at {shown} cannot be reached: {type(e).__name__}"
            ) from e
        raise
