//! The scheduler's starvation guarantee, checked on a whole run (see the scheduler's
//! module docs): in every round in which the first reservation is held by a job past the
//! starvation bound (the oldest starving job that does not fit), its time is no later than
//! in the round before, if that job held the first reservation then too; and every such
//! job starts no later than the earliest time it was promised, plus one round interval
//! (rounds are at least that far apart).

use std::collections::HashMap;

use trainyard_core::job::{Micros, SECOND};
use trainyard_core::schedule::Decision;

use crate::{simulate_observed, Policy, SimJob};

/// What a check looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Rounds in which a starving job held the first reservation.
    pub rounds: usize,
    /// Starving jobs whose start was checked against their reservation.
    pub jobs: usize,
}

/// Runs `policy` (with the starvation bound `bound_secs` and explanations on, which the
/// check needs) over the workload and checks the guarantee; the error names the job and
/// the times that break it.
pub fn check_reservations(jobs: &[SimJob], nodes: usize, policy: &Policy, interval: Micros, bound_secs: u64) -> Result<Checked, String> {
    let mut policy = policy.clone();
    policy.cfg.starvation_secs = Some(bound_secs);
    policy.cfg.explain = true;
    let bound = bound_secs as Micros * SECOND;
    let submit: HashMap<u64, Micros> = jobs.iter().map(|j| (j.id, j.submit)).collect();
    let mut promised: HashMap<u64, Micros> = HashMap::new();
    let mut previous: Option<(u64, Micros)> = None;
    let mut broken: Option<String> = None;
    let mut checked = Checked::default();
    let report = simulate_observed(jobs, nodes, &policy, interval, &mut |now, decisions| {
        let first = decisions.iter().find_map(|d| match d {
            Decision::Wait { job, reserved_at: Some(t), .. } => Some((*job, *t)),
            _ => None,
        });
        let Some((job, at)) = first.filter(|(job, _)| submit.get(job).is_some_and(|s| now - s >= bound)) else {
            previous = None;
            return;
        };
        if let Some((was, before)) = previous {
            if was == job && at > before && broken.is_none() {
                broken = Some(format!("job {job}: reserved for {} s in one round, for {} s in the next (at {} s)", before / SECOND, at / SECOND, now / SECOND));
            }
        }
        previous = Some((job, at));
        let p = promised.entry(job).or_insert(at);
        *p = (*p).min(at);
        checked.rounds += 1;
    });
    if let Some(b) = broken {
        return Err(b);
    }
    for (i, j) in jobs.iter().enumerate() {
        let Some(at) = promised.get(&j.id) else { continue };
        let Some(wait) = report.job_wait_s[i] else {
            return Err(format!("job {} was promised a start at {} s and never started", j.id, at / SECOND));
        };
        let start = j.submit + (wait * SECOND as f64).round() as Micros;
        if start > at + interval {
            return Err(format!("job {} started at {} s, promised by {} s", j.id, start / SECOND, at / SECOND));
        }
        checked.jobs += 1;
    }
    Ok(checked)
}
