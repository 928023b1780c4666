//! Durable state: SQLite in WAL mode with versioned migrations.
//!
//! L23: every state change and the effects it causes are committed in one transaction
//! (`Store::commit`) before they are reported or executed. Effects that touch the world
//! (launch, stop) go to an outbox that is emptied only after they were carried out, so a
//! server killed in between finishes them after a restart (effects are idempotent).
//! Lifecycle log lines (L22) are written in the same transaction as the state they
//! describe.

pub mod backup;
pub mod db;
pub mod fence;
pub mod filter;
pub mod lease;
pub mod records;
pub mod sql;
pub mod usage;

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use trainyard_core::{Effect, Job, Micros};

pub use db::Location;
use db::{Exec, Pg, SqliteExec};
pub use sql::{Dialect, Value};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open { path: PathBuf, source: rusqlite::Error },
    #[error("database: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The PostgreSQL store cannot be reached.
    #[error("cannot connect to the store {location}: {}", pg_detail(.source))]
    Connect { location: String, source: postgres::Error },
    #[error("store: {}", pg_detail(.0))]
    Postgres(#[from] postgres::Error),
    /// A store URL that is not one.
    #[error("store URL {0}")]
    Url(String),
    #[error("encoding a record: {0}")]
    Encode(serde_json::Error),
    /// A row that does not hold what the store wrote.
    #[error("reading a row: {0}")]
    Decode(String),
    /// This server's lease of the store has passed to another server (a deposed leader).
    #[error("{0}")]
    Fenced(String),
    /// The leader's lease could not be renewed lately: nothing is written until it is
    /// (transient), or until another server takes it over (then [`StoreError::Fenced`]).
    #[error("this server's lease of the store (epoch {0}) could not be renewed lately; it writes nothing until it is")]
    LeaseLapsed(i64),
    /// What needs a PostgreSQL store was asked of SQLite (leases).
    #[error("{0} needs a PostgreSQL store")]
    NeedsPostgres(&'static str),
    #[error("the database has schema version {found}, newer than this Trainyard knows ({known})")]
    TooNew { found: i64, known: i64 },
    /// The thread that owned the store panicked.
    #[error("the thread that owned the store panicked")]
    Panicked,
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A PostgreSQL error with what its own text leaves out ("db error"): the server's
/// SQLSTATE and message, or the I/O error under "error connecting to server".
fn pg_detail(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl StoreError {
    fn sqlite_code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            StoreError::Sql(rusqlite::Error::SqliteFailure(e, _)) | StoreError::Open { source: rusqlite::Error::SqliteFailure(e, _), .. } => {
                Some(e.code)
            }
            _ => None,
        }
    }

    /// PostgreSQL's SQLSTATE, or "closed" for a connection that is gone.
    fn postgres_state(&self) -> Option<String> {
        match self {
            StoreError::Postgres(e) | StoreError::Connect { source: e, .. } => {
                Some(e.code().map(|c| c.code().to_string()).unwrap_or_else(|| "closed".into()))
            }
            _ => None,
        }
    }

    /// The connection to the database server is gone (it restarted, ended the session, or
    /// the network failed): the next statement needs a new one.
    pub(crate) fn connection_lost(&self) -> bool {
        self.postgres_state().is_some_and(|s| s == "closed" || s.starts_with("08") || matches!(s.as_str(), "57P01" | "57P02" | "57P03"))
    }

    /// A condition that may pass by itself (a full disk, an I/O error, a lock held by
    /// another process, a database server that restarts or cannot be reached): the same
    /// write may succeed later, and nothing was changed.
    pub fn is_transient(&self) -> bool {
        use rusqlite::ErrorCode::*;
        if let StoreError::LeaseLapsed(_) = self {
            return true;
        }
        if let Some(state) = self.postgres_state() {
            // No SQLSTATE: the connection is gone. 08: connection exceptions; 53: out of
            // resources (disk full, too many connections); 57P01-57P03: the server shuts
            // down or starts; 40001/40P01: a serialization failure or a deadlock.
            return state == "closed"
                || state.starts_with("08")
                || state.starts_with("53")
                || matches!(state.as_str(), "57P01" | "57P02" | "57P03" | "40001" | "40P01");
        }
        matches!(
            self.sqlite_code(),
            Some(DiskFull | SystemIoFailure | DatabaseBusy | DatabaseLocked | OutOfMemory | CannotOpen | ReadOnly)
        )
    }

    /// What went wrong, in a person's words, for a 503 and the health check.
    pub fn reason(&self) -> String {
        use rusqlite::ErrorCode::*;
        if let StoreError::Fenced(who) = self {
            return who.clone();
        }
        if let StoreError::LeaseLapsed(_) = self {
            return self.to_string();
        }
        if let Some(state) = self.postgres_state() {
            return match state.as_str() {
                "closed" => format!("the store cannot be reached: {self}"),
                s if s.starts_with("08") || s.starts_with("57P") => format!("the store cannot be reached: {self}"),
                "53100" => format!("the store's disk is full: {self}"),
                _ => format!("the job store failed: {self}"),
            };
        }
        match self.sqlite_code() {
            Some(DiskFull) => format!("the disk is full: {self}"),
            Some(SystemIoFailure) => format!("the disk cannot be written: {self}"),
            Some(ReadOnly) => format!("the database is read-only: {self}"),
            Some(DatabaseBusy | DatabaseLocked) => format!("the database is locked by another process: {self}"),
            _ => format!("the job store failed: {self}"),
        }
    }
}

/// The database and its WAL and shared-memory files readable by their owner alone, whatever
/// umask made them (a restore from a shell's 022; a copy made by hand): the directory may be
/// passable for the replicas' users (0711), so a file readable by others would be readable
/// by any of them by name. Best effort: a file that cannot be changed (not the caller's) is
/// left as it is, and `trainyard doctor` names it.
pub(crate) fn private_files(db: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = PathBuf::from(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
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
    // 5: the leader's lease (several servers on one PostgreSQL store; see `lease`).
    // SQLite keeps the table so that a version means the same tables in both.
    "CREATE TABLE leader_lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch INTEGER NOT NULL,
        holder TEXT NOT NULL,
        address TEXT NOT NULL,
        config TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        renewed_at INTEGER NOT NULL
     );",
    // 6: records (Vertex ML Metadata and TensorBoard resources: JSON by resource name,
    // see `records`) with the fields list filters narrow by, the contexts records are in,
    // and the points of time series.
    "CREATE TABLE records (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        project TEXT NOT NULL,
        region TEXT NOT NULL,
        parent TEXT NOT NULL,
        name TEXT NOT NULL UNIQUE,
        create_time INTEGER NOT NULL,
        update_time INTEGER NOT NULL,
        schema_title TEXT NOT NULL DEFAULT '',
        display_name TEXT NOT NULL DEFAULT '',
        body TEXT NOT NULL
     );
     CREATE INDEX records_by_parent ON records(kind, parent, seq);
     CREATE INDEX records_by_schema ON records(kind, parent, schema_title, seq);
     CREATE INDEX records_by_name ON records(kind, parent, display_name, seq);
     CREATE TABLE record_links (
        context TEXT NOT NULL,
        name TEXT NOT NULL,
        PRIMARY KEY (context, name)
     );
     CREATE INDEX record_links_by_name ON record_links(name);
     CREATE TABLE points (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        series TEXT NOT NULL,
        step INTEGER NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX points_by_series ON points(series, seq);",
    // 7: goodput in the usage ledger (TY10): each ended job's productive and accounted
    // time, wall and accelerator, counted in the hour of its end.
    "ALTER TABLE usage ADD COLUMN productive_seconds REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN accounted_seconds REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN productive_accelerator_seconds REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN accounted_accelerator_seconds REAL NOT NULL DEFAULT 0;",
];

/// The same schema in PostgreSQL, migration for migration (a version means the same
/// tables in both): 64-bit integers, identity columns whose values are never reused
/// (as SQLite's AUTOINCREMENT), text compared byte by byte (`COLLATE "C"`, as SQLite's
/// BINARY) so that filters and pages order alike.
const PG_MIGRATIONS: &[&str] = &[
    r#"CREATE TABLE jobs (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        kind TEXT COLLATE "C" NOT NULL,
        project TEXT COLLATE "C" NOT NULL,
        region TEXT COLLATE "C" NOT NULL,
        display_name TEXT COLLATE "C" NOT NULL,
        state TEXT COLLATE "C" NOT NULL,
        create_time BIGINT NOT NULL,
        update_time BIGINT NOT NULL,
        terminal BIGINT NOT NULL DEFAULT 0,
        resource TEXT NOT NULL,
        core TEXT NOT NULL
     );
     CREATE INDEX jobs_by_parent ON jobs(kind, project, region, id DESC);
     CREATE INDEX jobs_active ON jobs(terminal) WHERE terminal = 0;
     CREATE TABLE labels (
        job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key TEXT COLLATE "C" NOT NULL,
        value TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (job_id, key)
     );
     CREATE INDEX labels_by_key ON labels(key, value);
     CREATE TABLE outbox (
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        job_id BIGINT NOT NULL,
        effect TEXT NOT NULL
     );
     CREATE TABLE events (
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        time BIGINT NOT NULL,
        attempt BIGINT NOT NULL,
        replica TEXT,
        text TEXT NOT NULL
     );
     CREATE INDEX events_by_job ON events(job_id, seq);
     CREATE TABLE operations (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        project TEXT COLLATE "C" NOT NULL,
        region TEXT COLLATE "C" NOT NULL,
        body TEXT NOT NULL
     );
     CREATE TABLE meta (key TEXT COLLATE "C" PRIMARY KEY, value TEXT NOT NULL);"#,
    "CREATE INDEX jobs_by_name ON jobs(kind, project, region, display_name);
     CREATE INDEX jobs_by_state ON jobs(kind, project, region, state);",
    "ALTER TABLE jobs ADD COLUMN format BIGINT NOT NULL DEFAULT 1;
     ALTER TABLE jobs ADD COLUMN damage TEXT;",
    r#"CREATE TABLE usage (
        project TEXT COLLATE "C" NOT NULL,
        accelerator TEXT COLLATE "C" NOT NULL,
        hour BIGINT NOT NULL,
        cpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        accelerator_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        memory_gb_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        used_cpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        used_memory_gb_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        succeeded BIGINT NOT NULL DEFAULT 0,
        failed BIGINT NOT NULL DEFAULT 0,
        cancelled BIGINT NOT NULL DEFAULT 0,
        preemptions BIGINT NOT NULL DEFAULT 0,
        lost_accelerator_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
        PRIMARY KEY (project, accelerator, hour)
     );"#,
    // The fence: a session that says its epoch (a leader's, `trainyard.epoch`) writes
    // only while the lease is at that epoch, checked by the store itself once per
    // statement; the lease's lock (db::LEASE_LOCK) orders it with a takeover.
    r#"CREATE TABLE leader_lease (
        id BIGINT PRIMARY KEY CHECK (id = 1),
        epoch BIGINT NOT NULL,
        holder TEXT COLLATE "C" NOT NULL,
        address TEXT COLLATE "C" NOT NULL,
        config TEXT COLLATE "C" NOT NULL,
        expires_at BIGINT NOT NULL,
        renewed_at BIGINT NOT NULL
     );
     CREATE FUNCTION trainyard_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
     DECLARE
        mine text := current_setting('trainyard.epoch', true);
        held bigint;
     BEGIN
        IF coalesce(mine, '') = '' THEN
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock_shared(('x' || substr(md5('trainyard-lease:' || current_database() || '.' || current_schema()), 1, 16))::bit(64)::bigint);
        SELECT epoch INTO held FROM leader_lease WHERE id = 1;
        IF held IS DISTINCT FROM mine::bigint THEN
            RAISE EXCEPTION USING ERRCODE = 'TYF01', MESSAGE = format(
                'this server''s lease of the store (epoch %s) has passed to another server (epoch %s); a deposed leader writes nothing',
                mine, coalesce(held::text, 'none'));
        END IF;
        RETURN NULL;
     END
     $fence$;
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON jobs FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON labels FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON events FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON operations FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON meta FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON usage FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();"#,
    r#"CREATE TABLE records (
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        kind TEXT COLLATE "C" NOT NULL,
        project TEXT COLLATE "C" NOT NULL,
        region TEXT COLLATE "C" NOT NULL,
        parent TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL UNIQUE,
        create_time BIGINT NOT NULL,
        update_time BIGINT NOT NULL,
        schema_title TEXT COLLATE "C" NOT NULL DEFAULT '',
        display_name TEXT COLLATE "C" NOT NULL DEFAULT '',
        body TEXT NOT NULL
     );
     CREATE INDEX records_by_parent ON records(kind, parent, seq);
     CREATE INDEX records_by_schema ON records(kind, parent, schema_title, seq);
     CREATE INDEX records_by_name ON records(kind, parent, display_name, seq);
     CREATE TABLE record_links (
        context TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (context, name)
     );
     CREATE INDEX record_links_by_name ON record_links(name);
     CREATE TABLE points (
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        series TEXT COLLATE "C" NOT NULL,
        step BIGINT NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX points_by_series ON points(series, seq);
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON records FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON points FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();
     CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON record_links FOR EACH STATEMENT EXECUTE FUNCTION trainyard_fence();"#,
    "ALTER TABLE usage ADD COLUMN productive_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN accounted_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN productive_accelerator_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN accounted_accelerator_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;",
];

/// The advisory lock servers that start together on one PostgreSQL take while they
/// migrate (one migrates, the others then find it done).
const PG_MIGRATION_LOCK: i64 = 0x7472_6169_6e79;

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

/// The connection a store holds.
// A store holds one, for its whole life: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Pg),
}

/// The job store: one connection to SQLite or PostgreSQL, used by one thread at a time
/// (the driver's, or a reader's of the API's pool).
pub struct Store {
    conn: RefCell<Conn>,
    location: Location,
}

fn terminal_flag(job: &Job) -> i64 {
    i64::from(job.is_terminal())
}

fn encode<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(StoreError::Encode)
}

/// The newest `update_time` of any job in the store at `location`, read without writing
/// anything (None when there is no database or no job yet).
pub fn newest_update(location: &Location) -> Result<Option<Micros>> {
    let path = match location {
        Location::Sqlite(path) => path,
        Location::Postgres(url) => {
            let mut pg = Pg::connect(url)?;
            return pg.run(|e| {
                if !matches!(e.row("SELECT to_regclass('jobs') IS NOT NULL", &[])?.map(|r| r.int(0)), Some(Ok(1))) {
                    return Ok(None);
                }
                e.row("SELECT max(update_time) FROM jobs", &[])?.map(|r| r.opt_int(0)).transpose().map(Option::flatten)
            });
        }
    };
    if !path.exists() {
        return Ok(None);
    }
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
    if !sqlite_has_jobs(&conn)? {
        return Ok(None);
    }
    Ok(conn.query_row("SELECT max(update_time) FROM jobs", [], |r| r.get(0))?)
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The schema version of the store at `location` (0: none yet), read without writing
/// anything.
pub fn schema_version_at(location: &Location) -> Result<i64> {
    match location {
        Location::Sqlite(path) if !path.exists() => Ok(0),
        Location::Sqlite(path) => {
            let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
            sqlite_version(&conn)
        }
        Location::Postgres(url) => Pg::connect(url)?.run(pg_version),
    }
}

/// Whether the SQLite database has Trainyard's `jobs` table.
pub(crate) fn sqlite_has_jobs(conn: &rusqlite::Connection) -> Result<bool> {
    let n: i64 = conn.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'", [], |r| r.get(0))?;
    Ok(n > 0)
}

impl Store {
    /// Open (creating if needed) and migrate the SQLite database at `path`.
    pub fn open(path: &Path) -> Result<Store> {
        Store::connect(&Location::Sqlite(path.to_owned()))
    }

    /// Open the store at `location` and migrate it to this build's schema; a store of a
    /// newer schema is refused before anything is written to it.
    pub fn connect(location: &Location) -> Result<Store> {
        Store::connect_as(location, None)
    }

    fn connect_as(location: &Location, fence: Option<fence::Fence>) -> Result<Store> {
        let conn = match location {
            Location::Sqlite(path) => {
                Conn::Sqlite(rusqlite::Connection::open(path).map_err(|source| StoreError::Open { path: path.to_owned(), source })?)
            }
            Location::Postgres(url) => match fence {
                Some(fence) => Conn::Postgres(Pg::connect_fenced(url, fence)?),
                None => Conn::Postgres(Pg::connect(url)?),
            },
        };
        let store = Store { conn: RefCell::new(conn), location: location.clone() };
        match &mut *store.conn.borrow_mut() {
            Conn::Sqlite(c) => {
                // A newer release's database is refused before anything is written to it
                // (not even the journal mode).
                let version = sqlite_refuse_newer(c)?;
                sqlite_configure(c)?;
                sqlite_migrate(c, version)?;
                if let Location::Sqlite(path) = location {
                    private_files(path);
                }
            }
            Conn::Postgres(pg) => pg_migrate(pg)?,
        }
        Ok(store)
    }

    /// The connection of a leader's driver to a PostgreSQL store, fenced at its lease's
    /// epoch ([`lease`]): a deposed leader's late writes are refused with
    /// [`StoreError::Fenced`], and while its lease is not known to be held nothing is
    /// written. The store is migrated already (the lease is taken on a migrated store).
    /// On SQLite (one server, by the data directory's lock) or without a fence: a plain
    /// connection.
    pub fn connect_leader(location: &Location, fence: Option<fence::Fence>) -> Result<Store> {
        match location {
            Location::Postgres(_) => Store::connect_as(location, fence),
            Location::Sqlite(_) => Store::connect(location),
        }
    }

    /// A store on a PostgreSQL connection as it is (not migrated: only for reading).
    pub(crate) fn from_pg(pg: Pg, location: Location) -> Store {
        Store { conn: RefCell::new(Conn::Postgres(pg)), location }
    }

    /// A second connection to the same database, for readers.
    pub fn reopen(&self) -> Result<Store> {
        Store::connect(&self.location)
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    pub fn dialect(&self) -> Dialect {
        self.location.dialect()
    }

    /// The SQLite connection, when the store is one (backups).
    pub(crate) fn sqlite(&self) -> Option<std::cell::RefMut<'_, rusqlite::Connection>> {
        std::cell::RefMut::filter_map(self.conn.borrow_mut(), |c| match c {
            Conn::Sqlite(c) => Some(c),
            Conn::Postgres(_) => None,
        })
        .ok()
    }

    /// `f` in one transaction, committed when it returns `Some` (L23: durable before this
    /// returns), rolled back when it returns `None` or fails.
    fn transaction<T>(&self, f: impl FnOnce(&mut dyn Exec) -> Result<Option<T>>) -> Result<Option<T>> {
        match &mut *self.conn.borrow_mut() {
            Conn::Sqlite(c) => {
                let tx = c.transaction()?;
                let out = f(&mut SqliteExec(&tx))?;
                if out.is_some() {
                    tx.commit()?;
                }
                Ok(out)
            }
            Conn::Postgres(pg) => pg.transaction(f),
        }
    }

    /// `f` in one transaction, committed when it succeeds.
    fn write<T>(&self, f: impl FnOnce(&mut dyn Exec) -> Result<T>) -> Result<T> {
        self.transaction(|e| f(e).map(Some))?.ok_or_else(|| StoreError::Decode("a transaction returned nothing".into()))
    }

    /// `f` on its own (reads, and single statements that commit by themselves).
    fn read<T>(&self, f: impl FnOnce(&mut dyn Exec) -> Result<T>) -> Result<T> {
        match &mut *self.conn.borrow_mut() {
            Conn::Sqlite(c) => f(&mut SqliteExec(c)),
            Conn::Postgres(pg) => pg.run(f),
        }
    }

    /// A small durable write, to learn whether the store can be written again.
    pub fn probe_write(&mut self, now: Micros) -> Result<()> {
        self.set_meta("probe", &now.to_string())
    }

    pub fn schema_version(&self) -> Result<i64> {
        match &mut *self.conn.borrow_mut() {
            Conn::Sqlite(c) => sqlite_version(c),
            Conn::Postgres(pg) => pg.run(pg_version),
        }
    }

    /// Insert a new job and its "queued" log line in one transaction; returns the job.
    pub fn insert_job(&mut self, new: &NewJob<'_>, make: impl FnOnce(u64) -> Job) -> Result<Job> {
        if self.dialect() == Dialect::Postgres {
            // The ids of jobs come from the connection's reserved block, one after the
            // other, whichever way they are inserted.
            return self.read(|e| {
                let id = e.reserve("jobs", "id", 1)?.pop().ok_or_else(|| StoreError::Decode("no id was reserved".into()))?;
                let job = make(id as u64);
                pg_insert_rows(e, std::slice::from_ref(new), std::slice::from_ref(&job))?;
                Ok(job)
            });
        }
        self.write(|tx| insert_new(tx, new, make))
    }

    /// Group commit: insert several new jobs, each with its "queued" log line, in one
    /// transaction (one fsync for all of them). `make(i, id)` builds the lifecycle state of
    /// `news[i]` once its id is known. All or none are stored.
    pub fn insert_jobs(&mut self, news: &[NewJob<'_>], mut make: impl FnMut(usize, u64) -> Job) -> Result<Vec<Job>> {
        if self.dialect() == Dialect::Postgres {
            // One statement: atomic without a transaction around it.
            return self.read(|e| {
                let ids = e.reserve("jobs", "id", news.len())?;
                let jobs: Vec<Job> = ids.iter().enumerate().map(|(i, id)| make(i, *id as u64)).collect();
                pg_insert_rows(e, news, &jobs)?;
                Ok(jobs)
            });
        }
        self.write(|tx| {
            let mut out = Vec::with_capacity(news.len());
            for (i, new) in news.iter().enumerate() {
                out.push(insert_new(tx, new, |id| make(i, id))?);
            }
            Ok(out)
        })
    }

    /// L23: commit the job's new state, its lifecycle log lines and its world effects in
    /// one transaction. Returns the outbox entries to execute, in order.
    pub fn commit(&mut self, job: &Job, effects: &[Effect], now: Micros) -> Result<Vec<(i64, Effect)>> {
        if self.dialect() == Dialect::Postgres {
            return Ok(self.commit_many(&[(job, effects)], now)?.pop().unwrap_or_default());
        }
        self.write(|tx| write_job(tx, job, effects, now))
    }

    /// Several jobs' transitions in one transaction (one fsync for all: a scheduling
    /// round, replicas that started or ended together). Returns each job's outbox entries,
    /// in the order of `batch`.
    pub fn commit_many(&mut self, batch: &[(&Job, &[Effect])], now: Micros) -> Result<Vec<Vec<(i64, Effect)>>> {
        if self.dialect() == Dialect::Postgres {
            // One statement: atomic without a transaction around it.
            return self.read(|e| pg_write_jobs(e, batch, now));
        }
        self.write(|tx| batch.iter().map(|(job, effects)| write_job(tx, job, effects, now)).collect())
    }

    /// An effect was carried out: drop it from the outbox.
    pub fn outbox_done(&mut self, seq: i64) -> Result<()> {
        self.read(|e| e.execute("DELETE FROM outbox WHERE seq = ?1", values![seq]).map(drop))
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
        match &mut *self.conn.borrow_mut() {
            Conn::Sqlite(c) => {
                c.pragma_update(None, "synchronous", "NORMAL")?;
                let done = (|| {
                    let tx = c.transaction()?;
                    for s in seqs {
                        SqliteExec(&tx).execute("DELETE FROM outbox WHERE seq = ?1", values![*s])?;
                    }
                    Ok::<_, StoreError>(tx.commit()?)
                })();
                // Every other commit is synced before it returns (L23).
                c.pragma_update(None, "synchronous", "FULL")?;
                done
            }
            Conn::Postgres(pg) => {
                // One round trip: the transaction, its setting and the delete as one simple
                // query (the seqs are the store's own integers).
                let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                pg.run(|e| {
                    e.batch(&format!(
                        "BEGIN; SET LOCAL synchronous_commit = off; DELETE FROM outbox WHERE seq IN ({list}); COMMIT;"
                    ))
                })
            }
        }
    }

    /// Effects committed but not yet carried out (after a crash), in order; and the
    /// entries that cannot be read, with what is wrong with them.
    #[allow(clippy::type_complexity)]
    pub fn pending_outbox(&self) -> Result<(Vec<(i64, u64, Effect)>, Vec<(i64, u64, String)>)> {
        let rows = self.read(|e| e.rows("SELECT seq, job_id, effect FROM outbox ORDER BY seq", &[]))?;
        let (mut out, mut damaged) = (Vec::new(), Vec::new());
        for row in rows {
            let (seq, job, text) = (row.int(0)?, row.int(1)? as u64, row.text(2)?);
            match serde_json::from_str(&text) {
                Ok(effect) => out.push((seq, job, effect)),
                Err(e) => damaged.push((seq, job, e.to_string())),
            }
        }
        Ok((out, damaged))
    }

    /// Every CustomJob that is not terminal, oldest first.
    pub fn active_jobs(&self) -> Result<Vec<StoredJob>> {
        self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE terminal = 0 AND kind = 'custom' ORDER BY id"), &[])
    }

    /// Insert a resource of another kind (a HyperparameterTuningJob) whose state is an
    /// opaque JSON text made once the id is known. Returns the id.
    pub fn insert_other(&mut self, new: &NewJob<'_>, state: &str, now: Micros, make: impl FnOnce(u64) -> String) -> Result<u64> {
        self.write(|tx| {
            let id = tx.insert(
                "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, '')",
                values![new.kind, new.project, new.region, new.display_name, state, now, new.resource],
                "id",
            )? as u64;
            tx.execute("UPDATE jobs SET core = ?2 WHERE id = ?1", values![id as i64, make(id)])?;
            for (k, v) in new.labels {
                tx.execute("INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)", values![id as i64, k, v])?;
            }
            Ok(id)
        })
    }

    /// Commit the state of a resource of another kind, with log lines, in one transaction.
    pub fn commit_other(&mut self, id: u64, state: &str, terminal: bool, core: &str, now: Micros, lines: &[String]) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1",
                values![id as i64, state, now, i64::from(terminal), core],
            )?;
            for l in lines {
                insert_event(tx, id, now, 0, None, l)?;
            }
            Ok(())
        })
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
        self.transaction(|tx| {
            let mut ids = Vec::with_capacity(new_ops);
            for _ in 0..new_ops {
                ids.push(tx.insert("INSERT INTO operations (project, region, body) VALUES (?1, ?2, '')", values![project, region], "id")? as u64);
            }
            // None from `make`: nothing to write (the transaction is rolled back).
            let Some(OtherState { state, terminal, core, ops }) = make(&ids)? else { return Ok(None) };
            let n = tx.execute(
                "UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1",
                values![id as i64, state, now, i64::from(terminal), core],
            )?;
            if n != 1 {
                // Rolled back: the new operations go.
                return Ok(None);
            }
            for (op, body) in ops {
                tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", values![op as i64, body])?;
            }
            Ok(Some(ids))
        })
    }

    /// Delete a resource of another kind whatever its state, with its labels and log lines,
    /// and write `ops` (operations it leaves answered) in the same transaction. False,
    /// changing nothing, when there is no such resource.
    pub fn delete_other(&mut self, kind: &str, project: &str, region: &str, id: u64, ops: &[(u64, String)]) -> Result<bool> {
        let done = self.transaction(|tx| {
            let n = tx.execute(
                "DELETE FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4",
                values![id as i64, kind, project, region],
            )?;
            if n != 1 {
                return Ok(None);
            }
            for (op, body) in ops {
                tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", values![*op as i64, body])?;
            }
            Ok(Some(()))
        })?;
        Ok(done.is_some())
    }

    /// The newest row of another kind with this display name under its parent.
    pub fn find_other_by_name(&self, kind: &str, project: &str, region: &str, display_name: &str) -> Result<Option<(u64, String, String)>> {
        Ok(self
            .query_other(
                "SELECT id, resource, core FROM jobs WHERE kind = ?1 AND project = ?2 AND region = ?3 AND display_name = ?4 ORDER BY id DESC LIMIT 1",
                values![kind, project, region, display_name],
            )?
            .pop())
    }

    /// Quarantine a record of another kind that cannot be read: terminal, FAILED, with the
    /// damage named in `damage` and in a log line (its record is kept as it is).
    pub fn quarantine_other(&mut self, id: u64, damage: &str, now: Micros) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE jobs SET state = 'JOB_STATE_FAILED', update_time = ?2, terminal = 1, damage = ?3 WHERE id = ?1",
                values![id as i64, now, damage],
            )?;
            insert_event(tx, id, now, 0, None, &format!("Internal error: the stored record of this job is damaged and cannot be read ({damage})."))
        })
    }

    /// Rows of another kind: (id, resource, core), the live ones or one by id and parent.
    pub fn active_other(&self, kind: &str) -> Result<Vec<(u64, String, String)>> {
        self.query_other("SELECT id, resource, core FROM jobs WHERE terminal = 0 AND kind = ?1 ORDER BY id", values![kind])
    }

    pub fn get_other(&self, kind: &str, project: &str, region: &str, id: u64) -> Result<Option<(u64, String, String)>> {
        Ok(self
            .query_other(
                "SELECT id, resource, core FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4",
                values![id as i64, kind, project, region],
            )?
            .pop())
    }

    /// A page of rows of another kind, newest first (as `list_jobs`).
    pub fn list_other(
        &self,
        kind: &str,
        project: &str,
        region: &str,
        filter: Option<(&str, &[Value])>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>> {
        let (cond, values) = page_condition(kind, project, region, filter, before, limit);
        self.query_other(&format!("SELECT id, resource, core FROM jobs {cond}"), &values)
    }

    fn query_other(&self, sql: &str, params: &[Value]) -> Result<Vec<(u64, String, String)>> {
        let rows = self.read(|e| e.rows(sql, params))?;
        rows.iter().map(|r| Ok((r.int(0)? as u64, r.text(1)?, r.text(2)?))).collect()
    }

    /// One job, if it exists under this project and region (L: another project's job is
    /// simply not found).
    pub fn get_job(&self, kind: &str, project: &str, region: &str, id: u64) -> Result<Option<StoredJob>> {
        let mut v = self.query_jobs(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4"),
            values![id as i64, kind, project, region],
        )?;
        Ok(v.pop())
    }

    pub fn get_job_by_id(&self, id: u64) -> Result<Option<StoredJob>> {
        let mut v = self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"), values![id as i64])?;
        Ok(v.pop())
    }

    /// A page of jobs, newest first, with ids below `before` (the page token's position).
    /// `filter` is an SQL condition over the columns of `jobs` (built by the API layer
    /// from a parsed filter, with its own parameters, in this store's dialect).
    pub fn list_jobs(
        &self,
        kind: &str,
        project: &str,
        region: &str,
        filter: Option<(&str, &[Value])>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredJob>> {
        let (cond, values) = page_condition(kind, project, region, filter, before, limit);
        self.query_jobs(&format!("SELECT {JOB_COLUMNS} FROM jobs {cond}"), &values)
    }

    /// Rows as jobs; a row whose record cannot be read is returned as a FAILED stand-in
    /// naming the damage, never as an error that would hide the rows around it.
    fn query_jobs(&self, sql: &str, params: &[Value]) -> Result<Vec<StoredJob>> {
        let rows = self.read(|e| e.rows(sql, params))?;
        rows.iter()
            .map(|r| {
                Ok(RawJob {
                    id: r.int(0)? as u64,
                    kind: r.text(1)?,
                    resource: r.text(2)?,
                    core: r.text(3)?,
                    project: r.text(4)?,
                    region: r.text(5)?,
                    create_time: r.int(6)?,
                    display_name: r.text(7)?,
                    format: r.int(8)?,
                }
                .decode())
            })
            .collect()
    }

    /// Quarantine a record that cannot be read or run: the job is stored FAILED with the
    /// damage named (the stand-in of `Job::damaged`), the damaged text kept in `damage`,
    /// and a log line says what happened. Returns the stand-in.
    pub fn quarantine(&mut self, id: u64, damage: &str, now: Micros) -> Result<Option<Job>> {
        self.transaction(|tx| {
            let Some(row) = tx.row("SELECT project, region, create_time, core, resource FROM jobs WHERE id = ?1", values![id as i64])? else {
                return Ok(None);
            };
            let (project, region, create_time, core, resource) = (row.text(0)?, row.text(1)?, row.int(2)?, row.text(3)?, row.text(4)?);
            let job = Job::damaged(id, project, region, create_time, now, damage);
            let kept: String = format!("core: {core}\nresource: {resource}").chars().take(4096).collect();
            tx.execute(
                "UPDATE jobs SET state = ?2, update_time = ?3, terminal = 1, core = ?4, format = ?5, damage = ?6 WHERE id = ?1",
                values![id as i64, job.state().wire_name(), now, encode(&job)?, CORE_FORMAT, kept],
            )?;
            let text = job.error().map(|e| e.message.clone()).unwrap_or_default();
            insert_event(tx, id, now, 0, None, &text)?;
            Ok(Some(job))
        })
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
        self.transaction(|tx| {
            let n = tx.execute(
                "DELETE FROM jobs WHERE id = ?1 AND kind = ?2 AND project = ?3 AND region = ?4 AND terminal = 1",
                values![id as i64, kind, project, region],
            )?;
            if n != 1 {
                return Ok(None);
            }
            let opid = tx.insert("INSERT INTO operations (project, region, body) VALUES (?1, ?2, '')", values![project, region], "id")? as u64;
            let body = make_op(opid);
            tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", values![opid as i64, body.as_str()])?;
            let purge = Effect::Purge { job: id };
            let seq = tx.insert("INSERT INTO outbox (job_id, effect) VALUES (?1, ?2)", values![id as i64, encode(&purge)?], "seq")?;
            Ok(Some((body, (seq, purge))))
        })
    }

    /// Lifecycle log lines of a job after `after_seq`.
    pub fn events(&self, job: u64, after_seq: i64) -> Result<Vec<EventRow>> {
        let rows = self.read(|e| {
            e.rows(
                "SELECT seq, time, attempt, replica, text FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq",
                values![job as i64, after_seq],
            )
        })?;
        rows.iter()
            .map(|r| Ok(EventRow { seq: r.int(0)?, time: r.int(1)?, attempt: r.int(2)? as u32, replica: r.opt_text(3)?, text: r.text(4)? }))
            .collect()
    }

    pub fn get_operation(&self, project: &str, region: &str, id: u64) -> Result<Option<String>> {
        let row = self.read(|e| {
            e.row("SELECT body FROM operations WHERE id = ?1 AND project = ?2 AND region = ?3", values![id as i64, project, region])
        })?;
        row.map(|r| r.text(0)).transpose()
    }

    /// Ids of resources of `kind` that ended after `after` and at or before `upto`
    /// (their last update is their end).
    pub fn ended_between(&self, kind: &str, after: Micros, upto: Micros) -> Result<Vec<u64>> {
        let rows = self.read(|e| {
            e.rows(
                "SELECT id FROM jobs WHERE kind = ?1 AND terminal = 1 AND update_time > ?2 AND update_time <= ?3 ORDER BY id",
                values![kind, after, upto],
            )
        })?;
        rows.iter().map(|r| Ok(r.int(0)? as u64)).collect()
    }

    /// Ended CustomJobs by project and state (SUCCEEDED, FAILED, CANCELLED).
    pub fn ended_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let rows = self.read(|e| {
            e.rows(
                "SELECT project, state, COUNT(*) FROM jobs WHERE kind = 'custom' \
                 AND state IN ('JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED') GROUP BY project, state",
                &[],
            )
        })?;
        rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?))).collect()
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let row = self.read(|e| e.row("SELECT value FROM meta WHERE key = ?1", values![key]))?;
        row.map(|r| r.text(0)).transpose()
    }

    /// The value of `key`, set to `value` first if it has none (servers that start
    /// together on one store all get the first one's).
    pub fn meta_or_set(&mut self, key: &str, value: &str) -> Result<String> {
        self.read(|e| e.execute("INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO NOTHING", values![key, value]))?;
        self.meta(key)?.ok_or_else(|| StoreError::Decode(format!("meta key {key} is not kept")))
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        self.read(|e| set_meta(e, key, value))
    }

    /// The uid of `project`'s replicas: assigned once, the next unused one of
    /// `first..=last`, and kept (meta keys `project_uid/<project>` and
    /// `project_uid_next`). `None` when the range is used up.
    pub fn project_uid(&mut self, project: &str, first: u32, last: u32) -> Result<Option<u32>> {
        let key = format!("project_uid/{project}");
        self.write(|tx| {
            let mut get = |k: &str| -> Result<Option<u32>> {
                Ok(tx.row("SELECT value FROM meta WHERE key = ?1", values![k])?.map(|r| r.text(0)).transpose()?.and_then(|v| v.parse::<u32>().ok()))
            };
            if let Some(uid) = get(&key)? {
                return Ok(Some(uid));
            }
            let next = get("project_uid_next")?.unwrap_or(first).max(first);
            if next > last {
                return Ok(None);
            }
            set_meta(tx, &key, &next.to_string())?;
            set_meta(tx, "project_uid_next", &(next as u64 + 1).to_string())?;
            Ok(Some(next))
        })
    }
}

fn set_meta(e: &mut dyn Exec, key: &str, value: &str) -> Result<()> {
    e.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        values![key, value],
    )?;
    Ok(())
}

fn sqlite_configure(c: &rusqlite::Connection) -> Result<()> {
    // WAL: readers do not block the writer. synchronous=FULL: a commit is on disk before
    // it returns (L23), even across a power cut.
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
    c.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(())
}

/// The database's schema version, refused if newer than this build knows.
fn sqlite_refuse_newer(c: &rusqlite::Connection) -> Result<i64> {
    refuse_newer(sqlite_version(c)?)
}

/// SQLite's schema version: `PRAGMA user_version` counts the migrations that ran.
fn sqlite_version(c: &rusqlite::Connection) -> Result<i64> {
    Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?)
}

fn refuse_newer(version: i64) -> Result<i64> {
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(StoreError::TooNew { found: version, known });
    }
    Ok(version)
}

/// The migrations after `version` (read by `sqlite_refuse_newer`), each in a transaction.
fn sqlite_migrate(c: &mut rusqlite::Connection, version: i64) -> Result<()> {
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = c.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// PostgreSQL's schema version: the row of `trainyard_schema` (0 before any migration).
fn pg_version(e: &mut dyn Exec) -> Result<i64> {
    let exists = e.row("SELECT to_regclass('trainyard_schema') IS NOT NULL", &[])?;
    if !matches!(exists.as_ref().map(|r| r.int(0)), Some(Ok(1))) {
        return Ok(0);
    }
    Ok(e.row("SELECT version FROM trainyard_schema", &[])?.map(|r| r.int(0)).transpose()?.unwrap_or(0))
}

/// The migrations this database lacks, each in a transaction that holds the migration
/// lock: servers that start together on one database migrate it once (the others wait
/// for the lock, then find the version moved on). A newer schema is refused before
/// anything is written.
fn pg_migrate(pg: &mut Pg) -> Result<()> {
    // Every connection comes here (readers' too): only the version is read when there
    // is nothing to do.
    let version = refuse_newer(pg.run(pg_version)?)?;
    for (i, sql) in PG_MIGRATIONS.iter().enumerate().skip(version as usize) {
        pg.transaction(|tx| {
            tx.execute("SELECT pg_advisory_xact_lock(?1)", values![PG_MIGRATION_LOCK])?;
            tx.batch("CREATE TABLE IF NOT EXISTS trainyard_schema (version BIGINT NOT NULL)")?;
            let now = refuse_newer(pg_version(tx)?)?;
            if now > i as i64 {
                return Ok(None);
            }
            tx.batch(sql)?;
            tx.execute("DELETE FROM trainyard_schema", &[])?;
            tx.execute("INSERT INTO trainyard_schema (version) VALUES (?1)", values![i as i64 + 1])?;
            Ok(Some(()))
        })?;
    }
    Ok(())
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
fn page_condition(kind: &str, project: &str, region: &str, filter: Option<(&str, &[Value])>, before: Option<u64>, limit: usize) -> (String, Vec<Value>) {
    let mut sql = String::from("WHERE kind = ? AND project = ? AND region = ?");
    let mut values: Vec<Value> = vec![kind.into(), project.into(), region.into()];
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
fn insert_new(tx: &mut dyn Exec, new: &NewJob<'_>, make: impl FnOnce(u64) -> Job) -> Result<Job> {
    let id = tx.insert(
        "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
         VALUES (?1, ?2, ?3, ?4, '', 0, 0, ?5, '')",
        values![new.kind, new.project, new.region, new.display_name, new.resource],
        "id",
    )? as u64;
    let job = make(id);
    tx.execute(
        "UPDATE jobs SET state = ?2, create_time = ?3, update_time = ?4, core = ?5 WHERE id = ?1",
        values![id as i64, job.state().wire_name(), job.create_time, job.update_time, encode(&job)?],
    )?;
    for (k, v) in new.labels {
        tx.execute("INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)", values![id as i64, k, v])?;
    }
    insert_event(tx, id, job.create_time, 0, None, "L3: Job queued.")?;
    Ok(job)
}

fn insert_event(tx: &mut dyn Exec, job: u64, time: Micros, attempt: u32, replica: Option<&str>, text: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO events (job_id, time, attempt, replica, text) VALUES (?1, ?2, ?3, ?4, ?5)",
        values![job as i64, time, i64::from(attempt), replica, text],
    )?;
    Ok(())
}

/// PostgreSQL: a statement is a round trip to the database server, so a batch is written
/// in one statement whatever its size (its tables' rows as columns, `unnest` of arrays,
/// data-modifying `WITH` clauses: one statement is atomic, no transaction around it),
/// with ids the connection reserved before (a block at a time). Rows go in the batch's
/// order.
/// Lifecycle log lines of a batch, as five columns.
#[derive(Default)]
struct PgEvents {
    job: Vec<i64>,
    time: Vec<i64>,
    attempt: Vec<i64>,
    replica: Vec<Option<String>>,
    text: Vec<Option<String>>,
}

impl PgEvents {
    fn push(&mut self, job: u64, time: Micros, attempt: u32, replica: Option<&str>, text: &str) {
        self.job.push(job as i64);
        self.time.push(time);
        self.attempt.push(attempt.into());
        self.replica.push(replica.map(str::to_string));
        self.text.push(Some(text.to_string()));
    }

    fn into_values(self) -> [Value; 5] {
        [Value::Ints(self.job), Value::Ints(self.time), Value::Ints(self.attempt), Value::Texts(self.replica), Value::Texts(self.text)]
    }
}

fn texts(v: impl IntoIterator<Item = String>) -> Value {
    Value::Texts(v.into_iter().map(Some).collect())
}

/// `insert_new` for a batch, on PostgreSQL: the jobs (made with reserved ids), their
/// labels and their "queued" lines in one statement.
fn pg_insert_rows(e: &mut dyn Exec, news: &[NewJob<'_>], jobs: &[Job]) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(jobs.len());
    let (mut kind, mut project, mut region, mut name, mut state, mut created, mut updated, mut resource, mut core) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut label_job, mut label_key, mut label_value) = (vec![], vec![], vec![]);
    let mut events = PgEvents::default();
    for (new, job) in news.iter().zip(jobs) {
        let id = &(job.id as i64);
        ids.push(*id);
        kind.push(new.kind.to_string());
        project.push(new.project.to_string());
        region.push(new.region.to_string());
        name.push(new.display_name.to_string());
        state.push(job.state().wire_name().to_string());
        created.push(job.create_time);
        updated.push(job.update_time);
        resource.push(new.resource.to_string());
        core.push(encode(job)?);
        for (k, v) in new.labels {
            label_job.push(*id);
            label_key.push(k.clone());
            label_value.push(v.clone());
        }
        events.push(job.id, job.create_time, 0, None, "L3: Job queued.");
    }
    let mut params = vec![
        Value::Ints(ids),
        texts(kind),
        texts(project),
        texts(region),
        texts(name),
        texts(state),
        Value::Ints(created),
        Value::Ints(updated),
        texts(resource),
        texts(core),
        Value::Ints(label_job),
        texts(label_key),
        texts(label_value),
    ];
    params.extend(events.into_values());
    e.execute(
        "WITH j AS (INSERT INTO jobs (id, kind, project, region, display_name, state, create_time, update_time, resource, core) \
           SELECT * FROM unnest(?1::bigint[], ?2::text[], ?3::text[], ?4::text[], ?5::text[], ?6::text[], ?7::bigint[], ?8::bigint[], ?9::text[], ?10::text[])), \
         l AS (INSERT INTO labels (job_id, key, value) SELECT * FROM unnest(?11::bigint[], ?12::text[], ?13::text[])) \
         INSERT INTO events (job_id, time, attempt, replica, text) \
           SELECT * FROM unnest(?14::bigint[], ?15::bigint[], ?16::bigint[], ?17::text[], ?18::text[])",
        &params,
    )?;
    Ok(())
}

/// `write_job` for a batch, on PostgreSQL: every job's state, log lines and outbox
/// entries in one statement.
fn pg_write_jobs(e: &mut dyn Exec, batch: &[(&Job, &[Effect])], now: Micros) -> Result<Vec<Vec<(i64, Effect)>>> {
    let (mut id, mut state, mut updated, mut terminal, mut core) = (vec![], vec![], vec![], vec![], vec![]);
    let mut events = PgEvents::default();
    let mut effects: Vec<(usize, &Effect)> = Vec::new();
    // A job twice in a batch (two transitions committed together) is written as its
    // last: one UPDATE row per job (with two, PostgreSQL would pick either).
    let mut last: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (i, (job, _)) in batch.iter().enumerate() {
        last.insert(job.id, i);
    }
    for (i, (job, job_effects)) in batch.iter().enumerate() {
        if last.get(&job.id) == Some(&i) {
            id.push(job.id as i64);
            state.push(job.state().wire_name().to_string());
            updated.push(job.update_time);
            terminal.push(terminal_flag(job));
            core.push(encode(job)?);
        }
        for e in job_effects.iter() {
            match e {
                Effect::Log(line) => events.push(job.id, now, line.attempt, line.replica.as_deref(), &line.text),
                other => effects.push((i, other)),
            }
        }
    }
    let seqs = e.reserve("outbox", "seq", effects.len())?;
    let mut outboxes: Vec<Vec<(i64, Effect)>> = vec![Vec::new(); batch.len()];
    let (mut outbox_job, mut outbox_text) = (Vec::with_capacity(seqs.len()), Vec::with_capacity(seqs.len()));
    for ((i, effect), seq) in effects.iter().zip(&seqs) {
        outbox_job.push(batch[*i].0.id as i64);
        outbox_text.push(encode(*effect)?);
        outboxes[*i].push((*seq, (*effect).clone()));
    }
    let mut params = vec![Value::Ints(id), texts(state), Value::Ints(updated), Value::Ints(terminal), texts(core), Value::Ints(seqs), Value::Ints(outbox_job), texts(outbox_text)];
    params.extend(events.into_values());
    e.execute(
        "WITH u AS (UPDATE jobs SET state = v.state, update_time = v.update_time, terminal = v.terminal, core = v.core \
           FROM unnest(?1::bigint[], ?2::text[], ?3::bigint[], ?4::bigint[], ?5::text[]) AS v(id, state, update_time, terminal, core) \
           WHERE jobs.id = v.id), \
         o AS (INSERT INTO outbox (seq, job_id, effect) SELECT * FROM unnest(?6::bigint[], ?7::bigint[], ?8::text[])) \
         INSERT INTO events (job_id, time, attempt, replica, text) \
           SELECT * FROM unnest(?9::bigint[], ?10::bigint[], ?11::bigint[], ?12::text[], ?13::text[])",
        &params,
    )?;
    Ok(outboxes)
}

fn write_job(tx: &mut dyn Exec, job: &Job, effects: &[Effect], now: Micros) -> Result<Vec<(i64, Effect)>> {
    tx.execute(
        "UPDATE jobs SET state = ?2, update_time = ?3, terminal = ?4, core = ?5 WHERE id = ?1",
        values![job.id as i64, job.state().wire_name(), job.update_time, terminal_flag(job), encode(job)?],
    )?;
    let mut outbox = Vec::new();
    for e in effects {
        match e {
            Effect::Log(line) => insert_event(tx, job.id, now, line.attempt, line.replica.as_deref(), &line.text)?,
            other => {
                let seq = tx.insert("INSERT INTO outbox (job_id, effect) VALUES (?1, ?2)", values![job.id as i64, encode(other)?], "seq")?;
                outbox.push((seq, other.clone()));
            }
        }
    }
    Ok(outbox)
}

/// The stores tests run on: SQLite always, and PostgreSQL when `TRAINYARD_TEST_PG_URL`
/// names a server where the URL's user may create schemas (each test store is a schema
/// of its own, dropped after). In CI (`CI=true`) a missing URL fails the test: CI starts
/// PostgreSQL (`scripts/pg/up.sh`).
#[cfg(test)]
pub(crate) mod testdb {
    use super::*;

    pub(crate) struct TestStore {
        pub location: Location,
        _dir: Option<tempfile::TempDir>,
        schema: Option<(String, String)>,
    }

    impl TestStore {
        pub fn open(&self) -> Store {
            Store::connect(&self.location).unwrap()
        }
    }

    impl Drop for TestStore {
        fn drop(&mut self) {
            if let Some((admin, schema)) = &self.schema {
                if let Ok(mut c) = postgres::Client::connect(admin, postgres::NoTls) {
                    let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
                }
            }
        }
    }

    /// `url` with `search_path` set to `schema` for every connection made from it.
    pub(crate) fn with_schema(url: &str, schema: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-csearch_path%3D{schema}")
    }

    pub(crate) fn pg_url() -> Option<String> {
        match std::env::var("TRAINYARD_TEST_PG_URL") {
            Ok(u) if !u.is_empty() => Some(u),
            _ => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI runs the store's tests on PostgreSQL too: set TRAINYARD_TEST_PG_URL (scripts/pg/up.sh)"
                );
                None
            }
        }
    }

    /// A new, empty PostgreSQL schema for one test store.
    pub(crate) fn pg_schema(admin: &str) -> (String, String) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let schema = format!("ty_test_{}_{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut c = postgres::Client::connect(admin, postgres::NoTls).expect("connect to TRAINYARD_TEST_PG_URL");
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).expect("create a test schema");
        (with_schema(admin, &schema), schema)
    }

    /// An empty store of each kind available.
    pub(crate) fn stores() -> Vec<TestStore> {
        let dir = tempfile::tempdir().unwrap();
        let mut out = vec![TestStore { location: Location::Sqlite(dir.path().join("t.db")), _dir: Some(dir), schema: None }];
        if let Some(admin) = pg_url() {
            let (url, schema) = pg_schema(&admin);
            out.push(TestStore { location: Location::Postgres(url), _dir: None, schema: Some((admin, schema)) });
        }
        out
    }

    /// A new PostgreSQL store, where the tests have one.
    pub(crate) fn postgres() -> Option<TestStore> {
        let admin = pg_url()?;
        let (url, schema) = pg_schema(&admin);
        Some(TestStore { location: Location::Postgres(url), _dir: None, schema: Some((admin, schema)) })
    }

    /// `f` on a new store of each kind, named in a failure.
    pub(crate) fn each(f: impl Fn(&TestStore, &mut Store)) {
        for t in stores() {
            let mut store = t.open();
            let kind = format!("{:?}", t.location.dialect());
            if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&t, &mut store))) {
                eprintln!("failed on the {kind} store ({})", t.location);
                std::panic::resume_unwind(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testdb::each;
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
        each(|t, store| {
            let job = new_job(store, "p");
            assert_eq!(job.id, 1);
            let s = Settings::default();
            let t1 = trainyard_core::step(&job, Event::Place { nodes: vec!["local".into()], addresses: vec!["127.0.0.2:20000".into()], notes: vec![] }, 10, &s)
                .unwrap();
            let outbox = store.commit(&t1.job, &t1.effects, 10).unwrap();
            assert_eq!(outbox.len(), 1);
            let store = t.open();
            let active = store.active_jobs().unwrap();
            assert_eq!(active.len(), 1);
            assert_eq!(active[0].job, t1.job);
            let pending = store.pending_outbox().unwrap().0;
            assert_eq!(pending.len(), 1);
            assert_eq!(pending[0].0, outbox[0].0);
            assert!(matches!(pending[0].2, Effect::Launch { .. }));
            let ev = store.events(1, 0).unwrap();
            let texts: Vec<&str> = ev.iter().map(|e| e.text.as_str()).collect();
            assert_eq!(texts[0], "L3: Job queued.");
            assert_eq!(ev[0].replica, None);
            assert!(texts.iter().any(|t| t.contains("admitted")));
        });
    }

    /// Ids are never reused, even after a delete.
    #[test]
    fn ids_never_reused() {
        each(|_, store| {
            let a = new_job(store, "p");
            let s = Settings::default();
            let t = trainyard_core::step(&a, Event::Cancel, 6, &s).unwrap();
            store.commit(&t.job, &t.effects, 6).unwrap();
            let (_, (seq, purge)) = store.delete_terminal("custom", "p", "us-central1", a.id, |_| "{}".into()).unwrap().unwrap();
            assert_eq!(purge, Effect::Purge { job: a.id });
            assert_eq!(store.pending_outbox().unwrap().0.last().map(|p| p.0), Some(seq));
            let b = new_job(store, "p");
            assert!(b.id > a.id);
            assert!(store.events(a.id, 0).unwrap().is_empty(), "its log lines went with it");
        });
    }

    /// Deleting a job that is not terminal changes nothing.
    #[test]
    fn delete_refuses_live_job() {
        each(|_, store| {
            let a = new_job(store, "p");
            assert!(store.delete_terminal("custom", "p", "us-central1", a.id, |_| "{}".into()).unwrap().is_none());
            assert!(store.get_job_by_id(a.id).unwrap().is_some());
        });
    }

    /// Another project's job is not found.
    #[test]
    fn get_is_scoped_to_project() {
        each(|_, store| {
            let a = new_job(store, "p");
            assert!(store.get_job("custom", "p", "us-central1", a.id).unwrap().is_some());
            assert!(store.get_job("custom", "q", "us-central1", a.id).unwrap().is_none());
            assert!(store.get_job("custom", "p", "europe-west4", a.id).unwrap().is_none());
        });
    }

    #[test]
    fn list_newest_first_with_position() {
        each(|_, store| {
            for _ in 0..5 {
                new_job(store, "p");
            }
            new_job(store, "q");
            let page = store.list_jobs("custom", "p", "us-central1", None, None, 2).unwrap();
            assert_eq!(page.iter().map(|j| j.job.id).collect::<Vec<_>>(), [5, 4]);
            let page = store.list_jobs("custom", "p", "us-central1", None, Some(4), 10).unwrap();
            assert_eq!(page.iter().map(|j| j.job.id).collect::<Vec<_>>(), [3, 2, 1]);
        });
    }

    /// Filters compiled for the store's own dialect select the same jobs on both: text
    /// compared byte by byte, wildcards, substrings, labels and times.
    #[test]
    fn filters_select_alike_on_both_stores() {
        const STATES: &[&str] = &["JOB_STATE_UNSPECIFIED", "JOB_STATE_QUEUED"];
        each(|_, store| {
            let names = ["alpha", "Beta", "al_pha", "a%b", "b*c", "zeta"];
            for (i, n) in names.iter().enumerate() {
                let labels = [("team".to_string(), if i % 2 == 0 { "nlp" } else { "vision" }.to_string())];
                store
                    .insert_job(
                        &NewJob { kind: "custom", project: "p", region: "r", display_name: n, labels: &labels, resource: "{}" },
                        |id| Job::new(id, "p".into(), "r".into(), &[1], Demand::default(), Policy::defaults(&Settings::default()), false, 100 + i as i64),
                    )
                    .unwrap();
            }
            let names_of = |filter: &str| -> Vec<String> {
                let c = filter::compile(filter, STATES, store.dialect()).unwrap().unwrap();
                let mut v: Vec<String> =
                    store.list_jobs("custom", "p", "r", Some((&c.sql, &c.params)), None, 100).unwrap().into_iter().map(|j| j.display_name).collect();
                v.sort();
                v
            };
            assert_eq!(names_of("display_name<\"b\""), ["Beta", "a%b", "al_pha", "alpha"], "byte order: upper case first");
            assert_eq!(names_of("display_name=\"al*\""), ["al_pha", "alpha"]);
            assert_eq!(names_of("display_name=\"a%*\""), ["a%b"], "% is itself");
            assert_eq!(names_of("display_name=\"al_*\""), ["al_pha"], "_ is itself");
            assert_eq!(names_of("display_name:\"ph\""), ["al_pha", "alpha"]);
            assert_eq!(names_of("display_name:\"PH\""), Vec::<String>::new(), "case-sensitive");
            assert_eq!(names_of("labels.team=\"vis*\" AND NOT display_name=\"B*\""), ["a%b", "zeta"]);
            assert_eq!(names_of("labels:team create_time>=\"1970-01-01T00:00:00.000104Z\""), ["b*c", "zeta"]);
        });
    }

    /// Resources of other kinds and their operations: an operation made with a change is
    /// kept only when the change is written.
    #[test]
    fn other_kinds_and_their_operations() {
        each(|_, store| {
            let new = NewJob { kind: "hptuning", project: "p", region: "r", display_name: "sweep", labels: &[], resource: "{\"x\":1}" };
            let id = store.insert_other(&new, "JOB_STATE_QUEUED", 5, |id| format!("core-{id}")).unwrap();
            assert_eq!(store.get_other("hptuning", "p", "r", id).unwrap(), Some((id, "{\"x\":1}".into(), format!("core-{id}"))));
            assert_eq!(store.find_other_by_name("hptuning", "p", "r", "sweep").unwrap().map(|r| r.0), Some(id));
            let ops = store
                .commit_other_ops(id, ("p", "r"), 6, 1, |ids| {
                    Ok(Some(OtherState { state: "JOB_STATE_RUNNING".into(), terminal: false, core: "c2".into(), ops: vec![(ids[0], "op-body".into())] }))
                })
                .unwrap()
                .unwrap();
            assert_eq!(store.get_operation("p", "r", ops[0]).unwrap().as_deref(), Some("op-body"));
            // None from `make`: nothing is written, the operation made for it is gone.
            let none = store.commit_other_ops(id, ("p", "r"), 7, 1, |_| Ok(None)).unwrap();
            assert!(none.is_none());
            assert_eq!(store.get_operation("p", "r", ops[0] + 1).unwrap(), None);
            assert_eq!(store.active_other("hptuning").unwrap().len(), 1);
            store.commit_other(id, "JOB_STATE_SUCCEEDED", true, "c3", 8, &["done".into()]).unwrap();
            assert!(store.active_other("hptuning").unwrap().is_empty());
            assert_eq!(store.ended_between("hptuning", 7, 8).unwrap(), [id]);
            assert_eq!(store.events(id, 0).unwrap().last().map(|e| e.text.clone()).as_deref(), Some("done"));
            assert!(store.delete_other("hptuning", "p", "r", id, &[(ops[0], "answered".into())]).unwrap());
            assert!(!store.delete_other("hptuning", "p", "r", id, &[]).unwrap());
            assert_eq!(store.get_operation("p", "r", ops[0]).unwrap().as_deref(), Some("answered"));
        });
    }

    /// Meta keys, project uids (assigned once, in order, until the range is used up) and
    /// the outbox's batch delete.
    #[test]
    fn meta_uids_and_the_outbox() {
        each(|_, store| {
            assert_eq!(store.meta("k").unwrap(), None);
            store.set_meta("k", "1").unwrap();
            store.set_meta("k", "2").unwrap();
            assert_eq!(store.meta("k").unwrap().as_deref(), Some("2"));
            assert_eq!(store.project_uid("a", 10, 11).unwrap(), Some(10));
            assert_eq!(store.project_uid("b", 10, 11).unwrap(), Some(11));
            assert_eq!(store.project_uid("a", 10, 11).unwrap(), Some(10));
            assert_eq!(store.project_uid("c", 10, 11).unwrap(), None);
            let job = new_job(store, "p");
            let s = Settings::default();
            let t = trainyard_core::step(&job, Event::Place { nodes: vec!["local".into()], addresses: vec!["127.0.0.2:1".into()], notes: vec![] }, 10, &s)
                .unwrap();
            let seqs: Vec<i64> = store.commit_many(&[(&t.job, &t.effects)], 10).unwrap()[0].iter().map(|(s, _)| *s).collect();
            assert!(!seqs.is_empty());
            store.outbox_done_many(&seqs).unwrap();
            assert!(store.pending_outbox().unwrap().0.is_empty());
            assert_eq!(store.ended_counts().unwrap(), vec![]);
            let q = store.quarantine(job.id, "bad bytes", 11).unwrap().unwrap();
            assert!(q.is_terminal());
            assert_eq!(store.ended_counts().unwrap(), vec![("p".into(), "JOB_STATE_FAILED".into(), 1)]);
        });
    }

    /// A batch writes every job's last state, its log lines and its outbox entries in the
    /// batch's order, the same on both stores, whatever the batch's size; a job twice in
    /// one batch ends as its second transition.
    #[test]
    fn batches_write_in_order() {
        each(|_, store| {
            let s = Settings::default();
            let news: Vec<NewJob<'_>> = (0..5)
                .map(|_| NewJob { kind: "custom", project: "p", region: "r", display_name: "b", labels: &[], resource: "{}" })
                .collect();
            let jobs = store
                .insert_jobs(&news, |i, id| Job::new(id, "p".into(), "r".into(), &[1], Demand::default(), Policy::defaults(&s), false, i as i64))
                .unwrap();
            assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
            let place = |j: &Job| {
                trainyard_core::step(j, Event::Place { nodes: vec!["n".into()], addresses: vec!["127.0.0.2:1".into()], notes: vec![] }, 10, &s).unwrap()
            };
            let (a, b) = (place(&jobs[0]), place(&jobs[1]));
            let a2 = trainyard_core::step(&a.job, Event::Cancel, 11, &s).unwrap();
            let out = store.commit_many(&[(&a.job, &a.effects), (&b.job, &b.effects), (&a2.job, &a2.effects)], 11).unwrap();
            assert_eq!(out.len(), 3);
            let seqs: Vec<i64> = out.iter().flatten().map(|(s, _)| *s).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
            let pending = store.pending_outbox().unwrap().0;
            assert_eq!(pending.iter().map(|p| p.0).collect::<Vec<_>>(), seqs);
            assert_eq!(store.get_job_by_id(1).unwrap().unwrap().job, a2.job, "the later transition");
            assert_eq!(store.get_job_by_id(2).unwrap().unwrap().job, b.job);
            let texts: Vec<String> = store.events(1, 0).unwrap().into_iter().map(|e| e.text).collect();
            let expected: Vec<String> = std::iter::once("L3: Job queued.".to_string())
                .chain([&a.effects, &a2.effects].into_iter().flatten().filter_map(|e| match e {
                    Effect::Log(l) => Some(l.text.clone()),
                    _ => None,
                }))
                .collect();
            assert_eq!(texts, expected);
        });
    }

    /// A database made by the first schema version is migrated forward and keeps its jobs.
    #[test]
    fn old_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
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
        let conn = store.sqlite().unwrap();
        let n: i64 = conn.query_row("SELECT count(*) FROM jobs WHERE display_name = 'old'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        let plan: String = conn
            .query_row("EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE kind='custom' AND project='p' AND region='r' AND display_name='x' ORDER BY id DESC", [], |r| r.get(3))
            .unwrap();
        assert!(plan.contains("jobs_by_name"), "{plan}");
    }

    /// PostgreSQL: the first migration's tables are migrated forward and keep their rows;
    /// servers that start together migrate once; a newer schema is refused naming both
    /// versions, and nothing is written to it.
    #[test]
    fn postgres_migrations_and_a_newer_schema() {
        let Some(admin) = testdb::pg_url() else { return };
        let (url, schema) = testdb::pg_schema(&admin);
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(PG_MIGRATIONS[0]).unwrap();
        c.batch_execute("CREATE TABLE trainyard_schema (version BIGINT NOT NULL); INSERT INTO trainyard_schema VALUES (1);").unwrap();
        c.batch_execute(
            "INSERT INTO jobs (kind, project, region, display_name, state, create_time, update_time, resource, core)
             VALUES ('custom', 'p', 'r', 'old', 'JOB_STATE_SUCCEEDED', 1, 1, '{}', '{}')",
        )
        .unwrap();
        let location = Location::Postgres(url.clone());
        let starts: Vec<_> = (0..3).map(|_| {
            let l = location.clone();
            std::thread::spawn(move || Store::connect(&l).map(|s| s.schema_version().unwrap()))
        }).collect();
        for s in starts {
            assert_eq!(s.join().unwrap().unwrap(), MIGRATIONS.len() as i64);
        }
        let store = Store::connect(&location).unwrap();
        let old = store.list_jobs("custom", "p", "r", None, None, 10).unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].display_name, "old");
        assert!(old[0].damage.is_some(), "an unreadable record is shown damaged, not lost");
        c.batch_execute("UPDATE trainyard_schema SET version = 99").unwrap();
        let e = Store::connect(&location).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("schema version 99") && e.contains(&format!("({})", MIGRATIONS.len())), "{e}");
        let mut admin_c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
        admin_c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).unwrap();
    }

    /// A PostgreSQL that cannot be reached is an error naming it (without its password),
    /// and transient; a store whose server went away comes back on the next statement.
    #[test]
    fn postgres_unreachable_and_reconnected() {
        let e = Store::connect(&Location::Postgres("postgres://ty:s3cret@127.0.0.1:1/db?connect_timeout=2".into())).err().unwrap();
        let text = e.to_string();
        assert!(text.contains("postgres://ty:***@127.0.0.1:1/db") && !text.contains("s3cret"), "{text}");
        assert!(e.is_transient(), "{text}");
        let Some(admin) = testdb::pg_url() else { return };
        let (url, schema) = testdb::pg_schema(&admin);
        // A name of its own: other tests' connections are not touched.
        let name = format!("ty_reconnect_{}", std::process::id());
        let mut store = Store::connect(&Location::Postgres(format!("{url}&application_name={name}"))).unwrap();
        store.set_meta("k", "1").unwrap();
        // The server ends this connection (as a restart would).
        let mut c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
        c.batch_execute(&format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'")).unwrap();
        let lost = store.set_meta("k", "2");
        if let Err(e) = &lost {
            assert!(e.is_transient(), "{e}");
        }
        store.set_meta("k", "3").unwrap();
        assert_eq!(store.meta("k").unwrap().as_deref(), Some("3"));
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).unwrap();
    }

    /// A database written by a newer Trainyard is refused, not damaged.
    #[test]
    fn newer_schema_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
        assert!(matches!(Store::open(&path), Err(StoreError::TooNew { found: 99, .. })));
    }
}
