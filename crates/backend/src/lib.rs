//! Backends that run replica runs. `local`: processes on this host, each under a shim
//! (`trainyard shim <run_dir>`) that owns the replica's process group and memory cgroup
//! and records its outcome in the run directory.

pub mod cgroup;
pub mod container;
mod fsutil;
pub mod netns;
pub mod local;
pub mod log;
mod procfs;
pub mod seam;
pub mod shim;
pub mod slurm;

pub use cgroup::{CgroupError, CgroupSupport, CgroupVersion, PidsCgroup, PidsSupport, ReplicaCgroup};
pub use fsutil::FileError;
pub use local::LocalBackend;
pub use log::{read_log, read_log_from, stderr_tail, LogEntry, LogPos};
pub use seam::{Backend, BackendError, BackendEvent, EventSink, Launch};
pub use shim::{main_from_args, write_spec, Resources, RunAs, ShimSpec, ShimStatus};
pub use slurm::{SlurmBackend, SlurmOptions};
