//! L23 for a study's actions: a study that ended while its trial job ran (its commit made,
//! the stop of the trial lost with the server) stops that trial job when the server starts
//! again. The crash is made exact by writing the committed state into the database while
//! the server is down.

mod common;

use common::*;
use serde_json::json;

/// L23: a trial job whose study has ended is cancelled at the next start.
#[test]
fn l23_a_trial_of_an_ended_study_is_stopped_after_a_crash() {
    let mut s = Server::start("");
    let study = json!({
        "displayName": "orphan",
        "studySpec": {"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}],
                      "algorithm": "RANDOM_SEARCH"},
        "maxTrialCount": 1, "parallelTrialCount": 1,
        "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "sleep 600", "--"]}}]}
    });
    let (status, body) = s.call("POST", &s.url("/v1/projects/p/locations/us-central1/hyperparameterTuningJobs"), Some(&study.to_string()));
    assert_eq!(status, 200, "{body}");
    // The trial's CustomJob runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let trial_job = loop {
        let (_, list) = s.call("GET", &s.jobs_url("p"), None);
        if let Some(j) = list["customJobs"].as_array().and_then(|a| a.iter().find(|j| j["state"] == "JOB_STATE_RUNNING")) {
            break name_of(j);
        }
        assert!(std::time::Instant::now() < deadline, "no running trial job: {list}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    s.kill9();
    // What a crash right after the study's cancel was committed leaves: the study ended,
    // its trial job still live.
    let db = s.data_dir().join("trainyard.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let n = conn
        .execute("UPDATE jobs SET terminal = 1, state = 'JOB_STATE_CANCELLED' WHERE kind = 'hptuning'", [])
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    s.spawn();
    let done = s.wait_terminal(&trial_job, 30);
    assert_eq!(done["state"], "JOB_STATE_CANCELLED", "{done:#}");
    assert!(s.logs_text(&trial_job).contains("cancel"), "the cancel is in the job's log");
}
