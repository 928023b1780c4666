//! HyperparameterTuningJobs in the driver: a study is a pure state machine
//! (`crate::kinds::tuning_jobs`) whose trials are CustomJobs run under the lifecycle rules; here its
//! events are applied, committed (trials as REQUESTED before their jobs exist) and acted on.

use super::*;

impl Driver {
    /// L23 for studies: load the live ones, link trials to the jobs created for them, and
    /// create the trial jobs that a crash kept from being created (never twice).
    pub(super) fn recover_studies(&mut self) -> Result<(), StoreError> {
        let now = self.now();
        for (id, resource, core) in self.store.active_other(KIND_STUDY)? {
            let parsed = serde_json::from_str::<HyperparameterTuningJob>(&resource)
                .map_err(|e| format!("its resource: {e}"))
                .and_then(|r| serde_json::from_str::<Study>(&core).map(|st| (r, st)).map_err(|e| e.to_string()))
                .and_then(|(r, st)| StudyConfig::from_job(&r).map(|cfg| (r, st, cfg)).map_err(|e| e.message));
            let (resource, st, cfg) = match parsed {
                Ok(p) => p,
                Err(damage) => {
                    // Quarantined, not fatal: FAILED, deletable; its trial jobs are stopped
                    // below, as those of any ended study.
                    tracing::error!("study {id}: the stored record is damaged ({damage}); it is marked FAILED");
                    self.store.quarantine_other(id, &damage, now)?;
                    continue;
                }
            };
            self.studies.insert(id, LiveStudy { study: st, resource, cfg });
        }
        // A study's stop of its trial jobs is derived again from its committed state: a live
        // trial job whose study has ended, or whose trial the study ended (early stopping,
        // a cancel), is cancelled now, in case a crash came between the study's commit and
        // the stop (L23).
        let orphans: Vec<u64> = self
            .jobs
            .values()
            .filter_map(|l| {
                let link = l.job.trial.as_ref()?;
                let wanted = self
                    .studies
                    .get(&link.study)
                    .and_then(|ls| ls.study.trials.iter().find(|t| t.id == link.trial))
                    .is_some_and(|t| !t.state.is_terminal());
                (!wanted).then_some(l.job.id)
            })
            .collect();
        for job in orphans {
            tracing::info!("job {job}: its trial has ended in its study; cancelling it");
            self.apply(job, Event::Cancel, now)?.ok();
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
                    self.trial_ended(id, trial, &stored.job);
                }
            }
            self.study_events.push((id, study::Event::Advance));
        }
        Ok(())
    }

    pub(super) fn create_study(
        &mut self,
        project: String,
        region: String,
        resource: HyperparameterTuningJob,
        now: Micros,
    ) -> Result<serde_json::Value, ApiError> {
        served_region(&region, &self.svc.cfg.region)?;
        let cfg = StudyConfig::from_job(&resource)?;
        // The trial job spec is checked against the catalog, fleet and quotas now.
        let sample = trial_resource(&resource, "0", &[]);
        prepare(&sample, &self.svc.catalog, &self.svc.cfg.settings, &self.fleet, &self.quotas, &self.priorities, &project)
            .map_err(|e| ApiError::new(e.code, e.message.replace("jobSpec.", "trialJobSpec.")))?;
        check_paths(&resource.trial_job_spec, "trialJobSpec", &project, &self.svc.cfg.storage_root, &self.svc.output_roots)?;
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
            .map_err(|e| self.store_err(e))?;
        tracing::info!("hyperparameter tuning job {id} created: {:?}", resource.display_name);
        self.studies.insert(id, LiveStudy { study: Study::new(id, project, region, now), resource, cfg });
        self.apply_study(id, study::Event::Advance, now)?;
        self.maybe_schedule(now).map_err(|e| self.store_err(e))?;
        self.study_view(id).ok_or_else(|| ApiError::internal("study vanished"))
    }

    pub(super) fn study_view(&self, id: u64) -> Option<serde_json::Value> {
        self.studies.get(&id).map(|ls| render_study(&ls.resource, &ls.study, true))
    }

    /// Step a study, commit it (trials as REQUESTED before their jobs exist), then act.
    pub(super) fn apply_study(&mut self, id: u64, event: study::Event, now: Micros) -> Result<(), ApiError> {
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
        self.commit_study(id, now, &lines).map_err(|e| self.store_err(e))?;
        for a in actions {
            match a {
                study::Action::CreateTrialJob { trial } => self.create_trial_job(id, &trial, now).map_err(|e| self.store_err(e))?,
                study::Action::StopTrialJob { custom_job } => {
                    if let Err(e) = self.apply(custom_job, Event::Cancel, now) {
                        tracing::error!("stopping trial job {custom_job}: {e}");
                    }
                }
                study::Action::Suggest(request) => {
                    let project = self.studies.get(&id).map(|l| l.study.project.clone()).unwrap_or_default();
                    self.exec.submit(crate::executor::Work::Suggest { study: id, project, request })
                }
                study::Action::Log(_) => {}
            }
        }
        if self.studies.get(&id).is_some_and(|l| l.study.is_terminal()) {
            // A suggestion under way (the job was cancelled meanwhile) stops.
            self.exec.submit(crate::executor::Work::CancelSuggest { study: id, vizier: false });
            tracing::info!("hyperparameter tuning job {id} ended");
            self.studies.remove(&id);
        }
        Ok(())
    }

    pub(super) fn commit_study(&mut self, id: u64, now: Micros, lines: &[String]) -> Result<(), StoreError> {
        let Some(ls) = self.studies.get(&id) else { return Ok(()) };
        let text = serde_json::to_string(&ls.study).map_err(StoreError::Encode)?;
        Driver::timed(&self.metrics, "commit_other", || {
            self.store.commit_other(id, ls.study.state_name(), ls.study.is_terminal(), &text, now, lines)
        })
    }

    /// Create the CustomJob of a trial and link it (L: each trial is a CustomJob run under
    /// the lifecycle rules).
    pub(super) fn create_trial_job(&mut self, id: u64, trial: &str, now: Micros) -> Result<(), StoreError> {
        let Some(ls) = self.studies.get(&id) else { return Ok(()) };
        let Some(t) = ls.study.trials.iter().find(|t| t.id == trial) else { return Ok(()) };
        let mut resource = trial_resource(&ls.resource, trial, &t.params);
        // Trials are told apart from other jobs (the console hides them on request with
        // the filter `NOT labels.trainyard_study:*`); the label limit is kept.
        if resource.labels.len() < trainyard_api::validate::MAX_LABELS {
            resource.labels.extend(study::trial_labels(id));
        }
        let (project, region) = (ls.study.project.clone(), ls.study.region.clone());
        let link = trainyard_core::job::TrialLink { study: id, trial: trial.to_string() };
        let created = self.create_many(vec![NewCustomJob { project, region, resource, trial: Some(link), pipeline: None }], now).pop();
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
                    study::Event::TrialEnded {
                        trial: trial.to_string(),
                        succeeded: false,
                        error: Some(e.message),
                        measurements: Vec::new(),
                        elapsed_ms: Vec::new(),
                        others: Vec::new(),
                    },
                ));
            }
        }
        Ok(())
    }

    pub(super) fn drain_study_events(&mut self, now: Micros) -> Result<(), StoreError> {
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

    /// A replica's metric file (a trial's, cloudml-hypertune's format).
    pub(super) fn metric_file_of(&self, job: u64, replica: &str) -> PathBuf {
        self.svc.cfg.data_dir.join("trials").join(job.to_string()).join(replica).join("output.metrics")
    }

    /// The primary replica's metric file of a trial job (cloudml-hypertune's format).
    pub(super) fn metric_file(&self, job: u64) -> PathBuf {
        self.metric_file_of(job, "workerpool0-0")
    }

    /// The read of a trial job's metric file (None: not a trial of a live study).
    fn metric_read(&self, job: &Job, trial: String, end: Option<crate::executor::TrialEnd>) -> Option<crate::executor::MetricRead> {
        let link = job.trial.as_ref()?;
        let cfg = &self.studies.get(&link.study)?.cfg;
        let ids = std::iter::once(cfg.metric_id.clone()).chain(cfg.others.iter().map(|o| o.0.clone())).collect();
        Some(crate::executor::MetricRead { study: link.study, trial, path: self.metric_file(job.id), ids, start_time: job.start_time, end })
    }

    /// A trial's job ended: its metric file gets its final read on the observing thread,
    /// whose answer is the study's `TrialEnded` ([`Driver::trial_metrics_read`]). A read
    /// lost to a crash is asked again at the start (the trial is still active then).
    pub(super) fn trial_ended(&mut self, study: u64, trial: String, job: &Job) {
        let end = crate::executor::TrialEnd {
            succeeded: job.state() == trainyard_core::State::Succeeded,
            error: job.error().map(|e| e.message.clone()),
        };
        match self.metric_read(job, trial.clone(), Some(end.clone())) {
            Some(read) => self.exec.submit(crate::executor::Work::ReadTrialMetrics { reads: vec![read], periodic: false }),
            None => self.study_events.push((study, ended_event(trial, end, TrialMetrics::default()))),
        }
    }

    /// Intermediate measurements of running trials (early stopping): their metric files
    /// are read about once a second on the executor's observing thread (a tenant's files
    /// never stall the driver), one read at a time; see [`Driver::trial_metrics_read`].
    pub(super) fn poll_trial_metrics(&mut self, now: Micros) {
        if self.studies.is_empty() || self.metric_read_in_flight || now - self.last_metric_poll < 1_000_000 {
            return;
        }
        self.last_metric_poll = now;
        let mut reads = Vec::new();
        for ls in self.studies.values() {
            for t in ls.study.trials.iter().filter(|t| t.state == study::TrialState::Active) {
                let Some(j) = t.custom_job.and_then(|j| self.jobs.get(&j)) else { continue };
                reads.extend(self.metric_read(&j.job, t.id.clone(), None));
            }
        }
        if !reads.is_empty() {
            self.metric_read_in_flight = true;
            self.exec.submit(crate::executor::Work::ReadTrialMetrics { reads, periodic: true });
        }
    }

    /// What the observing thread read: a trial's final read is its `TrialEnded`; for
    /// trials still active, a measurement that changed is the study's event.
    pub(super) fn trial_metrics_read(&mut self, reads: Vec<crate::executor::MetricsRead>, periodic: bool) {
        if periodic {
            self.metric_read_in_flight = false;
        }
        for r in reads {
            if let Some(end) = r.end {
                self.study_events.push((r.study, ended_event(r.trial, end, r.metrics)));
                continue;
            }
            let Some(ls) = self.studies.get(&r.study) else { continue };
            let Some(t) = ls.study.trials.iter().find(|t| t.id == r.trial && t.state == study::TrialState::Active) else { continue };
            if r.metrics.primary != t.measurements {
                self.study_events.push((
                    r.study,
                    study::Event::Measurements { trial: r.trial, measurements: r.metrics.primary, elapsed_ms: r.metrics.elapsed_ms },
                ));
            }
        }
    }
}

/// The study's event of a trial whose job ended, with what its metric file said.
fn ended_event(trial: String, end: crate::executor::TrialEnd, m: TrialMetrics) -> study::Event {
    study::Event::TrialEnded {
        trial,
        succeeded: end.succeeded,
        error: end.error,
        measurements: m.primary,
        elapsed_ms: m.elapsed_ms,
        others: m.others,
    }
}

pub(super) use crate::executor::TrialMetrics;

