//! Durable state: SQLite in WAL mode with versioned migrations.
//!
//! L23: every state change and the effects it causes are committed in one transaction
//! (`Store::commit`) before they are reported or executed. Effects that touch the world
//! (launch, stop) go to an outbox that is emptied only after they were carried out, so a
//! server killed in between finishes them after a restart (effects are idempotent).
//! Lifecycle log lines (L22) are written in the same transaction as the state they
//! describe.

pub mod backup;
pub mod filter;

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, Transaction};
use trainyard_core::{Effect, Job, Micros};

pub mod usage;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open { path: PathBuf, source: rusqlite::Error },
    #[error("database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("encoding a record: {0}")]
    Encode(serde_json::Error),
    #[error("the database has schema version {found}, newer than this Trainyard knows ({known})")]
    TooNew { found: i64, known: i64 },
    /// The thread that owned the store panicked.
    #[error("the thread that owned the store panicked")]
    Panicked,
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    fn sqlite_code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            StoreError::Sql(rusqlite::Error::SqliteFailure(e, _)) | StoreError::Open { source: rusqlite::Error::SqliteFailure(e, _), .. } => {
                Some(e.code)
            }
            _ => None,
        }
    }

    /// A condition that may pass by itself (a full disk, an I/O error, a lock held by
    /// another process): the same write may succeed later, and nothing was changed.
    pub fn is_transient(&self) -> bool {
        use rusqlite::ErrorCode::*;
        matches!(
            self.sqlite_code(),
            Some(DiskFull | SystemIoFailure | DatabaseBusy | DatabaseLocked | OutOfMemory | CannotOpen | ReadOnly)
        )
    }

    /// What went wrong, in a person's words, for a 503 and the health check.
    pub fn reason(&self) -> String {
        use rusqlite::ErrorCode::*;
        match self.sqlite_code() {
            Some(DiskFull) => format!("the disk is full: {self}"),
            Some(SystemIoFailure) => format!("the disk cannot be written: {self}"),
            Some(ReadOnly) => format!("the database is read-only: {self}"),
            Some(DatabaseBusy | DatabaseLocked) => format!("the database is locked by another process: {self}"),
            _ => format!("the job store failed: {self}"),
        }
    }
}

/// Schema migrations, applied in order; `PRAGMA user_version` counts how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: jobs, labels, outbox, lifecycle events, operations.
    "CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        project TEXT NOT NULL,
        region TEXT NOT NULL,
        display_name TEXT NOT NULL,
        state TEXT NOT NULL,
        create_time INTEGER NOT NULL,
        update_time INTEGER NOT NULL,
        terminal INTEGER NOT NULL DEFAULT 0,
        resource TEXT NOT NULL,
        core TEXT NOT NULL
     );
     CREATE INDEX jobs_by_parent ON jobs(kind, project, region, id DESC);
     CREATE INDEX jobs_active ON jobs(terminal) WHERE terminal = 0;
     CREATE TABLE labels (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (job_id, key)
     );
     CREATE INDEX labels_by_key ON labels(key, value);
     CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        effect TEXT NOT NULL
     );
     CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        time INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        replica TEXT,
        text TEXT NOT NULL
     );
     CREATE INDEX events_by_job ON events(job_id, seq);
     CREATE TABLE operations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        project TEXT NOT NULL,
        region TEXT NOT NULL,
        body TEXT NOT NULL
     );
     CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    // 2: filters on a display name or a state read only the matching rows, newest first.
    "CREATE INDEX jobs_by_name ON jobs(kind, project, region, display_name);
     CREATE INDEX jobs_by_state ON jobs(kind, project, region, state);",
    // 3: the format of each record's `core` (so that a later release converts old records
    // instead of misreading them), and the damage found in a quarantined record.
    "ALTER TABLE jobs ADD COLUMN format INTEGER NOT NULL DEFAULT 1;
     ALTER TABLE jobs ADD COLUMN damage TEXT;",
    // 4: usage accounting: what each project's jobs reserved and used, per accelerator type
    // and hour (kept apart from the jobs: deleting a job or its logs keeps its usage).
    "CREATE TABLE usage (
        project TEXT NOT NULL,
        accelerator TEXT NOT NULL,
        hour INTEGER NOT NULL,
        cpu_seconds REAL NOT NULL DEFAULT 0,
        accelerator_seconds REAL NOT NULL DEFAULT 0,
        memory_gb_seconds REAL NOT NULL DEFAULT 0,
        used_cpu_seconds REAL NOT NULL DEFAULT 0,
        used_memory_gb_seconds REAL NOT NULL DEFAULT 0,
        succeeded INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        cancelled INTEGER NOT NULL DEFAULT 0,
        preemptions INTEGER NOT NULL DEFAULT 0,
        lost_accelerator_seconds REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (project, accelerator, hour)
     );",
];

/// The format of the `core` records this release writes and reads.
pub const CORE_FORMAT: i64 = 1;

/// The columns `query_jobs` reads, in its order.
const JOB_COLUMNS: &str = "id, kind, resource, core, project, region, create_time, display_name, format";

/// A job as stored: the resource the user sent (JSON, output fields cleared) and the
/// lifecycle state.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredJob {
    pub kind: String,
    pub resource: String,
    pub job: Job,
    pub display_name: String,
    /// The record could not be read: `job` is a FAILED stand-in naming the damage
    /// (`Job::damaged`), so that it is listed, shown and deletable.
    pub damage: Option<String>,
}

/// One lifecycle log line (L22).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub seq: i64,
    pub time: Micros,
    pub attempt: u32,
    pub replica: Option<String>,
    pub text: String,
}

/// A new job to insert; `make` builds its lifecycle state once the id is known.
pub struct NewJob<'a> {
    pub kind: &'a str,
    pub project: &'a str,
    pub region: &'a str,
    pub display_name: &'a str,
    pub labels: &'a [(String, String)],
    pub resource: &'a str,
}

/// What [`Store::commit_other_ops`] writes: the state column, whether the resource needs
/// nothing more of the driver (`terminal`), its `core` record and operation bodies.
pub struct OtherState {
    pub state: String,
    pub terminal: bool,
    pub core: String,
    pub ops: Vec<(u64, String)>,
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
}

fn terminal_flag(job: &Job) -> i64 {
    i64::from(job.is_terminal())
}

fn encode<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(StoreError::Encode)
}

/// The newest `update_time` of any job in the database at `path`, read without writing
/// anything (None when there is no database or no job yet).
pub fn newest_update(path: &Path) -> Result<Option<Micros>> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
    let has_jobs: i64 = conn.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'", [], |r| r.get(0))?;
    if has_jobs == 0 {
        return Ok(None);
    }
    Ok(conn.query_row("SELECT max(update_time) FROM jobs", [], |r| r.get(0))?)
}

impl Store {
    /// Open (creating if needed) and migrate the database at `path`.
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path).map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
        let mut store = Store { conn, path: path.to_owned() };
        // A newer release's database is refused before anything is written to it (not
        // even the journal mode).
        let version = store.refuse_newer()?;
        store.configure()?;
        store.migrate(version)?;
        Ok(store)
    }

    /// A second connection to the same database, for readers.
    pub fn reopen(&self) -> Result<Store> {
        Store::open(&self.path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn configure(&mut self) -> Result<()> {
        // WAL: readers do not block the writer. synchronous=FULL: a commit is on disk
        // before it returns (L23), even across a power cut.
        self.conn.pragma_update(None, "journal_mode", "WAL")?;
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        self.conn.busy_timeout(std::time::Duration::from_secs(10))?;
        Ok(())
    }

    /// The database's schema version, refused if newer than this build knows.
    fn refuse_newer(&self) -> Result<i64> {
        let version: i64 = self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew { found: version, known });
        }
        Ok(version)
    }

    /// The migrations after `version` (read by `refuse_newer`), each in a transaction.
    fn migrate(&mut self, version: i64) -> Result<()> {
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = self.conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", i as i64 + 1)?;
            tx.commit()?;
        }
        Ok(())
    }

    /// A small durable write, to learn whether the store can be written again.
    pub fn probe_write(&mut self, now: Micros) -> Result<()> {
        self.set_meta("probe", &now.to_string())
    }

    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// Insert a new job and its "queued" log line in one transaction; returns the job.
    pub fn insert_job(&mut self, new: &NewJob<'_>, make: impl FnOnce(u64) -> Job) -> Result<Job> {
        let tx = self.conn.transaction()?;
        let job = insert_new(&tx, new, make)?;
        tx.commit()?;
        Ok(job)
    }

    /// Group commit: insert several new jobs, each with its "queued" log line, in one
    /// transaction (one fsync for all of them). `make(i, id)` builds the lifecycle state of
    /// `news[i]` once its id is known. All or none are stored.
    pub fn insert_jobs(&mut self, news: &[NewJob<'_>], mut make: impl FnMut(usize, u64) -> Job) -> Result<Vec<Job>> {
        let tx = self.conn.transaction()?;
        let mut out = Vec::with_capacity(news.len());
        for (i, new) in news.iter().enumerate() {
            out.push(insert_new(&tx, new, |id| make(i, id))?);
        }
        tx.commit()?;
        Ok(out)
    }

    /// L23: commit the job's new state, its lifecycle log lines and its world effects in
    /// one transaction. Returns the outbox entries to execute, in order.
    pub fn commit(&mut self, job: &Job, effects: &[Effect], now: Micros) -> Result<Vec<(i64, Effect)>> {
        let tx = self.conn.transaction()?;
        let outbox = write_job(&tx, job, effects, now)?;
        tx.commit()?;
        Ok(outbox)
    }

    /// Several jobs' transitions in one transaction (one fsync for all: a scheduling
    /// round, replicas that started or ended together). Returns each job's outbox entries,
    /// in the order of `batch`.
    pub fn commit_many(&mut self, batch: &[(&Job, &[Effect])], now: Micros) -> Result<Vec<Vec<(i64, Effect)>>> {
        let tx = self.conn.transaction()?;
        let mut outboxes = Vec::with_capacity(batch.len());
        for (job, effects) in batch {
            outboxes.push(write_job(&tx, job, effects, now)?);
        }
        tx.commit()?;
        Ok(outboxes)
    }

    /// An effect was carried out: drop it from the outbox.
    pub fn outbox_done(&mut self, seq: i64) -> Result<()> {
        self.conn.execute("DELETE FROM outbox WHERE seq = ?1", params![seq])?;
        Ok(())
    }

    /// Several effects were carried out: drop them in one transaction, not synced to disk
    /// by itself (the next commit's sync carries it). Lost in a crash, the effects are
    /// carried out again at the start, as they would be had the crash come just before
    /// this: carrying out an effect again is always safe (a launch of a run whose
    /// supervisor exists only watches it; see the outbox's recovery).
    pub fn outbox_done_many(&mut self, seqs: &[i64]) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let done = (|| {
            let tx = self.conn.transaction()?;
            {
                let mut st = tx.prepare_cached("DELETE FROM outbox WHERE seq = ?1")?;
                for s in seqs {
                    st.execute(params![s])?;
                }
            }
            tx.commit()
        })();
        // Every other commit is synced before it returns (L23).
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        done?;
        Ok(())
    }

    /// Effects committed but not yet carried out (after a crash), in order; and the
    /// entries that cannot be read, with what is wrong with them.
    #[allow(clippy::type_complexity)]
    pub fn pending_outbox(&self) -> Result<(Vec<(i64, u64, Effect)>, Vec<(i64, u64, String)>)> {
        let mut st = self.conn.prepare("SELECT seq, job_id, effect FROM outbox ORDER BY seq")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))?;
        let (mut out, mut damaged) = (Vec::new(), Vec::new());
        for row in rows {
            let (seq, job, text) = row?;
            match serde_json::from_str(&text) {
                Ok(effect) => out.push((seq, job as u64, effect)),
                Err(e) => damaged.push((seq, job as u64, e.to_string())),
            }
        }
        Ok((out, damaged))
    }

    /// Every CustomJob that is not terminal, oldest first.
    pub fn active_jobs(&self) -> Result<Vec<StoredJob>> {
        self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE terminal = 0 AND kind = 'custom' ORDER BY id"), [])
    }

    /// Insert a resource of another kind (a HyperparameterTuningJob) whose state is an
    /// opaque JSON text made once the id is known. Returns the id.
    pub fn insert_other(&mut self, new: &NewJob<'_>, state: &str, now: Micros, make: impl FnOnce(u64) -> String) -> Result<u64> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, '')",
            params![new.kind, new.project, new.region, new.display_name, state, now, new.resource],
        )?;
        let id = tx.last_insert_rowid() as u64;
        tx.execute("UPDATE jobs SET core = ?2 WHERE id = ?1", params![id as i64, make(id)])?;
        for (k, v) in new.labels {
            tx.execute("INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)", params![id as i64, k, v])?;
        }
        tx.commit()?;
        Ok(id)
    }

    /// Commit the state of a resource of another kind, with log lines, in one transaction.
    pub fn commit_other(&mut self, id: u64, state: &str, terminal: bool, core: &str, now: Micros, lines: &[String]) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1",
            params![id as i64, state, now, i64::from(terminal), core],
        )?;
        for l in lines {
            insert_event(&tx, id, now, 0, None, l)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Commit the state of a resource of another kind together with long-running
    /// operations, in one transaction: `new_ops` operations are created under `project`
    /// and `region`, and `make` gets their ids and returns the resource's new state with
    /// the bodies of operations to write, new or existing (or None to write nothing). So
    /// an operation that answers a change is stored with the change, and an operation's
    /// id can be kept in the state. Returns the ids of the new operations, or None,
    /// writing nothing, when `make` said so or there is no such resource.
    pub fn commit_other_ops(
        &mut self,
        id: u64,
        (project, region): (&str, &str),
        now: Micros,
        new_ops: usize,
        make: impl FnOnce(&[u64]) -> Result<Option<OtherState>>,
    ) -> Result<Option<Vec<u64>>> {
        let tx = self.conn.transaction()?;
        let mut ids = Vec::with_capacity(new_ops);
        for _ in 0..new_ops {
            tx.execute("INSERT INTO operations (project, region, body) VALUES (?1, ?2, '')", params![project, region])?;
            ids.push(tx.last_insert_rowid() as u64);
        }
        // None from `make`: nothing to write (dropping the transaction rolls back).
        let Some(OtherState { state, terminal, core, ops }) = make(&ids)? else { return Ok(None) };
        let n = tx.execute(
            "UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1",
            params![id as i64, state, now, i64::from(terminal), core],
        )?;
        if n != 1 {
            // Dropping the transaction rolls the new operations back.
            return Ok(None);
        }
        for (op, body) in ops {
            tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", params![op as i64, body])?;
        }
        tx.commit()?;
        Ok(Some(ids))
    }

    /// Delete a resource of another kind whatever its state, with its labels and log lines,
    /// and write `ops` (operations it leaves answered) in the same transaction. False,
    /// changing nothing, when there is no such resource.
    pub fn delete_other(&mut self, kind: &str, project: &str, region: &str, id: u64, ops: &[(u64, String)]) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4",
            params![id as i64, kind, project, region],
        )?;
        if n != 1 {
            return Ok(false);
        }
        for (op, body) in ops {
            tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", params![*op as i64, body])?;
        }
        tx.commit()?;
        Ok(true)
    }

    /// The newest row of another kind with this display name under its parent.
    pub fn find_other_by_name(&self, kind: &str, project: &str, region: &str, display_name: &str) -> Result<Option<(u64, String, String)>> {
        Ok(self
            .query_other(
                "SELECT id, resource, core FROM jobs WHERE kind = ?1 AND project = ?2 AND region = ?3 AND display_name = ?4 ORDER BY id DESC LIMIT 1",
                params![kind, project, region, display_name],
            )?
            .pop())
    }

    /// Quarantine a record of another kind that cannot be read: terminal, FAILED, with the
    /// damage named in `damage` and in a log line (its record is kept as it is).
    pub fn quarantine_other(&mut self, id: u64, damage: &str, now: Micros) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE jobs SET state = 'JOB_STATE_FAILED', update_time = ?2, terminal = 1, damage = ?3 WHERE id = ?1",
            params![id as i64, now, damage],
        )?;
        insert_event(&tx, id, now, 0, None, &format!("Internal error: the stored record of this job is damaged and cannot be read ({damage})."))?;
        tx.commit()?;
        Ok(())
    }

    /// Rows of another kind: (id, resource, core), the live ones or one by id and parent.
    pub fn active_other(&self, kind: &str) -> Result<Vec<(u64, String, String)>> {
        self.query_other("SELECT id, resource, core FROM jobs WHERE terminal = 0 AND kind = ?1 ORDER BY id", params![kind])
    }

    pub fn get_other(&self, kind: &str, project: &str, region: &str, id: u64) -> Result<Option<(u64, String, String)>> {
        Ok(self
            .query_other(
                "SELECT id, resource, core FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4",
                params![id as i64, kind, project, region],
            )?
            .pop())
    }

    /// A page of rows of another kind, newest first (as `list_jobs`).
    pub fn list_other(
        &self,
        kind: &str,
        project: &str,
        region: &str,
        filter: Option<(&str, &[rusqlite::types::Value])>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>> {
        let (cond, values) = page_condition(kind, project, region, filter, before, limit);
        self.query_other(&format!("SELECT id, resource, core FROM jobs {cond}"), rusqlite::params_from_iter(values))
    }

    fn query_other<P: rusqlite::Params>(&self, sql: &str, params: P) -> Result<Vec<(u64, String, String)>> {
        let mut st = self.conn.prepare_cached(sql)?;
        let rows = st.query_map(params, |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// One job, if it exists under this project and region (L: another project's job is
    /// simply not found).
    pub fn get_job(&self, kind: &str, project: &str, region: &str, id: u64) -> Result<Option<StoredJob>> {
        let mut v = self.query_jobs(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4"),
            params![id as i64, kind, project, region],
        )?;
        Ok(v.pop())
    }

    pub fn get_job_by_id(&self, id: u64) -> Result<Option<StoredJob>> {
        let mut v = self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"), params![id as i64])?;
        Ok(v.pop())
    }

    /// A page of jobs, newest first, with ids below `before` (the page token's position).
    /// `filter` is an SQL condition over the columns of `jobs` (built by the API layer
    /// from a parsed filter, with its own parameters).
    pub fn list_jobs(
        &self,
        kind: &str,
        project: &str,
        region: &str,
        filter: Option<(&str, &[rusqlite::types::Value])>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredJob>> {
        let (cond, values) = page_condition(kind, project, region, filter, before, limit);
        self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs {cond}"), rusqlite::params_from_iter(values))
    }

    /// Rows as jobs; a row whose record cannot be read is returned as a FAILED stand-in
    /// naming the damage, never as an error that would hide the rows around it.
    fn query_jobs<P: rusqlite::Params>(&self, sql: &str, params: P) -> Result<Vec<StoredJob>> {
        let mut st = self.conn.prepare_cached(sql)?;
        let rows = st.query_map(params, |r| {
            Ok(RawJob {
                id: r.get::<_, i64>(0)? as u64,
                kind: r.get(1)?,
                resource: r.get(2)?,
                core: r.get(3)?,
                project: r.get(4)?,
                region: r.get(5)?,
                create_time: r.get(6)?,
                display_name: r.get(7)?,
                format: r.get(8)?,
            })
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?.decode());
        }
        Ok(out)
    }

    /// Quarantine a record that cannot be read or run: the job is stored FAILED with the
    /// damage named (the stand-in of `Job::damaged`), the damaged text kept in `damage`,
    /// and a log line says what happened. Returns the stand-in.
    pub fn quarantine(&mut self, id: u64, damage: &str, now: Micros) -> Result<Option<Job>> {
        let tx = self.conn.transaction()?;
        let row = tx
            .query_row(
                "SELECT project, region, create_time, core, resource FROM jobs WHERE id = ?1",
                params![id as i64],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?, r.get::<_, String>(4)?)),
            )
            .optional()?;
        let Some((project, region, create_time, core, resource)) = row else { return Ok(None) };
        let job = Job::damaged(id, project, region, create_time, now, damage);
        let kept: String = format!("core: {core}\nresource: {resource}").chars().take(4096).collect();
        tx.execute(
            "UPDATE jobs SET state = ?2, update_time = ?3, terminal = 1, core = ?4, format = ?5, damage = ?6 WHERE id = ?1",
            params![id as i64, job.state().wire_name(), now, encode(&job)?, CORE_FORMAT, kept],
        )?;
        let text = job.error().map(|e| e.message.clone()).unwrap_or_default();
        insert_event(&tx, id, now, 0, None, &text)?;
        tx.commit()?;
        Ok(Some(job))
    }

    /// Delete a terminal resource of `kind` under its parent, with its labels and log
    /// lines, in one transaction with the done Operation that answers the delete
    /// (`make_op(opid)` writes its body) and the outbox entry that purges its files (L23:
    /// a server killed after the commit purges them after its restart). Returns the
    /// Operation's body and the outbox entry, or None, changing nothing, when there is no
    /// such terminal resource.
    pub fn delete_terminal(
        &mut self,
        kind: &str,
        project: &str,
        region: &str,
        id: u64,
        make_op: impl FnOnce(u64) -> String,
    ) -> Result<Option<(String, (i64, Effect))>> {
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4 AND terminal = 1",
            params![id as i64, kind, project, region],
        )?;
        if n != 1 {
            return Ok(None);
        }
        tx.execute("INSERT INTO operations (project, region, body) VALUES (?1, ?2, '')", params![project, region])?;
        let opid = tx.last_insert_rowid() as u64;
        let body = make_op(opid);
        tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", params![opid as i64, body])?;
        let purge = Effect::Purge { job: id };
        tx.execute("INSERT INTO outbox (job_id, effect) VALUES (?1, ?2)", params![id as i64, encode(&purge)?])?;
        let seq = tx.last_insert_rowid();
        tx.commit()?;
        Ok(Some((body, (seq, purge))))
    }

    /// Lifecycle log lines of a job after `after_seq`.
    pub fn events(&self, job: u64, after_seq: i64) -> Result<Vec<EventRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, time, attempt, replica, text FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq",
        )?;
        let rows = st.query_map(params![job as i64, after_seq], |r| {
            Ok(EventRow {
                seq: r.get(0)?,
                time: r.get(1)?,
                attempt: r.get::<_, i64>(2)? as u32,
                replica: r.get(3)?,
                text: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    pub fn get_operation(&self, project: &str, region: &str, id: u64) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT body FROM operations WHERE id = ?1 AND project = ?2 AND region = ?3",
                params![id as i64, project, region],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Ids of resources of `kind` that ended after `after` and at or before `upto`
    /// (their last update is their end).
    pub fn ended_between(&self, kind: &str, after: Micros, upto: Micros) -> Result<Vec<u64>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM jobs WHERE kind = ?1 AND terminal = 1 AND update_time > ?2 AND update_time <= ?3 ORDER BY id")?;
        let ids = stmt.query_map(params![kind, after, upto], |r| r.get::<_, i64>(0))?.collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(ids.into_iter().map(|i| i as u64).collect())
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = ?1", params![key], |r| r.get(0)).optional()?)
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    /// The uid of `project`'s replicas: assigned once, the next unused one of
    /// `first..=last`, and kept (meta keys `project_uid/<project>` and
    /// `project_uid_next`). `None` when the range is used up.
    pub fn project_uid(&mut self, project: &str, first: u32, last: u32) -> Result<Option<u32>> {
        let key = format!("project_uid/{project}");
        let tx = self.conn.transaction()?;
        let get = |k: &str| tx.query_row("SELECT value FROM meta WHERE key = ?1", params![k], |r| r.get::<_, String>(0)).optional();
        if let Some(uid) = get(&key)?.and_then(|v| v.parse::<u32>().ok()) {
            return Ok(Some(uid));
        }
        let next = get("project_uid_next")?.and_then(|v| v.parse::<u32>().ok()).unwrap_or(first).max(first);
        if next > last {
            return Ok(None);
        }
        let set = "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value";
        tx.execute(set, params![key, next.to_string()])?;
        tx.execute(set, params!["project_uid_next", (next as u64 + 1).to_string()])?;
        tx.commit()?;
        Ok(Some(next))
    }

    /// For bulk loading in benchmarks and tests: run `f` inside one transaction.
    pub fn with_transaction<T>(&mut self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let tx = self.conn.transaction()?;
        let v = f(&tx)?;
        tx.commit()?;
        Ok(v)
    }
}

/// A row of `jobs` as read, before its record is decoded.
struct RawJob {
    id: u64,
    kind: String,
    resource: String,
    core: String,
    project: String,
    region: String,
    create_time: i64,
    display_name: String,
    format: i64,
}

impl RawJob {
    fn decode(self) -> StoredJob {
        let parsed = if self.format != CORE_FORMAT {
            Err(format!("record format {} is not one this release reads ({CORE_FORMAT})", self.format))
        } else {
            serde_json::from_str::<Job>(&self.core).map_err(|e| format!("record of job {}: {e}", self.id))
        };
        match parsed {
            Ok(job) => StoredJob { kind: self.kind, resource: self.resource, job, display_name: self.display_name, damage: None },
            Err(damage) => {
                let job = Job::damaged(self.id, self.project, self.region, self.create_time, self.create_time, &damage);
                StoredJob { kind: self.kind, resource: self.resource, job, display_name: self.display_name, damage: Some(damage) }
            }
        }
    }
}

/// `WHERE ... ORDER BY id DESC LIMIT ?` of one page: the kind, project and region, the
/// position of a page token (`id < before`), and a compiled filter with its parameters.
fn page_condition(
    kind: &str,
    project: &str,
    region: &str,
    filter: Option<(&str, &[rusqlite::types::Value])>,
    before: Option<u64>,
    limit: usize,
) -> (String, Vec<rusqlite::types::Value>) {
    let mut sql = String::from("WHERE kind = ? AND project = ? AND region = ?");
    let mut values: Vec<rusqlite::types::Value> = vec![kind.to_string().into(), project.to_string().into(), region.to_string().into()];
    if let Some(b) = before {
        sql.push_str(" AND id < ?");
        values.push((b as i64).into());
    }
    if let Some((cond, params)) = filter {
        sql.push_str(" AND (");
        sql.push_str(cond);
        sql.push(')');
        values.extend(params.iter().cloned());
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?");
    values.push((limit as i64).into());
    (sql, values)
}

/// One new job row, its labels and its "queued" log line, inside `tx`.
fn insert_new(tx: &Transaction<'_>, new: &NewJob<'_>, make: impl FnOnce(u64) -> Job) -> Result<Job> {
    tx.prepare_cached(
        "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
         VALUES (?1, ?2, ?3, ?4, '', 0, 0, ?5, '')",
    )?
    .execute(params![new.kind, new.project, new.region, new.display_name, new.resource])?;
    let id = tx.last_insert_rowid() as u64;
    let job = make(id);
    tx.prepare_cached("UPDATE jobs SET state = ?2, create_time = ?3, update_time = ?4, core = ?5 WHERE id = ?1")?.execute(
        params![id as i64, job.state().wire_name(), job.create_time, job.update_time, encode(&job)?],
    )?;
    for (k, v) in new.labels {
        tx.prepare_cached("INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)")?.execute(params![id as i64, k, v])?;
    }
    insert_event(tx, id, job.create_time, 0, None, "L3: Job queued.")?;
    Ok(job)
}

fn insert_event(tx: &Transaction<'_>, job: u64, time: Micros, attempt: u32, replica: Option<&str>, text: &str) -> Result<()> {
    tx.prepare_cached("INSERT INTO events (job_id, time, attempt, replica, text) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![job as i64, time, attempt, replica, text])?;
    Ok(())
}

fn write_job(tx: &Transaction<'_>, job: &Job, effects: &[Effect], now: Micros) -> Result<Vec<(i64, Effect)>> {
    tx.prepare_cached("UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1")?.execute(params![
        job.id as i64,
        job.state().wire_name(),
        job.update_time,
        terminal_flag(job),
        encode(job)?
    ])?;
    let mut outbox = Vec::new();
    for e in effects {
        match e {
            Effect::Log(line) => insert_event(tx, job.id, now, line.attempt, line.replica.as_deref(), &line.text)?,
            other => {
                tx.execute(
                    "INSERT INTO outbox (job_id, effect) VALUES (?1, ?2)",
                    params![job.id as i64, encode(other)?],
                )?;
                outbox.push((tx.last_insert_rowid(), other.clone()));
            }
        }
    }
    Ok(outbox)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::job::{Demand, Policy};
    use trainyard_core::{Event, Settings};

    pub(crate) fn new_job(store: &mut Store, project: &str) -> Job {
        let s = Settings::default();
        store
            .insert_job(
                &NewJob {
                    kind: "custom",
                    project,
                    region: "us-central1",
                    display_name: "d",
                    labels: &[("team".into(), "nlp".into())],
                    resource: "{}",
                },
                |id| Job::new(id, project.into(), "us-central1".into(), &[1], Demand::default(), Policy::defaults(&s), false, 5),
            )
            .unwrap()
    }

    /// L23: a committed transition, its log lines and its outbox survive a reopen.
    #[test]
    fn l23_commit_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut store = Store::open(&path).unwrap();
        let job = new_job(&mut store, "p");
        assert_eq!(job.id, 1);
        let s = Settings::default();
        let t = trainyard_core::step(&job, Event::Place { nodes: vec!["local".into()], addresses: vec!["127.0.0.2:20000".into()], notes: vec![] }, 10, &s)
            .unwrap();
        let outbox = store.commit(&t.job, &t.effects, 10).unwrap();
        assert_eq!(outbox.len(), 1);
        drop(store);
        let store = Store::open(&path).unwrap();
        let active = store.active_jobs().unwrap();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].job, t.job);
        let pending = store.pending_outbox().unwrap().0;
        assert_eq!(pending.len(), 1);
        assert!(matches!(pending[0].2, Effect::Launch { .. }));
        let ev = store.events(1, 0).unwrap();
        let texts: Vec<&str> = ev.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts[0], "L3: Job queued.");
        assert!(texts.iter().any(|t| t.contains("admitted")));
    }

    /// Ids are never reused, even after a delete.
    #[test]
    fn ids_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("t.db")).unwrap();
        let a = new_job(&mut store, "p");
        let s = Settings::default();
        let t = trainyard_core::step(&a, Event::Cancel, 6, &s).unwrap();
        store.commit(&t.job, &t.effects, 6).unwrap();
        assert!(store.delete_terminal("custom", "p", "us-central1", a.id, |_| "{}".into()).unwrap().is_some());
        let b = new_job(&mut store, "p");
        assert!(b.id > a.id);
        assert!(store.events(a.id, 0).unwrap().is_empty(), "its log lines went with it");
    }

    /// Deleting a job that is not terminal changes nothing.
    #[test]
    fn delete_refuses_live_job() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("t.db")).unwrap();
        let a = new_job(&mut store, "p");
        assert!(store.delete_terminal("custom", "p", "us-central1", a.id, |_| "{}".into()).unwrap().is_none());
        assert!(store.get_job_by_id(a.id).unwrap().is_some());
    }

    /// Another project's job is not found.
    #[test]
    fn get_is_scoped_to_project() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("t.db")).unwrap();
        let a = new_job(&mut store, "p");
        assert!(store.get_job("custom", "p", "us-central1", a.id).unwrap().is_some());
        assert!(store.get_job("custom", "q", "us-central1", a.id).unwrap().is_none());
        assert!(store.get_job("custom", "p", "europe-west4", a.id).unwrap().is_none());
    }

    #[test]
    fn list_newest_first_with_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("t.db")).unwrap();
        for _ in 0..5 {
            new_job(&mut store, "p");
        }
        new_job(&mut store, "q");
        let page = store.list_jobs("custom", "p", "us-central1", None, None, 2).unwrap();
        assert_eq!(page.iter().map(|j| j.job.id).collect::<Vec<_>>(), [5, 4]);
        let page = store.list_jobs("custom", "p", "us-central1", None, Some(4), 10).unwrap();
        assert_eq!(page.iter().map(|j| j.job.id).collect::<Vec<_>>(), [3, 2, 1]);
    }

    /// A database made by the first schema version is migrated forward and keeps its jobs.
    #[test]
    fn old_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
                 VALUES ('custom', 'p', 'r', 'old', 'JOB_STATE_SUCCEEDED', 1, 1, '{}', '{}')",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let n: i64 = store.conn.query_row("SELECT count(*) FROM jobs WHERE display_name = 'old'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        let plan: String = store
            .conn
            .query_row("EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE kind='custom' AND project='p' AND region='r' AND display_name='x' ORDER BY id DESC", [], |r| r.get(3))
            .unwrap();
        assert!(plan.contains("jobs_by_name"), "{plan}");
    }

    /// A database written by a newer Trainyard is refused, not damaged.
    #[test]
    fn newer_schema_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
        assert!(matches!(Store::open(&path), Err(StoreError::TooNew { found: 99, .. })));
    }
}
