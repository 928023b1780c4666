//! Slurm-only end-to-end tests: a real server on the Slurm backend against the cluster of
//! `scripts/slurm/up.sh` (`SLURM_CONF` exported). Without `TRAINYARD_TEST_BACKEND=slurm`
//! or without a cluster they print why and pass, except in CI (`CI=true`), where a
//! missing cluster fails them.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn state(j: &Value) -> &str {
    j["state"].as_str().unwrap_or("")
}

fn ready() -> bool {
    if !slurm_requested() {
        eprintln!("SKIP: set TRAINYARD_TEST_BACKEND=slurm (and start scripts/slurm/up.sh) to run the Slurm tests");
        return false;
    }
    slurm_backend()
}

fn slurm_job_of(dir: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("slurm.json")).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["job_id"].as_u64()
}

fn node_of(job_id: u64) -> Option<String> {
    let out = Command::new("squeue").arg("--json").output().ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["jobs"].as_array()?.iter().find(|j| j["job_id"].as_u64() == Some(job_id))?["nodes"].as_str().map(String::from)
}

/// The configured partition must exist: the server refuses to start and names the key.
#[test]
fn unknown_partition_is_refused_naming_the_key() {
    if !ready() {
        return;
    }
    let err = serve_refused("backend = \"slurm\"\n[slurm]\npartition = \"nosuchpartition\"\n");
    assert!(err.contains("slurm.partition") && err.contains("nosuchpartition"), "{err}");
}

/// L9: real node loss (the node's slurmd is killed with SIGKILL): once Slurm declares
/// the node down (SlurmdTimeout=30, about 46 s) the job ends NODE_FAIL, and the replica
/// is restarted on another node with the same name, without counting against L11.
#[test]
fn l9_node_loss_restarts_the_replica() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let marker = s.dir.path().join("lost-once");
    let script = format!("if [ -e {m} ]; then echo resumed on $(hostname); exit 0; fi; touch {m}; exec sleep 600", m = marker.display());
    let j = s.create("p", &sh_job("node-loss", &script));
    let name = name_of(&j);
    s.wait_for(&name, 60, |j| state(j) == "JOB_STATE_RUNNING");
    let first = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0);
    let id = slurm_job_of(&first).expect("slurm.json");
    let node = node_of(id).expect("node of the job");
    let conf = std::env::var("SLURM_CONF").unwrap_or_default();
    let pid_file = std::path::Path::new(&conf).parent().and_then(|etc| etc.parent()).map(|st| st.join(format!("run/slurmd-{node}.pid")));
    let pid: i32 = pid_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.trim().parse().ok())
        .expect("slurmd pid file");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let t0 = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.wait_terminal(&name, 150)));
    // Bring the node back whatever happened (its orphaned job processes die then).
    let _ = Command::new("slurmd").args(["-f", &conf, "-N", &node]).status();
    let done = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    eprintln!("node {node} lost; job ended after {:?}", t0.elapsed());
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name));
    let text = s.logs_text(&name);
    assert!(text.contains("resumed on"), "{text}");
    assert!(run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 1).exists(), "restart 1 of attempt 0 ran");
    assert!(!run_dir(&s.data_dir(), id_of(&j), 1, "workerpool0-0", 0).exists(), "no job retry");
    // The node comes back (ReturnToService=1).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("sinfo").args(["-h", "-n", &node, "-o", "%t"]).output().unwrap();
        let st = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if st == "idle" || st == "mix" || st == "alloc" {
            break;
        }
        assert!(Instant::now() < deadline, "node {node} did not come back: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// L9, node maintenance: the node of a running replica is drained
/// (`scontrol update state=drain`); the replica gets SIGTERM and its grace period while the
/// node is still up, and is restarted on another node with the same name (no job retry).
#[test]
fn l9_node_drain_moves_the_replica() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let marker = s.dir.path().join("drained-once");
    let script = format!(
        "if [ -e {m} ]; then echo resumed; exit 0; fi; touch {m}; trap 'echo got SIGTERM; exit 143' TERM; sleep 600 & wait",
        m = marker.display()
    );
    let j = s.create("p", &sh_job("drain", &script));
    let name = name_of(&j);
    s.wait_for(&name, 60, |j| state(j) == "JOB_STATE_RUNNING");
    let first = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0);
    let id = slurm_job_of(&first).expect("slurm.json");
    let node = node_of(id).expect("node of the job");
    let drained = Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=drain", "reason=trainyard-test"])
        .status()
        .unwrap();
    assert!(drained.success());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.wait_terminal(&name, 60)));
    let _ = Command::new("scontrol").args(["update", &format!("nodename={node}"), "state=resume"]).status();
    let done = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name));
    let text = s.logs_text(&name);
    assert!(text.contains("got SIGTERM"), "the replica was warned first: {text}");
    assert!(text.contains("resumed"), "{text}");
    assert!(run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 1).exists(), "restart 1 of attempt 0 ran");
    assert!(!run_dir(&s.data_dir(), id_of(&j), 1, "workerpool0-0", 0).exists(), "no job retry");
}

/// slurmctld down when a job is created: the job stays PENDING (not FAILED, not lost)
/// while the backend's submitter tries again with backoff, its run recorded but not
/// submitted, and it starts when slurmctld is back, submitted once.
///
/// The driver does not show the backend's waiting reason yet (`Backend::waiting_reason`),
/// so `trainyardWaitingReason` is printed but not asserted.
#[test]
fn slurmctld_down_keeps_the_job_pending() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let conf = std::env::var("SLURM_CONF").unwrap_or_default();
    let state_dir = std::path::Path::new(&conf).parent().and_then(|etc| etc.parent()).map(|p| p.to_path_buf()).expect("state dir");
    let pid: i32 = std::fs::read_to_string(state_dir.join("run/slurmctld.pid"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .expect("slurmctld pid file");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while Command::new("squeue").arg("-h").output().map(|o| o.status.success()).unwrap_or(false) {
        assert!(Instant::now() < deadline, "slurmctld did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let j = s.create("p", &sh_job("ctld-down", "echo ran while the controller came back"));
    let name = name_of(&j);
    let dir = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Recorded durably (slurm.json without a job id) ...
        s.wait_for(&name, 30, |j| {
            assert_ne!(state(j), "JOB_STATE_FAILED", "{j:#}");
            dir.join("slurm.json").exists()
        });
        // ... and kept PENDING across a failed try (sbatch takes about 9 s to give up on
        // the controller) and the backoff after it.
        let held = Instant::now() + Duration::from_secs(12);
        let mut last = Value::Null;
        while Instant::now() < held {
            last = s.get(&name);
            assert_eq!(state(&last), "JOB_STATE_PENDING", "{last:#}\n{}", s.server_log());
            assert_eq!(slurm_job_of(&dir), None, "submitted while the controller was down");
            std::thread::sleep(Duration::from_millis(200));
        }
        last
    }));
    // Start the controller again, whatever happened.
    let _ = Command::new("slurmctld").args(["-f", &conf]).status();
    let waiting = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    eprintln!("waiting: {}", waiting["trainyardWaitingReason"]);
    let reason = waiting["trainyardWaitingReason"].as_str().unwrap_or("");
    assert!(reason.contains("unreachable") || reason.contains("does not answer"), "a clear reason while waiting: {waiting:#}");
    let done = s.wait_terminal(&name, 120);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name));
    assert!(slurm_job_of(&dir).is_some(), "the job id was recorded");
    assert!(s.server_log().contains("the Slurm controller is unreachable"), "{}", s.server_log());
    assert!(!run_dir(&s.data_dir(), id_of(&j), 1, "workerpool0-0", 0).exists(), "no job retry (L16 not spent)");
    assert!(!run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 1).exists(), "no restart");
}

/// A job of `pools` (machine type, replicas) whose replicas all run `script`.
fn gang_job(name: &str, pools: &[(&str, u32)], script: &str) -> Value {
    let specs: Vec<Value> = pools
        .iter()
        .map(|(machine, n)| {
            serde_json::json!({
                "machineSpec": {"machineType": machine}, "replicaCount": n.to_string(),
                "containerSpec": {"imageUri": "i", "command": ["sh", "-c", script]}
            })
        })
        .collect();
    serde_json::json!({"displayName": name, "jobSpec": {"workerPoolSpecs": specs}})
}

fn micros(t: &Value) -> i64 {
    t.as_str().and_then(|s| trainyard_api::Timestamp::parse_rfc3339(s).ok()).map(|t| t.micros()).unwrap_or(0)
}

/// Gang start: every replica of an attempt is a step of one Slurm allocation. Two jobs of
/// three whole-node replicas on the 4-node cluster cannot run at once; their replicas
/// wait for each other (a rendezvous, as distributed training does), so with one Slurm
/// job per replica they could each hold part of the cluster and wait for the rest for
/// ever. Both finish, one after the other, each replica in a step of its job's allocation.
#[test]
fn gangs_start_whole_and_two_that_fit_one_at_a_time_both_finish() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let marks = s.dir.path().join("rendezvous");
    std::fs::create_dir_all(&marks).expect("dir");
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("chmod");
    let script = format!(
        "d={m}/$CLOUD_ML_JOB_ID; mkdir -p $d; touch $d/$RANK; n=0; \
         while [ $(ls $d | wc -l) -lt 3 ]; do sleep 0.2; n=$((n+1)); [ $n -gt 600 ] && exit 1; done; sleep 2; echo together",
        m = marks.display()
    );
    let a = s.create("p", &gang_job("gang-a", &[("n1-standard-4", 1), ("n1-standard-4", 2)], &script));
    let b = s.create("p", &gang_job("gang-b", &[("n1-standard-4", 1), ("n1-standard-4", 2)], &script));
    let done_a = s.wait_terminal(&name_of(&a), 240);
    let done_b = s.wait_terminal(&name_of(&b), 240);
    assert_eq!(state(&done_a), "JOB_STATE_SUCCEEDED", "{done_a:#}\n{}", s.logs_text(&name_of(&a)));
    assert_eq!(state(&done_b), "JOB_STATE_SUCCEEDED", "{done_b:#}\n{}", s.logs_text(&name_of(&b)));
    let (first, second) = if micros(&done_a["startTime"]) <= micros(&done_b["startTime"]) { (&done_a, &done_b) } else { (&done_b, &done_a) };
    assert!(micros(&second["startTime"]) >= micros(&first["endTime"]) - 1_000_000, "one after the other:\n{first:#}\n{second:#}");
    for j in [&a, &b] {
        let runs = ["workerpool0-0", "workerpool1-0", "workerpool1-1"].map(|r| run_dir(&s.data_dir(), id_of(j), 0, r, 0));
        let ids: Vec<Option<u64>> = runs.iter().map(|d| slurm_job_of(d)).collect();
        assert!(ids[0].is_some() && ids.iter().all(|i| *i == ids[0]), "one allocation: {ids:?}");
        for d in &runs {
            let step = std::fs::read_to_string(d.join("slurm-step")).unwrap_or_default();
            assert!(step.trim().starts_with(&format!("{}.", ids[0].unwrap_or(0))), "{}: step {step:?}", d.display());
        }
    }
}

/// L10 in a gang: a replica killed by a signal is restarted in place as a new step of the
/// same allocation, and the job goes on to succeed.
#[test]
fn l10_a_gangs_replica_restarts_as_a_new_step_of_its_allocation() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let marker = s.dir.path().join("killed-once");
    let script = format!("if [ \"$RANK\" = 1 ] && [ ! -e {m} ]; then touch {m}; kill -9 $$; fi; sleep 2; echo ok", m = marker.display());
    let j = s.create("p", &gang_job("gang-restart", &[("n1-standard-4", 1), ("n1-standard-4", 1)], &script));
    let done = s.wait_terminal(&name_of(&j), 180);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name_of(&j)));
    let first = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool1-0", 0);
    let again = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool1-0", 1);
    assert!(again.exists(), "restart 1 of the worker ran");
    assert_eq!(slurm_job_of(&again), slurm_job_of(&first), "the same allocation");
    let step = |d: &std::path::Path| std::fs::read_to_string(d.join("slurm-step")).unwrap_or_default();
    assert!(!step(&again).trim().is_empty() && step(&again) != step(&first), "a new step: {:?} then {:?}", step(&first), step(&again));
    assert!(!run_dir(&s.data_dir(), id_of(&j), 1, "workerpool1-0", 0).exists(), "no job retry");
}

/// L14 in a gang: a replica over its step's memory limit is OOM-killed by the step's
/// cgroup; the shim reads the kill from it (no OUT_OF_MEMORY state shows for a step) and
/// the job fails as out of memory.
#[test]
fn l14_a_gangs_replica_out_of_memory() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let script = "if [ \"$RANK\" = 1 ]; then exec python3 -c 'chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024 * 1024))\n'; fi; sleep 60";
    let j = s.create("p", &gang_job("gang-oom", &[("n1-standard-4", 1), ("n1-standard-4", 1)], script));
    let done = s.wait_terminal(&name_of(&j), 180);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done:#}");
    assert_eq!(done["error"]["code"], 8, "{done:#}");
    let m = done["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("workerpool1-0 ran out of memory"), "{m}");
}

/// L23 with a gang: the server is killed while a gang runs; the restarted server adopts
/// every replica's step in the same allocation (nothing submitted again, nothing
/// restarted), and the job succeeds; the allocation is released after its replicas ended.
#[test]
fn l23_a_gang_survives_a_server_kill() {
    if !ready() {
        return;
    }
    let mut s = Server::start("");
    let j = s.create("p", &gang_job("gang-kill", &[("n1-standard-4", 1), ("n1-standard-4", 1)], "sleep 6; echo done"));
    let name = name_of(&j);
    s.wait_for(&name, 60, |j| state(j) == "JOB_STATE_RUNNING");
    let runs = ["workerpool0-0", "workerpool1-0"].map(|r| run_dir(&s.data_dir(), id_of(&j), 0, r, 0));
    let before: Vec<Option<u64>> = runs.iter().map(|d| slurm_job_of(d)).collect();
    s.restart();
    let done = s.wait_terminal(&name, 120);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name));
    let after: Vec<Option<u64>> = runs.iter().map(|d| slurm_job_of(d)).collect();
    assert_eq!(before, after, "the same allocation");
    for r in ["workerpool0-0", "workerpool1-0"] {
        assert!(!run_dir(&s.data_dir(), id_of(&j), 0, r, 1).exists(), "{r} was not restarted");
    }
    let gang = run_dir(&s.data_dir(), id_of(&j), 0, "workerpool0-0", 0).parent().and_then(|p| p.parent()).map(|a| a.join(".gang")).expect("gang dir");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gang.join("release").exists() {
        assert!(Instant::now() < deadline, "the allocation was not released");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two servers on one PostgreSQL store over Slurm: the leader frozen (as a host that is
/// gone), the follower takes the lease once it expires and adopts the running gang by its
/// Slurm records (L23): the same allocation, no replica started again, SUCCEEDED.
#[test]
fn l23_a_gang_survives_the_loss_of_its_leader_to_a_follower() {
    if !ready() {
        return;
    }
    let Some(_) = pg_or_skip("the Slurm tests with a PostgreSQL store") else { return };
    let url = new_pg_store();
    let (_shared, mut a, b) = pair(&format!("[store]\nurl = \"{url}\"\nlease_secs = 2\n"));
    assert!(healthz(b.port).contains("follower"), "{}", healthz(b.port));
    let j = b.create("p", &gang_job("gang-failover", &[("n1-standard-4", 1), ("n1-standard-4", 1)], "sleep 8; echo done"));
    let name = name_of(&j);
    b.wait_for(&name, 60, |j| state(j) == "JOB_STATE_RUNNING");
    let runs = ["workerpool0-0", "workerpool1-0"].map(|r| run_dir(&b.data_dir(), id_of(&j), 0, r, 0));
    let before: Vec<Option<u64>> = runs.iter().map(|d| slurm_job_of(d)).collect();
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(a.pid().unwrap() as i32, libc::SIGSTOP) };
    wait_leading(b.port, 30);
    a.kill9();
    let done = b.wait_terminal(&name, 120);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", b.logs_text(&name));
    let after: Vec<Option<u64>> = runs.iter().map(|d| slurm_job_of(d)).collect();
    assert_eq!(before, after, "the same allocation");
    for r in ["workerpool0-0", "workerpool1-0"] {
        assert!(!run_dir(&b.data_dir(), id_of(&j), 0, r, 1).exists(), "{r} was started again");
    }
}

/// Preemption by priority on Slurm: a gang of a lower priority class (three whole-node
/// replicas of the 4-node cluster) is preempted whole for a gang of a higher class, which
/// runs and succeeds; the lower gang then starts again (every replica in a new allocation),
/// resumes from its checkpoint and SUCCEEDS, counted as no worker restart (L11) or job
/// retry (L12).
#[test]
fn l11_l12_a_lower_priority_gang_is_preempted_whole_and_resumes() {
    if !ready() {
        return;
    }
    let s = Server::start(
        "[scheduler]\npriority_preemption = true\nmin_runtime_secs = 0\ndefault_priority_class = \"batch\"\n\
         [[scheduler.priority_classes]]\nname = \"urgent\"\nvalue = 1000\n[[scheduler.priority_classes]]\nname = \"batch\"\nvalue = 0\n",
    );
    // Every replica resumes if the checkpoint is there when it starts; the chief writes it
    // a few seconds in (after its gang has started).
    let script = "d=$AIP_CHECKPOINT_DIR; if [ -f \"$d/step\" ]; then echo \"resumed from $(cat \"$d/step\")\"; exit 0; fi; \
                  trap 'exit 143' TERM; if [ \"$RANK\" = 0 ]; then sleep 4; echo 1 > \"$d/step\"; fi; sleep 300 & wait";
    let mut low = gang_job("low", &[("n1-standard-4", 1), ("n1-standard-4", 2)], script);
    low["jobSpec"]["baseOutputDirectory"] = serde_json::json!({"outputUriPrefix": "gs://b/low"});
    let low = s.create("p", &low);
    let low_name = name_of(&low);
    s.wait_for(&low_name, 120, |j| state(j) == "JOB_STATE_RUNNING");
    let ckpt = s.data_dir().join("storage/p/b/low/checkpoints/step");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ckpt.exists() {
        assert!(Instant::now() < deadline, "no checkpoint at {}", ckpt.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut urgent = gang_job("urgent", &[("n1-standard-4", 1), ("n1-standard-4", 2)], "sleep 2; echo done");
    urgent["labels"] = serde_json::json!({"trainyard-priority-class": "urgent"});
    let urgent = name_of(&s.create("q", &urgent));
    let done = s.wait_terminal(&urgent, 240);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&urgent));
    let done = s.wait_terminal(&low_name, 240);
    let log = s.logs_text(&low_name);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}\n{log}");
    assert!(log.contains("Job preempted (1 so far)") && log.contains("priority class urgent"), "{log}");
    assert!(!log.contains("restarting it (") && !log.contains("Job retry"), "no restart or retry counted:\n{log}");
    // Whole: every replica's first run was stopped, and every replica ran again (attempt 1)
    // in one new allocation.
    let replicas = ["workerpool0-0", "workerpool1-0", "workerpool1-1"];
    let again: Vec<Option<u64>> = replicas.iter().map(|r| slurm_job_of(&run_dir(&s.data_dir(), id_of(&low), 1, r, 0))).collect();
    let first: Vec<Option<u64>> = replicas.iter().map(|r| slurm_job_of(&run_dir(&s.data_dir(), id_of(&low), 0, r, 0))).collect();
    assert!(again[0].is_some() && again.iter().all(|i| *i == again[0]), "one new allocation: {again:?}");
    assert!(first[0].is_some() && first.iter().all(|i| *i == first[0]) && first[0] != again[0], "{first:?} then {again:?}");
    assert!(log.matches("resumed from 1").count() >= 1, "{log}");
}

/// `slurm_<node>/uid_<u>/job_<id>/` of a memory cgroup line (`4:memory:/slurm_n2/...`).
fn allocation_of(cgroup: &str) -> Option<String> {
    let line = cgroup.lines().find(|l| l.contains(":memory:/slurm_"))?;
    let path = line.split(":memory:/").nth(1)?;
    let parts: Vec<&str> = path.split('/').take(3).collect();
    (parts.len() == 3 && parts[2].starts_with("job_")).then(|| parts.join("/"))
}

/// `custom-jobs exec` on the Slurm backend: a step of the replica's own allocation on the
/// replica's node (`srun --overlap`), the replica of a gang included; stdout, stderr (with
/// none of srun's own lines), stdin and the exit status pass as if the command ran here; a
/// terminal session gets a pty; a port-forward reaches a server in the replica; a job that
/// ended is refused naming its state.
#[test]
fn exec_runs_in_a_step_of_the_replicas_allocation_on_its_node() {
    if !ready() {
        return;
    }
    let s = Server::start("");
    let port = free_port();
    let script = format!(
        "echo view; grep ':memory:' /proc/self/cgroup; echo end-of-view; \
         if [ \"$RANK\" = 1 ]; then exec python3 -m http.server {port} --bind 127.0.0.1; fi; exec sleep 600"
    );
    let j = s.create("p", &gang_job("slurm-exec", &[("n1-standard-4", 1), ("n1-standard-4", 1)], &script));
    let name = name_of(&j);
    s.wait_for(&name, 120, |j| state(j) == "JOB_STATE_RUNNING");
    let deadline = Instant::now() + Duration::from_secs(60);
    let views = loop {
        let log = s.logs(&name);
        let of = |r: &str| -> Option<String> {
            let lines: Vec<&str> =
                log.iter().filter(|e| e["replica"] == r && e["stream"] == "stdout").filter_map(|e| e["text"].as_str()).collect();
            lines.contains(&"end-of-view").then(|| lines.join("\n"))
        };
        if let (Some(a), Some(b)) = (of("workerpool0-0"), of("workerpool1-0")) {
            break (a, b);
        }
        assert!(Instant::now() < deadline, "the replicas never printed their views: {}", s.logs_text(&name));
        std::thread::sleep(Duration::from_millis(200));
    };
    let id = name.rsplit('/').next().unwrap_or("").to_string();
    let cli = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["custom-jobs", "exec", &id]).args(args).env("TRAINYARD_SERVER", s.url("")).env("TRAINYARD_PROJECT", "p");
        c
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    for (replica, view) in [("workerpool0-0", &views.0), ("workerpool1-0", &views.1)] {
        let out = cli(&["--replica", replica, "--", "sh", "-c", "grep ':memory:' /proc/self/cgroup; echo to-err >&2; exit 3"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("exec");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert_eq!(text(&out.stderr), "to-err\n", "srun's own lines are left out");
        let (mine, theirs) = (allocation_of(&text(&out.stdout)), allocation_of(view));
        assert!(mine.is_some() && mine == theirs, "{replica}: the session's allocation and node {mine:?}, the replica's {theirs:?}");
    }

    let out = cli(&["--", "sh", "-c", "kill -TERM $$"]).stdin(std::process::Stdio::null()).output().expect("exec");
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    let mut child = cli(&["--", "tr", "a-z", "A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("exec");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"piped in\n").expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(text(&out.stdout), "PIPED IN\n", "{out:?}");

    // A terminal: the CLI on a pty, the step's command on one of its own.
    let on_a_pty = "import os, pty, sys; st = pty.spawn(sys.argv[1:]); print('exit=%d' % os.waitstatus_to_exitcode(st))";
    let out = Command::new("python3")
        .args(["-c", on_a_pty, BIN, "custom-jobs", "exec", &id, "--tty", "--", "sh", "-c", "tty; exit 4"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3");
    let shown = text(&out.stdout);
    assert!(shown.contains("/dev/pts/") && shown.contains("exit=4") && !shown.contains("srun: error"), "{shown}\n{}", text(&out.stderr));

    // A port of the gang's second replica, forwarded through a step on its node.
    let mut fwd = Command::new(BIN)
        .args(["custom-jobs", "port-forward", &id, "--replica", "workerpool1-0", &format!("0:{port}")])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("port-forward");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(fwd.stdout.take().expect("stdout")), &mut line).expect("its first line");
    let local: u16 = line.split_whitespace().nth(2).and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    // The replica's server may still be starting: asked again until it answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        match ureq::get(&format!("http://127.0.0.1:{local}/")).call() {
            Ok(r) => break r.into_body().read_to_string().expect("body"),
            Err(e) => assert!(Instant::now() < deadline, "GET through the forward: {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("Directory listing"), "{body}");
    let _ = fwd.kill();
    let _ = fwd.wait();

    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), None);
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&name, 120);
    let out = cli(&["--", "true"]).stdin(std::process::Stdio::null()).output().expect("exec");
    assert!(!out.status.success() && text(&out.stderr).contains("FAILED_PRECONDITION"), "{out:?}");

    // A job of one replica: a Slurm job of its own, no gang.
    let single = name_of(&s.create("p", &sh_job("slurm-exec-one", "exec sleep 600")));
    s.wait_for(&single, 120, |j| state(j) == "JOB_STATE_RUNNING");
    let one = single.rsplit('/').next().unwrap_or("").to_string();
    let out = Command::new(BIN)
        .args(["custom-jobs", "exec", &one, "--", "sh", "-c", "grep -c ':memory:/slurm_' /proc/self/cgroup"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "p")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("exec");
    assert_eq!((out.status.code(), text(&out.stdout).trim()), (Some(0), "1"), "{out:?}");
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{single}:cancel")), None);
    assert_eq!(status, 200, "{body}");
    s.wait_terminal(&single, 120);
}

/// TY11, L19 on Slurm: with `[lifecycle] preemption_notice_secs`, a gang's timeout first
/// gives every replica notice, through Slurm (`scancel --signal=USR1` to each replica's
/// step) and the notice file in the run's shared directory; SIGTERM follows at the
/// notice's end, and the job fails DEADLINE_EXCEEDED as L19 says.
#[test]
fn ty11_l19_a_gangs_timeout_gives_notice_through_slurm() {
    if !ready() {
        return;
    }
    let mut s = Server::prepare("");
    let text = std::fs::read_to_string(&s.config).expect("config").replace("[lifecycle]\n", "[lifecycle]\npreemption_notice_secs = 3\n");
    std::fs::write(&s.config, text).expect("config");
    s.spawn();
    let script = "trap 'echo notice=$(cat \"$TRAINYARD_NOTICE_FILE\")' USR1; trap 'echo term-after-notice; exit 1' TERM; \
                  echo ready; while true; do sleep 0.1; done";
    let mut job = gang_job("slurm-notice", &[("n1-standard-4", 1), ("n1-standard-4", 1)], script);
    job["jobSpec"]["scheduling"] = serde_json::json!({"timeout": "8s"});
    let name = name_of(&s.create("p", &job));
    let done = s.wait_terminal(&name, 120);
    let text = s.logs_text(&name);
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{done:#}\n{text}");
    assert_eq!(done["error"]["code"], 4, "DEADLINE_EXCEEDED: {done:#}");
    let notices: Vec<Value> = text.lines().filter_map(|l| l.split("notice=").nth(1)).filter_map(|j| serde_json::from_str(j).ok()).collect();
    assert_eq!(notices.len(), 2, "each replica got its notice:\n{text}");
    for n in &notices {
        assert_eq!(n["signal"], "SIGUSR1", "{n}");
        assert!(n["reason"].as_str().unwrap_or("").starts_with("timeout:"), "{n}");
    }
    assert_eq!(text.matches("term-after-notice").count(), 2, "SIGTERM at the notice's end:\n{text}");
}
