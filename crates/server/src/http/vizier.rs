//! The Vizier API (`google.cloud.aiplatform.v1.VizierService`) under
//! `/v1/projects/{project}/locations/{region}`:
//!
//! | method | path | answer |
//! | --- | --- | --- |
//! | `POST` | `studies` | the created Study (409 for a displayName in use) |
//! | `GET` | `studies` | `{studies, nextPageToken}` |
//! | `POST` | `studies:lookup` | the Study with `displayName` |
//! | `GET`, `DELETE` | `studies/{s}` | the Study; `{}` |
//! | `POST` | `studies/{s}/trials:suggest` | an Operation, done once the trials exist |
//! | `GET`, `POST` | `studies/{s}/trials` | `{trials, nextPageToken}`; the created Trial |
//! | `POST` | `studies/{s}/trials:listOptimalTrials` | `{optimalTrials}` |
//! | `GET`, `DELETE` | `studies/{s}/trials/{t}` | the Trial; `{}` |
//! | `POST` | `studies/{s}/trials/{t}:addTrialMeasurement`, `:complete`, `:stop` | the Trial |
//! | `POST` | `studies/{s}/trials/{t}:checkTrialEarlyStoppingState` | a done Operation (`shouldStop`) |
//! | `GET` | `studies/{s}/operations/{o}`, `studies/{s}/trials/{t}/operations/{o}` | the Operation |
//!
//! Writes go to the driver (committed before they are answered); reads go to the store's
//! read connections. A suggest request is answered with its Operation done when the
//! optimiser finishes within [`SUGGEST_WAIT`], else with the Operation not done yet
//! (clients poll it, as they do the managed service's).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use trainyard_api::vizier as wire;
use trainyard_api::ApiError;

use super::list::{make_token, page_size, read_token};
use super::common::{ask, body_bytes, check_content_type, int_enums, json_response, parse_id, query_error, Alt, ApiResult, AppState};
use crate::reply::{internal, AppError};
use crate::driver::{read_vizier_study, render_vizier_study, Msg, VizierCall, VizierOp, KIND_VIZIER};
use crate::kinds::studies::{study_name, VizierStudy};

/// How long a suggest request waits for its Operation to be done before it is answered
/// with the Operation as it is.
pub const SUGGEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub fn routes() -> Router<AppState> {
    let base = "/v1/projects/{project}/locations/{region}";
    Router::new()
        .route(&format!("{base}/studies"), get(list_studies).post(create_study))
        .route(&format!("{base}/studies:lookup"), post(lookup_study))
        .route(&format!("{base}/studies/{{study}}"), get(get_study).delete(delete_study))
        .route(&format!("{base}/studies/{{study}}/trials"), get(list_trials).post(create_trial))
        .route(&format!("{base}/studies/{{study}}/trials:suggest"), post(suggest))
        .route(&format!("{base}/studies/{{study}}/trials:listOptimalTrials"), post(optimal_trials))
        .route(&format!("{base}/studies/{{study}}/trials/{{trial}}"), get(get_trial).delete(delete_trial).post(trial_verb))
        .route(&format!("{base}/studies/{{study}}/operations/{{op}}"), get(study_operation))
        .route(&format!("{base}/studies/{{study}}/trials/{{trial}}/operations/{{op}}"), get(trial_operation))
}

/// A request body, parsed with the service's error text (`root` names it in errors).
fn body<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: Result<Bytes, BytesRejection>, root: &str) -> Result<T, AppError> {
    let bytes = body_bytes(body)?;
    check_content_type(headers)?;
    Ok(trainyard_api::json::from_body(&bytes, root)?)
}

async fn write(state: &AppState, project: String, region: String, op: VizierOp) -> Result<crate::driver::VizierAnswer, ApiError> {
    let call = Box::new(VizierCall { project, region, op });
    ask(state, |reply| Msg::Vizier { call, reply }).await
}

/// The stored row of study `id` under its parent, or 404.
async fn row(state: &AppState, project: &str, region: &str, id: u64) -> Result<(String, String), ApiError> {
    let (p, r) = (project.to_string(), region.to_string());
    let found = state.readers.with(move |s| s.get_other(KIND_VIZIER, &p, &r, id).map_err(crate::reply::read_failed)).await?;
    let (_, resource, core) = found.ok_or_else(|| ApiError::not_found(format!("The Study \"{}\" does not exist.", study_name(project, region, id))))?;
    Ok((resource, core))
}

/// Study `id` read, or 404, or an internal error naming the damage of its record.
async fn study(state: &AppState, project: &str, region: &str, id: u64) -> Result<(wire::Study, crate::kinds::studies::Engine, VizierStudy), ApiError> {
    let (resource, core) = row(state, project, region, id).await?;
    let (resource, engine, st) = read_vizier_study(id, &resource, &core).map_err(damaged)?;
    // A second check above the store: the record's own project and region.
    if !crate::kinds::belongs(Some((st.project.clone(), st.region.clone())), project, region, &format!("study {id}")) {
        return Err(ApiError::not_found(format!("The Study \"{}\" does not exist.", study_name(project, region, id))));
    }
    Ok((resource, engine, st))
}

fn damaged(damage: String) -> ApiError {
    ApiError::internal(format!("Internal error: the stored record of this study is damaged and cannot be read ({damage}); delete the study."))
}

fn trial_id(text: &str) -> Result<u64, ApiError> {
    parse_id(text, "Trial")
}

async fn create_study(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let bytes = body_bytes(raw)?;
    check_content_type(&headers)?;
    let study = trainyard_api::parse_study(&bytes)?;
    let answer = write(&state, project, region, VizierOp::CreateStudy(Box::new(study))).await?;
    vizier_json(answer.body, ints)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageQuery {
    #[serde(rename = "$alt")]
    alt: Option<String>,
    page_size: Option<String>,
    page_token: Option<String>,
}

async fn list_studies(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let ints = int_enums(&super::common::Common { alt: q.alt.clone() })?;
    let size = page_size(q.page_size.as_deref())?;
    let scope = format!("{KIND_VIZIER}|{project}|{region}");
    let before = match q.page_token.as_deref() {
        None | Some("") => None,
        Some(t) => Some(read_token(&state.token_key, &scope, t)?),
    };
    let (p, r) = (project.clone(), region.clone());
    let rows = state.readers.with(move |s| s.list_other(KIND_VIZIER, &p, &r, None, before, size + 1).map_err(crate::reply::read_failed)).await?;
    let more = rows.len() > size;
    let mut studies = Vec::new();
    let mut last = None;
    for (id, resource, core) in rows.into_iter().take(size) {
        last = Some(id);
        let study = render_vizier_study(id, &resource, &core).unwrap_or_else(|damage| {
            // Shown, not hidden: a record that cannot be read is listed as INACTIVE.
            serde_json::json!({"name": study_name(&project, &region, id), "state": "INACTIVE", "inactiveReason": damaged(damage).message})
        });
        // The name rendered from the record's own state, as `study` checks it for a get.
        let stored = study["name"].as_str().and_then(crate::kinds::place_of);
        if crate::kinds::belongs(stored, &project, &region, &format!("study {id}")) {
            studies.push(study);
        }
    }
    let mut resp = serde_json::Map::new();
    if !studies.is_empty() {
        resp.insert("studies".into(), Value::Array(studies));
    }
    if let (true, Some(last)) = (more, last) {
        resp.insert("nextPageToken".into(), Value::String(make_token(&state.token_key, &scope, last)));
    }
    vizier_json(Value::Object(resp), ints)
}

async fn lookup_study(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let req: wire::LookupStudyRequest = body(&headers, raw, "lookup_study_request")?;
    if req.display_name.is_empty() {
        return Err(ApiError::invalid_argument("displayName is required.").into());
    }
    let (p, r, name) = (project.clone(), region.clone(), req.display_name.clone());
    let found = state.readers.with(move |s| s.find_other_by_name(KIND_VIZIER, &p, &r, &name).map_err(crate::reply::read_failed)).await?;
    let Some((id, resource, core)) = found else {
        return Err(ApiError::not_found(format!(
            "No study with displayName \"{}\" in projects/{project}/locations/{region}.",
            req.display_name
        ))
        .into());
    };
    vizier_json(render_vizier_study(id, &resource, &core).map_err(damaged)?, ints)
}

async fn get_study(State(state): State<AppState>, Path((project, region, id)): Path<(String, String, String)>, Alt(common): Alt) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let (resource, core) = row(&state, &project, &region, id).await?;
    vizier_json(render_vizier_study(id, &resource, &core).map_err(damaged)?, ints)
}

async fn delete_study(State(state): State<AppState>, Path((project, region, id)): Path<(String, String, String)>, Alt(common): Alt) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let answer = write(&state, project, region, VizierOp::DeleteStudy(id)).await?;
    vizier_json(answer.body, ints)
}

async fn suggest(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let req: wire::SuggestTrialsRequest = body(&headers, raw, "suggest_trials_request")?;
    let op = VizierOp::Suggest { study: id, request: Box::new(req) };
    let answer = write(&state, project, region, op).await?;
    let body = match answer.done {
        // Done within the wait (the usual case): the done Operation, which saves the
        // client a poll; else the Operation as stored, which the client polls.
        Some(done) => match tokio::time::timeout(SUGGEST_WAIT, done).await {
            Ok(Ok(body)) => body,
            _ => answer.body,
        },
        None => answer.body,
    };
    vizier_json(body, ints)
}

async fn list_trials(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let ints = int_enums(&super::common::Common { alt: q.alt.clone() })?;
    let id = parse_id(&id, "Study")?;
    let size = page_size(q.page_size.as_deref())?;
    let scope = format!("{KIND_VIZIER}-trials|{project}|{region}|{id}");
    let after = match q.page_token.as_deref() {
        None | Some("") => None,
        Some(t) => Some(read_token(&state.token_key, &scope, t)?),
    };
    let (_, _, st) = study(&state, &project, &region, id).await?;
    let trials: Vec<_> = st.trials.iter().filter(|t| after.is_none_or(|a| t.id > a)).take(size + 1).collect();
    let more = trials.len() > size;
    let page: Vec<_> = trials.iter().take(size).map(|t| st.render_trial(t)).collect();
    let next = match (more, trials.get(size.saturating_sub(1))) {
        (true, Some(last)) => make_token(&state.token_key, &scope, last.id),
        _ => String::new(),
    };
    vizier_json(wire::ListTrialsResponse { trials: page, next_page_token: next }, ints)
}

async fn create_trial(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let trial: trainyard_api::Trial = body(&headers, raw, "trial")?;
    let answer = write(&state, project, region, VizierOp::CreateTrial { study: id, trial: Box::new(trial) }).await?;
    vizier_json(answer.body, ints)
}

async fn optimal_trials(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let _: wire::NameOnlyRequest = body(&headers, raw, "list_optimal_trials_request")?;
    let (_, engine, st) = study(&state, &project, &region, id).await?;
    let optimal = st.render_trials(&st.optimal(&engine));
    vizier_json(wire::ListOptimalTrialsResponse { optimal_trials: optimal }, ints)
}

async fn get_trial(
    State(state): State<AppState>,
    Path((project, region, id, trial)): Path<(String, String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if trial.contains(':') {
        // `{trial}:verb` is served by POST only.
        return Ok(super::common::method_not_allowed_response("POST"));
    }
    let id = parse_id(&id, "Study")?;
    let trial = trial_id(&trial)?;
    let (_, _, st) = study(&state, &project, &region, id).await?;
    vizier_json(st.render_trial(st.trial(trial)?), ints)
}

async fn delete_trial(
    State(state): State<AppState>,
    Path((project, region, id, trial)): Path<(String, String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if trial.contains(':') {
        // `{trial}:verb` is served by POST only.
        return Ok(super::common::method_not_allowed_response("POST"));
    }
    let id = parse_id(&id, "Study")?;
    let trial = trial_id(&trial)?;
    let answer = write(&state, project, region, VizierOp::DeleteTrial { study: id, trial }).await?;
    vizier_json(answer.body, ints)
}

/// `POST .../trials/{trial}:verb` (the id and the verb are one path segment).
async fn trial_verb(
    State(state): State<AppState>,
    Path((project, region, id, segment)): Path<(String, String, String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = parse_id(&id, "Study")?;
    let Some((trial, verb)) = segment.split_once(':') else { return Ok(super::common::method_not_allowed_response("GET, DELETE")) };
    let trial = trial_id(trial)?;
    let op = match verb {
        "addTrialMeasurement" => {
            let req: wire::AddTrialMeasurementRequest = body(&headers, raw, "add_trial_measurement_request")?;
            let Some(measurement) = req.measurement else {
                return Err(ApiError::invalid_argument("measurement is required.").into());
            };
            VizierOp::Measure { study: id, trial, measurement: Box::new(measurement) }
        }
        "complete" => {
            let req: wire::CompleteTrialRequest = body(&headers, raw, "complete_trial_request")?;
            VizierOp::Complete { study: id, trial, request: Box::new(req) }
        }
        "stop" => {
            let _: wire::NameOnlyRequest = body(&headers, raw, "stop_trial_request")?;
            VizierOp::Stop { study: id, trial }
        }
        "checkTrialEarlyStoppingState" => {
            let _: wire::NameOnlyRequest = body(&headers, raw, "check_trial_early_stopping_state_request")?;
            VizierOp::CheckEarlyStopping { study: id, trial }
        }
        other => {
            return Err(ApiError::not_found(format!(
                "Unknown method \"{other}\" on a Trial; use :addTrialMeasurement, :complete, :stop or :checkTrialEarlyStoppingState."
            ))
            .into())
        }
    };
    let answer = write(&state, project, region, op).await?;
    vizier_json(answer.body, ints)
}

/// An Operation of the study (or of one of its trials) by its full name.
async fn operation(state: &AppState, project: String, region: String, op: &str, name: String, ints: bool) -> ApiResult {
    let id = parse_id(op, "operation")?;
    let (p, r) = (project.clone(), region.clone());
    let body = state.readers.with(move |s| s.get_operation(&p, &r, id).map_err(crate::reply::read_failed)).await?;
    let v: Option<Value> = body.map(|b| serde_json::from_str(&b)).transpose().map_err(internal)?;
    // The operation must be the one of this study or trial, not another with the same id.
    match v.filter(|v| v["name"] == name.as_str()) {
        Some(v) => vizier_json(v, ints),
        None => Err(ApiError::not_found(format!("The operation \"{name}\" does not exist.")).into()),
    }
}

async fn study_operation(
    State(state): State<AppState>,
    Path((project, region, id, op)): Path<(String, String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let name = format!("projects/{project}/locations/{region}/studies/{id}/operations/{op}");
    operation(&state, project, region, &op, name, ints).await
}

async fn trial_operation(
    State(state): State<AppState>,
    Path((project, region, id, trial, op)): Path<(String, String, String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let name = format!("projects/{project}/locations/{region}/studies/{id}/trials/{trial}/operations/{op}");
    operation(&state, project, region, &op, name, ints).await
}

/// A Vizier answer as JSON. With `$alt=json;enum-encoding=int` its enums are numbers: the
/// API's own rules (`trainyard_api::encode_enums_as_int`) cover the study spec and the
/// `trials` of a list, and [`vizier_enums`] what only this API has.
fn vizier_json(value: impl serde::Serialize, ints: bool) -> ApiResult {
    let mut v = serde_json::to_value(value).map_err(internal)?;
    if ints {
        trainyard_api::encode_enums_as_int(&mut v);
        vizier_enums(&mut v);
    }
    json_response(v, false)
}

/// `state` of a Study (`Study.State`, whose ACTIVE is 1) and of a Trial (`Trial.State`,
/// whose ACTIVE is 2), told apart by the object (a study has a `studySpec`, a trial's name
/// has `/trials/`), and a suggest response's `studyState`, anywhere in an answer
/// (operations' responses included). Parameter values and metadata are left alone.
fn vizier_enums(value: &mut Value) {
    fn number<E: trainyard_api::ProtoEnum>(v: &mut Value) {
        if let Some(e) = v.as_str().and_then(|name| E::from_name(name).ok()) {
            *v = Value::from(e.number());
        }
    }
    match value {
        Value::Object(m) => {
            let study = m.contains_key("studySpec");
            let trial = m.get("name").and_then(Value::as_str).is_some_and(|n| n.contains("/trials/") && !n.contains("/operations/"));
            for (key, child) in m.iter_mut() {
                match key.as_str() {
                    "state" if study => number::<wire::StudyState>(child),
                    "state" if trial => number::<trainyard_api::TrialState>(child),
                    "studyState" => number::<wire::StudyState>(child),
                    "studySpec" | "parameters" | "metadata" | "measurements" | "finalMeasurement" => {}
                    _ => vizier_enums(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(vizier_enums),
        _ => {}
    }
}
