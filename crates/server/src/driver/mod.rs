//! The one driver thread that owns every live job. HTTP handlers and the CLI send it
//! commands and await replies; the backend sends it events; it keeps the timers. For each
//! event: `step` (pure), commit the new state and its effects in one transaction (L23),
//! then carry the effects out. No lock is shared with the handlers.

mod fleet;
mod jobs;
mod launch;
mod studies;
mod waiting;

pub use studies::{render_study, study_name, trial_resource};
pub use waiting::{Waiting, WaitingView};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use trainyard_api::{ApiError, CustomJob, HyperparameterTuningJob, JobState, Status, Timestamp};
use trainyard_backend::{Backend, BackendEvent, EventSink, Launch, ShimSpec};
use trainyard_core::catalog::Catalog;
use trainyard_core::env::{replica_env, slot_address, EnvInput, Member};
use trainyard_core::schedule::{schedule_with, waiting_text, Decision, Fleet, Hints, Position, Quotas};
use trainyard_core::step::{step, Rejected};
use trainyard_core::{Effect, Event, Job, Micros, Outcome, Phase, RunId};
use trainyard_store::{NewJob, Store, StoreError};

use crate::config::Config;
use crate::jobspec::{prepare, resolve_output_dir};
use crate::study::{self, Study, StudyConfig};

pub type Reply<T> = tokio::sync::oneshot::Sender<Result<T, ApiError>>;

/// What the driver is asked to do.
pub enum Msg {
    /// Create a CustomJob (already parsed and validated against the wire rules).
    Create { project: String, region: String, resource: Box<CustomJob>, reply: Reply<CustomJob> },
    /// L18.
    Cancel { project: String, region: String, id: u64, reply: Reply<()> },
    /// A report from the backend.
    Backend(BackendEvent),
    /// An effect carried out off the driver thread (a launch that first built a venv).
    EffectDone(i64),
    /// Fleet and quota administration.
    Admin { req: Admin, reply: Reply<serde_json::Value> },
    /// L9: a node stopped answering (its agent is gone).
    NodeLost(String),
    /// The execution engine could not be reached for this launch: try it again later, the
    /// job waiting PENDING (not an internal error, L16).
    LaunchLater { launch: Box<Launch>, reason: String },
    /// Create a HyperparameterTuningJob (parsed and validated against the wire rules).
    CreateStudy { project: String, region: String, resource: Box<HyperparameterTuningJob>, reply: Reply<serde_json::Value> },
    /// Cancel a HyperparameterTuningJob.
    CancelStudy { project: String, region: String, id: u64, reply: Reply<()> },
    Shutdown,
}

pub const KIND_CUSTOM: &str = "custom";
/// The kind of waiting reason the engine gives (see `Decision::Wait`).
const ENGINE_WAIT: &str = "engine";
pub const KIND_STUDY: &str = "hptuning";

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
}

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
    /// Live HyperparameterTuningJobs.
    studies: BTreeMap<u64, LiveStudy>,
    /// Study events waiting to be applied (from trial jobs' transitions).
    study_events: Vec<(u64, study::Event)>,
    /// When trials' metric files were last read.
    last_metric_poll: Micros,
    /// Launches put off while the engine is unreachable: (when, launch, tries).
    later: Vec<(Micros, Launch, u32)>,
    /// When launching runs last asked the backend why they wait.
    last_backend_poll: Micros,
    /// Scheduling rounds are coalesced: the next one runs no sooner than this (a few times
    /// the last round's cost after it), so that a long queue cannot make every event pay
    /// for a whole round.
    next_round: Micros,
    /// Waiting reasons of the last round, for readers.
    waiting_view: Arc<WaitingView>,
    /// Waiting reasons given by the engine (launches it holds up), merged into the view.
    engine_reasons: HashMap<u64, Arc<str>>,
}

struct LiveStudy {
    study: Study,
    resource: HyperparameterTuningJob,
    cfg: StudyConfig,
}

pub fn now_micros() -> Micros {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as Micros).unwrap_or(0)
}

/// `<data_dir>/runs/<job>/<attempt>/<replica>/<restart>`.
pub fn run_dir(data_dir: &Path, run: &RunId) -> PathBuf {
    data_dir
        .join("runs")
        .join(run.job.to_string())
        .join(run.attempt.to_string())
        .join(&run.replica)
        .join(run.restart.to_string())
}

pub fn job_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/customJobs/{id}")
}

/// The resource as the API shows it: the stored request with the output fields of the
/// lifecycle state (L1, L2).
pub fn render(resource: &CustomJob, job: &Job) -> CustomJob {
    let mut r = resource.clone();
    r.name = job_name(&job.project, &job.region, job.id);
    r.state = JobState::from_name(job.state().wire_name()).unwrap_or(JobState::Unspecified);
    r.create_time = Some(Timestamp::from_micros(job.create_time));
    r.update_time = Some(Timestamp::from_micros(job.update_time));
    r.start_time = job.start_time.map(Timestamp::from_micros);
    r.end_time = job.end_time().map(Timestamp::from_micros);
    r.error = job.error().map(|e| Status { code: e.code, message: e.message.clone(), details: Vec::new() });
    r.trainyard_waiting_reason = match job.state() {
        trainyard_core::State::Queued | trainyard_core::State::Pending => job.waiting_reason.clone().unwrap_or_default(),
        _ => String::new(),
    };
    r
}

fn store_err(e: StoreError) -> ApiError {
    tracing::error!("store: {e}");
    ApiError::internal("Internal error: the job store failed; see the server log.")
}

impl Driver {
    /// Open the driver on a store; `start` recovers the live jobs (L23).
    pub fn new(svc: Arc<Services>, store: Store) -> (Driver, Sender<Msg>) {
        let (tx, rx) = std::sync::mpsc::channel();
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
            studies: BTreeMap::new(),
            study_events: Vec::new(),
            last_metric_poll: 0,
            later: Vec::new(),
            last_backend_poll: 0,
            next_round: 0,
            waiting_view: Arc::new(WaitingView::default()),
            engine_reasons: HashMap::new(),
        };
        (d, tx)
    }

    /// The waiting reasons readers show (positions move without being written).
    pub fn waiting_view(&self) -> Arc<WaitingView> {
        Arc::clone(&self.waiting_view)
    }

    fn sink(&self) -> EventSink {
        let tx = Mutex::new(self.tx.clone());
        Arc::new(move |ev| {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Msg::Backend(ev));
            }
        })
    }

    /// L23: load every live job, adopt the runs that may still be alive, and finish the
    /// effects that were committed but not carried out.
    pub fn recover(&mut self) -> Result<(), StoreError> {
        let names: Vec<String> = self.fleet.nodes.iter().map(|n| n.name.clone()).collect();
        for n in names {
            self.watch_node(&n);
        }
        for stored in self.store.active_jobs()? {
            let resource: CustomJob = match serde_json::from_str(&stored.resource) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("job {}: stored resource unreadable, skipped: {e}", stored.job.id);
                    continue;
                }
            };
            let id = stored.job.id;
            self.jobs.insert(id, Live { job: stored.job, resource, waiting: None });
            self.index_deadline(id);
        }
        let pending = self.store.pending_outbox()?;
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
        tracing::info!("recovered {} live jobs, adopted {adopted} runs, {} pending effects", self.jobs.len(), pending.len());
        let mut by_job: BTreeMap<u64, Vec<(i64, Effect)>> = BTreeMap::new();
        for (seq, job, effect) in pending {
            by_job.entry(job).or_default().push((seq, effect));
        }
        for (job, effects) in by_job {
            self.execute(job, effects);
        }
        self.recover_studies()?;
        Ok(())
    }

    /// Run until `Shutdown` or until every sender is gone. A store failure stops the
    /// driver: the state on disk is the truth, and a restart goes on from it (L23).
    pub fn run(mut self) -> Result<(), StoreError> {
        loop {
            let now = now_micros();
            self.on_time(now)?;
            self.poll_trial_metrics(now);
            self.drain_study_events(now)?;
            self.retry_later_launches(now);
            self.poll_backend_reasons(now)?;
            self.maybe_schedule(now)?;
            let mut wait = match self.deadlines.first() {
                Some(&(t, _)) => Duration::from_micros((t - now_micros()).clamp(0, 60_000_000) as u64),
                None => Duration::from_secs(60),
            };
            if self.reschedule {
                wait = wait.min(Duration::from_micros((self.next_round - now_micros()).clamp(0, 1_000_000) as u64));
            }
            let starting = self.jobs.values().any(|l| matches!(l.job.phase, Phase::Pending { wait: trainyard_core::job::Wait::Starting, .. }));
            if !self.studies.is_empty() || starting {
                // Trials' metric files, and the engine's word on replicas still starting,
                // are read about once a second.
                wait = wait.min(Duration::from_millis(500));
            }
            if let Some(t) = self.later.iter().map(|(t, _, _)| *t).min() {
                wait = wait.min(Duration::from_micros((t - now_micros()).clamp(0, 60_000_000) as u64));
            }
            let first = match self.rx.recv_timeout(wait) {
                Ok(msg) => msg,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            // Take whatever else is already queued, before the next scheduling round.
            let mut queued = vec![first];
            while let Ok(msg) = self.rx.try_recv() {
                queued.push(msg);
            }
            let mut started = Vec::new();
            let mut creates = Vec::new();
            for msg in queued {
                match msg {
                    Msg::Shutdown => return Ok(()),
                    // Replicas that started: one transaction for all of them (L7).
                    Msg::Backend(BackendEvent::Started { run, .. }) => started.push(run),
                    // Creates that arrive together are stored together (group commit).
                    Msg::Create { project, region, resource, reply } => {
                        creates.push((NewCustomJob { project, region, resource: *resource, trial: None }, reply))
                    }
                    other => {
                        self.apply_started(std::mem::take(&mut started))?;
                        if !creates.is_empty() {
                            self.create_batch(std::mem::take(&mut creates), now_micros())?;
                        }
                        self.handle(other)?;
                    }
                }
            }
            self.apply_started(started)?;
            if !creates.is_empty() {
                self.create_batch(creates, now_micros())?;
            }
        }
    }

    /// A scheduling round if one is wanted and its time has come.
    fn maybe_schedule(&mut self, now: Micros) -> Result<(), StoreError> {
        if !self.reschedule || now < self.next_round {
            return Ok(());
        }
        self.reschedule = false;
        let cost = self.schedule_round(now)?;
        // Deciding takes at most about a fifth of the driver's time, however long the queue.
        self.next_round = now_micros() + 4 * cost;
        Ok(())
    }

    /// `Started` reports, committed together: they only change replica states and log
    /// lines, so one transaction (one fsync) serves a whole gang starting at once.
    fn apply_started(&mut self, runs: Vec<RunId>) -> Result<(), StoreError> {
        if runs.is_empty() {
            return Ok(());
        }
        let now = now_micros();
        let mut staged: BTreeMap<u64, (Job, Vec<Effect>)> = BTreeMap::new();
        for run in runs {
            let id = run.job;
            let Some(current) = staged.get(&id).map(|(j, _)| j).or_else(|| self.jobs.get(&id).map(|l| &l.job)) else {
                continue;
            };
            let Ok(t) = step(current, Event::Started { run }, now, &self.svc.cfg.settings) else { continue };
            if !t.changed {
                continue;
            }
            let entry = staged.entry(id).or_insert_with(|| (t.job.clone(), Vec::new()));
            entry.0 = t.job;
            entry.1.extend(t.effects);
        }
        let batch: Vec<(&Job, &[Effect])> = staged.values().map(|(j, e)| (j, e.as_slice())).collect();
        let outbox = self.store.commit_many(&batch, now)?;
        debug_assert!(outbox.is_empty(), "a start causes no world effects");
        for (id, (job, _)) in staged {
            self.install(id, job);
        }
        Ok(())
    }

    fn handle(&mut self, msg: Msg) -> Result<(), StoreError> {
        let now = now_micros();
        match msg {
            Msg::Create { project, region, resource, reply } => {
                self.create_batch(vec![(NewCustomJob { project, region, resource: *resource, trial: None }, reply)], now)?;
            }
            Msg::Cancel { project, region, id, reply } => {
                let r = self.cancel(&project, &region, id, now);
                let _ = reply.send(r);
            }
            Msg::Backend(BackendEvent::Started { run, .. }) => self.apply_started(vec![run])?,
            Msg::Backend(BackendEvent::Exited { run, outcome, stderr_tail }) => {
                let id = run.job;
                self.apply(id, Event::Exited { run, outcome, stderr_tail }, now)?.ok();
            }
            Msg::EffectDone(seq) => self.store.outbox_done(seq)?,
            Msg::NodeLost(node) => self.lose_node(&node, now)?,
            Msg::LaunchLater { launch, reason } => {
                let job = launch.run.job;
                let tries = self.later.iter().filter(|(_, l, _)| l.run == launch.run).map(|(_, _, n)| *n).max().unwrap_or(0) + 1;
                self.later.retain(|(_, l, _)| l.run != launch.run);
                let delay = (2_000_000i64 << (tries - 1).min(4)).min(30_000_000);
                self.later.push((now + delay, *launch, tries));
                self.note_engine_waiting(job, format!("Waiting for the execution engine: {reason}; trying again in {}s.", delay / 1_000_000), now)?;
            }
            Msg::Admin { req, reply } => {
                let r = self.admin(req, now);
                let _ = reply.send(r);
            }
            Msg::CreateStudy { project, region, resource, reply } => {
                let r = self.create_study(project, region, *resource, now);
                let _ = reply.send(r);
            }
            Msg::CancelStudy { project, region, id, reply } => {
                let owned = self.studies.get(&id).is_some_and(|l| l.study.project == project && l.study.region == region);
                let r = if owned {
                    self.apply_study(id, study::Event::Cancel, now)
                } else {
                    match self.store.get_other(KIND_STUDY, &project, &region, id).map_err(store_err) {
                        Ok(Some(_)) => Err(ApiError::failed_precondition(format!(
                            "The HyperparameterTuningJob \"{}\" has ended and cannot be cancelled.",
                            study_name(&project, &region, id)
                        ))),
                        Ok(None) => Err(ApiError::not_found(format!(
                            "The HyperparameterTuningJob \"{}\" does not exist.",
                            study_name(&project, &region, id)
                        ))),
                        Err(e) => Err(e),
                    }
                };
                let _ = reply.send(r);
            }
            Msg::Shutdown => {}
        }
        Ok(())
    }
}
