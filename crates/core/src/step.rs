//! The lifecycle rules L1-L23 as one pure function:
//! `step(job, event, now, settings) -> Transition { job, effects }`.
//!
//! No clock, no I/O: the driver commits the new job and its effects in one transaction
//! (L23) and then executes the effects. Every backend report carries its `RunId`
//! (fencing token): a report about an older attempt or restart changes nothing.

use serde::{Deserialize, Serialize};

use crate::job::{
    code, After, AfterReplicaStop, Job, JobError, Micros, Phase, ReplicaState, RetryKind, Settings, State, Wait,
};
use crate::run::{Outcome, RunId};

/// Something that happened to a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The scheduler admitted the job (L5) or placed it again after a stockout (L15):
    /// `nodes[i]` runs replica i; `addresses[i]` is its address for the life of the job
    /// (L8), given at the first placement (empty later: replicas keep theirs). `notes` go
    /// to the job's log (e.g. an accelerator the node lacks).
    Place { nodes: Vec<String>, addresses: Vec<String>, notes: Vec<String> },
    /// L15: the region has no capacity for the attempt (not a quota matter).
    Stockout { detail: String },
    /// The job can never be placed on the fleet (it lost nodes since the job was
    /// created): FAILED with code 9 (FAILED_PRECONDITION) and `reason`, without retries.
    Impossible { reason: String },
    /// A replica's program started (L7).
    Started { run: RunId },
    /// A replica's run ended; `stderr_tail` are its last stderr lines (L13).
    Exited { run: RunId, outcome: Outcome, stderr_tail: Vec<String> },
    /// L18.
    Cancel,
    /// L9: the replica's node goes into maintenance; restart it on `replacement`
    /// after SIGTERM and the grace period. `None`: no node can take it (L15).
    NodeMaintenance { replica: String, replacement: Option<String> },
    /// L9: the replica's node is gone; restart it on `replacement` at once.
    NodeLost { replica: String, replacement: Option<String> },
    /// L21: a checkpoint was seen written at `at`.
    CheckpointSeen { at: Micros },
    /// Hang detection: the replica's current run was seen writing at `at` (its log or its
    /// metric file).
    Activity { replica: String, at: Micros },
    /// Hang detection: the replica's processes are (or are no longer) stopped.
    Suspended { replica: String, stopped: bool },
    /// Time passed: timeouts (L19), FLEX_START waits (L15), checkpoint warnings (L21).
    Tick,
    /// The job's project stores more than its storage limit: a running or waiting job is
    /// stopped (SIGTERM and the grace period) and FAILS with RESOURCE_EXHAUSTED and
    /// `message`, without retries.
    StorageFull { message: String },
    /// A SPOT job's capacity is needed by other work: its replicas get SIGTERM and the grace
    /// period, then the job waits PENDING for capacity and starts a fresh attempt, counted
    /// against no retry budget.
    Preempt { reason: String },
    /// A job of a higher priority class needs this job's capacity
    /// (`[scheduler] priority_preemption`): stopped as a SPOT job is (SIGTERM, grace),
    /// then back in the queue keeping its quota and place, with the same checkpoint
    /// directory (L21); counted neither as a worker restart (L11) nor as a job retry
    /// (L12), only as a preemption. With `requeue`, a reclaim: the job ran on quota its
    /// project borrowed from its cohort, and the lender needs it back; it goes back to the
    /// queue QUEUED, giving its quota back (L3, L5), keeping its place.
    PreemptForPriority {
        reason: String,
        #[serde(default)]
        requeue: bool,
    },
    /// TY10: the scheduler found room for an elastic replica that is away: it joins the
    /// running job on `node`.
    Grow { replica: String, node: String },
    /// TY10: an elastic replica above its pool's minimum gives its room to work that
    /// waits (a preemption of that replica alone): SIGTERM, the grace period, then it
    /// leaves the job, counted against nothing.
    Leave { replica: String, cause: String },
}

/// What the driver must do after committing the transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Start the run on the node. Idempotent in the backend.
    Launch { run: RunId, node: String },
    /// SIGTERM, wait `grace`, then SIGKILL the run's whole process tree (L20).
    Stop { run: RunId, grace: Micros },
    /// A lifecycle event for the job's log (L22).
    Log(LogLine),
    /// The job was deleted: remove what the server kept of it on disk (run directories,
    /// venv, trial metric files; its outputs under baseOutputDirectory stay).
    Purge { job: u64 },
    /// Send `signal` to the run's program (TY6: the timeout warning before L19), nothing else.
    Signal { run: RunId, signal: i32 },
    /// TY11: notice before a stop: write `reason` and `deadline` to the run's notice file
    /// (`$TRAINYARD_NOTICE_FILE`), then send `signal`. SIGTERM follows at `deadline`
    /// (a later `Stop`) unless the run has exited.
    Notice { run: RunId, signal: i32, reason: String, deadline: Micros },
    /// A replica failed on `node` in a way that is evidence about the node, not the job (a
    /// lost run, the engine failing to launch it): counted towards the node's quarantine.
    /// A death by a signal, an exit, an OOM or a failure rule's match is the job's own and
    /// never emits this (L9).
    NodeFailed { node: String, replica: String, what: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    pub attempt: u32,
    pub replica: Option<String>,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub job: Job,
    pub effects: Vec<Effect>,
    /// False when the event was stale or changed nothing: nothing to commit.
    pub changed: bool,
}

/// A command the job's state does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// L18: cancelling a terminal job.
    #[error("{0}")]
    FailedPrecondition(String),
}

/// Apply one event to one job.
pub fn step(job: &Job, event: Event, now: Micros, settings: &Settings) -> Result<Transition, Rejected> {
    // L1: a terminal job never changes state again.
    if job.is_terminal() {
        return match event {
            Event::Cancel => Err(Rejected::FailedPrecondition(format!(
                "The job is in state {} and cannot be cancelled.",
                job.state().wire_name()
            ))),
            _ => Ok(Transition { job: job.clone(), effects: Vec::new(), changed: false }),
        };
    }
    let mut cx = Cx { job: job.clone(), effects: Vec::new(), now, settings, notice: None };
    let checkpointed = matches!(event, Event::CheckpointSeen { .. });
    match event {
        Event::Place { nodes, addresses, notes } => cx.place(nodes, addresses, notes),
        Event::Stockout { detail } => cx.stockout(detail),
        Event::Impossible { reason } => cx.impossible(reason),
        Event::Started { run } => cx.started(&run),
        Event::Exited { run, outcome, stderr_tail } => cx.exited(&run, outcome, stderr_tail),
        Event::Cancel => cx.cancel(),
        Event::NodeMaintenance { replica, replacement } => cx.node_event(&replica, replacement, true),
        Event::NodeLost { replica, replacement } => cx.node_event(&replica, replacement, false),
        Event::CheckpointSeen { at } => {
            if cx.job.checkpoint.last_write.is_none_or(|t| at > t) {
                cx.job.checkpoint.last_write = Some(at);
            }
        }
        Event::Activity { replica, at } => {
            if let Some(r) = cx.job.replicas.iter_mut().find(|r| r.name == replica && r.state.is_live()) {
                if r.activity.is_none_or(|t| at > t) {
                    r.activity = Some(at);
                    // Writing again: a hang reported before is over.
                    if r.hung_since.is_some_and(|h| at > h) {
                        r.hung_since = None;
                        r.straggler = false;
                    }
                }
            }
        }
        Event::Suspended { replica, stopped } => {
            if let Some(r) = cx.job.replicas.iter_mut().find(|r| r.name == replica && r.state.is_live()) {
                r.suspended = stopped;
            }
        }
        Event::Tick => cx.tick(),
        Event::Preempt { reason } => cx.preempt(reason),
        Event::PreemptForPriority { reason, requeue } => cx.preempt_for_priority(reason, requeue),
        Event::StorageFull { message } => cx.storage_full(message),
        Event::Grow { replica, node } => cx.grow(&replica, node),
        Event::Leave { replica, cause } => {
            let live = matches!(cx.job.phase, Phase::Running { .. } | Phase::Pending { wait: Wait::Starting, .. });
            let up = |r: &crate::job::Replica| r.name == replica && matches!(r.state, ReplicaState::Launching | ReplicaState::Running { .. });
            if let Some(idx) = cx.job.replicas.iter().position(up).filter(|_| live) {
                cx.leaves(idx, &cause, true);
            }
        }
    }
    let changed = cx.job != *job || !cx.effects.is_empty();
    if changed {
        // L2: updateTime at every change.
        cx.job.update_time = now;
        cx.job.goodput = crate::goodput::Goodput::after(job, &cx.job, now, checkpointed);
    }
    Ok(Transition { job: cx.job, effects: cx.effects, changed })
}

/// The rule behind a job's failure, from its error code and message.
fn failure_rule(error: &JobError) -> &'static str {
    match error.code {
        code::INVALID_ARGUMENT => "L13",
        code::RESOURCE_EXHAUSTED if error.message.contains("storage_gb") => "TY7",
        code::RESOURCE_EXHAUSTED if error.message.contains("memory") => "L14",
        code::RESOURCE_EXHAUSTED => "L15",
        code::INTERNAL => "L16",
        code::DEADLINE_EXCEEDED => "L19",
        _ => "L1",
    }
}

/// What separates an exit message from the replica's last lines of stderr.
const STDERR_TAIL: &str = "\nLast lines of stderr:\n";

/// L13: the message of a user code exception.
pub fn exit_message(replica: &str, status: i32, reason: &str, tail: &[String]) -> String {
    // The last 20 lines (failure rules look at up to 100).
    let tail = &tail[tail.len().saturating_sub(MESSAGE_TAIL_LINES)..];
    let mut m = format!("The replica {replica} exited with a non-zero status of {status}. Termination reason: {reason}.");
    if !tail.is_empty() {
        m.push_str(STDERR_TAIL);
        m.push_str(&tail.join("\n"));
    }
    m
}

/// The lines of stderr an error message carries.
pub const MESSAGE_TAIL_LINES: usize = 20;

/// An [`exit_message`] split into its first part and the last lines of stderr it carries
/// (`None` when it carries none).
pub fn split_stderr_tail(message: &str) -> (&str, Option<&str>) {
    match message.split_once(STDERR_TAIL) {
        Some((first, tail)) => (first, Some(tail)),
        None => (message, None),
    }
}

/// L14.
pub fn oom_message(replica: &str, status: i32) -> String {
    format!("The replica {replica} ran out of memory and exited with a non-zero status of {status}.")
}

/// L15.
pub fn stockout_message(region: &str) -> String {
    format!("Resources are insufficient in region: {region}. Try a different region or use a different accelerator.")
}

/// L16.
pub const INTERNAL_MESSAGE: &str = "Internal error occurred for the current attempt.";

struct Cx<'a> {
    job: Job,
    effects: Vec<Effect>,
    now: Micros,
    settings: &'a Settings,
    /// TY11: the reason the replicas stopped by this event are given notice first.
    notice: Option<String>,
}

impl Cx<'_> {
    /// A lifecycle event for the job's log, citing the rule that made it
    /// (`L11: Replica workerpool0-0 was killed by signal 9; restarting it (2 of 5).`).
    fn log_rule(&mut self, rule: &str, replica: Option<&str>, text: impl Into<String>) {
        self.effects.push(Effect::Log(LogLine {
            attempt: self.job.attempt,
            replica: replica.map(str::to_owned),
            text: format!("{rule}: {}", text.into()),
        }));
    }

    fn run_id(&self, idx: usize) -> RunId {
        let r = &self.job.replicas[idx];
        RunId { job: self.job.id, attempt: self.job.attempt, replica: r.name.clone(), restart: r.restart }
    }

    fn launch(&mut self, idx: usize) {
        let Some(node) = self.job.replicas[idx].node.clone() else {
            // Unreachable by construction: replicas are placed before they launch.
            return;
        };
        let r = &mut self.job.replicas[idx];
        r.state = ReplicaState::Launching;
        // A new run: hang detection starts afresh.
        r.activity = None;
        r.hung_since = None;
        r.straggler = false;
        r.suspended = false;
        let run = self.run_id(idx);
        self.effects.push(Effect::Launch { run, node });
    }

    /// Whether `stop` gives the replica notice first (TY11): a reason for it, a notice
    /// period, and a program that runs.
    fn gives_notice(&self, idx: usize) -> bool {
        self.notice.is_some()
            && self.settings.preemption_notice_secs > 0
            && matches!(self.job.replicas[idx].state, ReplicaState::Running { .. })
    }

    /// How `stop` will stop the replica, in the log's words.
    fn stop_words(&self, idx: usize) -> String {
        if self.gives_notice(idx) {
            format!("notice ({}s, {}), then SIGTERM", self.settings.preemption_notice_secs, self.settings.timeout_warning_signal)
        } else {
            "SIGTERM".to_string()
        }
    }

    fn stop(&mut self, idx: usize, then: AfterReplicaStop) {
        let run = self.run_id(idx);
        let notice = crate::job::secs(self.settings.preemption_notice_secs);
        if let (Some(reason), true) = (self.notice.clone(), self.gives_notice(idx)) {
            // TY11: notice first (the warning signal and the notice file); SIGTERM when
            // it ends, unless the program has exited by then.
            let deadline = self.now.saturating_add(notice);
            self.job.replicas[idx].state = ReplicaState::Stopping { then, sigterm_at: Some(deadline) };
            let signal = crate::job::warning_signal(&self.settings.timeout_warning_signal).unwrap_or(10);
            self.effects.push(Effect::Notice { run, signal, reason, deadline });
            return;
        }
        self.job.replicas[idx].state = ReplicaState::Stopping { then, sigterm_at: None };
        let grace = self.settings.grace();
        self.effects.push(Effect::Stop { run, grace });
    }

    /// TY11: notices that ran out: SIGTERM and the grace period now.
    fn notices_due(&mut self) {
        for idx in 0..self.job.replicas.len() {
            if let ReplicaState::Stopping { sigterm_at: Some(t), .. } = self.job.replicas[idx].state {
                if self.now >= t {
                    self.sigterm_now(idx);
                }
            }
        }
    }

    /// A replica given notice is sent SIGTERM at once.
    fn sigterm_now(&mut self, idx: usize) {
        if let ReplicaState::Stopping { sigterm_at, .. } = &mut self.job.replicas[idx].state {
            if sigterm_at.take().is_some() {
                let run = self.run_id(idx);
                let grace = self.settings.grace();
                self.effects.push(Effect::Stop { run, grace });
            }
        }
    }

    fn admitted_at(&self) -> Micros {
        self.job.admitted_at().unwrap_or(self.now)
    }

    /// L6: every replica of the attempt is launched at once, in parallel.
    fn launch_attempt(&mut self) {
        let admitted_at = self.admitted_at();
        self.job.phase = Phase::Pending { admitted_at, wait: Wait::Starting };
        self.log_rule("L6", None, "Waiting for job to be provisioned.");
        for idx in 0..self.job.replicas.len() {
            if self.job.replicas[idx].node.is_none() && self.job.is_elastic(idx) {
                // TY10: an elastic replica without room starts away and joins later.
                let cause = "no room for it when the attempt started".to_string();
                self.job.replicas[idx].state = ReplicaState::Away { since: self.now, cause, ran: false };
            } else {
                self.launch(idx);
            }
        }
        self.log_elastic_start();
    }

    /// TY10: how many replicas of each elastic pool the attempt starts with.
    fn log_elastic_start(&mut self) {
        for e in self.job.policy.elastic.clone() {
            let max = self.job.pool_size(e.pool);
            let now = self.job.present(e.pool);
            if now < max {
                self.log_rule(
                    "TY10",
                    None,
                    format!("Elastic pool workerpool{}: starting with {now} of {max} replicas (at least {}); the others join as capacity frees.", e.pool, e.min),
                );
            }
        }
    }

    /// L5 admission, or L15 placement again after a stockout.
    fn place(&mut self, nodes: Vec<String>, addresses: Vec<String>, notes: Vec<String>) {
        let n = self.job.replicas.len();
        if !self.job.wants_placement(self.now) || nodes.len() != n || !(addresses.is_empty() || addresses.len() == n) {
            return;
        }
        // TY10: only an elastic replica may be left unplaced (""), and only past its
        // pool's minimum.
        let minimum = self.job.minimum();
        if nodes.iter().enumerate().any(|(i, node)| node.is_empty() && minimum.contains(&i)) {
            return;
        }
        for (r, address) in self.job.replicas.iter_mut().zip(addresses) {
            r.address.get_or_insert(address);
        }
        if matches!(self.job.phase, Phase::Queued) {
            self.job.phase = Phase::Pending { admitted_at: self.now, wait: Wait::Starting };
            self.log_rule("L5", None, "Job admitted: quota is held until the job ends.");
        }
        for (r, node) in self.job.replicas.iter_mut().zip(nodes) {
            r.node = (!node.is_empty()).then_some(node);
        }
        self.job.waiting_reason = None;
        for n in notes {
            self.log_rule("L5", None, n);
        }
        self.launch_attempt();
    }

    /// L15: no capacity for the attempt.
    fn stockout(&mut self, detail: String) {
        let message = stockout_message(&self.job.region);
        match &self.job.phase {
            Phase::Queued => {
                // The job is admitted (quota held, L5) and its first attempt fails.
                self.job.phase = Phase::Pending { admitted_at: self.now, wait: Wait::Starting };
                self.log_rule("L5", None, "Job admitted: quota is held until the job ends.");
            }
            Phase::Pending { wait: Wait::Capacity { .. }, .. } => return, // already waiting
            Phase::Stopping { .. } => return,
            _ => {}
        }
        self.log_rule("L15", None, format!("{message} ({detail})"));
        if self.job.policy.flex_start && !self.job.live_replicas().any(|_| true) {
            self.wait_for_capacity(detail);
            return;
        }
        let error = JobError { code: code::RESOURCE_EXHAUSTED, message };
        self.retry_or_fail(RetryKind::Stockout, format!("stockout: {detail}"), error);
    }

    /// The job can never be placed: it fails at once, whatever its retry budget.
    fn impossible(&mut self, reason: String) {
        let error = JobError { code: code::FAILED_PRECONDITION, message: reason };
        match &self.job.phase {
            Phase::Queued => {
                self.job.phase =
                    Phase::Stopping { admitted_at: self.now, then: After::Fail(error), cancelling: false, was: State::Queued };
                self.finish_if_down();
            }
            Phase::Pending { .. } => self.end_attempt(After::Fail(error)),
            // Running or stopping: the job holds its nodes and wants no placement.
            _ => {}
        }
    }

    /// TY7: a quota the job cannot go on under (its project's storage): the attempt ends
    /// and the job fails, not retried.
    fn storage_full(&mut self, message: String) {
        let error = JobError { code: code::RESOURCE_EXHAUSTED, message };
        match &self.job.phase {
            Phase::Queued => {
                self.job.phase =
                    Phase::Stopping { admitted_at: self.now, then: After::Fail(error), cancelling: false, was: State::Queued };
                self.finish_if_down();
            }
            Phase::Pending { .. } | Phase::Running { .. } => self.end_attempt(After::Fail(error)),
            _ => {}
        }
    }

    /// L15 FLEX_START: wait PENDING for capacity, up to maxWaitDuration.
    fn wait_for_capacity(&mut self, detail: String) {
        let admitted_at = self.admitted_at();
        self.job.phase = Phase::Pending { admitted_at, wait: Wait::Capacity { since: self.now } };
        let limit = if self.job.policy.max_wait == 0 {
            "with no limit".to_string()
        } else {
            format!("up to {}s", self.job.policy.max_wait / crate::job::SECOND)
        };
        self.job.waiting_reason = Some(format!("FLEX_START: waiting for capacity ({detail}), {limit}."));
        self.log_rule("L15", None, format!("FLEX_START: waiting for capacity {limit}."));
    }

    /// L7: RUNNING once every replica of the attempt has started.
    fn started(&mut self, run: &RunId) {
        let Some(idx) = self.current(run) else { return };
        if self.job.replicas[idx].state != ReplicaState::Launching {
            return;
        }
        self.job.replicas[idx].state = ReplicaState::Running { since: self.now };
        if self.job.replicas[idx].restart > 0 {
            // A restarted replica rejoins: the others, which waited for it (a collective),
            // are allowed their silence afresh from now.
            let now = self.now;
            for (i, r) in self.job.replicas.iter_mut().enumerate() {
                if i != idx && matches!(r.state, ReplicaState::Running { .. }) && r.hung_since.is_none() {
                    r.activity = Some(r.activity.map_or(now, |a| a.max(now)));
                }
            }
        }
        self.maybe_running();
    }

    fn maybe_running(&mut self) {
        let Phase::Pending { admitted_at, wait: Wait::Starting } = self.job.phase else { return };
        let all_started = self
            .job
            .replicas
            .iter()
            .all(|r| matches!(r.state, ReplicaState::Running { .. } | ReplicaState::Done | ReplicaState::Away { .. }));
        if all_started {
            self.job.phase = Phase::Running { admitted_at };
            self.job.start_time.get_or_insert(self.now);
            self.log_rule("L7", None, "Job is running.");
        }
    }

    /// The replica index of a report about the current run; None for a stale report.
    fn current(&self, run: &RunId) -> Option<usize> {
        if run.job != self.job.id || run.attempt != self.job.attempt {
            return None;
        }
        let idx = self.job.replicas.iter().position(|r| r.name == run.replica)?;
        let r = &self.job.replicas[idx];
        (r.restart == run.restart && r.state.is_live()).then_some(idx)
    }

    fn exited(&mut self, run: &RunId, outcome: Outcome, tail: Vec<String>) {
        let Some(idx) = self.current(run) else { return };
        let name = self.job.replicas[idx].name.clone();
        let status = outcome.exit_status();
        match self.job.replicas[idx].state.clone() {
            ReplicaState::Stopping { then: AfterReplicaStop::Move { node }, .. }
                if !matches!(self.job.phase, Phase::Stopping { .. }) =>
            {
                // L9: restarted on another node, same name and address, not counted (L11).
                let r = &mut self.job.replicas[idx];
                r.node = Some(node.clone());
                r.restart += 1;
                self.log_rule("L9", Some(&name), format!("Replica {name} restarted on node {node} after node maintenance."));
                self.launch(idx);
                return;
            }
            ReplicaState::Stopping { then: AfterReplicaStop::Leave { cause }, .. } if !matches!(self.job.phase, Phase::Stopping { .. }) => {
                // TY10: it has left; the others go on without it.
                self.log_rule("L20", Some(&name), format!("Replica {name} stopped ({}).", describe(&outcome)));
                self.go_away(idx, cause);
                return;
            }
            ReplicaState::Stopping { .. } => {
                self.job.replicas[idx].state = ReplicaState::Idle;
                self.log_rule("L20", Some(&name), format!("Replica {name} stopped ({}).", describe(&outcome)));
                self.finish_if_down();
                return;
            }
            _ => {}
        }
        if matches!(self.job.phase, Phase::Stopping { .. }) {
            // The attempt is already ending: an outcome now is not classified.
            self.job.replicas[idx].state = ReplicaState::Idle;
            self.finish_if_down();
            return;
        }
        // TY9: the failure rules first (the first that matches decides), then L13's table.
        let status_of = match &outcome {
            Outcome::Exited { code } if *code != 0 => Some(*code),
            Outcome::Signaled { signal } => Some(128 + signal),
            _ => None,
        };
        if let Some(status) = status_of {
            if let Some((i, rule)) = self.settings.failure_rules.iter().enumerate().find(|(_, r)| r.matches(status, &tail)) {
                let (label, action) = (rule.label(i), rule.action);
                self.by_rule(idx, status, &label, action, tail);
                return;
            }
        }
        let transient = |s: i32| self.settings.transient_exit_codes.contains(&s) || self.job.policy.transient_exit_codes.contains(&s);
        // L10: classify at once.
        match outcome {
            Outcome::Exited { code: 0 } if self.job.replicas[idx].is_primary() => {
                // L17: the primary's success ends the job; other replicas are shut down.
                self.job.replicas[idx].state = ReplicaState::Done;
                self.log_rule("L17", Some(&name), format!("Replica {name} exited with status 0."));
                self.end_attempt(After::Succeed);
            }
            Outcome::Exited { code: 0 } => {
                // L17: a non-primary that exits 0 is finished and not restarted.
                self.job.replicas[idx].state = ReplicaState::Done;
                self.log_rule("L17", Some(&name), format!("Replica {name} finished with status 0."));
                self.maybe_running();
            }
            Outcome::Exited { code } if transient(code) => self.transient(idx, code, tail),
            Outcome::Signaled { signal } if transient(128 + signal) => self.transient(idx, 128 + signal, tail),
            Outcome::Exited { code } => {
                // L13: user code exception, permanent.
                self.job.replicas[idx].state = ReplicaState::Idle;
                let message = exit_message(&name, code, "Error", &tail);
                self.fail(message, code::INVALID_ARGUMENT);
            }
            Outcome::StartError { message } => {
                // L13: the program could not be started.
                self.job.replicas[idx].state = ReplicaState::Idle;
                let mut tail = tail;
                tail.push(message);
                let message = exit_message(&name, status, "StartError", &tail);
                self.fail(message, code::INVALID_ARGUMENT);
            }
            Outcome::OomKilled { status } => {
                // L14: out of memory, from the cgroup's OOM-kill accounting.
                self.job.replicas[idx].state = ReplicaState::Idle;
                self.fail(oom_message(&name, status), code::RESOURCE_EXHAUSTED);
            }
            Outcome::Signaled { .. } | Outcome::Lost { .. } => self.non_permanent(idx, &outcome, tail),
            Outcome::LaunchFailed { message } => {
                // L16: a failure of Trainyard or its engine.
                self.job.replicas[idx].state = ReplicaState::Idle;
                // L9: the engine failing to launch is evidence about the node.
                self.node_failed(idx, format!("could not be launched: {message}"), false);
                self.log_rule("L16", Some(&name), format!("Replica {name} could not be launched: {message}"));
                self.log_rule("L16", None, INTERNAL_MESSAGE);
                let error = JobError { code: code::INTERNAL, message: INTERNAL_MESSAGE.to_string() };
                self.retry_or_fail(RetryKind::Internal, format!("internal error launching {name}: {message}"), error);
            }
        }
    }

    fn fail(&mut self, message: String, code: i32) {
        self.end_attempt(After::Fail(JobError { code, message }));
    }

    /// TY9: a failure rule decided (`[[lifecycle.failure_rules]]`).
    fn by_rule(&mut self, idx: usize, status: i32, rule: &str, action: crate::job::RuleAction, tail: Vec<String>) {
        use crate::job::RuleAction;
        let name = self.job.replicas[idx].name.clone();
        let node = self.job.replicas[idx].node.clone().unwrap_or_default();
        let what = match action {
            RuleAction::Transient => "transient: the job is retried (L12)".to_string(),
            RuleAction::Permanent => "permanent: the job fails".to_string(),
            RuleAction::ExcludeNode => format!("exclude_node: the job is retried (L12) away from node {node}"),
        };
        self.log_rule("TY9", Some(&name), format!("Replica {name} exited with status {status}; failure rule {rule} matched: {what}."));
        if action == RuleAction::ExcludeNode {
            // L9: the job avoids the node; the node's quarantine does not count it (a log
            // line a tenant writes is no evidence about the node).
            self.avoid_node(idx, true);
        }
        self.job.replicas[idx].state = ReplicaState::Idle;
        let error = JobError { code: code::INVALID_ARGUMENT, message: exit_message(&name, status, "Error", &tail) };
        match action {
            RuleAction::Permanent => self.end_attempt(After::Fail(error)),
            RuleAction::Transient | RuleAction::ExcludeNode => {
                self.retry_or_fail(RetryKind::TransientExit, format!("replica {name} exited with status {status} (failure rule {rule})"), error)
            }
        }
    }

    /// L13: a transient exit code retries the whole job (L12).
    fn transient(&mut self, idx: usize, status: i32, tail: Vec<String>) {
        let name = self.job.replicas[idx].name.clone();
        self.job.replicas[idx].state = ReplicaState::Idle;
        let error = JobError { code: code::INVALID_ARGUMENT, message: exit_message(&name, status, "Error", &tail) };
        self.retry_or_fail(RetryKind::TransientExit, format!("replica {name} exited with transient status {status}"), error);
    }

    /// The job's next placements avoid the replica's node when another fits; `retry`: the
    /// retry this failure causes is placed again (L12), away from the node.
    fn avoid_node(&mut self, idx: usize, retry: bool) -> Option<String> {
        let node = self.job.replicas[idx].node.clone()?;
        self.job.place_again |= retry;
        if !self.job.avoid_nodes.contains(&node) {
            if self.job.avoid_nodes.len() >= crate::job::MAX_AVOID_NODES {
                self.job.avoid_nodes.remove(0);
            }
            self.job.avoid_nodes.push(node.clone());
        }
        Some(node)
    }

    /// L9: a failure that is evidence about its node (a lost run, a launch the engine
    /// could not make): the job avoids the node, and the node's quarantine counts it.
    fn node_failed(&mut self, idx: usize, what: String, retry: bool) {
        let Some(node) = self.avoid_node(idx, retry) else { return };
        let replica = self.job.replicas[idx].name.clone();
        self.effects.push(Effect::NodeFailed { node, replica, what });
    }

    /// L10: a non-permanent failure restarts the replica on the same node (L11 limit).
    fn non_permanent(&mut self, idx: usize, outcome: &Outcome, tail: Vec<String>) {
        let name = self.job.replicas[idx].name.clone();
        let status = outcome.exit_status();
        let what = describe(outcome);
        let retries = self.job.policy.restarts_become_retries() || self.job.replicas[idx].failures >= self.settings.max_worker_restarts;
        if matches!(outcome, Outcome::Lost { .. }) {
            // L9: a run lost with its supervisor (or its node) says something of the node.
            self.node_failed(idx, what.clone(), retries);
        } else {
            // L9: a death by a signal is the job's own (its program, or another of its
            // processes, sent it); the job's retry avoids the node, nothing is counted.
            self.avoid_node(idx, retries);
        }
        let error = JobError { code: code::INVALID_ARGUMENT, message: exit_message(&name, status, "Error", &tail) };
        if self.job.policy.restarts_become_retries() {
            // L12a: any replica restart becomes a job retry.
            self.job.replicas[idx].state = ReplicaState::Idle;
            let reason = format!("replica {name} {what} and scheduling.restartJobOnWorkerRestart is set");
            self.retry_or_fail(RetryKind::WorkerRestarts, reason, error);
            return;
        }
        let max = self.settings.max_worker_restarts;
        let r = &mut self.job.replicas[idx];
        if r.failures < max {
            r.failures += 1;
            r.restart += 1;
            let n = r.failures;
            self.log_rule("L11", Some(&name), format!("Replica {name} {what}; restarting it ({n} of {max})."));
            self.launch(idx);
        } else {
            // L11: the next failure after the limit retries the whole job.
            self.job.replicas[idx].state = ReplicaState::Idle;
            let reason = format!("replica {name} {what} after {max} restarts");
            self.retry_or_fail(RetryKind::WorkerRestarts, reason, error);
        }
    }

    /// L12, L12a, L16: a job retry if the budget allows, else FAILED with `error`.
    fn retry_or_fail(&mut self, kind: RetryKind, reason: String, error: JobError) {
        let s = self.settings;
        if self.job.policy.disable_retries {
            self.log_rule("L12", None, format!("Job will not be retried: scheduling.disableRetries is set ({reason})."));
            self.end_attempt(After::Fail(error));
            return;
        }
        let limit = if kind == RetryKind::Internal { s.max_internal_retries } else { s.max_job_retries };
        if self.job.retries.get(kind) < limit {
            self.end_attempt(After::Retry { kind, reason });
        } else {
            self.log_rule("L12", None, "Job will not be retried, max error retry attempts reached.");
            self.end_attempt(After::Fail(error));
        }
    }

    /// Shut every live replica down (L17, L18, L19, L20); `then` is applied once all are down.
    fn end_attempt(&mut self, then: After) {
        let was = match self.job.state() {
            State::Running => State::Running,
            _ => State::Pending,
        };
        let cancelling = matches!(then, After::Cancel);
        let admitted_at = self.admitted_at();
        for idx in 0..self.job.replicas.len() {
            match &self.job.replicas[idx].state {
                ReplicaState::Launching | ReplicaState::Running { .. } => self.stop(idx, AfterReplicaStop::Down),
                ReplicaState::Stopping { .. } => {
                    // A notice goes on only when this end gives notice too (TY11).
                    if self.notice.is_none() {
                        self.sigterm_now(idx);
                    }
                    if let ReplicaState::Stopping { then, .. } = &mut self.job.replicas[idx].state {
                        *then = AfterReplicaStop::Down;
                    }
                }
                ReplicaState::Idle | ReplicaState::Done | ReplicaState::Away { .. } => {}
            }
        }
        self.job.phase = Phase::Stopping { admitted_at, then, cancelling, was };
        self.finish_if_down();
    }

    /// Once no replica of the attempt is alive, apply what the attempt's end decided.
    fn finish_if_down(&mut self) {
        let Phase::Stopping { admitted_at, then, .. } = &self.job.phase else { return };
        if self.job.live_replicas().any(|_| true) {
            return;
        }
        let (admitted_at, then) = (*admitted_at, then.clone());
        let end = self.now;
        match then {
            After::Succeed => {
                self.job.phase = Phase::Succeeded { end };
                self.log_rule("L17", None, "Job completed successfully.");
            }
            After::Fail(error) => {
                self.log_rule(failure_rule(&error), None, format!("Job failed. {}", error.message));
                self.job.phase = Phase::Failed { end, error };
            }
            After::Cancel => {
                // L18: CANCELLED with code 1.
                self.job.phase =
                    Phase::Cancelled { end, error: JobError { code: code::CANCELLED, message: "CANCELED".into() } };
                self.log_rule("L18", None, "Job cancelled.");
            }
            After::Preempted { reason, requeue: true } => {
                // A reclaim: the quota goes back to the cohort's lender (L3, L5); admitted
                // again, in its old place, when its quota is free.
                self.next_attempt();
                self.job.phase = Phase::Queued;
                self.job.waiting_reason = Some(format!("Preempted ({reason}); back in the queue, waiting for quota."));
                for r in &mut self.job.replicas {
                    r.node = None;
                }
            }
            After::Preempted { reason, requeue: false } => {
                // Counted against nothing; placed again when capacity returns.
                self.next_attempt();
                self.job.phase = Phase::Pending { admitted_at, wait: Wait::Placement { not_before: end } };
                self.job.waiting_reason = Some(if self.job.policy.spot {
                    format!("SPOT: preempted ({reason}); waiting for capacity.")
                } else {
                    format!("Preempted ({reason}); waiting for capacity.")
                });
                for r in &mut self.job.replicas {
                    r.node = None;
                }
            }
            After::Retry { kind: RetryKind::Stockout, reason } if self.job.policy.flex_start => {
                // L15 FLEX_START: wait for capacity instead of spending a retry.
                self.next_attempt();
                self.job.phase = Phase::Pending { admitted_at, wait: Wait::Placement { not_before: end } };
                self.wait_for_capacity(reason);
            }
            After::Retry { kind, reason } => {
                let n = self.job.retries.bump(kind);
                let limit =
                    if kind == RetryKind::Internal { self.settings.max_internal_retries } else { self.settings.max_job_retries };
                self.next_attempt();
                self.log_rule("L12", None, format!("Job retry {n} of {limit}: {reason}."));
                if kind == RetryKind::Stockout {
                    // L15: retried with backoff, placed again.
                    let not_before = end.saturating_add(self.settings.stockout_backoff(n));
                    self.job.phase = Phase::Pending { admitted_at, wait: Wait::Placement { not_before } };
                    self.job.waiting_reason = Some(format!(
                        "Stockout in region {}: retry {n} of {limit} after a backoff of {}s.",
                        self.job.region,
                        (not_before - end) / crate::job::SECOND
                    ));
                } else if std::mem::take(&mut self.job.place_again) {
                    // Placed again, away from the node(s) its replicas failed on when
                    // another fits (the scheduler decides).
                    self.job.phase = Phase::Pending { admitted_at, wait: Wait::Placement { not_before: end } };
                    self.job.waiting_reason = Some(format!(
                        "Retry {n}: waiting to be placed again, away from node(s) {} where its replicas failed.",
                        self.job.avoid_nodes.join(", ")
                    ));
                    for r in &mut self.job.replicas {
                        r.node = None;
                    }
                } else {
                    self.job.phase = Phase::Pending { admitted_at, wait: Wait::Starting };
                    self.launch_attempt();
                }
            }
        }
    }

    /// A fresh attempt: replicas keep their names, nodes and addresses (L8), their
    /// per-attempt counters start again.
    fn next_attempt(&mut self) {
        self.job.attempt += 1;
        for r in &mut self.job.replicas {
            r.restart = 0;
            r.failures = 0;
            r.state = ReplicaState::Idle;
        }
    }

    /// L18.
    fn cancel(&mut self) {
        match &mut self.job.phase {
            Phase::Queued => {
                // A QUEUED job is cancelled at once.
                self.job.phase = Phase::Stopping {
                    admitted_at: self.now,
                    then: After::Cancel,
                    cancelling: true,
                    was: State::Queued,
                };
                self.finish_if_down();
            }
            Phase::Stopping { then, cancelling, .. } => {
                *cancelling = true;
                if matches!(then, After::Retry { .. } | After::Preempted { .. }) {
                    *then = After::Cancel;
                }
                self.log_rule("L18", None, "Cancel requested.");
            }
            _ => {
                self.log_rule("L18", None, "Cancel requested.");
                self.end_attempt(After::Cancel);
            }
        }
    }

    /// TY1, SPOT preemption: shut the attempt down, then wait for capacity.
    fn preempt(&mut self, reason: String) {
        if !self.job.policy.spot || !matches!(self.job.phase, Phase::Pending { .. } | Phase::Running { .. }) {
            return;
        }
        self.log_rule("TY1", None, format!("SPOT job preempted: {reason}."));
        self.notice = Some(format!("SPOT preemption: {reason}"));
        self.end_attempt(After::Preempted { reason, requeue: false });
    }

    /// TY2 (a job of a higher priority class) and TY3 (a cohort's lender takes its quota
    /// back, `requeue`): a preemption of any job the scheduler chose: shut the attempt down, then wait for capacity; counted only as a
    /// preemption, never as a worker restart (L11) or a job retry (L12).
    fn preempt_for_priority(&mut self, reason: String, requeue: bool) {
        if !matches!(self.job.phase, Phase::Pending { .. } | Phase::Running { .. }) {
            return;
        }
        self.job.retries.preemptions += 1;
        let n = self.job.retries.preemptions;
        if requeue {
            self.log_rule(
                "TY3",
                None,
                format!("Job preempted ({n} so far): {reason}; it gives its quota back and goes back to the queue (not counted by L11 or L12)."),
            );
        } else {
            self.log_rule("TY2", None, format!("Job preempted ({n} so far): {reason}; it goes back to the queue (not counted by L11 or L12)."));
        }
        self.notice = Some(if requeue { format!("reclaim: {reason}") } else { format!("preemption: {reason}") });
        self.end_attempt(After::Preempted { reason, requeue });
    }

    /// TY6: `timeout_warning` before the time limit (L19), every live replica gets the
    /// warning signal, once, so that it can write a last checkpoint.
    fn timeout_warning(&mut self) {
        let Some(due) = self.job.timeout_warning_due() else { return };
        if self.now < due {
            return;
        }
        self.job.timeout_warned = true;
        let name = self.settings.timeout_warning_signal.clone();
        let signal = crate::job::warning_signal(&name).unwrap_or(10);
        let left = (self.job.policy.timeout_warning / crate::job::SECOND).max(0);
        let runs: Vec<RunId> = (0..self.job.replicas.len())
            .filter(|&i| matches!(self.job.replicas[i].state, ReplicaState::Launching | ReplicaState::Running { .. }))
            .map(|i| self.run_id(i))
            .collect();
        self.log_rule("TY6", None, format!("The job's time limit is {left}s away: {name} sent to every replica, to write a last checkpoint."));
        for run in runs {
            self.effects.push(Effect::Signal { run, signal });
        }
    }

    /// L9: node maintenance (graceful) or node loss (at once).
    fn node_event(&mut self, replica: &str, replacement: Option<String>, graceful: bool) {
        let Some(idx) = self.job.replicas.iter().position(|r| r.name == replica) else { return };
        if matches!(self.job.phase, Phase::Stopping { .. })
            || !matches!(self.job.replicas[idx].state, ReplicaState::Launching | ReplicaState::Running { .. })
        {
            return;
        }
        let what = if graceful { "its node went into maintenance" } else { "its node was lost" };
        if self.leaves(idx, what, graceful) {
            return;
        }
        if self.job.policy.restarts_become_retries() {
            // L12a: the restart becomes a job retry.
            let reason = format!("replica {replica}: {what} and scheduling.restartJobOnWorkerRestart is set");
            let error = JobError { code: code::INTERNAL, message: INTERNAL_MESSAGE.into() };
            self.retry_or_fail(RetryKind::WorkerRestarts, reason, error);
            return;
        }
        let Some(node) = replacement else {
            // L15: nowhere to restart it.
            self.stockout(format!("replica {replica}: {what} and no other node can take it"));
            return;
        };
        if graceful {
            self.notice = Some(format!("drain: {what}"));
            let how = self.stop_words(idx);
            self.log_rule("L9", Some(replica), format!("Replica {replica}: {what}; {how}, then restart on node {node}."));
            self.stop(idx, AfterReplicaStop::Move { node });
        } else {
            // The old run is stopped for good measure (L20); its late report is stale.
            let run = self.run_id(idx);
            self.effects.push(Effect::Stop { run, grace: 0 });
            let r = &mut self.job.replicas[idx];
            r.node = Some(node.clone());
            r.restart += 1;
            self.log_rule("L9", Some(replica), format!("Replica {replica}: {what}; restarting it on node {node}."));
            self.launch(idx);
        }
    }

    /// TY10: an elastic replica above its pool's minimum that loses its place (`cause`)
    /// leaves the job instead of restarting: SIGTERM and the grace period (`graceful`), or
    /// at once. No L11 or L12 budget is spent; the others go on (torch's re-rendezvous).
    /// False when the replica is not elastic or its pool is at its minimum (then the
    /// usual rules apply).
    fn leaves(&mut self, idx: usize, cause: &str, graceful: bool) -> bool {
        let pool = self.job.replicas[idx].pool;
        let Some(min) = self.job.policy.elastic_min(pool).filter(|_| self.job.is_elastic(idx)) else { return false };
        if self.job.present(pool) <= min as usize {
            return false;
        }
        let name = self.job.replicas[idx].name.clone();
        if graceful {
            self.notice = Some(cause.to_string());
            let how = self.stop_words(idx);
            self.log_rule("TY10", Some(&name), format!("Replica {name}: {cause}; {how}, then it leaves the elastic job (not counted as a restart)."));
            self.stop(idx, AfterReplicaStop::Leave { cause: cause.to_string() });
        } else {
            let run = self.run_id(idx);
            self.effects.push(Effect::Stop { run, grace: 0 });
            self.go_away(idx, cause.to_string());
        }
        true
    }

    /// TY10: the replica is away from the job from now; the job is told how many remain.
    fn go_away(&mut self, idx: usize, cause: String) {
        let pool = self.job.replicas[idx].pool;
        let r = &mut self.job.replicas[idx];
        r.state = ReplicaState::Away { since: self.now, cause: cause.clone(), ran: true };
        r.node = None;
        r.hung_since = None;
        r.straggler = false;
        let name = r.name.clone();
        let (now, max) = (self.job.present(pool), self.job.pool_size(pool));
        self.log_rule(
            "TY10",
            Some(&name),
            format!("Replica {name} left the job ({cause}); workerpool{pool} goes on with {now} of {max} replicas, and it joins again when capacity frees."),
        );
        self.maybe_running();
    }

    /// TY10: an away replica joins the running (or starting) job on `node`.
    fn grow(&mut self, replica: &str, node: String) {
        if !self.job.wants_growth() || node.is_empty() {
            return;
        }
        let Some(idx) = self.job.replicas.iter().position(|r| r.name == replica) else { return };
        let ReplicaState::Away { ran, .. } = self.job.replicas[idx].state else { return };
        let pool = self.job.replicas[idx].pool;
        let r = &mut self.job.replicas[idx];
        r.node = Some(node.clone());
        if ran {
            r.restart += 1;
        }
        self.launch(idx);
        let (now, max) = (self.job.present(pool), self.job.pool_size(pool));
        self.log_rule("TY10", Some(replica), format!("Replica {replica} joins the elastic job on node {node}: workerpool{pool} has {now} of {max} replicas."));
    }

    fn tick(&mut self) {
        let now = self.now;
        self.notices_due();
        // L19: timeout since admission.
        if let Some(admitted) = self.job.admitted_at() {
            if !matches!(self.job.phase, Phase::Stopping { .. }) && now >= admitted.saturating_add(self.job.policy.timeout)
            {
                let secs = self.job.policy.timeout / crate::job::SECOND;
                self.log_rule("L19", None, format!("Job reached its timeout of {secs}s (scheduling.timeout)."));
                let message = format!("The job has run longer than its timeout of {secs}s (scheduling.timeout).");
                self.notice = Some(format!("timeout: the job reached its timeout of {secs}s (scheduling.timeout)"));
                self.end_attempt(After::Fail(JobError { code: code::DEADLINE_EXCEEDED, message }));
                return;
            }
        }
        match self.job.phase {
            Phase::Pending { wait: Wait::Capacity { since }, .. }
                if self.job.policy.max_wait > 0 && now >= since.saturating_add(self.job.policy.max_wait) =>
            {
                // L15 FLEX_START: the wait ran out.
                let message = stockout_message(&self.job.region);
                self.log_rule("L15", None, "FLEX_START: maxWaitDuration ran out.");
                self.end_attempt(After::Fail(JobError { code: code::RESOURCE_EXHAUSTED, message }));
            }
            Phase::Running { .. } => {
                self.timeout_warning();
                self.hangs();
                // L21: warn when no checkpoint has been written for a while.
                if self.job.checkpoint_due(self.settings).is_some_and(|due| now >= due) {
                    self.job.checkpoint.warned_at = Some(now);
                    let hours = self.settings.checkpoint_warning_secs as f64 / 3600.0;
                    self.log_rule("L21", None, format!("Warning: no checkpoint written to AIP_CHECKPOINT_DIR for {hours} hours."));
                }
            }
            _ => {}
        }
    }
}

impl Cx<'_> {
    /// Hangs (TY4) and stragglers (TY5). A replica that shows no progress (output to its log, its
    /// checkpoint directory or its metric file, CPU time) for `hang_after` is silent: a
    /// straggler when another replica of the job went on within that time, else hung.
    /// Reported once per run (a stack dump of it goes to the log with the report), and
    /// with `hang_restart` restarted as a signal death is (L10, L11).
    fn hangs(&mut self) {
        let now = self.now;
        let hang_after = self.job.policy.hang_after;
        let due: Vec<usize> = (0..self.job.replicas.len()).filter(|&i| self.job.hang_due(i).is_some_and(|d| now >= d)).collect();
        for idx in due {
            let secs = hang_after / crate::job::SECOND;
            let name = self.job.replicas[idx].name.clone();
            let suspended = self.job.replicas[idx].suspended;
            // A live replica waiting for a stopped one, or for one being restarted (in a
            // collective), is not the fault.
            let waits_for_another = self.job.replicas.iter().enumerate().any(|(i, r)| {
                i != idx
                    && ((r.suspended && r.state.is_live())
                        || (r.straggler && r.hung_since.is_some())
                        || matches!(r.state, ReplicaState::Launching | ReplicaState::Stopping { .. }))
            });
            if !suspended && waits_for_another {
                continue;
            }
            // Another running replica that went on within the allowed silence, or (this one
            // stopped) one that is not stopped.
            let others_go_on = self.job.replicas.iter().enumerate().any(|(i, r)| {
                let ReplicaState::Running { since } = r.state else { return false };
                i != idx && r.hung_since.is_none() && (r.activity.unwrap_or(since).max(since) > now - hang_after || (suspended && !r.suspended))
            });
            let quiet = (now - self.job.last_progress(idx).unwrap_or(now)) / crate::job::SECOND;
            let r = &mut self.job.replicas[idx];
            r.hung_since = Some(now);
            r.straggler = others_go_on;
            let restart = self.job.policy.hang_restart;
            let then = if restart { "; stopping it to restart it" } else { "" };
            let stopped = if suspended { " (its processes are stopped)" } else { "" };
            let text = if others_go_on {
                format!(
                    "Replica {name} is a straggler{stopped}: no output to its log, its checkpoint directory or its metric file and no CPU time \
                     for {quiet}s (allowed: {secs}s) while other replicas go on or wait for it{then}."
                )
            } else {
                format!(
                    "Replica {name} may be hung: no output to its log, its checkpoint directory or its metric file and no CPU time \
                     for {quiet}s (allowed: {secs}s), and no other replica goes on{then}."
                )
            };
            self.log_rule(if others_go_on { "TY5" } else { "TY4" }, Some(&name), text);
            if restart {
                let run = self.run_id(idx);
                self.effects.push(Effect::Stop { run, grace: self.settings.grace_period_secs as Micros * crate::job::SECOND });
            }
        }
    }
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Exited { code } => format!("exited with status {code}"),
        Outcome::Signaled { signal } => format!("was killed by signal {signal}"),
        Outcome::OomKilled { status } => format!("ran out of memory (status {status})"),
        Outcome::StartError { message } => format!("could not start: {message}"),
        Outcome::Lost { message } => format!("was lost by its supervisor: {message}"),
        Outcome::LaunchFailed { message } => format!("could not be launched: {message}"),
    }
}
