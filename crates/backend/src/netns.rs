//! Network namespaces of jobs (`[replicas] network = "job"`): each job gets a network
//! namespace of its own on this host, with only a loopback interface, shared by all its
//! replicas. They reach each other at the loopback addresses and ports of `CLUSTER_SPEC`
//! (L8) as with host networking, and nothing else: not the server's API, not another
//! job's ports, not the outside.
//!
//! A namespace is kept alive by a bind mount of its `/proc/thread-self/ns/net` on a file
//! (`<dir>/<job>`), as `ip netns` does: it outlives the thread that made it, the server
//! and the shims, so a restarted server and adopted replicas find it where it was. The
//! directory is bound on itself and made a private mount first, so that the namespace
//! mounts do not propagate into other mount namespaces (a replica's own, made for
//! `/gcs`), which would keep them busy after they are removed here.
//!
//! Linux only; needs `CAP_SYS_ADMIN` (a root server).

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetnsError {
    #[error("network namespace {path}: cannot {op}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("network namespace {path}: a thread to make it could not run: {message}")]
    Thread { path: PathBuf, message: String },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> NetnsError + 'a {
    move |source| NetnsError::Io { op, path: path.to_path_buf(), source }
}

fn nix_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::errno::Errno) -> NetnsError + 'a {
    move |e| NetnsError::Io { op, path: path.to_path_buf(), source: e.into() }
}

/// One namespace is made at a time: two launches of one job's replicas (a gang and a
/// venv build finishing) must not both make it.
static MAKING: Mutex<()> = Mutex::new(());

/// Makes `dir` (if needed) and, unless it already is one, a private mount bound on
/// itself. Idempotent; called once at the server's start.
pub fn prepare_dir(dir: &Path) -> Result<(), NetnsError> {
    fs::create_dir_all(dir).map_err(io_err("create the directory", dir))?;
    if !is_mount_point(dir).map_err(io_err("read /proc/self/mountinfo", dir))? {
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_err("bind the directory on itself", dir))?;
    }
    mount(None::<&str>, dir, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).map_err(nix_err("make the directory private", dir))?;
    Ok(())
}

/// Is `dir` a mount point (its path a mount's mount point in `/proc/self/mountinfo`)?
fn is_mount_point(dir: &Path) -> io::Result<bool> {
    let dir = fs::canonicalize(dir)?;
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let found = mount_points(&info).any(|m| Path::new(&m) == dir);
    Ok(found)
}

/// The mount points of a mountinfo text (field 5, octal escapes undone).
pub fn mount_points(info: &str) -> impl Iterator<Item = String> + '_ {
    info.lines().filter_map(|l| l.split(' ').nth(4)).map(crate::cgroup::unescape_mountinfo)
}

/// Is `path` a live namespace (a bind mount of the namespace file system)?
pub fn exists(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// The namespace at `path`, made now if it is not there: a new network namespace with
/// its loopback interface up, bound on `path`.
pub fn ensure(path: &Path) -> Result<(), NetnsError> {
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if exists(path) {
        return Ok(());
    }
    // A file left by a namespace that was removed, or a crash half-way: made afresh.
    fs::OpenOptions::new().write(true).create(true).truncate(false).open(path).map_err(io_err("create its file", path))?;
    // `unshare(CLONE_NEWNET)` moves the calling thread only; a thread of its own takes
    // the new namespace with it when it ends (the bind mount keeps the namespace).
    let target = path.to_path_buf();
    let made = std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || -> Result<(), NetnsError> {
            unshare(CloneFlags::CLONE_NEWNET).map_err(nix_err("unshare a network namespace", &target))?;
            loopback_up().map_err(io_err("bring its loopback interface up", &target))?;
            mount(Some("/proc/thread-self/ns/net"), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .map_err(nix_err("bind it on its file", &target))
        })
        .map_err(io_err("start a thread", path))?
        .join();
    match made {
        Ok(result) => result,
        Err(_) => Err(NetnsError::Thread { path: path.to_path_buf(), message: "it panicked".into() }),
    }
}

/// `ip link set lo up` in this thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket and two ioctls on a zeroed `ifreq` we own, named "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let sock = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Moves the calling thread (and the processes it starts from now on) into the namespace
/// at `path`.
pub fn enter(path: &Path) -> Result<(), NetnsError> {
    let file = fs::File::open(path).map_err(io_err("open", path))?;
    if !exists(path) {
        return Err(NetnsError::Io {
            op: "enter",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotFound, "no network namespace is bound there"),
        });
    }
    setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(nix_err("enter", path))
}

/// Removes the namespace at `path` (its bind mount, then its file): the namespace ends
/// when its last process does. Nothing there is no error.
pub fn remove(path: &Path) -> Result<(), NetnsError> {
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if exists(path) {
        umount2(path, MntFlags::MNT_DETACH).map_err(nix_err("unmount", path))?;
    }
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove its file", path)(e)),
    }
}

/// The job ids of the namespaces in `dir` (files named by a job id).
pub fn list(dir: &Path) -> Vec<u64> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_undo_octal_escapes() {
        let info = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 0:4 / /run/x rw - tmpfs tmpfs rw\n";
        let points: Vec<String> = mount_points(info).collect();
        assert_eq!(points, vec!["/mnt/with space".to_string(), "/run/x".to_string()]);
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A namespace made, entered by a thread that then sees only its loopback interface,
    /// made again idempotently, and removed.
    #[test]
    fn a_job_namespace_is_made_entered_and_removed() {
        if !is_root() && crate::skip_test("network namespaces need root") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let nsdir = dir.path().join("netns");
        prepare_dir(&nsdir).unwrap();
        prepare_dir(&nsdir).unwrap();
        let ns = nsdir.join("7");
        assert!(!exists(&ns));
        ensure(&ns).unwrap();
        assert!(exists(&ns));
        ensure(&ns).unwrap();
        assert_eq!(list(&nsdir), vec![7]);
        let p = ns.clone();
        let seen = std::thread::spawn(move || {
            enter(&p).unwrap();
            let dev = fs::read_to_string("/proc/thread-self/net/dev").unwrap();
            let names: Vec<String> = dev.lines().skip(2).filter_map(|l| Some(l.split(':').next()?.trim().to_string())).collect();
            // The loopback interface is up: a listener on it takes connections.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let c = std::net::TcpStream::connect(l.local_addr().unwrap());
            (names, c.is_ok())
        })
        .join()
        .unwrap();
        assert_eq!(seen.0, vec!["lo".to_string()]);
        assert!(seen.1, "loopback is not up");
        remove(&ns).unwrap();
        assert!(!exists(&ns) && !ns.exists());
        remove(&ns).unwrap();
        let _ = umount2(&nsdir, MntFlags::MNT_DETACH);
    }
}
