//! Never-fit is an error, not a stockout: a gang that cannot be placed on the whole fleet,
//! with every node up and empty, is refused at create and fails in the scheduler; capacity
//! missing for other reasons (nodes down or drained) stays a stockout (L15).

use std::collections::BTreeMap;

use proptest::prelude::*;
use trainyard_core::capacity::{exact_fit, never_fits, NeverFit, NodeTable, Work};
use trainyard_core::job::{code, Demand, Policy, ReplicaDemand, Settings};
use trainyard_core::schedule::{schedule, Decision, Fleet, Node, Quotas};
use trainyard_core::{step, Event, Job, Micros, State};

const GIB: u64 = 1 << 30;
const T4: &str = "NVIDIA_TESLA_T4";
const A100: &str = "NVIDIA_TESLA_A100";

fn node(name: &str, cpus: u32, gib: u64, acc: Option<(&str, u32)>) -> Node {
    Node {
        name: name.into(),
        cpus,
        memory_bytes: gib * GIB,
        accelerators: acc.into_iter().map(|(a, c)| (a.to_string(), c)).collect(),
        up: true,
        schedulable: true,
    }
}

fn exact(nodes: Vec<Node>) -> Fleet {
    Fleet { nodes, overcommit: false }
}

fn rd(cpus: u32, gib: u64, acc: Option<(&str, u32)>) -> ReplicaDemand {
    ReplicaDemand { cpus, memory_bytes: gib * GIB, accelerator: acc.map(|(a, c)| (a.to_string(), c)) }
}

/// `pools[i]` = (count, demand of one replica).
fn job(id: u64, pools: &[(u32, ReplicaDemand)], t: Micros) -> Job {
    let counts: Vec<u32> = pools.iter().map(|p| p.0).collect();
    let replicas: Vec<ReplicaDemand> = pools.iter().flat_map(|(k, d)| std::iter::repeat_n(d.clone(), *k as usize)).collect();
    let cpus: u64 = replicas.iter().map(|d| d.cpus as u64).sum();
    let demand = Demand { metrics: [("custom_model_training_cpus".to_string(), cpus)].into(), replicas };
    Job::new(id, "p".into(), "us-central1".into(), &counts, demand, Policy::defaults(&Settings::default()), false, t)
}

fn replicas(pools: &[(u32, ReplicaDemand)]) -> Vec<ReplicaDemand> {
    pools.iter().flat_map(|(k, d)| std::iter::repeat_n(d.clone(), *k as usize)).collect()
}

/// The brute-force oracle: is there any assignment of the replicas to the nodes (each node
/// offering its one accelerator type) within every node's capacity?
fn packable(fleet: &Fleet, reps: &[ReplicaDemand]) -> bool {
    fn go(nodes: &mut [(i64, i64, Option<String>, i64)], reps: &[ReplicaDemand], i: usize) -> bool {
        let Some(d) = reps.get(i) else { return true };
        for n in 0..nodes.len() {
            let (c, m, ty, a) = nodes[n].clone();
            let acc_ok = match &d.accelerator {
                Some((name, k)) if *k > 0 => ty.as_deref() == Some(name.as_str()) && a >= *k as i64,
                _ => true,
            };
            if c >= d.cpus as i64 && m >= d.memory_bytes as i64 && acc_ok {
                let used = d.accelerator.as_ref().map_or(0, |(_, k)| *k as i64);
                nodes[n] = (c - d.cpus as i64, m - d.memory_bytes as i64, ty.clone(), a - used);
                let ok = go(nodes, reps, i + 1);
                nodes[n] = (c, m, ty, a);
                if ok {
                    return true;
                }
            }
        }
        false
    }
    let mut nodes: Vec<(i64, i64, Option<String>, i64)> = fleet
        .nodes
        .iter()
        .map(|n| {
            let acc = n.accelerators.iter().next().map(|(a, c)| (a.clone(), *c as i64));
            (n.cpus as i64, n.memory_bytes as i64, acc.as_ref().map(|a| a.0.clone()), acc.map_or(0, |a| a.1))
        })
        .collect();
    go(&mut nodes, reps, 0)
}

/// `nodes[i]` (by name) holds replica i, within every node's capacity.
fn within_capacity(fleet: &Fleet, reps: &[ReplicaDemand], nodes: &[String]) -> bool {
    let mut used: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for (d, n) in reps.iter().zip(nodes) {
        let Some(node) = fleet.nodes.iter().find(|x| &x.name == n) else { return false };
        let u = used.entry(n.as_str()).or_default();
        u.0 += d.cpus as u64;
        u.1 += d.memory_bytes;
        if let Some((a, k)) = &d.accelerator {
            if !node.accelerators.contains_key(a) {
                return false;
            }
            u.2 += *k as u64;
        }
        let acc = node.accelerators.values().next().copied().unwrap_or(0) as u64;
        if u.0 > node.cpus as u64 || u.1 > node.memory_bytes || u.2 > acc {
            return false;
        }
    }
    reps.len() == nodes.len()
}

fn decision(d: &[Decision], id: u64) -> &Decision {
    d.iter()
        .find(|d| match d {
            Decision::Place { job, .. } | Decision::Stockout { job, .. } | Decision::Impossible { job, .. } => *job == id,
            Decision::Wait { job, .. } | Decision::Preempt { job, .. } => *job == id,
        })
        .unwrap_or_else(|| panic!("no decision for job {id}: {d:?}"))
}

// ---------------------------------------------------------------------------------------
// The check itself.

/// A replica larger than every node is refused, naming the largest node.
#[test]
fn replica_larger_than_every_node() {
    let fleet = exact(vec![node("n1", 4, 16, None), node("n2", 2, 8, None)]);
    let (nf, detail) = fleet.never_fits(&replicas(&[(1, rd(4, 15, None)), (1, rd(8, 30, None))])).unwrap();
    assert_eq!(nf, NeverFit::Replica(1));
    assert_eq!(detail, "needs 8 CPUs and 30 GiB, but the largest node (n1) has 4 CPUs and 16 GiB");
    // Memory alone.
    let (nf, detail) = fleet.never_fits(&[rd(2, 20, None)]).unwrap();
    assert_eq!(nf, NeverFit::Replica(0));
    assert!(detail.contains("needs 2 CPUs and 20 GiB") && detail.contains("(n1)"), "{detail}");
}

/// Accelerators: the count of the type, and a type that no node offers.
#[test]
fn replica_larger_than_every_node_of_its_accelerator_type() {
    let fleet = exact(vec![node("cpu", 64, 256, None), node("g1", 16, 64, Some((T4, 2))), node("g2", 8, 32, Some((T4, 1)))]);
    let (nf, detail) = fleet.never_fits(&[rd(8, 30, Some((T4, 4)))]).unwrap();
    assert_eq!(nf, NeverFit::Replica(0));
    assert_eq!(
        detail,
        "needs 8 CPUs, 30 GiB and 4 x NVIDIA_TESLA_T4, but the largest node with NVIDIA_TESLA_T4 (g1) has 16 CPUs, 64 GiB and 2 x NVIDIA_TESLA_T4"
    );
    let (nf, detail) = fleet.never_fits(&[rd(8, 30, Some((A100, 1)))]).unwrap();
    assert_eq!(nf, NeverFit::Replica(0));
    assert!(detail.contains("no node offers NVIDIA_TESLA_A100; the largest node (cpu) has 64 CPUs and 256 GiB"), "{detail}");
    assert!(fleet.never_fits(&[rd(8, 30, Some((T4, 2)))]).is_none());
}

/// A gang larger than the fleet: the example (three 4-CPU replicas on 4-CPU nodes).
#[test]
fn gang_larger_than_the_fleet() {
    let one = exact(vec![node("n1", 4, 16, None)]);
    let (nf, detail) = one.never_fits(&replicas(&[(3, rd(4, 15, None))])).unwrap();
    assert_eq!(nf, NeverFit::Gang);
    assert_eq!(
        detail,
        "cannot be placed together on the fleet: 1 node of 4 CPUs and 16 GiB; the largest node (n1) has 4 CPUs and 16 GiB"
    );
    let two = exact(vec![node("n1", 4, 16, None), node("n2", 4, 16, None)]);
    let (nf, detail) = two.never_fits(&replicas(&[(3, rd(4, 15, None))])).unwrap();
    assert_eq!(nf, NeverFit::Gang);
    assert!(detail.contains("2 nodes of 4 CPUs and 16 GiB"), "{detail}");
    assert!(two.never_fits(&replicas(&[(2, rd(4, 15, None))])).is_none());
    // Small replicas share nodes: 8 of 1 CPU fit two 4-CPU nodes, 9 do not.
    assert!(two.never_fits(&replicas(&[(8, rd(1, 2, None))])).is_none());
    assert_eq!(two.never_fits(&replicas(&[(9, rd(1, 2, None))])).map(|x| x.0), Some(NeverFit::Gang));
    // Memory or accelerators can be what runs out.
    assert_eq!(two.never_fits(&replicas(&[(3, rd(1, 10, None))])).map(|x| x.0), Some(NeverFit::Gang));
    let gpus = exact(vec![node("g1", 32, 128, Some((T4, 2))), node("g2", 32, 128, Some((T4, 2)))]);
    assert!(gpus.never_fits(&replicas(&[(4, rd(4, 15, Some((T4, 1))))])).is_none());
    assert_eq!(gpus.never_fits(&replicas(&[(5, rd(4, 15, Some((T4, 1))))])).map(|x| x.0), Some(NeverFit::Gang));
}

/// Totals are not enough: a gang within the fleet's total CPUs that does not pack.
#[test]
fn packing_not_totals() {
    let two = exact(vec![node("n1", 4, 16, None), node("n2", 4, 16, None)]);
    // 3 + 3 + 2 = 8 CPUs = the fleet's total, but a 3 and a 2 never share a 4-CPU node.
    let reps = replicas(&[(2, rd(3, 1, None)), (1, rd(2, 1, None))]);
    assert!(!packable(&two, &reps));
    assert_eq!(two.never_fits(&reps).map(|x| x.0), Some(NeverFit::Gang));
    // 3 + 1 and 3 + 1 do.
    let reps = replicas(&[(2, rd(3, 1, None)), (2, rd(1, 1, None))]);
    assert!(two.never_fits(&reps).is_none());
}

/// A mixed gang that the replica order cannot place (the small replica takes the node the
/// large one needs) is placed largest first, by the scheduler and the check alike.
#[test]
fn mixed_gang_placed_largest_first() {
    let fleet = exact(vec![node("a", 4, 32, None), node("b", 8, 8, None)]);
    // Replica order: the 4-CPU, 4 GiB chief goes best fit to `a` (4 CPUs free), then the
    // 2-CPU, 24 GiB worker fits nowhere. Largest first: the worker on `a`, the chief on `b`.
    let pools = [(1, rd(4, 4, None)), (1, rd(2, 24, None))];
    assert!(fleet.never_fits(&replicas(&pools)).is_none());
    let j = job(1, &pools, 0);
    let d = schedule(&[&j], &fleet, &Quotas::default(), 0);
    assert!(matches!(decision(&d, 1), Decision::Place { nodes, .. } if nodes == &["b", "a"]), "{d:?}");
}

/// The exact search decides where the greedy placement gives up, both ways.
#[test]
fn exact_search_both_ways() {
    let fleet = exact(vec![node("a", 6, 6, None), node("b", 6, 6, None)]);
    let t = NodeTable::new(&fleet);
    // 4+2 | 3+3 fits; 4 | 4 leaves no room for a 3 (11 of 12 CPUs).
    let fits = t.shape(&replicas(&[(1, rd(4, 1, None)), (2, rd(3, 1, None)), (1, rd(2, 1, None))]));
    assert_eq!(exact_fit(&t, &fits.needs, 1_000), Some(true));
    let never = t.shape(&replicas(&[(2, rd(4, 1, None)), (1, rd(3, 1, None))]));
    assert_eq!(exact_fit(&t, &never.needs, 1_000), Some(false));
    assert_eq!(exact_fit(&t, &never.needs, 1), None, "out of budget: undecided");
    assert_eq!(never_fits(&t, &fits), None);
    assert_eq!(never_fits(&t, &never), Some(NeverFit::Gang));
}

/// Drained and down nodes come back: a job that fits the whole fleet is never refused.
#[test]
fn drained_and_down_nodes_count() {
    let mut fleet = exact(vec![node("n1", 4, 16, None), node("n2", 4, 16, None)]);
    fleet.nodes[0].up = false;
    fleet.nodes[1].schedulable = false;
    assert!(fleet.never_fits(&replicas(&[(2, rd(4, 15, None))])).is_none());
}

/// The overcommitting default refuses nothing.
#[test]
fn overcommit_refuses_nothing() {
    let fleet = Fleet { nodes: vec![node("local", 2, 4, None)], overcommit: true };
    assert!(fleet.never_fits(&replicas(&[(8, rd(96, 624, Some((A100, 8))))])).is_none());
}

/// A node with several accelerator types offers its most numerous one only, in the check
/// as in the scheduler.
#[test]
fn several_accelerator_types_offer_one() {
    let mut n = node("mixed", 32, 128, Some((T4, 4)));
    n.accelerators.insert(A100.into(), 1);
    let fleet = exact(vec![n]);
    assert!(fleet.never_fits(&[rd(4, 15, Some((T4, 4)))]).is_none());
    let (nf, detail) = fleet.never_fits(&[rd(4, 15, Some((A100, 1)))]).unwrap();
    assert_eq!(nf, NeverFit::Replica(0));
    assert!(detail.contains("no node offers NVIDIA_TESLA_A100"), "{detail}");
}

// ---------------------------------------------------------------------------------------
// The scheduler.

/// After the fleet shrinks (a restart with fewer nodes), a queued job that can never fit
/// fails with a reason naming its pool and the largest node; one short of quota too (it
/// would otherwise wait for quota and then fit nowhere).
#[test]
fn shrunk_fleet_makes_queued_jobs_impossible() {
    let small = exact(vec![node("n1", 4, 16, None)]);
    let gang = job(1, &[(1, rd(4, 15, None)), (2, rd(4, 15, None))], 0);
    let big = job(2, &[(1, rd(4, 15, None)), (1, rd(8, 30, None))], 1);
    let ok = job(3, &[(1, rd(4, 15, None))], 2);
    let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 4)].into(), projects: BTreeMap::new(), ..Quotas::default() };
    let d = schedule(&[&gang, &big, &ok], &small, &quotas, 10);
    match decision(&d, 1) {
        Decision::Impossible { reason, .. } => assert_eq!(
            reason,
            "The job can never be placed on this fleet, not even with every node up and free: its 3 replicas of \
             4 CPUs and 15 GiB (workerPoolSpecs[0]: 1; workerPoolSpecs[1]: 2) cannot be placed together on the fleet: \
             1 node of 4 CPUs and 16 GiB; the largest node (n1) has 4 CPUs and 16 GiB."
        ),
        other => panic!("{other:?}"),
    }
    match decision(&d, 2) {
        Decision::Impossible { reason, .. } => assert_eq!(
            reason,
            "The job can never be placed on this fleet, not even with every node up and free: workerPoolSpecs[1]: \
             a replica needs 8 CPUs and 30 GiB, but the largest node (n1) has 4 CPUs and 16 GiB."
        ),
        other => panic!("{other:?}"),
    }
    // The impossible jobs took no quota: the job that fits is placed.
    assert!(matches!(decision(&d, 3), Decision::Place { .. }), "{d:?}");
    // The lifecycle: FAILED at once with code 9 and the reason, no retry.
    let Decision::Impossible { reason, .. } = decision(&d, 1) else { unreachable!() };
    let t = step(&gang, Event::Impossible { reason: reason.clone() }, 10, &Settings::default()).unwrap();
    assert_eq!(t.job.state(), State::Failed);
    assert!(t.effects.iter().all(|e| !matches!(e, trainyard_core::Effect::Launch { .. })));
    match &t.job.phase {
        trainyard_core::Phase::Failed { error, .. } => {
            assert_eq!(error.code, code::FAILED_PRECONDITION);
            assert!(error.message.contains("workerPoolSpecs[0]") && error.message.contains("(n1)"), "{}", error.message);
        }
        other => panic!("{other:?}"),
    }
}

/// A job pending after a stockout (admitted, quota held) fails the same way once it can
/// never fit; nodes down or drained stay a stockout.
#[test]
fn stockout_only_for_capacity_missing_now() {
    let mut fleet = exact(vec![node("n1", 4, 16, None), node("n2", 4, 16, None)]);
    fleet.nodes[0].up = false;
    fleet.nodes[1].schedulable = false;
    let j = job(1, &[(2, rd(4, 15, None))], 0);
    let d = schedule(&[&j], &fleet, &Quotas::default(), 10);
    assert!(matches!(decision(&d, 1), Decision::Stockout { detail, .. } if detail.contains("1 down, 1 drained")), "{d:?}");
    let pending = step(&j, Event::Stockout { detail: "x".into() }, 10, &Settings::default()).unwrap().job;
    assert_eq!(pending.state(), State::Pending);
    // The config loses n2: the job can never fit any more.
    let shrunk = exact(vec![node("n1", 4, 16, None)]);
    let later = 10 + 3600 * 1_000_000;
    let d = schedule(&[&pending], &shrunk, &Quotas::default(), later);
    let Decision::Impossible { reason, .. } = decision(&d, 1) else { panic!("{d:?}") };
    let done = step(&pending, Event::Impossible { reason: reason.clone() }, later, &Settings::default()).unwrap().job;
    assert_eq!(done.state(), State::Failed);
}

// ---------------------------------------------------------------------------------------
// Properties.

fn arb_node() -> impl Strategy<Value = (u32, u64, u8, u32, bool, bool)> {
    // cpus, GiB, accelerator (0 none, 1 T4, 2 A100), count, up, schedulable
    (
        prop::sample::select(vec![1u32, 2, 4, 8]),
        prop::sample::select(vec![2u64, 4, 8, 16, 32]),
        0u8..3,
        1u32..5,
        any::<bool>(),
        any::<bool>(),
    )
}

fn arb_pool() -> impl Strategy<Value = (u32, u32, u64, u8, u32)> {
    // count, cpus, GiB, accelerator, count
    (1u32..3, prop::sample::select(vec![1u32, 2, 3, 4, 8]), prop::sample::select(vec![1u64, 2, 4, 8, 16, 24]), 0u8..4, 1u32..3)
}

fn build(nodes: &[(u32, u64, u8, u32, bool, bool)], pools: &[(u32, u32, u64, u8, u32)]) -> (Fleet, Vec<(u32, ReplicaDemand)>) {
    let acc = |a: u8, c: u32| match a {
        1 => Some((T4, c)),
        2 => Some((A100, c)),
        _ => None,
    };
    let fleet = exact(
        nodes
            .iter()
            .enumerate()
            .map(|(i, &(c, g, a, k, up, sched))| {
                let mut n = node(&format!("n{i}"), c, g, acc(a, k));
                n.up = up;
                n.schedulable = sched;
                n
            })
            .collect(),
    );
    let pools = pools.iter().map(|&(k, c, g, a, ac)| (k, rd(c, g, acc(a, ac)))).collect();
    (fleet, pools)
}

fn all_up(fleet: &Fleet) -> Fleet {
    let mut f = fleet.clone();
    for n in &mut f.nodes {
        n.up = true;
        n.schedulable = true;
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The check is exact: it refuses a job exactly when no assignment of its replicas to
    /// the nodes exists (brute force), and a job it accepts is placed by the scheduler on
    /// the empty fleet with every node up.
    #[test]
    fn refused_iff_no_packing_exists(
        nodes in prop::collection::vec(arb_node(), 1..5),
        pools in prop::collection::vec(arb_pool(), 1..4),
    ) {
        let (fleet, pools) = build(&nodes, &pools);
        let reps = replicas(&pools);
        let refused = fleet.never_fits(&reps);
        let exists = packable(&fleet, &reps);
        prop_assert_eq!(refused.is_none(), exists, "refused: {:?}", refused);
        if refused.is_none() {
            let j = job(1, &pools, 0);
            let up = all_up(&fleet);
            let d = schedule(&[&j], &up, &Quotas::default(), 0);
            match decision(&d, 1) {
                Decision::Place { nodes, .. } => prop_assert!(within_capacity(&up, &reps, nodes), "{:?}", nodes),
                other => prop_assert!(false, "accepted but not placed: {:?}", other),
            }
        }
    }

    /// The scheduler agrees with the check at create, whatever the state of the nodes: a
    /// refused job is Impossible (never placed, never a stockout), an accepted one never
    /// is; the scheduler's own placement on the empty fleet agrees with the check.
    #[test]
    fn scheduler_agrees_with_the_check(
        nodes in prop::collection::vec(arb_node(), 1..6),
        pools in prop::collection::vec(arb_pool(), 1..4),
    ) {
        let (fleet, pools) = build(&nodes, &pools);
        let reps = replicas(&pools);
        let refused = fleet.never_fits(&reps).is_some();
        let j = job(1, &pools, 0);
        let d = schedule(&[&j], &fleet, &Quotas::default(), 0);
        let impossible = matches!(decision(&d, 1), Decision::Impossible { .. });
        prop_assert_eq!(refused, impossible, "{:?}", d);
        let t = NodeTable::new(&fleet);
        let shape = t.shape(&reps);
        prop_assert_eq!(never_fits(&t, &shape).is_some(), refused);
        if Work::all(&t).place_gang(&t, &shape, None).is_some() {
            prop_assert!(!refused, "placed on the empty fleet but refused");
        }
    }
}
