//! Which function answers a request of these services: by its HTTP method, its target's
//! collection and verb. Reads run on a read connection ([`read`]), writes on the driver's
//! ([`write`]); [`is_write`] tells them apart.

use serde_json::Value;
use trainyard_api::ApiError;
use trainyard_core::Micros;
use trainyard_store::Store;

use super::ops::{self, Paging, Request};
use super::{metadata, tensorboard};

/// The HTTP methods these services take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Patch,
    Delete,
}

/// Does this request change the store? (A POST that only reads, the export of a time
/// series, does not.)
pub fn is_write(method: Method, req: &Request) -> bool {
    match method {
        Method::Get => false,
        Method::Post => req.target.verb.as_deref() != Some("exportTensorboardTimeSeries"),
        Method::Patch | Method::Delete => true,
    }
}

fn not_allowed(method: Method, req: &Request) -> ApiError {
    let t = &req.target;
    let what = match (&t.id, &t.verb) {
        (_, Some(v)) => format!("{}:{v}", t.name()),
        _ => t.name(),
    };
    ApiError::new(trainyard_api::Code::Unimplemented, format!("{method:?} is not a method of {what}."))
}

/// A request that writes, on the driver's store.
pub fn write(store: &mut Store, method: Method, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let seg = t.coll.segment;
    match (method, t.id.is_some(), t.verb.as_deref()) {
        (Method::Post, false, None) => match seg {
            "tensorboards" => tensorboard::create_tensorboard(store, req, now),
            "timeSeries" => tensorboard::create_time_series(store, req, now),
            _ => ops::create(store, req, now, |_, _| Ok(Vec::new())),
        },
        (Method::Post, false, Some("purge")) if matches!(seg, "contexts" | "artifacts" | "executions") => metadata::purge(store, req, now),
        (Method::Post, false, Some("batchCreate")) if seg == "runs" => tensorboard::batch_create(store, req, now).map(|v| tensorboard::shown_batch(v, req.ints)),
        (Method::Post, true, Some(verb)) => match (seg, verb) {
            ("contexts", "addContextArtifactsAndExecutions") => metadata::add_artifacts_and_executions(store, req, now),
            ("contexts", "addContextChildren") => metadata::add_children(store, req, now),
            ("contexts", "removeContextChildren") => metadata::remove_children(store, req, now),
            ("executions", "addExecutionEvents") => metadata::add_events(store, req, now),
            ("experiments", "batchCreate") => tensorboard::batch_create(store, req, now).map(|v| tensorboard::shown_batch(v, req.ints)),
            ("experiments", "write") => tensorboard::write_experiment(store, req, now),
            ("runs", "write") => tensorboard::write_run(store, req, now),
            _ => Err(ops::no_verb(t, verb)),
        },
        (Method::Post, _, Some(verb)) => Err(ops::no_verb(t, verb)),
        (Method::Patch, true, None) if t.coll.delete != super::Delete::None => ops::update(store, req, now),
        (Method::Delete, true, None) if seg == "contexts" => metadata::delete_context(store, req, now),
        (Method::Delete, true, None) => ops::delete(store, req, now, &[]),
        _ => Err(not_allowed(method, req)),
    }
}

/// A request that reads. `paging` and `token` serve lists and exports.
pub fn read(store: &Store, method: Method, req: &Request, paging: Paging, token: impl FnOnce(i64) -> String) -> Result<Value, ApiError> {
    let t = &req.target;
    let seg = t.coll.segment;
    match (method, t.id.is_some(), t.verb.as_deref()) {
        (Method::Get, false, None) => ops::list(store, req, paging, token),
        (Method::Get, true, None) => ops::get(store, req),
        (Method::Get, true, Some(verb)) => match (seg, verb) {
            ("contexts", "queryContextLineageSubgraph") => metadata::context_lineage(store, req),
            ("executions", "queryExecutionInputsAndOutputs") => metadata::execution_io(store, req),
            ("artifacts", "queryArtifactLineageSubgraph") => metadata::artifact_lineage(store, req),
            ("timeSeries", "read") => tensorboard::read(store, req),
            ("tensorboards", "batchRead") => tensorboard::batch_read(store, req),
            ("tensorboards", "readSize") => tensorboard::read_size(store, req),
            _ => Err(ops::no_verb(t, verb)),
        },
        (Method::Post, true, Some("exportTensorboardTimeSeries")) if seg == "timeSeries" => {
            tensorboard::export(store, req, paging.after.max(0) as usize, token)
        }
        (Method::Get, false, Some(verb)) => Err(ops::no_verb(t, verb)),
        _ => Err(not_allowed(method, req)),
    }
}
