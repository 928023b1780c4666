//! The state of one job as the lifecycle sees it. States carry their own data, so an
//! impossible combination (an end time on a running job, a replica running in a queued
//! job) cannot be built.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How often a replica reported hung is looked at again for new writes: its allowed
/// silence, within these bounds.
const HANG_RECHECK_MIN: Micros = 1_000_000;
const HANG_RECHECK_MAX: Micros = 60_000_000;


/// Microseconds since the Unix epoch. The core never reads a clock: `now` is passed in.
pub type Micros = i64;

pub const SECOND: Micros = 1_000_000;
pub const MINUTE: Micros = 60 * SECOND;
pub const HOUR: Micros = 60 * MINUTE;
pub const DAY: Micros = 24 * HOUR;

/// The settings that the lifecycle rules name, with their defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// L11: restarts of one replica for non-permanent failures within an attempt.
    pub max_worker_restarts: u32,
    /// L12: job retries for each of L11, transient exit codes and stockouts.
    pub max_job_retries: u32,
    /// L16: job retries after internal errors (3 attempts in total).
    pub max_internal_retries: u32,
    /// L13: exit statuses that retry the whole job.
    pub transient_exit_codes: Vec<i32>,
    /// L9, L17, L18, L19, L20: SIGTERM, then this long, then SIGKILL.
    pub grace_period_secs: u64,
    /// L19: `scheduling.timeout` when the job does not set one.
    pub default_timeout_secs: u64,
    /// L21: warn when a RUNNING job has written no checkpoint for this long.
    pub checkpoint_warning_secs: u64,
    /// L15: first backoff before a job retry after a stockout; doubles each time.
    pub stockout_backoff_secs: u64,
    /// L15: upper bound of that backoff.
    pub stockout_backoff_max_secs: u64,
    /// L15: `scheduling.maxWaitDuration` of FLEX_START jobs when unset.
    pub default_max_wait_secs: u64,
    /// Hang detection: a running replica that writes nothing to its log, its checkpoint
    /// directory or its metric file for this long is reported; 0: off (the default; a job
    /// sets its own with the label `trainyard-hang-after-secs`).
    pub hang_after_secs: u64,
    /// Hang detection: a replica reported hung is also stopped and restarted, counted as a
    /// restart for a signal is (L10, L11).
    pub hang_restart: bool,
    /// L22 within a bound: the most bytes of output kept per replica run (its log rotates
    /// at half of it, the older half is dropped); 0: no bound.
    pub log_max_bytes_per_run: u64,
    /// L22 retention: the output of a job that ended this long ago is removed (its record
    /// and lifecycle events stay); 0: kept for as long as the job is.
    pub log_retention_secs: u64,
    /// L13 extended (`[[lifecycle.failure_rules]]`): checked in order before the built-in
    /// table of transient exit codes; the first that matches decides.
    pub failure_rules: Vec<FailureRule>,
    /// L19 warned: this long before the time limit every replica gets
    /// `timeout_warning_signal`, once (0: off; the label `trainyard-timeout-warning-secs`).
    pub timeout_warning_secs: u64,
    /// `SIGUSR1` or `SIGUSR2`.
    pub timeout_warning_signal: String,
    /// TY11: before a preemption, a reclaim, a drain, an elastic replica's leave or a
    /// timeout stops a replica, its program gets `timeout_warning_signal` and a notice in
    /// `$TRAINYARD_NOTICE_FILE` (the reason and the deadline), and this long to write its
    /// checkpoint and exit; then SIGTERM and the grace period as before. 0: off.
    pub preemption_notice_secs: u64,
}

/// A failure rule: a replica's exit that matches `exit_codes` (its status; 128 + N for
/// signal N; any if empty) and `log_pattern` (a regex over the last lines of its stderr;
/// any if unset) is handled by `action`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureRule {
    /// Named in the job's log when it decides (else its position, `failure_rules[i]`).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub exit_codes: Vec<i32>,
    #[serde(default)]
    pub log_pattern: Option<String>,
    pub action: RuleAction,
}

/// What a failure rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// A job retry (L12), as a transient exit code is.
    Transient,
    /// The job fails now (as a user error is, L13).
    Permanent,
    /// A job retry (L12) away from the replica's node, for this job only (a log line is no
    /// evidence about the node: it does not count towards its quarantine, L9).
    ExcludeNode,
}

/// The label that adds transient exit codes (L13) for one job: `"75,76"`.
pub const TRANSIENT_CODES_LABEL: &str = "trainyard-transient-exit-codes";
/// The label that sets a job's timeout warning, in seconds before its time limit.
pub const TIMEOUT_WARNING_LABEL: &str = "trainyard-timeout-warning-secs";

impl FailureRule {
    /// The rule's name in the log.
    pub fn label(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("failure_rules[{index}]"))
    }

    /// Does an exit of `status` with stderr `tail` match? (An invalid pattern, refused at
    /// load, never matches.)
    pub fn matches(&self, status: i32, tail: &[String]) -> bool {
        if !self.exit_codes.is_empty() && !self.exit_codes.contains(&status) {
            return false;
        }
        match &self.log_pattern {
            None => true,
            Some(p) => match regex::Regex::new(p) {
                Ok(re) => tail.iter().any(|l| re.is_match(l)),
                Err(_) => false,
            },
        }
    }

    /// What is wrong with the rule, if anything (checked when the configuration is read).
    pub fn check(&self) -> Result<(), String> {
        if self.exit_codes.is_empty() && self.log_pattern.is_none() {
            return Err("needs exit_codes, log_pattern or both".into());
        }
        if let Some(p) = &self.log_pattern {
            regex::Regex::new(p).map_err(|e| format!("log_pattern {p:?} is not a regular expression: {e}"))?;
        }
        Ok(())
    }
}

/// The name of a warning signal's number (TY6, TY11).
pub fn warning_signal_name(signal: i32) -> &'static str {
    match signal {
        12 => "SIGUSR2",
        _ => "SIGUSR1",
    }
}

/// The signal number of a timeout warning signal's name.
pub fn warning_signal(name: &str) -> Option<i32> {
    match name {
        "SIGUSR1" | "USR1" => Some(10),
        "SIGUSR2" | "USR2" => Some(12),
        _ => None,
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_worker_restarts: 5,
            max_job_retries: 3,
            max_internal_retries: 2,
            transient_exit_codes: vec![6, 134, 11, 139],
            grace_period_secs: 30,
            default_timeout_secs: 7 * 24 * 3600,
            checkpoint_warning_secs: 4 * 3600,
            stockout_backoff_secs: 60,
            stockout_backoff_max_secs: 1800,
            default_max_wait_secs: 24 * 3600,
            hang_after_secs: 0,
            hang_restart: false,
            log_max_bytes_per_run: 1 << 30,
            log_retention_secs: 0,
            failure_rules: Vec::new(),
            timeout_warning_secs: 0,
            timeout_warning_signal: "SIGUSR1".into(),
            preemption_notice_secs: 0,
        }
    }
}

impl Settings {
    pub fn grace(&self) -> Micros {
        secs(self.grace_period_secs)
    }
    pub fn checkpoint_warning(&self) -> Micros {
        secs(self.checkpoint_warning_secs)
    }
    /// L15: backoff before stockout retry number `n` (1-based).
    pub fn stockout_backoff(&self, n: u32) -> Micros {
        let base = secs(self.stockout_backoff_secs);
        let factor = 1i64.checked_shl(n.saturating_sub(1).min(30)).unwrap_or(i64::MAX);
        base.saturating_mul(factor).min(secs(self.stockout_backoff_max_secs))
    }
}

pub fn secs(s: u64) -> Micros {
    i64::try_from(s).unwrap_or(i64::MAX / SECOND).saturating_mul(SECOND)
}

/// The scheduling options of a job, resolved against the settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// L19, from admission.
    pub timeout: Micros,
    /// L12a.
    pub restart_job_on_worker_restart: bool,
    /// L12a.
    pub disable_retries: bool,
    /// L15: FLEX_START waits for capacity instead of failing on a stockout.
    pub flex_start: bool,
    /// `scheduling.strategy: SPOT`: runs on idle capacity and may be preempted when other
    /// work needs it (restarted when capacity returns, never counted against retries).
    #[serde(default)]
    pub spot: bool,
    /// L15: how long a FLEX_START job waits; 0 waits forever.
    pub max_wait: Micros,
    /// Hang detection: silence that reports a replica hung; 0: off.
    #[serde(default)]
    pub hang_after: Micros,
    #[serde(default)]
    pub hang_restart: bool,
    /// Its priority class's value (`schedule::PriorityClasses`); 0 without one.
    #[serde(default)]
    pub priority: i64,
    /// Its own least run time before a preemption for priority (label
    /// `trainyard-min-runtime-secs`); `[scheduler] min_runtime_secs` applies when larger.
    #[serde(default)]
    pub min_runtime: Micros,
    /// More transient exit codes (L13) for this job (label `trainyard-transient-exit-codes`).
    #[serde(default)]
    pub transient_exit_codes: Vec<i32>,
    /// L19 warned: this long before its time limit; 0: off.
    #[serde(default)]
    pub timeout_warning: Micros,
    /// TY10: its elastic pools (label `trainyard-min-replicas-workerpoolN`), each with the
    /// least number of replicas it runs with; `replicaCount` is the most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elastic: Vec<ElasticPool>,
}

/// TY10: a worker pool that runs with any number of replicas from `min` to its
/// `replicaCount`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticPool {
    pub pool: usize,
    pub min: u32,
}

/// TY10: the label that makes pool N elastic (`trainyard-min-replicas-workerpool1`).
pub const ELASTIC_LABEL_PREFIX: &str = "trainyard-min-replicas-workerpool";

impl Policy {
    pub fn defaults(settings: &Settings) -> Policy {
        Policy {
            timeout: secs(settings.default_timeout_secs),
            restart_job_on_worker_restart: false,
            disable_retries: false,
            flex_start: false,
            spot: false,
            max_wait: secs(settings.default_max_wait_secs),
            hang_after: secs(settings.hang_after_secs),
            hang_restart: settings.hang_restart,
            priority: 0,
            min_runtime: 0,
            transient_exit_codes: Vec::new(),
            timeout_warning: secs(settings.timeout_warning_secs),
            elastic: Vec::new(),
        }
    }

    /// TY10: the least replica count of `pool` when it is elastic.
    pub fn elastic_min(&self, pool: usize) -> Option<u32> {
        self.elastic.iter().find(|e| e.pool == pool).map(|e| e.min)
    }

    /// L12a: `disableRetries` overrides `restartJobOnWorkerRestart` to false.
    pub fn restarts_become_retries(&self) -> bool {
        self.restart_job_on_worker_restart && !self.disable_retries
    }
}

/// The job's error (a google.rpc.Status), set only on FAILED or CANCELLED (L2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobError {
    pub code: i32,
    pub message: String,
}

pub mod code {
    pub const CANCELLED: i32 = 1;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const INTERNAL: i32 = 13;
}

/// The wire state of a job (L1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Queued,
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelling,
    Cancelled,
}

impl State {
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Cancelled)
    }
    /// The wire name (`JOB_STATE_RUNNING`).
    pub fn wire_name(self) -> &'static str {
        match self {
            State::Queued => "JOB_STATE_QUEUED",
            State::Pending => "JOB_STATE_PENDING",
            State::Running => "JOB_STATE_RUNNING",
            State::Succeeded => "JOB_STATE_SUCCEEDED",
            State::Failed => "JOB_STATE_FAILED",
            State::Cancelling => "JOB_STATE_CANCELLING",
            State::Cancelled => "JOB_STATE_CANCELLED",
        }
    }
    pub const ALL: [State; 7] = [
        State::Queued,
        State::Pending,
        State::Running,
        State::Succeeded,
        State::Failed,
        State::Cancelling,
        State::Cancelled,
    ];
}

/// Why the job retries (L12): each kind has its own budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryKind {
    /// L11: a replica failed once more after its restart budget, or L12a turned a replica
    /// restart into a job retry.
    WorkerRestarts,
    /// L13: a transient exit code.
    TransientExit,
    /// L15: no capacity.
    Stockout,
    /// L16: an internal error.
    Internal,
}

/// Job retries used so far, per kind (L12, L16). Never reset (L23).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retries {
    pub worker_restarts: u32,
    pub transient_exit: u32,
    pub stockout: u32,
    pub internal: u32,
    /// Preemptions for a job of a higher priority class: counted neither as worker
    /// restarts (L11) nor as job retries (L12); a job is preempted at most
    /// `[scheduler] max_preemptions_per_job` times.
    #[serde(default)]
    pub preemptions: u32,
}

impl Retries {
    pub fn get(&self, kind: RetryKind) -> u32 {
        match kind {
            RetryKind::WorkerRestarts => self.worker_restarts,
            RetryKind::TransientExit => self.transient_exit,
            RetryKind::Stockout => self.stockout,
            RetryKind::Internal => self.internal,
        }
    }
    pub fn bump(&mut self, kind: RetryKind) -> u32 {
        let c = match kind {
            RetryKind::WorkerRestarts => &mut self.worker_restarts,
            RetryKind::TransientExit => &mut self.transient_exit,
            RetryKind::Stockout => &mut self.stockout,
            RetryKind::Internal => &mut self.internal,
        };
        *c += 1;
        *c
    }
    pub fn total(&self) -> u32 {
        self.worker_restarts + self.transient_exit + self.stockout + self.internal
    }
}

/// What happens once every replica of the attempt has stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum After {
    /// L17: the primary exited 0.
    Succeed,
    /// A permanent error (L13, L14, L15, L16, L19, or a retry budget spent).
    Fail(JobError),
    /// L12, L16: a fresh attempt. `reason` goes to the log.
    Retry { kind: RetryKind, reason: String },
    /// SPOT or priority preemption: a fresh attempt once capacity returns, counted
    /// against nothing. `requeue` (a cohort's reclaim): back to QUEUED, quota given back.
    Preempted {
        reason: String,
        #[serde(default)]
        requeue: bool,
    },
    /// L18.
    Cancel,
}

/// What the job waits for while it holds quota but has no running attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wait {
    /// Replicas have been launched; waiting for all of them to start (L7).
    Starting,
    /// L15: waiting to be placed again, not before `not_before` (retry backoff).
    Placement { not_before: Micros },
    /// L15 FLEX_START: waiting for capacity since `since`.
    Capacity { since: Micros },
}

/// The job's phase. The wire state is derived from it (`Job::state`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// L3: waiting for quota (and, with an exact fleet, capacity held by other jobs).
    Queued,
    /// L5: admitted, quota held; the attempt is starting or waiting to be placed.
    Pending { admitted_at: Micros, wait: Wait },
    /// L7: every replica of the attempt has started.
    Running { admitted_at: Micros },
    /// Replicas are being shut down; `then` is applied when the last one has stopped.
    /// `cancelling` shows the job as CANCELLING (L18); `was` is the state shown otherwise.
    Stopping { admitted_at: Micros, then: After, cancelling: bool, was: State },
    Succeeded { end: Micros },
    Failed { end: Micros, error: JobError },
    Cancelled { end: Micros, error: JobError },
}

/// Where a replica's current run is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaState {
    /// Not launched in this attempt (waiting for placement, or the attempt ended).
    Idle,
    /// Launch issued, not yet started.
    Launching,
    /// The program runs (L7).
    Running { since: Micros },
    /// Stop issued (SIGTERM, grace, SIGKILL). `then` says what follows its exit.
    /// `sigterm_at` (TY11): the program was given notice; SIGTERM follows at that time
    /// unless it has exited by then.
    Stopping {
        then: AfterReplicaStop,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sigterm_at: Option<Micros>,
    },
    /// Exited and not to be restarted in this attempt (L17: non-primary exit 0).
    Done,
    /// TY10: a replica of an elastic pool that is not part of the job now: never placed
    /// (the job started with fewer), or taken away (`cause`) by a drain, a lost node or a
    /// preemption. It joins again when the scheduler finds it room (`Event::Grow`). `ran`:
    /// it had a run in this attempt (its next run takes the next number).
    Away { since: Micros, cause: String, #[serde(default)] ran: bool },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterReplicaStop {
    /// Part of shutting the attempt down.
    Down,
    /// L9: node maintenance; restart on `node` with the same name and address, not
    /// counted against L11.
    Move { node: String },
    /// TY10: an elastic replica leaves the job for `cause` (it goes `Away`), not counted
    /// against L11 or L12.
    Leave { cause: String },
}

impl ReplicaState {
    /// A process of this replica may be alive (L20).
    pub fn is_live(&self) -> bool {
        matches!(self, ReplicaState::Launching | ReplicaState::Running { .. } | ReplicaState::Stopping { .. })
    }
}

/// One replica of the job; its name and address stay for the life of the job (L8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// `workerpool{pool}-{index}`.
    pub name: String,
    pub pool: usize,
    pub index: u32,
    /// The node it runs on (set at placement, kept across restarts).
    pub node: Option<String>,
    /// `HOST:PORT` owned for the life of the job (L8), set at first placement.
    pub address: Option<String>,
    /// Run number within the attempt: every restart (L9, L10) takes the next one.
    pub restart: u32,
    /// L11: restarts for non-permanent failures within the attempt.
    pub failures: u32,
    pub state: ReplicaState,
    /// The GPUs (UUIDs) of its node it holds, given at launch and kept across restarts on
    /// the same node (L10, L11); empty when its node has no GPU inventory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Hang detection: the last time the current run was seen writing (log, metric file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Micros>,
    /// Hang detection: when the current run was reported hung (cleared by new activity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hung_since: Option<Micros>,
    /// The silence reported was a straggler's: other replicas of the job went on meanwhile.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub straggler: bool,
    /// Hang detection: its processes were last seen stopped (SIGSTOP, a debugger).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspended: bool,
}

/// A job's health as its resource shows it (`trainyardHealth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// One replica silent while the others went on.
    Straggler { replica: String, since: Micros },
    /// Replicas silent, none going on.
    Hang { replica: String, since: Micros },
}

impl Replica {
    pub fn new(pool: usize, index: u32) -> Replica {
        Replica {
            name: format!("workerpool{pool}-{index}"),
            pool,
            index,
            node: None,
            address: None,
            restart: 0,
            failures: 0,
            state: ReplicaState::Idle,
            devices: Vec::new(),
            activity: None,
            hung_since: None,
            straggler: false,
            suspended: false,
        }
    }
    pub fn is_primary(&self) -> bool {
        self.pool == 0 && self.index == 0
    }
}

/// L21: checkpoint bookkeeping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// When a checkpoint was last seen written under AIP_CHECKPOINT_DIR.
    pub last_write: Option<Micros>,
    /// When the last "no checkpoint" warning was given.
    pub warned_at: Option<Micros>,
    /// Whether the job has a checkpoint directory at all.
    pub enabled: bool,
}

/// Resources a job asks for, in quota metrics (L3-L5) and per replica (placement).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// Quota metric name → amount for all replicas (e.g. `custom_model_training_cpus`).
    pub metrics: BTreeMap<String, u64>,
    /// Per replica, in replica order: what one node must offer to run it.
    pub replicas: Vec<ReplicaDemand>,
}

impl Demand {
    /// The accelerators of all replicas together, by type.
    pub fn accelerators_by_type(&self) -> BTreeMap<&str, u64> {
        let mut asks = BTreeMap::new();
        for d in &self.replicas {
            if let Some((a, c)) = &d.accelerator {
                *asks.entry(a.as_str()).or_insert(0) += *c as u64;
            }
        }
        asks
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDemand {
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Accelerator type (wire name) and count.
    pub accelerator: Option<(String, u32)>,
}

/// One job under the lifecycle rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: u64,
    pub project: String,
    pub region: String,
    pub policy: Policy,
    pub demand: Demand,
    pub phase: Phase,
    pub create_time: Micros,
    pub update_time: Micros,
    /// L2: the first RUNNING.
    pub start_time: Option<Micros>,
    /// 0-based attempt number.
    pub attempt: u32,
    pub retries: Retries,
    pub replicas: Vec<Replica>,
    pub checkpoint: Checkpoint,
    /// Why a QUEUED or PENDING job waits, in plain words (shown by the API and the CLI).
    pub waiting_reason: Option<String>,
    /// Set when the job is a trial of a HyperparameterTuningJob.
    #[serde(default)]
    pub trial: Option<TrialLink>,
    /// Set when the job runs a TrainingPipeline (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<u64>,
    /// L19 warned: the warning signal before the time limit was sent.
    #[serde(default)]
    pub timeout_warned: bool,
    /// Nodes its replicas failed on (signal deaths, lost runs, `exclude_node`): its next
    /// placements go elsewhere when another node fits. The latest few.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_nodes: Vec<String>,
    /// Its next job retry (L12) is placed again rather than started where it was: the
    /// failure that caused it may be its node's.
    #[serde(default)]
    pub place_again: bool,
    /// Where its time went so far (`goodput.rs`).
    #[serde(default)]
    pub goodput: Goodput,
}

/// TY10 goodput: how often a running elastic job's checkpoint directory is looked at.
pub const CHECKPOINT_LOOK_EVERY: Micros = 15 * SECOND;

/// How many nodes a job remembers to avoid.
pub const MAX_AVOID_NODES: usize = 8;

/// The study and trial a trial's CustomJob belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialLink {
    pub study: u64,
    pub trial: String,
}

impl Job {
    /// A new job (L3: it starts QUEUED). `pools[i]` is the replica count of pool i
    /// (0 for an empty placeholder pool).
    // Eight parts of a new job, each of its own type but the two strings.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        project: String,
        region: String,
        pools: &[u32],
        demand: Demand,
        policy: Policy,
        checkpoints: bool,
        now: Micros,
    ) -> Job {
        let replicas = pools
            .iter()
            .enumerate()
            .flat_map(|(pool, &count)| (0..count).map(move |index| Replica::new(pool, index)))
            .collect();
        Job {
            id,
            project,
            region,
            policy,
            demand,
            phase: Phase::Queued,
            create_time: now,
            update_time: now,
            start_time: None,
            attempt: 0,
            retries: Retries::default(),
            replicas,
            checkpoint: Checkpoint { enabled: checkpoints, ..Checkpoint::default() },
            waiting_reason: None,
            trial: None,
            pipeline: None,
            timeout_warned: false,
            avoid_nodes: Vec::new(),
            place_again: false,
            goodput: Goodput::default(),
        }
    }

    /// A job whose stored record could not be read: FAILED with an internal error naming
    /// the damage (L16), with nothing live, so that it is listed, shown and deletable
    /// instead of stopping the server.
    pub fn damaged(id: u64, project: String, region: String, create_time: Micros, now: Micros, damage: &str) -> Job {
        let mut job = Job::new(id, project, region, &[], Demand::default(), Policy::defaults(&Settings::default()), false, create_time);
        job.update_time = now;
        job.phase = Phase::Failed {
            end: now,
            error: JobError {
                code: code::INTERNAL,
                message: format!("Internal error: the stored record of this job is damaged and cannot be read ({damage}); the job was stopped."),
            },
        };
        job
    }

    /// The wire state (L1).
    pub fn state(&self) -> State {
        match &self.phase {
            Phase::Queued => State::Queued,
            Phase::Pending { .. } => State::Pending,
            Phase::Running { .. } => State::Running,
            Phase::Stopping { cancelling: true, .. } => State::Cancelling,
            Phase::Stopping { was, .. } => *was,
            Phase::Succeeded { .. } => State::Succeeded,
            Phase::Failed { .. } => State::Failed,
            Phase::Cancelled { .. } => State::Cancelled,
        }
    }

    pub fn is_terminal(&self) -> bool {
        self.state().is_terminal()
    }

    /// L2: set when the job became terminal.
    pub fn end_time(&self) -> Option<Micros> {
        match &self.phase {
            Phase::Succeeded { end } | Phase::Failed { end, .. } | Phase::Cancelled { end, .. } => Some(*end),
            _ => None,
        }
    }

    /// L2: only FAILED and CANCELLED jobs carry an error.
    pub fn error(&self) -> Option<&JobError> {
        match &self.phase {
            Phase::Failed { error, .. } | Phase::Cancelled { error, .. } => Some(error),
            _ => None,
        }
    }

    /// L5: quota is held from admission until the job is terminal.
    pub fn holds_quota(&self) -> bool {
        !matches!(self.phase, Phase::Queued) && !self.is_terminal()
    }

    /// Nodes are held while a replica is placed and may be alive.
    pub fn holds_capacity(&self) -> bool {
        match &self.phase {
            Phase::Queued => false,
            Phase::Pending { wait: Wait::Placement { .. } | Wait::Capacity { .. }, .. } => {
                self.replicas.iter().any(|r| r.state.is_live())
            }
            p => !matches!(p, Phase::Succeeded { .. } | Phase::Failed { .. } | Phase::Cancelled { .. }),
        }
    }

    /// The job waits to be placed on nodes (admission of a QUEUED job, or L15 re-placement).
    pub fn wants_placement(&self, now: Micros) -> bool {
        match &self.phase {
            Phase::Queued => true,
            Phase::Pending { wait: Wait::Placement { not_before }, .. } => now >= *not_before,
            Phase::Pending { wait: Wait::Capacity { .. }, .. } => true,
            _ => false,
        }
    }

    /// Admission time, for L19.
    pub fn admitted_at(&self) -> Option<Micros> {
        match &self.phase {
            Phase::Pending { admitted_at, .. } | Phase::Running { admitted_at } | Phase::Stopping { admitted_at, .. } => {
                Some(*admitted_at)
            }
            _ => None,
        }
    }

    pub fn replica(&self, name: &str) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.name == name)
    }

    pub fn live_replicas(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.state.is_live())
    }

    /// TY10: replica `i` is in an elastic pool (never the primary).
    pub fn is_elastic(&self, i: usize) -> bool {
        self.replicas.get(i).is_some_and(|r| !r.is_primary() && self.policy.elastic_min(r.pool).is_some())
    }

    /// TY10: the replicas a placement must hold: all but the elastic pools' replicas past
    /// their minimum (by index).
    pub fn minimum(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&i| {
                let r = &self.replicas[i];
                !self.is_elastic(i) || self.policy.elastic_min(r.pool).is_some_and(|min| r.index < min)
            })
            .collect()
    }

    /// The replicas pool `pool` asked for (its `replicaCount`).
    pub fn pool_size(&self, pool: usize) -> usize {
        self.replicas.iter().filter(|r| r.pool == pool).count()
    }

    /// TY10: replicas of `pool` that are part of the job now (not away, not stopping to
    /// leave).
    pub fn present(&self, pool: usize) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.pool == pool)
            .filter(|r| match &r.state {
                ReplicaState::Away { .. } | ReplicaState::Stopping { then: AfterReplicaStop::Leave { .. }, .. } => false,
                ReplicaState::Idle => r.node.is_some(),
                _ => true,
            })
            .count()
    }

    /// TY10: the job runs (or starts) with elastic replicas away, which the scheduler may
    /// place as capacity frees.
    pub fn wants_growth(&self) -> bool {
        matches!(self.phase, Phase::Running { .. } | Phase::Pending { wait: Wait::Starting, .. })
            && self.replicas.iter().any(|r| matches!(r.state, ReplicaState::Away { .. }))
    }

    /// L19 warned: when the warning before the time limit is due (not yet sent, the job
    /// running).
    pub fn timeout_warning_due(&self) -> Option<Micros> {
        if self.timeout_warned || self.policy.timeout_warning <= 0 || !matches!(self.phase, Phase::Running { .. }) {
            return None;
        }
        let admitted = self.admitted_at()?;
        Some(admitted.saturating_add(self.policy.timeout).saturating_sub(self.policy.timeout_warning))
    }

    /// L19: when the job's time limit, or the warning before it, is due next (None before
    /// admission and once the job is stopping for another reason).
    pub fn timeout_due(&self) -> Option<Micros> {
        let admitted = self.admitted_at()?;
        if matches!(self.phase, Phase::Stopping { .. }) {
            return None;
        }
        let limit = admitted.saturating_add(self.policy.timeout);
        Some(self.timeout_warning_due().map_or(limit, |w| w.min(limit)))
    }

    /// The next moment at which `step(.., Event::Tick, ..)` has something to do, or (for
    /// a retry backoff that has not ended by `now`) at which the job wants placement.
    pub fn next_deadline(&self, settings: &Settings, now: Micros) -> Option<Micros> {
        let mut best: Option<Micros> = None;
        let mut consider = |t: Micros| best = Some(best.map_or(t, |b| b.min(t)));
        // L19: the timeout runs from admission; a job already stopping for another reason
        // is left to finish stopping.
        if let Some(t) = self.timeout_due() {
            consider(t);
        }
        match &self.phase {
            Phase::Pending { wait: Wait::Placement { not_before }, .. } if *not_before > now => consider(*not_before),
            Phase::Pending { wait: Wait::Capacity { since }, .. } if self.policy.max_wait > 0 => {
                consider(since.saturating_add(self.policy.max_wait))
            }
            _ if self.replicas.iter().any(|r| matches!(r.state, ReplicaState::Stopping { sigterm_at: Some(_), .. })) => {
                // TY11: the end of a notice.
                for r in &self.replicas {
                    if let ReplicaState::Stopping { sigterm_at: Some(t), .. } = r.state {
                        consider(t)
                    }
                }
            }
            Phase::Running { .. } => {
                if let Some(t) = self.checkpoint_due(settings) {
                    consider(t)
                }
                if let Some(t) = self.checkpoint_look_due(now) {
                    consider(t)
                }
                for i in 0..self.replicas.len() {
                    if let Some(t) = self.hang_due(i) {
                        // Due but not reported (it waits for a stopped replica): looked at
                        // again a little later, not at once over and over.
                        consider(if t > now { t } else { now.saturating_add(HANG_RECHECK_MIN) })
                    }
                    // A replica reported hung is looked at again now and then: the tick
                    // that comes reads its writes (Event::Activity), which end the hang.
                    if self.replicas[i].hung_since.is_some() && self.replicas[i].state.is_live() {
                        consider(now.saturating_add(self.policy.hang_after.clamp(HANG_RECHECK_MIN, HANG_RECHECK_MAX)))
                    }
                }
            }
            _ => {}
        }
        best
    }

    /// Hang detection: when replica `i`'s run is due to be reported hung (it runs, has not
    /// been reported, and the job watches for hangs): the job's latest checkpoint, the
    /// run's latest output and its start, whichever is last, plus the allowed silence.
    pub fn hang_due(&self, i: usize) -> Option<Micros> {
        if self.policy.hang_after <= 0 {
            return None;
        }
        if self.replicas.get(i)?.hung_since.is_some() {
            return None;
        }
        Some(self.last_progress(i)?.saturating_add(self.policy.hang_after))
    }

    /// Hang detection: the last sign of progress of replica `i`'s running run: its start,
    /// its latest output or the job's latest checkpoint, whichever is last.
    pub fn last_progress(&self, i: usize) -> Option<Micros> {
        let r = self.replicas.get(i)?;
        let ReplicaState::Running { since } = r.state else { return None };
        [Some(since), r.activity, self.checkpoint.last_write].into_iter().flatten().max()
    }

    /// Its health: a replica reported silent (the earliest), straggler or hang.
    pub fn health(&self) -> Health {
        let silent = self.replicas.iter().filter(|r| r.state.is_live()).filter_map(|r| Some((r.hung_since?, r))).min_by_key(|(t, _)| *t);
        match silent {
            Some((since, r)) if r.straggler => Health::Straggler { replica: r.name.clone(), since },
            Some((since, r)) => Health::Hang { replica: r.name.clone(), since },
            None => Health::Ok,
        }
    }

    /// TY10 goodput: a running elastic job's checkpoint directory is looked at every
    /// [`CHECKPOINT_LOOK_EVERY`] (on a grid from its start), so that the work a change of
    /// its members throws away is counted from its latest checkpoint. The next look after
    /// `now`; None for other jobs.
    pub fn checkpoint_look_due(&self, now: Micros) -> Option<Micros> {
        if self.policy.elastic.is_empty() || !self.checkpoint.enabled || !matches!(self.phase, Phase::Running { .. }) {
            return None;
        }
        let base = self.start_time?;
        let k = now.saturating_sub(base).max(0) / CHECKPOINT_LOOK_EVERY + 1;
        Some(base.saturating_add(k.saturating_mul(CHECKPOINT_LOOK_EVERY)))
    }

    /// L21: when the next "no checkpoint" warning is due.
    pub fn checkpoint_due(&self, settings: &Settings) -> Option<Micros> {
        if !self.checkpoint.enabled {
            return None;
        }
        let since = [self.checkpoint.last_write, self.checkpoint.warned_at, self.start_time]
            .into_iter()
            .flatten()
            .max()?;
        Some(since.saturating_add(settings.checkpoint_warning()))
    }
}

/// Goodput (`goodput.rs`, which keeps it): a job's time by bucket.
/// Time by bucket, in microseconds (accelerator-microseconds for accelerator time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub queued: Micros,
    pub starting: Micros,
    pub productive: Micros,
    pub idle: Micros,
    pub lost: Micros,
}

/// A job's account, kept in the job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Goodput {
    /// Accounted up to here (0: nothing yet; the account starts at the job's creation).
    pub at: Micros,
    pub wall: Split,
    pub accelerator: Split,
    /// Productive wall and accelerator time since the last checkpoint.
    pub unsaved: (Micros, Micros),
}
