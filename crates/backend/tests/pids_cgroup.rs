//! The task limit (`pids_max`) is each replica's own, with real shims and this host's
//! cgroups: on cgroup v1 through a cgroup per replica in the v1 pids hierarchy, on v2
//! through `pids.max` of the replica's cgroup. `RLIMIT_NPROC`, the fallback without a
//! pids cgroup, is counted per uid: there one replica's fork bomb leaves no task to
//! another replica of the same project, which is what these tests check does not happen.
//!
//! Root only (cgroups, replicas switched to a uid of their own). A host without a usable
//! pids cgroup skips them, saying why, except in CI (`CI=true`), where that fails.

mod common;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{read_log, BackendEvent, CgroupSupport, LocalBackend, PidsSupport, RunAs};
use trainyard_core::{Outcome, RunId};

const DEADLINE: Duration = Duration::from_secs(60);
/// Both replicas of the fork-bomb test run as this uid, as two replicas of one project do.
const UID: u32 = 200_141;
/// The other test's, so that the tests do not share a uid's processes.
const OTHER_UID: u32 = 200_142;
const PIDS_MAX: u64 = 20;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The local backend with this host's cgroups, when it can give each replica a task limit
/// of its own; else `None` after saying why (a panic in CI).
fn backend_with_pids_cgroups() -> Option<LocalBackend> {
    if !is_root() {
        eprintln!("skipped: needs root (replica cgroups, replicas switched to uid {UID})");
        return None;
    }
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let shim_command: Vec<OsString> = vec![env!("CARGO_BIN_EXE_trainyard-shim").into()];
    let backend = LocalBackend::new(shim_command, CgroupSupport::detect());
    let why = match (backend.cgroups(), backend.pids()) {
        (CgroupSupport::Unavailable { reason }, _) => format!("no writable memory cgroup: {reason}"),
        (_, PidsSupport::Unavailable { reason }) => format!("no pids cgroup for replicas: {reason}"),
        _ => return Some(backend),
    };
    assert!(!in_ci, "CI needs a task limit per replica (the cgroup v1 pids hierarchy, or v2 pids.max): {why}");
    eprintln!("skipped: {why}");
    None
}

fn run_id(replica: &str) -> RunId {
    RunId { job: 1, attempt: 0, replica: replica.into(), restart: 0 }
}

fn python(script: &str, uid: u32) -> ShimSpec {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let mut spec = ShimSpec::new(vec!["python3".into(), "-c".into(), script.into()], vec![("PATH".into(), path)]);
    spec.cwd = Some("/".into());
    spec.run_as = Some(RunAs { uid, gid: uid });
    spec.pids_max = Some(PIDS_MAX);
    spec
}

fn next_event(rx: &Receiver<BackendEvent>) -> BackendEvent {
    match rx.recv_timeout(DEADLINE) {
        Ok(ev) => ev,
        Err(RecvTimeoutError::Timeout) => panic!("no backend event within {DEADLINE:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("event sink dropped"),
    }
}

fn wait_exit(rx: &Receiver<BackendEvent>) -> (Outcome, Vec<String>) {
    loop {
        if let BackendEvent::Exited { outcome, stderr_tail, .. } = next_event(rx) {
            return (outcome, stderr_tail);
        }
    }
}

fn log_lines(dir: &Path) -> Vec<String> {
    read_log(dir, 0).map(|(entries, _)| entries.into_iter().map(|e| e.text).collect()).unwrap_or_default()
}

/// The replica's cgroup in the v1 pids hierarchy, as its spec names it; `None` on v2.
fn v1_pids_cgroup(dir: &Path) -> Option<PathBuf> {
    let spec = shim::read_spec(dir).unwrap().unwrap();
    spec.pids_cgroup_base.map(|base| base.join(spec.cgroup_name))
}

fn live_processes_of(uid: u32) -> usize {
    let uid = uid.to_string();
    fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                        s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(uid.as_str()))
                            && !s.lines().any(|l| l.starts_with("State:") && l.contains('Z'))
                    })
                })
                .count()
        })
        .unwrap_or(0)
}

/// Two replicas of one uid with `pids_max` = 20 each: A fork-bombs and holds every task
/// it got, B still forks. A's forks stop within its limit, B gets no RLIMIT_NPROC (the
/// limit is its cgroup's), and both replicas' pids cgroups are gone when they end: B's
/// when its program exits, A's when it is killed.
#[test]
fn a_fork_bomb_leaves_another_replica_of_its_uid_room_to_fork() {
    let Some(backend) = backend_with_pids_cgroups() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (tmp.path().join("runs/1/0/workerpool0-0/0"), tmp.path().join("runs/1/0/workerpool0-1/0"));

    let bomb = [
        "import os, time",
        "n = failed = 0",
        "for i in range(200):",
        "    try:",
        "        pid = os.fork()",
        "    except OSError:",
        "        failed += 1",
        "        continue",
        "    if pid == 0:",
        "        time.sleep(120)",
        "        os._exit(0)",
        "    n += 1",
        "print('forked', n, 'failed', failed, flush=True)",
        "time.sleep(120)",
    ]
    .join("\n");
    let (sink_a, rx_a) = common::sink();
    backend.launch(run_id("workerpool0-0"), &dir_a, python(&bomb, UID), sink_a).unwrap();
    let _kill_a = common::KillOnDrop(&backend, dir_a.clone());
    let deadline = Instant::now() + DEADLINE;
    let line = loop {
        if let Some(l) = log_lines(&dir_a).iter().find_map(|l| l.strip_prefix("forked ").map(str::to_string)) {
            break l;
        }
        assert!(Instant::now() < deadline, "no count from A within {DEADLINE:?}: {:?}", log_lines(&dir_a));
        std::thread::sleep(Duration::from_millis(50));
    };
    let forked: u64 = line.split(' ').next().and_then(|n| n.parse().ok()).expect("count");
    assert!(forked < PIDS_MAX, "A forked {forked} processes with pids_max = {PIDS_MAX}");
    assert!(line.ends_with(&format!("failed {}", 200 - forked)), "{line}");
    let pids_a = v1_pids_cgroup(&dir_a);
    if let Some(cg) = &pids_a {
        let current: u64 = fs::read_to_string(cg.join("pids.current")).unwrap().trim().parse().unwrap();
        assert!(current <= PIDS_MAX, "{} holds {current} tasks", cg.display());
    }

    // A holds every task it got: its uid has PIDS_MAX processes now. B wants five more at
    // once, and its limit to itself.
    let probe = [
        "import os, resource, time",
        "print('nproc', resource.getrlimit(resource.RLIMIT_NPROC)[0], flush=True)",
        "print('cgroups', ' '.join(l.strip() for l in open('/proc/self/cgroup') if ':pids:' in l), flush=True)",
        "children = []",
        "for i in range(5):",
        "    pid = os.fork()",
        "    if pid == 0:",
        "        time.sleep(1)",
        "        os._exit(0)",
        "    children.append(pid)",
        "for pid in children:",
        "    os.waitpid(pid, 0)",
        "print('b forked', len(children), flush=True)",
    ]
    .join("\n");
    let (sink_b, rx_b) = common::sink();
    backend.launch(run_id("workerpool0-1"), &dir_b, python(&probe, UID), sink_b).unwrap();
    let (outcome, tail) = wait_exit(&rx_b);
    let lines_b = log_lines(&dir_b);
    assert_eq!(outcome, Outcome::Exited { code: 0 }, "B (while A holds its tasks): {lines_b:?} {tail:?}");
    assert!(lines_b.contains(&"b forked 5".to_string()), "{lines_b:?}");
    let nproc = lines_b.iter().find_map(|l| l.strip_prefix("nproc ")).expect("nproc line");
    assert_ne!(nproc, PIDS_MAX.to_string(), "B got RLIMIT_NPROC = pids_max: the limit is not its cgroup's");
    if let Some(cg) = v1_pids_cgroup(&dir_b) {
        let name = cg.file_name().unwrap().to_string_lossy().into_owned();
        let member = lines_b.iter().find_map(|l| l.strip_prefix("cgroups ")).unwrap_or_default();
        assert!(member.ends_with(&format!("/trainyard/{name}")), "B is not in its pids cgroup {name}: {member:?}");
        assert!(!cg.exists(), "B's pids cgroup {} is left after B ended", cg.display());
    }

    backend.kill(&dir_a).unwrap();
    let (outcome, _) = wait_exit(&rx_a);
    assert!(!matches!(outcome, Outcome::Exited { code: 0 }), "A was killed: {outcome:?}");
    if let Some(cg) = pids_a {
        assert!(!cg.exists(), "A's pids cgroup {} is left after A was killed", cg.display());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = live_processes_of(UID);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} process(es) of uid {UID} left");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A program that cannot start (it does not exist) leaves no pids cgroup behind.
#[test]
fn no_pids_cgroup_is_left_by_a_program_that_cannot_start() {
    let Some(backend) = backend_with_pids_cgroups() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runs/1/0/workerpool0-0/0");
    let mut spec = python("", OTHER_UID);
    spec.argv = vec!["/nonexistent/trainyard-test-program".into()];
    let (sink, rx) = common::sink();
    backend.launch(run_id("workerpool0-0"), &dir, spec, sink).unwrap();
    let (outcome, _) = wait_exit(&rx);
    assert!(matches!(outcome, Outcome::StartError { .. }), "{outcome:?}");
    match v1_pids_cgroup(&dir) {
        Some(cg) => assert!(!cg.exists(), "{} is left", cg.display()),
        None => assert!(matches!(backend.pids(), PidsSupport::V2), "{:?}", backend.pids()),
    }
}
