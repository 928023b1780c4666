//! `hostile-bench`: what one hostile tenant costs another project, measured in one run.
//!
//! The real server (`target/release/trainyard serve`, run as root for per-project users)
//! serves two projects. `calm` creates trivial jobs one after the other and waits for
//! each to start; the time of its creates (the HTTP round trip) and of its jobs' starts
//! (`createTime` to `startTime`, the server's own clock) are measured in rounds that
//! alternate between no hostile tenant and one (`hostile`) doing, in a loop, the worst
//! the tenant-isolation work found:
//! - a running job that makes and removes random trees (links, FIFOs, sockets, deep
//!   chains) in its checkpoint and model directories and in a bucket, fills its
//!   `/dev/shm` and forks bursts of processes up to its task limit;
//! - jobs that make a tree 20,000 levels deep and are deleted (a purge of each);
//! - package jobs whose `setup.py` sleeps (its venv build, the replica's first step);
//! - listings of its bucket full of such trees, and `GET /v1/admin/quotas` (a walk of it);
//! - more `logs?follow=true` streams than its share, never read, and media uploads that
//!   send one byte and stall, more than its share of storage streams, reopened as the
//!   server closes them;
//! - a job of six silent Python processes that is reported hung (a stack dump of each of
//!   its replicas) and a py-spy on the server's PATH that writes 2 MB and never ends.
//!
//! Printed: create p50/p99 and start p50/p99 with and without the hostile tenant, and
//! their ratios (the goal is within 1.2x). The hostile tenant's programs compete for the
//! same 2 CPUs as the server: what part of a ratio is CPU contention rather than the
//! server is said by the server's own CPU time per calm create, printed too.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

const USAGE: &str = "\
usage: hostile-bench [--rounds N] [--jobs N] [--replica-nice N] [--quick]

  --rounds N        rounds of each kind, alternating calm and hostile (default 3)
  --jobs N          calm jobs created and started per round (default 20)
  --replica-nice N  the server's [replicas] nice (default: the server's default, 10;
                    0 weighs the replicas' CPU group like one server thread)
  --quick           1 round of 5 jobs (a smoke test, not a measurement)

Run as root (the hostile tenant's jobs run as a user of their project's own). Build with
`cargo build --release -p trainyard -p trainyard-bench`; run target/release/hostile-bench
(it starts target/release/trainyard).";

struct Opts {
    rounds: usize,
    jobs: usize,
    replica_nice: Option<usize>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { rounds: 3, jobs: 20, replica_nice: None };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| entry::number::<usize>(&mut it, name);
            match a.as_str() {
                "--rounds" => o.rounds = num("--rounds")?.max(1),
                "--jobs" => o.jobs = num("--jobs")?.max(2),
                "--replica-nice" => o.replica_nice = Some(num("--replica-nice")?.min(19)),
                "--quick" => {
                    o.rounds = 1;
                    o.jobs = 5;
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
    entry::main_of("hostile-bench", USAGE, Opts::parse, run)
}

#[path = "../shared/server.rs"]
mod server;
use server::{agent, Server};

const CONFIG: &str = "\
[node]
name = \"box\"
cpus = 64
memory_gb = 256
[limits]
max_live_jobs_per_project = 100000
writes_per_second_per_project = 100000.0
write_burst_per_project = 100000
[lifecycle]
checkpoint_warning_secs = 1
grace_period_secs = 1
[replicas]
venv_build_timeout_secs = 30
[quotas.projects.hostile]
storage_gb = 50
";

/// The hostile job's loop: random trees made and removed in its directories and a
/// bucket, `/dev/shm` filled, bursts of processes.
const HOSTILE_LOOP: &str = r#"
import os, random, shutil, socket, subprocess, time
roots = [os.environ["AIP_CHECKPOINT_DIR"], os.environ["AIP_MODEL_DIR"], "/gcs/hostile-bucket/junk"]
rng = random.Random(1)
n = 0
while True:
    for r in roots:
        d = os.path.join(r, f"t{n % 3}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        for i in range(200):
            p = os.path.join(d, f"e{i}")
            k = rng.randrange(5)
            try:
                if k == 0: os.symlink(rng.choice(["/", "..", "/etc/passwd", d]), p)
                elif k == 1: os.mkfifo(p)
                elif k == 2:
                    s = socket.socket(socket.AF_UNIX); s.bind(p); s.close()
                elif k == 3: os.makedirs(os.path.join(p, *["d"] * 50))
                else: open(p, "wb").write(os.urandom(512))
            except OSError:
                pass
    try:
        with open("/dev/shm/fill", "wb") as f:
            f.write(b"\0" * (64 << 20))
        os.unlink("/dev/shm/fill")
    except OSError:
        pass
    procs = []
    for _ in range(50):
        try:
            procs.append(subprocess.Popen(["sleep", "0.5"]))
        except OSError:
            break
    for p in procs:
        p.wait()
    n += 1
    time.sleep(0.2)
"#;

const DEEP_TREE: &str = "import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(20000):\n    os.mkdir('d', dir_fd=fd)\n    \
                         nfd = os.open('d', os.O_RDONLY, dir_fd=fd)\n    os.close(fd)\n    fd = nfd\n";

const SLOW_SETUP: &str = "import time\ntime.sleep(3600)\n";

/// Silent Python processes: the job is reported hung, and its processes dumped.
const SILENT: &str = "for n in 1 2 3 4 5 6; do python3 -c 'import time; time.sleep(3600)' & done; wait";

/// A py-spy that writes more than a pipe holds and never ends.
const HOSTILE_PY_SPY: &str = "#!/bin/sh\nhead -c 2000000 /dev/zero | tr '\\0' x\nexec sleep 3600\n";

/// Log streams and stalled uploads the hostile tenant keeps open (past its shares:
/// `max_log_streams_per_project` 64, `max_storage_streams_per_project` 16).
const LOG_STREAMS: usize = 80;
const STALLED_UPLOADS: usize = 24;

/// A request written on a new connection to `addr` (`host:port`), left open.
fn open_request(addr: &str, head: &str) -> Option<std::net::TcpStream> {
    use std::io::Write;
    let mut t = std::net::TcpStream::connect(addr).ok()?;
    t.write_all(head.as_bytes()).ok()?;
    Some(t)
}

/// Is the connection still open (no end of stream, no error, when peeked at)?
fn open(t: &std::net::TcpStream) -> bool {
    let _ = t.set_nonblocking(true);
    let mut b = [0u8; 1];
    let alive = match t.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    };
    let _ = t.set_nonblocking(false);
    alive
}

/// Keeps `LOG_STREAMS` follow streams of `job` and `STALLED_UPLOADS` stalled uploads
/// open until `stop`, reopening those the server closed; returns how many were opened.
fn floods(addr: String, job: String, stop: Arc<AtomicBool>) -> usize {
    let stream = format!("GET /v1/{job}/logs?follow=true HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let upload = format!(
        "POST /upload/storage/v1/b/hostile-bucket/o?uploadType=media&name=stalled HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\nx"
    );
    let (mut logs, mut uploads, mut opened) = (Vec::new(), Vec::new(), 0);
    while !stop.load(Ordering::SeqCst) {
        logs.retain(open);
        uploads.retain(open);
        while logs.len() < LOG_STREAMS {
            let Some(t) = open_request(&addr, &stream) else { break };
            logs.push(t);
            opened += 1;
        }
        while uploads.len() < STALLED_UPLOADS {
            let Some(t) = open_request(&addr, &upload) else { break };
            uploads.push(t);
            opened += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    opened
}

fn job(name: &str, command: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "displayName": name,
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "local/bench", "command": command},
        }]},
    })
}

struct Api {
    base: String,
    agent: ureq::Agent,
}

impl Api {
    fn call(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> Result<(u16, serde_json::Value)> {
        let url = format!("{}{path}", self.base);
        let mut resp = match body {
            Some(b) => self.agent.run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(&url)
                    .header("Content-Type", "application/json")
                    .body(b.to_string())
                    .context("request")?,
            ),
            None => self.agent.run(ureq::http::Request::builder().method(method).uri(&url).body(()).context("request")?),
        }
        .with_context(|| format!("{method} {path}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)))
    }

    fn create(&self, project: &str, body: &serde_json::Value) -> Result<String> {
        let (status, v) = self.call("POST", &format!("/v1/projects/{project}/locations/us-central1/customJobs"), Some(body))?;
        if status != 200 {
            bail!("create in {project}: {status} {v}");
        }
        v["name"].as_str().map(str::to_string).ok_or_else(|| anyhow!("no name in {v}"))
    }

    fn wait(&self, name: &str, pred: impl Fn(&serde_json::Value) -> bool) -> Result<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, v) = self.call("GET", &format!("/v1/{name}"), None)?;
            if pred(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("{name} did not get there in 120 s: {v}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn rfc3339_micros(v: &serde_json::Value) -> Option<i64> {
    let t = time::OffsetDateTime::parse(v.as_str()?, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1000) as i64)
}

/// One calm round: `n` jobs, each created then waited for until it starts.
/// `reads`: the time of a GET of each job once it started (the tenant's other API calls).
fn calm_round(api: &Api, n: usize, creates: &mut Vec<f64>, starts: &mut Vec<f64>, reads: &mut Vec<f64>) -> Result<()> {
    for i in 0..n {
        let t = Instant::now();
        let name = api.create("calm", &job(&format!("calm-{i}"), serde_json::json!(["true"])))?;
        creates.push(t.elapsed().as_secs_f64() * 1000.0);
        let v = api.wait(&name, |v| v.get("startTime").is_some() || v["state"] == "JOB_STATE_FAILED")?;
        match (rfc3339_micros(&v["createTime"]), rfc3339_micros(&v["startTime"])) {
            (Some(c), Some(s)) => {
                if s - c > 200_000 {
                    eprintln!("slow start: {name}: {} ms", (s - c) / 1000);
                }
                starts.push((s - c) as f64 / 1000.0)
            }
            _ => bail!("calm job without a start: {v}"),
        }
        let t = Instant::now();
        let (status, v) = api.call("GET", &format!("/v1/{name}"), None)?;
        if status != 200 {
            bail!("GET {name}: {status} {v}");
        }
        reads.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(())
}

/// The hostile tenant, until `stop`: its looping job, deep-tree jobs deleted one after
/// the other, slow package builds, listings of its bucket and quota walks.
fn hostile(api: Api, data: PathBuf, stop: Arc<AtomicBool>) -> Result<usize> {
    let mut body = job("loop", serde_json::json!(["python3", "-c", HOSTILE_LOOP]));
    body["jobSpec"]["baseOutputDirectory"] = serde_json::json!({"outputUriPrefix": "gs://hostile-bucket/out"});
    let looping = api.create("hostile", &body)?;
    let mut silent = job("silent", serde_json::json!(["sh", "-c", SILENT]));
    silent["labels"] = serde_json::json!({"trainyard-hang-after-secs": "2"});
    let silent = api.create("hostile", &silent)?;
    let flood = {
        let (addr, job, stop) = (api.base.trim_start_matches("http://").to_string(), looping.clone(), Arc::clone(&stop));
        std::thread::spawn(move || floods(addr, job, stop))
    };
    // A package whose setup.py sleeps: the build is its own replica's first step.
    let pkg = data.join("storage/hostile/hostile-bucket/pkgs/slow");
    std::fs::create_dir_all(pkg.join("trainer")).context("making the slow package")?;
    std::fs::write(pkg.join("setup.py"), SLOW_SETUP)?;
    std::fs::write(pkg.join("trainer/__init__.py"), "")?;
    let mut actions = 0;
    while !stop.load(Ordering::SeqCst) {
        let deep = api.create("hostile", &job("deep", serde_json::json!(["python3", "-c", DEEP_TREE])))?;
        let mut slow = job("slow", serde_json::Value::Null);
        slow["jobSpec"]["workerPoolSpecs"][0]
            .as_object_mut()
            .map(|p| p.remove("containerSpec"))
            .ok_or_else(|| anyhow!("no pool"))?;
        slow["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"] = serde_json::json!({
            "executorImageUri": "local/bench", "packageUris": ["gs://hostile-bucket/pkgs/slow"], "pythonModule": "trainer.task"});
        let slow = api.create("hostile", &slow)?;
        api.call("GET", "/storage/v1/b/hostile-bucket/o?maxResults=1000", None)?;
        api.call("GET", "/v1/admin/quotas", None)?;
        api.wait(&deep, |v| v.get("endTime").is_some())?;
        api.call("DELETE", &format!("/v1/{deep}"), None)?;
        api.call("POST", &format!("/v1/{slow}:cancel"), Some(&serde_json::json!({})))?;
        actions += 1;
    }
    api.call("POST", &format!("/v1/{looping}:cancel"), Some(&serde_json::json!({})))?;
    api.call("POST", &format!("/v1/{silent}:cancel"), Some(&serde_json::json!({})))?;
    let opened = flood.join().map_err(|_| anyhow!("the flood thread panicked"))?;
    eprintln!("the hostile tenant opened {opened} log streams and stalled uploads");
    Ok(actions)
}

struct Stats {
    p50: f64,
    p99: f64,
}

fn stats(v: &mut [f64]) -> Stats {
    v.sort_by(f64::total_cmp);
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    Stats { p50: pct(0.5), p99: pct(0.99) }
}

/// Kills what still runs in or names `dir` (the server's shims and replicas outlive it:
/// a restarted server would adopt them).
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let needle = self.0.display().to_string();
        let me = std::process::id();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            if pid as u32 == me {
                continue;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&needle) || cwd.starts_with(&self.0) {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn run(o: &Opts) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("run as root: the hostile tenant's jobs run as a user of their project's own");
    }
    let exe = std::env::current_exe()?.parent().map(|d| d.join("trainyard")).ok_or_else(|| anyhow!("no directory"))?;
    let dir = tempfile::tempdir()?;
    if std::env::var_os("HOSTILE_BENCH_KEEP").is_some() {
        eprintln!("keeping {}", dir.path().display());
    }
    let config = match o.replica_nice {
        Some(n) => CONFIG.replace("[replicas]\n", &format!("[replicas]\nnice = {n}\n")),
        None => CONFIG.to_string(),
    };
    std::fs::write(dir.path().join("trainyard.toml"), config)?;
    // The hostile py-spy, first on the server's PATH.
    let fake = dir.path().join("fake-bin");
    std::fs::create_dir_all(&fake)?;
    std::fs::write(fake.join("py-spy"), HOSTILE_PY_SPY)?;
    std::fs::set_permissions(fake.join("py-spy"), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap_or_default());
    let data = dir.path().join("data");
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let server = Server::start(&exe, &dir.path().join("trainyard.toml"), &data, Duration::from_secs(60), |c| {
        c.current_dir(dir.path()).env("PATH", &path).env("TRAINYARD_LOG", std::env::var("HOSTILE_BENCH_LOG").unwrap_or_else(|_| "error".into())).stderr(Stdio::inherit());
    })?;
    let api = || Api { base: server.base.clone(), agent: agent() };
    let (status, v) = api().call("POST", "/storage/v1/b?project=hostile", Some(&serde_json::json!({"name": "hostile-bucket"})))?;
    if status != 200 {
        bail!("creating the hostile bucket: {status} {v}");
    }
    calm_round(&api(), 3, &mut Vec::new(), &mut Vec::new(), &mut Vec::new())?;
    let (mut calm_c, mut calm_s, mut host_c, mut host_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut calm_r, mut host_r) = (Vec::new(), Vec::new());
    let (mut calm_cpu, mut host_cpu) = (0.0, 0.0);
    let mut actions = 0;
    for round in 0..o.rounds {
        let t = server.cpu_secs()?;
        calm_round(&api(), o.jobs, &mut calm_c, &mut calm_s, &mut calm_r)?;
        calm_cpu += server.cpu_secs()? - t;

        let stop = Arc::new(AtomicBool::new(false));
        let tenant = {
            let (a, d, s) = (api(), data.clone(), Arc::clone(&stop));
            std::thread::spawn(move || hostile(a, d, s))
        };
        // Let the tenant get going (its loop job running, a deep tree being made).
        std::thread::sleep(Duration::from_secs(3));
        let t = server.cpu_secs()?;
        let measured = calm_round(&api(), o.jobs, &mut host_c, &mut host_s, &mut host_r);
        host_cpu += server.cpu_secs()? - t;
        stop.store(true, Ordering::SeqCst);
        actions += tenant.join().map_err(|_| anyhow!("the hostile tenant panicked"))??;
        measured?;
        eprintln!("round {} of {} done", round + 1, o.rounds);
    }
    if std::env::var_os("HOSTILE_BENCH_KEEP").is_some() {
        let _ = dir.keep();
    }
    let (cc, cs, hc, hs) = (stats(&mut calm_c), stats(&mut calm_s), stats(&mut host_c), stats(&mut host_s));
    let (cr, hr) = (stats(&mut calm_r), stats(&mut host_r));
    let n = (o.rounds * o.jobs) as f64;
    let nice = o.replica_nice.map_or_else(|| "the default".to_string(), |n| n.to_string());
    println!("hostile-bench: {} calm jobs per side, {} rounds, replicas at nice {nice}; the hostile tenant did {actions} rounds of deep-tree jobs, slow builds, listings and quota walks beside its looping job", o.jobs, o.rounds);
    println!("                        no hostile tenant   with one    ratio");
    row::row("hostile-bench", "create p99 beside a hostile tenant", &format!("{:.2} ms", hc.p99), &format!("{:.2} ms without it", cc.p99), hc.p99 / cc.p99);
    row::row("hostile-bench", "start p99 beside a hostile tenant", &format!("{:.2} ms", hs.p99), &format!("{:.2} ms without it", cs.p99), hs.p99 / cs.p99);
    row::row("hostile-bench", "get p99 beside a hostile tenant", &format!("{:.2} ms", hr.p99), &format!("{:.2} ms without it", cr.p99), hr.p99 / cr.p99);
    println!("create p50 (ms)         {:>17.2}   {:>8.2}   {:>5.2}x", cc.p50, hc.p50, hc.p50 / cc.p50);
    println!("create p99 (ms)         {:>17.2}   {:>8.2}   {:>5.2}x", cc.p99, hc.p99, hc.p99 / cc.p99);
    println!("start p50 (ms)          {:>17.2}   {:>8.2}   {:>5.2}x", cs.p50, hs.p50, hs.p50 / cs.p50);
    println!("start p99 (ms)          {:>17.2}   {:>8.2}   {:>5.2}x", cs.p99, hs.p99, hs.p99 / cs.p99);
    println!("get p50 (ms)            {:>17.2}   {:>8.2}   {:>5.2}x", cr.p50, hr.p50, hr.p50 / cr.p50);
    println!("get p99 (ms)            {:>17.2}   {:>8.2}   {:>5.2}x", cr.p99, hr.p99, hr.p99 / cr.p99);
    println!(
        "server CPU per calm job (ms) {:>12.2}   {:>8.2}   (all of the server's CPU in the round, the hostile tenant's requests included)",
        calm_cpu * 1000.0 / n,
        host_cpu * 1000.0 / n
    );
    Ok(())
}
