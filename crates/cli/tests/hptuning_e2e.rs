//! HyperparameterTuningJobs end to end: trials are CustomJobs run under the lifecycle
//! rules, with their hyperparameters as arguments and metrics from the metric file.

mod common;

use common::*;
use serde_json::{json, Value};

/// A trial program that reports `accuracy = 1 - (x - 0.3)^2` at three steps, in the
/// cloudml-hypertune file format, and prints its trial id.
const TRIAL: &str = r#"
import json, os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
x = float(args["x"]); layers = int(args["layers"]); act = args["act"]
print("trial", os.environ["CLOUD_ML_TRIAL_ID"], "x", x, "layers", layers, "act", act, "out", os.environ.get("AIP_MODEL_DIR", ""))
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
lines = []
for step in (1, 2, 3):
    acc = 1 - (x - 0.3) ** 2 - 0.01 * (3 - step)
    lines.append(json.dumps({"global_step": str(step), "accuracy": str(acc), "timestamp": time.time(), "trial": os.environ["CLOUD_ML_TRIAL_ID"]}))
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    time.sleep(0.1)
"#;

fn study(algorithm: &str, max: i64, parallel: i64) -> Value {
    json!({
        "displayName": "tune",
        "studySpec": {
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [
                {"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}, "scaleType": "UNIT_LINEAR_SCALE"},
                {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "4"}},
                {"parameterId": "act", "categoricalValueSpec": {"values": ["relu", "tanh"]}}
            ],
            "algorithm": algorithm
        },
        "maxTrialCount": max,
        "parallelTrialCount": parallel,
        "trialJobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", TRIAL], "args": ["--epochs=1"]}
            }],
            "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/tune"}
        }
    })
}

fn studies_url(s: &Server, project: &str) -> String {
    s.url(&format!("/v1/projects/{project}/locations/us-central1/hyperparameterTuningJobs"))
}

fn wait_study(s: &Server, name: &str, secs: u64) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (st, j) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
        assert_eq!(st, 200, "{j}");
        if matches!(j["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED")) {
            return j;
        }
        assert!(std::time::Instant::now() < deadline, "study did not end: {j:#}\n{}", s.server_log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn random_search_study_runs_trials() {
    let s = Server::start("");
    let (st, created) = s.call("POST", &studies_url(&s, "p"), Some(&study("RANDOM_SEARCH", 4, 2).to_string()));
    assert_eq!(st, 200, "{created}");
    let name = created["name"].as_str().unwrap().to_string();
    let done = wait_study(&s, &name, 90);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4);
    for t in trials {
        assert_eq!(t["state"], "SUCCEEDED", "{t:#}");
        let params: Vec<&str> = t["parameters"].as_array().unwrap().iter().map(|p| p["parameterId"].as_str().unwrap()).collect();
        assert_eq!(params, ["act", "layers", "x"]);
        assert_eq!(t["finalMeasurement"]["stepCount"], "3");
        assert_eq!(t["measurements"].as_array().unwrap().len(), 3);
        let job = t["customJob"].as_str().unwrap();
        let logs = s.logs_text(job);
        assert!(logs.contains(&format!("trial {}", t["id"].as_str().unwrap())), "{logs}");
        assert!(logs.contains(&format!("/tune/{}/model/", t["id"].as_str().unwrap())), "per-trial output dir: {logs}");
        assert_eq!(s.get(job)["state"], "JOB_STATE_SUCCEEDED");
    }
    // list omits trials.
    let (_, list) = s.call("GET", &studies_url(&s, "p"), None);
    assert!(list["hyperparameterTuningJobs"][0].get("trials").is_none(), "{list}");
    assert_eq!(list["hyperparameterTuningJobs"][0]["name"], name.as_str());
    // Numeric enums.
    let (_, ints) = s.call("GET", &format!("{}?%24alt=json%3Benum-encoding%3Dint", s.url(&format!("/v1/{name}"))), None);
    assert_eq!(ints["state"], 4);
    assert_eq!(ints["trials"][0]["state"], 4);
    assert_eq!(ints["studySpec"]["metrics"][0]["goal"], 1);
    // Delete: the tuning job's trials' CustomJobs go with it, their logs and run
    // directories too, as a pipeline's CustomJob goes with the pipeline.
    let jobs: Vec<String> = trials.iter().map(|t| t["customJob"].as_str().unwrap().to_string()).collect();
    let (st, op) = s.call("DELETE", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(st, 200, "{op}");
    assert_eq!(op["done"], true);
    for job in &jobs {
        let (st, body) = s.call("GET", &s.url(&format!("/v1/{job}")), None);
        assert_eq!(st, 404, "the trial's CustomJob {job} outlived its tuning job: {body}");
        let id: u64 = job.rsplit('/').next().unwrap().parse().unwrap();
        let runs = s.data_dir().join("runs").join(id.to_string());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while runs.exists() {
            assert!(std::time::Instant::now() < deadline, "{} is still there", runs.display());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let (_, list) = s.call("GET", &s.jobs_url("p"), None);
    assert!(list.get("customJobs").is_none(), "trial jobs are still listed: {list}");
}

#[test]
fn bayesian_study_and_bad_input() {
    let s = Server::start("");
    let (st, created) = s.call("POST", &studies_url(&s, "p"), Some(&study("ALGORITHM_UNSPECIFIED", 3, 1).to_string()));
    assert_eq!(st, 200, "{created}");
    // Bad input: clear errors naming the field, nothing stored.
    let mut bad = study("GRID_SEARCH", 3, 1);
    let (st, b) = s.call("POST", &studies_url(&s, "q"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("GRID_SEARCH") && b["error"]["message"].as_str().unwrap().contains("parameters[0]"), "{b}");
    bad = study("RANDOM_SEARCH", 3, 1);
    bad["studySpec"]["parameters"][0]["doubleValueSpec"] = json!({"minValue": 2.0, "maxValue": 1.0});
    let (st, b) = s.call("POST", &studies_url(&s, "q"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("studySpec.parameters[0]"), "{b}");
    bad = study("RANDOM_SEARCH", 0, 0);
    let (st, b) = s.call("POST", &studies_url(&s, "q"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("maxTrialCount"), "{b}");
    bad = study("RANDOM_SEARCH", 2, 3);
    let (st, b) = s.call("POST", &studies_url(&s, "q"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("parallelTrialCount"), "{b}");
    bad = study("RANDOM_SEARCH", 2, 1);
    bad["trialJobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"] = json!("n9-giant");
    let (st, b) = s.call("POST", &studies_url(&s, "q"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("trialJobSpec.workerPoolSpecs[0].machineSpec.machineType"), "{b}");
    let (_, list) = s.call("GET", &studies_url(&s, "q"), None);
    assert!(list.get("hyperparameterTuningJobs").is_none());
    let done = wait_study(&s, created["name"].as_str().unwrap(), 90);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    assert_eq!(done["trials"].as_array().unwrap().len(), 3);
}

/// L23: a server killed during a study resumes it without losing or repeating a trial.
#[test]
fn l23_study_survives_server_kill() {
    let mut s = Server::start("");
    let (_, created) = s.call("POST", &studies_url(&s, "p"), Some(&study("RANDOM_SEARCH", 4, 2).to_string()));
    let name = created["name"].as_str().unwrap().to_string();
    // Wait for the first trial to end, then kill the server.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, j) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
        if j["trials"].as_array().is_some_and(|t| t.iter().any(|t| t["state"] == "SUCCEEDED")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    s.kill9();
    std::thread::sleep(std::time::Duration::from_millis(500));
    s.spawn();
    let done = wait_study(&s, &name, 90);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "no trial lost or repeated: {done:#}");
    let jobs: std::collections::BTreeSet<&str> = trials.iter().map(|t| t["customJob"].as_str().unwrap()).collect();
    assert_eq!(jobs.len(), 4, "each trial has its own job");
    // Exactly four trial jobs were ever created.
    let (_, list) = s.call("GET", &s.jobs_url("p"), None);
    assert_eq!(list["customJobs"].as_array().unwrap().len(), 4, "{list:#}");
}

/// Median automated stopping: with three trials done, a trial whose measurements are
/// clearly worse than theirs is stopped (STOPPING, then SUCCEEDED with its last
/// measurement), and its job is cancelled.
#[test]
fn median_stopping_stops_a_clearly_worse_trial() {
    let s = Server::start("");
    // Each trial reports `accuracy = q` at steps 1..8, 0.4 s apart.
    let program = curve_program("accuracy", "q", 8, 0.4);
    let body = json!({
        "displayName": "stopping",
        "studySpec": {
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "q", "discreteValueSpec": {"values": [0.9, 0.8, 0.85, 0.1]}}],
            "algorithm": "GRID_SEARCH",
            "medianAutomatedStoppingSpec": {}
        },
        "maxTrialCount": 4,
        "parallelTrialCount": 1,
        "trialJobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", program]}
        }]}
    });
    let (st, created) = s.call("POST", &studies_url(&s, "p"), Some(&body.to_string()));
    assert_eq!(st, 200, "{created}");
    let done = wait_study(&s, created["name"].as_str().unwrap(), 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    let last = &trials[3];
    assert_eq!(last["parameters"][0]["value"], 0.1);
    assert_eq!(last["state"], "SUCCEEDED", "{last:#}");
    let steps: i64 = last["finalMeasurement"]["stepCount"].as_str().unwrap().parse().unwrap();
    assert!(steps < 8, "stopped before its end: {last:#}");
    assert_eq!(s.get(last["customJob"].as_str().unwrap())["state"], "JOB_STATE_CANCELLED");
    // The early stop is marked on the trial (its job shows CANCELLED for it), and the
    // trials' jobs carry the tuning job's id, so that lists can leave them out.
    assert_eq!(last["trainyardStoppedEarly"], true, "{last:#}");
    let study_id = created["name"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
    for t in &trials[..3] {
        assert_eq!(t["finalMeasurement"]["stepCount"], "8", "{t:#}");
        assert!(t.get("trainyardStoppedEarly").is_none(), "{t:#}");
        assert_eq!(s.get(t["customJob"].as_str().unwrap())["labels"]["trainyard_study"], study_id.as_str());
    }
    let (_, hidden) = s.call("GET", &format!("{}?filter=NOT%20labels.trainyard_study%3A*", s.jobs_url("p")), None);
    assert!(hidden.get("customJobs").is_none(), "only trials here: {hidden}");
}

/// A trial program for `python3 -c`: it reads its `--q=` argument and writes `metric =
/// value` (a Python expression of `q` and `step`) to its metric file at steps 1..=steps,
/// `sleep` seconds apart, as `cloudml-hypertune` does (the whole file rewritten each time).
fn curve_program(metric: &str, value: &str, steps: u32, sleep: f64) -> String {
    format!(
        r#"
import json, os, sys, time
q = float([a for a in sys.argv if a.startswith("--q=")][0][4:])
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
lines = []
for step in range(1, {end}):
    lines.append(json.dumps({{"global_step": str(step), "{metric}": str({value}), "trial": os.environ["CLOUD_ML_TRIAL_ID"]}}))
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    time.sleep({sleep})
"#,
        end = steps + 1
    )
}

/// The multi-fidelity mode (label `trainyard-multi-fidelity: successive-halving`): trials
/// report a loss at steps 1..27; once three trials have run to the end (the horizon, 27,
/// is learnt from them), a later trial behind the best third at a rung (1, 3, 9) is
/// stopped (at the first reading of its metric file past that rung) and ends with its
/// last measurement. A mode it does not know is refused, naming the label, and nothing is
/// created.
#[test]
fn multi_fidelity_label_stops_trials_by_successive_halving() {
    let s = Server::start("");
    let program = curve_program("loss", "q + 1.0 / step", 27, 0.1);
    let body = json!({
        "displayName": "halving",
        "labels": {"trainyard-multi-fidelity": "successive-halving"},
        "studySpec": {
            "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": "q", "discreteValueSpec": {"values": [0.1, 0.2, 0.3, 0.9, 0.4]}}],
            "algorithm": "GRID_SEARCH"
        },
        "maxTrialCount": 5,
        "parallelTrialCount": 1,
        "trialJobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", program]}
        }]}
    });
    let mut bad = body.clone();
    bad["labels"]["trainyard-multi-fidelity"] = json!("hyperband-ish");
    let (st, err) = s.call("POST", &studies_url(&s, "p"), Some(&bad.to_string()));
    assert_eq!(st, 400, "{err}");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("labels.trainyard-multi-fidelity"), "{err}");
    let (_, none) = s.call("GET", &studies_url(&s, "p"), None);
    assert!(none.get("hyperparameterTuningJobs").is_none(), "nothing created: {none}");
    let (st, created) = s.call("POST", &studies_url(&s, "p"), Some(&body.to_string()));
    assert_eq!(st, 200, "{created}");
    let done = wait_study(&s, created["name"].as_str().unwrap(), 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 5, "{done:#}");
    let steps = |t: &Value| -> i64 { t["finalMeasurement"]["stepCount"].as_str().unwrap_or("0").parse().unwrap_or(0) };
    for t in &trials[..3] {
        assert_eq!(steps(t), 27, "ran to the end: {t:#}");
        assert!(t.get("trainyardStoppedEarly").is_none(), "{t:#}");
    }
    for t in &trials[3..] {
        assert_eq!(t["trainyardStoppedEarly"], true, "{t:#}");
        assert!(steps(t) < 27, "stopped before the end: {t:#}");
        assert_eq!(t["state"], "SUCCEEDED", "{t:#}");
    }
    assert_eq!(done["trials"][0]["parameters"][0]["value"], 0.1);
}

/// Cancel stops the running trials; the study ends CANCELLED and nothing keeps running.
#[test]
fn cancel_stops_running_trials() {
    let s = Server::start("");
    let mut body = study("RANDOM_SEARCH", 4, 2);
    let tag = 310_000 + free_port() as u32;
    body["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = json!(["sh", "-c", format!("sleep {tag}"), "sh"]);
    let (_, created) = s.call("POST", &studies_url(&s, "p"), Some(&body.to_string()));
    let name = created["name"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pids_with(&format!("sleep {tag}")).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "two trials should run");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (st, b) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(st, 200, "{b}");
    let done = wait_study(&s, &name, 30);
    assert_eq!(done["state"], "JOB_STATE_CANCELLED");
    assert_eq!(done["error"]["code"], 1);
    for t in done["trials"].as_array().unwrap() {
        let job = s.wait_terminal(t["customJob"].as_str().unwrap(), 30);
        assert_eq!(job["state"], "JOB_STATE_CANCELLED");
    }
    assert!(pids_with(&format!("sleep {tag}")).is_empty());
    let (st, b) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["error"]["status"], "FAILED_PRECONDITION");
}

/// A trial program reporting two metrics, one per line as cloudml-hypertune writes them:
/// `accuracy` (peaks at x = 0.3) and `memory_gb` (16 * x + 4, so x > 0.75 crosses 16 GB).
const TWO_METRICS: &str = r#"
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
x = float(args["x"])
lines = [
    json.dumps({"global_step": "1", "accuracy": str(1 - (x - 0.3) ** 2), "trial": os.environ["CLOUD_ML_TRIAL_ID"]}),
    json.dumps({"global_step": "1", "memory_gb": str(16 * x + 4), "trial": os.environ["CLOUD_ML_TRIAL_ID"]}),
]
with open(os.environ["CLOUD_ML_HP_METRIC_FILE"], "w") as f:
    f.write("\n".join(lines) + "\n")
"#;

/// A study with a safety metric: every trial's final measurement holds both metrics,
/// and the safety metric is not the one optimised (the first objective is).
#[test]
fn a_safety_metric_is_read_and_shown_with_the_objective() {
    let s = Server::start("");
    let mut body = study("RANDOM_SEARCH", 3, 3);
    body["studySpec"]["metrics"] = json!([
        {"metricId": "memory_gb", "goal": "MINIMIZE", "safetyConfig": {"safetyThreshold": 16}},
        {"metricId": "accuracy", "goal": "MAXIMIZE"}
    ]);
    body["studySpec"]["parameters"] = json!([{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}]);
    body["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = json!(["python3", "-c", TWO_METRICS]);
    let (st, created) = s.call("POST", &studies_url(&s, "p"), Some(&body.to_string()));
    assert_eq!(st, 200, "{created}");
    let done = wait_study(&s, created["name"].as_str().unwrap_or_default(), 90);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    for t in done["trials"].as_array().expect("trials") {
        assert_eq!(t["state"], "SUCCEEDED", "{t:#}");
        let x = t["parameters"][0]["value"].as_f64().expect("x");
        let metrics = t["finalMeasurement"]["metrics"].as_array().expect("metrics");
        let value = |id: &str| metrics.iter().find(|m| m["metricId"] == id).and_then(|m| m["value"].as_f64());
        assert_eq!(metrics[0]["metricId"], "accuracy", "the objective first: {t:#}");
        assert!((value("accuracy").expect("accuracy") - (1.0 - (x - 0.3f64).powi(2))).abs() < 1e-9, "{t:#}");
        assert!((value("memory_gb").expect("memory_gb") - (16.0 * x + 4.0)).abs() < 1e-9, "{t:#}");
    }
    assert!(!s.server_log().contains("skipped"), "no metric line is malformed:\n{}", s.server_log());
}
