"""lakesink's pyiceberg FileIO: small metadata objects on S3 written whole, in one PUT, a create
that must not overwrite as a conditional PUT, read whole in one GET; the storage options it
reaches the store with."""

from __future__ import annotations

import pytest
from obstore.store import MemoryStore
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import PyArrowFile

from lakesink.formats.iceberg.catalog import (
    file_io_properties,
    storage_options,
)
from lakesink.formats.iceberg.fileio import LakesinkFileIO, WholeObjectFile, WholeObjectInput
from lakesink.storage.objectstore import ObjectStoreOptions

OPTIONS = ObjectStoreOptions(
    endpoint="http://127.0.0.1:9000",
    region="us-east-1",
    allow_http=True,
    access_key_id="AKID",
    secret_access_key="s3cr3t",
    max_retries=3,
    retry_timeout_s=7.0,
    request_timeout_s=11.0,
)


def _io_in_memory() -> tuple[LakesinkFileIO, MemoryStore]:
    props = file_io_properties(OPTIONS)
    io = load_file_io(props, "s3://bucket/warehouse/t")
    assert isinstance(io, LakesinkFileIO)
    memory = MemoryStore()
    io._store("s3", "bucket")._store = memory  # the object store in memory: no server
    return io, memory


def test_file_io_properties_carry_the_storage_options_and_no_secret_twice() -> None:
    props = file_io_properties(OPTIONS)
    back = storage_options(props)
    assert back.endpoint == OPTIONS.endpoint and back.region == OPTIONS.region
    assert back.access_key_id == "AKID" and back.secret_access_key == "s3cr3t"
    assert (back.max_retries, back.retry_timeout_s, back.request_timeout_s) == (3, 7.0, 11.0)
    assert back.allow_http and back.path_style
    # the secret is in pyiceberg's own key only, never in lakesink's JSON property
    assert sum("s3cr3t" in v for v in props.values()) == 1


def test_a_metadata_object_is_written_whole_and_its_length_is_known() -> None:
    io, memory = _io_in_memory()
    out = io.new_output("s3://bucket/warehouse/t/metadata/00001-abc.metadata.json")
    assert isinstance(out, WholeObjectFile)
    with out.create(overwrite=False) as stream:
        stream.write(b'{"format-version": 2')
        stream.write(b"}")
        assert stream.tell() == 21
        assert list(memory.list()) == []  # nothing before the close: one PUT at the end
    assert len(out) == 21
    got = memory.get("warehouse/t/metadata/00001-abc.metadata.json").bytes()
    assert bytes(got) == b'{"format-version": 2}'


def test_a_metadata_json_created_here_is_not_read_back_from_the_store() -> None:
    io, memory = _io_in_memory()
    location = "s3://bucket/t/metadata/00007-5f1e.metadata.json"
    with io.new_output(location).create(overwrite=False) as stream:
        stream.write(b'{"v": 7}')
    memory.delete("t/metadata/00007-5f1e.metadata.json")  # a read would now fail
    with io.new_input(location).open() as stream:
        assert stream.read() == b'{"v": 7}'
    # what is written with overwrite (a manifest) is read from the store
    with io.new_output("s3://bucket/t/metadata/m1.avro").create(overwrite=True) as stream:
        stream.write(b"m")
    memory.delete("t/metadata/m1.avro")
    with pytest.raises(FileNotFoundError):
        io.new_input("s3://bucket/t/metadata/m1.avro").open()


def test_a_create_that_must_not_overwrite_refuses_an_existing_object() -> None:
    io, memory = _io_in_memory()
    location = "s3://bucket/warehouse/t/metadata/snap-1.avro"
    memory.put("warehouse/t/metadata/snap-1.avro", b"first")
    stream = io.new_output(location).create(overwrite=False)
    with pytest.raises(FileExistsError, match="already exists"), stream:
        stream.write(b"second")
    assert bytes(memory.get("warehouse/t/metadata/snap-1.avro").bytes()) == b"first"
    with io.new_output(location).create(overwrite=True) as stream:
        stream.write(b"second")
    assert bytes(memory.get("warehouse/t/metadata/snap-1.avro").bytes()) == b"second"


def test_a_metadata_object_is_read_whole_and_a_missing_one_is_file_not_found() -> None:
    io, memory = _io_in_memory()
    memory.put("t/metadata/snap-2.avro", b"avro bytes")
    found = io.new_input("s3://bucket/t/metadata/snap-2.avro")
    assert isinstance(found, WholeObjectInput)
    with found.open() as stream:
        assert stream.read() == b"avro bytes"
    assert len(found) == 10 and found.exists()
    missing = io.new_input("s3://bucket/t/metadata/v9.metadata.json")
    assert not missing.exists()
    with pytest.raises(FileNotFoundError):
        missing.open()


def test_a_failed_write_leaves_no_object() -> None:
    io, memory = _io_in_memory()
    with pytest.raises(RuntimeError), io.new_output("s3://bucket/t/metadata/m0.avro").create() as s:
        s.write(b"half")
        raise RuntimeError("the writer failed")
    assert list(memory.list()) == []


@pytest.mark.parametrize(
    ("location", "writer"),
    [
        # streamed by lakesink's pyarrow filesystem (uploads opened lazily: a small file is one
        # PUT), its length the bytes written; read in ranges by pyarrow
        ("s3://bucket/t/data/part-0.parquet", "StreamedDataFile"),
        ("file:///tmp/t/metadata/v1.metadata.json", "PyArrowFile"),
    ],
)
def test_data_files_and_local_files_keep_pyarrows_reads(location: str, writer: str) -> None:
    io = load_file_io(file_io_properties(OPTIONS), location)
    assert type(io.new_output(location)).__name__ == writer
    assert isinstance(io.new_input(location), PyArrowFile)
