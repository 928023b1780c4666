//! Property tests of the lifecycle and admission invariants: terminal is final (L1),
//! replica restarts never exceed the limit (L11), retries never exceed their budgets
//! (L12, L16), nothing is left running after a terminal state (L20), and quota is never
//! over-committed (L3, L5).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_core::job::{Demand, Policy, ReplicaDemand, SECOND};
use trainyard_core::schedule::{quota_usage, schedule, Decision, Fleet, Node, QuotaUse, Quotas};
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
                Effect::Log(_) | Effect::Purge { .. } | Effect::Signal { .. } | Effect::NodeFailed { .. } | Effect::Notice { .. } => {}
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
            Decision::Impossible { job, reason } => (*job, Event::Impossible { reason: reason.clone() }),
            Decision::Preempt { job, reason, .. } => (*job, Event::Preempt { reason: reason.clone() }),
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
    let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 8)].into(), projects: BTreeMap::new(), ..Quotas::default() };
    let fleet = Fleet { nodes: vec![node("n1", 64)], overcommit: false };
    let mut jobs = vec![queued(1, "p", 4, 2, 0), queued(2, "p", 4, 1, 1)];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule(&refs, &fleet, &quotas, 10);
    assert!(matches!(&d[0], Decision::Place { job: 1, .. }));
    assert!(matches!(&d[1], Decision::Wait { job: 2, reason, .. } if reason.contains("custom_model_training_cpus: needs 4, 8 of 8 in use")), "{d:?}");
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
        ..Quotas::default()
    };
    let demand: BTreeMap<String, u64> = [("custom_model_training_cpus".to_string(), 12), ("x".to_string(), 1)].into();
    assert_eq!(quotas.exceeded_by("p", &demand), vec!["custom_model_training_cpus".to_string()]);
    assert!(quotas.exceeded_by("big", &demand).is_empty());
}

/// A waiting reason gives a replica's memory as it is (1.5 GiB), not rounded to a whole
/// GiB.
#[test]
fn l3_a_waiting_reason_gives_memory_unrounded() {
    let fleet = Fleet { nodes: vec![node("n1", 2)], overcommit: false };
    let mut holder = queued(1, "p", 2, 1, 0);
    let mut small = queued(2, "p", 1, 1, 1);
    for j in [&mut holder, &mut small] {
        let s = Settings::default();
        let demand = Demand {
            metrics: [("custom_model_training_cpus".to_string(), 2)].into(),
            replicas: vec![ReplicaDemand { cpus: 2, memory_bytes: 3 << 29, accelerator: None }],
        };
        *j = Job::new(j.id, "p".into(), "r".into(), &[1], demand, Policy::defaults(&s), false, j.create_time);
    }
    let jobs = [holder, small];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule(&refs, &fleet, &Quotas::default(), 10);
    let reason = d.iter().find_map(|d| match d { Decision::Wait { job: 2, reason, .. } => Some(reason.to_string()), _ => None }).unwrap_or_default();
    assert!(reason.contains("1 replica of 2 CPUs and 1.5 GiB"), "{reason}\n{d:?}");
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
    assert!(matches!(&d[1], Decision::Wait { job: 2, reason, .. } if reason.contains("held by other jobs")));
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
        let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 10)].into(), projects: BTreeMap::new(), ..Quotas::default() };
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

// ---- The scheduler's rules: backfill, fairness, SPOT preemption, reasons. ----

use trainyard_core::capacity::{Need, NodeIx, Shape};
use trainyard_core::job::{HOUR, MINUTE};
use trainyard_core::schedule::{plan, schedule_with, Cluster, Hints, Request, SchedulerConfig, UsageHistory};

const GPU: &str = "NVIDIA_H100_80GB";

fn gpu_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n)
            .map(|i| Node {
                name: format!("n{i}"),
                cpus: 96,
                memory_bytes: 1 << 40,
                accelerators: [(GPU.to_string(), 8)].into(),
                up: true,
                schedulable: true,
            })
            .collect(),
        overcommit: false,
    }
}

fn gpu_demand(per: u32) -> ReplicaDemand {
    ReplicaDemand { cpus: 12 * per, memory_bytes: (100u64 << 30) * per as u64, accelerator: Some((GPU.to_string(), per)) }
}

fn gang(c: &Cluster, replicas: usize, per: u32) -> Shape {
    c.shape(&vec![gpu_demand(per); replicas])
}

fn need(c: &Cluster, per: u32) -> Need {
    c.shape(&[gpu_demand(per)]).needs[0]
}

fn req<'a>(id: u64, project: &'a str, shape: &'a Shape, duration: Micros, metrics: &'a BTreeMap<String, u64>) -> Request<'a> {
    Request { id, project, submitted: id as Micros, admitted: false, spot: false, shape, metrics, duration, priority: 0, may_borrow: true, avoid: Vec::new() }
}

fn run(c: &Cluster, reqs: &[Request], now: Micros, cfg: &SchedulerConfig) -> Vec<Decision> {
    plan(&mut c.clone(), reqs, &Quotas::default(), &QuotaUse::default(), now, cfg)
}

fn placed(d: &[Decision], id: u64) -> Option<Vec<String>> {
    d.iter().find_map(|d| match d {
        Decision::Place { job, nodes, .. } if *job == id => Some(nodes.clone()),
        _ => None,
    })
}

fn reason(d: &[Decision], id: u64) -> String {
    d.iter()
        .find_map(|d| match d {
            Decision::Wait { job, reason, position, .. } if *job == id => {
                Some(trainyard_core::schedule::waiting_text(reason, *position, "p"))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Wait for job {id}: {d:?}"))
}

/// `max_reservations`: the first job that does not fit and the oldest starving jobs after
/// it hold a reservation, at most this many; the rest wait without one (`[scheduler]
/// max_reservations`, 1 being EASY backfill's one).
#[test]
fn at_most_max_reservations_jobs_hold_a_reservation() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "a", false, 0, HOUR, vec![(0 as NodeIx, n8)]);
    c.start(101, "a", false, 0, 2 * HOUR, vec![(1 as NodeIx, n8)]);
    let m = BTreeMap::new();
    let whole = gang(&c, 1, 8);
    let now = 5 * HOUR;
    // Three whole-node jobs, all past the starvation bound (2 h).
    let reqs: Vec<Request> = (1..=3)
        .map(|i| {
            let mut r = req(i, "b", &whole, HOUR, &m);
            r.submitted = 0;
            r
        })
        .collect();
    let reserved = |max: usize| {
        let cfg = SchedulerConfig { max_reservations: max, ..SchedulerConfig::default() };
        run(&c, &reqs, now, &cfg)
            .iter()
            .filter(|d| matches!(d, Decision::Wait { kind, reserved_at: Some(_), .. } if *kind == trainyard_core::schedule::KIND_RESERVED))
            .count()
    };
    assert_eq!(reserved(64), 3);
    assert_eq!(reserved(2), 2);
    assert_eq!(reserved(1), 1, "EASY's one");
}

/// EASY backfill: the head that does not fit gets a reservation; a later job starts only
/// if it ends before the reservation or uses nodes the reservation does not need.
#[test]
fn backfill_cannot_delay_the_reservation() {
    let mut c = Cluster::new(&gpu_fleet(5));
    let n8 = need(&c, 8);
    // A running job holds n0 and n1 until 1h (its timeout from admission).
    c.start(100, "a", false, 0, HOUR, vec![(0 as NodeIx, n8), (1, n8)]);
    let m = BTreeMap::new();
    let head = gang(&c, 4, 8); // needs 4 whole nodes: only n2, n3, n4 are free
    let one = gang(&c, 1, 8);
    let reqs = [
        req(1, "a", &head, 10 * HOUR, &m),
        req(2, "a", &one, 30 * MINUTE, &m), // ends before the reservation
        req(3, "a", &one, 10 * HOUR, &m),   // runs past it: only an unreserved node
        req(4, "a", &one, 10 * HOUR, &m),   // runs past it, nothing unreserved left
    ];
    let cfg = SchedulerConfig { order: trainyard_core::schedule::Order::Fifo, ..SchedulerConfig::default() };
    let d = run(&c, &reqs, 0, &cfg);
    let r1 = reason(&d, 1);
    // No time in the text: it would rest on other jobs' time limits (reserved_at has it).
    assert!(r1.contains("held by other jobs") && r1.contains("Reserved: 4 nodes (") && !r1.contains("expected to start"), "{r1}");
    // The reservation takes the nodes that free up (n0, n1), then n2, n3: n4 stays open.
    assert_eq!(placed(&d, 3), Some(vec!["n4".to_string()]), "{d:?}");
    assert!(placed(&d, 2).is_some(), "a job that ends before the reservation backfills: {d:?}");
    let r4 = reason(&d, 4);
    assert!(r4.contains("would fit now, but it could run past") && r4.contains("reserved for a job ahead of it"), "{r4}");
    // No time either: the reservation's rests on another job's time limit.
    assert!(!r4.contains("(by ") && !r4.contains("within"), "{r4}");
    // Without backfill (strict FIFO) nothing passes the head.
    let d = run(&c, &reqs, 0, &SchedulerConfig::fifo());
    assert!(d.iter().all(|d| !matches!(d, Decision::Place { .. })), "{d:?}");
    assert!(reason(&d, 2).contains("a job ahead of it does not fit yet"), "{d:?}");
}

/// Property: whatever backfill admits, the head still fits at its reservation time once
/// the jobs expected to end by then have ended.
#[test]
fn backfilled_jobs_leave_room_for_the_head() {
    let mut c = Cluster::new(&gpu_fleet(6));
    let n4 = need(&c, 4);
    c.start(100, "a", false, 0, 2 * HOUR, vec![(0, n4), (1, n4), (2, n4)]);
    c.start(101, "a", false, 0, 3 * HOUR, vec![(3, n4)]);
    let m = BTreeMap::new();
    let head = gang(&c, 6, 8);
    let small = gang(&c, 1, 4);
    let mut reqs = vec![req(1, "a", &head, HOUR, &m)];
    for id in 2..20 {
        reqs.push(req(id, "a", &small, if id % 2 == 0 { HOUR } else { 10 * HOUR }, &m));
    }
    let d = run(&c, &reqs, 0, &SchedulerConfig::easy());
    // At 3h both running jobs have ended; the short backfilled ones too. What is left
    // are the long backfilled jobs: the head's 6 nodes x 8 GPUs must still be free.
    let mut after = c.clone();
    after.finish(100);
    after.finish(101);
    for dd in &d {
        if let Decision::Place { job, nodes, .. } = dd {
            if job % 2 == 1 {
                let placed: Vec<(NodeIx, Need)> = nodes.iter().map(|n| (after.node(n).unwrap(), n4)).collect();
                after.start(*job, "a", false, 0, 10 * HOUR, placed);
            }
        }
    }
    let d2 = run(&after, &reqs[..1], 3 * HOUR, &SchedulerConfig::easy());
    assert!(placed(&d2, 1).is_some(), "backfill delayed the head: {d:?} then {d2:?}");
}

/// Fair share: the project using less (weighted dominant share) goes first, whatever the
/// submission order; weights change the order; FIFO within a project.
#[test]
fn fair_share_order_and_weights() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    // Project "heavy" already uses one whole node; one node is left.
    c.start(100, "heavy", false, 0, 10 * HOUR, vec![(0, n8)]);
    let m = BTreeMap::new();
    let one = gang(&c, 1, 8);
    let reqs = [req(1, "heavy", &one, HOUR, &m), req(2, "light", &one, HOUR, &m), req(3, "light", &one, HOUR, &m)];
    let d = run(&c, &reqs, 0, &SchedulerConfig::default());
    assert!(placed(&d, 2).is_some() && placed(&d, 1).is_none(), "{d:?}");
    let r1 = reason(&d, 1);
    assert!(r1.contains("(fair-share order)"), "{r1}");
    // The light project's second job comes after... the light project's first job.
    let pos = |id: u64| d.iter().position(|x| matches!(x, Decision::Place { job, .. } | Decision::Wait { job, .. } if *job == id)).unwrap();
    assert!(pos(2) < pos(3));
    // "heavy" holds half the fleet, "light" a quarter: light goes first, unless heavy's
    // weight is 4 (0.5 / 4 < 0.25).
    let mut cfg = SchedulerConfig::default();
    cfg.weights.insert("heavy".into(), 4.0);
    let mut c3 = Cluster::new(&gpu_fleet(4));
    c3.start(100, "heavy", false, 0, 10 * HOUR, vec![(0, n8), (1, n8)]);
    c3.start(101, "light", false, 0, 10 * HOUR, vec![(2, n8)]);
    let reqs = [req(2, "light", &one, HOUR, &m), req(1, "heavy", &one, HOUR, &m)];
    let d = run(&c3, &reqs, 0, &cfg);
    assert!(placed(&d, 1).is_some() && placed(&d, 2).is_none(), "weights: {d:?}");
    let d = run(&c3, &reqs, 0, &SchedulerConfig::default());
    assert!(placed(&d, 2).is_some() && placed(&d, 1).is_none(), "no weights: {d:?}");
    // A job that waited past the starvation age goes first regardless of share.
    let mut old = req(1, "heavy", &one, HOUR, &m);
    old.submitted = 0;
    let reqs = [req(2, "light", &one, HOUR, &m), old];
    let d = run(&c3, &reqs, 3 * HOUR, &SchedulerConfig::default());
    assert!(placed(&d, 1).is_some(), "starving job first: {d:?}");
}

/// SPOT: non-SPOT work that does not fit preempts the cheapest set of SPOT jobs (least
/// work lost), never a non-SPOT job, and not a SPOT job that has just started.
/// Holds TY1 (docs/lifecycle.md).
#[test]
fn spot_preemption_picks_the_cheapest_set() {
    let mut c = Cluster::new(&gpu_fleet(3));
    let n8 = need(&c, 8);
    let n4 = need(&c, 4);
    let now = 10 * HOUR;
    c.start(10, "s", true, 0, 20 * HOUR, vec![(0, n8)]); // ran 10h on 8 GPUs: expensive
    c.start(11, "s", true, 9 * HOUR, 20 * HOUR, vec![(1, n4)]); // ran 1h on 4 GPUs
    c.start(12, "s", true, 9 * HOUR, 20 * HOUR, vec![(1, n4)]);
    c.start(13, "p", false, 0, 20 * HOUR, vec![(2, n8)]); // not SPOT: never preempted
    let m = BTreeMap::new();
    let one = gang(&c, 1, 8);
    let d = run(&c, &[req(1, "p", &one, HOUR, &m)], now, &SchedulerConfig::default());
    let mut victims: Vec<u64> = d
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt { job, .. } => Some(*job),
            _ => None,
        })
        .collect();
    victims.sort();
    assert_eq!(victims, vec![11, 12], "{d:?}");
    assert!(reason(&d, 1).contains("2 SPOT jobs are being preempted"), "{d:?}");
    // Next round the victims are stopping: the job waits for them, nothing more is preempted.
    c.mark_stopping(11);
    c.mark_stopping(12);
    let d = run(&c, &[req(1, "p", &one, HOUR, &m)], now + 10 * SECOND, &SchedulerConfig::default());
    assert!(d.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{d:?}");
    // Once they stopped, it is placed where they were.
    c.finish(11);
    c.finish(12);
    let d = run(&c, &[req(1, "p", &one, HOUR, &m)], now + 40 * SECOND, &SchedulerConfig::default());
    assert_eq!(placed(&d, 1), Some(vec!["n1".to_string()]), "{d:?}");
    // A gang that needs two nodes preempts both SPOT nodes' jobs only if that suffices;
    // with only non-SPOT jobs in the way nothing is preempted.
    let mut c = Cluster::new(&gpu_fleet(2));
    c.start(13, "p", false, 0, 20 * HOUR, vec![(0, n8)]);
    c.start(14, "s", true, 0, 20 * HOUR, vec![(1, n4)]);
    let two = gang(&c, 2, 8);
    let d = run(&c, &[req(1, "p", &two, HOUR, &m)], now, &SchedulerConfig::default());
    assert!(d.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{d:?}");
    // A SPOT job that has just started is not preempted (it would thrash).
    let mut c = Cluster::new(&gpu_fleet(1));
    c.start(15, "s", true, now - 5 * MINUTE, 20 * HOUR, vec![(0, n8)]);
    let d = run(&c, &[req(1, "p", &one, HOUR, &m)], now, &SchedulerConfig::default());
    assert!(d.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{d:?}");
    // With preemption off (the baselines), SPOT jobs are ordinary jobs.
    let mut c = Cluster::new(&gpu_fleet(1));
    c.start(16, "s", false, 0, 20 * HOUR, vec![(0, n8)]);
    let d = run(&c, &[req(1, "p", &one, HOUR, &m)], now, &SchedulerConfig::easy());
    assert!(d.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{d:?}");
}

/// "Why is my job waiting": quota shortfall and position, via `schedule_with` on jobs.
#[test]
fn wait_reasons_name_quota_shortfall_and_position() {
    let quotas = Quotas { default: [("custom_model_training_cpus".to_string(), 8)].into(), projects: BTreeMap::new(), ..Quotas::default() };
    let fleet = Fleet { nodes: vec![node("n1", 64)], overcommit: false };
    let jobs = [queued(1, "p", 4, 2, 0), queued(2, "p", 6, 1, 1)];
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule_with(&refs, &fleet, &quotas, 10, &SchedulerConfig::default(), &Hints::default());
    let r = reason(&d, 2);
    assert!(r.contains("custom_model_training_cpus: needs 6, 8 of 8 in use (short by 6)"), "{r}");
    assert!(r.contains("position 2 of 2 among project p's waiting jobs (fair-share order)"), "{r}");
}

/// The hint replaces the timeout as the expected duration: a job hinted to end soon
/// gives an earlier reservation.
#[test]
fn hints_shorten_reservations() {
    let fleet = gpu_fleet(1);
    let s = Settings::default();
    let mut running = Job::new(1, "p".into(), "r".into(), &[1], Demand { metrics: BTreeMap::new(), replicas: vec![gpu_demand(8)] }, Policy::defaults(&s), false, 0);
    running = step(&running, Event::Place { nodes: vec!["n0".into()], addresses: vec![], notes: vec![] }, 0, &s).unwrap().job;
    let waiting = Job::new(2, "p".into(), "r".into(), &[1], Demand { metrics: BTreeMap::new(), replicas: vec![gpu_demand(8)] }, Policy::defaults(&s), false, 0);
    let refs = [&running, &waiting];
    let d = schedule_with(&refs, &fleet, &Quotas::default(), 0, &SchedulerConfig::default(), &Hints::default());
    let reserved_at = |d: &[Decision]| {
        d.iter().find_map(|x| match x {
            Decision::Wait { job: 2, reserved_at, .. } => *reserved_at,
            _ => None,
        })
    };
    assert_eq!(reserved_at(&d), Some(7 * 24 * HOUR), "{d:?}");
    let hints = Hints { expected_duration: [(1u64, 2 * HOUR)].into(), ..Hints::default() };
    let d = schedule_with(&refs, &fleet, &Quotas::default(), 0, &SchedulerConfig::default(), &hints);
    assert_eq!(reserved_at(&d), Some(2 * HOUR), "{d:?}");
}

fn gpu_job(id: u64, project: &str, replicas: usize, per: u32, spot: bool, t: Micros) -> Job {
    let s = Settings::default();
    let mut p = Policy::defaults(&s);
    p.spot = spot;
    p.timeout = HOUR * (1 + (id % 5) as i64);
    let demand = Demand {
        metrics: [("gpus".to_string(), per as u64 * replicas as u64)].into(),
        replicas: vec![gpu_demand(per); replicas],
    };
    let pools = if replicas == 1 { vec![1] } else { vec![1, (replicas - 1) as u32] };
    Job::new(id, project.into(), "r".into(), &pools, demand, p, false, t)
}

/// Deliver every Stop effect as an exit, and every Launch as started.
fn settle(job: Job, effects: Vec<Effect>, now: Micros) -> Job {
    let s = Settings::default();
    let mut j = job;
    let mut queue = effects;
    while let Some(e) = queue.pop() {
        let ev = match e {
            Effect::Launch { run, .. } => Event::Started { run },
            Effect::Stop { run, .. } => Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] },
            Effect::Log(_) | Effect::Purge { .. } | Effect::Signal { .. } | Effect::NodeFailed { .. } | Effect::Notice { .. } => continue,
        };
        let t = step(&j, ev, now, &s).unwrap();
        j = t.job;
        queue.extend(t.effects);
    }
    j
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// L3, L5 with GPUs, gangs, fair share, backfill and SPOT preemption: quota in use never
    /// exceeds a limit, no node ever holds more GPUs, CPUs or memory than it has, and no
    /// non-SPOT job is ever preempted.
    #[test]
    fn gpu_fleet_never_overcommitted(
        arrivals in proptest::collection::vec((0usize..3, 1usize..4, prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], any::<bool>()), 1..40),
        endings in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let s = Settings::default();
        let projects = ["a", "b", "c"];
        let quotas = Quotas { default: [("gpus".to_string(), 24)].into(), projects: BTreeMap::new(), ..Quotas::default() };
        let fleet = gpu_fleet(4);
        let mut jobs: Vec<Job> = Vec::new();
        let mut ends = endings.into_iter();
        for (i, (p, reps, per, spot)) in arrivals.into_iter().enumerate() {
            let now = i as Micros * 10 * MINUTE;
            jobs.push(gpu_job(i as u64 + 1, projects[p], reps, per, spot, now));
            for _round in 0..2 {
                let live: Vec<&Job> = jobs.iter().filter(|j| !j.is_terminal()).collect();
                let d = schedule(&live, &fleet, &quotas, now);
                for dec in &d {
                    let (id, e) = match dec {
                        Decision::Place { job, nodes, .. } => (*job, Event::Place { nodes: nodes.clone(), addresses: vec![], notes: vec![] }),
                        Decision::Stockout { job, detail } => (*job, Event::Stockout { detail: detail.clone() }),
                        Decision::Impossible { job, reason } => (*job, Event::Impossible { reason: reason.clone() }),
                        Decision::Preempt { job, reason, .. } => (*job, Event::Preempt { reason: reason.clone() }),
                        Decision::Wait { .. } => continue,
                    };
                    let j = jobs.iter_mut().find(|j| j.id == id).unwrap();
                    if matches!(dec, Decision::Preempt { .. }) {
                        prop_assert!(j.policy.spot, "a non-SPOT job was preempted");
                    }
                    let t = step(j, e, now, &s).unwrap();
                    *j = settle(t.job, t.effects, now);
                }
                for ((_, metric), used) in quota_usage(jobs.iter()) {
                    prop_assert!(used <= 24, "{metric} over quota: {used}");
                }
                let mut per_node: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
                for j in jobs.iter().filter(|j| j.holds_capacity()) {
                    for (r, d) in j.replicas.iter().zip(&j.demand.replicas) {
                        if r.state.is_live() {
                            let e = per_node.entry(r.node.clone().unwrap()).or_insert((0, 0, 0));
                            e.0 += d.accelerator.as_ref().map_or(0, |a| a.1 as u64);
                            e.1 += d.cpus as u64;
                            e.2 += d.memory_bytes;
                        }
                    }
                }
                prop_assert!(per_node.values().all(|&(g, c, m)| g <= 8 && c <= 96 && m <= 1 << 40), "{per_node:?}");
            }
            if let Some(ix) = ends.next() {
                let k = ix.index(jobs.len());
                if !jobs[k].is_terminal() {
                    jobs[k] = cancel_fully(&jobs[k], now);
                }
            }
        }
    }
}

/// Waiting reasons of jobs in the same situation are one shared text (a long queue costs
/// one reason per situation, not one per job), each job keeps its own position, and a
/// placement in between gives the jobs after it a fresh text (never a stale one).
#[test]
fn same_situation_shares_one_reason_with_own_positions() {
    let fleet = Fleet { nodes: vec![node("n1", 8)], overcommit: false };
    let mut jobs = vec![queued(1, "p", 8, 1, 0)];
    for id in 2..=6 {
        jobs.push(queued(id, "p", 8, 1, id as Micros));
    }
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule_with(&refs, &fleet, &Quotas::default(), 10, &SchedulerConfig::default(), &Hints::default());
    assert!(matches!(&d[0], Decision::Place { job: 1, .. }), "{d:?}");
    let waits: Vec<(u64, std::sync::Arc<str>, u32)> = d
        .iter()
        .filter_map(|x| match x {
            Decision::Wait { job, reason, position: Some(p), .. } => Some((*job, reason.clone(), p.pos)),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 5, "{d:?}");
    // Job 2 holds the reservation; 3..6 share one text.
    assert!(waits[0].1.contains("Reserved"), "{}", waits[0].1);
    for w in &waits[2..] {
        assert!(std::sync::Arc::ptr_eq(&waits[1].1, &w.1), "{} vs {}", waits[1].1, w.1);
    }
    assert_eq!(waits.iter().map(|w| w.2).collect::<Vec<_>>(), [2, 3, 4, 5, 6]);
    let text = trainyard_core::schedule::waiting_text(&waits[1].1, Some(trainyard_core::schedule::Position { pos: 3, total: 6, fifo: false }), "p");
    assert!(text.ends_with("; position 3 of 6 among project p's waiting jobs (fair-share order)."), "{text}");
}

/// The memo never outlives the state it was written in: after a placement, a job of the
/// same shape and the same relation to the reservation gets a fresh reason ("at most N
/// fit now" drops), never the one written before the placement.
#[test]
fn shared_reasons_follow_placements() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    // n0 is busy until 1h; n1 is free.
    c.start(100, "a", false, 0, HOUR, vec![(0 as NodeIx, n8)]);
    let m = BTreeMap::new();
    let two = gang(&c, 2, 8);
    let one = gang(&c, 1, 8);
    let reqs = [
        req(1, "a", &two, 10 * HOUR, &m),   // the head: reserved for 1h on n0 and n1
        req(2, "a", &one, 10 * HOUR, &m),   // runs past the reservation: waits
        req(3, "a", &one, 30 * MINUTE, &m), // ends before it: backfills onto n1
        req(4, "a", &one, 10 * HOUR, &m),   // as job 2, but after job 3 took n1
    ];
    let cfg = SchedulerConfig { order: trainyard_core::schedule::Order::Fifo, ..SchedulerConfig::default() };
    let d = run(&c, &reqs, 0, &cfg);
    assert!(placed(&d, 3).is_some(), "{d:?}");
    let (r2, r4) = (reason(&d, 2), reason(&d, 4));
    assert!(r2.contains("at most 1 fit now"), "{r2}");
    assert!(r4.contains("at most 0 fit now"), "{r4}");
}

/// Reservation times are RFC 3339.
#[test]
fn reservation_times_are_rfc3339() {
    assert_eq!(trainyard_core::schedule::rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(trainyard_core::schedule::rfc3339(951_782_400 * SECOND), "2000-02-29T00:00:00Z");
    assert_eq!(trainyard_core::schedule::rfc3339(1_796_634_797 * SECOND + 5), "2026-12-07T09:13:17Z");
}

/// Waiting reasons and preemption reasons name no other job and no other project, and
/// count no other project's jobs: a position is among the project's own waiting jobs.
#[test]
fn reasons_name_no_other_tenant() {
    let mut c = Cluster::new(&gpu_fleet(3));
    let n8 = need(&c, 8);
    c.start(100, "other-team", false, 0, HOUR, vec![(0 as NodeIx, n8)]);
    c.start(101, "other-team", true, 0, HOUR, vec![(1 as NodeIx, n8)]);
    let m = BTreeMap::new();
    let two = gang(&c, 2, 8);
    let one = gang(&c, 1, 8);
    let reqs = [
        req(1, "other-team", &two, 10 * HOUR, &m),
        req(2, "mine", &one, 10 * HOUR, &m),
        req(3, "mine", &two, 10 * HOUR, &m),
    ];
    for cfg in [SchedulerConfig::default(), SchedulerConfig::fifo(), SchedulerConfig::easy()] {
        let d = run(&c, &reqs, 0, &cfg);
        for x in &d {
            let text = match x {
                Decision::Wait { job, reason, position, .. } if *job != 1 => {
                    // Positions count the project's own waiting jobs only (2), never the
                    // queue's length.
                    assert!(position.is_none_or(|p| p.total == 2 && p.pos <= 2), "{position:?}");
                    trainyard_core::schedule::waiting_text(reason, *position, "mine")
                }
                Decision::Preempt { reason, .. } => reason.clone(),
                _ => continue,
            };
            for leak in ["other-team", "job 1", "job 100", "job 101"] {
                assert!(!text.contains(leak), "{leak:?} in {text:?}");
            }
        }
    }
}

/// A job past the starvation bound says so: it goes ahead of the fair-share order and,
/// first not to fit, holds the reservation; a job within the bound does not say it.
#[test]
fn starving_job_says_it_is_past_the_bound() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "big", false, 0, 10 * HOUR, vec![(0 as NodeIx, n8), (1, n8)]);
    let m = BTreeMap::new();
    let one = gang(&c, 1, 8);
    let mut old = req(1, "small", &one, HOUR, &m);
    old.submitted = 0;
    let mut fresh = req(2, "small", &one, HOUR, &m);
    fresh.submitted = 3 * HOUR;
    let d = run(&c, &[fresh, old], 3 * HOUR, &SchedulerConfig::default());
    let r1 = reason(&d, 1);
    assert!(r1.contains("Reserved") && r1.contains("past the starvation bound (2h 0m)"), "{r1}");
    let r2 = reason(&d, 2);
    assert!(!r2.contains("starvation"), "{r2}");
}

/// Priority classes: a job of a higher class is considered first, whatever the order of
/// submission and the projects' fair shares; among equal classes the usual order holds.
/// A job that waits behind work of a higher class says so, naming no project.
#[test]
fn a_higher_priority_class_goes_first() {
    let c = Cluster::new(&gpu_fleet(1));
    let whole = gang(&c, 1, 8);
    let m = BTreeMap::new();
    let cfg = SchedulerConfig::default();
    let older = req(1, "a", &whole, HOUR, &m);
    let urgent = Request { priority: 100, ..req(2, "b", &whole, HOUR, &m) };
    let d = run(&c, &[older.clone(), urgent.clone()], 0, &cfg);
    assert!(placed(&d, 2).is_some() && placed(&d, 1).is_none(), "{d:?}");
    // The node held by a third job: both wait, the older one behind the urgent one.
    let mut busy = Cluster::new(&gpu_fleet(1));
    let n8 = need(&busy, 8);
    busy.start(100, "c", false, 0, HOUR, vec![(0 as NodeIx, n8)]);
    let d = run(&busy, &[older.clone(), urgent.clone()], 0, &cfg);
    let r1 = reason(&d, 1);
    assert!(r1.contains("a higher priority class") && !r1.contains("\"b\""), "{r1}");
    assert!(!reason(&d, 2).contains("priority"), "{}", reason(&d, 2));
    // Equal classes: the older job first, and no word of priorities.
    let same = Request { priority: 0, ..urgent };
    let d = run(&c, &[older, same], 0, &cfg);
    assert!(placed(&d, 1).is_some() && placed(&d, 2).is_none(), "{d:?}");
    assert!(!reason(&d, 2).contains("priority"), "{}", reason(&d, 2));
}

/// Within one class the fair order holds: with two urgent jobs of two projects and one
/// node, the project that uses less goes first even when its job is younger.
#[test]
fn fair_share_orders_jobs_of_one_priority_class() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "heavy", false, 0, HOUR, vec![(0 as NodeIx, n8)]);
    let whole = gang(&c, 1, 8);
    let m = BTreeMap::new();
    let heavy = Request { priority: 5, ..req(1, "heavy", &whole, HOUR, &m) };
    let light = Request { priority: 5, ..req(2, "light", &whole, HOUR, &m) };
    let low = req(3, "light", &whole, HOUR, &m);
    let d = run(&c, &[heavy, light, low], 0, &SchedulerConfig::default());
    assert!(placed(&d, 2).is_some(), "the lighter project's job of the same class: {d:?}");
    assert!(placed(&d, 1).is_none() && placed(&d, 3).is_none(), "{d:?}");
}

/// Priority preemption (`priority_preemption`): a job of a higher class that cannot fit
/// preempts the cheapest running work of lower classes (the fewest accelerator-hours lost
/// since their last checkpoint), never a job that is not preemptible now (its minimum run
/// time, its preemptions used up) nor one of its own class; off, nothing is preempted.
/// Holds TY2 (docs/lifecycle.md).
#[test]
fn a_higher_priority_job_preempts_the_cheapest_lower_priority_work() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "a", false, 0, 10 * HOUR, vec![(0 as NodeIx, n8)]);
    c.start(101, "a", false, 0, 10 * HOUR, vec![(1 as NodeIx, n8)]);
    // Job 101 saved a checkpoint at 3 h: less work is lost by stopping it at 4 h.
    c.set_priority(100, 0, true, 0);
    c.set_priority(101, 0, true, 3 * HOUR);
    let whole = gang(&c, 1, 8);
    let m = BTreeMap::new();
    let urgent = Request { priority: 100, ..req(1, "b", &whole, HOUR, &m) };
    let on = SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() };
    let preempted = |d: &[Decision]| -> Vec<(u64, Option<i64>)> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, by_priority, .. } => Some((*job, *by_priority)),
                _ => None,
            })
            .collect()
    };
    let now = 4 * HOUR;
    let d = run(&c, std::slice::from_ref(&urgent), now, &on);
    assert_eq!(preempted(&d), vec![(101, Some(100))], "{d:?}");
    assert!(reason(&d, 1).contains("1 job of a lower priority is being preempted for it"), "{}", reason(&d, 1));
    // Next round the victim is stopping: the job waits for it, and no SPOT job is named
    // where there is none.
    let mut stopping = c.clone();
    stopping.mark_stopping(101);
    let d = run(&stopping, std::slice::from_ref(&urgent), now + SECOND, &on);
    assert!(preempted(&d).is_empty(), "{d:?}");
    let r = reason(&d, 1);
    assert!(r.contains("Waiting for capacity being freed: 1 job that is stopping already will free what it needs") && !r.contains("SPOT"), "{r}");
    assert!(preempted(&run(&c, std::slice::from_ref(&urgent), now, &SchedulerConfig::default())).is_empty(), "off");
    // Of its own class, or not preemptible now: never.
    let same = Request { priority: 0, ..urgent.clone() };
    assert!(preempted(&run(&c, std::slice::from_ref(&same), now, &on)).is_empty());
    c.set_priority(100, 0, false, 0);
    c.set_priority(101, 0, false, 3 * HOUR);
    assert!(preempted(&run(&c, std::slice::from_ref(&urgent), now, &on)).is_empty());
}

/// A preemption counts capacity already being freed: with a job cancelled and still
/// stopping, a job of a higher class waits for that job's capacity instead of preempting
/// another (which would have lost its work for nothing, the cancelled job gone moments
/// later); once the cancelled job is gone it starts there, and nothing is ever preempted.
/// Holds TY2 (docs/lifecycle.md).
#[test]
fn a_preemption_counts_capacity_being_freed_by_a_cancel() {
    let s = Settings::default();
    let fleet = gpu_fleet(2);
    let quotas = Quotas::default();
    let on = SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() };
    let mut jobs = vec![gpu_job(1, "a", 1, 8, false, 0), gpu_job(2, "a", 1, 8, false, 0)];
    let d = schedule_with(&jobs.iter().collect::<Vec<_>>(), &fleet, &quotas, 0, &on, &Hints::default());
    for dec in &d {
        if let Decision::Place { job, nodes, .. } = dec {
            let j = jobs.iter_mut().find(|j| j.id == *job).unwrap();
            let t = step(j, Event::Place { nodes: nodes.clone(), addresses: vec![], notes: vec![] }, 0, &s).unwrap();
            *j = settle(t.job, t.effects, 0);
        }
    }
    assert!(jobs.iter().all(|j| j.state() == State::Running), "{:?}", jobs.iter().map(|j| j.state()).collect::<Vec<_>>());
    // Two hours in, job 1 is cancelled; its replica has not stopped yet.
    let now = 2 * HOUR;
    jobs[0] = step(&jobs[0], Event::Cancel, now, &s).unwrap().job;
    assert_eq!(jobs[0].state(), State::Cancelling);
    let mut urgent = gpu_job(3, "b", 1, 8, false, now);
    urgent.policy.priority = 100;
    jobs.push(urgent);
    let refs: Vec<&Job> = jobs.iter().collect();
    let d = schedule_with(&refs, &fleet, &quotas, now + SECOND, &on, &Hints::default());
    assert!(!d.iter().any(|d| matches!(d, Decision::Preempt { .. })), "a needless preemption: {d:?}");
    let why = d.iter().find_map(|d| match d { Decision::Wait { job: 3, reason, .. } => Some(reason.to_string()), _ => None }).unwrap_or_default();
    assert!(why.contains("stopping") && !why.contains("lower priority"), "{why}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A preemption counts capacity being freed first: on whole-node jobs, a waiter of a
    /// higher class that fits in what is free and what stopping jobs hold preempts no one;
    /// otherwise it preempts just the number of lower-class jobs it still lacks.
    /// Holds TY2 (docs/lifecycle.md).
    #[test]
    fn a_preemption_takes_only_what_is_not_being_freed(nodes in proptest::collection::vec(0u8..3, 1..7), replicas in 1usize..4) {
        let mut c = Cluster::new(&gpu_fleet(nodes.len()));
        let n8 = need(&c, 8);
        let (mut free, mut stopping, mut lower) = (0usize, 0usize, 0usize);
        for (i, kind) in nodes.iter().enumerate() {
            let id = 100 + i as u64;
            match kind {
                0 => free += 1,
                1 => {
                    c.start(id, "a", false, 0, 10 * HOUR, vec![(i as NodeIx, n8)]);
                    c.mark_stopping(id);
                    stopping += 1;
                }
                _ => {
                    c.start(id, "a", false, 0, 10 * HOUR, vec![(i as NodeIx, n8)]);
                    c.set_priority(id, 0, true, 0);
                    lower += 1;
                }
            }
        }
        let whole = gang(&c, replicas, 8);
        let m = BTreeMap::new();
        let waiter = Request { priority: 100, ..req(1, "b", &whole, HOUR, &m) };
        let on = SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() };
        let d = run(&c, std::slice::from_ref(&waiter), 4 * HOUR, &on);
        let preempted = d.iter().filter(|d| matches!(d, Decision::Preempt { .. })).count();
        if free >= replicas {
            prop_assert!(placed(&d, 1).is_some(), "{:?}", d);
        } else if free + stopping >= replicas {
            prop_assert_eq!(preempted, 0, "{:?}", d);
        } else if free + stopping + lower >= replicas {
            prop_assert_eq!(preempted, replicas - free - stopping, "{:?}", d);
        } else {
            prop_assert_eq!(preempted, 0, "{:?}", d);
        }
    }
}

/// Priority preemption with three classes: a job of the middle class preempts only work
/// of a lower class, never the top class's, even when stopping the top job would lose
/// less; with only top-class work running, it preempts nothing.
/// Holds TY2 (docs/lifecycle.md).
#[test]
fn a_middle_class_job_never_preempts_a_higher_class() {
    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "a", false, 0, 10 * HOUR, vec![(0 as NodeIx, n8)]);
    c.start(101, "a", false, 0, 10 * HOUR, vec![(1 as NodeIx, n8)]);
    // The top job saved a checkpoint a moment ago: the cheapest to stop, and untouchable.
    c.set_priority(100, 200, true, 4 * HOUR);
    c.set_priority(101, 0, true, 0);
    let whole = gang(&c, 1, 8);
    let m = BTreeMap::new();
    let middle = Request { priority: 100, ..req(1, "b", &whole, HOUR, &m) };
    let on = SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() };
    let victims = |d: &[Decision]| -> Vec<u64> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    };
    assert_eq!(victims(&run(&c, std::slice::from_ref(&middle), 4 * HOUR, &on)), vec![101]);
    c.set_priority(101, 200, true, 0);
    assert!(victims(&run(&c, std::slice::from_ref(&middle), 4 * HOUR, &on)).is_empty(), "only higher classes run");
}

/// Fair share with memory: a project's past use ages with its half-life (half of it gone
/// after one half-life, what it holds meanwhile counted in), and ranks it: of two projects
/// that hold nothing now, the one that used the fleet before waits behind the other, even
/// with the older job.
#[test]
fn fair_share_remembers_past_use() {
    let hour = HOUR;
    let eight = UsageHistory { cpus: 96.0, memory_bytes: 800.0 * (1u64 << 30) as f64, accelerators: [(GPU.to_string(), 8.0)].into() };
    let none = UsageHistory::default();
    let half = none.aged(&eight, hour, hour);
    assert!((half.accelerators[GPU] - 4.0).abs() < 1e-9, "{half:?}");
    let long = none.aged(&eight, 50 * hour, hour);
    assert!((long.accelerators[GPU] - 8.0).abs() < 1e-6, "{long:?}");
    let later = long.aged(&none, hour, hour);
    assert!((later.accelerators[GPU] - 4.0).abs() < 1e-6, "stopped for one half-life: half left");
    assert!(later.aged(&none, 30 * hour, hour).accelerators[GPU] < 1e-3);

    let mut c = Cluster::new(&gpu_fleet(2));
    let n8 = need(&c, 8);
    c.start(100, "c", false, 0, 10 * hour, vec![(0 as NodeIx, n8)]);
    let whole = gang(&c, 1, 8);
    let m = BTreeMap::new();
    let reqs = [req(1, "heavy", &whole, hour, &m), req(2, "light", &whole, hour, &m)];
    let d = run(&c, &reqs, 0, &SchedulerConfig::default());
    assert!(placed(&d, 1).is_some(), "no history: the older job first: {d:?}");
    c.set_history("heavy", &long);
    let d = run(&c, &reqs, 0, &SchedulerConfig::default());
    assert!(placed(&d, 2).is_some() && placed(&d, 1).is_none(), "the project that used the fleet waits: {d:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Priority preemption, whatever the classes: every job preempted for a waiting job is
    /// of a lower class than the waiting job's.
    #[test]
    fn every_priority_victim_is_below_the_waiters_class(
        running in proptest::collection::vec((0i64..4, 0i64..4), 1..6),
        waiter in 0i64..4,
    ) {
        let nodes = running.len();
        let mut c = Cluster::new(&gpu_fleet(nodes));
        let n8 = need(&c, 8);
        for (i, (class, saved)) in running.iter().enumerate() {
            let id = 100 + i as u64;
            c.start(id, "a", false, 0, 10 * HOUR, vec![(i as NodeIx, n8)]);
            c.set_priority(id, class * 100, true, saved * HOUR);
        }
        let whole = gang(&c, 1, 8);
        let m = BTreeMap::new();
        let w = Request { priority: waiter * 100, ..req(1, "b", &whole, HOUR, &m) };
        let on = SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() };
        for d in run(&c, std::slice::from_ref(&w), 4 * HOUR, &on) {
            if let Decision::Preempt { job, .. } = d {
                let class = running[(job - 100) as usize].0 * 100;
                prop_assert!(class < w.priority, "job {} of class {} preempted for a job of class {}", job, class, w.priority);
            }
        }
    }

    /// `plan` works on the cluster's own free capacity and rolls it back: the cluster is
    /// left exactly as it was (bucket order included), so a second round on it decides
    /// the same, whatever the round did (placements, reservations, starving jobs, SPOT
    /// preemption).
    #[test]
    fn plan_leaves_the_cluster_as_it_was(
        running in proptest::collection::vec((0usize..6, prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], any::<bool>(), 1u64..20), 0..24),
        waiting in proptest::collection::vec((1usize..4, prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], 0u64..6), 1..24),
    ) {
        let mut c = Cluster::new(&gpu_fleet(6));
        let now = 10 * HOUR;
        for (k, (node, per, spot, hours)) in running.into_iter().enumerate() {
            let d = need(&c, per);
            let free_enough = c.running().values().filter(|r| r.placed.iter().any(|(n, _)| *n as usize == node)).map(|r| r.placed.iter().map(|(_, d)| d.acc).sum::<i64>()).sum::<i64>() + d.acc <= 8;
            if free_enough {
                c.start(100 + k as u64, if spot { "s" } else { "p" }, spot, now - HOUR, now + hours as Micros * HOUR, vec![(node as NodeIx, d)]);
            }
        }
        let shapes: Vec<Shape> = waiting.iter().map(|(reps, per, _)| gang(&c, *reps, *per)).collect();
        let m = BTreeMap::new();
        let reqs: Vec<Request> = waiting.iter().zip(&shapes).enumerate().map(|(i, ((_, _, age), shape))| {
            let mut r = req(i as u64 + 1, ["a", "b"][i % 2], shape, 2 * HOUR, &m);
            r.submitted = now - *age as Micros * HOUR;
            r
        }).collect();
        let cfg = SchedulerConfig { starvation_secs: Some(2 * 3600), ..SchedulerConfig::default() };
        let before = format!("{c:?}");
        let first = plan(&mut c, &reqs, &Quotas::default(), &QuotaUse::default(), now, &cfg);
        prop_assert_eq!(&format!("{c:?}"), &before);
        let second = plan(&mut c, &reqs, &Quotas::default(), &QuotaUse::default(), now, &cfg);
        prop_assert_eq!(format!("{first:?}"), format!("{second:?}"));
    }
}
