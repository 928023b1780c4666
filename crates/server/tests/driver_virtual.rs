//! The driver in virtual time with a fake backend: stops that are not honoured, engines
//! that refuse, stall or run out of file descriptors, and reports that arrive in an
//! unexpected order. The executor runs on real threads; the driver's clock is virtual, so
//! grace periods and backoffs pass in an instant.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use trainyard_backend::{Backend, BackendError, BackendEvent, EventSink, Launch};
use trainyard_core::{Micros, Outcome, RunId};
use trainyard_server::driver::{Clock, Create, Driver, Flow, Kind, Msg, Services};
use trainyard_server::Config;
use trainyard_store::Store;

/// The time, and how many of the next reads of it panic (a defect on the driver's thread).
struct VirtualClock(AtomicI64, AtomicU32);

impl Clock for VirtualClock {
    fn now(&self) -> Micros {
        if self.1.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            panic!("a read of the clock that panics (on purpose)");
        }
        self.0.load(Ordering::SeqCst)
    }
}

impl VirtualClock {
    fn advance(&self, secs: i64) {
        self.0.fetch_add(secs * 1_000_000, Ordering::SeqCst);
    }
}

/// How the fake engine behaves.
#[derive(Default)]
struct Script {
    /// Launches that fail with "out of file descriptors" before one succeeds.
    exhausted_launches: u32,
    /// Stops refused with an error before one is delivered.
    refused_stops: u32,
    /// A delivered stop ends the run (else it is ignored, as by a SIGSTOPped shim).
    stop_ends_run: bool,
    /// The stop reports the run's end before it returns (a report that overtakes).
    stop_reports_first: bool,
    /// Launches block until this is released.
    stall: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    /// Launches that panic before one succeeds.
    panicking_launches: u32,
    /// Every call (launch, stop, kill, adopt, waiting reason) first blocks this long.
    block: Option<Duration>,
}

#[derive(Default)]
struct Calls {
    reasons: u32,
    adopts: u32,
    launches: u32,
    stops: u32,
    kills: u32,
}

struct FakeBackend {
    script: Mutex<Script>,
    calls: Mutex<Calls>,
    sinks: Mutex<HashMap<RunId, EventSink>>,
}

impl FakeBackend {
    fn new(script: Script) -> Arc<FakeBackend> {
        Arc::new(FakeBackend { script: Mutex::new(script), calls: Mutex::default(), sinks: Mutex::default() })
    }

    fn calls(&self) -> (u32, u32, u32) {
        let c = self.calls.lock().unwrap();
        (c.launches, c.stops, c.kills)
    }

    fn end(&self, run: &RunId, outcome: Outcome) {
        if let Some(sink) = self.sinks.lock().unwrap().remove(run) {
            sink(BackendEvent::Exited { run: run.clone(), outcome, stderr_tail: Vec::new() });
        }
    }

    fn any_run(&self) -> Option<RunId> {
        self.sinks.lock().unwrap().keys().next().cloned()
    }
}

impl FakeBackend {
    fn maybe_block(&self) {
        let block = self.script.lock().unwrap().block;
        if let Some(d) = block {
            std::thread::sleep(d);
        }
    }
}

impl Backend for FakeBackend {
    fn launch(&self, runs: Vec<Launch>, sink: EventSink) -> Vec<(RunId, Result<(), BackendError>)> {
        self.maybe_block();
        let stall = self.script.lock().unwrap().stall.clone();
        if let Some(s) = stall {
            let (lock, cv) = &*s;
            let mut released = lock.lock().unwrap();
            while !*released {
                released = cv.wait(released).unwrap();
            }
        }
        {
            let mut script = self.script.lock().unwrap();
            if script.panicking_launches > 0 {
                script.panicking_launches -= 1;
                drop(script);
                self.calls.lock().unwrap().launches += 1;
                panic!("a launch that panics (on purpose)");
            }
        }
        let mut out = Vec::new();
        for l in runs {
            self.calls.lock().unwrap().launches += 1;
            let mut script = self.script.lock().unwrap();
            if script.exhausted_launches > 0 {
                script.exhausted_launches -= 1;
                out.push((l.run, Err(BackendError::Exhausted { resource: "file descriptors".into(), message: "Too many open files (os error 24)".into() })));
                continue;
            }
            drop(script);
            self.sinks.lock().unwrap().insert(l.run.clone(), sink.clone());
            sink(BackendEvent::Started { run: l.run.clone(), pid: 4242 });
            out.push((l.run, Ok(())));
        }
        out
    }

    fn waiting_reason(&self, _run: &RunId) -> Option<String> {
        self.calls.lock().unwrap().reasons += 1;
        self.maybe_block();
        Some("the controller does not answer".into())
    }

    fn adopt(&self, run: RunId, _run_dir: PathBuf, sink: EventSink) -> Result<(), BackendError> {
        self.maybe_block();
        self.calls.lock().unwrap().adopts += 1;
        self.sinks.lock().unwrap().insert(run, sink);
        Ok(())
    }

    fn stop(&self, run: &RunId, _run_dir: PathBuf) -> Result<(), BackendError> {
        self.maybe_block();
        self.calls.lock().unwrap().stops += 1;
        let mut script = self.script.lock().unwrap();
        if script.refused_stops > 0 {
            script.refused_stops -= 1;
            return Err(BackendError::Slurm { command: "scancel".into(), message: "Unable to contact slurm controller".into() });
        }
        let (ends, first) = (script.stop_ends_run, script.stop_reports_first);
        drop(script);
        if ends || first {
            self.end(run, Outcome::Signaled { signal: 15 });
        }
        Ok(())
    }

    fn kill(&self, run: &RunId, _run_dir: PathBuf) -> Result<(), BackendError> {
        self.maybe_block();
        self.calls.lock().unwrap().kills += 1;
        self.end(run, Outcome::Lost { message: "killed".into() });
        Ok(())
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

struct Harness {
    driver: Driver,
    tx: std::sync::mpsc::Sender<Msg>,
    clock: Arc<VirtualClock>,
    backend: Arc<FakeBackend>,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

/// An executor whose observations of jobs' files never answer (a file system that hangs);
/// everything else is the real pool's.
struct NoObservations(Arc<trainyard_server::executor::Pool>);

impl trainyard_server::executor::Executor for NoObservations {
    fn submit(&self, work: trainyard_server::executor::Work) {
        if !matches!(work, trainyard_server::executor::Work::Observe { .. }) {
            self.0.submit(work);
        }
    }
}

impl Harness {
    fn new(script: Script) -> Harness {
        Harness::with(script, false)
    }

    /// `hung_scans`: observations of jobs' files never answer.
    fn with(script: Script, hung_scans: bool) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::builtin(Some(dir.path().join("data")));
        std::fs::create_dir_all(&cfg.data_dir).unwrap();
        std::fs::create_dir_all(&cfg.storage_root).unwrap();
        let db = cfg.data_dir.join("trainyard.db");
        let backend = FakeBackend::new(script);
        let svc = Arc::new(Services {
            catalog: cfg.catalog.clone(),
            backend: backend.clone(),
            output_roots: vec![],
            workdir: dir.path().to_path_buf(),
            base_env: vec![],
            node_agent: None,
        containers: None,
        gpus: Default::default(),
        gcs_mount: false,
        private_tmp: false,
        job_credentials: None,
        storage_usage: Arc::new(trainyard_server::storage::usage::StorageUsage::new(cfg.storage_root.clone(), cfg.storage_limits.clone())),
            cfg,
        });
        let clock = Arc::new(VirtualClock(AtomicI64::new(1_800_000_000_000_000), AtomicU32::new(0)));
        let store = Store::open(&db).unwrap();
        let b = backend.clone() as Arc<dyn Backend>;
        let (mut driver, tx) = Driver::with_parts(svc, store, clock.clone(), move |sink, report| {
            let pool = Arc::new(trainyard_server::executor::Pool::new(b, sink, report, 0));
            if hung_scans {
                Arc::new(NoObservations(pool)) as Arc<dyn trainyard_server::executor::Executor>
            } else {
                pool
            }
        });
        driver.recover().unwrap();
        Harness { driver, tx, clock, backend, db, _dir: dir }
    }

    /// Turn the loop until `cond` holds (real time bound: 10 s).
    fn until(&mut self, what: &str, mut cond: impl FnMut(&mut Harness) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            assert_eq!(self.driver.turn(Duration::from_millis(20)).unwrap(), Flow::Continue);
        }
    }

    fn create(&mut self, command: &str) -> u64 {
        let body = serde_json::json!({"displayName": "v", "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "i", "command": ["sh", "-c", command]}}]}});
        self.create_body(body)
    }

    fn create_body(&mut self, body: serde_json::Value) -> u64 {
        let job = trainyard_api::parse_custom_job(body.to_string().as_bytes()).unwrap();
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        self.tx.send(Msg::Create { project: "p".into(), region: "us-central1".into(), new: Create::CustomJob { resource: Box::new(job), reply } }).unwrap();
        let mut got = None;
        self.until("the create's reply", |_| {
            if let Ok(r) = rx.try_recv() {
                got = Some(r);
            }
            got.is_some()
        });
        let job = got.unwrap().unwrap();
        job.name.rsplit('/').next().unwrap().parse().unwrap()
    }

    fn cancel(&mut self, id: u64) {
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        self.tx.send(Msg::Cancel { kind: Kind::CustomJob, project: "p".into(), region: "us-central1".into(), id, reply }).unwrap();
        let mut done = false;
        self.until("the cancel's reply", |_| {
            done |= rx.try_recv().is_ok();
            done
        });
    }

    fn state(&self, id: u64) -> String {
        let store = Store::open(&self.db).unwrap();
        store.get_job_by_id(id).unwrap().unwrap().job.state().wire_name().to_string()
    }

    fn job(&self, id: u64) -> trainyard_core::Job {
        Store::open(&self.db).unwrap().get_job_by_id(id).unwrap().unwrap().job
    }

    fn data_dir(&self) -> PathBuf {
        self.db.parent().unwrap().to_path_buf()
    }

    /// The running job's run exits 0: the job SUCCEEDED; then a new job runs.
    fn succeeds_and_the_next_runs(&mut self, id: u64) {
        let run = self.backend.any_run().unwrap();
        self.backend.end(&run, Outcome::Exited { code: 0 });
        self.until("succeeded", |h| h.state(id) == "JOB_STATE_SUCCEEDED");
        let next = self.create("true");
        self.until("the next job running", |h| h.state(next) == "JOB_STATE_RUNNING");
    }

    fn outbox_len(&self) -> usize {
        Store::open(&self.db).unwrap().pending_outbox().unwrap().0.len()
    }
}

/// L20: a stop that is delivered but not honoured (the shim does not answer, as when it
/// was stopped with SIGSTOP) is escalated to a kill once the grace period and a margin
/// have passed; the cancel then ends, and the stop's outbox entry is done only then.
#[test]
fn l20_unanswered_stop_is_escalated_to_a_kill() {
    let mut h = Harness::new(Script::default());
    let id = h.create("sleep 600");
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    h.cancel(id);
    h.until("the stop delivered", |h| h.backend.calls().1 == 1);
    // Let the executor's report arrive, then pass the grace period (30 s) in an instant.
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(h.state(id), "JOB_STATE_CANCELLING");
    assert_eq!(h.backend.calls().2, 0, "no kill before the grace period has passed");
    assert_eq!(h.outbox_len(), 1, "the stop stays in the outbox until its run is gone");
    h.clock.advance(30 + 11);
    // The clock goes on moving while the driver waits: a report that arrives late (a
    // loaded machine) is still followed by what it schedules.
    h.until("cancelled after the kill", |h| {
        h.clock.advance(1);
        h.state(id) == "JOB_STATE_CANCELLED"
    });
    assert_eq!(h.backend.calls().2, 1);
    h.until("the outbox emptied", |h| h.outbox_len() == 0);
}

/// L20: a stop the engine refuses is asked again with backoff (1 s, 2 s, ...), never
/// marked done and forgotten.
#[test]
fn l20_refused_stop_is_retried_with_backoff() {
    let mut h = Harness::new(Script { refused_stops: 2, stop_ends_run: true, ..Script::default() });
    let id = h.create("sleep 600");
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    h.cancel(id);
    h.until("first refusal", |h| h.backend.calls().1 == 1);
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(h.backend.calls().1, 1, "not asked again before the backoff");
    h.until("second try", |h| {
        h.clock.advance(1);
        h.backend.calls().1 == 2
    });
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    h.until("cancelled on the third try", |h| {
        h.clock.advance(1);
        h.state(id) == "JOB_STATE_CANCELLED"
    });
    assert_eq!(h.backend.calls(), (1, 3, 0));
    h.until("the outbox emptied", |h| h.outbox_len() == 0);
}

/// The run's end overtakes the executor's report of the stop: nothing is left tracked,
/// no kill follows.
#[test]
fn l20_end_before_the_stop_report_leaves_nothing_behind() {
    let mut h = Harness::new(Script { stop_reports_first: true, ..Script::default() });
    let id = h.create("sleep 600");
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    h.cancel(id);
    h.until("cancelled", |h| h.state(id) == "JOB_STATE_CANCELLED");
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    h.clock.advance(3600);
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(h.backend.calls().2, 0, "no kill for a run that is gone");
    assert_eq!(h.outbox_len(), 0);
}

/// L16: a host out of file descriptors is not a launch failure: the launch is tried again
/// with backoff, the job waits PENDING with the reason, and no attempt is used up.
#[test]
fn l16_exhausted_host_retries_the_launch_without_failing_the_job() {
    let mut h = Harness::new(Script { exhausted_launches: 3, ..Script::default() });
    let id = h.create("true");
    h.until("first launch", |h| h.backend.calls().0 >= 1);
    for _ in 0..5 {
        h.driver.turn(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(h.state(id), "JOB_STATE_PENDING");
    let store = Store::open(&h.db).unwrap();
    let job = store.get_job_by_id(id).unwrap().unwrap().job;
    assert!(job.waiting_reason.as_deref().unwrap_or("").contains("out of file descriptors"), "{:?}", job.waiting_reason);
    assert_eq!(h.outbox_len(), 1, "the launch stays in the outbox until it is done");
    // The clock moves while the driver waits: a report that arrives late (a loaded
    // machine) is still followed by its retry.
    for n in 2..=4 {
        h.until("the next try", |h| {
            h.clock.advance(1);
            h.backend.calls().0 >= n
        });
    }
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    let job = Store::open(&h.db).unwrap().get_job_by_id(id).unwrap().unwrap().job;
    assert_eq!(job.attempt, 0, "no attempt used up");
    h.until("the outbox emptied", |h| h.outbox_len() == 0);
    let run = h.backend.any_run().unwrap();
    h.backend.end(&run, Outcome::Exited { code: 0 });
    h.until("succeeded", |h| h.state(id) == "JOB_STATE_SUCCEEDED");
}

/// An engine that stalls in a launch holds up neither creates nor cancels: the driver
/// answers while the executor waits.
#[test]
fn a_stalled_launch_blocks_no_reply() {
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let mut h = Harness::new(Script { stall: Some(gate.clone()), stop_ends_run: true, ..Script::default() });
    let a = h.create("sleep 600");
    // The launch of `a` is stuck in the engine; more creates and a cancel are answered.
    let started = Instant::now();
    let b = h.create("sleep 600");
    h.cancel(a);
    assert!(started.elapsed() < Duration::from_secs(5), "replies waited for the stalled engine");
    assert_ne!(a, b);
    {
        let (lock, cv) = &*gate;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    // `a`'s stop came before its shim: past the grace period it is killed (L20).
    h.until("b running", |h| h.state(b) == "JOB_STATE_RUNNING");
    h.clock.advance(41);
}


/// Set the modification time of `path` itself (a link's own, not its target's).
fn set_mtime(path: &std::path::Path, micros: Micros) {
    let t = nix::sys::time::TimeSpec::new(micros / 1_000_000, (micros % 1_000_000) * 1000);
    let parent = std::fs::File::open(path.parent().unwrap()).unwrap();
    nix::sys::stat::utimensat(&parent, path.file_name().unwrap(), &t, &t, nix::sys::stat::UtimensatFlags::NoFollowSymlink).unwrap();
}

/// L21: the checkpoint scan runs off the driver thread and is bounded: fifty `ln -s .`
/// links and a link out of the storage root in a job's checkpoint directory do not hold
/// the driver, the link's target is never looked at (its newer file does not count), and
/// the warning waits for the scan's report: none while a checkpoint was seen within the
/// period, one once none was.
#[test]
fn l21_checkpoint_scan_is_off_the_driver_thread_and_stays_below_its_root() {
    const HOUR: i64 = 3_600_000_000;
    let mut h = Harness::new(Script::default());
    let body = serde_json::json!({"displayName": "v", "jobSpec": {
        "workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                             "containerSpec": {"imageUri": "i", "command": ["sleep", "600"]}}],
        "baseOutputDirectory": {"outputUriPrefix": "gs://b/run"}}});
    let id = h.create_body(body);
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    let ckpt = h.data_dir().join("storage/p/b/run/checkpoints");
    h.until("the checkpoint directory made at launch", |_| ckpt.is_dir());
    let start = h.job(id).start_time.unwrap();
    let outside = h.data_dir().parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("fresh"), b"x").unwrap();
    set_mtime(&outside.join("fresh"), start + 3 * HOUR + HOUR / 2);
    std::fs::create_dir_all(ckpt.join("step-1")).unwrap();
    std::fs::write(ckpt.join("step-1/data"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, ckpt.join("escape")).unwrap();
    let mut planted = vec![ckpt.join("escape"), ckpt.join("step-1")];
    for i in 0..50 {
        std::os::unix::fs::symlink(".", ckpt.join(format!("l{i}"))).unwrap();
        planted.push(ckpt.join(format!("l{i}")));
    }
    for p in &planted {
        set_mtime(p, start + HOUR);
    }
    set_mtime(&ckpt.join("step-1/data"), start + 3 * HOUR);
    set_mtime(&ckpt, start + HOUR);

    h.clock.advance(4 * 3600 + 1);
    let t0 = Instant::now();
    h.driver.turn(Duration::ZERO).unwrap();
    let turn = t0.elapsed();
    println!("driver turn at the L21 deadline: {turn:?}");
    assert!(turn < Duration::from_secs(1), "the driver does not scan: {turn:?}");
    h.until("the scan's report", |h| h.job(id).checkpoint.last_write.is_some());
    let job = h.job(id);
    assert_eq!(job.checkpoint.last_write, Some(start + 3 * HOUR), "the file outside the root (via `escape`) is not counted");
    assert_eq!(job.checkpoint.warned_at, None, "a checkpoint was written 1 h ago: no warning");

    // Four hours after that write, nothing new: the warning comes once the scan reported.
    h.clock.advance(3 * 3600 + 1);
    h.until("the warning", |h| h.job(id).checkpoint.warned_at.is_some());
    assert_eq!(h.job(id).checkpoint.last_write, Some(start + 3 * HOUR));
    assert_eq!(h.state(id), "JOB_STATE_RUNNING");
    h.cancel(id);
}

/// L19 fires at its own time and never waits for an observation of the job's files: a job
/// that watches for hangs (every tick of it looks at its replicas' writes first) times out
/// at `scheduling.timeout` even when that observation never answers.
#[test]
fn l19_the_timeout_never_waits_for_a_scan_of_the_jobs_files() {
    let mut h = Harness::with(Script::default(), true);
    let body = serde_json::json!({"displayName": "v", "labels": {"trainyard-hang-after-secs": "600"}, "jobSpec": {
        "workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                             "containerSpec": {"imageUri": "i", "command": ["sleep", "6000"]}}],
        "scheduling": {"timeout": "100s"}}});
    let id = h.create_body(body);
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    h.clock.advance(101);
    // The clock stays where it is: the timeout must not wait for SCAN_HOLD to pass.
    h.until("the timeout applied at once", |h| !matches!(h.job(id).phase, trainyard_core::Phase::Running { .. }));
    let log = Store::open(&h.db).unwrap().events(id, 0).unwrap().into_iter().map(|e| e.text).collect::<Vec<_>>().join("\n");
    assert!(log.contains("L19"), "{log}");
}

/// A deleted job's files that cannot be removed (here a mount point inside its run
/// directory: EBUSY) do not stop the server: the purge is tried again with a backoff that
/// doubles, then given up after its tries: its outbox entry is done, and the failure is
/// counted in `trainyard_effects_failed_total{effect="purge"}`.
#[test]
fn a_failing_purge_is_retried_with_backoff_then_given_up_and_counted() {
    if !nix::unistd::geteuid().is_root() && trainyard_backend::skip_test("mounting a tmpfs needs root") {
        return;
    }
    let mut h = Harness::new(Script { stop_ends_run: true, ..Script::default() });
    let id = h.create("true");
    h.until("running", |h| h.state(id) == "JOB_STATE_RUNNING");
    let run = h.backend.any_run().unwrap();
    h.backend.end(&run, Outcome::Exited { code: 0 });
    h.until("succeeded", |h| h.state(id) == "JOB_STATE_SUCCEEDED");
    let busy = h.data_dir().join("runs").join(id.to_string()).join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    nix::mount::mount(Some("tmpfs"), &busy, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=1m")).unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(busy.clone());
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    h.tx.send(Msg::Delete { kind: Kind::CustomJob, project: "p".into(), region: "us-central1".into(), id, reply }).unwrap();
    let mut answered = false;
    h.until("the delete's reply", |_| {
        answered |= rx.try_recv().is_ok();
        answered
    });
    let failed = |h: &Harness| {
        let text = h.driver.metrics().render_text();
        text.lines().any(|l| l.starts_with("trainyard_effects_failed_total{effect=\"purge\"} 1"))
    };
    // Each failure waits longer (1, 2, 4, 8 s): five tries take at least 15 s of the
    // driver's clock, and the purge stays pending until the last has failed.
    for second in 0..15 {
        for _ in 0..5 {
            h.driver.turn(Duration::from_millis(10)).unwrap();
        }
        assert_eq!(h.outbox_len(), 1, "the purge is still pending after {second} s");
        assert!(!failed(&h));
        h.clock.advance(1);
    }
    h.until("the purge given up", |h| {
        h.clock.advance(1);
        h.outbox_len() == 0
    });
    assert!(failed(&h), "{}", h.driver.metrics().render_text());
    assert!(busy.exists(), "what could not be removed is left");
}

/// L16: a launch that panics is its run's launch failure (Trainyard's own: the job is
/// retried), never the end of a launch thread: as many panics as there are launch
/// threads (2) leave the pool launching.
#[test]
fn l16_a_panicking_launch_is_a_launch_failure_and_the_pool_lives_on() {
    let mut h = Harness::new(Script { panicking_launches: 2, ..Script::default() });
    let id = h.create("true");
    h.until("running after the retries", |h| {
        h.clock.advance(1);
        h.state(id) == "JOB_STATE_RUNNING"
    });
    let job = h.job(id);
    assert_eq!(job.attempt, 2, "each panic was a launch failure that retried the job (L16)");
    // The pool still launches.
    h.succeeds_and_the_next_runs(id);
}

/// A panic on the driver's thread (here a read of the clock, three times in a row: the
/// turn and two recoveries) does not end the driver: a request waiting meanwhile gets an
/// answer (503, never left hanging), the health check says the driver is
/// recovering, the live job is recovered from the store with its run adopted again (L23),
/// and the driver goes on: the job ends by its run's exit and a new job runs.
#[test]
fn l23_a_panic_on_the_drivers_thread_is_recovered_from_the_store() {
    let mut h = Harness::new(Script::default());
    let id = h.create("true");
    // Its launch done too: a launch still in the outbox is carried out again by a
    // recovery, not adopted.
    h.until("running, its launch done", |h| h.state(id) == "JOB_STATE_RUNNING" && h.outbox_len() == 0);
    let adopts = h.backend.calls.lock().unwrap().adopts;
    let health = h.driver.health();
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    h.tx.send(Msg::Cancel { kind: Kind::CustomJob, project: "p".into(), region: "us-central1".into(), id: 999, reply }).unwrap();
    h.clock.1.store(3, Ordering::SeqCst);
    assert_eq!(h.driver.guarded_turn(Duration::from_millis(20)).unwrap(), Flow::Continue);
    assert_eq!(h.clock.1.load(Ordering::SeqCst), 0, "the turn and two recoveries panicked");
    assert!(!matches!(rx.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)), "the request is answered");
    assert_eq!(health.unavailable(), None, "recovered");
    assert!(h.backend.calls.lock().unwrap().adopts > adopts, "the live job's run was adopted again");
    assert_eq!(h.state(id), "JOB_STATE_RUNNING");
    h.succeeds_and_the_next_runs(id);
}

/// The driver's thread only decides: with an engine whose every call blocks for 10 s
/// (launches, stops, and the waiting reasons it is asked for about once a second while a
/// job starts), creates and a cancel are still answered at once, far within one blocked
/// call; the engine was asked for its reasons (off the driver's thread).
#[test]
fn the_driver_answers_while_every_engine_call_blocks() {
    let block = Duration::from_secs(10);
    let mut h = Harness::new(Script { block: Some(block), ..Script::default() });
    let began = Instant::now();
    let first = h.create("true");
    let mut answered = Vec::new();
    for _ in 0..5 {
        // Reasons are asked about once a second (virtual time).
        h.clock.advance(2);
        let t = Instant::now();
        h.create("true");
        answered.push(t.elapsed());
    }
    h.cancel(first);
    let took = began.elapsed();
    assert!(took < block / 2, "answered while the engine blocks: {took:?} in all, creates {answered:?}");
    h.until("the engine asked why the first job waits", |h| h.backend.calls.lock().unwrap().reasons >= 1);
    assert_eq!(h.state(first), "JOB_STATE_CANCELLING");
}
