"""What one streaming commit asks of an object store: the Coordinator drives batches on a table
on the test S3 server (moto over HTTP), each request seen by the fault proxy (no faults). The
timeline is listed once per lock hold (begin; commit: the view, plus the post-publish check for
a racing publisher), an instant's markers twice (reconcile, delete), no data folder ever, the
commit the previous batch published is not read back, and the tasks are handed the schema from
begin's listing (no task lists the timeline for it) and the partitions known to exist (no task
asks for their `.hoodie_partition_metadata`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from s3_faults import FaultProxy, Request
from s3_server import S3Server

from lakesink.config import build_config
from lakesink.formats import plugin_for
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
from lakesink.formats.hudi.table.writer import HudiTaskTarget
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus
from lakesink.spark.pipeline import make_control

pytestmark = pytest.mark.integration

PARTITIONS = 4
LOCK_LISTINGS_PER_HOLD = 3  # the lease lock: before and after taking it, at release


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
    assert complete_lists[MARKER_ROOT] == 2, figures  # reconcile; delete after publishing
    listed = set(begin_lists) | set(complete_lists)
    assert all(folder.startswith(".hoodie") for folder in listed), figures  # no data folders
    lock_lists = begin_lists[".hoodie/.lakesink/lock"] + complete_lists[".hoodie/.lakesink/lock"]
    assert lock_lists <= 2 * LOCK_LISTINGS_PER_HOLD, figures
    assert sum(begin_lists.values()) + sum(complete_lists.values()) <= (
        2 * LOCK_LISTINGS_PER_HOLD + 1 + 2 + 2
    ), figures
    # the previous batch's commit (this writer's offsets) is known: not read back from the store
    reads = [r.target for r in began + completed if r.op == "GET"]
    assert not [k for k in reads if f"/{timeline}/" in k], reads
    # and every record of the three batches is on the table exactly once
    assert coordinator.committed.next_offsets == {
        TopicPartition("t", p): 30 for p in range(PARTITIONS)
    }
    assert len(HudiTable.open(store).timeline().completed()) == 3
