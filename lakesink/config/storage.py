"""The object storage keys (storage.*): S3 and Azure endpoints and credentials, retries,
timeouts."""

from __future__ import annotations

from lakesink.config.parsers import (
    Key,
    boolean,
    non_negative_int,
    optional_secret,
    optional_str,
    positive_float,
)

STORAGE_KEYS: tuple[Key, ...] = (
    Key(
        "storage.s3.endpoint",
        optional_str,
        None,
        "S3 endpoint override for S3-compatible stores (MinIO, Ceph, R2), e.g. "
        "http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL from the "
        "environment, else AWS from the region).",
    ),
    Key(
        "storage.s3.region",
        optional_str,
        None,
        "S3 region (default: AWS_REGION / AWS_DEFAULT_REGION from the environment).",
    ),
    Key(
        "storage.s3.allow.http",
        boolean,
        False,
        "Allow plain http:// endpoints (tests, MinIO); AWS_ALLOW_HTTP=true in the environment "
        "also does.",
    ),
    Key(
        "storage.s3.path.style",
        boolean,
        False,
        "Path-style requests (endpoint/bucket/key) instead of virtual-hosted buckets; an "
        "endpoint override implies them.",
    ),
    Key(
        "storage.s3.access.key.id",
        optional_secret,
        None,
        "S3 access key id (default: the standard AWS chain: AWS_ACCESS_KEY_ID, web identity, "
        "container and instance credentials); env:NAME and file:/path references work.",
        secret=True,
    ),
    Key(
        "storage.s3.secret.access.key",
        optional_secret,
        None,
        "S3 secret access key (default: the standard AWS chain); env:NAME or file:/path.",
        secret=True,
    ),
    Key(
        "storage.s3.session.token",
        optional_secret,
        None,
        "S3 session token of temporary credentials; env:NAME or file:/path.",
        secret=True,
    ),
    Key(
        "storage.azure.endpoint",
        optional_str,
        None,
        "Azure Blob endpoint override for an abfss:// / az:// table, e.g. Azurite's "
        "http://127.0.0.1:10000/devstoreaccount1 (default: https://ACCOUNT.blob.core.windows.net; "
        "a plain http:// endpoint is used as given).",
    ),
    Key(
        "storage.azure.account.key",
        optional_secret,
        None,
        "Azure storage account (shared) key (default: AZURE_STORAGE_ACCOUNT_KEY from the "
        "environment, else Azure's credential chain); env:NAME or file:/path.",
        secret=True,
    ),
    Key(
        "storage.retry.max",
        non_negative_int,
        10,
        "Retries of a failed object-store request (5xx, throttling, timeouts), with backoff.",
    ),
    Key(
        "storage.retry.timeout.s",
        positive_float,
        180.0,
        "Give up retrying an object-store request after this many seconds.",
    ),
    Key(
        "storage.retry.backoff.initial.s",
        positive_float,
        0.1,
        "First backoff between object-store retries (doubles each time).",
    ),
    Key(
        "storage.retry.backoff.max.s",
        positive_float,
        15.0,
        "Longest backoff between object-store retries.",
    ),
    Key(
        "storage.connect.timeout.s",
        positive_float,
        5.0,
        "Seconds to connect to the object store.",
    ),
    Key(
        "storage.request.timeout.s",
        positive_float,
        30.0,
        "Seconds one object-store request may take.",
    ),
)
