//! The Slurm backend's submission against fake `sinfo`/`sbatch`/`squeue`/`scancel`
//! commands (no cluster needed): `launch` returns at once with the run recorded, the
//! submitter submits it, waits out an unreachable controller with backoff and a waiting
//! reason, reports refusals through the sink, ends a run stopped before submission, and
//! kills a submitted one with `scancel --signal=KILL --full` and a plain `scancel`.
//!
//! One test function: it puts the fake commands first on `PATH` for the whole process.

mod common;

use common::sink;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use trainyard_backend::slurm::{read_job_file, SlurmBackend, SlurmOptions};
use trainyard_backend::{Backend, BackendEvent, Launch, Resources, ShimSpec};
use trainyard_core::{Outcome, RunId};

fn write_exe(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Fake Slurm commands; `mode` (a file) says how `sbatch` and `squeue` behave:
/// `up` (sbatch prints the id in `next_id`), `slow` (the same after 1 s), `down` (the
/// controller cannot be reached), `refuse` (sbatch refuses the request).
fn fake_slurm(dir: &Path) {
    let d = dir.display();
    write_exe(
        &dir.join("sinfo"),
        r#"#!/bin/sh
echo '{"nodes":[{"name":"n1","cpus":2,"real_memory":2000,"partitions":["debug"],"state":"idle","state_flags":[]}]}'
"#,
    );
    write_exe(
        &dir.join("sbatch"),
        &format!(
            r#"#!/bin/sh
echo "$@" >> {d}/sbatch.log
case "$(cat {d}/mode)" in
  down) echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)" >&2; exit 1;;
  refuse) echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2; exit 1;;
  slow) sleep 1;;
esac
cat {d}/next_id
"#
        ),
    );
    write_exe(
        &dir.join("squeue"),
        &format!(
            r#"#!/bin/sh
echo squeue >> {d}/squeue.log
if [ "$(cat {d}/mode)" = down ]; then
  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
if [ -f {d}/squeue.json ]; then cat {d}/squeue.json; else echo '{{"jobs":[]}}'; fi
"#
        ),
    );
    write_exe(&dir.join("scancel"), &format!("#!/bin/sh\necho \"$@\" >> {d}/scancel.log\n"));
}

fn set(dir: &Path, file: &str, text: &str) {
    fs::write(dir.join(file), text).unwrap();
}

fn lines(dir: &Path, file: &str) -> Vec<String> {
    fs::read_to_string(dir.join(file)).unwrap_or_default().lines().map(String::from).collect()
}


fn run_id(replica: &str) -> RunId {
    RunId { job: 9, attempt: 0, replica: replica.into(), restart: 0 }
}

fn launch_of(root: &Path, replica: &str) -> Launch {
    let mut spec = ShimSpec::new(vec!["true".into()], vec![]);
    spec.memory_limit_bytes = Some(512 * 1024 * 1024);
    spec.grace_seconds = 30.0;
    spec.resources = Resources { cpus: Some(2), accelerator: None, timeout_secs: Some(90) };
    Launch { run: run_id(replica), run_dir: root.join(replica), spec, node: String::new() }
}

fn job_id(run_dir: &Path) -> Option<u64> {
    read_job_file(run_dir).unwrap().and_then(|f| f.job_id)
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn submission_is_asynchronous_and_waits_out_an_unreachable_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    fake_slurm(&bin);
    set(&bin, "mode", "slow");
    set(&bin, "next_id", "4242\n");
    let path: OsString = std::env::join_paths(
        std::iter::once(bin.clone()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    std::env::set_var("PATH", path);
    let runs = tmp.path().join("runs");
    let backend = SlurmBackend::new(SlurmOptions::new("debug", vec!["trainyard".into(), "shim".into()])).unwrap();

    // 1. A slow sbatch does not hold up `launch`: the run is recorded (no id yet) at once,
    //    and gets its job id when sbatch answers. The flags come from `resources`.
    let (sink_a, rx_a) = sink();
    let t0 = Instant::now();
    let out = backend.launch(vec![launch_of(&runs, "workerpool0-0")], sink_a);
    assert!(t0.elapsed() < Duration::from_millis(500), "launch took {:?}", t0.elapsed());
    assert!(out[0].1.is_ok(), "{:?}", out[0].1);
    let a = runs.join("workerpool0-0");
    let recorded = read_job_file(&a).unwrap().expect("slurm.json is written before launch returns");
    assert_eq!(recorded.job_id, None);
    wait_until("the job id is recorded", 10, || job_id(&a) == Some(4242));
    let args = lines(&bin, "sbatch.log");
    assert_eq!(args.len(), 1, "{args:?}");
    assert!(args[0].contains("--cpus-per-task=2") && args[0].contains("--mem=512M") && args[0].contains("--time=3"), "{args:?}");
    assert!(!args[0].contains("--gres"), "{args:?}");
    // Launching it again is a no-op (adopted, not submitted again).
    let (sink_a2, _rx_a2) = sink();
    assert!(backend.launch(vec![launch_of(&runs, "workerpool0-0")], sink_a2)[0].1.is_ok());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&bin, "sbatch.log").len(), 1);
    assert!(rx_a.try_recv().is_err(), "no event for a submitted run yet");

    // 2. The controller is unreachable: no failure, a waiting reason, tries again after
    //    2 s (looking the job up first), and submits once it answers.
    set(&bin, "mode", "down");
    set(&bin, "next_id", "4343\n");
    let (sink_b, rx_b) = sink();
    let b = runs.join("workerpool1-0");
    let t0 = Instant::now();
    assert!(backend.launch(vec![launch_of(&runs, "workerpool1-0")], sink_b)[0].1.is_ok());
    assert!(t0.elapsed() < Duration::from_millis(500));
    wait_until("a waiting reason", 5, || backend.waiting_reason(&run_id("workerpool1-0")).is_some());
    let reason = backend.waiting_reason(&run_id("workerpool1-0")).unwrap();
    assert!(reason.contains("unreachable") && reason.contains("trying again in 2s"), "{reason}");
    assert_eq!(backend.waiting_reason(&run_id("workerpool0-0")), None);
    // The second try (after 2 s) looks the job up, finds the controller still down, and
    // does not run sbatch.
    wait_until("a second try", 6, || {
        backend.waiting_reason(&run_id("workerpool1-0")).is_some_and(|r| r.contains("trying again in 4s"))
    });
    assert_eq!(job_id(&b), None);
    assert_eq!(lines(&bin, "sbatch.log").len(), 2, "no sbatch while squeue cannot reach the controller");
    assert!(rx_b.try_recv().is_err(), "no Exited while the controller is unreachable");
    set(&bin, "mode", "up");
    wait_until("the job is submitted after the controller came back", 15, || job_id(&b) == Some(4343));
    assert_eq!(backend.waiting_reason(&run_id("workerpool1-0")), None);
    assert_eq!(lines(&bin, "sbatch.log").len(), 3, "one failed sbatch, the 4242 one and one that went through");

    // 2b. Kill (the escalation after a stop that was not honoured): SIGKILL to the whole
    //     job, then a plain cancel. A run without a job is left alone.
    backend.kill(&run_id("workerpool1-0"), b.clone()).unwrap();
    let cancels = lines(&bin, "scancel.log");
    assert_eq!(cancels[cancels.len() - 2..], ["--signal=KILL --full 4343", "4343"], "{cancels:?}");
    let before = cancels.len();
    backend.kill(&run_id("workerpool9-0"), runs.join("workerpool9-0")).unwrap();
    assert_eq!(lines(&bin, "scancel.log").len(), before, "nothing to cancel for a run that never had a job");

    // 3. A refusal ends the run LaunchFailed through the sink, with Slurm's message.
    set(&bin, "mode", "refuse");
    let (sink_c, rx_c) = sink();
    assert!(backend.launch(vec![launch_of(&runs, "workerpool2-0")], sink_c)[0].1.is_ok());
    match rx_c.recv_timeout(Duration::from_secs(10)).expect("an event") {
        BackendEvent::Exited { outcome: Outcome::LaunchFailed { message }, .. } => {
            assert!(message.contains("Requested node configuration is not available"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(read_job_file(&runs.join("workerpool2-0")).unwrap().is_none(), "the marker of a refused run is removed");

    // 4. Stopped before it could be submitted: ends at once, nothing reaches Slurm.
    set(&bin, "mode", "down");
    let (sink_d, rx_d) = sink();
    let before = lines(&bin, "sbatch.log").len();
    assert!(backend.launch(vec![launch_of(&runs, "workerpool3-0")], sink_d)[0].1.is_ok());
    wait_until("a waiting reason", 5, || backend.waiting_reason(&run_id("workerpool3-0")).is_some());
    backend.stop(&run_id("workerpool3-0"), runs.join("workerpool3-0")).unwrap();
    match rx_d.recv_timeout(Duration::from_secs(5)).expect("an event") {
        BackendEvent::Exited { outcome, .. } => assert_eq!(outcome, Outcome::Signaled { signal: 15 }),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(lines(&bin, "sbatch.log").len(), before + 1, "only the try that found the controller down");
    assert!(read_job_file(&runs.join("workerpool3-0")).unwrap().is_none());

    // 5. A gang: the first runs of an attempt's two replicas are one allocation
    //    (--ntasks=2; its batch script starts one step per replica); a replica's stop
    //    signals its step only; a replica ends with its step while the allocation goes on;
    //    the allocation is released once every replica ended.
    set(&bin, "mode", "up");
    set(&bin, "next_id", "5000\n");
    set(&bin, "squeue.json", r#"{"jobs":[{"job_id":5000,"job_state":"RUNNING","state_reason":"None","nodes":"n1","name":"ty-9-1-gang"}]}"#);
    let attempt = tmp.path().join("data").join("runs").join("9").join("1");
    let member = |replica: &str| {
        let mut l = launch_of(&attempt, replica);
        l.run = RunId { job: 9, attempt: 1, replica: replica.into(), restart: 0 };
        l.run_dir = attempt.join(replica).join("0");
        l
    };
    let (sink_e, rx_e) = sink();
    let before = lines(&bin, "sbatch.log").len();
    let out = backend.launch(vec![member("workerpool0-0"), member("workerpool1-0")], sink_e);
    assert!(out.iter().all(|(_, r)| r.is_ok()), "{out:?}");
    let (a, b) = (attempt.join("workerpool0-0").join("0"), attempt.join("workerpool1-0").join("0"));
    wait_until("both replicas have the allocation's id", 10, || job_id(&a) == Some(5000) && job_id(&b) == Some(5000));
    let args = lines(&bin, "sbatch.log");
    assert_eq!(args.len(), before + 1, "one sbatch for the gang: {args:?}");
    let last = args.last().unwrap();
    assert!(last.contains("--ntasks=2") && last.contains("--cpus-per-task=2") && last.ends_with(".gang/gang.sh"), "{last}");
    let script = fs::read_to_string(attempt.join(".gang").join("gang.sh")).unwrap();
    assert_eq!(script.matches("srun ").count(), 2, "{script}");
    fs::write(b.join("slurm-step"), "5000.1\n").unwrap();
    std::thread::sleep(Duration::from_millis(1200)); // squeue has seen the allocation run
    backend.stop(&RunId { job: 9, attempt: 1, replica: "workerpool1-0".into(), restart: 0 }, b.clone()).unwrap();
    assert_eq!(lines(&bin, "scancel.log").last().map(String::as_str), Some("--signal=TERM 5000.1"), "the step only");
    let status = |code: &str, signal: &str| format!(r#"{{"exit_code":{code},"signal":{signal},"oom_kills":0,"start_error":null,"ended_micros":1}}"#);
    fs::write(b.join("status.json"), status("null", "15")).unwrap();
    match rx_e.recv_timeout(Duration::from_secs(5)).expect("b ends") {
        BackendEvent::Exited { run, outcome, .. } => {
            assert_eq!(run.replica, "workerpool1-0");
            assert_eq!(outcome, Outcome::Signaled { signal: 15 });
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!attempt.join(".gang").join("release").exists(), "a replica still runs");
    fs::write(a.join("status.json"), status("0", "null")).unwrap();
    match rx_e.recv_timeout(Duration::from_secs(5)).expect("a ends") {
        BackendEvent::Exited { run, outcome, .. } => {
            assert_eq!(run.replica, "workerpool0-0");
            assert_eq!(outcome, Outcome::Exited { code: 0 });
        }
        other => panic!("unexpected {other:?}"),
    }
    wait_until("the allocation is released", 10, || attempt.join(".gang").join("release").exists());
    drop(rx_b);
}
