//! Admission and placement as a pure function (L3, L4, L5, L15):
//! `schedule(jobs, fleet, quotas, now) -> Vec<Decision>`, the same code that the simulator
//! (`trainyard-sim`) measures at data-centre scale through `plan`.
//!
//! Quota first: a job is admitted only when its project's quota in its region covers
//! every replica at once (L3). Waiting jobs are considered in weighted fair-share order
//! (dominant resource fairness across projects, FIFO within a project; jobs that waited
//! too long go first). Placement is best fit and all or nothing per attempt (gang): the
//! replicas go to the nodes with the least free room that still hold them, so whole
//! nodes stay free for large gangs. The first job that does not fit gets a reservation
//! (when enough capacity frees, from running jobs' expected ends, and on which nodes);
//! later jobs start only if they cannot delay it (EASY backfill). SPOT jobs use idle
//! capacity and are preempted, cheapest first, when non-SPOT work needs it. With an exact
//! fleet, capacity held by other jobs makes a job wait (QUEUED, not a stockout), capacity
//! missing for other reasons (nodes down or drained) is a stockout (L15). The default
//! fleet overcommits: placement always succeeds.
//!
//! Starvation. A job that has waited `starvation_secs` goes ahead of the fair order
//! (oldest first) and holds a reservation of its own, as EASY's head does: the oldest
//! `max_reservations` such jobs each get one, made in that order, each counting the
//! capacity of the ones before it as held until their expected end. A later job may
//! start only if it ends before every reservation it overlaps is due, or takes no more
//! than what those reservations leave on their nodes (a SPOT preemption's claim too).
//! What is guaranteed, with running jobs ending by their time limits (L19): a reservation
//! is never made later by any job after it in the order, so a starving job starts no
//! later than its reservation of the round. The first reservation (the oldest starving
//! job, as EASY's head) can only move earlier from round to round; a later one is made
//! around the ones before it and is not proven to. `Decision::Wait` carries a reservation's
//! time, and the simulator's `tests/guarantee.rs` checks both on generated workloads: the
//! first reservation never moves later, and its job starts by it (within a round
//! interval). What is not guaranteed: a bound
//! relative to EASY backfill on the same workload. The two policies leave different jobs
//! running, so a job may meet a fuller fleet under ours; the simulator's
//! `tests/guarantee.rs` keeps a counterexample.

use std::collections::{BTreeMap, BTreeSet};

use crate::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::capacity::{
    amount_text, never_fits, slots, Need, NeverFit, NodeIx, NodeTable, Res, Shape, Work, NO_ACC, PLACE_SEARCH_BUDGET,
};
use crate::job::{secs, After, Job, Micros, Phase, ReplicaDemand, SECOND};

pub use crate::fleet::{Fleet, Node};
pub use crate::quota::{quota_usage, Cohort, Holder, QuotaUse, Quotas};
use crate::quota::{quota_text, Book, Check};

impl Fleet {
    /// Can a job with these replicas never be placed on this fleet, not even with every
    /// node up and empty (drained and down nodes come back)? The reason and what is
    /// missing in words, naming the largest node (see [`NeverFit::detail`]). Never on an
    /// overcommitting fleet, where everything runs. The scheduler decides with the same
    /// function ([`Cluster::never_fits`]), so a job accepted here is never refused later
    /// by the same fleet.
    pub fn never_fits(&self, replicas: &[ReplicaDemand]) -> Option<(NeverFit, String)> {
        if self.overcommit || replicas.is_empty() {
            return None;
        }
        // One shape (the common case): the free slots of the whole fleet decide, without
        // building the placement index.
        if replicas.windows(2).all(|w| w[0] == w[1]) {
            let d = &replicas[0];
            let mut total = 0u64;
            for n in &self.nodes {
                total = total.saturating_add(node_slots(n, d));
                if total >= replicas.len() as u64 {
                    return None;
                }
            }
        }
        let t = NodeTable::new(self);
        let shape = t.shape(replicas);
        let nf = never_fits(&t, &shape)?;
        let acc_name = |i: usize| replicas.get(i).and_then(|d| d.accelerator.as_ref().map(|a| a.0.clone()));
        Some((nf, nf.detail(&t, &shape, &acc_name)))
    }
}

/// How many replicas of `d` an empty node holds (the node offers its most numerous
/// accelerator type only, as in the scheduler's index).
fn node_slots(n: &Node, d: &ReplicaDemand) -> u64 {
    let per = |have: u64, want: u64| have.checked_div(want).unwrap_or(u64::MAX);
    let mut s = per(n.cpus as u64, d.cpus as u64).min(per(n.memory_bytes, d.memory_bytes.min(i64::MAX as u64)));
    if let Some((a, c)) = d.accelerator.as_ref().filter(|(_, c)| *c > 0) {
        match crate::capacity::offered(n) {
            Some((b, have)) if b == a => s = s.min(have as u64 / *c as u64),
            _ => return 0,
        }
    }
    if s == u64::MAX {
        1 << 20 // a replica that asks for nothing fits anywhere (as `slots`)
    } else {
        s
    }
}

/// What the scheduler decided for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admit (L5) or place again (L15): `nodes[i]` runs replica i. `warnings` say what an
    /// overcommitting node lacks (the replica runs anyway).
    Place { job: u64, nodes: Vec<String>, warnings: Vec<String> },
    /// L15: the fleet cannot hold the attempt for reasons outside the queue.
    Stockout { job: u64, detail: String },
    /// The job can never be placed on this fleet, not even with every node up and empty
    /// (the configuration lost nodes since it was created): feed `Event::Impossible`.
    /// `reason` names the job's pool and the largest node.
    Impossible { job: u64, reason: String },
    /// The job keeps waiting; `reason` says why in plain words (with numbers that move:
    /// what is in use, expected times), `position` where it stands in the order; see
    /// [`waiting_text`]. Jobs in the same situation share one `reason`. `kind` names the
    /// reason without its numbers: the server logs and stores a reason when its kind
    /// changes, not when a number moves.
    /// `reserved_at`: the job holds a reservation this round, and that is its expected
    /// start (the time no later job may delay).
    Wait { job: u64, kind: &'static str, reason: Arc<str>, position: Option<Position>, reserved_at: Option<Micros> },
    /// A SPOT job's capacity is needed by non-SPOT work: feed `Event::Preempt`. With
    /// `by_priority`, a job of a lower priority class whose capacity a job of that
    /// priority needs (`[scheduler] priority_preemption`): feed `Event::PreemptForPriority`.
    /// `reclaim`: a job running on quota borrowed from its cohort, whose lender needs it
    /// back: feed `Event::PreemptForPriority` with `requeue` (it gives its quota back).
    Preempt { job: u64, reason: String, by_priority: Option<i64>, reclaim: bool },
}

/// Where a waiting job stands in the scheduling order, among its own project's waiting
/// jobs (never counting other projects').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// 1-based, among the project's waiting jobs.
    pub pos: u32,
    /// The project's waiting jobs.
    pub total: u32,
    /// FIFO order (else fair-share).
    pub fifo: bool,
}

/// A waiting reason as shown: the reason, then where the job stands (in its own
/// project's words).
pub fn waiting_text(reason: &str, position: Option<Position>, project: &str) -> String {
    match position {
        Some(p) => {
            let order = if p.fifo { "FIFO order" } else { "fair-share order" };
            format!("{reason}; position {} of {} among project {project}'s waiting jobs ({order}).", p.pos, p.total)
        }
        None => format!("{reason}."),
    }
}

/// Kinds of waiting reasons (see [`Decision::Wait`]).
pub const KIND_QUOTA: &str = "quota";
pub const KIND_CAPACITY: &str = "capacity";
pub const KIND_RESERVED: &str = "reserved";
pub const KIND_BEHIND_RESERVATION: &str = "behind-reservation";
pub const KIND_BLOCKED: &str = "blocked";
pub const KIND_SPOT: &str = "spot";
pub const KIND_PREEMPTING: &str = "preempting";
pub const KIND_RECLAIM: &str = "reclaim";
pub const KIND_LENT: &str = "lent";

/// A borrowing job preempted so that a project of its cohort gets its own quota back.
fn reclaim_decision(job: u64) -> Decision {
    Decision::Preempt {
        job,
        reason: "its project ran on quota borrowed from its cohort, and a project that lent it needs it back".into(),
        by_priority: None,
        reclaim: true,
    }
}

/// How the scheduler orders waiting work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Weighted dominant resource fairness across projects; FIFO within a project.
    FairShare,
    /// First come, first served (the baselines).
    Fifo,
}

/// Scheduler settings, with defaults for the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    pub order: Order,
    /// EASY backfill: the first job that does not fit gets a reservation, later jobs may
    /// start only if they cannot delay it. Without backfill the first job that does not
    /// fit blocks every later one (strict order).
    pub backfill: bool,
    /// SPOT jobs run on idle capacity and are preempted for non-SPOT work. When false,
    /// SPOT jobs are scheduled like any other job.
    pub preemption: bool,
    /// Fair-share weight per project (default `default_weight`).
    pub weights: BTreeMap<String, f64>,
    pub default_weight: f64,
    /// A job that has waited this long goes ahead of the fair order, oldest first, and
    /// holds a reservation that no later job can delay (so that a heavy project's big job
    /// cannot starve; see the module docs for what this guarantees). None: never.
    pub starvation_secs: Option<u64>,
    /// At most this many jobs hold a reservation at once (the oldest starving jobs; EASY's
    /// head when none starves). Each reservation costs a pass over the running jobs per
    /// round; the jobs past this many keep their place in the order and get a reservation
    /// as the ones ahead start.
    pub max_reservations: usize,
    /// At most this many blocked jobs per round look for SPOT jobs to preempt.
    pub max_preemption_tries: usize,
    /// A SPOT job is preempted only after it has run this long (so that it makes some
    /// progress and is not preempted again and again by each new arrival).
    pub spot_min_runtime_secs: u64,
    /// A job that cannot fit may preempt running jobs of a lower priority class (the
    /// cheapest set whose ends make it fit: fewest accelerator-hours of work lost since
    /// their last checkpoint, then the youngest). Gangs are preempted whole.
    pub priority_preemption: bool,
    /// A job is preempted for priority only after it has run this long (a job's label
    /// `trainyard-min-runtime-secs` may raise it for itself).
    pub min_runtime_secs: u64,
    /// A job is preempted for priority at most this many times; then it is not chosen.
    pub max_preemptions_per_job: u32,
    /// A job past `max_preemptions_per_job` that runs on quota its cohort lent (its own
    /// quota could never hold it) gives that quota back to a lender who wants it at its
    /// next checkpoint, or once it has run this long: a lender's quota is never pinned
    /// until the job ends.
    pub reclaim_after_secs: u64,
    /// Fair share with memory: a project's past use counts with weights that halve every
    /// this many seconds (see [`UsageHistory`]); 0: only what it holds now.
    pub usage_half_life_secs: u64,
    /// Emit a `Wait` with a reason for every job that keeps waiting. The simulator turns
    /// it off: only actions are needed there.
    pub explain: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            order: Order::FairShare,
            backfill: true,
            preemption: true,
            weights: BTreeMap::new(),
            default_weight: 1.0,
            starvation_secs: Some(2 * 3600),
            max_reservations: 64,
            max_preemption_tries: 8,
            spot_min_runtime_secs: 1800,
            priority_preemption: false,
            min_runtime_secs: 600,
            max_preemptions_per_job: 3,
            reclaim_after_secs: 3600,
            usage_half_life_secs: 7 * 24 * 3600,
            explain: true,
        }
    }
}

impl SchedulerConfig {
    /// Strict FIFO, no backfill, no preemption (a baseline).
    pub fn fifo() -> Self {
        SchedulerConfig { order: Order::Fifo, backfill: false, preemption: false, starvation_secs: None, ..Self::default() }
    }
    /// FIFO order with EASY backfill, no preemption (a baseline like Slurm's).
    pub fn easy() -> Self {
        SchedulerConfig { order: Order::Fifo, backfill: true, preemption: false, starvation_secs: None, ..Self::default() }
    }
    pub fn weight(&self, project: &str) -> f64 {
        let w = self.weights.get(project).copied().unwrap_or(self.default_weight);
        if w.is_finite() && w > 0.0 {
            w
        } else {
            1.0
        }
    }
}

/// Optional per-job input besides the jobs themselves.
#[derive(Clone, Debug, Default)]
pub struct Hints {
    /// Expected run time from admission, by job id. Without a hint the job's timeout
    /// (L19) is used: the worst case, which makes reservations guarantees.
    pub expected_duration: std::collections::HashMap<u64, Micros>,
    /// Each project's past use ([`UsageHistory`]), for fair share with memory.
    pub usage_history: BTreeMap<String, UsageHistory>,
}

/// What a project used in the past: the resources it held, averaged over time with
/// weights that halve every `usage_half_life_secs` (an exponentially weighted mean of
/// what it held at each moment). A project that held 8 GPUs for much longer than the
/// half-life shows 8; one that held none for as long shows almost 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageHistory {
    pub cpus: f64,
    pub memory_bytes: f64,
    /// By accelerator type.
    #[serde(default)]
    pub accelerators: BTreeMap<String, f64>,
}

impl UsageHistory {
    /// `self` aged by `elapsed` with half-life `half_life` (both µs), the resources held
    /// meanwhile being `now`: `h * d + now * (1 - d)` with `d = 2^(-elapsed/half_life)`.
    pub fn aged(&self, now: &UsageHistory, elapsed: Micros, half_life: Micros) -> UsageHistory {
        if half_life <= 0 {
            return now.clone();
        }
        let d = (-(elapsed.max(0) as f64) / half_life as f64).exp2();
        let mix = |h: f64, n: f64| h * d + n * (1.0 - d);
        let mut accelerators = BTreeMap::new();
        for k in self.accelerators.keys().chain(now.accelerators.keys()) {
            let h = self.accelerators.get(k).copied().unwrap_or(0.0);
            let n = now.accelerators.get(k).copied().unwrap_or(0.0);
            accelerators.insert(k.clone(), mix(h, n));
        }
        UsageHistory { cpus: mix(self.cpus, now.cpus), memory_bytes: mix(self.memory_bytes, now.memory_bytes), accelerators }
    }

    /// Nothing left worth keeping.
    pub fn is_negligible(&self) -> bool {
        self.cpus < 1e-3 && self.memory_bytes < 1.0 && self.accelerators.values().all(|a| *a < 1e-3)
    }
}

/// One job waiting for placement, in the scheduler's compact form.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub id: u64,
    pub project: &'a str,
    /// Creation time: FIFO order within a project, and the age for starvation.
    pub submitted: Micros,
    /// Quota is already held (L5): placement again after a stockout or a preemption.
    pub admitted: bool,
    pub spot: bool,
    pub shape: &'a Shape,
    /// Quota demand (L3).
    pub metrics: &'a BTreeMap<String, u64>,
    /// Expected run time once placed (timeout or hint): used for backfill.
    pub duration: Micros,
    /// Its priority class's value ([`PriorityClasses`]): higher is considered first.
    pub priority: i64,
    /// It may run on quota borrowed from its project's cohort.
    pub may_borrow: bool,
    /// Nodes its replicas failed on: placed elsewhere when another node fits.
    pub avoid: Vec<NodeIx>,
}

/// The label a job picks its priority class with.
pub const PRIORITY_CLASS_LABEL: &str = "trainyard-priority-class";

/// Priority classes (`[[scheduler.priority_classes]]`, name and value). A job's class is
/// the one its label [`PRIORITY_CLASS_LABEL`] names, else its project's
/// (`[quotas.projects.P] priority_class`), else `[scheduler] default_priority_class`;
/// without one its priority is 0. Higher values are considered first in every round;
/// among jobs of one value, the order is the usual one (fair share or FIFO).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PriorityClasses {
    pub classes: Vec<(String, i64)>,
    pub default: Option<String>,
    pub projects: BTreeMap<String, String>,
    /// The classes open only to some projects (`[[scheduler.priority_classes]] projects`):
    /// class name -> the projects that may use it. A class not here is open to every project.
    pub allowed: BTreeMap<String, Vec<String>>,
}

/// Why a job cannot have the priority class it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PriorityError {
    /// No such class (a bad argument).
    Unknown(String),
    /// The class is not open to the job's project (a permission).
    NotAllowed(String),
}

impl PriorityClasses {
    /// The value of the class `name`.
    pub fn value(&self, name: &str) -> Option<i64> {
        self.classes.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// Whether `project` may use the class `name` (a class without `projects` is open).
    pub fn allows(&self, name: &str, project: &str) -> bool {
        self.allowed.get(name).is_none_or(|ps| ps.iter().any(|p| p == project))
    }

    /// The priority of a job of `project` whose label names `label`; an unknown class is
    /// an error naming the label and the classes there are, and a class not open to the
    /// project one naming the class and the project. The project's own class and the
    /// default are open to it (the configuration is refused otherwise).
    pub fn priority(&self, label: Option<&str>, project: &str) -> Result<i64, PriorityError> {
        match label {
            Some(name) => {
                let value = self.value(name).ok_or_else(|| {
                    let names: Vec<&str> = self.classes.iter().map(|(n, _)| n.as_str()).collect();
                    PriorityError::Unknown(format!("labels.{PRIORITY_CLASS_LABEL}: {}", unknown_priority_class(name, &names)))
                })?;
                if !self.allows(name, project) {
                    return Err(PriorityError::NotAllowed(format!(
                        "labels.{PRIORITY_CLASS_LABEL}: the priority class {name:?} is not open to project {project:?} \
                         ([[scheduler.priority_classes]] projects)"
                    )));
                }
                Ok(value)
            }
            None => Ok(self.projects.get(project).or(self.default.as_ref()).and_then(|n| self.value(n)).unwrap_or(0)),
        }
    }
}

/// What is said of a name that is not one of the priority `classes` (a job's label, a
/// configuration key).
pub fn unknown_priority_class(name: &str, classes: &[&str]) -> String {
    if classes.is_empty() {
        format!("{name:?} is not a priority class; none are configured ([[scheduler.priority_classes]])")
    } else {
        format!("{name:?} is not a priority class; the classes are {}", classes.join(", "))
    }
}

/// A job that holds capacity.
#[derive(Clone, Debug)]
pub struct Running {
    pub project: String,
    /// Preemptible (SPOT and not already stopping).
    pub spot: bool,
    /// A SPOT job told to stop for a preemption; its capacity frees soon.
    pub stopping: bool,
    /// Its priority class's value, and whether a job of a higher one may preempt it (it
    /// has run its minimum and has not been preempted too often): see
    /// [`Cluster::set_priority`].
    pub priority: i64,
    pub preemptible: bool,
    /// Work lost if it is preempted is counted from here (its last checkpoint, or its
    /// start).
    pub lost_since: Micros,
    pub start: Micros,
    /// Expected end (timeout or hint).
    pub end: Micros,
    pub placed: Vec<(NodeIx, Need)>,
}

/// The capacity state the scheduler decides on: the fleet, its free capacity per node
/// (indexed for best fit), the jobs holding capacity ordered by expected end, and the use
/// per project. `schedule` builds it from the jobs on every call; the simulator keeps one
/// up to date incrementally (`start`, `finish`) and calls `plan` on it.
#[derive(Clone, Debug)]
pub struct Cluster {
    table: NodeTable,
    free: Work,
    running: HashMap<u64, Running>,
    by_end: BTreeSet<(Micros, u64)>,
    spot: BTreeSet<u64>,
    stopping: BTreeSet<u64>,
    usage: HashMap<String, Vec<i64>>,
    totals: Vec<i64>,
    /// Each project's past use by dimension ([`UsageHistory`]), for fair share.
    history: HashMap<String, Vec<f64>>,
    /// Per-node scratch space of the reservations (see [`View`]), kept between rounds so
    /// that a round allocates none.
    scratch: Scratch,
}

/// Positions in a vector of usage or totals by dimension: CPUs, memory, then one per
/// accelerator type ([`acc_dim`]).
const CPUS: usize = 0;
const MEM: usize = 1;

/// The position of accelerator type `ty` in a vector by dimension.
fn acc_dim(ty: u16) -> usize {
    2 + ty as usize
}

fn add_dims(v: &mut [i64], d: &Need, sign: i64) {
    v[CPUS] += sign * d.cpus;
    v[MEM] += sign * d.mem;
    if d.acc_type != NO_ACC && acc_dim(d.acc_type) < v.len() {
        v[acc_dim(d.acc_type)] += sign * d.acc;
    }
}

impl Cluster {
    pub fn new(fleet: &Fleet) -> Cluster {
        let table = NodeTable::new(fleet);
        let free = Work::new(&table);
        let mut totals = vec![0i64; 2 + table.acc_names.len()];
        for i in 0..table.len() {
            if table.usable[i] {
                totals[CPUS] += table.cap_cpus[i];
                totals[MEM] += table.cap_mem[i];
                if table.acc_type[i] != NO_ACC {
                    totals[acc_dim(table.acc_type[i])] += table.cap_acc[i];
                }
            }
        }
        Cluster {
            table,
            free,
            running: HashMap::default(),
            by_end: BTreeSet::new(),
            spot: BTreeSet::new(),
            stopping: BTreeSet::new(),
            usage: HashMap::default(),
            totals,
            history: HashMap::default(),
            scratch: Scratch::default(),
        }
    }

    pub fn table(&self) -> &NodeTable {
        &self.table
    }

    pub fn shape(&self, replicas: &[ReplicaDemand]) -> Shape {
        self.table.shape(replicas)
    }

    /// The scheduler's never-fit check (see [`Fleet::never_fits`]): on every node of the
    /// fleet, up or not.
    pub fn never_fits(&self, shape: &Shape) -> Option<NeverFit> {
        never_fits(&self.table, shape)
    }

    pub fn node(&self, name: &str) -> Option<NodeIx> {
        self.table.index.get(name).copied()
    }

    pub fn running(&self) -> &HashMap<u64, Running> {
        &self.running
    }

    /// Free accelerators of usable nodes, and their total.
    pub fn free_accelerators(&self) -> (i64, i64) {
        let mut free = 0;
        let mut total = 0;
        for i in 0..self.table.len() {
            if self.table.usable[i] && self.table.acc_type[i] != NO_ACC {
                free += self.free.acc[i].max(0);
                total += self.table.cap_acc[i];
            }
        }
        (free, total)
    }

    /// A job now holds `placed` (its live replicas' nodes and needs).
    pub fn start(&mut self, id: u64, project: &str, spot: bool, start: Micros, end: Micros, placed: Vec<(NodeIx, Need)>) {
        self.finish(id);
        let usage = self.usage.entry(project.to_string()).or_insert_with(|| vec![0; self.totals.len()]);
        for (n, d) in &placed {
            self.free.take(&self.table, *n, d);
            add_dims(usage, d, 1);
        }
        self.free.commit();
        self.by_end.insert((end, id));
        if spot {
            self.spot.insert(id);
        }
        self.running.insert(id, Running {
            project: project.to_string(),
            spot,
            stopping: false,
            start,
            end,
            placed,
            priority: 0,
            preemptible: false,
            lost_since: start,
        });
    }

    /// A running job's priority, whether a job of a higher priority may preempt it now,
    /// and since when its work would be lost (its last checkpoint).
    pub fn set_priority(&mut self, id: u64, priority: i64, preemptible: bool, lost_since: Micros) {
        if let Some(r) = self.running.get_mut(&id) {
            r.priority = priority;
            r.preemptible = preemptible;
            r.lost_since = lost_since.max(r.start);
        }
    }

    /// The job holds nothing any more.
    pub fn finish(&mut self, id: u64) -> bool {
        let Some(r) = self.running.remove(&id) else { return false };
        for (n, d) in &r.placed {
            self.free.give(&self.table, *n, d);
        }
        self.free.commit();
        if let Some(u) = self.usage.get_mut(&r.project) {
            for (_, d) in &r.placed {
                add_dims(u, d, -1);
            }
        }
        self.by_end.remove(&(r.end, id));
        self.spot.remove(&id);
        self.stopping.remove(&id);
        true
    }

    /// A job is stopping (preempted, cancelled, timed out, failed): no longer a candidate;
    /// its capacity frees when it has stopped (`finish`), and a preemption counts it first.
    pub fn mark_stopping(&mut self, id: u64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.spot = false;
            r.stopping = true;
            self.spot.remove(&id);
            self.stopping.insert(id);
        }
    }

    /// A project's past use, in the dimensions of its usage (CPUs, memory, then one per
    /// accelerator type of the fleet; types the fleet has not are left out).
    pub fn set_history(&mut self, project: &str, h: &UsageHistory) {
        let mut v = vec![0f64; self.totals.len()];
        v[CPUS] = h.cpus;
        v[MEM] = h.memory_bytes;
        for (ty, name) in self.table.acc_names.iter().enumerate() {
            if let (Some(a), Some(slot)) = (h.accelerators.get(name), v.get_mut(acc_dim(ty as u16))) {
                *slot = *a;
            }
        }
        self.history.insert(project.to_string(), v);
    }

    /// A project's weighted dominant share: of each dimension, what it holds now plus what
    /// it held in the past (its history), over the fleet's total; the largest, over its
    /// weight.
    fn share(&self, project: &str, usage: &[i64], weight: f64) -> f64 {
        let past = self.history.get(project);
        let mut s = 0f64;
        for (d, (u, t)) in usage.iter().zip(&self.totals).enumerate() {
            if *t > 0 {
                let h = past.and_then(|p| p.get(d)).copied().unwrap_or(0.0);
                s = s.max((*u as f64 + h) / *t as f64);
            }
        }
        s / weight
    }
}

/// Decide for every job that waits for placement. `jobs` are the live (non-terminal)
/// jobs. Default settings, no hints.
pub fn schedule(jobs: &[&Job], fleet: &Fleet, quotas: &Quotas, now: Micros) -> Vec<Decision> {
    schedule_with(jobs, fleet, quotas, now, &SchedulerConfig::default(), &Hints::default())
}

/// `schedule` with settings and hints.
pub fn schedule_with(
    jobs: &[&Job],
    fleet: &Fleet,
    quotas: &Quotas,
    now: Micros,
    cfg: &SchedulerConfig,
    hints: &Hints,
) -> Vec<Decision> {
    let held = quota_held(jobs, quotas, cfg, now);
    if fleet.overcommit {
        return schedule_overcommit(jobs, fleet, quotas, &held, now, cfg);
    }
    let duration = |j: &Job| hints.expected_duration.get(&j.id).copied().unwrap_or(j.policy.timeout).max(1);
    let mut c = Cluster::new(fleet);
    for (project, h) in &hints.usage_history {
        c.set_history(project, h);
    }
    for j in jobs.iter().filter(|j| j.holds_capacity()) {
        let placed: Vec<(NodeIx, Need)> = j
            .replicas
            .iter()
            .zip(&j.demand.replicas)
            .filter(|(r, _)| r.state.is_live())
            .filter_map(|(r, d)| Some((c.node(r.node.as_deref()?)?, c.table.need(d))))
            .collect();
        let stopping = matches!(j.phase, Phase::Stopping { .. });
        let start = j.admitted_at().unwrap_or(now);
        // A stopping job frees its capacity soon.
        let end = if stopping { now } else { start.saturating_add(duration(j)) };
        c.start(j.id, &j.project, j.policy.spot && !stopping, start, end, placed);
        // Preempted, cancelled, timed out or failed: what it holds is being freed, and a
        // preemption counts it before it chooses anyone (a job preempted for capacity that
        // a cancel frees a moment later loses its work for nothing).
        if stopping {
            c.mark_stopping(j.id);
        }
        if cfg.priority_preemption && !stopping {
            // Preemptible for priority once it has run its minimum, a limited number of times.
            let min_run = secs(cfg.min_runtime_secs).max(j.policy.min_runtime);
            let preemptible = j.retries.preemptions < cfg.max_preemptions_per_job && now.saturating_sub(start) >= min_run;
            c.set_priority(j.id, j.policy.priority, preemptible, j.checkpoint.last_write.unwrap_or(start));
        }
    }
    let waiting: Vec<&Job> = jobs.iter().copied().filter(|j| j.wants_placement(now)).collect();
    let shapes: Vec<Shape> = waiting.iter().map(|j| c.shape(&j.demand.replicas)).collect();
    let reqs: Vec<Request> = waiting
        .iter()
        .zip(&shapes)
        .map(|(j, shape)| Request {
            id: j.id,
            project: &j.project,
            submitted: j.create_time,
            admitted: !matches!(j.phase, Phase::Queued),
            spot: j.policy.spot,
            shape,
            metrics: &j.demand.metrics,
            duration: duration(j),
            priority: j.policy.priority,
            may_borrow: may_borrow(j, cfg, quotas),
            avoid: j.avoid_nodes.iter().filter_map(|n| c.node(n)).collect(),
        })
        .collect();
    let mut out = plan(&mut c, &reqs, quotas, &held, now, cfg);
    // A job that can never fit: the reason in the job's own words (its pools).
    for d in &mut out {
        if let Decision::Impossible { job, reason } = d {
            if let Some(k) = waiting.iter().position(|j| j.id == *job) {
                if let Some(nf) = c.never_fits(&shapes[k]) {
                    *reason = impossible_reason(&c.table, waiting[k], &shapes[k], nf);
                }
            }
        }
    }
    out
}

/// Why `job` can never be placed, naming its pool (`workerPoolSpecs[i]`) and the largest
/// node.
pub fn impossible_reason(t: &NodeTable, job: &Job, shape: &Shape, nf: NeverFit) -> String {
    let acc_name = |i: usize| job.demand.replicas.get(i).and_then(|d| d.accelerator.as_ref().map(|a| a.0.clone()));
    let detail = nf.detail(t, shape, &acc_name);
    let head = "The job can never be placed on this fleet, not even with every node up and free";
    match nf {
        NeverFit::Replica(i) => {
            let pool = job.replicas.get(i).map_or(0, |r| r.pool);
            format!("{head}: workerPoolSpecs[{pool}]: a replica {detail}.")
        }
        NeverFit::Gang => {
            let mut pools: Vec<(usize, usize, &ReplicaDemand)> = Vec::new();
            for (r, d) in job.replicas.iter().zip(&job.demand.replicas) {
                match pools.last_mut() {
                    Some((p, k, e)) if *p == r.pool && *e == d => *k += 1,
                    _ => pools.push((r.pool, 1, d)),
                }
            }
            let each = |d: &ReplicaDemand| {
                let acc = d.accelerator.as_ref().map(|(a, c)| (a.as_str(), *c as i64));
                amount_text(d.cpus as i64, d.memory_bytes.min(i64::MAX as u64) as i64, acc)
            };
            let same = pools.windows(2).all(|w| w[0].2 == w[1].2);
            let list: Vec<String> = pools
                .iter()
                .map(|(p, k, d)| match same {
                    true => format!("workerPoolSpecs[{p}]: {k}"),
                    false => format!("workerPoolSpecs[{p}]: {k} x {}", each(d)),
                })
                .collect();
            let what = match (same, pools.first()) {
                (true, Some((_, _, d))) => format!("{} replicas of {}", job.replicas.len(), each(d)),
                _ => format!("{} replicas", job.replicas.len()),
            };
            format!("{head}: its {what} ({}) {detail}.", list.join("; "))
        }
    }
}

/// A job may run on quota borrowed from its cohort if it can give it back: with reclaim
/// on, a job preempted `max_preemptions_per_job` times (never chosen again) borrows only
/// if its own quota can never hold it (else it would wait for ever).
fn may_borrow(j: &Job, cfg: &SchedulerConfig, quotas: &Quotas) -> bool {
    !cfg.priority_preemption
        || j.retries.preemptions < cfg.max_preemptions_per_job
        || j.demand.metrics.iter().any(|(m, v)| quotas.limit(&j.project, m).is_some_and(|q| *v > q))
}

/// When a round may decide differently with nothing else changed: the earliest time a
/// running job becomes one a waiting job may preempt (a SPOT job past
/// `spot_min_runtime_secs`, a job past `min_runtime_secs` for a higher class) or one a
/// lender may reclaim its quota from (`reclaim_after_secs`). None when no job waits or
/// nothing changes with time; the driver runs a round then.
pub fn next_change(jobs: &[&Job], cfg: &SchedulerConfig, now: Micros) -> Option<Micros> {
    if !jobs.iter().any(|j| j.wants_placement(now)) {
        return None;
    }
    let mut times = Vec::new();
    for j in jobs.iter().filter(|j| j.holds_capacity() && !matches!(j.phase, Phase::Stopping { .. })) {
        let start = j.admitted_at().unwrap_or(now);
        if cfg.preemption && j.policy.spot {
            times.push(start.saturating_add(secs(cfg.spot_min_runtime_secs)));
        }
        if cfg.priority_preemption {
            if j.retries.preemptions < cfg.max_preemptions_per_job {
                times.push(start.saturating_add(secs(cfg.min_runtime_secs).max(j.policy.min_runtime)));
            } else if j.holds_quota() {
                times.push(start.saturating_add(secs(cfg.reclaim_after_secs)));
            }
        }
    }
    times.into_iter().filter(|t| *t > now).min()
}

/// L3, L5: a job preempted `max_preemptions_per_job` times that holds lent quota may
/// still give it back once it has written a checkpoint in its current run (stopping it
/// then loses only what came after) or has run `reclaim_after_secs`.
fn reclaim_bound_passed(j: &Job, cfg: &SchedulerConfig, now: Micros) -> bool {
    let start = j.admitted_at().unwrap_or(now);
    j.checkpoint.last_write.is_some_and(|w| w > start) || now.saturating_sub(start) >= secs(cfg.reclaim_after_secs)
}

/// The quota held now and, in projects of cohorts, by which jobs (what a reclaim may take
/// back, the cheapest first: least accelerator-time lost since the last checkpoint).
pub fn quota_held(jobs: &[&Job], quotas: &Quotas, cfg: &SchedulerConfig, now: Micros) -> QuotaUse {
    let used = quota_usage(jobs.iter().copied());
    if quotas.cohorts.is_empty() {
        return QuotaUse { used, holders: Vec::new() };
    }
    let holders = jobs
        .iter()
        .filter(|j| j.holds_quota() && quotas.cohort_of(&j.project).is_some())
        .map(|j| {
            let stopping = matches!(j.phase, Phase::Stopping { .. });
            let start = j.admitted_at().unwrap_or(now);
            let since = j.checkpoint.last_write.unwrap_or(start);
            let units: u128 = j
                .demand
                .replicas
                .iter()
                .map(|d| d.accelerator.as_ref().map_or(d.cpus as u128, |(_, c)| *c as u128 * 1000))
                .sum();
            let running = matches!(j.phase, Phase::Running { .. });
            Holder {
                id: j.id,
                project: j.project.clone(),
                metrics: j.demand.metrics.clone(),
                releasing: matches!(&j.phase, Phase::Stopping { then: After::Preempted { requeue: true, .. }, .. }),
                reclaimable: !stopping && (j.retries.preemptions < cfg.max_preemptions_per_job || reclaim_bound_passed(j, cfg, now)),
                cost: if running { units.max(1) * (now - since).max(0) as u128 } else { 0 },
                start,
            }
        })
        .collect();
    QuotaUse { used, holders }
}

/// A waiting reason for what the quota said (`Check`), and its kind.
fn quota_reason(check: &Check) -> Option<(&'static str, String)> {
    Some(match check {
        Check::Fits => return None,
        Check::Short(short, note) => {
            let mut reason = format!("Waiting for quota: {}", quota_text(short));
            if let Some(n) = note {
                reason.push_str("; ");
                reason.push_str(n);
            }
            (KIND_QUOTA, reason)
        }
        Check::Reclaim { victims, stopping, cohort } => (
            KIND_RECLAIM,
            format!(
                "Waiting for quota its project lends to cohort {cohort}: {} borrowing it {} being preempted to give it back",
                counted(victims.len() + stopping, "job", "jobs"),
                if victims.len() + stopping == 1 { "is" } else { "are" },
            ),
        ),
        Check::Lent { cohort } => (
            KIND_LENT,
            format!(
                "Waiting for quota its project lends to cohort {cohort}: it comes back as the jobs borrowing it end \
                 (reclaim by preemption needs [scheduler] priority_preemption; a job preempted max_preemptions_per_job \
                 times gives it back at its next checkpoint or after reclaim_after_secs)"
            ),
        ),
    })
}

/// The single-workstation default: quota first (L3), then everything on the first usable
/// node; CPU and memory are shared, a missing accelerator is a warning, not a refusal.
fn schedule_overcommit(jobs: &[&Job], fleet: &Fleet, quotas: &Quotas, held: &QuotaUse, now: Micros, cfg: &SchedulerConfig) -> Vec<Decision> {
    let mut book = Book::new(quotas, held, cfg.priority_preemption);
    let usable: Vec<&Node> = fleet.nodes.iter().filter(|n| n.up && n.schedulable).collect();
    let mut waiting: Vec<&Job> = jobs.iter().copied().filter(|j| j.wants_placement(now)).collect();
    waiting.sort_by_key(|j| (matches!(j.phase, Phase::Queued), j.create_time, j.id));
    // GPUs a node has are exact capacity even here (CPU and memory are shared): what
    // live replicas hold, by (node, accelerator type).
    let mut gpus_used: BTreeMap<(String, String), u64> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.holds_capacity()) {
        for (r, d) in j.replicas.iter().zip(&j.demand.replicas) {
            if let (true, Some(node), Some((a, c))) = (r.state.is_live(), &r.node, &d.accelerator) {
                *gpus_used.entry((node.clone(), a.clone())).or_insert(0) += *c as u64;
            }
        }
    }
    for j in waiting.iter().filter(|j| matches!(j.phase, Phase::Queued)) {
        book.want(&j.project, &j.demand.metrics);
    }
    let mut out = Vec::new();
    for job in waiting {
        let queued = matches!(job.phase, Phase::Queued);
        if queued {
            let check = book.check(&job.project, &job.demand.metrics, may_borrow(job, cfg, quotas));
            if let Check::Reclaim { victims, .. } = &check {
                out.extend(victims.iter().map(|v| reclaim_decision(*v)));
                book.charge(&job.project, &job.demand.metrics);
            }
            if let Some((kind, reason)) = quota_reason(&check) {
                out.push(Decision::Wait { job: job.id, kind, reason: reason.into(), position: None, reserved_at: None });
                continue;
            }
        }
        let Some(n) = usable.first() else {
            if queued {
                book.charge(&job.project, &job.demand.metrics);
            }
            out.push(Decision::Stockout { job: job.id, detail: stockout_detail_of(fleet) });
            continue;
        };
        // What the job asks of the node's GPUs, by type; short: it waits.
        let asks = job.demand.accelerators_by_type();
        let short: Vec<String> = asks
            .iter()
            .filter_map(|(a, need)| {
                let have = n.accelerators.get(*a).copied().unwrap_or(0) as u64;
                let used = gpus_used.get(&(n.name.clone(), a.to_string())).copied().unwrap_or(0);
                (have > 0 && have.saturating_sub(used) < *need).then(|| {
                    let s = if *need == 1 { "" } else { "s" };
                    format!("needs {need} {a} GPU{s} on node {}, {} of {have} free", n.name, have.saturating_sub(used))
                })
            })
            .collect();
        if !short.is_empty() {
            out.push(Decision::Wait {
                job: job.id,
                kind: KIND_CAPACITY,
                reason: format!("Waiting for GPUs: {}", short.join("; ")).into(),
                position: None,
                reserved_at: None,
            });
            continue;
        }
        for (a, need) in &asks {
            if n.accelerators.get(*a).copied().unwrap_or(0) > 0 {
                *gpus_used.entry((n.name.clone(), a.to_string())).or_insert(0) += need;
            }
        }
        let mut warnings = Vec::new();
        for (r, d) in job.replicas.iter().zip(&job.demand.replicas) {
            if let Some((a, c)) = &d.accelerator {
                let have = n.accelerators.get(a).copied().unwrap_or(0);
                if have < *c {
                    warnings.push(format!(
                        "Warning: replica {} asks for {c} x {a} but node {} has {have}; it runs without them.",
                        r.name, n.name
                    ));
                }
            }
        }
        if queued {
            book.charge(&job.project, &job.demand.metrics);
        }
        out.push(Decision::Place { job: job.id, nodes: vec![n.name.clone(); job.replicas.len()], warnings });
    }
    out
}

fn stockout_detail_of(fleet: &Fleet) -> String {
    let up = fleet.nodes.iter().filter(|n| n.up).count();
    let drained = fleet.nodes.iter().filter(|n| n.up && !n.schedulable).count();
    let usable = fleet.nodes.iter().filter(|n| n.up && n.schedulable).count();
    format!("{} of {} nodes usable ({} down, {} drained)", usable, fleet.nodes.len(), fleet.nodes.len() - up, drained)
}

/// A reservation: for the head of the order (EASY backfill) and for every job past the
/// starvation bound.
#[derive(Clone, Debug)]
struct Resv {
    /// When enough capacity is expected to be free (from expected ends).
    time: Micros,
    nodes: Vec<(NodeIx, i64)>,
    /// What a job that runs past `time` may still take on each reserved node.
    slack: HashMap<NodeIx, Res>,
    /// The reserved job's replica need and expected end if it starts at `time`: a later
    /// reservation counts this capacity as held until then.
    need: Need,
    end: Micros,
}

/// What a job that would still run at `end` may take on reserved nodes: per node, the
/// least slack of the reservations due before `end` (the ones it could delay). None when
/// it could delay none of them.
fn limit_for(resvs: &[Resv], end: Micros) -> Option<std::borrow::Cow<'_, HashMap<NodeIx, Res>>> {
    let mut due = resvs.iter().filter(|v| end > v.time);
    let first = due.next()?;
    let mut rest = due.peekable();
    if rest.peek().is_none() {
        return Some(std::borrow::Cow::Borrowed(&first.slack));
    }
    let mut m = first.slack.clone();
    for v in rest {
        for (n, s) in &v.slack {
            m.entry(*n).and_modify(|e| *e = e.min(*s)).or_insert(*s);
        }
    }
    Some(std::borrow::Cow::Owned(m))
}

/// A job ending at `end` took `held`: the reservations due before `end` have that much
/// less slack on those nodes, so no later job can take it again.
fn use_slack(resvs: &mut [Resv], end: Micros, held: &[(NodeIx, Need)]) {
    for v in resvs.iter_mut().filter(|v| end > v.time) {
        for (n, d) in held {
            if let Some(s) = v.slack.get_mut(n) {
                *s -= d.res();
            }
        }
    }
}

/// Capacity the timeline of a reservation releases: a job's replicas, or an earlier
/// reservation's nodes (so many replicas of its need on each).
#[derive(Clone, Copy)]
enum Placed<'a> {
    Each(&'a [(NodeIx, Need)]),
    Reserved(&'a Resv),
}

/// Per-node values of a [`View`], valid where the node's stamp is the current one: a new
/// view is one increment, not a pass over the fleet.
#[derive(Default)]
struct Scratch {
    stamp: Vec<u32>,
    /// Free CPUs, memory and accelerators, and whether the timeline released capacity
    /// on the node.
    vals: Vec<(i64, i64, i64, bool)>,
    current: u32,
}

impl Scratch {
    /// Forget every value (for a fleet of `n` nodes).
    fn reset(&mut self, n: usize) {
        if self.stamp.len() != n || self.current == u32::MAX {
            self.stamp = vec![0; n];
            self.vals = vec![(0, 0, 0, false); n];
            self.current = 0;
        }
        self.current += 1;
    }
}

/// Scratch space is no part of a cluster's state: a copy starts empty and it prints as
/// nothing.
impl Clone for Scratch {
    fn clone(&self) -> Scratch {
        Scratch::default()
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scratch")
    }
}

/// The free capacity a reservation is computed on: the round's, with the nodes that
/// changed (the holds of earlier reservations, the capacity the timeline releases) kept
/// in the scratch space.
struct View<'w> {
    w: &'w Work,
    t: &'w NodeTable,
    need: Need,
    s: &'w mut Scratch,
}

impl<'w> View<'w> {
    fn new(w: &'w Work, t: &'w NodeTable, need: Need, s: &'w mut Scratch) -> View<'w> {
        s.reset(t.len());
        View { w, t, need, s }
    }

    fn get(&self, n: NodeIx) -> (i64, i64, i64) {
        let i = n as usize;
        if self.s.stamp[i] == self.s.current {
            let (c, m, a, _) = self.s.vals[i];
            (c, m, a)
        } else {
            (self.w.cpus[i], self.w.mem[i], self.w.acc[i])
        }
    }

    /// Replicas of the need that fit on `n` in this view.
    fn slots(&self, n: NodeIx) -> i64 {
        let (c, m, a) = self.get(n);
        slots(c, m, a, self.t.acc_type[n as usize], &self.need)
    }

    /// Add to a node's free amounts (negative: hold); true when this is the first
    /// release on it.
    fn add(&mut self, n: NodeIx, cpus: i64, mem: i64, acc: i64) -> bool {
        let (c, m, a) = self.get(n);
        let i = n as usize;
        let was = self.s.stamp[i] == self.s.current && self.s.vals[i].3;
        let release = cpus > 0 || mem > 0 || acc > 0;
        self.s.stamp[i] = self.s.current;
        self.s.vals[i] = (c + cpus, m + mem, a + acc, was || release);
        release && !was
    }

    fn released(&self, n: NodeIx) -> bool {
        let i = n as usize;
        self.s.stamp[i] == self.s.current && self.s.vals[i].3
    }
}

struct Proj<'a> {
    name: &'a str,
    usage: Vec<i64>,
    weight: f64,
    share: f64,
    queue: Vec<usize>,
    next: usize,
}

/// The order in which waiting jobs are considered: the priority classes from the highest
/// value down, each a [`Level`].
struct Queue<'a> {
    levels: Vec<Level<'a>>,
    at: usize,
}

impl<'a> Queue<'a> {
    fn build(c: &Cluster, reqs: &[Request<'a>], cfg: &SchedulerConfig, now: Micros) -> Queue<'a> {
        let mut values: Vec<i64> = reqs.iter().map(|r| r.priority).collect();
        values.sort_unstable_by(|a, b| b.cmp(a));
        values.dedup();
        let levels = values.into_iter().map(|v| Level::build(c, reqs, cfg, now, v)).collect();
        Queue { levels, at: 0 }
    }

    fn next(&mut self, reqs: &[Request]) -> Option<(usize, bool)> {
        while let Some(level) = self.levels.get_mut(self.at) {
            if let Some(next) = level.next(reqs) {
                return Some(next);
            }
            self.at += 1;
        }
        None
    }

    /// No SPOT job is in the round (strict order may stop at a blocked job).
    fn no_spot(&self) -> bool {
        self.levels.iter().all(|l| l.spot.is_empty())
    }
}

/// The jobs of one priority value in the order they are considered: jobs that already
/// hold quota, then starving jobs (oldest first), then the fair order (lowest weighted
/// dominant share first; it changes as jobs are placed) or FIFO, then SPOT jobs.
struct Level<'a> {
    lists: [Vec<usize>; 3],
    list: usize,
    at: usize,
    projects: Vec<Proj<'a>>,
    spot: Vec<usize>,
    spot_at: usize,
}

impl Level<'_> {
    fn next(&mut self, reqs: &[Request]) -> Option<(usize, bool)> {
        while self.list < 3 {
            if let Some(&i) = self.lists[self.list].get(self.at) {
                self.at += 1;
                return Some((i, false));
            }
            self.list += 1;
            self.at = 0;
        }
        let mut best: Option<(usize, (f64, Micros, u64))> = None;
        for (p, pr) in self.projects.iter().enumerate() {
            if let Some(&i) = pr.queue.get(pr.next) {
                let key = (pr.share, reqs[i].submitted, reqs[i].id);
                if best.as_ref().is_none_or(|(_, b)| key.partial_cmp(b) == Some(std::cmp::Ordering::Less)) {
                    best = Some((p, key));
                }
            }
        }
        if let Some((p, _)) = best {
            let pr = &mut self.projects[p];
            pr.next += 1;
            return Some((pr.queue[pr.next - 1], true));
        }
        let i = *self.spot.get(self.spot_at)?;
        self.spot_at += 1;
        Some((i, false))
    }
}

struct Round<'a, 'r> {
    c: &'a Cluster,
    cfg: &'a SchedulerConfig,
    now: Micros,
    w: Work,
    out: Vec<Decision>,
    /// Reservations in the order they were made (the order of the jobs).
    resvs: Vec<Resv>,
    /// This round's placements: expected end and what they hold (for the timeline).
    placed: Vec<(Micros, Vec<(NodeIx, Need)>)>,
    /// Uniform shapes that did not fit (anything at least as big does not fit either).
    failed: Vec<(Need, usize)>,
    /// The same, for jobs that would run past a reservation, with their expected end: a
    /// job that ends no earlier is bound by at least the same reservations.
    failed_long: Vec<(Need, usize, Micros)>,
    empty_fit: HashMap<(Need, usize), bool>,
    empty_fit_mixed: HashMap<Vec<Need>, bool>,
    /// Mixed gangs that did not fit this round: as a job that ends before every
    /// reservation, and the earliest end of one that failed running past some.
    failed_mixed: HashMap<Vec<Need>, (bool, Option<Micros>)>,
    /// Shapes that can never fit the fleet (see `Cluster::never_fits`), by shape.
    never_uniform: HashMap<(Need, usize), Option<NeverFit>>,
    never_mixed: HashMap<Vec<Need>, Option<NeverFit>>,
    chosen: HashSet<u64>,
    preempt_tries: usize,
    /// Strict order (no backfill): a job ahead does not fit, so nothing passes it.
    blocked: bool,
    /// Quota through the round (L3), with the cohorts' reclaims.
    book: Book<'r>,
    /// Reasons already written this round, by what they depend on; cleared whenever the
    /// round's state moves (a placement, a reservation, a preemption).
    memo: HashMap<Memo, Arc<str>>,
    /// The highest priority of a job that waits for capacity so far this round.
    waiting_max: Option<i64>,
    /// The job being decided waits behind a job of a higher priority class.
    behind_higher: bool,
    /// The cluster's scratch space, for the reservations (see [`View`]).
    scratch: Scratch,
}

/// What a memoised waiting reason depends on, besides the round's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Memo {
    Quota(Vec<(String, u64, u64, u64)>),
    Blocked,
    Capacity(Vec<Need>, bool, bool),
}

impl Round<'_, '_> {
    /// The reason for `key`, written once per state of the round.
    fn memo(&mut self, key: Memo, make: impl FnOnce(&mut Self) -> String) -> Arc<str> {
        if let Some(r) = self.memo.get(&key) {
            return Arc::clone(r);
        }
        let r: Arc<str> = make(self).into();
        self.memo.insert(key, Arc::clone(&r));
        r
    }
}

fn dominated(list: &[(Need, usize)], need: &Need, count: usize) -> bool {
    list.iter().any(|(n, k)| need.covers(n) && count >= *k)
}

/// A job ending at `end` is bound by every reservation an earlier failure ending no later
/// was bound by (reservations are only added within a round, and slack only shrinks).
fn dominated_long(list: &[(Need, usize, Micros)], need: &Need, count: usize, end: Micros) -> bool {
    list.iter().any(|(n, k, e)| need.covers(n) && count >= *k && end >= *e)
}

fn remember_long(list: &mut Vec<(Need, usize, Micros)>, need: Need, count: usize, end: Micros) {
    if dominated_long(list, &need, count, end) {
        return;
    }
    list.retain(|(n, k, e)| !(n.covers(&need) && *k >= count && *e >= end));
    list.push((need, count, end));
}

fn remember(list: &mut Vec<(Need, usize)>, need: Need, count: usize) {
    if dominated(list, &need, count) {
        return;
    }
    list.retain(|(n, k)| !(n.covers(&need) && *k >= count));
    list.push((need, count));
}

/// `1 node`, `2 nodes`.
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a waiting reason adds for a job past the starvation bound.
fn starving_note(cfg: &SchedulerConfig) -> String {
    let bound = cfg.starvation_secs.map(|s| fmt_dur(secs(s))).unwrap_or_default();
    format!("; it has waited past the starvation bound ({bound}), so it goes ahead of the fair-share order")
}

/// RFC 3339 (UTC, seconds) of a time in µs since the epoch (the epoch itself for an
/// instant `time` cannot hold).
pub fn rfc3339(us: Micros) -> String {
    crate::clock_text::rfc3339(us, crate::clock_text::Digits::Seconds)
}

fn fmt_dur(us: Micros) -> String {
    let s = (us.max(0) + SECOND - 1) / SECOND;
    let (d, h, m) = (s / 86400, (s % 86400) / 3600, (s % 3600) / 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {}s", s % 60)
    } else {
        format!("{s}s")
    }
}

fn describe(t: &NodeTable, shape: &Shape) -> String {
    let k = shape.needs.len();
    let plural = if k == 1 { "" } else { "s" };
    if shape.uniform && k > 0 {
        let d = &shape.needs[0];
        // 1.5 GiB as it is, never rounded to 2.
        let gib = crate::capacity::gib_text(d.mem);
        if d.acc_type == NO_ACC {
            format!("{k} replica{plural} of {} CPUs and {gib} GiB", d.cpus)
        } else {
            format!("{k} replica{plural} of {} x {} ({} CPUs, {gib} GiB)", d.acc, t.acc_name(d.acc_type), d.cpus)
        }
    } else {
        format!("{k} replicas of mixed sizes")
    }
}

fn node_list(t: &NodeTable, nodes: &[(NodeIx, i64)]) -> String {
    let mut s: Vec<&str> = nodes.iter().take(4).map(|(n, _)| t.names[*n as usize].as_str()).collect();
    let more = nodes.len().saturating_sub(4);
    let mut out = s.join(", ");
    if more > 0 {
        s.clear();
        out.push_str(&format!(" and {more} more"));
    }
    out
}

impl<'a, 'r> Round<'a, 'r> {
    /// A job that can never fit, not even on the whole fleet up and empty, fails instead
    /// of waiting (for quota or capacity) or being retried as a stockout. Asked only of
    /// jobs that are not placed.
    fn impossible(&mut self, r: &Request) -> Option<Decision> {
        let nf = self.never_fits(r.shape)?;
        let t = &self.c.table;
        let reason = format!(
            "The job can never be placed on this fleet, not even with every node up and free: {} {}.",
            match nf {
                NeverFit::Replica(i) => format!("replica {i}"),
                NeverFit::Gang => format!("its {}", describe(t, r.shape)),
            },
            nf.detail(t, r.shape, &|_| None),
        );
        Some(Decision::Impossible { job: r.id, reason })
    }

    /// `Cluster::never_fits`, once per shape and round.
    fn never_fits(&mut self, shape: &Shape) -> Option<NeverFit> {
        if shape.needs.is_empty() {
            return None;
        }
        if shape.uniform {
            let key = (shape.needs[0], shape.needs.len());
            if let Some(&v) = self.never_uniform.get(&key) {
                return v;
            }
            let v = self.c.never_fits(shape);
            self.never_uniform.insert(key, v);
            return v;
        }
        if let Some(&v) = self.never_mixed.get(shape.needs.as_slice()) {
            return v;
        }
        let v = self.c.never_fits(shape);
        self.never_mixed.insert(shape.needs.clone(), v);
        v
    }

    fn fits_empty(&mut self, shape: &Shape) -> bool {
        let t = &self.c.table;
        if shape.needs.is_empty() {
            return true;
        }
        if shape.uniform {
            let key = (shape.needs[0], shape.needs.len());
            if let Some(&f) = self.empty_fit.get(&key) {
                return f;
            }
            let d = &shape.needs[0];
            let mut total = 0i64;
            for i in 0..t.len() {
                if t.usable[i] {
                    total += slots(t.cap_cpus[i], t.cap_mem[i], t.cap_acc[i], t.acc_type[i], d);
                    if total >= key.1 as i64 {
                        break;
                    }
                }
            }
            let f = total >= key.1 as i64;
            self.empty_fit.insert(key, f);
            return f;
        }
        if let Some(&f) = self.empty_fit_mixed.get(shape.needs.as_slice()) {
            return f;
        }
        let f = Work::new(t).place_gang_exact(t, shape, None, PLACE_SEARCH_BUDGET).is_some();
        self.empty_fit_mixed.insert(shape.needs.clone(), f);
        f
    }

    fn stockout_detail(&self) -> String {
        let t = &self.c.table;
        let usable = t.usable.iter().filter(|u| **u).count();
        format!("{} of {} nodes usable ({} down, {} drained)", usable, t.len(), t.down, t.drained)
    }

    /// The placements of the jobs that would be released, for the timeline and
    /// preemption: SPOT jobs (and stopping ones) at `now` when preemption is on.
    fn release_now(&self) -> impl Iterator<Item = (u64, &'a Running)> + '_ {
        let c = self.c;
        let spot_on = self.cfg.preemption;
        let stopping_on = self.cfg.preemption || self.cfg.priority_preemption;
        c.spot
            .iter()
            .filter(move |_| spot_on)
            .chain(c.stopping.iter().filter(move |_| stopping_on))
            .filter(|id| !self.chosen.contains(id))
            .filter_map(move |id| Some((*id, c.running.get(id)?)))
    }

    /// EASY: when will `r` fit, and on which nodes, if running jobs end as expected?
    /// Works on a sparse view of the round's free capacity (only the nodes that earlier
    /// reservations hold or that the timeline releases are copied), so that its cost
    /// follows the nodes it looks at, not the fleet's size: a round may make up to
    /// `max_reservations` of them.
    fn reserve(&mut self, r: &Request) -> Option<Resv> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let made = self.reserve_on(r, &mut scratch);
        self.scratch = scratch;
        made
    }

    fn reserve_on(&self, r: &Request, scratch: &mut Scratch) -> Option<Resv> {
        let c = self.c;
        let t = &c.table;
        let need = r.shape.max_need();
        let count = r.shape.needs.len() as i64;
        let mut view = View::new(&self.w, t, need, scratch);
        // Earlier reservations hold their capacity from now until their expected end:
        // this one is then placed around them and cannot delay them. Counting it as held
        // from now (not from their start) can only make this reservation later, never
        // conflict with theirs.
        for v in &self.resvs {
            for &(n, k) in &v.nodes {
                let acc = if v.need.acc_type != NO_ACC { k * v.need.acc } else { 0 };
                view.add(n, -k * v.need.cpus, -k * v.need.mem, acc.saturating_neg());
            }
        }
        // Only the candidates can hold a replica: holds only take capacity away.
        let candidates = self.w.candidates(t, &need);
        let mut total: i64 = candidates.iter().map(|&n| view.slots(n)).sum();
        let mut touched: Vec<NodeIx> = Vec::new();
        let mut release_one = |view: &mut View, n: NodeIx, d: &Need, k: i64, total: &mut i64| {
            if !t.usable[n as usize] {
                return;
            }
            let before = view.slots(n);
            let acc = if d.acc_type != NO_ACC { k * d.acc } else { 0 };
            if view.add(n, k * d.cpus, k * d.mem, acc) {
                touched.push(n);
            }
            *total += view.slots(n) - before;
        };
        let mut release = |view: &mut View, placed: Placed, total: &mut i64| match placed {
            Placed::Each(placed) => placed.iter().for_each(|(n, d)| release_one(view, *n, d, 1, total)),
            Placed::Reserved(v) => v.nodes.iter().for_each(|(n, k)| release_one(view, *n, &v.need, *k, total)),
        };
        let mut time = self.now;
        if total < count {
            let mut done = false;
            let early: HashSet<u64> = self.release_now().map(|(id, _)| id).collect();
            for (_, run) in self.release_now() {
                release(&mut view, Placed::Each(&run.placed), &mut total);
            }
            if total >= count {
                done = true;
            }
            // This round's placements and earlier reservations free at their expected ends.
            let mut mine: Vec<(Micros, Placed)> = self.placed.iter().map(|p| (p.0, Placed::Each(&p.1))).collect();
            mine.extend(self.resvs.iter().map(|v| (v.end, Placed::Reserved(v))));
            mine.sort_by_key(|p| p.0);
            let mut mine = mine.into_iter().peekable();
            let mut theirs = c.by_end.iter().filter(|(_, id)| !early.contains(id) && !self.chosen.contains(id)).peekable();
            while !done {
                let take_mine = match (mine.peek(), theirs.peek()) {
                    (Some(a), Some(b)) => a.0 <= b.0,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let (end, placed) = if take_mine {
                    mine.next().expect("peeked")
                } else {
                    let (end, id) = theirs.next().expect("peeked");
                    match c.running.get(id) {
                        Some(run) => (*end, Placed::Each(&run.placed)),
                        None => continue,
                    }
                };
                release(&mut view, placed, &mut total);
                if total >= count {
                    time = end.max(self.now);
                    done = true;
                }
            }
            if !done {
                return None;
            }
        }
        // Reserve nodes that free up first (so nodes free now stay open to backfill),
        // then nodes free now, by index.
        let mut left = count;
        let mut nodes = Vec::new();
        let mut slack = HashMap::default();
        let mut take = |n: NodeIx, left: &mut i64| {
            let k = view.slots(n).min(*left);
            if k > 0 {
                *left -= k;
                nodes.push((n, k));
                let held = need.res();
                let (pc, pm, pa) = view.get(n);
                slack.insert(n, Res::new(pc - k * held.cpus, pm - k * held.mem, pa - k * held.acc));
            }
        };
        for &n in &touched {
            if left == 0 {
                break;
            }
            take(n, &mut left);
        }
        if left > 0 {
            let mut rest: Vec<NodeIx> = candidates.into_iter().filter(|n| !view.released(*n)).collect();
            rest.sort_unstable();
            for n in rest {
                if left == 0 {
                    break;
                }
                take(n, &mut left);
            }
        }
        if left > 0 {
            // The slots counted above are not all usable at once (earlier reservations'
            // holds were released into the count): no reservation this round.
            return None;
        }
        Some(Resv { time, nodes, slack, need, end: time.saturating_add(r.duration) })
    }

    /// Free `r`'s room by preempting the cheapest set of SPOT jobs (or by claiming the
    /// room of jobs already stopping for a preemption). Returns the jobs to preempt and
    /// the stopping jobs waited for.
    fn preempt_for(&mut self, r: &Request, limit: Option<&HashMap<NodeIx, Res>>) -> Option<(Vec<u64>, Vec<u64>)> {
        let c = self.c;
        let t = &c.table;
        let min_run = secs(self.cfg.spot_min_runtime_secs);
        // Lost work (resources x time since it was last saved), so the youngest and
        // smallest go first; jobs already stopping cost nothing. SPOT jobs go before jobs
        // of a lower priority class.
        let lost = |run: &Running, since: Micros| {
            let units: i64 = run.placed.iter().map(|(_, d)| if d.acc_type == NO_ACC { d.cpus } else { d.acc * 1000 }).sum();
            1 + units.max(1) as u128 * (self.now - since).max(0) as u128
        };
        let mut cands: Vec<(u8, u128, u64, &Running)> = self
            .release_now()
            .filter(|(_, run)| run.stopping || self.now.saturating_sub(run.start) >= min_run)
            .map(|(id, run)| (0, if run.stopping { 0 } else { lost(run, run.start) }, id, run))
            .collect();
        if self.cfg.priority_preemption && !r.spot {
            let lower = c
                .running
                .iter()
                .filter(|(id, run)| !run.spot && !run.stopping && run.preemptible && run.priority < r.priority && !self.chosen.contains(*id))
                .map(|(id, run)| (1, lost(run, run.lost_since), *id, run));
            cands.extend(lower);
        }
        if cands.is_empty() {
            return None;
        }
        let m0 = self.w.mark();
        for (_, _, _, run) in &cands {
            for (n, d) in &run.placed {
                self.w.give(t, *n, d);
            }
        }
        let fits_all = self.w.place_gang(t, r.shape, limit).is_some();
        self.w.rollback(t, m0);
        if !fits_all {
            return None;
        }
        cands.sort_by_key(|(tier, cost, id, run)| (*tier, *cost, std::cmp::Reverse(run.start), *id));
        let uniform = r.shape.uniform.then(|| (r.shape.needs[0], r.shape.needs.len() as i64));
        let mut k = 0;
        while k < cands.len() {
            for (n, d) in &cands[k].3.placed {
                self.w.give(t, *n, d);
            }
            k += 1;
            if uniform.is_some_and(|(d, cnt)| self.w.slot_bound(t, &d) < cnt) {
                continue;
            }
            let m1 = self.w.mark();
            let ok = self.w.place_gang(t, r.shape, limit).is_some();
            self.w.rollback(t, m1);
            if ok {
                break;
            }
        }
        let mut set: Vec<usize> = (0..k).collect();
        // Drop what is not needed, most expensive first.
        if set.len() <= 64 {
            for j in (0..set.len()).rev() {
                self.w.rollback(t, m0);
                for (x, &s) in set.iter().enumerate() {
                    if x != j {
                        for (n, d) in &cands[s].3.placed {
                            self.w.give(t, *n, d);
                        }
                    }
                }
                let m1 = self.w.mark();
                let ok = self.w.place_gang(t, r.shape, limit).is_some();
                self.w.rollback(t, m1);
                if ok {
                    set.remove(j);
                }
            }
        }
        self.w.rollback(t, m0);
        let mut before: HashMap<NodeIx, (i64, i64, i64)> = HashMap::default();
        for &s in &set {
            for (n, _) in &cands[s].3.placed {
                let i = *n as usize;
                before.entry(*n).or_insert((self.w.cpus[i], self.w.mem[i], self.w.acc[i]));
            }
        }
        for &s in &set {
            for (n, d) in &cands[s].3.placed {
                self.w.give(t, *n, d);
            }
        }
        // The job's claim: free now where it fits now, else the room the stopping SPOT
        // jobs will leave. Nothing still held is handed to anyone else.
        let m2 = self.w.mark();
        let nodes = self.w.place_gang(t, r.shape, limit);
        self.w.rollback(t, m2);
        let Some(nodes) = nodes else {
            self.w.rollback(t, m0);
            return None;
        };
        for (n, d) in nodes.iter().zip(&r.shape.needs) {
            let i = *n as usize;
            before.entry(*n).or_insert((self.w.cpus[i], self.w.mem[i], self.w.acc[i]));
            self.w.take(t, *n, d);
        }
        let mut before: Vec<(NodeIx, (i64, i64, i64))> = before.into_iter().collect();
        before.sort_unstable_by_key(|(n, _)| *n);
        for (n, (c0, m0, a0)) in before {
            let i = n as usize;
            let (c1, m1, a1) = (self.w.cpus[i], self.w.mem[i], self.w.acc[i]);
            self.w.set(t, n, c0.min(c1), m0.min(m1), a0.min(a1));
        }
        let claimed: Vec<(NodeIx, Need)> = nodes.iter().copied().zip(r.shape.needs.iter().copied()).collect();
        self.placed.push((self.now.saturating_add(r.duration), claimed));
        let mut preempt = Vec::new();
        let mut stopping = Vec::new();
        for &s in &set {
            let (_, _, id, run) = cands[s];
            self.chosen.insert(id);
            if run.stopping {
                stopping.push(id);
            } else {
                preempt.push(id);
            }
        }
        Some((preempt, stopping))
    }
}

/// The admission round on a capacity state: quota (L3), then the order (fair share or
/// FIFO), best-fit gang placement, EASY reservation and backfill, SPOT preemption, and
/// stockouts (L15). Pure: the decisions depend only on the arguments, and the cluster is
/// left exactly as it was. The round works on the cluster's own free capacity (trial
/// placements journaled, rolled back at the end) rather than on a copy: a copy of a large
/// fleet's capacity index costs more than the rest of a round.
pub fn plan<'r>(
    c: &mut Cluster,
    reqs: &'r [Request<'r>],
    quotas: &'r Quotas,
    quota_used: &'r QuotaUse,
    now: Micros,
    cfg: &SchedulerConfig,
) -> Vec<Decision> {
    let mut w = std::mem::take(&mut c.free);
    let scratch = std::mem::take(&mut c.scratch);
    let mark = w.mark();
    let c_ro: &Cluster = c;
    let mut q = Queue::build(c_ro, reqs, cfg, now);
    let mut book = Book::new(quotas, quota_used, cfg.priority_preemption);
    for r in reqs.iter().filter(|r| !r.admitted) {
        book.want(r.project, r.metrics);
    }
    let mut rd = Round::new(c_ro, w, scratch, cfg, now, book);
    let mut positions = Positions::new(reqs, cfg.order == Order::Fifo);
    while let Some((i, _fair)) = q.next(reqs) {
        let r = &reqs[i];
        let position = positions.next(r);
        if rd.decide(r, position, &mut q) == Next::Stop {
            break;
        }
    }
    let Round { out, w: work, scratch, .. } = rd;
    w = work;
    w.rollback(&c.table, mark);
    c.free = w;
    c.scratch = scratch;
    out
}

/// Whether a round goes on after a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Continue,
    /// Strict order without explanations: nothing after it can start.
    Stop,
}

/// Positions among a job's own project's waiting jobs: a waiting reason says nothing of
/// other projects' queues.
struct Positions<'r> {
    totals: HashMap<&'r str, u32>,
    seen: HashMap<&'r str, u32>,
    fifo: bool,
}

impl<'r> Positions<'r> {
    fn new(reqs: &'r [Request], fifo: bool) -> Positions<'r> {
        let mut totals: HashMap<&str, u32> = HashMap::default();
        for r in reqs {
            *totals.entry(r.project).or_default() += 1;
        }
        Positions { totals, seen: HashMap::default(), fifo }
    }

    fn next(&mut self, r: &Request<'r>) -> Option<Position> {
        let pos = self.seen.entry(r.project).or_default();
        *pos += 1;
        Some(Position { pos: *pos, total: self.totals.get(r.project).copied().unwrap_or(*pos), fifo: self.fifo })
    }
}

/// The lists of [`Level`]: jobs admitted before (they go first), jobs past the
/// starvation bound, and FIFO's one list; fair share's per-project queues come after.
const ADMITTED: usize = 0;
const STARVING: usize = 1;
const FIFO: usize = 2;

impl<'a> Level<'a> {
    /// The order of the jobs of priority `value`: admitted jobs, then jobs past the
    /// starvation bound (ahead of the fair-share order; their waiting reasons say so), then
    /// FIFO or each project's queue by fair share; SPOT jobs (with preemption) on a list of
    /// their own.
    fn build(c: &Cluster, reqs: &[Request<'a>], cfg: &SchedulerConfig, now: Micros, value: i64) -> Level<'a> {
        let mut q = Level { lists: [Vec::new(), Vec::new(), Vec::new()], list: 0, at: 0, projects: Vec::new(), spot: Vec::new(), spot_at: 0 };
        let mut pidx: HashMap<&str, usize> = HashMap::default();
        let starve = cfg.starvation_secs.map(|s| now.saturating_sub(secs(s)));
        for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.priority == value) {
            if r.spot && cfg.preemption {
                q.spot.push(i);
            } else if r.admitted {
                q.lists[ADMITTED].push(i);
            } else if cfg.order == Order::Fifo {
                q.lists[FIFO].push(i);
            } else if starve.is_some_and(|s| r.submitted <= s) {
                q.lists[STARVING].push(i);
            } else {
                let p = *pidx.entry(r.project).or_insert_with(|| {
                    let usage = c.usage.get(r.project).cloned().unwrap_or_else(|| vec![0; c.totals.len()]);
                    let weight = cfg.weight(r.project);
                    let share = c.share(r.project, &usage, weight);
                    q.projects.push(Proj { name: r.project, usage, weight, share, queue: Vec::new(), next: 0 });
                    q.projects.len() - 1
                });
                q.projects[p].queue.push(i);
            }
        }
        let key = |&i: &usize| (reqs[i].submitted, reqs[i].id);
        for l in &mut q.lists {
            l.sort_by_key(key);
        }
        for p in &mut q.projects {
            p.queue.sort_by_key(key);
        }
        q.spot.sort_by_key(|&i| (!reqs[i].admitted, reqs[i].submitted, reqs[i].id));
        q
    }
}

/// What became of a job's try at a place this round.
struct Miss {
    /// It was not even tried (a shape known not to fit this round).
    skip: bool,
    /// When it would end if it started now.
    end: Micros,
    /// It would still run when a reservation is due.
    long: bool,
    /// Its one replica need and count, when every replica is alike.
    uniform: Option<(Need, usize)>,
}

impl<'a, 'r> Round<'a, 'r> {
    /// A round on `c`, whose free capacity `w` is (taken out of `c` for the round).
    fn new(c: &'a Cluster, w: Work, scratch: Scratch, cfg: &'a SchedulerConfig, now: Micros, book: Book<'r>) -> Round<'a, 'r> {
        Round {
            c,
            cfg,
            now,
            w,
            out: Vec::new(),
            resvs: Vec::new(),
            placed: Vec::new(),
            failed: Vec::new(),
            failed_long: Vec::new(),
            empty_fit: HashMap::default(),
            empty_fit_mixed: HashMap::default(),
            never_uniform: HashMap::default(),
            never_mixed: HashMap::default(),
            failed_mixed: HashMap::default(),
            chosen: HashSet::default(),
            preempt_tries: 0,
            blocked: false,
            book,
            memo: HashMap::default(),
            waiting_max: None,
            behind_higher: false,
            scratch,
        }
    }

    /// Past the starvation bound: it goes ahead of the fair-share order.
    fn starving(&self, r: &Request) -> bool {
        let cfg = self.cfg;
        cfg.order != Order::Fifo
            && !r.admitted
            && !(r.spot && cfg.preemption)
            && cfg.starvation_secs.is_some_and(|s| r.submitted <= self.now.saturating_sub(secs(s)))
    }

    /// One job's decision, in the order of the rules: its quota (L3), a strict order
    /// that is blocked, a place now, then (not placed) a shape that can never fit, SPOT's
    /// wait, preemption, a stockout (L15), a reservation, or a wait behind others.
    fn decide(
        &mut self,
        r: &'r Request<'r>,
        position: Option<Position>,
        q: &mut Queue,
    ) -> Next {
        if self.waits_for_quota(r, position) {
            return Next::Continue;
        }
        let spot_mode = r.spot && self.cfg.preemption;
        self.behind_higher = self.waiting_max.is_some_and(|m| m > r.priority);
        if self.blocked && !spot_mode {
            return self.behind_blocked(r, position, q.no_spot());
        }
        if let Some(nodes) = self.place_avoiding(r) {
            self.placed_now(r, &nodes, q);
            return Next::Continue;
        }
        let miss = match self.try_place(r) {
            Ok(nodes) => {
                self.placed_now(r, &nodes, q);
                return Next::Continue;
            }
            Err(miss) => miss,
        };
        if let Some(d) = self.impossible(r) {
            self.out.push(d);
            return Next::Continue;
        }
        if let Some((d, k)) = miss.uniform.filter(|_| !miss.skip) {
            if miss.long {
                remember_long(&mut self.failed_long, d, k, miss.end);
            } else {
                remember(&mut self.failed, d, k);
            }
        }
        if !spot_mode {
            self.waiting_max = Some(self.waiting_max.map_or(r.priority, |m| m.max(r.priority)));
        }
        if spot_mode {
            self.spot_waits(r, position);
        } else if !self.preempted_for(r, position, &miss, q) && !self.stockout(r) && !self.reserved_or_blocked(r, position) {
            self.waits_behind(r, position, &miss);
        }
        Next::Continue
    }

    /// L3: QUEUED while the quota cannot cover all replicas at once (or never can), or
    /// while quota its project lent to its cohort comes back (the borrowing jobs are
    /// preempted for it, `Decision::Preempt` with `reclaim`).
    fn waits_for_quota(&mut self, r: &'r Request<'r>, position: Option<Position>) -> bool {
        if r.admitted || r.metrics.is_empty() {
            return false;
        }
        let check = self.book.check(r.project, r.metrics, r.may_borrow);
        if check == Check::Fits {
            return false;
        }
        if let Check::Short(..) = check {
            if let Some(d) = self.impossible(r) {
                self.out.push(d);
                return true;
            }
        }
        if let Check::Reclaim { victims, .. } = &check {
            // Its quota is claimed for the rest of the round.
            self.book.charge(r.project, r.metrics);
            self.out.extend(victims.iter().map(|v| reclaim_decision(*v)));
            self.memo.clear();
        }
        if self.cfg.explain {
            let reason = match &check {
                Check::Short(short, None) => {
                    self.memo(Memo::Quota(short.iter().map(|(m, a, b, c)| (m.to_string(), *a, *b, *c)).collect()), |_| {
                        format!("Waiting for quota: {}", quota_text(short))
                    })
                }
                _ => quota_reason(&check).map(|(_, r)| r).unwrap_or_default().into(),
            };
            let kind = quota_reason(&check).map_or(KIND_QUOTA, |(k, _)| k);
            self.out.push(Decision::Wait { job: r.id, kind, reason, position, reserved_at: None });
        }
        true
    }

    /// Strict order (no backfill): nothing passes the first job that does not fit.
    fn behind_blocked(&mut self, r: &Request, position: Option<Position>, no_spot: bool) -> Next {
        if let Some(d) = self.impossible(r) {
            self.out.push(d);
            return Next::Continue;
        }
        if !self.cfg.explain {
            return if no_spot { Next::Stop } else { Next::Continue };
        }
        let reason = self.memo(Memo::Blocked, |_| {
            "Waiting for capacity held by other jobs: a job ahead of it does not fit yet, and nothing passes it (no backfill)".to_string()
        });
        let reason = self.with_priority_note(reason);
        self.out.push(Decision::Wait { job: r.id, kind: KIND_BLOCKED, reason, position, reserved_at: None });
        Next::Continue
    }

    /// A place for the whole gang now. Backfill must not delay any reservation: a job
    /// that would still run when one is due takes only what that reservation leaves on
    /// its nodes (SPOT jobs too, else they would be placed on the reserved room only to
    /// be preempted when it is due); one that ends before every reservation goes on
    /// reserved nodes first, so that nodes nobody waits for stay open to longer jobs.
    fn try_place(&mut self, r: &Request) -> Result<Vec<NodeIx>, Miss> {
        let t = &self.c.table;
        let end = self.now.saturating_add(r.duration);
        let long = self.resvs.iter().any(|v| end > v.time);
        let uniform = r.shape.uniform.then(|| (r.shape.needs[0], r.shape.needs.len()));
        let skip = uniform.is_some_and(|(d, k)| {
            dominated(&self.failed, &d, k) || (long && dominated_long(&self.failed_long, &d, k, end)) || self.w.slot_bound(t, &d) < k as i64
        });
        // A mixed gang that found no room earlier in the round finds none now either:
        // free capacity only shrinks within a round.
        let failed_before =
            self.failed_mixed.get(r.shape.needs.as_slice()).is_some_and(|f| f.0 || (long && f.1.is_some_and(|e| end >= e)));
        let skip = skip || (!r.shape.uniform && failed_before);
        let miss = Miss { skip, end, long, uniform };
        if skip {
            return Err(miss);
        }
        let limit = if long { limit_for(&self.resvs, end) } else { None };
        let mut placed = if !long && !self.resvs.is_empty() {
            let prefer: Vec<NodeIx> = self.resvs.iter().flat_map(|v| v.nodes.iter().map(|(n, _)| *n)).collect();
            self.w.place_gang_prefer(t, r.shape, None, &prefer)
        } else {
            self.w.place_gang(t, r.shape, limit.as_deref())
        };
        if placed.is_none() && !r.shape.uniform {
            // The greedy passes can miss a packing of a mixed gang: search for one.
            placed = self.w.place_gang_exact(t, r.shape, limit.as_deref(), PLACE_SEARCH_BUDGET);
        }
        drop(limit);
        match placed {
            Some(nodes) => Ok(nodes),
            None => {
                if !r.shape.uniform {
                    let f = self.failed_mixed.entry(r.shape.needs.clone()).or_default();
                    if long {
                        f.1 = Some(f.1.map_or(end, |e| e.min(end)));
                    } else {
                        f.0 = true;
                    }
                }
                Err(miss)
            }
        }
    }

    /// A place for a job whose replicas failed on some nodes, on other nodes: tried first
    /// (bound by the reservations as any placement is); None sends it to the usual
    /// placement, where those nodes count again.
    fn place_avoiding(&mut self, r: &Request) -> Option<Vec<NodeIx>> {
        if r.avoid.is_empty() {
            return None;
        }
        let t = &self.c.table;
        let end = self.now.saturating_add(r.duration);
        let long = self.resvs.iter().any(|v| end > v.time);
        let limit = if long { limit_for(&self.resvs, end) } else { None };
        let m = self.w.mark();
        for &n in r.avoid.iter().filter(|n| (**n as usize) < t.len()) {
            self.w.set(t, n, 0, 0, 0);
        }
        let placed = self.w.place_gang(t, r.shape, limit.as_deref());
        drop(limit);
        self.w.rollback(t, m);
        let nodes = placed?;
        for (n, d) in nodes.iter().zip(&r.shape.needs) {
            self.w.take(t, *n, d);
        }
        Some(nodes)
    }

    /// What a job placed or claimed this round takes of the reservations' slack, its
    /// project's fair share and its quota.
    fn charge_placed(&mut self, r: &'r Request<'r>, held: &[(NodeIx, Need)], q: &mut Queue) {
        let end = self.now.saturating_add(r.duration);
        use_slack(&mut self.resvs, end, held);
        charge(q, r, held, self.c);
        self.charge_quota(r);
    }

    /// The job's quota, counted for the rest of the round (an admitted job's is already
    /// in the base).
    fn charge_quota(&mut self, r: &'r Request<'r>) {
        if !r.admitted {
            self.book.charge(r.project, r.metrics);
        }
    }

    fn placed_now(&mut self, r: &'r Request<'r>, nodes: &[NodeIx], q: &mut Queue) {
        let held: Vec<(NodeIx, Need)> = nodes.iter().copied().zip(r.shape.needs.iter().copied()).collect();
        self.charge_placed(r, &held, q);
        self.placed.push((self.now.saturating_add(r.duration), held));
        let names = nodes.iter().map(|n| self.c.table.names[*n as usize].clone()).collect();
        self.out.push(Decision::Place { job: r.id, nodes: names, warnings: Vec::new() });
        self.memo.clear();
    }

    /// A SPOT job waits for idle capacity (it never preempts or reserves).
    fn spot_waits(&mut self, r: &Request, position: Option<Position>) {
        if !self.cfg.explain {
            return;
        }
        let why = if self.fits_empty(r.shape) {
            "SPOT job waiting for idle capacity".to_string()
        } else {
            format!("SPOT job waiting: the usable fleet cannot hold it ({})", self.stockout_detail())
        };
        let reason = format!("{why}: needs {}", describe(&self.c.table, r.shape)).into();
        self.out.push(Decision::Wait { job: r.id, kind: KIND_SPOT, reason, position, reserved_at: None });
    }

    /// Preemption: SPOT jobs stopped for it (within the round's tries); it waits for
    /// them to stop, its place claimed meanwhile.
    fn preempted_for(&mut self, r: &'r Request<'r>, position: Option<Position>, miss: &Miss, q: &mut Queue) -> bool {
        let c = self.c;
        let by_priority = self.cfg.priority_preemption && !r.spot && c.running.values().any(|run| run.preemptible && run.priority < r.priority);
        if self.preempt_tries >= self.cfg.max_preemption_tries || !(by_priority || (self.cfg.preemption && !(c.spot.is_empty() && c.stopping.is_empty()))) {
            return false;
        }
        self.preempt_tries += 1;
        let slack = if miss.long { limit_for(&self.resvs, miss.end).map(std::borrow::Cow::into_owned) } else { None };
        let Some((victims, stopping)) = self.preempt_for(r, slack.as_ref()) else { return false };
        self.memo.clear();
        let held = self.placed.last().map(|p| p.1.clone()).unwrap_or_default();
        // What it claims on reserved nodes is slack no later job may take again.
        self.charge_placed(r, &held, q);
        let lower = victims.iter().filter(|v| c.running.get(v).is_some_and(|run| !run.spot)).count();
        for v in &victims {
            let by_priority = c.running.get(v).is_some_and(|run| !run.spot).then_some(r.priority);
            let reason = match by_priority {
                Some(p) => format!("its capacity is needed by a job of priority {p}"),
                None => "its capacity is needed by work that waits for it".to_string(),
            };
            self.out.push(Decision::Preempt { job: *v, reason, by_priority, reclaim: false });
        }
        if self.cfg.explain {
            // Each job by what it is: SPOT (preempted now or stopping), of a lower class
            // (preempted now), or already stopping for an earlier preemption.
            let spot = victims.iter().chain(&stopping).filter(|v| c.running.get(v).is_some_and(|run| run.spot)).count();
            let earlier = stopping.iter().filter(|v| c.running.get(v).is_some_and(|run| !run.spot)).count();
            let mut parts = Vec::new();
            if spot > 0 {
                parts.push(counted(spot, "SPOT job", "SPOT jobs"));
            }
            if lower > 0 {
                parts.push(counted(lower, "job of a lower priority", "jobs of a lower priority"));
            }
            let verb = if spot + lower == 1 { "is" } else { "are" };
            let stopping_already = counted(earlier, "job that is stopping already", "jobs that are stopping already");
            let reason = match (parts.is_empty(), earlier > 0) {
                (true, _) => format!("Waiting for capacity being freed: {stopping_already} will free what it needs; it starts when they have stopped"),
                (false, false) => format!(
                    "Waiting for capacity held by other jobs: {} {verb} being preempted for it; it starts when they have stopped",
                    parts.join(" and ")
                ),
                (false, true) => format!(
                    "Waiting for capacity held by other jobs: {} {verb} being preempted for it, and {stopping_already} will free the rest; \
                     it starts when they have stopped",
                    parts.join(" and ")
                ),
            };
            self.out.push(Decision::Wait { job: r.id, kind: KIND_PREEMPTING, reason: reason.into(), position, reserved_at: None });
        }
        true
    }

    /// L15: capacity missing for reasons outside the queue (nodes down or drained) is a
    /// stockout; capacity held by other Trainyard jobs never is.
    fn stockout(&mut self, r: &'r Request<'r>) -> bool {
        if self.fits_empty(r.shape) {
            return false;
        }
        self.charge_quota(r);
        self.out.push(Decision::Stockout { job: r.id, detail: self.stockout_detail() });
        self.memo.clear();
        true
    }

    /// EASY's head (the first job that does not fit) holds a reservation, and so does
    /// every job past the starvation bound (up to `max_reservations`), each placed around
    /// the ones before it; without backfill the head blocks the rest of the round.
    fn reserved_or_blocked(&mut self, r: &Request, position: Option<Position>) -> bool {
        let cfg = self.cfg;
        let protect = r.admitted || self.starving(r);
        if self.blocked || !(self.resvs.is_empty() || (protect && cfg.backfill && self.resvs.len() < cfg.max_reservations)) {
            return false;
        }
        let t = &self.c.table;
        if !cfg.backfill {
            self.blocked = true;
            self.memo.clear();
            if cfg.explain {
                let reason = format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape)).into();
                self.out.push(Decision::Wait { job: r.id, kind: KIND_CAPACITY, reason, position, reserved_at: None });
            }
            return true;
        }
        let made = self.reserve(r);
        let reserved = made.is_some();
        if let Some(v) = made {
            self.resvs.push(v);
        }
        self.memo.clear();
        if cfg.explain {
            let mut reason = match self.resvs.last().filter(|_| reserved) {
                // No time: it would rest on other jobs' time limits (another project's
                // among them), which a waiting reason does not tell.
                Some(v) => format!(
                    "Waiting for capacity held by other jobs: needs {}. Reserved: {} ({}) {} held for it as they free; \
                     smaller jobs may start first only if they cannot delay it",
                    describe(t, r.shape),
                    counted(v.nodes.len(), "node", "nodes"),
                    node_list(t, &v.nodes),
                    if v.nodes.len() == 1 { "is" } else { "are" },
                ),
                None => format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape)),
            };
            if self.starving(r) {
                reason.push_str(&starving_note(cfg));
            }
            let kind = if reserved { KIND_RESERVED } else { KIND_CAPACITY };
            let reserved_at = self.resvs.last().filter(|_| reserved).map(|v| v.time);
            self.out.push(Decision::Wait { job: r.id, kind, reason: reason.into(), position, reserved_at });
        }
        true
    }

    /// A wait behind jobs that hold the capacity or a reservation. The reason tells no
    /// time: it would rest on other jobs' time limits (another project's among them).
    fn waits_behind(&mut self, r: &Request, position: Option<Position>, miss: &Miss) {
        if !self.cfg.explain {
            return;
        }
        // Depends only on the shape, on whether the job would run past the reservation,
        // and on the round's state (the memo is cleared when that moves).
        let past_bound = self.starving(r);
        let (long, end, uniform) = (miss.long, miss.end, miss.uniform);
        let reason = self.memo(Memo::Capacity(r.shape.needs.clone(), long, past_bound), |rd| {
            let t = &rd.c.table;
            let fit_now = uniform.map_or(0, |(d, k)| rd.w.slot_bound(t, &d).min(k as i64));
            let mut reason = format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape));
            if uniform.is_some() {
                reason.push_str(&format!(", at most {fit_now} fit now"));
            }
            // The reservation it could delay first (else the first one made).
            let ahead = rd.resvs.iter().any(|v| !long || end > v.time);
            if ahead {
                let m = rd.w.mark();
                let fits_unconstrained = long && rd.w.place_gang(t, r.shape, None).is_some();
                rd.w.rollback(t, m);
                if fits_unconstrained {
                    reason.push_str("; it would fit now, but it could run past the time its nodes are reserved for a job ahead of it");
                } else {
                    reason.push_str("; a job ahead of it holds a reservation");
                }
            }
            if past_bound {
                reason.push_str(&starving_note(rd.cfg));
            }
            reason
        });
        let reason = self.with_priority_note(reason);
        let kind = if self.resvs.is_empty() { KIND_CAPACITY } else { KIND_BEHIND_RESERVATION };
        self.out.push(Decision::Wait { job: r.id, kind, reason, position, reserved_at: None });
    }

    /// A reason of a job that waits behind work of a higher priority class says so (of
    /// no project in particular).
    fn with_priority_note(&self, reason: Arc<str>) -> Arc<str> {
        if !self.behind_higher {
            return reason;
        }
        format!("{reason}; jobs of a higher priority class wait ahead of it").into()
    }
}

/// The project's share grows with what the job takes (DRF), changing the fair order.
/// Starving and re-placed jobs count too, for the jobs after them.
fn charge(q: &mut Queue, r: &Request, held: &[(NodeIx, Need)], c: &Cluster) {
    // The project's share in every priority level it has jobs in.
    for level in &mut q.levels {
        if let Some(p) = level.projects.iter_mut().find(|p| p.name == r.project) {
            for (_, d) in held {
                add_dims(&mut p.usage, d, 1);
            }
            p.share = c.share(p.name, &p.usage, p.weight);
        }
    }
}
