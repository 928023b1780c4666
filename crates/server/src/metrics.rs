//! Prometheus metrics at `GET /metrics`. The driver keeps the counters, gauges and
//! histograms up to date as jobs change state (nothing is read from the store at a scrape),
//! and the HTTP layer times each request by its route template; a scrape only encodes what
//! is already counted, so its cost does not depend on how many jobs are stored.
//!
//! The exposition is OpenMetrics text when the scraper asks for it (`Accept:
//! application/openmetrics-text`, as Prometheus does), else the Prometheus text format
//! 0.0.4 (counters named with their `_total` suffix, no `# UNIT` and `# EOF` lines).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, State};
use axum::response::Response;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use trainyard_core::job::{ReplicaState, Retries};
use trainyard_core::schedule::Fleet;
use trainyard_core::{Job, RunId, State as JobState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub project: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EffectLabels {
    pub effect: String,
}

/// Panics of the process's threads, counted by the hook [`count_panics`] installs.
static PANICS: std::sync::LazyLock<Counter> = std::sync::LazyLock::new(Counter::default);

/// Count every panic of the process (`trainyard_panics_total`), after the hook in place
/// has reported it. Installed once per process.
pub fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            PANICS.inc();
        }));
    });
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantWorkLabels {
    pub project: String,
    pub work: String,
}

/// Goodput (TY10): where ended jobs' time went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GoodputLabels {
    pub project: String,
    /// queued, starting, productive, idle or lost.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecLabels {
    pub project: String,
    /// `exited`, `refused` (the replica could not be entered), `idle`, `replica_ended`,
    /// `disconnected`, `server_stopped`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceleratorLabels {
    pub node: String,
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabels {
    pub project: String,
    pub job: String,
    pub replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageLabels {
    pub project: String,
    /// The accelerator type; empty for replicas without one.
    pub accelerator: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobIdLabels {
    pub project: String,
    pub job: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The usage ledger's totals by project and accelerator type (see `accounting`): they
/// move as usage is stored, and start from the stored totals at a start.
#[derive(Default)]
struct UsageCounters {
    cpu: Family<UsageLabels, FloatCounter>,
    accelerator: Family<UsageLabels, FloatCounter>,
    memory_gb: Family<UsageLabels, FloatCounter>,
    used_cpu: Family<UsageLabels, FloatCounter>,
    used_memory_gb: Family<UsageLabels, FloatCounter>,
    preemptions: Family<UsageLabels, Counter>,
    lost_accelerator: Family<UsageLabels, FloatCounter>,
}

impl UsageCounters {
    fn register(&self, r: &mut Registry) {
        r.register_with_unit("usage_cpu", "CPU time reserved by jobs (CPUs held x time), by project and accelerator type", Unit::Seconds, self.cpu.clone());
        r.register_with_unit("usage_accelerator", "Accelerator time reserved by jobs (GPUs held x time)", Unit::Seconds, self.accelerator.clone());
        r.register("usage_memory_gb_seconds", "Memory reserved by jobs, GB x seconds", self.memory_gb.clone());
        r.register_with_unit("usage_used_cpu", "CPU time jobs used, where their cgroups account it", Unit::Seconds, self.used_cpu.clone());
        r.register("usage_used_memory_gb_seconds", "Memory jobs used, GB x seconds, where their cgroups say", self.used_memory_gb.clone());
        r.register("usage_preemptions", "Preemptions of jobs (SPOT, priority, reclaim)", self.preemptions.clone());
        r.register_with_unit(
            "usage_lost_accelerator",
            "Accelerator time of work lost by preemptions (since each job's last checkpoint)",
            Unit::Seconds,
            self.lost_accelerator.clone(),
        );
    }

    fn add(&self, rows: &[crate::accounting::UsageRow]) {
        for r in rows {
            let l = UsageLabels { project: r.project.clone(), accelerator: r.accelerator.clone() };
            let a = &r.amounts;
            self.cpu.get_or_create(&l).inc_by(a.cpu_seconds);
            self.accelerator.get_or_create(&l).inc_by(a.accelerator_seconds);
            self.memory_gb.get_or_create(&l).inc_by(a.memory_gb_seconds);
            self.used_cpu.get_or_create(&l).inc_by(a.used_cpu_seconds);
            self.used_memory_gb.get_or_create(&l).inc_by(a.used_memory_gb_seconds);
            self.preemptions.get_or_create(&l).inc_by(a.preemptions);
            self.lost_accelerator.get_or_create(&l).inc_by(a.lost_accelerator_seconds);
        }
    }

    fn clear(&self) {
        self.cpu.clear();
        self.accelerator.clear();
        self.memory_gb.clear();
        self.used_cpu.clear();
        self.used_memory_gb.clear();
        self.preemptions.clear();
        self.lost_accelerator.clear();
    }
}

/// The running replicas (by job: its project and runs), whose cgroups are read at a
/// scrape: memory in use, and CPU time where the cgroup accounts it (v2).
#[derive(Debug, Default)]
struct Replicas {
    data_dir: Option<PathBuf>,
    runs: Mutex<HashMap<u64, (String, Vec<RunId>)>>,
}

impl Replicas {
    fn set(&self, job: &Job) {
        let running: Vec<RunId> = job
            .replicas
            .iter()
            .filter(|r| matches!(r.state, ReplicaState::Running { .. }))
            .map(|r| RunId { job: job.id, attempt: job.attempt, replica: r.name.clone(), restart: r.restart })
            .collect();
        let Ok(mut runs) = self.runs.lock() else { return };
        if running.is_empty() {
            runs.remove(&job.id);
        } else {
            runs.insert(job.id, (job.project.clone(), running));
        }
    }

    /// (labels, memory bytes, CPU seconds) of each running replica with a cgroup.
    fn read(&self) -> Vec<(ReplicaLabels, Option<u64>, Option<f64>)> {
        let Some(data_dir) = &self.data_dir else { return Vec::new() };
        let runs: Vec<(String, RunId)> = match self.runs.lock() {
            Ok(runs) => runs.values().flat_map(|(p, rs)| rs.iter().map(move |r| (p.clone(), r.clone()))).collect(),
            Err(_) => return Vec::new(),
        };
        let mut out = Vec::with_capacity(runs.len());
        for (project, run) in runs {
            let Some((memory, cpu)) = cgroup_sample(data_dir, &run) else { continue };
            let labels = ReplicaLabels { project, job: run.job.to_string(), replica: format!("{}-a{}-r{}", run.replica, run.attempt, run.restart) };
            out.push((labels, memory, cpu));
        }
        out.sort_by(|a, b| (&a.0.job, &a.0.replica).cmp(&(&b.0.job, &b.0.replica)));
        out
    }
}

/// What a running replica's cgroup says now: memory in use (bytes) and CPU time so far
/// (seconds, where the cgroup accounts it). None: the run has no cgroup of its own.
pub fn cgroup_sample(data_dir: &std::path::Path, run: &RunId) -> Option<(Option<u64>, Option<f64>)> {
    let dir = crate::datadir::run_dir(data_dir, run);
    let spec = trainyard_backend::shim::read_spec(&dir).ok()??;
    let (base, version) = (spec.cgroup_base?, spec.cgroup_version?);
    if spec.cgroup_name.is_empty() || spec.cgroup_name.contains('/') {
        return None;
    }
    let version = trainyard_backend::cgroup::CgroupVersion::from_number(version).ok()?;
    let cg = trainyard_backend::cgroup::ReplicaCgroup::open(version, base.join(&spec.cgroup_name));
    Some((cg.memory_bytes(), cg.cpu_seconds()))
}

impl Collector for Replicas {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.read();
        if rows.iter().any(|r| r.1.is_some()) {
            let mut family = encoder.encode_descriptor(
                "replica_memory",
                "Memory in use by each running replica's cgroup (v1 memory.usage_in_bytes, v2 memory.current)",
                Some(&Unit::Bytes),
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (labels, memory, _) in &rows {
                if let Some(m) = memory {
                    ConstGauge::new(*m as i64).encode(family.encode_family(labels)?)?;
                }
            }
        }
        if rows.iter().any(|r| r.2.is_some()) {
            let mut family = encoder.encode_descriptor(
                "replica_cpu",
                "CPU time of each running replica's cgroup (v2 cpu.stat usage_usec)",
                Some(&Unit::Seconds),
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (labels, _, cpu) in &rows {
                if let Some(c) = cpu {
                    ConstCounter::new(*c).encode(family.encode_family(labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// Seconds a job waits or starts: 10 ms to about 3 hours.
fn wait_buckets() -> Histogram {
    Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 10800.0])
}

/// Seconds of an HTTP request or a store commit: 0.5 ms to 10 s.
fn short_buckets() -> Histogram {
    Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0])
}

/// Everything `/metrics` shows; shared between the driver (which writes) and the HTTP
/// layer (which times requests and renders).
pub struct Metrics {
    registry: Registry,
    jobs: Family<JobLabels, Gauge>,
    queue_length: Gauge,
    wait_seconds: Histogram,
    create_to_running_seconds: Histogram,
    replica_restarts: Family<ReasonLabels, Counter>,
    job_retries: Family<ReasonLabels, Counter>,
    oom_kills: Counter,
    hangs: Counter,
    stockouts: Counter,
    quarantines: Counter,
    quarantine_refusals: Counter,
    tenant_cpu: Family<TenantWorkLabels, FloatCounter>,
    /// Goodput of ended jobs: wall and accelerator seconds by project and kind.
    goodput: Family<GoodputLabels, FloatCounter>,
    goodput_accelerator: Family<GoodputLabels, FloatCounter>,
    /// Sessions in running replicas (`custom-jobs exec`), per project and how they ended.
    exec_sessions: Family<ExecLabels, Counter>,
    exec_open: Gauge,
    progress_step: Family<JobIdLabels, Gauge>,
    progress_ratio: Family<JobIdLabels, FloatGauge>,
    progress_rate: Family<JobIdLabels, FloatGauge>,
    effects_failed: Family<EffectLabels, Counter>,
    node_cpus: Family<NodeLabels, Gauge>,
    node_memory: Family<NodeLabels, Gauge>,
    node_accelerators: Family<AcceleratorLabels, Gauge>,
    alloc_cpus: Family<NodeLabels, Gauge>,
    alloc_memory: Family<NodeLabels, Gauge>,
    alloc_accelerators: Family<AcceleratorLabels, Gauge>,
    http: HistogramFamily<HttpLabels>,
    store_commit: HistogramFamily<OpLabels>,
    replicas: Arc<Replicas>,
    usage: UsageCounters,
    leader: Gauge,
    leader_epoch: Gauge,
    lease_age: FloatGauge,
    /// `[metrics] enabled`: when false nothing is counted and `/metrics` is 404.
    enabled: bool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Why a replica restarted, by the rule that restarted it.
pub const RESTART_FAILURE: &str = "failure";
pub const RESTART_NODE: &str = "node";
/// Why a job retried, by the kind of its retry budget (L11 and L12, L13, L15, L16).
pub const RETRY_REASONS: [&str; 4] = ["worker_restarts", "transient_exit", "stockout", "internal"];

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::with_data_dir(None)
    }

    /// With the data directory, running replicas' cgroups are read at each scrape.
    pub fn with_data_dir(data_dir: Option<PathBuf>) -> Metrics {
        let mut r = Registry::with_prefix("trainyard");
        let jobs = Family::<JobLabels, Gauge>::default();
        r.register("jobs", "Jobs (CustomJobs) by project and state: live ones and the stored ended ones", jobs.clone());
        let queue_length = Gauge::default();
        r.register("queue_length", "Jobs that wait: QUEUED (L3) and PENDING (L5)", queue_length.clone());
        let wait_seconds = wait_buckets();
        r.register_with_unit("job_wait", "Time from a job's create to its admission (quota held, L5)", Unit::Seconds, wait_seconds.clone());
        let create_to_running_seconds = wait_buckets();
        r.register_with_unit(
            "job_create_to_running",
            "Time from a job's create to its first RUNNING (L7)",
            Unit::Seconds,
            create_to_running_seconds.clone(),
        );
        let replica_restarts = Family::<ReasonLabels, Counter>::default();
        r.register(
            "replica_restarts",
            "Replica restarts: reason=failure (L10, L11: a non-permanent failure), reason=node (L9: node drain or loss)",
            replica_restarts.clone(),
        );
        let job_retries = Family::<ReasonLabels, Counter>::default();
        r.register(
            "job_retries",
            "Job retries (a new attempt) by kind: worker_restarts (L11, L12), transient_exit (L13), stockout (L15), internal (L16)",
            job_retries.clone(),
        );
        let oom_kills = Counter::default();
        r.register("oom_kills", "Replica runs ended by the kernel's OOM killer (L14)", oom_kills.clone());
        let hangs = Counter::default();
        r.register("replica_hangs", "Replica runs reported hung: silent for the allowed time (log, checkpoints, metric file)", hangs.clone());
        let stockouts = Counter::default();
        r.register("stockouts", "Placements that found no capacity (L15)", stockouts.clone());
        let quarantines = Counter::default();
        r.register("node_quarantines", "Nodes quarantined after replica failures of several projects' jobs ([fleet] quarantine_after_failures)", quarantines.clone());
        let quarantine_refusals = Counter::default();
        r.register(
            "node_quarantine_refusals",
            "Quarantines not made because no other node would have taken placements",
            quarantine_refusals.clone(),
        );
        let exec_sessions = Family::<ExecLabels, Counter>::default();
        r.register("exec_sessions", "Sessions in running replicas (custom-jobs exec) that ended, by project and outcome", exec_sessions.clone());
        let exec_open = Gauge::default();
        r.register("exec_sessions_open", "Sessions in running replicas open now", exec_open.clone());
        let tenant_cpu = Family::<TenantWorkLabels, FloatCounter>::default();
        r.register_with_unit(
            "tenant_work_cpu",
            "CPU time the server spent for a project: stack dumps of its replicas (work=dump), its studies' suggestions (work=suggest)",
            Unit::Seconds,
            tenant_cpu.clone(),
        );
        let goodput = Family::<GoodputLabels, FloatCounter>::default();
        r.register_with_unit(
            "job_goodput_wall",
            "Wall time of ended jobs by where it went (kind: queued, starting, productive, idle, lost), by project",
            Unit::Seconds,
            goodput.clone(),
        );
        let goodput_accelerator = Family::<GoodputLabels, FloatCounter>::default();
        r.register_with_unit(
            "job_goodput_accelerator",
            "Accelerator time (GPUs held x time) of ended jobs by where it went, by project",
            Unit::Seconds,
            goodput_accelerator.clone(),
        );
        let progress_step = Family::<JobIdLabels, Gauge>::default();
        r.register("job_progress_step", "The step a running job's program last reported (TRAINYARD_PROGRESS_FILE)", progress_step.clone());
        let progress_ratio = Family::<JobIdLabels, FloatGauge>::default();
        r.register("job_progress_ratio", "The step over the total a running job's program reported", progress_ratio.clone());
        let progress_rate = Family::<JobIdLabels, FloatGauge>::default();
        r.register("job_progress_steps_per_second", "A running job's steps per second over the last minute", progress_rate.clone());
        let effects_failed = Family::<EffectLabels, Counter>::default();
        r.register(
            "effects_failed",
            "Committed effects given up after their tries (effect=purge: a deleted job's files)",
            effects_failed.clone(),
        );
        let _ = effects_failed.get_or_create(&EffectLabels { effect: "purge".into() });
        r.register("panics", "Panics in the server's threads (each caught where it happened, logged with its thread)", PANICS.clone());
        let node_cpus = Family::<NodeLabels, Gauge>::default();
        r.register("node_capacity_cpus", "CPUs of each node", node_cpus.clone());
        let node_memory = Family::<NodeLabels, Gauge>::default();
        r.register_with_unit("node_capacity_memory", "Memory of each node", Unit::Bytes, node_memory.clone());
        let node_accelerators = Family::<AcceleratorLabels, Gauge>::default();
        r.register("node_capacity_accelerators", "Accelerators of each node, by type", node_accelerators.clone());
        let alloc_cpus = Family::<NodeLabels, Gauge>::default();
        r.register("node_allocated_cpus", "CPUs held by live replicas placed on each node", alloc_cpus.clone());
        let alloc_memory = Family::<NodeLabels, Gauge>::default();
        r.register_with_unit("node_allocated_memory", "Memory held by live replicas placed on each node", Unit::Bytes, alloc_memory.clone());
        let alloc_accelerators = Family::<AcceleratorLabels, Gauge>::default();
        r.register("node_allocated_accelerators", "Accelerators held by live replicas on each node, by type", alloc_accelerators.clone());
        let http: HistogramFamily<HttpLabels> = Family::new_with_constructor(short_buckets);
        r.register_with_unit(
            "http_request_duration",
            "HTTP requests by method, route template and status code",
            Unit::Seconds,
            http.clone(),
        );
        let store_commit: HistogramFamily<OpLabels> = Family::new_with_constructor(short_buckets);
        r.register_with_unit(
            "store_commit_duration",
            "Store transactions of the driver (commit, commit_many, insert_jobs), each with its fsync",
            Unit::Seconds,
            store_commit.clone(),
        );
        // Every reason shows from the start (at 0), so that rates work from the first scrape.
        for reason in [RESTART_FAILURE, RESTART_NODE] {
            let _ = replica_restarts.get_or_create(&ReasonLabels { reason: reason.to_string() });
        }
        for reason in RETRY_REASONS {
            let _ = job_retries.get_or_create(&ReasonLabels { reason: reason.to_string() });
        }
        let usage = UsageCounters::default();
        usage.register(&mut r);
        let leader = Gauge::default();
        r.register("leader", "1 while this server leads the store (runs the driver), 0 while it follows", leader.clone());
        let leader_epoch = Gauge::default();
        r.register("leader_epoch", "The epoch of the store's lease as this server last saw it (several servers on one store)", leader_epoch.clone());
        let lease_age = FloatGauge::default();
        r.register_with_unit("lease_age", "Time since the leader last renewed its lease", Unit::Seconds, lease_age.clone());
        let replicas = Arc::new(Replicas { data_dir, runs: Mutex::new(HashMap::new()) });
        r.register_collector(Box::new(Arc::clone(&replicas)));
        Metrics {
            registry: r,
            jobs,
            queue_length,
            wait_seconds,
            create_to_running_seconds,
            replica_restarts,
            job_retries,
            oom_kills,
            hangs,
            stockouts,
            quarantines,
            quarantine_refusals,
            tenant_cpu,
            goodput,
            goodput_accelerator,
            exec_sessions,
            exec_open,
            progress_step,
            progress_ratio,
            progress_rate,
            effects_failed,
            node_cpus,
            node_memory,
            node_accelerators,
            alloc_cpus,
            alloc_memory,
            alloc_accelerators,
            http,
            store_commit,
            replicas,
            usage,
            leader,
            leader_epoch,
            lease_age,
            enabled: true,
        }
    }

    /// The store's lease as this server sees it (several servers on one store).
    pub fn lease(&self, epoch: i64, leading: bool, age_secs: f64) {
        if !self.enabled {
            return;
        }
        self.leader.set(leading.into());
        self.leader_epoch.set(epoch);
        self.lease_age.set(age_secs);
    }

    /// Metrics turned off (`[metrics] enabled = false`): every update returns at once, the
    /// HTTP layer times nothing, and `/metrics` answers 404.
    pub fn disabled() -> Metrics {
        Metrics { enabled: false, ..Metrics::new() }
    }

    /// The exposition in the OpenMetrics text format.
    pub fn render_openmetrics(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition in the Prometheus text format 0.0.4.
    /// `[metrics] enabled`.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn render_text(&self) -> String {
        to_text_format(&self.render_openmetrics())
    }

    // --- jobs (the driver) ---

    /// Forget the job counts (the driver counts them again, as at a start).
    pub fn reset_jobs(&self) {
        if !self.enabled {
            return;
        }
        self.jobs.clear();
        self.queue_length.set(0);
        self.alloc_cpus.clear();
        self.alloc_memory.clear();
        self.alloc_accelerators.clear();
        if let Ok(mut runs) = self.replicas.runs.lock() {
            runs.clear();
        }
    }

    /// Usage stored now (added to the totals by project and accelerator type).
    pub fn usage_stored(&self, rows: &[crate::accounting::UsageRow]) {
        if self.enabled {
            self.usage.add(rows);
        }
    }

    /// The stored usage totals, at a start.
    pub fn usage_totals(&self, rows: &[crate::accounting::UsageRow]) {
        if self.enabled {
            self.usage.clear();
            self.usage.add(rows);
        }
    }

    /// Ended jobs as stored, counted once at a start.
    pub fn add_ended(&self, project: &str, state: &str, n: i64) {
        if !self.enabled {
            return;
        }
        self.jobs.get_or_create(&JobLabels { project: project.to_string(), state: state.to_string() }).inc_by(n);
    }

    /// An ended job was deleted.
    pub fn deleted(&self, project: &str, state: JobState) {
        if !self.enabled {
            return;
        }
        self.job_gauge_add(project, state, -1);
    }

    /// A job's state changed from `old` (None: it is new to the driver) to `new`; counts
    /// it, with its waits, restarts, retries and placements.
    pub fn job_changed(&self, old: Option<&Job>, new: &Job) {
        if !self.enabled {
            return;
        }
        // Hangs reported by this change.
        for r in &new.replicas {
            let was = old.and_then(|o| o.replica(&r.name)).and_then(|o| o.hung_since);
            if r.hung_since.is_some() && r.hung_since != was {
                self.hangs.inc();
            }
        }
        let (before, after) = (old.map(|j| j.state()), new.state());
        if before != Some(after) {
            if let Some(b) = before {
                self.job_gauge_add(&new.project, b, -1);
                if waits(b) {
                    self.queue_length.dec();
                }
            }
            self.job_gauge_add(&new.project, after, 1);
            if waits(after) {
                self.queue_length.inc();
            }
        }
        self.replicas.set(new);
        let Some(old) = old else {
            self.allocate(new, 1);
            return;
        };
        if matches!(old.phase, trainyard_core::Phase::Queued) && new.attempt == 0 {
            if let Some(at) = new.admitted_at() {
                self.wait_seconds.observe(seconds(at - new.create_time));
            }
        }
        if old.start_time.is_none() {
            if let Some(at) = new.start_time {
                self.create_to_running_seconds.observe(seconds(at - new.create_time));
            }
        }
        self.retries(&old.retries, &new.retries);
        if new.is_terminal() && !old.is_terminal() {
            self.goodput_of(new);
        }
        if old.attempt == new.attempt {
            for (a, b) in old.replicas.iter().zip(&new.replicas) {
                if b.restart > a.restart {
                    let reason = if b.failures > a.failures { RESTART_FAILURE } else { RESTART_NODE };
                    self.replica_restarts
                        .get_or_create(&ReasonLabels { reason: reason.to_string() })
                        .inc_by(u64::from(b.restart - a.restart));
                }
            }
        }
        self.allocate(old, -1);
        self.allocate(new, 1);
    }

    fn job_gauge_add(&self, project: &str, state: JobState, n: i64) {
        self.jobs.get_or_create(&JobLabels { project: project.to_string(), state: state.wire_name().to_string() }).inc_by(n);
    }

    fn retries(&self, old: &Retries, new: &Retries) {
        let moved = [
            (old.worker_restarts, new.worker_restarts),
            (old.transient_exit, new.transient_exit),
            (old.stockout, new.stockout),
            (old.internal, new.internal),
        ];
        for (reason, (a, b)) in RETRY_REASONS.into_iter().zip(moved) {
            if b > a {
                self.job_retries.get_or_create(&ReasonLabels { reason: reason.to_string() }).inc_by(u64::from(b - a));
            }
        }
    }

    /// Add (`sign` 1) or take away (-1) what a job's live replicas hold on their nodes.
    fn allocate(&self, job: &Job, sign: i64) {
        if !job.holds_capacity() {
            return;
        }
        for (r, d) in job.replicas.iter().zip(&job.demand.replicas) {
            let node = match (&r.state, &r.node) {
                (s, Some(n)) if s.is_live() => n,
                (ReplicaState::Stopping { .. }, Some(n)) => n,
                _ => continue,
            };
            let labels = NodeLabels { node: node.clone() };
            self.alloc_cpus.get_or_create(&labels).inc_by(sign * i64::from(d.cpus));
            self.alloc_memory.get_or_create(&labels).inc_by(sign * d.memory_bytes as i64);
            if let Some((kind, n)) = &d.accelerator {
                self.alloc_accelerators
                    .get_or_create(&AcceleratorLabels { node: node.clone(), r#type: kind.clone() })
                    .inc_by(sign * i64::from(*n));
            }
        }
    }

    /// Running jobs' progress as measured; jobs not listed have none any more.
    pub fn set_progress(&self, jobs: &[(JobIdLabels, trainyard_core::progress::View)]) {
        if !self.enabled {
            return;
        }
        self.progress_step.clear();
        self.progress_ratio.clear();
        self.progress_rate.clear();
        for (l, v) in jobs {
            self.progress_step.get_or_create(l).set(v.step);
            if let Some(t) = v.total.filter(|t| *t > 0) {
                self.progress_ratio.get_or_create(l).set(v.step as f64 / t as f64);
            }
            if let Some(r) = v.steps_per_second {
                self.progress_rate.get_or_create(l).set(r);
            }
        }
    }

    /// A node was quarantined.
    pub fn node_quarantined(&self) {
        if self.enabled {
            self.quarantines.inc();
        }
    }

    /// A quarantine was refused: the node was the last usable one.
    pub fn quarantine_refused(&self) {
        if self.enabled {
            self.quarantine_refusals.inc();
        }
    }

    /// CPU seconds the server spent on `work` for `project` (see `tenant_work`).
    /// TY10: an ended job's goodput, counted once.
    fn goodput_of(&self, job: &Job) {
        let g = &job.goodput;
        for (family, split) in [(&self.goodput, &g.wall), (&self.goodput_accelerator, &g.accelerator)] {
            for (kind, us) in [("queued", split.queued), ("starting", split.starting), ("productive", split.productive), ("idle", split.idle), ("lost", split.lost)] {
                family.get_or_create(&GoodputLabels { project: job.project.clone(), kind: kind.into() }).inc_by(seconds(us));
            }
        }
    }

    pub fn tenant_cpu(&self, project: &str, work: &str, seconds: f64) {
        if self.enabled && seconds > 0.0 {
            self.tenant_cpu.get_or_create(&TenantWorkLabels { project: project.to_string(), work: work.to_string() }).inc_by(seconds);
        }
    }

    /// L14: a replica's run was OOM-killed.
    pub fn oom_killed(&self) {
        if !self.enabled {
            return;
        }
        self.oom_kills.inc();
    }

    /// A committed effect was given up after its tries.
    pub fn effect_failed(&self, effect: &str) {
        if !self.enabled {
            return;
        }
        self.effects_failed.get_or_create(&EffectLabels { effect: effect.to_string() }).inc();
    }

    /// L15: a placement found no capacity.
    /// A session in a running replica opened (`custom-jobs exec`).
    pub fn exec_opened(&self) {
        if self.enabled {
            self.exec_open.inc();
        }
    }

    /// A session ended (`outcome`: see [`ExecLabels`]); `opened`: it had been counted open.
    pub fn exec_ended(&self, project: &str, outcome: &str, opened: bool) {
        if !self.enabled {
            return;
        }
        if opened {
            self.exec_open.dec();
        }
        self.exec_sessions.get_or_create(&ExecLabels { project: project.to_string(), outcome: outcome.to_string() }).inc();
    }

    pub fn stockout(&self) {
        if !self.enabled {
            return;
        }
        self.stockouts.inc();
    }

    /// The nodes' capacity (the fleet's nodes, each resource).
    pub fn set_fleet(&self, fleet: &Fleet) {
        if !self.enabled {
            return;
        }
        self.node_cpus.clear();
        self.node_memory.clear();
        self.node_accelerators.clear();
        for n in &fleet.nodes {
            let labels = NodeLabels { node: n.name.clone() };
            self.node_cpus.get_or_create(&labels).set(i64::from(n.cpus));
            self.node_memory.get_or_create(&labels).set(n.memory_bytes as i64);
            for (kind, count) in &n.accelerators {
                self.node_accelerators
                    .get_or_create(&AcceleratorLabels { node: n.name.clone(), r#type: kind.clone() })
                    .set(i64::from(*count));
            }
        }
    }

    /// A store transaction of the driver took `took`.
    pub fn store_commit(&self, op: &str, took: Duration) {
        if !self.enabled {
            return;
        }
        self.store_commit.get_or_create(&OpLabels { op: op.to_string() }).observe(took.as_secs_f64());
    }

    /// An HTTP request was answered.
    pub fn http_request(&self, method: &str, route: &str, code: u16, took: Duration) {
        if !self.enabled {
            return;
        }
        self.http
            .get_or_create(&HttpLabels { method: method.to_string(), route: route.to_string(), code: code.to_string() })
            .observe(took.as_secs_f64());
    }
}

fn waits(s: JobState) -> bool {
    matches!(s, JobState::Queued | JobState::Pending)
}

fn seconds(micros: i64) -> f64 {
    micros.max(0) as f64 / 1e6
}

/// OpenMetrics text into the Prometheus text format 0.0.4: a counter's family takes the
/// name of its `_total` sample, `# UNIT` and `# EOF` go.
pub fn to_text_format(open: &str) -> String {
    let lines: Vec<&str> = open.lines().collect();
    let mut counters = std::collections::HashSet::new();
    for l in &lines {
        if let Some(name) = l.strip_prefix("# TYPE ").and_then(|r| r.strip_suffix(" counter")) {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(open.len());
    for l in lines {
        if l.starts_with("# UNIT ") || l == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find(|p| l.starts_with(p));
        if let Some(prefix) = meta {
            let rest = &l[prefix.len()..];
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) && !name.ends_with("_total") {
                out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                continue;
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}


/// A request made by the gRPC bridge for an RPC (its path, `/SERVICE/METHOD`): counted
/// under method `GRPC` and the RPC's path, one series per RPC.
#[derive(Clone, Debug)]
pub struct GrpcMethod(pub String);

/// Middleware: the duration of each request by method, route template (axum's
/// `MatchedPath`; `unmatched` for a path no route has) and status code; a gRPC call's
/// by `GRPC` and its RPC's path.
pub async fn track_http(State(metrics): State<Arc<Metrics>>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if !metrics.enabled {
        return next.run(req).await;
    }
    let began = Instant::now();
    // A known method, or `other`: a client cannot make new series with made-up methods.
    let method = match req.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS") => m,
        _ => "other",
    }
    .to_string();
    let mut route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let mut method = method;
    if let Some(rpc) = req.extensions().get::<GrpcMethod>() {
        method = "GRPC".to_string();
        route = rpc.0.clone();
    }
    let resp = next.run(req).await;
    metrics.http_request(&method, &route, resp.status().as_u16(), began.elapsed());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use trainyard_core::job::{Demand, Policy, ReplicaDemand};

    fn panics_shown(m: &Metrics) -> u64 {
        let text = m.render_text();
        let line = text.lines().find(|l| l.starts_with("trainyard_panics_total ")).unwrap_or_else(|| panic!("{text}"));
        line.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    }

    /// A panic of any thread is counted, once the hook is in place; the thread's panic
    /// stays its own (the process goes on).
    #[test]
    fn panics_of_threads_are_counted() {
        count_panics();
        let m = Metrics::new();
        let before = panics_shown(&m);
        let joined = std::thread::Builder::new().name("doomed".into()).spawn(|| panic!("on purpose")).unwrap().join();
        assert!(joined.is_err());
        assert!(panics_shown(&m) > before, "{}", m.render_text());
    }

    fn job(project: &str) -> Job {
        let demand = Demand {
            metrics: BTreeMap::new(),
            replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 1 << 30, accelerator: Some(("NVIDIA_TESLA_T4".into(), 1)) }],
        };
        Job::new(7, project.into(), "us-central1".into(), &[1], demand, Policy::defaults(&trainyard_core::Settings::default()), false, 1_000_000)
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn states_queue_waits_and_allocation_follow_the_job() {
        let m = Metrics::new();
        let mut j = job("research");
        m.job_changed(None, &j);
        let t = m.render_text();
        assert_eq!(sample(&t, r#"trainyard_jobs{project="research",state="JOB_STATE_QUEUED"}"#), Some(1.0));
        assert_eq!(sample(&t, "trainyard_queue_length"), Some(1.0));

        let old = j.clone();
        j.phase = trainyard_core::Phase::Running { admitted_at: 3_000_000 };
        j.start_time = Some(4_000_000);
        j.replicas[0].node = Some("n1".into());
        j.replicas[0].state = ReplicaState::Running { since: 4_000_000 };
        m.job_changed(Some(&old), &j);
        let t = m.render_text();
        assert_eq!(sample(&t, r#"trainyard_jobs{project="research",state="JOB_STATE_QUEUED"}"#), Some(0.0));
        assert_eq!(sample(&t, r#"trainyard_jobs{project="research",state="JOB_STATE_RUNNING"}"#), Some(1.0));
        assert_eq!(sample(&t, "trainyard_queue_length"), Some(0.0));
        assert_eq!(sample(&t, "trainyard_job_wait_seconds_sum"), Some(2.0));
        assert_eq!(sample(&t, "trainyard_job_create_to_running_seconds_sum"), Some(3.0));
        assert_eq!(sample(&t, r#"trainyard_node_allocated_cpus{node="n1"}"#), Some(4.0));
        assert_eq!(sample(&t, r#"trainyard_node_allocated_memory_bytes{node="n1"}"#), Some((1u64 << 30) as f64));
        assert_eq!(sample(&t, r#"trainyard_node_allocated_accelerators{node="n1",type="NVIDIA_TESLA_T4"}"#), Some(1.0));

        // L10: a failure restarts the replica; L13: a transient exit retries the job.
        let old = j.clone();
        j.replicas[0].restart += 1;
        j.replicas[0].failures += 1;
        j.retries.transient_exit += 1;
        m.job_changed(Some(&old), &j);
        let old = j.clone();
        j.phase = trainyard_core::Phase::Succeeded { end: 9_000_000 };
        j.replicas[0].state = ReplicaState::Done;
        j.goodput.wall.productive = 5_000_000;
        j.goodput.accelerator.lost = 2_000_000;
        m.job_changed(Some(&old), &j);
        // TY10: an ended job's goodput is counted once, by project and kind.
        m.job_changed(Some(&j), &j);
        let t = m.render_text();
        assert_eq!(sample(&t, r#"trainyard_job_goodput_wall_seconds_total{project="research",kind="productive"}"#), Some(5.0), "{t}");
        assert_eq!(sample(&t, r#"trainyard_job_goodput_accelerator_seconds_total{project="research",kind="lost"}"#), Some(2.0));
        assert_eq!(sample(&t, r#"trainyard_replica_restarts_total{reason="failure"}"#), Some(1.0));
        assert_eq!(sample(&t, r#"trainyard_job_retries_total{reason="transient_exit"}"#), Some(1.0));
        assert_eq!(sample(&t, r#"trainyard_jobs{project="research",state="JOB_STATE_SUCCEEDED"}"#), Some(1.0));
        assert_eq!(sample(&t, r#"trainyard_node_allocated_cpus{node="n1"}"#), Some(0.0));
        // Only the first admission and the first RUNNING are observed.
        assert_eq!(sample(&t, "trainyard_job_wait_seconds_count"), Some(1.0));
        assert_eq!(sample(&t, "trainyard_job_create_to_running_seconds_count"), Some(1.0));

        m.deleted("research", JobState::Succeeded);
        let t = m.render_text();
        assert_eq!(sample(&t, r#"trainyard_jobs{project="research",state="JOB_STATE_SUCCEEDED"}"#), Some(0.0));
    }

    #[test]
    fn text_format_names_counters_by_their_total_and_drops_openmetrics_lines() {
        let m = Metrics::new();
        m.oom_killed();
        m.stockout();
        m.http_request("GET", "/healthz", 200, Duration::from_millis(3));
        m.store_commit("commit", Duration::from_micros(800));
        let open = m.render_openmetrics();
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert!(open.contains("# TYPE trainyard_oom_kills counter"), "{open}");
        let t = m.render_text();
        assert!(t.contains("# HELP trainyard_oom_kills_total "), "{t}");
        assert!(t.contains("# TYPE trainyard_oom_kills_total counter"), "{t}");
        assert!(!t.contains("# EOF") && !t.contains("# UNIT"), "{t}");
        assert_eq!(sample(&t, "trainyard_oom_kills_total"), Some(1.0));
        assert_eq!(sample(&t, "trainyard_stockouts_total"), Some(1.0));
        assert_eq!(sample(&t, r#"trainyard_http_request_duration_seconds_count{method="GET",route="/healthz",code="200"}"#), Some(1.0));
        assert_eq!(sample(&t, r#"trainyard_store_commit_duration_seconds_bucket{le="0.001",op="commit"}"#), Some(1.0));
        // Every sample line belongs to a family declared by a TYPE line before it.
        let mut declared = Vec::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap_or("").to_string());
            } else if !l.starts_with('#') && !l.is_empty() {
                let name = l.split(['{', ' ']).next().unwrap_or("");
                let family = declared.last().map(String::as_str).unwrap_or("");
                let ok = name == family || ["_bucket", "_sum", "_count"].iter().any(|s| name.strip_suffix(s) == Some(family));
                assert!(ok, "{name} after TYPE {family}");
            }
        }
    }

    #[test]
    fn running_replicas_memory_and_cpu_from_their_cgroups() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let cgroups = tmp.path().join("cgroup");
        let m = Metrics::with_data_dir(Some(data.clone()));
        let mut j = job("research");
        j.phase = trainyard_core::Phase::Running { admitted_at: 2_000_000 };
        j.replicas[0].node = Some("n1".into());
        j.replicas[0].state = ReplicaState::Running { since: 3_000_000 };
        let run = RunId { job: j.id, attempt: 0, replica: "workerpool0-0".into(), restart: 0 };
        let dir = crate::datadir::run_dir(&data, &run);
        std::fs::create_dir_all(&dir).expect("run dir");
        std::fs::create_dir_all(cgroups.join("cg7")).expect("cgroup");
        let spec = serde_json::json!({"argv": ["true"], "env": [], "cgroup_base": cgroups, "cgroup_version": 2, "cgroup_name": "cg7"});
        std::fs::write(dir.join("spec.json"), spec.to_string()).expect("spec");
        std::fs::write(cgroups.join("cg7/memory.current"), "123456789\n").expect("memory");
        std::fs::write(cgroups.join("cg7/cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\n").expect("cpu");
        m.job_changed(None, &j);
        let t = m.render_text();
        let series = r#"{project="research",job="7",replica="workerpool0-0-a0-r0"}"#;
        assert_eq!(sample(&t, &format!("trainyard_replica_memory_bytes{series}")), Some(123456789.0), "{t}");
        assert_eq!(sample(&t, &format!("trainyard_replica_cpu_seconds_total{series}")), Some(2.5), "{t}");
        assert!(t.contains("# TYPE trainyard_replica_cpu_seconds_total counter"), "{t}");
        // Ended: its series go.
        let old = j.clone();
        j.phase = trainyard_core::Phase::Succeeded { end: 9_000_000 };
        j.replicas[0].state = ReplicaState::Done;
        m.job_changed(Some(&old), &j);
        assert!(!m.render_text().contains("trainyard_replica_memory_bytes"));
    }

    #[test]
    fn fleet_capacity_by_resource() {
        let m = Metrics::new();
        let fleet = Fleet {
            nodes: vec![trainyard_core::schedule::Node {
                name: "gpu1".into(),
                cpus: 32,
                memory_bytes: 128 << 30,
                accelerators: BTreeMap::from([("NVIDIA_TESLA_A100".to_string(), 8)]),
                up: true,
                schedulable: true,
            }],
            overcommit: false,
        };
        m.set_fleet(&fleet);
        let t = m.render_text();
        assert_eq!(sample(&t, r#"trainyard_node_capacity_cpus{node="gpu1"}"#), Some(32.0));
        assert_eq!(sample(&t, r#"trainyard_node_capacity_memory_bytes{node="gpu1"}"#), Some((128u64 << 30) as f64));
        assert_eq!(sample(&t, r#"trainyard_node_capacity_accelerators{node="gpu1",type="NVIDIA_TESLA_A100"}"#), Some(8.0));
    }
}
