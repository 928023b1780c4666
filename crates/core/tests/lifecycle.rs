//! The lifecycle rules L1-L23, one or more tests per rule, with virtual time.

use trainyard_core::job::{code, Demand, Policy, ReplicaDemand, ReplicaState, Wait, HOUR, SECOND};
use trainyard_core::step::{exit_message, Rejected};
use trainyard_core::{step, Effect, Event, Job, Micros, Outcome, Phase, RunId, Settings, State};

const T0: Micros = 1_700_000_000 * SECOND;

fn settings() -> Settings {
    Settings::default()
}

fn job_with(pools: &[u32], policy: impl FnOnce(&mut Policy)) -> Job {
    let s = settings();
    let mut p = Policy::defaults(&s);
    policy(&mut p);
    let n: u32 = pools.iter().sum();
    let demand = Demand {
        metrics: [("custom_model_training_cpus".to_string(), 4 * n as u64)].into(),
        replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 1 << 30, accelerator: None }; n as usize],
    };
    Job::new(7, "proj".into(), "us-central1".into(), pools, demand, p, true, T0)
}

fn job(pools: &[u32]) -> Job {
    job_with(pools, |_| {})
}

struct H {
    job: Job,
    now: Micros,
    effects: Vec<Effect>,
    s: Settings,
}

impl H {
    fn new(job: Job) -> H {
        H { job, now: T0, effects: Vec::new(), s: settings() }
    }
    fn ev(&mut self, e: Event) -> &mut Self {
        let t = step(&self.job, e, self.now, &self.s).expect("event accepted");
        self.job = t.job;
        self.effects = t.effects;
        self
    }
    fn at(&mut self, dt: Micros) -> &mut Self {
        self.now += dt;
        self
    }
    fn place(&mut self) -> &mut Self {
        let n = self.job.replicas.len();
        let addrs = (0..n).map(|i| format!("127.0.0.{}:{}", i + 2, 20000 + i)).collect();
        self.ev(Event::Place { nodes: vec!["local".into(); n], addresses: addrs, notes: vec![] })
    }
    fn run(&self, replica: &str) -> RunId {
        let r = self.job.replica(replica).expect("replica");
        RunId { job: self.job.id, attempt: self.job.attempt, replica: replica.into(), restart: r.restart }
    }
    fn start_all(&mut self) -> &mut Self {
        let names: Vec<String> = self.job.replicas.iter().map(|r| r.name.clone()).collect();
        for n in names {
            let run = self.run(&n);
            self.ev(Event::Started { run });
        }
        self
    }
    fn exit(&mut self, replica: &str, outcome: Outcome) -> &mut Self {
        let run = self.run(replica);
        self.ev(Event::Exited { run, outcome, stderr_tail: vec!["Traceback: boom".into()] })
    }
    /// Report every run the last transition stopped as exited by SIGTERM.
    fn stopped_exit(&mut self) -> &mut Self {
        let stops: Vec<RunId> = self
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Stop { run, .. } => Some(run.clone()),
                _ => None,
            })
            .collect();
        for run in stops {
            self.ev(Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] });
        }
        self
    }
    fn launches(&self) -> Vec<&RunId> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Launch { run, .. } => Some(run),
                _ => None,
            })
            .collect()
    }
    fn stops(&self) -> usize {
        self.effects.iter().filter(|e| matches!(e, Effect::Stop { .. })).count()
    }
    fn logs(&self) -> Vec<&str> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Log(l) => Some(l.text.as_str()),
                _ => None,
            })
            .collect()
    }
    fn state(&self) -> State {
        self.job.state()
    }
    fn error(&self) -> (i32, String) {
        let e = self.job.error().expect("error set");
        (e.code, e.message.clone())
    }
}

/// L1: a terminal job never changes again, whatever arrives.
#[test]
fn l1_terminal_is_final() {
    let mut h = H::new(job(&[1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 0 });
    assert_eq!(h.state(), State::Succeeded);
    let before = h.job.clone();
    for e in [
        Event::Tick,
        Event::Stockout { detail: "x".into() },
        Event::Place { nodes: vec!["n".into()], addresses: vec![], notes: vec![] },
        Event::Started { run: h.run("workerpool0-0") },
    ] {
        let t = step(&before, e, h.now + HOUR, &h.s).unwrap();
        assert!(!t.changed);
        assert_eq!(t.job, before);
        assert!(t.effects.is_empty());
    }
}

/// L1: the wire names of the states.
#[test]
fn l1_state_wire_names() {
    let names: Vec<&str> = State::ALL.iter().map(|s| s.wire_name()).collect();
    assert_eq!(
        names,
        [
            "JOB_STATE_QUEUED",
            "JOB_STATE_PENDING",
            "JOB_STATE_RUNNING",
            "JOB_STATE_SUCCEEDED",
            "JOB_STATE_FAILED",
            "JOB_STATE_CANCELLING",
            "JOB_STATE_CANCELLED"
        ]
    );
    assert!(State::Cancelled.is_terminal() && !State::Cancelling.is_terminal());
}

/// L2: createTime, startTime, endTime, updateTime; error only on FAILED/CANCELLED, in the
/// same transition that makes the job terminal.
#[test]
fn l2_times_and_error() {
    let mut h = H::new(job(&[1]));
    assert_eq!(h.job.create_time, T0);
    assert_eq!(h.job.start_time, None);
    h.at(SECOND).place();
    assert_eq!(h.job.update_time, T0 + SECOND);
    assert_eq!(h.job.start_time, None);
    h.at(SECOND).start_all();
    assert_eq!(h.job.start_time, Some(T0 + 2 * SECOND));
    assert!(h.job.error().is_none() && h.job.end_time().is_none());
    h.at(SECOND).exit("workerpool0-0", Outcome::Exited { code: 2 });
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.job.end_time(), Some(T0 + 3 * SECOND));
    assert_eq!(h.job.update_time, T0 + 3 * SECOND);
    assert_eq!(h.error().0, code::INVALID_ARGUMENT);
}

/// L3, L5: a new job is QUEUED; admission makes it PENDING and holds quota.
#[test]
fn l3_l5_queued_then_pending_on_admission() {
    let mut h = H::new(job(&[1, 2]));
    assert_eq!(h.state(), State::Queued);
    assert!(!h.job.holds_quota());
    h.place();
    assert_eq!(h.state(), State::Pending);
    assert!(h.job.holds_quota());
    assert!(h.logs().iter().any(|l| l.contains("admitted")));
}

/// L6: all replicas of the attempt are launched in the same transition.
#[test]
fn l6_parallel_start() {
    let mut h = H::new(job(&[1, 3, 1]));
    h.place();
    let l = h.launches();
    assert_eq!(l.len(), 5);
    let names: Vec<&str> = l.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(names, ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool1-2", "workerpool2-0"]);
}

/// L7: RUNNING once every replica has started, not before.
#[test]
fn l7_running_when_all_started() {
    let mut h = H::new(job(&[1, 1]));
    h.place();
    let r0 = h.run("workerpool0-0");
    h.ev(Event::Started { run: r0 });
    assert_eq!(h.state(), State::Pending);
    let r1 = h.run("workerpool1-0");
    h.ev(Event::Started { run: r1 });
    assert_eq!(h.state(), State::Running);
    assert!(h.logs().contains(&"L7: Job is running."));
}

/// L8, L9, L10: addresses and nodes stay across restarts and retries.
#[test]
fn l8_addresses_kept_across_restarts_and_retries() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    let addr = h.job.replica("workerpool1-0").unwrap().address.clone();
    assert_eq!(addr.as_deref(), Some("127.0.0.3:20001"));
    h.exit("workerpool1-0", Outcome::Signaled { signal: 9 });
    assert_eq!(h.job.replica("workerpool1-0").unwrap().address, addr);
    // A transient exit retries the job; addresses are kept and a new placement does not
    // replace them.
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 134 }).stopped_exit();
    assert_eq!(h.job.attempt, 1);
    assert_eq!(h.job.replica("workerpool1-0").unwrap().address, addr);
}

/// L9: node maintenance: SIGTERM with grace, then the replica restarts on another node
/// with the same name and address; not counted against L11.
#[test]
fn l9_maintenance_restarts_elsewhere_uncounted() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    h.ev(Event::NodeMaintenance { replica: "workerpool1-0".into(), replacement: Some("n2".into()) });
    assert!(matches!(&h.effects[..], [.., Effect::Stop { grace, .. }] if *grace == 30 * SECOND));
    assert_eq!(h.state(), State::Running);
    h.stopped_exit();
    let l = h.launches();
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].replica.as_str(), l[0].restart), ("workerpool1-0", 1));
    assert!(matches!(&h.effects[..], [.., Effect::Launch { node, .. }] if node == "n2"));
    let r = h.job.replica("workerpool1-0").unwrap();
    assert_eq!((r.failures, r.address.as_deref()), (0, Some("127.0.0.3:20001")));
}

/// L9: node loss: restarted at once elsewhere; the old run is stopped and its late report
/// is stale.
#[test]
fn l9_node_loss_restarts_at_once() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    let old = h.run("workerpool1-0");
    h.ev(Event::NodeLost { replica: "workerpool1-0".into(), replacement: Some("n3".into()) });
    assert_eq!(h.stops(), 1);
    assert_eq!(h.launches().len(), 1);
    assert_eq!(h.job.replica("workerpool1-0").unwrap().failures, 0);
    let before = h.job.clone();
    let t = step(&before, Event::Exited { run: old, outcome: Outcome::Signaled { signal: 9 }, stderr_tail: vec![] }, h.now, &h.s)
        .unwrap();
    assert!(!t.changed, "a report about the old run is stale");
}

/// L9, L15: no node can take the replica: a stockout.
#[test]
fn l9_no_replacement_is_a_stockout() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    h.ev(Event::NodeLost { replica: "workerpool1-0".into(), replacement: None });
    h.stopped_exit().stopped_exit();
    assert_eq!(h.job.retries.stockout, 1);
    assert!(matches!(h.job.phase, Phase::Pending { wait: Wait::Placement { .. }, .. }));
}

/// L10: a replica killed by a signal (not a transient code) is restarted at once on the
/// same node; the job carries on.
#[test]
fn l10_non_permanent_restart_same_node() {
    let mut h = H::new(job(&[1, 2]));
    h.place().start_all();
    h.exit("workerpool1-1", Outcome::Signaled { signal: 9 });
    assert_eq!(h.state(), State::Running);
    let l = h.launches();
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].replica.as_str(), l[0].restart, l[0].attempt), ("workerpool1-1", 1, 0));
    assert_eq!(h.job.replica("workerpool1-1").unwrap().node.as_deref(), Some("local"));
    assert!(h.logs().iter().any(|l| l.contains("restarting it (1 of 5)")));
    // A supervisor that lost the replica is non-permanent too.
    h.exit("workerpool1-0", Outcome::Lost { message: "shim died".into() });
    assert_eq!(h.launches().len(), 1);
}

/// L9: only evidence about a node counts towards its quarantine: a lost run and a launch
/// the engine could not make emit `NodeFailed`; a death by a signal (the tenant can send
/// it to itself), an exit and an OOM never do.
#[test]
fn l9_only_evidence_about_the_node_counts_towards_its_quarantine() {
    let node_failed = |h: &H| h.effects.iter().filter(|e| matches!(e, Effect::NodeFailed { node, .. } if node == "local")).count();
    let mut h = H::new(job(&[1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    assert_eq!(node_failed(&h), 0, "kill -KILL $$ is the job's own");
    h.start_all().exit("workerpool0-0", Outcome::Lost { message: "the supervisor ended".into() });
    assert_eq!(node_failed(&h), 1, "a lost run");
    let mut h = H::new(job(&[1]));
    h.place().start_all().exit("workerpool0-0", Outcome::LaunchFailed { message: "the engine failed".into() });
    assert_eq!(node_failed(&h), 1, "a launch the engine could not make");
    assert!(h.job.avoid_nodes.iter().any(|n| n == "local"), "and the retry avoids the node");
    for outcome in [Outcome::Exited { code: 1 }, Outcome::OomKilled { status: 137 }, Outcome::Exited { code: 0 }] {
        let mut h = H::new(job(&[1]));
        h.place().start_all().exit("workerpool0-0", outcome.clone());
        assert_eq!(node_failed(&h), 0, "{outcome:?}");
    }
}

/// L10, L13: a replica that called exit(N != 0) is a user code exception: permanent.
#[test]
fn l10_exit_code_is_permanent() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    h.exit("workerpool1-0", Outcome::Exited { code: 1 });
    assert_eq!(h.state(), State::Running, "the others are shut down first");
    assert_eq!(h.stops(), 1);
    h.stopped_exit();
    assert_eq!(h.state(), State::Failed);
}

/// L11: after 5 restarts the next failure retries the whole job (L12).
#[test]
fn l11_restart_limit_then_job_retry() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    for i in 1..=5 {
        h.exit("workerpool1-0", Outcome::Signaled { signal: 9 });
        assert_eq!(h.job.replica("workerpool1-0").unwrap().failures, i);
        let run = h.run("workerpool1-0");
        h.ev(Event::Started { run });
    }
    h.exit("workerpool1-0", Outcome::Signaled { signal: 9 });
    assert_eq!(h.stops(), 1, "the primary is stopped");
    h.stopped_exit();
    assert_eq!(h.job.attempt, 1);
    assert_eq!(h.job.retries.worker_restarts, 1);
    assert_eq!(h.state(), State::Pending);
    // L12, after a failure that may be its node's: placed again (away from that node
    // when another fits), then every replica starts.
    assert!(h.launches().is_empty() && h.job.wants_placement(h.now), "{:?}", h.job.phase);
    assert_eq!(h.job.avoid_nodes, vec!["local".to_string()]);
    h.place();
    assert_eq!(h.launches().len(), 2, "a fresh attempt starts all replicas");
    assert_eq!(h.job.replica("workerpool1-0").unwrap().failures, 0);
}

/// L11: the limit is a setting.
#[test]
fn l11_limit_is_a_setting() {
    let mut h = H::new(job(&[1]));
    h.s.max_worker_restarts = 1;
    h.place().start_all();
    h.exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    assert_eq!(h.job.attempt, 0);
    h.start_all().exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    assert_eq!(h.job.attempt, 1);
}

/// L12: at most 3 job retries per kind; then FAILED with the last failure's error.
#[test]
fn l12_retry_budget_then_failed_with_last_error() {
    let mut h = H::new(job(&[1]));
    h.place();
    for attempt in 0..3 {
        assert_eq!(h.job.attempt, attempt);
        h.start_all().exit("workerpool0-0", Outcome::Exited { code: 6 });
    }
    assert_eq!(h.job.retries.transient_exit, 3);
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 6 });
    assert_eq!(h.state(), State::Failed);
    let (c, m) = h.error();
    assert_eq!(c, code::INVALID_ARGUMENT);
    assert!(m.starts_with("The replica workerpool0-0 exited with a non-zero status of 6. Termination reason: Error."), "{m}");
    assert!(h.logs().contains(&"L12: Job will not be retried, max error retry attempts reached."));
}

/// L12: each kind has its own budget.
#[test]
fn l12_budgets_are_separate() {
    let mut h = H::new(job(&[1]));
    h.s.max_worker_restarts = 0;
    h.place();
    for _ in 0..3 {
        h.start_all().exit("workerpool0-0", Outcome::Exited { code: 139 });
    }
    for _ in 0..3 {
        h.start_all().exit("workerpool0-0", Outcome::Signaled { signal: 9 });
        h.place();
    }
    assert_eq!(h.job.retries.transient_exit, 3);
    assert_eq!(h.job.retries.worker_restarts, 3);
    assert_eq!(h.state(), State::Pending);
    assert_eq!(h.job.attempt, 6);
}

/// L12a: restartJobOnWorkerRestart turns a replica restart into a job retry.
#[test]
fn l12a_restart_job_on_worker_restart() {
    let mut h = H::new(job_with(&[1, 1], |p| p.restart_job_on_worker_restart = true));
    h.place().start_all();
    h.exit("workerpool1-0", Outcome::Signaled { signal: 9 });
    assert_eq!(h.stops(), 1);
    h.stopped_exit();
    assert_eq!(h.job.attempt, 1);
    assert_eq!(h.job.retries.worker_restarts, 1);
}

/// L12a: disableRetries: no job retry at all, and it overrides restartJobOnWorkerRestart.
#[test]
fn l12a_disable_retries() {
    let mut h = H::new(job_with(&[1], |p| {
        p.disable_retries = true;
        p.restart_job_on_worker_restart = true;
    }));
    h.place().start_all();
    // Overridden: the replica restart stays a replica restart.
    h.exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    assert_eq!((h.job.attempt, h.state()), (0, State::Running));
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 134 });
    assert_eq!(h.state(), State::Failed, "a transient code is not retried");
    assert!(h.logs().iter().any(|l| l.contains("disableRetries")));

    let mut h = H::new(job_with(&[1], |p| p.disable_retries = true));
    h.place();
    h.exit("workerpool0-0", Outcome::LaunchFailed { message: "x".into() });
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error().0, code::INTERNAL);
}

/// L13: the user code exception message carries replica, status, reason and stderr tail.
#[test]
fn l13_user_error_message() {
    let mut h = H::new(job(&[1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 3 });
    let (c, m) = h.error();
    assert_eq!(c, 3);
    assert_eq!(
        m,
        "The replica workerpool0-0 exited with a non-zero status of 3. Termination reason: Error.\nLast lines of stderr:\nTraceback: boom"
    );
    assert_eq!(m, exit_message("workerpool0-0", 3, "Error", &["Traceback: boom".into()]));
    // The message splits back into its first line and the stderr it carries.
    let (first, tail) = trainyard_core::step::split_stderr_tail(&m);
    assert_eq!(first, "The replica workerpool0-0 exited with a non-zero status of 3. Termination reason: Error.");
    assert_eq!(tail, Some("Traceback: boom"));
    assert_eq!(trainyard_core::step::split_stderr_tail(first), (first, None));
}

/// L13: a program that could not be started: StartError.
#[test]
fn l13_start_error() {
    let mut h = H::new(job(&[1]));
    h.place().exit("workerpool0-0", Outcome::StartError { message: "No such file or directory: ./train".into() });
    assert_eq!(h.state(), State::Failed);
    let (c, m) = h.error();
    assert_eq!(c, 3);
    assert!(m.contains("Termination reason: StartError."), "{m}");
    assert!(m.contains("No such file or directory: ./train"));
}

/// L13: transient codes 6, 134, 11, 139 and deaths by SIGABRT/SIGSEGV retry the job.
#[test]
fn l13_transient_codes_and_signals() {
    for outcome in [
        Outcome::Exited { code: 6 },
        Outcome::Exited { code: 134 },
        Outcome::Exited { code: 11 },
        Outcome::Exited { code: 139 },
        Outcome::Signaled { signal: 6 },
        Outcome::Signaled { signal: 11 },
    ] {
        let mut h = H::new(job(&[1]));
        h.place().start_all().exit("workerpool0-0", outcome.clone());
        assert_eq!(h.job.retries.transient_exit, 1, "{outcome:?}");
        assert_eq!(h.job.attempt, 1);
        assert_eq!(h.launches().len(), 1);
    }
    // A signal death reports 128+signal.
    assert_eq!(Outcome::Signaled { signal: 9 }.exit_status(), 137);
}

/// L13: transient codes are a setting.
#[test]
fn l13_transient_codes_setting() {
    let mut h = H::new(job(&[1]));
    h.s.transient_exit_codes = vec![42];
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 42 });
    assert_eq!(h.job.attempt, 1);
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 6 });
    assert_eq!(h.state(), State::Failed);
}

/// L13: a death by signal N is matched as its status 128+N against a custom
/// `transient_exit_codes`, never as N: with [143] a SIGTERM death retries the job, with
/// [15] it does not (it is a signal death, restarted in place by L10).
#[test]
fn l13_a_signal_is_matched_as_128_plus_its_number() {
    let mut h = H::new(job(&[1]));
    h.s.transient_exit_codes = vec![143];
    h.place().start_all().exit("workerpool0-0", Outcome::Signaled { signal: 15 });
    assert_eq!(h.job.retries.transient_exit, 1, "SIGTERM is status 143: transient");
    assert_eq!(h.job.attempt, 1);

    let mut h = H::new(job(&[1]));
    h.s.transient_exit_codes = vec![15];
    h.place().start_all().exit("workerpool0-0", Outcome::Signaled { signal: 15 });
    assert_eq!(h.job.retries.transient_exit, 0, "15 names exit status 15, not SIGTERM");
    assert_eq!(h.job.attempt, 0);
    assert_eq!(h.job.replica("workerpool0-0").map(|r| r.restart), Some(1), "a signal death restarts the replica (L10)");
}

/// L14: an OOM kill is permanent, code 8, with the service's message.
#[test]
fn l14_out_of_memory() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all().exit("workerpool1-0", Outcome::OomKilled { status: 137 }).stopped_exit();
    assert_eq!(h.state(), State::Failed);
    assert_eq!(
        h.error(),
        (8, "The replica workerpool1-0 ran out of memory and exited with a non-zero status of 137.".to_string())
    );
}

/// L15: a stockout retries the job with backoff, placed again; then FAILED with code 8.
#[test]
fn l15_stockout_retries_with_backoff() {
    let mut h = H::new(job(&[1]));
    h.ev(Event::Stockout { detail: "0 of 1 nodes usable".into() });
    assert_eq!(h.state(), State::Pending, "admitted, the first attempt failed");
    assert!(h.job.holds_quota());
    let Phase::Pending { wait: Wait::Placement { not_before }, .. } = h.job.phase else { panic!("{:?}", h.job.phase) };
    assert_eq!(not_before, h.now + 60 * SECOND);
    assert!(!h.job.wants_placement(h.now));
    assert!(h.job.waiting_reason.as_deref().unwrap().contains("Stockout"));
    h.at(60 * SECOND);
    assert!(h.job.wants_placement(h.now));
    h.ev(Event::Stockout { detail: "x".into() });
    let Phase::Pending { wait: Wait::Placement { not_before }, .. } = h.job.phase else { panic!() };
    assert_eq!(not_before, h.now + 120 * SECOND, "backoff doubles");
    h.at(120 * SECOND).ev(Event::Stockout { detail: "x".into() });
    h.at(HOUR).ev(Event::Stockout { detail: "x".into() });
    assert_eq!(h.state(), State::Failed);
    assert_eq!(
        h.error(),
        (8, "Resources are insufficient in region: us-central1. Try a different region or use a different accelerator.".into())
    );
}

/// L15: after a stockout backoff, placement succeeds and the attempt runs.
#[test]
fn l15_placed_again_after_backoff() {
    let mut h = H::new(job(&[1]));
    h.ev(Event::Stockout { detail: "x".into() });
    h.at(61 * SECOND).place();
    assert_eq!(h.launches().len(), 1);
    assert_eq!(h.launches()[0].attempt, 1);
    h.start_all();
    assert_eq!(h.state(), State::Running);
}

/// L15: FLEX_START waits PENDING for capacity up to maxWaitDuration, then fails.
#[test]
fn l15_flex_start_waits_then_fails() {
    let mut h = H::new(job_with(&[1], |p| {
        p.flex_start = true;
        p.max_wait = HOUR;
    }));
    h.ev(Event::Stockout { detail: "x".into() });
    assert!(matches!(h.job.phase, Phase::Pending { wait: Wait::Capacity { .. }, .. }));
    assert_eq!(h.job.retries.stockout, 0, "FLEX_START spends no retry");
    assert!(h.job.wants_placement(h.now));
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + HOUR));
    h.at(HOUR - 1).ev(Event::Tick);
    assert_eq!(h.state(), State::Pending);
    h.at(1).ev(Event::Tick);
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error().0, 8);
}

/// L15: FLEX_START with maxWaitDuration 0 waits forever, and starts when placed.
#[test]
fn l15_flex_start_zero_waits_forever() {
    let mut h = H::new(job_with(&[1], |p| {
        p.flex_start = true;
        p.max_wait = 0;
        p.timeout = 1000 * 24 * HOUR;
    }));
    h.ev(Event::Stockout { detail: "x".into() });
    h.at(100 * 24 * HOUR).ev(Event::Tick);
    assert_eq!(h.state(), State::Pending);
    h.place().start_all();
    assert_eq!(h.state(), State::Running);
}

/// L16: an internal error retries the job at most twice, then FAILED code 13.
#[test]
fn l16_internal_error() {
    let mut h = H::new(job(&[1]));
    h.place();
    for _ in 0..2 {
        h.exit("workerpool0-0", Outcome::LaunchFailed { message: "fork failed".into() });
        assert_eq!(h.state(), State::Pending);
    }
    assert_eq!(h.job.attempt, 2);
    h.exit("workerpool0-0", Outcome::LaunchFailed { message: "fork failed".into() });
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error(), (13, "Internal error occurred for the current attempt.".into()));
    assert!(h.logs().contains(&"L16: Internal error occurred for the current attempt."));
}

/// L17: the primary's exit 0 ends the job; other replicas are shut down first.
#[test]
fn l17_primary_success_stops_others() {
    let mut h = H::new(job(&[1, 2]));
    h.place().start_all();
    h.exit("workerpool1-0", Outcome::Exited { code: 0 });
    assert_eq!(h.job.replica("workerpool1-0").unwrap().state, ReplicaState::Done);
    assert!(h.launches().is_empty(), "a non-primary that exits 0 is not restarted");
    h.exit("workerpool0-0", Outcome::Exited { code: 0 });
    assert_eq!(h.stops(), 1, "only the replica still running is stopped");
    assert_eq!(h.state(), State::Running);
    h.stopped_exit();
    assert_eq!(h.state(), State::Succeeded);
    assert!(h.job.error().is_none());
    assert!(h.logs().contains(&"L17: Job completed successfully."));
}

/// L18: a QUEUED job is cancelled at once.
#[test]
fn l18_cancel_queued() {
    let mut h = H::new(job(&[1]));
    h.ev(Event::Cancel);
    assert_eq!(h.state(), State::Cancelled);
    assert_eq!(h.error(), (1, "CANCELED".into()));
}

/// L18, L20: CANCELLING while replicas shut down, then CANCELLED code 1.
#[test]
fn l18_cancel_running() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all().ev(Event::Cancel);
    assert_eq!(h.state(), State::Cancelling);
    assert_eq!(h.stops(), 2);
    h.stopped_exit();
    assert_eq!(h.state(), State::Cancelled);
    assert_eq!(h.error().0, code::CANCELLED);
    assert_eq!(h.job.live_replicas().count(), 0);
}

/// L18: cancelling a terminal job is refused with FAILED_PRECONDITION.
#[test]
fn l18_cancel_terminal_refused() {
    let mut h = H::new(job(&[1]));
    h.ev(Event::Cancel);
    let r = step(&h.job, Event::Cancel, h.now, &h.s);
    assert!(matches!(r, Err(Rejected::FailedPrecondition(m)) if m.contains("JOB_STATE_CANCELLED")));
}

/// L1, L18: a cancel during a retry's shutdown cancels; during a failure it ends FAILED.
#[test]
fn l18_cancel_while_stopping() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 6 });
    let stops = h.effects.clone();
    h.ev(Event::Cancel);
    assert_eq!(h.state(), State::Cancelling);
    h.effects = stops;
    h.stopped_exit();
    assert_eq!(h.state(), State::Cancelled);

    let mut h = H::new(job(&[1, 1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 1 });
    let stops = h.effects.clone();
    h.ev(Event::Cancel);
    h.effects = stops;
    h.stopped_exit();
    assert_eq!(h.state(), State::Failed, "CANCELLING may end in FAILED");
}

/// L19: the timeout runs from admission; replicas are shut down, then FAILED code 4.
#[test]
fn l19_timeout() {
    let mut h = H::new(job_with(&[1], |p| p.timeout = 10 * SECOND));
    h.at(5 * SECOND).place().start_all();
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + 15 * SECOND));
    h.at(9 * SECOND).ev(Event::Tick);
    assert_eq!(h.state(), State::Running);
    h.at(SECOND).ev(Event::Tick);
    assert_eq!(h.stops(), 1);
    h.stopped_exit();
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error().0, code::DEADLINE_EXCEEDED);
}

/// L19: the timeout runs from admission, not from the replicas' start: a job whose
/// replicas never start (stuck launching) still times out, and one whose replicas start
/// late is given no more time for it.
#[test]
fn l19_timeout_counts_from_admission_not_from_the_start() {
    // Admitted at +5 s, its replica never reported started.
    let mut h = H::new(job_with(&[1], |p| p.timeout = 10 * SECOND));
    h.at(5 * SECOND).place();
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + 15 * SECOND));
    h.at(10 * SECOND).ev(Event::Tick);
    assert_eq!(h.stops(), 1, "a job stuck before its start times out 10 s after admission");
    h.stopped_exit();
    assert_eq!(h.error().0, code::DEADLINE_EXCEEDED);

    // Admitted at +5 s, started at +12 s: the deadline is still +15 s, not +22 s.
    let mut h = H::new(job_with(&[1], |p| p.timeout = 10 * SECOND));
    h.at(5 * SECOND).place();
    h.at(7 * SECOND).start_all();
    h.at(3 * SECOND).ev(Event::Tick);
    assert_eq!(h.stops(), 1, "timed out 10 s after admission although it started 3 s ago");
    h.stopped_exit();
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error().0, code::DEADLINE_EXCEEDED);
}

/// L19: the default timeout is 7 days.
#[test]
fn l19_default_timeout_seven_days() {
    let p = Policy::defaults(&Settings::default());
    assert_eq!(p.timeout, 7 * 24 * HOUR);
}

/// L20: every live replica gets a stop when the attempt ends, and the job is terminal
/// only when none is left.
#[test]
fn l20_nothing_left_running() {
    let mut h = H::new(job(&[1, 3]));
    h.place();
    let r = h.run("workerpool1-0");
    h.ev(Event::Started { run: r });
    h.exit("workerpool0-0", Outcome::OomKilled { status: 137 });
    assert_eq!(h.stops(), 3, "launching replicas are stopped too");
    assert!(!h.job.is_terminal());
    h.stopped_exit();
    assert!(h.job.is_terminal());
    assert_eq!(h.job.live_replicas().count(), 0);
}

/// L21: a warning when a RUNNING job has written no checkpoint for 4 hours.
#[test]
fn l21_checkpoint_warning() {
    let mut h = H::new(job(&[1]));
    h.place().start_all();
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + 4 * HOUR));
    h.at(3 * HOUR).ev(Event::CheckpointSeen { at: T0 + 3 * HOUR });
    h.at(3 * HOUR).ev(Event::Tick);
    assert!(h.logs().is_empty(), "a checkpoint 3 hours ago");
    h.at(HOUR).ev(Event::Tick);
    assert!(h.logs().iter().any(|l| l.contains("no checkpoint")), "{:?}", h.logs());
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(h.now + 4 * HOUR), "the next warning 4 hours later");
}

/// L22: the lifecycle events are in the log stream: admitted, running, restarted and why,
/// retried and why, ended and why.
#[test]
fn l22_lifecycle_events_logged() {
    let mut h = H::new(job(&[1]));
    let mut all = Vec::new();
    h.place();
    all.extend(h.logs().iter().map(|s| s.to_string()));
    h.start_all();
    all.extend(h.logs().iter().map(|s| s.to_string()));
    h.exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    all.extend(h.logs().iter().map(|s| s.to_string()));
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 134 });
    all.extend(h.logs().iter().map(|s| s.to_string()));
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 0 });
    all.extend(h.logs().iter().map(|s| s.to_string()));
    let text = all.join("\n");
    for needle in [
        "admitted",
        "Waiting for job to be provisioned.",
        "Job is running.",
        "was killed by signal 9; restarting it (1 of 5)",
        "Job retry 1 of 3: replica workerpool0-0 exited with transient status 134",
        "Job completed successfully.",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

/// L23: the job's state survives serialisation unchanged (the store keeps it as is), and a
/// restored job carries on with its counters.
#[test]
fn l23_state_round_trip_keeps_counters() {
    let mut h = H::new(job(&[1, 1]));
    h.place().start_all();
    h.exit("workerpool1-0", Outcome::Signaled { signal: 9 });
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 6 }).stopped_exit();
    let text = serde_json::to_string(&h.job).unwrap();
    let restored: Job = serde_json::from_str(&text).unwrap();
    assert_eq!(restored, h.job);
    h.job = restored;
    assert_eq!(h.job.retries.transient_exit, 1);
    h.start_all().exit("workerpool0-0", Outcome::Exited { code: 6 }).stopped_exit();
    assert_eq!(h.job.retries.transient_exit, 2);
}

/// Fencing: a report from an older attempt or restart is dropped.
#[test]
fn stale_reports_are_dropped() {
    let mut h = H::new(job(&[1]));
    h.place().start_all();
    let old = h.run("workerpool0-0");
    h.exit("workerpool0-0", Outcome::Signaled { signal: 9 });
    let t = step(&h.job, Event::Exited { run: old.clone(), outcome: Outcome::Exited { code: 1 }, stderr_tail: vec![] }, h.now, &h.s)
        .unwrap();
    assert!(!t.changed);
    let t = step(&h.job, Event::Started { run: old }, h.now, &h.s).unwrap();
    assert!(!t.changed);
}

/// TY1, SPOT preemption: SIGTERM and grace, then the job waits for capacity and starts a
/// fresh attempt; no retry budget is spent; the replicas keep their names and addresses.
#[test]
fn ty1_spot_preemption_is_not_counted() {
    let mut h = H::new(job_with(&[1, 1], |p| p.spot = true));
    h.place().start_all();
    let addr = h.job.replica("workerpool1-0").unwrap().address.clone();
    h.ev(Event::Preempt { reason: "capacity needed by job 9".into() });
    assert_eq!(h.stops(), 2);
    assert!(matches!(&h.effects[..], [Effect::Log(_), Effect::Stop { grace, .. }, ..] if *grace == 30 * SECOND));
    h.stopped_exit();
    assert_eq!(h.state(), State::Pending);
    assert!(h.job.holds_quota() && !h.job.holds_capacity());
    assert!(h.job.wants_placement(h.now));
    assert_eq!(h.job.retries.total(), 0);
    assert!(h.job.waiting_reason.as_deref().unwrap().contains("preempted"));
    h.place().start_all();
    assert_eq!((h.state(), h.job.attempt), (State::Running, 1));
    assert_eq!(h.job.replica("workerpool1-0").unwrap().address, addr);
    // A job that is not SPOT is never preempted.
    let mut h = H::new(job(&[1]));
    h.place().start_all();
    h.ev(Event::Preempt { reason: "x".into() });
    assert_eq!(h.state(), State::Running);
}

/// A preemption for a job of a higher priority class: any job (not only SPOT) gets
/// SIGTERM and the grace period, then waits PENDING keeping its quota, and starts a fresh
/// attempt with the same replicas; it is counted only as a preemption, neither as a worker
/// restart (L11) nor as a job retry (L12).
#[test]
fn l11_l12_a_priority_preemption_is_no_restart_or_retry() {
    let mut h = H::new(job(&[1]));
    h.place().start_all();
    h.ev(Event::PreemptForPriority { reason: "its capacity is needed by a job of priority 100".into(), requeue: false });
    assert_eq!(h.stops(), 1);
    assert!(matches!(&h.effects[..], [Effect::Log(_), Effect::Stop { grace, .. }, ..] if *grace == 30 * SECOND));
    h.stopped_exit();
    assert_eq!(h.state(), State::Pending);
    assert!(h.job.holds_quota() && !h.job.holds_capacity());
    assert_eq!((h.job.retries.total(), h.job.retries.worker_restarts, h.job.retries.preemptions), (0, 0, 1));
    assert!(h.job.waiting_reason.as_deref().unwrap().starts_with("Preempted"), "{:?}", h.job.waiting_reason);
    h.place().start_all();
    assert_eq!((h.state(), h.job.attempt), (State::Running, 1));
}

/// TY4, hang detection: a running replica silent for the job's allowed time is reported
/// once, citing TY4; new output clears it; with hang_restart it is stopped, and its signal death
/// restarts it as L10 does (counted, L11).
#[test]
fn ty4_hang_detection_reports_and_restarts_a_silent_replica() {
    let mut h = H::new(job_with(&[1], |p| p.hang_after = 60 * SECOND));
    h.place().start_all();
    let start = h.now;
    assert_eq!(h.job.hang_due(0), Some(start + 60 * SECOND), "due a minute after the start");
    // Output at +30 s moves it.
    h.at(30 * SECOND).ev(Event::Activity { replica: "workerpool0-0".into(), at: start + 30 * SECOND });
    assert_eq!(h.job.hang_due(0), Some(start + 90 * SECOND));
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(start + 90 * SECOND));
    h.at(61 * SECOND).ev(Event::Tick);
    assert!(h.logs().iter().any(|l| l.starts_with("TY4: Replica workerpool0-0 may be hung") && l.contains("(allowed: 60s)")), "{:?}", h.logs());
    assert!(matches!(h.job.health(), trainyard_core::job::Health::Hang { ref replica, .. } if replica == "workerpool0-0"));
    assert_eq!(h.job.hang_due(0), None, "reported once");
    assert_eq!(h.stops(), 0, "no restart unless asked");
    assert_eq!(h.state(), State::Running);
    // While hung, the replica is looked at again (its allowed silence later, at most a
    // minute): the tick then reads its writes, so a hang does not outlive its silence.
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(h.now + 60 * SECOND), "a recheck while hung");
    // Writing again ends the hang, and the next report is due an allowed silence later.
    let now = h.now;
    h.at(SECOND).ev(Event::Activity { replica: "workerpool0-0".into(), at: now + SECOND });
    assert_eq!(h.job.replicas[0].hung_since, None);
    assert_eq!(h.job.hang_due(0), Some(now + 61 * SECOND));

    let mut h = H::new(job_with(&[1], |p| {
        p.hang_after = 60 * SECOND;
        p.hang_restart = true;
    }));
    h.place().start_all();
    h.at(61 * SECOND).ev(Event::Tick);
    assert_eq!(h.stops(), 1, "stopped to be restarted");
    h.stopped_exit();
    assert!(h.logs().iter().any(|l| l.contains("restarting it (1 of 5)")), "{:?}", h.logs());
    assert_eq!(h.job.replicas[0].restart, 1);
    assert_eq!(h.job.replicas[0].hung_since, None, "the new run starts afresh");
}

/// TY7, the storage limit: a running job of a project over its `storage_gb` is stopped
/// (SIGTERM and the grace period, like any shutdown) and FAILED with RESOURCE_EXHAUSTED and
/// the message, without a retry; a queued job of that project is failed at once.
#[test]
fn ty7_storage_full_stops_a_running_job_and_fails_it_without_a_retry() {
    let message = "The job was stopped: Project \"p\" stores 2.00 GiB of its storage limit of 1.00 GiB (storage_gb ...)";
    let mut h = H::new(job(&[1]));
    h.at(SECOND).place().start_all();
    h.ev(Event::StorageFull { message: message.into() });
    assert_eq!(h.stops(), 1);
    assert_eq!(h.state(), State::Running, "stopping: not yet ended");
    h.stopped_exit();
    assert_eq!(h.state(), State::Failed);
    assert_eq!(h.error(), (code::RESOURCE_EXHAUSTED, message.to_string()));
    assert_eq!(h.job.attempt, 0, "not retried");

    let mut q = H::new(job(&[1]));
    q.ev(Event::StorageFull { message: message.into() });
    assert_eq!(q.state(), State::Failed);
    assert_eq!(q.error().0, code::RESOURCE_EXHAUSTED);
}

fn rule(name: &str, codes: &[i32], pattern: Option<&str>, action: trainyard_core::job::RuleAction) -> trainyard_core::job::FailureRule {
    trainyard_core::job::FailureRule {
        name: Some(name.into()),
        exit_codes: codes.to_vec(),
        log_pattern: pattern.map(String::from),
        action,
    }
}

/// TY9, failure rules (before L13's table): failure rules come before the built-in table, the first that matches
/// decides, and the job's log names it: a log pattern retries an exit whose status alone
/// is permanent, a rule can make a transient status permanent, exclude_node retries naming
/// the node; an exit no rule matches goes by the table.
#[test]
fn ty9_failure_rules_come_first_and_are_named() {
    use trainyard_core::job::RuleAction::*;
    let exit_with = |h: &mut H, code: i32, line: &str| {
        let run = h.run("workerpool0-0");
        h.ev(Event::Exited { run, outcome: Outcome::Exited { code }, stderr_tail: vec!["step 10".into(), line.into()] });
    };
    let mut h = H::new(job(&[1]));
    h.s.failure_rules = vec![rule("nccl", &[], Some("NCCL (error|timeout)"), Transient), rule("oops", &[6], None, Permanent)];
    h.place().start_all();
    exit_with(&mut h, 1, "RuntimeError: NCCL timeout in allreduce");
    assert_eq!((h.job.attempt, h.job.retries.transient_exit), (1, 1), "status 1 is permanent by L13, the rule retries it");
    assert!(h.logs().iter().any(|l| l.contains("failure rule nccl matched: transient")), "{:?}", h.logs());
    h.start_all();
    exit_with(&mut h, 6, "abort");
    assert_eq!(h.state(), State::Failed, "6 is transient in the table; the rule makes it permanent");

    let mut h = H::new(job(&[1]));
    h.s.failure_rules = vec![rule("ecc", &[3], None, ExcludeNode)];
    h.place().start_all();
    exit_with(&mut h, 3, "uncorrectable ECC error");
    assert_eq!(h.job.attempt, 1);
    assert!(h.logs().iter().any(|l| l.contains("exclude_node") && l.contains("away from node local")), "{:?}", h.logs());
    assert!(h.job.avoid_nodes.iter().any(|n| n == "local"), "the job avoids the node");
    assert!(!h.effects.iter().any(|e| matches!(e, Effect::NodeFailed { .. })), "L9: a log match is the job's, not evidence about the node");
    h.place().start_all();
    exit_with(&mut h, 1, "plain failure");
    assert_eq!(h.state(), State::Failed, "no rule matches: the table decides (permanent)");
}

/// L13: a job's label `trainyard-transient-exit-codes` adds transient codes for it alone.
#[test]
fn l13_a_jobs_own_transient_codes() {
    let mut h = H::new(job_with(&[1], |p| p.transient_exit_codes = vec![75]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 75 });
    assert_eq!(h.job.retries.transient_exit, 1);
    let mut h = H::new(job(&[1]));
    h.place().start_all().exit("workerpool0-0", Outcome::Exited { code: 75 });
    assert_eq!(h.state(), State::Failed);
}

/// TY6, the timeout warning: `timeout_warning` before the limit (L19) every live replica gets the warning
/// signal, once, with an event; the deadline is indexed so that it comes on time.
#[test]
fn ty6_a_warning_signal_comes_before_the_time_limit_once() {
    let mut h = H::new(job_with(&[1, 1], |p| {
        p.timeout = 100 * SECOND;
        p.timeout_warning = 30 * SECOND;
    }));
    h.place().start_all();
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + 70 * SECOND));
    h.at(69 * SECOND).ev(Event::Tick);
    assert!(!h.effects.iter().any(|e| matches!(e, Effect::Signal { .. })));
    h.at(SECOND).ev(Event::Tick);
    let signals: Vec<i32> = h.effects.iter().filter_map(|e| if let Effect::Signal { signal, .. } = e { Some(*signal) } else { None }).collect();
    assert_eq!(signals, vec![10, 10], "SIGUSR1 to both replicas");
    assert!(h.logs().iter().any(|l| l.contains("30s away: SIGUSR1 sent")), "{:?}", h.logs());
    assert_eq!(h.job.next_deadline(&h.s, h.now), Some(T0 + 100 * SECOND), "once");
    h.at(SECOND).ev(Event::Tick);
    assert!(!h.effects.iter().any(|e| matches!(e, Effect::Signal { .. })));
    assert_eq!(h.state(), State::Running);
}

/// TY5, L10: in a job of three replicas, one silent while the others go on is a
/// straggler (named in the log and the job's health), and with `hang_restart` it alone is
/// restarted (L10, counted by L11); all silent is a hang of each.
#[test]
fn ty5_l10_a_straggler_is_told_from_a_hang_and_restarted() {
    use trainyard_core::job::Health;
    let mut h = H::new(job_with(&[1, 2], |p| {
        p.hang_after = 60 * SECOND;
        p.hang_restart = true;
    }));
    h.place().start_all();
    let start = h.now;
    for t in [20, 40, 59] {
        for r in ["workerpool0-0", "workerpool1-0"] {
            h.ev(Event::Activity { replica: r.into(), at: start + t * SECOND });
        }
    }
    h.at(61 * SECOND).ev(Event::Tick);
    assert!(h.logs().iter().any(|l| l.starts_with("TY5: Replica workerpool1-1 is a straggler") && l.contains("while other replicas go on")), "{:?}", h.logs());
    assert!(matches!(h.job.health(), Health::Straggler { ref replica, .. } if replica == "workerpool1-1"), "{:?}", h.job.health());
    assert_eq!(h.stops(), 1, "only the straggler is stopped");
    // While it stops and starts again the others wait for it: past their own allowed
    // silence they are not reported.
    let stopping = h.run("workerpool1-1");
    h.at(60 * SECOND).ev(Event::Tick);
    assert!(!h.logs().iter().any(|l| l.contains("may be hung") || l.contains("straggler")), "{:?}", h.logs());
    h.ev(Event::Exited { run: stopping, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] });
    h.at(SECOND).ev(Event::Tick);
    assert!(!h.logs().iter().any(|l| l.contains("may be hung") || l.contains("straggler")), "{:?}", h.logs());
    let run = h.run("workerpool1-1");
    h.ev(Event::Started { run });
    assert_eq!(h.job.hang_due(0), Some(h.now + 60 * SECOND), "the others' silence counts afresh from its rejoining");
    assert_eq!(h.job.replica("workerpool1-1").unwrap().restart, 1);
    assert_eq!(h.job.replica("workerpool1-1").unwrap().failures, 1, "counted by L11 as a signal death");
    assert_eq!(h.job.health(), Health::Ok);
    // One stopped (SIGSTOP) while the others wait for it in a collective, all silent: the
    // stopped one is the straggler, the waiting ones are not reported.
    let mut h = H::new(job_with(&[1, 2], |p| p.hang_after = 60 * SECOND));
    h.place().start_all();
    h.ev(Event::Suspended { replica: "workerpool1-0".into(), stopped: true });
    h.at(61 * SECOND).ev(Event::Tick);
    let logs = h.logs();
    assert!(logs.iter().any(|l| l.contains("workerpool1-0 is a straggler (its processes are stopped)")), "{logs:?}");
    assert_eq!(logs.iter().filter(|l| l.contains("may be hung") || l.contains("straggler")).count(), 1, "{logs:?}");
    // Nobody goes on: each is hung.
    let mut h = H::new(job_with(&[1, 1], |p| p.hang_after = 60 * SECOND));
    h.place().start_all();
    h.at(61 * SECOND).ev(Event::Tick);
    assert_eq!(h.logs().iter().filter(|l| l.contains("may be hung")).count(), 2, "{:?}", h.logs());
    assert!(matches!(h.job.health(), Health::Hang { .. }));
}
