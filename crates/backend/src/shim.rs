//! The per-replica supervisor (`trainyard shim <run_dir>`), like conmon or
//! containerd-shim: it outlives the server, runs one program in its own process group and
//! cgroup, streams its output into `log.jsonl` (L22), stops it on SIGTERM with a grace
//! period (L9, L18), kills every process of the replica when the program ends (L20),
//! and writes the outcome with the cgroup's OOM-kill count (L14) atomically into
//! `status.json`, where a restarted server finds it (L23).
//!
//! Files in the run directory:
//! - `spec.json` (written by the server before launch): [`ShimSpec`]
//! - `shim.lock`: held with `flock(LOCK_EX)` for the shim's whole life; a lock that can
//!   be taken means no shim runs, whatever pid a stale file names
//! - `shim.pid`: the shim's pid, for `stop` (signalled only while the lock is held)
//! - `started.json`: [`Started`], once the program runs
//! - `log.jsonl`: the program's stdout and stderr ([`crate::log`])
//! - `status.json`: [`ShimStatus`], the last thing the shim writes
//! - `exec-oom-kills`: OOM kills of sessions' commands (`custom-jobs exec`), not counted
//!   as the program's

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::stat::Mode;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::cgroup::{CgroupError, CgroupVersion, V1Cgroup, ReplicaCgroup};
use crate::container::{self, ContainerSpec};
use crate::fsutil::{self, FileError, IoResultExt};
use crate::log::{self, LogWriter};

pub const SPEC_FILE: &str = "spec.json";
pub const STATUS_FILE: &str = "status.json";
pub const STARTED_FILE: &str = "started.json";
pub const LOCK_FILE: &str = "shim.lock";
pub const PID_FILE: &str = "shim.pid";
/// Where the server sends the shim's own diagnostics.
pub const SHIM_STDERR_FILE: &str = "shim.stderr";
/// The line the shim prints on its stdout once the program runs.
pub const STARTED_LINE: &str = "started";

/// `<run dir>/exec-oom-kills`: how many of the OOM kills in the replica's cgroup were of
/// sessions' commands (a number), which the supervisor does not count as its program's
/// (L14): a session that allocates past the replica's limit is the one killed, and the job
/// is not failed for it.
pub const EXEC_OOM_FILE: &str = "exec-oom-kills";

/// Sessions' OOM kills recorded for the run so far.
pub fn exec_oom_kills(run_dir: &Path) -> u64 {
    std::fs::read_to_string(run_dir.join(EXEC_OOM_FILE)).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// One more OOM kill of a session's command, under the file's lock (sessions of one run
/// may end together).
pub fn note_exec_oom_kill(run_dir: &Path) -> std::io::Result<()> {
    use std::io::Seek;
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(run_dir.join(EXEC_OOM_FILE))?;
    let mut f = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    let n: u64 = text.trim().parse().unwrap_or(0);
    f.set_len(0)?;
    f.rewind()?;
    f.write_all(format!("{}\n", n + 1).as_bytes())?;
    Ok(())
}

/// Exit code: another shim holds this run directory's lock (it is running the replica).
pub const EXIT_ALREADY_RUNNING: i32 = 75;
/// Exit code: a shim already ran in this run directory; a run is never started twice.
pub const EXIT_ALREADY_RAN: i32 = 76;
/// Exit code: wrong arguments.
pub const EXIT_USAGE: i32 = 64;
/// Exit code: the shim failed before it could write a status (the server reports Lost).
pub const EXIT_SHIM_FAILED: i32 = 71;

/// How long a starting shim retries a lock that a server's liveness probe holds for a
/// moment, before it concludes that another shim owns the run.
const LOCK_RETRY: Duration = Duration::from_secs(2);
/// Bound on killing and reaping what is left of the replica after the program exited.
const CLEANUP_BOUND: Duration = Duration::from_secs(10);
/// Bound on waiting for the output pumps to reach EOF after everything was killed.
const PUMP_DRAIN_BOUND: Duration = Duration::from_secs(5);
/// A failed write of `status.json` is tried again after 50 ms, then after twice as long
/// each time, up to 5 s between tries (L23).
const STATUS_RETRY_FIRST: Duration = Duration::from_millis(50);
const STATUS_RETRY_MAX: Duration = Duration::from_secs(5);
/// v1: each replica's `cpu.shares` in the replicas' CPU group: replicas share it equally.
const REPLICA_CPU_SHARES: u64 = 1024;
const STATUS_RETRY: trainyard_core::retry::Backoff = trainyard_core::retry::Backoff::of(STATUS_RETRY_FIRST, STATUS_RETRY_MAX);
/// A write of `status.json` that keeps failing is reported on the shim's stderr at most
/// this often.
const STATUS_RETRY_REPORT: Duration = Duration::from_secs(60);

fn default_grace() -> f64 {
    30.0
}

/// What to run: written by the server into `<run_dir>/spec.json` before the shim starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShimSpec {
    /// The program and its arguments; `argv[0]` is looked up in the `PATH` of `env`.
    pub argv: Vec<String>,
    /// The complete environment of the program (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory; `None` keeps the shim's.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Time between SIGTERM and SIGKILL when the replica is stopped.
    #[serde(default = "default_grace")]
    pub grace_seconds: f64,
    /// `<own cgroup>/trainyard`; `None` runs without a cgroup (no limit, OOM unknown).
    #[serde(default)]
    pub cgroup_base: Option<PathBuf>,
    /// 1 or 2, with `cgroup_base`.
    #[serde(default)]
    pub cgroup_version: Option<u8>,
    /// The replica cgroup's directory name below `cgroup_base`.
    #[serde(default)]
    pub cgroup_name: String,
    /// What the replica asks of its node, for engines that place work themselves (Slurm):
    /// the machine type's vCPUs, its accelerator type and count, and the job's
    /// `scheduling.timeout` in seconds. The shim itself does not use them.
    #[serde(default)]
    pub resources: Resources,
    /// The user and group the program runs as; `None` keeps the shim's (the server's)
    /// user. The shim itself stays as it was started (it writes the run directory's
    /// files); the program drops to this identity between fork and exec, after joining
    /// its cgroup: no supplementary groups, then the gid, then the uid, with
    /// `PR_SET_NO_NEW_PRIVS` (a set-user-id program cannot give the privileges back).
    #[serde(default)]
    pub run_as: Option<RunAs>,
    /// The most tasks (processes and threads) the replica may have: cgroup v2 `pids.max`
    /// of its cgroup where the pids controller is there; cgroup v1 `pids.max` of its
    /// cgroup in the pids hierarchy, with `pids_cgroup_base`; otherwise, with `run_as`,
    /// `RLIMIT_NPROC` of the program (which counts every process of that uid, so all
    /// running replicas of a project share it).
    #[serde(default)]
    pub pids_max: Option<u64>,
    /// The program's nice value (host programs): tenants' programs yield the CPU to the
    /// control plane (the server, the shims that start other replicas) when both want it,
    /// and lose nothing on an otherwise idle machine.
    #[serde(default)]
    pub nice: Option<i32>,
    /// cgroup v1: `<own pids cgroup>/trainyard` in the v1 pids hierarchy (the memory
    /// hierarchy of `cgroup_base` has no pids controller). The shim makes the replica's
    /// cgroup `<pids_cgroup_base>/<cgroup_name>` there with `pids_max`, the program joins
    /// it next to its memory cgroup, and the shim removes it when the run ends. Host
    /// programs only (a container's limit is the engine's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_cgroup_base: Option<PathBuf>,
    /// cgroup v1: the project's share of the replicas' CPU group
    /// (`<own cpu cgroup>/trainyard/<cpu_share_name>`, see [`crate::CpuSupport`] and
    /// [`crate::cgroup::cpu_share_name`]), made if missing: the shim makes the replica's
    /// cgroup `<cpu_cgroup>/<cgroup_name>` there, opens its `tasks` before it changes namespaces, the program writes itself
    /// there before its exec, and the shim removes it when the run ends. Host programs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cgroup: Option<PathBuf>,
    /// Run in a container (see [`crate::container`]): `argv`, `cwd`, `run_as`,
    /// `memory_limit_bytes` and `pids_max` are then the container's business, and `env`
    /// is the container's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerSpec>,
    /// The project's buckets, bind-mounted at `/gcs` in a mount namespace of the replica's
    /// own (the managed service mounts buckets there): `/gcs/<bucket>/<path>` is the
    /// object. Host programs only (a container has its own mount).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs_mount: Option<PathBuf>,
    /// A directory of the replica's own, bind-mounted at `/tmp` in its mount namespace
    /// (with `gcs_mount` and `run_as`): replicas share no `/tmp` (no planted link at a
    /// fixed name, no file left for the next tenant); emptied when the replica ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_tmp: Option<PathBuf>,
    /// A hosts file bind-mounted (read-only) over `/etc/hosts` in the replica's mount
    /// namespace (with `gcs_mount`): the managed service's host names lead to this server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts_file: Option<PathBuf>,
    /// The most bytes of output kept for the run (the log rotates at half of it); `None`:
    /// no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_max_bytes: Option<u64>,
    /// The job's network namespace (see [`crate::netns`]): the program starts in it
    /// instead of the host's network. Host programs; a container gets it from the engine
    /// (`ContainerSpec::netns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// Without a cgroup of its own (`cgroup_base: None`), read the OOM kills of the memory
    /// cgroup the engine started the shim in (a Slurm job step, see
    /// [`crate::cgroup::EngineCgroupOom`]), so that an OOM-killed program is told from one
    /// killed by SIGKILL from outside (L14).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub engine_cgroup_oom: bool,
}

/// Where the project's buckets appear for a host program with `gcs_mount`.
pub const GCS_MOUNT_POINT: &str = "/gcs";

/// A mount namespace of the shim's own (the program inherits it) in which `source` is at
/// `/gcs`; mounts made outside later do not reach in, and nothing made here leaks out.
fn mount_gcs(source: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("making the mount namespace private: {e}"))?;
    mount(Some(source), GCS_MOUNT_POINT, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| format!("bind-mounting {} at {GCS_MOUNT_POINT}: {e}", source.display()))?;
    Ok(())
}

/// `hosts` over `/etc/hosts`, read-only, in the mount namespace [`mount_gcs`] made.
fn mount_hosts(hosts: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    const ETC_HOSTS: &str = "/etc/hosts";
    mount(Some(hosts), ETC_HOSTS, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| format!("bind-mounting {} at {ETC_HOSTS}: {e}", hosts.display()))?;
    mount(None::<&str>, ETC_HOSTS, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)
        .map_err(|e| format!("making {ETC_HOSTS} read-only: {e}"))
}

/// Can this host give a replica the mount namespace [`mount_gcs`] and [`hide_other_pids`]
/// make (a namespace of its own, private, with a /proc of its own)? Tried in a child that
/// exits at once, so nothing here changes; the error names the step the kernel refused.
pub fn probe_mount_namespace() -> Result<(), String> {
    const STEPS: [&str; 3] = ["unshare(CLONE_NEWNS)", "making the mount namespace private", "mounting a /proc with hidepid=2"];
    // SAFETY: the child makes system calls on static strings and _exits (async-signal-safe
    // after a fork, whatever threads the parent has); its namespace ends with it.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        unsafe {
            let none = std::ptr::null::<libc::c_char>();
            let step = if libc::unshare(libc::CLONE_NEWNS) != 0 {
                1
            } else if libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                2
            } else if libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"hidepid=2".as_ptr().cast(),
            ) != 0
            {
                3
            } else {
                0
            };
            let errno = if step == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(0).clamp(1, 49) };
            libc::_exit(step * 50 + errno);
        }
    }
    let status = loop {
        match nix::sys::wait::waitpid(Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    match status {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
            let step = STEPS.get((code / 50 - 1).max(0) as usize).copied().unwrap_or("the probe");
            Err(format!("{step}: {}", std::io::Error::from_raw_os_error(code % 50)))
        }
        Ok(other) => Err(format!("the probe ended unexpectedly: {other:?}")),
        Err(e) => Err(format!("waiting for the probe: {e}")),
    }
}

/// In the replica's mount namespace, a /proc of its own with `hidepid=2`: a program that
/// runs as its project's user sees its own processes only, not other tenants' command
/// lines, environments or open files (the shim, root, still sees all).
fn hide_other_pids() -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("hidepid=2"),
    )
    .map_err(|e| format!("mounting /proc with hidepid=2: {e}"))
}

/// In the replica's mount namespace, a `/dev/shm` of its own: a tmpfs no larger than the
/// replica's memory limit (its pages are charged to the memory cgroup of whoever writes
/// them, so they count against the replica's limit), gone with the namespace when the
/// replica ends, so that shared memory a job leaves behind never stays in the host's RAM
/// and no tenant sees another's.
fn private_dev_shm(memory_limit: Option<u64>) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    if !Path::new("/dev/shm").is_dir() {
        return Ok(());
    }
    let size = memory_limit.map(|b| format!(",size={b}")).unwrap_or_default();
    mount(
        Some("tmpfs"),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("mode=1777{size}").as_str()),
    )
    .map_err(|e| format!("mounting a tmpfs of the replica's own on /dev/shm: {e}"))
}

/// In the replica's mount namespace, `dir` (the replica's own, in its run directory,
/// which the program's user cannot replace: the run directory is root's) at `/tmp`,
/// without set-user-id programs or device files.
fn private_tmp(dir: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    mount(Some(dir), "/tmp", None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| format!("bind-mounting {} at /tmp: {e}", dir.display()))?;
    mount(None::<&str>, "/tmp", None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV, None::<&str>)
        .map_err(|e| format!("remounting /tmp nosuid,nodev: {e}"))
}

/// An unprivileged identity for the program (see `ShimSpec::run_as`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// A replica's request of resources (see `ShimSpec::resources`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub accelerator: Option<(String, u32)>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl ShimSpec {
    /// A spec with no cgroup, no limit, the shim's working directory and a 30 s grace.
    pub fn new(argv: Vec<String>, env: Vec<(String, String)>) -> ShimSpec {
        ShimSpec {
            argv,
            env,
            cwd: None,
            memory_limit_bytes: None,
            grace_seconds: default_grace(),
            cgroup_base: None,
            cgroup_version: None,
            cgroup_name: String::new(),
            resources: Resources::default(),
            run_as: None,
            pids_max: None,
            nice: None,
            pids_cgroup_base: None,
            cpu_cgroup: None,
            container: None,
            gcs_mount: None,
            private_tmp: None,
            hosts_file: None,
            log_max_bytes: None,
            netns: None,
            engine_cgroup_oom: false,
        }
    }
}

/// `<run_dir>/started.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub pid: u32,
    pub time_micros: i64,
    /// The Slurm node the run is on (`SLURMD_NODENAME`), for a session started there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `<run_dir>/status.json`: how the run ended. Exactly one of `exit_code`, `signal`,
/// `start_error`, `launch_error` is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShimStatus {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The cgroup's `oom_kill` counter; `None` = unknown (no cgroup, or not accounted).
    pub oom_kills: Option<u64>,
    /// The program could not be started (not found, not executable, bad cwd): the user's.
    pub start_error: Option<String>,
    /// The replica could not be set up for a reason that is not the user's (cgroup,
    /// unreadable spec, log file).
    #[serde(default)]
    pub launch_error: Option<String>,
    pub ended_micros: i64,
}

impl ShimStatus {
    fn failed_before_start(start_error: Option<String>, launch_error: Option<String>) -> ShimStatus {
        ShimStatus {
            exit_code: None,
            signal: None,
            oom_kills: None,
            start_error,
            launch_error,
            ended_micros: fsutil::now_micros(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("malformed {}: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{what}: {source}")]
    Sys { what: &'static str, source: io::Error },
}

/// Atomically, and durably: for the outcome (`status.json`), which a server restarted
/// after a power cut still reads.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ShimError> {
    let mut bytes = serde_json::to_vec(value).map_err(|source| ShimError::Json { path: path.to_path_buf(), source })?;
    bytes.push(b'\n');
    Ok(fsutil::write_atomic(path, &bytes)?)
}

/// Atomically, not forced to disk: for files that matter only while the machine is up
/// (`spec.json`, `shim.pid`, `started.json`); a power cut ends the replica as well, and a
/// run found without them is reported lost. Saves two fsyncs each on the start path.
fn write_json_volatile<T: Serialize>(path: &Path, value: &T) -> Result<(), ShimError> {
    let mut bytes = serde_json::to_vec(value).map_err(|source| ShimError::Json { path: path.to_path_buf(), source })?;
    bytes.push(b'\n');
    Ok(fsutil::write_replace(path, &bytes)?)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, ShimError> {
    match fsutil::read_optional(path)? {
        None => Ok(None),
        Some(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|source| ShimError::Json { path: path.to_path_buf(), source })
        }
    }
}

/// Writes `<run_dir>/spec.json` atomically.
pub fn write_spec(run_dir: &Path, spec: &ShimSpec) -> Result<(), ShimError> {
    write_json_volatile(&run_dir.join(SPEC_FILE), spec)
}

/// Reads `<run_dir>/spec.json`, `None` if absent.
pub fn read_spec(run_dir: &Path) -> Result<Option<ShimSpec>, ShimError> {
    read_json(&run_dir.join(SPEC_FILE))
}

/// Reads `<run_dir>/status.json`, `None` if the run has not ended (or its shim was lost).
pub fn read_status(run_dir: &Path) -> Result<Option<ShimStatus>, ShimError> {
    read_json(&run_dir.join(STATUS_FILE))
}

/// Reads `<run_dir>/started.json`, `None` if the program was never started.
pub fn read_started(run_dir: &Path) -> Result<Option<Started>, ShimError> {
    read_json(&run_dir.join(STARTED_FILE))
}

fn diag(msg: std::fmt::Arguments<'_>) {
    // Never panic on a closed stderr (eprintln! would).
    let _ = writeln!(io::stderr(), "trainyard shim: {msg}");
}

/// Entry point of `trainyard shim <run_dir>` and of the `trainyard-shim` binary; `args`
/// are the arguments after the program (and subcommand) name. Call it before any other
/// thread exists: it changes the process's signal mask, which threads inherit.
/// Returns the process exit code: 0 whenever `status.json` was written.
pub fn main_from_args(args: Vec<String>) -> i32 {
    // Signals first, so that a stop that arrives while the shim is starting is held
    // pending and handled by the main loop, instead of killing the shim.
    if let Err(e) = block_supervisor_signals() {
        diag(format_args!("{e}"));
        return EXIT_SHIM_FAILED;
    }
    // SAFETY: setting a disposition to SIG_IGN installs no handler code (nix's `signal`
    // is unsafe for handlers; there is no safe call for a disposition).
    unsafe {
        let _ = nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn);
    }
    if args.first().is_some_and(|a| a == crate::forkserver::FORK_SERVER_ARG) {
        return crate::forkserver::serve(run, EXIT_SHIM_FAILED);
    }
    let [run_dir] = args.as_slice() else {
        diag(format_args!("usage: trainyard shim <run_dir>"));
        return EXIT_USAGE;
    };
    run(Path::new(run_dir))
}

/// A supervisor's body once its signals are set: supervises the run in `run_dir` and
/// returns the exit code.
fn run(run_dir: &Path) -> i32 {
    let run_dir = match std::path::absolute(run_dir) {
        Ok(p) => p,
        Err(e) => {
            diag(format_args!("run directory {}: {e}", run_dir.display()));
            return EXIT_USAGE;
        }
    };
    match supervise(&run_dir) {
        Ok(code) => code,
        Err(e) => {
            diag(format_args!("{}: {e}", run_dir.display()));
            EXIT_SHIM_FAILED
        }
    }
}

fn supervisor_sigset() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD, Signal::SIGUSR1, Signal::SIGUSR2] {
        set.add(sig);
    }
    set
}

fn block_supervisor_signals() -> Result<(), ShimError> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&supervisor_sigset()), None)
        .map_err(|e| ShimError::Sys { what: "block signals", source: e.into() })
}

/// Writes `shim.pid`, the mark that a shim ran in this run directory. Created in place
/// (no temporary file and rename): no other shim can be writing it (we hold the lock and
/// it did not exist), and a reader that finds it still empty takes the shim for one that
/// is starting, as when it does not exist yet.
fn write_pid_file(path: &Path) -> Result<(), ShimError> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path).at("create", path)?;
    file.write_all(format!("{}\n", std::process::id()).as_bytes()).at("write", path)?;
    Ok(())
}

/// Takes the run directory's lock, retrying for a moment (a server probing liveness holds
/// it briefly). `Ok(None)`: another shim holds it.
fn take_lock(path: &Path) -> Result<Option<Flock<File>>, ShimError> {
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).at("open lock", path)?;
    let started = Instant::now();
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(Some(lock)),
            Err((f, Errno::EINTR)) => file = f,
            Err((f, Errno::EWOULDBLOCK)) if started.elapsed() < LOCK_RETRY => {
                file = f;
                thread::sleep(Duration::from_millis(20));
            }
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(FileError { op: "lock", path: path.to_path_buf(), source: e.into() }.into()),
        }
    }
}

fn supervise(run_dir: &Path) -> Result<i32, ShimError> {
    // Own session: the shim survives the server and a Ctrl-C in the server's terminal.
    // EPERM means we already lead a session (the server may do setsid for us).
    let _ = nix::unistd::setsid();
    let Some(_lock) = take_lock(&run_dir.join(LOCK_FILE))? else {
        diag(format_args!("another shim is running {}", run_dir.display()));
        return Ok(EXIT_ALREADY_RUNNING);
    };
    if run_dir.join(STATUS_FILE).exists() || run_dir.join(PID_FILE).exists() {
        diag(format_args!("a shim already ran in {}; not starting the program again", run_dir.display()));
        return Ok(EXIT_ALREADY_RAN);
    }
    write_pid_file(&run_dir.join(PID_FILE))?;

    let no_cgroups = ReplicaCgroups::default();
    let spec = match read_spec(run_dir) {
        Ok(Some(spec)) => spec,
        Ok(None) => return fail_before_start(run_dir, None, &no_cgroups, format!("{} is missing", SPEC_FILE)),
        Err(e) => return fail_before_start(run_dir, None, &no_cgroups, e.to_string()),
    };
    // The supervisor's own setup (cgroups, namespaces, the program's start) runs at its
    // program's priority (`[replicas] nice`): a burst of replicas starting yields the CPU
    // to the control plane as their programs do. The supervisor has one thread; the
    // program inherits its priority.
    if let Some(n) = spec.nice {
        // SAFETY: setpriority(2) on this thread, no pointers; raising needs no privilege
        // and a failure leaves the priority as it is.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) };
    }
    let mut cgroups = ReplicaCgroups::default();
    if let (Some(base), Some(version)) = (&spec.cgroup_base, spec.cgroup_version) {
        // In a container the limit is the container's (the engine's OOM account).
        let memory = if spec.container.is_some() { None } else { spec.memory_limit_bytes };
        let made = CgroupVersion::from_number(version).and_then(|v| ReplicaCgroup::create(v, base, &spec.cgroup_name, memory));
        match made {
            Ok(cg) => cgroups.memory = Some(cg),
            Err(e) => return fail_before_start(run_dir, None, &no_cgroups, format!("cannot set up the replica's cgroup: {e}")),
        }
    }
    if let (Some(base), Some(max), None) = (&spec.pids_cgroup_base, spec.pids_max, &spec.container) {
        match V1Cgroup::pids(base, &spec.cgroup_name, max) {
            Ok(cg) => cgroups.pids = Some(cg),
            Err(e) => {
                return fail_before_start(run_dir, None, &cgroups, format!("cannot set up the replica's pids cgroup: {e}"))
            }
        }
    }
    // v1: the replica's cgroup in the replicas' CPU group (one share among the replicas,
    // whatever its number of processes), reached through a descriptor opened now: the
    // program's namespace may cover /sys/fs/cgroup below.
    if let (Some(group), None) = (&spec.cpu_cgroup, &spec.container) {
        match V1Cgroup::cpu(group, &spec.cgroup_name, REPLICA_CPU_SHARES) {
            Ok(cg) => cgroups.cpu = Some(cg),
            Err(e) => return fail_before_start(run_dir, None, &cgroups, format!("cannot set up the replica's CPU cgroup: {e}")),
        }
    }
    let cpu_tasks = match &cgroups.cpu {
        Some(cg) => match nix::fcntl::open(&cg.tasks_file(), OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty()) {
            Ok(fd) => Some(fd),
            Err(e) => {
                let msg = format!("cannot open the replica's CPU cgroup {}: {e}", cg.path().display());
                return fail_before_start(run_dir, None, &cgroups, msg);
            }
        },
        None => None,
    };
    // Where /proc is the replica's own (below), so is /sys/fs/cgroup. On v1, detached
    // copies of the replica's cgroup directories, attached in the program's namespace (kept
    // open until the program started).
    let view = match (&cgroups.memory, spec.run_as, &spec.gcs_mount, &spec.container) {
        (Some(cg), Some(_), Some(_), None) => Some(cg.version()),
        _ => None,
    };
    let v1_view = view == Some(CgroupVersion::V1);
    let memory_tree = cgroups.memory.as_ref().filter(|_| v1_view).and_then(|cg| detached_bind(cg.path()));
    let pids_tree = cgroups.pids.as_ref().filter(|_| v1_view).and_then(|cg| detached_bind(cg.path()));
    let mut limits = Limits {
        nproc: program_nproc(spec.pids_max, spec.run_as, &cgroups),
        nofile_soft: raise_nofile(),
        run_as: spec.run_as,
        nice: spec.nice,
        seccomp: spec.run_as.and_then(|_| tenant_filter()),
        cgroup_view: view.map(|version| CgroupView {
            v2: version == CgroupVersion::V2,
            v1_pids: cgroups.pids.is_some(),
            memory_tree: memory_tree.as_ref().map(AsRawFd::as_raw_fd),
            pids_tree: pids_tree.as_ref().map(AsRawFd::as_raw_fd),
            namespace_only: false,
        }),
    };
    // The job's network: entered by the supervisor, whose program inherits it (the
    // engine's client, for a container, keeps the host's).
    if let (Some(ns), None) = (&spec.netns, &spec.container) {
        if let Err(e) = crate::netns::enter(ns) {
            return fail_before_start(run_dir, None, &cgroups, format!("cannot put the replica in its job's network: {e}"));
        }
    }
    // A program of a per-project user gets an IPC namespace of the replica's own: SysV
    // shared memory, semaphores and message queues are neither seen nor left on the host
    // (they go with the namespace when the replica ends). A container has its engine's.
    // Where the host makes no namespaces for the server (no CAP_SYS_ADMIN: then there is
    // no /gcs mount either, the server said so at start and refuses tokens), the replica
    // keeps the host's.
    if let (Some(_), None) = (spec.run_as, &spec.container) {
        match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC) {
            Ok(()) => {}
            Err(nix::errno::Errno::EPERM) if spec.gcs_mount.is_none() => {}
            Err(e) => {
                return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its IPC namespace (unshare(CLONE_NEWIPC)): {e}"));
            }
        }
    }
    if let (Some(source), None) = (&spec.gcs_mount, &spec.container) {
        if let Err(e) = mount_gcs(source) {
            return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its /gcs: {e}"));
        }
        if let Some(hosts) = &spec.hosts_file {
            if let Err(e) = mount_hosts(hosts) {
                return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its /etc/hosts: {e}"));
            }
        }
        // Other tenants' processes are hidden from a program that runs as its project's
        // user (a program of the server's own user sees what the server sees).
        if spec.run_as.is_some() {
            if let Err(e) = hide_other_pids() {
                return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its /proc: {e}"));
            }
            if let Err(e) = private_dev_shm(spec.memory_limit_bytes) {
                return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its /dev/shm: {e}"));
            }
            if let Some(tmp) = &spec.private_tmp {
                if let Err(e) = private_tmp(tmp) {
                    return fail_before_start(run_dir, None, &cgroups, format!("cannot give the replica its /tmp: {e}"));
                }
            }
        }
    }
    // v1: the program's /sys/fs/cgroup is made here, in the namespace made for /gcs above,
    // which the program shares: one mount namespace per replica instead of a second one
    // copied and torn down for the program (the child only enters a cgroup namespace).
    // Held to the end: the replica's cgroups are reached through it once covered.
    let _host_cgroups = match (&memory_tree, &mut limits.cgroup_view) {
        (Some(memory), Some(v)) if !v.v2 && (cgroups.pids.is_none() || pids_tree.is_some()) => {
            let host = cover_cgroup_tree(&mut cgroups, memory, pids_tree.as_ref());
            if host.is_some() {
                *v = CgroupView { namespace_only: true, memory_tree: None, pids_tree: None, ..*v };
            }
            host
        }
        _ => None,
    };
    let cgroup = cgroups.memory.as_ref();
    let engine_oom = (cgroup.is_none() && spec.engine_cgroup_oom).then(crate::cgroup::EngineCgroupOom::find).flatten();
    // Orphaned descendants (double-forked daemons) become our children, so we can find
    // and kill them when the program ends (L20).
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        let e = ShimError::Sys { what: "PR_SET_CHILD_SUBREAPER", source: e.into() };
        diag(format_args!("{e}; orphaned descendants may escape"));
    }
    let writer = match LogWriter::open_capped(&run_dir.join(log::LOG_FILE), spec.log_max_bytes) {
        Ok(w) => w,
        Err(e) => return fail_before_start(run_dir, None, &cgroups, e.to_string()),
    };
    // The supervisor's signals, blocked since it was forked, are read from a descriptor
    // polled beside the program's output.
    let signals = match SignalFd::with_flags(&supervisor_sigset(), SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
        Ok(fd) => fd,
        Err(e) => return fail_before_start(run_dir, None, &cgroups, format!("cannot wait for signals (signalfd): {e}")),
    };

    // In a container, the program the shim runs is the engine's client.
    let (program_spec, limits) = match &spec.container {
        Some(c) => match engine_program(run_dir, &spec, c, cgroup) {
            Ok(p) => (p, Limits { nproc: None, run_as: None, cgroup_view: None, nice: None, seccomp: None, ..limits }),
            Err(msg) => return fail_before_start(run_dir, None, &cgroups, msg),
        },
        None => (spec.clone(), limits),
    };
    let child = match spawn_program(&program_spec, cgroup, cgroups.pids.as_ref(), cpu_tasks.as_ref(), limits) {
        Ok(child) => child,
        Err(SpawnFailure::Start(msg)) => return fail_before_start(run_dir, Some(msg), &cgroups, String::new()),
        Err(SpawnFailure::Launch(msg)) => return fail_before_start(run_dir, None, &cgroups, msg),
    };
    // The program's namespace has its cgroup directories attached (or never will).
    drop((memory_tree, pids_tree, cpu_tasks));
    let pid = child.pid;
    let pgid = Pid::from_raw(pid as libc::pid_t);

    // The program runs (spawn returns once it was exec'd): say so before anything else,
    // the output readers included (the pipes hold the program's first output meanwhile).
    let started = Started { pid, time_micros: fsutil::now_micros(), node: std::env::var("SLURMD_NODENAME").ok() };
    if let Err(e) = write_json_volatile(&run_dir.join(STARTED_FILE), &started) {
        diag(format_args!("{e}"));
    }
    {
        // The server may be gone: EPIPE is ignored (SIGPIPE is ignored too).
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{STARTED_LINE}");
        let _ = out.flush();
    }

    // One thread waits on the program's signals and reads its output (L22).
    let mut waiter = Waiter { signals, pump: log::Pump::new(child.stdout, child.stderr), writer: &writer };

    let grace = Duration::try_from_secs_f64(spec.grace_seconds.max(0.0)).unwrap_or(Duration::from_secs(365 * 86_400));
    let wait_status = supervise_until_exit(&mut waiter, Pid::from_raw(pid as libc::pid_t), pgid, grace, cgroup, spec.container.as_ref());

    // In a container: whether the container still exists (it does once it was created),
    // then the container removed with everything in it.
    let engine_status = libc::WIFEXITED(wait_status).then(|| libc::WEXITSTATUS(wait_status));
    let container_existed = spec.container.as_ref().map(|c| {
        // Asked only when the status may be the engine's (125-127): it costs a podman run.
        let existed = !matches!(engine_status, Some(125..=127)) || c.engine.output(["container", "exists", &c.name]).is_ok();
        if let Err(e) = c.engine.remove(&c.name) {
            diag(format_args!("cannot remove the container {}: {e}", c.name));
        }
        existed
    });
    // L20: nothing of the replica keeps running after its program ended.
    kill_remaining(pgid, cgroup);

    if !waiter.drain(Instant::now() + PUMP_DRAIN_BOUND) {
        diag(format_args!("output pipes still open after the replica was killed; the log may miss its end"));
    }
    drop(waiter);
    if let Err(e) = writer.flush() {
        diag(format_args!("{e}"));
    }

    let (exit_code, signal) = if libc::WIFEXITED(wait_status) {
        (Some(libc::WEXITSTATUS(wait_status)), None)
    } else if libc::WIFSIGNALED(wait_status) {
        (None, Some(libc::WTERMSIG(wait_status)))
    } else {
        (None, None)
    };
    let mut status = ShimStatus {
        exit_code,
        signal,
        // Kills of sessions' commands (`custom-jobs exec`) are not the program's (L14).
        oom_kills: cgroup
            .and_then(|cg| cg.oom_kills())
            .map(|n| n.saturating_sub(exec_oom_kills(run_dir)))
            .or_else(|| engine_oom.as_ref().and_then(|o| o.kills_since_start())),
        start_error: None,
        launch_error: None,
        ended_micros: fsutil::now_micros(),
    };
    if let (Some(c), Some(existed)) = (&spec.container, container_existed) {
        container_outcome(run_dir, c, existed, &mut status);
    }
    record_status(run_dir, &status, Some(&writer))?;
    if writer.dropped() > 0 {
        diag(format_args!(
            "{} output line(s) were dropped and the note saying so could not be written to {}",
            writer.dropped(),
            log::LOG_FILE
        ));
    }
    remove_cgroups(&cgroups);
    // What the replica left in its /tmp goes with it (nothing of it runs any more).
    if let Some(tmp) = &spec.private_tmp {
        if let Err(e) = crate::tree::remove_tree(tmp) {
            diag(format_args!("cannot empty the replica's /tmp {}: {e}", tmp.display()));
        }
    }
    Ok(0)
}

/// L23: writes the outcome into `status.json` however long it takes. The program has
/// ended and its outcome exists only in this process now: if the write fails (a full
/// disk, a quota, an I/O error) the shim keeps the outcome and tries again with backoff,
/// still holding the run directory's lock, so that the server sees the replica as
/// running instead of lost (a lost replica would be started again, L10). The note about
/// log lines dropped meanwhile is written first when it can be. Gives up only if the run
/// directory itself is gone: nobody could read the status then.
fn record_status(run_dir: &Path, status: &ShimStatus, log: Option<&LogWriter>) -> Result<(), ShimError> {
    let path = run_dir.join(STATUS_FILE);
    let write = || {
        if let Some(log) = log {
            // Best effort: the note belongs before the end of the log, but never holds up
            // the outcome.
            let _ = log.write_dropped_note();
        }
        write_json(&path, status)
    };
    let gone = || matches!(fs::metadata(run_dir), Err(e) if e.kind() == io::ErrorKind::NotFound);
    write_until_done(&path, write, gone, thread::sleep).map(|_| ())
}

/// Tries `write` until it succeeds, sleeping (with `sleep`) 50 ms after the first
/// failure and twice as long after each further one, up to 5 s; reports the first
/// failure on stderr, then one line a minute while it keeps failing, and the recovery.
/// Returns how many tries failed. Errors that are not I/O errors (the value cannot be
/// encoded) are returned at once, as is the last I/O error once `gone()` holds.
fn write_until_done(
    path: &Path,
    mut write: impl FnMut() -> Result<(), ShimError>,
    mut gone: impl FnMut() -> bool,
    mut sleep: impl FnMut(Duration),
) -> Result<u32, ShimError> {
    let mut failures: u32 = 0;
    let mut reported: Option<Instant> = None;
    loop {
        let e = match write() {
            Ok(()) => {
                if failures > 0 {
                    diag(format_args!("wrote {} after {failures} failed tries", path.display()));
                }
                return Ok(failures);
            }
            Err(e @ ShimError::File(_)) => e,
            Err(e) => return Err(e),
        };
        failures = failures.saturating_add(1);
        if gone() {
            diag(format_args!("{e}; the run directory is gone, the outcome cannot be recorded"));
            return Err(e);
        }
        if reported.is_none() {
            diag(format_args!(
                "{e}; the outcome is kept and the write tried again ({STATUS_RETRY_FIRST:?}, doubling up to {STATUS_RETRY_MAX:?})"
            ));
            reported = Some(Instant::now());
        } else if reported.is_some_and(|t| t.elapsed() >= STATUS_RETRY_REPORT) {
            diag(format_args!("{e}; still trying ({failures} failed tries so far)"));
            reported = Some(Instant::now());
        }
        sleep(STATUS_RETRY.pause(failures));
    }
}

/// Records a run that never started (start error: the user's; launch error: ours), and
/// cleans up the cgroups.
fn fail_before_start(
    run_dir: &Path,
    start_error: Option<String>,
    cgroups: &ReplicaCgroups,
    launch_error: String,
) -> Result<i32, ShimError> {
    let launch_error = (start_error.is_none()).then_some(launch_error);
    record_status(run_dir, &ShimStatus::failed_before_start(start_error, launch_error), None)?;
    remove_cgroups(cgroups);
    Ok(0)
}

/// The replica's cgroups: the memory cgroup, through which its processes are counted and
/// killed, and on cgroup v1 the pids cgroup that holds its task limit.
#[derive(Default)]
struct ReplicaCgroups {
    memory: Option<ReplicaCgroup>,
    pids: Option<V1Cgroup>,
    /// v1: its cgroup in the replicas' CPU group.
    cpu: Option<V1Cgroup>,
}

/// Kills what is left in the replica's cgroups and removes them: the memory cgroup
/// first (it holds every process of the replica), then the pids cgroup, empty by then.
/// Removes the replica's cgroups. A process of the replica that died after the last
/// cleanup pass is a zombie of this subreaper until reaped, and a v1 cgroup that still
/// counts it cannot be removed: reaped first, and again before each of a few tries.
fn remove_cgroups(cgroups: &ReplicaCgroups) {
    const TRIES: usize = 3;
    let mut ignored = None;
    for attempt in 1..=TRIES {
        reap(Pid::from_raw(-1), &mut ignored);
        let memory = cgroups.memory.as_ref().map(ReplicaCgroup::kill_and_remove);
        reap(Pid::from_raw(-1), &mut ignored);
        let pids = cgroups.pids.as_ref().map(|cg| cg.remove());
        let cpu = cgroups.cpu.as_ref().map(|cg| {
            let removed = cg.remove();
            // The project's share goes with its last replica.
            if let Some(share) = cg.path().parent() {
                V1Cgroup::remove_share_if_idle(share);
            }
            removed
        });
        let errors: Vec<CgroupError> = [memory, pids, cpu].into_iter().flatten().filter_map(Result::err).collect();
        if errors.is_empty() {
            return;
        }
        if attempt == TRIES {
            for e in errors {
                diag(format_args!("{e}"));
            }
        }
    }
}

/// The `RLIMIT_NPROC` the program gets (`Limits::nproc`): none where a cgroup holds the
/// task limit (v1: the replica's pids cgroup; v2: `pids.max` of its own cgroup, written
/// here, where the pids controller is enabled). Otherwise `pids_max` as RLIMIT_NPROC, but
/// only for a program that runs as another user: the kernel counts that limit per uid,
/// and the shim's own user (the server's) has many processes of its own.
fn program_nproc(pids_max: Option<u64>, run_as: Option<RunAs>, cgroups: &ReplicaCgroups) -> Option<u64> {
    let max = pids_max?;
    if cgroups.pids.is_some() {
        return None;
    }
    if cgroups.memory.as_ref().is_some_and(|cg| cg.set_pids_max(max).is_ok()) {
        return None;
    }
    run_as.map(|_| max)
}

enum SpawnFailure {
    /// The user's: program missing or not executable, bad working directory.
    Start(String),
    /// Ours: could not join the cgroup, could not make a pipe.
    Launch(String),
}

/// A failed fork or exec: the user's (missing program, not executable, bad working
/// directory: a StartError), except when the host is out of descriptors, memory or
/// processes, which is ours and retried (L16), never the job's permanent failure.
fn start_failure(program: &str, e: io::Error) -> SpawnFailure {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN) => {
            SpawnFailure::Launch(format!("cannot start {program:?}, the host is short of resources: {e}"))
        }
        _ => SpawnFailure::Start(format!("cannot start {program:?}: {e}")),
    }
}

/// The engine client's invocation for a container run: `podman run ...` in
/// `<run_dir>/engine` (where conmon leaves its OOM marker), with the engine's
/// environment, the container's below the replica's cgroup.
fn engine_program(run_dir: &Path, spec: &ShimSpec, c: &ContainerSpec, cgroup: Option<&ReplicaCgroup>) -> Result<ShimSpec, String> {
    let engine_dir = run_dir.join(container::ENGINE_DIR);
    fs::create_dir_all(&engine_dir).map_err(|e| format!("cannot create {}: {e}", engine_dir.display()))?;
    let (text, extra) = container::env_file(&spec.env);
    let env_path = run_dir.join(container::ENV_FILE);
    fsutil::write_private(&env_path, text.as_bytes()).map_err(|e| e.to_string())?;
    let parent = cgroup.and_then(|cg| crate::cgroup::hierarchy_relative(cg.path()));
    let mut argv: Vec<String> = vec![c.engine.program.to_string_lossy().into_owned()];
    argv.extend(c.engine.global_args.iter().cloned());
    for a in container::run_args(c, parent.as_deref(), &env_path, &extra, run_dir) {
        argv.push(a.into_string().map_err(|a| format!("an argument of the container is not UTF-8: {a:?}"))?);
    }
    let mut p = ShimSpec::new(argv, c.engine.env.clone());
    p.cwd = Some(engine_dir);
    Ok(p)
}

/// The outcome of a container run as the engine tells it: an engine failure before the
/// program ran (StartError or launch error), and the OOM kill from conmon's marker (L14).
fn container_outcome(run_dir: &Path, c: &ContainerSpec, existed: bool, status: &mut ShimStatus) {
    // conmon watches the container's memory cgroup and leaves `oom` when it OOM-killed.
    let oom = run_dir.join(container::ENGINE_DIR).join("oom").exists();
    status.oom_kills = Some(u64::from(oom));
    let Some(code) = status.exit_code else { return };
    if oom || code == 0 {
        return;
    }
    // The container's init reports a program killed by signal N as 128 + N, as the
    // managed service's containers do: a signal death (L10), as for a host program.
    if (129..=128 + 64).contains(&code) {
        status.exit_code = None;
        status.signal = Some(code - 128);
        return;
    }
    let tail = log::stderr_tail(run_dir, 5).unwrap_or_default();
    match container::classify(c, code, existed, &tail) {
        Some(container::Failure::Start(m)) => {
            status.exit_code = None;
            status.start_error = Some(m);
        }
        Some(container::Failure::Launch(m)) => {
            status.exit_code = None;
            status.launch_error = Some(m);
        }
        None => {}
    }
}

/// The running program: its pid and the read ends of its stdout and stderr. Dropping it
/// neither kills nor reaps the program (the shim reaps with `waitpid`).
struct Program {
    pid: u32,
    stdout: File,
    stderr: File,
}

/// What the program's child process applies to itself just before exec.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// `RLIMIT_NPROC` (soft and hard), when no cgroup holds the task limit.
    nproc: Option<u64>,
    /// The soft `RLIMIT_NOFILE` the shim was started with, given back to the program when
    /// the shim raised its own (see `raise_nofile`).
    nofile_soft: Option<u64>,
    run_as: Option<RunAs>,
    /// A program of a per-project user in a mount namespace of the replica's: what it
    /// sees at `/sys/fs/cgroup` (see [`own_cgroup_view`]).
    cgroup_view: Option<CgroupView>,
    /// `ShimSpec::nice`.
    nice: Option<i32>,
    /// A program of a per-project user: the system calls it may not make
    /// ([`crate::seccomp`]), installed last, just before exec.
    seccomp: Option<&'static [libc::sock_filter]>,
}

/// The tenant filter ([`crate::seccomp::tenant_program`]), built once.
fn tenant_filter() -> Option<&'static [libc::sock_filter]> {
    static FILTER: std::sync::OnceLock<Option<Vec<libc::sock_filter>>> = std::sync::OnceLock::new();
    FILTER.get_or_init(crate::seccomp::tenant_program).as_deref()
}

/// The replica's cgroups, for [`own_cgroup_view`].
#[derive(Clone, Copy, Debug)]
struct CgroupView {
    v2: bool,
    /// A v1 pids cgroup of the replica's own.
    v1_pids: bool,
    /// v1: detached bind mounts of the replica's memory and pids cgroup directories
    /// ([`detached_bind`]), where the kernel makes them.
    memory_tree: Option<std::os::fd::RawFd>,
    pids_tree: Option<std::os::fd::RawFd>,
    /// v1: `/sys/fs/cgroup` was made in the supervisor's namespace, which the program
    /// shares ([`cover_cgroup_tree`]); the child only enters a cgroup namespace.
    namespace_only: bool,
}

/// Where the cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// v1, in the supervisor's own mount namespace (made for /gcs), which its program shares:
/// `/sys/fs/cgroup` covered by a tmpfs holding the replica's own memory and pids
/// directories (`memory` and `pids`, the detached binds of [`detached_bind`]), made
/// read-only: what [`own_cgroup_view`] makes in a second namespace of the program's own.
/// The supervisor and its child reach the replica's cgroups from then on through a
/// descriptor of the covered `/sys/fs/cgroup` (`/proc/self/fd/N`, a path the cgroups are
/// rebased on), which is returned and must be held while they are used. None, with nothing
/// covered or changed, when a cgroup is not below `/sys/fs/cgroup` or the tmpfs cannot be
/// mounted; a directory that cannot be attached stays empty (best effort, as in
/// `own_cgroup_view`).
fn cover_cgroup_tree(cgroups: &mut ReplicaCgroups, memory: &OwnedFd, pids: Option<&OwnedFd>) -> Option<OwnedFd> {
    let root = Path::new(CGROUP_ROOT);
    let side = cgroups.pids.iter().chain(&cgroups.cpu).map(V1Cgroup::path);
    if !cgroups.memory.iter().map(ReplicaCgroup::path).chain(side).all(|p| p.starts_with(root)) {
        return None;
    }
    let host = nix::fcntl::open(root, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    if !mount_v1_view(Some(memory.as_raw_fd()), pids.map(AsRawFd::as_raw_fd), pids.is_some(), false) {
        return None;
    }
    let through = PathBuf::from(format!("/proc/self/fd/{}", host.as_raw_fd()));
    if let Some(cg) = &mut cgroups.memory {
        cg.rebase(root, &through);
    }
    for cg in cgroups.pids.iter_mut().chain(cgroups.cpu.iter_mut()) {
        cg.rebase(root, &through);
    }
    Some(host)
}

/// `open_tree(2)`'s flag for a detached copy of the mount (a bind mount attached nowhere).
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `move_mount(2)`'s flag for a source given as a descriptor alone.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// A detached bind mount of the directory `path` (`open_tree` with `OPEN_TREE_CLONE`,
/// close-on-exec), to be attached in the program's mount namespace between fork and exec
/// with one `move_mount`: no new cgroup v1 superblock per replica, whose lookup takes the
/// kernel's global cgroup lock and drains dying cgroups (a tenth of a supervisor's CPU in
/// a burst of replicas, most of it waiting on that lock). None where the kernel has no
/// `open_tree` (before 5.2) or refuses: the program's namespace then mounts the hierarchy.
fn detached_bind(path: &Path) -> Option<OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: open_tree(2) on a NUL-terminated path; the descriptor it returns is ours.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint) };
    // SAFETY: a descriptor open_tree just returned, owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// Between fork and exec, in the replica's cgroups: a cgroup namespace rooted at them and
/// a mount namespace of the program's own in which `/sys/fs/cgroup` shows them and nothing
/// else (v2: the cgroup2 filesystem as the namespace sees it; v1: a read-only tmpfs with
/// the `memory` and `pids` hierarchies as the namespace sees them). `/proc/self/cgroup`
/// says `/`. The program sees its own limits and processes, never the host's cgroup tree
/// or other tenants' pids. System calls on static strings only; best effort: where the
/// kernel refuses a step, the program starts with what the steps before gave it (the
/// shim's own namespace, which it needs to supervise the run, is never changed).
fn own_cgroup_view(v: CgroupView) {
    let none = std::ptr::null::<libc::c_char>();
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: system calls on static NUL-terminated strings; no memory of the parent's.
    unsafe {
        if v.namespace_only {
            libc::unshare(libc::CLONE_NEWCGROUP);
            return;
        }
        if libc::unshare(libc::CLONE_NEWCGROUP | libc::CLONE_NEWNS) != 0 {
            return;
        }
        if libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            return;
        }
        let root = c"/sys/fs/cgroup".as_ptr();
        // The replica's cgroup directories are the server's (0700, its umask): the
        // program may read them (never write: their files stay root's, 0644).
        if v.v2 {
            if libc::mount(c"cgroup2".as_ptr(), root, c"cgroup2".as_ptr(), flags, std::ptr::null()) == 0 {
                libc::chmod(root, 0o755);
            }
            return;
        }
        mount_v1_view(v.memory_tree, v.pids_tree, v.v1_pids, true);
    }
}

/// cgroup v1: `/sys/fs/cgroup` covered by a tmpfs holding the replica's own `memory`
/// directory (and, `with_pids`, its `pids` one), then made read-only. Each is its detached
/// copy attached ([`detached_bind`]) or, where it has none and `mount_missing`, the
/// hierarchy mounted (as the caller's cgroup namespace shows it); else it stays empty.
/// False, with nothing mounted, when the tmpfs cannot be. System calls on static strings
/// and descriptors only: it also runs between fork and exec. The replica's cgroup
/// directories are the server's (0700, its umask): the program may read them (never
/// write: their files stay root's, 0644).
fn mount_v1_view(memory_tree: Option<RawFd>, pids_tree: Option<RawFd>, with_pids: bool, mount_missing: bool) -> bool {
    let none = std::ptr::null::<libc::c_char>();
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let root = c"/sys/fs/cgroup".as_ptr();
    let memory = (c"/sys/fs/cgroup/memory", c"memory", memory_tree);
    let pids = (c"/sys/fs/cgroup/pids", c"pids", pids_tree);
    let hierarchies: &[(&std::ffi::CStr, &std::ffi::CStr, Option<RawFd>)] = if with_pids { &[memory, pids] } else { &[memory] };
    // SAFETY: system calls on static NUL-terminated strings and descriptors the caller owns.
    unsafe {
        if libc::mount(c"tmpfs".as_ptr(), root, c"tmpfs".as_ptr(), flags, c"mode=0755,size=64k".as_ptr().cast()) != 0 {
            return false;
        }
        for &(dir, controller, tree) in hierarchies {
            if libc::mkdir(dir.as_ptr(), 0o755) != 0 {
                continue;
            }
            let attached = tree.is_some_and(|fd| {
                libc::syscall(libc::SYS_move_mount, fd, c"".as_ptr(), libc::AT_FDCWD, dir.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH) == 0
            });
            let mounted = || libc::mount(c"cgroup".as_ptr(), dir.as_ptr(), c"cgroup".as_ptr(), flags, controller.as_ptr().cast()) == 0;
            if attached || (mount_missing && mounted()) {
                libc::chmod(dir.as_ptr(), 0o755);
            }
        }
        libc::mount(none, root, none, libc::MS_REMOUNT | libc::MS_RDONLY | flags, std::ptr::null());
    }
    true
}

/// The soft `RLIMIT_NOFILE` a program gets at least (within the hard limit): the usual
/// default of a Linux login or service. Shells and Python need descriptors above 10 for
/// their own redirections; a program must not inherit a soft limit that only reflects how
/// short of descriptors its server was at the moment it started the shim.
const PROGRAM_NOFILE_SOFT_FLOOR: u64 = 1024;

/// Raises the shim's soft `RLIMIT_NOFILE` to its hard limit and returns the soft limit the
/// program gets before exec: the one the shim was started with (as Go's runtime does for
/// its children), never below `PROGRAM_NOFILE_SOFT_FLOOR` when the hard limit allows it.
/// A shim started by a server that is short of descriptors inherits that server's soft
/// limit; the shim itself needs a few (lock, log, pipes) and must not fail its program's
/// start for want of them. `None` when nothing was raised.
fn raise_nofile() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return None;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    Some(program_nofile_soft(soft, hard))
}

fn program_nofile_soft(inherited: u64, hard: u64) -> u64 {
    inherited.max(PROGRAM_NOFILE_SOFT_FLOOR.min(hard))
}

/// Between fork and exec, after the cgroup and the process group: the task limit, then
/// no new privileges, no supplementary groups, the gid and the uid. System calls only.
/// On failure, the errno is left for the caller to report.
fn drop_identity(limits: Limits) -> Result<(), ()> {
    if let Some(v) = limits.cgroup_view {
        own_cgroup_view(v);
    }
    // SAFETY: plain system calls on values, no memory shared with the parent.
    unsafe {
        if let Some(soft) = limits.nofile_soft {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return Err(());
            }
            lim.rlim_cur = soft as libc::rlim_t;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(());
            }
        }
        if let Some(n) = limits.nproc {
            let lim = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
            if libc::setrlimit(libc::RLIMIT_NPROC, &lim) != 0 {
                return Err(());
            }
        }
        if let Some(n) = limits.nice {
            // Raising a nice value needs no privilege; a failure leaves the default.
            libc::setpriority(libc::PRIO_PROCESS, 0, n);
        }
        if let Some(id) = limits.run_as {
            // The raw system calls, which change this task's credentials only: glibc's
            // wrappers would also signal the threads it believes this process has, which
            // in a vfork-like child are the shim's.
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, id.gid) != 0
                || libc::syscall(libc::SYS_setuid, id.uid) != 0
            {
                return Err(());
            }
        }
        if let Some(program) = limits.seccomp {
            // Last: the calls above are made before the filter is in force.
            if !crate::seccomp::install(program) {
                return Err(());
            }
        }
    }
    Ok(())
}

/// For a command entered into the running replica (`enter`), after its cgroups and
/// namespaces: what its program got between fork and exec (the task limit where no cgroup
/// holds it, the nice value, the user with no new privileges, the system call filter).
pub(crate) fn limit_entered(spec: &ShimSpec) -> io::Result<()> {
    let pids_in_cgroup = spec.pids_cgroup_base.is_some()
        || spec.cgroup_base.as_ref().is_some_and(|b| b.join(&spec.cgroup_name).join("pids.max").exists());
    let limits = Limits {
        nproc: spec.pids_max.filter(|_| !pids_in_cgroup && spec.run_as.is_some()),
        nofile_soft: None,
        run_as: spec.run_as,
        nice: spec.nice,
        seccomp: spec.run_as.and_then(|_| tenant_filter()),
        cgroup_view: None,
    };
    drop_identity(limits).map_err(|()| io::Error::last_os_error())
}

fn spawn_program(
    spec: &ShimSpec,
    cgroup: Option<&ReplicaCgroup>,
    pids_cgroup: Option<&V1Cgroup>,
    cpu_tasks: Option<&OwnedFd>,
    limits: Limits,
) -> Result<Program, SpawnFailure> {
    let Some(program) = spec.argv.first() else {
        return Err(SpawnFailure::Start("the program's argv is empty".into()));
    };
    if let Some(cwd) = &spec.cwd {
        if let Err(e) = fs::read_dir(cwd) {
            return Err(SpawnFailure::Start(format!("cannot start {program:?}: working directory {}: {e}", cwd.display())));
        }
    }
    // `clone3` starts a child in one cgroup only; a v1 pids cgroup is a second one (and
    // v1 has no `clone3` into a cgroup anyway).
    let into = cgroup.filter(|cg| cg.version() == CgroupVersion::V2 && pids_cgroup.is_none());
    let join = Join {
        // The child has one thread: moving that thread moves the process, and costs far
        // less than moving a process (see `ReplicaCgroup::thread_attach_file`).
        tasks: cgroup_file_c(cgroup.and_then(|cg| cg.thread_attach_file()))?,
        procs: cgroup_file_c(cgroup.map(|cg| cg.procs_file()))?,
        pids_tasks: cgroup_file_c(pids_cgroup.map(|cg| cg.tasks_file()))?,
        pids_procs: cgroup_file_c(pids_cgroup.map(|cg| cg.procs_file()))?,
        cpu_tasks: cpu_tasks.map(AsRawFd::as_raw_fd),
    };
    spawn_direct(spec, program, into, &join, limits)
}

/// The cgroup files a child writes `0` into to join them (made before the clone: no
/// allocation after it): the memory cgroup's `tasks` (v1), else its `cgroup.procs`; then
/// the v1 pids cgroup's, the same way; then the v1 CPU group's `tasks`, open already. A
/// failure is ours (a launch failure), unlike an exec failure, which is the user's.
struct Join {
    tasks: Option<CString>,
    procs: Option<CString>,
    pids_tasks: Option<CString>,
    pids_procs: Option<CString>,
    cpu_tasks: Option<RawFd>,
}

impl Join {
    /// In the child: joins what there is to join; the failing step, else None.
    fn join(&self) -> Option<u8> {
        let into = |tasks: &Option<CString>, procs: &Option<CString>| match procs {
            None => true,
            Some(procs) => tasks.as_deref().is_some_and(|t| write_zero(t).is_ok()) || write_zero(procs).is_ok(),
        };
        if !into(&self.tasks, &self.procs) {
            return Some(STEP_CGROUP);
        }
        // The task limit: from here on every fork of the program counts against the
        // replica's `pids.max`.
        if !into(&self.pids_tasks, &self.pids_procs) {
            return Some(STEP_PIDS_CGROUP);
        }
        if let Some(fd) = self.cpu_tasks {
            // SAFETY: write(2) of one static byte to a descriptor the shim holds open.
            if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                return Some(STEP_CPU_CGROUP);
            }
        }
        None
    }
}

/// A cgroup path for the child of a fork, made before the fork (no allocation after it).
fn cgroup_file_c(path: Option<PathBuf>) -> Result<Option<CString>, SpawnFailure> {
    path.map(|p| CString::new(p.as_os_str().as_bytes())).transpose().map_err(|e| SpawnFailure::Launch(format!("cgroup path: {e}")))
}

/// `clone3` flag: the child starts in the cgroup whose directory `CloneArgs::cgroup` is
/// open on (cgroup v2, Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What the child of `spawn_direct` reports on its pipe when it cannot exec: the
/// step, then the errno (native byte order).
const STEP_STDIO: u8 = b'o';
const STEP_CWD: u8 = b'd';
const STEP_GROUP: u8 = b'g';
const STEP_EXEC: u8 = b'e';
const STEP_IDENTITY: u8 = b'u';
const STEP_CGROUP: u8 = b'c';
const STEP_PIDS_CGROUP: u8 = b'p';
const STEP_CPU_CGROUP: u8 = b'w';

/// The places `execvp` would try for `program` in the program's own environment (`env`,
/// the last value of each name): the program itself if its name has a slash, else each
/// directory of that environment's PATH (glibc's `/bin:/usr/bin` without one; an empty
/// entry is the working directory). Made before the clone, so the child searches without
/// reading or writing the process's `environ`, which a vfork-like child shares with every
/// thread of its parent.
pub(crate) fn exec_candidates(program: &str, env: &std::collections::BTreeMap<&str, &str>) -> Result<Vec<CString>, io::Error> {
    let c = |s: String| CString::new(s).map_err(|_| nul_byte());
    if program.contains('/') {
        return Ok(vec![c(program.to_string())?]);
    }
    let path = env.get("PATH").copied().unwrap_or("/bin:/usr/bin");
    path.split(':').map(|dir| c(if dir.is_empty() { program.to_string() } else { format!("{}/{program}", dir.trim_end_matches('/')) })).collect()
}

/// The argument `Command` would refuse: it reports a NUL byte in the program, an argument,
/// the environment or the working directory this way (the API refuses such jobs first).
fn nul_byte() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "nul byte found in provided data")
}

/// Starts the program: its standard streams (stdin /dev/null, stdout and stderr pipes to
/// us), working directory, own process group, default signals, environment (exactly
/// `spec.env`, the last of a repeated name) and `execvp` in that environment's PATH.
///
/// With `into` (cgroup v2), created inside that cgroup (`clone3` with `CLONE_INTO_CGROUP`)
/// instead of moving there after a fork: a move through `cgroup.procs` takes the kernel's
/// threadgroup lock for writing and waits for an RCU grace period (about 5 ms per start),
/// and v2 has no cheaper file for a domain cgroup. Otherwise, or where that call is not
/// available (a kernel older than 5.7, a refused call), a vfork-like child (`clone` with
/// `CLONE_VM | CLONE_VFORK`) that joins its cgroups itself (`join`): it shares the shim's
/// memory until it execs, so no page table is copied and no page of the shim's is copied
/// on write (a fork's were a tenth of a supervisor's CPU).
///
/// The shim has one thread while it starts its program, so the child may run ordinary
/// code until it execs; it only makes system calls on memory prepared before, and ends in
/// `execvp` or `_exit` (no unwinding, no `abort`: glibc's cached thread id is the
/// parent's in a child that glibc did not fork).
fn spawn_direct(spec: &ShimSpec, program: &str, into: Option<&ReplicaCgroup>, join: &Join, limits: Limits) -> Result<Program, SpawnFailure> {
    use std::collections::BTreeMap;
    let launch = |what: &str, e: io::Error| SpawnFailure::Launch(format!("{what}: {e}"));
    let refused = || start_failure(program, nul_byte());
    if program.contains('\0') {
        return Err(refused());
    }
    let argv = spec.argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<Vec<_>, _>>().map_err(|_| refused())?;
    // As `Command::env_clear().envs(..)`: one entry per name, the last value, sorted.
    let env: BTreeMap<&str, &str> = spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let envp = env.iter().map(|(k, v)| CString::new(format!("{k}={v}"))).collect::<Result<Vec<_>, _>>().map_err(|_| refused())?;
    let cwd = spec.cwd.as_ref().map(|c| CString::new(c.as_os_str().as_bytes())).transpose().map_err(|_| refused())?;
    let argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
    let envp_p: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).chain([std::ptr::null()]).collect();
    if program.is_empty() {
        return Err(start_failure(program, io::Error::from_raw_os_error(libc::ENOENT)));
    }
    let candidates = exec_candidates(program, &env).map_err(|_| refused())?;
    let candidates_p: Vec<*const libc::c_char> = candidates.iter().map(|c| c.as_ptr()).collect();
    // A file without a `#!` line is run by /bin/sh, as execvp does: [sh, file, args...],
    // the file put in by the child.
    let mut script_argv: Vec<*const libc::c_char> =
        [c"/bin/sh".as_ptr(), std::ptr::null()].into_iter().chain(argv_p.iter().skip(1).copied()).collect();
    if argv_p.len() <= 1 {
        script_argv.push(std::ptr::null());
    }

    let null = File::open("/dev/null").map_err(|e| launch("open /dev/null", e))?;
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| launch("pipe", e.into()));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (report_r, report_w) = pipe()?;
    let child = ChildArgs {
        null: null.as_raw_fd(),
        out: out_w.as_raw_fd(),
        err: err_w.as_raw_fd(),
        report: report_w.as_raw_fd(),
        cwd: cwd.as_ref().map(|c| c.as_ptr()),
        candidates: &candidates_p,
        script_argv: script_argv.as_mut_ptr(),
        argv: &argv_p,
        envp: &envp_p,
        limits,
        join: None,
    };
    let created_inside = match into {
        Some(cg) => {
            let cgroup_dir = nix::fcntl::open(cg.path(), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(|e| launch("open the replica's cgroup", e.into()))?;
            let mut args = CloneArgs {
                flags: CLONE_INTO_CGROUP,
                exit_signal: libc::SIGCHLD as u64,
                cgroup: cgroup_dir.as_raw_fd() as u64,
                ..CloneArgs::default()
            };
            // SAFETY: clone3 with fork semantics (no CLONE_VM): the child gets a copy of
            // this single-threaded process and runs `exec_child`, which never returns.
            let r = unsafe { libc::syscall(libc::SYS_clone3, &mut args as *mut CloneArgs, std::mem::size_of::<CloneArgs>()) };
            if r == 0 {
                // SAFETY: in the child; every pointer was made above and is alive in this copy.
                unsafe { exec_child(&child) }
            }
            // Below 0: not available here (ENOSYS, E2BIG, EINVAL, EOPNOTSUPP, ...) or
            // refused for this cgroup; the child below joins it instead.
            (r > 0).then_some(r as libc::pid_t)
        }
        None => None,
    };
    let pid = match created_inside {
        Some(pid) => pid,
        None => {
            let child = ChildArgs { join: Some(join), ..child };
            // The child's stack: never zeroed, touched only as deep as it goes.
            let mut stack: Vec<u8> = Vec::with_capacity(VFORK_STACK);
            // 16-byte aligned end (the stack grows down).
            let top = ((stack.as_mut_ptr() as usize + VFORK_STACK) & !15) as *mut libc::c_void;
            // SAFETY: a vfork-like clone: the child runs `vfork_child` on `stack` in this
            // process's memory while this thread is suspended, until the child execs or
            // exits; `child` and everything it points to outlive that. The child only
            // makes system calls on memory prepared above (see `exec_child`).
            let r = unsafe {
                libc::clone(vfork_child, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, &child as *const ChildArgs as *mut libc::c_void)
            };
            drop(stack);
            if r < 0 {
                return Err(start_failure(program, io::Error::last_os_error()));
            }
            r as libc::pid_t
        }
    };
    drop((null, out_w, err_w, report_w));
    // EOF: the child exec'd (the CLOEXEC write end went with it). Else the step it
    // failed at and the errno.
    let mut report = File::from(report_r);
    let mut buf = [0u8; 5];
    let mut got = 0;
    while got < buf.len() {
        match report.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if got == 0 {
        return Ok(Program { pid: pid as u32, stdout: File::from(out_r), stderr: File::from(err_r) });
    }
    // The child has exited (or is about to): reap it.
    let mut status = 0;
    // SAFETY: waitpid of our own child, into our status variable.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {}
    let errno = if got == buf.len() { i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]) } else { libc::EIO };
    let e = io::Error::from_raw_os_error(errno);
    Err(match buf[0] {
        STEP_CGROUP => SpawnFailure::Launch(format!("cannot move the program into its cgroup: {e}")),
        STEP_PIDS_CGROUP => SpawnFailure::Launch(format!("cannot move the program into its pids cgroup: {e}")),
        STEP_CPU_CGROUP => SpawnFailure::Launch(format!("cannot move the program into the replicas' CPU group: {e}")),
        STEP_GROUP => SpawnFailure::Launch(format!("cannot give the program its own process group: {e}")),
        STEP_STDIO => SpawnFailure::Launch(format!("cannot set up the program's standard streams: {e}")),
        STEP_IDENTITY => {
            SpawnFailure::Launch(format!(
                "cannot limit the program's tasks, switch it to {:?} or install its system call filter: {e}",
                limits.run_as
            ))
        }
        // As `Command` reports them: a working directory or exec failure, the user's
        // unless the host ran out of something.
        _ => start_failure(program, e),
    })
}

/// The stack of a vfork-like child ([`spawn_direct`]): what `exec_child` needs, with
/// room to spare (pages are touched only as deep as it goes).
const VFORK_STACK: usize = 256 * 1024;

/// What the child of [`spawn_direct`] needs, all made before the clone.
#[derive(Clone, Copy)]
struct ChildArgs<'a> {
    null: libc::c_int,
    out: libc::c_int,
    err: libc::c_int,
    report: libc::c_int,
    cwd: Option<*const libc::c_char>,
    /// The paths to try in turn ([`exec_candidates`]).
    candidates: &'a [*const libc::c_char],
    /// `[/bin/sh, <file>, args..., NULL]`: the child writes the file into the second
    /// place before running a file the kernel cannot (`ENOEXEC`).
    script_argv: *mut *const libc::c_char,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    limits: Limits,
    /// The cgroups it joins itself (a vfork-like child), if it was not created in one.
    join: Option<&'a Join>,
}

/// The entry of a vfork-like child: [`exec_child`] on the `ChildArgs` at `arg`.
extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `spawn_direct` passes a `ChildArgs` that outlives the child's exec.
    unsafe { exec_child(&*(arg as *const ChildArgs<'_>)) }
}

/// The child of `spawn_direct`: its cgroups joined (a vfork-like child), standard
/// streams, working directory, own process group, signals, environment, `execvp`; a
/// failure is written to `report` (step and errno) and ends the child with status 127.
///
/// # Safety
/// Only in the child of a fork of a single-threaded process, or of a vfork-like clone of
/// one (its parent suspended until it execs or exits), with valid descriptors and
/// NUL-terminated strings and pointer arrays. It makes system calls on that memory only:
/// no allocation, no lock, no unwinding; what it writes of the shared memory is `errno`
/// and the second place of `script_argv`, never `environ` (other threads of a vfork-like
/// child's parent may be reading it).
unsafe fn exec_child(a: &ChildArgs<'_>) -> ! {
    let ChildArgs { null, out, err, report, cwd, candidates, script_argv, argv, envp, limits, join } = *a;
    let fail = |step: u8| -> ! {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO).to_ne_bytes();
        let msg = [step, errno[0], errno[1], errno[2], errno[3]];
        // SAFETY: write of a local buffer, then _exit (no destructors, no atexit).
        unsafe {
            libc::write(report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };
    if let Some(step) = join.and_then(Join::join) {
        fail(step);
    }
    // SAFETY: dup2/chdir/setpgid/execve on descriptors, strings and arrays valid in this
    // child, each array NULL-terminated.
    unsafe {
        if libc::dup2(null, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(err, 2) < 0 {
            fail(STEP_STDIO);
        }
        if let Some(cwd) = cwd {
            if libc::chdir(cwd) != 0 {
                fail(STEP_CWD);
            }
        }
        // Its own process group, so a stop reaches all of it with killpg.
        if libc::setpgid(0, 0) != 0 {
            fail(STEP_GROUP);
        }
        reset_signals_for_exec();
        if drop_identity(limits).is_err() {
            fail(STEP_IDENTITY);
        }
        // execvp's search, in the program's environment: a place that does not exist or
        // cannot be reached is passed over; one that cannot be run (EACCES) is remembered;
        // any other failure ends the search with its errno.
        let mut denied = false;
        for &file in candidates {
            libc::execve(file, argv.as_ptr(), envp.as_ptr());
            match *libc::__errno_location() {
                libc::ENOEXEC => {
                    *script_argv.add(1) = file;
                    libc::execve(c"/bin/sh".as_ptr(), script_argv as *const *const libc::c_char, envp.as_ptr());
                    fail(STEP_EXEC)
                }
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => fail(STEP_EXEC),
            }
        }
        if denied {
            *libc::__errno_location() = libc::EACCES;
        }
    }
    fail(STEP_EXEC)
}

/// The program starts with no blocked signals and default dispositions (the shim blocks
/// TERM/INT/HUP/CHLD and ignores PIPE; both would be inherited). Runs between fork and
/// exec: system calls only. The dispositions are reset with libc's `signal` (nix's takes
/// only the standard signals, not the real-time ones); glibc's two internal signals (32
/// and 33), which its `signal` refuses and its posix_spawn (which starts the shim) leaves
/// ignored, with the raw `rt_sigaction` system call.
fn reset_signals_for_exec() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    for sig in 1..65 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: SIG_DFL installs no handler code.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
    for sig in [32, 33] {
        let act = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
        // SAFETY: a valid `struct sigaction` on the stack for the kernel to read; no old
        // action wanted.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &act as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

/// The kernel's `struct sigaction` for `rt_sigaction` (x86-64 and aarch64 layout), enough
/// to set a default disposition.
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Writes `0` into a cgroup file, which moves the writer into that cgroup. Runs between
/// fork and exec: system calls only, no allocation.
fn write_zero(path: &std::ffi::CStr) -> io::Result<()> {
    let fd = nix::fcntl::open(path, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    match nix::unistd::write(&fd, b"0")? {
        1 => Ok(()),
        _ => Err(io::Error::from(Errno::EIO)),
    }
}

/// Waits until the program exits, reading its output meanwhile; a SIGTERM/SIGINT/SIGHUP
/// starts a stop: SIGTERM to its process group, then SIGKILL to the group and the cgroup
/// at the end of the grace period. Reaps any other child on the way. Returns the wait
/// status.
fn supervise_until_exit(
    waiter: &mut Waiter<'_>,
    pid: Pid,
    pgid: Pid,
    grace: Duration,
    cgroup: Option<&ReplicaCgroup>,
    container: Option<&ContainerSpec>,
) -> i32 {
    let mut main_status: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut stopping = false;
    // A SIGCHLD may have come before we wait: reap once up front.
    reap(pid, &mut main_status);
    while main_status.is_none() {
        let now = Instant::now();
        if kill_at.is_some_and(|at| at <= now) {
            kill_at = None;
            let _ = killpg(pgid, Signal::SIGKILL);
            if let Some(cg) = cgroup {
                if let Err(e) = cg.kill_pass() {
                    diag(format_args!("{e}"));
                }
            }
            continue;
        }
        let sig = waiter.next_signal(kill_at.map(|at| at.saturating_duration_since(now)));
        match sig {
            Some(Signal::SIGCHLD) => reap(pid, &mut main_status),
            // Passed on (the timeout warning, L19): to the container's init, or the group.
            Some(sig @ (Signal::SIGUSR1 | Signal::SIGUSR2)) if !stopping => match container {
                Some(c) => {
                    let spawned = c
                        .engine
                        .command(["kill", "--signal", sig.as_str(), &c.name])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn();
                    if let Err(e) = spawned {
                        diag(format_args!("cannot run podman kill --signal {}: {e}", sig.as_str()));
                    }
                }
                None => {
                    let _ = killpg(pgid, sig);
                }
            },
            Some(Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP) if !stopping => {
                stopping = true;
                match container {
                    // The image's stop signal to the container's init, SIGKILL after the
                    // grace period: `podman stop`, left to run (reaped by `reap`). The
                    // client is killed a moment after the engine's own SIGKILL.
                    Some(c) => {
                        let secs = grace.as_secs_f64().ceil() as u64;
                        let spawned = c
                            .engine
                            .command(["stop", "--time", &secs.to_string(), &c.name])
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn();
                        if let Err(e) = spawned {
                            diag(format_args!("cannot run podman stop: {e}; stopping the client"));
                            let _ = killpg(pgid, Signal::SIGTERM);
                        }
                        kill_at = Some(Instant::now() + grace + Duration::from_secs(2));
                    }
                    None => {
                        let _ = killpg(pgid, Signal::SIGTERM);
                        kill_at = Some(Instant::now() + grace);
                    }
                }
            }
            _ => {}
        }
    }
    main_status.unwrap_or(0)
}

/// What the supervisor waits on, in its one thread: its signals and the program's output
/// (L22).
struct Waiter<'a> {
    signals: SignalFd,
    pump: log::Pump,
    writer: &'a LogWriter,
}

impl Waiter<'_> {
    /// The next signal, or `None` when `timeout` passed first or output was read (the
    /// caller looks at its clock and asks again), or the wait failed.
    fn next_signal(&mut self, timeout: Option<Duration>) -> Option<Signal> {
        if !self.poll(true, timeout) {
            return None;
        }
        match self.signals.read_signal() {
            Ok(Some(info)) => Signal::try_from(info.ssi_signo as libc::c_int).ok(),
            Ok(None) => None,
            Err(e) => {
                diag(format_args!("reading a signal: {e}"));
                None
            }
        }
    }

    /// Reads the program's output until its pipes close, or `deadline`: whether they
    /// closed.
    fn drain(&mut self, deadline: Instant) -> bool {
        while self.pump.is_open() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.poll(false, Some(deadline - now));
        }
        true
    }

    /// One wait for the open pipes (and the signals, when `signals`), up to `timeout`;
    /// reads what the pipes hold. Returns whether a signal is there to be read.
    fn poll(&mut self, signals: bool, timeout: Option<Duration>) -> bool {
        let (signal, ready) = {
            let mut fds = Vec::with_capacity(3);
            let mut which = Vec::with_capacity(3);
            if signals {
                fds.push(PollFd::new(self.signals.as_fd(), PollFlags::POLLIN));
                which.push(None);
            }
            for (i, fd) in self.pump.pipes() {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                which.push(Some(i));
            }
            let timeout = timeout.map(TimeSpec::from_duration);
            match ppoll(&mut fds, timeout, None) {
                Ok(_) => {}
                Err(Errno::EINTR) => return false,
                Err(e) => {
                    // Cannot happen for these descriptors; waiting on is all there is.
                    diag(format_args!("waiting for the program: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    return false;
                }
            }
            let (mut signal, mut ready) = (false, [false; 2]);
            for (fd, w) in fds.iter().zip(which) {
                if fd.revents().is_some_and(|r| !r.is_empty()) {
                    match w {
                        Some(i) => ready[i] = true,
                        None => signal = true,
                    }
                }
            }
            (signal, ready)
        };
        self.pump.read_ready(ready, self.writer);
        signal
    }
}

/// Reaps every exited child without blocking, noting the program's raw wait status.
fn reap(pid: Pid, main_status: &mut Option<i32>) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes into our status variable. Not nix's waitpid: it cannot
        // decode a death by a real-time signal and would return an error for a child it
        // has already reaped, losing the program's status.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if r <= 0 {
            return;
        }
        if r == pid.as_raw() {
            *main_status = Some(status);
        }
    }
}

/// SIGKILLs what is left of the program's process group, everything in its cgroup, and
/// every child of the shim (orphans reparented to this subreaper), reaping as it goes,
/// until nothing is left or the bound runs out.
fn kill_remaining(pgid: Pid, cgroup: Option<&ReplicaCgroup>) {
    let me = nix::unistd::getpid().as_raw();
    let deadline = Instant::now() + CLEANUP_BOUND;
    let mut ignored = None;
    loop {
        let _ = killpg(pgid, Signal::SIGKILL);
        let in_cgroup = match cgroup.map(|cg| cg.kill_pass()) {
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                diag(format_args!("{e}"));
                0
            }
            None => 0,
        };
        let children = crate::procfs::children_of(me);
        for &child in &children {
            let _ = nix::sys::signal::kill(Pid::from_raw(child), Signal::SIGKILL);
        }
        reap(Pid::from_raw(-1), &mut ignored);
        if children.is_empty() && in_cgroup == 0 {
            return;
        }
        if Instant::now() >= deadline {
            diag(format_args!(
                "{} child process(es) and {in_cgroup} cgroup member(s) still present after {CLEANUP_BOUND:?}",
                children.len()
            ));
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_LIMITS: Limits = Limits { nproc: None, nofile_soft: None, run_as: None, cgroup_view: None, nice: None, seccomp: None };

    fn no_join() -> Join {
        Join { tasks: None, procs: None, pids_tasks: None, pids_procs: None, cpu_tasks: None }
    }

    /// The vfork-like start (what a replica's program gets on cgroup v1): the program runs
    /// with exactly the spec's environment, in its working directory and its own process
    /// group, its output on the pipes, found in that environment's PATH; the process's own
    /// environment is never touched (the child shares its memory with every thread).
    #[test]
    fn a_vfork_like_child_runs_the_program_and_leaves_the_shim_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path_before = std::env::var_os("PATH");
        let mut spec = ShimSpec::new(
            vec!["sh".into(), "-c".into(), "echo \"$GREETING $(pwd) $(ps -o pgid= -p $$ | tr -d ' ') $$\"; echo oops >&2".into()],
            vec![("GREETING".into(), "hello".into()), ("PATH".into(), "/usr/bin:/bin".into())],
        );
        spec.cwd = Some(dir.path().to_path_buf());
        let join = no_join();
        let mut p = spawn_direct(&spec, "sh", None, &join, NO_LIMITS).ok().expect("started by the vfork-like way");
        assert_eq!(std::env::var_os("PATH"), path_before, "the shim's environment changed");
        let mut out = String::new();
        p.stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        p.stderr.read_to_string(&mut err).unwrap();
        let mut status = 0;
        unsafe { libc::waitpid(p.pid as i32, &mut status, 0) };
        assert_eq!(status, 0);
        let pid = p.pid.to_string();
        assert_eq!(out.trim(), format!("hello {} {pid} {pid}", dir.path().display()), "environment, directory, own process group");
        assert_eq!(err, "oops\n");
    }

    /// The program is looked for as execvp does, in the PATH of the program's environment
    /// (not the shim's): missing places are passed over, a file that cannot be run is
    /// remembered (EACCES if nothing else is found), a file without `#!` is run by /bin/sh.
    #[test]
    fn a_vfork_like_child_searches_the_programs_path_as_execvp_does() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        fs::write(a.join("prog"), "echo from-a\n").unwrap();
        fs::set_permissions(a.join("prog"), fs::Permissions::from_mode(0o644)).unwrap();
        // Written by another process: a descriptor open for writing in this one would be
        // copied into the children that other tests start meanwhile, and the file could
        // not be run while they hold it (ETXTBSY).
        let written = std::process::Command::new("sh")
            .args(["-c", "printf 'echo from-b \"$1\"\\n' > \"$0\" && chmod 755 \"$0\""])
            .arg(b.join("prog"))
            .status()
            .unwrap();
        assert!(written.success());
        let run = |path: String| {
            let spec = ShimSpec::new(vec!["prog".into(), "x".into()], vec![("PATH".into(), path)]);
            spawn_direct(&spec, "prog", None, &no_join(), NO_LIMITS).map(|mut p| {
                let mut out = String::new();
                p.stdout.read_to_string(&mut out).unwrap();
                let mut status = 0;
                unsafe { libc::waitpid(p.pid as i32, &mut status, 0) };
                out
            })
        };
        let out = run(format!("/nonexistent:{}:{}", a.display(), b.display())).ok().expect("found in b");
        assert_eq!(out, "from-b x\n");
        match run(format!("/nonexistent:{}", a.display())) {
            Err(SpawnFailure::Start(m)) => assert!(m.contains("Permission denied"), "{m}"),
            _ => panic!("a file that cannot be run is not reported as such"),
        }
        match run("/nonexistent".into()) {
            Err(SpawnFailure::Start(m)) => assert!(m.contains("No such file"), "{m}"),
            _ => panic!("a program found nowhere is not reported as such"),
        }
    }

    /// Its failures are told apart as `Command`'s are: a program that cannot be run is the
    /// user's, a cgroup that cannot be joined is ours.
    #[test]
    fn a_vfork_like_child_reports_what_failed() {
        let spec = ShimSpec::new(vec!["/nonexistent/program".into()], vec![]);
        let join = no_join();
        match spawn_direct(&spec, "/nonexistent/program", None, &join, NO_LIMITS) {
            Err(SpawnFailure::Start(m)) => assert!(m.contains("No such file"), "{m}"),
            _ => panic!("a missing program is not reported as the user's start error"),
        }
        let spec = ShimSpec::new(vec!["true".into()], vec![]);
        let join = Join { procs: Some(CString::new("/nonexistent/cgroup.procs").unwrap()), ..no_join() };
        match spawn_direct(&spec, "true", None, &join, NO_LIMITS) {
            Err(SpawnFailure::Launch(m)) => assert!(m.contains("cannot move the program into its cgroup"), "{m}"),
            _ => panic!("a cgroup that cannot be joined is not reported as such"),
        }
        // An argument with a NUL byte cannot be passed: the user's, as `Command` says it.
        let spec = ShimSpec::new(vec!["echo".into(), "a\0b".into()], vec![]);
        match spawn_direct(&spec, "echo", None, &no_join(), NO_LIMITS) {
            Err(SpawnFailure::Start(m)) => assert_eq!(m, "cannot start \"echo\": nul byte found in provided data"),
            _ => panic!("an argument with a NUL byte is not reported as the user's start error"),
        }
    }

    #[test]
    fn spec_wire_format() {
        let json = r#"{"argv":["prog","a"],"env":[["K","V"]],"cwd":null,"memory_limit_bytes":100,
            "grace_seconds":30.0,"cgroup_base":"/sys/fs/cgroup/memory/x/trainyard","cgroup_version":1,
            "cgroup_name":"j12-a0-workerpool0-0-r0"}"#;
        let spec: ShimSpec = serde_json::from_str(json).unwrap();
        assert_eq!(spec.env, vec![("K".to_string(), "V".to_string())]);
        assert_eq!(spec.cgroup_version, Some(1));
        let back: serde_json::Value = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["env"], serde_json::json!([["K", "V"]]));
        assert_eq!(back["cwd"], serde_json::Value::Null);
        // A spec from before pids cgroups: none; and none is not written.
        assert_eq!(spec.pids_cgroup_base, None);
        assert!(back.get("pids_cgroup_base").is_none(), "{back}");

        let json = r#"{"argv":["prog"],"env":[],"cgroup_base":"/sys/fs/cgroup/memory/x/trainyard","cgroup_version":1,
            "cgroup_name":"j12-a0-workerpool0-0-r0","pids_max":4096,"pids_cgroup_base":"/sys/fs/cgroup/pids/trainyard"}"#;
        let spec: ShimSpec = serde_json::from_str(json).unwrap();
        assert_eq!(spec.pids_max, Some(4096));
        assert_eq!(spec.pids_cgroup_base, Some(PathBuf::from("/sys/fs/cgroup/pids/trainyard")));
        let back: serde_json::Value = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["pids_cgroup_base"], "/sys/fs/cgroup/pids/trainyard");
    }

    /// Where the task limit goes. A temporary directory stands in for a cgroup v2 replica
    /// cgroup with the pids controller (this project's CI hosts have cgroup v1, so a real
    /// v2 pids controller is not available to the tests): `pids.max` is written there and
    /// the program gets no RLIMIT_NPROC. Without the file (no pids controller) it is
    /// RLIMIT_NPROC for a program of another uid, and nothing for one of the shim's own.
    /// With a v1 pids cgroup the limit is that cgroup's.
    #[test]
    fn the_task_limit_goes_to_a_cgroup_where_there_is_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("pids.max"), "max\n").unwrap();
        let run_as = Some(RunAs { uid: 200_000, gid: 200_000 });
        let v2 = ReplicaCgroups { memory: Some(ReplicaCgroup::open(CgroupVersion::V2, dir.clone())), pids: None, cpu: None };
        assert_eq!(program_nproc(Some(20), run_as, &v2), None);
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "20");
        assert_eq!(program_nproc(None, run_as, &v2), None);

        fs::remove_file(dir.join("pids.max")).unwrap();
        assert_eq!(program_nproc(Some(20), run_as, &v2), Some(20));
        assert_eq!(program_nproc(Some(20), None, &v2), None);
        assert_eq!(program_nproc(Some(20), run_as, &ReplicaCgroups::default()), Some(20));

        // cgroup v1: the memory cgroup cannot take it, the pids cgroup has it.
        let v1 = ReplicaCgroups {
            memory: Some(ReplicaCgroup::open(CgroupVersion::V1, dir.clone())),
            pids: Some(V1Cgroup::open(tmp.path().join("p"))),
            cpu: None,
        };
        assert_eq!(program_nproc(Some(20), run_as, &v1), None);
        let v1_without = ReplicaCgroups { memory: Some(ReplicaCgroup::open(CgroupVersion::V1, dir)), pids: None, cpu: None };
        assert_eq!(program_nproc(Some(20), run_as, &v1_without), Some(20));
    }

    /// The program's soft descriptor limit is what the shim inherited, but never below the
    /// usual 1024 that the hard limit allows: a server short of descriptors at launch does
    /// not pass its shortage on (a shell's redirection needs descriptor 10 and above).
    #[test]
    fn program_nofile_soft_has_a_floor_within_the_hard_limit() {
        assert_eq!(program_nofile_soft(12, 1_048_576), 1024);
        assert_eq!(program_nofile_soft(4096, 1_048_576), 4096);
        assert_eq!(program_nofile_soft(12, 512), 512);
        assert_eq!(program_nofile_soft(1024, 4096), 1024);
    }

    /// L23: a status write that fails is tried again (50 ms, doubling, at most 5 s apart)
    /// until it succeeds, with the same outcome; only a run directory that is gone ends
    /// the tries.
    #[test]
    fn l23_status_writes_are_retried_with_backoff_until_they_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATUS_FILE);
        let status = ShimStatus::failed_before_start(None, Some("x".into()));
        let mut left = 12;
        let mut slept = Vec::new();
        let failures = write_until_done(
            &path,
            || {
                if left > 0 {
                    left -= 1;
                    let source = io::Error::from_raw_os_error(libc::ENOSPC);
                    return Err(FileError { op: "write", path: path.clone(), source }.into());
                }
                write_json(&path, &status)
            },
            || false,
            |d| slept.push(d.as_millis()),
        )
        .unwrap();
        assert_eq!(failures, 12);
        assert_eq!(slept, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000, 5000]);
        assert_eq!(read_status(dir.path()).unwrap(), Some(status));

        // Gone: the last error is returned after one try.
        let mut tries = 0;
        let r = write_until_done(
            &path,
            || {
                tries += 1;
                Err(FileError { op: "write", path: path.clone(), source: io::Error::from_raw_os_error(libc::ENOENT) }.into())
            },
            || true,
            |_| panic!("no sleep when the run directory is gone"),
        );
        assert!(r.is_err());
        assert_eq!(tries, 1);
    }

    #[test]
    fn status_wire_format() {
        let s = ShimStatus {
            exit_code: None,
            signal: Some(9),
            oom_kills: None,
            start_error: None,
            launch_error: None,
            ended_micros: 5,
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["signal"], 9);
        assert_eq!(v["oom_kills"], serde_json::Value::Null);
        // A status without launch_error (the field is optional on read).
        let old: ShimStatus =
            serde_json::from_str(r#"{"exit_code":0,"signal":null,"oom_kills":0,"start_error":null,"ended_micros":1}"#).unwrap();
        assert_eq!(old.exit_code, Some(0));
    }
}
