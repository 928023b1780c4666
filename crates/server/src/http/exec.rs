//! `GET .../customJobs/{id}/exec` (a WebSocket): a session in one of a running job's
//! replicas ([`crate::exec`]; the protocol is [`trainyard_api::exec`]), and
//! `GET .../customJobs/{id}/portForward?port=N`: one connection to a port of the replica's
//! loopback, its bytes on the same channels (`custom-jobs port-forward`). The guard asks a
//! read-write token of the job's project and audits the request as a write
//! ([`crate::security::enters_a_replica`]); this handler checks the rest, in this order:
//! a page of another site (`Origin`), the query, the job (404 for another project's), the
//! replica (404 naming the job's), its state (FAILED_PRECONDITION naming the job's), the
//! WebSocket upgrade, the project's share of sessions (429), and entering the replica.

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use trainyard_api::exec::{Size, DEFAULT_REPLICA};
use trainyard_api::ApiError;
use trainyard_core::job::ReplicaState;

use super::common::{parse_id, AppState};
use crate::kinds::CustomJobs;
use crate::reply::AppError;

/// The most arguments, and bytes of them, a session's command may have.
const MAX_ARGS: usize = 4096;
const MAX_ARG_BYTES: usize = 128 * 1024;

/// What the query asks.
#[derive(Debug, Default, PartialEq)]
struct Ask {
    replica: Option<String>,
    command: Vec<String>,
    tty: bool,
    cols: Option<u32>,
    rows: Option<u32>,
    term: Option<String>,
    /// `portForward`: the replica's port.
    port: Option<u16>,
}

/// Which of the two a request is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exec,
    PortForward,
}

/// `.../exec` (`PORT_FORWARD` false) and `.../portForward` (true).
pub async fn session<const PORT_FORWARD: bool>(
    State(state): State<AppState>,
    Path((project, region, id)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let kind = if PORT_FORWARD { Kind::PortForward } else { Kind::Exec };
    match open(state, kind, project, region, id, query, headers, upgrade).await {
        Ok(r) => r,
        Err(e) => AppError(e).into_response(),
    }
}

#[allow(clippy::too_many_arguments)]
async fn open(
    state: AppState,
    kind: Kind,
    project: String,
    region: String,
    id: String,
    query: Option<String>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    same_origin(&headers)?;
    let ask = parse_query(query.as_deref().unwrap_or(""), kind)?;
    let id = parse_id(&id, "CustomJob")?;
    let stored = super::resources::load::<CustomJobs>(&state, &project, &region, id).await?;
    let Some(exec) = state.exec.clone() else {
        return Err(ApiError::failed_precondition(
            "This server follows another (several servers on one store): sessions in replicas are opened on the leader, whose address `trainyard serve` printed.",
        ));
    };
    let name = ask.replica.clone().unwrap_or_else(|| DEFAULT_REPLICA.to_string());
    let job = &stored.job;
    let Some(replica) = job.replicas.iter().find(|r| r.name == name) else {
        let names: Vec<&str> = job.replicas.iter().map(|r| r.name.as_str()).collect();
        return Err(ApiError::not_found(format!("CustomJob {id} has no replica \"{name}\"; its replicas are {}.", names.join(", "))));
    };
    if job.is_terminal() || !matches!(replica.state, ReplicaState::Running { .. }) {
        let what = if job.is_terminal() { "has ended".to_string() } else { "is not running".to_string() };
        return Err(ApiError::failed_precondition(format!(
            "Replica {name} of CustomJob {id} {what} (the job is {}); a session needs a running replica.",
            job.state().wire_name()
        )));
    }
    let tty = match ask.tty {
        false => None,
        true => {
            let size = Size { cols: ask.cols.unwrap_or(80), rows: ask.rows.unwrap_or(24) }.check().map_err(ApiError::invalid_argument)?;
            Some((size, ask.term.clone()))
        }
    };
    let upgrade = upgrade.map_err(|e| {
        ApiError::invalid_argument(format!(
            "This is a WebSocket endpoint ({e}): open it with `trainyard custom-jobs {} {id}` (docs/exec.md).",
            if kind == Kind::Exec { "exec" } else { "port-forward" }
        ))
    })?;
    let slot = exec.take_slot(&project)?;
    let auth = crate::security::authorization_of(&headers);
    let tokens = state.tokens.as_ref().map(|t| t.current());
    let holder = super::guard::holder_of(tokens.as_ref().map(|t| t.lookup(auth.as_deref())).as_ref(), auth.is_some());
    let run = trainyard_core::RunId { job: id, attempt: job.attempt, replica: name.clone(), restart: replica.restart };
    let req = crate::exec::Request {
        holder,
        project,
        job: id,
        replica: name,
        run_dir: crate::datadir::run_dir(&state.data_dir, &run),
        argv: ask.command,
        tty,
        connect: ask.port,
    };
    let session = exec.start(req, slot).await?;
    Ok(upgrade.max_message_size(trainyard_api::exec::MAX_MESSAGE).max_frame_size(trainyard_api::exec::MAX_MESSAGE).protocols([crate::security::SESSION_PROTOCOL]).on_upgrade(move |ws| session.run(ws)))
}

/// A browser's page may open a session only from this server's own origin: WebSockets are
/// not bound by the same-origin rule, so another site's page could otherwise reach a
/// local server (open mode) with its visitor's access.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or("");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let authority = origin.split_once("://").map_or("", |(_, rest)| rest.trim_end_matches('/'));
    if authority.is_empty() || !authority.eq_ignore_ascii_case(host) {
        return Err(ApiError::permission_denied(format!(
            "A session may only be opened from this server's own pages: Origin {origin:?} is not {host:?}."
        )));
    }
    Ok(())
}

/// `replica`, `command` (once per argument), `tty`, `cols`, `rows`, `term` (exec) or
/// `replica` and `port` (portForward, where `port` is needed); anything else is named.
fn parse_query(query: &str, kind: Kind) -> Result<Ask, ApiError> {
    let mut ask = Ask::default();
    let mut bytes = 0;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v).ok_or_else(|| ApiError::invalid_argument(format!("{k}: not valid percent-encoded UTF-8")))?;
        if v.contains('\0') {
            return Err(ApiError::invalid_argument(format!("{k}: a NUL byte is not allowed")));
        }
        let number = |v: &str| v.parse::<u32>().map_err(|_| ApiError::invalid_argument(format!("{k}: {v:?} is not a terminal size (1 to 65535)")));
        if kind == Kind::PortForward && !matches!(k, "replica" | "port") {
            return Err(ApiError::invalid_argument(format!("Unknown parameter {k:?}; a port-forward takes replica and port.")));
        }
        match k {
            "replica" => ask.replica = Some(v),
            "port" => {
                ask.port = Some(
                    v.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| ApiError::invalid_argument(format!("port: {v:?} is not a port (1 to 65535)")))?,
                )
            }
            "command" => {
                bytes += v.len() + 1;
                ask.command.push(v);
                if ask.command.len() > MAX_ARGS || bytes > MAX_ARG_BYTES {
                    return Err(ApiError::invalid_argument(format!(
                        "command: at most {MAX_ARGS} arguments and {} KiB in all",
                        MAX_ARG_BYTES / 1024
                    )));
                }
            }
            "tty" => {
                ask.tty = match v.as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    other => return Err(ApiError::invalid_argument(format!("tty: {other:?} is not true or false"))),
                }
            }
            "cols" => ask.cols = Some(number(&v)?),
            "rows" => ask.rows = Some(number(&v)?),
            "term" => {
                if v.is_empty() || v.len() > 64 || !v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c)) {
                    return Err(ApiError::invalid_argument(format!("term: {v:?} is not a terminal type such as xterm-256color")));
                }
                ask.term = Some(v);
            }
            other => {
                return Err(ApiError::invalid_argument(format!(
                    "Unknown parameter {other:?}; a session takes replica, command, tty, cols, rows and term."
                )))
            }
        }
    }
    if kind == Kind::PortForward && ask.port.is_none() {
        return Err(ApiError::invalid_argument("port: the replica's port to connect to is needed (1 to 65535)."));
    }
    Ok(ask)
}

/// A query value: `+` is a space, `%XX` a byte; None when the bytes are not UTF-8.
fn decode(v: &str) -> Option<String> {
    let spaced = v.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).decode_utf8().ok().map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_the_session_and_wrong_parameters() {
        let a = parse_query("replica=workerpool1-0&command=sh&command=-c&command=echo+a%26b&tty=true&cols=100&rows=30&term=xterm", Kind::Exec).unwrap();
        assert_eq!(a.replica.as_deref(), Some("workerpool1-0"));
        assert_eq!(a.command, ["sh", "-c", "echo a&b"]);
        assert!(a.tty);
        assert_eq!((a.cols, a.rows, a.term.as_deref()), (Some(100), Some(30), Some("xterm")));
        assert_eq!(parse_query("", Kind::Exec).unwrap(), Ask::default());
        assert_eq!(parse_query("port=8888", Kind::PortForward).unwrap().port, Some(8888));
        for (q, named) in [("", "port"), ("port=0", "port"), ("port=70000", "port"), ("port=1&command=x", "\"command\"")] {
            let e = parse_query(q, Kind::PortForward).unwrap_err();
            assert!(e.message.contains(named), "{q}: {}", e.message);
        }
        for (q, named) in [
            ("command=a%00b", "NUL"),
            ("tty=maybe", "tty"),
            ("cols=-1", "cols"),
            ("term=x%20y", "term"),
            ("shell=bash", "\"shell\""),
            ("command=%FF", "UTF-8"),
        ] {
            let e = parse_query(q, Kind::Exec).unwrap_err();
            assert_eq!(e.code, trainyard_api::Code::InvalidArgument, "{q}");
            assert!(e.message.contains(named), "{q}: {}", e.message);
        }
        let many = vec!["command=x"; MAX_ARGS + 1].join("&");
        assert!(parse_query(&many, Kind::Exec).unwrap_err().message.contains("at most"));
    }

    #[test]
    fn only_the_servers_own_pages_may_open_a_session() {
        let h = |origin: Option<&str>| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
            if let Some(o) = origin {
                m.insert(header::ORIGIN, o.parse().unwrap());
            }
            m
        };
        assert!(same_origin(&h(None)).is_ok(), "the CLI sends no Origin");
        assert!(same_origin(&h(Some("http://127.0.0.1:8080"))).is_ok());
        for other in ["https://evil.example", "http://127.0.0.1:9999", "null"] {
            let e = same_origin(&h(Some(other))).unwrap_err();
            assert_eq!(e.code, trainyard_api::Code::PermissionDenied, "{other}");
        }
    }
}
