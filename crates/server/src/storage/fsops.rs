//! The endpoint's file work, all of it below the storage root and none of it through a
//! symbolic link: directories are opened with [`crate::paths::open_beneath`]
//! (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, or one `O_NOFOLLOW` component at a
//! time), files are created with `O_CREAT | O_EXCL` by a single name in a directory so
//! opened, and published with `renameat` between two such directories. A link a job
//! planted in its namespace is never followed: it is not an object, not a bucket, not
//! listed into, and nothing is written through it.
//!
//! Layout: `<root>/<project>/<bucket>/<name>`; uploads in progress (and resumable
//! sessions) live in `<root>/<project>/.trainyard-uploads/`, which is never a bucket
//! (bucket names start with a letter or a digit).

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use trainyard_backend::RunAs;

use super::error::{GcsError, GcsResult};
use super::meta::{self, ObjectInfo, StoredMeta};
use super::names::HIDDEN_PREFIX;
use crate::paths::open_beneath;

/// The hidden directory of a namespace holding uploads in progress.
pub const UPLOADS_DIR: &str = ".trainyard-uploads";

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY
}

pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

/// The storage root itself is the administrator's: opened as it is.
pub fn open_root(root: &Path) -> GcsResult<OwnedFd> {
    nix::fcntl::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| GcsError::errno("cannot open the storage root", e))
}

/// Give a file or directory the server made to the project's user (per-project users).
fn chown(fd: BorrowedFd<'_>, owner: Option<RunAs>) -> GcsResult<()> {
    if let Some(id) = owner {
        nix::unistd::fchown(fd, Some(Uid::from_raw(id.uid)), Some(Gid::from_raw(id.gid)))
            .map_err(|e| GcsError::errno("cannot give a new file to the project's user", e))?;
    }
    Ok(())
}

/// Open the directory `name` in `dir`, making it (0700, the owner's) when missing.
/// A link or a file in its place is an error naming `shown`.
fn open_or_make_dir(dir: BorrowedFd<'_>, name: &OsStr, owner: Option<RunAs>, shown: &Path) -> GcsResult<(OwnedFd, bool)> {
    match open_beneath(dir, Path::new(name), dir_flags()) {
        Ok(fd) => return Ok((fd, false)),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(dir_error(e, shown)),
    }
    let made = match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(GcsError::errno(&format!("cannot make the directory {}", shown.display()), e)),
    };
    let fd = open_beneath(dir, Path::new(name), dir_flags()).map_err(|e| dir_error(e, shown))?;
    if made {
        chown(fd.as_fd(), owner)?;
    }
    Ok((fd, made))
}

fn dir_error(e: Errno, shown: &Path) -> GcsError {
    match e {
        Errno::ELOOP | Errno::EXDEV => GcsError::invalid(format!(
            "{} is or passes through a symbolic link, which the server does not follow.",
            shown.display()
        )),
        Errno::ENOTDIR => GcsError::conflict(format!(
            "{} is an object: a name cannot be both an object and a prefix of other objects' names on this server.",
            shown.display()
        )),
        e => GcsError::errno(&format!("cannot open {}", shown.display()), e),
    }
}

/// A project's namespace, `<root>/<project>`, opened.
pub struct Ns {
    pub fd: OwnedFd,
    pub owner: Option<RunAs>,
}

impl Ns {
    /// Open (with `create`, make) the namespace; None when it does not exist (or is not a
    /// plain directory).
    pub fn open(root: &Path, project: &str, create: bool, owner: Option<RunAs>) -> GcsResult<Option<Ns>> {
        let root_fd = open_root(root)?;
        let name = OsStr::new(project);
        if create {
            let (fd, _) = open_or_make_dir(root_fd.as_fd(), name, owner, Path::new(project))?;
            return Ok(Some(Ns { fd, owner }));
        }
        match open_beneath(root_fd.as_fd(), Path::new(name), dir_flags()) {
            Ok(fd) => Ok(Some(Ns { fd, owner })),
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => Ok(None),
            Err(e) => Err(GcsError::errno("cannot open the project's namespace", e)),
        }
    }

    /// The bucket's directory, or None (missing, a link, not a directory).
    pub fn bucket(&self, bucket: &str) -> GcsResult<Option<OwnedFd>> {
        match open_beneath(self.fd.as_fd(), Path::new(bucket), dir_flags()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => Ok(None),
            Err(e) => Err(GcsError::errno("cannot open the bucket", e)),
        }
    }

    /// Make the bucket's directory; false when it already exists.
    pub fn create_bucket(&self, bucket: &str) -> GcsResult<bool> {
        match nix::sys::stat::mkdirat(self.fd.as_fd(), bucket, Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Ok(false),
            Err(e) => return Err(GcsError::errno("cannot make the bucket's directory", e)),
        }
        let fd = open_beneath(self.fd.as_fd(), Path::new(bucket), dir_flags())
            .map_err(|e| GcsError::errno("cannot open the new bucket", e))?;
        chown(fd.as_fd(), self.owner)?;
        let _ = nix::unistd::fsync(self.fd.as_fd());
        Ok(true)
    }

    /// Remove an empty bucket: Ok(false) when missing, 409 when not empty.
    pub fn delete_bucket(&self, bucket: &str) -> GcsResult<bool> {
        match self.bucket(bucket)? {
            None => return Ok(false),
            Some(fd) => {
                if has_any_object(fd)? {
                    return Err(GcsError::conflict(format!("The bucket {bucket:?} is not empty.")));
                }
            }
        }
        // No object: what is left are directories jobs made (`model/`, `checkpoints/`,
        // `logs/` under an output directory), which no listing shows and no client could
        // remove; they go with the bucket. Anything else found meanwhile keeps it (409).
        match trainyard_backend::tree::remove_empty_dirs_at(self.fd.as_fd(), OsStr::new(bucket), Path::new(bucket)) {
            Ok(r) => Ok(r.dirs > 0),
            Err(e) if matches!(e.source.kind(), std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::NotADirectory) => {
                Err(GcsError::conflict(format!(
                    "The bucket {bucket:?} holds no object but has files that are not objects (hidden or unreadable): remove them first."
                )))
            }
            Err(e) => Err(GcsError::io("cannot remove the bucket", &e.source)),
        }
    }

    /// The buckets of the namespace: its plain directories with bucket names, sorted.
    pub fn list_buckets(&self) -> GcsResult<Vec<(String, FileStat)>> {
        let dup = self.fd.try_clone().map_err(|e| GcsError::io("cannot list buckets", &e))?;
        let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| GcsError::errno("cannot list buckets", e))?;
        let mut names = Vec::new();
        for e in d.iter().flatten() {
            let Ok(name) = std::str::from_utf8(e.file_name().to_bytes()) else { continue };
            if super::names::bucket_problem(name).is_none() {
                names.push(name.to_string());
            }
        }
        names.sort();
        let mut out = Vec::new();
        for n in names {
            if let Ok(st) = nix::sys::stat::fstatat(self.fd.as_fd(), n.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                if kind(&st) == SFlag::S_IFDIR {
                    out.push((n, st));
                }
            }
        }
        Ok(out)
    }

    /// The uploads directory (the server's own, 0700), made when missing. Whatever a job
    /// left in its place (a link, a file) is removed first, never followed.
    pub fn uploads(&self) -> GcsResult<OwnedFd> {
        let name = OsStr::new(UPLOADS_DIR);
        match open_beneath(self.fd.as_fd(), Path::new(name), dir_flags()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ENOENT) => {}
            Err(Errno::ELOOP | Errno::ENOTDIR | Errno::EXDEV) => {
                tracing::warn!("storage: {UPLOADS_DIR} of a namespace was not a directory (a link or file a job left?): replaced");
                let _ = nix::unistd::unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir);
            }
            Err(e) => return Err(GcsError::errno("cannot open the uploads directory", e)),
        }
        match nix::sys::stat::mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(GcsError::errno("cannot make the uploads directory", e)),
        }
        open_beneath(self.fd.as_fd(), Path::new(name), dir_flags()).map_err(|e| GcsError::errno("cannot open the uploads directory", e))
    }
}

/// Projects whose namespace has a plain directory `bucket` (for the bucket's project).
pub fn projects_with_bucket(root: &Path, bucket: &str) -> GcsResult<Vec<String>> {
    let root_fd = open_root(root)?;
    let dup = root_fd.try_clone().map_err(|e| GcsError::io("cannot list the storage root", &e))?;
    let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| GcsError::errno("cannot list the storage root", e))?;
    let mut projects = Vec::new();
    for e in d.iter().flatten() {
        let Ok(name) = std::str::from_utf8(e.file_name().to_bytes()) else { continue };
        if super::names::project_problem(name).is_some() {
            continue;
        }
        let Ok(ns) = open_beneath(root_fd.as_fd(), Path::new(name), dir_flags()) else { continue };
        if nix::sys::stat::fstatat(ns.as_fd(), bucket, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| kind(&st) == SFlag::S_IFDIR) {
            projects.push(name.to_string());
        }
    }
    projects.sort();
    Ok(projects)
}

/// An object's file opened for reading, with what the API shows of it.
pub struct Opened {
    pub file: File,
    pub info: ObjectInfo,
}

/// Open the object `name` of the bucket: None unless it is a regular file reached without
/// a link.
pub fn open_object(bucket: BorrowedFd<'_>, name: &str) -> GcsResult<Option<Opened>> {
    let fd = match open_beneath(bucket, Path::new(name), OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV | Errno::EISDIR | Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(GcsError::errno("cannot open the object", e)),
    };
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| GcsError::errno("cannot stat the object", e))?;
    if kind(&st) != SFlag::S_IFREG {
        return Ok(None);
    }
    let kept = meta::read_xattr(fd.as_fd());
    Ok(Some(Opened { info: ObjectInfo::of(&st, kept), file: File::from(fd) }))
}

/// The object's metadata as kept (for the generation of the next write), if it exists.
fn current(parent: BorrowedFd<'_>, last: &OsStr) -> GcsResult<Option<ObjectInfo>> {
    match nix::sys::stat::fstatat(parent, last, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if kind(&st) == SFlag::S_IFREG => {}
        Ok(st) if kind(&st) == SFlag::S_IFDIR => return Ok(None),
        Ok(_) => return Ok(None),
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(GcsError::errno("cannot look at the object", e)),
    }
    Ok(open_object(parent, last.to_str().unwrap_or(""))?.map(|o| o.info))
}

/// Delete the object: Ok(false) when there is none. A link in its place is not an object.
/// `check` may refuse, given the object as it is (preconditions).
pub fn delete_object(bucket: BorrowedFd<'_>, name: &str, check: impl FnOnce(&ObjectInfo) -> GcsResult<()>) -> GcsResult<bool> {
    let path = Path::new(name);
    let (parent_rel, last) = split(path);
    let parent = match open_beneath(bucket, parent_rel, dir_flags()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => return Ok(false),
        Err(e) => return Err(GcsError::errno("cannot open the object's directory", e)),
    };
    let _lock = commit_lock(name);
    let Some(cur) = current(parent.as_fd(), last)? else { return Ok(false) };
    check(&cur)?;
    match nix::unistd::unlinkat(parent.as_fd(), last, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => {
            let _ = nix::unistd::fsync(parent.as_fd());
            Ok(true)
        }
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(GcsError::errno("cannot delete the object", e)),
    }
}

/// What became of an MD5 computed after its object was committed.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Kept in the object's metadata.
    Yes,
    /// Not kept: the name is now another object (a newer write), or none (a delete), or
    /// the file changed since it was committed (a job wrote it in place), or another
    /// computation got there first.
    Superseded,
}

/// Keep `md5` in the metadata of the object `name` of the bucket, if it still is the file
/// `file` that was hashed, of generation `generation`, unchanged since it was committed
/// and still without an MD5. Checked and written under the name's lock, the lock of
/// commits and deletes: a newer write or a delete of the name wins. The attribute is
/// replaced whole (`fsetxattr` is atomic); it is not synced: an MD5 lost in a crash is
/// computed again when the object is next read.
pub fn record_md5(bucket: BorrowedFd<'_>, name: &str, file: &File, generation: i64, md5: &str) -> GcsResult<Recorded> {
    let (parent_rel, last) = split(Path::new(name));
    let parent = match open_beneath(bucket, parent_rel, dir_flags()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => return Ok(Recorded::Superseded),
        Err(e) => return Err(GcsError::errno("cannot open the object's directory", e)),
    };
    let _lock = commit_lock(name);
    let hashed = nix::sys::stat::fstat(file.as_fd()).map_err(|e| GcsError::errno("cannot stat the object", e))?;
    match nix::sys::stat::fstatat(parent.as_fd(), last, AtFlags::AT_SYMLINK_NOFOLLOW) {
        // The same inode: the descriptor held since the hashing keeps its number from
        // being given to another file meanwhile.
        Ok(st) if kind(&st) == SFlag::S_IFREG && st.st_dev == hashed.st_dev && st.st_ino == hashed.st_ino => {}
        Ok(_) | Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(Recorded::Superseded),
        Err(e) => return Err(GcsError::errno("cannot look at the object", e)),
    }
    let Some(mut kept) = meta::read_xattr(file.as_fd()) else { return Ok(Recorded::Superseded) };
    let unchanged = kept.size == hashed.st_size.max(0) as u64 && kept.mtime_ns == meta::mtime_ns(&hashed);
    if kept.generation != generation || !unchanged || kept.md5_hash.is_some() || kept.crc32c.is_none() {
        return Ok(Recorded::Superseded);
    }
    kept.md5_hash = Some(md5.to_string());
    meta::write_xattr(file.as_fd(), &kept).map_err(|e| GcsError::io("cannot keep the object's MD5", &e))?;
    Ok(Recorded::Yes)
}

fn split(path: &Path) -> (&Path, &OsStr) {
    let last = path.file_name().unwrap_or(OsStr::new(""));
    let parent = path.parent().unwrap_or(Path::new(""));
    (parent, last)
}

/// A file in the uploads directory that is removed when dropped, unless it was published
/// (renamed into its bucket) or kept (a resumable session's data).
pub struct TempFile {
    pub dir: OwnedFd,
    pub name: String,
    pub file: File,
    armed: bool,
}

impl TempFile {
    /// A new, empty file (0600) in the uploads directory `dir`.
    pub fn create(dir: OwnedFd, name: String) -> GcsResult<TempFile> {
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            name.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| GcsError::errno("cannot create a temporary file", e))?;
        Ok(TempFile { dir, name, file: File::from(fd), armed: true })
    }

    /// An existing file of the uploads directory (a session's data), opened read-write;
    /// it is not removed when dropped (see [`TempFile::remove_on_drop`]).
    pub fn open_existing(dir: OwnedFd, name: String) -> GcsResult<Option<TempFile>> {
        let fd = match open_beneath(dir.as_fd(), Path::new(&name), OFlag::O_RDWR | OFlag::O_NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ELOOP | Errno::EXDEV) => return Ok(None),
            Err(e) => return Err(GcsError::errno("cannot open the upload's data", e)),
        };
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| GcsError::errno("cannot stat the upload's data", e))?;
        if kind(&st) != SFlag::S_IFREG {
            return Ok(None);
        }
        Ok(Some(TempFile { dir, name, file: File::from(fd), armed: false }))
    }

    pub fn remove_on_drop(&mut self, yes: bool) {
        self.armed = yes;
    }

    /// Publish this file as object `name` of the bucket: the directories on the way are
    /// made (the project's user's), `meta` is completed with the generation and the
    /// file's size and time and set as the attribute, the file is given to the project's
    /// user and synced, then renamed into place and the directory synced. Preconditions
    /// on the current generation are checked under the name's lock.
    pub fn publish(mut self, bucket: BorrowedFd<'_>, name: &str, owner: Option<RunAs>, mut meta: StoredMeta, pre: &Preconditions) -> GcsResult<ObjectInfo> {
        let path = Path::new(name);
        let (parent_rel, last) = split(path);
        // Make the directories on the way, one at a time, none through a link.
        let mut parent = bucket.try_clone_to_owned().map_err(|e| GcsError::io("cannot open the bucket", &e))?;
        let mut shown = PathBuf::new();
        for c in parent_rel.components() {
            shown.push(c);
            let (fd, _) = open_or_make_dir(parent.as_fd(), c.as_os_str(), owner, &shown)?;
            parent = fd;
        }
        let _lock = commit_lock(name);
        let cur = current(parent.as_fd(), last)?;
        pre.check(cur.as_ref())?;
        let now = meta::now_us();
        meta.generation = cur.as_ref().map_or(now, |c| now.max(c.generation + 1));
        meta.metageneration = 1;
        meta.created_us = meta.generation;
        let st = nix::sys::stat::fstat(self.file.as_fd()).map_err(|e| GcsError::errno("cannot stat the upload", e))?;
        meta.size = st.st_size.max(0) as u64;
        meta.mtime_ns = meta::mtime_ns(&st);
        match meta::write_xattr(self.file.as_fd(), &meta) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOTSUP) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "storage: the storage root's file system has no user extended attributes: objects keep no \
                         hashes, content type or custom metadata"
                    )
                });
            }
            Err(e) => return Err(GcsError::io("cannot keep the object's metadata", &e)),
        }
        chown(self.file.as_fd(), owner)?;
        self.file.sync_all().map_err(|e| GcsError::io("cannot sync the upload", &e))?;
        match nix::fcntl::renameat(self.dir.as_fd(), self.name.as_str(), parent.as_fd(), last) {
            Ok(()) => {}
            Err(Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST) => {
                return Err(GcsError::conflict(format!(
                    "{name:?} is a prefix of other objects' names (a directory): on this server a name cannot be both."
                )))
            }
            Err(e) => return Err(GcsError::errno("cannot publish the object", e)),
        }
        self.armed = false;
        let _ = nix::unistd::fsync(parent.as_fd());
        let st = nix::sys::stat::fstat(self.file.as_fd()).map_err(|e| GcsError::errno("cannot stat the object", e))?;
        let kept = meta::read_xattr(self.file.as_fd());
        Ok(ObjectInfo::of(&st, kept))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = nix::unistd::unlinkat(self.dir.as_fd(), self.name.as_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// `ifGenerationMatch`, `ifGenerationNotMatch`, `ifMetagenerationMatch`,
/// `ifMetagenerationNotMatch` (generation 0: the object does not exist).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Preconditions {
    pub if_generation_match: Option<i64>,
    pub if_generation_not_match: Option<i64>,
    pub if_metageneration_match: Option<i64>,
    pub if_metageneration_not_match: Option<i64>,
}

impl Preconditions {
    pub fn from_query(q: &std::collections::HashMap<String, String>) -> GcsResult<Preconditions> {
        use super::names::int_param;
        Ok(Preconditions {
            if_generation_match: int_param(q, "ifGenerationMatch")?,
            if_generation_not_match: int_param(q, "ifGenerationNotMatch")?,
            if_metageneration_match: int_param(q, "ifMetagenerationMatch")?,
            if_metageneration_not_match: int_param(q, "ifMetagenerationNotMatch")?,
        })
    }

    pub fn check(&self, cur: Option<&ObjectInfo>) -> GcsResult<()> {
        let generation = cur.map_or(0, |c| c.generation);
        let metageneration = cur.map_or(0, |c| c.metageneration);
        let fail = |what: &str| Err(GcsError::precondition(format!("At least one of the pre-conditions you specified did not hold ({what}).")));
        if self.if_generation_match.is_some_and(|g| g != generation) {
            return fail("ifGenerationMatch");
        }
        if self.if_generation_not_match.is_some_and(|g| g == generation) {
            return fail("ifGenerationNotMatch");
        }
        if self.if_metageneration_match.is_some_and(|g| g != metageneration) {
            return fail("ifMetagenerationMatch");
        }
        if self.if_metageneration_not_match.is_some_and(|g| g == metageneration) {
            return fail("ifMetagenerationNotMatch");
        }
        Ok(())
    }
}

/// Does the directory hold a regular file anywhere below it (links not followed, the
/// server's hidden entries left out)? Iterative, with two directories open at a time
/// whatever the tree's depth and width.
fn has_any_object(dir: OwnedFd) -> GcsResult<bool> {
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let fd = if rel.as_os_str().is_empty() {
            dir.try_clone().map_err(|e| GcsError::io("cannot open the bucket", &e))?
        } else {
            match open_beneath(dir.as_fd(), &rel, dir_flags()) {
                Ok(fd) => fd,
                // Gone, or swapped for a link meanwhile: nothing to look at there.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => continue,
                Err(e) => return Err(GcsError::errno("cannot open a directory of the bucket", e)),
            }
        };
        let mut d = nix::dir::Dir::from_fd(fd).map_err(|e| GcsError::errno("cannot read a directory of the bucket", e))?;
        for (name, is_dir) in read_dir_entries(&mut d) {
            if !is_dir {
                return Ok(true);
            }
            todo.push(rel.join(name));
        }
    }
    Ok(false)
}

/// Entries of a directory: (name, is a directory), the server's hidden ones, links and
/// other non-regular files left out, names that are not UTF-8 too.
pub fn read_dir_entries(dir: &mut nix::dir::Dir) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let fd = dir.as_fd().try_clone_to_owned().ok();
    for e in dir.iter().flatten() {
        let raw = e.file_name().to_bytes();
        if raw == b"." || raw == b".." {
            continue;
        }
        let Ok(name) = std::str::from_utf8(raw) else { continue };
        if name.starts_with(HIDDEN_PREFIX) || name.contains(['\r', '\n']) {
            continue;
        }
        let t = match e.file_type() {
            Some(nix::dir::Type::File) => Some(false),
            Some(nix::dir::Type::Directory) => Some(true),
            Some(_) => None,
            // The file system does not say: look (without following a link).
            None => fd.as_ref().and_then(|fd| {
                let st = nix::sys::stat::fstatat(fd.as_fd(), OsStr::from_bytes(raw), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
                match kind(&st) {
                    SFlag::S_IFREG => Some(false),
                    SFlag::S_IFDIR => Some(true),
                    _ => None,
                }
            }),
        };
        if let Some(is_dir) = t {
            out.push((name.to_string(), is_dir));
        }
    }
    out
}

/// One lock per object name's shard: a write's generation is decided and published, and
/// a delete checks and removes, under it.
pub(super) fn commit_lock(name: &str) -> std::sync::MutexGuard<'static, ()> {
    static LOCKS: std::sync::OnceLock<Vec<std::sync::Mutex<()>>> = std::sync::OnceLock::new();
    let locks = LOCKS.get_or_init(|| (0..64).map(|_| std::sync::Mutex::new(())).collect());
    let h = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    locks[(h % 64) as usize].lock().unwrap_or_else(|p| p.into_inner())
}

