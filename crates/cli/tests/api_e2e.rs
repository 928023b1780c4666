//! The REST API over HTTP: the managed service's JSON rules, its errors for bad input
//! (each in the `{"error": ...}` shape, each changing nothing), get/list/delete.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

fn good() -> Value {
    sh_job("good", "exit 0")
}

/// Nothing stored: the project's list is empty.
fn assert_nothing_stored(s: &Server, project: &str) {
    let (status, body) = s.call("GET", &s.jobs_url(project), None);
    assert_eq!(status, 200);
    assert!(body.get("customJobs").is_none(), "something was stored: {body}");
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_name: &str, needle: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], want_status, "{body}");
    assert_eq!(body["error"]["status"], want_name, "{body}");
    let m = body["error"]["message"].as_str().unwrap_or("");
    assert!(m.contains(needle), "message {m:?} does not name {needle:?}");
}

/// Announce a body of `len` bytes and send its first kilobyte; read the answer. (The server
/// refuses by Content-Length before reading the body, then closes the connection.)
fn oversized_post(s: &Server, path: &str, len: usize) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    c.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{{\"displayName\": \""
    );
    c.write_all(head.as_bytes()).expect("write");
    let _ = c.write_all(&vec![b'x'; 1024]);
    let mut text = String::new();
    let _ = c.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, body)
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let s = Server::start("");
    let url = s.jobs_url("bad");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut j = good();
        f(&mut j);
        j.to_string()
    };
    let cases: Vec<(String, &str)> = vec![
        ("{\"displayName\": \"x\",".to_string(), "Invalid JSON payload"),
        ("[1,2]".to_string(), "custom_job"),
        (with(&|j| j["displayName"] = json!(42)), "display_name"),
        (with(&|j| j["colour"] = json!("blue")), "colour"),
        (with(&|j| j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["gpus"] = json!(1)), "gpus"),
        (with(&|j| j.as_object_mut().unwrap().remove("displayName").map(|_| ()).unwrap_or(())), "displayName"),
        (with(&|j| j["jobSpec"]["workerPoolSpecs"][0]["replicaCount"] = json!(2)), "jobSpec.workerPoolSpecs[0].replicaCount"),
        (with(&|j| j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"] = json!("n9-giant")), "jobSpec.workerPoolSpecs[0].machineSpec.machineType"),
        (
            with(&|j| {
                j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] = json!("NVIDIA_TESLA_T4");
                j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorCount"] = json!(3);
            }),
            "jobSpec.workerPoolSpecs[0].machineSpec.acceleratorCount",
        ),
        (with(&|j| j["jobSpec"]["scheduling"] = json!({"timeout": "-5s"})), "timeout"),
        (with(&|j| j["jobSpec"]["scheduling"] = json!({"timeout": "soon"})), "timeout"),
        (with(&|j| j["labels"] = json!({"Team": "x"})), "labels"),
        (with(&|j| j["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://b/../../etc"})), "baseOutputDirectory"),
        (with(&|j| j["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "/etc/trainyard"})), "baseOutputDirectory"),
        (with(&|j| j["jobSpec"]["workerPoolSpecs"] = json!([])), "workerPoolSpecs"),
    ];
    for (body, needle) in cases {
        let (status, resp) = s.call("POST", &url, Some(&body));
        assert_error(status, &resp, 400, "INVALID_ARGUMENT", needle);
    }
    // Invalid UTF-8 and deeply nested JSON.
    let (status, resp) = s.call_raw("POST", &url, Some(b"{\"displayName\": \"\xff\"}".to_vec()), "application/json");
    assert_error(status, &resp, 400, "INVALID_ARGUMENT", "UTF-8");
    // A body that is not JSON by its content type.
    let (status, resp) = s.call_raw("POST", &url, Some(good().to_string().into_bytes()), "text/plain");
    assert_error(status, &resp, 400, "INVALID_ARGUMENT", "Content-Type");
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let (status, resp) = s.call("POST", &url, Some(&deep));
    assert_error(status, &resp, 400, "INVALID_ARGUMENT", "Nesting");
    // A huge body: 413 in the error shape.
    let (status, resp) = oversized_post(&s, "/v1/projects/bad/locations/us-central1/customJobs", 2 * 1024 * 1024);
    assert_eq!(status, 413, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("limit"), "{resp}");
    assert_nothing_stored(&s, "bad");
}

#[test]
fn unknown_jobs_routes_and_methods() {
    let s = Server::start("");
    let j = s.create("mine", &good());
    let name = name_of(&j);
    let id = id_of(&j);
    // Another project's job is not found; so is an unknown id.
    let (st, b) = s.call("GET", &format!("{}/{id}", s.jobs_url("other")), None);
    assert_error(st, &b, 404, "NOT_FOUND", "does not exist");
    let (st, b) = s.call("GET", &format!("{}/999999", s.jobs_url("mine")), None);
    assert_error(st, &b, 404, "NOT_FOUND", "999999");
    let (st, b) = s.call("POST", &format!("{}/{id}:cancel", s.jobs_url("other")), Some("{}"));
    assert_error(st, &b, 404, "NOT_FOUND", "does not exist");
    // A non-numeric id.
    let (st, b) = s.call("GET", &format!("{}/abc", s.jobs_url("mine")), None);
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "abc");
    // Unknown route and wrong method.
    let (st, b) = s.call("GET", &s.url("/v1/nothing/here"), None);
    assert_error(st, &b, 404, "NOT_FOUND", "not found");
    let (st, b) = s.call("PUT", &s.jobs_url("mine"), Some("{}"));
    assert_eq!(st, 405, "{b}");
    assert!(b["error"]["message"].is_string());
    // A path with `..` segments.
    let (st, b) = s.call("GET", &s.url("/v1/projects/mine/locations/us-central1/customJobs/../../../../etc/passwd"), None);
    assert!(st == 404 || st == 400, "{st} {b}");
    assert!(b["error"]["message"].is_string(), "the error shape: {b}");
    // A bad $alt.
    let (st, b) = s.call("GET", &format!("{}?$alt=proto", s.url(&format!("/v1/{name}"))), None);
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "$alt");
    s.wait_terminal(&name, 30);
}

/// The official SDK sends `$alt=json;enum-encoding=int` and numeric enums.
#[test]
fn numeric_enums_in_and_out() {
    let s = Server::start("");
    let mut job = good();
    job["jobSpec"]["scheduling"] = json!({"strategy": 1, "timeout": "3600s"});
    let (st, created) = s.call("POST", &format!("{}?%24alt=json%3Benum-encoding%3Dint", s.jobs_url("p")), Some(&job.to_string()));
    assert_eq!(st, 200, "{created}");
    assert!(created["state"].is_number(), "{created}");
    assert_eq!(created["jobSpec"]["scheduling"]["strategy"], 1);
    assert_eq!(created["jobSpec"]["workerPoolSpecs"][0]["replicaCount"], "1", "int64 as a string");
    let name = name_of(&created);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(done["jobSpec"]["scheduling"]["strategy"], "ON_DEMAND");
    assert_eq!(done["jobSpec"]["scheduling"]["timeout"], "3600s");
    assert!(done["createTime"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn list_pages_newest_first_and_tokens_are_checked() {
    let s = Server::start("");
    let mut names = Vec::new();
    for i in 0..5 {
        names.push(name_of(&s.create("p", &sh_job(&format!("j{i}"), "exit 0"))));
    }
    let (st, page1) = s.call("GET", &format!("{}?pageSize=2", s.jobs_url("p")), None);
    assert_eq!(st, 200);
    let got: Vec<&str> = page1["customJobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(got, [names[4].as_str(), names[3].as_str()]);
    let token = page1["nextPageToken"].as_str().unwrap().to_string();
    // Jobs created between pages do not disturb the next page.
    s.create("p", &sh_job("late", "exit 0"));
    let (_, page2) = s.call("GET", &format!("{}?pageSize=2&pageToken={token}", s.jobs_url("p")), None);
    let got: Vec<&str> = page2["customJobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(got, [names[2].as_str(), names[1].as_str()]);
    // An altered token, or one from another query, is refused.
    let mut altered = token.clone();
    altered.replace_range(0..1, if altered.starts_with('1') { "2" } else { "1" });
    let (st, b) = s.call("GET", &format!("{}?pageToken={altered}", s.jobs_url("p")), None);
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "pageToken");
    let (st, b) = s.call("GET", &format!("{}?pageToken={token}", s.jobs_url("q")), None);
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "pageToken");
    // A pageSize that is not an int32 (also an empty one) is refused, naming it.
    for bad in ["", "abc", "-1", "2147483648"] {
        let (st, b) = s.call("GET", &format!("{}?pageSize={bad}", s.jobs_url("p")), None);
        assert_error(st, &b, 400, "INVALID_ARGUMENT", "pageSize");
    }
    // The last page has no token.
    let (_, last) = s.call("GET", &format!("{}?pageSize=100", s.jobs_url("p")), None);
    assert_eq!(last["customJobs"].as_array().unwrap().len(), 6);
    assert!(last.get("nextPageToken").is_none());
}

#[test]
fn delete_returns_an_operation_and_removes_logs() {
    let s = Server::start("");
    let j = s.create("p", &sh_job("del", "sleep 30"));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let (st, b) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_error(st, &b, 400, "FAILED_PRECONDITION", "cannot be deleted");
    s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    s.wait_terminal(&name, 30);
    let runs = s.data_dir().join("runs").join(id_of(&j).to_string());
    assert!(runs.exists());
    let (st, op) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(st, 200, "{op}");
    assert_eq!(op["done"], true);
    assert_eq!(op["metadata"]["@type"], "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata");
    assert_eq!(op["response"]["@type"], "type.googleapis.com/google.protobuf.Empty");
    let (st, again) = s.call("GET", &s.url(&format!("/v1/{}", op["name"].as_str().unwrap())), None);
    assert_eq!((st, &again), (200, &op));
    let (st, _) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(st, 404);
    // The files go after the delete is committed (an outbox Purge), not before the reply.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while runs.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!runs.exists(), "run directories removed");
}

fn names(body: &Value) -> Vec<String> {
    body["customJobs"].as_array().map(|a| a.iter().map(|j| j["displayName"].as_str().unwrap_or("").to_string()).collect()).unwrap_or_default()
}

fn list(s: &Server, project: &str, query: &str) -> (u16, Value) {
    let q: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~=&".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    s.call("GET", &format!("{}?{q}", s.jobs_url(project)), None)
}

#[test]
fn list_filters_in_sql() {
    let s = Server::start("");
    let mut a = sh_job("alpha-1", "exit 0");
    a["labels"] = json!({"team": "nlp", "env": "dev"});
    let mut b = sh_job("beta-2", "exit 3");
    b["labels"] = json!({"team": "vision"});
    let c = sh_job("alpha-3", "sleep 300");
    let (an, bn, cn) = (name_of(&s.create("f", &a)), name_of(&s.create("f", &b)), name_of(&s.create("f", &c)));
    s.wait_terminal(&an, 30);
    s.wait_terminal(&bn, 30);
    let c_job = s.wait_for(&cn, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let cases: &[(&str, &[&str])] = &[
        ("filter=display_name=\"alpha-1\"", &["alpha-1"]),
        ("filter=display_name=\"alpha-*\"", &["alpha-3", "alpha-1"]),
        ("filter=display_name:\"ta-\"", &["beta-2"]),
        ("filter=labels.team=\"nlp\"", &["alpha-1"]),
        ("filter=labels.env:*", &["alpha-1"]),
        ("filter=labels.team!=\"nlp\"", &["alpha-3", "beta-2"]),
        ("filter=state=\"JOB_STATE_FAILED\"", &["beta-2"]),
        ("filter=state=JOB_STATE_RUNNING OR state=JOB_STATE_FAILED", &["alpha-3", "beta-2"]),
        ("filter=NOT state=JOB_STATE_RUNNING AND labels.team:\"i\"", &["beta-2"]),
        ("filter=(display_name:alpha) AND -labels.team=nlp", &["alpha-3"]),
        ("filter=state=3", &["alpha-3"]),
    ];
    for (q, want) in cases {
        let (st, body) = list(&s, "f", q);
        assert_eq!(st, 200, "{q}: {body}");
        assert_eq!(names(&body), *want, "{q}");
    }
    let t = c_job["createTime"].as_str().unwrap();
    let (_, body) = list(&s, "f", &format!("filter=create_time>=\"{t}\""));
    assert_eq!(names(&body), ["alpha-3"]);
    let (_, body) = list(&s, "f", &format!("filter=create_time<\"{t}\""));
    assert_eq!(names(&body), ["beta-2", "alpha-1"]);
    // Filtered pages: the token carries on the same filter, and only that filter.
    let (_, p1) = list(&s, "f", "filter=display_name:alpha&pageSize=1");
    assert_eq!(names(&p1), ["alpha-3"]);
    let token = p1["nextPageToken"].as_str().unwrap();
    let (_, p2) = list(&s, "f", &format!("filter=display_name:alpha&pageSize=1&pageToken={token}"));
    assert_eq!(names(&p2), ["alpha-1"]);
    assert!(p2.get("nextPageToken").is_none());
    let (st, b) = list(&s, "f", &format!("filter=display_name:beta&pageSize=1&pageToken={token}"));
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "pageToken");
    // Filters that do not parse: 400 with the column.
    for (q, needle) in [
        ("filter=colour=\"red\"", "column 1"),
        ("filter=state=\"JOB_STATE_RUNNING\" AND", "column 30"),
        ("filter=state=\"RUNNING\"", "not a job state"),
        ("filter=create_time>\"yesterday\"", "RFC 3339"),
        ("filter=(display_name:x", "')'"),
    ] {
        let (st, b) = list(&s, "f", q);
        assert_error(st, &b, 400, "INVALID_ARGUMENT", needle);
    }
    // readMask keeps only the fields asked for.
    let (_, body) = list(&s, "f", "readMask=name,display_name,jobSpec.scheduling&filter=labels.team=nlp");
    let job = &body["customJobs"][0];
    let keys: Vec<&String> = job.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["displayName", "name"], "{job}");
}

/// The OpenAPI document is served; malformed query strings get the error shape.
#[test]
fn openapi_and_query_errors() {
    let s = Server::start("");
    let (st, doc) = s.call("GET", &s.url("/openapi.json"), None);
    assert_eq!(st, 200);
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["components"]["schemas"]["CustomJob"].is_object());
    assert!(doc["paths"]["/v1/projects/{project}/locations/{location}/customJobs"]["post"].is_object(), "{:?}", doc["paths"].as_object().map(|p| p.keys().collect::<Vec<_>>()));
    let j = s.create("p", &sh_job("q", "exit 0"));
    let name = name_of(&j);
    for q in ["/logs?attempt=x", "/logs?follow=yes", "?$alt=json&$alt=json"] {
        let (st, b) = s.call("GET", &s.url(&format!("/v1/{name}{q}")), None);
        assert_error(st, &b, 400, "INVALID_ARGUMENT", "");
    }
    let (st, b) = s.call("GET", &format!("{}?pageSize=1&pageSize=2", s.jobs_url("p")), None);
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "query");
    s.wait_terminal(&name, 30);
}

/// The logs extension: follow streams entries while the job runs and ends when it is
/// terminal; replica and attempt select entries (L22).
#[test]
fn l22_logs_follow_until_terminal() {
    use std::io::BufRead;
    let s = Server::start("");
    let j = s.create("p", &sh_job("follow", "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo err >&2"));
    let name = name_of(&j);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let resp = agent.get(&s.url(&format!("/v1/{name}/logs?follow=true"))).call().unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("content-type").unwrap(), "application/x-ndjson");
    let started = std::time::Instant::now();
    let mut entries = Vec::new();
    for line in std::io::BufReader::new(resp.into_body().into_reader()).lines() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        entries.push(e);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let texts: Vec<String> = entries.iter().map(|e| e["text"].as_str().unwrap().to_string()).collect();
    for want in ["line 1", "line 2", "line 3", "err", "L17: Job completed successfully."] {
        assert!(texts.iter().any(|t| t == want), "{want} missing: {texts:?}");
    }
    // Every lifecycle event cites its rule, in its text and as a field.
    let events: Vec<&Value> = entries.iter().filter(|e| e["stream"] == "event").collect();
    assert!(!events.is_empty());
    for e in &events {
        let rule = e["rule"].as_str().unwrap_or_else(|| panic!("an event without its rule: {e}"));
        assert!(e["text"].as_str().unwrap().starts_with(&format!("{rule}: ")), "{e}");
    }
    assert!(entries.iter().filter(|e| e["stream"] != "event").all(|e| e.get("rule").is_none()));
    let err = entries.iter().find(|e| e["text"] == "err").unwrap();
    assert_eq!((err["stream"].as_str(), err["replica"].as_str(), err["attempt"].as_u64(), err["restart"].as_u64()), (Some("stderr"), Some("workerpool0-0"), Some(0), Some(0)));
    assert!(err["time"].as_str().unwrap().ends_with('Z'));
    // The stream ended because the job is terminal.
    assert_eq!(s.get(&name)["state"], "JOB_STATE_SUCCEEDED");
    // Selecting a replica that does not exist leaves only the service's own job-wide events.
    let only: Vec<Value> = {
        let mut resp = agent.get(&s.url(&format!("/v1/{name}/logs?replica=workerpool9-9"))).call().unwrap();
        let text = resp.body_mut().read_to_string().unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    assert!(only.iter().all(|e| e["stream"] == "event"), "{only:?}");
}

/// The web console is served at / and reads the same REST API.
#[test]
fn console_page_is_served() {
    let s = Server::start("");
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut resp = agent.get(&s.url("/")).call().unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("content-type").unwrap().to_str().unwrap().starts_with("text/html"));
    let page = resp.body_mut().read_to_string().unwrap();
    assert!(page.contains("<title>Trainyard</title>"));
    assert!(page.contains("<script src=\"/console.js\">"), "{page}");
    let script = agent.get(&s.url("/console.js")).call().unwrap().body_mut().read_to_string().unwrap();
    assert!(script.contains("/customJobs?pageSize=100") && script.contains("/logs"), "the page uses the REST API");
}

/// `readMask`: a path that names no field of the resource is a 400 naming it (also on an
/// empty page); a field that is merely unset in this job (`error`, `endTime` of a running
/// job) is not an error, and a nested path is checked by its first segment.
#[test]
fn read_mask_refuses_unknown_fields() {
    let s = Server::start("");
    let running = s.create("m", &sh_job("masked", "sleep 300"));
    s.wait_for(&name_of(&running), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    for (q, needle) in [
        ("readMask=foo", "Invalid readMask: \"foo\" is not a field of CustomJob."),
        ("readMask=name,colour", "\"colour\" is not a field of CustomJob"),
        ("readMask=name,nope.scheduling", "\"nope.scheduling\" is not a field of CustomJob"),
        ("readMask=display_name,Name", "\"Name\" is not a field of CustomJob"),
        ("readMask=trials", "\"trials\" is not a field of CustomJob"),
    ] {
        let (st, b) = list(&s, "m", q);
        assert_error(st, &b, 400, "INVALID_ARGUMENT", needle);
        // Refused before anything is read: an empty project answers the same.
        let (st, b) = list(&s, "empty", q);
        assert_error(st, &b, 400, "INVALID_ARGUMENT", needle);
    }
    let (st, body) = list(&s, "m", "readMask=name,error,endTime,end_time,jobSpec.scheduling,jobSpec.nope,labels");
    assert_eq!(st, 200, "{body}");
    let job = &body["customJobs"][0];
    let keys: Vec<&String> = job.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name"], "{job}");
    let (st, body) = list(&s, "m", "readMask=display_name,state, createTime");
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["customJobs"][0], json!({"displayName": "masked", "state": "JOB_STATE_RUNNING", "createTime": running["createTime"]}));
    // The tuning jobs' list checks against HyperparameterTuningJob's fields.
    let studies = |q: &str| s.call("GET", &s.url(&format!("/v1/projects/m/locations/us-central1/hyperparameterTuningJobs?{q}")), None);
    let (st, b) = studies("readMask=jobSpec");
    assert_error(st, &b, 400, "INVALID_ARGUMENT", "\"jobSpec\" is not a field of HyperparameterTuningJob");
    let (st, b) = studies("readMask=trialJobSpec,trials,error,maxTrialCount");
    assert_eq!(st, 200, "{b}");
}

/// Tuning-job paths answer in their own words: a bad id names a HyperparameterTuningJob,
/// and a method the collection or a resource does not serve gets 405 with its own Allow.
#[test]
fn tuning_job_paths_answer_as_tuning_jobs() {
    let s = Server::start("");
    let base = s.url("/v1/projects/p/locations/us-central1/hyperparameterTuningJobs");
    let (status, body) = s.call("GET", &format!("{base}/abc"), None);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("HyperparameterTuningJob id \"abc\""), "{body}");
    let resp = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent().put(&base).send(b"{}" as &[u8]).unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET, POST"));
    let resp = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent().put(&format!("{base}/1")).send(b"{}" as &[u8]).unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET, DELETE"));
}

/// L22 at scale: `tail=N` gives the last N entries of the log, `since=` those from a time
/// on; a bad `since` is 400 naming it.
#[test]
fn logs_tail_and_since_select_entries() {
    let s = Server::start("");
    let j = s.create("p", &sh_job("many", "i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); done"));
    let name = name_of(&j);
    s.wait_terminal(&name, 60);
    let all = s.logs(&name);
    assert!(all.len() > 300);
    let get = |q: &str| -> Vec<Value> {
        let mut resp = ureq::get(&s.url(&format!("/v1/{name}/logs?{q}"))).call().unwrap();
        let text = resp.body_mut().read_to_string().unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let tail = get("tail=7");
    assert_eq!(tail, all[all.len() - 7..].to_vec());
    let from = all[150]["time"].as_str().unwrap().to_string();
    let since = get(&format!("since={from}"));
    assert!(!since.is_empty() && since.iter().all(|e| e["time"].as_str().unwrap() >= from.as_str()));
    assert_eq!(since.last(), all.last());
    let (status, e) = s.call("GET", &s.url(&format!("/v1/{name}/logs?since=yesterday")), None);
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("since"), "{e}");
}

/// L22 retention (`[lifecycle] log_retention_secs`): the output of a job that ended longer
/// ago than that is removed; its record and its lifecycle events stay.
#[test]
fn log_retention_removes_old_output_and_keeps_the_record() {
    let mut s = Server::prepare("");
    let text = std::fs::read_to_string(&s.config).unwrap().replace("[lifecycle]\n", "[lifecycle]\nlog_retention_secs = 2\n");
    std::fs::write(&s.config, text).unwrap();
    s.spawn();
    let j = s.create("p", &sh_job("old", "echo old output"));
    let name = name_of(&j);
    assert_eq!(s.wait_terminal(&name, 30)["state"], "JOB_STATE_SUCCEEDED");
    assert!(s.logs_text(&name).contains("old output"));
    let log = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0).join("log.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while log.exists() {
        assert!(std::time::Instant::now() < deadline, "the output was kept past the retention period");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let text = s.logs_text(&name);
    assert!(!text.contains("old output") && text.contains("L17: Job completed successfully."), "{text}");
    assert_eq!(s.get(&name)["state"], "JOB_STATE_SUCCEEDED");
}

/// A server whose port is taken exits at start naming the address, instead of half
/// starting; the test harness then starts it on another port, and the restart has every job.
#[test]
fn a_taken_port_is_a_clear_error_at_start() {
    let mut s = Server::start("");
    let (code, job) = s.call("POST", &s.jobs_url("p"), Some(&good().to_string()));
    assert_eq!(code, 200, "{job}");
    s.kill9();
    let old = s.port;
    // The killed server's sockets may keep the port busy for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let holder = loop {
        match std::net::TcpListener::bind(("127.0.0.1", old)) {
            Ok(l) => break l,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("cannot take port {old}: {e}"),
        }
    };
    s.spawn();
    assert_ne!(s.port, old);
    let log = s.server_log();
    assert!(log.contains(&format!("cannot listen on 127.0.0.1:{old}")), "{log}");
    let (code, again) = s.call("GET", &s.url(&format!("/v1/{}", job["name"].as_str().unwrap_or_default())), None);
    assert_eq!(code, 200, "{again}");
    drop(holder);
}

/// No Nagle stalls: ten logs requests on one kept-alive connection take about as long as
/// ten on fresh connections (with Nagle's algorithm each waited for the client's delayed
/// acknowledgement, at least 40 ms on Linux, some 20 times a fresh request). Prints both.
/// The check is against the same run's fresh connections plus most of that stall: a
/// ratio alone failed on a loaded machine, where a kept-alive median of 5 ms against a
/// fresh one of 2.5 ms is scheduling noise and not a stall.
#[test]
fn logs_on_a_kept_alive_connection_do_not_wait_for_acknowledgements() {
    let s = Server::start("");
    let name = name_of(&s.create("p", &sh_job("talk", "for i in 1 2 3 4 5; do echo line $i; done")));
    s.wait_terminal(&name, 60);
    let url = s.url(&format!("/v1/{name}/logs"));
    let kept = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let read = |agent: &ureq::Agent| {
        let mut r = agent.get(&url).call().expect("GET logs");
        let body = r.body_mut().read_to_string().expect("body");
        assert!(body.contains("line 5"), "{body}");
    };
    read(&kept);
    let mut kept_ms = Vec::new();
    let mut fresh_ms = Vec::new();
    for _ in 0..10 {
        let t = std::time::Instant::now();
        read(&kept);
        kept_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let fresh = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let t = std::time::Instant::now();
        read(&fresh);
        fresh_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (k, f) = (median(&mut kept_ms), median(&mut fresh_ms));
    eprintln!("measure: logs request on a kept-alive connection {k:.2} ms, on a fresh one {f:.2} ms (median of 10)");
    assert!(k < f + 30.0, "a kept-alive request waits for an acknowledgement: {kept_ms:?} against fresh {fresh_ms:?}");
}

/// The driver's thread (`driver`) never touches a file but the store's (the architecture's
/// rule: every file a job's work reads, a tenant's storage included, is read off it): a
/// server is watched with strace on that thread alone while it takes creates of each kind
/// with output and host directories, runs, fails, cancels and lists jobs and trials, and
/// every path system call it made is listed. On PostgreSQL (the suite's second run) the
/// store has no file at all.
#[test]
fn the_driver_thread_touches_no_file_but_the_stores() {
    if Command::new("strace").arg("-V").output().is_err() {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI has strace (.ci/run installs it)");
        eprintln!("SKIP: no strace here");
        return;
    }
    let s = Server::start("");
    let pid = s.pid().expect("the server runs");
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("its threads")
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "driver"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("a thread named driver");
    let out = s.dir.path().join("driver.strace");
    let mut strace = Command::new("strace")
        .args(["-qq", "-p", &tid, "-e", "trace=%file,getdents64", "-o"])
        .arg(&out)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("strace");
    // Attached once the thread has a tracer.
    let traced = || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .is_ok_and(|st| st.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0")))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !traced() {
        assert!(Instant::now() < deadline, "strace did not attach to the driver's thread");
        std::thread::sleep(Duration::from_millis(20));
    }

    let host_dir = s.dir.path().join("host-data");
    std::fs::create_dir_all(&host_dir).expect("dir");
    let mut job = sh_job("io-a", "echo hi; exit 3");
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://bkt/out"});
    job["trainyardHostDirectories"] = json!([host_dir.display().to_string()]);
    let failing = name_of(&s.create("p", &job));
    let long = name_of(&s.create("p", &sh_job("io-b", "sleep 60")));
    // A package in the tenant's storage that is not there: looked for by the executor.
    let package = json!({"displayName": "io-pkg", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "pythonPackageSpec": {"executorImageUri": "i", "packageUris": ["gs://bkt/absent.tar.gz"], "pythonModule": "m"}}]}});
    let package = name_of(&s.create("p", &package));
    let study = json!({
        "displayName": "io-tune",
        "studySpec": {"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}]},
        "maxTrialCount": 2, "parallelTrialCount": 2,
        "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                         "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "echo trial"]}}],
                         "baseOutputDirectory": {"outputUriPrefix": "gs://bkt/tune"}}
    });
    let (status, tuning) = s.call("POST", &s.url("/v1/projects/p/locations/us-central1/hyperparameterTuningJobs"), Some(&study.to_string()));
    assert_eq!(status, 200, "{tuning}");
    s.wait_for(&long, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{long}:cancel")), None);
    assert_eq!(status, 200, "{body}");
    for name in [&failing, &long, &package] {
        s.wait_terminal(name, 60);
    }
    let tuning_name = tuning["name"].as_str().expect("name").to_string();
    s.wait_terminal(&tuning_name, 120);
    let (status, body) = s.call("GET", &s.url("/v1/projects/p/locations/us-central1/customJobs?filter=state=JOB_STATE_FAILED"), None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = s.call("DELETE", &s.url(&format!("/v1/{failing}")), None);
    assert_eq!(status, 200, "{body}");

    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(strace.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = strace.wait();
    let calls = std::fs::read_to_string(&out).expect("strace's output");
    let data = s.data_dir();
    let store: Vec<String> = ["trainyard.db", "trainyard.db-wal", "trainyard.db-shm", "trainyard.db-journal"]
        .iter()
        .map(|f| format!("\"{}\"", data.join(f).display()))
        .collect();
    let touched: Vec<&str> = calls.lines().filter(|l| l.contains('"') && !store.iter().any(|f| l.contains(f.as_str()))).collect();
    assert!(touched.is_empty(), "the driver's thread touched files:\n{}", touched.join("\n"));
}
