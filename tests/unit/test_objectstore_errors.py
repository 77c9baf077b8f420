"""How object-store errors read once the retries are spent: a store that kept answering 5xx is
named with its status and S3 code, an unreachable one as unreachable; secrets never appear. And
the probe's refusal of a store that takes PUTs but answers them without the object's version."""

from __future__ import annotations

import pytest

from lakesink.storage.base import ObjectExistsError, StorageError, StorageUnsupportedError
from lakesink.storage.objectstore import ObjectStoreStorage, _translate

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


NO_ETAG = (
    "Generic GCS error: Unable to extract metadata from headers: ETag Header missing from response"
)


class _UnversionedStore(ObjectStoreStorage):
    """A store whose PUTs are answered without a version (the first create always); the second
    create of one key is `second` (an exception to raise). Records the keys deleted."""

    __slots__ = ("deleted", "second", "writes")

    def __init__(self, uri: str, second: Exception) -> None:
        super().__init__(uri)
        self.second, self.writes, self.deleted = second, 0, []

    def create(self, key: str, data: bytes) -> str:
        self.writes += 1
        if self.writes > 1:
            raise self.second
        raise StorageError(f"create {key} on {self._url(key)} failed: GenericError: {NO_ETAG}")

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        raise StorageError("delete: 501 Not Implemented")  # as the emulator: kept quiet


@pytest.mark.parametrize(
    ("uri", "second", "ignores"),
    [
        ("gs://b/t", StorageError(f"create k failed: GenericError: {NO_ETAG}"), True),
        ("gs://b/t", ObjectExistsError("create k: exists already"), False),
        ("s3://b/t", StorageError(f"create k failed: GenericError: {NO_ETAG}"), True),
    ],
)
def test_probe_refuses_a_store_that_answers_puts_without_a_version(
    uri: str, second: Exception, ignores: bool
) -> None:
    """A PUT taken but answered without an ETag or generation: the second create says whether
    the precondition is ignored too; one line either way, the probe object's delete tried."""
    store = _UnversionedStore(uri, second)
    with pytest.raises(StorageUnsupportedError, match="without the object's version") as info:
        store.probe()
    msg = str(info.value)
    header = "x-goog-if-generation-match" if uri.startswith("gs") else "If-None-Match"
    assert (f"ignores {header}" in msg) is ignores, msg
    assert "\n" not in msg and store.writes == 2 and len(store.deleted) == 1
