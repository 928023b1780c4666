//! `create-bench`: how fast `trainyard serve` accepts CustomJobs, with an empty queue and
//! with a long one, against SQLite's own rate of one-row durable transactions measured in
//! the same run on the same disk.
//!
//! The server is the real binary (`target/release/trainyard serve`) on a small fleet (one
//! 4-CPU node, n1-standard-4 jobs: one runs, the rest queue). Clients are threads with
//! keep-alive connections, each creating jobs one after the other. For the long queue,
//! the queued jobs are written into the database before the server starts (as a server
//! that was stopped with them would have left them), so the server recovers them all.
//!
//! Printed: creates/s, create latency p50/p99, the server's CPU time per create (from
//! /proc), lifecycle log lines per queued job, and the ratios against the baselines.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use trainyard_api::CustomJob;
use trainyard_core::job::Job;
use trainyard_server::jobspec::prepare;
use trainyard_server::Config;
use trainyard_store::{NewJob, Store};

const USAGE: &str = "\
usage: create-bench [--queued N] [--clients N] [--creates N] [--baseline N] [--quick] [--metrics N]
                    [--metrics-cost] [--backup] [--postgres URL] [--grpc]

  --queued N    jobs queued before the long-queue measurement (default 100000)
  --clients N   concurrent clients (default 8)
  --creates N   creates per measurement, over all clients (default 2000)
  --baseline N  one-row SQLite transactions for the baseline (default 500)
  --quick       --queued 2000 --creates 400 --baseline 100 (a smoke test)
  --metrics N   after the long-queue run, GET /metrics N times: render time p50/p99
  --backup      after the long-queue run, the same creates again while online backups
                of the database (POST /v1/admin/backup) run one after the other, three
                runs with and three without, alternating: each backup's time, and the
                median create p99 with them against without
  --metrics-cost  only this: creates against a server with metrics and one with
                `[metrics] enabled = false`, alternating, 3 rounds each: the ratio
  --grpc        only this: creates (empty queue) over REST (HTTP/1.1, a keep-alive
                connection per client) and over gRPC (HTTP/2, a connection per client),
                the same client (hyper) for both, alternating, a server for each
                measurement, 3 rounds each: creates/s and p50/p99
  --postgres URL  only this: creates (empty queue) against a server whose store is
                PostgreSQL (a new schema on the server at URL, whose user may create
                schemas) and one on SQLite, alternating, 3 rounds each: creates/s and p99

Build with `cargo build --release -p trainyard -p trainyard-bench`; run
target/release/create-bench (it starts target/release/trainyard).";

struct Opts {
    queued: usize,
    clients: usize,
    creates: usize,
    baseline: usize,
    metrics: usize,
    metrics_cost: bool,
    backup: bool,
    postgres: Option<String>,
    grpc: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { queued: 100_000, clients: 8, creates: 2000, baseline: 500, metrics: 0, metrics_cost: false, backup: false, postgres: None, grpc: false };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| entry::number::<usize>(&mut it, name);
            match a.as_str() {
                "--queued" => o.queued = num("--queued")?,
                "--clients" => o.clients = num("--clients")?.max(1),
                "--creates" => o.creates = num("--creates")?.max(1),
                "--baseline" => o.baseline = num("--baseline")?.max(1),
                "--metrics" => o.metrics = num("--metrics")?,
                "--metrics-cost" => o.metrics_cost = true,
                "--backup" => o.backup = true,
                "--grpc" => o.grpc = true,
                "--postgres" => o.postgres = Some(it.next().ok_or_else(|| anyhow!("--postgres needs a URL"))?.clone()),
                "--quick" => {
                    o.queued = 2000;
                    o.creates = 400;
                    o.baseline = 100;
                }
                "-h" | "--help" => return Ok(None),
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(Some(o))
    }
}

#[path = "../shared/entry.rs"]
mod entry;
#[path = "../shared/row.rs"]
mod row;

fn main() -> ExitCode {
    entry::main_of("create-bench", USAGE, Opts::parse, run)
}

const CONFIG: &str = "\
[node]
name = \"small\"
cpus = 4
memory_gb = 16
[limits]
max_live_jobs_per_project = 1000000
writes_per_second_per_project = 1000000.0
write_burst_per_project = 1000000
";

fn job_body(name: &str) -> serde_json::Value {
    serde_json::json!({
        "displayName": name,
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "local/bench", "command": ["true"]},
        }]},
    })
}

#[path = "../shared/server.rs"]
mod server;
use server::{agent, quantile, timed_posts, Server};

/// `trainyard serve` on `dir` (its `trainyard.toml` and `data/`); its warnings on stderr.
/// Up to 600 s for `/healthz`: a server recovers a long queue first.
fn start_server(exe: &Path, dir: &Path) -> Result<Server> {
    Server::start(exe, &dir.join("trainyard.toml"), &dir.join("data"), Duration::from_secs(600), |c| {
        c.env("TRAINYARD_LOG", "warn").stderr(Stdio::inherit());
    })
}

struct Measured {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms_per_create: f64,
}

/// `n` creates from `clients` threads; latency of each, wall time of all.
fn measure(server: &Server, clients: usize, n: usize, tag: &str) -> Result<Measured> {
    let url = format!("{}/v1/projects/bench/locations/us-central1/customJobs", server.base);
    let cpu0 = server.cpu_secs()?;
    let start = Instant::now();
    let tag = tag.to_string();
    let lat = timed_posts(&url, clients, n, move |c, i| job_body(&format!("{tag}-{c}-{i}")).to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = server.cpu_secs()? - cpu0;
    Ok(Measured { per_sec: n as f64 / wall, p50_ms: quantile(&lat, 0.5), p99_ms: quantile(&lat, 0.99), cpu_ms_per_create: cpu * 1000.0 / n as f64 })
}

/// The same creates while online backups run one after the other (each a new file),
/// alternating with runs without them (three of each: the server's own pauses, e.g. its
/// scheduling rounds over the long queue, come and go): the backups' time, and the median
/// create p99 with them against without.
fn backup_during_creates(server: &Server, dir: &Path, o: &Opts) -> Result<()> {
    let (mut with, mut without, mut times, mut jobs) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for round in 0..3 {
        without.push(measure(server, o.clients, o.creates, &format!("no-backup-{round}"))?.p99_ms);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = format!("{}/v1/admin/backup", server.base);
        let (stop2, dir2) = (Arc::clone(&stop), dir.to_path_buf());
        let backups = std::thread::spawn(move || -> Result<Vec<(f64, u64)>> {
            let agent = agent();
            let mut done = Vec::new();
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) || done.is_empty() {
                let to = dir2.join(format!("backup-{round}-{}.db", done.len()));
                let t = Instant::now();
                let mut r = agent.post(&url).header("Content-Type", "application/json").send(serde_json::json!({ "to": to }).to_string().as_bytes())?;
                let body = r.body_mut().read_to_string()?;
                if !r.status().is_success() {
                    bail!("backup answered {}: {body}", r.status());
                }
                let v: serde_json::Value = serde_json::from_str(&body)?;
                done.push((t.elapsed().as_secs_f64(), v["jobs"].as_u64().unwrap_or(0)));
                let _ = std::fs::remove_file(&to);
            }
            Ok(done)
        });
        let m = measure(server, o.clients, o.creates, &format!("backup-{round}"));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let done = backups.join().map_err(|_| anyhow!("the backup thread panicked"))??;
        with.push(m?.p99_ms);
        times.extend(done.iter().map(|d| d.0));
        jobs = done.last().map_or(jobs, |d| d.1);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, wo) = (median(&mut with), median(&mut without));
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    println!(
        "long queue: {} online backups of {jobs} jobs, {mean:.2} s each; create p99 (median of 3 runs) {w:.1} ms during them against {wo:.1} ms without ({:.2}x)",
        times.len(),
        w / wo
    );
    row::row("create-bench", &format!("create p99 during online backups of {jobs} jobs ({mean:.2} s each)"), &format!("{w:.1} ms"), &format!("{wo:.1} ms without"), w / wo);
    Ok(())
}

/// `GET /metrics` `n` times, one after the other, with `stored` jobs in the store: the time
/// of each (render and transfer), p50 and p99, and the size of the exposition.
fn scrape_metrics(server: &Server, n: usize, stored: usize) -> Result<()> {
    let agent = agent();
    let url = format!("{}/metrics", server.base);
    let mut lat = Vec::with_capacity(n);
    let mut size = 0;
    for _ in 0..n {
        let t = Instant::now();
        let mut resp = agent.get(&url).call().context("GET /metrics")?;
        let text = resp.body_mut().read_to_string().context("reading /metrics")?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if !resp.status().is_success() {
            bail!("/metrics answered {}: {text}", resp.status());
        }
        size = text.len();
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "long queue: GET /metrics x{n} with {stored} stored jobs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({size} bytes)",
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );
    Ok(())
}

/// SQLite's own rate of durable one-row transactions (WAL, synchronous=FULL, as the
/// store), on the same disk.
fn sqlite_baseline(dir: &Path, n: usize) -> Result<f64> {
    let conn = rusqlite::Connection::open(dir.join("baseline.db"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL)")?;
    let body = job_body("baseline").to_string();
    let start = Instant::now();
    for _ in 0..n {
        conn.execute("INSERT INTO t (body) VALUES (?1)", [&body])?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Write `n` queued jobs into a new database, as the server would have.
fn fill_queue(dir: &Path, n: usize) -> Result<()> {
    let cfg = Config::load(&dir.join("trainyard.toml"), Some(dir.join("data"))).map_err(|e| anyhow!("{e}"))?;
    std::fs::create_dir_all(dir.join("data"))?;
    let mut store = Store::open(&dir.join("data").join("trainyard.db"))?;
    let resource: CustomJob = trainyard_api::parse_custom_job(job_body("queued").to_string().as_bytes()).map_err(|e| anyhow!("{}", e.message))?;
    let prepared = prepare(&resource, &cfg.catalog, &cfg.settings, &cfg.fleet, &cfg.quotas, &cfg.priority_classes, "bench").map_err(|e| anyhow!("{}", e.message))?;
    let text = serde_json::to_string(&resource)?;
    let now = trainyard_server::driver::now_micros();
    let mut left = n;
    while left > 0 {
        let k = left.min(10_000);
        let news: Vec<NewJob<'_>> = (0..k)
            .map(|_| NewJob { kind: "custom", project: "bench", region: &cfg.region, display_name: "queued", labels: &[], resource: &text })
            .collect();
        store.insert_jobs(&news, |_, id| {
            Job::new(id, "bench".into(), cfg.region.clone(), &prepared.pools, prepared.demand.clone(), prepared.policy.clone(), prepared.checkpoints, now)
        })?;
        left -= k;
    }
    Ok(())
}

/// One scheduling round of the server's kind (`schedule_with`, reasons included) over `n`
/// queued jobs on the bench's fleet, in this process: median of 5, in ms.
fn round_ms(dir: &Path, n: usize) -> Result<f64> {
    let cfg = Config::load(&dir.join("trainyard.toml"), Some(dir.join("data"))).map_err(|e| anyhow!("{e}"))?;
    let resource: CustomJob = trainyard_api::parse_custom_job(job_body("queued").to_string().as_bytes()).map_err(|e| anyhow!("{}", e.message))?;
    let p = prepare(&resource, &cfg.catalog, &cfg.settings, &cfg.fleet, &cfg.quotas, &cfg.priority_classes, "bench").map_err(|e| anyhow!("{}", e.message))?;
    let jobs: Vec<Job> = (1..=n as u64)
        .map(|id| Job::new(id, "bench".into(), cfg.region.clone(), &p.pools, p.demand.clone(), p.policy.clone(), p.checkpoints, id as i64))
        .collect();
    let refs: Vec<&Job> = jobs.iter().collect();
    let now = trainyard_server::driver::now_micros();
    let mut t = Vec::new();
    let sched = if std::env::var_os("CREATE_BENCH_NO_EXPLAIN").is_some() {
        trainyard_core::schedule::SchedulerConfig { explain: false, ..cfg.scheduler.clone() }
    } else {
        cfg.scheduler.clone()
    };
    for _ in 0..5 {
        let start = Instant::now();
        let d = trainyard_core::schedule::schedule_with(&refs, &cfg.fleet, &cfg.quotas, now, &sched, &Default::default());
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        std::hint::black_box(d);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[2])
}

fn count(db: &Path, sql: &str) -> Result<i64> {
    let conn = rusqlite::Connection::open(db)?;
    Ok(conn.query_row(sql, [], |r| r.get(0))?)
}

fn exe_beside(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("finding this program")?;
    let p = me.parent().map(|d| d.join(name)).ok_or_else(|| anyhow!("no directory of {}", me.display()))?;
    if !p.exists() {
        bail!("{} not found: build it with `cargo build --release -p trainyard`", p.display());
    }
    Ok(p)
}

fn run(o: &Opts) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    if std::env::var_os("CREATE_BENCH_ROUND_ONLY").is_some() {
        std::fs::write(tmp.path().join("trainyard.toml"), CONFIG)?;
        println!("one scheduling round over {} queued jobs: {:.1} ms", o.queued, round_ms(tmp.path(), o.queued)?);
        return Ok(());
    }
    let exe = exe_beside("trainyard")?;
    if o.metrics_cost {
        return metrics_cost(&exe, tmp.path(), o);
    }
    if o.grpc {
        return grpc_against_rest(&exe, tmp.path(), o);
    }
    if let Some(url) = &o.postgres {
        return postgres_against_sqlite(&exe, tmp.path(), url, o);
    }
    println!("create-bench: {} clients, {} creates per measurement, {} queued for the long queue", o.clients, o.creates, o.queued);
    let sqlite = sqlite_baseline(tmp.path(), o.baseline)?;
    println!("baseline: SQLite one-row durable transactions: {sqlite:.0}/s");

    let mut rows = Vec::new();
    for (label, queued) in [("empty queue", 0usize), ("long queue", o.queued)] {
        let dir = tmp.path().join(label.replace(' ', "-"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("trainyard.toml"), CONFIG)?;
        if queued > 0 {
            println!("{label}: one scheduling round over {queued} queued jobs: {:.1} ms (1,000 queued: {:.2} ms)", round_ms(&dir, queued)?, round_ms(&dir, 1000)?);
            let t = Instant::now();
            fill_queue(&dir, queued)?;
            println!("{label}: {queued} queued jobs written in {:.1} s", t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let server = start_server(&exe, &dir)?;
        println!("{label}: server up in {:.1} s", t.elapsed().as_secs_f64());
        // Warm up (connections, first rounds), then measure.
        measure(&server, o.clients, (o.creates / 10).max(o.clients), "warmup")?;
        let m = measure(&server, o.clients, o.creates, "bench")?;
        if queued > 0 && o.metrics > 0 {
            scrape_metrics(&server, o.metrics, queued + o.creates + (o.creates / 10).max(o.clients))?;
        }
        if queued > 0 && o.backup {
            backup_during_creates(&server, &dir, o)?;
        }
        // Let the rounds catch up, then count what was written per queued job.
        std::thread::sleep(Duration::from_secs(2));
        drop(server);
        let db = dir.join("data").join("trainyard.db");
        let jobs = count(&db, "SELECT count(*) FROM jobs")?;
        let lines = count(&db, "SELECT count(*) FROM events")?;
        println!(
            "{label}: {:.0} creates/s, p50 {:.1} ms, p99 {:.1} ms, server CPU {:.2} ms per create, {:.2} log lines per job ({} jobs)",
            m.per_sec,
            m.p50_ms,
            m.p99_ms,
            m.cpu_ms_per_create,
            lines as f64 / jobs.max(1) as f64,
            jobs
        );
        row::row("create-bench", &format!("creates/s, {label}"), &format!("{:.0}/s", m.per_sec), &format!("{sqlite:.0}/s SQLite 1-row txn"), m.per_sec / sqlite);
        rows.push((label, m, lines as f64 / jobs.max(1) as f64));
    }
    println!();
    println!("| queue | creates/s | vs SQLite 1-row txn/s | p50 ms | p99 ms | CPU ms/create | log lines/job |");
    println!("|---|---|---|---|---|---|---|");
    for (label, m, lines) in &rows {
        println!(
            "| {label} | {:.0} | {:.2}x | {:.1} | {:.1} | {:.2} | {:.2} |",
            m.per_sec,
            m.per_sec / sqlite,
            m.p50_ms,
            m.p99_ms,
            m.cpu_ms_per_create,
            lines
        );
    }
    if let [(_, empty, _), (_, long, _)] = rows.as_slice() {
        println!(
            "long queue vs empty: creates/s {:.2}x, p99 {:.2}x, CPU per create {:.2}x",
            long.per_sec / empty.per_sec,
            long.p99_ms / empty.p99_ms,
            long.cpu_ms_per_create / empty.cpu_ms_per_create.max(1e-9)
        );
    }
    cancels_in_flight(&exe, tmp.path(), o)?;
    Ok(())
}

/// The same creates (empty queue) against a server on a PostgreSQL store and one on
/// SQLite, alternating so that the machine's drift falls on both; medians of 3 rounds.
fn postgres_against_sqlite(exe: &Path, tmp: &Path, admin: &str, o: &Opts) -> Result<()> {
    const ROUNDS: usize = 3;
    println!("create-bench --postgres: {} clients, {} creates per measurement, {ROUNDS} rounds", o.clients, o.creates);
    let mut client = postgres::Client::connect(admin, postgres::NoTls).context("connecting to --postgres")?;
    let (mut pg, mut lite) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for on_pg in [true, false] {
            let dir = tmp.join(format!("store-{on_pg}-{round}"));
            std::fs::create_dir_all(&dir)?;
            let config = if on_pg {
                let schema = format!("create_bench_{}_{round}", std::process::id());
                client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))?;
                let sep = if admin.contains('?') { '&' } else { '?' };
                format!("{CONFIG}[store]\nurl = \"{admin}{sep}options=-csearch_path%3D{schema}\"\n")
            } else {
                CONFIG.to_string()
            };
            std::fs::write(dir.join("trainyard.toml"), config)?;
            let server = start_server(exe, &dir)?;
            measure(&server, o.clients, (o.creates / 10).max(o.clients), "warmup")?;
            let m = measure(&server, o.clients, o.creates, "bench")?;
            println!("round {round}, {}: {:.0} creates/s, p50 {:.1} ms, p99 {:.1} ms", if on_pg { "PostgreSQL" } else { "SQLite" }, m.per_sec, m.p50_ms, m.p99_ms);
            if on_pg { pg.push(m) } else { lite.push(m) }
        }
    }
    let median = |v: &[Measured], f: fn(&Measured) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (pr, lr) = (median(&pg, |m| m.per_sec), median(&lite, |m| m.per_sec));
    let (pp, lp) = (median(&pg, |m| m.p99_ms), median(&lite, |m| m.p99_ms));
    println!("PostgreSQL store: {pr:.0} creates/s ({:.2}x SQLite's {lr:.0}/s), p99 {pp:.1} ms (SQLite {lp:.1} ms)", pr / lr);
    row::row("create-bench", "creates/s, PostgreSQL store", &format!("{pr:.0}/s"), &format!("{lr:.0}/s SQLite store"), pr / lr);
    row::row("create-bench", "create p99, PostgreSQL store", &format!("{pp:.1} ms"), &format!("{lp:.1} ms SQLite store"), pp / lp);
    Ok(())
}

/// What metrics cost a create: the same creates (empty queue) against a server that counts
/// and one with `[metrics] enabled = false`, alternating so that the machine's drift falls
/// on both; medians of 3 rounds.
#[path = "../shared/grpc_client.rs"]
mod grpc_client;

/// `n` creates from `clients` tasks, each on its own connection: over gRPC (HTTP/2) or
/// REST (HTTP/1.1 keep-alive), with the same client (hyper on tokio).
/// The transports `--grpc` compares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Rest1,
    Rest2,
    Grpc,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Rest1 => "REST (HTTP/1.1)",
            Transport::Rest2 => "REST (HTTP/2)",
            Transport::Grpc => "gRPC (HTTP/2)",
        }
    }
}

fn measure_hyper(server: &Server, clients: usize, n: usize, tag: &str, transport: Transport) -> Result<Measured> {
    let over_grpc = transport == Transport::Grpc;
    let pool = prost_reflect::DescriptorPool::decode(trainyard_server::grpc::DESCRIPTORS)?;
    let addr = server.base.trim_start_matches("http://").to_string();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let cpu0 = server.cpu_secs()?;
    let start = Instant::now();
    let mut lat: Vec<f64> = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let count = n / clients + usize::from(c < n % clients);
            let bodies = (0..count)
                .map(|i| {
                    let job = job_body(&format!("{tag}-{c}-{i}"));
                    if over_grpc {
                        grpc_client::create_custom_job_request(&pool, "projects/bench/locations/us-central1", &job)
                    } else {
                        Ok(job.to_string().into_bytes())
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let addr = addr.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(bodies.len());
                let path = "/v1/projects/bench/locations/us-central1/customJobs";
                if transport != Transport::Rest1 {
                    let mut conn = grpc_client::Connection::open(&addr).await?;
                    for b in bodies {
                        let t = Instant::now();
                        if over_grpc {
                            conn.unary("/google.cloud.aiplatform.v1.JobService/CreateCustomJob", &b).await?;
                        } else {
                            conn.post_json(path, b).await?;
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                } else {
                    let mut conn = grpc_client::Http1::open(&addr).await?;
                    for b in bodies {
                        let t = Instant::now();
                        conn.post_json(path, b).await?;
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                anyhow::Ok(lat)
            }));
        }
        let mut all = Vec::with_capacity(n);
        for t in tasks {
            all.extend(t.await.map_err(|e| anyhow!("a client task: {e}"))??);
        }
        anyhow::Ok(all)
    })?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = server.cpu_secs()? - cpu0;
    lat.sort_by(f64::total_cmp);
    Ok(Measured { per_sec: n as f64 / wall, p50_ms: quantile(&lat, 0.5), p99_ms: quantile(&lat, 0.99), cpu_ms_per_create: cpu * 1000.0 / n as f64 })
}

/// Creates over REST and over gRPC, 3 rounds each, alternating, each measurement on a
/// server of its own (the creates queue behind one running job: a server that served one
/// measurement would give the next a longer queue): the medians and the ratios gRPC/REST.
fn grpc_against_rest(exe: &Path, tmp: &Path, o: &Opts) -> Result<()> {
    const ROUNDS: usize = 3;
    println!("create-bench --grpc: {} clients, {} creates per measurement, {ROUNDS} rounds", o.clients, o.creates);
    let all = [Transport::Rest1, Transport::Rest2, Transport::Grpc];
    let mut results: Vec<Vec<Measured>> = all.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        // Which goes first changes from round to round.
        for k in 0..all.len() {
            let i = (k + round) % all.len();
            let transport = all[i];
            let dir = tmp.join(format!("{i}-{round}"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("trainyard.toml"), CONFIG)?;
            let server = start_server(exe, &dir)?;
            measure_hyper(&server, o.clients, (o.creates / 10).max(o.clients), "warmup", transport)?;
            let m = measure_hyper(&server, o.clients, o.creates, "bench", transport)?;
            println!(
                "round {round}, {}: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms, server CPU {:.3} ms per create",
                transport.name(),
                m.per_sec,
                m.p50_ms,
                m.p99_ms,
                m.cpu_ms_per_create
            );
            results[i].push(m);
        }
    }
    let median = |v: &[Measured], f: fn(&Measured) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    println!();
    println!("| transport | creates/s | p50 ms | p99 ms | CPU ms/create |");
    println!("|---|---|---|---|---|");
    for (t, v) in all.iter().zip(&results) {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.3} |",
            t.name(),
            median(v, |m| m.per_sec),
            median(v, |m| m.p50_ms),
            median(v, |m| m.p99_ms),
            median(v, |m| m.cpu_ms_per_create)
        );
    }
    let (rest, rest2, grpc) = (&results[0], &results[1], &results[2]);
    let ratio = |a: &[Measured], b: &[Measured], f: fn(&Measured) -> f64| median(a, f) / median(b, f);
    println!(
        "REST over HTTP/2 against HTTP/1.1: creates/s {:.2}x, p99 {:.2}x",
        ratio(rest2, rest, |m| m.per_sec),
        ratio(rest2, rest, |m| m.p99_ms)
    );
    println!(
        "gRPC against REST over HTTP/2 (the bridge alone): creates/s {:.2}x, p99 {:.2}x",
        ratio(grpc, rest2, |m| m.per_sec),
        ratio(grpc, rest2, |m| m.p99_ms)
    );
    let ratio = |f: fn(&Measured) -> f64| median(grpc, f) / median(rest, f);
    println!("gRPC/REST: creates/s {:.2}x, p50 {:.2}x, p99 {:.2}x", ratio(|m| m.per_sec), ratio(|m| m.p50_ms), ratio(|m| m.p99_ms));
    row::row("create-bench", "creates/s over gRPC (8 clients)", &format!("{:.0}/s", median(&grpc, |m| m.per_sec)), &format!("{:.0}/s over REST", median(&rest, |m| m.per_sec)), ratio(|m| m.per_sec));
    row::row("create-bench", "create p99 over gRPC (8 clients)", &format!("{:.2} ms", median(&grpc, |m| m.p99_ms)), &format!("{:.2} ms over REST", median(&rest, |m| m.p99_ms)), ratio(|m| m.p99_ms));
    Ok(())
}

fn metrics_cost(exe: &Path, tmp: &Path, o: &Opts) -> Result<()> {
    const ROUNDS: usize = 3;
    println!("create-bench --metrics-cost: {} clients, {} creates per measurement, {ROUNDS} rounds", o.clients, o.creates);
    let mut on = Vec::new();
    let mut off = Vec::new();
    for round in 0..ROUNDS {
        for enabled in [true, false] {
            let dir = tmp.join(format!("metrics-{enabled}-{round}"));
            std::fs::create_dir_all(&dir)?;
            let config = if enabled { CONFIG.to_string() } else { format!("{CONFIG}[metrics]\nenabled = false\n") };
            std::fs::write(dir.join("trainyard.toml"), config)?;
            let server = start_server(exe, &dir)?;
            measure(&server, o.clients, (o.creates / 10).max(o.clients), "warmup")?;
            let m = measure(&server, o.clients, o.creates, "bench")?;
            println!(
                "round {round}, metrics {}: {:.0} creates/s, p50 {:.1} ms, p99 {:.1} ms, server CPU {:.3} ms per create",
                if enabled { "on" } else { "off" },
                m.per_sec,
                m.p50_ms,
                m.p99_ms,
                m.cpu_ms_per_create
            );
            if enabled { on.push(m) } else { off.push(m) }
        }
    }
    let median = |v: &[Measured], f: fn(&Measured) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    println!();
    println!("| metrics | creates/s | p50 ms | p99 ms | CPU ms/create |");
    println!("|---|---|---|---|---|");
    for (label, v) in [("on", &on), ("off", &off)] {
        println!(
            "| {label} | {:.0} | {:.1} | {:.1} | {:.3} |",
            median(v, |m| m.per_sec),
            median(v, |m| m.p50_ms),
            median(v, |m| m.p99_ms),
            median(v, |m| m.cpu_ms_per_create)
        );
    }
    println!(
        "metrics on vs off: creates/s {:.3}x, CPU per create {:.3}x",
        median(&on, |m| m.per_sec) / median(&off, |m| m.per_sec),
        median(&on, |m| m.cpu_ms_per_create) / median(&off, |m| m.cpu_ms_per_create).max(1e-9)
    );
    Ok(())
}

/// Create latency while 50 cancels of programs that ignore SIGTERM are in flight (each
/// stop waits out its grace period), against the same server idle, in the same run.
fn cancels_in_flight(exe: &Path, tmp: &Path, o: &Opts) -> Result<()> {
    const STUBBORN: usize = 50;
    let dir = tmp.join("cancels");
    std::fs::create_dir_all(&dir)?;
    // The measured creates (project "bench") wait on a quota of one job at a time, so that
    // only the create path is measured; the stubborn jobs run in a project of their own.
    std::fs::write(
        dir.join("trainyard.toml"),
        "[node]\nname = \"big\"\ncpus = 1024\nmemory_gb = 4096\n[lifecycle]\ngrace_period_secs = 30\n\
         [quotas.projects.bench]\ncustom_model_training_cpus = 4\n\
         [limits]\nwrites_per_second_per_project = 1000000.0\nwrite_burst_per_project = 1000000\n",
    )?;
    let server = start_server(exe, &dir)?;
    let n = (o.creates / 4).max(o.clients);
    let idle = measure(&server, o.clients, n, "idle")?;
    let agent = agent();
    let jobs = format!("{}/v1/projects/stubborn/locations/us-central1/customJobs", server.base);
    let mut names = Vec::new();
    for i in 0..STUBBORN {
        let mut body = job_body(&format!("stubborn-{i}"));
        body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = serde_json::json!(["sh", "-c", "trap '' TERM; sleep 600"]);
        let mut resp = agent.post(&jobs).header("Content-Type", "application/json").send(body.to_string().as_bytes())?;
        let v: serde_json::Value = serde_json::from_str(&resp.body_mut().read_to_string()?)?;
        names.push(v["name"].as_str().ok_or_else(|| anyhow!("create answered {v}"))?.to_string());
    }
    // Wait until they run, then cancel them all.
    let deadline = Instant::now() + Duration::from_secs(120);
    for name in &names {
        loop {
            let mut resp = agent.get(&format!("{}/v1/{name}", server.base)).call()?;
            let v: serde_json::Value = serde_json::from_str(&resp.body_mut().read_to_string()?)?;
            if v["state"] == "JOB_STATE_RUNNING" {
                break;
            }
            if Instant::now() > deadline {
                bail!("{name} did not start: {v}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for name in &names {
        agent.post(&format!("{}/v1/{name}:cancel", server.base)).header("Content-Type", "application/json").send(b"{}" as &[u8])?;
    }
    let busy = measure(&server, o.clients, n, "busy")?;
    println!();
    println!(
        "cancels in flight: {STUBBORN} stops of SIGTERM-ignoring programs waiting out their grace period: create p50 {:.1} ms, p99 {:.1} ms; idle p50 {:.1} ms, p99 {:.1} ms; p99 {:.2}x idle",
        busy.p50_ms,
        busy.p99_ms,
        idle.p50_ms,
        idle.p99_ms,
        busy.p99_ms / idle.p99_ms
    );
    Ok(())
}
