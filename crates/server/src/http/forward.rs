//! A follower's forwarding (see [`crate::cluster`]): the requests that go through the
//! driver are sent to the leader's address and its answer relayed; the rest are served by
//! this server.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

use crate::cluster::View;

/// Requests a follower forwards to the leader: those that go through the driver. Reads
/// of jobs, operations, logs and storage, the console, `/healthz` and `/metrics` are
/// answered by every server.
pub fn needs_leader(method: &Method, path: &str) -> bool {
    const EVERY_SERVER: [&str; 3] = ["/storage/", "/upload/", "/download/"];
    if EVERY_SERVER.iter().any(|p| path.starts_with(p)) || path == "/healthz" || path == "/metrics"
    {
        return false;
    }
    if path.starts_with("/v1/admin/") || path.contains("/studies") {
        return true;
    }
    !(method == Method::GET || method == Method::HEAD)
}

/// Headers of one connection, never passed on.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The forwarder of a follower: the leader's address from the view, one HTTP agent.
pub struct Forwarder {
    view: Arc<View>,
    agent: ureq::Agent,
}

impl Forwarder {
    /// `ca`: the CA the leader's certificate is trusted by (`[tls] auto`'s, shared by the
    /// servers of one data directory); without it, the usual public CAs.
    pub fn new(view: Arc<View>, ca: Option<&std::path::Path>) -> Forwarder {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(certs) = ca.and_then(|ca| std::fs::read(ca).ok()) {
            let certs: Vec<_> = ureq::tls::parse_pem(&certs)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)));
        }
        let agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(3)))
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Forwarder { view, agent }
    }
}

/// The middleware of a follower: requests that need the leader go to it, the rest are
/// served here. Not a follower (`state.forward` is None): everything is served here.
pub async fn forward(
    axum::extract::State(fwd): axum::extract::State<Option<Arc<Forwarder>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(fwd) = fwd else {
        return next.run(req).await;
    };
    if !needs_leader(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let seen = fwd.view.seen();
    // This server took the lease and is starting its driver: never forwarded to itself
    // (the request would wait behind this very router, which stops, and be cut after it
    // was taken), but refused, so that the client knows it was not done.
    if seen.leading {
        return unavailable("This server has just taken the store's lease and is starting to lead. Try again.");
    }
    let Some(leader) = seen.leader else {
        return unavailable(
            "There is no leader now: a server is taking the store's lease over. Try again.",
        );
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, crate::reply::MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return crate::reply::AppError(crate::reply::body_too_large()).into_response(),
    };
    let url = format!(
        "{leader}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let mut out = ureq::http::Request::builder()
        .method(parts.method.clone())
        .uri(&url);
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) && k != header::HOST && k != header::CONTENT_LENGTH {
            out = out.header(k, v);
        }
    }
    let agent = fwd.agent.clone();
    let sent = tokio::task::spawn_blocking(move || -> Result<Response, String> {
        let req = out.body(body.to_vec()).map_err(|e| e.to_string())?;
        let mut resp = agent.run(req).map_err(|e| e.to_string())?;
        let status = StatusCode::from_u16(resp.status().as_u16()).map_err(|e| e.to_string())?;
        let mut headers = axum::http::HeaderMap::new();
        for (k, v) in resp.headers() {
            if HOP_BY_HOP.contains(&k.as_str()) || k == header::CONTENT_LENGTH {
                continue;
            }
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_str().as_bytes()),
                HeaderValue::from_bytes(v.as_bytes()),
            ) {
                headers.append(k, v);
            }
        }
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .map_err(|e| e.to_string())?;
        Ok((status, headers, bytes).into_response())
    })
    .await;
    match sent {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => unavailable(&format!(
            "The leader at {leader} cannot be reached ({e}). If it is gone, a server takes over once its lease expires. Try again."
        )),
        Err(e) => crate::reply::AppError(ApiError::internal(format!("forwarding to the leader failed: {e}"))).into_response(),
    }
}

/// 503 with Retry-After, in the API's error shape.
fn unavailable(message: &str) -> Response {
    crate::reply::AppError(ApiError::unavailable(message.to_string())).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_forward_what_goes_through_the_driver_and_serve_reads() {
        let jobs = "/v1/projects/p/locations/us-central1/customJobs";
        assert!(needs_leader(&Method::POST, jobs));
        assert!(needs_leader(&Method::POST, &format!("{jobs}/3:cancel")));
        assert!(needs_leader(&Method::DELETE, &format!("{jobs}/3")));
        assert!(needs_leader(&Method::GET, "/v1/admin/nodes"));
        assert!(needs_leader(
            &Method::GET,
            "/v1/projects/p/locations/us-central1/studies/1/trials"
        ));
        assert!(!needs_leader(&Method::GET, jobs));
        assert!(!needs_leader(&Method::GET, &format!("{jobs}/3/logs")));
        assert!(!needs_leader(
            &Method::GET,
            "/v1/projects/p/locations/us-central1/operations/4"
        ));
        assert!(!needs_leader(&Method::POST, "/upload/storage/v1/b/bkt/o"));
        assert!(!needs_leader(&Method::GET, "/healthz"));
        assert!(!needs_leader(&Method::GET, "/"));
    }
}
