//! Paths a job names, confined to a root the server may use, and the server's own file
//! work under them done without following symbolic links.
//!
//! A job's `gs://BUCKET/X` is `X` of `BUCKET` in its project's namespace of the storage
//! root, `<storage_root>/<project>/BUCKET/X`; a local path (`/abs`, `file:///abs`) must be
//! under one of the configured output roots (see `jobspec::resolve_uri`). Either way the
//! result is a [`Confined`]: a trusted root (configured by the administrator) and a
//! relative path below it that a job may have shaped, with symbolic links planted in it.
//!
//! Everything the server does below a root goes through this module: directories are
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it,
//! else one component at a time with `O_NOFOLLOW | O_DIRECTORY` opens; directories are
//! made with `mkdirat` on a descriptor so opened. A symbolic link anywhere below the root
//! is never followed: the operation is refused ([`BeneathError::Symlink`]).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::fcntl::AtFlags;
use nix::sys::stat::{Mode, SFlag};

/// A path below a trusted root: `root` is the administrator's (the storage root, an
/// output root, the data directory), `rel` may come from a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confined {
    pub root: PathBuf,
    /// Plain components only (no `..`, no `.`, not absolute).
    pub rel: PathBuf,
}

/// Why the server would not do something below a root.
#[derive(Debug)]
pub enum BeneathError {
    /// A symbolic link (or a way out of the root) is on the way; `at` is the path, below
    /// the root, where it was met (the whole path when the kernel does not say where).
    Symlink { at: PathBuf },
    /// Any other failure (missing, permissions, a full disk, ...).
    Io(std::io::Error),
}

impl std::fmt::Display for BeneathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BeneathError::Symlink { at } => {
                write!(f, "{} is or passes through a symbolic link, which the server does not follow", at.display())
            }
            BeneathError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<Errno> for BeneathError {
    fn from(e: Errno) -> Self {
        BeneathError::Io(std::io::Error::from(e))
    }
}

impl Confined {
    /// A path below `root`; None when `rel` has anything but plain components.
    pub fn new(root: impl Into<PathBuf>, rel: impl Into<PathBuf>) -> Option<Confined> {
        let rel = rel.into();
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return None;
        }
        Some(Confined { root: root.into(), rel })
    }

    /// The absolute path (for the replica's environment and messages).
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// `sub` (plain components) below this path.
    pub fn join(&self, sub: impl AsRef<Path>) -> Confined {
        let sub: PathBuf = sub.as_ref().components().filter(|c| matches!(c, Component::Normal(_))).collect();
        Confined { root: self.root.clone(), rel: self.rel.join(sub) }
    }

    /// Make this directory and the missing ones above it (below the root), like
    /// `create_dir_all`, without following a symbolic link anywhere below the root.
    pub fn create_dir_all(&self) -> Result<(), BeneathError> {
        let root = open_root(&self.root)?;
        if open_beneath(root.as_fd(), &self.rel, dir_flags()).is_ok() {
            return Ok(());
        }
        // One component at a time, so that a refusal names the link met.
        let mut cur = root;
        let mut done = PathBuf::new();
        for c in self.rel.components() {
            let name = c.as_os_str();
            done.push(name);
            match nix::sys::stat::mkdirat(cur.as_fd(), name, Mode::from_bits_truncate(0o777)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            cur = open_beneath(cur.as_fd(), Path::new(name), dir_flags()).map_err(|e| self.classify(e, &done))?;
        }
        Ok(())
    }

    /// For a create: refuse a path that passes through a symbolic link below the root as
    /// far as it exists now (what does not exist yet is made by the server at launch,
    /// without following links). Reports only links: a missing root or component is fine.
    pub fn check_no_symlinks(&self) -> Result<(), BeneathError> {
        let root = match open_root(&self.root) {
            Ok(r) => r,
            Err(_) => return Ok(()),
        };
        let mut cur = root;
        let mut done = PathBuf::new();
        for c in self.rel.components() {
            let name = c.as_os_str();
            done.push(name);
            match open_beneath(cur.as_fd(), Path::new(name), OFlag::O_PATH | OFlag::O_DIRECTORY) {
                Ok(fd) => cur = fd,
                Err(Errno::ELOOP | Errno::EXDEV) => return Err(BeneathError::Symlink { at: done }),
                // Missing, or not a directory: nothing below it to follow.
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }

    fn classify(&self, e: Errno, at: &Path) -> BeneathError {
        match e {
            Errno::ELOOP | Errno::EXDEV => BeneathError::Symlink { at: at.to_path_buf() },
            e => BeneathError::Io(e.into()),
        }
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY
}

/// The root itself is the administrator's: opened as it is (a link in its own path, such
/// as `/tmp` on some systems, is followed).
fn open_root(root: &Path) -> Result<OwnedFd, BeneathError> {
    nix::fcntl::open(root, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| BeneathError::Io(e.into()))
}

/// Whether `openat2` with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS can be used (Linux 5.6
/// and later, unless a seccomp filter refuses it).
fn have_openat2() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let probe = nix::fcntl::open("/", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .and_then(|root| nix::fcntl::openat2(root.as_fd(), ".", how));
        !matches!(probe, Err(Errno::ENOSYS | Errno::EPERM))
    })
}

/// Open `rel` below the directory `dir` without following any symbolic link and without
/// leaving `dir`: ELOOP (or EXDEV) when a link is met.
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    open_beneath_with(dir, rel, flags, have_openat2())
}

fn open_beneath_with(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag, openat2: bool) -> Result<OwnedFd, Errno> {
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Errno::EINVAL);
    }
    let flags = flags | OFlag::O_CLOEXEC;
    if rel.as_os_str().is_empty() {
        return nix::fcntl::openat(dir, ".", flags, Mode::empty());
    }
    if openat2 {
        let how = OpenHow::new().flags(flags).resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        return nix::fcntl::openat2(dir, rel, how);
    }
    // One component at a time: each is a single name opened with O_NOFOLLOW, so no link
    // is followed and `..` never occurs.
    let names: Vec<&OsStr> = rel.components().map(|c| c.as_os_str()).collect();
    let mut cur: Option<OwnedFd> = None;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let at = cur.as_ref().map_or(dir, |f| f.as_fd());
        let f = if last { flags } else { OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC };
        let opened = match nix::fcntl::openat(at, *name, f | OFlag::O_NOFOLLOW, Mode::empty()) {
            // O_PATH | O_NOFOLLOW | O_DIRECTORY on a link is ENOTDIR; and O_PATH |
            // O_NOFOLLOW alone would open the link itself: both are a link met.
            Err(Errno::ENOTDIR) if is_symlink(at, name) => Err(Errno::ELOOP),
            Ok(fd) if f.contains(OFlag::O_PATH) && is_symlink_fd(&fd) => Err(Errno::ELOOP),
            other => other,
        }?;
        cur = Some(opened);
    }
    cur.ok_or(Errno::EINVAL)
}

fn is_symlink(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
}

fn is_symlink_fd(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd.as_fd()).is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn both(f: impl Fn(bool)) {
        f(true);
        f(false);
    }

    fn open_with(c: &Confined, openat2: bool) -> Result<OwnedFd, Errno> {
        let root = open_root(&c.root).map_err(|_| Errno::EIO)?;
        open_beneath_with(root.as_fd(), &c.rel, dir_flags(), openat2)
    }

    #[test]
    fn links_below_the_root_are_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("p/bucket/real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("p/bucket/evil")).unwrap();
        symlink("real", root.join("p/bucket/inside-link")).unwrap();
        both(|openat2| {
            assert!(open_with(&Confined::new(&root, "p/bucket/real").unwrap(), openat2).is_ok());
            for rel in ["p/bucket/evil", "p/bucket/evil/x", "p/bucket/inside-link", "p/bucket/inside-link/y"] {
                let got = open_with(&Confined::new(&root, rel).unwrap(), openat2);
                assert!(matches!(got, Err(Errno::ELOOP | Errno::EXDEV)), "{rel} (openat2: {openat2}): {got:?}");
            }
        });
        assert!(Confined::new(&root, "p/../etc").is_none());
        assert!(Confined::new(&root, "/etc").is_none());
    }

    #[test]
    fn create_dir_all_makes_nothing_through_a_link() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("p/bucket")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("p/bucket/evil")).unwrap();
        let ok = Confined::new(&root, "p/bucket/run/model").unwrap();
        ok.create_dir_all().unwrap();
        assert!(root.join("p/bucket/run/model").is_dir());
        ok.create_dir_all().unwrap();
        let evil = Confined::new(&root, "p/bucket/evil/run/checkpoints").unwrap();
        match evil.create_dir_all() {
            Err(BeneathError::Symlink { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(evil.check_no_symlinks().is_err());
        assert!(ok.check_no_symlinks().is_ok());
        assert!(Confined::new(&root, "p/other/x").unwrap().check_no_symlinks().is_ok(), "missing is fine");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing made outside");
    }
}
