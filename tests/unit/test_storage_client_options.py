"""Unit tests of the one mapping from ObjectStoreOptions to each S3 client's option names."""

from __future__ import annotations

import pytest

from lakesink.formats.iceberg.catalog import file_io_properties
from lakesink.storage.objectstore import (
    OBJECT_STORE_KEYS,
    OBSTORE_KEYS,
    PYICEBERG_KEYS,
    ObjectStoreOptions,
    ObjectStoreStorage,
    S3Keys,
    s3_options,
    virtual_hosted,
)

FULL = ObjectStoreOptions(
    endpoint="http://127.0.0.1:9000",
    region="eu-west-1",
    allow_http=True,
    access_key_id="AKIDEXAMPLE",
    secret_access_key="not-a-real-secret",
    session_token="token-value",
)


@pytest.mark.parametrize("keys", [OBSTORE_KEYS, OBJECT_STORE_KEYS, PYICEBERG_KEYS])
def test_s3_options_carry_every_set_value_under_the_clients_names(keys: S3Keys) -> None:
    got = s3_options(FULL, keys)
    assert sorted(got.values()) == sorted(
        [
            "http://127.0.0.1:9000",
            "eu-west-1",
            "AKIDEXAMPLE",
            "not-a-real-secret",
            "token-value",
        ]
    )
    assert got[keys.endpoint] == FULL.endpoint
    assert got[keys.secret_access_key] == FULL.secret_access_key


def test_s3_options_leave_out_unset_values() -> None:
    assert s3_options(ObjectStoreOptions(region="us-east-1"), PYICEBERG_KEYS) == {
        "s3.region": "us-east-1"
    }


@pytest.mark.parametrize(
    ("options", "virtual"),
    [
        (ObjectStoreOptions(), True),
        (ObjectStoreOptions(path_style=True), False),
        (ObjectStoreOptions(endpoint="http://127.0.0.1:9000"), False),
    ],
)
def test_reader_options_and_file_io_agree_on_bucket_addressing(
    options: ObjectStoreOptions, virtual: bool
) -> None:
    assert virtual_hosted(options) is virtual
    props = file_io_properties(options)
    assert props["s3.force-virtual-addressing"] == str(virtual).lower()
    reader = ObjectStoreStorage("s3://bucket/table", options).reader_options()
    assert ("aws_virtual_hosted_style_request" not in reader) is virtual
    if not virtual:
        assert reader["aws_virtual_hosted_style_request"] == "false"


def test_reader_options_hold_the_credentials_and_http_flag_for_hudi_rs() -> None:
    reader = ObjectStoreStorage("s3a://bucket/table", FULL).reader_options()
    assert reader["aws_allow_http"] == "true"
    assert reader["aws_endpoint_url"] == FULL.endpoint
    assert reader["aws_session_token"] == FULL.session_token
    assert ObjectStoreStorage("gs://bucket/table", FULL).reader_options() == {}


AZURITE = ObjectStoreOptions(
    azure_endpoint="http://127.0.0.1:10000/devstoreaccount1", azure_account_key="a2V5"
)


def test_file_io_of_an_azure_warehouse_carries_account_key_and_emulator_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyiceberg gets Azure's settings only as adls.* properties: the URI's account, the key,
    and the endpoint as pyarrow's authority and scheme (an emulator's address kept whole)."""
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY", raising=False)
    props = file_io_properties(AZURITE, "abfss://lake@devstoreaccount1.dfs.core.windows.net/wh")
    assert props["py-io-impl"] == "lakesink.formats.iceberg.fileio.LakesinkFileIO"
    assert props["adls.account-name"] == "devstoreaccount1"
    assert props["adls.account-key"] == "a2V5"
    assert props["adls.blob-storage-authority"] == "127.0.0.1:10000"
    assert props["adls.dfs-storage-authority"] == "127.0.0.1:10000"
    assert props["adls.blob-storage-scheme"] == props["adls.dfs-storage-scheme"] == "http"
    # Azure itself: the account's host name goes, the services' authorities stay
    cloud = ObjectStoreOptions(azure_endpoint="https://acct.blob.core.windows.net")
    props = file_io_properties(cloud, "abfss://lake@acct.dfs.core.windows.net/wh")
    assert props["adls.blob-storage-authority"] == "blob.core.windows.net"
    assert props["adls.dfs-storage-authority"] == "dfs.core.windows.net"
    assert "adls.account-key" not in props
    # an account from the environment, as lakesink's own client takes it; no adls.* off Azure
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    assert file_io_properties(AZURITE, "abfs://lake/wh")["adls.account-name"] == "envacct"
    for other in (None, "s3://bucket/wh", "file:///tmp/wh"):
        props = file_io_properties(AZURITE, other)
        assert props["py-io-impl"] == "lakesink.formats.iceberg.fileio.LakesinkFileIO"
        assert not any(k.startswith("adls.") for k in props), props


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("abfss://lake@acct.dfs.core.windows.net/wh/t/data/f.parquet", "lake/wh/t/data/f.parquet"),
        ("abfs://lake@acct.dfs.core.windows.net/m.json", "lake/m.json"),
        ("abfss://lake/wh/m.json", "lake/wh/m.json"),
        ("s3://bucket@x/wh/m.json", "bucket@x/wh/m.json"),
        ("file:///tmp/wh/m.json", "/tmp/wh/m.json"),
    ],
)
def test_azure_file_io_hands_pyarrow_the_container_not_the_account(
    location: str, path: str
) -> None:
    from lakesink.formats.iceberg.fileio import LakesinkFileIO

    assert LakesinkFileIO.parse_location(location)[2] == path
