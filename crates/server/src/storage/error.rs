//! Errors in the Cloud Storage JSON API's shape:
//! `{"error": {"code": 400, "message": "...", "errors": [{"message": "...", "domain": "global", "reason": "invalid"}]}}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

use crate::paths::BeneathError;

#[derive(Debug)]
pub struct GcsError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

pub type GcsResult<T> = Result<T, GcsError>;

impl GcsError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> GcsError {
        GcsError { code, reason, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> GcsError {
        GcsError::new(400, "invalid", message)
    }

    pub fn not_found(message: impl Into<String>) -> GcsError {
        GcsError::new(404, "notFound", message)
    }

    pub fn forbidden(message: impl Into<String>) -> GcsError {
        GcsError::new(403, "forbidden", message)
    }

    pub fn conflict(message: impl Into<String>) -> GcsError {
        GcsError::new(409, "conflict", message)
    }

    pub fn precondition(message: impl Into<String>) -> GcsError {
        GcsError::new(412, "conditionNotMet", message)
    }

    pub fn too_large(message: impl Into<String>) -> GcsError {
        GcsError::new(413, "uploadTooLarge", message)
    }

    /// A server-side failure: logged with its detail, answered without it.
    pub fn internal(context: &str, e: impl std::fmt::Display) -> GcsError {
        tracing::error!("storage: {context}: {e}");
        GcsError::new(500, "backendError", format!("Internal error: {context}."))
    }

    /// A file-system failure: a full disk is said so (507, not retried by clients), the
    /// rest is internal.
    pub fn io(context: &str, e: &std::io::Error) -> GcsError {
        match e.raw_os_error() {
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) => {
                tracing::error!("storage: {context}: {e}");
                GcsError::new(507, "insufficientStorage", format!("{context}: the storage root is full."))
            }
            _ => GcsError::internal(context, e),
        }
    }

    pub fn errno(context: &str, e: nix::errno::Errno) -> GcsError {
        GcsError::io(context, &std::io::Error::from(e))
    }

    pub fn beneath(context: &str, e: BeneathError) -> GcsError {
        match e {
            BeneathError::Symlink { at } => GcsError::invalid(format!(
                "{context}: {} is or passes through a symbolic link, which the server does not follow.",
                at.display()
            )),
            BeneathError::Io(e) => GcsError::io(context, &e),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "code": self.code,
            "message": self.message,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
        }})
    }
}

impl From<ApiError> for GcsError {
    /// The token checks of [`crate::auth`], in the storage error shape.
    fn from(e: ApiError) -> GcsError {
        let code = e.http_status();
        let reason = match code {
            401 => "required",
            403 => "forbidden",
            404 => "notFound",
            400 => "invalid",
            429 => "rateLimitExceeded",
            503 => "backendError",
            _ => "backendError",
        };
        GcsError::new(code, reason, e.message)
    }
}

impl IntoResponse for GcsError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json; charset=UTF-8")], self.to_json().to_string()).into_response();
        if self.code == 401 {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"trainyard\""));
        }
        resp
    }
}
