//! Stage 1, admission (L3, L5): a job is considered for a place only when its project's
//! quota covers every replica at once, with quota borrowed from and reclaimed for a
//! cohort.

use crate::job::{secs, After, Job, Micros, Phase};
use crate::quota::{quota_text, quota_usage, Check, Holder, QuotaUse, Quotas};
use super::config::SchedulerConfig;
use super::decision::{Decision, Position, Request, KIND_QUOTA};
use super::explain::quota_reason;
use super::preempt::reclaim_decision;
use super::round::{Memo, Round};

/// A job may run on quota borrowed from its cohort if it can give it back: with reclaim
/// on, a job preempted `max_preemptions_per_job` times (never chosen again) borrows only
/// if its own quota can never hold it (else it would wait for ever).
pub(super) fn may_borrow(j: &Job, cfg: &SchedulerConfig, quotas: &Quotas) -> bool {
    !cfg.priority_preemption
        || j.retries.preemptions < cfg.max_preemptions_per_job
        || j.demand.metrics.iter().any(|(m, v)| quotas.limit(&j.project, m).is_some_and(|q| *v > q))
}

/// L3, L5: a job preempted `max_preemptions_per_job` times that holds lent quota may
/// still give it back once it has written a checkpoint in its current run (stopping it
/// then loses only what came after) or has run `reclaim_after_secs`.
fn reclaim_bound_passed(j: &Job, cfg: &SchedulerConfig, now: Micros) -> bool {
    let start = j.admitted_at().unwrap_or(now);
    j.checkpoint.last_write.is_some_and(|w| w > start) || now.saturating_sub(start) >= secs(cfg.reclaim_after_secs)
}

/// The quota held now and, in projects of cohorts, by which jobs (what a reclaim may take
/// back, the cheapest first: least accelerator-time lost since the last checkpoint).
pub fn quota_held(jobs: &[&Job], quotas: &Quotas, cfg: &SchedulerConfig, now: Micros) -> QuotaUse {
    let used = quota_usage(jobs.iter().copied());
    if quotas.cohorts.is_empty() {
        return QuotaUse { used, holders: Vec::new() };
    }
    let holders = jobs
        .iter()
        .filter(|j| j.holds_quota() && quotas.cohort_of(&j.project).is_some())
        .map(|j| {
            let stopping = matches!(j.phase, Phase::Stopping { .. });
            let start = j.admitted_at().unwrap_or(now);
            let since = j.checkpoint.last_write.unwrap_or(start);
            let units: u128 = j
                .demand
                .replicas
                .iter()
                .map(|d| d.accelerator.as_ref().map_or(d.cpus as u128, |(_, c)| *c as u128 * 1000))
                .sum();
            let running = matches!(j.phase, Phase::Running { .. });
            Holder {
                id: j.id,
                project: j.project.clone(),
                metrics: j.demand.metrics.clone(),
                releasing: matches!(&j.phase, Phase::Stopping { then: After::Preempted { requeue: true, .. }, .. }),
                reclaimable: !stopping && (j.retries.preemptions < cfg.max_preemptions_per_job || reclaim_bound_passed(j, cfg, now)),
                cost: if running { units.max(1) * (now - since).max(0) as u128 } else { 0 },
                start,
            }
        })
        .collect();
    QuotaUse { used, holders }
}

impl<'a, 'r> Round<'a, 'r> {
    /// L3: QUEUED while the quota cannot cover all replicas at once (or never can), or
    /// while quota its project lent to its cohort comes back (the borrowing jobs are
    /// preempted for it, `Decision::Preempt` with `reclaim`).
    pub(super) fn waits_for_quota(&mut self, r: &'r Request<'r>, position: Option<Position>) -> bool {
        if r.admitted || r.metrics.is_empty() {
            return false;
        }
        let check = self.book.check(r.project, r.metrics, r.may_borrow);
        if check == Check::Fits {
            return false;
        }
        if let Check::Short(..) = check {
            if let Some(d) = self.impossible(r) {
                self.out.push(d);
                return true;
            }
        }
        if let Check::Reclaim { victims, .. } = &check {
            // Its quota is claimed for the rest of the round.
            self.book.charge(r.project, r.metrics);
            self.out.extend(victims.iter().map(|v| reclaim_decision(*v)));
            self.memo.clear();
        }
        if self.cfg.explain {
            let reason = match &check {
                Check::Short(short, None) => {
                    self.memo(Memo::Quota(short.iter().map(|(m, a, b, c)| (m.to_string(), *a, *b, *c)).collect()), |_| {
                        format!("Waiting for quota: {}", quota_text(short))
                    })
                }
                _ => quota_reason(&check).map(|(_, r)| r).unwrap_or_default().into(),
            };
            let kind = quota_reason(&check).map_or(KIND_QUOTA, |(k, _)| k);
            self.out.push(Decision::Wait { job: r.id, kind, reason, position, reserved_at: None });
        }
        true
    }

    /// The job's quota, counted for the rest of the round (an admitted job's is already
    /// in the base).
    pub(super) fn charge_quota(&mut self, r: &'r Request<'r>) {
        if !r.admitted {
            self.book.charge(r.project, r.metrics);
        }
    }
}
