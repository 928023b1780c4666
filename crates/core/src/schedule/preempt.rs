//! Stage 5, preemption: SPOT jobs for non-SPOT work, jobs of a lower priority class for
//! a higher one, and borrowers for a lender's quota, counting capacity already being freed
//! before choosing anyone; and when a round may decide differently with time alone.

use crate::collections::HashMap;
use crate::capacity::{Need, NodeIx, Res, NO_ACC};
use crate::job::{secs, Job, Micros, Phase};
use super::cluster::Running;
use super::config::SchedulerConfig;
use super::decision::{Decision, Position, Request, KIND_PREEMPTING, KIND_SPOT};
use super::explain::{counted, describe};
use super::order::Queue;
use super::reserve::limit_for;
use super::round::{Miss, Round};

/// A borrowing job preempted so that a project of its cohort gets its own quota back.
pub(super) fn reclaim_decision(job: u64) -> Decision {
    Decision::Preempt {
        job,
        reason: "its project ran on quota borrowed from its cohort, and a project that lent it needs it back".into(),
        by_priority: None,
        reclaim: true,
    }
}

/// When a round may decide differently with nothing else changed: the earliest time a
/// running job becomes one a waiting job may preempt (a SPOT job past
/// `spot_min_runtime_secs`, a job past `min_runtime_secs` for a higher class) or one a
/// lender may reclaim its quota from (`reclaim_after_secs`). None when no job waits or
/// nothing changes with time; the driver runs a round then.
pub fn next_change(jobs: &[&Job], cfg: &SchedulerConfig, now: Micros) -> Option<Micros> {
    if !jobs.iter().any(|j| j.wants_placement(now)) {
        return None;
    }
    let mut times = Vec::new();
    for j in jobs.iter().filter(|j| j.holds_capacity() && !matches!(j.phase, Phase::Stopping { .. })) {
        let start = j.admitted_at().unwrap_or(now);
        if cfg.preemption && j.policy.spot {
            times.push(start.saturating_add(secs(cfg.spot_min_runtime_secs)));
        }
        if cfg.priority_preemption {
            if j.retries.preemptions < cfg.max_preemptions_per_job {
                times.push(start.saturating_add(secs(cfg.min_runtime_secs).max(j.policy.min_runtime)));
            } else if j.holds_quota() {
                times.push(start.saturating_add(secs(cfg.reclaim_after_secs)));
            }
        }
    }
    times.into_iter().filter(|t| *t > now).min()
}

impl<'a, 'r> Round<'a, 'r> {
    /// The placements of the jobs that would be released, for the timeline and
    /// preemption: SPOT jobs (and stopping ones) at `now` when preemption is on.
    pub(super) fn release_now(&self) -> impl Iterator<Item = (u64, &'a Running)> + '_ {
        let c = self.c;
        let spot_on = self.cfg.preemption;
        let stopping_on = self.cfg.preemption || self.cfg.priority_preemption;
        // TY10: elastic replicas above their minimum give way first, preemption or not.
        c.extras
            .iter()
            .chain(c.spot.iter().filter(move |_| spot_on))
            .chain(c.stopping.iter().filter(move |_| stopping_on))
            .filter(|id| !self.chosen.contains(id))
            .filter_map(move |id| Some((*id, c.running.get(id)?)))
    }

    /// Free `r`'s room by preempting the cheapest set of SPOT jobs (or by claiming the
    /// room of jobs already stopping for a preemption). Returns the jobs to preempt and
    /// the stopping jobs waited for.
    fn preempt_for(&mut self, r: &Request, limit: Option<&HashMap<NodeIx, Res>>) -> Option<(Vec<u64>, Vec<u64>)> {
        let c = self.c;
        let t = &c.table;
        let min_run = secs(self.cfg.spot_min_runtime_secs);
        // Lost work (resources x time since it was last saved), so the youngest and
        // smallest go first; jobs already stopping cost nothing. SPOT jobs go before jobs
        // of a lower priority class.
        let lost = |run: &Running, since: Micros| {
            let units: i64 = run.placed.iter().map(|(_, d)| if d.acc_type == NO_ACC { d.cpus } else { d.acc * 1000 }).sum();
            1 + units.max(1) as u128 * (self.now - since).max(0) as u128
        };
        let mut cands: Vec<(u8, u128, u64, &Running)> = self
            .release_now()
            .filter(|(_, run)| run.stopping || run.extra || self.now.saturating_sub(run.start) >= min_run)
            .map(|(id, run)| match run.extra {
                // TY10: an elastic job's extra replicas before any other victim.
                true => (0, lost(run, run.start), id, run),
                false => (1, if run.stopping { 0 } else { lost(run, run.start) }, id, run),
            })
            .collect();
        if self.cfg.priority_preemption && !r.spot {
            let lower = c
                .running
                .iter()
                .filter(|(id, run)| !run.spot && !run.stopping && run.preemptible && run.priority < r.priority && !self.chosen.contains(*id))
                .filter(|(_, run)| !run.extra)
                .map(|(id, run)| (2, lost(run, run.lost_since), *id, run));
            cands.extend(lower);
        }
        if cands.is_empty() {
            return None;
        }
        let m0 = self.w.mark();
        for (_, _, _, run) in &cands {
            for (n, d) in &run.placed {
                self.w.give(t, *n, d);
            }
        }
        let fits_all = self.w.place_gang(t, r.shape, limit).is_some();
        self.w.rollback(t, m0);
        if !fits_all {
            return None;
        }
        cands.sort_by_key(|(tier, cost, id, run)| (*tier, *cost, std::cmp::Reverse(run.start), *id));
        let uniform = r.shape.uniform.then(|| (r.shape.needs[0], r.shape.needs.len() as i64));
        let mut k = 0;
        while k < cands.len() {
            for (n, d) in &cands[k].3.placed {
                self.w.give(t, *n, d);
            }
            k += 1;
            if uniform.is_some_and(|(d, cnt)| self.w.slot_bound(t, &d) < cnt) {
                continue;
            }
            let m1 = self.w.mark();
            let ok = self.w.place_gang(t, r.shape, limit).is_some();
            self.w.rollback(t, m1);
            if ok {
                break;
            }
        }
        let mut set: Vec<usize> = (0..k).collect();
        // Drop what is not needed, most expensive first.
        if set.len() <= 64 {
            for j in (0..set.len()).rev() {
                self.w.rollback(t, m0);
                for (x, &s) in set.iter().enumerate() {
                    if x != j {
                        for (n, d) in &cands[s].3.placed {
                            self.w.give(t, *n, d);
                        }
                    }
                }
                let m1 = self.w.mark();
                let ok = self.w.place_gang(t, r.shape, limit).is_some();
                self.w.rollback(t, m1);
                if ok {
                    set.remove(j);
                }
            }
        }
        self.w.rollback(t, m0);
        let mut before: HashMap<NodeIx, (i64, i64, i64)> = HashMap::default();
        for &s in &set {
            for (n, _) in &cands[s].3.placed {
                let i = *n as usize;
                before.entry(*n).or_insert((self.w.cpus[i], self.w.mem[i], self.w.acc[i]));
            }
        }
        for &s in &set {
            for (n, d) in &cands[s].3.placed {
                self.w.give(t, *n, d);
            }
        }
        // The job's claim: free now where it fits now, else the room the stopping SPOT
        // jobs will leave. Nothing still held is handed to anyone else.
        let m2 = self.w.mark();
        let nodes = self.w.place_gang(t, r.shape, limit);
        self.w.rollback(t, m2);
        let Some(nodes) = nodes else {
            self.w.rollback(t, m0);
            return None;
        };
        for (n, d) in nodes.iter().zip(&r.shape.needs) {
            let i = *n as usize;
            before.entry(*n).or_insert((self.w.cpus[i], self.w.mem[i], self.w.acc[i]));
            self.w.take(t, *n, d);
        }
        let mut before: Vec<(NodeIx, (i64, i64, i64))> = before.into_iter().collect();
        before.sort_unstable_by_key(|(n, _)| *n);
        for (n, (c0, m0, a0)) in before {
            let i = n as usize;
            let (c1, m1, a1) = (self.w.cpus[i], self.w.mem[i], self.w.acc[i]);
            self.w.set(t, n, c0.min(c1), m0.min(m1), a0.min(a1));
        }
        let claimed: Vec<(NodeIx, Need)> = nodes.iter().copied().zip(r.shape.needs.iter().copied()).collect();
        self.placed.push((self.now.saturating_add(r.duration), claimed));
        let mut preempt = Vec::new();
        let mut stopping = Vec::new();
        for &s in &set {
            let (_, _, id, run) = cands[s];
            self.chosen.insert(id);
            if run.stopping {
                stopping.push(id);
            } else {
                preempt.push(id);
            }
        }
        Some((preempt, stopping))
    }

    /// A SPOT job waits for idle capacity (it never preempts or reserves).
    pub(super) fn spot_waits(&mut self, r: &Request, position: Option<Position>) {
        if !self.cfg.explain {
            return;
        }
        let why = if self.fits_empty(r.shape) {
            "SPOT job waiting for idle capacity".to_string()
        } else {
            format!("SPOT job waiting: the usable fleet cannot hold it ({})", self.stockout_detail())
        };
        let reason = format!("{why}: needs {}", describe(&self.c.table, r.shape)).into();
        self.out.push(Decision::Wait { job: r.id, kind: KIND_SPOT, reason, position, reserved_at: None });
    }

    /// Preemption: SPOT jobs stopped for it (within the round's tries); it waits for
    /// them to stop, its place claimed meanwhile.
    pub(super) fn preempted_for(&mut self, r: &'r Request<'r>, position: Option<Position>, miss: &Miss, q: &mut Queue) -> bool {
        let c = self.c;
        let by_priority = self.cfg.priority_preemption && !r.spot && c.running.values().any(|run| run.preemptible && run.priority < r.priority);
        let extras = !r.spot && !c.extras.is_empty();
        if self.preempt_tries >= self.cfg.max_preemption_tries
            || !(by_priority || extras || (self.cfg.preemption && !(c.spot.is_empty() && c.stopping.is_empty())))
        {
            return false;
        }
        self.preempt_tries += 1;
        let slack = if miss.long { limit_for(&self.resvs, miss.end).map(std::borrow::Cow::into_owned) } else { None };
        let Some((victims, stopping)) = self.preempt_for(r, slack.as_ref()) else { return false };
        self.memo.clear();
        let held = self.placed.last().map(|p| p.1.clone()).unwrap_or_default();
        // What it claims on reserved nodes is slack no later job may take again.
        self.charge_placed(r, &held, q);
        let lower = victims.iter().filter(|v| c.running.get(v).is_some_and(|run| !run.spot && !run.extra)).count();
        let extra = victims.iter().filter(|v| c.running.get(v).is_some_and(|run| run.extra)).count();
        for v in &victims {
            let by_priority = c.running.get(v).is_some_and(|run| !run.spot && !run.extra).then_some(r.priority);
            let reason = match by_priority {
                Some(p) => format!("its capacity is needed by a job of priority {p}"),
                None => "its capacity is needed by work that waits for it".to_string(),
            };
            self.out.push(Decision::Preempt { job: *v, reason, by_priority, reclaim: false });
        }
        if self.cfg.explain {
            // Each job by what it is: SPOT (preempted now or stopping), of a lower class
            // (preempted now), or already stopping for an earlier preemption.
            let spot = victims.iter().chain(&stopping).filter(|v| c.running.get(v).is_some_and(|run| run.spot)).count();
            let earlier = stopping.iter().filter(|v| c.running.get(v).is_some_and(|run| !run.spot)).count();
            let mut parts = Vec::new();
            if spot > 0 {
                parts.push(counted(spot, "SPOT job", "SPOT jobs"));
            }
            if lower > 0 {
                parts.push(counted(lower, "job of a lower priority", "jobs of a lower priority"));
            }
            if extra > 0 {
                parts.push(counted(extra, "elastic job's extra replica", "elastic jobs' extra replicas"));
            }
            let verb = if spot + lower + extra == 1 { "is" } else { "are" };
            let stopping_already = counted(earlier, "job that is stopping already", "jobs that are stopping already");
            let reason = match (parts.is_empty(), earlier > 0) {
                (true, _) => format!("Waiting for capacity being freed: {stopping_already} will free what it needs; it starts when they have stopped"),
                (false, false) => format!(
                    "Waiting for capacity held by other jobs: {} {verb} being preempted for it; it starts when they have stopped",
                    parts.join(" and ")
                ),
                (false, true) => format!(
                    "Waiting for capacity held by other jobs: {} {verb} being preempted for it, and {stopping_already} will free the rest; \
                     it starts when they have stopped",
                    parts.join(" and ")
                ),
            };
            self.out.push(Decision::Wait { job: r.id, kind: KIND_PREEMPTING, reason: reason.into(), position, reserved_at: None });
        }
        true
    }
}
