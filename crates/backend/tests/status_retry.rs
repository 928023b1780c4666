//! L23 in the shim: an outcome that cannot be written is kept and written later, never
//! lost. The shim (the real binary, under the local backend) tries `status.json` again
//! with backoff while holding its lock, so the run stays "running" for the server until
//! the write succeeds; and a full disk drops log lines (counted, then noted) without
//! blocking or killing the program.

mod common;

use common::sink;

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use trainyard_backend::shim::{self, ShimSpec};
use trainyard_backend::{read_log, BackendEvent, CgroupSupport, LocalBackend};
use trainyard_core::{Outcome, RunId};

const DEADLINE: Duration = Duration::from_secs(60);

fn backend() -> LocalBackend {
    LocalBackend::new(
        vec![OsString::from(env!("CARGO_BIN_EXE_trainyard-shim"))],
        CgroupSupport::Unavailable { reason: "not used by this test".into() },
    )
}

fn run_id() -> RunId {
    RunId { job: 3, attempt: 0, replica: "workerpool0-0".into(), restart: 0 }
}


/// A program that prints a numbered line (padded to more than 300 bytes, so that a full
/// disk shows at once and not only after the log's last page filled up) every 10 ms until
/// `<ctl>/go` exists, then exits 7.
fn program(ctl: &Path) -> ShimSpec {
    let script = format!(
        "i=0; while [ ! -e '{}/go' ]; do i=$((i+1)); echo line $i {}; sleep 0.01; done; echo bye >&2; exit 7",
        ctl.display(),
        "x".repeat(300)
    );
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    ShimSpec::new(vec!["sh".into(), "-c".into(), script], vec![("PATH".into(), path)])
}

fn wait_started(rx: &Receiver<BackendEvent>) {
    match rx.recv_timeout(DEADLINE) {
        Ok(BackendEvent::Started { .. }) => {}
        other => panic!("expected Started, got {other:?}"),
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Is the shim of `run_dir` still alive? (its pid, from the pid file, names a live,
/// non-zombie process).
fn shim_alive(run_dir: &Path) -> bool {
    let Ok(pid) = fs::read_to_string(run_dir.join(shim::PID_FILE)) else { return false };
    let Ok(stat) = fs::read_to_string(format!("/proc/{}/stat", pid.trim())) else { return false };
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some(Some('Z' | 'X')) | None)
}

/// While the status cannot be written: no `Exited`, the shim alive (its lock held), and
/// no status file.
fn assert_outcome_held(rx: &Receiver<BackendEvent>, run_dir: &Path, for_how_long: Duration) {
    match rx.recv_timeout(for_how_long) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("no event while the status cannot be written, got {other:?}"),
    }
    assert!(shim_alive(run_dir), "the shim keeps the outcome, alive");
    assert!(shim::read_status(run_dir).map(|s| s.is_none()).unwrap_or(true));
}

fn wait_exited(rx: &Receiver<BackendEvent>, within: Duration) -> Outcome {
    match rx.recv_timeout(within) {
        Ok(BackendEvent::Exited { outcome, .. }) => outcome,
        other => panic!("expected Exited within {within:?}, got {other:?}"),
    }
}

/// L23: the shim cannot put `status.json` in place (here a directory squats its name, so
/// the rename fails whoever runs the test); it keeps the program's exit code, stays alive
/// holding its lock, says so on its stderr, and records the outcome as soon as it can:
/// the backend then reports the program's own exit, 7, not Lost.
#[test]
fn l23_a_status_that_cannot_be_written_is_kept_and_written_later() {
    let tmp = tempfile::tempdir().unwrap();
    let ctl = tmp.path().join("ctl");
    fs::create_dir_all(&ctl).unwrap();
    let dir = tmp.path().join("runs/3/0/workerpool0-0/0");
    let (s, rx) = sink();
    let b = backend();
    b.launch(run_id(), &dir, program(&ctl), s).unwrap();
    wait_started(&rx);

    let squatter = dir.join(shim::STATUS_FILE);
    fs::create_dir(&squatter).unwrap();
    File::create(ctl.join("go")).unwrap();
    assert_outcome_held(&rx, &dir, Duration::from_millis(1500));
    wait_for("the shim reports the failed write", || {
        fs::read_to_string(dir.join(shim::SHIM_STDERR_FILE)).unwrap_or_default().contains("the outcome is kept")
    });

    fs::remove_dir(&squatter).unwrap();
    // Backoff: after 1.5 s of failures the next try is at most 3.2 s away.
    assert_eq!(wait_exited(&rx, Duration::from_secs(10)), Outcome::Exited { code: 7 });
    let status = shim::read_status(&dir).unwrap().expect("status.json");
    assert_eq!(status.exit_code, Some(7));
    wait_for("the shim exits once the status is written", || !shim_alive(&dir));
    let stderr = fs::read_to_string(dir.join(shim::SHIM_STDERR_FILE)).unwrap();
    assert!(stderr.contains("after") && stderr.contains("failed tries"), "{stderr}");
}

/// A 1 MiB tmpfs, unmounted when dropped.
struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    fn mount(path: PathBuf) -> io::Result<SmallDisk> {
        fs::create_dir_all(&path)?;
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&path).status()?;
        if !status.success() {
            return Err(io::Error::other(format!("mount -t tmpfs: {status}")));
        }
        Ok(SmallDisk { path })
    }

    /// Fills the disk: writes until ENOSPC.
    fn fill(&self) -> PathBuf {
        let filler = self.path.join("filler");
        let mut f = File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// L23 and L22 on a full disk (a real one: a 1 MiB tmpfs, when the test runs as root and
/// may mount; otherwise the run directory is made read-only, which stops the status the
/// same way for a user that is not root). The program keeps running while its output
/// cannot be written (lines are dropped and counted, the pipes drained), its exit is kept
/// while the status cannot be written, and once there is space again the log gets a note
/// with the number of dropped lines and the backend reports exit 7.
#[test]
fn l23_a_full_disk_keeps_the_outcome_and_the_program_running() {
    let tmp = tempfile::tempdir().unwrap();
    let ctl = tmp.path().join("ctl");
    fs::create_dir_all(&ctl).unwrap();
    // SAFETY: geteuid has no effects.
    let root = unsafe { libc::geteuid() } == 0;
    let disk = if root {
        match SmallDisk::mount(tmp.path().join("disk")) {
            Ok(d) => Some(d),
            Err(e) => {
                trainyard_backend::skip_test(&format!("running as root, cannot mount a tmpfs: {e}"));
                return;
            }
        }
    } else {
        println!("not root: the run directory is made read-only instead of filling a disk");
        None
    };
    let base = disk.as_ref().map(|d| d.path.clone()).unwrap_or_else(|| tmp.path().join("disk"));
    let dir = base.join("runs/3/0/workerpool0-0/0");
    let (s, rx) = sink();
    let b = backend();
    b.launch(run_id(), &dir, program(&ctl), s).unwrap();
    wait_started(&rx);
    wait_for("the first output line", || read_log(&dir, 0).unwrap().0.iter().any(|e| e.text.starts_with("line 1 ")));

    let filler = match &disk {
        Some(d) => {
            let filler = d.fill();
            // The program goes on printing into a full disk: it must not block or die.
            std::thread::sleep(Duration::from_millis(500));
            Some(filler)
        }
        None => {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).unwrap();
            None
        }
    };
    File::create(ctl.join("go")).unwrap();
    assert_outcome_held(&rx, &dir, Duration::from_millis(1500));

    match &filler {
        Some(f) => fs::remove_file(f).unwrap(),
        None => fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap(),
    }
    assert_eq!(wait_exited(&rx, Duration::from_secs(10)), Outcome::Exited { code: 7 });
    assert_eq!(shim::read_status(&dir).unwrap().and_then(|s| s.exit_code), Some(7));

    if disk.is_some() {
        let (entries, _) = read_log(&dir, 0).unwrap();
        let notes: Vec<&str> = entries
            .iter()
            .filter(|e| e.stream == "stderr" && e.text.contains("of output could not be written to the log"))
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(notes.len(), 1, "one note about the dropped lines: {notes:?}");
        assert!(notes[0].contains("No space left on device"), "{}", notes[0]);
        let dropped: u64 = notes[0]
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a count in {:?}", notes[0]));
        assert!(dropped >= 10, "about 50 lines were printed into the full disk, {dropped} dropped");
        // Every entry in the file is whole (no torn line swallowed a neighbour), and the
        // lines before the disk filled up are there.
        let text = fs::read_to_string(dir.join(trainyard_backend::log::LOG_FILE)).unwrap();
        let whole = text.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()).count();
        assert_eq!(whole, entries.len());
        assert!(entries.iter().any(|e| e.text.starts_with("line 1 ")));
    }
    wait_for("the shim exits once the status is written", || !shim_alive(&dir));
    drop(b);
    drop(disk);
}
