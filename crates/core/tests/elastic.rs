//! TY10: elastic pools. A job starts once its minimum fits, grows into room that nothing
//! waiting can use, and an elastic replica that loses its node leaves the job instead of
//! restarting (no L11 or L12 budget spent).

use std::collections::BTreeMap;

use trainyard_core::job::{Demand, ElasticPool, Policy, ReplicaDemand, ReplicaState, SECOND};
use trainyard_core::schedule::{growth, schedule, Decision, Fleet, Node, Quotas};
use trainyard_core::{step, Effect, Event, Job, Micros, Outcome, Phase, RunId, Settings, State};

fn node(name: &str, cpus: u32) -> Node {
    Node { name: name.into(), cpus, memory_bytes: (cpus as u64) << 30, accelerators: BTreeMap::new(), up: true, schedulable: true }
}

fn fleet(n: usize) -> Fleet {
    Fleet { nodes: (1..=n).map(|i| node(&format!("n{i}"), 4)).collect(), overcommit: false }
}

/// A job of one primary and `workers` workers of 4 CPUs each; `min`: pool 1 is elastic.
fn job(id: u64, workers: u32, min: Option<u32>, created: Micros) -> Job {
    let s = Settings::default();
    let mut p = Policy::defaults(&s);
    p.elastic = min.map(|min| ElasticPool { pool: 1, min }).into_iter().collect();
    let demand = Demand {
        metrics: BTreeMap::new(),
        replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 4 << 30, accelerator: None }; 1 + workers as usize],
    };
    Job::new(id, "p".into(), "r".into(), &[1, workers], demand, p, false, created)
}

struct H {
    job: Job,
    now: Micros,
    effects: Vec<Effect>,
    s: Settings,
}

impl H {
    fn new(job: Job) -> H {
        H { job, now: 10 * SECOND, effects: Vec::new(), s: Settings::default() }
    }
    fn ev(&mut self, e: Event) -> bool {
        let t = step(&self.job, e, self.now, &self.s).expect("accepted");
        self.job = t.job;
        self.effects = t.effects;
        t.changed
    }
    fn place(&mut self, nodes: &[&str]) -> bool {
        let addresses = (0..nodes.len()).map(|i| format!("127.0.0.{}:{}", i + 2, 20000 + i)).collect();
        self.ev(Event::Place { nodes: nodes.iter().map(|n| n.to_string()).collect(), addresses, notes: vec![] })
    }
    fn run(&self, replica: &str) -> RunId {
        let r = self.job.replica(replica).expect("replica");
        RunId { job: self.job.id, attempt: self.job.attempt, replica: replica.into(), restart: r.restart }
    }
    fn start_live(&mut self) {
        let names: Vec<String> =
            self.job.replicas.iter().filter(|r| r.state == ReplicaState::Launching).map(|r| r.name.clone()).collect();
        for n in names {
            let run = self.run(&n);
            self.ev(Event::Started { run });
        }
    }
    fn stopped(&mut self, replica: &str) {
        let run = self.run(replica);
        self.ev(Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] });
    }
    fn away(&self) -> Vec<&str> {
        self.job.replicas.iter().filter(|r| matches!(r.state, ReplicaState::Away { .. })).map(|r| r.name.as_str()).collect()
    }
    fn logged(&self, needle: &str) -> bool {
        self.effects.iter().any(|e| matches!(e, Effect::Log(l) if l.text.contains(needle)))
    }
}

/// TY10, L6, L7: the job starts with its minimum placed (the rest away), is RUNNING once
/// the replicas it has are up, and a replica the scheduler finds room for joins it while
/// it runs. A blank for a replica of the minimum is refused.
#[test]
fn ty10_l6_l7_an_elastic_job_starts_with_its_minimum_and_grows() {
    let mut h = H::new(job(1, 3, Some(1), 0));
    assert!(!h.place(&["n1", "", "", ""]), "the minimum (primary and one worker) must be placed");
    assert!(h.place(&["n1", "n2", "", ""]));
    assert_eq!(h.away(), ["workerpool1-1", "workerpool1-2"]);
    assert!(h.logged("TY10: Elastic pool workerpool1: starting with 1 of 3 replicas (at least 1)"));
    h.start_live();
    assert_eq!(h.job.state(), State::Running);
    assert!(h.ev(Event::Grow { replica: "workerpool1-1".into(), node: "n3".into() }));
    assert!(matches!(&h.effects[..], [Effect::Launch { run, node }, ..] if run.replica == "workerpool1-1" && run.restart == 0 && node == "n3"));
    assert!(h.logged("joins the elastic job on node n3: workerpool1 has 2 of 3 replicas"));
    h.start_live();
    assert_eq!(h.job.state(), State::Running);
    // A grow for a replica that is not away changes nothing.
    assert!(!h.ev(Event::Grow { replica: "workerpool1-1".into(), node: "n4".into() }));
    assert!(!h.ev(Event::Grow { replica: "workerpool0-0".into(), node: "n4".into() }));
}

/// TY10, L9, L11, L12: a drained node takes an elastic replica away (SIGTERM, the grace
/// period, then it leaves), a lost node at once; the job keeps RUNNING, no restart or
/// retry is counted. At its pool's minimum the usual rule applies again (L9: moved to a
/// replacement). Growing back takes the replica's next run number.
#[test]
fn ty10_l9_l11_an_elastic_replica_leaves_without_spending_a_restart() {
    let mut h = H::new(job(1, 3, Some(1), 0));
    h.place(&["n1", "n2", "n3", "n4"]);
    h.start_live();
    h.ev(Event::NodeMaintenance { replica: "workerpool1-2".into(), replacement: Some("n5".into()) });
    assert!(matches!(&h.effects[..], [.., Effect::Stop { grace, .. }] if *grace == 30 * SECOND));
    assert!(h.logged("then it leaves the elastic job"));
    h.stopped("workerpool1-2");
    assert_eq!(h.away(), ["workerpool1-2"]);
    assert!(h.logged("left the job (its node went into maintenance); workerpool1 goes on with 2 of 3"));
    assert!(h.effects.iter().all(|e| !matches!(e, Effect::Launch { .. })), "not restarted: {:?}", h.effects);
    h.ev(Event::NodeLost { replica: "workerpool1-1".into(), replacement: Some("n5".into()) });
    assert_eq!(h.away(), ["workerpool1-1", "workerpool1-2"]);
    assert!(matches!(&h.effects[..], [Effect::Stop { grace: 0, .. }, ..]));
    assert_eq!(h.job.state(), State::Running);
    assert_eq!(h.job.retries.total(), 0);
    assert!(h.job.replicas.iter().all(|r| r.failures == 0));
    // At the minimum: moved as any replica is (L9).
    h.ev(Event::NodeMaintenance { replica: "workerpool1-0".into(), replacement: Some("n5".into()) });
    assert!(h.logged("L9: Replica workerpool1-0: its node went into maintenance; SIGTERM, then restart on node n5"));
    h.stopped("workerpool1-0");
    assert!(matches!(&h.effects[..], [.., Effect::Launch { node, .. }] if node == "n5"));
    h.start_live();
    // Back: the replica that ran takes its next run number.
    h.ev(Event::Grow { replica: "workerpool1-2".into(), node: "n3".into() });
    assert_eq!(h.job.replica("workerpool1-2").unwrap().restart, 1);
    assert_eq!(h.job.replica("workerpool1-2").unwrap().address.as_deref(), Some("127.0.0.5:20003"), "L8: its address stays");
}

/// TY10, L12a: `restartJobOnWorkerRestart` keeps its meaning for the replicas it applies
/// to: an elastic replica that leaves is no restart, so the job is not retried.
#[test]
fn ty10_l12a_an_elastic_leave_is_not_a_worker_restart() {
    let mut j = job(1, 2, Some(1), 0);
    j.policy.restart_job_on_worker_restart = true;
    let mut h = H::new(j);
    h.place(&["n1", "n2", "n3"]);
    h.start_live();
    h.ev(Event::NodeLost { replica: "workerpool1-1".into(), replacement: None });
    assert_eq!(h.job.state(), State::Running);
    assert_eq!(h.job.attempt, 0);
    // The primary is never elastic: its loss follows L12a.
    h.ev(Event::NodeLost { replica: "workerpool0-0".into(), replacement: Some("n4".into()) });
    assert!(matches!(h.job.phase, Phase::Stopping { .. }));
}

/// TY10: a rigid job on a full fleet waits; an elastic one of the same size starts with
/// its minimum on what is free.
#[test]
fn ty10_the_scheduler_places_an_elastic_job_at_its_minimum() {
    let f = fleet(4);
    let busy = {
        let mut h = H::new(job(9, 1, None, 0));
        h.place(&["n1", "n2"]);
        h.job
    };
    let rigid = job(1, 3, None, 1);
    let out = schedule(&[&busy, &rigid], &f, &Quotas::default(), 100);
    assert!(matches!(&out[..], [Decision::Wait { .. }]), "{out:?}");
    let elastic = job(2, 3, Some(1), 1);
    let mut out = schedule(&[&busy, &elastic], &f, &Quotas::default(), 100);
    let Decision::Place { nodes, .. } = &out[0] else { panic!("{out:?}") };
    assert_eq!(nodes.iter().filter(|n| n.is_empty()).count(), 2, "{nodes:?}");
    assert!(!nodes[0].is_empty() && !nodes[1].is_empty());
    // No more room: growth adds nothing.
    assert!(growth(&[&busy, &elastic], &f, &mut out, 100).is_empty());
    assert_eq!(out.iter().filter(|d| matches!(d, Decision::Place { nodes, .. } if nodes.iter().any(String::is_empty))).count(), 1);
}

/// TY10: growth fills the round's blanks when there is room, gives a running job's away
/// replicas the room that frees, and never takes room a waiting job needs.
#[test]
fn ty10_growth_uses_room_the_queue_leaves() {
    let f = fleet(4);
    // Placed with room to spare: the blanks are filled in the same round.
    let elastic = job(2, 3, Some(1), 1);
    let mut out = schedule(&[&elastic], &f, &Quotas::default(), 100);
    assert!(growth(&[&elastic], &f, &mut out, 100).is_empty());
    let Decision::Place { nodes, .. } = &out[0] else { panic!("{out:?}") };
    assert!(nodes.iter().all(|n| !n.is_empty()), "{nodes:?}");
    // Running with two away: room on n3 and n4 goes to them.
    let mut h = H::new(job(2, 3, Some(1), 1));
    h.place(&["n1", "n2", "", ""]);
    h.start_live();
    let running = h.job.clone();
    let grows = growth(&[&running], &f, &mut [], 100);
    assert_eq!(grows.len(), 2, "{grows:?}");
    assert!(grows.iter().all(|(j, _, n)| *j == 2 && (n == "n3" || n == "n4")));
    // A rigid job that waits for two nodes: the room is its own, no growth.
    let waiting = job(3, 1, None, 5);
    let mut out = schedule(&[&running, &waiting], &f, &Quotas::default(), 100);
    let placed_waiting = out.iter().any(|d| matches!(d, Decision::Place { job: 3, .. }));
    let grows = growth(&[&running, &waiting], &f, &mut out, 100);
    assert!(placed_waiting && grows.is_empty(), "{out:?} {grows:?}");
    let bigger = job(4, 2, None, 5);
    let mut out = schedule(&[&running, &bigger], &f, &Quotas::default(), 100);
    assert!(matches!(&out[..], [Decision::Wait { job: 4, .. }]), "{out:?}");
    assert!(growth(&[&running, &bigger], &f, &mut out, 100).is_empty(), "a waiting job's room is not taken");
}

/// TY10 goodput: a job's time adds up to its life, split by what it was doing: queued,
/// starting, productive, idle while a replica (re)starts, and work since the last
/// checkpoint lost when a replica leaves; accelerator time weighted by what it holds.
#[test]
fn ty10_goodput_adds_up_and_counts_lost_work() {
    let mut j = job(1, 2, Some(1), 0);
    for d in &mut j.demand.replicas {
        d.accelerator = Some(("NVIDIA_TESLA_T4".into(), 2));
    }
    let mut h = H::new(j);
    h.now = 10 * SECOND; // queued 10 s
    h.place(&["n1", "n2", "n3"]);
    h.now += 5 * SECOND; // starting 5 s
    h.start_live();
    h.now += 20 * SECOND; // productive 20 s, checkpointed at its end
    h.ev(Event::CheckpointSeen { at: h.now });
    h.now += 8 * SECOND; // 8 s more, not saved
    h.ev(Event::NodeLost { replica: "workerpool1-1".into(), replacement: None });
    let g = h.job.goodput;
    assert_eq!(g.wall.queued, 10 * SECOND);
    assert_eq!(g.wall.starting, 5 * SECOND);
    assert_eq!(g.wall.productive, 20 * SECOND, "{g:?}");
    assert_eq!(g.wall.lost, 8 * SECOND, "the work since the checkpoint");
    assert_eq!(g.accelerator.productive, 20 * SECOND * 6, "three replicas of two GPUs");
    h.now += 4 * SECOND; // two replicas of two GPUs, productive
    h.ev(Event::Grow { replica: "workerpool1-1".into(), node: "n4".into() });
    h.now += 3 * SECOND; // idle while it starts
    h.start_live();
    let later = trainyard_core::goodput::Goodput::until(&h.job, h.now + 10 * SECOND);
    assert_eq!(later.wall.idle, 3 * SECOND);
    assert_eq!(later.wall.lost, 12 * SECOND, "joining restarts the workers from their checkpoint: {later:?}");
    assert_eq!(later.wall.total(), h.now + 10 * SECOND, "every second of its life, once");
    assert_eq!(later.accelerator.productive, 20 * SECOND * 6 + 10 * SECOND * 6);
}

/// TY10: work that waits takes an elastic job's extra replicas before any other victim,
/// one replica at a time and never below the minimum; the replica leaves (SIGTERM, grace)
/// without a restart or a retry counted.
#[test]
fn ty10_waiting_work_takes_an_elastic_jobs_extra_replicas_first() {
    use trainyard_core::schedule::{extra_of, schedule_with, Hints, SchedulerConfig};
    let f = fleet(4);
    let mut h = H::new(job(1, 3, Some(1), 0));
    h.place(&["n1", "n2", "n3", "n4"]);
    h.start_live();
    let elastic = h.job.clone();
    // SPOT preemption off, no priorities: only the extras may give way.
    let cfg = SchedulerConfig { preemption: false, ..SchedulerConfig::default() };
    let one = job(2, 0, None, 5);
    let out = schedule_with(&[&elastic, &one], &f, &Quotas::default(), 100, &cfg, &Hints::default());
    let victims: Vec<(u64, usize)> = out
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt { job, by_priority: None, reclaim: false, .. } => extra_of(*job),
            _ => None,
        })
        .collect();
    assert_eq!(victims.len(), 1, "one extra is enough: {out:?}");
    assert_eq!(victims[0].0, 1);
    assert!(matches!(out.iter().find(|d| matches!(d, Decision::Wait { job: 2, .. })), Some(Decision::Wait { reason, .. }) if reason.contains("elastic job's extra replica")), "{out:?}");
    // Three nodes wanted: two extras give way, the minimum stays; still not enough room.
    let three = job(3, 2, None, 5);
    let out = schedule_with(&[&elastic, &three], &f, &Quotas::default(), 100, &cfg, &Hints::default());
    assert!(!out.iter().any(|d| matches!(d, Decision::Preempt { .. })), "the minimum is never taken: {out:?}");
    // The replica leaves.
    let name = elastic.replicas[victims[0].1].name.clone();
    h.ev(Event::Leave { replica: name.clone(), cause: "preempted: its capacity is needed".into() });
    assert!(matches!(&h.effects[..], [.., Effect::Stop { .. }]));
    h.stopped(&name);
    assert_eq!(h.away(), [name.as_str()]);
    assert_eq!((h.job.state(), h.job.retries.total(), h.job.retries.preemptions), (State::Running, 0, 0));
    // At the minimum a leave changes nothing.
    h.ev(Event::Leave { replica: "workerpool1-1".into(), cause: "x".into() });
    h.ev(Event::Leave { replica: "workerpool1-0".into(), cause: "x".into() });
    h.stopped("workerpool1-1");
    assert_eq!(h.job.present(1), 1);
    assert!(!h.ev(Event::Leave { replica: "workerpool1-0".into(), cause: "x".into() }));
}
