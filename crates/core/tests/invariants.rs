//! Property tests of the lifecycle and admission invariants: terminal is final (L1),
//! replica restarts never exceed the limit (L11), retries never exceed their budgets
//! (L12, L16), nothing is left running after a terminal state (L20), and quota is never
//! over-committed (L3, L5).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_core::job::{Demand, Policy, ReplicaDemand, SECOND};
use trainyard_core::schedule::{quota_usage, schedule, Decision, Fleet, Node, Quotas};
use trainyard_core::{step, Effect, Event, Job, Micros, Outcome, RunId, Settings, State};

#[derive(Clone, Debug)]
enum Op {
    Place,
    Stockout,
    /// Start the k-th launching run.
    Start(usize),
    /// End the k-th live run with an outcome.
    Exit(usize, u8),
    /// Deliver the exit of the k-th run that was told to stop.
    Stopped(usize),
    Cancel,
    Tick(u32),
    Lost(usize),
    Maintenance(usize),
    Preempt,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Place),
        1 => Just(Op::Stockout),
        4 => (0usize..8).prop_map(Op::Start),
        4 => (0usize..8, 0u8..9).prop_map(|(k, o)| Op::Exit(k, o)),
        4 => (0usize..8).prop_map(Op::Stopped),
        1 => Just(Op::Cancel),
        2 => (0u32..4000).prop_map(Op::Tick),
        1 => (0usize..8).prop_map(Op::Lost),
        1 => (0usize..8).prop_map(Op::Maintenance),
        1 => Just(Op::Preempt),
    ]
}

fn outcome(o: u8) -> Outcome {
    match o {
        0 => Outcome::Exited { code: 0 },
        1 => Outcome::Exited { code: 1 },
        2 => Outcome::Exited { code: 134 },
        3 => Outcome::Signaled { signal: 9 },
        4 => Outcome::Signaled { signal: 11 },
        5 => Outcome::OomKilled { status: 137 },
        6 => Outcome::StartError { message: "nope".into() },
        7 => Outcome::Lost { message: "gone".into() },
        _ => Outcome::LaunchFailed { message: "fork".into() },
    }
}

/// What a backend would have running, driven only by the effects.
#[derive(Default)]
struct World {
    launching: BTreeSet<RunId>,
    running: BTreeSet<RunId>,
    stopping: BTreeSet<RunId>,
}

impl World {
    fn apply(&mut self, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::Launch { run, .. } => {
                    self.launching.insert(run.clone());
                }
                Effect::Stop { run, .. } => {
                    if self.launching.remove(run) || self.running.remove(run) {
                        self.stopping.insert(run.clone());
                    }
                }
                Effect::Log(_) => {}
            }
        }
    }
    fn alive(&self) -> usize {
        self.launching.len() + self.running.len() + self.stopping.len()
    }
}

fn nth(set: &BTreeSet<RunId>, k: usize) -> Option<RunId> {
    if set.is_empty() {
        None
    } else {
        set.iter().nth(k % set.len()).cloned()
    }
}

fn run_ops(pools: &[u32], restart_job: bool, disable: bool, flex: bool, spot: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let s = Settings::default();
    let mut p = Policy::defaults(&s);
    p.timeout = 3600 * SECOND;
    p.restart_job_on_worker_restart = restart_job;
    p.disable_retries = disable;
    p.flex_start = flex;
    p.spot = spot;
    p.max_wait = 1800 * SECOND;
    let n: u32 = pools.iter().sum();
    let demand = Demand {
        metrics: BTreeMap::new(),
        replicas: vec![ReplicaDemand::default(); n as usize],
    };
    let mut job = Job::new(1, "p".into(), "r".into(), pools, demand, p, true, 0);
    let mut now: Micros = 0;
    let mut world = World::default();
    let mut seen_cancelling = false;
    let mut terminal: Option<Job> = None;
    for op in ops {
        let names: Vec<String> = job.replicas.iter().map(|r| r.name.clone()).collect();
        let event = match op {
            Op::Place => Event::Place { nodes: vec!["a".into(); names.len()], addresses: vec![], notes: vec![] },
            Op::Stockout => Event::Stockout { detail: "x".into() },
            Op::Start(k) => match nth(&world.launching, k) {
                Some(run) => {
                    world.launching.remove(&run);
                    world.running.insert(run.clone());
                    Event::Started { run }
                }
                None => continue,
            },
            Op::Exit(k, o) => {
                let live: BTreeSet<RunId> = world.launching.union(&world.running).cloned().collect();
                match nth(&live, k) {
                    Some(run) => {
                        world.launching.remove(&run);
                        world.running.remove(&run);
                        Event::Exited { run, outcome: outcome(o), stderr_tail: vec![] }
                    }
                    None => continue,
                }
            }
            Op::Stopped(k) => match nth(&world.stopping, k) {
                Some(run) => {
                    world.stopping.remove(&run);
                    Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] }
                }
                None => continue,
            },
            Op::Cancel => Event::Cancel,
            Op::Tick(secs) => {
                now += secs as i64 * SECOND;
                Event::Tick
            }
            Op::Lost(k) => Event::NodeLost { replica: names[k % names.len()].clone(), replacement: Some("b".into()) },
            Op::Maintenance(k) => {
                Event::NodeMaintenance { replica: names[k % names.len()].clone(), replacement: Some("c".into()) }
            }
            Op::Preempt => Event::Preempt { reason: "x".into() },
        };
        let before = job.state();
        let t = match step(&job, event, now, &s) {
            Ok(t) => t,
            Err(_) => {
                prop_assert!(job.is_terminal(), "only a terminal job refuses a cancel");
                continue;
            }
        };
        job = t.job;
        world.apply(&t.effects);
        let after = job.state();
        // L1: terminal is final.
        if let Some(done) = &terminal {
            prop_assert_eq!(&job, done);
            prop_assert!(t.effects.is_empty());
        }
        // L1: CANCELLING ends only in SUCCEEDED, FAILED or CANCELLED.
        if before == State::Cancelling {
            seen_cancelling = true;
            prop_assert!(matches!(after, State::Cancelling | State::Succeeded | State::Failed | State::Cancelled));
        }
        // L11: replica restarts never exceed the limit.
        for r in &job.replicas {
            prop_assert!(r.failures <= s.max_worker_restarts);
        }
        // L12, L16: budgets.
        prop_assert!(job.retries.worker_restarts <= s.max_job_retries);
        prop_assert!(job.retries.transient_exit <= s.max_job_retries);
        prop_assert!(job.retries.stockout <= s.max_job_retries);
        prop_assert!(job.retries.internal <= s.max_internal_retries);
        if disable {
            prop_assert_eq!(job.retries.total(), 0, "L12a: no job retry at all");
        }
        // L2: error only on FAILED/CANCELLED, end time only when terminal.
        prop_assert_eq!(job.error().is_some(), matches!(after, State::Failed | State::Cancelled));
        prop_assert_eq!(job.end_time().is_some(), after.is_terminal());
        if after.is_terminal() {
            // L20: nothing of a finished job keeps running.
            prop_assert_eq!(job.live_replicas().count(), 0);
            prop_assert_eq!(world.launching.len() + world.running.len(), 0, "every live run was told to stop");
            terminal.get_or_insert(job.clone());
        }
        // The job's own view never claims fewer live runs than were launched and not ended.
        prop_assert!(job.live_replicas().count() <= world.alive());
    }
    let _ = seen_cancelling;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// L1, L2, L11, L12, L12a, L16, L20 under random event sequences.
    #[test]
    fn lifecycle_invariants(
        pools in prop_oneof![Just(vec![1u32]), Just(vec![1, 2]), Just(vec![1, 1, 1])],
        restart_job in any::<bool>(),
        disable in any::<bool>(),
        flex in any::<bool>(),
        spot in any::<bool>(),
        ops in proptest::collection::vec(op(), 0..120),
    ) {
        run_ops(&pools, restart_job, disable, flex, spot, ops)?;
    }
}

fn queued(id: u64, project: &str, cpus: u64, replicas: usize, t: Micros) -> Job {
    let s = Settings::default();
    let demand = Demand {
        metrics: [("custom_model_training_cpus".to_string(), cpus * replicas as u64)].into(),
        replicas: vec![ReplicaDemand { cpus: cpus as u32, memory_bytes: cpus << 30, accelerator: None }; replicas],
    };
    Job::new(id, project.into(), "r".into(), &[1, (replicas - 1) as u32], demand, Policy::defaults(&s), false, t)
}

fn node(name: &str, cpus: u32) -> Node {
    Node { name: name.into(), cpus, memory_bytes: (cpus as u64) << 30, accelerators: BTreeMap::new(), up: true, schedulable: true }
}

fn apply(jobs: &mut [Job], decisions: &[Decision], now: Micros) {
    let s = Settings::default();
    for d in decisions {
        let (id, e) = match d {
            Decision::Place { job, nodes, .. } => (*job, Event::Place { nodes: nodes.clone(), addresses: vec![], notes: vec![] }),
            Decision::Stockout { job, detail } => (*job, Event::Stockout { detail: detail.clone() }),
            Decision::Preempt { job, reason } => (*job, Event::Preempt { reason: reason.clone() }),
            Decision::Wait { .. } => continue,
        };
        let j = jobs.iter_mut().find(|j| j.id == id).unwrap();
        *j = step(j, e, now, &s).unwrap().job;
    }
}

/// Cancel a job and report every stopped replica's exit.
fn cancel_fully(job: &Job, now: Micros) -> Job {
    let s = Settings::default();
    let t = step(job, Event::Cancel, now, &s).unwrap();
    let mut j = t.job;
    for e in t.effects {
        if let Effect::Stop { run, .. } = e {
            assert!(j.holds_quota(), "L5: quota held while CANCELLING");
            let exited = Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] };
            j = step(&j, exited, now, &s).unwrap().job;
        }
    }
    j
}

/// L3: a job waits QUEUED while its project's quota is short, and is admitted when quota
/// comes back; it never fails for lack of quota.
#[test]
fn l3_queued_while_quota_short() {
    let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 8)].into(), projects: BTreeMap::new() };
    let fleet = Fleet { nodes: vec![node("n1", 64)], overcommit: false };
    let mut jobs = vec![queued(1, "p", 4, 2, 0), queued(2, "p", 4, 1, 1)];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule(&refs, &fleet, &quotas, 10);
    assert!(matches!(&d[0], Decision::Place { job: 1, .. }));
    assert!(matches!(&d[1], Decision::Wait { job: 2, reason } if reason.contains("custom_model_training_cpus: needs 4, 8 of 8 in use")), "{d:?}");
    apply(&mut jobs, &d, 10);
    assert_eq!(jobs[1].state(), State::Queued);
    // The first job ends: quota is returned at once (L5) and the second is admitted.
    jobs[0] = cancel_fully(&jobs[0], 20);
    assert_eq!(jobs[0].state(), State::Cancelled);
    let refs: Vec<&Job> = jobs.iter().filter(|j| !j.is_terminal()).collect();
    let d = schedule(&refs, &fleet, &quotas, 30);
    assert!(matches!(&d[..], [Decision::Place { job: 2, .. }]), "{d:?}");
}

/// L4: a request above the limit itself is named.
#[test]
fn l4_request_above_limit() {
    let quotas = Quotas {
        default: [("custom_model_training_cpus".to_string(), 8)].into(),
        projects: [("big".to_string(), [("custom_model_training_cpus".to_string(), 64)].into())].into(),
    };
    let demand: BTreeMap<String, u64> = [("custom_model_training_cpus".to_string(), 12), ("x".to_string(), 1)].into();
    assert_eq!(quotas.exceeded_by("p", &demand), vec!["custom_model_training_cpus".to_string()]);
    assert!(quotas.exceeded_by("big", &demand).is_empty());
}

/// L15: capacity held by other jobs is not a stockout (the job waits QUEUED); nodes down
/// or drained are.
#[test]
fn l15_capacity_held_vs_stockout() {
    let mut fleet = Fleet { nodes: vec![node("n1", 8), node("n2", 8)], overcommit: false };
    let quotas = Quotas::default();
    let mut jobs = vec![queued(1, "p", 8, 2, 0), queued(2, "p", 8, 1, 1)];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule(&refs, &fleet, &quotas, 10);
    assert!(matches!(&d[0], Decision::Place { job: 1, nodes, .. } if nodes == &["n1", "n2"]), "gang placement: {d:?}");
    assert!(matches!(&d[1], Decision::Wait { job: 2, reason } if reason.contains("held by other jobs")));
    apply(&mut jobs, &d, 10);
    // Now one node goes down and one is drained: the waiting job cannot fit the usable fleet.
    fleet.nodes[0].up = false;
    fleet.nodes[1].schedulable = false;
    let refs: Vec<&Job> = jobs.iter().filter(|j| j.id == 2).collect();
    let d = schedule(&refs, &fleet, &quotas, 20);
    assert!(matches!(&d[..], [Decision::Stockout { job: 2, detail }] if detail.contains("1 down, 1 drained")), "{d:?}");
}

/// The default fleet overcommits: replicas run even when the node is smaller.
#[test]
fn overcommit_places_everything() {
    let fleet = Fleet { nodes: vec![node("local", 2)], overcommit: true };
    let jobs = [queued(1, "p", 4, 3, 0), queued(2, "p", 96, 1, 0)];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule(&refs, &fleet, &Quotas::default(), 0);
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|d| matches!(d, Decision::Place { .. })));
}

/// The default fleet runs a replica whose accelerator the node lacks, with a warning.
#[test]
fn overcommit_warns_about_missing_accelerators() {
    let fleet = Fleet { nodes: vec![node("local", 2)], overcommit: true };
    let mut job = queued(1, "p", 12, 1, 0);
    job.demand.replicas[0].accelerator = Some(("NVIDIA_TESLA_A100".into(), 1));
    let d = schedule(&[&job], &fleet, &Quotas::default(), 0);
    let [Decision::Place { warnings, .. }] = &d[..] else { panic!("{d:?}") };
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("1 x NVIDIA_TESLA_A100") && warnings[0].contains("workerpool0-0"), "{warnings:?}");
}

proptest! {
    /// L3, L5: whatever the arrivals and endings, quota in use never exceeds a limit, and
    /// an exact fleet is never over-committed.
    #[test]
    fn quota_never_overcommitted(
        arrivals in proptest::collection::vec((0usize..3, 1u64..6, 1usize..4), 1..40),
        endings in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let projects = ["a", "b", "c"];
        let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 10)].into(), projects: BTreeMap::new() };
        let fleet = Fleet { nodes: vec![node("n1", 8), node("n2", 8)], overcommit: false };
        let mut jobs: Vec<Job> = Vec::new();
        let mut ends = endings.into_iter();
        for (i, (p, cpus, reps)) in arrivals.into_iter().enumerate() {
            let now = i as Micros * SECOND;
            jobs.push(queued(i as u64 + 1, projects[p], cpus, reps, now));
            let live: Vec<&Job> = jobs.iter().filter(|j| !j.is_terminal()).collect();
            let d = schedule(&live, &fleet, &quotas, now);
            apply(&mut jobs, &d, now);
            for ((_, metric), used) in quota_usage(jobs.iter()) {
                prop_assert!(used <= 10, "{metric} over quota: {used}");
            }
            let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
            for j in jobs.iter().filter(|j| j.holds_capacity()) {
                for (r, d) in j.replicas.iter().zip(&j.demand.replicas) {
                    if r.state.is_live() {
                        *per_node.entry(r.node.clone().unwrap()).or_insert(0) += d.cpus;
                    }
                }
            }
            prop_assert!(per_node.values().all(|&c| c <= 8), "{per_node:?}");
            // Some job ends (cancelled; its replicas report their exit).
            if let Some(ix) = ends.next() {
                let k = ix.index(jobs.len());
                if !jobs[k].is_terminal() {
                    // L5: quota is held until the job is terminal, through CANCELLING.
                    jobs[k] = cancel_fully(&jobs[k], now);
                    prop_assert!(jobs[k].is_terminal());
                }
            }
        }
    }
}
