//! Virtual nodes on this host have an agent: a small process (`trainyard node-agent`) that
//! holds an exclusive lock on `<data_dir>/nodes/<node>.lock` for as long as the node is up,
//! like a node's kubelet or slurmd. The server watches the lock from a thread; when the
//! agent dies (killed, crashed), the lock is released and the node is lost (L9): its
//! replicas are restarted on other nodes. Agents outlive a server restart, like shims.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn lock_path(data_dir: &Path, node: &str) -> PathBuf {
    data_dir.join("nodes").join(format!("{node}.lock"))
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)
}

/// Whether some process holds the lock exclusively (a live agent).
fn held(path: &Path) -> std::io::Result<bool> {
    let f = open(path)?;
    // SAFETY: flock on a file descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if r == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        return Ok(false);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(true)
    } else {
        Err(e)
    }
}

/// Make sure the node's agent runs (start it if not), then call `on_loss` from a thread
/// when the agent goes away.
pub fn ensure_and_watch(
    data_dir: &Path,
    node: &str,
    agent_command: &[OsString],
    on_loss: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let path = lock_path(data_dir, node);
    if !held(&path)? {
        let (program, args) = agent_command
            .split_first()
            .ok_or_else(|| std::io::Error::other("no node agent command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args).arg(&path).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: setsid is async-signal-safe; the agent leaves the server's session.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !held(&path)? {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(std::io::Error::other(format!("the node agent of {node} exited at start ({status})")));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!("the node agent of {node} did not take its lock")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Reap it when it ends, so that it does not linger as a zombie of this server.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
    }
    let f = open(&path)?;
    std::thread::Builder::new().name(format!("node-{node}")).spawn(move || {
        // Blocks for as long as the agent holds its exclusive lock.
        // SAFETY: flock on a file descriptor owned by this thread.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) };
        if r == 0 {
            // SAFETY: as above.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
            on_loss();
        }
    })?;
    Ok(())
}

/// `trainyard node-agent LOCK`: hold the node's lock until killed.
pub fn agent_main(lock: &Path) -> i32 {
    let f = match open(lock) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("node-agent: {}: {e}", lock.display());
            return 1;
        }
    };
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("node-agent: {} is held by another agent", lock.display());
        return 75;
    }
    loop {
        // SAFETY: pause(2) only waits for a signal.
        unsafe { libc::pause() };
    }
}
