"""gRPC over TLS driven with grpcio itself: the messages are the SDK's own
`aiplatform_v1` types (`serialize` / `deserialize`) or hand-made bytes, so that malformed,
oversized and unknown requests can be sent too, which the SDK's clients never send.

These tests run in both modes. With TRAINYARD_SDK_TRANSPORT=grpc they use the session's
server; with rest, whose session server speaks plain HTTP, they start a TLS server of
their own (`_running_server(tls=True)`), so they always test gRPC over TLS. Where a gRPC
answer has a REST twin (the same request over HTTPS, which the server answers the same
way), the two are compared.
"""

import re
import sys
import time
import uuid

import grpc
import pytest
import requests
from google.cloud.aiplatform_v1 import types
from google.longrunning import operations_pb2
from google.protobuf.json_format import MessageToDict

from conftest import (
    LOCATION,
    OTHER_PROJECT,
    OTHER_TOKEN,
    PROJECT,
    PROJECT_TOKEN,
    TOKEN,
    TRANSPORT,
    _running_server,
    _running_tokens_server,
)

# The largest request: the REST API's largest body (MAX_BODY, crates/server/src/reply.rs),
# which is also the largest gRPC request message (MAX_MESSAGE, crates/server/src/grpc.rs).
MAX_BODY = 1024 * 1024
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"
OTHER_PARENT = f"projects/{OTHER_PROJECT}/locations/{LOCATION}"
JOB_SERVICE = "/google.cloud.aiplatform.v1.JobService"


@pytest.fixture(scope="module")
def tls_server(request):
    """The session's server when it speaks TLS (grpc mode), else a TLS server of this
    module's own."""
    if TRANSPORT == "grpc":
        yield request.getfixturevalue("server")
    else:
        with _running_server(tls=True) as s:
            yield s


@pytest.fixture(scope="module")
def tls_tokens_server():
    """A TLS server in tokens mode (PROJECT_TOKEN for PROJECT, OTHER_TOKEN for
    OTHER_PROJECT), in both modes."""
    with _running_tokens_server(tls=True) as s:
        yield s


def _channel(server):
    """A channel as the SDK makes one: TLS trusting the server's CA. grpc's own client
    limit on what it sends is lifted, so that the server's limit is the one met."""
    credentials = grpc.ssl_channel_credentials(root_certificates=server["ca"].read_bytes())
    return grpc.secure_channel(server["endpoint"], credentials, options=[("grpc.max_send_message_length", -1)])


@pytest.fixture(scope="module")
def channel(tls_server):
    with _channel(tls_server) as c:
        yield c


@pytest.fixture(scope="module")
def tokens_channel(tls_tokens_server):
    with _channel(tls_tokens_server) as c:
        yield c


def _auth(token):
    return [("authorization", f"Bearer {token}")] if token else []


def _rpc(channel, method, request, response=None, token=TOKEN):
    """JobService `method` with `request` (an `aiplatform_v1` message, or bytes as they
    are); the answer decoded as `response` (an `aiplatform_v1` type or a protobuf class),
    or the bytes without one."""
    if isinstance(request, bytes):
        serialize = None
    else:
        serialize = type(request).serialize
    if response is None:
        deserialize = None
    elif hasattr(response, "FromString"):
        deserialize = response.FromString
    else:
        deserialize = response.deserialize
    call = channel.unary_unary(f"{JOB_SERVICE}/{method}", request_serializer=serialize, response_deserializer=deserialize)
    return call(request, metadata=_auth(token), timeout=30)


def _refused(channel, method, request, token=TOKEN) -> grpc.RpcError:
    """The error of an RPC that must fail."""
    with pytest.raises(grpc.RpcError) as e:
        _rpc(channel, method, request, token=token)
    return e.value


def _json(message) -> dict:
    """A message in the proto3 JSON mapping, as the REST API writes it (enum names)."""
    pb = message if hasattr(message, "DESCRIPTOR") else type(message).pb(message)
    return MessageToDict(pb)


def _rest(server, method, path, token=TOKEN, **kwargs):
    """The REST twin: `/v1/{path}` over HTTPS, trusting the server's CA."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(
        method, f"{server['url']}/v1/{path}", headers=headers, verify=str(server["ca"]), timeout=30, **kwargs
    )


def _rest_status(r) -> str:
    """The `status` name of a REST error answer."""
    assert r.status_code >= 400, r.text
    return r.json()["error"]["status"]


def _jobs(channel, parent=PARENT, token=TOKEN):
    """Every CustomJob of `parent`, through ListCustomJobs page by page."""
    jobs, page = [], ""
    while True:
        answer = _rpc(
            channel,
            "ListCustomJobs",
            types.ListCustomJobsRequest(parent=parent, page_size=100, page_token=page),
            types.ListCustomJobsResponse,
            token=token,
        )
        jobs += list(answer.custom_jobs)
        page = answer.next_page_token
        if not page:
            return jobs


def _job_names(channel, parent=PARENT, token=TOKEN):
    return [j.name for j in _jobs(channel, parent, token)]


def _rest_jobs(server, parent=PARENT, token=TOKEN):
    """Every CustomJob of `parent` over REST, page by page."""
    jobs, page = [], ""
    while True:
        r = _rest(server, "GET", f"{parent}/customJobs", token=token, params={"pageSize": 100, "pageToken": page})
        assert r.status_code == 200, r.text
        jobs += r.json().get("customJobs", [])
        page = r.json().get("nextPageToken")
        if not page:
            return jobs


def _custom_job(display_name, code="pass", replica_count=1, pools=1):
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": replica_count,
        "container_spec": {"image_uri": "python:3.11", "command": [sys.executable, "-c", code]},
    }
    return types.CustomJob(display_name=display_name, job_spec={"worker_pool_specs": [pool] * pools})


def _create(parent, job):
    return types.CreateCustomJobRequest(parent=parent, custom_job=job)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _until(read, done, what, timeout_s=30.0):
    """Call `read` until `done(answer)`; the last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = read()
        if done(answer):
            return answer
        assert time.monotonic() < deadline, f"{what}: still {answer}"
        time.sleep(0.1)


def test_a_malformed_message_is_invalid_argument(channel):
    """Bytes that are no protobuf message at all: INVALID_ARGUMENT naming the message
    that was expected, and no job is made."""
    before = _job_names(channel)
    e = _refused(channel, "CreateCustomJob", b"\xff\xff\xff")
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "google.cloud.aiplatform.v1.CreateCustomJobRequest" in e.details(), e.details()
    assert _job_names(channel) == before


def test_a_create_without_parent_is_invalid_argument_naming_it(channel):
    """A CreateCustomJob whose `parent` (a field of the path of its REST twin) is empty:
    INVALID_ARGUMENT naming `parent`, and no job is made."""
    before = _job_names(channel)
    e = _refused(channel, "CreateCustomJob", _create("", _custom_job(unique("no-parent"))))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "parent" in e.details(), e.details()
    assert _job_names(channel) == before


@pytest.mark.parametrize(
    "job",
    [
        pytest.param({"replica_count": 0}, id="replica-count-0"),
        pytest.param({"pools": 0}, id="no-worker-pools"),
    ],
)
def test_a_bad_field_value_is_invalid_argument_as_over_rest(channel, tls_server, job):
    """A CustomJob that the REST API refuses (a primary pool of 0 replicas, no worker
    pool): over gRPC the same refusal, INVALID_ARGUMENT with the REST answer's message
    (which names the field), and no job is made by either."""
    before = _job_names(channel)
    bad = _custom_job(unique("bad"), **job)
    e = _refused(channel, "CreateCustomJob", _create(PARENT, bad))
    r = _rest(tls_server, "POST", f"{PARENT}/customJobs", json=_json(bad))
    assert r.status_code == 400, r.text
    assert e.code().name == _rest_status(r) == "INVALID_ARGUMENT", (e, r.text)
    assert e.details() == r.json()["error"]["message"]
    assert "jobSpec.workerPoolSpecs" in e.details(), e.details()
    assert _job_names(channel) == before


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(MAX_BODY + 1024, id="just-over-the-limit"),
        pytest.param(4 * MAX_BODY, id="four-times-the-limit"),
    ],
)
def test_a_message_over_the_limit_is_resource_exhausted(channel, size):
    """A CreateCustomJob larger than the limit of a request (the REST API's body limit),
    just over it or far over it: RESOURCE_EXHAUSTED, and no job is made."""
    before = _job_names(channel)
    request = _create(PARENT, _custom_job("x" * size))
    assert len(types.CreateCustomJobRequest.serialize(request)) > MAX_BODY
    e = _refused(channel, "CreateCustomJob", request)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
    assert _job_names(channel) == before


def test_a_message_just_under_the_limit_is_read(channel):
    """A CreateCustomJob just under the limit is read and judged for what it says: its
    display name is too long (INVALID_ARGUMENT naming displayName), not its size."""
    before = _job_names(channel)
    request = _create(PARENT, _custom_job("x" * (MAX_BODY - 4096)))
    assert len(types.CreateCustomJobRequest.serialize(request)) < MAX_BODY
    e = _refused(channel, "CreateCustomJob", request)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "displayName" in e.details(), e.details()
    assert _job_names(channel) == before


def test_tokens_mode_codes_are_those_of_the_rest_twin(tls_tokens_server, tokens_channel):
    """In tokens mode, each refusal over gRPC has the code of its REST twin's status and
    the same message: no token or a wrong one is UNAUTHENTICATED; another project's job,
    looked at, listed, cancelled or deleted with a token of PROJECT, is PERMISSION_DENIED
    or NOT_FOUND; that job is untouched after."""
    other = _rpc(
        tokens_channel, "CreateCustomJob", _create(OTHER_PARENT, _custom_job(unique("others"))), types.CustomJob, token=OTHER_TOKEN
    )
    other_id = other.name.rsplit("/", 1)[1]
    cases = [
        ("no token", "ListCustomJobs", types.ListCustomJobsRequest(parent=PARENT), None, ("GET", f"{PARENT}/customJobs")),
        ("a wrong token", "ListCustomJobs", types.ListCustomJobsRequest(parent=PARENT), "not-a-token", ("GET", f"{PARENT}/customJobs")),
        ("another project's job", "GetCustomJob", types.GetCustomJobRequest(name=other.name), PROJECT_TOKEN, ("GET", other.name)),
        (
            "another project's job id under one's own project",
            "GetCustomJob",
            types.GetCustomJobRequest(name=f"{PARENT}/customJobs/{other_id}"),
            PROJECT_TOKEN,
            ("GET", f"{PARENT}/customJobs/{other_id}"),
        ),
        ("another project's list", "ListCustomJobs", types.ListCustomJobsRequest(parent=OTHER_PARENT), PROJECT_TOKEN, ("GET", f"{OTHER_PARENT}/customJobs")),
        ("another project's cancel", "CancelCustomJob", types.CancelCustomJobRequest(name=other.name), PROJECT_TOKEN, ("POST", f"{other.name}:cancel")),
        ("another project's delete", "DeleteCustomJob", types.DeleteCustomJobRequest(name=other.name), PROJECT_TOKEN, ("DELETE", other.name)),
    ]
    for what, method, request, token, (verb, path) in cases:
        e = _refused(tokens_channel, method, request, token=token)
        r = _rest(tls_tokens_server, verb, path, token=token)
        assert e.code().name == _rest_status(r), (what, e, r.text)
        assert e.details() == r.json()["error"]["message"], (what, e, r.text)
        if "token" in what:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, (what, e)
        else:
            assert e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND), (what, e)
    still = _rpc(tokens_channel, "GetCustomJob", types.GetCustomJobRequest(name=other.name), types.CustomJob, token=OTHER_TOKEN)
    assert still.name == other.name
    assert other.name in _job_names(tokens_channel, OTHER_PARENT, OTHER_TOKEN)


@pytest.mark.parametrize(
    "path,named",
    [
        pytest.param(f"{JOB_SERVICE}/NoSuchMethod", "NoSuchMethod", id="unknown-method"),
        pytest.param("/google.cloud.aiplatform.v1.ModelService/GetModel", "google.cloud.aiplatform.v1.ModelService", id="unknown-service"),
    ],
)
def test_what_is_not_offered_is_unimplemented_naming_it(channel, path, named):
    """A method JobService does not have, and a service Trainyard does not offer:
    UNIMPLEMENTED, naming what was asked for."""
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        call(b"", metadata=_auth(TOKEN), timeout=30)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, e.value
    assert named in e.value.details(), e.value.details()


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_reflection_lists_the_services(channel, version):
    """gRPC server reflection (what grpcurl asks): a ServerReflectionRequest with
    `list_services: ""` (field 7, a string: bytes 0x3a 0x00) is answered with the services,
    JobService among them."""
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo", request_serializer=None, response_deserializer=None
    )
    answer = b"".join(call(iter([b"\x3a\x00"]), timeout=30))
    assert b"google.cloud.aiplatform.v1.JobService" in answer, answer


def test_a_job_over_grpc_and_over_rest_is_the_same(channel, tls_server):
    """CustomJob create, get, list, cancel and delete, for one job made over gRPC and one
    made over REST (HTTPS), each read both ways: the gRPC answers in the proto3 JSON
    mapping have the same name, displayName and state as the REST answers; once the jobs
    have settled (cancelled), every field is the same but the REST API's own extras
    (trainyard*, not in the proto); the delete operations are alike; deleted, both
    transports answer NOT_FOUND with the same message."""
    fields = ("name", "displayName", "state")

    def pick(job):
        return {k: job.get(k) for k in fields}

    def over_grpc(name):
        return _json(_rpc(channel, "GetCustomJob", types.GetCustomJobRequest(name=name), types.CustomJob))

    def over_rest(name):
        r = _rest(tls_server, "GET", name)
        assert r.status_code == 200, r.text
        return r.json()

    # Create: the same job, one made each way.
    spec = _custom_job(unique("twin-grpc"), code="import time; time.sleep(120)")
    by_grpc = _json(_rpc(channel, "CreateCustomJob", _create(PARENT, spec), types.CustomJob))
    body = _json(spec) | {"displayName": unique("twin-rest")}
    r = _rest(tls_server, "POST", f"{PARENT}/customJobs", json=body)
    assert r.status_code == 200, r.text
    by_rest = r.json()
    assert by_grpc["displayName"] == spec.display_name and by_rest["displayName"] == body["displayName"]
    for job in (by_grpc, by_rest):
        assert re.fullmatch(rf"{PARENT}/customJobs/\d+", job["name"]), job
    assert by_grpc["state"] == by_rest["state"]
    assert by_grpc["jobSpec"] == by_rest["jobSpec"]
    names = [by_grpc["name"], by_rest["name"]]

    # Get: running, and the same both ways.
    for name in names:
        _until(lambda: over_grpc(name)["state"], lambda s: s == "JOB_STATE_RUNNING", f"{name} over gRPC")
        _until(lambda: over_rest(name)["state"], lambda s: s == "JOB_STATE_RUNNING", f"{name} over REST")
        assert pick(over_grpc(name)) == pick(over_rest(name))

    # List: the same entries.
    grpc_entries = {j.name: _json(j) for j in _jobs(channel)}
    rest_entries = {j["name"]: j for j in _rest_jobs(tls_server)}
    for name in names:
        assert pick(grpc_entries[name]) == pick(rest_entries[name])

    # Cancel: an empty answer each way, then cancelled, every field alike.
    assert _rpc(channel, "CancelCustomJob", types.CancelCustomJobRequest(name=names[0])) == b""
    r = _rest(tls_server, "POST", f"{names[1]}:cancel")
    assert r.status_code == 200 and r.json() == {}, r.text
    for name in names:
        _until(lambda: over_grpc(name)["state"], lambda s: s == "JOB_STATE_CANCELLED", f"{name} over gRPC")
        g, rest = over_grpc(name), over_rest(name)
        extras = set(rest) - set(g)
        assert all(k.startswith("trainyard") for k in extras), extras
        assert g == {k: v for k, v in rest.items() if k not in extras}

    # Delete: a done operation each way, then NOT_FOUND each way.
    deleted_by_grpc = _json(_rpc(channel, "DeleteCustomJob", types.DeleteCustomJobRequest(name=names[0]), operations_pb2.Operation))
    r = _rest(tls_server, "DELETE", names[1])
    assert r.status_code == 200, r.text
    deleted_by_rest = r.json()
    for op in (deleted_by_grpc, deleted_by_rest):
        assert re.fullmatch(rf"{PARENT}/operations/\d+", op["name"]), op
        assert op["done"] is True, op
    assert sorted(deleted_by_grpc) == sorted(deleted_by_rest)
    assert deleted_by_grpc["metadata"]["@type"] == deleted_by_rest["metadata"]["@type"]
    assert deleted_by_grpc["response"] == deleted_by_rest["response"]
    for name in names:
        e = _refused(channel, "GetCustomJob", types.GetCustomJobRequest(name=name))
        r = _rest(tls_server, "GET", name)
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
        assert _rest_status(r) == "NOT_FOUND", r.text
        assert e.details() == r.json()["error"]["message"]
    assert not set(names) & set(_job_names(channel))


def test_each_rpc_is_counted_in_the_metrics(channel, tls_server):
    """An RPC is counted in /metrics as its REST twin's requests are, under method GRPC
    and the RPC's path: one series per RPC, with the REST answer's code."""
    _job_names(channel)
    r = requests.get(f"{tls_server['url']}/metrics", verify=str(tls_server["ca"]), timeout=10)
    assert r.status_code == 200, r.text
    series = 'trainyard_http_request_duration_seconds_count{method="GRPC",route="/google.cloud.aiplatform.v1.JobService/ListCustomJobs",code="200"}'
    assert series in r.text, [l for l in r.text.splitlines() if "GRPC" in l]


def test_the_servers_are_still_up(channel, tls_server, tokens_channel, tls_tokens_server):
    """After all of the above (this module's last test): both servers still answer gRPC
    (a ListCustomJobs) and /healthz, and neither logged a panic."""
    _job_names(channel)
    _job_names(tokens_channel, token=PROJECT_TOKEN)
    for server in (tls_server, tls_tokens_server):
        r = requests.get(f"{server['url']}/healthz", verify=str(server["ca"]), timeout=10)
        assert r.status_code == 200, r.text
        log = server["log"].read_text(errors="replace")
        assert "panicked" not in log, log[-3000:]
