//! The single-workstation default: quota first (L3), then everything on the first usable
//! node; CPU and memory are shared, a missing accelerator is a warning.

use std::collections::BTreeMap;
use crate::fleet::{Fleet, Node};
use crate::job::{Job, Micros, Phase};
use crate::quota::{Book, Check, QuotaUse, Quotas};
use super::admission::may_borrow;
use super::config::SchedulerConfig;
use super::decision::{Decision, KIND_CAPACITY};
use super::explain::quota_reason;
use super::preempt::reclaim_decision;

/// The single-workstation default: quota first (L3), then everything on the first usable
/// node; CPU and memory are shared, a missing accelerator is a warning, not a refusal.
pub(super) fn schedule_overcommit(jobs: &[&Job], fleet: &Fleet, quotas: &Quotas, held: &QuotaUse, now: Micros, cfg: &SchedulerConfig) -> Vec<Decision> {
    let mut book = Book::new(quotas, held, cfg.priority_preemption);
    let usable: Vec<&Node> = fleet.nodes.iter().filter(|n| n.up && n.schedulable).collect();
    let mut waiting: Vec<&Job> = jobs.iter().copied().filter(|j| j.wants_placement(now)).collect();
    waiting.sort_by_key(|j| (matches!(j.phase, Phase::Queued), j.create_time, j.id));
    // GPUs a node has are exact capacity even here (CPU and memory are shared): what
    // live replicas hold, by (node, accelerator type).
    let mut gpus_used: BTreeMap<(String, String), u64> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.holds_capacity()) {
        for (r, d) in j.replicas.iter().zip(&j.demand.replicas) {
            if let (true, Some(node), Some((a, c))) = (r.state.is_live(), &r.node, &d.accelerator) {
                *gpus_used.entry((node.clone(), a.clone())).or_insert(0) += *c as u64;
            }
        }
    }
    for j in waiting.iter().filter(|j| matches!(j.phase, Phase::Queued)) {
        book.want(&j.project, &j.demand.metrics);
    }
    let mut out = Vec::new();
    for job in waiting {
        let queued = matches!(job.phase, Phase::Queued);
        if queued {
            let check = book.check(&job.project, &job.demand.metrics, may_borrow(job, cfg, quotas));
            if let Check::Reclaim { victims, .. } = &check {
                out.extend(victims.iter().map(|v| reclaim_decision(*v)));
                book.charge(&job.project, &job.demand.metrics);
            }
            if let Some((kind, reason)) = quota_reason(&check) {
                out.push(Decision::Wait { job: job.id, kind, reason: reason.into(), position: None, reserved_at: None });
                continue;
            }
        }
        let Some(n) = usable.first() else {
            if queued {
                book.charge(&job.project, &job.demand.metrics);
            }
            out.push(Decision::Stockout { job: job.id, detail: stockout_detail_of(fleet) });
            continue;
        };
        // What the job asks of the node's GPUs, by type; short: it waits.
        let asks = job.demand.accelerators_by_type();
        let short: Vec<String> = asks
            .iter()
            .filter_map(|(a, need)| {
                let have = n.accelerators.get(*a).copied().unwrap_or(0) as u64;
                let used = gpus_used.get(&(n.name.clone(), a.to_string())).copied().unwrap_or(0);
                (have > 0 && have.saturating_sub(used) < *need).then(|| {
                    let s = if *need == 1 { "" } else { "s" };
                    format!("needs {need} {a} GPU{s} on node {}, {} of {have} free", n.name, have.saturating_sub(used))
                })
            })
            .collect();
        if !short.is_empty() {
            out.push(Decision::Wait {
                job: job.id,
                kind: KIND_CAPACITY,
                reason: format!("Waiting for GPUs: {}", short.join("; ")).into(),
                position: None,
                reserved_at: None,
            });
            continue;
        }
        for (a, need) in &asks {
            if n.accelerators.get(*a).copied().unwrap_or(0) > 0 {
                *gpus_used.entry((n.name.clone(), a.to_string())).or_insert(0) += need;
            }
        }
        let mut warnings = Vec::new();
        for (r, d) in job.replicas.iter().zip(&job.demand.replicas) {
            if let Some((a, c)) = &d.accelerator {
                let have = n.accelerators.get(a).copied().unwrap_or(0);
                if have < *c {
                    warnings.push(format!(
                        "Warning: replica {} asks for {c} x {a} but node {} has {have}; it runs without them.",
                        r.name, n.name
                    ));
                }
            }
        }
        if queued {
            book.charge(&job.project, &job.demand.metrics);
        }
        out.push(Decision::Place { job: job.id, nodes: vec![n.name.clone(); job.replicas.len()], warnings });
    }
    out
}

fn stockout_detail_of(fleet: &Fleet) -> String {
    let up = fleet.nodes.iter().filter(|n| n.up).count();
    let drained = fleet.nodes.iter().filter(|n| n.up && !n.schedulable).count();
    let usable = fleet.nodes.iter().filter(|n| n.up && n.schedulable).count();
    format!("{} of {} nodes usable ({} down, {} drained)", usable, fleet.nodes.len(), fleet.nodes.len() - up, drained)
}
