//! A real `trainyard serve` on a free loopback port, in a temporary data directory, and an
//! HTTP client for it. Dropping the server stops it and every replica it started.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_trainyard");

pub struct Server {
    pub child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    agent: ureq::Agent,
    /// The data directory when it is not `<dir>/data` (e.g. a mounted file system).
    data: Option<PathBuf>,
    /// Another `trainyard` binary than this build's (e.g. an earlier release's).
    bin: Option<String>,
    /// In container mode, the data directory's own temporary directory: the test's
    /// directory is mounted into the containers, and the data directory may not be.
    data_tmp: Option<tempfile::TempDir>,
    /// Extra environment of the server process (e.g. a PATH with a fake nvidia-smi).
    pub env: Vec<(String, String)>,
    /// Start the server with this file open as descriptor 10, not close-on-exec, as a
    /// careless supervisor would leave it.
    pub inherit_fd10: Option<PathBuf>,
    /// Serve HTTPS (`--tls-auto`); the client trusts the server's CA.
    pub tls: bool,
}

/// A client that trusts the CA in `ca` (PEM).
pub fn tls_agent(ca: &Path) -> ureq::Agent {
    let pem = std::fs::read(ca).expect("the CA file");
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs))).build();
    ureq::Agent::config_builder().tls_config(tls).http_status_as_error(false).max_idle_connections(0).build().into()
}

/// Is `TRAINYARD_TEST_CONTAINERS=podman` asked for: every replica of the tests runs in
/// `test_image()` through podman, the test's directory mounted at its own path (the
/// tests' programs leave their markers there).
pub fn containers_backend() -> bool {
    std::env::var("TRAINYARD_TEST_CONTAINERS").is_ok_and(|v| v == "podman")
}

/// The image the tests' replicas run in, in container mode (`scripts/images/build.sh`).
pub fn test_image() -> String {
    std::env::var("TRAINYARD_TEST_IMAGE").unwrap_or_else(|_| "localhost/trainyard/python:test".into())
}

/// For a test that cannot hold in containers: prints why and returns true when it should
/// be skipped.
pub fn skip_in_containers(reason: &str) -> bool {
    if containers_backend() {
        eprintln!("SKIP in container mode: {reason}");
        return true;
    }
    false
}

/// In container mode, every `containerSpec.imageUri` of a job body becomes the test image
/// (the tests name placeholder images).
pub fn in_test_image(mut job: Value) -> Value {
    fn walk(v: &mut Value, image: &str) {
        match v {
            Value::Object(m) => {
                if let Some(c) = m.get_mut("containerSpec").and_then(Value::as_object_mut) {
                    c.insert("imageUri".into(), Value::String(image.to_string()));
                }
                if let Some(p) = m.get_mut("pythonPackageSpec").and_then(Value::as_object_mut) {
                    p.insert("executorImageUri".into(), Value::String(image.to_string()));
                }
                m.values_mut().for_each(|x| walk(x, image));
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, image)),
            _ => {}
        }
    }
    if containers_backend() {
        walk(&mut job, &test_image());
    }
    job
}

/// `trainyard serve` with `config` (a TOML text) in a fresh directory, which must refuse to
/// start: its stderr.
#[allow(dead_code)]
pub fn serve_refused(config: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("trainyard.toml");
    std::fs::write(&cfg, config).expect("config");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("running trainyard serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve started with {config:?}: {err}");
    err
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A config for tests: short grace period, optional extra TOML. With
/// `TRAINYARD_TEST_BACKEND=slurm` (and a reachable cluster) the Slurm backend is chosen.
pub fn config_text(extra: &str) -> String {
    // Top-level keys of `extra` must come before any table.
    let (head, mut tail) = if slurm_backend() { (SLURM_HEAD, slurm_table()) } else { ("", String::new()) };
    if postgres_store() && !extra.contains("[store]") {
        tail.push_str(&format!("[store]\nurl = \"{}\"\n", new_pg_store()));
    }
    let extra = with_own_uids(extra);
    format!("{head}{extra}\n[lifecycle]\ngrace_period_secs = 1\nstockout_backoff_secs = 1\n{tail}")
}

/// Is `TRAINYARD_TEST_STORE=postgres` asked for: every server of the tests keeps its
/// state in a PostgreSQL schema of its own, on the server `TRAINYARD_TEST_PG_URL` names
/// (scripts/pg/up.sh).
pub fn postgres_store() -> bool {
    std::env::var("TRAINYARD_TEST_STORE").is_ok_and(|v| v == "postgres")
}

/// The PostgreSQL the tests may use (`TRAINYARD_TEST_PG_URL`), if any.
pub fn pg_url() -> Option<String> {
    std::env::var("TRAINYARD_TEST_PG_URL").ok().filter(|u| !u.is_empty())
}

/// A store URL of a new, empty schema of its own on `TRAINYARD_TEST_PG_URL`.
pub fn new_pg_store() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let admin = pg_url().expect("TRAINYARD_TEST_STORE=postgres needs TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)");
    let schema = format!("e2e_{}_{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut c = postgres::Client::connect(&admin, postgres::NoTls).expect("connect to TRAINYARD_TEST_PG_URL");
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).expect("create a schema");
    let sep = if admin.contains('?') { '&' } else { '?' };
    format!("{admin}{sep}options=-csearch_path%3D{schema}")
}

/// Each server of a test process gets a range of project uids of its own (tests run side
/// by side: two servers giving the same uid to their first projects would make one test
/// count the other's processes as its own).
fn with_own_uids(extra: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10_000;
    let base = 300_000 + n * 100;
    let line = format!("uid_range = [{base}, {}]\n", base + 99);
    match extra.find("[replicas]\n") {
        Some(i) => {
            let at = i + "[replicas]\n".len();
            format!("{}{line}{}", &extra[..at], &extra[at..])
        }
        None => format!("{extra}\n[replicas]\n{line}"),
    }
}

const SLURM_HEAD: &str = "backend = \"slurm\"\n";

fn slurm_table() -> String {
    let partition = std::env::var("TRAINYARD_SLURM_PARTITION").unwrap_or_else(|_| "debug".into());
    let gpu = std::env::var("TRAINYARD_SLURM_GPU_PARTITION").unwrap_or_else(|_| "gpu".into());
    // fit_to_nodes: the development cluster's nodes (2 CPUs, 2000 MB) are smaller than
    // the machine types the tests ask for.
    format!("[slurm]\npartition = \"{partition}\"\ngpu_partition = \"{gpu}\"\nsqueue_interval_ms = 250\nfit_to_nodes = true\n")
}

/// Is `TRAINYARD_TEST_BACKEND=slurm` asked for?
pub fn slurm_requested() -> bool {
    std::env::var("TRAINYARD_TEST_BACKEND").is_ok_and(|v| v == "slurm")
}

/// Does a Slurm cluster answer (`sinfo`)? Needs `SLURM_CONF` from `scripts/slurm/up.sh`.
pub fn slurm_cluster_up() -> bool {
    static UP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *UP.get_or_init(|| {
        Command::new("sinfo").arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

/// Are the tests running on the Slurm backend? Asked for and the cluster is up; asked for
/// and the cluster is missing fails in CI (`CI=true`) and falls back to the local
/// backend, with a printed reason, elsewhere.
pub fn slurm_backend() -> bool {
    if !slurm_requested() {
        return false;
    }
    if slurm_cluster_up() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("TRAINYARD_TEST_BACKEND=slurm but no Slurm cluster answers (run `eval \"$(scripts/slurm/up.sh)\"`)");
    }
    eprintln!("SKIP slurm: TRAINYARD_TEST_BACKEND=slurm but no Slurm cluster answers; running on the local backend");
    false
}

/// For a test that cannot hold on Slurm: prints why and returns true when it should be
/// skipped.
pub fn skip_on_slurm(reason: &str) -> bool {
    if slurm_backend() {
        eprintln!("SKIP on the Slurm backend: {reason}");
        return true;
    }
    false
}

/// The Slurm job ids of every run under a data directory (`runs/**/slurm.json`).
pub fn slurm_job_ids(data: &Path) -> Vec<u64> {
    fn walk(dir: &Path, depth: u32, out: &mut Vec<u64>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == "slurm.json") {
                if let Ok(text) = std::fs::read_to_string(&p) {
                    if let Some(id) = serde_json::from_str::<Value>(&text).ok().and_then(|v| v["job_id"].as_u64()) {
                        out.push(id);
                    }
                }
            } else if depth > 0 && p.is_dir() {
                walk(&p, depth - 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&data.join("runs"), 5, &mut out);
    out
}

impl Server {
    pub fn start(extra_config: &str) -> Server {
        let mut s = Server::prepare(extra_config);
        s.spawn();
        s
    }

    /// A server with its config written and its port chosen, not started yet (`spawn`
    /// starts it): for tests that prepare the data directory first.
    pub fn prepare(extra_config: &str) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        // Replicas of a root server run as per-project users: they pass through here to
        // their own directories below the data directory, and tests' replicas leave
        // markers here (sticky and open to all, as /tmp; escape_e2e makes it 0711).
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("chmod tempdir");
        let config = dir.path().join("trainyard.toml");
        let mut text = config_text(extra_config);
        let data_tmp = containers_backend().then(|| {
            let t = tempfile::tempdir().expect("tempdir");
            std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
            t
        });
        if containers_backend() && !text.contains("[containers]") {
            let d = dir.path().display();
            text.push_str(&format!("[containers]\nengine = \"podman\"\npull = \"never\"\nmounts = [\"{d}:{d}\"]\n"));
        }
        std::fs::write(&config, text).expect("config");
        // No connection reuse: a server may close a connection after an error response.
        let agent: ureq::Agent =
            ureq::Agent::config_builder().http_status_as_error(false).max_idle_connections(0).build().into();
        let data = data_tmp.as_ref().map(|t| t.path().join("data"));
        Server { child: None, port: free_port(), dir, config, agent, data, bin: None, data_tmp, env: Vec::new(), inherit_fd10: None, tls: false }
    }

    /// Before the first `spawn`: keep the data in `data` instead of `<dir>/data`.
    pub fn with_data_dir(mut self, data: PathBuf) -> Server {
        assert!(self.child.is_none(), "the data directory is chosen before the server starts");
        self.data = Some(data);
        self
    }

    /// A server of another binary (an earlier release's), or of this build's with None.
    pub fn start_with_bin(bin: Option<String>, extra_config: &str) -> Server {
        let mut s = Server::prepare(extra_config);
        s.bin = bin;
        s.spawn();
        s
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL the server and start it again on the same port, config and data directory;
    /// returns how long the new process took to answer /healthz.
    pub fn restart(&mut self) -> Duration {
        self.kill9();
        let t0 = Instant::now();
        self.spawn();
        t0.elapsed()
    }

    /// A client of this server for other threads: it outlives restarts (same port, unless
    /// another server took it meanwhile) and never panics on a transport error.
    pub fn api(&self) -> Api {
        Api::new(self.port)
    }

    /// A server on the built-in defaults (no config file at all).
    pub fn start_builtin() -> Server {
        let mut s = Server::start("");
        s.kill9();
        let _ = std::fs::remove_file(&s.config);
        s.spawn();
        s
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.clone().unwrap_or_else(|| self.dir.path().join("data"))
    }

    /// Start (or start again) the server process and wait until it answers.
    pub fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// As `spawn`, but a server that exits at start or does not answer within 30 s is an
    /// error (with the server log), not a panic. The process is reaped in both cases.
    pub fn try_spawn(&mut self) -> Result<(), String> {
        // A restarted server binds the port its first run had, which another test's server
        // may have taken meanwhile (a port is free only while nobody holds it): then this
        // one cannot listen, and the other one's /healthz must not pass for it. A start
        // counts once this server logged that it serves; one that could not bind is
        // started again on a new port.
        for _ in 0..5 {
            match self.spawn_once() {
                Err(e) if e.contains("cannot listen on") => self.port = free_port(),
                other => return other,
            }
        }
        Err(format!("no free port to listen on:\n{}", self.server_log()))
    }

    fn spawn_once(&mut self) -> Result<(), String> {
        const SERVING: &str = "Trainyard serving region";
        let served_before = self.server_log().matches(SERVING).count();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("log");
        let mut command = Command::new(self.bin.as_deref().unwrap_or(BIN));
        if let Some(path) = &self.inherit_fd10 {
            use std::os::fd::IntoRawFd;
            use std::os::unix::process::CommandExt;
            let fd = std::fs::File::open(path).expect("open the file to inherit").into_raw_fd();
            // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs in the child.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(fd, 10) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::fcntl(10, libc::F_SETFD, 0);
                    Ok(())
                });
            }
        }
        let child = command
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(if self.config.exists() { vec!["--config".into(), self.config.clone().into_os_string()] } else { vec![] })
            .env_remove("TRAINYARD_CONFIG")
            // Host processes unless the config says otherwise (container mode does).
            .env("TRAINYARD_CONTAINER_ENGINE", "none")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(if self.tls { vec!["--tls-auto"] } else { vec![] })
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ca = self.data_dir().join("tls/ca.pem");
            if self.tls && ca.exists() {
                self.agent = tls_agent(&ca);
            }
            // Bounded: whoever holds the port may never answer.
            let probe = self.agent.get(&self.url("/healthz"));
            if let Ok(r) = probe.config().timeout_global(Some(Duration::from_secs(2))).build().call() {
                if r.status() == 200 && self.server_log().matches(SERVING).count() > served_before {
                    return Ok(());
                }
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(format!("server exited at start ({status}):\n{}", self.server_log()));
                }
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(format!("server did not come up:\n{}", self.server_log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// SIGKILL the server (its replicas' shims live on).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}{path}", self.port)
    }

    pub fn jobs_url(&self, project: &str) -> String {
        self.url(&format!("/v1/projects/{project}/locations/us-central1/customJobs"))
    }

    /// (status, body as JSON or Null).
    pub fn call(&self, method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
        self.call_raw(method, url, body.map(|b| b.as_bytes().to_vec()), "application/json")
    }

    /// A request with raw bytes and a content type of the caller's choice.
    pub fn call_raw(&self, method: &str, url: &str, body: Option<Vec<u8>>, content_type: &str) -> (u16, Value) {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        if body.is_some() {
            req = req.header("Content-Type", content_type);
        }
        let sent = match body {
            Some(b) => self.agent.run(req.body(b).expect("request")),
            None => self.agent.run(req.body(()).expect("request")),
        };
        let mut resp = sent.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub fn create(&self, project: &str, job: &Value) -> Value {
        let job = in_test_image(job.clone());
        let (status, body) = self.call("POST", &self.jobs_url(project), Some(&job.to_string()));
        assert_eq!(status, 200, "create failed: {body}");
        body
    }

    pub fn get(&self, name: &str) -> Value {
        let (status, body) = self.call("GET", &self.url(&format!("/v1/{name}")), None);
        assert_eq!(status, 200, "get {name}: {body}");
        body
    }

    /// Poll the job until `pred` holds; panics with the job and the server log at the deadline.
    pub fn wait_for(&self, name: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let j = self.get(name);
            if pred(&j) {
                return j;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting on {name}: {j:#}\nlogs:\n{}\nserver log:\n{}", self.logs_text(name), self.server_log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_terminal(&self, name: &str, secs: u64) -> Value {
        self.wait_for(name, secs, |j| {
            matches!(j["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED"))
        })
    }

    /// The job's log entries (the logs extension), as JSON values.
    pub fn logs(&self, name: &str) -> Vec<Value> {
        let mut resp = self.agent.get(&self.url(&format!("/v1/{name}/logs"))).call().expect("logs");
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    pub fn logs_text(&self, name: &str) -> String {
        self.logs(name)
            .iter()
            .map(|e| format!("{} {}: {}", e["replica"].as_str().unwrap_or(""), e["stream"].as_str().unwrap_or(""), e["text"].as_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A failing test shows what the server said (why it exited, what it refused).
        if std::thread::panicking() {
            let log = self.server_log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- server log (last {} lines) ---", tail.len());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        self.kill9();
        // Slurm: cancel every job of this data directory (a no-op for ended ones).
        let ids = slurm_job_ids(&self.data_dir());
        if !ids.is_empty() {
            let _ = Command::new("scancel")
                .args(ids.iter().map(|i| i.to_string()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // Stop every shim of this data directory (SIGTERM: they stop their programs).
        let marker = self.data_dir().display().to_string();
        for pid in pids_with(&marker) {
            // SAFETY: kill(2) has no memory effects.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pids_with(&marker).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // What the server mounted in its data directory and keeps across its restarts (a
        // job's network namespace): detached, or it outlives the test's directory, and
        // every mount namespace made on this host afterwards (one per replica) copies it.
        unmount_under(&self.data_dir());
    }
}

/// Detaches every mount at or below `dir`, deepest first (as root; otherwise nothing is
/// mounted there by a server).
pub fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut points: Vec<String> = trainyard_backend::netns::mount_points(&info).filter(|p| Path::new(p).starts_with(dir)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Pids of live processes whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<i32> {
    procs_with(needle).into_iter().map(|(pid, _)| pid).collect()
}

/// Live processes (not zombies, not this test process) whose command line, its arguments
/// joined by spaces, contains `needle`: (pid, arguments).
pub fn procs_with(needle: &str) -> Vec<(i32, Vec<String>)> {
    let mut out = Vec::new();
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<String> =
            raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let cmd = args.join(" ");
        // A zombie has an empty cmdline; only live processes count.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && cmd.contains(needle) {
            out.push((pid, args));
        }
    }
    out
}

/// SIGKILL one process; false when it was already gone.
pub fn sigkill(pid: i32) -> bool {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

/// Everything under `root` (itself included, links not followed) is its owner's alone: no
/// file other users may read or write, no directory they may list or write (passing
/// through, the search bit, is allowed: the data directory is 0711 for the replicas'
/// users). Panics naming each that is not.
pub fn assert_private_tree(root: &Path) {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let mut open = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
        let mode = m.permissions().mode() & 0o7777;
        let t = m.file_type();
        let bad = if t.is_dir() { 0o066 } else if t.is_symlink() || t.is_socket() { 0 } else { 0o077 };
        if mode & bad != 0 {
            open.push(format!("{} ({mode:04o})", p.display()));
        }
        if t.is_dir() {
            todo.extend(std::fs::read_dir(&p).into_iter().flatten().flatten().map(|e| e.path()));
        }
    }
    assert!(open.is_empty(), "open to other users under {}:\n{}", root.display(), open.join("\n"));
}

/// Is this test running as root (mounts, cgroups)?
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) has no effects.
    unsafe { libc::geteuid() == 0 }
}

/// A client of one server port for any thread: requests time out after 10 s, and a
/// transport error (server down, connection reset) is an `Err` with its text.
#[derive(Clone)]
pub struct Api {
    pub port: u16,
    agent: ureq::Agent,
}

impl Api {
    pub fn new(port: u16) -> Api {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Api { port, agent }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn jobs_url(&self, project: &str) -> String {
        self.url(&format!("/v1/projects/{project}/locations/us-central1/customJobs"))
    }

    /// (status, body as JSON or Null), or the transport error.
    pub fn try_call(&self, method: &str, url: &str, body: Option<&str>) -> Result<(u16, Value), String> {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let sent = match body {
            Some(b) => self.agent.run(req.body(b.as_bytes().to_vec()).map_err(|e| e.to_string())?),
            None => self.agent.run(req.body(()).map_err(|e| e.to_string())?),
        };
        let mut resp = sent.map_err(|e| format!("{method} {url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| format!("{method} {url}: reading the body: {e}"))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// The job's log entries (NDJSON), or the transport error.
    pub fn try_logs(&self, name: &str) -> Result<Vec<Value>, String> {
        let url = self.url(&format!("/v1/{name}/logs"));
        let mut resp = self.agent.get(&url).call().map_err(|e| format!("GET {url}: {e}"))?;
        let text = resp.body_mut().read_to_string().map_err(|e| format!("GET {url}: {e}"))?;
        Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
    }
}

/// A one-pool CustomJob running `sh -c SCRIPT`.
pub fn sh_job(name: &str, script: &str) -> Value {
    json!({
        "displayName": name,
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", script]}
        }]}
    })
}

pub fn name_of(job: &Value) -> String {
    job["name"].as_str().expect("name").to_string()
}

pub fn id_of(job: &Value) -> u64 {
    name_of(job).rsplit('/').next().and_then(|s| s.parse().ok()).expect("id")
}

/// `<data>/runs/<job>/<attempt>/<replica>/<restart>`.
pub fn run_dir(data: &Path, job: u64, attempt: u32, replica: &str, restart: u32) -> PathBuf {
    data.join("runs").join(job.to_string()).join(attempt.to_string()).join(replica).join(restart.to_string())
}

// --- several servers on one PostgreSQL store ---

/// A TCP relay to PostgreSQL that the test can cut (every connection closed, new ones
/// refused) and restore: the network between the server and its store.
pub struct Relay {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    pub fn to(target: std::net::SocketAddr) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::<std::net::TcpStream>::new()));
        let (cut2, open2) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if cut2.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let Ok(server) = std::net::TcpStream::connect(target) else { continue };
                let mut held = open2.lock().unwrap();
                for s in [&client, &server] {
                    held.push(s.try_clone().unwrap());
                }
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { port, cut, open }
    }

    /// A relay to the PostgreSQL of `admin` (the tests' URL), and `url` (a store on it)
    /// going through the relay.
    pub fn between(admin: &str, url: &str) -> (Relay, String) {
        let config: postgres::Config = admin.parse().unwrap();
        let (host, port) = match (&config.get_hosts()[0], config.get_ports()[0]) {
            (postgres::config::Host::Tcp(h), p) => (h.clone(), p),
            other => panic!("TRAINYARD_TEST_PG_URL must name a TCP host: {other:?}"),
        };
        let target = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port)).unwrap().next().unwrap();
        let relay = Relay::to(target);
        let relayed = url.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{}", relay.port), 1);
        assert_ne!(relayed, url, "{url}");
        (relay, relayed)
    }

    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Servers that share a store and a data directory, with one config (the harness gives
/// each server project uids of its own: the second one's config is the first's).
pub fn pair(table: &str) -> (tempfile::TempDir, Server, Server) {
    pair_reaching(table, None)
}

/// As [`pair`], `b`'s config being `a`'s with the text `swap.0` replaced by `swap.1`
/// (the store's URL, which is each server's own: `a` reaching it through a relay).
pub fn pair_reaching(table: &str, swap: Option<(&str, &str)>) -> (tempfile::TempDir, Server, Server) {
    let shared = tempfile::tempdir().unwrap();
    // Replicas of a root server run as their project's user and pass through here.
    std::fs::set_permissions(shared.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let data = shared.path().join("data");
    let mut a = Server::prepare(table).with_data_dir(data.clone());
    a.spawn();
    let mut b = Server::prepare(table).with_data_dir(data);
    let text = std::fs::read_to_string(&a.config).unwrap();
    std::fs::write(&b.config, swap.map_or(text.clone(), |(from, to)| text.replace(from, to))).unwrap();
    b.spawn();
    (shared, a, b)
}

/// The PostgreSQL of the tests (`TRAINYARD_TEST_PG_URL`, scripts/pg/up.sh): without one
/// a test is skipped, saying so, but in CI, where that is a failure (`what` needs it).
pub fn pg_or_skip(what: &str) -> Option<String> {
    let url = pg_url();
    if url.is_none() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI runs {what}: set TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)");
        trainyard_backend::skip_test("no TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)");
    }
    url
}

/// The text at `path` of the server on `port` (empty when it does not answer).
pub fn get_text(port: u16, path: &str) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .build()
        .into();
    agent.get(&format!("http://127.0.0.1:{port}{path}")).call().ok().and_then(|mut r| r.body_mut().read_to_string().ok()).unwrap_or_default()
}

pub fn healthz(port: u16) -> String {
    get_text(port, "/healthz")
}

/// Wait until the server on `port` says it leads; how long that took.
pub fn wait_leading(port: u16, secs: u64) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    loop {
        let h = healthz(port);
        if h.contains("leader, epoch") {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(secs), "the server on port {port} does not lead after {secs} s: {h}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}


/// The `p` quantile (0 to 1) of `xs`, nearest rank.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The node a replica's run (attempt 0) was placed on, from its spec.
pub fn node_of(s: &Server, job: &Value, replica: &str, restart: u32) -> String {
    let dir = run_dir(&s.data_dir(), id_of(job), 0, replica, restart);
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("spec.json")).unwrap()).unwrap();
    spec["env"].as_array().unwrap().iter().find(|kv| kv[0] == "TRAINYARD_NODE").map(|kv| kv[1].as_str().unwrap().to_string()).unwrap()
}
