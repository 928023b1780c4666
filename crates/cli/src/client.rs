//! `trainyard custom-jobs create|list|describe|cancel|delete|stream-logs` and `trainyard
//! hp-tuning-jobs create|list|describe|cancel|delete|stream-logs` against a server, shaped
//! like the known CLI's `ai custom-jobs` and `ai hp-tuning-jobs` commands, and the
//! administration commands (`nodes`, `quotas`).
//!
//! The commands every resource kind has (list, describe, cancel, delete, waiting on one)
//! are written once and take the kind as a [`Kind`] (its collection, its names in messages,
//! its own table columns); each kind's clap commands keep their own flags and help texts
//! and call them. Creating one is each kind's own (flags that build its body).
//!
//! Every request goes through [`Api::request`], so that every failure says how to fix it:
//! a server that cannot be reached names the address and where it came from, a 401 or 403
//! names the token's flag and variable, an answer that is not the API's says so.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use crate::output::{print_list, print_value, text, Column, CreatedFormat, Format, ListFormat, ResourceFormat};
use crate::progress::{self, Progress};

/// Where requests go. Each value comes from its flag, else its environment variable, else
/// the CLI config file (`trainyard config set KEY VALUE`), else the default.
#[derive(Args, Clone)]
pub struct Target {
    /// Trainyard server URL (else the CLI config's `server`, else http://127.0.0.1:8080).
    #[arg(long, env = "TRAINYARD_SERVER", global = true, value_name = "URL")]
    server: Option<String>,
    /// Project id (else the CLI config's `project`, else `local`).
    #[arg(long, env = "TRAINYARD_PROJECT", global = true)]
    project: Option<String>,
    /// Region (else the CLI config's `region`, else us-central1).
    #[arg(long, env = "TRAINYARD_REGION", global = true)]
    region: Option<String>,
    /// Bearer token, for a server with a tokens file (else the CLI config's `token`).
    #[arg(long, env = "TRAINYARD_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// CA certificate (PEM) to trust an https server by, such as the `<data_dir>/tls/ca.pem`
    /// of a server with `[tls] auto` (else the CLI config's `ca_file`, else the usual
    /// public CAs).
    #[arg(long, env = "TRAINYARD_CA_FILE", global = true, value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

/// The resolved target.
#[derive(Clone, Debug)]
pub struct Resolved {
    server: String,
    project: String,
    region: String,
    token: Option<String>,
    ca_file: Option<PathBuf>,
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
            ca_file: self.ca_file.or(file.ca_file.map(PathBuf::from)),
        })
    }
}

/// The certificates of a CA file (`--ca-file`), or why it cannot be used.
fn read_ca_file(path: &Path) -> anyhow::Result<Vec<ureq::tls::Certificate<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("--ca-file (TRAINYARD_CA_FILE) {}: cannot read it", path.display()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item.with_context(|| format!("--ca-file (TRAINYARD_CA_FILE) {}: not a PEM file", path.display()))? {
            ureq::tls::PemItem::Certificate(c) => certs.push(c),
            _ => {}
        }
    }
    if certs.is_empty() {
        anyhow::bail!("--ca-file (TRAINYARD_CA_FILE) {}: holds no certificate (PEM \"BEGIN CERTIFICATE\")", path.display());
    }
    Ok(certs)
}

/// Is this server address on this host (a loopback address or `localhost`)?
pub fn server_is_local(server: &str) -> bool {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How relative paths in a job's `command` and `args` are sent (see `jobfile`).
#[derive(Args, Clone, Copy)]
pub struct PathFlags {
    /// Send relative paths in command and args as written, for a container image that has
    /// them in its working directory (by default they are made absolute against the job
    /// file's directory when the server is on this host, and refused otherwise).
    #[arg(long)]
    keep_relative_paths: bool,
}

/// `--wait` of a create command.
#[derive(Args, Clone, Copy)]
pub struct WaitFlag {
    /// Wait until the job ends, with a progress line on stderr; exit 0 when it SUCCEEDED,
    /// 1 when it FAILED, 130 when it was cancelled (Ctrl-C stops waiting, the job goes on).
    /// A CustomJob's output is printed as it comes, as local-run prints it.
    #[arg(long)]
    wait: bool,
    /// With --wait: leave the job's output out (the progress line and the end only).
    #[arg(long, requires = "wait")]
    no_logs: bool,
}

#[derive(Subcommand)]
pub enum JobCommand {
    /// Create a CustomJob.
    Create {
        #[command(flatten)]
        target: Target,
        /// Display name of the job (default with --config: the job file's name).
        #[arg(long)]
        display_name: Option<String>,
        /// A worker pool: machine-type=M,replica-count=N,container-image-uri=I[,accelerator-type=T,accelerator-count=C]
        /// or executor-image-uri=I,python-module=M,local-package-path=P. Repeat for pools 0, 1, 2, 3.
        #[arg(long = "worker-pool-spec", value_name = "SPEC")]
        worker_pool_specs: Vec<String>,
        /// Job file (YAML CustomJobSpec, as local-run takes) to start from; relative paths
        /// in its command and args are read against its directory.
        #[arg(long, value_name = "FILE")]
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
        #[command(flatten)]
        paths: PathFlags,
        #[command(flatten)]
        wait: WaitFlag,
        #[command(flatten)]
        format: CreatedFormat,
    },
    /// List CustomJobs, newest first.
    List {
        #[command(flatten)]
        target: Target,
        /// Most jobs to show.
        #[arg(long)]
        limit: Option<usize>,
        /// Jobs asked for per request (the API's pageSize, at most 1000); every page is
        /// fetched up to --limit.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        page_size: Option<u32>,
        /// Filter expression, as the API takes it (e.g. 'state="JOB_STATE_RUNNING"').
        #[arg(long)]
        filter: Option<String>,
        #[command(flatten)]
        format: ListFormat,
    },
    /// Show one CustomJob, with its decision trail (each lifecycle event and its rule).
    Describe {
        #[command(flatten)]
        target: Target,
        /// Job id (e.g. 12) or resource name (projects/P/locations/L/customJobs/12).
        job: String,
        #[command(flatten)]
        format: ResourceFormat,
    },
    /// Cancel a CustomJob.
    Cancel {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
    },
    /// Delete an ended CustomJob, with its logs (its outputs stay).
    Delete {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
    },
    /// Run a command, or a shell, inside a running replica of a CustomJob (its user,
    /// cgroups, namespaces, environment and GPUs; `podman exec` in a container). With no
    /// command: the replica's shell on a terminal. The exit status is the command's.
    Exec {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
        /// The replica to enter (default: the primary, workerpool0-0).
        #[arg(long, value_name = "NAME")]
        replica: Option<String>,
        /// A terminal for the command even when one is given (raw mode, its size passed on).
        #[arg(long, short = 't', conflicts_with = "no_tty")]
        tty: bool,
        /// No terminal even for the shell: its output and exit status only.
        #[arg(long, short = 'T')]
        no_tty: bool,
        /// The command and its arguments, after `--` (default: bash where the replica has
        /// it, else sh).
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Forward a local port to a port inside a running replica (a Jupyter, TensorBoard or
    /// a training dashboard), each connection through the server, until Ctrl-C.
    PortForward {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
        /// LOCAL:REMOTE, or one PORT for both (LOCAL 0: any free port, printed).
        ports: String,
        /// The replica whose port it is (default: the primary, workerpool0-0).
        #[arg(long, value_name = "NAME")]
        replica: Option<String>,
        /// The local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: String,
    },
    /// Print a job's logs, following them until the job ends.
    StreamLogs {
        #[command(flatten)]
        target: Target,
        /// Job id or resource name.
        job: String,
        #[command(flatten)]
        sel: LogSelection,
    },
}

/// Which log entries `stream-logs` prints.
#[derive(Args, Clone, Default)]
pub struct LogSelection {
    /// Only this replica (e.g. workerpool0-0).
    #[arg(long)]
    replica: Option<String>,
    /// Only this attempt.
    #[arg(long)]
    attempt: Option<u32>,
    /// Start with the last N entries (then follow).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only entries at or after this RFC 3339 time (e.g. 2026-11-30T10:00:00Z).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
}

/// Why a request failed, said so that the reader knows what to do.
#[derive(Debug)]
pub enum CallError {
    /// No HTTP answer at all (refused, no route, name not found, timed out).
    Unreachable { server: String, cause: String, timeout: bool },
    /// An HTTP answer with an error status.
    Status { code: u16, message: String },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable { server, cause, .. } if untrusted(cause) => write!(
                f,
                "the Trainyard server at {server} has a certificate this CLI does not trust: give its CA with --ca-file or \
                 TRAINYARD_CA_FILE (a server with [tls] auto keeps it in <data_dir>/tls/ca.pem): {cause}"
            ),
            CallError::Unreachable { server, cause, timeout: false } => write!(
                f,
                "cannot reach the Trainyard server at {server} (start it with trainyard serve, or set --server or TRAINYARD_SERVER): {cause}"
            ),
            CallError::Unreachable { server, cause, timeout: true } => write!(
                f,
                "the Trainyard server at {server} did not answer in time (is it the right address? set --server or TRAINYARD_SERVER): {cause}"
            ),
            CallError::Status { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for CallError {}

/// A TLS failure that asking again does not mend: the server's certificate is not trusted.
fn untrusted(cause: &str) -> bool {
    cause.contains("certificate")
}

impl CallError {
    /// Worth asking again (a server restarting, overloaded or briefly unavailable)?
    fn transient(&self) -> bool {
        match self {
            CallError::Unreachable { cause, .. } => !untrusted(cause),
            CallError::Status { code, .. } => matches!(code, 429 | 502 | 503 | 504),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Api {
    agent: ureq::Agent,
    t: Resolved,
}

impl Api {
    pub(crate) fn new(t: Target) -> anyhow::Result<Api> {
        let t = t.resolve()?;
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(ca) = &t.ca_file {
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(read_ca_file(ca)?)));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            // A server that does not answer is said to, not waited on forever. No limit
            // on bodies: a followed log is read for as long as its job runs.
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(120)))
            .build()
            .into();
        Ok(Api { agent, t })
    }

    fn base(&self) -> String {
        format!("{}/v1/projects/{}/locations/{}", self.t.server.trim_end_matches('/'), self.t.project, self.t.region)
    }

    /// The server's address as given (`--server`, `TRAINYARD_SERVER`, the CLI's config).
    pub(crate) fn server(&self) -> &str {
        &self.t.server
    }

    /// The bearer token, if one is given.
    pub(crate) fn token(&self) -> Option<&str> {
        self.t.token.as_deref()
    }

    /// The CA an https server is trusted by (`--ca-file`), if one is given.
    pub(crate) fn ca_file(&self) -> Option<&Path> {
        self.t.ca_file.as_deref()
    }

    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("{}/v1/admin/{path}", self.t.server.trim_end_matches('/'))
    }

    /// The URL of a resource given by id (in the target's project and region) or by full
    /// name `projects/P/locations/L/COLLECTION/ID` (in its own project and region).
    pub(crate) fn resource_url(&self, collection: &str, job: &str) -> anyhow::Result<String> {
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

    /// One request; a failure is a [`CallError`] that says how to fix it. The response is
    /// returned unread (a followed log is read as it comes).
    fn request(&self, method: &str, url: &str, body: Option<&Value>) -> Result<ureq::http::Response<ureq::Body>, CallError> {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        if let Some(t) = &self.t.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let text = body.map(|b| b.to_string()).unwrap_or_default();
        let req = req.body(text).map_err(|e| CallError::Unreachable {
            server: self.t.server.clone(),
            cause: format!("not a valid request URL ({url}): {e}"),
            timeout: false,
        })?;
        let mut resp = self.agent.run(req).map_err(|e| CallError::Unreachable {
            server: self.t.server.clone(),
            timeout: matches!(e, ureq::Error::Timeout(_)),
            cause: e.to_string(),
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Err(self.status_error(status.as_u16(), &text, url))
    }

    /// An error answer as a message: the API's status and message, and for 401 and 403
    /// where the token comes from.
    pub(crate) fn status_error(&self, code: u16, text: &str, url: &str) -> CallError {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let Some(msg) = v["error"]["message"].as_str() else {
            let snippet = crate::output::one_line(text.trim(), 200);
            return CallError::Status {
                code,
                message: format!(
                    "HTTP {code} from {url}{}{snippet}: is {} a Trainyard server? (set --server or TRAINYARD_SERVER)",
                    if snippet.is_empty() { "" } else { ": " },
                    self.t.server
                ),
            };
        };
        let name = v["error"]["status"].as_str().unwrap_or("");
        let mut message = format!("({name}) {msg}");
        let admin = url.contains("/v1/admin/");
        match code {
            401 if self.t.token.is_none() => {
                message.push_str(" The server wants a token: give it with --token or TRAINYARD_TOKEN (or `trainyard config set token TOKEN`).")
            }
            401 => message.push_str(
                " The token given (--token, TRAINYARD_TOKEN or the CLI config's token) is not one the server knows: check it, or ask for one in the server's tokens file.",
            ),
            403 if msg.starts_with("Host ") => {}
            403 if admin => message.push_str(
                " nodes and quotas are the administration API: they need a token with projects = [\"*\"] (give it with --token or TRAINYARD_TOKEN).",
            ),
            403 => message.push_str(&format!(
                " The token (--token, TRAINYARD_TOKEN or the CLI config's token) may not do this in project {:?}: use one with that project (read-write to change things), or choose the project with --project or TRAINYARD_PROJECT.",
                url.split("/projects/").nth(1).and_then(|r| r.split('/').next()).unwrap_or(&self.t.project)
            )),
            _ => {}
        }
        CallError::Status { code, message }
    }

    /// A request whose answer is one JSON value.
    pub(crate) fn send(&self, method: &str, url: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        Ok(self.try_send(method, url, body)?)
    }

    fn try_send(&self, method: &str, url: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let mut resp = self.request(method, url, body)?;
        let text = resp.body_mut().read_to_string().map_err(|e| CallError::Unreachable {
            server: self.t.server.clone(),
            cause: format!("reading the answer: {e}"),
            timeout: false,
        })?;
        serde_json::from_str(&text).map_err(|_| CallError::Status {
            code: 200,
            message: format!(
                "the answer of {url} is not JSON ({}): is {} a Trainyard server? (set --server or TRAINYARD_SERVER)",
                crate::output::one_line(text.trim(), 80),
                self.t.server
            ),
        })
    }
}

/// A resource kind as the commands every kind has (list, describe, cancel) see it.
pub struct Kind {
    /// The collection segment of its REST paths: `customJobs`.
    pub collection: &'static str,
    /// How messages name it: `CustomJob`.
    pub noun: &'static str,
    /// Its resource type, which starts a sentence: `CustomJob`, `HyperparameterTuningJob`.
    pub title: &'static str,
    /// Its subcommand: `custom-jobs`.
    pub command: &'static str,
    /// The columns of its `list` table between STATE and CREATE_TIME.
    pub columns: &'static [Column],
}

pub const CUSTOM_JOBS: Kind =
    Kind { collection: "customJobs", noun: "CustomJob", title: "CustomJob", command: "custom-jobs", columns: &[] };

pub const TUNING_JOBS: Kind = Kind {
    collection: "hyperparameterTuningJobs",
    noun: "hyperparameter tuning job",
    title: "HyperparameterTuningJob",
    command: "hp-tuning-jobs",
    columns: &[("MAX_TRIALS", max_trials)],
};

fn max_trials(job: &Value) -> String {
    text(&job["maxTrialCount"])
}

fn id_cell(j: &Value) -> String {
    j["name"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("").to_string()
}

/// `list`: newest first, page after page until there are no more or `limit` are shown.
fn list(
    kind: &Kind,
    target: Target,
    limit: Option<usize>,
    page_size: Option<u32>,
    filter: Option<String>,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let size = page_size.map_or(limit.unwrap_or(1000).min(1000), |s| s as usize);
        let mut url = format!("{}/{}?pageSize={size}", api.base(), kind.collection);
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
    let mut columns: Vec<Column> = vec![("ID", id_cell), ("DISPLAY_NAME", |j| text(&j["displayName"])), ("STATE", |j| text(&j["state"]))];
    columns.extend_from_slice(kind.columns);
    columns.push(("CREATE_TIME", |j| text(&j["createTime"])));
    print_list(&items, &columns, format)?;
    if items.is_empty() && filter.is_none() && format == Format::Table {
        eprintln!("{}", empty_list_note(&api, kind));
    }
    Ok(ExitCode::SUCCESS)
}

/// Said (on stderr) when a list is empty: which project and region were asked, and, when
/// the project is none this server knows (no quota, no use, as the caller may see them in
/// `/v1/admin/quotas`), the nearest known one: a typo in `--project` is not an empty table
/// and nothing more.
fn empty_list_note(api: &Api, kind: &Kind) -> String {
    let (project, region) = (&api.t.project, &api.t.region);
    let mut note = format!("No {}s in project {project} ({region}).", kind.title);
    let Ok(v) = api.try_send("GET", &api.admin_url("quotas"), None) else { return note };
    let mut known: Vec<String> = ["quotas", "usageHistory"]
        .iter()
        .flat_map(|k| v[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["project"].as_str().map(str::to_string))
        .filter(|p| p != "*")
        .collect();
    known.sort();
    known.dedup();
    if known.is_empty() || known.contains(project) {
        return note;
    }
    note.push_str(&format!(" This server knows no project {project:?} (none of its jobs has run and it has no quota of its own)"));
    match trainyard_core::catalog::closest(project, known.iter().map(String::as_str)) {
        Some(c) => note.push_str(&format!("; did you mean --project={c}?")),
        None => note.push_str(&format!("; projects it knows: {}.", known.join(", "))),
    }
    note
}

/// `describe`: one resource, by id or name, as the server shows it.
fn describe(kind: &Kind, target: Target, id: &str, format: Format) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let url = api.resource_url(kind.collection, id)?;
    let mut v = api.send("GET", &url, None)?;
    // A CustomJob's events: what happened, each with the rule that made it.
    if kind.collection == CUSTOM_JOBS.collection {
        if let (Some(trail), Some(obj)) = (events(&api, &url, format), v.as_object_mut()) {
            obj.insert("events".into(), Value::Array(trail));
        }
    }
    // A study's best trial, summed up at the top.
    if kind.collection == TUNING_JOBS.collection {
        let summary = best_trial_summary(&v);
        let best = best_trial(&v).map(|b| b.trial.clone());
        if let (Some(best), Some(obj)) = (best, v.as_object_mut()) {
            obj.insert("bestTrial".into(), best);
        }
        match format {
            Format::Yaml => summary.iter().for_each(|l| println!("# {l}")),
            Format::Table => {
                summary.iter().for_each(|l| println!("{l}"));
                println!();
            }
            Format::Json | Format::Csv => {}
        }
    }
    print_value(&v, format)?;
    Ok(ExitCode::SUCCESS)
}

/// The lifecycle events of a job's log: `TIME TEXT [RULE]` each, in words first, or with
/// `--format=json` an object with `time`, `text` and `rule`; `None` when the log cannot be
/// read (the job is described without it).
fn events(api: &Api, url: &str, format: Format) -> Option<Vec<Value>> {
    let mut resp = api.request("GET", &format!("{url}/logs"), None).ok()?;
    let text = resp.body_mut().read_to_string().ok()?;
    Some(
        text.lines()
            .filter_map(|l| serde_json::from_str::<trainyard_server::logs::Entry>(l).ok())
            .filter(|e| e.stream == "event")
            .map(|e| {
                let words = trainyard_server::logs::plain_text(&e.text);
                match (format, &e.rule) {
                    (Format::Json, rule) => serde_json::json!({"time": e.time, "text": words, "rule": rule}),
                    (_, Some(rule)) => Value::String(format!("{} {words} [{rule}]", e.time)),
                    (_, None) => Value::String(format!("{} {words}", e.time)),
                }
            })
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

/// After a create: the message (or the resource with `--format`), and with `--wait` the
/// wait until the job ends.
fn created(kind: &Kind, api: &Api, resource: Value, wait: WaitFlag, format: Option<Format>) -> anyhow::Result<ExitCode> {
    let name = resource["name"].as_str().unwrap_or("").to_string();
    let noun = kind.title;
    let cmd = kind.command;
    if !wait.wait {
        match format {
            Some(f) => print_value(&resource, f)?,
            None => {
                println!("{noun} [{name}] is submitted successfully.\n");
                println!("Your job is still active. You may view the status of your job with the command\n");
                println!("  $ trainyard {cmd} describe {name}\n");
                println!("or continue streaming the logs with the command\n");
                println!("  $ trainyard {cmd} stream-logs {name}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if format.is_none() {
        println!("{noun} [{name}] is submitted successfully. Waiting for it to end (Ctrl-C stops waiting; the job goes on).");
        let _ = std::io::stdout().flush();
    }
    let url = api.resource_url(kind.collection, &name)?;
    // A CustomJob's output, followed beside the wait (a tuning job's trials have
    // `stream-logs`, with a prefix per trial).
    let output = (format.is_none() && !wait.no_logs && kind.collection == CUSTOM_JOBS.collection).then(|| follow_in_background(api, &url));
    let (code, end) = wait_for(kind, api, &url, &name, output)?;
    if let Some(f) = format {
        print_value(&end, f)?;
    }
    Ok(ExitCode::from(code))
}

/// Set by SIGINT while a command waits on a job.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// A job's log entries, followed on a thread of their own until the job ends ([`follow_log`]),
/// each sent as the line the logs API gave; the channel closes when the thread ends.
fn follow_in_background(api: &Api, url: &str) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (api, url) = (api.clone(), url.to_string());
    std::thread::spawn(move || {
        let sent = follow_entries(&api, &url, &LogSelection::default(), &mut |line: &str, _: &Value| {
            tx.send(line.to_string()).map_err(|_| anyhow::anyhow!("no longer read"))
        });
        if let Err(e) = sent {
            let _ = tx.send(format!("{{\"stream\":\"event\",\"replica\":\"service\",\"time\":\"\",\"attempt\":0,\"restart\":0,\"text\":{}}}", Value::String(format!("cannot follow the job's output: {e:#}"))));
        }
    });
    rx
}

/// Prints `lines` (the job's log entries as the logs API gives them) as local-run prints
/// them, after clearing the progress line.
fn print_output(lines: impl Iterator<Item = String>, progress: &mut Progress, printed: &mut crate::local_run::Printed) {
    let entries: Vec<trainyard_server::logs::Entry> = lines.filter_map(|l| serde_json::from_str(&l).ok()).collect();
    if !entries.is_empty() {
        progress.clear();
        crate::local_run::print_entries(&entries, printed);
    }
}

/// Poll a job until it ends, with a progress line (and the job's output, from `output`);
/// returns the exit code for its end state and the ended job. A server that stops
/// answering for a while (a restart) is waited for; Ctrl-C stops waiting (exit 130) and
/// leaves the job alone.
fn wait_for(kind: &Kind, api: &Api, url: &str, name: &str, output: Option<std::sync::mpsc::Receiver<String>>) -> anyhow::Result<(u8, Value)> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_interrupt), SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handler only stores to an atomic.
    let _ = unsafe { sigaction(Signal::SIGINT, &action) };
    let id = name.rsplit('/').next().unwrap_or(name);
    let what = format!("{} {id}", kind.title);
    let mut progress = Progress::stderr("");
    let mut failing_since: Option<Instant> = None;
    let mut next_poll = Instant::now();
    let mut printed = crate::local_run::Printed::default();
    loop {
        if let Some(o) = &output {
            print_output(o.try_iter(), &mut progress, &mut printed);
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            progress.clear();
            eprintln!("Stopped waiting; {} [{name}] goes on. Cancel it with: trainyard {} cancel {id}", kind.title, kind.command);
            return Ok((130, Value::Null));
        }
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + Duration::from_millis(500);
            match api.try_send("GET", url, None) {
                Ok(v) => {
                    failing_since = None;
                    let state = v["state"].as_str().unwrap_or("").to_string();
                    if let Some(code) = progress::exit_code(&state) {
                        // The rest of the output: its stream ends with the job (10 s at
                        // most, for a server slow to say so).
                        if let Some(o) = &output {
                            let until = Instant::now() + Duration::from_secs(10);
                            while Instant::now() < until {
                                match o.recv_timeout(Duration::from_millis(100)) {
                                    Ok(line) => print_output(std::iter::once(line).chain(o.try_iter()), &mut progress, &mut printed),
                                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                                }
                            }
                        }
                        progress.clear();
                        eprintln!("{} [{name}] ended: {state} after {}.", kind.title, progress::duration(progress.elapsed()));
                        if let Some(msg) = v["error"]["message"].as_str() {
                            let (first, cut) = printed.shorten(msg);
                            eprintln!("{}", crate::local_run::error_line(v["error"]["code"].as_i64().unwrap_or(2), first, cut));
                        }
                        return Ok((code, v));
                    }
                    let reason = v["trainyardWaitingReason"].as_str().unwrap_or("");
                    let extra = [study_progress(&v), job_progress(&v)].into_iter().filter(|x| !x.is_empty()).collect::<Vec<_>>().join(", ");
                    progress.update(&what, &state, reason, &extra);
                }
                Err(e) if e.transient() => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(120) {
                        progress.clear();
                        return Err(e.into());
                    }
                    progress.update(&what, "server not answering, asking again", "", "");
                }
                Err(e) => {
                    progress.clear();
                    return Err(e.into());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A study's trials for the progress line: `trials 3/20 done, best accuracy 0.981`.
/// A running job's progress as its program reports it: `step 120/1000, 2.5 steps/s, ETA
/// 14:05:10`.
fn job_progress(v: &Value) -> String {
    let p = &v["trainyardProgress"];
    let Some(step) = p["step"].as_str() else { return String::new() };
    let mut s = match p["total"].as_str() {
        Some(t) => format!("step {step}/{t}"),
        None => format!("step {step}"),
    };
    if let Some(r) = p["stepsPerSecond"].as_f64() {
        s.push_str(&format!(", {} steps/s", short_number(r)));
    }
    if let Some(eta) = p["eta"].as_str() {
        s.push_str(&format!(", ETA {eta}"));
    }
    s
}

fn study_progress(v: &Value) -> String {
    let Some(trials) = v["trials"].as_array() else { return String::new() };
    let done = trials.iter().filter(|t| matches!(t["state"].as_str(), Some("SUCCEEDED" | "INFEASIBLE"))).count();
    let max = text(&v["maxTrialCount"]);
    let mut s = format!("trials {done}/{} done", if max.is_empty() { "?".into() } else { max });
    if let Some(b) = best_trial(v) {
        s.push_str(&format!(", best {} {}", b.metric, short_number(b.value)));
    }
    s
}

fn short_number(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// The best trial of a study for its goal.
struct Best<'a> {
    trial: &'a Value,
    metric: String,
    goal: String,
    value: f64,
}

/// The trial with the best final measurement of the study's first metric, for its goal
/// (`MAXIMIZE` unless `MINIMIZE`); trials without a final measurement do not count.
fn best_trial(study: &Value) -> Option<Best<'_>> {
    let metric = study["studySpec"]["metrics"][0]["metricId"].as_str().unwrap_or("").to_string();
    let goal = study["studySpec"]["metrics"][0]["goal"].as_str().unwrap_or("MAXIMIZE").to_string();
    let minimize = goal == "MINIMIZE" || goal == "2";
    let value_of = |t: &Value| -> Option<f64> {
        let ms = t["finalMeasurement"]["metrics"].as_array()?;
        let m = ms.iter().find(|m| m["metricId"].as_str() == Some(metric.as_str())).or_else(|| ms.first())?;
        m["value"].as_f64().or_else(|| m["value"].as_str().and_then(|s| s.parse().ok()))
    };
    let mut best: Option<(&Value, f64)> = None;
    for t in study["trials"].as_array().into_iter().flatten() {
        if t["state"].as_str() == Some("INFEASIBLE") {
            continue;
        }
        let Some(x) = value_of(t).filter(|x| x.is_finite()) else { continue };
        let better = match best {
            None => true,
            Some((_, b)) => (minimize && x < b) || (!minimize && x > b),
        };
        if better {
            best = Some((t, x));
        }
    }
    best.map(|(trial, value)| Best { trial, metric, goal, value })
}

/// The lines at the top of `hp-tuning-jobs describe`: the best trial, its parameters and
/// its final measurement.
fn best_trial_summary(study: &Value) -> Vec<String> {
    let trials = study["trials"].as_array().map_or(0, Vec::len);
    let Some(b) = best_trial(study) else {
        return vec![format!("Best trial: none yet ({trials} trials, none with a final measurement)")];
    };
    let t = b.trial;
    let mut lines = vec![format!(
        "Best trial: {} of {trials} ({} {}: {} = {} at step {})",
        text(&t["id"]),
        b.goal,
        b.metric,
        b.metric,
        short_number(b.value),
        text(&t["finalMeasurement"]["stepCount"]),
    )];
    for p in t["parameters"].as_array().into_iter().flatten() {
        // 3, not 3.0, for an integer parameter (the API shows every number as a double).
        let value = p["value"].as_f64().map_or_else(|| text(&p["value"]), |x| x.to_string());
        lines.push(format!("  {} = {}", text(&p["parameterId"]), value));
    }
    if let Some(j) = t["customJob"].as_str() {
        lines.push(format!("  CustomJob: {j}"));
    }
    lines
}

/// Follow one job's log (until the job ends), each line `PREFIX TIME WHO: TEXT`. A stream
/// cut before the job ended (its server restarted, or another server took over the store)
/// is asked for again from the time of the last entry shown, without showing an entry
/// twice; a server that stops answering is asked again for up to 2 minutes (one that
/// never answered is an error at once).
fn follow_log(api: &Api, job_url: &str, prefix: &str, sel: &LogSelection) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    follow_entries(api, job_url, sel, &mut |_, e| {
        let who = match e["stream"].as_str() {
            Some("event") => "trainyard".to_string(),
            _ => e["replica"].as_str().unwrap_or("?").to_string(),
        };
        let text = e["text"].as_str().unwrap_or("");
        let text = if e["stream"] == "event" { trainyard_server::logs::plain_text(text) } else { text };
        let mut out = stdout.lock();
        writeln!(out, "{prefix}{} {}: {}", e["time"].as_str().unwrap_or(""), who, text)?;
        out.flush()?;
        Ok(())
    })
}

/// Each entry of a job's log, given to `emit` (its line as the logs API sent it, and that
/// line read), following the log until the job ends; see [`follow_log`].
fn follow_entries(api: &Api, job_url: &str, sel: &LogSelection, emit: &mut dyn FnMut(&str, &Value) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let mut query = String::new();
    if let Some(r) = &sel.replica {
        query.push_str(&format!("&replica={}", encode(r)));
    }
    if let Some(a) = sel.attempt {
        query.push_str(&format!("&attempt={a}"));
    }
    // The last entry's time, and the entries of that time already shown.
    let mut last: Option<(String, HashSet<String>)> = None;
    let mut failing_since: Option<Instant> = None;
    let mut followed = false;
    loop {
        let mut url = format!("{job_url}/logs?follow=true{query}");
        match (&last, sel.tail, &sel.since) {
            (Some((t, _)), _, _) => url.push_str(&format!("&since={}", encode(t))),
            (None, tail, since) => {
                if let Some(n) = tail {
                    url.push_str(&format!("&tail={n}"));
                }
                if let Some(t) = since {
                    url.push_str(&format!("&since={}", encode(t)));
                }
            }
        }
        let cut = match api.request("GET", &url, None) {
            Ok(resp) => {
                failing_since = None;
                followed = true;
                new_entries(BufReader::new(resp.into_body().into_reader()), &mut last, emit)?
            }
            // A server that never answered is said at once, as by every command.
            Err(e) if e.transient() && followed => true,
            Err(e) => return Err(e.into()),
        };
        // The stream ends when the job does; one cut short is asked for again.
        if !cut {
            match api.try_send("GET", job_url, None) {
                Ok(v) if v["state"].as_str().is_some_and(|s| progress::exit_code(s).is_some()) => return Ok(()),
                Ok(_) => failing_since = None,
                Err(e) if e.transient() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("the log stream of {job_url} was cut and the server has not answered for 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A stream's entries to `emit`, skipping those given already (`last`); whether the stream
/// was cut (a read error) rather than ended.
fn new_entries(reader: impl BufRead, last: &mut Option<(String, HashSet<String>)>, emit: &mut dyn FnMut(&str, &Value) -> anyhow::Result<()>) -> anyhow::Result<bool> {
    for line in reader.lines() {
        let Ok(line) = line else { return Ok(true) };
        let e: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let time = e["time"].as_str().unwrap_or("").to_string();
        match last {
            Some((t, shown)) if *t == time => {
                if !shown.insert(line.clone()) {
                    continue;
                }
            }
            // Older than the last shown: sent again after a reconnection.
            Some((t, _)) if time.as_str() < t.as_str() => continue,
            _ => *last = Some((time.clone(), HashSet::from([line.clone()]))),
        }
        emit(&line, &e)?;
    }
    Ok(false)
}

pub fn run(cmd: JobCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        JobCommand::Create { target, display_name, worker_pool_specs, config, args, command, labels, paths, wait, format } => {
            let api = Api::new(target)?;
            let policy = PathPolicy::of(&api, paths);
            let body = build_job(display_name, &worker_pool_specs, config, &args, &command, &labels, &policy)?;
            let job = api.send("POST", &format!("{}/{}", api.base(), CUSTOM_JOBS.collection), Some(&body))?;
            created(&CUSTOM_JOBS, &api, job, wait, format.format)
        }
        JobCommand::List { target, limit, page_size, filter, format } => {
            list(&CUSTOM_JOBS, target, limit, page_size, filter, format.format)
        }
        JobCommand::Describe { target, job, format } => describe(&CUSTOM_JOBS, target, &job, format.format),
        JobCommand::Cancel { target, job } => cancel(&CUSTOM_JOBS, target, &job),
        JobCommand::Delete { target, job } => delete(&CUSTOM_JOBS, target, &job),
        JobCommand::Exec { target, job, replica, tty, no_tty, command } => {
            let api = Api::new(target)?;
            let url = api.resource_url(CUSTOM_JOBS.collection, &job)?;
            let choice = match (tty, no_tty) {
                (true, _) => crate::exec::TtyChoice::On,
                (_, true) => crate::exec::TtyChoice::Off,
                _ => crate::exec::TtyChoice::Auto,
            };
            crate::exec::run(&session_endpoint(&api)?, &url, replica.as_deref(), choice, &command)
        }
        JobCommand::PortForward { target, job, replica, address, ports } => {
            let api = Api::new(target)?;
            let url = api.resource_url(CUSTOM_JOBS.collection, &job)?;
            let (local, remote) = match ports.split_once(':') {
                Some((l, r)) => (l, r),
                None => (ports.as_str(), ports.as_str()),
            };
            let port = |p: &str, what: &str| p.parse::<u16>().with_context(|| format!("{ports:?}: the {what} port {p:?} is not a port (LOCAL:REMOTE, or one PORT for both)"));
            let (local, remote) = (port(local, "local")?, port(remote, "replica's")?);
            if remote == 0 {
                bail!("{ports:?}: the replica's port must be 1 to 65535");
            }
            crate::exec::port_forward(session_endpoint(&api)?, &url, replica.as_deref(), &address, local, remote)
        }
        JobCommand::StreamLogs { target, job, sel } => {
            let api = Api::new(target)?;
            let url = api.resource_url(CUSTOM_JOBS.collection, &job)?;
            follow_log(&api, &url, "", &sel)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Where sessions go (`exec`, `port-forward`), trusted and authorised as the client's
/// requests are, with its words for an error answer.
fn session_endpoint(api: &Api) -> anyhow::Result<crate::exec::Endpoint> {
    let roots = match api.ca_file() {
        Some(path) => Some(read_ca_file(path)?.iter().map(|c| c.der().to_vec()).collect()),
        None => None,
    };
    let words = api.clone();
    Ok(crate::exec::Endpoint {
        server: api.server().to_string(),
        token: api.token().map(str::to_string),
        roots,
        refusal: Box::new(move |code, body, url| words.status_error(code, body, url).to_string()),
    })
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

/// A query value or path segment: everything but RFC 3986's unreserved characters escaped.
fn encode(s: &str) -> String {
    const UNRESERVED: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
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

/// What to do with relative paths of a job's programs that name local files.
#[derive(Debug, Clone)]
enum PathPolicy {
    /// The server is on this host: make them absolute.
    Resolve,
    /// The server is elsewhere: refuse, naming the path.
    Refuse { server: String },
    /// `--keep-relative-paths`: send them as written.
    Keep,
}

impl PathPolicy {
    fn of(api: &Api, flags: PathFlags) -> PathPolicy {
        if flags.keep_relative_paths {
            PathPolicy::Keep
        } else if server_is_local(&api.t.server) {
            PathPolicy::Resolve
        } else {
            PathPolicy::Refuse { server: api.t.server.clone() }
        }
    }

    /// Apply to a CustomJob (or HyperparameterTuningJob) body whose relative paths are
    /// read against `dir`; `source` names where they were written.
    fn apply(&self, job: &mut Value, dir: &Path, source: &str) -> anyhow::Result<()> {
        match self {
            PathPolicy::Keep => Ok(()),
            PathPolicy::Resolve => {
                // The server is on this host: the paths are made absolute, and their
                // directory is asked for read-only in the job's containers (a server that
                // runs images sees it at the same path; one that runs host processes
                // needs nothing more).
                let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
                if !crate::jobfile::resolve_paths(job, &dir).is_empty() {
                    add_host_directory(job, Value::String(dir.display().to_string()));
                }
                Ok(())
            }
            PathPolicy::Refuse { server } => match crate::jobfile::local_paths(job, dir).first() {
                None => Ok(()),
                Some(p) => bail!(
                    "{source}: {} is the relative path {:?} ({} on this machine), but the server at {server} is not on this \
                     host and cannot read it. Give an absolute path that exists where the server runs, or run the program \
                     from a container image (containerSpec.imageUri) that has it and pass --keep-relative-paths.",
                    p.field,
                    p.written,
                    p.absolute.display()
                ),
            },
        }
    }
}

/// Adds `dir` to the job's `trainyardHostDirectories`, once.
fn add_host_directory(job: &mut Value, dir: Value) {
    match job.get_mut("trainyardHostDirectories").and_then(Value::as_array_mut) {
        Some(list) if list.contains(&dir) => {}
        Some(list) => list.push(dir),
        None => job["trainyardHostDirectories"] = Value::Array(vec![dir]),
    }
}

fn build_job(
    display_name: Option<String>,
    pools: &[String],
    config: Option<PathBuf>,
    args: &[String],
    command: &[String],
    labels: &[String],
    paths: &PathPolicy,
) -> anyhow::Result<Value> {
    let mut job = match &config {
        Some(p) => {
            let mut job = crate::jobfile::read(p, display_name.as_deref())?;
            // As local-run: the job file's relative paths are next to it.
            paths.apply(&mut job, &crate::jobfile::dir_of(p), &p.display().to_string())?;
            job
        }
        None => json!({ "displayName": display_name.clone().context("--display-name is required (or give --config)")?, "jobSpec": {} }),
    };
    if !pools.is_empty() {
        let specs: Vec<Value> = pools.iter().map(|p| parse_pool(p)).collect::<anyhow::Result<_>>()?;
        job["jobSpec"]["workerPoolSpecs"] = Value::Array(specs);
    }
    if job["jobSpec"]["workerPoolSpecs"].as_array().is_none_or(Vec::is_empty) {
        // A job file's own mistake (a misspelt key) first, by its line.
        if let Some(p) = &config {
            crate::jobfile::check(p, &job)?;
        }
        bail!(
            "a job needs at least one worker pool: give --worker-pool-spec=machine-type=n1-standard-4,replica-count=1,\
             container-image-uri=IMAGE (once per pool), or --config=job.yaml{}",
            config.as_ref().map(|p| format!(" with workerPoolSpecs ({} has none)", p.display())).unwrap_or_default()
        );
    }
    // The flags' relative paths are this directory's.
    let mut flags = json!({"jobSpec": {"workerPoolSpecs": [{"containerSpec": {"command": command, "args": args}}]}});
    paths.apply(&mut flags, &crate::cwd(), "--command/--args")?;
    for d in flags["trainyardHostDirectories"].as_array().cloned().unwrap_or_default() {
        add_host_directory(&mut job, d);
    }
    let command = flags["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"].clone();
    let args = flags["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"].clone();
    let (has_command, has_args) = (command.as_array().is_some_and(|a| !a.is_empty()), args.as_array().is_some_and(|a| !a.is_empty()));
    if let Some(list) = job["jobSpec"]["workerPoolSpecs"].as_array_mut() {
        for pool in list {
            if let Some(c) = pool.get_mut("containerSpec").and_then(Value::as_object_mut) {
                if has_command {
                    c.insert("command".into(), command.clone());
                }
                if has_args {
                    c.insert("args".into(), args.clone());
                }
            } else if let Some(p) = pool.get_mut("pythonPackageSpec").and_then(Value::as_object_mut) {
                if has_args {
                    p.insert("args".into(), args.clone());
                }
            }
        }
    }
    if !labels.is_empty() {
        job["labels"] = self::labels(labels)?;
    }
    // A job file's mistakes are told here, by file and line, before anything is sent.
    if let Some(p) = config.as_ref().filter(|_| pools.is_empty()) {
        crate::jobfile::check(p, &job)?;
    }
    Ok(job)
}

#[derive(Subcommand)]
pub enum NodeCommand {
    /// List the nodes, their state and what runs on them.
    List {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        format: ListFormat,
    },
    /// Show one node: capacity, allocation, GPUs and the replicas on it.
    Describe {
        #[command(flatten)]
        target: Target,
        /// Node name (as `nodes list` shows it).
        node: String,
        #[command(flatten)]
        format: ResourceFormat,
    },
    /// Drain a node: no new work; its replicas get SIGTERM and restart on other nodes (L9).
    Drain {
        #[command(flatten)]
        target: Target,
        /// Node name.
        node: String,
    },
    /// Let a drained node take work again.
    Undrain {
        #[command(flatten)]
        target: Target,
        /// Node name.
        node: String,
    },
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Limit, in use and queued demand per project and metric.
    List {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        format: ListFormat,
    },
    /// Read the quota limits again from the server's config file (no restart), and show
    /// them.
    Reload {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        format: ListFormat,
    },
}

fn gib(v: &Value) -> String {
    let b: f64 = v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_f64()).unwrap_or(0.0);
    format!("{:.1}", b / (1u64 << 30) as f64)
}

const NODE_COLUMNS: &[Column] = &[
    ("NAME", |n| text(&n["name"])),
    ("STATE", |n| text(&n["state"])),
    ("CPUS", |n| format!("{}/{}", text(&n["allocated"]["cpus"]), text(&n["cpus"]))),
    ("MEMORY_GIB", |n| format!("{}/{}", gib(&n["allocated"]["memoryBytes"]), gib(&n["memoryBytes"]))),
    ("ACCELERATORS", |n| {
        n["accelerators"].as_object().map(|m| m.iter().map(|(k, c)| format!("{k}:{c}")).collect::<Vec<_>>().join(",")).unwrap_or_default()
    }),
    ("REPLICAS", |n| n["replicas"].as_array().map_or(0, Vec::len).to_string()),
];

fn quota_cell(r: &Value, k: &str) -> String {
    match r[k].as_str() {
        Some(s) => s.to_string(),
        None if k == "limit" => "unlimited".into(),
        None => text(&r[k]),
    }
}

const QUOTA_COLUMNS: &[Column] = &[
    ("PROJECT", |r| quota_cell(r, "project")),
    ("REGION", |r| quota_cell(r, "region")),
    ("METRIC", |r| quota_cell(r, "metric")),
    ("LIMIT", |r| quota_cell(r, "limit")),
    ("IN_USE", |r| quota_cell(r, "inUse")),
    ("QUEUED", |r| quota_cell(r, "queued")),
    ("COHORT", |r| r["cohort"].as_str().unwrap_or("-").to_string()),
    ("BORROWED", |r| r["borrowed"].as_str().unwrap_or("-").to_string()),
    ("LENT", |r| r["lent"].as_str().unwrap_or("-").to_string()),
];

pub fn run_nodes(cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::List { target, format } => {
            let api = Api::new(target)?;
            let v = api.send("GET", &api.admin_url("nodes"), None)?;
            print_list(v["nodes"].as_array().map_or(&[][..], Vec::as_slice), NODE_COLUMNS, format.format)?;
        }
        NodeCommand::Describe { target, node, format } => {
            let api = Api::new(target)?;
            print_value(&api.send("GET", &api.admin_url(&format!("nodes/{}", encode(&node))), None)?, format.format)?;
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

/// `trainyard usage`: what each project's jobs reserved and used, like `sreport`.
#[derive(Args)]
pub struct UsageArgs {
    #[command(flatten)]
    target: Target,
    /// Hours from this time (RFC 3339, e.g. 2026-11-01T00:00:00Z; rounded down to its
    /// hour). Default: all that is stored.
    #[arg(long)]
    from: Option<String>,
    /// Hours before this time (RFC 3339). Default: now.
    #[arg(long)]
    to: Option<String>,
    /// Each hour's row instead of the totals per project and accelerator type.
    #[arg(long)]
    hourly: bool,
    #[command(flatten)]
    format: ListFormat,
}

const USAGE_COLUMNS: &[Column] = &[
    ("PROJECT", |r| text(&r["project"])),
    ("ACCELERATOR", |r| text(&r["acceleratorType"])),
    ("CPU_HOURS", |r| hours_cell(&r["cpuHours"])),
    ("GPU_HOURS", |r| hours_cell(&r["gpuHours"])),
    ("MEMORY_GB_HOURS", |r| hours_cell(&r["memoryGbHours"])),
    ("USED_CPU_HOURS", |r| hours_cell(&r["usedCpuHours"])),
    ("USED_MEMORY_GB_HOURS", |r| hours_cell(&r["usedMemoryGbHours"])),
    ("SUCCEEDED", |r| text(&r["jobsSucceeded"])),
    ("FAILED", |r| text(&r["jobsFailed"])),
    ("CANCELLED", |r| text(&r["jobsCancelled"])),
    ("PREEMPTIONS", |r| text(&r["preemptions"])),
    ("LOST_GPU_HOURS", |r| hours_cell(&r["lostGpuHours"])),
    ("GOODPUT", |r| if r["goodput"].is_null() { "-".into() } else { text(&r["goodput"]) }),
];

const USAGE_HOURLY_COLUMNS: &[Column] = &[
    ("PROJECT", |r| text(&r["project"])),
    ("HOUR", |r| text(&r["hour"])),
    ("CPU_HOURS", |r| hours_cell(&r["cpuHours"])),
    ("GPU_HOURS", |r| hours_cell(&r["gpuHours"])),
    ("MEMORY_GB_HOURS", |r| hours_cell(&r["memoryGbHours"])),
];

fn hours_cell(v: &Value) -> String {
    v.as_f64().map_or_else(|| text(v), |h| format!("{h:.3}"))
}

pub fn run_usage(args: UsageArgs) -> anyhow::Result<ExitCode> {
    // Only a project given on the command line (or TRAINYARD_PROJECT) narrows the report.
    let project = args.target.project.clone();
    let api = Api::new(args.target)?;
    let mut query: Vec<String> = Vec::new();
    for (k, v) in [("from", &args.from), ("to", &args.to), ("project", &project)] {
        if let Some(v) = v {
            query.push(format!("{k}={}", encode(v)));
        }
    }
    let mut url = api.admin_url("usage");
    if !query.is_empty() {
        url = format!("{url}?{}", query.join("&"));
    }
    let v = api.send("GET", &url, None)?;
    let (key, columns) = if args.hourly { ("series", USAGE_HOURLY_COLUMNS) } else { ("usage", USAGE_COLUMNS) };
    print_list(v[key].as_array().map_or(&[][..], Vec::as_slice), columns, args.format.format)?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_quotas(cmd: QuotaCommand) -> anyhow::Result<ExitCode> {
    let (target, format, reload) = match cmd {
        QuotaCommand::List { target, format } => (target, format.format, false),
        QuotaCommand::Reload { target, format } => (target, format.format, true),
    };
    let api = Api::new(target)?;
    let v = if reload {
        api.send("POST", &api.admin_url("quotas:reload"), Some(&json!({})))?
    } else {
        api.send("GET", &api.admin_url("quotas"), None)?
    };
    print_list(v["quotas"].as_array().map_or(&[][..], Vec::as_slice), QUOTA_COLUMNS, format)?;
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
        /// Display name of the tuning job.
        #[arg(long)]
        display_name: String,
        /// YAML: `studySpec:` and `trialJobSpec:` (and optionally the counts); relative paths
        /// in the trials' command and args are read against its directory.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// How many trials to run in all (else the file's maxTrialCount, else 1).
        #[arg(long, value_name = "N")]
        max_trial_count: Option<i64>,
        /// How many trials may run at once (else the file's parallelTrialCount, else 1).
        #[arg(long, value_name = "N")]
        parallel_trial_count: Option<i64>,
        /// How many trials may fail before the tuning job fails.
        #[arg(long, value_name = "N")]
        max_failed_trial_count: Option<i64>,
        /// Labels KEY=VALUE, comma-separated.
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
        #[command(flatten)]
        paths: PathFlags,
        #[command(flatten)]
        wait: WaitFlag,
        #[command(flatten)]
        format: CreatedFormat,
    },
    /// List HyperparameterTuningJobs, newest first.
    List {
        #[command(flatten)]
        target: Target,
        /// Filter expression, as the API takes it (e.g. 'display_name="tune"').
        #[arg(long)]
        filter: Option<String>,
        #[command(flatten)]
        format: ListFormat,
    },
    /// Show one HyperparameterTuningJob with its trials, its best trial first.
    Describe {
        #[command(flatten)]
        target: Target,
        /// Tuning job id (e.g. 3) or resource name (projects/P/locations/L/hyperparameterTuningJobs/3).
        job: String,
        #[command(flatten)]
        format: ResourceFormat,
    },
    /// Cancel a HyperparameterTuningJob and its running trials.
    Cancel {
        #[command(flatten)]
        target: Target,
        /// Tuning job id or resource name.
        job: String,
    },
    /// Delete an ended HyperparameterTuningJob (its trials' CustomJobs stay).
    Delete {
        #[command(flatten)]
        target: Target,
        /// Tuning job id or resource name.
        job: String,
    },
    /// Print the logs of the study's trial jobs, each line prefixed with its trial
    /// (`[trial 3]`), following them until the tuning job ends.
    StreamLogs {
        #[command(flatten)]
        target: Target,
        /// Tuning job id or resource name.
        job: String,
        /// Only this trial (its id, e.g. 3).
        #[arg(long)]
        trial: Option<String>,
        #[command(flatten)]
        sel: LogSelection,
    },
}

pub fn run_studies(cmd: StudyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        StudyCommand::Create {
            target,
            display_name,
            config,
            max_trial_count,
            parallel_trial_count,
            max_failed_trial_count,
            labels,
            paths,
            wait,
            format,
        } => {
            let api = Api::new(target)?;
            let text = std::fs::read_to_string(&config).with_context(|| format!("cannot read {}", config.display()))?;
            let mut job: Value =
                serde_norway::from_str(&text).with_context(|| format!("{} is not valid YAML", config.display()))?;
            if !job.is_object() {
                bail!("{}: expected a mapping with studySpec and trialJobSpec", config.display());
            }
            PathPolicy::of(&api, paths).apply(&mut job, &crate::jobfile::dir_of(&config), &config.display().to_string())?;
            job["displayName"] = Value::String(display_name);
            for (k, v) in [("maxTrialCount", max_trial_count), ("parallelTrialCount", parallel_trial_count), ("maxFailedTrialCount", max_failed_trial_count)] {
                if let Some(v) = v {
                    job[k] = json!(v);
                }
            }
            // As the known CLI: one trial, one at a time, unless the file or a flag says.
            for (k, snake) in [("maxTrialCount", "max_trial_count"), ("parallelTrialCount", "parallel_trial_count")] {
                if job.get(k).is_none() && job.get(snake).is_none() {
                    job[k] = json!(1);
                }
            }
            if !labels.is_empty() {
                job["labels"] = self::labels(&labels)?;
            }
            let resource = api.send("POST", &format!("{}/{}", api.base(), TUNING_JOBS.collection), Some(&job))?;
            created(&TUNING_JOBS, &api, resource, wait, format.format)
        }
        // One page of at most 1000, as this command (which has no --limit) has always listed.
        StudyCommand::List { target, filter, format } => list(&TUNING_JOBS, target, Some(1000), None, filter, format.format),
        StudyCommand::Describe { target, job, format } => describe(&TUNING_JOBS, target, &job, format.format),
        StudyCommand::Cancel { target, job } => cancel(&TUNING_JOBS, target, &job),
        StudyCommand::Delete { target, job } => delete(&TUNING_JOBS, target, &job),
        StudyCommand::StreamLogs { target, job, trial, sel } => stream_study_logs(target, &job, trial, sel),
    }
}

/// Follow the log of every trial's CustomJob as the trials come, until the study has ended
/// and every trial's log with it.
fn stream_study_logs(target: Target, job: &str, only: Option<String>, sel: LogSelection) -> anyhow::Result<ExitCode> {
    let api = Api::new(target)?;
    let url = api.resource_url(TUNING_JOBS.collection, job)?;
    let mut followed = HashSet::new();
    let mut followers = Vec::new();
    let mut failing_since: Option<Instant> = None;
    loop {
        let study = match api.try_send("GET", &url, None) {
            Ok(v) => {
                failing_since = None;
                v
            }
            // A server restarting: ask again for a while, the followers do the same.
            Err(e) if e.transient() && !followed.is_empty() => {
                if failing_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(120) {
                    return Err(e.into());
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for t in study["trials"].as_array().into_iter().flatten() {
            let id = text(&t["id"]);
            if only.as_ref().is_some_and(|o| *o != id) {
                continue;
            }
            let Some(job) = t["customJob"].as_str() else { continue };
            if !followed.insert(id.clone()) {
                continue;
            }
            let job_url = api.resource_url(CUSTOM_JOBS.collection, job)?;
            let prefix = format!("[trial {id}] ");
            // An ended trial's log is printed whole, here, in trial order; only trials
            // still running are followed side by side (their lines interleave as they come).
            let ended = !matches!(t["state"].as_str().unwrap_or(""), "ACTIVE" | "STOPPING" | "REQUESTED" | "");
            if ended {
                if let Err(e) = follow_log(&api, &job_url, &prefix, &sel) {
                    eprintln!("{prefix}cannot read the log of {job_url}: {e:#}");
                }
                continue;
            }
            let (api, sel) = (api.clone(), sel.clone());
            followers.push(std::thread::spawn(move || {
                if let Err(e) = follow_log(&api, &job_url, &prefix, &sel) {
                    eprintln!("{prefix}cannot follow the log of {job_url}: {e:#}");
                }
            }));
        }
        if progress::exit_code(study["state"].as_str().unwrap_or("")).is_some() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    for f in followers {
        let _ = f.join();
    }
    if let Some(o) = only.filter(|o| !followed.contains(o)) {
        bail!("the tuning job has no trial {o:?} with a CustomJob");
    }
    Ok(ExitCode::SUCCESS)
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
    fn build_job_without_a_pool_says_how_to_give_one() {
        let e = build_job(Some("x".into()), &[], None, &[], &[], &[], &PathPolicy::Keep).unwrap_err().to_string();
        assert!(e.contains("at least one worker pool") && e.contains("--worker-pool-spec=") && e.contains("--config"), "{e}");
    }

    /// `create --config` reads the file `local-run` reads: snake_case names are taken, and
    /// a misspelt key is named with its line (not "has no worker pool").
    #[test]
    fn build_job_reads_snake_case_files_and_names_a_misspelt_key() {
        let dir = tempfile::tempdir().unwrap();
        let snake = dir.path().join("snake.yaml");
        std::fs::write(&snake, "worker_pool_specs:\n  - machine_spec: {machine_type: n1-standard-4}\n    replica_count: 1\n    container_spec: {image_uri: x, command: [\"true\"]}\n").unwrap();
        let j = build_job(None, &[], Some(snake), &[], &[], &[], &PathPolicy::Keep).expect("a snake_case file");
        assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"], "n1-standard-4");
        let typo = dir.path().join("typo.yaml");
        std::fs::write(&typo, "workerPoolSpec:\n  - machineSpec: {machineType: n1-standard-4}\n").unwrap();
        let e = build_job(None, &[], Some(typo), &[], &[], &[], &PathPolicy::Keep).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("workerPoolSpec") && !e.contains("has none"), "{e}");
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
            &PathPolicy::Keep,
        )
        .unwrap();
        assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], json!(["python3", "t.py"]));
        assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"], json!(["--epochs", "3"]));
        assert_eq!(j["labels"]["team"], "nlp");
        let parsed = trainyard_api::parse_custom_job(j.to_string().as_bytes()).unwrap();
        trainyard_api::validate_custom_job(&parsed).unwrap();
    }

    #[test]
    fn local_servers() {
        for s in ["http://127.0.0.1:8080", "http://localhost:8080/", "http://[::1]:8080", "https://127.0.0.2", "http://LOCALHOST", "http://u@127.0.0.1:1"] {
            assert!(server_is_local(s), "{s}");
        }
        for s in ["http://10.0.0.1:8080", "http://trainyard.example.com", "http://[2001:db8::1]:80", "http://127.0.0.1.example.com"] {
            assert!(!server_is_local(s), "{s}");
        }
    }

    #[test]
    fn best_trial_follows_the_goal() {
        let mut study = json!({
            "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}]},
            "trials": [
                {"id": "1", "state": "SUCCEEDED", "parameters": [{"parameterId": "lr", "value": 0.1}],
                 "finalMeasurement": {"stepCount": "5", "metrics": [{"metricId": "loss", "value": 0.5}]}},
                {"id": "2", "state": "SUCCEEDED", "parameters": [{"parameterId": "lr", "value": 0.01}],
                 "finalMeasurement": {"stepCount": "5", "metrics": [{"metricId": "loss", "value": 0.2}]}},
                {"id": "3", "state": "ACTIVE"},
                {"id": "4", "state": "INFEASIBLE", "finalMeasurement": {"metrics": [{"metricId": "loss", "value": 0.0}]}}
            ]
        });
        assert_eq!(best_trial(&study).unwrap().trial["id"], "2");
        let lines = best_trial_summary(&study);
        assert!(lines[0].starts_with("Best trial: 2 of 4 (MINIMIZE loss: loss = 0.2 at step 5)"), "{lines:?}");
        assert_eq!(lines[1], "  lr = 0.01");
        study["studySpec"]["metrics"][0]["goal"] = json!("MAXIMIZE");
        assert_eq!(best_trial(&study).unwrap().trial["id"], "1");
        study["trials"] = json!([]);
        assert!(best_trial_summary(&study)[0].contains("none yet"));
    }
}
