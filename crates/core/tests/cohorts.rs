//! Cohorts (L3, L5): projects that lend each other the quota they do not use, within their
//! borrowing and lending limits, and take it back by preempting borrowed work.

use std::collections::BTreeMap;

use proptest::prelude::*;
use trainyard_core::job::{Demand, Policy, ReplicaDemand, MINUTE};
use trainyard_core::quota::lending;
use trainyard_core::schedule::{
    next_change, quota_usage, schedule_with, Cohort, Decision, Fleet, Hints, Node, Quotas, SchedulerConfig, KIND_LENT, KIND_QUOTA, KIND_RECLAIM,
};
use trainyard_core::{step, Effect, Event, Job, Micros, Outcome, Settings, State};

const CPUS: &str = "custom_model_training_cpus";

fn job(id: u64, project: &str, cpus: u64, t: Micros) -> Job {
    let s = Settings::default();
    let demand = Demand {
        metrics: [(CPUS.to_string(), cpus)].into(),
        replicas: vec![ReplicaDemand { cpus: cpus as u32, memory_bytes: cpus << 30, accelerator: None }],
    };
    Job::new(id, project.into(), "r".into(), &[1], demand, Policy::defaults(&s), false, t)
}

/// Projects a and b in cohort lab with 8 CPUs each; c alone with 8.
fn quotas() -> Quotas {
    let eight = || -> BTreeMap<String, u64> { [(CPUS.to_string(), 8)].into() };
    Quotas {
        default: BTreeMap::new(),
        projects: [("a".to_string(), eight()), ("b".to_string(), eight()), ("c".to_string(), eight())].into(),
        cohorts: vec![Cohort { name: "lab".into(), projects: vec!["a".into(), "b".into()] }],
        ..Quotas::default()
    }
}

fn fleet(overcommit: bool) -> Fleet {
    let n = Node { name: "n1".into(), cpus: 64, memory_bytes: 64 << 30, accelerators: BTreeMap::new(), up: true, schedulable: true };
    Fleet { nodes: vec![n], overcommit }
}

fn reclaim_on() -> SchedulerConfig {
    SchedulerConfig { priority_preemption: true, ..SchedulerConfig::default() }
}

fn round(jobs: &[Job], q: &Quotas, fleet: &Fleet, cfg: &SchedulerConfig, now: Micros) -> Vec<Decision> {
    let live: Vec<&Job> = jobs.iter().filter(|j| !j.is_terminal()).collect();
    schedule_with(&live, fleet, q, now, cfg, &Hints::default())
}

/// Apply the decisions; every launched run starts and every stopped run exits at once.
fn apply(jobs: &mut [Job], d: &[Decision], now: Micros) {
    let s = Settings::default();
    for d in d {
        let (id, e) = match d {
            Decision::Place { job, nodes, .. } => (*job, Event::Place { nodes: nodes.clone(), addresses: vec![], notes: vec![] }),
            Decision::Preempt { job, reason, reclaim: true, .. } => {
                (*job, Event::PreemptForPriority { reason: reason.clone(), requeue: true })
            }
            Decision::Preempt { job, reason, .. } => (*job, Event::Preempt { reason: reason.clone() }),
            Decision::Stockout { job, detail } => (*job, Event::Stockout { detail: detail.clone() }),
            Decision::Impossible { job, reason } => (*job, Event::Impossible { reason: reason.clone() }),
            Decision::Wait { .. } => continue,
        };
        let j = jobs.iter_mut().find(|j| j.id == id).expect("a known job");
        let t = step(j, e, now, &s).expect("step");
        *j = settle(t.job, t.effects, now);
    }
}

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
        let t = step(&j, ev, now, &s).expect("step");
        j = t.job;
        queue.extend(t.effects);
    }
    j
}

fn wait_of(d: &[Decision], id: u64) -> Option<(&'static str, String)> {
    d.iter().find_map(|d| match d {
        Decision::Wait { job, kind, reason, .. } if *job == id => Some((*kind, reason.to_string())),
        _ => None,
    })
}

fn reclaimed(d: &[Decision]) -> Vec<u64> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Preempt { job, reclaim: true, .. } => Some(*job),
            _ => None,
        })
        .collect()
}

fn placed(d: &[Decision], id: u64) -> bool {
    d.iter().any(|d| matches!(d, Decision::Place { job, .. } if *job == id))
}

/// L3 with a cohort: a project runs past its quota on what its cohort's other project
/// does not use; a project in no cohort does not.
/// Holds TY3 (docs/lifecycle.md).
#[test]
fn l3_a_project_borrows_its_cohorts_unused_quota() {
    let q = quotas();
    let f = fleet(false);
    let mut jobs = vec![job(1, "a", 8, 0), job(2, "a", 8, 1), job(3, "c", 8, 2), job(4, "c", 8, 3)];
    let d = round(&jobs, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && placed(&d, 2), "a borrows b's 8 CPUs: {d:?}");
    assert!(placed(&d, 3) && !placed(&d, 4), "c is in no cohort: {d:?}");
    let (kind, reason) = wait_of(&d, 4).expect("c's second job waits");
    assert_eq!(kind, KIND_QUOTA);
    assert!(reason.contains("8 of 8 in use") && !reason.contains("cohort"), "{reason}");
    apply(&mut jobs, &d, 10);
    // A third job of a: the cohort has nothing left to lend.
    jobs.push(job(5, "a", 8, 20));
    let d = round(&jobs, &q, &f, &reclaim_on(), 30);
    let (kind, reason) = wait_of(&d, 5).expect("waits");
    assert_eq!(kind, KIND_QUOTA);
    assert!(reason.contains("cohort lab has 0 unused to lend"), "{reason}");
    assert!(!reason.contains("project b"), "no other project is named: {reason}");
    let report = lending(&q, &quota_usage(jobs.iter()));
    assert_eq!(report["a"].borrowed[CPUS], 8);
    assert_eq!(report["b"].lent[CPUS], 8);
    assert!(!report.contains_key("c"));
}

/// Borrowing and lending limits bound what moves between a cohort's projects.
/// Holds TY3 (docs/lifecycle.md).
#[test]
fn l3_borrowing_and_lending_limits_bound_the_loan() {
    let f = fleet(false);
    let jobs = vec![job(1, "a", 8, 0), job(2, "a", 6, 1)];
    let mut q = quotas();
    q.borrowing_limits.insert("a".into(), [(CPUS.to_string(), 4)].into());
    let d = round(&jobs, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && !placed(&d, 2), "{d:?}");
    assert!(wait_of(&d, 2).expect("waits").1.contains("it may borrow at most 4 from cohort lab (borrowing_limit)"), "{d:?}");
    // Exactly the borrowing limit: admitted.
    let exact = vec![job(1, "a", 8, 0), job(2, "a", 4, 1)];
    let d = round(&exact, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && placed(&d, 2), "borrowing exactly its borrowing_limit is allowed: {d:?}");
    let mut q = quotas();
    q.lending_limits.insert("b".into(), [(CPUS.to_string(), 5)].into());
    let d = round(&jobs, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && !placed(&d, 2), "{d:?}");
    assert!(wait_of(&d, 2).expect("waits").1.contains("cohort lab has 5 unused to lend"), "{d:?}");
    // Exactly the lending limit: admitted.
    let exact = vec![job(1, "a", 8, 0), job(2, "a", 5, 1)];
    let d = round(&exact, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && placed(&d, 2), "borrowing exactly what the lender may lend is allowed: {d:?}");
    // L4: a job above its quota plus all its cohort could lend can never run.
    assert_eq!(q.exceeded_by("a", &[(CPUS.to_string(), 13)].into()), Vec::<String>::new());
    assert_eq!(q.exceeded_by("a", &[(CPUS.to_string(), 14)].into()), vec![CPUS.to_string()]);
    assert_eq!(quotas().exceeded_by("a", &[(CPUS.to_string(), 16)].into()), Vec::<String>::new());
    assert_eq!(q.exceeded_by("c", &[(CPUS.to_string(), 9)].into()), vec![CPUS.to_string()]);
}

/// L3, L5: the lender wants its quota back. With `priority_preemption`, the borrowing job
/// is preempted at once (counted as a preemption, not by L11 or L12), goes back QUEUED
/// giving its quota back, and the lender's job is admitted in the next round; without it,
/// the lender waits for the borrowed work to end.
#[test]
fn l3_l5_a_lender_reclaims_its_quota_by_preempting_borrowed_work() {
    for overcommit in [false, true] {
        let q = quotas();
        let f = fleet(overcommit);
        let mut jobs = vec![job(1, "a", 8, 0), job(2, "a", 8, 1)];
        let d = round(&jobs, &q, &f, &reclaim_on(), 10);
        apply(&mut jobs, &d, 10);
        assert!(jobs.iter().all(|j| j.state() == State::Running), "{jobs:?}");
        jobs.push(job(3, "b", 8, 20 * MINUTE));
        let now = 30 * MINUTE;

        let off = round(&jobs, &q, &f, &SchedulerConfig::default(), now);
        assert!(reclaimed(&off).is_empty(), "{off:?}");
        assert_eq!(wait_of(&off, 3).expect("waits").0, KIND_LENT);

        let d = round(&jobs, &q, &f, &reclaim_on(), now);
        assert_eq!(reclaimed(&d), vec![2], "one job gives 8 back, the youngest: {d:?}");
        let (kind, reason) = wait_of(&d, 3).expect("b waits while it stops");
        assert_eq!(kind, KIND_RECLAIM);
        assert!(reason.contains("cohort lab: 1 job borrowing it is being preempted"), "{reason}");
        apply(&mut jobs, &d, now);
        let two = &jobs[1];
        assert_eq!(two.state(), State::Queued, "back in the queue without its quota");
        assert!(!two.holds_quota());
        assert_eq!((two.retries.preemptions, two.retries.worker_restarts), (1, 0));
        assert!(two.waiting_reason.as_deref().is_some_and(|r| r.contains("back in the queue")), "{:?}", two.waiting_reason);

        let d = round(&jobs, &q, &f, &reclaim_on(), now + 1);
        assert!(placed(&d, 3), "the lender runs: {d:?}");
        assert!(!placed(&d, 2) && reclaimed(&d).is_empty(), "{d:?}");
        apply(&mut jobs, &d, now + 1);
        // The lender's job ends: the reclaimed job borrows again.
        jobs[2] = settle_cancel(&jobs[2], now + 2);
        let d = round(&jobs, &q, &f, &reclaim_on(), now + 3);
        assert!(placed(&d, 2), "{d:?}");
    }
}

fn settle_cancel(j: &Job, now: Micros) -> Job {
    let t = step(j, Event::Cancel, now, &Settings::default()).expect("step");
    settle(t.job, t.effects, now)
}

/// A job preempted `max_preemptions_per_job` times is never chosen again, so it may not
/// borrow either (it could not give the quota back).
#[test]
fn a_job_preempted_too_often_does_not_borrow() {
    let q = quotas();
    let f = fleet(false);
    let mut jobs = vec![job(1, "a", 8, 0), job(2, "a", 8, 1)];
    jobs[1].retries.preemptions = 3;
    let d = round(&jobs, &q, &f, &reclaim_on(), 10);
    assert!(placed(&d, 1) && !placed(&d, 2), "{d:?}");
    assert!(wait_of(&d, 2).expect("waits").1.contains("may not borrow"), "{d:?}");
    let d = round(&jobs, &q, &f, &SchedulerConfig::default(), 10);
    assert!(placed(&d, 2), "without reclaim nothing is preempted, so it may: {d:?}");
}

/// L3, L5: a job past `max_preemptions_per_job` that borrows (its own quota could never
/// hold it) gives the lender its quota back within a bound: at its next checkpoint, or
/// once it has run `reclaim_after_secs`; before that, the lender waits.
#[test]
fn l3_l5_a_lenders_quota_comes_back_within_a_bound_past_max_preemptions() {
    let q = quotas();
    let f = fleet(false);
    let cfg = SchedulerConfig { reclaim_after_secs: 3600, ..reclaim_on() };
    let start = |jobs: &mut Vec<Job>| {
        let d = round(jobs, &q, &f, &cfg, 10);
        assert!(placed(&d, 2), "12 CPUs: more than a's quota, so it borrows: {d:?}");
        apply(jobs, &d, 10);
        jobs.push(job(3, "b", 8, 20));
    };
    let mut jobs = vec![job(2, "a", 12, 1)];
    jobs[0].retries.preemptions = 3;
    start(&mut jobs);
    let d = round(&jobs, &q, &f, &cfg, 30 * MINUTE);
    assert!(reclaimed(&d).is_empty(), "within the bound, the lender waits: {d:?}");
    let live: Vec<&Job> = jobs.iter().collect();
    let admitted = jobs[0].admitted_at().expect("admitted");
    assert_eq!(next_change(&live, &cfg, 30 * MINUTE), Some(admitted + 60 * MINUTE), "a round is due when the bound passes");
    assert_eq!(next_change(&live[..1], &cfg, 30 * MINUTE), None, "no round is due while nobody waits");
    let d = round(&jobs, &q, &f, &cfg, 60 * MINUTE + 10);
    assert_eq!(reclaimed(&d), vec![2], "past reclaim_after_secs, the quota comes back: {d:?}");
    // A checkpoint written in its current run: given back at once.
    let mut jobs = vec![job(2, "a", 12, 1)];
    jobs[0].retries.preemptions = 3;
    start(&mut jobs);
    jobs[0].checkpoint.last_write = Some(5 * MINUTE);
    let d = round(&jobs, &q, &f, &cfg, 6 * MINUTE);
    assert_eq!(reclaimed(&d), vec![2], "at its checkpoint: {d:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// L3, L5 with cohorts: after every round (preempted jobs stopped), no project holds
    /// more than its quota plus its borrowing limit, what a cohort borrows is covered by
    /// what its lenders leave unused, and a project not in a cohort stays within its quota.
    #[test]
    fn l3_cohorts_never_lend_what_they_do_not_have(
        arrivals in proptest::collection::vec((0usize..3, prop_oneof![Just(2u64), Just(4), Just(8)]), 1..30),
        endings in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
        overcommit in any::<bool>(),
        limit in 0u64..8,
    ) {
        let mut q = quotas();
        q.borrowing_limits.insert("b".into(), [(CPUS.to_string(), limit)].into());
        q.lending_limits.insert("a".into(), [(CPUS.to_string(), 6)].into());
        let f = fleet(overcommit);
        let projects = ["a", "b", "c"];
        let mut jobs: Vec<Job> = Vec::new();
        let mut ends = endings.into_iter();
        for (i, (p, cpus)) in arrivals.into_iter().enumerate() {
            let now = i as Micros * 10 * MINUTE;
            jobs.push(job(i as u64 + 1, projects[p], cpus, now));
            for k in 0..2 {
                let d = round(&jobs, &q, &f, &reclaim_on(), now + k);
                apply(&mut jobs, &d, now + k);
                let used = quota_usage(jobs.iter());
                let get = |p: &str| used.get(&(p.to_string(), CPUS.to_string())).copied().unwrap_or(0);
                prop_assert!(get("c") <= 8);
                prop_assert!(get("b") <= 8 + limit, "b {} limit {}", get("b"), limit);
                let borrowed = get("a").saturating_sub(8) + get("b").saturating_sub(8);
                let lendable = 6u64.min(8u64.saturating_sub(get("a"))) + 8u64.saturating_sub(get("b"));
                prop_assert!(borrowed <= lendable, "borrowed {} lendable {} {:?}", borrowed, lendable, used);
            }
            if let Some(ix) = ends.next() {
                let live: Vec<usize> = (0..jobs.len()).filter(|&k| jobs[k].state() == State::Running).collect();
                if !live.is_empty() {
                    let k = live[ix.index(live.len())];
                    jobs[k] = settle_cancel(&jobs[k], now + 5);
                }
            }
        }
    }
}
