//! End-to-end lifecycle tests: a real server, real processes, over HTTP.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn state(j: &Value) -> &str {
    j["state"].as_str().unwrap_or("")
}

/// L6, L7, L8, L17, L22, TY4: a two-pool job gets its environment, runs, succeeds when the
/// primary exits 0 (the worker is shut down), and its logs hold every line.
#[test]
fn l8_l17_multi_replica_success() {
    let s = Server::start("");
    let job = json!({
        "displayName": "multi",
        "labels": {"team": "nlp"},
        "jobSpec": {"workerPoolSpecs": [
            {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
             "containerSpec": {"imageUri": "i", "command": ["sh", "-c",
                "echo primary rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT; echo \"tf=$TF_CONFIG\"; sleep 1"]}},
            {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 2,
             "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "echo worker rank=$RANK job=$CLOUD_ML_JOB_ID; sleep 60"],
                               "env": [{"name": "MY_VAR", "value": "x"}]}}
        ]}
    });
    let created = s.create("p", &job);
    let name = name_of(&created);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}");
    assert!(done["startTime"].is_string() && done["endTime"].is_string(), "{done:#}");
    assert!(done.get("error").is_none());
    assert_eq!(done["labels"]["team"], "nlp");
    let text = s.logs_text(&name);
    assert!(text.contains("primary rank=0 world=3 master=127."), "{text}");
    assert!(text.contains("worker rank=1"), "{text}");
    assert!(text.contains("worker rank=2"), "{text}");
    assert!(text.contains(&format!("job={}", id_of(&created))), "{text}");
    assert!(text.contains("\"type\":\"chief\""), "{text}");
    for event in ["Job queued.", "Job is running.", "Job completed successfully."] {
        assert!(text.contains(event), "missing {event}: {text}");
    }
    // L20: the workers were shut down.
    assert!(pids_with(&format!("job={}", id_of(&created))).is_empty());
}

/// L13: a replica that exits non-zero fails the job with code 3, the replica's name, its
/// exit status and the tail of its stderr.
#[test]
fn l13_user_error_with_stderr_tail() {
    let s = Server::start("");
    let j = s.create("p", &sh_job("fail", "echo 'Traceback (most recent call last):' >&2; echo 'ValueError: bad lr' >&2; exit 3"));
    let done = s.wait_terminal(&name_of(&j), 30);
    assert_eq!(state(&done), "JOB_STATE_FAILED");
    assert_eq!(done["error"]["code"], 3);
    let m = done["error"]["message"].as_str().unwrap();
    assert!(m.starts_with("The replica workerpool0-0 exited with a non-zero status of 3. Termination reason: Error."), "{m}");
    assert!(m.contains("ValueError: bad lr"), "{m}");
}

/// L13: a program that cannot be started is a StartError.
#[test]
fn l13_start_error() {
    let s = Server::start("");
    let mut job = sh_job("nostart", "");
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = json!(["/nonexistent/train"]);
    let j = s.create("p", &job);
    let done = s.wait_terminal(&name_of(&j), 30);
    assert_eq!(state(&done), "JOB_STATE_FAILED");
    let m = done["error"]["message"].as_str().unwrap();
    assert!(m.contains("Termination reason: StartError."), "{m}");
    assert!(m.contains("/nonexistent/train"), "{m}");
}

/// L13, L12: a transient exit code (134) retries the whole job; the retry succeeds.
#[test]
fn l13_transient_exit_code_retries_job() {
    let s = Server::start("");
    let marker = s.dir.path().join("first-run-done");
    let script = format!("if [ -e {m} ]; then echo second; exit 0; else touch {m}; exit 134; fi", m = marker.display());
    let j = s.create("p", &sh_job("transient", &script));
    let name = name_of(&j);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let text = s.logs_text(&name);
    assert!(text.contains("Job retry 1 of 3: replica workerpool0-0 exited with transient status 134"), "{text}");
    assert!(run_dir(&s.data_dir(), id_of(&j), 1, "workerpool0-0", 0).exists(), "attempt 1 ran");
}

/// L10, L11: a replica killed by a signal is restarted on its own (same attempt).
#[test]
fn l10_non_permanent_failure_restarts_replica() {
    let s = Server::start("");
    let marker = s.dir.path().join("killed-once");
    let script = format!("if [ -e {m} ]; then echo resumed; exit 0; else touch {m}; kill -9 $$; fi", m = marker.display());
    let j = s.create("p", &sh_job("restart", &script));
    let name = name_of(&j);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let text = s.logs_text(&name);
    assert!(text.contains("was killed by signal 9; restarting it (1 of 5)"), "{text}");
    assert!(run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 1).exists(), "restart 1 of attempt 0 ran");
}

/// L14: a real memory hog under its machine type's limit is OOM-killed: FAILED, code 8.
#[test]
fn l14_out_of_memory() {
    let s = Server::start("");
    let job = json!({
        "displayName": "oom",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-1"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "i", "command": ["python3", "-c",
                "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024 * 1024))\n"]}
        }]}
    });
    let j = s.create("p", &job);
    let done = s.wait_terminal(&name_of(&j), 60);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done:#}");
    assert_eq!(done["error"]["code"], 8, "{done:#}");
    assert_eq!(
        done["error"]["message"],
        "The replica workerpool0-0 ran out of memory and exited with a non-zero status of 137."
    );
}

/// L18, L20: cancel shuts every process of the job down, children included, and ends
/// CANCELLED with code 1.
#[test]
fn l18_l20_cancel_leaves_nothing_behind() {
    let s = Server::start("");
    // A unique sleep length tags the job's processes: a child, a setsid grandchild, itself.
    let secs = 300_000 + free_port() as u32;
    let tag = format!("sleep {secs}");
    let script = format!("{tag} & setsid {tag} & {tag}");
    let j = s.create("p", &sh_job("cancel-me", &script));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| state(j) == "JOB_STATE_RUNNING");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!pids_with(&tag).is_empty(), "the job's processes run");
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!((status, body.clone()), (200, json!({})));
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_CANCELLED");
    assert_eq!(done["error"]["code"], 1);
    assert!(pids_with(&tag).is_empty(), "processes left: {:?}", pids_with(&tag));
    // L18: cancelling a terminal job is refused.
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 400);
    assert_eq!(body["error"]["status"], "FAILED_PRECONDITION");
}

/// L19: a job over its scheduling.timeout is shut down and FAILED with code 4.
#[test]
fn l19_timeout() {
    let s = Server::start("");
    let mut job = sh_job("timeout", "sleep 120");
    job["jobSpec"]["scheduling"] = json!({"timeout": "2s"});
    let j = s.create("p", &job);
    let done = s.wait_terminal(&name_of(&j), 30);
    assert_eq!(state(&done), "JOB_STATE_FAILED");
    assert_eq!(done["error"]["code"], 4, "{done:#}");
}

/// L3, L4, L5: with a quota of 8 CPUs, a second n1-standard-4 x2 job waits QUEUED and runs
/// when the first ends; a job above the limit is refused with 429 naming the metric.
#[test]
fn l3_l4_l5_quota() {
    let s = Server::start("[quotas.default]\ncustom_model_training_cpus = 8\n");
    let mut two = sh_job("big", "sleep 2");
    two["jobSpec"]["workerPoolSpecs"] = json!([
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1", "containerSpec": {"imageUri": "i", "command": ["sleep", "2"]}},
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1", "containerSpec": {"imageUri": "i", "command": ["sleep", "60"]}}
    ]);
    let a = s.create("p", &two);
    assert_eq!(state(&a), "JOB_STATE_PENDING", "admitted at once: {a:#}");
    let b = s.create("p", &two);
    assert_eq!(state(&b), "JOB_STATE_QUEUED");
    // Why is it waiting? A documented extension field says so (from the scheduling round
    // that follows the create).
    let b_now = s.wait_for(&name_of(&b), 5, |j| j.get("trainyardWaitingReason").is_some());
    let reason = b_now["trainyardWaitingReason"].as_str().unwrap_or("").to_string();
    assert!(reason.contains("Waiting for quota: custom_model_training_cpus: needs 8, 8 of 8 in use"), "{reason}");
    let (status, body) = s.call("POST", &s.jobs_url("p"), Some(&{
        let mut huge = two.clone();
        huge["jobSpec"]["workerPoolSpecs"][1]["replicaCount"] = json!(3);
        huge.to_string()
    }));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    assert!(body["error"]["message"].as_str().unwrap().contains("custom_model_training_cpus"));
    let a_done = s.wait_terminal(&name_of(&a), 30);
    assert_eq!(state(&a_done), "JOB_STATE_SUCCEEDED");
    let b_done = s.wait_terminal(&name_of(&b), 30);
    assert_eq!(state(&b_done), "JOB_STATE_SUCCEEDED");
    assert!(b_done.get("trainyardWaitingReason").is_none(), "only waiting jobs carry a reason");
    assert!(s.logs_text(&name_of(&b)).contains("Waiting for quota: custom_model_training_cpus: needs 8, 8 of 8 in use"));
}

/// L15: a job waiting for capacity shows its place among its project's waiting jobs as
/// the latest round gives it; its log line, written once when it started to wait, gives
/// no place that the page would later contradict ("position 1 of 1" there, "1 of 2" here).
#[test]
fn l15_a_waiting_jobs_place_is_shown_from_the_latest_round_and_never_written() {
    if skip_on_slurm("declared nodes are the local scheduler's; on Slurm the engine places the work") {
        return;
    }
    let s = Server::start("[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n");
    let running = s.create("p", &sh_job("running", "sleep 120"));
    s.wait_for(&name_of(&running), 20, |j| state(j) == "JOB_STATE_RUNNING");
    let first = s.create("p", &sh_job("first", "true"));
    let reason = |j: &Value| j["trainyardWaitingReason"].as_str().unwrap_or("").to_string();
    s.wait_for(&name_of(&first), 10, |j| reason(j).contains("position 1 of 1 among project p's waiting jobs"));
    s.wait_for(&name_of(&first), 10, |_| s.logs_text(&name_of(&first)).contains("Waiting for"));
    let second = s.create("p", &sh_job("second", "true"));
    s.wait_for(&name_of(&first), 10, |j| reason(j).contains("position 1 of 2"));
    s.wait_for(&name_of(&second), 10, |j| reason(j).contains("position 2 of 2"));
    let log = s.logs_text(&name_of(&first));
    assert!(!log.contains("position"), "a place in the queue was written: {log}");
    for j in [&second, &first, &running] {
        let (status, body) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(j))), None);
        assert_eq!(status, 200, "{body}");
    }
}

/// L21: the checkpoint directory is the same for every restart and retry.
#[test]
fn l21_checkpoint_dir_kept_across_restarts() {
    let s = Server::start("");
    let script = "d=$AIP_CHECKPOINT_DIR; echo dir=$d; if [ -e $d/ckpt ]; then echo resumed; exit 0; fi; echo 1 > $d/ckpt; kill -9 $$";
    let mut job = sh_job("ckpt", script);
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://bucket/ckpt-test"});
    let j = s.create("p", &job);
    let name = name_of(&j);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let text = s.logs_text(&name);
    let dirs: Vec<&str> = text.lines().filter(|l| l.contains("dir=")).collect();
    assert_eq!(dirs.len(), 2, "{text}");
    assert_eq!(dirs[0].split("dir=").nth(1), dirs[1].split("dir=").nth(1));
    assert!(text.contains("resumed"));
    assert!(s.data_dir().join("storage/p/bucket/ckpt-test/checkpoints/ckpt").exists(), "in project p's namespace");
}

/// L23: the server is killed with SIGKILL while jobs are QUEUED, RUNNING, in the middle of
/// a replica restart, and finishing. Started again it has every job; running replicas were
/// adopted, not restarted; and every job ends by the rules.
#[test]
fn l23_server_killed_and_restarted() {
    let mut s = Server::start("[quotas.default]\ncustom_model_training_cpus = 12\n");
    let tmp = s.dir.path().to_path_buf();
    // A: runs across the outage and finishes after it.
    let a = s.create("p", &sh_job("running", "sleep 3; echo A done"));
    // B: killed by a signal once (restart), then runs across the outage.
    let m = tmp.join("b-killed");
    let b = s.create("p", &sh_job("restarting", &format!("if [ -e {m} ]; then sleep 3; echo B done; exit 0; fi; touch {m}; sleep 0.5; kill -9 $$", m = m.display())));
    // C: finishes while the server is down.
    let c = s.create("p", &sh_job("finishing", "sleep 1; echo C done; exit 0"));
    // D: QUEUED (quota 12 = three n1-standard-4).
    let d = s.create("p", &sh_job("queued", "echo D done"));
    assert_eq!(state(&d), "JOB_STATE_QUEUED");
    let (an, bn, cn, dn) = (name_of(&a), name_of(&b), name_of(&c), name_of(&d));
    s.wait_for(&an, 30, |j| state(j) == "JOB_STATE_RUNNING");
    // Wait until B's first run was killed and its restart started.
    let b_restart = run_dir(&s.data_dir(), id_of(&b), 0, "workerpool0-0", 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !b_restart.join("started.json").exists() {
        assert!(std::time::Instant::now() < deadline, "B never restarted:\n{}", s.logs_text(&bn));
        std::thread::sleep(Duration::from_millis(20));
    }
    let a_started = std::fs::read_to_string(run_dir(&s.data_dir(), id_of(&a), 0, "workerpool0-0", 0).join("started.json")).unwrap();
    s.kill9();
    // C finishes while the server is down.
    std::thread::sleep(Duration::from_millis(1500));
    s.spawn();
    // Every job is there.
    for n in [&an, &bn, &cn, &dn] {
        s.get(n);
    }
    for (n, want) in [(&an, "A done"), (&bn, "B done"), (&cn, "C done"), (&dn, "D done")] {
        let done = s.wait_terminal(n, 60);
        assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{n}: {done:#}\n{}", s.logs_text(n));
        assert!(s.logs_text(n).contains(want), "{n}: {}", s.logs_text(n));
    }
    // A's replica was adopted: same run, same process, no restart.
    let a_after = std::fs::read_to_string(run_dir(&s.data_dir(), id_of(&a), 0, "workerpool0-0", 0).join("started.json")).unwrap();
    assert_eq!(a_started, a_after);
    assert!(!run_dir(&s.data_dir(), id_of(&a), 0, "workerpool0-0", 1).exists(), "A was not restarted");
    // B kept its counters: one restart, no second.
    assert!(!run_dir(&s.data_dir(), id_of(&b), 0, "workerpool0-0", 2).exists());
    assert!(!run_dir(&s.data_dir(), id_of(&b), 1, "workerpool0-0", 0).exists(), "B was not retried");
}

/// The default node overcommits: an `a2-highgpu-1g` primary runs a CPU-only program, with
/// a warning in the job's log, under its machine type's memory limit (L14).
#[test]
fn missing_accelerator_runs_with_warning() {
    let s = Server::start_builtin();
    let job = json!({
        "displayName": "gpu",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "a2-highgpu-1g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 1},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "echo cpu only"]}
        }]}
    });
    let j = s.create("p", &job);
    let name = name_of(&j);
    let done = s.wait_terminal(&name, 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED");
    let text = s.logs_text(&name);
    assert!(text.contains("asks for 1 x NVIDIA_TESLA_A100 but node local has 0"), "{text}");
}

/// pythonPackageSpec: the package (in the project's storage) is installed into the job's
/// venv and `python -m MODULE ARGS` runs.
#[test]
fn python_package_spec_runs_module() {
    let s = Server::start("");
    let pkg = s.data_dir().join("storage/p/pkgs/pkg");
    std::fs::create_dir_all(pkg.join("trainer")).unwrap();
    std::fs::write(pkg.join("setup.py"), "from setuptools import setup\nsetup(name='trainer', version='0.1', packages=['trainer'])\n").unwrap();
    std::fs::write(pkg.join("trainer/__init__.py"), "").unwrap();
    std::fs::write(pkg.join("trainer/task.py"), "import sys\nprint('task args', sys.argv[1:])\n").unwrap();
    let job = json!({
        "displayName": "pkg",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "pythonPackageSpec": {"executorImageUri": "python:3.11", "packageUris": ["gs://pkgs/pkg"],
                                  "pythonModule": "trainer.task", "args": ["--lr", "0.1"]}
        }]}
    });
    let j = s.create("p", &job);
    let name = name_of(&j);
    let done = s.wait_terminal(&name, 180);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name));
    assert!(s.logs_text(&name).contains("task args ['--lr', '0.1']"), "{}", s.logs_text(&name));
}

/// pythonPackageSpec with a package index that cannot be reached (an offline host): the
/// package installs from what the host has, without the index, or the replica fails at
/// once with one line naming the index and what was missing; never pip's retries.
#[test]
fn python_package_spec_installs_offline_or_says_why_at_once() {
    if skip_in_containers("a container installs with its image's pip") {
        return;
    }
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let s = Server::start(&format!("[replicas]\npackage_index = \"http://127.0.0.1:{closed}/simple\"\n"));
    let write_package = |dir: &str| {
        let pkg = s.data_dir().join("storage/p/pkgs").join(dir);
        std::fs::create_dir_all(pkg.join("trainer")).unwrap();
        std::fs::write(pkg.join("setup.py"), "from setuptools import setup\nsetup(name='trainer', version='0.1', packages=['trainer'])\n").unwrap();
        std::fs::write(pkg.join("trainer/__init__.py"), "").unwrap();
        std::fs::write(pkg.join("trainer/task.py"), "print('offline task ran')\n").unwrap();
        pkg
    };
    write_package("pkg");
    let job = json!({
        "displayName": "pkg-offline",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "pythonPackageSpec": {"executorImageUri": "python:3.11", "packageUris": ["gs://pkgs/pkg"], "pythonModule": "trainer.task"}
        }]}
    });
    // The same package, but built by a backend nobody has: it cannot install offline.
    let absent = write_package("absent");
    std::fs::write(absent.join("pyproject.toml"), "[build-system]\nrequires = [\"trainyard-absent-backend\"]\nbuild-backend = \"trainyard_absent_backend\"\n").unwrap();
    let mut other = job.clone();
    other["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["packageUris"] = json!(["gs://pkgs/absent"]);
    let (j, k) = (s.create("p", &job), s.create("p", &other));
    let said = format!("the package index http://127.0.0.1:{closed}/simple cannot be reached from the replica");
    for (j, must_fail) in [(j, false), (k, true)] {
        let name = name_of(&j);
        let done = s.wait_terminal(&name, 180);
        let text = s.logs_text(&name);
        assert!(!text.contains("Retrying"), "pip retried the index:\n{text}");
        // The plain package builds where the replicas' Python has wheel's bdist_wheel (or
        // setuptools 70.1 or later); else it too fails, saying so.
        if state(&done) == "JOB_STATE_SUCCEEDED" && !must_fail {
            assert!(text.contains("offline task ran"), "{text}");
        } else {
            assert_eq!(state(&done), "JOB_STATE_FAILED", "{done:#}\n{text}");
            assert!(text.contains(&said), "{text}");
            if must_fail {
                assert!(text.contains("trainyard_absent_backend") || text.contains("trainyard-absent-backend"), "{text}");
            }
        }
    }
}

/// The SDK's paths for host programs: `/gcs/<bucket>/<path>` is the project's object (a
/// mount namespace of the replica's as root, else a rewrite of command and args), and a
/// command that runs pip gets a venv of the job's first on PATH and a home and user base
/// of the replica's, so that `pip install --upgrade pip && pip3 install --user` never
/// changes the host's Python or the server user's home.
#[test]
fn gcs_paths_and_pip_isolation_for_host_programs() {
    if skip_in_containers("a container has its own /gcs and Python") || skip_on_slurm("the job's venv is built on the server") {
        return;
    }
    let s = Server::start("");
    let obj = s.data_dir().join("storage/p/bkt/data");
    std::fs::create_dir_all(&obj).unwrap();
    std::fs::write(obj.join("x.txt"), "object contents\n").unwrap();
    let j = s.create("p", &sh_job("gcs", "cat /gcs/bkt/data/x.txt; echo \"pip=$(command -v pip) home=$HOME base=$PYTHONUSERBASE\""));
    let done = s.wait_terminal(&name_of(&j), 120);
    let text = s.logs_text(&name_of(&j));
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{text}");
    assert!(text.contains("object contents"), "{text}");
    let venv = s.data_dir().join(format!("venvs/{}/bin/pip", id_of(&j)));
    assert!(text.contains(&format!("pip={}", venv.display())), "{text}");
    let home = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0).join("home");
    assert!(text.contains(&format!("home={} base={}/.local", home.display(), home.display())), "{text}");
}

/// Hang detection (label `trainyard-hang-after-secs`): a replica that stops writing is
/// reported (TY4, once), one that writes slowly but steadily is not; with
/// `trainyard-hang-restart` the silent one is restarted, counted as a signal death (L10).
#[test]
fn hang_detection_reports_a_silent_replica_and_not_a_slow_one() {
    let s = Server::start("");
    // 3 s of silence, not less: in container mode the engine's teardown after the
    // program's last line (removing the container before the outcome is written) takes
    // about a second on a loaded machine, and counts as silence.
    let mut silent = sh_job("silent", "echo started; sleep 7; echo done");
    silent["labels"] = json!({"trainyard-hang-after-secs": "3"});
    let mut steady = sh_job("steady", "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.5; done");
    steady["labels"] = json!({"trainyard-hang-after-secs": "3"});
    let (a, b) = (s.create("p", &silent), s.create("p", &steady));
    for j in [&a, &b] {
        assert_eq!(state(&s.wait_terminal(&name_of(j), 60)), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name_of(j)));
    }
    let text = s.logs_text(&name_of(&a));
    assert_eq!(text.matches("may be hung").count(), 1, "reported once: {text}");
    assert!(text.contains("TY4: Replica workerpool0-0 may be hung: no output to its log"), "{text}");
    assert!(text.find("may be hung") < text.find("stdout: done"), "reported while silent, before its last line: {text}");
    assert!(!s.logs_text(&name_of(&b)).contains("may be hung"), "{}", s.logs_text(&name_of(&b)));
    let metrics = ureq::get(&s.url("/metrics")).call().unwrap().into_body().read_to_string().unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("trainyard_replica_hangs_total ") && !l.ends_with(" 0")), "{metrics}");

    let marker = s.dir.path().join("hung-once");
    let script = format!("if [ -e {m} ]; then echo recovered; exit 0; fi; touch {m}; echo started; sleep 300", m = marker.display());
    let mut restart = sh_job("restart", &script);
    restart["labels"] = json!({"trainyard-hang-after-secs": "1", "trainyard-hang-restart": "true"});
    let r = s.create("p", &restart);
    let done = s.wait_terminal(&name_of(&r), 60);
    let text = s.logs_text(&name_of(&r));
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{text}");
    assert!(text.contains("may be hung") && text.contains("stopping it to restart it") && text.contains("restarting it (1 of 5)") && text.contains("recovered"), "{text}");
}

/// L13 extended on a real server: a failure rule on a log pattern retries a job whose exit
/// status alone would be permanent, and its log names the rule.
#[test]
fn ty9_l12_a_failure_rule_on_a_log_pattern_retries_the_job() {
    let s = Server::start(
        "[[lifecycle.failure_rules]]\nname = \"flaky-io\"\nlog_pattern = \"Input/output error\"\naction = \"transient\"\n",
    );
    let marker = s.dir.path().join("failed-once");
    let script = format!(
        "if [ -e {m} ]; then echo second try; exit 0; fi; touch {m}; echo 'read: Input/output error' >&2; exit 1",
        m = marker.display()
    );
    let name = name_of(&s.create("p", &sh_job("flaky", &script)));
    let done = s.wait_terminal(&name, 60);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("failure rule flaky-io matched: transient"), "{log}");
}

/// L19 warned on a real server: the label `trainyard-timeout-warning-secs` sends SIGUSR1
/// to the program that long before its time limit, once; the program writes a last
/// checkpoint and ends.
#[test]
fn ty6_the_timeout_warning_reaches_the_program_before_the_limit() {
    let s = Server::start("");
    let mut job = sh_job(
        "warned",
        "trap 'echo warned > \"$AIP_CHECKPOINT_DIR/last\"; exit 0' USR1; echo started; sleep 300 & wait; sleep 300 & wait",
    );
    job["jobSpec"]["scheduling"] = json!({"timeout": "30s"});
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://b/warned"});
    job["labels"] = json!({"trainyard-timeout-warning-secs": "27"});
    let name = name_of(&s.create("p", &job));
    let done = s.wait_terminal(&name, 60);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("27s away: SIGUSR1 sent to every replica"), "{log}");
    let last = s.data_dir().join("storage/p/b/warned/checkpoints/last");
    assert_eq!(std::fs::read_to_string(&last).unwrap_or_default().trim(), "warned", "{}", last.display());
}

/// TY11, L19 on every backend and in containers (scripts/test runs this file on each): with
/// `[lifecycle] preemption_notice_secs`, the timeout first gives the program notice
/// (SIGUSR1, and `$TRAINYARD_NOTICE_FILE` with the reason, the deadline and the signal,
/// which a container sees at its own path); SIGTERM follows at the notice's end, and the
/// job fails DEADLINE_EXCEEDED.
#[test]
fn ty11_l19_the_timeout_gives_notice_then_sigterm() {
    let mut s = Server::prepare("");
    let text = std::fs::read_to_string(&s.config).expect("config").replace("[lifecycle]\n", "[lifecycle]\npreemption_notice_secs = 3\n");
    std::fs::write(&s.config, text).expect("config");
    s.spawn();
    let mut job = sh_job(
        "noticed",
        "trap 'echo notice=$(cat \"$TRAINYARD_NOTICE_FILE\")' USR1; trap 'echo term-after-notice; exit 1' TERM; \
         echo ready; while true; do sleep 0.1; done",
    );
    job["jobSpec"]["scheduling"] = json!({"timeout": "8s"});
    let name = name_of(&s.create("p", &job));
    let done = s.wait_terminal(&name, 90);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done:#}\n{log}");
    assert_eq!(done["error"]["code"], 4, "DEADLINE_EXCEEDED: {done:#}");
    let line = log.lines().find_map(|l| l.split("notice=").nth(1)).unwrap_or_default();
    let notice: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("the notice ({e}):\n{log}"));
    assert_eq!(notice["signal"], "SIGUSR1", "{notice}");
    assert!(notice["reason"].as_str().unwrap_or("").starts_with("timeout:"), "{notice}");
    let (noticed, termed) = (log.find("notice="), log.find("term-after-notice"));
    assert!(matches!((noticed, termed), (Some(a), Some(b)) if a < b), "notice, then SIGTERM:\n{log}");
}

/// L21, L10: a restarted replica is given the newest entry of its checkpoint directory
/// (`TRAINYARD_LATEST_CHECKPOINT`, as the program sees `AIP_CHECKPOINT_DIR`); a first
/// start has none.
#[test]
fn l21_a_restarted_replica_is_given_its_latest_checkpoint() {
    if skip_in_containers("a container's init ignores the SIGKILL it sends itself") {
        return;
    }
    let s = Server::start("");
    let mut job = sh_job(
        "latest",
        "d=$AIP_CHECKPOINT_DIR; if [ -n \"$TRAINYARD_LATEST_CHECKPOINT\" ]; then echo \"latest=$TRAINYARD_LATEST_CHECKPOINT\"; exit 0; fi; \
         echo first start; echo 1 > \"$d/step-1\"; sleep 1; echo 2 > \"$d/step-2\"; kill -9 $$",
    );
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://b/latest"});
    let name = name_of(&s.create("p", &job));
    let done = s.wait_terminal(&name, 60);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    let dir = s.data_dir().join("storage/p/b/latest/checkpoints");
    assert!(log.contains("first start"), "{log}");
    assert!(log.contains(&format!("latest={}/step-2", dir.display())), "{log}");
}

/// Hangs and stragglers with a real program of three ranks that step together (each waits
/// for the others' step files, as a collective does): one rank is stopped with SIGSTOP
/// mid-training; it is named a straggler (the others, waiting for it, are not reported),
/// its processes' stacks go to the log, the job's resource shows it, it is restarted (L10)
/// and resumes from its step, and the job SUCCEEDS. Prints the time from the stop to the
/// report and to progress again.
#[test]
fn ty5_l10_a_stopped_rank_is_a_straggler_restarted_and_the_job_succeeds() {
    if skip_in_containers("the test stops a host process by its pid") || skip_on_slurm("one gang's timing on the development cluster; the local backend shows the rule") {
        return;
    }
    let s = Server::start("");
    let program = r#"
import os, sys, time
d = os.environ["AIP_CHECKPOINT_DIR"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mine = os.path.join(d, "rank%d" % rank)
step = int(open(mine).read()) if os.path.exists(mine) else 0
if step:
    print("rank %d resumes at step %d" % (rank, step), flush=True)
def at(r):
    try:
        return int(open(os.path.join(d, "rank%d" % r)).read() or 0)
    except (OSError, ValueError):
        return 0
while step < 60:
    step += 1
    tmp = mine + ".tmp"
    open(tmp, "w").write(str(step))
    os.replace(tmp, mine)
    print("rank %d step %d" % (rank, step), flush=True)
    while min(at(r) for r in range(world)) < step:
        time.sleep(0.02)
    time.sleep(0.1)
print("rank %d done" % rank, flush=True)
"#;
    let mut job = json!({"displayName": "ranks", "jobSpec": {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
         "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", program]}},
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "2",
         "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", program]}}]}});
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://b/ranks"});
    job["labels"] = json!({"trainyard-hang-after-secs": "3", "trainyard-hang-restart": "true"});
    let j = s.create("p", &job);
    let name = name_of(&j);
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let ckpt = s.data_dir().join("storage/p/b/ranks/checkpoints/rank2");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(&ckpt).ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(0) < 5 {
        assert!(std::time::Instant::now() < deadline, "no progress:\n{}", s.logs_text(&name));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let started: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir(&s.data_dir(), id_of(&j), 0, "workerpool1-1", 0).join("started.json")).expect("started.json"),
    )
    .expect("json");
    let pid = started["pid"].as_i64().expect("pid") as i32;
    let stopped_at = std::time::Instant::now();
    // SAFETY: kill(2) has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let mut reported = None;
    let mut health = Value::Null;
    while std::time::Instant::now() < stopped_at + std::time::Duration::from_secs(30) {
        let log = s.logs_text(&name);
        if log.contains("workerpool1-1 is a straggler") {
            reported.get_or_insert(stopped_at.elapsed());
        }
        let r = s.get(&name);
        if r["trainyardHealth"]["state"] == "straggler" {
            health = r["trainyardHealth"].clone();
        }
        if reported.is_some() && log.contains("rank 2 resumes at step") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let resumed = stopped_at.elapsed();
    let done = s.wait_terminal(&name, 120);
    let log = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    let reported = reported.unwrap_or_else(|| panic!("no straggler report:\n{log}"));
    eprintln!("measure: a rank stopped; straggler reported after {reported:?}, progress again after {resumed:?} (hang_after 3 s)");
    assert!(log.contains("workerpool1-1 is a straggler (its processes are stopped)"), "{log}");
    assert!(!log.contains("workerpool0-0 may be hung") && !log.contains("workerpool1-0 may be hung"), "the waiting ranks are not reported:\n{log}");
    assert!(log.contains("workerpool1-1's processes when its silence was reported") && log.contains("state T"), "{log}");
    assert!(log.contains("rank 2 resumes at step") && log.contains("restarting it (1 of 5)"), "{log}");
    assert!(health.is_null() || health["replica"] == "workerpool1-1", "{health}");
}

/// Progress and ETA (`$TRAINYARD_PROGRESS_FILE`): a job that appends `{"step", "total"}`
/// lines shows `trainyardProgress` (step, total, steps per second, an ETA ahead) within a
/// window of its first report, in the resource, at `/metrics`; a garbage line is ignored
/// with one event.
#[test]
fn progress_and_eta_appear_from_the_programs_reports() {
    let s = Server::start("");
    let job = sh_job(
        "progress",
        "echo garbage >> \"$TRAINYARD_PROGRESS_FILE\"; for i in $(seq 1 150); do echo \"{\\\"step\\\": $i, \\\"total\\\": 150}\" >> \"$TRAINYARD_PROGRESS_FILE\"; sleep 0.2; done",
    );
    let name = name_of(&s.create("p", &job));
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let started = std::time::Instant::now();
    let j = s.wait_for(&name, 40, |j| j["trainyardProgress"]["stepsPerSecond"].as_f64().is_some() && j["trainyardProgress"]["eta"].is_string());
    eprintln!("measure: progress with a rate and an ETA {:?} after RUNNING", started.elapsed());
    let p = &j["trainyardProgress"];
    assert_eq!(p["total"], "150", "{p}");
    let step: i64 = p["step"].as_str().and_then(|s| s.parse().ok()).unwrap_or(-1);
    assert!((1..=150).contains(&step), "{p}");
    let rate = p["stepsPerSecond"].as_f64().unwrap_or(0.0);
    assert!(rate > 1.0 && rate < 10.0, "about 5 steps per second: {p}");
    let eta = trainyard_api::Timestamp::parse_rfc3339(p["eta"].as_str().unwrap_or("")).expect("eta").micros();
    let update = trainyard_api::Timestamp::parse_rfc3339(j["updateTime"].as_str().unwrap_or("")).expect("updateTime").micros();
    assert!(eta > update, "the ETA is ahead: {p}");
    let metrics = ureq::get(&s.url("/metrics")).call().unwrap().into_body().read_to_string().unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("trainyard_job_progress_step{") && l.contains("project=\"p\"")), "{metrics}");
    let log = s.logs_text(&name);
    assert_eq!(log.matches("progress file is ignored (not a JSON object: garbage)").count(), 1, "{log}");
    s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
}
