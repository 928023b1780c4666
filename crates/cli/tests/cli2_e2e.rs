//! The CLI never stumbles: `--format` on every command that prints, `--wait` with a
//! progress line and the job's exit code, the trials' logs and the best trial of a study,
//! errors that say how to fix them, relative paths of a job file, and help for every flag.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// `trainyard ARGS` against the test server, in project `cli`, with no CLI config file.
fn trainyard(s: &Server, args: &[&str]) -> Output {
    command(s, args).output().expect("run trainyard")
}

fn command(s: &Server, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "cli")
        .env("TRAINYARD_CLI_CONFIG", s.dir.path().join("no-cli.toml"))
        .env_remove("TRAINYARD_REGION")
        .env_remove("TRAINYARD_TOKEN")
        .stdin(Stdio::null());
    c
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const POOL: &str = "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11";

/// A study of three trials (GRID over units 1..3) whose metric is units / 10: trial 3 is
/// the best for MAXIMIZE.
fn study_file(dir: &Path, goal: &str) -> std::path::PathBuf {
    let cfg = dir.join(format!("study-{goal}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "studySpec:\n  metrics: [{{metricId: accuracy, goal: {goal}}}]\n  parameters:\n    - parameterId: units\n      integerValueSpec: {{minValue: 1, maxValue: 3}}\n  algorithm: GRID_SEARCH\n\
             trialJobSpec:\n  workerPoolSpecs:\n    - machineSpec: {{machineType: n1-standard-4}}\n      replicaCount: 1\n      containerSpec:\n        imageUri: x\n        command: [sh, -c, 'u=${{1#--units=}}; echo \"trial says units=$u\"; echo \"{{\\\"accuracy\\\": \\\"0.$u\\\"}}\" > $CLOUD_ML_HP_METRIC_FILE', sh]\n"
        ),
    )
    .unwrap();
    cfg
}

/// Every command that prints a resource or a list takes `--format=table|json|yaml`.
#[test]
fn every_printing_command_takes_format() {
    let s = Server::start("[quotas.default]\ncustom_model_training_cpus = 64\n");
    // custom-jobs create in each format: the created job itself.
    let mut ids = Vec::new();
    for f in ["json", "yaml", "table"] {
        let o = trainyard(&s, &["custom-jobs", "create", &format!("--display-name=f-{f}"), POOL, "--command=sh,-c,exit 0", &format!("--format={f}")]);
        assert!(o.status.success(), "{}", text(&o));
        let out = stdout(&o);
        let job: Value = match f {
            "json" => serde_json::from_str(&out).expect("json"),
            "yaml" => serde_norway::from_str(&out).expect("yaml"),
            _ => {
                assert!(out.starts_with("FIELD") && out.lines().any(|l| l.starts_with("name ")), "{out}");
                let name = out.lines().find(|l| l.starts_with("name ")).unwrap()["name".len()..].trim().to_string();
                serde_json::json!({ "name": name, "displayName": format!("f-{f}") })
            }
        };
        assert_eq!(job["displayName"], format!("f-{f}"), "{out}");
        ids.push(job["name"].as_str().unwrap().rsplit('/').next().unwrap().to_string());
    }
    let study = study_file(s.dir.path(), "MAXIMIZE");
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=fmt", &format!("--config={}", study.display()), "--max-trial-count=3", "--format=json"]);
    assert!(o.status.success(), "{}", text(&o));
    let created: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(created["displayName"], "fmt");
    let study_id = created["name"].as_str().unwrap().rsplit('/').next().unwrap().to_string();

    let nodes = trainyard(&s, &["nodes", "list", "--format=json"]);
    let nodes: Value = serde_json::from_slice(&nodes.stdout).expect("nodes json");
    let node = nodes[0]["name"].as_str().expect("a node").to_string();

    // (args, is it a list, the table's first heading)
    let cases: Vec<(Vec<&str>, bool, &str)> = vec![
        (vec!["custom-jobs", "list"], true, "ID"),
        (vec!["custom-jobs", "describe", &ids[0]], false, "FIELD"),
        (vec!["hp-tuning-jobs", "list"], true, "ID"),
        (vec!["hp-tuning-jobs", "describe", &study_id], false, ""),
        (vec!["nodes", "list"], true, "NAME"),
        (vec!["nodes", "describe", &node], false, "FIELD"),
        (vec!["quotas", "list"], true, "PROJECT"),
        (vec!["quotas", "reload"], true, "PROJECT"),
        (vec!["config", "list"], false, "FIELD"),
    ];
    for (args, is_list, heading) in cases {
        for f in ["json", "yaml", "table"] {
            let mut all = args.clone();
            let flag = format!("--format={f}");
            all.push(&flag);
            let o = trainyard(&s, &all);
            assert!(o.status.success(), "{all:?}: {}", text(&o));
            let out = stdout(&o);
            let v: Value = match f {
                "json" => serde_json::from_str(&out).unwrap_or_else(|e| panic!("{all:?}: not JSON ({e}):\n{out}")),
                "yaml" => serde_norway::from_str(&out).unwrap_or_else(|e| panic!("{all:?}: not YAML ({e}):\n{out}")),
                _ => {
                    let first = out.lines().find(|l| !l.is_empty()).unwrap_or("");
                    assert!(first.starts_with(heading), "{all:?}: {out}");
                    continue;
                }
            };
            assert_eq!(v.is_array(), is_list, "{all:?}: {out}");
            assert!(v.as_array().is_none_or(|a| !a.is_empty()), "{all:?}: {out}");
        }
    }
}

/// `create --wait`: a progress line (plain lines on state changes when stderr is not a
/// terminal, with the waiting reason), the job's output as it comes (events in words,
/// without their rule ids; none with `--no-logs`), and the exit code of the job's end: 0,
/// 1, 130.
#[test]
fn create_wait_reports_progress_and_exits_with_the_job() {
    let s = Server::start("[quotas.default]\ncustom_model_training_cpus = 4\n");
    // SUCCEEDED: 0.
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=ok", POOL, "--command=sh,-c,sleep 1; echo done", "--wait"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(stdout(&o).contains("is submitted successfully"), "{}", text(&o));
    assert!(err.contains("CustomJob 1: JOB_STATE_RUNNING"), "{err}");
    assert!(err.contains("CustomJob [projects/cli/locations/us-central1/customJobs/1] ended: JOB_STATE_SUCCEEDED after"), "{err}");
    // One line per state, not one per poll.
    assert_eq!(err.matches("JOB_STATE_RUNNING").count(), 1, "{err}");
    // The output, as local-run prints it; events in words.
    assert!(stdout(&o).contains("[workerpool0-0] done"), "{}", text(&o));
    assert!(err.contains("[trainyard] Job is running.") && err.contains("[trainyard] Job completed successfully."), "{err}");
    assert!(!err.contains("L17"), "{err}");

    // Its end said in words first: the program's status, then the service's code; the
    // stderr lines printed already are not repeated.
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=said", POOL, "--command=sh,-c,echo before; echo why >&2; exit 3", "--wait"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = stderr(&o);
    assert!(stdout(&o).contains("[workerpool0-0] before"), "{}", text(&o));
    assert!(err.contains("[workerpool0-0] why"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: The replica workerpool0-0 exited with a non-zero status of 3.") && last.ends_with("[error code 3 (INVALID_ARGUMENT)]"), "{err}");
    assert_eq!(err.matches("why").count(), 1, "{err}");

    // A typo in --project: not just an empty table; the nearest project the server knows.
    let o = trainyard(&s, &["custom-jobs", "list", "--project=clj"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(stderr(&o).contains("No CustomJobs in project clj (us-central1).") && stderr(&o).contains("did you mean --project=cli?"), "{}", text(&o));
    let o = trainyard(&s, &["hp-tuning-jobs", "list"]);
    assert_eq!(stderr(&o).trim(), "No HyperparameterTuningJobs in project cli (us-central1).", "a known project: no guess");

    // A misspelt accelerator type: refused with the nearest valid one.
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=typo", "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11,accelerator-type=NVIDIA_TESLA_T5,accelerator-count=1", "--command=true"]);
    assert!(!o.status.success() && stderr(&o).contains("did you mean \"NVIDIA_TESLA_T4\"?"), "{}", text(&o));

    // --no-logs: the progress and the end only.
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=quiet", POOL, "--command=sh,-c,echo hush", "--wait", "--no-logs"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("hush") && !text(&o).contains("[trainyard]"), "{}", text(&o));

    // FAILED: 1, with the job's error.
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=bad", POOL, "--command=sh,-c,exit 3", "--wait", "--format=json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let end: Value = serde_json::from_slice(&o.stdout).expect("the ended job as JSON");
    assert_eq!(end["state"], "JOB_STATE_FAILED");
    assert!(stderr(&o).contains("non-zero status of 3"), "{}", text(&o));

    // Waiting on quota: the reason is shown; CANCELLED: 130.
    let holder = s.create("cli", &sh_job("holder", "sleep 600"));
    s.wait_for(&name_of(&holder), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let child = command(&s, &["custom-jobs", "create", "--display-name=queued", POOL, "--command=sh,-c,exit 0", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let queued = loop {
        let (_, list) = s.call("GET", &format!("{}?filter=display_name%3D%22queued%22", s.jobs_url("cli")), None);
        if let Some(j) = list["customJobs"].as_array().and_then(|a| a.first()).filter(|j| j["trainyardWaitingReason"].is_string()) {
            break j.clone();
        }
        assert!(Instant::now() < deadline, "never queued: {list}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Let the waiter see it queued, then cancel it.
    std::thread::sleep(Duration::from_millis(1500));
    let (st, _) = s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&queued))), Some("{}"));
    assert_eq!(st, 200);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("JOB_STATE_QUEUED") && err.contains(", waiting: "), "{err}");
    assert!(err.contains(queued["trainyardWaitingReason"].as_str().unwrap()), "{err}\n{queued}");
    assert!(err.contains("ended: JOB_STATE_CANCELLED"), "{err}");

    // Ctrl-C stops waiting (130) and leaves the job alone.
    let child = command(&s, &["custom-jobs", "create", "--display-name=left", POOL, "--command=sh,-c,sleep 600", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let name = format!("projects/cli/locations/us-central1/customJobs/{}", id_of(&queued) + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.call("GET", &s.url(&format!("/v1/{name}")), None).0 != 200 {
        assert!(Instant::now() < deadline, "{name} never created");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("Stopped waiting; CustomJob [") && err.contains("trainyard custom-jobs cancel"), "{err}");
    let job = s.get(&name);
    assert!(matches!(job["state"].as_str(), Some("JOB_STATE_QUEUED" | "JOB_STATE_PENDING" | "JOB_STATE_RUNNING")), "{job}");
}

/// On a terminal the progress line is one line redrawn in place (`script` gives the
/// command a terminal).
#[test]
fn progress_line_is_redrawn_in_place_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        trainyard_backend::skip_test("no `script` (util-linux) to give the command a terminal");
        return;
    }
    let s = Server::start("");
    let inner = format!("'{BIN}' custom-jobs create --display-name=tty {POOL} '--command=sh,-c,sleep 2' --wait");
    let o = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "cli")
        .env("TRAINYARD_CLI_CONFIG", s.dir.path().join("no-cli.toml"))
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out:?}");
    // Redrawn: the line is erased and written again, several times.
    assert!(out.matches("\r\x1b[2KCustomJob 1: JOB_STATE_RUNNING").count() >= 2, "{out:?}");
    assert!(out.contains("ended: JOB_STATE_SUCCEEDED"), "{out:?}");
}

/// local-run keeps the same progress: plain lines on state changes when stderr is not a
/// terminal.
#[test]
fn local_run_reports_progress() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    containerSpec:\n      imageUri: x\n      command: [sh, -c, 'sleep 1; echo out']\n",
    )
    .unwrap();
    let o = Command::new(BIN)
        .arg("local-run")
        .arg(&job)
        .env("TRAINYARD_STORAGE_ROOT", dir.path().join("storage"))
        .env("TRAINYARD_CONTAINER_ENGINE", "none")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{}", text(&o));
    assert!(stdout(&o).contains("[workerpool0-0] out"), "{}", text(&o));
    assert_eq!(err.matches("[trainyard] CustomJob 1: JOB_STATE_RUNNING, ").count(), 1, "{err}");
    assert!(err.contains("ended: JOB_STATE_SUCCEEDED after"), "{err}");
}

/// `hp-tuning-jobs create --wait`, `describe` with the best trial at the top, and
/// `stream-logs` with every trial's lines prefixed with its trial id.
#[test]
fn tuning_jobs_wait_best_trial_and_trial_logs() {
    let s = Server::start("");
    let study = study_file(s.dir.path(), "MAXIMIZE");
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=best", &format!("--config={}", study.display()), "--max-trial-count=3", "--parallel-trial-count=3", "--wait"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(err.contains("HyperparameterTuningJob 1: JOB_STATE_"), "{err}");
    assert!(err.contains("ended: JOB_STATE_SUCCEEDED"), "{err}");

    let o = trainyard(&s, &["hp-tuning-jobs", "describe", "1"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", text(&o));
    let mut lines = out.lines();
    let first = lines.next().unwrap_or("");
    assert!(first.starts_with("# Best trial: ") && first.contains("MAXIMIZE accuracy: accuracy = 0.3"), "{out}");
    assert_eq!(lines.next(), Some("#   units = 3"), "{out}");
    assert!(lines.next().is_some_and(|l| l.starts_with("#   CustomJob: projects/cli/locations/us-central1/customJobs/")), "{out}");
    // Still YAML, and the study as the API shows it, with its best trial.
    let v: Value = serde_norway::from_str(&out).expect("yaml");
    assert_eq!(v["state"], "JOB_STATE_SUCCEEDED");
    assert_eq!(v["bestTrial"]["parameters"][0]["value"], 3.0, "{v}");
    let o = trainyard(&s, &["hp-tuning-jobs", "describe", "1", "--format=table"]);
    assert!(stdout(&o).starts_with("Best trial: "), "{}", text(&o));

    // MINIMIZE: the smallest wins.
    let study = study_file(s.dir.path(), "MINIMIZE");
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=least", &format!("--config={}", study.display()), "--max-trial-count=3", "--wait", "--format=json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ended: Value = serde_json::from_slice(&o.stdout).expect("json");
    let name = ended["name"].as_str().unwrap().to_string();
    let o = trainyard(&s, &["hp-tuning-jobs", "describe", &name]);
    assert!(stdout(&o).contains("accuracy = 0.1") && stdout(&o).contains("#   units = 1"), "{}", text(&o));

    // The trials' logs, each line with its trial.
    let o = trainyard(&s, &["hp-tuning-jobs", "stream-logs", "1"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", text(&o));
    for t in 1..=3 {
        assert!(out.contains(&format!("[trial {t}] ")) && out.contains(&format!("workerpool0-0: trial says units={t}")), "{out}");
        let line = out.lines().find(|l| l.contains(&format!("units={t}"))).unwrap();
        assert!(line.starts_with(&format!("[trial {t}] ")), "{line}");
    }
    assert!(out.lines().all(|l| l.starts_with("[trial ")), "{out}");
    // An ended tuning job's trials come one after the other, in trial order.
    let order: Vec<&str> = out.lines().filter_map(|l| l.split(']').next()).collect();
    let mut sorted = order.clone();
    sorted.sort_by_key(|p| p.trim_start_matches("[trial ").parse::<u32>().unwrap_or(0));
    assert_eq!(order, sorted, "{out}");
    let o = trainyard(&s, &["hp-tuning-jobs", "stream-logs", "1", "--trial=2"]);
    let out = stdout(&o);
    assert!(out.contains("units=2") && !out.contains("units=1") && !out.contains("units=3"), "{out}");

    // A study still running: the logs of trials to come are followed as they come.
    let study = s.dir.path().join("slow.yaml");
    std::fs::write(
        &study,
        "studySpec:\n  metrics: [{metricId: m, goal: MAXIMIZE}]\n  parameters:\n    - parameterId: x\n      integerValueSpec: {minValue: 1, maxValue: 2}\n  algorithm: GRID_SEARCH\n\
         trialJobSpec:\n  workerPoolSpecs:\n    - machineSpec: {machineType: n1-standard-4}\n      replicaCount: 1\n      containerSpec:\n        imageUri: x\n        command: [sh, -c, 'sleep 1; echo slow $1; echo \"{\\\"m\\\": \\\"1\\\"}\" > $CLOUD_ML_HP_METRIC_FILE', sh]\n",
    )
    .unwrap();
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=slow", &format!("--config={}", study.display()), "--max-trial-count=2", "--parallel-trial-count=1", "--format=json"]);
    let created: Value = serde_json::from_slice(&o.stdout).expect("json");
    let o = trainyard(&s, &["hp-tuning-jobs", "stream-logs", created["name"].as_str().unwrap()]);
    let out = stdout(&o);
    assert!(out.contains("slow --x=1") && out.contains("slow --x=2"), "{out}");
    assert!(out.lines().filter(|l| l.contains("slow --x=2")).all(|l| l.starts_with("[trial 2] ")), "{out}");
}

/// Errors say how to fix them: an unreachable server, a missing, unknown or insufficient
/// token, an address that is not a Trainyard server.
#[test]
fn errors_say_how_to_fix_them() {
    // Nothing listens.
    let port = free_port();
    let o = Command::new(BIN)
        .args(["custom-jobs", "list"])
        .env("TRAINYARD_SERVER", format!("127.0.0.1:{port}"))
        .env("TRAINYARD_CLI_CONFIG", "/nonexistent/cli.toml")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let want = format!("cannot reach the Trainyard server at http://127.0.0.1:{port} (start it with trainyard serve, or set --server or TRAINYARD_SERVER)");
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    // Every command says it the same way, stream-logs and waiting ones too.
    for args in [
        &["custom-jobs", "stream-logs", "1"][..],
        &["hp-tuning-jobs", "stream-logs", "1"],
        &["hp-tuning-jobs", "describe", "1"],
        &["nodes", "list"],
        &["quotas", "list"],
    ] {
        let o = Command::new(BIN).args(args).arg(format!("--server=127.0.0.1:{port}")).env("TRAINYARD_CLI_CONFIG", "/nonexistent/cli.toml").output().unwrap();
        assert!(stderr(&o).contains(&want), "{args:?}: {}", stderr(&o));
    }

    // Tokens.
    const RW: &str = "rw-token-0123456789abcdef";
    const RO: &str = "ro-token-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!("[[tokens]]\ntoken = \"{RW}\"\nprojects = [\"cli\"]\n\n[[tokens]]\ntoken = \"{RO}\"\nprojects = [\"cli\"]\naccess = \"read-only\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    let o = trainyard(&s, &["custom-jobs", "list"]);
    assert!(stderr(&o).contains("(UNAUTHENTICATED)") && stderr(&o).contains("--token or TRAINYARD_TOKEN"), "{}", stderr(&o));
    let o = command(&s, &["custom-jobs", "list"]).env("TRAINYARD_TOKEN", "not-a-token-the-server-knows").output().unwrap();
    assert!(stderr(&o).contains("(UNAUTHENTICATED)") && stderr(&o).contains("TRAINYARD_TOKEN") && stderr(&o).contains("not one the server knows"), "{}", stderr(&o));
    let o = command(&s, &["custom-jobs", "create", "--display-name=x", POOL, "--command=true"]).env("TRAINYARD_TOKEN", RO).output().unwrap();
    assert!(stderr(&o).contains("(PERMISSION_DENIED)") && stderr(&o).contains("TRAINYARD_TOKEN") && stderr(&o).contains("read-write"), "{}", stderr(&o));
    let o = command(&s, &["custom-jobs", "list", "--project=other"]).env("TRAINYARD_TOKEN", RW).output().unwrap();
    assert!(stderr(&o).contains("(PERMISSION_DENIED)") && stderr(&o).contains("\"other\"") && stderr(&o).contains("--project"), "{}", stderr(&o));
    let o = command(&s, &["nodes", "list"]).env("TRAINYARD_TOKEN", RW).output().unwrap();
    assert!(stderr(&o).contains("(PERMISSION_DENIED)") && stderr(&o).contains("projects = [\"*\"]"), "{}", stderr(&o));
    let o = command(&s, &["custom-jobs", "list"]).env("TRAINYARD_TOKEN", RW).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // Something else on the port: said so, not a JSON parse error or `null`.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten().take(2) {
            let mut conn = conn;
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            let body = "<html>hello</html>";
            let _ = std::io::Write::write_all(
                &mut conn,
                format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes(),
            );
        }
    });
    let o = Command::new(BIN)
        .args(["custom-jobs", "describe", "1", &format!("--server=127.0.0.1:{other}")])
        .env("TRAINYARD_CLI_CONFIG", "/nonexistent/cli.toml")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not JSON") && stderr(&o).contains("a Trainyard server?"), "{}", text(&o));
}

/// `custom-jobs create --config job.yaml` with `command: [sh, run.sh]`: on a server of
/// this host, run.sh is the one next to the job file (as local-run runs it); with a server
/// elsewhere, refused, naming the path and what to do instead.
#[test]
fn job_file_relative_paths() {
    let s = Server::start("");
    let project = s.dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("run.sh"), "echo \"ran run.sh with $1\"\n").unwrap();
    std::fs::write(project.join("input.txt"), "data\n").unwrap();
    let job = project.join("job.yaml");
    std::fs::write(
        &job,
        "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    containerSpec:\n      imageUri: x\n      command: [sh, run.sh]\n      args: [input.txt]\n",
    )
    .unwrap();
    // From another directory, as `trainyard custom-jobs create --config project/job.yaml`.
    let o = command(&s, &["custom-jobs", "create", "--config=project/job.yaml", "--wait", "--format=json"]).current_dir(s.dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ended: Value = serde_json::from_slice(&o.stdout).expect("json");
    let spec = &ended["jobSpec"]["workerPoolSpecs"][0]["containerSpec"];
    assert_eq!(spec["command"][1], project.join("run.sh").display().to_string(), "{ended}");
    assert_eq!(spec["args"][0], project.join("input.txt").display().to_string(), "{ended}");
    let logs = s.logs_text(ended["name"].as_str().unwrap());
    assert!(logs.contains(&format!("ran run.sh with {}", project.join("input.txt").display())), "{logs}");

    // A server elsewhere: refused before anything is sent, naming the path.
    let o = command(&s, &["custom-jobs", "create", &format!("--config={}", job.display()), "--server=http://192.0.2.1:8080"]).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("\"run.sh\"") && err.contains("workerPoolSpecs[0].containerSpec.command[1]"), "{err}");
    assert!(err.contains("absolute path") && err.contains("container image") && err.contains("--keep-relative-paths"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");
    // The same for a study's trials.
    let study = project.join("study.yaml");
    std::fs::write(
        &study,
        "studySpec:\n  metrics: [{metricId: m, goal: MAXIMIZE}]\n  parameters:\n    - parameterId: x\n      integerValueSpec: {minValue: 1, maxValue: 2}\n\
         trialJobSpec:\n  workerPoolSpecs:\n    - machineSpec: {machineType: n1-standard-4}\n      replicaCount: 1\n      containerSpec: {imageUri: x, command: [sh, run.sh]}\n",
    )
    .unwrap();
    let o = command(&s, &["hp-tuning-jobs", "create", "--display-name=t", &format!("--config={}", study.display()), "--server=http://192.0.2.1:8080"]).output().unwrap();
    assert!(stderr(&o).contains("\"run.sh\""), "{}", stderr(&o));
    // --keep-relative-paths: sent as written (here: to a server that is not there).
    let o = command(&s, &["custom-jobs", "create", &format!("--config={}", job.display()), "--server=http://127.0.0.1:1", "--keep-relative-paths"]).output().unwrap();
    assert!(stderr(&o).contains("cannot reach"), "{}", stderr(&o));
    let o = command(&s, &["custom-jobs", "create", &format!("--config={}", job.display()), "--keep-relative-paths", "--format=json"]).output().unwrap();
    let kept: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(kept["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], serde_json::json!(["sh", "run.sh"]));
}

/// Every subcommand's `--help` describes every flag, argument and subcommand.
#[test]
fn every_flag_has_help() {
    let mut missing = Vec::new();
    let mut seen = 0;
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let o = Command::new(BIN).args(&path).arg("--help").output().unwrap();
        assert!(o.status.success(), "{path:?} --help: {}", text(&o));
        let help = stdout(&o);
        seen += 1;
        for (section, spec) in undocumented(&help) {
            missing.push(format!("trainyard {} {section} {spec}", path.join(" ")));
        }
        for sub in subcommands(&help) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
    }
    assert!(seen >= 25, "only {seen} help pages");
    assert!(missing.is_empty(), "without a description:\n{}", missing.join("\n"));
}

/// The names under `Commands:` (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for l in help.lines().filter(|l| !l.is_empty()) {
        if !l.starts_with(' ') {
            inside = l == "Commands:";
            continue;
        }
        if inside && l.len() - l.trim_start().len() == 2 {
            let name = l.split_whitespace().next().unwrap_or("");
            if name != "help" {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// Entries of `Options:`, `Arguments:` and `Commands:` without a description, on their
/// line (short help) or the next, deeper one (long help). `[env: ...]`, `[default: ...]`
/// and possible values alone are not a description.
fn undocumented(help: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = help.lines().collect();
    let mut out = Vec::new();
    let mut section = "";
    for (i, l) in lines.iter().enumerate() {
        if l.is_empty() {
            continue;
        }
        if !l.starts_with(' ') {
            section = l;
            continue;
        }
        if !matches!(section, "Options:" | "Arguments:" | "Commands:") {
            continue;
        }
        // Entries are indented 2 (`  -h, --help`, `  <JOB>`, `  list`) or 6 (`      --format`);
        // a long help's descriptions 10.
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let entry = match section {
            "Commands:" => indent == 2,
            _ => indent <= 6 && t.starts_with(['-', '<', '[']),
        };
        if !entry {
            continue;
        }
        let (spec, rest) = match t.find("  ") {
            Some(k) => (&t[..k], t[k..].trim()),
            None => (t, ""),
        };
        let described = |s: &str| !s.is_empty() && !s.starts_with('[') && !s.starts_with("Possible values:");
        if described(rest) {
            continue;
        }
        let next = lines.get(i + 1).copied().unwrap_or("");
        let nt = next.trim_start();
        if rest.is_empty() && next.len() - nt.len() > 6 && described(nt) {
            continue;
        }
        out.push((section.trim_end_matches(':').to_string(), spec.to_string()));
    }
    out
}

#[test]
fn help_parser_finds_what_lacks_a_description() {
    let help = "Usage: x\n\nArguments:\n  <JOB>\n\nOptions:\n      --a <A>  Does a\n      --b <B>  [env: B=]\n      --c <C>\n          Does c\n\n          [env: C=]\n\n      --d <D>\n          Possible values:\n          - x\n  -h, --help  Print help\n";
    let found: Vec<String> = undocumented(help).into_iter().map(|(_, s)| s).collect();
    assert_eq!(found, ["<JOB>", "--b <B>", "--d <D>"]);
}

/// `list --page-size N` asks for N jobs a request and still shows every page; `create`
/// with no pool says how to give one, and creates nothing.
#[test]
fn list_pages_and_create_without_a_pool() {
    let s = Server::start("");
    for i in 0..3 {
        s.create("cli", &sh_job(&format!("paged-{i}"), "true"));
    }
    let o = trainyard(&s, &["custom-jobs", "list", "--page-size=1", "--format=json"]);
    assert!(o.status.success(), "{}", text(&o));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");
    let o = trainyard(&s, &["custom-jobs", "list", "--page-size=0"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = trainyard(&s, &["custom-jobs", "create", "--display-name=x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(stderr(&o).contains("at least one worker pool") && !stderr(&o).contains("invalid type"), "{}", stderr(&o));
    let (_, list) = s.call("GET", &s.jobs_url("cli"), None);
    assert_eq!(list["customJobs"].as_array().map(Vec::len), Some(3), "nothing created: {list}");
}

/// A broken job file is one line naming the file, the line and the field, for `local-run`
/// and `create --config` alike, and nothing is created.
#[test]
fn a_broken_job_file_names_its_line_and_field() {
    let s = Server::start("");
    let dir = tempfile::tempdir().unwrap();
    let no_machine = dir.path().join("no-machine.yaml");
    std::fs::write(&no_machine, "# a job\nworkerPoolSpecs:\n  - replicaCount: 1\n    containerSpec: {imageUri: x, command: [\"true\"]}\n").unwrap();
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "workerPoolSpecs:\n  - machineSpec: {machineTyp: n1-standard-4}\n    replicaCount: 1\n").unwrap();
    let not_yaml = dir.path().join("not-yaml.yaml");
    std::fs::write(&not_yaml, "workerPoolSpecs:\n  - machineSpec: {machineType: n1\n").unwrap();
    for (file, want) in [
        (&no_machine, "line 3: jobSpec.workerPoolSpecs[0].machineSpec is required"),
        (&typo, "line 2: Invalid JSON payload received. Unknown name \"machineTyp\""),
        (&not_yaml, "is not valid YAML"),
    ] {
        let f = file.display().to_string();
        for args in [vec!["local-run", f.as_str()], vec!["custom-jobs", "create", "--config", f.as_str()]] {
            let o = trainyard(&s, &args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            let err = stderr(&o);
            assert!(err.contains(&f) && err.contains(want), "{args:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        }
    }
    let o = trainyard(&s, &["custom-jobs", "create", "--config", &dir.path().join("missing.yaml").display().to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(stderr(&o).contains("missing.yaml"), "{}", stderr(&o));
    let (_, list) = s.call("GET", &s.jobs_url("cli"), None);
    assert!(list.get("customJobs").is_none(), "nothing created: {list}");
}

/// `hp-tuning-jobs create --config` with a trial command that names a script beside the
/// config file, as `custom-jobs create --config` and `local-run` take it: the path is made
/// absolute and its directory asked for (`trainyardHostDirectories`), which the tuning
/// job accepts and hands to every trial (it was refused as an unknown field).
#[test]
fn a_tuning_job_runs_a_script_beside_its_config() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start("");
    let dir = tempfile::tempdir().unwrap();
    // Replicas may run as a project's own user: the directory must be readable by it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("train.sh"), "u=${1#--units=}\necho \"{\\\"accuracy\\\": \\\"0.$u\\\"}\" > \"$CLOUD_ML_HP_METRIC_FILE\"\n").unwrap();
    std::fs::set_permissions(dir.path().join("train.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = dir.path().join("study.yaml");
    std::fs::write(
        &cfg,
        "studySpec:\n  metrics: [{metricId: accuracy, goal: MAXIMIZE}]\n  parameters:\n    - parameterId: units\n      integerValueSpec: {minValue: 1, maxValue: 2}\n  algorithm: GRID_SEARCH\n\
         trialJobSpec:\n  workerPoolSpecs:\n    - machineSpec: {machineType: n1-standard-4}\n      replicaCount: 1\n      containerSpec:\n        imageUri: x\n        command: [sh, train.sh]\n",
    )
    .unwrap();
    let o = trainyard(&s, &["hp-tuning-jobs", "create", "--display-name=beside", &format!("--config={}", cfg.display()), "--max-trial-count=2", "--wait", "--format=json"]);
    assert!(o.status.success(), "{}", text(&o));
    let done: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let here = std::fs::canonicalize(dir.path()).unwrap().display().to_string();
    assert_eq!(done["trainyardHostDirectories"], serde_json::json!([here]), "{done:#}");
    let script = format!("{here}/train.sh");
    assert_eq!(done["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], serde_json::json!(["sh", script]));
    for t in done["trials"].as_array().unwrap() {
        assert_eq!(t["state"], "SUCCEEDED", "{t:#}");
        let job = s.get(t["customJob"].as_str().unwrap());
        assert_eq!(job["trainyardHostDirectories"], serde_json::json!([here]), "{job:#}");
    }
}
