//! The one driver thread that owns every live job. HTTP handlers and the CLI send it
//! commands and await replies; the backend sends it events; it keeps the timers. For each
//! event: `step` (pure), commit the new state and its effects in one transaction (L23),
//! then carry the effects out. No lock is shared with the handlers.

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

/// The waiting reasons of the latest scheduling round, with their moving numbers
/// (positions, what is in use, expected times), for readers: shown on GET, never written.
#[derive(Default)]
pub struct WaitingView {
    reasons: std::sync::RwLock<Arc<HashMap<u64, Waiting>>>,
}

/// A waiting reason as the latest round gave it: shared by the jobs in the same
/// situation, with each one's position.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub reason: Arc<str>,
    pub position: Option<Position>,
}

impl Waiting {
    pub fn text(&self, project: &str) -> String {
        waiting_text(&self.reason, self.position, project)
    }
}

impl WaitingView {
    /// The job's current waiting reason, if the last round gave it one.
    pub fn get(&self, id: u64, project: &str) -> Option<String> {
        self.reasons.read().ok().and_then(|m| m.get(&id).map(|w| w.text(project)))
    }

    fn snapshot(&self) -> HashMap<u64, Waiting> {
        self.reasons.read().map(|m| (**m).clone()).unwrap_or_default()
    }

    fn publish(&self, reasons: HashMap<u64, Waiting>) {
        if let Ok(mut m) = self.reasons.write() {
            *m = Arc::new(reasons);
        }
    }
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

    /// L23 for studies: load the live ones, link trials to the jobs created for them, and
    /// create the trial jobs that a crash kept from being created (never twice).
    fn recover_studies(&mut self) -> Result<(), StoreError> {
        let now = now_micros();
        for (id, resource, core) in self.store.active_other(KIND_STUDY)? {
            let (Ok(resource), Ok(st)) =
                (serde_json::from_str::<HyperparameterTuningJob>(&resource), serde_json::from_str::<Study>(&core))
            else {
                tracing::error!("study {id}: stored record unreadable, skipped");
                continue;
            };
            let Ok(cfg) = StudyConfig::from_job(&resource) else { continue };
            self.studies.insert(id, LiveStudy { study: st, resource, cfg });
        }
        let ids: Vec<u64> = self.studies.keys().copied().collect();
        for id in ids {
            // Trial jobs that exist, found by their link (live ones; ended ones are in the store).
            let mut links: BTreeMap<String, u64> = BTreeMap::new();
            for live in self.jobs.values() {
                if let Some(l) = live.job.trial.as_ref().filter(|l| l.study == id) {
                    links.insert(l.trial.clone(), live.job.id);
                }
            }
            let mut changed = false;
            let mut missing = Vec::new();
            if let Some(ls) = self.studies.get_mut(&id) {
                for t in ls.study.trials.iter_mut().filter(|t| !t.state.is_terminal() && t.custom_job.is_none()) {
                    match links.get(&t.id) {
                        Some(j) => {
                            t.custom_job = Some(*j);
                            changed = true;
                        }
                        None => missing.push(t.id.clone()),
                    }
                }
            }
            if changed {
                self.commit_study(id, now, &[])?;
            }
            for trial in missing {
                self.create_trial_job(id, &trial, now)?;
            }
            // Trials whose jobs ended while the server was down.
            let ended: Vec<(String, u64)> = self
                .studies
                .get(&id)
                .map(|ls| {
                    ls.study
                        .trials
                        .iter()
                        .filter(|t| !t.state.is_terminal())
                        .filter_map(|t| t.custom_job.map(|j| (t.id.clone(), j)))
                        .filter(|(_, j)| !self.jobs.contains_key(j))
                        .collect()
                })
                .unwrap_or_default();
            for (trial, j) in ended {
                if let Some(stored) = self.store.get_job_by_id(j)? {
                    let measurements = self.trial_measurements(&stored.job);
                    self.study_events.push((
                        id,
                        study::Event::TrialEnded {
                            trial,
                            succeeded: stored.job.state() == trainyard_core::State::Succeeded,
                            error: stored.job.error().map(|e| e.message.clone()),
                            measurements,
                        },
                    ));
                }
            }
            self.study_events.push((id, study::Event::Advance));
        }
        Ok(())
    }

    fn create_study(
        &mut self,
        project: String,
        region: String,
        resource: HyperparameterTuningJob,
        now: Micros,
    ) -> Result<serde_json::Value, ApiError> {
        if region != self.svc.cfg.region {
            return Err(ApiError::invalid_argument(format!(
                "Region \"{region}\" is not served here; this server serves \"{}\".",
                self.svc.cfg.region
            )));
        }
        let cfg = StudyConfig::from_job(&resource)?;
        // The trial job spec is checked against the catalog, fleet and quotas now.
        let sample = trial_resource(&resource, "0", &[]);
        prepare(&sample, &self.svc.catalog, &self.svc.cfg.settings, &self.fleet, &self.quotas, &project)
            .map_err(|e| ApiError::new(e.code, e.message.replace("jobSpec.", "trialJobSpec.")))?;
        if let Some(out) = &resource.trial_job_spec.base_output_directory {
            resolve_output_dir(
                &out.output_uri_prefix,
                &self.svc.cfg.storage_root,
                &self.svc.output_roots,
                "trialJobSpec.baseOutputDirectory.outputUriPrefix",
            )?;
        }
        let text = serde_json::to_string(&resource).map_err(|e| ApiError::internal(format!("encoding the job: {e}")))?;
        let labels: Vec<(String, String)> = resource.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let (p, r) = (project.clone(), region.clone());
        let id = self
            .store
            .insert_other(
                &NewJob { kind: KIND_STUDY, project: &project, region: &region, display_name: &resource.display_name, labels: &labels, resource: &text },
                "JOB_STATE_PENDING",
                now,
                |id| serde_json::to_string(&Study::new(id, p, r, now)).unwrap_or_default(),
            )
            .map_err(store_err)?;
        tracing::info!("hyperparameter tuning job {id} created: {}", resource.display_name);
        self.studies.insert(id, LiveStudy { study: Study::new(id, project, region, now), resource, cfg });
        self.apply_study(id, study::Event::Advance, now)?;
        self.maybe_schedule(now).map_err(store_err)?;
        self.study_view(id).ok_or_else(|| ApiError::internal("study vanished"))
    }

    fn study_view(&self, id: u64) -> Option<serde_json::Value> {
        self.studies.get(&id).map(|ls| render_study(&ls.resource, &ls.study, true))
    }

    /// Step a study, commit it (trials as REQUESTED before their jobs exist), then act.
    fn apply_study(&mut self, id: u64, event: study::Event, now: Micros) -> Result<(), ApiError> {
        let Some(ls) = self.studies.get(&id) else { return Ok(()) };
        let (next, actions) = study::step(&ls.study, &ls.cfg, event, now)?;
        let lines: Vec<String> = actions
            .iter()
            .filter_map(|a| match a {
                study::Action::Log(l) => Some(l.clone()),
                _ => None,
            })
            .collect();
        if let Some(ls) = self.studies.get_mut(&id) {
            ls.study = next;
        }
        self.commit_study(id, now, &lines).map_err(store_err)?;
        for a in actions {
            match a {
                study::Action::CreateTrialJob { trial } => self.create_trial_job(id, &trial, now).map_err(store_err)?,
                study::Action::StopTrialJob { custom_job } => {
                    if let Err(e) = self.apply(custom_job, Event::Cancel, now) {
                        tracing::error!("stopping trial job {custom_job}: {e}");
                    }
                }
                study::Action::Log(_) => {}
            }
        }
        if self.studies.get(&id).is_some_and(|l| l.study.is_terminal()) {
            tracing::info!("hyperparameter tuning job {id} ended");
            self.studies.remove(&id);
        }
        Ok(())
    }

    fn commit_study(&mut self, id: u64, now: Micros, lines: &[String]) -> Result<(), StoreError> {
        let Some(ls) = self.studies.get(&id) else { return Ok(()) };
        let text = serde_json::to_string(&ls.study).map_err(StoreError::Encode)?;
        self.store.commit_other(id, ls.study.state_name(), ls.study.is_terminal(), &text, now, lines)
    }

    /// Create the CustomJob of a trial and link it (L: each trial is a CustomJob run under
    /// the lifecycle rules).
    fn create_trial_job(&mut self, id: u64, trial: &str, now: Micros) -> Result<(), StoreError> {
        let Some(ls) = self.studies.get(&id) else { return Ok(()) };
        let Some(t) = ls.study.trials.iter().find(|t| t.id == trial) else { return Ok(()) };
        let resource = trial_resource(&ls.resource, trial, &t.params);
        let (project, region) = (ls.study.project.clone(), ls.study.region.clone());
        let link = trainyard_core::job::TrialLink { study: id, trial: trial.to_string() };
        let created = self.create_many(vec![NewCustomJob { project, region, resource, trial: Some(link) }], now).pop();
        match created.unwrap_or_else(|| Err(ApiError::internal("no result for the trial job"))) {
            Ok(job_id) => {
                if let Some(t) = self.studies.get_mut(&id).and_then(|ls| ls.study.trial_mut(trial)) {
                    t.custom_job = Some(job_id);
                }
                self.commit_study(id, now, &[])?;
            }
            Err(e) => {
                // The trial cannot run at all (e.g. its quota is above the limit).
                self.study_events.push((
                    id,
                    study::Event::TrialEnded { trial: trial.to_string(), succeeded: false, error: Some(e.message), measurements: Vec::new() },
                ));
            }
        }
        Ok(())
    }

    fn drain_study_events(&mut self, now: Micros) -> Result<(), StoreError> {
        while !self.study_events.is_empty() {
            let batch = std::mem::take(&mut self.study_events);
            for (id, ev) in batch {
                if let Err(e) = self.apply_study(id, ev, now) {
                    tracing::error!("study {id}: {}", e.message);
                }
            }
        }
        Ok(())
    }

    /// The primary replica's metric file of a trial job (cloudml-hypertune's format).
    fn metric_file(&self, job: u64) -> PathBuf {
        self.svc.cfg.data_dir.join("trials").join(job.to_string()).join("workerpool0-0").join("output.metrics")
    }

    fn trial_measurements(&self, job: &Job) -> Vec<(i64, f64)> {
        let Some(link) = &job.trial else { return Vec::new() };
        let Some(metric) = self.studies.get(&link.study).map(|l| l.cfg.metric_id.clone()) else { return Vec::new() };
        let path = self.metric_file(job.id);
        let Ok(text) = std::fs::read_to_string(&path) else { return Vec::new() };
        let (m, bad) = study::read_metrics(&text, &metric);
        for (line, why) in bad {
            tracing::warn!("{}: line {line} skipped: {why}", path.display());
        }
        m
    }

    /// Intermediate measurements of running trials (early stopping).
    fn poll_trial_metrics(&mut self, now: Micros) {
        if self.studies.is_empty() || now - self.last_metric_poll < 1_000_000 {
            return;
        }
        self.last_metric_poll = now;
        let mut events = Vec::new();
        for (id, ls) in &self.studies {
            for t in ls.study.trials.iter().filter(|t| t.state == study::TrialState::Active) {
                let Some(j) = t.custom_job.and_then(|j| self.jobs.get(&j)) else { continue };
                let m = self.trial_measurements(&j.job);
                if m != t.measurements {
                    events.push((*id, study::Event::Measurements { trial: t.id.clone(), measurements: m }));
                }
            }
        }
        self.study_events.extend(events);
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

    /// Why launched replicas have not started yet, as the engine says (e.g. its controller
    /// is unreachable): shown as the job's waiting reason and written to its log.
    fn poll_backend_reasons(&mut self, now: Micros) -> Result<(), StoreError> {
        if now - self.last_backend_poll < 1_000_000 {
            return Ok(());
        }
        self.last_backend_poll = now;
        let mut reasons = Vec::new();
        for live in self.jobs.values() {
            if !matches!(live.job.phase, Phase::Pending { wait: trainyard_core::job::Wait::Starting, .. }) {
                continue;
            }
            let launching = live.job.replicas.iter().filter(|r| r.state == trainyard_core::job::ReplicaState::Launching);
            for r in launching {
                let run = RunId { job: live.job.id, attempt: live.job.attempt, replica: r.name.clone(), restart: r.restart };
                if let Some(reason) = self.svc.backend.waiting_reason(&run) {
                    reasons.push((live.job.id, format!("Waiting for the execution engine: {reason}")));
                    break;
                }
            }
        }
        for (id, reason) in reasons {
            self.note_engine_waiting(id, reason, now)?;
        }
        Ok(())
    }

    /// Launches put off while the engine was unreachable, when their time has come; those of
    /// runs no longer current are dropped (the launch is idempotent anyway).
    fn retry_later_launches(&mut self, now: Micros) {
        if self.later.is_empty() {
            return;
        }
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.later).into_iter().partition(|(t, _, _)| *t <= now);
        self.later = rest;
        let mut runs = Vec::new();
        for (_, launch, tries) in due {
            let current = self.jobs.get(&launch.run.job).and_then(|l| l.job.replica(&launch.run.replica)).is_some_and(|r| {
                r.restart == launch.run.restart && r.state == trainyard_core::job::ReplicaState::Launching
            }) && self.jobs.get(&launch.run.job).is_some_and(|l| l.job.attempt == launch.run.attempt);
            if current {
                runs.push(launch);
                let _ = tries;
            }
        }
        if !runs.is_empty() {
            do_launch(&self.svc, runs, self.sink(), &self.tx);
        }
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

    fn admin(&mut self, req: Admin, now: Micros) -> Result<serde_json::Value, ApiError> {
        match req {
            Admin::ListNodes => {
                let nodes: Vec<serde_json::Value> = self.fleet.nodes.iter().map(|n| self.node_view(n)).collect();
                Ok(serde_json::json!({ "nodes": nodes }))
            }
            Admin::GetNode(name) => Ok(self.node_view(self.node(&name)?)),
            Admin::Drain(name) => {
                self.node(&name)?;
                self.drain(&name, now).map_err(store_err)?;
                Ok(self.node_view(self.node(&name)?))
            }
            Admin::Undrain(name) => {
                self.node(&name)?;
                let was_down = self.fleet.nodes.iter().any(|n| n.name == name && !n.up);
                if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
                    n.schedulable = true;
                    n.up = true;
                }
                if was_down {
                    // A lost node comes back: its agent is started again.
                    self.watch_node(&name);
                }
                tracing::info!("node {name} undrained");
                self.reschedule = true;
                Ok(self.node_view(self.node(&name)?))
            }
            Admin::Quotas => Ok(self.quota_view()),
            Admin::ReloadQuotas => {
                let Some(path) = self.svc.cfg.path.clone() else {
                    return Err(ApiError::failed_precondition("The server runs on its built-in defaults: there is no config file to read quotas from."));
                };
                let cfg = Config::load(&path, Some(self.svc.cfg.data_dir.clone()))
                    .map_err(|e| ApiError::invalid_argument(format!("Quotas not changed: {e}")))?;
                self.quotas = cfg.quotas;
                tracing::info!("quotas read again from {}", path.display());
                // A larger limit may admit queued jobs at once.
                self.reschedule = true;
                Ok(self.quota_view())
            }
        }
    }

    fn node(&self, name: &str) -> Result<&trainyard_core::schedule::Node, ApiError> {
        self.fleet
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ApiError::not_found(format!("Node \"{name}\" does not exist.")))
    }

    /// Live replicas per node: (job, replica index), including replicas moving there (L9).
    fn placements(&self) -> BTreeMap<String, Vec<(u64, usize)>> {
        let mut out: BTreeMap<String, Vec<(u64, usize)>> = BTreeMap::new();
        for live in self.jobs.values() {
            for (i, r) in live.job.replicas.iter().enumerate() {
                if let trainyard_core::job::ReplicaState::Stopping {
                    then: trainyard_core::job::AfterReplicaStop::Move { node },
                } = &r.state
                {
                    out.entry(node.clone()).or_default().push((live.job.id, i));
                }
                if r.state.is_live() {
                    if let Some(n) = &r.node {
                        out.entry(n.clone()).or_default().push((live.job.id, i));
                    }
                }
            }
        }
        out
    }

    fn node_view(&self, n: &trainyard_core::schedule::Node) -> serde_json::Value {
        let placements = self.placements();
        let mine = placements.get(&n.name).cloned().unwrap_or_default();
        let (mut cpus, mut memory) = (0u64, 0u64);
        let mut accel: BTreeMap<String, u64> = BTreeMap::new();
        let mut replicas = Vec::new();
        for (job, i) in &mine {
            let Some(live) = self.jobs.get(job) else { continue };
            if let Some(d) = live.job.demand.replicas.get(*i) {
                cpus += d.cpus as u64;
                memory += d.memory_bytes;
                if let Some((a, c)) = &d.accelerator {
                    *accel.entry(a.clone()).or_insert(0) += *c as u64;
                }
            }
            replicas.push(serde_json::json!({
                "job": job_name(&live.job.project, &live.job.region, live.job.id),
                "replica": live.job.replicas[*i].name,
            }));
        }
        let state = if !n.up {
            "DOWN"
        } else if !n.schedulable {
            "DRAINED"
        } else {
            "UP"
        };
        serde_json::json!({
            "name": n.name,
            "state": state,
            "cpus": n.cpus,
            "memoryBytes": n.memory_bytes.to_string(),
            "accelerators": n.accelerators,
            "allocated": {"cpus": cpus, "memoryBytes": memory.to_string(), "accelerators": accel},
            "overcommit": self.fleet.overcommit,
            "replicas": replicas,
        })
    }

    /// Limit, in use and queued demand per project and metric.
    fn quota_view(&self) -> serde_json::Value {
        let mut rows: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for live in self.jobs.values() {
            let j = &live.job;
            for (m, v) in &j.demand.metrics {
                let e = rows.entry((j.project.clone(), m.clone())).or_insert((0, 0));
                if j.holds_quota() {
                    e.0 += v;
                } else if matches!(j.phase, Phase::Queued) {
                    e.1 += v;
                }
            }
        }
        for (p, limits) in &self.quotas.projects {
            for m in limits.keys() {
                rows.entry((p.clone(), m.clone())).or_insert((0, 0));
            }
        }
        let mut out: Vec<serde_json::Value> = Vec::new();
        for m in self.quotas.default.keys() {
            if !rows.keys().any(|(_, rm)| rm == m) {
                out.push(serde_json::json!({"project": "*", "region": self.svc.cfg.region, "metric": m,
                    "limit": self.quotas.default[m].to_string(), "inUse": "0", "queued": "0"}));
            }
        }
        for ((project, metric), (used, queued)) in rows {
            let mut row = serde_json::json!({"project": project, "region": self.svc.cfg.region, "metric": metric,
                "inUse": used.to_string(), "queued": queued.to_string()});
            if let Some(l) = self.quotas.limit(&project, &metric) {
                row["limit"] = serde_json::Value::String(l.to_string());
            }
            out.push(row);
        }
        serde_json::json!({ "quotas": out })
    }

    /// Start or find a virtual node's agent and watch it (a no-op without node agents).
    fn watch_node(&mut self, name: &str) {
        let Some(cmd) = self.svc.node_agent.clone() else { return };
        let tx = Mutex::new(self.tx.clone());
        let node = name.to_string();
        let r = crate::nodeagent::ensure_and_watch(&self.svc.cfg.data_dir, name, &cmd, move || {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Msg::NodeLost(node));
            }
        });
        if let Err(e) = r {
            tracing::error!("node {name}: cannot start or watch its agent, marking it down: {e}");
            if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
                n.up = false;
            }
        }
    }

    /// L9: a node is lost: it takes no work, and each of its replicas is restarted at once
    /// on another node with the same name and address (or, with none, a stockout, L15).
    fn lose_node(&mut self, name: &str, now: Micros) -> Result<(), StoreError> {
        let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) else { return Ok(()) };
        if !n.up {
            return Ok(());
        }
        n.up = false;
        tracing::warn!("node {name} lost: its agent stopped answering");
        let on_node: Vec<(u64, usize)> = self
            .placements()
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|(job, i)| self.jobs.get(job).is_some_and(|l| l.job.replicas[*i].node.as_deref() == Some(name)))
            .collect();
        for (job, i) in on_node {
            let replacement = self.replacement_node(job, i, name);
            let Some(replica) = self.jobs.get(&job).map(|l| l.job.replicas[i].name.clone()) else { continue };
            self.apply(job, Event::NodeLost { replica, replacement }, now)?.ok();
        }
        self.reschedule = true;
        Ok(())
    }

    /// L9: drain a node: it takes no new work, and each of its replicas gets SIGTERM and
    /// the grace period, then restarts on another node (or, with none, a stockout, L15).
    fn drain(&mut self, name: &str, now: Micros) -> Result<(), StoreError> {
        if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
            n.schedulable = false;
        }
        tracing::info!("node {name} drained");
        let on_node: Vec<(u64, usize)> = self
            .placements()
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|(job, i)| {
                self.jobs.get(job).is_some_and(|l| {
                    l.job.replicas[*i].node.as_deref() == Some(name)
                        && matches!(
                            l.job.replicas[*i].state,
                            trainyard_core::job::ReplicaState::Launching | trainyard_core::job::ReplicaState::Running { .. }
                        )
                })
            })
            .collect();
        for (job, i) in on_node {
            let replacement = self.replacement_node(job, i, name);
            let Some(replica) = self.jobs.get(&job).map(|l| l.job.replicas[i].name.clone()) else { continue };
            self.apply(job, Event::NodeMaintenance { replica, replacement }, now)?.ok();
        }
        Ok(())
    }

    /// A node that can take replica `i` of `job` now, other than `exclude`.
    fn replacement_node(&self, job: u64, i: usize, exclude: &str) -> Option<String> {
        let demand = self.jobs.get(&job)?.job.demand.replicas.get(i)?.clone();
        let placements = self.placements();
        self.fleet
            .nodes
            .iter()
            .filter(|n| n.up && n.schedulable && n.name != exclude)
            .find(|n| {
                if self.fleet.overcommit {
                    return true;
                }
                let (mut cpus, mut mem) = (demand.cpus as u64, demand.memory_bytes);
                let mut acc: BTreeMap<String, u64> = BTreeMap::new();
                if let Some((a, c)) = &demand.accelerator {
                    acc.insert(a.clone(), *c as u64);
                }
                for (j, k) in placements.get(&n.name).map(Vec::as_slice).unwrap_or(&[]) {
                    if let Some(d) = self.jobs.get(j).and_then(|l| l.job.demand.replicas.get(*k)) {
                        cpus += d.cpus as u64;
                        mem += d.memory_bytes;
                        if let Some((a, c)) = &d.accelerator {
                            *acc.entry(a.clone()).or_insert(0) += *c as u64;
                        }
                    }
                }
                cpus <= n.cpus as u64
                    && mem <= n.memory_bytes
                    && acc.iter().all(|(a, c)| n.accelerators.get(a).copied().unwrap_or(0) as u64 >= *c)
            })
            .map(|n| n.name.clone())
    }

    /// Creates that arrived together: checked one by one, then stored in one transaction
    /// (group commit: one fsync for all), then one scheduling round for all of them, then
    /// answered.
    fn create_batch(&mut self, batch: Vec<(NewCustomJob, Reply<CustomJob>)>, now: Micros) -> Result<(), StoreError> {
        let (items, replies): (Vec<NewCustomJob>, Vec<Reply<CustomJob>>) = batch.into_iter().unzip();
        let results = self.create_many(items, now);
        self.maybe_schedule(now)?;
        for (result, reply) in results.into_iter().zip(replies) {
            let _ = reply.send(result.and_then(|id| self.render_current(id)));
        }
        Ok(())
    }

    /// Check and store new CustomJobs; returns each one's id or why it was refused. The
    /// accepted ones are stored together (all or none) and wait for the next round.
    fn create_many(&mut self, items: Vec<NewCustomJob>, now: Micros) -> Vec<Result<u64, ApiError>> {
        let mut results: Vec<Result<u64, ApiError>> = Vec::with_capacity(items.len());
        let mut accepted = Vec::new();
        for item in items {
            match self.check_new(&item) {
                Ok((prepared, text)) => {
                    accepted.push((results.len(), item, prepared, text));
                    results.push(Ok(0));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if accepted.is_empty() {
            return results;
        }
        let labels: Vec<Vec<(String, String)>> = accepted
            .iter()
            .map(|(_, it, _, _)| it.resource.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .collect();
        let news: Vec<NewJob<'_>> = accepted
            .iter()
            .zip(&labels)
            .map(|((_, it, _, text), labels)| NewJob {
                kind: KIND_CUSTOM,
                project: &it.project,
                region: &it.region,
                display_name: &it.resource.display_name,
                labels,
                resource: text,
            })
            .collect();
        let stored = self.store.insert_jobs(&news, |i, id| {
            let (_, it, prepared, _) = &accepted[i];
            let mut job = Job::new(
                id,
                it.project.clone(),
                it.region.clone(),
                &prepared.pools,
                prepared.demand.clone(),
                prepared.policy.clone(),
                prepared.checkpoints,
                now,
            );
            job.trial = it.trial.clone();
            job
        });
        drop(news);
        let jobs = match stored {
            Ok(jobs) => jobs,
            Err(e) => {
                let e = store_err(e);
                for (i, _, _, _) in &accepted {
                    results[*i] = Err(e.clone());
                }
                return results;
            }
        };
        for ((i, item, _, _), job) in accepted.into_iter().zip(jobs) {
            let id = job.id;
            tracing::info!("job {id} created: {}", item.resource.display_name);
            results[i] = Ok(id);
            self.jobs.insert(id, Live { job, resource: item.resource, waiting: None });
            self.index_deadline(id);
        }
        self.reschedule = true;
        results
    }

    /// What a create is checked against besides the wire rules: the region, the catalog,
    /// the fleet and quotas (L4), and the output directory.
    fn check_new(&self, item: &NewCustomJob) -> Result<(crate::jobspec::Prepared, String), ApiError> {
        let svc = &self.svc;
        if item.region != svc.cfg.region {
            return Err(ApiError::invalid_argument(format!(
                "Region \"{}\" is not served here; this server serves \"{}\".",
                item.region, svc.cfg.region
            )));
        }
        let prepared = prepare(&item.resource, &svc.catalog, &svc.cfg.settings, &self.fleet, &self.quotas, &item.project)?;
        if let Some(out) = &item.resource.job_spec.base_output_directory {
            resolve_output_dir(
                &out.output_uri_prefix,
                &svc.cfg.storage_root,
                &svc.output_roots,
                "jobSpec.baseOutputDirectory.outputUriPrefix",
            )?;
        }
        let text = serde_json::to_string(&item.resource).map_err(|e| ApiError::internal(format!("encoding the job: {e}")))?;
        Ok((prepared, text))
    }

    /// A job as it is now (admitted already when a round placed it).
    fn render_current(&self, id: u64) -> Result<CustomJob, ApiError> {
        match self.jobs.get(&id) {
            Some(l) => {
                let mut r = render(&l.resource, &l.job);
                if let Some(reason) = self.waiting_view.get(id, &l.job.project).filter(|_| !r.trainyard_waiting_reason.is_empty()) {
                    r.trainyard_waiting_reason = reason;
                }
                Ok(r)
            }
            None => self.store.get_job_by_id(id).map_err(store_err)?.map_or_else(
                || Err(ApiError::internal("job vanished")),
                |s| {
                    let r: CustomJob = serde_json::from_str(&s.resource).map_err(|e| ApiError::internal(e.to_string()))?;
                    Ok(render(&r, &s.job))
                },
            ),
        }
    }

    fn cancel(&mut self, project: &str, region: &str, id: u64, now: Micros) -> Result<(), ApiError> {
        let name = job_name(project, region, id);
        let owned = self.jobs.get(&id).is_some_and(|l| l.job.project == project && l.job.region == region);
        if !owned {
            // Not live here: either terminal (refused, L18) or not found (another project's
            // job is not found either).
            return match self.store.get_job(KIND_CUSTOM, project, region, id).map_err(store_err)? {
                Some(s) => Err(ApiError::failed_precondition(format!(
                    "The CustomJob \"{name}\" is in state {} and cannot be cancelled.",
                    s.job.state().wire_name()
                ))),
                None => Err(ApiError::not_found(format!("The CustomJob \"{name}\" does not exist."))),
            };
        }
        match self.apply(id, Event::Cancel, now) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Rejected::FailedPrecondition(m))) => Err(ApiError::failed_precondition(m)),
            Err(e) => Err(store_err(e)),
        }
    }

    /// Step one job, commit, execute. The outer Result is a store failure (fatal), the
    /// inner one a refused command.
    fn apply(&mut self, id: u64, event: Event, now: Micros) -> Result<Result<(), Rejected>, StoreError> {
        let Some(live) = self.jobs.get(&id) else { return Ok(Ok(())) };
        let t = match step(&live.job, event, now, &self.svc.cfg.settings) {
            Ok(t) => t,
            Err(r) => return Ok(Err(r)),
        };
        if !t.changed {
            return Ok(Ok(()));
        }
        // L23: durable before anything is reported or done.
        let outbox = self.store.commit(&t.job, &t.effects, now)?;
        self.install(id, t.job);
        self.execute(id, outbox);
        Ok(Ok(()))
    }

    fn install(&mut self, id: u64, job: Job) {
        let was_placed = self.jobs.get(&id).is_some_and(|l| l.job.holds_capacity() || l.job.holds_quota());
        let terminal = job.is_terminal();
        if terminal || (was_placed && !job.holds_capacity()) || job.wants_placement(now_micros()) {
            self.reschedule = true;
        }
        if let Some(link) = job.trial.clone() {
            let before = self.jobs.get(&id).map(|l| l.job.state());
            let after = job.state();
            if after == trainyard_core::State::Running && before != Some(after) {
                self.study_events.push((link.study, study::Event::TrialRunning { trial: link.trial.clone() }));
            }
            if after.is_terminal() {
                let measurements = self.trial_measurements(&job);
                self.study_events.push((
                    link.study,
                    study::Event::TrialEnded {
                        trial: link.trial,
                        succeeded: after == trainyard_core::State::Succeeded,
                        error: job.error().map(|e| e.message.clone()),
                        measurements,
                    },
                ));
            }
        }
        if let Some(live) = self.jobs.get_mut(&id) {
            if live.job.state() != job.state() {
                // A new wait (e.g. after a preemption) is logged afresh.
                live.waiting = None;
            }
            live.job = job;
        }
        if terminal {
            tracing::info!("job {id} ended {}", self.jobs.get(&id).map_or("", |l| l.job.state().wire_name()));
            self.jobs.remove(&id);
        }
        self.index_deadline(id);
    }

    fn index_deadline(&mut self, id: u64) {
        if let Some(old) = self.deadline_of.remove(&id) {
            self.deadlines.remove(&(old, id));
        }
        if let Some(t) = self.jobs.get(&id).and_then(|l| l.job.next_deadline(&self.svc.cfg.settings, now_micros())) {
            self.deadlines.insert((t, id));
            self.deadline_of.insert(id, t);
        }
    }

    /// Timers that are due: L19, L15, L21, and backoffs that end (then schedule).
    fn on_time(&mut self, now: Micros) -> Result<(), StoreError> {
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.remove(&(t, id));
            self.deadline_of.remove(&id);
            if let Some(seen) = self.jobs.get(&id).and_then(|l| self.checkpoint_seen(l)) {
                self.apply(id, Event::CheckpointSeen { at: seen }, now)?.ok();
            }
            self.apply(id, Event::Tick, now)?.ok();
            if self.jobs.get(&id).is_some_and(|l| l.job.wants_placement(now)) {
                self.reschedule = true;
            }
            if !self.deadline_of.contains_key(&id) {
                self.index_deadline(id);
            }
        }
        Ok(())
    }

    /// L21: the newest modification time under the job's checkpoint directory.
    fn checkpoint_seen(&self, live: &Live) -> Option<Micros> {
        if !matches!(live.job.phase, Phase::Running { .. }) {
            return None;
        }
        let base = self.output_base(&live.resource)?;
        newest_mtime(&base.join("checkpoints"), 4)
    }

    fn output_base(&self, resource: &CustomJob) -> Option<PathBuf> {
        let out = resource.job_spec.base_output_directory.as_ref()?;
        resolve_output_dir(&out.output_uri_prefix, &self.svc.cfg.storage_root, &self.svc.output_roots, "").ok()
    }

    /// Admission and placement for every job that waits (L3, L5, L15).
    /// Returns what deciding cost (µs), the writes that follow not counted.
    fn schedule_round(&mut self, now: Micros) -> Result<Micros, StoreError> {
        let began = std::time::Instant::now();
        let decisions = {
            let live: Vec<&Job> = self.jobs.values().map(|l| &l.job).collect();
            if !live.iter().any(|j| j.wants_placement(now)) {
                return Ok(began.elapsed().as_micros() as Micros);
            }
            schedule_with(&live, &self.fleet, &self.quotas, now, &self.svc.cfg.scheduler, &Hints::default())
        };
        let cost = began.elapsed().as_micros() as Micros;
        let mut used: HashSet<String> = self
            .jobs
            .values()
            .flat_map(|l| l.job.replicas.iter().filter_map(|r| r.address.clone()))
            .collect();
        let mut next_slot = 0u32;
        let mut reasons: HashMap<u64, Waiting> = HashMap::new();
        let mut changed: Vec<u64> = Vec::new();
        for d in decisions {
            match d {
                Decision::Place { job, nodes, warnings } => {
                    let Some(live) = self.jobs.get(&job) else { continue };
                    // L8: addresses for the life of the job, given at the first placement.
                    let addresses = if live.job.replicas.iter().all(|r| r.address.is_some()) {
                        Vec::new()
                    } else {
                        (0..live.job.replicas.len())
                            .map(|_| loop {
                                let a = slot_address(next_slot, self.svc.cfg.base_port);
                                next_slot += 1;
                                if used.insert(a.clone()) {
                                    break a;
                                }
                            })
                            .collect()
                    };
                    self.apply(job, Event::Place { nodes, addresses, notes: warnings }, now)?.ok();
                }
                Decision::Stockout { job, detail } => {
                    self.apply(job, Event::Stockout { detail }, now)?.ok();
                }
                Decision::Wait { job, kind, reason, position } => {
                    let Some(live) = self.jobs.get_mut(&job) else { continue };
                    let waiting = Waiting { reason, position };
                    // The reason with its moving numbers is shown; it is written (state and
                    // log line) only when its kind changes.
                    if live.waiting != Some(kind) {
                        live.waiting = Some(kind);
                        live.job.waiting_reason = Some(waiting.text(&live.job.project));
                        changed.push(job);
                    }
                    reasons.insert(job, waiting);
                }
                Decision::Preempt { job, reason } => {
                    self.apply(job, Event::Preempt { reason }, now)?.ok();
                }
            }
        }
        self.engine_reasons.retain(|id, _| self.jobs.contains_key(id));
        self.publish_waiting(&changed, reasons, now)?;
        Ok(cost)
    }

    /// Store and log the new waiting reasons of a round in one transaction, and show
    /// every reason of the round (with the engine's) to readers.
    fn publish_waiting(&mut self, changed: &[u64], mut reasons: HashMap<u64, Waiting>, now: Micros) -> Result<(), StoreError> {
        let lines: Vec<(u64, [Effect; 1])> = changed
            .iter()
            .filter_map(|id| {
                let job = &self.jobs.get(id)?.job;
                let text = job.waiting_reason.clone()?;
                Some((*id, [Effect::Log(trainyard_core::step::LogLine { attempt: job.attempt, replica: None, text })]))
            })
            .collect();
        let batch: Vec<(&Job, &[Effect])> =
            lines.iter().filter_map(|(id, l)| Some((&self.jobs.get(id)?.job, l.as_slice()))).collect();
        if !batch.is_empty() {
            self.store.commit_many(&batch, now)?;
        }
        for (id, r) in &self.engine_reasons {
            reasons.entry(*id).or_insert_with(|| Waiting { reason: Arc::clone(r), position: None });
        }
        self.waiting_view.publish(reasons);
        Ok(())
    }

    /// The engine holds a launch up (e.g. its controller is unreachable): shown as the
    /// job's waiting reason, and written to its log when it first says so.
    fn note_engine_waiting(&mut self, id: u64, reason: String, now: Micros) -> Result<(), StoreError> {
        let Some(live) = self.jobs.get_mut(&id) else { return Ok(()) };
        self.engine_reasons.insert(id, reason.trim_end_matches('.').into());
        if live.waiting == Some(ENGINE_WAIT) {
            live.job.waiting_reason = Some(reason);
            return Ok(());
        }
        live.waiting = Some(ENGINE_WAIT);
        live.job.waiting_reason = Some(reason.clone());
        let line = Effect::Log(trainyard_core::step::LogLine { attempt: live.job.attempt, replica: None, text: reason });
        self.store.commit(&live.job, &[line], now)?;
        let reasons = self.waiting_view.snapshot();
        self.publish_waiting(&[], reasons, now)
    }

    /// Carry out committed effects; each leaves the outbox once done.
    fn execute(&mut self, id: u64, effects: Vec<(i64, Effect)>) {
        let mut done = Vec::with_capacity(effects.len());
        let mut ready = Vec::new();
        for (seq, effect) in effects {
            match &effect {
                Effect::Launch { run, .. } => match self.prepare_launch(id, run, seq) {
                    Prepared::Ready(launch) => {
                        ready.push(launch);
                        done.push(seq);
                    }
                    Prepared::Deferred => {}
                    Prepared::Reported => done.push(seq),
                },
                Effect::Stop { run, .. } => {
                    let dir = run_dir(&self.svc.cfg.data_dir, run);
                    if let Err(e) = self.svc.backend.stop(run, dir) {
                        tracing::warn!("{run}: stop: {e}");
                    }
                    done.push(seq);
                }
                Effect::Log(_) => done.push(seq),
            }
        }
        // L6: every replica of the attempt starts at once.
        if !ready.is_empty() {
            do_launch(&self.svc, ready, self.sink(), &self.tx);
        }
        if let Err(e) = self.store.outbox_done_many(&done) {
            tracing::error!("outbox: {e}");
        }
    }

    /// Everything a launch needs, or the reason it will not happen here and now.
    fn prepare_launch(&mut self, id: u64, run: &RunId, seq: i64) -> Prepared {
        let sink = self.sink();
        let Some(live) = self.jobs.get(&id) else { return Prepared::Reported };
        let dir = run_dir(&self.svc.cfg.data_dir, run);
        let node = live.job.replica(&run.replica).and_then(|r| r.node.clone()).unwrap_or_default();
        let plan = match launch_plan(&self.svc, live, run) {
            Ok(p) => p,
            Err(outcome) => {
                sink(BackendEvent::Exited { run: run.clone(), outcome, stderr_tail: Vec::new() });
                return Prepared::Reported;
            }
        };
        match plan {
            LaunchPlan::Ready(spec) => Prepared::Ready(Launch { run: run.clone(), run_dir: dir, spec, node }),
            LaunchPlan::NeedsVenv { spec, venv, packages, module_args } => {
                // Building a venv takes seconds: on its own thread, which reports
                // `EffectDone` when the launch is done.
                let (svc, tx, run) = (Arc::clone(&self.svc), self.tx.clone(), run.clone());
                let spawned = std::thread::Builder::new().name(format!("venv-{id}")).spawn(move || {
                    match crate::venv::ensure(&venv, &packages) {
                        Ok(python) => {
                            let mut spec = spec;
                            spec.argv = std::iter::once(python.display().to_string()).chain(module_args).collect();
                            do_launch(&svc, vec![Launch { run, run_dir: dir, spec, node }], sink, &tx);
                        }
                        Err(message) => {
                            sink(BackendEvent::Exited { run, outcome: Outcome::StartError { message }, stderr_tail: Vec::new() })
                        }
                    }
                    let _ = tx.send(Msg::EffectDone(seq));
                });
                match spawned {
                    Ok(_) => Prepared::Deferred,
                    Err(e) => {
                        tracing::error!("cannot start a thread to build a venv: {e}");
                        Prepared::Reported
                    }
                }
            }
        }
    }
}

enum Prepared {
    Ready(Launch),
    /// Another thread finishes it.
    Deferred,
    /// Nothing to launch: an outcome was reported instead.
    Reported,
}

fn do_launch(svc: &Services, runs: Vec<Launch>, sink: EventSink, tx: &Sender<Msg>) {
    let keep: BTreeMap<RunId, Launch> = runs.iter().map(|l| (l.run.clone(), l.clone())).collect();
    for (run, result) in svc.backend.launch(runs, sink.clone()) {
        match result {
            Ok(()) => {}
            Err(trainyard_backend::BackendError::Unavailable { engine, message }) => {
                tracing::warn!("{run}: {engine} is unreachable ({message}); the launch is tried again later");
                if let Some(launch) = keep.get(&run) {
                    let _ = tx.send(Msg::LaunchLater { launch: Box::new(launch.clone()), reason: format!("{engine} is unreachable ({message})") });
                }
            }
            Err(e) => {
                // L16: the replica could not be launched for a reason that is not the user's.
                tracing::error!("{run}: launch failed: {e}");
                sink(BackendEvent::Exited { run, outcome: Outcome::LaunchFailed { message: e.to_string() }, stderr_tail: Vec::new() });
            }
        }
    }
}

enum LaunchPlan {
    Ready(ShimSpec),
    NeedsVenv { spec: ShimSpec, venv: PathBuf, packages: Vec<PathBuf>, module_args: Vec<String> },
}

/// The program, environment (L8) and memory limit (L14) of one run.
fn launch_plan(svc: &Services, live: &Live, run: &RunId) -> Result<LaunchPlan, Outcome> {
    let job = &live.job;
    let spec = &live.resource.job_spec;
    let idx = job.replicas.iter().position(|r| r.name == run.replica).ok_or_else(|| Outcome::LaunchFailed {
        message: format!("no replica {} in job {}", run.replica, job.id),
    })?;
    let replica = &job.replicas[idx];
    let pool = spec.worker_pool_specs.get(replica.pool).ok_or_else(|| Outcome::LaunchFailed {
        message: format!("no worker pool {}", replica.pool),
    })?;
    let members: Vec<Member> = job
        .replicas
        .iter()
        .map(|r| Member { pool: r.pool, index: r.index, address: r.address.clone().unwrap_or_default() })
        .collect();
    let spec_json = serde_json::to_string(spec).unwrap_or_default();
    let base = live
        .resource
        .job_spec
        .base_output_directory
        .as_ref()
        .and_then(|o| resolve_output_dir(&o.output_uri_prefix, &svc.cfg.storage_root, &svc.output_roots, "").ok());
    let base_str = base.as_ref().map(|p| p.display().to_string());
    let pool_env: Vec<(String, String)> = match (&pool.container_spec, &pool.python_package_spec) {
        (Some(c), _) => c.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        (None, Some(p)) => p.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        _ => Vec::new(),
    };
    let mut env = svc.base_env.clone();
    if let Some(node) = &replica.node {
        env.push(("TRAINYARD_NODE".into(), node.clone()));
    }
    if job.trial.is_some() {
        // cloudml-hypertune writes the trial's metrics here.
        let dir = svc.cfg.data_dir.join("trials").join(job.id.to_string()).join(&replica.name);
        let _ = std::fs::create_dir_all(&dir);
        env.push(("CLOUD_ML_HP_METRIC_FILE".into(), dir.join("output.metrics").display().to_string()));
    }
    let input = EnvInput {
        project: &job.project,
        region: &job.region,
        job_id: job.id,
        trial_id: job.trial.as_ref().map(|t| t.trial.as_str()),
        job_spec_json: &spec_json,
        members: &members,
        this: idx,
        base_output_dir: base_str.as_deref(),
        pool_env: &pool_env,
    };
    for (k, v) in replica_env(&input) {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    }
    if let Some(b) = &base {
        for sub in ["model", "checkpoints", "logs"] {
            let _ = std::fs::create_dir_all(b.join(sub));
        }
    }
    // L14: the machine type's memory minus the reserved share.
    let memory = pool
        .machine_spec
        .as_ref()
        .and_then(|m| svc.catalog.get(&m.machine_type))
        .map(|m| svc.catalog.allocatable_memory(m));
    let mut shim = ShimSpec::new(Vec::new(), env);
    shim.cwd = Some(svc.workdir.clone());
    shim.memory_limit_bytes = memory;
    shim.resources = trainyard_backend::Resources {
        cpus: job.demand.replicas.get(idx).map(|d| d.cpus),
        accelerator: job.demand.replicas.get(idx).and_then(|d| d.accelerator.clone()),
        timeout_secs: live
            .resource
            .job_spec
            .scheduling
            .as_ref()
            .and_then(|s| s.timeout.as_ref())
            .map(|t| t.seconds.max(0) as u64),
    };
    shim.grace_seconds = svc.cfg.settings.grace_period_secs as f64;
    match (&pool.container_spec, &pool.python_package_spec) {
        (Some(c), _) => {
            if c.command.is_empty() {
                return Err(Outcome::StartError {
                    message: format!(
                        "containerSpec.command is empty: Trainyard runs the command as a host process and does not run \
                         the image {:?}, so its entrypoint is unknown; set command",
                        c.image_uri
                    ),
                });
            }
            shim.argv = c.command.iter().chain(&c.args).cloned().collect();
            Ok(LaunchPlan::Ready(shim))
        }
        (None, Some(p)) => {
            let mut packages = Vec::new();
            for (i, uri) in p.package_uris.iter().enumerate() {
                let field = format!("pythonPackageSpec.packageUris[{i}]");
                let path = if uri.starts_with("gs://") {
                    resolve_output_dir(uri, &svc.cfg.storage_root, &[], &field)
                } else {
                    resolve_output_dir(uri, &svc.cfg.storage_root, &[PathBuf::from("/")], &field)
                }
                .map_err(|e| Outcome::StartError { message: e.message })?;
                packages.push(path);
            }
            let venv = svc.cfg.data_dir.join("venvs").join(job.id.to_string());
            let module_args = ["-m".to_string(), p.python_module.clone()].into_iter().chain(p.args.iter().cloned()).collect();
            Ok(LaunchPlan::NeedsVenv { spec: shim, venv, packages, module_args })
        }
        (None, None) => Err(Outcome::StartError { message: "the worker pool has no containerSpec or pythonPackageSpec".into() }),
    }
}

/// The newest modification time (µs) of any entry under `dir`, `depth` levels down.
fn newest_mtime(dir: &Path, depth: u32) -> Option<Micros> {
    let meta = std::fs::metadata(dir).ok()?;
    let mut best = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_micros() as Micros);
    if depth > 0 && meta.is_dir() {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            if let Some(t) = newest_mtime(&entry.path(), depth - 1) {
                best = Some(best.map_or(t, |b| b.max(t)));
            }
        }
    }
    best
}

pub fn study_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/hyperparameterTuningJobs/{id}")
}

/// A trial's CustomJob: the trial job spec with `--ID=VALUE` appended to every replica's
/// args, and its own output directory `<base>/<trialId>/`.
pub fn trial_resource(hp: &HyperparameterTuningJob, trial: &str, params: &[(String, study::ParamValue)]) -> CustomJob {
    let mut spec = hp.trial_job_spec.clone();
    let args: Vec<String> = params.iter().map(|(k, v)| format!("--{k}={}", v.arg())).collect();
    for pool in &mut spec.worker_pool_specs {
        if let Some(c) = &mut pool.container_spec {
            c.args.extend(args.iter().cloned());
        }
        if let Some(p) = &mut pool.python_package_spec {
            p.args.extend(args.iter().cloned());
        }
    }
    if let Some(out) = &mut spec.base_output_directory {
        out.output_uri_prefix = format!("{}/{trial}", out.output_uri_prefix.trim_end_matches('/'));
    }
    let mut name = format!("{}-trial-{trial}", hp.display_name);
    name.truncate(128);
    CustomJob { display_name: name, job_spec: spec, labels: hp.labels.clone(), ..CustomJob::default() }
}

/// The HyperparameterTuningJob as the API shows it (with or without its trials).
pub fn render_study(resource: &HyperparameterTuningJob, st: &Study, with_trials: bool) -> serde_json::Value {
    let mut v = serde_json::to_value(resource).unwrap_or_else(|_| serde_json::json!({}));
    let ts = |t: Micros| serde_json::Value::String(Timestamp::from_micros(t).to_rfc3339());
    v["name"] = serde_json::Value::String(study_name(&st.project, &st.region, st.id));
    v["state"] = serde_json::Value::String(st.state_name().to_string());
    v["createTime"] = ts(st.create_time);
    v["updateTime"] = ts(st.update_time);
    if let Some(t) = st.start_time {
        v["startTime"] = ts(t);
    }
    match &st.phase {
        study::StudyPhase::Succeeded { end } => v["endTime"] = ts(*end),
        study::StudyPhase::Failed { end, code, message } => {
            v["endTime"] = ts(*end);
            v["error"] = serde_json::json!({"code": code, "message": message});
        }
        study::StudyPhase::Cancelled { end } => {
            v["endTime"] = ts(*end);
            v["error"] = serde_json::json!({"code": 1, "message": "CANCELED"});
        }
        _ => {}
    }
    if with_trials && !st.trials.is_empty() {
        let metric = resource.study_spec.metrics.first().map(|m| m.metric_id.clone()).unwrap_or_default();
        let trials = study::render_trials(st, &metric, |j| job_name(&st.project, &st.region, j));
        v["trials"] = serde_json::Value::Array(trials);
    } else if let Some(o) = v.as_object_mut() {
        o.remove("trials");
    }
    v
}
