//! Admission and placement as a pure function (L3, L4, L5, L15):
//! `schedule(jobs, fleet, quotas, now) -> Vec<Decision>`.
//!
//! Quota first: a job is admitted only when its project's quota in its region covers
//! every replica at once (L3). Then placement: with an exact fleet, every replica of the
//! attempt is placed at once or not at all; capacity held by other jobs makes the job wait
//! (QUEUED, not a stockout), capacity missing for other reasons (nodes down or drained)
//! is a stockout (L15). The default fleet overcommits: placement always succeeds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::{Job, Micros, Phase, ReplicaDemand};

/// A node that runs replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Accelerator type (wire name) → count.
    pub accelerators: BTreeMap<String, u32>,
    /// False when the node is down (L9 node loss).
    pub up: bool,
    /// False when the node is drained (L9 maintenance): it takes no new work.
    pub schedulable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fleet {
    pub nodes: Vec<Node>,
    /// CPU and memory are shared, not reserved, and missing accelerators do not stop a
    /// replica from running (the single-workstation default).
    pub overcommit: bool,
}

/// Quota limits of one region: metric → limit, per project, with a default for projects
/// not listed. A metric without a limit is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    pub default: BTreeMap<String, u64>,
    pub projects: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Quotas {
    pub fn limit(&self, project: &str, metric: &str) -> Option<u64> {
        self.projects
            .get(project)
            .and_then(|m| m.get(metric))
            .or_else(|| self.default.get(metric))
            .copied()
    }

    /// L4: the metrics whose limit the request exceeds on its own (it could never run).
    pub fn exceeded_by(&self, project: &str, demand: &BTreeMap<String, u64>) -> Vec<String> {
        demand
            .iter()
            .filter(|(m, &need)| self.limit(project, m).is_some_and(|l| need > l))
            .map(|(m, _)| m.clone())
            .collect()
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
    /// The job keeps waiting; `reason` says why in plain words.
    Wait { job: u64, reason: String },
}

/// Quota in use per project and metric (L5: held from admission until terminal).
pub fn quota_usage<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> BTreeMap<(String, String), u64> {
    let mut usage = BTreeMap::new();
    for j in jobs.into_iter().filter(|j| j.holds_quota()) {
        for (m, v) in &j.demand.metrics {
            *usage.entry((j.project.clone(), m.clone())).or_insert(0) += v;
        }
    }
    usage
}

#[derive(Clone, Debug)]
struct Free {
    cpus: i64,
    memory: i64,
    accelerators: BTreeMap<String, i64>,
}

impl Free {
    fn of(n: &Node) -> Free {
        Free {
            cpus: n.cpus as i64,
            memory: n.memory_bytes as i64,
            accelerators: n.accelerators.iter().map(|(k, v)| (k.clone(), *v as i64)).collect(),
        }
    }
    fn fits(&self, d: &ReplicaDemand) -> bool {
        self.cpus >= d.cpus as i64
            && self.memory >= d.memory_bytes as i64
            && d.accelerator.as_ref().is_none_or(|(a, c)| self.accelerators.get(a).copied().unwrap_or(0) >= *c as i64)
    }
    fn take(&mut self, d: &ReplicaDemand) {
        self.cpus -= d.cpus as i64;
        self.memory -= d.memory_bytes as i64;
        if let Some((a, c)) = &d.accelerator {
            *self.accelerators.entry(a.clone()).or_insert(0) -= *c as i64;
        }
    }
}

/// Gang placement: every replica placed, first fit, or None.
fn place_all(replicas: &[ReplicaDemand], nodes: &[&Node], free: &mut [Free]) -> Option<Vec<String>> {
    let mut trial = free.to_vec();
    let mut out = Vec::with_capacity(replicas.len());
    for d in replicas {
        let i = (0..nodes.len()).find(|&i| trial[i].fits(d))?;
        trial[i].take(d);
        out.push(nodes[i].name.clone());
    }
    free.clone_from_slice(&trial);
    Some(out)
}

/// Decide for every job that waits for placement. `jobs` are the live (non-terminal) jobs.
pub fn schedule(jobs: &[&Job], fleet: &Fleet, quotas: &Quotas, now: Micros) -> Vec<Decision> {
    let mut usage = quota_usage(jobs.iter().copied());
    let usable: Vec<&Node> = fleet.nodes.iter().filter(|n| n.up && n.schedulable).collect();
    let mut free: Vec<Free> = usable.iter().map(|n| Free::of(n)).collect();
    if !fleet.overcommit {
        // Capacity held by placed replicas of other jobs.
        for j in jobs.iter().filter(|j| j.holds_capacity()) {
            for (r, d) in j.replicas.iter().zip(&j.demand.replicas) {
                if !r.state.is_live() {
                    continue;
                }
                if let Some(i) = usable.iter().position(|n| Some(&n.name) == r.node.as_ref()) {
                    free[i].take(d);
                }
            }
        }
    }
    // Jobs already admitted (re-placement after a stockout) first, then the queue in
    // order of creation.
    let mut waiting: Vec<&Job> = jobs.iter().copied().filter(|j| j.wants_placement(now)).collect();
    waiting.sort_by_key(|j| (matches!(j.phase, Phase::Queued), j.create_time, j.id));

    let mut out = Vec::new();
    for job in waiting {
        if matches!(job.phase, Phase::Queued) {
            // L3: QUEUED while the quota cannot cover all replicas at once.
            let short: Vec<String> = job
                .demand
                .metrics
                .iter()
                .filter_map(|(m, need)| {
                    let limit = quotas.limit(&job.project, m)?;
                    let used = usage.get(&(job.project.clone(), m.clone())).copied().unwrap_or(0);
                    (used + need > limit).then(|| format!("{m}: needs {need}, {used} of {limit} in use"))
                })
                .collect();
            if !short.is_empty() {
                out.push(Decision::Wait { job: job.id, reason: format!("Waiting for quota: {}.", short.join("; ")) });
                continue;
            }
        }
        let mut warnings = Vec::new();
        let placed = if fleet.overcommit {
            // Everything on the first usable node; CPU and memory are shared, and a missing
            // accelerator is a warning, not a refusal.
            usable.first().map(|n| {
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
                vec![n.name.clone(); job.replicas.len()]
            })
        } else {
            place_all(&job.demand.replicas, &usable, &mut free)
        };
        match placed {
            Some(nodes) => {
                if matches!(job.phase, Phase::Queued) {
                    for (m, v) in &job.demand.metrics {
                        *usage.entry((job.project.clone(), m.clone())).or_insert(0) += v;
                    }
                }
                out.push(Decision::Place { job: job.id, nodes, warnings });
            }
            None => {
                // Would it fit the usable fleet if no other job held anything?
                let mut empty: Vec<Free> = usable.iter().map(|n| Free::of(n)).collect();
                if !usable.is_empty() && place_all(&job.demand.replicas, &usable, &mut empty).is_some() {
                    // Capacity held by other Trainyard jobs is not a stockout (L15).
                    out.push(Decision::Wait {
                        job: job.id,
                        reason: "Waiting for capacity held by other jobs.".to_string(),
                    });
                } else {
                    // The stockout admits the job (its quota is held, L5) and fails the attempt.
                    if matches!(job.phase, Phase::Queued) {
                        for (m, v) in &job.demand.metrics {
                            *usage.entry((job.project.clone(), m.clone())).or_insert(0) += v;
                        }
                    }
                    let up = fleet.nodes.iter().filter(|n| n.up).count();
                    let drained = fleet.nodes.iter().filter(|n| n.up && !n.schedulable).count();
                    out.push(Decision::Stockout {
                        job: job.id,
                        detail: format!(
                            "{} of {} nodes usable ({} down, {} drained)",
                            usable.len(),
                            fleet.nodes.len(),
                            fleet.nodes.len() - up,
                            drained
                        ),
                    });
                }
            }
        }
    }
    out
}
