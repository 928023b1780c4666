//! A discrete-event simulator for the Trainyard scheduler.
//!
//! It runs the scheduler's pure admission round (`trainyard_core::schedule::plan`, the
//! function behind `schedule`) on a fleet of GPU nodes and a workload, with a minimal job
//! lifecycle: submitted (QUEUED) → placed (all replicas at once) → ended (success, early
//! exit, or killed at its time limit, L19); a preempted SPOT job stops after the grace
//! period and waits to be placed again, resuming from its last checkpoint. The capacity
//! state is kept incrementally (`Cluster::start`/`finish`), as a long-lived server would.
//!
//! [`engine`] runs the same rounds with the real lifecycle instead of this model: every
//! job a `trainyard_core::Job` driven by `step`, with faults (restarts, retries, OOM
//! kills), timeouts and preemptions by the rules.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::time::Instant;

use trainyard_core::capacity::{Need, NodeIx, Shape};
use trainyard_core::job::{ReplicaDemand, Micros, HOUR, MINUTE, SECOND};
use trainyard_core::schedule::{plan, Cluster, Decision, Fleet, Node, Quotas, Request, SchedulerConfig};

pub mod engine;
pub mod guarantee;

pub const ACCEL: &str = "NVIDIA_H100_80GB";
pub const GPUS_PER_NODE: u32 = 8;

/// One job of the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    pub id: u64,
    pub submit: Micros,
    /// How long it runs if nothing stops it.
    pub duration: Micros,
    /// Its time limit (the user's estimate; the scheduler sees only this).
    pub limit: Micros,
    pub replicas: u32,
    pub gpus_per_replica: u32,
    pub project: String,
    pub spot: bool,
    /// Its priority class's value (0 unless the workload gives classes).
    pub priority: i64,
}

impl SimJob {
    pub fn gpus(&self) -> u64 {
        self.replicas as u64 * self.gpus_per_replica as u64
    }
}

/// Size classes of the report.
pub const CLASSES: [&str; 4] = ["1 GPU", "2-8", "9-64", ">64"];

pub fn class_of(gpus: u64) -> usize {
    match gpus {
        0..=1 => 0,
        2..=8 => 1,
        9..=64 => 2,
        _ => 3,
    }
}

/// The project's one seeded generator: a printed seed replays a workload exactly.
pub use trainyard_core::rng::Rng;

/// Synthetic workload shaped like published GPU-cluster traces (Philly, Helios): most jobs
/// are short single-GPU jobs, a long tail of multi-node gangs of 8-GPU replicas holds most
/// GPU time, arrivals follow a daily cycle, some jobs fail or exit early, users
/// over-estimate their time limits, and projects differ in volume and job sizes. The
/// arrival rate is set so that the offered load is `load` of the fleet's GPUs.
pub fn synthetic(seed: u64, jobs: usize, total_gpus: u64, load: f64) -> Vec<SimJob> {
    let mut rng = Rng::new(seed);
    // (name, share of jobs, class mix [1, 2-8, 9-64, >64], share of SPOT jobs among <= 8 GPUs)
    let projects: [(&str, f64, [f64; 4], f64); 8] = [
        ("vision", 0.30, [0.78, 0.20, 0.02, 0.0], 0.05),
        ("speech", 0.20, [0.70, 0.25, 0.05, 0.0], 0.05),
        ("recsys", 0.15, [0.55, 0.30, 0.13, 0.02], 0.05),
        ("nlp", 0.10, [0.45, 0.30, 0.18, 0.07], 0.0),
        ("llm", 0.08, [0.20, 0.25, 0.30, 0.25], 0.0),
        ("rl", 0.07, [0.50, 0.35, 0.13, 0.02], 0.10),
        ("batch", 0.07, [0.80, 0.20, 0.0, 0.0], 0.60),
        ("foundation", 0.03, [0.10, 0.20, 0.30, 0.40], 0.0),
    ];
    let shares: Vec<f64> = projects.iter().map(|p| p.1).collect();
    let sizes: [&[(u32, f64)]; 4] = [
        &[(1, 1.0)],
        &[(2, 0.3), (4, 0.3), (8, 0.4)],
        &[(16, 0.45), (32, 0.35), (64, 0.2)],
        &[(128, 0.5), (256, 0.3), (512, 0.15), (1024, 0.05)],
    ];
    // Median run time and spread per class.
    let runtime = [(15.0 * 60.0, 1.5), (40.0 * 60.0, 1.4), (2.0 * 3600.0, 1.2), (6.0 * 3600.0, 1.0)];
    let mut out = Vec::with_capacity(jobs);
    let mut gpu_secs = 0f64;
    for id in 0..jobs {
        let p = rng.weighted(&shares);
        let (name, _, mix, spot_share) = projects[p];
        let class = rng.weighted(&mix);
        let ws: Vec<f64> = sizes[class].iter().map(|s| s.1).collect();
        let mut gpus = sizes[class][rng.weighted(&ws)].0;
        // No gang larger than half the fleet (small fleets in tests and --quick).
        while gpus > 8 && gpus as u64 > total_gpus / 2 {
            gpus /= 2;
        }
        let (replicas, per) = if gpus <= GPUS_PER_NODE { (1, gpus) } else { (gpus / GPUS_PER_NODE, GPUS_PER_NODE) };
        let (median, sigma) = runtime[class];
        let nominal = rng.lognormal(median, sigma).clamp(30.0, 7.0 * 86400.0);
        // Users ask for 1.2-4x what the job needs, rounded up to 15 minutes.
        let factor = 1.2 + 2.8 * rng.f64();
        let limit_s = ((nominal * factor / 900.0).ceil() * 900.0).min(7.0 * 86400.0).max(nominal.ceil());
        // 12% fail or exit early.
        let actual = if rng.f64() < 0.12 { nominal * (0.01 + 0.49 * rng.f64()) } else { nominal };
        let spot = gpus <= 8 && rng.f64() < spot_share;
        gpu_secs += actual * gpus as f64;
        out.push(SimJob {
            id: id as u64 + 1,
            submit: 0,
            duration: (actual * SECOND as f64) as Micros,
            limit: (limit_s * SECOND as f64) as Micros,
            replicas,
            gpus_per_replica: per,
            project: name.to_string(),
            spot,
            priority: 0,
        });
    }
    // Arrivals: Poisson with a daily cycle (peak 1.6x the mean, trough 0.4x), by thinning.
    let mean_rate = load * total_gpus as f64 / (gpu_secs / jobs.max(1) as f64); // jobs per second
    let peak = mean_rate * 1.6;
    let mut t = 0f64;
    for j in &mut out {
        loop {
            t += -rng.f64().max(1e-12).ln() / peak;
            let rate = mean_rate * (1.0 + 0.6 * (2.0 * std::f64::consts::PI * t / 86400.0).sin());
            if rng.f64() * peak < rate {
                break;
            }
        }
        j.submit = (t * SECOND as f64) as Micros;
    }
    out
}

/// Where a trace's priority classes come from.
#[derive(Clone, Debug, Default)]
pub struct TraceOptions {
    /// A column (by its header name) whose value is the job's class: a number is its
    /// value, a name is looked up in `classes`. None: the project names the class (in
    /// `classes`; a project not there has 0).
    pub priority_from: Option<String>,
    /// Class names and their values.
    pub classes: BTreeMap<String, i64>,
}

/// Read a trace: CSV with `submit_time_s, duration_s, replicas, gpus_per_replica, project`
/// (a header line is allowed; more columns may follow, named by the header). The time
/// limit of a trace job is twice its duration, rounded up to 15 minutes. A malformed row
/// is an error naming the row (1-based line).
pub fn parse_trace(text: &str) -> Result<Vec<SimJob>, String> {
    parse_trace_with(text, &TraceOptions::default())
}

/// [`parse_trace`] with priority classes (see [`TraceOptions`]).
pub fn parse_trace_with(text: &str, opts: &TraceOptions) -> Result<Vec<SimJob>, String> {
    let mut out = Vec::new();
    let mut header: Vec<String> = Vec::new();
    let mut prio_col: Option<usize> = None;
    for (ix, line) in text.lines().enumerate() {
        let row = ix + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if row == 1 && f.first().is_some_and(|s| s.parse::<f64>().is_err()) {
            header = f.iter().map(|s| s.to_string()).collect();
            continue; // header
        }
        if let (Some(col), None) = (&opts.priority_from, prio_col) {
            prio_col = Some(header.iter().position(|h| h == col).ok_or_else(|| {
                format!("--priority-from {col:?}: the trace has no such column (its header: {})", if header.is_empty() { "none".to_string() } else { header.join(",") })
            })?);
        }
        if f.len() < 5 || (!header.is_empty() && f.len() != header.len()) || (header.is_empty() && f.len() != 5) {
            return Err(format!(
                "trace row {row}: expected {} fields (submit_time_s, duration_s, replicas, gpus_per_replica, project{}), found {}",
                header.len().max(5),
                if header.len() > 5 { ", ..." } else { "" },
                f.len()
            ));
        }
        let num = |i: usize, name: &str| -> Result<f64, String> {
            let v: f64 = f[i].parse().map_err(|_| format!("trace row {row}: {name} is not a number: {:?}", f[i]))?;
            if !v.is_finite() || v < 0.0 {
                return Err(format!("trace row {row}: {name} must be a finite number >= 0, found {:?}", f[i]));
            }
            Ok(v)
        };
        let int = |i: usize, name: &str| -> Result<u32, String> {
            let v: u32 = f[i].parse().map_err(|_| format!("trace row {row}: {name} is not a whole number: {:?}", f[i]))?;
            if v == 0 {
                return Err(format!("trace row {row}: {name} must be at least 1"));
            }
            Ok(v)
        };
        let submit = num(0, "submit_time_s")?;
        let duration = num(1, "duration_s")?;
        let replicas = int(2, "replicas")?;
        let per = int(3, "gpus_per_replica")?;
        if per > GPUS_PER_NODE {
            return Err(format!("trace row {row}: gpus_per_replica {per} exceeds the {GPUS_PER_NODE} GPUs of a node"));
        }
        if f[4].is_empty() {
            return Err(format!("trace row {row}: project is empty"));
        }
        let limit = ((duration * 2.0 / 900.0).ceil() * 900.0).max(duration.ceil()).max(60.0);
        let class = prio_col.map_or(f[4], |c| f[c]);
        let priority = match class.parse::<i64>() {
            Ok(v) if prio_col.is_some() => v,
            _ => match opts.classes.get(class) {
                Some(v) => *v,
                None if prio_col.is_some() => {
                    return Err(format!("trace row {row}: priority class {class:?} is not one of --priority-classes"));
                }
                None => 0,
            },
        };
        out.push(SimJob {
            id: out.len() as u64 + 1,
            submit: (submit * SECOND as f64) as Micros,
            duration: (duration * SECOND as f64) as Micros,
            limit: (limit * SECOND as f64) as Micros,
            replicas,
            gpus_per_replica: per,
            project: f[4].to_string(),
            spot: false,
            priority,
        });
    }
    out.sort_by_key(|j| (j.submit, j.id));
    Ok(out)
}

/// `nodes` nodes of 8 GPUs, 96 CPUs, 1 TiB.
pub fn fleet(nodes: usize) -> Fleet {
    Fleet {
        nodes: (0..nodes)
            .map(|i| Node {
                name: format!("g{i:05}"),
                cpus: 96,
                memory_bytes: 1 << 40,
                accelerators: [(ACCEL.to_string(), GPUS_PER_NODE)].into(),
                up: true,
                schedulable: true,
            })
            .collect(),
        overcommit: false,
    }
}

fn demand(per: u32) -> ReplicaDemand {
    ReplicaDemand { cpus: 12 * per, memory_bytes: (120u64 << 30) * per as u64, accelerator: Some((ACCEL.to_string(), per)) }
}

/// The jobs' shapes, interned: one per (replicas, GPUs per replica).
pub(crate) struct Shapes {
    /// Per job, the index of its shape.
    pub of: Vec<usize>,
    pub shapes: Vec<Shape>,
    /// Per shape, what one replica needs.
    pub needs: Vec<Need>,
}

impl Shapes {
    pub(crate) fn intern(cluster: &Cluster, jobs: &[SimJob]) -> Shapes {
        let mut index: HashMap<(u32, u32), usize> = HashMap::new();
        let (mut shapes, mut needs) = (Vec::new(), Vec::new());
        let of = jobs
            .iter()
            .map(|j| {
                *index.entry((j.replicas, j.gpus_per_replica)).or_insert_with(|| {
                    let s = cluster.shape(&vec![demand(j.gpus_per_replica); j.replicas as usize]);
                    needs.push(s.needs[0]);
                    shapes.push(s);
                    shapes.len() - 1
                })
            })
            .collect();
        Shapes { of, shapes, needs }
    }
}

/// A named scheduler configuration to run.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: String,
    pub cfg: SchedulerConfig,
    /// Jobs' priority classes count (baselines: FIFO of everything).
    pub priorities: bool,
    /// Quotas by the metric `gpus`, with cohorts (the same for every policy of a run).
    pub quotas: Quotas,
}

pub fn default_policies() -> Vec<Policy> {
    let mut ours = SchedulerConfig { explain: false, ..SchedulerConfig::default() };
    ours.weights.insert("foundation".into(), 2.0);
    vec![
        Policy {
            name: "fifo (strict)".into(),
            cfg: SchedulerConfig { explain: false, ..SchedulerConfig::fifo() },
            priorities: false,
            quotas: Quotas::default(),
        },
        Policy {
            name: "easy backfill".into(),
            cfg: SchedulerConfig { explain: false, ..SchedulerConfig::easy() },
            priorities: false,
            quotas: Quotas::default(),
        },
        Policy { name: "trainyard".into(), cfg: ours, priorities: true, quotas: Quotas::default() },
    ]
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    pub finished: usize,
    pub placements: u64,
    pub rounds: u64,
    pub wall_secs: f64,
    pub plan_secs: f64,
    pub round_p99_us: f64,
    /// GPU busy time / GPU time, from the first to the last submission.
    pub utilisation: f64,
    /// The same, over the whole run until the last job ended.
    pub utilisation_all: f64,
    pub makespan_s: f64,
    /// p50, p99 queue wait (first placement − submission), seconds, per size class.
    pub wait: [(usize, f64, f64); 4],
    pub max_wait_s: f64,
    pub max_wait_job: u64,
    pub preemptions: u64,
    /// Of them: for a job of a higher priority class, and to give a cohort's lender its
    /// quota back.
    pub priority_preemptions: u64,
    pub reclaims: u64,
    /// GPU-hours of work lost to preemptions (since each job's last checkpoint).
    pub lost_gpu_h: f64,
    /// GPU-hours that projects ran above their quota on what their cohort lent.
    pub borrowed_gpu_h: f64,
    pub spot_jobs: usize,
    /// Longest wait of a non-SPOT job, and of a SPOT job.
    pub max_wait_regular_s: f64,
    pub max_wait_spot_s: f64,
    /// SPOT jobs preempted at least once; most preemptions of one job.
    pub preempted_jobs: usize,
    pub max_preemptions_per_job: u32,
    /// Jobs dropped because the fleet could not hold them (an L15 stockout, or a job
    /// larger than the whole fleet).
    pub stockouts: usize,
    /// Mean queue wait over all jobs, seconds.
    pub mean_wait_s: f64,
    /// p50 and p99 wait over all jobs, seconds.
    pub wait_all: (f64, f64),
    /// Longest wait per project, seconds.
    pub project_max_wait_s: BTreeMap<String, f64>,
    /// Each job's wait (first placement − submission) in seconds, in workload order;
    /// None for a job never placed. Kept so that two policies can be compared job by job.
    pub job_wait_s: Vec<Option<f64>>,
}

impl Report {
    pub fn admissions_per_sec(&self) -> f64 {
        self.placements as f64 / self.wall_secs.max(1e-9)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Ev {
    /// Job index.
    Arrive(usize),
    /// Job index, attempt.
    End(usize, u32),
    /// A preempted job has stopped.
    Stopped(usize, u32),
    Tick,
}

#[derive(Clone, Debug, Default)]
struct St {
    first_start: Option<Micros>,
    attempt: u32,
    running_since: Option<Micros>,
    /// Work done, kept across preemptions (checkpoints).
    progress: Micros,
    done: bool,
    waiting: bool,
    /// Holds its quota (admitted, L5); a reclaim gives it back.
    admitted: bool,
    /// Being stopped for a reclaim.
    reclaim: bool,
    /// Preempted for priority or a reclaim so far.
    preemptions: u32,
}

/// Checkpoints every 30 minutes: a preempted job resumes from the last one.
const CHECKPOINT: Micros = 30 * MINUTE;
const GRACE: Micros = 30 * SECOND;

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Run one policy over the workload. `interval` is the least simulated time between two
/// scheduling rounds (rounds run when something changed).
pub fn simulate(jobs: &[SimJob], nodes: usize, policy: &Policy, interval: Micros) -> Report {
    simulate_observed(jobs, nodes, policy, interval, &mut |_, _| {})
}

/// [`simulate`], showing `observe` every round's time and decisions (for checks of what
/// the scheduler promises from round to round).
pub fn simulate_observed(
    jobs: &[SimJob],
    nodes: usize,
    policy: &Policy,
    interval: Micros,
    observe: &mut dyn FnMut(Micros, &[Decision]),
) -> Report {
    let wall = Instant::now();
    let fleet = fleet(nodes);
    let mut cluster = Cluster::new(&fleet);
    let total_gpus = nodes as u64 * GPUS_PER_NODE as u64;
    let Shapes { of: job_shape, shapes, needs } = Shapes::intern(&cluster, jobs);
    let quotas = &policy.quotas;
    let quota_on = quotas != &Quotas::default();
    // Quota by GPUs, only when the run has quotas.
    let metrics: Vec<BTreeMap<String, u64>> =
        jobs.iter().map(|j| if quota_on { [(GPU_METRIC.to_string(), j.gpus())].into() } else { BTreeMap::new() }).collect();
    let mut quota_used = trainyard_core::schedule::QuotaUse::default();
    let in_cohort: Vec<bool> = jobs.iter().map(|j| quotas.cohort_of(&j.project).is_some()).collect();
    let limits: BTreeMap<&str, u64> = quotas
        .cohorts
        .iter()
        .flat_map(|c| c.projects.iter())
        .filter_map(|p| Some((p.as_str(), quotas.limit(p, GPU_METRIC)?)))
        .collect();
    let mut borrowed_now: u64 = 0;
    let mut borrowed_gpu_us: f64 = 0.0;
    let mut admitted_set: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
    // Running jobs that become preemptible for priority (min_runtime_secs) at a time.
    let mut eligible: BinaryHeap<Reverse<(Micros, usize, u32)>> = BinaryHeap::new();
    let min_run = policy.cfg.min_runtime_secs as i64 * SECOND;
    let mut st: Vec<St> = vec![St::default(); jobs.len()];
    let mut heap: BinaryHeap<Reverse<(Micros, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(Micros, u64, Ev)>>, t: Micros, e: Ev| {
        seq += 1;
        heap.push(Reverse((t, seq, e)));
    };
    for (i, j) in jobs.iter().enumerate() {
        push(&mut heap, j.submit, Ev::Arrive(i));
    }
    let last_submit = jobs.iter().map(|j| j.submit).max().unwrap_or(0);
    let first_submit = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
    let mut waiting: Vec<usize> = Vec::new();
    let mut busy: i64 = 0; // GPUs busy now
    let mut last_t: Micros = first_submit;
    let mut busy_window: f64 = 0.0; // GPU-µs within [first, last submit]
    let mut busy_all: f64 = 0.0;
    let mut rep = Report { policy: policy.name.clone(), jobs: jobs.len(), ..Report::default() };
    rep.spot_jobs = jobs.iter().filter(|j| j.spot).count();
    let mut next_round: Micros = Micros::MIN;
    let mut tick_pending = false;
    let mut dirty = false;
    let mut round_us: Vec<f64> = Vec::new();
    let mut plan_time = 0f64;
    let by_id: HashMap<u64, usize> = jobs.iter().enumerate().map(|(i, j)| (j.id, i)).collect();
    let mut now: Micros = first_submit;
    let mut end_t: Micros = first_submit;
    // All events at the next instant.
    while let Some(Reverse((t, _, _))) = heap.peek().copied() {
        // Account busy GPU time.
        let dt = (t - last_t) as f64;
        busy_all += busy as f64 * dt;
        borrowed_gpu_us += borrowed_now as f64 * dt;
        let lo = last_t.max(first_submit);
        let hi = t.min(last_submit);
        if hi > lo {
            busy_window += busy as f64 * (hi - lo) as f64;
        }
        last_t = t;
        now = t;
        while let Some(Reverse((t2, _, e))) = heap.peek().copied() {
            if t2 != now {
                break;
            }
            heap.pop();
            match e {
                Ev::Arrive(i) => {
                    st[i].waiting = true;
                    waiting.push(i);
                    dirty = true;
                }
                Ev::End(i, a) => {
                    if st[i].attempt == a && st[i].running_since.is_some() && !st[i].done {
                        cluster.finish(jobs[i].id);
                        busy -= jobs[i].gpus() as i64;
                        st[i].running_since = None;
                        st[i].done = true;
                        if st[i].admitted {
                            st[i].admitted = false;
                            admitted_set.remove(&i);
                            release(&mut quota_used, &jobs[i], &metrics[i]);
                            borrowed_now = borrowed(&quota_used, &limits);
                        }
                        end_t = end_t.max(now);
                        rep.finished += 1;
                        dirty = true;
                    }
                }
                Ev::Stopped(i, a) => {
                    if st[i].attempt == a && !st[i].done {
                        cluster.finish(jobs[i].id);
                        busy -= jobs[i].gpus() as i64;
                        let since = st[i].running_since.take().unwrap_or(now);
                        let ran = (now - since).max(0);
                        let kept = ran / CHECKPOINT * CHECKPOINT;
                        rep.lost_gpu_h += (ran - kept) as f64 / HOUR as f64 * jobs[i].gpus() as f64;
                        st[i].progress += kept;
                        st[i].attempt += 1;
                        st[i].waiting = true;
                        if std::mem::take(&mut st[i].reclaim) {
                            // Back to the queue without its quota.
                            st[i].admitted = false;
                            admitted_set.remove(&i);
                            release(&mut quota_used, &jobs[i], &metrics[i]);
                            borrowed_now = borrowed(&quota_used, &limits);
                        }
                        waiting.push(i);
                        dirty = true;
                    }
                }
                Ev::Tick => tick_pending = false,
            }
        }
        if !dirty {
            continue;
        }
        if now < next_round {
            if !tick_pending {
                tick_pending = true;
                push(&mut heap, next_round, Ev::Tick);
            }
            continue;
        }
        dirty = false;
        next_round = now + interval;
        // Running jobs past their minimum run time may be preempted for priority.
        while let Some(Reverse((t, i, a))) = eligible.peek().copied() {
            if t > now {
                break;
            }
            eligible.pop();
            if let (true, Some(since)) = (st[i].attempt == a, st[i].running_since) {
                let ok = st[i].preemptions < policy.cfg.max_preemptions_per_job;
                let lost_since = since + (now - since) / CHECKPOINT * CHECKPOINT;
                cluster.set_priority(jobs[i].id, jobs[i].priority, ok, lost_since);
            }
        }
        if !quotas.cohorts.is_empty() {
            quota_used.holders = admitted_set
                .iter()
                .filter(|&&i| in_cohort[i])
                .map(|&i| {
                    let since = st[i].running_since.map(|s| s + (now - s) / CHECKPOINT * CHECKPOINT);
                    trainyard_core::schedule::Holder {
                        id: jobs[i].id,
                        project: jobs[i].project.clone(),
                        metrics: metrics[i].clone(),
                        releasing: st[i].reclaim,
                        reclaimable: !st[i].reclaim && st[i].preemptions < policy.cfg.max_preemptions_per_job,
                        cost: since.map_or(0, |s| jobs[i].gpus() as u128 * 1000 * (now - s).max(0) as u128),
                        start: st[i].running_since.unwrap_or(now),
                    }
                })
                .collect();
        }
        let reqs: Vec<Request> = waiting
            .iter()
            .map(|&i| {
                let j = &jobs[i];
                Request {
                    id: j.id,
                    project: &j.project,
                    submitted: j.submit,
                    admitted: st[i].admitted || (!quota_on && st[i].attempt > 0),
                    spot: j.spot,
                    shape: &shapes[job_shape[i]],
                    metrics: &metrics[i],
                    duration: j.limit,
                    priority: if policy.priorities { j.priority } else { 0 },
                    may_borrow: !policy.cfg.priority_preemption
                        || st[i].preemptions < policy.cfg.max_preemptions_per_job
                        || quotas.limit(&j.project, GPU_METRIC).is_some_and(|q| j.gpus() > q),
                    avoid: Vec::new(),
                }
            })
            .collect();
        let t0 = Instant::now();
        let decisions = plan(&mut cluster, &reqs, quotas, &quota_used, now, &policy.cfg);
        let el = t0.elapsed().as_secs_f64();
        plan_time += el;
        round_us.push(el * 1e6);
        rep.rounds += 1;
        drop(reqs);
        observe(now, &decisions);
        let mut changed = false;
        for d in decisions {
            match d {
                Decision::Place { job, nodes, .. } => {
                    let i = by_id[&job];
                    let j = &jobs[i];
                    let need = needs[job_shape[i]];
                    let placed: Vec<(NodeIx, Need)> =
                        nodes.iter().map(|n| (cluster.node(n).expect("known node"), need)).collect();
                    cluster.start(j.id, &j.project, j.spot && policy.cfg.preemption, now, now + j.limit, placed);
                    busy += j.gpus() as i64;
                    rep.placements += 1;
                    if policy.cfg.priority_preemption && policy.priorities {
                        cluster.set_priority(j.id, j.priority, false, now);
                        eligible.push(Reverse((now + min_run, i, st[i].attempt)));
                    }
                    if quota_on && !st[i].admitted {
                        st[i].admitted = true;
                        admitted_set.insert(i);
                        for (m, v) in &metrics[i] {
                            *quota_used.used.entry((j.project.clone(), m.clone())).or_insert(0) += v;
                        }
                        borrowed_now = borrowed(&quota_used, &limits);
                    }
                    let s = &mut st[i];
                    s.waiting = false;
                    s.first_start.get_or_insert(now);
                    s.running_since = Some(now);
                    // Runs what is left, or until its time limit (L19).
                    let left = (j.duration - s.progress).max(SECOND).min(j.limit);
                    let a = s.attempt;
                    push(&mut heap, now + left, Ev::End(i, a));
                    changed = true;
                }
                Decision::Preempt { job, by_priority, reclaim, .. } => {
                    let i = by_id[&job];
                    cluster.mark_stopping(job);
                    rep.preemptions += 1;
                    if by_priority.is_some() || reclaim {
                        st[i].preemptions += 1;
                        rep.priority_preemptions += u64::from(by_priority.is_some());
                        rep.reclaims += u64::from(reclaim);
                    }
                    st[i].reclaim = reclaim;
                    if st[i].running_since.is_none() {
                        // Admitted, not placed: nothing to stop; a reclaim takes its quota back now.
                        if std::mem::take(&mut st[i].reclaim) && st[i].admitted {
                            st[i].admitted = false;
                            admitted_set.remove(&i);
                            release(&mut quota_used, &jobs[i], &metrics[i]);
                            borrowed_now = borrowed(&quota_used, &limits);
                        }
                        continue;
                    }
                    let a = st[i].attempt;
                    push(&mut heap, now + GRACE, Ev::Stopped(i, a));
                }
                Decision::Stockout { job, .. } | Decision::Impossible { job, .. } => {
                    // Cannot happen with every node up and a workload that fits the
                    // fleet; drop the job so the run ends.
                    let i = by_id[&job];
                    st[i].waiting = false;
                    st[i].done = true;
                    rep.stockouts += 1;
                    changed = true;
                }
                Decision::Wait { .. } => {}
            }
        }
        if changed {
            waiting.retain(|&i| st[i].waiting);
        }
    }
    let _ = now;
    rep.wall_secs = wall.elapsed().as_secs_f64();
    rep.plan_secs = plan_time;
    round_us.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    rep.round_p99_us = quantile(&round_us, 0.99);
    let window = (last_submit - first_submit).max(1) as f64;
    rep.utilisation = busy_window / (window * total_gpus as f64);
    rep.borrowed_gpu_h = borrowed_gpu_us / HOUR as f64;
    rep.makespan_s = (end_t - first_submit) as f64 / SECOND as f64;
    rep.utilisation_all = busy_all / ((end_t - first_submit).max(1) as f64 * total_gpus as f64);
    let mut waits: [Vec<f64>; 4] = Default::default();
    let mut all: Vec<f64> = Vec::with_capacity(jobs.len());
    rep.job_wait_s = vec![None; jobs.len()];
    for (i, j) in jobs.iter().enumerate() {
        if let Some(s) = st[i].first_start {
            let w = (s - j.submit) as f64 / SECOND as f64;
            rep.job_wait_s[i] = Some(w);
            all.push(w);
            let m = rep.project_max_wait_s.entry(j.project.clone()).or_insert(0.0);
            *m = m.max(w);
            waits[class_of(j.gpus())].push(w);
            if j.spot {
                rep.max_wait_spot_s = rep.max_wait_spot_s.max(w);
            } else {
                rep.max_wait_regular_s = rep.max_wait_regular_s.max(w);
            }
            if w > rep.max_wait_s {
                rep.max_wait_s = w;
                rep.max_wait_job = j.id;
            }
        }
    }
    all.sort_by(f64::total_cmp);
    rep.mean_wait_s = all.iter().sum::<f64>() / all.len().max(1) as f64;
    rep.wait_all = (quantile(&all, 0.5), quantile(&all, 0.99));
    rep.preempted_jobs = st.iter().filter(|s| s.attempt > 0).count();
    rep.max_preemptions_per_job = st.iter().map(|s| s.attempt).max().unwrap_or(0);
    for (k, w) in waits.iter_mut().enumerate() {
        w.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        rep.wait[k] = (w.len(), quantile(w, 0.5), quantile(w, 0.99));
    }
    rep
}

/// The quota metric of the simulator's runs: GPUs.
pub const GPU_METRIC: &str = "gpus";

fn release(used: &mut trainyard_core::schedule::QuotaUse, j: &SimJob, metrics: &BTreeMap<String, u64>) {
    for (m, v) in metrics {
        if let Some(u) = used.used.get_mut(&(j.project.clone(), m.clone())) {
            *u = u.saturating_sub(*v);
        }
    }
}

/// GPUs the cohorts' projects hold above their quotas now.
fn borrowed(used: &trainyard_core::schedule::QuotaUse, limits: &BTreeMap<&str, u64>) -> u64 {
    limits
        .iter()
        .map(|(p, l)| used.used.get(&(p.to_string(), GPU_METRIC.to_string())).copied().unwrap_or(0).saturating_sub(*l))
        .sum()
}

/// Equal GPU quotas for the projects of `cohorts` (name, projects): the fleet's GPUs
/// shared among them; projects in no cohort have no quota.
pub fn cohort_quotas(cohorts: &[(String, Vec<String>)], total_gpus: u64) -> Quotas {
    let n: usize = cohorts.iter().map(|c| c.1.len()).sum();
    let share = if n == 0 { 0 } else { total_gpus / n as u64 };
    Quotas {
        projects: cohorts.iter().flat_map(|c| c.1.iter()).map(|p| (p.clone(), [(GPU_METRIC.to_string(), share)].into())).collect(),
        cohorts: cohorts.iter().map(|(name, ps)| trainyard_core::schedule::Cohort { name: name.clone(), projects: ps.clone() }).collect(),
        ..Quotas::default()
    }
}

pub fn hms(s: f64) -> String {
    let s = s.max(0.0).round() as i64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// The results table.
pub fn table(reports: &[Report]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| policy | admissions/s (wall) | plan() share of wall | rounds | round p99 | GPU util (arrival window) | GPU util (to last end) | makespan | p50/p99 wait 1 GPU | 2-8 | 9-64 | >64 | longest wait (job) | longest non-SPOT / SPOT | preemptions (jobs hit, max per job) | of them priority / reclaim | GPU-h lost | borrowed GPU-h |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let w = |k: usize| format!("{} / {}", hms(r.wait[k].1), hms(r.wait[k].2));
        let _ = writeln!(
            o,
            "| {} | {:.0} | {:.0}% | {} | {:.0} µs | {:.1}% | {:.1}% | {} | {} | {} | {} | {} | {} (job {}) | {} / {} | {} ({}, {}) | {} / {} | {:.0} | {:.0} |",
            r.policy,
            r.admissions_per_sec(),
            100.0 * r.plan_secs / r.wall_secs.max(1e-9),
            r.rounds,
            r.round_p99_us,
            100.0 * r.utilisation,
            100.0 * r.utilisation_all,
            hms(r.makespan_s),
            w(0),
            w(1),
            w(2),
            w(3),
            hms(r.max_wait_s),
            r.max_wait_job,
            hms(r.max_wait_regular_s),
            hms(r.max_wait_spot_s),
            r.preemptions,
            r.preempted_jobs,
            r.max_preemptions_per_job,
            r.priority_preemptions,
            r.reclaims,
            r.lost_gpu_h,
            r.borrowed_gpu_h
        );
    }
    o
}

/// The waiting table of a trace run: mean, p50, p99 and longest wait over all jobs, the
/// p99 of 2-8 GPU jobs, the longest wait per project (the `max_projects` projects with
/// the most jobs, named in the header) and the makespan.
pub fn wait_table(reports: &[Report], jobs: &[SimJob], max_projects: usize) -> String {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for j in jobs {
        *count.entry(j.project.as_str()).or_insert(0) += 1;
    }
    let mut projects: Vec<(&str, usize)> = count.into_iter().collect();
    projects.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    projects.truncate(max_projects);
    let mut o = String::new();
    let heads: Vec<String> = projects.iter().map(|(p, n)| format!("max {p} ({n})")).collect();
    let _ = writeln!(o, "| policy | mean wait | p50 | p99 | max | p99 2-8 GPU | {} | makespan |", heads.join(" | "));
    let _ = writeln!(o, "|---|---|---|---|---|---|{}---|", "---|".repeat(projects.len()));
    for r in reports {
        let per: Vec<String> =
            projects.iter().map(|(p, _)| hms(r.project_max_wait_s.get(*p).copied().unwrap_or(0.0))).collect();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.policy,
            hms(r.mean_wait_s),
            hms(r.wait_all.0),
            hms(r.wait_all.1),
            hms(r.max_wait_s),
            if r.wait[1].0 == 0 { "-".to_string() } else { hms(r.wait[1].2) },
            per.join(" | "),
            hms(r.makespan_s)
        );
    }
    o
}

/// The largest excess of `ours`'s wait over `base`'s, job by job: (seconds, job index).
/// Jobs either run never placed are left out.
pub fn worst_excess(ours: &Report, base: &Report) -> Option<(f64, usize)> {
    ours.job_wait_s
        .iter()
        .zip(&base.job_wait_s)
        .enumerate()
        .filter_map(|(i, (a, b))| Some((a.as_ref()? - b.as_ref()?, i)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// The targets, judged against the baselines of the same run.
pub fn verdict(reports: &[Report], ours: &str) -> String {
    let find = |n: &str| reports.iter().find(|r| r.policy == n);
    let (Some(o), Some(fifo), Some(easy)) = (find(ours), find("fifo (strict)"), find("easy backfill")) else {
        return String::from("(targets need the fifo, easy and trainyard policies in the run)\n");
    };
    let mut s = String::new();
    let mut line = |ok: bool, text: String| {
        let _ = writeln!(s, "- [{}] {text}", if ok { "met" } else { "NOT met" });
    };
    line(o.admissions_per_sec() >= 5000.0, format!("admissions per wall-clock second >= 5,000: {:.0}", o.admissions_per_sec()));
    line(
        o.utilisation >= easy.utilisation - 1e-9,
        format!("GPU utilisation >= EASY's: {:.2}% vs {:.2}%", 100.0 * o.utilisation, 100.0 * easy.utilisation),
    );
    line(
        o.wait[0].2 <= fifo.wait[0].2 / 2.0,
        format!("p99 wait of 1-GPU jobs <= half of FIFO's: {} vs {} (half: {})", hms(o.wait[0].2), hms(fifo.wait[0].2), hms(fifo.wait[0].2 / 2.0)),
    );
    line(
        o.wait[0].2 <= easy.wait[0].2,
        format!("p99 wait of 1-GPU jobs <= EASY's: {} vs {}", hms(o.wait[0].2), hms(easy.wait[0].2)),
    );
    line(
        o.max_wait_s <= easy.max_wait_s * 1.1,
        format!("longest wait <= 1.1 x EASY's: {} vs {} (limit {})", hms(o.max_wait_s), hms(easy.max_wait_s), hms(easy.max_wait_s * 1.1)),
    );
    s
}
