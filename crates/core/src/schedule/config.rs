//! Scheduler settings: the order, backfill, preemption, fair-share weights and the
//! starvation bound ([`SchedulerConfig`]), per-job hints and a project's past use, and
//! priority classes ([`PriorityClasses`]).

use std::collections::BTreeMap;
use serde::{Deserialize, Serialize};
use crate::job::Micros;

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
