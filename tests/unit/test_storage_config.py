"""Storage URIs and the storage.* configuration: parsing, defaults, what is refused, and that
secrets never show (no I/O: no client is built)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakesink.config import build_config, storage_settings
from lakesink.errors import ConfigError
from lakesink.security import Secret
from lakesink.storage import (
    LocalStorage,
    ObjectStoreStorage,
    StorageError,
    is_remote_uri,
    open_storage,
    options_from_config,
    settings_from_env,
)


def _cfg(**extra: Any) -> Any:
    raw = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.topics": "t",
        "value.format": "raw",
        "table.path": "s3://lake/events/clicks",
        "writer.id": "w",
    }
    raw.update(extra)
    return build_config(raw)


@pytest.mark.parametrize(
    ("uri", "remote"),
    [
        ("s3://bucket/prefix", True),
        ("gs://bucket/p", True),
        ("abfss://container@account.dfs.core.windows.net/p", True),
        ("file:///tmp/t", False),
        ("/tmp/t", False),
        ("relative/t", False),
    ],
)
def test_table_uri_kinds_are_recognised(uri: str, remote: bool) -> None:
    assert is_remote_uri(uri) is remote
    storage = open_storage(uri)
    assert isinstance(storage, ObjectStoreStorage if remote else LocalStorage)


def test_unknown_scheme_and_bucketless_uri_are_refused_naming_what_is_valid() -> None:
    with pytest.raises(StorageError, match=r"unsupported storage scheme 'hdfs'.*s3://"):
        open_storage("hdfs://nn/t")
    with pytest.raises(StorageError, match="not an object-store URI"):
        open_storage("s3:///no-bucket")
    with pytest.raises(ConfigError, match=r"table\.path"):
        _cfg(**{"table.path": "ftp://host/t"})


def test_storage_keys_parse_into_options_and_secrets_stay_masked() -> None:
    cfg = _cfg(
        **{
            "storage.s3.endpoint": "http://127.0.0.1:9000",
            "storage.s3.allow.http": "true",
            "storage.s3.access.key.id": "AKIAEXAMPLE",
            "storage.s3.secret.access.key": "wJalrXUtnFEMI-example",
            "storage.retry.max": 3,
        }
    )
    assert isinstance(cfg["storage.s3.access.key.id"], Secret)
    options = options_from_config(cfg.values)
    assert options.endpoint == "http://127.0.0.1:9000" and options.allow_http
    assert options.max_retries == 3 and options.access_key_id == "AKIAEXAMPLE"
    storage = cfg.table_storage
    for shown in (repr(storage), repr(options), repr(cfg.values)):
        assert "AKIAEXAMPLE" not in shown and "wJalrXUtnFEMI-example" not in shown
    assert storage.uri == "s3://lake/events/clicks"


def test_secret_reference_to_a_missing_variable_is_named_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LAKESINK_TEST_S3_SECRET", raising=False)
    with pytest.raises(ConfigError, match=r"LAKESINK_TEST_S3_SECRET is not set"):
        _cfg(**{"storage.s3.secret.access.key": "env:LAKESINK_TEST_S3_SECRET"})


def test_remote_table_keeps_spark_checkpoint_local_and_names_the_table_by_its_prefix() -> None:
    cfg = _cfg()
    assert cfg.table_name == "clicks"
    ckpt = cfg.checkpoint_location
    assert (
        ckpt
        == Path.home() / ".lakesink" / "checkpoints" / "s3" / "lake" / "events" / "clicks" / "w"
    )
    local = _cfg(**{"table.path": "/data/t"})
    assert local.checkpoint_location == Path("/data/t/.hoodie/.lakesink/checkpoints/w")


def test_async_commits_with_sqlite_on_an_object_store_are_refused_naming_postgres() -> None:
    with pytest.raises(ConfigError, match=r"commit\.pending\.store=postgres"):
        _cfg(**{"commit.mode": "async"})
    ok = _cfg(**{"commit.mode": "async", "commit.pending.store": "postgres", "postgres.dsn": "x"})
    assert ok["commit.pending.store"] == "postgres"


def test_storage_settings_come_from_lakesink_environment_variables() -> None:
    env = {
        "LAKESINK_STORAGE_S3_ENDPOINT": "http://127.0.0.1:1",
        "LAKESINK_STORAGE_S3_ALLOW_HTTP": "true",
        "LAKESINK_STORAGE_RETRY_MAX": "2",
        "MY_SECRET": "hidden",
        "LAKESINK_STORAGE_S3_SECRET_ACCESS_KEY": "env:MY_SECRET",
    }
    raw = settings_from_env(env)
    assert raw["storage.s3.secret.access.key"] == "hidden"
    parsed = storage_settings(env)
    assert parsed["storage.s3.allow.http"] is True and parsed["storage.retry.max"] == 2
    with pytest.raises(ConfigError, match=r"storage\.retry\.max"):
        storage_settings({"LAKESINK_STORAGE_RETRY_MAX": "2.5"})


def test_azure_keys_reach_lakesinks_client_pyarrow_and_hudi_rs_without_showing_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY", raising=False)
    cfg = _cfg(
        **{
            "table.path": "abfss://events@acct.dfs.core.windows.net/t",
            "storage.azure.endpoint": "http://127.0.0.1:10000/acct",
            "storage.azure.account.key": "a2V5LW5ldmVyLXNob3du",
        }
    )
    assert isinstance(cfg["storage.azure.account.key"], Secret)
    storage = open_storage("abfss://events@acct.dfs.core.windows.net/t", cfg.values)
    assert isinstance(storage, ObjectStoreStorage)
    assert "a2V5LW5ldmVyLXNob3du" not in repr(storage.options) + repr(storage)
    # lakesink's own client: account, key and endpoint; plain http because the endpoint says so
    assert storage._config() == {
        "account_name": "acct",
        "account_key": "a2V5LW5ldmVyLXNob3du",
        "endpoint": "http://127.0.0.1:10000/acct",
    }
    assert storage._allow_http()
    # hudi-rs: object_store's names for the same
    assert storage.reader_options() == {
        "azure_storage_account_name": "acct",
        "azure_storage_account_key": "a2V5LW5ldmVyLXNob3du",
        "azure_storage_endpoint": "http://127.0.0.1:10000/acct",
        "azure_allow_http": "true",
    }
    # without an endpoint: Azure itself over https, the key from the environment
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "ZW52LWtleQ==")
    plain = open_storage("az://events/t", {})
    assert isinstance(plain, ObjectStoreStorage)
    assert plain._config() == {"account_key": "ZW52LWtleQ=="} and not plain._allow_http()
    assert plain._azure_root() == "events/t"
    assert settings_from_env({"LAKESINK_STORAGE_AZURE_ENDPOINT": "http://h:1/a"}) == {
        "storage.azure.endpoint": "http://h:1/a"
    }


def test_gcs_conditional_replace_is_guarded_by_the_generation_other_stores_by_the_etag() -> None:
    """object_store sends GCS's generation precondition only for a version; an ETag alone is
    refused on GCS before any request is sent."""
    gcs = open_storage("gs://bucket/t")
    s3 = open_storage("s3://bucket/t", {"storage.s3.region": "us-east-1"})
    assert isinstance(gcs, ObjectStoreStorage) and isinstance(s3, ObjectStoreStorage)
    meta = {"e_tag": '"abc"', "version": "1732751000123456"}
    assert gcs._tag(meta) == "1732751000123456" and s3._tag(meta) == '"abc"'
    assert gcs._if_match("1732751000123456") == {"version": "1732751000123456"}
    assert s3._if_match('"abc"') == {"e_tag": '"abc"'}


def test_probe_refuses_a_store_that_answers_the_conditional_create_as_not_implemented() -> None:
    """A store that cannot take the request (an emulator's 400 to GCS's XML PUT) is refused as
    unsupported; an unreachable one keeps its own error."""
    from lakesink.storage import StorageUnsupportedError

    class Answering(ObjectStoreStorage):
        answer = ""

        def create(self, key: str, data: bytes) -> str:
            raise StorageError(f"create {key} on {self.uri} failed: {self.answer}")

    refused = Answering("gs://bucket/t")
    refused.answer = "Server returned non-2xx status code: 400 Bad Request: invalid uploadType"
    with pytest.raises(StorageUnsupportedError, match=r"gs://bucket/t refused .*400 Bad Request"):
        refused.probe()
    down = Answering("gs://bucket/20261128004000400")  # an instant's digits are no status
    down.answer = "cannot reach the store (after retries): connection refused"
    with pytest.raises(StorageError) as info:
        down.probe()
    assert type(info.value) is StorageError
