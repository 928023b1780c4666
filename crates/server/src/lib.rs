//! The Trainyard server: configuration, the driver thread that runs the lifecycle, the
//! REST API, and the embedding used by `trainyard serve` and `trainyard local-run`.

pub mod accounting;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod containers;
pub mod datadir;
pub mod doctor;
pub mod driver;
pub mod exec;
pub mod executor;
pub mod health;
pub mod gpus;
pub mod grpc;
pub mod identity;
pub mod index_proxy;
pub mod ingest;
pub mod http;
pub mod jobspec;
pub mod kinds;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod nodeagent;
pub mod openapi;
pub mod paths;
pub mod priority;
pub mod records;
pub mod reply;
pub mod security;
pub mod shares;
pub mod storage;
pub mod stuck;
pub mod tenant_work;
pub mod tls;
pub mod venv;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use trainyard_backend::{Backend, CgroupSupport, LocalBackend, SlurmBackend, SlurmOptions};
use trainyard_store::Store;

pub use config::Config;
pub use driver::{Driver, Msg, Services};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    /// Another server uses the data directory (or its lock cannot be taken).
    #[error(transparent)]
    DataDirLock(#[from] datadir::LockError),
    #[error(transparent)]
    Store(#[from] trainyard_store::StoreError),
    #[error("cannot write the fleet file of the node agents {path}: {source}")]
    Fleet { path: PathBuf, source: std::io::Error },
    #[error("cannot start the driver thread: {0}")]
    Thread(std::io::Error),
    /// The Slurm backend could not start; `key` is the config key at fault.
    #[error("the Slurm backend{}: {source}", key.as_ref().map(|k| format!(" (config key slurm.{k})")).unwrap_or_default())]
    Slurm { key: Option<String>, source: trainyard_backend::BackendError },
    /// Replicas cannot run as configured (`[replicas]`), or tokens with a shared user.
    #[error("{0}")]
    Replicas(String),
    /// `[containers]` cannot be had as configured.
    #[error("{0}")]
    Containers(String),
    /// A node's `gpus` cannot be found on this host.
    #[error("GPUs: {0}")]
    Gpus(String),
}

/// Environment variables passed on from the server to every replica's program.
const PASSED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR", "PYTHONPATH"];

/// A running engine: the driver thread and what talks to it.
pub struct Engine {
    pub tx: Sender<Msg>,
    /// Where the store is (`[store] url`, or SQLite in the data directory).
    pub store: trainyard_store::Location,
    pub services: Arc<Services>,
    pub thread: std::thread::JoinHandle<Result<(), trainyard_store::StoreError>>,
    /// Waiting reasons of the latest scheduling round, for readers.
    pub waiting: Arc<driver::WaitingView>,
    /// The driver's liveness, for `/healthz` and the API.
    pub health: Arc<health::Health>,
    /// What `/metrics` shows (kept by the driver and the HTTP layer).
    pub metrics: Arc<metrics::Metrics>,
    /// The exclusive lock on `<data_dir>/server.lock`, held for the life of the engine.
    _data_dir_lock: datadir::DataDirLock,
}

/// Start the engine: lock the data directory (one server per directory), open the store,
/// detect cgroups, recover live jobs (L23), and run the driver on its own thread.
/// `shim_command` starts a shim (e.g. `[current_exe, "shim"]`).
///
/// On a PostgreSQL store the engine leads it: the store's lease is taken (and kept) first,
/// and refused, naming the leader, while another server holds it (`trainyard serve`
/// follows instead: see [`cluster`]).
pub fn start(cfg: Config, shim_command: Vec<OsString>, workdir: PathBuf, output_roots: Vec<PathBuf>) -> Result<Engine, StartError> {
    let fence = match cfg.store.clone() {
        Some(location @ trainyard_store::Location::Postgres(_)) => {
            let member = Arc::new(cluster::Member::new(&cfg, location));
            let Some(epoch) = member.try_lead()? else {
                let seen = member.view.seen();
                return Err(StartError::Store(trainyard_store::StoreError::Fenced(format!(
                    "another Trainyard server leads the store ({} at {}); `trainyard serve` on the same store follows it",
                    seen.holder,
                    seen.leader.unwrap_or_default()
                ))));
            };
            Some(member.keep(epoch).map_err(StartError::Thread)?)
        }
        _ => None,
    };
    start_leading(cfg, shim_command, workdir, output_roots, fence)
}

/// [`start`] as the leader of a lease's epoch (several servers on one PostgreSQL store;
/// see [`cluster`]): the driver's store connection is fenced by `fence`, and the data
/// directory's lock is shared with the other servers of the store.
pub fn start_leading(
    mut cfg: Config,
    shim_command: Vec<OsString>,
    workdir: PathBuf,
    output_roots: Vec<PathBuf>,
    fence: Option<trainyard_store::lease::Fence>,
) -> Result<Engine, StartError> {
    metrics::count_panics();
    // The data directory is for the server's user only (see `datadir`).
    // Per-project users pass through it (search bit only) to their own directories.
    let passable = if cfg.replicas.uid_range.is_some() { 0o011 } else { 0 };
    match datadir::create_private_dir_allowing(&cfg.data_dir, passable) {
        Ok(Some(mode)) => {
            tracing::warn!("data directory {}: mode {mode:04o} tightened to {:04o}", cfg.data_dir.display(), 0o700 | passable)
        }
        Ok(None) => {}
        Err(source) => return Err(StartError::DataDir { path: cfg.data_dir.clone(), source }),
    }
    std::fs::create_dir_all(&cfg.storage_root)
        .map_err(|source| StartError::DataDir { path: cfg.storage_root.clone(), source })?;
    match identity::check_at_start(&cfg) {
        // A shared user is worth a warning unless it was asked for (local-run asks).
        Ok(note) if cfg.replicas.uid_range.is_some() || cfg.replicas.insecure_shared_user => tracing::info!("{note}"),
        Ok(note) => tracing::warn!("{note}"),
        Err(why) => return Err(StartError::Replicas(why)),
    }
    let data_dir_lock = match &cfg.store {
        None => datadir::DataDirLock::take(&cfg.data_dir)?,
        Some(_) => datadir::DataDirLock::take_shared(&cfg.data_dir)?,
    };
    if cfg.replicas.network == config::Network::Job {
        let dir = driver::netns_dir(&cfg.data_dir);
        if !nix::unistd::geteuid().is_root() {
            return Err(StartError::Replicas(
                "[replicas] network = \"job\" needs the server to run as root (it makes a network namespace per job); \
                 run it as root or set network = \"host\""
                    .into(),
            ));
        }
        trainyard_backend::netns::prepare_dir(&dir).map_err(|e| StartError::Replicas(format!("[replicas] network = \"job\": {e}")))?;
        tracing::info!(
            "replicas' network: one namespace per job with only a loopback interface (its replicas reach each other, \
             nothing else), bound in {}",
            dir.display()
        );
        if let Some(index) = cfg.replicas.package_index.as_deref().and_then(index_proxy::Index::from_url) {
            let shown = format!("{}:{}", index.host, index.port);
            let socket = index_proxy::start(&cfg.data_dir, index).map_err(|e| {
                StartError::Replicas(format!("[replicas] package_index: cannot serve {}: {e}", cfg.data_dir.join(index_proxy::SOCKET).display()))
            })?;
            tracing::info!("package builds in a job's network reach the package index {shown} only, through {}", socket.display());
        }
    } else {
        tracing::info!("replicas' network: the host's ([replicas] network = \"host\")");
    }
    // Agents are `<this program> node-agent` (the shim may be a program of its own).
    let node_agent = cfg
        .node_agents
        .then(|| match std::env::current_exe() {
            Ok(exe) => Some(vec![exe.into_os_string(), "node-agent".into()]),
            Err(e) => {
                tracing::error!("cannot find this program to start the virtual nodes' agents ({e}); nodes will not be watched");
                None
            }
        })
        .flatten();
    // Before any agent is started or adopted: agents of nodes not listed here exit.
    let agent_nodes: Vec<String> =
        if node_agent.is_some() { cfg.fleet.nodes.iter().map(|n| n.name.clone()).collect() } else { Vec::new() };
    nodeagent::write_fleet(&cfg.data_dir, &agent_nodes)
        .map_err(|source| StartError::Fleet { path: nodeagent::fleet_path(&cfg.data_dir), source })?;
    let backend: Arc<dyn Backend> = match &cfg.backend {
        config::BackendChoice::Local => Arc::new(LocalBackend::new(shim_command, CgroupSupport::detect()).with_replica_cpu(cfg.replicas.nice)),
        config::BackendChoice::Slurm(s) => {
            let shim_command = match &s.shim_program {
                Some(p) => vec![p.clone().into_os_string(), OsString::from("shim")],
                None => shim_command,
            };
            let mut opts = SlurmOptions::new(s.partition.clone(), shim_command);
            opts.gpu_partition = s.gpu_partition.clone();
            opts.poll_interval = std::time::Duration::from_millis(s.squeue_interval_ms);
            opts.fit_to_nodes = s.fit_to_nodes;
            let backend = SlurmBackend::new(opts).map_err(|source| {
                let key = match &source {
                    trainyard_backend::BackendError::Slurm { command, .. }
                        if command == "partition" || command == "gpu_partition" =>
                    {
                        Some(command.clone())
                    }
                    _ => None,
                };
                StartError::Slurm { key, source }
            })?;
            Arc::new(backend)
        }
    };
    // A leader's effects wait while its lease is in doubt (see `cluster::FencedBackend`).
    let backend: Arc<dyn Backend> = match &fence {
        Some(fence) => Arc::new(cluster::FencedBackend { inner: backend, fence: fence.clone() }),
        None => backend,
    };
    let description = backend.describe();
    if description.contains("no writable memory cgroup") {
        tracing::warn!("backend: {description}");
    } else {
        tracing::info!("backend: {description}");
    }
    let containers = containers::resolve(&cfg).map_err(StartError::Containers)?;
    // GPUs of this host (the local backend; on Slurm, Slurm's gres assigns them).
    let gpus = match &cfg.backend {
        config::BackendChoice::Local => {
            let found = gpus::discover();
            match &found {
                gpus::Discovery::NoDriver => tracing::info!("GPUs: none (no nvidia-smi on PATH)"),
                gpus::Discovery::Found(inv) if inv.gpus.is_empty() => tracing::info!("GPUs: none (nvidia-smi lists none)"),
                _ => {}
            }
            gpus::apply(&found, &mut cfg.fleet, &cfg.node_gpus, !cfg.node_agents).map_err(StartError::Gpus)?
        }
        config::BackendChoice::Slurm(_) => Default::default(),
    };
    let store_location = cfg.store_location();
    // The driver is the store's one writer: on PostgreSQL, the leader of its epoch, whose
    // writes the store refuses once another server took the lease.
    let epoch = fence.as_ref().map(|f| f.epoch);
    let mut store = Store::connect_leader(&store_location, fence)?;
    if let trainyard_store::Location::Postgres(_) = &store_location {
        let role = epoch.map(|e| format!(", leading at epoch {e}")).unwrap_or_default();
        tracing::info!("store: PostgreSQL at {store_location} (schema version {}){role}", store.schema_version()?);
    }
    // Tokens mode: each job's clients get a credential of its own (see `auth`).
    let job_credentials = match cfg.tokens_file {
        Some(_) => Some(Arc::new(auth::JobCredentials::new(&token_key(&mut store)?))),
        None => None,
    };
    let base_env: Vec<(String, String)> = PASSED_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    // The PATH of replicas run as their project's user is looked at on disk once, here,
    // not at the first launch on the driver's thread.
    identity::warm_replica_path(&base_env);
    let gcs_mount = gcs_mount_point(cfg.tokens_file.is_some())?;
    let private_tmp = gcs_mount && private_tmp_possible(&cfg, &output_roots);
    let services = Arc::new(Services {
        gcs_mount,
        private_tmp,
        gpus,
        containers,
        node_agent,
        catalog: cfg.catalog.clone(),
        backend,
        output_roots,
        workdir,
        base_env,
        job_credentials,
        storage_usage: Arc::new(storage::usage::StorageUsage::new(cfg.storage_root.clone(), cfg.storage_limits.clone())),
        cfg,
    });
    let (mut driver, tx) = Driver::new(Arc::clone(&services), store);
    if !services.gpus.is_empty() && services.cfg.gpu_check_secs > 0 {
        let every = std::time::Duration::from_secs(services.cfg.gpu_check_secs);
        let tx = tx.clone();
        // nvidia-smi may take a while: never on the driver's thread.
        let spawned = std::thread::Builder::new().name("gpu-health".into()).spawn(move || loop {
            std::thread::sleep(every);
            // A check that panics (a defect) is skipped, not the end of the checks.
            let Ok((seen, faults)) = std::panic::catch_unwind(|| (gpus::present(), gpus::faults())) else {
                tracing::error!("GPUs: a health check panicked; tried again in {every:?}");
                continue;
            };
            if tx.send(Msg::GpusSeen(seen, faults)).is_err() {
                return;
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("GPUs: no health check: cannot start its thread: {e}");
        }
    }
    {
        // A job's writes past its project's storage limit stop its running jobs.
        let tx = tx.clone();
        storage::usage::watch(Arc::clone(&services.storage_usage), move |full| full.is_empty() || tx.send(Msg::StorageFull(full)).is_ok());
    }
    // A job's TensorBoard event files become time series as they grow.
    ingest::start(
        store_location.clone(),
        ingest::Roots { storage_root: services.cfg.storage_root.clone(), output_roots: services.output_roots.clone() },
        tx.clone(),
    );
    driver.recover()?;
    let waiting = driver.waiting_view();
    let health = driver.health();
    let metrics = driver.metrics();
    let watch = Arc::clone(&health);
    let thread = std::thread::Builder::new()
        .name("driver".into())
        .spawn(move || {
            // However the driver ends, the health check says so (and `serve` exits).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.run()));
            match &r {
                Ok(Ok(())) => watch.set(health::State::Stopped("the server is shutting down".into())),
                Ok(Err(e)) => watch.set(health::State::Stopped(e.reason())),
                Err(_) => watch.set(health::State::Stopped("the driver thread panicked".into())),
            }
            r.unwrap_or_else(|_| Err(trainyard_store::StoreError::Panicked))
        })
        .map_err(StartError::Thread)?;
    Ok(Engine { tx, store: store_location, services, thread, waiting, health, metrics, _data_dir_lock: data_dir_lock })
}

/// Can host programs get /gcs by a mount namespace? As root, where the kernel lets this
/// process make one (not, for example, in an unprivileged container: no CAP_SYS_ADMIN),
/// with a directory /gcs (made, empty, when missing). Said at start either way. Without
/// one, replicas' /proc is the host's: with tokens (several tenants) the server does not
/// start.
fn gcs_mount_point(tokens: bool) -> Result<bool, StartError> {
    let point = std::path::Path::new(trainyard_backend::shim::GCS_MOUNT_POINT);
    if !nix::unistd::geteuid().is_root() {
        tracing::info!("/gcs: host programs have /gcs/ in their command and args rewritten to their project's storage (not root: no mount namespaces)");
        return Ok(false);
    }
    if let Err(why) = trainyard_backend::shim::probe_mount_namespace() {
        if tokens {
            return Err(StartError::Replicas(format!(
                "replicas cannot have a mount namespace of their own on this host ({why}), so their /proc would show \
                 other tenants' processes: refusing to serve tokens. {MOUNT_NAMESPACE_FIX}"
            )));
        }
        tracing::warn!(
            "/gcs: replicas cannot have a mount namespace of their own on this host ({why}): /gcs/ in command and args \
             is rewritten instead, and replicas see the host's /proc and SysV IPC. {MOUNT_NAMESPACE_FIX}"
        );
        return Ok(false);
    }
    if !point.is_dir() {
        if let Err(e) = std::fs::create_dir(point) {
            tracing::warn!("/gcs: cannot create {} ({e}); /gcs/ in command and args is rewritten instead", point.display());
            return Ok(false);
        }
    }
    tracing::info!("/gcs: host programs see their project's buckets at /gcs (a mount namespace per replica)");
    Ok(true)
}

/// Can replicas of per-project users get a `/tmp` of their own? Not when a directory they
/// need (the data directory with their run directories and working directories, the
/// storage root, an output root) lies under the host's /tmp, which theirs would hide:
/// then they keep the host's (their TMPDIR stays their own), said at start.
fn private_tmp_possible(cfg: &Config, output_roots: &[PathBuf]) -> bool {
    let needed = [cfg.data_dir.as_path(), cfg.storage_root.as_path()].into_iter().chain(output_roots.iter().map(PathBuf::as_path));
    let under_tmp: Vec<String> = needed
        .filter(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()).starts_with("/tmp"))
        .map(|p| p.display().to_string())
        .collect();
    if under_tmp.is_empty() {
        tracing::info!("/tmp: each replica of a project's user has a /tmp of its own (TMPDIR=/tmp), emptied when it ends");
        return true;
    }
    tracing::warn!(
        "/tmp: replicas see the host's /tmp (their TMPDIR is their own): {} lies under /tmp, which a /tmp of their own would hide",
        under_tmp.join(", ")
    );
    false
}

/// What gives replicas their mount namespaces back.
pub const MOUNT_NAMESPACE_FIX: &str =
    "Run the server with CAP_SYS_ADMIN: as root on the host, or in a privileged container.";

/// The key of page tokens, made once per database (so tokens outlive a restart, and every
/// server on one store reads the same).
pub fn token_key(store: &mut Store) -> Result<Vec<u8>, trainyard_store::StoreError> {
    const KEY: &str = "page_token_key_v2";
    if let Some(bytes) = store.meta(KEY)?.as_deref().and_then(unhex) {
        return Ok(bytes);
    }
    let mut key = vec![0u8; 32];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key)).is_err() {
        let seed = format!("{}-{}", driver::now_micros(), std::process::id());
        key = seed.into_bytes();
    }
    let text: String = key.iter().map(|b| format!("{b:02x}")).collect();
    match unhex(&store.meta_or_set(KEY, &text)?) {
        Some(kept) => Ok(kept),
        // A value that is not hex (written by hand): replaced.
        None => {
            store.set_meta(KEY, &text)?;
            Ok(key)
        }
    }
}

/// Bytes from lowercase or uppercase hex (None: not hex, or an odd length).
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}
