"""The fault proxy in front of the test S3 server: requests pass through unchanged, and each
injected fault (S3 error status, dropped connection, lost response, delay past the client's
timeout) hits exactly the requests its rule names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.config
import botocore.exceptions
import pytest
from s3_faults import Delay, Drop, Error, FaultProxy, s3_operation
from s3_server import S3Server

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url) as p:
        yield p


def _client(server: S3Server, proxy: FaultProxy, read_timeout_s: float = 5.0) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=proxy.endpoint_url,
        region_name=server.region,
        aws_access_key_id=server.access_key_id,
        aws_secret_access_key=server.secret_access_key,
        config=botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            read_timeout=read_timeout_s,
            connect_timeout=2,
            s3={"addressing_style": "path"},
        ),
    )


def test_s3_operation_classifies_listings_and_object_requests() -> None:
    assert s3_operation("GET", "/b?list-type=2&prefix=t/") == "LIST"
    assert s3_operation("GET", "/b") == "LIST"
    assert s3_operation("GET", "/b/t/.hoodie/hoodie.properties") == "GET"
    assert s3_operation("PUT", "/b/t/x.parquet") == "PUT"
    assert s3_operation("HEAD", "/b/t/x.parquet") == "HEAD"


def test_fault_proxy_forwards_unchanged_and_counts_requests(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    s3 = _client(s3_server, proxy)
    with proxy.counting() as counted:
        s3.put_object(Bucket=s3_bucket, Key="a/one", Body=b"1" * 3000)
        s3.put_object(Bucket=s3_bucket, Key="a/two", Body=b"")
        assert s3.get_object(Bucket=s3_bucket, Key="a/one")["Body"].read() == b"1" * 3000
        assert s3.head_object(Bucket=s3_bucket, Key="a/one")["ContentLength"] == 3000
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="a/")["Contents"]]
        s3.delete_object(Bucket=s3_bucket, Key="a/two")
    assert keys == ["a/one", "a/two"]
    assert counted == {"PUT": 2, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 1}
    # what went through the proxy is on the server itself
    direct = s3_server.client()
    assert [o["Key"] for o in direct.list_objects_v2(Bucket=s3_bucket)["Contents"]] == ["a/one"]


def test_fault_proxy_fails_exactly_the_requests_its_rules_name(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    s3 = _client(s3_server, proxy)
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v")
    proxy.inject(Error(503, "SlowDown"), method="GET", path=r"/k(\?|$)", times=2)
    proxy.inject(Error(500, "InternalError"), method="PUT", skip=1)
    for _ in range(2):
        with pytest.raises(botocore.exceptions.ClientError) as e:
            s3.get_object(Bucket=s3_bucket, Key="k")
        assert e.value.response["Error"]["Code"] == "SlowDown"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"v"  # rule spent
    s3.put_object(Bucket=s3_bucket, Key="p1", Body=b"1")  # skipped by the rule
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=s3_bucket, Key="p2", Body=b"2")
    assert e.value.response["Error"]["Code"] == "InternalError"
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == ["k", "p1"]  # the failed PUT never reached the server
    assert proxy.faults_fired() == 3


def test_fault_proxy_drops_connections_and_loses_responses_of_applied_requests(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    s3 = _client(s3_server, proxy)
    proxy.inject(Drop(), method="PUT", path="/dropped")
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        s3.put_object(Bucket=s3_bucket, Key="dropped", Body=b"x")
    proxy.inject(Drop(after_forward=True), method="PUT", path="/landed")
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        s3.put_object(Bucket=s3_bucket, Key="landed", Body=b"y")
    direct = s3_server.client()
    keys = [o["Key"] for o in direct.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys == ["landed"]  # the response was lost, the write was not


def test_fault_proxy_delays_a_request_past_the_client_timeout(
    s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    s3 = _client(s3_server, proxy, read_timeout_s=0.5)
    s3.put_object(Bucket=s3_bucket, Key="slow", Body=b"z")
    proxy.inject(Delay(1.5), method="GET", path="/slow")
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        s3.get_object(Bucket=s3_bucket, Key="slow")
    assert s3.get_object(Bucket=s3_bucket, Key="slow")["Body"].read() == b"z"
