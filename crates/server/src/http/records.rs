//! Vertex ML Metadata (`metadataStores/...`: contexts, artifacts, executions,
//! metadataSchemas) and Vertex TensorBoard (`tensorboards/...`: experiments, runs,
//! timeSeries) under `/v1/projects/{project}/locations/{region}`, every method of both
//! services' REST rules (and so of their gRPC twins). The path is parsed by
//! [`crate::records::target`], the method chosen by [`crate::records::dispatch`]; reads run
//! on the read pool, writes on the driver (committed before they are answered).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::routing::any;
use axum::Router;
use serde_json::Value;
use trainyard_api::ApiError;

use super::common::{ask, body_bytes, check_content_type, int_enums, json_response, ApiResult, AppState, Common};
use super::list::{make_token, page_size, read_token};
use crate::driver::Msg;
use crate::records::dispatch::{self, Method as M};
use crate::records::ops::{Paging, Request};

pub fn routes() -> Router<AppState> {
    let base = "/v1/projects/{project}/locations/{region}";
    Router::new()
        .route(&format!("{base}/metadataStores"), any(top))
        .route(&format!("{base}/metadataStores/{{*rest}}"), any(nested))
        .route(&format!("{base}/tensorboards"), any(top))
        .route(&format!("{base}/tensorboards/{{*rest}}"), any(nested))
}

async fn top(
    State(state): State<AppState>,
    method: Method,
    uri: axum::http::Uri,
    Path((project, region)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let segment = uri.path().rsplit('/').next().unwrap_or("").to_string();
    serve(state, method, project, region, segment, query, headers, body).await
}

async fn nested(
    State(state): State<AppState>,
    method: Method,
    uri: axum::http::Uri,
    Path((project, region, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    // The collection this route matched: the segment after `/locations/{region}/`.
    let root = if uri.path().starts_with(&format!("/v1/projects/{project}/locations/{region}/metadataStores/")) { "metadataStores" } else { "tensorboards" };
    serve(state, method, project, region, format!("{root}/{rest}"), query, headers, body).await
}

/// The query string's pairs, decoded; a malformed one is an error naming it.
fn pairs(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let uri: axum::http::Uri = format!("/?{}", query.unwrap_or("")).parse().map_err(|_| ApiError::invalid_argument("Invalid query parameters."))?;
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri).map(|q| q.0).map_err(|e| ApiError::invalid_argument(format!("Invalid query parameters: {}", e.body_text())))
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    state: AppState,
    method: Method,
    project: String,
    region: String,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let m = match method {
        Method::GET => M::Get,
        Method::POST => M::Post,
        Method::PATCH => M::Patch,
        Method::DELETE => M::Delete,
        _ => return Err(ApiError::new(trainyard_api::Code::Unimplemented, format!("{method} is not a method of these resources.")).into()),
    };
    let target = crate::records::target(&project, &region, &path)?;
    let query = pairs(query.as_deref())?;
    let alt = query.iter().find(|(k, _)| k == "$alt").map(|(_, v)| v.clone());
    let ints = int_enums(&Common { alt })?;
    let bytes = body_bytes(body)?;
    let body = match m {
        M::Post | M::Patch if !bytes.is_empty() => {
            check_content_type(&headers)?;
            serde_json::from_slice::<Value>(&bytes).map_err(|e| ApiError::invalid_argument(format!("Invalid JSON payload received: {e}.")))?
        }
        M::Post | M::Patch => Value::Object(Default::default()),
        _ => Value::Null,
    };
    let req = Request { target, query, body, ints };
    if dispatch::is_write(m, &req) {
        let v = ask(&state, |reply| Msg::Records { method: m, req: Box::new(req), reply }).await?;
        return json_response(v, false);
    }
    // Reads: a list's (or an export's) page is bound to its query by the token.
    let export = m == M::Post;
    let token_text = if export { req.body.get("pageToken").and_then(Value::as_str).map(String::from) } else { req.param("pageToken").map(String::from) };
    let filter = if export { req.body.get("filter").and_then(Value::as_str).unwrap_or("").to_string() } else { req.param("filter").unwrap_or("").to_string() };
    let scope = format!("records|{}|{}|{filter}", req.target.name(), req.target.verb.as_deref().unwrap_or(""));
    let after = match token_text.as_deref() {
        None | Some("") => 0,
        Some(t) => read_token(&state.token_key, &scope, t)? as i64,
    };
    let size = page_size(req.param("pageSize"))?;
    let key = state.token_key.clone();
    let v = state
        .readers
        .with(move |s| dispatch::read(s, m, &req, Paging { after, size }, |seq| make_token(&key, &scope, seq.max(0) as u64)))
        .await?;
    json_response(v, false)
}
