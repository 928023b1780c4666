//! Identity and outcome of one run of one replica: the fencing token that every backend
//! report carries, so that a late report from an older attempt or restart is recognised
//! and dropped.

use serde::{Deserialize, Serialize};

/// One run of one replica: job, attempt (0-based), replica name (`workerpool{i}-{k}`) and
/// restart number within the attempt (0-based).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId {
    pub job: u64,
    pub attempt: u32,
    pub replica: String,
    pub restart: u32,
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {} attempt {} {} restart {}", self.job, self.attempt, self.replica, self.restart)
    }
}

/// How a replica's run ended, as the backend observed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The program called `exit(code)`.
    Exited { code: i32 },
    /// The program was killed by a signal (not an OOM kill that the cgroup accounted).
    Signaled { signal: i32 },
    /// The kernel's OOM killer killed a process of the replica (cgroup `oom_kill` counter
    /// went up, or the engine said OUT_OF_MEMORY). `status` is the exit status reported
    /// (128+signal for a signal death).
    OomKilled { status: i32 },
    /// The program could not be started (not found, not executable).
    StartError { message: String },
    /// The supervisor lost the replica (shim died, run directory damaged).
    Lost { message: String },
    /// The backend could not launch the replica for a reason that is not the user's.
    LaunchFailed { message: String },
}

impl Outcome {
    /// The exit status as the managed service reports it: the code, or 128+signal.
    pub fn exit_status(&self) -> i32 {
        match self {
            Outcome::Exited { code } => *code,
            Outcome::Signaled { signal } => 128 + signal,
            Outcome::OomKilled { status } => *status,
            Outcome::StartError { .. } => 127,
            Outcome::Lost { .. } | Outcome::LaunchFailed { .. } => -1,
        }
    }
}
