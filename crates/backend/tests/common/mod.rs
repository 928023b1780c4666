//! Helpers shared by the backend's test files.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};

use trainyard_backend::{BackendEvent, EventSink};

/// A sink whose events the test receives.
pub fn sink() -> (EventSink, Receiver<BackendEvent>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let sink: EventSink = Arc::new(move |ev| {
        let _ = tx.lock().unwrap().send(ev);
    });
    (sink, rx)
}
