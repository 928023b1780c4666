//! Replicas in their images (podman): the managed service's container semantics, the
//! engine's failures, stops, isolation and the `[containers]` table. Run by
//! `scripts/test` with `TRAINYARD_TEST_CONTAINERS=podman` after `scripts/images/build.sh`
//! (CI always does); without it each test says so and passes.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const PYTHON: &str = "localhost/trainyard/python:test";
const ENTRYPOINT: &str = "localhost/trainyard/entrypoint:test";

fn enabled() -> bool {
    if !containers_backend() {
        eprintln!("SKIP: the container tests run with TRAINYARD_TEST_CONTAINERS=podman (scripts/test builds the images)");
        return false;
    }
    true
}

fn state(j: &Value) -> &str {
    j["state"].as_str().unwrap_or("")
}

/// A job of one replica in `image` (not rewritten to the test image).
fn image_job(name: &str, image: &str, command: &[&str], args: &[&str]) -> Value {
    let mut spec = json!({"imageUri": image});
    if !command.is_empty() {
        spec["command"] = json!(command);
    }
    if !args.is_empty() {
        spec["args"] = json!(args);
    }
    json!({"displayName": name, "jobSpec": {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1", "containerSpec": spec}
    ]}})
}

/// Creates without the harness's image rewrite.
fn create_as_is(s: &Server, project: &str, job: &Value) -> Value {
    let (status, body) = s.call("POST", &s.jobs_url(project), Some(&job.to_string()));
    assert_eq!(status, 200, "create: {body}");
    body
}

/// Containers of this server's runs (by the label every container carries), any state.
fn containers_of(s: &Server) -> Vec<String> {
    let out = Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}} {{.Labels}}"])
        .output()
        .expect("podman ps");
    let data = s.data_dir().display().to_string();
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&data)).map(str::to_string).collect()
}

/// `command` replaces the image's ENTRYPOINT, `args` its CMD, and without either the
/// image's own run; the image's WORKDIR; the replica environment (L8) and the
/// containerSpec's env inside; gs://B/X is /gcs/B/X, and AIP_MODEL_DIR is usable there.
#[test]
fn l8_command_args_env_workdir_and_gcs_follow_the_managed_service() {
    if !enabled() {
        return;
    }
    let s = Server::start("");
    let own = create_as_is(&s, "p", &image_job("own", ENTRYPOINT, &[], &[]));
    let args = create_as_is(&s, "p", &image_job("args", ENTRYPOINT, &[], &["-c", "print('args replaced the CMD')"]));
    let script = "echo \"cmd $0 $1\"; echo \"pwd $(pwd)\"; echo \"rank $RANK my $MY_VAR\"; \
                  echo \"model $AIP_MODEL_DIR\"; echo saved > \"$AIP_MODEL_DIR/weights.txt\"; \
                  python3 -c 'import json, os; print(\"cluster\", json.loads(os.environ[\"CLUSTER_SPEC\"])[\"task\"])'";
    let mut job = image_job("cmd", ENTRYPOINT, &["sh", "-c", script], &["a1", "a2"]);
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] = json!([{"name": "MY_VAR", "value": "v1"}]);
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://bkt/run1"});
    let cmd = create_as_is(&s, "p", &job);
    for (j, want) in [(&own, "the image CMD ran"), (&args, "args replaced the CMD")] {
        let done = s.wait_terminal(&name_of(j), 60);
        let text = s.logs_text(&name_of(j));
        assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{text}");
        assert!(text.contains(want), "{text}");
    }
    let name = name_of(&cmd);
    let done = s.wait_terminal(&name, 60);
    let text = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{text}");
    for want in ["cmd a1 a2", "pwd /app", "rank 0 my v1", "model /gcs/bkt/run1/model/", "cluster {'index': 0, 'type': 'workerpool0'}"] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let saved = s.data_dir().join("storage/p/bkt/run1/model/weights.txt");
    assert_eq!(std::fs::read_to_string(&saved).unwrap_or_default(), "saved\n", "{}", saved.display());
    assert!(containers_of(&s).is_empty(), "no container is left: {:?}", containers_of(&s));
}

/// L13: an image that is not on the host, with pulls off, is a StartError naming the
/// image and how to load it, and is not retried; so is a command the image does not have.
#[test]
fn l13_a_missing_image_or_command_is_a_start_error_naming_it() {
    if !enabled() {
        return;
    }
    let s = Server::start("");
    let missing = create_as_is(&s, "p", &image_job("missing", "localhost/not-here:v1", &["true"], &[]));
    let nocmd = create_as_is(&s, "p", &image_job("nocmd", PYTHON, &["no-such-program", "x"], &[]));
    let done = s.wait_terminal(&name_of(&missing), 60);
    assert_eq!(state(&done), "JOB_STATE_FAILED");
    let message = done["error"]["message"].as_str().unwrap_or("");
    for want in ["StartError", "localhost/not-here:v1", "podman load", "pull = \"never\""] {
        assert!(message.contains(want), "{want:?} in {message}");
    }
    assert!(!run_dir(&s.data_dir(), id_of(&missing), 1, "workerpool0-0", 0).exists(), "not retried");
    let done = s.wait_terminal(&name_of(&nocmd), 60);
    assert_eq!(state(&done), "JOB_STATE_FAILED");
    let message = done["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("StartError") && message.contains("no-such-program"), "{message}");
    assert_eq!(done["error"]["code"], 3);
    assert!(containers_of(&s).is_empty(), "{:?}", containers_of(&s));
}

/// L18, L20: a cancel stops a program that has no SIGTERM handler with SIGTERM (the
/// container's init forwards it; PID 1 alone would ignore it), within the grace period,
/// and leaves no container, process or cgroup.
#[test]
fn l18_l20_cancel_stops_gracefully_and_leaves_no_container() {
    if !enabled() {
        return;
    }
    // A long grace period: a stop that needed SIGKILL would show as signal 9.
    let mut s = Server::prepare("");
    let text = std::fs::read_to_string(&s.config).unwrap().replace("grace_period_secs = 1", "grace_period_secs = 30");
    std::fs::write(&s.config, text).unwrap();
    s.spawn();
    let marker = format!("stop-marker-{}", std::process::id());
    let j = create_as_is(&s, "p", &image_job("stop", PYTHON, &["python3", "-u", "-c", &format!("import time; print('up {marker}'); time.sleep(600)")], &[]));
    let name = name_of(&j);
    s.wait_for(&name, 60, |j| state(j) == "JOB_STATE_RUNNING");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s.logs_text(&name).contains("up ") {
        assert!(Instant::now() < deadline, "never printed: {}", s.logs_text(&name));
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 200);
    let done = s.wait_terminal(&name, 60);
    assert_eq!(state(&done), "JOB_STATE_CANCELLED");
    let run = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0);
    let status: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).expect("status.json")).unwrap();
    assert_eq!(status["signal"], 15, "stopped by SIGTERM, not SIGKILL: {status}");
    assert!(containers_of(&s).is_empty(), "{:?}", containers_of(&s));
    assert!(pids_with(&marker).is_empty(), "a process of the job is left");
}

/// Isolation: a container sees its own project's buckets at /gcs and nothing else of the
/// storage root or the server's data directory.
#[test]
fn a_container_cannot_read_another_projects_data_or_the_servers() {
    if !enabled() {
        return;
    }
    let s = Server::start("");
    let b = create_as_is(&s, "b", &image_job("writer", PYTHON, &["sh", "-c", "mkdir -p /gcs/secret && echo b-only-data > /gcs/secret/x"], &[]));
    assert_eq!(state(&s.wait_terminal(&name_of(&b), 60)), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name_of(&b)));
    assert!(s.data_dir().join("storage/b/secret/x").exists());
    let data = s.data_dir().display().to_string();
    let script = format!(
        "echo \"gcs: $(ls /gcs)\"; cat /gcs/secret/x 2>&1; ls {data} 2>&1; ls {data}/storage/b 2>&1; \
         cat {data}/storage/b/secret/x 2>&1; cat {data}/trainyard.db 2>&1 | head -c 20; echo end"
    );
    let a = create_as_is(&s, "a", &image_job("reader", PYTHON, &["sh", "-c", &script], &[]));
    let done = s.wait_terminal(&name_of(&a), 60);
    let text = s.logs_text(&name_of(&a));
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{text}");
    assert!(text.contains("end"), "{text}");
    assert!(!text.contains("b-only-data") && !text.contains("SQLite"), "project a read another's data: {text}");
    assert!(text.contains("No such file or directory"), "{text}");
}

/// A registry that cannot be reached is not the user's fault: the job waits, PENDING, with
/// the engine's message, and is retried (here: a registry on a closed loopback port).
#[test]
fn l16_an_unreachable_registry_keeps_the_job_waiting_with_the_engines_message() {
    if !enabled() {
        return;
    }
    let s = Server::start("[containers]\nengine = \"podman\"\npull = \"missing\"\n");
    let j = create_as_is(&s, "p", &image_job("pull", "127.0.0.1:9/nothing/img:v1", &["true"], &[]));
    let name = name_of(&j);
    let deadline = Instant::now() + Duration::from_secs(60);
    let reason = loop {
        let now = s.get(&name);
        let text = s.logs_text(&name);
        if let Some(line) = text.lines().find(|l| l.contains("Waiting for the execution engine")) {
            break (now, line.to_string());
        }
        assert!(Instant::now() < deadline, "no waiting reason: {now}\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(state(&reason.0), "JOB_STATE_PENDING", "{}", reason.0);
    assert!(reason.1.contains("127.0.0.1:9/nothing/img:v1") && reason.1.contains("connection refused"), "{}", reason.1);
    let (status, _) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 200);
    assert_eq!(state(&s.wait_terminal(&name, 60)), "JOB_STATE_CANCELLED");
}

/// A broken `[containers]` table stops the start, naming the key (and the line for a
/// value of the wrong kind); an engine that was asked for and does not work too.
#[test]
fn a_broken_containers_table_is_refused_at_start() {
    if !enabled() {
        return;
    }
    for (table, want) in [
        ("[containers]\nengine = \"docker\"\n", "line 2: containers.engine"),
        ("[containers]\nengine = \"podman\"\nprogram = \"/nonexistent/podman\"\n", "/nonexistent/podman"),
        ("[containers]\nmounts = [\"relative:/x\"]\n", "containers.mounts[0]"),
        ("[containers]\npull = \"sometimes\"\n", "line 2: containers.pull"),
    ] {
        let mut s = Server::prepare(table);
        let err = s.try_spawn().expect_err(table);
        assert!(err.contains(want), "{table}: {want:?} in {err}");
    }
}

/// `local-run` runs the job in its image, in the foreground, with the job file's
/// directory as the working directory.
#[test]
fn local_run_runs_the_job_in_its_image() {
    if !enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        format!(
            "workerPoolSpecs:\n  - machineSpec: {{machineType: n1-standard-4}}\n    replicaCount: 1\n    containerSpec:\n      \
             imageUri: {PYTHON}\n      command: [sh, -c, 'test -d /app && echo in the image $(pwd)']\n"
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["local-run", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg(&file)
        .env("TRAINYARD_CONTAINER_ENGINE", "podman")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // In the image (it has /app, the host does not), in the job file's directory.
    assert!(!std::path::Path::new("/app").exists(), "this test needs a host without /app");
    let want = format!("in the image {}", dir.path().display());
    assert!(stdout.contains(&want) || stderr.contains(&want), "{want:?} in {stdout}\n{stderr}");
}

/// What podman says when the registry cannot be reached (offline).
const UNREACHABLE: &str = "initializing source docker://python:3.12: pinging container registry registry-1.docker.io: \
                           dial tcp: lookup registry-1.docker.io: no such host";

/// A podman whose `image exists` says no and whose `pull` fails with `message` (as
/// podman prints it); everything else is the real podman.
fn podman_failing_pulls(dir: &std::path::Path, message: &str) -> std::path::PathBuf {
    let real = String::from_utf8(Command::new("sh").args(["-c", "command -v podman"]).output().expect("sh").stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let path = dir.join("podman-failing-pulls");
    let script = format!(
        "#!/bin/sh\n\
         for a in \"$@\"; do\n\
           case \"$a\" in\n\
             pull) echo 'Error: {message}' >&2; exit 125;;\n\
             exists) exit 1;;\n\
             run|info|ps|rm|stop|kill|inspect|version) break;;\n\
           esac\n\
         done\n\
         exec {real} \"$@\"\n"
    );
    std::fs::write(&path, script).expect("write the fake podman");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A registry that cannot be reached keeps the job PENDING with podman's message and the
/// fixes, until `[containers] pull_timeout_secs`; then the replica fails with a StartError
/// naming the image, podman's last message and the fixes, and the job is not retried.
#[test]
fn an_unreachable_registry_fails_the_job_after_pull_timeout_secs() {
    if !enabled() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = podman_failing_pulls(dir.path(), UNREACHABLE);
    let s = Server::start(&format!(
        "[containers]\nengine = \"podman\"\nprogram = \"{}\"\npull_timeout_secs = 4\n",
        fake.display()
    ));
    let job = create_as_is(&s, "p", &image_job("offline", "python:3.12", &["python3", "-c", "print(1)"], &[]));
    let name = name_of(&job);
    let pending = s.wait_for(&name, 30, |j| {
        j["trainyardWaitingReason"].as_str().is_some_and(|r| r.contains("pull_timeout_secs"))
    });
    let reason = pending["trainyardWaitingReason"].as_str().unwrap_or("").to_string();
    assert!(reason.contains("no such host") && reason.contains("scripts/images/build.sh"), "{reason}");
    let started = Instant::now();
    let done = s.wait_terminal(&name, 60);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done}");
    let message = done["error"]["message"].as_str().unwrap_or("");
    for want in ["python:3.12", "within 4s", "no such host", "podman load", "scripts/images/build.sh", "engine = \"none\""] {
        assert!(message.contains(want), "error lacks {want:?}: {message}");
    }
    assert_eq!(done["error"]["code"], 3, "a StartError is the user's (INVALID_ARGUMENT): {done}");
    assert!(started.elapsed() < Duration::from_secs(30), "failed after {:?}", started.elapsed());
    let log = s.logs_text(&name);
    assert!(!log.contains("attempt 1"), "a StartError is never retried (L12): {log}");
}

/// Offline is bounded by what a user waits for: a registry that cannot be reached at all
/// fails the job after `[containers] offline_pull_timeout_secs`, however long
/// `pull_timeout_secs` lets a slow pull go on.
#[test]
fn an_unreachable_registry_fails_after_offline_pull_timeout_secs_not_pull_timeout_secs() {
    if !enabled() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = podman_failing_pulls(dir.path(), UNREACHABLE);
    let s = Server::start(&format!(
        "[containers]\nengine = \"podman\"\nprogram = \"{}\"\npull_timeout_secs = 600\noffline_pull_timeout_secs = 3\n",
        fake.display()
    ));
    let job = create_as_is(&s, "p", &image_job("offline", "python:3.12", &["python3", "-c", "print(1)"], &[]));
    let name = name_of(&job);
    let pending = s.wait_for(&name, 30, |j| {
        j["trainyardWaitingReason"].as_str().is_some_and(|r| r.contains("offline_pull_timeout_secs")) || j["state"] == "JOB_STATE_FAILED"
    });
    let done = s.wait_terminal(&name, 60);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done}\n{pending}");
    let message = done["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("could not be reached for 3s") && message.contains("offline_pull_timeout_secs"), "{message}");
}

/// A short name that resolves to nothing can never be pulled: the replica fails at once
/// with a StartError, without waiting for the pull timeout.
#[test]
fn a_short_name_that_does_not_resolve_fails_at_once() {
    if !enabled() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = podman_failing_pulls(
        dir.path(),
        "short-name \"nosuch/image:1\" did not resolve to an alias and no unqualified-search registries are defined",
    );
    let s = Server::start(&format!(
        "[containers]\nengine = \"podman\"\nprogram = \"{}\"\npull_timeout_secs = 600\n",
        fake.display()
    ));
    let job = create_as_is(&s, "p", &image_job("short", "nosuch/image:1", &["true"], &[]));
    let done = s.wait_terminal(&name_of(&job), 30);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done}");
    let message = done["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("nosuch/image:1") && message.contains("did not resolve"), "{message}");
}

/// `custom-jobs create --config examples/failing/job.yaml` against a server on this host
/// that runs images: the job file's directory is in the container, read-only, at its own
/// path, so the job runs the same `train.py` as `local-run` (its traceback, not "can't
/// open file"), and cannot write there.
#[test]
fn create_config_on_this_host_runs_the_job_files_program_in_its_image() {
    if !enabled() {
        return;
    }
    let s = Server::start("");
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    // A copy of the example in a directory the replica's user can read.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    for f in ["job.yaml", "train.py"] {
        std::fs::copy(examples.join("failing").join(f), dir.path().join(f)).expect("copy the example");
    }
    let yaml = std::fs::read_to_string(dir.path().join("job.yaml")).expect("job.yaml");
    std::fs::write(dir.path().join("job.yaml"), yaml.replace("python:3.11", PYTHON)).expect("job.yaml");
    let out = Command::new(BIN)
        .args(["custom-jobs", "create", "--config"])
        .arg(dir.path().join("job.yaml"))
        .args(["--format=json"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .env("TRAINYARD_CLI_CONFIG", dir.path().join("no-cli.toml"))
        .output()
        .expect("run trainyard");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout).expect("json");
    let real = std::fs::canonicalize(dir.path()).expect("canonical");
    assert_eq!(created["trainyardHostDirectories"][0], real.display().to_string(), "{created}");
    let name = name_of(&created);
    let done = s.wait_terminal(&name, 60);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done}");
    assert!(log.contains("ValueError: bad record at line 1337"), "the job file's train.py did not run:\n{log}");
    // Read-only: a job that writes there cannot.
    let script = format!("touch {}/written 2>&1 && echo WROTE || echo READ-ONLY", real.display());
    let mut job = image_job("ro", PYTHON, &["sh", "-c", &script], &[]);
    job["trainyardHostDirectories"] = json!([real.display().to_string()]);
    let ro = create_as_is(&s, "p", &job);
    s.wait_terminal(&name_of(&ro), 60);
    let log = s.logs_text(&name_of(&ro));
    assert!(log.contains("READ-ONLY") && !real.join("written").exists(), "{log}");
}

/// `local-run` is a foreground tool: an image that cannot be pulled fails the job within
/// 30 s (its pull timeout at most), with the image, podman's message and the fixes, and
/// no raw log line of the server's in its output.
#[test]
fn local_run_gives_up_on_an_unreachable_registry_within_30_seconds() {
    if !enabled() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = podman_failing_pulls(dir.path(), UNREACHABLE);
    let config = dir.path().join("trainyard.toml");
    std::fs::write(&config, format!("[containers]\nengine = \"podman\"\nprogram = \"{}\"\n", fake.display())).expect("config");
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    \
         containerSpec: {imageUri: \"python:3.12\", command: [python3, -c, \"print(1)\"]}\n",
    )
    .expect("job");
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["local-run", "--config"])
        .arg(&config)
        .arg(&job)
        .env("TRAINYARD_STORAGE_ROOT", dir.path().join("storage"))
        .env_remove("TRAINYARD_LOG")
        .output()
        .expect("run local-run");
    let took = started.elapsed();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(took < Duration::from_secs(60), "took {took:?}:\n{text}");
    for want in ["python:3.12", "within 30s", "no such host", "scripts/images/build.sh", "engine = \"none\""] {
        assert!(text.contains(want), "no {want:?}:\n{text}");
    }
    assert!(!text.contains(" WARN ") && !text.contains("trainyard_server::"), "a raw log line:\n{text}");
}
