#!/usr/bin/env python3
"""Runs the commands of README.md and docs/*.md (the sections RUN names, by file and
heading: "Two commands", "A five-minute tour", the SDK snippets, "Vizier studies", the
Cloud Storage snippet) and of examples/README.md literally, as a new user types them, and
checks what the text says they print: ids, exit codes, states. Every snippet after the
tour runs against the server that ran it: none depends on a fresh server's ids.

Nothing in the text is edited. What a user's machine would hold is moved through the
environment: a fresh HOME and TRAINYARD_DATA_DIR, `target/release` on PATH (as the tour
says), and, as root, a network namespace of its own so that the README's literal
`127.0.0.1:8080` is free whatever else runs on the host.

Every command of those blocks must have an expectation below, and every expectation must
match a command of the text: a README change that breaks a command, or a command added
without a check, fails the run. Every shell block (```sh, ```console, ```bash) of README.md
and docs/*.md is either run or exempted by an HTML comment on the line right before its
fence, `<!-- not run by scripts/readme-test.py: REASON -->`; a shell block with neither
fails the run, naming its file and line.

Usage: scripts/readme-test.py [--keep] [--docs-only]   (SDK snippets use $TRAINYARD_SDK_VENV
or .venv; --docs-only: only check that every shell block is run or exempted, no server)
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI") == "true"
BASE = "http://127.0.0.1:8080"
LOCAL = f"{BASE}/v1/projects/local/locations/us-central1"

results = []  # (name, ok, detail)


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f"\n     {detail}"), flush=True)
    return ok


# ---------------------------------------------------------------------------------------
# Reading the text


# The documents whose shell blocks are either run or exempted, and the sections that are
# run, in this order, by file and heading. The first two run on a fresh server; the others
# after the tour, on the server that ran it.
DOCS = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
TWO_COMMANDS = ("README.md", "## Two commands", "Two commands")
TOUR = ("README.md", "## A five-minute tour", "tour")
RUN = [
    ("README.md", "## The Python SDK", "sdk"),
    ("docs/tuning.md", "## Hyperparameter tuning jobs", "tuning"),
    ("docs/tuning.md", "## Vizier studies", "vizier"),
    ("docs/storage.md", "# Cloud Storage endpoint", "storage"),
]
SHELL = {"sh", "console", "bash", "shell"}
EXEMPT = re.compile(r"^<!-- not run by scripts/readme-test\.py: (\S.*\S) -->$")


def numbered(path):
    """A document's lines, each with its line number: [(n, line)]."""
    return list(enumerate((REPO / path).read_text().splitlines(), 1))


def section(path, heading):
    """The numbered lines of a `## heading` section of a document (up to the next heading
    of the same level or above, outside code blocks); `# Title` is the whole document."""
    level = len(heading.split(" ")[0])
    out, inside, fence = [], False, False
    for n, line in numbered(path):
        if line.startswith("```"):
            fence = not fence
        heading_here = not fence and re.match(r"(#+) ", line)
        if not inside and heading_here and line.strip() == heading:
            inside = True
            continue
        if inside and heading_here and len(heading_here.group(1)) <= level:
            break
        if inside:
            out.append((n, line))
    if not inside:
        raise SystemExit(f"{path} has no section {heading!r}")
    return out


def blocks(lines):
    """Fenced code blocks of numbered lines: (language, [lines], the fence's line number,
    the line before the fence)."""
    out, cur, lang, start, before, prev = [], None, None, 0, "", ""
    for n, line in lines:
        if line.startswith("```"):
            if cur is None:
                lang, cur, start, before = line[3:].strip(), [], n, prev
            else:
                out.append((lang, cur, start, before))
                cur = None
            prev = line
            continue
        if cur is not None:
            cur.append(line)
        prev = line
    return out


def commands(lines):
    """Shell lines joined into whole commands (continuations, quotes spanning lines).
    A comment line alone is kept as a marker (`# in another shell`)."""
    out, acc = [], ""
    for line in lines:
        if not acc and line.strip().startswith("#"):
            out.append(line.strip())
            continue
        acc = acc + "\n" + line if acc else line
        if acc.endswith("\\"):
            continue
        try:
            shlex.split(acc, comments=True)
        except ValueError:
            continue  # an open quote: the command goes on
        if acc.strip():
            out.append(acc)
        acc = ""
    if acc:
        out.append(acc)
    return out


# ---------------------------------------------------------------------------------------
# Running


class Env:
    def __init__(self, tmp):
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir()
        self.data = tmp / "data"
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("TRAINYARD_") and k not in ("TRAINYARD_CONTAINER_ENGINE",):
                del self.env[k]
        self.env.update(
            HOME=str(self.home),
            TRAINYARD_DATA_DIR=str(self.data),
            PATH=f"{REPO / 'target' / 'release'}:{os.environ['PATH']}",
            # cargo and rustup live under the real HOME.
            CARGO_HOME=os.environ.get("CARGO_HOME", str(Path.home() / ".cargo")),
            RUSTUP_HOME=os.environ.get("RUSTUP_HOME", str(Path.home() / ".rustup")),
        )
        self.env.pop("STORAGE_EMULATOR_HOST", None)
        self.background = []

    def script(self, cmd):
        """The command in a file, as a shell reads what is typed: its text is not in any
        process's command line (`pgrep -f` finds the job, not the shell)."""
        self.n = getattr(self, "n", 0) + 1
        path = self.tmp / f"cmd-{self.n}.sh"
        path.write_text(cmd + "\n")
        return str(path)

    def run(self, cmd, timeout=300, sdk=False):
        env = self.env
        if sdk:
            venv = Path(os.environ.get("TRAINYARD_SDK_VENV", REPO / ".venv"))
            env = dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env['PATH']}")
        p = subprocess.run(
            ["bash", self.script(cmd)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return p.returncode, p.stdout, p.stderr

    def start(self, cmd, log_name):
        log = open(self.tmp / log_name, "w")
        p = subprocess.Popen(
            ["bash", self.script("exec " + cmd)], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.background.append(p)
        return p, self.tmp / log_name

    def stop_all(self):
        background, self.background = self.background, []
        for p in background:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in background:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def http(url, data=None, timeout=5):
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def get_json(url):
    return json.loads(http(url)[1])


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - any failure is "not yet"
            last = e
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


def job_state(project, id_):
    return get_json(f"{BASE}/v1/projects/{project}/locations/us-central1/customJobs/{id_}").get("state")


# ---------------------------------------------------------------------------------------
# What the text says each command does. Keys are the commands as the shell reads them
# (comments dropped, lines joined); values check (rc, stdout, stderr) and return
# a failure message or None.


def expect(rc=0, out=(), err=(), json_has=None, sdk=False, err_count=None):
    """`sdk`: the command runs in a shell where the SDK's venv is activated."""

    def f(code, stdout, stderr):
        if code != rc:
            return f"exit {code}, the text says {rc}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
        for pat in out:
            if not re.search(pat, stdout, re.M):
                return f"stdout lacks {pat!r}:\n{stdout[-3000:]}"
        for pat in err:
            if not re.search(pat, stderr, re.M):
                return f"stderr lacks {pat!r}:\n{stderr[-3000:]}"
        for text, n in (err_count or {}).items():
            if stderr.count(text) != n:
                return f"stderr has {text!r} {stderr.count(text)} times, the text says {n}:\n{stderr[-3000:]}"
        if json_has:
            try:
                doc = json.loads(stdout)
            except ValueError as e:
                return f"not JSON ({e}): {stdout[:2000]}"
            problem = json_has(doc)
            if problem:
                return problem
        return None

    f.sdk = sdk
    return f


def name_ends(suffix, state=None):
    def f(doc):
        if not str(doc.get("name", "")).endswith(suffix):
            return f"name {doc.get('name')!r} does not end with {suffix!r}"
        if state and doc.get("state") not in state:
            return f"state {doc.get('state')!r} is not one of {state}"
        return None

    return f


# The tour's own job file (`trainyard local-run examples/checkpoint/job.yaml`) and the
# examples: each exits as the text says.
SUCCEEDED = r"JOB_STATE_SUCCEEDED"
EXPECT = {
    # Two commands
    "cargo run --release -p trainyard -- serve": "serve",
    "./scripts/test": "self",
    # A five-minute tour
    "trainyard local-run examples/checkpoint/job.yaml": expect(0, out=[r"^\[workerpool0-0\] "], err=[SUCCEEDED]),
    'trainyard custom-jobs create --display-name=hello --worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11 --command=python3,-c,\'print("hello")\' --wait': expect(
        0, out=[r"customJobs/1\b"], err=[SUCCEEDED]
    ),
    "trainyard custom-jobs list": expect(0, out=[r"^1\s.*hello.*JOB_STATE_SUCCEEDED"]),
    "trainyard custom-jobs describe 1": expect(0, out=[r"^name: projects/local/locations/us-central1/customJobs/1$", r"^state: JOB_STATE_SUCCEEDED$"]),
    "trainyard custom-jobs stream-logs 1": expect(0, out=[r"workerpool0-0: hello$"]),
    "trainyard custom-jobs delete 1": expect(0),
    "trainyard custom-jobs create --display-name=sleepy --worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11 --command=python3,-c,'import time; time.sleep(600)'": expect(
        0, out=[r"customJobs/2\b"]
    ),
    "trainyard custom-jobs cancel 2": expect(0),
    "curl -s -X POST http://127.0.0.1:8080/v1/projects/local/locations/us-central1/customJobs -H 'Content-Type: application/json' -d '{ ...": expect(
        0, json_has=name_ends("/customJobs/3")
    ),
    "curl -s http://127.0.0.1:8080/v1/projects/local/locations/us-central1/customJobs/3": expect(0, json_has=name_ends("/customJobs/3")),
    "curl -s http://127.0.0.1:8080/v1/projects/local/locations/us-central1/customJobs/3/logs": expect(0),
    "trainyard hp-tuning-jobs create --display-name=tune --config=study.yaml --max-trial-count=20 --parallel-trial-count=2 --wait": expect(
        0, out=[r"hyperparameterTuningJobs/4\b"], err=[SUCCEEDED]
    ),
    "trainyard hp-tuning-jobs list": expect(0, out=[r"^4\s.*tune.*JOB_STATE_SUCCEEDED"]),
    "trainyard hp-tuning-jobs describe 4": expect(0, out=[r"^# Best trial: ", r"customJobs/(5|[6-9]|1[0-9]|2[0-4])\b"]),
    "trainyard hp-tuning-jobs stream-logs 4": expect(0, out=[r"^\[trial 1\] ", r"^\[trial 20\] "]),
    # Vizier studies
    # On the server that ran the tour: the study's id is whatever it is (not 1).
    "B=http://127.0.0.1:8080/v1": expect(0),
    "S=$(curl -s -X POST $B/projects/local/locations/us-central1/studies -H 'Content-Type: application/json' -d '{ ...": expect(
        0, out=[r"^projects/local/locations/us-central1/studies/\d+$"]
    ),
    "echo $S": expect(0, out=[r"^projects/local/locations/us-central1/studies/\d+$"]),
    'curl -s -X POST $B/$S/trials:suggest -H \'Content-Type: application/json\' -d \'{"suggestionCount": 1, "clientId": "worker-1"}\'': expect(
        0, out=[r'"done": ?true', r"studies/\d+/trials/1\b"]
    ),
    'curl -s -X POST $B/$S/trials/1:addTrialMeasurement -H \'Content-Type: application/json\' -d \'{"measurement": {"stepCount": "100", "metrics": [{"metricId": "loss", "value": 2.5}]}}\'': expect(
        0, out=[r'"stepCount": ?"100"']
    ),
    "curl -s -X POST $B/$S/trials/1:checkTrialEarlyStoppingState -H 'Content-Type: application/json' -d '{}'": expect(0, out=[r'"done": ?true']),
    "curl -s -X POST $B/$S/trials/1:complete -H 'Content-Type: application/json' -d '{}'": expect(0, out=[r'"state": ?"SUCCEEDED"']),
    "curl -s -X POST $B/$S/trials:listOptimalTrials -H 'Content-Type: application/json' -d '{}'": expect(0, out=[r"studies/\d+/trials/1\b"]),
    # examples/README.md
    'rm -rf "${TRAINYARD_DATA_DIR:-$HOME/.local/share/trainyard}/storage/local/examples/checkpoint"': expect(0),
    "kill -9 $(pgrep -f 'python3 train.py --steps 50 --every 5')": "concurrent",
    "trainyard local-run examples/multi-replica/job.yaml": expect(0, out=[r"primary: ranks \[1, 2\], sum 3"], err=[SUCCEEDED]),
    "trainyard local-run examples/failing/job.yaml": expect(
        1,
        err=[
            r"JOB_STATE_FAILED",
            r"^\[workerpool0-0\] ValueError: bad record at line 1337$",
            r"error: The replica workerpool0-0 exited with a non-zero status of 3\. .*\(its last lines of stderr are above\) \[error code 3 \(INVALID_ARGUMENT\)\]$",
        ],
        err_count={"ValueError: bad record": 1},
    ),
    "trainyard local-run examples/oom/job.yaml": expect(1, err=[r"JOB_STATE_FAILED", r"error: The replica workerpool0-0 ran out of memory.* \[error code 8 \(RESOURCE_EXHAUSTED\)\]$"]),
    "python3 examples/sdk/from_local_script.py": expect(0, out=[r"customJobs/\d+ JOB_STATE_SUCCEEDED"], sdk=True),
    "python3 examples/sdk/custom_training_job.py": expect(
        0, out=[r"trainingPipelines/\d+ PIPELINE_STATE_SUCCEEDED projects/local/locations/us-central1/customJobs/\d+"], sdk=True
    ),
}


def key_of(cmd):
    """A command as the text writes it: continuation lines joined, its trailing comment
    dropped; a command whose quoted body spans lines is its first line and `...`."""
    flat = re.sub(r"\\\n\s*", "", cmd)
    if "\n" in flat:
        return flat.split("\n")[0] + " ..."
    return re.sub(r"\s+#\s.*$", "", flat)


# ---------------------------------------------------------------------------------------


def run_shell_block(env, cmds, where, seen):
    """Runs the commands of one block in order; `# in another shell` runs what follows
    while the command before it is still running."""
    i = 0
    while i < len(cmds):
        cmd = cmds[i]
        if cmd.startswith("#"):
            i += 1
            continue
        key = key_of(cmd)
        seen.add(key)
        want = EXPECT.get(key)
        name = f"{where}: {key[:110]}"
        if want is None:
            check(name, False, "no expectation in scripts/readme-test.py for this README command: add one")
            i += 1
            continue
        if want == "self":
            check(name + " (the suite that runs this test: not run again)", True)
            i += 1
            continue
        if want == "serve":
            p, log = env.start(cmd, "serve.log")
            try:
                def up():
                    if p.poll() is not None:
                        raise SystemExit(f"the server exited with {p.returncode}")
                    return http(f"{BASE}/healthz")[0] == 200

                wait_for(up, 1800, "the server answers /healthz")
                check(name, True)
            except (AssertionError, SystemExit) as e:
                check(name, False, f"{e}\n{log.read_text(errors='replace')[-3000:]}")
                raise SystemExit(finish())
            i += 1
            continue
        nxt = cmds[i + 1] if i + 1 < len(cmds) else ""
        if nxt.startswith("# in another shell"):
            run_concurrently(env, cmd, cmds[i + 2 :], name, want, seen, where)
            return
        # A variable the block's later commands use, as in one shell: a word, or a
        # command's output (`S=$(...)`).
        assign = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(\$\(.*\)|\S+)", cmd.strip(), re.S)
        if assign:
            code, out, err = env.run(f'{cmd}; printf %s "${assign.group(1)}"')
            env.env[assign.group(1)] = out
            check(name, want(code, out, err) is None, want(code, out, err))
            i += 1
            continue
        try:
            code, out, err = env.run(cmd, sdk=getattr(want, "sdk", False))
        except subprocess.TimeoutExpired:
            check(name, False, "did not end within 300 s")
            i += 1
            continue
        check(name, want(code, out, err) is None, want(code, out, err))
        i += 1


def run_concurrently(env, cmd, others, name, want, seen, where):
    """The examples' checkpoint walk-through: a job runs, a second shell kills its replica."""
    p, log = env.start(cmd, "concurrent.log")
    try:
        wait_for(lambda: "checkpoint saved at step 5" in log.read_text(errors="replace"), 120, "the job saves its first checkpoint")
    except AssertionError as e:
        check(name, False, f"{e}\n{log.read_text(errors='replace')[-3000:]}")
        return
    for other in others:
        if other.startswith("#"):
            continue
        key = key_of(other)
        seen.add(key)
        code, out, err = env.run(other)
        check(f"{where}: {key[:110]}", code == 0, f"exit {code}: {err}")
    try:
        code = p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        code = None
    text = log.read_text(errors="replace")
    problem = None
    if code != 0:
        problem = f"exit {code}"
    else:
        for pat in (r"killed by signal 9; restarting it \(1 of 5\)", r"resumed from step [1-9][0-9]*", SUCCEEDED):
            if not re.search(pat, text):
                problem = f"output lacks {pat!r}"
                break
    check(name + " (its replica killed from another shell)", problem is None, f"{problem}\n{text[-3000:]}")


def python_block(env, code, name):
    venv = Path(os.environ.get("TRAINYARD_SDK_VENV", REPO / ".venv"))
    py = venv / "bin" / "python"
    if not py.exists():
        check(name, False, f"no SDK venv at {venv}: run sdk-tests/run.sh once, or set TRAINYARD_SDK_VENV")
        return
    script = env.tmp / "snippet.py"
    script.write_text(code)
    p = subprocess.run([str(py), str(script)], cwd=REPO, env=env.env, capture_output=True, text=True, timeout=600)
    check(name, p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")


def run_section(env, doc, heading, where, seen, ran, created):
    """Runs one section's blocks in order: a ```yaml block whose first line names a file
    (`# study.yaml`) is written for the commands after it, ```python blocks run in the
    SDK's venv, ```sh blocks run command by command; a block exempted by the comment before
    its fence is not run."""
    for lang, lines, line, before in blocks(section(doc, heading)):
        if EXEMPT.match(before.strip()):
            continue
        if lang == "yaml":
            first = lines[0] if lines else ""
            target = re.match(r"#\s*(\S+\.yaml)\s*$", first)
            if target:  # a file the text asks to write (study.yaml)
                path = REPO / target.group(1)
                if path.exists():
                    check(f"{where}: {target.group(1)} would not overwrite a file of the repository", False, str(path))
                    continue
                path.write_text("\n".join(lines) + "\n")
                created.append(path)
            continue
        if lang == "python":
            python_block(env, "\n".join(lines) + "\n", f"{where}: the SDK snippet ({doc}:{line})")
            ran.add((doc, line))
            continue
        if lang == "sh":
            run_shell_block(env, commands(lines), where, seen)
            ran.add((doc, line))


def cargo_run_targets(env):
    """Every `cargo run ... -p PKG` of README.md and docs/*.md names a binary cargo can
    choose: with `--bin`, one that exists; without, the package's only binary or its
    `default-run` (the README's first command once failed for want of one)."""
    code, out, err = env.run("cargo metadata --no-deps --format-version 1 --offline", timeout=120)
    if not check("cargo metadata", code == 0, err[-2000:]):
        return
    packages = {p["name"]: p for p in json.loads(out)["packages"]}
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for m in sorted(set(re.findall(r"cargo run[^`\n]*", text))):
            words = m.split()
            pkg = words[words.index("-p") + 1] if "-p" in words else "trainyard"
            bins = [t["name"] for t in packages.get(pkg, {}).get("targets", []) if "bin" in t["kind"]]
            if "--bin" in words:
                ok, why = words[words.index("--bin") + 1] in bins, f"no binary named so in {pkg}: {bins}"
            else:
                ok = len(bins) == 1 or bool(packages.get(pkg, {}).get("default_run"))
                why = f"package {pkg} has binaries {bins} and no default-run: cargo cannot choose"
            check(f"{doc}: `{m.strip()}` names a binary", ok, why)


def planned_runs():
    """The blocks that run_section runs: (file, fence line) of every ```sh and ```python
    block, not exempted, of the sections run."""
    out = set()
    for doc, heading, _ in [TWO_COMMANDS, TOUR] + RUN:
        for lang, _, line, before in blocks(section(doc, heading)):
            if lang in ("sh", "python") and not EXEMPT.match(before.strip()):
                out.add((doc, line))
    return out


def shell_blocks_run_or_exempted(ran):
    """Every shell block of README.md and docs/*.md is run (`ran`: (file, fence line)) or
    exempted, with a reason, by the comment on the line right before its fence; a run
    block carries no such comment."""
    run = exempt = 0
    for doc in DOCS:
        for lang, _, line, before in blocks(numbered(doc)):
            if lang not in SHELL:
                continue
            exempted = EXEMPT.match(before.strip())
            if (doc, line) in ran:
                run += 1
                if exempted:
                    check(f"{doc}:{line}: a ```{lang} block run and exempted", False, "it is run: drop the comment before its fence")
            elif exempted:
                exempt += 1
            else:
                check(
                    f"{doc}:{line}: a ```{lang} block neither run nor exempted",
                    False,
                    f"{doc} line {line}: run it (a section of RUN in scripts/readme-test.py, with expectations) or put "
                    "<!-- not run by scripts/readme-test.py: REASON --> on the line right before its fence",
                )
    check(f"shell blocks of README.md and docs/*.md: {run} run, {exempt} exempted with a reason", True)
    return run, exempt


def finish():
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    for n, ok, d in results:
        if not ok:
            print(f"FAILED: {n}\n{d}\n", file=sys.stderr)
    print(f"readme: {passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    if "--docs-only" in sys.argv:
        shell_blocks_run_or_exempted(planned_runs())
        return finish()
    if os.geteuid() == 0 and os.environ.get("TRAINYARD_README_NETNS") != "1":
        # A network namespace of its own: the README's 127.0.0.1:8080 is free.
        env = dict(os.environ, TRAINYARD_README_NETNS="1")
        cmd = f"ip link set lo up && exec {shlex.quote(sys.executable)} {shlex.quote(__file__)} " + " ".join(map(shlex.quote, sys.argv[1:]))
        return subprocess.call(["unshare", "--net", "bash", "-c", cmd], env=env)
    try:
        http(f"{BASE}/healthz", timeout=1)
        msg = "something already answers on 127.0.0.1:8080; stop it, or run this as root (a network namespace of its own)"
        print(("ERROR: " if CI else "SKIP readme: ") + msg, file=sys.stderr)
        return 1 if CI else 0
    except OSError:
        pass

    # Every shell block is run or exempted: known before anything runs.
    planned = planned_runs()
    shell_blocks_run_or_exempted(planned)

    tmp = Path(tempfile.mkdtemp(prefix="trainyard-readme-"))
    # Replicas run as per-project users on a root server: they must pass through it.
    tmp.chmod(0o755)
    (tmp / "snippet-cwd").mkdir()
    env = Env(tmp)
    seen = set()
    ran = set()  # (file, fence line) of every block run
    created = []
    try:
        # "Build once: `cargo build --release -p trainyard`, then put target/release on your PATH."
        tour = section(*TOUR[:2])
        m = re.search(r"Build once: `([^`]+)`, then put `target/release` on your `PATH`", "\n".join(l for _, l in tour))
        if not check("tour: the build command is given", m, "the tour no longer says how to build"):
            return finish()
        run_section(env, *TWO_COMMANDS, seen, ran, created)
        code, out, err = env.run(m.group(1), timeout=1800)
        check(f"tour: {m.group(1)}", code == 0, err[-3000:])
        run_section(env, *TOUR, seen, ran, created)
        # What the text says happens after the commands.
        try:
            wait_for(lambda: job_state("local", 2) == "JOB_STATE_CANCELLED", 120, "job 2 CANCELLED after `cancel 2`")
            check("tour: job 2 ends CANCELLED", True)
        except AssertionError as e:
            check("tour: job 2 ends CANCELLED", False, str(e))
        try:
            wait_for(lambda: "42" in http(f"{LOCAL}/customJobs/3/logs")[1], 120, "job 3's log has 42")
            check("tour: job 3 prints 42", True)
        except AssertionError as e:
            check("tour: job 3 prints 42", False, str(e))
        try:
            code, _ = http(f"{LOCAL}/customJobs/1")
            check("tour: job 1 is gone after delete", False, f"GET answered {code}")
        except urllib.error.HTTPError as e:
            check("tour: job 1 is gone after delete", e.code == 404, f"GET answered {e.code}")

        # The other sections on the server that ran the tour: no snippet depends on a
        # fresh server's ids.
        for doc, heading, where in RUN:
            run_section(env, doc, heading, where, seen, ran, created)

        for lang, lines, _, _ in blocks(numbered("examples/README.md")):
            if lang == "sh":
                run_shell_block(env, commands(lines), "examples", seen)
        cargo_run_targets(env)
        for doc, line in sorted(planned - ran):
            check(f"{doc}:{line}: the block was run", False, "a block of a section in RUN did not run")
        for k in EXPECT:
            if k not in seen:
                check(f"expectation used: {k[:100]}", False, "no README command matches this expectation any more")
    finally:
        env.stop_all()
        for p in created:
            p.unlink(missing_ok=True)
        if "--keep" not in sys.argv:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
