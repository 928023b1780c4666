//! The simulator running the real engine: every job of the workload is a
//! `trainyard_core::Job` driven by the lifecycle's `step` (L1-L23), and every scheduling
//! round is the scheduler's `plan` on the incrementally kept `Cluster`, both in virtual
//! time, as the server's driver runs them. What the server's backend would report comes
//! from a model of the replicas instead of processes:
//!
//! - a `Launch` effect starts the run after `Faults::launch` (the `Started` report);
//! - a job's work goes on while all its replicas run (a gang: distributed training needs
//!   every replica), checkpointed every 30 minutes; when it is done every replica exits 0;
//! - a run may fail first, at a uniformly drawn point of the work it has left: killed by a
//!   signal from outside (L10: restarted in place, at most `max_worker_restarts` times,
//!   L11), a transient exit code (L13: the job is retried, L12), or an OOM kill (L14:
//!   the job fails); a restarted replica sets the job's work back to its last checkpoint;
//! - a `Stop` effect ends the run after the grace period or 5 s, whichever is shorter;
//! - timers (`Job::next_deadline`: L19 timeouts, L15 backoffs) are `Tick`s at their time.
//!
//! SPOT jobs are preempted by the scheduler's decisions and come back by the rules. The
//! report counts every `step` applied, the jobs by terminal state, restarts, retries,
//! preemptions and log lines, next to the waits and the admissions per second.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use trainyard_core::capacity::{Need, NodeIx, Shape};
use trainyard_core::job::{Demand, Micros, Phase, Policy as JobPolicy, Settings, HOUR, SECOND};
use trainyard_core::schedule::{plan, Cluster, Decision, Fleet, QuotaUse, Quotas, Request};
use trainyard_core::step::{step, Effect, Event};
use trainyard_core::{Job, Outcome, RunId};

use crate::{demand, fleet, quantile, Policy, Rng, Shapes, SimJob, CHECKPOINT};

/// What goes wrong with runs, per run launched.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Killed by a signal from outside before its work is done (L10).
    pub signal: f64,
    /// Ends with a transient exit code (L13).
    pub transient: f64,
    /// Killed by the kernel's OOM killer (L14).
    pub oom: f64,
    /// From `Launch` to `Started`.
    pub launch: Micros,
    /// Node losses per node and day (L9: its replicas restart elsewhere; while it is
    /// down, the capacity it took is missing: L15 stockouts by the rules).
    pub node_loss_per_day: f64,
    /// How long a lost node stays down.
    pub node_repair: Micros,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults { signal: 0.02, transient: 0.005, oom: 0.001, launch: 2 * SECOND, node_loss_per_day: 0.001, node_repair: 4 * HOUR }
    }
}

impl Faults {
    pub fn none() -> Faults {
        Faults { signal: 0.0, transient: 0.0, oom: 0.0, launch: 2 * SECOND, node_loss_per_day: 0.0, node_repair: 4 * HOUR }
    }
}

/// What one run of the engine measured.
#[derive(Clone, Debug, Default)]
pub struct EngineReport {
    pub policy: String,
    pub jobs: usize,
    pub nodes: usize,
    /// Jobs by terminal state (`JOB_STATE_...`); a job left live is counted under its state.
    pub by_state: BTreeMap<&'static str, usize>,
    /// `step` calls that changed a job.
    pub steps: u64,
    pub placements: u64,
    pub rounds: u64,
    /// Replica restarts (L9-L11) and job retries (L12: the counted ones; a SPOT job's
    /// fresh attempt after a preemption is not one), summed over the jobs.
    pub restarts: u64,
    pub retries: u64,
    pub preemptions: u64,
    /// Nodes lost; stockouts the scheduler decided, and stockout retries of the jobs (L15:
    /// also a replica on a lost node that no other node can take).
    pub node_losses: u64,
    pub stockouts: u64,
    pub stockout_retries: u64,
    /// Lifecycle lines for the jobs' logs (L22).
    pub log_lines: u64,
    pub wall_secs: f64,
    pub plan_secs: f64,
    /// Wait from creation to the first RUNNING (L2), seconds: p50, p99, max.
    pub wait: (f64, f64, f64),
    /// Virtual time from the first submission to the last job's end, seconds.
    pub makespan_s: f64,
    /// Jobs run elastic (TY10), and replicas that joined or left them.
    pub elastic_jobs: usize,
    pub grows: u64,
    pub leaves: u64,
    /// GPU time held by jobs over the fleet's GPU time up to the makespan.
    pub gpu_utilisation: f64,
    /// The GPU time of the work done (a job's duration times its GPUs, for the jobs that
    /// finished it) over the GPU time held.
    pub goodput: f64,
    /// p99 wait to RUNNING of the 1-GPU jobs, seconds.
    pub wait_1gpu_p99: f64,
}

impl EngineReport {
    pub fn admissions_per_sec(&self) -> f64 {
        self.placements as f64 / self.wall_secs.max(1e-9)
    }

    pub fn steps_per_sec(&self) -> f64 {
        self.steps as f64 / self.wall_secs.max(1e-9)
    }
}

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Ev {
    Arrive(usize),
    Started(usize, RunId),
    Exited(usize, RunId, OutcomeKey),
    /// The gang's work is done (generation: stale once the gang was broken).
    Complete(usize, u64),
    /// A job's timer (its deadline when it was set).
    Tick(usize, Micros),
    Round,
    NodeDown,
    NodeUp(usize),
}

/// An `Outcome` that orders (for the event queue).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum OutcomeKey {
    Exited(i32),
    Signaled(i32),
    Oom,
}

impl OutcomeKey {
    fn outcome(self) -> Outcome {
        match self {
            OutcomeKey::Exited(code) => Outcome::Exited { code },
            OutcomeKey::Signaled(signal) => Outcome::Signaled { signal },
            OutcomeKey::Oom => Outcome::OomKilled { status: 137 },
        }
    }
}

struct Sim<'a> {
    jobs: &'a [SimJob],
    faults: &'a Faults,
    settings: Settings,
    live: Vec<Option<Job>>,
    /// Work done (checkpointed), per job.
    progress: Vec<Micros>,
    /// Since when the whole gang runs, per job, and at what rate (the share of its
    /// replicas present: 1 for a rigid job).
    gang_since: Vec<Option<Micros>>,
    rate: Vec<f64>,
    /// TY10: per job, the shape of its minimum when it runs elastic.
    min_shape: Vec<Option<Shape>>,
    /// GPUs held since when, per job; GPU time held and worked so far.
    held: Vec<(Micros, u64)>,
    /// TY10: the cluster ids its replicas above the minimum hold their room under.
    extra_ids: Vec<Vec<u64>>,
    gpu_held_s: f64,
    gpu_worked_s: f64,
    generation: Vec<u64>,
    deadline: Vec<Option<Micros>>,
    holds: Vec<bool>,
    fleet: Fleet,
    cluster: Cluster,
    /// Jobs not ended yet (arrived or not): node losses stop when none is left.
    remaining: usize,
    shape_of: Vec<usize>,
    shapes: Vec<Shape>,
    needs: Vec<Need>,
    heap: BinaryHeap<Reverse<(Micros, u64, Ev)>>,
    seq: u64,
    rng: Rng,
    waiting: Vec<usize>,
    dirty: bool,
    rep: EngineReport,
    end_t: Micros,
}

impl Sim<'_> {
    fn push(&mut self, t: Micros, e: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }

    /// One event into one job's lifecycle, and its effects.
    fn apply(&mut self, i: usize, event: Event, now: Micros) {
        let Some(job) = self.live[i].as_ref() else { return };
        let Ok(t) = step(job, event, now, &self.settings) else { return };
        if !t.changed {
            return;
        }
        let moved = job.replicas.iter().zip(&t.job.replicas).any(|(a, b)| a.node != b.node);
        let left = |j: &Job| j.replicas.iter().filter(|r| matches!(r.state, trainyard_core::job::ReplicaState::Away { ran: true, .. })).count();
        self.rep.leaves += left(&t.job).saturating_sub(left(job)) as u64;
        self.rep.steps += 1;
        let job = t.job;
        for e in t.effects {
            match e {
                Effect::Launch { run, .. } => self.launch(i, run, now),
                Effect::Stop { run, grace } => {
                    let at = now + grace.min(5 * SECOND);
                    self.push(at, Ev::Exited(i, run, OutcomeKey::Signaled(15)));
                }
                Effect::Log(_) => self.rep.log_lines += 1,
                // A notice changes nothing in the model: its SIGTERM comes at its end (a Tick).
                Effect::Purge { .. } | Effect::Signal { .. } | Effect::NodeFailed { .. } | Effect::Notice { .. } => {}
            }
        }
        // The gang's work: it goes on while every replica it has runs (an elastic job's
        // away replicas aside), at the share of its replicas present; a change of members
        // sets it back to its last checkpoint (torch restarts its workers from there).
        use trainyard_core::job::ReplicaState;
        let running = matches!(job.phase, Phase::Running { .. });
        let all_up = running && job.replicas.iter().all(|r| matches!(r.state, ReplicaState::Running { .. } | ReplicaState::Away { .. }));
        let up = job.replicas.iter().filter(|r| matches!(r.state, ReplicaState::Running { .. })).count();
        let rate = up as f64 / job.replicas.len().max(1) as f64;
        if self.gang_since[i].is_some() && (!all_up || rate != self.rate[i]) {
            let since = self.gang_since[i].take().unwrap_or(now);
            let done = ((now - since).max(0) as f64 * self.rate[i]) as Micros;
            self.progress[i] += done / CHECKPOINT * CHECKPOINT;
            self.generation[i] += 1;
        }
        if all_up && self.gang_since[i].is_none() {
            self.gang_since[i] = Some(now);
            self.rate[i] = rate;
            self.generation[i] += 1;
            let left = (self.jobs[i].duration - self.progress[i]).max(SECOND);
            let g = self.generation[i];
            self.push(now + (left as f64 / rate.max(1e-9)) as Micros, Ev::Complete(i, g));
        }
        // Capacity: held from placement until the job lets go of it.
        let holds = job.holds_capacity();
        if holds && self.holds[i] && moved {
            // A replica moved (L9): its capacity goes with it.
            self.release(i, job.id, now);
        }
        if holds && !self.holds[i] {
            self.hold(i, &job, now);
        } else if !holds && self.holds[i] {
            self.release(i, job.id, now);
            self.dirty = true;
        }
        if job.wants_placement(now) {
            self.waiting.push(i);
            self.dirty = true;
        }
        // Timers.
        let next = job.next_deadline(&self.settings, now);
        if next != self.deadline[i] {
            self.deadline[i] = next;
            if let Some(at) = next {
                self.push(at.max(now), Ev::Tick(i, at));
            }
        }
        if job.is_terminal() {
            self.remaining -= 1;
            self.end_t = self.end_t.max(now);
            self.rep.restarts += job.replicas.iter().map(|r| r.restart as u64).sum::<u64>();
            let r = &job.retries;
            self.rep.retries += u64::from(r.worker_restarts + r.transient_exit + r.stockout + r.internal);
            self.rep.stockout_retries += u64::from(r.stockout);
            if self.holds[i] {
                self.cluster.finish(job.id);
                self.holds[i] = false;
                self.dirty = true;
            }
        }
        self.live[i] = Some(job);
    }

    /// Job `i` holds nothing any more: the GPU time it held is counted.
    fn release(&mut self, i: usize, id: u64, now: Micros) {
        self.cluster.finish(id);
        for x in std::mem::take(&mut self.extra_ids[i]) {
            self.cluster.finish(x);
        }
        self.holds[i] = false;
        let (since, gpus) = std::mem::take(&mut self.held[i]);
        self.gpu_held_s += (now - since).max(0) as f64 / SECOND as f64 * gpus as f64;
    }

    /// The capacity job `i` holds on its replicas' nodes, until its time limit.
    fn hold(&mut self, i: usize, job: &Job, now: Micros) {
        let need = self.needs[self.shape_of[i]];
        // TY10: replicas above an elastic job's minimum hold their room apart, the first
        // to give way to work that waits (as the server's scheduler has them).
        let extras = if matches!(job.phase, Phase::Stopping { .. }) { Vec::new() } else { trainyard_core::schedule::elastic_extras(job) };
        let placed: Vec<(NodeIx, Need)> = job
            .replicas
            .iter()
            .enumerate()
            .filter(|(k, r)| r.state.is_live() && !extras.contains(k))
            .filter_map(|(_, r)| Some((self.cluster.node(r.node.as_deref()?)?, need)))
            .collect();
        let start = job.admitted_at().unwrap_or(now);
        let end = start + self.jobs[i].limit;
        self.cluster.start(job.id, &job.project, job.policy.spot, start, end, placed.clone());
        self.extra_ids[i] = trainyard_core::schedule::hold_extras(&mut self.cluster, job, &extras, end, Some(now), now);
        self.held[i] = (now, (placed.len() + self.extra_ids[i].len()) as u64 * self.jobs[i].gpus_per_replica as u64);
        self.holds[i] = true;
    }

    /// The capacity state again from the fleet (a node went down or came back) and the
    /// jobs that hold capacity.
    fn rebuild(&mut self, now: Micros) {
        for i in 0..self.held.len() {
            if self.holds[i] {
                let (since, gpus) = self.held[i];
                self.gpu_held_s += (now - since).max(0) as f64 / SECOND as f64 * gpus as f64;
            }
        }
        self.cluster = Cluster::new(&self.fleet);
        for i in 0..self.live.len() {
            if !self.holds[i] {
                continue;
            }
            if let Some(job) = self.live[i].take() {
                self.hold(i, &job, now);
                if matches!(job.phase, Phase::Stopping { .. }) && job.policy.spot {
                    self.cluster.mark_stopping(job.id);
                }
                self.live[i] = Some(job);
            }
        }
        self.dirty = true;
    }

    /// The time of the next node loss anywhere in the fleet.
    fn next_loss(&mut self, now: Micros) {
        let rate = self.faults.node_loss_per_day * self.fleet.nodes.len() as f64;
        if rate <= 0.0 || self.remaining == 0 {
            return;
        }
        let gap = -(1.0 - self.rng.f64()).ln() / rate * 24.0 * HOUR as f64;
        self.push(now + gap as Micros, Ev::NodeDown);
    }

    /// L9: a node is lost: its replicas restart elsewhere (the scheduler's placement of
    /// each on what the others leave, `place_replacement`), or wait as a stockout (L15).
    fn node_down(&mut self, now: Micros) {
        let n = (self.rng.f64() * self.fleet.nodes.len() as f64) as usize % self.fleet.nodes.len().max(1);
        self.next_loss(now);
        if !self.fleet.nodes[n].up {
            return;
        }
        self.rep.node_losses += 1;
        self.fleet.nodes[n].up = false;
        let name = self.fleet.nodes[n].name.clone();
        self.rebuild(now);
        let hit: Vec<(usize, usize, String)> = self
            .live
            .iter()
            .enumerate()
            .filter_map(|(i, j)| Some((i, j.as_ref()?)))
            .filter(|(_, j)| !j.is_terminal())
            .flat_map(|(i, j)| {
                j.replicas
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.state.is_live() && r.node.as_deref() == Some(name.as_str()))
                    .map(move |(k, r)| (i, k, r.name.clone()))
            })
            .collect();
        for (i, k, replica) in hit {
            let replacement = {
                let live: Vec<&Job> = self.live.iter().flatten().filter(|j| !j.is_terminal()).collect();
                let id = self.jobs[i].id;
                trainyard_core::replace::place_replacement(&live, &self.fleet, id, k, &name, now)
            };
            self.apply(i, Event::NodeLost { replica, replacement }, now);
        }
        self.push(now + self.faults.node_repair, Ev::NodeUp(n));
    }

    /// A run launched: it starts after the launch delay, and may fail before its work is
    /// done.
    fn launch(&mut self, i: usize, run: RunId, now: Micros) {
        let start = now + self.faults.launch;
        self.push(start, Ev::Started(i, run.clone()));
        let f = self.faults;
        let x = self.rng.f64();
        let kind = if x < f.signal {
            Some(OutcomeKey::Signaled(9))
        } else if x < f.signal + f.transient {
            Some(OutcomeKey::Exited(self.settings.transient_exit_codes.first().copied().unwrap_or(75)))
        } else if x < f.signal + f.transient + f.oom {
            Some(OutcomeKey::Oom)
        } else {
            None
        };
        if let Some(k) = kind {
            let left = (self.jobs[i].duration - self.progress[i]).max(SECOND);
            let at = start + SECOND + (self.rng.f64() * left as f64) as Micros;
            self.push(at, Ev::Exited(i, run, k));
        }
    }

    /// The gang's work is done: every replica's run exits 0.
    fn complete(&mut self, i: usize, g: u64, now: Micros) {
        if self.generation[i] != g {
            return;
        }
        let Some(job) = self.live[i].as_ref() else { return };
        self.gpu_worked_s += self.jobs[i].duration as f64 / SECOND as f64 * self.jobs[i].gpus() as f64;
        let runs: Vec<RunId> = job
            .replicas
            .iter()
            .filter(|r| r.state.is_live())
            .map(|r| RunId { job: job.id, attempt: job.attempt, replica: r.name.clone(), restart: r.restart })
            .collect();
        for run in runs {
            self.apply(i, Event::Exited { run, outcome: Outcome::Exited { code: 0 }, stderr_tail: Vec::new() }, now);
        }
    }

    fn round(&mut self, now: Micros, policy: &Policy) {
        let no_metrics: BTreeMap<String, u64> = BTreeMap::new();
        let quotas = Quotas::default();
        let used = QuotaUse::default();
        self.waiting.sort_unstable();
        self.waiting.dedup();
        let live = &self.live;
        self.waiting.retain(|&i| live[i].as_ref().is_some_and(|j| j.wants_placement(now)));
        let reqs: Vec<Request> = self
            .waiting
            .iter()
            .filter_map(|&i| {
                let j = self.live[i].as_ref()?;
                Some(Request {
                    id: j.id,
                    project: &j.project,
                    submitted: j.create_time,
                    admitted: !matches!(j.phase, Phase::Queued),
                    spot: j.policy.spot,
                    shape: self.min_shape[i].as_ref().unwrap_or(&self.shapes[self.shape_of[i]]),
                    metrics: &no_metrics,
                    duration: self.jobs[i].limit,
                    priority: j.policy.priority,
                    may_borrow: true,
                    avoid: Vec::new(),
                })
            })
            .collect();
        let t0 = Instant::now();
        let mut decisions = plan(&mut self.cluster, &reqs, &quotas, &used, now, &policy.cfg);
        self.rep.plan_secs += t0.elapsed().as_secs_f64();
        self.rep.rounds += 1;
        drop(reqs);
        // TY10: an elastic job placed at its minimum, its other replicas blank; then
        // growth into what the round leaves.
        let mut grows = Vec::new();
        if self.rep.elastic_jobs > 0 {
            for d in &mut decisions {
                if let Decision::Place { job, nodes, .. } = d {
                    let i = (*job - 1) as usize;
                    if let (Some(_), Some(j)) = (&self.min_shape[i], self.live[i].as_ref()) {
                        *nodes = trainyard_core::schedule::spread_minimum(j.replicas.len(), &j.minimum(), std::mem::take(nodes));
                    }
                }
            }
            let live: Vec<&Job> = self.live.iter().flatten().filter(|j| !j.is_terminal()).collect();
            grows = trainyard_core::schedule::growth(&live, &self.fleet, &mut decisions, now);
        }
        for d in decisions {
            match d {
                Decision::Place { job, nodes, warnings } => {
                    let i = (job - 1) as usize;
                    let addresses = if self.live[i].as_ref().is_some_and(|j| j.replicas.iter().all(|r| r.address.is_some())) {
                        Vec::new()
                    } else {
                        nodes.iter().enumerate().map(|(k, n)| format!("{n}:{}", 20_000 + k)).collect()
                    };
                    self.rep.placements += 1;
                    self.apply(i, Event::Place { nodes, addresses, notes: warnings }, now);
                }
                Decision::Preempt { job, reason, .. } if trainyard_core::schedule::extra_of(job).is_some() => {
                    // TY10: one elastic replica above its minimum gives way.
                    self.cluster.mark_stopping(job);
                    let Some((id, k)) = trainyard_core::schedule::extra_of(job) else { continue };
                    let i = (id - 1) as usize;
                    let Some(replica) = self.live[i].as_ref().and_then(|j| j.replicas.get(k)).map(|r| r.name.clone()) else { continue };
                    self.apply(i, Event::Leave { replica, cause: format!("preempted: {reason}") }, now);
                }
                Decision::Preempt { job, reason, by_priority, reclaim } => {
                    self.cluster.mark_stopping(job);
                    self.rep.preemptions += 1;
                    let event = match by_priority {
                        Some(_) => Event::PreemptForPriority { reason, requeue: false },
                        None if reclaim => Event::PreemptForPriority { reason, requeue: true },
                        None => Event::Preempt { reason },
                    };
                    self.apply((job - 1) as usize, event, now);
                }
                Decision::Stockout { job, detail } => {
                    self.rep.stockouts += 1;
                    self.apply((job - 1) as usize, Event::Stockout { detail }, now)
                }
                Decision::Impossible { job, reason } => self.apply((job - 1) as usize, Event::Impossible { reason }, now),
                Decision::Wait { .. } => {}
            }
        }
        for (job, replica, node) in grows {
            self.rep.grows += 1;
            self.apply((job - 1) as usize, Event::Grow { replica, node }, now);
        }
    }
}

/// Runs `policy` over the workload with the real lifecycle. Job ids must be 1..=n in
/// order (as every workload of this crate makes them).
pub fn simulate_engine(jobs: &[SimJob], nodes: usize, policy: &Policy, interval: Micros, faults: &Faults, seed: u64) -> EngineReport {
    simulate_engine_elastic(jobs, nodes, policy, interval, faults, seed, None)
}

/// [`simulate_engine`] with elastic jobs (TY10): with `elastic_min` = Some(f), every job
/// of three replicas or more runs elastic, its worker pool at least `ceil(f x workers)`
/// (1 at least); its work goes at the share of its replicas present.
pub fn simulate_engine_elastic(
    jobs: &[SimJob],
    nodes: usize,
    policy: &Policy,
    interval: Micros,
    faults: &Faults,
    seed: u64,
    elastic_min: Option<f64>,
) -> EngineReport {
    let wall = Instant::now();
    let fleet = fleet(nodes);
    let cluster = Cluster::new(&fleet);
    let first = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
    let Shapes { of: shape_of, shapes, needs } = Shapes::intern(&cluster, jobs);
    let n = jobs.len();
    let mut sim = Sim {
        jobs,
        faults,
        settings: Settings::default(),
        live: vec![None; n],
        progress: vec![0; n],
        gang_since: vec![None; n],
        rate: vec![1.0; n],
        min_shape: vec![None; n],
        held: vec![(0, 0); n],
        extra_ids: vec![Vec::new(); n],
        gpu_held_s: 0.0,
        gpu_worked_s: 0.0,
        generation: vec![0; n],
        deadline: vec![None; n],
        holds: vec![false; n],
        fleet,
        cluster,
        remaining: n,
        shape_of,
        shapes,
        needs,
        heap: BinaryHeap::new(),
        seq: 0,
        rng: Rng::new(seed),
        waiting: Vec::new(),
        dirty: false,
        rep: EngineReport { policy: policy.name.clone(), jobs: n, nodes, ..EngineReport::default() },
        end_t: 0,
    };
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j.id, i as u64 + 1, "job ids must be 1..=n in order");
        sim.push(j.submit, Ev::Arrive(i));
    }
    sim.end_t = first;
    sim.next_loss(first);
    let mut next_round = Micros::MIN;
    let mut round_pending = false;
    while let Some(Reverse((now, _, ev))) = sim.heap.pop() {
        match ev {
            Ev::Arrive(i) => {
                let j = &jobs[i];
                let pools: Vec<u32> = if j.replicas > 1 { vec![1, j.replicas - 1] } else { vec![1] };
                let mut policy = JobPolicy::defaults(&sim.settings);
                policy.timeout = j.limit;
                policy.spot = j.spot;
                // The model writes no output: hang detection would see only silence.
                policy.hang_after = 0;
                if let Some(f) = elastic_min.filter(|_| j.replicas >= 3) {
                    let workers = j.replicas - 1;
                    let min = ((workers as f64 * f).ceil() as u32).clamp(1, workers);
                    policy.elastic = vec![trainyard_core::job::ElasticPool { pool: 1, min }];
                    sim.min_shape[i] = Some(sim.cluster.shape(&vec![demand(j.gpus_per_replica); 1 + min as usize]));
                    sim.rep.elastic_jobs += 1;
                }
                let d = Demand { metrics: BTreeMap::new(), replicas: vec![demand(j.gpus_per_replica); j.replicas as usize] };
                sim.live[i] = Some(Job::new(j.id, j.project.clone(), "sim".into(), &pools, d, policy, true, now));
                sim.waiting.push(i);
                sim.dirty = true;
            }
            Ev::Started(i, run) => sim.apply(i, Event::Started { run }, now),
            Ev::Exited(i, run, k) => sim.apply(i, Event::Exited { run, outcome: k.outcome(), stderr_tail: Vec::new() }, now),
            Ev::Complete(i, g) => sim.complete(i, g, now),
            Ev::Tick(i, at) => {
                if sim.deadline[i] == Some(at) {
                    sim.deadline[i] = None;
                    sim.apply(i, Event::Tick, now);
                    if sim.live[i].as_ref().is_some_and(|j| j.wants_placement(now)) {
                        sim.waiting.push(i);
                        sim.dirty = true;
                    }
                }
            }
            Ev::Round => round_pending = false,
            Ev::NodeDown => sim.node_down(now),
            Ev::NodeUp(k) => {
                sim.fleet.nodes[k].up = true;
                sim.rebuild(now);
            }
        }
        // A round when something changed, at most one per interval, after every event of
        // this instant.
        let same_instant = sim.heap.peek().is_some_and(|Reverse((t, _, _))| *t == now);
        if !sim.dirty || same_instant {
            continue;
        }
        if now < next_round {
            if !round_pending {
                round_pending = true;
                sim.push(next_round, Ev::Round);
            }
            continue;
        }
        sim.dirty = false;
        next_round = now + interval;
        sim.round(now, policy);
    }
    let mut rep = sim.rep;
    let mut waits = Vec::with_capacity(n);
    for job in sim.live.iter().flatten() {
        *rep.by_state.entry(job.state().wire_name()).or_insert(0) += 1;
        if let Some(s) = job.start_time {
            waits.push((s - job.create_time) as f64 / SECOND as f64);
        }
    }
    waits.sort_by(f64::total_cmp);
    rep.wait = (quantile(&waits, 0.5), quantile(&waits, 0.99), waits.last().copied().unwrap_or(0.0));
    rep.makespan_s = (sim.end_t - first) as f64 / SECOND as f64;
    let mut small: Vec<f64> = sim
        .live
        .iter()
        .flatten()
        .zip(jobs)
        .filter(|(_, sj)| sj.gpus() == 1)
        .filter_map(|(j, _)| Some((j.start_time? - j.create_time) as f64 / SECOND as f64))
        .collect();
    small.sort_by(f64::total_cmp);
    rep.wait_1gpu_p99 = quantile(&small, 0.99);
    let end = sim.end_t;
    for i in 0..n {
        if sim.holds[i] {
            let (since, gpus) = sim.held[i];
            sim.gpu_held_s += (end - since).max(0) as f64 / SECOND as f64 * gpus as f64;
        }
    }
    rep.gpu_utilisation = sim.gpu_held_s / (nodes as f64 * crate::GPUS_PER_NODE as f64 * rep.makespan_s).max(1e-9);
    rep.goodput = sim.gpu_worked_s / sim.gpu_held_s.max(1e-9);
    rep.wall_secs = wall.elapsed().as_secs_f64();
    rep
}
