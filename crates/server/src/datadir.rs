//! One server per data directory: an exclusive, non-blocking `flock` on
//! `<data_dir>/server.lock`, taken at start before the store is opened and held for the
//! life of the process. The file holds the pid of its holder, so that a second server can
//! say which process it is refused by. The kernel releases the lock when the process ends,
//! however it ends; the file itself stays. std opens files close-on-exec, so replicas,
//! shims and node agents never inherit the lock.
//!
//! The data directory holds job specs (with their environment values), logs and the
//! database: it is created with mode 0700 (an existing one is tightened to it), and
//! `serve` and `local-run` set the umask to 077 before anything is created
//! ([`set_private_umask`]), so that every file the server, its shims and node agents
//! create below it is readable by the server's user only.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use trainyard_core::RunId;
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

/// The umask of `serve` and `local-run`: files and directories they (and the processes they
/// start, which inherit it) create are for this user only (0600, 0700).
pub const PRIVATE_UMASK: u32 = 0o077;

/// Set the process umask to [`PRIVATE_UMASK`]; call before anything is created. Returns the
/// previous umask.
pub fn set_private_umask() -> nix::sys::stat::Mode {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(PRIVATE_UMASK as nix::libc::mode_t))
}

/// Marks every descriptor above 2 that the process inherited (from a shell, a supervisor,
/// a test harness) close-on-exec, so that none reaches a shim, a replica, a build or an
/// engine the server starts. Descriptors the server opens itself are close-on-exec
/// already. Returns how many were marked.
pub fn cloexec_inherited_fds() -> usize {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    let fds: Vec<i32> = entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).filter(|&fd| fd > 2).collect();
    let mut marked = 0;
    for fd in fds {
        // SAFETY: the descriptor is only looked at and flagged, never closed or taken.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        // Not when closed meanwhile (the directory's own descriptor) or already marked.
        let unmarked = fcntl(borrowed, FcntlArg::F_GETFD).is_ok_and(|flags| flags & FdFlag::FD_CLOEXEC.bits() == 0);
        if unmarked && fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).is_ok() {
            marked += 1;
        }
    }
    marked
}

/// Create `dir` (and its missing parents) with mode 0700; an existing directory that other
/// users may enter or read is tightened to 0700. Returns the mode it had when it was
/// tightened.
pub fn create_private_dir(dir: &Path) -> std::io::Result<Option<u32>> {
    create_private_dir_allowing(dir, 0)
}

/// As [`create_private_dir`], but the bits of `allowed` (the search bits 0o011 when
/// replicas run as per-project users, see `identity`) are left where they are set.
pub fn create_private_dir_allowing(dir: &Path, allowed: u32) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o077 & !allowed == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & (0o7700 | allowed)))?;
    Ok(Some(mode))
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
        DataDirLock::take_as(data_dir, false)
    }

    /// The lock shared with the other servers of one PostgreSQL store (whose lease says
    /// which one leads), and refused while a server of another store holds it alone.
    pub fn take_shared(data_dir: &Path) -> Result<DataDirLock, LockError> {
        DataDirLock::take_as(data_dir, true)
    }

    fn take_as(data_dir: &Path, shared: bool) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let io_err = |source: std::io::Error| LockError::Io { path: path.clone(), source };
        let file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).map_err(io_err)?;
        let how = if shared { FlockArg::LockSharedNonblock } else { FlockArg::LockExclusiveNonblock };
        match Flock::lock(file, how) {
            Ok(lock) => {
                if !shared {
                    let mut f: &File = &lock;
                    f.set_len(0).and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes())).map_err(io_err)?;
                }
                Ok(DataDirLock { _lock: lock })
            }
            Err((_, Errno::EWOULDBLOCK)) => Err(busy(data_dir)),
            Err((_, errno)) => Err(io_err(errno.into())),
        }
    }

    /// Whether a server could take the lock now (`shared`: as a server of a PostgreSQL
    /// store), without taking it: `Busy` with the holder's pid when another server holds
    /// it. Nothing is created or written (`doctor` asks this of a directory it only looks
    /// at); a directory without a lock file is free.
    pub fn probe(data_dir: &Path, shared: bool) -> Result<(), LockError> {
        let path = data_dir.join(LOCK_FILE);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(LockError::Io { path, source }),
        };
        let how = if shared { FlockArg::LockSharedNonblock } else { FlockArg::LockExclusiveNonblock };
        match Flock::lock(file, how) {
            Ok(_released_on_drop) => Ok(()),
            Err((_, Errno::EWOULDBLOCK)) => Err(busy(data_dir)),
            Err((_, errno)) => Err(LockError::Io { path, source: errno.into() }),
        }
    }
}

/// The lock of `data_dir` is held: by the pid its file names (the holder writes it right
/// after taking the lock: it is given a moment).
fn busy(data_dir: &Path) -> LockError {
    let path = data_dir.join(LOCK_FILE);
    let mut pid = None;
    for _ in 0..20 {
        pid = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok());
        if pid.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    LockError::Busy { dir: data_dir.to_owned(), pid }
}

/// `<data_dir>/runs/<job>/<attempt>/<replica>/<restart>`.
pub fn run_dir(data_dir: &Path, run: &RunId) -> PathBuf {
    data_dir
        .join("runs")
        .join(run.job.to_string())
        .join(run.attempt.to_string())
        .join(&run.replica)
        .join(run.restart.to_string())
}


/// Every run directory of a job: `<data_dir>/runs/<job>/<attempt>/<replica>/<restart>`.
pub fn runs_on_disk(data_dir: &Path, job: u64) -> Vec<(RunId, PathBuf)> {
    let mut out = Vec::new();
    let dirs = |p: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (attempt, a) in dirs(&data_dir.join("runs").join(job.to_string())) {
        let Ok(attempt) = attempt.parse::<u32>() else { continue };
        for (replica, r) in dirs(&a) {
            for (restart, dir) in dirs(&r) {
                let Ok(restart) = restart.parse::<u32>() else { continue };
                out.push((RunId { job, attempt, replica: replica.clone(), restart }, dir));
            }
        }
    }
    out
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
        // A probe (doctor's) says the same and changes nothing.
        let e = DataDirLock::probe(dir.path(), false).unwrap_err();
        assert!(matches!(e, LockError::Busy { pid: Some(p), .. } if p == std::process::id()), "{e}");
        assert!(DataDirLock::probe(dir.path(), true).is_err(), "a shared lock is refused beside an exclusive one");
        drop(first);
        DataDirLock::probe(dir.path(), false).unwrap();
        let again = DataDirLock::take(dir.path()).unwrap();
        drop(again);
        // Servers of one PostgreSQL store share it: a probe for another of them passes.
        let shared = DataDirLock::take_shared(dir.path()).unwrap();
        DataDirLock::probe(dir.path(), true).unwrap();
        assert!(DataDirLock::probe(dir.path(), false).is_err());
        drop(shared);
        // No lock file: free, and none is made.
        let empty = tempfile::tempdir().unwrap();
        DataDirLock::probe(empty.path(), false).unwrap();
        assert!(!empty.path().join(LOCK_FILE).exists());
    }

    #[test]
    fn the_data_directory_is_private_and_an_open_one_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a/b/data");
        assert_eq!(create_private_dir(&data).unwrap(), None);
        assert_eq!(mode(&data), 0o700);
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(create_private_dir(&data).unwrap(), Some(0o755));
        assert_eq!(mode(&data), 0o700);
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = DataDirLock::take(&dir.path().join("absent")).unwrap_err();
        assert!(matches!(e, LockError::Io { .. }), "{e}");
        assert!(e.to_string().contains("server.lock"), "{e}");
    }
}
