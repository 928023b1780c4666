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
