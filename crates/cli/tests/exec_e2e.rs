//! `trainyard custom-jobs exec`: a command or a shell inside a running replica, through the
//! CLI and the session WebSocket (docs/exec.md), on the local backend with host programs
//! and (scripts/test's container part) with podman.
//!
//! What the replica's program sees of itself (user, cgroup, namespaces, environment,
//! working directory) is what a session sees; exit statuses, stdout and stderr and stdin
//! pass as if the command ran here; a terminal session runs a shell on a pty; each refusal
//! names what is wrong; sessions end when idle too long and when the replica ends.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// What a process sees of its own sandbox: identity, cgroups, namespaces, environment
/// and working directory (no pid: the session is another process).
const SELF_VIEW: &str = "id; cat /proc/self/cgroup; for n in net ipc mnt cgroup; do readlink /proc/self/ns/$n; done; \
                         echo job=$CLOUD_ML_JOB_ID spec=${CLUSTER_SPEC:+set}; pwd; ls /proc | grep -c '^[0-9]' >/dev/null; echo end-of-view";

fn exec_cli(s: &Server, project: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("custom-jobs").arg("exec").args(args).env("TRAINYARD_SERVER", s.url("")).env("TRAINYARD_PROJECT", project).env_remove("TRAINYARD_TOKEN");
    c
}

fn exec_out(s: &Server, project: &str, args: &[&str]) -> Output {
    exec_cli(s, project, args).stdin(Stdio::null()).output().expect("run trainyard custom-jobs exec")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A job whose program prints its own view of its sandbox, then waits.
fn viewer(s: &Server, project: &str) -> (String, String) {
    let job = s.create(project, &in_test_image(sh_job("viewer", &format!("{SELF_VIEW}; exec sleep 600"))));
    let name = name_of(&job);
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = s.logs(&name);
        let lines: Vec<String> =
            log.iter().filter(|e| e["stream"] == "stdout").map(|e| e["text"].as_str().unwrap_or("").to_string()).collect();
        if lines.iter().any(|l| l == "end-of-view") {
            return (name, lines.join("\n"));
        }
        assert!(Instant::now() < deadline, "the program never printed its view: {}", s.logs_text(&name));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A session printing a tick every half second, returned once its first tick came (it
/// is open then).
fn ticking_session(s: &Server, name: &str) -> std::process::Child {
    let mut child = exec_cli(s, "p", &[id(name), "--", "sh", "-c", "while :; do echo tick; sleep 0.5; done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = [0u8; 5];
    std::io::Read::read_exact(child.stdout.as_mut().expect("stdout"), &mut first).expect("the session's first output");
    child
}

/// The CLI's exit once the session ended, within `secs` (or a panic saying `what`).
fn ended(child: &mut std::process::Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        assert!(started.elapsed() < Duration::from_secs(secs), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `custom-jobs port-forward JOB 0:REMOTE` running, and the local port it printed.
fn forwarder(s: &Server, name: &str, remote: u16) -> (std::process::Child, u16) {
    let mut fwd = Command::new(BIN)
        .args(["custom-jobs", "port-forward", id(name), &format!("0:{remote}")])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("port-forward");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(fwd.stdout.take().expect("stdout")), &mut line).expect("its first line");
    let local = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local address in {line:?}"));
    (fwd, local)
}

fn id(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or("")
}

fn cancel(s: &Server, name: &str) {
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), None);
    assert_eq!(status, 200, "{body}");
}

/// The session runs in the replica's sandbox: the same user, cgroups, network, IPC, mount
/// and cgroup namespaces, environment and working directory as the replica's program;
/// stdout and stderr apart; the command's exit status as the CLI's; stdin piped in.
#[test]
fn a_command_runs_inside_the_replica_with_its_streams_and_exit_status() {
    let s = Server::start("");
    let (name, program_view) = viewer(&s, "p");
    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", SELF_VIEW]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout).trim_end(), program_view.trim_end(), "the session's view differs from the program's");

    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(text(&out.stdout), "to-out\n");
    assert_eq!(text(&out.stderr), "to-err\n");

    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15), "a signal is 128 + N: {out:?}");

    let out = exec_out(&s, "p", &[id(&name), "--", "no-such-command-here"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");

    // Standard input, with its end: a pipe works both ways.
    let mut child = exec_cli(&s, "p", &[id(&name), "--", "sh", "-c", "tr a-z A-Z; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child.stdin.take().expect("stdin").write_all(b"piped in\n").expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(text(&out.stdout), "PIPED IN\ndone\n", "{out:?}");

    // A binary stream of 3 MB passes unchanged (several WebSocket messages).
    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"]);
    assert_eq!(out.stdout.len(), 3_000_000, "{}", text(&out.stderr));
    assert!(out.stdout.iter().all(|b| *b == b'x'));
    cancel(&s, &name);
}

/// With no command, a shell on a terminal: raw keys in, its `tty` a pty of its own,
/// `TERM` and the terminal's size passed on, and its exit status out.
#[test]
fn the_shell_runs_on_a_terminal() {
    let s = Server::start("");
    let (name, _) = viewer(&s, "p");
    let driver = r#"
import os, pty, select, sys, time, struct, fcntl, termios
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm-256color"
    os.execv(sys.argv[1], sys.argv[1:])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
out = b""
def read_for(secs, until=None):
    global out
    end = time.time() + secs
    while time.time() < end and not (until and until in out):
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                return
read_for(10, b"$ ")
os.write(fd, b"echo marker-$((40+2)); tty; echo term=$TERM; stty size; exit 5\r")
read_for(10)
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
sys.stdout.write("\nexit=%d\n" % os.waitstatus_to_exitcode(status))
"#;
    let out = Command::new("python3")
        .args(["-c", driver, BIN, "custom-jobs", "exec", id(&name)])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .output()
        .expect("python3");
    let shown = text(&out.stdout);
    assert!(shown.contains("marker-42"), "{shown}\n{}", text(&out.stderr));
    assert!(shown.contains("/dev/pts/"), "a terminal of its own: {shown}");
    assert!(shown.contains("term=xterm-256color"), "{shown}");
    assert!(shown.contains("33 111"), "the terminal's size: {shown}");
    assert!(shown.contains("exit=5"), "{shown}");
    cancel(&s, &name);
}

/// Each refusal names what is wrong and opens nothing: a job of another project (404), a
/// replica the job does not have (404 naming its replicas), a job that has ended
/// (FAILED_PRECONDITION naming its state), a NUL byte or a wrong parameter (400), a plain
/// GET that is no WebSocket (400), a page of another site (403), a message over 1 MiB (the
/// session's status names the limit).
#[test]
fn refusals_name_what_is_wrong() {
    let s = Server::start("");
    let (name, _) = viewer(&s, "p");
    let url = |project: &str, id: &str, query: &str| s.url(&format!("/v1/projects/{project}/locations/us-central1/customJobs/{id}/exec{query}"));
    let (status, body) = s.call("GET", &url("other", id(&name), ""), None);
    assert_eq!(status, 404, "{body}");
    let (status, body) = s.call("GET", &url("p", id(&name), "?replica=workerpool3-9"), None);
    assert_eq!(status, 404, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("workerpool3-9") && message.contains("workerpool0-0"), "{message}");
    for (query, named) in [("?command=a%00b", "NUL"), ("?tty=maybe", "tty"), ("?tty=true&cols=0", "cols"), ("?shell=1", "shell")] {
        let (status, body) = s.call("GET", &url("p", id(&name), query), None);
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"]["message"].as_str().unwrap_or("").contains(named), "{query}: {body}");
    }
    let (status, body) = s.call("GET", &url("p", id(&name), ""), None);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("WebSocket"), "{body}");
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let resp = agent
        .run(ureq::http::Request::builder().uri(url("p", id(&name), "")).header("Origin", "https://evil.example").body(()).unwrap())
        .expect("request");
    assert_eq!(resp.status().as_u16(), 403);

    // Through the CLI: the API's message, a failing exit status.
    let out = exec_out(&s, "p", &[id(&name), "--replica", "workerpool1-0", "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no replica \"workerpool1-0\""), "{}", text(&out.stderr));

    // A message over the limit (1 MiB) ends the session with a status that names the limit.
    {
        use tokio_tungstenite::tungstenite::{self, Message};
        let ws_url = url("p", id(&name), "?command=cat").replacen("http", "ws", 1);
        let addr = s.url("").trim_start_matches("http://").trim_end_matches('/').to_string();
        let tcp = std::net::TcpStream::connect(&addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (mut ws, _) = tungstenite::client(ws_url.as_str(), tcp).expect("the session's handshake");
        let mut big = vec![0u8; (1 << 20) + 2];
        big[1..].fill(b'x');
        let _ = ws.send(Message::Binary(big.into()));
        let status = loop {
            match ws.read() {
                Ok(Message::Binary(b)) if b.first() == Some(&3) => break serde_json::from_slice::<Value>(&b[1..]).expect("a status"),
                Ok(Message::Close(_)) | Err(_) => panic!("the session ended without a status"),
                Ok(_) => {}
            }
        };
        let message = status["message"].as_str().unwrap_or("");
        assert!(message.contains("larger than 1048576 bytes"), "{status}");
        assert_eq!(status["error"]["status"], "INVALID_ARGUMENT", "{status}");
    }
    // The replica goes on.
    let out = exec_out(&s, "p", &[id(&name), "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    cancel(&s, &name);
    s.wait_terminal(&name, 30);
    let (status, body) = s.call("GET", &url("p", id(&name), ""), None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["status"], "FAILED_PRECONDITION");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("JOB_STATE_CANCELLED"), "{body}");
}

/// A session needs a read-write token of the job's project: read-only is 403, another
/// project's token 403, and the session is audited with its holder.
#[test]
fn a_session_needs_a_read_write_token_and_is_audited() {
    const RW: &str = "rw-exec-token-0123456789abcdef";
    const RO: &str = "ro-exec-token-0123456789abcdef";
    const OTHER: &str = "other-exec-token-0123456789ab";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{RW}\"\nprojects = [\"p\"]\nname = \"debugger\"\n\n\
             [[tokens]]\ntoken = \"{RO}\"\nprojects = [\"p\"]\naccess = \"read-only\"\n\n\
             [[tokens]]\ntoken = \"{OTHER}\"\nprojects = [\"q\"]\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let created = agent
        .run(
            ureq::http::Request::builder()
                .method("POST")
                .uri(s.jobs_url("p"))
                .header("Authorization", format!("Bearer {RW}"))
                .header("Content-Type", "application/json")
                .body(in_test_image(sh_job("sleeper", "exec sleep 600")).to_string())
                .unwrap(),
        )
        .expect("create");
    let job: Value = serde_json::from_str(&created.into_body().read_to_string().unwrap()).unwrap();
    let name = name_of(&job);
    let running = |token: &str| {
        let resp = agent
            .run(ureq::http::Request::builder().uri(s.url(&format!("/v1/{name}"))).header("Authorization", format!("Bearer {token}")).body(()).unwrap())
            .expect("get");
        serde_json::from_str::<Value>(&resp.into_body().read_to_string().unwrap()).unwrap()["state"] == "JOB_STATE_RUNNING"
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running(RW) {
        assert!(Instant::now() < deadline, "the job never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let with = |token: &str| {
        let mut c = exec_cli(&s, "p", &[id(&name), "--", "echo", "inside"]);
        c.env("TRAINYARD_TOKEN", token).stdin(Stdio::null()).output().expect("exec")
    };
    for token in [RO, OTHER] {
        let out = with(token);
        assert!(!out.status.success(), "{out:?}");
        assert!(text(&out.stderr).contains("PERMISSION_DENIED"), "{}", text(&out.stderr));
    }
    let out = with(RW);
    assert_eq!(text(&out.stdout), "inside\n", "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = s.server_log();
        if let Some(line) = log.lines().find(|l| l.contains("exec session")) {
            for part in ["holder=\"debugger\"", "replica=\"workerpool0-0\"", "command=\"echo inside\"", "outcome=\"exited\"", "exit_status=\"0\""] {
                assert!(line.contains(part), "{part} missing in the audit line: {line}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no audit line: {log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::mem::forget(dir);
}

/// `[exec] max_sessions_per_project`: one more session is 429 naming the key, another
/// project's are its own; `[exec] idle_timeout_secs` ends a session with no input and no
/// output, naming the key; the replica's end ends its sessions.
#[test]
fn sessions_are_limited_idle_ones_end_and_they_end_with_their_replica() {
    let s = Server::start("[exec]\nmax_sessions_per_project = 1\nidle_timeout_secs = 2\n");
    let (name, _) = viewer(&s, "p");
    let mut holder = ticking_session(&s, &name);
    let out = exec_out(&s, "p", &[id(&name), "--", "true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("RESOURCE_EXHAUSTED") && err.contains("exec.max_sessions_per_project = 1"), "{err}");
    let _ = holder.kill();
    let _ = holder.wait();

    // Idle: no input, no output.
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = exec_out(&s, "p", &[id(&name), "--", "sleep", "60"]);
        // The slot of the killed session may take a moment to come back.
        if !text(&out.stderr).contains("RESOURCE_EXHAUSTED") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    assert!(text(&out.stderr).contains("exec.idle_timeout_secs"), "{}", text(&out.stderr));
    // Counted by how they ended: the one whose client went away, the idle one.
    let metrics = ureq::get(&s.url("/metrics")).call().expect("metrics").into_body().read_to_string().expect("text");
    for outcome in ["idle", "disconnected"] {
        let series = format!("trainyard_exec_sessions_total{{project=\"p\",outcome=\"{outcome}\"}}");
        assert!(metrics.lines().any(|l| l.starts_with(&series)), "{series} missing:\n{metrics}");
    }

    // The replica ends: so does the session in it, though its command would go on.
    let mut inside = ticking_session(&s, &name);
    cancel(&s, &name);
    let status = ended(&mut inside, 60, "the session outlived its replica");
    assert!(!status.success(), "{status:?}");
    s.wait_terminal(&name, 60);
}

/// The host's processes running `sleep SECS` (the tests' markers: a number no other
/// test uses).
fn sleeping(secs: u32) -> Vec<u32> {
    let want = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes()))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to `secs` for `sleeping(marker)` to be as `gone` says.
fn sleeping_becomes(marker: u32, gone: bool, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if sleeping(marker).is_empty() == gone {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a session started ends with it (host programs), as a step's processes end with
/// the step on Slurm: a command's background processes, and an interactive shell's
/// background jobs (process groups of their own in its session) once the shell exits,
/// at once (the CLI does not wait for them to close their output). A process that left
/// with setsid lives on, until the replica ends.
#[test]
fn what_a_session_started_ends_with_it() {
    if containers_backend() {
        // In a container the engine runs the command: what it leaves is the engine's
        // (docs/exec.md).
        return;
    }
    let s = Server::start("");
    let (name, _) = viewer(&s, "p");
    let started = Instant::now();
    // The command ends once the setsid one has left (it says so from its new session).
    let script = "left=${TMPDIR:-/tmp}/left-424243; rm -f $left; sleep 424241 & sleep 424242 & \
                  setsid sh -c \"touch $left; exec sleep 424243\" & \
                  n=0; while [ ! -e $left ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; echo started";
    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", script]);
    assert_eq!(text(&out.stdout), "started\n", "{out:?}");
    assert!(out.status.success(), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "the CLI waited for the background processes");
    assert!(sleeping_becomes(424241, true, 10) && sleeping_becomes(424242, true, 10), "the background processes outlived the session");
    assert!(sleeping_becomes(424243, false, 10), "the setsid one went too");

    // An interactive shell on a terminal (the CLI on a pty): its background job is a
    // process group of its own in the shell's session.
    let on_a_pty = "import os, pty, sys; st = pty.spawn(sys.argv[1:]); print('exit=%d' % os.waitstatus_to_exitcode(st))";
    let out = Command::new("python3")
        .args(["-c", on_a_pty, BIN, "custom-jobs", "exec", id(&name), "--tty", "--", "bash", "-ic", "sleep 424244 & sleep 0.2; jobs -l; echo shell-done"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(text(&out.stdout).contains("shell-done") && text(&out.stdout).contains("exit=0"), "{out:?}");
    assert!(sleeping_becomes(424244, true, 10), "the shell's background job outlived the session");

    cancel(&s, &name);
    s.wait_terminal(&name, 60);
    assert!(sleeping_becomes(424243, true, 30), "the setsid process outlived its replica");
}

/// `port-forward LOCAL:REMOTE`: a local port reaches an HTTP server listening on the
/// replica's loopback, connections side by side, 3 MB unchanged; with `[replicas] network =
/// "job"` (a root server) that server is out of the host's reach and the forward still gets
/// there (a container: its own network, entered through its engine). A port where nothing
/// listens: the connection is closed and the CLI says why.
#[test]
fn port_forward_reaches_a_server_inside_the_replica() {
    let job_network = is_root() && !containers_backend();
    let s = Server::start(if job_network { "[replicas]\nnetwork = \"job\"\n" } else { "" });
    let remote = free_port();
    let script = format!(
        "d=$(mktemp -d) && echo forwarded-ok > $d/hello.txt && head -c 3000000 /dev/zero > $d/big && \
         exec python3 -m http.server {remote} --bind 127.0.0.1 --directory $d"
    );
    let job = s.create("p", &in_test_image(sh_job("web", &script)));
    let name = name_of(&job);
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let (mut fwd, local) = forwarder(&s, &name, remote);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10))).build().into();
    let get = move |path: &str| -> Result<Vec<u8>, String> {
        let mut r = agent.get(&format!("http://127.0.0.1:{local}{path}")).call().map_err(|e| e.to_string())?;
        r.body_mut().with_config().limit(10_000_000).read_to_vec().map_err(|e| e.to_string())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let hello = loop {
        match get("/hello.txt") {
            Ok(b) => break b,
            Err(e) => {
                assert!(Instant::now() < deadline, "the job's server never answered through the forward: {e}\n{}", s.logs_text(&name));
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert_eq!(text(&hello), "forwarded-ok\n");
    let parallel: Vec<_> = (0..4).map(|_| std::thread::spawn({
        let get = get.clone();
        move || get("/big")
    })).collect();
    for t in parallel {
        let big = t.join().expect("thread").expect("the big file");
        assert_eq!(big.len(), 3_000_000);
        assert!(big.iter().all(|b| *b == 0));
    }
    if job_network {
        let direct = std::net::TcpStream::connect_timeout(&std::net::SocketAddr::from(([127, 0, 0, 1], remote)), Duration::from_secs(2));
        assert!(direct.is_err(), "the job's network is its own: the host reaches none of its ports");
    }
    let _ = fwd.kill();
    let _ = fwd.wait();

    // Nothing listens there: the connection closes, and the CLI says why.
    let closed = free_port();
    let (mut fwd, local) = forwarder(&s, &name, closed);
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build().into();
    // The CLI's message comes from the connection's own task, which may write it just after
    // the connection closed: read until it comes.
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let stderr = fwd.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let got = agent.get(&format!("http://127.0.0.1:{local}/")).call();
    assert!(got.is_err(), "{got:?}");
    let want = format!("nothing answers on port {closed}");
    let mut said = Vec::new();
    while !said.iter().any(|l: &String| l.contains(&want)) {
        match lines.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => said.push(line),
            Err(_) => panic!("the CLI never said {want:?}: {said:?}"),
        }
    }
    let _ = fwd.kill();
    let _ = fwd.wait();
    cancel(&s, &name);
}

/// L14: a session counts against its replica's memory: a command that allocates past the
/// replica's limit is the one killed (the CLI says so, 137), the replica goes on, and when
/// its program later fails for a reason of its own (told by a file the session leaves in
/// the working directory they share), the job's error is that reason, not an
/// OOM (the session's kill is written down as the session's).
#[test]
fn l14_a_sessions_oom_kill_is_the_sessions_not_the_jobs() {
    if skip_in_containers("a container's memory is its engine's") || (!is_root() && trainyard_backend::skip_test("memory cgroups need a root server")) {
        return;
    }
    let s = Server::start("[[machine_types]]\nname = \"tiny-1\"\nvcpus = 1\nmemory_gb = 0.25\n");
    let mut body = sh_job("small", "echo ready; while [ ! -e fail-now ]; do sleep 0.2; done; exit 3");
    body["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"] = Value::String("tiny-1".into());
    let job = s.create("p", &body);
    let name = name_of(&job);
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let out = exec_out(&s, "p", &[id(&name), "--", "python3", "-c", "b = bytearray(600 * 1024 * 1024); print(len(b))"]);
    assert_eq!(out.status.code(), Some(137), "{out:?}");
    assert!(text(&out.stderr).contains("past the replica's memory limit"), "{}", text(&out.stderr));
    assert_eq!(s.get(&name)["state"], "JOB_STATE_RUNNING", "the replica goes on");
    let out = exec_out(&s, "p", &[id(&name), "--", "touch", "fail-now"]);
    assert!(out.status.success(), "{out:?}");
    let done = s.wait_terminal(&name, 60);
    assert_eq!(done["state"], "JOB_STATE_FAILED", "{done:#}");
    let message = done["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("status of 3") && !message.contains("memory"), "the program's own failure, not an OOM: {message}");
}

/// A server that stops (SIGTERM: a restart or a shutdown) ends its open sessions, each
/// told why, and leaves the replica running: the restarted server adopts it, and a new
/// session enters it.
#[test]
fn a_stopping_server_ends_its_sessions_with_a_message_and_leaves_the_replica() {
    let mut s = Server::start("");
    let (name, _) = viewer(&s, "p");
    let mut session = ticking_session(&s, &name);
    let pid = s.pid().expect("the server's pid") as i32;
    // SAFETY: kill(2) of the test's own server process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = ended(&mut session, 30, "the session outlived its server");
    let mut err = String::new();
    std::io::Read::read_to_string(session.stderr.as_mut().expect("stderr"), &mut err).expect("stderr");
    assert_eq!(status.code(), Some(255), "{err}");
    assert!(err.contains("The server is stopping") && err.contains("the replica goes on"), "{err}");
    // The server is gone; its replica is not.
    if let Some(mut c) = s.child.take() {
        let _ = c.wait();
    }
    s.spawn();
    assert_eq!(s.get(&name)["state"], "JOB_STATE_RUNNING");
    let out = exec_out(&s, "p", &[id(&name), "--", "echo", "back"]);
    assert_eq!(text(&out.stdout), "back\n", "{out:?}");
    cancel(&s, &name);
}

/// No session inherits another's terminal: while a terminal session is open (script(1)
/// gives the CLI a terminal), a second session's command holds no descriptor of it (the
/// server makes both ends of every session's terminal close-on-exec from the start).
#[test]
fn a_session_holds_no_descriptor_of_another_sessions_terminal() {
    let s = Server::start("");
    let (name, _) = viewer(&s, "p");
    let cmd = format!("{BIN} custom-jobs exec {} --tty -- sleep 60", id(&name));
    let mut tty = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux)");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = ureq::get(&s.url("/metrics")).call().expect("metrics").into_body().read_to_string().expect("text");
        if metrics.lines().any(|l| l == "trainyard_exec_sessions_open 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the terminal session never opened:\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = exec_out(&s, "p", &[id(&name), "--", "sh", "-c", "for f in /proc/$$/fd/*; do echo \"$f -> $(readlink $f)\"; done"]);
    let fds = text(&out.stdout);
    assert!(out.status.success() && fds.contains("/proc/"), "{out:?}");
    assert!(!fds.contains("ptmx") && !fds.contains("/dev/pts"), "another session's terminal leaked in:\n{fds}");
    let _ = tty.kill();
    let _ = tty.wait();
    cancel(&s, &name);
}
