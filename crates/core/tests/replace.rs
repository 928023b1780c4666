//! L9: a replica moved off a lost or drained node goes where the scheduler's placement puts
//! it: best fit on what the other live replicas leave, never over an exact node's capacity.

use std::collections::BTreeMap;

use trainyard_core::job::{Demand, Policy, ReplicaDemand};
use trainyard_core::replace::place_replacement;
use trainyard_core::schedule::{Fleet, Node};
use trainyard_core::{step, Event, Job, Settings};

fn node(name: &str, cpus: u32) -> Node {
    Node { name: name.into(), cpus, memory_bytes: (cpus as u64) << 30, accelerators: BTreeMap::new(), up: true, schedulable: true }
}

/// A running job of `cpus` per replica, placed on `nodes`.
fn running(id: u64, cpus: u32, nodes: &[&str]) -> Job {
    let s = Settings::default();
    let demand = Demand {
        metrics: BTreeMap::new(),
        replicas: vec![ReplicaDemand { cpus, memory_bytes: (cpus as u64) << 30, accelerator: None }; nodes.len()],
    };
    let pools: Vec<u32> = if nodes.len() == 1 { vec![1] } else { vec![1, nodes.len() as u32 - 1] };
    let j = Job::new(id, "p".into(), "r".into(), &pools, demand, Policy::defaults(&s), false, 0);
    let place = Event::Place { nodes: nodes.iter().map(|n| n.to_string()).collect(), addresses: vec![], notes: vec![] };
    step(&j, place, 1, &s).unwrap().job
}

/// L9: best fit: the replica goes to the node it fills most, not the first that fits.
#[test]
fn l9_replacement_is_best_fit() {
    let mut fleet = Fleet { nodes: vec![node("lost", 4), node("roomy", 8), node("snug", 8)], overcommit: false };
    let moving = running(1, 4, &["lost"]);
    let other = running(2, 4, &["snug"]);
    fleet.nodes[0].up = false;
    let jobs = [&moving, &other];
    assert_eq!(place_replacement(&jobs, &fleet, 1, 0, "lost", 10).as_deref(), Some("snug"));
}

/// L9: never over a node's capacity; no room anywhere is None (a stockout, L15).
#[test]
fn l9_replacement_never_overcommits() {
    let mut fleet = Fleet { nodes: vec![node("lost", 4), node("a", 4), node("b", 4)], overcommit: false };
    fleet.nodes[0].up = false;
    let moving = running(1, 4, &["lost"]);
    let a = running(2, 4, &["a"]);
    let b = running(3, 2, &["b"]);
    assert_eq!(place_replacement(&[&moving, &a, &b], &fleet, 1, 0, "lost", 10), None);
    // Half of b's node free is not enough for 4 CPUs; once b ends, it fits there.
    assert_eq!(place_replacement(&[&moving, &a], &fleet, 1, 0, "lost", 10).as_deref(), Some("b"));
}

/// L9: a drained node does not take its own replica back, and a replica already moving
/// to a node counts there.
#[test]
fn l9_replacement_skips_the_old_node_and_counts_moves() {
    let s = Settings::default();
    let fleet = Fleet { nodes: vec![node("drained", 8), node("x", 4), node("y", 4)], overcommit: false };
    // Two replicas of job 1 on the drained node; the first is already moving to x.
    let mut j = running(1, 4, &["drained", "drained"]);
    j = step(&j, Event::NodeMaintenance { replica: "workerpool0-0".into(), replacement: Some("x".into()) }, 2, &s).unwrap().job;
    let second = place_replacement(&[&j], &fleet, 1, 1, "drained", 10);
    assert_eq!(second.as_deref(), Some("y"), "x is taken by the first replica's move");
}
