//! The driver's liveness, as `/healthz` and the API report it. The HTTP layer answering is
//! not the server being alive: the driver is. It beats at every turn of its loop; while it
//! cannot write its store it is degraded (the API answers 503 with the reason and the
//! driver tries again by itself); when it cannot go on it is stopped, and the process
//! exits non-zero so that a supervisor restarts it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// A driver that has not turned its loop for this long is taken for hung.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

pub struct Health {
    started: Instant,
    /// Milliseconds since `started` of the driver's last turn.
    beat_ms: AtomicI64,
    state: RwLock<State>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Ok,
    /// The store cannot be written now; the driver tries again by itself.
    Degraded(String),
    /// The driver ended; the process is going down.
    Stopped(String),
}

impl Default for Health {
    fn default() -> Self {
        Health { started: Instant::now(), beat_ms: AtomicI64::new(0), state: RwLock::new(State::Ok) }
    }
}

impl Health {
    pub fn beat(&self) {
        self.beat_ms.store(self.started.elapsed().as_millis() as i64, Ordering::Relaxed);
    }

    pub fn set(&self, state: State) {
        if let Ok(mut s) = self.state.write() {
            *s = state;
        }
    }

    /// Why the driver cannot take work now, or None when it can.
    pub fn unavailable(&self) -> Option<String> {
        match self.state.read().map(|s| s.clone()).unwrap_or(State::Ok) {
            State::Ok => {
                let idle = self.started.elapsed().as_millis() as i64 - self.beat_ms.load(Ordering::Relaxed);
                (idle > STALE_AFTER.as_millis() as i64).then(|| format!("the driver has not answered for {} s", idle / 1000))
            }
            State::Degraded(why) => Some(why),
            State::Stopped(why) => Some(format!("the driver stopped: {why}")),
        }
    }
}
