//! `burst-bench`: a burst of short jobs against `trainyard serve`, next to what the machine
//! itself does in the same run.
//!
//! Clients are threads with keep-alive connections; together they create `--jobs`
//! CustomJobs that each run `true` on the default node (the local machine, whose
//! default is overcommit: every job starts at once). Measured:
//! - create latency p50/p99 and creates/s while the jobs start and end (the API must not
//!   wait behind launches);
//! - jobs per second end to end, from the first create to the last job SUCCEEDED (polled
//!   on `/metrics`);
//! - the baseline: `/bin/true` spawned and reaped by as many threads, as many times, in
//!   the same run; the ratio of the two rates is what Trainyard's launch pipeline costs;
//! - CPU time per job: the server's, and its descendants' (the replicas'
//!   supervisors and programs), both from /proc, against the CPU time of one bare
//!   spawn-and-reap (this process's and its children's, from getrusage): on a noisy
//!   machine a steadier ratio than the rates, which also count what else ran meanwhile;
//! - how many files and directories each job made, and what one new file costs on the
//!   data directory's file system in the same run (see [`file_create_us`]);
//! - the latency baseline: the same clients' `GET /healthz` p99 against the same server
//!   just before the burst (what the HTTP path alone costs on this machine).

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

const USAGE: &str = "\
usage: burst-bench [--jobs N] [--clients N] [--quick]

  --jobs N      jobs in the burst (default 800)
  --clients N   concurrent clients, and threads of the bare baseline (default 8)
  --quick       --jobs 80 (a smoke test)

Build with `cargo build --release -p trainyard -p trainyard-bench`; run
target/release/burst-bench (it starts target/release/trainyard).";

const PROJECT: &str = "burst";
/// Bound on the wait for the burst to end.
const WAIT_BOUND: Duration = Duration::from_secs(300);

struct Opts {
    jobs: usize,
    clients: usize,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { jobs: 800, clients: 8 };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| entry::number::<usize>(&mut it, name);
            match a.as_str() {
                "--jobs" => o.jobs = num("--jobs")?.max(1),
                "--clients" => o.clients = num("--clients")?.max(1),
                "--quick" => o.jobs = 80,
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

#[path = "../shared/server.rs"]
mod server;
use server::{agent, quantile, timed_posts, Server};

fn main() -> ExitCode {
    entry::main_of("burst-bench", USAGE, Opts::parse, run)
}

/// Nothing throttles the burst: the per-project write rate and live-job limits are
/// above it (they are measured elsewhere).
const CONFIG: &str = "\
[limits]
max_live_jobs_per_project = 1000000
writes_per_second_per_project = 1000000.0
write_burst_per_project = 1000000
";

fn job_body(name: &str) -> String {
    serde_json::json!({
        "displayName": name,
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "local/bench", "command": ["true"]},
        }]},
    })
    .to_string()
}

/// This process's user + system CPU time so far, its reaped children's included, in
/// seconds.
fn own_cpu_secs() -> f64 {
    let secs = |who: libc::c_int| {
        // SAFETY: getrusage writes into the zeroed struct we pass; it cannot fail for
        // these arguments (and a failure leaves zeros).
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    secs(libc::RUSAGE_SELF) + secs(libc::RUSAGE_CHILDREN)
}

/// The baseline: `/bin/true` spawned and reaped by threads.
struct Bare {
    per_sec: f64,
    /// CPU time per spawn, the spawning threads' and the child's.
    cpu_ms: f64,
}

/// `/bin/true` spawned and reaped `n` times from `threads` threads.
fn bare_spawns(n: usize, threads: usize) -> Result<Bare> {
    let cpu0 = own_cpu_secs();
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let count = n / threads + usize::from(t < n % threads);
            std::thread::spawn(move || -> Result<()> {
                for _ in 0..count {
                    let status = Command::new("true")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .context("spawning true")?;
                    if !status.success() {
                        bail!("true exited with {status}");
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow!("a baseline thread panicked"))??;
    }
    let per_sec = n as f64 / start.elapsed().as_secs_f64();
    Ok(Bare { per_sec, cpu_ms: (own_cpu_secs() - cpu0) * 1000.0 / n as f64 })
}

/// Microseconds to create one empty file in a new directory below `dir`, over `n` files:
/// what the file system holding the data directory charges for each of the files and
/// directories a replica start makes. Journal-less ext4 skips the inodes freed in the last
/// minutes one by one (`recently_deleted`), so there it depends on what was deleted
/// lately on the machine, and the burst's figures with it.
fn file_create_us(dir: &Path, n: usize) -> Result<f64> {
    let probe = dir.join("file-probe");
    std::fs::create_dir(&probe).with_context(|| format!("creating {}", probe.display()))?;
    let start = Instant::now();
    for i in 0..n {
        let p = probe.join(i.to_string());
        std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Files and directories below `dir`, `dir` itself not counted.
fn entries_below(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        n += 1;
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            n += entries_below(&e.path())?;
        }
    }
    Ok(n)
}

/// The value of one sample of a Prometheus text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// p99 of `GET /healthz` from `clients` keep-alive clients, `n` requests in all, in ms.
fn healthz_p99(server: &Server, n: usize, clients: usize) -> Result<f64> {
    let url = Arc::new(format!("{}/healthz", server.base));
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let url = Arc::clone(&url);
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let agent = agent();
                let mut lat = Vec::new();
                for _ in 0..n.div_ceil(clients) {
                    let t = Instant::now();
                    agent.get(url.as_str()).call().context("GET /healthz")?.body_mut().read_to_string().context("reading /healthz")?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().map_err(|_| anyhow!("a client thread panicked"))??);
    }
    lat.sort_by(f64::total_cmp);
    Ok(quantile(&lat, 0.99))
}

struct Burst {
    creates_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    jobs_per_sec: f64,
    cpu_ms_per_job: f64,
    /// The server's descendants: the replicas' supervisors and programs.
    descendants_cpu_ms_per_job: f64,
}

fn burst(server: &Server, jobs: usize, clients: usize) -> Result<Burst> {
    let url = format!("{}/v1/projects/{PROJECT}/locations/us-central1/customJobs", server.base);
    let cpu0 = server.cpu_secs()?;
    let descendants0 = server.descendants_cpu_secs()?;
    let start = Instant::now();
    let lat = timed_posts(&url, clients, jobs, |c, i| job_body(&format!("burst-{c}-{i}")))?;
    let created = start.elapsed().as_secs_f64();
    let agent = agent();
    let metrics = format!("{}/metrics", server.base);
    let succeeded = format!("trainyard_jobs{{project=\"{PROJECT}\",state=\"JOB_STATE_SUCCEEDED\"}}");
    let done = loop {
        let text = agent.get(&metrics).call().context("GET /metrics")?.body_mut().read_to_string().context("reading /metrics")?;
        let n = sample(&text, &succeeded).unwrap_or(0.0);
        if n as usize >= jobs {
            break start.elapsed().as_secs_f64();
        }
        if start.elapsed() > WAIT_BOUND {
            bail!("only {n} of {jobs} jobs SUCCEEDED within {} s", WAIT_BOUND.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let cpu = server.cpu_secs()? - cpu0;
    let descendants = server.descendants_cpu_secs()? - descendants0;
    Ok(Burst {
        creates_per_sec: jobs as f64 / created,
        p50_ms: quantile(&lat, 0.5),
        p99_ms: quantile(&lat, 0.99),
        max_ms: quantile(&lat, 1.0),
        jobs_per_sec: jobs as f64 / done,
        cpu_ms_per_job: cpu * 1000.0 / jobs as f64,
        descendants_cpu_ms_per_job: descendants * 1000.0 / jobs as f64,
    })
}

fn run(o: &Opts) -> Result<()> {
    let exe = std::env::current_exe()?.with_file_name("trainyard");
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let config = dir.path().join("trainyard.toml");
    std::fs::write(&config, CONFIG).context("writing the config")?;
    let Bare { per_sec: bare, cpu_ms: bare_cpu_ms } = bare_spawns(o.jobs, o.clients)?;
    let create_us = file_create_us(dir.path(), o.jobs)?;
    let server = start(&exe, dir.path())?;
    let healthz = healthz_p99(&server, o.jobs, o.clients)?;
    let b = burst(&server, o.jobs, o.clients)?;
    // What the jobs left in the data directory's per-job trees.
    let data = dir.path().join("data");
    let mut made = 0;
    for tree in ["runs", "progress", "trials", "venvs"] {
        if data.join(tree).is_dir() {
            made += entries_below(&data.join(tree))?;
        }
    }
    println!("burst of {} jobs running `true`, {} keep-alive clients:", o.jobs, o.clients);
    println!("| measure | value |");
    println!("|---|---|");
    println!("| bare spawn-and-reap of `true`, {} threads | {bare:.0}/s |", o.clients);
    println!("| jobs end to end (first create to last SUCCEEDED) | {:.0}/s ({:.3}x bare) |", b.jobs_per_sec, b.jobs_per_sec / bare);
    println!("| creates during the burst | {:.0}/s |", b.creates_per_sec);
    println!("| create latency p50 / p99 / max | {:.1} / {:.1} / {:.1} ms |", b.p50_ms, b.p99_ms, b.max_ms);
    println!("| GET /healthz p99 before the burst (baseline) | {healthz:.1} ms |");
    println!("| server CPU per job | {:.2} ms |", b.cpu_ms_per_job);
    println!("| supervisors' and programs' CPU per job | {:.2} ms |", b.descendants_cpu_ms_per_job);
    let job_cpu = b.cpu_ms_per_job + b.descendants_cpu_ms_per_job;
    println!("| CPU per bare spawn-and-reap (baseline) | {bare_cpu_ms:.2} ms ({:.3}x the job's {job_cpu:.2} ms) |", bare_cpu_ms / job_cpu);
    println!("| files and directories made per job | {:.1} |", made as f64 / o.jobs as f64);
    println!("| creating a file in the data directory's file system (baseline) | {create_us:.0} us |");
    let n = o.jobs;
    row::row("burst-bench", &format!("jobs of `true` end to end, {n} jobs"), &format!("{:.0}/s", b.jobs_per_sec), &format!("{bare:.0}/s bare spawn"), b.jobs_per_sec / bare);
    row::row("burst-bench", "CPU per job of `true` (server, supervisor, program)", &format!("{job_cpu:.2} ms"), &format!("{bare_cpu_ms:.2} ms bare spawn"), bare_cpu_ms / job_cpu);
    row::row("burst-bench", "create p99 during the burst", &format!("{:.1} ms", b.p99_ms), &format!("{healthz:.1} ms GET /healthz"), b.p99_ms / healthz);
    Ok(())
}

fn start(exe: &Path, dir: &Path) -> Result<Server> {
    Server::start(exe, &dir.join("trainyard.toml"), &dir.join("data"), Duration::from_secs(60), |c| {
        c.env("TRAINYARD_LOG", "warn").stderr(Stdio::inherit());
    })
}
