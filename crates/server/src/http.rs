//! The REST API (`/v1/projects/{p}/locations/{l}/customJobs...`). Writes go to the driver
//! thread; reads go to SQLite through a small pool of read connections. Every error, even
//! for a malformed body or an unknown route, is in the API's `{"error": ...}` shape.
//!
//! The resources (CustomJobs, HyperparameterTuningJobs) are kinds ([`kinds`]) served by one
//! set of handlers ([`resources`], with list pages in `list`), registered per kind in
//! [`router`]. This module holds what they share (the state, read connections, errors,
//! `$alt`, request bodies, the driver's replies) and the routes that are not a kind's:
//! a CustomJob's logs, operations, administration, health, the console and the OpenAPI
//! document. The Vizier API's studies and trials have their own handlers ([`vizier`]).

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use trainyard_api::ApiError;

use crate::driver::Msg;
use crate::logs;

mod common;
mod exec;
pub mod forward;
mod guard;
mod list;
pub mod records;
pub mod resources;
pub mod vizier;

use crate::kinds::{CustomJobs, TrainingPipelines, TuningJobs};

pub use crate::reply::{AppError, MAX_BODY};
use crate::reply::{body_too_large, internal};
pub use common::{Alt, AppState, Common, ReadPool};
use common::{
    ask, int_enums, json_response, method_not_allowed_response, parse_id, query_error, too_large,
    ApiResult,
};

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
    let body = state.readers.with(move |s| s.get_operation(&p, &r, id).map_err(crate::reply::read_failed)).await?;
    let body = body.ok_or_else(|| {
        ApiError::not_found(format!("The operation \"projects/{project}/locations/{region}/operations/{op}\" does not exist."))
    })?;
    let v: Value = serde_json::from_str(&body).map_err(internal)?;
    let stored = v["name"].as_str().and_then(crate::kinds::place_of);
    if !crate::kinds::belongs(stored, &project, &region, &format!("operation {id}")) {
        return Err(ApiError::not_found(format!("The operation \"projects/{project}/locations/{region}/operations/{op}\" does not exist.")).into());
    }
    json_response(v, ints)
}

#[derive(Debug, Default, Deserialize)]
pub struct LogQuery {
    follow: Option<bool>,
    replica: Option<String>,
    attempt: Option<u32>,
    /// Only the last N entries (then, with `follow`, what comes).
    tail: Option<usize>,
    /// Only entries at or after this RFC 3339 time.
    since: Option<String>,
}

/// The most entries `tail` keeps.
const MAX_TAIL: usize = 100_000;

/// `GET .../customJobs/{id}/logs`: newline-delimited JSON entries (a Trainyard extension).
/// With `follow=true` the stream goes on until the job is terminal.
async fn job_logs(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    q: Result<Query<LogQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let id = parse_id(&id, "CustomJob")?;
    resources::load::<CustomJobs>(&state, &project, &region, id).await?;
    let sel = logs::Selector { replica: q.replica, attempt: q.attempt };
    let follow = q.follow.unwrap_or(false);
    let since = match &q.since {
        Some(t) => Some(
            trainyard_api::Timestamp::parse_rfc3339(t)
                .map_err(|_| ApiError::invalid_argument(format!("since: {t:?} is not an RFC 3339 time (e.g. 2026-11-30T10:00:00Z)")))?
                .micros(),
        ),
        None => None,
    };
    if q.tail.is_some_and(|n| n > MAX_TAIL) {
        return Err(ApiError::invalid_argument(format!("tail: at most {MAX_TAIL} entries")).into());
    }
    let mut tail = q.tail.map(|n| (n, std::collections::VecDeque::with_capacity(n.min(1024))));
    // A followed stream holds one of its project's (`limits.max_log_streams_per_project`)
    // until it ends.
    let stream_share = match follow {
        true => Some(
            state
                .shares
                .take(crate::shares::Share::LogStreams, &project)
                .map_err(|o| o.api_error())?,
        ),
        false => None,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let readers = Arc::clone(&state.readers);
    let data_dir = state.data_dir.clone();
    tokio::spawn(async move {
        let _stream_share = stream_share;
        let mut cursor = logs::Cursor::default();
        // Followed logs are read again soon after lines came, less often while none do.
        // Reads that found nothing new since the last line: the pause before the next grows.
        let mut idle = 0;
        loop {
            let (sel2, dd, mut cur) = (sel.clone(), data_dir.clone(), std::mem::take(&mut cursor));
            let batch = readers
                .with(move |s| {
                    // Whether the job had ended is read before its lines, so that the lines
                    // written just before its end are sent before the stream stops.
                    let terminal = s.get_job_by_id(id).map_err(crate::reply::read_failed)?.is_none_or(|j| j.job.is_terminal());
                    // One bounded read (READ_BUDGET per file): a long log is sent batch by
                    // batch, never held whole.
                    let e = logs::read_new(s, &dd, id, &sel2, &mut cur).map_err(crate::reply::read_failed)?;
                    Ok((e, terminal, cur))
                })
                .await;
            let Ok((batch, terminal, cur)) = batch else { break };
            cursor = cur;
            let (mut entries, caught_up) = (batch.entries, batch.caught_up);
            if let Some(t) = since {
                entries.retain(|e| e.micros >= t);
            }
            if let Some((n, kept)) = tail.as_mut() {
                // The last N of what is there now; sent once the log is read to its end.
                kept.extend(entries.drain(..));
                while kept.len() > *n {
                    kept.pop_front();
                }
                if caught_up {
                    entries = kept.drain(..).collect();
                    tail = None;
                }
            }
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
            if !caught_up {
                // More to read now.
                idle = 0;
                continue;
            }
            // A client that went away gives its stream (and its project's share) back now,
            // not when the job next writes a line.
            if !follow || terminal || tx.is_closed() {
                break;
            }
            idle += 1;
            tokio::time::sleep(FOLLOW.pause(idle)).await;
        }
    });
    let stream = tokio_stream_from(rx);
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], axum::body::Body::from_stream(stream)).into_response())
}

/// How soon a followed log is read again after lines came, and at most how long it waits
/// while none do.
const FOLLOW: trainyard_core::retry::Backoff =
    trainyard_core::retry::Backoff::of(std::time::Duration::from_millis(10), std::time::Duration::from_millis(250));

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
    let v = ask(&state, |reply| Msg::Admin { req: crate::driver::Admin::Quotas, reply }).await?;
    json_response(with_storage_rows(&state, v).await, false)
}

/// `POST /v1/admin/backup` with `{"to": "/absolute/path.db"}` (a `"*"` token): a consistent
/// copy of the database written on the server's host while the server keeps serving
/// (`trainyard_store::backup`). The target must not exist; its directory must.
async fn backup(State(state): State<AppState>, body: axum::body::Bytes) -> ApiResult {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        to: String,
    }
    let b: Body = serde_json::from_slice(&body).map_err(|e| ApiError::invalid_argument(format!("Invalid JSON payload: {e}. Expected {{\"to\": \"/absolute/path\"}}.")))?;
    let to = PathBuf::from(&b.to);
    let started = std::time::Instant::now();
    // A thread of its own at background priority (a backup of a large database takes
    // seconds of CPU and disk; requests go first), on a read connection of its own.
    let db = state.readers.location().clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("backup".into()).spawn(move || {
        crate::priority::background_thread();
        use trainyard_store::backup::BackupError as E;
        let r = trainyard_store::Store::connect(&db).map_err(|e| ApiError::internal(format!("The backup failed: {e}"))).and_then(|store| {
            store.backup_to(&to).map_err(|e| match e {
                E::Exists(_) => ApiError::already_exists(format!("to: {e}")),
                E::Relative(_) => ApiError::invalid_argument(format!("to: {e}")),
                E::Io { .. } => ApiError::failed_precondition(format!("to: {e}")),
                E::NotSqlite(_) => ApiError::failed_precondition(e.to_string()),
                other => ApiError::internal(format!("The backup failed: {other}")),
            })
        });
        let _ = tx.send(r);
    });
    spawned.map_err(|e| ApiError::unavailable(format!("Cannot start the backup now: {e}")))?;
    let copied = rx.await.map_err(|_| ApiError::internal("The backup did not finish"))??;
    tracing::info!("backup of the database written to {} ({} bytes, {} jobs) in {:.2} s", copied.path.display(), copied.bytes, copied.jobs, started.elapsed().as_secs_f64());
    let mut v = serde_json::to_value(&copied).map_err(|e| ApiError::internal(format!("Cannot show the backup: {e}")))?;
    v["seconds"] = serde_json::json!(started.elapsed().as_secs_f64());
    Ok(([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response())
}

/// `GET /v1/admin/usage?from=&to=&project=`: RFC 3339 times, `from` before `to`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageParams {
    from: Option<String>,
    to: Option<String>,
    project: Option<String>,
}

async fn usage(State(state): State<AppState>, q: Result<Query<UsageParams>, QueryRejection>) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    let time = |name: &str, v: &Option<String>| -> Result<Option<i64>, ApiError> {
        v.as_deref()
            .map(|t| {
                trainyard_api::Timestamp::parse_rfc3339(t)
                    .map(|t| t.micros())
                    .map_err(|_| ApiError::invalid_argument(format!("{name}: {t:?} is not an RFC 3339 time (e.g. 2026-11-30T10:00:00Z)")))
            })
            .transpose()
    };
    let (from, to) = (time("from", &q.from)?, time("to", &q.to)?);
    if let (Some(f), Some(t)) = (from, to) {
        if f >= t {
            return Err(ApiError::invalid_argument(format!(
                "from: {} is not before to ({})",
                q.from.as_deref().unwrap_or_default(),
                q.to.as_deref().unwrap_or_default()
            ))
            .into());
        }
    }
    if q.project.as_deref().is_some_and(str::is_empty) {
        return Err(ApiError::invalid_argument("project: must not be empty".to_string()).into());
    }
    let req = crate::driver::Admin::Usage(crate::driver::UsageQuery { from, to, project: q.project });
    let v = ask(&state, |reply| Msg::Admin { req, reply }).await?;
    json_response(v, false)
}

async fn reload_quotas(State(state): State<AppState>) -> ApiResult {
    let v = ask(&state, |reply| Msg::Admin { req: crate::driver::Admin::ReloadQuotas, reply }).await?;
    json_response(with_storage_rows(&state, v).await, false)
}

/// The quota rows with one `storage_gb` row per project that stores something or has a
/// storage limit: `inUse` and `limit` in GiB, `inUseBytes` and `limitBytes` exactly (the
/// sizes are walked off the driver, see `storage::usage`).
async fn with_storage_rows(state: &AppState, mut v: Value) -> Value {
    let region = state.storage.region_name();
    let rows = state.storage.usage_report().await;
    if let Some(list) = v.get_mut("quotas").and_then(Value::as_array_mut) {
        // GiB with three decimals, or six where that would show a small size as zero.
        let gib = |b: u64| {
            let g = b as f64 / trainyard_core::catalog::GIB as f64;
            if b > 0 && g < 0.001 {
                format!("{g:.6}")
            } else {
                format!("{g:.3}")
            }
        };
        for (project, used, limit) in rows {
            let mut row = serde_json::json!({"project": project, "region": region, "metric": crate::config::STORAGE_QUOTA,
                "inUse": gib(used), "inUseBytes": used.to_string(), "queued": "0"});
            if let Some(l) = limit {
                row["limit"] = Value::String(gib(l));
                row["limitBytes"] = Value::String(l.to_string());
            }
            list.push(row);
        }
    }
    v
}

/// `GET /metrics`: OpenMetrics when asked for, else the Prometheus text format.
/// Rendered on a blocking thread: replicas' cgroup files are read.
async fn metrics_page(State(metrics): State<Arc<crate::metrics::Metrics>>, headers: axum::http::HeaderMap) -> Response {
    if !metrics.enabled() {
        let why = "Metrics are turned off on this server ([metrics] enabled = false in its config).";
        return AppError(ApiError::not_found(why)).into_response();
    }
    let open = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    let rendered = tokio::task::spawn_blocking(move || if open { metrics.render_openmetrics() } else { metrics.render_text() }).await;
    let Ok(body) = rendered else {
        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "rendering the metrics failed; see the server log").into_response();
    };
    let ctype = if open { "application/openmetrics-text; version=1.0.0; charset=utf-8" } else { "text/plain; version=0.0.4; charset=utf-8" };
    (axum::http::StatusCode::OK, [(header::CONTENT_TYPE, ctype)], body).into_response()
}

/// The driver's liveness (not the HTTP layer's): "ok", or 503 with the reason in the
/// API's error shape.
/// `GET /v3/projects/{project}` of Cloud Resource Manager: the SDK asks it for the id of
/// the project it was given (inside a job, `GOOGLE_CLOUD_PROJECT`), taking it for a
/// number. Projects here are named by their ids: the answer names the project as asked.
async fn get_project(Path(project): Path<String>) -> Response {
    let project = serde_json::json!({
        "name": format!("projects/{project}"),
        "projectId": project,
        "displayName": project,
        "state": "ACTIVE",
    });
    axum::Json(project).into_response()
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.health.unavailable() {
        // Several servers: which one this is (`ok (leader, epoch 3)`).
        None => match &state.cluster {
            Some(view) => format!("ok ({})", view.describe(state.forward.is_none())).into_response(),
            None => "ok".into_response(),
        },
        Some(why) => AppError(ApiError::unavailable(format!("Not healthy: {why}."))).into_response(),
    }
}

/// The web console: one page that lists a project's jobs and shows a job's details and
/// logs, through this same REST API. Its script and style are files of their own, so that
/// the Content-Security-Policy allows no inline code ([`crate::security`]); the style
/// elements its terminal (xterm.js) makes carry the page's nonce, new with every answer.
async fn console() -> Response {
    use base64::Engine as _;
    let mut raw = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw));
    if let Err(e) = random {
        return crate::reply::AppError(ApiError::internal(format!("no random bytes for the page's nonce: {e}"))).into_response();
    }
    let nonce = base64::engine::general_purpose::STANDARD.encode(raw);
    let page = include_str!("console.html").replace("{{STYLE_NONCE}}", &nonce);
    let policy = crate::security::CONTENT_SECURITY_POLICY.replace("style-src 'self'", &format!("style-src 'self' 'nonce-{nonce}'"));
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()), (header::CONTENT_SECURITY_POLICY, policy)], page).into_response()
}

/// The console's terminal, xterm.js (vendored with its licence: `vendor/xterm/`).
async fn xterm_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("vendor/xterm/xterm.js")).into_response()
}

async fn xterm_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("vendor/xterm/xterm.css")).into_response()
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


/// The methods a path allows, by its shape.
fn allowed_methods(path: &str) -> &'static str {
    let last = path.rsplit('/').next().unwrap_or("");
    if last.contains(':') {
        "POST"
    } else if path.ends_with("/customJobs") || path.ends_with("/hyperparameterTuningJobs") || path.ends_with("/studies") || path.ends_with("/trials") {
        "GET, POST"
    } else if (path.contains("/customJobs/") || path.contains("/hyperparameterTuningJobs/") || path.contains("/studies/"))
        && !path.ends_with("/logs")
        && !path.contains("/operations/")
    {
        "GET, DELETE"
    } else {
        "GET"
    }
}

/// The collections of `projects.locations` this server serves.
const SERVED: [&str; 7] = ["customJobs", "hyperparameterTuningJobs", "trainingPipelines", "studies", "metadataStores", "tensorboards", "operations"];

/// A URL no route matched: a collection of the managed service that Trainyard does not
/// offer (`datasets`, `models`, `endpoints`, `featurestores`, ...) is 501 UNIMPLEMENTED
/// naming it; anything else is 404.
async fn not_found(uri: axum::http::Uri) -> AppError {
    AppError(unrouted(uri.path()))
}

fn unrouted(path: &str) -> ApiError {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let [version, "projects", _, "locations", _, collection, ..] = parts.as_slice() {
        let collection = collection.split(':').next().unwrap_or(collection);
        if version.starts_with("v1") && !collection.is_empty() && !SERVED.contains(&collection) {
            return ApiError::unimplemented(format!(
                "Trainyard does not offer the managed service's {collection:?} resources; it serves {}.",
                SERVED[..6].join(", ")
            ));
        }
    }
    ApiError::not_found("The requested URL was not found on this server.")
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
        return too_large(body_too_large());
    }
    next.run(req).await
}

pub fn router(state: AppState) -> Router {
    let jobs = "/v1/projects/{project}/locations/{region}/customJobs";
    Router::new()
        .merge(resources::routes::<CustomJobs>())
        .merge(resources::routes::<TuningJobs>())
        .merge(resources::routes::<TrainingPipelines>())
        .merge(vizier::routes())
        .merge(records::routes())
        .route(&format!("{jobs}/{{id}}/logs"), get(job_logs))
        .route(&format!("{jobs}/{{id}}/exec"), get(exec::session::<false>))
        .route(&format!("{jobs}/{{id}}/portForward"), get(exec::session::<true>))
        .route("/v1/projects/{project}/locations/{region}/operations/{op}", get(get_operation))
        .route("/v1/admin/nodes", get(list_nodes))
        .route("/v1/admin/nodes/{node}", get(get_node).post(post_node))
        .route("/v1/admin/quotas", get(list_quotas))
        .route("/v1/admin/quotas:reload", axum::routing::post(reload_quotas))
        .route("/v1/admin/usage", get(usage))
        .route("/v1/admin/tokens:reload", axum::routing::post(guard::reload_tokens))
        .route("/v1/admin/backup", axum::routing::post(backup))
        .route("/v3/projects/{project}", get(get_project))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_page).with_state(state.metrics.clone()))
        .route("/", get(console))
        .route("/console", get(console))
        .route("/console.js", get(console_js))
        .route("/console.css", get(console_css))
        .route("/vendor/xterm.js", get(xterm_js))
        .route("/vendor/xterm.css", get(xterm_css))
        .route("/openapi.json", get(openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(limit_announced_body))
        // Storage after the body limits (uploads are large), before the guard and metrics.
        .merge(crate::storage::routes(state.storage.clone()))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::guard))
        // A follower forwards what needs the driver to the leader, which guards it.
        .layer(axum::middleware::from_fn_with_state(state.forward.clone(), forward::forward))
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), crate::metrics::track_http))
        .with_state(state)
}

/// Serve the API on `listener` until `shutdown` completes, within `limits` (timeouts, a
/// cap on connections; see [`crate::listen`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    mut limits: crate::listen::Limits,
    tls: Option<std::sync::Arc<crate::tls::Tls>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Object uploads may be long: their bodies are only cut when they stall.
    limits.stall_only_prefixes.push(crate::storage::UPLOAD_PREFIX);
    crate::listen::serve(listener, router(state), limits, tls, shutdown).await
}

#[cfg(test)]
mod unrouted_tests {
    use super::unrouted;
    use trainyard_api::Code;

    #[test]
    fn services_that_are_not_offered_are_unimplemented_and_named() {
        for (path, name) in [
            ("/v1/projects/p/locations/us-central1/featurestores/f/entityTypes", "featurestores"),
            ("/v1/projects/p/locations/us-central1/datasets", "datasets"),
            ("/v1beta1/projects/p/locations/us-central1/models:upload", "models"),
            ("/v1/projects/p/locations/us-central1/endpoints/1:predict", "endpoints"),
        ] {
            let e = unrouted(path);
            assert_eq!(e.code, Code::Unimplemented, "{path}");
            assert!(e.message.contains(name), "{path}: {}", e.message);
        }
        for path in ["/v1/projects/p/locations/us-central1/customJobs/1/nothing", "/nothing", "/v1/projects/p"] {
            assert_eq!(unrouted(path).code, Code::NotFound, "{path}");
        }
    }
}
