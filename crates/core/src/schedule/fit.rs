//! Stage 3, feasibility and fit: whether a job can ever fit (else it fails), a place
//! for the whole gang now (best fit, all or nothing, away from nodes it failed on, never
//! delaying a reservation), and the stockout (L15) when the fleet itself falls short.

use crate::capacity::{slots, Need, NeverFit, NodeIx, Shape, Work, PLACE_SEARCH_BUDGET};
use crate::job::Micros;
use super::decision::{Decision, Request};
use super::explain::describe;
use super::order::{charge, Queue};
use super::reserve::{limit_for, use_slack};
use super::round::{Miss, Round};

fn dominated(list: &[(Need, usize)], need: &Need, count: usize) -> bool {
    list.iter().any(|(n, k)| need.covers(n) && count >= *k)
}

/// A job ending at `end` is bound by every reservation an earlier failure ending no later
/// was bound by (reservations are only added within a round, and slack only shrinks).
fn dominated_long(list: &[(Need, usize, Micros)], need: &Need, count: usize, end: Micros) -> bool {
    list.iter().any(|(n, k, e)| need.covers(n) && count >= *k && end >= *e)
}

pub(super) fn remember_long(list: &mut Vec<(Need, usize, Micros)>, need: Need, count: usize, end: Micros) {
    if dominated_long(list, &need, count, end) {
        return;
    }
    list.retain(|(n, k, e)| !(n.covers(&need) && *k >= count && *e >= end));
    list.push((need, count, end));
}

pub(super) fn remember(list: &mut Vec<(Need, usize)>, need: Need, count: usize) {
    if dominated(list, &need, count) {
        return;
    }
    list.retain(|(n, k)| !(n.covers(&need) && *k >= count));
    list.push((need, count));
}

impl<'a, 'r> Round<'a, 'r> {
    /// A job that can never fit, not even on the whole fleet up and empty, fails instead
    /// of waiting (for quota or capacity) or being retried as a stockout. Asked only of
    /// jobs that are not placed.
    pub(super) fn impossible(&mut self, r: &Request) -> Option<Decision> {
        let nf = self.never_fits(r.shape)?;
        let t = &self.c.table;
        let reason = format!(
            "The job can never be placed on this fleet, not even with every node up and free: {} {}.",
            match nf {
                NeverFit::Replica(i) => format!("replica {i}"),
                NeverFit::Gang => format!("its {}", describe(t, r.shape)),
            },
            nf.detail(t, r.shape, &|_| None),
        );
        Some(Decision::Impossible { job: r.id, reason })
    }

    /// `Cluster::never_fits`, once per shape and round.
    pub(super) fn never_fits(&mut self, shape: &Shape) -> Option<NeverFit> {
        if shape.needs.is_empty() {
            return None;
        }
        if shape.uniform {
            let key = (shape.needs[0], shape.needs.len());
            if let Some(&v) = self.never_uniform.get(&key) {
                return v;
            }
            let v = self.c.never_fits(shape);
            self.never_uniform.insert(key, v);
            return v;
        }
        if let Some(&v) = self.never_mixed.get(shape.needs.as_slice()) {
            return v;
        }
        let v = self.c.never_fits(shape);
        self.never_mixed.insert(shape.needs.clone(), v);
        v
    }

    pub(super) fn fits_empty(&mut self, shape: &Shape) -> bool {
        let t = &self.c.table;
        if shape.needs.is_empty() {
            return true;
        }
        if shape.uniform {
            let key = (shape.needs[0], shape.needs.len());
            if let Some(&f) = self.empty_fit.get(&key) {
                return f;
            }
            let d = &shape.needs[0];
            let mut total = 0i64;
            for i in 0..t.len() {
                if t.usable[i] {
                    total += slots(t.cap_cpus[i], t.cap_mem[i], t.cap_acc[i], t.acc_type[i], d);
                    if total >= key.1 as i64 {
                        break;
                    }
                }
            }
            let f = total >= key.1 as i64;
            self.empty_fit.insert(key, f);
            return f;
        }
        if let Some(&f) = self.empty_fit_mixed.get(shape.needs.as_slice()) {
            return f;
        }
        let f = Work::new(t).place_gang_exact(t, shape, None, PLACE_SEARCH_BUDGET).is_some();
        self.empty_fit_mixed.insert(shape.needs.clone(), f);
        f
    }

    /// A place for the whole gang now. Backfill must not delay any reservation: a job
    /// that would still run when one is due takes only what that reservation leaves on
    /// its nodes (SPOT jobs too, else they would be placed on the reserved room only to
    /// be preempted when it is due); one that ends before every reservation goes on
    /// reserved nodes first, so that nodes nobody waits for stay open to longer jobs.
    pub(super) fn try_place(&mut self, r: &Request) -> Result<Vec<NodeIx>, Miss> {
        let t = &self.c.table;
        let end = self.now.saturating_add(r.duration);
        let long = self.resvs.iter().any(|v| end > v.time);
        let uniform = r.shape.uniform.then(|| (r.shape.needs[0], r.shape.needs.len()));
        let skip = uniform.is_some_and(|(d, k)| {
            dominated(&self.failed, &d, k) || (long && dominated_long(&self.failed_long, &d, k, end)) || self.w.slot_bound(t, &d) < k as i64
        });
        // A mixed gang that found no room earlier in the round finds none now either:
        // free capacity only shrinks within a round.
        let failed_before =
            self.failed_mixed.get(r.shape.needs.as_slice()).is_some_and(|f| f.0 || (long && f.1.is_some_and(|e| end >= e)));
        let skip = skip || (!r.shape.uniform && failed_before);
        let miss = Miss { skip, end, long, uniform };
        if skip {
            return Err(miss);
        }
        let limit = if long { limit_for(&self.resvs, end) } else { None };
        let mut placed = if !long && !self.resvs.is_empty() {
            let prefer: Vec<NodeIx> = self.resvs.iter().flat_map(|v| v.nodes.iter().map(|(n, _)| *n)).collect();
            self.w.place_gang_prefer(t, r.shape, None, &prefer)
        } else {
            self.w.place_gang(t, r.shape, limit.as_deref())
        };
        if placed.is_none() && !r.shape.uniform {
            // The greedy passes can miss a packing of a mixed gang: search for one.
            placed = self.w.place_gang_exact(t, r.shape, limit.as_deref(), PLACE_SEARCH_BUDGET);
        }
        drop(limit);
        match placed {
            Some(nodes) => Ok(nodes),
            None => {
                if !r.shape.uniform {
                    let f = self.failed_mixed.entry(r.shape.needs.clone()).or_default();
                    if long {
                        f.1 = Some(f.1.map_or(end, |e| e.min(end)));
                    } else {
                        f.0 = true;
                    }
                }
                Err(miss)
            }
        }
    }

    /// A place for a job whose replicas failed on some nodes, on other nodes: tried first
    /// (bound by the reservations as any placement is); None sends it to the usual
    /// placement, where those nodes count again.
    pub(super) fn place_avoiding(&mut self, r: &Request) -> Option<Vec<NodeIx>> {
        if r.avoid.is_empty() {
            return None;
        }
        let t = &self.c.table;
        let end = self.now.saturating_add(r.duration);
        let long = self.resvs.iter().any(|v| end > v.time);
        let limit = if long { limit_for(&self.resvs, end) } else { None };
        let m = self.w.mark();
        for &n in r.avoid.iter().filter(|n| (**n as usize) < t.len()) {
            self.w.set(t, n, 0, 0, 0);
        }
        let placed = self.w.place_gang(t, r.shape, limit.as_deref());
        drop(limit);
        self.w.rollback(t, m);
        let nodes = placed?;
        for (n, d) in nodes.iter().zip(&r.shape.needs) {
            self.w.take(t, *n, d);
        }
        Some(nodes)
    }

    pub(super) fn placed_now(&mut self, r: &'r Request<'r>, nodes: &[NodeIx], q: &mut Queue) {
        let held: Vec<(NodeIx, Need)> = nodes.iter().copied().zip(r.shape.needs.iter().copied()).collect();
        self.charge_placed(r, &held, q);
        self.placed.push((self.now.saturating_add(r.duration), held));
        let names = nodes.iter().map(|n| self.c.table.names[*n as usize].clone()).collect();
        self.out.push(Decision::Place { job: r.id, nodes: names, warnings: Vec::new() });
        self.memo.clear();
    }

    /// What a job placed or claimed this round takes of the reservations' slack, its
    /// project's fair share and its quota.
    pub(super) fn charge_placed(&mut self, r: &'r Request<'r>, held: &[(NodeIx, Need)], q: &mut Queue) {
        let end = self.now.saturating_add(r.duration);
        use_slack(&mut self.resvs, end, held);
        charge(q, r, held, self.c);
        self.charge_quota(r);
    }

    /// L15: capacity missing for reasons outside the queue (nodes down or drained) is a
    /// stockout; capacity held by other Trainyard jobs never is.
    pub(super) fn stockout(&mut self, r: &'r Request<'r>) -> bool {
        if self.fits_empty(r.shape) {
            return false;
        }
        self.charge_quota(r);
        self.out.push(Decision::Stockout { job: r.id, detail: self.stockout_detail() });
        self.memo.clear();
        true
    }

    pub(super) fn stockout_detail(&self) -> String {
        let t = &self.c.table;
        let usable = t.usable.iter().filter(|u| **u).count();
        format!("{} of {} nodes usable ({} down, {} drained)", usable, t.len(), t.down, t.drained)
    }
}
