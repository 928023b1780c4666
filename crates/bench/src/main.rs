//! `trainyard-bench`: latency of Trainyard's job start and replica restart paths,
//! measured in one run against a bare fork/exec baseline measured in the same run.
//!
//! The machine is assumed noisy: only the ratios and the same-run comparisons printed
//! here mean anything; absolute milliseconds do not carry over to another host or run.
//!
//! `trainyard-bench shim <run_dir>` is the replica supervisor, so that the engine started
//! here can use `[current_exe, "shim"]` as its shim command (as `trainyard serve` does).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use trainyard_api::CustomJob;
use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{BackendEvent, CgroupSupport, EventSink, LocalBackend};
use trainyard_core::RunId;
use trainyard_server::driver::{now_micros, run_dir, Create, Kind};
use trainyard_server::{Config, Engine, Msg};
use trainyard_store::Store;


#[path = "shared/row.rs"]
mod row;
const PROJECT: &str = "bench";
const RUNNING_LINE: &str = "Job is running.";
/// Memory limit of the reference shims, about what the driver gives an n1-standard-4
/// replica (L14), so that they set up a cgroup the same way.
const REF_MEMORY_LIMIT: u64 = 12 << 30;
/// Bound on any single wait of the benchmark (a job that does not start, or does not end).
const WAIT_BOUND: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The shim must set its signal mask before any thread exists.
    if args.get(1).map(String::as_str) == Some("shim") {
        let code = trainyard_backend::main_from_args(args[2..].to_vec());
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let opts = match Opts::parse(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("trainyard-bench: {e}\n\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    if opts.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trainyard-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "\
usage: trainyard-bench [--quick] [--baseline N] [--one N] [--eight N] [--restart N] [--warmup N] [--keep]

  --baseline N  bare spawn repetitions (default 50)
  --one N       1-replica create-to-RUNNING repetitions (default 30)
  --eight N     8-replica create-to-RUNNING repetitions (default 20)
  --restart N   replica restart repetitions (default 20)
  --warmup N    discarded repetitions before each Trainyard measurement (default 2)
  --quick       5 repetitions of everything (a smoke test, not a measurement)
  --keep        keep the temporary data directory and print its path

Build with `cargo build --release -p trainyard-bench`; run target/release/trainyard-bench.";

struct Opts {
    baseline: usize,
    one: usize,
    eight: usize,
    restart: usize,
    warmup: usize,
    keep: bool,
    help: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut o = Opts { baseline: 50, one: 30, eight: 20, restart: 20, warmup: 2, keep: false, help: false };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| -> Result<usize> {
                let v = it.next().ok_or_else(|| anyhow!("{name} needs a number"))?;
                let n: usize = v.parse().map_err(|_| anyhow!("{name}: not a number: {v}"))?;
                if n == 0 && name != "--warmup" {
                    bail!("{name} must be at least 1");
                }
                Ok(n)
            };
            match a.as_str() {
                "--baseline" => o.baseline = num("--baseline")?,
                "--one" => o.one = num("--one")?,
                "--eight" => o.eight = num("--eight")?,
                "--restart" => o.restart = num("--restart")?,
                "--warmup" => o.warmup = num("--warmup")?,
                "--quick" => {
                    o.baseline = 5;
                    o.one = 5;
                    o.eight = 5;
                    o.restart = 5;
                    o.warmup = 1;
                }
                "--keep" => o.keep = true,
                "-h" | "--help" => o.help = true,
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(o)
    }
}

// ---------------------------------------------------------------------------------------
// Statistics

#[derive(Clone, Copy)]
struct Stats {
    n: usize,
    p50: f64,
    p90: f64,
    max: f64,
}

/// Nearest-rank percentiles of samples in milliseconds.
fn stats(samples: &[f64]) -> Stats {
    let mut v: Vec<f64> = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        let k = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[k - 1]
    };
    Stats { n: v.len(), p50: rank(0.50), p90: rank(0.90), max: v.last().copied().unwrap_or(f64::NAN) }
}

fn ms_between(from_micros: i64, to_micros: i64) -> f64 {
    (to_micros - from_micros) as f64 / 1000.0
}

// ---------------------------------------------------------------------------------------
// Environment

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
}

/// The filesystem type and mount point holding `path` (longest mount-point prefix).
fn filesystem_of(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let path = std::fs::canonicalize(path).ok()?;
    let mut best: Option<(usize, String, String)> = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(mount) = fields.get(4) else { continue };
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        let Some(fstype) = fields.get(dash + 1) else { continue };
        if path.starts_with(mount) && best.as_ref().is_none_or(|(len, _, _)| mount.len() >= *len) {
            best = Some((mount.len(), fstype.to_string(), mount.to_string()));
        }
    }
    best.map(|(_, t, m)| (t, m))
}

fn describe_cgroups(c: &CgroupSupport) -> String {
    match c {
        CgroupSupport::V1 { base } => format!("v1 (memory controller), replica cgroups under {}", base.display()),
        CgroupSupport::V2 { base } => format!("v2 (unified), replica cgroups under {}", base.display()),
        CgroupSupport::Unavailable { reason } => format!("none usable: {reason} (replicas run without a cgroup)"),
    }
}

fn host_mount_cgroup_kind() -> &'static str {
    // What the host mounts, independently of whether Trainyard can write to it.
    match std::fs::metadata("/sys/fs/cgroup/cgroup.controllers") {
        Ok(_) => "cgroup2 mounted at /sys/fs/cgroup",
        Err(_) if Path::new("/sys/fs/cgroup/memory").exists() => "cgroup v1 hierarchies under /sys/fs/cgroup",
        Err(_) => "no cgroup filesystem found at /sys/fs/cgroup",
    }
}

// ---------------------------------------------------------------------------------------
// Baseline: bare spawn

/// Time from before `spawn` to `spawn` returning (Rust's spawn returns once exec
/// succeeded), then kill and reap the child outside the timed section.
fn bare_spawn(program: &str, args: &[&str], n: usize) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let t0 = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("spawning {program}"))?;
        let dt = t0.elapsed();
        let _ = child.kill();
        child.wait().with_context(|| format!("reaping {program}"))?;
        out.push(dt.as_secs_f64() * 1000.0);
    }
    Ok(out)
}

/// The shim alone, without the server: spawn `[exe, "shim", dir]` the way the local
/// backend does (stdout piped, own session) and take the shim's own `started.json` time
/// minus the time before spawn. Then SIGTERM the shim and reap it.
fn bare_shim(exe: &Path, base: &Path, cgroups: &CgroupSupport, n: usize, tag: &str) -> Result<Vec<f64>> {
    use std::os::unix::process::CommandExt;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let dir = base.join(format!("{tag}-{i}"));
        std::fs::create_dir_all(&dir)?;
        let mut spec = ref_spec();
        if let Some((v, b)) = cgroups.base() {
            spec.cgroup_base = Some(b.to_path_buf());
            spec.cgroup_version = Some(v.number());
            spec.cgroup_name = format!("bench-{}-{tag}-{i}", std::process::id());
        }
        trainyard_backend::write_spec(&dir, &spec)?;
        let mut cmd = Command::new(exe);
        cmd.arg("shim").arg(&dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        // SAFETY: setsid is async-signal-safe (as the local backend does).
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let t0 = now_micros();
        let mut child = cmd.spawn().context("spawning the shim")?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let started = shim::read_started(&dir)?.ok_or_else(|| anyhow!("the shim in {} never started", dir.display()))?;
        out.push(ms_between(t0, started.time_micros));
        // SAFETY: our own child, not yet reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        child.wait()?;
    }
    Ok(out)
}

fn ref_spec() -> ShimSpec {
    let env: Vec<(String, String)> =
        ["PATH", "HOME"].iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    let mut spec = ShimSpec::new(vec!["sleep".into(), "30".into()], env);
    spec.memory_limit_bytes = Some(REF_MEMORY_LIMIT);
    spec
}

/// The local backend without the driver and its store: `k` runs launched back to back
/// from one thread (as the driver does for a job's replicas). Returns the duration of
/// each `LocalBackend::launch` call (what blocks the driver thread) and, per burst, the
/// time from before the first call to the last `started.json`.
fn backend_burst(backend: &LocalBackend, base: &Path, k: usize, n: usize, tag: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let (tx, rx) = std::sync::mpsc::channel::<BackendEvent>();
    let tx = std::sync::Mutex::new(tx);
    let sink: EventSink = std::sync::Arc::new(move |ev| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(ev);
        }
    });
    let (mut calls, mut bursts) = (Vec::new(), Vec::new());
    for i in 0..n {
        let dirs: Vec<PathBuf> = (0..k).map(|j| base.join(format!("{tag}-{i}-{j}"))).collect();
        let t0 = now_micros();
        for (j, dir) in dirs.iter().enumerate() {
            let run = RunId { job: 1_000_000 + i as u64, attempt: 0, replica: format!("{tag}-{j}"), restart: 0 };
            let c0 = Instant::now();
            backend.launch(run, dir, ref_spec(), sink.clone())?;
            calls.push(c0.elapsed().as_secs_f64() * 1000.0);
        }
        let mut started = 0;
        while started < k {
            match rx.recv_timeout(WAIT_BOUND).context("waiting for the reference shims to start")? {
                BackendEvent::Started { .. } => started += 1,
                BackendEvent::Exited { run, outcome, .. } => bail!("reference run {run} ended at start: {outcome:?}"),
            }
        }
        let mut last = i64::MIN;
        for dir in &dirs {
            last = last.max(shim::read_started(dir)?.context("started without started.json")?.time_micros);
        }
        bursts.push(ms_between(t0, last));
        for dir in &dirs {
            backend.stop(dir)?;
        }
        let mut exited = 0;
        while exited < k {
            if let BackendEvent::Exited { .. } = rx.recv_timeout(WAIT_BOUND).context("waiting for the reference shims to end")? {
                exited += 1;
            }
        }
    }
    Ok((calls, bursts))
}

/// p50 of writing 64 bytes to a new file and fsyncing it (the store commits with
/// synchronous=FULL and the shims write their files with fsync).
fn fsync_probe(dir: &Path, n: usize) -> Result<f64> {
    use std::io::Write;
    let mut v = Vec::new();
    for i in 0..n {
        let path = dir.join(format!("fsync-probe-{i}"));
        let t0 = Instant::now();
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&[b'x'; 64])?;
        f.sync_all()?;
        v.push(t0.elapsed().as_secs_f64() * 1000.0);
        drop(f);
        std::fs::remove_file(&path)?;
    }
    Ok(stats(&v).p50)
}

// ---------------------------------------------------------------------------------------
// Trainyard jobs

fn custom_job(name: &str, pools: &[u32]) -> Result<CustomJob> {
    let pools: Vec<serde_json::Value> = pools
        .iter()
        .map(|&count| {
            serde_json::json!({
                "machineSpec": {"machineType": "n1-standard-4"},
                "replicaCount": count.to_string(),
                "containerSpec": {"imageUri": "local/bench", "command": ["sleep", "30"]},
            })
        })
        .collect();
    let body = serde_json::json!({"displayName": name, "jobSpec": {"workerPoolSpecs": pools}});
    let job = trainyard_api::parse_custom_job(body.to_string().as_bytes()).map_err(|e| anyhow!("{}", e.message))?;
    trainyard_api::validate_custom_job(&job).map_err(|e| anyhow!("{}", e.message))?;
    Ok(job)
}

struct Bench {
    engine: Engine,
    store: Store,
    region: String,
    data_dir: PathBuf,
    /// Log lines of Trainyard that looked wrong during the run.
    anomalies: Vec<String>,
}

/// One create-to-RUNNING sample; all times in µs since the epoch, one clock.
struct StartSample {
    id: u64,
    /// Before `Msg::Create` was sent.
    sent: i64,
    /// The job's `create_time` (driver).
    created: i64,
    /// The earliest and latest `started.json` time of the replicas' restart 0 (shims).
    first_exec: i64,
    last_exec: i64,
    /// Time of the `Job is running.` event (driver).
    running: i64,
}

impl Bench {
    fn create(&mut self, job: &CustomJob) -> Result<(u64, i64)> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let sent = now_micros();
        self.engine
            .tx
            .send(Msg::Create {
                project: PROJECT.into(),
                region: self.region.clone(),
                new: Create::CustomJob { resource: Box::new(job.clone()), reply },
            })
            .map_err(|_| anyhow!("the engine stopped"))?;
        let created = rx.blocking_recv().context("the engine stopped")?.map_err(|e| anyhow!("create: {}", e.message))?;
        let id = created.name.rsplit('/').next().and_then(|s| s.parse().ok()).context("the created job has no id")?;
        Ok((id, sent))
    }

    /// Waits for the `Job is running.` line; fails if the job ends first.
    fn wait_running(&mut self, id: u64) -> Result<i64> {
        let deadline = Instant::now() + WAIT_BOUND;
        let mut seq = 0;
        loop {
            for e in self.store.events(id, seq)? {
                seq = e.seq;
                // Events are stored with their rule first (`L7: Job is running.`).
                if e.text.ends_with(RUNNING_LINE) {
                    return Ok(e.time);
                }
            }
            let stored = self.store.get_job_by_id(id)?.context("job vanished")?;
            if stored.job.is_terminal() {
                let lines: Vec<String> = self.store.events(id, 0)?.into_iter().map(|e| e.text).collect();
                bail!("job {id} ended {} before RUNNING: {}", stored.job.state().wire_name(), lines.join(" | "));
            }
            if Instant::now() >= deadline {
                bail!("job {id} not RUNNING after {WAIT_BOUND:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn cancel_and_wait(&mut self, id: u64) -> Result<()> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.engine
            .tx
            .send(Msg::Cancel { kind: Kind::CustomJob, project: PROJECT.into(), region: self.region.clone(), id, reply })
            .map_err(|_| anyhow!("the engine stopped"))?;
        rx.blocking_recv().context("the engine stopped")?.map_err(|e| anyhow!("cancel job {id}: {}", e.message))?;
        let deadline = Instant::now() + WAIT_BOUND;
        loop {
            let stored = self.store.get_job_by_id(id)?.context("job vanished")?;
            if stored.job.is_terminal() {
                if stored.job.state().wire_name() != "JOB_STATE_CANCELLED" {
                    self.anomalies.push(format!("job {id} ended {} after a cancel", stored.job.state().wire_name()));
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("job {id} did not end within {WAIT_BOUND:?} of its cancel");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn run_path(&self, id: u64, attempt: u32, replica: &str, restart: u32) -> PathBuf {
        run_dir(&self.data_dir, &RunId { job: id, attempt, replica: replica.to_string(), restart })
    }

    /// Create, wait for RUNNING, read the shims' start times, cancel, wait for the end.
    fn start_sample(&mut self, job: &CustomJob) -> Result<StartSample> {
        let (id, sent) = self.create(job)?;
        let running = self.wait_running(id)?;
        let stored = self.store.get_job_by_id(id)?.context("job vanished")?;
        let (mut first_exec, mut last_exec) = (i64::MAX, i64::MIN);
        for r in &stored.job.replicas {
            let dir = self.run_path(id, stored.job.attempt, &r.name, 0);
            let s = shim::read_started(&dir)?.ok_or_else(|| anyhow!("{}: RUNNING without started.json", dir.display()))?;
            first_exec = first_exec.min(s.time_micros);
            last_exec = last_exec.max(s.time_micros);
        }
        if last_exec > running {
            self.anomalies.push(format!("job {id}: a replica's started.json is later than the RUNNING event"));
        }
        let created = stored.job.create_time;
        self.cancel_and_wait(id)?;
        Ok(StartSample { id, sent, created, first_exec, last_exec, running })
    }
}

struct RestartSample {
    /// Before our SIGKILL.
    killed: i64,
    /// `status.json` `ended_micros` of restart 0 (shim).
    ended: i64,
    /// `started.json` `time_micros` of restart 1 (shim).
    restarted: i64,
}

impl Bench {
    fn restart_sample(&mut self, job: &CustomJob) -> Result<RestartSample> {
        let (id, _) = self.create(job)?;
        self.wait_running(id)?;
        let stored = self.store.get_job_by_id(id)?.context("job vanished")?;
        let replica = stored.job.replicas.first().context("no replica")?.name.clone();
        let attempt = stored.job.attempt;
        let dir0 = self.run_path(id, attempt, &replica, 0);
        let dir1 = self.run_path(id, attempt, &replica, 1);
        let started0 = shim::read_started(&dir0)?.context("no started.json for restart 0")?;
        let killed = now_micros();
        // SAFETY: kill(2); the program is alive (the job is RUNNING and its shim has not
        // reaped it), so the pid is not a reused one.
        if unsafe { libc::kill(started0.pid as libc::pid_t, libc::SIGKILL) } != 0 {
            bail!("kill {}: {}", started0.pid, std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + WAIT_BOUND;
        let started1 = loop {
            if let Some(s) = shim::read_started(&dir1).ok().flatten() {
                break s;
            }
            if Instant::now() >= deadline {
                let lines: Vec<String> = self.store.events(id, 0)?.into_iter().map(|e| e.text).collect();
                bail!("job {id}: restart 1 did not start within {WAIT_BOUND:?}: {}", lines.join(" | "));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let status0 = shim::read_status(&dir0)?.context("restart 1 started but restart 0 has no status.json")?;
        if status0.signal != Some(libc::SIGKILL) {
            self.anomalies.push(format!("job {id}: restart 0 recorded {status0:?}, expected signal 9"));
        }
        self.cancel_and_wait(id)?;
        Ok(RestartSample { killed, ended: status0.ended_micros, restarted: started1.time_micros })
    }
}

// ---------------------------------------------------------------------------------------
// Report

struct Row {
    label: String,
    stats: Stats,
    /// p50 / baseline p50.
    ratio: Option<f64>,
}

fn print_table(rows: &[Row]) {
    println!("{:<58} {:>4} {:>9} {:>9} {:>9} {:>10}", "measurement (ms)", "N", "p50", "p90", "max", "p50/base");
    println!("{}", "-".repeat(104));
    for r in rows {
        let ratio = r.ratio.map(|x| format!("{x:.1}x")).unwrap_or_default();
        println!(
            "{:<58} {:>4} {:>9.3} {:>9.3} {:>9.3} {:>10}",
            r.label, r.stats.n, r.stats.p50, r.stats.p90, r.stats.max, ratio
        );
    }
    // The baseline itself is no row of the table.
    for r in rows.iter().filter(|r| !r.label.starts_with("[base]")) {
        if let Some(x) = r.ratio {
            row::row("trainyard-bench", &format!("{} p50", r.label.trim()), &format!("{:.3} ms", r.stats.p50), &format!("{:.3} ms", r.stats.p50 / x), x);
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn run(opts: &Opts) -> Result<()> {
    let exe = std::env::current_exe().context("locating this program")?;
    let tmp = tempfile::Builder::new().prefix("trainyard-bench-").tempdir().context("temporary directory")?;
    let data_dir = tmp.path().join("data");
    let workdir = tmp.path().join("work");
    std::fs::create_dir_all(&workdir)?;
    let mut cfg = Config::builtin(Some(data_dir.clone()));
    // Host processes, what the baseline spawns too: on a host with podman the built-in
    // config would run the jobs' image (`local/bench`, which no registry has).
    cfg.containers.engine = trainyard_server::config::EngineSetting::None;
    let region = cfg.region.clone();
    let shim_command: Vec<OsString> = vec![exe.clone().into_os_string(), "shim".into()];
    // The bench's jobs write no outputs: no output root besides the storage root.
    let roots = cfg.output_roots.clone();
    let engine = trainyard_server::start(cfg, shim_command, workdir, roots)?;
    let store = Store::connect(&engine.store)?;
    let cgroups = trainyard_backend::CgroupSupport::detect();
    let backend_line = engine.services.backend.describe();

    println!("== trainyard-bench ==");
    println!("environment:");
    println!(
        "  cores             {} available ({})",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu_model().unwrap_or_else(|| "unknown CPU".into())
    );
    println!("  kernel            {}", read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default());
    println!("  cgroups (host)    {}", host_mount_cgroup_kind());
    println!("  cgroups (used)    {}", describe_cgroups(&cgroups));
    println!("  backend           {backend_line}");
    match filesystem_of(&data_dir) {
        Some((t, m)) => println!("  data dir          {} ({t} mounted at {m})", data_dir.display()),
        None => println!("  data dir          {}", data_dir.display()),
    }
    println!("  fsync (64 B file) p50 {:.3} ms in the data dir's filesystem", fsync_probe(&data_dir, 20)?);
    println!("  load average      {} (start)", read_trimmed("/proc/loadavg").unwrap_or_default());
    println!("  config            built-in (Config::builtin), [containers] engine = \"none\", shim = [{}, \"shim\"]", exe.display());
    println!(
        "  repetitions       baseline {} | 1-replica {} | 8-replica {} | restart {} | warm-up {} discarded each",
        opts.baseline, opts.one, opts.eight, opts.restart, opts.warmup
    );
    println!();

    let mut bench = Bench { engine, store, region, data_dir: data_dir.clone(), anomalies: Vec::new() };
    let t_all = Instant::now();

    // Dirty pages (e.g. a binary just built) are written back now, not during the run.
    // SAFETY: sync(2) has no memory effects.
    unsafe { libc::sync() };

    // 1. Baselines: a block now, samples interleaved with the start-path repetitions
    // (the ratios use those: same machine state), and a block at the end.
    eprintln!("[bench] baseline: bare spawn");
    bare_spawn("sleep", &["30"], opts.warmup.max(3))?;
    let base_sleep_start = bare_spawn("sleep", &["30"], opts.baseline)?;
    let mut base_sleep = Vec::new();
    let mut base_true = Vec::new();
    // Which start-path repetitions get a baseline sample before them, spread evenly.
    let reps = opts.one + opts.eight;
    let take_base = |k: usize| -> usize { ((k + 1) * opts.baseline).div_ceil(reps) - (k * opts.baseline).div_ceil(reps) };
    eprintln!("[bench] baseline: shim alone");
    let shim_base = tmp.path().join("shim-alone");
    bare_shim(&exe, &shim_base, &cgroups, opts.warmup, "warm")?;
    let shim_alone = bare_shim(&exe, &shim_base, &cgroups, opts.baseline, "m")?;
    eprintln!("[bench] reference: local backend without the driver");
    let backend = LocalBackend::new(vec![exe.clone().into_os_string(), "shim".into()], cgroups.clone());
    let backend_base = tmp.path().join("backend-alone");
    backend_burst(&backend, &backend_base, 1, opts.warmup, "w1")?;
    let (calls1, burst1) = backend_burst(&backend, &backend_base, 1, opts.one, "b1")?;
    let (calls8, burst8) = backend_burst(&backend, &backend_base, 8, opts.eight, "b8")?;

    // 2. One replica.
    eprintln!("[bench] 1-replica create-to-RUNNING");
    let one = custom_job("bench-1", &[1])?;
    for _ in 0..opts.warmup {
        bench.start_sample(&one)?;
    }
    let mut s1 = Vec::new();
    for k in 0..opts.one {
        for _ in 0..take_base(k) {
            base_sleep.extend(bare_spawn("sleep", &["30"], 1)?);
            base_true.extend(bare_spawn("/bin/true", &[], 1)?);
        }
        s1.push(bench.start_sample(&one)?);
    }

    // 3. Eight replicas (pool 0: 1, pool 1: 7).
    eprintln!("[bench] 8-replica create-to-RUNNING");
    let eight = custom_job("bench-8", &[1, 7])?;
    for _ in 0..opts.warmup {
        bench.start_sample(&eight)?;
    }
    let mut s8 = Vec::new();
    for k in opts.one..reps {
        for _ in 0..take_base(k) {
            base_sleep.extend(bare_spawn("sleep", &["30"], 1)?);
            base_true.extend(bare_spawn("/bin/true", &[], 1)?);
        }
        s8.push(bench.start_sample(&eight)?);
    }

    // 4. Restart after SIGKILL.
    eprintln!("[bench] replica restart after SIGKILL");
    for _ in 0..opts.warmup {
        bench.restart_sample(&one)?;
    }
    let mut rs = Vec::new();
    for _ in 0..opts.restart {
        rs.push(bench.restart_sample(&one)?);
    }

    // Drift check: the baseline again, at the end of the run.
    let base_sleep_end = bare_spawn("sleep", &["30"], opts.baseline)?;
    let elapsed = t_all.elapsed();
    let load_end = read_trimmed("/proc/loadavg").unwrap_or_default();

    let _ = bench.engine.tx.send(Msg::Shutdown);
    let Bench { engine, anomalies, .. } = bench;
    match engine.thread.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => println!("note: the driver ended with a store error: {e}"),
        Err(_) => println!("note: the driver thread panicked"),
    }

    // Derived series.
    let col = |v: &[StartSample], f: fn(&StartSample) -> f64| -> Vec<f64> { v.iter().map(f).collect() };
    let c2r = |s: &StartSample| ms_between(s.created, s.running);
    let send2r = |s: &StartSample| ms_between(s.sent, s.running);
    let c2exec = |s: &StartSample| ms_between(s.created, s.last_exec);
    let c2first_exec = |s: &StartSample| ms_between(s.created, s.first_exec);
    let exec_span = |s: &StartSample| ms_between(s.first_exec, s.last_exec);
    let exec2r = |s: &StartSample| ms_between(s.last_exec, s.running);
    let restart: Vec<f64> = rs.iter().map(|r| ms_between(r.ended, r.restarted)).collect();
    let kill2start: Vec<f64> = rs.iter().map(|r| ms_between(r.killed, r.restarted)).collect();
    let kill2end: Vec<f64> = rs.iter().map(|r| ms_between(r.killed, r.ended)).collect();


    let b = stats(&base_sleep);
    let rel = |s: Stats| Some(s.p50 / b.p50);
    let one_c2r = stats(&col(&s1, c2r));
    let eight_c2r = stats(&col(&s8, c2r));
    let restart_st = stats(&restart);

    let rows = vec![
        Row { label: "[base] bare spawn `sleep 30`, interleaved (BASELINE)".into(), stats: b, ratio: Some(1.0) },
        Row { label: "[base] bare spawn `/bin/true`, interleaved".into(), stats: stats(&base_true), ratio: rel(stats(&base_true)) },
        Row { label: "[base] bare spawn `sleep 30`, block at the start".into(), stats: stats(&base_sleep_start), ratio: rel(stats(&base_sleep_start)) },
        Row { label: "[base] bare spawn `sleep 30`, block at the end".into(), stats: stats(&base_sleep_end), ratio: rel(stats(&base_sleep_end)) },
        Row { label: "[ref]  shim alone: spawn shim -> its started.json".into(), stats: stats(&shim_alone), ratio: rel(stats(&shim_alone)) },
        Row { label: "[ref]  LocalBackend::launch call (blocks the caller)".into(), stats: stats(&calls1), ratio: rel(stats(&calls1)) },
        Row { label: "[ref]  LocalBackend, 1 launch -> started.json".into(), stats: stats(&burst1), ratio: rel(stats(&burst1)) },
        Row { label: "[ref]  LocalBackend::launch call, in bursts of 8".into(), stats: stats(&calls8), ratio: rel(stats(&calls8)) },
        Row { label: "[ref]  LocalBackend, 8 launches -> last started.json".into(), stats: stats(&burst8), ratio: rel(stats(&burst8)) },
        Row { label: "1 replica:  create_time -> 'Job is running.' (driver)".into(), stats: one_c2r, ratio: rel(one_c2r) },
        Row { label: "  part: create_time -> started.json (program exec'd)".into(), stats: stats(&col(&s1, c2exec)), ratio: rel(stats(&col(&s1, c2exec))) },
        Row { label: "  part: started.json -> 'Job is running.'".into(), stats: stats(&col(&s1, exec2r)), ratio: rel(stats(&col(&s1, exec2r))) },
        Row { label: "  client: before Msg::Create -> 'Job is running.'".into(), stats: stats(&col(&s1, send2r)), ratio: rel(stats(&col(&s1, send2r))) },
        Row { label: "8 replicas: create_time -> 'Job is running.' (driver)".into(), stats: eight_c2r, ratio: rel(eight_c2r) },
        Row { label: "  part: create_time -> first started.json".into(), stats: stats(&col(&s8, c2first_exec)), ratio: rel(stats(&col(&s8, c2first_exec))) },
        Row { label: "  part: create_time -> last started.json".into(), stats: stats(&col(&s8, c2exec)), ratio: rel(stats(&col(&s8, c2exec))) },
        Row { label: "  part: first -> last started.json (spread)".into(), stats: stats(&col(&s8, exec_span)), ratio: rel(stats(&col(&s8, exec_span))) },
        Row { label: "  part: last started.json -> 'Job is running.'".into(), stats: stats(&col(&s8, exec2r)), ratio: rel(stats(&col(&s8, exec2r))) },
        Row { label: "  client: before Msg::Create -> 'Job is running.'".into(), stats: stats(&col(&s8, send2r)), ratio: rel(stats(&col(&s8, send2r))) },
        Row { label: "restart: status.json ended (r0) -> started.json (r1)".into(), stats: restart_st, ratio: rel(restart_st) },
        Row { label: "  end-to-end: our SIGKILL -> started.json (r1)".into(), stats: stats(&kill2start), ratio: rel(stats(&kill2start)) },
        Row { label: "  part: our SIGKILL -> status.json ended (r0)".into(), stats: stats(&kill2end), ratio: rel(stats(&kill2end)) },
    ];

    println!("results (one run, {:.1} s; load average at the end: {load_end}):", elapsed.as_secs_f64());
    println!("Ratios (p50/base) are against the bare spawn of `sleep 30` sampled between the");
    println!("start-path repetitions. Bare spawn = before Command::spawn to its return (after exec).");
    println!("RUNNING is taken as the time of the driver's `Job is running.` event minus the job's");
    println!("create_time, both recorded by the driver (no polling granularity in the numbers; the");
    println!("bench polls the store only to learn that the event exists). started.json, status.json");
    println!("times are written by the shims. Same clock (CLOCK_REALTIME) throughout. [ref] rows");
    println!("isolate parts of the path without the driver and its store (see README).");
    println!();
    print_table(&rows);
    println!();

    let overhead = one_c2r.p50 - b.p50;
    let overhead_p90 = one_c2r.p90 - b.p90;
    let r81 = eight_c2r.p50 / one_c2r.p50;
    let r81_p90 = eight_c2r.p90 / one_c2r.p90;
    println!("targets (p50 unless noted):");
    println!(
        "  1-replica overhead over bare spawn < 10 ms : {overhead:.3} ms (p90 {overhead_p90:.3} ms) -> {}",
        verdict(overhead < 10.0)
    );
    println!(
        "  8 replicas no slower than 2x one replica  : {r81:.2}x (p90 {r81_p90:.2}x) -> {}",
        verdict(r81 <= 2.0)
    );
    println!(
        "  restart (status ended -> r1 started) < 20 ms: {:.3} ms (p90 {:.3} ms) -> {}",
        restart_st.p50,
        restart_st.p90,
        verdict(restart_st.p50 < 20.0)
    );
    println!(
        "  (context: without driver and store, 8 launches / 1 launch = {:.2}x at p50)",
        stats(&burst8).p50 / stats(&burst1).p50
    );
    println!(
        "  (baseline drift: start block p50 {:.3} ms, interleaved {:.3} ms, end block {:.3} ms)",
        stats(&base_sleep_start).p50,
        b.p50,
        stats(&base_sleep_end).p50
    );
    let ids: Vec<u64> = s1.iter().chain(&s8).map(|s| s.id).collect();
    if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
        println!("  (measured jobs {first}..{last} for the start paths)");
    }
    if !anomalies.is_empty() {
        println!();
        println!("anomalies seen:");
        for a in &anomalies {
            println!("  - {a}");
        }
    }
    if opts.keep {
        let kept = tmp.keep();
        println!("\ndata kept in {}", kept.display());
    }
    Ok(())
}
