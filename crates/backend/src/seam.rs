//! The `Backend` seam: what the driver asks of an execution engine, what an engine
//! reports ([`BackendEvent`] through an [`EventSink`]) and how it fails
//! ([`BackendError`]). The local backend (processes under shims) and the Slurm backend
//! implement it.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trainyard_core::{Outcome, RunId};

use crate::fsutil::FileError;
use crate::shim::{ShimError, ShimSpec};

/// What the backend reports about a run. Every event carries the run's id, the fencing
/// token by which the driver drops late reports of older attempts and restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendEvent {
    Started { run: RunId, pid: u32 },
    Exited { run: RunId, outcome: Outcome, stderr_tail: Vec<String> },
}

/// Where events go: typically a closure that sends into the driver's channel.
pub type EventSink = Arc<dyn Fn(BackendEvent) + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("the shim command is empty")]
    NoShimCommand,
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error("cannot start the shim {program:?} for {}: {source}", run_dir.display())]
    SpawnShim { program: OsString, run_dir: PathBuf, source: io::Error },
    #[error("cannot start a watcher thread for {}: {source}", run_dir.display())]
    Thread { run_dir: PathBuf, source: io::Error },
    #[error("cannot signal the shim (pid {pid}) of {}: {source}", run_dir.display())]
    Signal { pid: i32, run_dir: PathBuf, source: io::Error },
    #[error("the shim of {} did not come up within {bound:?}, cannot stop it", run_dir.display())]
    StopTimeout { run_dir: PathBuf, bound: Duration },
    /// A Slurm command failed or refused the request; `message` is Slurm's own text.
    #[error("slurm: {command}: {message}")]
    Slurm { command: String, message: String },
    /// The execution engine cannot be reached now (e.g. slurmctld is down); nothing was
    /// started, and the same launch may be tried again later.
    #[error("{engine} is unreachable: {message}")]
    Unavailable { engine: String, message: String },
    /// A resource of the host ran out while launching (file descriptors, processes or
    /// threads, memory, disk space): nothing was started, and the same launch may be
    /// tried again later. Not a launch failure (L16): it must not use up the job's
    /// attempts.
    #[error("out of {resource}: {message}")]
    Exhausted { resource: String, message: String },
    /// The run cannot start for a reason of the user's (an image that cannot be had):
    /// nothing was started, and the run ends with a StartError carrying `message`, never
    /// retried.
    #[error("{message}")]
    StartRefused { message: String },
}

impl BackendError {
    /// Nothing was started and the same launch may be tried again later, with backoff:
    /// the engine is unreachable ([`BackendError::Unavailable`]) or the host ran out of
    /// a resource ([`BackendError::Exhausted`]). Any other launch error is a launch
    /// failure of Trainyard's (L16).
    pub fn is_retryable(&self) -> bool {
        matches!(self, BackendError::Unavailable { .. } | BackendError::Exhausted { .. })
    }

    /// The operating-system error under this one, if it is one.
    fn os_error(&self) -> Option<&io::Error> {
        match self {
            BackendError::File(e) | BackendError::Shim(ShimError::File(e)) => Some(&e.source),
            BackendError::Shim(ShimError::Sys { source, .. })
            | BackendError::SpawnShim { source, .. }
            | BackendError::Thread { source, .. } => Some(source),
            _ => None,
        }
    }

    /// An error of a launch that ran out of a resource of the host becomes
    /// [`BackendError::Exhausted`] (retryable); any other error is returned as it is.
    pub fn classify_exhaustion(self) -> BackendError {
        match self.os_error().and_then(exhausted_resource) {
            Some(resource) => BackendError::Exhausted { resource: resource.to_string(), message: self.to_string() },
            None => self,
        }
    }
}

/// Which resource an error of open, pipe, fork, exec or thread creation says ran out:
/// `EMFILE`, `ENFILE`, `EAGAIN`, `ENOMEM`, `ENOSPC`; `None` for any other error.
pub fn exhausted_resource(err: &io::Error) -> Option<&'static str> {
    match err.raw_os_error()? {
        libc::EMFILE => Some("file descriptors (this process's limit, RLIMIT_NOFILE)"),
        libc::ENFILE => Some("file descriptors (the system's limit)"),
        libc::EAGAIN => Some("processes or threads"),
        libc::ENOMEM => Some("memory"),
        libc::ENOSPC => Some("disk space"),
        _ => None,
    }
}


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

    /// Kill a run now, without depending on its supervisor: the escalation when a `stop`
    /// was not honoured in time (e.g. the supervisor is stopped by SIGSTOP, so that its
    /// SIGTERM stays pending and the grace period never starts). SIGKILL of the
    /// supervisor and of everything the run started (L20). Idempotent: a run that has
    /// ended is left alone, and `Ok(())`. `Exited` follows from the watcher: `Lost`, or
    /// the outcome the supervisor recorded before it was killed.
    fn kill(&self, run: &RunId, run_dir: PathBuf) -> Result<(), BackendError>;

    /// A line for the start-up log: which engine, and how it limits memory.
    fn describe(&self) -> String;

    /// Why a launched run has not been handed to the engine yet (e.g. "the Slurm
    /// controller is unreachable (...); trying again in 4s"), for the job's waiting reason;
    /// `None` when nothing holds it up, or the engine does not say.
    fn waiting_reason(&self, _run: &RunId) -> Option<String> {
        None
    }

    /// Send `signal` (SIGUSR1 or SIGUSR2) to a running run's program, nothing more: its
    /// supervisor passes it on (L19 warned). A run that has ended is left alone.
    fn signal(&self, _run: &RunId, _run_dir: PathBuf, _signal: i32) -> Result<(), BackendError> {
        Ok(())
    }

    /// The engine holds a launched run in its queue for resources that other work holds
    /// (Slurm: PENDING for `Resources` or `Priority`): an engine that places work itself
    /// says so, and the scheduler may preempt lower-priority work for it.
    fn held_for_resources(&self, _run: &RunId) -> bool {
        false
    }
}
