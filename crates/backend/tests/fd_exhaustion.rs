//! L16: a launch that finds the server's file descriptors exhausted is retryable and
//! leaves nothing half-started; the same launch tried later starts the run exactly once.
//!
//! `RLIMIT_NOFILE` is per process, so the launches with few descriptors run in child
//! processes: this test binary runs itself again (the same test, with an environment
//! variable) for each number of free descriptors from 0 to 12, which covers every step of
//! a launch that opens something (the lock probe, `spec.json`, the shim's stderr file,
//! the pipes and `/dev/null` of the spawn). Each child prints its result as JSON.

mod common;

use common::sink;

use std::ffi::OsString;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{BackendError, BackendEvent, CgroupSupport, LocalBackend};
use trainyard_core::{Outcome, RunId};

const CHILD_ENV: &str = "TRAINYARD_TEST_FD_EXHAUSTION_CHILD";
const TEST_NAME: &str = "l16_exhausted_file_descriptors_are_retryable_and_the_run_starts_once";
const MAX_FREE: usize = 12;
const DEADLINE: Duration = Duration::from_secs(60);

fn backend() -> LocalBackend {
    LocalBackend::new(
        vec![OsString::from(env!("CARGO_BIN_EXE_trainyard-shim"))],
        CgroupSupport::Unavailable { reason: "not used by this test".into() },
    )
}

fn run_id(free: usize) -> RunId {
    RunId { job: 16, attempt: 0, replica: format!("workerpool0-{free}"), restart: 0 }
}

/// The program counts its starts in `<ctl>/starts-<free>`.
fn spec(ctl: &Path, free: usize) -> ShimSpec {
    let script = format!("echo started >> '{}/starts-{free}'", ctl.display());
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    ShimSpec::new(vec!["sh".into(), "-c".into(), script], vec![("PATH".into(), path)])
}


fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

fn set_nofile_soft(soft: libc::rlim_t, hard: libc::rlim_t) {
    let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
    // SAFETY: setrlimit reads the struct we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "{}", std::io::Error::last_os_error());
}

/// In the child: leaves exactly `free` descriptors that can be opened, launches, restores
/// the limit, and prints the result.
fn child(spec_arg: &str) {
    let mut parts = spec_arg.splitn(3, '|');
    let free: usize = parts.next().unwrap().parse().unwrap();
    let ctl = PathBuf::from(parts.next().unwrap());
    let run_dir = PathBuf::from(parts.next().unwrap());
    let b = backend();
    let (s, _rx) = sink();
    let spec = spec(&ctl, free);
    let run = run_id(free);
    let original = nofile();

    // Every descriptor below `limit` in use, then `free` more allowed.
    let highest = fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::rlim_t>().ok())
        .max()
        .unwrap();
    let limit = highest + 1;
    set_nofile_soft(limit, original.rlim_max);
    let mut fillers = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => fillers.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
    }
    set_nofile_soft(limit + free as libc::rlim_t, original.rlim_max);
    let result = b.launch(run, &run_dir, spec, s);
    set_nofile_soft(original.rlim_cur, original.rlim_max);
    drop(fillers);

    let (retryable, exhausted) = match &result {
        Ok(()) => (false, false),
        Err(e) => (e.is_retryable(), matches!(e, BackendError::Exhausted { .. })),
    };
    let json = serde_json::json!({
        "free": free,
        "ok": result.is_ok(),
        "retryable": retryable,
        "exhausted": exhausted,
        "error": result.as_ref().err().map(|e| e.to_string()),
    });
    // On a line of its own: the test harness has printed "test NAME ... " without a newline.
    println!("\nRESULT {json}");
}

fn shim_processes_of(run_dir: &Path) -> usize {
    let needle = run_dir.to_string_lossy().into_owned();
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(&needle)
        })
        .count()
}

fn starts(ctl: &Path, free: usize) -> usize {
    fs::read_to_string(ctl.join(format!("starts-{free}"))).unwrap_or_default().lines().count()
}

/// L16 (and idempotent launches): with 0 to 12 file descriptors left, `launch` either
/// starts the run or fails with a retryable `Exhausted` error that leaves no shim and no
/// trace that would stop a later launch; launching again with descriptors to spare
/// starts every run exactly once (or adopts the one that did start).
#[test]
fn l16_exhausted_file_descriptors_are_retryable_and_the_run_starts_once() {
    if let Ok(arg) = std::env::var(CHILD_ENV) {
        child(&arg);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ctl = tmp.path().join("ctl");
    fs::create_dir_all(&ctl).unwrap();
    let me = std::env::current_exe().unwrap();
    let mut failed = Vec::new();
    let mut started = Vec::new();
    for free in 0..=MAX_FREE {
        let run_dir = tmp.path().join(format!("runs/16/0/workerpool0-{free}/0"));
        let out = Command::new(&me)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{free}|{}|{}", ctl.display(), run_dir.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| {
            panic!("child for {free} free descriptors printed no result ({}): {stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr))
        });
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        println!("{free} free descriptors: {r}");
        if r["ok"] == true {
            started.push((free, run_dir));
        } else {
            assert!(r["retryable"] == true && r["exhausted"] == true, "not retryable: {r}");
            let message = r["error"].as_str().unwrap();
            assert!(message.contains("file descriptors") && message.contains("Too many open files"), "{message}");
            failed.push((free, run_dir));
        }
    }
    assert!(!failed.is_empty() && failed[0].0 == 0, "no descriptor left must fail: {failed:?}");
    assert!(!started.is_empty(), "{MAX_FREE} descriptors must be enough to launch");

    // Nothing half-started: no shim, no pid file, no status, no start of the program.
    for (free, run_dir) in &failed {
        assert_eq!(shim_processes_of(run_dir), 0, "a shim runs for a failed launch ({free})");
        assert!(!run_dir.join(shim::PID_FILE).exists() && !run_dir.join(shim::STATUS_FILE).exists());
        assert!(!run_dir.join(shim::LOCK_FILE).exists(), "no shim ever took the run ({free})");
        assert_eq!(starts(&ctl, *free), 0);
    }

    // Later, with descriptors to spare: every run ends with the program's exit 0, started
    // once: the failed ones are launched now, the started ones are adopted.
    let b = backend();
    for (free, run_dir) in failed.iter().chain(&started) {
        let (s, rx) = sink();
        b.launch(run_id(*free), run_dir, spec(&ctl, *free), s).unwrap();
        let deadline = Instant::now() + DEADLINE;
        let outcome = loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(BackendEvent::Started { .. }) => {}
                Ok(BackendEvent::Exited { outcome, .. }) => break outcome,
                Err(e) => panic!("run {free}: no Exited: {e}"),
            }
        };
        assert_eq!(outcome, Outcome::Exited { code: 0 }, "run {free}");
        assert_eq!(starts(&ctl, *free), 1, "run {free} started once");
    }
    // And a launch of an ended run does not start it again.
    let (free, run_dir) = &failed[0];
    let (s, rx) = sink();
    b.launch(run_id(*free), run_dir, spec(&ctl, *free), s).unwrap();
    match rx.recv_timeout(DEADLINE) {
        Ok(BackendEvent::Started { .. }) | Ok(BackendEvent::Exited { outcome: Outcome::Exited { code: 0 }, .. }) => {}
        other => panic!("{other:?}"),
    }
    std::thread::sleep(Duration::from_millis(200));
    for (free, _) in failed.iter().chain(&started) {
        assert_eq!(starts(&ctl, *free), 1, "run {free} started once");
    }
}
