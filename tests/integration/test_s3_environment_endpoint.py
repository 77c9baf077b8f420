"""An S3 table reached through the standard AWS environment alone (AWS_ENDPOINT_URL and the
credentials, as boto3 and the AWS CLI take them; no `storage.*` key): lakesink addresses the
test server path-style, writes and commits a table on it, and hands the same endpoint to hudi-rs.
Plain http without a switch ends in one line naming the variable."""

from __future__ import annotations

import pyarrow as pa
import pytest
from s3_server import S3Server

from lakesink.config import build_config
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action, InstantTime
from lakesink.storage import Storage, StorageError

pytestmark = pytest.mark.integration


def _table_storage(path: str) -> Storage:
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "kafka.topics": "t",
            "value.format": "raw",
            "table.path": path,
        }
    )
    assert not any(k.startswith("storage.s3.") and v for k, v in cfg.values.items()), (
        "the test must reach the store through the environment only"
    )
    return cfg.table_storage


def test_the_aws_environment_alone_reaches_the_store_for_lakesink_and_hudi_rs(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    path = f"s3://{s3_bucket}/env"

    # plain http needs a switch, as for the key: refused before any request, in one line
    with pytest.raises(StorageError, match=r"AWS_ENDPOINT_URL=.*plain http") as refused:
        _table_storage(path).probe()
    assert "\n" not in str(refused.value)

    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    storage = _table_storage(path)
    storage.probe()  # conditional create and replace, through lakesink's own client
    table = HudiTable.create(storage, TableConfig("env", ("id",), (), version=8))
    t = InstantTime.from_epoch_ms(1_700_000_000_000)
    instant = table.timeline().begin(Action.COMMIT, t)
    rows = pa.table({"id": pa.array(range(5), pa.int64())})
    writer = PartitionedWriter(table, t, "0-1-0")  # base files through pyarrow's filesystem
    writer.write(rows)
    writes = writer.close()
    md = CommitMetadata("INSERT", tuple(writes), schema=writer.avro_schema or "")
    table.timeline().publish(instant, md)
    assert sorted(TableReader(table).snapshot().column("id").to_pylist()) == list(range(5))

    # hudi-rs reads with the options lakesink hands it, the endpoint no longer in the environment
    options = storage.reader_options()
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert options["aws_endpoint_url"] == s3_server.endpoint_url
    batches = hudi_rs_batches(path, options, ["id"])
    assert sorted(pa.Table.from_batches(batches).column("id").to_pylist()) == list(range(5))
