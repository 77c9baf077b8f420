"""Unit tests of the S3 endpoint lakesink takes from the AWS environment (AWS_ENDPOINT_URL_S3,
AWS_ENDPOINT_URL) when `storage.s3.endpoint` is unset: one resolution, path-style addressing,
the same address for every reader, and one line naming the cause when no address can be built."""

from __future__ import annotations

import pytest

from lakesink.formats.iceberg.catalog import file_io_properties
from lakesink.storage import StorageError, options_from_config
from lakesink.storage.endpoint import endpoint_overridden, endpoint_problem, environment_endpoint
from lakesink.storage.objectstore import ObjectStoreOptions, ObjectStoreStorage, virtual_hosted

ENV_ENDPOINT = "http://127.0.0.1:9123"
KEY_ENDPOINT = "http://127.0.0.1:9000"


@pytest.fixture(autouse=True)
def _no_aws_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        # the S3-specific variable wins over the general one (boto3's rule)
        (
            {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://b:2"},
            "AWS_ENDPOINT_URL_S3",
        ),
        ({"AWS_ENDPOINT_URL": "http://a:1"}, "AWS_ENDPOINT_URL"),
        # object_store's older name, last
        ({"AWS_ENDPOINT": "http://c:3", "AWS_ENDPOINT_URL": "http://a:1"}, "AWS_ENDPOINT_URL"),
        ({"AWS_ENDPOINT": "http://c:3"}, "AWS_ENDPOINT"),
        # a blank variable names nothing
        ({"AWS_ENDPOINT_URL_S3": "  ", "AWS_ENDPOINT_URL": "http://a:1"}, "AWS_ENDPOINT_URL"),
    ],
)
def test_environment_endpoint_takes_the_variables_in_boto3_order(
    environ: dict[str, str], variable: str
) -> None:
    found = environment_endpoint(environ)
    assert found is not None
    assert (found.variable, found.url) == (variable, environ[variable])


def test_no_variable_means_no_environment_endpoint_and_aws_addressing() -> None:
    assert environment_endpoint({"AWS_REGION": "eu-west-1"}) is None
    options = options_from_config({}, {"AWS_REGION": "eu-west-1"})
    assert options.endpoint is None and virtual_hosted(options)


def test_the_environment_endpoint_is_used_path_style_when_the_key_is_unset() -> None:
    env = {"AWS_ENDPOINT_URL": ENV_ENDPOINT, "AWS_ALLOW_HTTP": "true"}
    options = options_from_config({}, env)
    assert options.endpoint == ENV_ENDPOINT
    assert options.endpoint_source == "AWS_ENDPOINT_URL"
    assert options.allow_http
    assert not virtual_hosted(options)


def test_the_key_wins_over_the_environment() -> None:
    env = {"AWS_ENDPOINT_URL_S3": ENV_ENDPOINT, "AWS_ALLOW_HTTP": "true"}
    options = options_from_config({"storage.s3.endpoint": KEY_ENDPOINT}, env)
    assert options.endpoint == KEY_ENDPOINT
    assert options.endpoint_source == "storage.s3.endpoint"
    assert not options.allow_http  # the environment's switch goes with its endpoint only


def test_every_reader_is_handed_the_environment_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", ENV_ENDPOINT)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    storage = ObjectStoreStorage("s3://bucket/table")  # no options: the storage resolves them
    reader = storage.reader_options()  # hudi-rs
    assert reader["aws_endpoint_url"] == ENV_ENDPOINT
    assert reader["aws_virtual_hosted_style_request"] == "false"
    assert reader["aws_allow_http"] == "true"
    io = file_io_properties(options_from_config({}))  # pyiceberg
    assert io["s3.endpoint"] == ENV_ENDPOINT
    assert io["s3.force-virtual-addressing"] == "false"


def test_a_key_that_obstores_s3_variable_would_override_is_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # obstore lets AWS_ENDPOINT_URL_S3 win over the endpoint it is given: refused, not ignored
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", ENV_ENDPOINT)
    options = ObjectStoreOptions(endpoint=KEY_ENDPOINT, allow_http=True)
    storage = ObjectStoreStorage("s3://bucket/table", options)
    with pytest.raises(StorageError, match=r"AWS_ENDPOINT_URL_S3=.* would override") as e:
        _ = storage.store
    assert "storage.s3.endpoint='http://127.0.0.1:9000'" in str(e.value)
    assert endpoint_overridden(None, "storage.s3.endpoint") is not None  # nor AWS itself
    # the same address twice is no conflict
    assert endpoint_overridden(ENV_ENDPOINT, "storage.s3.endpoint") is None
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    assert endpoint_overridden(KEY_ENDPOINT, "storage.s3.endpoint") is None
    assert ObjectStoreStorage("s3://bucket/table", options)._config()["endpoint"] == KEY_ENDPOINT


def test_gcs_and_azure_tables_ignore_the_aws_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", ENV_ENDPOINT)
    assert ObjectStoreStorage("gs://bucket/table").options.endpoint is None


@pytest.mark.parametrize(
    ("endpoint", "allow_http", "words"),
    [
        ("http://127.0.0.1:9000", False, ["plain http", "storage.s3.allow.http=true"]),
        ("127.0.0.1:9000", True, ["no URL with a scheme and a host"]),
        ("ftp://store.example", True, ["no URL with a scheme and a host"]),
        ("http://127.0.0.1:port", True, ["no URL", "http(s)://host[:port]"]),
    ],
)
def test_an_endpoint_without_an_address_is_named_with_its_source(
    endpoint: str, allow_http: bool, words: list[str]
) -> None:
    problem = endpoint_problem(endpoint, "AWS_ENDPOINT_URL", allow_http)
    assert problem is not None
    assert problem.startswith(f"AWS_ENDPOINT_URL={endpoint!r}")
    assert all(w in problem for w in words), problem


@pytest.mark.parametrize(
    ("endpoint", "allow_http"),
    [("https://s3.example.com", False), ("http://127.0.0.1:9000", True), ("http://[::1]:9", True)],
)
def test_a_usable_endpoint_has_no_problem(endpoint: str, allow_http: bool) -> None:
    assert endpoint_problem(endpoint, "storage.s3.endpoint", allow_http) is None


def test_building_the_client_fails_in_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", ENV_ENDPOINT)  # plain http, not allowed
    storage = ObjectStoreStorage("s3://bucket/table")
    with pytest.raises(StorageError, match=r"AWS_ENDPOINT_URL='http://127\.0\.0\.1:9123'") as e:
        _ = storage.store
    assert "\n" not in str(e.value) and "storage.s3.allow.http" in str(e.value)
    with pytest.raises(StorageError, match="plain http"):
        storage.arrow()
