//! A TrainingPipeline of the custom task: one CustomJob, run under the lifecycle rules,
//! whose state the pipeline follows (PIPELINE_STATE_*). A pure state machine; the driver
//! (`driver::pipelines`) commits it and acts on it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainyard_api::{ApiError, PipelineState, Status, Timestamp, TrainingPipeline};
use trainyard_core::{Micros, State};
use trainyard_store::Store;

use super::custom_jobs::job_name;
use super::kind::{checked, Create, Kind, Page, Reply, ResourceKind, View};
use super::waiting::WaitingView;
use crate::reply::internal;

/// The stored state of a pipeline (the `core` column of its row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    pub id: u64,
    pub project: String,
    pub region: String,
    pub create_time: Micros,
    pub update_time: Micros,
    #[serde(default)]
    pub start_time: Option<Micros>,
    #[serde(default)]
    pub end_time: Option<Micros>,
    pub state: PipelineState,
    /// FAILED or CANCELLED: the code and message.
    #[serde(default)]
    pub error: Option<(i32, String)>,
    /// The backing CustomJob, once it exists.
    #[serde(default)]
    pub custom_job: Option<u64>,
}

/// What happens to a pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Its CustomJob was created.
    JobCreated(u64),
    /// Its CustomJob is in this state now (with its error when it ended in one).
    Job { state: State, error: Option<(i32, String)> },
    /// Its CustomJob could not be created at all.
    JobRefused(String),
    /// A cancel was asked.
    Cancel,
}

/// What the driver does after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    CancelJob(u64),
    Log(String),
}

impl Pipeline {
    pub fn new(id: u64, project: String, region: String, now: Micros) -> Pipeline {
        Pipeline {
            id,
            project,
            region,
            create_time: now,
            update_time: now,
            start_time: None,
            end_time: None,
            state: PipelineState::Pending,
            error: None,
            custom_job: None,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.state, PipelineState::Succeeded | PipelineState::Failed | PipelineState::Cancelled)
    }

    pub fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn end(&mut self, state: PipelineState, error: Option<(i32, String)>, now: Micros) {
        self.state = state;
        self.error = error;
        self.end_time = Some(now);
    }

    /// One step: the next state and what to do.
    pub fn step(&self, event: Event, now: Micros) -> (Pipeline, Vec<Action>) {
        let mut p = self.clone();
        let mut actions = Vec::new();
        if p.is_terminal() {
            return (p, actions);
        }
        p.update_time = now;
        match event {
            Event::JobCreated(j) => {
                p.custom_job = Some(j);
                actions.push(Action::Log(format!("Training pipeline {}: its CustomJob is {j}.", p.id)));
            }
            Event::JobRefused(message) => {
                actions.push(Action::Log(format!("Training pipeline {}: its CustomJob could not be created: {message}", p.id)));
                p.end(PipelineState::Failed, Some((3, message)), now);
            }
            Event::Cancel => match p.custom_job {
                Some(j) => {
                    p.state = PipelineState::Cancelling;
                    actions.push(Action::CancelJob(j));
                }
                None => p.end(PipelineState::Cancelled, Some((1, "CANCELED".into())), now),
            },
            Event::Job { state, error } => match state {
                State::Running if p.state != PipelineState::Cancelling => {
                    p.state = PipelineState::Running;
                    p.start_time.get_or_insert(now);
                }
                State::Succeeded => p.end(PipelineState::Succeeded, None, now),
                State::Failed => p.end(PipelineState::Failed, error.or(Some((13, "the training job failed".into()))), now),
                State::Cancelled => p.end(PipelineState::Cancelled, error.or(Some((1, "CANCELED".into()))), now),
                _ => {}
            },
        }
        (p, actions)
    }
}

// ---------------------------------------------------------------------------------------
// The resource: names, rendering and its kind.

/// Its key in the store.
pub const KIND_PIPELINE: &str = "pipeline";

pub fn pipeline_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/trainingPipelines/{id}")
}

/// The TrainingPipeline as the API shows it.
pub fn render_pipeline(resource: &TrainingPipeline, p: &Pipeline) -> TrainingPipeline {
    let mut r = resource.clone();
    let ts = |t: Micros| Some(Timestamp::from_micros(t));
    r.name = pipeline_name(&p.project, &p.region, p.id);
    r.state = p.state;
    r.create_time = ts(p.create_time);
    r.update_time = ts(p.update_time);
    r.start_time = p.start_time.and_then(ts);
    r.end_time = p.end_time.and_then(ts);
    r.error = p.error.as_ref().map(|(code, message)| Status { code: *code, message: message.clone(), ..Status::default() });
    if let Some(j) = p.custom_job {
        r.training_task_metadata = serde_json::json!({"backingCustomJob": job_name(&p.project, &p.region, j)});
    }
    r
}

/// `TrainingPipeline` (the custom task): rows read as text, as tuning jobs.
pub enum TrainingPipelines {}

/// A stored TrainingPipeline: its resource and state, or what is wrong with its record.
pub struct PipelineRow {
    id: u64,
    project: String,
    region: String,
    record: Result<(trainyard_api::TrainingPipeline, Pipeline), String>,
}

impl PipelineRow {
    fn new(project: &str, region: &str, (id, resource, core): (u64, String, String)) -> PipelineRow {
        let record = serde_json::from_str(&resource)
            .map_err(|e| format!("record of pipeline {id}: its resource: {e}"))
            .and_then(|r| serde_json::from_str(&core).map(|p| (r, p)).map_err(|e| format!("record of pipeline {id}: {e}")));
        PipelineRow { id, project: project.to_string(), region: region.to_string(), record }
    }
}

impl ResourceKind for TrainingPipelines {
    const COLLECTION: &'static str = "trainingPipelines";
    const STORE_KIND: &'static str = KIND_PIPELINE;
    const KIND: Kind = Kind::Pipeline;
    const API_NAME: &'static str = "TrainingPipeline";
    type New = trainyard_api::TrainingPipeline;
    type Created = trainyard_api::TrainingPipeline;
    type Row = PipelineRow;

    fn parse(body: &[u8]) -> Result<trainyard_api::TrainingPipeline, ApiError> {
        checked(body, trainyard_api::parse_training_pipeline, trainyard_api::validate_training_pipeline)
    }

    fn create(resource: Self::New, reply: Reply<Self::Created>) -> Create {
        Create::Pipeline { resource: Box::new(resource), reply }
    }

    fn on_disk(resource: &Self::New) -> crate::jobspec::OnDisk {
        // A pipeline whose job cannot be made is refused by the driver, naming why.
        match trainyard_api::pipeline_custom_job(resource) {
            Ok(job) => crate::jobspec::OnDisk::of(&job.job_spec, "trainingTaskInputs", &job.trainyard_host_directories),
            Err(_) => crate::jobspec::OnDisk::default(),
        }
    }

    fn stored_place(row: &PipelineRow) -> Option<(String, String)> {
        row.record.as_ref().ok().and_then(|(r, _)| super::kind::place_of(&r.name))
    }

    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<PipelineRow>> {
        Ok(store.get_other(KIND_PIPELINE, project, region, id)?.map(|row| PipelineRow::new(project, region, row)))
    }

    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<PipelineRow>> {
        let rows = store.list_other(KIND_PIPELINE, project, region, page.filter, page.before, page.limit)?;
        Ok(rows.into_iter().map(|row| PipelineRow::new(project, region, row)).collect())
    }

    fn id(row: &PipelineRow) -> u64 {
        row.id
    }

    fn live_state(row: &PipelineRow) -> Option<&'static str> {
        match &row.record {
            Ok((_, p)) if !p.is_terminal() => Some(p.state_name()),
            _ => None,
        }
    }

    fn render(row: &PipelineRow, _waiting: &WaitingView, _view: View) -> Result<Value, ApiError> {
        Ok(match &row.record {
            Ok((resource, p)) => serde_json::to_value(render_pipeline(resource, p)).map_err(internal)?,
            Err(damage) => serde_json::json!({
                "name": Self::name(&row.project, &row.region, row.id),
                "state": "PIPELINE_STATE_FAILED",
                "error": {"code": 13, "message": format!("Internal error: the stored record of this pipeline is damaged and cannot be read ({damage}).")},
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_its_custom_job_and_cascades_a_cancel() {
        let p = Pipeline::new(1, "p".into(), "r".into(), 0);
        let (p, _) = p.step(Event::JobCreated(2), 1);
        assert_eq!((p.state, p.custom_job), (PipelineState::Pending, Some(2)));
        let (p, _) = p.step(Event::Job { state: State::Running, error: None }, 2);
        assert_eq!((p.state, p.start_time), (PipelineState::Running, Some(2)));
        let (done, _) = p.step(Event::Job { state: State::Succeeded, error: None }, 3);
        assert_eq!((done.state, done.end_time), (PipelineState::Succeeded, Some(3)));
        let (c, actions) = p.step(Event::Cancel, 4);
        assert_eq!((c.state, actions), (PipelineState::Cancelling, vec![Action::CancelJob(2)]));
        let (c, _) = c.step(Event::Job { state: State::Cancelled, error: Some((1, "CANCELED".into())) }, 5);
        assert_eq!(c.state, PipelineState::Cancelled);
        // Ended is ended.
        let (same, a) = c.step(Event::Job { state: State::Running, error: None }, 6);
        assert_eq!((same.state, a.len()), (PipelineState::Cancelled, 0));
        let (failed, _) = Pipeline::new(3, "p".into(), "r".into(), 0).step(Event::JobRefused("quota".into()), 1);
        assert_eq!(failed.state, PipelineState::Failed);
    }
}
