"""The S3 endpoint a table is reached at: `storage.s3.endpoint`, else the standard AWS
environment (`AWS_ENDPOINT_URL_S3`, then `AWS_ENDPOINT_URL`, as boto3 and the AWS CLI take
them), else AWS itself. The environment is read once, where the storage options are built, so
lakesink's own clients and every reader it configures (hudi-rs, pyiceberg, pyarrow) use the same
address with the same (path-style) addressing: obstore reads these variables by itself, and a
store that saw an endpoint lakesink did not would build virtual-hosted URLs on it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

ENDPOINT_KEY = "storage.s3.endpoint"
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""In the order they win: the S3-specific one first (boto3's rule), `AWS_ENDPOINT` last
(object_store's older name)."""
ALLOW_HTTP_VARIABLE = "AWS_ALLOW_HTTP"
"""object_store's switch for plain http, honoured beside `storage.s3.allow.http`."""
_TRUE = ("true", "1", "yes", "on")


@dataclass(frozen=True, slots=True)
class EnvironmentEndpoint:
    """An endpoint the environment names: the variable it came from and its value."""

    variable: str
    url: str
    allow_http: bool
    """Whether the environment also allows plain http (`AWS_ALLOW_HTTP`)."""


def environment_endpoint(environ: Mapping[str, str] | None = None) -> EnvironmentEndpoint | None:
    """The endpoint of the AWS environment, or None when no variable names one."""
    env = os.environ if environ is None else environ
    allow_http = env.get(ALLOW_HTTP_VARIABLE, "").strip().lower() in _TRUE
    for name in ENDPOINT_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return EnvironmentEndpoint(name, value, allow_http)
    return None


def endpoint_overridden(
    endpoint: str | None, source: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why lakesink's own client would not use `endpoint`, in one line; None when it would.
    obstore lets `AWS_ENDPOINT_URL_S3` of the environment win over the endpoint it is given,
    so a different `storage.s3.endpoint` (or none: AWS) cannot be honoured beside it."""
    env = os.environ if environ is None else environ
    name = ENDPOINT_VARIABLES[0]
    other = env.get(name, "").strip()
    if not other or other == endpoint:
        return None
    wanted = f"{source}={endpoint!r}" if endpoint else "AWS itself (no endpoint)"
    return (
        f"{name}={other!r} in the environment would override {wanted} in lakesink's S3 "
        f"client; unset {name} or make the two agree"
    )


def endpoint_problem(endpoint: str, source: str, allow_http: bool) -> str | None:
    """Why no request address can be built on `endpoint` (named by `source`: the key or the
    variable it came from), in one line; None when it is usable."""
    shown = f"{source}={endpoint!r}"
    try:
        parts = urlsplit(endpoint)
        port = parts.port  # a bad port raises here, not in the HTTP client
    except ValueError as e:
        return f"{shown} is no URL ({e}); write it as http(s)://host[:port]"
    _ = port
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return f"{shown} is no URL with a scheme and a host; write it as http(s)://host[:port]"
    if parts.scheme.lower() == "http" and not allow_http:
        return (
            f"{shown} is plain http, which lakesink refuses unless asked: set "
            f"storage.s3.allow.http=true (or {ALLOW_HTTP_VARIABLE}=true), or use https"
        )
    return None
