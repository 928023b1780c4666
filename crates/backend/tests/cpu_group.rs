//! Replicas' programs share one CPU group below the server (tenant isolation): on cgroup v1
//! `<own cpu cgroup>/trainyard` with `cpu.shares` of one task at `[replicas] nice`, on v2
//! the replicas' base with `cpu.weight.nice`. However many processes a tenant runs, they
//! weigh together what one task at that nice value does against each of the server's
//! threads; inside the group each replica has a cgroup of its own, one equal share. The program joins the group before its exec, also where its own mount
//! namespace covers `/sys/fs/cgroup` (the shim opened the group's `tasks` before).
//!
//! Root only (cgroups, replicas switched to a uid of their own). A host without a usable
//! CPU group skips them, saying why, except in CI (`CI=true`), where that fails.

mod common;

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use trainyard_backend::shim::ShimSpec;
use trainyard_backend::{nice_weight, read_log, BackendEvent, CgroupSupport, CpuSupport, LocalBackend, RunAs};
use trainyard_core::RunId;

const DEADLINE: Duration = Duration::from_secs(60);
const UID: u32 = 200_143;
const NICE: i32 = 10;

/// The local backend with this host's cgroups and the replicas' CPU group, or `None` after
/// saying why (a panic in CI).
fn backend_with_cpu_group() -> Option<LocalBackend> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (replica cgroups, replicas switched to uid {UID})");
        return None;
    }
    let shim_command: Vec<OsString> = vec![env!("CARGO_BIN_EXE_trainyard-shim").into()];
    let backend = LocalBackend::new(shim_command, CgroupSupport::detect()).with_replica_cpu(NICE);
    let CpuSupport::Unavailable { reason } = backend.cpu() else { return Some(backend) };
    let why = format!("no CPU group for replicas: {reason}");
    assert!(!std::env::var("CI").is_ok_and(|v| v == "true"), "CI needs the replicas' CPU group (the cgroup v1 cpu hierarchy, or v2's cpu controller): {why}");
    eprintln!("skipped: {why}");
    None
}

fn next_event(rx: &Receiver<BackendEvent>) -> BackendEvent {
    match rx.recv_timeout(DEADLINE) {
        Ok(ev) => ev,
        Err(RecvTimeoutError::Timeout) => panic!("no backend event within {DEADLINE:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("event sink dropped"),
    }
}

/// The pid the program printed (`pid N`), once it did.
fn printed_pid(dir: &Path) -> i32 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let lines = read_log(dir, 0).map(|(entries, _)| entries.into_iter().map(|e| e.text).collect::<Vec<_>>()).unwrap_or_default();
        if let Some(pid) = lines.iter().find_map(|l| l.strip_prefix("pid ").and_then(|p| p.trim().parse().ok())) {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid printed within {DEADLINE:?}: {lines:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The cgroup of `pid` in the hierarchy whose controllers include `controller` (v1), or
/// in the unified one (`controller` empty), as the host sees it.
fn cgroup_of(pid: i32, controller: &str) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let hit = if controller.is_empty() { controllers.is_empty() } else { controllers.split(',').any(|c| c == controller) };
            hit.then(|| path.to_string())
        })
        .unwrap_or_default()
}

/// A replica's program (a per-project user's, in a mount namespace of its own with `/gcs`,
/// and one without) is in a cgroup of its own in the replicas' CPU group, which weighs
/// what one task at nice 10 does; on cgroup v1 the group is shared equally by projects
/// (`u<uid>`), then by each project's replicas, so that a tenant's many busy replicas
/// cannot starve another project's one starting; the shim that supervises it is not in
/// the group (the control plane keeps the server's share); the replica's CPU cgroup, and
/// its project's share with its last replica, go when it ends.
#[test]
fn a_replicas_program_is_in_the_replicas_cpu_group_and_its_shim_is_not() {
    let Some(backend) = backend_with_cpu_group() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let gcs = tmp.path().join("gcs");
    fs::create_dir_all(&gcs).unwrap();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let script = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(60)";
    let mut cpu_cgroups = Vec::new();
    for (n, mount) in [(0, None), (1, Some(gcs.clone()))] {
        let replica = format!("workerpool0-{n}");
        let dir = tmp.path().join(format!("runs/1/0/{replica}/0"));
        let mut spec = ShimSpec::new(vec!["python3".into(), "-c".into(), script.into()], vec![("PATH".into(), path.clone())]);
        spec.cwd = Some("/".into());
        spec.run_as = Some(RunAs { uid: UID, gid: UID });
        spec.gcs_mount = mount;
        let (sink, rx) = common::sink();
        backend.launch(RunId { job: 1, attempt: 0, replica, restart: 0 }, &dir, spec, sink).unwrap();
        let _kill = common::KillOnDrop(&backend, dir.clone());
        let pid = printed_pid(&dir);
        let name = trainyard_backend::shim::read_spec(&dir).ok().flatten().map(|s| s.cgroup_name).expect("the replica's spec");
        let ppid: i32 = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1).and_then(|p| p.parse().ok())))
            .expect("the program's parent");
        match backend.cpu() {
            CpuSupport::V1 { group, shares } => {
                assert_eq!(*shares, nice_weight(NICE));
                assert_eq!(fs::read_to_string(group.join("cpu.shares")).unwrap().trim(), nice_weight(NICE).to_string());
                // The project's share of the group, then the replica's within it.
                let share = group.join(format!("u{UID}"));
                assert_eq!(fs::read_to_string(share.join("cpu.shares")).unwrap().trim(), "1024", "projects share the group equally");
                let own = share.join(&name);
                let tasks = fs::read_to_string(own.join("tasks")).unwrap();
                assert!(tasks.lines().any(|t| t == pid.to_string()), "replica {n}: program {pid} is not in {}: {tasks:?}", own.display());
                assert_eq!(fs::read_to_string(own.join("cpu.shares")).unwrap().trim(), "1024", "a project's replicas share its share equally");
                assert!(cgroup_of(pid, "cpu").ends_with(&format!("/trainyard/u{UID}/{name}")), "{}", cgroup_of(pid, "cpu"));
                assert!(!cgroup_of(ppid, "cpu").contains("/trainyard"), "its shim is in the replicas' group: {}", cgroup_of(ppid, "cpu"));
                cpu_cgroups.push(own);
                cpu_cgroups.push(share);
            }
            CpuSupport::V2 { group, nice } => {
                assert_eq!(*nice, NICE);
                assert_eq!(fs::read_to_string(group.join("cpu.weight.nice")).unwrap().trim(), NICE.to_string());
                assert!(cgroup_of(pid, "").contains("/trainyard/"), "{}", cgroup_of(pid, ""));
                assert!(fs::read_to_string(group.join("cgroup.subtree_control")).unwrap().split_whitespace().any(|c| c == "cpu"));
            }
            CpuSupport::Unavailable { .. } => unreachable!(),
        }
        backend.kill(&dir).unwrap();
        while !matches!(next_event(&rx), BackendEvent::Exited { .. }) {}
    }
    for cg in cpu_cgroups {
        assert!(!cg.exists(), "{} is left after its replica ended", cg.display());
    }
}
