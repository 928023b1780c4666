//! Rooms by resource kind: each kind the API serves has a module of its own here with
//! what is pure about it: its state machine, its names, how it is shown, and its
//! implementation of [`ResourceKind`], which both the REST API (`http`) and the driver
//! use. What the driver does with a kind (its effects, committed first) is in
//! `driver/<kind>.rs`.
//!
//! - [`custom_jobs`]: `CustomJob` (its lifecycle is the core's `step`), the waiting
//!   reasons readers see;
//! - [`tuning_jobs`]: `HyperparameterTuningJob` and its study's state machine;
//! - [`pipelines`]: `TrainingPipeline` and its state machine;
//! - [`studies`]: Vizier studies and their state machine.
//!
//! The driver is told of a kind by value ([`Kind`], [`Create`]): `Msg::Create`,
//! `Msg::Cancel` and `Msg::Delete` are one message each for every kind.
//!
//! A kind is a type that implements [`ResourceKind`]: constants for its names (the
//! collection segment of its paths, its key in the store, its name in the API), associated
//! types for what flows through it (a create body after parsing and validation, the
//! driver's answer to a create, a stored row as read), and functions for the parts that
//! differ between kinds:
//! - parse and validate a create body (the wire rules of `trainyard_api`);
//! - its [`Kind`], and the [`Create`] that carries a new one to the driver;
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
//! one line in `http::router` (`.merge(resources::routes::<NewKind>())`). Which routes
//! and status codes every kind gets is described in `http::resources`.

pub mod custom_jobs;
pub mod pipelines;
pub mod studies;
pub mod tuning_jobs;

use serde_json::Value;
use trainyard_api::{ApiError, CustomJob, HyperparameterTuningJob, TrainingPipeline};
use trainyard_store::Store;

pub use custom_jobs::{CustomJobs, WaitingView};
pub use pipelines::TrainingPipelines;
pub use tuning_jobs::TuningJobs;

/// Where the driver's answer to a request goes.
pub type Reply<T> = tokio::sync::oneshot::Sender<Result<T, ApiError>>;

/// A kind of resource the driver creates, cancels and deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    CustomJob,
    TuningJob,
    Pipeline,
}

impl Kind {
    /// Its key in the store's `jobs` table.
    pub fn store_key(self) -> &'static str {
        match self {
            Kind::CustomJob => CustomJobs::STORE_KIND,
            Kind::TuningJob => TuningJobs::STORE_KIND,
            Kind::Pipeline => TrainingPipelines::STORE_KIND,
        }
    }

    /// Its name in the API.
    pub fn api_name(self) -> &'static str {
        match self {
            Kind::CustomJob => CustomJobs::API_NAME,
            Kind::TuningJob => TuningJobs::API_NAME,
            Kind::Pipeline => TrainingPipelines::API_NAME,
        }
    }
}

/// A new resource of some kind (parsed and validated against the wire rules), with where
/// the driver's answer goes.
pub enum Create {
    CustomJob { resource: Box<CustomJob>, reply: Reply<CustomJob> },
    TuningJob { resource: Box<HyperparameterTuningJob>, reply: Reply<Value> },
    Pipeline { resource: Box<TrainingPipeline>, reply: Reply<TrainingPipeline> },
}

impl Create {
    /// Answers it with an error (the driver cannot take it now).
    pub fn refuse(self, e: ApiError) {
        match self {
            Create::CustomJob { reply, .. } => drop(reply.send(Err(e))),
            Create::TuningJob { reply, .. } => drop(reply.send(Err(e))),
            Create::Pipeline { reply, .. } => drop(reply.send(Err(e))),
        }
    }
}

/// Which rows a list page holds: those that pass `filter` (an SQL condition over the
/// columns of `jobs` with its parameters, compiled from the API's filter), newest first,
/// with ids below `before` (the page token's position), at most `limit`.
pub struct Page<'a> {
    pub filter: Option<(&'a str, &'a [trainyard_store::Value])>,
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
    /// Which kind the driver is told of (`Msg::Cancel`, `Msg::Delete`).
    const KIND: Kind;
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
    /// A create of one, with where its answer goes (the driver's `Msg::Create` carries it).
    fn create(resource: Self::New, reply: Reply<Self::Created>) -> Create;

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

    /// The project and region the row's own record names (not the request's): a second
    /// check above the store's filter, so that a row of another project is never shown
    /// (see `http::resources::load`). None for a damaged record.
    fn stored_place(row: &Self::Row) -> Option<(String, String)>;
}

/// The project and region of a resource name `projects/{p}/locations/{r}/...`.
pub fn place_of(name: &str) -> Option<(String, String)> {
    let mut parts = name.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("projects"), Some(p), Some("locations"), Some(r)) if !p.is_empty() && !r.is_empty() => Some((p.to_string(), r.to_string())),
        _ => None,
    }
}

/// Does a row whose record names `stored` belong under `project` and `region`? A row that
/// does not is a defect of the store's filter: said in the server's log, and answered as
/// if there were no such row.
pub fn belongs(stored: Option<(String, String)>, project: &str, region: &str, what: &str) -> bool {
    match stored {
        Some((p, r)) if p != project || r != region => {
            tracing::error!("the store answered a read of {what} under {project}/{region} with a record of {p}/{r}; not shown");
            false
        }
        _ => true,
    }
}

/// A create body parsed by `parse` and checked by `validate` (the wire rules).
pub(crate) fn checked<T>(body: &[u8], parse: fn(&[u8]) -> Result<T, ApiError>, validate: fn(&T) -> Result<(), ApiError>) -> Result<T, ApiError> {
    let resource = parse(body)?;
    validate(&resource)?;
    Ok(resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::custom_jobs::job_name;
    use super::tuning_jobs::{study_name, TuningJobRow};

    /// The names the generic path builds are the ones the driver gives its resources.
    #[test]
    fn names_agree_with_the_driver() {
        assert_eq!(CustomJobs::name("p", "r", 7), job_name("p", "r", 7));
        assert_eq!(TuningJobs::name("p", "r", 7), study_name("p", "r", 7));
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
