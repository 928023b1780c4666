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
