//! The waiting reasons of the latest scheduling round and running jobs' progress, as
//! readers of every kind see them (published by the driver, read by the API).

use std::collections::HashMap;
use std::sync::Arc;

use trainyard_core::schedule::{waiting_text, Position};

/// The waiting reasons of the latest scheduling round, with their moving numbers
/// (positions, what is in use, expected times), for readers: shown on GET, never written.
#[derive(Default)]
pub struct WaitingView {
    reasons: std::sync::RwLock<Arc<HashMap<u64, Waiting>>>,
    /// Running jobs' progress and ETA (see `driver::progress`).
    progress: std::sync::RwLock<Arc<HashMap<u64, trainyard_api::types::TrainyardProgress>>>,
}

/// A waiting reason as the latest round gave it: shared by the jobs in the same
/// situation, with each one's position.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub reason: Arc<str>,
    pub position: Option<Position>,
}

impl Waiting {
    pub fn text(&self, project: &str) -> String {
        waiting_text(&self.reason, self.position, project)
    }
}

impl WaitingView {
    /// The job's current waiting reason, if the last round gave it one.
    pub fn get(&self, id: u64, project: &str) -> Option<String> {
        self.reasons.read().ok().and_then(|m| m.get(&id).map(|w| w.text(project)))
    }

    pub(crate) fn snapshot(&self) -> HashMap<u64, Waiting> {
        self.reasons.read().map(|m| (**m).clone()).unwrap_or_default()
    }

    /// A running job's progress, if its program reports any.
    pub fn progress(&self, id: u64) -> Option<trainyard_api::types::TrainyardProgress> {
        self.progress.read().ok().and_then(|m| m.get(&id).cloned())
    }

    pub(crate) fn publish_progress(&self, shown: HashMap<u64, trainyard_api::types::TrainyardProgress>) {
        if let Ok(mut m) = self.progress.write() {
            *m = Arc::new(shown);
        }
    }

    pub(crate) fn publish(&self, reasons: HashMap<u64, Waiting>) {
        if let Ok(mut m) = self.reasons.write() {
            *m = Arc::new(reasons);
        }
    }
}
