"""The Cloud Storage endpoint through the official google-cloud-storage client.

The client is pointed at the server exactly as at the Cloud Storage emulator:
`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` (anonymous credentials: the suite's server
has no tokens file). Objects are the files of the project's storage namespace.
"""

import base64
import hashlib
import os
import re
import time

import pytest

BUCKET = "sdk-storage"
MIB = 1024 * 1024


@pytest.fixture
def gcs(server, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server["url"])
    from google.cloud import storage

    return storage.Client(project="demo")


def test_storage_round_trip_with_the_official_client(gcs, server):
    bucket = gcs.create_bucket(BUCKET)
    assert gcs.get_bucket(BUCKET).name == BUCKET

    # 20 MB in 5 MiB chunks: the resumable path (initiate, PUT chunks with 308s, last 200).
    data = os.urandom(20 * 1000 * 1000)
    blob = bucket.blob("big/object.bin")
    blob.chunk_size = 5 * MIB
    blob.upload_from_string(data, content_type="application/x-test")
    assert blob.size == len(data)
    log = server["log"].read_text(errors="replace")
    puts = re.findall(r'method="PUT" path="/upload/storage/v1/b/sdk-storage/o" status=(\d+)', log)
    assert puts == ["308", "308", "308", "200"], puts

    # Downloads: in one piece, and in ranged chunks; both checked by the client's crc32c.
    assert bucket.blob("big/object.bin").download_as_bytes() == data
    chunked = bucket.blob("big/object.bin")
    chunked.chunk_size = 5 * MIB
    assert chunked.download_as_bytes() == data
    assert bucket.blob("big/object.bin").download_as_bytes(start=10, end=19) == data[10:20]

    # The MD5 of an upload that sent none is computed after the commit (until then the
    # object has none, as a composite object of the real service): it comes within a while.
    want = base64.b64encode(hashlib.md5(data).digest()).decode()
    deadline = time.time() + 60
    meta = bucket.get_blob("big/object.bin")
    while meta.md5_hash is None and time.time() < deadline:
        time.sleep(0.2)
        meta = bucket.get_blob("big/object.bin")
    assert meta.size == len(data)
    assert meta.content_type == "application/x-test"
    assert meta.md5_hash == want
    assert meta.crc32c

    # A small upload (multipart), with custom metadata.
    small = bucket.blob("small.txt")
    small.metadata = {"origin": "sdk-tests"}
    small.upload_from_string("hello", content_type="text/plain")
    assert bucket.get_blob("small.txt").metadata == {"origin": "sdk-tests"}
    on_disk = server["data_dir"] / "storage" / "demo" / BUCKET / "small.txt"
    assert on_disk.read_bytes() == b"hello"

    # Listings.
    assert [b.name for b in gcs.list_blobs(BUCKET)] == ["big/object.bin", "small.txt"]
    it = gcs.list_blobs(BUCKET, delimiter="/")
    assert [b.name for b in it] == ["small.txt"]
    assert it.prefixes == {"big/"}
    assert [b.name for b in gcs.list_blobs(BUCKET, prefix="big/")] == ["big/object.bin"]
    assert [b.name for b in gcs.list_blobs(BUCKET, max_results=1)] == ["big/object.bin"]
    assert [b.name for b in gcs.list_blobs(BUCKET, page_size=1)] == ["big/object.bin", "small.txt"]

    # Deletes.
    bucket.delete_blob("big/object.bin")
    assert bucket.get_blob("big/object.bin") is None
    assert not bucket.blob("big/object.bin").exists()
    assert [b.name for b in gcs.list_blobs(BUCKET)] == ["small.txt"]

    from google.api_core import exceptions

    with pytest.raises(exceptions.NotFound):
        bucket.blob("nothing").download_as_bytes()
    with pytest.raises(exceptions.Conflict):
        gcs.create_bucket(BUCKET)
    with pytest.raises(exceptions.BadRequest):
        bucket.blob("a/../b").upload_from_string("x")
