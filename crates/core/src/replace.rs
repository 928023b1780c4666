//! L9: where a replica moved off its node (lost, or drained for maintenance) starts again.
//! The choice goes through the scheduler's own placement (`plan`, best fit on the capacity
//! that every other live replica leaves), so that a move never over-commits an exact fleet
//! and picks the node admission would pick; it is not a second, simpler placement.

use std::collections::BTreeMap;

use crate::schedule::{plan, Cluster, Decision, Fleet, QuotaUse, Quotas, Request, SchedulerConfig};
use crate::{Job, Micros};

/// A node for replica `replica` of job `job`, other than `from` (its old node): the
/// scheduler's placement of that one replica on what the other live replicas leave free
/// (a replica already moving to a node counts there). None when no node can take it now
/// (then the move is a stockout, L15).
pub fn place_replacement(jobs: &[&Job], fleet: &Fleet, job: u64, replica: usize, from: &str, now: Micros) -> Option<String> {
    let moving = jobs.iter().find(|j| j.id == job)?;
    let demand = moving.demand.replicas.get(replica)?.clone();
    if fleet.overcommit {
        return fleet.nodes.iter().find(|n| n.up && n.schedulable && n.name != from).map(|n| n.name.clone());
    }
    // Without the old node: it is down, or drained and must not take the replica back.
    let mut without = fleet.clone();
    for n in without.nodes.iter_mut().filter(|n| n.name == from) {
        n.schedulable = false;
    }
    let c = &mut Cluster::new(&without);
    c.hold_live(jobs, Some((job, replica)), now);
    let shape = c.shape(std::slice::from_ref(&demand));
    let metrics = BTreeMap::new();
    let req = Request {
        id: job,
        project: &moving.project,
        submitted: moving.create_time,
        admitted: true,
        spot: false,
        shape: &shape,
        metrics: &metrics,
        duration: moving.policy.timeout,
        priority: moving.policy.priority,
        may_borrow: false,
        avoid: Vec::new(),
    };
    let cfg = SchedulerConfig { explain: false, preemption: false, ..SchedulerConfig::default() };
    plan(c, &[req], &Quotas::default(), &QuotaUse::default(), now, &cfg).into_iter().find_map(|d| match d {
        Decision::Place { nodes, .. } => nodes.into_iter().next(),
        _ => None,
    })
}
