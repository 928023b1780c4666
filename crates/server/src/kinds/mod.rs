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
pub mod kind;
pub mod pipelines;
pub mod studies;
pub mod tuning_jobs;
pub mod waiting;

pub use custom_jobs::CustomJobs;
pub use kind::{belongs, place_of, Create, Kind, Page, Reply, ResourceKind, View};
pub use waiting::{Waiting, WaitingView};
pub use pipelines::TrainingPipelines;
pub use tuning_jobs::TuningJobs;

// The names of each kind, by the kind's own constants (an inherent impl of `kind::Kind`:
// the shared room names no kind).
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
