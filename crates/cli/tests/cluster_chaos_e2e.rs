//! Chaos on two servers that share one PostgreSQL store and one data directory: 8 clients
//! create, cancel and list through both while the leader is killed with kill -9 five
//! times (started again each time, as a service manager would), PostgreSQL is restarted
//! once, and the leader is cut off from PostgreSQL once (a TCP relay cut). A ledger of
//! what the clients were told then shows every acknowledged job reaching its end exactly
//! once (listed once, its program started once), every acknowledged cancel honoured, and
//! no 5xx answer that is not 503 with Retry-After. The failover times are printed.
//!
//! Needs `TRAINYARD_TEST_PG_URL` and `TRAINYARD_TEST_PG_RESTART` (scripts/pg/up.sh);
//! CI always gives both. The only test of its binary: it restarts the PostgreSQL server
//! the other tests of a run share, and cargo runs test binaries one after another.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const CLIENTS: usize = 8;

#[derive(Default)]
struct Ledger {
    /// (job name, display name) of every create answered 200.
    created: Mutex<Vec<(String, String)>>,
    /// Names of the jobs whose cancel was answered 200.
    cancelled: Mutex<Vec<String>>,
    /// Answers that break the rules: a 5xx that is not 503 with Retry-After, a 200
    /// without a name.
    bad: Mutex<Vec<String>>,
    answers: Mutex<std::collections::BTreeMap<u16, usize>>,
    stop: AtomicBool,
}

impl Ledger {
    /// Count an answer: 200, 503 with Retry-After, and for a cancel 400 (the job ended
    /// already); anything else breaks the rules.
    fn check(&self, what: &str, status: u16, retry_after: bool, body: &str) {
        *self.answers.lock().unwrap().entry(status).or_default() += 1;
        let fine = status == 200 || (status == 503 && retry_after) || (what == "cancel" && status == 400);
        if !fine {
            self.bad.lock().unwrap().push(format!("{what}: {status} (Retry-After: {retry_after}) {body}"));
        }
    }
}

fn call(agent: &ureq::Agent, method: &str, url: &str, body: Option<&str>) -> Option<(u16, bool, String)> {
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    if body.is_some() {
        req = req.header("Content-Type", "application/json");
    }
    let sent = match body {
        Some(b) => agent.run(req.body(b.as_bytes().to_vec()).ok()?),
        None => agent.run(req.body(()).ok()?),
    };
    // A server that is down (killed, starting again) does not answer: not an answer.
    let mut resp = sent.ok()?;
    let retry_after = resp.headers().contains_key("retry-after");
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    Some((resp.status().as_u16(), retry_after, text))
}

fn client(i: usize, ports: Arc<Mutex<[u16; 2]>>, ledger: Arc<Ledger>, marks: std::path::PathBuf) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut mine: Vec<String> = Vec::new();
    let mut n = 0usize;
    while !ledger.stop.load(Ordering::SeqCst) {
        n += 1;
        let port = ports.lock().unwrap()[(i + n) % 2];
        let base = format!("http://127.0.0.1:{port}/v1/projects/chaos/locations/us-central1/customJobs");
        if n % 4 == 0 && !mine.is_empty() {
            let name = mine.remove(0);
            if let Some((status, ra, text)) = call(&agent, "POST", &format!("http://127.0.0.1:{port}/v1/{name}:cancel"), Some("{}")) {
                ledger.check("cancel", status, ra, &text);
                if status == 200 {
                    ledger.cancelled.lock().unwrap().push(name);
                }
            }
        } else {
            let display = format!("c{i}-{n}");
            let script = format!("echo started >> {}/{display}; sleep 2; echo done", marks.display());
            let job = sh_job(&display, &script).to_string();
            if let Some((status, ra, text)) = call(&agent, "POST", &base, Some(&job)) {
                ledger.check("create", status, ra, &text);
                if status == 200 {
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    match v["name"].as_str() {
                        Some(name) => {
                            ledger.created.lock().unwrap().push((name.to_string(), display));
                            mine.push(name.to_string());
                        }
                        None => ledger.bad.lock().unwrap().push(format!("create: 200 without a name: {text}")),
                    }
                }
            }
        }
        if let Some((status, ra, text)) = call(&agent, "GET", &format!("{base}?pageSize=20"), None) {
            ledger.check("list", status, ra, &text);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

/// As the package's service manager does: a server that stopped with status 75 (it lost
/// the lease, e.g. across PostgreSQL's restart, and follows when started again) is started
/// again. Any other exit fails the test.
fn supervise(s: &mut Server) {
    if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
        s.child = None;
        assert_eq!(status.code(), Some(75), "a server exited with {status}: {}", s.server_log());
        s.spawn();
    }
}

/// `wait_leading` for a supervised server (one that steps down on the way is started
/// again, and may then take the lease).
fn wait_leading_supervised(s: &mut Server, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        supervise(s);
        if healthz(s.port).contains("leader, epoch") {
            return;
        }
        assert!(Instant::now() < deadline, "the server on port {} does not lead after {secs} s", s.port);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Which of the servers leads now (waiting for one to).
fn leader_of(servers: &[&Server; 2]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, s) in servers.iter().enumerate() {
            if healthz(s.port).contains("leader, epoch") {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no server leads");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every job of project `chaos`, through the server on `port`, all pages.
fn all_jobs(s: &Server) -> Vec<Value> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let url = format!("{}?pageSize=100&pageToken={token}", s.jobs_url("chaos"));
        let (status, page) = s.call("GET", &url, None);
        assert_eq!(status, 200, "{page}");
        out.extend(page["customJobs"].as_array().cloned().unwrap_or_default());
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => return out,
        }
    }
}

#[test]
fn two_servers_through_kills_a_store_restart_and_a_cut_keep_every_acknowledged_job_and_cancel() {
    let Some(admin) = pg_or_skip("the chaos test") else { return };
    let restart_pg = std::env::var("TRAINYARD_TEST_PG_RESTART").ok().filter(|s| !s.is_empty());
    assert!(
        restart_pg.is_some() || std::env::var("CI").as_deref() != Ok("true"),
        "CI restarts PostgreSQL in the chaos test: set TRAINYARD_TEST_PG_RESTART (scripts/pg/up.sh)"
    );
    let url = new_pg_store();
    // Server a reaches the store through a relay the test cuts; b directly.
    let (relay, relayed) = Relay::between(&admin, &url);
    let table = format!("[store]\nurl = \"{relayed}\"\nlease_secs = 2\n");
    let (_shared, mut a, mut b) = pair_reaching(&table, Some((&relayed, &url)));
    let marks = a.dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();

    let ports = Arc::new(Mutex::new([a.port, b.port]));
    let ledger = Arc::new(Ledger::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (ports, ledger, marks) = (Arc::clone(&ports), Arc::clone(&ledger), marks.clone());
            std::thread::spawn(move || client(i, ports, ledger, marks))
        })
        .collect();

    let mut failovers: Vec<f64> = Vec::new();
    for round in 0..5 {
        std::thread::sleep(Duration::from_millis(1500));
        supervise(&mut a);
        supervise(&mut b);
        let lead = leader_of(&[&a, &b]);
        let (dead, alive) = if lead == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let t0 = Instant::now();
        dead.kill9();
        wait_leading_supervised(alive, 30);
        failovers.push(t0.elapsed().as_secs_f64());
        dead.spawn();
        *ports.lock().unwrap() = [a.port, b.port];
        if round == 1 {
            if let Some(cmd) = &restart_pg {
                let ok = std::process::Command::new(cmd).status().map(|s| s.success()).unwrap_or(false);
                assert!(ok, "{cmd} failed");
                eprintln!("PostgreSQL restarted");
            }
        }
    }

    // The leader cut off from PostgreSQL: a must lead for that.
    supervise(&mut a);
    supervise(&mut b);
    if leader_of(&[&a, &b]) == 1 {
        b.kill9();
        wait_leading_supervised(&mut a, 30);
        b.spawn();
        *ports.lock().unwrap() = [a.port, b.port];
    }
    std::thread::sleep(Duration::from_millis(1000));
    let t0 = Instant::now();
    relay.cut();
    wait_leading(b.port, 30);
    let cut_failover = t0.elapsed().as_secs_f64();
    relay.restore();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = a.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            break status;
        }
        assert!(Instant::now() < deadline, "the deposed leader still runs 30 s after the network came back");
        std::thread::sleep(Duration::from_millis(100));
    };
    a.child = None;
    assert_eq!(status.code(), Some(75), "{status}");
    a.spawn();
    *ports.lock().unwrap() = [a.port, b.port];
    std::thread::sleep(Duration::from_millis(1500));
    ledger.stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }

    // Every acknowledged job reaches its end, once.
    let leader = if leader_of(&[&a, &b]) == 0 { &a } else { &b };
    let created = ledger.created.lock().unwrap().clone();
    let cancelled = ledger.cancelled.lock().unwrap().clone();
    assert!(created.len() >= 20, "too few creates went through to test anything: {}", created.len());
    let deadline = Instant::now() + Duration::from_secs(240);
    let jobs = loop {
        let jobs = all_jobs(leader);
        let live = jobs.iter().filter(|j| !j["state"].as_str().is_some_and(|s| s.ends_with("SUCCEEDED") || s.ends_with("FAILED") || s.ends_with("CANCELLED"))).count();
        if live == 0 {
            break jobs;
        }
        assert!(Instant::now() < deadline, "{live} jobs have not ended 240 s after the chaos");
        std::thread::sleep(Duration::from_millis(500));
    };
    let by_name: std::collections::HashMap<&str, &Value> = jobs.iter().filter_map(|j| Some((j["name"].as_str()?, j))).collect();
    let mut problems = ledger.bad.lock().unwrap().clone();
    for (name, display) in &created {
        let listed = jobs.iter().filter(|j| j["displayName"] == display.as_str()).count();
        if listed != 1 {
            problems.push(format!("{display} ({name}) listed {listed} times"));
            continue;
        }
        let Some(job) = by_name.get(name.as_str()) else {
            problems.push(format!("{name} ({display}) is not listed under its name"));
            continue;
        };
        let state = job["state"].as_str().unwrap_or("");
        let starts = std::fs::read_to_string(marks.join(display)).map(|t| t.lines().count()).unwrap_or(0);
        match state {
            "JOB_STATE_SUCCEEDED" if starts != 1 => problems.push(format!("{display} SUCCEEDED after {starts} starts")),
            "JOB_STATE_CANCELLED" if starts > 1 => problems.push(format!("{display} CANCELLED after {starts} starts")),
            "JOB_STATE_FAILED" => problems.push(format!("{display} FAILED: {}", job["error"])),
            _ => {}
        }
        if cancelled.contains(name) && state != "JOB_STATE_CANCELLED" {
            problems.push(format!("{display}: its cancel was acknowledged, and it ended {state}"));
        }
    }
    let answers = ledger.answers.lock().unwrap().clone();
    eprintln!(
        "chaos: {} jobs acknowledged, {} cancels acknowledged, answers by status {answers:?}; failover after kill -9 (s): {failovers:.2?} \
         (p50 {:.2}, max {:.2}); after the cut (lease 2 s): {cut_failover:.2} s",
        created.len(),
        cancelled.len(),
        percentile(&failovers, 0.5),
        percentile(&failovers, 1.0)
    );
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
