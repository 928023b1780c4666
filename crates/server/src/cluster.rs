//! Several servers on one PostgreSQL store, one leader at a time.
//!
//! Every server answers the API. The leader runs the driver (scheduling, launches, stops,
//! timers) while it holds the store's lease ([`trainyard_store::lease`]); the others are
//! followers: they serve reads from the store, the logs and the Cloud Storage endpoint
//! from the shared data directory, and forward every request that needs the driver
//! (creates, cancels, deletes, the Vizier API, administration) to the leader's address
//! (`http::forward`). A follower polls the lease and takes it once it has expired (the
//! leader's host is gone, it is frozen, it was cut off from the store), or at once when
//! the leader's process has ended on this same host; then it starts the driver at the
//! next epoch, which adopts the replicas the old leader started.
//!
//! The leader renews its lease every third of `[store] lease_secs`, from the moment it
//! took it. Once four fifths of the lease have passed since its last renewal it acts on
//! nothing until one goes through: its store connection writes nothing (the driver is
//! degraded: 503 with Retry-After) and its engine's launches, stops and signals wait
//! ([`FencedBackend`]). One that finds the lease at another epoch stops at once (exit
//! status [`DEPOSED_EXIT`]), and a supervisor starts it again, as a follower. The store
//! fences it besides: its triggers refuse a deposed leader's late writes.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use trainyard_store::lease::Fence;
use trainyard_store::{Location, Store, StoreError};

/// The exit status of a server that lost its lease (EX_TEMPFAIL: start it again).
pub const DEPOSED_EXIT: i32 = 75;

/// How often a follower looks at the lease.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// What this server knows of the leadership, for `/healthz`, `/metrics` and forwarding.
pub struct View {
    seen: RwLock<Seen>,
    /// Milliseconds since `born` of the last renewal (the leader) or of the leader's
    /// renewal as last seen (a follower).
    renewed_ms: AtomicI64,
    born: Instant,
}

impl Default for View {
    fn default() -> Self {
        View {
            seen: RwLock::default(),
            renewed_ms: AtomicI64::new(0),
            born: Instant::now(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// This server holds the lease.
    pub leading: bool,
    /// The lease's epoch (0: never taken).
    pub epoch: i64,
    /// The leader's API (None: no live leader now).
    pub leader: Option<String>,
    /// Which server leads (its host and pid).
    pub holder: String,
}

impl View {
    pub fn seen(&self) -> Seen {
        self.seen.read().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, seen: Seen, renewed_ago: Duration) {
        if let Ok(mut s) = self.seen.write() {
            *s = seen;
        }
        let at = self.born.elapsed().as_millis() as i64 - renewed_ago.as_millis() as i64;
        self.renewed_ms.store(at, Ordering::Relaxed);
    }

    /// Time since the lease was last renewed.
    pub fn lease_age(&self) -> Duration {
        let now = self.born.elapsed().as_millis() as i64;
        Duration::from_millis((now - self.renewed_ms.load(Ordering::Relaxed)).max(0) as u64)
    }

    /// `/healthz`'s word on the role.
    /// `driving`: this process runs the driver now (a server that just took the lease
    /// still answers as a follower until its driver has started).
    pub fn describe(&self, driving: bool) -> String {
        let s = self.seen();
        match (&s.leader, s.leading) {
            (_, true) if driving => format!("leader, epoch {}", s.epoch),
            (_, true) => format!("taking the lease over, epoch {}", s.epoch),
            (Some(l), false) => format!("follower of {l} ({}), epoch {}", s.holder, s.epoch),
            (None, false) => format!("follower, no leader now (last epoch {})", s.epoch),
        }
    }
}

/// This server as a member of the servers on one store.
pub struct Member {
    location: Location,
    /// Who this server is: its host and pid.
    pub holder: String,
    /// Where the others reach its API (`[store] advertise_url`).
    pub address: String,
    /// The config it runs with, as servers on one store must agree on it.
    agreed: String,
    lease_secs: u64,
    pub view: Arc<View>,
    /// Where the lease is shown (`/metrics` of the follower, then of the leader).
    metrics: RwLock<Option<Arc<crate::metrics::Metrics>>>,
}

impl Member {
    pub fn new(cfg: &crate::Config, location: Location) -> Member {
        Member {
            location,
            holder: format!("{} pid {}", crate::config::this_host(), std::process::id()),
            address: cfg.advertised(),
            agreed: cfg.agreed(),
            lease_secs: cfg.lease_secs,
            view: Arc::new(View::default()),
            metrics: RwLock::new(None),
        }
    }

    /// At start: a live leader that runs with another config refuses this server, naming
    /// the keys that differ.
    pub fn check_agreement(&self, store: &Store) -> Result<(), String> {
        let Some(lease) = store.lease().map_err(|e| e.to_string())? else {
            return Ok(());
        };
        if lease.expired() {
            return Ok(());
        }
        let differ = crate::config::differing_keys(&self.agreed, &lease.config);
        if differ.is_empty() {
            return Ok(());
        }
        Err(format!(
            "this server's config differs from that of the leader on the same store ({} at {}): {}; {}",
            lease.holder,
            lease.address,
            differ.join("; "),
            crate::config::ONE_CONFIG
        ))
    }

    /// Follow until the lease is this server's: its epoch, or None once `stop` is set. A
    /// store out of reach is waited for (and said, once a minute at most).
    /// `health` beats at each look (a follower's liveness is its following).
    pub fn follow(&self, stop: &AtomicBool, health: &crate::health::Health) -> Option<i64> {
        let mut store: Option<Store> = None;
        let mut last_said: Option<Instant> = None;
        let mut last_leader: Option<String> = None;
        while !stop.load(Ordering::Relaxed) {
            health.beat();
            let r = self.follow_once(&mut store);
            self.report();
            match r {
                Ok(Some(epoch)) => return Some(epoch),
                Ok(None) => {
                    let now = self.view.seen();
                    if now.leader != last_leader {
                        match &now.leader {
                            Some(l) => tracing::info!(
                                "following the leader {l} ({}, epoch {})",
                                now.holder,
                                now.epoch
                            ),
                            None => tracing::info!("no leader now (last epoch {})", now.epoch),
                        }
                        last_leader = now.leader;
                    }
                }
                Err(e) => {
                    store = None;
                    if last_said.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!("following: cannot read the lease: {e}; trying again");
                        last_said = Some(Instant::now());
                    }
                }
            }
            std::thread::sleep(FOLLOW_POLL);
        }
        None
    }

    fn follow_once(&self, store: &mut Option<Store>) -> Result<Option<i64>, StoreError> {
        if store.is_none() {
            *store = Some(Store::connect(&self.location)?);
        }
        let Some(s) = store.as_ref() else {
            return Ok(None);
        };
        let lease = s.lease()?;
        if let Some(l) = lease
            .as_ref()
            .filter(|l| !l.expired() && self.gone_from_this_host(&l.holder))
        {
            // Its process ended on this host (a kill -9, a crash): no need to wait for the
            // lease to expire.
            let took = s.lease_take_over(
                l.epoch,
                &self.holder,
                &self.address,
                &self.agreed,
                self.lease_secs,
            )?;
            if let Some(epoch) = took {
                tracing::info!(
                    "the leader {} (epoch {}) is gone from this host: taking over at once",
                    l.holder,
                    l.epoch
                );
                self.view.set(self.leading(epoch), Duration::ZERO);
                return Ok(Some(epoch));
            }
            return Ok(None);
        }
        if let Some(l) = lease.as_ref().filter(|l| !l.expired()) {
            let renewed = Duration::from_micros(l.renewed_ago_us.max(0) as u64);
            self.view.set(
                Seen {
                    leading: false,
                    epoch: l.epoch,
                    leader: Some(l.address.clone()),
                    holder: l.holder.clone(),
                },
                renewed,
            );
            return Ok(None);
        }
        let last = lease.as_ref().map_or(0, |l| l.epoch);
        self.view.set(
            Seen {
                leading: false,
                epoch: last,
                leader: None,
                holder: String::new(),
            },
            self.view.lease_age(),
        );
        let took = s.lease_acquire(&self.holder, &self.address, &self.agreed, self.lease_secs)?;
        if let Some(epoch) = took {
            self.view.set(self.leading(epoch), Duration::ZERO);
        }
        Ok(took)
    }

    /// This server, leading at `epoch`.
    fn leading(&self, epoch: i64) -> Seen {
        Seen {
            leading: true,
            epoch,
            leader: Some(self.address.clone()),
            holder: self.holder.clone(),
        }
    }

    /// Is `holder` a server of this host whose process has ended? (Holders are "HOST pid
    /// N"; a live process of that pid that is not a Trainyard server counts as ended.)
    fn gone_from_this_host(&self, holder: &str) -> bool {
        let Some((host, pid)) = holder.rsplit_once(" pid ") else {
            return false;
        };
        let Some((mine, _)) = self.holder.rsplit_once(" pid ") else {
            return false;
        };
        if host != mine || holder == self.holder {
            return false;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            return false;
        };
        match std::fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(cmdline) => !String::from_utf8_lossy(&cmdline).contains("trainyard"),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }

    /// Show the lease in `metrics` from now on.
    pub fn report_to(&self, metrics: Arc<crate::metrics::Metrics>) {
        if let Ok(mut m) = self.metrics.write() {
            *m = Some(metrics);
        }
        self.report();
    }

    fn report(&self) {
        if let Some(m) = self.metrics.read().ok().and_then(|m| m.clone()) {
            let seen = self.view.seen();
            m.lease(
                seen.epoch,
                seen.leading,
                self.view.lease_age().as_secs_f64(),
            );
        }
    }

    /// Take the lease now if it is free (or its holder is gone from this host): at start,
    /// so that a server alone on its store leads without following first.
    pub fn try_lead(&self) -> Result<Option<i64>, StoreError> {
        self.follow_once(&mut None)
    }

    /// Keep the lease of `epoch`, just taken, from now on (before the driver starts): its
    /// fence, renewed by a thread of its own. The fence lapses by itself once four fifths
    /// of the lease have passed since the last renewal (the driver then writes, and so
    /// acts on, nothing) and holds again when a renewal goes through; a watcher says so in
    /// the log and keeps the metrics of [`Member::report_to`] (epoch, lease age) current.
    /// A renewal that finds another epoch stops the process.
    pub fn keep(self: &Arc<Self>, epoch: i64) -> std::io::Result<Fence> {
        let lease = Duration::from_secs(self.lease_secs);
        let fence = Fence::new(epoch, lease);
        let watched = fence.clone();
        self.report();
        {
            let me = Arc::clone(self);
            let fence = fence.clone();
            std::thread::Builder::new().name("lease".into()).spawn(move || {
                let mut store: Option<Store> = None;
                loop {
                    std::thread::sleep(lease / 3);
                    let started = Instant::now();
                    let r = match store.take() {
                        Some(s) => Ok(s),
                        None => Store::connect(&me.location),
                    }
                    .and_then(|s| s.lease_renew(epoch, me.lease_secs).map(|kept| (s, kept)));
                    match r {
                        Ok((s, true)) => {
                            store = Some(s);
                            fence.renewed(started);
                            me.view.set(
                                me.leading(epoch),
                                started.elapsed(),
                            );
                        }
                        Ok((_, false)) => deposed(&format!("the store's lease is no longer at this server's epoch {epoch}: another server leads")),
                        Err(e) => tracing::warn!("cannot renew the lease (epoch {epoch}): {e}; trying again"),
                    }
                }
            })?;
        }
        let me = Arc::clone(self);
        let fence = watched.clone();
        std::thread::Builder::new().name("lease-watch".into()).spawn(move || {
            let mut held = true;
            loop {
                std::thread::sleep(Duration::from_millis(100));
                me.report();
                match (held, fence.held()) {
                    (true, false) => tracing::error!(
                        "the lease (epoch {epoch}) was last renewed {:.1} s ago and expires at {} s: this server writes, \
                         starts and stops nothing until it renews it (or stops, if another server took it over)",
                        fence.since_renewal().as_secs_f64(),
                        lease.as_secs()
                    ),
                    (false, true) => tracing::info!("the lease (epoch {epoch}) is renewed again: this server goes on leading"),
                    _ => {}
                }
                held = fence.held();
            }
        })?;
        Ok(watched)
    }

    /// A leader that stops lets the lease go: a follower takes it at once.
    pub fn release(&self, epoch: i64) {
        match Store::connect(&self.location).and_then(|s| s.lease_release(epoch)) {
            Ok(()) => tracing::info!("the lease (epoch {epoch}) is let go: a follower takes over"),
            Err(e) => tracing::warn!("cannot let the lease (epoch {epoch}) go ({e}); a follower takes over once it expires"),
        }
    }
}

/// Stop now: without a lease this server must not act (its replicas run on; the next
/// leader adopts them).
fn deposed(why: &str) -> ! {
    tracing::error!(
        "{why}; stopping now (exit status {DEPOSED_EXIT}): started again, this server follows"
    );
    std::process::exit(DEPOSED_EXIT)
}

/// The file of a run directory that holds the epoch of the leader that launched it.
pub const LAUNCHED_BY: &str = "leader.epoch";

/// A leader's engine: its effects on the world (launches, stops, kills, signals) wait
/// while its lease is not known to be held, so a leader that was stopped (SIGSTOP, a
/// frozen host) and wakes up after another server took over acts on nothing before it
/// finds out and exits. Every call is idempotent by `RunId` besides: a launch or stop the
/// next leader repeats from the outbox changes nothing twice.
pub struct FencedBackend {
    pub inner: Arc<dyn trainyard_backend::Backend>,
    pub fence: Fence,
}

impl trainyard_backend::Backend for FencedBackend {
    fn launch(
        &self,
        runs: Vec<trainyard_backend::Launch>,
        sink: trainyard_backend::EventSink,
    ) -> Vec<(
        trainyard_core::RunId,
        Result<(), trainyard_backend::BackendError>,
    )> {
        self.fence.wait_held();
        // Each run says which leader started it (its epoch), for whoever adopts it later.
        for r in &runs {
            let at = r.run_dir.join(LAUNCHED_BY);
            if let Err(e) = std::fs::write(&at, format!("{}\n", self.fence.epoch)) {
                tracing::warn!("{}: cannot write {}: {e}", r.run, at.display());
            }
        }
        self.inner.launch(runs, sink)
    }

    fn adopt(
        &self,
        run: trainyard_core::RunId,
        run_dir: std::path::PathBuf,
        sink: trainyard_backend::EventSink,
    ) -> Result<(), trainyard_backend::BackendError> {
        self.inner.adopt(run, run_dir, sink)
    }

    fn stop(
        &self,
        run: &trainyard_core::RunId,
        run_dir: std::path::PathBuf,
    ) -> Result<(), trainyard_backend::BackendError> {
        self.fence.wait_held();
        self.inner.stop(run, run_dir)
    }

    fn kill(
        &self,
        run: &trainyard_core::RunId,
        run_dir: std::path::PathBuf,
    ) -> Result<(), trainyard_backend::BackendError> {
        self.fence.wait_held();
        self.inner.kill(run, run_dir)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn waiting_reason(&self, run: &trainyard_core::RunId) -> Option<String> {
        self.inner.waiting_reason(run)
    }

    fn signal(
        &self,
        run: &trainyard_core::RunId,
        run_dir: std::path::PathBuf,
        signal: i32,
    ) -> Result<(), trainyard_backend::BackendError> {
        self.fence.wait_held();
        self.inner.signal(run, run_dir, signal)
    }

    fn held_for_resources(&self, run: &trainyard_core::RunId) -> bool {
        self.inner.held_for_resources(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_says_the_role() {
        let v = View::default();
        assert_eq!(v.describe(false), "follower, no leader now (last epoch 0)");
        v.set(
            Seen {
                leading: false,
                epoch: 4,
                leader: Some("http://a:1".into()),
                holder: "a pid 9".into(),
            },
            Duration::from_secs(2),
        );
        assert_eq!(
            v.describe(false),
            "follower of http://a:1 (a pid 9), epoch 4"
        );
        assert!(v.lease_age() >= Duration::from_secs(2));
        v.set(
            Seen {
                leading: true,
                epoch: 5,
                leader: Some("http://b:1".into()),
                holder: "b".into(),
            },
            Duration::ZERO,
        );
        assert_eq!(v.describe(true), "leader, epoch 5");
        assert_eq!(v.describe(false), "taking the lease over, epoch 5");
    }
}
