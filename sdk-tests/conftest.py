"""Fixtures for the official-Python-SDK conformance suite.

The suite builds nothing: it starts the already-built `trainyard` binary
(`$TRAINYARD_BIN`, default `../target/debug/trainyard` next to this directory) on a
free loopback port with a temporary data directory, and points the official
`google-cloud-aiplatform` SDK at it exactly as a user would.

`TRAINYARD_SDK_TRANSPORT` picks how: `rest` (the default) serves plain HTTP and the SDK
uses its REST transport (`api_transport="rest"`, an `http://` endpoint); `grpc` serves
HTTPS and gRPC (`serve --tls-auto`) and the SDK uses its default transport, gRPC over TLS,
given nothing but `api_endpoint="127.0.0.1:PORT"`, as code written for the managed service.
"""

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROJECT = "sdk-tests"
LOCATION = "us-central1"
TOKEN = "sdk-test-token"

TRANSPORTS = ("rest", "grpc")
TRANSPORT = os.environ.get("TRAINYARD_SDK_TRANSPORT", "rest")

# What clients in this process trust over TLS: requests (REQUESTS_CA_BUNDLE, so
# google-cloud-storage too), Python's ssl (SSL_CERT_FILE, urllib) and gRPC
# (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).
TRUST_VARS = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")


def pytest_configure(config):
    if TRANSPORT not in TRANSPORTS:
        raise pytest.UsageError(f"TRAINYARD_SDK_TRANSPORT={TRANSPORT!r}: use one of {', '.join(TRANSPORTS)}")


def _binary() -> Path:
    env = os.environ.get("TRAINYARD_BIN")
    path = Path(env) if env else HERE.parent / "target" / "debug" / "trainyard"
    path = path if path.is_absolute() else (HERE / path)
    if not path.exists():
        pytest.exit(
            f"trainyard binary not found at {path}: run `cargo build -p trainyard` "
            "first or set TRAINYARD_BIN",
            returncode=2,
        )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, proc: subprocess.Popen, log: Path, ca: Path | None = None, deadline_s: float = 30.0):
    """Poll /healthz until it answers 200; with `ca`, over https trusting that CA file
    (which the server writes at its start)."""
    url = f"{'https' if ca else 'http'}://127.0.0.1:{port}/healthz"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"trainyard exited with {proc.returncode} before becoming healthy:\n"
                + log.read_text(errors="replace")
            )
        try:
            context = ssl.create_default_context(cafile=str(ca)) if ca else None
            with urllib.request.urlopen(url, timeout=1, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            # Not listening yet, or (with TLS) no CA file yet: ssl.SSLError and
            # FileNotFoundError are OSErrors too.
            pass
        time.sleep(0.1)
    raise RuntimeError(
        f"trainyard not healthy on {url} after {deadline_s}s:\n" + log.read_text(errors="replace")
    )


def _pids_touching(root: str):
    """Processes whose command line, working directory or environment lie under root."""
    me = os.getpid()
    needle = (root.rstrip("/") + "/").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(pid)
                    continue
            cwd = os.readlink(f"/proc/{pid}/cwd").encode() + b"/"
            if cwd.startswith(needle):
                found.append(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _kill_leftovers(root: str):
    own_pgid = os.getpgid(0)
    for pid in _pids_touching(root):
        try:
            pgid = os.getpgid(pid)
            if pgid != own_pgid:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# Every TLS server of the session (`serve --tls-auto`) signs its certificate with one CA,
# the one the first of them made: each server has a data directory of its own, and a
# server finds the CA it is given in <data_dir>/tls/ (ca.pem and ca.key, kept across
# restarts) instead of making one. A single CA file is then right for all of them at
# once: the session server, the tokens-mode servers of some modules, and the TLS server of
# test_grpc.py. That matters because gRPC reads GRPC_DEFAULT_SSL_ROOTS_FILE_PATH once per
# process, the first time it needs its default roots: a CA bundle that grew with each new
# server would not be seen by gRPC. The copy lives outside every server's directory, so it outlives them all.
_shared_ca: tempfile.TemporaryDirectory | None = None


def _shared_ca_dir() -> Path:
    global _shared_ca
    if _shared_ca is None:
        _shared_ca = tempfile.TemporaryDirectory(prefix="trainyard-sdk-ca-")
    return Path(_shared_ca.name)


def _give_shared_ca(data_dir: Path):
    """Put the session's CA (when one was made already) where a new server looks for it."""
    shared = _shared_ca_dir()
    if not (shared / "ca.key").exists():
        return
    tls = data_dir / "tls"
    data_dir.mkdir(mode=0o700)
    tls.mkdir(mode=0o755)
    shutil.copyfile(shared / "ca.pem", tls / "ca.pem")
    (tls / "ca.pem").chmod(0o644)
    shutil.copyfile(shared / "ca.key", tls / "ca.key")
    (tls / "ca.key").chmod(0o600)


def _keep_shared_ca(data_dir: Path) -> Path:
    """The session's CA file: the first TLS server's CA becomes it; every later server
    must be using it."""
    shared = _shared_ca_dir()
    tls = data_dir / "tls"
    if not (shared / "ca.key").exists():
        shutil.copyfile(tls / "ca.key", shared / "ca.key")
        (shared / "ca.key").chmod(0o600)
        shutil.copyfile(tls / "ca.pem", shared / "ca.pem")
    assert (tls / "ca.pem").read_bytes() == (shared / "ca.pem").read_bytes(), (
        f"the server made a CA of its own in {tls} instead of using the one it was given"
    )
    return shared / "ca.pem"


@contextlib.contextmanager
def _trusting(ca: Path):
    """This process's clients trust `ca` (TRUST_VARS) until the end of the block."""
    saved = {var: os.environ.get(var) for var in TRUST_VARS}
    os.environ.update({var: str(ca) for var in TRUST_VARS})
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def _running_server(tokens: str | None = None, replicas: str = "", tls: bool | None = None):
    """A trainyard server on a free loopback port with a data directory of its own; with
    `tokens`, the text of its tokens file (tokens mode); `replicas`, more lines of its
    `[replicas]` table; `tls` (default: TRAINYARD_SDK_TRANSPORT=grpc), HTTPS and gRPC with
    the session's CA (`serve --tls-auto`), which this process trusts while it runs.

    Yields port, url (http:// or https://), endpoint (host:port, the SDK's gRPC
    api_endpoint), transport ("rest" or "grpc": what the server is for), data_dir, log and
    ca (the CA file to trust, or None)."""
    tls = TRANSPORT == "grpc" if tls is None else tls
    binary = _binary()
    tmp = tempfile.TemporaryDirectory(prefix="trainyard-sdk-tests-")
    root = Path(tmp.name)
    data_dir = root / "data"
    config = root / "trainyard.toml"
    # Trials run this suite's own interpreter (sys.executable, with cloudml-hypertune),
    # which may live where other users cannot go (a venv of root's pyenv): replicas run
    # as the server's user here, not as per-project users.
    log = root / "server.log"
    port = _free_port()
    # Each TLS server's jobs reach it by the service's host names at port 443 of a
    # loopback address of its own ([tls] jobs_address; the default, 127.255.0.1, can be
    # one server's only): 127.255.x.y from its port.
    jobs_address = f'[tls]\njobs_address = "127.255.{port >> 8}.{port & 255}"\n' if tls else ""
    config.write_text(
        "[lifecycle]\ngrace_period_secs = 1\n[replicas]\nper_project_users = false\n" + replicas
        + "[containers]\nengine = \"none\"\n" + jobs_address
    )
    args = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir), "--config", str(config)]
    if tokens is not None:
        tokens_file = root / "tokens.toml"
        tokens_file.write_text(tokens)
        tokens_file.chmod(0o600)
        args += ["--tokens", str(tokens_file)]
    if tls:
        _give_shared_ca(data_dir)
        args.append("--tls-auto")
    # The server starts as a user's would: without this process's trust settings (they
    # name the private CA alone; the server gives its jobs trust settings of its own).
    env = {k: v for k, v in os.environ.items() if k not in TRUST_VARS}
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            args,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Replicas run in the server's working directory: keeping it inside the
            # temporary root lets the teardown find every process of this server.
            cwd=str(root),
        )
    try:
        _wait_healthy(port, proc, log, ca=data_dir / "tls" / "ca.pem" if tls else None)
        ca = _keep_shared_ca(data_dir) if tls else None
        with _trusting(ca) if ca else contextlib.nullcontext():
            yield {
                "port": port,
                "url": f"{'https' if tls else 'http'}://127.0.0.1:{port}",
                "endpoint": f"127.0.0.1:{port}",
                "transport": "grpc" if tls else "rest",
                "data_dir": data_dir,
                "log": log,
                "ca": ca,
            }
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Shims and replicas may outlive the server (it re-adopts them on restart):
        # kill whatever still runs in, or names, this server's directory.
        _kill_leftovers(str(root))
        if os.environ.get("TRAINYARD_KEEP_LOG"):
            print(log.read_text(errors="replace"))
        tmp.cleanup()


@pytest.fixture(scope="session")
def server():
    """A running trainyard server (open mode) for TRAINYARD_SDK_TRANSPORT: plain HTTP for
    rest, HTTPS and gRPC for grpc; yields the dict of `_running_server`."""
    with _running_server() as s:
        yield s


# Tokens of the tokens-mode server: one for PROJECT, one for another project.
PROJECT_TOKEN = "sdk-7c1e94b0a2d85f36"
OTHER_PROJECT = "sdk-other"
OTHER_TOKEN = "oth-3b8f0d27e6a19c54"


def _running_tokens_server(tls: bool | None = None):
    """A trainyard server in tokens mode (PROJECT_TOKEN for PROJECT, OTHER_TOKEN for
    OTHER_PROJECT); `tls` as for `_running_server`."""
    tokens = (
        f'[[tokens]]\ntoken = "{PROJECT_TOKEN}"\nprojects = ["{PROJECT}"]\nname = "sdk"\n\n'
        f'[[tokens]]\ntoken = "{OTHER_TOKEN}"\nprojects = ["{OTHER_PROJECT}"]\nname = "other"\n'
    )
    # Tokens mode wants per-project users; replicas run this suite's interpreter, which
    # they may not be able to reach (see above): one trusted user here.
    return _running_server(tokens, replicas="insecure_shared_user = true\n", tls=tls)


@pytest.fixture(scope="module")
def tokens_server():
    """A running trainyard server in tokens mode, for TRAINYARD_SDK_TRANSPORT (see
    `_running_tokens_server`)."""
    with _running_tokens_server() as s:
        yield s


@pytest.fixture(scope="session")
def server_port(server):
    return server["port"]


@pytest.fixture(scope="session")
def sdk(server):
    """The SDK configured against the server, as a user would do it: over REST, an
    http:// endpoint and api_transport="rest"; over gRPC, the SDK's default transport and
    nothing but the endpoint (the CA is trusted through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)."""
    import google.oauth2.credentials
    from google.cloud import aiplatform

    user = {
        "project": PROJECT,
        "location": LOCATION,
        "credentials": google.oauth2.credentials.Credentials(token=TOKEN),
        "staging_bucket": "gs://bucket",
    }
    if server["transport"] == "rest":
        aiplatform.init(api_endpoint=server["url"], api_transport="rest", **user)
    else:
        aiplatform.init(api_endpoint=server["endpoint"], **user)
    return aiplatform
