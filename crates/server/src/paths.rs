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
use nix::sys::stat::{FileStat, Mode, SFlag};

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

    /// Open this path (a file or a directory) for reading without following a link, and
    /// say what it is. A FIFO or device is not waited on (O_NONBLOCK).
    pub fn stat(&self) -> Result<FileStat, BeneathError> {
        let root = open_root(&self.root)?;
        let fd = open_beneath(root.as_fd(), &self.rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
            .map_err(|e| self.classify(e, &self.rel))?;
        Ok(nix::sys::stat::fstat(fd.as_fd())?)
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

/// What a bounded scan of a directory tree saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The newest modification time (µs since the epoch) of the directory or any entry
    /// below it that was visited.
    pub newest: Option<i64>,
    /// Entries looked at (the directory itself not counted).
    pub entries: usize,
    /// The scan stopped at the entry cap before it had seen everything.
    pub truncated: bool,
}

/// Entries one scan looks at, at most.
pub const SCAN_MAX_ENTRIES: usize = 10_000;
/// Levels below the scanned directory it descends, at most.
pub const SCAN_MAX_DEPTH: u32 = 6;

fn mtime_micros(st: &FileStat) -> i64 {
    st.st_mtime.saturating_mul(1_000_000).saturating_add(st.st_mtime_nsec / 1000)
}

/// The names in a directory (not `.` and `..`), at most `max`; whether there were more.
fn list_names(d: &mut nix::dir::Dir, max: usize) -> (Vec<std::ffi::OsString>, bool) {
    let mut names = Vec::new();
    for entry in d.iter() {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if names.len() >= max {
            return (names, true);
        }
        names.push(std::ffi::OsString::from(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name)));
    }
    (names, false)
}

/// The newest entry directly in `dir` (a checkpoint directory), by modification time
/// (a link's own), among at most `max_entries`; its name. None when `dir` cannot be
/// opened (below its root, no link followed) or is empty.
pub fn newest_entry(dir: &Confined, max_entries: usize) -> Option<std::ffi::OsString> {
    let root = open_root(&dir.root).ok()?;
    let top = open_beneath(root.as_fd(), &dir.rel, dir_flags()).ok()?;
    let mut d = nix::dir::Dir::from_fd(top).ok()?;
    let (names, _) = list_names(&mut d, max_entries);
    names
        .into_iter()
        .filter_map(|n| {
            let st = nix::sys::stat::fstatat(d.as_fd(), n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            Some((mtime_micros(&st), n))
        })
        .max()
        .map(|(_, n)| n)
}

/// L21: the newest modification time under `dir` (the checkpoint directory), bounded: no
/// symbolic link is followed (a link's own time counts, never its target's), at most
/// `max_entries` entries and `max_depth` levels; `dir` itself is opened below its root
/// without following links. None when `dir` cannot be opened.
pub fn newest_mtime(dir: &Confined, max_entries: usize, max_depth: u32) -> Option<Scan> {
    let root = open_root(&dir.root).ok()?;
    let top = open_beneath(root.as_fd(), &dir.rel, dir_flags()).ok()?;
    let st = nix::sys::stat::fstat(top.as_fd()).ok()?;
    let mut scan = Scan { newest: Some(mtime_micros(&st)), entries: 0, truncated: false };
    walk(top, max_depth, max_entries, &mut scan);
    Some(scan)
}

fn walk(dir: OwnedFd, depth: u32, max_entries: usize, scan: &mut Scan) {
    let Ok(mut d) = nix::dir::Dir::from_fd(dir) else { return };
    // The names first (within what the budget leaves), then each looked at: a directory
    // below is opened while this one's listing is finished.
    let (names, cut) = list_names(&mut d, max_entries.saturating_sub(scan.entries));
    scan.truncated |= cut;
    scan.entries += names.len();
    for name in names {
        let Ok(st) = nix::sys::stat::fstatat(d.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        let t = mtime_micros(&st);
        scan.newest = Some(scan.newest.map_or(t, |b| b.max(t)));
        let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if is_dir && depth > 0 && !scan.truncated {
            if let Ok(sub) = open_beneath(d.as_fd(), Path::new(&name), dir_flags()) {
                walk(sub, depth - 1, max_entries, scan);
            }
        }
    }
}

/// What [`event_files`] found: regular files whose name holds `tfevents`, by their path
/// below the scanned directory, and the entries that were passed over (links, FIFOs,
/// devices named like event files), also by path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EventFiles {
    pub files: Vec<PathBuf>,
    pub passed_over: Vec<PathBuf>,
}

/// TensorBoard's event files below `dir` (its log directory), bounded as
/// [`newest_mtime`]: no link followed (a link named like an event file is passed over,
/// never read), at most `max_entries` entries and `max_depth` levels. Empty when `dir`
/// cannot be opened.
pub fn event_files(dir: &Confined, max_entries: usize, max_depth: u32) -> EventFiles {
    let mut out = EventFiles::default();
    let Ok(root) = open_root(&dir.root) else { return out };
    let Ok(top) = open_beneath(root.as_fd(), &dir.rel, dir_flags()) else { return out };
    let mut seen = 0;
    walk_events(top, PathBuf::new(), max_depth, max_entries, &mut seen, &mut out);
    out.files.sort();
    out
}

fn walk_events(dir: OwnedFd, at: PathBuf, depth: u32, max_entries: usize, seen: &mut usize, out: &mut EventFiles) {
    let Ok(mut d) = nix::dir::Dir::from_fd(dir) else { return };
    let (names, _) = list_names(&mut d, max_entries.saturating_sub(*seen));
    *seen += names.len();
    for name in names {
        let Ok(st) = nix::sys::stat::fstatat(d.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        let rel = at.join(&name);
        if kind == SFlag::S_IFDIR {
            if depth > 0 {
                if let Ok(sub) = open_beneath(d.as_fd(), Path::new(&name), dir_flags()) {
                    walk_events(sub, rel, depth - 1, max_entries, seen, out);
                }
            }
        } else if name.to_string_lossy().contains("tfevents") {
            if kind == SFlag::S_IFREG {
                out.files.push(rel);
            } else {
                out.passed_over.push(rel);
            }
        }
    }
}

/// Up to `max` bytes of the regular file `rel` below `dir`, from `offset`: opened without
/// following a link and without waiting on a FIFO, and refused unless it is a regular file
/// (a file swapped for a link or a FIFO since it was listed included).
pub fn read_file_from(dir: &Confined, rel: &Path, offset: u64, max: usize) -> Result<Vec<u8>, BeneathError> {
    let root = open_root(&dir.root)?;
    let top = open_beneath(root.as_fd(), &dir.rel, dir_flags()).map_err(|e| dir.classify(e, &dir.rel))?;
    let fd = open_beneath(top.as_fd(), rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).map_err(|e| dir.classify(e, rel))?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(BeneathError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let want = size.saturating_sub(offset).min(max as u64) as usize;
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match nix::sys::uio::pread(fd.as_fd(), &mut buf[got..], (offset + got as u64) as i64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(BeneathError::Io(e.into())),
        }
    }
    buf.truncate(got);
    Ok(buf)
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

    /// Event files are found below the log directory without following links; a link or
    /// a FIFO named like one is passed over, never opened; a read stops at the file's end.
    #[test]
    fn event_files_are_regular_files_below_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("p/b/logs/eval")).unwrap();
        std::fs::write(root.join("p/b/logs/events.out.tfevents.1"), b"abcdef").unwrap();
        std::fs::write(root.join("p/b/logs/eval/events.out.tfevents.2"), b"x").unwrap();
        std::fs::write(t.path().join("secret"), b"secret").unwrap();
        symlink(t.path().join("secret"), root.join("p/b/logs/link.tfevents")).unwrap();
        nix::unistd::mkfifo(&root.join("p/b/logs/fifo.tfevents"), Mode::from_bits_truncate(0o600)).unwrap();
        symlink(t.path(), root.join("p/b/logs/up")).unwrap();
        let dir = Confined::new(&root, "p/b/logs").unwrap();
        let found = event_files(&dir, 100, 3);
        assert_eq!(found.files, vec![PathBuf::from("eval/events.out.tfevents.2"), PathBuf::from("events.out.tfevents.1")]);
        let mut passed = found.passed_over.clone();
        passed.sort();
        assert_eq!(passed, vec![PathBuf::from("fifo.tfevents"), PathBuf::from("link.tfevents")]);
        assert_eq!(read_file_from(&dir, Path::new("events.out.tfevents.1"), 2, 3).unwrap(), b"cde");
        assert_eq!(read_file_from(&dir, Path::new("events.out.tfevents.1"), 4, 100).unwrap(), b"ef");
        assert!(read_file_from(&dir, Path::new("link.tfevents"), 0, 10).is_err());
        assert!(read_file_from(&dir, Path::new("fifo.tfevents"), 0, 10).is_err(), "a FIFO is refused, not waited on");
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

    /// L21: a farm of `ln -s .` links is fifty entries, not fifty to the fourth; a link
    /// out of the root is never entered; the entry cap holds.
    #[test]
    fn l21_scan_is_bounded_and_stays_below_its_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let ckpt = root.join("p/b/checkpoints");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(ckpt.join("step-1")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        for i in 0..50 {
            symlink(".", ckpt.join(format!("l{i}"))).unwrap();
        }
        symlink(&outside, ckpt.join("escape")).unwrap();
        std::fs::write(ckpt.join("step-1/data"), b"x").unwrap();
        // Outside, a file newer than everything inside.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(outside.join("fresh"), b"y").unwrap();
        let fresh = mtime_micros(&nix::sys::stat::stat(&outside.join("fresh")).unwrap());
        let began = std::time::Instant::now();
        let scan = newest_mtime(&Confined::new(&root, "p/b/checkpoints").unwrap(), SCAN_MAX_ENTRIES, SCAN_MAX_DEPTH).unwrap();
        let took = began.elapsed();
        println!("scan of 50 `ln -s .` links: {} entries in {took:?}", scan.entries);
        assert_eq!(scan.entries, 53, "50 links, escape, step-1, data");
        assert!(!scan.truncated);
        assert!(scan.newest.unwrap() < fresh, "the link's target was not looked at");
        assert!(took < std::time::Duration::from_secs(2));

        let many = root.join("p/many");
        std::fs::create_dir_all(&many).unwrap();
        for i in 0..120 {
            std::fs::write(many.join(format!("f{i}")), b"").unwrap();
        }
        let capped = newest_mtime(&Confined::new(&root, "p/many").unwrap(), 100, 6).unwrap();
        assert_eq!(capped.entries, 100);
        assert!(capped.truncated);
        // The checkpoint directory itself a link out of the root: not scanned.
        symlink(&outside, root.join("p/c")).unwrap();
        assert_eq!(newest_mtime(&Confined::new(&root, "p/c").unwrap(), 100, 6), None);
    }
}
