//! Usage accounting: what each project's jobs reserved while they held capacity (CPU,
//! accelerator and memory time, from the moment their replicas are placed until they are
//! down), what their cgroups say they used, how they ended, and what preemptions cost
//! them (accelerator time since their last checkpoint). Kept per project, accelerator
//! type (empty: replicas without one) and hour; the driver feeds every job change in
//! and stores the hours ([`Ledger::rows`]) every [`FLUSH_EVERY`] and when asked for a report.

use std::collections::{BTreeMap, HashMap};

use trainyard_core::job::{After, Phase, SECOND};
use trainyard_core::{Job, Micros, State};
pub use trainyard_store::usage::{Amounts, UsageRow};

/// How often accrued usage is stored (and cgroups sampled for what was used).
pub const FLUSH_EVERY: Micros = 15 * SECOND;

/// The meta key of the time up to which usage is stored.
pub const FLUSHED_AT: &str = "usage_flushed_at";

const HOUR: Micros = 3600 * SECOND;
const GIB: f64 = (1u64 << 30) as f64;

/// What a running job's cgroups say: the memory its replicas use now, and each replica's
/// CPU seconds so far (by a key naming the run).
#[derive(Clone, Debug)]
pub struct UsedSample {
    pub job: u64,
    pub memory_bytes: u64,
    pub cpu_seconds: Vec<(String, f64)>,
}

/// What one replica holds.
#[derive(Clone, Debug, PartialEq)]
struct Part {
    accelerator: String,
    cpus: f64,
    accelerators: f64,
    memory_gb: f64,
}

/// A job that holds capacity: its parts, counted up to `since`.
#[derive(Clone, Debug)]
struct Holding {
    project: String,
    attempt: u32,
    parts: Vec<Part>,
    since: Micros,
    /// When this attempt began holding (work lost by a preemption counts from here, or
    /// from its last checkpoint).
    attempt_start: Micros,
}

/// The accrued usage not yet stored, and the jobs holding capacity.
#[derive(Debug, Default)]
pub struct Ledger {
    holding: HashMap<u64, Holding>,
    pending: BTreeMap<(String, String, i64), Amounts>,
    /// CPU seconds of each running replica's cgroup at the last sample.
    cpu_seen: HashMap<String, f64>,
    sampled_at: Option<Micros>,
}

/// The start of the hour of `t`, in seconds.
fn hour_of(t: Micros) -> i64 {
    t.div_euclid(HOUR) * (HOUR / SECOND)
}

/// The accelerator type a job's counts are kept under: its first pool's with one.
fn main_accelerator(job: &Job) -> String {
    job.demand.replicas.iter().find_map(|d| d.accelerator.as_ref().map(|(a, _)| a.clone())).unwrap_or_default()
}

fn parts_of(job: &Job, all: bool) -> Vec<Part> {
    job.replicas
        .iter()
        .zip(&job.demand.replicas)
        .filter(|(r, _)| all || r.state.is_live())
        .map(|(_, d)| Part {
            accelerator: d.accelerator.as_ref().map(|(a, _)| a.clone()).unwrap_or_default(),
            cpus: d.cpus as f64,
            accelerators: d.accelerator.as_ref().map_or(0.0, |(_, c)| *c as f64),
            memory_gb: d.memory_bytes as f64 / GIB,
        })
        .collect()
}

impl Ledger {
    fn entry(&mut self, project: &str, accelerator: &str, at: Micros) -> &mut Amounts {
        self.pending.entry((project.to_string(), accelerator.to_string(), hour_of(at))).or_default()
    }

    /// Add what `parts` hold over `[from, to)`, split at hour boundaries.
    fn accrue_parts(&mut self, project: &str, parts: &[Part], from: Micros, to: Micros) {
        let mut a = from;
        while a < to {
            let end = to.min((a.div_euclid(HOUR) + 1) * HOUR);
            let secs = (end - a) as f64 / SECOND as f64;
            for p in parts {
                let e = self.entry(project, &p.accelerator, a);
                e.cpu_seconds += p.cpus * secs;
                e.accelerator_seconds += p.accelerators * secs;
                e.memory_gb_seconds += p.memory_gb * secs;
            }
            a = end;
        }
    }

    fn accrue(&mut self, id: u64, now: Micros) {
        let Some(h) = self.holding.get(&id) else { return };
        if now <= h.since {
            return;
        }
        let (project, parts, since) = (h.project.clone(), h.parts.clone(), h.since);
        self.accrue_parts(&project, &parts, since, now);
        if let Some(h) = self.holding.get_mut(&id) {
            h.since = now;
        }
    }

    /// A job changed from `old` (None: new to the driver, or loaded at a start) to `new`
    /// at `now`: what it held until now is counted, then what it holds from now.
    /// `resumed_at`: for a job loaded at a start, the time up to which usage was stored
    /// (what it held since then is counted from there).
    pub fn job_changed(&mut self, old: Option<&Job>, new: &Job, now: Micros, resumed_at: Option<Micros>) {
        self.accrue(new.id, now);
        let acc = main_accelerator(new);
        if new.is_terminal() && !old.is_some_and(Job::is_terminal) && old.is_some() {
            self.ended(new, &acc, now);
        }
        let preempted = |j: &Job| matches!(j.phase, Phase::Stopping { then: After::Preempted { .. }, .. });
        if let Some(o) = old {
            if preempted(new) && !preempted(o) {
                let from = self.holding.get(&new.id).map_or(now, |h| h.attempt_start);
                let since = new.checkpoint.last_write.map_or(from, |c| c.max(from));
                let held: f64 = parts_of(new, false).iter().map(|p| p.accelerators).sum();
                let e = self.entry(&new.project, &acc, now);
                e.preemptions += 1;
                e.lost_accelerator_seconds += held * (now - since).max(0) as f64 / SECOND as f64;
            }
        }
        if new.holds_capacity() {
            let parts = parts_of(new, false);
            let start = match (self.holding.get(&new.id), resumed_at) {
                (Some(h), _) if h.attempt == new.attempt => h.attempt_start,
                (_, Some(t)) => t.max(new.admitted_at().unwrap_or(t)),
                _ => now,
            };
            let since = match resumed_at {
                Some(t) if old.is_none() => t.max(new.admitted_at().unwrap_or(t)).min(now),
                _ => now,
            };
            self.holding.insert(
                new.id,
                Holding { project: new.project.clone(), attempt: new.attempt, parts, since, attempt_start: start },
            );
            if old.is_none() && since < now {
                self.accrue(new.id, now);
            }
        } else {
            self.holding.remove(&new.id);
        }
    }

    /// A job that ended while the server was down (after `resumed_at`, the time up to
    /// which usage was stored): its end is counted, and what its replicas held from then
    /// until its end.
    pub fn ended_while_down(&mut self, job: &Job, resumed_at: Micros) {
        let Some(end) = job.end_time() else { return };
        if end <= resumed_at {
            return;
        }
        let from = resumed_at.max(job.admitted_at().unwrap_or(resumed_at));
        if job.start_time.is_some() {
            let parts = parts_of(job, true);
            self.accrue_parts(&job.project, &parts, from, end);
        }
        let acc = main_accelerator(job);
        self.ended(job, &acc, end);
    }

    /// A job's end, in the hour of `at`: its end state, and its goodput's account (TY10).
    fn ended(&mut self, job: &Job, acc: &str, at: Micros) {
        let g = trainyard_core::goodput::Goodput::until(job, job.end_time().unwrap_or(at).max(job.update_time));
        let secs = |us: Micros| us as f64 / SECOND as f64;
        let e = self.entry(&job.project, acc, at);
        match job.state() {
            State::Succeeded => e.succeeded += 1,
            State::Failed => e.failed += 1,
            _ => e.cancelled += 1,
        }
        e.productive_seconds += secs(g.wall.productive);
        e.accounted_seconds += secs(g.wall.total());
        e.productive_accelerator_seconds += secs(g.accelerator.productive);
        e.accounted_accelerator_seconds += secs(g.accelerator.total());
    }

    /// What the running replicas' cgroups say, per running job. Memory is counted as in
    /// use since the last sample; CPU by what it grew.
    pub fn sample_used(&mut self, samples: &[UsedSample], now: Micros) {
        let elapsed = self.sampled_at.map_or(0.0, |t| (now - t).max(0) as f64 / SECOND as f64);
        self.sampled_at = Some(now);
        let mut seen = HashMap::new();
        for UsedSample { job: id, memory_bytes: memory, cpu_seconds: cpus } in samples {
            let Some(h) = self.holding.get(id) else { continue };
            let (project, acc) = (h.project.clone(), h.parts.first().map(|p| p.accelerator.clone()).unwrap_or_default());
            let mut cpu = 0.0;
            for (key, c) in cpus {
                cpu += (c - self.cpu_seen.get(key).copied().unwrap_or(*c)).max(0.0);
                seen.insert(key.clone(), *c);
            }
            let e = self.entry(&project, &acc, now);
            e.used_memory_gb_seconds += *memory as f64 / GIB * elapsed;
            e.used_cpu_seconds += cpu;
        }
        self.cpu_seen = seen;
    }

    /// Jobs holding capacity now.
    pub fn holding(&self) -> impl Iterator<Item = u64> + '_ {
        self.holding.keys().copied()
    }

    /// Everything accrued up to `now`, as ledger rows (kept until [`Ledger::stored`]).
    pub fn rows(&mut self, now: Micros) -> Vec<UsageRow> {
        let ids: Vec<u64> = self.holding.keys().copied().collect();
        for id in ids {
            self.accrue(id, now);
        }
        self.pending
            .iter()
            .map(|((project, accelerator, hour), amounts)| UsageRow {
                project: project.clone(),
                accelerator: accelerator.clone(),
                hour: *hour,
                amounts: amounts.clone(),
            })
            .collect()
    }

    /// The rows returned by [`Ledger::rows`] are stored.
    pub fn stored(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::job::{Demand, Policy, ReplicaDemand};
    use trainyard_core::{step, Effect, Event, Outcome, Settings};

    fn gpu_job() -> Job {
        let demand = Demand {
            metrics: BTreeMap::new(),
            replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 16 << 30, accelerator: Some(("NVIDIA_TESLA_T4".into(), 2)) }; 2],
        };
        Job::new(1, "p".into(), "r".into(), &[1, 1], demand, Policy::defaults(&Settings::default()), false, 0)
    }

    fn apply(l: &mut Ledger, j: Job, e: Event, now: Micros) -> Job {
        let t = step(&j, e, now, &Settings::default()).unwrap();
        l.job_changed(Some(&j), &t.job, now, None);
        let mut job = t.job;
        for eff in t.effects {
            let ev = match eff {
                Effect::Launch { run, .. } => Event::Started { run },
                _ => continue,
            };
            let before = job.clone();
            job = step(&job, ev, now, &Settings::default()).unwrap().job;
            l.job_changed(Some(&before), &job, now, None);
        }
        job
    }

    /// GPU-hours are the GPUs held times the time held, split at hour boundaries; the
    /// end is counted once; a preemption counts the GPU time since the last checkpoint.
    #[test]
    fn reserved_time_is_split_by_hour_and_preemptions_cost_work_since_the_checkpoint() {
        let mut l = Ledger::default();
        let j = gpu_job();
        l.job_changed(None, &j, 0, None);
        let placed = Event::Place { nodes: vec!["n1".into(), "n1".into()], addresses: vec![], notes: vec![] };
        let start = HOUR / 2;
        let j = apply(&mut l, j, placed, start);
        let mut j2 = j.clone();
        j2.checkpoint.last_write = Some(HOUR);
        l.job_changed(Some(&j), &j2, HOUR, None);
        let at = HOUR + HOUR / 4;
        let j3 = apply(&mut l, j2, Event::PreemptForPriority { reason: "x".into(), requeue: false }, at);
        let rows = l.rows(at);
        let total: f64 = rows.iter().map(|r| r.amounts.accelerator_seconds).sum();
        assert!((total - 4.0 * (at - start) as f64 / 1e6).abs() < 1e-6, "{rows:?}");
        assert_eq!(rows.len(), 2, "two hours: {rows:?}");
        assert!((rows[0].amounts.accelerator_seconds - 4.0 * 1800.0).abs() < 1e-6);
        let last = &rows[1].amounts;
        assert_eq!(last.preemptions, 1);
        assert!((last.lost_accelerator_seconds - 4.0 * 900.0).abs() < 1e-6, "{last:?}");
        // Stopped: nothing more accrues; cancelled, its end is counted once.
        let mut j = j3;
        for r in j.replicas.clone() {
            if r.state.is_live() {
                let run = trainyard_core::RunId { job: 1, attempt: j.attempt, replica: r.name.clone(), restart: r.restart };
                j = apply(&mut l, j, Event::Exited { run, outcome: Outcome::Signaled { signal: 15 }, stderr_tail: vec![] }, at);
            }
        }
        let j = apply(&mut l, j, Event::Cancel, at + HOUR);
        assert!(j.is_terminal());
        let rows = l.rows(at + 2 * HOUR);
        let total: f64 = rows.iter().map(|r| r.amounts.accelerator_seconds).sum();
        assert!((total - 4.0 * (at - start) as f64 / 1e6).abs() < 1e-6, "{rows:?}");
        assert_eq!(rows.iter().map(|r| r.amounts.cancelled).sum::<u64>(), 1);
        // TY10: its goodput's account, once, in the hour of its end: all of its life, split
        // as the job's own account says (its running time lost to the preemption: the
        // checkpoint above was not seen by the lifecycle).
        let sum = |f: fn(&Amounts) -> f64| rows.iter().map(|r| f(&r.amounts)).sum::<f64>();
        let g = trainyard_core::goodput::Goodput::until(&j, at + HOUR);
        assert!((sum(|a| a.accounted_seconds) - (at + HOUR) as f64 / 1e6).abs() < 1e-6, "{rows:?}");
        assert!((sum(|a| a.accounted_seconds) - g.wall.total() as f64 / 1e6).abs() < 1e-6, "{g:?}");
        assert!((sum(|a| a.productive_seconds) - g.wall.productive as f64 / 1e6).abs() < 1e-6, "{g:?}");
        assert!((sum(|a| a.accounted_accelerator_seconds) - g.accelerator.total() as f64 / 1e6).abs() < 1e-6, "{g:?}");
        assert!(g.wall.lost > 0 && g.accelerator.total() == 4 * g.wall.total() - 4 * g.wall.queued, "{g:?}");
        l.stored();
        assert!(l.rows(at + 3 * HOUR).is_empty());
    }
}
