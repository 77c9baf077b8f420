"""How object-store errors read once the retries are spent: a store that kept answering 5xx is
named with its status and S3 code, an unreachable one as unreachable; secrets never appear."""

from __future__ import annotations

from lakesink.storage.objectstore import _translate

THROTTLED = (
    "Generic S3 error: Error performing PUT http://127.0.0.1:9/b/t/k in 125ms, after 2 retries, "
    "max_retries: 2, retry_timeout: 5s  - Server returned non-2xx status code: 503 Service "
    'Unavailable: <?xml version="1.0"?>\n<Error><Code>SlowDown</Code><Message>m</Message></Error>'
)
UNREACHABLE = (
    "Generic S3 error: Error performing PUT http://127.0.0.1:9/b/t/k in 3s, after 10 retries, "
    "max_retries: 10, retry_timeout: 180s  - HTTP error: error sending request: "
    "client error (Connect): tcp connect error: Connection refused (os error 111)"
)


class GenericError(Exception):
    pass


def test_translate_5xx_after_retries_names_status_and_code_not_an_unreachable_store() -> None:
    msg = str(_translate(GenericError(THROTTLED), "create t/k", "s3://b/t/k"))
    assert "kept answering 503 Service Unavailable (SlowDown)" in msg
    assert "cannot reach" not in msg and "\n" not in msg


def test_translate_refused_connection_after_retries_is_an_unreachable_store() -> None:
    msg = str(_translate(GenericError(UNREACHABLE), "create t/k", "s3://b/t/k"))
    assert "cannot reach the store for s3://b/t/k" in msg


def test_translate_an_instant_holding_403_in_the_key_is_still_a_throttled_store() -> None:
    # the key 20261124030120778_… holds "403" among its digits: not a refusal of the credentials
    key = ".hoodie/timeline/20261124030120778_20261124030122139.commit"
    throttled = THROTTLED.replace("/b/t/k", f"/b/t/{key}")
    msg = str(_translate(GenericError(throttled), f"create {key}", f"s3://b/t/{key}"))
    assert "kept answering 503 Service Unavailable (SlowDown)" in msg, msg
    assert "credentials" not in msg


def test_translate_a_403_status_is_a_refusal_of_the_credentials() -> None:
    forbidden = (
        "Generic S3 error: Error performing GET http://127.0.0.1:9/b/t/k in 5ms - Server returned "
        "non-2xx status code: 403 Forbidden: <Error><Code>Forbidden</Code></Error>"
    )
    msg = str(_translate(GenericError(forbidden), "read t/k", "s3://b/t/k"))
    assert "refused the credentials" in msg and "storage.s3.access.key.id" in msg
