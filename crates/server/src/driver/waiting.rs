//! Why a job waits: the reasons of the latest scheduling round and of the engine, shown
//! to readers with their moving numbers, and written when their kind changes.

use super::*;

impl Driver {
    /// Store and log the new waiting reasons of a round in one transaction, and show
    /// every reason of the round (with the engine's) to readers.
    pub(super) fn publish_waiting(&mut self, changed: &[u64], mut reasons: HashMap<u64, Waiting>, now: Micros) -> Result<(), StoreError> {
        let lines: Vec<(u64, [Effect; 1])> = changed
            .iter()
            .filter_map(|id| {
                let job = &self.jobs.get(id)?.job;
                let text = cite_wait(job.waiting_reason.as_deref()?);
                Some((*id, [Effect::Log(trainyard_core::step::LogLine { attempt: job.attempt, replica: None, text })]))
            })
            .collect();
        let batch: Vec<(&Job, &[Effect])> =
            lines.iter().filter_map(|(id, l)| Some((&self.jobs.get(id)?.job, l.as_slice()))).collect();
        if !batch.is_empty() {
            Driver::timed(&self.metrics, "commit_many", || self.store.commit_many(&batch, now))?;
        }
        for (id, r) in &self.engine_reasons {
            reasons.entry(*id).or_insert_with(|| Waiting { reason: Arc::clone(r), position: None });
        }
        self.waiting_view.publish(reasons);
        Ok(())
    }

    /// The engine holds a launch up (e.g. its controller is unreachable): shown as the
    /// job's waiting reason, and written to its log when it first says so.
    pub(super) fn note_engine_waiting(&mut self, id: u64, reason: String, now: Micros) -> Result<(), StoreError> {
        let Some(live) = self.jobs.get_mut(&id) else { return Ok(()) };
        self.engine_reasons.insert(id, reason.trim_end_matches('.').into());
        if live.waiting == Some(ENGINE_WAIT) {
            live.job.waiting_reason = Some(reason);
            return Ok(());
        }
        live.waiting = Some(ENGINE_WAIT);
        live.job.waiting_reason = Some(reason.clone());
        let line = Effect::Log(trainyard_core::step::LogLine { attempt: live.job.attempt, replica: None, text: cite_wait(&reason) });
        Driver::timed(&self.metrics, "commit", || self.store.commit(&live.job, &[line], now))?;
        let reasons = self.waiting_view.snapshot();
        self.publish_waiting(&[], reasons, now)
    }

    /// Why launched replicas have not started yet, as the engine says (e.g. its controller
    /// is unreachable): asked about once a second on the observing thread (an engine that
    /// blocks never stalls this one), and shown as the job's waiting reason and written
    /// to its log when the answer comes ([`Self::engine_reasons_heard`]).
    pub(super) fn poll_backend_reasons(&mut self, now: Micros) -> Result<(), StoreError> {
        if self.engine_reasons_in_flight || now - self.last_backend_poll < 1_000_000 {
            return Ok(());
        }
        self.last_backend_poll = now;
        let runs: Vec<RunId> = self.jobs.values().filter(|live| is_starting(&live.job)).flat_map(|live| launching(&live.job)).collect();
        if !runs.is_empty() {
            self.engine_reasons_in_flight = true;
            self.exec.submit(crate::executor::Work::EngineReasons(runs));
        }
        Ok(())
    }

    /// The engine's reasons for runs still launching: the first of each job still
    /// starting that attempt becomes its waiting reason.
    pub(super) fn engine_reasons_heard(&mut self, heard: Vec<crate::executor::EngineWait>, now: Micros) -> Result<(), StoreError> {
        self.engine_reasons_in_flight = false;
        let mut noted = std::collections::HashSet::new();
        let mut held = Vec::new();
        for w in heard {
            let run = w.run;
            let still = self.jobs.get(&run.job).is_some_and(|live| is_starting(&live.job) && launching(&live.job).any(|r| r == run));
            if still && noted.insert(run.job) {
                self.note_engine_waiting(run.job, format!("Waiting for the execution engine: {}", w.why), now)?;
                if w.held {
                    held.push(run.job);
                }
            }
        }
        self.preempt_for_held(held, now)
    }

    /// Preemption by priority where the engine places work itself (Slurm, on a fleet
    /// that overcommits here): for a job the engine holds for resources, the cheapest
    /// running jobs of lower classes whose resources cover its request
    /// (`core::preempt::engine_victims`), the highest class first, one preemption at a time
    /// (none while a preempted job is still stopping).
    fn preempt_for_held(&mut self, mut held: Vec<u64>, now: Micros) -> Result<(), StoreError> {
        let cfg = &self.svc.cfg.scheduler;
        if held.is_empty() || !cfg.priority_preemption || !self.fleet.overcommit {
            return Ok(());
        }
        let stopping = self.jobs.values().any(|l| {
            matches!(l.job.phase, Phase::Stopping { then: trainyard_core::job::After::Preempted { .. }, .. })
        });
        if stopping {
            return Ok(());
        }
        held.sort_by_key(|id| self.jobs.get(id).map(|l| (std::cmp::Reverse(l.job.policy.priority), l.job.create_time)));
        let Some(want) = held.first().and_then(|id| self.jobs.get(id)).map(|l| l.job.clone()) else { return Ok(()) };
        let running: Vec<&trainyard_core::Job> = self.jobs.values().map(|l| &l.job).collect();
        let Some(victims) = trainyard_core::preempt::engine_victims(&want, &running, cfg, now) else { return Ok(()) };
        let class = self.priorities.classes.iter().find(|(_, v)| *v == want.policy.priority).map_or("?", |(n, _)| n.as_str()).to_string();
        for v in victims {
            let reason = format!(
                "its resources are needed by a job of priority {} that the execution engine holds for them (priority class {class})",
                want.policy.priority
            );
            self.apply(v, Event::PreemptForPriority { reason, requeue: false }, now)?.ok();
        }
        Ok(())
    }
}

fn is_starting(job: &trainyard_core::Job) -> bool {
    matches!(job.phase, Phase::Pending { wait: trainyard_core::job::Wait::Starting, .. })
}

/// The runs of a job's replicas that are launching.
fn launching(job: &trainyard_core::Job) -> impl Iterator<Item = RunId> + '_ {
    job.replicas
        .iter()
        .filter(|r| r.state == trainyard_core::job::ReplicaState::Launching)
        .map(|r| RunId { job: job.id, attempt: job.attempt, replica: r.name.clone(), restart: r.restart })
}

/// A waiting reason as a log line citing its rule: quota L3, the engine L16, capacity L15.
fn cite_wait(reason: &str) -> String {
    let rule = if reason.starts_with("Waiting for quota") {
        "L3"
    } else if reason.starts_with("Waiting for the execution engine") {
        "L16"
    } else {
        "L15"
    };
    format!("{rule}: {reason}")
}
