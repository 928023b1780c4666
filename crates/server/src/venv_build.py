# The first step of a replica of a `pythonPackageSpec` job run as a host process (see
# venv.rs): make the job's venv (once per job; replicas of the job take turns), install
# the job's packages into it, then become the job's program. It runs as the replica,
# which it is: in its cgroup (memory and task limits), mount and network namespaces, as
# its user, and it is stopped with it.
#
# argv: VENV LIMIT_SECS INDEX PROXY N PACKAGE... MODE PROGRAM...
#   INDEX: `[replicas] package_index`: "" (pip's own configuration), "none" (no index:
#   only the packages given and what the host's Python has), or the index's URL.
#   PROXY: "" or, in a job's network namespace, the server's socket that reaches the index
#   (index_proxy.rs): pip gets it as an HTTP proxy on a loopback port forwarded to it.
#   MODE "module": PROGRAM is MODULE ARG..., run as `VENV/bin/python3 -m MODULE ARG...`.
#   MODE "path": PROGRAM is a command, run with VENV/bin first on PATH.
# A build that fails or passes LIMIT_SECS (`[replicas] venv_build_timeout_secs`) is killed
# with everything it started, and the replica exits 1 with a last line that says why.
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time

venv, limit, index, proxy, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
packages = sys.argv[6 : 6 + count]
mode, program = sys.argv[6 + count], sys.argv[7 + count :]
ready = os.path.join(venv, ".trainyard-ready")
deadline = time.monotonic() + limit
child = None


def fail(message):
    print(f"trainyard: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def kill_child():
    if child is not None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass


def stopped(signum, _frame):
    # The replica is being stopped: the build goes with it.
    kill_child()
    os._exit(128 + signum)


for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, stopped)


def run(what, argv, env, out=sys.stderr, check=True):
    """Run a step of the build in a process group of its own, until the deadline; with
    `check`, a step that fails fails the build, else its status is returned."""
    global child
    child = subprocess.Popen(argv, env=env, cwd=venv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:
        status = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_child()
        child.wait()
        fail(f"{what} did not finish within {limit}s ([replicas] venv_build_timeout_secs); it was killed")
    # Whatever the step left behind in its group goes too.
    kill_child()
    child = None
    if status != 0 and check:
        fail(f"{what} failed (exit status {status})")
    return status


def forward_to(path):
    """A loopback port of the job's network whose connections go to the socket `path`."""
    import socket
    import threading

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept():
        while True:
            conn, _ = listener.accept()
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(path)
            except OSError:
                conn.close()
                up.close()
                continue
            threading.Thread(target=pump, args=(conn, up), daemon=True).start()
            threading.Thread(target=pump, args=(up, conn), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def index_url(env):
    """The index pip would ask: `[replicas] package_index`, else pip's own setting."""
    if index:
        return index
    if env.get("PIP_INDEX_URL"):
        return env["PIP_INDEX_URL"]
    # As a step of the build: bounded by its deadline and stopped with the replica.
    path = os.path.join(venv, ".trainyard-pip-config")
    with open(path, "w") as out:
        status = run("asking pip for its index", [os.path.join(venv, "bin", "python3"), "-m", "pip", "config", "get", "global.index-url"],
                     env, out=out, check=False)
    with open(path, errors="replace") as out:
        said = out.read().strip()
    os.unlink(path)
    if status == 0 and said and "\n" not in said:
        return said
    return "https://pypi.org/simple"


def unreachable(url):
    """Why the index at `url` cannot be reached from here (None if a connection opens)."""
    import socket
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        return None
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError as e:
        return f"{u.netloc}: {e}"
    # The name's lookup is bounded too (getaddrinfo has no timeout of its own): it runs
    # on a thread that is left behind if it does not answer within 5 s.
    import threading

    found = {}

    def lookup():
        try:
            found["addrs"] = socket.getaddrinfo(u.hostname, port, type=socket.SOCK_STREAM)
        except OSError as e:
            found["error"] = e

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():
        return f"{u.hostname}: its name's lookup did not answer within 5 s"
    if "error" in found:
        e = found["error"]
        return f"{u.hostname}:{port}: {e.strerror or e}"
    last = None
    for family, kind, proto, _, addr in found["addrs"]:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(5)
                s.connect(addr)
            return None
        except OSError as e:
            last = e
    return f"{u.hostname}:{port}: {(last and last.strerror) or last or 'no address'}"


def install(copies, env):
    """The job's packages into the venv: first from what is here alone (no index, and
    the host's setuptools and wheel, not copies fetched for an isolated build), which
    needs no network; then, if that is not enough, with the index. An index that cannot
    be reached is said once, with what the offline try lacked, instead of pip's retries."""
    names = ", ".join(os.path.basename(p.rstrip("/")) for p in packages)
    what = f"installing packageUris ({names})"
    pip = [os.path.join(venv, "bin", "python3"), "-m", "pip", "install", "--quiet"]
    log_path = os.path.join(venv, ".trainyard-offline.log")
    with open(log_path, "w") as log:
        status = run(f"{what} without an index", [*pip, "--no-index", "--no-build-isolation", *copies], env, out=log, check=False)
    with open(log_path, errors="replace") as log:
        offline = [line.strip() for line in log if line.strip()]
    os.unlink(log_path)
    if status == 0:
        return
    # The first error line that says something (pip's own codes, such as
    # "error: subprocess-exited-with-error", say only that something failed, and
    # "ERROR: Exception:" heads a traceback, whose last line says what).
    lacked = next((l for l in offline if l.lower().startswith("error:") and not re.fullmatch(r"(?i)error: ([a-z-]+|exception:)", l)), offline[-1] if offline else f"exit status {status}")
    if index == "none":
        for line in offline:
            print(line, file=sys.stderr)
        fail(f"{what} failed without an index ([replicas] package_index = \"none\"): {lacked}")
    url = index_url(env)
    why = None if proxy else unreachable(url)
    if why is not None:
        fail(
            f"{what}: the package index {url} cannot be reached from the replica ({why}), and the packages do "
            f"not install from what the host has ({lacked}); set [replicas] package_index to an index the "
            "replicas reach, or give the host's Python what the packages need (setuptools and wheel to build them)"
        )
    run(what, pip + copies, env)


def is_ready():
    try:
        return os.lstat(ready).st_mode & 0o170000 == 0o100000
    except FileNotFoundError:
        return False


def build():
    # A step's environment: the replica's, with the venv as home and pip not asking.
    env = dict(os.environ)
    env.update(HOME=venv, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    if index == "none":
        env["PIP_NO_INDEX"] = "1"
    elif index:
        env["PIP_INDEX_URL"] = index
    if proxy and index and index != "none":
        for k in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        env["PIP_PROXY"] = f"http://127.0.0.1:{forward_to(proxy)}"
    lock = os.open(os.path.join(venv, ".trainyard-lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    # Another replica of the job may be building: wait for it, until the deadline.
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                fail(f"another replica's build of the job's Python environment did not finish within {limit}s")
            time.sleep(0.2)
    if is_ready():
        return
    for name in os.listdir(venv):
        if name != ".trainyard-lock":
            path = os.path.join(venv, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    run("creating the job's Python environment", [sys.executable, "-m", "venv", "--system-site-packages", venv], env)
    # pip builds from copies of the venv's own (a build writes into the package's
    # directory, which the replica may only read).
    copies = []
    for i, p in enumerate(packages):
        into = os.path.join(venv, "src", str(i))
        os.makedirs(into)
        copy = os.path.join(into, os.path.basename(p.rstrip("/")) or "package")
        if os.path.isdir(p):
            shutil.copytree(p, copy, symlinks=True)
        else:
            shutil.copyfile(p, copy, follow_symlinks=False)
        copies.append(copy)
    if copies:
        install(copies, env)
    # A new file in place of whatever is there (never opened through a link or a FIFO).
    try:
        os.unlink(ready)
    except FileNotFoundError:
        pass
    os.close(os.open(ready, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    os.close(lock)


if not is_ready():
    try:
        build()
    except OSError as e:
        fail(f"building the job's Python environment: {e}")
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
python = os.path.join(venv, "bin", "python3")
if mode == "module":
    os.execv(python, [python, "-m", *program])
os.environ["PATH"] = os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "")
os.environ["VIRTUAL_ENV"] = venv
os.execvp(program[0], program)
