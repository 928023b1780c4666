//! TY11: notice before a stop. With `[lifecycle] preemption_notice_secs`, a preemption, a
//! reclaim, a drain, an elastic replica's leave or a timeout first tells the program (the
//! warning signal and the notice file), and SIGTERM follows only at the notice's end, unless
//! the program has exited by then.

use trainyard_core::job::{Demand, Policy, ReplicaDemand, ReplicaState, SECOND};
use trainyard_core::{step, Effect, Event, Job, Micros, Outcome, Phase, RunId, Settings, State};

fn settings() -> Settings {
    Settings { preemption_notice_secs: 60, ..Settings::default() }
}

fn running(spot: bool, s: &Settings) -> Job {
    let mut p = Policy::defaults(s);
    p.spot = spot;
    p.timeout = 3600 * SECOND;
    let demand = Demand { metrics: Default::default(), replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 1 << 30, accelerator: None }; 2] };
    let mut j = Job::new(1, "p".into(), "r".into(), &[1, 1], demand, p, false, 0);
    let place = Event::Place { nodes: vec!["a".into(), "b".into()], addresses: vec!["x:1".into(), "y:2".into()], notes: vec![] };
    j = step(&j, place, 1, s).unwrap().job;
    for r in ["workerpool0-0", "workerpool1-0"] {
        j = step(&j, Event::Started { run: run(&j, r) }, 2, s).unwrap().job;
    }
    assert_eq!(j.state(), State::Running);
    j
}

fn run(j: &Job, replica: &str) -> RunId {
    RunId { job: j.id, attempt: j.attempt, replica: replica.into(), restart: j.replica(replica).unwrap().restart }
}

fn notices(effects: &[Effect]) -> Vec<(String, i32, String, Micros)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Notice { run, signal, reason, deadline } => Some((run.replica.clone(), *signal, reason.clone(), *deadline)),
            _ => None,
        })
        .collect()
}

fn logged(effects: &[Effect], needle: &str) -> bool {
    effects.iter().any(|e| matches!(e, Effect::Log(l) if l.text.contains(needle)))
}

fn stops(effects: &[Effect]) -> usize {
    effects.iter().filter(|e| matches!(e, Effect::Stop { .. })).count()
}

/// TY11, TY1: a SPOT preemption gives notice (SIGUSR1 and the reason, the deadline 60 s
/// on), no SIGTERM; a program that ignores it gets SIGTERM at the deadline; one that exits
/// in time ends the notice early.
#[test]
fn ty11_ty1_a_preemption_gives_notice_then_sigterm() {
    let s = settings();
    let j = running(true, &s);
    let t = step(&j, Event::Preempt { reason: "capacity needed".into() }, 100 * SECOND, &s).unwrap();
    let n = notices(&t.effects);
    assert_eq!(n.len(), 2, "{:?}", t.effects);
    assert!(n.iter().all(|(_, sig, reason, deadline)| *sig == 10 && reason == "SPOT preemption: capacity needed" && *deadline == 160 * SECOND));
    assert_eq!(stops(&t.effects), 0, "no SIGTERM during the notice");
    let j = t.job;
    assert_eq!(j.next_deadline(&s, 100 * SECOND), Some(160 * SECOND));
    // Nothing before the deadline.
    let t = step(&j, Event::Tick, 159 * SECOND, &s).unwrap();
    assert_eq!(stops(&t.effects), 0);
    // The primary writes its checkpoint and exits at once; the worker ignores the notice.
    let j = step(&j, Event::Exited { run: run(&j, "workerpool0-0"), outcome: Outcome::Exited { code: 0 }, stderr_tail: vec![] }, 120 * SECOND, &s)
        .unwrap()
        .job;
    let t = step(&j, Event::Tick, 160 * SECOND, &s).unwrap();
    assert_eq!(stops(&t.effects), 1, "SIGTERM to the one still running: {:?}", t.effects);
    let j = step(&t.job, Event::Exited { run: run(&t.job, "workerpool1-0"), outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] }, 161 * SECOND, &s)
        .unwrap()
        .job;
    assert!(matches!(j.phase, Phase::Pending { .. }), "{:?}", j.phase);
    assert_eq!(j.retries.total(), 0);
}

/// TY11, L9, L18: a drain gives notice and moves the replica once it exits; a cancel during
/// a notice sends SIGTERM at once.
#[test]
fn ty11_l9_l18_a_drain_gives_notice_and_a_cancel_cuts_it_short() {
    let s = settings();
    let j = running(false, &s);
    let t = step(&j, Event::NodeMaintenance { replica: "workerpool1-0".into(), replacement: Some("c".into()) }, 10 * SECOND, &s).unwrap();
    assert_eq!(notices(&t.effects).len(), 1);
    assert!(notices(&t.effects)[0].2.starts_with("drain: "));
    // The log says what happens: notice first, not SIGTERM.
    assert!(logged(&t.effects, "its node went into maintenance; notice (60s, SIGUSR1), then SIGTERM, then restart on node c"), "{:?}", t.effects);
    assert!(matches!(t.job.replica("workerpool1-0").unwrap().state, ReplicaState::Stopping { sigterm_at: Some(_), .. }));
    let t = step(&t.job, Event::Cancel, 20 * SECOND, &s).unwrap();
    assert_eq!(stops(&t.effects), 2, "SIGTERM now to both: {:?}", t.effects);
    assert!(notices(&t.effects).is_empty(), "a cancel gives no notice");
    // Without the setting, a drain sends SIGTERM at once (L9 as before).
    let plain = Settings::default();
    let j = running(false, &plain);
    let t = step(&j, Event::NodeMaintenance { replica: "workerpool1-0".into(), replacement: Some("c".into()) }, 10 * SECOND, &plain).unwrap();
    assert_eq!((stops(&t.effects), notices(&t.effects).len()), (1, 0));
    assert!(logged(&t.effects, "its node went into maintenance; SIGTERM, then restart on node c"), "{:?}", t.effects);
}

/// TY11, L19: the timeout gives notice too; the job still fails with DEADLINE_EXCEEDED.
#[test]
fn ty11_l19_a_timeout_gives_notice() {
    let s = settings();
    let j = running(false, &s);
    let t = step(&j, Event::Tick, 3601 * SECOND, &s).unwrap();
    assert_eq!(notices(&t.effects).len(), 2);
    assert!(notices(&t.effects)[0].2.starts_with("timeout: "));
    let mut j = t.job;
    j = step(&j, Event::Tick, 3661 * SECOND, &s).unwrap().job;
    for r in ["workerpool0-0", "workerpool1-0"] {
        j = step(&j, Event::Exited { run: run(&j, r), outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] }, 3662 * SECOND, &s).unwrap().job;
    }
    assert_eq!(j.state(), State::Failed);
    assert_eq!(j.error().unwrap().code, 4);
}
