//! The methods every resource kind has, written once and registered per kind by
//! [`routes`]. For a kind `K` ([`crate::kinds::ResourceKind`]) under
//! `/v1/projects/{project}/locations/{region}/{K::COLLECTION}`:
//!
//! | method | path | answer |
//! | --- | --- | --- |
//! | `POST` | the collection | the created resource (body parsed and validated by `K`) |
//! | `GET` | the collection | a page: `{COLLECTION: [...], nextPageToken}` ([`super::list`]) |
//! | `GET` | `.../{id}` | the resource, with what only a GET shows |
//! | `POST` | `.../{id}:cancel` | `{}` once the driver took the cancel |
//! | `DELETE` | `.../{id}` | the done Operation; 400 FAILED_PRECONDITION while it has not ended |
//!
//! `GET` or `DELETE` of `{id}:verb` is 405 (allowing POST), `POST` of `{id}` is 405 (allowing
//! GET, DELETE), an unknown verb is 404, an id that is not a decimal number is 400 and an id
//! with no row under the project and region is 404 naming the resource.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use trainyard_api::ApiError;

use crate::kinds::{ResourceKind, View};
use super::list::{page, ListQuery};
use super::common::{
    ask, body_bytes, check_content_type, int_enums, json_response, method_not_allowed_response, parse_id, query_error, too_large,
    Alt, ApiResult, AppState,
};
use crate::reply::AppError;
use crate::driver::Msg;

/// The routes of kind `K`: its collection and its resources.
pub fn routes<K: ResourceKind>() -> Router<AppState> {
    let collection = format!("/v1/projects/{{project}}/locations/{{region}}/{}", K::COLLECTION);
    Router::new()
        .route(&collection, get(list::<K>).post(create::<K>))
        .route(&format!("{collection}/{{id}}"), get(get_one::<K>).post(post_one::<K>).delete(delete::<K>))
}

/// The row of `id`, or 404 naming the resource.
pub(super) async fn load<K: ResourceKind>(state: &AppState, project: &str, region: &str, id: u64) -> Result<K::Row, ApiError> {
    let (p, r) = (project.to_string(), region.to_string());
    let found = state.readers.with(move |s| K::read(s, &p, &r, id).map_err(crate::reply::read_failed)).await?;
    let what = format!("{} {id}", K::API_NAME);
    found.filter(|row| crate::kinds::belongs(K::stored_place(row), project, region, &what)).ok_or_else(|| ApiError::not_found(format!("The {} \"{}\" does not exist.", K::API_NAME, K::name(project, region, id))))
}

/// The id and row a `GET` or `DELETE` of `.../{segment}` is about, or the answer when there
/// is none: 405 for `{id}:verb` (which only POST serves), 400 for an id that is not a
/// number, 404 for one without a row.
async fn row_of<K: ResourceKind>(state: &AppState, project: &str, region: &str, segment: &str) -> Result<(u64, K::Row), Response> {
    if segment.contains(':') {
        return Err(method_not_allowed_response("POST"));
    }
    let id = parse_id(segment, K::API_NAME).map_err(answer)?;
    let row = load::<K>(state, project, region, id).await.map_err(answer)?;
    Ok((id, row))
}

/// An error as the response it is answered with.
fn answer(e: ApiError) -> Response {
    AppError(e).into_response()
}

async fn create<K: ResourceKind>(
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
    let resource = K::parse(&body)?;
    let disk = K::on_disk(&resource);
    if !disk.host_directories.is_empty() {
        allow_host_directories(&state, &headers)?;
    }
    // What is looked at on disk is looked at here (the driver's thread never touches a file).
    if !disk.is_empty() {
        let (roots, p) = (std::sync::Arc::clone(&state.job_paths), project.clone());
        tokio::task::spawn_blocking(move || disk.check(&p, &roots))
            .await
            .map_err(|e| ApiError::internal(format!("checking the job's paths: {e}")))??;
    }
    let created = ask(&state, |reply| Msg::Create { project, region, new: K::create(resource, reply) }).await?;
    json_response(created, ints)
}

/// `trainyardHostDirectories` come from the server's own host only: a server without a
/// tokens file answers local clients alone; with one, the token must be allowed
/// (`host_directories = true` in the tokens file).
fn allow_host_directories(state: &AppState, headers: &HeaderMap) -> Result<(), AppError> {
    let Some(tokens) = &state.tokens else { return Ok(()) };
    let auth = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if tokens.current().allows_host_directories(auth) {
        return Ok(());
    }
    Err(AppError(ApiError::permission_denied(
        "trainyardHostDirectories: this token may not mount directories of the server's host into jobs; an administrator \
         allows it with host_directories = true on the token in the tokens file (or create the job without it)",
    )))
}

async fn list<K: ResourceKind>(
    State(state): State<AppState>,
    Path((project, region)): Path<(String, String)>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(query_error)?;
    page::<K>(&state, &project, &region, q).await
}

async fn get_one<K: ResourceKind>(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
    headers: HeaderMap,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let (_, row) = match row_of::<K>(&state, &project, &region, &id).await {
        Ok(found) => found,
        Err(answer) => return Ok(answer),
    };
    let mut shown = K::render(&row, &state.waiting, View::Get)?;
    K::add_links(&row, &mut shown, &crate::reply::base_url(&headers));
    json_response(shown, ints)
}

/// `POST .../{id}:cancel` (the id and the verb are one path segment).
async fn post_one<K: ResourceKind>(
    State(state): State<AppState>,
    Path((project, region, segment)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let Some((id, verb)) = segment.split_once(':') else { return Ok(method_not_allowed_response("GET, DELETE")) };
    if verb != "cancel" {
        return Err(ApiError::not_found(format!("Unknown method \"{verb}\" on a {}.", K::API_NAME)).into());
    }
    let id = parse_id(id, K::API_NAME)?;
    ask(&state, |reply| Msg::Cancel { kind: K::KIND, project, region, id, reply }).await?;
    json_response(serde_json::json!({}), ints)
}

/// `DELETE .../{id}` of a resource that has ended (a damaged record included): its logs
/// and run directories go, outputs under baseOutputDirectory stay; the answer is a done
/// long-running Operation.
async fn delete<K: ResourceKind>(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    Alt(common): Alt,
) -> ApiResult {
    let ints = int_enums(&common)?;
    let (id, row) = match row_of::<K>(&state, &project, &region, &id).await {
        Ok(found) => found,
        Err(answer) => return Ok(answer),
    };
    if let Some(live) = K::live_state(&row) {
        return Err(ApiError::failed_precondition(format!(
            "The {} \"{}\" is in state {live} and cannot be deleted; cancel it first.",
            K::API_NAME,
            K::name(&project, &region, id)
        ))
        .into());
    }
    let body = ask(&state, |reply| Msg::Delete { kind: K::KIND, project, region, id, reply }).await?;
    json_response(body, ints)
}
