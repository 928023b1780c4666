//! Stage 4, reservations and backfill: when and where a job that does not fit will fit
//! if running jobs end as expected (EASY's reservation, one for each starving job up to
//! `max_reservations`), and what a later job may take without delaying any of them.

use crate::collections::{HashMap, HashSet};
use crate::capacity::{slots, Need, NodeIx, NodeTable, Res, Work, NO_ACC};
use crate::job::Micros;
use super::cluster::Scratch;
use super::decision::{Decision, Position, Request, KIND_BLOCKED, KIND_CAPACITY, KIND_RESERVED};
use super::explain::{counted, describe, node_list, starving_note};
use super::round::{Memo, Next, Resv, Round};

/// What a job that would still run at `end` may take on reserved nodes: per node, the
/// least slack of the reservations due before `end` (the ones it could delay). None when
/// it could delay none of them.
pub(super) fn limit_for(resvs: &[Resv], end: Micros) -> Option<std::borrow::Cow<'_, HashMap<NodeIx, Res>>> {
    let mut due = resvs.iter().filter(|v| end > v.time);
    let first = due.next()?;
    let mut rest = due.peekable();
    if rest.peek().is_none() {
        return Some(std::borrow::Cow::Borrowed(&first.slack));
    }
    let mut m = first.slack.clone();
    for v in rest {
        for (n, s) in &v.slack {
            m.entry(*n).and_modify(|e| *e = e.min(*s)).or_insert(*s);
        }
    }
    Some(std::borrow::Cow::Owned(m))
}

/// A job ending at `end` took `held`: the reservations due before `end` have that much
/// less slack on those nodes, so no later job can take it again.
pub(super) fn use_slack(resvs: &mut [Resv], end: Micros, held: &[(NodeIx, Need)]) {
    for v in resvs.iter_mut().filter(|v| end > v.time) {
        for (n, d) in held {
            if let Some(s) = v.slack.get_mut(n) {
                *s -= d.res();
            }
        }
    }
}

/// Capacity the timeline of a reservation releases: a job's replicas, or an earlier
/// reservation's nodes (so many replicas of its need on each).
#[derive(Clone, Copy)]
enum Placed<'a> {
    Each(&'a [(NodeIx, Need)]),
    Reserved(&'a Resv),
}

/// The free capacity a reservation is computed on: the round's, with the nodes that
/// changed (the holds of earlier reservations, the capacity the timeline releases) kept
/// in the scratch space.
pub(super) struct View<'w> {
    w: &'w Work,
    t: &'w NodeTable,
    need: Need,
    s: &'w mut Scratch,
}

impl<'w> View<'w> {
    pub(super) fn new(w: &'w Work, t: &'w NodeTable, need: Need, s: &'w mut Scratch) -> View<'w> {
        s.reset(t.len());
        View { w, t, need, s }
    }

    pub(super) fn get(&self, n: NodeIx) -> (i64, i64, i64) {
        let i = n as usize;
        if self.s.stamp[i] == self.s.current {
            let (c, m, a, _) = self.s.vals[i];
            (c, m, a)
        } else {
            (self.w.cpus[i], self.w.mem[i], self.w.acc[i])
        }
    }

    /// Replicas of the need that fit on `n` in this view.
    pub(super) fn slots(&self, n: NodeIx) -> i64 {
        let (c, m, a) = self.get(n);
        slots(c, m, a, self.t.acc_type[n as usize], &self.need)
    }

    /// Add to a node's free amounts (negative: hold); true when this is the first
    /// release on it.
    fn add(&mut self, n: NodeIx, cpus: i64, mem: i64, acc: i64) -> bool {
        let (c, m, a) = self.get(n);
        let i = n as usize;
        let was = self.s.stamp[i] == self.s.current && self.s.vals[i].3;
        let release = cpus > 0 || mem > 0 || acc > 0;
        self.s.stamp[i] = self.s.current;
        self.s.vals[i] = (c + cpus, m + mem, a + acc, was || release);
        release && !was
    }

    pub(super) fn released(&self, n: NodeIx) -> bool {
        let i = n as usize;
        self.s.stamp[i] == self.s.current && self.s.vals[i].3
    }
}

impl<'a, 'r> Round<'a, 'r> {
    /// EASY: when will `r` fit, and on which nodes, if running jobs end as expected?
    /// Works on a sparse view of the round's free capacity (only the nodes that earlier
    /// reservations hold or that the timeline releases are copied), so that its cost
    /// follows the nodes it looks at, not the fleet's size: a round may make up to
    /// `max_reservations` of them.
    pub(super) fn reserve(&mut self, r: &Request) -> Option<Resv> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let made = self.reserve_on(r, &mut scratch);
        self.scratch = scratch;
        made
    }

    fn reserve_on(&self, r: &Request, scratch: &mut Scratch) -> Option<Resv> {
        let c = self.c;
        let t = &c.table;
        let need = r.shape.max_need();
        let count = r.shape.needs.len() as i64;
        let mut view = View::new(&self.w, t, need, scratch);
        // Earlier reservations hold their capacity from now until their expected end:
        // this one is then placed around them and cannot delay them. Counting it as held
        // from now (not from their start) can only make this reservation later, never
        // conflict with theirs.
        for v in &self.resvs {
            for &(n, k) in &v.nodes {
                let acc = if v.need.acc_type != NO_ACC { k * v.need.acc } else { 0 };
                view.add(n, -k * v.need.cpus, -k * v.need.mem, acc.saturating_neg());
            }
        }
        // Only the candidates can hold a replica: holds only take capacity away.
        let candidates = self.w.candidates(t, &need);
        let mut total: i64 = candidates.iter().map(|&n| view.slots(n)).sum();
        let mut touched: Vec<NodeIx> = Vec::new();
        let mut release_one = |view: &mut View, n: NodeIx, d: &Need, k: i64, total: &mut i64| {
            if !t.usable[n as usize] {
                return;
            }
            let before = view.slots(n);
            let acc = if d.acc_type != NO_ACC { k * d.acc } else { 0 };
            if view.add(n, k * d.cpus, k * d.mem, acc) {
                touched.push(n);
            }
            *total += view.slots(n) - before;
        };
        let mut release = |view: &mut View, placed: Placed, total: &mut i64| match placed {
            Placed::Each(placed) => placed.iter().for_each(|(n, d)| release_one(view, *n, d, 1, total)),
            Placed::Reserved(v) => v.nodes.iter().for_each(|(n, k)| release_one(view, *n, &v.need, *k, total)),
        };
        let mut time = self.now;
        if total < count {
            let mut done = false;
            let early: HashSet<u64> = self.release_now().map(|(id, _)| id).collect();
            for (_, run) in self.release_now() {
                release(&mut view, Placed::Each(&run.placed), &mut total);
            }
            if total >= count {
                done = true;
            }
            // This round's placements and earlier reservations free at their expected ends.
            let mut mine: Vec<(Micros, Placed)> = self.placed.iter().map(|p| (p.0, Placed::Each(&p.1))).collect();
            mine.extend(self.resvs.iter().map(|v| (v.end, Placed::Reserved(v))));
            mine.sort_by_key(|p| p.0);
            let mut mine = mine.into_iter().peekable();
            let mut theirs = c.by_end.iter().filter(|(_, id)| !early.contains(id) && !self.chosen.contains(id)).peekable();
            while !done {
                let take_mine = match (mine.peek(), theirs.peek()) {
                    (Some(a), Some(b)) => a.0 <= b.0,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let (end, placed) = if take_mine {
                    mine.next().expect("peeked")
                } else {
                    let (end, id) = theirs.next().expect("peeked");
                    match c.running.get(id) {
                        Some(run) => (*end, Placed::Each(&run.placed)),
                        None => continue,
                    }
                };
                release(&mut view, placed, &mut total);
                if total >= count {
                    time = end.max(self.now);
                    done = true;
                }
            }
            if !done {
                return None;
            }
        }
        // Reserve nodes that free up first (so nodes free now stay open to backfill),
        // then nodes free now, by index.
        let mut left = count;
        let mut nodes = Vec::new();
        let mut slack = HashMap::default();
        let mut take = |n: NodeIx, left: &mut i64| {
            let k = view.slots(n).min(*left);
            if k > 0 {
                *left -= k;
                nodes.push((n, k));
                let held = need.res();
                let (pc, pm, pa) = view.get(n);
                slack.insert(n, Res::new(pc - k * held.cpus, pm - k * held.mem, pa - k * held.acc));
            }
        };
        for &n in &touched {
            if left == 0 {
                break;
            }
            take(n, &mut left);
        }
        if left > 0 {
            let mut rest: Vec<NodeIx> = candidates.into_iter().filter(|n| !view.released(*n)).collect();
            rest.sort_unstable();
            for n in rest {
                if left == 0 {
                    break;
                }
                take(n, &mut left);
            }
        }
        if left > 0 {
            // The slots counted above are not all usable at once (earlier reservations'
            // holds were released into the count): no reservation this round.
            return None;
        }
        Some(Resv { time, nodes, slack, need, end: time.saturating_add(r.duration) })
    }

    /// EASY's head (the first job that does not fit) holds a reservation, and so does
    /// every job past the starvation bound (up to `max_reservations`), each placed around
    /// the ones before it; without backfill the head blocks the rest of the round.
    pub(super) fn reserved_or_blocked(&mut self, r: &Request, position: Option<Position>) -> bool {
        let cfg = self.cfg;
        let protect = r.admitted || self.starving(r);
        if self.blocked || !(self.resvs.is_empty() || (protect && cfg.backfill && self.resvs.len() < cfg.max_reservations)) {
            return false;
        }
        let t = &self.c.table;
        if !cfg.backfill {
            self.blocked = true;
            self.memo.clear();
            if cfg.explain {
                let reason = format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape)).into();
                self.out.push(Decision::Wait { job: r.id, kind: KIND_CAPACITY, reason, position, reserved_at: None });
            }
            return true;
        }
        let made = self.reserve(r);
        let reserved = made.is_some();
        if let Some(v) = made {
            self.resvs.push(v);
        }
        self.memo.clear();
        if cfg.explain {
            let mut reason = match self.resvs.last().filter(|_| reserved) {
                // No time: it would rest on other jobs' time limits (another project's
                // among them), which a waiting reason does not tell.
                Some(v) => format!(
                    "Waiting for capacity held by other jobs: needs {}. Reserved: {} ({}) {} held for it as they free; \
                     smaller jobs may start first only if they cannot delay it",
                    describe(t, r.shape),
                    counted(v.nodes.len(), "node", "nodes"),
                    node_list(t, &v.nodes),
                    if v.nodes.len() == 1 { "is" } else { "are" },
                ),
                None => format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape)),
            };
            if self.starving(r) {
                reason.push_str(&starving_note(cfg));
            }
            let kind = if reserved { KIND_RESERVED } else { KIND_CAPACITY };
            let reserved_at = self.resvs.last().filter(|_| reserved).map(|v| v.time);
            self.out.push(Decision::Wait { job: r.id, kind, reason: reason.into(), position, reserved_at });
        }
        true
    }

    /// Strict order (no backfill): nothing passes the first job that does not fit.
    pub(super) fn behind_blocked(&mut self, r: &Request, position: Option<Position>, no_spot: bool) -> Next {
        if let Some(d) = self.impossible(r) {
            self.out.push(d);
            return Next::Continue;
        }
        if !self.cfg.explain {
            return if no_spot { Next::Stop } else { Next::Continue };
        }
        let reason = self.memo(Memo::Blocked, |_| {
            "Waiting for capacity held by other jobs: a job ahead of it does not fit yet, and nothing passes it (no backfill)".to_string()
        });
        let reason = self.with_priority_note(reason);
        self.out.push(Decision::Wait { job: r.id, kind: KIND_BLOCKED, reason, position, reserved_at: None });
        Next::Continue
    }
}
