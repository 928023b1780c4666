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


def run(what, argv, env):
    """Run a step of the build in a process group of its own, until the deadline."""
    global child
    child = subprocess.Popen(argv, env=env, cwd=venv, stdin=subprocess.DEVNULL, stdout=sys.stderr, start_new_session=True)
    try:
        status = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_child()
        child.wait()
        fail(f"{what} did not finish within {limit}s ([replicas] venv_build_timeout_secs); it was killed")
    # Whatever the step left behind in its group goes too.
    kill_child()
    child = None
    if status != 0:
        fail(f"{what} failed (exit status {status})")


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
        names = ", ".join(os.path.basename(p.rstrip("/")) for p in packages)
        pip = [os.path.join(venv, "bin", "python3"), "-m", "pip", "install", "--quiet", *copies]
        run(f"installing packageUris ({names})", pip, env)
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
