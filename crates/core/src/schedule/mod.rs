//! Admission and placement as a pure function (L3, L4, L5, L15):
//! `schedule(jobs, fleet, quotas, now) -> Vec<Decision>`, the same code that the simulator
//! (`trainyard-sim`) measures at data-centre scale through `plan`.
//!
//! Quota first: a job is admitted only when its project's quota in its region covers
//! every replica at once (L3). Waiting jobs are considered in weighted fair-share order
//! (dominant resource fairness across projects, FIFO within a project; jobs that waited
//! too long go first). Placement is best fit and all or nothing per attempt (gang): the
//! replicas go to the nodes with the least free room that still hold them, so whole
//! nodes stay free for large gangs. The first job that does not fit gets a reservation
//! (when enough capacity frees, from running jobs' expected ends, and on which nodes);
//! later jobs start only if they cannot delay it (EASY backfill). SPOT jobs use idle
//! capacity and are preempted, cheapest first, when non-SPOT work needs it. With an exact
//! fleet, capacity held by other jobs makes a job wait (QUEUED, not a stockout), capacity
//! missing for other reasons (nodes down or drained) is a stockout (L15). The default
//! fleet overcommits: placement always succeeds.
//!
//! Starvation. A job that has waited `starvation_secs` goes ahead of the fair order
//! (oldest first) and holds a reservation of its own, as EASY's head does: the oldest
//! `max_reservations` such jobs each get one, made in that order, each counting the
//! capacity of the ones before it as held until their expected end. A later job may
//! start only if it ends before every reservation it overlaps is due, or takes no more
//! than what those reservations leave on their nodes (a SPOT preemption's claim too).
//! What is guaranteed, with running jobs ending by their time limits (L19): a reservation
//! is never made later by any job after it in the order, so a starving job starts no
//! later than its reservation of the round. The first reservation (the oldest starving
//! job, as EASY's head) can only move earlier from round to round; a later one is made
//! around the ones before it and is not proven to. `Decision::Wait` carries a reservation's
//! time, and the simulator's `tests/guarantee.rs` checks both on generated workloads: the
//! first reservation never moves later, and its job starts by it (within a round
//! interval). What is not guaranteed: a bound
//! relative to EASY backfill on the same workload. The two policies leave different jobs
//! running, so a job may meet a fuller fleet under ours; the simulator's
//! `tests/guarantee.rs` keeps a counterexample.
//!
//! The round, by stage (one file each; [`plan`] in `round.rs` drives a job through them
//! in the order `order.rs` gives):
//!
//! ```text
//!   jobs ──► order ──► admission ──► fit ──────────► Place
//!            (classes,  (quota, L3;    │ no room now
//!             starving,  cohorts'      ▼
//!             fair       reclaim)    never fits? ──► Impossible
//!             share,        │          │
//!             FIFO)         ▼          ▼
//!                      Wait (quota)  preempt ──────► Preempt (SPOT, priority, reclaim)
//!                                      │ nothing to take
//!                                      ▼
//!                                    stockout? ────► Stockout (L15)
//!                                      │
//!                                      ▼
//!                                    reserve ──────► Wait (reserved, behind a
//!                                                    reservation, blocked, capacity)
//! ```
//!
//! `explain.rs` writes every waiting reason; `cluster.rs` is the capacity state the stages
//! read; `config.rs` the settings and priority classes; `overcommit.rs` the
//! single-workstation fleet, where everything fits.

mod admission;
mod cluster;
mod config;
mod decision;
mod explain;
mod fit;
mod grow;
mod order;
mod overcommit;
mod preempt;
mod reserve;
mod round;

pub use crate::fleet::{Fleet, Node};
pub use crate::quota::{quota_usage, Cohort, Holder, QuotaUse, Quotas};
pub use admission::quota_held;
pub use cluster::{extra_id, extra_of, Cluster, Running};
pub use config::{unknown_priority_class, Hints, Order, PriorityClasses, PriorityError, SchedulerConfig, UsageHistory, PRIORITY_CLASS_LABEL};
pub use decision::{waiting_text, Decision, Position, Request, KIND_BEHIND_RESERVATION, KIND_BLOCKED, KIND_CAPACITY, KIND_LENT, KIND_PREEMPTING, KIND_QUOTA, KIND_RECLAIM, KIND_RESERVED, KIND_SPOT};
pub use explain::{impossible_reason, rfc3339};
pub use preempt::next_change;
pub use grow::{extras as elastic_extras, growth, hold_extras, spread as spread_minimum};
use crate::capacity::{Need, NodeIx, Shape};
use crate::job::{secs, Job, Micros, Phase};
use crate::quota::Book;
use admission::may_borrow;
use fit::{remember, remember_long};
use order::{Positions, Queue};
use overcommit::schedule_overcommit;
use round::{Next, Round};

/// Decide for every job that waits for placement. `jobs` are the live (non-terminal)
/// jobs. Default settings, no hints.
pub fn schedule(jobs: &[&Job], fleet: &Fleet, quotas: &Quotas, now: Micros) -> Vec<Decision> {
    schedule_with(jobs, fleet, quotas, now, &SchedulerConfig::default(), &Hints::default())
}

/// `schedule` with settings and hints.
pub fn schedule_with(
    jobs: &[&Job],
    fleet: &Fleet,
    quotas: &Quotas,
    now: Micros,
    cfg: &SchedulerConfig,
    hints: &Hints,
) -> Vec<Decision> {
    let held = quota_held(jobs, quotas, cfg, now);
    if fleet.overcommit {
        return schedule_overcommit(jobs, fleet, quotas, &held, now, cfg);
    }
    let duration = |j: &Job| hints.expected_duration.get(&j.id).copied().unwrap_or(j.policy.timeout).max(1);
    let mut c = Cluster::new(fleet);
    for (project, h) in &hints.usage_history {
        c.set_history(project, h);
    }
    for j in jobs.iter().filter(|j| j.holds_capacity()) {
        let stopping = matches!(j.phase, Phase::Stopping { .. });
        // TY10: an elastic job's replicas above its minimum hold their room apart.
        let extras = if stopping { Vec::new() } else { grow::extras(j) };
        let placed: Vec<(NodeIx, Need)> = j
            .replicas
            .iter()
            .zip(&j.demand.replicas)
            .enumerate()
            .filter(|(i, (r, _))| r.state.is_live() && !extras.contains(i))
            .filter_map(|(_, (r, d))| Some((c.node(r.node.as_deref()?)?, c.table.need(d))))
            .collect();
        let start = j.admitted_at().unwrap_or(now);
        // A stopping job frees its capacity soon.
        let end = if stopping { now } else { start.saturating_add(duration(j)) };
        c.start(j.id, &j.project, j.policy.spot && !stopping, start, end, placed);
        // Preempted, cancelled, timed out or failed: what it holds is being freed, and a
        // preemption counts it before it chooses anyone (a job preempted for capacity that
        // a cancel frees a moment later loses its work for nothing).
        if stopping {
            c.mark_stopping(j.id);
        }
        hold_extras(&mut c, j, &extras, end, None, now);
        if cfg.priority_preemption && !stopping {
            // Preemptible for priority once it has run its minimum, a limited number of times.
            let min_run = secs(cfg.min_runtime_secs).max(j.policy.min_runtime);
            let preemptible = j.retries.preemptions < cfg.max_preemptions_per_job && now.saturating_sub(start) >= min_run;
            c.set_priority(j.id, j.policy.priority, preemptible, j.checkpoint.last_write.unwrap_or(start));
        }
    }
    let waiting: Vec<&Job> = jobs.iter().copied().filter(|j| j.wants_placement(now)).collect();
    // TY10: an elastic job is placed when its minimum fits; the rest grow into it.
    let minimums: Vec<Option<Vec<usize>>> =
        waiting.iter().map(|j| Some(j.minimum()).filter(|m| m.len() < j.replicas.len())).collect();
    let shapes: Vec<Shape> = waiting
        .iter()
        .zip(&minimums)
        .map(|(j, m)| match m {
            Some(m) => c.shape(&m.iter().map(|&i| j.demand.replicas[i].clone()).collect::<Vec<_>>()),
            None => c.shape(&j.demand.replicas),
        })
        .collect();
    let reqs: Vec<Request> = waiting
        .iter()
        .zip(&shapes)
        .map(|(j, shape)| Request {
            id: j.id,
            project: &j.project,
            submitted: j.create_time,
            admitted: !matches!(j.phase, Phase::Queued),
            spot: j.policy.spot,
            shape,
            metrics: &j.demand.metrics,
            duration: duration(j),
            priority: j.policy.priority,
            may_borrow: may_borrow(j, cfg, quotas),
            avoid: j.avoid_nodes.iter().filter_map(|n| c.node(n)).collect(),
        })
        .collect();
    let mut out = plan(&mut c, &reqs, quotas, &held, now, cfg);
    for d in &mut out {
        if let Decision::Place { job, nodes, .. } = d {
            if let Some((j, Some(m))) = waiting.iter().zip(&minimums).find(|(j, _)| j.id == *job) {
                *nodes = grow::spread(j.replicas.len(), m, std::mem::take(nodes));
            }
        }
    }
    // A job that can never fit: the reason in the job's own words (its pools).
    for d in &mut out {
        if let Decision::Impossible { job, reason } = d {
            if let Some(k) = waiting.iter().position(|j| j.id == *job) {
                if let Some(nf) = c.never_fits(&shapes[k]) {
                    *reason = impossible_reason(&c.table, waiting[k], &shapes[k], nf);
                }
            }
        }
    }
    out
}

/// The admission round on a capacity state: quota (L3), then the order (fair share or
/// FIFO), best-fit gang placement, EASY reservation and backfill, SPOT preemption, and
/// stockouts (L15). Pure: the decisions depend only on the arguments, and the cluster is
/// left exactly as it was. The round works on the cluster's own free capacity (trial
/// placements journaled, rolled back at the end) rather than on a copy: a copy of a large
/// fleet's capacity index costs more than the rest of a round.
pub fn plan<'r>(
    c: &mut Cluster,
    reqs: &'r [Request<'r>],
    quotas: &'r Quotas,
    quota_used: &'r QuotaUse,
    now: Micros,
    cfg: &SchedulerConfig,
) -> Vec<Decision> {
    let mut w = std::mem::take(&mut c.free);
    let scratch = std::mem::take(&mut c.scratch);
    let mark = w.mark();
    let c_ro: &Cluster = c;
    let mut q = Queue::build(c_ro, reqs, cfg, now);
    let mut book = Book::new(quotas, quota_used, cfg.priority_preemption);
    for r in reqs.iter().filter(|r| !r.admitted) {
        book.want(r.project, r.metrics);
    }
    let mut rd = Round::new(c_ro, w, scratch, cfg, now, book);
    let mut positions = Positions::new(reqs, cfg.order == Order::Fifo);
    while let Some((i, _fair)) = q.next(reqs) {
        let r = &reqs[i];
        let position = positions.next(r);
        if rd.decide(r, position, &mut q) == Next::Stop {
            break;
        }
    }
    let Round { out, w: work, scratch, .. } = rd;
    w = work;
    w.rollback(&c.table, mark);
    c.free = w;
    c.scratch = scratch;
    out
}

impl<'a, 'r> Round<'a, 'r> {
    /// One job's decision, in the order of the rules: its quota (L3), a strict order
    /// that is blocked, a place now, then (not placed) a shape that can never fit, SPOT's
    /// wait, preemption, a stockout (L15), a reservation, or a wait behind others.
    fn decide(
        &mut self,
        r: &'r Request<'r>,
        position: Option<Position>,
        q: &mut Queue,
    ) -> Next {
        if self.waits_for_quota(r, position) {
            return Next::Continue;
        }
        let spot_mode = r.spot && self.cfg.preemption;
        self.behind_higher = self.waiting_max.is_some_and(|m| m > r.priority);
        if self.blocked && !spot_mode {
            return self.behind_blocked(r, position, q.no_spot());
        }
        if let Some(nodes) = self.place_avoiding(r) {
            self.placed_now(r, &nodes, q);
            return Next::Continue;
        }
        let miss = match self.try_place(r) {
            Ok(nodes) => {
                self.placed_now(r, &nodes, q);
                return Next::Continue;
            }
            Err(miss) => miss,
        };
        if let Some(d) = self.impossible(r) {
            self.out.push(d);
            return Next::Continue;
        }
        if let Some((d, k)) = miss.uniform.filter(|_| !miss.skip) {
            if miss.long {
                remember_long(&mut self.failed_long, d, k, miss.end);
            } else {
                remember(&mut self.failed, d, k);
            }
        }
        if !spot_mode {
            self.waiting_max = Some(self.waiting_max.map_or(r.priority, |m| m.max(r.priority)));
        }
        if spot_mode {
            self.spot_waits(r, position);
        } else if !self.preempted_for(r, position, &miss, q) && !self.stockout(r) && !self.reserved_or_blocked(r, position) {
            self.waits_behind(r, position, &miss);
        }
        Next::Continue
    }
}
