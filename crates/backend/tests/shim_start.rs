//! How the local backend starts a shim and the shim its program: the shim leads a session
//! of its own, and the program starts with no blocked and no ignored signal, whatever the
//! server ignores or blocks.

mod common;

use common::sink;

use std::ffi::OsString;
use std::time::Duration;

use trainyard_backend::shim::ShimSpec;
use trainyard_backend::{read_log, BackendEvent, CgroupSupport, LocalBackend};
use trainyard_core::{Outcome, RunId};

const DEADLINE: Duration = Duration::from_secs(60);


fn run_to_end(spec: ShimSpec) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run = RunId { job: 1, attempt: 0, replica: "workerpool0-0".into(), restart: 0 };
    let backend = LocalBackend::new(
        vec![OsString::from(env!("CARGO_BIN_EXE_trainyard-shim"))],
        CgroupSupport::Unavailable { reason: "not used by this test".into() },
    );
    let (sink, rx) = sink();
    backend.launch(run.clone(), &run_dir, spec, sink).unwrap();
    loop {
        match rx.recv_timeout(DEADLINE).expect("no event within the deadline") {
            BackendEvent::Started { .. } => {}
            BackendEvent::Exited { run: r, outcome, .. } => {
                assert_eq!(r, run);
                assert_eq!(outcome, Outcome::Exited { code: 0 });
                break;
            }
        }
    }
    let (entries, _) = read_log(&run_dir, 0).unwrap();
    entries.into_iter().filter(|e| e.stream == "stdout").map(|e| e.text).collect()
}

fn field<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(name).map(str::trim))
        .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
}

/// The shim leads its own session (it outlives the server, a Ctrl-C in the server's
/// terminal does not reach it, and it has no controlling terminal); its program has a
/// process group of its own in that session.
#[test]
fn the_shim_leads_a_session_and_the_program_its_own_group() {
    let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))];
    let script = "echo shim=$PPID; echo me=$$; \
                  echo shim_stat=$(cut -d' ' -f5,6 /proc/$PPID/stat); echo my_stat=$(cut -d' ' -f5,6 /proc/$$/stat)";
    let lines = run_to_end(ShimSpec::new(vec!["sh".into(), "-c".into(), script.into()], env));
    let shim = field(&lines, "shim=");
    let me = field(&lines, "me=");
    // Fields 5 and 6 of /proc/PID/stat: process group, session.
    assert_eq!(field(&lines, "shim_stat="), format!("{shim} {shim}"), "{lines:?}");
    assert_eq!(field(&lines, "my_stat="), format!("{me} {shim}"), "{lines:?}");
}

/// The program starts with no blocked signal and every disposition at its default, the
/// two that glibc keeps for itself (32 and 33) included, although this test process (as a
/// server may) ignores and blocks some.
#[test]
fn the_program_starts_with_no_blocked_or_ignored_signal() {
    // SAFETY: dispositions and the mask of this test's thread; SIG_IGN installs no code.
    unsafe {
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGUSR1, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))];
    // The program reads its own mask itself: a shell would block every signal around its
    // own forks, and its mask, read from a child, would say so.
    let argv = ["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"].map(String::from).to_vec();
    let lines = run_to_end(ShimSpec::new(argv, env));
    assert_eq!(field(&lines, "SigBlk:"), "0000000000000000", "{lines:?}");
    assert_eq!(field(&lines, "SigIgn:"), "0000000000000000", "{lines:?}");
}

/// A writable cgroup v2 hierarchy for this test: `<mount><own cgroup>/<name>`, made here,
/// and the path of `<own cgroup>/<name>` as /proc/self/cgroup shows it. `None` when the
/// host has no cgroup2 mount this process may create cgroups in.
fn v2_base(name: &str) -> Option<(std::path::PathBuf, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split(' ').next() == Some("cgroup2")).then(|| left.split(' ').nth(4).map(str::to_string)).flatten()
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim_end_matches('/').to_string();
    let rel = format!("{own}/{name}");
    let base = std::path::PathBuf::from(format!("{mount}{rel}"));
    std::fs::create_dir(&base).ok()?;
    Some((base, rel))
}

/// On cgroup v2 the program is created inside the replica's cgroup (clone3 with
/// CLONE_INTO_CGROUP, or a move where the kernel cannot): /proc/self/cgroup names it from
/// the program's first instruction on.
#[test]
fn on_cgroup_v2_the_program_runs_in_the_replica_cgroup() {
    let name = format!("trainyard-test-{}", std::process::id());
    let Some((base, rel)) = v2_base(&name) else {
        trainyard_backend::skip_test("no cgroup2 hierarchy that this process may create cgroups in");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run = RunId { job: 1, attempt: 0, replica: "workerpool0-0".into(), restart: 0 };
    let backend = LocalBackend::new(
        vec![OsString::from(env!("CARGO_BIN_EXE_trainyard-shim"))],
        CgroupSupport::V2 { base: base.clone() },
    );
    let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))];
    let (sink, rx) = sink();
    backend.launch(run.clone(), &run_dir, ShimSpec::new(vec!["cat".into(), "/proc/self/cgroup".into()], env), sink).unwrap();
    let outcome = loop {
        match rx.recv_timeout(DEADLINE).expect("no event within the deadline") {
            BackendEvent::Started { .. } => {}
            BackendEvent::Exited { outcome, .. } => break outcome,
        }
    };
    let (entries, _) = read_log(&run_dir, 0).unwrap();
    let lines: Vec<String> = entries.into_iter().filter(|e| e.stream == "stdout").map(|e| e.text).collect();
    // The replica's cgroup is gone with its shim; then the base.
    let removed = std::fs::remove_dir(&base);
    assert_eq!(outcome, Outcome::Exited { code: 0 }, "{lines:?}");
    let expected = format!("0::{rel}/j1-a0-workerpool0-0-r0-");
    assert!(lines.iter().any(|l| l.starts_with(&expected)), "{expected} not in {lines:?}");
    removed.unwrap();
}
