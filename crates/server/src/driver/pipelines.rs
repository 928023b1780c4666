//! TrainingPipelines in the driver: each runs one CustomJob (linked by `Job::pipeline`)
//! and follows its state (`crate::kinds::pipelines`). Created in two commits: the pipeline row,
//! then its CustomJob with the link; a crash between them is repaired at start (L23),
//! never creating a job twice: the link is what is looked for.

use super::*;
use crate::kinds::pipelines::{self as pipeline, Action, Pipeline};
use trainyard_api::TrainingPipeline;

pub(super) struct LivePipeline {
    pub(super) pipeline: Pipeline,
    pub(super) resource: TrainingPipeline,
}

impl Driver {
    pub(super) fn create_pipeline(&mut self, project: String, region: String, resource: TrainingPipeline, now: Micros) -> Result<TrainingPipeline, ApiError> {
        served_region(&region, &self.svc.cfg.region)?;
        // The job it will run is checked now, as a CustomJob create would be.
        let job = trainyard_api::pipeline_custom_job(&resource)?;
        let rename = |e: ApiError| ApiError::new(e.code, e.message.replace("jobSpec.", "trainingTaskInputs."));
        prepare(&job, &self.svc.catalog, &self.svc.cfg.settings, &self.fleet, &self.quotas, &self.priorities, &project).map_err(rename)?;
        check_paths(&job.job_spec, "trainingTaskInputs", &project, &self.svc.cfg.storage_root, &self.svc.output_roots)?;
        let text = serde_json::to_string(&resource).map_err(|e| ApiError::internal(format!("encoding the pipeline: {e}")))?;
        let labels: Vec<(String, String)> = resource.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let (p, r) = (project.clone(), region.clone());
        let id = self
            .store
            .insert_other(
                &NewJob { kind: KIND_PIPELINE, project: &project, region: &region, display_name: &resource.display_name, labels: &labels, resource: &text },
                PipelineState::Pending.name(),
                now,
                |id| serde_json::to_string(&Pipeline::new(id, p, r, now)).unwrap_or_default(),
            )
            .map_err(|e| self.store_err(e))?;
        tracing::info!("training pipeline {id} created: {:?}", resource.display_name);
        self.pipelines.insert(id, LivePipeline { pipeline: Pipeline::new(id, project.clone(), region.clone(), now), resource });
        self.create_pipeline_job(id, now).map_err(|e| self.store_err(e))?;
        self.maybe_schedule(now).map_err(|e| self.store_err(e))?;
        let live = self.pipelines.get(&id).map(|l| render_pipeline(&l.resource, &l.pipeline));
        match live {
            Some(v) => Ok(v),
            // Ended at once (its job was refused): read back what was stored.
            None => self.stored_pipeline(&project, &region, id).ok_or_else(|| ApiError::internal("the pipeline vanished")),
        }
    }

    fn stored_pipeline(&self, project: &str, region: &str, id: u64) -> Option<TrainingPipeline> {
        let (_, resource, core) = self.store.get_other(KIND_PIPELINE, project, region, id).ok().flatten()?;
        let resource: TrainingPipeline = serde_json::from_str(&resource).ok()?;
        let p: Pipeline = serde_json::from_str(&core).ok()?;
        Some(render_pipeline(&resource, &p))
    }

    /// Creates the pipeline's CustomJob with its link, and records it.
    fn create_pipeline_job(&mut self, id: u64, now: Micros) -> Result<(), StoreError> {
        let Some(lp) = self.pipelines.get(&id) else { return Ok(()) };
        let job = match trainyard_api::pipeline_custom_job(&lp.resource) {
            Ok(j) => j,
            Err(e) => return self.apply_pipeline(id, pipeline::Event::JobRefused(e.message), now),
        };
        let (project, region) = (lp.pipeline.project.clone(), lp.pipeline.region.clone());
        let created = self.create_many(vec![NewCustomJob { project, region, resource: job, trial: None, pipeline: Some(id) }], now).pop();
        match created.unwrap_or_else(|| Err(ApiError::internal("no result for the pipeline's job"))) {
            Ok(job_id) => self.apply_pipeline(id, pipeline::Event::JobCreated(job_id), now),
            Err(e) => self.apply_pipeline(id, pipeline::Event::JobRefused(e.message), now),
        }
    }

    /// Step, commit, act.
    pub(super) fn apply_pipeline(&mut self, id: u64, event: pipeline::Event, now: Micros) -> Result<(), StoreError> {
        let Some(lp) = self.pipelines.get(&id) else { return Ok(()) };
        let (next, actions) = lp.pipeline.step(event, now);
        if next == lp.pipeline && actions.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Log(l) => Some(l.clone()),
                _ => None,
            })
            .collect();
        let text = serde_json::to_string(&next).map_err(StoreError::Encode)?;
        Driver::timed(&self.metrics, "commit_other", || self.store.commit_other(id, next.state_name(), next.is_terminal(), &text, now, &lines))?;
        let ended = next.is_terminal();
        if let Some(lp) = self.pipelines.get_mut(&id) {
            lp.pipeline = next;
        }
        for a in actions {
            if let Action::CancelJob(j) = a {
                self.apply(j, Event::Cancel, now)?.ok();
            }
        }
        if ended {
            tracing::info!("training pipeline {id} ended");
            self.pipelines.remove(&id);
        }
        Ok(())
    }

    pub(super) fn cancel_pipeline(&mut self, project: &str, region: &str, id: u64, now: Micros) -> Result<(), ApiError> {
        let owned = self.pipelines.get(&id).is_some_and(|l| l.pipeline.project == project && l.pipeline.region == region);
        if owned {
            return self.apply_pipeline(id, pipeline::Event::Cancel, now).map_err(|e| self.store_err(e));
        }
        match self.store.get_other(KIND_PIPELINE, project, region, id).map_err(|e| self.store_err(e))? {
            Some(_) => Err(ApiError::failed_precondition(format!(
                "The TrainingPipeline \"{}\" has ended and cannot be cancelled.",
                pipeline_name(project, region, id)
            ))),
            None => Err(ApiError::not_found(format!("The TrainingPipeline \"{}\" does not exist.", pipeline_name(project, region, id)))),
        }
    }

    /// The pipelines' events from their jobs' changes (see `install`).
    pub(super) fn drain_pipeline_events(&mut self, now: Micros) -> Result<(), StoreError> {
        while !self.pipeline_events.is_empty() {
            for (id, ev) in std::mem::take(&mut self.pipeline_events) {
                self.apply_pipeline(id, ev, now)?;
            }
        }
        Ok(())
    }

    /// L23: live pipelines loaded; a pipeline whose job was not created (a crash between
    /// the two commits) gets it now, found by its link first; one whose job ended while
    /// the server was down ends now.
    pub(super) fn recover_pipelines(&mut self) -> Result<(), StoreError> {
        let now = self.now();
        for (id, resource, core) in self.store.active_other(KIND_PIPELINE)? {
            let parsed = serde_json::from_str::<TrainingPipeline>(&resource)
                .map_err(|e| format!("its resource: {e}"))
                .and_then(|r| serde_json::from_str::<Pipeline>(&core).map(|p| (r, p)).map_err(|e| e.to_string()));
            match parsed {
                Ok((resource, pipeline)) => {
                    self.pipelines.insert(id, LivePipeline { pipeline, resource });
                }
                Err(damage) => {
                    tracing::error!("training pipeline {id}: the stored record is damaged ({damage}); it is marked FAILED");
                    self.store.quarantine_other(id, &damage, now)?;
                }
            }
        }
        let ids: Vec<u64> = self.pipelines.keys().copied().collect();
        for id in ids {
            let linked = self.jobs.values().find(|l| l.job.pipeline == Some(id)).map(|l| l.job.id);
            let known = self.pipelines.get(&id).and_then(|l| l.pipeline.custom_job);
            match (known, linked) {
                (None, Some(j)) => self.apply_pipeline(id, pipeline::Event::JobCreated(j), now)?,
                (None, None) => self.create_pipeline_job(id, now)?,
                (Some(_), _) => {}
            }
            let Some(j) = self.pipelines.get(&id).and_then(|l| l.pipeline.custom_job) else { continue };
            let state = match self.jobs.get(&j) {
                Some(l) => Some((l.job.state(), l.job.error().map(|e| (e.code, e.message.clone())))),
                None => self.store.get_job_by_id(j)?.map(|s| (s.job.state(), s.job.error().map(|e| (e.code, e.message.clone())))),
            };
            match state {
                Some((state, error)) => self.apply_pipeline(id, pipeline::Event::Job { state, error }, now)?,
                None => self.apply_pipeline(id, pipeline::Event::JobRefused(format!("its CustomJob {j} is gone")), now)?,
            }
        }
        Ok(())
    }
}
