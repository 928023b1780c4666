//! Stage 6, explanations: a waiting job's reason in plain words, with its kind and its
//! position, and why a job can never be placed.

use std::sync::Arc;
use crate::capacity::{amount_text, NeverFit, NodeIx, NodeTable, Shape, NO_ACC};
use crate::job::{secs, Job, Micros, ReplicaDemand, SECOND};
use crate::quota::{quota_text, Check};
use super::config::SchedulerConfig;
use super::decision::{Decision, Position, Request, KIND_BEHIND_RESERVATION, KIND_CAPACITY, KIND_LENT, KIND_QUOTA, KIND_RECLAIM};
use super::round::{Memo, Miss, Round};

/// Why `job` can never be placed, naming its pool (`workerPoolSpecs[i]`) and the largest
/// node.
pub fn impossible_reason(t: &NodeTable, job: &Job, shape: &Shape, nf: NeverFit) -> String {
    let acc_name = |i: usize| job.demand.replicas.get(i).and_then(|d| d.accelerator.as_ref().map(|a| a.0.clone()));
    let detail = nf.detail(t, shape, &acc_name);
    let head = "The job can never be placed on this fleet, not even with every node up and free";
    match nf {
        NeverFit::Replica(i) => {
            let pool = job.replicas.get(i).map_or(0, |r| r.pool);
            format!("{head}: workerPoolSpecs[{pool}]: a replica {detail}.")
        }
        NeverFit::Gang => {
            let mut pools: Vec<(usize, usize, &ReplicaDemand)> = Vec::new();
            for (r, d) in job.replicas.iter().zip(&job.demand.replicas) {
                match pools.last_mut() {
                    Some((p, k, e)) if *p == r.pool && *e == d => *k += 1,
                    _ => pools.push((r.pool, 1, d)),
                }
            }
            let each = |d: &ReplicaDemand| {
                let acc = d.accelerator.as_ref().map(|(a, c)| (a.as_str(), *c as i64));
                amount_text(d.cpus as i64, d.memory_bytes.min(i64::MAX as u64) as i64, acc)
            };
            let same = pools.windows(2).all(|w| w[0].2 == w[1].2);
            let list: Vec<String> = pools
                .iter()
                .map(|(p, k, d)| match same {
                    true => format!("workerPoolSpecs[{p}]: {k}"),
                    false => format!("workerPoolSpecs[{p}]: {k} x {}", each(d)),
                })
                .collect();
            let what = match (same, pools.first()) {
                (true, Some((_, _, d))) => format!("{} replicas of {}", job.replicas.len(), each(d)),
                _ => format!("{} replicas", job.replicas.len()),
            };
            format!("{head}: its {what} ({}) {detail}.", list.join("; "))
        }
    }
}

/// A waiting reason for what the quota said (`Check`), and its kind.
pub(super) fn quota_reason(check: &Check) -> Option<(&'static str, String)> {
    Some(match check {
        Check::Fits => return None,
        Check::Short(short, note) => {
            let mut reason = format!("Waiting for quota: {}", quota_text(short));
            if let Some(n) = note {
                reason.push_str("; ");
                reason.push_str(n);
            }
            (KIND_QUOTA, reason)
        }
        Check::Reclaim { victims, stopping, cohort } => (
            KIND_RECLAIM,
            format!(
                "Waiting for quota its project lends to cohort {cohort}: {} borrowing it {} being preempted to give it back",
                counted(victims.len() + stopping, "job", "jobs"),
                if victims.len() + stopping == 1 { "is" } else { "are" },
            ),
        ),
        Check::Lent { cohort } => (
            KIND_LENT,
            format!(
                "Waiting for quota its project lends to cohort {cohort}: it comes back as the jobs borrowing it end \
                 (reclaim by preemption needs [scheduler] priority_preemption; a job preempted max_preemptions_per_job \
                 times gives it back at its next checkpoint or after reclaim_after_secs)"
            ),
        ),
    })
}

/// `1 node`, `2 nodes`.
pub(super) fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a waiting reason adds for a job past the starvation bound.
pub(super) fn starving_note(cfg: &SchedulerConfig) -> String {
    let bound = cfg.starvation_secs.map(|s| fmt_dur(secs(s))).unwrap_or_default();
    format!("; it has waited past the starvation bound ({bound}), so it goes ahead of the fair-share order")
}

/// RFC 3339 (UTC, seconds) of a time in µs since the epoch (the epoch itself for an
/// instant `time` cannot hold).
pub fn rfc3339(us: Micros) -> String {
    crate::clock_text::rfc3339(us, crate::clock_text::Digits::Seconds)
}

fn fmt_dur(us: Micros) -> String {
    let s = (us.max(0) + SECOND - 1) / SECOND;
    let (d, h, m) = (s / 86400, (s % 86400) / 3600, (s % 3600) / 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {}s", s % 60)
    } else {
        format!("{s}s")
    }
}

pub(super) fn describe(t: &NodeTable, shape: &Shape) -> String {
    let k = shape.needs.len();
    let plural = if k == 1 { "" } else { "s" };
    if shape.uniform && k > 0 {
        let d = &shape.needs[0];
        // 1.5 GiB as it is, never rounded to 2.
        let gib = crate::capacity::gib_text(d.mem);
        if d.acc_type == NO_ACC {
            format!("{k} replica{plural} of {} CPUs and {gib} GiB", d.cpus)
        } else {
            format!("{k} replica{plural} of {} x {} ({} CPUs, {gib} GiB)", d.acc, t.acc_name(d.acc_type), d.cpus)
        }
    } else {
        format!("{k} replicas of mixed sizes")
    }
}

pub(super) fn node_list(t: &NodeTable, nodes: &[(NodeIx, i64)]) -> String {
    let mut s: Vec<&str> = nodes.iter().take(4).map(|(n, _)| t.names[*n as usize].as_str()).collect();
    let more = nodes.len().saturating_sub(4);
    let mut out = s.join(", ");
    if more > 0 {
        s.clear();
        out.push_str(&format!(" and {more} more"));
    }
    out
}

impl<'a, 'r> Round<'a, 'r> {
    /// A wait behind jobs that hold the capacity or a reservation. The reason tells no
    /// time: it would rest on other jobs' time limits (another project's among them).
    pub(super) fn waits_behind(&mut self, r: &Request, position: Option<Position>, miss: &Miss) {
        if !self.cfg.explain {
            return;
        }
        // Depends only on the shape, on whether the job would run past the reservation,
        // and on the round's state (the memo is cleared when that moves).
        let past_bound = self.starving(r);
        let (long, end, uniform) = (miss.long, miss.end, miss.uniform);
        let reason = self.memo(Memo::Capacity(r.shape.needs.clone(), long, past_bound), |rd| {
            let t = &rd.c.table;
            let fit_now = uniform.map_or(0, |(d, k)| rd.w.slot_bound(t, &d).min(k as i64));
            let mut reason = format!("Waiting for capacity held by other jobs: needs {}", describe(t, r.shape));
            if uniform.is_some() {
                reason.push_str(&format!(", at most {fit_now} fit now"));
            }
            // The reservation it could delay first (else the first one made).
            let ahead = rd.resvs.iter().any(|v| !long || end > v.time);
            if ahead {
                let m = rd.w.mark();
                let fits_unconstrained = long && rd.w.place_gang(t, r.shape, None).is_some();
                rd.w.rollback(t, m);
                if fits_unconstrained {
                    reason.push_str("; it would fit now, but it could run past the time its nodes are reserved for a job ahead of it");
                } else {
                    reason.push_str("; a job ahead of it holds a reservation");
                }
            }
            if past_bound {
                reason.push_str(&starving_note(rd.cfg));
            }
            reason
        });
        let reason = self.with_priority_note(reason);
        let kind = if self.resvs.is_empty() { KIND_CAPACITY } else { KIND_BEHIND_RESERVATION };
        self.out.push(Decision::Wait { job: r.id, kind, reason, position, reserved_at: None });
    }

    /// A reason of a job that waits behind work of a higher priority class says so (of
    /// no project in particular).
    pub(super) fn with_priority_note(&self, reason: Arc<str>) -> Arc<str> {
        if !self.behind_higher {
            return reason;
        }
        format!("{reason}; jobs of a higher priority class wait ahead of it").into()
    }
}
