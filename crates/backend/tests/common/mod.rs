//! Helpers shared by the backend's test files.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};

use trainyard_backend::{BackendEvent, EventSink, LocalBackend};

/// A sink whose events the test receives.
pub fn sink() -> (EventSink, Receiver<BackendEvent>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let sink: EventSink = Arc::new(move |ev| {
        let _ = tx.lock().unwrap().send(ev);
    });
    (sink, rx)
}

/// Kills a replica (its run directory) when dropped, so that a failed test leaves nothing
/// running (a fork bomb, a flood of output).
#[allow(dead_code)] // not every test file launches replicas
pub struct KillOnDrop<'a>(pub &'a LocalBackend, pub PathBuf);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill(&self.1);
    }
}
