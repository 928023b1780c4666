//! The fleet: virtual nodes on this host, node drain (L9), quotas at run time.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

const TWO_NODES: &str = "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n";

fn cli(s: &Server, args: &[&str]) -> (bool, String) {
    let o = Command::new(BIN).args(args).env("TRAINYARD_SERVER", s.url("")).env_remove("TRAINYARD_TOKEN").output().unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// L9: draining a node gives its replica SIGTERM and the grace period, then restarts it on
/// the other node with the same name and address; the restart is not counted (L11).
#[test]
fn l9_drain_moves_replicas_to_another_node() {
    let s = Server::start(TWO_NODES);
    // The program traps SIGTERM, checkpoints (a file) and exits; restarted, it finds the
    // checkpoint and finishes. It says where it runs once its trap is set: the drain
    // waits for that (a SIGTERM before the trap would end it without a checkpoint).
    let marker = s.dir.path().join("ckpt");
    let script = format!(
        "trap 'echo saving; touch {m}; exit 0' TERM; \
         echo addr=$(echo $CLUSTER_SPEC | sed 's/.*workerpool0\":\\[\"\\([^\"]*\\)\".*/\\1/') node=$TRAINYARD_NODE; \
         if [ -e {m} ]; then echo resumed; exit 0; fi; \
         while true; do sleep 0.1; done",
        m = marker.display()
    );
    let j = s.create("p", &sh_job("drain-me", &script));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !s.logs_text(&name).contains("addr=") {
        assert!(std::time::Instant::now() < deadline, "the program never started: {}", s.logs_text(&name));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let first = node_of(&s, &j, "workerpool0-0", 0);
    let (ok, out) = cli(&s, &["nodes", "drain", &first]);
    assert!(ok, "{out}");
    let done = s.wait_terminal(&name, 30);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let second = node_of(&s, &j, "workerpool0-0", 1);
    assert_ne!(first, second, "restarted on the other node");
    let text = s.logs_text(&name);
    assert!(text.contains("saving"), "SIGTERM reached the program: {text}");
    assert!(text.contains(&format!("Replica workerpool0-0 restarted on node {second} after node maintenance.")), "{text}");
    let addrs: Vec<&str> = text.lines().filter_map(|l| l.split("addr=").nth(1)).map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(addrs.len(), 2, "{text}");
    assert_eq!(addrs[0], addrs[1], "same address across the move");
    assert!(!text.contains("restarting it (1 of 5)"), "not counted as a failure: {text}");
    // The drained node takes no new work; undrained, it does again.
    let (ok, out) = cli(&s, &["nodes", "list"]);
    assert!(ok && out.contains("DRAINED"), "{out}");
    let j2 = s.create("p", &sh_job("after-drain", "echo node=$TRAINYARD_NODE"));
    s.wait_terminal(&name_of(&j2), 30);
    assert_eq!(node_of(&s, &j2, "workerpool0-0", 0), second);
    let (ok, _) = cli(&s, &["nodes", "undrain", &first]);
    assert!(ok);
    let (_, body) = s.call("GET", &s.url(&format!("/v1/admin/nodes/{first}")), None);
    assert_eq!(body["state"], "UP");
}

/// L9, L15: draining the only node that can hold a replica is a stockout for its job.
#[test]
fn l15_drain_without_room_is_a_stockout() {
    let s = Server::start("[[nodes]]\nname = \"only\"\ncpus = 4\nmemory_gb = 16\n");
    let j = s.create("p", &sh_job("stuck", "sleep 300"));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let (st, _) = s.call("POST", &s.url("/v1/admin/nodes/only:drain"), Some("{}"));
    assert_eq!(st, 200);
    let j = s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_PENDING" && j["trainyardWaitingReason"].is_string());
    assert!(j["trainyardWaitingReason"].as_str().unwrap().contains("Stockout"), "{j:#}");
    assert!(s.logs_text(&name).contains("Resources are insufficient in region: us-central1."));
    s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    s.wait_terminal(&name, 30);
}

/// Unknown nodes are 404; a fleet file with a node listed twice is refused at start.
#[test]
fn unknown_node_and_bad_fleet_file() {
    let s = Server::start(TWO_NODES);
    let (st, b) = s.call("POST", &s.url("/v1/admin/nodes/n9:drain"), Some("{}"));
    assert_eq!((st, b["error"]["status"].as_str()), (404, Some("NOT_FOUND")), "{b}");
    let (ok, out) = cli(&s, &["nodes", "drain", "n9"]);
    assert!(!ok && out.contains("NOT_FOUND"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fleet.toml");
    std::fs::write(&cfg, format!("{TWO_NODES}\n[[nodes]]\nname = \"n1\"\ncpus = 2\nmemory_gb = 4\n")).unwrap();
    let o = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("fleet.toml") && err.contains("nodes[2].name") && err.contains("listed twice"), "{err}");
}

/// L3, L5: quotas list shows limit, use and queued demand; a larger limit read again at
/// run time admits the queued job without a restart.
#[test]
fn l3_quotas_listed_and_changed_at_run_time() {
    let s = Server::start("[quotas.default]\ncustom_model_training_cpus = 4\n");
    let a = s.create("q", &sh_job("a", "sleep 300"));
    let b = s.create("q", &sh_job("b", "echo b ran"));
    assert_eq!(b["state"], "JOB_STATE_QUEUED");
    let (ok, out) = cli(&s, &["quotas", "list"]);
    assert!(ok, "{out}");
    let row = out.lines().find(|l| l.starts_with("q ")).unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols, ["q", "us-central1", "custom_model_training_cpus", "4", "4", "4", "-", "-", "-"], "{out}");
    // Raise the limit in the config file and read it again.
    let text = std::fs::read_to_string(&s.config).unwrap().replace("custom_model_training_cpus = 4", "custom_model_training_cpus = 8");
    std::fs::write(&s.config, text).unwrap();
    let (ok, out) = cli(&s, &["quotas", "reload"]);
    assert!(ok, "{out}");
    let done = s.wait_terminal(&name_of(&b), 30);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED");
    // A broken file is refused and changes nothing.
    std::fs::write(&s.config, "[quotas.default]\ncustom_model_training_cpus = \"many\"\n").unwrap();
    let (st, body) = s.call("POST", &s.url("/v1/admin/quotas:reload"), Some("{}"));
    assert_eq!(st, 400, "{body}");
    let (_, body) = s.call("GET", &s.url("/v1/admin/quotas"), None);
    assert!(body["quotas"].as_array().unwrap().iter().any(|r| r["limit"] == "8"), "{body}");
    s.call("POST", &s.url(&format!("/v1/{}:cancel", name_of(&a))), Some("{}"));
    s.wait_terminal(&name_of(&a), 30);
}

/// L9: a virtual node whose agent dies is lost: its replica is restarted at once on the
/// other node, with the same name and address, not counted against L11; the node is DOWN
/// until it is brought back.
#[test]
fn l9_node_loss_restarts_replicas_elsewhere() {
    let s = Server::start(TWO_NODES);
    let marker = s.dir.path().join("lost-once");
    let script = format!("echo node=$TRAINYARD_NODE; if [ -e {m} ]; then echo resumed; exit 0; fi; touch {m}; sleep 300", m = marker.display());
    let j = s.create("p", &sh_job("node-loss", &script));
    let name = name_of(&j);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let first = node_of(&s, &j, "workerpool0-0", 0);
    let lock = s.data_dir().join("nodes").join(format!("{first}.lock"));
    let agents = pids_with(&format!("node-agent {}", lock.display()));
    assert_eq!(agents.len(), 1, "one agent per node: {agents:?}");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(agents[0], libc::SIGKILL);
    }
    let done = s.wait_terminal(&name, 30);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name));
    let second = node_of(&s, &j, "workerpool0-0", 1);
    assert_ne!(first, second);
    let text = s.logs_text(&name);
    assert!(text.contains(&format!("its node was lost; restarting it on node {second}")), "{text}");
    assert!(!text.contains("restarting it (1 of 5)"), "not counted: {text}");
    let (_, node) = s.call("GET", &s.url(&format!("/v1/admin/nodes/{first}")), None);
    assert_eq!(node["state"], "DOWN");
    // Brought back, its agent runs again.
    let (ok, out) = cli(&s, &["nodes", "undrain", &first]);
    assert!(ok, "{out}");
    let (_, node) = s.call("GET", &s.url(&format!("/v1/admin/nodes/{first}")), None);
    assert_eq!(node["state"], "UP");
    assert_eq!(pids_with(&format!("node-agent {}", lock.display())).len(), 1);
}

/// SPOT: a SPOT job runs on idle capacity; when non-SPOT work needs the node, the SPOT job
/// gets SIGTERM and its grace period, waits PENDING, and runs again when capacity returns,
/// counted against no retry budget.
/// Holds TY1 (docs/lifecycle.md).
#[test]
fn spot_job_is_preempted_and_comes_back() {
    let s = Server::start("[[nodes]]\nname = \"only\"\ncpus = 4\nmemory_gb = 16\n\n[scheduler]\nspot_min_runtime_secs = 0\n");
    let marker = s.dir.path().join("spot-ran");
    let script = format!(
        "if [ -e {m} ]; then echo spot finished; exit 0; fi; touch {m}; trap 'echo spot got SIGTERM; exit 0' TERM; while true; do sleep 0.1; done",
        m = marker.display()
    );
    let mut spot = sh_job("spot", &script);
    spot["jobSpec"]["scheduling"] = serde_json::json!({"strategy": "SPOT"});
    let spot = s.create("p", &spot);
    let spot_name = name_of(&spot);
    s.wait_for(&spot_name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let urgent = s.create("p", &sh_job("urgent", "sleep 1; echo urgent done"));
    let urgent_done = s.wait_terminal(&name_of(&urgent), 60);
    assert_eq!(urgent_done["state"], "JOB_STATE_SUCCEEDED");
    let spot_done = s.wait_terminal(&spot_name, 60);
    assert_eq!(spot_done["state"], "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&spot_name));
    let text = s.logs_text(&spot_name);
    assert!(text.contains("SPOT job preempted"), "{text}");
    assert!(text.contains("spot got SIGTERM"), "the grace period let it checkpoint: {text}");
    assert!(text.contains("spot finished"), "{text}");
    assert!(!text.contains("Job retry"), "no retry budget spent: {text}");
    assert!(run_dir(&s.data_dir(), id_of(&spot), 1, "workerpool0-0", 0).exists(), "a fresh attempt ran");
}

/// The jobs list of project `p`.
fn listed(s: &Server, what: &str) -> Vec<Value> {
    let (st, body) = s.call("GET", &s.url(&format!("/v1/projects/p/locations/us-central1/{what}")), None);
    assert_eq!(st, 200, "{body}");
    body[what].as_array().cloned().unwrap_or_default()
}

/// A job with these pools (machine type, replica count), each running `sh -c true`.
fn pools_job(name: &str, pools: &[(&str, u32)]) -> Value {
    let specs: Vec<Value> = pools
        .iter()
        .map(|(mt, n)| {
            serde_json::json!({
                "machineSpec": {"machineType": mt}, "replicaCount": n.to_string(),
                "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", "true"]}
            })
        })
        .collect();
    serde_json::json!({"displayName": name, "jobSpec": {"workerPoolSpecs": specs}})
}

/// Never-fit is an error, not a stockout (L15): on a fleet of known nodes, a replica
/// larger than every node and a gang larger than the fleet are refused at create with 400
/// naming the pool and the largest node, for CustomJobs and tuning jobs' trial specs;
/// nothing is stored. On one 4-CPU `[node]`, three 4-CPU replicas are refused too.
#[test]
fn l15_never_fitting_jobs_are_refused_at_create() {
    let s = Server::start(TWO_NODES);
    let refused = |s: &Server, job: &Value, what: &str| {
        let (st, body) = s.call("POST", &s.url(&format!("/v1/projects/p/locations/us-central1/{what}")), Some(&job.to_string()));
        assert_eq!((st, body["error"]["status"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");
        body["error"]["message"].as_str().unwrap_or_default().to_string()
    };
    // A replica larger than every node.
    let m = refused(&s, &pools_job("too-large", &[("n1-standard-4", 1), ("n1-standard-8", 1)]), "customJobs");
    assert_eq!(
        m,
        "jobSpec.workerPoolSpecs[1]: a replica of n1-standard-8 needs 8 CPUs and 30 GiB, but the largest node (n1) has 4 CPUs and 16 GiB"
    );
    // A gang larger than the fleet: three 4-CPU replicas on two 4-CPU nodes.
    let m = refused(&s, &pools_job("too-many", &[("n1-standard-4", 1), ("n1-standard-4", 2)]), "customJobs");
    assert_eq!(
        m,
        "jobSpec.workerPoolSpecs: the job's 3 replicas of 4 CPUs and 15 GiB (workerPoolSpecs[0]: 1 x n1-standard-4; \
         workerPoolSpecs[1]: 2 x n1-standard-4) cannot be placed together on the fleet: 2 nodes of 4 CPUs and 16 GiB; \
         the largest node (n1) has 4 CPUs and 16 GiB"
    );
    let m = refused(&s, &pools_job("mixed", &[("n1-standard-4", 1), ("n1-standard-2", 2), ("n1-standard-4", 1)]), "customJobs");
    assert!(m.starts_with("jobSpec.workerPoolSpecs: the job's 4 replicas (workerPoolSpecs[0]: 1 x n1-standard-4 of 4 CPUs and 15 GiB;"), "{m}");
    assert!(m.contains("workerPoolSpecs[1]: 2 x n1-standard-2 of 2 CPUs and 7.5 GiB") && m.contains("the largest node (n1)"), "{m}");
    // The CLI shows the same refusal.
    let (ok, out) = cli(
        &s,
        &[
            "custom-jobs",
            "create",
            "--project=p",
            "--display-name=cli",
            "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=python:3.11",
            "--worker-pool-spec=machine-type=n1-standard-4,replica-count=2,container-image-uri=python:3.11",
            "--command=true",
        ],
    );
    assert!(!ok && out.contains("cannot be placed together on the fleet"), "{out}");
    // A tuning job's trial spec: the field path is trialJobSpec's.
    let mut study = serde_json::json!({
        "displayName": "tune",
        "studySpec": {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}]},
        "maxTrialCount": 2, "parallelTrialCount": 1,
    });
    study["trialJobSpec"] = pools_job("t", &[("n1-standard-4", 1), ("n1-standard-4", 2)])["jobSpec"].clone();
    let m = refused(&s, &study, "hyperparameterTuningJobs");
    assert!(m.starts_with("trialJobSpec.workerPoolSpecs: the job's 3 replicas of 4 CPUs and 15 GiB"), "{m}");
    study["trialJobSpec"] = pools_job("t", &[("n1-highmem-8", 1)])["jobSpec"].clone();
    let m = refused(&s, &study, "hyperparameterTuningJobs");
    assert!(m.starts_with("trialJobSpec.workerPoolSpecs[0]: a replica of n1-highmem-8 needs 8 CPUs"), "{m}");
    // Nothing was stored.
    assert!(listed(&s, "customJobs").is_empty());
    assert!(listed(&s, "hyperparameterTuningJobs").is_empty());
    // What fits the fleet is accepted and runs.
    let ok = s.create("p", &pools_job("fits", &[("n1-standard-4", 1), ("n1-standard-4", 1)]));
    assert_eq!(s.wait_terminal(&name_of(&ok), 30)["state"], "JOB_STATE_SUCCEEDED");
    drop(s);

    // The example: one 4-CPU [node], a job of three 4-CPU replicas.
    let s = Server::start("[node]\ncpus = 4\nmemory_gb = 16\n");
    let m = refused(&s, &pools_job("three", &[("n1-standard-4", 1), ("n1-standard-4", 2)]), "customJobs");
    assert!(m.contains("the job's 3 replicas of 4 CPUs") && m.contains("1 node of 4 CPUs and 16 GiB; the largest node (local)"), "{m}");
    assert!(listed(&s, "customJobs").is_empty());
}

/// A job that becomes impossible when the fleet shrinks (a restart with fewer nodes in the
/// config) fails with a clear error (FAILED_PRECONDITION, naming its pool and the largest
/// node) instead of waiting or being retried as a stockout; a job that still fits goes on.
#[test]
fn l15_job_impossible_after_the_fleet_shrinks_fails() {
    let mut s = Server::start(&format!("{TWO_NODES}\n[quotas.default]\ncustom_model_training_cpus = 8\n"));
    let a = s.create("p", &sh_job("holds-quota", "sleep 300"));
    let a_name = name_of(&a);
    s.wait_for(&a_name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    // Two 4-CPU replicas: they fit the two nodes, but wait for the quota `a` holds.
    let b = s.create("p", &pools_job("pair", &[("n1-standard-4", 1), ("n1-standard-4", 1)]));
    let b_name = name_of(&b);
    s.wait_for(&b_name, 30, |j| j["state"] == "JOB_STATE_QUEUED" && j["trainyardWaitingReason"].is_string());
    // The config loses n2; the server restarts.
    s.kill9();
    let text = std::fs::read_to_string(&s.config).unwrap().replace("[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n", "");
    assert!(!text.contains("n2"), "{text}");
    std::fs::write(&s.config, text).unwrap();
    s.spawn();
    let done = s.wait_terminal(&b_name, 30);
    assert_eq!(done["state"], "JOB_STATE_FAILED", "{done:#}");
    assert_eq!(done["error"]["code"], 9, "{done:#}");
    let m = done["error"]["message"].as_str().unwrap();
    assert!(m.contains("can never be placed on this fleet"), "{m}");
    assert!(m.contains("its 2 replicas of 4 CPUs and 15 GiB (workerPoolSpecs[0]: 1; workerPoolSpecs[1]: 1)"), "{m}");
    assert!(m.contains("the largest node (n1) has 4 CPUs and 16 GiB"), "{m}");
    let log = s.logs_text(&b_name);
    assert!(!log.contains("Resources are insufficient"), "not a stockout: {log}");
    // The job that fits the smaller fleet is still running.
    assert_eq!(s.get(&a_name)["state"], "JOB_STATE_RUNNING");
    s.call("POST", &s.url(&format!("/v1/{a_name}:cancel")), Some("{}"));
    s.wait_terminal(&a_name, 30);
}

/// Priority classes end to end: with one node that holds one job at a time, an urgent job
/// created after a batch job of another project starts first once the node frees, and the
/// batch job's waiting reason says work of a higher class goes ahead of it (naming no
/// project). A label naming no class is refused (400) naming the label and the classes,
/// and creates nothing; the urgent class is open to project b alone (`projects`), so
/// project a's job naming it is refused (403) naming the class and the project, and
/// creates nothing.
#[test]
fn a_job_of_a_higher_priority_class_starts_first() {
    let s = Server::start(
        "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[scheduler]\ndefault_priority_class = \"batch\"\n\
         [[scheduler.priority_classes]]\nname = \"urgent\"\nvalue = 1000\nprojects = [\"b\"]\n[[scheduler.priority_classes]]\nname = \"batch\"\nvalue = 0\n",
    );
    let labelled = |name: &str, class: &str| {
        let mut j = sh_job(name, "sleep 300");
        j["labels"] = serde_json::json!({"trainyard-priority-class": class});
        j
    };
    let blocker = name_of(&s.create("a", &sh_job("blocker", "sleep 300")));
    s.wait_for(&blocker, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let batch = name_of(&s.create("a", &sh_job("batch", "sleep 300")));
    let urgent = name_of(&s.create("b", &labelled("urgent", "urgent")));
    // Both wait; the older batch job behind the urgent one, and it says so.
    let waiting = s.wait_for(&batch, 30, |j| j["trainyardWaitingReason"].as_str().is_some_and(|r| r.contains("higher priority class")));
    let reason = waiting["trainyardWaitingReason"].as_str().unwrap_or("");
    assert!(!reason.contains("\"b\"") && !reason.contains("project b"), "{reason}");
    assert!(!s.get(&urgent)["trainyardWaitingReason"].as_str().unwrap_or("").contains("higher priority"));
    s.call("POST", &s.url(&format!("/v1/{blocker}:cancel")), Some("{}"));
    s.wait_for(&urgent, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_ne!(s.get(&batch)["state"], "JOB_STATE_RUNNING", "the node holds one job: the urgent one");

    let (_, before) = s.call("GET", &s.jobs_url("a"), None);
    let (status, body) = s.call("POST", &s.jobs_url("a"), Some(&labelled("asap", "asap").to_string()));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("trainyard-priority-class") && message.contains("urgent, batch"), "{message}");
    let (_, after) = s.call("GET", &s.jobs_url("a"), None);
    assert_eq!(before["customJobs"].as_array().map(Vec::len), after["customJobs"].as_array().map(Vec::len), "nothing created");
    let (status, body) = s.call("POST", &s.jobs_url("a"), Some(&labelled("mine-first", "urgent").to_string()));
    assert_eq!((status, body["error"]["status"].as_str()), (403, Some("PERMISSION_DENIED")), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("\"urgent\"") && message.contains("\"a\""), "{message}");
    let (_, after) = s.call("GET", &s.jobs_url("a"), None);
    assert_eq!(before["customJobs"].as_array().map(Vec::len), after["customJobs"].as_array().map(Vec::len), "nothing created");
    for j in [&urgent, &batch] {
        s.call("POST", &s.url(&format!("/v1/{j}:cancel")), Some("{}"));
    }
}

/// Priority preemption end to end (`[scheduler] priority_preemption`): on one node, a
/// checkpointing batch job is preempted by an urgent job of another project, which runs
/// and ends; the batch job goes back to the queue, starts again with the same
/// `AIP_CHECKPOINT_DIR`, resumes from its checkpoint and SUCCEEDS, its preemption logged
/// with the class that preempted it and counted as no worker restart (L11) or job retry
/// (L12).
#[test]
fn l11_l12_a_lower_priority_job_is_preempted_and_resumes_from_its_checkpoint() {
    if skip_on_slurm("one local node") {
        return;
    }
    let s = Server::start(
        "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[scheduler]\npriority_preemption = true\nmin_runtime_secs = 0\n\
         default_priority_class = \"batch\"\n[[scheduler.priority_classes]]\nname = \"urgent\"\nvalue = 1000\n\
         [[scheduler.priority_classes]]\nname = \"batch\"\nvalue = 0\n",
    );
    let mut batch = sh_job(
        "batch",
        "d=$AIP_CHECKPOINT_DIR; if [ -f \"$d/step\" ]; then echo \"resumed from $(cat \"$d/step\")\"; exit 0; fi; \
         echo 1 > \"$d/step\"; trap 'exit 143' TERM; sleep 300 & wait",
    );
    batch["jobSpec"]["baseOutputDirectory"] = serde_json::json!({"outputUriPrefix": "gs://b/batch"});
    let batch = name_of(&s.create("a", &batch));
    let ckpt = s.data_dir().join("storage/a/b/batch/checkpoints/step");
    s.wait_for(&batch, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ckpt.exists() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint at {}", ckpt.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut urgent = sh_job("urgent", "sleep 1");
    urgent["labels"] = serde_json::json!({"trainyard-priority-class": "urgent"});
    let urgent = name_of(&s.create("b", &urgent));
    let done = s.wait_terminal(&urgent, 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let done = s.wait_terminal(&batch, 120);
    let log = s.logs_text(&batch);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("resumed from 1"), "resumed from its checkpoint:\n{log}");
    assert!(log.contains("Job preempted (1 so far)") && log.contains("priority class urgent"), "{log}");
    assert!(!log.contains("restarting it (") && !log.contains("Job retry"), "no restart or retry counted:\n{log}");
}

/// L3, L5 with a cohort (`[[quotas.cohorts]]`): project a runs past its quota on b's idle
/// quota (shown as borrowed and lent in `GET /v1/admin/quotas`); when b submits, the
/// borrowing job is preempted within a round and its grace period, goes back QUEUED giving
/// its quota back, b's job runs, and the borrower then resumes from its checkpoint and
/// SUCCEEDS, counted as no worker restart (L11) or job retry (L12).
#[test]
fn l3_l5_a_borrowing_project_gives_quota_back_when_the_lender_submits() {
    if skip_on_slurm("local nodes") {
        return;
    }
    let s = Server::start(
        "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n\n\
         [scheduler]\npriority_preemption = true\n\
         [quotas.projects.a]\ncustom_model_training_cpus = 4\n[quotas.projects.b]\ncustom_model_training_cpus = 4\n\
         [[quotas.cohorts]]\nname = \"lab\"\nprojects = [\"a\", \"b\"]\n",
    );
    let first = name_of(&s.create("a", &sh_job("first", "sleep 300")));
    s.wait_for(&first, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let mut second = sh_job(
        "second",
        "d=$AIP_CHECKPOINT_DIR; if [ -f \"$d/step\" ]; then echo \"resumed from $(cat \"$d/step\")\"; exit 0; fi; \
         echo 1 > \"$d/step\"; trap 'exit 143' TERM; sleep 300 & wait",
    );
    second["jobSpec"]["baseOutputDirectory"] = serde_json::json!({"outputUriPrefix": "gs://b/second"});
    let second = name_of(&s.create("a", &second));
    s.wait_for(&second, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let ckpt = s.data_dir().join("storage/a/b/second/checkpoints/step");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ckpt.exists() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint at {}", ckpt.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, q) = s.call("GET", &s.url("/v1/admin/quotas"), None);
    assert_eq!(status, 200, "{q}");
    let row = |q: &serde_json::Value, p: &str| {
        q["quotas"].as_array().and_then(|a| a.iter().find(|r| r["project"] == p && r["metric"] == "custom_model_training_cpus").cloned())
    };
    let a = row(&q, "a").unwrap_or_else(|| panic!("{q:#}"));
    assert_eq!((a["inUse"].as_str(), a["borrowed"].as_str(), a["cohort"].as_str()), (Some("8"), Some("4"), Some("lab")), "{q:#}");
    assert_eq!(row(&q, "b").map(|b| b["lent"].clone()), Some(serde_json::json!("4")), "{q:#}");

    let lender = name_of(&s.create("b", &sh_job("lender", "sleep 1")));
    let done = s.wait_terminal(&lender, 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    assert_eq!(s.get(&first)["state"], "JOB_STATE_RUNNING", "the older borrowing job is not the cheapest to stop");
    let done = s.wait_terminal(&second, 120);
    let log = s.logs_text(&second);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("resumed from 1"), "resumed from its checkpoint:\n{log}");
    assert!(log.contains("Job preempted (1 so far)") && log.contains("gives its quota back"), "{log}");
    assert!(!log.contains("restarting it (") && !log.contains("Job retry"), "no restart or retry counted:\n{log}");
    s.call("POST", &s.url(&format!("/v1/{first}:cancel")), Some("{}"));
}

/// L3, L5: a job that may not be preempted for priority any more
/// (`max_preemptions_per_job = 0` here) and borrows because its own quota could never
/// hold it (two replicas, 8 CPUs, on a quota of 4) gives the lender its quota back after
/// `reclaim_after_secs`: the lender's job runs and ends within that bound, not when the
/// borrower ends.
/// Holds TY3 (docs/lifecycle.md).
#[test]
fn l3_l5_a_lenders_quota_comes_back_within_reclaim_after_secs() {
    if skip_on_slurm("local nodes") {
        return;
    }
    let s = Server::start(
        "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n\n\
         [scheduler]\npriority_preemption = true\nmax_preemptions_per_job = 0\nreclaim_after_secs = 3\n\
         [quotas.projects.a]\ncustom_model_training_cpus = 4\n[quotas.projects.b]\ncustom_model_training_cpus = 4\n\
         [[quotas.cohorts]]\nname = \"lab\"\nprojects = [\"a\", \"b\"]\n",
    );
    let mut wide = sh_job("wide", "sleep 300");
    let mut pool = wide["jobSpec"]["workerPoolSpecs"][0].clone();
    pool["replicaCount"] = serde_json::json!("1");
    wide["jobSpec"]["workerPoolSpecs"].as_array_mut().expect("pools").push(pool);
    let wide = name_of(&s.create("a", &wide));
    s.wait_for(&wide, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let t0 = std::time::Instant::now();
    let lender = name_of(&s.create("b", &sh_job("lender", "sleep 1")));
    let done = s.wait_terminal(&lender, 120);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    eprintln!("measure: the lender's job ended {:?} after its create (reclaim_after_secs = 3)", t0.elapsed());
    let log = s.logs_text(&wide);
    assert!(log.contains("gives its quota back"), "the borrower was preempted for the lender:\n{log}");
    s.call("POST", &s.url(&format!("/v1/{wide}:cancel")), Some("{}"));
}

/// Fair share with memory (`[scheduler] usage_half_life_secs`): project a ran a job, so
/// when one node frees, project b's job starts before a's older one; the past use is shown
/// in `GET /v1/admin/quotas`, aged as the formula says.
#[test]
fn fair_share_remembers_a_projects_past_use() {
    let s = Server::start("[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[scheduler]\nusage_half_life_secs = 3600\n");
    let ran = name_of(&s.create("a", &sh_job("ran", "sleep 2")));
    let done = s.wait_terminal(&ran, 60);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let blocker = name_of(&s.create("c", &sh_job("blocker", "sleep 300")));
    s.wait_for(&blocker, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let older = name_of(&s.create("a", &sh_job("older", "sleep 300")));
    let younger = name_of(&s.create("b", &sh_job("younger", "sleep 300")));
    s.call("POST", &s.url(&format!("/v1/{blocker}:cancel")), Some("{}"));
    s.wait_for(&younger, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_ne!(s.get(&older)["state"], "JOB_STATE_RUNNING", "the node holds one job: b's, whose project used none before");
    let (status, q) = s.call("GET", &s.url("/v1/admin/quotas"), None);
    assert_eq!(status, 200, "{q}");
    assert_eq!(q["usageHalfLifeSecs"], "3600");
    let of = |p: &str| q["usageHistory"].as_array().and_then(|a| a.iter().find(|r| r["project"] == p).cloned());
    let a = of("a").unwrap_or_else(|| panic!("no history of a: {q:#}"));
    // 4 CPUs held for the job's run (a few seconds of 3600 s's half-life): 4 * (1 - 2^(-t/3600)).
    let cpus = a["cpus"].as_f64().unwrap_or(0.0);
    assert!(cpus > 0.0 && cpus < 4.0 * (1.0 - (-60.0f64 / 3600.0).exp2()), "{a}");
    for j in [&older, &younger] {
        s.call("POST", &s.url(&format!("/v1/{j}:cancel")), Some("{}"));
    }
}

/// The supervisor of a job's first run on `node`, killed once the job runs there: the
/// run is lost, which is evidence about the node (L9).
fn lose_run_on(s: &Server, job: &Value, node: &str) {
    let name = name_of(job);
    s.wait_for(&name, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    assert_eq!(node_of(s, job, "workerpool0-0", 0), node, "placed on {node} first (best fit)");
    let pid_file = run_dir(&s.data_dir(), id_of(job), 0, "workerpool0-0", 0).join("shim.pid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let pid = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|p| *p > 0) {
            assert!(sigkill(pid), "the supervisor {pid} of {name} is gone before it was killed");
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no {}", pid_file.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// L9: a tenant cannot quarantine the fleet. Three jobs of project evil that kill
/// themselves (`kill -KILL $$`) and a log line a failure rule sends away from its node
/// (`exclude_node`) count nothing towards a quarantine: both nodes stay UP and the victim
/// project's job runs.
/// Holds TY8 (docs/lifecycle.md).
#[test]
fn l9_a_tenant_killing_its_own_replicas_quarantines_no_node() {
    if skip_on_slurm("local nodes") {
        return;
    }
    let s = Server::start(&format!(
        "{TWO_NODES}[fleet]\nquarantine_after_failures = 3\n\
         [[lifecycle.failure_rules]]\nname = \"nccl\"\nlog_pattern = \"NCCL error\"\naction = \"exclude_node\"\n"
    ));
    let mut evil = Vec::new();
    for k in 0..3 {
        let mut job = sh_job(&format!("evil-{k}"), "kill -KILL $$");
        job["jobSpec"]["scheduling"] = serde_json::json!({"restartJobOnWorkerRestart": true});
        evil.push(name_of(&s.create("evil", &job)));
    }
    evil.push(name_of(&s.create("evil", &sh_job("evil-nccl", "echo NCCL error >&2; exit 1"))));
    for name in &evil {
        let done = s.wait_terminal(name, 120);
        assert_eq!(done["state"], "JOB_STATE_FAILED", "{done:#}\n{}", s.logs_text(name));
    }
    for n in ["n1", "n2"] {
        let (_, node) = s.call("GET", &s.url(&format!("/v1/admin/nodes/{n}")), None);
        assert_eq!(node["state"], "UP", "{node:#}");
    }
    let victim = name_of(&s.create("victim", &sh_job("victim", "echo victim ran")));
    let done = s.wait_terminal(&victim, 60);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}");
    let metrics = ureq::get(&s.url("/metrics")).call().expect("GET /metrics").into_body().read_to_string().expect("body");
    assert!(metrics.lines().any(|l| l == "trainyard_node_quarantines_total 0"), "{metrics}");
}

/// L9: bad nodes kept out (`[fleet] quarantine_after_failures`). Runs lost on node n1
/// (their supervisor killed: evidence about the node) are counted per project: three of
/// project p's jobs alone leave n1 UP; a fourth, of project q, quarantines it. Each job's
/// retry goes to n2 (away from the node it failed on) and succeeds; the next job, which
/// would fit n1 best, lands on n2. `nodes list` shows n1 with its failures, the metric
/// counts it, it survives a restart, and `nodes undrain` lets it back in.
/// Holds TY8 (docs/lifecycle.md).
#[test]
fn l9_lost_runs_of_two_projects_quarantine_a_node_and_the_next_job_lands_elsewhere() {
    if skip_on_slurm("local nodes") {
        return;
    }
    let mut s = Server::start(
        "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n[[nodes]]\nname = \"n2\"\ncpus = 8\nmemory_gb = 32\n\
         [fleet]\nquarantine_after_failures = 3\n",
    );
    let script = "if [ \"$TRAINYARD_NODE\" = n1 ]; then sleep 300; fi; echo ran on $TRAINYARD_NODE";
    for (k, project) in ["p", "p", "p", "q"].into_iter().enumerate() {
        // A replica's restart is a job retry (L12a): its new attempt is placed again.
        let mut job = sh_job(&format!("lost-{k}"), script);
        job["jobSpec"]["scheduling"] = serde_json::json!({"restartJobOnWorkerRestart": true});
        let j = s.create(project, &job);
        lose_run_on(&s, &j, "n1");
        let done = s.wait_terminal(&name_of(&j), 60);
        let log = s.logs_text(&name_of(&j));
        assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
        assert!(log.contains("ran on n2"), "retried away from n1:\n{log}");
        let (_, n1) = s.call("GET", &s.url("/v1/admin/nodes/n1"), None);
        if project == "p" {
            assert_eq!(n1["state"], "UP", "project p alone quarantines no node: {n1:#}");
        }
    }
    let (_, n1) = s.call("GET", &s.url("/v1/admin/nodes/n1"), None);
    assert_eq!(n1["state"], "QUARANTINED", "{n1:#}");
    assert_eq!(n1["quarantine"]["failures"].as_array().map(Vec::len), Some(4), "{n1:#}");
    assert!(n1["quarantine"]["reason"].as_str().is_some_and(|r| r.contains("of 2 projects")), "{n1:#}");
    let next = s.create("p", &sh_job("next", "echo next on $TRAINYARD_NODE"));
    let done = s.wait_terminal(&name_of(&next), 60);
    assert!(s.logs_text(&name_of(&next)).contains("next on n2"), "{done:#}");
    let (ok, out) = cli(&s, &["nodes", "list"]);
    assert!(ok && out.lines().any(|l| l.starts_with("n1 ") && l.contains("QUARANTINED")), "{out}");
    let metrics = ureq::get(&s.url("/metrics")).call().expect("GET /metrics").into_body().read_to_string().expect("body");
    assert!(metrics.lines().any(|l| l == "trainyard_node_quarantines_total 1"), "{metrics}");
    s.restart();
    let (_, n1) = s.call("GET", &s.url("/v1/admin/nodes/n1"), None);
    assert_eq!(n1["state"], "QUARANTINED", "kept across a restart: {n1:#}");
    let (ok, out) = cli(&s, &["nodes", "undrain", "n1"]);
    assert!(ok, "{out}");
    let (_, n1) = s.call("GET", &s.url("/v1/admin/nodes/n1"), None);
    assert_eq!(n1["state"], "UP", "{n1:#}");
}

/// TY11, L9: with `[lifecycle] preemption_notice_secs`, a drain first tells the program:
/// SIGUSR1 and `$TRAINYARD_NOTICE_FILE` with the reason and the deadline. The program
/// saves and exits within its notice, and is moved as L9 says, its restart not counted.
#[test]
fn ty11_l9_a_drain_gives_notice_in_the_notice_file() {
    let mut s = Server::prepare(TWO_NODES);
    let text = std::fs::read_to_string(&s.config).unwrap().replace("[lifecycle]\n", "[lifecycle]\npreemption_notice_secs = 30\n");
    std::fs::write(&s.config, text).unwrap();
    s.spawn();
    let marker = s.dir.path().join("saved");
    let script = format!(
        "trap 'echo notice=$(cat \"$TRAINYARD_NOTICE_FILE\"); touch {m}; exit 0' USR1; \
         trap 'echo sigterm-before-the-notice-ended; exit 1' TERM; \
         if [ -e {m} ]; then echo resumed; exit 0; fi; echo ready; \
         while true; do sleep 0.1; done",
        m = marker.display()
    );
    let j = s.create("p", &sh_job("noticed", &script));
    let name = name_of(&j);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !s.logs_text(&name).contains("ready") {
        assert!(std::time::Instant::now() < deadline, "the program never started: {}", s.logs_text(&name));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let first = node_of(&s, &j, "workerpool0-0", 0);
    let drained = std::time::Instant::now();
    let (ok, out) = cli(&s, &["nodes", "drain", &first]);
    assert!(ok, "{out}");
    let done = s.wait_terminal(&name, 30);
    let text = s.logs_text(&name);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{text}");
    assert!(drained.elapsed() < std::time::Duration::from_secs(25), "the program ended its notice early");
    let line = text.lines().find_map(|l| l.split("notice=").nth(1)).unwrap_or_default();
    let notice: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("the notice ({e}): {text}"));
    assert_eq!(notice["signal"], "SIGUSR1");
    assert!(notice["reason"].as_str().unwrap().starts_with("drain: its node went into maintenance"), "{notice}");
    assert!(notice["deadline"].as_str().unwrap().ends_with('Z'), "{notice}");
    assert!(!text.contains("sigterm-before-the-notice-ended") && text.contains("resumed"), "{text}");
    assert_ne!(node_of(&s, &j, "workerpool0-0", 1), first);
}
