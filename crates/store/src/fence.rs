//! The fence a leader acts under (see `lease`): its lease's epoch, and whether the lease
//! is known to be held now.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a leader acts under: its lease's epoch, and whether the lease is known to be held
/// now. It is while less than four fifths of the lease have passed since the start of the
/// last renewal that went through (by the monotonic clock, which also runs while the
/// process is stopped: a leader that wakes up from SIGSTOP finds it lapsed at once).
/// Clones share the renewals.
#[derive(Clone, Debug)]
pub struct Fence {
    pub epoch: i64,
    state: Arc<FenceState>,
}

#[derive(Debug)]
struct FenceState {
    start: Instant,
    /// Milliseconds since `start` of the last renewal.
    renewed_ms: AtomicU64,
    trust: Duration,
}

impl Fence {
    /// The fence of a lease of `epoch` for `lease`, taken (or renewed) now.
    pub fn new(epoch: i64, lease: Duration) -> Fence {
        let state = FenceState {
            start: Instant::now(),
            renewed_ms: AtomicU64::new(0),
            trust: lease * 4 / 5,
        };
        Fence {
            epoch,
            state: Arc::new(state),
        }
    }

    /// A renewal that went through, started at `at`.
    pub fn renewed(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.state.start).as_millis() as u64;
        self.state.renewed_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// Time since the start of the last renewal that went through.
    pub fn since_renewal(&self) -> Duration {
        let now = self.state.start.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.state.renewed_ms.load(Ordering::SeqCst),
        ))
    }

    pub fn held(&self) -> bool {
        self.since_renewal() < self.state.trust
    }

    /// Wait until the lease is held (a leader whose lease passed to another server exits
    /// meanwhile): effects on the world wait for it.
    pub fn wait_held(&self) {
        while !self.held() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

