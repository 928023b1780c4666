//! `GET /metrics` on a real server: jobs that succeed, fail and restart a replica are
//! counted by state and project, restarts by reason, requests by route template; the
//! exposition passes `promtool check metrics`, and Prometheus itself scrapes it.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn metrics_text(s: &Server) -> (String, String) {
    let mut resp = ureq::get(&s.url("/metrics")).call().expect("GET /metrics");
    let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let text = resp.body_mut().read_to_string().expect("metrics body");
    (ctype, text)
}

/// The value of one series (its name with its labels, as rendered).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// `promtool check metrics` passes on the exposition (where promtool is installed).
fn promtool_check(text: &str) {
    if let Some(promtool) = tool("promtool") {
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(text.as_bytes()).expect("write to promtool");
        }
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One request with a request line of the caller's (a method no client library sends).
fn raw_request(s: &Server, line: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    write!(c, "{line}\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", s.port).expect("send");
    let mut reply = String::new();
    let _ = c.read_to_string(&mut reply);
    reply
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A tool of Debian's `prometheus` package: its path, or None (the test is skipped with
/// the reason, except in CI, where `.ci/run` installs it).
fn tool(name: &str) -> Option<String> {
    let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().ok().filter(|o| o.status.success());
    match found {
        Some(o) => Some(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        None if in_ci() => panic!("{name} is not installed (Debian package prometheus; .ci/run installs it)"),
        None => {
            eprintln!("skipped: {name} is not installed (apt-get install prometheus)");
            None
        }
    }
}

#[test]
fn metrics_count_jobs_restarts_and_requests() {
    let mut s = Server::start("");
    let marker = s.dir.path().join("restarted-once");
    let ok = s.create("metrics", &sh_job("secret-display-name-ok", "exit 0"));
    let failed = s.create("metrics", &sh_job("secret-display-name-fail", "exit 3"));
    let restart = s.create(
        "metrics",
        &sh_job("secret-display-name-restart", &format!("if [ -e {m} ]; then exit 0; fi; touch {m}; kill -9 $$", m = marker.display())),
    );
    assert_eq!(s.wait_terminal(&name_of(&ok), 60)["state"], "JOB_STATE_SUCCEEDED");
    assert_eq!(s.wait_terminal(&name_of(&failed), 60)["state"], "JOB_STATE_FAILED");
    assert_eq!(s.wait_terminal(&name_of(&restart), 60)["state"], "JOB_STATE_SUCCEEDED");

    let (ctype, text) = metrics_text(&s);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let jobs = |state: &str| value(&text, &format!("trainyard_jobs{{project=\"metrics\",state=\"{state}\"}}"));
    assert_eq!(jobs("JOB_STATE_SUCCEEDED"), Some(2.0), "{text}");
    assert_eq!(jobs("JOB_STATE_FAILED"), Some(1.0), "{text}");
    assert_eq!(jobs("JOB_STATE_RUNNING"), Some(0.0), "{text}");
    assert_eq!(value(&text, "trainyard_queue_length"), Some(0.0), "{text}");
    assert_eq!(value(&text, "trainyard_replica_restarts_total{reason=\"failure\"}"), Some(1.0), "{text}");
    assert_eq!(value(&text, "trainyard_job_wait_seconds_count"), Some(3.0), "{text}");
    assert!(value(&text, "trainyard_job_create_to_running_seconds_count").is_some_and(|n| n >= 3.0), "{text}");
    assert_eq!(value(&text, "trainyard_oom_kills_total"), Some(0.0), "{text}");
    assert_eq!(value(&text, "trainyard_stockouts_total"), Some(0.0), "{text}");
    let creates = "trainyard_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/projects/{project}/locations/{region}/customJobs\",code=\"200\"}";
    assert_eq!(value(&text, creates), Some(3.0), "{text}");
    assert!(value(&text, "trainyard_store_commit_duration_seconds_count{op=\"insert_jobs\"}").is_some_and(|n| n >= 1.0), "{text}");
    // The jobs' transitions: one at a time (commit) or several together (commit_many: a
    // round's placements, replicas that started or ended together).
    let commits = ["commit", "commit_many"]
        .iter()
        .filter_map(|op| value(&text, &format!("trainyard_store_commit_duration_seconds_count{{op=\"{op}\"}}")))
        .sum::<f64>();
    assert!(commits >= 6.0, "{text}");
    // Made-up methods and paths make no new series.
    let reply = raw_request(&s, "BREW /no/such/path/42 HTTP/1.1");
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
    let (_, text) = metrics_text(&s);
    assert!(!text.contains("BREW") && !text.contains("/no/such"), "{text}");
    let odd = "trainyard_http_request_duration_seconds_count{method=\"other\",route=\"unmatched\",code=\"404\"}";
    assert_eq!(value(&text, odd), Some(1.0), "{text}");
    // Raw paths are not labels: a job's path is counted under its route template.
    assert!(!text.contains("customJobs/1\""), "{text}");
    // Jobs' display names are never shown.
    assert!(!text.contains("secret-display-name"), "{text}");

    // OpenMetrics when asked for, as Prometheus does.
    let mut resp = ureq::get(&s.url("/metrics"))
        .header("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        .call()
        .expect("GET /metrics");
    let open = resp.body_mut().read_to_string().expect("body");
    assert!(open.ends_with("# EOF\n"), "{open}");
    assert!(open.contains("# TYPE trainyard_replica_restarts counter"), "{open}");

    promtool_check(&text);

    // Ended jobs are counted from the store after a restart (once, not per scrape).
    s.restart();
    let (_, text) = metrics_text(&s);
    let jobs = |state: &str| value(&text, &format!("trainyard_jobs{{project=\"metrics\",state=\"{state}\"}}"));
    assert_eq!(jobs("JOB_STATE_SUCCEEDED"), Some(2.0), "{text}");
    assert_eq!(jobs("JOB_STATE_FAILED"), Some(1.0), "{text}");

    // A deleted job is no longer counted.
    let (status, body) = s.call("DELETE", &s.url(&format!("/v1/{}", name_of(&failed))), None);
    assert_eq!(status, 200, "{body}");
    let (_, text) = metrics_text(&s);
    assert_eq!(value(&text, "trainyard_jobs{project=\"metrics\",state=\"JOB_STATE_FAILED\"}"), Some(0.0), "{text}");
}

/// Debian's Prometheus scrapes the live server, and a query gives the metric back.
#[test]
fn prometheus_scrapes_the_server() {
    let Some(prometheus) = tool("prometheus") else { return };
    let s = Server::start("");
    let job = s.create("scraped", &sh_job("one", "exit 0"));
    s.wait_terminal(&name_of(&job), 60);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: trainyard\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            s.port
        ),
    )
    .expect("config");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let mut child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let query = format!("http://127.0.0.1:{port}/api/v1/query?query=trainyard_jobs%7Bproject%3D%22scraped%22%2Cstate%3D%22JOB_STATE_SUCCEEDED%22%7D");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    let found = loop {
        if let Ok(mut r) = ureq::get(&query).call() {
            last = r.body_mut().read_to_string().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
            if let Some(sample) = v["data"]["result"].as_array().and_then(|r| r.first()) {
                break Some(sample["value"][1].as_str().unwrap_or("").to_string());
            }
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let _ = child.kill();
    let _ = child.wait();
    let plog = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    assert_eq!(found.as_deref(), Some("1"), "last answer: {last}\nprometheus log:\n{plog}");
}

/// With a tokens file, `/metrics` (every project's jobs and usage) needs an administrator's
/// `"*"` token: none is 401, a project's token 403, as for `/v1/admin`; refused API calls
/// are counted under their route with their code.
#[test]
fn metrics_need_an_admin_token_in_tokens_mode() {
    const TOKEN: &str = "metrics-token-0123456789abcdef";
    const ADMIN: &str = "metrics-admin-9876543210fedcba";
    let tokens = tempfile::tempdir().expect("tempdir");
    let file = tokens.path().join("tokens.toml");
    std::fs::write(
        &file,
        format!("[[tokens]]\ntoken = \"{TOKEN}\"\nprojects = [\"alpha\"]\n[[tokens]]\ntoken = \"{ADMIN}\"\nprojects = [\"*\"]\naccess = \"read-only\"\n"),
    )
    .expect("tokens");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let s = Server::start(&format!("tokens_file = \"{}\"\n", file.display()));
    let (status, _) = s.call("GET", &s.jobs_url("alpha"), None);
    assert_eq!(status, 401);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let get = |token: Option<&str>| {
        let mut r = agent.get(&s.url("/metrics"));
        if let Some(t) = token {
            r = r.header("Authorization", &format!("Bearer {t}"));
        }
        let resp = r.call().expect("GET /metrics");
        (resp.status().as_u16(), resp.into_body().read_to_string().unwrap_or_default())
    };
    assert_eq!(get(None).0, 401, "no token");
    let (status, body) = get(Some(TOKEN));
    assert_eq!(status, 403, "a project's token: {body}");
    assert!(!body.contains("trainyard_"), "{body}");
    let (status, text) = get(Some(ADMIN));
    assert_eq!(status, 200, "{text}");
    let refused = "trainyard_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/projects/{project}/locations/{region}/customJobs\",code=\"401\"}";
    assert_eq!(value(&text, refused), Some(1.0), "{text}");
}

/// A running replica's memory and CPU time are read from its cgroup at each scrape (CPU
/// on cgroup v1 too, from its processes), its series go when it ends, and the CPU it used
/// is in the usage report (`usedCpuHours`).
#[test]
fn running_replica_resources_from_its_cgroup() {
    let s = Server::start("");
    let j = s.create("metrics", &sh_job("busy", "while :; do :; done"));
    s.wait_for(&name_of(&j), 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let spec_file = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0).join("spec.json");
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).expect("spec.json")).expect("spec");
    let series = format!("{{project=\"metrics\",job=\"{}\",replica=\"workerpool0-0-a0-r0\"}}", id_of(&j));
    let (_, text) = metrics_text(&s);
    if spec["cgroup_base"].is_null() {
        trainyard_backend::skip_test("this server runs replicas without cgroups (see its start log)");
    } else {
        promtool_check(&text);
        let memory = value(&text, &format!("trainyard_replica_memory_bytes{series}"));
        assert!(memory.is_some_and(|m| m > 0.0), "{text}");
        assert!(value(&text, &format!("trainyard_replica_cpu_seconds_total{series}")).is_some(), "{text}");
        // The first report samples what the replica used so far; a later one counts what it
        // used since.
        let used = || {
            let (status, v) = s.call("GET", &s.url("/v1/admin/usage?project=metrics"), None);
            assert_eq!(status, 200, "{v}");
            v["usage"].as_array().and_then(|a| a.first()).map_or(0.0, |r| r["usedCpuHours"].as_f64().unwrap_or(0.0))
        };
        used();
        let deadline = Instant::now() + Duration::from_secs(60);
        while used() <= 0.0 {
            assert!(Instant::now() < deadline, "no CPU counted for a busy replica within 60 s");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&j))), Some("{}"));
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name_of(&j), 60);
    let (_, text) = metrics_text(&s);
    assert!(!text.contains(&series), "{text}");
}

/// `[metrics] enabled = false`: `/metrics` is a 404 in the API's error shape that says why,
/// and jobs run as ever.
#[test]
fn metrics_can_be_turned_off() {
    let s = Server::start("[metrics]\nenabled = false\n");
    let job = s.create("metrics", &sh_job("off", "exit 0"));
    assert_eq!(s.wait_terminal(&name_of(&job), 60)["state"], "JOB_STATE_SUCCEEDED");
    let (status, body) = s.call("GET", &s.url("/metrics"), None);
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["status"], "NOT_FOUND", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("[metrics] enabled = false")), "{body}");
}

/// A `[metrics]` key that does not exist is refused at start, naming it.
#[test]
fn a_wrong_metrics_key_is_refused_at_start() {
    let err = serve_refused("[metrics]\nenable = false\n");
    assert!(err.contains("metrics") && err.contains("enable"), "{err}");
}
