//! Replica identity: each project's replicas run as a user of their own.
//!
//! A root server gives every project a uid (and a gid of the same number) from
//! `[replicas] uid_range`, assigned once and kept in the store's meta table. The shim
//! stays root and switches the program to that identity just before exec (see
//! `ShimSpec::run_as`). The server makes what the program needs its own, and nothing else:
//!
//! - `<run_dir>/work` (the working directory) and `<run_dir>/home` (`HOME`, `TMPDIR`):
//!   owned by the uid, 0700. The run directory itself stays root's (the shim writes
//!   `status.json`, `started.json` and the log there as root: a directory the program
//!   owned would let it swap those files for links);
//! - the project's storage namespace `<storage_root>/<project>` and everything on the
//!   way to the job's output directories below it; below an output root only `model/`,
//!   `checkpoints/` and `logs/` (an output root may be shared by projects);
//! - a trial's metric directory and the job's venv directory.
//!
//! Directories on the way to those (the data directory, `runs/`, a job's and an
//! attempt's directory, the storage root) get the search bit for others (at least
//! 0711), never the read bit: a uid can pass through to its own directories by name but
//! cannot list what is there, and every file the server writes is 0600 (umask 077). The
//! database, the tokens file, other projects' run directories, logs, namespaces and
//! venvs stay out of reach.
//!
//! Everything is walked one component at a time from an open root with `O_NOFOLLOW`, so a
//! link a job planted in a directory it owns is never followed, by the chown included.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, Gid, Uid};
use trainyard_backend::RunAs;

use crate::config::Config;

/// A directory to make the uid's: `root/rel`, where the components of `rel` from index
/// `own_from` on are owned by the uid (0700) and those before only get the search bit
/// for others, as does `root` itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub root: PathBuf,
    pub rel: PathBuf,
    pub own_from: usize,
}

impl Grant {
    pub fn new(root: impl Into<PathBuf>, rel: impl Into<PathBuf>, own_from: usize) -> Grant {
        Grant { root: root.into(), rel: rel.into(), own_from }
    }

    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// Makes the missing directories and gives them their owner and mode. A link or a
    /// non-directory on the way is an error naming it.
    pub fn apply(&self, id: RunAs) -> Result<(), String> {
        let fail = |at: &Path, what: &str, e: Errno| format!("cannot give {} to uid {}: {what} {}: {e}", self.path().display(), id.uid, at.display());
        let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut fd: OwnedFd = nix::fcntl::open(&self.root, dir_flags, Mode::empty()).map_err(|e| fail(&self.root, "open", e))?;
        add_search(&fd).map_err(|e| fail(&self.root, "chmod", e))?;
        let mut at = self.root.clone();
        for (i, comp) in self.rel.components().enumerate() {
            let name: &OsStr = match comp {
                Component::Normal(n) => n,
                _ => return Err(format!("cannot give {} to uid {}: not a plain relative path", self.path().display(), id.uid)),
            };
            at.push(name);
            match mkdirat(fd.as_fd(), name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(fail(&at, "mkdir", e)),
            }
            let next = openat(fd.as_fd(), name, dir_flags, Mode::empty()).map_err(|e| match e {
                Errno::ELOOP | Errno::ENOTDIR => format!(
                    "cannot give {} to uid {}: {} is a symbolic link or not a directory, which the server does not follow",
                    self.path().display(),
                    id.uid,
                    at.display()
                ),
                e => fail(&at, "open", e),
            })?;
            if i >= self.own_from {
                fchown(next.as_fd(), Some(Uid::from_raw(id.uid)), Some(Gid::from_raw(id.gid))).map_err(|e| fail(&at, "chown", e))?;
                fchmod(next.as_fd(), Mode::from_bits_truncate(0o700)).map_err(|e| fail(&at, "chmod", e))?;
            } else {
                add_search(&next).map_err(|e| fail(&at, "chmod", e))?;
            }
            fd = next;
        }
        Ok(())
    }
}

/// Adds the search bit for group and others to a directory the server owns (never the
/// read bit, never taking a bit away). A directory of another owner is left as it is.
fn add_search(fd: &OwnedFd) -> Result<(), Errno> {
    let st = fstat(fd.as_fd())?;
    if st.st_uid != nix::unistd::geteuid().as_raw() {
        return Ok(());
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o011 == 0o011 {
        return Ok(());
    }
    fchmod(fd.as_fd(), Mode::from_bits_truncate((mode | 0o011) as nix::libc::mode_t))
}

/// Reads a file the server takes from a replica's directory (a trial's metric file):
/// the directory may be the project's user's, so the file may be a link (to a secret or to
/// `/dev/zero`), a FIFO (a read that never ends) or huge. It is opened without following a
/// link and without blocking, must be a regular file, and at most `max` bytes are read.
/// A tenant's file opened for reading: no link followed, never blocking on a FIFO, a
/// regular file only.
fn open_tenant_file(path: &Path) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    Ok((file, meta))
}

/// What a tenant's file has gained since `offset` (its whole end again if it shrank), at
/// most the last `max` bytes of it, in whole lines; and the offset to go on from. Opened
/// as [`read_tenant_file`] does.
pub fn read_tenant_since(path: &Path, offset: u64, max: u64) -> std::io::Result<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let (mut file, meta) = open_tenant_file(path)?;
    let len = meta.len();
    let from = if offset > len { 0 } else { offset };
    let start = from.max(len.saturating_sub(max));
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(len - start).read_to_end(&mut bytes)?;
    // Whole lines only: a line being written is read next time; a cut start is dropped.
    let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let begin = if start > from { bytes.iter().position(|b| *b == b'\n').map_or(end, |i| (i + 1).min(end)) } else { 0 };
    let text = String::from_utf8_lossy(&bytes[begin..end]).into_owned();
    Ok((text, start + end as u64))
}

pub fn read_tenant_file(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let (file, _) = open_tenant_file(path)?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Key of a project's uid in the store's meta table.
pub fn meta_key(project: &str) -> String {
    format!("project_uid/{project}")
}

/// At start: per-project users need root; the data directory and the storage root get
/// the search bit for others (so a replica's uid reaches its own directories below
/// them), and every directory above them must already have it. Tokens mode with
/// replicas as the server's user is refused unless `insecure_shared_user = true`.
/// Returns the line to log about replicas' identity and task limit.
pub fn check_at_start(cfg: &Config) -> Result<String, String> {
    check(cfg, true)
}

/// The same checks without changing anything (`trainyard doctor`): the data directory and
/// storage root are not given the search bit, and directories not made yet are skipped.
pub fn check_only(cfg: &Config) -> Result<String, String> {
    check(cfg, false)
}

fn check(cfg: &Config, grant: bool) -> Result<String, String> {
    let r = &cfg.replicas;
    let pids = pids_note(r.pids_max, r.uid_range.is_some());
    let Some((first, last)) = r.uid_range else {
        let why = "replicas run as the server's user: a job can read and change everything that user can \
                   (the database, the tokens file, other projects' files and jobs)";
        if cfg.tokens_file.is_some() && !r.insecure_shared_user {
            return Err(format!(
                "refusing to serve tokens while {why}. Run the server as root with [replicas] per_project_users = true \
                 (the default for root), or, for a single trusted user only, set [replicas] insecure_shared_user = true"
            ));
        }
        return Ok(format!("{why}; {pids}"));
    };
    if !nix::unistd::geteuid().is_root() {
        return Err(format!(
            "[replicas] per_project_users needs the server to run as root (to switch replicas to uids {first}-{last}); \
             set per_project_users = false to run replicas as the server's user"
        ));
    }
    for dir in [&cfg.data_dir, &cfg.storage_root] {
        let dir = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if grant {
            Grant::new(&dir, "", 0).apply(RunAs { uid: first, gid: first })?;
        }
        for above in dir.ancestors().skip(1).filter(|a| grant || a.exists()) {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(above).map_err(|e| format!("{}: {e}", above.display()))?.permissions().mode();
            if mode & 0o001 == 0 {
                return Err(format!(
                    "replicas run as per-project users, who must pass through {} to reach their directories below {}, \
                     but its mode is {:04o}: give others the search bit (chmod o+x {}) or choose a data directory \
                     and storage root below directories they can pass (e.g. --data-dir /var/lib/trainyard)",
                    above.display(),
                    dir.display(),
                    mode & 0o7777,
                    above.display()
                ));
            }
        }
    }
    for (file, kind) in ID_FILES {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        if let Some(clash) = id_range_clash(&text, kind, first, last) {
            return Err(format!(
                "[replicas] uid_range ({first}-{last}) is not free on this host: {file} has {clash}; a replica would share \
                 that id (its files, processes and limits). Choose a range no account or subordinate range uses \
                 (the default is {}-{})",
                crate::config::DEFAULT_UID_RANGE.0,
                crate::config::DEFAULT_UID_RANGE.1
            ));
        }
    }
    let note = format!("replicas run as a user of their project's own (uids {first}-{last}, no supplementary groups); {pids}");
    // An output root that per-project users cannot reach fails only the jobs that use it:
    // said at start, not refused.
    for root in &cfg.output_roots {
        use std::os::unix::fs::PermissionsExt;
        let closed = root.ancestors().skip(1).find(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0));
        if let Some(above) = closed {
            tracing::warn!(
                "output root {}: per-project users cannot pass through {} (chmod o+x it), so jobs that write there will fail",
                root.display(),
                above.display()
            );
        }
    }
    Ok(note)
}

/// The host's id files a project's uid range must not overlap: accounts and groups
/// (`name:x:id:...`), subordinate ranges (`name:first:count`, what rootless container
/// engines map containers into).
const ID_FILES: [(&str, IdFile); 4] =
    [("/etc/passwd", IdFile::Accounts), ("/etc/group", IdFile::Accounts), ("/etc/subuid", IdFile::Subordinate), ("/etc/subgid", IdFile::Subordinate)];

#[derive(Clone, Copy, Debug)]
enum IdFile {
    Accounts,
    Subordinate,
}

/// The first entry of `text` (an id file of `kind`) whose ids meet `first..=last`, as
/// said to an administrator (`the entry "podman:200000:65536" (line 3)`).
fn id_range_clash(text: &str, kind: IdFile, first: u32, last: u32) -> Option<String> {
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(':').collect();
        let (lo, hi) = match kind {
            IdFile::Accounts => {
                let Some(id) = fields.get(2).and_then(|f| f.parse::<u64>().ok()) else { continue };
                (id, id)
            }
            IdFile::Subordinate => {
                let (Some(start), Some(count)) = (fields.get(1).and_then(|f| f.parse::<u64>().ok()), fields.get(2).and_then(|f| f.parse::<u64>().ok())) else {
                    continue;
                };
                if count == 0 {
                    continue;
                }
                (start, start + count - 1)
            }
        };
        if lo <= last as u64 && hi >= first as u64 {
            return Some(format!("the entry {line:?} (line {})", i + 1));
        }
    }
    None
}

/// How the task limit is enforced on this host.
fn pids_note(max: u64, own_users: bool) -> String {
    // How the limit is enforced (a cgroup's pids.max, v2 or the v1 pids hierarchy, or
    // RLIMIT_NPROC) depends on the backend's cgroups: its start line says which.
    let fallback = if own_users {
        "RLIMIT_NPROC of the project's uid where no pids cgroup is available"
    } else {
        "no limit where no pids cgroup is available (RLIMIT_NPROC would count the server's own processes)"
    };
    format!("at most {max} tasks per replica through its pids cgroup (see the backend's line), {fallback}")
}

/// The environment of a replica that runs as its project's user: `PATH`, `LANG`,
/// `LC_ALL`, `TZ` of the server's, `HOME` and `TMPDIR` its own directory; nothing else of
/// the server's (the replica environment of L8 and the job's own are added after).
pub fn minimal_env(base_env: &[(String, String)], home: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        base_env.iter().filter(|(k, _)| matches!(k.as_str(), "LANG" | "LC_ALL" | "TZ")).cloned().collect();
    // Only the server's PATH directories the project's user can use (a version manager
    // under /root is not one of them).
    let path = base_env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("");
    env.push(("PATH".into(), replica_path(path)));
    let home = home.display().to_string();
    env.push(("HOME".into(), home.clone()));
    env.push(("TMPDIR".into(), home));
    env
}

/// Looks at the directories of `base_env`'s PATH now (at the server's start), so that
/// [`minimal_env`] never reads the disk.
pub fn warm_replica_path(base_env: &[(String, String)]) {
    if let Some((_, path)) = base_env.iter().find(|(k, _)| k == "PATH") {
        replica_path(path);
    }
}

/// `path` without the directories other users cannot search (looked at once per server
/// PATH, not at every launch: a few stat calls per directory and ancestor).
fn replica_path(path: &str) -> String {
    static LAST: std::sync::Mutex<Option<(String, String)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, filtered)) = last.as_ref().filter(|(seen, _)| seen == path) {
        return filtered.clone();
    }
    let usable: Vec<&str> = path.split(':').filter(|d| usable_by_others(Path::new(d))).collect();
    let filtered = if usable.is_empty() { "/usr/local/bin:/usr/bin:/bin".to_string() } else { usable.join(":") };
    *last = Some((path.to_string(), filtered.clone()));
    filtered
}

/// Can a user that is neither `dir`'s owner nor in its group search `dir` and every
/// directory above it (absolute paths only)?
fn usable_by_others(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if !dir.is_absolute() {
        return false;
    }
    dir.ancestors().all(|d| std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_uid_range_that_meets_an_account_or_a_subordinate_range_is_named() {
        let subuid = "root:100000:65536\npodman:165536:65536\n";
        let clash = id_range_clash(subuid, IdFile::Subordinate, 200_000, 299_999).expect("podman's range meets it");
        assert!(clash.contains("podman:165536:65536") && clash.contains("line 2"), "{clash}");
        assert_eq!(id_range_clash(subuid, IdFile::Subordinate, 231_072, 299_999), None, "165536 + 65536 - 1 = 231071");
        assert!(id_range_clash(subuid, IdFile::Subordinate, 231_071, 231_071).is_some());
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n# comment\nbad line\n";
        assert!(id_range_clash(passwd, IdFile::Accounts, 65_534, 65_534).is_some_and(|c| c.contains("nobody")));
        let (lo, hi) = crate::config::DEFAULT_UID_RANGE;
        assert_eq!(id_range_clash(passwd, IdFile::Accounts, lo, hi), None);
        let useradd_max = "u:600100000:65536\n";
        assert_eq!(id_range_clash(useradd_max, IdFile::Subordinate, lo, hi), None, "above useradd's subordinate ids");
    }

    #[test]
    fn a_replica_path_holds_only_directories_others_can_search() {
        let t = tempfile::tempdir().unwrap();
        let closed = t.path().join("closed");
        let open = t.path().join("open/bin");
        std::fs::create_dir_all(closed.join("bin")).unwrap();
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = format!("{}:{}:relative:/usr/bin", closed.join("bin").display(), open.display());
        let env = minimal_env(&[("PATH".into(), path), ("SECRET".into(), "x".into())], Path::new("/h"));
        let got = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).unwrap();
        assert_eq!(got, format!("{}:/usr/bin", open.display()));
        assert!(!env.iter().any(|(k, _)| k == "SECRET"));
    }

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn grants_own_the_tail_and_open_only_the_way() {
        if !root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let id = RunAs { uid: 200_321, gid: 200_321 };
        Grant::new(t.path(), "runs/1/0/w/0/home", 5).apply(id).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(t.path()), 0o711);
        assert_eq!(mode(&t.path().join("runs/1/0")), 0o711);
        let home = t.path().join("runs/1/0/w/0/home");
        assert_eq!(mode(&home), 0o700);
        assert_eq!(std::fs::metadata(&home).unwrap().uid(), 200_321);
        assert_eq!(std::fs::metadata(t.path().join("runs/1/0/w/0")).unwrap().uid(), 0);
    }

    #[test]
    fn a_planted_link_is_never_followed() {
        if !root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("secret");
        std::fs::create_dir(&target).unwrap();
        std::fs::create_dir(t.path().join("ns")).unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("ns/bucket")).unwrap();
        let id = RunAs { uid: 200_322, gid: 200_322 };
        let e = Grant::new(t.path(), "ns/bucket/model", 0).apply(id).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::metadata(&target).unwrap().uid(), 0);
        assert!(!target.join("model").exists());
    }

    #[test]
    fn a_tenant_file_is_read_only_as_a_bounded_regular_file() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("output.metrics");
        std::fs::write(&f, "0123456789").unwrap();
        assert_eq!(read_tenant_file(&f, 4).unwrap(), "0123");
        let link = t.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_tenant_file(&link, 1 << 20).is_err());
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_tenant_file(&fifo, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn minimal_env_keeps_nothing_of_the_server() {
        let base = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("HOME".to_string(), "/root".to_string()),
            ("TRAINYARD_TOKENS".to_string(), "/x".to_string()),
            ("PYTHONPATH".to_string(), "/srv".to_string()),
        ];
        let env = minimal_env(&base, Path::new("/d/home"));
        assert_eq!(
            env,
            vec![
                ("PATH".to_string(), "/bin".to_string()),
                ("HOME".to_string(), "/d/home".to_string()),
                ("TMPDIR".to_string(), "/d/home".to_string())
            ]
        );
    }

    /// Only what a file gained is read, in whole lines; a file that shrank is read again
    /// from its start; a link is not followed.
    #[test]
    fn a_tenant_file_is_read_by_what_it_gained() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("p.jsonl");
        std::fs::write(&f, "a\nb\npart").unwrap();
        let (t, o) = read_tenant_since(&f, 0, 1 << 20).unwrap();
        assert_eq!((t.as_str(), o), ("a\nb\n", 4));
        std::fs::write(&f, "a\nb\npartial\nc\n").unwrap();
        let (t, o) = read_tenant_since(&f, o, 1 << 20).unwrap();
        assert_eq!((t.as_str(), o), ("partial\nc\n", 14));
        std::fs::write(&f, "x\n").unwrap();
        assert_eq!(read_tenant_since(&f, o, 1 << 20).unwrap(), ("x\n".to_string(), 2), "shrank: from the start");
        std::fs::write(&f, "0123456789\nabc\n").unwrap();
        assert_eq!(read_tenant_since(&f, 0, 6).unwrap().0, "abc\n", "the last bytes, in whole lines");
        let l = d.path().join("link");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        assert!(read_tenant_since(&l, 0, 10).is_err());
    }
}
