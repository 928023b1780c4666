//! The local backend with real shims and real processes. Every wait has a deadline, so a
//! hang fails the test instead of blocking the suite.

mod common;

use common::sink;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{read_log, BackendEvent, CgroupSupport, LocalBackend, LogEntry};
use trainyard_core::{Outcome, RunId};

const DEADLINE: Duration = Duration::from_secs(60);

fn shim_command() -> Vec<OsString> {
    vec![env!("CARGO_BIN_EXE_trainyard-shim").into()]
}

fn no_cgroups() -> CgroupSupport {
    CgroupSupport::Unavailable { reason: "not used by this test".into() }
}

fn backend() -> LocalBackend {
    LocalBackend::new(shim_command(), no_cgroups())
}

fn run_id(replica: &str) -> RunId {
    RunId { job: 1, attempt: 0, replica: replica.into(), restart: 0 }
}


fn base_env(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn sh(script: &str) -> ShimSpec {
    ShimSpec::new(vec!["sh".into(), "-c".into(), script.into()], base_env(&[]))
}

fn next_event(rx: &Receiver<BackendEvent>) -> BackendEvent {
    match rx.recv_timeout(DEADLINE) {
        Ok(ev) => ev,
        Err(RecvTimeoutError::Timeout) => panic!("no backend event within {DEADLINE:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("event sink dropped"),
    }
}

/// Waits for `Exited`, returning the pid of a preceding `Started`, if any.
fn wait_exit(rx: &Receiver<BackendEvent>, run: &RunId) -> (Option<u32>, Outcome, Vec<String>) {
    let mut pid = None;
    loop {
        match next_event(rx) {
            BackendEvent::Started { run: r, pid: p } => {
                assert_eq!(&r, run);
                assert!(pid.is_none(), "Started twice");
                pid = Some(p);
            }
            BackendEvent::Exited { run: r, outcome, stderr_tail } => {
                assert_eq!(&r, run);
                return (pid, outcome, stderr_tail);
            }
        }
    }
}

fn wait_started(rx: &Receiver<BackendEvent>) -> u32 {
    match next_event(rx) {
        BackendEvent::Started { pid, .. } => pid,
        other => panic!("expected Started, got {other:?}"),
    }
}

/// Polls the run's log until an entry with this text appears (test-side polling only).
fn wait_for_log_line(run_dir: &Path, text: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (entries, _) = read_log(run_dir, 0).unwrap();
        if entries.iter().any(|e| e.text == text) {
            return;
        }
        assert!(Instant::now() < deadline, "log line {text:?} did not appear in {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every entry of the run's log: `read_log` returns at most a few MiB per call, so it is
/// read on until the offset stops moving.
fn read_whole_log(run_dir: &Path) -> Vec<LogEntry> {
    let (mut entries, mut offset) = (Vec::new(), 0);
    loop {
        let (more, next) = read_log(run_dir, offset).unwrap();
        entries.extend(more);
        if next == offset {
            return entries;
        }
        offset = next;
    }
}

fn run_dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("runs/1/0/workerpool0-0/0")
}

/// Pids of live (non-zombie) processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn exit_zero_reports_started_then_exited() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    backend().launch(run.clone(), &dir, sh("echo hello"), s).unwrap();
    let (pid, outcome, tail) = wait_exit(&rx, &run);
    assert!(pid.is_some_and(|p| p > 0));
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert!(tail.is_empty());
    let status = shim::read_status(&dir).unwrap().unwrap();
    assert_eq!((status.exit_code, status.signal, status.oom_kills), (Some(0), None, None));
    assert!(dir.join("started.json").exists() && dir.join("spec.json").exists());
}

/// L13: a non-zero exit is an exit code of the program's own, with the last 100 stderr
/// lines (failure rules' log patterns look at them; an error message carries 20).
#[test]
fn l13_exit_3_with_stderr_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let script = "i=1; while [ $i -le 130 ]; do echo \"err $i\" >&2; echo \"out $i\"; i=$((i+1)); done; exit 3";
    backend().launch(run.clone(), &dir, sh(script), s).unwrap();
    let (_, outcome, tail) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 3 });
    let want: Vec<String> = (31..=130).map(|i| format!("err {i}")).collect();
    assert_eq!(tail, want);
}

/// L13 StartError: a program that does not exist.
#[test]
fn l13_start_error_for_a_missing_program() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let spec = ShimSpec::new(vec!["/nonexistent/train.py".into()], base_env(&[]));
    backend().launch(run.clone(), &dir, spec, s).unwrap();
    let (pid, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(pid, None, "a program that never started must not be reported Started");
    let Outcome::StartError { message } = outcome else { panic!("expected StartError, got {outcome:?}") };
    assert!(message.contains("/nonexistent/train.py") && message.contains("No such file"), "{message}");
}

/// L13 StartError: a file that is not executable.
#[test]
fn l13_start_error_for_a_non_executable_file() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = tmp.path().join("train.sh");
    fs::write(&prog, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o644)).unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let spec = ShimSpec::new(vec![prog.to_string_lossy().into_owned()], base_env(&[]));
    backend().launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    let Outcome::StartError { message } = outcome else { panic!("expected StartError, got {outcome:?}") };
    assert!(message.contains("train.sh") && message.contains("Permission denied"), "{message}");
}

/// L10: SIGKILL from outside Trainyard is a signal death (non-permanent), not an exit.
#[test]
fn l10_sigkill_from_outside_is_signaled_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    backend().launch(run.clone(), &dir, sh("exec sleep 300"), s).unwrap();
    let pid = wait_started(&rx);
    // SAFETY: kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Signaled { signal: 9 });
}

/// L18/L9: a stop sends SIGTERM; a program that checkpoints and exits 0 in its grace
/// period ends with its own exit code.
#[test]
fn l18_stop_with_grace_program_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = backend();
    let script = "trap 'echo checkpointed; exit 0' TERM; echo ready; while :; do sleep 0.1; done";
    b.launch(run.clone(), &dir, sh(script), s).unwrap();
    wait_started(&rx);
    wait_for_log_line(&dir, "ready");
    b.stop(&dir).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    let (entries, _) = read_log(&dir, 0).unwrap();
    assert!(entries.iter().any(|e| e.text == "checkpointed"));
    // Stopping an ended run is a no-op.
    b.stop(&dir).unwrap();
}

/// L18/L20: a program that ignores SIGTERM is SIGKILLed at the end of the grace period.
#[test]
fn l18_stop_kills_a_program_that_ignores_sigterm_after_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = backend();
    let mut spec = sh("trap '' TERM; echo ready; while :; do sleep 0.1; done");
    spec.grace_seconds = 0.5;
    b.launch(run.clone(), &dir, spec, s).unwrap();
    wait_started(&rx);
    wait_for_log_line(&dir, "ready");
    b.stop(&dir).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Signaled { signal: 9 });
}

/// L22/L18: the supervisor reads the program's output and takes its signals in one
/// thread: a program that writes without pause is still stopped within its grace
/// period, its last line is in the log, and its supervisor has no other thread.
#[test]
fn l22_one_supervisor_thread_reads_a_flood_of_output_and_takes_a_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = backend();
    let mut spec = sh("trap 'echo stopped; exit 0' TERM; echo ready; while :; do echo flood flood flood; done");
    // However long the stop takes to come, the flood keeps at most this much on disk.
    spec.log_max_bytes = Some(8 << 20);
    b.launch(run.clone(), &dir, spec, s).unwrap();
    // A failed assertion must not leave the flood running.
    let _guard = common::KillOnDrop(&b, dir.clone());
    wait_started(&rx);
    wait_for_log_line(&dir, "ready");
    let shim_pid = fs::read_to_string(dir.join(shim::PID_FILE)).unwrap();
    let threads = fs::read_dir(format!("/proc/{}/task", shim_pid.trim())).unwrap().count();
    assert_eq!(threads, 1, "the supervisor has threads besides its own");
    b.stop(&dir).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    let entries = read_whole_log(&dir);
    assert_eq!(entries.last().map(|e| e.text.as_str()), Some("stopped"));
    assert!(entries.iter().filter(|e| e.text == "flood flood flood").count() > 2, "the flood is in the log");
}

/// L18: a stop issued right after launch, before the shim even holds its lock, is not lost.
#[test]
fn l18_stop_right_after_launch_reaches_the_program() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = backend();
    b.launch(run.clone(), &dir, ShimSpec::new(vec!["sleep".into(), "300".into()], base_env(&[])), s).unwrap();
    b.stop(&dir).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Signaled { signal: libc::SIGTERM });
}

fn descendants_do_not_survive(cgroups: CgroupSupport) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    let marker = format!("3{}.{}", std::process::id(), work.as_os_str().len() + rand_suffix());
    // Two background children in the program's group, and a double-forked daemon in a
    // session of its own; the program waits until all three exist, then exits 0.
    let script = r#"
        sleep "$MARK" & echo $! > a.pid
        sleep "$MARK" & echo $! > b.pid
        setsid sh -c 'sleep "$MARK" & echo $! > c.pid.tmp; mv c.pid.tmp c.pid'
        while [ ! -s c.pid ]; do sleep 0.01; done
        echo ready
        exit 0"#;
    let mut spec = ShimSpec::new(vec!["sh".into(), "-c".into(), script.into()], base_env(&[("MARK", &marker)]));
    spec.cwd = Some(work.clone());
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    LocalBackend::new(shim_command(), cgroups).launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    for f in ["a.pid", "b.pid", "c.pid"] {
        assert!(work.join(f).exists(), "{f} was not written: the descendant never ran");
    }
    let left = processes_with(&marker);
    assert!(left.is_empty(), "processes of the finished replica still run: {left:?}");
}

fn rand_suffix() -> usize {
    // Distinct per call within this process.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 100
}

/// L20 without a cgroup: the process group and the subreaper catch everything.
#[test]
fn l20_no_descendant_survives_without_cgroup() {
    descendants_do_not_survive(no_cgroups());
}

/// L20 with the host's cgroup (when available).
#[test]
fn l20_no_descendant_survives_with_cgroup() {
    let cgroups = CgroupSupport::detect();
    if let CgroupSupport::Unavailable { reason } = &cgroups {
        println!("cgroups unavailable ({reason}); running without");
    }
    descendants_do_not_survive(cgroups);
}

/// Sends SIGKILL to a stopped shim if the test fails half-way, so that nothing is left
/// stopped for ever.
struct KillIfPanicking(i32);

impl Drop for KillIfPanicking {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) has no memory effects.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
            }
        }
    }
}

fn kill_needs_no_answer_from_the_shim(cgroups: CgroupSupport) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    let marker = format!("4{}.{}", std::process::id(), work.as_os_str().len() + rand_suffix());
    // Everything ignores SIGTERM: the program, a child in its group, and a daemon in a
    // session of its own.
    let script = r#"
        trap '' TERM
        setsid sh -c 'sleep "$MARK"; :' &
        sleep "$MARK" &
        sleep "$MARK"; :"#;
    let mut spec = ShimSpec::new(vec!["sh".into(), "-c".into(), script.into()], base_env(&[("MARK", &marker)]));
    spec.cwd = Some(work.clone());
    spec.grace_seconds = 0.5;
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = LocalBackend::new(shim_command(), cgroups);
    b.launch(run.clone(), &dir, spec, s).unwrap();
    wait_started(&rx);
    let deadline = Instant::now() + DEADLINE;
    while processes_with(&marker).len() < 3 {
        assert!(Instant::now() < deadline, "the program's processes did not all start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let shim_pid: i32 = fs::read_to_string(dir.join(shim::PID_FILE)).unwrap().trim().parse().unwrap();
    let _guard = KillIfPanicking(shim_pid);
    // SAFETY: kill(2) has no memory effects; the shim is our watcher's unreaped child.
    assert_eq!(unsafe { libc::kill(shim_pid, libc::SIGSTOP) }, 0);

    // A stop is not honoured: the shim cannot act on its SIGTERM, no grace period starts.
    b.stop(&dir).unwrap();
    match rx.recv_timeout(Duration::from_millis(1500)) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("nothing happens after a stop of a stopped shim, got {other:?}"),
    }
    assert_eq!(processes_with(&marker).len(), 3);

    // The kill does it, through the seam, within a couple of seconds.
    let t0 = Instant::now();
    trainyard_backend::Backend::kill(&b, &run, dir.clone()).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    let took = t0.elapsed();
    assert!(matches!(outcome, Outcome::Lost { .. }), "{outcome:?}");
    assert!(took < Duration::from_secs(3), "Exited came {took:?} after the kill");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = processes_with(&marker);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes of the killed replica still run: {left:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!Path::new(&format!("/proc/{shim_pid}")).exists(), "the shim is gone (and reaped)");
    if let Some((_, base)) = b.cgroups().base() {
        let cg_dir = base.join(shim::read_spec(&dir).unwrap().unwrap().cgroup_name);
        assert!(!cg_dir.exists(), "replica cgroup {} was not removed", cg_dir.display());
    }

    // Idempotent: the ended run is left alone, and so is a run that never existed.
    b.kill(&dir).unwrap();
    b.stop(&dir).unwrap();
    b.kill(&tmp.path().join("never/launched")).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no event for a run that has ended");
}

/// L18/L20: `kill` does not depend on the shim answering. A program that ignores
/// SIGTERM, under a shim stopped by SIGSTOP: `stop` changes nothing, `kill` ends the run
/// (Exited, Lost) within a couple of seconds with no process of it left; `kill` of an
/// ended run is Ok. Without a cgroup: the program's group and the shim's children.
#[test]
fn l20_kill_ends_a_run_whose_shim_does_not_answer_without_cgroup() {
    kill_needs_no_answer_from_the_shim(no_cgroups());
}

/// L18/L20: as above, with the host's cgroup (when available), which is emptied too.
#[test]
fn l20_kill_ends_a_run_whose_shim_does_not_answer_with_cgroup() {
    let cgroups = CgroupSupport::detect();
    if let CgroupSupport::Unavailable { reason } = &cgroups {
        println!("cgroups unavailable ({reason}); running without");
    }
    kill_needs_no_answer_from_the_shim(cgroups);
}

/// L20: `kill` of a run that ended on its own is Ok and changes nothing.
#[test]
fn l20_kill_of_an_ended_run_is_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = backend();
    b.launch(run.clone(), &dir, sh("exit 4"), s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 4 });
    b.kill(&dir).unwrap();
    assert_eq!(shim::read_status(&dir).unwrap().and_then(|s| s.exit_code), Some(4));
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
}

/// L14: an OOM kill is read from the cgroup's oom_kill counter.
#[test]
fn l14_memory_hog_is_oom_killed() {
    let cgroups = CgroupSupport::detect();
    if let CgroupSupport::Unavailable { reason } = &cgroups {
        if std::env::var_os("CI").is_none() {
            println!("SKIPPED l14_memory_hog_is_oom_killed: no usable memory cgroup: {reason}");
            return;
        }
        panic!("CI is set and no memory cgroup is usable: {reason}");
    }
    let argv: Vec<String> = if Path::new("/usr/bin/python3").exists() {
        vec!["/usr/bin/python3".into(), "-c".into(), "b=[bytearray(10**6) for _ in range(500)]".into()]
    } else {
        vec!["sh".into(), "-c".into(), "x=$(head -c 500000000 /dev/zero | tr '\\0' a); echo ${#x}".into()]
    };
    let mut spec = ShimSpec::new(argv, base_env(&[]));
    spec.memory_limit_bytes = Some(100 * 1024 * 1024);
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let b = LocalBackend::new(shim_command(), cgroups.clone());
    b.launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::OomKilled { status: 137 });
    let status = shim::read_status(&dir).unwrap().unwrap();
    assert!(status.oom_kills.is_some_and(|n| n >= 1), "{status:?}");
    let (_, base) = cgroups.base().unwrap();
    let cg_dir = base.join(shim::read_spec(&dir).unwrap().unwrap().cgroup_name);
    assert!(!cg_dir.exists(), "replica cgroup {} was not removed", cg_dir.display());
}

/// L23: a run started by one backend (server process) is adopted by the next one.
#[test]
fn l23_a_new_backend_adopts_a_running_replica() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let run = run_id("workerpool0-0");
    let (s1, rx1) = sink();
    let first = backend();
    first.launch(run.clone(), &dir, ShimSpec::new(vec!["sleep".into(), "2".into()], base_env(&[])), s1).unwrap();
    let pid = wait_started(&rx1);
    // The shim leads a session of its own: a Ctrl-C or hang-up meant for the server's
    // terminal does not reach it.
    let shim_pid: i32 = fs::read_to_string(dir.join("shim.pid")).unwrap().trim().parse().unwrap();
    let stat = fs::read_to_string(format!("/proc/{shim_pid}/stat")).unwrap();
    let session: i32 = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(session, shim_pid);
    drop(first);
    let (s2, rx2) = sink();
    let second = backend();
    second.adopt(run.clone(), &dir, s2).unwrap();
    let (adopted_pid, outcome, _) = wait_exit(&rx2, &run);
    assert_eq!(adopted_pid, Some(pid));
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    // Adopting a finished run reports it again from status.json.
    let (s3, rx3) = sink();
    backend().adopt(run.clone(), &dir, s3).unwrap();
    assert_eq!(wait_exit(&rx3, &run).1, Outcome::Exited { code: 0 });
}

/// L23: a run whose server died after launching it but before its shim took the lock
/// (the spec written, no shim running yet) is started by the next backend in the same
/// directory, not reported lost (which would start it again elsewhere): its program runs
/// once, and the first server's shim, should it come late, runs nothing.
#[test]
fn l23_a_run_launched_by_a_dead_server_before_its_shim_started_runs_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    fs::create_dir_all(&dir).unwrap();
    let marks = tmp.path().join("marks");
    shim::write_spec(&dir, &sh(&format!("echo started >> {}", marks.display()))).unwrap();
    let run = run_id("workerpool0-0");
    let (s, rx) = sink();
    let adopting = backend();
    adopting.adopt(run.clone(), &dir, s).unwrap();
    let (pid, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert!(pid.is_some(), "the program was not reported started");
    let late = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-shim")).arg(&dir).status().unwrap();
    assert_eq!(late.code(), Some(shim::EXIT_ALREADY_RAN));
    assert_eq!(fs::read_to_string(&marks).unwrap(), "started\n");
}

/// Architecture, idempotent effects: launching one run twice runs it once, whether the
/// second launch comes from the same backend, from a new one while it runs, or after it ended.
#[test]
fn launching_a_run_twice_runs_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    let run = run_id("workerpool0-0");
    let mut spec = sh("echo x >> count; echo ready; sleep 1");
    spec.cwd = Some(work.clone());

    let (s1, rx1) = sink();
    let first = backend();
    first.launch(run.clone(), &dir, spec.clone(), s1.clone()).unwrap();
    first.launch(run.clone(), &dir, spec.clone(), s1).unwrap();
    wait_started(&rx1);
    wait_for_log_line(&dir, "ready");

    let (s2, rx2) = sink();
    backend().launch(run.clone(), &dir, spec.clone(), s2).unwrap();
    assert_eq!(wait_exit(&rx2, &run).1, Outcome::Exited { code: 0 });
    assert_eq!(wait_exit(&rx1, &run).1, Outcome::Exited { code: 0 });
    assert!(rx1.try_recv().is_err(), "the same backend reported the run twice");

    let (s3, rx3) = sink();
    backend().launch(run.clone(), &dir, spec, s3).unwrap();
    assert_eq!(wait_exit(&rx3, &run).1, Outcome::Exited { code: 0 });
    assert_eq!(fs::read_to_string(work.join("count")).unwrap(), "x\n", "the program ran more than once");
}

/// L10: a supervisor that dies leaves the run Lost (not an exit of the program's own),
/// and its program is not started again by a later launch.
#[test]
fn l10_a_killed_shim_is_reported_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let run = run_id("workerpool0-0");
    let (s, rx) = sink();
    let b = backend();
    b.launch(run.clone(), &dir, ShimSpec::new(vec!["sleep".into(), "300".into()], base_env(&[])), s.clone()).unwrap();
    let program = wait_started(&rx);
    let shim_pid: i32 = fs::read_to_string(dir.join("shim.pid")).unwrap().trim().parse().unwrap();
    // SAFETY: kill(2).
    assert_eq!(unsafe { libc::kill(shim_pid, libc::SIGKILL) }, 0);
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert!(matches!(outcome, Outcome::Lost { .. }), "{outcome:?}");
    // Relaunching the same run id does not start the program a second time.
    b.launch(run.clone(), &dir, ShimSpec::new(vec!["sleep".into(), "300".into()], base_env(&[])), s).unwrap();
    assert!(matches!(wait_exit(&rx, &run).1, Outcome::Lost { .. }));
    // Without a cgroup the orphaned program cannot be found safely; end it here.
    // SAFETY: kill(2) on the pid we were told about.
    unsafe {
        libc::kill(program as i32, libc::SIGKILL);
    }
}

/// L22: both streams are kept, one entry per line, in order, with a final partial line.
#[test]
fn l22_log_has_both_streams_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let log = dir.join("log.jsonl");
    // Each line waits until the previous one is in the log, so the order across the two
    // pipes is deterministic.
    let script = r#"
        echo out1
        until grep -q '"out1"' "$LOG"; do sleep 0.01; done
        echo err1 >&2
        until grep -q '"err1"' "$LOG"; do sleep 0.01; done
        printf 'bad \377 byte\n'
        until grep -q 'bad ' "$LOG"; do sleep 0.01; done
        printf 'partial' >&2"#;
    let spec = ShimSpec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        base_env(&[("LOG", log.to_str().unwrap())]),
    );
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    backend().launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, tail) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert_eq!(tail, ["err1", "partial"]);
    let (entries, offset) = read_log(&dir, 0).unwrap();
    let got: Vec<(&str, &str)> = entries.iter().map(|e| (e.stream.as_str(), e.text.as_str())).collect();
    assert_eq!(
        got,
        [("stdout", "out1"), ("stderr", "err1"), ("stdout", "bad \u{fffd} byte"), ("stderr", "partial")]
    );
    assert_eq!(offset, fs::metadata(&log).unwrap().len());
    for pair in entries.windows(2) {
        assert!(pair[0].time <= pair[1].time, "times go down: {pair:?}");
    }
    assert!(entries[0].time.len() == "2026-11-29T10:00:00.123456Z".len() && entries[0].time.ends_with('Z'));
}

/// The environment is exactly the spec's, and the working directory is honoured.
#[test]
fn program_gets_exactly_the_spec_env_and_cwd() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    let mut spec = ShimSpec::new(
        vec!["/usr/bin/env".into()],
        vec![("ONLY".into(), "this".into()), ("AIP_MODEL_DIR".into(), "gs://b/m".into())],
    );
    spec.cwd = Some(work.clone());
    let mut pwd = ShimSpec::new(vec!["/bin/pwd".into()], vec![]);
    pwd.cwd = Some(work.clone());
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    backend().launch(run.clone(), &dir, spec, s.clone()).unwrap();
    assert_eq!(wait_exit(&rx, &run).1, Outcome::Exited { code: 0 });
    let (entries, _) = read_log(&dir, 0).unwrap();
    let mut lines: Vec<&str> = entries.iter().map(|e| e.text.as_str()).collect();
    lines.sort();
    assert_eq!(lines, ["AIP_MODEL_DIR=gs://b/m", "ONLY=this"]);

    let dir2 = tmp.path().join("run2");
    let run2 = run_id("workerpool1-0");
    backend().launch(run2.clone(), &dir2, pwd, s).unwrap();
    assert_eq!(wait_exit(&rx, &run2).1, Outcome::Exited { code: 0 });
    let (entries, _) = read_log(&dir2, 0).unwrap();
    assert_eq!(entries[0].text, fs::canonicalize(&work).unwrap().to_string_lossy());
}

/// Measures (prints; asserts no timing): launch-to-Started and launch-to-Exited latency
/// of a trivial program, and log throughput. Run with `--nocapture` to see the numbers.
#[test]
fn measure_latency_and_log_throughput() {
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = CgroupSupport::detect();
    let label = match &cgroups {
        CgroupSupport::V1 { .. } => "cgroup v1",
        CgroupSupport::V2 { .. } => "cgroup v2",
        CgroupSupport::Unavailable { .. } => "no cgroup",
    };
    let b = LocalBackend::new(shim_command(), cgroups);
    let (s, rx) = sink();
    let mut to_started = Vec::new();
    let mut to_exited = Vec::new();
    for i in 0..10 {
        let run = RunId { job: 99, attempt: 0, replica: "workerpool0-0".into(), restart: i };
        let t0 = Instant::now();
        b.launch(run.clone(), &tmp.path().join(format!("r{i}")), ShimSpec::new(vec!["true".into()], base_env(&[])), s.clone())
            .unwrap();
        wait_started(&rx);
        to_started.push(t0.elapsed());
        let (_, outcome, _) = wait_exit(&rx, &run);
        to_exited.push(t0.elapsed());
        assert_eq!(outcome, Outcome::Exited { code: 0 });
    }
    to_started.sort();
    to_exited.sort();
    println!(
        "[{label}] launch->Started median {:?} max {:?}; launch->Exited median {:?} max {:?} (10 runs of `true`)",
        to_started[5], to_started[9], to_exited[5], to_exited[9]
    );

    let lines = 200_000;
    let run = RunId { job: 99, attempt: 0, replica: "workerpool0-0".into(), restart: 100 };
    let dir = tmp.path().join("throughput");
    let t0 = Instant::now();
    let spec = ShimSpec::new(vec!["seq".into(), lines.to_string()], base_env(&[]));
    b.launch(run.clone(), &dir, spec, s).unwrap();
    assert_eq!(wait_exit(&rx, &run).1, Outcome::Exited { code: 0 });
    let elapsed = t0.elapsed();
    let entries = read_whole_log(&dir);
    assert_eq!(entries.len(), lines);
    assert_eq!(entries.last().unwrap().text, lines.to_string());
    let bytes = fs::metadata(dir.join("log.jsonl")).unwrap().len();
    println!(
        "[{label}] log: {lines} lines in {elapsed:?} = {:.0} lines/s, {bytes} bytes of log.jsonl",
        lines as f64 / elapsed.as_secs_f64()
    );
}

/// L16: a run directory the shim cannot use (here: no spec.json) is a launch failure of
/// Trainyard's, not the user's; the shim binary's usage error exits 64.
#[test]
fn l16_a_shim_without_spec_records_a_launch_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    fs::create_dir_all(&dir).unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-shim")).arg(&dir).status().unwrap();
    assert_eq!(status.code(), Some(0));
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    backend().adopt(run.clone(), &dir, s).unwrap();
    let (pid, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(pid, None);
    let Outcome::LaunchFailed { message } = outcome else { panic!("expected LaunchFailed, got {outcome:?}") };
    assert!(message.contains("spec.json"), "{message}");
    // A second shim in the same directory refuses to run anything.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-shim")).arg(&dir).status().unwrap();
    assert_eq!(again.code(), Some(shim::EXIT_ALREADY_RAN));
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-shim")).status().unwrap();
    assert_eq!(usage.code(), Some(shim::EXIT_USAGE));
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Replica identity: with `run_as` the program runs as that uid and gid, with no
/// supplementary groups and no new privileges; the shim's files stay the shim's.
#[test]
fn run_as_switches_the_program_to_an_unprivileged_identity() {
    if !is_root() && trainyard_backend::skip_test("needs root to switch users") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let mut spec = sh("echo ids $(id -u) $(id -g) [$(id -G)]; grep NoNewPrivs /proc/self/status; cat spec.json && echo READ");
    spec.cwd = Some("/".into());
    spec.run_as = Some(trainyard_backend::RunAs { uid: 200_123, gid: 200_123 });
    backend().launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 1 });
    let (entries, _) = read_log(&dir, 0).unwrap();
    let text: Vec<String> = entries.iter().map(|e| e.text.clone()).collect();
    assert!(text.contains(&"ids 200123 200123 [200123]".to_string()), "{text:?}");
    assert!(text.iter().any(|t| t.starts_with("NoNewPrivs:") && t.ends_with('1')), "{text:?}");
    assert!(!text.contains(&"READ".to_string()), "{text:?}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(dir.join("status.json")).unwrap().uid(), 0);
}

/// A fork bomb within `pids_max`: forks beyond the limit fail (cgroup v2 `pids.max`, or
/// `RLIMIT_NPROC` of the replica's uid where the cgroup has no pids controller), and the
/// replica's processes are all gone when it ends.
#[test]
fn pids_max_bounds_a_fork_bomb() {
    if !is_root() && trainyard_backend::skip_test("needs root to switch users") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let (s, rx) = sink();
    let run = run_id("workerpool0-0");
    let script = "import os, time\nn = 0\nfailed = 0\nfor i in range(500):\n    try:\n        pid = os.fork()\n    except OSError:\n        failed += 1\n        continue\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint('forked', n, 'failed', failed, flush=True)\n";
    let mut spec = ShimSpec::new(vec!["python3".into(), "-c".into(), script.into()], base_env(&[]));
    spec.cwd = Some("/".into());
    spec.run_as = Some(trainyard_backend::RunAs { uid: 200_124, gid: 200_124 });
    spec.pids_max = Some(32);
    backend().launch(run.clone(), &dir, spec, s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    // Processes of uid 200124 left: none (the replica's group was killed at its end).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                    s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("200124"))
                        && !s.lines().any(|l| l.starts_with("State:") && l.contains("Z"))
                })
            })
            .count();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} process(es) of the replica's uid left");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (entries, _) = read_log(&dir, 0).unwrap();
    let line = entries.iter().find_map(|e| e.text.strip_prefix("forked ").map(|n| n.to_string()));
    let Some(line) = line else { panic!("{:?}", entries.iter().map(|e| &e.text).collect::<Vec<_>>()) };
    let forked: u32 = line.split(' ').next().unwrap().parse().unwrap();
    assert!(forked < 32, "{line}");
    assert!(line.ends_with(&format!("failed {}", 500 - forked)), "{line}");
}

/// L22: stdout and stderr lines keep the order in which the program wrote them (one
/// reader over both pipes, each line stamped when read), here for a program that
/// alternates between them with a short pause, as a logging program does.
#[test]
fn l22_stdout_and_stderr_keep_their_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let b = backend();
    let (s, rx) = common::sink();
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo out$i; sleep 0.01; echo err$i >&2; sleep 0.01; done";
    b.launch(run_id("workerpool0-0"), &dir, sh(script), s).unwrap();
    let (_, outcome, _) = wait_exit(&rx, &run_id("workerpool0-0"));
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    let (entries, _) = read_log(&dir, 0).unwrap();
    let got: Vec<String> = entries.iter().map(|e| format!("{}:{}", e.stream, e.text)).collect();
    let want: Vec<String> = (1..=10).flat_map(|i| [format!("stdout:out{i}"), format!("stderr:err{i}")]).collect();
    assert_eq!(got, want);
}

/// L22 within a bound: a program that writes more than the run's log cap keeps the most
/// recent output (the log rotates at half the cap, a note says so), the disk holds at most
/// about the cap, and a reader following the log across the rotation misses nothing of
/// what is kept.
#[test]
fn l22_a_chatty_program_keeps_its_latest_output_within_the_cap() {
    use trainyard_backend::{read_log_from, LogPos};
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let b = backend();
    let (s, rx) = sink();
    let mut spec = sh("i=0; while [ $i -lt 4000 ]; do echo \"line $i of a chatty program\"; i=$((i+1)); done; echo 'the error at the end' >&2; exit 3");
    spec.log_max_bytes = Some(100_000);
    b.launch(run_id("workerpool0-0"), &dir, spec, s).unwrap();
    let (_, outcome, tail) = wait_exit(&rx, &run_id("workerpool0-0"));
    assert_eq!(outcome, Outcome::Exited { code: 3 });
    assert!(tail.iter().any(|l| l == "the error at the end"), "the last stderr lines survive: {tail:?}");
    let size = |f: &str| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
    assert!(size("log.jsonl") + size("log.1.jsonl") <= 110_000, "{} + {}", size("log.jsonl"), size("log.1.jsonl"));
    let mut pos = LogPos::default();
    let mut texts = Vec::new();
    loop {
        let (entries, next) = read_log_from(&dir, pos).unwrap();
        if entries.is_empty() && next == pos {
            break;
        }
        texts.extend(entries.into_iter().map(|e| e.text));
        pos = next;
    }
    assert!(texts.iter().any(|t| t.contains("was rotated")), "a note says where output was dropped");
    assert_eq!(texts.last().map(String::as_str), Some("the error at the end"));
    assert!(texts.iter().any(|t| t == "line 3999 of a chatty program"));
    assert!(!texts.iter().any(|t| t == "line 0 of a chatty program"), "the oldest output is gone");
    // What is kept, oldest first: the rotated file, then the current one.
    let kept: Vec<u32> = texts.iter().filter_map(|t| t.strip_prefix("line ")?.split(' ').next()?.parse().ok()).collect();
    assert!(kept.windows(2).all(|w| w[1] == w[0] + 1), "no gap and no repeat in what is kept");
    let current = read_log(&dir, 0).unwrap().0.iter().filter(|e| e.text.starts_with("line ")).count();
    assert!(kept.len() > current, "both files are read: {} lines, {current} in the current file", kept.len());
}

/// A process's `/proc/PID/cmdline`, its arguments without empty ones.
fn cmdline_of(pid: i32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// A field of `/proc/PID/stat`, counted as proc(5) does (4: ppid, 6: session).
fn stat_field(pid: i32, n: usize) -> i32 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(n - 3).unwrap().parse().unwrap()
}

fn shim_pid(dir: &Path) -> i32 {
    fs::read_to_string(dir.join("shim.pid")).unwrap().trim().parse().unwrap()
}

/// A program that says it is up, then exits 7 once `gate` exists.
fn gated(gate: &Path) -> ShimSpec {
    sh(&format!("echo up; while [ ! -e '{}' ]; do sleep 0.05; done; exit 7", gate.display()))
}

/// Shims are forked by the backend's fork server (not spawned by the server), each in a
/// session of its own, with a spawned shim's command line (the shim command and its run
/// directory).
#[test]
fn shims_are_forked_by_the_fork_server_and_named_by_their_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let gate = tmp.path().join("gate");
    let run = run_id("workerpool0-0");
    let (s, rx) = sink();
    let b = backend();
    b.launch(run.clone(), &dir, gated(&gate), s).unwrap();
    wait_started(&rx);
    let shim = shim_pid(&dir);
    let command: Vec<String> = shim_command().iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let with = |arg: String| command.iter().cloned().chain([arg]).collect::<Vec<_>>();
    assert_eq!(cmdline_of(shim), with(dir.display().to_string()), "as a spawned shim's");
    assert_eq!(stat_field(shim, 6), shim, "the shim leads its own session");
    let fork_server = stat_field(shim, 4);
    assert_ne!(fork_server, std::process::id() as i32, "the shim was spawned, not forked by the fork server");
    assert_eq!(cmdline_of(fork_server), with("--fork-server".to_string()));
    assert_eq!(stat_field(fork_server, 4), std::process::id() as i32);
    fs::write(&gate, "").unwrap();
    assert_eq!(wait_exit(&rx, &run).1, Outcome::Exited { code: 7 });
}

/// A shim outlives its fork server: killed while the program runs, the run is still
/// reported with its program's outcome (not Lost), and the next launch gets a new fork
/// server.
#[test]
fn a_run_outlives_its_fork_server_and_the_next_launch_gets_another() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("runs/1/0/workerpool0-0/0"), tmp.path().join("runs/2/0/workerpool0-0/0"));
    let gate = tmp.path().join("gate");
    let run = run_id("workerpool0-0");
    let (s, rx) = sink();
    let b = backend();
    b.launch(run.clone(), &first, gated(&gate), s.clone()).unwrap();
    wait_started(&rx);
    let old_server = stat_field(shim_pid(&first), 4);
    // SAFETY: kill(2) of the fork server this test's backend started.
    assert_eq!(unsafe { libc::kill(old_server, libc::SIGKILL) }, 0);
    fs::write(&gate, "").unwrap();
    assert_eq!(wait_exit(&rx, &run).1, Outcome::Exited { code: 7 });

    fs::remove_file(&gate).unwrap();
    let next = RunId { job: 2, ..run_id("workerpool0-0") };
    b.launch(next.clone(), &second, gated(&gate), s).unwrap();
    wait_started(&rx);
    let new_server = stat_field(shim_pid(&second), 4);
    assert_ne!(new_server, old_server);
    assert!(cmdline_of(new_server).ends_with(&["--fork-server".to_string()]));
    fs::write(&gate, "").unwrap();
    assert_eq!(wait_exit(&rx, &next).1, Outcome::Exited { code: 7 });
}
