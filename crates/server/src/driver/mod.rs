//! The one driver thread that owns every live job. HTTP handlers and the CLI send it
//! commands and await replies; the backend sends it events; it keeps the timers. For each
//! event: `step` (pure), commit the new state and its effects in one transaction (L23),
//! then carry the effects out. No lock is shared with the handlers.

mod accounting;
mod fleet;
mod gpus;
mod jobs;
mod launch;
pub use launch::netns_dir;
mod pipelines;
mod progress;
mod stops;
mod studies;
mod vizier;
mod waiting;

pub use crate::kinds::custom_jobs::{job_name, render, KIND_CUSTOM};
pub use crate::kinds::pipelines::{pipeline_name, render_pipeline, KIND_PIPELINE};
pub use crate::kinds::tuning_jobs::{render_study, study_name, trial_resource, KIND_STUDY};
pub use vizier::{read_vizier_study, render_vizier_study, VizierAnswer, VizierCall, VizierOp, KIND_VIZIER};
pub use crate::kinds::waiting::{Waiting, WaitingView};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trainyard_api::{ApiError, CustomJob, HyperparameterTuningJob, PipelineState, Timestamp};
use trainyard_backend::{Backend, BackendEvent, EventSink, Launch, ShimSpec};
use trainyard_core::catalog::Catalog;
use trainyard_core::env::{replica_env, slot_address, EnvInput, Member};
use trainyard_core::schedule::{schedule_with, Decision, Fleet, Hints, Quotas};
use trainyard_core::step::{step, Rejected};
use trainyard_core::{Effect, Event, Job, Micros, Outcome, Phase, RunId};
use trainyard_store::{NewJob, Store, StoreError};

/// A driver that panicked recovers from the store at once, then after each panic of a
/// recovery 100 ms, doubling, at most 30 s.
const RECOVERY: trainyard_core::retry::Backoff = trainyard_core::retry::Backoff::of(Duration::from_millis(100), Duration::from_secs(30));
/// A store that cannot be written is probed again after 50 ms, doubling, at most 500 ms.
const STORE_PROBE: trainyard_core::retry::Backoff = trainyard_core::retry::Backoff::of(Duration::from_millis(50), Duration::from_millis(500));

use crate::config::Config;
use crate::executor::Executor;
use crate::health::{Health, State as HealthState};
use crate::jobspec::{check_paths, prepare, resolve_uri};
use crate::paths::Confined;
use crate::kinds::tuning_jobs::{self as study, Study, StudyConfig};

pub use crate::kinds::{Create, Kind, Reply};

/// Transitions decided and not yet installed, by job: the job as it will be and the
/// effects to commit with it (see `Driver::apply_many`).
type Staged = BTreeMap<u64, (Job, Vec<Effect>)>;

/// What the driver is asked to do.
pub enum Msg {
    /// Create a resource of a kind (already parsed and validated against the wire rules).
    Create { project: String, region: String, new: Create },
    /// Cancel a resource of a kind (L18 for a CustomJob; a tuning job's or pipeline's
    /// jobs with it).
    Cancel { kind: Kind, project: String, region: String, id: u64, reply: Reply<()> },
    /// A report from the backend.
    Backend(BackendEvent),
    /// What the executor did with an effect.
    Executed(crate::executor::Report),
    /// Fleet and quota administration.
    Admin { req: Admin, reply: Reply<serde_json::Value> },
    /// L9: a node stopped answering (its agent is gone).
    NodeLost(String),
    /// The GPU health check: the UUIDs nvidia-smi lists now, or why it failed.
    /// The GPUs nvidia-smi lists, and those that report faults (uncorrectable ECC).
    GpusSeen(Result<Vec<String>, String>, Vec<(String, String)>),
    /// Projects whose storage is over their limit (`storage_gb`): their running jobs stop.
    StorageFull(Vec<crate::storage::usage::Full>),
    /// A write of the Vizier API (a study or its trials).
    Vizier { call: Box<VizierCall>, reply: Reply<VizierAnswer> },
    /// A write of Vertex ML Metadata or TensorBoard (`crate::records`): run on the store
    /// here, its one writer.
    Records { method: crate::records::dispatch::Method, req: Box<crate::records::ops::Request>, reply: Reply<serde_json::Value> },
    /// What a pass over a job's TensorBoard event files read (`crate::ingest`): written
    /// as time series with the files' offsets.
    Ingest { batch: Box<crate::records::ingest::Batch>, reply: Reply<()> },
    /// Delete an ended resource of a kind: answered with the done Operation; its files
    /// are purged through the outbox.
    Delete { kind: Kind, project: String, region: String, id: u64, reply: Reply<serde_json::Value> },
    Shutdown,
}

/// CPU seconds a replica must use between two looks to count as going on.
const CPU_EPSILON: f64 = 0.05;

/// The kind of waiting reason the engine gives (see `Decision::Wait`).
const ENGINE_WAIT: &str = "engine";

/// Administration requests (nodes and quotas).
#[derive(Clone, Debug)]
pub enum Admin {
    ListNodes,
    GetNode(String),
    /// L9: the node goes into maintenance: its replicas get SIGTERM and the grace period,
    /// then restart on other nodes with the same names and addresses.
    Drain(String),
    Undrain(String),
    Quotas,
    /// Read the quota limits again from the config file.
    ReloadQuotas,
    /// Usage accounting: per project and accelerator type, and per hour.
    Usage(UsageQuery),
}

pub use accounting::UsageQuery;

/// Everything the driver needs that is not a job.
pub struct Services {
    pub cfg: Config,
    pub catalog: Catalog,
    pub backend: Arc<dyn Backend>,
    /// Extra directories (besides the storage root) that jobs may write outputs to.
    pub output_roots: Vec<PathBuf>,
    /// Working directory of replicas' programs.
    pub workdir: PathBuf,
    /// The shell environment passed on to programs (PATH, HOME, ...).
    pub base_env: Vec<(String, String)>,
    /// The command of virtual nodes' agents (`[trainyard, "node-agent"]`), when the fleet
    /// declares virtual nodes.
    pub node_agent: Option<Vec<std::ffi::OsString>>,
    /// The engine replicas with an image run in; `None`: host processes.
    pub containers: Option<crate::containers::ContainerEngine>,
    /// Host programs see the project's buckets at /gcs through a mount namespace (root,
    /// and /gcs exists); otherwise /gcs/ in their command and args is rewritten.
    pub gcs_mount: bool,
    /// Replicas of per-project users get a `/tmp` of their own (with `gcs_mount`, unless a
    /// directory they need lies under the host's /tmp: see `private_tmp_possible`).
    pub private_tmp: bool,
    /// The GPU inventory of each node that has one (discovered at start).
    pub gpus: BTreeMap<String, trainyard_core::gpu::Inventory>,
    /// In tokens mode, the credentials given to jobs (accepted while their job is live).
    pub job_credentials: Option<Arc<crate::auth::JobCredentials>>,
    /// Per-project storage limits and sizes (`storage_gb`), shared with the Cloud Storage
    /// endpoint.
    pub storage_usage: Arc<crate::storage::usage::StorageUsage>,
}

struct Live {
    job: Job,
    resource: CustomJob,
    /// The kind of the last waiting reason written to the job's log (see
    /// `Decision::Wait`): a reason is stored and logged when its kind changes, not when a
    /// position number moves.
    waiting: Option<&'static str>,
}

/// A CustomJob to create (from the API, or a study's trial).
pub struct NewCustomJob {
    pub project: String,
    pub region: String,
    pub resource: CustomJob,
    pub trial: Option<trainyard_core::job::TrialLink>,
    /// The TrainingPipeline the job runs for.
    pub pipeline: Option<u64>,
}

pub struct Driver {
    svc: Arc<Services>,
    store: Store,
    jobs: BTreeMap<u64, Live>,
    deadlines: BTreeSet<(Micros, u64)>,
    deadline_of: HashMap<u64, Micros>,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// Something changed that may let a waiting job be placed.
    reschedule: bool,
    /// The nodes and their state (drained, down); starts from the config.
    fleet: Fleet,
    /// Quota limits; read again from the config file on request.
    quotas: Quotas,
    /// Priority classes (and projects' defaults); read again with the quotas.
    priorities: trainyard_core::schedule::PriorityClasses,
    /// Fair share with memory: each project's past use, when it was last aged, and when it
    /// was last stored (see `fleet::age_usage`).
    usage_history: BTreeMap<String, trainyard_core::schedule::UsageHistory>,
    history_at: Micros,
    history_saved: Micros,
    /// What each project's jobs held after the last round.
    last_held: BTreeMap<String, trainyard_core::schedule::UsageHistory>,
    /// Usage accounting: accrued and not yet stored, when it was last stored, and (while
    /// loading at a start) the time up to which it had been stored.
    ledger: crate::accounting::Ledger,
    usage_flushed: Micros,
    usage_resumed: Option<Micros>,
    /// Live HyperparameterTuningJobs.
    studies: BTreeMap<u64, LiveStudy>,
    /// Study events waiting to be applied (from trial jobs' transitions).
    study_events: Vec<(u64, study::Event)>,
    pipelines: BTreeMap<u64, pipelines::LivePipeline>,
    /// Pipelines' events from their jobs, applied at the next turn.
    pipeline_events: Vec<(u64, crate::kinds::pipelines::Event)>,
    /// When trials' metric files were last read.
    last_metric_poll: Micros,
    /// A read of trials' metric files is under way (off this thread).
    metric_read_in_flight: bool,
    /// Launches put off while the engine could not take them.
    later: Vec<launch::Later>,
    /// Outbox entries carried out this turn, dropped from the store in one transaction at
    /// its end (see [`Driver::effects_done`]).
    effects_done: Vec<i64>,
    /// Purges that failed, by outbox entry: how many times, and when they are tried again
    /// (with `Effect::Purge`'s job).
    purge_tries: HashMap<i64, launch::PurgeRetry>,
    /// When launching runs last asked the backend why they wait.
    last_backend_poll: Micros,
    /// The engine is being asked why runs wait (off this thread).
    engine_reasons_in_flight: bool,
    /// L22: a sweep's removal of old logs is under way (off this thread).
    log_purge_in_flight: bool,
    /// Scheduling rounds are coalesced: the next one runs no sooner than this (a few times
    /// the last round's cost after it), so that a long queue cannot make every event pay
    /// for a whole round. A monotonic reading of the clock: a budget of the driver's CPU,
    /// not a rule.
    next_round: Duration,
    /// When a round may decide differently with nothing else changed (a running job
    /// becomes preemptible or reclaimable: `schedule::next_change`).
    round_at: Option<Micros>,
    /// What the last scheduling round cost (µs): creates wait for a cheap one before
    /// they are answered, never for an expensive one (see `create_batch`).
    last_round_cost: Micros,
    /// Waiting reasons of the last round, for readers.
    waiting_view: Arc<WaitingView>,
    /// Waiting reasons given by the engine (launches it holds up), merged into the view.
    engine_reasons: HashMap<u64, Arc<str>>,
    /// Carries effects out off this thread.
    exec: Arc<dyn Executor>,
    /// Stops in flight, until their runs are seen gone (L20).
    stops: HashMap<RunId, stops::StopTrack>,
    /// GPUs of a node's inventory that nvidia-smi no longer lists (the node is degraded).
    gpus_missing: BTreeMap<String, BTreeSet<String>>,
    /// Bad nodes kept out (`[fleet] quarantine_after_failures`): recent failures per
    /// node, and the nodes quarantined with what quarantined them.
    quarantine: trainyard_core::quarantine::Tracker,
    quarantined: BTreeMap<String, fleet::Quarantined>,
    /// Hang detection: each watched replica's CPU seconds at the last look (with its
    /// attempt and restart): CPU time used since is progress.
    cpu_seen: HashMap<u64, HashMap<String, (u32, u32, f64)>>,
    /// Progress and ETA (see `progress`): per running job, what was read of its progress
    /// file; a read under way; when the files were last read.
    progress: HashMap<u64, progress::JobProgress>,
    progress_in_flight: bool,
    last_progress_poll: Micros,
    /// L22 retention: when the logs of ended jobs are next looked at.
    next_log_sweep: Micros,
    /// When the network namespaces of ended jobs are next looked for.
    next_netns_sweep: Micros,
    /// The highest id of a job this driver has held live: a network namespace of a job up
    /// to it that is not live is one of a job that ended (ids are never reused).
    newest_job: u64,
    clock: Arc<dyn Clock>,
    /// Liveness for `/healthz` and the API.
    health: Arc<Health>,
    /// Nodes whose agents are watched.
    watched_nodes: HashSet<String>,
    /// Live jobs per project (`limits.max_live_jobs_per_project`).
    live_per_project: HashMap<String, usize>,
    /// Observations of jobs' files under way (off this thread: L21 checkpoint scans, hang
    /// detection's latest writes), by job, and when they were asked.
    scans: HashMap<u64, Micros>,
    /// A store error that a request was answered with: at the end of the turn the driver
    /// waits it out (`survive`) like any other.
    fault: std::cell::RefCell<Option<StoreError>>,
    /// What `/metrics` shows, kept up to date on each change.
    metrics: Arc<crate::metrics::Metrics>,
    /// Vizier studies whose suggestions are being computed: project, region and the
    /// pending request's operation.
    vizier_running: HashMap<u64, (String, String, u64)>,
    /// Requests waiting for a suggest Operation to be done, by operation.
    vizier_waiters: HashMap<u64, Vec<tokio::sync::oneshot::Sender<serde_json::Value>>>,
}

/// Where the driver reads the time: the system clock, or a virtual one in tests.
pub trait Clock: Send + Sync {
    /// The wall clock: the time of rules (deadlines, backoffs, timestamps).
    fn now(&self) -> Micros;

    /// A monotonic reading, for pacing and measuring the driver's own work (the cost of a
    /// scheduling round, the pause after a panic), never a rule's time. By default the
    /// process's monotonic clock since its first reading.
    fn monotonic(&self) -> Duration {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed()
    }
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        now_micros()
    }
}

/// How long one turn of the loop may wait for a message.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Whether the loop goes on.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

struct LiveStudy {
    study: Study,
    resource: HyperparameterTuningJob,
    cfg: StudyConfig,
}

/// Microseconds since the Unix epoch, by the wall clock.
pub fn now_micros() -> Micros {
    trainyard_backend::now_micros()
}

pub use crate::datadir::run_dir;


/// Backend events into the driver's channel.
fn event_sink(tx: &Sender<Msg>) -> EventSink {
    let tx = Mutex::new(tx.clone());
    Arc::new(move |ev| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(Msg::Backend(ev));
        }
    })
}

/// What a panic said, for the log and the health check.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

/// A store error as the API answers it: 503 with the reason while it may pass (a full
/// disk), else an internal error.
fn api_error(e: &StoreError) -> ApiError {
    tracing::error!("store: {e}");
    if e.is_transient() {
        return ApiError::unavailable(format!("The server cannot write its job store now ({}); try again shortly.", e.reason()));
    }
    if let StoreError::Fenced(who) = e {
        return ApiError::unavailable(format!("This server no longer writes its job store: {who}."));
    }
    ApiError::internal("Internal error: the job store failed; see the server log.")
}

/// A request that arrives while the store cannot be written: answered 503 with the reason.
/// Backend events and executor reports are dropped: the resync reads them back from the
/// run directories and the outbox.
fn refuse(msg: Msg, reason: &str) -> Flow {
    let no = || ApiError::unavailable(format!("The server cannot write its job store now ({reason}); try again shortly."));
    match msg {
        Msg::Create { new, .. } => new.refuse(no()),
        Msg::Cancel { reply, .. } => drop(reply.send(Err(no()))),
        Msg::Admin { reply, .. } | Msg::Delete { reply, .. } => drop(reply.send(Err(no()))),
        Msg::Vizier { reply, .. } => drop(reply.send(Err(no()))),
        Msg::Records { reply, .. } => drop(reply.send(Err(no()))),
        Msg::Ingest { reply, .. } => drop(reply.send(Err(no()))),
        Msg::Shutdown => return Flow::Stop,
        // A suggestion that cannot be stored now is computed again by the resync.
        Msg::Backend(_) | Msg::Executed(_) | Msg::NodeLost(_) | Msg::GpusSeen(..) | Msg::StorageFull(_) => {}
    }
    Flow::Continue
}

impl Driver {
    /// Open the driver on a store, with the system clock and a threaded executor on the
    /// services' backend; `start` recovers the live jobs (L23).
    pub fn new(svc: Arc<Services>, store: Store) -> (Driver, Sender<Msg>) {
        let backend = Arc::clone(&svc.backend);
        let nice = svc.cfg.replicas.nice;
        Driver::with_parts(svc, store, Arc::new(SystemClock), move |sink, report| {
            Arc::new(crate::executor::Pool::new(backend, sink, report, nice))
        })
    }

    /// The driver with its clock and executor given (tests use a virtual clock and a fake
    /// backend). `make_exec` gets where backend events and executor reports go.
    pub fn with_parts(
        svc: Arc<Services>,
        store: Store,
        clock: Arc<dyn Clock>,
        make_exec: impl FnOnce(EventSink, crate::executor::ReportSink) -> Arc<dyn Executor>,
    ) -> (Driver, Sender<Msg>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = event_sink(&tx);
        let report_tx = Mutex::new(tx.clone());
        let report: crate::executor::ReportSink = Arc::new(move |r| {
            if let Ok(tx) = report_tx.lock() {
                let _ = tx.send(Msg::Executed(r));
            }
        });
        let exec = make_exec(sink, report);
        let d = Driver {
            svc: Arc::clone(&svc),
            store,
            jobs: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            deadline_of: HashMap::new(),
            tx: tx.clone(),
            rx,
            reschedule: true,
            fleet: svc.cfg.fleet.clone(),
            quotas: svc.cfg.quotas.clone(),
            priorities: svc.cfg.priority_classes.clone(),
            usage_history: BTreeMap::new(),
            ledger: crate::accounting::Ledger::default(),
            usage_flushed: 0,
            usage_resumed: None,
            history_at: 0,
            history_saved: 0,
            last_held: BTreeMap::new(),
            studies: BTreeMap::new(),
            study_events: Vec::new(),
            pipelines: BTreeMap::new(),
            pipeline_events: Vec::new(),
            last_metric_poll: 0,
            metric_read_in_flight: false,
            later: Vec::new(),
            effects_done: Vec::new(),
            purge_tries: HashMap::new(),
            last_backend_poll: 0,
            engine_reasons_in_flight: false,
            log_purge_in_flight: false,
            next_round: Duration::ZERO,
            round_at: None,
            last_round_cost: 0,
            waiting_view: Arc::new(WaitingView::default()),
            engine_reasons: HashMap::new(),
            exec,
            stops: HashMap::new(),
            gpus_missing: BTreeMap::new(),
            quarantine: trainyard_core::quarantine::Tracker::new(
                svc.cfg.quarantine.after_failures,
                trainyard_core::job::secs(svc.cfg.quarantine.window_secs),
            ),
            quarantined: BTreeMap::new(),
            cpu_seen: HashMap::new(),
            progress: HashMap::new(),
            progress_in_flight: false,
            last_progress_poll: 0,
            next_log_sweep: 0,
            next_netns_sweep: 0,
            newest_job: 0,
            clock,
            health: Arc::new(Health::default()),
            watched_nodes: HashSet::new(),
            live_per_project: HashMap::new(),
            scans: HashMap::new(),
            fault: std::cell::RefCell::new(None),
            metrics: Arc::new(if svc.cfg.metrics_enabled {
                crate::metrics::Metrics::with_data_dir(Some(svc.cfg.data_dir.clone()))
            } else {
                crate::metrics::Metrics::disabled()
            }),
            vizier_running: HashMap::new(),
            vizier_waiters: HashMap::new(),
        };
        (d, tx)
    }

    /// The driver's liveness, for `/healthz` and the API.
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The metrics the driver keeps, for `/metrics`.
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Time a store transaction for `/metrics`.
    pub(super) fn timed<T>(metrics: &crate::metrics::Metrics, op: &str, f: impl FnOnce() -> T) -> T {
        let began = std::time::Instant::now();
        let v = f();
        metrics.store_commit(op, began.elapsed());
        v
    }

    /// Ended CustomJobs by project and state, counted once at a start (a covering index
    /// of `jobs`; never at a scrape).
    fn count_ended(&mut self) -> Result<(), StoreError> {
        let rows = self.store.ended_counts()?;
        for (project, state, n) in rows {
            self.metrics.add_ended(&project, &state, n);
        }
        Ok(())
    }

    /// A store error met while answering a request: answered now, dealt with at the end
    /// of the turn.
    fn store_err(&self, e: StoreError) -> ApiError {
        let answer = api_error(&e);
        // Transient: the turn ends in the store's recovery. Fenced (another server took
        // the store's writer lock): the turn ends and the driver stops writing.
        if e.is_transient() || matches!(e, StoreError::Fenced(_)) {
            self.fault.borrow_mut().get_or_insert(e);
        }
        answer
    }

    /// The time, from the driver's clock.
    pub(super) fn now(&self) -> Micros {
        self.clock.now()
    }

    /// The waiting reasons readers show (positions move without being written).
    pub fn waiting_view(&self) -> Arc<WaitingView> {
        Arc::clone(&self.waiting_view)
    }

    fn sink(&self) -> EventSink {
        event_sink(&self.tx)
    }

    /// L23: load every live job, adopt the runs that may still be alive, and finish the
    /// effects that were committed but not carried out.
    pub fn recover(&mut self) -> Result<(), StoreError> {
        let names: Vec<String> = self.fleet.nodes.iter().map(|n| n.name.clone()).collect();
        for n in names {
            self.watch_node(&n);
        }
        self.metrics.reset_jobs();
        self.metrics.set_fleet(&self.fleet);
        self.load_usage_history()?;
        self.resume_usage()?;
        self.quarantined.clear();
        self.load_quarantine()?;
        for stored in self.store.active_jobs()? {
            let id = stored.job.id;
            let resource = match (&stored.damage, serde_json::from_str::<CustomJob>(&stored.resource)) {
                (None, Ok(r)) => r,
                (Some(damage), _) => {
                    self.quarantine(id, damage)?;
                    continue;
                }
                (None, Err(e)) => {
                    self.quarantine(id, &format!("its resource: {e}"))?;
                    continue;
                }
            };
            self.insert_live(id, Live { job: stored.job, resource, waiting: None });
            self.index_deadline(id);
        }
        // After the quarantines above, which end jobs.
        self.count_ended()?;
        self.usage_resumed()?;
        let (pending, damaged) = self.store.pending_outbox()?;
        for (seq, job, damage) in damaged {
            // An effect that cannot be read cannot be carried out; its job's runs are
            // adopted (or lost) by their state like any other's.
            tracing::error!("job {job}: outbox entry {seq} is damaged and dropped: {damage}");
            self.store.outbox_done(seq)?;
        }
        let launching: HashSet<RunId> = pending
            .iter()
            .filter_map(|(_, _, e)| match e {
                Effect::Launch { run, .. } => Some(run.clone()),
                _ => None,
            })
            .collect();
        let sink = self.sink();
        let mut adopted = 0;
        for live in self.jobs.values() {
            for r in live.job.live_replicas() {
                let run = RunId { job: live.job.id, attempt: live.job.attempt, replica: r.name.clone(), restart: r.restart };
                if launching.contains(&run) {
                    continue;
                }
                let dir = run_dir(&self.svc.cfg.data_dir, &run);
                match self.svc.backend.adopt(run.clone(), dir, sink.clone()) {
                    Ok(()) => adopted += 1,
                    Err(e) => {
                        tracing::error!("{run}: cannot adopt: {e}");
                        let _ = self.tx.send(Msg::Backend(BackendEvent::Exited {
                            run,
                            outcome: Outcome::Lost { message: format!("could not be adopted after a restart: {e}") },
                            stderr_tail: Vec::new(),
                        }));
                    }
                }
            }
        }
        // What they hold counts in the fair share's history from the stored one's time on.
        self.last_held = self.holdings();
        tracing::info!("recovered {} live jobs, adopted {adopted} runs, {} pending effects", self.jobs.len(), pending.len());
        let mut by_job: BTreeMap<u64, Vec<(i64, Effect)>> = BTreeMap::new();
        for (seq, job, effect) in pending {
            by_job.entry(job).or_default().push((seq, effect));
        }
        for (job, effects) in by_job {
            self.execute(job, effects);
        }
        self.recover_studies()?;
        self.recover_pipelines()?;
        self.recover_vizier()?;
        Ok(())
    }

    /// A live job whose record cannot be read is quarantined, not fatal: it is stored
    /// FAILED with an internal error naming the damage (deletable, listed), and every run
    /// found under its run directory is killed (L20).
    fn quarantine(&mut self, id: u64, damage: &str) -> Result<(), StoreError> {
        tracing::error!("job {id}: the stored record is damaged ({damage}); it is marked FAILED and its runs are stopped");
        let now = self.now();
        self.store.quarantine(id, damage, now)?;
        // Its run directories are listed by the executor (a directory read is never the
        // driver's), each run killed as a `Work::Kill` would.
        self.exec.submit(crate::executor::Work::KillRunsOf { job: id, data_dir: self.svc.cfg.data_dir.clone() });
        Ok(())
    }

    /// Run until `Shutdown` or until every sender is gone. A store that cannot be written
    /// now (a full disk, an I/O error) is waited out: the API answers 503 with the reason,
    /// and once a write succeeds again the driver goes on from the state on disk (L23).
    /// A store that cannot be used at all ends the driver with the reason, and the process
    /// exits non-zero.
    pub fn run(mut self) -> Result<(), StoreError> {
        loop {
            match self.guarded_turn(MAX_WAIT) {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => {
                    // What accrued since the last store (a start goes on from it).
                    let now = self.now();
                    if let Err(e) = self.flush_usage(now, true) {
                        tracing::warn!("usage accounting: the last usage could not be stored: {}", e.reason());
                    }
                    return Ok(());
                }
                Err(e) if e.is_transient() => {
                    if self.survive(e)? == Flow::Stop {
                        return Ok(());
                    }
                }
                Err(e) => {
                    tracing::error!("the driver stops: {}", e.reason());
                    self.health.set(HealthState::Stopped(e.reason()));
                    return Err(e);
                }
            }
        }
    }

    /// One [`turn`](Self::turn), where a panic (a defect) does not end the driver: it is
    /// logged (and counted by the process's hook, `trainyard_panics_total`), what is in
    /// memory is dropped and recovered from the store as at a start (L23), and the driver
    /// goes on. The turn's messages are lost with it: a request's reply is dropped (its
    /// caller gets an error), and what a backend event or an executor report said is read
    /// back by the recovery (runs adopted again, pending effects carried out again). A
    /// recovery that panics too is tried again after a pause that doubles (up to 30 s),
    /// answering requests with 503 meanwhile.
    pub fn guarded_turn(&mut self, max_wait: Duration) -> Result<Flow, StoreError> {
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.turn(max_wait)));
        let payload = match turn {
            Ok(r) => return r,
            Err(payload) => payload,
        };
        let mut what = panic_text(payload.as_ref());
        // The first recovery at once, then after each panic of a recovery a longer pause.
        let mut failures = 0;
        loop {
            let reason = format!("the driver panicked ({what}); recovering its state from the store");
            tracing::error!("{reason}");
            self.health.set(HealthState::Degraded(reason.clone()));
            let until = self.clock.monotonic() + RECOVERY.pause(failures);
            loop {
                if self.refuse_queued(&reason) == Flow::Stop {
                    return Ok(Flow::Stop);
                }
                self.health.beat();
                let left = until.saturating_sub(self.clock.monotonic());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(100)));
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.resync())) {
                Ok(Ok(())) => {
                    tracing::info!("the driver recovered from a panic and goes on");
                    self.health.set(HealthState::Ok);
                    return Ok(Flow::Continue);
                }
                Ok(Err(e)) => return Err(e),
                Err(payload) => {
                    what = panic_text(payload.as_ref());
                    failures += 1;
                }
            }
        }
    }

    /// Wait until the store can be written again, answering every request meanwhile with
    /// 503 and the reason; then reload every live job from the store and adopt its runs,
    /// as after a restart (what happened meanwhile is read back from the run directories).
    fn survive(&mut self, error: StoreError) -> Result<Flow, StoreError> {
        let reason = error.reason();
        tracing::error!("{reason}; answering 503 and trying again until it passes");
        self.health.set(HealthState::Degraded(reason.clone()));
        let mut failures = 0;
        loop {
            self.health.beat();
            if self.refuse_queued(&reason) == Flow::Stop {
                return Ok(Flow::Stop);
            }
            let now = self.now();
            let probed = self.store.probe_write(now);
            if let Err(e @ StoreError::Fenced(_)) = probed {
                // Another server took the store over while it was out of reach: this one
                // never writes it again.
                tracing::error!("the driver stops: {}", e.reason());
                self.health.set(HealthState::Stopped(e.reason()));
                return Err(e);
            }
            if probed.is_ok() {
                match self.resync() {
                    Ok(()) => break,
                    Err(e) if e.is_transient() => {}
                    Err(e) => {
                        tracing::error!("the driver stops: {}", e.reason());
                        self.health.set(HealthState::Stopped(e.reason()));
                        return Ok(Flow::Stop);
                    }
                }
            }
            failures += 1;
            std::thread::sleep(STORE_PROBE.pause(failures));
        }
        tracing::info!("the store can be written again; going on");
        self.health.set(HealthState::Ok);
        Ok(Flow::Continue)
    }

    /// Every request queued now answered 503 with `reason` (see [`refuse`]); Stop when a
    /// shutdown was among them.
    fn refuse_queued(&self, reason: &str) -> Flow {
        while let Ok(msg) = self.rx.try_recv() {
            if refuse(msg, reason) == Flow::Stop {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// Forget what is in memory and recover it from the store, as at a start (L23).
    fn resync(&mut self) -> Result<(), StoreError> {
        self.jobs.clear();
        self.live_per_project.clear();
        self.deadlines.clear();
        self.deadline_of.clear();
        self.studies.clear();
        self.study_events.clear();
        self.pipelines.clear();
        self.pipeline_events.clear();
        self.fault.replace(None);
        self.metric_read_in_flight = false;
        self.engine_reasons_in_flight = false;
        self.progress_in_flight = false;
        self.progress.clear();
        self.cpu_seen.clear();
        self.log_purge_in_flight = false;
        self.later.clear();
        // Read back from the outbox by the recovery, and carried out again.
        self.effects_done.clear();
        self.stops.clear();
        self.engine_reasons.clear();
        self.scans.clear();
        self.reschedule = true;
        self.recover()
    }

    /// One turn of the loop: timers that are due, a scheduling round if one is wanted,
    /// then the messages that arrive within `max_wait` (or before the next timer); at its
    /// end, the outbox entries it carried out are dropped.
    pub fn turn(&mut self, max_wait: Duration) -> Result<Flow, StoreError> {
        let flow = self.turn_body(max_wait);
        self.drop_effects_done();
        flow
    }

    /// Outbox entries carried out: dropped from the store at the end of the turn, all in
    /// one transaction, instead of one transaction each time some were (in a burst of
    /// short jobs, several per job: its log lines, its launch). Lost in a crash, they are
    /// carried out again at the start, which is always safe (see
    /// `Store::outbox_done_many`).
    pub(super) fn effects_done(&mut self, seqs: &[i64]) {
        self.effects_done.extend_from_slice(seqs);
    }

    fn drop_effects_done(&mut self) {
        if self.effects_done.is_empty() {
            return;
        }
        let done = std::mem::take(&mut self.effects_done);
        if let Err(e) = self.store.outbox_done_many(&done) {
            // Left in the outbox: carried out again at the next start.
            tracing::error!("outbox: {e}");
        }
    }

    fn turn_body(&mut self, max_wait: Duration) -> Result<Flow, StoreError> {
        self.health.beat();
        let now = self.now();
        self.on_time(now)?;
        self.poll_trial_metrics(now);
        self.poll_progress(now);
        self.drain_study_events(now)?;
        self.drain_pipeline_events(now)?;
        self.sweep_logs(now)?;
        self.sweep_netns(now);
        self.retry_later_launches(now);
        self.retry_purges(now);
        self.stop_timers(now);
        self.poll_backend_reasons(now)?;
        self.maybe_schedule(now)?;
        self.flush_usage(now, false)?;
        let mut next = self.deadlines.first().map(|&(t, _)| t);
        let purge_at = self.purge_tries.values().filter_map(|p| p.at).min();
        for t in [self.later.iter().map(|l| l.at).min(), self.next_stop_timer(), purge_at, self.round_at].into_iter().flatten() {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let mut wait = next.map_or(max_wait, |t| Duration::from_micros((t - self.now()).max(0) as u64).min(max_wait));
        if self.reschedule {
            wait = wait.min(self.next_round.saturating_sub(self.clock.monotonic()));
        }
        let starting = self.jobs.values().any(|l| matches!(l.job.phase, Phase::Pending { wait: trainyard_core::job::Wait::Starting, .. }));
        if !self.studies.is_empty() || starting {
            // Trials' metric files, and the engine's word on replicas still starting,
            // are read about once a second.
            wait = wait.min(Duration::from_millis(500));
        }
        let first = match self.rx.recv_timeout(wait) {
            Ok(msg) => msg,
            Err(RecvTimeoutError::Timeout) => return Ok(Flow::Continue),
            Err(RecvTimeoutError::Disconnected) => return Ok(Flow::Stop),
        };
        // Take whatever else is already queued, before the next scheduling round.
        let mut queued = vec![first];
        while let Ok(msg) = self.rx.try_recv() {
            queued.push(msg);
        }
        // Replicas that started or ended: one transaction for all of them (L7, L23).
        let mut replicas = Vec::new();
        let mut exits = Vec::new();
        let mut creates = Vec::new();
        for msg in queued {
            match msg {
                Msg::Shutdown => return Ok(Flow::Stop),
                Msg::Backend(BackendEvent::Started { run, .. }) => replicas.push((run.job, Event::Started { run })),
                Msg::Backend(BackendEvent::Exited { run, outcome, stderr_tail }) => exits.push((run, outcome, stderr_tail)),
                // Creates that arrive together are stored together (group commit).
                Msg::Create { project, region, new: Create::CustomJob { resource, reply } } => {
                    creates.push((NewCustomJob { project, region, resource: *resource, trial: None, pipeline: None }, reply))
                }
                other => {
                    self.flush(std::mem::take(&mut creates), std::mem::take(&mut replicas), std::mem::take(&mut exits))?;
                    self.handle(other)?;
                }
            }
        }
        self.flush(creates, replicas, exits)?;
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        Ok(Flow::Continue)
    }

    /// What a turn gathered: the creates first (their clients wait for the answer; the
    /// jobs are independent of the replicas' events), then the replicas that started, then
    /// those that ended.
    fn flush(
        &mut self,
        creates: Vec<(NewCustomJob, Reply<CustomJob>)>,
        replicas: Vec<(u64, Event)>,
        exits: Vec<(RunId, Outcome, Vec<String>)>,
    ) -> Result<(), StoreError> {
        if !creates.is_empty() {
            let now = self.now();
            self.create_batch(creates, now)?;
        }
        let now = self.now();
        self.apply_many(replicas, now)?;
        self.apply_exited(exits)
    }

    /// A scheduling round if one is wanted and its time has come.
    fn maybe_schedule(&mut self, now: Micros) -> Result<(), StoreError> {
        if self.round_at.is_some_and(|t| t <= now) {
            self.round_at = None;
            self.reschedule = true;
        }
        if !self.reschedule || self.clock.monotonic() < self.next_round {
            return Ok(());
        }
        self.reschedule = false;
        let cost = self.schedule_round(now)?;
        self.last_round_cost = cost;
        // Deciding takes at most about a fifth of the driver's time, however long the queue.
        self.next_round = self.clock.monotonic() + Duration::from_micros(4 * cost.max(0) as u64);
        Ok(())
    }

    /// Replicas that ended, applied together (one transaction for all, see
    /// `apply_many`).
    fn apply_exited(&mut self, exits: Vec<(RunId, Outcome, Vec<String>)>) -> Result<(), StoreError> {
        if exits.is_empty() {
            return Ok(());
        }
        let mut events = Vec::with_capacity(exits.len());
        for (run, outcome, stderr_tail) in exits {
            if matches!(outcome, Outcome::OomKilled { .. }) {
                self.metrics.oom_killed();
            }
            self.run_gone(&run)?;
            events.push((run.job, Event::Exited { run, outcome, stderr_tail }));
        }
        let now = self.now();
        self.apply_many(events, now)
    }

    fn handle(&mut self, msg: Msg) -> Result<(), StoreError> {
        let now = self.now();
        match msg {
            Msg::Create { project, region, new } => self.create(project, region, new, now)?,
            Msg::Cancel { kind, project, region, id, reply } => {
                let r = match kind {
                    Kind::CustomJob => self.cancel(&project, &region, id, now),
                    Kind::TuningJob => self.cancel_study(&project, &region, id, now),
                    Kind::Pipeline => self.cancel_pipeline(&project, &region, id, now),
                };
                let _ = reply.send(r);
            }
            Msg::Backend(BackendEvent::Started { run, .. }) => self.apply_many(vec![(run.job, Event::Started { run })], now)?,
            Msg::Backend(BackendEvent::Exited { run, outcome, stderr_tail }) => self.apply_exited(vec![(run, outcome, stderr_tail)])?,
            Msg::Executed(report) => match report {
                crate::executor::Report::Launched { seqs } => self.effects_done(&seqs),
                crate::executor::Report::Purged { seq, error: None } => {
                    self.purge_tries.remove(&seq);
                    self.store.outbox_done(seq)?
                }
                crate::executor::Report::Purged { seq, error: Some(error) } => self.purge_failed(seq, error, now)?,
                crate::executor::Report::LogsPurged { cutoff } => self.logs_purged(cutoff)?,
                crate::executor::Report::LaunchLater { run, seq, reason } => self.launch_later(run, seq, reason, now)?,
                crate::executor::Report::Observed { job, newest, activity, .. } => self.observed(job, newest, activity, now)?,
                crate::executor::Report::TrialMetrics { reads, periodic } => self.trial_metrics_read(reads, periodic),
                crate::executor::Report::EngineReasons(heard) => self.engine_reasons_heard(heard, now)?,
                crate::executor::Report::ProgressRead(seen) => self.progress_read(seen, now)?,
                crate::executor::Report::Suggested { study, result } => self.study_events.push((study, study::Event::Suggested(result))),
                crate::executor::Report::VizierSuggested { study, op, result } => self.vizier_suggested(study, op, result, now),
                crate::executor::Report::TenantCpu { project, work, seconds } => self.metrics.tenant_cpu(&project, work, seconds),
                other => self.stop_report(other, now),
            },
            Msg::NodeLost(node) => {
                self.watched_nodes.remove(&node);
                self.lose_node(&node, now)?
            }
            Msg::GpusSeen(present, faults) => {
                self.gpu_faults(faults, now);
                self.gpus_seen(present, now)?
            }
            Msg::StorageFull(full) => self.storage_full(full, now)?,
            Msg::Admin { req, reply } => {
                let r = self.admin(req, now);
                let _ = reply.send(r);
            }
            Msg::Delete { kind, project, region, id, reply } => {
                let r = self.delete(kind, &project, &region, id, now);
                let _ = reply.send(r);
            }
            Msg::Vizier { call, reply } => {
                let r = self.vizier(*call, now);
                let _ = reply.send(r);
            }
            Msg::Records { method, req, reply } => {
                let r = crate::records::dispatch::write(&mut self.store, method, &req, now);
                let _ = reply.send(r);
            }
            Msg::Ingest { batch, reply } => {
                let r = crate::records::ingest::apply(&mut self.store, &batch, now);
                let _ = reply.send(r);
            }
            Msg::Shutdown => {}
        }
        Ok(())
    }

    /// A create of any kind; CustomJobs that arrive together go through `create_batch`.
    fn create(&mut self, project: String, region: String, new: Create, now: Micros) -> Result<(), StoreError> {
        match new {
            Create::CustomJob { resource, reply } => {
                self.create_batch(vec![(NewCustomJob { project, region, resource: *resource, trial: None, pipeline: None }, reply)], now)?
            }
            Create::TuningJob { resource, reply } => {
                let r = self.create_study(project, region, *resource, now);
                let _ = reply.send(r);
            }
            Create::Pipeline { resource, reply } => {
                let r = self.create_pipeline(project, region, *resource, now);
                let _ = reply.send(r);
            }
        }
        Ok(())
    }

    /// Cancel a HyperparameterTuningJob: its trials' jobs are stopped.
    fn cancel_study(&mut self, project: &str, region: &str, id: u64, now: Micros) -> Result<(), ApiError> {
        let owned = self.studies.get(&id).is_some_and(|l| l.study.project == project && l.study.region == region);
        if owned {
            return self.apply_study(id, study::Event::Cancel, now);
        }
        let name = study_name(project, region, id);
        match self.store.get_other(KIND_STUDY, project, region, id).map_err(|e| self.store_err(e))? {
            Some(_) => Err(ApiError::failed_precondition(format!("The HyperparameterTuningJob \"{name}\" has ended and cannot be cancelled."))),
            None => Err(ApiError::not_found(format!("The HyperparameterTuningJob \"{name}\" does not exist."))),
        }
    }
}

/// A create names the one region this server serves, or is refused naming both.
pub(crate) fn served_region(region: &str, served: &str) -> Result<(), ApiError> {
    if region == served {
        return Ok(());
    }
    Err(ApiError::invalid_argument(format!("Region \"{region}\" is not served here; this server serves \"{served}\".")))
}

/// The store's key of the end time up to which ended jobs' logs were removed.
const LOGS_SWEPT: &str = "logs_swept_through";
const NETNS_SWEEP_EVERY: Micros = 10_000_000;

impl Driver {
    /// L22 retention (`[lifecycle] log_retention_secs`): the output logs of CustomJobs that
    /// ended longer ago than that are removed, off this thread; their records and
    /// lifecycle events stay. Looked at every half retention period, at most hourly.
    /// The network namespaces of jobs that have ended (`[replicas] network = "job"`, a
    /// job's replicas are all gone once it is terminal, L20), also of those that ended
    /// while the server was down, are removed every `NETNS_SWEEP_EVERY`.
    fn sweep_netns(&mut self, now: Micros) {
        if self.svc.cfg.replicas.network != crate::config::Network::Job || now < self.next_netns_sweep {
            return;
        }
        self.next_netns_sweep = now + NETNS_SWEEP_EVERY;
        // Listed and removed by the executor (a directory read is never the driver's).
        let dir = launch::netns_dir(&self.svc.cfg.data_dir);
        let live = self.jobs.keys().copied().collect();
        let known = self.newest_job;
        self.exec.submit(crate::executor::Work::RemoveNetns { dir, live, known });
    }

    fn sweep_logs(&mut self, now: Micros) -> Result<(), StoreError> {
        let keep = self.svc.cfg.settings.log_retention_secs;
        if keep == 0 || now < self.next_log_sweep {
            return Ok(());
        }
        let keep = (keep as Micros).saturating_mul(1_000_000);
        self.next_log_sweep = now + (keep / 2).clamp(1_000_000, 3_600_000_000);
        let cutoff = now - keep;
        let after: Micros = self.store.meta(LOGS_SWEPT)?.and_then(|v| v.parse().ok()).unwrap_or(0);
        if cutoff <= after {
            return Ok(());
        }
        if self.log_purge_in_flight {
            return Ok(());
        }
        let ids = self.store.ended_between(KIND_CUSTOM, after, cutoff)?;
        if ids.is_empty() {
            return self.store.set_meta(LOGS_SWEPT, &cutoff.to_string());
        }
        tracing::info!("log retention: removing the output logs of {} job(s) that ended before the cutoff", ids.len());
        let runs = self.svc.cfg.data_dir.join("runs");
        self.log_purge_in_flight = true;
        self.exec.submit(crate::executor::Work::PurgeLogs { dirs: ids.iter().map(|id| runs.join(id.to_string())).collect(), cutoff });
        Ok(())
    }

    /// L22: a log sweep is done: its cutoff is stored only now (one cut short by a crash
    /// or not started is done again at the next sweep).
    fn logs_purged(&mut self, cutoff: Option<Micros>) -> Result<(), StoreError> {
        self.log_purge_in_flight = false;
        match cutoff {
            Some(c) => self.store.set_meta(LOGS_SWEPT, &c.to_string()),
            None => Ok(()),
        }
    }
}
