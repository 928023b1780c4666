//! The REST API (`/v1/projects/{p}/locations/{l}/customJobs...`). Writes go to the driver
//! thread; reads go to SQLite through a small pool of read connections. Every error, even
//! for a malformed body or an unknown route, is in the API's `{"error": ...}` shape.

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use trainyard_api::{ApiError, CustomJob};
use trainyard_store::{Store, StoredJob};

use crate::driver::{job_name, render, Msg, KIND_CUSTOM, KIND_STUDY};
use crate::logs;

mod list;

use list::{list_page, ListQuery};

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1024 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub tx: Sender<Msg>,
    pub readers: Arc<ReadPool>,
    pub data_dir: PathBuf,
    /// Key of page tokens (kept in the database, so tokens survive a restart).
    pub token_key: Vec<u8>,
    /// Bearer tokens (read again on SIGHUP or `POST /v1/admin/tokens:reload`); None: open
    /// (loopback only, loopback `Host` names only).
    pub tokens: Option<Arc<crate::auth::TokenStore>>,
    /// Waiting reasons of the latest scheduling round (positions move without a write).
    pub waiting: Arc<crate::driver::WaitingView>,
    /// The driver's liveness: `/healthz`, and 503 with the reason while it cannot work.
    pub health: Arc<crate::health::Health>,
}

/// Read connections to the database, reused across requests.
pub struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Store>>,
}

impl ReadPool {
    pub fn new(path: PathBuf) -> ReadPool {
        ReadPool { path, idle: Mutex::new(Vec::new()) }
    }

    /// Run `f` on a read connection, off the async executor.
    pub async fn with<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Store) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let taken = pool.idle.lock().ok().and_then(|mut v| v.pop());
            let store = match taken {
                Some(s) => s,
                None => Store::open(&pool.path).map_err(internal)?,
            };
            let r = f(&store);
            if let Ok(mut v) = pool.idle.lock() {
                if v.len() < 8 {
                    v.push(store);
                }
            }
            r
        })
        .await
        .map_err(|e| ApiError::internal(format!("reader task failed: {e}")))?
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!("internal error: {e}");
    ApiError::internal("Internal error encountered.")
}

/// An API error as an HTTP response.
pub struct AppError(pub ApiError);

impl From<ApiError> for AppError {
    fn from(e: ApiError) -> Self {
        AppError(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, [(header::CONTENT_TYPE, "application/json")], self.0.to_json().to_string()).into_response()
    }
}

type ApiResult = Result<Response, AppError>;

/// The `$alt` query parameter: `json` (enum names) or `json;enum-encoding=int`.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    #[serde(rename = "$alt")]
    alt: Option<String>,
}

/// The common query parameters, with a malformed query answered in the API's error shape.
pub struct Alt(pub Common);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Alt {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<Common>::from_request_parts(parts, state).await.map(|Query(c)| Alt(c)).map_err(query_error)
    }
}

fn int_enums(common: &Common) -> Result<bool, ApiError> {
    match common.alt.as_deref() {
        None | Some("json") => Ok(false),
        Some("json;enum-encoding=int") => Ok(true),
        Some(other) => Err(ApiError::invalid_argument(format!(
            "Unsupported $alt value \"{other}\": use \"json\" or \"json;enum-encoding=int\"."
        ))),
    }
}

fn json_response(value: impl serde::Serialize, ints: bool) -> ApiResult {
    let mut v = serde_json::to_value(value).map_err(internal)?;
    if ints {
        trainyard_api::json::encode_enums_as_int(&mut v);
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response())
}

/// A query string that does not fit, in the API's error shape.
fn query_error(e: QueryRejection) -> AppError {
    AppError(ApiError::invalid_argument(format!("Invalid query parameters: {}", e.body_text())))
}

fn parse_id(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().map_err(|_| {
        ApiError::invalid_argument(format!("Invalid CustomJob id \"{text}\": job ids are decimal numbers."))
    })
}

/// A stored job as the API shows it. A record that cannot be read is shown, not hidden
/// behind an error: its stand-in says FAILED with the damage, under its display name.
fn decode(stored: &StoredJob, waiting: &crate::driver::WaitingView) -> Result<CustomJob, ApiError> {
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
    Ok(job)
}

async fn ask<T>(state: &AppState, make: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, ApiError>>) -> Msg) -> Result<T, ApiError> {
    if let Some(why) = state.health.unavailable() {
        return Err(ApiError::unavailable(format!("The server cannot take this request now: {why}.")));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    state.tx.send(make(tx)).map_err(|_| ApiError::unavailable("The server is shutting down."))?;
    rx.await.map_err(|_| ApiError::unavailable("The server is shutting down."))?
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(()),
        Some(ct) if ct.trim().to_ascii_lowercase().starts_with("application/json") => Ok(()),
        Some(ct) => Err(ApiError::invalid_argument(format!(
            "Unsupported Content-Type \"{ct}\": send the request body as application/json."
        ))),
    }
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, AppError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError(ApiError::new(
                trainyard_api::Code::OutOfRange,
                format!("The request body is larger than the limit of {MAX_BODY} bytes."),
            ))
        } else {
            AppError(ApiError::invalid_argument(format!("Cannot read the request body: {e}")))
        }
    })
}

async fn create_job(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let body = match body_bytes(body) {
        Ok(b) => b,
        Err(AppError(e)) if e.code == trainyard_api::Code::OutOfRange => return Ok(too_large(e)),
        Err(e) => return Err(e),
    };
    check_content_type(&headers)?;
    let job = trainyard_api::parse_custom_job(&body)?;
    trainyard_api::validate_custom_job(&job)?;
    let created = ask(&state, |reply| Msg::Create { project, region, resource: Box::new(job), reply }).await?;
    json_response(created, ints)
}

fn too_large(e: ApiError) -> Response {
    let body = serde_json::json!({"error": {"code": 413, "message": e.message, "status": "OUT_OF_RANGE"}});
    (StatusCode::PAYLOAD_TOO_LARGE, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn list_jobs(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let (p, r) = (project.clone(), region.clone());
    let waiting = Arc::clone(&state.waiting);
    list_page(&state, KIND_CUSTOM, &project, &region, q, "customJobs", move |s, f, before, limit| {
        s.list_jobs(KIND_CUSTOM, &p, &r, f, before, limit)
            .map_err(internal)?
            .iter()
            .map(|sj| Ok((sj.job.id, serde_json::to_value(decode(sj, &waiting)?).map_err(internal)?)))
            .collect()
    })
    .await
}

async fn load(state: &AppState, project: &str, region: &str, id: u64) -> Result<StoredJob, ApiError> {
    let (p, r) = (project.to_string(), region.to_string());
    let found = state.readers.with(move |s| s.get_job(KIND_CUSTOM, &p, &r, id).map_err(internal)).await?;
    found.ok_or_else(|| ApiError::not_found(format!("The CustomJob \"{}\" does not exist.", job_name(project, region, id))))
}

async fn get_job(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if id.contains(':') {
        return Ok(method_not_allowed_response("POST"));
    }
    let id = parse_id(&id)?;
    let stored = load(&state, &project, &region, id).await?;
    json_response(decode(&stored, &state.waiting)?, ints)
}

/// The id of `POST .../{id}:cancel` (the id and the verb are one path segment), or the
/// answer for a segment that is not a cancel.
fn cancel_id(segment: &str, what: &str) -> Result<u64, ApiResult> {
    let Some((id, verb)) = segment.split_once(':') else { return Err(Ok(method_not_allowed_response("GET, DELETE"))) };
    if verb != "cancel" {
        return Err(Err(ApiError::not_found(format!("Unknown method \"{verb}\" on a {what}.")).into()));
    }
    parse_id(id).map_err(|e| Err(e.into()))
}

/// `POST .../customJobs/{id}:cancel`.
async fn post_job(
    State(state): State<AppState>,
    Path((project, region, segment)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = match cancel_id(&segment, "CustomJob") {
        Ok(id) => id,
        Err(answer) => return answer,
    };
    ask(&state, |reply| Msg::Cancel { project, region, id, reply }).await?;
    json_response(serde_json::json!({}), ints)
}

async fn delete_job(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if id.contains(':') {
        return Ok(method_not_allowed_response("POST"));
    }
    let id = parse_id(&id)?;
    let stored = load(&state, &project, &region, id).await?;
    if !stored.job.is_terminal() {
        return Err(ApiError::failed_precondition(format!(
            "The CustomJob \"{}\" is in state {} and cannot be deleted; cancel it first.",
            job_name(&project, &region, id),
            stored.job.state().wire_name()
        ))
        .into());
    }
    delete_terminal(&state, &project, &region, id, "CustomJob", ints).await
}

/// Delete a terminal resource (its logs and run directories go; outputs under
/// baseOutputDirectory stay) and answer with a done long-running Operation.
async fn delete_terminal(state: &AppState, project: &str, region: &str, id: u64, what: &'static str, ints: bool) -> ApiResult {
    let kind = if what == "CustomJob" { KIND_CUSTOM } else { KIND_STUDY };
    let (project, region) = (project.to_string(), region.to_string());
    let body = ask(state, |reply| Msg::Delete { kind, project, region, id, reply }).await?;
    json_response(body, ints)
}

// ---- HyperparameterTuningJobs ----

async fn create_study(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let body = match body_bytes(body) {
        Ok(b) => b,
        Err(AppError(e)) if e.code == trainyard_api::Code::OutOfRange => return Ok(too_large(e)),
        Err(e) => return Err(e),
    };
    check_content_type(&headers)?;
    let job = trainyard_api::parse_hyperparameter_tuning_job(&body)?;
    trainyard_api::validate_hyperparameter_tuning_job(&job)?;
    let created = ask(&state, |reply| Msg::CreateStudy { project, region, resource: Box::new(job), reply }).await?;
    json_response(created, ints)
}

/// A stored HyperparameterTuningJob, or what is wrong with its record.
type StudyRow = Result<(trainyard_api::HyperparameterTuningJob, crate::study::Study), String>;

fn read_study(id: u64, resource: &str, core: &str) -> StudyRow {
    let resource = serde_json::from_str(resource).map_err(|e| format!("record of job {id}: its resource: {e}"))?;
    let st = serde_json::from_str(core).map_err(|e| format!("record of job {id}: {e}"))?;
    Ok((resource, st))
}

/// A study as the API shows it; a record that cannot be read is shown as FAILED with the
/// damage named, never as an error that would hide it (or the rows around it).
fn show_study(project: &str, region: &str, id: u64, row: &StudyRow, with_trials: bool) -> Value {
    match row {
        Ok((resource, st)) => crate::driver::render_study(resource, st, with_trials),
        Err(damage) => serde_json::json!({
            "name": crate::driver::study_name(project, region, id),
            "state": "JOB_STATE_FAILED",
            "error": {"code": 13, "message": format!("Internal error: the stored record of this job is damaged and cannot be read ({damage}).")},
        }),
    }
}

async fn load_study(state: &AppState, project: &str, region: &str, id: u64) -> Result<StudyRow, ApiError> {
    let (p, r) = (project.to_string(), region.to_string());
    let row = state.readers.with(move |s| s.get_other(KIND_STUDY, &p, &r, id).map_err(internal)).await?;
    let (_, resource, core) = row.ok_or_else(|| {
        ApiError::not_found(format!("The HyperparameterTuningJob \"{}\" does not exist.", crate::driver::study_name(project, region, id)))
    })?;
    Ok(read_study(id, &resource, &core))
}

async fn get_study(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if id.contains(':') {
        return Ok(method_not_allowed_response("POST"));
    }
    let id = parse_id(&id)?;
    let row = load_study(&state, &project, &region, id).await?;
    json_response(show_study(&project, &region, id, &row, true), ints)
}

async fn post_study(
    State(state): State<AppState>,
    Path((project, region, segment)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = match cancel_id(&segment, "HyperparameterTuningJob") {
        Ok(id) => id,
        Err(answer) => return answer,
    };
    ask(&state, |reply| Msg::CancelStudy { project, region, id, reply }).await?;
    json_response(serde_json::json!({}), ints)
}

async fn delete_study(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    if id.contains(':') {
        return Ok(method_not_allowed_response("POST"));
    }
    let id = parse_id(&id)?;
    // A damaged record was quarantined (terminal) by the driver and may be deleted.
    if let Ok((_, st)) = load_study(&state, &project, &region, id).await? {
        if !st.is_terminal() {
            return Err(ApiError::failed_precondition(format!(
                "The HyperparameterTuningJob \"{}\" is in state {} and cannot be deleted; cancel it first.",
                crate::driver::study_name(&project, &region, id),
                st.state_name()
            ))
            .into());
        }
    }
    delete_terminal(&state, &project, &region, id, "HyperparameterTuningJob", ints).await
}

async fn list_studies(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let (p, r) = (project.clone(), region.clone());
    list_page(&state, KIND_STUDY, &project, &region, q, "hyperparameterTuningJobs", move |s, f, before, limit| {
        s.list_other(KIND_STUDY, &p, &r, f, before, limit)
            .map_err(internal)?
            .iter()
            .map(|(id, resource, core)| Ok((*id, show_study(&p, &r, *id, &read_study(*id, resource, core), false))))
            .collect()
    })
    .await
}

async fn get_operation(
    State(state): State<AppState>,
    Path((project, region, op)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let id = op
        .parse::<u64>()
        .map_err(|_| ApiError::invalid_argument(format!("Invalid operation id \"{op}\": ids are decimal numbers.")))?;
    let (p, r) = (project.clone(), region.clone());
    let body = state.readers.with(move |s| s.get_operation(&p, &r, id).map_err(internal)).await?;
    let body = body.ok_or_else(|| {
        ApiError::not_found(format!("The operation \"projects/{project}/locations/{region}/operations/{op}\" does not exist."))
    })?;
    let v: Value = serde_json::from_str(&body).map_err(internal)?;
    json_response(v, ints)
}

#[derive(Debug, Default, Deserialize)]
pub struct LogQuery {
    follow: Option<bool>,
    replica: Option<String>,
    attempt: Option<u32>,
}

/// `GET .../customJobs/{id}/logs`: newline-delimited JSON entries (a Trainyard extension).
/// With `follow=true` the stream goes on until the job is terminal.
async fn job_logs(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    q: Result<Query<LogQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let id = parse_id(&id)?;
    load(&state, &project, &region, id).await?;
    let sel = logs::Selector { replica: q.replica, attempt: q.attempt };
    let follow = q.follow.unwrap_or(false);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let readers = Arc::clone(&state.readers);
    let data_dir = state.data_dir.clone();
    tokio::spawn(async move {
        let mut cursor = logs::Cursor::default();
        loop {
            let (sel2, dd, mut cur) = (sel.clone(), data_dir.clone(), std::mem::take(&mut cursor));
            let batch = readers
                .with(move |s| {
                    let mut all = Vec::new();
                    loop {
                        let e = logs::read_new(s, &dd, id, &sel2, &mut cur).map_err(internal)?;
                        if e.is_empty() {
                            break;
                        }
                        all.extend(e);
                    }
                    let terminal = s.get_job_by_id(id).map_err(internal)?.is_none_or(|j| j.job.is_terminal());
                    Ok((all, terminal, cur))
                })
                .await;
            let Ok((entries, terminal, cur)) = batch else { break };
            cursor = cur;
            if !entries.is_empty() {
                let mut text = String::new();
                for e in entries {
                    text.push_str(&serde_json::to_string(&e).unwrap_or_default());
                    text.push('\n');
                }
                if tx.send(Ok(Bytes::from(text))).await.is_err() {
                    break;
                }
            }
            if !follow || terminal {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    });
    let stream = tokio_stream_from(rx);
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], axum::body::Body::from_stream(stream)).into_response())
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn admin(state: &AppState, req: crate::driver::Admin) -> ApiResult {
    let v = ask(state, |reply| Msg::Admin { req, reply }).await?;
    json_response(v, false)
}

async fn list_nodes(State(state): State<AppState>) -> ApiResult {
    admin(&state, crate::driver::Admin::ListNodes).await
}

async fn get_node(State(state): State<AppState>, Path(node): Path<String>) -> ApiResult {
    if node.contains(':') {
        return Ok(method_not_allowed_response("POST"));
    }
    admin(&state, crate::driver::Admin::GetNode(node)).await
}

/// `POST /v1/admin/nodes/{node}:drain` and `:undrain`.
async fn post_node(State(state): State<AppState>, Path(segment): Path<String>) -> ApiResult {
    let Some((node, verb)) = segment.split_once(':') else { return Ok(method_not_allowed_response("GET")) };
    let req = match verb {
        "drain" => crate::driver::Admin::Drain(node.to_string()),
        "undrain" => crate::driver::Admin::Undrain(node.to_string()),
        other => return Err(ApiError::not_found(format!("Unknown method \"{other}\" on a node; use :drain or :undrain.")).into()),
    };
    admin(&state, req).await
}

async fn list_quotas(State(state): State<AppState>) -> ApiResult {
    admin(&state, crate::driver::Admin::Quotas).await
}

async fn reload_quotas(State(state): State<AppState>) -> ApiResult {
    admin(&state, crate::driver::Admin::ReloadQuotas).await
}

/// The driver's liveness (not the HTTP layer's): "ok", or 503 with the reason in the
/// API's error shape.
async fn healthz(State(state): State<AppState>) -> Response {
    match state.health.unavailable() {
        None => "ok".into_response(),
        Some(why) => AppError(ApiError::unavailable(format!("Not healthy: {why}."))).into_response(),
    }
}

/// The web console: one page that lists a project's jobs and shows a job's details and
/// logs, through this same REST API. Its script and style are files of their own, so that
/// the Content-Security-Policy allows no inline code ([`crate::security`]).
async fn console() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("console.html")).into_response()
}

async fn console_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("console.js")).into_response()
}

async fn console_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("console.css")).into_response()
}

/// The OpenAPI 3 document, generated from the wire types.
async fn openapi_json() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| crate::openapi::document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], doc.clone()).into_response()
}

/// 405 in the error shape, with the methods the resource allows.
fn method_not_allowed_response(allow: &str) -> Response {
    let body = serde_json::json!({"error": {"code": 405, "message": format!("This HTTP method is not allowed on this resource; it allows {allow}."), "status": "UNIMPLEMENTED"}});
    (StatusCode::METHOD_NOT_ALLOWED, [(header::CONTENT_TYPE, "application/json".to_string()), (header::ALLOW, allow.to_string())], body.to_string())
        .into_response()
}

/// The methods a path allows, by its shape.
fn allowed_methods(path: &str) -> &'static str {
    let last = path.rsplit('/').next().unwrap_or("");
    if last.contains(':') {
        "POST"
    } else if path.ends_with("/customJobs") {
        "GET, POST"
    } else if path.contains("/customJobs/") && !path.ends_with("/logs") {
        "GET, DELETE"
    } else {
        "GET"
    }
}

async fn not_found() -> AppError {
    AppError(ApiError::not_found("The requested URL was not found on this server."))
}

async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    method_not_allowed_response(allowed_methods(uri.path()))
}

/// Refuse a body announced larger than the limit before reading any of it (413 in the
/// API's error shape); bodies without a length are limited while they are read.
async fn limit_announced_body(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large(ApiError::new(
            trainyard_api::Code::OutOfRange,
            format!("The request body is larger than the limit of {MAX_BODY} bytes."),
        ));
    }
    next.run(req).await
}

pub fn router(state: AppState) -> Router {
    let jobs = "/v1/projects/{project}/locations/{region}/customJobs";
    Router::new()
        .route(jobs, get(list_jobs).post(create_job))
        .route(&format!("{jobs}/{{id}}"), get(get_job).post(post_job).delete(delete_job))
        .route(&format!("{jobs}/{{id}}/logs"), get(job_logs))
        .route("/v1/projects/{project}/locations/{region}/operations/{op}", get(get_operation))
        .route("/v1/projects/{project}/locations/{region}/hyperparameterTuningJobs", get(list_studies).post(create_study))
        .route(
            "/v1/projects/{project}/locations/{region}/hyperparameterTuningJobs/{id}",
            get(get_study).post(post_study).delete(delete_study),
        )
        .route("/v1/admin/nodes", get(list_nodes))
        .route("/v1/admin/nodes/{node}", get(get_node).post(post_node))
        .route("/v1/admin/quotas", get(list_quotas))
        .route("/v1/admin/quotas:reload", axum::routing::post(reload_quotas))
        .route("/v1/admin/tokens:reload", axum::routing::post(crate::security::reload_tokens))
        .route("/healthz", get(healthz))
        .route("/", get(console))
        .route("/console", get(console))
        .route("/console.js", get(console_js))
        .route("/console.css", get(console_css))
        .route("/openapi.json", get(openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(limit_announced_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::security::guard))
        .with_state(state)
}

/// Serve the API on `listener` until `shutdown` completes, within `limits` (timeouts, a
/// cap on connections; see [`crate::listen`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: crate::listen::Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::listen::serve(listener, router(state), limits, shutdown).await
}
