"""Fixtures for the official-Python-SDK conformance suite.

The suite builds nothing: it starts the already-built `trainyard` binary
(`$TRAINYARD_BIN`, default `../target/debug/trainyard` next to this directory) on a
free loopback port with a temporary data directory, and points the official
`google-cloud-aiplatform` SDK at it exactly as a user would.
"""

import contextlib
import os
import signal
import socket
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


def _wait_healthy(port: int, proc: subprocess.Popen, log: Path, deadline_s: float = 30.0):
    url = f"http://127.0.0.1:{port}/healthz"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"trainyard exited with {proc.returncode} before becoming healthy:\n"
                + log.read_text(errors="replace")
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
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


@contextlib.contextmanager
def _running_server(tokens: str | None = None, replicas: str = ""):
    """A trainyard server on a free loopback port with a data directory of its own; with
    `tokens`, the text of its tokens file (tokens mode); `replicas`, more lines of its
    `[replicas]` table."""
    binary = _binary()
    tmp = tempfile.TemporaryDirectory(prefix="trainyard-sdk-tests-")
    root = Path(tmp.name)
    data_dir = root / "data"
    config = root / "trainyard.toml"
    # Trials run this suite's own interpreter (sys.executable, with cloudml-hypertune),
    # which may live where other users cannot go (a venv of root's pyenv): replicas run
    # as the server's user here, not as per-project users.
    config.write_text("[lifecycle]\ngrace_period_secs = 1\n[replicas]\nper_project_users = false\n" + replicas + "[containers]\nengine = \"none\"\n")
    log = root / "server.log"
    port = _free_port()
    args = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir), "--config", str(config)]
    if tokens is not None:
        tokens_file = root / "tokens.toml"
        tokens_file.write_text(tokens)
        tokens_file.chmod(0o600)
        args += ["--tokens", str(tokens_file)]
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            args,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Replicas run in the server's working directory: keeping it inside the
            # temporary root lets the teardown find every process of this server.
            cwd=str(root),
        )
    try:
        _wait_healthy(port, proc, log)
        yield {
            "port": port,
            "url": f"http://127.0.0.1:{port}",
            "data_dir": data_dir,
            "log": log,
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
    """A running trainyard server (open mode); yields a dict with port, base URL and data
    dir."""
    with _running_server() as s:
        yield s


# Tokens of the tokens-mode server: one for PROJECT, one for another project.
PROJECT_TOKEN = "sdk-7c1e94b0a2d85f36"
OTHER_PROJECT = "sdk-other"
OTHER_TOKEN = "oth-3b8f0d27e6a19c54"


@pytest.fixture(scope="module")
def tokens_server():
    """A running trainyard server in tokens mode (PROJECT_TOKEN for PROJECT, OTHER_TOKEN
    for OTHER_PROJECT)."""
    tokens = (
        f'[[tokens]]\ntoken = "{PROJECT_TOKEN}"\nprojects = ["{PROJECT}"]\nname = "sdk"\n\n'
        f'[[tokens]]\ntoken = "{OTHER_TOKEN}"\nprojects = ["{OTHER_PROJECT}"]\nname = "other"\n'
    )
    # Tokens mode wants per-project users; replicas run this suite's interpreter, which
    # they may not be able to reach (see above): one trusted user here.
    with _running_server(tokens, replicas="insecure_shared_user = true\n") as s:
        yield s


@pytest.fixture(scope="session")
def server_port(server):
    return server["port"]


@pytest.fixture(scope="session")
def sdk(server):
    """The SDK configured against the server, as a user would do it."""
    import google.oauth2.credentials
    from google.cloud import aiplatform

    aiplatform.init(
        project=PROJECT,
        location=LOCATION,
        api_endpoint=f"http://127.0.0.1:{server['port']}",
        api_transport="rest",
        credentials=google.oauth2.credentials.Credentials(token=TOKEN),
        staging_bucket="gs://bucket",
    )
    return aiplatform
