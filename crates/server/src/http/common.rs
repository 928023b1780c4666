//! What the API's handlers share: the server's state, read connections, the `$alt`
//! parameter, request bodies, JSON answers, the driver's replies and error answers.

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::Query;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use trainyard_api::ApiError;
use trainyard_store::Store;

use super::forward;
use crate::driver::Msg;
use crate::reply::{body_too_large, internal, AppError};

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
    /// Mutating requests per project (`[limits]`).
    pub writes: Arc<crate::security::WriteLimiter>,
    /// Each project's share of connections and streams (`[limits]`).
    pub shares: Arc<crate::shares::Shares>,
    /// What `/metrics` shows; requests are timed into it.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The Cloud Storage endpoint (`/storage/v1`, `/upload/...`, `/download/...`).
    pub storage: Arc<crate::storage::Storage>,
    /// Several servers on one store: the leadership as this server sees it (None: one
    /// server alone).
    pub cluster: Option<Arc<crate::cluster::View>>,
    /// A follower's forwarder to the leader (None: this server runs the driver).
    pub forward: Option<Arc<forward::Forwarder>>,
    /// Sessions in running replicas (`custom-jobs exec`); None on a follower.
    pub exec: Option<Arc<crate::exec::Exec>>,
    /// Where jobs' paths lead, for what a create looks at on disk.
    pub job_paths: Arc<crate::jobspec::PathRoots>,
}

/// Read connections to the store, reused across requests.
pub struct ReadPool {
    location: trainyard_store::Location,
    idle: Mutex<Vec<Store>>,
}

impl ReadPool {
    pub fn new(location: trainyard_store::Location) -> ReadPool {
        ReadPool { location, idle: Mutex::new(Vec::new()) }
    }

    /// Where the store is.
    pub fn location(&self) -> &trainyard_store::Location {
        &self.location
    }

    /// The SQL the store speaks (list filters are compiled to it).
    pub fn dialect(&self) -> trainyard_store::Dialect {
        self.location.dialect()
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
                None => Store::connect(&pool.location).map_err(crate::reply::read_failed)?,
            };
            let r = f(&store);
            if let Ok(mut v) = pool.idle.lock() {
                match &r {
                    // The store could not be read (a database server that restarted or is
                    // out of reach): the idle connections are likely broken as well. New
                    // ones are made for the next readers.
                    Err(e) if e.http_status() == 503 => v.clear(),
                    _ if v.len() < 8 => v.push(store),
                    _ => {}
                }
            }
            r
        })
        .await
        .map_err(|e| ApiError::internal(format!("reader task failed: {e}")))?
    }
}

/// The idle connections are closed on a thread of their own: a PostgreSQL client blocks
/// (and must not be dropped) on the async executor, where the router that holds the pool
/// ends.
impl Drop for ReadPool {
    fn drop(&mut self) {
        let idle = self.idle.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
        if !idle.is_empty() {
            let _ = std::thread::Builder::new().name("close-readers".into()).spawn(move || drop(idle));
        }
    }
}

pub(super) type ApiResult = Result<Response, AppError>;

/// The `$alt` query parameter: `json` (enum names) or `json;enum-encoding=int`.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    #[serde(rename = "$alt")]
    pub(super) alt: Option<String>,
}

/// The common query parameters, with a malformed query answered in the API's error shape.
pub struct Alt(pub Common);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Alt {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<Common>::from_request_parts(parts, state).await.map(|Query(c)| Alt(c)).map_err(query_error)
    }
}

pub(super) fn int_enums(common: &Common) -> Result<bool, ApiError> {
    match common.alt.as_deref() {
        None | Some("json") => Ok(false),
        Some("json;enum-encoding=int") => Ok(true),
        Some(other) => Err(ApiError::invalid_argument(format!(
            "Unsupported $alt value \"{other}\": use \"json\" or \"json;enum-encoding=int\"."
        ))),
    }
}

pub(super) fn json_response(value: impl serde::Serialize, ints: bool) -> ApiResult {
    let mut v = serde_json::to_value(value).map_err(internal)?;
    if ints {
        trainyard_api::encode_enums_as_int(&mut v);
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response())
}

/// A query string that does not fit, in the API's error shape.
pub(super) fn query_error(e: QueryRejection) -> AppError {
    AppError(ApiError::invalid_argument(format!("Invalid query parameters: {}", e.body_text())))
}

pub(super) fn parse_id(text: &str, what: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .map_err(|_| ApiError::invalid_argument(format!("Invalid {what} id \"{text}\": ids are decimal numbers.")))
}

pub(super) async fn ask<T>(state: &AppState, make: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, ApiError>>) -> Msg) -> Result<T, ApiError> {
    if let Some(why) = state.health.unavailable() {
        return Err(ApiError::unavailable(format!("The server cannot take this request now: {why}.")));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    state.tx.send(make(tx)).map_err(|_| ApiError::unavailable("The server is shutting down."))?;
    rx.await.map_err(|_| ApiError::unavailable("The server is shutting down."))?
}

pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(()),
        Some(ct) if ct.trim().to_ascii_lowercase().starts_with("application/json") => Ok(()),
        Some(ct) => Err(ApiError::invalid_argument(format!(
            "Unsupported Content-Type \"{ct}\": send the request body as application/json."
        ))),
    }
}


pub(super) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, AppError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError(body_too_large())
        } else {
            AppError(ApiError::invalid_argument(format!("Cannot read the request body: {e}")))
        }
    })
}

pub(super) fn too_large(e: ApiError) -> Response {
    let body = serde_json::json!({"error": {"code": 413, "message": e.message, "status": "OUT_OF_RANGE"}});
    (StatusCode::PAYLOAD_TOO_LARGE, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// 405 in the error shape, with the methods the resource allows.
pub(super) fn method_not_allowed_response(allow: &str) -> Response {
    let body = serde_json::json!({"error": {"code": 405, "message": format!("This HTTP method is not allowed on this resource; it allows {allow}."), "status": "UNIMPLEMENTED"}});
    (StatusCode::METHOD_NOT_ALLOWED, [(header::CONTENT_TYPE, "application/json".to_string()), (header::ALLOW, allow.to_string())], body.to_string())
        .into_response()
}
