//! The two databases the store runs on: an SQLite file (the embedded default, one
//! machine) or PostgreSQL (a control plane that outlives any one host). Both get the same
//! statements ([`crate::sql`]) through [`Exec`], inside transactions the store opens.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::sql::{placeholders, Cell, Dialect, Row, Value};
use crate::{Result, StoreError};

/// Where a store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An SQLite database file (`<data_dir>/trainyard.db`).
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its URL (`postgres://user:password@host:port/db`).
    Postgres(String),
}

impl Location {
    /// A store URL (`[store] url`): `postgres://` or `postgresql://` are PostgreSQL's;
    /// anything else is refused naming it.
    pub fn from_url(url: &str) -> std::result::Result<Location, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            pg_config(url)?;
            return Ok(Location::Postgres(url.to_string()));
        }
        Err(format!("{:?} is not a PostgreSQL URL (postgres://user:password@host:port/database)", redact(url)))
    }

    pub fn dialect(&self) -> Dialect {
        match self {
            Location::Sqlite(_) => Dialect::Sqlite,
            Location::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite file, if the store is one.
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match self {
            Location::Sqlite(p) => Some(p),
            Location::Postgres(_) => None,
        }
    }
}

/// The path, or the URL without its password (for messages and logs).
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(url) => write!(f, "{}", redact(url)),
        }
    }
}

/// A URL with the password, if any, replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    // A password given as a query parameter goes too.
    let tail = tail
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.trim_start_matches('?') == "password" => format!("{k}=***"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{scheme}://{authority}{tail}")
}

/// How long a connection may take to be made when the URL does not say
/// (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection's data unacknowledged this long ends it (`tcp_user_timeout`), and one
/// idle this long is probed (`keepalives_idle`, then every second, three times), unless the
/// URL says otherwise: a network that drops every packet without a word (a host or link
/// gone) fails a statement in seconds, and the server goes on as it does when the store is
/// out of reach, instead of waiting for the kernel's retransmissions to give up (about
/// 15 minutes).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);

fn pg_config(url: &str) -> std::result::Result<postgres::Config, String> {
    let mut config: postgres::Config = url.parse().map_err(|e| format!("{}: {e}", redact(url)))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    // The client library's default idle time is two hours: taken for not set.
    if config.get_keepalives() && config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(KEEPALIVES_IDLE);
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(Duration::from_secs(1));
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(3);
        }
    }
    if config.get_application_name().is_none() {
        config.application_name("trainyard");
    }
    Ok(config)
}

/// One statement at a time, inside a transaction the store opened (or on its own).
pub(crate) trait Exec {
    /// Rows changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64>;
    /// An INSERT; returns the new row's `key` column (its generated id).
    fn insert(&mut self, sql: &str, params: &[Value], key: &str) -> Result<i64>;
    fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>>;
    /// Statements without parameters, several at once (migrations).
    fn batch(&mut self, sql: &str) -> Result<()>;

    fn row(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }

    /// PostgreSQL: `n` new values of `table`'s identity `column`, ascending, for rows this
    /// connection inserts with them. Taken in blocks of at least `RESERVE_BLOCK` (one
    /// round trip for many batches); values reserved and never used leave gaps, never
    /// a value used twice.
    fn reserve(&mut self, _table: &str, _column: &str, _n: usize) -> Result<Vec<i64>> {
        Err(StoreError::Decode("ids are reserved on PostgreSQL only".into()))
    }
}

/// Identity values a PostgreSQL connection reserves at once.
pub(crate) const RESERVE_BLOCK: usize = 64;

/// SQLite: statements cached by the connection.
pub(crate) struct SqliteExec<'a>(pub &'a rusqlite::Connection);

impl Exec for SqliteExec<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        Ok(self.0.prepare_cached(sql)?.execute(rusqlite::params_from_iter(params))? as u64)
    }

    fn insert(&mut self, sql: &str, params: &[Value], _key: &str) -> Result<i64> {
        self.execute(sql, params)?;
        Ok(self.0.last_insert_rowid())
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.0.execute_batch(sql)?)
    }

    fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        use rusqlite::types::ValueRef;
        let mut st = self.0.prepare_cached(sql)?;
        let n = st.column_count();
        let mut q = st.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(r) = q.next()? {
            let mut cells = Vec::with_capacity(n);
            for i in 0..n {
                cells.push(match r.get_ref(i)? {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(v) => Cell::Integer(v),
                    ValueRef::Real(v) => Cell::Real(v),
                    ValueRef::Text(t) | ValueRef::Blob(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
                });
            }
            out.push(Row(cells));
        }
        Ok(out)
    }
}

/// Prepared statements kept per connection, at most this many (filters make statements
/// of their own; the oldest are dropped, and closed on the server, past it).
const MAX_STATEMENTS: usize = 256;

/// A PostgreSQL connection, made again when it was lost.
pub(crate) struct Pg {
    config: postgres::Config,
    url: String,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
    /// Identity values reserved and not used yet, by table.
    reserved: HashMap<String, std::collections::VecDeque<i64>>,
    /// The leader's fence, for the connection of a leader's driver: the session says its
    /// epoch (`trainyard.epoch`), and the store's triggers refuse its writes once the lease
    /// is another epoch's ([`StoreError::Fenced`]); while the lease is not known to be held
    /// (renewals failed), it runs nothing (transiently).
    fence: Option<crate::fence::Fence>,
}

/// The lock of the lease of the store a session's `search_path` selects (an advisory
/// lock on a key of the database and schema): the store's fence triggers take it shared
/// in each of a leader's writing transactions, and a server taking the lease over takes it
/// exclusively, so the takeover waits for the leader's transactions in flight, and those
/// that write after it wait for it and then find the new epoch. Advisory locks live in
/// memory: no row is written for them. (The same expression is in the triggers' function,
/// PG_MIGRATIONS 5.)
pub(crate) const LEASE_LOCK: &str =
    "('x' || substr(md5('trainyard-lease:' || current_database() || '.' || current_schema()), 1, 16))::bit(64)::bigint";

/// How long a session of this store may sit idle inside a transaction before the
/// database ends it (`idle_in_transaction_session_timeout`): far longer than any of its
/// transactions waits between two statements, and the bound of how long a takeover of the
/// lease waits, past its expiry, for a leader that froze in the middle of a transaction.
pub(crate) const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(2);

/// The SQLSTATE of the store's fence triggers: a write of a session whose
/// `trainyard.epoch` (set by a leader's connection) is not the lease's.
pub(crate) const FENCED_STATE: &str = "TYF01";

impl Pg {
    pub(crate) fn connect(url: &str) -> Result<Pg> {
        Pg::open(url, None)
    }

    /// The connection of a leader's driver.
    pub(crate) fn connect_fenced(url: &str, fence: crate::fence::Fence) -> Result<Pg> {
        Pg::open(url, Some(fence))
    }

    fn open(url: &str, fence: Option<crate::fence::Fence>) -> Result<Pg> {
        let mut config = pg_config(url).map_err(StoreError::Url)?;
        if config.get_application_name() == Some("trainyard") {
            // Named for whoever looks at the sessions (pg_stat_activity).
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let role = if fence.is_some() { "leader" } else { "reader" };
            config.application_name(&format!("trainyard {role} {} pid {}", host.trim(), std::process::id()).chars().take(63).collect::<String>());
        }
        let mut pg = Pg { config, url: url.to_string(), client: None, statements: HashMap::new(), reserved: HashMap::new(), fence };
        pg.client()?;
        Ok(pg)
    }

    /// The connection, made again if it was closed (the server restarted, the network
    /// was cut): the statement that finds it closed fails (transient), the next one runs.
    fn client(&mut self) -> Result<&mut postgres::Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.statements.clear();
            let mut client = self
                .config
                .connect(postgres::NoTls)
                .map_err(|source| StoreError::Connect { location: redact(&self.url), source })?;
            // A session idle inside a transaction holds what the transaction locked: a
            // leader's, the lease's lock (shared, see LEASE_LOCK) or the lease's row. Its
            // server frozen or cut off there, a takeover would wait for it for good; the
            // database ends such a session instead, and the takeover goes on.
            client.batch_execute(&format!("SET idle_in_transaction_session_timeout = {}", IDLE_IN_TRANSACTION.as_millis()))?;
            if let Some(f) = &self.fence {
                // What the store's fence triggers compare with the lease (see FENCED_STATE).
                client.batch_execute(&format!("SET trainyard.epoch = '{}'", f.epoch))?;
            }
            self.client = Some(client);
        }
        self.client.as_mut().ok_or_else(|| StoreError::Decode("no connection".into()))
    }

    /// `f` in a transaction: committed when it returns `Some`, rolled back on `None` or an
    /// error.
    pub(crate) fn transaction<T>(&mut self, f: impl FnOnce(&mut dyn Exec) -> Result<Option<T>>) -> Result<Option<T>> {
        self.check_fence()?;
        self.client()?;
        let Pg { client: Some(client), statements, reserved, .. } = self else { return Err(StoreError::Decode("no connection".into())) };
        let out = (|| {
            let mut tx = client.transaction()?;
            let out = f(&mut PgExec { c: &mut tx, statements, reserved })?;
            if out.is_some() {
                tx.commit()?;
            }
            Ok(out)
        })();
        self.forget_if_lost(out)
    }

    /// A leader's connection writes nothing while its lease is not known to be held.
    fn check_fence(&self) -> Result<()> {
        match &self.fence {
            Some(f) if !f.held() => Err(StoreError::LeaseLapsed(f.epoch)),
            _ => Ok(()),
        }
    }

    /// A connection found lost is not used again: the next statement makes a new one (the
    /// client may not know it is closed yet, e.g. after a reset on write).
    fn forget_if_lost<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.as_ref().is_err_and(StoreError::connection_lost) {
            self.client = None;
        }
        // The store's trigger refused a deposed leader's write.
        r.map_err(|e| match &e {
            StoreError::Postgres(pe) => match pe.as_db_error().filter(|d| d.code().code() == FENCED_STATE) {
                Some(d) => StoreError::Fenced(d.message().to_string()),
                None => e,
            },
            _ => e,
        })
    }

    /// `f` outside a transaction (each statement commits on its own).
    pub(crate) fn run<T>(&mut self, f: impl FnOnce(&mut dyn Exec) -> Result<T>) -> Result<T> {
        self.check_fence()?;
        self.client()?;
        let Pg { client: Some(client), statements, reserved, .. } = self else { return Err(StoreError::Decode("no connection".into())) };
        let out = f(&mut PgExec { c: client, statements, reserved });
        self.forget_if_lost(out)
    }
}

struct PgExec<'a, C: postgres::GenericClient> {
    c: &'a mut C,
    statements: &'a mut HashMap<String, postgres::Statement>,
    reserved: &'a mut HashMap<String, std::collections::VecDeque<i64>>,
}

impl<C: postgres::GenericClient> PgExec<'_, C> {
    fn statement(&mut self, sql: &str) -> Result<postgres::Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.c.prepare(&placeholders(sql, Dialect::Postgres))?;
        if self.statements.len() >= MAX_STATEMENTS {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

fn pg_params(params: &[Value]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect()
}

impl<C: postgres::GenericClient> Exec for PgExec<'_, C> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let st = self.statement(sql)?;
        Ok(self.c.execute(&st, &pg_params(params))?)
    }

    fn insert(&mut self, sql: &str, params: &[Value], key: &str) -> Result<i64> {
        let st = self.statement(&format!("{sql} RETURNING {key}"))?;
        Ok(self.c.query_one(&st, &pg_params(params))?.try_get::<_, i64>(0)?)
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.c.batch_execute(sql)?)
    }

    fn reserve(&mut self, table: &str, column: &str, n: usize) -> Result<Vec<i64>> {
        let key = format!("{table}.{column}");
        let have = self.reserved.get(&key).map_or(0, |q| q.len());
        if have < n {
            let more = (n - have).max(RESERVE_BLOCK);
            let sql = format!("SELECT nextval(pg_get_serial_sequence('{table}', '{column}')) FROM generate_series(1, ?1::bigint)");
            let mut ids = self.rows(&sql, &[Value::Integer(more as i64)])?.iter().map(|r| r.int(0)).collect::<Result<Vec<i64>>>()?;
            ids.sort_unstable();
            self.reserved.entry(key.clone()).or_default().extend(ids);
        }
        let q = self.reserved.entry(key).or_default();
        Ok(q.drain(..n.min(q.len())).collect())
    }

    fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        use postgres::types::Type;
        let st = self.statement(sql)?;
        let rows = self.c.query(&st, &pg_params(params))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut cells = Vec::with_capacity(r.len());
            for (i, col) in r.columns().iter().enumerate() {
                let ty = col.type_();
                let cell = if *ty == Type::INT8 {
                    r.try_get::<_, Option<i64>>(i)?.map(Cell::Integer)
                } else if *ty == Type::INT4 {
                    r.try_get::<_, Option<i32>>(i)?.map(|v| Cell::Integer(v.into()))
                } else if *ty == Type::FLOAT8 {
                    r.try_get::<_, Option<f64>>(i)?.map(Cell::Real)
                } else if *ty == Type::BOOL {
                    r.try_get::<_, Option<bool>>(i)?.map(|b| Cell::Integer(b.into()))
                } else if <&str as postgres::types::FromSql>::accepts(ty) {
                    r.try_get::<_, Option<String>>(i)?.map(Cell::Text)
                } else {
                    return Err(StoreError::Decode(format!("column {} has type {ty}, which the store does not read", col.name())));
                };
                cells.push(cell.unwrap_or(Cell::Null));
            }
            out.push(Row(cells));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{testdb, Store};
    use std::net::{TcpListener, TcpStream};
    use std::process::Command;
    use std::time::Instant;

    /// A TCP relay to `target` on a port of its own, for as long as the test runs.
    fn relay(target: std::net::SocketAddr) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else { continue };
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        port
    }

    /// Every packet to and from a local port dropped (iptables), until dropped itself.
    struct Cut(u16);

    impl Cut {
        fn rule(&self, op: &str, dir: &str) -> bool {
            let port = self.0.to_string();
            Command::new("iptables")
                .args(["-w", op, "INPUT", "-i", "lo", "-p", "tcp", dir, &port, "-j", "DROP"])
                .status()
                .is_ok_and(|s| s.success())
        }

        /// None (the test skipped, failing in CI) where this process cannot add the rules.
        fn new(port: u16) -> Option<Cut> {
            let cut = Cut(port);
            if cut.rule("-I", "--dport") && cut.rule("-I", "--sport") {
                return Some(cut);
            }
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and iptables cannot drop packets here (root and netfilter needed)");
            eprintln!("SKIP: iptables cannot drop packets here (root and netfilter needed)");
            None
        }
    }

    impl Drop for Cut {
        fn drop(&mut self) {
            self.rule("-D", "--dport");
            self.rule("-D", "--sport");
        }
    }

    /// A network that drops every packet between a server and its store, without a reset
    /// or a close (a host or a link gone), fails a statement in seconds (TCP_USER_TIMEOUT)
    /// instead of after the kernel's retransmissions give up (about 15 minutes); once the
    /// network is back, the store is used again on a new connection. Only this test's
    /// connection is cut: it goes through a relay whose port's packets are dropped.
    #[test]
    fn a_store_cut_off_without_a_word_fails_a_statement_in_seconds() {
        let Some(admin) = testdb::pg_url() else { return };
        let (url, schema) = testdb::pg_schema(&admin);
        let config = pg_config(&admin).unwrap();
        let (postgres::config::Host::Tcp(host), Some(&pg_port)) = (&config.get_hosts()[0], config.get_ports().first()) else {
            panic!("TRAINYARD_TEST_PG_URL must name a TCP host")
        };
        let target = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), pg_port)).unwrap().next().unwrap();
        let port = relay(target);
        let relayed = url.replacen(&format!("{host}:{pg_port}"), &format!("127.0.0.1:{port}"), 1);
        assert_ne!(relayed, url);
        let mut store = Store::connect(&Location::Postgres(relayed)).unwrap();
        store.set_meta("k", "v").unwrap();
        let cut = Cut::new(port);
        if cut.is_some() {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let r = store.meta("k");
                let _ = tx.send((r.is_err(), t0.elapsed(), store));
            });
            let (failed, took, back) = rx
                .recv_timeout(Duration::from_secs(90))
                .expect("a statement on a cut connection still waits after 90 s");
            assert!(failed, "the statement went through a cut network");
            eprintln!("a statement on a cut network failed after {took:?}");
            drop(cut);
            // The network is back: a new connection (the first statement may find the
            // old one closed).
            let again = (0..3).find_map(|_| back.meta("k").ok());
            assert_eq!(again, Some(Some("v".to_string())));
        }
        if let Ok(mut c) = postgres::Client::connect(&admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(redact("postgres://ty:s3cret@db.lab:5432/trainyard"), "postgres://ty:***@db.lab:5432/trainyard");
        assert_eq!(redact("postgres://ty@db/x?sslmode=disable&password=s3cret"), "postgres://ty@db/x?sslmode=disable&password=***");
        assert_eq!(redact("postgresql://db.lab/trainyard"), "postgresql://db.lab/trainyard");
        let e = Location::from_url("mysql://root:pw@db/x").unwrap_err();
        assert!(e.contains("not a PostgreSQL URL") && !e.contains("pw"), "{e}");
        assert!(Location::from_url("postgres://ty:pw@db:notaport/x").unwrap_err().contains("***"));
        assert_eq!(Location::from_url("postgres://ty:pw@db/x").unwrap().to_string(), "postgres://ty:***@db/x");
    }
}
