//! `trainingPipelines` of the custom task, as the SDK's training classes create them: one
//! CustomJob run under the lifecycle rules, linked in `trainingTaskMetadata`; states
//! followed, cancel and delete cascaded, and L23 across a SIGKILL of the server.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const CUSTOM_TASK: &str = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml";

/// The body `CustomContainerTrainingJob.run()` sends (measured): a Struct, numbers as
/// doubles, cases mixed.
fn sdk_pipeline(name: &str, script: &str) -> Value {
    json!({
        "displayName": name,
        "trainingTaskDefinition": CUSTOM_TASK,
        "trainingTaskInputs": {"worker_pool_specs": [{
            "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", script]},
            "machine_spec": {"machine_type": "n1-standard-4"},
            "disk_spec": {"boot_disk_size_gb": 100.0, "boot_disk_type": "pd-ssd"},
            "replica_count": 1.0}],
          "base_output_directory": {"output_uri_prefix": "gs://bucket/pipeline-out"}}
    })
}

fn pipelines_url(s: &Server, project: &str) -> String {
    s.url(&format!("/v1/projects/{project}/locations/us-central1/trainingPipelines"))
}

fn create(s: &Server, project: &str, body: &Value) -> Value {
    let body = in_test_image(body.clone());
    let (status, v) = s.call("POST", &pipelines_url(s, project), Some(&body.to_string()));
    assert_eq!(status, 200, "{v}");
    v
}

fn get(s: &Server, name: &str) -> Value {
    let (status, v) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(status, 200, "{v}");
    v
}

fn wait_state(s: &Server, name: &str, want: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = get(s, name);
        if v["state"] == want {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{name} never reached {want}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pipeline runs its CustomJob to the end and follows it: PENDING, RUNNING, SUCCEEDED
/// (4 with `enum-encoding=int`, as the SDK polls), the job named in trainingTaskMetadata.
#[test]
fn a_pipeline_runs_its_custom_job_and_follows_it() {
    let s = Server::start("");
    let p = create(&s, "p", &sdk_pipeline("train", "echo training; sleep 0.5; echo done"));
    let name = p["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("projects/p/locations/us-central1/trainingPipelines/"), "{p}");
    assert!(matches!(p["state"].as_str(), Some("PIPELINE_STATE_PENDING" | "PIPELINE_STATE_RUNNING")), "{p}");
    let done = wait_state(&s, &name, "PIPELINE_STATE_SUCCEEDED");
    assert!(done["startTime"].is_string() && done["endTime"].is_string(), "{done}");
    let job = done["trainingTaskMetadata"]["backingCustomJob"].as_str().expect("backing job").to_string();
    let j = s.get(&job);
    assert_eq!(j["state"], "JOB_STATE_SUCCEEDED");
    assert_eq!(j["jobSpec"]["workerPoolSpecs"][0]["replicaCount"], "1");
    assert!(s.logs_text(&job).contains("done"));
    let (_, ints) = s.call("GET", &s.url(&format!("/v1/{name}?$alt=json;enum-encoding=int")), None);
    assert_eq!(ints["state"], 4, "{ints}");
    let (_, list) = s.call("GET", &pipelines_url(&s, "p"), None);
    assert_eq!(list["trainingPipelines"][0]["name"], name.as_str(), "{list}");
    // Delete cascades to the CustomJob.
    let (status, op) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(status, 200, "{op}");
    assert_eq!(s.call("GET", &s.url(&format!("/v1/{name}")), None).0, 404);
    assert_eq!(s.call("GET", &s.url(&format!("/v1/{job}")), None).0, 404);
}

/// A failing training script: FAILED with the job's error; a cancel: the job is cancelled
/// and the pipeline CANCELLED.
#[test]
fn failure_and_cancel_reach_the_pipeline() {
    let s = Server::start("");
    let bad = create(&s, "p", &sdk_pipeline("bad", "echo 'ValueError: boom' >&2; exit 3"));
    let v = wait_state(&s, bad["name"].as_str().unwrap(), "PIPELINE_STATE_FAILED");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("boom"), "{v}");
    let long = create(&s, "p", &sdk_pipeline("long", "sleep 300"));
    let name = long["name"].as_str().unwrap().to_string();
    wait_state(&s, &name, "PIPELINE_STATE_RUNNING");
    let (status, _) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 200);
    let v = wait_state(&s, &name, "PIPELINE_STATE_CANCELLED");
    let job = v["trainingTaskMetadata"]["backingCustomJob"].as_str().unwrap();
    assert_eq!(s.get(job)["state"], "JOB_STATE_CANCELLED");
    let (status, e) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 400, "{e}");
}

/// L23: a pipeline survives a SIGKILL of the server: its job is adopted, not created
/// twice, and the pipeline ends by it.
#[test]
fn l23_a_pipeline_survives_a_server_kill() {
    let mut s = Server::start("");
    let p = create(&s, "p", &sdk_pipeline("survive", "sleep 2; echo finished"));
    let name = p["name"].as_str().unwrap().to_string();
    wait_state(&s, &name, "PIPELINE_STATE_RUNNING");
    s.restart();
    let done = wait_state(&s, &name, "PIPELINE_STATE_SUCCEEDED");
    let job = done["trainingTaskMetadata"]["backingCustomJob"].as_str().unwrap();
    assert_eq!(s.logs_text(job).matches("finished").count(), 1);
    let (_, jobs) = s.call("GET", &s.jobs_url("p"), None);
    assert_eq!(jobs["customJobs"].as_array().map(Vec::len), Some(1), "one CustomJob: {jobs}");
}

/// Bad input: another task definition, a model to upload, a broken spec: 400 naming the
/// field, nothing stored.
#[test]
fn bad_pipelines_are_refused_naming_the_field() {
    let s = Server::start("");
    let mut b = sdk_pipeline("x", "true");
    b["trainingTaskDefinition"] = json!("gs://google-cloud-aiplatform/schema/trainingjob/definition/automl_tabular_1.0.0.yaml");
    let mut m = sdk_pipeline("x", "true");
    m["modelToUpload"] = json!({"displayName": "m", "containerSpec": {"imageUri": "x"}});
    let mut w = sdk_pipeline("x", "true");
    w["trainingTaskInputs"]["worker_pool_specs"][0]["machine_spec"]["machine_type"] = json!("no-such-type");
    for (body, want) in [(b, "trainingTaskDefinition"), (m, "modelToUpload"), (w, "trainingTaskInputs.workerPoolSpecs[0]")] {
        let (status, e) = s.call("POST", &pipelines_url(&s, "p"), Some(&body.to_string()));
        assert_eq!(status, 400, "{e}");
        assert!(e["error"]["message"].as_str().unwrap_or("").contains(want), "{want}: {e}");
    }
    let (_, list) = s.call("GET", &pipelines_url(&s, "p"), None);
    assert!(list["trainingPipelines"].as_array().is_none_or(|a| a.is_empty()), "{list}");
    let (_, jobs) = s.call("GET", &s.jobs_url("p"), None);
    assert!(jobs["customJobs"].as_array().is_none_or(|a| a.is_empty()), "{jobs}");
}
