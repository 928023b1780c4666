//! Hostile and broken HTTP clients against a real server: slow request heads, trickled
//! bodies, idle keep-alive connections, more connections than the cap, no file descriptor
//! left, a shutdown with a log stream open, and a job whose files no recursive walk survives.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

fn connect(s: &Server) -> TcpStream {
    TcpStream::connect(("127.0.0.1", s.port)).expect("connect")
}

/// What a raw connection saw: its bytes, and whether (and when) the server closed it.
struct Seen {
    bytes: Vec<u8>,
    closed_after: Option<Duration>,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Read for up to `max`, until the server closes the connection or `enough` holds of what
/// came in.
fn read_for(t: &mut TcpStream, max: Duration, enough: impl Fn(&[u8]) -> bool) -> Seen {
    let t0 = Instant::now();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = max.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Seen { bytes, closed_after: None };
        }
        t.set_read_timeout(Some(left.min(Duration::from_millis(100)))).expect("timeout");
        match t.read(&mut buf) {
            Ok(0) => return Seen { bytes, closed_after: Some(t0.elapsed()) },
            Ok(n) => {
                bytes.extend_from_slice(&buf[..n]);
                if enough(&bytes) {
                    return Seen { bytes, closed_after: None };
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return Seen { bytes, closed_after: Some(t0.elapsed()) }
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// A whole `/healthz` response has come in.
fn healthz_done(b: &[u8]) -> bool {
    b.windows(6).any(|w| w == b"\r\n\r\nok")
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// A client that sends half a request line and then nothing is closed after the header
/// timeout, and so are one that sends nothing and one that trickles its head byte by byte;
/// meanwhile other clients are served at once.
#[test]
fn slow_request_heads_are_closed_after_the_header_timeout_while_others_are_served() {
    let s = Server::start("[http]\nheader_timeout_secs = 1\nidle_timeout_secs = 30\n");
    let half = {
        let mut t = connect(&s);
        t.write_all(b"GET /heal").expect("write");
        std::thread::spawn(move || read_for(&mut t, Duration::from_secs(10), |_| false))
    };
    let silent = {
        let mut t = connect(&s);
        std::thread::spawn(move || read_for(&mut t, Duration::from_secs(10), |_| false))
    };
    let trickle = {
        let mut t = connect(&s);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            for b in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
                if t.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
                if t0.elapsed() > Duration::from_secs(6) {
                    break;
                }
            }
            let rest = read_for(&mut t, Duration::from_secs(5), |_| false);
            (t0.elapsed(), rest)
        })
    };
    // Others are served at once all along.
    let t0 = Instant::now();
    let mut served = 0;
    while t0.elapsed() < Duration::from_millis(2500) {
        let t1 = Instant::now();
        let (status, _) = s.call("GET", &s.url("/healthz"), None);
        assert_eq!(status, 200);
        assert!(t1.elapsed() < Duration::from_secs(2), "a normal client waited {:?}", t1.elapsed());
        served += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(served >= 10, "{served}");
    for (what, seen) in [("half a request line", half.join().expect("half")), ("nothing", silent.join().expect("silent"))] {
        let after = seen.closed_after.unwrap_or_else(|| panic!("a client that sent {what} was never closed"));
        eprintln!("a client that sent {what} was closed after {after:?}");
        assert!(after >= Duration::from_millis(800) && after < Duration::from_secs(3), "{what}: {after:?}");
        assert!(seen.bytes.is_empty() || seen.text().starts_with("HTTP/1.1 408"), "{}", seen.text());
    }
    let (took, seen) = trickle.join().expect("trickle");
    eprintln!("a client that trickled its head was closed after {took:?}");
    assert!(took < Duration::from_secs(4), "the trickled head held the connection for {took:?}");
    assert!(!healthz_done(&seen.bytes), "{}", seen.text());
}

/// A keep-alive connection is reused within the idle timeout (longer than the header
/// timeout) and closed once idle for longer.
#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let s = Server::start("[http]\nheader_timeout_secs = 1\nidle_timeout_secs = 3\n");
    let mut t = connect(&s);
    t.write_all(HEALTHZ).expect("write");
    let first = read_for(&mut t, Duration::from_secs(5), healthz_done);
    assert!(healthz_done(&first.bytes), "{}", first.text());
    // Idle past the header timeout, but within the idle timeout: still open, still served.
    std::thread::sleep(Duration::from_millis(1800));
    t.write_all(HEALTHZ).expect("write again");
    let second = read_for(&mut t, Duration::from_secs(5), healthz_done);
    assert!(healthz_done(&second.bytes), "the connection was closed before the idle timeout: {}", second.text());
    let closed = read_for(&mut t, Duration::from_secs(10), |_| false);
    let after = closed.closed_after.expect("an idle connection was never closed");
    eprintln!("an idle keep-alive connection was closed after {after:?}");
    assert!(after >= Duration::from_millis(2500) && after < Duration::from_secs(5), "{after:?}");
}

/// A request body trickled byte by byte is cut at the body timeout: the request fails with
/// 400 saying why, and the connection is closed.
#[test]
fn a_trickled_body_is_cut_after_the_body_timeout() {
    let s = Server::start("[http]\nheader_timeout_secs = 1\nbody_timeout_secs = 2\n");
    let mut t = connect(&s);
    let head = "POST /v1/projects/p/locations/us-central1/customJobs HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    t.write_all(head.as_bytes()).expect("head");
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let mut closed = None;
    let mut writing = true;
    while t0.elapsed() < Duration::from_secs(10) {
        if writing && t.write_all(b" ").is_err() {
            writing = false;
        }
        let r = read_for(&mut t, Duration::from_millis(200), |_| false);
        seen.extend_from_slice(&r.bytes);
        if r.closed_after.is_some() {
            closed = Some(t0.elapsed());
            break;
        }
    }
    let text = String::from_utf8_lossy(&seen);
    let closed = closed.unwrap_or_else(|| panic!("the trickled body held the connection: {text}"));
    eprintln!("a trickled body was cut after {closed:?}");
    assert!(closed >= Duration::from_millis(1500) && closed < Duration::from_secs(5), "{closed:?}");
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("did not arrive within 2 s"), "{text}");
    // The server is fine.
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
}

/// More connections than the cap: the extra ones wait (the server neither fails nor
/// serves them), and once the others close the waiting request is served.
#[test]
fn connections_beyond_the_cap_wait_and_are_served_once_others_close() {
    let mut s = Server::start("[http]\nmax_connections = 4\nheader_timeout_secs = 60\nidle_timeout_secs = 60\n");
    let hogs: Vec<TcpStream> = (0..24).map(|_| connect(&s)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut waiting = connect(&s);
    waiting.write_all(HEALTHZ).expect("write");
    let early = read_for(&mut waiting, Duration::from_millis(1500), healthz_done);
    assert!(!healthz_done(&early.bytes) && early.closed_after.is_none(), "served beyond the cap: {}", early.text());
    assert!(s.child.as_mut().expect("server").try_wait().expect("try_wait").is_none(), "the server died");
    assert!(s.server_log().contains("connections open, the limit"), "{}", s.server_log());
    let t0 = Instant::now();
    drop(hogs);
    let later = read_for(&mut waiting, Duration::from_secs(10), healthz_done);
    assert!(healthz_done(&later.bytes), "not served after the others closed: {}", later.text());
    eprintln!("the waiting request was served {:?} after the others closed", t0.elapsed());
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
}

/// CPU time (user + system, in clock ticks) of a process so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = stat.rsplit_once(')').expect("comm").1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted after the command name from field 3.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// No file descriptor left: accept fails with EMFILE; the server backs off instead of
/// spinning, stays up, and serves again once descriptors are free.
#[test]
fn accept_errors_from_fd_exhaustion_back_off_and_the_server_recovers() {
    let mut s = Server::start("[http]\nheader_timeout_secs = 60\nidle_timeout_secs = 60\n");
    s.kill9();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(s.dir.path().join("server.log")).expect("log");
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{}", s.port), "--config"])
        .arg(&s.config)
        .arg("--data-dir")
        .arg(s.data_dir())
        .env_remove("TRAINYARD_CONFIG")
        .current_dir(s.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            l.rlim_cur = 64;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    s.child = Some(cmd.spawn().expect("spawn"));
    let pid = s.child.as_ref().expect("child").id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err() {
        assert!(Instant::now() < deadline, "no server:\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
    // More connections than the server has descriptors for.
    let hogs: Vec<TcpStream> = (0..120).map(|_| connect(&s)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(pid) - before;
    eprintln!("CPU time of the server over 2 s without descriptors: {spent} ticks");
    assert!(spent < 20, "the server spins on accept errors: {spent} ticks in 2 s");
    assert!(s.child.as_mut().expect("server").try_wait().expect("try_wait").is_none(), "the server died:\n{}", s.server_log());
    let log = s.server_log();
    assert!(log.contains("cannot accept connections") && log.contains("Too many open files"), "{log}");
    assert!(log.matches("cannot accept connections").count() <= 2, "the warning is rate-limited:\n{log}");
    let t0 = Instant::now();
    drop(hogs);
    loop {
        let mut t = connect(&s);
        t.write_all(HEALTHZ).expect("write");
        if healthz_done(&read_for(&mut t, Duration::from_secs(2), healthz_done).bytes) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "not served again:\n{}", s.server_log());
    }
    eprintln!("served again {:?} after the descriptors were freed", t0.elapsed());
}

/// SIGTERM with a request in flight and a `follow=true` log stream open: the request
/// finishes, the stream is cut after the grace period, and the server exits 0.
#[test]
fn shutdown_finishes_requests_in_flight_and_does_not_wait_for_ever_on_log_streams() {
    let mut s = Server::start("[http]\nshutdown_grace_secs = 2\n");
    let j = s.create("p", &sh_job("long", "echo started; sleep 300"));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let mut follow = connect(&s);
    write!(follow, "GET /v1/{name}/logs?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("write");
    let head = read_for(&mut follow, Duration::from_secs(5), |b| b.windows(4).any(|w| w == b"\r\n\r\n"));
    assert!(head.text().starts_with("HTTP/1.1 200"), "{}", head.text());
    // A create whose body is half sent when the signal comes.
    let body = sh_job("in-flight", "true").to_string();
    let (a, b) = body.as_bytes().split_at(body.len() / 2);
    let mut create = connect(&s);
    write!(
        create,
        "POST /v1/projects/p/locations/us-central1/customJobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("head");
    create.write_all(a).expect("first half");
    std::thread::sleep(Duration::from_millis(200));
    let mut child = s.child.take().expect("server");
    let t0 = Instant::now();
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    std::thread::sleep(Duration::from_millis(300));
    create.write_all(b).expect("second half");
    let created = read_for(&mut create, Duration::from_secs(5), |b| b.ends_with(b"}"));
    assert!(created.text().starts_with("HTTP/1.1 200"), "the request in flight did not finish: {}", created.text());
    assert!(created.text().contains("in-flight"), "{}", created.text());
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the server did not stop with a log stream open:\n{}", s.server_log());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    eprintln!("the server stopped {took:?} after SIGTERM with a log stream open");
    assert!(status.success(), "{status}\n{}", s.server_log());
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(6), "{took:?}");
    let rest = read_for(&mut follow, Duration::from_secs(2), |_| false);
    assert!(rest.closed_after.is_some(), "the log stream was not closed");
    // Nothing listens any more.
    assert!(TcpStream::connect(("127.0.0.1", s.port)).is_err());
    assert!(s.server_log().contains("still busy"), "{}", s.server_log());
}

/// A job's work directory holding a tree 20,000 levels deep (one line of Python): the
/// ended job's delete removes it without recursion (`remove_dir_all` overflowed the purge
/// thread's stack and aborted the server, and every restart again, since the purge is a
/// pending effect), the server goes on answering, and starts again.
#[test]
fn a_tree_deeper_than_any_stack_is_deleted_and_the_server_lives() {
    let mut s = Server::start("");
    let deep = "import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(20000):\n    os.mkdir('d', dir_fd=fd)\n    \
                nfd = os.open('d', os.O_RDONLY, dir_fd=fd)\n    os.close(fd)\n    fd = nfd\nprint('deep tree made')\n";
    let job = json!({"displayName": "deep", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", deep]}}]}});
    let name = name_of(&s.create("p", &in_test_image(job)));
    let done = s.wait_terminal(&name, 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done}\n{}", s.logs_text(&name));
    let runs = s.data_dir().join("runs").join(id_of(&done).to_string());
    assert!(runs.exists());
    let (status, body) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs.exists() {
        assert!(Instant::now() < deadline, "the deep tree is still there\n{}", s.server_log());
        let (status, _) = s.call("GET", &s.url("/healthz"), None);
        assert_eq!(status, 200, "the server stopped answering:\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none()), "the server exited:\n{}", s.server_log());
    s.restart();
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
}

/// What a hostile job makes in every directory of its own the server later looks into:
/// for each seed, a random tree of directories, links (to a canary outside, to `/`, to
/// the data directory, to themselves), FIFOs and sockets (some at the names the server
/// opens: `.trainyard-ready`, `output.metrics`, `log.jsonl`), 255-byte names and a chain
/// 300 levels deep.
const RANDOM_TREES: &str = r#"
import os, random, socket, sys
targets = [os.environ["CANARY"], os.path.join(os.environ["CANARY"], "canary"), "/", "..", "../../..", ".", os.environ["DATA"], "/etc/passwd"]
names = [".trainyard-ready", "output.metrics", "log.jsonl", "checkpoint", "model.pt", "x" * 255]
def tree(root, seed):
    rng = random.Random(seed)
    dirs = [root]
    for i in range(300):
        d = rng.choice(dirs)
        name = rng.choice(names) if rng.random() < 0.3 else f"e{i}-{rng.randrange(10**6)}"
        p = os.path.join(d, name)
        if os.path.lexists(p):
            continue
        kind = rng.randrange(6)
        try:
            if kind == 0:
                os.mkdir(p); dirs.append(p)
            elif kind == 1:
                os.symlink(rng.choice(targets), p)
            elif kind == 2:
                os.mkfifo(p)
            elif kind == 3:
                s = socket.socket(socket.AF_UNIX); s.bind(p); s.close()
            else:
                with open(p, "wb") as f:
                    f.write(os.urandom(rng.randrange(1, 4096)))
        except OSError as e:
            print("skipped", p[-40:], e, file=sys.stderr)
    fd = os.open(root, os.O_RDONLY)
    for _ in range(300):
        try:
            os.mkdir("deep", dir_fd=fd)
        except FileExistsError:
            pass
        nfd = os.open("deep", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = nfd
    os.symlink(os.environ["CANARY"], "escape", dir_fd=fd)
    os.mkfifo("output.metrics", dir_fd=fd)
    os.close(fd)
roots = [os.getcwd(), os.environ["HOME"], os.environ["AIP_CHECKPOINT_DIR"], os.environ["AIP_MODEL_DIR"], "/gcs/fz-bucket/junk"]
for seed in range(int(os.environ["SEEDS"])):
    for r in roots:
        d = os.path.join(r, f"seed{seed}")
        os.makedirs(d, exist_ok=True)
        tree(d, seed)
print("TREES DONE", flush=True)
"#;

/// A tenant's random trees of directories, links, FIFOs, sockets, long names and deep
/// paths in every place of its own the server reads (work, home, checkpoints, model, a
/// bucket), then every server action on them: the checkpoint scan, storage listings and
/// reads, the storage usage walk, logs, cancel, delete and purge, a restart. The server
/// answers throughout (another project's creates never stall), answers no 5xx, and never
/// touches what the links point to.
#[test]
fn a_tenants_random_trees_cannot_stall_crash_or_lead_the_server_outside() {
    let mut s = Server::prepare("[quotas.projects.hostile]\nstorage_gb = 100\n");
    let text = config_text("[quotas.projects.hostile]\nstorage_gb = 100\n").replace("[lifecycle]\n", "[lifecycle]\ncheckpoint_warning_secs = 1\n");
    std::fs::write(&s.config, text).unwrap();
    s.spawn();
    let canary = tempfile::tempdir().unwrap();
    // Readable by the job (so that its links lead somewhere), writable by root only: what
    // changes there, the server did.
    std::fs::set_permissions(canary.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(canary.path().join("canary"), b"untouched").unwrap();
    let (status, body) = s.call("POST", &s.url("/storage/v1/b?project=hostile"), Some(&json!({"name": "fz-bucket"}).to_string()));
    assert_eq!(status, 200, "{body}");

    // Another project's creates, timed, all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (stop, api) = (std::sync::Arc::clone(&stop), s.api());
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t0 = Instant::now();
                match api.try_call("POST", &api.jobs_url("calm"), Some(&sh_job("calm", "true").to_string())) {
                    Ok((200, _)) => {}
                    other => panic!("another project's create failed: {other:?}"),
                }
                worst = worst.max(t0.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            (n, worst)
        })
    };

    let mut job = sh_job("trees", "");
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"] = json!({
        "imageUri": "python:3.11",
        "command": ["sh", "-c", "python3 -c \"$TREES\" && sleep 600"],
        "env": [
            {"name": "TREES", "value": RANDOM_TREES},
            {"name": "CANARY", "value": canary.path().display().to_string()},
            {"name": "DATA", "value": s.data_dir().display().to_string()},
            {"name": "SEEDS", "value": "3"},
        ]
    });
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://fz-bucket/out"});
    let created = s.create("hostile", &in_test_image(job));
    let name = name_of(&created);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !s.logs_text(&name).contains("TREES DONE") {
        let job = s.get(&name);
        assert!(job["state"] == "JOB_STATE_RUNNING" || job["state"] == "JOB_STATE_PENDING" || job["state"] == "JOB_STATE_QUEUED", "{job:#}\n{}", s.logs_text(&name));
        assert!(Instant::now() < deadline, "the trees were never made:\n{}", s.logs_text(&name));
        std::thread::sleep(Duration::from_millis(250));
    }

    // Storage: listings (flat and by directory) and reads of what they list.
    let mut reads = 0;
    for delimiter in ["", "&delimiter=/"] {
        let mut token = String::new();
        for _ in 0..20 {
            let url = s.url(&format!("/storage/v1/b/fz-bucket/o?maxResults=200{delimiter}{token}"));
            let (status, body) = s.call("GET", &url, None);
            assert!(status < 500, "{status} {body}");
            for item in body["items"].as_array().into_iter().flatten().take(40) {
                let object = item["name"].as_str().unwrap_or_default();
                let enc: String = object.bytes().map(|b| format!("%{b:02X}")).collect();
                let (status, body) = s.call("GET", &s.url(&format!("/storage/v1/b/fz-bucket/o/{enc}")), None);
                assert!(status < 500, "{object}: {status} {body}");
                reads += 1;
            }
            match body["nextPageToken"].as_str() {
                Some(t) => token = format!("&pageToken={t}"),
                None => break,
            }
        }
    }
    assert!(reads > 0, "the listings showed nothing");
    // The storage usage walk (asked here; the watcher does it too) and the checkpoint
    // scan (on its own) end, whatever the trees.
    let (tx, rx) = std::sync::mpsc::channel();
    let api = s.api();
    std::thread::spawn(move || {
        let _ = tx.send(api.try_call("GET", &api.url("/v1/admin/quotas"), None));
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok((200, body))) => assert!(body.to_string().contains("storage_gb"), "{body}"),
        other => panic!("the quotas (a walk of the tenant's storage) did not answer within 30 s: {other:?}"),
    }
    std::thread::sleep(Duration::from_secs(3));
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name, 60);
    let (status, body) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(status, 200, "{body}");
    let runs = s.data_dir().join("runs").join(id_of(&created).to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs.exists() {
        assert!(Instant::now() < deadline, "the deleted job's files are still there\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (creates, worst) = probe.join().unwrap();
    assert!(creates > 5, "{creates} creates");
    // Not a benchmark (see trainyard-bench): a stall detector.
    assert!(worst < Duration::from_secs(2), "another project's create took {worst:?}");
    assert!(s.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none()), "the server exited:\n{}", s.server_log());
    s.restart();
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
    let (status, body) = s.call("GET", &s.url("/storage/v1/b/fz-bucket/o?maxResults=50"), None);
    assert!(status < 500, "{status} {body}");
    assert_eq!(std::fs::read(canary.path().join("canary")).unwrap(), b"untouched");
    assert_eq!(std::fs::read_dir(canary.path()).unwrap().count(), 1, "something was made in the canary directory");
    assert!(s.server_log().lines().all(|l| !l.contains("panicked")), "{}", s.server_log());
}

/// Stack dumps never hold up another tenant's observations: three jobs of one project
/// run six Python processes each that go silent (`trainyard-hang-after-secs=3`), and the
/// server's `py-spy` (a hostile stand-in here, on the server's PATH) writes more than a
/// pipe holds and never ends. The dumps run on the project's own dump threads, bounded
/// in time, so the other project's progress keeps being read meanwhile; the silent jobs'
/// logs get their processes' wait channels and no kernel stack.
#[test]
fn one_projects_stack_dumps_never_hold_up_another_projects_progress() {
    let mut s = Server::prepare("");
    let fake = s.dir.path().join("fake-bin");
    std::fs::create_dir_all(&fake).expect("mkdir");
    let calls = s.dir.path().join("py-spy-calls");
    let script = format!(
        "#!/bin/sh\necho \"$@\" >> {}\nhead -c 2000000 /dev/zero | tr '\\0' x\nexec sleep 600\n",
        calls.display()
    );
    std::fs::write(fake.join("py-spy"), script).expect("fake py-spy");
    std::fs::set_permissions(fake.join("py-spy"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let path = std::env::var("PATH").unwrap_or_default();
    s.env.push(("PATH".into(), format!("{}:{path}", fake.display())));
    s.spawn();
    let victim = s.create(
        "victim",
        &sh_job("steady", "i=0; while true; do i=$((i+1)); echo \"{\\\"step\\\": $i, \\\"total\\\": 1000000}\" >> \"$TRAINYARD_PROGRESS_FILE\"; sleep 0.2; done"),
    );
    let victim = name_of(&victim);
    s.wait_for(&victim, 60, |j| j["trainyardProgress"]["step"].is_string());
    let mut evil = Vec::new();
    for i in 0..3 {
        let mut job = sh_job(&format!("silent-{i}"), "for n in 1 2 3 4 5 6; do python3 -c 'import time; time.sleep(600)' & done; wait");
        job["labels"] = json!({"trainyard-hang-after-secs": "3"});
        evil.push(name_of(&s.create("evil", &job)));
    }
    // The victim's step as the API shows it, for 30 s of the attack.
    let t0 = Instant::now();
    let (mut changes, mut last, mut since, mut longest) = (0, String::new(), Instant::now(), Duration::ZERO);
    while t0.elapsed() < Duration::from_secs(30) {
        let step = s.get(&victim)["trainyardProgress"]["step"].as_str().unwrap_or("").to_string();
        if step != last {
            changes += 1;
            longest = longest.max(since.elapsed());
            since = Instant::now();
            last = step;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    longest = longest.max(since.elapsed());
    let dumps = std::fs::read_to_string(&calls).unwrap_or_default().lines().count();
    eprintln!("measure: {dumps} py-spy runs of the other project; the victim's progress changed {changes} times in 30 s, the longest still {longest:?} (read every 5 s)");
    assert!(dumps >= 3, "every silent job was dumped: {dumps} py-spy runs\n{}", s.server_log());
    // Read every 5 s: about 6 changes in 30 s. A blocked observing thread showed none.
    assert!(changes >= 3, "the victim's progress kept being read: {changes} changes, the longest still {longest:?}");
    // Every silent job's report comes with its dump, bounded and without kernel stacks. A
    // dump that waited its project's turn past its time says so (two run at once per
    // project: the third job's may find none left); at least one shows the processes.
    let mut shown = 0;
    for name in &evil {
        let until = Instant::now() + Duration::from_secs(60);
        let mut log = s.logs_text(name);
        while !log.contains("processes when its silence was reported") && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
            log = s.logs_text(name);
        }
        assert!(log.contains("processes when its silence was reported"), "{log}");
        if log.contains("(python3), state S") && log.contains("waiting in") {
            shown += 1;
        } else {
            assert!(log.contains("not dumped (out of time)"), "{log}");
        }
        assert!(!log.contains("[<0>]") && !log.contains("+0x"), "no kernel stack in a tenant's log:\n{log}");
        assert!(log.len() < 200_000, "the dump is bounded: {} bytes", log.len());
        s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    }
    assert!(shown >= 1, "no dump showed the silent processes");
    let metrics = ureq::get(&s.url("/metrics")).call().expect("metrics").into_body().read_to_string().expect("text");
    assert!(
        metrics.lines().any(|l| l.starts_with("trainyard_tenant_work_cpu_seconds_total{") && l.contains("project=\"evil\"") && l.contains("work=\"dump\"")),
        "the dumps' CPU time is counted for their project:\n{metrics}"
    );
    s.call("POST", &s.url(&format!("/v1/{victim}:cancel")), Some("{}"));
}
