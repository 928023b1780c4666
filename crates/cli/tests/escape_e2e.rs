//! The tenant-escape suite, below the API: jobs of project A, run by a real server with
//! tokens, try to reach what is not theirs (the tokens file and the config, the database,
//! project B's run directory, logs, spec and storage namespace, the server's process and
//! working directory), plant a program where B's job would run it, and fork beyond their
//! task limit. Every attempt must fail, the job says what it could and could not do in its
//! output, and the server keeps answering B. The same jobs' own directories (HOME, the
//! project's namespace) stay writable, so that a job that cannot do anything does not
//! pass for a safe one.
//!
//! Per-project users need a root server: as another user these tests only check that
//! tokens with replicas as the server's user are refused at start.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const TOKEN_A: &str = "tka-5d8e2f1c9b7a3604";
const TOKEN_B: &str = "tkb-0f3a6c9e2d5b8147";

/// A server with tokens for projA and projB, replicas as per-project users with
/// `pids_max` tasks, in a directory others can pass but not list or write (the server's
/// working directory).
fn tenant_server(pids_max: u32) -> (Server, PathBuf) {
    let mut s = Server::prepare("");
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let tokens = s.dir.path().join("tokens.toml");
    let text = format!(
        "[[tokens]]\nname = \"a\"\ntoken = \"{TOKEN_A}\"\nprojects = [\"projA\"]\n\n\
         [[tokens]]\nname = \"b\"\ntoken = \"{TOKEN_B}\"\nprojects = [\"projB\"]\n"
    );
    std::fs::write(&tokens, text).expect("tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod tokens");
    let extra = format!("tokens_file = \"{}\"\n[replicas]\npids_max = {pids_max}\n", tokens.display());
    std::fs::write(&s.config, config_text(&extra)).expect("config");
    s.spawn();
    (s, tokens)
}

struct Client {
    port: u16,
    token: &'static str,
    agent: ureq::Agent,
}

impl Client {
    fn new(s: &Server, token: &'static str) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Client { port: s.port, token, agent }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Content-Type", "application/json");
        let sent = match body {
            Some(b) => self.agent.run(req.body(b.to_string().into_bytes()).expect("request")),
            None => self.agent.run(req.body(()).expect("request")),
        };
        let mut resp = sent.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn create(&self, project: &str, job: &Value) -> Value {
        let (status, body) = self.call("POST", &format!("/v1/projects/{project}/locations/us-central1/customJobs"), Some(job));
        assert_eq!(status, 200, "create in {project}: {body}");
        body
    }

    fn get(&self, name: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/v1/{name}"), None);
        assert_eq!(status, 200, "get {name}: {body}");
        body
    }

    fn wait(&self, name: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let j = self.get(name);
            if pred(&j) {
                return j;
            }
            assert!(Instant::now() < deadline, "timed out waiting on {name}: {j:#}\n{}", self.logs(name));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_terminal(&self, name: &str, secs: u64) -> Value {
        self.wait(name, secs, |j| matches!(j["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED")))
    }

    fn logs(&self, name: &str) -> String {
        let url = format!("http://127.0.0.1:{}/v1/{name}/logs", self.port);
        let req = ureq::http::Request::builder().method("GET").uri(&url).header("Authorization", format!("Bearer {}", self.token));
        let Ok(mut resp) = self.agent.run(req.body(()).expect("request")) else { return String::new() };
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|e| e["text"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn job(name: &str, argv: &[&str], env: &[(&str, String)], output: Option<&str>) -> Value {
    let env: Vec<Value> = env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
    let mut spec = json!({"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"},
        "replicaCount": "1",
        "containerSpec": {"imageUri": "python:3.11", "command": argv, "env": env}
    }]});
    if let Some(o) = output {
        spec["baseOutputDirectory"] = json!({"outputUriPrefix": o});
    }
    json!({"displayName": name, "jobSpec": spec})
}

fn uid_of(text: &str) -> u32 {
    text.lines().find_map(|l| l.strip_prefix("uid ")).and_then(|u| u.trim().parse().ok()).unwrap_or_else(|| panic!("no uid line in:\n{text}"))
}

/// What A's job tries. Each line says `DENIED <what>` or `ESCAPE <what>`; `OWN <what>`
/// lines are the job's own directories, which must work.
const ATTACK: &str = r#"
try() { if sh -c "$2" >/dev/null 2>&1; then echo "$3 $1"; else echo "DENIED $1"; fi; }
echo "uid $(id -u)"
SERVER_PID=""
for p in /proc/[0-9]*; do
  args=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
  case "$args" in *trainyard" serve --listen "*) SERVER_PID=${p#/proc/} ;; esac
done
CONFIG=$(tr '\0' '\n' < "/proc/$SERVER_PID/cmdline" | grep -A1 -e '--config' | tail -n 1)
echo "server pid $SERVER_PID config $CONFIG"
[ -n "$SERVER_PID" ] && [ -n "$CONFIG" ] && echo "FOUND server"
TOKENS=$(grep tokens_file "$CONFIG" 2>/dev/null | cut -d '"' -f 2)
[ -z "$TOKENS" ] && TOKENS="$KNOWN_TOKENS"
B="$DATA/runs/$BJOB/0/workerpool0-0/0"
try config "cat '$CONFIG'" READ
try tokens "cat '$TOKENS'" ESCAPE
try server_environ "cat /proc/$SERVER_PID/environ" ESCAPE
try server_cwd "ls /proc/$SERVER_PID/cwd/" ESCAPE
try server_fds "ls /proc/$SERVER_PID/fd/" ESCAPE
try database "cat '$DATA/trainyard.db'" ESCAPE
try list_data "ls '$DATA'" ESCAPE
try list_runs "ls '$DATA/runs'" ESCAPE
try b_log "cat '$B/log.jsonl'" ESCAPE
try b_spec "cat '$B/spec.json'" ESCAPE
try b_work "ls '$B/work'" ESCAPE
try b_home "ls '$B/home'" ESCAPE
try b_storage_list "ls '$STORAGE/projB'" ESCAPE
try b_storage_read "cat '$STORAGE/projB/bkt/out/model/secret.txt'" ESCAPE
try b_storage_write "echo x > '$STORAGE/projB/bkt/out/model/planted.txt'" ESCAPE
try plant_server_dir "echo 'print(\"PLANTED\")' > '$SERVERDIR/train.py'" ESCAPE
try plant_b_work "echo 'print(\"PLANTED\")' > '$B/work/train.py'" ESCAPE
BPID=""
for p in /proc/[0-9]*; do
  args=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
  case "$args" in "sh -c echo uid"*B-LOG-SECRET*) BPID=${p#/proc/} ;; esac
done
[ -n "$BPID" ] && echo "FOUND b"
try signal_b "kill -0 $BPID" ESCAPE
try chown_data "chmod 777 '$DATA'" ESCAPE
try own_home "echo mine > \"$HOME/mine.txt\"" OWN
try own_work "echo mine > mine.txt" OWN
try own_storage "echo mine > \"$AIP_MODEL_DIR/mine.txt\"" OWN
echo END
"#;

/// A's job reads nothing of the server's or B's and plants nothing where B runs; B's job
/// and the server go on.
#[test]
fn a_tenant_cannot_reach_the_server_or_another_tenant() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    let (s, tokens) = tenant_server(4096);
    let (a, b) = (Client::new(&s, TOKEN_A), Client::new(&s, TOKEN_B));
    // B: writes a secret into its namespace and its log, then waits.
    let b_script = "echo uid $(id -u); echo B-LOG-SECRET; echo bsecret > \"$AIP_MODEL_DIR/secret.txt\"; echo written; sleep 60";
    let b1 = b.create("projB", &job("b-secret", &["sh", "-c", b_script], &[], Some("gs://bkt/out")));
    let b1n = name_of(&b1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !b.logs(&b1n).contains("written") {
        assert!(Instant::now() < deadline, "B never wrote its secret: {}\n{}", b.logs(&b1n), s.server_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let data = s.data_dir();
    let env = [
        ("DATA", data.display().to_string()),
        ("STORAGE", data.join("storage").display().to_string()),
        ("SERVERDIR", s.dir.path().display().to_string()),
        ("KNOWN_TOKENS", tokens.display().to_string()),
        ("BJOB", id_of(&b1).to_string()),
    ];
    let a1 = a.create("projA", &job("attack", &["sh", "-c", ATTACK], &env, Some("gs://bkt/out")));
    let a1n = name_of(&a1);
    let done = a.wait_terminal(&a1n, 60);
    let out = a.logs(&a1n);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    assert!(out.contains("END"), "the attack did not run to its end:\n{out}");
    // /proc is mounted with hidepid=2 in the replica's namespace: neither the server's
    // process nor B's can even be seen.
    assert!(!out.contains("FOUND server") && !out.contains("FOUND b"), "another user's process is visible in /proc:\n{out}");
    assert!(!out.contains("ESCAPE"), "a tenant reached what is not its own:\n{out}");
    for what in [
        "tokens", "server_environ", "server_cwd", "server_fds", "database", "list_data", "list_runs", "b_log",
        "b_spec", "b_work", "b_home", "b_storage_list", "b_storage_read", "b_storage_write", "plant_server_dir",
        "plant_b_work", "signal_b", "chown_data",
    ] {
        assert!(out.lines().any(|l| l == format!("DENIED {what}")), "no DENIED {what}:\n{out}");
    }
    for what in ["own_home", "own_work", "own_storage"] {
        assert!(out.lines().any(|l| l == format!("OWN {what}")), "the job could not use its own {what}:\n{out}");
    }
    // Two projects, two users, neither root.
    let (ua, ub) = (uid_of(&out), uid_of(&b.logs(&b1n)));
    assert!(ua != 0 && ub != 0 && ua != ub, "uids: A {ua}, B {ub}");
    // Nothing was planted, and B's next job in the server's shared places runs nothing of A's.
    assert!(!s.dir.path().join("train.py").exists());
    let b2 = b.create("projB", &job("b-train", &["python3", "train.py"], &[], None));
    let b2done = b.wait_terminal(&name_of(&b2), 60);
    let b2out = b.logs(&name_of(&b2));
    assert_eq!(b2done["state"], "JOB_STATE_FAILED", "{b2out}");
    assert!(!b2out.contains("PLANTED"), "B ran A's program:\n{b2out}");
    // B's secret is still B's, and the server still answers B.
    assert_eq!(std::fs::read_to_string(data.join("storage/projB/bkt/out/model/secret.txt")).unwrap().trim(), "bsecret");
    assert!(!data.join("storage/projB/bkt/out/model/planted.txt").exists());
    let (status, _) = b.call("POST", &format!("/v1/{b1n}:cancel"), None);
    assert_eq!(status, 200);
    b.wait_terminal(&b1n, 60);
}

/// A fork bomb within the task limit: with pids_max = 64, A's job tries 10,000 forks for
/// at most 5 s; fewer than 64 succeed, the rest fail, B's creates keep being answered
/// quickly meanwhile, and nothing of A's is left once its job ended.
#[test]
fn a_fork_bomb_stays_within_pids_max() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    let (s, _tokens) = tenant_server(64);
    let (a, b) = (Client::new(&s, TOKEN_A), Client::new(&s, TOKEN_B));
    let bomb = [
        "import os, time",
        "print('uid', os.getuid(), flush=True)",
        "n = failed = 0",
        "end = time.time() + 5",
        "for i in range(10000):",
        "    if time.time() > end:",
        "        break",
        "    try:",
        "        pid = os.fork()",
        "    except OSError:",
        "        failed += 1",
        "        continue",
        "    if pid == 0:",
        "        time.sleep(30)",
        "        os._exit(0)",
        "    n += 1",
        "print('forked', n, 'failed', failed, flush=True)",
    ]
    .join("\n");
    let a1 = a.create("projA", &job("bomb", &["python3", "-c", &bomb], &[], None));
    let a1n = name_of(&a1);
    // Meanwhile B's creates are answered.
    let mut slowest = Duration::ZERO;
    let mut b_jobs = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        b_jobs.push(name_of(&b.create("projB", &job(&format!("b{i}"), &["sh", "-c", "echo hello from b"], &[], None))));
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(slowest < Duration::from_secs(2), "a create of B took {slowest:?} during A's fork bomb");
    let done = a.wait_terminal(&a1n, 60);
    let out = a.logs(&a1n);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    let line = out.lines().find_map(|l| l.strip_prefix("forked ")).unwrap_or_else(|| panic!("no count:\n{out}"));
    let forked: u32 = line.split(' ').next().and_then(|n| n.parse().ok()).expect("count");
    assert!(forked < 64, "A forked {forked} processes with pids_max = 64");
    assert!(line.split(' ').nth(2).and_then(|n| n.parse::<u32>().ok()).unwrap_or(0) > 0, "no fork failed: {line}");
    for n in &b_jobs {
        let d = b.wait_terminal(n, 60);
        assert_eq!(d["state"], "JOB_STATE_SUCCEEDED", "{}", b.logs(n));
    }
    // Nothing of A's uid is left.
    let uid = uid_of(&out);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_of(uid);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} process(es) of A's uid {uid} left");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn processes_of(uid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string()))
                    && !s.lines().any(|l| l.starts_with("State:") && l.contains('Z'))
            })
        })
        .count()
}

/// Tokens with replicas as the server's user: refused at start, saying why and how to
/// allow it; `insecure_shared_user = true` allows it.
#[test]
fn tokens_with_a_shared_user_are_refused_unless_allowed() {
    let start = |replicas: &str| {
        let mut s = Server::prepare("");
        std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
        let tokens = s.dir.path().join("tokens.toml");
        std::fs::write(&tokens, format!("[[tokens]]\nname = \"a\"\ntoken = \"{TOKEN_A}\"\nprojects = [\"projA\"]\n")).expect("tokens");
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod tokens");
        let extra = format!("tokens_file = \"{}\"\n[replicas]\n{replicas}", tokens.display());
        std::fs::write(&s.config, config_text(&extra)).expect("config");
        let r = s.try_spawn();
        (s, r)
    };
    let (_s, refused) = start("per_project_users = false\n");
    let err = refused.expect_err("a tokens server with replicas as its own user started");
    assert!(err.contains("refusing to serve tokens while replicas run as the server's user"), "{err}");
    assert!(err.contains("insecure_shared_user = true"), "{err}");
    let (s, allowed) = start("per_project_users = false\ninsecure_shared_user = true\n");
    assert!(allowed.is_ok(), "{allowed:?}");
    assert!(s.server_log().contains("replicas run as the server's user"), "{}", s.server_log());
}

/// A trial's metric directory is its project's user's: A's trial makes its metric file a
/// FIFO, then a link to /dev/zero, then a link to the tokens file, while the server polls
/// it. The server never blocks or reads without end on it: B's creates keep being
/// answered, and the study ends.
#[test]
fn a_trial_metric_file_cannot_stall_or_feed_the_server() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    let (s, tokens) = tenant_server(4096);
    let (a, b) = (Client::new(&s, TOKEN_A), Client::new(&s, TOKEN_B));
    let trial = [
        "import os, time",
        "p = os.environ['CLOUD_ML_HP_METRIC_FILE']",
        "os.mkfifo(p); print('fifo', flush=True); time.sleep(3); os.remove(p)",
        "os.symlink('/dev/zero', p); print('zero', flush=True); time.sleep(3); os.remove(p)",
        "os.symlink(os.environ['KNOWN_TOKENS'], p); print('tokens link', flush=True); time.sleep(2)",
        "print('END', flush=True)",
    ]
    .join("\n");
    let study = json!({
        "displayName": "metric-tricks",
        "studySpec": {
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "q", "discreteValueSpec": {"values": [0.5]}}],
            "algorithm": "GRID_SEARCH"
        },
        "maxTrialCount": 1,
        "parallelTrialCount": 1,
        "trialJobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", trial],
                              "env": [{"name": "KNOWN_TOKENS", "value": tokens.display().to_string()}]}
        }]}
    });
    let (st, created) = a.call("POST", "/v1/projects/projA/locations/us-central1/hyperparameterTuningJobs", Some(&study));
    assert_eq!(st, 200, "{created}");
    let name = created["name"].as_str().expect("name").to_string();
    let mut slowest = Duration::ZERO;
    for i in 0..12 {
        let t = Instant::now();
        b.create("projB", &job(&format!("b{i}"), &["sh", "-c", "echo hello from b"], &[], None));
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(800));
    }
    assert!(slowest < Duration::from_secs(2), "a create of B took {slowest:?} while A's trial played with its metric file");
    let done = a.wait(&name, 60, |j| {
        matches!(j["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED"))
    });
    let trial_job = done["trials"][0]["customJob"].as_str().unwrap_or_else(|| panic!("no trial job: {done:#}")).to_string();
    let out = a.logs(&trial_job);
    assert!(out.contains("fifo") && out.contains("zero") && out.contains("END"), "{out}");
    assert!(done["trials"][0].get("finalMeasurement").is_none_or(|m| m["metrics"].as_array().is_none_or(|v| v.is_empty())), "{done:#}");
}

/// Per-project users must pass through the directories above the data directory: a data
/// directory below a directory only root may enter is refused at start, naming it and
/// the fix.
#[test]
fn a_data_directory_the_replicas_cannot_reach_is_refused() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    let mut s = Server::prepare("");
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let closed = s.dir.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod closed");
    s = s.with_data_dir(closed.join("data"));
    let err = s.try_spawn().expect_err("a server whose replicas cannot reach their directories started");
    assert!(err.contains(&format!("must pass through {}", closed.display())), "{err}");
    assert!(err.contains("chmod o+x"), "{err}");
}

/// What a replica of the network test does: the chief listens at its CLUSTER_SPEC address;
/// the worker connects to it, then tries the server's API, a host service on loopback and
/// on the host's other address, and a port of another project's job. Each try prints
/// `REACHED <what>` or `DENIED <what>`.
const NET_PROBE: &str = r#"
import json, os, socket, sys, time
spec = json.loads(os.environ["CLUSTER_SPEC"])
task = spec["task"]
def addr(a):
    h, p = a.rsplit(":", 1)
    return (h, int(p))
def reach(a, timeout=1.0):
    try:
        socket.create_connection(a, timeout=timeout).close()
        return True
    except OSError:
        return False
chief = addr(spec["cluster"]["workerpool0"][0])
if task["type"] == "workerpool0":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(chief)
    l.listen()
    l.settimeout(60)
    print("listening", flush=True)
    l.accept()[0].close()
    print("peer connected", flush=True)
    # The job ends with this replica: not before the peer has probed everything (it
    # connects again when it is done).
    l.accept()[0].close()
    sys.exit(0)
deadline = time.time() + 60
while not reach(chief):
    if time.time() > deadline:
        print("PEER UNREACHABLE", flush=True)
        sys.exit(1)
    time.sleep(0.2)
print("REACHED peer", flush=True)
for what, target in [("server", ("127.0.0.1", int(os.environ["SERVER_PORT"]))),
                     ("host_loopback", ("127.0.0.1", int(os.environ["HOST_PORT"]))),
                     ("host_address", (os.environ["HOST_ADDR"], int(os.environ["HOST_PORT"]))),
                     ("other_job", ("127.0.0.1", int(os.environ["OTHER_PORT"])))]:
    print(("REACHED " if reach(target) else "DENIED ") + what, flush=True)
reach(chief)
"#;

/// The host's first non-loopback IPv4 address (the one a route to the outside uses).
fn host_address() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

/// One run of the network probe on a server with `[replicas] network = <mode>`: the
/// probe's log, and the job's id.
fn network_probe(mode: &str) -> (String, Server, u64) {
    let s = Server::start(&format!("[replicas]\nnetwork = \"{mode}\"\n"));
    // A service of the host, on every address (as the server would be with 0.0.0.0).
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || for c in host.incoming() { drop(c) });
    // Another project's job that listens on its loopback.
    let listen = "import socket,time\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                  l.bind(('127.0.0.1',0))\nl.listen()\nprint('port',l.getsockname()[1],flush=True)\ntime.sleep(120)";
    let b = s.create("projB", &job("listener", &["python3", "-c", listen], &[], None));
    let deadline = Instant::now() + Duration::from_secs(60);
    let other_port = loop {
        let text = s.logs_text(&name_of(&b));
        if let Some(p) = text.lines().find_map(|l| l.split("stdout: port ").nth(1)) {
            break p.trim().to_string();
        }
        assert!(Instant::now() < deadline, "B never listened: {text}\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(100));
    };
    let env = [
        ("SERVER_PORT", s.port.to_string()),
        ("HOST_PORT", host_port.to_string()),
        ("HOST_ADDR", host_address().unwrap_or_else(|| "127.0.0.1".into())),
        ("OTHER_PORT", other_port),
    ];
    let mut spec = job("probe", &["python3", "-c", NET_PROBE], &env, None);
    let pool = spec["jobSpec"]["workerPoolSpecs"][0].clone();
    spec["jobSpec"]["workerPoolSpecs"] = json!([pool.clone(), pool]);
    let a = s.create("projA", &spec);
    let done = s.wait_terminal(&name_of(&a), 120);
    let text = s.logs_text(&name_of(&a));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{text}");
    assert!(text.contains("peer connected") && text.contains("REACHED peer"), "the job's replicas must reach each other:\n{text}");
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&b))), Some("{}"));
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name_of(&b), 60);
    (text, s, id_of(&a))
}

/// `[replicas] network = "job"`: a job's replicas reach each other at their CLUSTER_SPEC
/// addresses and nothing else: not the server's API, not a host service (on loopback or
/// the host's address), not another project's job. With the host's network (the default)
/// the same probe reaches all of them: the test would see a namespace that isolates
/// nothing. A job's namespace is removed once the job has ended.
#[test]
fn a_jobs_network_reaches_its_replicas_and_nothing_else() {
    if !is_root() {
        trainyard_backend::skip_test("network namespaces need a root server");
        return;
    }
    if skip_on_slurm("a job's network namespace is one host's (refused with Slurm: see the next test)") {
        return;
    }
    let (open, s, _) = network_probe("host");
    for what in ["server", "host_loopback", "other_job"] {
        assert!(open.lines().any(|l| l.ends_with(&format!("REACHED {what}"))), "host network: {what} not reached:\n{open}");
    }
    drop(s);

    let (text, mut s, id) = network_probe("job");
    for what in ["server", "host_loopback", "host_address", "other_job"] {
        assert!(text.lines().any(|l| l.ends_with(&format!("DENIED {what}"))), "no DENIED {what}:\n{text}");
    }
    assert!(!text.contains("REACHED server") && !text.contains("REACHED other_job"), "{text}");
    // The ended jobs' namespaces go (the sweep runs every 10 s).
    let dir = s.data_dir().join("netns");
    let deadline = Instant::now() + Duration::from_secs(40);
    while dir.join(id.to_string()).exists() {
        assert!(Instant::now() < deadline, "the namespace of ended job {id} is still there\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(250));
    }
    s.kill9();
    // The namespaces' directory is a mount of its own: unmount it before the data
    // directory is removed.
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let _ = std::process::Command::new("umount").arg("-l").arg(e.path()).status();
    }
    let _ = std::process::Command::new("umount").arg("-l").arg(&dir).status();
}

/// `network = "job"` is refused with the Slurm backend (a job's replicas may be on
/// several hosts), naming the key.
#[test]
fn a_job_network_with_slurm_is_refused() {
    let err = serve_refused("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\n[replicas]\nnetwork = \"job\"\n");
    assert!(err.contains("replicas.network") && err.contains("Slurm"), "{err}");
}

/// Each replica has a `/dev/shm` of its own (a tmpfs no larger than its memory limit,
/// gone with it: what a job leaves there never stays in the host's RAM) and no file
/// descriptor the server inherited from whatever started it.
#[test]
fn a_replica_has_its_own_dev_shm_and_no_inherited_descriptor() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    if skip_on_slurm("the tmpfs is mounted by the local shim's mount namespace") {
        return;
    }
    let mut s = Server::prepare("");
    let secret = s.dir.path().join("inherited-secret");
    std::fs::write(&secret, b"the server's inherited file").unwrap();
    s.inherit_fd10 = Some(secret.clone());
    s.spawn();
    let marker = format!("trainyard-shm-{}", std::process::id());
    let script = format!(
        "ls /proc/self/fd | tr '\\n' ' '; echo; cat /proc/self/fd/10 2>/dev/null && echo INHERITED; \
         df -B1 --output=fstype,size /dev/shm | tail -1; \
         head -c 10485760 /dev/zero > /dev/shm/{marker} && echo WROTE"
    );
    let j = s.create("shm", &sh_job("shm", &script));
    let done = s.wait_terminal(&name_of(&j), 60);
    let out = s.logs_text(&name_of(&j));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    assert!(!out.contains("INHERITED") && !out.contains("the server's inherited file"), "fd 10 reached the job:\n{out}");
    assert!(out.contains("WROTE"), "{out}");
    let tmpfs = out.lines().find(|l| l.contains("tmpfs")).unwrap_or_else(|| panic!("/dev/shm is no tmpfs:\n{out}"));
    let size: u64 = tmpfs.split_whitespace().skip_while(|w| *w != "tmpfs").nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    // n1-standard-4: 15 GB, less the reserved share (L14); the host's /dev/shm is half its RAM.
    assert!(size > 0 && size < 15_000_000_000, "/dev/shm of {size} bytes is not the replica's own:\n{out}");
    assert!(!Path::new("/dev/shm").join(&marker).exists(), "the job's shared memory stayed on the host");
}

/// A replica shares nothing of SysV IPC with the host or other tenants (an IPC namespace
/// of its own: a segment it makes is not the host's and goes with it), and may not make a
/// user namespace (the tenant system call filter, `crates/backend/src/seccomp.rs`).
#[test]
fn a_replica_has_its_own_ipc_and_no_user_namespaces() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    if skip_on_slurm("checked on the local backend (the shim is the same)") || skip_in_containers("a container has the engine's profile") {
        return;
    }
    let s = Server::start("");
    let script = "echo uid=$(id -u); ipcmk -M 65536 >/dev/null && echo MADE; \
                  echo segments=$(tail -n +2 /proc/sysvipc/shm | wc -l); \
                  unshare -Ur true 2>&1; echo userns=$?; sleep 1";
    let j = s.create("ipc", &sh_job("ipc", script));
    let done = s.wait_terminal(&name_of(&j), 60);
    let out = s.logs_text(&name_of(&j));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    assert!(out.contains("MADE") && out.contains("segments=1"), "its own segment alone:\n{out}");
    assert!(out.lines().any(|l| l.trim_end().ends_with(" userns=1")), "unshare -Ur must be refused:\n{out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    let uid = out.lines().find_map(|l| l.split(" uid=").nth(1)).map(str::trim).unwrap_or_else(|| panic!("{out}")).to_string();
    let host = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    // Columns: key shmid perms size cpid lpid nattch uid gid ...
    let left: Vec<&str> = host.lines().skip(1).filter(|l| l.split_whitespace().nth(7) == Some(uid.as_str())).collect();
    assert!(left.is_empty(), "the job's segment is on the host:\n{left:?}");
}

/// A replica sees its own cgroups at `/sys/fs/cgroup` and nothing else of the host's tree:
/// no other process (the server, another project's program) is listed in any
/// `cgroup.procs` it can read, its own memory limit is there, and `/proc/self/cgroup`
/// names no host path.
#[test]
fn a_replica_sees_only_its_own_cgroup() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    if skip_on_slurm("the view is made by the local shim") || skip_in_containers("a container has the engine's view") {
        return;
    }
    let s = Server::start("");
    let other = s.create("other", &sh_job("other", "echo other-is-running && sleep 600"));
    s.wait_for(&name_of(&other), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let script = "echo \"cgroup: $(cat /proc/self/cgroup | tr '\\n' ' ')\"; \
                  find /sys/fs/cgroup -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\\n' ' ' | sed 's/^/procs: /'; echo; \
                  for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do [ -r $f ] && echo \"limit: $(cat $f)\"; done; \
                  grep cgroup /proc/self/mountinfo; echo done";
    let j = s.create("viewer", &sh_job("viewer", script));
    let done = s.wait_terminal(&name_of(&j), 60);
    let out = s.logs_text(&name_of(&j));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    let line = |p: &str| out.lines().find_map(|l| l.split_once(p).map(|(_, r)| r.trim().to_string())).unwrap_or_default();
    let procs: Vec<i32> = line("procs: ").split_whitespace().filter_map(|p| p.parse().ok()).collect();
    assert!(!procs.is_empty(), "the replica's own cgroup.procs is readable:\n{out}");
    let server = s.pid().map(|p| p as i32).unwrap_or(-1);
    let others = pids_with("other-is-running");
    assert!(!procs.contains(&server), "the server's pid {server} is listed:\n{out}");
    assert!(others.iter().all(|p| !procs.contains(p)), "another project's pids {others:?} are listed:\n{out}");
    // The pids are of the replica's own namespace view: the shell itself, or its children.
    assert!(procs.len() < 10, "{out}");
    assert!(line("cgroup: ").split_whitespace().all(|c| c.ends_with(":/")), "/proc/self/cgroup names host paths:\n{out}");
    let limit: u64 = line("limit: ").parse().unwrap_or(0);
    assert!(limit > 0 && limit < 15_000_000_000, "the replica's own memory limit is shown:\n{out}");
    // On cgroup v1 the view is made in the supervisor's own mount namespace, which the
    // program shares: one namespace per replica, not a second one for the program.
    if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        let ppid = |pid: i32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
        };
        let program = others.iter().copied().find(|p| ppid(*p).and_then(ns).is_some()).expect("the other job's program and its supervisor");
        let supervisor = ppid(program).unwrap();
        assert_eq!(ns(program), ns(supervisor), "the program has a mount namespace of its own besides its supervisor's");
        assert_ne!(ns(supervisor), ns(std::process::id() as i32), "the supervisor has no mount namespace of its own");
    }
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&other))), Some("{}"));
    assert_eq!(status, 200, "{body}");
}

/// Replicas' programs run at `[replicas] nice` (default 10): a tenant that wants all the
/// CPU yields it to the server and to the shims starting other projects' replicas
/// (measured by hostile-bench); 0 turns that off.
#[test]
fn replicas_yield_the_cpu_to_the_control_plane() {
    if skip_on_slurm("the nice value is set by the local shim") || skip_in_containers("a container's processes are the engine's") {
        return;
    }
    for (config, expected) in [("", "10"), ("[replicas]\nnice = 0\n", "0")] {
        let s = Server::start(config);
        let j = s.create("p", &sh_job("nice", "echo \"nice=$(nice)\""));
        let done = s.wait_terminal(&name_of(&j), 60);
        let out = s.logs_text(&name_of(&j));
        assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
        assert!(out.contains(&format!("nice={expected}\n")), "{config:?}: {out}");
    }
}

/// With `network = "job"`, a package's `setup.py` runs in the job's network namespace (the
/// build is the replica's first step): it reaches neither the server's API nor a service
/// of the host, and it runs as the project's user, in the replica's cgroup.
#[test]
fn a_package_build_runs_in_the_jobs_network_and_cgroup() {
    if !is_root() {
        trainyard_backend::skip_test("network namespaces need a root server");
        return;
    }
    if skip_on_slurm("a job's network namespace is one host's") || skip_in_containers("a container builds in the engine's sandbox") {
        return;
    }
    let s = Server::start("[replicas]\nnetwork = \"job\"\n");
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || for c in host.incoming() { drop(c) });
    let setup = format!(
        "import os, socket\n\
         out = []\n\
         for what, port in (('server', {server}), ('host', {host})):\n    \
             try:\n        socket.create_connection(('127.0.0.1', port), timeout=2).close(); out.append('REACHED ' + what)\n    \
             except OSError:\n        out.append('DENIED ' + what)\n\
         out.append('uid %d' % os.getuid())\n\
         out.append('cgroup ' + open('/proc/self/cgroup').read().replace(chr(10), ' '))\n\
         open(os.path.join(os.environ['HOME'], 'build-net.txt'), 'w').write(chr(10).join(out))\n\
         from setuptools import setup\nsetup(name='trainer', version='0.1', packages=['trainer'])\n",
        server = s.port,
        host = host_port
    );
    let pkg = s.data_dir().join("storage/p/pkgs/trainer-src");
    std::fs::create_dir_all(pkg.join("trainer")).unwrap();
    std::fs::write(pkg.join("setup.py"), setup).unwrap();
    std::fs::write(pkg.join("trainer/__init__.py"), "").unwrap();
    std::fs::write(pkg.join("trainer/task.py"), "print('task ran')\n").unwrap();
    let j = s.create("p", &json!({"displayName": "pkg", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "pythonPackageSpec": {"executorImageUri": "python:3.11", "packageUris": ["gs://pkgs/trainer-src"], "pythonModule": "trainer.task"}}]}}));
    let done = s.wait_terminal(&name_of(&j), 180);
    let log = s.logs_text(&name_of(&j));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    let text = std::fs::read_to_string(s.data_dir().join("venvs").join(id_of(&j).to_string()).join("build-net.txt")).unwrap();
    assert!(text.contains("DENIED server") && text.contains("DENIED host"), "{text}");
    assert!(uid_of(&text) >= 200_000, "the build runs as the project's user:\n{text}");
    assert!(text.contains(":/ ") || text.contains(":/\n") || text.ends_with(":/"), "the build is in the replica's cgroup namespace:\n{text}");
}

/// A wheel of `name` 1.0 with one module of the same name holding `module`, and
/// `requires` as its dependencies, written by the host's Python (a wheel is a zip).
fn make_wheel(dir: &Path, name: &str, module: &str, requires: &[&str]) -> PathBuf {
    let file = dir.join(format!("{name}-1.0-py3-none-any.whl"));
    let script = r#"
import sys, zipfile
path, name, module = sys.argv[1], sys.argv[2], sys.argv[3]
info = f"{name}-1.0.dist-info"
meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in sys.argv[4:])
files = {f"{name}.py": module, f"{info}/METADATA": meta,
         f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(path, "w") as z:
    for f, text in files.items():
        z.writestr(f, text)
"#;
    let status = std::process::Command::new("python3")
        .args(["-c", script, &file.display().to_string(), name, module])
        .args(requires)
        .status()
        .expect("python3");
    assert!(status.success(), "cannot make {}", file.display());
    file
}

/// A package index on the host's loopback that serves `wheel` as project `project`, and
/// the request lines it got.
fn package_index(project: &str, wheel: PathBuf) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    let file = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let project = project.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).map_or(true, |n| n == 0) || h == "\r\n" {
                    break;
                }
            }
            log.lock().unwrap().push(line.trim_end().to_string());
            let path = line.split(' ').nth(1).unwrap_or("");
            let (status, body, kind) = if path == format!("/simple/{project}/") {
                ("200 OK", format!("<html><body><a href=\"/files/{file}\">{file}</a></body></html>").into_bytes(), "text/html")
            } else if path == format!("/files/{file}") {
                ("200 OK", std::fs::read(&wheel).unwrap(), "application/octet-stream")
            } else {
                ("404 Not Found", b"not here".to_vec(), "text/plain")
            };
            let mut conn = conn;
            let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = conn.write_all(&body);
        }
    });
    (port, seen)
}

/// With `network = "job"` and `[replicas] package_index` a URL, a package build in the
/// job's namespace installs the package's dependency from that index (through the server's
/// proxy socket), and the same way out reaches nothing else: a CONNECT or a request to the
/// server's API through it is refused with 403, and the index is not reachable directly.
#[test]
fn a_job_network_build_reaches_the_package_index_and_nothing_else() {
    if !is_root() {
        trainyard_backend::skip_test("network namespaces need a root server");
        return;
    }
    if skip_on_slurm("a job's network namespace is one host's") || skip_in_containers("a container builds in the engine's sandbox") {
        return;
    }
    let wheels = tempfile::tempdir().unwrap();
    let probe = make_wheel(wheels.path(), "trainyard_probe", "WHO = 'the index'\n", &[]);
    let (index_port, seen) = package_index("trainyard-probe", probe);
    let s = Server::start(&format!("[replicas]\nnetwork = \"job\"\npackage_index = \"http://127.0.0.1:{index_port}/simple\"\n"));
    let task = format!(
        "import os, socket, trainyard_probe\n\
         print('probe from', trainyard_probe.WHO)\n\
         sock = {sock:?}\n\
         for what, req in (('connect-server', 'CONNECT 127.0.0.1:{server} HTTP/1.1'), ('get-server', 'GET http://127.0.0.1:{server}/healthz HTTP/1.1')):\n    \
             c = socket.socket(socket.AF_UNIX); c.connect(sock); c.sendall((req + chr(13) + chr(10) + chr(13) + chr(10)).encode())\n    \
             print(what, c.recv(200).split(b'\\r\\n')[0].decode())\n\
         try:\n    socket.create_connection(('127.0.0.1', {index_port}), timeout=2).close(); print('REACHED index directly')\n\
         except OSError:\n    print('DENIED index directly')\n",
        sock = s.data_dir().join("package-index.sock").display().to_string(),
        server = s.port,
    );
    let bucket = s.data_dir().join("storage/p/pkgs");
    std::fs::create_dir_all(&bucket).unwrap();
    make_wheel(&bucket, "trainer", &task, &["trainyard-probe"]);
    let j = s.create("p", &json!({"displayName": "pkg", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "pythonPackageSpec": {"executorImageUri": "python:3.11", "packageUris": ["gs://pkgs/trainer-1.0-py3-none-any.whl"], "pythonModule": "trainer"}}]}}));
    let done = s.wait_terminal(&name_of(&j), 180);
    let log = s.logs_text(&name_of(&j));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("probe from the index"), "{log}");
    assert!(log.contains("connect-server HTTP/1.1 403") && log.contains("get-server HTTP/1.1 403"), "{log}");
    assert!(log.contains("DENIED index directly"), "{log}");
    let requests = seen.lock().unwrap().clone();
    assert!(requests.iter().any(|r| r.starts_with("GET /simple/trainyard-probe/ ")), "{requests:?}");
}

/// Replicas share no `/tmp`: each replica of a project's user has one of its own
/// (`TMPDIR=/tmp`), so another tenant's link planted at a fixed name is not there to
/// follow, nothing one leaves is seen by the next, and what a replica left goes when it
/// ends. (With the data directory under the host's /tmp, as in most tests, replicas keep
/// the host's: here it is under /var/tmp.)
#[test]
fn replicas_have_a_tmp_of_their_own_emptied_when_they_end() {
    if !is_root() && trainyard_backend::skip_test("per-project users need a root server") {
        return;
    }
    if skip_on_slurm("checked on the local backend (the shim is the same)") || skip_in_containers("a container has the engine's /tmp") {
        return;
    }
    let outside = tempfile::Builder::new().prefix("trainyard-tmp-e2e").tempdir_in("/var/tmp").expect("a directory under /var/tmp");
    std::fs::set_permissions(outside.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
    let mut s = Server::prepare("").with_data_dir(outside.path().join("data"));
    s.spawn();
    assert!(s.server_log().contains("each replica of a project's user has a /tmp of its own"), "{}", s.server_log());
    // The planter leaves a link at a fixed name pointing into its own storage, and a file.
    let planter = s.create(
        "evil",
        &sh_job("planter", "ln -s /gcs/loot/stolen /tmp/shared-name; echo secret > /tmp/evil-file; echo TMPDIR=$TMPDIR; ls -a /tmp; sleep 600"),
    );
    s.wait_for(&name_of(&planter), 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.logs_text(&name_of(&planter)).contains("evil-file") {
        assert!(Instant::now() < deadline, "{}", s.logs_text(&name_of(&planter)));
        std::thread::sleep(Duration::from_millis(100));
    }
    let victim = s.create(
        "victim",
        &sh_job("victim", "echo TMPDIR=$TMPDIR; echo entries=$(ls -A /tmp | wc -l); echo mine > /tmp/shared-name; [ -L /tmp/shared-name ] && echo FOLLOWED || echo PLAIN; mktemp"),
    );
    let done = s.wait_terminal(&name_of(&victim), 60);
    let out = s.logs_text(&name_of(&victim));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{out}");
    assert!(out.contains("TMPDIR=/tmp") && out.contains("entries=0") && out.contains("PLAIN"), "a /tmp of its own:\n{out}");
    assert!(out.contains("/tmp/tmp."), "mktemp works in it:\n{out}");
    assert!(!Path::new("/tmp/evil-file").exists() && !Path::new("/tmp/shared-name").exists(), "nothing on the host's /tmp");
    let loot = s.data_dir().join("storage/evil/loot/stolen");
    assert!(!loot.exists(), "the victim's write went through the planted link");
    // The victim's /tmp went with it; the planter's stays while it runs.
    let dir = |job: &Value, replica: &str| run_dir(&s.data_dir(), id_of(job), 0, replica, 0).join("tmp");
    assert!(!dir(&victim, "workerpool0-0").exists(), "the ended replica's /tmp is gone");
    assert!(dir(&planter, "workerpool0-0").join("evil-file").exists());
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&planter))), Some("{}"));
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name_of(&planter), 60);
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir(&planter, "workerpool0-0").exists() {
        assert!(Instant::now() < deadline, "the cancelled replica's /tmp stays");
        std::thread::sleep(Duration::from_millis(100));
    }
}
