//! What every request passes before the API sees it:
//!
//! - **Tokens**: `/v1/projects/{project}/...` needs a token for the project, `/v1/admin/...`
//!   a `"*"` token ([`crate::auth`]).
//! - **Audit**: every POST, PUT, PATCH and DELETE is logged once it is answered, at target
//!   `audit`, with the token's holder (its `name`, never the token), the method, the path
//!   and the status. User text in log fields is escaped (`"..."` with `\n`, `\u{1b}`), so
//!   that it cannot start a line of its own.

use axum::extract::State;
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

use crate::auth::{Reloaded, TokenStore, TokensError};
use crate::http::{AppError, AppState};

fn is_mutating(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

/// The guard of every request: authentication and the audit line of mutating requests.
pub async fn guard(State(state): State<AppState>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let tokens = state.tokens.as_ref().map(|t| t.current());
    let holder = match &tokens {
        None => "(open mode)".to_string(),
        Some(t) => {
            let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            match (auth, t.holder(auth)) {
                (_, Some(name)) => name.to_string(),
                (None, None) => "(no token)".to_string(),
                (Some(_), None) => "(unknown token)".to_string(),
            }
        }
    };
    let refused = match &tokens {
        None => None,
        Some(t) => authenticate(t, &req).err(),
    };
    let resp = match refused {
        Some(e) => AppError(e).into_response(),
        None => next.run(req).await,
    };
    if is_mutating(&method) {
        tracing::info!(
            target: "audit",
            holder = holder.as_str(),
            method = method.as_str(),
            path = path.as_str(),
            status = resp.status().as_u16(),
            "request"
        );
    }
    resp
}

/// Authentication of `/v1/projects/{project}/...` (a token for the project) and
/// `/v1/admin/...` (a `"*"` token); other paths need none.
fn authenticate(tokens: &crate::auth::Tokens, req: &axum::extract::Request) -> Result<(), ApiError> {
    let path = req.uri().path();
    let project = if path.starts_with("/v1/admin") {
        Some("*")
    } else {
        path.strip_prefix("/v1/projects/").map(|rest| rest.split('/').next().unwrap_or(""))
    };
    let Some(project) = project else { return Ok(()) };
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    tokens.check(auth, project, write).map(|_| ())
}

/// Read the tokens file again and log the outcome; `via` says what asked (SIGHUP, the
/// admin call). On error the tokens in force stay.
pub fn reload_tokens_logged(store: &TokenStore, via: &str) -> Result<Reloaded, TokensError> {
    match store.reload() {
        Ok(r) => {
            tracing::info!(
                "{via}: tokens read again from {}: {} tokens ({} added, {} removed)",
                store.path().display(),
                r.tokens,
                r.added,
                r.removed
            );
            Ok(r)
        }
        Err(e) => {
            tracing::error!("{via}: tokens not changed: {e}");
            Err(e)
        }
    }
}

/// `POST /v1/admin/tokens:reload` (a `"*"` token, checked by [`guard`]): read the tokens
/// file again. A file that cannot be used changes nothing, and the answer says why (400).
pub async fn reload_tokens(State(state): State<AppState>) -> Response {
    let Some(store) = state.tokens.clone() else {
        return AppError(ApiError::failed_precondition(
            "The server runs without a tokens file (open mode, loopback only): there are no tokens to read again.",
        ))
        .into_response();
    };
    let done = tokio::task::spawn_blocking(move || reload_tokens_logged(&store, "POST /v1/admin/tokens:reload")).await;
    let result = match done {
        Ok(Ok(r)) => serde_json::to_string(&r).map_err(|e| ApiError::internal(format!("Cannot show the reload: {e}"))),
        Ok(Err(e)) => Err(ApiError::invalid_argument(format!("Tokens not changed: {e}"))),
        Err(e) => Err(ApiError::internal(format!("The reload did not finish: {e}"))),
    };
    match result {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => AppError(e).into_response(),
    }
}
