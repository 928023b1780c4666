//! `trainyard custom-jobs ...` against a real server.

mod common;

use std::process::{Command, Output};

use common::*;

fn cli(s: &Server, args: &[&str]) -> Output {
    let mut all = vec!["custom-jobs"];
    all.extend_from_slice(args);
    trainyard(s, &all)
}

/// `trainyard ARGS` against the test server, in project `cli`.
fn trainyard(s: &Server, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "cli")
        .env_remove("TRAINYARD_TOKEN")
        .output()
        .expect("run trainyard")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn create_list_describe_logs_cancel() {
    let s = Server::start("");
    let o = cli(
        &s,
        &[
            "create",
            "--region=us-central1",
            "--display-name=from-cli",
            "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11",
            "--command=sh,-c,echo hello from cli; echo args $0 $1",
            "--args=first,second",
            "--labels=team=nlp,env=dev",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("CustomJob [projects/cli/locations/us-central1/customJobs/"), "{out}");
    let name = out.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap().to_string();
    s.wait_terminal(&name, 30);

    let o = cli(&s, &["list"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.lines().next().unwrap().starts_with("ID"), "{out}");
    assert!(out.contains("from-cli") && out.contains("JOB_STATE_SUCCEEDED"), "{out}");

    let o = cli(&s, &["list", "--format=json", "--limit=1"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["labels"]["team"], "nlp");

    let id = name.rsplit('/').next().unwrap();
    let o = cli(&s, &["describe", id, "--format=table"]);
    let out = text(&o);
    assert!(out.lines().next().is_some_and(|l| l.starts_with("FIELD") && l.contains("VALUE")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("state") && l.contains("JOB_STATE_SUCCEEDED")), "{out}");
    let o = cli(&s, &["describe", id]);
    let out = text(&o);
    assert!(out.contains("displayName: from-cli"), "{out}");
    assert!(out.contains("state: JOB_STATE_SUCCEEDED"), "{out}");
    // The decision trail: every lifecycle event with its rule.
    assert!(out.contains("decisions:") && out.contains("L7: Job is running.") && out.contains("L17: Job completed successfully."), "{out}");

    let o = cli(&s, &["stream-logs", &name]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("workerpool0-0: hello from cli"), "{out}");
    assert!(out.contains("workerpool0-0: args first second"), "{out}");
    assert!(out.contains("trainyard: L17: Job completed successfully."), "{out}");

    // Cancelling a finished job: the service's error, non-zero exit.
    let o = cli(&s, &["cancel", id]);
    assert!(!o.status.success());
    assert!(text(&o).contains("FAILED_PRECONDITION"), "{}", text(&o));
}

#[test]
fn create_from_config_and_cancel() {
    let s = Server::start("");
    let cfg = s.dir.path().join("job.yaml");
    std::fs::write(
        &cfg,
        "workerPoolSpecs:\n  - machineSpec: {machineType: e2-standard-4}\n    replicaCount: 1\n    containerSpec:\n      imageUri: x\n      command: [sleep, '300']\n",
    )
    .unwrap();
    let o = cli(&s, &["create", "--display-name=cfg", &format!("--config={}", cfg.display())]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let name = out.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap().to_string();
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let o = cli(&s, &["cancel", &name]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Request to cancel CustomJob"), "{}", text(&o));
    let done = s.wait_terminal(&name, 30);
    assert_eq!(done["state"], "JOB_STATE_CANCELLED");
    // An ended job can be deleted; then it is gone.
    let o = cli(&s, &["delete", &name]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Deleted CustomJob"), "{}", text(&o));
    let (status, _) = s.call("GET", &s.url(&format!("/v1/{name}")), None);
    assert_eq!(status, 404);
    let o = cli(&s, &["delete", &name]);
    assert!(!o.status.success() && text(&o).contains("NOT_FOUND"), "{}", text(&o));
}

#[test]
fn bad_flags_are_explained() {
    let s = Server::start("");
    let o = cli(&s, &["create", "--display-name=x", "--worker-pool-spec=machine-type=n1-standard-4,colour=red,container-image-uri=i"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("colour"), "{}", text(&o));
    let o = cli(&s, &["describe", "not-a-job"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not a job id"), "{}", text(&o));
    let o = cli(&s, &["describe", "424242"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("NOT_FOUND"), "{}", text(&o));
}

#[test]
fn hp_tuning_jobs_commands() {
    let s = Server::start("");
    let cfg = s.dir.path().join("study.yaml");
    std::fs::write(
        &cfg,
        "studySpec:\n  metrics: [{metricId: accuracy, goal: MAXIMIZE}]\n  parameters:\n    - parameterId: units\n      integerValueSpec: {minValue: 1, maxValue: 3}\n  algorithm: GRID_SEARCH\n\
         trialJobSpec:\n  workerPoolSpecs:\n    - machineSpec: {machineType: n1-standard-4}\n      replicaCount: 1\n      containerSpec:\n        imageUri: x\n        command: [sh, -c, 'echo \"{\\\"accuracy\\\": \\\"0.5\\\"}\" > $CLOUD_ML_HP_METRIC_FILE']\n",
    )
    .unwrap();
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=cli-study", &format!("--config={}", cfg.display()), "--max-trial-count=3", "--parallel-trial-count=3"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let name = out.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let o = trainyard(&s, &["hp-tuning-jobs", "describe", &name]);
        let out = text(&o);
        if out.contains("state: JOB_STATE_SUCCEEDED") {
            assert!(out.contains("finalMeasurement"), "{out}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{out}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let o = trainyard(&s, &["hp-tuning-jobs", "list"]);
    assert!(text(&o).contains("cli-study") && text(&o).contains("JOB_STATE_SUCCEEDED"), "{}", text(&o));
    let o = trainyard(&s, &["hp-tuning-jobs", "cancel", &name]);
    assert!(!o.status.success() && text(&o).contains("FAILED_PRECONDITION"), "{}", text(&o));
}

/// The CLI never stumbles: output cut short by a closed pipe ends quietly; a server address
/// without a scheme works; a full resource name is used with its own project and region.
#[test]
fn cli_handles_pipes_addresses_and_full_names() {
    // Jobs that wait on quota: a list larger than a pipe's buffer, quick to make.
    let s = Server::start("[quotas.default]\ncustom_model_training_cpus = 4\n");
    let other = s.create("elsewhere", &sh_job("far", "true"));
    s.wait_terminal(&name_of(&other), 30);
    for i in 0..150 {
        s.create("cli", &sh_job(&format!("near-{i}"), "sleep 600"));
    }
    // `list | head -1`: no panic, no error text.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("'{BIN}' custom-jobs list --format=json | head -c 1"))
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "cli")
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    // No scheme in the address.
    let o = Command::new(BIN)
        .args(["custom-jobs", "list"])
        .env("TRAINYARD_SERVER", format!("127.0.0.1:{}", s.port))
        .env("TRAINYARD_PROJECT", "cli")
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", text(&o));
    // A full name of another project is described there, not in the target's project.
    let o = cli(&s, &["describe", &name_of(&other)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("displayName: far"), "{}", text(&o));
    // A name of another collection is refused, naming what is expected.
    let o = cli(&s, &["describe", "projects/p/locations/us-central1/hyperparameterTuningJobs/1"]);
    assert!(!o.status.success() && text(&o).contains("customJobs/ID"), "{}", text(&o));
    // An unreachable server: how to fix it is said.
    let o = Command::new(BIN)
        .args(["custom-jobs", "list"])
        .env("TRAINYARD_SERVER", format!("127.0.0.1:{}", free_port()))
        .output()
        .expect("run");
    assert!(text(&o).contains("set --server or TRAINYARD_SERVER"), "{}", text(&o));
}
