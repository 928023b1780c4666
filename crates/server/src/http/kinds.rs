//! Resource kinds: what the REST API needs to know of each kind of resource it serves
//! (`CustomJob`, `HyperparameterTuningJob`, and the kinds that come next), so that one set
//! of handlers ([`super::resources`]) serves them all.
//!
//! A kind is a type that implements [`ResourceKind`]: constants for its names (the
//! collection segment of its paths, its key in the store, its name in the API), associated
//! types for what flows through it (a create body after parsing and validation, the
//! driver's answer to a create, a stored row as read), and functions for the parts that
//! differ between kinds:
//! - parse and validate a create body (the wire rules of `trainyard_api`);
//! - the driver messages that create and cancel one (delete is one message for every
//!   kind, `Msg::Delete` with the kind's store key);
//! - read one row, or one page of rows, from a read connection of the store;
//! - render a row as the API shows it, a damaged record as FAILED with an internal error
//!   naming the damage (so that it is listed, shown and deletable, never an error that
//!   hides it or the rows around it), and with the extra parts a GET shows ([`View`]);
//! - whether a row may be deleted: [`ResourceKind::live_state`] names the state of a row
//!   that has not ended (a damaged record was quarantined by the driver and may go).
//!
//! Each kind reads its rows in its own way (CustomJobs typed through `Store::get_job` and
//! `list_jobs`, tuning jobs as text through `get_other` and `list_other`) behind the same
//! two functions, so the store needs nothing new for the generic path.
//!
//! The kinds are types rather than values so that the handlers are monomorphised per
//! kind and axum routes them with no dispatch at run time; a new kind is one impl here and
//! one line in [`super::router`] (`.merge(resources::routes::<NewKind>())`). Which routes
//! and status codes every kind gets is described in [`super::resources`].

use serde_json::Value;
use trainyard_api::{ApiError, CustomJob, HyperparameterTuningJob};
use trainyard_store::{Store, StoredJob};

use super::internal;
use crate::driver::{render, render_pipeline, render_study, Msg, Reply, WaitingView, KIND_CUSTOM, KIND_PIPELINE, KIND_STUDY};
use crate::study::Study;

/// Which rows a list page holds: those that pass `filter` (an SQL condition over the
/// columns of `jobs` with its parameters, compiled from the API's filter), newest first,
/// with ids below `before` (the page token's position), at most `limit`.
pub struct Page<'a> {
    pub filter: Option<(&'a str, &'a [rusqlite::types::Value])>,
    pub before: Option<u64>,
    pub limit: usize,
}

/// How much of a resource is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// `GET` of one resource: everything, with the parts a list leaves out (a tuning
    /// job's trials).
    Get,
    /// A row of a list method.
    List,
}

/// One kind of resource the API serves. See the module documentation.
pub trait ResourceKind: Send + Sync + 'static {
    /// The collection segment of its paths: `customJobs`.
    const COLLECTION: &'static str;
    /// Its kind in the store's `jobs` table (`KIND_CUSTOM`), also the first part of the
    /// scope its page tokens are bound to.
    const STORE_KIND: &'static str;
    /// Its name in the API: `CustomJob`. Error messages name it, and a `readMask` is
    /// checked against the fields of the schema of that name.
    const API_NAME: &'static str;

    /// A create body, parsed and validated.
    type New: Send + 'static;
    /// What the driver answers a create with (shown as the created resource).
    type Created: serde::Serialize + Send + 'static;
    /// A stored row as read, a damaged one included.
    type Row: Send + 'static;

    /// Parse and validate a create body against the wire rules.
    fn parse(body: &[u8]) -> Result<Self::New, ApiError>;
    /// The driver message that creates one.
    fn create(project: String, region: String, resource: Self::New, reply: Reply<Self::Created>) -> Msg;
    /// The driver message that cancels one.
    fn cancel(project: String, region: String, id: u64, reply: Reply<()>) -> Msg;

    /// The row of `id` under `project` and `region`, if there is one.
    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<Self::Row>>;
    /// A page of rows under `project` and `region`.
    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<Self::Row>>;

    /// The row's id (the position of page tokens).
    fn id(row: &Self::Row) -> u64;
    /// The state of a row that has not ended, which keeps it from being deleted; None once
    /// it has ended. A damaged record counts as ended: the driver quarantines it as FAILED.
    fn live_state(row: &Self::Row) -> Option<&'static str>;
    /// The row as the API shows it.
    fn render(row: &Self::Row, waiting: &WaitingView, view: View) -> Result<Value, ApiError>;

    /// Does the new resource ask for directories of the server's host
    /// (`trainyardHostDirectories`), which only some callers may?
    fn asks_host_directories(_resource: &Self::New) -> bool {
        false
    }

    /// Its resource name: `projects/{project}/locations/{region}/{COLLECTION}/{id}`.
    fn name(project: &str, region: &str, id: u64) -> String {
        format!("projects/{project}/locations/{region}/{}/{id}", Self::COLLECTION)
    }
}

/// A create body parsed by `parse` and checked by `validate` (the wire rules).
fn checked<T>(body: &[u8], parse: fn(&[u8]) -> Result<T, ApiError>, validate: fn(&T) -> Result<(), ApiError>) -> Result<T, ApiError> {
    let resource = parse(body)?;
    validate(&resource)?;
    Ok(resource)
}

/// `CustomJob`: rows read typed (`StoredJob`, whose lifecycle state the store decodes and
/// replaces by a FAILED stand-in when it is damaged); queued and pending jobs show the
/// waiting reason of the latest scheduling round.
pub enum CustomJobs {}

impl ResourceKind for CustomJobs {
    const COLLECTION: &'static str = "customJobs";
    const STORE_KIND: &'static str = KIND_CUSTOM;
    const API_NAME: &'static str = "CustomJob";
    type New = CustomJob;
    type Created = CustomJob;
    type Row = StoredJob;

    fn parse(body: &[u8]) -> Result<CustomJob, ApiError> {
        checked(body, trainyard_api::parse_custom_job, trainyard_api::validate_custom_job)
    }

    fn create(project: String, region: String, resource: CustomJob, reply: Reply<CustomJob>) -> Msg {
        Msg::Create { project, region, resource: Box::new(resource), reply }
    }

    fn asks_host_directories(resource: &CustomJob) -> bool {
        !resource.trainyard_host_directories.is_empty()
    }

    fn cancel(project: String, region: String, id: u64, reply: Reply<()>) -> Msg {
        Msg::Cancel { project, region, id, reply }
    }

    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<StoredJob>> {
        store.get_job(KIND_CUSTOM, project, region, id)
    }

    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<StoredJob>> {
        store.list_jobs(KIND_CUSTOM, project, region, page.filter, page.before, page.limit)
    }

    fn id(row: &StoredJob) -> u64 {
        row.job.id
    }

    fn live_state(row: &StoredJob) -> Option<&'static str> {
        (!row.job.is_terminal()).then(|| row.job.state().wire_name())
    }

    fn render(row: &StoredJob, waiting: &WaitingView, _view: View) -> Result<Value, ApiError> {
        serde_json::to_value(show_custom_job(row, waiting)).map_err(internal)
    }
}

/// A stored CustomJob as the API shows it. A resource that cannot be read is shown, not
/// hidden behind an error: its stand-in says FAILED with the damage, under its display name.
fn show_custom_job(stored: &StoredJob, waiting: &WaitingView) -> CustomJob {
    let mut job = match serde_json::from_str::<CustomJob>(&stored.resource) {
        Ok(r) => render(&r, &stored.job),
        Err(e) => {
            let j = &stored.job;
            let damaged = trainyard_core::Job::damaged(j.id, j.project.clone(), j.region.clone(), j.create_time, j.update_time, &format!("its resource: {e}"));
            render(&CustomJob { display_name: stored.display_name.clone(), ..CustomJob::default() }, &damaged)
        }
    };
    if !job.trainyard_waiting_reason.is_empty() {
        if let Some(reason) = waiting.get(stored.job.id, &stored.job.project) {
            job.trainyard_waiting_reason = reason;
        }
    }
    job
}

/// `HyperparameterTuningJob`: rows read as text (`get_other`/`list_other`: the resource
/// and the study's state) and decoded here; a GET shows the trials, a list does not.
pub enum TuningJobs {}

/// A stored HyperparameterTuningJob: its resource and study, or what is wrong with its
/// record.
pub struct TuningJobRow {
    id: u64,
    project: String,
    region: String,
    record: Result<(HyperparameterTuningJob, Study), String>,
}

impl TuningJobRow {
    fn new(project: &str, region: &str, (id, resource, core): (u64, String, String)) -> TuningJobRow {
        TuningJobRow { id, project: project.to_string(), region: region.to_string(), record: Self::read(id, &resource, &core) }
    }

    fn read(id: u64, resource: &str, core: &str) -> Result<(HyperparameterTuningJob, Study), String> {
        let resource = serde_json::from_str(resource).map_err(|e| format!("record of job {id}: its resource: {e}"))?;
        let study = serde_json::from_str(core).map_err(|e| format!("record of job {id}: {e}"))?;
        Ok((resource, study))
    }
}

impl ResourceKind for TuningJobs {
    const COLLECTION: &'static str = "hyperparameterTuningJobs";
    const STORE_KIND: &'static str = KIND_STUDY;
    const API_NAME: &'static str = "HyperparameterTuningJob";
    type New = HyperparameterTuningJob;
    type Created = Value;
    type Row = TuningJobRow;

    fn parse(body: &[u8]) -> Result<HyperparameterTuningJob, ApiError> {
        checked(body, trainyard_api::parse_hyperparameter_tuning_job, trainyard_api::validate_hyperparameter_tuning_job)
    }

    fn create(project: String, region: String, resource: HyperparameterTuningJob, reply: Reply<Value>) -> Msg {
        Msg::CreateStudy { project, region, resource: Box::new(resource), reply }
    }

    fn cancel(project: String, region: String, id: u64, reply: Reply<()>) -> Msg {
        Msg::CancelStudy { project, region, id, reply }
    }

    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<TuningJobRow>> {
        Ok(store.get_other(KIND_STUDY, project, region, id)?.map(|row| TuningJobRow::new(project, region, row)))
    }

    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<TuningJobRow>> {
        let rows = store.list_other(KIND_STUDY, project, region, page.filter, page.before, page.limit)?;
        Ok(rows.into_iter().map(|row| TuningJobRow::new(project, region, row)).collect())
    }

    fn id(row: &TuningJobRow) -> u64 {
        row.id
    }

    fn live_state(row: &TuningJobRow) -> Option<&'static str> {
        match &row.record {
            Ok((_, study)) if !study.is_terminal() => Some(study.state_name()),
            _ => None,
        }
    }

    fn render(row: &TuningJobRow, _waiting: &WaitingView, view: View) -> Result<Value, ApiError> {
        Ok(match &row.record {
            Ok((resource, study)) => render_study(resource, study, view == View::Get),
            Err(damage) => serde_json::json!({
                "name": Self::name(&row.project, &row.region, row.id),
                "state": "JOB_STATE_FAILED",
                "error": {"code": 13, "message": format!("Internal error: the stored record of this job is damaged and cannot be read ({damage}).")},
            }),
        })
    }
}

/// `TrainingPipeline` (the custom task): rows read as text, as tuning jobs.
pub enum TrainingPipelines {}

/// A stored TrainingPipeline: its resource and state, or what is wrong with its record.
pub struct PipelineRow {
    id: u64,
    project: String,
    region: String,
    record: Result<(trainyard_api::TrainingPipeline, crate::pipeline::Pipeline), String>,
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
    const API_NAME: &'static str = "TrainingPipeline";
    type New = trainyard_api::TrainingPipeline;
    type Created = trainyard_api::TrainingPipeline;
    type Row = PipelineRow;

    fn parse(body: &[u8]) -> Result<trainyard_api::TrainingPipeline, ApiError> {
        checked(body, trainyard_api::parse_training_pipeline, trainyard_api::validate_training_pipeline)
    }

    fn create(project: String, region: String, resource: Self::New, reply: Reply<Self::Created>) -> Msg {
        Msg::CreatePipeline { project, region, resource: Box::new(resource), reply }
    }

    fn cancel(project: String, region: String, id: u64, reply: Reply<()>) -> Msg {
        Msg::CancelPipeline { project, region, id, reply }
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

    /// The names the generic path builds are the ones the driver gives its resources.
    #[test]
    fn names_agree_with_the_driver() {
        assert_eq!(CustomJobs::name("p", "r", 7), crate::driver::job_name("p", "r", 7));
        assert_eq!(TuningJobs::name("p", "r", 7), crate::driver::study_name("p", "r", 7));
    }

    /// Every kind's API name is a schema of the wire types (its `readMask` is checked
    /// against that schema's fields).
    #[test]
    fn api_names_are_schemas() {
        let schemas = trainyard_api::components::component_schemas();
        for name in [CustomJobs::API_NAME, TuningJobs::API_NAME, TrainingPipelines::API_NAME] {
            assert!(schemas.contains_key(name), "{name} is not a schema");
        }
    }

    /// A damaged tuning-job record is shown as FAILED naming the damage, and may be
    /// deleted.
    #[test]
    fn damaged_tuning_job_is_failed_and_deletable() {
        let row = TuningJobRow::new("p", "r", (4, "not json".into(), "{}".into()));
        assert_eq!(TuningJobs::live_state(&row), None);
        let waiting = WaitingView::default();
        let v = TuningJobs::render(&row, &waiting, View::List).expect("render");
        assert_eq!(v["name"], "projects/p/locations/r/hyperparameterTuningJobs/4");
        assert_eq!(v["state"], "JOB_STATE_FAILED");
        assert_eq!(v["error"]["code"], 13);
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("damaged") && message.contains("record of job 4: its resource:"), "{message}");
    }
}
