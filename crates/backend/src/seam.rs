//! The `Backend` seam: what the driver asks of an execution engine. The local backend
//! (processes under shims) and the Slurm backend implement it.

use std::path::PathBuf;

use trainyard_core::RunId;

use crate::local::{BackendError, EventSink};
use crate::shim::ShimSpec;

/// One run to start: its id (the fencing token), its run directory, what it runs, and the
/// node the scheduler chose (an engine that places work itself may ignore it).
#[derive(Clone, Debug)]
pub struct Launch {
    pub run: RunId,
    pub run_dir: PathBuf,
    pub spec: ShimSpec,
    pub node: String,
}

/// An execution engine. Every method is idempotent for a given `RunId`, and every report
/// goes to the sink with the run's id; the driver drops stale ones.
pub trait Backend: Send + Sync {
    /// Start runs that belong together (every replica of an attempt at once, L6, or one
    /// restarted replica). A run that was already started is adopted, never started twice.
    /// Returns, per run, whether it could be handed to the engine; a failure here means
    /// nothing was started for that run.
    fn launch(&self, runs: Vec<Launch>, sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)>;

    /// Watch a run started by an earlier server process (L23): report `Started` if it did
    /// start, then `Exited` when it ends (at once if it already has).
    fn adopt(&self, run: RunId, run_dir: PathBuf, sink: EventSink) -> Result<(), BackendError>;

    /// Stop a run: SIGTERM, the grace period of its spec, then SIGKILL of everything it
    /// started (L20). A run that has ended is left alone. `Exited` follows from the watcher.
    fn stop(&self, run: &RunId, run_dir: PathBuf) -> Result<(), BackendError>;

    /// A line for the start-up log: which engine, and how it limits memory.
    fn describe(&self) -> String;

    /// Why a launched run has not been handed to the engine yet (e.g. "the Slurm
    /// controller is unreachable (...); trying again in 4s"), for the job's waiting reason;
    /// `None` when nothing holds it up, or the engine does not say.
    fn waiting_reason(&self, _run: &RunId) -> Option<String> {
        None
    }
}
