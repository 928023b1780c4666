//! The leader's lease: several servers on one PostgreSQL store, one of them the leader.
//!
//! One row (`leader_lease`, id 1) says who leads, at which epoch, until when, and where
//! the others forward the writes that need the leader. Times are the database's clock
//! (microseconds since the epoch), so that servers whose clocks differ agree on it.
//!
//! - A server takes the lease when there is none or it has expired; the epoch goes up by
//!   one each time it changes hands ([`Store::lease_acquire`]).
//! - The leader renews it well before it expires ([`Store::lease_renew`]); a renewal that
//!   finds another epoch says the leader is deposed.
//! - The leader's driver writes through a fenced connection ([`Store::connect_leader`]):
//!   its session says its epoch, and the store's triggers, at each writing statement,
//!   hold the lease's lock shared and find the lease at that epoch, while a takeover holds
//!   the lock exclusively; so a takeover waits for the writes in flight, and every write
//!   after it is refused. A deposed leader's late writes change nothing.
//! - A leader that stops releases it ([`Store::lease_release`]) for the next to take at
//!   once.

pub use crate::fence::Fence;

use crate::db::Location;
use crate::{values, Result, Store, StoreError};

/// The database's clock in microseconds since the epoch.
const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// The lease as a server reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub epoch: i64,
    /// Which server holds it (its host and pid).
    pub holder: String,
    /// Where the holder's API is (`[store] advertise_url`).
    pub address: String,
    /// The config the holder runs with, as key/value lines (servers on one store agree).
    pub config: String,
    /// Microseconds until it expires by the database's clock (negative: expired).
    pub expires_in_us: i64,
    /// Microseconds since it was last taken or renewed.
    pub renewed_ago_us: i64,
}

impl Lease {
    pub fn expired(&self) -> bool {
        self.expires_in_us < 0
    }
}

impl Store {
    fn postgres_only(&self, what: &'static str) -> Result<()> {
        match self.location() {
            Location::Postgres(_) => Ok(()),
            Location::Sqlite(_) => Err(StoreError::NeedsPostgres(what)),
        }
    }

    /// The lease as it is now (None: never taken).
    pub fn lease(&self) -> Result<Option<Lease>> {
        self.postgres_only("a leader's lease")?;
        let sql = format!(
            "SELECT epoch, holder, address, config, expires_at - {NOW_US}, {NOW_US} - renewed_at FROM leader_lease WHERE id = 1"
        );
        let rows = self.read(|e| e.rows(&sql, &[]))?;
        rows.first()
            .map(|r| {
                Ok(Lease {
                    epoch: r.int(0)?,
                    holder: r.text(1)?,
                    address: r.text(2)?,
                    config: r.text(3)?,
                    expires_in_us: r.int(4)?,
                    renewed_ago_us: r.int(5)?,
                })
            })
            .transpose()
    }

    /// Take the lease for `secs` when nobody holds it (never taken, expired or released):
    /// the new epoch, or None while another server holds it.
    pub fn lease_acquire(
        &self,
        holder: &str,
        address: &str,
        config: &str,
        secs: u64,
    ) -> Result<Option<i64>> {
        self.postgres_only("a leader's lease")?;
        let sql = format!(
            "INSERT INTO leader_lease (id, epoch, holder, address, config, expires_at, renewed_at) \
             VALUES (1, 1, ?1, ?2, ?3, {NOW_US} + ?4, {NOW_US}) \
             ON CONFLICT (id) DO UPDATE SET epoch = leader_lease.epoch + 1, holder = excluded.holder, \
             address = excluded.address, config = excluded.config, expires_at = excluded.expires_at, \
             renewed_at = excluded.renewed_at WHERE leader_lease.expires_at < {NOW_US} RETURNING epoch"
        );
        self.change_hands(&sql, values![holder, address, config, secs_to_micros(secs)])
    }

    /// Take over the lease of `epoch`, expired or not, for `secs`: for a holder known to
    /// be gone (its process ended on this host). The new epoch, or None if the lease is no
    /// longer at `epoch` (another server took it first).
    pub fn lease_take_over(
        &self,
        epoch: i64,
        holder: &str,
        address: &str,
        config: &str,
        secs: u64,
    ) -> Result<Option<i64>> {
        self.postgres_only("a leader's lease")?;
        let sql = format!(
            "UPDATE leader_lease SET epoch = epoch + 1, holder = ?2, address = ?3, config = ?4, expires_at = {NOW_US} + ?5, \
             renewed_at = {NOW_US} WHERE id = 1 AND epoch = ?1 RETURNING epoch"
        );
        self.change_hands(
            &sql,
            values![epoch, holder, address, config, secs_to_micros(secs)],
        )
    }

    /// Run `sql`, which gives the lease to this server (RETURNING its new epoch), under
    /// the lease's lock (see `db::LEASE_LOCK`).
    fn change_hands(&self, sql: &str, params: &[crate::sql::Value]) -> Result<Option<i64>> {
        let rows = self.write(|e| {
            // Bounded: a server that cannot get the lock says so and tries again at its
            // next look, rather than hanging (a holder's session idle in a transaction is
            // ended by the database, see db::IDLE_IN_TRANSACTION).
            e.execute("SET LOCAL lock_timeout = 5000", &[])?;
            e.execute(
                &format!("SELECT pg_advisory_xact_lock({})", crate::db::LEASE_LOCK),
                &[],
            )?;
            e.rows(sql, params)
        })?;
        rows.first().map(|r| r.int(0)).transpose()
    }

    /// Renew the lease of `epoch` for `secs` from now: false when it is another epoch's
    /// (this server was deposed).
    pub fn lease_renew(&self, epoch: i64, secs: u64) -> Result<bool> {
        self.postgres_only("a leader's lease")?;
        let sql = format!("UPDATE leader_lease SET expires_at = {NOW_US} + ?2, renewed_at = {NOW_US} WHERE id = 1 AND epoch = ?1");
        let n = self.write(|e| e.execute(&sql, values![epoch, secs_to_micros(secs)]))?;
        Ok(n == 1)
    }

    /// Let the lease of `epoch` go (a leader that stops): the next server takes it at once.
    pub fn lease_release(&self, epoch: i64) -> Result<()> {
        self.postgres_only("a leader's lease")?;
        let sql = format!(
            "UPDATE leader_lease SET expires_at = {NOW_US} - 1 WHERE id = 1 AND epoch = ?1"
        );
        self.write(|e| e.execute(&sql, values![epoch]))?;
        Ok(())
    }
}

/// The lease of the store at `location` as it is, read without migrating or writing
/// anything (for `trainyard doctor`): None when never taken, or the schema has no lease
/// yet.
pub fn lease_at(location: &Location) -> Result<Option<Lease>> {
    let Location::Postgres(url) = location else {
        return Err(StoreError::NeedsPostgres("a leader's lease"));
    };
    if crate::schema_version_at(location)? < LEASE_SCHEMA {
        return Ok(None);
    }
    let store = crate::Store::from_pg(crate::db::Pg::connect(url)?, location.clone());
    store.lease()
}

/// The schema version that has the lease.
const LEASE_SCHEMA: i64 = 5;

fn secs_to_micros(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A new PostgreSQL store whose lease server "a" took for `secs`.
    fn leased(secs: u64) -> Option<(testdb::TestStore, Store, Location, i64)> {
        let t = testdb::postgres()?;
        let store = t.open();
        let location = store.location().clone();
        let epoch = store
            .lease_acquire("a", "http://a", "", secs)
            .unwrap()
            .unwrap();
        Some((t, store, location, epoch))
    }
    use crate::testdb;

    #[test]
    fn a_lease_is_taken_by_one_server_at_a_time_and_the_epoch_goes_up_each_time_it_changes_hands() {
        let Some(t) = testdb::postgres() else { return };
        let store = t.open();
        assert_eq!(store.lease().unwrap(), None);
        assert_eq!(
            store.lease_acquire("a", "http://a", "k = 1", 30).unwrap(),
            Some(1)
        );
        assert_eq!(
            store.lease_acquire("b", "http://b", "k = 1", 30).unwrap(),
            None,
            "held"
        );
        let l = store.lease().unwrap().unwrap();
        assert_eq!(
            (
                l.epoch,
                l.holder.as_str(),
                l.address.as_str(),
                l.config.as_str()
            ),
            (1, "a", "http://a", "k = 1")
        );
        assert!(
            !l.expired() && l.expires_in_us > 25_000_000 && l.renewed_ago_us >= 0,
            "{l:?}"
        );
        assert!(store.lease_renew(1, 30).unwrap());
        // Released: the next server takes it at once, at the next epoch; the old epoch's
        // renewal then says it was deposed.
        store.lease_release(1).unwrap();
        assert!(store.lease().unwrap().unwrap().expired());
        assert_eq!(
            store.lease_acquire("b", "http://b", "k = 2", 30).unwrap(),
            Some(2)
        );
        assert!(!store.lease_renew(1, 30).unwrap());
        store.lease_release(1).unwrap();
        assert!(
            !store.lease().unwrap().unwrap().expired(),
            "an old epoch's release changes nothing"
        );
        // Expired (a leader that stopped renewing): taken over.
        assert!(store.lease_renew(2, 0).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            store.lease_acquire("c", "http://c", "", 30).unwrap(),
            Some(3)
        );
        // A holder known to be gone is taken over before its lease expires, once.
        assert_eq!(
            store.lease_take_over(3, "d", "http://d", "", 30).unwrap(),
            Some(4)
        );
        assert_eq!(
            store.lease_take_over(3, "e", "http://e", "", 30).unwrap(),
            None
        );
        assert_eq!(store.lease().unwrap().unwrap().holder, "d");
    }

    /// A deposed leader's late writes are refused by the store: its fenced connection
    /// fails every statement with `Fenced` once the lease is another epoch's, also one
    /// made again after the takeover; the new leader's writes go on.
    #[test]
    fn a_deposed_leaders_writes_are_refused() {
        let Some((_t, store, location, epoch)) = leased(30) else {
            return;
        };
        let mut leader =
            Store::connect_leader(&location, Some(Fence::new(epoch, Duration::from_secs(30))))
                .unwrap();
        leader.set_meta("written", "by a").unwrap();
        store.lease_release(epoch).unwrap();
        let next = store
            .lease_acquire("b", "http://b", "", 30)
            .unwrap()
            .unwrap();
        let e = leader.set_meta("written", "late, by a").unwrap_err();
        assert!(matches!(e, StoreError::Fenced(_)), "{e:?}");
        assert!(e.to_string().contains(&format!("epoch {epoch}")), "{e}");
        // Also on a connection made after the takeover; its reads go on.
        let mut again =
            Store::connect_leader(&location, Some(Fence::new(epoch, Duration::from_secs(30))))
                .unwrap();
        let e = again.set_meta("written", "later, by a").unwrap_err();
        assert!(matches!(e, StoreError::Fenced(_)), "{e:?}");
        assert_eq!(again.meta("written").unwrap().as_deref(), Some("by a"));
        let fence = Fence::new(next, Duration::from_secs(1));
        let mut b = Store::connect_leader(&location, Some(fence.clone())).unwrap();
        fence.renewed(Instant::now());
        b.set_meta("written", "by b").unwrap();
        assert_eq!(store.meta("written").unwrap().as_deref(), Some("by b"));
        // While its renewals fail, a leader writes nothing (transiently), then goes on.
        std::thread::sleep(Duration::from_millis(800));
        assert!(!fence.held());
        let e = b.set_meta("written", "while lapsed").unwrap_err();
        assert!(
            matches!(e, StoreError::LeaseLapsed(n) if n == next) && e.is_transient(),
            "{e:?}"
        );
        fence.renewed(Instant::now());
        assert!(fence.held());
        b.set_meta("written", "renewed").unwrap();
        assert_eq!(store.meta("written").unwrap().as_deref(), Some("renewed"));
    }

    /// A takeover waits for the deposed leader's transaction in flight (which holds the
    /// lease row in share mode) rather than interleaving with it.
    #[test]
    fn a_takeover_waits_for_the_leaders_transaction_in_flight() {
        let Some((_t, store, location, epoch)) = leased(0) else {
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(5));
        let leader =
            Store::connect_leader(&location, Some(Fence::new(epoch, Duration::from_secs(30))))
                .unwrap();
        let (started, go) = (
            std::sync::mpsc::channel::<()>(),
            std::sync::mpsc::channel::<()>(),
        );
        let taker = {
            let location = location.clone();
            let (ready, wait) = (started.0, go.1);
            std::thread::spawn(move || {
                let other = Store::connect(&location).unwrap();
                wait.recv().unwrap();
                let t = std::time::Instant::now();
                ready.send(()).unwrap();
                (
                    other.lease_acquire("b", "http://b", "", 30).unwrap(),
                    t.elapsed(),
                )
            })
        };
        leader
            .write(|e| {
                e.execute("INSERT INTO meta (key, value) VALUES ('in-flight', 'a') ON CONFLICT (key) DO UPDATE SET value = excluded.value", &[])?;
                go.0.send(()).unwrap();
                started.1.recv().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(300));
                Ok(())
            })
            .unwrap();
        let (took, waited) = taker.join().unwrap();
        assert_eq!(took, Some(epoch + 1));
        assert!(
            waited >= std::time::Duration::from_millis(250),
            "the takeover did not wait for the transaction: {waited:?}"
        );
        assert_eq!(store.meta("in-flight").unwrap().as_deref(), Some("a"));
    }

    /// A leader frozen in the middle of a transaction (SIGSTOP, a host cut off) holds the
    /// lease's lock shared for as long as its session lives: the database ends a session
    /// idle in a transaction (db::IDLE_IN_TRANSACTION), so the takeover goes through
    /// without it, and the frozen transaction's write is not kept.
    #[test]
    fn a_takeover_is_not_held_up_for_good_by_a_leader_frozen_in_a_transaction() {
        let Some((_t, store, location, epoch)) = leased(0) else {
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (in_tx, thaw) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel::<()>());
        let frozen = {
            let (in_tx, thaw) = (in_tx.0, thaw.1);
            std::thread::spawn(move || {
                let leader = Store::connect_leader(&location, Some(Fence::new(epoch, Duration::from_secs(30)))).unwrap();
                leader.write(|e| {
                    e.execute("INSERT INTO meta (key, value) VALUES ('frozen', 'a')", &[])?;
                    in_tx.send(()).unwrap();
                    // Frozen until the takeover is through (or a minute, if it never is).
                    let _ = thaw.recv_timeout(Duration::from_secs(60));
                    e.execute("INSERT INTO meta (key, value) VALUES ('thawed', 'a')", &[])?;
                    Ok(())
                })
            })
        };
        in_tx.1.recv().unwrap();
        let t = Instant::now();
        let took = loop {
            // A try that met the lock's timeout is tried again, as a follower does.
            match store.lease_acquire("b", "http://b", "", 30) {
                Ok(took) => break took,
                Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "{e}"),
            }
        };
        let waited = t.elapsed();
        thaw.0.send(()).unwrap();
        assert_eq!(took, Some(epoch + 1));
        assert!(waited < Duration::from_secs(30), "the takeover waited {waited:?} for the frozen leader");
        assert!(frozen.join().unwrap().is_err(), "the frozen leader's transaction went on");
        assert_eq!(store.meta("frozen").unwrap(), None);
        assert_eq!(store.meta("thawed").unwrap(), None);
    }

    /// A fence is held for four fifths of the lease after a renewal; effects that wait for
    /// it go on once a renewal goes through.
    #[test]
    fn a_lapsed_fence_is_waited_for_until_a_renewal() {
        let fence = Fence::new(1, Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(80));
        assert!(!fence.held());
        let waiter = {
            let fence = fence.clone();
            std::thread::spawn(move || {
                fence.wait_held();
                Instant::now()
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let renewed = Instant::now();
        fence.renewed(renewed);
        assert!(
            waiter.join().unwrap() >= renewed,
            "the wait ended before the renewal"
        );
        assert!(fence.held());
    }

    #[test]
    fn sqlite_has_no_lease() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        assert!(matches!(store.lease(), Err(StoreError::NeedsPostgres(_))));
        assert!(Store::connect_leader(
            store.location(),
            Some(Fence::new(3, Duration::from_secs(30)))
        )
        .is_ok());
    }
}
