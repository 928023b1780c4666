//! What every request passes before the API sees it, and what every response carries:
//!
//! - **Open mode** (no tokens file; `serve` then listens on loopback only): only requests
//!   addressed to a loopback name are served (`Host` of `localhost`, `127.x.y.z` or `[::1]`,
//!   with or without a port). A web page that points its own DNS name at 127.0.0.1 (DNS
//!   rebinding) sends its own name as `Host` and gets 403 PERMISSION_DENIED. A request
//!   without a `Host` header (HTTP/1.0) is served: browsers always send one.
//! - **Tokens**: `/v1/projects/{project}/...` needs a token for the project, `/v1/admin/...`
//!   a `"*"` token ([`crate::auth`]).
//! - **Audit**: every POST, PUT, PATCH and DELETE is logged once it is answered, at target
//!   `audit`, with the token's holder (its `name`, never the token), the method, the path
//!   and the status. User text in log fields is escaped (`"..."` with `\n`, `\u{1b}`), so
//!   that it cannot start a line of its own.
//! - **Headers**: a Content-Security-Policy that allows only this server's own script,
//!   style and API (`/console.js`, `/console.css`; no inline script or style), no framing
//!   (`X-Frame-Options: DENY`, `frame-ancestors 'none'`), `X-Content-Type-Options: nosniff`
//!   and `Referrer-Policy: no-referrer`, on every response, errors included.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

use crate::auth::{Reloaded, TokenStore, TokensError};
use crate::reply::AppError;

/// The Content-Security-Policy of every response: the console's own script, style and API
/// calls, nothing else (no inline script or style, no other origin, no framing).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Is `host` (a `Host` header: a name or address, and maybe a port) a loopback name?
/// `localhost`, any `127.x.y.z`, `[::1]` (or an IPv4-mapped loopback), with or without a
/// port; nothing else.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else { return false };
        let Ok(ip) = inside.parse::<Ipv6Addr>() else { return false };
        if !(ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())) {
            return false;
        }
        return match after {
            "" => true,
            p => p.strip_prefix(':').is_some_and(valid_port),
        };
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if port.is_some_and(|p| !valid_port(p)) {
        return false;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost") || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// An empty port (`localhost:`) or a decimal port number.
fn valid_port(p: &str) -> bool {
    p.is_empty() || (p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok())
}

/// A `Host` of one of the managed service's names (with or without a port).
fn is_service_host(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(n, p)| if valid_port(p) { n } else { host });
    name.trim_end_matches('.').to_ascii_lowercase().ends_with(".googleapis.com")
}

/// The loopback check of open mode: the request's `Host` (and the authority of an
/// absolute-form request target), or the 403 that refuses it. On the jobs' listener
/// (loopback only), the managed service's host names pass too: they are what the jobs'
/// clients call, and no web page's name leads there.
pub(crate) fn check_open_mode_host(req: &axum::extract::Request) -> Result<(), ApiError> {
    let jobs = req.extensions().get::<crate::listen::JobsListener>().is_some();
    let mut names = Vec::new();
    if let Some(h) = req.headers().get(header::HOST) {
        names.push(String::from_utf8_lossy(h.as_bytes()).into_owned());
    }
    if let Some(a) = req.uri().authority() {
        names.push(a.as_str().to_string());
    }
    match names.into_iter().find(|n| !is_loopback_host(n) && !(jobs && is_service_host(n))) {
        None => Ok(()),
        Some(name) => {
            let shown: String = name.chars().take(200).collect();
            Err(ApiError::permission_denied(format!(
                "Host {shown:?} is not a loopback name. This server runs without a tokens file (open mode) and \
                 answers only requests addressed to localhost, 127.0.0.1 or [::1]: a web page could otherwise \
                 reach it under its own DNS name (DNS rebinding). Use http://127.0.0.1:PORT/, or start the \
                 server with a tokens file (--tokens) to serve other names."
            )))
        }
    }
}

/// A token bucket per project for mutating requests (`[limits]`
/// `writes_per_second_per_project`, `write_burst_per_project`): a project that sends
/// more is answered 429 with `Retry-After`, and other projects are not slowed.
pub struct WriteLimiter {
    rate: f64,
    burst: f64,
    buckets: std::sync::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

/// Projects whose buckets are kept; past this, full buckets are forgotten.
const MAX_BUCKETS: usize = 10_000;

impl WriteLimiter {
    pub fn new(limits: &crate::config::Limits) -> WriteLimiter {
        WriteLimiter {
            rate: limits.writes_per_second_per_project,
            burst: limits.write_burst_per_project,
            buckets: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Take one write of `project`, or say how long until one is allowed.
    pub fn take(&self, project: &str, now: std::time::Instant) -> Result<(), std::time::Duration> {
        let Ok(mut buckets) = self.buckets.lock() else { return Ok(()) };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(project) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, (tokens, at)| *tokens + now.duration_since(*at).as_secs_f64() * rate < burst);
        }
        let (tokens, at) = buckets.entry(project.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64((1.0 - *tokens) / self.rate))
        }
    }

    /// The 429 for a project over its rate.
    pub(crate) fn refuse(&self, project: &str, wait: std::time::Duration) -> Response {
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        let mut resp = AppError(ApiError::resource_exhausted(format!(
            "Too many requests that change state for project \"{project}\": the limit is {} per second with bursts of {} \
             (limits.writes_per_second_per_project, limits.write_burst_per_project); try again in {secs} s.",
            self.rate, self.burst
        )))
        .into_response();
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// The WebSocket subprotocol of sessions in replicas (`.../exec`, `.../portForward`).
pub const SESSION_PROTOCOL: &str = "trainyard.v1";

/// The request's bearer credential as an `Authorization` value: that header, else (a
/// browser's WebSocket can set no header) a `Sec-WebSocket-Protocol` entry
/// `bearer.<the token in unpadded base64url>` beside [`SESSION_PROTOCOL`], as Kubernetes'
/// API server takes one.
pub(crate) fn authorization_of(headers: &axum::http::HeaderMap) -> Option<String> {
    use base64::Engine as _;
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return Some(v.to_string());
    }
    let protocols = headers.get(header::SEC_WEBSOCKET_PROTOCOL)?.to_str().ok()?;
    protocols.split(',').map(str::trim).find_map(|p| {
        let encoded = p.strip_prefix("bearer.")?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded.trim_end_matches('=')).ok()?;
        Some(format!("Bearer {}", String::from_utf8(token).ok()?))
    })
}

pub(crate) fn is_mutating(method: &Method, path: &str) -> bool {
    (matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE) && !reads_by_post(method, path))
        || enters_a_replica(method, path)
}

/// `GET .../customJobs/{id}/exec` and `.../portForward`, a session in a running replica: a
/// GET (a WebSocket opens with one) that needs a read-write token and is audited and
/// limited as a write.
pub(crate) fn enters_a_replica(method: &Method, path: &str) -> bool {
    *method == Method::GET
        && path.starts_with("/v1/projects/")
        && (path.ends_with("/exec") || path.ends_with("/portForward"))
        && path.contains("/customJobs/")
}

/// The Vizier methods that are POSTs but only read (`studies:lookup`,
/// `trials:listOptimalTrials`): a read-only token may call them, and they are neither
/// throttled nor audited as writes.
fn reads_by_post(method: &Method, path: &str) -> bool {
    *method == Method::POST && (path.ends_with("/studies:lookup") || path.ends_with("/trials:listOptimalTrials"))
}

/// Authentication of `/v1/projects/{project}/...` (a token for the project),
/// `/v1/admin/...` and `/metrics` (a `"*"` token: the metrics show every project's jobs
/// and usage); other paths need none.
pub(crate) fn authenticate(bearer: crate::auth::Bearer<'_>, req: &axum::extract::Request) -> Result<(), ApiError> {
    let path = req.uri().path();
    let project = if path.starts_with("/v1/admin") || path == "/metrics" {
        Some("*")
    } else {
        path.strip_prefix("/v1/projects/").map(|rest| rest.split('/').next().unwrap_or(""))
    };
    let Some(project) = project else { return Ok(()) };
    let write = (!matches!(*req.method(), Method::GET | Method::HEAD) && !reads_by_post(req.method(), path))
        || enters_a_replica(req.method(), path);
    crate::auth::Tokens::check_bearer(bearer, project, write).map(|_| ())
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

#[cfg(test)]
mod tests {
    #[test]
    fn writes_are_limited_per_project() {
        let l = WriteLimiter::new(&crate::config::Limits {
            max_live_jobs_per_project: 10,
            writes_per_second_per_project: 2.0,
            write_burst_per_project: 3.0,
            ..crate::config::Limits::default()
        });
        let t0 = std::time::Instant::now();
        for _ in 0..3 {
            assert!(l.take("a", t0).is_ok());
        }
        let wait = l.take("a", t0).unwrap_err();
        assert!(wait > std::time::Duration::ZERO && wait <= std::time::Duration::from_millis(500), "{wait:?}");
        assert!(l.take("b", t0).is_ok(), "another project has its own bucket");
        // Half a second later one more write of `a` is allowed, not two.
        let t1 = t0 + std::time::Duration::from_millis(500);
        assert!(l.take("a", t1).is_ok());
        assert!(l.take("a", t1).is_err());
    }

    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "localhost:",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:65535",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example",
            "evil-localhost",
            "127.0.0.1.nip.io:8080",
            "10.0.0.1:8080",
            "0.0.0.0:8080",
            "[::]:8080",
            "[::2]",
            "::1",
            "[::1]x",
            "127.0.0.1:99999",
            "127.0.0.1:80:80",
            "localhost:abc",
            "",
            "[::1",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}

