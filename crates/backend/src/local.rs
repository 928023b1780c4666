//! The local backend: each replica run is a shim process ([`crate::shim`]) supervising
//! one program, with everything about the run kept in its run directory, so that a
//! restarted server adopts running replicas instead of losing them (L23).
//!
//! One watcher thread per run turns the shim's files into [`BackendEvent`]s. Liveness is
//! the shim's `flock` on `shim.lock`, never a stored pid (pids are reused). The server
//! only ever takes that lock shared (`LOCK_SH`): it can then wait for a shim's exclusive
//! lock to go without ever looking like a shim itself.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use trainyard_core::{Outcome, RunId};

use crate::cgroup::{CgroupSupport, CgroupVersion, CpuSupport, V1Cgroup, PidsSupport, ReplicaCgroup};
use crate::forkserver::{self, ForkServer};
use crate::fsutil::{self, FileError, IoResultExt};
use crate::{lock, log};
use crate::seam::{BackendError, BackendEvent, EventSink};
use crate::shim::{self, ShimError, ShimSpec, ShimStatus};

/// Lines of stderr reported with an exit: the failure rules' log patterns look at them
/// (an error message carries the last 20).
pub const STDERR_TAIL_LINES: usize = 100;

/// How long `stop` waits for a shim that this backend is still starting to take its lock.
const STOP_WAIT_FOR_SHIM: Duration = Duration::from_secs(5);

/// Runs replicas as local processes under shims. `Send + Sync`; all waiting happens on
/// one thread per run.
pub struct LocalBackend {
    shim_command: Vec<OsString>,
    /// Forks the shims (see [`crate::forkserver`]).
    fork_server: ForkServer,
    cgroups: CgroupSupport,
    /// Where replicas' task limits are enforced (with `cgroups`).
    pids: PidsSupport,
    cpu: CpuSupport,
    /// Run directories that a watcher of this backend is reporting on.
    watched: Arc<Mutex<HashSet<PathBuf>>>,
    /// Images seen on the host, not checked again (a run whose image has gone since says
    /// so in its own outcome).
    images: Arc<Mutex<HashSet<String>>>,
    /// Runs whose image could not be pulled yet: when the first pull failed
    /// (`[containers] pull_timeout_secs` counts from there).
    pulls: Arc<Mutex<HashMap<PathBuf, Instant>>>,
}

/// Marks a run directory as watched until dropped.
struct Claim {
    watched: Arc<Mutex<HashSet<PathBuf>>>,
    run_dir: PathBuf,
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&self.watched).remove(&self.run_dir);
    }
}


/// What `stop` and `kill` find in a run directory.
enum Found {
    /// The run recorded its outcome.
    Ended,
    /// A shim holds the run's lock; its pid.
    Shim(libc::pid_t),
    /// No shim, and none that this backend is starting.
    NoShim,
}

/// Is a shim alive in the run directory, by its lock?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LockState {
    /// A shim holds the lock.
    Held,
    /// The lock file exists and nobody holds it.
    Free,
    /// No lock file: no shim ever started here.
    Missing,
}

fn probe_lock(run_dir: &Path) -> Result<LockState, FileError> {
    let path = run_dir.join(shim::LOCK_FILE);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LockState::Missing),
        Err(e) => return Err(FileError { op: "open lock", path, source: e }),
    };
    loop {
        // The shared lock, if we get it, is released when it is dropped here.
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_probe) => return Ok(LockState::Free),
            Err((f, Errno::EINTR)) => file = f,
            // EWOULDBLOCK (= EAGAIN on Linux): a shim holds it exclusively.
            Err((_, Errno::EAGAIN)) => return Ok(LockState::Held),
            Err((_, e)) => return Err(FileError { op: "probe lock", path, source: e.into() }),
        }
    }
}

/// Blocks until no shim holds the run directory's lock: returns when the shim exits,
/// without polling.
fn wait_for_shim_exit(run_dir: &Path) -> Result<(), FileError> {
    let path = run_dir.join(shim::LOCK_FILE);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FileError { op: "open lock", path, source: e }),
    };
    loop {
        match Flock::lock(file, FlockArg::LockShared) {
            Ok(_released) => return Ok(()),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, e)) => return Err(FileError { op: "wait for lock", path, source: e.into() }),
        }
    }
}

/// The replica cgroup's name for a run: `j12-a0-workerpool0-0-r0-1f2e3d4c`. The suffix
/// is a hash of the run directory, so that two servers with different data directories
/// under one parent cgroup never share (and kill) each other's replica cgroups.
pub fn cgroup_name(run: &RunId, run_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let replica: String = run.replica.chars().map(|c| if c == '/' || c.is_control() { '_' } else { c }).collect();
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let hash = run_dir.as_os_str().as_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("j{}-a{}-{}-r{}-{:08x}", run.job, run.attempt, replica, run.restart, hash as u32)
}

/// The outcome a finished shim recorded. An OOM kill counts only when the cgroup's
/// `oom_kill` counter went up *and* the run failed: a program that survived the OOM
/// death of one of its helpers and exited 0 succeeded.
pub fn outcome_from_status(status: &ShimStatus) -> Outcome {
    if let Some(message) = &status.launch_error {
        return Outcome::LaunchFailed { message: message.clone() };
    }
    if let Some(message) = &status.start_error {
        return Outcome::StartError { message: message.clone() };
    }
    let oom = status.oom_kills.is_some_and(|n| n > 0);
    match (status.exit_code, status.signal) {
        (_, Some(signal)) if oom => Outcome::OomKilled { status: 128 + signal },
        (Some(code), None) if oom && code != 0 => Outcome::OomKilled { status: code },
        (_, Some(signal)) => Outcome::Signaled { signal },
        (Some(code), None) => Outcome::Exited { code },
        (None, None) => Outcome::Lost { message: format!("{} records neither an exit code nor a signal", shim::STATUS_FILE) },
    }
}

impl LocalBackend {
    /// With `[containers] pull = "missing"`: the image pulled before the shim starts, so
    /// that a registry that cannot be reached keeps the launch waiting (retried with
    /// backoff, the engine's message as the waiting reason) instead of failing the job.
    /// A registry that refuses the image (no such image, no access) is left to the run,
    /// which ends in a StartError naming it.
    ///
    /// A pull that has not succeeded `pull_timeout_secs` after the run's first try, or
    /// one that can never succeed (the registry refused the image, a short name that does
    /// not resolve, a name the engine rejects), is [`BackendError::StartRefused`]: the
    /// run ends with a StartError naming the image, the engine's message and the fixes.
    fn ensure_image(&self, run_dir: &Path, c: &crate::container::ContainerSpec) -> Result<(), BackendError> {
        if c.engine.pull != crate::container::Pull::Missing {
            return Ok(());
        }
        let known = |images: &Arc<Mutex<HashSet<String>>>| images.lock().map(|s| s.contains(&c.image)).unwrap_or(false);
        if known(&self.images) {
            return Ok(());
        }
        let engine = || c.engine.program.display().to_string();
        let present = c.engine.image_exists(&c.image).map_err(|message| BackendError::Unavailable { engine: engine(), message })?;
        if !present {
            let limit = Duration::from_secs(c.engine.pull_timeout_secs);
            let first = *lock(&self.pulls).entry(run_dir.to_path_buf()).or_insert_with(Instant::now);
            let left = limit.saturating_sub(first.elapsed()).max(Duration::from_secs(1));
            let refused = |message: String, why: String| {
                lock(&self.pulls).remove(run_dir);
                BackendError::StartRefused {
                    message: format!("the image {:?} {why} ({message}); {}", c.image, crate::container::IMAGE_FIXES),
                }
            };
            match c.engine.pull(&c.image, left) {
                Ok(()) => {
                    lock(&self.pulls).remove(run_dir);
                }
                Err((message, true)) => return Err(refused(message, "cannot be pulled".into())),
                Err((message, false)) if first.elapsed() >= limit => {
                    let why = format!(
                        "could not be pulled within {}s ([containers] pull_timeout_secs)",
                        c.engine.pull_timeout_secs
                    );
                    return Err(refused(message, why));
                }
                // Offline: bounded by what a user waits for, not by a slow pull's bound.
                Err((message, false))
                    if crate::container::registry_unreachable(&message)
                        && first.elapsed() >= Duration::from_secs(c.engine.offline_pull_timeout_secs) =>
                {
                    let why = format!(
                        "could not be pulled: its registry could not be reached for {}s ([containers] offline_pull_timeout_secs)",
                        c.engine.offline_pull_timeout_secs
                    );
                    return Err(refused(message, why));
                }
                Err((message, false)) => {
                    let (secs, key) = if crate::container::registry_unreachable(&message) {
                        (c.engine.offline_pull_timeout_secs.min(c.engine.pull_timeout_secs), "offline_pull_timeout_secs")
                    } else {
                        (c.engine.pull_timeout_secs, "pull_timeout_secs")
                    };
                    return Err(BackendError::Unavailable {
                        engine: format!("the registry of {}", c.image),
                        message: format!(
                            "pulling {}: {message} (the run fails after {secs}s of this, [containers] {key}; {})",
                            c.image,
                            crate::container::IMAGE_FIXES
                        ),
                    });
                }
            }
        }
        if let Ok(mut s) = self.images.lock() {
            s.insert(c.image.clone());
        }
        Ok(())
    }

    /// `shim_command` is the program and leading arguments that run a shim, e.g.
    /// `[current_exe, "shim"]`; the run directory is appended. With v1 `cgroups` this
    /// also looks for a usable cgroup v1 pids hierarchy ([`PidsSupport::detect`]).
    pub fn new(shim_command: Vec<OsString>, cgroups: CgroupSupport) -> LocalBackend {
        let pids = PidsSupport::detect(&cgroups);
        LocalBackend {
            fork_server: ForkServer::new(shim_command.clone()),
            shim_command,
            cgroups,
            pids,
            cpu: CpuSupport::Unavailable { reason: "not asked for".into() },
            watched: Arc::new(Mutex::new(HashSet::new())),
            images: Arc::new(Mutex::new(HashSet::new())),
            pulls: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn cgroups(&self) -> &CgroupSupport {
        &self.cgroups
    }

    pub fn pids(&self) -> &PidsSupport {
        &self.pids
    }

    /// Puts replicas' host programs in one CPU group below the server, weighted like one
    /// task at `nice` ([`CpuSupport::detect`]).
    pub fn with_replica_cpu(mut self, nice: i32) -> LocalBackend {
        self.cpu = CpuSupport::detect(&self.cgroups, nice);
        self
    }

    pub fn cpu(&self) -> &CpuSupport {
        &self.cpu
    }

    fn claim(&self, run_dir: &Path) -> Option<Claim> {
        let mut set = lock(&self.watched);
        set.insert(run_dir.to_path_buf())
            .then(|| Claim { watched: Arc::clone(&self.watched), run_dir: run_dir.to_path_buf() })
    }

    fn is_watched(&self, run_dir: &Path) -> bool {
        lock(&self.watched).contains(run_dir)
    }

    /// Launches a run, idempotently: a run that already ended is reported from its
    /// `status.json`, a run whose shim is alive is adopted, a run that this backend
    /// already watches is left alone, and a run whose shim died is reported `Lost`: a
    /// program is never started twice for one `RunId`. Otherwise writes `spec.json`
    /// (with this backend's cgroup base) and starts a shim. Events go to `sink` from a
    /// watcher thread; errors here mean nothing was started. An error because the host
    /// ran out of file descriptors, processes or threads, memory or disk space is
    /// [`BackendError::Exhausted`] ([`BackendError::is_retryable`]): the same launch may
    /// simply be tried again later (not an L16 launch failure).
    pub fn launch(&self, run: RunId, run_dir: &Path, spec: ShimSpec, sink: EventSink) -> Result<(), BackendError> {
        self.launch_once(run, run_dir, spec, sink).map_err(BackendError::classify_exhaustion)
    }

    fn launch_once(&self, run: RunId, run_dir: &Path, spec: ShimSpec, sink: EventSink) -> Result<(), BackendError> {
        let program = self.shim_command.first().ok_or(BackendError::NoShimCommand)?.clone();
        let run_dir = std::path::absolute(run_dir).at("resolve", run_dir)?;
        let Some(claim) = self.claim(&run_dir) else { return Ok(()) };
        // From here on an error drops the claim before it is returned, so that the same
        // launch tried again is not taken for a duplicate.
        match probe_lock(&run_dir)? {
            LockState::Held => return self.watch(claim, move |claim| watch_adopted(run, claim, sink)),
            LockState::Free | LockState::Missing => {
                if run_dir.join(shim::STATUS_FILE).exists() || run_dir.join(shim::PID_FILE).exists() {
                    return self.watch(claim, move |claim| finish(run, claim, sink, false, None));
                }
            }
        }
        if let Some(c) = &spec.container {
            self.ensure_image(&run_dir, c)?;
        }
        fs::create_dir_all(&run_dir).at("create run directory", &run_dir)?;
        let mut spec = spec;
        match self.cgroups.base() {
            Some((version, base)) => {
                spec.cgroup_base = Some(base.to_path_buf());
                spec.cgroup_version = Some(version.number());
            }
            None => {
                spec.cgroup_base = None;
                spec.cgroup_version = None;
            }
        }
        if spec.cgroup_name.is_empty() {
            spec.cgroup_name = cgroup_name(&run, &run_dir);
        }
        // A v1 memory cgroup cannot hold a task limit: the replica gets a pids cgroup as
        // well (host programs; a container's limit is the engine's).
        spec.pids_cgroup_base = match (self.cgroups.base(), self.pids.v1_base()) {
            (Some((CgroupVersion::V1, _)), Some(pids)) if spec.container.is_none() => Some(pids.to_path_buf()),
            _ => None,
        };
        // cgroup v1: the replicas' CPU group is in a hierarchy of its own (v2: the replica's
        // cgroup is below it already), with a level per project: the group's CPU is shared
        // by the projects, then by each project's replicas.
        spec.cpu_cgroup = self.cpu.v1_group().filter(|_| spec.container.is_none()).map(|g| g.join(crate::cgroup::cpu_share_name(spec.run_as.map(|r| r.uid))));
        shim::write_spec(&run_dir, &spec)?;
        let stderr_path = run_dir.join(shim::SHIM_STDERR_FILE);
        let shim_stderr = fsutil::open_append(&stderr_path)?;
        // The watcher thread first, the shim second: a thread that cannot be created
        // leaves nothing started (no shim runs, the run directory stays launchable), while
        // a shim without a watcher would run unreported.
        let (hand_over, handed) = mpsc::sync_channel::<(Claim, ShimChild)>(1);
        let watcher = thread::Builder::new().name(watcher_name(&run_dir)).spawn(move || {
            // Nothing arrives when the shim could not be started.
            if let Ok((claim, child)) = handed.recv() {
                watch_spawned(run, claim, child, sink);
            }
        });
        if let Err(source) = watcher {
            return Err(BackendError::Thread { run_dir, source });
        }
        // On failure nothing was started (spawn or exec failed, the child is gone); the
        // watcher ends when `hand_over` is dropped.
        let child = self
            .start_shim(&run_dir, &shim_stderr)
            .map_err(|source| BackendError::SpawnShim { program: program.clone(), run_dir: run_dir.clone(), source })?;
        drop(shim_stderr);
        let shim_pid = child.pid;
        if hand_over.send((claim, child)).is_err() {
            // The watcher is gone (it cannot be, short of a panic): nobody would report
            // on the shim, so let it stop the program and record the outcome.
            let _ = signal::kill(shim_pid, Signal::SIGTERM);
            return Err(BackendError::Thread { run_dir, source: io::Error::other("the watcher thread ended before the shim started") });
        }
        Ok(())
    }

    /// Starts a shim for `run_dir`: forked by the fork server, or, when there is none to
    /// be had, spawned. Its stdout is a pipe to us (the `started` line), its stderr
    /// `stderr`. An error means no shim runs.
    fn start_shim(&self, run_dir: &Path, stderr: &File) -> io::Result<ShimChild> {
        let (stdout_read, stdout_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (pid, forked) = match self.fork_server.fork(run_dir, &stdout_write, stderr) {
            Some(forked) => {
                let forked = forked?;
                (forked.pid, Some(forked))
            }
            None => (spawn_shim(&self.shim_command, run_dir, &stdout_write, stderr)?, None),
        };
        // Our copy of the write end goes, so that the read end sees EOF when the shim exits.
        drop(stdout_write);
        Ok(ShimChild { pid, stdout: Some(File::from(stdout_read)), forked })
    }

    /// Watches a run launched by an earlier server process: `Started` if the program
    /// started, then `Exited` once its shim is gone (or at once if it already is).
    pub fn adopt(&self, run: RunId, run_dir: &Path, sink: EventSink) -> Result<(), BackendError> {
        let run_dir = std::path::absolute(run_dir).at("resolve", run_dir)?;
        let Some(claim) = self.claim(&run_dir) else {
            // Watched already (the server took its state again from the store, e.g. after
            // a store outage): its watcher reports the end; say again that it started, in
            // case that report was lost meanwhile (a repeat changes nothing).
            send_started(&run, &run_dir, &sink);
            return Ok(());
        };
        match probe_lock(&run_dir)? {
            LockState::Held => self.watch(claim, move |claim| watch_adopted(run, claim, sink)),
            // L23: no shim holds the run. A run a shim started (its status or pid file:
            // a shim writes the pid file right after taking the lock) is reported from
            // what it left; one that none started (launched by a server that died before
            // the fork server's supervisor took the lock, which may still come or never)
            // is started again in this directory, where the lock and the pid file let one
            // shim only run the program. `launch` does both; reported lost, such a run
            // would be restarted in a new directory (L10) and might run twice.
            LockState::Free | LockState::Missing => match shim::read_spec(&run_dir) {
                Ok(Some(spec)) => {
                    drop(claim);
                    self.launch(run, &run_dir, spec, sink)
                }
                _ => self.watch(claim, move |claim| finish(run, claim, sink, false, None)),
            },
        }
    }

    /// What a stop or a kill finds in a run directory: waits (at most
    /// `STOP_WAIT_FOR_SHIM`) for a shim that this backend is starting to take its lock.
    fn find_shim(&self, run_dir: &Path) -> Result<Found, BackendError> {
        let deadline = Instant::now() + STOP_WAIT_FOR_SHIM;
        loop {
            if run_dir.join(shim::STATUS_FILE).exists() {
                return Ok(Found::Ended);
            }
            match probe_lock(run_dir)? {
                LockState::Held => {
                    // The lock holder is the shim that wrote this pid file (a shim never
                    // runs where another one's pid file exists), so the pid is not a
                    // reused one while the lock is held.
                    if let Some(pid) = read_pid(run_dir)? {
                        return Ok(Found::Shim(pid));
                    }
                    // Locked but the pid not yet written: the shim is starting.
                }
                LockState::Free | LockState::Missing => {
                    if !self.is_watched(run_dir) {
                        return Ok(Found::NoShim);
                    }
                    // We launched it and its shim has not taken the lock yet, or its
                    // watcher is reporting on it right now.
                }
            }
            if Instant::now() >= deadline {
                return Err(BackendError::StopTimeout { run_dir: run_dir.to_path_buf(), bound: STOP_WAIT_FOR_SHIM });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asks a run's shim to stop it: SIGTERM to the shim, which sends SIGTERM to the
    /// program's process group and SIGKILL after the spec's grace period, so the stop
    /// completes even if this server dies meanwhile. A run that has ended (or never had
    /// a live shim) is left as it is. The `Exited` event comes from the run's watcher.
    pub fn stop(&self, run_dir: &Path) -> Result<(), BackendError> {
        let run_dir = std::path::absolute(run_dir).at("resolve", run_dir)?;
        match self.find_shim(&run_dir)? {
            Found::Shim(pid) => match signal::kill(Pid::from_raw(pid), Signal::SIGTERM) {
                // ESRCH: it exited just now.
                Ok(()) | Err(Errno::ESRCH) => Ok(()),
                Err(e) => Err(BackendError::Signal { pid, run_dir, source: e.into() }),
            },
            Found::Ended | Found::NoShim => Ok(()),
        }
    }

    /// Sends `signal` to the run's shim, which passes it to the program's process group
    /// (or its container); a run that has ended is left alone.
    pub fn signal(&self, run_dir: &Path, signal: i32) -> Result<(), BackendError> {
        let run_dir = std::path::absolute(run_dir).at("resolve", run_dir)?;
        let sig = Signal::try_from(signal).map_err(|e| BackendError::Signal { pid: 0, run_dir: run_dir.clone(), source: e.into() })?;
        match self.find_shim(&run_dir)? {
            Found::Shim(pid) => match signal::kill(Pid::from_raw(pid), sig) {
                Ok(()) | Err(Errno::ESRCH) => Ok(()),
                Err(e) => Err(BackendError::Signal { pid, run_dir, source: e.into() }),
            },
            Found::Ended | Found::NoShim => Ok(()),
        }
    }

    /// Kills a run now, without the shim's cooperation (the escalation after a `stop`
    /// that was not honoured in time: a shim stopped by SIGSTOP keeps its SIGTERM
    /// pending for ever). While the shim holds the run's lock (so its pid file names it,
    /// not a reused pid): SIGKILL of the program's process group (while the program is
    /// provably the shim's child), of every child of the shim (the program and the
    /// orphans it adopted as subreaper, until none is left alive), of the shim itself,
    /// then of everything in the replica's cgroup (L20). A run that has ended is left
    /// alone. A run whose shim is gone without an outcome only has its cgroup emptied.
    /// The `Exited` event comes from the run's watcher: `Lost`, or the outcome the shim
    /// recorded just before.
    pub fn kill(&self, run_dir: &Path) -> Result<(), BackendError> {
        let run_dir = std::path::absolute(run_dir).at("resolve", run_dir)?;
        match self.find_shim(&run_dir)? {
            Found::Ended => {}
            Found::Shim(pid) => {
                remove_container(&run_dir);
                kill_replica(&run_dir, pid)?;
                if !self.is_watched(&run_dir) {
                    // No watcher of this server cleans up after the shim (a run of a
                    // quarantined job): once the shim is gone, its cgroup goes too (L20).
                    let gone = Instant::now() + STOP_WAIT_FOR_SHIM;
                    while probe_lock(&run_dir)? == LockState::Held && Instant::now() < gone {
                        thread::sleep(Duration::from_millis(10));
                    }
                    clean_up_lost(&run_dir);
                }
            }
            Found::NoShim => clean_up_lost(&run_dir),
        }
        Ok(())
    }

    fn watch(&self, claim: Claim, f: impl FnOnce(Claim) + Send + 'static) -> Result<(), BackendError> {
        let run_dir = claim.run_dir.clone();
        // On failure the closure, and with it the claim, is dropped.
        thread::Builder::new()
            .name(watcher_name(&run_dir))
            .spawn(move || f(claim))
            .map(|_| ())
            .map_err(|source| BackendError::Thread { run_dir, source })
    }
}

fn watcher_name(run_dir: &Path) -> String {
    format!("watch-{}", run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

fn read_pid(run_dir: &Path) -> Result<Option<libc::pid_t>, FileError> {
    let path = run_dir.join(shim::PID_FILE);
    Ok(fsutil::read_optional(&path)?
        .and_then(|b| String::from_utf8_lossy(&b).trim().parse::<libc::pid_t>().ok())
        .filter(|&pid| pid > 0))
}

fn send_started(run: &RunId, run_dir: &Path, sink: &EventSink) -> bool {
    match shim::read_started(run_dir) {
        Ok(Some(started)) => {
            sink(BackendEvent::Started { run: run.clone(), pid: started.pid });
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(%run, "{e}");
            false
        }
    }
}

/// A shim this process started: its pid and the read end of its stdout. Dropping it
/// neither kills nor reaps the shim; its watcher waits for it with [`ShimChild::wait`].
struct ShimChild {
    pid: Pid,
    stdout: Option<File>,
    /// Forked by the fork server, which reports its end; else our own child.
    forked: Option<forkserver::Forked>,
}

impl ShimChild {
    /// Blocks until the shim exits (and reaps it, if it is our child). `None`: it ended,
    /// its status unknown (its fork server went first).
    fn wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(f) = &self.forked {
            return Ok(match f.exit.recv() {
                Ok(status) => Some(status),
                Err(_) => {
                    match &f.pidfd {
                        Some(pidfd) => forkserver::wait_pidfd(pidfd),
                        None => tracing::warn!(pid = self.pid.as_raw(), "the fork server is gone; waiting for the shim by its lock"),
                    }
                    None
                }
            });
        }
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes only into our status variable. (nix's waitpid cannot
            // decode a death by a real-time signal.)
            let r = unsafe { libc::waitpid(self.pid.as_raw(), &mut status, 0) };
            if r == self.pid.as_raw() {
                return Ok(Some(ExitStatus::from_raw(status)));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Starts `command` + `run_dir` as a shim with `posix_spawnp`: the child is made with
/// vfork semantics and exec'd at once, so nothing of this (multi-threaded, possibly
/// large) process's memory map is copied, as a fork would, stalling its other threads
/// meanwhile; 8 replicas of a gang start from 8 threads at once. The shim is detached as
/// [`forkserver::spawn_detached`] says; stdin is /dev/null, stdout a pipe to us (the `started` line),
/// stderr `stderr`. Returns once the shim was exec'd; an error means no shim runs.
fn spawn_shim(command: &[OsString], run_dir: &Path, stdout: &OwnedFd, stderr: &File) -> io::Result<Pid> {
    let argv: Vec<OsString> = command.iter().cloned().chain([run_dir.as_os_str().to_owned()]).collect();
    let null = File::open("/dev/null")?;
    forkserver::spawn_detached(&argv, [null.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()])
}

/// For a shim this process spawned: its `started` line, then its exit.
fn watch_spawned(run: RunId, claim: Claim, mut child: ShimChild, sink: EventSink) {
    let mut started_sent = false;
    if let Some(stdout) = child.stdout.take() {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.trim_end() == shim::STARTED_LINE => {
                    started_sent = send_started(&run, &claim.run_dir, &sink);
                    break;
                }
                Ok(_) => {}
            }
        }
    }
    let exit = match child.wait() {
        Ok(Some(status)) => status,
        Ok(None) => {
            // Its fork server went first: the shim has ended (or, where the kernel has no
            // pidfd, holds its lock until it does).
            if let Err(e) = wait_for_shim_exit(&claim.run_dir) {
                tracing::error!(%run, "{e}");
            }
            finish(run, claim, sink, started_sent, None);
            return;
        }
        Err(e) => {
            tracing::error!(%run, "cannot wait for the shim: {e}");
            if let Err(e) = wait_for_shim_exit(&claim.run_dir) {
                tracing::error!(%run, "{e}");
            }
            finish(run, claim, sink, started_sent, Some(format!("cannot wait for the shim: {e}")));
            return;
        }
    };
    if exit.code() == Some(shim::EXIT_ALREADY_RUNNING) {
        // Another shim owns the run (started by an earlier server): wait for that one.
        if let Err(e) = wait_for_shim_exit(&claim.run_dir) {
            tracing::error!(%run, "{e}");
        }
    }
    let described = match (exit.code(), exit.signal()) {
        (Some(code), _) => format!("the shim exited with status {code}"),
        (None, Some(sig)) => format!("the shim was killed by signal {sig}"),
        _ => "the shim ended".to_string(),
    };
    finish(run, claim, sink, started_sent, Some(described));
}

/// For a shim started by an earlier server: `Started` now if the program runs, then the
/// blocking wait on the shim's lock.
fn watch_adopted(run: RunId, claim: Claim, sink: EventSink) {
    let started_sent = send_started(&run, &claim.run_dir, &sink);
    if let Err(e) = wait_for_shim_exit(&claim.run_dir) {
        tracing::error!(%run, "{e}");
    }
    finish(run, claim, sink, started_sent, None);
}

/// The shim is gone: report the outcome it recorded, or `Lost` (and kill what is left
/// in the replica's cgroup) if it recorded none.
fn finish(run: RunId, claim: Claim, sink: EventSink, started_sent: bool, shim_exit: Option<String>) {
    let run_dir = claim.run_dir.clone();
    let outcome = match shim::read_status(&run_dir) {
        Ok(Some(status)) => {
            // A shim killed right after it recorded the outcome (a kill racing the
            // program's end) may not have removed its cgroups: they go now (L20).
            if let Some(spec) = spec_of(&run_dir) {
                remove_cgroups_of(&spec, &run_dir);
            }
            outcome_from_status(&status)
        }
        Ok(None) => {
            clean_up_lost(&run_dir);
            let how = shim_exit.map(|s| format!(" ({s})")).unwrap_or_default();
            Outcome::Lost { message: format!("the replica's supervisor ended without recording an outcome{how}") }
        }
        Err(e) => Outcome::Lost { message: e.to_string() },
    };
    let ran = !matches!(outcome, Outcome::StartError { .. } | Outcome::LaunchFailed { .. });
    if ran && !started_sent {
        send_started(&run, &run_dir, &sink);
    }
    let stderr_tail = log::stderr_tail(&run_dir, STDERR_TAIL_LINES).unwrap_or_else(|e| {
        tracing::warn!(%run, "{e}");
        Vec::new()
    });
    // Released before reporting, so that a launch prompted by this event reads the
    // status afresh instead of being taken for a duplicate.
    drop(claim);
    sink(BackendEvent::Exited { run, outcome, stderr_tail });
}

/// A shim that died without a status may have left its program running in the replica's
/// cgroup: kill it there (L20). Without a cgroup nothing can be killed safely (the
/// program's pid may have been reused). Also what `kill` does once the shim is gone.
fn clean_up_lost(run_dir: &Path) {
    let Some(spec) = spec_of(run_dir) else { return };
    remove_container_of(&spec, run_dir);
    remove_cgroups_of(&spec, run_dir);
}

/// The replica's spec, read once for a clean-up; None when there is none (an error is
/// logged).
fn spec_of(run_dir: &Path) -> Option<ShimSpec> {
    shim::read_spec(run_dir).unwrap_or_else(|e| {
        tracing::warn!(run_dir = %run_dir.display(), "{e}");
        None
    })
}

/// The replica's cgroups, if any are left once its shim is gone: whatever is in them is
/// killed (L20) and they are removed, the memory cgroup first (it holds every process of
/// the replica), then the v1 pids and CPU cgroups, empty by then.
fn remove_cgroups_of(spec: &ShimSpec, run_dir: &Path) {
    if let Some(cg) = replica_cgroup_of(spec) {
        if let Err(e) = cg.kill_and_remove() {
            tracing::warn!(run_dir = %run_dir.display(), "killing and removing the replica's cgroup: {e}");
        }
    }
    for (cg, what) in [(side_cgroup_of(spec, spec.pids_cgroup_base.as_deref()), "pids"), (side_cgroup_of(spec, spec.cpu_cgroup.as_deref()), "CPU")] {
        if let Some(Err(e)) = cg.map(|cg| cg.remove()) {
            tracing::warn!(run_dir = %run_dir.display(), "removing the replica's {what} cgroup: {e}");
        }
    }
    if let Some(share) = &spec.cpu_cgroup {
        V1Cgroup::remove_share_if_idle(share);
    }
}

/// A run in a container: the container removed with everything in it (L20), by the
/// engine, before its cgroup is killed (which would leave the engine's records of a
/// container whose processes are gone).
fn remove_container(run_dir: &Path) {
    if let Some(spec) = spec_of(run_dir) {
        remove_container_of(&spec, run_dir);
    }
}

fn remove_container_of(spec: &ShimSpec, run_dir: &Path) {
    if let Some(c) = &spec.container {
        if let Err(e) = c.engine.remove(&c.name) {
            tracing::warn!(run_dir = %run_dir.display(), "removing the container {}: {e}", c.name);
        }
    }
}

/// The replica's cgroup, as its spec names it, if it exists.
fn replica_cgroup(run_dir: &Path) -> Result<Option<ReplicaCgroup>, ShimError> {
    Ok(shim::read_spec(run_dir)?.as_ref().and_then(replica_cgroup_of))
}

fn replica_cgroup_of(spec: &ShimSpec) -> Option<ReplicaCgroup> {
    let (Some(base), Some(version)) = (&spec.cgroup_base, spec.cgroup_version) else { return None };
    let version = CgroupVersion::from_number(version).ok()?;
    let path = base.join(&spec.cgroup_name);
    (!spec.cgroup_name.is_empty() && path.is_dir()).then(|| ReplicaCgroup::open(version, path))
}

/// The replica's cgroup v1 pids or CPU cgroup below `base`, as its spec names it, if it
/// exists.
fn side_cgroup_of(spec: &ShimSpec, base: Option<&Path>) -> Option<V1Cgroup> {
    let path = base?.join(&spec.cgroup_name);
    (!spec.cgroup_name.is_empty() && !spec.cgroup_name.contains('/') && path.is_dir()).then(|| V1Cgroup::open(path))
}

/// How long `kill` goes on killing the children of a shim that keep appearing (orphans
/// reparented to it) before it kills the shim itself.
const KILL_CHILDREN_BOUND: Duration = Duration::from_secs(2);

/// `kill` of a run whose shim (pid `shim_pid`) holds the run's lock: see
/// [`LocalBackend::kill`]. The program and the shim's other children go first, while the
/// shim is there to hold them: a child of the shim cannot have had its pid reused (the
/// shim has not reaped it), and an orphan of the program is reparented to the shim (a
/// subreaper), even when the shim is stopped. The shim needs no SIGCONT for SIGKILL.
fn kill_replica(run_dir: &Path, shim_pid: libc::pid_t) -> Result<(), BackendError> {
    let program = shim::read_started(run_dir).ok().flatten().and_then(|s| libc::pid_t::try_from(s.pid).ok());
    let cgroup = replica_cgroup(run_dir).unwrap_or_else(|e| {
        tracing::warn!(run_dir = %run_dir.display(), "{e}");
        None
    });
    let deadline = Instant::now() + KILL_CHILDREN_BOUND;
    loop {
        let children = crate::procfs::children_with_state(shim_pid);
        if let Some(program) = program.filter(|p| children.iter().any(|(c, _)| c == p)) {
            // The program's process group (the program leads it: the shim gave it its
            // own), with whatever of its tree is still in it.
            let _ = signal::killpg(Pid::from_raw(program), Signal::SIGKILL);
        }
        let alive: Vec<libc::pid_t> = children.iter().filter(|(_, st)| *st != 'Z' && *st != 'X').map(|(p, _)| *p).collect();
        for &child in &alive {
            let _ = signal::kill(Pid::from_raw(child), Signal::SIGKILL);
        }
        if let Some(cg) = &cgroup {
            if let Err(e) = cg.kill_pass() {
                tracing::warn!(run_dir = %run_dir.display(), "{e}");
            }
        }
        if alive.is_empty() || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    match signal::kill(Pid::from_raw(shim_pid), Signal::SIGKILL) {
        // ESRCH: it exited just now.
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => return Err(BackendError::Signal { pid: shim_pid, run_dir: run_dir.to_path_buf(), source: e.into() }),
    }
    // Anything that forked meanwhile, or left the program's group and was not the
    // shim's child (L20).
    if let Some(cg) = &cgroup {
        if let Err(e) = cg.kill_all() {
            tracing::warn!(run_dir = %run_dir.display(), "killing the replica's cgroup: {e}");
        }
    }
    Ok(())
}

impl crate::seam::Backend for LocalBackend {
    fn launch(&self, runs: Vec<crate::seam::Launch>, sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)> {
        // L6: each replica's shim is started on its own thread, so that no replica waits
        // for another's fork and exec.
        if runs.len() == 1 {
            return runs
                .into_iter()
                .map(|l| {
                    let r = LocalBackend::launch(self, l.run.clone(), &l.run_dir, l.spec, sink.clone());
                    (l.run, r)
                })
                .collect();
        }
        // A launch thread that cannot be created (no threads left) launches its run on
        // this thread instead, so that every run gets an answer.
        std::thread::scope(|scope| {
            let launches: Vec<_> = runs
                .into_iter()
                .map(|l| {
                    let run = l.run.clone();
                    let (again, sink2) = (l.clone(), sink.clone());
                    let spawned = thread::Builder::new()
                        .name("launch".into())
                        .spawn_scoped(scope, move || LocalBackend::launch(self, l.run, &l.run_dir, l.spec, sink2));
                    match spawned {
                        Ok(handle) => (run, Ok(handle)),
                        Err(_) => (run, Err(again)),
                    }
                })
                .collect();
            launches
                .into_iter()
                .map(|(run, launch)| {
                    let r = match launch {
                        Ok(handle) => handle.join().unwrap_or_else(|_| {
                            Err(BackendError::Thread {
                                run_dir: PathBuf::new(),
                                source: io::Error::other("the launch thread panicked"),
                            })
                        }),
                        Err(l) => LocalBackend::launch(self, l.run, &l.run_dir, l.spec, sink.clone()),
                    };
                    (run, r)
                })
                .collect()
        })
    }

    fn adopt(&self, run: RunId, run_dir: PathBuf, sink: EventSink) -> Result<(), BackendError> {
        LocalBackend::adopt(self, run, &run_dir, sink)
    }

    fn stop(&self, _run: &RunId, run_dir: PathBuf) -> Result<(), BackendError> {
        LocalBackend::stop(self, &run_dir)
    }

    fn kill(&self, _run: &RunId, run_dir: PathBuf) -> Result<(), BackendError> {
        LocalBackend::kill(self, &run_dir)
    }

    fn signal(&self, _run: &RunId, run_dir: PathBuf, signal: i32) -> Result<(), BackendError> {
        LocalBackend::signal(self, &run_dir, signal)
    }

    fn describe(&self) -> String {
        let memory = match self.cgroups().base() {
            Some((v, base)) => format!("local processes; memory limits through cgroup v{} under {}", v.number(), base.display()),
            None => "local processes; no writable memory cgroup: no memory limits, OOM kills reported as unknown".to_string(),
        };
        let tasks = match &self.pids {
            PidsSupport::V1 { base } => {
                format!("task limits (pids_max) per replica through the cgroup v1 pids hierarchy under {}", base.display())
            }
            PidsSupport::V2 => "task limits (pids_max) per replica through pids.max of its cgroup".to_string(),
            PidsSupport::Unavailable { reason } => format!(
                "task limits (pids_max) through RLIMIT_NPROC of the replica's uid, shared by all running replicas of a \
                 project, and none for replicas that run as the server's user (no pids cgroup: {reason})"
            ),
        };
        format!("{memory}; {tasks}; {}", self.cpu.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(exit_code: Option<i32>, signal: Option<i32>, oom_kills: Option<u64>) -> ShimStatus {
        ShimStatus { exit_code, signal, oom_kills, start_error: None, launch_error: None, ended_micros: 0 }
    }

    /// L14: OOM only from the cgroup's counter, never from status 137 alone.
    #[test]
    fn l14_oom_comes_from_the_counter_not_from_137() {
        assert_eq!(outcome_from_status(&status(None, Some(9), Some(1))), Outcome::OomKilled { status: 137 });
        assert_eq!(outcome_from_status(&status(None, Some(9), Some(0))), Outcome::Signaled { signal: 9 });
        assert_eq!(outcome_from_status(&status(None, Some(9), None)), Outcome::Signaled { signal: 9 });
        assert_eq!(outcome_from_status(&status(Some(137), None, None)), Outcome::Exited { code: 137 });
        assert_eq!(outcome_from_status(&status(Some(1), None, Some(2))), Outcome::OomKilled { status: 1 });
        // A helper was OOM-killed but the program recovered and succeeded.
        assert_eq!(outcome_from_status(&status(Some(0), None, Some(1))), Outcome::Exited { code: 0 });
    }

    #[test]
    fn start_and_launch_errors_win() {
        let mut s = status(None, None, None);
        s.start_error = Some("cannot start \"x\"".into());
        assert!(matches!(outcome_from_status(&s), Outcome::StartError { .. }));
        s.start_error = None;
        s.launch_error = Some("cgroup".into());
        assert!(matches!(outcome_from_status(&s), Outcome::LaunchFailed { .. }));
        assert!(matches!(outcome_from_status(&status(None, None, None)), Outcome::Lost { .. }));
    }

    /// L16: running out of a resource of the host at launch is retryable, never a
    /// launch failure; other errors stay what they are.
    #[test]
    fn l16_exhaustion_at_launch_is_retryable() {
        for (errno, resource) in [
            (libc::EMFILE, "file descriptors"),
            (libc::ENFILE, "file descriptors"),
            (libc::EAGAIN, "processes or threads"),
            (libc::ENOMEM, "memory"),
            (libc::ENOSPC, "disk space"),
        ] {
            let spawn = BackendError::SpawnShim {
                program: "trainyard".into(),
                run_dir: PathBuf::from("/r"),
                source: io::Error::from_raw_os_error(errno),
            };
            let file = BackendError::Shim(ShimError::File(FileError {
                op: "create",
                path: PathBuf::from("/r/spec.json.tmp"),
                source: io::Error::from_raw_os_error(errno),
            }));
            let thread = BackendError::Thread { run_dir: PathBuf::from("/r"), source: io::Error::from_raw_os_error(errno) };
            for e in [spawn, file, thread] {
                assert!(!e.is_retryable());
                let e = e.classify_exhaustion();
                assert!(e.is_retryable(), "{e}");
                match &e {
                    BackendError::Exhausted { resource: r, message } => {
                        assert!(r.starts_with(resource), "{r}");
                        assert!(message.contains("/r"), "the message keeps its context: {message}");
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        let not_found = BackendError::SpawnShim {
            program: "trainyard".into(),
            run_dir: PathBuf::from("/r"),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert!(!not_found.classify_exhaustion().is_retryable());
        assert!(BackendError::Unavailable { engine: "slurm".into(), message: "down".into() }.is_retryable());
        assert!(!BackendError::NoShimCommand.classify_exhaustion().is_retryable());
    }

    #[test]
    fn cgroup_names() {
        let run = RunId { job: 12, attempt: 0, replica: "workerpool0-0".into(), restart: 0 };
        let a = cgroup_name(&run, Path::new("/data/a/runs/12/0/workerpool0-0/0"));
        let b = cgroup_name(&run, Path::new("/data/b/runs/12/0/workerpool0-0/0"));
        assert!(a.starts_with("j12-a0-workerpool0-0-r0-") && a.len() == "j12-a0-workerpool0-0-r0-".len() + 8, "{a}");
        assert_ne!(a, b);
        assert_eq!(a, cgroup_name(&run, Path::new("/data/a/runs/12/0/workerpool0-0/0")));
    }
}
