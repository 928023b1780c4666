//! The guard of every request (the open-mode `Host` check, authentication, write limits,
//! the audit line and the security headers: see [`crate::security`]) and the tokens'
//! reload, as the API's middleware and handler.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

use super::common::AppState;
use crate::reply::AppError;
use crate::security::{authenticate, check_open_mode_host, is_mutating, reload_tokens_logged, CONTENT_SECURITY_POLICY};

/// The guard of every request: the open-mode `Host` check, authentication, the audit line
/// of mutating requests and the security headers of every response.
pub async fn guard(State(state): State<AppState>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let tokens = state.tokens.as_ref().map(|t| t.current());
    // The token is looked up once: its holder, its check and whose share it counts in.
    let auth = crate::security::authorization_of(req.headers());
    let bearer = tokens.as_ref().map(|t| t.lookup(auth.as_deref()));
    let holder = holder_of(bearer.as_ref(), auth.is_some());
    let projects = bearer.as_ref().and_then(|b| b.projects()).map(<[String]>::to_vec);
    let refused = match bearer {
        None => check_open_mode_host(&req).err(),
        Some(b) => authenticate(b, &req).err(),
    };
    let project = path.strip_prefix("/v1/projects/").and_then(|rest| rest.split('/').next()).unwrap_or("").to_string();
    let over_share = match &refused {
        None => counted_for(&project, projects.as_deref()).and_then(|whose| {
            let conn = req
                .extensions()
                .get::<std::sync::Arc<crate::shares::ConnectionShare>>()?;
            conn.claim(&state.shares, &whose).err()
        }),
        Some(_) => None,
    };
    let throttled = match (&refused, is_mutating(&method, &path) && !project.is_empty()) {
        (None, true) if over_share.is_none() => {
            state.writes.take(&project, std::time::Instant::now()).err()
        }
        _ => None,
    };
    let mut resp = match (refused, over_share, throttled) {
        (Some(e), _, _) => AppError(e).into_response(),
        (None, Some(over), _) => over.response(),
        (None, None, Some(wait)) => state.writes.refuse(&project, wait),
        (None, None, None) => next.run(req).await,
    };
    if is_mutating(&method, &path) {
        tracing::info!(
            target: "audit",
            holder = holder.as_str(),
            method = method.as_str(),
            path = path.as_str(),
            status = resp.status().as_u16(),
            "request"
        );
    }
    let h = resp.headers_mut();
    // The console's page sets its own (with the nonce of its terminal's styles).
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    resp
}

/// Who made a request, as audit lines name it: the token's holder, or why there is none.
pub(super) fn holder_of(bearer: Option<&crate::auth::Bearer<'_>>, sent_one: bool) -> String {
    match bearer {
        None => "(open mode)".to_string(),
        Some(b) => match (sent_one, b.holder()) {
            (_, Some(name)) => name.to_string(),
            (false, None) => "(no token)".to_string(),
            (true, None) => "(unknown token)".to_string(),
        },
    }
}

/// Whom a request's connection is counted for ([`crate::shares`]): the project of its path,
/// else (storage's paths) the projects of its token; nobody for an administrator's token,
/// for paths of no project in open mode, and for requests without a known token.
fn counted_for(project: &str, projects: Option<&[String]>) -> Option<String> {
    if projects.is_some_and(|p| p.iter().any(|p| p == "*")) {
        return None;
    }
    if !project.is_empty() {
        return Some(project.to_string());
    }
    projects.filter(|p| !p.is_empty()).map(|p| p.join(","))
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
