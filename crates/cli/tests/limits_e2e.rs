//! Per-project limits (`[limits]`): one tenant cannot take the server from the others.

mod common;

use common::*;

/// A project at its limit of live jobs gets 429 naming the limit; another project does
/// not; once a job ends, the project may create again.
#[test]
fn live_jobs_per_project_are_limited() {
    let s = Server::start("[limits]\nmax_live_jobs_per_project = 2\n");
    let a = s.create("greedy", &sh_job("a", "sleep 600"));
    let _b = s.create("greedy", &sh_job("b", "sleep 600"));
    let (status, body) = s.call("POST", &s.jobs_url("greedy"), Some(&sh_job("c", "true").to_string()));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    let msg = body["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("limits.max_live_jobs_per_project = 2"), "{msg}");
    let (status, list) = s.call("GET", &s.jobs_url("greedy"), None);
    assert_eq!((status, list["customJobs"].as_array().map(Vec::len)), (200, Some(2)), "nothing stored: {list}");
    // Another project is not held back.
    let other = s.create("modest", &sh_job("d", "true"));
    assert_eq!(s.wait_terminal(&name_of(&other), 30)["state"], "JOB_STATE_SUCCEEDED");
    // A job of the greedy project ends: it may create again.
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&a))), None);
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name_of(&a), 30);
    let e = s.create("greedy", &sh_job("e", "true"));
    assert_eq!(s.wait_terminal(&name_of(&e), 30)["state"], "JOB_STATE_SUCCEEDED");
}

/// A project that sends more writes than its rate gets 429 with Retry-After naming the
/// limit; reads and other projects go on.
#[test]
fn writes_per_project_are_rate_limited() {
    let s = Server::start("[limits]\nwrites_per_second_per_project = 0.5\nwrite_burst_per_project = 3\n");
    for i in 0..3 {
        s.create("busy", &sh_job(&format!("ok-{i}"), "true"));
    }
    let (status, body) = s.call("POST", &s.jobs_url("busy"), Some(&sh_job("over", "true").to_string()));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    let msg = body["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("limits.writes_per_second_per_project") && msg.contains("busy"), "{msg}");
    let (status, _) = s.call("GET", &s.jobs_url("busy"), None);
    assert_eq!(status, 200, "reads are not limited");
    s.create("quiet", &sh_job("other", "true"));
    let (_, list) = s.call("GET", &s.jobs_url("busy"), None);
    assert_eq!(list["customJobs"].as_array().map(Vec::len), Some(3), "the refused create stored nothing");
}

/// Open a connection and send one GET of `path`; the connection is returned with the
/// response's head read, and its body when it has a `Content-Length` (a 429's).
fn raw_get(port: u16, path: &str) -> (std::net::TcpStream, String) {
    use std::io::{Read, Write};
    let mut t = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(t, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("write");
    t.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let whole = |got: &[u8]| {
        let text = String::from_utf8_lossy(got).to_ascii_lowercase();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|n| n.trim().parse::<usize>().ok())
        });
        length.is_none_or(|n| body.len() >= n)
    };
    while !whole(&got) {
        match t.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (t, String::from_utf8_lossy(&got).into_owned())
}

/// Has the server closed `t` (within 5 s)?
fn closed_by_server(t: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    t.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match t.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// A project at its share of followed log streams and of connections
/// (`limits.max_log_streams_per_project`, `limits.max_connections_per_project`) is
/// answered 429 naming the key (the connection over the share is closed), while another
/// project's requests and `/healthz` are answered at once; a stream whose client went
/// away gives its share back.
#[test]
fn log_streams_and_connections_are_shared_out_per_project() {
    let s = Server::start(
        "[limits]\nmax_connections_per_project = 3\nmax_log_streams_per_project = 2\n",
    );
    let job = s.create("evil", &sh_job("hold", "sleep 600"));
    let logs = format!("/v1/{}/logs?follow=true", name_of(&job));
    let (first, head) = raw_get(s.port, &logs);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_second, head) = raw_get(s.port, &logs);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut third, head) = raw_get(s.port, &logs);
    assert!(head.starts_with("HTTP/1.1 429"), "a third stream: {head}");
    assert!(
        head.contains("limits.max_log_streams_per_project") && head.contains("RESOURCE_EXHAUSTED"),
        "{head}"
    );
    // The third connection is the project's third: kept. A fourth is over the share.
    let (mut fourth, head) = raw_get(s.port, "/v1/projects/evil/locations/us-central1/customJobs");
    assert!(
        head.starts_with("HTTP/1.1 429"),
        "a fourth connection: {head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(
        head.contains("limits.max_connections_per_project"),
        "{head}"
    );
    assert!(
        closed_by_server(&mut fourth),
        "the connection over the share is closed"
    );
    let _ = &mut third;
    // The victim and the health check are served meanwhile.
    let t0 = std::time::Instant::now();
    let (status, body) = s.call("GET", &s.jobs_url("victim"), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.call("GET", &s.url("/healthz"), None).0, 200);
    eprintln!(
        "the victim's list and /healthz took {:?} while the other project was at its shares",
        t0.elapsed()
    );
    let (_v1, head) = raw_get(
        s.port,
        &format!(
            "/v1/{}/logs?follow=true",
            name_of(&s.create("victim", &sh_job("v", "sleep 600")))
        ),
    );
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "the victim's own stream: {head}"
    );
    // The first stream's client goes away: its stream and connection are given back.
    drop(first);
    let t0 = std::time::Instant::now();
    loop {
        let (_again, head) = raw_get(s.port, &logs);
        if head.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the share did not come back: {head}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
