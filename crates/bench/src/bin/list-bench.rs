//! `list-bench`: latency of `GET .../customJobs` (list) with 100,000 jobs stored, against
//! the same requests on a database of 100 jobs served by a second server in the same run.
//!
//! Both databases are filled directly (one transaction, prepared statements, rows shaped
//! as `Store::insert_job` and the driver leave them), then the real `trainyard serve`
//! binary is started on each and measured over HTTP with one keep-alive client. Finally
//! the SQL the server runs for each request (the shape of `Store::list_jobs`, the
//! condition from `trainyard_store::filter::compile`) is shown with `EXPLAIN QUERY PLAN`
//! and timed in-process, so that HTTP and JSON costs can be told from query costs.
//!
//! The machine is assumed noisy: read the ratios and same-run comparisons, not the
//! absolute milliseconds.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use trainyard_store::Value as SqlValue;
use rusqlite::{params, Connection};
use serde_json::Value;
use trainyard_core::run::Outcome;
use trainyard_core::step::LogLine;
use trainyard_core::{step, Effect, Event, Job, Micros, RunId, Settings, State};
use trainyard_server::jobspec::{prepare, Prepared};
use trainyard_server::Config;
use trainyard_store::Store;

const PROJECT: &str = "bench";
const OTHER_PROJECT: &str = "bench-other";
const REGION: &str = "us-central1";
/// `KIND_CUSTOM` of the server.
const KIND: &str = "custom";
const PAGE_SIZE: usize = 100;
const FILTER_B: &str = r#"labels.team="t3" AND state="JOB_STATE_SUCCEEDED""#;
const FILTER_E: &str = r#"display_name="run-77777""#;
/// The server's `STATE_NAMES` (enum number → name), for `filter::compile`.
const STATE_NAMES: [&str; 12] = [
    "JOB_STATE_UNSPECIFIED",
    "JOB_STATE_QUEUED",
    "JOB_STATE_PENDING",
    "JOB_STATE_RUNNING",
    "JOB_STATE_SUCCEEDED",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLING",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_PAUSED",
    "JOB_STATE_EXPIRED",
    "JOB_STATE_UPDATING",
    "JOB_STATE_PARTIALLY_SUCCEEDED",
];
/// A case whose HTTP p50 is above this is reported, with the index that would help.
const SLOW_MS: f64 = 20.0;
/// Bound on the wait for a server to answer `/healthz`.
const START_BOUND: Duration = Duration::from_secs(120);

const USAGE: &str = "\
usage: list-bench [--server-bin PATH] [--jobs N] [--other N] [--baseline-jobs N] [-n N] [--warmup N]
                  [--deep N] [--deep-filtered N] [--keep]

  --server-bin PATH    the trainyard binary to serve with (default target/release/trainyard;
                       build it first: cargo build --release -p trainyard)
  --jobs N             jobs in project `bench` of the large database (default 100000)
  --other N            jobs in another project of the large database (default 10000)
  --baseline-jobs N    jobs in project `bench` of the baseline database (default 100)
  -n N                 timed requests per case (default 200)
  --warmup N           discarded requests before each case (default 10)
  --deep N             page number of case c, unfiltered (default 500)
  --deep-filtered N    page number of case d, filtered as case b (default 50)
  --keep               keep the temporary directory (databases, server logs) and print its path

Build with `cargo build --release -p trainyard-bench --bin list-bench`.";

struct Opts {
    server_bin: PathBuf,
    jobs: usize,
    other: usize,
    baseline_jobs: usize,
    n: usize,
    warmup: usize,
    deep: usize,
    deep_filtered: usize,
    keep: bool,
    help: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut o = Opts {
            server_bin: PathBuf::from("target/release/trainyard"),
            jobs: 100_000,
            other: 10_000,
            baseline_jobs: 100,
            n: 200,
            warmup: 10,
            deep: 500,
            deep_filtered: 50,
            keep: false,
            help: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().cloned().ok_or_else(|| anyhow!("{name} needs a value"));
            let mut num = |name: &str, min: usize| -> Result<usize> {
                let v = val(name)?;
                let n: usize = v.parse().map_err(|_| anyhow!("{name}: not a number: {v}"))?;
                if n < min {
                    bail!("{name} must be at least {min}");
                }
                Ok(n)
            };
            match a.as_str() {
                "--server-bin" => o.server_bin = PathBuf::from(val("--server-bin")?),
                "--jobs" => o.jobs = num("--jobs", 1)?,
                "--other" => o.other = num("--other", 0)?,
                "--baseline-jobs" => o.baseline_jobs = num("--baseline-jobs", 1)?,
                "-n" => o.n = num("-n", 1)?,
                "--warmup" => o.warmup = num("--warmup", 0)?,
                "--deep" => o.deep = num("--deep", 1)?,
                "--deep-filtered" => o.deep_filtered = num("--deep-filtered", 1)?,
                "--keep" => o.keep = true,
                "-h" | "--help" => o.help = true,
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(o)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let opts = match Opts::parse(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("list-bench: {e}\n\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    if opts.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("list-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// Data: jobs shaped as the server stores them

/// The project's seeded generator (`trainyard_core::rng`), so that every run stores the
/// same data.
struct Rng(trainyard_core::rng::Rng);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n as usize) as u64
    }
}

/// The final state a generated job is driven to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Succeeded,
    Failed,
    /// Cancelled while still QUEUED.
    CancelledQueued,
    /// Cancelled while RUNNING.
    CancelledRunning,
    /// Left RUNNING (stored with `terminal = 1`, see `fill`).
    Running,
}

/// 60% SUCCEEDED, 20% FAILED, 12% CANCELLED (a third of them before they ran), 8% RUNNING.
fn fate(rng: &mut Rng) -> Fate {
    match rng.below(100) {
        0..=59 => Fate::Succeeded,
        60..=79 => Fate::Failed,
        80..=83 => Fate::CancelledQueued,
        84..=91 => Fate::CancelledRunning,
        _ => Fate::Running,
    }
}

/// Two job shapes: one replica, and a chief with two workers.
struct Shape {
    body: &'static str,
    prepared: Prepared,
}

const SINGLE_BODY: &str = r#"{
  "displayName": "x",
  "jobSpec": {
    "workerPoolSpecs": [{
      "machineSpec": {"machineType": "n1-standard-4"},
      "replicaCount": "1",
      "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "train.py"], "args": ["--epochs", "10", "--lr", "0.001"]}
    }],
    "scheduling": {"timeout": "86400s"}
  }
}"#;

const MULTI_BODY: &str = r#"{
  "displayName": "x",
  "jobSpec": {
    "workerPoolSpecs": [
      {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
       "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-m", "trainer.task"], "args": ["--distributed"]}},
      {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "2",
       "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-m", "trainer.task"], "args": ["--distributed"]}}
    ]
  }
}"#;

fn shapes(cfg: &Config) -> Result<Vec<Shape>> {
    let catalog = trainyard_core::catalog::Catalog::builtin();
    let mut out = Vec::new();
    for body in [SINGLE_BODY, MULTI_BODY] {
        let job = trainyard_api::parse_custom_job(body.as_bytes()).map_err(|e| anyhow!("job template: {}", e.message))?;
        trainyard_api::validate_custom_job(&job).map_err(|e| anyhow!("job template: {}", e.message))?;
        let prepared = prepare(&job, &catalog, &cfg.settings, &cfg.fleet, &cfg.quotas, &cfg.priority_classes, PROJECT)
            .map_err(|e| anyhow!("job template: {}", e.message))?;
        out.push(Shape { body, prepared });
    }
    Ok(out)
}

/// A log line with the time the driver would have written it.
struct TimedLine {
    time: Micros,
    line: LogLine,
}

/// Drive a new job through the lifecycle rules (`trainyard_core::step`) to `fate`, the way
/// the driver would with backend reports arriving at the given times. Returns the job and
/// its log lines.
fn simulate(job: Job, fate: Fate, settings: &Settings, rng: &mut Rng) -> Result<(Job, Vec<TimedLine>)> {
    let created = job.create_time;
    let mut lines = vec![TimedLine { time: created, line: LogLine { attempt: 0, replica: None, text: "Job queued.".into() } }];
    let mut job = job;
    let mut t = created;
    let apply = |job: &mut Job, ev: Event, now: Micros, lines: &mut Vec<TimedLine>| -> Result<Vec<Effect>> {
        let tr = step(job, ev, now, settings).map_err(|e| anyhow!("job {}: {e}", job.id))?;
        *job = tr.job;
        let mut rest = Vec::new();
        for e in tr.effects {
            match e {
                Effect::Log(line) => lines.push(TimedLine { time: now, line }),
                other => rest.push(other),
            }
        }
        Ok(rest)
    };
    if fate == Fate::CancelledQueued {
        t += 1_000_000 + rng.below(60_000_000) as Micros;
        apply(&mut job, Event::Cancel, t, &mut lines)?;
        return finish(job, lines);
    }
    // Admission and placement, about a second after creation.
    t += 200_000 + rng.below(1_500_000) as Micros;
    let n = job.replicas.len();
    let nodes = vec!["local".to_string(); n];
    let addresses = (0..n).map(|i| format!("127.0.0.2:{}", 20000 + i)).collect();
    let effects = apply(&mut job, Event::Place { nodes, addresses, notes: vec![] }, t, &mut lines)?;
    // Every replica starts a little later.
    let mut runs = Vec::new();
    for e in effects {
        if let Effect::Launch { run, .. } = e {
            runs.push(run);
        }
    }
    for run in &runs {
        t += 50_000 + rng.below(300_000) as Micros;
        apply(&mut job, Event::Started { run: run.clone() }, t, &mut lines)?;
    }
    if job.state() != State::Running {
        bail!("job {} is {:?} after its replicas started, not RUNNING", job.id, job.state());
    }
    // Runs for minutes to hours.
    t += 60_000_000 + rng.below(4 * 3_600_000_000) as Micros;
    let primary = runs.first().cloned().ok_or_else(|| anyhow!("job {} has no replica", job.id))?;
    let stops = match fate {
        Fate::Running => return Ok((job, lines)),
        Fate::Succeeded => {
            apply(&mut job, Event::Exited { run: primary, outcome: Outcome::Exited { code: 0 }, stderr_tail: vec![] }, t, &mut lines)?
        }
        Fate::Failed => {
            let tail = vec!["Traceback (most recent call last):".into(), "ValueError: loss is NaN".into()];
            apply(&mut job, Event::Exited { run: primary, outcome: Outcome::Exited { code: 1 }, stderr_tail: tail }, t, &mut lines)?
        }
        Fate::CancelledRunning => apply(&mut job, Event::Cancel, t, &mut lines)?,
        Fate::CancelledQueued => unreachable!(),
    };
    // Replicas that were told to stop exit on SIGTERM.
    let mut pending: Vec<RunId> = stops.into_iter().filter_map(|e| if let Effect::Stop { run, .. } = e { Some(run) } else { None }).collect();
    let mut bound = 0;
    while let Some(run) = pending.pop() {
        bound += 1;
        if bound > 64 {
            bail!("job {} does not settle", job.id);
        }
        t += 100_000 + rng.below(2_000_000) as Micros;
        let more = apply(&mut job, Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] }, t, &mut lines)?;
        for e in more {
            if let Effect::Stop { run, .. } = e {
                pending.push(run);
            }
        }
    }
    finish(job, lines)
}

fn finish(job: Job, lines: Vec<TimedLine>) -> Result<(Job, Vec<TimedLine>)> {
    if !job.is_terminal() {
        bail!("job {} ended as {:?}, not terminal", job.id, job.state());
    }
    Ok((job, lines))
}

struct FillStats {
    jobs: usize,
    events: usize,
    by_state: Vec<(String, usize)>,
    seconds: f64,
    bytes: u64,
}

/// Create the database in `data_dir` (schema by `Store::open`) and fill it in one
/// transaction: `jobs` jobs in `PROJECT`, and `other` in `OTHER_PROJECT` interleaved among
/// them (every 11th id), ids ascending with `create_time`. Non-terminal (RUNNING) jobs
/// are stored with `terminal = 1` so that a server started on the data dir does not adopt
/// them (it recovers `terminal = 0` jobs and would try to run them); their `state` and
/// `core` say RUNNING, as a list shows them.
fn fill(data_dir: &Path, jobs: usize, other: usize, cfg: &Config, shapes: &[Shape]) -> Result<FillStats> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let db = data_dir.join("trainyard.db");
    drop(Store::open(&db).with_context(|| format!("creating {}", db.display()))?);
    let started = Instant::now();
    let mut conn = Connection::open(&db)?;
    // The bulk load needs no per-commit durability; the final commit is synced below.
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    let mut rng = Rng(trainyard_core::rng::Rng::new(0x7261_696e_7961_7264));
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let total = jobs + other;
    // Job creation times: one job every 20-40 s, ending about now.
    let now = trainyard_server::driver::now_micros();
    let mut t = now - total as Micros * 30_000_000 - 3_600_000_000;
    let (mut in_project, mut in_other, mut events) = (0usize, 0usize, 0usize);
    let tx = conn.transaction()?;
    {
        let mut ins_job = tx.prepare(
            "INSERT INTO jobs (id, kind, project, region, display_name, state, create_time, update_time, terminal, resource, core)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10)",
        )?;
        let mut ins_label = tx.prepare("INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)")?;
        let mut ins_event =
            tx.prepare("INSERT INTO events (job_id, time, attempt, replica, text) VALUES (?1, ?2, ?3, ?4, ?5)")?;
        let mut id: u64 = 0;
        while in_project + in_other < total {
            id += 1;
            let to_other = in_other < other && (id % 11 == 0 || in_project == jobs);
            let (project, i) = if to_other {
                in_other += 1;
                (OTHER_PROJECT, in_other - 1)
            } else {
                in_project += 1;
                (PROJECT, in_project - 1)
            };
            t += 20_000_000 + rng.below(20_000_000) as Micros;
            let shape = &shapes[usize::from(rng.below(10) == 0)];
            let display_name = format!("run-{i}");
            let mut labels = vec![("team".to_string(), format!("t{}", i % 10))];
            if i % 2 == 0 {
                labels.push(("env".to_string(), if i % 4 == 0 { "prod" } else { "dev" }.to_string()));
            }
            // The resource as the driver stores it: the parsed request, output fields cleared.
            let mut resource = trainyard_api::parse_custom_job(shape.body.as_bytes()).map_err(|e| anyhow!("{}", e.message))?;
            resource.display_name = display_name.clone();
            resource.labels = labels.iter().cloned().collect();
            let resource_text = serde_json::to_string(&resource)?;
            let p = &shape.prepared;
            let job = Job::new(
                id,
                project.to_string(),
                REGION.to_string(),
                &p.pools,
                p.demand.clone(),
                p.policy.clone(),
                p.checkpoints,
                t,
            );
            let fate = fate(&mut rng);
            let (job, lines) = simulate(job, fate, &cfg.settings, &mut rng)?;
            let state = job.state().wire_name();
            *counts.entry(format!("{project} {state}")).or_default() += 1;
            ins_job.execute(params![
                id as i64,
                KIND,
                project,
                REGION,
                display_name,
                state,
                job.create_time,
                job.update_time,
                resource_text,
                serde_json::to_string(&job)?,
            ])?;
            for (k, v) in &labels {
                ins_label.execute(params![id as i64, k, v])?;
            }
            for l in &lines {
                ins_event.execute(params![id as i64, l.time, l.line.attempt, l.line.replica, l.line.text])?;
            }
            events += lines.len();
        }
    }
    tx.commit()?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // No ANALYZE: the server never runs it, so its planner works without statistics.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    drop(conn);
    let bytes = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    Ok(FillStats { jobs: total, events, by_state: counts.into_iter().collect(), seconds: started.elapsed().as_secs_f64(), bytes })
}

// ---------------------------------------------------------------------------------------
// Server process and HTTP client

struct Server {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Server {
    fn start(bin: &Path, data_dir: &Path, log: &Path) -> Result<Server> {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
            l.local_addr()?.port()
        };
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .env("TRAINYARD_CONTAINER_ENGINE", "none")
            .arg(data_dir)
            .env_remove("TRAINYARD_CONFIG")
            .env_remove("TRAINYARD_TOKENS")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} (build it: cargo build --release -p trainyard)", bin.display()))?;
        let mut server = Server { child, base: format!("http://127.0.0.1:{port}"), log: log.to_owned() };
        let agent = agent();
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!("the server exited ({status}) before answering; its log: {}", server.log.display());
            }
            if let Ok(mut r) = agent.get(&format!("{}/healthz", server.base)).call() {
                if r.status().is_success() && r.body_mut().read_to_string().is_ok() {
                    return Ok(server);
                }
            }
            if Instant::now() > deadline {
                server.stop();
                bail!("the server did not answer /healthz within {START_BOUND:?}; its log: {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn list_url(&self, filter: Option<&str>, token: Option<&str>) -> String {
        let mut u = format!("{}/v1/projects/{PROJECT}/locations/{REGION}/customJobs?pageSize={PAGE_SIZE}", self.base);
        if let Some(f) = filter {
            u.push_str("&filter=");
            u.push_str(&encode(f));
        }
        if let Some(t) = token {
            u.push_str("&pageToken=");
            u.push_str(&encode(t));
        }
        u
    }

    /// SIGTERM, then SIGKILL if it has not exited within 10 s.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// A query value or path segment: everything but RFC 3986's unreserved characters escaped.
fn encode(s: &str) -> String {
    const UNRESERVED: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// One GET: the time from before sending to the whole body read, and the parsed body.
fn get(agent: &ureq::Agent, url: &str) -> Result<(f64, Value)> {
    let start = Instant::now();
    let mut resp = agent.get(url).call().with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    let text = resp.body_mut().with_config().limit(64 << 20).read_to_string().context("reading the response")?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() {
        bail!("GET {url}: {status}: {text}");
    }
    Ok((ms, serde_json::from_str(&text).context("response is not JSON")?))
}

fn jobs_of(v: &Value) -> &[Value] {
    v["customJobs"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn token_of(v: &Value) -> Option<String> {
    v["nextPageToken"].as_str().map(str::to_string)
}

// ---------------------------------------------------------------------------------------
// Cases

#[derive(Clone, Copy, PartialEq, Eq)]
enum CaseId {
    A,
    B,
    C,
    D,
    E,
}

struct Case {
    id: CaseId,
    label: &'static str,
    filter: Option<&'static str>,
    /// Page number to time (1 = first page).
    page: usize,
}

/// The request of one case on one server, resolved: the URL (with the page token of the
/// wanted page, found by following `nextPageToken`), and what was found on the way.
struct Resolved {
    url: String,
    /// The page actually timed (smaller than asked when the list has fewer pages).
    page: usize,
    /// `id < ?` of the SQL: the position in the token, if any.
    before: Option<u64>,
    jobs_on_page: usize,
    walk_ms: f64,
}

fn resolve(agent: &ureq::Agent, server: &Server, case: &Case) -> Result<Resolved> {
    let started = Instant::now();
    let mut token: Option<String> = None;
    let mut page = 1;
    let mut before = None;
    while page < case.page {
        let (_, v) = get(agent, &server.list_url(case.filter, token.as_deref()))?;
        let Some(next) = token_of(&v) else { break };
        before = Some(u64::from_str_radix(next.split('.').next().unwrap_or(""), 16).context("page token position")?);
        token = Some(next);
        page += 1;
    }
    let walk_ms = started.elapsed().as_secs_f64() * 1000.0;
    let url = server.list_url(case.filter, token.as_deref());
    let (_, v) = get(agent, &url)?;
    let jobs = jobs_of(&v);
    check_page(case, jobs)?;
    Ok(Resolved { url, page, before, jobs_on_page: jobs.len(), walk_ms })
}

/// The answer is what the case asked for: project `bench` only, filter obeyed.
fn check_page(case: &Case, jobs: &[Value]) -> Result<()> {
    let prefix = format!("projects/{PROJECT}/locations/{REGION}/customJobs/");
    for j in jobs {
        let name = j["name"].as_str().unwrap_or("");
        if !name.starts_with(&prefix) {
            bail!("case {}: job {name:?} is not in project {PROJECT}", case.label);
        }
        let matches = match case.id {
            CaseId::B | CaseId::D => j["labels"]["team"] == "t3" && j["state"] == "JOB_STATE_SUCCEEDED",
            CaseId::E => j["displayName"] == "run-77777",
            CaseId::A | CaseId::C => true,
        };
        if !matches {
            bail!("case {}: job {name} does not match the filter", case.label);
        }
    }
    Ok(())
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

#[derive(Clone, Copy)]
struct Pcts {
    p50: f64,
    p99: f64,
}

fn pcts(mut v: Vec<f64>) -> Pcts {
    v.sort_by(|a, b| a.total_cmp(b));
    Pcts { p50: pct(&v, 0.50), p99: pct(&v, 0.99) }
}

// ---------------------------------------------------------------------------------------
// The SQL of `Store::list_jobs`

/// The statement and parameters `Store::list_jobs` runs for this request (the server asks
/// for `page_size + 1` rows to know whether there is a next page).
fn list_sql(filter: Option<&str>, before: Option<u64>) -> Result<(String, Vec<SqlValue>)> {
    let compiled = trainyard_store::filter::compile(filter.unwrap_or(""), &STATE_NAMES, trainyard_store::Dialect::Sqlite).map_err(|e| anyhow!("{e}"))?;
    let mut sql = String::from("SELECT id, kind, resource, core FROM jobs WHERE kind = ? AND project = ? AND region = ?");
    let mut values: Vec<SqlValue> = vec![KIND.to_string().into(), PROJECT.to_string().into(), REGION.to_string().into()];
    if let Some(b) = before {
        sql.push_str(" AND id < ?");
        values.push((b as i64).into());
    }
    if let Some(c) = &compiled {
        sql.push_str(" AND (");
        sql.push_str(&c.sql);
        sql.push(')');
        values.extend(c.params.iter().cloned());
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?");
    values.push(((PAGE_SIZE + 1) as i64).into());
    Ok((sql, values))
}

struct Plan {
    lines: Vec<String>,
}

fn explain(conn: &Connection, sql: &str, values: &[SqlValue]) -> Result<Plan> {
    let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
    let rows = st.query_map(rusqlite::params_from_iter(values.iter()), |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(3)?))
    })?;
    let mut depth: std::collections::HashMap<i64, usize> = Default::default();
    let mut lines = Vec::new();
    for row in rows {
        let (id, parent, detail) = row?;
        let d = if parent == 0 { 0 } else { depth.get(&parent).copied().unwrap_or(0) + 1 };
        depth.insert(id, d);
        lines.push(format!("{}{}", "  ".repeat(d), detail));
    }
    Ok(Plan { lines })
}

/// Run the statement in-process `n` times (after `warmup`), reading every column as the
/// store does (without decoding the JSON). Returns the times and the VM steps of one run.
fn time_sql(conn: &Connection, sql: &str, values: &[SqlValue], n: usize, warmup: usize) -> Result<(Pcts, i32, usize)> {
    let mut samples = Vec::with_capacity(n);
    let mut steps = 0;
    let mut rows_out = 0;
    for i in 0..warmup + n {
        let mut st = conn.prepare_cached(sql)?;
        let _ = st.reset_status(rusqlite::StatementStatus::VmStep);
        let start = Instant::now();
        let mut rows = st.query(rusqlite::params_from_iter(values.iter()))?;
        let mut count = 0;
        while let Some(r) = rows.next()? {
            let _: (i64, String, String, String) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            count += 1;
        }
        drop(rows);
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        if i >= warmup {
            samples.push(ms);
        }
        steps = st.get_status(rusqlite::StatementStatus::VmStep);
        rows_out = count;
    }
    Ok((pcts(samples), steps, rows_out))
}

// ---------------------------------------------------------------------------------------

fn run(opts: &Opts) -> Result<()> {
    let server_bin = std::fs::canonicalize(&opts.server_bin)
        .with_context(|| format!("{} (build it: cargo build --release -p trainyard)", opts.server_bin.display()))?;
    let tmp = tempfile::Builder::new().prefix("list-bench-").tempdir()?;
    let root = tmp.path().to_owned();
    let big_dir = root.join("large");
    let small_dir = root.join("baseline");
    let cfg = Config::builtin(Some(big_dir.clone()));
    let shapes = shapes(&cfg)?;

    println!("list-bench: GET /v1/projects/{PROJECT}/locations/{REGION}/customJobs, pageSize={PAGE_SIZE}");
    println!("  server: {}", server_bin.display());
    println!("  data:   {}", root.display());
    if cfg!(debug_assertions) {
        println!("  NOTE: list-bench itself is a debug build (the server is what is measured, but the client adds more)");
    }
    println!();

    print!("filling the large database ({} jobs in {PROJECT}, {} in {OTHER_PROJECT}) ... ", opts.jobs, opts.other);
    std::io::stdout().flush()?;
    let big = fill(&big_dir, opts.jobs, opts.other, &cfg, &shapes)?;
    println!("{:.1} s: {} jobs, {} events, {:.0} MB", big.seconds, big.jobs, big.events, big.bytes as f64 / 1e6);
    for (k, n) in &big.by_state {
        println!("    {k:<40} {n:>7}");
    }
    print!("filling the baseline database ({} jobs in {PROJECT}) ... ", opts.baseline_jobs);
    std::io::stdout().flush()?;
    let small = fill(&small_dir, opts.baseline_jobs, 0, &cfg, &shapes)?;
    println!("{:.2} s ({} jobs)", small.seconds, small.jobs);

    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let mut big_srv = Server::start(&server_bin, &big_dir, &root.join("large-server.log"))?;
    let mut small_srv = Server::start(&server_bin, &small_dir, &root.join("baseline-server.log"))?;
    println!("servers: large at {}, baseline at {}", big_srv.base, small_srv.base);

    let cases = [
        Case { id: CaseId::A, label: "a first page", filter: None, page: 1 },
        Case { id: CaseId::B, label: "b filtered first page", filter: Some(FILTER_B), page: 1 },
        Case { id: CaseId::C, label: "c deep page", filter: None, page: opts.deep },
        Case { id: CaseId::D, label: "d deep filtered page", filter: Some(FILTER_B), page: opts.deep_filtered },
        Case { id: CaseId::E, label: "e selective filter", filter: Some(FILTER_E), page: 1 },
    ];
    println!("  b, d filter: {FILTER_B}");
    println!("  e filter:    {FILTER_E}");
    println!("timing {} requests per case and server (after {} warm-up), interleaved large/baseline ...", opts.n, opts.warmup);

    let agent_big = agent();
    let agent_small = agent();
    struct Row {
        big: Pcts,
        small: Pcts,
        rb: Resolved,
        rs: Resolved,
    }
    let mut rows = Vec::new();
    for case in &cases {
        let rb = resolve(&agent_big, &big_srv, case)?;
        let rs = resolve(&agent_small, &small_srv, case)?;
        if rb.page != case.page {
            bail!("case {}: the large database has only {} pages of this query, {} wanted", case.label, rb.page, case.page);
        }
        for _ in 0..opts.warmup {
            get(&agent_big, &rb.url)?;
            get(&agent_small, &rs.url)?;
        }
        let (mut sb, mut ss) = (Vec::with_capacity(opts.n), Vec::with_capacity(opts.n));
        for _ in 0..opts.n {
            sb.push(get(&agent_big, &rb.url)?.0);
            ss.push(get(&agent_small, &rs.url)?.0);
        }
        rows.push(Row { big: pcts(sb), small: pcts(ss), rb, rs });
    }
    big_srv.stop();
    small_srv.stop();

    println!();
    println!("HTTP latency, ms (nearest-rank; N={} per cell; client-side, from send to body read); large = {} jobs in {PROJECT}, base = {}; ratio = large/base", opts.n, opts.jobs, opts.baseline_jobs);
    println!(
        "| {:<24} | {:>8} | {:>6} | {:>7} | {:>7} | {:>8} | {:>6} | {:>7} | {:>7} | {:>9} | {:>9} |",
        "case", "large pg", "jobs", "p50", "p99", "base pg", "jobs", "p50", "p99", "ratio p50", "ratio p99"
    );
    println!("|{}|", ["-"; 11].iter().enumerate().map(|(i, _)| "-".repeat([26, 10, 8, 9, 9, 10, 8, 9, 9, 11, 11][i])).collect::<Vec<_>>().join("|"));
    for (case, r) in cases.iter().zip(&rows) {
        println!(
            "| {:<24} | {:>8} | {:>6} | {:>7.2} | {:>7.2} | {:>8} | {:>6} | {:>7.2} | {:>7.2} | {:>8.1}x | {:>8.1}x |",
            case.label,
            r.rb.page,
            r.rb.jobs_on_page,
            r.big.p50,
            r.big.p99,
            r.rs.page,
            r.rs.jobs_on_page,
            r.small.p50,
            r.small.p99,
            r.big.p50 / r.small.p50,
            r.big.p99 / r.small.p99,
        );
    }
    println!("(\"pg\": the page timed; \"jobs\": jobs on it. The baseline has fewer pages than c and d ask for:");
    println!(" it times its last page. Walking to page {} took {:.0} ms (c), to page {} {:.0} ms (d), on the large server.)",
        rows[2].rb.page, rows[2].rb.walk_ms, rows[3].rb.page, rows[3].rb.walk_ms);

    // The SQL of each request, on the large database (servers stopped).
    let conn = Connection::open_with_flags(big_dir.join("trainyard.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    println!();
    println!("SQL of each request on the large database (shape of Store::list_jobs, condition from filter::compile),");
    println!("run in-process {} times, reading the 4 columns without decoding JSON:", opts.n);
    let mut slow = Vec::new();
    for (case, r) in cases.iter().zip(&rows) {
        let (sql, values) = list_sql(case.filter, r.rb.before)?;
        let plan = explain(&conn, &sql, &values)?;
        let (t, steps, nrows) = time_sql(&conn, &sql, &values, opts.n, opts.warmup)?;
        println!();
        println!("({}) {}", case.label, sql);
        println!("    params: {}", values.iter().map(show_value).collect::<Vec<_>>().join(", "));
        println!("    EXPLAIN QUERY PLAN:");
        for l in &plan.lines {
            println!("      {l}");
        }
        println!("    SQL alone: p50 {:.2} ms, p99 {:.2} ms, {} rows, {} VM steps", t.p50, t.p99, nrows, steps);
        if r.big.p50 > SLOW_MS {
            slow.push((case, t));
        }
    }
    println!();
    if slow.is_empty() {
        println!("No case is above {SLOW_MS} ms p50 over HTTP.");
    }
    // The suggested indexes the store does not have yet (it has had both for a while: a
    // slow case is then the machine's load, not the plan).
    let missing: Vec<&str> = ["jobs_by_name", "jobs_by_state"]
        .into_iter()
        .filter(|name| {
            conn.query_row("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?1", params![name], |_| Ok(())).is_err()
        })
        .collect();
    for (case, _) in &slow {
        match case.id {
            CaseId::E if missing.contains(&"jobs_by_name") => println!(
                "({}) is above {SLOW_MS} ms p50: `display_name = ?` is tested on every row of the project, walked \
                 through jobs_by_parent. Fix: CREATE INDEX jobs_by_name ON jobs(kind, project, region, display_name) \
                 (the rowid that ends every index entry keeps equal names in id order, so ORDER BY id DESC LIMIT needs no sort).",
                case.label
            ),
            CaseId::B | CaseId::D if missing.contains(&"jobs_by_state") => println!(
                "({}) is above {SLOW_MS} ms p50: state and the label are tested row by row along jobs_by_parent. \
                 Candidate: CREATE INDEX jobs_by_state ON jobs(kind, project, region, state) (id order kept by the rowid).",
                case.label
            ),
            CaseId::A | CaseId::C => println!("({}) is above {SLOW_MS} ms p50 with no filter: see the plan above.", case.label),
            _ => println!("({}) is above {SLOW_MS} ms p50: see the plan above.", case.label),
        }
    }
    if !slow.is_empty() && missing.is_empty() {
        println!("The store has both indexes already: the slow cases above come from the plan shown, or the machine's load.");
    }
    if !slow.is_empty() && !missing.is_empty() {
        // Check the suggested index on a scratch copy of the large database.
        let scratch = root.join("scratch.db");
        conn.execute("VACUUM INTO ?1", params![scratch.to_string_lossy()])?;
        let sc = Connection::open(&scratch)?;
        sc.execute_batch(
            "CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs(kind, project, region, display_name);
             CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(kind, project, region, state);",
        )?;
        println!();
        println!("On a scratch copy of the large database with those indexes (the store is not changed):");
        for (case, before) in &slow {
            let r = &rows[cases.iter().position(|c| c.id == case.id).unwrap_or(0)];
            let (sql, values) = list_sql(case.filter, r.rb.before)?;
            let plan = explain(&sc, &sql, &values)?;
            let (t, steps, nrows) = time_sql(&sc, &sql, &values, opts.n, opts.warmup)?;
            println!("({})", case.label);
            for l in &plan.lines {
                println!("      {l}");
            }
            println!(
                "    SQL alone: p50 {:.3} ms (was {:.2}), p99 {:.3} ms (was {:.2}), {} rows, {} VM steps",
                t.p50, before.p50, t.p99, before.p99, nrows, steps
            );
        }
    }

    if opts.keep {
        let kept = tmp.keep();
        println!("\nkept {}", kept.display());
    }
    Ok(())
}

fn show_value(v: &SqlValue) -> String {
    match v {
        SqlValue::NullText => "NULL".into(),
        SqlValue::Integer(i) => i.to_string(),
        SqlValue::Real(f) => f.to_string(),
        SqlValue::Text(t) => format!("{t:?}"),
        SqlValue::Ints(v) => format!("{v:?}"),
        SqlValue::Texts(v) => format!("{v:?}"),
    }
}
