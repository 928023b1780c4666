//! `trainyard local-run` end to end, on the project's examples.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pids_with, BIN};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples").join(name).join("job.yaml")
}

fn local_run(job: &PathBuf, storage: &std::path::Path) -> Command {
    let mut c = Command::new(BIN);
    // Host processes, also on a machine with podman (container_e2e runs local-run in images).
    c.arg("local-run").arg(job).env("TRAINYARD_STORAGE_ROOT", storage).env("TRAINYARD_CONTAINER_ENGINE", "none").stdin(Stdio::null());
    c
}

/// L8, L17: replicas talk over the addresses of CLUSTER_SPEC; exit 0 on SUCCEEDED.
#[test]
fn l8_multi_replica_example_succeeds() {
    let storage = tempfile::tempdir().unwrap();
    let out = local_run(&example("multi-replica"), storage.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("[workerpool0-0]"), "{stdout}");
    assert!(stdout.contains("sum 3"), "{stdout}");
    assert!(stderr.contains("JOB_STATE_SUCCEEDED"), "{stderr}");
}

/// L13: a failing job exits non-zero and shows the error, its code by name, and the
/// replica's traceback once (as it printed it; the error's copy of the stderr tail is for
/// the API, not printed again).
#[test]
fn l13_failing_example_exits_nonzero() {
    let storage = tempfile::tempdir().unwrap();
    let out = local_run(&example("failing"), storage.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("The replica workerpool0-0 exited with a non-zero status of 3."), "{stderr}");
    assert!(stderr.contains("[trainyard] error: The replica workerpool0-0 exited with a non-zero status of 3."), "{stderr}");
    assert!(stderr.contains("[error code 3 (INVALID_ARGUMENT)]"), "{stderr}");
    assert_eq!(stderr.matches("ValueError: bad record at line 1337").count(), 1, "{stderr}");
    assert!(stderr.contains("[workerpool0-0] ValueError: bad record at line 1337"), "{stderr}");
}

/// L10, L21: the checkpoint example, killed with SIGKILL mid-training, is restarted and
/// resumes from its checkpoint.
#[test]
fn l21_checkpoint_example_resumes_after_kill() {
    let storage = tempfile::tempdir().unwrap();
    let mut child = local_run(&example("checkpoint"), storage.path()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let mut killed = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        seen.push(line.clone());
        // After the first checkpoint, kill the program (not the server, not the shim).
        if !killed && line.contains("checkpoint") && line.contains("step 10") {
            let pids = pids_with("train.py --steps 50 --every 5");
            let mine: Vec<i32> = pids
                .into_iter()
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/environ"))
                        .map(|e| e.contains(&storage.path().display().to_string()))
                        .unwrap_or(false)
                })
                .collect();
            assert_eq!(mine.len(), 1, "{mine:?}");
            // SAFETY: kill(2) has no memory effects.
            unsafe {
                libc::kill(mine[0], libc::SIGKILL);
            }
            killed = true;
        }
        assert!(Instant::now() < deadline, "{seen:#?}");
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(killed, "never saw a checkpoint: {seen:#?}\n{err}");
    assert!(status.success(), "{seen:#?}\n{err}");
    assert!(seen.iter().any(|l| l.contains("restart 1] resumed from step")), "{seen:#?}");
    assert!(err.contains("was killed by signal 9; restarting it (1 of 5)"), "{err}");
}

/// L18, L20: Ctrl-C (SIGINT) cancels the job cleanly: local-run exits 130 and nothing of
/// the job keeps running.
#[test]
fn l18_ctrl_c_cancels_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let secs = 320_000 + common::free_port() as u32;
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        format!(
            "workerPoolSpecs:\n  - machineSpec: {{machineType: n1-standard-4}}\n    replicaCount: 1\n    containerSpec:\n      imageUri: x\n      command: [sh, -c, 'echo started; sleep {secs} & sleep {secs}']\n"
        ),
    )
    .unwrap();
    let mut child = local_run(&job, dir.path()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.contains("started"), "{first}");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("JOB_STATE_CANCELLED"), "{err}");
    assert!(pids_with(&format!("sleep {secs}")).is_empty(), "nothing of the job keeps running");
}
