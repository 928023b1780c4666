//! API errors in the AIP-193 shape: `{"error":{"code":400,"message":"...","status":"INVALID_ARGUMENT"}}`.

use std::fmt;

use serde_json::{json, Map, Value};

/// The canonical rpc codes (`google.rpc.Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// Cancelled by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The request is invalid whatever the state of the system.
    InvalidArgument = 3,
    /// A deadline ran out.
    DeadlineExceeded = 4,
    /// The resource does not exist (or must not be revealed).
    NotFound = 5,
    /// The resource exists already.
    AlreadyExists = 6,
    /// Authenticated but not allowed.
    PermissionDenied = 7,
    /// A quota or a limit is exhausted.
    ResourceExhausted = 8,
    /// The system is not in the state the operation needs.
    FailedPrecondition = 9,
    /// Concurrency conflict.
    Aborted = 10,
    /// Past the valid range.
    OutOfRange = 11,
    /// Not implemented.
    Unimplemented = 12,
    /// A bug of the server.
    Internal = 13,
    /// Try again later.
    Unavailable = 14,
    /// Unrecoverable data loss.
    DataLoss = 15,
    /// No valid credentials.
    Unauthenticated = 16,
}

impl Code {
    /// Every code, by number.
    pub const ALL: &'static [Code] = &[
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// `3 (INVALID_ARGUMENT)`: a job error's code as a user reads it.
    pub fn describe_number(n: i64) -> String {
        match i32::try_from(n).ok().and_then(Code::from_number) {
            Some(c) => format!("{n} ({})", c.name()),
            None => n.to_string(),
        }
    }

    /// The HTTP status the REST API answers with.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Ok => 200,
            Code::Cancelled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        }
    }

    /// The status name, e.g. `"INVALID_ARGUMENT"`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The rpc number (as in a job's `error.code`).
    pub fn number(self) -> i32 {
        self as i32
    }

    /// The code with this rpc number.
    pub fn from_number(number: i32) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.number() == number)
    }

    /// The code with this status name.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The rpc code (decides the HTTP status).
    pub code: Code,
    /// Says which field and why.
    pub message: String,
    /// `google.protobuf.Any` details (`ErrorInfo`, `BadRequest`, ...), as JSON.
    pub details: Vec<Value>,
}

impl ApiError {
    /// An error with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// Adds a detail (a JSON `Any` with `@type`).
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.details.push(detail);
        self
    }

    /// 400 INVALID_ARGUMENT.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// 404 NOT_FOUND.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// 409 ALREADY_EXISTS.
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(Code::AlreadyExists, message)
    }

    /// 400 FAILED_PRECONDITION.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }

    /// 429 RESOURCE_EXHAUSTED.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }

    /// 401 UNAUTHENTICATED.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, message)
    }

    /// 403 PERMISSION_DENIED.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, message)
    }

    /// 409 ABORTED.
    pub fn aborted(message: impl Into<String>) -> Self {
        Self::new(Code::Aborted, message)
    }

    /// 400 OUT_OF_RANGE.
    pub fn out_of_range(message: impl Into<String>) -> Self {
        Self::new(Code::OutOfRange, message)
    }

    /// 500 INTERNAL.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// 501 UNIMPLEMENTED.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// 503 UNAVAILABLE.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// The HTTP status of the answer.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The answer body: `{"error":{"code":HTTP,"message":..,"status":"NAME"}}`, with
    /// `details` only when there are some.
    pub fn to_json(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("code".into(), json!(self.code.http_status()));
        inner.insert("message".into(), json!(self.message));
        inner.insert("status".into(), json!(self.code.name()));
        if !self.details.is_empty() {
            inner.insert("details".into(), Value::Array(self.details.clone()));
        }
        let mut outer = Map::new();
        outer.insert("error".into(), Value::Object(inner));
        Value::Object(outer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_http_and_names() {
        let expected = [
            (Code::Ok, 200, "OK", 0),
            (Code::Cancelled, 499, "CANCELLED", 1),
            (Code::InvalidArgument, 400, "INVALID_ARGUMENT", 3),
            (Code::DeadlineExceeded, 504, "DEADLINE_EXCEEDED", 4),
            (Code::NotFound, 404, "NOT_FOUND", 5),
            (Code::AlreadyExists, 409, "ALREADY_EXISTS", 6),
            (Code::PermissionDenied, 403, "PERMISSION_DENIED", 7),
            (Code::ResourceExhausted, 429, "RESOURCE_EXHAUSTED", 8),
            (Code::FailedPrecondition, 400, "FAILED_PRECONDITION", 9),
            (Code::Aborted, 409, "ABORTED", 10),
            (Code::OutOfRange, 400, "OUT_OF_RANGE", 11),
            (Code::Unimplemented, 501, "UNIMPLEMENTED", 12),
            (Code::Internal, 500, "INTERNAL", 13),
            (Code::Unavailable, 503, "UNAVAILABLE", 14),
            (Code::Unauthenticated, 401, "UNAUTHENTICATED", 16),
        ];
        for (code, http, name, number) in expected {
            assert_eq!(code.http_status(), http);
            assert_eq!(code.name(), name);
            assert_eq!(code.number(), number);
            assert_eq!(Code::from_number(number), Some(code));
            assert_eq!(Code::from_name(name), Some(code));
        }
    }

    #[test]
    fn error_body_shape() {
        let e = ApiError::not_found("CustomJob 7 not found.");
        assert_eq!(
            e.to_json(),
            json!({"error": {"code": 404, "message": "CustomJob 7 not found.", "status": "NOT_FOUND"}})
        );
        let e = ApiError::invalid_argument("bad").with_detail(json!({"@type": "x"}));
        assert_eq!(e.to_json()["error"]["details"], json!([{"@type": "x"}]));
        assert_eq!(e.to_string(), "INVALID_ARGUMENT: bad");
        assert_eq!(e.to_status().code, 3);
    }
}
