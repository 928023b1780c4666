//! The capacity state a round decides on ([`Cluster`]): the fleet indexed for best fit,
//! the jobs holding capacity by expected end, each project's use and past use; and
//! whether a job can ever fit the fleet ([`Fleet::never_fits`]).

use std::collections::BTreeSet;
use crate::collections::HashMap;
use crate::capacity::{never_fits, Need, NeverFit, NodeIx, NodeTable, Shape, Work, NO_ACC};
use crate::fleet::{Fleet, Node};
use crate::job::{AfterReplicaStop, Job, Micros, ReplicaDemand, ReplicaState};
use super::config::UsageHistory;

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
    /// TY10: an elastic job's replica above its pool's minimum (see [`extra_id`]): the
    /// first to give its room to work that waits, at any time.
    pub extra: bool,
}

/// TY10: the id under which replica `replica` of elastic job `job`, above its pool's
/// minimum, holds its room in a [`Cluster`] (a `Decision::Preempt` of it takes that one
/// replica away).
pub fn extra_id(job: u64, replica: usize) -> u64 {
    EXTRA_BIT | (job << 12) | (replica as u64 & 0xfff)
}

/// The job and replica of an [`extra_id`].
pub fn extra_of(id: u64) -> Option<(u64, usize)> {
    (id & EXTRA_BIT != 0).then_some(((id & !EXTRA_BIT) >> 12, (id & 0xfff) as usize))
}

const EXTRA_BIT: u64 = 1 << 62;

/// The capacity state the scheduler decides on: the fleet, its free capacity per node
/// (indexed for best fit), the jobs holding capacity ordered by expected end, and the use
/// per project. `schedule` builds it from the jobs on every call; the simulator keeps one
/// up to date incrementally (`start`, `finish`) and calls `plan` on it.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub(super) table: NodeTable,
    pub(super) free: Work,
    pub(super) running: HashMap<u64, Running>,
    pub(super) by_end: BTreeSet<(Micros, u64)>,
    pub(super) spot: BTreeSet<u64>,
    pub(super) stopping: BTreeSet<u64>,
    /// TY10: elastic replicas above their minimum ([`extra_id`]).
    pub(super) extras: BTreeSet<u64>,
    pub(super) usage: HashMap<String, Vec<i64>>,
    pub(super) totals: Vec<i64>,
    /// Each project's past use by dimension ([`UsageHistory`]), for fair share.
    pub(super) history: HashMap<String, Vec<f64>>,
    /// Per-node scratch space of the reservations (see [`View`]), kept between rounds so
    /// that a round allocates none.
    pub(super) scratch: Scratch,
}

/// Positions in a vector of usage or totals by dimension: CPUs, memory, then one per
/// accelerator type ([`acc_dim`]).
const CPUS: usize = 0;
const MEM: usize = 1;

/// The position of accelerator type `ty` in a vector by dimension.
fn acc_dim(ty: u16) -> usize {
    2 + ty as usize
}

pub(super) fn add_dims(v: &mut [i64], d: &Need, sign: i64) {
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
            extras: BTreeSet::new(),
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
            extra: false,
        });
    }

    /// What every live replica of `jobs` holds: where it runs and, when it is moving (L9),
    /// where it moves to (both held until it stops); `except` (job, replica) left out.
    /// Each job to its time limit.
    pub fn hold_live(&mut self, jobs: &[&Job], except: Option<(u64, usize)>, now: Micros) {
        for j in jobs.iter().filter(|j| j.holds_capacity()) {
            let mut placed = Vec::new();
            for (i, (r, d)) in j.replicas.iter().zip(&j.demand.replicas).enumerate() {
                if except == Some((j.id, i)) || !r.state.is_live() {
                    continue;
                }
                let need = self.table.need(d);
                let at = r.node.as_deref().and_then(|n| self.node(n));
                let to = match &r.state {
                    ReplicaState::Stopping { then: AfterReplicaStop::Move { node }, .. } => self.node(node),
                    _ => None,
                };
                placed.extend([at, to].into_iter().flatten().map(|n| (n, need)));
            }
            let start = j.admitted_at().unwrap_or(now);
            self.start(j.id, &j.project, false, start, start.saturating_add(j.policy.timeout), placed);
        }
    }

    /// TY10: the holder `id` is an elastic job's replica above its minimum.
    pub fn mark_extra(&mut self, id: u64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.extra = true;
            self.extras.insert(id);
        }
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
        self.extras.remove(&id);
        true
    }

    /// A job is stopping (preempted, cancelled, timed out, failed): no longer a candidate;
    /// its capacity frees when it has stopped (`finish`), and a preemption counts it first.
    pub fn mark_stopping(&mut self, id: u64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.spot = false;
            r.stopping = true;
            r.extra = false;
            self.extras.remove(&id);
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
    pub(super) fn share(&self, project: &str, usage: &[i64], weight: f64) -> f64 {
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

/// Per-node values of a [`View`], valid where the node's stamp is the current one: a new
/// view is one increment, not a pass over the fleet.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) stamp: Vec<u32>,
    /// Free CPUs, memory and accelerators, and whether the timeline released capacity
    /// on the node.
    pub(super) vals: Vec<(i64, i64, i64, bool)>,
    pub(super) current: u32,
}

impl Scratch {
    /// Forget every value (for a fleet of `n` nodes).
    pub(super) fn reset(&mut self, n: usize) {
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
