//! The Vizier API end to end over REST: a client that runs its own training loop asks a
//! study for trials, reports measurements and completes them, and finds the best trial;
//! early stopping, lookup, delete, refused inputs, and a kill -9 in the middle.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const PROJECT: &str = "vz";

fn base(s: &Server) -> String {
    s.url(&format!("/v1/projects/{PROJECT}/locations/us-central1"))
}

/// POST `path` (under the location) with `body`; (status, answer).
fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    s.call("POST", &format!("{}/{path}", base(s)), Some(&body.to_string()))
}

fn get(s: &Server, path: &str) -> (u16, Value) {
    s.call("GET", &format!("{}/{path}", base(s)), None)
}

/// The study the tests tune: a quadratic bowl in `x` and `units`, a little worse with sgd.
fn spec(extra: Value) -> Value {
    let mut spec = json!({
        "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
        "parameters": [
            {"parameterId": "x", "doubleValueSpec": {"minValue": -5.0, "maxValue": 5.0}},
            {"parameterId": "units", "integerValueSpec": {"minValue": "1", "maxValue": "64"}},
            {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}}
        ]
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    spec
}

fn loss(params: &Value) -> f64 {
    let p = |id: &str| params.as_array().and_then(|a| a.iter().find(|p| p["parameterId"] == id)).map(|p| p["value"].clone()).unwrap_or(Value::Null);
    let x = p("x").as_f64().expect("x is a number");
    let units = p("units").as_i64().expect("units is an integer") as f64;
    let sgd = if p("opt") == "sgd" { 0.1 } else { 0.0 };
    (x - 1.3).powi(2) + (units - 20.0).powi(2) / 400.0 + sgd
}

fn create_study(s: &Server, name: &str, extra: Value) -> String {
    let (status, study) = post(s, "studies", json!({"displayName": name, "studySpec": spec(extra)}));
    assert_eq!(status, 200, "{study}");
    assert_eq!(study["state"], "ACTIVE", "{study}");
    let id = study["name"].as_str().and_then(|n| n.rsplit('/').next()).expect("name").to_string();
    assert!(id.parse::<u64>().is_ok(), "a numeric study id: {study}");
    id
}

/// Suggest `n` trials for `client`; the Operation is polled by its name until done.
fn suggest(s: &Server, study: &str, client: &str, n: i64) -> (Value, Vec<Value>) {
    let (status, mut op) = post(s, &format!("studies/{study}/trials:suggest"), json!({"suggestionCount": n, "clientId": client}));
    assert_eq!(status, 200, "{op}");
    let name = op["name"].as_str().expect("operation name").to_string();
    assert!(name.starts_with(&format!("projects/{PROJECT}/locations/us-central1/studies/{study}/operations/")), "{name}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while op["done"] != true {
        assert!(Instant::now() < deadline, "the suggest operation is not done: {op}");
        std::thread::sleep(Duration::from_millis(50));
        let (st, o) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
        assert_eq!(st, 200, "{o}");
        op = o;
    }
    assert!(op.get("error").is_none(), "{op}");
    let r = &op["response"];
    assert_eq!(r["@type"], "type.googleapis.com/google.cloud.aiplatform.v1.SuggestTrialsResponse", "{op}");
    assert_eq!(op["metadata"]["clientId"], client, "{op}");
    let trials = r["trials"].as_array().cloned().unwrap_or_default();
    (op, trials)
}

fn measure(s: &Server, study: &str, trial: &str, step: i64, value: f64) -> Value {
    let (st, t) = post(
        s,
        &format!("studies/{study}/trials/{trial}:addTrialMeasurement"),
        json!({"measurement": {"stepCount": step.to_string(), "elapsedDuration": format!("{step}s"), "metrics": [{"metricId": "loss", "value": value}]}}),
    );
    assert_eq!(st, 200, "{t}");
    t
}

fn complete(s: &Server, study: &str, trial: &str) -> Value {
    let (st, t) = post(s, &format!("studies/{study}/trials/{trial}:complete"), json!({}));
    assert_eq!(st, 200, "{t}");
    assert_eq!(t["state"], "SUCCEEDED", "{t}");
    t
}

/// One round of a client's training loop: evaluate the trial (three steps that approach
/// its loss), report, complete; returns the loss.
fn evaluate(s: &Server, study: &str, trial: &Value) -> f64 {
    let id = trial["id"].as_str().expect("trial id");
    let l = loss(&trial["parameters"]);
    for step in 1..=3 {
        measure(s, study, id, step, l + 0.1 * (3 - step) as f64);
    }
    let done = complete(s, study, id);
    assert_eq!(done["finalMeasurement"]["metrics"][0]["value"].as_f64(), Some(l), "the last measurement counts: {done}");
    l
}

fn check_trial(trial: &Value, client: &str) {
    assert_eq!(trial["state"], "ACTIVE", "{trial}");
    assert_eq!(trial["clientId"], client, "{trial}");
    let params = trial["parameters"].as_array().expect("parameters");
    assert_eq!(params.len(), 3, "{trial}");
    for p in params {
        let v = &p["value"];
        match p["parameterId"].as_str() {
            Some("x") => assert!(v.as_f64().is_some_and(|x| (-5.0..=5.0).contains(&x)), "{p}"),
            // An INTEGER parameter's value is an integer in JSON, not 12.0.
            Some("units") => assert!(v.is_i64() && v.as_i64().is_some_and(|u| (1..=64).contains(&u)), "{p}"),
            Some("opt") => assert!(v == "adam" || v == "sgd", "{p}"),
            other => panic!("unknown parameter {other:?}"),
        }
    }
}

#[test]
fn a_training_loop_finds_the_best_trial() {
    let s = Server::start("");
    let study = create_study(&s, "loop", json!({}));
    let mut best = (f64::INFINITY, String::new());
    let mut ids = Vec::new();
    let mut timings = Vec::new();
    for round in 0..12 {
        let t0 = Instant::now();
        let (op, trials) = suggest(&s, &study, "worker-1", 1);
        timings.push(t0.elapsed());
        assert_eq!(trials.len(), 1, "{op}");
        let trial = &trials[0];
        check_trial(trial, "worker-1");
        if round == 0 {
            // The Operation is stored: GET of its name answers it as it was answered.
            let (st, again) = s.call("GET", &s.url(&format!("/v1/{}", op["name"].as_str().unwrap_or(""))), None);
            assert_eq!((st, &again), (200, &op));
            // The same client asking again before it completes gets the same trial.
            let (_, same) = suggest(&s, &study, "worker-1", 1);
            assert_eq!(same, trials, "the client's unfinished trial is answered again");
            // Another client gets another trial, which it gives up on (infeasible).
            let (_, other) = suggest(&s, &study, "worker-2", 1);
            assert_eq!(other.len(), 1);
            assert_ne!(other[0]["id"], trial["id"]);
            let oid = other[0]["id"].as_str().unwrap_or("");
            let (st, inf) = post(&s, &format!("studies/{study}/trials/{oid}:complete"), json!({"trialInfeasible": true, "infeasibleReason": "out of memory"}));
            assert_eq!(st, 200, "{inf}");
            assert_eq!((inf["state"].as_str(), inf["infeasibleReason"].as_str()), (Some("INFEASIBLE"), Some("out of memory")));
        }
        let l = evaluate(&s, &study, trial);
        let id = trial["id"].as_str().unwrap_or("").to_string();
        if l < best.0 {
            best = (l, id.clone());
        }
        ids.push(id);
    }
    // Trial ids are "1", "2", ... in order (2 went to the other client).
    assert_eq!(ids[0], "1");
    assert_eq!(ids[1], "3");
    let (st, optimal) = post(&s, &format!("studies/{study}/trials:listOptimalTrials"), json!({}));
    assert_eq!(st, 200, "{optimal}");
    let found: Vec<&str> = optimal["optimalTrials"].as_array().expect("optimalTrials").iter().filter_map(|t| t["id"].as_str()).collect();
    assert_eq!(found, vec![best.1.as_str()], "the best trial: {optimal}");
    // Every trial is listed, in id order, and pages follow.
    let (_, page) = get(&s, &format!("studies/{study}/trials?pageSize=5"));
    assert_eq!(page["trials"].as_array().map(Vec::len), Some(5), "{page}");
    let token = page["nextPageToken"].as_str().expect("a next page").to_string();
    let (_, rest) = get(&s, &format!("studies/{study}/trials?pageSize=100&pageToken={token}"));
    assert_eq!(rest["trials"].as_array().map(Vec::len), Some(8), "{rest}");
    assert!(rest.get("nextPageToken").is_none(), "{rest}");
    let (st, one) = get(&s, &format!("studies/{study}/trials/{}", best.1));
    assert_eq!(st, 200);
    assert_eq!(one["measurements"].as_array().map(Vec::len), Some(3), "{one}");
    assert_eq!(one["measurements"][0]["elapsedDuration"], "1s", "{one}");
    let mean = timings.iter().map(Duration::as_secs_f64).sum::<f64>() / timings.len() as f64;
    eprintln!("suggest through the API: {:.1} ms on average over {} calls", mean * 1000.0, timings.len());
}

#[test]
fn early_stopping_and_stop() {
    let s = Server::start("");
    let study = create_study(&s, "stopping", json!({"medianAutomatedStoppingSpec": {}}));
    let (_, trials) = suggest(&s, &study, "w", 4);
    assert_eq!(trials.len(), 4);
    let id = |i: usize| trials[i]["id"].as_str().unwrap_or("").to_string();
    for i in 0..3 {
        measure(&s, &study, &id(i), 1, 0.1);
        complete(&s, &study, &id(i));
    }
    // Worse than the median of the completed trials at the same step: it should stop.
    measure(&s, &study, &id(3), 1, 5.0);
    let (st, op) = post(&s, &format!("studies/{study}/trials/{}:checkTrialEarlyStoppingState", id(3)), json!({}));
    assert_eq!(st, 200, "{op}");
    assert_eq!(op["done"], true, "{op}");
    assert_eq!(op["response"]["@type"], "type.googleapis.com/google.cloud.aiplatform.v1.CheckTrialEarlyStoppingStateResponse");
    assert_eq!(op["response"]["shouldStop"], true, "{op}");
    assert_eq!(op["metadata"]["trial"], id(3), "{op}");
    let name = op["name"].as_str().expect("name").to_string();
    assert!(name.starts_with(&format!("projects/{PROJECT}/locations/us-central1/studies/{study}/trials/{}/operations/", id(3))), "{name}");
    let (st, again) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
    assert_eq!((st, again), (200, op.clone()));
    // The operation is the trial's: under another trial it is not found.
    let other = name.replace(&format!("/trials/{}/", id(3)), &format!("/trials/{}/", id(0)));
    assert_eq!(s.call("GET", &s.url(&format!("/v1/{other}")), None).0, 404);
    let (_, t) = get(&s, &format!("studies/{study}/trials/{}", id(3)));
    assert_eq!(t["state"], "STOPPING", "{t}");
    complete(&s, &study, &id(3));
    // A trial as good as the others goes on.
    let (_, more) = suggest(&s, &study, "w", 2);
    let good = more[0]["id"].as_str().unwrap_or("").to_string();
    measure(&s, &study, &good, 1, 0.05);
    let (_, op) = post(&s, &format!("studies/{study}/trials/{good}:checkTrialEarlyStoppingState"), json!({}));
    assert_eq!(op["done"], true);
    assert!(op["response"].get("shouldStop").is_none() || op["response"]["shouldStop"] == false, "{op}");
    // :stop makes it STOPPING, and then it should stop.
    let (st, stopped) = post(&s, &format!("studies/{study}/trials/{good}:stop"), json!({}));
    assert_eq!(st, 200, "{stopped}");
    assert_eq!(stopped["state"], "STOPPING");
    let (_, op) = post(&s, &format!("studies/{study}/trials/{good}:checkTrialEarlyStoppingState"), json!({}));
    assert_eq!(op["response"]["shouldStop"], true, "{op}");
    // An ended trial cannot be stopped or checked.
    let (st, e) = post(&s, &format!("studies/{study}/trials/{}:stop", id(0)), json!({}));
    assert_eq!((st, e["error"]["status"].as_str()), (400, Some("FAILED_PRECONDITION")), "{e}");
}

#[test]
fn lookup_list_create_trial_and_delete() {
    let s = Server::start("");
    let a = create_study(&s, "alpha", json!({}));
    let b = create_study(&s, "beta", json!({"algorithm": "RANDOM_SEARCH"}));
    // displayName is unique per location: 409, which the SDK's create_or_load follows
    // with a lookup.
    let (st, e) = post(&s, "studies", json!({"displayName": "alpha", "studySpec": spec(json!({}))}));
    assert_eq!((st, e["error"]["status"].as_str()), (409, Some("ALREADY_EXISTS")), "{e}");
    let (st, found) = post(&s, "studies:lookup", json!({"displayName": "beta"}));
    assert_eq!(st, 200, "{found}");
    assert!(found["name"].as_str().is_some_and(|n| n.ends_with(&format!("/studies/{b}"))), "{found}");
    assert_eq!(found["studySpec"]["algorithm"], "RANDOM_SEARCH");
    let (st, _) = post(&s, "studies:lookup", json!({"displayName": "gamma"}));
    assert_eq!(st, 404);
    // Pages of studies.
    let (_, page) = get(&s, "studies?pageSize=1");
    assert_eq!(page["studies"].as_array().map(Vec::len), Some(1), "{page}");
    let token = page["nextPageToken"].as_str().expect("next page").to_string();
    let (_, rest) = get(&s, &format!("studies?pageSize=1&pageToken={token}"));
    let mut names: Vec<String> = [&page, &rest].iter().filter_map(|p| p["studies"][0]["displayName"].as_str().map(String::from)).collect();
    names.sort();
    assert_eq!(names, vec!["alpha", "beta"]);
    // A trial of the client's own, with a result: SUCCEEDED; without: REQUESTED, and the
    // next suggestion hands it out.
    let params = json!([{"parameterId": "x", "value": 1.0}, {"parameterId": "units", "value": 20}, {"parameterId": "opt", "value": "adam"}]);
    let (st, done) = post(&s, &format!("studies/{a}/trials"), json!({"parameters": params, "finalMeasurement": {"metrics": [{"metricId": "loss", "value": 0.09}]}}));
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["state"], "SUCCEEDED");
    let wanted = json!([{"parameterId": "x", "value": -2.5}, {"parameterId": "units", "value": 7}, {"parameterId": "opt", "value": "sgd"}]);
    let (st, requested) = post(&s, &format!("studies/{a}/trials"), json!({"parameters": wanted}));
    assert_eq!(st, 200, "{requested}");
    assert_eq!(requested["state"], "REQUESTED");
    let (_, got) = suggest(&s, &a, "w", 1);
    assert_eq!(got[0]["id"], requested["id"], "{got:?}");
    assert_eq!(got[0]["state"], "ACTIVE");
    // Deleting a trial: gone, and its id is not given again.
    let (st, empty) = s.call("DELETE", &format!("{}/studies/{a}/trials/{}", base(&s), done["id"].as_str().unwrap_or("")), None);
    assert_eq!((st, empty), (200, json!({})));
    assert_eq!(get(&s, &format!("studies/{a}/trials/{}", done["id"].as_str().unwrap_or(""))).0, 404);
    let (_, next) = suggest(&s, &a, "w2", 1);
    assert_eq!(next[0]["id"], "3", "{next:?}");
    // Deleting the study: `{}`, then 404 everywhere.
    let (st, empty) = s.call("DELETE", &format!("{}/studies/{a}", base(&s)), None);
    assert_eq!((st, empty), (200, json!({})));
    assert_eq!(get(&s, &format!("studies/{a}")).0, 404);
    assert_eq!(get(&s, &format!("studies/{a}/trials")).0, 404);
    assert_eq!(post(&s, "studies:lookup", json!({"displayName": "alpha"})).0, 404);
    assert_eq!(s.call("DELETE", &format!("{}/studies/{a}", base(&s)), None).0, 404);
    // The name is free again.
    create_study(&s, "alpha", json!({}));
    // Another project does not see the study.
    let (st, _) = s.call("GET", &s.url(&format!("/v1/projects/other/locations/us-central1/studies/{b}")), None);
    assert_eq!(st, 404);
}

#[test]
fn bad_inputs_are_refused_naming_the_field() {
    let s = Server::start("");
    let study = create_study(&s, "bad", json!({}));
    let refused = |method: &str, path: &str, body: Option<&str>, status: u16, needle: &str| {
        let (st, e) = s.call(method, &format!("{}/{path}", base(&s)), body);
        assert_eq!(st, status, "{method} {path} {body:?}: {e}");
        let message = e["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(needle), "{method} {path} {body:?}: {message:?} does not name {needle:?}");
    };
    let study_body = |spec: Value| json!({"displayName": "x", "studySpec": spec}).to_string();
    refused("POST", "studies", Some("{"), 400, "Invalid JSON payload");
    refused("POST", "studies", Some(r#"{"displayName": "x", "bogus": 1}"#), 400, "bogus");
    refused("POST", "studies", Some(&json!({"studySpec": spec(json!({}))}).to_string()), 400, "displayName");
    refused("POST", "studies", Some(&study_body(json!({"parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]}))), 400, "studySpec.metrics");
    refused("POST", "studies", Some(&study_body(spec(json!({"parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 1, "maxValue": 0}}]})))), 400, "studySpec.parameters[0]");
    refused("POST", "studies", Some(&study_body(spec(json!({"algorithm": "GRID_SEARCH"})))), 400, "studySpec");
    refused("POST", "studies", Some(&study_body(spec(json!({"studyStoppingConfig": {"maxNumTrials": "many"}})))), 400, "studyStoppingConfig");
    refused("POST", &format!("studies/{study}/trials:suggest"), Some(r#"{"suggestionCount": 0, "clientId": "w"}"#), 400, "suggestionCount");
    refused("POST", &format!("studies/{study}/trials:suggest"), Some(r#"{"suggestionCount": 1000, "clientId": "w"}"#), 400, "suggestionCount");
    refused("POST", &format!("studies/{study}/trials:suggest"), Some(r#"{"suggestionCount": 1, "contexts": [{"parameters": [{"parameterId": "nope", "value": 1}]}]}"#), 400, "contexts[0].parameters[0].parameterId");
    refused("POST", &format!("studies/{study}/trials:suggest"), Some(r#"{"suggestionCount": 1, "contexts": [{"parameters": [{"parameterId": "units", "value": 2.5}]}]}"#), 400, "contexts[0].parameters[0].value");
    refused("POST", "studies/9999/trials:suggest", Some(r#"{"suggestionCount": 1}"#), 404, "studies/9999");
    refused("GET", "studies/abc", None, 400, "Study id");
    refused("GET", "studies/9999", None, 404, "studies/9999");
    refused("POST", &format!("studies/{study}/trials"), Some(r#"{"parameters": [{"parameterId": "y", "value": 1}]}"#), 400, "trial.parameters[0].parameterId");
    refused("POST", &format!("studies/{study}/trials"), Some(r#"{"parameters": [{"parameterId": "x", "value": 9}, {"parameterId": "units", "value": 2}, {"parameterId": "opt", "value": "adam"}]}"#), 400, "trial.parameters[0].value");
    refused("POST", &format!("studies/{study}/trials"), Some(r#"{"parameters": [{"parameterId": "x", "value": 1}, {"parameterId": "units", "value": 2}]}"#), 400, "\"opt\" is missing");
    let (_, trials) = suggest(&s, &study, "w", 1);
    let t = trials[0]["id"].as_str().unwrap_or("").to_string();
    refused("GET", &format!("studies/{study}/trials/99"), None, 404, "trials/99");
    refused("POST", &format!("studies/{study}/trials/99:complete"), Some("{}"), 404, "trials/99");
    refused("POST", &format!("studies/{study}/trials/{t}:fly"), Some("{}"), 404, "fly");
    refused("POST", &format!("studies/{study}/trials/{t}:addTrialMeasurement"), Some("{}"), 400, "measurement");
    refused("POST", &format!("studies/{study}/trials/{t}:addTrialMeasurement"), Some(r#"{"measurement": {"metrics": [{"metricId": "loss", "value": "NaN"}]}}"#), 400, "measurement.metrics[0].value");
    refused("POST", &format!("studies/{study}/trials/{t}:addTrialMeasurement"), Some(r#"{"measurement": {"metrics": [{"metricId": "loss", "value": "high"}]}}"#), 400, "value");
    refused("POST", &format!("studies/{study}/trials/{t}:complete"), Some(r#"{"finalMeasurement": {"metrics": [{"metricId": "acc", "value": 1}]}}"#), 400, "finalMeasurement.metrics");
    let (st, _) = post(&s, &format!("studies/{study}/trials/{t}:complete"), json!({"finalMeasurement": {"metrics": [{"metricId": "loss", "value": 1.5}]}}));
    assert_eq!(st, 200);
    // Completing a completed trial: FAILED_PRECONDITION.
    let (st, e) = post(&s, &format!("studies/{study}/trials/{t}:complete"), json!({}));
    assert_eq!((st, e["error"]["status"].as_str()), (400, Some("FAILED_PRECONDITION")), "{e}");
    refused("POST", &format!("studies/{study}/trials/{t}:addTrialMeasurement"), Some(r#"{"measurement": {"metrics": [{"metricId": "loss", "value": 1}]}}"#), 400, "SUCCEEDED");
    // Nothing a client sends crashes the server: a barrage of broken bodies and paths.
    let junk = ["", "null", "[]", "{\"suggestionCount\": -1}", "{\"measurement\": {\"stepCount\": \"-5\"}}", "{\"parameters\": [{}]}", "\u{0}\u{1}", "{\"displayName\": 7}"];
    let paths = [
        "studies".to_string(),
        "studies:lookup".to_string(),
        format!("studies/{study}/trials"),
        format!("studies/{study}/trials:suggest"),
        format!("studies/{study}/trials:listOptimalTrials"),
        format!("studies/{study}/trials/{t}:addTrialMeasurement"),
        format!("studies/{study}/trials/{t}:complete"),
        format!("studies/{study}/trials/{t}:stop"),
        format!("studies/{study}/trials/{t}:checkTrialEarlyStoppingState"),
        "studies/18446744073709551616/trials:suggest".to_string(),
        format!("studies/{study}/trials/-1:complete"),
    ];
    for p in &paths {
        for j in junk {
            let (st, e) = s.call("POST", &format!("{}/{p}", base(&s)), Some(j));
            // An empty body is an empty request, which listOptimalTrials takes.
            if j.is_empty() && p.ends_with(":listOptimalTrials") {
                assert_eq!(st, 200, "POST {p} {j:?}: {e}");
                continue;
            }
            assert!((400..500).contains(&st), "POST {p} {j:?}: {st} {e}");
            assert!(e["error"]["message"].is_string(), "POST {p} {j:?}: {e}");
        }
    }
    let (st, ok) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(st, 200, "{ok}");
}

#[test]
fn kill9_in_the_middle_keeps_the_study_and_its_trials() {
    let mut s = Server::start("");
    let study = create_study(&s, "durable", json!({}));
    for _ in 0..5 {
        let (_, trials) = suggest(&s, &study, "w", 1);
        evaluate(&s, &study, &trials[0]);
    }
    let (_, active) = suggest(&s, &study, "w", 1);
    let active_id = active[0]["id"].as_str().unwrap_or("").to_string();
    measure(&s, &study, &active_id, 1, 0.42);
    let (_, before) = get(&s, &format!("studies/{study}/trials"));
    let (_, study_before) = get(&s, &format!("studies/{study}"));
    s.kill9();
    // What a crash between a suggest request's commit and its trials' leaves: the
    // request pending in the study, its Operation not done.
    let db = s.data_dir().join("trainyard.db");
    let conn = rusqlite::Connection::open(&db).expect("db");
    let core: String = conn.query_row("SELECT core FROM jobs WHERE kind = 'vizier' AND display_name = 'durable'", [], |r| r.get(0)).expect("the study's row");
    let mut core: Value = serde_json::from_str(&core).expect("its state");
    conn.execute("INSERT INTO operations (project, region, body) VALUES (?1, 'us-central1', '')", [PROJECT]).expect("op");
    let op = conn.last_insert_rowid();
    let op_name = format!("projects/{PROJECT}/locations/us-central1/studies/{study}/operations/{op}");
    core["pending"] = json!([{"op": op, "client_id": "late", "count": 2, "assigned": [], "contexts": [], "start": 1}]);
    conn.execute("UPDATE operations SET body = ?1 WHERE id = ?2", rusqlite::params![json!({"name": op_name}).to_string(), op]).expect("op body");
    let n = conn.execute("UPDATE jobs SET core = ?1, terminal = 0 WHERE kind = 'vizier' AND display_name = 'durable'", [core.to_string()]).expect("core");
    assert_eq!(n, 1);
    drop(conn);
    s.spawn();
    // The study and every trial are as they were, the active one with its measurement.
    assert_eq!(get(&s, &format!("studies/{study}")).1, study_before);
    let (_, after) = get(&s, &format!("studies/{study}/trials"));
    let listed = |v: &Value| v["trials"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed(&after)[..listed(&before).len()], listed(&before)[..], "the trials before the kill are unchanged");
    // The pending request was computed again after the restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let (st, o) = s.call("GET", &s.url(&format!("/v1/{op_name}")), None);
        assert_eq!(st, 200, "{o}");
        if o["done"] == true {
            break o;
        }
        assert!(Instant::now() < deadline, "the pending suggestion was not made after the restart: {o}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let late = done["response"]["trials"].as_array().cloned().unwrap_or_default();
    assert_eq!(late.len(), 2, "{done}");
    assert!(late.iter().all(|t| t["clientId"] == "late"), "{done}");
    assert_eq!(late[0]["id"], "7", "{done}");
    // The loop goes on: the client gets its unfinished trial again, completes it, and
    // new trials follow the ones before.
    let (_, again) = suggest(&s, &study, "w", 1);
    assert_eq!(again[0]["id"], active_id.as_str());
    assert_eq!(again[0]["measurements"][0]["metrics"][0]["value"], 0.42, "{again:?}");
    evaluate(&s, &study, &again[0]);
    let (_, next) = suggest(&s, &study, "w", 1);
    assert_eq!(next[0]["id"], "9", "{next:?}");
}

/// Tokens guard studies as they guard jobs: 401 without a token, 403 for another
/// project's or for a write with a read-only token; lookup and listOptimalTrials are
/// POSTs that only read, which a read-only token may call.
#[test]
fn tokens_guard_studies() {
    const RW: &str = "vizier-rw-token-0123456789";
    const RO: &str = "vizier-ro-token-0123456789";
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{RW}\"\nprojects = [\"{PROJECT}\"]\n\n\
             [[tokens]]\ntoken = \"{RO}\"\nprojects = [\"{PROJECT}\"]\naccess = \"read-only\"\n"
        ),
    )
    .expect("tokens");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_idle_connections(0).build().into();
    let call = |method: &str, url: &str, token: Option<&str>, body: Option<Value>| -> (u16, Value) {
        let mut req = ureq::http::Request::builder().method(method).uri(url).header("Content-Type", "application/json");
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let text = body.map(|b| b.to_string()).unwrap_or_default();
        let mut resp = agent.run(req.body(text).expect("request")).expect("answer");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let studies = format!("{}/studies", base(&s));
    let body = json!({"displayName": "guarded", "studySpec": spec(json!({}))});
    assert_eq!(call("POST", &studies, None, Some(body.clone())).0, 401);
    assert_eq!(call("POST", &studies, Some(RO), Some(body.clone())).0, 403, "a read-only token cannot create");
    let (st, study) = call("POST", &studies, Some(RW), Some(body));
    assert_eq!(st, 200, "{study}");
    let name = study["name"].as_str().expect("name").to_string();
    let url = |path: &str| s.url(&format!("/v1/{name}{path}"));
    let suggest = json!({"suggestionCount": 1, "clientId": "w"});
    assert_eq!(call("POST", &url("/trials:suggest"), Some(RO), Some(suggest.clone())).0, 403, "nor suggest");
    let (st, op) = call("POST", &url("/trials:suggest"), Some(RW), Some(suggest));
    assert_eq!(st, 200, "{op}");
    assert_eq!(call("GET", &url(""), Some(RO), None).0, 200);
    assert_eq!(call("GET", &url("/trials"), Some(RO), None).0, 200);
    assert_eq!(call("POST", &format!("{studies}:lookup"), Some(RO), Some(json!({"displayName": "guarded"}))).0, 200);
    assert_eq!(call("POST", &url("/trials:listOptimalTrials"), Some(RO), Some(json!({}))).0, 200);
    assert_eq!(call("GET", &s.url(&format!("/v1/{}", op["name"].as_str().unwrap_or(""))), Some(RO), None).0, 200);
    assert_eq!(call("POST", &url("/trials/1:complete"), Some(RO), Some(json!({}))).0, 403);
    assert_eq!(call("DELETE", &url(""), Some(RO), None).0, 403);
    // Another project: 403 for the token, and the study is not found there.
    let other = s.url("/v1/projects/elsewhere/locations/us-central1/studies:lookup");
    assert_eq!(call("POST", &other, Some(RW), Some(json!({"displayName": "guarded"}))).0, 403);
    assert_eq!(call("DELETE", &url(""), Some(RW), None).0, 200);
}

/// Clients that ask at the same time: each gets trials of its own, never another's, and a
/// client that asks twice at once gets the same trials twice (its second request is
/// answered with the trials of its first).
#[test]
fn concurrent_clients() {
    let s = Server::start("");
    let study = create_study(&s, "crowd", json!({}));
    let url = format!("{}/studies/{study}/trials:suggest", base(&s));
    let clients = ["a", "b", "c", "d", "same", "same"];
    let answers: Vec<(String, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter()
            .map(|client| {
                let (api, url) = (s.api(), url.clone());
                scope.spawn(move || {
                    let body = json!({"suggestionCount": 2, "clientId": client}).to_string();
                    let (st, mut op) = api.try_call("POST", &url, Some(&body)).expect("suggest");
                    assert_eq!(st, 200, "{op}");
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while op["done"] != true {
                        assert!(Instant::now() < deadline, "{op}");
                        std::thread::sleep(Duration::from_millis(20));
                        op = api.try_call("GET", &api.url(&format!("/v1/{}", op["name"].as_str().unwrap_or(""))), None).expect("poll").1;
                    }
                    let ids = op["response"]["trials"].as_array().map(|ts| ts.iter().filter_map(|t| t["id"].as_str().map(String::from)).collect()).unwrap_or_default();
                    (client.to_string(), ids)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    let mut seen = std::collections::BTreeMap::new();
    for (client, ids) in &answers {
        assert_eq!(ids.len(), 2, "{client}: {answers:?}");
        for id in ids {
            let owner = seen.entry(id.clone()).or_insert_with(|| client.clone());
            assert_eq!(owner, client, "trial {id} went to two clients: {answers:?}");
        }
    }
    let same: Vec<&Vec<String>> = answers.iter().filter(|(c, _)| c == "same").map(|(_, ids)| ids).collect();
    assert_eq!(same[0], same[1], "{answers:?}");
    assert_eq!(seen.len(), 10, "five clients, two trials each: {answers:?}");
}

/// `$alt=json;enum-encoding=int` (what the SDK's REST transport asks for): a Study's state
/// as a `Study.State` number, a Trial's as a `Trial.State` number (ACTIVE is 1 in one and 2
/// in the other), in every answer that holds them; parameter values stay as they are.
#[test]
fn enum_encoding_int() {
    let s = Server::start("");
    let study = create_study(&s, "ints", json!({}));
    let alt = "%24alt=json%3Benum-encoding%3Dint";
    let (_, st) = get(&s, &format!("studies/{study}?{alt}"));
    assert_eq!((st["state"].clone(), st["studySpec"]["metrics"][0]["goal"].clone()), (json!(1), json!(2)), "{st}");
    let (_, op) = post(&s, &format!("studies/{study}/trials:suggest?{alt}"), json!({"suggestionCount": 1, "clientId": "w"}));
    assert_eq!(op["done"], true, "{op}");
    assert_eq!(op["response"]["studyState"], 1, "{op}");
    let t = &op["response"]["trials"][0];
    assert_eq!(t["state"], 2, "{op}");
    assert!(t["parameters"].as_array().is_some_and(|ps| ps.iter().any(|p| p["value"] == "adam" || p["value"] == "sgd")), "{op}");
    let id = t["id"].as_str().unwrap_or("").to_string();
    let (_, trial) = get(&s, &format!("studies/{study}/trials/{id}?{alt}"));
    assert_eq!(trial["state"], 2, "{trial}");
    let (_, done) = post(&s, &format!("studies/{study}/trials/{id}:complete?{alt}"), json!({"finalMeasurement": {"metrics": [{"metricId": "loss", "value": 1}]}}));
    assert_eq!(done["state"], 4, "{done}");
    let (_, list) = get(&s, &format!("studies?{alt}"));
    assert_eq!(list["studies"][0]["state"], 1, "{list}");
    let (_, trials) = get(&s, &format!("studies/{study}/trials?{alt}"));
    assert_eq!(trials["trials"][0]["state"], 4, "{trials}");
    let (_, optimal) = post(&s, &format!("studies/{study}/trials:listOptimalTrials?{alt}"), json!({}));
    assert_eq!(optimal["optimalTrials"][0]["state"], 4, "{optimal}");
    // Without the option: names.
    assert_eq!(get(&s, &format!("studies/{study}")).1["state"], "ACTIVE");
}
