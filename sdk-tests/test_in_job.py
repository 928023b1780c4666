"""Code inside a job that calls the service with no endpoint of its own, as the SDK's
system test `project_id_inference` does on the managed service: `aiplatform.init()` with
no arguments, a CustomJob created and listed from inside the job, and `storage.Client()`.

The server runs with `--tls-auto` (both suite modes: these tests start their own TLS
servers), so it also listens on port 443 of `[tls] jobs_address` (127.255.0.1): each
replica's mount namespace has a hosts file in which the service's host names
(`us-central1-aiplatform.googleapis.com`, `storage.googleapis.com`, ...) lead there, its
clients trust the server's CA (`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, `REQUESTS_CA_BUNDLE`),
and `google.auth.default()` finds a credential of the job's (`GOOGLE_APPLICATION_CREDENTIALS`),
in open mode as with tokens. The job's own program is this suite's interpreter, which has
the SDK.
"""

import sys
import time

import pytest
import requests

from conftest import LOCATION, PROJECT, PROJECT_TOKEN, _running_server, _running_tokens_server

# The program of the job: unchanged code written for the managed service.
INSIDE = """
from google.cloud import aiplatform, storage

aiplatform.init()
config = aiplatform.initializer.global_config
print("inside: project", config.project, "location", config.location, flush=True)
job = aiplatform.CustomJob(
    display_name="made-inside",
    worker_pool_specs=[{
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "container_spec": {"image_uri": "local/x", "command": ["true"]},
    }],
    base_output_dir="gs://inside-bucket/out",
    staging_bucket="gs://inside-bucket",
)
job.submit()
print("inside: created", job.resource_name, flush=True)
print("inside: listed", sorted(j.display_name for j in aiplatform.CustomJob.list()), flush=True)
print("inside: buckets", [b.name for b in storage.Client().list_buckets()], flush=True)
"""


def _run_inside(server, token):
    """Create the job that runs INSIDE, wait for its end: (final job, its log text)."""
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{server['url']}/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs"
    body = {
        "displayName": "project-id-inference",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "local/sdk", "command": [sys.executable, "-c", INSIDE]},
        }]},
    }
    ca = str(server["ca"])
    r = requests.post(base, json=body, headers=headers, verify=ca, timeout=10)
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    deadline = time.monotonic() + 180
    while True:
        job = requests.get(f"{server['url']}/v1/{name}", headers=headers, verify=ca, timeout=10).json()
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    logs = requests.get(f"{server['url']}/v1/{name}/logs", headers=headers, verify=ca, timeout=10).text
    return job, logs


def _check(server, token):
    job, logs = _run_inside(server, token)
    assert job["state"] == "JOB_STATE_SUCCEEDED", logs[-4000:]
    assert f"inside: project {PROJECT} location {LOCATION}" in logs, logs[-4000:]
    assert "inside: created projects/" in logs and "made-inside" in logs, logs[-4000:]
    # No traceback: the SDK's own lookups (the project's id) were answered too.
    assert "Traceback" not in logs, logs[-4000:]
    # The job made inside is the project's, seen from outside.
    r = requests.get(
        f"{server['url']}/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs",
        headers={"Authorization": f"Bearer {token}"},
        verify=str(server["ca"]),
        timeout=10,
    )
    assert "made-inside" in [j["displayName"] for j in r.json().get("customJobs", [])], r.text


@pytest.mark.parametrize("mode", ["open", "tokens"])
def test_the_sdk_inside_a_job_finds_the_service_with_no_endpoint(mode):
    """`aiplatform.init()` and `storage.Client()` with nothing set by the user reach this
    server from inside a replica over TLS, with the job's project and credential: in open
    mode and with tokens."""
    if mode == "open":
        with _running_server(tls=True) as server:
            _check(server, "any")
    else:
        with _running_tokens_server(tls=True) as server:
            _check(server, PROJECT_TOKEN)
