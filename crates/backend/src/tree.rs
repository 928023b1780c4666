//! Removing a directory tree that a tenant's program may have shaped: without recursion
//! (a chain of 20,000 nested directories made by a job must not overflow a thread's
//! stack, as `std::fs::remove_dir_all` does), with a bounded number of open file
//! descriptors whatever the depth, and without ever following a link: every step is
//! `openat`/`unlinkat` relative to a directory opened with `O_NOFOLLOW`, so a link
//! swapped in for a directory is removed as a link, never entered.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Directories kept open below the deepest level while descending; above them only every
/// `CHECKPOINT`th level stays open (at most `CHECKPOINTS` of them), and a closed level is
/// opened again, with the levels between, from the nearest open one when the removal
/// comes back up to it: the descriptors held stay bounded (a few hundred) and each level
/// is opened a bounded number of times, whatever the depth.
const OPEN_LEVELS: usize = 64;
const CHECKPOINT: usize = 128;
const CHECKPOINTS: usize = 256;

/// How a removal failed: the path (as far as it was walked) and the system's error.
#[derive(Debug, thiserror::Error)]
#[error("cannot remove {}: {source}", path.display())]
pub struct RemoveError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What a removal did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Files, links, FIFOs, sockets and devices unlinked.
    pub entries: u64,
    /// Directories removed, `path` itself included.
    pub dirs: u64,
    /// The deepest level reached below `path`.
    pub depth: usize,
}

/// Removes `path` and everything below it. A missing `path` is fine; a `path` that is not
/// a directory (a file, a link) is unlinked. Never recurses, never follows a link.
/// The nice value of threads that work through a tenant's files (a purge, a scan, a
/// walk): the default of replicas' programs (`[replicas] nice`), so that a tenant who
/// makes such work for the server slows its own work, not the control plane's.
pub const TENANT_WORK_NICE: i32 = 10;

/// Lower the calling thread's priority to [`TENANT_WORK_NICE`] (Linux nice values are
/// per thread); best effort.
pub fn tenant_priority() {
    // SAFETY: gettid and setpriority on this thread; no memory is passed.
    unsafe {
        let tid = nix::libc::syscall(nix::libc::SYS_gettid) as nix::libc::id_t;
        nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid, TENANT_WORK_NICE);
    }
}

/// Give the calling thread (at [`tenant_priority`]) a file descriptor table of its own,
/// holding only the standard streams (`unshare(CLONE_FILES)`, then `close_range(3, ~0)` on
/// that private copy), for a thread that opens directories of a tenant's tree (a purge, a
/// scan, a walk).
///
/// Why: a process the server forks (a shim) gets a copy of the server's descriptors until
/// its exec closes them. A directory the purge opened, unlinked and closed meanwhile then
/// has that copy as its last reference, and the exec of the shim frees the directory's
/// blocks (on a filesystem mounted with `discard`, a synchronous discard per block): a
/// tenant's 20,000-level tree made another project's replica take 12 s to start. With the
/// purge's descriptors in a table of the purge thread's own, no fork copies them. The
/// other threads' descriptors are not touched (the copies made by the unshare are closed
/// in the private table only).
///
/// The contract: such a thread never closes a descriptor of the shared table, so it
/// never holds the last reference to anything that owns one (a backend with its fork
/// server's socket): there its close would miss (EBADF, which aborts a debug build, or a
/// file of its own), and the shared descriptor would stay open for good.
pub fn private_descriptors() -> std::io::Result<()> {
    tenant_priority();
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES).map_err(std::io::Error::from)?;
    // SAFETY: close_range on this thread's own (now private) table; no Rust object of
    // this thread owns a descriptor above 2 at this point (the caller's contract).
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn remove_tree(path: &Path) -> Result<Removed, RemoveError> {
    let err = |p: &Path, e: Errno| RemoveError { path: p.to_path_buf(), source: std::io::Error::from(e) };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        return Err(err(path, Errno::EINVAL));
    };
    let base = match nix::fcntl::open(parent, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(Removed::default()),
        Err(e) => return Err(err(parent, e)),
    };
    remove_at(base, name, path, Only::Everything)
}

/// Removes the directory `name` of `parent` when it holds nothing but directories (empty,
/// or nested empty ones, as jobs leave `model/`, `checkpoints/`, `logs/`): `ENOTEMPTY`
/// as soon as anything else is met (what was removed before stays removed: only empty
/// directories). Never recurses, never follows a link.
pub fn remove_empty_dirs_at(parent: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> Result<Removed, RemoveError> {
    let base = parent.try_clone_to_owned().map_err(|e| RemoveError { path: shown.to_path_buf(), source: e })?;
    remove_at(base, name, shown, Only::EmptyDirs)
}

/// What a removal may remove.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Only {
    Everything,
    EmptyDirs,
}

fn remove_at(base: OwnedFd, name: &OsStr, path: &Path, only: Only) -> Result<Removed, RemoveError> {
    let err = |p: &Path, e: Errno| RemoveError { path: p.to_path_buf(), source: std::io::Error::from(e) };
    let mut removed = Removed::default();
    match kind(base.as_fd(), name) {
        Ok(Some(true)) => {}
        Ok(Some(false)) if only == Only::EmptyDirs => return Err(err(path, Errno::ENOTDIR)),
        Ok(Some(false)) => {
            return match unlink_in(base.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {
                    removed.entries += 1;
                    Ok(removed)
                }
                Err(e) => Err(err(path, e)),
            };
        }
        Ok(None) => return Ok(removed),
        Err(e) => return Err(err(path, e)),
    }
    let mut walk = Walk { base, root: path.to_path_buf(), levels: vec![Level { name: name.to_os_string(), fd: None }], only };
    while !walk.levels.is_empty() {
        let top = walk.levels.len() - 1;
        match walk.open(top) {
            Ok(()) => {}
            // Gone meanwhile, or replaced by something that is not a directory (which
            // `up` unlinks as such).
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {
                walk.up(&mut removed).map_err(|e| err(&walk.path(), e))?;
                continue;
            }
            Err(e) => return Err(err(&walk.path(), e)),
        }
        let found = match walk.fd(top) {
            Ok(fd) => first_subdir_after_unlinking_the_rest(fd, &mut removed, only),
            Err(e) => Err(e),
        };
        #[cfg(test)]
        OPENS.with(|c| c.set((c.get().0, c.get().1.max(walk.levels.iter().filter(|l| l.fd.is_some()).count()))));
        match found {
            Ok(Some(sub)) => {
                walk.levels.push(Level { name: sub, fd: None });
                removed.depth = removed.depth.max(walk.levels.len() - 1);
                // Keep the last OPEN_LEVELS levels open, and checkpoints above them.
                if walk.levels.len() > OPEN_LEVELS {
                    let i = walk.levels.len() - OPEN_LEVELS - 1;
                    if i % CHECKPOINT != 0 || i / CHECKPOINT > CHECKPOINTS {
                        walk.levels[i].fd = None;
                    }
                }
            }
            Ok(None) => walk.up(&mut removed).map_err(|e| err(&walk.path(), e))?,
            Err(e) => return Err(err(&walk.path(), e)),
        }
    }
    Ok(removed)
}

struct Level {
    name: OsString,
    fd: Option<OwnedFd>,
}

struct Walk {
    /// The directory that holds the root.
    base: OwnedFd,
    only: Only,
    root: PathBuf,
    levels: Vec<Level>,
}

impl Walk {
    /// The path of the deepest level, for messages.
    fn path(&self) -> PathBuf {
        let mut p = self.root.clone();
        for l in self.levels.iter().skip(1) {
            p.push(&l.name);
        }
        p
    }

    /// Opens level `i` if it is not (from the nearest open level above it, each step
    /// `O_NOFOLLOW`).
    fn open(&mut self, i: usize) -> Result<(), Errno> {
        if self.levels[i].fd.is_some() {
            return Ok(());
        }
        // Every level between the nearest open one and `i` is opened and kept: the walk
        // comes back up through them next.
        let start = (0..i).rev().find(|&j| self.levels[j].fd.is_some());
        for k in start.map_or(0, |j| j + 1)..=i {
            let fd = {
                let parent = match k.checked_sub(1) {
                    Some(up) => self.levels[up].fd.as_ref().map(|f| f.as_fd()).ok_or(Errno::EBADF)?,
                    None => self.base.as_fd(),
                };
                open_dir(parent, &self.levels[k].name)?
            };
            self.levels[k].fd = Some(fd);
        }
        Ok(())
    }

    /// Level `i`, opened.
    fn fd(&mut self, i: usize) -> Result<BorrowedFd<'_>, Errno> {
        self.open(i)?;
        self.levels[i].fd.as_ref().map(|f| f.as_fd()).ok_or(Errno::EBADF)
    }

    /// The deepest level is empty: remove it from its parent and go up.
    fn up(&mut self, removed: &mut Removed) -> Result<(), Errno> {
        let Some(level) = self.levels.pop() else { return Ok(()) };
        drop(level.fd);
        if let Some(n) = self.levels.len().checked_sub(1) {
            self.open(n)?;
        }
        let parent = match self.levels.last() {
            Some(l) => l.fd.as_ref().map(|f| f.as_fd()).ok_or(Errno::EBADF)?,
            None => self.base.as_fd(),
        };
        let again = match unlink_in(parent, level.name.as_os_str(), UnlinkatFlags::RemoveDir) {
            Ok(()) => {
                removed.dirs += 1;
                false
            }
            Err(Errno::ENOENT) => false,
            // Something was added meanwhile: the directory is walked again.
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => true,
            // Replaced by a file or a link meanwhile: unlinked as such (when files may be).
            Err(Errno::ENOTDIR) if self.only == Only::EmptyDirs => return Err(Errno::ENOTEMPTY),
            Err(Errno::ENOTDIR) => match unlink_in(parent, level.name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {
                    removed.entries += 1;
                    false
                }
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        };
        if again {
            self.levels.push(Level { name: level.name, fd: None });
        }
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    /// Directories opened by the walk on this thread, and the most held at once.
    static OPENS: std::cell::Cell<(u64, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// The thread's file-system identity (`setfsuid`/`setfsgid`, per thread on Linux) set to
/// a directory's owner until dropped, when the thread runs as root.
struct AsOwner;

impl AsOwner {
    fn of(dir: BorrowedFd<'_>) -> Option<AsOwner> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let st = nix::sys::stat::fstat(dir).ok()?;
        if st.st_uid == 0 {
            return None;
        }
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(st.st_gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(st.st_uid));
        Some(AsOwner)
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
    }
}

/// Unlinks `name` of `dir` with the rights of `dir`'s owner: a root server removes what
/// is in a tenant's directory as that tenant (a bug that led the walk astray could not
/// remove anything the tenant could not). A directory its owner made unwritable
/// (`chmod 500`) is given back its owner's write bit first, as its owner.
fn unlink_in(dir: BorrowedFd<'_>, name: &OsStr, flags: UnlinkatFlags) -> Result<(), Errno> {
    let owner = AsOwner::of(dir);
    match unlinkat(dir, name, flags) {
        Err(Errno::EACCES | Errno::EPERM) if owner.is_some() => {
            nix::sys::stat::fchmod(dir, Mode::S_IRWXU)?;
            unlinkat(dir, name, flags)
        }
        r => r,
    }
}

fn open_dir(parent: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    #[cfg(test)]
    OPENS.with(|c| c.set((c.get().0 + 1, c.get().1)));
    openat(parent, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

/// `Some(true)` a directory (not a link to one), `Some(false)` anything else, `None` gone.
fn kind(parent: BorrowedFd<'_>, name: &OsStr) -> Result<Option<bool>, Errno> {
    match fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Unlinks every entry of `dir` that is not a directory, until it meets a directory: its
/// name (to descend into), or `None` when `dir` holds nothing more.
fn first_subdir_after_unlinking_the_rest(dir: BorrowedFd<'_>, removed: &mut Removed, only: Only) -> Result<Option<OsString>, Errno> {
    // A fresh descriptor for reading, so that the walk's own stays at its position.
    let fd = openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut entries = Dir::from_fd(fd)?;
    for entry in entries.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            Some(Type::Directory) => true,
            Some(_) => false,
            None => kind(dir, name)?.unwrap_or(false),
        };
        if is_dir {
            return Ok(Some(name.to_os_string()));
        }
        if only == Only::EmptyDirs {
            return Err(Errno::ENOTEMPTY);
        }
        match unlink_in(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => removed.entries += 1,
            Err(Errno::ENOENT) => {}
            // A directory after all (d_type lied, or it was swapped in): descend.
            Err(Errno::EISDIR) => return Ok(Some(name.to_os_string())),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn is_open(fd: i32) -> bool {
        // SAFETY: F_GETFD on a number; no memory is passed.
        unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) >= 0 }
    }

    /// A thread with a table of its own sees none of the process's descriptors (past the
    /// standard streams), and the process never sees what it opens; the other threads'
    /// descriptors stay open.
    #[test]
    fn a_private_descriptor_table_shares_nothing_with_the_process() {
        use std::os::fd::AsRawFd;
        let tmp = tempfile::tempdir().unwrap();
        let shared = std::fs::File::open(tmp.path()).unwrap();
        let fd = shared.as_raw_fd();
        let mine = tmp.path().join("mine");
        std::fs::write(&mine, b"x").unwrap();
        let ino = |fd: i32| nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok().map(|st| st.st_ino);
        let path = mine.clone();
        let (seen, opened) = std::thread::spawn(move || {
            private_descriptors().unwrap();
            let seen = is_open(fd);
            let f = std::fs::File::open(&path).unwrap();
            let n = f.as_raw_fd();
            std::mem::forget(f);
            (seen, n)
        })
        .join()
        .unwrap();
        assert!(!seen, "the process's descriptor {fd} is in the private table");
        assert!(is_open(fd), "the process's own descriptor was closed");
        let mine_ino = std::fs::metadata(&mine).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok();
        assert_ne!(ino(opened), mine_ino, "what the thread opened ({opened}) is in the process's table");
    }

    /// A root walk empties a tenant's directory as the tenant: one its owner made
    /// unwritable (`chmod 500`, `chmod 000` below it) is given its owner's rights back
    /// and removed all the same.
    #[test]
    fn a_tenants_directories_are_emptied_as_the_tenant_even_when_locked() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("run");
        std::fs::create_dir_all(top.join("work/locked/deeper")).unwrap();
        std::fs::write(top.join("work/locked/deeper/f"), b"x").unwrap();
        std::fs::write(top.join("work/locked/g"), b"x").unwrap();
        let tenant = (nix::unistd::Uid::from_raw(300_777), nix::unistd::Gid::from_raw(300_777));
        for p in ["work", "work/locked", "work/locked/deeper", "work/locked/deeper/f", "work/locked/g"] {
            nix::unistd::chown(&top.join(p), Some(tenant.0), Some(tenant.1)).unwrap();
        }
        let mode = |p: &str, m: u32| std::fs::set_permissions(top.join(p), std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
        mode("work/locked/deeper", 0o000);
        mode("work/locked", 0o500);
        let removed = remove_tree(&top).unwrap();
        assert!(!top.exists(), "{removed:?}");
        // The thread is root again afterwards.
        std::fs::write(tmp.path().join("after"), b"root").unwrap();
        assert_eq!(std::fs::metadata(tmp.path().join("after")).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap(), 0);
    }

    #[test]
    fn removes_a_tree_of_files_links_and_fifos_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), b"x").unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/f"), b"1").unwrap();
        std::fs::write(root.join("a/b/c/g"), b"2").unwrap();
        symlink(&outside, root.join("a/link-to-outside")).unwrap();
        symlink(outside.join("keep.txt"), root.join("a/b/file-link")).unwrap();
        nix::unistd::mkfifo(&root.join("a/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let r = remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert!(outside.join("keep.txt").exists(), "a link was followed");
        assert_eq!(r.dirs, 4);
        assert_eq!(r.entries, 5);
    }

    /// 5,000 nested levels: removed on a 64 KiB stack, each level opened a bounded number
    /// of times (no quadratic walk from the top), the descriptors held bounded.
    #[test]
    fn a_tree_deeper_than_any_stack_is_removed_with_few_descriptors() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("deep");
        std::fs::create_dir(&root).unwrap();
        // 5,000 levels made by openat, as a job's program would (paths that long cannot
        // be named from the top).
        let mut fd = nix::fcntl::open(&root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..5000 {
            nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o700)).unwrap();
            fd = openat(&fd, "d", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
            let f = openat(&fd, "f", OFlag::O_CREAT | OFlag::O_WRONLY, Mode::from_bits_truncate(0o600)).unwrap();
            drop(f);
        }
        drop(fd);
        // On a small stack: std::fs::remove_dir_all overflows a 64 KiB thread here.
        let root2 = root.clone();
        let (r, (opens, held)) = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || (remove_tree(&root2), OPENS.with(|c| c.get())))
            .unwrap()
            .join()
            .unwrap();
        let r = r.unwrap();
        assert!(!root.exists());
        assert!(opens < 3 * 5000, "{opens} opens for 5,000 levels");
        assert!(held <= OPEN_LEVELS + CHECKPOINT + 5000 / CHECKPOINT + 2, "{held} directories held open at once");
        assert_eq!(r.depth, 5000);
        assert_eq!(r.dirs, 5001);
        assert_eq!(r.entries, 5000);
    }

    #[test]
    fn only_empty_directories_are_removed_when_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = nix::fcntl::open(tmp.path(), OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        std::fs::create_dir_all(tmp.path().join("empty/model/a")).unwrap();
        std::fs::create_dir_all(tmp.path().join("empty/logs")).unwrap();
        let r = remove_empty_dirs_at(dir.as_fd(), OsStr::new("empty"), &tmp.path().join("empty")).unwrap();
        assert_eq!((r.dirs, r.entries), (4, 0));
        assert!(!tmp.path().join("empty").exists());
        std::fs::create_dir_all(tmp.path().join("full/model")).unwrap();
        std::fs::write(tmp.path().join("full/model/w.bin"), b"w").unwrap();
        let e = remove_empty_dirs_at(dir.as_fd(), OsStr::new("full"), &tmp.path().join("full")).unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
        assert!(tmp.path().join("full/model/w.bin").exists(), "a file is never removed");
    }

    #[test]
    fn a_missing_path_is_fine_and_a_file_or_link_is_unlinked() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(remove_tree(&tmp.path().join("nothing")).unwrap(), Removed::default());
        let f = tmp.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(remove_tree(&f).unwrap().entries, 1);
        let target = tmp.path().join("dir");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("kept"), b"x").unwrap();
        symlink(&target, tmp.path().join("link")).unwrap();
        remove_tree(&tmp.path().join("link")).unwrap();
        assert!(target.join("kept").exists(), "the link's target is not removed");
    }
}
