//! An API error as an HTTP response: the status of its code and its JSON body (AIP-193),
//! for every layer that answers a request (the API, the guard, the metrics page).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

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
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], self.0.to_json().to_string()).into_response();
        // UNAVAILABLE passes by itself (a store that cannot be written now, a server that
        // starts or stops): clients may try again after a second.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        resp
    }
}

/// A read of the store that failed: 503 UNAVAILABLE (with Retry-After) when it may pass
/// by itself (a database server that restarts or cannot be reached), else an internal
/// error.
pub fn read_failed(e: trainyard_store::StoreError) -> ApiError {
    if e.is_transient() {
        tracing::warn!("store read: {e}");
        return ApiError::unavailable(format!("The server cannot read its job store now ({}); try again shortly.", e.reason()));
    }
    internal(e)
}

/// An internal error: logged in full, answered without its detail.
pub fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!("internal error: {e}");
    ApiError::internal("Internal error encountered.")
}

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1024 * 1024;

/// A request body past [`MAX_BODY`].
pub fn body_too_large() -> ApiError {
    ApiError::new(trainyard_api::Code::OutOfRange, format!("The request body is larger than the limit of {MAX_BODY} bytes."))
}

/// `http://HOST` (or `https://` on a TLS connection) of the request, for links in
/// resources (Cloud Storage's selfLink, a CustomJob's webAccessUris).
pub fn base_url(headers: &axum::http::HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).filter(|h| !h.is_empty()).unwrap_or("127.0.0.1");
    let https = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|p| p.eq_ignore_ascii_case("https"));
    format!("{}://{host}", if https { "https" } else { "http" })
}
