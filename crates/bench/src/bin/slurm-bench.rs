//! `slurm-bench`: what Trainyard-on-Slurm adds over bare `sbatch`, measured in one run on
//! the same cluster (`eval "$(scripts/slurm/up.sh)"` first):
//!
//! 1. create-to-RUNNING: a one-replica `sleep 1` job, from the create request to the
//!    first GET that shows `JOB_STATE_RUNNING`; the baseline is `sbatch --wrap 'touch
//!    started; sleep 1'` to the marker file appearing. Both sides polled every 10 ms;
//!    samples alternate between the two.
//!
//! 1b. gang create-to-RUNNING: a four-replica job (one allocation, a step per replica),
//!    from the create request to `JOB_STATE_RUNNING` (every replica started, L7); the
//!    baseline is `sbatch --ntasks=4` of the same shape whose script starts the same four
//!    steps (`srun --ntasks=1 --nodes=1 --exact`, each touching a marker) until all four
//!    markers exist. Alternating, as 1.
//! 2. throughput: N (default 200) one-second jobs, all submitted at once, until every one
//!    has ended, through Trainyard and through bare `sbatch` with the same request
//!    (`--cpus-per-task=1 --mem=2000M`, what an n1-standard-1 replica gets on the
//!    development cluster with `fit_to_nodes`).
//!
//! Usage: `slurm-bench [--trainyard PATH] [--jobs N] [--samples K] [--partition P]`.
//! Only the ratios mean anything; the target is that Trainyard adds at most 20%.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

struct Opts {
    trainyard: PathBuf,
    jobs: usize,
    samples: usize,
    partition: String,
}

fn parse() -> Result<Opts> {
    let exe = std::env::current_exe()?;
    let mut o = Opts {
        trainyard: exe.with_file_name("trainyard"),
        jobs: 200,
        samples: 10,
        partition: "debug".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().ok_or_else(|| anyhow!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--trainyard" => o.trainyard = v.into(),
            "--jobs" => o.jobs = v.parse()?,
            "--samples" => o.samples = v.parse()?,
            "--partition" => o.partition = v,
            other => bail!("unknown argument {other}"),
        }
        i += 2;
    }
    Ok(o)
}

struct Server {
    child: Child,
    port: u16,
    agent: ureq::Agent,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(bin: &Path, dir: &Path, partition: &str) -> Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let config = dir.join("trainyard.toml");
        std::fs::write(
            &config,
            format!(
                "backend = \"slurm\"\n[lifecycle]\ngrace_period_secs = 1\n[slurm]\npartition = \"{partition}\"\nfit_to_nodes = true\n"
            ),
        )?;
        let log = std::fs::File::create(dir.join("server.log"))?;
        let child = Command::new(bin)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .env("TRAINYARD_CONTAINER_ENGINE", "none")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let agent: ureq::Agent =
            ureq::Agent::config_builder().http_status_as_error(false).max_idle_connections(0).build().into();
        let s = Server { child, port, agent };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if s.agent.get(&s.url("/healthz")).call().is_ok_and(|r| r.status() == 200) {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the server did not come up: {}", std::fs::read_to_string(dir.join("server.log")).unwrap_or_default())
    }

    fn url(&self, p: &str) -> String {
        format!("http://127.0.0.1:{}{p}", self.port)
    }

    fn create(&self, script: &str) -> Result<String> {
        self.create_replicas(script, 1)
    }

    /// A job of `replicas` n1-standard-1 replicas (one primary, the rest in pool 1).
    fn create_replicas(&self, script: &str, replicas: u32) -> Result<String> {
        let pool = |n: u32| json!({"machineSpec": {"machineType": "n1-standard-1"}, "replicaCount": n.to_string(),
            "containerSpec": {"imageUri": "i", "command": ["sh", "-c", script]}});
        let mut pools = vec![pool(1)];
        if replicas > 1 {
            pools.push(pool(replicas - 1));
        }
        let job = json!({"displayName": "bench", "jobSpec": {"workerPoolSpecs": pools}});
        let mut r = self
            .agent
            .post(&self.url("/v1/projects/bench/locations/us-central1/customJobs"))
            .header("Content-Type", "application/json")
            .send(job.to_string())?;
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string()?)?;
        v["name"].as_str().map(String::from).ok_or_else(|| anyhow!("create: {v}"))
    }

    fn state(&self, name: &str) -> Result<String> {
        let mut r = self.agent.get(&self.url(&format!("/v1/{name}"))).call()?;
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string()?)?;
        Ok(v["state"].as_str().unwrap_or("").to_string())
    }
}

fn sbatch(partition: &str, out: &Path, script: &str) -> Result<u64> {
    let o = Command::new("sbatch")
        .args(["--parsable", "--no-requeue", &format!("--partition={partition}"), "--mem=2000M", "--cpus-per-task=1"])
        .arg(format!("--output={}", out.display()))
        .args(["--wrap", script])
        .output()?;
    if !o.status.success() {
        bail!("sbatch: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().split(';').next().unwrap_or("").parse()?)
}

fn squeue_states() -> Result<std::collections::HashMap<u64, String>> {
    let o = Command::new("squeue").arg("--json").output()?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    Ok(v["jobs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|j| Some((j["job_id"].as_u64()?, j["job_state"].as_str().unwrap_or("").to_string())))
                .collect()
        })
        .unwrap_or_default())
}

fn wait_until(bound: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + bound;
    loop {
        if f()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn terminal(s: &str) -> bool {
    matches!(s, "JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED")
}

fn run(o: &Opts) -> Result<()> {
    if !Command::new("sinfo").arg("-h").stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        bail!("no Slurm cluster answers: run `eval \"$(scripts/slurm/up.sh)\"` first");
    }
    let tmp = tempfile::tempdir()?;
    let server = Server::start(&o.trainyard, tmp.path(), &o.partition)?;
    let bare_dir = tmp.path().join("bare");
    std::fs::create_dir_all(&bare_dir)?;

    // 1. create-to-RUNNING, alternating.
    let (mut ty, mut bare) = (Vec::new(), Vec::new());
    for i in 0..o.samples {
        let t0 = Instant::now();
        let name = server.create("sleep 1")?;
        wait_until(Duration::from_secs(60), || Ok(server.state(&name)? == "JOB_STATE_RUNNING" || terminal(&server.state(&name)?)))?;
        ty.push(t0.elapsed().as_secs_f64() * 1000.0);
        wait_until(Duration::from_secs(60), || Ok(terminal(&server.state(&name)?)))?;

        let marker = bare_dir.join(format!("started-{i}"));
        let t0 = Instant::now();
        let id = sbatch(&o.partition, &bare_dir.join(format!("lat-{i}.out")), &format!("touch {}; sleep 1", marker.display()))?;
        wait_until(Duration::from_secs(60), || Ok(marker.exists()))?;
        bare.push(t0.elapsed().as_secs_f64() * 1000.0);
        wait_until(Duration::from_secs(60), || Ok(squeue_states()?.get(&id).is_some_and(|s| s != "RUNNING" && s != "PENDING" && s != "COMPLETING")))?;
    }
    let (ty_lat, bare_lat) = (median(&mut ty), median(&mut bare));

    // 1b. gang create-to-RUNNING, alternating.
    let (mut ty_gang, mut bare_gang) = (Vec::new(), Vec::new());
    for i in 0..o.samples {
        let t0 = Instant::now();
        let name = server.create_replicas("sleep 1", 4)?;
        wait_until(Duration::from_secs(120), || Ok(server.state(&name)? == "JOB_STATE_RUNNING" || terminal(&server.state(&name)?)))?;
        ty_gang.push(t0.elapsed().as_secs_f64() * 1000.0);
        wait_until(Duration::from_secs(120), || Ok(terminal(&server.state(&name)?)))?;

        let marks = bare_dir.join(format!("gang-{i}"));
        std::fs::create_dir_all(&marks)?;
        let script = bare_dir.join(format!("gang-{i}.sh"));
        let step = format!(
            "srun --ntasks=1 --nodes=1 --exact --cpus-per-task=1 --mem-per-cpu=2000M sh -c 'touch {}/$SLURM_STEP_ID; sleep 1' &\n",
            marks.display()
        );
        std::fs::write(&script, format!("#!/bin/sh\n{}wait\n", step.repeat(4)))?;
        let t0 = Instant::now();
        let o2 = Command::new("sbatch")
            .args(["--parsable", "--no-requeue", &format!("--partition={}", o.partition), "--ntasks=4", "--cpus-per-task=1", "--mem-per-cpu=2000M"])
            .arg(format!("--output={}", bare_dir.join(format!("gang-{i}.out")).display()))
            .arg(&script)
            .output()?;
        if !o2.status.success() {
            bail!("sbatch: {}", String::from_utf8_lossy(&o2.stderr));
        }
        let id: u64 = String::from_utf8_lossy(&o2.stdout).trim().split(';').next().unwrap_or("").parse()?;
        wait_until(Duration::from_secs(120), || Ok(std::fs::read_dir(&marks)?.count() >= 4))?;
        bare_gang.push(t0.elapsed().as_secs_f64() * 1000.0);
        wait_until(Duration::from_secs(120), || Ok(squeue_states()?.get(&id).is_some_and(|s| s != "RUNNING" && s != "PENDING" && s != "COMPLETING")))?;
    }
    let (ty_gang_lat, bare_gang_lat) = (median(&mut ty_gang), median(&mut bare_gang));

    // 2. throughput: bare first, then Trainyard.
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for i in 0..o.jobs {
        ids.push(sbatch(&o.partition, &bare_dir.join(format!("tp-{i}.out")), "sleep 1")?);
    }
    let bare_submit = t0.elapsed().as_secs_f64();
    wait_until(Duration::from_secs(1800), || {
        let st = squeue_states()?;
        Ok(ids.iter().all(|id| st.get(id).is_some_and(|s| !matches!(s.as_str(), "PENDING" | "RUNNING" | "COMPLETING" | "CONFIGURING"))))
    })?;
    let bare_total = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let mut names = Vec::new();
    for _ in 0..o.jobs {
        names.push(server.create("sleep 1")?);
    }
    let ty_submit = t0.elapsed().as_secs_f64();
    let mut left: Vec<String> = names.clone();
    wait_until(Duration::from_secs(1800), || {
        let mut still = Vec::new();
        for n in &left {
            if !terminal(&server.state(n)?) {
                still.push(n.clone());
            }
        }
        left = still;
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(left.is_empty())
    })?;
    let ty_total = t0.elapsed().as_secs_f64();
    let failed = names.iter().filter(|n| server.state(n).map(|s| s != "JOB_STATE_SUCCEEDED").unwrap_or(true)).count();

    println!("slurm-bench: {} samples, {} jobs, partition {}", o.samples, o.jobs, o.partition);
    println!("{:<40} {:>12} {:>12} {:>8}", "measure", "bare sbatch", "trainyard", "ratio");
    println!("{:<40} {:>10.0}ms {:>10.0}ms {:>8.2}", "create-to-RUNNING (median)", bare_lat, ty_lat, ty_lat / bare_lat);
    println!(
        "{:<40} {:>10.0}ms {:>10.0}ms {:>8.2}",
        "4-replica gang create-to-RUNNING (median)",
        bare_gang_lat,
        ty_gang_lat,
        ty_gang_lat / bare_gang_lat
    );
    println!("{:<40} {:>11.1}s {:>11.1}s {:>8.2}", format!("submit {} jobs", o.jobs), bare_submit, ty_submit, ty_submit / bare_submit);
    println!("{:<40} {:>11.1}s {:>11.1}s {:>8.2}", format!("{} one-second jobs, submit to all ended", o.jobs), bare_total, ty_total, ty_total / bare_total);
    println!("trainyard jobs not SUCCEEDED: {failed}");
    let ok = ty_total / bare_total <= 1.2;
    println!("target (throughput within +20%): {}", if ok { "met" } else { "NOT met" });
    let ids_to_cancel: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let _ = Command::new("scancel").args(&ids_to_cancel).status();
    Ok(())
}

fn main() -> ExitCode {
    match parse().and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slurm-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
