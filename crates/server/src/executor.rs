//! The executor: carries committed effects out off the driver thread and reports what
//! happened, so that nothing an engine does (a slow `scancel`, a stuck shim) can hold up
//! admissions or API replies. The driver decides; the executor acts.
//!
//! - Launches go to a small pool of threads; the runs of a gang are handed to the backend
//!   together, which starts them in parallel (L6). A job's venv is built by its replica
//!   (see `venv`), never here.
//! - Stops and kills each run on a thread of their own: a stop may wait for a shim that is
//!   still coming up, and an engine's stop command may block while its controller is
//!   unreachable.
//! - Observations of a job's files (L21 checkpoint scans, hang detection's latest writes,
//!   trials' metric files) go to one observing thread: a job's checkpoint directory is its
//!   own to fill (links, deep trees, millions of entries), so the scan is bounded (no
//!   link followed, an entry and a depth cap) and never runs on the driver thread.
//!
//! Every piece of work ends in a [`Report`] (or, for a launch that cannot start the
//! program, a `BackendEvent::Exited` through the sink), which the driver handles like any
//! other event: the driver, not the executor, decides what to try again and when.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use trainyard_backend::{Backend, BackendError, BackendEvent, EventSink, Launch};
use trainyard_core::{Micros, Outcome, RunId};

use crate::paths::{BeneathError, Confined};

/// Something to do.
pub enum Work {
    /// Start these runs together (the replicas of one attempt, or one restarted replica).
    Launch(Vec<Planned>),
    /// L20: ask a run to stop (SIGTERM, grace, SIGKILL by its supervisor).
    Stop { run: RunId, dir: PathBuf },
    /// L20: the stop was not honoured in time: kill the run without its supervisor's help.
    Kill { run: RunId, dir: PathBuf },
    /// Send a signal to a running run's program (the timeout warning, L19); best effort,
    /// nothing is reported.
    /// `notice`: a file to write first (TY11: the notice before a stop) and its text.
    Signal { run: RunId, dir: PathBuf, signal: i32, notice: Option<(PathBuf, String)> },
    /// Remove a deleted job's files (outbox entry `seq`).
    Purge { seq: i64, dirs: Vec<PathBuf> },
    /// L22 retention: remove the output logs under these jobs' run directories.
    /// Answered with `Report::LogsPurged` once done, so that the sweep's cutoff is
    /// stored only then (a purge cut short by a crash is done again).
    PurgeLogs { dirs: Vec<PathBuf>, cutoff: Micros },
    /// Kill every run found under a job's run directories (a job whose stored record is
    /// damaged, L20), each reported as a `Kill` is.
    KillRunsOf { job: u64, data_dir: PathBuf },
    /// Remove the network namespaces under `dir` of jobs that have ended: those of ids up
    /// to `known` (the highest id when it was asked: ids are never reused, and a job
    /// created since is not known to have ended) that are not in `live`.
    RemoveNetns { dir: PathBuf, live: std::collections::HashSet<u64>, known: u64 },
    /// What a job's tick decides on, read off the driver's thread: L21, the newest
    /// modification time under its checkpoint directory, bounded (see
    /// `paths::newest_mtime`); hang detection, each running replica's latest write (the
    /// modification times of its files: its log, its metric file). Answered with
    /// `Report::Observed`.
    /// Stack dumps asked for (a replica whose silence is about to be reported) are taken
    /// on the project's dump threads (see `tenant_work`), bounded by
    /// `stuck::DUMP_BUDGET`, and the answer waits for them: one project's dumps never
    /// hold up another job's observation.
    Observe { job: u64, project: String, checkpoints: Option<Confined>, activity: Vec<ReplicaWatch> },
    /// Tuning trials' metric files, read (a tenant's files: on the observing thread, never
    /// the driver's); answered with `Report::TrialMetrics`.
    /// `periodic`: the driver's read of running trials (one at a time), else trials'
    /// final reads at their jobs' ends.
    ReadTrialMetrics { reads: Vec<MetricRead>, periodic: bool },
    /// Why these launched runs have not started yet, as the engine says (its controller
    /// unreachable, a command that hangs): asked on the observing thread, never the
    /// driver's, so that an engine that blocks stalls no request. Answered with
    /// `Report::EngineReasons`.
    EngineReasons(Vec<RunId>),
    /// Running jobs' progress files (a tenant's files: on the observing thread); answered
    /// with `Report::ProgressRead`.
    ReadProgress(Vec<ProgressSource>),
    /// A tuning study's suggestion (a GP fit may take a while), on the project's
    /// suggestion threads (see `tenant_work`); answered with `Report::Suggested`.
    Suggest { study: u64, project: String, request: Box<crate::kinds::tuning_jobs::SuggestRequest> },
    /// A Vizier study's suggest request `op`, as `Suggest`; answered with
    /// `Report::VizierSuggested`.
    VizierSuggest { study: u64, op: u64, project: String, request: Box<crate::kinds::tuning_jobs::SuggestRequest> },
    /// The study was deleted or ended: its suggestion under way (`Suggest`, or
    /// `VizierSuggest` with `vizier`) stops at its next look, answered with a
    /// cancellation.
    CancelSuggest { study: u64, vizier: bool },
}

/// The key of a study's suggestions in the suggestion gate.
fn suggest_key(study: u64, vizier: bool) -> String {
    format!("{}/{study}", if vizier { "vizier" } else { "tuning" })
}

/// One trial's metric file to read: its study and trial, the file, the metrics asked for
/// (the study's objective first), and when the trial's job started.
pub struct MetricRead {
    pub study: u64,
    pub trial: String,
    pub path: PathBuf,
    pub ids: Vec<String>,
    pub start_time: Option<Micros>,
    /// The trial's job ended so: this is its final read.
    pub end: Option<TrialEnd>,
}

/// How a trial's job ended, for the study's `TrialEnded`.
#[derive(Clone, Debug, PartialEq)]
pub struct TrialEnd {
    pub succeeded: bool,
    pub error: Option<String>,
}

/// What was read of one trial's metric file.
#[derive(Debug)]
pub struct MetricsRead {
    pub study: u64,
    pub trial: String,
    pub end: Option<TrialEnd>,
    pub metrics: TrialMetrics,
}

/// What a trial job reported (cloudml-hypertune's metric file): (step, value) of the
/// study's first objective, milliseconds from the job's start to each of those reports,
/// and the series of each of its other metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrialMetrics {
    pub primary: Vec<(i64, f64)>,
    pub elapsed_ms: Vec<Option<u64>>,
    pub others: Vec<(String, Vec<(i64, f64)>)>,
}

/// The most of a trial's metric file read at once (a report line is about 100 bytes).
const METRIC_FILE_MAX: u64 = 16 << 20;

/// Read and parse a trial's metric file (the trial's directory is its project's user's: no
/// link, FIFO or endless file is followed or read through; bad lines are logged and
/// skipped). Nothing readable: no measurement.
pub fn read_trial_metrics(path: &std::path::Path, ids: &[String], start_time: Option<Micros>) -> TrialMetrics {
    let Ok(text) = crate::identity::read_tenant_file(path, METRIC_FILE_MAX) else { return TrialMetrics::default() };
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut f = crate::kinds::tuning_jobs::read_metric_file(&text, &ids);
    for (line, why) in f.bad {
        tracing::warn!("{}: line {line} skipped: {why}", path.display());
    }
    // Milliseconds from the job's start (RUNNING) to each report.
    let elapsed_ms = f.times.first().map_or_else(Vec::new, |times| {
        times
            .iter()
            .map(|t| {
                let (t, start) = ((*t)?, start_time?);
                let ms = (t * 1e3 - start as f64 / 1e3).round();
                (ms.is_finite() && ms >= 0.0).then_some(ms as u64)
            })
            .collect()
    });
    let others = ids.iter().skip(1).map(|id| id.to_string()).zip(f.series.drain(1..)).collect();
    TrialMetrics { primary: f.series.pop().unwrap_or_default(), elapsed_ms, others }
}

/// A launch as the driver planned it.
pub struct Planned {
    /// The launch's outbox entry, done once the run is handed to the engine.
    pub seq: i64,
    pub launch: Launch,
    /// Directories the run's environment names, made before it starts, each below its
    /// root without following a link.
    pub dirs: Vec<Confined>,
    /// With `launch.spec.run_as`: the directories made that user's (see `identity`).
    pub grants: Vec<crate::identity::Grant>,
    /// The job's credential file (tokens mode), written before the run starts.
    pub credentials: Option<SecretFile>,
    /// With `[tls]`: the certificates the job's clients trust (the host's and the
    /// server's CA), written before the run starts.
    pub trust: Option<TrustBundle>,
    /// With `[tls] jobs_address`: a host program's hosts file (the host's and the
    /// service's names), written before the run starts.
    pub hosts: Option<HostsFile>,
    /// A restarted or retried replica's checkpoint directory: its newest entry becomes
    /// `TRAINYARD_LATEST_CHECKPOINT` (as the program sees `AIP_CHECKPOINT_DIR`).
    pub checkpoints: Option<Confined>,
    /// The job's `packageUris`, each to name a file before the run starts.
    pub packages: Vec<PackageCheck>,
}

/// A `packageUris` entry, looked at here, off the driver's thread (it is in a tenant's
/// storage): one that names nothing is the user's (a StartError naming the URI and the
/// project whose storage it was looked up in), never an internal error retried; for a
/// build on the host it must be a file or a directory, not through a link.
pub struct PackageCheck {
    pub path: Confined,
    pub uri: String,
    pub project: String,
    /// Its place in `pythonPackageSpec.packageUris`.
    pub index: usize,
    pub on_host: bool,
}

impl PackageCheck {
    pub fn check(&self) -> Result<(), String> {
        let (uri, project) = (&self.uri, &self.project);
        match self.path.stat() {
            Err(BeneathError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                let field = format!("pythonPackageSpec.packageUris[{}]", self.index);
                return Err(format!(
                    "{field}: the package {uri} was not found in project {project:?}'s storage; upload it to a bucket of project {project:?}"
                ));
            }
            // A link or another kind of file: said by the build (in a container) or below.
            _ if !self.on_host => return Ok(()),
            _ => {}
        }
        crate::venv::check_package(&self.path, self.index).map(|_| ())
    }
}

/// The newest entry of a restarted or retried replica's checkpoint directory.
pub const LATEST_CHECKPOINT_ENV: &str = "TRAINYARD_LATEST_CHECKPOINT";

/// A file only the run's user may read, in a directory of the server's (the run
/// directory, which no tenant can write).
pub struct SecretFile {
    pub path: PathBuf,
    pub contents: String,
}

impl SecretFile {
    /// Write it (a new file renamed into place, never through a link), mode 0400, owned
    /// by `run_as` when given.
    fn write(&self, run_as: Option<trainyard_backend::RunAs>) -> Result<(), String> {
        write_run_file(&self.path, "the job's credential file", self.contents.as_bytes(), 0o400, run_as)
    }
}

/// Write a file of a run's (a new file beside it, never opened through a link, renamed
/// into place) with `mode` whatever the umask, owned by `run_as` when given.
fn write_run_file(path: &Path, what: &str, contents: &[u8], mode: u32, run_as: Option<trainyard_backend::RunAs>) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |step: &str, e: std::io::Error| format!("cannot {step} {what} {}: {e}", path.display());
    let dir = path.parent().ok_or_else(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| fail("make the directory of", e))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| fail("create", e))?;
    if let Some(id) = run_as {
        nix::unistd::fchown(&f, Some(nix::unistd::Uid::from_raw(id.uid)), Some(nix::unistd::Gid::from_raw(id.gid)))
            .map_err(|e| fail("give its user", e.into()))?;
    }
    f.write_all(contents).map_err(|e| fail("write", e))?;
    // The server's umask is private: a mode that lets others read must be set.
    f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| fail("set the mode of", e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail("rename", e))
}

/// The host's CA certificates, where Debian, Fedora and Alpine keep them.
const SYSTEM_BUNDLES: &[&str] = &["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];

/// The certificates a TLS server's job trusts: the host's CA certificates (the job's
/// downloads from elsewhere keep working) and the server's CA (`<data_dir>/tls/ca.pem`),
/// in one PEM file that `REQUESTS_CA_BUNDLE`, `SSL_CERT_FILE` and
/// `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH` name.
pub struct TrustBundle {
    pub path: PathBuf,
    pub server_ca: PathBuf,
}

impl TrustBundle {
    /// Write it, mode 0444: nothing in it is secret.
    fn write(&self) -> Result<(), String> {
        let ca = std::fs::read_to_string(&self.server_ca)
            .map_err(|e| format!("cannot read {} for the job's CA bundle {}: {e}", self.server_ca.display(), self.path.display()))?;
        let system = SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        let sep = if system.is_empty() || system.ends_with('\n') { "" } else { "\n" };
        write_run_file(&self.path, "the job's CA bundle", format!("{system}{sep}{ca}").as_bytes(), 0o444, None)
    }
}

/// A run's hosts file: `/etc/hosts` of the host, then `lines`.
pub struct HostsFile {
    pub path: PathBuf,
    pub lines: String,
}

impl HostsFile {
    fn write(&self) -> Result<(), String> {
        let host = std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| "127.0.0.1 localhost\n::1 localhost\n".into());
        let sep = if host.is_empty() || host.ends_with('\n') { "" } else { "\n" };
        write_run_file(&self.path, "the job's hosts file", format!("{host}{sep}{}", self.lines).as_bytes(), 0o444, None)
    }
}

/// What the executor did.
#[derive(Debug)]
pub enum Report {
    /// The runs were handed to the engine (or reported Exited): their outbox entries are
    /// done.
    Launched { seqs: Vec<i64> },
    /// The engine could not take the run now (unreachable, or the host is out of file
    /// descriptors, processes or memory): nothing was started; try again later (not an
    /// L16 launch failure). Its outbox entry `seq` stays until it is launched.
    LaunchLater { run: RunId, seq: i64, reason: String },
    /// The stop request reached the run's supervisor (or the run had ended).
    StopSent { run: RunId },
    StopFailed { run: RunId, error: String },
    Killed { run: RunId },
    KillFailed { run: RunId, error: String },
    /// A deleted job's files are gone (or were never there), or, with `error`, some could
    /// not be removed (or the purge panicked): the driver tries again later.
    Purged { seq: i64, error: Option<String> },
    /// What `Work::Observe` saw: the newest checkpoint write (None when there is none or
    /// no scan was asked), the entries the scan looked at and whether its cap cut it, and
    /// each replica's latest write it found.
    Observed { job: u64, newest: Option<Micros>, entries: usize, truncated: bool, activity: Vec<ReplicaSeen> },
    /// What `Work::ReadTrialMetrics` read, each file asked for in order.
    TrialMetrics { reads: Vec<MetricsRead>, periodic: bool },
    /// What `Work::EngineReasons` heard: the runs the engine gave a reason for.
    EngineReasons(Vec<EngineWait>),
    /// What `Work::ReadProgress` read.
    ProgressRead(Vec<ProgressSeen>),
    /// L22 retention: the output logs of jobs that ended before `cutoff` are removed
    /// (None: the purge could not be started).
    LogsPurged { cutoff: Option<Micros> },
    /// What `Work::Suggest` computed (an error: its message).
    Suggested { study: u64, result: Result<Vec<trainyard_tuner::Assignment>, String> },
    /// What `Work::VizierSuggest` computed.
    VizierSuggested { study: u64, op: u64, result: Result<Vec<trainyard_tuner::Assignment>, trainyard_tuner::TunerError> },
    /// CPU seconds a project's work took on the server (`work`: "dump" or "suggest").
    TenantCpu { project: String, work: &'static str, seconds: f64 },
}

/// The answer to an observation that could not be made (its thread is gone, or it
/// panicked): nothing seen, so that the driver never waits for it for ever.
fn nothing_seen(work: &Work) -> Option<Report> {
    match work {
        Work::Observe { job, .. } => Some(Report::Observed { job: *job, newest: None, entries: 0, truncated: false, activity: Vec::new() }),
        // Nothing read, but a trial's end is still its end.
        Work::ReadTrialMetrics { reads, periodic } => Some(Report::TrialMetrics {
            reads: reads
                .iter()
                .map(|r| MetricsRead { study: r.study, trial: r.trial.clone(), end: r.end.clone(), metrics: TrialMetrics::default() })
                .collect(),
            periodic: *periodic,
        }),
        Work::EngineReasons(_) => Some(Report::EngineReasons(Vec::new())),
        Work::ReadProgress(_) => Some(Report::ProgressRead(Vec::new())),
        _ => None,
    }
}

pub type ReportSink = Arc<dyn Fn(Report) + Send + Sync>;

/// Where the driver hands its effects.
pub trait Executor: Send + Sync {
    fn submit(&self, work: Work);
}

/// The threaded executor of a server.
pub struct Pool {
    launches: Mutex<Sender<Work>>,
    /// The launch queue's other end, kept here so that the queue lives whatever becomes
    /// of the launch threads.
    launch_queue: Arc<Mutex<Receiver<Work>>>,
    /// Launch threads running.
    launchers: Arc<std::sync::atomic::AtomicUsize>,
    /// The scanner thread's queue (None when it could not be started, or the pool is
    /// being dropped).
    scans: Option<Mutex<Sender<Work>>>,
    /// The scanner thread, joined when the pool is dropped: it has a descriptor table of
    /// its own and holds the backend, which must not be dropped there (see [`Drop`]).
    scanner: Option<std::thread::JoinHandle<()>>,
    backend: Arc<dyn Backend>,
    sink: EventSink,
    report: ReportSink,
    /// The launch threads' nice value (see [`Pool::new`]).
    launch_nice: i32,
    /// Studies' suggestions: one at a time per project (a project's studies take one core
    /// at most), as many as the cores in all (at least two, so that one project's long
    /// batch never holds up every other project's).
    suggestions: crate::tenant_work::Gate,
}

/// Stack dumps of replicas, at once per project and in all (see `tenant_work`).
const DUMPS_PER_PROJECT: usize = 2;
const DUMPS_TOTAL: usize = 4;
/// The replicas of one job dumped per observation (replicas of one job silent together
/// mostly show the same thing).
const DUMPED_REPLICAS: usize = 2;
/// Tenant work runs at this nice value: the API and the replicas come first.
const TENANT_WORK_NICE: i32 = 10;

/// Threads that take launches.
const LAUNCH_THREADS: usize = 2;

impl Pool {
    /// `launch_nice`: the launch threads run at the replicas' nice value (`[replicas]
    /// nice`), and so do the supervisors they start (a process inherits its parent
    /// thread's): a burst of replicas starting yields the CPU to the API as the replicas'
    /// programs do, and with `nice = 0` nothing yields.
    pub fn new(backend: Arc<dyn Backend>, sink: EventSink, report: ReportSink, launch_nice: i32) -> Pool {
        let (tx, rx) = std::sync::mpsc::channel::<Work>();
        let launch_queue = Arc::new(Mutex::new(rx));
        let launchers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for i in 0..LAUNCH_THREADS {
            if let Err(e) = spawn_launcher(i, &launch_queue, &launchers, &backend, &sink, &report, launch_nice) {
                // Fewer threads only slow launches down; with none, the next launch
                // tries to start one (launches wait in the queue meanwhile).
                tracing::error!("cannot start a launch thread: {e}");
            }
        }
        let (scan_tx, scan_rx) = std::sync::mpsc::channel::<Work>();
        let scanner_report = Arc::clone(&report);
        let dumps = crate::tenant_work::Gate::new("dump", DUMPS_PER_PROJECT, DUMPS_TOTAL, TENANT_WORK_NICE, cpu_counter(&report, "dump"));
        let scanner_backend = Arc::clone(&backend);
        let scans = match std::thread::Builder::new().name("checkpoint-scan".into()).spawn(move || {
            // See `tree::private_descriptors`: the tenants' directories it opens stay its own.
            if let Err(e) = trainyard_backend::tree::private_descriptors() {
                tracing::warn!("checkpoint scans: no descriptor table of their own: {e}");
            }
            for work in scan_rx {
                // A panic (a defect) answers with nothing seen, and the thread goes on.
                let fallback = nothing_seen(&work);
                let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match work {
                    Work::Observe { job, project, checkpoints, activity } => {
                        let seen = observe(job, checkpoints.as_ref(), &activity);
                        let wanted: Vec<(String, std::path::PathBuf)> =
                            activity.iter().filter(|w| w.dump).take(DUMPED_REPLICAS).map(|w| (w.replica.clone(), w.run_dir.clone())).collect();
                        if wanted.is_empty() {
                            Some(seen)
                        } else {
                            let report = Arc::clone(&scanner_report);
                            let deadline = std::time::Instant::now() + crate::stuck::DUMP_BUDGET;
                            dumps.submit(&project, &format!("job/{job}"), Box::new(move |stop| {
                                // A dump thread that could not start: answered without dumps.
                                report(if stop.load(std::sync::atomic::Ordering::SeqCst) { seen } else { with_dumps(seen, &wanted, deadline) })
                            }));
                            None
                        }
                    }
                    Work::ReadTrialMetrics { reads, periodic } => Some(read_all_trial_metrics(reads, periodic)),
                    Work::EngineReasons(runs) => Some(engine_reasons(scanner_backend.as_ref(), runs)),
                    Work::ReadProgress(sources) => Some(read_progress(sources)),
                    _ => None,
                }))
                .unwrap_or_else(|_| {
                    tracing::error!("an observation (jobs' files, the engine's reasons) panicked; answered with nothing seen");
                    fallback
                });
                if let Some(r) = answer {
                    scanner_report(r);
                }
            }
        }) {
            Ok(handle) => (Some(Mutex::new(scan_tx)), Some(handle)),
            Err(e) => {
                // Without it, scans answer at once with nothing seen (L21 warns as if no
                // checkpoint had been written).
                tracing::error!("cannot start the checkpoint scanner thread: {e}");
                (None, None)
            }
        };
        let (scans, scanner) = scans;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let suggestions = crate::tenant_work::Gate::new("suggest", 1, cores.max(2), TENANT_WORK_NICE, cpu_counter(&report, "suggest"));
        Pool { launches: Mutex::new(tx), launch_queue, launchers, scans, scanner, backend, sink, report, launch_nice, suggestions }
    }
}

impl Drop for Pool {
    /// Ends the scanner and waits for it, so that its copy of the backend is gone before
    /// the pool's own: the last owner of the backend drops it, closing what it owns (the
    /// local backend's fork server socket), and a thread with a descriptor table of its
    /// own would close a number that is not that socket there (EBADF, which debug builds
    /// abort on, or one of its own files), leaving the socket open for good.
    fn drop(&mut self) {
        self.scans = None;
        if let Some(scanner) = self.scanner.take() {
            if scanner.thread().id() != std::thread::current().id() {
                let _ = scanner.join();
            }
        }
    }
}

fn read_all_trial_metrics(reads: Vec<MetricRead>, periodic: bool) -> Report {
    let reads = reads
        .into_iter()
        .map(|r| MetricsRead { metrics: read_trial_metrics(&r.path, &r.ids, r.start_time), study: r.study, trial: r.trial, end: r.end })
        .collect();
    Report::TrialMetrics { reads, periodic }
}

/// What a job's tick decides on (see `Work::Observe`): a bounded scan of its checkpoint
/// directory, and the latest modification time of each replica's files (looked at
/// without following a link: a tenant's link to a busy file is no activity of its own).
/// Where a running job's progress is read: its primary's progress file, and (a trial)
/// its metric file, whose cloudml-hypertune lines carry `global_step`.
#[derive(Clone, Debug)]
pub struct ProgressSource {
    pub job: u64,
    pub replica: String,
    pub progress_file: PathBuf,
    /// How much of the progress file was read before (only what it gained is read).
    pub offset: u64,
    pub metric_file: Option<PathBuf>,
}

/// The latest report of a job's progress, and the first line ignored (with why).
#[derive(Clone, Debug)]
pub struct ProgressSeen {
    pub job: u64,
    pub replica: String,
    pub report: Option<trainyard_core::progress::Report>,
    pub bad: Option<String>,
    /// How much of the progress file has been read now.
    pub offset: u64,
}

/// The most of a progress file read: its end.
const PROGRESS_TAIL: u64 = 64 * 1024;

pub fn read_progress(sources: Vec<ProgressSource>) -> Report {
    let seen = sources
        .into_iter()
        .map(|s| {
            let (mut report, bad, offset) = match crate::identity::read_tenant_since(&s.progress_file, s.offset, PROGRESS_TAIL) {
                Ok((text, offset)) => {
                    let (r, bad) = trainyard_core::progress::latest(&text, "step");
                    (r, bad, offset)
                }
                Err(_) => (None, None, s.offset),
            };
            if report.is_none() && s.offset == 0 {
                if let Some(Ok((text, _))) = s.metric_file.as_ref().map(|f| crate::identity::read_tenant_since(f, 0, PROGRESS_TAIL)) {
                    report = trainyard_core::progress::latest(&text, "global_step").0;
                }
            }
            ProgressSeen { job: s.job, replica: s.replica, report, bad, offset }
        })
        .collect();
    Report::ProgressRead(seen)
}

/// A running replica of a job that watches for hangs: the files whose writes are its
/// progress, its run directory (its processes' CPU time), and whether a stack dump is
/// taken (its silence is about to be reported).
#[derive(Clone, Debug)]
pub struct ReplicaWatch {
    pub replica: String,
    pub files: Vec<PathBuf>,
    pub run_dir: PathBuf,
    pub dump: bool,
}

/// What was seen of a replica: its latest write, its processes' CPU seconds so far, and
/// the stack dump asked for.
#[derive(Clone, Debug, Default)]
pub struct ReplicaSeen {
    pub replica: String,
    pub newest: Option<Micros>,
    pub cpu: Option<f64>,
    /// Every process of it is stopped (SIGSTOP, a debugger).
    pub stopped: bool,
    pub dump: Option<String>,
}

pub fn observe(job: u64, checkpoints: Option<&Confined>, activity: &[ReplicaWatch]) -> Report {
    let scan = checkpoints.and_then(|dir| crate::paths::newest_mtime(dir, crate::paths::SCAN_MAX_ENTRIES, crate::paths::SCAN_MAX_DEPTH));
    if scan.as_ref().is_some_and(|s| s.truncated) {
        tracing::debug!("job {job}: checkpoint scan stopped at {} entries", scan.as_ref().map_or(0, |s| s.entries));
    }
    let activity = activity
        .iter()
        .map(|w| {
            let newest = w
                .files
                .iter()
                .filter_map(|f| std::fs::symlink_metadata(f).ok()?.modified().ok())
                .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_micros().min(i64::MAX as u128) as Micros)
                .max();
            let pids = crate::stuck::replica_pids(&w.run_dir);
            let cpu = crate::stuck::cpu_seconds(&pids);
            let stopped = crate::stuck::all_stopped(&pids);
            ReplicaSeen { replica: w.replica.clone(), newest, cpu, stopped, dump: None }
        })
        .collect();
    let (newest, entries, truncated) = scan.map_or((None, 0, false), |s| (s.newest, s.entries, s.truncated));
    Report::Observed { job, newest, entries, truncated, activity }
}

/// The CPU seconds of a project's `work` (see `tenant_work`), reported for `/metrics`.
fn cpu_counter(report: &ReportSink, work: &'static str) -> crate::tenant_work::CpuCounter {
    let report = Arc::clone(report);
    Arc::new(move |project: &str, seconds| report(Report::TenantCpu { project: project.to_string(), work, seconds }))
}

/// An observation with the stack dumps of `wanted` (replica, run directory) taken by
/// `deadline` (on a dump thread: see `Work::Observe`).
fn with_dumps(mut seen: Report, wanted: &[(String, std::path::PathBuf)], deadline: std::time::Instant) -> Report {
    if let Report::Observed { activity, .. } = &mut seen {
        for (replica, dir) in wanted {
            let pids = crate::stuck::replica_pids(dir);
            let dump = crate::stuck::stack_dump(&pids, deadline);
            if let Some(a) = activity.iter_mut().find(|a| a.replica == *replica) {
                a.dump = (!dump.is_empty()).then_some(dump);
            }
        }
    }
    seen
}

/// A launch thread on `queue`, counted in `launchers` while it runs.
fn spawn_launcher(
    i: usize,
    queue: &Arc<Mutex<Receiver<Work>>>,
    launchers: &Arc<std::sync::atomic::AtomicUsize>,
    backend: &Arc<dyn Backend>,
    sink: &EventSink,
    report: &ReportSink,
    nice: i32,
) -> std::io::Result<()> {
    use std::sync::atomic::Ordering;
    let (rx, count, backend, sink, report) = (Arc::clone(queue), Arc::clone(launchers), Arc::clone(backend), sink.clone(), Arc::clone(report));
    count.fetch_add(1, Ordering::SeqCst);
    let spawned = std::thread::Builder::new().name(format!("launch-{i}")).spawn(move || {
        struct Counted(Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _counted = Counted(count);
        if nice > 0 {
            crate::priority::lower_this_thread(nice);
        }
        launch_worker(&rx, &backend, &sink, &report);
    });
    if spawned.is_err() {
        launchers.fetch_sub(1, Ordering::SeqCst);
    }
    spawned.map(|_| ())
}

fn launch_worker(rx: &Mutex<Receiver<Work>>, backend: &Arc<dyn Backend>, sink: &EventSink, report: &ReportSink) {
    loop {
        let work = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match work {
            Ok(work) => launch_guarded(work, backend, sink, report),
            Err(_) => return,
        }
    }
}

/// The runs of a launch and their outbox entries.
fn planned_runs(work: &Work) -> Vec<(RunId, i64)> {
    match work {
        Work::Launch(ps) => ps.iter().map(|p| (p.launch.run.clone(), p.seq)).collect(),
        _ => Vec::new(),
    }
}

/// A launch whose panic is its runs' launch failure (L16: Trainyard's own failure, the
/// job retried), never the end of the launch thread: the pool keeps its threads.
fn launch_guarded(work: Work, backend: &Arc<dyn Backend>, sink: &EventSink, report: &ReportSink) {
    let runs = planned_runs(&work);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(work, backend, sink, report)));
    if caught.is_err() {
        tracing::error!("a launch panicked; its runs are reported as launch failures (L16)");
        for (run, seq) in runs {
            let outcome = Outcome::LaunchFailed { message: "the launch panicked (see the server log)".into() };
            sink(BackendEvent::Exited { run, outcome, stderr_tail: Vec::new() });
            report(Report::Launched { seqs: vec![seq] });
        }
    }
}

impl Executor for Pool {
    fn submit(&self, work: Work) {
        match work {
            Work::Observe { .. } | Work::ReadTrialMetrics { .. } | Work::EngineReasons(_) | Work::ReadProgress(_) => {
                // Without the observing thread, nothing is seen (for a tick, as when an
                // observation does not come in time).
                let nothing = nothing_seen(&work);
                let sent = self.scans.as_ref().map(|tx| tx.lock().map(|tx| tx.send(work)));
                if !matches!(sent, Some(Ok(Ok(())))) {
                    if let Some(nothing) = nothing {
                        (self.report)(nothing);
                    }
                }
            }
            Work::Suggest { study, project, request } => {
                let report = Arc::clone(&self.report);
                self.suggestions.submit(&project, &suggest_key(study, false), Box::new(move |stop| report(suggest(study, &request, stop))));
            }
            Work::VizierSuggest { study, op, project, request } => {
                let report = Arc::clone(&self.report);
                self.suggestions.submit(
                    &project,
                    &suggest_key(study, true),
                    Box::new(move |stop| {
                        // A panic of the optimiser answers the request with an error instead
                        // of leaving it pending for ever.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| request.compute(stop)))
                            .unwrap_or_else(|_| Err(trainyard_tuner::TunerError::Unsupported("the optimiser panicked; see the server log".into())));
                        report(Report::VizierSuggested { study, op, result })
                    }),
                );
            }
            Work::CancelSuggest { study, vizier } => self.suggestions.cancel(&suggest_key(study, vizier)),
            Work::Launch { .. } => {
                // Never launched on the driver's thread: the launch waits in the queue
                // for a launch thread (one is started if none runs).
                if self.launchers.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    if let Err(e) = spawn_launcher(0, &self.launch_queue, &self.launchers, &self.backend, &self.sink, &self.report, self.launch_nice) {
                        tracing::error!("no launch thread, and none can be started now ({e}); launches wait");
                    }
                }
                let runs = planned_runs(&work);
                let sent = self.launches.lock().map(|tx| tx.send(work));
                if !matches!(sent, Ok(Ok(()))) {
                    // The queue cannot close (this pool holds its other end); a poisoned
                    // lock puts the runs off.
                    for (run, seq) in runs {
                        (self.report)(Report::LaunchLater { run, seq, reason: "the server's launch queue is unavailable".into() });
                    }
                }
            }
            Work::Purge { .. } | Work::PurgeLogs { .. } | Work::RemoveNetns { .. } => {
                let logs = matches!(&work, Work::PurgeLogs { .. });
                // Not the backend: a thread with a descriptor table of its own must never
                // be the one that drops what owns descriptors of the shared table (the
                // fork server's socket): its close would miss (EBADF, or another file).
                let report = Arc::clone(&self.report);
                let spawned = std::thread::Builder::new().name("purge".into()).spawn(move || {
                    // What it opens (a tenant's directories, unlinked as it goes) is never
                    // copied into a process the server forks meanwhile.
                    if let Err(e) = trainyard_backend::tree::private_descriptors() {
                        tracing::warn!("purge: no descriptor table of its own: {e}");
                    }
                    guarded(work, &report, |work| remove_files(work, &report))
                });
                if let Err(e) = spawned {
                    // A deleted job's entry stays in the outbox: the purge is done at the
                    // next start; a log sweep is done at the next one.
                    tracing::error!("cannot start a thread to remove files: {e}");
                    if logs {
                        (self.report)(Report::LogsPurged { cutoff: None });
                    }
                }
            }
            Work::Signal { .. } => {
                let (backend, report) = (Arc::clone(&self.backend), Arc::clone(&self.report));
                if let Err(e) = std::thread::Builder::new().name("signal".into()).spawn(move || guarded(work, &report, |work| run(work, &backend, &noop_sink(), &report))) {
                    tracing::warn!("cannot start a thread to send a signal: {e}");
                }
            }
            Work::KillRunsOf { .. } => {
                let (backend, report) = (Arc::clone(&self.backend), Arc::clone(&self.report));
                if let Err(e) = std::thread::Builder::new().name("kill".into()).spawn(move || run(work, &backend, &noop_sink(), &report)) {
                    tracing::error!("cannot start a thread to kill a damaged job's runs: {e}");
                }
            }
            Work::Stop { .. } | Work::Kill { .. } => {
                let (backend, report) = (Arc::clone(&self.backend), Arc::clone(&self.report));
                let (run_id, kill) = match &work {
                    Work::Stop { run, .. } => (run.clone(), false),
                    Work::Kill { run, .. } => (run.clone(), true),
                    Work::Launch { .. }
                    | Work::Signal { .. }
                    | Work::Purge { .. }
                    | Work::PurgeLogs { .. }
                    | Work::RemoveNetns { .. }
                    | Work::KillRunsOf { .. }
                    | Work::Observe { .. }
                    | Work::ReadTrialMetrics { .. }
                    | Work::EngineReasons(_)
                    | Work::ReadProgress(_)
                    | Work::Suggest { .. }
                    | Work::VizierSuggest { .. }
                    | Work::CancelSuggest { .. } => return,
                };
                let spawned = std::thread::Builder::new()
                    .name(if kill { "kill".into() } else { "stop".into() })
                    .spawn(move || guarded(work, &report, |work| run(work, &backend, &noop_sink(), &report)));
                if let Err(e) = spawned {
                    // Out of threads: the driver tries again later (L20).
                    let error = format!("cannot start a thread: {e}");
                    (self.report)(if kill {
                        Report::KillFailed { run: run_id, error }
                    } else {
                        Report::StopFailed { run: run_id, error }
                    });
                }
            }
        }
    }
}

fn noop_sink() -> EventSink {
    Arc::new(|_| {})
}

/// `body` ([`run`], or [`remove_files`]) on a thread of its own, a panic caught: logged,
/// and reported as the work's failure (a stop or kill is asked again, L20) or, for a
/// purge, as done with its files left, so that a pending effect never takes the server
/// down or keeps it from starting.
fn guarded(work: Work, report: &ReportSink, body: impl FnOnce(Work)) {
    let what = match &work {
        Work::Stop { run, .. } => Some(Report::StopFailed { run: run.clone(), error: "the stop panicked".into() }),
        Work::Kill { run, .. } => Some(Report::KillFailed { run: run.clone(), error: "the kill panicked".into() }),
        Work::Purge { seq, .. } => Some(Report::Purged { seq: *seq, error: Some("the purge panicked".into()) }),
        _ => None,
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(work)));
    if let Err(panic) = caught {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!("{} panicked: {message}", std::thread::current().name().unwrap_or("a worker"));
        if let Some(mut r) = what {
            if let Report::Purged { error: Some(e), .. } = &mut r {
                e.push_str(&format!(": {message}"));
            }
            report(r);
        }
    }
}

/// Carry one piece of work out and report it.
pub fn run(work: Work, backend: &Arc<dyn Backend>, sink: &EventSink, report: &ReportSink) {
    match work {
        Work::Launch(launches) => {
            let ready = launches;
            let seqs: std::collections::BTreeMap<RunId, i64> = ready.iter().map(|p| (p.launch.run.clone(), p.seq)).collect();
            let mut runs = Vec::with_capacity(ready.len());
            for p in ready {
                match p.launch_after_dirs() {
                    Ok(launch) => runs.push(launch),
                    // Reported as the run's end; its outbox entry is done below.
                    Err((run, outcome)) => sink(BackendEvent::Exited { run, outcome, stderr_tail: Vec::new() }),
                }
            }
            let later = launch_ready(runs, &**backend, sink);
            let mut done = Vec::new();
            for (run, seq) in seqs {
                match later.iter().find(|(r, _)| *r == run) {
                    Some((_, reason)) => report(Report::LaunchLater { run, seq, reason: reason.clone() }),
                    None => done.push(seq),
                }
            }
            report(Report::Launched { seqs: done });
        }
        Work::Stop { run, dir } => match backend.stop(&run, dir) {
            Ok(()) => report(Report::StopSent { run }),
            Err(e) => report(Report::StopFailed { run, error: e.to_string() }),
        },
        Work::Signal { run, dir, signal, notice } => {
            if let Some((file, text)) = notice {
                if let Err(e) = trainyard_backend::write_for_tenant(&file, text.as_bytes()) {
                    tracing::warn!("{run}: the notice could not be written: {e}");
                }
            }
            if let Err(e) = backend.signal(&run, dir, signal) {
                tracing::warn!("{run}: the signal {signal} could not be sent: {e}");
            }
        }
        Work::KillRunsOf { job, data_dir } => {
            for (run, dir) in crate::datadir::runs_on_disk(&data_dir, job) {
                guarded(Work::Kill { run, dir }, report, |work| self::run(work, backend, sink, report));
            }
        }
        Work::Kill { run, dir } => match backend.kill(&run, dir) {
            Ok(()) => report(Report::Killed { run }),
            Err(e) => report(Report::KillFailed { run, error: e.to_string() }),
        },
        Work::Purge { .. } | Work::PurgeLogs { .. } | Work::RemoveNetns { .. } => remove_files(work, report),
        Work::Observe { job, checkpoints, activity, .. } => report(observe(job, checkpoints.as_ref(), &activity)),
        Work::ReadTrialMetrics { reads, periodic } => report(read_all_trial_metrics(reads, periodic)),
        Work::EngineReasons(runs) => report(engine_reasons(backend.as_ref(), runs)),
        Work::ReadProgress(sources) => report(read_progress(sources)),
        Work::Suggest { study, request, .. } => report(suggest(study, &request, &std::sync::atomic::AtomicBool::new(false))),
        Work::VizierSuggest { study, op, request, .. } => {
            report(Report::VizierSuggested { study, op, result: request.compute(&std::sync::atomic::AtomicBool::new(false)) })
        }
        Work::CancelSuggest { .. } => {}
    }
}

/// A purge of jobs' trees, a sweep of old logs, or the removal of network namespaces:
/// files only, no backend (see the purge thread in [`Pool`]'s `submit`).
fn remove_files(work: Work, report: &ReportSink) {
    match work {
        Work::Purge { seq, dirs } => {
            // Trees a job's program shaped (any depth, links, FIFOs): removed without
            // recursion and without following links.
            let mut errors = Vec::new();
            for d in &dirs {
                if let Err(e) = trainyard_backend::tree::remove_tree(d) {
                    tracing::warn!("{e}");
                    errors.push(e.to_string());
                }
            }
            report(Report::Purged { seq, error: (!errors.is_empty()).then(|| errors.join("; ")) });
        }
        Work::PurgeLogs { dirs, cutoff } => {
            for d in &dirs {
                purge_logs(d, 3);
            }
            report(Report::LogsPurged { cutoff: Some(cutoff) });
        }
        Work::RemoveNetns { dir, live, known } => {
            for id in trainyard_backend::netns::list(&dir).into_iter().filter(|id| *id <= known && !live.contains(id)) {
                if let Err(e) = trainyard_backend::netns::remove(&dir.join(id.to_string())) {
                    tracing::warn!("{e}");
                }
            }
        }
        // Not files: never sent here.
        _ => {}
    }
}

/// A study's suggestion; a tuner that panics (a defect) is an error of this suggestion.
fn suggest(study: u64, request: &crate::kinds::tuning_jobs::SuggestRequest, stop: &std::sync::atomic::AtomicBool) -> Report {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| request.run(stop)))
        .unwrap_or_else(|_| Err("the tuner panicked (see the server log)".into()));
    Report::Suggested { study, result }
}

/// What the engine says of runs that have not started yet.
fn engine_reasons(backend: &dyn Backend, runs: Vec<RunId>) -> Report {
    Report::EngineReasons(
        runs.into_iter()
            .filter_map(|run| {
                let why = backend.waiting_reason(&run)?;
                let held = backend.held_for_resources(&run);
                Some(EngineWait { run, why, held })
            })
            .collect(),
    )
}

/// Why the engine has not started a launched run: its words, and whether it holds the
/// run for resources that other work holds (see `Backend::held_for_resources`).
#[derive(Debug)]
pub struct EngineWait {
    pub run: RunId,
    pub why: String,
    pub held: bool,
}

/// The output logs (`log.jsonl`, `log.1.jsonl`) in `dir` and its directories `depth`
/// levels down (`<job>/<attempt>/<replica>/<restart>`); links are not followed.
fn purge_logs(dir: &std::path::Path, depth: u32) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        let name = e.file_name();
        if t.is_file() && (name == trainyard_backend::log::LOG_FILE || name == trainyard_backend::log::ROTATED_FILE) {
            if let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!("log retention: cannot remove {}: {err}", e.path().display());
            }
        } else if t.is_dir() && depth > 0 {
            purge_logs(&e.path(), depth - 1);
        }
    }
}

impl Planned {
    /// Make the directories the run's environment names (the output directory's
    /// `model/`, `checkpoints/`, `logs/`, a trial's metric directory), each below its root
    /// without following a link; the launch itself. A link on the way (a job planted it)
    /// is the run's StartError, and nothing is made through it; other failures are
    /// logged and the run starts (its program meets them). Then the job's network
    /// namespace, when it has one; failing to make it is Trainyard's failure (L16).
    fn launch_after_dirs(mut self) -> Result<Launch, (RunId, Outcome)> {
        if let Some(dir) = &self.checkpoints {
            // A tenant's directory: listed here, off the driver's thread, bounded.
            let prefix = self.launch.spec.env.iter().find(|(k, _)| k == "AIP_CHECKPOINT_DIR").map(|(_, v)| v.clone());
            if let (Some(prefix), Some(name)) = (prefix, crate::paths::newest_entry(dir, 10_000)) {
                let value = format!("{}/{}", prefix.trim_end_matches('/'), name.to_string_lossy());
                self.launch.spec.env.push((LATEST_CHECKPOINT_ENV.to_string(), value));
            }
        }
        let start_error = |run: RunId, message: String| (run, Outcome::StartError { message });
        if let Some(message) = self.packages.iter().find_map(|p| p.check().err()) {
            return Err(start_error(self.launch.run, message));
        }
        for d in &self.dirs {
            match d.create_dir_all() {
                Ok(()) => {}
                Err(BeneathError::Symlink { at }) => {
                    let message = format!(
                        "cannot create the output directory {}: {} is a symbolic link, which the server does not follow",
                        d.path().display(),
                        d.root.join(at).display()
                    );
                    tracing::warn!("{}: {message}", self.launch.run);
                    return Err(start_error(self.launch.run, message));
                }
                Err(e) => tracing::warn!("{}: cannot create {}: {e}", self.launch.run, d.path().display()),
            }
        }
        self.apply_grants().map_err(|(run, message)| start_error(run, message))?;
        if let Some(c) = &self.credentials {
            if let Err(message) = c.write(self.launch.spec.run_as) {
                tracing::error!("{}: {message}", self.launch.run);
                return Err((self.launch.run, Outcome::LaunchFailed { message }));
            }
        }
        if let Some(h) = &self.hosts {
            if let Err(message) = h.write() {
                tracing::error!("{}: {message}", self.launch.run);
                return Err((self.launch.run, Outcome::LaunchFailed { message }));
            }
        }
        if let Some(t) = &self.trust {
            if let Err(message) = t.write() {
                tracing::error!("{}: {message}", self.launch.run);
                return Err((self.launch.run, Outcome::LaunchFailed { message }));
            }
        }
        let spec = &self.launch.spec;
        if let Some(ns) = spec.netns.as_ref().or(spec.container.as_ref().and_then(|c| c.netns.as_ref())) {
            if let Err(e) = trainyard_backend::netns::ensure(ns) {
                tracing::error!("{}: {e}", self.launch.run);
                return Err((self.launch.run, Outcome::LaunchFailed { message: e.to_string() }));
            }
        }
        Ok(self.launch)
    }

    /// The run's directories made its project's user's (`run_as`); a link on the way or
    /// any other failure is the run's StartError: the program could not work without them.
    fn apply_grants(&self) -> Result<(), (RunId, String)> {
        let Some(id) = self.launch.spec.run_as else { return Ok(()) };
        for g in &self.grants {
            if let Err(message) = g.apply(id) {
                tracing::warn!("{}: {message}", self.launch.run);
                return Err((self.launch.run.clone(), message));
            }
        }
        Ok(())
    }
}

/// L6: the runs start together; an engine that cannot take a run now (unreachable, or
/// the host out of a resource) is asked again later: those runs are returned with the
/// reason; any other failure is a launch failure of Trainyard's (L16).
fn launch_ready(runs: Vec<Launch>, backend: &dyn Backend, sink: &EventSink) -> Vec<(RunId, String)> {
    let mut later = Vec::new();
    if runs.is_empty() {
        return later;
    }
    for (run, result) in backend.launch(runs, sink.clone()) {
        match result {
            Ok(()) => {}
            Err(e) if e.is_retryable() => {
                tracing::warn!("{run}: {e}; the launch is tried again later");
                later.push((run, e.to_string()));
            }
            Err(BackendError::StartRefused { message }) => {
                tracing::info!("{run}: cannot start: {message}");
                sink(BackendEvent::Exited { run, outcome: Outcome::StartError { message }, stderr_tail: Vec::new() });
            }
            Err(e) => {
                tracing::error!("{run}: launch failed: {e}");
                sink(BackendEvent::Exited { run, outcome: Outcome::LaunchFailed { message: e.to_string() }, stderr_tail: Vec::new() });
            }
        }
    }
    later
}


#[cfg(test)]
mod tests {
    use super::*;

    /// A package is looked at by the executor before the launch: one that names nothing
    /// is the user's error naming the URI and the project; on the host a link or a FIFO is
    /// refused, in a container only a missing one (the build says the rest).
    #[test]
    fn packages_are_looked_at_before_the_launch() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("storage");
        std::fs::create_dir_all(root.join("p/b")).unwrap();
        std::fs::write(root.join("p/b/pkg.tar.gz"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("p/b/evil.tar.gz")).unwrap();
        let check = |rel: &str, on_host: bool| {
            let path = Confined::new(&root, rel).unwrap();
            PackageCheck { path, uri: format!("gs://{rel}"), project: "p".into(), index: 1, on_host }.check()
        };
        assert_eq!(check("p/b/pkg.tar.gz", true), Ok(()));
        let missing = check("p/b/none.tar.gz", false).unwrap_err();
        assert!(missing.starts_with("pythonPackageSpec.packageUris[1]: the package gs://p/b/none.tar.gz was not found in project \"p\"'s storage"), "{missing}");
        assert_eq!(check("p/b/none.tar.gz", true).unwrap_err(), missing);
        assert!(check("p/b/evil.tar.gz", true).unwrap_err().contains("symbolic link"));
        assert_eq!(check("p/b/evil.tar.gz", false), Ok(()));
    }
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    /// A backend that owns a descriptor of the shared table, as the local backend owns its
    /// fork server's socket; its engine-reason query waits to be released. Dropped, it
    /// says whether its descriptor was still its file in the dropping thread's table.
    struct Owning {
        file: Option<std::fs::File>,
        ino: u64,
        inside: Mutex<Sender<()>>,
        release: Mutex<Receiver<()>>,
        dropped: Mutex<Sender<bool>>,
    }

    impl Backend for Owning {
        fn launch(&self, runs: Vec<Launch>, _sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)> {
            runs.into_iter().map(|l| (l.run, Ok(()))).collect()
        }
        fn adopt(&self, _run: RunId, _run_dir: PathBuf, _sink: EventSink) -> Result<(), BackendError> {
            Ok(())
        }
        fn stop(&self, _run: &RunId, _run_dir: PathBuf) -> Result<(), BackendError> {
            Ok(())
        }
        fn kill(&self, _run: &RunId, _run_dir: PathBuf) -> Result<(), BackendError> {
            Ok(())
        }
        fn describe(&self) -> String {
            "owning".into()
        }
        fn waiting_reason(&self, _run: &RunId) -> Option<String> {
            let _ = self.inside.lock().unwrap().send(());
            let _ = self.release.lock().unwrap().recv();
            None
        }
    }

    impl Owning {
        /// One whose engine-reason query never waits.
        fn idle() -> Owning {
            let (inside, _) = std::sync::mpsc::channel();
            let (release_tx, release) = std::sync::mpsc::channel();
            let _ = release_tx.send(());
            std::mem::forget(release_tx);
            let (dropped, _) = std::sync::mpsc::channel();
            Owning { file: None, ino: 0, inside: Mutex::new(inside), release: Mutex::new(release), dropped: Mutex::new(dropped) }
        }
    }

    impl Drop for Owning {
        fn drop(&mut self) {
            let Some(file) = self.file.take() else { return };
            // SAFETY: fstat on a number, into a zeroed buffer of ours.
            let mut st: nix::libc::stat = unsafe { std::mem::zeroed() };
            let ours = unsafe { nix::libc::fstat(file.as_raw_fd(), &mut st) } == 0 && st.st_ino == self.ino;
            if !ours {
                // Its close would miss (and abort a debug build): the test reports it.
                std::mem::forget(file);
            }
            let _ = self.dropped.lock().unwrap().send(ours);
        }
    }

    /// The backend is dropped where its descriptors are: the scanner thread (which has a
    /// descriptor table of its own) is done with its copy before the pool's goes, even when
    /// it was still asking the engine when the pool was dropped.
    #[test]
    fn the_backend_is_never_dropped_in_a_thread_with_a_private_descriptor_table() {
        let tmp = tempfile::tempfile().unwrap();
        let ino = tmp.metadata().unwrap().ino();
        let (inside_tx, inside) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let (dropped_tx, dropped) = std::sync::mpsc::channel();
        let backend = Arc::new(Owning {
            file: Some(tmp),
            ino,
            inside: Mutex::new(inside_tx),
            release: Mutex::new(release_rx),
            dropped: Mutex::new(dropped_tx),
        });
        let pool = Pool::new(backend, noop_sink(), Arc::new(|_| {}), 0);
        pool.submit(Work::EngineReasons(vec![RunId { job: 1, attempt: 0, replica: "workerpool0-0".into(), restart: 0 }]));
        inside.recv_timeout(Duration::from_secs(10)).expect("the scanner asks the backend");
        // Released after the pool is dropped (the launch threads have let go by then).
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = release.send(());
        });
        drop(pool);
        let ours = dropped.recv_timeout(Duration::from_secs(10)).expect("the backend is dropped");
        releaser.join().unwrap();
        assert!(ours, "the backend was dropped in a thread where its descriptor is not its file");
    }

    /// A study's request: 20 random trials of a 2-parameter space, `count` suggestions
    /// (a huge count runs for ever unless stopped).
    fn request(count: usize) -> Box<crate::kinds::tuning_jobs::SuggestRequest> {
        use trainyard_tuner as tuner;
        let space = tuner::Space::new(vec![
            tuner::ParamSpec::double("x", 0.0, 1.0, tuner::Scale::Linear),
            tuner::ParamSpec::double("y", 0.0, 1.0, tuner::Scale::Linear),
        ]);
        let mut completed = Vec::new();
        for i in 0..20u32 {
            let mut a = tuner::Assignment::new();
            let (x, y) = (f64::from(i % 5) / 5.0, f64::from(i / 5) / 4.0);
            a.insert("x".into(), tuner::Value::Double(x));
            a.insert("y".into(), tuner::Value::Double(y));
            completed.push(tuner::Trial::new(a, Some((x - 0.3).powi(2) + (y - 0.6).powi(2))));
        }
        Box::new(crate::kinds::tuning_jobs::SuggestRequest {
            space,
            algorithm: tuner::Algorithm::Unspecified,
            goal: tuner::Goal::Minimize,
            completed,
            pending: Vec::new(),
            count,
            seed: 7,
            noise: tuner::Noise::Unspecified,
        })
    }

    /// The next report other than CPU counts.
    fn answer(rx: &Receiver<Report>, wait: Duration) -> Result<Report, std::sync::mpsc::RecvTimeoutError> {
        let until = std::time::Instant::now() + wait;
        loop {
            match rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now()))? {
                Report::TenantCpu { .. } => continue,
                other => return Ok(other),
            }
        }
    }

    /// A project's endless suggestion holds only its own turn: another project's study is
    /// answered meanwhile, and the endless one stops once its study is deleted (answered
    /// with a cancellation).
    #[test]
    fn a_deleted_studys_suggestion_stops_and_another_projects_goes_on_meanwhile() {
        let (tx, rx) = std::sync::mpsc::channel::<Report>();
        let tx = Mutex::new(tx);
        let report: ReportSink = Arc::new(move |r| {
            let _ = tx.lock().unwrap().send(r);
        });
        let backend = Arc::new(Owning::idle());
        let pool = Pool::new(backend, noop_sink(), report, 0);
        pool.submit(Work::VizierSuggest { study: 1, op: 10, project: "evil".into(), request: request(1_000_000) });
        pool.submit(Work::Suggest { study: 2, project: "evil".into(), request: request(1) });
        pool.submit(Work::Suggest { study: 3, project: "victim".into(), request: request(1) });
        match answer(&rx, Duration::from_secs(60)).expect("the victim's answer") {
            Report::Suggested { study: 3, result: Ok(v) } => assert_eq!(v.len(), 1),
            other => panic!("the victim's study is answered first: {other:?}"),
        }
        assert!(answer(&rx, Duration::from_millis(300)).is_err(), "the evil project's second study waits for its turn");
        pool.submit(Work::CancelSuggest { study: 1, vizier: true });
        match answer(&rx, Duration::from_secs(60)).expect("the cancelled answer") {
            Report::VizierSuggested { study: 1, op: 10, result } => assert_eq!(result, Err(trainyard_tuner::TunerError::Cancelled)),
            other => panic!("{other:?}"),
        }
        match answer(&rx, Duration::from_secs(60)).expect("the next in line") {
            Report::Suggested { study: 2, result: Ok(v) } => assert_eq!(v.len(), 1),
            other => panic!("{other:?}"),
        }
    }
}
