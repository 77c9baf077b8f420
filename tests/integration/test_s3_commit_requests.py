"""What one streaming commit asks of an object store: the Coordinator drives batches on a table
on the test S3 server (moto over HTTP), each request seen by the fault proxy (no faults). The
timeline is listed once per lock hold (begin; commit: the view, plus the post-publish check for
a racing publisher), an instant's markers once (reconcile; the deletion after publishing
deletes the keys listed then), a lock hold costs its lease (create, the listing that proves it
the newest) and its release and nothing more, no data folder ever, the
commit the previous batch published is not read back, and the tasks are handed the schema from
begin's listing (no task lists the timeline for it) and the partitions known to exist (no task
asks for their `.hoodie_partition_metadata`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa
import pytest
from iceberg_tables import ROWS, ingest, s3_options
from s3_faults import Drop, Error, FaultProxy, Request
from s3_server import S3Server

from lakesink.config import build_config
from lakesink.formats import plugin_for
from lakesink.formats.hudi.concurrency.lock import LOCK_DIR, FileLockProvider
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import (
    MARKER_ROOT,
    create_marker,
    wait_for_marker_deletions,
)
from lakesink.formats.hudi.table.timeline import timeline_key
from lakesink.formats.hudi.table.writer import BaseFileWriter, HudiTaskTarget
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus
from lakesink.spark.pipeline import make_control
from lakesink.storage import open_storage
from lakesink.storage.base import StorageError

pytestmark = pytest.mark.integration

PARTITIONS = 4
LOCK_LISTINGS_PER_HOLD = 1  # the lease lock: after creating the lease that follows its last


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url) as p:
        yield p


def _listed(requests: list[Request], table_key: str) -> Counter[str]:
    """LIST requests by the folder they list, relative to the table root."""
    out: Counter[str] = Counter()
    for r in requests:
        if r.op != "LIST":
            continue
        prefix = parse_qs(urlsplit(r.target).query).get("prefix", [""])[0]
        folder = prefix.removeprefix(table_key + "/").rstrip("/")
        if folder.startswith(MARKER_ROOT + "/"):
            folder = MARKER_ROOT  # an instant's markers
        out[folder] += 1
    return out


def test_one_commit_lists_the_timeline_once_per_lock_hold_and_no_data_folder(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    keys = s3_server.storage_config()
    keys["storage.s3.endpoint"] = proxy.endpoint_url
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "kafka.topics": "t",
            "value.format": "raw",
            "table.path": f"s3://{s3_bucket}/tbl",
            "writer.id": "w",
            "lock.provider": "filesystem",
            **keys,
        }
    )
    store = cfg.table_storage
    table = HudiTable.create(store, TableConfig("t", ("kafka_offset",), (), version=8))
    coordinator = HudiCoordinator(table, "w", query_id="q", control=make_control(cfg))
    coordinator.start()
    nxt = dict.fromkeys(range(PARTITIONS), 0)
    for batch in range(3):  # the last one is counted: the table has commits of this writer
        ranges = [OffsetRange(TopicPartition("t", p), o, o + 10) for p, o in nxt.items()]
        at_begin = len(proxy.requests)
        t = coordinator.begin_batch(batch, ranges)
        assert t is not None
        began = proxy.requests[at_begin:]
        # what the tasks need of the timeline (the latest schema) comes from begin's listing
        at_target = len(proxy.requests)
        target = plugin_for("hudi").task_target(coordinator, t.value, 1 << 20)
        assert isinstance(target, HudiTaskTarget) and target.schema_known
        # the partition the previous commit wrote into has its metadata: no task asks for it
        assert target.known_partitions == (frozenset({""}) if batch else frozenset())
        handed = proxy.requests[at_target:]
        assert _listed(handed, "tbl")[timeline_key(table.layout)] == 0, handed
        assert not [r for r in handed if f"/{timeline_key(table.layout)}/" in r.target], handed
        statuses = []
        for r in ranges:  # what the tasks would do: marker, then the file
            fid = new_file_id()
            name = base_file_name(fid, f"{r.partition.partition}-1-0", t)
            create_marker(store, t, "", name)
            store.write(name, b"")
            f = FileWrite("", fid, name, 10, 1)
            statuses.append(WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), 10, 0))
        at_complete = len(proxy.requests)
        outcome = coordinator.complete_batch(t, batch, ranges, statuses, schema="{}")
        assert wait_for_marker_deletions(timeout_s=30)  # their LIST and DELETE, in the background
        completed = proxy.requests[at_complete:]
        assert outcome.files == PARTITIONS
        nxt = {p: o + 10 for p, o in nxt.items()}

    timeline = timeline_key(table.layout)
    begin_lists, complete_lists = _listed(began, "tbl"), _listed(completed, "tbl")
    figures = {"begin": dict(begin_lists), "complete": dict(complete_lists)}
    print("LIST requests of one commit:", json.dumps(figures))  # the figures the docs quote
    assert begin_lists[timeline] == 1, figures
    assert complete_lists[timeline] == 2, figures  # the view; the check for a racing publisher
    assert complete_lists[MARKER_ROOT] == 1, figures  # reconcile (delete: the keys listed)
    listed = set(begin_lists) | set(complete_lists)
    assert all(folder.startswith(".hoodie") for folder in listed), figures  # no data folders
    lock_lists = begin_lists[".hoodie/.lakesink/lock"] + complete_lists[".hoodie/.lakesink/lock"]
    assert lock_lists == 2 * LOCK_LISTINGS_PER_HOLD, figures
    assert sum(begin_lists.values()) + sum(complete_lists.values()) == (
        2 * LOCK_LISTINGS_PER_HOLD + 1 + 2 + 1
    ), figures
    # the two lock holds of a batch of this table's only writer: each creates the lease after
    # the one it released last (no listing before, no HEAD of the released or newer leases,
    # none for a young lease's check) and writes its release
    lock_ops = Counter(r.op for r in began + completed if LOCK_DIR in unquote(r.target))
    assert lock_ops == Counter({"PUT": 4, "LIST": 2}), lock_ops
    # the conflict check asks no timeline file's write time: the previous commit completed in
    # the snapshot this instant began on
    heads = [r.target for r in completed if r.op == "HEAD" and f"/{timeline}/" in r.target]
    assert not heads, heads
    # the previous batch's commit (this writer's offsets) is known: not read back from the store
    reads = [r.target for r in began + completed if r.op == "GET"]
    assert not [k for k in reads if f"/{timeline}/" in k], reads
    # and every record of the three batches is on the table exactly once
    assert coordinator.committed.next_offsets == {
        TopicPartition("t", p): 30 for p in range(PARTITIONS)
    }
    assert len(HudiTable.open(store).timeline().completed()) == 3


def test_a_lease_create_whose_response_is_lost_is_taken_as_the_holders(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    """The lease file's create (If-None-Match: *) lands but its response is lost: the client's
    retry meets 412 on the lease just written. The lock reads it back, finds its own bytes and
    holds the lease (it used to wait out its own lease as someone else's)."""
    keys = s3_server.storage_config()
    keys["storage.s3.endpoint"] = proxy.endpoint_url
    store = open_storage(f"s3://{s3_bucket}/locked", keys)
    provider = FileLockProvider(store, "w", lease_s=30, auto_renew=False)
    lost = proxy.inject(Drop(after_forward=True), method="PUT", path=r"\.lease$")
    lease = provider.acquire(timeout_s=5)
    assert lost.spent and lease.seq == 1
    lease.check()
    provider.release(lease)


def test_a_small_hudi_base_file_is_one_put_and_a_refused_one_a_storage_error(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    """A task's base file smaller than one part is a single PUT (the upload opens lazily: no
    multipart create, part and complete, nothing asked before); a store that refuses it fails
    the close with a StorageError naming the file."""
    options = replace(s3_options(s3_server), endpoint=proxy.endpoint_url)
    store = open_storage(f"s3://{s3_bucket}/tbl", options)
    table = HudiTable.create(store, TableConfig("t", ("id",), (), version=8))
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    at = len(proxy.requests)
    writer = BaseFileWriter(table, "", "20260101000000001", "0-1-0", partition_exists=True)
    writer.write(rows)
    (written,) = writer.close()
    data = Counter(r.op for r in proxy.requests[at:] if r.target.split("?")[0].endswith(".parquet"))
    assert data == Counter({"PUT": 1}), data
    assert store.head(written.path) is not None
    proxy.inject(Error(403, "AccessDenied"), method="PUT", path=r"\.parquet$", times=10)
    refused = BaseFileWriter(table, "", "20260101000000002", "0-1-0", partition_exists=True)
    refused.write(rows)
    with pytest.raises(StorageError, match=r"cannot write .*\.parquet of s3://"):
        refused.close()


def test_an_iceberg_commit_writes_each_metadata_object_in_one_put(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The metadata JSON, the manifest list and the manifest of an append: one PUT each (no
    multipart upload: POST, PUT, POST), no HEAD before a create or for a manifest's length;
    what the append reads of the metadata, one GET each (no HEAD for the size), and the
    metadata JSON the previous append created not read back."""
    options = replace(s3_options(s3_server), endpoint=proxy.endpoint_url)
    catalog = open_catalog(
        CatalogSettings(
            warehouse=f"s3://{s3_bucket}/wh",
            uri=f"sqlite:///{tmp_path / 'catalog.db'}",
            storage=options,
        )
    )
    table = IcebergTable.open(catalog, "db.events", ROWS, parse_partition_spec(""))
    tp = TopicPartition("events", 0)
    ingest(table, "w", [OffsetRange(tp, 0, 5)])
    at = len(proxy.requests)
    ingest(table, "w", [OffsetRange(tp, 5, 9)])  # a steady append: its table has a snapshot already
    metadata = Counter(r.op for r in proxy.requests[at:] if "/metadata/" in r.target.split("?")[0])
    print("metadata requests of one Iceberg append:", dict(metadata))
    assert metadata["PUT"] == 3 and metadata["POST"] == 0, metadata
    assert metadata["HEAD"] == 0 and metadata["GET"] <= 1, metadata
    # its data file, smaller than a part: one PUT, its length the bytes written (no HEAD)
    data = Counter(r.op for r in proxy.requests[at:] if r.target.split("?")[0].endswith(".parquet"))
    assert data == Counter({"PUT": 1}), data
