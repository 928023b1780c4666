//! `start-bench`: start latency as a user sees it, measured from outside, against a bare
//! spawn of the same program measured in the same run.
//!
//! Every figure ends at the program's own first line: the program prints its start time
//! (`time.time_ns()` in Python, `date +%s%N` in sh), which the bench reads back (from the
//! logs API, or from the run directory's `log.jsonl`) and subtracts from the time it took
//! before it asked for the start. All times are `CLOCK_REALTIME` of one host.
//!
//! (a) HTTP: a real `trainyard serve` (`--server-bin`, default `target/release/trainyard`);
//!     POST customJobs sent -> the program's first line, p50 over N, against a bare
//!     fork/exec of the same program by the bench, interleaved sample by sample.
//! (b) The shim alone: `<shim> <run_dir>` spawned as the local backend does (own session,
//!     stdout piped, a cgroup with a memory limit where the host has one) -> the shim's
//!     `started.json` and -> the program's first line, against a bare spawn.
//! (c) A gang: 8 replicas against 1, HTTP create -> the last replica's first line; and
//!     the local backend alone (`Backend::launch` of 8 runs against 1, no server).
//! (d) With `--containers IMAGE`, instead of (a) to (c): a replica in a container, a
//!     server with `[containers] engine = "podman"` (`pull = "never"`) against a bare
//!     `podman run --rm` of the same image and program by the bench, and beside them the
//!     same program as a host process (a server with no engine, and a bare spawn). The
//!     program is `python3 -c "print('first', flush=True)"`, which prints no time: its
//!     first line is when a reader had it (the bench from the pipe; the shim, whose
//!     `time` the log entry carries).
//!
//! Only ratios and differences within one run mean anything on a shared machine; no
//! figure is checked against a threshold.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{Backend, BackendEvent, CgroupSupport, EventSink, Launch, LocalBackend};
use trainyard_core::RunId;

const USAGE: &str = "\
usage: start-bench [--n N] [--eight N] [--warmup N] [--server-bin PATH]... [--shim PATH]...
                   [--python PATH] [--cgroup-v2 DIR] [--quick] [--keep] [--only a|b|c]
                   [--containers IMAGE]

  --n N           samples of each single-replica measurement (default 30)
  --eight N       samples of the 8-replica measurements (default 15)
  --warmup N      discarded samples before each measurement (default 3)
  --server-bin P  a server that is measured (default: trainyard beside this program);
                  repeatable: the servers' samples are interleaved, for a before/after
  --shim P        a shim program for (b), run as `P <run_dir>`; `P shim <run_dir>` when
                  P is the trainyard binary. Repeatable. Default: the server binary and
                  trainyard-shim beside this program, if built
  --python P      the Python interpreter (default: sys.executable of `python3` on PATH,
                  so that a version manager's wrapper script is not measured)
  --cgroup-v2 P   parts (b) and (c'): replica cgroups under P, a directory of a cgroup v2
                  hierarchy (made if missing), without a memory limit, instead of the
                  memory cgroup the server would use
  --only X        run only part a, b or c
  --containers I  run part (d) only, in the image I (e.g. localhost/trainyard/python:test,
                  with python3, on the host already: pull = \"never\"): bare `podman run`
                  against a server in container mode and one in host mode; --n samples
  --quick         --n 5 --eight 3 --warmup 1 (a smoke test, not a measurement)
  --keep          keep the temporary directory and print its path

Build with `cargo build --release -p trainyard -p trainyard-bench` (and
`-p trainyard-backend --bin trainyard-shim` for the small shim).";

struct Opts {
    n: usize,
    eight: usize,
    warmup: usize,
    server_bins: Vec<PathBuf>,
    shims: Vec<PathBuf>,
    python: Option<PathBuf>,
    cgroup_v2: Option<PathBuf>,
    only: Option<char>,
    keep: bool,
    /// Part (d) only, in this image.
    containers: Option<String>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o =
            Opts { n: 30, eight: 15, warmup: 3, server_bins: Vec::new(), shims: Vec::new(), python: None, cgroup_v2: None, only: None, keep: false, containers: None };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| -> Result<String> { it.next().cloned().ok_or_else(|| anyhow!("{name} needs a value")) };
            match a.as_str() {
                "--n" => o.n = value("--n")?.parse().map_err(|_| anyhow!("--n: not a number"))?,
                "--eight" => o.eight = value("--eight")?.parse().map_err(|_| anyhow!("--eight: not a number"))?,
                "--warmup" => o.warmup = value("--warmup")?.parse().map_err(|_| anyhow!("--warmup: not a number"))?,
                "--server-bin" => o.server_bins.push(value("--server-bin")?.into()),
                "--shim" => o.shims.push(value("--shim")?.into()),
                "--python" => o.python = Some(value("--python")?.into()),
                "--cgroup-v2" => o.cgroup_v2 = Some(value("--cgroup-v2")?.into()),
                "--only" => {
                    let v = value("--only")?;
                    o.only = match v.as_str() {
                        "a" | "b" | "c" => v.chars().next(),
                        _ => bail!("--only: a, b or c"),
                    }
                }
                "--quick" => {
                    o.n = 5;
                    o.eight = 3;
                    o.warmup = 1;
                }
                "--keep" => o.keep = true,
                "--containers" => o.containers = Some(value("--containers")?),
                "-h" | "--help" => return Ok(None),
                other => bail!("unknown argument {other:?}"),
            }
        }
        if o.n == 0 || o.eight == 0 {
            bail!("--n and --eight must be at least 1");
        }
        if o.containers.is_some() && o.only.is_some() {
            bail!("--containers runs part (d) only: no --only with it");
        }
        Ok(Some(o))
    }

    /// Parts a, b and c; none of them with `--containers`.
    fn part(&self, p: char) -> bool {
        self.containers.is_none() && self.only.is_none_or(|o| o == p)
    }
}

#[path = "../shared/entry.rs"]
mod entry;

#[path = "../shared/row.rs"]
mod bench_row;

fn main() -> ExitCode {
    entry::main_of("start-bench", USAGE, Opts::parse, run)
}

// ---------------------------------------------------------------------------------------
// Time and statistics

/// Nanoseconds since the epoch (CLOCK_REALTIME), the clock the programs print.
fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn ms(from_ns: i64, to_ns: i64) -> f64 {
    (to_ns - from_ns) as f64 / 1e6
}

#[derive(Clone, Copy)]
struct Stats {
    n: usize,
    p50: f64,
    p90: f64,
}

/// Nearest-rank percentiles.
fn stats(samples: &[f64]) -> Stats {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
    };
    Stats { n: v.len(), p50: rank(0.5), p90: rank(0.9) }
}

/// A table row: a series and, if it has one, the baseline it is compared with.
struct Row {
    label: String,
    s: Stats,
    base: Option<Stats>,
}

fn row(label: impl Into<String>, samples: &[f64], base: Option<&[f64]>) -> Row {
    Row { label: label.into(), s: stats(samples), base: base.map(stats) }
}

fn print_rows(title: &str, rows: &[Row]) {
    println!("{title}");
    println!("  {:<74} {:>4} {:>8} {:>8} {:>8} {:>9}", "(ms)", "N", "p50", "p90", "p50/base", "p50-base");
    for r in rows {
        let (ratio, over) = match r.base {
            Some(b) => (format!("{:.2}x", r.s.p50 / b.p50), format!("{:+.2}", r.s.p50 - b.p50)),
            None => (String::new(), String::new()),
        };
        println!("  {:<74} {:>4} {:>8.2} {:>8.2} {:>8} {:>9}", r.label, r.s.n, r.s.p50, r.s.p90, ratio, over);
        if let Some(b) = r.base {
            bench_row::row("start-bench", &format!("{} p50", r.label.trim()), &format!("{:.2} ms", r.s.p50), &format!("{:.2} ms", b.p50), r.s.p50 / b.p50);
        }
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// Programs

/// A program that prints its start time in ns since the epoch as its first line.
#[derive(Clone)]
struct Program {
    name: &'static str,
    argv: Vec<String>,
}

fn programs(python: &Path) -> (Program, Program) {
    let py = Program {
        name: "python",
        argv: vec![python.display().to_string(), "-c".into(), "import time; print(time.time_ns(), flush=True)".into()],
    };
    let sh = Program { name: "sh", argv: vec!["sh".into(), "-c".into(), "date +%s%N".into()] };
    (py, sh)
}

/// Prints its start time, then sleeps until stopped.
fn sleeper() -> Program {
    Program { name: "sh-sleep", argv: vec!["sh".into(), "-c".into(), "date +%s%N; exec sleep 30".into()] }
}

/// The interpreter `python3` on PATH really runs (not a version manager's wrapper).
fn find_python() -> Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .stderr(Stdio::inherit())
        .output()
        .context("running python3")?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if p.is_empty() {
        bail!("python3 did not say where it is");
    }
    Ok(PathBuf::from(p))
}

fn parse_ns(text: &str) -> Result<i64> {
    text.trim().parse::<i64>().map_err(|_| anyhow!("the program printed {text:?}, not a time in ns"))
}

/// Bare fork/exec by the bench: (time to `spawn` returning, time to the program's line).
fn bare(p: &Program) -> Result<(f64, f64)> {
    let mut cmd = Command::new(&p.argv[0]);
    cmd.args(&p.argv[1..]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    let t0 = now_ns();
    let mut child = cmd.spawn().with_context(|| format!("spawning {}", p.argv[0]))?;
    let spawned = now_ns();
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    child.wait()?;
    Ok((ms(t0, spawned), ms(t0, parse_ns(&line)?)))
}

// ---------------------------------------------------------------------------------------
// (b) the shim alone, and the local backend alone

struct ShimRunner {
    label: String,
    command: Vec<OsString>,
}

impl ShimRunner {
    fn new(bin: &Path) -> ShimRunner {
        let is_product = bin.file_name().is_some_and(|n| n == "trainyard");
        let mut command = vec![bin.as_os_str().to_owned()];
        if is_product {
            command.push("shim".into());
        }
        let size = std::fs::metadata(bin).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
        let label = format!("{}{} ({size:.1} MB)", short_name(bin), if is_product { " shim" } else { "" });
        ShimRunner { label, command }
    }
}

fn spec_for(p: &Program, cgroups: &Cgroups, name: &str, workdir: &Path) -> ShimSpec {
    let env: Vec<(String, String)> =
        ["PATH", "HOME", "LANG"].iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    let mut spec = ShimSpec::new(p.argv.clone(), env);
    spec.cwd = Some(workdir.to_path_buf());
    spec.memory_limit_bytes = cgroups.limit;
    if let Some((v, b)) = cgroups.support.base() {
        spec.cgroup_base = Some(b.to_path_buf());
        spec.cgroup_version = Some(v.number());
    }
    spec.cgroup_name = name.to_string();
    spec
}

/// The program's first stdout line in a run directory's `log.jsonl`.
fn first_line_in(dir: &Path) -> Result<Option<String>> {
    let entries = trainyard_backend::read_log(dir, 0).map(|(e, _)| e).unwrap_or_default();
    Ok(entries.into_iter().find(|e| e.stream == "stdout").map(|e| e.text))
}

struct ShimSample {
    /// spawn of the shim -> `started.json` time.
    started: f64,
    /// spawn of the shim -> the `started` line on its stdout, as the backend reads it.
    line: f64,
    /// spawn of the shim -> the program's own first line.
    program: f64,
}

/// One shim, spawned as the local backend does; waits for it to exit (the program exits
/// at once).
fn shim_once(r: &ShimRunner, p: &Program, dir: &Path, cgroups: &Cgroups, workdir: &Path) -> Result<ShimSample> {
    std::fs::create_dir_all(dir)?;
    let name = format!("start-bench-{}-{}", std::process::id(), dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    shim::write_spec(dir, &spec_for(p, cgroups, &name, workdir))?;
    let mut cmd = Command::new(&r.command[0]);
    cmd.args(&r.command[1..]).arg(dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    // SAFETY: setsid is async-signal-safe (the local backend does the same).
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let t0 = now_ns();
    let mut child = cmd.spawn().context("spawning the shim")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    let t_line = now_ns();
    let status = child.wait()?;
    if !status.success() {
        bail!("the shim in {} exited with {status}", dir.display());
    }
    let started = shim::read_started(dir)?.ok_or_else(|| anyhow!("no started.json in {}", dir.display()))?;
    let text = first_line_in(dir)?.ok_or_else(|| anyhow!("no output in {}", dir.display()))?;
    Ok(ShimSample {
        started: ms(t0, started.time_micros * 1000),
        line: if line.trim() == shim::STARTED_LINE { ms(t0, t_line) } else { f64::NAN },
        program: ms(t0, parse_ns(&text)?),
    })
}

/// Bare fork/exec of `k` copies of a program back to back from one thread -> the last
/// program's line.
fn bare_gang(p: &Program, k: usize) -> Result<f64> {
    let t0 = now_ns();
    let mut children = Vec::with_capacity(k);
    for _ in 0..k {
        let mut cmd = Command::new(&p.argv[0]);
        cmd.args(&p.argv[1..]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        children.push(cmd.spawn().with_context(|| format!("spawning {}", p.argv[0]))?);
    }
    let mut last = i64::MIN;
    for child in &mut children {
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        last = last.max(parse_ns(&line)?);
    }
    for mut child in children {
        let _ = child.kill();
        child.wait()?;
    }
    Ok(ms(t0, last))
}

/// Events of the local backend into a channel.
fn channel_sink() -> (EventSink, mpsc::Receiver<BackendEvent>) {
    let (tx, rx) = mpsc::channel::<BackendEvent>();
    let tx = Mutex::new(tx);
    let sink: EventSink = Arc::new(move |ev| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(ev);
        }
    });
    (sink, rx)
}

/// `Backend::launch` of `k` runs at once (as the executor hands a gang over) -> the last
/// program's first line; also the duration of the call.
fn backend_gang(
    backend: &LocalBackend,
    p: &Program,
    base: &Path,
    k: usize,
    tag: &str,
    cgroups: &Cgroups,
    workdir: &Path,
) -> Result<(f64, f64)> {
    let (sink, rx) = channel_sink();
    let launches: Vec<Launch> = (0..k)
        .map(|j| {
            let run = RunId { job: 1, attempt: 0, replica: format!("{tag}-{j}"), restart: 0 };
            let run_dir = base.join(format!("{tag}-{j}"));
            let mut spec = spec_for(p, cgroups, "", workdir);
            spec.cgroup_name = String::new();
            Launch { run, run_dir, spec, node: String::new() }
        })
        .collect();
    let dirs: Vec<PathBuf> = launches.iter().map(|l| l.run_dir.clone()).collect();
    let t0 = now_ns();
    let results = Backend::launch(backend, launches, sink);
    let call = ms(t0, now_ns());
    for (run, r) in results {
        r.map_err(|e| anyhow!("launch of {run}: {e}"))?;
    }
    // Every program prints, then sleeps until it is stopped, so that no run's end (its
    // shim's clean-up) overlaps the others' start.
    let mut last = i64::MIN;
    let deadline = Instant::now() + Duration::from_secs(60);
    for d in &dirs {
        let text = loop {
            if let Some(t) = first_line_in(d)? {
                break t;
            }
            if Instant::now() >= deadline {
                bail!("no output in {} after 60 s", d.display());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        last = last.max(parse_ns(&text)?);
    }
    for d in &dirs {
        backend.stop(d).map_err(|e| anyhow!("stop of {}: {e}", d.display()))?;
    }
    let mut exited = 0;
    while exited < k {
        if let BackendEvent::Exited { .. } = rx.recv_timeout(Duration::from_secs(60)).context("waiting for the gang to end")? {
            exited += 1;
        }
    }
    Ok((call, ms(t0, last)))
}

// ---------------------------------------------------------------------------------------
// (a), (c) a real server

const CONFIG: &str = "\
[node]
name = \"big\"
cpus = 64
memory_gb = 512
";

const PROJECT_PATH: &str = "/v1/projects/bench/locations/us-central1/customJobs";

/// A running `trainyard serve`, killed when dropped.
struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
    data_dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first, so that it stops its runs and leaves nothing behind.
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

impl Server {
    /// A server whose replicas run as host processes.
    fn start(exe: &Path, dir: &Path) -> Result<Server> {
        Server::start_with(exe, dir, "")
    }

    /// `extra` is appended to the config; without a `[containers]` table in it, replicas
    /// run as host processes.
    fn start_with(exe: &Path, dir: &Path, extra: &str) -> Result<Server> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("trainyard.toml"), format!("{CONFIG}{extra}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"]);
        if !extra.contains("[containers]") {
            cmd.env("TRAINYARD_CONTAINER_ENGINE", "none");
        }
        let child = cmd
            .arg(dir.join("trainyard.toml"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("TRAINYARD_LOG", "warn")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let server = Server { child, base: format!("http://127.0.0.1:{port}"), agent: agent(), data_dir: dir.join("data") };
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if server.agent.get(&format!("{}/healthz", server.base)).call().is_ok_and(|r| r.status().is_success()) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the server did not answer within 120 s")
    }

    fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let mut resp = self.agent.get(&format!("{}{path}", self.base)).call().with_context(|| format!("GET {path}"))?;
        let text = resp.body_mut().read_to_string()?;
        if !resp.status().is_success() {
            bail!("GET {path}: {}: {text}", resp.status());
        }
        Ok(serde_json::from_str(&text)?)
    }
}

fn job_body(p: &Program, pools: &[u32]) -> String {
    job_body_in(p, pools, "local/bench")
}

/// A job of `p` in `image` (which a server with no container engine records only).
fn job_body_in(p: &Program, pools: &[u32], image: &str) -> String {
    let pools: Vec<serde_json::Value> = pools
        .iter()
        .map(|&count| {
            serde_json::json!({
                "machineSpec": {"machineType": "n1-standard-4"},
                "replicaCount": count.to_string(),
                "containerSpec": {"imageUri": image, "command": p.argv},
            })
        })
        .collect();
    serde_json::json!({"displayName": format!("start-{}", p.name), "jobSpec": {"workerPoolSpecs": pools}}).to_string()
}

/// The (attempt, replica name) of every replica of a job resource: `workerpool<P>-<i>`.
fn runs_of(job: &serde_json::Value) -> Vec<(u32, String)> {
    let pools = job.pointer("/jobSpec/workerPoolSpecs").and_then(|p| p.as_array()).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for (p, pool) in pools.iter().enumerate() {
        let n: u32 = pool.get("replicaCount").and_then(|c| c.as_str()).and_then(|c| c.parse().ok()).unwrap_or(1);
        for i in 0..n {
            out.push((0, format!("workerpool{p}-{i}")));
        }
    }
    out
}

fn micros_of(v: &serde_json::Value, field: &str) -> Option<i64> {
    v.get(field).and_then(|t| t.as_str()).and_then(|t| trainyard_api::Timestamp::parse_rfc3339(t).ok()).map(|t| t.micros())
}

/// One HTTP create and what followed, all in ns since the epoch.
struct HttpSample {
    sent: i64,
    replied: i64,
    created: i64,
    running: Option<i64>,
    /// The job's endTime.
    ended: Option<i64>,
    /// The programs' own first lines, one per replica: the time the program printed, or
    /// for a program that prints none, the log entry's (when the shim read the line).
    firsts: Vec<i64>,
    /// When the last first line reached the bench through `logs?follow=true`.
    seen: i64,
    /// The follow stream ended without some replica's line (read afterwards).
    lost_lines: usize,
    /// The latest `started.json` time of the replicas (the shims, once the programs were
    /// exec'd).
    exec: Option<i64>,
}

/// POST a job, follow its logs until every replica printed its line, wait until it ended.
/// `stamped`: the programs print their start time (else the log entries' times count).
fn http_once(server: &Server, body: &str, replicas: usize, cancel: bool, stamped: bool) -> Result<HttpSample> {
    let mut lost_lines = 0;
    let url = format!("{}{PROJECT_PATH}", server.base);
    let sent = now_ns();
    let mut resp = server.agent.post(&url).header("Content-Type", "application/json").send(body.as_bytes()).context("POST")?;
    let text = resp.body_mut().read_to_string()?;
    let replied = now_ns();
    if !resp.status().is_success() {
        bail!("create answered {}: {text}", resp.status());
    }
    let job: serde_json::Value = serde_json::from_str(&text)?;
    let name = job.get("name").and_then(|n| n.as_str()).ok_or_else(|| anyhow!("no name in {text}"))?;
    let id = name.rsplit('/').next().unwrap_or_default().to_string();
    let created = micros_of(&job, "createTime").ok_or_else(|| anyhow!("no createTime"))? * 1000;

    let logs = format!("{url}/{id}/logs?follow=true");
    let resp = server.agent.get(&logs).call().context("GET logs")?;
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut firsts = Vec::new();
    let mut seen_replicas = std::collections::BTreeSet::new();
    let mut seen = 0;
    let mut line = String::new();
    let mut take = |line: &str, seen_replicas: &mut std::collections::BTreeSet<String>| -> Result<bool> {
        let e: serde_json::Value = serde_json::from_str(line)?;
        if e.get("stream").and_then(|s| s.as_str()) != Some("stdout") {
            return Ok(false);
        }
        let replica = e.get("replica").and_then(|s| s.as_str()).unwrap_or_default().to_string();
        if !seen_replicas.insert(replica) {
            return Ok(false);
        }
        firsts.push(if stamped {
            parse_ns(e.get("text").and_then(|t| t.as_str()).unwrap_or_default())?
        } else {
            let time = e.get("time").and_then(|t| t.as_str()).unwrap_or_default();
            trainyard_api::Timestamp::parse_rfc3339(time).map_err(|_| anyhow!("log entry time {time:?}"))?.micros() * 1000
        });
        Ok(true)
    };
    let mut ended_early = false;
    while seen_replicas.len() < replicas {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            ended_early = true;
            break;
        }
        if take(&line, &mut seen_replicas)? {
            seen = now_ns();
        }
    }
    drop(reader);
    if ended_early {
        // The follow stream ended (the job was over) before it showed every replica's
        // line: read the whole log once more.
        lost_lines += 1;
        let mut resp = server.agent.get(&format!("{url}/{id}/logs")).call().context("GET logs")?;
        let text = resp.body_mut().read_to_string()?;
        for l in text.lines() {
            take(l, &mut seen_replicas)?;
        }
        seen = now_ns();
        if seen_replicas.len() < replicas {
            // Why, if the job said (a replica that cannot run as the project's user, an
            // image that is not on the host).
            let why = server
                .get_json(&format!("{PROJECT_PATH}/{id}"))
                .ok()
                .and_then(|j| j.pointer("/error/message").and_then(|m| m.as_str()).map(|m| format!(": {m}")))
                .unwrap_or_default();
            bail!("job {id}: only {} of {replicas} replicas printed{why}", seen_replicas.len());
        }
    }
    if cancel {
        let mut resp = server.agent.post(&format!("{url}/{id}:cancel")).send(&b""[..]).context("POST :cancel")?;
        let text = resp.body_mut().read_to_string()?;
        if !resp.status().is_success() {
            bail!("cancel of job {id} answered {}: {text}", resp.status());
        }
    }
    // Until it ended, so that samples do not overlap.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ended = if cancel { "JOB_STATE_CANCELLED" } else { "JOB_STATE_SUCCEEDED" };
    let job = loop {
        let j = server.get_json(&format!("{PROJECT_PATH}/{id}"))?;
        let state = j.get("state").and_then(|s| s.as_str()).unwrap_or_default().to_string();
        if state == ended {
            break j;
        }
        if matches!(state.as_str(), "JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED") {
            bail!("job {id} ended {state}: {j}");
        }
        if Instant::now() >= deadline {
            bail!("job {id} still {state} after 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut exec = None;
    for (attempt, replica) in runs_of(&job) {
        let dir = server.data_dir.join("runs").join(&id).join(attempt.to_string()).join(replica).join("0");
        if let Some(st) = shim::read_started(&dir).ok().flatten() {
            exec = Some(exec.unwrap_or(i64::MIN).max(st.time_micros * 1000));
        }
    }
    Ok(HttpSample {
        sent,
        replied,
        created,
        running: micros_of(&job, "startTime").map(|m| m * 1000),
        ended: micros_of(&job, "endTime").map(|m| m * 1000),
        firsts,
        seen,
        lost_lines,
        exec,
    })
}

// ---------------------------------------------------------------------------------------
// (d) a replica in a container, against a bare `podman run`

/// The program of part (d); its line is not a time.
const FIRST_LINE: &str = "first";

fn first_program(python: &str) -> Program {
    Program { name: "python-first", argv: vec![python.to_string(), "-c".into(), format!("print('{FIRST_LINE}', flush=True)")] }
}

/// The bare `podman run` of part (d), before the image: the ulimits are the engine's
/// defaults lowered to what root without CAP_SYS_RESOURCE may set.
const PODMAN_RUN: &[&str] = &["run", "--rm", "--network=host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"];

/// `[containers]` of the container-mode server of part (d).
const CONTAINERS_CONFIG: &str = "\n[containers]\nengine = \"podman\"\npull = \"never\"\n";

/// Spawns `cmd`, whose first stdout line must be `expect`: (spawn -> the line read from
/// the pipe, spawn -> the process reaped), in ms.
fn first_line_and_exit(mut cmd: Command, expect: &str) -> Result<(f64, f64)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let t0 = now_ns();
    let mut child = cmd.spawn().with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    let mut line = String::new();
    let mut t_line = t0;
    if let Some(out) = child.stdout.take() {
        let mut reader = BufReader::new(out);
        reader.read_line(&mut line)?;
        t_line = now_ns();
        // To the end, so that nothing it writes later meets a closed pipe.
        std::io::copy(&mut reader, &mut std::io::sink())?;
    }
    let status = child.wait()?;
    let t_exit = now_ns();
    if line.trim_end() != expect || !status.success() {
        bail!("{:?} printed {line:?} and exited with {status}", cmd.get_program());
    }
    Ok((ms(t0, t_line), ms(t0, t_exit)))
}

/// A figure of part (d) in each of its four columns (`None`: none there).
struct DRow {
    label: &'static str,
    podman: Option<Vec<f64>>,
    container: Option<Vec<f64>>,
    host: Option<Vec<f64>>,
    bare_host: Option<Vec<f64>>,
}

fn print_d_table(title: &str, rows: &[DRow]) {
    let pair = |v: &Option<Vec<f64>>| match v {
        Some(v) => {
            let s = stats(v);
            format!("{:>8.1} {:>8.1}", s.p50, s.p90)
        }
        None => format!("{:>8} {:>8}", "-", "-"),
    };
    println!("{title}");
    println!(
        "  {:<46} {:>17}   {:>17}   {:>21}   {:>17}   {:>17}",
        "", "bare podman run", "trainyard container", "container / podman", "trainyard host", "bare host spawn"
    );
    println!(
        "  {:<46} {:>8} {:>8}   {:>8} {:>8}   {:>6} {:>6} {:>7}   {:>8} {:>8}   {:>8} {:>8}",
        "(ms)", "p50", "p90", "p50", "p90", "p50", "p90", "p50-Δ", "p50", "p90", "p50", "p90"
    );
    for r in rows {
        let ratio = match (&r.podman, &r.container) {
            (Some(b), Some(c)) => {
                let (b, c) = (stats(b), stats(c));
                format!("{:>5.2}x {:>5.2}x {:>+7.1}", c.p50 / b.p50, c.p90 / b.p90, c.p50 - b.p50)
            }
            _ => format!("{:>6} {:>6} {:>7}", "", "", ""),
        };
        println!("  {:<46} {}   {}   {}   {}   {}", r.label, pair(&r.podman), pair(&r.container), ratio, pair(&r.host), pair(&r.bare_host));
    }
    let n = rows.iter().flat_map(|r| [&r.podman, &r.container, &r.host, &r.bare_host]).flatten().map(|v| v.len()).max().unwrap_or(0);
    println!("  N = {n} each (a trainyard figure without a follow-stream sample is left out of that row)");
    println!();
}

/// Part (d): per sample, in an order that rotates: a bare `podman run` of the image, a
/// job in it on a server in container mode, the same program as a host-process job on a
/// server without an engine, and a bare spawn of it.
fn containers_part(o: &Opts, image: &str, server_bin: &Path, python: &Path, tmp: &Path) -> Result<()> {
    eprintln!("[start-bench] (d) starting {} in host mode and in container mode", server_bin.display());
    let host_server = Server::start(server_bin, &tmp.join("server-host"))?;
    let container_server = Server::start_with(server_bin, &tmp.join("server-containers"), CONTAINERS_CONFIG)?;
    let in_image = first_program("python3");
    let on_host = first_program(&python.display().to_string());
    let container_body = job_body_in(&in_image, &[1], image);
    let host_body = job_body(&on_host, &[1]);
    let podman_cmd = || {
        let mut cmd = Command::new("podman");
        cmd.args(PODMAN_RUN).arg(image).args(&in_image.argv);
        cmd
    };
    let host_cmd = || {
        let mut cmd = Command::new(&on_host.argv[0]);
        cmd.args(&on_host.argv[1..]);
        cmd
    };
    eprintln!("[start-bench] (d) {} + {} samples of each, interleaved", o.warmup, o.n);
    let (mut podman, mut bare_host) = (Vec::new(), Vec::new());
    let (mut container, mut host) = (Vec::new(), Vec::new());
    for i in 0..(o.warmup + o.n) {
        let keep = i >= o.warmup;
        for j in 0..4 {
            std::thread::sleep(GAP);
            match (i + j) % 4 {
                0 => {
                    let s = first_line_and_exit(podman_cmd(), FIRST_LINE)?;
                    if keep {
                        podman.push(s);
                    }
                }
                1 => {
                    let s = http_once(&container_server, &container_body, 1, false, false)?;
                    if keep {
                        container.push(s);
                    }
                }
                2 => {
                    let s = http_once(&host_server, &host_body, 1, false, false)?;
                    if keep {
                        host.push(s);
                    }
                }
                _ => {
                    let s = first_line_and_exit(host_cmd(), FIRST_LINE)?;
                    if keep {
                        bare_host.push(s);
                    }
                }
            }
        }
    }
    drop((host_server, container_server));

    let bare_col = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| Some(v.iter().map(f).collect::<Vec<f64>>());
    let http_col = |v: &[HttpSample], f: &dyn Fn(&HttpSample) -> Option<f64>| Some(v.iter().filter_map(f).collect::<Vec<f64>>());
    let to_running = |s: &HttpSample| s.running.map(|r| ms(s.sent, r));
    let to_line = |s: &HttpSample| Some(ms(s.sent, s.firsts[0]));
    let to_seen = |s: &HttpSample| (s.lost_lines == 0).then(|| ms(s.sent, s.seen));
    let to_end = |s: &HttpSample| s.ended.map(|e| ms(s.sent, e));
    let rows = [
        DRow {
            label: "start -> RUNNING (the job's startTime)",
            podman: None,
            container: http_col(&container, &to_running),
            host: http_col(&host, &to_running),
            bare_host: None,
        },
        DRow {
            label: "start -> first line read from the pipe",
            podman: bare_col(&podman, |s| s.0),
            container: http_col(&container, &to_line),
            host: http_col(&host, &to_line),
            bare_host: bare_col(&bare_host, |s| s.0),
        },
        DRow {
            label: "start -> first line received via logs?follow",
            podman: None,
            container: http_col(&container, &to_seen),
            host: http_col(&host, &to_seen),
            bare_host: None,
        },
        DRow {
            label: "start -> exit (bare) / endTime (SUCCEEDED)",
            podman: bare_col(&podman, |s| s.1),
            container: http_col(&container, &to_end),
            host: http_col(&host, &to_end),
            bare_host: bare_col(&bare_host, |s| s.1),
        },
    ];
    print_d_table(
        &format!(
            "(d) containers: `python3 -c \"print('first', flush=True)\"` in {image}; start = spawn (bare) or POST sent (trainyard)\n    \
             bare podman run = `podman {} {image} python3 -c ...`; trainyard host = the same program as a host process\n    \
             the line as trainyard read it = the log entry's time (the shim read it from the pipe)",
            PODMAN_RUN.join(" ")
        ),
        &rows,
    );

    // Where the time goes: before the shim exec'd the engine client (or the program),
    // and after.
    let podman_line: Vec<f64> = podman.iter().map(|s| s.0).collect();
    let podman_tail: Vec<f64> = podman.iter().map(|s| s.1 - s.0).collect();
    let mut rows = vec![
        row("bare podman run: spawn -> first line (BASE of podman's part)", &podman_line, None),
        row("bare podman run: first line -> exit (BASE of the end)", &podman_tail, None),
    ];
    for (label, samples) in [("trainyard container", &container), ("trainyard host", &host)] {
        let col = |f: &dyn Fn(&HttpSample) -> Option<f64>| samples.iter().filter_map(f).collect::<Vec<f64>>();
        let base = |b| if label == "trainyard container" { Some(b) } else { None };
        rows.extend([
            row(format!("{label}: POST sent -> reply received"), &col(&|s| Some(ms(s.sent, s.replied))), None),
            row(format!("{label}: POST sent -> createTime"), &col(&|s| Some(ms(s.sent, s.created))), None),
            row(format!("{label}: createTime -> startTime (RUNNING)"), &col(&|s| s.running.map(|r| ms(s.created, r))), None),
            row(format!("{label}: createTime -> started.json (shim exec'd)"), &col(&|s| s.exec.map(|x| ms(s.created, x))), None),
            row(
                format!("{label}: started.json -> first line read by the shim"),
                &col(&|s| s.exec.map(|x| ms(x, s.firsts[0]))),
                base(podman_line.as_slice()),
            ),
            row(format!("{label}: first line -> endTime"), &col(&|s| s.ended.map(|e| ms(s.firsts[0], e))), base(podman_tail.as_slice())),
        ]);
    }
    print_rows("(d') where the time goes (started.json: the shim exec'd `podman run` in container mode, the program in host mode)", &rows);
    Ok(())
}

// ---------------------------------------------------------------------------------------

/// A program's file name with its directory's: `release/trainyard`.
fn short_name(bin: &Path) -> String {
    let name = |p: Option<&Path>| p.and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{}/{}", name(bin.parent()), name(Some(bin)))
}

/// The replica cgroups of parts (b) and (c'), and their memory limit.
struct Cgroups {
    support: CgroupSupport,
    limit: Option<u64>,
}

/// The pause before each start of part (b) and (c').
const GAP: Duration = Duration::from_millis(25);

fn exe_beside(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("finding this program")?;
    Ok(me.parent().map(|d| d.join(name)).unwrap_or_else(|| PathBuf::from(name)))
}

fn run(o: &Opts) -> Result<()> {
    let tmp = tempfile::Builder::new().prefix("start-bench-").tempdir()?;
    let workdir = tmp.path().join("work");
    std::fs::create_dir_all(&workdir)?;
    let server_bins = if o.server_bins.is_empty() { vec![exe_beside("trainyard")?] } else { o.server_bins.clone() };
    let server_bin = server_bins[0].clone();
    let python = match &o.python {
        Some(p) => p.clone(),
        None => find_python()?,
    };
    let (py, sh) = programs(&python);
    let cgroups = match &o.cgroup_v2 {
        Some(base) => {
            std::fs::create_dir_all(base).with_context(|| format!("creating {}", base.display()))?;
            // No limit: the memory controller may not be enabled there.
            Cgroups { support: CgroupSupport::V2 { base: base.clone() }, limit: None }
        }
        // About what the driver gives an n1-standard-4 replica (L14).
        None => Cgroups { support: CgroupSupport::detect(), limit: Some(12 << 30) },
    };
    let mut shims: Vec<PathBuf> = o.shims.clone();
    if shims.is_empty() {
        shims.push(server_bin.clone());
        let small = exe_beside("trainyard-shim")?;
        if small.exists() {
            shims.push(small);
        }
    }
    for s in shims.iter().chain(&server_bins) {
        if !s.exists() {
            bail!("{} not found (see --help for how to build it)", s.display());
        }
    }

    println!("== start-bench ==");
    println!(
        "  cores {}, load average {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    for b in &server_bins {
        println!("  server     {}", b.display());
    }
    println!("  python     {}", python.display());
    println!(
        "  cgroups    {}",
        match cgroups.support.base() {
            Some((v, b)) => format!("v{} under {}{}", v.number(), b.display(), if cgroups.limit.is_none() { ", no memory limit" } else { "" }),
            None => "none usable (no memory limits)".into(),
        }
    );
    println!("  samples    {} single, {} gang, {} warm-up discarded each; interleaved with their baselines", o.n, o.eight, o.warmup);
    println!("  bare spawn = the bench's own fork/exec of the same program, to the program's printed time");
    println!();
    // Dirty pages (a binary just built) are written back now, not during the run.
    // SAFETY: sync(2) has no memory effects.
    unsafe { libc::sync() };

    if let Some(image) = &o.containers {
        if server_bins.len() > 1 {
            println!("  (d) measures the first server only: {}\n", server_bin.display());
        }
        containers_part(o, image, &server_bin, &python, tmp.path())?;
    }

    if o.part('b') {
        eprintln!("[start-bench] (b) the shim alone");
        let base = tmp.path().join("shim-alone");
        let runners: Vec<ShimRunner> = shims.iter().map(|s| ShimRunner::new(s)).collect();
        let mut bare_spawned = Vec::new();
        let mut bare_line = Vec::new();
        let mut per: Vec<Vec<ShimSample>> = runners.iter().map(|_| Vec::new()).collect();
        for i in 0..(o.warmup + o.n) {
            // A pause before each start, as between jobs: state the kernel keeps warm for
            // a few ms after a cgroup move (an RCU grace period) would flatter whichever
            // start came right after another one. The order rotates.
            std::thread::sleep(GAP);
            let (spawned, line) = bare(&sh)?;
            for j in 0..runners.len() {
                let k = (i + j) % runners.len();
                std::thread::sleep(GAP);
                let s = shim_once(&runners[k], &sh, &base.join(format!("{k}-{i}")), &cgroups, &workdir)?;
                if i >= o.warmup {
                    per[k].push(s);
                }
            }
            if i >= o.warmup {
                bare_spawned.push(spawned);
                bare_line.push(line);
            }
        }
        let mut rows = vec![
            row("bare spawn `sh -c 'date +%s%N'`: spawn returned (BASE of started)", &bare_spawned, None),
            row("bare spawn: -> program's line (BASE of program)", &bare_line, None),
        ];
        for (r, samples) in runners.iter().zip(&per) {
            let col = |f: fn(&ShimSample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
            rows.push(row(format!("{}: -> started.json", r.label), &col(|s| s.started), Some(&bare_spawned)));
            rows.push(row(format!("{}: -> `started` on stdout", r.label), &col(|s| s.line), Some(&bare_spawned)));
            rows.push(row(format!("{}: -> program's line", r.label), &col(|s| s.program), Some(&bare_line)));
        }
        print_rows("(b) the shim alone: spawn of the shim -> ...", &rows);

        eprintln!("[start-bench] (c') the local backend alone: 8 runs against 1");
        let waiting = sleeper();
        let backends: Vec<(String, LocalBackend)> =
            runners.iter().map(|r| (r.label.clone(), LocalBackend::new(r.command.clone(), cgroups.support.clone()))).collect();
        let base = tmp.path().join("backend-alone");
        let (mut b1, mut b8) = (Vec::new(), Vec::new());
        let mut per: Vec<[Vec<f64>; 4]> = backends.iter().map(|_| Default::default()).collect();
        for i in 0..(o.warmup + o.eight) {
            std::thread::sleep(GAP);
            let one = bare_gang(&waiting, 1)?;
            std::thread::sleep(GAP);
            let eight = bare_gang(&waiting, 8)?;
            if i >= o.warmup {
                b1.push(one);
                b8.push(eight);
            }
            for j in 0..backends.len() {
                let k = (i + j) % backends.len();
                let backend = &backends[k].1;
                std::thread::sleep(GAP);
                let one = backend_gang(backend, &waiting, &base, 1, &format!("one{k}-{i}"), &cgroups, &workdir)?;
                std::thread::sleep(GAP);
                let eight = backend_gang(backend, &waiting, &base, 8, &format!("eight{k}-{i}"), &cgroups, &workdir)?;
                if i >= o.warmup {
                    per[k][0].push(one.0);
                    per[k][1].push(one.1);
                    per[k][2].push(eight.0);
                    per[k][3].push(eight.1);
                }
            }
        }
        let mut rows = vec![
            row("bare: 1 spawn -> program's line (BASE)", &b1, None),
            row("bare: 8 spawns from one thread -> last program's line", &b8, Some(&b1)),
        ];
        for ((label, _), [c1, l1, c8, l8]) in backends.iter().zip(&per) {
            rows.extend([
                row(format!("{label}: 1 run: the launch call"), c1, None),
                row(format!("{label}: 1 run: -> program's line"), l1, Some(&b1)),
                row(format!("{label}: 8 runs: the launch call"), c8, Some(c1)),
                row(format!("{label}: 8 runs: -> last program's line (vs 1 run)"), l8, Some(l1)),
            ]);
        }
        print_rows(
            "(c') the local backend without a server: Backend::launch of 8 runs of `sh -c 'date +%s%N; exec sleep 30'` at once against 1",
            &rows,
        );
    }

    if o.part('a') || o.part('c') {
        let mut servers = Vec::new();
        for (k, bin) in server_bins.iter().enumerate() {
            eprintln!("[start-bench] starting {}", bin.display());
            servers.push((short_name(bin), Server::start(bin, &tmp.path().join(format!("server-{k}")))?));
        }
        let many = servers.len() > 1;
        let tag = |label: &str, text: &str| if many { format!("{label}: {text}") } else { text.to_string() };
        if o.part('a') {
            for p in [&py, &sh] {
                eprintln!("[start-bench] (a) HTTP create -> first line: {}", p.name);
                let body = job_body(p, &[1]);
                let mut base_line = Vec::new();
                let mut per: Vec<Vec<HttpSample>> = servers.iter().map(|_| Vec::new()).collect();
                for i in 0..(o.warmup + o.n) {
                    let (_, b) = bare(p)?;
                    if i >= o.warmup {
                        base_line.push(b);
                    }
                    for j in 0..servers.len() {
                        let k = (i + j) % servers.len();
                        let s = http_once(&servers[k].1, &body, 1, false, true)?;
                        if i >= o.warmup {
                            per[k].push(s);
                        }
                    }
                }
                let mut rows = vec![row("bare spawn -> program's line (BASE)", &base_line, None)];
                for ((label, _), samples) in servers.iter().zip(&per) {
                    let col = |f: &dyn Fn(&HttpSample) -> Option<f64>| samples.iter().filter_map(f).collect::<Vec<f64>>();
                    rows.extend([
                        row(tag(label, "POST sent -> program's line"), &col(&|s| Some(ms(s.sent, s.firsts[0]))), Some(&base_line)),
                        row(tag(label, "  part: POST sent -> reply received"), &col(&|s| Some(ms(s.sent, s.replied))), None),
                        row(tag(label, "  part: POST sent -> createTime (server clock)"), &col(&|s| Some(ms(s.sent, s.created))), None),
                        row(tag(label, "  part: createTime -> program's line"), &col(&|s| Some(ms(s.created, s.firsts[0]))), Some(&base_line)),
                        row(
                            tag(label, "  part: createTime -> started.json (program exec'd)"),
                            &col(&|s| s.exec.map(|x| ms(s.created, x))),
                            None,
                        ),
                        row(tag(label, "  createTime -> startTime (RUNNING, driver)"), &col(&|s| s.running.map(|r| ms(s.created, r))), None),
                        row(
                            tag(label, "POST sent -> line received through logs?follow=true"),
                            &col(&|s| (s.lost_lines == 0).then(|| ms(s.sent, s.seen))),
                            Some(&base_line),
                        ),
                    ]);
                }
                print_rows(&format!("(a) HTTP, one replica running `{}`", p.argv.join(" ")), &rows);
            }
        }
        if o.part('c') {
            eprintln!("[start-bench] (c) HTTP, 8 replicas against 1");
            // The chief's exit would end the job (and stop the others): every replica
            // prints, then sleeps until the job is cancelled.
            let waiting = sleeper();
            let one = job_body(&waiting, &[1]);
            let eight = job_body(&waiting, &[1, 7]);
            let mut per: Vec<Vec<(HttpSample, HttpSample)>> = servers.iter().map(|_| Vec::new()).collect();
            let (mut b1, mut b8) = (Vec::new(), Vec::new());
            for i in 0..(o.warmup + o.eight) {
                std::thread::sleep(GAP);
                let bare_one = bare_gang(&waiting, 1)?;
                std::thread::sleep(GAP);
                let bare_eight = bare_gang(&waiting, 8)?;
                if i >= o.warmup {
                    b1.push(bare_one);
                    b8.push(bare_eight);
                }
                for j in 0..servers.len() {
                    let k = (i + j) % servers.len();
                    let a = http_once(&servers[k].1, &one, 1, true, true)?;
                    let b = http_once(&servers[k].1, &eight, 8, true, true)?;
                    if i >= o.warmup {
                        per[k].push((a, b));
                    }
                }
            }
            let last = |s: &HttpSample| ms(s.sent, s.firsts.iter().copied().max().unwrap_or(s.sent));
            let first = |s: &HttpSample| ms(s.sent, s.firsts.iter().copied().min().unwrap_or(s.sent));
            let mut rows = vec![
                row("bare: 1 spawn -> program's line (BASE)", &b1, None),
                row("bare: 8 spawns from one thread -> last program's line", &b8, Some(&b1)),
            ];
            let mut lost = 0;
            for ((label, _), samples) in servers.iter().zip(&per) {
                lost += samples.iter().map(|(a, b)| a.lost_lines + b.lost_lines).sum::<usize>();
                let l1: Vec<f64> = samples.iter().map(|(a, _)| last(a)).collect();
                let l8: Vec<f64> = samples.iter().map(|(_, b)| last(b)).collect();
                let f8: Vec<f64> = samples.iter().map(|(_, b)| first(b)).collect();
                let r1: Vec<f64> = samples.iter().filter_map(|(a, _)| a.running.map(|r| ms(a.created, r))).collect();
                let r8: Vec<f64> = samples.iter().filter_map(|(_, b)| b.running.map(|r| ms(b.created, r))).collect();
                rows.extend([
                    row(tag(label, "1 replica: POST sent -> program's line (BASE)"), &l1, None),
                    row(tag(label, "8 replicas: POST sent -> first replica's line"), &f8, Some(&l1)),
                    row(tag(label, "8 replicas: POST sent -> last replica's line"), &l8, Some(&l1)),
                    row(tag(label, "1 replica: createTime -> startTime (driver)"), &r1, None),
                    row(tag(label, "8 replicas: createTime -> startTime (driver)"), &r8, Some(&r1)),
                ]);
            }
            print_rows("(c) HTTP, `sh -c 'date +%s%N; exec sleep 30'` in 8 replicas (pools of 1 and 7) against 1, then cancelled", &rows);
            if lost > 0 {
                println!("  note: in {lost} sample(s) logs?follow=true ended (job over) before it showed every replica's line;");
                println!("  the lines were in the log when it was read again.\n");
            }
        }
        drop(servers);
    }
    if o.keep {
        let kept = tmp.keep();
        println!("kept {}", kept.display());
    }
    Ok(())
}
