//! Stage 2, ordering: the priority classes from the highest down; in each, jobs that
//! already hold quota, then jobs past the starvation bound (oldest first), then fair share
//! (lowest weighted dominant share first, FIFO within a project) or FIFO, then SPOT jobs.
//! And where a job stands among its own project's waiting jobs.

use crate::collections::HashMap;
use crate::capacity::{Need, NodeIx};
use crate::job::{secs, Micros};
use super::cluster::{add_dims, Cluster};
use super::config::{Order, SchedulerConfig};
use super::decision::{Position, Request};
use super::round::Round;

struct Proj<'a> {
    name: &'a str,
    usage: Vec<i64>,
    weight: f64,
    share: f64,
    queue: Vec<usize>,
    next: usize,
}

/// The order in which waiting jobs are considered: the priority classes from the highest
/// value down, each a [`Level`].
pub(super) struct Queue<'a> {
    levels: Vec<Level<'a>>,
    at: usize,
}

impl<'a> Queue<'a> {
    pub(super) fn build(c: &Cluster, reqs: &[Request<'a>], cfg: &SchedulerConfig, now: Micros) -> Queue<'a> {
        let mut values: Vec<i64> = reqs.iter().map(|r| r.priority).collect();
        values.sort_unstable_by(|a, b| b.cmp(a));
        values.dedup();
        let levels = values.into_iter().map(|v| Level::build(c, reqs, cfg, now, v)).collect();
        Queue { levels, at: 0 }
    }

    pub(super) fn next(&mut self, reqs: &[Request]) -> Option<(usize, bool)> {
        while let Some(level) = self.levels.get_mut(self.at) {
            if let Some(next) = level.next(reqs) {
                return Some(next);
            }
            self.at += 1;
        }
        None
    }

    /// No SPOT job is in the round (strict order may stop at a blocked job).
    pub(super) fn no_spot(&self) -> bool {
        self.levels.iter().all(|l| l.spot.is_empty())
    }
}

/// The jobs of one priority value in the order they are considered: jobs that already
/// hold quota, then starving jobs (oldest first), then the fair order (lowest weighted
/// dominant share first; it changes as jobs are placed) or FIFO, then SPOT jobs.
struct Level<'a> {
    lists: [Vec<usize>; 3],
    list: usize,
    at: usize,
    projects: Vec<Proj<'a>>,
    spot: Vec<usize>,
    spot_at: usize,
}

impl Level<'_> {
    pub(super) fn next(&mut self, reqs: &[Request]) -> Option<(usize, bool)> {
        while self.list < 3 {
            if let Some(&i) = self.lists[self.list].get(self.at) {
                self.at += 1;
                return Some((i, false));
            }
            self.list += 1;
            self.at = 0;
        }
        let mut best: Option<(usize, (f64, Micros, u64))> = None;
        for (p, pr) in self.projects.iter().enumerate() {
            if let Some(&i) = pr.queue.get(pr.next) {
                let key = (pr.share, reqs[i].submitted, reqs[i].id);
                if best.as_ref().is_none_or(|(_, b)| key.partial_cmp(b) == Some(std::cmp::Ordering::Less)) {
                    best = Some((p, key));
                }
            }
        }
        if let Some((p, _)) = best {
            let pr = &mut self.projects[p];
            pr.next += 1;
            return Some((pr.queue[pr.next - 1], true));
        }
        let i = *self.spot.get(self.spot_at)?;
        self.spot_at += 1;
        Some((i, false))
    }
}

/// Positions among a job's own project's waiting jobs: a waiting reason says nothing of
/// other projects' queues.
pub(super) struct Positions<'r> {
    totals: HashMap<&'r str, u32>,
    seen: HashMap<&'r str, u32>,
    fifo: bool,
}

impl<'r> Positions<'r> {
    pub(super) fn new(reqs: &'r [Request], fifo: bool) -> Positions<'r> {
        let mut totals: HashMap<&str, u32> = HashMap::default();
        for r in reqs {
            *totals.entry(r.project).or_default() += 1;
        }
        Positions { totals, seen: HashMap::default(), fifo }
    }

    pub(super) fn next(&mut self, r: &Request<'r>) -> Option<Position> {
        let pos = self.seen.entry(r.project).or_default();
        *pos += 1;
        Some(Position { pos: *pos, total: self.totals.get(r.project).copied().unwrap_or(*pos), fifo: self.fifo })
    }
}

/// The lists of [`Level`]: jobs admitted before (they go first), jobs past the
/// starvation bound, and FIFO's one list; fair share's per-project queues come after.
const ADMITTED: usize = 0;
const STARVING: usize = 1;
pub(super) const FIFO: usize = 2;

impl<'a> Level<'a> {
    /// The order of the jobs of priority `value`: admitted jobs, then jobs past the
    /// starvation bound (ahead of the fair-share order; their waiting reasons say so), then
    /// FIFO or each project's queue by fair share; SPOT jobs (with preemption) on a list of
    /// their own.
    pub(super) fn build(c: &Cluster, reqs: &[Request<'a>], cfg: &SchedulerConfig, now: Micros, value: i64) -> Level<'a> {
        let mut q = Level { lists: [Vec::new(), Vec::new(), Vec::new()], list: 0, at: 0, projects: Vec::new(), spot: Vec::new(), spot_at: 0 };
        let mut pidx: HashMap<&str, usize> = HashMap::default();
        let starve = cfg.starvation_secs.map(|s| now.saturating_sub(secs(s)));
        for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.priority == value) {
            if r.spot && cfg.preemption {
                q.spot.push(i);
            } else if r.admitted {
                q.lists[ADMITTED].push(i);
            } else if cfg.order == Order::Fifo {
                q.lists[FIFO].push(i);
            } else if starve.is_some_and(|s| r.submitted <= s) {
                q.lists[STARVING].push(i);
            } else {
                let p = *pidx.entry(r.project).or_insert_with(|| {
                    let usage = c.usage.get(r.project).cloned().unwrap_or_else(|| vec![0; c.totals.len()]);
                    let weight = cfg.weight(r.project);
                    let share = c.share(r.project, &usage, weight);
                    q.projects.push(Proj { name: r.project, usage, weight, share, queue: Vec::new(), next: 0 });
                    q.projects.len() - 1
                });
                q.projects[p].queue.push(i);
            }
        }
        let key = |&i: &usize| (reqs[i].submitted, reqs[i].id);
        for l in &mut q.lists {
            l.sort_by_key(key);
        }
        for p in &mut q.projects {
            p.queue.sort_by_key(key);
        }
        q.spot.sort_by_key(|&i| (!reqs[i].admitted, reqs[i].submitted, reqs[i].id));
        q
    }
}

/// The project's share grows with what the job takes (DRF), changing the fair order.
/// Starving and re-placed jobs count too, for the jobs after them.
pub(super) fn charge(q: &mut Queue, r: &Request, held: &[(NodeIx, Need)], c: &Cluster) {
    // The project's share in every priority level it has jobs in.
    for level in &mut q.levels {
        if let Some(p) = level.projects.iter_mut().find(|p| p.name == r.project) {
            for (_, d) in held {
                add_dims(&mut p.usage, d, 1);
            }
            p.share = c.share(p.name, &p.usage, p.weight);
        }
    }
}

impl<'a, 'r> Round<'a, 'r> {
    /// Past the starvation bound: it goes ahead of the fair-share order.
    pub(super) fn starving(&self, r: &Request) -> bool {
        let cfg = self.cfg;
        cfg.order != Order::Fifo
            && !r.admitted
            && !(r.spot && cfg.preemption)
            && cfg.starvation_secs.is_some_and(|s| r.submitted <= self.now.saturating_sub(secs(s)))
    }
}
