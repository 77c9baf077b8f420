"""The storage contract, one test body for the local filesystem, S3 (moto over HTTP) and Azure
Blob (Azurite over HTTP): whole-object reads and writes, create-if-absent, replace-if-unchanged,
listing, deletes, Parquet through the pyarrow filesystem, and the lost races that commits and
locks rely on. Neither GCS emulator holds a table: fake-gcs-server implements no conditional write
of the API lakesink's client speaks, gcp-storage-emulator ignores its preconditions; each is
refused at start, in one line."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from emulators import Azurite, FakeGcs, GcpStorageEmulator
from s3_server import S3Server

from lakesink.storage import (
    LocalStorage,
    ObjectChangedError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreStorage,
    Storage,
    StorageError,
    open_storage,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "s3", "azure"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(str(tmp_path / "root"))
    if request.param == "azure":
        azurite: Azurite = request.getfixturevalue("azurite")
        return open_storage(azurite.new_table_uri("root"), azurite.storage_config())
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    return open_storage(f"s3://{bucket}/root", server.storage_config())


def test_storage_write_then_read_returns_whole_object(storage: Storage) -> None:
    storage.write("a/b.json", b'{"x": 1}')
    assert storage.read("a/b.json") == b'{"x": 1}'
    storage.write("a/b.json", b"second")
    assert storage.read("a/b.json") == b"second"
    meta = storage.head("a/b.json")
    assert meta is not None and meta.size == len(b"second") and meta.key == "a/b.json"


def test_storage_read_of_missing_key_raises_not_found(storage: Storage) -> None:
    with pytest.raises(ObjectNotFoundError):
        storage.read("nothing/here")
    assert storage.head("nothing/here") is None
    assert not storage.exists("nothing/here")


def test_storage_create_twice_second_refused_and_first_content_kept(storage: Storage) -> None:
    storage.create(".hoodie/timeline/1_2.commit", b"first")
    with pytest.raises(ObjectExistsError, match="exists already"):
        storage.create(".hoodie/timeline/1_2.commit", b"second")
    assert storage.read(".hoodie/timeline/1_2.commit") == b"first"


def test_storage_create_empty_object_is_visible(storage: Storage) -> None:
    storage.create(".hoodie/x.inflight", b"")
    assert storage.read(".hoodie/x.inflight") == b""
    with pytest.raises(ObjectExistsError):
        storage.create(".hoodie/x.inflight", b"")


def test_storage_publish_race_between_threads_exactly_one_wins(storage: Storage) -> None:
    key = ".hoodie/timeline/20260101000000000_20260101000000001.commit"
    won: list[int] = []
    lost: list[BaseException] = []
    barrier = threading.Barrier(4)

    def publish(n: int) -> None:
        barrier.wait()
        try:
            storage.create(key, f"writer {n}".encode())
            won.append(n)
        except ObjectExistsError as e:
            lost.append(e)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 3
    assert storage.read(key) == f"writer {won[0]}".encode()


def test_storage_replace_with_current_etag_succeeds_stale_refused(storage: Storage) -> None:
    storage.create("lock/lease", b"holder-1")
    data, etag = storage.read_with_etag("lock/lease")
    assert data == b"holder-1"
    new_etag = storage.replace_if_unchanged("lock/lease", b"holder-1 renewed", etag)
    assert new_etag != etag
    with pytest.raises(ObjectChangedError):
        storage.replace_if_unchanged("lock/lease", b"holder-2 steals", etag)
    assert storage.read("lock/lease") == b"holder-1 renewed"
    storage.delete("lock/lease")
    with pytest.raises(ObjectChangedError):
        storage.replace_if_unchanged("lock/lease", b"gone", new_etag)


def test_storage_list_recursive_and_one_level(storage: Storage) -> None:
    for key in ("t/a", "t/b/c", "t/b/d/e", "other/x"):
        storage.write(key, b"1")
    assert [m.key for m in storage.list_prefix("t")] == ["t/a", "t/b/c", "t/b/d/e"]
    # the recursive listing carries modification times (orphan removal's safety window)
    assert all(abs(m.modified - time.time()) < 600 for m in storage.list_prefix("t"))
    level = storage.list_folder("t")
    assert [m.key for m in level.objects] == ["t/a"]
    assert level.folders == ("b",)
    assert storage.list_prefix("missing") == []
    assert storage.list_folder("missing").objects == ()


def test_storage_delete_and_delete_prefix(storage: Storage) -> None:
    for key in ("m/1", "m/2", "m/s/3", "keep"):
        storage.write(key, b"1")
    storage.delete("keep")
    storage.delete("keep")  # gone already: no error
    storage.delete_prefix("m")
    assert storage.list_prefix("") == []


def test_storage_parquet_round_trip_through_arrow_filesystem(storage: Storage) -> None:
    fs, _ = storage.arrow()
    table = pa.table({"k": ["a", "b"], "v": [1, 2]})
    with storage.open_output("p=1/f_1-0-1_1.parquet") as out:
        pq.write_table(table, out)
    assert storage.exists("p=1/f_1-0-1_1.parquet")
    back = pq.read_table(storage.arrow_path("p=1/f_1-0-1_1.parquet"), filesystem=fs)
    assert back.equals(table)


def test_storage_probe_accepts_a_store_with_conditional_writes(storage: Storage) -> None:
    storage.probe()
    assert [m.key for m in storage.list_prefix(".hoodie/.aux/lakesink/probe")] == []


def test_gcs_emulator_without_conditional_writes_is_refused_at_start_in_one_line(
    fake_gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fake-gcs-server answers every object PUT of GCS's XML API, the one object_store
    (lakesink's client, hudi-rs) sends and the one that carries the `x-goog-if-generation-match`
    precondition, with 400 (it takes uploads on its JSON API only): it cannot hold a table.
    The probe at start says so in one line, before any commit could be lost."""
    from lakesink.storage import StorageUnsupportedError

    for name, value in fake_gcs.env().items():
        monkeypatch.setenv(name, value)
    storage = open_storage(f"gs://{fake_gcs.new_bucket()}/t", {"storage.retry.max": 1})
    with pytest.raises(StorageUnsupportedError, match="conditional") as info:
        storage.probe()
    assert "\n" not in str(info.value) and "400 Bad Request" in str(info.value)
    with pytest.raises(StorageError, match="400 Bad Request"):  # a plain PUT alike
        storage.write("k", b"1")
    assert storage.list_prefix("") == []


def test_gcs_emulator_ignoring_preconditions_is_refused_at_start_in_one_line(
    gcp_storage_emulator: GcpStorageEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcp-storage-emulator takes the XML API's object PUT but ignores its
    `x-goog-if-generation-match` (a second create and a replace by a stale generation both
    succeed, shown here on the wire) and answers without the object's version. The probe
    creates twice, sees the second create taken, and refuses the store in one line."""
    from lakesink.storage import StorageUnsupportedError

    emulator = gcp_storage_emulator
    bucket = emulator.new_bucket()
    create = {"x-goog-if-generation-match": "0"}
    assert emulator.xml_request("PUT", f"{bucket}/k", b"1", create)[0] == 200
    assert emulator.xml_request("PUT", f"{bucket}/k", b"2", create)[0] == 200  # GCS: 412
    stale = {"x-goog-if-generation-match": "1"}
    assert emulator.xml_request("PUT", f"{bucket}/k", b"3", stale)[0] == 200  # GCS: 412
    assert emulator.xml_request("GET", f"{bucket}/k") == (200, b"3")

    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    storage = open_storage(f"gs://{bucket}/t", {"storage.retry.max": 0})
    with pytest.raises(StorageUnsupportedError, match="ignores x-goog-if-generation-match") as info:
        storage.probe()
    assert "\n" not in str(info.value) and "without the object's version" in str(info.value)


def test_open_storage_parses_uris(tmp_path: Path) -> None:
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    local = open_storage(f"file://{tmp_path}/t")
    assert isinstance(local, LocalStorage) and local.uri == f"{tmp_path}/t"
    for uri in ("s3://bucket/p", "gs://bucket/p", "abfss://container/p"):
        assert isinstance(open_storage(uri), ObjectStoreStorage)
    with pytest.raises(StorageError, match="unsupported storage scheme 'ftp'"):
        open_storage("ftp://host/p")


def test_s3_storage_unreachable_endpoint_fails_with_one_line(tmp_path: Path) -> None:
    from s3_server import free_port

    storage = open_storage(
        "s3://lakesink-nowhere/t",
        {
            "storage.s3.endpoint": f"http://127.0.0.1:{free_port()}",
            "storage.s3.allow.http": True,
            "storage.s3.region": "us-east-1",
            "storage.s3.access.key.id": "k",
            "storage.s3.secret.access.key": "never-printed",
            "storage.retry.max": 1,
            "storage.retry.timeout.s": 2,
        },
    )
    with pytest.raises(StorageError, match="cannot reach the store") as info:
        storage.probe()
    assert "\n" not in str(info.value) and "never-printed" not in str(info.value)


def test_s3_storage_missing_bucket_named_in_one_line(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    missing = open_storage(f"s3://{bucket}-missing/t", s3_server.storage_config())
    with pytest.raises(StorageError, match=r"bucket of .* does not exist") as info:
        missing.probe()
    assert "\n" not in str(info.value)


def test_s3_storage_wrong_credentials_refused_without_printing_the_secret(
    tmp_path: Path,
) -> None:
    with S3Server(tmp_path, authenticate=True) as server:
        cfg = {
            **server.storage_config(),
            "storage.s3.access.key.id": "AKIAWRONGWRONGWRONG0",
            "storage.s3.secret.access.key": "s3cr3t-never-printed",
        }
        storage = open_storage("s3://lakesink-any/t", cfg)
        with pytest.raises(StorageError, match="refused the credentials") as info:
            storage.probe()
    assert "\n" not in str(info.value) and "s3cr3t-never-printed" not in str(info.value)


def test_local_storage_stages_writes_in_its_tmp_folder_and_start_up_removes_dead_writers_files(
    tmp_path: Path,
) -> None:
    """An Iceberg warehouse's root stages in `.lakesink/tmp` (nothing Hudi-shaped in it);
    replaces share one lock file, whatever the keys; temporary files a killed writer left are
    deleted at the next start once they are older than any live write, the lock file kept."""
    import os
    import pickle

    from lakesink.storage import LAKESINK_TMP_FOLDER

    root = open_storage(str(tmp_path / "wh"), tmp_folder=LAKESINK_TMP_FOLDER)
    assert isinstance(root, LocalStorage)
    root.write(".lakesink/liveness/w.json", b"1")
    for n in range(5):  # lease keys carry sequence numbers: one lock file for all of them
        etag = root.create(f".lakesink/locks/{n}", b"a")
        root.replace_if_unchanged(f".lakesink/locks/{n}", b"b", etag)
    assert not (tmp_path / "wh" / ".hoodie").exists()
    tmp = tmp_path / "wh" / LAKESINK_TMP_FOLDER
    assert sorted(os.listdir(tmp)) == ["replace.lock"]
    assert pickle.loads(pickle.dumps(root)).tmp_folder == LAKESINK_TMP_FOLDER
    # what a writer killed mid-write leaves, and a per-key lock file of an earlier version
    old = time.time() - 3600
    for name in ("w.json.0a1b.tmp", "3f2a9c0d1e2b3a4c.lock"):
        (tmp / name).write_bytes(b"x")
        os.utime(tmp / name, (old, old))
    (tmp / "live.json.9f.tmp").write_bytes(b"x")  # a live writer's, seconds old
    assert root.remove_stale_temporaries() == 2
    assert sorted(os.listdir(tmp)) == ["live.json.9f.tmp", "replace.lock"]
    # a Hudi table keeps staging under .hoodie/, where its readers never look
    hudi = open_storage(str(tmp_path / "t"))
    hudi.write("f", b"1")
    assert sorted(os.listdir(tmp_path / "t")) == [".hoodie", "f"]
