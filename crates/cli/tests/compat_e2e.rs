//! A database written by an earlier release opens with this one: every job and tuning job
//! is there with its state, labels and logs, jobs that were running or waiting go on by
//! the rules, and ended jobs can be deleted. Each fixture (`fixtures/store-schemaN.db`,
//! with the states it holds in `fixtures/store-schemaN.json`) was written through the API
//! by the release with database schema N: schema 2 (record format 1) was the first one in
//! users' hands, schema 4 (usage accounting) the one of this series; older ones are
//! migrated on open. Keep them as they are, and add a fixture for each later schema or
//! record format.
//!
//! `TRAINYARD_FIXTURE_BIN=<that release's trainyard> TRAINYARD_FIXTURE=store-schemaN cargo
//! test -p trainyard --test compat_e2e -- --ignored write_fixture` writes one (with the
//! binary of the release that the fixture stands for).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// What a fixture holds: display name -> state, for custom jobs and tuning jobs.
fn manifest(fixture: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(format!("{fixture}.json"))).expect("fixture manifest");
    serde_json::from_str(&text).expect("manifest JSON")
}

fn all(s: &Server, project: &str, collection: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let url = s.url(&format!("/v1/projects/{project}/locations/us-central1/{collection}?pageSize=2&pageToken={token}"));
        let (status, body) = s.call("GET", &url, None);
        assert_eq!(status, 200, "{body}");
        out.extend(body[collection].as_array().cloned().unwrap_or_default());
        match body["nextPageToken"].as_str() {
            Some(t) => token = t.to_string(),
            None => return out,
        }
    }
}

/// L23 across releases: a database of the schema-2 release is read whole by this one.
#[test]
fn l23_database_of_an_earlier_release_opens_and_goes_on() {
    opens_and_goes_on("store-schema2");
}

/// L23 across releases: a database of the schema-4 release (usage accounting) too.
#[test]
fn l23_database_of_the_schema_4_release_opens_and_goes_on() {
    opens_and_goes_on("store-schema4");
}

/// A downgrade: a database of a newer release is refused at start, naming both schema
/// versions, and left as it is.
#[test]
fn a_database_of_a_newer_release_is_refused_naming_both_versions() {
    let mut s = Server::prepare("");
    let data = s.data_dir();
    std::fs::create_dir_all(&data).unwrap();
    let db = data.join("trainyard.db");
    std::fs::copy(fixtures().join("store-schema4.db"), &db).unwrap();
    rusqlite::Connection::open(&db).unwrap().pragma_update(None, "user_version", 99).unwrap();
    let before = std::fs::read(&db).unwrap();
    let err = s.try_spawn().expect_err("a newer database must be refused");
    assert!(err.contains("schema version 99") && err.contains(&format!("knows ({})", trainyard_store::SCHEMA_VERSION)), "{err}");
    assert!(std::fs::read(&db).unwrap() == before, "the database is left as it is");
}

fn opens_and_goes_on(fixture: &str) {
    let mut s = Server::prepare("[quotas.default]\ncustom_model_training_cpus = 1000\n");
    let data = s.data_dir();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(fixtures().join(format!("{fixture}.db")), data.join("trainyard.db")).unwrap();
    // The fixture's live jobs were admitted when it was made, with the default time limit
    // of 7 days (L19): as the fixture ages they would time out on start. Their limit is
    // made to outlast the fixture, so that what the test follows (L10, L18) stays the same.
    let db = rusqlite::Connection::open(data.join("trainyard.db")).unwrap();
    db.execute("UPDATE jobs SET core = json_set(core, '$.policy.timeout', 3153600000000000) WHERE terminal = 0", []).unwrap();
    drop(db);
    s.spawn();
    let m = manifest(fixture);
    let jobs = all(&s, "compat", "customJobs");
    let want = m["customJobs"].as_object().unwrap();
    assert_eq!(jobs.len(), want.len(), "{jobs:#?}");
    for j in &jobs {
        let name = j["displayName"].as_str().unwrap();
        let state = j["state"].as_str().unwrap();
        let expected = want[name].as_str().unwrap();
        match expected {
            "JOB_STATE_QUEUED" => {
                // Waiting for quota in the old server; this config has room: it runs (L3, L5).
                let done = s.wait_terminal(&name_of(j), 30);
                assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
            }
            "JOB_STATE_RUNNING" => {
                // Its run died with the old server's machine: the rules restart it (L10);
                // then it is cancelled like any running job (L18).
                s.wait_for(&name_of(j), 30, |j| j["state"] == "JOB_STATE_RUNNING");
                let (st, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(j))), None);
                assert_eq!(st, 200, "{body}");
                assert_eq!(s.wait_terminal(&name_of(j), 30)["state"], "JOB_STATE_CANCELLED");
            }
            _ => assert_eq!(state, expected, "{name}: {j:#}"),
        }
        if !name.contains("-trial-") {
            assert_eq!(j["labels"]["suite"], "compat", "{j:#}");
        }
        let got = s.get(&name_of(j));
        assert_eq!(got["displayName"], name);
        assert!(s.logs_text(&name_of(j)).contains("Job queued."), "{name}: logs kept");
    }
    let failed = jobs.iter().find(|j| j["displayName"] == "fails").unwrap();
    assert!(failed["error"]["message"].as_str().is_some_and(|m| m.contains("exit")), "{failed:#}");
    let studies = all(&s, "compat", "hyperparameterTuningJobs");
    let want = m["hyperparameterTuningJobs"].as_object().unwrap();
    assert_eq!(studies.len(), want.len());
    for st in &studies {
        let name = st["displayName"].as_str().unwrap();
        assert_eq!(st["state"], want[name], "{st:#}");
        let (status, full) = s.call("GET", &s.url(&format!("/v1/{}", name_of(st))), None);
        assert_eq!(status, 200, "{full}");
        assert!(full["trials"].as_array().is_some_and(|t| !t.is_empty()), "{full:#}");
    }
    // Ended jobs can be deleted.
    let (status, body) = s.call("DELETE", &s.url(&format!("/v1/{}", name_of(failed))), None);
    assert_eq!(status, 200, "{body}");
    // The old database was copied in readable by all (the fixture's mode): upgraded, it
    // and everything beside it are the server's alone.
    assert_private_tree(&data);
}

/// Writes the fixture with this release (see the module docs): ended jobs of each kind,
/// a tuning job, two jobs running (their runs are gone when the fixture is opened: the
/// rules restart them), and one waiting for quota; the server is killed, not stopped.
#[test]
#[ignore = "writes tests/fixtures/$TRAINYARD_FIXTURE.db; run by hand when the format changes"]
fn write_fixture() {
    let fixture = std::env::var("TRAINYARD_FIXTURE").expect("TRAINYARD_FIXTURE=store-schemaN: which fixture this is");
    let mut s = Server::start_with_bin(std::env::var("TRAINYARD_FIXTURE_BIN").ok(), "[quotas.default]\ncustom_model_training_cpus = 8\n");
    let job = |name: &str, script: &str| {
        let mut j = sh_job(name, script);
        j["labels"] = json!({"suite": "compat"});
        j
    };
    let ok = s.create("compat", &job("succeeds", "echo done"));
    let bad = s.create("compat", &job("fails", "echo oops >&2; exit 3"));
    s.wait_terminal(&name_of(&ok), 30);
    s.wait_terminal(&name_of(&bad), 30);
    let long = s.create("compat", &job("cancelled", "sleep 60"));
    s.wait_for(&name_of(&long), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let (st, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&long))), None);
    assert_eq!(st, 200, "{body}");
    s.wait_terminal(&name_of(&long), 30);
    let study = json!({
        "displayName": "tune", "labels": {"suite": "compat"},
        "studySpec": {"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}],
                      "algorithm": "RANDOM_SEARCH"},
        "maxTrialCount": 1, "parallelTrialCount": 1,
        "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "echo '{\"m\": 0.5}' > \"$CLOUD_ML_HP_METRIC_FILE\""]}}]}
    });
    let (status, body) = s.call("POST", &s.url("/v1/projects/compat/locations/us-central1/hyperparameterTuningJobs"), Some(&study.to_string()));
    assert_eq!(status, 200, "{body}");
    let study_name = body["name"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, st) = s.call("GET", &s.url(&format!("/v1/{study_name}")), None);
        if st["state"] == "JOB_STATE_SUCCEEDED" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{st:#}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The trial's own CustomJob carries the study's labels too.
    let h1 = s.create("compat", &job("running-1", "sleep 600"));
    let h2 = s.create("compat", &job("running-2", "sleep 600"));
    for h in [&h1, &h2] {
        s.wait_for(&name_of(h), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    }
    let queued = s.create("compat", &job("queued", "echo later"));
    assert_eq!(s.get(&name_of(&queued))["state"], "JOB_STATE_QUEUED");
    // A crash, not a clean stop; then fold the WAL into the file and keep the file.
    let data = s.data_dir();
    s.kill9();
    std::fs::create_dir_all(fixtures()).unwrap();
    let db = fixtures().join(format!("{fixture}.db"));
    for ext in ["", "-wal", "-shm"] {
        let from = data.join(format!("trainyard.db{ext}"));
        if from.exists() {
            std::fs::copy(&from, fixtures().join(format!("{fixture}.db{ext}"))).unwrap();
        }
    }
    drop(s);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    conn.execute_batch("VACUUM").unwrap();
    drop(conn);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mut m = json!({"customJobs": {}, "hyperparameterTuningJobs": {}});
    let mut st = conn.prepare("SELECT kind, display_name, state FROM jobs").unwrap();
    let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))).unwrap();
    for row in rows {
        let (kind, name, state) = row.unwrap();
        let key = if kind == "custom" { "customJobs" } else { "hyperparameterTuningJobs" };
        m[key][name] = json!(state);
    }
    std::fs::write(fixtures().join(format!("{fixture}.json")), serde_json::to_string_pretty(&m).unwrap() + "\n").unwrap();
}
