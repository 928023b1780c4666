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
    // The events in words, each with the rule that made it after them.
    assert!(out.contains("events:") && out.contains("Job is running. [L7]") && out.contains("Job completed successfully. [L17]"), "{out}");
    let o = cli(&s, &["describe", id, "--format=json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    let ran = v["events"].as_array().into_iter().flatten().find(|e| e["rule"] == "L7").cloned().unwrap_or_default();
    assert_eq!(ran["text"], "Job is running.", "{v}");

    let o = cli(&s, &["stream-logs", &name]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("workerpool0-0: hello from cli"), "{out}");
    assert!(out.contains("workerpool0-0: args first second"), "{out}");
    assert!(out.contains("trainyard: Job completed successfully."), "{out}");

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
    assert!(text(&o).contains("(start it with trainyard serve, or set --server or TRAINYARD_SERVER)"), "{}", text(&o));
}

/// The code blocks of a piece of Markdown: (language, text).
fn code_blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in md.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(lang)) => current = Some((lang.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// The commands of a shell block, one per command: lines joined where they end with a
/// backslash or a quote is still open.
fn shell_commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cmd = String::new();
    let (mut single, mut double, mut escaped, mut comment) = (false, false, false, false);
    for c in block.chars() {
        // A comment (`#` starting a word outside quotes) runs to the end of its line.
        if c == '#' && !single && !double && !escaped && cmd.chars().last().is_none_or(char::is_whitespace) {
            comment = true;
        }
        if comment && c != '\n' {
            continue;
        }
        comment = false;
        cmd.push(c);
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '\n' if !single && !double => {
                let line = cmd.trim().to_string();
                if !line.is_empty() && !line.starts_with('#') {
                    out.push(line);
                }
                cmd.clear();
            }
            _ => {}
        }
    }
    out
}

/// README's "A five-minute tour", run top to bottom as written against a fresh server: the
/// local-run of the example, the client commands (ids as the README gives them), the REST
/// calls (with curl when it is there) and the tuning job of its study.yaml.
#[test]
fn readme_tour_runs_as_written() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("## A five-minute tour").expect("the tour");
    let end = start + readme[start..].find("\n## ").expect("the next section");
    let tour = &readme[start..end];
    let s = Server::start("");
    // The commands run in a directory of their own, where `examples/` is the repository's.
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root.join("examples"), work.path().join("examples")).unwrap();
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let have_curl = Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success());
    let mut ran = Vec::new();
    for (lang, body) in code_blocks(tour) {
        // A file the tour asks for (`# study.yaml`), written where the commands run.
        if lang == "yaml" {
            let first = body.lines().next().unwrap_or("");
            if let Some(file) = first.strip_prefix("# ").filter(|f| !f.contains(' ')) {
                std::fs::write(work.path().join(file), &body).unwrap();
            }
            continue;
        }
        if lang != "sh" {
            continue;
        }
        for cmd in shell_commands(&body) {
            let cmd = if cmd.starts_with("curl") {
                if !have_curl {
                    // Keep the ids the README gives: the same create, without curl.
                    if cmd.contains("-X POST") {
                        s.create("local", &sh_job("hello", "echo 42"));
                    }
                    trainyard_backend::skip_test(&format!("no curl for the README's command: {cmd}"));
                    continue;
                }
                cmd.replace("127.0.0.1:8080", &format!("127.0.0.1:{}", s.port))
            } else {
                assert!(cmd.starts_with("trainyard "), "a tour command that is not trainyard's or curl: {cmd}");
                cmd
            };
            let o = Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(work.path())
                .env("PATH", &path)
                .env("TRAINYARD_SERVER", s.url(""))
                .env("TRAINYARD_CLI_CONFIG", work.path().join("cli.toml"))
                .env("TRAINYARD_STORAGE_ROOT", work.path().join("storage"))
                .env("TRAINYARD_CONTAINER_ENGINE", "none")
                .env_remove("TRAINYARD_PROJECT")
                .env_remove("TRAINYARD_REGION")
                .env_remove("TRAINYARD_TOKEN")
                .env_remove("TRAINYARD_CONFIG")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let out = text(&o);
            assert!(o.status.success(), "README tour: `{cmd}` failed ({}):\n{out}\nserver log:\n{}", o.status, s.server_log());
            if cmd.starts_with("curl") {
                let v: serde_json::Value = serde_json::from_slice(o.stdout.split(|b| *b == b'\n').next().unwrap_or(&[])).unwrap_or_default();
                assert!(v.get("error").is_none(), "README tour: `{cmd}`:\n{out}");
            }
            ran.push((cmd, out));
        }
    }
    let find = |prefix: &str| {
        ran.iter().find(|(c, _)| c.starts_with(prefix)).map(|(_, o)| o.clone()).unwrap_or_else(|| panic!("the tour has no `{prefix}`"))
    };
    assert!(find("trainyard local-run examples/checkpoint/job.yaml").contains("[workerpool0-0]"));
    assert!(find("trainyard custom-jobs describe 1").contains("displayName: hello"));
    assert!(find("trainyard custom-jobs stream-logs 1").contains("workerpool0-0: hello"));
    assert!(find("trainyard custom-jobs cancel 2").contains("customJobs/2"));
    assert!(find("trainyard hp-tuning-jobs describe 4").contains("# Best trial: "));
    assert!(find("trainyard hp-tuning-jobs stream-logs 4").contains("[trial 20] "));
    // What the prose says of the ids.
    let study = s.get("projects/local/locations/us-central1/hyperparameterTuningJobs/4");
    assert_eq!(study["displayName"], "tune");
    let jobs: Vec<&str> = study["trials"].as_array().unwrap().iter().map(|t| t["customJob"].as_str().unwrap()).collect();
    assert_eq!(jobs.first().copied(), Some("projects/local/locations/us-central1/customJobs/5"));
    assert_eq!(jobs.last().copied(), Some("projects/local/locations/us-central1/customJobs/24"));
    assert_eq!(s.get("projects/local/locations/us-central1/customJobs/3")["displayName"], "hello");
}
