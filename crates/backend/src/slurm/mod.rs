//! The Slurm backend: every replica run is the same shim as on the local backend
//! ([`crate::shim`]), but started by Slurm as a batch job:
//!
//! ```text
//! sbatch --parsable --no-requeue --job-name=ty-<job>-<attempt>-<replica>-<restart>
//!        --partition=P --mem=<MB> --cpus-per-task=N [--gres=gpu:K] [--time=M]
//!        --chdir=<run_dir> --output=<run_dir>/slurm.out --open-mode=append
//!        --wrap 'exec <trainyard> shim <run_dir>'
//! ```
//!
//! The run directory must be on a file system that every node sees at the same path (on
//! the development cluster all nodes are this host). The shim writes `started.json`,
//! `log.jsonl` and `status.json` there exactly as it does locally; Slurm supplies the
//! memory cgroup (`--mem`, `ConstrainRAMSpace=yes`), so the shim runs without a cgroup of
//! its own (`cgroup_base: None`) and the OOM verdict comes from Slurm's `OUT_OF_MEMORY`
//! state (L14).
//!
//! **Gangs.** A `launch` of the first runs of two or more replicas of one attempt (L6) is
//! one allocation holding them all, a job step per replica: see [`gang`]. A job of one
//! replica, and a replica restarted when its gang's allocation is gone, is one Slurm job of
//! its own as above. A heterogeneous job (`sbatch [comp 0] : [comp 1] ...`) would fit each
//! pool's shape, but was measured on Slurm 22.05.8 not to fit: only the backfill scheduler
//! starts hetjobs (a 3 x 1-CPU hetjob on idle nodes started after 16-17 s, a plain job after
//! 0.7 s); a signal to one component reached every component; and an OOM-killed step left
//! its component COMPLETED with only `derived_exit_code` 253. A gang is therefore one
//! homogeneous allocation of the largest replica's shape, its steps signalled one by one,
//! and a step's OOM read by the shim from the step's cgroup.
//!
//! **Submission.** `launch` does only file-system work on the caller's thread: it writes
//! the spec and, durably, `slurm.json` with the job's name and no id ("recorded"), queues
//! the run for the submitter thread and returns. The submitter runs `sbatch` for each
//! queued run, in order; a refusal ends the run `LaunchFailed` through the sink (L16) and
//! removes `slurm.json`. While the controller cannot be reached (`sbatch` itself takes
//! about 9 s to say so) every queued run waits, and after 2 s, doubling up to 30 s, the
//! submitter tries again, one run at a time, for as long as it takes: the runs stay
//! launching (their jobs PENDING), and [`Backend::waiting_reason`] says why (also while a
//! command has hung for 3 s before it failed). Before every try after the first it
//! looks the job up in `squeue` by its output path (unique per run), so that a try that
//! timed out but went through is adopted, not submitted again. A run stopped before it
//! was submitted ends `Signaled 15` without reaching Slurm (or, if a try may have gone
//! through, once its job could be looked up and cancelled).
//!
//! **Durability (L23).** Once its `sbatch` answered, the job id is written to
//! `slurm.json`, durably, before the run is watched. A run whose `slurm.json` holds an id
//! is never submitted again: it is adopted. A `slurm.json` without an id (the server died
//! before or during `sbatch`) goes back to the submitter, which looks the job up in
//! `squeue` by its output path first and submits only if Slurm does not have it and the
//! shim never ran there; and the shim itself refuses to run twice in one run directory.
//!
//! **Watching.** One thread per backend. Every 50 ms it looks at the watched runs' files
//! (`started.json` → `Started`; `status.json` → time to ask Slurm), and every
//! `poll_interval` (or at once when a `status.json` appeared) it runs `squeue --json`,
//! which ignores `-j` in 22.05: the jobs are filtered by id here, and only the fields
//! needed are parsed. A run is reported `Exited` once its job left the running states
//! (see [`outcome_for`] for the mapping). `squeue` failing (slurmctld down) is not a
//! failure of the runs: the watcher keeps polling and logs it; output that cannot be
//! parsed for 10 s in a row ends every watched run as `LaunchFailed` (L16) after
//! cancelling its job, so that nothing keeps running unwatched.
//!
//! **Stop.** `scancel --signal=TERM --full <id>` (the shim gets SIGTERM and stops the
//! program with the spec's grace period itself), then after the grace period plus a
//! second `scancel <id>` as a backstop (Slurm's KillWait does the SIGKILL). A pending job
//! is cancelled at once. Idempotent: cancelling an ended job does nothing.
//!
//! **Kill.** The escalation when a stop was not honoured (the shim cannot be relied on):
//! `scancel --signal=KILL --full <id>` (SIGKILL to the batch shell, the shim and every
//! step), then `scancel <id>`, which ends the job and lets Slurm's cgroup take whatever is
//! left (L20). A run not submitted yet ends as on a stop; an ended job is left alone.
//!
//! **Resources.** `--mem` from the spec's memory limit (L14, in MiB, rounded up);
//! `--cpus-per-task`, `--gres=gpu:K` and `--time` from the spec's `resources` (the
//! replica's vCPUs, accelerator and the job's timeout, set by the driver); a spec without
//! them (written by an older server) falls back to the job spec that the program's
//! `CLUSTER_SPEC` carries, with the built-in machine-type catalog. GPU jobs go to
//! `gpu_partition`. `--time` only when the job sets `scheduling.timeout`: that timeout
//! plus the grace period plus a minute,
//! rounded up to minutes, so that Trainyard's own L19 deadline always comes first and
//! Slurm's limit is only a backstop for a server that is down. With `fit_to_nodes`,
//! requests larger than the partition's largest node are reduced to it (development
//! clusters with small nodes); otherwise Slurm refuses them and the launch fails.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use trainyard_core::{Outcome, RunId};

mod command;
mod gang;
mod parse;
mod request;
pub mod session;
mod submit;
mod watch;

use command::*;
pub use parse::*;
pub use request::*;
use submit::*;
use watch::*;

use crate::fsutil;
use crate::local::{outcome_from_status, STDERR_TAIL_LINES};
use crate::{lock, log};
use crate::seam::{Backend, BackendError, BackendEvent, EventSink, Launch};
use crate::shim::{self, ShimSpec, ShimStatus};

/// `<run_dir>/slurm.json`: the Slurm job of the run.
pub const SLURM_FILE: &str = "slurm.json";
/// `<run_dir>/slurm.out`: the batch job's own stdout/stderr (Slurm's and the shim's).
pub const SLURM_OUT_FILE: &str = "slurm.out";

/// How often the watcher looks at run files.
const FILE_TICK: Duration = Duration::from_millis(50);
/// A `status.json` was seen but Slurm still shows the job running: report from the
/// status after this long anyway.
const STATUS_WITHOUT_END: Duration = Duration::from_secs(10);
/// A watched job missing from `squeue` (purged, or the controller lost its state).
const MISSING_BOUND: Duration = Duration::from_secs(10);
/// `squeue` output that cannot be parsed for this long ends the watched runs (L16).
const UNPARSEABLE_BOUND: Duration = Duration::from_secs(10);
/// A Slurm command of the submitter running this long makes a waiting reason.
const SLOW_COMMAND: Duration = Duration::from_secs(3);
/// How often the watcher asks `sinfo` for drained nodes while replicas run.
const DRAIN_CHECK: Duration = Duration::from_secs(2);

/// What the server configures for the Slurm backend.
#[derive(Clone, Debug)]
pub struct SlurmOptions {
    pub partition: String,
    /// Where jobs with GPUs go; `None`: `partition`.
    pub gpu_partition: Option<String>,
    /// The program and leading arguments that run a shim, e.g. `[trainyard, "shim"]`.
    pub shim_command: Vec<OsString>,
    /// How often `squeue --json` runs while runs are watched.
    pub poll_interval: Duration,
    /// Reduce CPU and memory requests to the partition's largest node.
    pub fit_to_nodes: bool,
    /// Bound on one Slurm command (sbatch, squeue, scancel, sinfo).
    pub command_timeout: Duration,
}

impl SlurmOptions {
    pub fn new(partition: impl Into<String>, shim_command: Vec<OsString>) -> SlurmOptions {
        SlurmOptions {
            partition: partition.into(),
            gpu_partition: None,
            shim_command,
            poll_interval: Duration::from_millis(500),
            fit_to_nodes: false,
            command_timeout: Duration::from_secs(30),
        }
    }
}

/// The largest node of a partition, from `sinfo --json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSize {
    pub cpus: u32,
    pub memory_mb: u64,
}

/// `<run_dir>/slurm.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJobFile {
    /// `None` while `sbatch` runs (or if the server died during it).
    pub job_id: Option<u64>,
    pub job_name: String,
    #[serde(default)]
    pub submitted_micros: i64,
    /// The run is a replica of a gang (see [`gang`]): its gang's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------
// The backend: its state, shared with the submitter (`submit`) and the watcher (`watch`);
// what Slurm prints is read in `parse`, what a run asks of it made in `request`, its
// commands run by `command`.

struct Watch {
    run: RunId,
    job_id: u64,
    sink: EventSink,
    started_sent: bool,
    status_seen: Option<Instant>,
    missing_since: Option<Instant>,
    stopped: bool,
    /// The node this run was moved off because it was drained (L9).
    drained: Option<String>,
    /// The run is a step of a gang's allocation: the gang's directory.
    gang: Option<PathBuf>,
    /// Stopped (`Some(false)`) or killed (`Some(true)`) before its step was known: the
    /// watcher signals the step once its wrapper recorded it.
    at_step: Option<bool>,
}

/// A run that `launch` recorded (spec and `slurm.json` written) and that the submitter
/// thread has not turned into a Slurm job yet.
struct Submit {
    run: RunId,
    sink: EventSink,
    /// The `sbatch` arguments.
    args: Vec<OsString>,
    name: String,
    /// When it was queued (the submitter goes in this order).
    queued: Instant,
    /// Look the job up in `squeue` (by its output path) before submitting: the marker
    /// comes from an earlier server, or an earlier try failed.
    look_first: bool,
    /// A try may have reached the controller (it timed out), or the marker comes from an
    /// earlier server: a stop must look the job up before it can end the run.
    maybe_submitted: bool,
    stopped: bool,
    /// The submitter is working on it.
    in_flight: bool,
    /// A gang (keyed by its directory): its runs. Empty for a single run.
    members: Vec<(RunId, PathBuf)>,
}

/// What the submitter needs of a [`Submit`] for one try.
struct Try {
    run: RunId,
    sink: EventSink,
    args: Vec<OsString>,
    name: String,
    look_first: bool,
    maybe_submitted: bool,
    stopped: bool,
    members: Vec<(RunId, PathBuf)>,
}

impl Try {
    /// The runs this try submits: the gang's, or the one run (in `dir`).
    fn runs(&self, dir: &Path) -> Vec<(RunId, PathBuf)> {
        if self.members.is_empty() {
            vec![(self.run.clone(), dir.to_path_buf())]
        } else {
            self.members.clone()
        }
    }

    /// Removes the markers of a submission that did not happen.
    fn forget(&self, dir: &Path) {
        for (_, d) in self.runs(dir) {
            let _ = std::fs::remove_file(d.join(SLURM_FILE));
        }
        if !self.members.is_empty() {
            let _ = std::fs::remove_file(dir.join(gang::GANG_FILE));
        }
    }

    fn shim_ran(&self, dir: &Path) -> bool {
        self.runs(dir).iter().any(|(_, d)| shim_ran(d))
    }
}

/// A gang the backend knows of (see [`gang`]).
#[derive(Debug)]
struct GangLive {
    job_id: Option<u64>,
    step_args: Vec<String>,
    /// When its last watched run ended; `None` while one runs (or none was seen yet).
    last_end: Option<Instant>,
}

#[derive(Default)]
struct State {
    watches: HashMap<PathBuf, Watch>,
    /// Runs waiting for (or in) `sbatch`, by run directory.
    submits: HashMap<PathBuf, Submit>,
    /// The controller is unreachable: tries so far, Slurm's message, the delay, and when
    /// the submitter tries again. Shared by every queued run (one probe at a time).
    ctld_tries: u32,
    ctld_error: Option<(String, Duration)>,
    ctld_retry_at: Option<Instant>,
    /// Since when the submitter's current Slurm command runs (to say that it hangs).
    in_flight_since: Option<Instant>,
    /// Backstop cancels: (when, job id or `<job id>.<step id>`).
    kills: Vec<(Instant, String)>,
    /// Gangs, by directory.
    gangs: HashMap<PathBuf, GangLive>,
    /// The last `squeue` view of the watched jobs.
    last: HashMap<u64, SqJob>,
    unparseable_since: Option<Instant>,
}

struct Shared {
    opts: SlurmOptions,
    sizes: HashMap<String, NodeSize>,
    state: Mutex<State>,
    /// Wakes the watcher.
    wake: Condvar,
    /// Wakes the submitter.
    submit_wake: Condvar,
}

/// Runs replicas as Slurm batch jobs; see the module docs.
pub struct SlurmBackend {
    shared: Arc<Shared>,
}

fn slurm_err(command: &str, message: impl Into<String>) -> BackendError {
    BackendError::Slurm { command: command.into(), message: message.into() }
}

/// A JSON record of the backend's (`slurm.json`, `gang.json`): `None` when there is none.
pub(super) fn read_record<T: serde::de::DeserializeOwned>(dir: &Path, file: &str) -> Result<Option<T>, BackendError> {
    let path = dir.join(file);
    match fsutil::read_optional(&path)? {
        None => Ok(None),
        Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| slurm_err(&format!("read {file}"), format!("{}: {e}", path.display()))),
    }
}

/// Writes a JSON record of the backend's durably (write, fsync, rename).
pub(super) fn write_record<T: Serialize>(dir: &Path, file: &str, record: &T) -> Result<(), BackendError> {
    let mut bytes = serde_json::to_vec(record).map_err(|e| slurm_err(&format!("write {file}"), e.to_string()))?;
    bytes.push(b'\n');
    Ok(fsutil::write_atomic(&dir.join(file), &bytes)?)
}

pub fn read_job_file(run_dir: &Path) -> Result<Option<SlurmJobFile>, BackendError> {
    read_record(run_dir, SLURM_FILE)
}

fn write_job_file(run_dir: &Path, f: &SlurmJobFile) -> Result<(), BackendError> {
    write_record(run_dir, SLURM_FILE, f)
}

pub fn job_name(run: &RunId) -> String {
    let replica: String = run.replica.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("ty-{}-{}-{}-{}", run.job, run.attempt, replica, run.restart)
}

/// The delay before try `tries + 1` while the controller is unreachable: the core's rule
/// (`retry::SUBMIT`, L16: 2 s, doubling, at most 30 s).
pub fn submit_backoff(tries: u32) -> Duration {
    Duration::from_micros(trainyard_core::retry::SUBMIT.retry_after(tries).max(0) as u64)
}

/// The waiting reason of a run whose submission waits for the controller.
fn unreachable_reason(message: &str, delay: Duration) -> String {
    format!("the Slurm controller is unreachable ({message}); trying again in {}s", delay.as_secs())
}

/// Looks a run's job up by its output path (unique per run, unlike the job name across
/// servers).
fn find_by_output(opts: &SlurmOptions, run_dir: &Path) -> Result<Option<u64>, String> {
    let out = run_cmd("squeue", &os(&["--json"]), opts.command_timeout)?;
    let (jobs, _) = parse_squeue(&out)?;
    let want = run_dir.join(SLURM_OUT_FILE);
    Ok(jobs.values().filter(|j| Path::new(&j.standard_output) == want).map(|j| j.job_id).max())
}

/// Did the shim run (or start) in this directory?
fn shim_ran(run_dir: &Path) -> bool {
    [shim::STATUS_FILE, shim::STARTED_FILE, shim::PID_FILE].iter().any(|f| run_dir.join(f).exists())
}

/// A run without a Slurm job: reports what its directory holds.
fn report_from_dir(run: &RunId, run_dir: &Path, sink: &EventSink, recorded: bool) {
    let status = shim::read_status(run_dir).ok().flatten();
    let started = run_dir.join(shim::STARTED_FILE).exists();
    let outcome = match &status {
        Some(s) => outcome_from_status(s),
        None if recorded => Outcome::LaunchFailed { message: "the run was never submitted to Slurm".into() },
        None => Outcome::Lost { message: "the run has no Slurm job".into() },
    };
    report_end(run, run_dir, sink, started && status.is_some(), false, outcome);
}

impl SlurmBackend {
    /// The run's absolute directory, or None when the run is not submitted yet: then it
    /// is marked stopped and the submitter ends it (at once if nothing can have reached
    /// Slurm, else once it could look the job up and cancel it).
    fn unless_unsubmitted(&self, run_dir: PathBuf) -> Result<Option<PathBuf>, BackendError> {
        let run_dir = std::path::absolute(&run_dir).map_err(|e| slurm_err("resolve run directory", e.to_string()))?;
        let gang = if lock(&self.shared.state).watches.contains_key(&run_dir) { None } else { read_job_file(&run_dir).ok().flatten().and_then(|f| f.gang) };
        let mut st = lock(&self.shared.state);
        if let Some(g) = gang.filter(|g| st.submits.contains_key(g)) {
            // A gang not submitted yet stops as a whole (see `gang`).
            if gang::read_file(&g).ok().flatten().and_then(|f| f.job_id).is_some() {
                return Ok(Some(run_dir));
            }
            if let Some(s) = st.submits.get_mut(&g) {
                s.stopped = true;
            }
            drop(st);
            self.shared.submit_wake.notify_all();
            return Ok(None);
        }
        if let Some(s) = st.submits.get_mut(&run_dir) {
            // Its job id already written: the submitter is handing it to its watcher, and
            // the job itself is stopped (else the stop could fall between the two).
            if read_job_file(&run_dir).ok().flatten().and_then(|f| f.job_id).is_some() {
                return Ok(Some(run_dir));
            }
            s.stopped = true;
            drop(st);
            self.shared.submit_wake.notify_all();
            return Ok(None);
        }
        Ok(Some(run_dir))
    }

    /// Checks that the partitions exist (`sinfo --json`) and starts the watcher and the
    /// submitter threads. The error names the option (`partition`, `gpu_partition`) that
    /// is wrong.
    pub fn new(opts: SlurmOptions) -> Result<SlurmBackend, BackendError> {
        if opts.shim_command.is_empty() {
            return Err(BackendError::NoShimCommand);
        }
        let out = run_cmd("sinfo", &os(&["--json"]), opts.command_timeout).map_err(|m| slurm_err("sinfo --json", m))?;
        let sizes = partition_sizes(&out).map_err(|m| slurm_err("sinfo --json", m))?;
        for (key, p) in [("partition", Some(&opts.partition)), ("gpu_partition", opts.gpu_partition.as_ref())] {
            if let Some(p) = p {
                if !sizes.contains_key(p) {
                    let mut known: Vec<&String> = sizes.keys().collect();
                    known.sort();
                    return Err(slurm_err(
                        key,
                        format!("partition {p:?} does not exist or has no nodes (partitions: {known:?})"),
                    ));
                }
            }
        }
        let shared = Arc::new(Shared {
            opts,
            sizes,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            submit_wake: Condvar::new(),
        });
        let w = Arc::clone(&shared);
        thread::Builder::new()
            .name("slurm-watch".into())
            .spawn(move || watcher(w))
            .map_err(|source| BackendError::Thread { run_dir: PathBuf::new(), source })?;
        let s = Arc::clone(&shared);
        thread::Builder::new()
            .name("slurm-submit".into())
            .spawn(move || submitter(s))
            .map_err(|source| BackendError::Thread { run_dir: PathBuf::new(), source })?;
        Ok(SlurmBackend { shared })
    }

    fn opts(&self) -> &SlurmOptions {
        &self.shared.opts
    }

    /// The `sbatch` arguments of a run (with `--wrap`).
    pub fn sbatch_args(&self, run: &RunId, run_dir: &Path, spec: &ShimSpec) -> Vec<OsString> {
        sbatch_args(&self.shared.opts, &self.shared.sizes, run, run_dir, spec)
    }

    /// Is the run watched or waiting for the submitter?
    fn known(&self, run_dir: &Path) -> bool {
        let st = lock(&self.shared.state);
        st.watches.contains_key(run_dir) || st.submits.contains_key(run_dir)
    }

    /// Hands a recorded run to the submitter (which the caller wakes).
    fn enqueue(&self, run: RunId, run_dir: PathBuf, sink: EventSink, args: Vec<OsString>, name: String, resumed: bool) {
        let mut st = lock(&self.shared.state);
        st.submits.entry(run_dir).or_insert(Submit {
            run,
            sink,
            args,
            name,
            queued: Instant::now(),
            look_first: resumed,
            maybe_submitted: resumed,
            stopped: false,
            in_flight: false,
            members: Vec::new(),
        });
    }

    /// `launch` of one run: records it durably and queues it for the submitter; only
    /// file-system work happens on the caller's thread.
    fn record(&self, l: Launch, sink: EventSink) -> Result<(), BackendError> {
        let run = l.run;
        let run_dir = std::path::absolute(&l.run_dir).map_err(|e| slurm_err("resolve run directory", e.to_string()))?;
        if self.known(&run_dir) {
            return Ok(());
        }
        let mut spec = l.spec;
        // Slurm's cgroup limits the memory (--mem) and reports OOM kills; the shim reads
        // them from the cgroup Slurm put it in, which for a gang's step is the only place
        // they show (L14).
        spec.cgroup_base = None;
        spec.cgroup_version = None;
        spec.engine_cgroup_oom = true;
        if let Some(f) = read_job_file(&run_dir)? {
            if f.job_id.is_some() || f.gang.is_some() || run_dir.join(shim::STATUS_FILE).exists() {
                return self.adopt_dir(run, run_dir, sink);
            }
            // Recorded by an earlier server that did not learn the job id: the submitter
            // looks the job up before it submits anything.
            let args = self.sbatch_args(&run, &run_dir, &spec);
            self.enqueue(run, run_dir, sink, args, f.job_name, true);
            return Ok(());
        } else if run_dir.join(shim::STATUS_FILE).exists() || run_dir.join(shim::PID_FILE).exists() {
            return self.adopt_dir(run, run_dir, sink);
        }
        std::fs::create_dir_all(&run_dir).map_err(|e| slurm_err("create run directory", format!("{}: {e}", run_dir.display())))?;
        if run.restart > 0 && self.restart_in_gang(&run, &run_dir, &spec, &sink)? {
            return Ok(());
        }
        let args = self.sbatch_args(&run, &run_dir, &spec);
        shim::write_spec(&run_dir, &spec)?;
        let name = job_name(&run);
        write_job_file(&run_dir, &SlurmJobFile { job_id: None, job_name: name.clone(), submitted_micros: fsutil::now_micros(), gang: None })?;
        self.enqueue(run, run_dir, sink, args, name, false);
        Ok(())
    }

    /// `launch` of the first runs of every replica of an attempt: one allocation for the
    /// gang (see [`gang`]). Runs recorded before (a launch repeated after a restart) are
    /// adopted one by one instead.
    fn record_gang(&self, launches: Vec<Launch>, sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)> {
        let mut runs = Vec::with_capacity(launches.len());
        for l in &launches {
            match std::path::absolute(&l.run_dir) {
                Ok(d) => runs.push(d),
                Err(e) => return launches.into_iter().map(|l| (l.run, Err(slurm_err("resolve run directory", e.to_string())))).collect(),
            }
        }
        let seen = runs.iter().any(|d| self.known(d) || d.join(SLURM_FILE).exists() || d.join(shim::STATUS_FILE).exists());
        let gang = gang::dir_of(&runs[0]);
        let gang = match gang {
            Some(g) if !seen && runs.iter().all(|d| gang::dir_of(d).as_ref() == Some(&g)) => g,
            _ => return launches.into_iter().map(|l| (l.run.clone(), self.record(l, sink.clone()))).collect(),
        };
        let ids: Vec<RunId> = launches.iter().map(|l| l.run.clone()).collect();
        let fail = |e: BackendError| -> Vec<(RunId, Result<(), BackendError>)> {
            let m = e.to_string();
            ids.iter().map(|r| (r.clone(), Err(slurm_err("record the gang", m.clone())))).collect()
        };
        let mut members = Vec::with_capacity(launches.len());
        for (l, dir) in launches.into_iter().zip(runs) {
            let mut spec = l.spec;
            spec.cgroup_base = None;
            spec.cgroup_version = None;
            spec.engine_cgroup_oom = true;
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return fail(slurm_err("create run directory", format!("{}: {e}", dir.display())));
            }
            if let Err(e) = shim::write_spec(&dir, &spec) {
                return fail(e.into());
            }
            members.push((l.run, dir, spec));
        }
        if let Err(e) = std::fs::create_dir_all(&gang) {
            return fail(slurm_err("create the gang's directory", format!("{}: {e}", gang.display())));
        }
        let plan = gang::plan(&self.shared.opts, &self.shared.sizes, &gang, &members);
        let file = gang::GangFile {
            job_id: None,
            job_name: plan.name.clone(),
            step_args: plan.step_args.clone(),
            runs: members.iter().map(|m| m.1.clone()).collect(),
        };
        let written = fsutil::write_atomic(&gang.join(gang::SCRIPT_FILE), plan.script.as_bytes())
            .map_err(BackendError::from)
            .and_then(|()| gang::write_file(&gang, &file))
            .and_then(|()| {
                members.iter().try_for_each(|(_, d, _)| {
                    let f = SlurmJobFile { job_id: None, job_name: plan.name.clone(), submitted_micros: fsutil::now_micros(), gang: Some(gang.clone()) };
                    write_job_file(d, &f)
                })
            });
        if let Err(e) = written {
            return fail(e);
        }
        let member_ids: Vec<(RunId, PathBuf)> = members.iter().map(|(r, d, _)| (r.clone(), d.clone())).collect();
        {
            let mut st = lock(&self.shared.state);
            st.gangs.insert(gang.clone(), GangLive { job_id: None, step_args: plan.step_args.clone(), last_end: None });
            st.submits.entry(gang).or_insert(Submit {
                run: member_ids[0].0.clone(),
                sink,
                args: plan.sbatch_args,
                name: plan.name,
                queued: Instant::now(),
                look_first: false,
                maybe_submitted: false,
                stopped: false,
                in_flight: false,
                members: member_ids,
            });
        }
        ids.into_iter().map(|r| (r, Ok(()))).collect()
    }

    /// A restarted replica of a gang (L10) whose allocation runs: a new step in it, by an
    /// `srun` of the server's (see [`gang::start_step`]). `Ok(false)`: the allocation is
    /// not known to run (ended, released, or never seen by this server), and the run is
    /// submitted as a job of its own.
    fn restart_in_gang(&self, run: &RunId, run_dir: &Path, spec: &ShimSpec, sink: &EventSink) -> Result<bool, BackendError> {
        let Some(g) = gang::dir_of(run_dir) else { return Ok(false) };
        let (id, step_args) = {
            let st = lock(&self.shared.state);
            let Some(live) = st.gangs.get(&g) else { return Ok(false) };
            let Some(id) = live.job_id else { return Ok(false) };
            if st.last.get(&id).is_none_or(|j| j.job_state != "RUNNING") {
                return Ok(false);
            }
            (id, live.step_args.clone())
        };
        if g.join(gang::RELEASE_FILE).exists() {
            return Ok(false);
        }
        shim::write_spec(run_dir, spec)?;
        let f = SlurmJobFile { job_id: Some(id), job_name: gang::job_name(run), submitted_micros: fsutil::now_micros(), gang: Some(g.clone()) };
        write_job_file(run_dir, &f)?;
        if let Err(m) = gang::start_step(&self.shared.opts, id, &step_args, run_dir) {
            tracing::warn!(%run, "cannot start a step in allocation {id} ({m}); submitting the replica as a job of its own");
            let _ = std::fs::remove_file(run_dir.join(SLURM_FILE));
            return Ok(false);
        }
        tracing::info!(%run, "restarted in place: a new step in allocation {id}");
        watch(&self.shared, run.clone(), run_dir.to_path_buf(), id, sink.clone(), false, Some(g));
        Ok(true)
    }

    /// A run of a gang recorded by an earlier server: watched if its allocation's id is
    /// known; else its gang's submission is resumed (the submitter looks the allocation up
    /// by its output path first), with every run the gang recorded.
    fn adopt_gang_run(&self, run: RunId, run_dir: PathBuf, sink: EventSink, g: &Path, job_id: Option<u64>) -> Result<(), BackendError> {
        let file = gang::read_file(g)?;
        let id = job_id.or(file.as_ref().and_then(|f| f.job_id));
        {
            let mut st = lock(&self.shared.state);
            if !st.gangs.contains_key(g) {
                let step_args = file.as_ref().map(|f| f.step_args.clone()).unwrap_or_default();
                st.gangs.insert(g.to_path_buf(), GangLive { job_id: id, step_args, last_end: None });
            }
        }
        if let Some(id) = id {
            watch(&self.shared, run, run_dir, id, sink, false, Some(g.to_path_buf()));
            return Ok(());
        }
        let Some(file) = file else {
            report_from_dir(&run, &run_dir, &sink, true);
            return Ok(());
        };
        let specs: Option<Vec<(RunId, PathBuf, ShimSpec)>> = file
            .runs
            .iter()
            .map(|d| Some((run_id_of(d)?, d.clone(), shim::read_spec(d).ok().flatten()?)))
            .collect();
        let Some(specs) = specs else {
            report_from_dir(&run, &run_dir, &sink, true);
            return Ok(());
        };
        let plan = gang::plan(&self.shared.opts, &self.shared.sizes, g, &specs);
        let mut st = lock(&self.shared.state);
        st.submits.entry(g.to_path_buf()).or_insert(Submit {
            run,
            sink,
            args: plan.sbatch_args,
            name: file.job_name,
            queued: Instant::now(),
            look_first: true,
            maybe_submitted: true,
            stopped: false,
            in_flight: false,
            members: specs.into_iter().map(|(r, d, _)| (r, d)).collect(),
        });
        drop(st);
        self.shared.submit_wake.notify_all();
        Ok(())
    }

    fn adopt_dir(&self, run: RunId, run_dir: PathBuf, sink: EventSink) -> Result<(), BackendError> {
        if self.known(&run_dir) {
            return Ok(());
        }
        let Some(file) = read_job_file(&run_dir)? else {
            // Never recorded (or its record is gone): report what the directory holds.
            report_from_dir(&run, &run_dir, &sink, false);
            return Ok(());
        };
        if let Some(g) = &file.gang {
            return self.adopt_gang_run(run, run_dir, sink, g, file.job_id);
        }
        if let Some(id) = file.job_id {
            watch(&self.shared, run, run_dir, id, sink, false, None);
            return Ok(());
        }
        // Recorded, but the job id was never written (the server died during sbatch, or
        // before the submitter got to it): the submitter looks the job up by its output
        // path, and submits it only if Slurm does not have it and the shim never ran.
        match shim::read_spec(&run_dir).ok().flatten() {
            Some(spec) => {
                let args = self.sbatch_args(&run, &run_dir, &spec);
                self.enqueue(run, run_dir, sink, args, file.job_name, true);
                self.shared.submit_wake.notify_all();
            }
            None => report_from_dir(&run, &run_dir, &sink, true),
        }
        Ok(())
    }
}

/// The run of a run directory (`.../<job>/<attempt>/<replica>/<restart>`).
fn run_id_of(run_dir: &Path) -> Option<RunId> {
    let restart = run_dir.file_name()?.to_str()?.parse().ok()?;
    let replica_dir = run_dir.parent()?;
    let replica = replica_dir.file_name()?.to_str()?.to_string();
    let attempt_dir = replica_dir.parent()?;
    let attempt = attempt_dir.file_name()?.to_str()?.parse().ok()?;
    let job = attempt_dir.parent()?.file_name()?.to_str()?.parse().ok()?;
    Some(RunId { job, attempt, replica, restart })
}

/// Starts watching a submitted run.
fn watch(shared: &Shared, run: RunId, run_dir: PathBuf, job_id: u64, sink: EventSink, stopped: bool, gang: Option<PathBuf>) {
    let mut st = lock(&shared.state);
    if st.submits.remove(&run_dir).is_some_and(|s| s.in_flight) {
        st.in_flight_since = None;
    }
    if let Some(g) = st.gangs.get_mut(gang.as_deref().unwrap_or(Path::new(""))) {
        g.last_end = None;
    }
    st.watches.entry(run_dir).or_insert(Watch {
        run,
        job_id,
        sink,
        started_sent: false,
        status_seen: None,
        missing_since: None,
        stopped,
        drained: None,
        gang,
        at_step: None,
    });
    drop(st);
    shared.wake.notify_all();
}

fn job_of(shared: &Shared, run_dir: &Path) -> Option<u64> {
    if let Some(w) = lock(&shared.state).watches.get(run_dir) {
        return Some(w.job_id);
    }
    read_job_file(run_dir).ok().flatten().and_then(|f| f.job_id)
}

/// Stops a submitted run: see "Stop" in the module docs.
fn stop_job(shared: &Shared, run: &RunId, run_dir: &Path) -> Result<(), BackendError> {
    let opts = &shared.opts;
    let Some(id) = job_of(shared, run_dir) else { return Ok(()) };
    if let Some(gang) = gang_of(shared, run_dir) {
        return stop_step(shared, run_dir, &gang, id, false);
    }
    let (known, pending) = {
        let mut st = lock(&shared.state);
        if let Some(w) = st.watches.get_mut(run_dir) {
            w.stopped = true;
        }
        let j = st.last.get(&id);
        (j.map(|j| j.job_state.clone()), j.is_some_and(|j| j.job_state == "PENDING"))
    };
    if known.as_deref().is_some_and(|s| !is_live_state(s)) {
        return Ok(());
    }
    let ids = id.to_string();
    if pending || run_dir.join(shim::STATUS_FILE).exists() {
        return scancel(opts, &[&ids]).map_err(|m| slurm_err("scancel", m));
    }
    if let Err(m) = scancel(opts, &["--signal=TERM", "--full", &ids]) {
        // Pending ("can not be altered now") or already over: a plain cancel does it.
        tracing::debug!(%run, "scancel --signal=TERM: {m}");
        return scancel(opts, &[&ids]).map_err(|m| slurm_err("scancel", m));
    }
    let grace = shim::read_spec(run_dir).ok().flatten().map(|s| s.grace_seconds).unwrap_or(30.0);
    let at = Instant::now() + Duration::try_from_secs_f64(grace.max(0.0) + 1.0).unwrap_or(Duration::from_secs(31));
    lock(&shared.state).kills.push((at, id.to_string()));
    shared.wake.notify_all();
    Ok(())
}

/// Kills a submitted run: see "Kill" in the module docs.
fn kill_job(shared: &Shared, run: &RunId, run_dir: &Path) -> Result<(), BackendError> {
    let opts = &shared.opts;
    let Some(id) = job_of(shared, run_dir) else { return Ok(()) };
    if let Some(gang) = gang_of(shared, run_dir) {
        return stop_step(shared, run_dir, &gang, id, true);
    }
    let known = {
        let mut st = lock(&shared.state);
        if let Some(w) = st.watches.get_mut(run_dir) {
            w.stopped = true;
        }
        st.last.get(&id).map(|j| j.job_state.clone())
    };
    if known.as_deref().is_some_and(|s| !is_live_state(s)) {
        return Ok(());
    }
    let ids = id.to_string();
    if let Err(m) = scancel(opts, &["--signal=KILL", "--full", &ids]) {
        // Pending ("can not be altered now") or already over: the plain cancel decides.
        tracing::debug!(%run, "scancel --signal=KILL --full: {m}");
    }
    match scancel(opts, &[&ids]) {
        Ok(()) => Ok(()),
        Err(m) if job_is_over(&m) => Ok(()),
        Err(m) => Err(slurm_err("scancel", m)),
    }
}

/// The gang of a run, from its watch or its `slurm.json`.
fn gang_of(shared: &Shared, run_dir: &Path) -> Option<PathBuf> {
    if let Some(w) = lock(&shared.state).watches.get(run_dir) {
        return w.gang.clone();
    }
    read_job_file(run_dir).ok().flatten().and_then(|f| f.gang)
}

/// Stops (or, `kill`, kills) one replica of a gang: see [`gang`]. Its step gets the
/// signal once its wrapper recorded it; while the allocation is pending the allocation is
/// cancelled, and every replica of it ends as stopped.
fn stop_step(shared: &Shared, run_dir: &Path, gang: &Path, id: u64, kill: bool) -> Result<(), BackendError> {
    let opts = &shared.opts;
    let (pending, over) = {
        let mut st = lock(&shared.state);
        let j = st.last.get(&id).cloned();
        let pending = j.as_ref().is_none_or(|j| j.job_state == "PENDING");
        let over = j.as_ref().is_some_and(|j| !is_live_state(&j.job_state));
        if let Some(w) = st.watches.get_mut(run_dir) {
            w.stopped = true;
        }
        (pending, over)
    };
    if over || run_dir.join(shim::STATUS_FILE).exists() {
        return Ok(());
    }
    if let Some(step) = gang::step_of(run_dir) {
        return signal_step(shared, run_dir, &step, kill);
    }
    if pending {
        // Nothing of the gang runs yet: the whole allocation goes.
        {
            let mut st = lock(&shared.state);
            for w in st.watches.values_mut().filter(|w| w.gang.as_deref() == Some(gang)) {
                w.stopped = true;
            }
        }
        return match scancel(opts, &[&id.to_string()]) {
            Err(m) if !job_is_over(&m) => Err(slurm_err("scancel", m)),
            _ => Ok(()),
        };
    }
    // Running, but this replica's step has not recorded itself yet: the watcher signals
    // it when it does.
    if let Some(w) = lock(&shared.state).watches.get_mut(run_dir) {
        w.at_step = Some(kill || w.at_step == Some(true));
    }
    shared.wake.notify_all();
    Ok(())
}

/// SIGTERM to a step (its shim stops the program with the grace period), with a backstop
/// cancel of the step after the grace period; or, `kill`, SIGKILL and the cancel at once.
fn signal_step(shared: &Shared, run_dir: &Path, step: &str, kill: bool) -> Result<(), BackendError> {
    let opts = &shared.opts;
    if kill {
        if let Err(m) = scancel(opts, &["--signal=KILL", step]) {
            tracing::debug!("scancel --signal=KILL {step}: {m}");
        }
        return match scancel(opts, &[step]) {
            Err(m) if !job_is_over(&m) => Err(slurm_err("scancel", m)),
            _ => Ok(()),
        };
    }
    if let Err(m) = scancel(opts, &["--signal=TERM", step]) {
        if job_is_over(&m) {
            return Ok(());
        }
        return scancel(opts, &[step]).map_err(|m| slurm_err("scancel", m));
    }
    let grace = shim::read_spec(run_dir).ok().flatten().map(|s| s.grace_seconds).unwrap_or(30.0);
    let at = Instant::now() + Duration::try_from_secs_f64(grace.max(0.0) + 1.0).unwrap_or(Duration::from_secs(31));
    lock(&shared.state).kills.push((at, step.to_string()));
    shared.wake.notify_all();
    Ok(())
}

/// The watcher's gang work, every tick: signals the steps of replicas stopped before their
/// step was known, and releases the allocations of gangs whose runs all ended [`gang::LINGER`]
/// ago with no new one.
fn gang_ticks(shared: &Shared) {
    let (signal, release): (Vec<(PathBuf, String, bool)>, Vec<PathBuf>) = {
        let mut st = lock(&shared.state);
        let signal = st
            .watches
            .iter_mut()
            .filter_map(|(d, w)| {
                let kill = w.at_step?;
                let step = gang::step_of(d)?;
                w.at_step = None;
                Some((d.clone(), step, kill))
            })
            .collect();
        let live: std::collections::HashSet<PathBuf> = st.watches.values().filter_map(|w| w.gang.clone()).collect();
        let submitting: std::collections::HashSet<PathBuf> = st.submits.keys().cloned().collect();
        let release: Vec<PathBuf> = st
            .gangs
            .iter()
            .filter(|(g, v)| !live.contains(*g) && !submitting.contains(*g) && v.last_end.is_some_and(|t| t.elapsed() >= gang::LINGER))
            .map(|(g, _)| g.clone())
            .collect();
        for g in &release {
            st.gangs.remove(g);
        }
        (signal, release)
    };
    for (dir, step, kill) in signal {
        if let Err(e) = signal_step(shared, &dir, &step, kill) {
            tracing::warn!("{}: {e}", dir.display());
        }
    }
    for g in release {
        if let Err(e) = fsutil::write_atomic(&g.join(gang::RELEASE_FILE), b"") {
            tracing::warn!("cannot release the gang's allocation ({}): {e}", g.display());
        }
    }
}

/// `scancel`'s answer for a job that has ended (or that Slurm has forgotten).
fn job_is_over(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("already completing or completed") || m.contains("invalid job id")
}

impl Backend for SlurmBackend {
    /// Records every run (spec and `slurm.json`, durably) and returns; the submitter
    /// thread submits them in order and reports refusals as `Exited` (L16).
    fn launch(&self, runs: Vec<Launch>, sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)> {
        // The first runs of an attempt's replicas (L6) go as one gang.
        let mut gangs: Vec<((u64, u32), Vec<Launch>)> = Vec::new();
        let mut single = Vec::new();
        for l in runs {
            if l.run.restart == 0 {
                let key = (l.run.job, l.run.attempt);
                match gangs.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, g)) => g.push(l),
                    None => gangs.push((key, vec![l])),
                }
            } else {
                single.push(l);
            }
        }
        let mut out = Vec::new();
        for (_, g) in gangs {
            if g.len() >= 2 {
                out.extend(self.record_gang(g, sink.clone()));
            } else {
                single.extend(g);
            }
        }
        for l in single {
            let run = l.run.clone();
            out.push((run, self.record(l, sink.clone())));
        }
        self.shared.submit_wake.notify_all();
        out
    }

    fn adopt(&self, run: RunId, run_dir: PathBuf, sink: EventSink) -> Result<(), BackendError> {
        let run_dir = std::path::absolute(&run_dir).map_err(|e| slurm_err("resolve run directory", e.to_string()))?;
        self.adopt_dir(run, run_dir, sink)
    }

    fn stop(&self, run: &RunId, run_dir: PathBuf) -> Result<(), BackendError> {
        match self.unless_unsubmitted(run_dir)? {
            Some(run_dir) => stop_job(&self.shared, run, &run_dir),
            None => Ok(()),
        }
    }

    /// `scancel --signal=KILL --full <id>`, then `scancel <id>`; a run not submitted yet
    /// ends as on `stop` (it never reached Slurm, or is cancelled once it can be looked up).
    fn kill(&self, run: &RunId, run_dir: PathBuf) -> Result<(), BackendError> {
        match self.unless_unsubmitted(run_dir)? {
            Some(run_dir) => kill_job(&self.shared, run, &run_dir),
            None => Ok(()),
        }
    }

    fn waiting_reason(&self, run: &RunId) -> Option<String> {
        let st = lock(&self.shared.state);
        if !st.submits.values().any(|s| s.run == *run || s.members.iter().any(|(r, _)| r == run)) {
            // Submitted: what Slurm's queue says of it while it is PENDING.
            return pending_reason(&st, run).map(|r| format!("Slurm holds it in partition {}'s queue (PENDING, {r})", self.opts().partition));
        }
        if let Some((m, d)) = &st.ctld_error {
            return Some(unreachable_reason(m, *d));
        }
        // A client command waits about 9 s for an unreachable controller before it fails.
        st.in_flight_since
            .is_some_and(|t| t.elapsed() >= SLOW_COMMAND)
            .then(|| "the Slurm controller does not answer yet (unreachable or slow); the submission waits for it".to_string())
    }

    /// `scancel --signal=USR1 --batch <id>` (the batch script is the shim, `exec`ed), or a
    /// gang's replica: `scancel --signal=USR1 <id>.<step>`; the shim passes it on.
    fn signal(&self, run: &RunId, run_dir: PathBuf, signal: i32) -> Result<(), BackendError> {
        let name = match signal {
            10 => "USR1",
            12 => "USR2",
            other => return Err(slurm_err("scancel", format!("signal {other} is not passed to a replica"))),
        };
        let Some(id) = job_of(&self.shared, &run_dir) else { return Ok(()) };
        if run_dir.join(shim::STATUS_FILE).exists() {
            return Ok(());
        }
        let flag = format!("--signal={name}");
        let result = match gang_of(&self.shared, &run_dir) {
            Some(_) => match gang::step_of(&run_dir) {
                Some(step) => scancel(self.opts(), &[&flag, &step]),
                None => return Ok(()),
            },
            None => scancel(self.opts(), &[&flag, "--batch", &id.to_string()]),
        };
        match result {
            Err(m) if !job_is_over(&m) => {
                tracing::debug!(%run, "scancel {flag}: {m}");
                Err(slurm_err("scancel", m))
            }
            _ => Ok(()),
        }
    }

    fn held_for_resources(&self, run: &RunId) -> bool {
        let st = lock(&self.shared.state);
        pending_reason(&st, run).is_some_and(|r| r == "Resources" || r == "Priority")
    }

    fn describe(&self) -> String {
        format!(
            "Slurm (partition {}{}); memory limits and OOM kills through Slurm's --mem and cgroups{}",
            self.opts().partition,
            self.opts().gpu_partition.as_ref().map(|g| format!(", GPU partition {g}")).unwrap_or_default(),
            if self.opts().fit_to_nodes { "; requests reduced to the largest node" } else { "" }
        )
    }
}

/// Slurm's reason for a watched run's job that is PENDING (e.g. `Resources`), if any.
fn pending_reason<'a>(st: &'a State, run: &RunId) -> Option<&'a str> {
    let w = st.watches.values().find(|w| w.run == *run)?;
    let j = st.last.get(&w.job_id)?;
    (j.job_state == "PENDING" && !j.state_reason.is_empty() && j.state_reason != "None").then_some(j.state_reason.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/squeue-22.05.json");

    fn job(id: u64) -> SqJob {
        let (jobs, bad) = parse_squeue(FIXTURE.as_bytes()).unwrap();
        assert_eq!(bad, 0);
        jobs[&id].clone()
    }

    fn status(exit_code: Option<i32>, signal: Option<i32>) -> ShimStatus {
        ShimStatus { exit_code, signal, oom_kills: None, start_error: None, launch_error: None, ended_micros: 0 }
    }

    /// The real `squeue --json` of Slurm 22.05.8 (captured from scripts/slurm/up.sh's
    /// cluster): states, reasons and raw exit codes.
    #[test]
    fn parses_a_real_squeue_sample() {
        let (jobs, bad) = parse_squeue(FIXTURE.as_bytes()).unwrap();
        assert_eq!(bad, 0);
        assert_eq!(jobs.len(), 8);
        let oom = &jobs[&30];
        assert_eq!((oom.job_state.as_str(), oom.state_reason.as_str(), oom.raw_exit()), ("OUT_OF_MEMORY", "OutOfMemory", Some(253)));
        assert_eq!(oom.nodes, "n1");
        assert_eq!(oom.standard_output, "/tmp/t1/slurm.out");
        assert_eq!((jobs[&31].job_state.as_str(), jobs[&31].raw_exit()), ("FAILED", Some(768)));
        assert_eq!(jobs[&32].state_reason, "JobLaunchFailure");
        assert_eq!(jobs[&34].job_state, "PENDING");
        assert_eq!(jobs[&35].job_state, "CANCELLED");
        assert_eq!(jobs[&36].job_state, "COMPLETED");
        assert_eq!((jobs[&37].job_state.as_str(), jobs[&37].state_reason.as_str()), ("NODE_FAIL", "NodeDown"));
    }

    #[test]
    fn tolerates_unknown_and_bad_entries() {
        let (jobs, bad) =
            parse_squeue(br#"{"meta":{},"jobs":[{"job_id":5,"job_state":"RUNNING","new_field":{"x":1},"exit_code":{"status":"x"}},{"nope":1}]}"#)
                .unwrap();
        assert_eq!(bad, 1);
        assert_eq!(jobs[&5].job_state, "RUNNING");
        assert_eq!(jobs[&5].raw_exit(), None);
        assert!(parse_squeue(b"squeue: error: Unable to contact slurm controller").is_err());
        assert!(parse_squeue(b"").is_err());
    }

    #[test]
    fn wait_status_decoding() {
        assert_eq!(decode_wait_status(768), WaitStatus::Exited(3));
        assert_eq!(decode_wait_status(0), WaitStatus::Exited(0));
        assert_eq!(decode_wait_status(9), WaitStatus::Signaled(9));
        assert_eq!(decode_wait_status(15), WaitStatus::Signaled(15));
        assert_eq!(decode_wait_status(134 << 8), WaitStatus::Exited(134));
        // OOM: Slurm's 0:125 (253 = 0xfd).
        assert_eq!(decode_wait_status(253), WaitStatus::Signaled(125));
    }

    /// L14: OUT_OF_MEMORY is an OOM kill, with the status the shim saw.
    #[test]
    fn l14_out_of_memory_state() {
        assert_eq!(outcome_for(Some(&job(30)), Some(&status(None, Some(9))), true, false), Outcome::OomKilled { status: 137 });
        assert_eq!(outcome_for(Some(&job(30)), None, true, false), Outcome::OomKilled { status: 137 });
        // A plain SIGKILL without OUT_OF_MEMORY is not an OOM (never guessed from 137).
        let mut failed = job(32);
        failed.state_reason = "NonZeroExitCode".into();
        assert_eq!(outcome_for(Some(&failed), Some(&status(None, Some(9))), true, false), Outcome::Signaled { signal: 9 });
    }

    /// L9/L10: node failure is Lost (restarted, not counted); TIMEOUT too.
    #[test]
    fn l9_node_fail_and_timeout_are_lost() {
        assert!(matches!(outcome_for(Some(&job(37)), None, true, false), Outcome::Lost { .. }));
        assert!(matches!(outcome_for(Some(&job(37)), Some(&status(None, Some(15))), true, false), Outcome::Lost { .. }));
        let mut t = job(36);
        t.job_state = "TIMEOUT".into();
        t.state_reason = "TimeLimit".into();
        assert!(matches!(outcome_for(Some(&t), Some(&status(None, Some(15))), true, false), Outcome::Lost { .. }));
    }

    /// L13, L16: the shim's status decides; without one, a job that never ran the
    /// program is a launch failure, one that ran is lost.
    #[test]
    fn l13_l16_status_and_launch_failures() {
        assert_eq!(outcome_for(Some(&job(31)), Some(&status(Some(3), None)), true, false), Outcome::Exited { code: 3 });
        assert_eq!(outcome_for(Some(&job(36)), Some(&status(Some(0), None)), true, false), Outcome::Exited { code: 0 });
        let mut s = status(None, None);
        s.start_error = Some("cannot start \"/x\"".into());
        assert!(matches!(outcome_for(Some(&job(36)), Some(&s), false, false), Outcome::StartError { .. }));
        assert!(matches!(outcome_for(Some(&job(32)), None, false, false), Outcome::LaunchFailed { .. }));
        assert!(matches!(outcome_for(Some(&job(32)), None, true, false), Outcome::Lost { .. }));
        assert!(matches!(outcome_for(None, None, false, false), Outcome::LaunchFailed { .. }));
        assert_eq!(outcome_for(Some(&job(35)), None, false, true), Outcome::Signaled { signal: 15 });
    }

    #[test]
    fn states() {
        for s in ["PENDING", "RUNNING", "COMPLETING", "CONFIGURING"] {
            assert!(is_live_state(s), "{s}");
        }
        for s in ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"] {
            assert!(!is_live_state(s), "{s}");
        }
    }

    #[test]
    fn requests_from_the_job_spec() {
        let job_spec = serde_json::json!({
            "workerPoolSpecs": [
                {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1"},
                {"machineSpec": {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 2}}
            ],
            "scheduling": {"timeout": "90s"}
        });
        let cs = serde_json::json!({"cluster": {}, "job": job_spec.to_string()});
        let mut spec = ShimSpec::new(vec!["x".into()], vec![("CLUSTER_SPEC".into(), cs.to_string())]);
        spec.memory_limit_bytes = Some(3 * 1024 * 1024 * 1024 + 1);
        spec.grace_seconds = 30.0;
        let run = RunId { job: 7, attempt: 1, replica: "workerpool1-0".into(), restart: 2 };
        let r = request_for(&run, &spec);
        assert_eq!(r, Request { cpus: 8, memory_mb: Some(3073), gpus: 2, time_minutes: Some(3) });
        let r0 = request_for(&RunId { replica: "workerpool0-0".into(), ..run.clone() }, &spec);
        assert_eq!((r0.cpus, r0.gpus), (4, 0));
        assert_eq!(job_name(&run), "ty-7-1-workerpool1-0-2");
        // No CLUSTER_SPEC: one CPU, the memory limit, no time limit.
        let bare = ShimSpec::new(vec!["x".into()], vec![]);
        assert_eq!(request_for(&run, &bare), Request { cpus: 1, memory_mb: None, gpus: 0, time_minutes: None });
    }

    /// `resources` (set by the driver) wins over CLUSTER_SPEC, which is only the fallback
    /// for specs without them.
    #[test]
    fn requests_from_resources() {
        let cs = serde_json::json!({"cluster": {}, "job": serde_json::json!({
            "workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-8", "acceleratorCount": 4}}],
            "scheduling": {"timeout": "3600s"}
        }).to_string()});
        let mut spec = ShimSpec::new(vec!["x".into()], vec![("CLUSTER_SPEC".into(), cs.to_string())]);
        spec.memory_limit_bytes = Some(1024 * 1024 * 1024);
        spec.grace_seconds = 30.0;
        let run = RunId { job: 7, attempt: 0, replica: "workerpool0-0".into(), restart: 0 };
        assert_eq!(request_for(&run, &spec), Request { cpus: 8, memory_mb: Some(1024), gpus: 4, time_minutes: Some(62) });
        spec.resources = crate::shim::Resources { cpus: Some(4), accelerator: Some(("NVIDIA_TESLA_T4".into(), 1)), timeout_secs: Some(90) };
        assert_eq!(request_for(&run, &spec), Request { cpus: 4, memory_mb: Some(1024), gpus: 1, time_minutes: Some(3) });
        // Set but without an accelerator or a timeout: none, not CLUSTER_SPEC's.
        spec.resources = crate::shim::Resources { cpus: Some(2), accelerator: None, timeout_secs: None };
        assert_eq!(request_for(&run, &spec), Request { cpus: 2, memory_mb: Some(1024), gpus: 0, time_minutes: None });
        // The replica name does not matter any more (no pool index needed).
        let other = RunId { replica: "chief".into(), ..run.clone() };
        assert_eq!(request_for(&other, &spec).cpus, 2);
    }

    #[test]
    fn submit_backoff_and_reason() {
        let secs: Vec<u64> = (1..=7).map(|n| submit_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 30, 30, 30]);
        let r = unreachable_reason("Unable to contact slurm controller (connect failure)", submit_backoff(2));
        assert_eq!(r, "the Slurm controller is unreachable (Unable to contact slurm controller (connect failure)); trying again in 4s");
    }

    #[test]
    fn sinfo_sizes_and_quoting() {
        let s = partition_sizes(
            br#"{"nodes":[{"name":"n1","cpus":2,"real_memory":2000,"partitions":["debug"]},
                          {"name":"n3","cpus":4,"real_memory":1000,"partitions":["debug","gpu"],"extra":1}]}"#,
        )
        .unwrap();
        assert_eq!(s["debug"], NodeSize { cpus: 4, memory_mb: 2000 });
        assert_eq!(s["gpu"], NodeSize { cpus: 4, memory_mb: 1000 });
        assert_eq!(sh_quote(b"/a b/it's"), "'/a b/it'\\''s'");
        assert!(is_transient("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"));
        assert!(!is_transient("sbatch: error: Batch job submission failed: Requested node configuration is not available"));
    }

    #[test]
    fn drained_and_down_nodes() {
        let down = unavailable_nodes(
            br#"{"nodes":[{"name":"n1","state":"idle","state_flags":[]},{"name":"n2","state":"mixed","state_flags":["DRAIN"]},
                          {"name":"n3","state":"down","state_flags":["NOT_RESPONDING"]},{"name":"n4","state":"allocated"}]}"#,
        )
        .unwrap();
        assert_eq!(down, vec!["n2".to_string(), "n3".to_string()]);
    }
}
