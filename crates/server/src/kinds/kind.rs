//! What every kind shares: the [`ResourceKind`] trait the API and the driver use, the
//! driver's messages for any kind ([`Kind`], [`Create`]), pages and views, and the checks
//! of a resource's place. See the `kinds` module for how a kind is made.

use serde_json::Value;
use trainyard_api::{ApiError, CustomJob, HyperparameterTuningJob, TrainingPipeline};
use trainyard_store::Store;

use super::waiting::WaitingView;

/// Where the driver's answer to a request goes.
pub type Reply<T> = tokio::sync::oneshot::Sender<Result<T, ApiError>>;

/// A kind of resource the driver creates, cancels and deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    CustomJob,
    TuningJob,
    Pipeline,
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

    /// Links in the rendered row (`shown`) that depend on where the client reached the
    /// server (`base`: `http(s)://HOST`), such as a CustomJob's `webAccessUris`.
    fn add_links(_row: &Self::Row, _shown: &mut Value, _base: &str) {}

    /// What of the new resource is looked at on disk at create, before the driver gets it
    /// (its output directory, its host directories: `trainyardHostDirectories`, which only
    /// some callers may ask for).
    fn on_disk(_resource: &Self::New) -> crate::jobspec::OnDisk {
        crate::jobspec::OnDisk::default()
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
    let resource = parse(body).map_err(with_suggestion)?;
    validate(&resource)?;
    Ok(resource)
}

/// A parse error for an unknown value of an enum a person types (an accelerator type, a
/// scheduling strategy), with the nearest valid value when one is near: `... for enum
/// google.cloud.aiplatform.v1.AcceleratorType (did you mean "NVIDIA_TESLA_T4"?)`.
pub fn with_suggestion(mut e: ApiError) -> ApiError {
    use trainyard_api::types::{AcceleratorType, Strategy};
    let Some((_, rest)) = e.message.split_once("unknown value \"") else { return e };
    let Some((value, rest)) = rest.split_once("\" for enum ") else { return e };
    let enum_name = rest.trim_end_matches('.');
    let names: Vec<&str> = if enum_name.starts_with(AcceleratorType::PROTO_NAME) {
        AcceleratorType::ALL.iter().filter(|a| !a.is_unspecified()).map(|a| a.name()).collect()
    } else if enum_name.starts_with(Strategy::PROTO_NAME) {
        Strategy::ALL.iter().filter(|a| !a.is_unspecified()).map(|a| a.name()).collect()
    } else {
        return e;
    };
    let upper = value.to_ascii_uppercase();
    if let Some(c) = trainyard_core::catalog::closest(&upper, names.iter().copied()) {
        let hint = format!(" (did you mean \"{c}\"?)");
        match e.message.strip_suffix('.') {
            Some(m) => e.message = format!("{m}{hint}."),
            None => e.message.push_str(&hint),
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown accelerator type or strategy gets the nearest valid name; a value near
    /// none, or an enum nobody types, is left as it was.
    #[test]
    fn a_misspelt_enum_value_gets_the_nearest_name() {
        let e = trainyard_api::parse_custom_job(br#"{"jobSpec": {"workerPoolSpecs": [{"machineSpec": {"acceleratorType": "NVIDIA_TESLA_T5"}}]}}"#).unwrap_err();
        let m = with_suggestion(e).message;
        assert!(m.contains("unknown value \"NVIDIA_TESLA_T5\"") && m.ends_with("(did you mean \"NVIDIA_TESLA_T4\"?)."), "{m}");
        let e = trainyard_api::parse_custom_job(br#"{"jobSpec": {"scheduling": {"strategy": "SPOTT"}}}"#).unwrap_err();
        assert!(with_suggestion(e).message.contains("(did you mean \"SPOT\"?)"));
        let e = trainyard_api::parse_custom_job(br#"{"jobSpec": {"workerPoolSpecs": [{"machineSpec": {"acceleratorType": "QUANTUM"}}]}}"#).unwrap_err();
        let before = e.message.clone();
        assert_eq!(with_suggestion(e).message, before);
    }
}
