//! Backends that run replica runs. `local`: processes on this host, each under a shim
//! (`trainyard shim <run_dir>`) that owns the replica's process group and memory cgroup
//! and records its outcome in the run directory.

pub mod bounded;
pub mod cgroup;
pub mod container;
pub mod enter;
mod forkserver;
mod fsutil;
pub mod netns;
pub mod local;
pub mod log;
pub mod procfs;
pub mod seam;
pub mod seccomp;
pub mod shim;
pub mod slurm;
pub mod tree;

/// For tests whose prerequisite (root, a cgroup controller, a tool) is missing: outside CI
/// prints why and returns true (the caller returns, the test skipped); in CI (`CI=true`),
/// where `.ci/run` provides every prerequisite, fails naming it, so that a prerequisite
/// that silently disappeared never leaves the suite green.
pub fn skip_test(reason: &str) -> bool {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "CI=true and a prerequisite of this test is missing: {reason}"
    );
    eprintln!("SKIP: {reason}");
    true
}

/// The program `trainyard-shim ARGS` (and `trainyard shim ARGS`), whichever binary runs it
/// (the backend's and the product's have the same name): `enter ...` runs a command in a
/// running replica ([`enter`]), before any of the supervisor's signal handling; anything
/// else is a replica's supervisor ([`shim`]).
pub fn shim_program_main(args: Vec<String>) -> i32 {
    if args.first().is_some_and(|a| a == enter::ENTER_ARG) {
        return enter::main_from_args(&args[1..]);
    }
    shim::main_from_args(args)
}

/// Locks `m`, taking over its data if a thread panicked while holding it (the data here
/// are sets and maps that a panic leaves consistent).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use cgroup::{nice_weight, CgroupError, CgroupSupport, CgroupVersion, CpuSupport, V1Cgroup, PidsSupport, ReplicaCgroup};
pub use fsutil::{now_micros, write_atomic, write_for_tenant, FileError};
pub use local::LocalBackend;
pub use log::{read_log, read_log_from, stderr_tail, LogEntry, LogPos};
pub use seam::{Backend, BackendError, BackendEvent, EventSink, Launch};
pub use shim::{main_from_args, write_spec, Resources, RunAs, ShimSpec, ShimStatus};
pub use slurm::{SlurmBackend, SlurmOptions};
