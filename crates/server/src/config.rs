//! The server's configuration: a TOML file, or the built-in default for a laptop or one
//! workstation when there is no file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use trainyard_core::catalog::GIB;
use trainyard_core::schedule::{Fleet, Node, Quotas};
use trainyard_core::Settings;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: {key}: {message}")]
    Invalid { path: PathBuf, key: String, message: String },
}

/// The config file as written. Every table refuses keys it does not know.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    storage_root: Option<PathBuf>,
    /// Host directories (besides the storage root) where jobs may put outputs and read
    /// packages from.
    output_roots: Option<Vec<PathBuf>>,
    region: Option<String>,
    base_port: Option<u16>,
    tokens_file: Option<PathBuf>,
    #[serde(default)]
    lifecycle: Option<Settings>,
    node: Option<NodeFile>,
    /// Several nodes (virtual nodes on this host): capacity per node, exact.
    #[serde(default)]
    nodes: Vec<NodeFile>,
    /// Share CPU and memory instead of reserving them (default: true for the built-in
    /// single node, false once nodes are declared).
    overcommit: Option<bool>,
    /// Stop the virtual nodes' agents when the server shuts down cleanly (default: they
    /// keep running and the next start adopts them).
    stop_node_agents: Option<bool>,
    #[serde(default)]
    quotas: QuotasFile,
    /// `"local"` (default) or `"slurm"`.
    backend: Option<String>,
    slurm: Option<SlurmFile>,
    scheduler: Option<SchedulerFile>,
    /// Machine types added to (or replacing in) the built-in catalog.
    #[serde(default)]
    machine_types: Vec<MachineTypeFile>,
    /// `[http]`: limits of the API's connections.
    http: Option<HttpFile>,
    /// `[tls]`: the listener's certificate (see [`crate::tls`]).
    tls: Option<TlsFile>,
    /// `[limits]`: what one project may hold and ask.
    limits: Option<LimitsFile>,
    /// `[replicas]`: whom replicas run as, and their task limit.
    replicas: Option<ReplicasFile>,
    /// `[containers]`: how `imageUri` is run.
    containers: Option<ContainersFile>,
    /// Seconds between GPU health checks (nvidia-smi); 0: none.
    gpu_check_secs: Option<u64>,
    /// `[storage]`: the Cloud Storage endpoint.
    storage: Option<crate::storage::StorageFile>,
    /// `[metrics]`: the Prometheus endpoint.
    metrics: Option<MetricsFile>,
    /// `[fleet]`: keeping bad nodes out.
    fleet: Option<FleetFile>,
    /// `[log]`: the server log's format and the audit file.
    log: Option<LogFile>,
    /// `[store]`: where the control plane's state is kept.
    store: Option<StoreFile>,
    /// `[exec]`: commands and shells in running replicas (`custom-jobs exec`).
    exec: Option<ExecFile>,
}

/// `[exec]`: sessions in running replicas (see [`crate::exec`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecFile {
    /// A session with no input and no output for this long is ended.
    idle_timeout_secs: Option<u64>,
    /// Sessions of a project open at once.
    max_sessions_per_project: Option<u64>,
    /// Sessions open at once, all projects together (each is a process on this host).
    max_sessions: Option<u64>,
}

/// Sessions in running replicas (`[exec]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub idle_timeout: std::time::Duration,
    pub max_sessions_per_project: usize,
    pub max_sessions: usize,
}

impl Default for Exec {
    fn default() -> Self {
        Exec { idle_timeout: std::time::Duration::from_secs(1800), max_sessions_per_project: 16, max_sessions: 256 }
    }
}

/// `[store]`: `url` of a PostgreSQL database (`postgres://user:password@host:port/db`);
/// without it, SQLite in the data directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    url: Option<String>,
    /// Seconds a leader's lease lasts without renewal (several servers on PostgreSQL).
    lease_secs: Option<u64>,
    /// The URL other servers forward writes to this one at (its own, per server).
    advertise_url: Option<String>,
}

/// `[store] lease_secs` when not set: a follower takes over within this (plus a round)
/// after the leader is gone.
pub const DEFAULT_LEASE_SECS: u64 = 5;

/// Keys that are each server's own: servers on one store may differ in these (where they
/// listen and are reached, how they reach the store, their log), and must agree on every
/// other one.
pub const PER_SERVER_KEYS: &[&str] = &["listen", "store.url", "store.advertise_url", "log.", "tls."];

/// What to do about a server whose config is not its store's leader's.
pub const ONE_CONFIG: &str =
    "servers on one store run with one config (each server's own keys, listen, store.url, store.advertise_url, [log] and [tls], may differ)";

/// `[log]`: `format` (`"text"` or `"json"`), and `audit_file` for the audit lines (one per
/// mutating request) with its size before rotation and how many rotated files are kept.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogFile {
    format: Option<LogFormat>,
    audit_file: Option<PathBuf>,
    audit_max_bytes: Option<u64>,
    audit_keep: Option<u32>,
}

/// How the server writes its log lines (`[log] format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line per event for a person: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the fields.
    Json,
}

/// `[log]`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log {
    pub format: LogFormat,
    /// Audit lines go to this file (and no longer to the server log) when set.
    pub audit_file: Option<PathBuf>,
    /// The audit file is rotated (`audit.log` to `audit.log.1`...) before it would grow
    /// past this many bytes.
    pub audit_max_bytes: u64,
    /// Rotated audit files kept (`.1` newest to `.N` oldest); older ones are removed.
    pub audit_keep: u32,
}

pub const DEFAULT_AUDIT_MAX_BYTES: u64 = 64 << 20;
pub const DEFAULT_AUDIT_KEEP: u32 = 5;
/// The smallest `audit_max_bytes`: a few audit lines.
pub const MIN_AUDIT_MAX_BYTES: u64 = 4096;

impl Default for Log {
    fn default() -> Self {
        Log { format: LogFormat::Text, audit_file: None, audit_max_bytes: DEFAULT_AUDIT_MAX_BYTES, audit_keep: DEFAULT_AUDIT_KEEP }
    }
}

/// `[fleet]`: a node on which replicas of two or more jobs fail `quarantine_after_failures`
/// times within `quarantine_window_secs` is quarantined.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetFile {
    quarantine_after_failures: Option<u32>,
    quarantine_window_secs: Option<u64>,
}

/// `[fleet]`, resolved: failures that quarantine a node (0: never) and their window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quarantine {
    pub after_failures: u32,
    pub window_secs: u64,
}

impl Default for Quarantine {
    fn default() -> Self {
        Quarantine { after_failures: 3, window_secs: 3600 }
    }
}

/// `[metrics]`: whether the server counts at all (`/metrics` is 404 when it does not).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsFile {
    enabled: Option<bool>,
}

/// `[containers]`: the container engine.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainersFile {
    engine: Option<EngineSetting>,
    pull: Option<trainyard_backend::container::Pull>,
    /// How long a pull may go on failing before the run fails (seconds).
    pull_timeout_secs: Option<u64>,
    /// How long a pull may go on failing because the registry cannot be reached at all.
    offline_pull_timeout_secs: Option<u64>,
    /// A containers.conf for the engine (`CONTAINERS_CONF`).
    containers_conf: Option<PathBuf>,
    /// The OCI runtime (`podman --runtime`), e.g. "runc".
    runtime: Option<String>,
    /// The engine's program (default `podman`, from PATH).
    program: Option<PathBuf>,
    /// Host directories mounted into every container: "SRC:DST" or "SRC:DST:ro".
    #[serde(default)]
    mounts: Vec<String>,
}

/// `[containers] engine`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineSetting {
    /// No `engine` key: podman if it is installed and works, else host processes.
    #[default]
    Auto,
    /// Every replica in its image; a server without a working podman does not start.
    Podman,
    /// Replicas are host processes; `imageUri` is recorded and not run.
    None,
}

/// `[containers]`, resolved (the engine itself is probed at start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Containers {
    pub engine: EngineSetting,
    pub pull: trainyard_backend::container::Pull,
    /// `[containers] pull_timeout_secs` (default 600): a pull that has not succeeded by
    /// then fails the replica with a StartError.
    pub pull_timeout_secs: u64,
    /// `[containers] offline_pull_timeout_secs` (default 60, at most `pull_timeout_secs`):
    /// a registry that cannot be reached at all (offline, no such host) fails the replica
    /// by then, however long a slow pull may take.
    pub offline_pull_timeout_secs: u64,
    pub containers_conf: Option<PathBuf>,
    pub runtime: Option<String>,
    pub program: Option<PathBuf>,
    pub mounts: Vec<trainyard_backend::container::Mount>,
    /// The containers' working directory (`local-run`: the job file's directory, mounted);
    /// `None`: the image's WORKDIR.
    pub workdir: Option<String>,
}

impl Default for Containers {
    fn default() -> Containers {
        Containers {
            engine: EngineSetting::default(),
            pull: trainyard_backend::container::Pull::default(),
            pull_timeout_secs: trainyard_backend::container::DEFAULT_PULL_TIMEOUT_SECS,
            offline_pull_timeout_secs: trainyard_backend::container::DEFAULT_OFFLINE_PULL_TIMEOUT_SECS,
            containers_conf: None,
            runtime: None,
            program: None,
            mounts: Vec::new(),
            workdir: None,
        }
    }
}

/// `[replicas]`: the identity of replicas' programs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicasFile {
    /// Each project's replicas run as a user of its own (default: on when the server runs
    /// as root with the local backend).
    per_project_users: Option<bool>,
    /// The uids (and gids) given to projects, first and last.
    uid_range: Option<[u32; 2]>,
    /// Tasks (processes and threads) a replica may have.
    pids_max: Option<u64>,
    /// Serve tokens although replicas run as the server's user.
    insecure_shared_user: Option<bool>,
    /// `"host"` (default) or `"job"`: a network namespace of each job's own.
    network: Option<Network>,
    /// How long a `pythonPackageSpec` job's venv build may take (seconds).
    venv_build_timeout_secs: Option<u64>,
    /// The package index a job's venv build may use: a URL, or "none".
    package_index: Option<String>,
    /// The nice value of replicas' programs (0 to 19).
    nice: Option<i32>,
}

/// The network replicas run in (`[replicas] network`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// The host's network, as any process of the host.
    #[default]
    Host,
    /// A network namespace of the job's own on this host, with only a loopback interface,
    /// shared by the job's replicas: they reach each other (CLUSTER_SPEC) and nothing
    /// else, neither the server's API nor other jobs' ports nor the outside.
    Job,
}

/// Whom replicas run as (`[replicas]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Each project gets a uid (and a gid of the same number) from this range, assigned
    /// once and kept in the store; `None`: replicas run as the server's user.
    pub uid_range: Option<(u32, u32)>,
    pub pids_max: u64,
    pub insecure_shared_user: bool,
    pub network: Network,
    /// `[replicas] venv_build_timeout_secs` (default 900): a venv build that has not
    /// finished by then is killed and the replica fails, naming the packages and the limit.
    pub venv_build_timeout_secs: u64,
    /// `[replicas] package_index`: the index pip may use in a job's venv build
    /// (`PIP_INDEX_URL`); `"none"`: no index (`PIP_NO_INDEX`), only the job's packages and
    /// what the host's Python has; unset: pip's own configuration.
    pub package_index: Option<String>,
    /// `[replicas] nice` (default [`DEFAULT_REPLICA_NICE`]): the nice value of replicas'
    /// host programs, so that the control plane (the server, the shims starting other
    /// replicas) gets the CPU first when a tenant's program wants all of it.
    pub nice: i32,
}

/// `[replicas] nice` when not set.
pub const DEFAULT_REPLICA_NICE: i32 = 10;

/// `[replicas] venv_build_timeout_secs` when not set: 15 minutes.
pub const DEFAULT_VENV_BUILD_TIMEOUT_SECS: u64 = 900;

/// The first and last uid of the default range (0x70000000 and 100,000 more): far above
/// a host's accounts, above the subordinate ids `useradd` hands out (100000 up to
/// login.defs' SUB_UID_MAX, 600100000) that rootless podman maps containers into, above
/// systemd-nspawn's container ranges (up to 0x6FFFFFFF), and below the 2^31 of signed
/// interfaces. A start checks that no account or subordinate range overlaps it.
pub const DEFAULT_UID_RANGE: (u32, u32) = (1_879_048_192, 1_879_148_191);
/// Tasks per replica by default: room for data loaders and thread pools, not for a fork
/// bomb.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

/// `[tls]`: `cert_file` and `key_file` (PEM), or `auto = true`, and `names` for the
/// automatic certificate.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    auto: Option<bool>,
    #[serde(default)]
    names: Vec<String>,
    /// With `auto`: the loopback address whose port 443 serves the managed service's host
    /// names to jobs (`"off"`: none).
    jobs_address: Option<String>,
    /// With `cert_file`: the CA certificate(s) that `cert_file` chains to, which the jobs'
    /// clients are given to trust.
    ca_file: Option<PathBuf>,
}

/// `[limits]`: per-project limits, so that one tenant cannot degrade the server for others.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    /// Jobs of a project that have not ended (queued, pending, running, cancelling).
    max_live_jobs_per_project: Option<u64>,
    /// Mutating requests (create, cancel, delete) per second per project, and the burst.
    writes_per_second_per_project: Option<f64>,
    write_burst_per_project: Option<u64>,
    /// Connections counted for a project at once (the rest of `http.max_connections`
    /// stays for the others).
    max_connections_per_project: Option<u64>,
    /// `logs?follow=true` streams of a project open at once.
    max_log_streams_per_project: Option<u64>,
    /// Object uploads and downloads of a project streaming at once.
    max_storage_streams_per_project: Option<u64>,
}

/// Per-project limits (`[limits]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub max_live_jobs_per_project: usize,
    pub writes_per_second_per_project: f64,
    pub write_burst_per_project: f64,
    pub max_connections_per_project: usize,
    pub max_log_streams_per_project: usize,
    pub max_storage_streams_per_project: usize,
}

impl Limits {
    /// Each project's share of the server's connections and streams.
    pub fn shares(&self) -> std::sync::Arc<crate::shares::Shares> {
        crate::shares::Shares::new(
            self.max_connections_per_project,
            self.max_log_streams_per_project,
            self.max_storage_streams_per_project,
        )
    }
}

impl Default for Limits {
    fn default() -> Self {
        // Well above what a project's sweep or batch queue needs, well below what would
        // let one project take the server from the others: a quarter of the default
        // `http.max_connections` (1024) and of the server's storage streams (64).
        Limits {
            max_live_jobs_per_project: 10_000,
            writes_per_second_per_project: 200.0,
            write_burst_per_project: 1_000.0,
            max_connections_per_project: 256,
            max_log_streams_per_project: 64,
            max_storage_streams_per_project: 16,
        }
    }
}

/// `[http]`: how long a client may take, and how many may be connected at once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    /// A request head (request line and headers) must arrive within this time.
    header_timeout_secs: Option<u64>,
    /// A request body must arrive within this time of its head.
    body_timeout_secs: Option<u64>,
    /// A keep-alive connection with no request is closed after this time.
    idle_timeout_secs: Option<u64>,
    /// Connections served at once; more wait in the listen backlog.
    max_connections: Option<usize>,
    /// At shutdown, requests still running after this time (log streams) are cut.
    shutdown_grace_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineTypeFile {
    name: toml::Spanned<String>,
    vcpus: u32,
    memory_gb: f64,
    /// Accelerator type → the counts allowed with this machine type.
    #[serde(default)]
    accelerators: BTreeMap<String, Vec<u32>>,
    /// The machine type must be used with one of its accelerators (a2, a3, g2).
    #[serde(default)]
    accelerator_required: bool,
}

/// The most `[scheduler] max_reservations` may be: each reservation costs every
/// scheduling round a pass over the running jobs.
const MAX_RESERVATIONS_LIMIT: usize = 1024;

/// `[scheduler]`: how waiting work is ordered and placed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerFile {
    /// `"fair_share"` (default) or `"fifo"`.
    order: Option<trainyard_core::schedule::Order>,
    backfill: Option<bool>,
    preemption: Option<bool>,
    /// A job waiting this long goes ahead of the fair order; 0: never.
    starvation_secs: Option<u64>,
    /// At most this many jobs hold a reservation at once: EASY's head, then the oldest
    /// jobs past the starvation bound (1: EASY backfill's one).
    max_reservations: Option<usize>,
    /// A SPOT job is preempted only after it has run this long.
    spot_min_runtime_secs: Option<u64>,
    /// Fair-share weight per project (default 1).
    #[serde(default)]
    weights: BTreeMap<String, f64>,
    /// `[[scheduler.priority_classes]]`: name and value (higher first).
    #[serde(default)]
    priority_classes: Vec<PriorityClassFile>,
    /// The class of jobs that name none and whose project has none.
    default_priority_class: Option<String>,
    /// A job that cannot fit may preempt jobs of a lower priority class.
    priority_preemption: Option<bool>,
    /// A job is preempted for priority only after it has run this long.
    min_runtime_secs: Option<u64>,
    /// A job is preempted for priority at most this many times.
    max_preemptions_per_job: Option<u32>,
    /// Past that, a job on lent quota gives it back at its next checkpoint or after this long.
    reclaim_after_secs: Option<u64>,
    /// Fair share remembers past use with this half-life; 0: only what runs now.
    usage_half_life_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityClassFile {
    name: String,
    value: i64,
    /// The projects that may use the class; without the key, every project may.
    projects: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlurmFile {
    partition: Option<String>,
    gpu_partition: Option<String>,
    shim_program: Option<PathBuf>,
    squeue_interval_ms: Option<u64>,
    fit_to_nodes: Option<bool>,
}

/// Which execution engine runs the replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// Processes on this host under shims.
    #[default]
    Local,
    /// Slurm batch jobs (`[slurm]` table).
    Slurm(SlurmConfig),
}

/// The `[slurm]` table, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmConfig {
    /// Where jobs go (required; checked against `sinfo` at start).
    pub partition: String,
    pub gpu_partition: Option<String>,
    /// The `trainyard` binary the nodes run as `<shim_program> shim <run_dir>`; `None`:
    /// the running binary.
    pub shim_program: Option<PathBuf>,
    pub squeue_interval_ms: u64,
    pub fit_to_nodes: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: Option<toml::Spanned<String>>,
    /// The node is a machine of this type: its vCPUs, memory and accelerators by default.
    machine_type: Option<String>,
    cpus: Option<u32>,
    memory_gb: Option<f64>,
    #[serde(default)]
    accelerators: BTreeMap<String, u32>,
    overcommit: Option<bool>,
    /// The host's GPUs (UUIDs, as nvidia-smi lists them) that this node has; on the
    /// built-in single node: only these of the discovered GPUs.
    gpus: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotasFile {
    #[serde(default)]
    default: BTreeMap<String, QuotaValue>,
    #[serde(default)]
    projects: BTreeMap<String, BTreeMap<String, QuotaValue>>,
    /// `[[quotas.cohorts]]`: projects that lend each other unused quota.
    #[serde(default)]
    cohorts: Vec<CohortFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CohortFile {
    name: String,
    projects: Vec<String>,
}

/// `[quotas.projects.P.borrowing_limit]`: per metric, the most the project may run above
/// its quota on what its cohort lends.
pub const BORROWING_LIMIT: &str = "borrowing_limit";
/// `[quotas.projects.P.lending_limit]`: per metric, the most of its quota it lends.
pub const LENDING_LIMIT: &str = "lending_limit";

/// A quota's value: a count (`custom_model_training_*`), or GiB (`storage_gb`, which may
/// have a fraction).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum QuotaValue {
    Count(u64),
    Gb(f64),
    /// `priority_class`: the project's default class.
    Name(String),
    /// `borrowing_limit`, `lending_limit`: per metric.
    Limits(BTreeMap<String, toml::Value>),
}

/// A project's default priority class (`[quotas.projects.P] priority_class`).
pub const PROJECT_PRIORITY_CLASS: &str = "priority_class";

/// The quota of a project's Cloud Storage namespace (`[quotas.default] storage_gb`,
/// `[quotas.projects.P] storage_gb`).
pub const STORAGE_QUOTA: &str = "storage_gb";

/// Per-project limits of stored bytes (`storage_gb`), kept by the storage's accounting
/// (which the config names, never the other way round).
pub use crate::storage::usage::StorageLimits;

impl QuotasFile {
    /// The counted quotas (for the scheduler) and the storage limits.
    fn split(&self) -> (Quotas, StorageLimits) {
        let counts = |m: &BTreeMap<String, QuotaValue>| -> BTreeMap<String, u64> {
            m.iter()
                .filter(|(k, _)| k.as_str() != STORAGE_QUOTA)
                .filter_map(|(k, v)| match v {
                    QuotaValue::Count(n) => Some((k.clone(), *n)),
                    QuotaValue::Gb(_) | QuotaValue::Name(_) | QuotaValue::Limits(_) => None,
                })
                .collect()
        };
        // Checked at load: whole numbers, 0 or more.
        let limits = |key: &str| -> BTreeMap<String, BTreeMap<String, u64>> {
            self.projects
                .iter()
                .filter_map(|(p, m)| match m.get(key) {
                    Some(QuotaValue::Limits(l)) => Some((
                        p.clone(),
                        l.iter().filter_map(|(k, v)| Some((k.clone(), u64::try_from(v.as_integer()?).ok()?))).collect(),
                    )),
                    _ => None,
                })
                .collect()
        };
        let bytes = |m: &BTreeMap<String, QuotaValue>| -> Option<u64> {
            m.get(STORAGE_QUOTA).map(|v| match v {
                QuotaValue::Count(n) => n.saturating_mul(trainyard_core::catalog::GIB),
                QuotaValue::Gb(g) => (g * trainyard_core::catalog::GIB as f64) as u64,
                QuotaValue::Name(_) | QuotaValue::Limits(_) => 0,
            })
        };
        let quotas = Quotas {
            default: counts(&self.default),
            projects: self.projects.iter().map(|(p, m)| (p.clone(), counts(m))).collect(),
            cohorts: self
                .cohorts
                .iter()
                .map(|c| trainyard_core::schedule::Cohort { name: c.name.clone(), projects: c.projects.clone() })
                .collect(),
            borrowing_limits: limits(BORROWING_LIMIT),
            lending_limits: limits(LENDING_LIMIT),
        };
        let storage = StorageLimits {
            default: bytes(&self.default),
            projects: self.projects.iter().filter_map(|(p, m)| bytes(m).map(|b| (p.clone(), b))).collect(),
        };
        (quotas, storage)
    }
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the API listens; empty when nothing is served (`local-run`), and then
    /// replicas are given no storage endpoint.
    pub listen: String,
    pub data_dir: PathBuf,
    /// A project's `gs://bucket/x` maps to `<storage_root>/<project>/bucket/x`.
    pub storage_root: PathBuf,
    /// Host directories besides the storage root where jobs may write outputs and read
    /// packages (`output_roots`; none by default). Never the data directory, inside it or
    /// above it, nor overlapping the storage root (checked at load).
    pub output_roots: Vec<PathBuf>,
    pub region: String,
    /// First port of the replica addresses (L8).
    pub base_port: u16,
    /// Bearer tokens and the projects they may use; None: open, loopback only.
    pub tokens_file: Option<PathBuf>,
    pub settings: Settings,
    /// The machine-type catalog: built in, plus the file's `[[machine_types]]`.
    pub catalog: trainyard_core::catalog::Catalog,
    pub scheduler: trainyard_core::schedule::SchedulerConfig,
    pub fleet: Fleet,
    pub quotas: Quotas,
    /// `[[scheduler.priority_classes]]`, `[scheduler] default_priority_class` and the
    /// projects' `priority_class` (read again with the quotas).
    pub priority_classes: trainyard_core::schedule::PriorityClasses,
    /// `storage_gb` of the quotas tables.
    pub storage_limits: StorageLimits,
    /// Where this configuration came from, for the start-up message.
    pub source: String,
    /// The file it was read from (quotas can be read again from it at run time).
    pub path: Option<PathBuf>,
    /// Declared virtual nodes each get an agent process; its death is the node's loss (L9).
    pub node_agents: bool,
    /// `[fleet]`: when a node is quarantined.
    pub quarantine: Quarantine,
    /// Stop the agents at a clean shutdown instead of leaving them for the next start.
    pub stop_node_agents: bool,
    /// Limits of the API's connections (`[http]`).
    pub http: crate::listen::Limits,
    /// The listener's TLS (`[tls]`; off by default).
    pub tls: crate::tls::TlsSettings,
    /// Where jobs reach the managed service's host names (`[tls] jobs_address`, port
    /// 443), once `serve` listens there; None: jobs get the endpoint variables only.
    pub jobs_endpoint: Option<std::net::SocketAddr>,
    /// Per-project limits (`[limits]`).
    pub limits: Limits,
    /// Sessions in running replicas (`[exec]`).
    pub exec: Exec,
    pub backend: BackendChoice,
    /// Whom replicas run as (`[replicas]`).
    pub replicas: Replicas,
    /// How images are run (`[containers]`).
    pub containers: Containers,
    /// Nodes' GPUs by UUID (`gpus = [...]`), to be found by discovery at start.
    pub node_gpus: BTreeMap<String, Vec<String>>,
    /// Seconds between GPU health checks; 0: none.
    pub gpu_check_secs: u64,
    /// The Cloud Storage endpoint (`[storage]`).
    pub storage: crate::storage::StorageConfig,
    /// `[metrics] enabled` (default true).
    pub metrics_enabled: bool,
    /// `[log]`: the log's format and the audit file.
    pub log: Log,
    /// `[store] url` (or `TRAINYARD_STORE_URL`): a PostgreSQL store; None: SQLite in the
    /// data directory.
    pub store: Option<trainyard_store::Location>,
    /// `[store] lease_secs`: how long the leader's lease lasts without renewal.
    pub lease_secs: u64,
    /// `[store] advertise_url` (or `--advertise-url`): where other servers reach this
    /// one's API; None: `http://` and the listen address.
    pub advertise_url: Option<String>,
    /// The config file's keys and values (`key = value`, sorted), for servers on one
    /// store to compare ([`Config::agreed`]).
    pub file_keys: std::collections::BTreeMap<String, String>,
}

/// A TOML value's leaves as `a.b.c = value` (arrays whole, as written by `toml`).
fn flatten(prefix: &str, v: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// `[store] advertise_url`: an `http://host:port` URL (no path: the API's own paths are
/// added to it).
pub fn check_advertise_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?} is not an http:// URL such as http://10.0.0.5:8080"))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) || !host.contains(':') {
        return Err(format!("{url:?} is not a URL of a host and port such as http://10.0.0.5:8080"));
    }
    Ok(())
}

impl Config {
    /// What servers on one store must agree on, as `key = value` lines: the config file's
    /// keys (but each server's own, [`PER_SERVER_KEYS`]) and the data directory and
    /// tokens file, which servers share by path.
    pub fn agreed(&self) -> String {
        let mut keys = self.file_keys.clone();
        keys.retain(|k, _| !PER_SERVER_KEYS.iter().any(|p| if p.ends_with('.') { k.starts_with(p) } else { k == p }));
        keys.insert("data_dir".into(), format!("{:?}", self.data_dir.display().to_string()));
        keys.insert("tokens_file".into(), format!("{:?}", self.tokens_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default()));
        if self.backend == BackendChoice::Local {
            // The local backend's replicas are this host's processes, stopped by signals:
            // its servers share the host (across hosts, Slurm's replicas are anyone's).
            keys.insert("host (the local backend's)".into(), format!("{:?}", this_host()));
        }
        keys.iter().map(|(k, v)| format!("{k} = {v}\n")).collect()
    }

    /// Where other servers reach this one's API.
    pub fn advertised(&self) -> String {
        self.advertise_url.clone().unwrap_or_else(|| format!("http://{}", self.listen)).trim_end_matches('/').to_string()
    }
}

/// This host's name (empty if it cannot be read).
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// The keys whose values differ between two [`Config::agreed`] texts, each with both.
pub fn differing_keys(ours: &str, theirs: &str) -> Vec<String> {
    let parse = |t: &str| -> std::collections::BTreeMap<String, String> {
        t.lines().filter_map(|l| l.split_once(" = ")).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let (a, b) = (parse(ours), parse(theirs));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(not set)".into());
            format!("{k} (here {}, the leader's {})", show(a.get(k)), show(b.get(k)))
        })
        .collect()
}

fn host_cpus() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 * GIB)
}

/// `SRC:DST` or `SRC:DST:ro`: absolute paths without `..`, a mount for every container.
pub fn parse_mount(text: &str) -> Result<trainyard_backend::container::Mount, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let (src, dst, ro) = match parts.as_slice() {
        [s, d] => (*s, *d, false),
        [s, d, "ro"] => (*s, *d, true),
        [_, _, o] => return Err(format!("unknown option {o:?} (only \"ro\")")),
        _ => return Err("must be \"SRC:DST\" or \"SRC:DST:ro\"".into()),
    };
    for p in [src, dst] {
        if !p.starts_with('/') || p.split('/').any(|c| c == "..") || p.contains(',') || p.contains('\0') {
            return Err(format!("{p:?} must be an absolute path without \"..\" or \",\""));
        }
    }
    if dst == "/" || dst == "/gcs" || dst.starts_with("/gcs/") {
        return Err(format!("{dst:?} is taken (/ and /gcs are the image's and the project's buckets)"));
    }
    Ok(trainyard_backend::container::Mount { source: PathBuf::from(src), target: dst.to_string(), read_only: ro })
}

pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TRAINYARD_DATA_DIR") {
        return PathBuf::from(d);
    }
    // A root server's replicas run as per-project users, who must pass through the
    // directories above the data directory: not below /root.
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/trainyard");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/trainyard"),
        None => PathBuf::from("trainyard-data"),
    }
}

impl Config {
    /// Where the control plane's state is: `[store] url`, else `trainyard.db` in the data
    /// directory.
    pub fn store_location(&self) -> trainyard_store::Location {
        self.store.clone().unwrap_or_else(|| trainyard_store::Location::Sqlite(self.data_dir.join(trainyard_store::backup::DB_FILE)))
    }

    /// The built-in default: this host as one node that overcommits (CPU time-shared,
    /// memory limits as caps, missing accelerators tolerated with a warning), no quota
    /// limits, region us-central1.
    pub fn builtin(data_dir: Option<PathBuf>) -> Config {
        Config::from_file(File::default(), data_dir, "built-in defaults".into())
    }

    /// Read a config file; errors name the file, the line and the key.
    pub fn load(path: &Path, data_dir: Option<PathBuf>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let file: File = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: describe_toml_error(&text, &e),
        })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: path.to_owned(), key: key.into(), message };
        let mut mt_seen: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        for (i, m) in file.machine_types.iter().enumerate() {
            let line = text[..m.name.span().start.min(text.len())].matches('\n').count() + 1;
            let key = format!("machine_types[{i}]");
            let name = m.name.get_ref();
            if name.is_empty() {
                return Err(invalid(&format!("{key}.name"), format!("must not be empty (line {line})")));
            }
            if let Some(first) = mt_seen.insert(name.clone(), line) {
                return Err(invalid(&format!("{key}.name"), format!("machine type \"{name}\" is listed twice (lines {first} and {line})")));
            }
            if m.vcpus == 0 {
                return Err(invalid(&format!("{key}.vcpus"), format!("must be at least 1 (line {line})")));
            }
            if !(m.memory_gb.is_finite() && m.memory_gb > 0.0) {
                return Err(invalid(&format!("{key}.memory_gb"), format!("must be positive, not {} (line {line})", m.memory_gb)));
            }
            for (a, counts) in &m.accelerators {
                if counts.is_empty() || counts.contains(&0) {
                    return Err(invalid(&format!("{key}.accelerators.{a}"), format!("must list counts of at least 1 (line {line})")));
                }
            }
        }
        if let Some(c) = &file.containers {
            for (i, m) in c.mounts.iter().enumerate() {
                if let Err(why) = parse_mount(m) {
                    return Err(invalid(&format!("containers.mounts[{i}]"), format!("{m:?}: {why}")));
                }
            }
            if let Some(conf) = &c.containers_conf {
                if !conf.is_file() {
                    return Err(invalid("containers.containers_conf", format!("{} is not a file", conf.display())));
                }
            }
            if c.runtime.as_deref().is_some_and(|r| r.is_empty() || r.contains(char::is_whitespace)) {
                return Err(invalid("containers.runtime", "must name one OCI runtime, e.g. \"runc\"".into()));
            }
        }
        if let Some(url) = file.store.as_ref().and_then(|s| s.url.as_deref()) {
            if let Err(why) = trainyard_store::Location::from_url(url) {
                return Err(invalid("store.url", why));
            }
        }
        if file.store.as_ref().and_then(|s| s.lease_secs).is_some_and(|n| !(2..=600).contains(&n)) {
            return Err(invalid("store.lease_secs", "must be 2 to 600 seconds".into()));
        }
        if let Some(a) = file.store.as_ref().and_then(|s| s.advertise_url.as_deref()) {
            check_advertise_url(a).map_err(|why| invalid("store.advertise_url", why))?;
        }
        if let Some(l) = &file.log {
            if let Some(a) = &l.audit_file {
                if !a.is_absolute() || a.file_name().is_none() || a.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                    return Err(invalid("log.audit_file", format!("must be the absolute path of a file without \"..\", not {}", a.display())));
                }
            }
            if l.audit_max_bytes.is_some_and(|b| b < MIN_AUDIT_MAX_BYTES) {
                return Err(invalid("log.audit_max_bytes", format!("must be at least {MIN_AUDIT_MAX_BYTES}")));
            }
            if l.audit_keep == Some(0) {
                return Err(invalid("log.audit_keep", "must be at least 1 (the file is rotated, never truncated)".into()));
            }
        }
        let catalog = catalog_of(&file);
        let nodes_with_type = file.node.iter().map(|n| ("node".to_string(), n)).chain(file.nodes.iter().enumerate().map(|(i, n)| (format!("nodes[{i}]"), n)));
        for (key, n) in nodes_with_type {
            let Some(mt) = &n.machine_type else { continue };
            let Some(m) = catalog.get(mt) else {
                return Err(invalid(&format!("{key}.machine_type"), format!("\"{mt}\" is not in the machine-type catalog")));
            };
            for (a, c) in &n.accelerators {
                let allowed = m.accelerators.get(a).cloned().unwrap_or_default();
                if !allowed.contains(c) {
                    return Err(invalid(
                        &format!("{key}.accelerators.{a}"),
                        format!("{c} is not allowed with machine type \"{mt}\" (allowed: {allowed:?})"),
                    ));
                }
            }
        }
        if file.node.is_some() && !file.nodes.is_empty() {
            return Err(invalid("node", "declare either one [node] or a list of [[nodes]], not both".into()));
        }
        let line_of = |pos: usize| text[..pos.min(text.len())].matches('\n').count() + 1;
        let mut seen: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        let single = file.node.iter().map(|n| ("node".to_string(), n));
        let many = file.nodes.iter().enumerate().map(|(i, n)| (format!("nodes[{i}]"), n));
        for (key, n) in single.chain(many) {
            let at = n.name.as_ref().map(|s| format!(" (line {})", line_of(s.span().start))).unwrap_or_default();
            if n.cpus == Some(0) {
                return Err(invalid(&format!("{key}.cpus"), format!("must be at least 1{at}")));
            }
            if let Some(m) = n.memory_gb {
                if m.is_nan() || m <= 0.0 {
                    return Err(invalid(&format!("{key}.memory_gb"), format!("must be positive, not {m}{at}")));
                }
            }
            for (a, c) in &n.accelerators {
                if *c == 0 {
                    return Err(invalid(&format!("{key}.accelerators.{a}"), format!("must be at least 1{at}")));
                }
                if !a.starts_with("NVIDIA_") && !a.starts_with("TPU_") {
                    return Err(invalid(&format!("{key}.accelerators.{a}"), format!("is not an accelerator type{at}")));
                }
            }
            if key != "node" {
                let Some(name) = &n.name else { return Err(invalid(&key, "needs a name".into())) };
                if name.get_ref().is_empty() {
                    return Err(invalid(&format!("{key}.name"), format!("must not be empty{at}")));
                }
                if let Some(first) = seen.insert(name.get_ref().clone(), line_of(name.span().start)) {
                    return Err(invalid(
                        &format!("{key}.name"),
                        format!("node \"{}\" is listed twice (lines {first} and {})", name.get_ref(), line_of(name.span().start)),
                    ));
                }
                if n.machine_type.is_none() && (n.cpus.is_none() || n.memory_gb.is_none()) {
                    return Err(invalid(&key, format!("needs cpus and memory_gb, or a machine_type{at}")));
                }
            }
        }
        let mut class_names: Vec<&str> = Vec::new();
        if let Some(sc) = &file.scheduler {
            match sc.max_reservations {
                Some(0) => {
                    return Err(invalid(
                        "scheduler.max_reservations",
                        "must be at least 1: the first job that does not fit always holds a reservation (1 is EASY backfill)".into(),
                    ))
                }
                Some(n) if n > MAX_RESERVATIONS_LIMIT => {
                    return Err(invalid(
                        "scheduler.max_reservations",
                        format!(
                            "must be at most {MAX_RESERVATIONS_LIMIT}, not {n}: each reservation costs the scheduling round a pass over the running jobs"
                        ),
                    ))
                }
                _ => {}
            }
            for (p, w) in &sc.weights {
                if !(w.is_finite() && *w > 0.0) {
                    return Err(invalid(&format!("scheduler.weights.{p}"), format!("must be a positive number, not {w}")));
                }
            }
            for c in &sc.priority_classes {
                // A label value carries it: lowercase letters, digits, - and _.
                let ok = !c.name.is_empty()
                    && c.name.len() <= 63
                    && c.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
                if !ok {
                    return Err(invalid(
                        "scheduler.priority_classes.name",
                        format!("{:?} must be 1 to 63 lowercase letters, digits, - or _ (a label's value names it)", c.name),
                    ));
                }
                if class_names.contains(&c.name.as_str()) {
                    return Err(invalid("scheduler.priority_classes.name", format!("{:?} is listed twice", c.name)));
                }
                if let Some(ps) = &c.projects {
                    if let Some(bad) = ps.iter().find(|p| p.is_empty() || p.contains('/')) {
                        return Err(invalid(
                            "scheduler.priority_classes.projects",
                            format!("class {:?}: {bad:?} is not a project id (a non-empty name without /)", c.name),
                        ));
                    }
                }
                class_names.push(&c.name);
            }
            if let Some(d) = &sc.default_priority_class {
                if !class_names.contains(&d.as_str()) {
                    return Err(invalid("scheduler.default_priority_class", trainyard_core::schedule::unknown_priority_class(d, &class_names)));
                }
                if sc.priority_classes.iter().any(|c| &c.name == d && c.projects.is_some()) {
                    return Err(invalid(
                        "scheduler.default_priority_class",
                        format!("{d:?} is open only to the projects of its `projects` key; the default class is every project's, so it must be open to all"),
                    ));
                }
            }
        }
        if let Some(l) = &file.lifecycle {
            for (i, r) in l.failure_rules.iter().enumerate() {
                if let Err(m) = r.check() {
                    return Err(invalid(&format!("lifecycle.failure_rules[{i}]"), m));
                }
            }
            if trainyard_core::job::warning_signal(&l.timeout_warning_signal).is_none() {
                return Err(invalid(
                    "lifecycle.timeout_warning_signal",
                    format!("{:?} is not SIGUSR1 or SIGUSR2 (the signals a replica's supervisor passes on)", l.timeout_warning_signal),
                ));
            }
        }
        let mut in_cohort: BTreeMap<&str, &str> = BTreeMap::new();
        for (i, c) in file.quotas.cohorts.iter().enumerate() {
            let key = format!("quotas.cohorts[{i}]");
            if c.name.is_empty() {
                return Err(invalid(&format!("{key}.name"), "must not be empty".into()));
            }
            if file.quotas.cohorts[..i].iter().any(|o| o.name == c.name) {
                return Err(invalid(&format!("{key}.name"), format!("{:?} is listed twice", c.name)));
            }
            for p in &c.projects {
                if !file.quotas.projects.contains_key(p) {
                    return Err(invalid(
                        &format!("{key}.projects"),
                        format!("{p:?} is not a project with a quota table ([quotas.projects.{p}])"),
                    ));
                }
                if let Some(other) = in_cohort.insert(p, &c.name) {
                    return Err(invalid(&format!("{key}.projects"), format!("{p:?} is in cohorts {other:?} and {:?}; a project is in one", c.name)));
                }
            }
        }
        for (project, limits) in std::iter::once(("default".to_string(), &file.quotas.default))
            .chain(file.quotas.projects.iter().map(|(p, l)| (format!("projects.{p}"), l)))
        {
            for (metric, value) in limits.iter() {
                let key = format!("quotas.{project}.{metric}");
                match (metric.as_str(), value) {
                    (PROJECT_PRIORITY_CLASS, QuotaValue::Name(n)) if project != "default" => {
                        if !class_names.contains(&n.as_str()) {
                            return Err(invalid(&key, trainyard_core::schedule::unknown_priority_class(n, &class_names)));
                        }
                        let name = project.trim_start_matches("projects.");
                        let closed = file.scheduler.iter().flat_map(|s| &s.priority_classes).find(|c| &c.name == n).and_then(|c| c.projects.as_ref());
                        if closed.is_some_and(|ps| !ps.iter().any(|p| p == name)) {
                            return Err(invalid(
                                &key,
                                format!("project {name:?} may not use the priority class {n:?}: it is not in that class's projects ([[scheduler.priority_classes]] projects)"),
                            ));
                        }
                    }
                    (PROJECT_PRIORITY_CLASS, _) if project == "default" => {
                        return Err(invalid(&key, "goes in [quotas.projects.P]; the default is [scheduler] default_priority_class".into()));
                    }
                    (PROJECT_PRIORITY_CLASS, _) => {
                        return Err(invalid(&key, "must be the name of a priority class (a string)".into()));
                    }
                    (BORROWING_LIMIT | LENDING_LIMIT, QuotaValue::Limits(l)) if project != "default" => {
                        let name = project.trim_start_matches("projects.");
                        if !file.quotas.cohorts.iter().any(|c| c.projects.iter().any(|p| p == name)) {
                            return Err(invalid(&key, format!("applies to a project of a cohort, and {name} is in none ([[quotas.cohorts]])")));
                        }
                        for (m, v) in l {
                            let key = format!("{key}.{m}");
                            if !m.starts_with("custom_model_training_") {
                                return Err(invalid(&key, "is not a quota metric (custom_model_training_cpus, custom_model_training_nvidia_t4_gpus, ...)".into()));
                            }
                            if v.as_integer().is_none_or(|n| n < 0) {
                                return Err(invalid(&key, format!("must be a whole number, 0 or more, not {v}")));
                            }
                        }
                    }
                    (BORROWING_LIMIT | LENDING_LIMIT, _) if project == "default" => {
                        return Err(invalid(&key, "goes in [quotas.projects.P] of a project in a cohort".into()));
                    }
                    (BORROWING_LIMIT | LENDING_LIMIT, _) => {
                        return Err(invalid(&key, "must be a table of quota metrics and whole numbers".into()));
                    }
                    (_, QuotaValue::Limits(_)) => {
                        return Err(invalid(&key, "must be a number, not a table".into()));
                    }
                    (_, QuotaValue::Name(n)) => {
                        return Err(invalid(&key, format!("must be a number, not {n:?}")));
                    }
                    (STORAGE_QUOTA, QuotaValue::Gb(g)) if !(g.is_finite() && *g >= 0.0) => {
                        return Err(invalid(&key, format!("must be a number of GiB, 0 or more, not {g}")));
                    }
                    (STORAGE_QUOTA, _) => {}
                    (m, QuotaValue::Gb(g)) if m.starts_with("custom_model_training_") => {
                        return Err(invalid(&key, format!("must be a whole number, 0 or more, not {g}")));
                    }
                    (m, _) if m.starts_with("custom_model_training_") => {}
                    _ => {
                        return Err(invalid(
                            &key,
                            "is not a quota metric (custom_model_training_cpus, custom_model_training_nvidia_t4_gpus, ..., \
                             storage_gb)"
                                .into(),
                        ));
                    }
                }
            }
        }
        if let Some(r) = &file.region {
            if r.is_empty() {
                return Err(invalid("region", "must not be empty".into()));
            }
        }
        match file.backend.as_deref() {
            None | Some("local") => {}
            Some("slurm") => {
                let Some(slurm) = &file.slurm else {
                    return Err(invalid("slurm", "backend = \"slurm\" needs a [slurm] table with a partition".into()));
                };
                match &slurm.partition {
                    Some(p) if !p.is_empty() => {}
                    _ => return Err(invalid("slurm.partition", "must name a Slurm partition".into())),
                }
                if slurm.gpu_partition.as_deref() == Some("") {
                    return Err(invalid("slurm.gpu_partition", "must not be empty".into()));
                }
                if slurm.squeue_interval_ms == Some(0) {
                    return Err(invalid("slurm.squeue_interval_ms", "must be at least 1".into()));
                }
                if let Some(p) = &slurm.shim_program {
                    if !p.is_absolute() {
                        return Err(invalid("slurm.shim_program", format!("must be an absolute path, not {}", p.display())));
                    }
                }
            }
            Some(other) => return Err(invalid("backend", format!("must be \"local\" or \"slurm\", not {other:?}"))),
        }
        if let Some(a) = file.tls.as_ref().and_then(|t| t.jobs_address.as_deref()) {
            let loopback = a.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
            if a != "off" && !loopback {
                return Err(invalid("tls.jobs_address", format!("must be a loopback address such as 127.255.0.1, or \"off\", not {a:?}")));
            }
        }
        if let Some(h) = &file.http {
            let at_least_one = [
                ("header_timeout_secs", h.header_timeout_secs),
                ("body_timeout_secs", h.body_timeout_secs),
                ("idle_timeout_secs", h.idle_timeout_secs),
                ("max_connections", h.max_connections.map(|n| n as u64)),
            ];
            for (key, value) in at_least_one {
                if value == Some(0) {
                    return Err(invalid(&format!("http.{key}"), "must be at least 1".into()));
                }
            }
        }
        if let Some(e) = &file.exec {
            for (key, value) in
                [("idle_timeout_secs", e.idle_timeout_secs), ("max_sessions_per_project", e.max_sessions_per_project), ("max_sessions", e.max_sessions)]
            {
                if value == Some(0) {
                    return Err(invalid(&format!("exec.{key}"), "must be at least 1".into()));
                }
            }
        }
        if let Some(l) = &file.limits {
            if l.max_live_jobs_per_project == Some(0) {
                return Err(invalid("limits.max_live_jobs_per_project", "must be at least 1".into()));
            }
            let at_least_one = [
                ("write_burst_per_project", l.write_burst_per_project),
                ("max_connections_per_project", l.max_connections_per_project),
                ("max_log_streams_per_project", l.max_log_streams_per_project),
                ("max_storage_streams_per_project", l.max_storage_streams_per_project),
            ];
            for (key, value) in at_least_one {
                if value == Some(0) {
                    return Err(invalid(&format!("limits.{key}"), "must be at least 1".into()));
                }
            }
            if l.writes_per_second_per_project.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
                return Err(invalid("limits.writes_per_second_per_project", "must be a number above 0".into()));
            }
        }
        if let Some(r) = &file.replicas {
            if let Some([lo, hi]) = r.uid_range {
                if lo == 0 || lo > hi || hi > i32::MAX as u32 {
                    return Err(invalid(
                        "replicas.uid_range",
                        format!("must be [first, last] with 0 < first <= last < 2^31, not [{lo}, {hi}]"),
                    ));
                }
            }
            if let Some(n) = r.nice {
                if !(0..=19).contains(&n) {
                    return Err(invalid("replicas.nice", format!("must be from 0 (no lower priority) to 19, not {n}")));
                }
            }
            if let Some(index) = &r.package_index {
                let url = index.strip_prefix("https://").or_else(|| index.strip_prefix("http://"));
                if index != "none" && url.is_none_or(|rest| rest.is_empty() || rest.contains(char::is_whitespace)) {
                    return Err(invalid(
                        "replicas.package_index",
                        format!("must be the URL of a package index (http:// or https://) or \"none\", not {index:?}"),
                    ));
                }
            }
            if r.network == Some(Network::Job) && file.backend.as_deref() == Some("slurm") {
                return Err(invalid(
                    "replicas.network",
                    "\"job\" needs every replica of a job on this host (one network namespace); with Slurm, \
                     replicas of a job may run on different hosts: use \"host\""
                        .into(),
                ));
            }
            if r.pids_max == Some(0) {
                return Err(invalid("replicas.pids_max", "must be at least 1".into()));
            }
        }
        if let Some(s) = &file.storage {
            s.check().map_err(|(key, message)| invalid(&key, message))?;
        }
        if file.slurm.is_some() && file.backend.as_deref() != Some("slurm") {
            return Err(invalid("slurm", "a [slurm] table needs backend = \"slurm\"".into()));
        }
        let mut c = Config::from_file(file, data_dir, path.display().to_string());
        c.path = Some(path.to_owned());
        if let Ok(table) = text.parse::<toml::Table>() {
            flatten("", &toml::Value::Table(table), &mut c.file_keys);
        }
        c.check_roots().map_err(|(key, message)| invalid(key, message))?;
        Ok(c)
    }

    /// The storage root and the output roots keep jobs out of the server's own files: the
    /// storage root is not the data directory, above it, or inside one of the server's
    /// own directories of it (the default, `<data_dir>/storage`, is fine); an output root
    /// is absolute, not `/`, and neither is, contains nor is inside the data directory or
    /// the storage root. Compared as written and, where they exist, as resolved.
    /// Returns the key at fault and why.
    pub fn check_roots(&self) -> Result<(), (&'static str, String)> {
        let data = &self.data_dir;
        let storage = &self.storage_root;
        if overlaps_above(storage, data) {
            return Err((
                "storage_root",
                format!(
                    "{} is or contains the data directory {}: every project's gs:// namespace would be in the server's own files",
                    storage.display(),
                    data.display()
                ),
            ));
        }
        for own in ["runs", "venvs", "trials", "nodes"] {
            if overlaps_above(&data.join(own), storage) {
                return Err((
                    "storage_root",
                    format!("{} is inside the server's own directory {}", storage.display(), data.join(own).display()),
                ));
            }
        }
        for root in &self.output_roots {
            let shown = root.display();
            if !root.is_absolute() || root.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return Err(("output_roots", format!("{shown} must be an absolute path without \"..\"")));
            }
            if root.parent().is_none() {
                return Err(("output_roots", "\"/\" cannot be an output root: it holds everything, the data directory too".into()));
            }
            if overlaps_above(root, data) || overlaps_above(data, root) {
                return Err((
                    "output_roots",
                    format!(
                        "{shown} is, contains or is inside the data directory {}: jobs could write the server's database and other jobs' run directories",
                        data.display()
                    ),
                ));
            }
            if overlaps_above(root, storage) || overlaps_above(storage, root) {
                return Err((
                    "output_roots",
                    format!(
                        "{shown} is, contains or is inside the storage root {}: jobs could reach other projects' gs:// namespaces",
                        storage.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// At `serve`: neither the storage root nor an output root is or contains the server's
    /// working directory (a job could plant files where the server and replicas run).
    pub fn check_workdir(&self, workdir: &Path) -> Result<(), String> {
        if overlaps_above(&self.storage_root, workdir) {
            return Err(format!(
                "storage_root {} is or contains the server's working directory {}: jobs could plant files there; \
                 start the server in another directory",
                self.storage_root.display(),
                workdir.display()
            ));
        }
        for root in &self.output_roots {
            if overlaps_above(root, workdir) {
                return Err(format!(
                    "output_roots: {} is or contains the server's working directory {}: jobs could plant files there; \
                     start the server in another directory or choose another output root",
                    root.display(),
                    workdir.display()
                ));
            }
        }
        Ok(())
    }

    fn from_file(file: File, data_dir: Option<PathBuf>, source: String) -> Config {
        let catalog = catalog_of(&file);
        let data_dir = data_dir.or(file.data_dir).unwrap_or_else(default_data_dir);
        let storage_root = file.storage_root.unwrap_or_else(|| data_dir.join("storage"));
        let many = !file.nodes.is_empty();
        // Without nodes declared the host overcommits; with them, capacity is exact unless
        // the file says otherwise.
        let overcommit = file
            .overcommit
            .or_else(|| file.node.as_ref().and_then(|n| n.overcommit))
            .unwrap_or(file.node.is_none() && !many);
        let to_node = |n: Option<&NodeFile>| {
            let mt = n.and_then(|n| n.machine_type.as_deref()).and_then(|t| catalog.get(t));
            let mt_accel: BTreeMap<String, u32> = mt
                .map(|m| m.accelerators.iter().filter_map(|(a, c)| c.iter().max().map(|c| (a.clone(), *c))).take(1).collect())
                .unwrap_or_default();
            Node {
                name: n.and_then(|n| n.name.as_ref().map(|s| s.get_ref().clone())).unwrap_or_else(|| "local".into()),
                cpus: n.and_then(|n| n.cpus).or(mt.map(|m| m.vcpus)).unwrap_or_else(host_cpus),
                memory_bytes: n
                    .and_then(|n| n.memory_gb)
                    .map(|g| (g * GIB as f64) as u64)
                    .or(mt.map(|m| m.memory_bytes))
                    .unwrap_or_else(host_memory),
                accelerators: match n.map(|n| &n.accelerators) {
                    Some(a) if !a.is_empty() => a.clone(),
                    _ => mt_accel,
                },
                up: true,
                schedulable: true,
            }
        };
        let backend = match (file.backend.as_deref(), &file.slurm) {
            (Some("slurm"), Some(s)) => BackendChoice::Slurm(SlurmConfig {
                partition: s.partition.clone().unwrap_or_default(),
                gpu_partition: s.gpu_partition.clone(),
                shim_program: s.shim_program.clone(),
                squeue_interval_ms: s.squeue_interval_ms.unwrap_or(500),
                fit_to_nodes: s.fit_to_nodes.unwrap_or(false),
            }),
            _ => BackendChoice::Local,
        };
        let nodes = if many { file.nodes.iter().map(|n| to_node(Some(n))).collect() } else { vec![to_node(file.node.as_ref())] };
        let replicas = {
            let r = file.replicas.as_ref();
            let per_project = r.and_then(|r| r.per_project_users);
            // By default on where it can work: a root server. On Slurm a root server's batch
            // jobs run as root too, so the shim on the node switches the program to the
            // project's uid exactly as on this host.
            let on = per_project.unwrap_or_else(|| nix::unistd::geteuid().is_root());
            Replicas {
                uid_range: on.then(|| r.and_then(|r| r.uid_range).map(|[a, b]| (a, b)).unwrap_or(DEFAULT_UID_RANGE)),
                pids_max: r.and_then(|r| r.pids_max).unwrap_or(DEFAULT_PIDS_MAX),
                insecure_shared_user: r.and_then(|r| r.insecure_shared_user).unwrap_or(false),
                network: r.and_then(|r| r.network).unwrap_or_default(),
                venv_build_timeout_secs: r.and_then(|r| r.venv_build_timeout_secs).unwrap_or(DEFAULT_VENV_BUILD_TIMEOUT_SECS),
                package_index: r.and_then(|r| r.package_index.clone()),
                nice: r.and_then(|r| r.nice).unwrap_or(DEFAULT_REPLICA_NICE),
            }
        };
        let containers = match &file.containers {
            Some(c) => Containers {
                engine: c.engine.unwrap_or_default(),
                pull: c.pull.unwrap_or_default(),
                pull_timeout_secs: c.pull_timeout_secs.unwrap_or(trainyard_backend::container::DEFAULT_PULL_TIMEOUT_SECS),
                offline_pull_timeout_secs: c
                    .offline_pull_timeout_secs
                    .unwrap_or(trainyard_backend::container::DEFAULT_OFFLINE_PULL_TIMEOUT_SECS),
                containers_conf: c.containers_conf.clone(),
                runtime: c.runtime.clone(),
                program: c.program.clone(),
                mounts: c.mounts.iter().filter_map(|m| parse_mount(m).ok()).collect(),
                workdir: None,
            },
            None => Containers::default(),
        };
        let node_gpus: BTreeMap<String, Vec<String>> = if many {
            file.nodes
                .iter()
                .filter_map(|n| Some((n.name.as_ref()?.get_ref().clone(), n.gpus.clone()?)))
                .collect()
        } else {
            file.node.as_ref().and_then(|n| n.gpus.clone()).map(|g| (nodes[0].name.clone(), g)).into_iter().collect()
        };
        Config {
            storage: crate::storage::StorageConfig::from_file(file.storage.as_ref()),
            gpu_check_secs: file.gpu_check_secs.unwrap_or(10),
            metrics_enabled: file.metrics.as_ref().and_then(|m| m.enabled).unwrap_or(true),
            store: file.store.as_ref().and_then(|s| s.url.as_deref()).and_then(|u| trainyard_store::Location::from_url(u).ok()),
            lease_secs: file.store.as_ref().and_then(|s| s.lease_secs).unwrap_or(DEFAULT_LEASE_SECS),
            advertise_url: file.store.as_ref().and_then(|s| s.advertise_url.clone()),
            file_keys: Default::default(),
            log: match &file.log {
                Some(l) => Log {
                    format: l.format.unwrap_or_default(),
                    audit_file: l.audit_file.clone(),
                    audit_max_bytes: l.audit_max_bytes.unwrap_or(DEFAULT_AUDIT_MAX_BYTES),
                    audit_keep: l.audit_keep.unwrap_or(DEFAULT_AUDIT_KEEP),
                },
                None => Log::default(),
            },
            node_gpus,
            containers,
            replicas,
            listen: file.listen.unwrap_or_else(|| "127.0.0.1:8080".into()),
            data_dir,
            storage_root,
            output_roots: file.output_roots.unwrap_or_default(),
            region: file.region.unwrap_or_else(|| "us-central1".into()),
            base_port: file.base_port.unwrap_or(20000),
            tokens_file: file.tokens_file,
            settings: file.lifecycle.unwrap_or_default(),
            catalog: catalog.clone(),
            scheduler: {
                let mut c = trainyard_core::schedule::SchedulerConfig::default();
                if let Some(f) = &file.scheduler {
                    c.order = f.order.unwrap_or(c.order);
                    c.backfill = f.backfill.unwrap_or(c.backfill);
                    c.preemption = f.preemption.unwrap_or(c.preemption);
                    if let Some(secs) = f.starvation_secs {
                        c.starvation_secs = (secs > 0).then_some(secs);
                    }
                    c.max_reservations = f.max_reservations.unwrap_or(c.max_reservations);
                    c.spot_min_runtime_secs = f.spot_min_runtime_secs.unwrap_or(c.spot_min_runtime_secs);
                    c.priority_preemption = f.priority_preemption.unwrap_or(c.priority_preemption);
                    c.min_runtime_secs = f.min_runtime_secs.unwrap_or(c.min_runtime_secs);
                    c.max_preemptions_per_job = f.max_preemptions_per_job.unwrap_or(c.max_preemptions_per_job);
                    c.reclaim_after_secs = f.reclaim_after_secs.unwrap_or(c.reclaim_after_secs);
                    c.usage_half_life_secs = f.usage_half_life_secs.unwrap_or(c.usage_half_life_secs);
                    c.weights = f.weights.clone();
                }
                c
            },
            fleet: Fleet { nodes, overcommit },
            quotas: file.quotas.split().0,
            priority_classes: trainyard_core::schedule::PriorityClasses {
                classes: file
                    .scheduler
                    .as_ref()
                    .map(|s| s.priority_classes.iter().map(|c| (c.name.clone(), c.value)).collect())
                    .unwrap_or_default(),
                default: file.scheduler.as_ref().and_then(|s| s.default_priority_class.clone()),
                projects: file
                    .quotas
                    .projects
                    .iter()
                    .filter_map(|(p, m)| match m.get(PROJECT_PRIORITY_CLASS) {
                        Some(QuotaValue::Name(n)) => Some((p.clone(), n.clone())),
                        _ => None,
                    })
                    .collect(),
                allowed: file
                    .scheduler
                    .iter()
                    .flat_map(|s| &s.priority_classes)
                    .filter_map(|c| Some((c.name.clone(), c.projects.clone()?)))
                    .collect(),
            },
            storage_limits: file.quotas.split().1,
            source,
            path: None,
            backend,
            node_agents: many,
            quarantine: {
                let d = Quarantine::default();
                let f = file.fleet.as_ref();
                Quarantine {
                    after_failures: f.and_then(|f| f.quarantine_after_failures).unwrap_or(d.after_failures),
                    window_secs: f.and_then(|f| f.quarantine_window_secs).unwrap_or(d.window_secs),
                }
            },
            stop_node_agents: file.stop_node_agents.unwrap_or(false),
            http: {
                let mut l = crate::listen::Limits::default();
                if let Some(h) = &file.http {
                    let secs = std::time::Duration::from_secs;
                    l.header_timeout = h.header_timeout_secs.map(secs).unwrap_or(l.header_timeout);
                    l.body_timeout = h.body_timeout_secs.map(secs).unwrap_or(l.body_timeout);
                    l.idle_timeout = h.idle_timeout_secs.map(secs).unwrap_or(l.idle_timeout);
                    l.max_connections = h.max_connections.unwrap_or(l.max_connections);
                    l.shutdown_grace = h.shutdown_grace_secs.map(secs).unwrap_or(l.shutdown_grace);
                }
                l
            },
            jobs_endpoint: None,
            exec: {
                let d = Exec::default();
                let f = file.exec.as_ref();
                Exec {
                    idle_timeout: f.and_then(|f| f.idle_timeout_secs).map_or(d.idle_timeout, std::time::Duration::from_secs),
                    max_sessions_per_project: f
                        .and_then(|f| f.max_sessions_per_project)
                        .map_or(d.max_sessions_per_project, |n| usize::try_from(n).unwrap_or(usize::MAX)),
                    max_sessions: f.and_then(|f| f.max_sessions).map_or(d.max_sessions, |n| usize::try_from(n).unwrap_or(usize::MAX)),
                }
            },
            tls: file.tls.as_ref().map_or_else(
                || crate::tls::TlsSettings { jobs_address: Some(crate::tls::JOBS_ADDRESS), ..Default::default() },
                |t| crate::tls::TlsSettings {
                    cert_file: t.cert_file.clone(),
                    key_file: t.key_file.clone(),
                    ca_file: t.ca_file.clone(),
                    auto: t.auto.unwrap_or(false),
                    names: t.names.clone(),
                    jobs_address: match t.jobs_address.as_deref() {
                        Some("off") => None,
                        Some(a) => a.parse().ok(),
                        None => Some(crate::tls::JOBS_ADDRESS),
                    },
                },
            ),
            limits: {
                let mut l = Limits::default();
                if let Some(f) = &file.limits {
                    l.max_live_jobs_per_project = f.max_live_jobs_per_project.map_or(l.max_live_jobs_per_project, |n| n as usize);
                    l.writes_per_second_per_project = f.writes_per_second_per_project.unwrap_or(l.writes_per_second_per_project);
                    l.write_burst_per_project = f.write_burst_per_project.map_or(l.write_burst_per_project, |n| n as f64);
                    let count = |v: Option<u64>, d: usize| v.map_or(d, |n| usize::try_from(n).unwrap_or(usize::MAX));
                    l.max_connections_per_project = count(f.max_connections_per_project, l.max_connections_per_project);
                    l.max_log_streams_per_project = count(f.max_log_streams_per_project, l.max_log_streams_per_project);
                    l.max_storage_streams_per_project =
                        count(f.max_storage_streams_per_project, l.max_storage_streams_per_project);
                }
                l
            },
        }
    }
}

/// Is `inner` the directory `outer` or below it? Compared as written and, where both
/// exist, with links resolved.
fn overlaps_above(outer: &Path, inner: &Path) -> bool {
    if inner.starts_with(outer) {
        return true;
    }
    match (existing_ancestor_resolved(outer), existing_ancestor_resolved(inner)) {
        (Some(o), Some(i)) => i.starts_with(o),
        _ => false,
    }
}

/// `p` with links resolved, or (when it does not exist yet) its nearest existing ancestor
/// resolved with the rest of the path appended.
fn existing_ancestor_resolved(p: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        if let Ok(real) = std::fs::canonicalize(cur) {
            return Some(rest.iter().rev().fold(real, |acc: PathBuf, c| acc.join(c)));
        }
        rest.push(cur.file_name()?.to_os_string());
        cur = cur.parent()?;
    }
}

/// The built-in catalog with the file's machine types added (or replacing built-in ones).
fn catalog_of(file: &File) -> trainyard_core::catalog::Catalog {
    let mut catalog = trainyard_core::catalog::Catalog::builtin();
    for m in &file.machine_types {
        let name = m.name.get_ref().clone();
        catalog.machine_types.insert(
            name.clone(),
            trainyard_core::catalog::MachineType {
                name,
                vcpus: m.vcpus,
                memory_bytes: (m.memory_gb * GIB as f64) as u64,
                accelerators: m.accelerators.clone(),
                accelerator_required: m.accelerator_required,
            },
        );
    }
    catalog
}

/// toml's error with the line number spelled out.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().to_string();
    match e.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            let at = text.get(span.clone()).unwrap_or("").trim().to_string();
            // The key of that line, below the table it is in: `containers.engine`.
            let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
            let key = text[line_start..].lines().next().and_then(|l| l.split_once('=')).map(|(k, _)| k.trim().to_string());
            let table = text[..line_start].lines().rev().find_map(|l| {
                let l = l.trim();
                l.starts_with('[').then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
            });
            let path = match (table, key) {
                (Some(t), Some(k)) => format!("{t}.{k}: "),
                (None, Some(k)) => format!("{k}: "),
                _ => String::new(),
            };
            format!("line {line}: {path}{msg} (at `{at}`)")
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::schedule::PriorityError;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trainyard.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn builtin_overcommits_one_node() {
        let c = Config::builtin(Some("/tmp/x".into()));
        assert!(c.fleet.overcommit);
        assert_eq!(c.fleet.nodes.len(), 1);
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert_eq!(c.settings.max_worker_restarts, 5);
        assert_eq!(c.storage_root, PathBuf::from("/tmp/x/storage"));
    }

    /// Output roots are configured, never the data directory or the storage root (nor
    /// above or inside them); the storage root is not the data directory or above it.
    #[test]
    fn output_roots_keep_out_of_the_data_directory() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        let scratch = t.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let load = |text: String| {
            let (_d, p) = write(&text);
            Config::load(&p, Some(data.clone())).map_err(|e| e.to_string())
        };
        let c = load(format!("output_roots = [{:?}]\n", scratch)).unwrap();
        assert_eq!(c.output_roots, vec![scratch.clone()]);
        assert!(load(String::new()).unwrap().output_roots.is_empty(), "none by default");
        // A link to the data directory's parent is seen through.
        std::os::unix::fs::symlink(t.path(), t.path().join("parent-link")).unwrap();
        for (root, why) in [
            (data.clone(), "data directory"),
            (t.path().to_path_buf(), "data directory"),
            (data.join("runs"), "data directory"),
            (t.path().join("parent-link"), "data directory"),
            (PathBuf::from("/"), "holds everything"),
            (PathBuf::from("relative"), "absolute"),
        ] {
            let e = load(format!("output_roots = [{root:?}]\n")).unwrap_err();
            assert!(e.contains("output_roots") && e.contains(why), "{root:?}: {e}");
        }
        let e = load(format!("storage_root = {:?}\noutput_roots = [{:?}]\n", scratch.join("s"), scratch)).unwrap_err();
        assert!(e.contains("storage root"), "{e}");
        for storage in [data.clone(), t.path().to_path_buf(), data.join("runs/x")] {
            let e = load(format!("storage_root = {storage:?}\n")).unwrap_err();
            assert!(e.contains("storage_root"), "{storage:?}: {e}");
        }
        assert!(load(format!("storage_root = {:?}\n", data.join("storage"))).is_ok());
        let c = load(format!("output_roots = [{:?}]\n", scratch)).unwrap();
        assert!(c.check_workdir(&scratch.join("work")).unwrap_err().contains("working directory"));
        assert!(c.check_workdir(t.path()).is_ok());
    }

    /// Priority classes: read with their projects' defaults; a bad one is refused naming
    /// its key and the classes there are.
    #[test]
    fn priority_classes_are_read_and_checked() {
        let classes = "[scheduler]\ndefault_priority_class = \"batch\"\n[[scheduler.priority_classes]]\nname = \"urgent\"\nvalue = 100\n\
                       [[scheduler.priority_classes]]\nname = \"batch\"\nvalue = 0\n";
        let (_d, p) = write(&format!("{classes}[quotas.projects.research]\npriority_class = \"urgent\"\ncustom_model_training_cpus = 8\n"));
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.priority_classes.priority(None, "research"), Ok(100));
        assert_eq!(c.priority_classes.priority(None, "other"), Ok(0));
        assert_eq!(c.priority_classes.priority(Some("urgent"), "other"), Ok(100));
        let e = c.priority_classes.priority(Some("asap"), "other").unwrap_err();
        assert!(matches!(&e, PriorityError::Unknown(m) if m.contains("trainyard-priority-class") && m.contains("urgent, batch")), "{e:?}");
        assert_eq!(c.quotas.limit("research", "custom_model_training_cpus"), Some(8), "the quotas beside it");
        for (text, key) in [
            (format!("{classes}[quotas.projects.p]\npriority_class = \"asap\"\n"), "quotas.projects.p.priority_class"),
            (format!("{classes}[quotas.projects.p]\npriority_class = 3\n"), "quotas.projects.p.priority_class"),
            (format!("{classes}[quotas.default]\npriority_class = \"urgent\"\n"), "quotas.default.priority_class"),
            (format!("{classes}[quotas.projects.p]\ncustom_model_training_cpus = \"many\"\n"), "quotas.projects.p.custom_model_training_cpus"),
            ("[scheduler]\ndefault_priority_class = \"x\"\n".to_string(), "scheduler.default_priority_class"),
            ("[[scheduler.priority_classes]]\nname = \"A b\"\nvalue = 1\n".to_string(), "scheduler.priority_classes.name"),
            ("[[scheduler.priority_classes]]\nname = \"a\"\nvalue = 1\n[[scheduler.priority_classes]]\nname = \"a\"\nvalue = 2\n".to_string(), "scheduler.priority_classes.name"),
            (format!("{CLOSED}[quotas.projects.evil]\npriority_class = \"urgent\"\n"), "quotas.projects.evil.priority_class"),
            (format!("{CLOSED}[scheduler]\ndefault_priority_class = \"urgent\"\n"), "scheduler.default_priority_class"),
            ("[[scheduler.priority_classes]]\nname = \"a\"\nvalue = 1\nprojects = [\"\"]\n".to_string(), "scheduler.priority_classes.projects"),
        ] {
            let (_d, p) = write(&text);
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    const CLOSED: &str = "[[scheduler.priority_classes]]\nname = \"urgent\"\nvalue = 1000\nprojects = [\"ops\"]\n\
                          [[scheduler.priority_classes]]\nname = \"batch\"\nvalue = 0\n";

    /// A priority class with `projects` is open to those projects alone: another
    /// project's job naming it is refused as a permission (403), the listed project's is
    /// not, a class without the key stays open to all, and a listed project may have it
    /// as its own default.
    #[test]
    fn a_priority_class_with_projects_is_open_to_those_alone() {
        let (_d, p) = write(&format!("{CLOSED}[quotas.projects.ops]\npriority_class = \"urgent\"\n"));
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.priority_classes.priority(Some("urgent"), "ops"), Ok(1000));
        assert_eq!(c.priority_classes.priority(None, "ops"), Ok(1000));
        let e = c.priority_classes.priority(Some("urgent"), "evil").unwrap_err();
        assert!(matches!(&e, PriorityError::NotAllowed(m) if m.contains("\"urgent\"") && m.contains("\"evil\"")), "{e:?}");
        assert_eq!(c.priority_classes.priority(Some("batch"), "evil"), Ok(0));
        assert_eq!(c.priority_classes.priority(None, "evil"), Ok(0));
    }

    /// `[scheduler] max_reservations` reaches the scheduler; 0 (the first job that does
    /// not fit always holds one) and more than 1024 are refused naming the key.
    #[test]
    fn max_reservations_is_read_and_out_of_range_is_refused() {
        assert_eq!(Config::builtin(None).scheduler.max_reservations, 64);
        let (_d, p) = write("[scheduler]\nmax_reservations = 1\n");
        assert_eq!(Config::load(&p, None).unwrap().scheduler.max_reservations, 1);
        let (_d, p) = write("[scheduler]\nmax_reservations = 0\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("scheduler.max_reservations") && e.contains("at least 1"), "{e}");
        let (_d, p) = write("[scheduler]\nmax_reservations = 1025\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("scheduler.max_reservations") && e.contains("at most 1024"), "{e}");
    }

    /// The packaged config (`packaging/config.toml`, installed as
    /// /etc/trainyard/config.toml) sets nothing as shipped, and lists every key the server
    /// reads: its settings, uncommented, form a valid config, and each table's keys (as the
    /// parser's own error for an unknown key names them) are all there.
    #[test]
    fn the_packaged_config_lists_every_key_and_sets_none() {
        let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/config.toml")).unwrap();
        let (_d, p) = write(&shipped);
        let c = Config::load(&p, Some("/var/lib/trainyard".into())).unwrap();
        let b = Config::builtin(Some("/var/lib/trainyard".into()));
        assert_eq!(format!("{:?}", (&c.listen, &c.settings, &c.scheduler, &c.http, &c.limits, &c.replicas, &c.containers, &c.log, &c.storage_root)),
                   format!("{:?}", (&b.listen, &b.settings, &b.scheduler, &b.http, &b.limits, &b.replicas, &b.containers, &b.log, &b.storage_root)));
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("containers.conf");
        std::fs::write(&conf, "").unwrap();
        let settings: String = shipped
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            // The [slurm] table is read with the Slurm backend only.
            .map(|l| l.replace("/etc/trainyard/containers.conf", &conf.display().to_string()).replace("backend = \"local\"", "backend = \"slurm\"") + "\n")
            .collect();
        let (_d, p) = write(&settings);
        if let Err(e) = Config::load(&p, None) {
            panic!("the packaged config's settings, uncommented: {e}\n{settings}");
        }
        // The keys of each table, from the parser's "unknown field, expected one of" error.
        let keys_of = |table: &str| -> Vec<String> {
            let probe = "zzz_not_a_key = 1\n";
            let text = if table.is_empty() {
                format!("{probe}{settings}")
            } else if let Some(end) = [format!("\n[{table}]\n"), format!("\n[[{table}]]\n")].iter().find_map(|h| Some(settings.find(h.as_str())? + h.len())) {
                format!("{}{probe}{}", &settings[..end], &settings[end..])
            } else {
                format!("{settings}\n[{table}]\n{probe}")
            };
            let (_d, p) = write(&text);
            let e = Config::load(&p, None).unwrap_err().to_string();
            let list = e.split("expected one of ").nth(1).or_else(|| e.split("expected ").nth(1)).unwrap_or_else(|| panic!("[{table}]: {e}"));
            list.split('`').skip(1).step_by(2).filter(|k| *k != "zzz_not_a_key").map(String::from).collect()
        };
        // A key is listed in its table: `key =` among the table's settings, or a table of its own.
        let listed = |table: &str, key: &str| -> bool {
            let mut current = String::new();
            for line in shipped.lines() {
                let l = line.trim_start_matches('#').trim();
                if let Some(h) = l.strip_prefix('[') {
                    current = h.trim_matches(|c| c == '[' || c == ']').to_string();
                    let full = if table.is_empty() { key.to_string() } else { format!("{table}.{key}") };
                    if current == full || current.starts_with(&format!("{full}.")) {
                        return true;
                    }
                } else if current == table && l.split('=').next().is_some_and(|k| k.trim() == key) && l.contains('=') {
                    return true;
                }
            }
            false
        };
        let tables = ["", "node", "machine_types", "http", "tls", "limits", "exec", "replicas", "containers", "scheduler", "scheduler.priority_classes", "quotas", "quotas.cohorts", "lifecycle", "lifecycle.failure_rules", "fleet", "storage", "metrics", "log", "slurm", "store"];
        let mut missing = Vec::new();
        for table in tables {
            let keys = keys_of(table);
            assert!(!keys.is_empty(), "[{table}]: no keys found");
            missing.extend(keys.iter().filter(|k| !listed(table, k)).map(|k| format!("[{table}] {k}")));
        }
        assert!(missing.is_empty(), "keys the packaged config does not list: {missing:?}");
    }

    /// `[exec]`: read, with defaults; a zero is refused naming its key.
    #[test]
    fn exec_settings_are_read_and_checked() {
        assert_eq!(Config::builtin(None).exec, Exec::default());
        let (_d, p) = write("[exec]\nidle_timeout_secs = 60\nmax_sessions_per_project = 2\nmax_sessions = 5\n");
        let c = Config::load(&p, None).expect("valid");
        assert_eq!(c.exec, Exec { idle_timeout: std::time::Duration::from_secs(60), max_sessions_per_project: 2, max_sessions: 5 });
        for (text, key) in [
            ("idle_timeout_secs = 0", "exec.idle_timeout_secs"),
            ("max_sessions_per_project = 0", "exec.max_sessions_per_project"),
            ("max_sessions = 0", "exec.max_sessions"),
        ] {
            let (_d, p) = write(&format!("[exec]\n{text}\n"));
            let e = Config::load(&p, None).expect_err(text).to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        let (_d, p) = write("[exec]\nidle_timeout = 5\n");
        assert!(Config::load(&p, None).is_err(), "an unknown key is refused");
    }

    /// `[log]`: read, with defaults; a bad format, a relative audit file, a size too small
    /// to hold a few lines or no rotated file kept is refused naming its key.
    #[test]
    fn log_settings_are_read_and_checked() {
        assert_eq!(Config::builtin(None).log, Log::default());
        let (_d, p) = write("[log]\nformat = \"json\"\naudit_file = \"/var/log/trainyard/audit.log\"\n");
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.log.audit_file.as_deref(), Some(Path::new("/var/log/trainyard/audit.log")));
        assert_eq!((c.log.audit_max_bytes, c.log.audit_keep), (DEFAULT_AUDIT_MAX_BYTES, DEFAULT_AUDIT_KEEP));
        for (text, key) in [
            ("[log]\nformat = \"xml\"\n", "format"),
            ("[log]\nlevel = \"debug\"\n", "level"),
            ("[log]\naudit_file = \"audit.log\"\n", "log.audit_file"),
            ("[log]\naudit_file = \"/var/log/../audit.log\"\n", "log.audit_file"),
            ("[log]\naudit_max_bytes = 100\n", "log.audit_max_bytes"),
            ("[log]\naudit_keep = 0\n", "log.audit_keep"),
        ] {
            let (_d, p) = write(text);
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    /// Failure rules and the timeout warning are read; a rule without a condition, a bad
    /// regex, an unknown action or signal is refused naming it.
    /// Holds TY6 and TY9 (docs/lifecycle.md).
    #[test]
    fn failure_rules_and_the_timeout_warning_are_checked() {
        let (_d, p) = write(
            "[lifecycle]\ntimeout_warning_secs = 300\n[[lifecycle.failure_rules]]\nname = \"nccl\"\nlog_pattern = \"NCCL (error|timeout)\"\naction = \"transient\"\n\
             [[lifecycle.failure_rules]]\nexit_codes = [3]\naction = \"exclude_node\"\n",
        );
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.settings.failure_rules.len(), 2);
        assert_eq!(c.settings.timeout_warning_secs, 300);
        assert_eq!(c.settings.timeout_warning_signal, "SIGUSR1");
        for (text, key) in [
            ("[[lifecycle.failure_rules]]\naction = \"transient\"\n", "lifecycle.failure_rules[0]"),
            ("[[lifecycle.failure_rules]]\nlog_pattern = \"(\"\naction = \"transient\"\n", "lifecycle.failure_rules[0]"),
            ("[[lifecycle.failure_rules]]\nexit_codes = [1]\naction = \"retry\"\n", "retry"),
            ("[lifecycle]\ntimeout_warning_signal = \"SIGKILL\"\n", "lifecycle.timeout_warning_signal"),
        ] {
            let (_d, p) = write(text);
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    /// Cohorts, borrowing and lending limits are read, and every mistake names its key.
    #[test]
    fn cohorts_are_read_and_checked() {
        let base = "[quotas.projects.a]\ncustom_model_training_cpus = 8\n[quotas.projects.a.borrowing_limit]\ncustom_model_training_cpus = 4\n\
                    [quotas.projects.b]\ncustom_model_training_cpus = 8\n[quotas.projects.b.lending_limit]\ncustom_model_training_cpus = 2\n\
                    [quotas.projects.c]\ncustom_model_training_cpus = 8\n";
        let (_d, p) = write(&format!("{base}[[quotas.cohorts]]\nname = \"lab\"\nprojects = [\"a\", \"b\"]\n"));
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.quotas.cohort_of("a").map(|c| c.name.as_str()), Some("lab"));
        assert!(c.quotas.cohort_of("c").is_none());
        assert_eq!(c.quotas.borrowing_limits["a"]["custom_model_training_cpus"], 4);
        assert_eq!(c.quotas.lending_limits["b"]["custom_model_training_cpus"], 2);
        assert_eq!(c.quotas.limit("a", "custom_model_training_cpus"), Some(8), "not a metric of its own");
        assert_eq!(c.quotas.ceiling("a", "custom_model_training_cpus"), Some(10));
        let cohort = |projects: &str| format!("[[quotas.cohorts]]\nname = \"lab\"\nprojects = {projects}\n");
        for (text, key) in [
            (format!("{base}{}", cohort("[\"a\", \"x\"]")), "quotas.cohorts[0].projects"),
            (format!("{base}{}{}", cohort("[\"a\"]"), cohort("[\"b\", \"a\"]").replace("lab", "lab2")), "quotas.cohorts[1].projects"),
            (format!("{base}{}{}", cohort("[\"a\"]"), cohort("[\"b\"]")), "quotas.cohorts[1].name"),
            (format!("{base}{}", cohort("[\"c\"]")), "quotas.projects.a.borrowing_limit"),
            (
                format!("{}{}", base.replace("= 4", "= -1"), cohort("[\"a\", \"b\"]")),
                "quotas.projects.a.borrowing_limit.custom_model_training_cpus",
            ),
            (format!("{}{}", base.replace("= 2", "= 1.5"), cohort("[\"a\", \"b\"]")), "quotas.projects.b.lending_limit.custom_model_training_cpus"),
            (
                format!("{}{}", base.replace("lending_limit]\ncustom_model_training_cpus = 2", "lending_limit]\ngpus = 1"), cohort("[\"a\", \"b\"]")),
                "quotas.projects.b.lending_limit.gpus",
            ),
            ("[quotas.default.borrowing_limit]\ncustom_model_training_cpus = 1\n".to_string(), "quotas.default.borrowing_limit"),
            ("[[quotas.cohorts]]\nname = \"x\"\nprojects = [\"a\"]\nweight = 2\n".to_string(), "weight"),
        ] {
            let (_d, p) = write(&text);
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn explicit_node_is_exact() {
        let (_d, p) = write(
            "region = \"europe-west4\"\n[node]\ncpus = 8\nmemory_gb = 32\naccelerators = { NVIDIA_TESLA_T4 = 2 }\n\
             [quotas.default]\ncustom_model_training_cpus = 16\n[lifecycle]\nmax_worker_restarts = 2\n",
        );
        let c = Config::load(&p, None).unwrap();
        assert!(!c.fleet.overcommit);
        assert_eq!(c.fleet.nodes[0].cpus, 8);
        assert_eq!(c.fleet.nodes[0].accelerators["NVIDIA_TESLA_T4"], 2);
        assert_eq!(c.quotas.limit("any", "custom_model_training_cpus"), Some(16));
        assert_eq!(c.settings.max_worker_restarts, 2);
        assert_eq!(c.settings.max_job_retries, 3, "unset settings keep their defaults");
        assert_eq!(c.region, "europe-west4");
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let (_d, p) = write("region = \"r\"\n[node]\ncpus = 4\nmemroy_gb = 3\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("trainyard.toml"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("memroy_gb"), "{e}");
    }

    #[test]
    fn several_nodes_and_their_errors() {
        let (_d, p) = write(
            "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[[nodes]]\nname = \"n2\"\ncpus = 8\nmemory_gb = 32\naccelerators = { NVIDIA_TESLA_T4 = 2 }\n",
        );
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.fleet.nodes.len(), 2);
        assert!(!c.fleet.overcommit);
        assert_eq!(c.fleet.nodes[1].accelerators["NVIDIA_TESLA_T4"], 2);
        let (_d, p) = write("[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("nodes[1].name") && e.contains("listed twice") && e.contains("lines 2 and 6"), "{e}");
        let (_d, p) = write("[[nodes]]\nname = \"n1\"\ncpus = 0\nmemory_gb = 16\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("nodes[0].cpus") && e.contains("line 2"), "{e}");
        let (_d, p) = write("[[nodes]]\nname = \"n1\"\ncpus = 2\nmemory_gb = 16\naccelerators = { GPU = 1 }\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("nodes[0].accelerators.GPU"));
        let (_d, p) = write("[[nodes]]\nname = \"n1\"\ncpus = 2\nmemory_gb = 16\nslots = 3\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("line 5") && e.contains("slots"), "{e}");
        let (_d, p) = write("[quotas.default]\ncpus = 3\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("quotas.default.cpus"));
        let (_d, p) = write("[quotas.default]\ncustom_model_training_cpus = -3\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("quotas.default.custom_model_training_cpus") && e.contains("-3"), "{e}");
        let (_d, p) = write("[quotas.default]\ncustom_model_training_cpus = 2.5\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("whole number"));
        let (_d, p) = write("[quotas.projects.p]\nstorage_gb = -1\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("quotas.projects.p.storage_gb"));
        let (_d, p) = write("[quotas.default]\nstorage_gb = 2\n[quotas.projects.p]\nstorage_gb = 0.5\ncustom_model_training_cpus = 4\n");
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.storage_limits.limit("p"), Some(512 * 1024 * 1024));
        assert_eq!(c.storage_limits.limit("q"), Some(2 * 1024 * 1024 * 1024));
        assert_eq!(c.quotas.limit("p", "custom_model_training_cpus"), Some(4));
        assert_eq!(c.quotas.limit("p", "storage_gb"), None, "not a scheduler quota");
    }

    #[test]
    fn backend_choice_and_slurm_table() {
        let (_d, p) = write("region = \"r\"\n");
        assert_eq!(Config::load(&p, None).unwrap().backend, BackendChoice::Local);
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\ngpu_partition = \"gpu\"\nfit_to_nodes = true\n");
        let c = Config::load(&p, None).unwrap();
        assert_eq!(
            c.backend,
            BackendChoice::Slurm(SlurmConfig {
                partition: "debug".into(),
                gpu_partition: Some("gpu".into()),
                shim_program: None,
                squeue_interval_ms: 500,
                fit_to_nodes: true,
            })
        );
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\npartiton = \"x\"\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("partiton") && e.contains("line 4"), "{e}");
        let (_d, p) = write("backend = \"slurm\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("[slurm]"));
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\ngpu_partition = \"gpu\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("slurm.partition"));
        let (_d, p) = write("backend = \"k8s\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("backend"));
        let (_d, p) = write("[slurm]\npartition = \"debug\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("needs backend"));
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\nshim_program = \"trainyard\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("slurm.shim_program"));
    }

    #[test]
    fn machine_types_and_typed_nodes() {
        let (_d, p) = write(
            "[[machine_types]]\nname = \"lab-gpu-2\"\nvcpus = 16\nmemory_gb = 64\naccelerators = { NVIDIA_L4 = [1, 2] }\n\n\
             [[nodes]]\nname = \"g1\"\nmachine_type = \"lab-gpu-2\"\n\n[[nodes]]\nname = \"a1\"\nmachine_type = \"a2-highgpu-1g\"\n",
        );
        let c = Config::load(&p, None).unwrap();
        assert_eq!(c.catalog.get("lab-gpu-2").unwrap().vcpus, 16);
        assert_eq!(c.fleet.nodes[0].cpus, 16);
        assert_eq!(c.fleet.nodes[0].accelerators["NVIDIA_L4"], 2);
        assert_eq!(c.fleet.nodes[1].accelerators["NVIDIA_TESLA_A100"], 1);
        let (_d, p) = write("[[nodes]]\nname = \"a1\"\nmachine_type = \"a2-highgpu-1g\"\naccelerators = { NVIDIA_TESLA_A100 = 3 }\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("nodes[0].accelerators.NVIDIA_TESLA_A100") && e.contains("not allowed"), "{e}");
        let (_d, p) = write("[[nodes]]\nname = \"x\"\nmachine_type = \"n9-giant\"\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("nodes[0].machine_type"));
        let (_d, p) = write("[[machine_types]]\nname = \"m\"\nvcpus = 0\nmemory_gb = 1\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("machine_types[0].vcpus"));
        let (_d, p) = write("[[machine_types]]\nname = \"m\"\nvcpus = 1\nmemory_gb = 1\naccelerators = { NVIDIA_L4 = [] }\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("machine_types[0].accelerators.NVIDIA_L4"));
    }

    #[test]
    fn bad_values_are_refused() {
        let (_d, p) = write("[node]\ncpus = 0\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("node.cpus"), "{e}");
        let (_d, p) = write("[node]\nmemory_gb = -1\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("node.memory_gb"));
        let (_d, p) = write("[lifecycle]\nmax_worker_restarts = \"five\"\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let (_d, p) = write("[node\n");
        assert!(Config::load(&p, None).is_err());
        assert!(Config::load(Path::new("/nonexistent/t.toml"), None).unwrap_err().to_string().contains("/nonexistent/t.toml"));
    }

    #[test]
    fn project_limits() {
        assert_eq!(Config::builtin(None).limits, Limits::default());
        let (_d, p) = write(
            "[limits]\nmax_live_jobs_per_project = 5\nwrites_per_second_per_project = 2.5\nwrite_burst_per_project = 7\n\
             max_connections_per_project = 9\nmax_log_streams_per_project = 3\nmax_storage_streams_per_project = 2\n",
        );
        let l = Config::load(&p, None).unwrap().limits;
        assert_eq!(
            l,
            Limits {
                max_live_jobs_per_project: 5,
                writes_per_second_per_project: 2.5,
                write_burst_per_project: 7.0,
                max_connections_per_project: 9,
                max_log_streams_per_project: 3,
                max_storage_streams_per_project: 2,
            }
        );
        for (bad, key) in [
            ("max_live_jobs_per_project = 0", "limits.max_live_jobs_per_project"),
            ("writes_per_second_per_project = 0.0", "limits.writes_per_second_per_project"),
            ("write_burst_per_project = 0", "limits.write_burst_per_project"),
            ("max_connections_per_project = 0", "limits.max_connections_per_project"),
            ("max_log_streams_per_project = 0", "limits.max_log_streams_per_project"),
            ("max_storage_streams_per_project = 0", "limits.max_storage_streams_per_project"),
            ("rate = 1", "rate"),
        ] {
            let (_d, p) = write(&format!("[limits]\n{bad}\n"));
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn replicas_identity_and_task_limit() {
        let root = nix::unistd::geteuid().is_root();
        let d = Config::builtin(None).replicas;
        assert_eq!(d.uid_range, root.then_some(DEFAULT_UID_RANGE), "per-project users by default exactly for root");
        assert_eq!((d.pids_max, d.insecure_shared_user), (DEFAULT_PIDS_MAX, false));
        let (_d, p) = write("[replicas]\nper_project_users = true\nuid_range = [300000, 300009]\npids_max = 64\n");
        let r = Config::load(&p, None).unwrap().replicas;
        assert_eq!((r.uid_range, r.pids_max), (Some((300_000, 300_009)), 64));
        let (_d, p) = write("[replicas]\nper_project_users = false\ninsecure_shared_user = true\n");
        let r = Config::load(&p, None).unwrap().replicas;
        assert_eq!((r.uid_range, r.insecure_shared_user), (None, true));
        for (bad, key) in [
            ("uid_range = [0, 10]", "replicas.uid_range"),
            ("uid_range = [20, 10]", "replicas.uid_range"),
            ("uid_range = [10, 4294967295]", "replicas.uid_range"),
            ("pids_max = 0", "replicas.pids_max"),
            ("run_as = \"nobody\"", "run_as"),
            ("package_index = \"pypi\"", "replicas.package_index"),
            ("nice = -5", "replicas.nice"),
            ("nice = 20", "replicas.nice"),
            ("package_index = \"http://\"", "replicas.package_index"),
        ] {
            let (_d, p) = write(&format!("[replicas]\n{bad}\n"));
            let e = Config::load(&p, None).unwrap_err().to_string();
            assert!(e.contains("trainyard.toml") && e.contains(key), "{bad}: {e}");
        }
        // Slurm replicas run as per-project users like local ones: by default for root,
        // on request, and as the submitting user when asked.
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\n[replicas]\nper_project_users = true\n");
        assert_eq!(Config::load(&p, None).unwrap().replicas.uid_range, Some(DEFAULT_UID_RANGE));
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\n");
        let expected = nix::unistd::geteuid().is_root().then_some(DEFAULT_UID_RANGE);
        assert_eq!(Config::load(&p, None).unwrap().replicas.uid_range, expected);
        let (_d, p) = write("backend = \"slurm\"\n[slurm]\npartition = \"debug\"\n[replicas]\nper_project_users = false\n");
        assert_eq!(Config::load(&p, None).unwrap().replicas.uid_range, None);
    }

    #[test]
    fn http_limits() {
        let d = Config::builtin(None).http;
        assert_eq!(d, crate::listen::Limits::default());
        let (_d, p) = write("[http]\nheader_timeout_secs = 2\nbody_timeout_secs = 3\nidle_timeout_secs = 4\nmax_connections = 5\nshutdown_grace_secs = 0\n");
        let h = Config::load(&p, None).unwrap().http;
        assert_eq!(h.header_timeout, std::time::Duration::from_secs(2));
        assert_eq!(h.body_timeout, std::time::Duration::from_secs(3));
        assert_eq!(h.idle_timeout, std::time::Duration::from_secs(4));
        assert_eq!(h.max_connections, 5);
        assert_eq!(h.shutdown_grace, std::time::Duration::ZERO);
        let (_d, p) = write("[http]\nmax_connections = 0\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("trainyard.toml") && e.contains("http.max_connections"), "{e}");
        let (_d, p) = write("[http]\nidle_timeout_secs = 0\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("http.idle_timeout_secs"));
        let (_d, p) = write("listen = \"127.0.0.1:1\"\n[http]\nheader_timeout = 2\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("header_timeout"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 400, ..Default::default() })]

        /// A broken config file is an error naming the file, never a crash.
        #[test]
        fn any_config_text_is_an_error_or_a_config(text in proptest::prop_oneof![
            "\\PC{0,60}",
            "(\\[\\[?(node|nodes|quotas\\.default|lifecycle|scheduler|machine_types)\\]\\]?\\n)?([a-z_]{1,12} = (\"[^\"]{0,8}\"|-?[0-9]{1,4}|true|\\[1, 2\\]|\\{ [A-Z_]{1,8} = 2 \\})\\n){0,4}",
        ]) {
            let (_d, p) = write(&text);
            if let Err(e) = Config::load(&p, None) {
                proptest::prop_assert!(e.to_string().contains("trainyard.toml"), "{e}");
            }
        }
    }
}
