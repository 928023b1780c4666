//! CustomJobs in the driver: create (group commit), cancel, one step of the lifecycle
//! (`step`, commit, execute: L23), timers, and the scheduling round.

use super::*;

/// The cost of a scheduling round (µs) that creates still wait for before they are
/// answered, so that on a short queue the answer shows the job admitted.
const CHEAP_ROUND: Micros = 5_000;

impl Driver {
    /// Creates that arrived together: checked one by one, then stored in one transaction
    /// (group commit: one fsync for all), then one scheduling round for all of them, then
    /// answered. A round that costs more than `CHEAP_ROUND` (a long queue) runs after the
    /// answers instead: creates never wait for it (the jobs are stored and QUEUED; the
    /// round admits them a moment later).
    pub(super) fn create_batch(&mut self, batch: Vec<(NewCustomJob, Reply<CustomJob>)>, now: Micros) -> Result<(), StoreError> {
        let (items, replies): (Vec<NewCustomJob>, Vec<Reply<CustomJob>>) = batch.into_iter().unzip();
        let results = self.create_many(items, now);
        let cheap = self.last_round_cost <= CHEAP_ROUND;
        if cheap {
            self.maybe_schedule(now)?;
        }
        for (result, reply) in results.into_iter().zip(replies) {
            let _ = reply.send(result.and_then(|id| self.render_current(id)));
        }
        if !cheap {
            self.maybe_schedule(now)?;
        }
        Ok(())
    }

    /// Check and store new CustomJobs; returns each one's id or why it was refused. The
    /// accepted ones are stored together (all or none) and wait for the next round.
    pub(super) fn create_many(&mut self, items: Vec<NewCustomJob>, now: Micros) -> Vec<Result<u64, ApiError>> {
        let mut results: Vec<Result<u64, ApiError>> = Vec::with_capacity(items.len());
        let mut accepted = Vec::new();
        let mut pending: HashMap<String, usize> = HashMap::new();
        for item in items {
            let same = pending.get(&item.project).copied().unwrap_or(0);
            match self.check_new(&item, same) {
                Ok((prepared, text)) => {
                    *pending.entry(item.project.clone()).or_insert(0) += 1;
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
        let metrics = Arc::clone(&self.metrics);
        let stored = Driver::timed(&metrics, "insert_jobs", || self.store.insert_jobs(&news, |i, id| {
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
            job.pipeline = it.pipeline;
            job
        }));
        drop(news);
        let jobs = match stored {
            Ok(jobs) => jobs,
            Err(e) => {
                let e = self.store_err(e);
                for (i, _, _, _) in &accepted {
                    results[*i] = Err(e.clone());
                }
                return results;
            }
        };
        for ((i, item, _, _), job) in accepted.into_iter().zip(jobs) {
            let id = job.id;
            tracing::info!("job {id} created: {:?}", item.resource.display_name);
            results[i] = Ok(id);
            self.insert_live(id, Live { job, resource: item.resource, waiting: None });
            self.index_deadline(id);
        }
        self.reschedule = true;
        results
    }

    /// A live job, counted for its project's limit; its credential is accepted from now on.
    pub(super) fn insert_live(&mut self, id: u64, live: Live) {
        *self.live_per_project.entry(live.job.project.clone()).or_insert(0) += 1;
        if let Some(c) = &self.svc.job_credentials {
            c.live(id, &live.job.project);
        }
        self.metrics.job_changed(None, &live.job);
        self.account(None, &live.job);
        self.newest_job = self.newest_job.max(id);
        self.jobs.insert(id, live);
    }

    /// The job has ended: no longer counted, its credential refused.
    pub(super) fn remove_live(&mut self, id: u64) {
        if let Some(c) = &self.svc.job_credentials {
            c.ended(id);
        }
        if let Some(l) = self.jobs.remove(&id) {
            if let Some(n) = self.live_per_project.get_mut(&l.job.project) {
                *n = n.saturating_sub(1);
            }
        }
        self.cpu_seen.remove(&id);
        self.progress.remove(&id);
    }

    /// What a create is checked against besides the wire rules: the project's limit of
    /// live jobs, the region, the catalog, the fleet and quotas (L4), and the output
    /// directory. `pending` creates of the same batch are counted too.
    pub(super) fn check_new(&self, item: &NewCustomJob, pending: usize) -> Result<(crate::jobspec::Prepared, String), ApiError> {
        let svc = &self.svc;
        let limit = svc.cfg.limits.max_live_jobs_per_project;
        let live = self.live_per_project.get(&item.project).copied().unwrap_or(0) + pending;
        if live >= limit {
            return Err(ApiError::resource_exhausted(format!(
                "Project \"{}\" has {live} jobs that have not ended, the limit of live jobs per project (limits.max_live_jobs_per_project = {limit}); wait for some to end or cancel some.",
                item.project
            )));
        }
        served_region(&item.region, &svc.cfg.region)?;
        let prepared = prepare(&item.resource, &svc.catalog, &svc.cfg.settings, &self.fleet, &self.quotas, &self.priorities, &item.project)?;
        check_paths(&item.resource.job_spec, "jobSpec", &item.project, &svc.cfg.storage_root, &svc.output_roots)?;
        let text = serde_json::to_string(&item.resource).map_err(|e| ApiError::internal(format!("encoding the job: {e}")))?;
        Ok((prepared, text))
    }

    /// A job as it is now (admitted already when a round placed it).
    pub(super) fn render_current(&self, id: u64) -> Result<CustomJob, ApiError> {
        match self.jobs.get(&id) {
            Some(l) => {
                let mut r = render(&l.resource, &l.job);
                if let Some(reason) = self.waiting_view.get(id, &l.job.project).filter(|_| !r.trainyard_waiting_reason.is_empty()) {
                    r.trainyard_waiting_reason = reason;
                }
                Ok(r)
            }
            None => self.store.get_job_by_id(id).map_err(|e| self.store_err(e))?.map_or_else(
                || Err(ApiError::internal("job vanished")),
                |s| {
                    let r: CustomJob = serde_json::from_str(&s.resource).map_err(|e| ApiError::internal(e.to_string()))?;
                    Ok(render(&r, &s.job))
                },
            ),
        }
    }

    pub(super) fn cancel(&mut self, project: &str, region: &str, id: u64, now: Micros) -> Result<(), ApiError> {
        let name = job_name(project, region, id);
        let owned = self.jobs.get(&id).is_some_and(|l| l.job.project == project && l.job.region == region);
        if !owned {
            // Not live here: either terminal (refused, L18) or not found (another project's
            // job is not found either).
            return match self.store.get_job(KIND_CUSTOM, project, region, id).map_err(|e| self.store_err(e))? {
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
            Err(e) => Err(self.store_err(e)),
        }
    }

    /// Delete an ended resource: the row, its labels and log lines go, a done Operation
    /// answers, and its files are purged through the outbox (commit, then execute: L23).
    pub(super) fn delete(&mut self, kind: Kind, project: &str, region: &str, id: u64, now: Micros) -> Result<serde_json::Value, ApiError> {
        let what = kind.api_name();
        let live = match kind {
            Kind::TuningJob => self.studies.get(&id).is_some_and(|l| l.study.project == project && l.study.region == region),
            Kind::Pipeline => self.pipelines.get(&id).is_some_and(|l| l.pipeline.project == project && l.pipeline.region == region),
            Kind::CustomJob => self.jobs.get(&id).is_some_and(|l| l.job.project == project && l.job.region == region),
        };
        if live {
            return Err(ApiError::failed_precondition(format!(
                "The {what} {id} in projects/{project}/locations/{region} has not ended and cannot be deleted; cancel it first."
            )));
        }
        // A pipeline's CustomJob, and a tuning job's trials' CustomJobs, go with it.
        let store_key = kind.store_key();
        let backing: Vec<u64> = match kind {
            Kind::Pipeline => self
                .store
                .get_other(store_key, project, region, id)
                .map_err(|e| self.store_err(e))?
                .and_then(|(_, _, core)| serde_json::from_str::<crate::kinds::pipelines::Pipeline>(&core).ok())
                .and_then(|p| p.custom_job)
                .into_iter()
                .collect(),
            Kind::TuningJob => self
                .store
                .get_other(store_key, project, region, id)
                .map_err(|e| self.store_err(e))?
                .and_then(|(_, _, core)| serde_json::from_str::<crate::kinds::tuning_jobs::Study>(&core).ok())
                .map(|s| s.trials.iter().filter_map(|t| t.custom_job).collect())
                .unwrap_or_default(),
            Kind::CustomJob => Vec::new(),
        };
        // The ended job's state, for `/metrics`.
        let ended = match kind {
            Kind::CustomJob => self.store.get_job(store_key, project, region, id).map_err(|e| self.store_err(e))?.map(|s| s.job.state()),
            _ => None,
        };
        let at = Timestamp::from_micros(now);
        let (p, r) = (project.to_string(), region.to_string());
        let deleted = self
            .store
            .delete_terminal(store_key, project, region, id, |opid| {
                let op = trainyard_api::Operation::done_delete(format!("projects/{p}/locations/{r}/operations/{opid}"), at, at);
                serde_json::to_string(&op).unwrap_or_default()
            })
            .map_err(|e| self.store_err(e))?;
        let Some((body, purge)) = deleted else {
            return Err(ApiError::not_found(format!("The {what} {id} in projects/{project}/locations/{region} does not exist.")));
        };
        tracing::info!("{what} {id} deleted");
        if kind == Kind::CustomJob {
            // Where the reading of its TensorBoard event files stood (its time series stay:
            // they are the TensorBoard's, as on the managed service).
            let job = format!("projects/{project}/locations/{region}/customJobs/{id}");
            if let Err(e) = self.store.change_records(&[trainyard_store::records::Change::Delete(&job)], now) {
                tracing::warn!("CustomJob {id}: its event files' offsets are kept: {e}");
            }
        }
        if let Some(state) = ended {
            self.metrics.deleted(project, state);
        }
        self.execute(id, vec![purge]);
        for job in backing {
            match self.delete(Kind::CustomJob, project, region, job, now) {
                Ok(_) => {}
                Err(e) if e.code == trainyard_api::Code::NotFound => {}
                Err(e) => tracing::warn!("deleting {what} {id}'s CustomJob {job}: {}", e.message),
            }
        }
        serde_json::from_str(&body).map_err(|e| ApiError::internal(format!("the delete operation: {e}")))
    }

    /// Step one job, commit, execute. The outer Result is a store failure (fatal), the
    /// inner one a refused command.
    pub(super) fn apply(&mut self, id: u64, event: Event, now: Micros) -> Result<Result<(), Rejected>, StoreError> {
        let Some(live) = self.jobs.get(&id) else { return Ok(Ok(())) };
        let mut t = match step(&live.job, event, now, &self.svc.cfg.settings) {
            Ok(t) => t,
            Err(r) => return Ok(Err(r)),
        };
        if !t.changed {
            return Ok(Ok(()));
        }
        self.assign_gpus(&mut t.job, &mut t.effects, &Staged::new());
        // L23: durable before anything is reported or done.
        let outbox = Driver::timed(&self.metrics, "commit", || self.store.commit(&t.job, &t.effects, now))?;
        self.install(id, t.job);
        self.execute(id, outbox);
        Ok(Ok(()))
    }

    /// Events of several jobs at once (a round's decisions, the replicas that started or
    /// ended together): each job stepped through its events in order, every transition
    /// committed in one transaction (one fsync instead of one per event; L23 as for one:
    /// nothing is installed, reported or done before it), then installed and executed
    /// job by job in the order the jobs came. Events a job refuses or that change nothing
    /// are dropped, as `apply` drops them for their callers that ignore refusals.
    pub(super) fn apply_many(&mut self, events: Vec<(u64, Event)>, now: Micros) -> Result<(), StoreError> {
        let mut staged = Staged::new();
        let mut order: Vec<u64> = Vec::new();
        for (id, event) in events {
            let Some(current) = staged.get(&id).map(|(j, _)| j).or_else(|| self.jobs.get(&id).map(|l| &l.job)) else {
                continue;
            };
            let Ok(mut t) = step(current, event, now, &self.svc.cfg.settings) else { continue };
            if !t.changed {
                continue;
            }
            // Devices are given seeing what the jobs staged before hold.
            self.assign_gpus(&mut t.job, &mut t.effects, &staged);
            match staged.get_mut(&id) {
                Some((job, effects)) => {
                    *job = t.job;
                    effects.extend(t.effects);
                }
                None => {
                    order.push(id);
                    staged.insert(id, (t.job, t.effects));
                }
            }
        }
        if order.is_empty() {
            return Ok(());
        }
        let batch: Vec<(&Job, &[Effect])> = order.iter().filter_map(|id| staged.get(id)).map(|(j, e)| (j, e.as_slice())).collect();
        let outboxes = Driver::timed(&self.metrics, "commit_many", || self.store.commit_many(&batch, now))?;
        for (id, outbox) in order.into_iter().zip(outboxes) {
            let Some((job, _)) = staged.remove(&id) else { continue };
            self.install(id, job);
            self.execute(id, outbox);
        }
        Ok(())
    }

    pub(super) fn install(&mut self, id: u64, job: Job) {
        let was_placed = self.jobs.get(&id).is_some_and(|l| l.job.holds_capacity() || l.job.holds_quota());
        let terminal = job.is_terminal();
        // TY10: a replica that left frees its room (and its job wants it back).
        let live_before = self.jobs.get(&id).map_or(0, |l| l.job.live_replicas().count());
        let shrank = job.live_replicas().count() < live_before || (job.wants_growth() && !self.jobs.get(&id).is_some_and(|l| l.job.wants_growth()));
        if terminal || shrank || (was_placed && !job.holds_capacity()) || job.wants_placement(self.now()) {
            self.reschedule = true;
        }
        if let Some(p) = job.pipeline {
            let before = self.jobs.get(&id).map(|l| l.job.state());
            let after = job.state();
            if before != Some(after) {
                let error = job.error().map(|e| (e.code, e.message.clone()));
                self.pipeline_events.push((p, crate::kinds::pipelines::Event::Job { state: after, error }));
            }
        }
        if let Some(link) = job.trial.clone() {
            let before = self.jobs.get(&id).map(|l| l.job.state());
            let after = job.state();
            if after == trainyard_core::State::Running && before != Some(after) {
                self.study_events.push((link.study, study::Event::TrialRunning { trial: link.trial.clone() }));
            }
            if after.is_terminal() {
                self.trial_ended(link.study, link.trial, &job);
            }
        }
        let now = self.now();
        if let Some(live) = self.jobs.get_mut(&id) {
            self.ledger.job_changed(Some(&live.job), &job, now, None);
            self.metrics.job_changed(Some(&live.job), &job);
            if live.job.state() != job.state() {
                // A new wait (e.g. after a preemption) is logged afresh.
                live.waiting = None;
            }
            live.job = job;
        }
        if terminal {
            tracing::info!("job {id} ended {}", self.jobs.get(&id).map_or("", |l| l.job.state().wire_name()));
            self.remove_live(id);
        }
        self.index_deadline(id);
    }

    pub(super) fn index_deadline(&mut self, id: u64) {
        if let Some(old) = self.deadline_of.remove(&id) {
            self.deadlines.remove(&(old, id));
        }
        if let Some(t) = self.jobs.get(&id).and_then(|l| l.job.next_deadline(&self.svc.cfg.settings, self.now())) {
            self.deadlines.insert((t, id));
            self.deadline_of.insert(id, t);
        }
    }

    /// Timers that are due: L19, L15, L21, and backoffs that end (then schedule).
    pub(super) fn on_time(&mut self, now: Micros) -> Result<(), StoreError> {
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.remove(&(t, id));
            self.deadline_of.remove(&id);
            // What the tick decides on is read off this thread: L21, the checkpoint scan
            // (the warning waits for it); hang detection, the replicas' latest writes. The
            // tick waits at most SCAN_HOLD for it, then goes on: a replica whose writes
            // could not be seen in time counts as active (no hang is declared on missing
            // evidence).
            let checkpoints = self.checkpoint_scan_due(id, now);
            let activity = self.activity_files(id);
            // L19: a timeout (or its warning) that is due fires now, on its own, never
            // after a scan of the job's files (one that hangs would hold it SCAN_HOLD).
            let l19_due = self.jobs.get(&id).and_then(|l| l.job.timeout_due()).is_some_and(|t| t <= now);
            if !l19_due && (checkpoints.is_some() || !activity.is_empty()) {
                match self.scans.get(&id).copied() {
                    None => {
                        self.scans.insert(id, now);
                        let project = self.jobs.get(&id).map(|l| l.job.project.clone()).unwrap_or_default();
                        self.exec.submit(crate::executor::Work::Observe { job: id, project, checkpoints, activity });
                        self.hold_deadline(id, now + SCAN_HOLD);
                        continue;
                    }
                    Some(since) if now < since + SCAN_HOLD => {
                        self.hold_deadline(id, since + SCAN_HOLD);
                        continue;
                    }
                    Some(_) => {
                        self.scans.remove(&id);
                        for w in activity {
                            self.apply(id, Event::Activity { replica: w.replica, at: now }, now)?.ok();
                        }
                    }
                }
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

    /// Hang detection: the files whose writes show that each running replica of a job that
    /// watches for hangs is alive (its log file and its metric file), to be looked at
    /// before a tick decides. Empty for other jobs.
    pub(super) fn activity_files(&self, id: u64) -> Vec<crate::executor::ReplicaWatch> {
        let Some(live) = self.jobs.get(&id) else { return Vec::new() };
        if live.job.policy.hang_after <= 0 {
            return Vec::new();
        }
        let data = &self.svc.cfg.data_dir;
        let now = self.now();
        live.job
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r.state, trainyard_core::job::ReplicaState::Running { .. }))
            .map(|(i, r)| {
                let run = RunId { job: id, attempt: live.job.attempt, replica: r.name.clone(), restart: r.restart };
                let dir = run_dir(data, &run);
                crate::executor::ReplicaWatch {
                    replica: r.name.clone(),
                    files: vec![dir.join(trainyard_backend::log::LOG_FILE), self.metric_file_of(id, &r.name)],
                    run_dir: dir,
                    // Its silence is due to be reported: its stack goes to the log with it.
                    dump: live.job.hang_due(i).is_some_and(|d| d <= now),
                }
            })
            .collect()
    }

    /// L21: the checkpoint directory of a RUNNING job whose "no checkpoint" warning is
    /// due, to be scanned before the warning is decided (and, for goodput, a running
    /// elastic job's).
    pub(super) fn checkpoint_scan_due(&self, id: u64, now: Micros) -> Option<Confined> {
        let live = self.jobs.get(&id)?;
        if !matches!(live.job.phase, Phase::Running { .. }) {
            return None;
        }
        // TY10 goodput: an elastic job's at each of its ticks (its looks are on a grid,
        // `checkpoint_look_due`).
        let look = live.job.checkpoint_look_due(now).is_some();
        if !look {
            live.job.checkpoint_due(&self.svc.cfg.settings).filter(|due| *due <= now)?;
        }
        Some(self.output_base(live)?.join("checkpoints"))
    }

    /// What an observation of a job's files saw (see `on_time`): the replicas' latest
    /// writes and the newest checkpoint (a write in the future counts as now), then the
    /// tick that waited for them.
    pub(super) fn observed(&mut self, id: u64, newest: Option<Micros>, activity: Vec<crate::executor::ReplicaSeen>, now: Micros) -> Result<(), StoreError> {
        self.scans.remove(&id);
        let Some(live) = self.jobs.get(&id) else { return Ok(()) };
        let attempt = live.job.attempt;
        let known: Vec<(String, Option<Micros>, u32, bool)> =
            live.job.replicas.iter().map(|r| (r.name.clone(), r.activity, r.restart, r.suspended)).collect();
        let mut dumps = Vec::new();
        for seen in activity {
            let Some((_, last, restart, suspended)) = known.iter().find(|(n, _, _, _)| *n == seen.replica) else { continue };
            if seen.stopped != *suspended {
                self.apply(id, Event::Suspended { replica: seen.replica.clone(), stopped: seen.stopped }, now)?.ok();
            }
            // CPU time used since the last look is progress too (a replica spinning in a
            // collective is not counted hung; a stopped one is).
            let seen_before = self.cpu_seen.entry(id).or_default();
            let ran = match (seen.cpu, seen_before.get(&seen.replica)) {
                (Some(c), Some(&(a, r, before))) if a == attempt && r == *restart => c > before + CPU_EPSILON,
                // The first look: what it used since its start.
                (Some(c), _) => c > CPU_EPSILON,
                _ => false,
            };
            if let Some(c) = seen.cpu {
                seen_before.insert(seen.replica.clone(), (attempt, *restart, c));
            }
            let at = [seen.newest.map(|t| t.min(now)), ran.then_some(now)].into_iter().flatten().max();
            if let Some(at) = at.filter(|at| last.is_none_or(|l| *at > l)) {
                self.apply(id, Event::Activity { replica: seen.replica.clone(), at }, now)?.ok();
            }
            if let Some(d) = seen.dump {
                dumps.push((seen.replica, d));
            }
        }
        if let Some(at) = newest {
            self.apply(id, Event::CheckpointSeen { at: at.min(now) }, now)?.ok();
        }
        let before: Vec<Option<Micros>> = self.jobs.get(&id).map(|l| l.job.replicas.iter().map(|r| r.hung_since).collect()).unwrap_or_default();
        self.apply(id, Event::Tick, now)?.ok();
        // The stacks of the replicas this tick reported silent, in the job's log.
        if let Some(live) = self.jobs.get(&id) {
            let lines: Vec<Effect> = live
                .job
                .replicas
                .iter()
                .enumerate()
                .filter(|(i, r)| r.hung_since.is_some() && before.get(*i).is_some_and(Option::is_none))
                .filter_map(|(_, r)| {
                    let (_, d) = dumps.iter().find(|(n, _)| *n == r.name)?;
                    let text = format!("TY4: Replica {}'s processes when its silence was reported:\n{}", r.name, d.trim_end());
                    Some(Effect::Log(trainyard_core::step::LogLine { attempt: live.job.attempt, replica: Some(r.name.clone()), text }))
                })
                .collect();
            if !lines.is_empty() {
                Driver::timed(&self.metrics, "commit", || self.store.commit(&live.job, &lines, now))?;
            }
        }
        if self.jobs.get(&id).is_some_and(|l| l.job.wants_placement(now)) {
            self.reschedule = true;
        }
        self.index_deadline(id);
        Ok(())
    }

    /// Hold a job's timers until `at` (an observation of its files is under way).
    fn hold_deadline(&mut self, id: u64, at: Micros) {
        if let Some(old) = self.deadline_of.insert(id, at) {
            self.deadlines.remove(&(old, id));
        }
        self.deadlines.insert((at, id));
    }

    /// The job's output directory: its project's namespace of the storage root or an
    /// output root.
    pub(super) fn output_base(&self, live: &Live) -> Option<Confined> {
        let out = live.resource.job_spec.base_output_directory.as_ref()?;
        resolve_uri(&out.output_uri_prefix, &live.job.project, &self.svc.cfg.storage_root, &self.svc.output_roots, "").ok()
    }

    /// Admission and placement for every job that waits (L3, L5, L15).
    /// Returns what deciding cost (µs), the writes that follow not counted.
    pub(super) fn schedule_round(&mut self, now: Micros) -> Result<Micros, StoreError> {
        // Fair share with memory: the past use aged with what was held since the last
        // round, then what is held after this one's decisions, for the next.
        self.age_usage(now)?;
        let cost = self.decide_round(now)?;
        self.last_held = self.holdings();
        self.round_at = {
            let live: Vec<&Job> = self.jobs.values().map(|l| &l.job).collect();
            trainyard_core::schedule::next_change(&live, &self.svc.cfg.scheduler, now)
        };
        Ok(cost)
    }

    fn decide_round(&mut self, now: Micros) -> Result<Micros, StoreError> {
        let hints = Hints { usage_history: self.usage_history.clone(), ..Hints::default() };
        let began = self.clock.monotonic();
        let elapsed = |clock: &dyn Clock| clock.monotonic().saturating_sub(began).as_micros() as Micros;
        let (decisions, grows) = {
            let live: Vec<&Job> = self.jobs.values().map(|l| &l.job).collect();
            if !live.iter().any(|j| j.wants_placement(now) || j.wants_growth()) {
                return Ok(elapsed(self.clock.as_ref()));
            }
            let mut decisions = if live.iter().any(|j| j.wants_placement(now)) {
                schedule_with(&live, &self.fleet, &self.quotas, now, &self.svc.cfg.scheduler, &hints)
            } else {
                Vec::new()
            };
            // TY10: elastic jobs grow into what the queue leaves.
            let grows = trainyard_core::schedule::growth(&live, &self.fleet, &mut decisions, now);
            (decisions, grows)
        };
        let cost = elapsed(self.clock.as_ref());
        let mut used: HashSet<String> = self
            .jobs
            .values()
            .flat_map(|l| l.job.replicas.iter().filter_map(|r| r.address.clone()))
            .collect();
        let mut next_slot = 0u32;
        let mut reasons: HashMap<u64, Waiting> = HashMap::new();
        let mut changed: Vec<u64> = Vec::new();
        // Placements are applied together (one transaction for the round's starts).
        let mut placed: Vec<(u64, Event)> = Vec::new();
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
                    placed.push((job, Event::Place { nodes, addresses, notes: warnings }));
                }
                Decision::Stockout { job, detail } => {
                    self.metrics.stockout();
                    self.apply(job, Event::Stockout { detail }, now)?.ok();
                }
                Decision::Impossible { job, reason } => {
                    self.apply(job, Event::Impossible { reason }, now)?.ok();
                }
                Decision::Wait { job, kind, reason, position, .. } => {
                    let Some(live) = self.jobs.get_mut(&job) else { continue };
                    let waiting = Waiting { reason, position };
                    // The reason is written (state and log line) only when its kind
                    // changes, without its place in the queue: that moves with every
                    // round, and is shown from the latest one, never written.
                    if live.waiting != Some(kind) {
                        live.waiting = Some(kind);
                        live.job.waiting_reason = Some(Waiting { position: None, ..waiting.clone() }.text(&live.job.project));
                        changed.push(job);
                    }
                    reasons.insert(job, waiting);
                }
                Decision::Preempt { job, reason, by_priority: None, reclaim: false } => {
                    // TY10: one elastic replica above its minimum gives its room.
                    if let Some((job, i)) = trainyard_core::schedule::extra_of(job) {
                        let Some(replica) = self.jobs.get(&job).and_then(|l| l.job.replicas.get(i)).map(|r| r.name.clone()) else { continue };
                        let cause = format!("preempted: {reason}");
                        self.apply(job, Event::Leave { replica, cause }, now)?.ok();
                        continue;
                    }
                    self.apply(job, Event::Preempt { reason }, now)?.ok();
                }
                Decision::Preempt { job, reason, by_priority: None, reclaim: true } => {
                    self.apply(job, Event::PreemptForPriority { reason, requeue: true }, now)?.ok();
                }
                Decision::Preempt { job, reason, by_priority: Some(value), .. } => {
                    // The class that preempted it, by name.
                    let class = self.priorities.classes.iter().find(|(_, v)| *v == value).map(|(n, _)| n.as_str()).unwrap_or("?");
                    let reason = format!("{reason} (priority class {class})");
                    self.apply(job, Event::PreemptForPriority { reason, requeue: false }, now)?.ok();
                }
            }
        }
        placed.extend(grows.into_iter().map(|(job, replica, node)| (job, Event::Grow { replica, node })));
        self.apply_many(placed, now)?;
        self.engine_reasons.retain(|id, _| self.jobs.contains_key(id));
        self.publish_waiting(&changed, reasons, now)?;
        Ok(cost)
    }
}

/// L21: how long a due checkpoint warning (and the job's other timers, L19) waits for the
/// job's checkpoint scan to report. Scans are bounded and take milliseconds; this only
/// matters when the file system itself hangs.
const SCAN_HOLD: Micros = 10 * trainyard_core::job::SECOND;
