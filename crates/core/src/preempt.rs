//! Preemption by priority where the engine places work itself (Slurm): the scheduler
//! does not see the nodes, only that the engine holds a job for resources that other
//! work holds. The victims are then the cheapest running jobs of lower priority classes
//! whose resources together cover the held job's request (least accelerator time lost
//! since their last checkpoint, then the youngest), each whole (a gang is one job); the
//! engine then starts the held job in the room they leave, ahead of their new attempts
//! (they queue again after it).

use std::collections::BTreeMap;

use crate::job::{secs, Job, Phase};
use crate::schedule::SchedulerConfig;
use crate::Micros;

/// What a job's replicas ask for, summed.
#[derive(Clone, Debug, Default, PartialEq)]
struct Ask {
    cpus: u64,
    memory: u64,
    accelerators: BTreeMap<String, u64>,
}

fn ask(job: &Job) -> Ask {
    let mut a = Ask::default();
    for d in &job.demand.replicas {
        a.cpus += u64::from(d.cpus);
        a.memory += d.memory_bytes;
        if let Some((t, n)) = &d.accelerator {
            *a.accelerators.entry(t.clone()).or_default() += u64::from(*n);
        }
    }
    a
}

fn covers(have: &Ask, want: &Ask) -> bool {
    have.cpus >= want.cpus
        && have.memory >= want.memory
        && want.accelerators.iter().all(|(t, n)| have.accelerators.get(t).copied().unwrap_or(0) >= *n)
}

fn add(to: &mut Ask, a: &Ask) {
    to.cpus += a.cpus;
    to.memory += a.memory;
    for (t, n) in &a.accelerators {
        *to.accelerators.entry(t.clone()).or_default() += n;
    }
}

/// The running jobs to preempt for `held` (a job the engine holds for resources), or None
/// when lower-priority jobs that may be preempted now cannot cover its request.
pub fn engine_victims(held: &Job, running: &[&Job], cfg: &SchedulerConfig, now: Micros) -> Option<Vec<u64>> {
    if !cfg.priority_preemption {
        return None;
    }
    let want = ask(held);
    let mut cands: Vec<(u128, Micros, u64, Ask)> = running
        .iter()
        .filter(|j| j.id != held.id && matches!(j.phase, Phase::Running { .. }) && j.policy.priority < held.policy.priority)
        .filter_map(|j| {
            let start = j.admitted_at()?;
            let min_run = secs(cfg.min_runtime_secs).max(j.policy.min_runtime);
            if j.retries.preemptions >= cfg.max_preemptions_per_job || now.saturating_sub(start) < min_run {
                return None;
            }
            let a = ask(j);
            let units: u128 = if a.accelerators.is_empty() { a.cpus as u128 } else { a.accelerators.values().sum::<u64>() as u128 * 1000 };
            let since = j.checkpoint.last_write.unwrap_or(start).max(start);
            Some((units.max(1) * (now - since).max(0) as u128, start, j.id, a))
        })
        .collect();
    cands.sort_by_key(|(cost, start, id, _)| (*cost, std::cmp::Reverse(*start), std::cmp::Reverse(*id)));
    let mut have = Ask::default();
    let mut chosen: Vec<usize> = Vec::new();
    for (k, c) in cands.iter().enumerate() {
        if covers(&have, &want) {
            break;
        }
        add(&mut have, &c.3);
        chosen.push(k);
    }
    if !covers(&have, &want) {
        return None;
    }
    // Drop what is not needed, most expensive first.
    for x in (0..chosen.len()).rev() {
        let mut without = Ask::default();
        for (y, &k) in chosen.iter().enumerate() {
            if y != x {
                add(&mut without, &cands[k].3);
            }
        }
        if covers(&without, &want) {
            chosen.remove(x);
        }
    }
    Some(chosen.into_iter().map(|k| cands[k].2).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Demand, Policy, ReplicaDemand, HOUR};
    use crate::{Settings, State};

    fn running(id: u64, priority: i64, replicas: usize, checkpoint: Option<Micros>) -> Job {
        let demand = Demand {
            metrics: BTreeMap::new(),
            replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 16 << 30, accelerator: None }; replicas],
        };
        let mut p = Policy::defaults(&Settings::default());
        p.priority = priority;
        let pools = if replicas == 1 { vec![1] } else { vec![1, replicas as u32 - 1] };
        let mut j = Job::new(id, "p".into(), "r".into(), &pools, demand, p, false, 0);
        j.phase = Phase::Running { admitted_at: 0 };
        j.checkpoint.last_write = checkpoint;
        j
    }

    /// The cheapest lower-priority jobs that cover the request, whole; none of its own
    /// class or above, none before its minimum run time; nothing when they cannot cover it.
    #[test]
    fn the_cheapest_lower_priority_jobs_that_cover_the_request() {
        let cfg = SchedulerConfig { priority_preemption: true, min_runtime_secs: 600, ..SchedulerConfig::default() };
        let mut urgent = running(1, 100, 3, None);
        urgent.phase = Phase::Queued;
        let gang = running(2, 0, 3, None);
        let saved = running(3, 0, 3, Some(3 * HOUR));
        let equal = running(4, 100, 3, None);
        let jobs = [&gang, &saved, &equal];
        assert_eq!(engine_victims(&urgent, &jobs, &cfg, 4 * HOUR), Some(vec![3]), "least work lost since a checkpoint");
        assert_eq!(engine_victims(&urgent, &[&equal], &cfg, 4 * HOUR), None, "never its own class");
        assert_eq!(engine_victims(&urgent, &jobs, &cfg, 60 * 1_000_000), None, "not before min_runtime_secs");
        let small = running(5, 0, 1, None);
        assert_eq!(engine_victims(&urgent, &[&small], &cfg, 4 * HOUR), None, "cannot cover it");
        let off = SchedulerConfig { priority_preemption: false, ..cfg };
        assert_eq!(engine_victims(&urgent, &jobs, &off, 4 * HOUR), None);
        assert_eq!(urgent.state(), State::Queued);
    }
}
