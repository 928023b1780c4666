//! The control plane's state on PostgreSQL (`[store] url`): a server keeps every job there
//! (none in the data directory), goes on by the rules after a kill -9, says what it runs
//! on in `doctor`; a store that cannot be reached, a URL that is not one and a schema of
//! a newer release are refused at start, naming them (never the password), with no
//! silent fallback to SQLite; `admin backup` of a PostgreSQL store says to use its tools.
//!
//! The tests that need a PostgreSQL server use `TRAINYARD_TEST_PG_URL`
//! (scripts/pg/up.sh); CI always gives one.

mod common;

use std::process::{Command, Output, Stdio};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_trainyard");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TRAINYARD_CONTAINER_ENGINE", "none").env_remove("TRAINYARD_CONFIG").env_remove("TRAINYARD_STORE_URL").stdin(Stdio::null()).output().expect("run trainyard")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The PostgreSQL of the tests; in CI its absence is a failure.
fn pg() -> Option<String> {
    let url = pg_url();
    if url.is_none() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI runs the PostgreSQL store tests: set TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)");
        trainyard_backend::skip_test("no TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)");
    }
    url
}

/// Bad store URLs stop the start naming them, without the password, and nothing is made:
/// no SQLite database instead.
#[test]
fn a_store_that_cannot_be_used_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let listen = format!("127.0.0.1:{}", free_port());
    let d = data.to_str().unwrap();
    // Nothing listens on port 1.
    let o = run(&["serve", "--data-dir", d, "--listen", &listen, "--store-url", "postgres://ty:s3cret@127.0.0.1:1/trainyard?connect_timeout=3"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("cannot connect to the store postgres://ty:***@127.0.0.1:1/trainyard"), "{out}");
    assert!(!out.contains("s3cret"), "the password is shown: {out}");
    assert!(!data.join("trainyard.db").exists(), "no SQLite store made instead");
    // Not a PostgreSQL URL: from the flag, and from the config file, naming the key.
    let o = run(&["serve", "--data-dir", d, "--listen", &listen, "--store-url", "mysql://root:s3cret@db/x"]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("--store-url") && out.contains("not a PostgreSQL URL") && !out.contains("s3cret"), "{out}");
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, "[store]\nurl = \"sqlite:///tmp/x.db\"\n").unwrap();
    let o = run(&["serve", "--config", cfg.to_str().unwrap(), "--data-dir", d, "--listen", &listen]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("store.url") && out.contains("not a PostgreSQL URL"), "{out}");
    // doctor says the same, as a failure with its fix.
    let o = run(&["doctor", "--data-dir", d, "--listen", &listen, "--store-url", "postgres://ty:s3cret@127.0.0.1:1/trainyard?connect_timeout=3"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.lines().any(|l| l.starts_with("fail  store") && l.contains("127.0.0.1:1")) && !out.contains("s3cret"), "{out}");
}

/// On PostgreSQL: jobs are kept there and not in the data directory, a server killed with
/// kill -9 and started again has them and goes on (L23); doctor names the store; a
/// backup is refused naming PostgreSQL's tools; a schema of a newer release is refused.
#[test]
fn a_server_on_postgresql_keeps_its_jobs_there() {
    let Some(_) = pg() else { return };
    let url = new_pg_store();
    let mut s = Server::start(&format!("[store]\nurl = \"{url}\"\n"));
    let done = s.create("p", &sh_job("done", "echo done"));
    assert_eq!(s.wait_terminal(&name_of(&done), 60)["state"], "JOB_STATE_SUCCEEDED");
    let long = name_of(&s.create("p", &sh_job("long", "sleep 3; echo slept")));
    s.wait_for(&long, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    assert!(!s.data_dir().join("trainyard.db").exists(), "the jobs are in PostgreSQL");
    assert!(s.server_log().contains("store: PostgreSQL at postgres://"), "{}", s.server_log());
    s.restart();
    assert_eq!(s.get(&name_of(&done))["state"], "JOB_STATE_SUCCEEDED");
    let ended = s.wait_terminal(&long, 60);
    assert_eq!(ended["state"], "JOB_STATE_SUCCEEDED", "{ended}");
    assert!(s.logs_text(&long).contains("slept"));

    let (status, body) = s.call("POST", &s.url("/v1/admin/backup"), Some(r#"{"to": "/tmp/never-written.db"}"#));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("pg_dump"), "{body}");
    assert!(!std::path::Path::new("/tmp/never-written.db").exists());

    let data = s.data_dir();
    let o = run(&["doctor", "--data-dir", data.to_str().unwrap(), "--store-url", &url]);
    let out = text(&o);
    assert!(out.lines().any(|l| l.starts_with("ok    store") && l.contains("PostgreSQL at postgres://")), "{out}");
    s.kill9();

    // A newer release's schema: refused naming both versions, nothing written.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute("UPDATE trainyard_schema SET version = 99").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let o = run(&["serve", "--data-dir", data.to_str().unwrap(), "--listen", &listen, "--store-url", &url]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("schema version 99"), "{out}");
    let version: i64 = c.query_one("SELECT version FROM trainyard_schema", &[]).unwrap().get(0);
    assert_eq!(version, 99);
}

/// A TCP relay to PostgreSQL that the test can cut (every connection closed, new ones
/// refused) and restore: the network between the server and its store.
struct Relay {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn to(target: std::net::SocketAddr) -> Relay {
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
    fn between(admin: &str, url: &str) -> (Relay, String) {
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

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The store out of reach (the network to PostgreSQL cut): requests that need it are
/// answered 503 UNAVAILABLE with Retry-After and change nothing, /healthz says why, the
/// running job goes on; once the network is back the server goes on by itself, and the
/// job that ran meanwhile SUCCEEDS.
#[test]
fn a_store_out_of_reach_is_503_with_retry_after_until_it_is_back() {
    let Some(admin) = pg() else { return };
    let url = new_pg_store();
    let (relay, relayed) = Relay::between(&admin, &url);
    let s = Server::start(&format!("[store]\nurl = \"{relayed}\"\n"));
    let long = name_of(&s.create("p", &sh_job("long", "sleep 4; echo through")));
    s.wait_for(&long, 60, |j| j["state"] == "JOB_STATE_RUNNING");

    relay.cut();
    let body = sh_job("during", "echo x").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (mut created, mut refused) = (0, 0);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    while refused == 0 {
        assert!(std::time::Instant::now() < deadline, "no 503 within 20 s of the cut");
        let mut r = agent.post(&s.jobs_url("p")).header("Content-Type", "application/json").send(body.as_bytes()).unwrap();
        let status = r.status().as_u16();
        let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = r.body_mut().read_to_string().unwrap();
        match status {
            200 => created += 1,
            503 => {
                refused += 1;
                assert_eq!(retry.as_deref(), Some("1"), "{text}");
                assert!(text.contains("UNAVAILABLE") && text.contains("store"), "{text}");
            }
            other => panic!("{other}: {text}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, health) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 503, "{health}");
    assert!(health.to_string().contains("store cannot be reached"), "{health}");

    relay.restore();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        assert!(std::time::Instant::now() < deadline, "the server did not go on within 30 s of the network's return");
        let r = agent.post(&s.jobs_url("p")).header("Content-Type", "application/json").send(body.as_bytes()).unwrap();
        if r.status().as_u16() == 200 {
            created += 1;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Readers' connections made before the cut may still be found broken: such a read
    // is a 503 with Retry-After too (never another 5xx), and the next one is served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, body) = s.call("GET", &s.url(&format!("/v1/{long}")), None);
        match status {
            200 => break,
            503 => assert!(std::time::Instant::now() < deadline, "reads still refused 10 s after the network came back: {body}"),
            other => panic!("{other}: {body}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let ended = s.wait_terminal(&long, 60);
    assert_eq!(ended["state"], "JOB_STATE_SUCCEEDED", "{ended}");
    assert!(s.logs_text(&long).contains("through"));
    // Every acknowledged create is there, and none of the refused ones.
    let (_, list) = s.call("GET", &format!("{}?pageSize=100", s.jobs_url("p")), None);
    let during = list["customJobs"].as_array().unwrap().iter().filter(|j| j["displayName"] == "during").count();
    assert_eq!(during, created, "{list}");
}

/// One server writes a store at a time: a second server on the same PostgreSQL store is
/// refused at start naming the first; once the first is gone (kill -9) the second starts
/// and has its jobs. A server cut off from the store while another one took it over
/// stops writing when the network is back: its writes are refused (503), its health
/// says why, and the store's jobs are the new writer's only.
#[test]
fn one_server_writes_a_store_at_a_time() {
    let Some(admin) = pg() else { return };
    let url = new_pg_store();
    let table = format!("[store]\nurl = \"{url}\"\n");
    let mut a = Server::start(&table);
    let first = name_of(&a.create("p", &sh_job("first", "echo one")));
    a.wait_terminal(&first, 60);

    let mut b = Server::prepare(&table);
    let refused = b.try_spawn().expect_err("a second writer of the store started");
    assert!(refused.contains("another Trainyard server writes the store") && refused.contains(&format!("pid {}", a.pid().unwrap())), "{refused}");
    a.kill9();
    b.spawn();
    assert_eq!(b.get(&first)["state"], "JOB_STATE_SUCCEEDED");

    // b cut off from the store by the network; c takes the store over meanwhile.
    b.kill9();
    let (relay, relayed) = Relay::between(&admin, &url);
    let mut cut_off = Server::prepare(&format!("[store]\nurl = \"{relayed}\"\n"));
    cut_off.spawn();
    relay.cut();
    let mut c = Server::prepare(&table);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // PostgreSQL lets the lock go once it sees the cut session end.
    while let Err(e) = c.try_spawn() {
        assert!(e.contains("another Trainyard server writes the store"), "{e}");
        assert!(std::time::Instant::now() < deadline, "the cut-off server's lock was never let go: {e}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let second = name_of(&c.create("p", &sh_job("second", "echo two")));
    relay.restore();
    // The cut-off server finds the lock taken when it connects again: it stops writing
    // and ends (a service manager starts it again, and it is refused as `b` was), never
    // answering a write with 200 meanwhile.
    let body = sh_job("late", "echo late").to_string();
    let api = cut_off.api();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = cut_off.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            break status;
        }
        if let Ok((code, answer)) = api.try_call("POST", &api.jobs_url("p"), Some(&body)) {
            assert_ne!(code, 200, "a server that lost the store wrote to it: {answer}");
        }
        assert!(std::time::Instant::now() < deadline, "the cut-off server still runs 30 s after the network came back");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    cut_off.child = None;
    assert!(!status.success(), "{status}");
    let log = cut_off.server_log();
    assert!(log.contains("the driver stops: another Trainyard server writes the store"), "{log}");
    assert_eq!(c.wait_terminal(&second, 60)["state"], "JOB_STATE_SUCCEEDED");
    let (_, list) = c.call("GET", &format!("{}?pageSize=100", c.jobs_url("p")), None);
    let names: Vec<&str> = list["customJobs"].as_array().unwrap().iter().filter_map(|j| j["displayName"].as_str()).collect();
    assert_eq!(names, ["second", "first"], "{list}");
}
