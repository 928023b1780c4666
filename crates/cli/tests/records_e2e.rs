//! Vertex ML Metadata and TensorBoard of a real server (the SDK's own flows are in
//! sdk-tests/test_experiments.py): bad input answered in the API's error shape and
//! changing nothing, records and points kept across a kill, another project's resources
//! out of reach, and a job's TensorBoard event files read into time series while it runs,
//! hostile files skipped with a line in the job's log.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const LOC: &str = "v1/projects/p/locations/us-central1";

fn url(s: &Server, path: &str) -> String {
    s.url(&format!("/{LOC}/{path}"))
}

fn ok(s: &Server, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, v) = s.call(method, &url(s, path), body.map(|b| b.to_string()).as_deref());
    assert_eq!(status, 200, "{method} {path}: {v}");
    v
}

fn refused(s: &Server, method: &str, path: &str, body: Option<&str>, code: u16, words: &str) {
    let (status, v) = s.call(method, &url(s, path), body);
    assert_eq!(status, code, "{method} {path}: {v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(words), "{method} {path}: {message:?} does not say {words:?}");
}

/// Bad requests are errors naming what is wrong and change nothing; what was written is
/// there after a kill -9 and a restart.
#[test]
fn bad_input_changes_nothing_and_records_survive_a_kill() {
    let mut s = Server::start("");
    let ctx = "metadataStores/default/contexts";
    ok(&s, "POST", &format!("{ctx}?contextId=exp"), Some(json!({"schemaTitle": "system.Experiment", "metadata": {"a": 1}})));
    refused(&s, "POST", &format!("{ctx}?contextId=x1"), Some(r#"{"schemaTitle": "t", "colour": "red"}"#), 400, "Unknown name \"colour\"");
    refused(&s, "POST", &format!("{ctx}?contextId=x2"), Some("{not json"), 400, "Invalid JSON payload");
    refused(&s, "POST", &format!("{ctx}?contextId=Bad_Id"), Some("{}"), 400, "contextId");
    refused(&s, "POST", &format!("{ctx}?contextId=exp"), Some("{}"), 409, "already exists");
    let big = json!({"metadata": {"blob": "x".repeat(300 * 1024)}}).to_string();
    let (status, _) = s.call("POST", &url(&s, &format!("{ctx}?contextId=x3")), Some(&big));
    assert!(status == 400 || status == 413, "{status}");
    let bomb = format!("{}a=1{}", "(".repeat(500), ")".repeat(500));
    refused(&s, "GET", &format!("{ctx}?filter={}", urlencode(&bomb)), None, 400, "deeper than");
    refused(&s, "GET", &format!("{ctx}?filter={}", urlencode("schema_title=")), None, 400, "expected a value");
    refused(&s, "POST", "metadataStores/default/contexts/exp:noSuchVerb", Some("{}"), 404, "noSuchVerb");
    refused(&s, "GET", "metadataStores/default/contexts/nope", None, 404, "does not exist");
    refused(&s, "POST", "metadataStores/default/contexts/exp:addContextChildren", Some(r#"{"childContexts": ["projects/q/locations/us-central1/metadataStores/default/contexts/c"]}"#), 400, "is not the name of a Context");
    refused(&s, "PATCH", "metadataStores/default/contexts/exp", Some(r#"{"etag": "7", "displayName": "x"}"#), 409, "changed since it was read");
    let listed = ok(&s, "GET", ctx, None);
    assert_eq!(listed["contexts"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["contexts"][0]["etag"], "1", "nothing changed it");

    // A TensorBoard, a run with a series, its points; a time series of another project's
    // TensorBoard is not read through this one; a run written after its experiment is
    // deleted is not found.
    let op = ok(&s, "POST", "tensorboards", Some(json!({"displayName": "tb"})));
    let tb = op["response"]["name"].as_str().expect("tb name").trim_start_matches(&format!("{}/", &LOC[3..])).to_string();
    ok(&s, "POST", &format!("{tb}/experiments?tensorboardExperimentId=e"), Some(json!({})));
    ok(&s, "POST", &format!("{tb}/experiments/e/runs?tensorboardRunId=r"), Some(json!({})));
    let series = ok(&s, "POST", &format!("{tb}/experiments/e/runs/r/timeSeries"), Some(json!({"displayName": "loss", "valueType": "SCALAR"})));
    let sid = series["name"].as_str().expect("series").rsplit('/').next().expect("id").to_string();
    let point = |step: u32| json!({"tensorboardTimeSeriesId": sid, "values": [{"wallTime": "2026-12-07T00:00:00Z", "step": step.to_string(), "scalar": {"value": 0.5}}]});
    ok(&s, "POST", &format!("{tb}/experiments/e/runs/r:write"), Some(json!({"timeSeriesData": [point(1), point(2)]})));
    refused(&s, "POST", &format!("{tb}/experiments/e/runs/r:write"), Some(&json!({"timeSeriesData": [{"tensorboardTimeSeriesId": sid, "values": [{"step": "3"}]}]}).to_string()), 400, "wall_time");
    let foreign = format!("projects/q/locations/us-central1/{tb}/experiments/e/runs/r/timeSeries/{sid}");
    refused(&s, "GET", &format!("{tb}:batchRead?timeSeries={}", urlencode(&foreign)), None, 400, "is not a time series of");
    let (status, _) = s.call("GET", &s.url(&format!("/v1/projects/q/locations/us-central1/{tb}")), None);
    assert_eq!(status, 404, "another project's name for the same id is not found");

    s.kill9();
    s.spawn();
    let read = ok(&s, "GET", &format!("{tb}/experiments/e/runs/r/timeSeries/{sid}:read"), None);
    assert_eq!(read["timeSeriesData"]["values"].as_array().map(Vec::len), Some(2), "{read}");
    assert_eq!(ok(&s, "GET", "metadataStores/default/contexts/exp", None)["metadata"]["a"], 1.0);
    ok(&s, "DELETE", &format!("{tb}/experiments/e"), None);
    refused(&s, "POST", &format!("{tb}/experiments/e/runs/r:write"), Some(&json!({"timeSeriesData": [point(3)]}).to_string()), 404, "does not exist");
    assert!(s.server_log().find("panicked").is_none(), "no input crashes the server");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The job's program: TFRecord-framed Event protos written by hand (no TensorFlow or
/// PyTorch needed), three scalars, a pause (the test reads them while the job runs), two
/// more and a run of its own; and hostile files beside them.
const WRITER: &str = r#"
import os, struct, sys, time
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])
def event(step, tag, value):
    tag = tag.encode()
    v = b"\x0a" + varint(len(tag)) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + varint(len(v)) + v
    return b"\x09" + struct.pack("<d", time.time()) + b"\x10" + varint(step) + b"\x2a" + varint(len(summary)) + summary
def record(data):
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data))
logs = os.environ["AIP_TENSORBOARD_LOG_DIR"]
os.makedirs(os.path.join(logs, "eval"), exist_ok=True)
# Hostile neighbours: a record claiming 2^63 bytes, a link out, a FIFO.
huge = struct.pack("<Q", 1 << 63)
open(os.path.join(logs, "bad.tfevents"), "wb").write(huge + struct.pack("<I", masked(huge)) + b"x" * 64)
os.symlink("/etc/passwd", os.path.join(logs, "link.tfevents"))
os.mkfifo(os.path.join(logs, "fifo.tfevents"))
with open(os.path.join(logs, "events.out.tfevents.1"), "ab", buffering=0) as f:
    for step in (1, 2, 3):
        f.write(record(event(step, "loss", 1.0 / step)))
    print("first three written", flush=True)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(logs, "go")) and time.time() < deadline:
        time.sleep(0.1)
    for step in (4, 5):
        f.write(record(event(step, "loss", 1.0 / step)))
with open(os.path.join(logs, "eval", "events.out.tfevents.2"), "wb") as f:
    f.write(record(event(5, "accuracy", 0.75)))
print("done", flush=True)
"#;

/// A job's event files become time series of the project's default TensorBoard while it
/// runs (experiment = the job's id, a run per directory, a series per tag); a record of
/// 2^63 bytes, a link and a FIFO named like event files are skipped with a line in the
/// job's log, and nothing outside the job's storage is read.
#[test]
fn a_jobs_event_files_become_time_series_while_it_runs() {
    if skip_in_containers("the job's program is a host python3 writing into its log directory") || skip_on_slurm("reads the storage root of the server's host") {
        return;
    }
    let s = Server::start("");
    let job = json!({
        "displayName": "tb-writer",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", WRITER]}
        }], "baseOutputDirectory": {"outputUriPrefix": "gs://tb-bucket/out"}}
    });
    let created = s.create("p", &job);
    let name = name_of(&created);
    let id = name.rsplit('/').next().expect("id").to_string();
    // The first three points, read while the job runs (it waits for the test's "go").
    let deadline = Instant::now() + Duration::from_secs(90);
    let (tb, series) = loop {
        assert!(Instant::now() < deadline, "no time series; job log:\n{}\nserver log:\n{}", s.logs_text(&name), s.server_log());
        let tbs = ok(&s, "GET", "tensorboards?filter=is_default%3Dtrue", None);
        if let Some(tb) = tbs["tensorboards"][0]["name"].as_str() {
            let tb = tb.trim_start_matches(&format!("{}/", &LOC[3..])).to_string();
            let (status, list) = s.call("GET", &url(&s, &format!("{tb}/experiments/{id}/runs/default/timeSeries")), None);
            if status == 200 {
                if let Some(name) = list["tensorboardTimeSeries"][0]["name"].as_str() {
                    let sid = name.rsplit('/').next().unwrap_or("").to_string();
                    let read = ok(&s, "GET", &format!("{tb}/experiments/{id}/runs/default/timeSeries/{sid}:read"), None);
                    if read["timeSeriesData"]["values"].as_array().map_or(0, Vec::len) == 3 {
                        break (tb, sid);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(s.get(&name)["state"], "JOB_STATE_RUNNING", "read while the job runs");
    let logs = s.data_dir().join("storage/p/tb-bucket/out/logs");
    let storage = if logs.exists() { logs } else { find_dir(&s.data_dir(), "tb-bucket").join("out/logs") };
    std::fs::write(storage.join("go"), b"").expect("tell the job to go on");
    let ended = s.wait_terminal(&name, 90);
    assert_eq!(ended["state"], "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = ok(&s, "GET", &format!("{tb}/experiments/{id}/runs/default/timeSeries/{series}:read"), None);
        let values: Vec<(String, f64)> = read["timeSeriesData"]["values"]
            .as_array()
            .map(|v| v.iter().map(|p| (p["step"].as_str().unwrap_or("").to_string(), p["scalar"]["value"].as_f64().unwrap_or(0.0))).collect())
            .unwrap_or_default();
        let eval = s.call("GET", &url(&s, &format!("{tb}/experiments/{id}/runs/eval/timeSeries")), None).1;
        if values.len() == 5 && eval["tensorboardTimeSeries"][0]["displayName"] == "accuracy" {
            // simple_value is a float32.
            assert_eq!(values[4].0, "5");
            assert!((values[4].1 - 0.2).abs() < 1e-6, "{values:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{values:?} {eval}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = s.logs_text(&name);
    for (file, why) in [("bad.tfevents", "at most"), ("link.tfevents", "not a regular file"), ("fifo.tfevents", "not a regular file")] {
        let line = text.lines().find(|l| l.contains(&format!("event file {file} is skipped"))).unwrap_or_else(|| panic!("no line for {file}:\n{text}"));
        assert!(line.contains(why), "{line}");
        assert_eq!(text.matches(&format!("event file {file} is skipped")).count(), 1, "said once: {text}");
    }
    let experiment = ok(&s, "GET", &format!("{tb}/experiments/{id}"), None);
    assert_eq!(experiment["displayName"], "tb-writer");
}

/// The directory named `name` below `root` (the storage root's layout is the server's).
fn find_dir(root: &std::path::Path, name: &str) -> std::path::PathBuf {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name() == name {
                    return p;
                }
                stack.push(p);
            }
        }
    }
    panic!("no directory {name} below {}", root.display())
}

/// Projects are apart as for jobs: another project's token may not read or write this
/// project's records, a read-only token may not write them, and a name of another
/// project's record in a body is refused naming it.
#[test]
fn records_of_a_project_are_out_of_other_projects_reach() {
    const A: &str = "records-token-a-5d1f0c";
    const B: &str = "records-token-b-9e27aa";
    const RO: &str = "records-token-ro-33c1d8";
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{A}\"\nprojects = [\"pa\"]\n\n[[tokens]]\ntoken = \"{B}\"\nprojects = [\"pb\"]\n\n\
             [[tokens]]\ntoken = \"{RO}\"\nprojects = [\"pa\"]\naccess = \"read-only\"\n"
        ),
    )
    .expect("tokens");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_idle_connections(0).build().into();
    let call = |method: &str, project: &str, path: &str, token: &str, body: Option<Value>| -> (u16, Value) {
        let url = s.url(&format!("/v1/projects/{project}/locations/us-central1/{path}"));
        let req = ureq::http::Request::builder().method(method).uri(&url).header("Authorization", format!("Bearer {token}")).header("Content-Type", "application/json");
        let mut resp = agent.run(req.body(body.map(|b| b.to_string()).unwrap_or_default()).expect("request")).expect("send");
        let status = resp.status().as_u16();
        (status, serde_json::from_str(&resp.body_mut().read_to_string().unwrap_or_default()).unwrap_or(Value::Null))
    };
    let (st, v) = call("POST", "pa", "metadataStores/default/artifacts?artifactId=secret", A, Some(json!({"schemaTitle": "system.Model", "uri": "gs://pa/model"})));
    assert_eq!(st, 200, "{v}");
    let (st, _) = call("POST", "pb", "metadataStores/default/contexts?contextId=mine", B, Some(json!({})));
    assert_eq!(st, 200);
    // B's token on A's project: refused; A's record named in B's project: not found.
    assert_eq!(call("GET", "pa", "metadataStores/default/artifacts/secret", B, None).0, 403);
    assert_eq!(call("GET", "pa", "metadataStores/default/artifacts", B, None).0, 403);
    assert_eq!(call("GET", "pb", "metadataStores/default/artifacts/secret", B, None).0, 404);
    let (st, v) = call("GET", "pb", "metadataStores/default/artifacts", B, None);
    assert_eq!((st, v.get("artifacts")), (200, None), "{v}");
    // A's artifact put into B's context through B's project: refused naming it, nothing changed.
    let (st, v) = call(
        "POST",
        "pb",
        "metadataStores/default/contexts/mine:addContextArtifactsAndExecutions",
        B,
        Some(json!({"artifacts": ["projects/pa/locations/us-central1/metadataStores/default/artifacts/secret"]})),
    );
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("projects/pa/locations/us-central1/metadataStores/default/artifacts/secret"), "{v}");
    let (_, lineage) = call("GET", "pb", "metadataStores/default/contexts/mine:queryContextLineageSubgraph", B, None);
    assert_eq!(lineage, json!({}), "nothing of A's in B's context");
    // The read-only token reads A's records and may not write them.
    assert_eq!(call("GET", "pa", "metadataStores/default/artifacts/secret", RO, None).0, 200);
    assert_eq!(call("DELETE", "pa", "metadataStores/default/artifacts/secret", RO, None).0, 403);
    assert_eq!(call("POST", "pa", "tensorboards", RO, Some(json!({"displayName": "x"}))).0, 403);
    assert_eq!(call("GET", "pa", "metadataStores/default/artifacts/secret", A, None).1["uri"], "gs://pa/model");
}
