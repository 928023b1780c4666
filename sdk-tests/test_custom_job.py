"""CustomJob through the official Python SDK (google-cloud-aiplatform), over REST or gRPC
(TRAINYARD_SDK_TRANSPORT).

Every case uses the SDK exactly as a user would against the managed service, and asserts
on what comes back. Programs are short `python3 -c` one-liners run as host processes.
"""

import datetime
import json
import re
import time
import uuid

import pytest
import requests
from google.api_core import exceptions as api_exceptions
from google.cloud.aiplatform.compat.types import job_state as gca_job_state
from google.cloud.aiplatform_v1.types import custom_job as gca_custom_job

from conftest import LOCATION, PROJECT, TOKEN

JobState = gca_job_state.JobState
MACHINE = {"machine_type": "n1-standard-4"}
IMAGE = "python:3.11"


def pool(code, replica_count=1, env=None):
    """One worker pool running `python3 -c CODE`."""
    spec = {
        "machine_spec": dict(MACHINE),
        "replica_count": replica_count,
        "container_spec": {"image_uri": IMAGE, "command": ["python3", "-c", code]},
    }
    if env:
        spec["container_spec"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return spec


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for_state(job, states, timeout_s=20.0):
    """Poll `job.state` (the SDK re-reads the job on every access) until it is in states."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        state = job.state
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in states:
            return state
        time.sleep(0.2)
    pytest.fail(f"{job.resource_name} never reached {states}; states seen: {seen}")


def test_run_succeeds(sdk):
    job = sdk.CustomJob(
        display_name=unique("succeeds"),
        worker_pool_specs=[pool("print('hello from trainyard')")],
    )
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    res = job.gca_resource
    assert res.name.startswith(f"projects/{PROJECT}/locations/{LOCATION}/customJobs/")
    assert res.display_name == job.display_name
    assert not res.error.message
    assert res.create_time and res.start_time and res.end_time
    assert res.create_time <= res.start_time <= res.end_time
    spec = res.job_spec.worker_pool_specs[0]
    assert spec.machine_spec.machine_type == "n1-standard-4"
    assert spec.replica_count == 1
    assert list(spec.container_spec.command) == ["python3", "-c", "print('hello from trainyard')"]
    # staging_bucket from aiplatform.init becomes the job's base output directory.
    assert res.job_spec.base_output_directory.output_uri_prefix.startswith("gs://bucket/")


def test_run_fails_with_replica_exit_status_and_stderr(sdk):
    code = "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"
    job = sdk.CustomJob(display_name=unique("fails"), worker_pool_specs=[pool(code)])
    with pytest.raises(RuntimeError) as excinfo:
        job.run()
    msg = str(excinfo.value)
    assert msg.startswith("Job failed with:")
    assert "workerpool0-0" in msg
    assert re.search(r"\b3\b", msg.split("workerpool0-0", 1)[1]), msg
    assert "boom" in msg
    assert job.state == JobState.JOB_STATE_FAILED
    err = job.gca_resource.error
    assert err.code != 0
    assert "workerpool0-0" in err.message and "boom" in err.message


def test_enable_web_access_gives_each_replicas_terminal(sdk):
    """`enable_web_access=True` (the SDK's field `enableWebAccess`): while the job runs,
    `web_access_uris` maps each replica to its terminal in the console (docs/exec.md)."""
    job = sdk.CustomJob(
        display_name=unique("web-access"),
        worker_pool_specs=[pool("import time; time.sleep(120)"), pool("import time; time.sleep(120)")],
    )
    job.submit(enable_web_access=True)
    wait_for_state(job, {JobState.JOB_STATE_RUNNING})
    job_id = job.resource_name.rsplit("/", 1)[1]
    uris = dict(job.web_access_uris)
    assert sorted(uris) == ["workerpool0-0", "workerpool1-0"], uris
    for replica, uri in uris.items():
        assert uri.endswith(f"/console?project={PROJECT}&region={LOCATION}#/jobs/{job_id}/terminal/{replica}"), uri
    job.cancel()
    wait_for_state(job, {JobState.JOB_STATE_CANCELLED}, timeout_s=15)
    assert not dict(job.web_access_uris), "only while it runs"


def test_submit_cancel_wait(sdk):
    job = sdk.CustomJob(
        display_name=unique("cancel"),
        worker_pool_specs=[pool("import time; time.sleep(120)")],
    )
    job.submit()
    assert job.resource_name
    wait_for_state(job, {JobState.JOB_STATE_RUNNING})
    job.cancel()
    # The SDK exposes cancellation through `state` (CANCELLING, then CANCELLED) and
    # through wait_for_completion(), which raises for a cancelled job.
    wait_for_state(job, {JobState.JOB_STATE_CANCELLED}, timeout_s=15)
    with pytest.raises(RuntimeError, match="Job failed with"):
        job.wait_for_completion()
    assert job.gca_resource.state == JobState.JOB_STATE_CANCELLED
    assert job.gca_resource.error.code == 1  # google.rpc.Code.CANCELLED
    assert job.gca_resource.end_time


def test_list_and_get(sdk):
    job = sdk.CustomJob(display_name=unique("listed"), worker_pool_specs=[pool("pass")])
    job.run()
    listed = sdk.CustomJob.list()
    names = [j.resource_name for j in listed]
    assert job.resource_name in names
    entry = listed[names.index(job.resource_name)]
    assert entry.display_name == job.display_name
    assert entry.gca_resource.state == JobState.JOB_STATE_SUCCEEDED

    got = sdk.CustomJob.get(job.resource_name)
    assert got.resource_name == job.resource_name
    assert got.display_name == job.display_name
    assert got.gca_resource.state == JobState.JOB_STATE_SUCCEEDED
    assert got.job_spec == job.gca_resource.job_spec
    # get also takes the bare id, resolved against the project and location of init().
    by_id = sdk.CustomJob.get(job.name)
    assert by_id.resource_name == job.resource_name


def test_list_with_filter(sdk):
    nlp_name = unique("filter-nlp")
    other_name = unique("filter-vision")
    nlp = sdk.CustomJob(display_name=nlp_name, worker_pool_specs=[pool("pass")], labels={"team": "nlp"})
    other = sdk.CustomJob(
        display_name=other_name, worker_pool_specs=[pool("pass")], labels={"team": "vision"}
    )
    nlp.submit()
    other.submit()

    by_name = sdk.CustomJob.list(filter=f'display_name="{nlp_name}"')
    assert [j.resource_name for j in by_name] == [nlp.resource_name]

    by_label = [j.resource_name for j in sdk.CustomJob.list(filter='labels.team="nlp"')]
    assert nlp.resource_name in by_label
    assert other.resource_name not in by_label
    for j in sdk.CustomJob.list(filter='labels.team="nlp"'):
        assert j.labels.get("team") == "nlp"


def test_delete_finished_job(sdk):
    job = sdk.CustomJob(display_name=unique("delete"), worker_pool_specs=[pool("pass")])
    job.run()
    name = job.resource_name
    job.delete()
    with pytest.raises(api_exceptions.NotFound):
        sdk.CustomJob.get(name)
    assert name not in [j.resource_name for j in sdk.CustomJob.list()]


def test_labels_round_trip(sdk):
    labels = {"team": "nlp", "env": "test-1", "owner_id": "a_b-c"}
    job = sdk.CustomJob(
        display_name=unique("labels"), worker_pool_specs=[pool("pass")], labels=labels
    )
    job.submit()
    assert dict(job.labels) == labels
    got = sdk.CustomJob.get(job.resource_name)
    assert dict(got.labels) == labels
    assert dict(got.gca_resource.labels) == labels


def test_base_output_dir_model_written_to_storage(sdk, server):
    code = (
        "import os\n"
        "d = os.environ['AIP_MODEL_DIR']\n"
        "os.makedirs(d, exist_ok=True)\n"
        "open(os.path.join(d, 'model.txt'), 'w').write('weights-v1')\n"
    )
    job = sdk.CustomJob(
        display_name=unique("model-dir"),
        worker_pool_specs=[pool(code)],
        base_output_dir="gs://bucket/out",
    )
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://bucket/out"
    # gs://bucket/out of project PROJECT: <storage root>/PROJECT/bucket/out
    written = server["data_dir"] / "storage" / PROJECT / "bucket" / "out" / "model" / "model.txt"
    assert written.is_file(), f"{written} missing"
    assert written.read_text() == "weights-v1"


def test_scheduling_options_round_trip(sdk):
    job = sdk.CustomJob(display_name=unique("scheduling"), worker_pool_specs=[pool("pass")])
    job.run(timeout=900, restart_job_on_worker_restart=True, disable_retries=True)
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    for scheduling in (
        job.job_spec.scheduling,
        job.gca_resource.job_spec.scheduling,
        sdk.CustomJob.get(job.resource_name).job_spec.scheduling,
    ):
        assert scheduling.timeout == datetime.timedelta(seconds=900)
        assert scheduling.restart_job_on_worker_restart is True
        assert scheduling.disable_retries is True


def test_two_pool_job_succeeds(sdk):
    # Exits non-zero unless the replica sees a two-replica cluster.
    code = (
        "import json, os, sys\n"
        "c = json.loads(os.environ['CLUSTER_SPEC'])['cluster']\n"
        "ok = len(c['workerpool0']) == 1 and len(c['workerpool1']) == 1 "
        "and os.environ['WORLD_SIZE'] == '2'\n"
        "print(os.environ['RANK'], c)\n"
        "sys.exit(0 if ok else 7)\n"
    )
    job = sdk.CustomJob(
        display_name=unique("two-pools"),
        worker_pool_specs=[pool(code), pool(code)],
    )
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    pools = job.job_spec.worker_pool_specs
    assert len(pools) == 2
    assert [p.replica_count for p in pools] == [1, 1]


def _rest(server, method, path, **kwargs):
    url = f"{server['url']}/v1/projects/{PROJECT}/locations/{LOCATION}/{path}"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return requests.request(method, url, headers=headers, timeout=10, **kwargs)


# The query parameter the SDK adds to every REST call (google/api_core/rest_helpers.py).
INT_ENUMS = {"$alt": "json;enum-encoding=int"}


def test_enum_encoding_int_both_ways(sdk, server):
    body = {
        "displayName": unique("enums"),
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    # Numeric enum in: NVIDIA_TESLA_T4 is 5.
                    "machineSpec": {
                        "machineType": "n1-standard-4",
                        "acceleratorType": 5,
                        "acceleratorCount": 1,
                    },
                    "replicaCount": "1",
                    "containerSpec": {"imageUri": IMAGE, "command": ["python3", "-c", "pass"]},
                }
            ],
            # ON_DEMAND is 1.
            "scheduling": {"strategy": 1},
        },
    }
    r = _rest(server, "POST", "customJobs", params=INT_ENUMS, data=json.dumps(body))
    assert r.status_code == 200, r.text
    created = r.json()
    # Numbers out, as the SDK asked.
    assert isinstance(created["state"], int), created
    assert created["state"] in (1, 2, 3, 4)  # QUEUED, PENDING, RUNNING or SUCCEEDED
    assert created["jobSpec"]["scheduling"]["strategy"] == 1
    assert created["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] == 5
    job_id = created["name"].rsplit("/", 1)[1]

    # Without the parameter: names out.
    plain = _rest(server, "GET", f"customJobs/{job_id}").json()
    assert isinstance(plain["state"], str) and plain["state"].startswith("JOB_STATE_")
    assert plain["jobSpec"]["scheduling"]["strategy"] == "ON_DEMAND"
    assert plain["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"

    # The SDK (which sends the parameter on every call) reads the numbers back as enums.
    job = sdk.CustomJob.get(created["name"])
    wait_for_state(job, {JobState.JOB_STATE_SUCCEEDED})
    assert job.job_spec.scheduling.strategy == gca_custom_job.Scheduling.Strategy.ON_DEMAND
    machine = job.job_spec.worker_pool_specs[0].machine_spec
    assert machine.accelerator_type.name == "NVIDIA_TESLA_T4"

    done = _rest(server, "GET", f"customJobs/{job_id}", params=INT_ENUMS).json()
    assert done["state"] == 4  # JOB_STATE_SUCCEEDED

    # A list answers numbers too, and an enum given by name is accepted with the parameter.
    listed = _rest(server, "GET", "customJobs", params=INT_ENUMS).json()
    assert all(isinstance(j["state"], int) for j in listed["customJobs"])
    body["displayName"] = unique("enums-by-name")
    body["jobSpec"]["scheduling"]["strategy"] = "ON_DEMAND"
    r = _rest(server, "POST", "customJobs", params=INT_ENUMS, data=json.dumps(body))
    assert r.status_code == 200, r.text
    assert r.json()["jobSpec"]["scheduling"]["strategy"] == 1


def test_the_other_transport_is_explained(server):
    """A client of the other scheme is told what to change.

    REST (a plain-HTTP server): the SDK's default transport (gRPC over TLS) can only show
    a failed handshake; the server's log says what it was and what to change
    (api_transport="rest", an http:// endpoint).

    gRPC (an HTTPS server): a plain http:// request to the TLS port gets a 400 whose JSON
    error says to use https."""
    if server["transport"] == "grpc":
        r = requests.get(f"http://{server['endpoint']}/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs", timeout=10)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json"), r.headers
        error = r.json()["error"]
        assert error["code"] == 400, error
        assert "https" in error["message"], error
        return

    import google.auth.credentials
    from google.cloud import aiplatform_v1

    client = aiplatform_v1.JobServiceClient(
        credentials=google.auth.credentials.AnonymousCredentials(),
        client_options={"api_endpoint": f"127.0.0.1:{server['port']}"},
    )
    with pytest.raises(api_exceptions.GoogleAPICallError) as e:
        client.list_custom_jobs(parent=f"projects/{PROJECT}/locations/{LOCATION}", timeout=10, retry=None)
    assert "handshake" in str(e.value).lower() or "ssl" in str(e.value).lower(), str(e.value)
    said = "began a TLS handshake on this port, which serves plain HTTP"
    end = time.monotonic() + 10
    while said not in server["log"].read_text(errors="replace") and time.monotonic() < end:
        time.sleep(0.1)
    log = server["log"].read_text(errors="replace")
    assert said in log and 'api_transport="rest"' in log, log[-3000:]
