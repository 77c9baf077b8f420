"""Storage on an object store (S3 and S3-compatible stores, GCS, Azure) through `obstore`
(the Rust object_store crate): whole-object PUTs, conditional creates (`If-None-Match: *`) and
ETag-guarded replaces (`If-Match`), with retries and timeouts that the configuration sets.
Parquet goes through pyarrow's native filesystems (multipart uploads, ranged reads)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lakesink.extras import require
from lakesink.storage.base import (
    Listing,
    ObjectChangedError,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    Storage,
    StorageError,
    StorageUnsupportedError,
)
from lakesink.storage.endpoint import (
    ENDPOINT_KEY,
    endpoint_overridden,
    endpoint_problem,
    environment_endpoint,
)

if TYPE_CHECKING:
    import pyarrow.fs
    from obstore import UpdateVersion

log = logging.getLogger(__name__)

OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "abfss", "abfs", "az", "azure")
AZURE_SCHEMES = ("abfss", "abfs", "az", "azure")
GCS_SCHEMES = ("gs",)
PROBE_FOLDER = ".hoodie/.aux/lakesink/probe"
_REFUSED_REQUEST = re.compile(r"\b(?:400 Bad Request|405 Method Not Allowed|501 Not Implemented)\b")
"""A store's answer to a request it does not implement (an emulator's, to a conditional PUT)."""
_NO_VERSION = re.compile(r"ETag Header missing", re.IGNORECASE)
"""object_store's error for a PUT the store took but answered without the object's version (no
ETag, no generation): nothing a replace could be guarded by."""


@dataclass(frozen=True, slots=True)
class ObjectStoreOptions:
    """How to reach the store. Secrets are kept as plain strings here only after the
    configuration resolved them; `__repr__` never shows them."""

    endpoint: str | None = None
    """Endpoint override for S3-compatible stores (MinIO, Ceph, R2, moto)."""
    region: str | None = None
    allow_http: bool = False
    path_style: bool = False
    """Path-style requests (`endpoint/bucket/key`) instead of virtual-hosted buckets."""
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    azure_endpoint: str | None = None
    """Azure Blob endpoint override (Azurite: http://127.0.0.1:10000/devstoreaccount1)."""
    azure_account_key: str | None = field(default=None, repr=False)
    max_retries: int = 10
    retry_timeout_s: float = 180.0
    init_backoff_s: float = 0.1
    max_backoff_s: float = 15.0
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    endpoint_source: str = ENDPOINT_KEY
    """Where `endpoint` came from (the key or an AWS_ENDPOINT_URL* variable): errors name it."""


def with_environment_endpoint(
    options: ObjectStoreOptions, environ: Mapping[str, str] | None = None
) -> ObjectStoreOptions:
    """`options` with the AWS environment's endpoint when they name none (boto3's rule), and
    its `AWS_ALLOW_HTTP`; as they are otherwise."""
    if options.endpoint:
        return options
    found = environment_endpoint(environ)
    if found is None:
        return options
    return replace(
        options,
        endpoint=found.url,
        endpoint_source=found.variable,
        allow_http=options.allow_http or found.allow_http,
    )


@dataclass(frozen=True)
class S3Keys:
    """One S3 client's option names for the settings lakesink passes on."""

    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str
    session_token: str


OBSTORE_KEYS = S3Keys("endpoint", "region", "access_key_id", "secret_access_key", "session_token")
"""obstore's `S3Config` (lakesink's own store)."""
OBJECT_STORE_KEYS = S3Keys(
    "aws_endpoint_url",
    "aws_region",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)
"""Rust object_store's environment-style keys (hudi-rs and other readers of the table)."""
PYICEBERG_KEYS = S3Keys(
    "s3.endpoint", "s3.region", "s3.access-key-id", "s3.secret-access-key", "s3.session-token"
)
"""pyiceberg's FileIO properties."""


def s3_options(options: ObjectStoreOptions, keys: S3Keys) -> dict[str, str]:
    """The endpoint, region and credentials that are set, under `keys`' names. Holds secrets:
    hand it to a client, never log it."""
    out: dict[str, str] = {}
    for key in fields(keys):
        value = getattr(options, key.name)
        if value:
            out[getattr(keys, key.name)] = value
    return out


def virtual_hosted(options: ObjectStoreOptions) -> bool:
    """Virtual-hosted bucket addressing: only for AWS itself; an endpoint override (an
    S3-compatible store) or path_style means path-style requests."""
    return not options.path_style and not options.endpoint


def azure_account_container(uri: str) -> tuple[str | None, str]:
    """The storage account and container of an Azure URI: `abfss://container@account.dfs.core.
    windows.net/prefix` names both, `az://container/prefix` only the container (the account
    then comes from AZURE_STORAGE_ACCOUNT_NAME)."""
    parts = urlsplit(uri)
    if parts.username:
        return (parts.hostname or "").split(".", 1)[0] or None, parts.username
    return None, parts.hostname or parts.netloc


def azure_arrow_options(uri: str, options: ObjectStoreOptions) -> dict[str, str]:
    """pyarrow's `AzureFileSystem` arguments for an Azure URI: the account (the URI's, else
    AZURE_STORAGE_ACCOUNT_NAME), the key (`storage.azure.account.key`, else
    AZURE_STORAGE_ACCOUNT_KEY) and the endpoint's authorities and scheme; those that are known.
    Holds secrets: hand it to a client, never log it."""
    out: dict[str, str] = {}
    account = azure_account_container(uri)[0] or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if account:
        out["account_name"] = account
    key = options.azure_account_key or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        out["account_key"] = key
    endpoint = options.azure_endpoint
    if endpoint:
        parts = urlsplit(endpoint)
        host = parts.netloc
        # pyarrow takes the service's authority: an account's own host name goes without
        # the account (`blob.core.windows.net`); an emulator's address stays whole and
        # pyarrow puts the account in the path, as the endpoint does
        authority = host.split(".", 1)[1] if account and host.startswith(f"{account}.") else host
        dfs = "dfs." + authority[5:] if authority.startswith("blob.") else authority
        scheme = parts.scheme.lower() or "https"
        out.update(
            blob_storage_authority=authority,
            dfs_storage_authority=dfs,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    return out


def split_uri(uri: str) -> tuple[str, str, str]:
    """`s3://bucket/some/prefix` -> ("s3", "bucket", "some/prefix")."""
    parts = urlsplit(uri)
    return parts.scheme.lower(), parts.netloc, parts.path.strip("/")


def _translate(err: BaseException, what: str, uri: str) -> StorageError:
    """An obstore error as a lakesink StorageError with one clear line, secrets never included."""
    from obstore import exceptions as ox

    name = type(err).__name__
    text = str(err).splitlines()[0] if str(err) else name
    lowered = str(err).lower()
    if "nosuchbucket" in lowered:
        return StorageError(f"{what}: the bucket of {uri} does not exist; create it first")
    if "containernotfound" in lowered:  # Azure's answer for a missing container
        return StorageError(f"{what}: the container of {uri} does not exist; create it first")
    if isinstance(err, ox.NotFoundError | FileNotFoundError):
        return ObjectNotFoundError(f"{what}: no object ({uri})")
    if isinstance(err, ox.AlreadyExistsError):
        return ObjectExistsError(f"{what}: exists already ({uri})")
    if isinstance(err, ox.PreconditionError):
        return ObjectChangedError(f"{what}: changed since it was read ({uri})")
    # 403 only as the status the store answered: object keys hold instants such as
    # 20261124030120778, whose digits must never read as a refusal of the credentials
    if (
        isinstance(err, ox.UnauthenticatedError | ox.PermissionDeniedError)
        or any(w in lowered for w in ("invalidaccesskeyid", "signaturedoesnotmatch"))
        or "accessdenied" in lowered
        or re.search(r"status(?: code)?:? 403\b|(?<!\d)403 forbidden", lowered) is not None
    ):
        check = (
            "storage.azure.account.key / AZURE_STORAGE_ACCOUNT_KEY"
            if split_uri(uri)[0] in AZURE_SCHEMES
            else "storage.s3.access.key.id / AWS_ACCESS_KEY_ID and the secret key"
        )
        return StorageError(
            f"{what}: the store refused the credentials for {uri} ({name}); check {check}"
        )
    status = re.search(r"status code: (5\d\d)[^:]*", text)
    if status is not None:  # the store answered, with an error, until the retries ran out
        code = re.search(r"<Code>([A-Za-z]+)</Code>", str(err))
        detail = f"{status.group(0)[13:]}{f' ({code.group(1)})' if code else ''}"
        return StorageError(
            f"{what}: the store for {uri} kept answering {detail} (after retries); "
            "try again later, or raise storage.retry.max / storage.retry.timeout.s"
        )
    if any(w in lowered for w in ("connect", "dns", "timed out", "refused")) or (
        "timeout" in lowered.replace("retry_timeout", "")
    ):
        return StorageError(
            f"{what}: cannot reach the store for {uri} (after retries): {text[:200]}; check "
            "storage.s3.endpoint and the network"
        )
    return StorageError(f"{what} on {uri} failed: {name}: {text[:300]}")


class ObjectStoreStorage(Storage):
    """A table root `scheme://bucket/prefix` on an object store."""

    __slots__ = ("_arrow", "_options", "_store", "_uri")

    def __init__(self, uri: str, options: ObjectStoreOptions | None = None) -> None:
        scheme, bucket, _prefix = split_uri(uri)
        if scheme not in OBJECT_STORE_SCHEMES or not bucket:
            raise StorageError(
                f"{uri!r} is not an object-store URI; use s3://bucket/prefix, gs://, abfss://"
            )
        require("obstore", f"tables on object stores ({uri})")
        self._uri = uri.rstrip("/")
        options = options or ObjectStoreOptions()
        self._options = with_environment_endpoint(options) if scheme in ("s3", "s3a") else options
        self._store: Any = None
        self._arrow: tuple[pyarrow.fs.FileSystem, str] | None = None

    def __getstate__(self) -> tuple[str, ObjectStoreOptions]:
        return self._uri, self._options

    def __setstate__(self, state: tuple[str, ObjectStoreOptions]) -> None:
        self._uri, self._options = state
        self._store = None
        self._arrow = None

    def __repr__(self) -> str:
        return f"ObjectStoreStorage({self._uri!r})"

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def options(self) -> ObjectStoreOptions:
        return self._options

    def reader_options(self) -> dict[str, str]:
        """object_store configuration for other readers of the table (hudi-rs): the endpoint,
        region and credentials. Holds secrets: hand it to a client, never log it."""
        o = self._options
        scheme = split_uri(self._uri)[0]
        if scheme in AZURE_SCHEMES:
            return self._azure_options("azure_storage_")
        if scheme not in ("s3", "s3a"):
            return {}
        out = {"aws_allow_http": "true" if o.allow_http else "false"}
        out.update(s3_options(o, OBJECT_STORE_KEYS))
        if not virtual_hosted(o):
            out["aws_virtual_hosted_style_request"] = "false"
        return out

    def _azure_account_key(self) -> str | None:
        return self._options.azure_account_key or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")

    def _azure_options(self, prefix: str) -> dict[str, str]:
        """The Azure account, key and endpoint that are set, as object_store options (`prefix`
        "" for obstore's names, "azure_storage_" for other readers'). Holds secrets."""
        o = self._options
        account = azure_account_container(self._uri)[0]
        out: dict[str, str] = {}
        if account:
            out[f"{prefix}account_name"] = account
        key = self._azure_account_key()
        if key:
            out[f"{prefix}account_key"] = key
        if o.azure_endpoint:
            out[f"{prefix}endpoint"] = o.azure_endpoint
            if urlsplit(o.azure_endpoint).scheme.lower() == "http":
                out["azure_allow_http"] = "true"
        return out

    def _url(self, key: str) -> str:
        return f"{self._uri}/{key}" if key else self._uri

    # -- clients -----------------------------------------------------------------------------

    def _check_endpoint(self) -> None:
        """Refuse, in one line naming the cause, an endpoint no request address can be built
        on (before a client turns it into an HTTP builder error)."""
        o = self._options
        if split_uri(self._uri)[0] not in ("s3", "s3a"):
            return
        problem = endpoint_overridden(o.endpoint, o.endpoint_source)
        if problem is None and o.endpoint:
            problem = endpoint_problem(o.endpoint, o.endpoint_source, o.allow_http)
        if problem is not None:
            raise StorageError(f"cannot reach {self._uri}: {problem}")

    def _config(self) -> dict[str, Any]:
        o = self._options
        scheme = split_uri(self._uri)[0]
        cfg: dict[str, Any] = {}
        if scheme in ("s3", "s3a"):
            cfg.update(s3_options(o, OBSTORE_KEYS))
            cfg["virtual_hosted_style_request"] = virtual_hosted(o)
            cfg["conditional_put"] = "etag"
        elif scheme in AZURE_SCHEMES:
            azure = self._azure_options("")
            azure.pop("azure_allow_http", None)  # a client option, below
            cfg.update(azure)
        return cfg

    def _allow_http(self) -> bool:
        """Plain http: asked for (S3), an Azure endpoint written as http:// (an emulator), or
        GCS, whose address only a service-account file changes (object_store's own default
        there: Google itself is https)."""
        o = self._options
        if split_uri(self._uri)[0] in GCS_SCHEMES:
            return True
        azure_http = split_uri(self._uri)[0] in AZURE_SCHEMES and bool(o.azure_endpoint)
        return o.allow_http or (
            azure_http and urlsplit(o.azure_endpoint or "").scheme.lower() == "http"
        )

    @property
    def store(self) -> Any:
        if self._store is None:
            from obstore.store import from_url as _from_url

            from_url: Any = _from_url
            self._check_endpoint()
            o = self._options
            scheme, bucket, prefix = split_uri(self._uri)
            url = f"{'s3' if scheme == 's3a' else scheme}://{bucket}"
            if prefix:
                url += f"/{prefix}"
            try:
                self._store = from_url(
                    url,
                    config=self._config(),
                    client_options={
                        "allow_http": self._allow_http(),
                        "connect_timeout": timedelta(seconds=o.connect_timeout_s),
                        "timeout": timedelta(seconds=o.request_timeout_s),
                    },
                    retry_config={
                        "max_retries": o.max_retries,
                        "retry_timeout": timedelta(seconds=o.retry_timeout_s),
                        "backoff": {
                            "init_backoff": timedelta(seconds=o.init_backoff_s),
                            "max_backoff": timedelta(seconds=o.max_backoff_s),
                            "base": 2.0,
                        },
                    },
                )
            except Exception as e:
                raise StorageError(
                    f"cannot configure the object store for {self._uri}: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}"
                ) from None
        return self._store

    def arrow(self) -> tuple[pyarrow.fs.FileSystem, str]:
        if self._arrow is None:
            import pyarrow.fs as pafs

            scheme, bucket, prefix = split_uri(self._uri)
            root = f"{bucket}/{prefix}" if prefix else bucket
            self._check_endpoint()
            if scheme in ("s3", "s3a"):
                o = self._options
                kwargs: dict[str, Any] = {
                    "connect_timeout": o.connect_timeout_s,
                    "request_timeout": o.request_timeout_s,
                    "retry_strategy": pafs.AwsStandardS3RetryStrategy(
                        max_attempts=max(1, o.max_retries)
                    ),
                    "check_directory_existence_before_creation": False,
                    # an upload begins when the first part is full, so a file smaller than a
                    # part (a streaming batch's) is one PUT, not create + part + complete; an
                    # error of the store then surfaces at a write or the close, not the open
                    "allow_delayed_open": True,
                }
                if o.region:  # else pyarrow resolves it like the AWS SDK does
                    kwargs["region"] = o.region
                if o.endpoint:
                    parts = urlsplit(o.endpoint)
                    kwargs["endpoint_override"] = parts.netloc or o.endpoint
                    kwargs["scheme"] = parts.scheme or ("http" if o.allow_http else "https")
                    kwargs["force_virtual_addressing"] = False
                elif o.allow_http:
                    kwargs["scheme"] = "http"
                if o.access_key_id and o.secret_access_key:
                    kwargs["access_key"] = o.access_key_id
                    kwargs["secret_key"] = o.secret_access_key
                    if o.session_token:
                        kwargs["session_token"] = o.session_token
                self._arrow = (pafs.S3FileSystem(**kwargs), root)
            elif scheme in AZURE_SCHEMES:
                self._arrow = (self._azure_filesystem(), self._azure_root())
            else:
                fs, path = pafs.FileSystem.from_uri(self._uri)
                self._arrow = (fs, path.rstrip("/"))
        return self._arrow

    def _azure_root(self) -> str:
        _, container = azure_account_container(self._uri)
        prefix = split_uri(self._uri)[2]
        return f"{container}/{prefix}" if prefix else container

    def _azure_filesystem(self) -> pyarrow.fs.FileSystem:
        """pyarrow's AzureFileSystem with the account, key and endpoint lakesink's own client
        uses (pyarrow reads neither the key nor an endpoint from the environment)."""
        import pyarrow.fs as pafs

        kwargs = azure_arrow_options(self._uri, self._options)
        if "account_name" not in kwargs:
            raise StorageError(
                f"{self._uri}: no Azure storage account; write the table path as "
                "abfss://container@ACCOUNT.dfs.core.windows.net/prefix or set "
                "AZURE_STORAGE_ACCOUNT_NAME"
            )
        return pafs.AzureFileSystem(**kwargs)

    def open_output(self, key: str) -> Any:
        fs, root = self.arrow()
        try:
            return fs.open_output_stream(f"{root}/{key}")
        except OSError as e:
            raise StorageError(f"cannot write {self._url(key)}: {str(e).splitlines()[0]}") from None

    # -- objects -----------------------------------------------------------------------------

    def read(self, key: str) -> bytes:
        return self.read_with_etag(key)[0]

    def read_with_etag(self, key: str) -> tuple[bytes, str]:
        import obstore

        try:
            res = obstore.get(self.store, key)
            data = bytes(res.bytes())
            return data, self._tag(res.meta)
        except Exception as e:
            raise _translate(e, f"read {key}", self._url(key)) from None

    def write(self, key: str, data: bytes) -> None:
        import obstore

        try:
            obstore.put(self.store, key, data, mode="overwrite", use_multipart=False)
        except Exception as e:
            raise _translate(e, f"write {key}", self._url(key)) from None

    def create(self, key: str, data: bytes) -> str:
        import obstore

        try:
            res = obstore.put(self.store, key, data, mode="create", use_multipart=False)
        except Exception as e:
            raise _translate(e, f"create {key}", self._url(key)) from None
        return self._tag(res)

    def replace_if_unchanged(self, key: str, data: bytes, etag: str) -> str:
        import obstore

        try:
            res = obstore.put(self.store, key, data, mode=self._if_match(etag), use_multipart=False)
        except Exception as e:
            err = _translate(e, f"replace {key}", self._url(key))
            if isinstance(err, ObjectNotFoundError):
                raise ObjectChangedError(f"replace {key}: gone ({self._url(key)})") from None
            raise err from None
        return self._tag(res)

    def _tag(self, meta: Mapping[str, Any]) -> str:
        """The version tag replace_if_unchanged is guarded by: the ETag, or on GCS the object's
        generation (object_store sends GCS's `x-goog-if-generation-match` only for a version;
        an ETag alone is refused there before any request)."""
        field_name = "version" if split_uri(self._uri)[0] in GCS_SCHEMES else "e_tag"
        return str(meta.get(field_name) or "")

    def _if_match(self, tag: str) -> UpdateVersion:
        if split_uri(self._uri)[0] in GCS_SCHEMES:
            return {"version": tag}  # obstore takes a missing key, not None, for "unset"
        return {"e_tag": tag}

    def head(self, key: str) -> ObjectMeta | None:
        import obstore

        try:
            m = obstore.head(self.store, key)
        except Exception as e:
            err = _translate(e, f"head {key}", self._url(key))
            if isinstance(err, ObjectNotFoundError):
                return None
            raise err from None
        modified = m.get("last_modified")
        stamp = modified.timestamp() if modified is not None else 0.0
        return ObjectMeta(key, int(m["size"]), self._tag(m), stamp)

    def list_prefix(self, prefix: str) -> list[ObjectMeta]:
        import obstore

        p = prefix.strip("/")
        try:
            metas = obstore.list(self.store, p + "/" if p else None).collect()
        except Exception as e:
            raise _translate(e, f"list {prefix}", self._url(prefix)) from None
        return sorted(
            (
                ObjectMeta(
                    str(m["path"]),
                    int(m["size"]),
                    self._tag(m),
                    m["last_modified"].timestamp() if m.get("last_modified") else 0.0,
                )
                for m in metas
            ),
            key=lambda m: m.key,
        )

    def list_folder(self, prefix: str) -> Listing:
        import obstore

        p = prefix.strip("/")
        try:
            res = obstore.list_with_delimiter(self.store, p or None)
        except Exception as e:
            raise _translate(e, f"list {prefix}", self._url(prefix)) from None
        objects = tuple(
            ObjectMeta(str(m["path"]), int(m["size"]), self._tag(m)) for m in res["objects"]
        )
        folders = tuple(str(c).rstrip("/").rsplit("/", 1)[-1] for c in res["common_prefixes"])
        return Listing(tuple(sorted(objects, key=lambda m: m.key)), tuple(sorted(folders)))

    def delete(self, key: str) -> None:
        import obstore

        try:
            obstore.delete(self.store, key)
        except Exception as e:
            err = _translate(e, f"delete {key}", self._url(key))
            if not isinstance(err, ObjectNotFoundError):
                raise err from None

    def delete_many(self, keys: list[str]) -> None:
        import obstore

        if not keys:
            return
        try:
            obstore.delete(self.store, keys)
        except Exception as e:
            err = _translate(e, f"delete {len(keys)} objects", self._uri)
            if not isinstance(err, ObjectNotFoundError):
                raise err from None

    def probe(self) -> None:
        """Create a probe object twice (the second must be refused) and replace it with a stale
        ETag (must be refused): a store without conditional writes cannot hold a table."""
        key = f"{PROBE_FOLDER}/{uuid.uuid4().hex}"
        try:
            etag = self.create(key, b"1")
        except StorageError as e:
            if type(e) is StorageError and _NO_VERSION.search(str(e)):
                raise self._unversioned_store(key) from None
            refused = _REFUSED_REQUEST.search(str(e))
            if type(e) is not StorageError or refused is None:
                raise
            # the request itself was refused, not the credentials, the address or the bucket:
            # a store (an emulator) that does not implement the conditional PUT
            raise StorageUnsupportedError(
                f"the store of {self._uri} refused lakesink's conditional create (a PUT with a "
                f"precondition; it answered {refused.group(0)}): lakesink needs conditional "
                "writes to publish commits atomically; use a store that supports them (AWS S3, "
                "MinIO, R2, GCS, Azure)"
            ) from None
        try:
            try:
                self.create(key, b"2")
            except ObjectExistsError:
                pass
            else:
                raise StorageUnsupportedError(
                    f"the store of {self._uri} ignores If-None-Match (create-if-absent): "
                    "lakesink needs conditional writes to publish commits atomically; use a "
                    "store that supports them (AWS S3, MinIO, R2, GCS, Azure)"
                )
            fresh = self.replace_if_unchanged(key, b"3", etag) if etag else ""
            try:
                self.replace_if_unchanged(key, b"4", etag or "stale")
            except ObjectChangedError:
                pass
            else:
                raise StorageUnsupportedError(
                    f"the store of {self._uri} ignores If-Match (replace-if-unchanged): "
                    "lakesink's lease lock needs it; use a store that supports conditional "
                    "writes, or lock.provider=postgres"
                )
            _ = fresh
        finally:
            self.delete(key)

    def _unversioned_store(self, key: str) -> StorageUnsupportedError:
        """The refusal of a store that took the probe's create but answered without a version
        (gcp-storage-emulator's XML API): a second create of the same key says whether it also
        ignores the precondition, which the refusal names."""
        try:
            self.create(key, b"2")
            took_second = True
        except StorageError as e:  # 412 (exists) when the precondition holds
            took_second = type(e) is StorageError and _NO_VERSION.search(str(e)) is not None
        with contextlib.suppress(StorageError):  # a store that lacks DELETE too keeps the probe
            self.delete(key)
        header = "x-goog-if-generation-match" if self._is_gcs() else "If-None-Match"
        ignored = (
            f"ignores {header} (create-if-absent: it took a second create of one object) and "
            if took_second
            else ""
        )
        return StorageUnsupportedError(
            f"the store of {self._uri} {ignored}answers a PUT without the object's version (no "
            "ETag or generation, nothing to guard a replace by): lakesink needs conditional "
            "writes to publish commits atomically; use a store that supports them (AWS S3, "
            "MinIO, R2, GCS, Azure)"
        )

    def _is_gcs(self) -> bool:
        return split_uri(self._uri)[0] in GCS_SCHEMES
