//! One server per data directory: an exclusive, non-blocking `flock` on
//! `<data_dir>/server.lock`, taken at start before the store is opened and held for the
//! life of the process. The file holds the pid of its holder, so that a second server can
//! say which process it is refused by. The kernel releases the lock when the process ends,
//! however it ends; the file itself stays. std opens files close-on-exec, so replicas,
//! shims and node agents never inherit the lock.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "server.lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "another Trainyard server (pid {}) is using the data directory {}; stop it first or use another --data-dir",
        pid.map(|p| p.to_string()).unwrap_or_else(|| "unknown".into()),
        dir.display()
    )]
    Busy { dir: PathBuf, pid: Option<u32> },
    #[error("cannot lock the data directory with {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The held lock; dropping it releases it.
pub struct DataDirLock {
    _lock: Flock<File>,
}

impl std::fmt::Debug for DataDirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataDirLock")
    }
}

impl DataDirLock {
    /// Take the lock without waiting and write this process's pid into it, or say which
    /// process holds it.
    pub fn take(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let io_err = |source: std::io::Error| LockError::Io { path: path.clone(), source };
        let file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).map_err(io_err)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                let mut f: &File = &lock;
                f.set_len(0).and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes())).map_err(io_err)?;
                Ok(DataDirLock { _lock: lock })
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                // The holder writes its pid right after taking the lock: give it a moment.
                let mut pid = None;
                for _ in 0..20 {
                    pid = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok());
                    if pid.is_some() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(LockError::Busy { dir: data_dir.to_owned(), pid })
            }
            Err((_, errno)) => Err(io_err(errno.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::take(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // A second open file description conflicts even within one process.
        let e = DataDirLock::take(dir.path()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        drop(first);
        let again = DataDirLock::take(dir.path()).unwrap();
        drop(again);
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = DataDirLock::take(&dir.path().join("absent")).unwrap_err();
        assert!(matches!(e, LockError::Io { .. }), "{e}");
        assert!(e.to_string().contains("server.lock"), "{e}");
    }
}
