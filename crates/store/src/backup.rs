//! Online backup and restore of the database. A backup is SQLite's online backup API run
//! from a connection of its own: all pages are copied in one step, under one read
//! transaction, so the copy is the database as it was at one moment, while the server's
//! writer goes on (WAL: readers do not block it). Never a copy of the live file, which a
//! concurrent commit would tear. The copy is written beside its target, synced, and
//! linked into place only if nothing is there (a backup never overwrites a file).
//!
//! A restore checks the backup (SQLite's `quick_check`, a Trainyard schema this build
//! knows), copies it into a new data directory the same way, and migrates it to this
//! build's schema: a server started on that directory has every job, study and pipeline,
//! and recovers running jobs by L23's rules (replicas still running are adopted, the
//! others are lost and restarted or ended by the rules).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use crate::{Store, MIGRATIONS};

/// The database's file name in a data directory.
pub const DB_FILE: &str = "trainyard.db";

/// How long a copy waits for a lock held by another connection (a checkpoint).
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Pages copied per step (1 MB of 4 KB pages), each step synced to disk, then a pause that
/// lets the server's own commits through.
const STEP_PAGES: std::os::raw::c_int = 256;
const STEP_PAUSE: Duration = Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0} exists already: a backup never overwrites a file")]
    Exists(PathBuf),
    #[error("{0} is not an absolute path")]
    Relative(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("copying the database to {path}: {source}")]
    Sql { path: PathBuf, source: rusqlite::Error },
    #[error("{path} is not a Trainyard backup: {why}")]
    NotABackup { path: PathBuf, why: String },
    #[error("{path} was written by a newer Trainyard (schema version {found}; this one knows up to {known})")]
    TooNew { path: PathBuf, found: i64, known: i64 },
    #[error("{0} is not empty: a restore makes a new data directory")]
    NotEmpty(PathBuf),
    /// `admin backup` copies an SQLite store; PostgreSQL has its own tools.
    #[error("the store is PostgreSQL ({0}): back it up with PostgreSQL's own tools (pg_dump, or continuous archiving); `trainyard admin backup` copies an SQLite store")]
    NotSqlite(String),
    #[error("migrating the restored database: {0}")]
    Migrate(#[from] crate::StoreError),
}

/// What a copy holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Copied {
    pub path: PathBuf,
    pub bytes: u64,
    /// Jobs of every kind (CustomJobs, tuning jobs, pipelines).
    pub jobs: u64,
    pub schema_version: i64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io { path: path.to_path_buf(), source }
}

impl Store {
    /// A consistent copy of the database at `to` (absolute; nothing there yet), made while
    /// the server keeps writing. Returns what the copy holds.
    pub fn backup_to(&self, to: &Path) -> Result<Copied, BackupError> {
        if !to.is_absolute() {
            return Err(BackupError::Relative(to.to_path_buf()));
        }
        let Some(conn) = self.sqlite() else { return Err(BackupError::NotSqlite(self.location().to_string())) };
        copy_database(&conn, to, STEP_PAGES)
    }
}

/// Makes the new data directory `data_dir` (absent or empty) from the backup `from`,
/// migrated to this build's schema. Returns what it holds.
pub fn restore(from: &Path, data_dir: &Path) -> Result<Copied, BackupError> {
    let src = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| BackupError::NotABackup { path: from.to_path_buf(), why: e.to_string() })?;
    check_backup(&src, from)?;
    match fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::NotEmpty(data_dir.to_path_buf()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new().recursive(true).mode(0o700).create(data_dir).map_err(io(data_dir))?;
        }
        Err(e) => return Err(io(data_dir)(e)),
    }
    let db = data_dir.join(DB_FILE);
    copy_database(&src, &db, STEP_PAGES)?;
    drop(src);
    // An older schema is brought up to this build's, as a server's start would.
    let store = Store::open(&db)?;
    drop(store);
    // Readable by the owner alone (Store::open made it so; the files the close left too).
    crate::private_files(&db);
    summary(&db)
}

/// The file is a sound SQLite database with a Trainyard schema this build knows.
fn check_backup(src: &Connection, path: &Path) -> Result<(), BackupError> {
    let not = |why: String| BackupError::NotABackup { path: path.to_path_buf(), why };
    let check: String = src.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| not(e.to_string()))?;
    if check != "ok" {
        return Err(not(format!("the database is damaged ({check})")));
    }
    let version: i64 = src.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| not(e.to_string()))?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(BackupError::TooNew { path: path.to_path_buf(), found: version, known });
    }
    let has_jobs = crate::sqlite_has_jobs(src).map_err(|e| not(e.to_string()))?;
    if version < 1 || !has_jobs {
        return Err(not("it has no Trainyard tables".to_string()));
    }
    Ok(())
}

/// Copies the database of `src` to `to` in one backup step (one snapshot), written beside
/// `to`, synced, then linked to `to` only if nothing is there.
fn copy_database(src: &Connection, to: &Path, step_pages: std::os::raw::c_int) -> Result<Copied, BackupError> {
    if to.exists() {
        return Err(BackupError::Exists(to.to_path_buf()));
    }
    let dir = to.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(io(dir)(std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory")));
    }
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let partial = dir.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = fs::remove_file(&partial);
    let sql = |source| BackupError::Sql { path: to.to_path_buf(), source };
    let result = (|| {
        let mut dst = Connection::open(&partial).map_err(sql)?;
        // The copy goes to disk as it is made, 1 MB at a time: a large file's dirty
        // pages synced all at once would hold up every other fsync of the file system
        // (the server's commits) for as long (ext4 commits its journal for all).
        let synced = File::open(&partial).map_err(io(&partial))?;
        // One read transaction over every step: the copy is the database at one moment
        // while the writer goes on (WAL), and no step sees a newer one.
        src.execute_batch("BEGIN; SELECT count(*) FROM sqlite_master;").map_err(sql)?;
        let copied = (|| {
            let backup = Backup::new(src, &mut dst).map_err(sql)?;
            let started = Instant::now();
            loop {
                match backup.step(step_pages).map_err(sql)? {
                    StepResult::Done => break,
                    StepResult::More => {
                        synced.sync_data().map_err(io(&partial))?;
                        std::thread::sleep(STEP_PAUSE);
                    }
                    StepResult::Busy | StepResult::Locked if started.elapsed() < LOCK_WAIT => std::thread::sleep(Duration::from_millis(20)),
                    StepResult::Busy | StepResult::Locked => {
                        return Err(sql(rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                            Some(format!("the database stayed locked for {} s", LOCK_WAIT.as_secs())),
                        )))
                    }
                    _ => {}
                }
            }
            Ok(())
        })();
        let _ = src.execute_batch("COMMIT;");
        copied?;
        // What the writer appended meanwhile could not be checkpointed past the copy's
        // snapshot: copied into the database here, in the background, rather than by the
        // writer's next commit, which would wait for all of it.
        let _ = src.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        // One file (no journal beside it), then on disk before it is linked into place.
        dst.pragma_update(None, "journal_mode", "DELETE").map_err(sql)?;
        drop(dst);
        File::open(&partial).and_then(|f| f.sync_all()).map_err(io(&partial))?;
        match fs::hard_link(&partial, to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(BackupError::Exists(to.to_path_buf())),
            Err(e) => return Err(io(to)(e)),
        }
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        Ok(())
    })();
    let _ = fs::remove_file(&partial);
    result?;
    summary(to)
}

/// What the database at `path` holds.
fn summary(path: &Path) -> Result<Copied, BackupError> {
    let sql = |source| BackupError::Sql { path: path.to_path_buf(), source };
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sql)?;
    let jobs: i64 = conn.query_row("SELECT count(*) FROM jobs", [], |r| r.get(0)).map_err(sql)?;
    let schema_version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sql)?;
    let bytes = fs::metadata(path).map_err(io(path))?.len();
    Ok(Copied { path: path.to_path_buf(), bytes, jobs: jobs.max(0) as u64, schema_version })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(dir: &Path, jobs: usize) -> Store {
        let mut store = Store::open(&dir.join(DB_FILE)).unwrap();
        for _ in 0..jobs {
            crate::tests::new_job(&mut store, "p");
        }
        store
    }

    /// A backup taken while another connection keeps writing holds every job committed
    /// before it, restores into a new data directory, and opens as a store.
    #[test]
    fn backup_while_writing_then_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        let mut writer = filled(&live, 50);
        let reader = writer.reopen().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = std::sync::Arc::clone(&stop);
        let path = live.join(DB_FILE);
        let t = std::thread::spawn(move || {
            let mut w = Store::open(&path).unwrap();
            let mut n = 0;
            while !s2.load(std::sync::atomic::Ordering::SeqCst) {
                crate::tests::new_job(&mut w, "q");
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(50));
        // One page a step, each step after commits of the writer: the read transaction
        // held over the steps keeps the copy at one moment (no restart, no torn copy).
        let to = tmp.path().join("backup.db");
        let copied = copy_database(&reader.sqlite().unwrap(), &to, 1).unwrap();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let written = t.join().unwrap();
        crate::tests::new_job(&mut writer, "p");
        assert!(copied.jobs >= 50 && copied.jobs <= 50 + written, "{copied:?} ({written} written meanwhile)");
        assert_eq!(copied.schema_version, MIGRATIONS.len() as i64);
        let check: String = Connection::open(&to).unwrap().query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(check, "ok");

        // Never over a file, never from a relative path.
        assert!(matches!(reader.backup_to(&to), Err(BackupError::Exists(_))));
        assert!(matches!(reader.backup_to(Path::new("rel.db")), Err(BackupError::Relative(_))));

        let restored = tmp.path().join("restored");
        let r = restore(&to, &restored).unwrap();
        assert_eq!(r.jobs, copied.jobs);
        let store = Store::open(&restored.join(DB_FILE)).unwrap();
        assert_eq!(store.active_jobs().unwrap().len() as u64, copied.jobs);
        // Into a directory that is not empty: refused, nothing changed.
        let before = fs::read(restored.join(DB_FILE)).unwrap();
        assert!(matches!(restore(&to, &restored), Err(BackupError::NotEmpty(_))));
        assert_eq!(fs::read(restored.join(DB_FILE)).unwrap(), before);
    }

    /// A file that is not a sound Trainyard database is refused and nothing is made.
    #[test]
    fn corrupt_or_foreign_backups_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let junk = tmp.path().join("junk.db");
        fs::write(&junk, vec![7u8; 8192]).unwrap();
        let into = tmp.path().join("new");
        assert!(matches!(restore(&junk, &into), Err(BackupError::NotABackup { .. })), "{:?}", restore(&junk, &into));
        assert!(!into.exists());

        let foreign = tmp.path().join("foreign.db");
        Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE t (x); PRAGMA user_version = 1;").unwrap();
        assert!(matches!(restore(&foreign, &into), Err(BackupError::NotABackup { .. })));

        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        let store = filled(&live, 3);
        let newer = tmp.path().join("newer.db");
        store.backup_to(&newer).unwrap();
        Connection::open(&newer).unwrap().pragma_update(None, "user_version", 999).unwrap();
        assert!(matches!(restore(&newer, &into), Err(BackupError::TooNew { found: 999, .. })));

        // A damaged page: the check finds it.
        let damaged = tmp.path().join("damaged.db");
        store.backup_to(&damaged).unwrap();
        let mut bytes = fs::read(&damaged).unwrap();
        // Every page but the first (the schema): the tables' b-trees are garbage.
        for b in bytes.iter_mut().skip(4096) {
            *b = 0xA5;
        }
        fs::write(&damaged, bytes).unwrap();
        assert!(restore(&damaged, &into).is_err());
        assert!(!into.exists());
    }
}
