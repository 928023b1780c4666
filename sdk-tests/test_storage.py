"""The Cloud Storage endpoint through the official google-cloud-storage client.

The client is pointed at the server exactly as at the Cloud Storage emulator:
`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with
TRAINYARD_SDK_TRANSPORT=grpc, where the server speaks TLS and REQUESTS_CA_BUNDLE names its
CA (anonymous credentials: the suite's server has no tokens file). Objects are the files of
the project's storage namespace.
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


IN_JOB = """
import os
from google.cloud import storage
# Nothing set by the program: the replica's environment points the client at the
# server (STORAGE_EMULATOR_HOST) and names the project (GOOGLE_CLOUD_PROJECT).
client = storage.Client()
bucket = client.bucket("in-job")
bucket.blob("from-the-job.txt").upload_from_string("written inside the job")
print("read back:", bucket.blob("given.txt").download_as_text())
print("project:", client.project, "endpoint:", os.environ["STORAGE_EMULATOR_HOST"])
"""


def test_a_job_uses_google_cloud_storage_unchanged(sdk, server, monkeypatch):
    """Code inside a job finds the server's storage by itself, as on the managed service:
    it uploads and downloads with `storage.Client()` and no settings of its own."""
    import sys

    from conftest import PROJECT
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server["url"])
    outside = storage.Client(project=PROJECT)
    bucket = outside.lookup_bucket("in-job") or outside.create_bucket("in-job")
    bucket.blob("given.txt").upload_from_string("given from outside")
    job = sdk.CustomJob(
        display_name="storage-in-job",
        worker_pool_specs=[
            {
                "machine_spec": {"machine_type": "n1-standard-4"},
                "replica_count": 1,
                # This suite's interpreter has google-cloud-storage.
                "container_spec": {"image_uri": "python:3.11", "command": [sys.executable, "-c", IN_JOB]},
            }
        ],
    )
    job.run()
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED
    assert bucket.blob("from-the-job.txt").download_as_text() == "written inside the job"
    import requests

    logs = requests.get(f"{server['url']}/v1/{job.resource_name}/logs", timeout=10).text
    assert "read back: given from outside" in logs, logs
    assert f"project: {PROJECT}" in logs, logs


def test_bucket_iam_policy_is_served_kept_and_confined_to_the_project(gcs):
    """GET/PUT /storage/v1/b/B/iam, as the SDK calls them when it prepares a staging
    bucket: the default policy names the bucket's project; a policy is kept; a binding
    for another project is refused naming it."""
    from google.api_core import exceptions

    bucket = gcs.lookup_bucket("sdk-iam") or gcs.create_bucket("sdk-iam")
    policy = bucket.get_iam_policy()
    assert "projectViewer:demo" in policy["roles/storage.legacyBucketReader"]
    policy["roles/storage.objectViewer"] = {"user:someone@example.com"}
    kept = bucket.set_iam_policy(policy)
    assert "user:someone@example.com" in kept["roles/storage.objectViewer"]
    assert "user:someone@example.com" in bucket.get_iam_policy()["roles/storage.objectViewer"]
    policy = bucket.get_iam_policy()
    policy["roles/storage.objectViewer"] = {"projectViewer:another-project"}
    with pytest.raises(exceptions.BadRequest) as e:
        bucket.set_iam_policy(policy)
    assert "another-project" in str(e.value)


IN_JOB_WITH_TOKENS = """
import os
from google.api_core import exceptions
from google.cloud import storage

client = storage.Client()
bucket = client.bucket("in-job-tokens")
bucket.blob("from-the-job.txt").upload_from_string("written with the job's credential")
print("read back:", bucket.blob("given.txt").download_as_text())
try:
    client.bucket("other-projects").blob("secret.txt").download_as_text()
    print("other project: read")
except exceptions.NotFound:
    # Another project's bucket answers as a bucket nobody has: a name tells nothing.
    print("other project: not found")
print("endpoint:", os.environ["API_ENDPOINT_OVERRIDE"], "emulator:", os.environ.get("STORAGE_EMULATOR_HOST"))
"""


def test_a_job_gets_a_credential_of_its_project_and_lifetime_in_tokens_mode(tokens_server):
    """In tokens mode a job's clients find a credential by themselves
    (GOOGLE_APPLICATION_CREDENTIALS) and the endpoint (API_ENDPOINT_OVERRIDE): `storage.Client()` uploads and downloads in the job's
    project, finds no bucket of another project (404, as for a bucket nobody has), and the credential is refused once the
    job has ended."""
    import glob
    import json
    import sys

    import google.oauth2.credentials
    import requests
    from conftest import OTHER_PROJECT, OTHER_TOKEN, PROJECT, PROJECT_TOKEN
    from google.cloud import storage

    url = tokens_server["url"]

    def client(project, token):
        return storage.Client(
            project=project,
            credentials=google.oauth2.credentials.Credentials(token=token),
            client_options={"api_endpoint": url},
        )

    mine = client(PROJECT, PROJECT_TOKEN).create_bucket("in-job-tokens")
    mine.blob("given.txt").upload_from_string("given from outside")
    client(OTHER_PROJECT, OTHER_TOKEN).create_bucket("other-projects").blob("secret.txt").upload_from_string("not yours")

    headers = {"Authorization": f"Bearer {PROJECT_TOKEN}"}
    body = {
        "displayName": "credential-in-job",
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {"machineType": "n1-standard-4"},
                    "replicaCount": 1,
                    "containerSpec": {"imageUri": "python:3.11", "command": [sys.executable, "-c", IN_JOB_WITH_TOKENS]},
                }
            ]
        },
    }
    base = f"{url}/v1/projects/{PROJECT}/locations/us-central1/customJobs"
    r = requests.post(base, json=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    job_id = name.rsplit("/", 1)[1]
    deadline = time.monotonic() + 120
    while True:
        job = requests.get(f"{url}/v1/{name}", headers=headers, timeout=10).json()
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    logs = requests.get(f"{url}/v1/{name}/logs", headers=headers, timeout=10).text
    assert job["state"] == "JOB_STATE_SUCCEEDED", (job, logs)
    assert mine.blob("from-the-job.txt").download_as_text() == "written with the job's credential"
    assert "read back: given from outside" in logs, logs
    assert "other project: not found" in logs, logs
    assert f"endpoint: {url} emulator: None" in logs, logs

    # The job has ended: its credential is refused.
    files = glob.glob(str(tokens_server["data_dir"] / "runs" / job_id / "*" / "*" / "*" / "credentials.json"))
    assert len(files) == 1, files
    assert oct(os.stat(files[0]).st_mode & 0o777) == "0o400"
    credential = json.loads(open(files[0]).read())
    assert credential["type"] == "authorized_user"
    used = requests.get(
        f"{url}/storage/v1/b/in-job-tokens/o",
        headers={"Authorization": f"Bearer {credential['token']}"},
        timeout=10,
    )
    assert used.status_code == 401, used.text
    assert "accepted only while its job runs" in used.text, used.text
    # A forged credential of a job that does not run gets the very same answer: the
    # answer is no oracle of which jobs run.
    forged = requests.get(
        f"{url}/storage/v1/b/in-job-tokens/o",
        headers={"Authorization": f"Bearer tyj1.{int(job_id) + 1000}.{'0' * 64}"},
        timeout=10,
    )
    assert (forged.status_code, forged.text) == (used.status_code, used.text)
