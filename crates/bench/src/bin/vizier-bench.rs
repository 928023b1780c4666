//! `vizier-bench`: the time of one Vizier suggestion through the REST API as a study grows.
//!
//! The real `trainyard serve` binary is started on a temporary data directory; a client
//! creates a study (the optimiser's default algorithm, Bayesian optimisation, over a
//! DOUBLE, an INTEGER and a CATEGORICAL parameter) and runs the loop a user's training
//! code runs: `trials:suggest` for one trial, then `:complete` with its objective (a
//! quadratic bowl, so the values are cheap and smooth). Each suggest is timed from before
//! the request to its done Operation (the server answers it done when the optimiser
//! finishes within its wait; otherwise the bench polls the Operation). The report gives
//! the times of the suggestions around each checkpoint (the 10 suggestions up to trial
//! 50, 100, ...), so the cost of the model's fit over a growing history shows.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

#[path = "../shared/entry.rs"]
mod entry;

const USAGE: &str = "\
usage: vizier-bench [--server-bin PATH] [--trials N] [--every N] [--keep]

  --server-bin PATH  the server (default: target/release/trainyard next to this binary)
  --trials N         trials in the study (default 200)
  --every N          report the 10 suggestions up to every N-th trial (default 50)
  --keep             keep the data directory and the server log";

const PROJECT: &str = "bench";
const REGION: &str = "us-central1";

struct Opts {
    bin: PathBuf,
    trials: usize,
    every: usize,
    keep: bool,
}

fn parse(args: &[String]) -> Result<Option<Opts>> {
    let here = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
    let mut o = Opts { bin: here.join("trainyard"), trials: 200, every: 50, keep: false };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| anyhow!("{name} needs a value"));
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--server-bin" => o.bin = PathBuf::from(value(a)?),
            "--trials" => o.trials = value(a)?.parse().context("--trials")?,
            "--every" => o.every = value(a)?.parse().context("--every")?,
            "--keep" => o.keep = true,
            other => bail!("unknown argument {other:?}"),
        }
    }
    if o.every == 0 || o.trials == 0 {
        bail!("--trials and --every must be positive");
    }
    Ok(Some(o))
}

#[path = "../shared/server.rs"]
mod server;
use server::{agent, Server};

/// `trainyard serve` on `dir`, its output in `dir/server.log`, with enough writes per
/// second for a client that does nothing but suggest and complete.
fn start_server(bin: &Path, dir: &Path) -> Result<Server> {
    let log = std::fs::File::create(dir.join("server.log")).context("creating the server log")?;
    let config = dir.join("trainyard.toml");
    std::fs::write(&config, "[limits]\nwrites_per_second_per_project = 100000.0\nwrite_burst_per_project = 100000\n")
        .context("writing the config")?;
    let out = log.try_clone()?;
    Server::start(bin, &config, &dir.join("data"), Duration::from_secs(60), |c| {
        c.env_remove("TRAINYARD_CONFIG").env("RUST_LOG", "warn").stdout(out).stderr(log);
    })
    .with_context(|| format!("its log is in {}", dir.display()))
}

fn call(agent: &ureq::Agent, method: &str, url: &str, body: Option<Value>) -> Result<Value> {
    let resp = match body {
        Some(b) => agent.post(url).header("Content-Type", "application/json").send(b.to_string()),
        None if method == "GET" => agent.get(url).call(),
        None => bail!("{method} without a body"),
    };
    let mut resp = resp.with_context(|| format!("{method} {url}"))?;
    let status = resp.status();
    let text = resp.body_mut().read_to_string().context("reading the answer")?;
    if !status.is_success() {
        bail!("{method} {url}: {status}: {text}");
    }
    serde_json::from_str(&text).context("the answer is not JSON")
}

fn loss(trial: &Value) -> Result<f64> {
    let p = |id: &str| trial["parameters"].as_array().and_then(|a| a.iter().find(|p| p["parameterId"] == id)).map(|p| p["value"].clone());
    let x = p("x").and_then(|v| v.as_f64()).ok_or_else(|| anyhow!("no x in {trial}"))?;
    let units = p("units").and_then(|v| v.as_i64()).ok_or_else(|| anyhow!("no integer units in {trial}"))? as f64;
    let sgd = if p("opt").is_some_and(|v| v == "sgd") { 0.1 } else { 0.0 };
    Ok((x - 1.3).powi(2) + (units - 20.0).powi(2) / 400.0 + sgd)
}

fn run(o: &Opts) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("vizier-bench-").tempdir().context("a temporary directory")?;
    let server = start_server(&o.bin, dir.path())?;
    let agent = agent();
    let base = format!("{}/v1/projects/{PROJECT}/locations/{REGION}", server.base);
    let study = call(
        &agent,
        "POST",
        &format!("{base}/studies"),
        Some(json!({"displayName": "bench", "studySpec": {
            "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
            "parameters": [
                {"parameterId": "x", "doubleValueSpec": {"minValue": -5.0, "maxValue": 5.0}},
                {"parameterId": "units", "integerValueSpec": {"minValue": "1", "maxValue": "64"}},
                {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}}
            ]}})),
    )?;
    let name = study["name"].as_str().ok_or_else(|| anyhow!("no name in {study}"))?.to_string();
    let mut times = Vec::with_capacity(o.trials);
    let mut best = f64::INFINITY;
    for n in 1..=o.trials {
        let t0 = Instant::now();
        let mut op = call(&agent, "POST", &format!("{}/v1/{name}/trials:suggest", server.base), Some(json!({"suggestionCount": 1, "clientId": "bench"})))?;
        while op["done"] != true {
            std::thread::sleep(Duration::from_millis(5));
            let opname = op["name"].as_str().ok_or_else(|| anyhow!("no operation name in {op}"))?.to_string();
            op = call(&agent, "GET", &format!("{}/v1/{opname}", server.base), None)?;
        }
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
        let trial = op["response"]["trials"][0].clone();
        let l = loss(&trial)?;
        best = best.min(l);
        let tname = trial["name"].as_str().ok_or_else(|| anyhow!("no trial in {op}"))?;
        call(&agent, "POST", &format!("{}/v1/{tname}:complete", server.base), Some(json!({"finalMeasurement": {"metrics": [{"metricId": "loss", "value": l}]}})))?;
        if n % o.every == 0 || n == o.trials {
            let window = &times[n.saturating_sub(10)..n];
            let mut sorted = window.to_vec();
            sorted.sort_by(f64::total_cmp);
            println!(
                "trials {:>4}: suggest {:>8.1} ms median, {:>8.1} ms max of the last {} (best loss so far {best:.2e})",
                n,
                sorted[sorted.len() / 2],
                sorted[sorted.len() - 1],
                window.len()
            );
        }
    }
    let total: f64 = times.iter().sum();
    println!("{} suggestions in {:.1} s ({:.1} ms on average)", times.len(), total / 1000.0, total / times.len() as f64);
    if o.keep {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    entry::main_of("vizier-bench", USAGE, parse, run)
}
