//! TY10: elastic jobs grow into room that no waiting job can use.
//!
//! An elastic job is placed when its minimum fits (`schedule_with` places the minimum's
//! shape); its other replicas are away until this pass finds them room. The pass runs
//! after the round's decisions and only when the round left no job waiting for capacity
//! (a wait on quota does not count: that job could not use the room), so growth never
//! takes what the queue could use and never preempts. Jobs grow in priority order, then
//! oldest first; each replica goes where admission would put it (best fit), away from
//! the nodes its job's replicas failed on when another node fits.

use crate::capacity::NodeIx;
use crate::fleet::Fleet;
use crate::job::{AfterReplicaStop, Job, Micros, ReplicaState};

use super::cluster::{extra_id, Cluster};
use super::decision::{Decision, KIND_LENT, KIND_QUOTA};

/// TY10: the live replicas of `j`'s elastic pools above their minimum (by index): those
/// leaving, then, of the others, all but the first `min` of each pool.
pub fn extras(j: &Job) -> Vec<usize> {
    let mut out = Vec::new();
    for e in &j.policy.elastic {
        let mut kept = 0u32;
        for (i, r) in j.replicas.iter().enumerate().filter(|(i, r)| r.pool == e.pool && r.state.is_live() && j.is_elastic(*i)) {
            let leaving = matches!(r.state, ReplicaState::Stopping { then: AfterReplicaStop::Leave { .. }, .. });
            if !leaving && kept < e.min {
                kept += 1;
            } else {
                out.push(i);
            }
        }
    }
    out.sort_unstable();
    out
}

/// TY10: each of `j`'s replicas `extras` (above its minimum, see [`extras`]) holds its
/// room in `c` apart, under its own [`extra_id`] until `end`, counted from `from` or (None)
/// from when it started running: one leaving is stopping, the others the first to give
/// way. Returns their ids.
pub fn hold_extras(c: &mut Cluster, j: &Job, extras: &[usize], end: Micros, from: Option<Micros>, now: Micros) -> Vec<u64> {
    let mut ids = Vec::with_capacity(extras.len());
    for &i in extras {
        let (Some(r), Some(d)) = (j.replicas.get(i), j.demand.replicas.get(i)) else { continue };
        let Some(n) = r.node.as_deref().and_then(|n| c.node(n)) else { continue };
        let since = match (from, &r.state) {
            (Some(t), _) => t,
            (None, ReplicaState::Running { since }) => *since,
            (None, _) => now,
        };
        let id = extra_id(j.id, i);
        let need = c.table.need(d);
        c.start(id, &j.project, false, since, end, vec![(n, need)]);
        if matches!(r.state, ReplicaState::Stopping { .. }) {
            c.mark_stopping(id);
        } else {
            c.mark_extra(id);
        }
        ids.push(id);
    }
    ids
}

/// Nodes for a whole job from nodes for its minimum: `minimum[k]` runs on `nodes[k]`,
/// every other replica on none ("").
pub fn spread(n: usize, minimum: &[usize], nodes: Vec<String>) -> Vec<String> {
    let mut out = vec![String::new(); n];
    for (&i, node) in minimum.iter().zip(nodes) {
        if let Some(slot) = out.get_mut(i) {
            *slot = node;
        }
    }
    out
}

/// Room for elastic replicas that are away: fills the blanks of this round's
/// `Decision::Place`s (they start with their job), and returns `(job, replica, node)` for
/// running jobs' away replicas (`Event::Grow`). Nothing when a job still waits for
/// capacity after the round.
pub fn growth(jobs: &[&Job], fleet: &Fleet, decisions: &mut [Decision], now: Micros) -> Vec<(u64, String, String)> {
    let queue_waits = decisions.iter().any(|d| match d {
        Decision::Wait { kind, .. } => *kind != KIND_QUOTA && *kind != KIND_LENT,
        Decision::Stockout { .. } | Decision::Preempt { .. } => true,
        Decision::Place { .. } | Decision::Impossible { .. } => false,
    });
    if queue_waits {
        return Vec::new();
    }
    // The jobs that may grow, placed this round (with blanks) or running with replicas away.
    let placed_now: Vec<(u64, Vec<String>)> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Place { job, nodes, .. } if nodes.iter().any(String::is_empty) => Some((*job, nodes.clone())),
            _ => None,
        })
        .collect();
    let mut growing: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|j| j.wants_growth() || placed_now.iter().any(|(id, _)| *id == j.id))
        .collect();
    if growing.is_empty() {
        return Vec::new();
    }
    growing.sort_by_key(|j| (std::cmp::Reverse(j.policy.priority), j.create_time, j.id));
    let mut room = Room::new(jobs, fleet, decisions, now);
    let mut grows = Vec::new();
    for j in growing {
        let blanks = placed_now.iter().find(|(id, _)| *id == j.id).map(|(_, nodes)| nodes);
        for (i, r) in j.replicas.iter().enumerate() {
            let away = match blanks {
                Some(nodes) => nodes.get(i).is_some_and(String::is_empty),
                None => matches!(r.state, ReplicaState::Away { .. }),
            };
            if !away || !j.is_elastic(i) {
                continue;
            }
            let Some(node) = room.take(j, i) else { break };
            match blanks {
                Some(_) => fill(decisions, j.id, i, node),
                None => grows.push((j.id, r.name.clone(), node)),
            }
        }
    }
    grows
}

fn fill(decisions: &mut [Decision], job: u64, i: usize, node: String) {
    for d in decisions.iter_mut() {
        if let Decision::Place { job: id, nodes, .. } = d {
            if *id == job {
                if let Some(slot) = nodes.get_mut(i) {
                    *slot = node;
                }
                return;
            }
        }
    }
}

/// The free room after every live replica and this round's placements.
enum Room<'a> {
    /// The single-workstation default: every usable node shares its CPUs and memory.
    Shared(&'a Fleet),
    Exact(Box<Cluster>),
}

impl<'a> Room<'a> {
    fn new(jobs: &[&Job], fleet: &'a Fleet, decisions: &[Decision], now: Micros) -> Room<'a> {
        if fleet.overcommit {
            return Room::Shared(fleet);
        }
        let mut c = Cluster::new(fleet);
        c.hold_live(jobs, None, now);
        for d in decisions {
            let Decision::Place { job, nodes, .. } = d else { continue };
            let Some(j) = jobs.iter().find(|j| j.id == *job) else { continue };
            for (node, demand) in nodes.iter().zip(&j.demand.replicas) {
                if let Some(n) = c.node(node) {
                    let need = c.table.need(demand);
                    c.free.take(&c.table, n, &need);
                }
            }
        }
        c.free.commit();
        Room::Exact(Box::new(c))
    }

    /// A node for replica `i` of `j`, taken from the room: best fit, away from the nodes
    /// the job avoids when another fits.
    fn take(&mut self, j: &Job, i: usize) -> Option<String> {
        match self {
            Room::Shared(fleet) => {
                let usable = || fleet.nodes.iter().filter(|n| n.up && n.schedulable);
                usable().find(|n| !j.avoid_nodes.contains(&n.name)).or_else(|| usable().next()).map(|n| n.name.clone())
            }
            Room::Exact(c) => {
                let need = c.table.need(j.demand.replicas.get(i)?);
                let avoid: Vec<NodeIx> = j.avoid_nodes.iter().filter_map(|n| c.node(n)).collect();
                let n = c
                    .free
                    .pick(&c.table, &need, &mut |n| !avoid.contains(&n))
                    .or_else(|| c.free.pick(&c.table, &need, &mut |_| true))?;
                c.free.take(&c.table, n, &need);
                c.free.commit();
                c.table.names.get(n as usize).cloned()
            }
        }
    }
}
