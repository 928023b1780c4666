//! `trainyard custom-jobs create|list|describe|cancel|stream-logs` and `trainyard
//! hp-tuning-jobs create|list|describe|cancel` against a server, shaped like the known CLI's
//! `ai custom-jobs` and `ai hp-tuning-jobs` commands, and the administration commands
//! (`nodes`, `quotas`).
//!
//! The commands every resource kind has (list, describe, cancel) are written once and take
//! the kind as a [`Kind`] (its collection, its name in messages, its own table columns);
//! each kind's clap commands keep their own flags and help texts and call them. Creating
//! one is each kind's own (flags that build its body).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

/// Where requests go. Each value comes from its flag, else its environment variable, else
/// the CLI config file (`trainyard config set KEY VALUE`), else the default.
#[derive(Args, Clone)]
pub struct Target {
    /// Trainyard server URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "TRAINYARD_SERVER", global = true)]
    server: Option<String>,
    /// Project id [default: local].
    #[arg(long, env = "TRAINYARD_PROJECT", global = true)]
    project: Option<String>,
    /// Region [default: us-central1].
    #[arg(long, env = "TRAINYARD_REGION", global = true)]
    region: Option<String>,
    /// Bearer token.
    #[arg(long, env = "TRAINYARD_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
}

/// The resolved target.
#[derive(Clone, Debug)]
pub struct Resolved {
    server: String,
    project: String,
    region: String,
    token: Option<String>,
}

impl Target {
    fn resolve(self) -> anyhow::Result<Resolved> {
        let file = crate::cliconfig::load()?;
        let server = self.server.or(file.server).unwrap_or_else(|| "http://127.0.0.1:8080".into());
        // `127.0.0.1:8080` as well as `http://127.0.0.1:8080`.
        let server = if server.contains("://") { server } else { format!("http://{server}") };
        Ok(Resolved {
            server,
            project: self.project.or(file.project).unwrap_or_else(|| "local".into()),
            region: self.region.or(file.region).unwrap_or_else(|| "us-central1".into()),
            token: self.token.or(file.token),
        })
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

#[derive(Subcommand)]
pub enum JobCommand {
    /// Create a CustomJob.
    Create {
        #[command(flatten)]
        target: Target,
        /// Display name of the job.
        #[arg(long)]
        display_name: Option<String>,
        /// A worker pool: machine-type=M,replica-count=N,container-image-uri=I[,accelerator-type=T,accelerator-count=C]
        /// or executor-image-uri=I,python-module=M,local-package-path=P. Repeat for pools 0, 1, 2, 3.
        #[arg(long = "worker-pool-spec")]
        worker_pool_specs: Vec<String>,
        /// Job file (YAML CustomJobSpec) to start from.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Comma-separated arguments for every pool's program.
        #[arg(long, value_delimiter = ',')]
        args: Vec<String>,
        /// Comma-separated command for every container pool.
        #[arg(long, value_delimiter = ',')]
        command: Vec<String>,
        /// Labels KEY=VALUE, comma-separated.
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
    },
    /// List CustomJobs, newest first.
    List {
        #[command(flatten)]
        target: Target,
        /// Most jobs to show.
        #[arg(long)]
        limit: Option<usize>,
        /// Filter expression (as the API takes it).
        #[arg(long)]
        filter: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show one CustomJob.
    Describe {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
        #[arg(long, value_enum, default_value = "yaml")]
        format: Format,
    },
    /// Cancel a CustomJob.
    Cancel {
        #[command(flatten)]
        target: Target,
        job: String,
    },
    /// Delete an ended CustomJob, with its logs (its outputs stay).
    Delete {
        #[command(flatten)]
        target: Target,
        job: String,
    },
    /// Print a job's logs, following them until the job ends.
    StreamLogs {
        #[command(flatten)]
        target: Target,
        job: String,
        /// Only this replica (e.g. workerpool0-0).
        #[arg(long)]
        replica: Option<String>,
        /// Only this attempt.
        #[arg(long)]
        attempt: Option<u32>,
        /// Start with the last N entries (then follow).
        #[arg(long)]
        tail: Option<usize>,
        /// Only entries at or after this RFC 3339 time (e.g. 2026-11-30T10:00:00Z).
        #[arg(long)]
        since: Option<String>,
    },
}

struct Api {
    agent: ureq::Agent,
    t: Resolved,
}

impl Api {
    fn new(t: Target) -> anyhow::Result<Api> {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Ok(Api { agent, t: t.resolve()? })
    }

    fn base(&self) -> String {
        format!("{}/v1/projects/{}/locations/{}", self.t.server.trim_end_matches('/'), self.t.project, self.t.region)
    }

    /// The URL of a resource given by id (in the target's project and region) or by full
    /// name `projects/P/locations/L/COLLECTION/ID` (in its own project and region).
    fn resource_url(&self, collection: &str, job: &str) -> anyhow::Result<String> {
        let bad = || anyhow::anyhow!("{job:?} is not a job id or a resource name projects/PROJECT/locations/REGION/{collection}/ID");
        let parts: Vec<&str> = job.trim_start_matches('/').split('/').collect();
        let (base, id) = match parts.as_slice() {
            [id] => (self.base(), *id),
            ["projects", p, "locations", l, c, id] if *c == collection && !p.is_empty() && !l.is_empty() => {
                (format!("{}/v1/projects/{p}/locations/{l}", self.t.server.trim_end_matches('/')), *id)
            }
            _ => return Err(bad()),
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(format!("{base}/{collection}/{id}"))
    }

    fn send(&self, method: &str, url: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        if let Some(t) = &self.t.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let text = body.map(|b| b.to_string()).unwrap_or_default();
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let req = req.body(text).context("building the request")?;
        let mut resp = self
            .agent
            .run(req)
            .with_context(|| format!("cannot reach the Trainyard server at {} (set --server or TRAINYARD_SERVER)", self.t.server))?;
        let status = resp.status();
        let text = resp.body_mut().read_to_string().context("reading the response")?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let msg = v["error"]["message"].as_str().unwrap_or(text.as_str());
            let name = v["error"]["status"].as_str().unwrap_or("");
            bail!("({name}) {msg}");
        }
        Ok(v)
    }
}

pub fn run(cmd: JobCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        JobCommand::Create { target, display_name, worker_pool_specs, config, args, command, labels } => {
            let api = Api::new(target)?;
            let body = build_job(display_name, &worker_pool_specs, config, &args, &command, &labels)?;
            let job = api.send("POST", &format!("{}/{}", api.base(), CUSTOM_JOBS.collection), Some(&body))?;
            let name = job["name"].as_str().unwrap_or("");
            println!("CustomJob [{name}] is submitted successfully.\n");
            println!("Your job is still active. You may view the status of your job with the command\n");
            println!("  $ trainyard custom-jobs describe {name}\n");
            println!("or continue streaming the logs with the command\n");
            println!("  $ trainyard custom-jobs stream-logs {name}");
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::List { target, limit, filter, format } => list(&CUSTOM_JOBS, target, limit, filter, format),
        JobCommand::Describe { target, job, format } => describe(&CUSTOM_JOBS, target, &job, format),
        JobCommand::Cancel { target, job } => cancel(&CUSTOM_JOBS, target, &job),
        JobCommand::Delete { target, job } => delete(&CUSTOM_JOBS, target, &job),
        JobCommand::StreamLogs { target, job, replica, attempt, tail, since } => {
            let api = Api::new(target)?;
            let mut url = format!("{}/logs?follow=true", api.resource_url(CUSTOM_JOBS.collection, &job)?);
            if let Some(r) = replica {
                url.push_str(&format!("&replica={}", encode(&r)));
            }
            if let Some(a) = attempt {
                url.push_str(&format!("&attempt={a}"));
            }
            if let Some(n) = tail {
                url.push_str(&format!("&tail={n}"));
            }
            if let Some(t) = since {
                url.push_str(&format!("&since={}", encode(&t)));
            }
            let mut req = api.agent.get(&url);
            if let Some(t) = &api.t.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            let resp = req.call().with_context(|| format!("cannot reach the Trainyard server at {}", api.t.server))?;
            if !resp.status().is_success() {
                let mut resp = resp;
                let text = resp.body_mut().read_to_string().unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                bail!("{}", v["error"]["message"].as_str().unwrap_or(&text));
            }
            let reader = BufReader::new(resp.into_body().into_reader());
            let stdout = std::io::stdout();
            for line in reader.lines() {
                let line = line.context("reading the log stream")?;
                let e: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                let who = match e["stream"].as_str() {
                    Some("event") => "trainyard".to_string(),
                    _ => e["replica"].as_str().unwrap_or("?").to_string(),
                };
                let mut out = stdout.lock();
                writeln!(out, "{} {}: {}", e["time"].as_str().unwrap_or(""), who, e["text"].as_str().unwrap_or(""))?;
                out.flush()?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A resource kind as the commands every kind has (list, describe, cancel) see it.
pub struct Kind {
    /// The collection segment of its REST paths: `customJobs`.
    pub collection: &'static str,
    /// How `cancel` names it: `CustomJob`.
    pub noun: &'static str,
    /// The columns of its `list` table between STATE and CREATE_TIME.
    pub columns: &'static [Column],
}

/// A column of a `list` table: its heading and its cell of a resource.
pub type Column = (&'static str, fn(&Value) -> String);

pub const CUSTOM_JOBS: Kind = Kind { collection: "customJobs", noun: "CustomJob", columns: &[] };

pub const TUNING_JOBS: Kind =
    Kind { collection: "hyperparameterTuningJobs", noun: "hyperparameter tuning job", columns: &[("MAX_TRIALS", max_trials)] };

fn max_trials(job: &Value) -> String {
    job["maxTrialCount"].to_string()
}

/// `list`: newest first, page after page until there are no more or `limit` are shown.
fn list(kind: &Kind, target: Target, limit: Option<usize>, filter: Option<String>, format: Format) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let mut url = format!("{}/{}?pageSize={}", api.base(), kind.collection, limit.unwrap_or(1000).min(1000));
        if let Some(f) = &filter {
            url.push_str(&format!("&filter={}", encode(f)));
        }
        if !token.is_empty() {
            url.push_str(&format!("&pageToken={}", encode(&token)));
        }
        let page = api.send("GET", &url, None)?;
        items.extend(page[kind.collection].as_array().cloned().unwrap_or_default());
        token = page["nextPageToken"].as_str().unwrap_or("").to_string();
        if token.is_empty() || limit.is_some_and(|l| items.len() >= l) {
            break;
        }
    }
    if let Some(l) = limit {
        items.truncate(l);
    }
    match format {
        Format::Table => {
            let text = |v: &Value| v.as_str().unwrap_or("").to_string();
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|j| {
                    let mut row = vec![
                        j["name"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("").to_string(),
                        text(&j["displayName"]),
                        text(&j["state"]),
                    ];
                    row.extend(kind.columns.iter().map(|(_, cell)| cell(j)));
                    row.push(text(&j["createTime"]));
                    row
                })
                .collect();
            let mut head = vec!["ID", "DISPLAY_NAME", "STATE"];
            head.extend(kind.columns.iter().map(|(heading, _)| *heading));
            head.push("CREATE_TIME");
            table(&head, &rows);
        }
        f => print_value(&Value::Array(items), f)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `describe`: one resource, by id or name, as the server shows it.
fn describe(kind: &Kind, target: Target, id: &str, format: Format) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let url = api.resource_url(kind.collection, id)?;
    let mut v = api.send("GET", &url, None)?;
    // A CustomJob's decision trail: each lifecycle event with the rule that made it.
    if kind.collection == CUSTOM_JOBS.collection {
        if let (Some(trail), Some(obj)) = (decision_trail(&api, &url), v.as_object_mut()) {
            obj.insert("decisions".into(), Value::Array(trail));
        }
    }
    print_value(&v, format)?;
    Ok(ExitCode::SUCCESS)
}

/// The lifecycle events of a job's log, `TIME RULE: TEXT` each; `None` when the log
/// cannot be read (the job is described without it).
fn decision_trail(api: &Api, url: &str) -> Option<Vec<Value>> {
    let mut req = api.agent.get(&format!("{url}/logs"));
    if let Some(t) = &api.t.token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let text = resp.body_mut().read_to_string().ok()?;
    Some(
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stream"] == "event")
            .map(|e| Value::String(format!("{} {}", e["time"].as_str().unwrap_or(""), e["text"].as_str().unwrap_or(""))))
            .collect(),
    )
}

/// `cancel`: ask for the cancel; the resource ends on its own time.
fn cancel(kind: &Kind, target: Target, id: &str) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let url = api.resource_url(kind.collection, id)?;
    api.send("POST", &format!("{url}:cancel"), Some(&json!({})))?;
    println!("Request to cancel {} [{}] has been sent.", kind.noun, url.split("/v1/").nth(1).unwrap_or(id));
    Ok(ExitCode::SUCCESS)
}

/// `delete`: an ended resource goes (a running one is refused: cancel it first).
fn delete(kind: &Kind, target: Target, id: &str) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let url = api.resource_url(kind.collection, id)?;
    api.send("DELETE", &url, None)?;
    println!("Deleted {} [{}].", kind.noun, url.split("/v1/").nth(1).unwrap_or(id));
    Ok(ExitCode::SUCCESS)
}

/// `--labels KEY=VALUE,...` as the resource's `labels`.
fn labels(flags: &[String]) -> anyhow::Result<Value> {
    let mut m = Map::new();
    for l in flags {
        let (k, v) = l.split_once('=').with_context(|| format!("--labels: {l:?} is not KEY=VALUE"))?;
        m.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(Value::Object(m))
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `machine-type=n1-standard-4,replica-count=1,container-image-uri=...` → a WorkerPoolSpec.
pub fn parse_pool(spec: &str) -> anyhow::Result<Value> {
    let mut kv = Map::new();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').with_context(|| format!("--worker-pool-spec: {part:?} is not KEY=VALUE"))?;
        kv.insert(k.trim().to_string(), Value::String(v.trim().to_string()));
    }
    let get = |k: &str| kv.get(k).and_then(Value::as_str).map(str::to_string);
    for k in kv.keys() {
        if ![
            "machine-type",
            "replica-count",
            "accelerator-type",
            "accelerator-count",
            "container-image-uri",
            "executor-image-uri",
            "python-module",
            "local-package-path",
            "script",
        ]
        .contains(&k.as_str())
        {
            bail!("--worker-pool-spec: unknown key {k:?}");
        }
    }
    let machine = get("machine-type").context("--worker-pool-spec needs machine-type")?;
    let mut ms = json!({ "machineType": machine });
    if let Some(a) = get("accelerator-type") {
        ms["acceleratorType"] = Value::String(a);
        ms["acceleratorCount"] = Value::String(get("accelerator-count").unwrap_or_else(|| "1".into()));
    }
    let mut pool = json!({ "machineSpec": ms, "replicaCount": get("replica-count").unwrap_or_else(|| "1".into()) });
    match (get("container-image-uri"), get("executor-image-uri")) {
        (Some(image), None) => pool["containerSpec"] = json!({ "imageUri": image }),
        (None, Some(exec)) => {
            let module = get("python-module").context("--worker-pool-spec with executor-image-uri needs python-module")?;
            let mut p = json!({ "executorImageUri": exec, "pythonModule": module });
            if let Some(path) = get("local-package-path") {
                let abs = std::path::absolute(&path).with_context(|| format!("local-package-path {path:?}"))?;
                p["packageUris"] = json!([abs.display().to_string()]);
            }
            pool["pythonPackageSpec"] = p;
        }
        (Some(_), Some(_)) => bail!("--worker-pool-spec: give container-image-uri or executor-image-uri, not both"),
        (None, None) => bail!("--worker-pool-spec needs container-image-uri or executor-image-uri"),
    }
    Ok(pool)
}

fn build_job(
    display_name: Option<String>,
    pools: &[String],
    config: Option<PathBuf>,
    args: &[String],
    command: &[String],
    labels: &[String],
) -> anyhow::Result<Value> {
    let mut job = match &config {
        Some(p) => crate::jobfile::read(p, display_name.as_deref())?,
        None => json!({ "displayName": display_name.clone().context("--display-name is required")?, "jobSpec": {} }),
    };
    if !pools.is_empty() {
        let specs: Vec<Value> = pools.iter().map(|p| parse_pool(p)).collect::<anyhow::Result<_>>()?;
        job["jobSpec"]["workerPoolSpecs"] = Value::Array(specs);
    }
    if let Some(list) = job["jobSpec"]["workerPoolSpecs"].as_array_mut() {
        for pool in list {
            if let Some(c) = pool.get_mut("containerSpec").and_then(Value::as_object_mut) {
                if !command.is_empty() {
                    c.insert("command".into(), json!(command));
                }
                if !args.is_empty() {
                    c.insert("args".into(), json!(args));
                }
            } else if let Some(p) = pool.get_mut("pythonPackageSpec").and_then(Value::as_object_mut) {
                if !args.is_empty() {
                    p.insert("args".into(), json!(args));
                }
            }
        }
    }
    if !labels.is_empty() {
        job["labels"] = self::labels(labels)?;
    }
    Ok(job)
}

fn print_value(v: &Value, format: Format) -> anyhow::Result<()> {
    match (format, v) {
        (Format::Json, _) => println!("{}", serde_json::to_string_pretty(v)?),
        // One resource as a table: a row per field, nested values in one line.
        (Format::Table, Value::Object(fields)) => {
            let rows: Vec<Vec<String>> = fields
                .iter()
                .map(|(k, v)| {
                    let cell = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    vec![k.clone(), one_line(&cell, 100)]
                })
                .collect();
            table(&["FIELD", "VALUE"], &rows);
        }
        (Format::Yaml | Format::Table, _) => print!("{}", serde_norway::to_string(v)?),
    }
    Ok(())
}

/// A value on one line of at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let cut: String = flat.chars().take(max.saturating_sub(3)).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_pool_spec_flag() {
        let p = parse_pool("machine-type=n1-standard-4,replica-count=2,container-image-uri=img,accelerator-type=NVIDIA_TESLA_T4,accelerator-count=2").unwrap();
        assert_eq!(p["machineSpec"]["machineType"], "n1-standard-4");
        assert_eq!(p["machineSpec"]["acceleratorType"], "NVIDIA_TESLA_T4");
        assert_eq!(p["replicaCount"], "2");
        assert_eq!(p["containerSpec"]["imageUri"], "img");
        assert!(parse_pool("machine-type=x,replica-count=1").is_err());
        assert!(parse_pool("machine-type=x,colour=blue,container-image-uri=i").unwrap_err().to_string().contains("colour"));
    }

    #[test]
    fn build_job_applies_args_command_labels() {
        let j = build_job(
            Some("n".into()),
            &["machine-type=n1-standard-4,replica-count=1,container-image-uri=i".into()],
            None,
            &["--epochs".into(), "3".into()],
            &["python3".into(), "t.py".into()],
            &["team=nlp".into()],
        )
        .unwrap();
        assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], json!(["python3", "t.py"]));
        assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"], json!(["--epochs", "3"]));
        assert_eq!(j["labels"]["team"], "nlp");
        let parsed = trainyard_api::parse_custom_job(j.to_string().as_bytes()).unwrap();
        trainyard_api::validate_custom_job(&parsed).unwrap();
    }
}

#[derive(Subcommand)]
pub enum NodeCommand {
    /// List the nodes, their state and what runs on them.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show one node.
    Describe {
        #[command(flatten)]
        target: Target,
        node: String,
        #[arg(long, value_enum, default_value = "yaml")]
        format: Format,
    },
    /// Drain a node: no new work; its replicas get SIGTERM and restart on other nodes (L9).
    Drain {
        #[command(flatten)]
        target: Target,
        node: String,
    },
    /// Let a drained node take work again.
    Undrain {
        #[command(flatten)]
        target: Target,
        node: String,
    },
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Limit, in use and queued demand per project and metric.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Read the quota limits again from the server's config file (no restart).
    Reload {
        #[command(flatten)]
        target: Target,
    },
}

impl Api {
    fn admin_url(&self, path: &str) -> String {
        format!("{}/v1/admin/{path}", self.t.server.trim_end_matches('/'))
    }
}

fn table(head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells.iter().enumerate().map(|(i, c)| format!("{c:w$}", w = w[i])).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    println!("{}", line(head.to_vec()));
    for r in rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
}

fn gib(v: &Value) -> String {
    let b: f64 = v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    format!("{:.1}", b / (1u64 << 30) as f64)
}

pub fn run_nodes(cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::List { target, format } => {
            let api = Api::new(target)?;
            let v = api.send("GET", &api.admin_url("nodes"), None)?;
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            match format {
                Format::Table => {
                    let rows: Vec<Vec<String>> = nodes
                        .iter()
                        .map(|n| {
                            vec![
                                n["name"].as_str().unwrap_or("").to_string(),
                                n["state"].as_str().unwrap_or("").to_string(),
                                format!("{}/{}", n["allocated"]["cpus"], n["cpus"]),
                                format!("{}/{}", gib(&n["allocated"]["memoryBytes"]), gib(&n["memoryBytes"])),
                                n["accelerators"].as_object().map(|m| m.iter().map(|(k, c)| format!("{k}:{c}")).collect::<Vec<_>>().join(",")).unwrap_or_default(),
                                n["replicas"].as_array().map_or(0, Vec::len).to_string(),
                            ]
                        })
                        .collect();
                    table(&["NAME", "STATE", "CPUS", "MEMORY_GIB", "ACCELERATORS", "REPLICAS"], &rows);
                }
                f => print_value(&Value::Array(nodes), f)?,
            }
        }
        NodeCommand::Describe { target, node, format } => {
            let api = Api::new(target)?;
            print_value(&api.send("GET", &api.admin_url(&format!("nodes/{}", encode(&node))), None)?, format)?;
        }
        NodeCommand::Drain { target, node } => {
            let api = Api::new(target)?;
            let v = api.send("POST", &api.admin_url(&format!("nodes/{}:drain", encode(&node))), Some(&json!({})))?;
            println!("Node [{node}] drained: {} replicas are moving to other nodes.", v["replicas"].as_array().map_or(0, Vec::len));
        }
        NodeCommand::Undrain { target, node } => {
            let api = Api::new(target)?;
            api.send("POST", &api.admin_url(&format!("nodes/{}:undrain", encode(&node))), Some(&json!({})))?;
            println!("Node [{node}] takes work again.");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_quotas(cmd: QuotaCommand) -> anyhow::Result<ExitCode> {
    let (target, format, reload) = match cmd {
        QuotaCommand::List { target, format } => (target, format, false),
        QuotaCommand::Reload { target } => (target, Format::Table, true),
    };
    let api = Api::new(target)?;
    let v = if reload {
        api.send("POST", &api.admin_url("quotas:reload"), Some(&json!({})))?
    } else {
        api.send("GET", &api.admin_url("quotas"), None)?
    };
    let rows = v["quotas"].as_array().cloned().unwrap_or_default();
    match format {
        Format::Table => {
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    ["project", "region", "metric", "limit", "inUse", "queued"]
                        .iter()
                        .map(|k| r[*k].as_str().map(str::to_string).unwrap_or_else(|| if *k == "limit" { "unlimited".into() } else { String::new() }))
                        .collect()
                })
                .collect();
            table(&["PROJECT", "REGION", "METRIC", "LIMIT", "IN_USE", "QUEUED"], &rows);
        }
        f => print_value(&Value::Array(rows), f)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `trainyard hp-tuning-jobs ...`, like the known CLI's `ai hp-tuning-jobs`.
#[derive(Subcommand)]
pub enum StudyCommand {
    /// Create a HyperparameterTuningJob from a YAML file holding its studySpec and
    /// trialJobSpec (or a whole HyperparameterTuningJob).
    Create {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        display_name: String,
        /// YAML: `studySpec:` and `trialJobSpec:` (and optionally the counts).
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        max_trial_count: Option<i64>,
        #[arg(long)]
        parallel_trial_count: Option<i64>,
        #[arg(long)]
        max_failed_trial_count: Option<i64>,
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
    },
    /// List HyperparameterTuningJobs, newest first.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        filter: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show one HyperparameterTuningJob with its trials.
    Describe {
        #[command(flatten)]
        target: Target,
        job: String,
        #[arg(long, value_enum, default_value = "yaml")]
        format: Format,
    },
    /// Cancel a HyperparameterTuningJob and its running trials.
    Cancel {
        #[command(flatten)]
        target: Target,
        job: String,
    },
    /// Delete an ended HyperparameterTuningJob (its trials' CustomJobs stay).
    Delete {
        #[command(flatten)]
        target: Target,
        job: String,
    },
}

pub fn run_studies(cmd: StudyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        StudyCommand::Create { target, display_name, config, max_trial_count, parallel_trial_count, max_failed_trial_count, labels } => {
            let api = Api::new(target)?;
            let text = std::fs::read_to_string(&config).with_context(|| format!("cannot read {}", config.display()))?;
            let mut job: Value =
                serde_norway::from_str(&text).with_context(|| format!("{} is not valid YAML", config.display()))?;
            if !job.is_object() {
                bail!("{}: expected a mapping with studySpec and trialJobSpec", config.display());
            }
            job["displayName"] = Value::String(display_name);
            for (k, v) in [("maxTrialCount", max_trial_count), ("parallelTrialCount", parallel_trial_count), ("maxFailedTrialCount", max_failed_trial_count)] {
                if let Some(v) = v {
                    job[k] = json!(v);
                }
            }
            if !labels.is_empty() {
                job["labels"] = self::labels(&labels)?;
            }
            let created = api.send("POST", &format!("{}/{}", api.base(), TUNING_JOBS.collection), Some(&job))?;
            let name = created["name"].as_str().unwrap_or("");
            println!("Hyperparameter tuning job [{name}] submitted successfully.\n");
            println!("Your job is still active. You may view the status of your job with the command\n");
            println!("  $ trainyard hp-tuning-jobs describe {name}");
            Ok(ExitCode::SUCCESS)
        }
        // One page of at most 1000, as this command (which has no --limit) has always listed.
        StudyCommand::List { target, filter, format } => list(&TUNING_JOBS, target, Some(1000), filter, format),
        StudyCommand::Describe { target, job, format } => describe(&TUNING_JOBS, target, &job, format),
        StudyCommand::Cancel { target, job } => cancel(&TUNING_JOBS, target, &job),
        StudyCommand::Delete { target, job } => delete(&TUNING_JOBS, target, &job),
    }
}
