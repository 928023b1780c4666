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
    pg_or_skip("the PostgreSQL store tests")
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

/// Several servers on one PostgreSQL store: one leads, the other follows and answers the
/// API (reads itself, writes forwarded to the leader). The leader killed with kill -9, the
/// follower takes the lease over within `lease_secs` and a round, adopts the running
/// replica (L23: it was started once and ends SUCCEEDED with every log line once) and
/// starts new jobs. The old leader, started again, follows; a cancel through it is
/// honoured. A server whose config differs from the leader's is refused naming the key.
#[test]
fn servers_on_one_store_have_one_leader_and_a_follower_takes_over_without_loss() {
    let Some(_) = pg() else { return };
    let url = new_pg_store();
    let (_shared, mut a, b) = pair(&format!("[store]\nurl = \"{url}\"\nlease_secs = 2\n"));
    assert!(healthz(a.port).contains("leader, epoch 1"), "{}", healthz(a.port));
    assert!(healthz(b.port).contains(&format!("follower of http://127.0.0.1:{} ", a.port)), "{}", healthz(b.port));
    let metrics = get_text(b.port, "/metrics");
    assert!(metrics.contains("trainyard_leader 0") && metrics.contains("trainyard_leader_epoch 1"), "{metrics}");

    // Written through the follower, run by the leader.
    let marks = a.dir.path().join("starts");
    let script = format!("echo started >> {}; for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done", marks.display());
    let long = name_of(&b.create("p", &sh_job("long", &script)));
    b.wait_for(&long, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    // Its log followed through the follower, whose stream is cut when it starts leading.
    let stream = Command::new(BIN)
        .args(["custom-jobs", "stream-logs", &long, "--server", &format!("http://127.0.0.1:{}", b.port)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let t0 = std::time::Instant::now();
    a.kill9();
    wait_leading(b.port, 30);
    eprintln!("failover: {:.2} s from kill -9 to the follower leading (lease 2 s)", t0.elapsed().as_secs_f64());
    assert!(healthz(b.port).contains("leader, epoch 2"), "{}", healthz(b.port));
    let ended = b.wait_terminal(&long, 60);
    assert_eq!(ended["state"], "JOB_STATE_SUCCEEDED", "{ended}");
    assert_eq!(std::fs::read_to_string(&marks).unwrap(), "started\n", "the replica was started again by the new leader");
    let logs = b.logs_text(&long);
    for i in 1..=6 {
        assert_eq!(logs.matches(&format!("tick {i}\n")).count() + logs.matches(&format!("\"tick {i}\"")).count(), 1, "tick {i}: {logs}");
    }
    // The followed stream resumed where it was cut: every line once, and it ended with the job.
    let streamed = stream.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&streamed.stdout);
    assert!(streamed.status.success(), "{out}{}", String::from_utf8_lossy(&streamed.stderr));
    for i in 1..=6 {
        assert_eq!(out.lines().filter(|l| l.ends_with(&format!(": tick {i}"))).count(), 1, "tick {i}: {out}");
    }
    let after = b.create("p", &sh_job("after", "echo after"));
    assert_eq!(b.wait_terminal(&name_of(&after), 60)["state"], "JOB_STATE_SUCCEEDED");
    // Each run says which leader's epoch launched it.
    let launched_by = |job: &serde_json::Value| std::fs::read_to_string(run_dir(&b.data_dir(), id_of(job), 0, "workerpool0-0", 0).join("leader.epoch")).unwrap();
    assert_eq!(launched_by(&serde_json::json!({ "name": long })), "1\n");
    assert_eq!(launched_by(&after), "2\n");

    // The old leader comes back as a follower; a cancel through it is honoured.
    a.spawn();
    assert!(healthz(a.port).contains(&format!("follower of http://127.0.0.1:{} ", b.port)), "{}", healthz(a.port));
    let victim = name_of(&a.create("p", &sh_job("victim", "sleep 60")));
    a.wait_for(&victim, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let (status, body) = a.call("POST", &a.url(&format!("/v1/{victim}:cancel")), Some("{}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(a.wait_terminal(&victim, 60)["state"], "JOB_STATE_CANCELLED");
    let (_, list) = a.call("GET", &format!("{}?pageSize=100", a.jobs_url("p")), None);
    let names: Vec<&str> = list["customJobs"].as_array().unwrap().iter().filter_map(|j| j["displayName"].as_str()).collect();
    assert_eq!(names, ["victim", "after", "long"], "{list}");

    // Another config on the same store is refused, naming what differs.
    let mut other = Server::prepare(&format!("[store]\nurl = \"{url}\"\nlease_secs = 2\n")).with_data_dir(a.data_dir());
    let refused = other.try_spawn().expect_err("a server with another config joined the store");
    assert!(refused.contains("config differs from that of the leader") && refused.contains("replicas.uid_range"), "{refused}");
}

/// A leader cut off from the store (the network to PostgreSQL cut) writes nothing once
/// its lease lapses: its writes are 503 with Retry-After, never 200. The follower takes
/// the lease over and goes on. When the network is back, the old leader finds another
/// epoch and stops (exit status 75, for its supervisor to start it again as a follower);
/// the store has the new leader's jobs only.
#[test]
fn a_leader_cut_off_from_the_store_is_deposed_and_writes_nothing() {
    let Some(admin) = pg() else { return };
    let url = new_pg_store();
    let (relay, relayed) = Relay::between(&admin, &url);
    // The same config but for the store's URL (each server's own).
    let table = format!("[store]\nurl = \"{relayed}\"\nlease_secs = 2\n");
    let (_shared, mut cut_off, b) = pair_reaching(&table, Some((&relayed, &url)));
    let first = name_of(&cut_off.create("p", &sh_job("first", "echo one")));
    assert_eq!(cut_off.wait_terminal(&first, 60)["state"], "JOB_STATE_SUCCEEDED");

    relay.cut();
    wait_leading(b.port, 30);
    let second = name_of(&b.create("p", &sh_job("second", "echo two")));
    let body = sh_job("late", "echo late").to_string();
    let api = cut_off.api();
    let mut refused = 0;
    for _ in 0..10 {
        if let Ok((code, answer)) = api.try_call("POST", &api.jobs_url("p"), Some(&body)) {
            assert_ne!(code, 200, "a leader cut off from the store wrote to it: {answer}");
            refused += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(refused > 0);
    relay.restore();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = cut_off.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            break status;
        }
        if let Ok((code, answer)) = api.try_call("POST", &api.jobs_url("p"), Some(&body)) {
            assert_ne!(code, 200, "a deposed leader wrote to the store: {answer}");
        }
        assert!(std::time::Instant::now() < deadline, "the deposed leader still runs 30 s after the network came back");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    cut_off.child = None;
    assert_eq!(status.code(), Some(75), "{status}");
    let log = cut_off.server_log();
    assert!(log.contains("no longer at this server's epoch 1: another server leads"), "{log}");
    assert_eq!(b.wait_terminal(&second, 60)["state"], "JOB_STATE_SUCCEEDED");
    let (_, list) = b.call("GET", &format!("{}?pageSize=100", b.jobs_url("p")), None);
    let names: Vec<&str> = list["customJobs"].as_array().unwrap().iter().filter_map(|j| j["displayName"].as_str()).collect();
    assert_eq!(names, ["second", "first"], "{list}");
}
